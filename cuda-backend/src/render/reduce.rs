//! `Reduce` kernels. Each output element is reduced by a *group* of 1, 32 (a warp, combined
//! with shuffles) or 256 threads (a block, through shared memory); a long reduction is split
//! into slices whose partial results a second, "combine" launch reduces. The group size
//! follows the layout: a contiguous reduced axis gets a warp or a block per output (coalesced
//! reads), a strided one a thread per output (neighbouring outputs are neighbours in memory).
//! Contiguous reduced axes are read 16 bytes at a time, so a short innermost axis (length 4)
//! still streams at full bandwidth.

use super::{
    cast, compute_type, from_storage, index_type, scalar_from_word, storage_type, to_storage,
    vector_type,
};
use super::{Generated, Rendered};
use std::fmt::Write;
use strata_core::ir::ReduceOp;
use strata_core::lower::operands::ReduceMap;
use strata_core::{DType, Result};

/// The structure of a reduce launch.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct ReduceSig {
    pub op: ReduceOp,
    /// The element dtype read (in a combine launch, the partials' dtype).
    pub input: DType,
    pub acc: DType,
    pub out: DType,
    pub outer_rank: usize,
    pub reduced_rank: usize,
    /// Threads per output: 1, 32 or 256.
    pub group: usize,
    /// Elements per vector load (1: none).
    pub vector: usize,
    pub wide: bool,
    /// Reads partials (values and, for arg ops, indices) of an earlier launch.
    pub combine: bool,
    /// Map→reduce fusion: the element is this map over inputs of one layout.
    pub map: Option<ReduceMap>,
    /// A row prologue computed first with each row kept in shared memory (a block of
    /// [`STAGE_GROUP`](super::softmax::STAGE_GROUP) threads a row): see `reduce_prologue`.
    pub prologue: Option<super::reduce_prologue::StagedPrologue>,
}

impl strata_core::lower::cache::Owned for ReduceSig {}

/// The dtype accumulators are held (and partials stored) in.
pub(crate) fn repr(op: ReduceOp, acc: DType) -> DType {
    match op {
        ReduceOp::Sum | ReduceOp::Prod if acc == DType::F64 => DType::F64,
        ReduceOp::Sum | ReduceOp::Prod if acc.is_float() => DType::F32,
        ReduceOp::Sum | ReduceOp::Prod => DType::I64,
        ReduceOp::Any | ReduceOp::All => DType::Bool,
        _ if matches!(acc, DType::F16 | DType::BF16) => DType::F32,
        _ => acc,
    }
}

/// The accumulator's starting value.
pub(crate) fn identity(op: ReduceOp, r: DType) -> String {
    let t = compute_type(r);
    let inf = if r == DType::F64 {
        "__longlong_as_double(0x7ff0000000000000ll)"
    } else {
        "__int_as_float(0x7f800000)"
    };
    match op {
        ReduceOp::Sum => format!("({t})0"),
        ReduceOp::Prod => format!("({t})1"),
        ReduceOp::Any => "false".into(),
        ReduceOp::All => "true".into(),
        ReduceOp::Min | ReduceOp::ArgMin if r.is_float() => inf.into(),
        ReduceOp::Max | ReduceOp::ArgMax if r.is_float() => format!("(-{inf})"),
        ReduceOp::Min | ReduceOp::ArgMin if r == DType::Bool => "true".into(),
        ReduceOp::Max | ReduceOp::ArgMax if r == DType::Bool => "false".into(),
        ReduceOp::Min | ReduceOp::ArgMin => format!("Int<{t}>::max_v"),
        ReduceOp::Max | ReduceOp::ArgMax => format!("Int<{t}>::min_v"),
    }
}

/// Folds value `v` at position `i` into `acc` / `best`.
pub(crate) fn update(op: ReduceOp, r: DType, v: &str, i: &str) -> String {
    let int = !r.is_float() && r != DType::Bool;
    match op {
        ReduceOp::Sum if int => format!("acc = w_add<i64>(acc, {v});"),
        ReduceOp::Prod if int => format!("acc = w_mul<i64>(acc, {v});"),
        ReduceOp::Sum => format!("acc = acc + {v};"),
        ReduceOp::Prod => format!("acc = acc * {v};"),
        // Floats: -0 is below +0 (IEEE 754-2019), so the tree's order does not pick the zero.
        ReduceOp::Min if r.is_float() => format!(
            "if ({v} != {v} || {v} < acc || ({v} == acc && signbit({v}) && !signbit(acc))) acc = {v};"
        ),
        ReduceOp::Max if r.is_float() => format!(
            "if ({v} != {v} || {v} > acc || ({v} == acc && !signbit({v}) && signbit(acc))) acc = {v};"
        ),
        ReduceOp::Min => format!("if ({v} < acc) acc = {v};"),
        ReduceOp::Max => format!("if ({v} > acc) acc = {v};"),
        ReduceOp::ArgMin | ReduceOp::ArgMax => {
            let o = if op == ReduceOp::ArgMin { "<" } else { ">" };
            format!(
                "if (({v} != {v}) ? (acc == acc || {i} < best) : (acc == acc && ({v} {o} acc || ({v} == acc && {i} < best)))) {{ acc = {v}; best = {i}; }}"
            )
        }
        ReduceOp::Any => format!("acc = acc || {v};"),
        ReduceOp::All => format!("acc = acc && {v};"),
    }
}

