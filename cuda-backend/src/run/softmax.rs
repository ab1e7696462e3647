//! A softmax's launch: core's row plan ([`softmax_plan`]) as the kernel's words and grid.

use super::step::{Sig, Step};
use crate::launch::{Args, Launch};
use crate::render::softmax::{SoftmaxSig, MAX_CACHED};
use strata_core::lower::map_plan::needs_wide;
use strata_core::lower::softmax_plan::{self, SoftmaxOperands};
use strata_core::target::Target;
use strata_core::Result;

/// The step of `Softmax { log }` over `ops` on `target`; none when there are no rows or the
/// rows are empty.
pub(crate) fn steps(
    log: bool,
    ops: &SoftmaxOperands,
    target: &Target,
) -> Result<Vec<Step<'static>>> {
    Ok(kernel(log, ops, target)?
        .map(|(sig, launch)| Step::Kernel {
            sig: Sig::Softmax(sig),
            launch,
        })
        .into_iter()
        .collect())
}

/// Plans `Softmax { log }` over `ops` on `target`; `None` when there are no rows or the rows
/// are empty.
fn kernel(
    log: bool,
    ops: &SoftmaxOperands,
    target: &Target,
) -> Result<Option<(SoftmaxSig, Launch)>> {
    if ops.rows == 0 || ops.n == 0 {
        return Ok(None);
    }
    let (out_ptr, in_ptr) = (
        crate::memory::element_address(ops.out)?,
        crate::memory::element_address(ops.input)?,
    );
    let p = softmax_plan::plan(ops, [out_ptr, in_ptr], target);
    let wide = (p.rows * p.group) as u128 > (i32::MAX / 2) as u128
        || [ops.input, ops.out].iter().any(|o| {
            needs_wide(
                o.layout.numel(),
                o.layout.shape(),
                &[o.layout.strides().to_vec()],
            )
        });
    let mut w = Args::new();
    w.push(p.rows as u64);
    w.push(p.n as u64);
    for &d in &p.outer_shape {
        w.push(d as u64);
    }
    for (ptr, outer, stride) in [
        (in_ptr, &p.in_outer, p.in_stride),
        (out_ptr, &p.out_outer, p.out_stride),
    ] {
        w.push(ptr);
        for &s in outer.iter() {
            w.push(s as i64 as u64);
        }
        w.push(stride as i64 as u64);
    }
    let sig = SoftmaxSig {
        dtype: ops.out.dtype,
        log,
        outer_rank: p.outer_shape.len(),
        group: p.group,
        vector: p.vector,
        wide,
        cached: match (p.n / p.vector).div_ceil(p.group).next_power_of_two() {
            _ if p.staged => 0,
            k if k <= MAX_CACHED && p.group <= 256 => k,
            _ => 0,
        },
        staged: p.staged,
    };
    let launch = if p.group > 256 {
        // A block per row (grid-stride past the cap).
        let blocks = p.rows.min(1 << 20) as u32;
        let shared = if p.staged {
            (p.n * ops.out.dtype.itemsize()) as u32
        } else {
            0
        };
        Launch::fixed(w, (blocks, 1, 1), (p.group as u32, 1, 1), shared)
    } else {
        Launch::linear(w, p.rows * p.group)
    };
    Ok(Some((sig, launch)))
}
