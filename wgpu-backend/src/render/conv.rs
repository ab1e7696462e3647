//! `Convolution`: core's implicit GEMM ([`conv_plan`](strata_core::lower::conv_plan)) as a
//! tiled product whose slices of A and B are gathered from the tensors as they are staged (no
//! im2col buffer), the CUDA kernel's structure (`strata-cuda`'s `render::conv`). A workgroup
//! computes a TM×TN tile of one group's product (the plan's
//! [`TILES`](strata_core::lower::conv_plan::TILES)), each invocation a 4×4 or 8×8 block (rows
//! `tr·pt + i`, columns `tc·pt + j`, read from 16-deep slices in workgroup memory as four-wide
//! vectors); an invocation stages TM/16 values of A (that many rows, one depth) and TN/16 of
//! B (one column, as many depths), so what it decodes of a row or a column (a pixel, a channel
//! and tap) it decodes once, and of a depth once per slice — by a multiply and a shift
//! (`conv_plan::division_magic`) where every index allows — and issues the next slice's
//! gathers before this one's multiply-adds. Backward filter writes partial products over
//! ranges of samples (the plan's splits), which a second kernel sums into the weight's
//! gradient. Accumulates in f32 for 16-bit floats, in the dtype otherwise.

use super::prelude::helpers;
use super::{binding, cast, compute_type, literal, load, store, Caps, ENTRY};
use std::collections::BTreeSet;
use std::fmt::Write;
use strata_core::ir::ConvPass;
use strata_core::DType;

/// The depth of the staged slices.
const DEPTH: usize = 16;

/// The structure of a convolution dispatch.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct ConvSig {
    pub pass: ConvPass,
    /// The operands' dtype.
    pub dtype: DType,
    /// The accumulator's (and backward filter's partial products').
    pub acc: DType,
    /// The tile (rows, columns) of the plan.
    pub tile: [usize; 2],
    /// The kernel that sums backward filter's partial products into the output.
    pub sum_partials: bool,
    /// The gathers divide by a multiply and a shift (every index below 2^31 with room to
    /// spare: `ConvDims::fits_32_bits`); else by WGSL's division.
    pub fast_division: bool,
    /// Backward data with a stride above 1: its phases take every `SH`-th tap from `FH` (at
    /// stride 1 the one phase takes them all, and B's depth is the tap itself).
    pub strided: bool,
}

impl strata_core::kernel_cache::Owned for ConvSig {}

/// Words: [0] rows, [1] columns, [2] depth (one group's product, this piece), [3] samples in
/// the piece, [4..12] C, H, W, O, kH, kW, OH, OW, [12] groups, [13..19] stride, padding and
/// dilation (height, width), [19..22] offsets of the output and of inputs A and B,
/// [22] ranges (backward filter; else 1), [23] samples a range, [24] the first range's
/// partial, [25] 1: add to the partials, [26..34] the multiplier and shift that divide by
/// kH·kW (backward data: the phase's taps), kW (its taps along the width), OH·OW and OW
/// (`conv_plan::division_magic`), [34..48] backward data's stride phase
/// (`ConvPhase::words`, the base as `i32` bits).
/// Summing partials: [0] elements of the output, [1] partials, [2] output offset.
pub(crate) const PARAM_WORDS: usize = 48;

