//! A reduction with a row prologue ([`RowPrologue`](strata_core::ir::RowPrologue)) and
//! optionally a row epilogue ([`RowEpilogue`](strata_core::ir::RowEpilogue)) in one dispatch:
//! softmax from its primitives, `e / e.sum(-1, true)` after `e = (x - x.max(-1, true)).exp()`,
//! reads each row once and writes it once. A workgroup of 256 takes a row, each invocation
//! keeping its elements of input 0 in registers (`e{j}`, written out as separate variables
//! as the softmax kernel does; up to [`MAX_CACHED`], a row of 16,384): it folds the prologue
//! over them and writes it, computes each element's map value (the term) and folds the
//! reduction over the terms, writes the result, and then the epilogue over the same
//! registers. Where the epilogue reads the map's value itself (`exp(x - m) / s` holds
//! `exp(x - m)`), the terms are kept (`t{j}`) instead of computed again. Values of one a row
//! in the map and the epilogue (a layer norm's `s / n`, `rsqrt(v / n + eps)`) are computed
//! once a row, before the elements. The sums' order (the reduction's, and a sum prologue's: a
//! layer norm's mean) is the workgroup's, not the eager launches' (wgpu's fused and eager
//! results may differ in the last bits of a sum, as its map→reduce fusion's do).
//!
//! A division of the epilogue by the reduction's result (softmax's `t / s`) takes the row's
//! correctly rounded reciprocal once and corrects each quotient to the correctly rounded one
//! by Markstein's two fused multiply-adds, where the adapter's `fma` is fused and it has f64
//! (for that one reciprocal) — the same numbers as an f32 division computed in f64 an element,
//! which bounded the kernel. A row whose `s` lies outside `[1, 2^60]` (where an intermediate
//! could leave the normal range; softmax's sums lie within) takes the division.

use super::prelude::{dtypes_of, helpers};
use super::reduce::{decode, fold, identity, shared_value, workgroup_arrays, workgroup_tree};
use super::softmax::{fold_extremum, Combine, MAX_CACHED};
use super::{binding, cast, compute_type, load, round_to, scalar_lets, store, Caps, ENTRY};
use std::collections::BTreeSet;
use std::fmt::Write;
use strata_core::ir::{BinaryOp, Expr, Node, ReduceOp};
use strata_core::lower::operands::ReduceMap;
use strata_core::lower::row_values::hoist;
use strata_core::{DType, Error, Result};

/// Invocations a row: one workgroup.
pub(crate) const GROUP: usize = 256;

/// The longest row staged: [`MAX_CACHED`] elements an invocation.
pub(crate) const MAX_ROW: usize = GROUP * MAX_CACHED;

/// The structure of a staged reduction.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct StagedSig {
    /// The reduction over the map's values (never one returning a position).
    pub op: ReduceOp,
    pub acc: DType,
    /// The reduction's output dtype.
    pub out: DType,
    /// Leading axes decoded per row.
    pub outer_rank: usize,
    /// The element reduced: the map over input 0 (the rows, a float dtype) and the others.
    pub map: ReduceMap,
    /// The prologue: max or min of input 0, written in input 0's dtype, read by the map as
    /// input `result`.
    pub prologue: StagedPrologue,
    pub epilogue: Option<StagedEpilogue>,
    /// Elements each invocation keeps (a power of two, its share of the row rounded up).
    pub cached: usize,
    /// Input 0 read, and the epilogue's f32 output written, in 16-byte vectors (`cached` ≥ 4):
    /// f32 rows contiguous and starting on a vector, whole vectors. Invocation `lid` keeps
    /// vectors `lid + j·GROUP`.
    pub vector: bool,
    /// Every kept slot is inside the row (`GROUP · cached` elements exactly): no bounds tests.
    pub full: bool,
}

impl strata_core::kernel_cache::Owned for StagedSig {}

/// The prologue of a staged reduction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct StagedPrologue {
    /// Max, min or (a layer norm's mean) sum.
    pub op: ReduceOp,
    /// The map input that reads it.
    pub result: usize,
}

