//! An index launch (gather, scatter, scatter-add): one thread per element of the index
//! tensor, or, for a gather whose index is constant past the axis (every `index_select`), the
//! row path of core's [`index_plan`] moving whole runs.

use super::step::{Sig, Step};
use crate::launch::{Args, Grid, Launch};
use crate::render::index::{IndexSig, RUN_BLOCK};
use strata_core::backend::Operand;
use strata_core::lower::index_plan::{self, IndexRows};
use strata_core::lower::map_plan::needs_wide;
use strata_core::lower::operands::IndexOperands;
use strata_core::{DType, Result};

/// The step of an index kernel over operands checked by [`IndexOperands`]; none when the
/// index is empty.
pub(crate) fn steps(checked: &IndexOperands) -> Result<Vec<Step<'static>>> {
    Ok(kernel(checked)?
        .map(|(sig, launch)| Step::Kernel {
            sig: Sig::Index(sig),
            launch,
        })
        .into_iter()
        .collect())
}

/// Plans an index kernel over operands checked by [`IndexOperands`].
fn kernel(checked: &IndexOperands) -> Result<Option<(IndexSig, Launch)>> {
    let (src, index, out, axis) = (checked.src, checked.index, checked.out, checked.axis);
    let shape = checked.space().to_vec();
    let rank = shape.len();
    let numel: usize = shape.iter().product();
    if numel == 0 {
        return Ok(None);
    }
    let addresses = [
        crate::memory::element_address(src)?,
        crate::memory::element_address(out)?,
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
        words.push(crate::memory::element_address(o)?);
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
        words.push(crate::memory::element_address(flag)?);
    }
    Ok(())
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
    words.push(crate::memory::element_address(checked.index)?);
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
    Ok((
        sig,
        Launch {
            args: words,
            grid,
            scratch: Vec::new(),
        },
    ))
}
