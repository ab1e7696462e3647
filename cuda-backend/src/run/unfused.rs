//! A fused reduction's launches while its own kernel is not compiled: the eager launches it
//! stands for. Its map runs (through the interpreter, `first_launch`) into a scratch tensor laid
//! out as the map's tree would be realized, then the plain reduction (a kernel the shipped
//! archive or the disk cache holds) reduces that; a row prologue or epilogue runs as core's
//! launches (`lower::prologue::split`), their reductions unfused in turn. The plain reduction
//! is taken only where it plans as the fused one does (the same extents, groups, vector width
//! and ranges: the same order of adds), and a staged kernel computes its launches' numbers
//! (core's definition of them), so these launches give the fused kernel's bits.
//!
//! A new fused reduction's first call thus waits for no NVRTC compile (a one-off reduction, a
//! notebook cell run once, never compiles); its second call leaves the kernel's compile to the
//! background thread, and the calls from the one after it is loaded run it. The unfused form
//! is not taken where its scratch would exceed [`MAX_SCRATCH`] bytes, where the interpreter
//! does not run the map (f64, random draws: it would compile), where the plain reduction would
//! plan otherwise (a flipped view's sum) or its kernel would compile; `STRATA_CUDA_INTERPRET=0`
//! turns it off with the interpreter.

use super::step::{Sig, Step};
use super::Runner;
use crate::function::Function;
use crate::render::reduce::ReduceSig;
use crate::render::{Generated, Rendered};
use cudarc::driver::sys::CUstream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use strata_core::backend::{DeviceBuffer, KernelArgs, Operand};
use strata_core::ir::Kernel;
use strata_core::layout::Layout;
use strata_core::sync::LockUnpoisoned;
use strata_core::{Result, StreamId};

/// The largest scratch tensor (bytes) a reduction is unfused with: above it the fused kernel
/// compiles at its first call rather than hold a copy of its map's values (2^26 f32).
pub(crate) const MAX_SCRATCH: usize = 256 << 20;

/// A fused reduction that ran unfused.
pub(crate) struct Pending {
    /// Its program, until its compile takes it.
    rendered: Mutex<Option<Rendered>>,
    /// Its compile has been left to the background thread (at the second call).
    queued: AtomicBool,
    /// The compile failed: the next call compiles it again, at once, and says why.
    failed: AtomicBool,
    /// Its kernel, once the background thread has loaded it.
    compiled: OnceLock<Function>,
}

impl Runner {
    /// The launches that stand for `kernel` over `args` (planned as `steps`) on `stream` where
    /// it is a fused reduction whose kernel would be compiled now and those launches run
    /// without waiting for NVRTC (see the module docs); `None`: it runs as its own steps.
    pub(crate) fn unfused(
        &self,
        kernel: &Kernel,
        args: &KernelArgs,
        steps: &[Step],
        stream: StreamId,
    ) -> Result<Option<Vec<(Kernel, KernelArgs)>>> {
        let fused = matches!(
            kernel,
            Kernel::Reduce {
                map: Some(_),
                stores_map: false,
                ..
            }
        );
        if !fused || !self.first_launches.enabled() {
            return Ok(None);
        }
        let Some(sig) = steps.iter().find_map(|s| match s {
            Step::Kernel {
                sig: Sig::Reduce(k),
                ..
            } if k.map.is_some() => Some(k),
            _ => None,
        }) else {
            return Ok(None);
        };
        if self.reductions.peek(sig).is_some() {
            return Ok(None);
        }
        let Some(slot) = self.unfused_reductions.peek(sig) else {
            // The first call: unfused unless the disk cache or the archive holds the kernel.
            let rendered = sig.render()?;
            if self
                .compiler
                .has_cached(&rendered.source, sig.optimization())
            {
                return Ok(None);
            }
            let Some(launches) = self.tentative_launches(kernel, args, stream)? else {
                return Ok(None);
            };
            self.unfused_reductions.get(sig, |_| {
                Ok(Arc::new(Pending {
                    rendered: Mutex::new(Some(rendered)),
                    queued: AtomicBool::new(false),
                    failed: AtomicBool::new(false),
                    compiled: OnceLock::new(),
                }))
            })?;
            return Ok(Some(launches));
        };
        if let Some(f) = slot.compiled.get() {
            self.reductions.get(sig, |_| Ok(f.clone()))?;
            return Ok(None);
        }
        if slot.failed.load(Ordering::Acquire) || !self.compile_later(sig, &slot) {
            return Ok(None);
        }
        self.tentative_launches(kernel, args, stream)
    }

