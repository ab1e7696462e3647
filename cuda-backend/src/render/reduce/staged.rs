//! A reduction with a row prologue ([`RowPrologue`](strata_core::ir::RowPrologue)) in one kernel: `(x - x.max(-1, true))
//! .exp().sum(-1)` reads each row of `x` once. A block of
//! [`STAGE_GROUP`](crate::render::softmax::STAGE_GROUP) threads copies the row into dynamic shared
//! memory, folds the prologue (an order-free op: any order gives the eager value) and writes it,
//! computes every element's term in place (what the eager kernel adds: the map's value
//! converted to the accumulator), and then its first `group` threads add the terms exactly as
//! the eager plan's group would (the same lanes, positions, order and combining tree), so the
//! result equals the two launches bit for bit. Rows of whole vectors that fit the staging
//! bytes, with terms as wide as the elements (f32, f64), and one eager launch; any other
//! reduction runs as the two launches (`strata_core::lower::prologue::split`).

use super::parts::{block_combine, contribution, declare_map_operands, decode_output};
use super::parts::{identity, repr, update, warp_reduce, Words};
use super::ReduceSig;
use crate::render::softmax::STAGE_GROUP;
use crate::render::{
    cast, compute_type, from_storage, index_type, storage_type, to_storage, vector_type,
};
use std::fmt::Write;
use strata_core::Result;

/// Blocks of a staged row per multiprocessor: the softmax's measured three.
const STAGE_BLOCKS: usize = 3;