/// The WGSL source of a convolution dispatch (bindings: 0 the output or the partials, 1 A,
/// 2 B; summing: 0 the output, 1 the partials).
pub(crate) fn source(sig: &ConvSig, caps: Caps) -> String {
    if sig.sum_partials {
        return sum_source(sig, caps);
    }
    let (d, acc) = (sig.dtype, sig.acc);
    let at = compute_type(acc);
    let zero = literal(acc, 0);
    let filter = sig.pass == ConvPass::BackwardFilter;
    let out_d = if filter { acc } else { d };
    let mut src = super::header(caps);
    src.push_str(&binding(0, out_d, true, caps));
    src.push_str(&binding(1, d, false, caps));
    src.push_str(&binding(2, d, false, caps));
    src.push_str(&helpers(&BTreeSet::from([d, acc]), caps));
    let [tm, tn] = sig.tile;
    let (qa, qb) = (tm / 16, tn / 16);
    // Each invocation's block: rows `tr·pt + i`, columns `tc·pt + j`, read from the slices as
    // four-wide vectors.
    let pt = strata_core::lower::conv_plan::per_thread(sig.tile);
    let cs = tn / pt;
    // A's rows are one vector longer than the tile: its stores (16 depths of one row per half
    // warp) then fall on two banks at most.
    let row_a = tm + 4;
    let _ = writeln!(
        src,
        "var<workgroup> ta: array<vec4<{at}>, {}>;\nvar<workgroup> tb: array<vec4<{at}>, {}>;",
        DEPTH * row_a / 4,
        DEPTH * tn / 4
    );
    if sig.fast_division {
        // `n / d` for n below 2^31 from the multiplier and shift of `conv_plan::division_magic`.
        src.push_str(
            "fn fdiv(n: u32, m: u32, s: u32) -> u32 {
  let p = mul_hi_lo(n, m);
  if (s >= 32u) { return p.x >> (s - 32u); }
  return (p.x << 1u) | (p.y >> 31u);
}\n",
        );
    }
    // `n / by` for a divisor of words 26..34.
    let quot = |n: &str, by: &str| {
        if sig.fast_division {
            format!("fdiv({n}, m{by}, s{by})")
        } else {
            format!("({n} / {by})")
        }
    };
    src.push_str(ENTRY);
    let _ = writeln!(
        src,
        "  let m = params[0]; let ncols = params[1]; let kdim = params[2]; let samples = params[3];
  let C = params[4]; let H = params[5]; let W = params[6]; let O = params[7];
  let KH = params[8]; let KW = params[9]; let OH = params[10]; let OW = params[11];
  let groups = params[12];
  let s0 = i32(params[13]); let s1 = i32(params[14]); let p0 = i32(params[15]);
  let p1 = i32(params[16]); let d0 = i32(params[17]); let d1 = i32(params[18]);
  let off_o = params[19]; let off_a = params[20]; let off_b = params[21];
  let mKK = params[26]; let sKK = params[27]; let mKW = params[28]; let sKW = params[29];
  let mOHW = params[30]; let sOHW = params[31]; let mOW = params[32]; let sOW = params[33];
  // Backward data's stride phase: its pixels (ph + s0·i, pw + s1·j), i < PH, j < PW, and
  // taps (TH × TW of them, the first FH, FW, then every SH, SW), reading output row
  // i + BH − t·AH (column j + BW − u·AW).
  let ph = params[34]; let pw = params[35]; let PH = params[36]; let PW = params[37];
  let TW = params[39]; let FH = params[40]; let FW = params[41];
  let SH = params[42]; let SW = params[43];
  let BH = bitcast<i32>(params[44]); let BW = bitcast<i32>(params[45]);
  let AH = i32(params[46]); let AW = i32(params[47]);
  let TK = params[38] * TW; let PHW = PH * PW;
  let mTK = mKK; let sTK = sKK; let mTW = mKW; let sTW = sKW;
  let KK = KH * KW; let HW = H * W; let OHW = OH * OW;
  let cg = C / groups; let og = O / groups;
  let g = wg.y * nwg.x + wg.x;
  let tiles_n = (ncols + {tn1}u) / {tn}u; let tiles_m = (m + {tm1}u) / {tm}u;
  let bx = g % tiles_n; let by = (g / tiles_n) % tiles_m; let rest = g / (tiles_n * tiles_m);
  let grp = rest % groups; let split = rest / groups;
  if (split >= params[22]) {{ return; }}
  let tr = lid / {cs}u; let tc = lid % {cs}u;
  let akk = lid % {DEPTH}u; let arow0 = by * {tm}u + lid / {DEPTH}u;
  let bcol = bx * {tn}u + lid % {tn}u; let bkb = lid / {tn}u;",
        tm1 = tm - 1,
        tn1 = tn - 1,
    );
    // The depth range: backward filter's split covers its samples' pixels.
    if filter {
        let _ = writeln!(
            src,
            "  let r0 = split * params[23]; let r1 = min(r0 + params[23], samples);
  let k_lo = r0 * OHW; let k_hi = r1 * OHW;"
        );
    } else {
        src.push_str("  let k_lo = 0u; let k_hi = kdim;\n");
    }
    // Per staged row of A (TM/16 per invocation) and per staged column of B (one), what the
    // loads need, decoded once.
    for q in 0..qa {
        let r = format!("arow0 + {}u", 16 * q);
        let _ = match sig.pass {
            // A row is an output pixel (n, p, q): where its window starts.
            ConvPass::Forward => writeln!(
                src,
                "  let ar{q} = {r}; let av{q} = ar{q} < m;
  let an{q} = {}; let apq{q} = ar{q} - an{q} * OHW; let apr{q} = {};
  let abase{q} = (an{q} * C + grp * cg) * HW;
  let ah{q} = i32(apr{q}) * s0 - p0; let aw{q} = i32(apq{q} - apr{q} * OW) * s1 - p1;",
                quot(&format!("ar{q}"), "OHW"),
                quot(&format!("apq{q}"), "OW"),
            ),
            // A row is an input pixel (n, ph + s0·i, pw + s1·j) of the phase: the output
            // pixels whose windows reach it.
            ConvPass::BackwardData => writeln!(
                src,
                "  let ar{q} = {r}; let av{q} = ar{q} < m;
  let an{q} = ar{q} / PHW; let aij{q} = ar{q} % PHW;
  let abase{q} = (an{q} * O + grp * og) * OHW;
  let ah{q} = i32(aij{q} / PW) + BH; let aw{q} = i32(aij{q} % PW) + BW;"
            ),
            // A row is an output channel of the group.
            ConvPass::BackwardFilter => writeln!(
                src,
                "  let ar{q} = {r}; let av{q} = ar{q} < m;
  let abase{q} = (grp * og + ar{q}) * OHW;"
            ),
        };
    }
    if filter {
        // B's column is (channel, tap): where its tap sits relative to the output pixel.
        let _ = writeln!(
            src,
            "  let bv = bcol < ncols; let bc = {}; let btap = bcol - bc * KK; let bkr = {};
  let bdh = i32(bkr) * d0 - p0; let bdw = i32(btap - bkr * KW) * d1 - p1;
  let bbase = (grp * cg + bc) * HW;",
            quot("bcol", "KK"),
            quot("btap", "KW"),
        );
    } else {
        src.push_str("  let bv = bcol < ncols;\n");
    }
    for i in 0..pt {
        let line: Vec<String> = (0..pt)
            .map(|j| format!("var c{i}_{j}: {at} = {zero};"))
            .collect();
        let _ = writeln!(src, "  {}", line.join(" "));
    }
    for q in 0..qa {
        let _ = writeln!(src, "  var ra{q}: {at};");
    }
    for q in 0..qb {
        let _ = writeln!(src, "  var rb{q}: {at};");
    }
    let a_value = |idx: &str| cast(&load(d, "b1", idx, caps), d, acc, false);
    let b_value = |idx: &str| cast(&load(d, "b2", idx, caps), d, acc, false);
    // The gathers of the slice at depth `k` into registers: A's value at depth `k + akk` for
    // each of the invocation's rows (its depth decoded once), B's at its column for each of
    // its depths.
    let gather = |src: &mut String, k: &str| {
        let _ = writeln!(src, "    {{ let ka = {k} + akk; let kin = ka < k_hi;");
        match sig.pass {
            ConvPass::Forward => {
                let _ = writeln!(
                    src,
                    "    let kc = {}; let ktap = ka - kc * KK; let kr = {};
    let kdh = i32(kr) * d0; let kdw = i32(ktap - kr * KW) * d1;",
                    quot("ka", "KK"),
                    quot("ktap", "KW"),
                );
            }
            // The phase's tap (t, u) of output channel `kc`: output pixel (i + BH − t·AH,
            // j + BW − u·AW).
            ConvPass::BackwardData => {
                let _ = writeln!(
                    src,
                    "    let kc = {}; let ktap = ka - kc * TK; let kt = {};
    let kdh = i32(kt) * AH; let kdw = i32(ktap - kt * TW) * AW;",
                    quot("ka", "TK"),
                    quot("ktap", "TW"),
                );
            }
            ConvPass::BackwardFilter => {
                let _ = writeln!(
                    src,
                    "    let kn = {}; let kpq = ka - kn * OHW;",
                    quot("ka", "OHW")
                );
            }
        }
        match sig.pass {
            ConvPass::Forward => {
                for q in 0..qa {
                    let _ = writeln!(
                        src,
                        "    {{ let hi = ah{q} + kdh; let wi = aw{q} + kdw; ra{q} = {zero};
      if (av{q} && kin && hi >= 0 && hi < i32(H) && wi >= 0 && wi < i32(W)) {{
        ra{q} = {}; }} }}",
                        a_value(&format!(
                            "off_a + abase{q} + kc * HW + u32(hi) * W + u32(wi)"
                        ))
                    );
                }
            }
            ConvPass::BackwardData => {
                for q in 0..qa {
                    let _ = writeln!(
                        src,
                        "    {{ let th = ah{q} - kdh; let tw = aw{q} - kdw; ra{q} = {zero};
      if (av{q} && kin && th >= 0 && tw >= 0 && th < i32(OH) && tw < i32(OW)) {{
        ra{q} = {}; }} }}",
                        a_value(&format!(
                            "off_a + abase{q} + kc * OHW + u32(th) * OW + u32(tw)"
                        ))
                    );
                }
            }
            ConvPass::BackwardFilter => {
                for q in 0..qa {
                    let _ = writeln!(
                        src,
                        "    ra{q} = {zero}; if (av{q} && kin) {{ ra{q} = {}; }}",
                        a_value(&format!("off_a + kn * O * OHW + abase{q} + kpq"))
                    );
                }
            }
        }
        // B: TN/16 depths of one column.
        for q in 0..qb {
            let _ = writeln!(
                src,
                "    {{ let kb = {k} + bkb + {}u; rb{q} = {zero};",
                256 / tn * q
            );
            let _ = match sig.pass {
                ConvPass::Forward => writeln!(
                    src,
                    "      if (bv && kb < k_hi) {{ rb{q} = {}; }} }}",
                    b_value("off_b + (grp * og + bcol) * kdim + kb")
                ),
                ConvPass::BackwardData if sig.strided => writeln!(
                    src,
                    "      let bo = {}; let bt = kb - bo * TK; let btt = {};
      let kr = FH + btt * SH; let kq = FW + (bt - btt * TW) * SW;
      if (bv && kb < k_hi) {{ rb{q} = {}; }} }}",
                    quot("kb", "TK"),
                    quot("bt", "TW"),
                    b_value("off_b + ((grp * og + bo) * cg + bcol) * KK + kr * KW + kq")
                ),
                ConvPass::BackwardData => writeln!(
                    src,
                    "      let bo = {};\n      if (bv && kb < k_hi) {{ rb{q} = {}; }} }}",
                    quot("kb", "TK"),
                    b_value("off_b + ((grp * og + bo) * cg + bcol) * KK + kb - bo * TK")
                ),
                ConvPass::BackwardFilter => writeln!(
                    src,
                    "      let bn = {}; let bpq = kb - bn * OHW; let bpr = {};
      let hi = i32(bpr) * s0 + bdh; let wi = i32(bpq - bpr * OW) * s1 + bdw;
      if (bv && kb < k_hi && hi >= 0 && hi < i32(H) && wi >= 0 && wi < i32(W)) {{
        rb{q} = {}; }} }}",
                    quot("kb", "OHW"),
                    quot("bpq", "OW"),
                    b_value("off_b + bn * C * HW + bbase + u32(hi) * W + u32(wi)")
                ),
            };
        }
        src.push_str("    }\n");
    };
    // The first slice's gathers; then for each slice its values stored from registers, the
    // next slice's gathers issued (in flight during the multiply-adds), the multiply-adds.
    // The next slice's gathers during this one's multiply-adds, but in the tall 256×16 tile:
    // its sixteen values of A held across them made a 7×7 stride-2 backward data 1.6× slower
    // through NVIDIA's driver (177 ms against 110; the 256×64 tile's forward gained 14%).
    let prefetch = sig.tile != [256, 16];
    if prefetch {
        src.push_str("  if (k_lo < k_hi) {\n");
        gather(&mut src, "k_lo");
        src.push_str("  }\n");
    }
    let _ = writeln!(
        src,
        "  for (var k0 = k_lo; k0 < k_hi; k0 = k0 + {DEPTH}u) {{"
    );
    if !prefetch {
        gather(&mut src, "k0");
    }
    for q in 0..qa {
        let _ = writeln!(
            src,
            "    {{ let ti = akk * {row_a}u + lid / {DEPTH}u + {}u; ta[ti / 4u][ti % 4u] = ra{q}; }}",
            16 * q
        );
    }
    for q in 0..qb {
        let _ = writeln!(
            src,
            "    {{ let ti = (bkb + {}u) * {tn}u + lid % {tn}u; tb[ti / 4u][ti % 4u] = rb{q}; }}",
            256 / tn * q
        );
    }
    src.push_str("    workgroupBarrier();\n");
    if prefetch {
        let _ = writeln!(src, "    if (k0 + {DEPTH}u < k_hi) {{");
        gather(&mut src, &format!("k0 + {DEPTH}u"));
        src.push_str("    }\n");
    }
    let _ = writeln!(src, "    for (var kk = 0u; kk < {DEPTH}u; kk = kk + 1u) {{");
    for v in 0..pt / 4 {
        let _ = writeln!(
            src,
            "      let va{v} = ta[kk * {} + tr * {} + {v}u]; let vb{v} = tb[kk * {} + tc * {} + {v}u];",
            format_args!("{}u", row_a / 4),
            format_args!("{}u", pt / 4),
            format_args!("{}u", tn / 4),
            format_args!("{}u", pt / 4),
        );
    }
    for i in 0..pt {
        let line: Vec<String> = (0..pt)
            .map(|j| {
                let c = format!("c{i}_{j}");
                let a = format!("va{}[{}]", i / 4, i % 4);
                let b = format!("vb{}[{}]", j / 4, j % 4);
                format!("{c} = {};", madd(acc, &c, &a, &b))
            })
            .collect();
        let _ = writeln!(src, "      {}", line.join(" "));
    }
    src.push_str("    }\n    workgroupBarrier();\n  }\n");
    // The tile's outputs.
    for i in 0..pt {
        let _ = writeln!(
            src,
            "  {{ let r = by * {tm}u + tr * {pt}u + {i}u;\n    if (r < m) {{"
        );
        let _ = match sig.pass {
            ConvPass::Forward => writeln!(
                src,
                "      let rbase = off_o + ((r / OHW) * O + grp * og) * OHW + r % OHW;"
            ),
            ConvPass::BackwardData => writeln!(
                src,
                "      let rij = r % PHW;
      let rbase = off_o + ((r / PHW) * C + grp * cg) * HW + (ph + u32(s0) * (rij / PW)) * W + pw + u32(s1) * (rij % PW);"
            ),
            ConvPass::BackwardFilter => writeln!(
                src,
                "      let rbase = ((params[24] + split) * O + grp * og + r) * ncols;"
            ),
        };
        for j in 0..pt {
            let c = format!("c{i}_{j}");
            let (idx, value) = match sig.pass {
                ConvPass::Forward => ("rbase + col * OHW", cast(&c, acc, d, false)),
                ConvPass::BackwardData => ("rbase + col * HW", cast(&c, acc, d, false)),
                ConvPass::BackwardFilter => (
                    "rbase + col",
                    format!(
                        "select({c}, {} + {c}, params[25] != 0u)",
                        load(acc, "b0", "rbase + col", caps)
                    ),
                ),
            };
            let _ = writeln!(
                src,
                "      {{ let col = bx * {tn}u + tc * {pt}u + {j}u; if (col < ncols) {{ {} }} }}",
                store(out_d, "b0", idx, &value, caps)
            );
        }
        src.push_str("    }\n  }\n");
    }
    src.push_str("}\n");
    src
}

