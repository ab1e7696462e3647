//! `Reduce` kernels. An output is reduced by one invocation (short extents) or by a workgroup of
//! 256 (a strided loop, then a tree in workgroup memory). Long extents with few outputs are cut
//! into `params[5]` equal ranges of the reduced positions inside one launch (so a full sum
//! fills the GPU), and inputs larger than a storage binding into windows along the first
//! reduced axis, one launch each: every range writes a partial result (and, for
//! argmin/argmax, its position), and a second launch combines the partials. Along a contiguous
//! axis of a 32-bit dtype (or rows of one, each whole vectors) the elements come four a
//! `vec4<u32>` load, a vector's offset decoded once; a fused map's values of one per output
//! are read and computed once, before the loop.

use super::prelude::{dtypes_of, helpers};
use super::{binding, cast, compute_type, literal, load, round_to, scalar_value, store, wrap};
use super::{vector_binding, Caps, ENTRY};
use std::collections::BTreeSet;
use std::fmt::Write;
use strata_core::ir::ReduceOp;
use strata_core::lower::operands::ReduceMap;
use strata_core::lower::row_values::hoist;
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
    /// 4: the input and the map's inputs laid out like it (32-bit dtypes) are read four
    /// elements a `vec4<u32>` load (core's plan: a contiguous innermost reduced axis, rows and
    /// ranges starting on whole vectors); 1: element by element.
    pub vector: usize,
}

impl strata_core::kernel_cache::Owned for ReduceSig {}

/// Slots in `params`: [0] outputs, [1] reduced count, [2] position base, [3] input offset,
/// [4] output offset, [5] ranges per output within the launch (1 unless writing partials),
/// [6] positions per range (the plan's chunk: a multiple of the vector or of a row), then
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
    let outer_shape = 7;
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

/// Where [`element`] finds its values: at its own offset (decoded from position `r`), or in
/// lane `l` of the vector words `w{v}_{k}` that [`vector_loads`] declared for vector `v`
/// (position `r + l`).
#[derive(Clone, Copy)]
enum Read {
    Element,
    Lane { v: usize, l: usize },
}

/// Whether input `k` of the map (0: the reduction's input) is laid out like the input: read
/// at the element's offset (in vectors on the vector path).
fn alike(sig: &ReduceSig, k: usize) -> bool {
    sig.map
        .as_ref()
        .is_none_or(|m| !m.per_output[k] && !m.per_position[k])
}

/// The binding and offset base (a `params` word, none for the input) of map input `k`.
fn source_of(w: &Slots, more: usize, k: usize) -> (String, Option<usize>) {
    if k == 0 {
        ("b1".into(), None)
    } else {
        (format!("b{}", more + k - 1), Some(w.map_base + k - 1))
    }
}

/// The `u32` index of an element `off` (an `i32`) of map input `k`, from its base.
fn index_of(base: Option<usize>, off: &str) -> String {
    match base {
        Some(b) => format!("u32({off} + bitcast<i32>(params[{b}]))"),
        None => format!("u32({off})"),
    }
}

/// Declares `off{j}`, the input's offset of reduced position `r` (from the output's `ib`).
fn offset_of(sig: &ReduceSig, w: &Slots, r: &str, j: &str, src: &mut String) {
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
}

