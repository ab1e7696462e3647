//! `Matmul`: a 128×128 output tile per workgroup of 256 invocations, each accumulating an 8×8
//! block in registers from 16-deep slices of A and B staged in workgroup memory.
//!
//! What made it fast on an H100 through Vulkan (13.7 → 33 TFLOP/s at 4096³, measured with
//! standalone variants of this kernel): every invocation first loads all 16 of its staged values
//! into registers and only then stores them (loads in flight together, not one at a time); the
//! rows of the A slice are padded by one vector so that its transposing stores do not collide
//! in one memory bank; the 16 depth steps are written out (no loop, constant offsets); operand
//! offsets are computed once and stepped.
//!
//! Since then, for f32 through NVIDIA's Vulkan driver (H200, 8192³: 33.2 → 26.2 ms, 33 → 42
//! TFLOP/s; with B transposed 44.9 → 26.3 ms): an operand that runs along its depth or along
//! its side of the tile in aligned runs of 4 is staged by 16-byte loads ([`Staged`]: 31.2 ms,
//! and B transposed no longer loads one column a lane); the next slice's loads are issued
//! before this slice's multiplications (with 32-bit accumulators: 27.8 ms); and a subgroup of
//! 32 is 4×8 invocations of the 16×16 grid, not 2×16 (26.2 ms: its vector reads of the slices
//! touch 4 rows and 8 columns, not 2 and 16; 8×4 is as fast). Slices 8 or 32 deep (29.0, 27.9
//! ms) and two workgroup buffers with one barrier a slice (32.4 ms; 30.6 with constant
//! offsets) were slower.
//!
//! With 32-bit accumulators the slices are arrays of vec4s and an invocation owns rows
//! `4tr..4tr+3` and `64+4tr..64+4tr+3` (columns likewise), so one depth step reads its A and B
//! values in four vector loads; otherwise rows `tr + 16i` and columns `tc + 16j`, read one by
//! one. The accumulators are named variables, never a dynamically indexed array, so they stay
//! in registers. Any strides (a batch stride may be 0); every dtype, accumulating in the IR's
//! `acc` (integers wrap).

use super::prelude::helpers;
use super::{
    binding, cast, compute_type, literal, load, scalar_value, store, vector_binding, wrap, Caps,
    ENTRY,
};
use std::collections::BTreeSet;
use std::fmt::Write;
use strata_core::DType;

/// The output tile's side.
pub(crate) const TILE: usize = 128;
/// Per invocation: an 8×8 block of the tile.
const PER: usize = 8;

/// The structure of a matmul launch.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct MatmulSig {
    pub dtype: DType,
    pub acc: DType,
    /// On cooperative matrices ([`super::coop_matmul`]; f16 accumulating in f32 only).
    pub coop: bool,
    /// How A and B reach workgroup memory. The cooperative kernel takes A along its depth
    /// and B along its tile's columns by 16-byte loads, or both by elements; the tiled kernel
    /// any pair, for f32.
    pub staged: [Staged; 2],
}

/// How an operand's slices are staged: an element a load, or by 16-byte loads of the runs
/// along its depth or along its side of the output tile (A's rows, B's columns), where the
/// planner found the operand running that way (unit stride, runs aligned and wholly inside
/// or outside the matrix).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Staged {
    Elements,
    AlongDepth,
    AlongTile,
}

impl strata_core::kernel_cache::Owned for MatmulSig {}

/// Words: [0] batch, [1] m, [2] k, [3] n, [4..7] offsets of A, B, C, [7..10] strides of A
/// (batch, row, col), [10..13] of B, [13..16] of C, [16, 17] α, [18, 19] β.
pub(crate) const PARAM_WORDS: usize = 20;

/// The depth of the staged slices of A and B.
const DEPTH: usize = 16;

/// How a slice reaches workgroup memory: `setup` once, `loads` of the slice at depth `kl`
/// into registers, then `stores` of those registers.
#[derive(Default)]
struct Staging {
    setup: String,
    loads: String,
    stores: String,
}

