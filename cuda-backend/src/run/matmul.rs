//! A matmul's launch: one cuBLAS call where cuBLAS can express it (float dtypes, strides that
//! are a column-major matrix or its transpose, k > 0, sizes within 32 bits), else our own
//! tiled kernel. The choice is made here once, so what runs, what the profiler names and what
//! it compiles ahead are the same.

use super::step::{Sig, Step};
use crate::blas::{BlasMatrix, GemmCall};
use crate::launch::{Args, Launch};
use crate::render::matmul::{acc_repr, MatmulSig};
use strata_core::backend::{KernelArgs, Operand};
use strata_core::lower::operands::MatmulOperands as Operands;
use strata_core::{DType, Result};

/// The steps of `Matmul { acc, tf32 }` over `args`: none for an empty output, a cuBLAS call
/// where `blas` (the library is loaded) and the operands allow, else our kernel.
pub(crate) fn steps(
    acc: DType,
    tf32: bool,
    args: &KernelArgs,
    blas: bool,
) -> Result<Vec<Step<'static>>> {
    let ops = Operands::of(args)?;
    let (batch, m, _, n) = ops.dims;
    if batch == 0 || m == 0 || n == 0 {
        return Ok(Vec::new());
    }
    if blas {
        if let Some(call) = gemm_call(&ops, tf32)? {
            return Ok(vec![Step::Gemm(call)]);
        }
    }
    Ok(kernel(acc, &ops)?
        .map(|(sig, launch)| Step::Kernel {
            sig: Sig::Matmul(sig),
            launch,
        })
        .into_iter()
        .collect())
}

/// The cuBLAS call for `ops`, or `None` when cuBLAS cannot run it (dtype, layout, k = 0,
/// sizes past 32 bits): our kernel runs then.
fn gemm_call(ops: &Operands, tf32: bool) -> Result<Option<GemmCall>> {
    let (batch, m, k, n) = ops.dims;
    let dtype = ops.a.dtype;
    let float = matches!(dtype, DType::F32 | DType::F64 | DType::F16 | DType::BF16);
    if !float || ops.b.dtype != dtype || ops.c.dtype != dtype || k == 0 {
        return Ok(None);
    }
    let fits = |v: usize| i32::try_from(v).is_ok();
    if ![batch, m, n, k].into_iter().all(fits) {
        return Ok(None);
    }
    let strides = |o: &Operand| {
        let s = o.layout.strides();
        (s[0], s[1], s[2])
    };
    let (a0, a1, a2) = strides(ops.a);
    let (b0, b1, b2) = strides(ops.b);
    let (c0, c1, c2) = strides(ops.c);
    // Row-major C [m, n] is column-major Cᵀ [n, m]: compute Cᵀ = Bᵀ·Aᵀ. A column-major C
    // (a transposed view) is computed directly as C = A·B.
    let c_rows = |cs: isize| if batch > 1 { cs } else { 0 };
    let plan: Option<(usize, usize, BlasMatrix, BlasMatrix, i64, i64, bool)> =
        if (c2 == 1 || n <= 1) && (m <= 1 || c1 as usize >= n.max(1)) && c1 >= 0 {
            let ldc = if m <= 1 { n.max(1) as i64 } else { c1 as i64 };
            let x = as_blas(k, n, (b1, b2), true, b0);
            let y = as_blas(m, k, (a1, a2), true, a0);
            x.zip(y)
                .map(|(x, y)| (n, m, x, y, ldc, c_rows(c0) as i64, true))
        } else if (c1 == 1 || m <= 1) && (n <= 1 || c2 as usize >= m.max(1)) && c2 >= 0 {
            let ldc = if n <= 1 { m.max(1) as i64 } else { c2 as i64 };
            let x = as_blas(m, k, (a1, a2), false, a0);
            let y = as_blas(k, n, (b1, b2), false, b0);
            x.zip(y)
                .map(|(x, y)| (m, n, x, y, ldc, c_rows(c0) as i64, false))
        } else {
            None
        };
    let Some((rows, cols, x, y, ldc, stride_c, swapped)) = plan else {
        return Ok(None);
    };
    if c0 < 0 || !fits(ldc as usize) {
        return Ok(None);
    }
    let (pa, pb, pc) = (
        crate::memory::element_address(ops.a)?,
        crate::memory::element_address(ops.b)?,
        crate::memory::element_address(ops.c)?,
    );
    let (px, py) = if swapped { (pb, pa) } else { (pa, pb) };
    Ok(Some(GemmCall {
        dtype,
        tf32,
        dims: ops.dims,
        rows,
        cols,
        x: (px, x),
        y: (py, y),
        c: (pc, ldc, stride_c),
        alpha: ops.alpha.to_f64(),
        beta: ops.beta.to_f64(),
    }))
}

