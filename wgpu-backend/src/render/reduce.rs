//! `Reduce` kernels. An output is reduced by one invocation (short extents) or by a workgroup of
//! 256 (a strided loop, then a tree in workgroup memory). Long extents with few outputs are cut
//! into `params[5]` equal ranges of the reduced positions inside one launch (so a full sum
//! fills the GPU), and inputs larger than a storage binding into windows along the first
//! reduced axis, one launch each: every range writes a partial result (and, for
//! argmin/argmax, its position), and a second launch combines the partials.

use super::prelude::{dtypes_of, helpers};
use super::{binding, cast, compute_type, literal, load, round_to, store, wrap, Caps, ENTRY};
use std::collections::BTreeSet;
use std::fmt::Write;
use strata_core::ir::ReduceOp;
use strata_core::lower::operands::ReduceMap;
use strata_core::{DType, Result};

/// The structure of a reduce launch.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct ReduceSig {
    pub op: ReduceOp,
    pub acc: DType,
    /// The dtype read (the input's, or `acc` when combining partials).
    pub input: DType,
    /// The dtype written (the output's, or `acc` for partials).
    pub out: DType,
    pub outer_rank: usize,
    pub reduced_rank: usize,
    /// Invocations per output (or range of it): 256, a workgroup, or 1.
    pub group: usize,
    /// Reads partials (values and, for arg ops, positions) instead of elements.
    pub combine: bool,
    /// Writes partials (values and, for arg ops, positions).
    pub partial: bool,
    /// Map→reduce fusion: each element is this map over the inputs.
    pub map: Option<ReduceMap>,
}

impl strata_core::kernel_cache::Owned for ReduceSig {}

/// Slots in `params`: [0] outputs, [1] reduced count, [2] position base, [3] input offset,
/// [4] output offset, [5] ranges per output within the launch (1 unless writing partials), then
/// outer shape, reduced shape, input outer strides, output outer strides, input reduced
/// strides; for a fused map, each further input's base offset, the outer strides of inputs
/// with one value per output (the output's), and two words per scalar.
pub(crate) struct Slots {
    pub outer_shape: usize,
    pub reduced_shape: usize,
    pub in_outer: usize,
    pub out_outer: usize,
    pub in_reduced: usize,
    pub map_base: usize,
    pub map_outer: usize,
    pub scalars: usize,
    pub len: usize,
}

pub(crate) fn slots(ro: usize, rr: usize, map: Option<&ReduceMap>) -> Slots {
    let outer_shape = 6;
    let reduced_shape = outer_shape + ro;
    let in_outer = reduced_shape + rr;
    let out_outer = in_outer + ro;
    let in_reduced = out_outer + ro;
    let map_base = in_reduced + rr;
    let (more, scalars) = map.map_or((0, 0), |m| (m.inputs.len() - 1, m.scalars.len()));
    let map_outer = map_base + more;
    let scalar_words = map_outer + if more > 0 { ro } else { 0 };
    Slots {
        outer_shape,
        reduced_shape,
        in_outer,
        out_outer,
        in_reduced,
        map_base,
        map_outer,
        scalars: scalar_words,
        len: scalar_words + 2 * scalars,
    }
}

/// The number of tensor bindings of a launch with `sig`.
pub(crate) fn bindings(sig: &ReduceSig) -> usize {
    let arg = sig.op.returns_index();
    let more = sig.map.as_ref().map_or(0, |m| m.inputs.len() - 1);
    2 + usize::from(arg && sig.partial) + usize::from(arg && sig.combine) + more
}

/// The value a reduction of nothing starts from.
pub(crate) fn identity(op: ReduceOp, acc: DType) -> String {
    match op {
        ReduceOp::Prod | ReduceOp::All => literal(acc, 1),
        _ => literal(acc, 0),
    }
}