/// The CUDA C source of a staged reduction with a prologue, named `strata_reduce`. Its words
/// are the eager launch's (`reduce::source`), then output 1's pointer.
pub(crate) fn source(sig: &ReduceSig) -> Result<String> {
    let (Some(prologue), Some(m)) = (sig.prologue, sig.map.as_ref()) else {
        return Err(strata_core::Error::Backend(
            "internal error: a staged reduction has a prologue and a map".into(),
        ));
    };
    let idx = index_type(sig.wide);
    let (ro, g, v) = (sig.outer_rank, sig.group, sig.vector);
    let r = repr(sig.op, sig.acc);
    let pr = repr(prologue.op, prologue.out);
    let (acc_t, pr_t, in_t) = (compute_type(r), compute_type(pr), storage_type(sig.input));
    let vt = vector_type(v * sig.input.itemsize());
    // The eager launch's words, then output 1's pointer (and an epilogue's output's).
    let w = Words::of(sig);
    let epilogue_ptr = w.total + 1;
    let (prologue_ptr, total) = (w.total, epilogue_ptr + usize::from(sig.epilogue.is_some()));
    let warps = STAGE_GROUP / 32;

    let mut s = String::new();
    let _ = writeln!(
        s,
        "extern \"C\" __global__ void __launch_bounds__({STAGE_GROUP}, {STAGE_BLOCKS}) \
         strata_reduce(const Args<{total}> p) {{"
    );
    let _ = writeln!(
        s,
        "  const {idx} O = ({idx})p.w[0], R = ({idx})p.w[1], S = ({idx})p.w[2], chunk = ({idx})p.w[3];"
    );
    let _ = writeln!(s, "  const {in_t}* in0 = (const {in_t}*)p.w[{}];", w.in_ptr);
    declare_map_operands(&mut s, m, &w);
    let (out_t, prologue_st) = (storage_type(sig.out), storage_type(prologue.out));
    let _ = writeln!(s, "  {out_t}* out = ({out_t}*)p.w[{}];", w.out_ptr);
    let _ = writeln!(
        s,
        "  {prologue_st}* prologue_out = ({prologue_st}*)p.w[{prologue_ptr}];"
    );
    if let Some(e) = &sig.epilogue {
        let t = storage_type(e.out);
        let _ = writeln!(s, "  {t}* epilogue_out = ({t}*)p.w[{epilogue_ptr}];");
    }
    // The row, then (in place, as wide) the terms the eager kernel adds.
    let _ = writeln!(s, "  extern __shared__ {vt} rowbuf[];");
    // (`sh_part`: a range's partial; the eager plan splits into fewer than 64, as its
    // one-thread combine requires.)
    let _ = writeln!(
        s,
        "  __shared__ {pr_t} sh_p[{warps}];\n  __shared__ {acc_t} sh_v[8];\n  __shared__ i64 sh_i[8];\n  __shared__ {acc_t} sh_part[64];"
    );
    let _ = writeln!(
        s,
        "  const int warp = threadIdx.x >> 5, wl = threadIdx.x & 31;"
    );
    let _ = writeln!(s, "  for ({idx} o = blockIdx.x; o < O; o += gridDim.x) {{");
    decode_output(&mut s, idx, ro, &w);
    // 1. The row into shared memory, its loads in flight together, each thread folding the
    // prologue over its vectors as they arrive (in any order: the op is order-free).
    let _ = writeln!(s, "    {prologue_st} kept;");
    let _ = writeln!(s, "    {{");
    let _ = writeln!(
        s,
        "      {pr_t} acc = {}; i64 best = 9223372036854775807ll;",
        identity(prologue.op, pr)
    );
    let _ = writeln!(
        s,
        "#pragma unroll 8\n      for ({idx} r = ({idx})threadIdx.x * {v}; r < R; r += {STAGE_GROUP} * {v}) {{"
    );
    let _ = writeln!(
        s,
        "        union {{ {vt} v; {in_t} e[{v}]; }} u; u.v = *(const {vt}*)(in0 + ib + r); rowbuf[r / {v}] = u.v;"
    );
    let _ = writeln!(
        s,
        "#pragma unroll\n        for (int l = 0; l < {v}; l++) {{ const {pr_t} v = {}; {} }}\n      }}",
        cast(&from_storage(sig.input, "u.e[l]"), sig.input, pr, false),
        update(prologue.op, pr, "v", "0")
    );
    // 2. The prologue of the row: every thread ends with it.
    warp_reduce(&mut s, "      ", prologue.op, pr);
    let _ = writeln!(
        s,
        "      if (wl == 0) sh_p[warp] = acc;\n      __syncthreads();"
    );
    let _ = writeln!(
        s,
        "      acc = sh_p[0];\n      for (int w = 1; w < {warps}; w++) {{ const {pr_t} v = sh_p[w]; {} }}",
        update(prologue.op, pr, "v", "0")
    );
    let stored = to_storage(prologue.out, &cast("acc", pr, prologue.out, false));
    let _ = writeln!(
        s,
        "      const {prologue_st} stored = {stored}; kept = stored;"
    );
    let _ = writeln!(s, "      if (threadIdx.x == 0) prologue_out[ob] = stored;");
    // 3. Each element's term, as the eager kernel computes it (the prologue read back as stored).
    let res = prologue.result;
    let _ = writeln!(
        s,
        "      const {} x{res} = {};",
        compute_type(prologue.out),
        from_storage(prologue.out, "stored")
    );
    // Each thread its own vectors: one shared-memory load and store a vector.
    let _ = writeln!(
        s,
        "      for ({idx} r = ({idx})threadIdx.x * {v}; r < R; r += {STAGE_GROUP} * {v}) {{"
    );
    let _ = writeln!(
        s,
        "        union {{ {vt} v; {in_t} e[{v}]; }} u; u.v = rowbuf[r / {v}];\n        union {{ {vt} v; {acc_t} e[{v}]; }} t;"
    );
    let _ = writeln!(
        s,
        "#pragma unroll\n        for (int l = 0; l < {v}; l++) {{"
    );
    for (k, &d) in m.inputs.iter().enumerate() {
        let at = match k {
            0 => "u.e[l]".to_string(),
            // (Inputs only the epilogue reads are not loaded here.)
            _ if k == res || !m.expr.reads_input(k) => continue,
            _ if m.per_output[k] => format!("in{k}[ob]"),
            _ => format!("in{k}[ib + r + l]"),
        };
        let _ = writeln!(
            s,
            "          const {} x{k} = {};",
            compute_type(d),
            from_storage(d, &at)
        );
    }
    let mut next = 0;
    let name = crate::render::expr::emit_tree(&m.expr, &mut s, "          ", &mut next)?;
    let _ = writeln!(
        s,
        "          t.e[l] = {};\n        }}\n        rowbuf[r / {v}] = t.v;\n      }}\n    }}",
        contribution(sig, &name, m.expr.dtype)
    );
    let _ = writeln!(s, "    __syncthreads();");
    // 4. The eager order: per range of the row (one unless the eager plan splits it), the
    // threads below the group are its lanes (`reduce::source`), a warp's ranges side by side
    // (each its own warp); then one thread adds the ranges' partials in order (the combine
    // launch's fold; a single range is the result).
    let (first, step) = if g == 32 {
        ("warp", format!("{warps}"))
    } else {
        ("0", "1".to_string())
    };
    let _ = writeln!(s, "    for ({idx} sp = {first}; sp < S; sp += {step}) {{");
    let _ = writeln!(
        s,
        "      const {idx} r0 = sp * chunk, r1 = (R - r0 < chunk) ? R : r0 + chunk;"
    );
    let _ = writeln!(
        s,
        "      {acc_t} acc = {}; i64 best = 9223372036854775807ll;",
        identity(sig.op, r)
    );
    let lane = if g == 32 { "wl" } else { "threadIdx.x" };
    let _ = writeln!(s, "      if ({lane} < {g}) {{");
    let _ = writeln!(
        s,
        "#pragma unroll 4\n        for ({idx} r = r0 + ({idx}){lane} * {v}; r < r1; r += {g} * {v}) {{"
    );
    // (A vector of terms at once: lanes `v` elements apart would share banks.)
    let _ = writeln!(
        s,
        "          union {{ {vt} v; {acc_t} e[{v}]; }} u; u.v = rowbuf[r / {v}];"
    );
    let _ = writeln!(
        s,
        "#pragma unroll\n          for (int l = 0; l < {v}; l++) {{ const {acc_t} v = u.e[l]; {} }}",
        update(sig.op, r, "v", "(i64)(r + l)")
    );
    let _ = writeln!(s, "        }}\n      }}");
    warp_reduce(&mut s, "      ", sig.op, r);
    if g == 256 {
        block_combine(&mut s, "      ", sig.op, r, "wl == 0 && warp < 8");
        // (The next range writes `sh_v` again.)
        let _ = writeln!(s, "      __syncthreads();");
    }
    let lead = if g == 32 {
        "wl == 0"
    } else {
        "threadIdx.x == 0"
    };
    let _ = writeln!(
        s,
        "      if ({lead}) sh_part[sp] = {};\n    }}",
        from_storage(r, &to_storage(r, "acc"))
    );
    let _ = writeln!(s, "    __syncthreads();");
    let _ = writeln!(s, "    {acc_t} comb = sh_part[0];");
    let fold = update(sig.op, r, "v", "0").replace("acc", "comb");
    let _ = writeln!(
        s,
        "    if (S > 1) {{ comb = {}; for ({idx} sp = 0; sp < S; sp++) {{ const {acc_t} v = sh_part[sp]; {fold} }} }}",
        identity(sig.op, r)
    );
    let result = cast("comb", r, sig.out, false);
    let _ = writeln!(
        s,
        "    const {out_t} result = {};\n    if (threadIdx.x == 0) out[ob] = result;",
        to_storage(sig.out, &result)
    );
    if let Some(e) = &sig.epilogue {
        epilogue(&mut s, sig, e, idx, m)?;
    }
    // The next row overwrites the stage.
    let _ = writeln!(s, "    __syncthreads();\n  }}\n}}");
    Ok(s)
}