    /// [`Runner::eager_launches`], with an `Err` in planning them (operands the eager
    /// launches' planners refuse) or out of memory for the scratch read as `None`: the fused
    /// kernel then runs, and reports its own errors.
    fn tentative_launches(
        &self,
        kernel: &Kernel,
        args: &KernelArgs,
        stream: StreamId,
    ) -> Result<Option<Vec<(Kernel, KernelArgs)>>> {
        Ok(self.eager_launches(kernel, args, stream).ok().flatten())
    }

    /// Runs `kernel` over `args`, one of [`Runner::unfused`]'s launches, on `stream` (`s`)
    /// where it is a map whose own kernel is not loaded: through the interpreter, queueing no
    /// compile of it (the fused kernel's is queued; the map alone may never run again). False
    /// where it is not such a map: the caller runs it as any kernel.
    pub(crate) fn interpret_alone(
        &self,
        kernel: &Kernel,
        args: &KernelArgs,
        stream: StreamId,
        s: CUstream,
    ) -> Result<bool> {
        if !matches!(kernel, Kernel::Map { .. }) {
            return Ok(false);
        }
        let steps = self.steps(kernel, args)?;
        let [Step::Map { sig, launch }] = steps.as_slice() else {
            return Ok(false);
        };
        if self.maps.peek(sig).is_some() {
            return Ok(false);
        }
        let Some((f, launch)) = self
            .first_launches
            .interpret_alone(sig, launch, &self.compiler)
        else {
            return Ok(false);
        };
        self.batches.send(&self.gpu, stream)?;
        crate::launch::launch(&self.gpu, &f, &launch, s)?;
        Ok(true)
    }

    /// The fused kernel's function when its unfused calls have compiled it (the profiler's
    /// `compile_ahead` then waits for no second compile).
    pub(crate) fn unfused_function(&self, sig: &ReduceSig) -> Option<Function> {
        self.unfused_reductions.peek(sig)?.compiled.get().cloned()
    }

    /// Leaves `sig`'s compile to the background thread unless that is done already; false
    /// when the thread cannot take it (the caller compiles it now).
    fn compile_later(&self, sig: &ReduceSig, slot: &Arc<Pending>) -> bool {
        if slot.queued.swap(true, Ordering::AcqRel) {
            return true;
        }
        let Some(rendered) = slot.rendered.lock_unpoisoned().take() else {
            return false;
        };
        let optimization = sig.optimization();
        let source = rendered.source.clone();
        let done = slot.clone();
        let then = Box::new(move |f: Result<_>| {
            match f.and_then(|f| Function::loaded(f, rendered, ReduceSig::NAME, optimization)) {
                Ok(f) => {
                    let _ = done.compiled.set(f);
                }
                Err(_) => done.failed.store(true, Ordering::Release),
            }
        });
        self.compiler
            .compile_later(source, ReduceSig::NAME.into(), optimization, then)
    }

    /// `kernel`'s eager launches (a fused reduction's: its map into scratch, then the plain
    /// reduction; a row prologue's or epilogue's: core's launches, each unfused), or `None`
    /// when one of them would wait for NVRTC or the scratch would be too large.
    fn eager_launches(
        &self,
        kernel: &Kernel,
        args: &KernelArgs,
        stream: StreamId,
    ) -> Result<Option<Vec<(Kernel, KernelArgs)>>> {
        let &Kernel::Reduce {
            op,
            reduced_axes,
            acc,
            map: Some(ref map),
            prologue,
            ref epilogue,
            stores_map: false,
        } = kernel
        else {
            let ready = self.runs_without_compile(kernel, args)?;
            return Ok(ready.then(|| vec![(kernel.clone(), args.clone())]));
        };
        if prologue.is_some() || epilogue.is_some() {
            let mut all = Vec::new();
            for (k, a) in strata_core::lower::prologue::split(kernel, args)? {
                let Some(launches) = self.eager_launches(&k, &a, stream)? else {
                    return Ok(None);
                };
                all.extend(launches);
            }
            return Ok(Some(all));
        }
        let Some(input) = args.inputs.first() else {
            return Ok(None);
        };
        let layout = scratch_layout(&input.layout)?;
        let bytes = layout.numel().saturating_mul(map.dtype.itemsize());
        if bytes == 0 || bytes > MAX_SCRATCH {
            return Ok(None);
        }
        // Without room for the scratch the fused kernel runs (compiled now), as it needs none.
        let buffer: Arc<dyn DeviceBuffer> = Arc::new(self.memory.allocate(bytes, stream)?);
        let scratch = Operand {
            buffer,
            layout,
            dtype: map.dtype,
        };
        let mapped = (
            Kernel::map(map.clone()),
            KernelArgs {
                outputs: vec![scratch.clone()],
                inputs: args.inputs.clone(),
                scalars: args.scalars.clone(),
            },
        );
        let reduced = (
            Kernel::Reduce {
                op,
                reduced_axes,
                acc,
                map: None,
                prologue: None,
                epilogue: None,
                stores_map: false,
            },
            KernelArgs {
                outputs: args.outputs.clone(),
                inputs: vec![scratch],
                scalars: Vec::new(),
            },
        );
        if !self.same_order(reduced_axes, args, &reduced.1)? {
            return Ok(None);
        }
        for (k, a) in [&mapped, &reduced] {
            if !self.runs_without_compile(k, a)? {
                return Ok(None);
            }
        }
        Ok(Some(vec![mapped, reduced]))
    }