impl Generated for ReduceSig {
    const NAME: &'static str = "strata_reduce";
    fn render(&self) -> Result<Rendered> {
        Ok(Rendered::single(match self.prologue {
            Some(_) => super::reduce_prologue::source(self)?,
            None => source(self)?,
        }))
    }
}

/// The contribution to `sig`'s accumulator of a compute value `value` of dtype `from`.
pub(crate) fn contribution(sig: &ReduceSig, value: &str, from: DType) -> String {
    let r = repr(sig.op, sig.acc);
    let as_acc = cast(value, from, sig.acc, false);
    match r {
        DType::I64 if matches!(sig.op, ReduceOp::Sum | ReduceOp::Prod) => {
            format!("(i64)({as_acc})")
        }
        _ => cast(value, from, r, false),
    }
}

/// Where a reduce launch's words are, in the order `words` packs them: O, R, S, chunk, the
/// outer and reduced shapes, the input pointer, its outer and reduced strides, the output
/// pointer and strides, the partial values, partial indices and input indices, then a fused
/// map's further input pointers and its scalars.
pub(crate) struct Words {
    pub outer_shape: usize,
    pub red_shape: usize,
    pub in_ptr: usize,
    pub in_outer: usize,
    pub in_red: usize,
    pub out_ptr: usize,
    pub out_strides: usize,
    pub part: usize,
    pub map_ptrs: usize,
    pub map_scalars: usize,
    pub total: usize,
}

impl Words {
    pub(crate) fn of(sig: &ReduceSig) -> Words {
        let (ro, rr) = (sig.outer_rank, sig.reduced_rank);
        let (more, scalars) = sig
            .map
            .as_ref()
            .map_or((0, 0), |m| (m.inputs.len() - 1, m.scalars.len()));
        let in_ptr = 4 + ro + rr;
        let out_ptr = in_ptr + 1 + ro + rr;
        let part = out_ptr + 1 + ro;
        Words {
            outer_shape: 4,
            red_shape: 4 + ro,
            in_ptr,
            in_outer: in_ptr + 1,
            in_red: in_ptr + 1 + ro,
            out_ptr,
            out_strides: out_ptr + 1,
            part,
            map_ptrs: part + 3,
            map_scalars: part + 3 + more,
            total: part + 3 + more + scalars,
        }
    }
}

/// Declares a fused map's further inputs `in1..` and its scalars `s0..`.
pub(crate) fn declare_map_operands(s: &mut String, m: &ReduceMap, w: &Words) {
    for (k, &d) in m.inputs.iter().enumerate().skip(1) {
        let t = storage_type(d);
        let _ = writeln!(
            s,
            "  const {t}* in{k} = (const {t}*)p.w[{}];",
            w.map_ptrs + k - 1
        );
    }
    for (k, &d) in m.scalars.iter().enumerate() {
        let word = format!("p.w[{}]", w.map_scalars + k);
        let _ = writeln!(
            s,
            "  const {} s{k} = {};",
            compute_type(d),
            scalar_from_word(d, &word)
        );
    }
}

/// Output `o`'s position in the input (`ib`) and the output (`ob`), from the outer shape.
pub(crate) fn decode_output(s: &mut String, idx: &str, outer_rank: usize, w: &Words) {
    let _ = writeln!(s, "    {idx} ib = 0, ob = 0, rem = o;");
    for d in (0..outer_rank).rev() {
        let _ = writeln!(
            s,
            "    {{ const {idx} c = rem % ({idx})p.w[{}]; rem /= ({idx})p.w[{}]; ib += c * ({idx})(i64)p.w[{}]; ob += c * ({idx})(i64)p.w[{}]; }}",
            w.outer_shape + d,
            w.outer_shape + d,
            w.in_outer + d,
            w.out_strides + d
        );
    }
}

/// Folds `acc` / `best` (of dtype `d`) across a warp with `op`: lane 0 ends with the warp's.
pub(crate) fn warp_reduce(s: &mut String, indent: &str, op: ReduceOp, d: DType) {
    let _ = writeln!(s, "{indent}for (int d = 16; d > 0; d >>= 1) {{");
    let _ = writeln!(
        s,
        "{indent}  const {} v = shfl_down(acc, d); const i64 bi = shfl_down(best, d);",
        compute_type(d)
    );
    let _ = writeln!(s, "{indent}  {}\n{indent}}}", update(op, d, "v", "bi"));
}