/// How the matrix `X[rows, cols]` with strides (`sr`, `sc`) is passed to cuBLAS as the
/// column-major operand `X` (`want_transpose == false`) or `Xᵀ` (`true`); `None` when neither
/// storage order fits (negative or overlapping strides).
pub(crate) fn as_blas(
    rows: usize,
    cols: usize,
    (sr, sc): (isize, isize),
    want_transpose: bool,
    batch_stride: isize,
) -> Option<BlasMatrix> {
    if sr < 0 || sc < 0 || batch_stride < 0 {
        return None;
    }
    // Column-major storage of X: element (i, j) at i + j·ld.
    let col_major = (sr == 1 || rows <= 1) && (cols <= 1 || sc as usize >= rows.max(1));
    // Row-major storage of X is column-major storage of Xᵀ: (i, j) at j + i·ld.
    let row_major = (sc == 1 || cols <= 1) && (rows <= 1 || sr as usize >= cols.max(1));
    let fits = |v: usize| i32::try_from(v).is_ok();
    let (transpose, ld) = if col_major && !want_transpose {
        (false, if cols <= 1 { rows.max(1) } else { sc as usize })
    } else if row_major && want_transpose {
        (false, if rows <= 1 { cols.max(1) } else { sr as usize })
    } else if row_major {
        (true, if rows <= 1 { cols.max(1) } else { sr as usize })
    } else if col_major {
        (true, if cols <= 1 { rows.max(1) } else { sc as usize })
    } else {
        return None;
    };
    fits(ld).then_some(BlasMatrix {
        transpose,
        ld: ld as i64,
        batch_stride: batch_stride as i64,
    })
}

/// Plans our tiled kernel: 16×16 outputs per block, batches along the grid's z.
fn kernel(acc: DType, ops: &Operands) -> Result<Option<(MatmulSig, Launch)>> {
    let (batch, m, k, n) = ops.dims;
    if batch == 0 || m == 0 || n == 0 {
        return Ok(None);
    }
    let mut w = Args::new();
    for v in [batch, m, n, k] {
        w.push(v as u64);
    }
    for o in [ops.a, ops.b, ops.c] {
        w.push(crate::memory::element_address(o)?);
        for &s in o.layout.strides() {
            w.push(s as i64 as u64);
        }
    }
    let r = acc_repr(acc);
    for s in [ops.alpha, ops.beta] {
        w.push(s.cast(r, false).bits());
    }
    // β = 0 must not read C (NaN there does not propagate): a flag word.
    w.push(ops.beta.to_bool() as u64);
    let grid = (
        n.div_ceil(16).min(u32::MAX as usize) as u32,
        m.div_ceil(16).min(65_535) as u32,
        batch.min(65_535) as u32,
    );
    let sig = MatmulSig {
        dtype: ops.a.dtype,
        out: ops.c.dtype,
        acc,
    };
    Ok(Some((sig, Launch::fixed(w, grid, (16, 16, 1), 0))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_major_operands_pass_without_copies() {
        // A row-major [4, 8] asked for as Aᵀ: column-major storage of Aᵀ, no transpose.
        let m = as_blas(4, 8, (8, 1), true, 32).unwrap();
        assert_eq!((m.transpose, m.ld), (false, 8));
        // The same matrix asked for as A: a transpose of that storage.
        let m = as_blas(4, 8, (8, 1), false, 32).unwrap();
        assert_eq!((m.transpose, m.ld), (true, 8));
        // Column-major [4, 8] (a transposed view).
        let m = as_blas(4, 8, (1, 4), false, 0).unwrap();
        assert_eq!((m.transpose, m.ld), (false, 4));
        assert!(as_blas(4, 8, (-8, 1), false, 0).is_none());
        assert!(as_blas(4, 8, (2, 2), false, 0).is_none());
    }
}
