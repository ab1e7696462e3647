//! Launch plumbing shared by every kernel kind: the argument words, grid sizing and
//! `cuLaunchKernel`.

use crate::driver::{check, Gpu};
use crate::function::Function;
use crate::render::MAX_ARGUMENT_BYTES;
use cudarc::driver::sys;
use strata_core::{Error, Result};

/// The argument block of a launch: the kernel's single `Args<N>` parameter.
#[derive(Debug, Default)]
pub(crate) struct Args(pub Vec<u64>);

impl Args {
    pub(crate) fn new() -> Args {
        Args(Vec::with_capacity(24))
    }

    pub(crate) fn push(&mut self, w: u64) {
        self.0.push(w);
    }
}

/// How many threads a launch needs, and how they are grouped.
#[derive(Debug, Clone)]
pub(crate) enum Grid {
    /// `work` independent items, 256 threads per block, grid-stride loops past a cap; with
    /// `looping`, a cap of [`LOOPING_BLOCKS_PER_SM`] blocks per multiprocessor.
    Linear { work: usize, looping: bool },
    /// An explicit grid and block, and the bytes of dynamic shared memory each block takes.
    Fixed {
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        shared: u32,
    },
    /// An explicit grid whose every block reads the same `cached` bytes (a layer norm's γ and
    /// β, read at each row's positions): the shared-memory carveout leaves L1 that much, and
    /// blocks fit a multiprocessor only as the rest of its shared memory takes them (a layer
    /// norm over [65536, 4096] f32 with 32 KiB of γ and β took 1.00 ms with 28 KiB of L1 on
    /// an H200 and 0.68 with 92).
    Cached {
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        shared: u32,
        cached: u32,
    },
    /// A block of `block` threads for each of `items` rows, at most `per_sm` of them on a
    /// multiprocessor at once (fewer rows in flight: their data stays in L2), each taking at
    /// least `shared` bytes of dynamic shared memory: as many more as keep the others out (a
    /// grid of `per_sm` blocks a multiprocessor, looping over the rows, was not spread one a
    /// multiprocessor and measured 25% slower).
    Resident {
        items: u32,
        per_sm: u32,
        block: (u32, u32, u32),
        shared: u32,
    },
}

/// Everything a launch needs besides the kernel: its argument block and its grid.
#[derive(Debug)]
pub(crate) struct Launch {
    pub args: Args,
    pub grid: Grid,
    /// Words that hold an address in a scratch buffer of the kernel's steps (`run::Step::
    /// Scratch`, by its index): the buffer's address is added to the word when it runs.
    pub scratch: Vec<(usize, usize)>,
}

impl Launch {
    pub(crate) fn linear(args: Args, work: usize) -> Launch {
        Launch {
            args,
            grid: Grid::Linear {
                work,
                looping: false,
            },
            scratch: Vec::new(),
        }
    }

    /// A launch on an explicit grid.
    pub(crate) fn fixed(
        args: Args,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        shared: u32,
    ) -> Launch {
        Launch {
            args,
            grid: Grid::Fixed {
                grid,
                block,
                shared,
            },
            scratch: Vec::new(),
        }
    }

    /// A linear launch whose threads each loop over many items: for kernels bound by
    /// arithmetic whose threads do set-up before their first item (random draws through
    /// float functions, such as `randn`: Philox's key schedule).
    pub(crate) fn looping(args: Args, work: usize) -> Launch {
        Launch {
            args,
            grid: Grid::Linear {
                work,
                looping: true,
            },
            scratch: Vec::new(),
        }
    }
}

/// The grid and block dimensions of `grid` on `gpu`; `None` for an empty launch.
pub(crate) fn dims(gpu: &Gpu, grid: &Grid) -> Option<(Dim3, Dim3)> {
    match *grid {
        Grid::Linear { work, looping } => {
            if work == 0 {
                return None;
            }
            // One work item per thread up to 2^28 threads (grid-stride loops take the rest):
            // fewer, looping blocks measured 4% slower on a 1 GiB add. Maps that transform
            // random draws with float functions loop instead (`run::map`).
            let per_sm = gpu.sm_count as usize * LOOPING_BLOCKS_PER_SM;
            let cap = if looping {
                per_sm.max(1)
            } else {
                per_sm.max(1 << 20)
            };
            let blocks = work.div_ceil(256).clamp(1, cap) as u32;
            Some(((blocks, 1, 1), (256, 1, 1)))
        }
        Grid::Fixed { grid, block, .. } | Grid::Cached { grid, block, .. } => Some((grid, block)),
        Grid::Resident { items, block, .. } => (items > 0).then_some(((items, 1, 1), block)),
    }
}

