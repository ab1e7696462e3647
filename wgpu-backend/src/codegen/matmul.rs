//! `Matmul`: a 128×128 output tile per workgroup of 256 invocations, each accumulating an 8×8
//! block in registers from 16-deep slices of A and B staged in workgroup memory. With 32-bit
//! accumulators the slices are arrays of vec4s and an invocation owns rows `4tr..4tr+3` and
//! `64+4tr..64+4tr+3` (columns likewise), so one depth step reads its A and B values in four
//! vector loads; otherwise rows `tr + 16i` and columns `tc + 16j`, read one by one (free of
//! bank conflicts either way). The
//! accumulators are named variables, never a dynamically indexed array, so they stay in
//! registers. Any strides (a batch stride may be 0); every dtype, accumulating in the IR's
//! `acc` (integers wrap).

use super::prelude::helpers;
use super::{
    binding, cast, compute_type, literal, load, scalar_value, store, wrap, Caps, ENTRY, PARAMS,
};
use std::collections::BTreeSet;
use std::fmt::Write;
use strata_core::DType;

/// The output tile's side.
pub(crate) const TILE: usize = 128;
/// Per invocation: an 8×8 block of the tile.
const PER: usize = 8;
/// The depth of the staged slices of A and B.
const DEPTH: usize = 16;

/// The structure of a matmul launch.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct MatmulSig {
    pub dtype: DType,
    pub acc: DType,
}

/// Words: [0] batch, [1] m, [2] k, [3] n, [4..7] offsets of A, B, C, [7..10] strides of A
/// (batch, row, col), [10..13] of B, [13..16] of C, [16, 17] α, [18, 19] β.
pub(crate) const WORDS: usize = 20;

/// The WGSL source of a matmul launch (bindings: 0 C, 1 A, 2 B).
pub(crate) fn source(sig: &MatmulSig, caps: Caps) -> String {
    let (d, acc) = (sig.dtype, sig.acc);
    let at = compute_type(acc);
    let zero = literal(acc, 0);
    let st = |w: usize| format!("bitcast<i32>(params[{w}])");
    let mut src = String::from(PARAMS);
    src.push_str(&binding(0, d, true));
    src.push_str(&binding(1, d, false));
    src.push_str(&binding(2, d, false));
    src.push_str(&helpers(&BTreeSet::from([d, acc]), caps));
    let slice = TILE * DEPTH;
    // 32-bit accumulators are staged as vec4s: an invocation then reads its 8 values of A and
    // of B for one depth step in 4 loads rather than 16 (the loads from workgroup memory, not
    // the multiply-adds, bounded the scalar form).
    let v4 = matches!(acc, DType::F32 | DType::I32 | DType::U32);
    if v4 {
        let _ = writeln!(
            src,
            "var<workgroup> ta: array<vec4<{at}>, {q}>;\nvar<workgroup> tb: array<vec4<{at}>, {q}>;",
            q = slice / 4
        );
    } else {
        let _ = writeln!(
            src,
            "var<workgroup> ta: array<{at}, {slice}>;\nvar<workgroup> tb: array<{at}, {slice}>;"
        );
    }
    // Where the staged element `i` of a slice goes.
    let staged = |t: &str, i: &str| {
        if v4 {
            format!("{t}[({i}) / 4u][({i}) % 4u]")
        } else {
            format!("{t}[{i}]")
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
  let abase = i32(params[4]) + i32(bz) * {sa0}; let bbase = i32(params[5]) + i32(bz) * {sb0};",
        t = TILE,
        t1 = TILE - 1,
        sa0 = st(7),
        sb0 = st(10),
    );
    for i in 0..PER {
        for j in 0..PER {
            let _ = writeln!(src, "  var c{i}_{j}: {at} = {zero};");
        }
    }
    let la = cast(
        &load(
            d,
            "b1",
            &format!("u32(abase + i32(row) * {} + i32(kk) * {})", st(8), st(9)),
        ),
        d,
        acc,
        false,
    );
    let lb = cast(
        &load(
            d,
            "b2",
            &format!("u32(bbase + i32(kb) * {} + i32(col) * {})", st(11), st(12)),
        ),
        d,
        acc,
        false,
    );
    // Each invocation stages TILE*DEPTH/256 elements of each slice.
    let _ = writeln!(
        src,
        "  for (var k0 = 0u; k0 < k; k0 = k0 + {DEPTH}u) {{
    for (var q = 0u; q < {per_inv}u; q = q + 1u) {{
      let e = lid + 256u * q;
      let row = by * {TILE}u + e / {DEPTH}u; let kk = k0 + e % {DEPTH}u;
      var va: {at} = {zero};
      if (row < m && kk < k) {{ va = {la}; }}
      {put_a} = va;
      let col = bx * {TILE}u + e % {TILE}u; let kb = k0 + e / {TILE}u;
      var vb: {at} = {zero};
      if (col < n && kb < k) {{ vb = {lb}; }}
      {put_b} = vb;
    }}
    workgroupBarrier();
    for (var kk = 0u; kk < {DEPTH}u; kk = kk + 1u) {{",
        per_inv = slice / 256,
        put_a = staged("ta", &format!("(e % {DEPTH}u) * {TILE}u + e / {DEPTH}u")),
        put_b = staged("tb", "e"),
    );
    if v4 {
        let q = TILE / 4;
        let _ = writeln!(
            src,
            "      let al = ta[kk * {q}u + tr]; let ah = ta[kk * {q}u + 16u + tr];
      let bl = tb[kk * {q}u + tc]; let bh = tb[kk * {q}u + 16u + tc];"
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
        for i in 0..PER {
            let _ = writeln!(
                src,
                "      let a{i} = ta[kk * {TILE}u + {}];",
                lane("tr", i)
            );
        }
        for j in 0..PER {
            let _ = writeln!(
                src,
                "      let b{j} = tb[kk * {TILE}u + {}];",
                lane("tc", j)
            );
        }
    }
    for i in 0..PER {
        for j in 0..PER {
            let c = format!("c{i}_{j}");
            let _ = writeln!(
                src,
                "      {c} = {};",
                arith(acc, &c, &mul(acc, &format!("a{i}"), &format!("b{j}")))
            );
        }
    }
    src.push_str("    }\n    workgroupBarrier();\n  }\n");
    let _ = writeln!(
        src,
        "  let alpha: {at} = {}; let beta: {at} = {};\n  var v: {at};",
        scalar_value(acc, "params[16]", "params[17]"),
        scalar_value(acc, "params[18]", "params[19]"),
    );
    let with_c = arith(
        acc,
        "v",
        &mul(
            acc,
            "beta",
            &cast(&super::load_from(d, "b0", "co", true), d, acc, false),
        ),
    );
    let put = store(d, "b0", "co", &cast("v", acc, d, false));
    for i in 0..PER {
        for j in 0..PER {
            let _ = writeln!(
                src,
                "  {{ let r = by * {TILE}u + {ri}; let c = bx * {TILE}u + {cj};
    if (r < m && c < n) {{
      let co = u32(i32(params[6]) + i32(bz) * {sc0} + i32(r) * {sc1} + i32(c) * {sc2});
      v = {scaled};
      if (beta != {zero}) {{ v = {with_c}; }}
      {put}
    }} }}",
                ri = lane("tr", i),
                cj = lane("tc", j),
                sc0 = st(13),
                sc1 = st(14),
                sc2 = st(15),
                scaled = mul(acc, "alpha", &format!("c{i}_{j}")),
            );
        }
    }
    src.push_str("}\n");
    src
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
