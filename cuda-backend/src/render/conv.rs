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
//! else 64-bit. Backward data runs one launch per stride phase (`conv_plan::phases`): the
//! phase's input pixels and only the taps that land on them. Backward filter writes partial
//! products over ranges of samples that
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
    /// Every index fits 32 bits with room to spare ([`fits_32_bits`]): `int` arithmetic, and
    /// the gathers' divisions by a multiply and a shift; else `i64` and divisions.
    pub narrow: bool,
    /// Backward data with a stride above 1: its phases take every `SH`-th tap from `FH` (at
    /// stride 1 the one phase takes them all, and B's depth is the tap itself).
    pub strided: bool,
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
/// partials, [26..34] the multiplier and shift that divide by kH·kW (backward data: the
/// phase's taps), kW (its taps along the width), OH·OW and OW ([`division_magic`]; read with
/// 32-bit indices), [34..48] backward data's stride phase ([`ConvPhase::words`]).
///
/// [`division_magic`]: strata_core::lower::conv_plan::division_magic
/// [`ConvPhase::words`]: strata_core::lower::conv_plan::ConvPhase::words
pub(crate) const WORDS: usize = 48;

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
  // Backward data's stride phase: its pixels (ph + s0·i, pw + s1·j), i < PH, j < PW, and
  // taps (TH × TW of them, the first FH, FW, then every SH, SW), reading output row
  // i + BH − t·AH (column j + BW − u·AW).
  const {ix} ph = (i64)p.w[34], pw = (i64)p.w[35], PH = (i64)p.w[36], PW = (i64)p.w[37];
  const {ix} TW = (i64)p.w[39], FH = (i64)p.w[40], FW = (i64)p.w[41];
  const {ix} SH = (i64)p.w[42], SW = (i64)p.w[43], BH = (i64)p.w[44], BW = (i64)p.w[45];
  const {ix} AH = (i64)p.w[46], AW = (i64)p.w[47], TK = (i64)p.w[38] * TW, PHW = PH * PW;
  const unsigned mTK = mKK, sTK = sKK, mTW = mKW, sTW = sKW; // (words 26..30 divide by these)
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
        // A row is an input pixel (n, ph + s0·i, pw + s1·j) of the phase: the output pixels
        // whose windows reach it.
        ConvPass::BackwardData => writeln!(
            s,
            "    const {ix} n = r / PHW, ij = r - n * PHW, i = ij / PW;
    abase[q] = (n * O + grp * og) * OHW; ah[q] = i + BH; aw[q] = ij - i * PW + BW;"
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
                // The phase's tap (t, u) of output channel `ko`: output pixel (i + BH − t·AH,
                // j + BW − u·AW).
                let _ = writeln!(
                    g,
                    "    const {ix} ko = {}, ktap = ka - ko * TK, kt = {};
    const {ix} kdh = kt * AH, kdw = (ktap - kt * TW) * AW;
#pragma unroll
    for (int q = 0; q < {qa}; q++) {{
      const {ix} th = ah[q] - kdh, tw = aw[q] - kdw;
      const bool in = av[q] && kin && th >= 0 && tw >= 0 && th < OH && tw < OW;
      ra[q] = in ? {} : ({at})0;
    }}",
                    quot("ka", "TK"),
                    quot("ktap", "TW"),
                    load("A", "abase[q] + ko * OHW + th * OW + tw"),
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
            ConvPass::BackwardData if sig.strided => writeln!(
                g,
                "      const {ix} bo = {}, bt = kb - bo * TK, btt = {};
      const {ix} kr = FH + btt * SH, kq = FW + (bt - btt * TW) * SW;
      rb[q] = (bv && kb < k_hi) ? {} : ({at})0;",
                quot("kb", "TK"),
                quot("bt", "TW"),
                load("B", "((grp * og + bo) * cg + bcol) * KK + kr * KW + kq")
            ),
            ConvPass::BackwardData => writeln!(
                g,
                "      const {ix} bo = {};\n      rb[q] = (bv && kb < k_hi) ? {} : ({at})0;",
                quot("kb", "TK"),
                load("B", "((grp * og + bo) * cg + bcol) * KK + (kb - bo * TK)")
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
  if (k_lo < k_hi)
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
        ConvPass::BackwardData => (
            "((r / PHW) * C + grp * cg) * HW + (ph + s0 * ((r % PHW) / PW)) * W + pw + s1 * ((r % PHW) % PW)",
            "HW",
        ),
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
