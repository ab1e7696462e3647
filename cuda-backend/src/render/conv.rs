//! strata's own `Convolution` kernels, for a device without cuDNN: core's implicit GEMM
//! ([`conv_plan`](strata_core::lower::conv_plan)) as a tiled product whose slices of A and B
//! are gathered from the tensors as they are staged (no im2col buffer), the WGSL kernel's
//! structure (`strata-wgpu`'s `render::conv`): a block of 256 threads computes a TM×TN tile
//! of one group's product (the plan's [`TILES`](strata_core::lower::conv_plan::TILES)), each
//! thread a 4×4 or 8×8 block (rows `tr·pt + i`, columns `tc·pt + j`, read from 16-deep slices
//! in shared memory as 16-byte vectors); a thread stages TM/16 values of A (that many rows,
//! one depth) and TN/16 of B (one column, as many depths), so it decodes a row's pixel or a
//! column's channel and tap once, and a depth once a slice — the next slice's gathers issued
//! before this one's multiply-adds. Indices are 32-bit where every one fits (the gathers'
//! divisions by a run-time size then a multiply and a shift, `conv_plan::division_magic`),
//! else 64-bit. Backward filter writes partial products over ranges of samples that
//! `strata_conv_sum` adds into the weight's gradient. Accumulates in f32 (exact f32 products,
//! no TF32) for 16-bit floats and f32, in f64 for f64. On an H200 this took the 3×3 shapes of
//! ResNet-50 from 0.90–1.35 ms forward to 0.71–1.29 (BENCHMARKS.md).

use super::{cast, compute_type, from_storage, storage_type, to_storage};
use super::{Generated, Rendered};
use std::fmt::Write;
use strata_core::ir::ConvPass;
use strata_core::{DType, Result};

/// The depth of the staged slices.
const DEPTH: usize = 16;

/// The structure of a convolution launch.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct ConvSig {
    pub pass: ConvPass,
    /// The operands' dtype.
    pub dtype: DType,
    /// The tile (rows, columns) of the plan.
    pub tile: [usize; 2],
    /// Stride 1 both ways: backward data reads `dy` without dividing by the stride.
    pub unit_stride: bool,
    /// Every index fits 32 bits with room to spare ([`fits_32_bits`]): `int` arithmetic, and
    /// the gathers' divisions by a multiply and a shift; else `i64` and divisions.
    pub narrow: bool,
}

impl strata_core::kernel_cache::Owned for ConvSig {}

impl Generated for ConvSig {
    const NAME: &'static str = "strata_conv";
    fn render(&self) -> Result<Rendered> {
        Ok(Rendered::single(source(self)))
    }
}

/// The kernel summing backward filter's partial products into the output.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct ConvSumSig {
    /// The output's dtype.
    pub dtype: DType,
}

impl strata_core::kernel_cache::Owned for ConvSumSig {}

impl Generated for ConvSumSig {
    const NAME: &'static str = "strata_conv_sum";
    fn render(&self) -> Result<Rendered> {
        Ok(Rendered::single(sum_source(self.dtype)))
    }
}

/// The accumulator of a convolution over `dtype`.
pub(crate) fn acc_of(dtype: DType) -> DType {
    if dtype == DType::F64 {
        DType::F64
    } else {
        DType::F32
    }
}

/// Words: [0] rows, [1] columns, [2] depth (one group's product), [3] samples, [4..12] C, H,
/// W, O, kH, kW, OH, OW, [12] groups, [13..19] stride, padding and dilation (height, width),
/// [19..22] the output (backward filter: its partials), A and B, [22] ranges (backward
/// filter; else 1), [23] samples a range, [24] the first range's partial, [25] 1: add to the
/// partials, [26..34] the multiplier and shift that divide by kH·kW, kW, OH·OW and OW
/// ([`division_magic`]; read with 32-bit indices).
pub(crate) const WORDS: usize = 34;

