//! strata's own `Convolution` kernels, for a device without cuDNN: core's implicit GEMM
//! ([`conv_plan`](strata_core::lower::conv_plan)) as a tiled product whose slices of A and B
//! are gathered from the tensors as they are staged (no im2col buffer), the WGSL kernel's
//! structure (`strata-wgpu`'s `render::conv`): a block of 256 threads computes a TM×TN tile
//! of one group's product (the plan's: 64×64, or 256×16 and 16×256 for products of few columns
//! or rows), each thread a 4×4 block (rows `tr + TM/4·i`, columns `tc + TN/4·j`) from 16-deep
//! slices in shared memory; a thread stages TM/16 values of A (that many rows, one depth) and
//! TN/16 of B (one column, as many depths), so it decodes a row's pixel or a column's channel
//! and tap once, and a depth once a slice. Backward filter writes partial products over
//! ranges of samples that `strata_conv_sum` adds into the weight's gradient. Accumulates in
//! f32 (exact f32 products, no TF32) for 16-bit floats and f32, in f64 for f64.

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
/// partials.
pub(crate) const WORDS: usize = 26;

/// The CUDA C source of `strata_conv` for `sig`.
pub(crate) fn source(sig: &ConvSig) -> String {
    let (d, acc) = (sig.dtype, acc_of(sig.dtype));
    let (at, st) = (compute_type(acc), storage_type(d));
    let filter = sig.pass == ConvPass::BackwardFilter;
    let ot = if filter { compute_type(acc) } else { st };
    let load = |p: &str, i: &str| cast(&from_storage(d, &format!("{p}[{i}]")), d, acc, false);
    let [tm, tn] = sig.tile;
    let (qa, qb) = (tm / 16, tn / 16);
    // Each thread's block: rows `tr + (tm / pt)·i`, columns `tc + (tn / pt)·j`.
    let pt = strata_core::lower::conv_plan::per_thread(sig.tile);
    let (rs, cs) = (tm / pt, tn / pt);
    let mut s = String::new();
    let _ = writeln!(
        s,
        "extern \"C\" __global__ void __launch_bounds__(256) strata_conv(const Args<{WORDS}> p) {{
  const i64 m = p.w[0], ncols = p.w[1], kdim = p.w[2], samples = p.w[3];
  const i64 C = p.w[4], H = p.w[5], W = p.w[6], O = p.w[7];
  const i64 KH = p.w[8], KW = p.w[9], OH = p.w[10], OW = p.w[11], groups = p.w[12];
  const i64 s0 = p.w[13], s1 = p.w[14], p0 = p.w[15], p1 = p.w[16], d0 = p.w[17], d1 = p.w[18];
  {ot}* out = ({ot}*)p.w[19];
  const {st}* A = (const {st}*)p.w[20];
  const {st}* B = (const {st}*)p.w[21];
  const i64 KK = KH * KW, HW = H * W, OHW = OH * OW, cg = C / groups, og = O / groups;
  const i64 tiles_n = (ncols + {tn1}) / {tn}, tiles_m = (m + {tm1}) / {tm};
  const i64 g = blockIdx.x;
  const i64 bx = g % tiles_n, by = (g / tiles_n) % tiles_m, rest = g / (tiles_n * tiles_m);
  const i64 grp = rest % groups, split = rest / groups;
  if (split >= (i64)p.w[22]) return;
  const int lid = threadIdx.x, tr = lid / {tc4}, tc = lid % {tc4};
  const i64 akk = lid % {DEPTH}, arow0 = by * {tm} + lid / {DEPTH};
  const i64 bcol = bx * {tn} + lid % {tn}, bkb = lid / {tn};
  __shared__ {at} ta[{DEPTH}][{row_a}];
  __shared__ {at} tb[{DEPTH}][{tn}];",
        tm1 = tm - 1,
        tn1 = tn - 1,
        tc4 = cs,
        row_a = tm + 1,
    );
    if filter {
        s.push_str(
            "  const i64 r0 = split * (i64)p.w[23];
  const i64 r1 = min(r0 + (i64)p.w[23], samples);
  const i64 k_lo = r0 * OHW, k_hi = r1 * OHW;\n",
        );
    } else {
        s.push_str("  const i64 k_lo = 0, k_hi = kdim;\n");
    }
    let _ = writeln!(
        s,
        "  i64 abase[{qa}], ah[{qa}], aw[{qa}]; bool av[{qa}];
#pragma unroll
  for (int q = 0; q < {qa}; q++) {{
    const i64 r = arow0 + 16 * q; av[q] = r < m;"
    );
    let _ = match sig.pass {
        // A row is an output pixel (n, p, q): where its window starts.
        ConvPass::Forward => writeln!(
            s,
            "    const i64 n = r / OHW, pq = r % OHW;
    abase[q] = (n * C + grp * cg) * HW; ah[q] = (pq / OW) * s0 - p0; aw[q] = (pq % OW) * s1 - p1;"
        ),
        // A row is an input pixel (n, h, w): the output pixels whose windows reach it.
        ConvPass::BackwardData => writeln!(
            s,
            "    const i64 n = r / HW, hw = r % HW;
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
        s.push_str(
            "  const i64 bc = bcol / KK, btap = bcol % KK;
  const i64 bdh = (btap / KW) * d0 - p0, bdw = (btap % KW) * d1 - p1, bbase = (grp * cg + bc) * HW;\n",
        );
    }
    let _ = writeln!(
        s,
        "  {at} c[{pt}][{pt}];
#pragma unroll
  for (int i = 0; i < {pt}; i++)
#pragma unroll
    for (int j = 0; j < {pt}; j++) c[i][j] = 0;
  for (i64 k0 = k_lo; k0 < k_hi; k0 += {DEPTH}) {{
    const i64 ka = k0 + akk; const bool kin = ka < k_hi;
    {at} ra[{qa}], rb[{qb}];"
    );
    match sig.pass {
        ConvPass::Forward => {
            let _ = writeln!(
                s,
                "    const i64 kc = ka / KK, ktap = ka % KK, kdh = (ktap / KW) * d0, kdw = (ktap % KW) * d1;
#pragma unroll
    for (int q = 0; q < {qa}; q++) {{
      const i64 hi = ah[q] + kdh, wi = aw[q] + kdw;
      ra[q] = (av[q] && kin && hi >= 0 && hi < H && wi >= 0 && wi < W) ? {} : ({at})0;
    }}",
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
                s,
                "    const i64 ko = ka / KK, ktap = ka % KK, kdh = (ktap / KW) * d0, kdw = (ktap % KW) * d1;
#pragma unroll
    for (int q = 0; q < {qa}; q++) {{
      const i64 th = ah[q] - kdh, tw = aw[q] - kdw;
      const bool in = av[q] && kin && th >= 0 && tw >= 0{lands} && {p} < OH && {q} < OW;
      ra[q] = in ? {} : ({at})0;
    }}",
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
                s,
                "    const i64 kn = ka / OHW, kpq = ka % OHW;
#pragma unroll
    for (int q = 0; q < {qa}; q++) ra[q] = (av[q] && kin) ? {} : ({at})0;",
                load("A", "kn * O * OHW + abase[q] + kpq")
            );
        }
    }
    let _ = writeln!(
        s,
        "#pragma unroll\n    for (int q = 0; q < {qb}; q++) {{\n      const i64 kb = k0 + bkb + {} * q;",
        256 / tn
    );
    let _ = match sig.pass {
        ConvPass::Forward => writeln!(
            s,
            "      rb[q] = (bv && kb < k_hi) ? {} : ({at})0;",
            load("B", "(grp * og + bcol) * kdim + kb")
        ),
        ConvPass::BackwardData => writeln!(
            s,
            "      rb[q] = (bv && kb < k_hi) ? {} : ({at})0;",
            load("B", "((grp * og + kb / KK) * cg + bcol) * KK + kb % KK")
        ),
        ConvPass::BackwardFilter => writeln!(
            s,
            "      const i64 bn = kb / OHW, bpq = kb % OHW;
      const i64 hi = (bpq / OW) * s0 + bdh, wi = (bpq % OW) * s1 + bdw;
      rb[q] = (bv && kb < k_hi && hi >= 0 && hi < H && wi >= 0 && wi < W) ? {} : ({at})0;",
            load("B", "bn * C * HW + bbase + hi * W + wi")
        ),
    };
    let _ = writeln!(
        s,
        "    }}
#pragma unroll
    for (int q = 0; q < {qa}; q++) ta[akk][lid / {DEPTH} + 16 * q] = ra[q];
#pragma unroll
    for (int q = 0; q < {qb}; q++) tb[bkb + {bstep} * q][lid % {tn}] = rb[q];
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < {DEPTH}; kk++) {{
      {at} a[{pt}], b[{pt}];
#pragma unroll
      for (int i = 0; i < {pt}; i++) {{ a[i] = ta[kk][tr + {rs} * i]; b[i] = tb[kk][tc + {cs} * i]; }}
#pragma unroll
      for (int i = 0; i < {pt}; i++)
#pragma unroll
        for (int j = 0; j < {pt}; j++) c[i][j] = fma(a[i], b[j], c[i][j]);
    }}
    __syncthreads();
  }}",
        bstep = 256 / tn,
    );
    let _ = writeln!(
        s,
        "#pragma unroll\n  for (int i = 0; i < {pt}; i++) {{\n    const i64 r = by * {tm} + tr + {rs} * i;\n    if (r >= m) continue;"
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
        "    const i64 rbase = {rbase};
#pragma unroll
    for (int j = 0; j < {pt}; j++) {{
      const i64 col = bx * {tn} + tc + {cs} * j;
      if (col < ncols) {{ const i64 at = rbase + col * {step}; out[at] = {value}; }}
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
