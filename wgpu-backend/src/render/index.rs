//! `Gather` and `Scatter`. A gather runs an invocation per output element, or, where every
//! index value selects a whole contiguous run (core's
//! [`index_plan::rows`](strata_core::lower::index_plan::rows): `index_select` along an outer
//! axis), an invocation per four elements of a run, moved as one word group (`vec4<u32>` for
//! 32-bit dtypes) with the run's index value read once. A scatter runs an invocation per
//! position of the other axes and walks the indexed axis in order, so two invocations never
//! write the same element (no atomics, and a repeated index keeps its last write) and
//! accumulation is deterministic.

use super::prelude::helpers;
use super::{binding, compute_type, load, load_from, round_to, store, wrap, Caps, ENTRY};
use std::collections::BTreeSet;
use std::fmt::Write;
use strata_core::ir::IndexKind;
use strata_core::DType;

/// The structure of an index launch. Bindings: 0 output, 1 index (i64), 2 source (gather) or
/// values (scatter), 3 a flagged gather's range flag.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct IndexSig {
    pub dtype: DType,
    pub rank: usize,
    pub axis: usize,
    pub kind: IndexKind,
    /// A gather with a range flag: negative index values count from the end of the source's
    /// axis (its extent in word 1), and one still outside it sets the flag.
    pub flagged: bool,
    /// The row path: a gather of whole runs, four elements (of at most 32 bits) a work item;
    /// `rank` is then unused. Words: see [`row_slots`].
    pub rows: bool,
}

impl strata_core::kernel_cache::Owned for IndexSig {}

/// Word positions: [0] invocations, [1] extent of the walked axis (scatter) or of the source's
/// indexed axis (a flagged gather), [2..5] offsets
/// of output, index and source, then the iteration shape, then strides of output, index and
/// source (rank words each).
pub(crate) fn slots(rank: usize) -> (usize, [usize; 3], usize) {
    let shape = 5;
    let s = shape + rank;
    (shape, [s, s + rank, s + 2 * rank], s + 3 * rank)
}

/// Word positions of the row path after the five shared ones ([0] work items, [1] the flagged
/// gather's extent, [2..5] offsets of output, index and source): runs along the axis, vectors
/// per run, then the outer and along-axis strides of the source, the index and the output.
/// Returns (count, vectors per run, strides of source, index, output, words).
pub(crate) fn row_slots() -> (usize, usize, [usize; 3], usize) {
    (5, 6, [7, 9, 11], 13)
}

/// The WGSL source of a row gather: work item `gid` copies four elements of run
/// `gid / per_run` (outer position `o`, position `j` along the axis).
fn rows_source(sig: &IndexSig, caps: Caps) -> String {
    let d = sig.dtype;
    let (count, per_run, [s, i, o], _) = row_slots();
    let word = match d.itemsize() {
        4 => "vec4<u32>",
        2 => "vec2<u32>",
        _ => "u32",
    };
    let mut src = super::header(caps);
    let _ = writeln!(
        src,
        "@group(0) @binding(1) var<storage, read_write> b0: array<{word}>;"
    );
    src.push_str(&binding(1, DType::I64, false, caps));
    let _ = writeln!(
        src,
        "@group(0) @binding(3) var<storage, read_write> b2: array<{word}>;"
    );
    if sig.flagged {
        src.push_str("@group(0) @binding(4) var<storage, read_write> b3: array<atomic<u32>>;\n");
    }
    src.push_str(ENTRY);
    let stride = |k: usize| format!("bitcast<i32>(params[{k}])");
    let _ = writeln!(
        src,
        "  if (gid >= params[0]) {{ return; }}\n  \
         let run = gid / params[{per_run}]; let e = i32((gid % params[{per_run}]) * 4u);\n  \
         let j = i32(run % params[{count}]); let o = i32(run / params[{count}]);\n  \
         let io = i32(params[3]) + o * {} + j * {};",
        stride(i),
        stride(i + 1)
    );
    let read = if sig.flagged {
        "var v = b1[u32(io)];\n  let extent = i64(params[1]);\n  \
         if (v < 0li) { v = v + extent; }\n  \
         if (v < 0li || v >= extent) { atomicStore(&b3[0], 1u); return; }\n  \
         let at = i32(v);"
    } else {
        "let at = i32(b1[u32(io)]);"
    };
    let _ = writeln!(
        src,
        "  {read}\n  \
         let so = i32(params[4]) + o * {} + at * {} + e;\n  \
         let oo = i32(params[2]) + o * {} + j * {} + e;\n  \
         b0[u32(oo) >> 2u] = b2[u32(so) >> 2u];\n}}",
        stride(s),
        stride(s + 1),
        stride(o),
        stride(o + 1)
    );
    src
}

