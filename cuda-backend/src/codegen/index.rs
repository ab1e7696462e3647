//! `Gather` and `Scatter` kernels: one thread per element of the index tensor, any strides.
//! Scatter with accumulation adds atomically (a compare-and-swap loop for every width).

use super::expr::emit;
use super::{cast, compute_type, from_storage, index_type, storage_type, to_storage};
use crate::launch::{needs_wide, Plan, Words};
use std::fmt::Write;
use strata_core::ir::{BinaryOp, Expr, KernelArgs, Operand};
use strata_core::{DType, Error, Result};

/// The structure of a gather or scatter launch.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct IndexSig {
    /// `None` for gather; `Some(accumulate)` for scatter.
    pub scatter: Option<bool>,
    pub axis: usize,
    pub rank: usize,
    /// Source (the values read) and destination dtypes.
    pub src: DType,
    pub dst: DType,
    pub wide: bool,
}

/// Plans a gather (`inputs = [src, index]`) or scatter (`inputs = [index, src]`).
pub(crate) fn plan(
    scatter: Option<bool>,
    axis: usize,
    args: &KernelArgs,
) -> Result<Option<(IndexSig, Plan)>> {
    let (src, index, out) = match (scatter, args.inputs.as_slice(), args.outputs.as_slice()) {
        (None, [src, index], [out]) => (src, index, out),
        (Some(_), [index, src], [out]) => (src, index, out),
        _ => {
            return Err(Error::Invalid(
                "gather takes [src, index], scatter [index, src], and one output".into(),
            ))
        }
    };
    if index.dtype != DType::I64 {
        return Err(Error::DType(format!(
            "index tensors hold i64, not {}",
            index.dtype
        )));
    }
    // The iteration space: the output for gather, the index (= src) for scatter.
    let space = if scatter.is_none() { out } else { index };
    let shape = space.layout.shape().to_vec();
    let rank = shape.len();
    if axis >= rank.max(1) || [src, index, out].iter().any(|o| o.layout.ndim() != rank) {
        return Err(Error::Shape(format!(
            "gather/scatter along axis {axis} of operands of ranks {}, {} and {}",
            src.layout.ndim(),
            index.layout.ndim(),
            out.layout.ndim()
        )));
    }
    let numel = space.layout.numel();
    if numel == 0 {
        return Ok(None);
    }
    let ops: [&Operand; 3] = [src, index, out];
    // A 0-d operation runs as a 1-element 1-d one (the index value is then 0).
    let (shape, rank) = if rank == 0 {
        (vec![1], 1)
    } else {
        (shape, rank)
    };
    let strides: Vec<Vec<isize>> = ops
        .iter()
        .map(|o| match o.layout.ndim() {
            0 => vec![0],
            _ => o.layout.strides().to_vec(),
        })
        .collect();
    let reach: Vec<usize> = ops
        .iter()
        .map(|o| o.layout.shape().iter().product())
        .collect();
    let wide = needs_wide(
        numel.max(reach.iter().copied().max().unwrap_or(0)),
        &shape,
        &strides,
    ) || ops
        .iter()
        .any(|o| needs_wide(0, o.layout.shape(), &[o.layout.strides().to_vec()]));
    let mut words = Words::new();
    words.push(numel as u64);
    for &n in &shape {
        words.push(n as u64);
    }
    for (o, st) in ops.iter().zip(&strides) {
        words.push(crate::memory::element_ptr(o)?);
        for &s in st {
            words.push(s as i64 as u64);
        }
    }
    let sig = IndexSig {
        scatter,
        axis,
        rank,
        src: src.dtype,
        dst: out.dtype,
        wide,
    };
    Ok(Some((sig, Plan::linear(words, numel))))
}

/// The CUDA C source of `strata_index`.
pub(crate) fn source(sig: &IndexSig) -> Result<String> {
    let idx = index_type(sig.wide);
    let r = sig.rank;
    // Words: numel, shape, then src, index, out: a pointer and `rank` strides each.
    let base = |k: usize| 1 + r + k * (r + 1);
    let total = 1 + r + 3 * (r + 1);
    let (st, dt) = (storage_type(sig.src), storage_type(sig.dst));
    let mut s = String::new();
    let _ = writeln!(
        s,
        "extern \"C\" __global__ void strata_index(const Words<{total}> p) {{"
    );
    let _ = writeln!(s, "  const {st}* src = (const {st}*)p.w[{}];", base(0));
    let _ = writeln!(s, "  const i64* index = (const i64*)p.w[{}];", base(1));
    let _ = writeln!(s, "  {dt}* out = ({dt}*)p.w[{}];", base(2));
    let _ = writeln!(s, "  const {idx} n = ({idx})p.w[0];");
    let _ = writeln!(s, "  for ({idx} i = ({idx})blockIdx.x * blockDim.x + threadIdx.x; i < n; i += ({idx})gridDim.x * blockDim.x) {{");
    let _ = writeln!(s, "    {idx} rem = i, o0 = 0, o1 = 0, o2 = 0, c_axis = 0;");
    for d in (0..r).rev() {
        let _ = writeln!(
            s,
            "    {{ const {idx} c = rem % ({idx})p.w[{}]; rem /= ({idx})p.w[{}];",
            1 + d,
            1 + d
        );
        for k in 0..3 {
            let _ = writeln!(s, "      o{k} += c * ({idx})(i64)p.w[{}];", base(k) + 1 + d);
        }
        if d == sig.axis {
            let _ = writeln!(s, "      c_axis = c;");
        }
        let _ = writeln!(s, "    }}");
    }
    let _ = writeln!(s, "    const {idx} at = ({idx})index[o1];");
    // Move along `axis` from the iteration coordinate to the index value.
    let moved = if sig.scatter.is_none() { 0 } else { 2 };
    let _ = writeln!(
        s,
        "    o{moved} += (at - c_axis) * ({idx})(i64)p.w[{}];",
        base(moved) + 1 + sig.axis
    );
    let value = cast(&from_storage(sig.src, "src[o0]"), sig.src, sig.dst, false);
    match sig.scatter {
        Some(true) => {
            // The add of the destination dtype, as a map expression would compute it.
            let add = Expr::binary(
                BinaryOp::Add,
                Expr::input(0, sig.dst),
                Expr::input(1, sig.dst),
            );
            let mut body = String::new();
            let v = emit(&add, &mut body, "        ", &mut 0)?;
            let ct = compute_type(sig.dst);
            let _ = writeln!(s, "    const {ct} x1 = {value};");
            let _ = writeln!(s, "    atomic_update(&out[o2], [&]({dt} old) -> {dt} {{");
            let _ = writeln!(
                s,
                "        const {ct} x0 = {};",
                from_storage(sig.dst, "old")
            );
            s.push_str(&body);
            let _ = writeln!(s, "        return {};\n    }});", to_storage(sig.dst, &v));
        }
        _ => {
            let _ = writeln!(s, "    out[o2] = {};", to_storage(sig.dst, &value));
        }
    }
    let _ = writeln!(s, "  }}\n}}");
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scatter_add_updates_atomically() {
        let sig = IndexSig {
            scatter: Some(true),
            axis: 1,
            rank: 2,
            src: DType::F16,
            dst: DType::F16,
            wide: false,
        };
        let src = source(&sig).unwrap();
        assert!(src.contains("atomic_update(&out[o2]"), "{src}");
        assert!(src.contains("o2 += (at - c_axis)"));
    }
}
