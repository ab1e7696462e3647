//! The pieces of CUDA C both reduction kernels write: the accumulator's representation and
//! updates, a map's contribution, the argument words, decoding an output index, and combining
//! a group's partial results.

use super::ReduceSig;
use crate::render::{cast, compute_type, scalar_from_word, storage_type};
use std::fmt::Write;
use strata_core::ir::ReduceOp;
use strata_core::lower::operands::ReduceMap;
use strata_core::DType;

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
/// map's further input pointers and its scalars, and the stored map's output pointer.
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
    /// The stored map's output pointer (`ReduceSig::stores_map`).
    pub stored: usize,
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
            stored: part + 3 + more + scalars,
            total: part + 3 + more + scalars + usize::from(sig.stores_map),
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
