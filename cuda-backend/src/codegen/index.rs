//! `Gather` and `Scatter` kernels: one thread per element of the index tensor, any strides.
//! Scatter with accumulation adds atomically (a compare-and-swap loop for every width).

use super::expr::emit;
use super::{compute_type, from_storage, index_type, storage_type, to_storage, vector_type};
use crate::launch::{Args, Grid, Launch, Program};
use std::fmt::Write;
use strata_core::ir::{BinaryOp, Expr, IndexKind, Operand};
use strata_core::lower::index_plan::{self, IndexRows};
use strata_core::lower::map_plan::needs_wide;
use strata_core::lower::operands::IndexOperands;
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
    /// Bytes per access of the row path ([`index_plan::rows`]); 0: one thread per element.
    pub row_bytes: usize,
    /// The row path with long runs: a row of blocks per run (`blockIdx.y`), so no work item
    /// divides to find its run.
    pub run_blocks: bool,
    /// A gather with a range flag: negative index values count from the end of the source's
    /// axis, and one still outside it sets the flag (two more argument words: the extent and
    /// the flag's address).
    pub flagged: bool,
}

impl strata_core::lower::cache::Owned for IndexSig {}

/// Plans an index kernel over operands checked by [`IndexOperands`].
pub(crate) fn plan(checked: &IndexOperands) -> Result<Option<(IndexSig, Launch)>> {
    let (src, index, out, axis) = (checked.src, checked.index, checked.out, checked.axis);
    let shape = checked.space().to_vec();
    let rank = shape.len();
    let numel: usize = shape.iter().product();
    if numel == 0 {
        return Ok(None);
    }
    let addresses = [
        crate::memory::element_ptr(src)?,
        crate::memory::element_ptr(out)?,
    ];
    if let Some(rows) = index_plan::rows(checked, addresses, 16) {
        return Ok(Some(rows_launch(checked, &rows, addresses)?));
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
    let mut words = Args::new();
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
    push_flag(checked, &mut words)?;
    let sig = IndexSig {
        kind: checked.kind,
        axis,
        rank,
        dtype: out.dtype,
        wide,
        row_bytes: 0,
        run_blocks: false,
        flagged: checked.flag.is_some(),
    };
    Ok(Some((sig, Launch::linear(words, numel))))
}

/// A flagged gather's last two words: the source's extent along the axis, the flag's address.
fn push_flag(checked: &IndexOperands, words: &mut Args) -> Result<()> {
    if let Some(flag) = checked.flag {
        words.push(checked.src.layout.shape()[checked.axis] as u64);
        words.push(crate::memory::element_ptr(flag)?);
    }
    Ok(())
}

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

/// The launch of the row path: one work item per vector of a run.
fn rows_launch(
    checked: &IndexOperands,
    rows: &IndexRows,
    addresses: [u64; 2],
) -> Result<(IndexSig, Launch)> {
    let v = rows.vector as isize;
    let vectors_per_run = rows.inner / rows.vector;
    let items = rows.outer * rows.count * vectors_per_run;
    let span =
        |st: [isize; 2], n: [usize; 2]| st[0].unsigned_abs() * n[0] + st[1].unsigned_abs() * n[1];
    let src_rows = checked.src.layout.shape()[checked.axis];
    let wide = items > i32::MAX as usize / 2
        || span(rows.src_strides, [rows.outer, src_rows]) > i32::MAX as usize / 2
        || span(rows.out_strides, [rows.outer, rows.count]) > i32::MAX as usize / 2
        || span(rows.index_strides, [rows.outer, rows.count]) > i32::MAX as usize / 2;
    // Runs of a block's width or more: a block per run and chunk of it, a vector a thread,
    // consecutive blocks on different runs (PyTorch's gather has that order). A pass over one
    // chunk of every run then touches `runs` chunks of the source: indices that repeat read
    // their chunk again while it is in L2 (random rows with repeats, [16384, 16384] f32 on an
    // H100: 0.665 ms, a copy of the bytes 0.722; four vectors a thread, runs in y: 0.742).
    // Shorter runs share blocks, a vector a work item.
    let runs = rows.outer * rows.count;
    let run_blocks = vectors_per_run >= RUN_BLOCK;
    let mut words = Args::new();
    for w in [
        if run_blocks { runs } else { items },
        rows.count,
        vectors_per_run,
    ] {
        words.push(w as u64);
    }
    words.push(addresses[0]);
    for s in rows.src_strides {
        words.push((s / v) as i64 as u64);
    }
    words.push(crate::memory::element_ptr(checked.index)?);
    for s in rows.index_strides {
        words.push(s as i64 as u64);
    }
    words.push(addresses[1]);
    for s in rows.out_strides {
        words.push((s / v) as i64 as u64);
    }
    push_flag(checked, &mut words)?;
    let sig = IndexSig {
        kind: checked.kind,
        axis: 0,
        rank: 0,
        // Runs move as raw bytes: one kernel per access width serves every dtype.
        dtype: DType::U8,
        wide,
        row_bytes: rows.vector * checked.out.dtype.itemsize(),
        run_blocks,
        flagged: checked.flag.is_some(),
    };
    if !run_blocks {
        return Ok((sig, Launch::linear(words, items)));
    }
    let grid = Grid::Fixed {
        grid: (
            runs.min(i32::MAX as usize) as u32,
            vectors_per_run.div_ceil(RUN_BLOCK).min(65535) as u32,
            1,
        ),
        block: (RUN_BLOCK as u32, 1, 1),
        shared: 0,
    };
    Ok((sig, Launch { args: words, grid }))
}

/// Threads per block of the run-blocks form: a block copies a chunk of 128 vectors (2 KiB
/// of 16-byte vectors), small enough that one chunk of each of 16,384 runs fits in L2.
const RUN_BLOCK: usize = 128;

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

impl Program for IndexSig {
    const NAME: &'static str = "strata_index";
    fn source(&self) -> Result<String> {
        source(self)
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
            let v = emit(&add, &mut body, "        ", &mut 0)?;
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
