//! `ChannelMoments` and `ChannelGradSums` kernels (core's [`moments_plan`]), f32: workgroup
//! `c·parts + p` takes slice `p` of channel `c`; each invocation reads values
//! `lid, lid + 256, …` of the slice, [`ROUND`] at a time as separate variables, takes the
//! round's mean and squared deviations (each summed as a tree) and merges them into its running
//! count, mean and sum of squared deviations by Chan's formula. A value's place — the run `o`
//! and offset `i` — advances by a constant step with one carry, so no value divides by the
//! run's length. The workgroup merges its invocations' statistics down a tree in workgroup
//! memory, and invocation 0 stores the slice's mean and biased variance: the channel's with one
//! slice a channel ([`Stage::Whole`]), else in scratch ([`Stage::Slices`]), which an invocation
//! a channel then merges ([`Stage::Merge`]). The backward sums take the same slices and stages
//! ([`grad_source`]).
//!
//! [`moments_plan`]: strata_core::lower::moments_plan

use super::{binding, header, load, store, Caps, ENTRY};
use std::fmt::Write;
use strata_core::DType;

/// Values each invocation loads before it merges them.
pub(crate) const ROUND: usize = 16;

/// Which of a channel moments' dispatches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Stage {
    /// One slice a channel: bindings mean, var, x.
    Whole,
    /// Several: bindings scratch (the slices' means, then their variances), x.
    Slices,
    /// An invocation a channel merges its slices: bindings mean, var, scratch.
    Merge,
}

/// The structure of a channel moments dispatch.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct MomentsSig {
    pub stage: Stage,
}

impl strata_core::kernel_cache::Owned for MomentsSig {}

impl MomentsSig {
    /// Its storage bindings.
    pub(crate) fn bindings(&self) -> usize {
        match self.stage {
            Stage::Slices => 2,
            _ => 3,
        }
    }
}

/// The start of a slice a workgroup (after [`ENTRY`]): the sizes from `params`, the
/// workgroup's slice `part` of channel `c` (`b` of them), the step between an invocation's
/// values as runs `step_o` and offset `step_i`, the place of its first value (run `o`, offset
/// `i`), and `k` its index in the slice.
const OPEN: &str =
    "  let channels = params[0];\n  let inner = params[1];\n  let count = params[2];\n  \
     let parts = params[3];\n  let b = wg.y * nwg.x + wg.x;\n  \
     if (b >= channels * parts) { return; }\n  let c = b / parts;\n  let part = b - c * parts;\n  \
     let step_o = 256u / inner;\n  let step_i = 256u - step_o * inner;\n  \
     let j = part * count + lid;\n  var o = j / inner;\n  var i = j - o * inner;\n  var k = lid;\n";

/// The place past an invocation's value: one carry, no division.
const ADVANCE: &str =
    "i = i + step_i; o = o + step_o; if (i >= inner) { i = i - inner; o = o + 1u; }";

/// The WGSL source of `sig`.
pub(crate) fn source(sig: &MomentsSig, caps: Caps) -> String {
    let f = DType::F32;
    let mut src = header(caps);
    for slot in 0..sig.bindings() {
        src.push_str(&binding(slot, f, false, caps));
    }
    if sig.stage == Stage::Merge {
        src.push_str(ENTRY);
        let _ = writeln!(
            src,
            "  let channels = params[0];\n  let parts = params[1];\n  let c = gid;\n  \
             if (c >= channels) {{ return; }}\n  var m = 0.0;\n  \
             for (var k = 0u; k < parts; k = k + 1u) {{ m = m + {}; }}\n  \
             m = m / f32(parts);\n  var v = 0.0;\n  \
             for (var k = 0u; k < parts; k = k + 1u) {{ let dm = {} - m; v = v + {} + dm * dm; }}\n  \
             {}\n  {}\n}}",
            load(f, "b2", "c * parts + k", caps),
            load(f, "b2", "c * parts + k", caps),
            load(f, "b2", "params[4] + c * parts + k", caps),
            store(f, "b0", "params[2] + c", "m", caps),
            store(f, "b1", "params[3] + c", "v / f32(parts)", caps)
        );
        return src;
    }
    let (x, means, vars) = match sig.stage {
        Stage::Whole => ("b2", "b0", "b1"),
        _ => ("b1", "b0", "b0"),
    };
    src.push_str(
        "var<workgroup> shn: array<f32, 256>;\nvar<workgroup> shm: array<f32, 256>;\n\
         var<workgroup> shq: array<f32, 256>;\n",
    );
    src.push_str(ENTRY);
    src.push_str(OPEN);
    src.push_str("  let xo = params[4];\n  var n = 0.0;\n  var m = 0.0;\n  var q = 0.0;\n");
    // The next value into `name`, the place advancing past it.
    let next = |src: &mut String, name: &str, indent: &str| {
        let _ = writeln!(
            src,
            "{indent}let {name} = {};\n{indent}{ADVANCE}",
            load(f, x, "xo + (o * channels + c) * inner + i", caps)
        );
    };
    let _ = writeln!(
        src,
        "  for (; k + {} < count; k = k + {}u) {{",
        (ROUND - 1) * 256,
        ROUND * 256
    );
    let values: Vec<String> = (0..ROUND).map(|e| format!("x{e}")).collect();
    for v in &values {
        next(&mut src, v, "    ");
    }
    let squares: Vec<String> = values
        .iter()
        .map(|v| format!("({v} - mb) * ({v} - mb)"))
        .collect();
    let _ = writeln!(
        src,
        "    let mb = {} * (1.0 / {ROUND}.0);\n    let qb = {};\n    \
         let nn = n + {ROUND}.0;\n    let f = {ROUND}.0 / nn;\n    let dm = mb - m;\n    \
         m = m + dm * f;\n    q = q + qb + dm * dm * n * f;\n    n = nn;\n  }}\n  \
         for (; k < count; k = k + 256u) {{",
        tree(&values),
        tree(&squares)
    );
    next(&mut src, "x0", "    ");
    src.push_str(
        "    let nn = n + 1.0;\n    let f = 1.0 / nn;\n    let dm = x0 - m;\n    \
         m = m + dm * f;\n    q = q + dm * dm * n * f;\n    n = nn;\n  }\n  \
         shn[lid] = n;\n  shm[lid] = m;\n  shq[lid] = q;\n  workgroupBarrier();\n  \
         for (var s = 128u; s > 0u; s = s >> 1u) {\n    if (lid < s) {\n      \
         let an = shn[lid];\n      let on = shn[lid + s];\n      let nn = an + on;\n      \
         if (nn > 0.0) {\n        let f = on / nn;\n        let dm = shm[lid + s] - shm[lid];\n        \
         shm[lid] = shm[lid] + dm * f;\n        shq[lid] = shq[lid] + shq[lid + s] + dm * dm * an * f;\n        \
         shn[lid] = nn;\n      }\n    }\n    workgroupBarrier();\n  }\n",
    );
    let _ = writeln!(
        src,
        "  if (lid == 0u) {{\n    {}\n    {}\n  }}\n}}",
        store(f, means, "params[5] + b", "shm[0]", caps),
        store(f, vars, "params[6] + b", "shq[0] / f32(count)", caps)
    );
    src
}

