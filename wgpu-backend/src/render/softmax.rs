//! `Softmax` kernels (core's [`softmax_plan`](strata_core::lower::softmax_plan)): a row's
//! maximum, the sum of its terms and the output in one launch, so memory sees the row read
//! once and written once. A short row (up to 16 elements) is one invocation's; a longer one is
//! a workgroup's, its 256 invocations combining their maxima and sums through workgroup
//! memory. Each invocation keeps its elements of the row in registers — up to [`MAX_CACHED`],
//! written out as separate variables (a private array indexed in a loop may be placed in
//! memory by the driver) — and softmax keeps its terms there too (one `exp` per element).
//! A kept f32 row whose every row starts on a 16-byte vector moves in vectors (four elements
//! a load and a store; the elements' order within an invocation changes, so the sum's does),
//! and a row exactly as long as the kept slots has no bounds tests: on NVIDIA's driver the
//! element-by-element loads and the tests cost a quarter of `softmax`'s time. A longer row
//! is read from memory in each pass. The terms and the output are core's
//! expressions, emitted like a map's, so the numbers are the composition's; where the
//! adapter's `fma` is fused, a kept row divides once (its sum's reciprocal) and corrects each
//! quotient to the correctly rounded one (Markstein), instead of an f64 division an element.

use super::prelude::helpers;
use super::reduce::decode;
use super::{binding, cast, compute_type, load, round_to, store, Caps, ENTRY};
use std::collections::BTreeSet;
use std::fmt::Write;
use strata_core::ir::ReduceOp;
use strata_core::lower::softmax_plan::{
    log_of_sum, log_softmax_from_log_sum, softmax_from_term, softmax_output, softmax_term,
};
use strata_core::{DType, Result};

/// The structure of a softmax launch.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct SoftmaxSig {
    pub dtype: DType,
    pub log: bool,
    /// Leading axes decoded per row.
    pub outer_rank: usize,
    /// Invocations per row: 1 or 256 (a workgroup).
    pub group: usize,
    /// Elements each invocation keeps in registers (a power of two, its share rounded up);
    /// 0: the row is read from memory in each pass.
    pub cached: usize,
    /// A kept f32 row moved in 16-byte vectors (`cached` ≥ 4): both operands contiguous along
    /// the row, every row starting on a vector, whole vectors. Invocation `lane` keeps vectors
    /// `lane + j·group`.
    pub vector: bool,
    /// Every kept slot is inside the row (`group · cached` elements exactly): no bounds tests.
    pub full: bool,
}

impl strata_core::kernel_cache::Owned for SoftmaxSig {}

/// The most elements an invocation keeps in registers: a row of 16,384 in a workgroup.
pub(crate) const MAX_CACHED: usize = 64;

/// Slots in `params`: [0] rows, [1] elements per row, the outer shape, then for the input and
/// the output each: the first element (within its binding), the outer strides, the row stride.
pub(crate) struct Slots {
    pub outer_shape: usize,
    pub input: usize,
    pub output: usize,
    pub len: usize,
}

pub(crate) fn slots(outer_rank: usize) -> Slots {
    let outer_shape = 2;
    let input = outer_shape + outer_rank;
    let output = input + outer_rank + 2;
    Slots {
        outer_shape,
        input,
        output,
        len: output + outer_rank + 2,
    }
}

