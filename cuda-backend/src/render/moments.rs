//! `ChannelMoments` and `ChannelGradSums` kernels: core's plan ([`moments_plan`]) as CUDA C.
//! Block `c·parts + p` takes slice `p` of channel `c`; for the moments each thread loads
//! vectors `t, t + threads, …` of the slice, [`ROUND`] at a time, takes the round's mean and
//! squared deviations (each summed as a tree), and merges them into its running count, mean
//! and sum of squared deviations by Chan's formula (one division a round).
//! A vector's place — the run `o` and offset `i` of its first value — advances by a constant
//! step with one carry, so no vector divides by the run's length. The warps merge their
//! threads' statistics down a shuffle tree, thread 0 the warps' in order, and stores the
//! slice's mean and biased variance: the channel's, rounded to the dtype, with one slice a
//! channel ([`Stage::Whole`]); else in the accumulation type in scratch ([`Stage::Slices`]),
//! which a thread a channel then merges ([`Stage::Merge`]). The backward sums take the same
//! slices and stages, each thread adding `g` and `g·(x − mean)` over its vectors
//! ([`grad_source`]).
//!
//! [`moments_plan`]: strata_core::lower::moments_plan

use super::{compute_type, from_storage, storage_type, to_storage, vector_type};
use super::{Generated, Rendered};
use std::fmt::Write;
use strata_core::lower::moments_plan::{ROUND, THREADS};
use strata_core::{DType, Result};

/// Which of a channel moments' launches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Stage {
    /// One slice a channel: the block stores the channel's statistics.
    Whole,
    /// Several: each block stores its slice's, in the accumulation type.
    Slices,
    /// A thread a channel merges its slices' statistics.
    Merge,
}

/// The structure of a channel moments launch.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct MomentsSig {
    pub dtype: DType,
    /// Elements per vector load (1 for [`Stage::Merge`]).
    pub vector: usize,
    pub stage: Stage,
}

impl strata_core::kernel_cache::Owned for MomentsSig {}

impl Generated for MomentsSig {
    const NAME: &'static str = "strata_channel_moments";
    fn render(&self) -> Result<Rendered> {
        Ok(Rendered::single(match self.stage {
            Stage::Merge => merge_source(self.dtype),
            _ => source(self),
        }))
    }
}

/// Argument words: channels, inner, count (values a slice), parts, then the addresses of x,
/// the means and the variances (the channels', or the slices' in scratch).
pub(crate) const WORDS: usize = 7;

/// Argument words of the merge: channels, parts, the addresses of the slices' means and
/// variances, then of the channels'.
pub(crate) const MERGE_WORDS: usize = 6;

/// What the sources of a slice a block share: dtype `d` in vectors of `v` elements, stored as
/// `st`, added in `at`, moved as `vt`.
struct Slice {
    d: DType,
    v: usize,
    st: &'static str,
    at: &'static str,
    vt: &'static str,
}

impl Slice {
    fn new(d: DType, v: usize) -> Slice {
        Slice {
            d,
            v,
            st: storage_type(d),
            at: compute_type(d.accumulator()),
            vt: vector_type(v * d.itemsize()),
        }
    }

    /// An element `e` of the dtype as a value of the accumulation type.
    fn load(&self, e: &str) -> String {
        let value = from_storage(self.d, e);
        match compute_type(self.d) == self.at {
            true => value,
            false => format!("({}){value}", self.at),
        }
    }

    /// The outputs' type at `stage`: the channel's values rounded to the dtype, or the slice's
    /// kept for the merge.
    fn output(&self, stage: Stage) -> &'static str {
        match stage {
            Stage::Whole => self.st,
            _ => self.at,
        }
    }

    /// Value `v` as stored at `stage`.
    fn store(&self, stage: Stage, v: &str) -> String {
        match stage {
            Stage::Whole => to_storage(self.d, v),
            _ => v.to_string(),
        }
    }

    /// The entry `name` taking `words` words: the sizes, `pointers` (its lines), the block's
    /// channel and slice, the thread's place, and the run `o` and offset `i` of its first
    /// vector with the step between its vectors.
    fn open(&self, name: &str, words: usize, pointers: &str) -> String {
        let (t, v, st, vt) = (THREADS, self.v, self.st, self.vt);
        format!(
            "extern \"C\" __global__ void __launch_bounds__({t}) {name}(const Args<{words}> p) {{
  const i64 channels = (i64)p.w[0], inner = (i64)p.w[1], count = (i64)p.w[2], parts = (i64)p.w[3];
{pointers}  const i64 b = blockIdx.x, c = b / parts, part = b - c * parts;
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  typedef union {{ {vt} v; {st} e[{v}]; }} Vec;
  // The thread's next vector starts at value j of the channel: run o, offset i.
  const i64 step = (i64){t} * {v}, step_o = step / inner, step_i = step - step_o * inner;
  const i64 j = part * count + (i64)t * {v};
  i64 o = j / inner, i = j - o * inner;
  const i64 vectors = count / {v};
"
        )
    }
}