/// WGSL statements folding value `v` at position `i` into `(acc, best, has)`.
pub(crate) fn fold(op: ReduceOp, acc: DType, v: &str, i: &str) -> String {
    let nan = |x: &str| {
        if acc.is_float() {
            super::is_nan(acc, x)
        } else {
            "false".into()
        }
    };
    let upd = match op {
        ReduceOp::Sum => match acc {
            DType::Bool => format!("acc = acc || {v};"),
            _ if acc.is_float() => format!("acc = {};", round_to(acc, format!("acc + {v}"))),
            _ => format!("acc = {};", wrap(acc, &format!("acc + {v}"))),
        },
        ReduceOp::Prod => match acc {
            DType::Bool => format!("acc = acc && {v};"),
            _ if acc.is_float() => format!("acc = {};", round_to(acc, format!("acc * {v}"))),
            _ => format!("acc = {};", wrap(acc, &format!("acc * {v}"))),
        },
        ReduceOp::Any => format!("acc = acc || ({} );", truthy(acc, v)),
        ReduceOp::All => format!("acc = acc && ({} );", truthy(acc, v)),
        ReduceOp::Min | ReduceOp::Max => {
            let f = if op == ReduceOp::Min { "min" } else { "max" };
            let pick = match acc {
                DType::Bool if op == ReduceOp::Min => format!("acc && {v}"),
                DType::Bool => format!("acc || {v}"),
                // -0 below +0 (IEEE 754-2019), so the order of the tree does not pick the zero.
                _ if acc.is_float() => format!("f{f}_{}(acc, {v})", compute_type(acc)),
                _ => format!("{f}(acc, {v})"),
            };
            format!(
                "if (!has || {}) {{ acc = {v}; }} else if (!{}) {{ acc = {pick}; }}",
                nan(v),
                nan("acc")
            )
        }
        ReduceOp::ArgMin | ReduceOp::ArgMax => {
            let cmp = if op == ReduceOp::ArgMin { "<" } else { ">" };
            let (a, b) = if acc == DType::Bool {
                (
                    "select(0u, 1u, acc)".to_string(),
                    format!("select(0u, 1u, {v})"),
                )
            } else {
                ("acc".to_string(), v.to_string())
            };
            format!(
                "{{ let an = {}; let bn = {}; var take = !has; \
                 if (has) {{ if (an) {{ take = bn && {i} < best; }} else if (bn) {{ take = true; }} \
                 else {{ take = {b} {cmp} {a} || ({b} == {a} && {i} < best); }} }} \
                 if (take) {{ acc = {v}; best = {i}; }} }}",
                nan("acc"),
                nan(v)
            )
        }
    };
    format!("{upd} has = true;")
}

/// Decodes counter `count` (a `u32` var) into coordinates over `rank` extents (from word
/// `shape` on), innermost first, and adds each coordinate times its stride to every
/// `(offset var, first stride word)` target. The outermost coordinate is what remains: no
/// division for it (one per element would bound a rank-1 reduction by division throughput).
pub(crate) fn decode(
    src: &mut String,
    indent: &str,
    count: &str,
    rank: usize,
    shape: usize,
    targets: &[(&str, usize)],
) {
    for d in (0..rank).rev() {
        let split = if d == 0 {
            format!("let c = {count};")
        } else {
            format!(
                "let c = {count} % params[{s}]; {count} = {count} / params[{s}];",
                s = shape + d
            )
        };
        let adds: Vec<String> = targets
            .iter()
            .map(|(v, st)| format!("{v} = {v} + i32(c) * bitcast<i32>(params[{}]);", st + d))
            .collect();
        let _ = writeln!(src, "{indent}{{ {split} {} }}", adds.join(" "));
    }
}

/// Declares `v{j}` (the value at reduced position `r`, as the accumulator's type) and `pos{j}`
/// (its position, for arg ops). A fused map reads its further inputs from bindings `more`.
#[allow(clippy::too_many_arguments)]
fn element(
    sig: &ReduceSig,
    w: &Slots,
    idx_in: Option<usize>,
    more: usize,
    r: &str,
    j: usize,
    next: &mut usize,
    caps: Caps,
    src: &mut String,
) -> Result<()> {
    let _ = writeln!(src, "    var off{j} = ib;\n    var rr{j} = {r};");
    let (rr, off) = (format!("rr{j}"), format!("off{j}"));
    decode(
        src,
        "    ",
        &rr,
        sig.reduced_rank,
        w.reduced_shape,
        &[(&off, w.in_reduced)],
    );
    let x = load(sig.input, "b1", &format!("u32(off{j})"), caps);
    let at = compute_type(sig.acc);
    if let Some(m) = &sig.map {
        // The map's values in a block of their own, so unrolled elements reuse the names.
        // (`mv`: the tree's own `let`s are named `v…`.)
        let _ = writeln!(src, "    var mv{j}: {at};\n    {{\n      let x0 = {x};");
        for (k, &d) in m.inputs.iter().enumerate().skip(1) {
            // One value per position in a row: at the element's position along the reduced
            // axes (from the whole reduction's first, as an arg op counts it).
            let at_k = match (m.per_output[k], m.per_position[k]) {
                (true, _) => "pb".to_string(),
                (false, true) => format!("i32(params[2] + {r})"),
                (false, false) => off.clone(),
            };
            let idx = format!("u32({at_k} + bitcast<i32>(params[{}]))", w.map_base + k - 1);
            let b = format!("b{}", more + k - 1);
            let _ = writeln!(src, "      let x{k} = {};", load(d, &b, &idx, caps));
        }
        let mut body = String::new();
        let value = super::expr::emit_tree(&m.expr, &mut body, next, caps)?;
        for line in body.lines() {
            let _ = writeln!(src, "    {line}");
        }
        let v = cast(&value, m.expr.dtype, sig.acc, false);
        let _ = writeln!(src, "      mv{j} = {v};\n    }}\n    let v{j} = mv{j};");
    } else {
        let v = if sig.combine {
            x
        } else {
            cast(&x, sig.input, sig.acc, false)
        };
        let _ = writeln!(src, "    let v{j}: {at} = {v};");
    }
    let pos = match idx_in {
        Some(s) => format!("b{s}[u32(off{j})]"),
        None => format!("(params[2] + {r})"),
    };
    let _ = writeln!(src, "    let pos{j} = {pos};");
    Ok(())
}

