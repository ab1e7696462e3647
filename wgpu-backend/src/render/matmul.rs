//! `Matmul`: a 128×128 output tile per workgroup of 256 invocations, each accumulating an 8×8
//! block in registers from 16-deep slices of A and B staged in workgroup memory.
//!
//! What made it fast on an H100 through Vulkan (13.7 → 33 TFLOP/s at 4096³, measured with
//! standalone variants of this kernel): every invocation first loads all 16 of its staged values
//! into registers and only then stores them (loads in flight together, not one at a time); the
//! rows of the A slice are padded by one vector so that its transposing stores do not collide
//! in one memory bank; the 16 depth steps are written out (no loop, constant offsets); operand
//! offsets are computed once and stepped. Double buffering through registers did not help.
//!
//! With 32-bit accumulators the slices are arrays of vec4s and an invocation owns rows
//! `4tr..4tr+3` and `64+4tr..64+4tr+3` (columns likewise), so one depth step reads its A and B
//! values in four vector loads; otherwise rows `tr + 16i` and columns `tc + 16j`, read one by
//! one. The accumulators are named variables, never a dynamically indexed array, so they stay
//! in registers. Any strides (a batch stride may be 0); every dtype, accumulating in the IR's
//! `acc` (integers wrap).

use super::prelude::helpers;
use super::{binding, cast, compute_type, literal, load, scalar_value, store, wrap, Caps, ENTRY};
use std::collections::BTreeSet;
use std::fmt::Write;
use strata_core::DType;

/// The output tile's side.
pub(crate) const TILE: usize = 128;
/// Per invocation: an 8×8 block of the tile.
const PER: usize = 8;
/// The depth of the staged slices of A and B.
const DEPTH: usize = 16;
/// Values of A (and of B) each invocation stages per slice.
const STAGED: usize = TILE * DEPTH / 256;

/// The structure of a matmul launch.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct MatmulSig {
    pub dtype: DType,
    pub acc: DType,
    /// On cooperative matrices ([`super::coop_matmul`]; f16 accumulating in f32 only).
    pub coop: bool,
    /// With `coop`: A and B staged by 16-byte loads (the planner checked their layouts).
    pub vectors: bool,
}

impl strata_core::kernel_cache::Owned for MatmulSig {}

/// Words: [0] batch, [1] m, [2] k, [3] n, [4..7] offsets of A, B, C, [7..10] strides of A
/// (batch, row, col), [10..13] of B, [13..16] of C, [16, 17] α, [18, 19] β.
pub(crate) const PARAM_WORDS: usize = 20;