/// The dynamic shared memory each block of `grid` takes on `gpu`.
fn dynamic_shared(gpu: &Gpu, grid: &Grid) -> u32 {
    match *grid {
        Grid::Fixed { shared, .. } | Grid::Cached { shared, .. } => shared,
        Grid::Resident { per_sm, shared, .. } => {
            let crowd = gpu.shared_per_sm / (per_sm as usize + 1) + 1;
            shared.max(crowd.min(gpu.shared_per_block) as u32)
        }
        Grid::Linear { .. } => 0,
    }
}

/// The bytes of a multiprocessor's L1 and shared memory together, whose split the carveout
/// sets: 28 KiB past the most shared memory on every architecture since Volta's (256 KiB on
/// Hopper, 228 of it shared at most; 192 on the A100; 128 on Ada and sm_86).
fn l1_and_shared(shared_per_sm: usize) -> usize {
    shared_per_sm + (28 << 10)
}

/// The shared-memory carveout (percent of the most, `shared_per_sm`) `grid` asks for, where it
/// asks: a [`Grid::Cached`] leaves its bytes to L1.
fn carveout(shared_per_sm: usize, grid: &Grid) -> Option<i32> {
    let Grid::Cached { cached, .. } = *grid else {
        return None;
    };
    let shared = l1_and_shared(shared_per_sm).saturating_sub(cached as usize);
    Some((shared * 100 / shared_per_sm.max(1)).min(100) as i32)
}

/// Blocks of 256 threads per multiprocessor in a looping launch ([`Launch::looping`]): 32
/// and 64 measured alike for `randn`, 8 and 4 slower.
pub(crate) const LOOPING_BLOCKS_PER_SM: usize = 64;

/// Grid or block dimensions.
pub(crate) type Dim3 = (u32, u32, u32);

/// Launches `f` with `plan` on `stream`.
pub(crate) fn launch(gpu: &Gpu, f: &Function, plan: &Launch, stream: sys::CUstream) -> Result<()> {
    let Some((grid, block)) = dims(gpu, &plan.grid) else {
        return Ok(());
    };
    if plan.args.0.len() != f.words {
        return Err(Error::Backend(format!(
            "internal error: a launch prepared {} argument words for a kernel taking {}",
            plan.args.0.len(),
            f.words
        )));
    }
    if plan.args.0.len() * 8 > MAX_ARGUMENT_BYTES {
        return Err(Error::Unsupported(format!(
            "a launch needs {} argument bytes, more than CUDA's {MAX_ARGUMENT_BYTES}: too many \
             operands or axes",
            plan.args.0.len() * 8
        )));
    }
    let shared = dynamic_shared(gpu, &plan.grid);
    if shared > 48 * 1024 {
        // Above 48 KiB a kernel must opt in to its dynamic shared memory.
        // SAFETY: a loaded function of this context; the attribute only raises a limit.
        check(
            unsafe {
                sys::cuFuncSetAttribute(
                    f.f(),
                    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    shared as i32,
                )
            },
            "cuFuncSetAttribute",
        )?;
    }
    if let Some(percent) = carveout(gpu.shared_per_sm, &plan.grid) {
        // SAFETY: a loaded function of this context; the attribute is a preference.
        check(
            unsafe {
                sys::cuFuncSetAttribute(
                    f.f(),
                    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT,
                    percent,
                )
            },
            "cuFuncSetAttribute",
        )?;
    }
    let mut params = [plan.args.0.as_ptr() as *mut std::ffi::c_void];
    // SAFETY: the kernel takes one `Args<N>` parameter of exactly these words (the plan and
    // the generator agree on N); pointers in it are live buffers of this context.
    check(
        unsafe {
            sys::cuLaunchKernel(
                f.f(),
                grid.0,
                grid.1,
                grid.2,
                block.0,
                block.1,
                block.2,
                shared,
                stream,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        },
        "cuLaunchKernel",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cached_grid_leaves_its_bytes_to_l1() {
        let cached = |bytes: u32| Grid::Cached {
            grid: (1, 1, 1),
            block: (64, 1, 1),
            shared: 32 << 10,
            cached: bytes,
        };
        // Hopper: 256 KiB, 228 of it shared at most; 96 KiB of L1 leaves 160 (70%).
        assert_eq!(carveout(228 << 10, &cached(96 << 10)), Some(70));
        assert_eq!(carveout(228 << 10, &cached(0)), Some(100));
        assert_eq!(carveout(100 << 10, &cached(1 << 20)), Some(0));
        let fixed = Grid::Fixed {
            grid: (1, 1, 1),
            block: (64, 1, 1),
            shared: 32 << 10,
        };
        assert_eq!(carveout(228 << 10, &fixed), None);
    }
}