/// The CUDA C source of a slice a block ([`Stage::Whole`], [`Stage::Slices`]), named
/// `strata_channel_moments`.
pub(crate) fn source(sig: &MomentsSig) -> String {
    let slice = Slice::new(sig.dtype, sig.vector);
    let (at, vt, v) = (slice.at, slice.vt, slice.v);
    let load = |e: &str| slice.load(e);
    let (t, warps) = (THREADS, THREADS / 32);
    let ot = slice.output(sig.stage);
    let store = |v: &str| slice.store(sig.stage, v);
    let mut s = slice.open(
        "strata_channel_moments",
        WORDS,
        &format!(
            "  const {st}* x = (const {st}*)p.w[4];\n  {ot}* means = ({ot}*)p.w[5];\n  {ot}* vars = ({ot}*)p.w[6];\n",
            st = slice.st
        ),
    );
    let _ = writeln!(s, "  {at} n = 0, m = 0, q = 0;\n  i64 k = t;");
    // `r` vectors loaded into `into`, the place advancing past each.
    let load_round = |s: &mut String, into: &str, r: usize| {
        let _ = writeln!(s, "#pragma unroll\n    for (int r = 0; r < {r}; r++) {{\n      {into}[r].v = *(const {vt}*)(x + (o * channels + c) * inner + i);\n      i += step_i; o += step_o;\n      if (i >= inner) {{ i -= inner; o++; }}\n    }}");
    };
    // The round in `u` (`r` vectors): its mean `mb` and squared deviations `qb`, each summed
    // as a tree (short dependency chains), then merged (Chan: the means' difference weighted
    // by the counts).
    let merge_round = |s: &mut String, r: usize| {
        let nb = r * v;
        let values: Vec<String> = (0..nb).map(|e| format!("x{e}")).collect();
        for (e, name) in values.iter().enumerate() {
            let _ = writeln!(
                s,
                "    const {at} {name} = {};",
                load(&format!("u[{}].e[{}]", e / v, e % v))
            );
        }
        let _ = writeln!(
            s,
            "    const {at} mb = {} * ({at})(1.0 / {nb});",
            tree(&values)
        );
        let squares: Vec<String> = values
            .iter()
            .map(|x| format!("({x} - mb) * ({x} - mb)"))
            .collect();
        let _ = writeln!(
            s,
            "    const {at} qb = {};\n    const {at} nn = n + ({at}){nb}, f = ({at}){nb} / nn, dm = mb - m;\n    m += dm * f; q += qb + dm * dm * n * f; n = nn;",
            tree(&squares)
        );
    };
    // Whole rounds, then the last vectors one at a time. (Issuing a round's loads before the
    // last one was summed measured the same.)
    let _ = writeln!(
        s,
        "  Vec u[{ROUND}];\n  for (; k + {} < vectors; k += {}) {{",
        (ROUND - 1) * t,
        ROUND * t
    );
    load_round(&mut s, "u", ROUND);
    merge_round(&mut s, ROUND);
    let _ = writeln!(s, "  }}\n  for (; k < vectors; k += {t}) {{");
    load_round(&mut s, "u", 1);
    merge_round(&mut s, 1);
    // Another thread's (or warp's) statistics `on`, `om`, `oq` merged into this one's.
    let merge = format!(
        "{{ const {at} nn = n + on; if (nn > 0) {{ const {at} f = on / nn, dm = om - m; m += dm * f; q += oq + dm * dm * n * f; n = nn; }} }}"
    );
    let _ = writeln!(
        s,
        "  }}
  for (int off = 16; off > 0; off >>= 1) {{
    const {at} on = __shfl_down_sync(0xffffffffu, n, off), om = __shfl_down_sync(0xffffffffu, m, off), oq = __shfl_down_sync(0xffffffffu, q, off);
    {merge}
  }}
  __shared__ {at} sh[3][{warps}];
  if (lane == 0) {{ sh[0][warp] = n; sh[1][warp] = m; sh[2][warp] = q; }}
  __syncthreads();
  if (t == 0) {{
    for (int w = 1; w < {warps}; w++) {{
      const {at} on = sh[0][w], om = sh[1][w], oq = sh[2][w];
      {merge}
    }}
    means[b] = {};
    vars[b] = {};
  }}
}}",
        store("m"),
        store(&format!("(q / ({at})count)"))
    );
    s
}

