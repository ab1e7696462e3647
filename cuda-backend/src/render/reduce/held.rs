//! A reduction with a row prologue whose rows are held in registers: softmax from its
//! primitives (`e = (x - x.max(-1, true)).exp(); &e / &e.sum(-1, true)`) where the eager sum's
//! plan gives each row a block of 256 in one range. Each thread loads the vectors its eager
//! lane adds (at most [`VECTORS`]) into registers, the block folds the prologue over them,
//! then each thread turns its vectors into the terms in place, adding them in its lane's order
//! (the eager kernel's lanes, order and combining tree: the sum equals the separate launches'
//! bit for bit), and the epilogue reads the terms from the registers. No shared memory holds
//! the row, so no pass over it goes through shared memory; `staged` covers every other shape.

use super::parts::{block_combine, contribution, declare_map_operands, decode_output};
use super::parts::{identity, repr, update, warp_reduce, Words};
use super::staged::{declare_inputs, epilogue_expr, load_row_inputs};
use super::ReduceSig;
use crate::render::{
    cast, compute_type, from_storage, index_type, storage_type, to_storage, vector_type,
};
use std::fmt::Write;
use strata_core::Result;

/// Vectors a thread holds: rows of up to `VECTORS · 256` vectors (16,384 f32).
pub(crate) const VECTORS: usize = 16;

/// Blocks a multiprocessor the kernel's registers are allotted for. Softmax from its
/// primitives over [16384, 16384] f32 on an H200: 0.55–0.56 ms with three (85 registers a
/// thread), 0.64–0.66 with two or one, 1.25–1.30 with four (the row spills); staged in shared
/// memory 0.63–0.66.
const BLOCKS: usize = 3;