/// The WGSL source of a matmul launch on tiles (bindings: 0 C, 1 A, 2 B); a `coop` signature
/// is [`super::coop_matmul`]'s.
pub(crate) fn source(sig: &MatmulSig, caps: Caps) -> String {
    let (d, acc) = (sig.dtype, sig.acc);
    let at = compute_type(acc);
    let zero = literal(acc, 0);
    let st = |w: usize| format!("bitcast<i32>(params[{w}])");
    let mut src = super::header(caps);
    src.push_str(&binding(0, d, true, caps));
    src.push_str(&binding(1, d, false, caps));
    src.push_str(&binding(2, d, false, caps));
    src.push_str(&helpers(&BTreeSet::from([d, acc]), caps));
    // 32-bit accumulators are staged as vec4s: an invocation then reads its 8 values of A and
    // of B for one depth step in 4 loads rather than 16. A row of the A slice is one vector
    // (or one element) longer than the tile, so the stores that transpose A spread over banks.
    let v4 = matches!(acc, DType::F32 | DType::I32 | DType::U32);
    let (row_a, row_b) = if v4 {
        (TILE / 4 + 1, TILE / 4)
    } else {
        (TILE + 1, TILE)
    };
    let elem = if v4 {
        format!("vec4<{at}>")
    } else {
        at.to_string()
    };
    let _ = writeln!(
        src,
        "var<workgroup> ta: array<{elem}, {}>;\nvar<workgroup> tb: array<{elem}, {}>;",
        DEPTH * row_a,
        DEPTH * row_b
    );
    // Where staged value `q` of this invocation goes: A row `lid / 16 + 16q` at depth
    // `lid % 16`; B column `lid % 128` at depth `lid / 128 + 2q`.
    let put_a = |q: usize| {
        if v4 {
            format!(
                "ta[akk * {row_a}u + lid / 64u + {}u][(lid / 16u) % 4u]",
                4 * q
            )
        } else {
            format!("ta[akk * {row_a}u + lid / 16u + {}u]", 16 * q)
        }
    };
    let put_b = |q: usize| {
        if v4 {
            format!(
                "tb[(bkb + {}u) * {row_b}u + (lid % 128u) / 4u][lid % 4u]",
                2 * q
            )
        } else {
            format!("tb[(bkb + {}u) * {row_b}u + lid % 128u]", 2 * q)
        }
    };
    // Row (or column) of the tile behind accumulator index `i` of invocation row `t`.
    let lane = |t: &str, i: usize| {
        if v4 {
            format!("4u * {t} + {}u", 64 * (i / 4) + i % 4)
        } else {
            format!("{t} + {}u", 16 * i)
        }
    };
    src.push_str(ENTRY);
    let _ = writeln!(
        src,
        "  let batch = params[0]; let m = params[1]; let k = params[2]; let n = params[3];
  let g = wg.y * nwg.x + wg.x;
  let tiles_n = (n + {t1}u) / {t}u; let tiles_m = (m + {t1}u) / {t}u;
  let bx = g % tiles_n; let by = (g / tiles_n) % tiles_m; let bz = g / (tiles_n * tiles_m);
  if (bz >= batch) {{ return; }}
  let tr = lid / 16u; let tc = lid % 16u;
  let sa1 = {sa1}; let sa2 = {sa2}; let sb1 = {sb1}; let sb2 = {sb2};
  let akk = lid % {DEPTH}u; let arow = by * {t}u + lid / {DEPTH}u;
  let bcol = bx * {t}u + lid % {t}u; let bkb = lid / {t}u;
  let aoff = i32(params[4]) + i32(bz) * {sa0} + i32(arow) * sa1 + i32(akk) * sa2;
  let boff = i32(params[5]) + i32(bz) * {sb0} + i32(bkb) * sb1 + i32(bcol) * sb2;",
        t = TILE,
        t1 = TILE - 1,
        sa0 = st(7),
        sa1 = st(8),
        sa2 = st(9),
        sb0 = st(10),
        sb1 = st(11),
        sb2 = st(12),
    );
    for i in 0..PER {
        let line: Vec<String> = (0..PER)
            .map(|j| format!("var c{i}_{j}: {at} = {zero};"))
            .collect();
        let _ = writeln!(src, "  {}", line.join(" "));
    }
    for q in 0..STAGED {
        let _ = writeln!(src, "  var ra{q}: {at}; var rb{q}: {at};");
    }
    let _ = writeln!(src, "  for (var k0 = 0u; k0 < k; k0 = k0 + {DEPTH}u) {{");
    // All loads first, then all stores: the loads are in flight together. Staged value `q` of A
    // is row `arow + 16q` at depth `k0 + akk`; of B, depth `k0 + bkb + 2q` in column `bcol`.
    let mut stage = |reg: String, buf: &str, idx: String, inside: String| {
        let v = cast(&load(d, buf, &idx, caps), d, acc, false);
        let _ = writeln!(src, "    {reg} = {zero}; if ({inside}) {{ {reg} = {v}; }}");
    };
    for q in 0..STAGED {
        let row = 256 / DEPTH * q;
        stage(
            format!("ra{q}"),
            "b1",
            format!("u32(aoff + {row} * sa1 + i32(k0) * sa2)"),
            format!("arow + {row}u < m && k0 + akk < k"),
        );
    }
    for q in 0..STAGED {
        let depth = 256 / TILE * q;
        stage(
            format!("rb{q}"),
            "b2",
            format!("u32(boff + i32(k0 + {depth}u) * sb1)"),
            format!("bcol < n && k0 + bkb + {depth}u < k"),
        );
    }
    for q in 0..STAGED {
        let _ = writeln!(src, "    {} = ra{q}; {} = rb{q};", put_a(q), put_b(q));
    }
    src.push_str("    workgroupBarrier();\n");
    // The depth steps, written out.
    for kk in 0..DEPTH {
        src.push_str("    {\n");
        if v4 {
            let (a0, b0) = (kk * row_a, kk * row_b);
            let _ = writeln!(
                src,
                "      let al = ta[{a0}u + tr]; let ah = ta[{}u + tr];
      let bl = tb[{b0}u + tc]; let bh = tb[{}u + tc];",
                a0 + 16,
                b0 + 16
            );
            for (i, c) in ["x", "y", "z", "w"].iter().enumerate() {
                let _ = writeln!(
                    src,
                    "      let a{i} = al.{c}; let a{} = ah.{c}; let b{i} = bl.{c}; let b{} = bh.{c};",
                    i + 4,
                    i + 4
                );
            }
        } else {
            for (name, slice, row, t) in [("a", "ta", row_a, "tr"), ("b", "tb", row_b, "tc")] {
                for i in 0..PER {
                    let at = kk * row;
                    let _ = writeln!(
                        src,
                        "      let {name}{i} = {slice}[{at}u + {}];",
                        lane(t, i)
                    );
                }
            }
        }
        for i in 0..PER {
            let line: Vec<String> = (0..PER)
                .map(|j| {
                    let c = format!("c{i}_{j}");
                    format!(
                        "{c} = {};",
                        madd(acc, &c, &format!("a{i}"), &format!("b{j}"))
                    )
                })
                .collect();
            let _ = writeln!(src, "      {}", line.join(" "));
        }
        src.push_str("    }\n");
    }
    src.push_str("    workgroupBarrier();\n  }\n");
    src.push_str(&scale_lets(acc));
    for i in 0..PER {
        for j in 0..PER {
            let _ = writeln!(
                src,
                "  {{ let r = by * {TILE}u + {ri}; let c = bx * {TILE}u + {cj};
    if (r < m && c < n) {{
{}
    }} }}",
                store_scaled(d, acc, &format!("c{i}_{j}"), caps),
                ri = lane("tr", i),
                cj = lane("tc", j),
            );
        }
    }
    src.push_str("}\n");
    src
}