    /// True when the plain reduction over `plain` combines the elements in the order the fused
    /// one over `fused` does (`run::reduce::same_order`).
    fn same_order(
        &self,
        reduced_axes: usize,
        fused: &KernelArgs,
        plain: &KernelArgs,
    ) -> Result<bool> {
        let plan = |args| super::reduce::plan_of(reduced_axes, args, &self.target);
        Ok(super::reduce::same_order(&plan(fused)?, &plan(plain)?))
    }

    /// True when every launch of `kernel` over `args` runs a loaded kernel, one the disk cache
    /// or the archive holds, or the interpreter.
    fn runs_without_compile(&self, kernel: &Kernel, args: &KernelArgs) -> Result<bool> {
        for step in self.steps(kernel, args)? {
            let ready = match &step {
                Step::Scratch { .. } => true,
                Step::Map { sig, launch } => {
                    self.maps.peek(sig).is_some()
                        || self.first_launches.interprets(sig, launch)
                        || self
                            .compiler
                            .has_cached(&sig.render()?.source, sig.optimization())
                }
                Step::Kernel {
                    sig: Sig::Reduce(k),
                    ..
                } => {
                    self.reductions.peek(k).is_some()
                        || self
                            .compiler
                            .has_cached(&k.render()?.source, k.optimization())
                }
                _ => false,
            };
            if !ready {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

/// The scratch layout of a fused reduction's map values read as input 0 is laid out: its
/// shape and strides where those cover the elements once with positive strides (a realized
/// tree, permuted: the layout core fuses a float sum's map over), else row-major (an
/// order-free reduction over another view, whose result no layout changes).
fn scratch_layout(input: &Layout) -> Result<Layout> {
    let dense = |l: &Layout| {
        let (lo, hi) = l.span();
        !l.has_internal_overlap() && (hi - lo) as usize == l.numel()
    };
    if input.strides().iter().any(|&s| s < 0) {
        return Layout::contiguous(input.shape());
    }
    let at_zero = Layout::new(input.shape().to_vec(), input.strides().to_vec(), 0)?;
    if dense(&at_zero) {
        Ok(at_zero)
    } else {
        Layout::contiguous(input.shape())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scratch_keeps_a_realized_trees_permuted_layout_and_is_row_major_otherwise() {
        // A transposed realized tree: [3, 4] with strides [1, 3].
        let t = Layout::new(vec![3, 4], vec![1, 3], 8).unwrap();
        let s = scratch_layout(&t).unwrap();
        assert_eq!((s.strides(), s.offset()), (&[1isize, 3][..], 0));
        // A broadcast view, a slice with gaps and a flipped view: row-major.
        let f = Layout::new(vec![3, 4], vec![-4, 1], 8).unwrap();
        assert_eq!(scratch_layout(&f).unwrap().strides(), &[4, 1]);
        let b = Layout::new(vec![3, 4], vec![0, 1], 0).unwrap();
        assert_eq!(scratch_layout(&b).unwrap().strides(), &[4, 1]);
        let g = Layout::new(vec![3, 4], vec![8, 1], 0).unwrap();
        assert_eq!(scratch_layout(&g).unwrap().strides(), &[4, 1]);
        // A size-1 axis with any stride still covers its elements once.
        let one = Layout::new(vec![1, 4], vec![99, 1], 0).unwrap();
        assert_eq!(scratch_layout(&one).unwrap().strides(), &[99, 1]);
    }
}
