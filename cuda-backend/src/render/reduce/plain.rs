//! A reduction's kernel, `strata_reduce`: each output reduced by its group, a long reduction
//! in slices whose partials a combine launch reduces.

use super::parts::{block_combine, contribution, declare_map_operands, decode_output, warp_reduce};
use super::parts::{identity, repr, update, Words};
use super::ReduceSig;
use crate::render::{
    cast, compute_type, from_storage, index_type, storage_type, to_storage, vector_type,
};
use std::fmt::Write;
use strata_core::{DType, Result};

/// The CUDA C source of a reduce kernel named `strata_reduce`.
pub(crate) fn source(sig: &ReduceSig) -> Result<String> {
    let idx = index_type(sig.wide);
    let r = repr(sig.op, sig.acc);
    let acc_t = compute_type(r);
    let (ro, rr, g, v) = (sig.outer_rank, sig.reduced_rank, sig.group, sig.vector);
    let w = Words::of(sig);
    let (red_shape, in_ptr, in_red, out_ptr, part) =
        (w.red_shape, w.in_ptr, w.in_red, w.out_ptr, w.part);
    let total = w.total;
    let in_t = storage_type(sig.input);

    let convert = |value: &str, from: DType| contribution(sig, value, from);

    let mut s = String::new();
    let _ = writeln!(
        s,
        "extern \"C\" __global__ void strata_reduce(const Args<{total}> p) {{"
    );
    let _ = writeln!(s, "  const {idx} O = ({idx})p.w[0], R = ({idx})p.w[1], S = ({idx})p.w[2], chunk = ({idx})p.w[3];");
    let _ = writeln!(s, "  const {in_t}* in = (const {in_t}*)p.w[{in_ptr}];");
    if let Some(m) = &sig.map {
        let _ = writeln!(s, "  const {in_t}* in0 = in;");
        declare_map_operands(&mut s, m, &w);
        if sig.stores_map {
            let t = storage_type(m.expr.dtype);
            let _ = writeln!(s, "  {t}* stored = ({t}*)p.w[{}];", w.stored);
        }
    }
    let out_t = storage_type(sig.out);
    let _ = writeln!(s, "  {out_t}* out = ({out_t}*)p.w[{out_ptr}];");
    let part_t = storage_type(r);
    let _ = writeln!(s, "  {part_t}* part = ({part_t}*)p.w[{part}];");
    let _ = writeln!(s, "  i64* part_idx = (i64*)p.w[{}];", part + 1);
    let _ = writeln!(s, "  const i64* in_idx = (const i64*)p.w[{}];", part + 2);
    let _ = writeln!(s, "  const int lane = threadIdx.x % {g};");
    if g == 256 {
        let _ = writeln!(
            s,
            "  __shared__ {acc_t} sh_v[8];\n  __shared__ i64 sh_i[8];"
        );
    }
    let _ = writeln!(
        s,
        "  const {idx} groups = (({idx})gridDim.x * blockDim.x) / {g};"
    );
    let _ = writeln!(
        s,
        "  for ({idx} g = (({idx})blockIdx.x * blockDim.x + threadIdx.x) / {g}; g < O * S; g += groups) {{"
    );
    let _ = writeln!(s, "    const {idx} o = g % O, s = g / O;");
    decode_output(&mut s, idx, ro, &w);
    let _ = writeln!(
        s,
        "    {acc_t} acc = {};\n    i64 best = 9223372036854775807ll;",
        identity(sig.op, r)
    );
    let _ = writeln!(s, "    const {idx} r0 = s * chunk;");
    let _ = writeln!(s, "    const {idx} r1 = (R - r0 < chunk) ? R : r0 + chunk;");
    // Folds the element whose input `k` is stored at `at(k)`, found at position `i` (and at
    // offset `stored_at` from input 0's pointer, where the map is stored too).
    let mut next = 0;
    let mut step = |s: &mut String,
                    indent: &str,
                    at: &dyn Fn(usize) -> String,
                    i: &str,
                    stored_at: &str| {
        let _ = writeln!(s, "{indent}{{");
        let value = match &sig.map {
            _ if sig.combine => from_storage(r, &at(0)),
            None => convert(&from_storage(sig.input, &at(0)), sig.input),
            Some(m) => {
                for (k, &d) in m.inputs.iter().enumerate() {
                    let at = if m.per_output[k] {
                        format!("in{k}[ob]")
                    } else if m.per_position[k] {
                        // (The element's position along the reduced axes: a row of them, read
                        // by every output from cache.)
                        format!("in{k}[{i}]")
                    } else {
                        at(k)
                    };
                    let _ = writeln!(
                        s,
                        "{indent}  const {} x{k} = {};",
                        compute_type(d),
                        from_storage(d, &at)
                    );
                }
                let name =
                    crate::render::expr::emit_tree(&m.expr, s, &format!("{indent}  "), &mut next)?;
                if sig.stores_map {
                    let value = to_storage(m.expr.dtype, &name);
                    let _ = writeln!(s, "{indent}  stored[{stored_at}] = {value};");
                }
                convert(&name, m.expr.dtype)
            }
        };
        let _ = writeln!(s, "{indent}  const {acc_t} v = {value};");
        let _ = writeln!(s, "{indent}  {} }}", update(sig.op, r, "v", i));
        Ok::<(), strata_core::Error>(())
    };
    let inputs = sig.map.as_ref().map_or(1, |m| m.inputs.len());
    let name = |k: usize| {
        if sig.map.is_some() {
            format!("in{k}")
        } else {
            "in".into()
        }
    };
    // Vector loads of every input laid out like input 0 at `base`.
    let vector_loads = |s: &mut String, indent: &str, base: &str| {
        let vt = vector_type(v * sig.input.itemsize());
        for k in 0..inputs {
            let t = match &sig.map {
                Some(m) if m.per_output[k] || m.per_position[k] => continue,
                Some(m) => storage_type(m.inputs[k]),
                None => in_t,
            };
            let _ = writeln!(
                s,
                "{indent}union {{ {vt} v; {t} e[{v}]; }} u{k}; u{k}.v = *(const {vt}*)({} + {base});",
                name(k)
            );
        }
    };
    if rr > 1 && g > 1 {
        // Rows (the plan's promise for a group over several reduced axes): the innermost
        // reduced axis is contiguous and the range holds whole rows of it, so the group reads
        // each row together, `v` elements a load, and finds a row's offset once.
        let _ = writeln!(
            s,
            "    const {idx} inner = ({idx})p.w[{}];",
            red_shape + rr - 1
        );
        let _ = writeln!(
            s,
            "    for ({idx} row = r0 / inner; row < r1 / inner; row++) {{"
        );
        reduced_offset(&mut s, idx, "row", rr - 1, red_shape, in_red);
        let _ = writeln!(s, "      const {idx} at = row * inner;");
        let mut tail = "0".to_string();
        if v > 1 {
            let _ = writeln!(s, "      const {idx} cv = (inner / {v}) * {v};");
            let _ = writeln!(
                s,
                "      for ({idx} c = lane * {v}; c < cv; c += {g} * {v}) {{"
            );
            vector_loads(&mut s, "        ", "off + c");
            let _ = writeln!(s, "#pragma unroll\n        for (int l = 0; l < {v}; l++)");
            step(
                &mut s,
                "        ",
                &|k| format!("u{k}.e[l]"),
                "(i64)(at + c + l)",
                "off + c + l",
            )?;
            let _ = writeln!(s, "      }}");
            tail = "cv".into();
        }
        let _ = writeln!(
            s,
            "      for ({idx} c = {tail} + lane; c < inner; c += {g})"
        );
        step(
            &mut s,
            "        ",
            &|k| format!("{}[off + c]", name(k)),
            "(i64)(at + c)",
            "off + c",
        )?;
        let _ = writeln!(s, "    }}");
    } else if v > 1 {
        let _ = writeln!(s, "    const {idx} rv = r0 + ((r1 - r0) / {v}) * {v};");
        let _ = writeln!(
            s,
            "    for ({idx} r = r0 + lane * {v}; r < rv; r += {g} * {v}) {{"
        );
        vector_loads(&mut s, "      ", "ib + r");
        let _ = writeln!(s, "#pragma unroll\n      for (int l = 0; l < {v}; l++)");
        step(
            &mut s,
            "      ",
            &|k| format!("u{k}.e[l]"),
            "(i64)(r + l)",
            "ib + r + l",
        )?;
        let _ = writeln!(s, "    }}");
        let _ = writeln!(s, "    for ({idx} r = rv + lane; r < r1; r += {g})");
        step(
            &mut s,
            "      ",
            &|k| format!("{}[ib + r]", name(k)),
            "(i64)r",
            "ib + r",
        )?;
    } else {
        let _ = writeln!(s, "    for ({idx} r = r0 + lane; r < r1; r += {g}) {{");
        reduced_offset(&mut s, idx, "r", rr, red_shape, in_red);
        let i = if sig.combine { "in_idx[off]" } else { "(i64)r" };
        step(&mut s, "      ", &|k| format!("{}[off]", name(k)), i, "off")?;
        let _ = writeln!(s, "    }}");
    }
    if g >= 32 {
        warp_reduce(&mut s, "    ", sig.op, r);
    }
    if g == 256 {
        block_combine(&mut s, "    ", sig.op, r, "(threadIdx.x & 31) == 0");
    }
    let result = if sig.op.returns_index() {
        cast("best", DType::I64, sig.out, false)
    } else {
        cast("acc", r, sig.out, false)
    };
    let _ = writeln!(s, "    if (lane == 0 && threadIdx.x % {g} == 0) {{");
    let _ = writeln!(
        s,
        "      if (S == 1) out[ob] = {};",
        to_storage(sig.out, &result)
    );
    // Indices travel only for arg reductions (the index buffer is empty otherwise).
    let keep_index = if sig.op.returns_index() {
        " part_idx[o * S + s] = best;"
    } else {
        ""
    };
    let _ = writeln!(
        s,
        "      else {{ part[o * S + s] = {};{keep_index} }}",
        to_storage(r, "acc")
    );
    let _ = writeln!(s, "    }}");
    if g == 256 {
        let _ = writeln!(s, "    __syncthreads();");
    }
    let _ = writeln!(s, "  }}\n}}");
    Ok(s)
}