/// Declares the launch's `alpha` and `beta` (`params[16..20]`) and `v`, in `acc`.
pub(crate) fn scale_lets(acc: DType) -> String {
    let at = compute_type(acc);
    format!(
        "  let alpha: {at} = {}; let beta: {at} = {};\n  var v: {at};\n",
        scalar_value(acc, "params[16]", "params[17]"),
        scalar_value(acc, "params[18]", "params[19]"),
    )
}

/// Stores `α·value + β·C` (C not read where β = 0) at output row `r`, column `c` of batch
/// `bz`, by the output's offset and strides (`params[6]`, `params[13..16]`); after
/// [`scale_lets`].
pub(crate) fn store_scaled(d: DType, acc: DType, value: &str, caps: Caps) -> String {
    let st = |w: usize| format!("bitcast<i32>(params[{w}])");
    let old = cast(&super::load_from(d, "b0", "co", true, caps), d, acc, false);
    format!(
        "      let co = u32(i32(params[6]) + i32(bz) * {} + i32(r) * {} + i32(c) * {});
      v = {};
      if (beta != {}) {{ v = {}; }}
      {}",
        st(13),
        st(14),
        st(15),
        mul(acc, "alpha", value),
        literal(acc, 0),
        arith(acc, "v", &mul(acc, "beta", &old)),
        // (A native f16 store rounds by itself: rounding twice cost the cooperative kernel 4%.)
        store(d, "b0", "co", &native_or_cast(d, acc, caps), caps),
    )
}

/// `v` as the value [`store`] takes for `d`: itself where the store rounds a native f16, else
/// cast to `d`.
fn native_or_cast(d: DType, acc: DType, caps: Caps) -> String {
    if d == DType::F16 && caps.f16 {
        "v".to_string()
    } else {
        cast("v", acc, d, false)
    }
}

/// `x + a·b` in `acc`: a fused multiply-add for f32 accumulators (one instruction, and the
/// contraction drivers may or may not make of `x + a * b`).
fn madd(acc: DType, x: &str, a: &str, b: &str) -> String {
    if compute_type(acc) == "f32" {
        format!("fma({a}, {b}, {x})")
    } else {
        arith(acc, x, &mul(acc, a, b))
    }
}

fn mul(acc: DType, a: &str, b: &str) -> String {
    match acc {
        DType::Bool => format!("({a} && {b})"),
        _ if acc.is_float() => format!("({a} * {b})"),
        _ => wrap(acc, &format!("({a} * {b})")),
    }
}

/// `x + p` in `acc` (`p` already in range: a product from [`mul`]).
fn arith(acc: DType, x: &str, p: &str) -> String {
    match acc {
        DType::Bool => format!("({x} || {p})"),
        _ if acc.is_float() => format!("({x} + {p})"),
        _ => wrap(acc, &format!("({x} + {p})")),
    }
}
