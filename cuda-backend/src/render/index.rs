//! `Gather` and `Scatter` kernels: one thread per element of the index tensor, any strides.
//! Scatter with accumulation adds atomically (a compare-and-swap loop for every width).

use super::expr::emit_tree;
use super::{compute_type, from_storage, index_type, storage_type, to_storage, vector_type};
use super::{Generated, Rendered};
use std::fmt::Write;
use strata_core::ir::{BinaryOp, Expr, IndexKind};
use strata_core::{DType, Result};

/// The structure of an index launch.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct IndexSig {
    pub kind: IndexKind,
    pub axis: usize,
    pub rank: usize,
    /// The dtype moved (source and output share it).
    pub dtype: DType,
    pub wide: bool,
    /// Bytes per access of the row path
    /// ([`index_plan::rows`](strata_core::lower::index_plan::rows)); 0: one thread per element.
    pub row_bytes: usize,
    /// The row path with long runs: a row of blocks per run (`blockIdx.y`), so no work item
    /// divides to find its run.
    pub run_blocks: bool,
    /// A gather with a range flag: negative index values count from the end of the source's
    /// axis, and one still outside it sets the flag (two more argument words: the extent and
    /// the flag's address).
    pub flagged: bool,
}

impl strata_core::kernel_cache::Owned for IndexSig {}

/// The statements that read index value `read` into `at` (of type `idx`): as it is, or for a
/// flagged gather from the end when negative, flagging (and skipping) one outside the axis.
fn read_index(sig: &IndexSig, idx: &str, read: &str, extent: usize, flag: usize) -> String {
    if !sig.flagged {
        return format!("const {idx} at = ({idx}){read};");
    }
    format!(
        "i64 v = {read}; const i64 extent = (i64)p.w[{extent}];\n    \
         if (v < 0) v += extent;\n    \
         if (v < 0 || v >= extent) {{ *(unsigned int*)p.w[{flag}] = 1u; continue; }}\n    \
         const {idx} at = ({idx})v;"
    )
}

/// Threads per block of the run-blocks form: a block copies a chunk of 128 vectors (2 KiB
/// of 16-byte vectors), small enough that one chunk of each of 16,384 runs fits in L2.
pub(crate) const RUN_BLOCK: usize = 128;

/// The row path's source: each work item copies one vector of a run (with run blocks, a
/// thread copies one vector of its block's chunk of a run), reading the run's index value
/// (cached: the work items of a run are neighbours).
fn rows_source(sig: &IndexSig) -> String {
    let idx = index_type(sig.wide);
    let vt = vector_type(sig.row_bytes);
    let words = if sig.flagged { 14 } else { 12 };
    let at = read_index(sig, idx, "index[o * i0 + j * i1]", 12, 13);
    // Work items: a vector each, or (run blocks) a run per column of blocks.
    let body = if sig.run_blocks {
        format!(
            "for ({idx} run = blockIdx.x; run < n; run += gridDim.x) {{
    const {idx} o = run / count, j = run - o * count;
    {at}
    const {vt}* from = src + (o * s0 + at * s1);
    {vt}* to = out + (o * o0 + j * o1);
    for ({idx} k = ({idx})blockIdx.y * blockDim.x + threadIdx.x; k < per_run; k += ({idx})gridDim.y * blockDim.x) to[k] = from[k];
  }}"
        )
    } else {
        format!(
            "for ({idx} i = ({idx})blockIdx.x * blockDim.x + threadIdx.x; i < n; i += ({idx})gridDim.x * blockDim.x) {{
    const {idx} run = i / per_run, k = i - run * per_run;
    const {idx} o = run / count, j = run - o * count;
    {at}
    out[o * o0 + j * o1 + k] = src[o * s0 + at * s1 + k];
  }}"
        )
    };
    format!(
        "extern \"C\" __global__ void strata_index(const Args<{words}> p) {{
  const {vt}* src = (const {vt}*)p.w[3];
  const i64* index = (const i64*)p.w[6];
  {vt}* out = ({vt}*)p.w[9];
  const {idx} n = ({idx})p.w[0], count = ({idx})p.w[1], per_run = ({idx})p.w[2];
  const {idx} s0 = ({idx})(i64)p.w[4], s1 = ({idx})(i64)p.w[5];
  const {idx} i0 = ({idx})(i64)p.w[7], i1 = ({idx})(i64)p.w[8];
  const {idx} o0 = ({idx})(i64)p.w[10], o1 = ({idx})(i64)p.w[11];
  {body}
}}
"
    )
}