/// The WGSL source of a softmax launch.
pub(crate) fn source(sig: &SoftmaxSig, caps: Caps) -> Result<String> {
    let (d, g, k) = (sig.dtype, sig.group, sig.cached);
    let (vector, full) = (sig.vector, sig.full);
    let acc = d.accumulator();
    let (ct, at) = (compute_type(d), compute_type(acc));
    let w = slots(sig.outer_rank);
    let mut src = super::header(caps);
    if vector {
        src.push_str(&super::vector_binding(0, "u32"));
        src.push_str(&super::vector_binding(1, "u32"));
    } else {
        src.push_str(&binding(0, d, true, caps));
        src.push_str(&binding(1, d, false, caps));
    }
    src.push_str(&helpers(&BTreeSet::from([d, acc]), caps));
    // A workgroup's f32 row combines its kept maximum and its sum by subgroups where the
    // adapter has them: each subgroup's value, then the subgroups' in order (a barrier, and
    // for the maximum a uniform load). A row read in passes keeps the tree for its maximum.
    // (Measured through NVIDIA's driver, H200, [16384, 16384]: with rows moved in vectors,
    // `softmax` 0.74 → 0.69 ms; before them, when each element was tested against the row's
    // length, it had gone from 0.99 to 1.04 ms and kept the trees.)
    let keep_terms = k > 0 && !sig.log;
    let by_subgroups = g > 1 && caps.subgroups && ct == "f32" && at == "f32";
    if g > 1 {
        let _ = writeln!(
            src,
            "var<workgroup> shm: array<{ct}, {g}>;\nvar<workgroup> shs: array<{at}, {g}>;"
        );
    }
    if by_subgroups {
        src.push_str("var<workgroup> shn: array<u32, 256>;\nvar<workgroup> shr: f32;\n");
        src.push_str(&subgroup_entry());
    } else {
        src.push_str(ENTRY);
    }
    src.push_str("  let rows = params[0];\n  let n = params[1];\n");
    if g == 1 {
        src.push_str("  let lane = 0u;\n  let row = gid;\n  if (row < rows) {\n");
    } else {
        // The row loop is uniform across the workgroup (its barriers need that).
        src.push_str(
            "  let lane = lid;\n  for (var row = wg.y * nwg.x + wg.x; row < rows; row = row + nwg.x * nwg.y) {\n",
        );
    }
    // The row's first element in the input (ib) and the output (ob).
    let _ = writeln!(
        src,
        "    var ib = i32(params[{}]);\n    var ob = i32(params[{}]);\n    var rem = row;",
        w.input, w.output
    );
    decode(
        &mut src,
        "    ",
        "rem",
        sig.outer_rank,
        w.outer_shape,
        &[("ib", w.input + 1), ("ob", w.output + 1)],
    );
    let _ = writeln!(
        src,
        "    let ins = bitcast<i32>(params[{}]);\n    let outs = bitcast<i32>(params[{}]);",
        w.input + 1 + sig.outer_rank,
        w.output + 1 + sig.outer_rank
    );
    let x_at = |r: &str| load(d, "b1", &format!("u32(ib + i32({r}) * ins)"), caps);
    // Kept element `j`'s position in the row: `lane + j·group`, or on the vector path
    // component `j % 4` of vector `lane + (j / 4)·group`.
    let position = |j: usize| {
        if vector {
            format!("(4u * (lane + {}u * {g}u) + {}u)", j / 4, j % 4)
        } else {
            format!("(lane + {j}u * {g}u)")
        }
    };
    // Visits the invocation's elements: `body` sees the element (or its kept term) as `x0`.
    // Cached elements live in `e{j}`, at [`position`], loaded in pass 1; an uncached row is
    // read from memory in each pass.
    let visit = |src: &mut String, body: &str| {
        if k > 0 {
            for j in 0..k {
                let r = position(j);
                let body = body.replace("$E", &format!("e{j}")).replace("$R", &r);
                if full {
                    let _ = writeln!(src, "    {{\n      let x0 = e{j};\n{body}\n    }}");
                } else {
                    let _ = writeln!(
                        src,
                        "    if ({r} < n) {{\n      let x0 = e{j};\n{body}\n    }}"
                    );
                }
            }
        } else {
            let _ = writeln!(
                src,
                "    for (var r = lane; r < n; r = r + {g}u) {{\n      let x0 = {};\n{}\n    }}",
                x_at("r"),
                body.replace("$R", "r")
            );
        }
    };
    // Combines every invocation's `name` over the workgroup with `op(a, b)`: a tree in
    // workgroup memory `sh`; every invocation ends with the result.
    let combine = |src: &mut String, name: &str, sh: &str, op: &dyn Fn(&str, &str) -> String| {
        if g == 1 {
            return;
        }
        let _ = writeln!(
            src,
            "    {sh}[lane] = {name};\n    workgroupBarrier();\n    \
             for (var s = {}u; s > 0u; s = s >> 1u) {{\n      \
             if (lane < s) {{ {sh}[lane] = {}; }}\n      workgroupBarrier();\n    }}\n    \
             {name} = {sh}[0];\n    workgroupBarrier();",
            g / 2,
            op(&format!("{sh}[lane]"), &format!("{sh}[lane + s]"))
        );
    };
    // Pass 1: the maximum, by the reduction's rule (NaN wins, -0 below +0).
    let neg_inf = if ct == "f64" {
        "bitcast<f64>(0xfff0000000000000lu)"
    } else {
        "bitcast<f32>(0xff800000u)"
    };
    let max = |a: &str, b: &str| format!("fmax_{ct}({a}, {b})");
    if k > 0 {
        // Every load first, none behind a branch (past the row's end: its last element, taken
        // as -inf), so they are all in flight together; then the maximum over them.
        if vector {
            let _ = writeln!(
                src,
                "    let vi = u32(ib) >> 2u;\n    let vo = u32(ob) >> 2u;"
            );
        }
        for j in 0..k {
            let r = position(j);
            if vector && j % 4 == 0 {
                let v = format!("(lane + {}u * {g}u)", j / 4);
                let at = if full {
                    v
                } else {
                    format!("min({v}, (n >> 2u) - 1u)")
                };
                let _ = writeln!(
                    src,
                    "    let w{} = bitcast<vec4<f32>>(b1[vi + {at}]);",
                    j / 4
                );
            }
            let x = if vector {
                format!("w{}.{}", j / 4, ["x", "y", "z", "w"][j % 4])
            } else if full {
                x_at(&r)
            } else {
                x_at(&format!("min({r}, n - 1u)"))
            };
            if full {
                let _ = writeln!(src, "    var e{j}: {ct} = {x};");
            } else {
                let _ = writeln!(src, "    var e{j}: {ct} = select({neg_inf}, {x}, {r} < n);");
            }
        }
        fold_extremum(
            &mut src,
            ReduceOp::Max,
            ct,
            k,
            match (g > 1, by_subgroups) {
                (false, _) => Combine::Invocation,
                (true, false) => Combine::Tree("shm"),
                (true, true) => Combine::Subgroups("shm"),
            },
            "m",
            // No NaN flag: a NaN's term is NaN, so is the row's sum and every output over it,
            // whatever the maximum (measured 2% of `softmax` on NVIDIA's driver).
            false,
        );
    } else {
        let _ = writeln!(src, "    var m: {ct} = {neg_inf};");
        visit(&mut src, &format!("      m = {};", max("m", "x0")));
        combine(&mut src, "m", "shm", &max);
    }
    // Pass 2: the sum of the terms, each rounded to the dtype, in the accumulator.
    // The row's maximum and sum are read opaquely: a driver that folds `x - x` and `x / x`
    // (NVIDIA's) would otherwise make a one-element row's `exp(x - m) / s` 1 for ±inf and NaN.
    let _ = writeln!(
        src,
        "    let x1 = {};\n    var sum: {at} = {};",
        super::expr::opaque("m"),
        super::literal(acc, 0)
    );
    let mut next = 0;
    let mut term = String::new();
    let t = super::expr::emit_tree(&softmax_term(d), &mut term, &mut next, caps)?;
    let _ = write!(
        term,
        "      sum = {};",
        round_to(acc, format!("sum + {}", cast(&t, d, acc, false)))
    );
    if keep_terms {
        let _ = write!(term, "\n      $E = {t};");
    }
    visit(&mut src, &indent(&term));
    if by_subgroups {
        // The subgroups' sums added in their order: the same order every run.
        src.push_str(&subgroup_sum("sum", "shs", None));
    } else {
        let add = |a: &str, b: &str| round_to(acc, format!("{a} + {b}"));
        combine(&mut src, "sum", "shs", &add);
    }
    // Pass 3: the output over the element (or its term), the maximum and the sum rounded to
    // the dtype.
    let _ = writeln!(
        src,
        "    let x2 = {};",
        super::expr::opaque(&cast("sum", acc, d, false))
    );
    let mut body = String::new();
    let y = if keep_terms && ct == "f32" && caps.fused_fma && caps.f64 {
        // `t / s` for every term of the row: the correctly rounded quotient from the row's
        // correctly rounded reciprocal, without a division per element (which is done in f64
        // here). Markstein's theorem: with `r` within half an ulp of 1/s and `q0 = x·r`
        // within one ulp of x/s, `q0 + (x − s·q0)·r` through fused multiply-adds rounds to
        // x/s (1 ≤ s ≤ 16,384 for a row kept in registers, so no overflow; results below
        // f32's normal range are flushed on drivers that flush them, as the division's are).
        let _ = writeln!(src, "    let rs = div_f32(1.0f, x2);");
        body.push_str("      let q0 = x0 * rs;\n");
        round_to(d, "fma(fma(-q0, x2, x0), rs, q0)".to_string())
    } else if sig.log {
        // log(s) once a row (`x3`), then `(x - m) - x3` an element.
        let mut row = String::new();
        let l = super::expr::emit_tree(&log_of_sum(d), &mut row, &mut next, caps)?;
        for line in row.lines() {
            let _ = writeln!(src, "    {}", line.trim_start());
        }
        let _ = writeln!(src, "    let x3 = {l};");
        super::expr::emit_tree(&log_softmax_from_log_sum(d), &mut body, &mut next, caps)?
    } else {
        let output = if keep_terms {
            softmax_from_term(d)
        } else {
            softmax_output(d, false)
        };
        super::expr::emit_tree(&output, &mut body, &mut next, caps)?
    };
    if vector {
        // Each vector's four outputs, then one 16-byte store.
        let _ = write!(body, "      o[$C] = {y};");
        let body = indent(&body);
        for v in 0..k / 4 {
            let at = format!("(lane + {v}u * {g}u)");
            let test = if full {
                String::new()
            } else {
                format!("if (4u * {at} < n) ")
            };
            let _ = writeln!(src, "    {test}{{\n      var o: vec4<f32>;");
            for c in 0..4 {
                let j = 4 * v + c;
                let _ = writeln!(
                    src,
                    "      {{\n      let x0 = e{j};\n{}\n      }}",
                    body.replace("$R", &position(j))
                        .replace("$C", &c.to_string())
                );
            }
            let _ = writeln!(src, "      b0[vo + {at}] = bitcast<vec4<u32>>(o);\n    }}");
        }
    } else {
        let _ = write!(
            body,
            "      {}",
            store(d, "b0", "u32(ob + i32($R) * outs)", &y, caps)
        );
        visit(&mut src, &indent(&body));
    }
    src.push_str("  }\n}\n");
    Ok(src)
}