/// The CUDA C source of [`Stage::Merge`] named `strata_channel_moments`: a thread a channel,
/// the slices' mean, then the mean of each slice's variance plus its mean's squared distance
/// from the channel's (equal slices), rounded to the dtype.
pub(crate) fn merge_source(d: DType) -> String {
    let (st, at) = (storage_type(d), compute_type(d.accumulator()));
    format!(
        "extern \"C\" __global__ void __launch_bounds__({THREADS}) strata_channel_moments(const Args<{MERGE_WORDS}> p) {{
  const i64 channels = (i64)p.w[0], parts = (i64)p.w[1];
  const {at}* sm = (const {at}*)p.w[2];
  const {at}* sv = (const {at}*)p.w[3];
  {st}* mean = ({st}*)p.w[4];
  {st}* var = ({st}*)p.w[5];
  const i64 c = (i64)blockIdx.x * {THREADS} + threadIdx.x;
  if (c >= channels) return;
  {at} m = 0, v = 0;
  for (i64 k = 0; k < parts; k++) m += sm[c * parts + k];
  m /= ({at})parts;
  for (i64 k = 0; k < parts; k++) {{ const {at} dm = sm[c * parts + k] - m; v += sv[c * parts + k] + dm * dm; }}
  mean[c] = {};
  var[c] = {};
}}",
        to_storage(d, "m"),
        to_storage(d, &format!("(v / ({at})parts)"))
    )
}

/// The structure of a launch of batch norm's backward sums (`ChannelGradSums`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct GradSumsSig {
    pub dtype: DType,
    /// Elements per vector load (1 for [`Stage::Merge`]).
    pub vector: usize,
    pub stage: Stage,
}

impl strata_core::kernel_cache::Owned for GradSumsSig {}

impl Generated for GradSumsSig {
    const NAME: &'static str = "strata_channel_grad_sums";
    fn render(&self) -> Result<Rendered> {
        Ok(Rendered::single(match self.stage {
            Stage::Merge => grad_merge_source(self.dtype),
            _ => grad_source(self),
        }))
    }
}

/// Argument words of the backward sums: channels, inner, count, parts, then the addresses of
/// x, g, mean, rstd, and of the sums `Σg` and `Σg·x̂` (the channels', or the slices' in
/// scratch).
pub(crate) const GRAD_WORDS: usize = 10;

/// The CUDA C source of a slice a block of the backward sums ([`Stage::Whole`],
/// [`Stage::Slices`]), named `strata_channel_grad_sums`: each thread adds `g` and
/// `g·(x − mean)` over its vectors of `x` and `g` (read at the same places), the block adds
/// the threads', and thread 0 stores `Σg` and `Σg·(x − mean)·rstd`.
pub(crate) fn grad_source(sig: &GradSumsSig) -> String {
    let slice = Slice::new(sig.dtype, sig.vector);
    let (st, at, vt, v) = (slice.st, slice.at, slice.vt, slice.v);
    let load = |e: &str| slice.load(e);
    let (t, warps) = (THREADS, THREADS / 32);
    let ot = slice.output(sig.stage);
    let store = |v: &str| slice.store(sig.stage, v);
    let open = slice.open(
        "strata_channel_grad_sums",
        GRAD_WORDS,
        &format!(
            "  const {st}* x = (const {st}*)p.w[4];\n  const {st}* g = (const {st}*)p.w[5];\n  const {st}* mean = (const {st}*)p.w[6];\n  const {st}* rstd = (const {st}*)p.w[7];\n  {ot}* sums_g = ({ot}*)p.w[8];\n  {ot}* sums_gx = ({ot}*)p.w[9];\n"
        ),
    );
    format!(
        "{open}  const {at} mc = {};
  {at} sg = 0, sgx = 0;
#pragma unroll 4
  for (i64 k = t; k < vectors; k += {t}) {{
    const i64 e = (o * channels + c) * inner + i;
    Vec ux, ug;
    ux.v = *(const {vt}*)(x + e);
    ug.v = *(const {vt}*)(g + e);
    i += step_i; o += step_o;
    if (i >= inner) {{ i -= inner; o++; }}
#pragma unroll
    for (int l = 0; l < {v}; l++) {{ const {at} gv = {}; sg += gv; sgx += gv * ({} - mc); }}
  }}
  for (int off = 16; off > 0; off >>= 1) {{
    sg += __shfl_down_sync(0xffffffffu, sg, off);
    sgx += __shfl_down_sync(0xffffffffu, sgx, off);
  }}
  __shared__ {at} sh[2][{warps}];
  if (lane == 0) {{ sh[0][warp] = sg; sh[1][warp] = sgx; }}
  __syncthreads();
  if (t == 0) {{
    for (int w = 1; w < {warps}; w++) {{ sg += sh[0][w]; sgx += sh[1][w]; }}
    sums_g[b] = {};
    sums_gx[b] = {};
  }}
}}",
        load("mean[c]"),
        load("ug.e[l]"),
        load("ux.e[l]"),
        store("sg"),
        store(&format!("(sgx * {})", load("rstd[c]")))
    )
}