impl Generated for IndexSig {
    const NAME: &'static str = "strata_index";
    fn render(&self) -> Result<Rendered> {
        source(self).map(Rendered::single)
    }
}

/// The CUDA C source of `strata_index`.
pub(crate) fn source(sig: &IndexSig) -> Result<String> {
    if sig.row_bytes > 0 {
        return Ok(rows_source(sig));
    }
    let idx = index_type(sig.wide);
    let r = sig.rank;
    // Args: numel, shape, then src, index, out: a pointer and `rank` strides each.
    let base = |k: usize| 1 + r + k * (r + 1);
    let total = 1 + r + 3 * (r + 1) + if sig.flagged { 2 } else { 0 };
    let (st, dt) = (storage_type(sig.dtype), storage_type(sig.dtype));
    let mut s = String::new();
    let _ = writeln!(
        s,
        "extern \"C\" __global__ void strata_index(const Args<{total}> p) {{"
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
    let _ = writeln!(
        s,
        "    {}",
        read_index(sig, idx, "index[o1]", total - 2, total - 1)
    );
    // Move along `axis` from the iteration coordinate to the index value.
    let moved = if sig.kind == IndexKind::Gather { 0 } else { 2 };
    let _ = writeln!(
        s,
        "    o{moved} += (at - c_axis) * ({idx})(i64)p.w[{}];",
        base(moved) + 1 + sig.axis
    );
    let value = from_storage(sig.dtype, "src[o0]");
    match sig.kind {
        IndexKind::ScatterAdd => {
            // The add of the destination dtype, as a map expression would compute it.
            let add = Expr::binary(
                BinaryOp::Add,
                Expr::input(0, sig.dtype),
                Expr::input(1, sig.dtype),
            );
            let mut body = String::new();
            let v = emit_tree(&add, &mut body, "        ", &mut 0)?;
            let ct = compute_type(sig.dtype);
            let _ = writeln!(s, "    const {ct} x1 = {value};");
            let _ = writeln!(s, "    atomic_update(&out[o2], [&]({dt} old) -> {dt} {{");
            let _ = writeln!(
                s,
                "        const {ct} x0 = {};",
                from_storage(sig.dtype, "old")
            );
            s.push_str(&body);
            let _ = writeln!(s, "        return {};\n    }});", to_storage(sig.dtype, &v));
        }
        _ => {
            let _ = writeln!(s, "    out[o2] = {};", to_storage(sig.dtype, &value));
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
            kind: IndexKind::ScatterAdd,
            axis: 1,
            rank: 2,
            dtype: DType::F16,
            wide: false,
            row_bytes: 0,
            run_blocks: false,
            flagged: false,
        };
        let src = source(&sig).unwrap();
        assert!(src.contains("atomic_update(&out[o2]"), "{src}");
        assert!(src.contains("o2 += (at - c_axis)"));
    }

    #[test]
    fn long_runs_take_a_column_of_blocks_each_and_no_division_per_vector() {
        let sig = |run_blocks| IndexSig {
            kind: IndexKind::Gather,
            axis: 0,
            rank: 0,
            dtype: DType::U8,
            wide: false,
            row_bytes: 16,
            run_blocks,
            flagged: true,
        };
        let src = source(&sig(true)).unwrap();
        assert!(
            src.contains("for (i32 run = blockIdx.x; run < n; run += gridDim.x)")
                && src.contains("k += (i32)gridDim.y * blockDim.x"),
            "{src}"
        );
        assert!(!src.contains("/ per_run"), "{src}");
        assert!(source(&sig(false)).unwrap().contains("i / per_run"));
    }
}