/// The CUDA C source of a held-row reduction, named `strata_reduce`; its words are the
/// staged kernel's (the eager launch's, then the prologue's output's pointer and the
/// epilogue's, where there is one).
pub(crate) fn source(sig: &ReduceSig) -> Result<String> {
    let (Some(m), Some(prologue)) = (&sig.map, sig.prologue) else {
        return Err(strata_core::Error::Backend(
            "internal error: a held-row reduction has a map and a prologue".into(),
        ));
    };
    let idx = index_type(sig.wide);
    let (ro, g, v) = (sig.outer_rank, sig.group, sig.vector);
    let r = repr(sig.op, sig.acc);
    let pr = repr(prologue.op, prologue.out);
    let (acc_t, pr_t, in_t) = (compute_type(r), compute_type(pr), storage_type(sig.input));
    let prologue_st = storage_type(prologue.out);
    let vt = vector_type(v * sig.input.itemsize());
    let w = Words::of(sig);
    let epilogue_ptr = w.total + 1;
    let total = epilogue_ptr + usize::from(sig.epilogue.is_some());
    let warps = g / 32;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "extern \"C\" __global__ void __launch_bounds__({g}, {BLOCKS}) strata_reduce(const Args<{total}> p) {{"
    );
    let _ = writeln!(s, "  const {idx} O = ({idx})p.w[0], R = ({idx})p.w[1];");
    let _ = writeln!(s, "  const {in_t}* in0 = (const {in_t}*)p.w[{}];", w.in_ptr);
    declare_map_operands(&mut s, m, &w);
    let out_t = storage_type(sig.out);
    let _ = writeln!(s, "  {out_t}* out = ({out_t}*)p.w[{}];", w.out_ptr);
    let _ = writeln!(
        s,
        "  {prologue_st}* prologue_out = ({prologue_st}*)p.w[{}];",
        w.total
    );
    if let Some(e) = &sig.epilogue {
        let t = storage_type(e.out);
        let _ = writeln!(s, "  {t}* epilogue_out = ({t}*)p.w[{epilogue_ptr}];");
    }
    let _ = writeln!(
        s,
        "  __shared__ {pr_t} sh_p[{warps}];\n  __shared__ {acc_t} sh_v[8];\n  __shared__ i64 sh_i[8];\n  __shared__ {acc_t} sh_sum;"
    );
    let _ = writeln!(
        s,
        "  const int warp = threadIdx.x >> 5, wl = threadIdx.x & 31;"
    );
    let _ = writeln!(s, "  for ({idx} o = blockIdx.x; o < O; o += gridDim.x) {{");
    decode_output(&mut s, idx, ro, &w);
    // Vector `k` of a thread is at `threadIdx.x·v + k·g·v`: its eager lane's `k`-th.
    let each = |s: &mut String, indent: &str| {
        let _ = writeln!(
            s,
            "{indent}#pragma unroll\n{indent}for (int k = 0; k < {VECTORS}; k++) {{ const {idx} r = ({idx})threadIdx.x * {v} + ({idx})k * {}; if (r < R) {{",
            g * v
        );
    };
    // 1. The row into registers, its loads in flight together.
    let _ = writeln!(
        s,
        "    union {{ {vt} v; {in_t} e[{v}]; {acc_t} t[{v}]; }} row[{VECTORS}];"
    );
    each(&mut s, "    ");
    let _ = writeln!(s, "      row[k].v = *(const {vt}*)(in0 + ib + r); }} }}");
    // 2. The prologue (order-free), which every thread ends with, written and read back as
    // stored.
    let _ = writeln!(s, "    {prologue_st} kept;\n    {{");
    let _ = writeln!(
        s,
        "      {pr_t} acc = {}; i64 best = 9223372036854775807ll;",
        identity(prologue.op, pr)
    );
    each(&mut s, "      ");
    let _ =
        writeln!(
        s,
        "#pragma unroll\n        for (int l = 0; l < {v}; l++) {{ const {pr_t} v = {}; {} }} }} }}",
        cast(&from_storage(sig.input, "row[k].e[l]"), sig.input, pr, false),
        update(prologue.op, pr, "v", "0")
    );
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
    let _ = writeln!(s, "      kept = {stored};");
    let _ = writeln!(
        s,
        "      if (threadIdx.x == 0) prologue_out[ob] = kept;\n    }}"
    );
    // 3. Each vector's terms in place, added as the eager lane adds them.
    let res = prologue.result;
    let _ = writeln!(
        s,
        "    const {} x{res} = {};",
        compute_type(prologue.out),
        from_storage(prologue.out, "kept")
    );
    let _ = writeln!(s, "    {{");
    let _ = writeln!(
        s,
        "      {acc_t} acc = {}; i64 best = 9223372036854775807ll;",
        identity(sig.op, r)
    );
    each(&mut s, "      ");
    let read = |k: usize| k > 0 && k != res && m.expr.reads_input(k);
    load_row_inputs(&mut s, "        ", m, v, read, "");
    let _ = writeln!(
        s,
        "#pragma unroll\n        for (int l = 0; l < {v}; l++) {{"
    );
    declare_inputs(&mut s, "          ", m, ("row[k].e[l]", true), read);
    let mut next = 0;
    let name = crate::render::expr::emit_tree(&m.expr, &mut s, "          ", &mut next)?;
    let _ = writeln!(
        s,
        "          row[k].t[l] = {};\n          const {acc_t} v = row[k].t[l]; {} }} }} }}",
        contribution(sig, &name, m.expr.dtype),
        update(sig.op, r, "v", "(i64)(r + l)")
    );
    warp_reduce(&mut s, "      ", sig.op, r);
    block_combine(&mut s, "      ", sig.op, r, "wl == 0");
    let _ = writeln!(
        s,
        "      if (threadIdx.x == 0) sh_sum = {};\n      __syncthreads();\n    }}",
        from_storage(r, &to_storage(r, "acc"))
    );
    let _ = writeln!(s, "    const {acc_t} comb = sh_sum;");
    let result = cast("comb", r, sig.out, false);
    let _ = writeln!(
        s,
        "    const {out_t} result = {};\n    if (threadIdx.x == 0) out[ob] = result;",
        to_storage(sig.out, &result)
    );
    // 4. The epilogue over the held terms (input 0 outside them read again, from L2).
    if let Some(e) = &sig.epilogue {
        let (expr, term) = epilogue_expr(sig, e, m);
        let _ = writeln!(
            s,
            "    const {} x{} = {};",
            compute_type(sig.out),
            e.result,
            from_storage(sig.out, "result")
        );
        each(&mut s, "    ");
        if expr.reads_input(0) {
            let _ = writeln!(
                s,
                "      union {{ {vt} v; {in_t} e[{v}]; }} u; u.v = *(const {vt}*)(in0 + ib + r);"
            );
        }
        let read = |k: usize| k != e.result && k != res && expr.reads_input(k);
        load_row_inputs(&mut s, "      ", m, v, |k| k > 0 && read(k), "");
        let (out_st, ovt) = (storage_type(e.out), vector_type(v * e.out.itemsize()));
        let _ = writeln!(s, "      union {{ {ovt} v; {out_st} e[{v}]; }} y;");
        let _ = writeln!(s, "#pragma unroll\n      for (int l = 0; l < {v}; l++) {{");
        declare_inputs(&mut s, "        ", m, ("u.e[l]", read(0)), read);
        if expr.reads_input(term) {
            let _ = writeln!(
                s,
                "        const {} x{term} = row[k].t[l];",
                compute_type(m.expr.dtype)
            );
        }
        let mut next = 0;
        let name = crate::render::expr::emit_tree(&expr, &mut s, "        ", &mut next)?;
        let _ = writeln!(
            s,
            "        y.e[l] = {};\n      }}\n      *({ovt}*)(epilogue_out + ib + r) = y.v; }} }}",
            to_storage(e.out, &name)
        );
    }
    let _ = writeln!(s, "  }}\n}}");
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::super::{StagedEpilogue, StagedPrologue};
    use super::*;
    use strata_core::ir::{BinaryOp, Expr, ReduceOp, UnaryOp};
    use strata_core::lower::operands::ReduceMap;
    use strata_core::DType;

    #[test]
    fn softmax_from_primitives_holds_its_rows_in_registers() {
        // `exp(x - m)` summed, then `exp(x - m) / s`: the maximum input 1, the sum input 2.
        let x = |k| Expr::input(k, DType::F32);
        let term = Expr::unary(UnaryOp::Exp, Expr::binary(BinaryOp::Sub, x(0), x(1)));
        let sig = ReduceSig {
            op: ReduceOp::Sum,
            input: DType::F32,
            acc: DType::F32,
            out: DType::F32,
            outer_rank: 1,
            reduced_rank: 1,
            group: 256,
            vector: 4,
            wide: false,
            combine: false,
            map: Some(ReduceMap {
                expr: term.clone(),
                inputs: vec![DType::F32; 3],
                per_output: vec![false, true, true],
                per_position: vec![false; 3],
                scalars: vec![],
            }),
            prologue: Some(StagedPrologue {
                op: ReduceOp::Max,
                result: 1,
                out: DType::F32,
            }),
            epilogue: Some(StagedEpilogue {
                expr: Expr::binary(BinaryOp::Div, term, x(2)),
                result: 2,
                out: DType::F32,
            }),
            held: true,
            stores_map: false,
            out_vector: 1,
        };
        let src = source(&sig).unwrap();
        // One read of the row, into registers; no shared memory holds it.
        assert_eq!(src.matches("*(const uint4*)(in0").count(), 1, "{src}");
        assert!(!src.contains("extern __shared__"), "{src}");
        assert!(src.contains("row[16];"), "{src}");
        // The eager lane's vectors: `threadIdx.x·4 + k·1024`, each term added as computed.
        assert!(
            src.contains("(i32)threadIdx.x * 4 + (i32)k * 1024"),
            "{src}"
        );
        assert!(
            src.contains("const float v = row[k].t[l]; acc = acc + v;"),
            "{src}"
        );
        // The maximum and the sum from registers; the quotient over the held terms.
        assert!(src.contains("const float x1 = kept;"), "{src}");
        assert!(src.contains("const float x2 = result;"), "{src}");
        assert!(src.contains("const float x3 = row[k].t[l];"), "{src}");
        assert!(!src.contains("in1[") && !src.contains("in2["), "{src}");
        assert!(
            src.contains("*(uint4*)(epilogue_out + ib + r) = y.v;"),
            "{src}"
        );
    }
}