/// The WGSL source of an index launch.
pub(crate) fn source(sig: &IndexSig, caps: Caps) -> String {
    if sig.rows {
        return rows_source(sig, caps);
    }
    let (shape, strides, _) = slots(sig.rank);
    let d = sig.dtype;
    let mut src = super::header(caps);
    src.push_str(&binding(0, d, true, caps));
    src.push_str(&binding(1, DType::I64, false, caps));
    src.push_str(&binding(2, d, false, caps));
    if sig.flagged {
        src.push_str("@group(0) @binding(4) var<storage, read_write> b3: array<atomic<u32>>;\n");
    }
    src.push_str(&helpers(&BTreeSet::from([d]), caps));
    src.push_str(ENTRY);
    src.push_str("  if (gid >= params[0]) { return; }\n");
    src.push_str("  var o0 = i32(params[2]); var o1 = i32(params[3]); var o2 = i32(params[4]);\n  var rem = gid;\n");
    // A scatter's iteration shape has extent 1 on the walked axis.
    for dim in (0..sig.rank).rev() {
        let _ = writeln!(
            src,
            "  {{ let c = rem % params[{s}]; rem = rem / params[{s}]; \
             o0 = o0 + i32(c) * bitcast<i32>(params[{}]); o1 = o1 + i32(c) * bitcast<i32>(params[{}]); \
             o2 = o2 + i32(c) * bitcast<i32>(params[{}]); }}",
            strides[0] + dim,
            strides[1] + dim,
            strides[2] + dim,
            s = shape + dim
        );
    }
    let ax = sig.axis;
    match sig.kind {
        IndexKind::Gather => {
            // The source offset walks the axis by the index value instead of the coordinate.
            let read = if sig.flagged {
                "var j = b1[u32(o1)];\n  let extent = i64(params[1]);\n  \
                 if (j < 0li) { j = j + extent; }\n  \
                 if (j < 0li || j >= extent) { atomicStore(&b3[0], 1u); return; }"
            } else {
                "let j = b1[u32(o1)];"
            };
            let _ = writeln!(
                src,
                "  let c = (gid / {below}) % params[{s}];\n  {read}\n  \
                 let so = o2 - i32(c) * bitcast<i32>(params[{st}]) + i32(j) * bitcast<i32>(params[{st}]);\n  {}",
                store(d, "b0", "u32(o0)", &load(d, "b2", "u32(so)", caps), caps),
                below = below(sig.rank, ax, shape),
                s = shape + ax,
                st = strides[2] + ax
            );
        }
        scatter => {
            let _ = writeln!(
                src,
                "  for (var t = 0u; t < params[1]; t = t + 1u) {{\n    \
                 let io = o1 + i32(t) * bitcast<i32>(params[{}]);\n    \
                 let vo = o2 + i32(t) * bitcast<i32>(params[{}]);\n    \
                 let dst = u32(o0 + i32(b1[u32(io)]) * bitcast<i32>(params[{}]));\n    \
                 let v: {} = {};",
                strides[1] + ax,
                strides[2] + ax,
                strides[0] + ax,
                compute_type(d),
                load(d, "b2", "u32(vo)", caps)
            );
            let value = if scatter == IndexKind::ScatterAdd {
                let old = load_from(d, "b0", "dst", true, caps);
                match d {
                    DType::Bool => format!("({old} || v)"),
                    _ if d.is_float() => round_to(d, format!("({old} + v)")),
                    _ => wrap(d, &format!("({old} + v)")),
                }
            } else {
                "v".to_string()
            };
            // The new value is computed before the store: a packed store clears its bits
            // first, and an accumulation that read the old value inside it would read zero.
            let _ = writeln!(
                src,
                "    let nv: {} = {value};\n    {}\n  }}",
                compute_type(d),
                store(d, "b0", "dst", "nv", caps)
            );
        }
    }
    src.push_str("}\n");
    src
}

/// A WGSL expression for the number of iteration positions below axis `ax` (the product of
/// the inner extents).
fn below(rank: usize, ax: usize, shape: usize) -> String {
    let mut e = "1u".to_string();
    for d in ax + 1..rank {
        e = format!("{e} * params[{}]", shape + d);
    }
    format!("({e})")
}
