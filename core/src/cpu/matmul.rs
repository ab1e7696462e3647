//! The CPU `Matmul` kernel: each batch's operands are gathered into row-major matrices of the
//! IR's accumulator dtype (f32 for f16, bf16 and f32; f64; wrapping i64 for integers). Float
//! products run through `matrixmultiply`'s blocked, vectorized kernels (the ones ndarray's
//! `dot` uses; their order of additions is theirs, as a BLAS's is), rows split across threads;
//! integer products in i-k-j order.

use super::block::{with_dtype, Block, Prim};
use super::strided::{threads, View};
use crate::backend::KernelArgs;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::layout::Layout;

/// A batch's matrix as a row-major layout of the 3-D operand.
fn batch_layout(l: &Layout, b: usize) -> Result<Layout> {
    let (sh, st) = (l.shape(), l.strides());
    let offset = (l.offset() as isize + b as isize * st[0]) as usize;
    Layout::new(sh[1..].to_vec(), st[1..].to_vec(), offset)
}

fn load(view: &View, layout: &Layout, dtype: DType, acc: DType) -> Block {
    let v = view.with_layout(layout);
    let mut scratch = Vec::new();
    // SAFETY: the batch layout lies inside the operand, which View::new bounds-checked.
    let block =
        with_dtype!(dtype, T => T::wrap(unsafe { v.load::<T>(0, layout.numel(), &mut scratch) }));
    block.cast(acc, false)
}

/// One strided matrix: its first element and its row and column strides, in elements.
#[derive(Clone, Copy)]
struct Strided<T> {
    ptr: *const T,
    rs: isize,
    cs: isize,
}

// SAFETY: a matrix of a kernel's operand, only read, or for C written in disjoint row blocks;
// the buffers outlive the scoped threads that use it.
unsafe impl<T> Send for Strided<T> {}
unsafe impl<T> Sync for Strided<T> {}

impl<T> Strided<T> {
    /// The same matrix from row `r` on.
    fn rows_from(self, r: usize) -> Strided<T> {
        Strided {
            ptr: self.ptr.wrapping_offset(r as isize * self.rs),
            ..self
        }
    }
}

/// A float accumulator with a blocked matrix product.
trait Gemm: Copy + Default + Send + Sync {
    /// `c = α·a·b + β·c` (`c` not read when β is 0) for `a` `m × k`, `b` `k × n`, `c` `m × n`.
    ///
    /// # Safety
    /// Each matrix's strides stay inside its memory; `c` overlaps neither operand.
    unsafe fn gemm(
        dims: (usize, usize, usize),
        alpha: Self,
        a: Strided<Self>,
        b: Strided<Self>,
        beta: Self,
        c: Strided<Self>,
    );
}

/// [`Gemm`] for `$t` through matrixmultiply's `$gemm`.
macro_rules! gemm_through {
    ($t:ty, $gemm:path) => {
        impl Gemm for $t {
            unsafe fn gemm(
                (m, k, n): (usize, usize, usize),
                alpha: $t,
                a: Strided<$t>,
                b: Strided<$t>,
                beta: $t,
                c: Strided<$t>,
            ) {
                let c_ptr = c.ptr as *mut $t;
                $gemm(
                    m, k, n, alpha, a.ptr, a.rs, a.cs, b.ptr, b.rs, b.cs, beta, c_ptr, c.rs, c.cs,
                )
            }
        }
    };
}
gemm_through!(f32, matrixmultiply::sgemm);
gemm_through!(f64, matrixmultiply::dgemm);