/// The CUDA C source of `strata_conv` for `sig`.
pub(crate) fn source(sig: &ConvSig) -> String {
    let (d, acc) = (sig.dtype, acc_of(sig.dtype));
    let (at, st) = (compute_type(acc), storage_type(d));
    let filter = sig.pass == ConvPass::BackwardFilter;
    let ot = if filter { compute_type(acc) } else { st };
    let load = |p: &str, i: &str| cast(&from_storage(d, &format!("{p}[{i}]")), d, acc, false);
    let [tm, tn] = sig.tile;
    let (qa, qb) = (tm / 16, tn / 16);
    // Each thread's block: rows `tr·pt + i`, columns `tc·pt + j`, read from shared memory as
    // 16-byte vectors.
    let pt = strata_core::lower::conv_plan::per_thread(sig.tile);
    let cs = tn / pt;
    let (vt, lanes) = if at == "double" {
        ("double2", 2)
    } else {
        ("float4", 4)
    };
    let ix = if sig.narrow { "int" } else { "i64" };
    // `n / by` for a divisor of words 26..34: a multiply and a shift with 32-bit indices.
    let quot = |n: &str, by: &str| {
        if sig.narrow {
            format!("fdiv({n}, m{by}, s{by})")
        } else {
            format!("(({n}) / {by})")
        }
    };
    let mut s = String::new();
    if sig.narrow {
        // (n < 2^31, the multiplier below 2^32: one wide multiply and a shift.)
        s.push_str(
            "__device__ __forceinline__ int fdiv(int n, unsigned m, unsigned s) {
  return (int)(((unsigned long long)(unsigned)n * m) >> s);
}\n",
        );
    }
    let _ = writeln!(
        s,
        "extern \"C\" __global__ void __launch_bounds__(256) strata_conv(const Args<{WORDS}> p) {{
  const {ix} m = p.w[0], ncols = p.w[1], kdim = p.w[2], samples = p.w[3];
  const {ix} C = p.w[4], H = p.w[5], W = p.w[6], O = p.w[7];
  const {ix} KH = p.w[8], KW = p.w[9], OH = p.w[10], OW = p.w[11], groups = p.w[12];
  const {ix} s0 = p.w[13], s1 = p.w[14], p0 = p.w[15], p1 = p.w[16], d0 = p.w[17], d1 = p.w[18];
  {ot}* out = ({ot}*)p.w[19];
  const {st}* A = (const {st}*)p.w[20];
  const {st}* B = (const {st}*)p.w[21];
  const {ix} KK = KH * KW, HW = H * W, OHW = OH * OW, cg = C / groups, og = O / groups;
  const unsigned mKK = p.w[26], sKK = p.w[27], mKW = p.w[28], sKW = p.w[29];
  const unsigned mOHW = p.w[30], sOHW = p.w[31], mOW = p.w[32], sOW = p.w[33];
  const i64 tiles_n = ((i64)ncols + {tn1}) / {tn}, tiles_m = ((i64)m + {tm1}) / {tm};
  const i64 g = blockIdx.x;
  const {ix} bx = g % tiles_n, by = (g / tiles_n) % tiles_m;
  const i64 rest = g / (tiles_n * tiles_m);
  const {ix} grp = rest % groups, split = rest / groups;
  if (split >= (i64)p.w[22]) return;
  const int lid = threadIdx.x, tr = lid / {cs}, tc = lid % {cs};
  const {ix} akk = lid % {DEPTH}, arow0 = by * {tm} + lid / {DEPTH};
  const {ix} bcol = bx * {tn} + lid % {tn}, bkb = lid / {tn};
  __shared__ __align__(16) {at} ta[{DEPTH}][{row_a}];
  __shared__ __align__(16) {at} tb[{DEPTH}][{tn}];",
        tm1 = tm - 1,
        tn1 = tn - 1,
        // Rows padded by one vector: the transposed stores of A fall on two banks at most.
        row_a = tm + lanes,
    );
    if filter {
        let _ = writeln!(
            s,
            "  const {ix} r0 = split * ({ix})p.w[23];
  const {ix} r1 = min(r0 + ({ix})p.w[23], samples);
  const {ix} k_lo = r0 * OHW, k_hi = r1 * OHW;"
        );
    } else {
        let _ = writeln!(s, "  const {ix} k_lo = 0, k_hi = kdim;");
    }
    let _ = writeln!(
        s,
        "  {ix} abase[{qa}], ah[{qa}], aw[{qa}]; bool av[{qa}];
#pragma unroll
  for (int q = 0; q < {qa}; q++) {{
    const {ix} r = arow0 + 16 * q; av[q] = r < m;"
    );
    let _ = match sig.pass {
        // A row is an output pixel (n, p, q): where its window starts.
        ConvPass::Forward => writeln!(
            s,
            "    const {ix} n = {}, pq = r - n * OHW, pr = {};
    abase[q] = (n * C + grp * cg) * HW; ah[q] = pr * s0 - p0; aw[q] = (pq - pr * OW) * s1 - p1;",
            quot("r", "OHW"),
            quot("pq", "OW"),
        ),
        // A row is an input pixel (n, h, w): the output pixels whose windows reach it.
        ConvPass::BackwardData => writeln!(
            s,
            "    const {ix} n = r / HW, hw = r % HW;
    abase[q] = (n * O + grp * og) * OHW; ah[q] = hw / W + p0; aw[q] = hw % W + p1;"
        ),
        // A row is an output channel of the group.
        ConvPass::BackwardFilter => writeln!(
            s,
            "    abase[q] = (grp * og + r) * OHW; ah[q] = 0; aw[q] = 0;"
        ),
    };
    s.push_str("  }\n  const bool bv = bcol < ncols;\n");
    if filter {
        // B's column is (channel, tap): where its tap sits relative to the output pixel.
        let _ = writeln!(
            s,
            "  const {ix} bc = {}, btap = bcol - bc * KK, bkr = {};
  const {ix} bdh = bkr * d0 - p0, bdw = (btap - bkr * KW) * d1 - p1, bbase = (grp * cg + bc) * HW;",
            quot("bcol", "KK"),
            quot("btap", "KW"),
        );
    }
    // The gathers of the slice at depth `k`: A's value at depth `k + akk` for each of the
    // thread's rows, B's at its column for each of its depths, into registers.
    let gather = |k: &str| -> String {
        let mut g = format!("    {{\n    const {ix} ka = {k} + akk; const bool kin = ka < k_hi;\n");
        match sig.pass {
            ConvPass::Forward => {
                let _ = writeln!(
                    g,
                    "    const {ix} kc = {}, ktap = ka - kc * KK, kr = {};
    const {ix} kdh = kr * d0, kdw = (ktap - kr * KW) * d1;
#pragma unroll
    for (int q = 0; q < {qa}; q++) {{
      const {ix} hi = ah[q] + kdh, wi = aw[q] + kdw;
      ra[q] = (av[q] && kin && hi >= 0 && hi < H && wi >= 0 && wi < W) ? {} : ({at})0;
    }}",
                    quot("ka", "KK"),
                    quot("ktap", "KW"),
                    load("A", "abase[q] + kc * HW + hi * W + wi")
                );
            }
            ConvPass::BackwardData => {
                // The output pixel whose window's tap lands on the row's input pixel.
                let (p, q) = if sig.unit_stride {
                    ("th", "tw")
                } else {
                    ("(th / s0)", "(tw / s1)")
                };
                let _ = writeln!(
                    g,
                    "    const {ix} ko = {}, ktap = ka - ko * KK, kr = {};
    const {ix} kdh = kr * d0, kdw = (ktap - kr * KW) * d1;
#pragma unroll
    for (int q = 0; q < {qa}; q++) {{
      const {ix} th = ah[q] - kdh, tw = aw[q] - kdw;
      const bool in = av[q] && kin && th >= 0 && tw >= 0{lands} && {p} < OH && {q} < OW;
      ra[q] = in ? {} : ({at})0;
    }}",
                    quot("ka", "KK"),
                    quot("ktap", "KW"),
                    load("A", &format!("abase[q] + ko * OHW + {p} * OW + {q}")),
                    lands = if sig.unit_stride {
                        ""
                    } else {
                        " && th % s0 == 0 && tw % s1 == 0"
                    },
                );
            }
            ConvPass::BackwardFilter => {
                let _ = writeln!(
                    g,
                    "    const {ix} kn = {}, kpq = ka - kn * OHW;
#pragma unroll
    for (int q = 0; q < {qa}; q++) ra[q] = (av[q] && kin) ? {} : ({at})0;",
                    quot("ka", "OHW"),
                    load("A", "kn * O * OHW + abase[q] + kpq")
                );
            }
        }
        let _ = writeln!(
            g,
            "#pragma unroll\n    for (int q = 0; q < {qb}; q++) {{\n      const {ix} kb = {k} + bkb + {} * q;",
            256 / tn
        );
        let _ = match sig.pass {
            ConvPass::Forward => writeln!(
                g,
                "      rb[q] = (bv && kb < k_hi) ? {} : ({at})0;",
                load("B", "(grp * og + bcol) * kdim + kb")
            ),
            ConvPass::BackwardData => writeln!(
                g,
                "      const {ix} bo = {};\n      rb[q] = (bv && kb < k_hi) ? {} : ({at})0;",
                quot("kb", "KK"),
                load("B", "((grp * og + bo) * cg + bcol) * KK + (kb - bo * KK)")
            ),
            ConvPass::BackwardFilter => writeln!(
                g,
                "      const {ix} bn = {}, bpq = kb - bn * OHW, bpr = {};
      const {ix} hi = bpr * s0 + bdh, wi = (bpq - bpr * OW) * s1 + bdw;
      rb[q] = (bv && kb < k_hi && hi >= 0 && hi < H && wi >= 0 && wi < W) ? {} : ({at})0;",
                quot("kb", "OHW"),
                quot("bpq", "OW"),
                load("B", "bn * C * HW + bbase + hi * W + wi")
            ),
        };
        g.push_str("    }\n    }\n");
        g
    };
    // The slices: each one's values stored from registers, then the next slice's gathers
    // issued before this one's multiply-adds (their latency hidden behind them).
    let _ = write!(
        s,
        "  {at} c[{pt}][{pt}];
#pragma unroll
  for (int i = 0; i < {pt}; i++)
#pragma unroll
    for (int j = 0; j < {pt}; j++) c[i][j] = 0;
  {at} ra[{qa}], rb[{qb}];
{first}  for ({ix} k0 = k_lo; k0 < k_hi; k0 += {DEPTH}) {{
#pragma unroll
    for (int q = 0; q < {qa}; q++) ta[akk][lid / {DEPTH} + 16 * q] = ra[q];
#pragma unroll
    for (int q = 0; q < {qb}; q++) tb[bkb + {bstep} * q][lid % {tn}] = rb[q];
    __syncthreads();
    if (k0 + {DEPTH} < k_hi)
{next}#pragma unroll
    for (int kk = 0; kk < {DEPTH}; kk++) {{
      {at} a[{pt}], b[{pt}];
#pragma unroll
      for (int v = 0; v < {pv}; v++) {{
        const {vt} x = *(const {vt}*)&ta[kk][tr * {pt} + {lanes} * v];
        const {vt} y = *(const {vt}*)&tb[kk][tc * {pt} + {lanes} * v];
        {unpack}
      }}
#pragma unroll
      for (int i = 0; i < {pt}; i++)
#pragma unroll
        for (int j = 0; j < {pt}; j++) c[i][j] = fma(a[i], b[j], c[i][j]);
    }}
    __syncthreads();
  }}
",
        first = gather("k_lo"),
        next = gather("(k0 + DEPTH_NEXT)").replace("DEPTH_NEXT", &DEPTH.to_string()),
        bstep = 256 / tn,
        pv = pt / lanes,
        unpack = if lanes == 4 {
            "a[4 * v] = x.x; a[4 * v + 1] = x.y; a[4 * v + 2] = x.z; a[4 * v + 3] = x.w;\n        \
             b[4 * v] = y.x; b[4 * v + 1] = y.y; b[4 * v + 2] = y.z; b[4 * v + 3] = y.w;"
        } else {
            "a[2 * v] = x.x; a[2 * v + 1] = x.y; b[2 * v] = y.x; b[2 * v + 1] = y.y;"
        },
    );
    let _ = writeln!(
        s,
        "#pragma unroll\n  for (int i = 0; i < {pt}; i++) {{\n    const {ix} r = by * {tm} + tr * {pt} + i;\n    if (r >= m) continue;"
    );
    let (rbase, step) = match sig.pass {
        ConvPass::Forward => ("((r / OHW) * O + grp * og) * OHW + r % OHW", "OHW"),
        ConvPass::BackwardData => ("((r / HW) * C + grp * cg) * HW + r % HW", "HW"),
        ConvPass::BackwardFilter => ("(((i64)p.w[24] + split) * O + grp * og + r) * ncols", "1"),
    };
    let value = if filter {
        "(p.w[25] != 0 ? out[at] + c[i][j] : c[i][j])".to_string()
    } else {
        to_storage(d, &cast("c[i][j]", acc, d, false))
    };
    let _ = writeln!(
        s,
        "    const {ix} rbase = {rbase};
#pragma unroll
    for (int j = 0; j < {pt}; j++) {{
      const {ix} col = bx * {tn} + tc * {pt} + j;
      if (col < ncols) {{ const {ix} at = rbase + col * {step}; out[at] = {value}; }}
    }}
  }}
}}"
    );
    s
}

/// The CUDA C source of `strata_conv_sum`: words [0] elements, [1] partials, [2] the output,
/// [3] the partials (`[partials, elements]`, in the accumulator's dtype).
fn sum_source(d: DType) -> String {
    let acc = acc_of(d);
    let (at, st) = (compute_type(acc), storage_type(d));
    format!(
        "extern \"C\" __global__ void strata_conv_sum(const Args<4> p) {{
  const i64 n = p.w[0], parts = p.w[1];
  {st}* out = ({st}*)p.w[2];
  const {at}* part = (const {at}*)p.w[3];
  for (i64 e = (i64)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (i64)gridDim.x * blockDim.x) {{
    {at} s = 0;
    for (i64 q = 0; q < parts; q++) s += part[q * n + e];
    out[e] = {};
  }}
}}",
        to_storage(d, &cast("s", acc, d, false))
    )
}