/// The CUDA C source of [`Stage::Merge`] of the backward sums, named
/// `strata_channel_grad_sums`: a thread a channel adds its slices' sums, rounded to the dtype.
pub(crate) fn grad_merge_source(d: DType) -> String {
    let (st, at) = (storage_type(d), compute_type(d.accumulator()));
    format!(
        "extern \"C\" __global__ void __launch_bounds__({THREADS}) strata_channel_grad_sums(const Args<{MERGE_WORDS}> p) {{
  const i64 channels = (i64)p.w[0], parts = (i64)p.w[1];
  const {at}* sg = (const {at}*)p.w[2];
  const {at}* sgx = (const {at}*)p.w[3];
  {st}* sum_g = ({st}*)p.w[4];
  {st}* sum_gx = ({st}*)p.w[5];
  const i64 c = (i64)blockIdx.x * {THREADS} + threadIdx.x;
  if (c >= channels) return;
  {at} a = 0, b = 0;
  for (i64 k = 0; k < parts; k++) {{ a += sg[c * parts + k]; b += sgx[c * parts + k]; }}
  sum_g[c] = {};
  sum_gx[c] = {};
}}",
        to_storage(d, "a"),
        to_storage(d, "b")
    )
}

/// The sum of `terms` added as a balanced tree.
fn tree(terms: &[String]) -> String {
    match terms {
        [] => "0".into(),
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
    fn reads_each_value_once_and_divides_once_a_round() {
        let src = source(&MomentsSig {
            dtype: DType::F32,
            vector: 4,
            stage: Stage::Slices,
        });
        // One load a vector, in two loops (whole rounds, then single vectors).
        assert_eq!(src.matches("*(const uint4*)(x + ").count(), 2, "{src}");
        assert_eq!(src.matches("__syncthreads").count(), 1, "{src}");
        // No division by the run's length inside the loops: the place advances by a carry.
        let body = &src[src.find("for (; k").expect("the rounds")..];
        let loops = &body[..body.find("__shfl_down_sync").expect("the merge")];
        assert!(!loops.contains("/ inner"), "{loops}");
        assert!(src.contains("(float)(1.0 / 16)"), "{src}");
        let half = source(&MomentsSig {
            dtype: DType::BF16,
            vector: 4,
            stage: Stage::Whole,
        });
        // A bf16 channel's statistics computed in f32 and rounded once into bf16.
        assert!(half.contains("bf16_to_f32"), "{half}");
        assert!(half.contains("u16* means"), "{half}");
        assert!(src.contains("float* means"), "{src}");
        assert!(merge_source(DType::BF16).contains("mean[c] = f32_to_bf16(m)"));
        // The backward sums read x and g once each, at the same place.
        let sums = grad_source(&GradSumsSig {
            dtype: DType::F32,
            vector: 4,
            stage: Stage::Whole,
        });
        assert_eq!(sums.matches("*(const uint4*)(x + e)").count(), 1, "{sums}");
        assert_eq!(sums.matches("*(const uint4*)(g + e)").count(), 1, "{sums}");
        assert!(sums.contains("sums_gx[b] = (sgx * rstd[c])"), "{sums}");
    }
}
