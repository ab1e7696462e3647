//! `Matmul` of f16 on cooperative matrices (NVIDIA's tensor cores through Vulkan's
//! `VK_KHR_cooperative_matrix`, wgpu's experimental `wgpu_cooperative_matrix`): a 128×128 output
//! tile per workgroup of 256 invocations, eight subgroups of 32, each owning a 32×64 part of the
//! tile as 2×4 accumulators of 16×16 f32.
//!
//! Every `depth` steps the workgroup stages a 128×depth slice of A and a depth×128 slice of B in
//! workgroup memory (elements past the matrix edges as zeros, so any size and any strides work);
//! each subgroup then loads its fragments from there (rows padded by 8 halves: 16-byte aligned,
//! and the rows fall in different banks) and multiplies. An invocation's loads of the next
//! slice are issued before the multiplications of this one and stored after them, so the
//! memory's latency hides behind the tensor cores' work. The products of f16 values are exact
//! and accumulate at f32 precision, in the hardware's order (which may truncate within one
//! multiply-add). At the end each
//! subgroup writes one accumulator at a time to its own 16×16 f32 scratch, and its invocations
//! read it back to apply α and β, round once to f16 and store with the output's strides and
//! bounds.
//!
//! Where A runs along its depth and B along its columns in aligned runs of 8 (`vectors`: unit
//! strides there, other strides, offsets, k and n multiples of 8), A and B are bound as
//! `vec4<u32>` words and staged 8 halves a load, 64 deep; otherwise one half a load, 16 deep.
//!
//! Used where [`Caps::coop_f16`] says the adapter has it; the launch is the tiled kernel's
//! (same tile, same parameters: [`super::matmul::PARAM_WORDS`]), bindings 0 C, 1 A, 2 B.

use super::matmul::{scale_lets, store_scaled};
use super::prelude::helpers;
use super::{binding, vector_binding, Caps};
use std::collections::BTreeSet;
use std::fmt::Write;
use strata_core::DType;

/// The output tile's side (the tiled kernel's too: one launch shape for both).
pub(crate) const TILE: usize = 128;
/// Depth of the slices staged per step, by 16-byte loads and one half a load. Measured through
/// NVIDIA's Vulkan driver (H200, 8192³): by 16-byte loads 7.06 / 9.49 / 5.92 ms at depths
/// 16 / 32 / 64; one half a load 9.64 / 15.6 / 17.9 ms.
const DEPTH_VECTORS: usize = 64;
const DEPTH_ELEMENTS: usize = 16;
/// Row stride (halves) of the staged B slice: padded by 8.
const ROW_B: usize = TILE + 8;
/// Workgroup memory the kernel uses at most, in bytes (the adapter must allow it): 43 KiB.
pub(crate) const WORKGROUP_BYTES: u32 =
    ((TILE * (DEPTH_VECTORS + 8) + DEPTH_VECTORS * ROW_B) * 2 + 8 * 256 * 4) as u32;

/// How a slice reaches workgroup memory: `setup` once, `loads` of the slice at depth `kl` into
/// registers, then `stores` of those registers.
struct Staging {
    setup: String,
    loads: String,
    stores: String,
}