/// The epilogue of a staged reduction: its expression over the map's inputs, the input that
/// reads the reduction's result, and the dtype it writes (laid out like input 0).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct StagedEpilogue {
    pub expr: Expr,
    pub result: usize,
    pub out: DType,
}

/// Slots in `params`: [0] rows, [1] elements a row, [2] input 0's first element, [3] its
/// stride along the row, [4] the output's first element, [5] the prologue's, [6] the
/// epilogue's; then the outer shape, input 0's outer strides, the output's outer strides (the
/// prologue's and every input holding one value per row too), each further input's first
/// element (by input, from input 1; the results' unused), and two words per scalar.
pub(crate) struct Slots {
    pub outer_shape: usize,
    pub in_outer: usize,
    pub out_outer: usize,
    pub bases: usize,
    pub scalars: usize,
    pub len: usize,
}

pub(crate) fn slots(sig: &StagedSig) -> Slots {
    let ro = sig.outer_rank;
    let outer_shape = 7;
    let in_outer = outer_shape + ro;
    let out_outer = in_outer + ro;
    let bases = out_outer + ro;
    let scalars = bases + sig.map.inputs.len() - 1;
    Slots {
        outer_shape,
        in_outer,
        out_outer,
        bases,
        scalars,
        len: scalars + 2 * sig.map.scalars.len(),
    }
}

/// The further inputs bound (all but the results, which the kernel holds itself), in
/// binding order after the outputs and input 0.
pub(crate) fn bound_inputs(sig: &StagedSig) -> Vec<usize> {
    let eres = sig.epilogue.as_ref().map(|e| e.result);
    (1..sig.map.inputs.len())
        .filter(|&k| k != sig.prologue.result && Some(k) != eres)
        .collect()
}

/// The number of tensor bindings: the output, input 0, the prologue's output, the
/// epilogue's, then the bound inputs.
pub(crate) fn bindings(sig: &StagedSig) -> usize {
    3 + usize::from(sig.epilogue.is_some()) + bound_inputs(sig).len()
}

/// WGSL declaring `pm`, the sum of the kept elements `e0..e{k}` within the row (each
/// invocation's in order, then the invocations' by subgroups or by a tree over `shp`): the
/// workgroup's order, not the eager launches' (the sum's last bits may differ from theirs).
fn prologue_sum(
    src: &mut String,
    ct: &str,
    k: usize,
    by_subgroups: bool,
    open: &dyn Fn(usize) -> String,
) {
    let _ = writeln!(src, "    var pm: {ct} = {ct}(0);");
    for j in 0..k {
        let _ = writeln!(src, "{} pm = pm + e{j}; }}", open(j));
    }
    if by_subgroups {
        // (In a block of its own: the reduction's sum declares the same names.)
        src.push_str("    {\n");
        src.push_str(&super::softmax::subgroup_sum("pm", "shp", None));
        src.push_str("    }\n");
    } else {
        let _ = writeln!(
            src,
            "    shp[lid] = pm;\n    workgroupBarrier();\n    \
             for (var s = 128u; s > 0u; s = s >> 1u) {{\n      \
             if (lid < s) {{ shp[lid] = shp[lid] + shp[lid + s]; }}\n      \
             workgroupBarrier();\n    }}\n    pm = workgroupUniformLoad(&shp[0]);"
        );
    }
}

