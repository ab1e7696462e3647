//! A reduction over a strided axis that also stores its map (`ReduceSig::stores_map`), each
//! thread walking `out_vector` neighbouring columns: a bias gradient's column sum of the
//! gradient it writes. Every column still adds its range's elements one after the other, as
//! `plain`'s thread per output does (the same sum, bit for bit); the loads and the stores of
//! the map's values are vectors across the columns.

use super::parts::{contribution, declare_map_operands, decode_output, identity, repr, update};
use super::{ReduceSig, Words};
use crate::render::{
    cast, compute_type, from_storage, index_type, storage_type, to_storage, vector_type,
};
use std::fmt::Write;
use strata_core::{Error, Result};

/// The CUDA C source of a column reduction named `strata_reduce`.
pub(crate) fn source(sig: &ReduceSig) -> Result<String> {
    let Some(m) = sig
        .map
        .as_ref()
        .filter(|_| sig.stores_map && sig.group == 1)
    else {
        return Err(Error::Backend(
            "internal error: columns are walked by a reduction that stores its map".into(),
        ));
    };
    let (idx, ov) = (index_type(sig.wide), sig.out_vector);
    let r = repr(sig.op, sig.acc);
    let acc_t = compute_type(r);
    let w = Words::of(sig);
    let in_t = storage_type(sig.input);
    let stored_t = storage_type(m.expr.dtype);
    let mut s = String::new();
    let _ = writeln!(
        s,
        "extern \"C\" __global__ void strata_reduce(const Args<{}> p) {{",
        w.total
    );
    let _ = writeln!(s, "  const {idx} O = ({idx})p.w[0], R = ({idx})p.w[1], S = ({idx})p.w[2], chunk = ({idx})p.w[3];");
    let _ = writeln!(s, "  const {in_t}* in0 = (const {in_t}*)p.w[{}];", w.in_ptr);
    declare_map_operands(&mut s, m, &w);
    let _ = writeln!(s, "  {stored_t}* stored = ({stored_t}*)p.w[{}];", w.stored);
    let out_t = storage_type(sig.out);
    let _ = writeln!(s, "  {out_t}* out = ({out_t}*)p.w[{}];", w.out_ptr);
    let _ = writeln!(
        s,
        "  {}* part = ({}*)p.w[{}];",
        storage_type(r),
        storage_type(r),
        w.part
    );
    let _ = writeln!(
        s,
        "  const {idx} Q = O / {ov}, step = ({idx})(i64)p.w[{}];",
        w.in_red
    );
    let _ = writeln!(s, "  const {idx} threads = ({idx})gridDim.x * blockDim.x;");
    let _ = writeln!(
        s,
        "  for ({idx} g = ({idx})blockIdx.x * blockDim.x + threadIdx.x; g < Q * S; g += threads) {{"
    );
    let _ = writeln!(s, "    const {idx} o = (g % Q) * {ov}, s = g / Q;");
    decode_output(&mut s, idx, sig.outer_rank, &w);
    let _ = writeln!(
        s,
        "    {acc_t} accs[{ov}];\n#pragma unroll\n    for (int l = 0; l < {ov}; l++) accs[l] = {};",
        identity(sig.op, r)
    );
    let _ = writeln!(s, "    const {idx} r0 = s * chunk;");
    let _ = writeln!(s, "    const {idx} r1 = (R - r0 < chunk) ? R : r0 + chunk;");
    let _ = writeln!(s, "    for ({idx} r = r0; r < r1; r++) {{");
    let _ = writeln!(s, "      const {idx} off = ib + r * step;");
    for (k, &d) in m.inputs.iter().enumerate() {
        if !m.per_output[k] && !m.per_position[k] {
            let (vt, t) = (vector_type(ov * d.itemsize()), storage_type(d));
            let _ = writeln!(
                s,
                "      union {{ {vt} v; {t} e[{ov}]; }} u{k}; u{k}.v = *(const {vt}*)(in{k} + off);"
            );
        }
    }
    let vt = vector_type(ov * m.expr.dtype.itemsize());
    let _ = writeln!(s, "      union {{ {vt} v; {stored_t} e[{ov}]; }} w;");
    let _ = writeln!(s, "#pragma unroll\n      for (int l = 0; l < {ov}; l++) {{");
    for (k, &d) in m.inputs.iter().enumerate() {
        let at = if m.per_output[k] {
            format!("in{k}[ob + l]")
        } else if m.per_position[k] {
            // (Every column of the row at `r` reads its one value.)
            format!("in{k}[r]")
        } else {
            format!("u{k}.e[l]")
        };
        let _ = writeln!(
            s,
            "        const {} x{k} = {};",
            compute_type(d),
            from_storage(d, &at)
        );
    }
    let mut next = 0;
    let name = crate::render::expr::emit_tree(&m.expr, &mut s, "        ", &mut next)?;
    let _ = writeln!(s, "        w.e[l] = {};", to_storage(m.expr.dtype, &name));
    let _ = writeln!(
        s,
        "        const {acc_t} v = {};",
        contribution(sig, &name, m.expr.dtype)
    );
    let _ = writeln!(
        s,
        "        {acc_t} acc = accs[l]; i64 best = 0; {} accs[l] = acc; (void)best;",
        update(sig.op, r, "v", "(i64)r")
    );
    let _ = writeln!(s, "      }}");
    let _ = writeln!(s, "      *({vt}*)(stored + off) = w.v;");
    let _ = writeln!(s, "    }}");
    let _ = writeln!(s, "#pragma unroll\n    for (int l = 0; l < {ov}; l++) {{");
    let _ = writeln!(
        s,
        "      if (S == 1) out[ob + l] = {};",
        to_storage(sig.out, &cast("accs[l]", r, sig.out, false))
    );
    let _ = writeln!(
        s,
        "      else part[(o + l) * S + s] = {};",
        to_storage(r, "accs[l]")
    );
    let _ = writeln!(s, "    }}\n  }}\n}}");
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_core::ir::{BinaryOp, Expr, ReduceOp};
    use strata_core::lower::operands::ReduceMap;
    use strata_core::DType;

    #[test]
    fn each_thread_walks_four_columns_with_vectors() {
        let x = |k| Expr::input(k, DType::F32);
        let sig = ReduceSig {
            op: ReduceOp::Sum,
            input: DType::F32,
            acc: DType::F32,
            out: DType::F32,
            outer_rank: 1,
            reduced_rank: 1,
            group: 1,
            vector: 1,
            wide: false,
            combine: false,
            map: Some(ReduceMap {
                expr: Expr::binary(BinaryOp::Mul, x(0), x(1)),
                inputs: vec![DType::F32; 2],
                per_output: vec![false, false],
                per_position: vec![false; 2],
                scalars: vec![],
            }),
            prologue: None,
            epilogue: None,
            held: false,
            stores_map: true,
            out_vector: 4,
        };
        let src = source(&sig).unwrap();
        assert!(src.contains("u1.v = *(const uint4*)(in1 + off);"), "{src}");
        assert!(src.contains("*(uint4*)(stored + off) = w.v;"), "{src}");
        assert!(src.contains("for (i32 r = r0; r < r1; r++)"), "{src}");
        assert!(src.contains("part[(o + l) * S + s]"), "{src}");
        // Not without a stored map.
        assert!(source(&ReduceSig {
            stores_map: false,
            ..sig.clone()
        })
        .is_err());
        // One value a position (a row's statistic): each column of row `r` reads `in1[r]`.
        let mut at_position = sig;
        if let Some(m) = &mut at_position.map {
            m.per_position[1] = true;
        }
        let src = source(&at_position).unwrap();
        assert!(src.contains("const float x1 = in1[r];"), "{src}");
        assert!(!src.contains("u1"), "{src}");
    }
}