/// WGSL summing the `var` `value` (the row's accumulator) over the workgroup by subgroups: each subgroup's sum,
/// then the subgroups' sums added in their order by every invocation (the same order every
/// run), through the workgroup array `shared` (one slot a subgroup); `flag` (a bool `var` and
/// its u32 array) is or-ed across the workgroup alongside. Needs [`subgroup_entry`]'s `sg`,
/// `sl` and `nsg`.
pub(crate) fn subgroup_sum(value: &str, shared: &str, flag: Option<(&str, &str)>) -> String {
    let (any, keep, first, fold) = match flag {
        Some((f, sh)) => (
            format!(" let ph = subgroupAny({f});"),
            format!(" {sh}[sg] = select(0u, 1u, ph);"),
            format!(" {f} = {sh}[0] != 0u;"),
            format!(" {f} = {f} || {sh}[i] != 0u;"),
        ),
        None => Default::default(),
    };
    format!(
        "    let ps = subgroupAdd({value});{any}\n    if (sl == 0u) {{ {shared}[sg] = ps;{keep} }}\n    \
         workgroupBarrier();\n    {value} = {shared}[0];{first}\n    \
         for (var i = 1u; i < nsg; i = i + 1u) {{ {value} = {value} + {shared}[i];{fold} }}\n    \
         workgroupBarrier();\n"
    )
}