/// The WGSL source of an f16 matmul on cooperative matrices (f32 accumulation); `vectors`:
/// A and B staged by 16-byte loads (see the module's notes for when the planner may ask).
pub(crate) fn source(caps: Caps, vectors: bool) -> String {
    let depth = if vectors {
        DEPTH_VECTORS
    } else {
        DEPTH_ELEMENTS
    };
    let row_a = depth + 8;
    let (d, acc) = (DType::F16, DType::F32);
    let st = |w: usize| format!("bitcast<i32>(params[{w}])");
    let mut src = String::from("enable f16;\nenable wgpu_cooperative_matrix;\n");
    src.push_str("@group(0) @binding(0) var<storage, read> params: array<u32>;\n");
    src.push_str(&binding(0, d, true, caps));
    for slot in 1..3 {
        if vectors {
            src.push_str(&vector_binding(slot, "u32"));
        } else {
            src.push_str(&binding(slot, d, false, caps));
        }
    }
    let _ = writeln!(
        src,
        "var<workgroup> ta: array<f16, {}>;
var<workgroup> tb: array<f16, {}>;
var<workgroup> tc: array<f32, {}>;",
        TILE * row_a,
        depth * ROW_B,
        8 * 256
    );
    src.push_str(&helpers(&BTreeSet::from([d, acc]), caps));
    let _ = writeln!(
        src,
        "@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32, @builtin(subgroup_id) sg: u32,
        @builtin(subgroup_invocation_id) sl: u32) {{
  let batch = params[0]; let m = params[1]; let k = params[2]; let n = params[3];
  let g = wg.y * nwg.x + wg.x;
  let tiles_n = (n + {t1}u) / {t}u; let tiles_m = (m + {t1}u) / {t}u;
  let bx = g % tiles_n; let by = (g / tiles_n) % tiles_m; let bz = g / (tiles_n * tiles_m);
  if (bz >= batch) {{ return; }}
  let sa1 = {sa1}; let sa2 = {sa2}; let sb1 = {sb1}; let sb2 = {sb2};
  let fa = (32u * (sg / 2u)) * {row_a}u; let fb = 64u * (sg % 2u);",
        t = TILE,
        t1 = TILE - 1,
        sa1 = st(8),
        sa2 = st(9),
        sb1 = st(11),
        sb2 = st(12),
    );
    for i in 0..2 {
        for j in 0..4 {
            let _ = writeln!(src, "  var c{i}_{j} = coop_mat16x16<f32, C>();");
        }
    }
    let staging = if vectors {
        stage_vectors(depth)
    } else {
        stage_elements(depth)
    };
    src.push_str(&staging.setup);
    src.push_str("  var kl = 0u;\n");
    src.push_str(&staging.loads);
    let _ = writeln!(src, "  for (var k0 = 0u; k0 < k; k0 = k0 + {depth}u) {{");
    src.push_str(&staging.stores);
    src.push_str("    workgroupBarrier();\n");
    let _ = writeln!(src, "    kl = k0 + {depth}u;");
    src.push_str(&staging.loads);
    for kk in 0..depth / 16 {
        src.push_str("    {\n");
        for i in 0..2 {
            let _ = writeln!(
                src,
                "      let a{i} = coopLoadT<coop_mat16x16<f16, A>>(&ta[fa + {}u], {row_a}u);",
                16 * i * row_a + 16 * kk
            );
        }
        for j in 0..4 {
            let _ = writeln!(
                src,
                "      let b{j} = coopLoadT<coop_mat16x16<f16, B>>(&tb[{}u + fb], {ROW_B}u);",
                16 * kk * ROW_B + 16 * j
            );
        }
        for i in 0..2 {
            for j in 0..4 {
                let _ = writeln!(
                    src,
                    "      c{i}_{j} = coopMultiplyAdd(a{i}, b{j}, c{i}_{j});"
                );
            }
        }
        src.push_str("    }\n");
    }
    src.push_str("    workgroupBarrier();\n  }\n");
    // The epilogue: one accumulator at a time through this subgroup's scratch.
    src.push_str(&scale_lets(acc));
    src.push_str("  let base = sg * 256u;\n");
    for i in 0..2 {
        for j in 0..4 {
            let _ = writeln!(
                src,
                "  coopStoreT(c{i}_{j}, &tc[base], 16u);
  workgroupBarrier();
  for (var e = sl; e < 256u; e = e + 32u) {{
    let r = by * {TILE}u + 32u * (sg / 2u) + {ri}u + e / 16u;
    let c = bx * {TILE}u + fb + {cj}u + e % 16u;
    if (r < m && c < n) {{
{}
    }}
  }}
  workgroupBarrier();",
                store_scaled(d, acc, "tc[base + e]", caps),
                ri = 16 * i,
                cj = 16 * j,
            );
        }
    }
    src.push_str("}\n");
    src
}

/// One half a load: value q of A is row `arow + (256/depth)·q` at depth `akk`, of B depth
/// `bkb + 2q` in column `bcol`.
fn stage_elements(depth: usize) -> Staging {
    let (row_a, staged) = (depth + 8, TILE * depth / 256);
    let mut setup = format!(
        "  let akk = lid % {depth}u; let arow = lid / {depth}u;
  let bcol = lid % {TILE}u; let bkb = lid / {TILE}u;
  let aoff = i32(params[4]) + i32(bz) * bitcast<i32>(params[7]) + i32(by * {TILE}u + arow) * sa1 + i32(akk) * sa2;
  let boff = i32(params[5]) + i32(bz) * bitcast<i32>(params[10]) + i32(bkb) * sb1 + i32(bx * {TILE}u + bcol) * sb2;\n"
    );
    let (mut loads, mut stores) = (String::new(), String::new());
    for q in 0..staged {
        let (row, deeper) = (256 / depth * q, 256 / TILE * q);
        let _ = writeln!(setup, "  var ra{q}: f16; var rb{q}: f16;");
        let _ = writeln!(
            loads,
            "    ra{q} = 0.0h; if (by * {TILE}u + arow + {row}u < m && kl + akk < k) {{ \
             ra{q} = b1[u32(aoff + {row} * sa1 + i32(kl) * sa2)]; }}
    rb{q} = 0.0h; if (bx * {TILE}u + bcol < n && kl + bkb + {deeper}u < k) {{ \
             rb{q} = b2[u32(boff + i32(kl + {deeper}u) * sb1)]; }}"
        );
        let _ = writeln!(
            stores,
            "    ta[(arow + {row}u) * {row_a}u + akk] = ra{q}; \
             tb[(bkb + {deeper}u) * {ROW_B}u + bcol] = rb{q};"
        );
    }
    Staging {
        setup,
        loads,
        stores,
    }
}

/// 8 halves a load (unit strides along A's depth and B's columns; everything else a multiple
/// of 8, so a run of 8 is wholly inside or outside the matrix): load q of A is row
/// `arow + rows·q`, depths `8·ac..8·ac+7`; of B depth `bkb + 16q`, columns `8·bc..8·bc+7`.
fn stage_vectors(depth: usize) -> Staging {
    let row_a = depth + 8;
    let per = TILE * depth / 8 / 256;
    let (a_rows, b_depths) = (256 / (depth / 8), 256 / (TILE / 8));
    let mut setup = format!(
        "  let ac = lid % {ac}u; let arow = lid / {ac}u;
  let bc = lid % {bcs}u; let bkb = lid / {bcs}u;
  let aoff = i32(params[4]) + i32(bz) * bitcast<i32>(params[7]) + i32(by * {TILE}u + arow) * sa1 + 8 * i32(ac);
  let boff = i32(params[5]) + i32(bz) * bitcast<i32>(params[10]) + i32(bkb) * sb1 + i32(bx * {TILE}u + 8u * bc);\n",
        ac = depth / 8,
        bcs = TILE / 8,
    );
    let (mut loads, mut stores) = (String::new(), String::new());
    for q in 0..per {
        let (row, deeper) = (a_rows * q, b_depths * q);
        let _ = writeln!(setup, "  var ra{q}: vec4<u32>; var rb{q}: vec4<u32>;");
        let _ = writeln!(
            loads,
            "    ra{q} = vec4<u32>(); if (by * {TILE}u + arow + {row}u < m && kl + 8u * ac < k) {{ \
             ra{q} = b1[u32(aoff + {row} * sa1 + i32(kl)) / 8u]; }}
    rb{q} = vec4<u32>(); if (bx * {TILE}u + 8u * bc < n && kl + bkb + {deeper}u < k) {{ \
             rb{q} = b2[u32(boff + i32(kl + {deeper}u) * sb1) / 8u]; }}"
        );
        let (a0, b0) = (
            format!("(arow + {row}u) * {row_a}u + 8u * ac"),
            format!("(bkb + {deeper}u) * {ROW_B}u + 8u * bc"),
        );
        for (name, slice, at) in [("ra", "ta", a0), ("rb", "tb", b0)] {
            let _ = writeln!(stores, "    {{ let o = {at};");
            for (w, c) in ["x", "y", "z", "w"].iter().enumerate() {
                let _ = writeln!(
                    stores,
                    "      let h{w} = vec2<f16>(unpack2x16float({name}{q}.{c})); \
                     {slice}[o + {}u] = h{w}.x; {slice}[o + {}u] = h{w}.y;",
                    2 * w,
                    2 * w + 1
                );
            }
            stores.push_str("    }\n");
        }
    }
    Staging {
        setup,
        loads,
        stores,
    }
}