/// A group of 256 threads' fold after each warp's: the first lane of each of the eight warps
/// (those passing `lead`) leaves its value in `sh_v` / `sh_i`, and warp 0 folds them.
pub(crate) fn block_combine(s: &mut String, indent: &str, op: ReduceOp, d: DType, lead: &str) {
    let _ = writeln!(
        s,
        "{indent}if ({lead}) {{ sh_v[threadIdx.x >> 5] = acc; sh_i[threadIdx.x >> 5] = best; }}"
    );
    let _ = writeln!(s, "{indent}__syncthreads();");
    let _ = writeln!(s, "{indent}if (threadIdx.x < 32) {{");
    let _ = writeln!(
        s,
        "{indent}  acc = threadIdx.x < 8 ? sh_v[threadIdx.x] : {}; best = threadIdx.x < 8 ? sh_i[threadIdx.x] : 9223372036854775807ll;",
        identity(op, d)
    );
    warp_reduce(s, &format!("{indent}  "), op, d);
    let _ = writeln!(s, "{indent}}}");
}

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
    // Folds the element whose input `k` is stored at `at(k)`, found at position `i`.
    let mut next = 0;
    let mut step = |s: &mut String, indent: &str, at: &dyn Fn(usize) -> String, i: &str| {
        let _ = writeln!(s, "{indent}{{");
        let value = match &sig.map {
            _ if sig.combine => from_storage(r, &at(0)),
            None => convert(&from_storage(sig.input, &at(0)), sig.input),
            Some(m) => {
                for (k, &d) in m.inputs.iter().enumerate() {
                    let at = if m.per_output[k] {
                        format!("in{k}[ob]")
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
                let name = super::expr::emit_tree(&m.expr, s, &format!("{indent}  "), &mut next)?;
                convert(&name, m.expr.dtype)
            }
        };
        let _ = writeln!(s, "{indent}  const {acc_t} v = {value};");
        let _ = writeln!(s, "{indent}  {} }}", update(sig.op, r, "v", i));
        Ok::<(), strata_core::Error>(())
    };
    let inputs = sig.map.as_ref().map_or(1, |m| m.inputs.len());
    if v > 1 {
        let vt = vector_type(v * sig.input.itemsize());
        let _ = writeln!(s, "    const {idx} rv = r0 + ((r1 - r0) / {v}) * {v};");
        let _ = writeln!(
            s,
            "    for ({idx} r = r0 + lane * {v}; r < rv; r += {g} * {v}) {{"
        );
        for k in 0..inputs {
            let (name, t) = match &sig.map {
                Some(m) if m.per_output[k] => continue,
                Some(m) => (format!("in{k}"), storage_type(m.inputs[k])),
                None => ("in".to_string(), in_t),
            };
            let _ = writeln!(
                s,
                "      union {{ {vt} v; {t} e[{v}]; }} u{k}; u{k}.v = *(const {vt}*)({name} + ib + r);"
            );
        }
        let _ = writeln!(s, "#pragma unroll\n      for (int l = 0; l < {v}; l++)");
        step(&mut s, "      ", &|k| format!("u{k}.e[l]"), "(i64)(r + l)")?;
        let _ = writeln!(s, "    }}");
        let _ = writeln!(s, "    for ({idx} r = rv + lane; r < r1; r += {g})");
        let name = |k: usize| {
            if sig.map.is_some() {
                format!("in{k}")
            } else {
                "in".into()
            }
        };
        step(
            &mut s,
            "      ",
            &|k| format!("{}[ib + r]", name(k)),
            "(i64)r",
        )?;
    } else {
        let _ = writeln!(s, "    for ({idx} r = r0 + lane; r < r1; r += {g}) {{");
        let _ = writeln!(s, "      {idx} off = ib, rr = r;");
        for d in (1..rr).rev() {
            let _ = writeln!(
                s,
                "      {{ const {idx} c = rr % ({idx})p.w[{}]; rr /= ({idx})p.w[{}]; off += c * ({idx})(i64)p.w[{}]; }}",
                red_shape + d,
                red_shape + d,
                in_red + d
            );
        }
        // What is left is below the outermost reduced extent (r < R): no division for it, so
        // a single strided axis (a sum along axis 0) reads without one per element.
        let _ = writeln!(s, "      off += rr * ({idx})(i64)p.w[{in_red}];");
        let i = if sig.combine { "in_idx[off]" } else { "(i64)r" };
        let name = |k: usize| {
            if sig.map.is_some() {
                format!("in{k}")
            } else {
                "in".into()
            }
        };
        step(&mut s, "      ", &|k| format!("{}[off]", name(k)), i)?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use strata_core::ir::Expr;

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

    #[test]
    fn a_strided_reduced_axis_is_read_without_a_division_per_element() {
        let src = source(&sig(ReduceOp::Max, 1, 1)).unwrap();
        let inner = src.split("for (i32 r = ").nth(1).unwrap();
        let inner = inner.split("in[off]").next().unwrap();
        assert!(!inner.contains('%') && !inner.contains("/="), "{src}");
        assert!(inner.contains("off += rr * (i32)(i64)p.w[8];"), "{src}");
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