/// The workgroup arrays [`workgroup_tree`] combines through: values (`shv`), positions (`shi`)
/// and whether each holds one (`shh`). Bools cross workgroup memory as u32: NVIDIA's Vulkan
/// driver lost `all` over a workgroup-shared `array<bool>` (issue 15, item 6), and bool has
/// no memory layout.
pub(crate) fn workgroup_arrays(acc: DType) -> String {
    let sh_type = if acc == DType::Bool {
        "u32"
    } else {
        compute_type(acc)
    };
    format!(
        "var<workgroup> shv: array<{sh_type}, 256>;\nvar<workgroup> shi: array<u32, 256>;\nvar<workgroup> shh: array<u32, 256>;\n"
    )
}

/// Slot `i` of `shv` as a value of `acc`.
pub(crate) fn shared_value(acc: DType, i: &str) -> String {
    if acc == DType::Bool {
        format!("(shv[{i}] != 0u)")
    } else {
        format!("shv[{i}]")
    }
}

/// WGSL statements combining every invocation's `(acc, best, has)` of the workgroup (`lid`
/// 0..256) into slot 0 of [`workgroup_arrays`], by [`fold`]; every invocation passes its last
/// barrier.
pub(crate) fn workgroup_tree(op: ReduceOp, acc: DType, indent: &str) -> String {
    let put = if acc == DType::Bool {
        "select(0u, 1u, acc)"
    } else {
        "acc"
    };
    format!(
        "{indent}shv[lid] = {put}; shi[lid] = best; shh[lid] = select(0u, 1u, has);\n{indent}workgroupBarrier();\n\
         {indent}for (var s = 128u; s > 0u; s = s >> 1u) {{\n{indent}  if (lid < s) {{\n\
         {indent}    acc = {}; best = shi[lid]; has = shh[lid] != 0u;\n\
         {indent}    if (shh[lid + s] != 0u) {{ let v = {}; let pos = shi[lid + s]; {} }}\n\
         {indent}    shv[lid] = {put}; shi[lid] = best; shh[lid] = select(0u, 1u, has);\n\
         {indent}  }}\n{indent}  workgroupBarrier();\n{indent}}}\n",
        shared_value(acc, "lid"),
        shared_value(acc, "lid + s"),
        fold(op, acc, "v", "pos")
    )
}

fn truthy(d: DType, v: &str) -> String {
    super::ne_zero(d, v)
}

