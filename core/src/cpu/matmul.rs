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

/// A float accumulator with a blocked matrix product.
trait Gemm:
    Copy + Default + Send + Sync + std::ops::Add<Output = Self> + std::ops::Mul<Output = Self>
{
    /// `c = a·b` for row-major `a` (`m × k`), `b` (`k × n`) and `c` (`m × n`), all dense.
    fn gemm(a: &[Self], b: &[Self], c: &mut [Self], dims: (usize, usize, usize));
}

impl Gemm for f32 {
    fn gemm(a: &[f32], b: &[f32], c: &mut [f32], (m, k, n): (usize, usize, usize)) {
        assert!(a.len() >= m * k && b.len() >= k * n && c.len() >= m * n);
        // SAFETY: the slices hold the row-major matrices the strides describe (checked above).
        unsafe {
            matrixmultiply::sgemm(
                m,
                k,
                n,
                1.0,
                a.as_ptr(),
                k as isize,
                1,
                b.as_ptr(),
                n as isize,
                1,
                0.0,
                c.as_mut_ptr(),
                n as isize,
                1,
            )
        }
    }
}

impl Gemm for f64 {
    fn gemm(a: &[f64], b: &[f64], c: &mut [f64], (m, k, n): (usize, usize, usize)) {
        assert!(a.len() >= m * k && b.len() >= k * n && c.len() >= m * n);
        // SAFETY: the slices hold the row-major matrices the strides describe (checked above).
        unsafe {
            matrixmultiply::dgemm(
                m,
                k,
                n,
                1.0,
                a.as_ptr(),
                k as isize,
                1,
                b.as_ptr(),
                n as isize,
                1,
                0.0,
                c.as_mut_ptr(),
                n as isize,
                1,
            )
        }
    }
}

/// `α·a·b + β·c` for float accumulators, blocks of rows split across threads.
fn float_gemm<T: Gemm>(
    (x, y): (&[T], &[T]),
    (m, k, n): (usize, usize, usize),
    (alpha, beta): (T, T),
    old: Option<Vec<T>>,
) -> Vec<T> {
    let per = m
        .div_ceil(if m * n * k > 1 << 18 { threads() } else { 1 })
        .max(1);
    let mut ab = vec![T::default(); m * n];
    std::thread::scope(|s| {
        for (block, out) in ab.chunks_mut(per * n.max(1)).enumerate() {
            let rows = out.len().checked_div(n).unwrap_or(0);
            let a = &x[block * per * k..];
            s.spawn(move || T::gemm(a, y, out, (rows, k, n)));
        }
    });
    match old {
        Some(o) => ab
            .iter()
            .zip(&o)
            .map(|(&v, &c)| alpha * v + beta * c)
            .collect(),
        None => ab.iter().map(|&v| alpha * v).collect(),
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
        let (ma, mb) = (load(&va, &la, a.dtype, acc), load(&vb, &lb, b.dtype, acc));
        // β = 0: C is not read (NaN in it does not propagate).
        let old = beta.to_bool().then(|| load(&vc, &lc, c.dtype, acc));
        let dims = (m, k, n);
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