/// `c = α·a·b + β·c`, blocks of rows split across threads.
///
/// # Safety
/// As [`Gemm::gemm`].
unsafe fn threaded_gemm<T: Gemm>(
    (m, k, n): (usize, usize, usize),
    alpha: T,
    a: Strided<T>,
    b: Strided<T>,
    beta: T,
    c: Strided<T>,
) {
    let per = m
        .div_ceil(if m * n * k > 1 << 18 { threads() } else { 1 })
        .max(1);
    if per >= m {
        // One block: no thread to start (a batch of small products, a convolution's, would
        // otherwise start one thread per product).
        // SAFETY: the caller's promise.
        return unsafe { T::gemm((m, k, n), alpha, a, b, beta, c) };
    }
    std::thread::scope(|s| {
        for r0 in (0..m).step_by(per) {
            let rows = per.min(m - r0);
            let (a, c) = (a.rows_from(r0), c.rows_from(r0));
            // SAFETY: the caller's promise, for a block of rows; blocks write disjoint rows.
            s.spawn(move || unsafe { T::gemm((rows, k, n), alpha, a, b, beta, c) });
        }
    });
}

/// `α·a·b + β·c` for dense row-major float matrices (a new `m × n` matrix).
fn float_gemm<T: Gemm>(
    (x, y): (&[T], &[T]),
    (m, k, n): (usize, usize, usize),
    (alpha, beta): (T, T),
    old: Option<Vec<T>>,
) -> Vec<T> {
    let dense = |p: *const T, cols: usize| Strided {
        ptr: p,
        rs: cols as isize,
        cs: 1,
    };
    assert!(x.len() >= m * k && y.len() >= k * n);
    // β = 0: C is not read (NaN in it does not propagate).
    let (mut out, beta) = match old {
        Some(o) if o.len() >= m * n => (o, beta),
        _ => (vec![T::default(); m * n], T::default()),
    };
    // SAFETY: the slices hold the dense matrices described (checked above).
    unsafe {
        threaded_gemm(
            (m, k, n),
            alpha,
            dense(x.as_ptr(), k),
            dense(y.as_ptr(), n),
            beta,
            dense(out.as_mut_ptr(), n),
        )
    };
    out
}

/// The batch's 2-D layout as a [`Strided`] matrix over `view`'s memory: matrixmultiply's
/// packing reads any strides (negative and zero too), so a transposed, flipped or broadcast
/// operand needs no gathered copy.
fn strided<T>(view: &View, layout: &Layout) -> Strided<T> {
    let st = layout.strides();
    let ptr = view
        .base_ptr()
        .wrapping_add(layout.offset() * std::mem::size_of::<T>());
    Strided {
        ptr: ptr as *const T,
        rs: st[0],
        cs: st[1],
    }
}

/// `out[i, j] = Σ_k a[i, k] · b[k, j]` for rows `rows`, row-major.
fn product<T: Copy + Default + std::ops::Add<Output = T>>(
    a: &[T],
    b: &[T],
    (k, n): (usize, usize),
    rows: std::ops::Range<usize>,
    mul: impl Fn(T, T) -> T,
    add: impl Fn(T, T) -> T,
) -> Vec<T> {
    let mut out = vec![T::default(); rows.len() * n];
    for (r, i) in rows.enumerate() {
        let row = &mut out[r * n..(r + 1) * n];
        for p in 0..k {
            let x = a[i * k + p];
            for (o, &y) in row.iter_mut().zip(&b[p * n..(p + 1) * n]) {
                *o = add(*o, mul(x, y));
            }
        }
    }
    out
}

/// The product on the operands' and C's own memory (see [`strided`]).
///
/// # Safety
/// The views lie inside their buffers; C overlaps neither operand nor itself (core copies an
/// operand that overlaps the output and rejects self-overlapping outputs).
unsafe fn direct_gemm<T: Gemm>(
    a: (&View, &Layout),
    b: (&View, &Layout),
    c: (&View, &Layout),
    dims: (usize, usize, usize),
    (alpha, beta): (T, T),
) {
    let (sa, sb, sc) = (strided(a.0, a.1), strided(b.0, b.1), strided(c.0, c.1));
    threaded_gemm(dims, alpha, sa, sb, beta, sc);
}

