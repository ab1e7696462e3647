//! A histogram's launch: enough blocks to fill the device (fewer when each holds many bins,
//! since every block adds its copies to the output once), each with its private copies.

use super::step::{Sig, Step};
use crate::launch::{Args, Launch};
use crate::render::histogram::{HistogramSig, BLOCK};
use strata_core::backend::KernelArgs;
use strata_core::ir::Expr;
use strata_core::lower::histogram_plan::{private_copies, HistogramOperands};
use strata_core::target::Target;
use strata_core::Result;

/// Dynamic shared memory a block may take without opting in.
const SHARED: usize = 48 << 10;

/// The step of `Histogram { bins, bin, weighted }` over `args`; none for no values.
pub(crate) fn steps(
    bins: usize,
    bin: &Expr,
    weighted: bool,
    args: &KernelArgs,
    target: &Target,
) -> Result<Vec<Step<'static>>> {
    let ops = HistogramOperands::of(args, bins, weighted)?;
    if ops.n == 0 || bins == 0 {
        return Ok(Vec::new());
    }
    let item = ops.out.dtype.itemsize();
    // Up to 16 copies for a few bins; where fewer than four fit, one (more blocks resident:
    // 4,096 bins measured 0.502 ms with one copy against 0.517 with two on an H200).
    let copies = match private_copies(bins, item, SHARED, 16) {
        c if c < 4 => c.min(1),
        c => c,
    };
    let mut w = Args::new();
    w.push(ops.n as u64);
    w.push(bins as u64);
    w.push(crate::memory::element_address(ops.values)?);
    if let Some(weights) = ops.weights {
        w.push(crate::memory::element_address(weights)?);
    }
    w.push(crate::memory::element_address(ops.out)?);
    for s in &args.scalars {
        w.push(s.bits());
    }
    // Two thousand threads a multiprocessor; blocks with large copies fewer, so the merges
    // (a block's bins each) stay a small part of the work.
    let sms = (target.parallel_slots / 2048).max(1);
    let per_sm = match copies * bins * item {
        0 => 4,
        bytes => (96 << 10) / bytes,
    }
    .clamp(1, 4);
    let blocks = ops.n.div_ceil(BLOCK).min(sms * per_sm).max(1);
    let shared = (copies * bins * item) as u32;
    let sig = HistogramSig {
        bin: bin.clone(),
        values: ops.values.dtype,
        acc: ops.out.dtype,
        weighted,
        scalars: args.scalars.iter().map(|s| s.dtype()).collect(),
        copies,
        wide: ops.n > i32::MAX as usize / 2,
    };
    let launch = Launch::fixed(w, (blocks as u32, 1, 1), (BLOCK as u32, 1, 1), shared);
    Ok(vec![Step::Kernel {
        sig: Sig::Histogram(sig),
        launch,
    }])
}