/// The WGSL source of a staged reduction.
pub(crate) fn source(sig: &StagedSig, caps: Caps) -> Result<String> {
    let m = &sig.map;
    let d = m.inputs[0];
    let (ct, k) = (compute_type(d), sig.cached);
    let sums = sig.prologue.op == ReduceOp::Sum;
    if !d.is_float() || sig.op.returns_index() || !(sig.prologue.op.is_order_free() || sums) {
        return Err(Error::Backend(
            "internal error: a staged reduction folds a float max, min or sum first".into(),
        ));
    }
    let w = slots(sig);
    let pres = sig.prologue.result;
    let mut used = BTreeSet::from([d, sig.acc, sig.out]);
    dtypes_of(&m.expr, &mut used);
    used.extend(m.inputs.iter().chain(&m.scalars).copied());
    if let Some(e) = &sig.epilogue {
        dtypes_of(&e.expr, &mut used);
        used.insert(e.out);
    }
    let (vector, full) = (sig.vector, sig.full);
    let mut src = super::header(caps);
    src.push_str(&binding(0, sig.out, true, caps));
    if vector {
        src.push_str(&super::vector_binding(1, "u32"));
    } else {
        src.push_str(&binding(1, d, false, caps));
    }
    src.push_str(&binding(2, d, true, caps));
    let mut slot_of = vec![usize::MAX; m.inputs.len()];
    let mut slot = 3;
    if let Some(e) = &sig.epilogue {
        if vector {
            src.push_str(&super::vector_binding(3, "u32"));
        } else {
            src.push_str(&binding(3, e.out, true, caps));
        }
        slot = 4;
    }
    for kk in bound_inputs(sig) {
        src.push_str(&binding(slot, m.inputs[kk], false, caps));
        slot_of[kk] = slot;
        slot += 1;
    }
    src.push_str(&helpers(&used, caps));
    let _ = writeln!(src, "var<workgroup> shp: array<{ct}, {GROUP}>;");
    src.push_str(&workgroup_arrays(sig.acc));
    // f32 rows combine their prologue and a sum by subgroups where the adapter has them (see
    // the softmax kernel).
    let by_subgroups = caps.subgroups && ct == "f32";
    let sum_by_subgroups = by_subgroups && sig.op == ReduceOp::Sum && sig.acc == DType::F32;
    if by_subgroups {
        src.push_str("var<workgroup> shn: array<u32, 256>;\nvar<workgroup> shr: f32;\n");
        src.push_str(&super::softmax::subgroup_entry());
    } else {
        src.push_str(ENTRY);
    }
    src.push_str(
        "  let rows = params[0];\n  let n = params[1];\n  let ins = bitcast<i32>(params[3]);\n",
    );
    scalar_lets(&m.scalars, w.scalars, caps, &mut src);
    // The row loop is uniform across the workgroup (its barriers need that).
    src.push_str(
        "  for (var row = wg.y * nwg.x + wg.x; row < rows; row = row + nwg.x * nwg.y) {\n",
    );
    src.push_str(
        "    var ib = i32(params[2]);\n    var ob = i32(params[4]);\n    var rem = row;\n",
    );
    decode(
        &mut src,
        "    ",
        "rem",
        sig.outer_rank,
        w.outer_shape,
        &[("ib", w.in_outer), ("ob", w.out_outer)],
    );
    // Positions within the row's operands: `xb` from input 0's first element (inputs laid
    // out like it, the epilogue's output), `pb` from the output's (one value a row).
    src.push_str("    let xb = ib - i32(params[2]);\n    let pb = ob - i32(params[4]);\n");
    // Input `kk` (neither result) at element `r` of the row; one value per position in the
    // row (a layer norm's weight) at element `r` of its one row. (Each base is read from
    // `params` once a row: after a store the driver must assume `params` changed.)
    for kk in bound_inputs(sig) {
        let base = format!("bitcast<i32>(params[{}])", w.bases + kk - 1);
        let at = match (m.per_output[kk], m.per_position[kk]) {
            (true, _) => "pb",
            (false, true) => "0",
            (false, false) => "xb",
        };
        let _ = writeln!(src, "    let base{kk} = {base} + {at};");
    }
    if sig.epilogue.is_some() {
        src.push_str("    let eb = i32(params[6]) + xb;\n");
    }
    let operand = |kk: usize, r: &str| {
        let at = if m.per_output[kk] {
            format!("u32(base{kk})")
        } else if m.per_position[kk] {
            format!("u32(base{kk} + i32({r}))")
        } else {
            format!("u32(base{kk} + i32({r}) * ins)")
        };
        load(m.inputs[kk], &format!("b{}", slot_of[kk]), &at, caps)
    };

    // 1. The row into registers, every load in flight before the fold (past the row's end:
    // the prologue's identity), and the prologue over the workgroup.
    let bound = match (sig.prologue.op, ct) {
        (ReduceOp::Sum, _) => "0.0",
        (ReduceOp::Max, "f64") => "bitcast<f64>(0xfff0000000000000lu)",
        (ReduceOp::Max, _) => "bitcast<f32>(0xff800000u)",
        (_, "f64") => "bitcast<f64>(0x7ff0000000000000lu)",
        _ => "bitcast<f32>(0x7f800000u)",
    };
    // Kept element `j`'s position in the row: `lid + j·GROUP`, or on the vector path
    // component `j % 4` of vector `lid + (j / 4)·GROUP`.
    if vector {
        src.push_str("    let vi = u32(ib) >> 2u;\n");
    }
    for j in 0..k {
        let (v, c) = (j / 4, j % 4);
        if vector {
            let at = format!("lid + {v}u * {GROUP}u");
            let at = if full {
                at
            } else {
                format!("min({at}, (n >> 2u) - 1u)")
            };
            if c == 0 {
                let _ = writeln!(src, "    let w{v} = bitcast<vec4<f32>>(b1[vi + {at}]);");
            }
            let _ = writeln!(src, "    let r{j} = 4u * (lid + {v}u * {GROUP}u) + {c}u;");
        } else {
            let _ = writeln!(src, "    let r{j} = lid + {j}u * {GROUP}u;");
        }
        let x = if vector {
            format!("w{v}.{}", ["x", "y", "z", "w"][c])
        } else if full {
            load(d, "b1", &format!("u32(ib + i32(r{j}) * ins)"), caps)
        } else {
            load(
                d,
                "b1",
                &format!("u32(ib + i32(min(r{j}, n - 1u)) * ins)"),
                caps,
            )
        };
        if full {
            let _ = writeln!(src, "    var e{j}: {ct} = {x};");
        } else {
            let _ = writeln!(src, "    var e{j}: {ct} = select({bound}, {x}, r{j} < n);");
        }
    }
    // An element's block: within the row's bounds unless every slot is.
    let open = |j: usize| {
        if full {
            "    {".to_string()
        } else {
            format!("    if (r{j} < n) {{")
        }
    };
    if sums {
        prologue_sum(&mut src, ct, k, by_subgroups, &open);
    } else {
        fold_extremum(
            &mut src,
            sig.prologue.op,
            ct,
            k,
            if by_subgroups {
                Combine::Subgroups("shp")
            } else {
                Combine::Tree("shp")
            },
            "pm",
            true,
        );
    }
    // The map reads the prologue's result as stored (a sum rounded to a 16-bit float).
    let _ = writeln!(
        src,
        "    if (lid == 0u) {{ {} }}\n    let x{pres} = {};",
        store(d, "b2", "u32(i32(params[5]) + pb)", "pm", caps),
        round_to(d, "pm".into())
    );

    // 2. Each element's term, folded; the terms kept where the epilogue reads them.
    let term = m.inputs.len();
    let epilogue = sig.epilogue.as_ref().map(|e| {
        let with = with_term(&e.expr, &m.expr, term);
        // (Kept terms replace the elements; an epilogue that still reads input 0 computes
        // the map again from them instead.)
        if with.reads_input(term) && !with.reads_input(0) {
            (with, true)
        } else {
            (e.expr.clone(), false)
        }
    });
    let keep = epilogue.as_ref().is_some_and(|(_, keep)| *keep);
    let mt = compute_type(m.expr.dtype);
    if keep {
        for j in 0..k {
            let _ = writeln!(src, "    var t{j}: {mt};");
        }
    }
    let _ = writeln!(
        src,
        "    var acc: {} = {};\n    var best = 0u;\n    var has = false;",
        compute_type(sig.acc),
        identity(sig.op, sig.acc)
    );
    let mut next = 0;
    // The map's values of one a row (a layer norm's mean, `s / n`), once a row, as inputs past
    // the map's and its term's; the inputs of one value a row they read declared with them.
    let mut row_declared: Vec<bool> = (0..m.inputs.len()).map(|kk| kk == pres).collect();
    let row_value = |kk: usize| m.per_output.get(kk) == Some(&true);
    let mut first = m.inputs.len() + 1;
    let (map_expr, values) = hoist(&m.expr, &row_value, first);
    let declare = |src: &mut String,
                   row_declared: &mut Vec<bool>,
                   values: &[Expr],
                   first: usize,
                   next: &mut usize| {
        for (kk, declared) in row_declared.iter_mut().enumerate().skip(1) {
            if row_value(kk) && !*declared && values.iter().any(|v| v.reads_input(kk)) {
                let _ = writeln!(src, "    let x{kk} = {};", operand(kk, "0u"));
                *declared = true;
            }
        }
        for (i, v) in values.iter().enumerate() {
            let mut body = String::new();
            let name = super::expr::emit_tree(v, &mut body, next, caps)?;
            src.push_str(&body);
            let _ = writeln!(src, "    let x{} = {name};", first + i);
        }
        Ok::<(), Error>(())
    };
    declare(&mut src, &mut row_declared, &values, first, &mut next)?;
    first += values.len();
    for j in 0..k {
        let _ = writeln!(src, "{}\n      let x0 = e{j};", open(j));
        for (kk, &declared) in row_declared.iter().enumerate().skip(1) {
            if !declared && map_expr.reads_input(kk) {
                let _ = writeln!(src, "      let x{kk} = {};", operand(kk, &format!("r{j}")));
            }
        }
        let mut body = String::new();
        let t = super::expr::emit_tree(&map_expr, &mut body, &mut next, caps)?;
        for line in body.lines() {
            let _ = writeln!(src, "    {line}");
        }
        if keep {
            let _ = writeln!(src, "      t{j} = {t};");
        }
        let v = cast(&t, m.expr.dtype, sig.acc, false);
        let _ = writeln!(src, "      {}\n    }}", fold(sig.op, sig.acc, &v, "0u"));
    }
    if sum_by_subgroups {
        // The subgroups' sums added in their order: the same order every run.
        src.push_str(&super::softmax::subgroup_sum(
            "acc",
            "shv",
            Some(("has", "shh")),
        ));
    } else {
        src.push_str(&workgroup_tree(sig.op, sig.acc, "    "));
        let _ = writeln!(
            src,
            "    acc = {}; has = shh[0] != 0u;\n    workgroupBarrier();",
            shared_value(sig.acc, "0")
        );
    }
    let _ = writeln!(
        src,
        "    let res = {};\n    if (lid == 0u) {{ {} }}",
        cast("acc", sig.acc, sig.out, false),
        store(sig.out, "b0", "u32(ob)", "res", caps)
    );

    // 3. The epilogue over the same registers.
    if let (Some(e), Some((expr, keep))) = (&sig.epilogue, &epilogue) {
        let eres = e.result;
        let _ = writeln!(src, "    let x{eres} = res;");
        // (Its values of one a row too: `rsqrt(v / n + eps)`.)
        let row_value = |kk: usize| kk == eres || m.per_output.get(kk) == Some(&true);
        let (expr, values) = hoist(expr, &row_value, first);
        if let Some(d) = row_declared.get_mut(eres) {
            *d = true;
        }
        declare(&mut src, &mut row_declared, &values, first, &mut next)?;
        let expr = &expr;
        // `a / s` by the row's result: its reciprocal once (see the module's note), where the
        // row's `s` allows; the branch is the row's, never an element's (a branch an element
        // with the division in it made the whole kernel twice as slow on NVIDIA's driver).
        let quotient = match &expr.node {
            Node::Binary(BinaryOp::Div, a, b)
                if **b == Expr::input(eres, sig.out)
                    && compute_type(expr.dtype) == "f32"
                    && compute_type(sig.out) == "f32"
                    && caps.fused_fma
                    && caps.f64 =>
            {
                Some(a.as_ref())
            }
            _ => None,
        };
        let operands = |src: &mut String, j: usize| {
            if *keep {
                let _ = writeln!(src, "      let x{term} = t{j};");
            } else {
                let _ = writeln!(src, "      let x0 = e{j};");
            }
            for (kk, &declared) in row_declared.iter().enumerate().skip(1) {
                if !declared && expr.reads_input(kk) {
                    let _ = writeln!(src, "      let x{kk} = {};", operand(kk, &format!("r{j}")));
                }
            }
        };
        // Element `j`'s operands and body, returning its value as the epilogue's output dtype:
        // `a / s` corrected from the row's reciprocal (`quotient`: `a`), or the expression.
        let element = |src: &mut String,
                       j: usize,
                       next: &mut usize,
                       quotient: Option<&Expr>|
         -> Result<String> {
            operands(src, j);
            let mut body = String::new();
            let y = match quotient {
                Some(a) => {
                    let a = super::expr::emit_tree(a, &mut body, next, caps)?;
                    let _ = writeln!(
                        body,
                        "      let qa = {a};\n      let q0 = qa * rs;\n      \
                         var q = fma(fma(-q0, x{eres}, qa), rs, q0);\n      \
                         let inf = bitcast<f32>(((bitcast<u32>(qa) ^ bitcast<u32>(x{eres})) & 0x80000000u) | 0x7f800000u);\n      \
                         q = select(q, inf, (bitcast<u32>(q) & 0x7fffffffu) > 0x7f800000u && (bitcast<u32>(qa) & 0x7fffffffu) <= 0x7f800000u);"
                    );
                    round_to(expr.dtype, "q".into())
                }
                None => super::expr::emit_tree(expr, &mut body, next, caps)?,
            };
            for line in body.lines() {
                let _ = writeln!(src, "    {line}");
            }
            Ok(cast(&y, expr.dtype, e.out, false))
        };
        // Every element's output: one store an element, or on the vector path one 16-byte
        // store of each vector's four.
        let outputs = |src: &mut String, next: &mut usize, quotient: Option<&Expr>| -> Result<()> {
            if vector {
                for v in 0..k / 4 {
                    let at = format!("(lid + {v}u * {GROUP}u)");
                    let test = if full {
                        String::new()
                    } else {
                        format!("if (4u * {at} < n) ")
                    };
                    let _ = writeln!(src, "    {test}{{\n      var o: vec4<f32>;");
                    for c in 0..4 {
                        src.push_str("    {\n");
                        let y = element(src, 4 * v + c, next, quotient)?;
                        let _ = writeln!(src, "      o[{c}] = {y};\n    }}");
                    }
                    let _ = writeln!(
                        src,
                        "      b3[(u32(eb) >> 2u) + {at}] = bitcast<vec4<u32>>(o);\n    }}"
                    );
                }
            } else {
                for j in 0..k {
                    let _ = writeln!(src, "{}", open(j));
                    let y = element(src, j, next, quotient)?;
                    let at = format!("u32(eb + i32(r{j}) * ins)");
                    let _ = writeln!(src, "      {}\n    }}", store(e.out, "b3", &at, &y, caps));
                }
            }
            Ok(())
        };
        if let Some(a) = quotient {
            // With 1 <= |s| <= 2^60 (softmax's sums), `a · r` cannot overflow for a finite
            // `a` and the residual is exact; an infinite `a` (NaN from the correction, a
            // finite `s`) gives the signed infinity. (NaN tested on its bits: NVIDIA's driver
            // folds `x != x`.)
            let _ = writeln!(
                src,
                "    let rs = div_f32(1.0f, x{eres});\n    let us = bitcast<u32>(x{eres}) & 0x7fffffffu;\n    \
                 if (us >= 0x3f800000u && us <= 0x5d800000u) {{"
            );
            outputs(&mut src, &mut next, Some(a))?;
            src.push_str("    } else {\n");
        }
        outputs(&mut src, &mut next, None)?;
        if quotient.is_some() {
            src.push_str("    }\n");
        }
    }
    src.push_str("  }\n}\n");
    Ok(src)
}