/// The vector path: decodes vector `q`'s offset `off{j}` (its first position `4q`) and loads
/// the words `w{j}_{k}` of the input and of every map input laid out like it.
fn vector_loads(sig: &ReduceSig, w: &Slots, more: usize, q: &str, j: usize, src: &mut String) {
    offset_of(sig, w, &format!("({q}) * 4u"), &j.to_string(), src);
    let off = format!("off{j}");
    let inputs = sig.map.as_ref().map_or(1, |m| m.inputs.len());
    for k in (0..inputs).filter(|&k| alike(sig, k)) {
        let (b, base) = source_of(w, more, k);
        let idx = index_of(base, &off);
        let _ = writeln!(src, "    let w{j}_{k} = {b}[{idx} >> 2u];");
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
    j: &str,
    read: Read,
    next: &mut usize,
    caps: Caps,
    src: &mut String,
) -> Result<()> {
    const LANES: [&str; 4] = ["x", "y", "z", "w"];
    let off = format!("off{j}");
    if let Read::Element = read {
        offset_of(sig, w, r, j, src);
    }
    // The position along the reduced axes from the whole reduction's first (as arg ops count).
    let position = match read {
        Read::Element => format!("(params[2] + {r})"),
        Read::Lane { l, .. } => format!("(params[2] + {r} + {l}u)"),
    };
    // Input k's value where it is laid out like the input.
    let value_of = |k: usize, d: DType| {
        let (b, base) = source_of(w, more, k);
        match read {
            Read::Lane { v, l } => scalar_value(d, &format!("w{v}_{k}.{}", LANES[l]), "0u"),
            // A vector binding read one element: its word, then the element's lane.
            Read::Element if sig.vector == 4 => {
                let i = index_of(base, &off);
                scalar_value(d, &format!("{b}[{i} >> 2u][{i} & 3u]"), "0u")
            }
            Read::Element => load(d, &b, &index_of(base, &off), caps),
        }
    };
    let at = compute_type(sig.acc);
    if let Some(m) = &sig.map {
        // The map's values in a block of their own, so unrolled elements reuse the names.
        // (`mv`: the tree's own `let`s are named `v…`.)
        let _ = writeln!(
            src,
            "    var mv{j}: {at};\n    {{\n      let x0 = {};",
            value_of(0, sig.input)
        );
        // (Inputs of one value per output are read once, before the loop: see `source`.)
        for (k, &d) in m.inputs.iter().enumerate().skip(1) {
            // One value per position in a row: at the element's position.
            let x = match (m.per_output[k], m.per_position[k]) {
                (true, _) => continue,
                (false, true) => load(
                    d,
                    &source_of(w, more, k).0,
                    &index_of(Some(w.map_base + k - 1), &format!("i32{position}")),
                    caps,
                ),
                (false, false) => value_of(k, d),
            };
            let _ = writeln!(src, "      let x{k} = {x};");
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
            load(sig.input, "b1", &format!("u32({off})"), caps)
        } else {
            cast(&value_of(0, sig.input), sig.input, sig.acc, false)
        };
        let _ = writeln!(src, "    let v{j}: {at} = {v};");
    }
    let pos = match idx_in {
        Some(s) => format!("b{s}[u32(off{j})]"),
        None => position,
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
    let vector = sig.vector == 4;
    if vector {
        src.push_str(&vector_binding(1, "u32"));
    } else {
        src.push_str(&binding(1, sig.input, false, caps));
    }
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
        if vector && alike(sig, k) {
            src.push_str(&vector_binding(more + k - 1, "u32"));
        } else {
            src.push_str(&binding(more + k - 1, d, false, caps));
        }
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
    // A map's values held once per output, read once (the driver cannot hoist a storage
    // load out of the loop by itself: `b0` is writable).
    for (k, &d) in sig.map.iter().flat_map(|m| {
        let per_output = &m.per_output;
        m.inputs
            .iter()
            .enumerate()
            .skip(1)
            .filter(move |&(k, _)| per_output[k])
    }) {
        let (b, base) = source_of(&w, more, k);
        let _ = writeln!(
            src,
            "  let x{k} = {};",
            load(d, &b, &index_of(base, "pb"), caps)
        );
    }
    let mut next = 0;
    // And the map's values of one per output (a layer norm's mean, `s / n`), as inputs past
    // the map's: the elements read them.
    let hoisted = match &sig.map {
        Some(m) => {
            let per_output = |k: usize| m.per_output.get(k) == Some(&true);
            let (expr, values) = hoist(&m.expr, &per_output, m.inputs.len());
            for (i, v) in values.iter().enumerate() {
                let mut body = String::new();
                let name = super::expr::emit_tree(v, &mut body, &mut next, caps)?;
                src.push_str(&body);
                let _ = writeln!(src, "  let x{} = {name};", m.inputs.len() + i);
            }
            let map = Some(ReduceMap { expr, ..m.clone() });
            ReduceSig { map, ..sig.clone() }
        }
        None => sig.clone(),
    };
    let sig = &hoisted;
    let _ = writeln!(
        src,
        "  var acc: {at} = {};\n  var best = 0u;\n  var has = false;",
        identity(sig.op, sig.acc)
    );
    src.push_str(
        "  let chunk = params[6];\n  let lo = k * chunk;\n  let hi = min(params[1], lo + chunk);\n",
    );
    let fold_all = |src: &mut String, names: &[String]| {
        for j in names {
            let _ = writeln!(
                src,
                "    {}",
                fold(sig.op, sig.acc, &format!("v{j}"), &format!("pos{j}"))
            );
        }
    };
    let tail_from = if vector {
        // Vectors: worker lane `tid` takes vectors q, q + step, ... of the range (ranges and
        // rows start on whole vectors), two at a time, loads first; then the range's last
        // elements (fewer than four, along a single contiguous axis) one by one.
        src.push_str(
            "  let hv = lo + ((hi - lo) & ~3u);\n  let qe = hv >> 2u;\n  var q = (lo >> 2u) + tid;\n\
             for (; q + step < qe; q = q + 2u * step) {\n",
        );
        let mut names = Vec::new();
        for (v, q) in [(0, "q"), (1, "q + step")] {
            vector_loads(sig, &w, more, q, v, &mut src);
            for l in 0..4 {
                let name = format!("{v}_{l}");
                let r = format!("({q}) * 4u");
                let read = Read::Lane { v, l };
                element(
                    sig, &w, idx_in, more, &r, &name, read, &mut next, caps, &mut src,
                )?;
                names.push(name);
            }
        }
        fold_all(&mut src, &names);
        src.push_str("  }\n  if (q < qe) {\n");
        vector_loads(sig, &w, more, "q", 0, &mut src);
        let mut names = Vec::new();
        for l in 0..4 {
            let name = format!("0_{l}");
            let read = Read::Lane { v: 0, l };
            element(
                sig, &w, idx_in, more, "q * 4u", &name, read, &mut next, caps, &mut src,
            )?;
            names.push(name);
        }
        fold_all(&mut src, &names);
        src.push_str("  }\n");
        "hv + tid"
    } else {
        // Each worker folds positions r, r + step, ... in order. Four at a time, loads first:
        // the same folds in the same order, with four loads in flight instead of one (a full
        // sum was bound by the memory requests a worker had outstanding).
        src.push_str(
            "  var r = lo + tid;\n  for (; r < hi && hi - r > 3u * step; r = r + 4u * step) {\n",
        );
        let mut names = Vec::new();
        for j in 0..4 {
            let r = format!("r + {j}u * step");
            let name = j.to_string();
            element(
                sig,
                &w,
                idx_in,
                more,
                &r,
                &name,
                Read::Element,
                &mut next,
                caps,
                &mut src,
            )?;
            names.push(name);
        }
        fold_all(&mut src, &names);
        src.push_str("  }\n");
        "r"
    };
    let _ = writeln!(src, "  for (var e = {tail_from}; e < hi; e = e + step) {{");
    element(
        sig,
        &w,
        idx_in,
        more,
        "e",
        "0",
        Read::Element,
        &mut next,
        caps,
        &mut src,
    )?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use strata_core::ir::{BinaryOp, Expr, Node};

    fn sum(reduced_rank: usize, vector: usize, map: Option<ReduceMap>) -> ReduceSig {
        ReduceSig {
            op: ReduceOp::Sum,
            acc: DType::F32,
            input: DType::F32,
            out: DType::F32,
            outer_rank: 1,
            reduced_rank,
            group: 256,
            combine: false,
            partial: false,
            map,
            vector,
        }
    }

    #[test]
    fn vectors_load_words_and_decode_once_per_vector() {
        let kernel = |sig: &ReduceSig| {
            let src = source(sig, Caps::default()).unwrap();
            src[src.find("@compute").unwrap()..].to_string()
        };
        // Along one axis: two vectors a turn and one more, then the tail element by element,
        // with no division anywhere.
        let row = kernel(&sum(1, 4, None));
        assert_eq!(row.matches("= b1[u32(off0) >> 2u];").count(), 2, "{row}");
        assert_eq!(row.matches("= b1[u32(off1) >> 2u];").count(), 1, "{row}");
        assert_eq!(row.matches("bitcast<f32>(w0_0.w)").count(), 2, "{row}");
        assert!(row.contains("[u32(off0) & 3u]"), "the tail's lane: {row}");
        // (The one division: the worker's output and range, `u % params[0]`.)
        assert_eq!(row.matches(" % params").count(), 1, "{row}");
        // Rows of two axes: a row's coordinate once per vector (three), and once per element
        // of the tail loop; element by element, once per element (four unrolled and the tail).
        let rows = kernel(&sum(2, 4, None));
        assert_eq!(rows.matches(" % params").count(), 1 + 4, "{rows}");
        assert_eq!(kernel(&sum(2, 1, None)).matches(" % params").count(), 1 + 5);
        // A fused map's input laid out alike comes in vectors too; one value per output does not.
        let x = |k| Box::new(Expr::input(k, DType::F32));
        let map = ReduceMap {
            expr: Expr {
                dtype: DType::F32,
                node: Node::Binary(BinaryOp::Mul, x(0), x(2)),
            },
            inputs: vec![DType::F32; 3],
            per_output: vec![false, false, true],
            per_position: vec![false; 3],
            scalars: vec![],
        };
        let fused = source(&sum(1, 4, Some(map)), Caps::default()).unwrap();
        assert!(fused.contains("b2: array<vec4<u32>>;"), "{fused}");
        assert!(fused.contains("b3: array<u32>;"), "{fused}");
        assert_eq!(fused.matches("let w1_1 = b2[").count(), 1, "{fused}");
    }

    #[test]
    fn a_maps_values_of_one_per_output_are_computed_once() {
        // `(x0 − x1 / s0)²` summed, x1 one value per output: the division once, before the
        // loop, on both paths (nine elements and eight lanes are folded in the loops).
        let x = |k| Expr::input(k, DType::F32);
        let centred = Expr {
            dtype: DType::F32,
            node: Node::Binary(
                BinaryOp::Sub,
                Box::new(x(0)),
                Box::new(Expr {
                    dtype: DType::F32,
                    node: Node::Binary(
                        BinaryOp::Div,
                        Box::new(x(1)),
                        Box::new(Expr::scalar(0, DType::F32)),
                    ),
                }),
            ),
        };
        let map = ReduceMap {
            expr: Expr {
                dtype: DType::F32,
                node: Node::Binary(BinaryOp::Mul, Box::new(centred.clone()), Box::new(centred)),
            },
            inputs: vec![DType::F32; 2],
            per_output: vec![false, true],
            per_position: vec![false; 2],
            scalars: vec![DType::F32],
        };
        for vector in [1, 4] {
            let src = source(&sum(1, vector, Some(map.clone())), Caps::default()).unwrap();
            let kernel = &src[src.find("@compute").unwrap()..];
            assert_eq!(kernel.matches("div_f32(").count(), 1, "{kernel}");
            assert_eq!(kernel.matches("let x1 = ").count(), 1, "{kernel}");
        }
    }
}