/// [`ENTRY`] with the invocation's subgroup (`sg`), its place in it (`sl`) and the
/// workgroup's subgroups (`nsg`).
pub(crate) fn subgroup_entry() -> String {
    ENTRY.replace(
        "@builtin(local_invocation_index) lid: u32)",
        "@builtin(local_invocation_index) lid: u32,\n        @builtin(subgroup_id) sg: u32, \
         @builtin(subgroup_invocation_id) sl: u32, @builtin(num_subgroups) nsg: u32)",
    )
}

/// How a row's invocations combine a value.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Combine<'a> {
    /// One invocation a row: nothing to combine.
    Invocation,
    /// A tree of barriers over the workgroup array of 256 values named.
    Tree(&'a str),
    /// Each subgroup's value, then the subgroups' (f32; an entry with `sg`, `sl` and `nsg`, and
    /// the arrays `shn` and `shr`), the array named holding one value a subgroup and the
    /// tree's values where a zero's sign is settled.
    Subgroups(&'a str),
}

/// Declares `var {m}` and folds the kept elements `e0..e{k}` (past the row's end: `op`'s
/// identity, an infinity) into it by `op`, max or min, with the reduction's rule — NaN wins,
/// -0 below +0 — every invocation ending with the row's value; `sh`: a workgroup array of
/// 256 `ct` values to combine through (`Combine`). The rule an element
/// (`fmax_f32`, a branch) cost more than the rest of a softmax's pass: here WGSL's `max` or
/// `min` an element (either zero where they tie) and a NaN flag, then the row's zero sign
/// settled once where the extremum is a zero: +0 for a maximum where any element is +0, -0
/// for a minimum where any is -0. Without `nan_flag` a NaN does not win (the value is WGSL's
/// `max`/`min`): for a caller whose every output a NaN element makes NaN anyway.
pub(crate) fn fold_extremum(
    src: &mut String,
    op: ReduceOp,
    ct: &str,
    k: usize,
    combine: Combine,
    m: &str,
    nan_flag: bool,
) {
    let (sh, by_subgroups) = match combine {
        Combine::Invocation => (None, false),
        Combine::Tree(sh) => (Some(sh), false),
        Combine::Subgroups(sh) => (Some(sh), true),
    };
    let f64 = ct == "f64";
    let (bits, nan, zero) = if f64 {
        ("u64", "bitcast<f64>(0x7ff8000000000000lu)", "0.0lf")
    } else {
        ("u32", "bitcast<f32>(0x7fc00000u)", "0.0f")
    };
    let (f, inf, signed_zero, other_zero) = match (op, f64) {
        (ReduceOp::Max, true) => ("max", "0xfff0000000000000lu", "0lu", "0x8000000000000000lu"),
        (ReduceOp::Max, false) => ("max", "0xff800000u", "0u", "0x80000000u"),
        (_, true) => ("min", "0x7ff0000000000000lu", "0x8000000000000000lu", "0lu"),
        (_, false) => ("min", "0x7f800000u", "0x80000000u", "0u"),
    };
    let is_nan = |v: &str| super::is_nan(if f64 { DType::F64 } else { DType::F32 }, v);
    let _ = writeln!(
        src,
        "    var {m}: {ct} = bitcast<{ct}>({inf});\n    var {m}n = false;"
    );
    for j in 0..k {
        if nan_flag {
            let _ = writeln!(
                src,
                "    {m} = {f}({m}, e{j}); {m}n = {m}n || {};",
                is_nan(&format!("e{j}"))
            );
        } else {
            let _ = writeln!(src, "    {m} = {f}({m}, e{j});");
        }
    }
    match sh {
        Some(sh) if by_subgroups => {
            // WGSL's `max`/`min` of subgroups and the NaN flags apart (a subgroup's extremum
            // need not keep a NaN); invocation 0 folds the subgroups' values in order.
            let _ = writeln!(
                src,
                "    let p{m} = subgroup{F}({m}); let p{m}n = subgroupAny({m}n);\n    \
                 if (sl == 0u) {{ {sh}[sg] = p{m}; shn[sg] = select(0u, 1u, p{m}n); }}\n    \
                 workgroupBarrier();\n    if (lid == 0u) {{\n      var r = {sh}[0]; var rn = shn[0];\n      \
                 for (var i = 1u; i < nsg; i = i + 1u) {{ r = {f}(r, {sh}[i]); rn = rn | shn[i]; }}\n      \
                 if (rn != 0u) {{ r = {nan}; }}\n      shr = r;\n    }}\n    \
                 {m} = workgroupUniformLoad(&shr);",
                F = if f == "max" { "Max" } else { "Min" },
            );
        }
        _ => {
            let _ = writeln!(src, "    if ({m}n) {{ {m} = {nan}; }}");
        }
    }
    // The row's value in every invocation, read as uniform (the zero test branches on it).
    let tree = |src: &mut String, v: &str, fold: &str| {
        if let Some(sh) = sh {
            let _ = writeln!(
                src,
                "    {sh}[lid] = {v};\n    workgroupBarrier();\n    \
                 for (var s = 128u; s > 0u; s = s >> 1u) {{\n      \
                 if (lid < s) {{ {sh}[lid] = {fold}({sh}[lid], {sh}[lid + s]); }}\n      \
                 workgroupBarrier();\n    }}\n    {v} = workgroupUniformLoad(&{sh}[0]);"
            );
        }
    };
    if !by_subgroups {
        tree(src, m, &format!("f{f}_{ct}"));
    }
    // The zero's sign settled on the value's bits, never a float compare or select: a driver
    // that does not preserve signed zeros (NVIDIA's) may treat a float zero's fix-up as a no-op.
    let abs = if f64 {
        "0x7ffffffffffffffflu"
    } else {
        "0x7fffffffu"
    };
    let _ = writeln!(
        src,
        "    var {m}b = bitcast<{bits}>({m});\n    if (({m}b & {abs}) == {}) {{\n    var {m}z: {ct} = {zero};",
        if f64 { "0lu" } else { "0u" }
    );
    for j in 0..k {
        let _ = writeln!(
            src,
            "    if (bitcast<{bits}>(e{j}) == {signed_zero}) {{ {m}z = 1{zero_suffix}; }}",
            zero_suffix = if f64 { ".0lf" } else { ".0f" }
        );
    }
    tree(src, &format!("{m}z"), "max");
    let _ = writeln!(
        src,
        "    {m}b = select({other_zero}, {signed_zero}, {m}z > {zero});\n    }}\n    {m} = bitcast<{ct}>({m}b);"
    );
}

/// `text`'s lines indented by six spaces where they are not already.
fn indent(text: &str) -> String {
    text.lines()
        .map(|l| {
            if l.starts_with("      ") {
                l.to_string()
            } else {
                format!("      {}", l.trim_start())
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sig(dtype: DType, group: usize, cached: usize) -> SoftmaxSig {
        SoftmaxSig {
            dtype,
            log: false,
            outer_rank: 1,
            group,
            cached,
            vector: false,
            full: false,
        }
    }

    #[test]
    fn a_cached_row_is_read_once_and_keeps_its_terms() {
        let src = source(&sig(DType::F32, 256, 4), Caps::default()).unwrap();
        let kernel = &src[src.find("@compute").unwrap()..];
        // One load per kept element (pass 1), one exp per element (pass 2).
        assert_eq!(kernel.matches("bitcast<f32>(b1[").count(), 4, "{kernel}");
        assert_eq!(kernel.matches("exp").count(), 4, "{kernel}");
        assert!(
            src.contains("var<workgroup> shm: array<f32, 256>;"),
            "{src}"
        );
        let log = source(
            &SoftmaxSig {
                log: true,
                ..sig(DType::F32, 256, 4)
            },
            Caps::default(),
        )
        .unwrap();
        assert_eq!(log.matches("bitcast<f32>(b1[").count(), 4, "{log}");
        // Its log(s) once a row.
        assert_eq!(log.matches("let x3 = ").count(), 1, "{log}");
    }

    #[test]
    fn a_whole_f32_row_moves_in_vectors_without_bounds_tests() {
        let whole = SoftmaxSig {
            vector: true,
            full: true,
            ..sig(DType::F32, 256, 16)
        };
        let src = source(&whole, Caps::default()).unwrap();
        let kernel = &src[src.find("@compute").unwrap()..];
        // Four 16-byte loads and stores; no element is tested against the row's length.
        assert_eq!(
            kernel.matches("bitcast<vec4<f32>>(b1[").count(),
            4,
            "{kernel}"
        );
        assert_eq!(
            kernel.matches("= bitcast<vec4<u32>>(o);").count(),
            4,
            "{kernel}"
        );
        assert!(!kernel.contains("< n"), "{kernel}");
        // The maximum and the sum read opaquely (a driver may fold `x - x` and `x / x`).
        assert!(kernel.contains("let x1 = select(m, -m, "), "{kernel}");
        // Not whole: each vector is tested once, by its first element.
        let partial = source(
            &SoftmaxSig {
                full: false,
                ..whole.clone()
            },
            Caps::default(),
        )
        .unwrap();
        assert_eq!(partial.matches("if (4u * (lane + ").count(), 4, "{partial}");
        // Scalar and whole: one load an element, no tests.
        let scalar = source(
            &SoftmaxSig {
                vector: false,
                ..whole
            },
            Caps::default(),
        )
        .unwrap();
        assert_eq!(scalar.matches("bitcast<f32>(b1[").count(), 16, "{scalar}");
        assert!(
            !scalar[scalar.find("@compute").unwrap()..].contains("< n"),
            "{scalar}"
        );
    }

    #[test]
    fn with_a_fused_fma_a_row_divides_once() {
        let caps = Caps {
            fused_fma: true,
            f64: true,
            ..Caps::default()
        };
        let src = source(&sig(DType::BF16, 256, 4), caps).unwrap();
        let kernel = &src[src.find("@compute").unwrap()..];
        assert_eq!(kernel.matches("div_f32(").count(), 1, "{kernel}");
        assert!(
            kernel.contains("round_bf16(fma(fma(-q0, x2, x0), rs, q0))"),
            "{kernel}"
        );
        // Without a fused fma, or for log-softmax, core's expression as it is.
        let plain = source(&sig(DType::F32, 256, 4), Caps::default()).unwrap();
        assert!(!plain.contains("fma(fma("), "{plain}");
    }

    #[test]
    fn a_long_row_is_read_in_each_pass_and_a_short_one_by_one_invocation() {
        let src = source(&sig(DType::F32, 256, 0), Caps::default()).unwrap();
        assert_eq!(src.matches("bitcast<f32>(b1[").count(), 3, "{src}");
        let short = source(&sig(DType::F16, 1, 8), Caps::default()).unwrap();
        assert!(!short.contains("workgroupBarrier"), "{short}");
        assert!(short.contains("var sum: f32"), "{short}");
        assert!(short.contains("atomicOr(&b0"), "{short}");
    }
}