/// Step 5, the epilogue: each element of the row once more, with the prologue's and the
/// reduction's results as stored, in registers; each thread its own vectors, written whole
/// (core's plan aligned the output's rows). Where the epilogue reads the map's value itself
/// (`exp(x - m) / s` holds `exp(x - m)`), that value is the stage's term (the map's value as
/// the accumulator holds it, of the same width: exact), read from shared memory; the row is
/// read again (from L2) only where the epilogue still reads input 0 outside it.
fn epilogue(
    s: &mut String,
    sig: &ReduceSig,
    e: &super::StagedEpilogue,
    idx: &str,
    m: &strata_core::lower::operands::ReduceMap,
) -> Result<()> {
    let Some(prologue) = sig.prologue else {
        return Err(strata_core::Error::Backend(
            "internal error: a staged epilogue follows a prologue".into(),
        ));
    };
    let v = sig.vector;
    let in_t = storage_type(sig.input);
    let vt = vector_type(v * sig.input.itemsize());
    let (res, pres) = (e.result, prologue.result);
    // The map's value, wherever the epilogue computes it, is the term (input `term`) where the
    // accumulator holds it in its own dtype.
    let term = m.inputs.len();
    let expr = if m.expr.dtype == repr(sig.op, sig.acc) {
        with_term(&e.expr, &m.expr, term)
    } else {
        e.expr.clone()
    };
    let _ = writeln!(
        s,
        "    const {} x{res} = {};\n    const {} x{pres} = {};",
        compute_type(sig.out),
        from_storage(sig.out, "result"),
        compute_type(prologue.out),
        from_storage(prologue.out, "kept")
    );
    let out_st = storage_type(e.out);
    let _ = writeln!(
        s,
        "    for ({idx} r = ({idx})threadIdx.x * {v}; r < R; r += {STAGE_GROUP} * {v}) {{"
    );
    if expr.reads_input(0) {
        let _ = writeln!(
            s,
            "      union {{ {vt} v; {in_t} e[{v}]; }} u; u.v = *(const {vt}*)(in0 + ib + r);"
        );
    }
    if expr.reads_input(term) {
        let acc_t = compute_type(repr(sig.op, sig.acc));
        let _ = writeln!(
            s,
            "      union {{ {vt} v; {acc_t} e[{v}]; }} t; t.v = rowbuf[r / {v}];"
        );
    }
    let ovt = vector_type(v * e.out.itemsize());
    let _ = writeln!(s, "      union {{ {ovt} v; {out_st} e[{v}]; }} y;");
    let _ = writeln!(s, "#pragma unroll\n      for (int l = 0; l < {v}; l++) {{");
    for (k, &d) in m.inputs.iter().enumerate() {
        let at = match k {
            _ if k == res || k == pres || !expr.reads_input(k) => continue,
            0 => "u.e[l]".to_string(),
            _ if m.per_output[k] => format!("in{k}[ob]"),
            _ => format!("in{k}[ib + r + l]"),
        };
        let _ = writeln!(
            s,
            "        const {} x{k} = {};",
            compute_type(d),
            from_storage(d, &at)
        );
    }
    if expr.reads_input(term) {
        let _ = writeln!(
            s,
            "        const {} x{term} = t.e[l];",
            compute_type(m.expr.dtype)
        );
    }
    let mut next = 0;
    let name = crate::render::expr::emit_tree(&expr, s, "        ", &mut next)?;
    let value = to_storage(e.out, &name);
    let _ = writeln!(
        s,
        "        y.e[l] = {value};\n      }}\n      *({ovt}*)(epilogue_out + ib + r) = y.v;\n    }}"
    );
    Ok(())
}