/// Executes a `Matmul` kernel.
pub(crate) fn run(acc: DType, args: &KernelArgs) -> Result<()> {
    let crate::lower::operands::MatmulOperands {
        a,
        b,
        c,
        alpha,
        beta,
        dims: (batch, m, k, n),
    } = crate::lower::operands::MatmulOperands::of(args)?;
    if !matches!(acc, DType::F32 | DType::F64 | DType::I64) {
        return Err(Error::Unsupported(format!(
            "matmul accumulating in {acc} (f32, f64 or i64)"
        )));
    }
    let (va, vb, vc) = (View::new(a)?, View::new(b)?, View::new(c)?);
    for bi in 0..batch {
        let (la, lb, lc) = (
            batch_layout(&a.layout, bi)?,
            batch_layout(&b.layout, bi)?,
            batch_layout(&c.layout, bi)?,
        );
        // Operands and C of the accumulator's float dtype: straight on their memory.
        let dims = (m, k, n);
        // (Core hands a matmul a copy of any operand that shares C's storage.)
        if a.dtype == acc && b.dtype == acc && c.dtype == acc {
            let (a, b, c) = ((&va, &la), (&vb, &lb), (&vc, &lc));
            // SAFETY: View::new bounds-checked the operands; see direct_gemm.
            match acc {
                DType::F32 => unsafe {
                    let (al, be) = (alpha.to_f64() as f32, beta.to_f64() as f32);
                    direct_gemm::<f32>(a, b, c, dims, (al, be));
                    continue;
                },
                DType::F64 => unsafe {
                    direct_gemm::<f64>(a, b, c, dims, (alpha.to_f64(), beta.to_f64()));
                    continue;
                },
                _ => {}
            }
        }
        let (ma, mb) = (load(&va, &la, a.dtype, acc), load(&vb, &lb, b.dtype, acc));
        // β = 0: C is not read (NaN in it does not propagate).
        let old = beta.to_bool().then(|| load(&vc, &lc, c.dtype, acc));
        let result = match (ma, mb, old) {
            (Block::F32(x), Block::F32(y), old) => {
                let old = old.map(|o| match o {
                    Block::F32(v) => v,
                    _ => unreachable!("loaded as f32"),
                });
                // α and β arrive in the accumulator dtype, so these conversions are exact.
                let (al, be) = (alpha.to_f64() as f32, beta.to_f64() as f32);
                Block::F32(float_gemm((&x, &y), dims, (al, be), old))
            }
            (Block::F64(x), Block::F64(y), old) => {
                let old = old.map(|o| match o {
                    Block::F64(v) => v,
                    _ => unreachable!("loaded as f64"),
                });
                Block::F64(float_gemm(
                    (&x, &y),
                    dims,
                    (alpha.to_f64(), beta.to_f64()),
                    old,
                ))
            }
            (Block::I64(x), Block::I64(y), old) => {
                let ab = product(
                    &x,
                    &y,
                    (k, n),
                    0..m,
                    |p: i64, q| p.wrapping_mul(q),
                    |p, q| p.wrapping_add(q),
                );
                let (al, be) = (alpha.to_i128() as i64, beta.to_i128() as i64);
                let old = match old {
                    Some(Block::I64(o)) => o,
                    _ => vec![0; m * n],
                };
                Block::I64(
                    ab.iter()
                        .zip(&old)
                        .map(|(&v, &o)| al.wrapping_mul(v).wrapping_add(be.wrapping_mul(o)))
                        .collect(),
                )
            }
            _ => {
                return Err(Error::Unsupported(format!(
                    "matmul of {} and {}",
                    a.dtype, b.dtype
                )))
            }
        };
        let result = result.cast(c.dtype, false);
        let out = vc.with_layout(&lc);
        let mut scratch = Vec::new();
        // SAFETY: the batch layout lies inside C (bounds-checked); one thread writes it.
        super::block::with_block!(&result, v: T => unsafe { out.store::<T>(0, v, &mut scratch) });
    }
    Ok(())
}