/// `e` with every subtree equal to `map` read as input `term` instead.
fn with_term(e: &Expr, map: &Expr, term: usize) -> Expr {
    if e == map {
        return Expr::input(term, map.dtype);
    }
    e.map_children(|c| with_term(c, map, term))
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_core::ir::UnaryOp;

    /// Softmax from its primitives over `d`: the map `exp(x0 - x1)` (x1 the maximum), summed
    /// in f32, and the epilogue `exp(x0 - x1) / x2` (x2 the sum).
    pub(crate) fn softmax_sig(d: DType, cached: usize) -> StagedSig {
        let x = |k| Box::new(Expr::input(k, d));
        let node = |node| Expr { dtype: d, node };
        let exp = node(Node::Unary(
            UnaryOp::Exp,
            Box::new(node(Node::Binary(BinaryOp::Sub, x(0), x(1)))),
        ));
        let div = node(Node::Binary(BinaryOp::Div, Box::new(exp.clone()), x(2)));
        StagedSig {
            op: ReduceOp::Sum,
            acc: d.accumulator(),
            out: d,
            outer_rank: 1,
            map: ReduceMap {
                expr: exp,
                inputs: vec![d, d, d],
                per_output: vec![false, true, true],
                per_position: vec![false; 3],
                scalars: vec![],
            },
            prologue: StagedPrologue {
                op: ReduceOp::Max,
                result: 1,
            },
            epilogue: Some(StagedEpilogue {
                expr: div,
                result: 2,
                out: d,
            }),
            cached,
            vector: false,
            full: false,
        }
    }

    #[test]
    fn a_layer_norms_values_of_one_a_row_are_computed_once_a_row() {
        // Mean `x1 / s0` (x1 the prologue's sum), variance `x2 / s0` (x2 the reduction's sum),
        // a weight x3 along the row: `(x0 − x1/s0)²` summed, then
        // `(x0 − x1/s0) · rsqrt(x2/s0 + s1) · x3`.
        let d = DType::F32;
        let x = |k| Expr::input(k, d);
        let centred = Expr::binary(
            BinaryOp::Sub,
            x(0),
            Expr::binary(BinaryOp::Div, x(1), Expr::scalar(0, d)),
        );
        let var = Expr::binary(BinaryOp::Div, x(2), Expr::scalar(0, d));
        let scale = Expr::unary(
            UnaryOp::Rsqrt,
            Expr::binary(BinaryOp::Add, var, Expr::scalar(1, d)),
        );
        let out = Expr::binary(
            BinaryOp::Mul,
            Expr::binary(BinaryOp::Mul, centred.clone(), scale),
            x(3),
        );
        let sig = StagedSig {
            map: ReduceMap {
                expr: Expr::binary(BinaryOp::Mul, centred.clone(), centred),
                inputs: vec![d; 4],
                per_output: vec![false, true, true, false],
                per_position: vec![false, false, false, true],
                scalars: vec![d, d],
            },
            prologue: StagedPrologue {
                op: ReduceOp::Sum,
                result: 1,
            },
            epilogue: Some(StagedEpilogue {
                expr: out,
                result: 2,
                out: d,
            }),
            ..softmax_sig(d, 16)
        };
        let src = source(&sig, Caps::default()).unwrap();
        let kernel = &src[src.find("@compute").unwrap()..];
        // Four divisions a row (the mean for the map; the mean, the variance and the
        // reciprocal square root for the epilogue), one square root, whatever the elements an
        // invocation keeps.
        assert_eq!(kernel.matches("div_f32(").count(), 4, "{kernel}");
        assert_eq!(kernel.matches("sqrt_f32(").count(), 1, "{kernel}");
        // The weight is read at each element; the prologue's sum is held, not read back.
        assert_eq!(kernel.matches("let x3 = ").count(), 16, "{kernel}");
        assert_eq!(kernel.matches("let x1 = ").count(), 1, "{kernel}");
        assert!(kernel.contains("let x1 = pm;"), "{kernel}");
    }

    #[test]
    fn softmax_from_primitives_reads_the_row_once_and_keeps_its_terms() {
        let sig = softmax_sig(DType::F32, 4);
        let src = source(&sig, Caps::default()).unwrap();
        let kernel = &src[src.find("@compute").unwrap()..];
        // One load per kept element; one exp per element (the terms are kept).
        assert_eq!(kernel.matches("bitcast<f32>(b1[").count(), 4, "{kernel}");
        assert_eq!(kernel.matches("exp_").count(), 4, "{kernel}");
        assert_eq!(kernel.matches("t3 = ").count(), 1, "{kernel}");
        // The results are held, not bound: output, input 0, prologue, epilogue.
        assert_eq!(bindings(&sig), 4);
        assert!(!kernel.contains("b4"), "{kernel}");
        // Without a fused fma, the division as the map would compute it.
        assert_eq!(kernel.matches("div_f32(").count(), 4, "{kernel}");
        assert!(!kernel.contains("fma("), "{kernel}");
    }

    #[test]
    fn a_whole_f32_row_moves_in_vectors_without_bounds_tests() {
        let caps = Caps {
            fused_fma: true,
            f64: true,
            ..Caps::default()
        };
        let sig = StagedSig {
            vector: true,
            full: true,
            ..softmax_sig(DType::F32, 8)
        };
        let src = source(&sig, caps).unwrap();
        let kernel = &src[src.find("@compute").unwrap()..];
        // Two 16-byte loads; two stores in each of the quotient's forms; no bounds tests.
        assert_eq!(
            kernel.matches("bitcast<vec4<f32>>(b1[").count(),
            2,
            "{kernel}"
        );
        assert_eq!(
            kernel.matches("bitcast<vec4<u32>>(o);").count(),
            4,
            "{kernel}"
        );
        assert!(!kernel.contains("< n"), "{kernel}");
        let partial = source(&StagedSig { full: false, ..sig }, caps).unwrap();
        assert_eq!(partial.matches("if (4u * (lid + ").count(), 4, "{partial}");
        assert_eq!(partial.matches("if (r1 < n)").count(), 1, "{partial}");
    }

    #[test]
    fn with_a_fused_fma_a_row_divides_once() {
        let caps = Caps {
            fused_fma: true,
            f64: true,
            ..Caps::default()
        };
        let src = source(&softmax_sig(DType::F32, 4), caps).unwrap();
        let kernel = &src[src.find("@compute").unwrap()..];
        assert_eq!(
            kernel.matches("let rs = div_f32(1.0f, x2)").count(),
            1,
            "{kernel}"
        );
        assert_eq!(
            kernel.matches("fma(fma(-q0, x2, qa), rs, q0)").count(),
            4,
            "{kernel}"
        );
        // f16 rounds the corrected quotient.
        let half = source(&softmax_sig(DType::F16, 2), caps).unwrap();
        assert!(half.contains("round_f16(q)"), "{half}");
    }

    #[test]
    fn an_epilogue_that_reads_the_row_computes_the_map_again() {
        // `(x0 - x1) * x2`: no term to keep; the elements stay.
        let mut sig = softmax_sig(DType::F32, 2);
        let x = |k| Box::new(Expr::input(k, DType::F32));
        let sub = Expr {
            dtype: DType::F32,
            node: Node::Binary(BinaryOp::Sub, x(0), x(1)),
        };
        sig.epilogue.as_mut().unwrap().expr = Expr {
            dtype: DType::F32,
            node: Node::Binary(BinaryOp::Mul, Box::new(sub), x(2)),
        };
        let src = source(&sig, Caps::default()).unwrap();
        assert!(!src.contains("var t0"), "{src}");
        assert_eq!(src.matches("let x0 = e1;").count(), 2, "{src}");
    }
}
