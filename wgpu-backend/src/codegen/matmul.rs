//! `Matmul`: a 64×64 output tile per workgroup of 256 invocations, each accumulating a 4×4 block
//! in registers from 16-deep slices of A and B staged in workgroup memory. Any strides (a batch
//! stride may be 0); every dtype, accumulating in the IR's `acc` (integers wrap).

use super::prelude::helpers;
use super::{
    binding, cast, compute_type, literal, load, scalar_value, store, wrap, Caps, ENTRY, PARAMS,
};
use std::collections::BTreeSet;
use std::fmt::Write;
use strata_core::DType;

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
    let mut src = String::from(PARAMS);
    src.push_str(&binding(0, d, true));
    src.push_str(&binding(1, d, false));
    src.push_str(&binding(2, d, false));
    src.push_str(&helpers(&BTreeSet::from([d, acc]), caps));
    let _ = writeln!(
        src,
        "var<workgroup> ta: array<{at}, 1024>;\nvar<workgroup> tb: array<{at}, 1024>;"
    );
    src.push_str(ENTRY);
    let st = |w: usize| format!("bitcast<i32>(params[{w}])");
    let _ = writeln!(
        src,
        "  let batch = params[0]; let m = params[1]; let k = params[2]; let n = params[3];
  let g = wg.y * nwg.x + wg.x;
  let tiles_n = (n + 63u) / 64u; let tiles_m = (m + 63u) / 64u;
  let bx = g % tiles_n; let by = (g / tiles_n) % tiles_m; let bz = g / (tiles_n * tiles_m);
  if (bz >= batch) {{ return; }}
  let tr = lid / 16u; let tc = lid % 16u;
  let abase = i32(params[4]) + i32(bz) * {sa0}; let bbase = i32(params[5]) + i32(bz) * {sb0};
  var accs: array<{at}, 16>;
  for (var i = 0u; i < 16u; i = i + 1u) {{ accs[i] = {zero}; }}
  for (var k0 = 0u; k0 < k; k0 = k0 + 16u) {{
    for (var j = 0u; j < 4u; j = j + 1u) {{
      let e = lid + 256u * j;
      let row = by * 64u + e / 16u; let kk = k0 + e % 16u;
      var va: {at} = {zero};
      if (row < m && kk < k) {{ va = {la}; }}
      ta[(e % 16u) * 64u + e / 16u] = va;
      let col = bx * 64u + e % 64u; let kb = k0 + e / 64u;
      var vb: {at} = {zero};
      if (col < n && kb < k) {{ vb = {lb}; }}
      tb[(e / 64u) * 64u + e % 64u] = vb;
    }}
    workgroupBarrier();
    for (var kk = 0u; kk < 16u; kk = kk + 1u) {{
      var af: array<{at}, 4>; var bf: array<{at}, 4>;
      for (var i = 0u; i < 4u; i = i + 1u) {{ af[i] = ta[kk * 64u + tr * 4u + i]; bf[i] = tb[kk * 64u + tc * 4u + i]; }}
      for (var i = 0u; i < 4u; i = i + 1u) {{
        for (var j = 0u; j < 4u; j = j + 1u) {{ accs[i * 4u + j] = {mac}; }}
      }}
    }}
    workgroupBarrier();
  }}
  let alpha: {at} = {alpha}; let beta: {at} = {beta};
  for (var i = 0u; i < 4u; i = i + 1u) {{
    for (var j = 0u; j < 4u; j = j + 1u) {{
      let r = by * 64u + tr * 4u + i; let c = bx * 64u + tc * 4u + j;
      if (r < m && c < n) {{
        let co = u32(i32(params[6]) + i32(bz) * {sc0} + i32(r) * {sc1} + i32(c) * {sc2});
        var v: {at} = {scaled};
        if (beta != {zero}) {{ v = {with_c}; }}
        {store}
      }}
    }}
  }}",
        sa0 = st(7),
        sb0 = st(10),
        sc0 = st(13),
        sc1 = st(14),
        sc2 = st(15),
        la = cast(
            &load(d, "b1", &format!("u32(abase + i32(row) * {} + i32(kk) * {})", st(8), st(9))),
            d,
            acc,
            false
        ),
        lb = cast(
            &load(d, "b2", &format!("u32(bbase + i32(kb) * {} + i32(col) * {})", st(11), st(12))),
            d,
            acc,
            false
        ),
        mac = arith(acc, "accs[i * 4u + j]", &mul(acc, "af[i]", "bf[j]")),
        alpha = scalar_value(acc, "params[16]", "params[17]"),
        beta = scalar_value(acc, "params[18]", "params[19]"),
        scaled = mul(acc, "alpha", "accs[i * 4u + j]"),
        with_c = arith(
            acc,
            "v",
            &mul(acc, "beta", &cast(&super::load_from(d, "b0", "co", true), d, acc, false))
        ),
        store = store(d, "b0", "co", &cast("v", acc, d, false)),
    );
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