/// `e` with every subtree equal to `map` read as input `term` instead.
fn with_term(
    e: &strata_core::ir::Expr,
    map: &strata_core::ir::Expr,
    term: usize,
) -> strata_core::ir::Expr {
    if e == map {
        return strata_core::ir::Expr::input(term, map.dtype);
    }
    e.map_children(|c| with_term(c, map, term))
}

#[cfg(test)]
mod tests {
    use super::super::StagedPrologue;
    use super::*;
    use strata_core::ir::BinaryOp;
    use strata_core::ir::Expr;
    use strata_core::ir::ReduceOp;
    use strata_core::ir::UnaryOp;
    use strata_core::lower::operands::ReduceMap;
    use strata_core::DType;

    fn sig(group: usize) -> ReduceSig {
        let x = |k| Expr::input(k, DType::F32);
        ReduceSig {
            op: ReduceOp::Sum,
            input: DType::F32,
            acc: DType::F32,
            out: DType::F32,
            outer_rank: 1,
            reduced_rank: 1,
            group,
            vector: 4,
            wide: false,
            combine: false,
            map: Some(ReduceMap {
                expr: Expr::unary(UnaryOp::Exp, Expr::binary(BinaryOp::Sub, x(0), x(1))),
                inputs: vec![DType::F32; 2],
                per_output: vec![false, true],
                scalars: vec![],
            }),
            prologue: Some(StagedPrologue {
                op: ReduceOp::Max,
                result: 1,
                out: DType::F32,
            }),
            epilogue: None,
        }
    }

