//! Our own tiled `Matmul` kernel, for what cuBLAS does not cover (integers, layouts it cannot
//! express, k = 0, or no cuBLAS library): 16×16 outputs per block, batches along the grid's z.

use super::{cast, compute_type, from_storage, storage_type, to_storage};
use super::{Generated, Rendered};
use std::fmt::Write;
use strata_core::{DType, Result};

/// The structure of our own matmul kernel.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct MatmulSig {
    pub dtype: DType,
    pub out: DType,
    pub acc: DType,
}

impl strata_core::kernel_cache::Owned for MatmulSig {}

impl Generated for MatmulSig {
    const NAME: &'static str = "strata_matmul";
    fn render(&self) -> Result<Rendered> {
        source(self).map(Rendered::single)
    }
}

/// The accumulator of our kernel: the IR's (f32 or f64; integers wrap in i64), as on the CPU.
pub(crate) fn acc_repr(acc: DType) -> DType {
    if acc.is_float() {
        acc
    } else {
        DType::I64
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