/// The kernel summing backward filter's partial products (`[partials, elements]`, in the
/// accumulator's dtype) into the output, an element an invocation.
fn sum_source(sig: &ConvSig, caps: Caps) -> String {
    let (d, acc) = (sig.dtype, sig.acc);
    let mut src = super::header(caps);
    src.push_str(&binding(0, d, true, caps));
    src.push_str(&binding(1, acc, false, caps));
    src.push_str(&helpers(&BTreeSet::from([d, acc]), caps));
    src.push_str(ENTRY);
    let _ = writeln!(
        src,
        "  let n = params[0];
  if (gid >= n) {{ return; }}
  var s: {at} = {zero};
  for (var p = 0u; p < params[1]; p = p + 1u) {{ s = s + {part}; }}
  {put}
}}",
        at = compute_type(acc),
        zero = literal(acc, 0),
        part = load(acc, "b1", "p * n + gid", caps),
        put = store(d, "b0", "params[2] + gid", &cast("s", acc, d, false), caps),
    );
    src
}

/// `x + a·b` in a float accumulator: one fused multiply-add in f32.
fn madd(acc: DType, x: &str, a: &str, b: &str) -> String {
    if compute_type(acc) == "f32" {
        format!("fma({a}, {b}, {x})")
    } else {
        format!("({x} + {a} * {b})")
    }
}
