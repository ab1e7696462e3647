//! `Matmul`: the layout analysis that maps strided operands onto cuBLAS (floats), and our own
//! tiled kernel for what cuBLAS does not cover (integers, layouts it cannot express, k = 0,
//! or no cuBLAS library).

use super::{cast, compute_type, from_storage, storage_type, to_storage};
use crate::launch::{Args, Grid, Launch, Program};
use std::fmt::Write;
use strata_core::lower::operands::MatmulOperands as Operands;
use strata_core::{DType, Result};

/// One operand as cuBLAS sees it (column-major): transpose or not, leading dimension,
/// batch stride.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BlasMatrix {
    pub transpose: bool,
    pub ld: i64,
    pub batch_stride: i64,
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

/// The structure of our own matmul kernel.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct MatmulSig {
    pub dtype: DType,
    pub out: DType,
    pub acc: DType,
}

impl strata_core::lower::cache::Owned for MatmulSig {}

/// The accumulator of our kernel: the IR's (f32 or f64; integers wrap in i64), as on the CPU.
fn acc_repr(acc: DType) -> DType {
    if acc.is_float() {
        acc
    } else {
        DType::I64
    }
}

/// Plans our tiled kernel: 16×16 outputs per block, batches along the grid's z.
pub(crate) fn plan(acc: DType, ops: &Operands) -> Result<Option<(MatmulSig, Launch)>> {
    let (batch, m, k, n) = ops.dims;
    if batch == 0 || m == 0 || n == 0 {
        return Ok(None);
    }
    let mut w = Args::new();
    for v in [batch, m, n, k] {
        w.push(v as u64);
    }
    for o in [ops.a, ops.b, ops.c] {
        w.push(crate::memory::element_ptr(o)?);
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
    Ok(Some((
        sig,
        Launch {
            args: w,
            grid: Grid::Fixed {
                grid,
                block: (16, 16, 1),
                shared: 0,
            },
        },
    )))
}

impl Program for MatmulSig {
    const NAME: &'static str = "strata_matmul";
    fn source(&self) -> Result<String> {
        source(self)
    }
}

/// The CUDA C source of `strata_matmul`.
pub(crate) fn source(sig: &MatmulSig) -> Result<String> {
    let r = acc_repr(sig.acc);
    let t = compute_type(r);
    let (st, ot) = (storage_type(sig.dtype), storage_type(sig.out));
    let load = |x: &str| cast(&from_storage(sig.dtype, x), sig.dtype, r, false);
    let load_c = |x: &str| cast(&from_storage(sig.out, x), sig.out, r, false);
    // Products and sums rounded one at a time (never contracted into an fma), as the CPU.
    let (mul, add) = match r {
        DType::I64 => ("w_mul<i64>", "w_add<i64>"),
        DType::F32 => ("__fmul_rn", "__fadd_rn"),
        _ => ("__dmul_rn", "__dadd_rn"),
    };
    let scalar = |w: usize| super::scalar_from_word(r, &format!("p.w[{w}]"));
    let mut s = String::new();
    let _ = writeln!(
        s,
        "extern \"C\" __global__ void strata_matmul(const Args<19> p) {{"
    );
    let _ = writeln!(
        s,
        "  const i64 batch = p.w[0], m = p.w[1], n = p.w[2], k = p.w[3];"
    );
    let _ = writeln!(s, "  const {st}* A = (const {st}*)p.w[4]; const i64 sa0 = p.w[5], sa1 = p.w[6], sa2 = p.w[7];");
    let _ = writeln!(s, "  const {st}* B = (const {st}*)p.w[8]; const i64 sb0 = p.w[9], sb1 = p.w[10], sb2 = p.w[11];");
    let _ = writeln!(
        s,
        "  {ot}* C = ({ot}*)p.w[12]; const i64 sc0 = p.w[13], sc1 = p.w[14], sc2 = p.w[15];"
    );
    let _ = writeln!(
        s,
        "  const {t} alpha = {}, beta = {};",
        scalar(16),
        scalar(17)
    );
    let _ = writeln!(s, "  const bool read_c = p.w[18] != 0;");
    let _ = writeln!(
        s,
        "  __shared__ {t} As[16][17];\n  __shared__ {t} Bs[16][17];"
    );
    let _ = writeln!(s, "  const int tx = threadIdx.x, ty = threadIdx.y;");
    let _ = writeln!(s, "  for (i64 b = blockIdx.z; b < batch; b += gridDim.z)");
    let _ = writeln!(
        s,
        "  for (i64 row0 = (i64)blockIdx.y * 16; row0 < m; row0 += (i64)gridDim.y * 16) {{"
    );
    let _ = writeln!(
        s,
        "    const i64 row = row0 + ty, col = (i64)blockIdx.x * 16 + tx;"
    );
    let _ = writeln!(s, "    {t} acc = 0;");
    let _ = writeln!(s, "    for (i64 t0 = 0; t0 < k; t0 += 16) {{");
    let _ = writeln!(
        s,
        "      As[ty][tx] = (row < m && t0 + tx < k) ? {} : ({t})0;",
        load("A[b * sa0 + row * sa1 + (t0 + tx) * sa2]")
    );
    let _ = writeln!(
        s,
        "      Bs[ty][tx] = (t0 + ty < k && col < n) ? {} : ({t})0;",
        load("B[b * sb0 + (t0 + ty) * sb1 + col * sb2]")
    );
    let _ = writeln!(s, "      __syncthreads();");
    let _ = writeln!(s, "#pragma unroll\n      for (int q = 0; q < 16; q++) acc = {add}(acc, {mul}(As[ty][q], Bs[q][tx]));");
    let _ = writeln!(s, "      __syncthreads();\n    }}");
    let _ = writeln!(s, "    if (row < m && col < n) {{");
    let _ = writeln!(s, "      {ot}* c = &C[b * sc0 + row * sc1 + col * sc2];");
    let _ = writeln!(s, "      {t} v = {mul}(alpha, acc);");
    let _ = writeln!(
        s,
        "      if (read_c) v = {add}(v, {mul}(beta, {}));",
        load_c("(*c)")
    );
    let _ = writeln!(
        s,
        "      *c = {};\n    }}\n  }}\n}}",
        to_storage(sig.out, &cast("v", r, sig.out, false))
    );
    Ok(s)
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