/// The WGSL source of a reduce launch (`Err` for a fused map the adapter cannot compute).
pub(crate) fn source(sig: &ReduceSig, caps: Caps) -> Result<String> {
    let w = slots(sig.outer_rank, sig.reduced_rank, sig.map.as_ref());
    let at = compute_type(sig.acc);
    let arg = sig.op.returns_index();
    let mut used = BTreeSet::from([sig.acc, sig.input, sig.out]);
    if arg {
        used.insert(DType::U32);
    }
    if let Some(m) = &sig.map {
        dtypes_of(&m.expr, &mut used);
        used.extend(m.inputs.iter().chain(&m.scalars).copied());
    }
    let mut src = super::header(caps);
    src.push_str(&binding(0, sig.out, true, caps));
    src.push_str(&binding(1, sig.input, false, caps));
    let mut slot = 2;
    let idx_out = (arg && sig.partial).then(|| {
        let s = slot;
        slot += 1;
        src.push_str(&binding(s, DType::U32, false, caps));
        s
    });
    let idx_in = (arg && sig.combine).then(|| {
        let s = slot;
        slot += 1;
        src.push_str(&binding(s, DType::U32, false, caps));
        s
    });
    // A fused map's further inputs follow.
    let more = slot;
    for (k, &d) in sig
        .map
        .iter()
        .flat_map(|m| m.inputs.iter().enumerate().skip(1))
    {
        src.push_str(&binding(more + k - 1, d, false, caps));
    }
    src.push_str(&helpers(&used, caps));
    if sig.group > 1 {
        src.push_str(&workgroup_arrays(sig.acc));
    }
    src.push_str(ENTRY);
    // Worker `u` reduces range `k` of output `o`.
    if sig.group > 1 {
        src.push_str("  let u = wg.y * nwg.x + wg.x;\n  let tid = lid;\n  let step = 256u;\n");
    } else {
        src.push_str("  let u = gid;\n  let tid = 0u;\n  let step = 1u;\n");
    }
    // Neighbouring workers take neighbouring outputs (then the next range of each): along an
    // outer axis their reads are neighbours in memory, where range-major order would put
    // `chunk` rows between them.
    src.push_str("  let ks = params[5];\n  let o = u % params[0];\n  let k = u / params[0];\n");
    src.push_str("  if (k >= ks) { return; }\n");
    // Outer coordinates → input base and output offset.
    let _ = writeln!(
        src,
        "  var ib = i32(params[3]);\n  var ob = i32(params[4]);\n  var rem = o;"
    );
    let mut targets = vec![("ib", w.in_outer), ("ob", w.out_outer)];
    if let Some(m) = &sig.map {
        super::scalar_lets(&m.scalars, w.scalars, caps, &mut src);
        if m.per_output.iter().any(|&p| p) {
            // Inputs with one value per output: at the output's position, as if unsplit.
            src.push_str("  var pb = 0;\n");
            targets.push(("pb", w.map_outer));
        }
    }
    decode(
        &mut src,
        "  ",
        "rem",
        sig.outer_rank,
        w.outer_shape,
        &targets,
    );
    let _ = writeln!(
        src,
        "  var acc: {at} = {};\n  var best = 0u;\n  var has = false;",
        identity(sig.op, sig.acc)
    );
    // Each worker folds positions r, r + step, ... in order. Four at a time, loads first:
    // the same folds in the same order, with four loads in flight instead of one (a full sum
    // was bound by the memory requests a worker had outstanding).
    src.push_str(
        "  let chunk = (params[1] + ks - 1u) / ks;\n  let hi = min(params[1], k * chunk + chunk);\n\
         var r = k * chunk + tid;\n  for (; r < hi && hi - r > 3u * step; r = r + 4u * step) {\n",
    );
    let mut next = 0;
    for j in 0..4 {
        element(
            sig,
            &w,
            idx_in,
            more,
            &format!("r + {j}u * step"),
            j,
            &mut next,
            caps,
            &mut src,
        )?;
    }
    for j in 0..4 {
        let _ = writeln!(
            src,
            "    {}",
            fold(sig.op, sig.acc, &format!("v{j}"), &format!("pos{j}"))
        );
    }
    src.push_str("  }\n  for (; r < hi; r = r + step) {\n");
    element(sig, &w, idx_in, more, "r", 0, &mut next, caps, &mut src)?;
    let _ = writeln!(src, "    {}\n  }}", fold(sig.op, sig.acc, "v0", "pos0"));
    if sig.group > 1 {
        src.push_str(&workgroup_tree(sig.op, sig.acc, "  "));
        src.push_str("  if (lid != 0u) { return; }\n");
        let _ = writeln!(
            src,
            "  acc = {}; best = shi[0];",
            shared_value(sig.acc, "0")
        );
    }
    if sig.partial {
        let _ = writeln!(
            src,
            "  {}",
            store(sig.out, "b0", "u32(ob) + k", "acc", caps)
        );
        if let Some(s) = idx_out {
            let _ = writeln!(src, "  b{s}[u32(ob) + k] = best;");
        }
    } else if arg {
        let _ = writeln!(
            src,
            "  {}",
            store(sig.out, "b0", "u32(ob)", "bitcast<i64>(u64(best))", caps)
        );
    } else {
        let out = cast("acc", sig.acc, sig.out, false);
        let _ = writeln!(src, "  {}", store(sig.out, "b0", "u32(ob)", &out, caps));
    }
    src.push_str("}\n");
    Ok(src)
}