/// Values of `x` and of `g` each invocation of the backward sums loads before it adds them.
pub(crate) const SUMS_ROUND: usize = 8;

/// The structure of a dispatch of batch norm's backward sums (`ChannelGradSums`): the slices
/// and stages of [`MomentsSig`]'s.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct GradSumsSig {
    pub stage: Stage,
}

impl strata_core::kernel_cache::Owned for GradSumsSig {}

impl GradSumsSig {
    /// Its storage bindings: [`Stage::Whole`] Σg, Σg·x̂, x, g, mean, rstd; [`Stage::Slices`]
    /// scratch (the slices' Σg, then their Σg·x̂), x, g, mean, rstd; [`Stage::Merge`] Σg,
    /// Σg·x̂, scratch.
    pub(crate) fn bindings(&self) -> usize {
        match self.stage {
            Stage::Whole => 6,
            Stage::Slices => 5,
            Stage::Merge => 3,
        }
    }
}

/// `params` (run/moments.rs): channels, inner, count (values a slice), parts, the inputs'
/// first elements (x; x, g, mean, rstd), then where the two outputs start (in their bindings,
/// or in scratch). Of [`Stage::Merge`]: channels, parts, the outputs' first elements, and where
/// the slices' second values start in scratch.
/// The WGSL source of the backward sums' `sig`: each invocation adds `g` and `g·(x − mean)`
/// over its values of `x` and `g` (read at the same places, [`SUMS_ROUND`] of each a round),
/// the workgroup adds its invocations' down a tree, and invocation 0 stores `Σg` and
/// `Σg·(x − mean)·rstd`: the channel's, or the slice's in scratch for a dispatch an
/// invocation a channel to add.
pub(crate) fn grad_source(sig: &GradSumsSig, caps: Caps) -> String {
    let f = DType::F32;
    let mut src = header(caps);
    for slot in 0..sig.bindings() {
        src.push_str(&binding(slot, f, false, caps));
    }
    if sig.stage == Stage::Merge {
        src.push_str(ENTRY);
        let _ = writeln!(
            src,
            "  let channels = params[0];\n  let parts = params[1];\n  let c = gid;\n  \
             if (c >= channels) {{ return; }}\n  var a = 0.0;\n  var s = 0.0;\n  \
             for (var k = 0u; k < parts; k = k + 1u) {{ a = a + {}; s = s + {}; }}\n  \
             {}\n  {}\n}}",
            load(f, "b2", "c * parts + k", caps),
            load(f, "b2", "params[4] + c * parts + k", caps),
            store(f, "b0", "params[2] + c", "a", caps),
            store(f, "b1", "params[3] + c", "s", caps)
        );
        return src;
    }
    let (sums_g, sums_gx, x, g, mean, rstd) = match sig.stage {
        Stage::Whole => ("b0", "b1", "b2", "b3", "b4", "b5"),
        _ => ("b0", "b0", "b1", "b2", "b3", "b4"),
    };
    src.push_str("var<workgroup> shg: array<f32, 256>;\nvar<workgroup> shx: array<f32, 256>;\n");
    src.push_str(ENTRY);
    src.push_str(OPEN);
    let _ = writeln!(
        src,
        "  let xo = params[4];\n  let go = params[5];\n  let mc = {};\n  var sg = 0.0;\n  \
         var sgx = 0.0;",
        load(f, mean, "params[6] + c", caps)
    );
    // Value `e` of `x` and `g` into `x{e}`, `g{e}`, the place advancing past them.
    let next = |src: &mut String, e: usize, indent: &str| {
        let _ = writeln!(
            src,
            "{indent}let at{e} = (o * channels + c) * inner + i;\n{indent}\
             let x{e} = {};\n{indent}let g{e} = {};\n{indent}{ADVANCE}",
            load(f, x, &format!("xo + at{e}"), caps),
            load(f, g, &format!("go + at{e}"), caps)
        );
    };
    let _ = writeln!(
        src,
        "  for (; k + {} < count; k = k + {}u) {{",
        (SUMS_ROUND - 1) * 256,
        SUMS_ROUND * 256
    );
    for e in 0..SUMS_ROUND {
        next(&mut src, e, "    ");
    }
    let gs: Vec<String> = (0..SUMS_ROUND).map(|e| format!("g{e}")).collect();
    let products: Vec<String> = (0..SUMS_ROUND)
        .map(|e| format!("g{e} * (x{e} - mc)"))
        .collect();
    let _ = writeln!(
        src,
        "    sg = sg + {};\n    sgx = sgx + {};\n  }}\n  for (; k < count; k = k + 256u) {{",
        tree(&gs),
        tree(&products)
    );
    next(&mut src, 0, "    ");
    let _ = writeln!(
        src,
        "    sg = sg + g0;\n    sgx = sgx + g0 * (x0 - mc);\n  }}\n  \
         shg[lid] = sg;\n  shx[lid] = sgx;\n  workgroupBarrier();\n  \
         for (var s = 128u; s > 0u; s = s >> 1u) {{\n    if (lid < s) {{\n      \
         shg[lid] = shg[lid] + shg[lid + s];\n      shx[lid] = shx[lid] + shx[lid + s];\n    }}\n    \
         workgroupBarrier();\n  }}\n  if (lid == 0u) {{\n    {}\n    {}\n  }}\n}}",
        store(f, sums_g, "params[8] + b", "shg[0]", caps),
        store(
            f,
            sums_gx,
            "params[9] + b",
            &format!("shx[0] * {}", load(f, rstd, "params[7] + c", caps)),
            caps
        )
    );
    src
}

