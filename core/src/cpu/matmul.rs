//! The CPU `Matmul` kernel: each batch's operands are gathered into row-major f64 (or wrapping
//! i64) matrices, multiplied in i-k-j order, and rows are split across threads.

use super::strided::{threads, View};
use super::values::{with_dtype, Prim, Values};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ir::KernelArgs;
use crate::layout::Layout;

/// A batch's matrix as a row-major layout of the 3-D operand.
fn batch_layout(l: &Layout, b: usize) -> Result<Layout> {
    let (sh, st) = (l.shape(), l.strides());
    let offset = (l.offset() as isize + b as isize * st[0]) as usize;
    Layout::new(sh[1..].to_vec(), st[1..].to_vec(), offset)
}

fn load(view: &View, layout: &Layout, dtype: DType, as_float: bool) -> Values {
    let v = view.with_layout(layout);
    let mut scratch = Vec::new();
    // SAFETY: the batch layout lies inside the operand, which View::new bounds-checked.
    let block =
        with_dtype!(dtype, T => T::wrap(unsafe { v.load::<T>(0, layout.numel(), &mut scratch) }));
    block.cast(if as_float { DType::F64 } else { DType::I64 }, false)
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
    let crate::ir::MatmulOperands {
        a,
        b,
        c,
        alpha,
        beta,
        dims: (batch, m, k, n),
    } = crate::ir::MatmulOperands::of(args)?;
    let float = acc.is_float();
    let (va, vb, vc) = (View::new(a)?, View::new(b)?, View::new(c)?);
    for bi in 0..batch {
        let (la, lb, lc) = (
            batch_layout(&a.layout, bi)?,
            batch_layout(&b.layout, bi)?,
            batch_layout(&c.layout, bi)?,
        );
        let (ma, mb) = (
            load(&va, &la, a.dtype, float),
            load(&vb, &lb, b.dtype, float),
        );
        let beta_zero = !beta.to_bool();
        let old = (!beta_zero).then(|| load(&vc, &lc, c.dtype, float));
        let split = |total: usize| {
            let per = total
                .div_ceil(if m * n * k > 1 << 18 { threads() } else { 1 })
                .max(1);
            (0..total)
                .step_by(per)
                .map(move |s| s..(s + per).min(total))
                .collect::<Vec<_>>()
        };
        let result = match (ma, mb) {
            (Values::F64(x), Values::F64(y)) => {
                let parts: Vec<Vec<f64>> = std::thread::scope(|s| {
                    let hs: Vec<_> = split(m)
                        .into_iter()
                        .map(|r| {
                            let (x, y) = (&x, &y);
                            s.spawn(move || product(x, y, (k, n), r, |p, q| p * q, |p, q| p + q))
                        })
                        .collect();
                    hs.into_iter()
                        .map(|h| h.join().unwrap_or_default())
                        .collect()
                });
                let ab: Vec<f64> = parts.concat();
                let (al, be) = (alpha.to_f64(), beta.to_f64());
                let old = match old {
                    Some(Values::F64(o)) => o,
                    _ => vec![0.0; m * n],
                };
                Values::F64(
                    ab.iter()
                        .zip(&old)
                        .map(|(&v, &o)| if beta_zero { al * v } else { al * v + be * o })
                        .collect(),
                )
            }
            (Values::I64(x), Values::I64(y)) => {
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
                    Some(Values::I64(o)) => o,
                    _ => vec![0; m * n],
                };
                Values::I64(
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
        super::values::with_values!(&result, v: T => unsafe { out.store::<T>(0, v, &mut scratch) });
    }
    Ok(())
}