/// The WGSL source of a matmul launch on tiles (bindings: 0 C, 1 A, 2 B); a `coop` signature
/// is [`super::coop_matmul`]'s.
pub(crate) fn source(sig: &MatmulSig, caps: Caps) -> String {
    let (d, acc) = (sig.dtype, sig.acc);
    let at = compute_type(acc);
    let zero = literal(acc, 0);
    let st = |w: usize| format!("bitcast<i32>(params[{w}])");
    // 32-bit accumulators are staged as vec4s: an invocation then reads its 8 values of A and
    // of B for one depth step in 4 loads rather than 16. A row of the A slice is one vector
    // (or one element) longer than the tile, so the stores that transpose A spread over banks.
    let v4 = matches!(acc, DType::F32 | DType::I32 | DType::U32);
    // (The planner stages by 16-byte loads only f32 operands accumulating in f32.)
    let staged = sig.staged;
    // 32-bit accumulators leave registers for the next slice's loads (64-bit ones were not
    // measured that way).
    let prefetch = v4;
    let mut src = super::header(caps);
    src.push_str(&binding(0, d, true, caps));
    for slot in 1..3 {
        if staged[slot - 1] != Staged::Elements {
            src.push_str(&vector_binding(slot, "f32"));
        } else {
            src.push_str(&binding(slot, d, false, caps));
        }
    }
    src.push_str(&helpers(&BTreeSet::from([d, acc]), caps));
    // B's rows are padded too where it is staged along its depth (transposing stores).
    let pad_b = usize::from(staged[1] == Staged::AlongDepth);
    let (row_a, row_b) = if v4 {
        (TILE / 4 + 1, TILE / 4 + pad_b)
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
  let tr = (lid / 64u) * 4u + (lid % 32u) / 8u; let tc = ((lid / 32u) % 2u) * 8u + lid % 8u;
  let sa1 = {sa1}; let sa2 = {sa2}; let sb1 = {sb1}; let sb2 = {sb2};
  let abase = i32(params[4]) + i32(bz) * {sa0} + i32(by * {t}u) * sa1;
  let bbase = i32(params[5]) + i32(bz) * {sb0} + i32(bx * {t}u) * sb2;",
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
    let mut staging = Staging::default();
    for part in [
        stage(&Side::a(row_a), d, acc, v4, staged[0], caps),
        stage(&Side::b(row_b), d, acc, v4, staged[1], caps),
    ] {
        staging.setup.push_str(&part.setup);
        staging.loads.push_str(&part.loads);
        staging.stores.push_str(&part.stores);
    }
    src.push_str(&staging.setup);
    src.push_str("  var kl = 0u;\n");
    if prefetch {
        src.push_str(&staging.loads);
    }
    let _ = writeln!(src, "  for (var k0 = 0u; k0 < k; k0 = k0 + {DEPTH}u) {{");
    // All loads first, then all stores: the loads are in flight together. With `prefetch` the
    // next slice's loads are issued before this slice's multiplications.
    if prefetch {
        src.push_str(&staging.stores);
        src.push_str("    workgroupBarrier();\n");
        let _ = writeln!(src, "    kl = k0 + {DEPTH}u;");
        src.push_str(&staging.loads);
    } else {
        src.push_str("    kl = k0;\n");
        src.push_str(&staging.loads);
        src.push_str(&staging.stores);
        src.push_str("    workgroupBarrier();\n");
    }
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

/// One operand as the staging code names it: A's side of the tile is its rows (tile index
/// `by`, bound `m`), B's its columns (`bx`, `n`).
struct Side {
    /// Its binding and its slice in workgroup memory.
    buf: &'static str,
    slice: &'static str,
    /// Names of the staged registers, of the invocation's position along the tile and along
    /// the depth, and of its element offset.
    reg: &'static str,
    along: &'static str,
    deep: &'static str,
    off: &'static str,
    /// The tile's index and bound along this side, the operand's base offset, and its
    /// strides along the tile and along the depth.
    tile: &'static str,
    bound: &'static str,
    base: &'static str,
    s_tile: &'static str,
    s_depth: &'static str,
    /// One element a load: consecutive invocations step along the depth (A, which usually
    /// runs that way) or along the tile (B).
    depth_first: bool,
    /// The slice's row stride, in its elements.
    row: usize,
}

impl Side {
    fn a(row: usize) -> Side {
        Side {
            buf: "b1",
            slice: "ta",
            reg: "ra",
            along: "ar",
            deep: "ak",
            off: "aoff",
            tile: "by",
            bound: "m",
            base: "abase",
            s_tile: "sa1",
            s_depth: "sa2",
            depth_first: true,
            row,
        }
    }

    fn b(row: usize) -> Side {
        Side {
            buf: "b2",
            slice: "tb",
            reg: "rb",
            along: "bc",
            deep: "bk",
            off: "boff",
            tile: "bx",
            bound: "n",
            base: "bbase",
            s_tile: "sb2",
            s_depth: "sb1",
            depth_first: false,
            row,
        }
    }
}

/// Staging of one operand's slice (`TILE` positions along its side × `DEPTH`) into its
/// workgroup slice (depth-major: row `kk` holds the tile's positions at depth `kk`).
/// - One element a load: value `q` is at tile position `t + (256/DEPTH)·q`, depth `kl + k`
///   (`depth_first`), or at tile position `t`, depth `kl + k + 2q`.
/// - By 16-byte loads along the tile: vector `q` is positions `4t .. 4t + 3` at depth
///   `kl + k + 8q`, stored whole.
/// - By 16-byte loads along the depth: vector `q` is position `t + (1024/DEPTH)·q` at depths
///   `kl + 4k .. + 3`, its values stored to four slice rows.
fn stage(side: &Side, d: DType, acc: DType, v4: bool, staged: Staged, caps: Caps) -> Staging {
    let Side {
        buf,
        slice,
        reg,
        along: t,
        deep: k,
        off,
        tile,
        bound,
        base,
        s_tile,
        s_depth,
        depth_first,
        row,
    } = *side;
    let mut s = Staging::default();
    // The slice element of tile position `pos` at depth `kk` (both WGSL expressions).
    let put = |kk: &str, pos: &str| {
        if v4 {
            format!("{slice}[({kk}) * {row}u + ({pos}) / 4u][({pos}) % 4u]")
        } else {
            format!("{slice}[({kk}) * {row}u + {pos}]")
        }
    };
    match staged {
        Staged::AlongTile => {
            let _ = writeln!(
                s.setup,
                "  let {t} = lid % 32u; let {k} = lid / 32u;
  let {off} = {base} + 4 * i32({t}) + i32({k}) * {s_depth};"
            );
            for q in 0..DEPTH / 8 {
                let deeper = 8 * q;
                let _ = writeln!(s.setup, "  var {reg}{q}: vec4<f32>;");
                let _ = writeln!(
                    s.loads,
                    "    {reg}{q} = vec4<f32>(); if ({tile} * {TILE}u + 4u * {t} < {bound} && kl + {k} + {deeper}u < k) {{ \
                     {reg}{q} = {buf}[u32({off} + i32(kl + {deeper}u) * {s_depth}) / 4u]; }}"
                );
                let _ = writeln!(
                    s.stores,
                    "    {slice}[({k} + {deeper}u) * {row}u + {t}] = {reg}{q};"
                );
            }
        }
        Staged::AlongDepth => {
            let (lanes, step) = (DEPTH / 4, 1024 / DEPTH);
            let _ = writeln!(
                s.setup,
                "  let {k} = lid % {lanes}u; let {t} = lid / {lanes}u;
  let {off} = {base} + i32({t}) * {s_tile} + 4 * i32({k});"
            );
            for q in 0..DEPTH / 8 {
                let pos = step * q;
                let _ = writeln!(s.setup, "  var {reg}{q}: vec4<f32>;");
                let _ = writeln!(
                    s.loads,
                    "    {reg}{q} = vec4<f32>(); if ({tile} * {TILE}u + {t} + {pos}u < {bound} && kl + 4u * {k} < k) {{ \
                     {reg}{q} = {buf}[u32({off} + {pos} * {s_tile} + i32(kl)) / 4u]; }}"
                );
                for (c, comp) in ["x", "y", "z", "w"].iter().enumerate() {
                    let at = put(&format!("4u * {k} + {c}u"), &format!("{t} + {pos}u"));
                    let _ = writeln!(s.stores, "    {at} = {reg}{q}.{comp};");
                }
            }
        }
        Staged::Elements => {
            let at = compute_type(acc);
            let zero = literal(acc, 0);
            let (lanes, step, deeper) = if depth_first {
                (DEPTH, 256 / DEPTH, 0)
            } else {
                (TILE, 0, 256 / TILE)
            };
            let (first, second) = if depth_first { (k, t) } else { (t, k) };
            let _ = writeln!(
                s.setup,
                "  let {first} = lid % {lanes}u; let {second} = lid / {lanes}u;
  let {off} = {base} + i32({t}) * {s_tile} + i32({k}) * {s_depth};"
            );
            for q in 0..TILE * DEPTH / 256 {
                let (pos, dq) = (step * q, deeper * q);
                // (Along the tile, position t + pos at depth kl + k; else t at kl + k + dq.)
                let (at_pos, at_depth, index) = if depth_first {
                    (
                        format!("{t} + {pos}u"),
                        k.to_string(),
                        format!("u32({off} + {pos} * {s_tile} + i32(kl) * {s_depth})"),
                    )
                } else {
                    (
                        t.to_string(),
                        format!("{k} + {dq}u"),
                        format!("u32({off} + i32(kl + {dq}u) * {s_depth})"),
                    )
                };
                let _ = writeln!(s.setup, "  var {reg}{q}: {at};");
                let v = cast(&load(d, buf, &index, caps), d, acc, false);
                let _ = writeln!(
                    s.loads,
                    "    {reg}{q} = {zero}; if ({tile} * {TILE}u + {at_pos} < {bound} && kl + {at_depth} < k) {{ {reg}{q} = {v}; }}"
                );
                let _ = writeln!(s.stores, "    {} = {reg}{q};", put(&at_depth, &at_pos));
            }
        }
    }
    s
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