/// The sum of `terms` added as a balanced tree.
fn tree(terms: &[String]) -> String {
    match terms {
        [] => "0.0".into(),
        [one] => one.clone(),
        _ => {
            let (a, b) = terms.split_at(terms.len() / 2);
            format!("({} + {})", tree(a), tree(b))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_each_value_once_and_stores_one_slice_a_workgroup() {
        let caps = Caps::default();
        let whole = source(
            &MomentsSig {
                stage: Stage::Whole,
            },
            caps,
        );
        // One load a value: ROUND in a whole round, one in the last values' loop.
        assert_eq!(whole.matches("b2[xo + ").count(), ROUND + 1, "{whole}");
        assert!(!whole.contains("/ inner;\n    "), "{whole}");
        assert!(
            whole.contains("b0[params[5] + b] = bitcast<u32>(shm[0])"),
            "{whole}"
        );
        let slices = source(
            &MomentsSig {
                stage: Stage::Slices,
            },
            caps,
        );
        assert!(slices.contains("b0[params[6] + b]"), "{slices}");
        let merge = source(
            &MomentsSig {
                stage: Stage::Merge,
            },
            caps,
        );
        assert!(merge.contains("b2[params[4] + c * parts + k]"), "{merge}");
    }

    #[test]
    fn the_backward_sums_read_x_and_g_once_each_at_the_same_place() {
        let caps = Caps::default();
        let whole = grad_source(
            &GradSumsSig {
                stage: Stage::Whole,
            },
            caps,
        );
        // A load of each a value: SUMS_ROUND in a whole round, one in the last values' loop.
        assert_eq!(
            whole.matches("b2[xo + at").count(),
            SUMS_ROUND + 1,
            "{whole}"
        );
        assert_eq!(
            whole.matches("b3[go + at").count(),
            SUMS_ROUND + 1,
            "{whole}"
        );
        assert!(!whole.contains("/ inner;\n    "), "{whole}");
        assert!(whole.contains("bitcast<u32>(shx[0] * "), "{whole}");
        let slices = grad_source(
            &GradSumsSig {
                stage: Stage::Slices,
            },
            caps,
        );
        assert!(slices.contains("b0[params[9] + b]"), "{slices}");
        let merge = grad_source(
            &GradSumsSig {
                stage: Stage::Merge,
            },
            caps,
        );
        assert!(merge.contains("b2[params[4] + c * parts + k]"), "{merge}");
    }
}