/// `off`: the input offset (from `ib`) of position `pos` over the first `axes` reduced axes,
/// whose extents and strides are argument words from `red_shape` and `in_red`. What is left
/// after the inner axes is below the outermost extent: no division for it, so a single strided
/// axis (a sum along axis 0) reads without one per element.
fn reduced_offset(
    s: &mut String,
    idx: &str,
    pos: &str,
    axes: usize,
    red_shape: usize,
    in_red: usize,
) {
    let _ = writeln!(s, "      {idx} off = ib, rr = {pos};");
    for d in (1..axes).rev() {
        let _ = writeln!(
            s,
            "      {{ const {idx} c = rr % ({idx})p.w[{}]; rr /= ({idx})p.w[{}]; off += c * ({idx})(i64)p.w[{}]; }}",
            red_shape + d,
            red_shape + d,
            in_red + d
        );
    }
    let _ = writeln!(s, "      off += rr * ({idx})(i64)p.w[{in_red}];");
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_core::ir::Expr;
    use strata_core::ir::ReduceOp;
    use strata_core::lower::operands::ReduceMap;

    fn sig(op: ReduceOp, group: usize, vector: usize) -> ReduceSig {
        ReduceSig {
            op,
            input: DType::F32,
            acc: DType::F32,
            out: DType::F32,
            outer_rank: 1,
            reduced_rank: 1,
            group,
            vector,
            wide: false,
            combine: false,
            map: None,
            prologue: None,
            epilogue: None,
            held: false,
            stores_map: false,
            out_vector: 1,
        }
    }

    #[test]
    fn a_fused_map_loads_every_input_and_computes_the_element() {
        use strata_core::ir::BinaryOp;
        let x = |k| Expr::input(k, DType::F32);
        let mut s = sig(ReduceOp::Sum, 32, 4);
        // sum(in0 * in1 - in2), in2 one value per output
        s.map = Some(ReduceMap {
            expr: Expr::binary(BinaryOp::Sub, Expr::binary(BinaryOp::Mul, x(0), x(1)), x(2)),
            inputs: vec![DType::F32; 3],
            per_output: vec![false, false, true],
            per_position: vec![false; 3],
            scalars: vec![],
        });
        let src = source(&s).unwrap();
        assert!(
            src.contains("u1.v = *(const uint4*)(in1 + ib + r);"),
            "{src}"
        );
        assert!(src.contains("const float x1 = u1.e[l];"), "{src}");
        assert!(src.contains("const float x1 = in1[ib + r];"), "{src}");
        assert!(
            src.contains("const float x2 = in2[ob];") && !src.contains("u2"),
            "{src}"
        );
    }

    /// `sum(in0 * in1)` over `rank` reduced axes by groups of `group` in vectors of `vector`,
    /// `in1` one value per position along the reduced axes where `at_position`.
    fn product_sum(group: usize, vector: usize, rank: usize, at_position: bool) -> ReduceSig {
        use strata_core::ir::BinaryOp;
        let x = |k| Expr::input(k, DType::F32);
        let mut s = sig(ReduceOp::Sum, group, vector);
        s.reduced_rank = rank;
        s.map = Some(ReduceMap {
            expr: Expr::binary(BinaryOp::Mul, x(0), x(1)),
            inputs: vec![DType::F32; 2],
            per_output: vec![false, false],
            per_position: vec![false, at_position],
            scalars: vec![],
        });
        s
    }

    #[test]
    fn an_input_of_one_value_a_position_is_read_at_the_elements_position() {
        let with_map =
            |group, vector, rank| source(&product_sum(group, vector, rank, true)).unwrap();
        // A column, a row in vectors and its tail, rows of several axes.
        let column = with_map(1, 1, 1);
        assert!(column.contains("const float x1 = in1[(i64)r];"), "{column}");
        let row = with_map(32, 4, 1);
        assert!(row.contains("const float x1 = in1[(i64)(r + l)];"), "{row}");
        assert!(row.contains("const float x1 = in1[(i64)r];"), "{row}");
        assert!(!row.contains("u1"), "no vector loads of it: {row}");
        let rows = with_map(256, 4, 2);
        assert!(rows.contains("in1[(i64)(at + c + l)]"), "{rows}");
        assert!(rows.contains("in1[(i64)(at + c)]"), "{rows}");
    }

    #[test]
    fn a_stored_map_is_written_where_each_path_computes_it() {
        let stored = |group, vector, rank| {
            let mut s = product_sum(group, vector, rank, false);
            s.stores_map = true;
            source(&s).unwrap()
        };
        // A column (a thread per output), a row in vectors, rows of several axes.
        let column = stored(1, 1, 1);
        assert!(
            column.contains("float* stored = (float*)p.w[15];"),
            "{column}"
        );
        assert!(column.contains("stored[off] = "), "{column}");
        let row = stored(32, 4, 1);
        assert!(row.contains("stored[ib + r + l] = ") && row.contains("stored[ib + r] = "));
        let rows = stored(256, 4, 2);
        assert!(rows.contains("stored[off + c + l] = ") && rows.contains("stored[off + c] = "));
        // Without it, nothing is stored.
        assert!(!source(&product_sum(1, 1, 1, false))
            .unwrap()
            .contains("stored"));
    }

    #[test]
    fn a_strided_reduced_axis_is_read_without_a_division_per_element() {
        let src = source(&sig(ReduceOp::Max, 1, 1)).unwrap();
        let inner = src.split("for (i32 r = ").nth(1).unwrap();
        let inner = inner.split("in[off]").next().unwrap();
        assert!(!inner.contains('%') && !inner.contains("/="), "{src}");
        assert!(inner.contains("off += rr * (i32)(i64)p.w[8];"), "{src}");
    }

    #[test]
    fn a_group_over_several_reduced_axes_reads_rows_with_vectors() {
        let mut s = sig(ReduceOp::Sum, 32, 4);
        s.reduced_rank = 2;
        let src = source(&s).unwrap();
        assert!(
            src.contains("for (i32 row = r0 / inner; row < r1 / inner; row++)"),
            "{src}"
        );
        assert!(
            src.contains("u0.v = *(const uint4*)(in + off + c);"),
            "{src}"
        );
        assert!(
            src.contains("for (i32 c = cv + lane; c < inner; c += 32)"),
            "{src}"
        );
    }

    #[test]
    fn a_block_group_combines_through_shared_memory() {
        let src = source(&sig(ReduceOp::Sum, 256, 4)).unwrap();
        assert!(src.contains("__shared__ float sh_v[8];"), "{src}");
        assert!(src.contains("uint4"));
    }

    #[test]
    fn arg_reductions_track_the_first_best_index() {
        let src = source(&sig(ReduceOp::ArgMax, 1, 1)).unwrap();
        assert!(src.contains("best = (i64)r;"), "{src}");
    }

    #[test]
    fn accumulators_follow_the_op() {
        assert_eq!(repr(ReduceOp::Sum, DType::I32), DType::I64);
        assert_eq!(repr(ReduceOp::Max, DType::BF16), DType::F32);
        assert_eq!(repr(ReduceOp::Any, DType::Bool), DType::Bool);
    }
}