    #[test]
    fn the_row_is_staged_once_and_the_terms_are_added_in_the_eager_lanes_order() {
        let src = source(&sig(32)).unwrap();
        assert!(src.contains("extern __shared__ uint4 rowbuf[];"), "{src}");
        assert_eq!(src.matches("*(const uint4*)(in0").count(), 1, "{src}");
        // The prologue's result is read from the register, never from its buffer.
        assert!(src.contains("const float x1 = stored;"), "{src}");
        assert!(!src.contains("in1["), "{src}");
        assert!(src.contains("r += 32 * 4"), "{src}");
        assert!(src.contains("comb = comb + v;"), "{src}");
        assert!(!src.contains("sh_v[threadIdx.x >> 5] = acc"), "{src}");
        let block = source(&sig(256)).unwrap();
        assert!(block.contains("sh_v[threadIdx.x >> 5] = acc"), "{block}");
    }

    #[test]
    fn an_epilogue_reads_the_row_again_with_both_results_in_registers() {
        // Softmax from its primitives: `exp(x - m) / s`, the sum read through input 2.
        let x = |k| Expr::input(k, DType::F32);
        let mut sig = sig(256);
        if let Some(m) = sig.map.as_mut() {
            m.inputs.push(DType::F32);
            m.per_output.push(true);
        }
        let term = Expr::unary(UnaryOp::Exp, Expr::binary(BinaryOp::Sub, x(0), x(1)));
        sig.epilogue = Some(super::super::StagedEpilogue {
            expr: Expr::binary(BinaryOp::Div, term, x(2)),
            result: 2,
            out: DType::F32,
        });
        let src = source(&sig).unwrap();
        let tail = &src[src.find("const float x2 = result;").expect(&src)..];
        // The maximum and the sum as stored, never read from their buffers; the terms read
        // from the stage (the row is not read again) and the output written whole.
        assert!(tail.contains("const float x1 = kept;"), "{tail}");
        assert!(!src.contains("in1[") && !src.contains("in2["), "{src}");
        assert!(tail.contains("t.v = rowbuf[r / 4];"), "{tail}");
        assert!(!tail.contains("in0 + ib + r"), "{tail}");
        assert!(
            tail.contains("*(uint4*)(epilogue_out + ib + r) = y.v;"),
            "{tail}"
        );
        // An epilogue that reads the row outside the term reads it again.
        if let Some(e) = sig.epilogue.as_mut() {
            e.expr = Expr::binary(BinaryOp::Mul, e.expr.clone(), x(0));
        }
        let src = source(&sig).unwrap();
        let tail = &src[src.find("const float x2 = result;").expect(&src)..];
        assert!(
            tail.contains("u.v = *(const uint4*)(in0 + ib + r);"),
            "{tail}"
        );
        // Its output pointer follows the prologue's.
        let w = Words::of(&sig);
        assert!(
            src.contains(&format!("epilogue_out = (float*)p.w[{}];", w.total + 1)),
            "{src}"
        );
    }
}
