//! `Histogram` kernels: a grid-stride loop over the values computes each element's bin (core's
//! expression, emitted like a map's) and adds to a private copy of the bins in shared memory,
//! neighbouring lanes to different copies so a few hot bins (an exponent histogram's) do not
//! serialize a warp; at the end each block adds its copies to the output once. Bins that do
//! not fit in shared memory are added to the output directly.

use super::expr::emit_tree;
use super::{compute_type, from_storage, index_type, scalar_from_word, storage_type};
use super::{Generated, Rendered};
use std::fmt::Write;
use strata_core::ir::Expr;
use strata_core::{DType, Result};

/// The structure of a histogram launch. Words: `n`, `bins`, the values, the weights (when
/// weighted), the output, then one per scalar.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct HistogramSig {
    /// Each element's bin, over input 0 (`x0`) and the scalars.
    pub bin: Expr,
    pub values: DType,
    /// The output's dtype (u32, u64, f32 or f64), and the weights' when weighted.
    pub acc: DType,
    pub weighted: bool,
    pub scalars: Vec<DType>,
    /// Private copies of the bins per block in dynamic shared memory; 0: none.
    pub copies: usize,
    pub wide: bool,
}

impl strata_core::kernel_cache::Owned for HistogramSig {}

impl Generated for HistogramSig {
    const NAME: &'static str = "strata_histogram";
    fn render(&self) -> Result<Rendered> {
        source(self).map(Rendered::single)
    }
}

/// Threads per block.
pub(crate) const BLOCK: usize = 512;

/// Elements a thread loads before it bins them.
const UNROLL: usize = 4;

/// One element's bin and its add to `target`, from its stored value `raw` (and weight
/// `weight`). (Aggregating a warp's equal bins first with `__match_any_sync` measured 1.1–4×
/// slower on an H200, an exponent histogram's few hot bins included.)
fn element(
    sig: &HistogramSig,
    s: &mut String,
    raw: &str,
    weight: &str,
    target: &str,
    next: &mut usize,
) -> Result<()> {
    let acc = storage_type(sig.acc);
    let _ = writeln!(
        s,
        "    {{\n      const {} x0 = {};",
        compute_type(sig.values),
        from_storage(sig.values, raw)
    );
    let b = emit_tree(&sig.bin, s, "      ", next)?;
    let _ = writeln!(s, "      const int b = (int)({b});");
    let add = if sig.weighted {
        weight.to_string()
    } else {
        format!("({acc})1")
    };
    let _ = writeln!(
        s,
        "      if (b >= 0 && b < bins) atomicAdd(&{target}[b], {add});"
    );
    s.push_str("    }\n");
    Ok(())
}

/// The CUDA C source of a histogram kernel named `strata_histogram`.
pub(crate) fn source(sig: &HistogramSig) -> Result<String> {
    let idx = index_type(sig.wide);
    let acc = storage_type(sig.acc);
    let first_scalar = 4 + usize::from(sig.weighted);
    let total = first_scalar + sig.scalars.len();
    let out_word = 3 + usize::from(sig.weighted);
    let mut s = String::new();
    let _ = writeln!(
        s,
        "extern \"C\" __global__ void __launch_bounds__({BLOCK}) strata_histogram(const Args<{total}> p) {{"
    );
    let _ = writeln!(
        s,
        "  const {idx} n = ({idx})p.w[0];\n  const int bins = (int)p.w[1];"
    );
    let _ = writeln!(
        s,
        "  const {st}* __restrict__ in = (const {st}*)p.w[2];",
        st = storage_type(sig.values)
    );
    if sig.weighted {
        let _ = writeln!(s, "  const {acc}* __restrict__ wt = (const {acc}*)p.w[3];");
    }
    let _ = writeln!(s, "  {acc}* out = ({acc}*)p.w[{out_word}];");
    for (k, &d) in sig.scalars.iter().enumerate() {
        let _ = writeln!(
            s,
            "  const {} s{k} = {};",
            compute_type(d),
            scalar_from_word(d, &format!("p.w[{}]", first_scalar + k))
        );
    }
    let target = if sig.copies > 0 {
        let _ = writeln!(
            s,
            "  extern __shared__ __align__(8) unsigned char hist_shared[];\n  \
             {acc}* priv = ({acc}*)hist_shared;\n  \
             for (int j = threadIdx.x; j < {c} * bins; j += blockDim.x) priv[j] = 0;\n  \
             __syncthreads();\n  \
             {acc}* mine = priv + (threadIdx.x % {c}) * bins;",
            c = sig.copies
        );
        "mine"
    } else {
        "out"
    };
    // Four elements a thread in flight (their loads first), then the rest one at a time.
    let _ = writeln!(
        s,
        "  const {idx} stride = ({idx})gridDim.x * blockDim.x;\n  \
         {idx} i = ({idx})blockIdx.x * blockDim.x + threadIdx.x;\n  \
         for (; i + 3 * stride < n; i += 4 * stride) {{"
    );
    let st = storage_type(sig.values);
    for k in 0..UNROLL {
        let _ = writeln!(s, "    const {st} r{k} = in[i + {k} * stride];");
        if sig.weighted {
            let _ = writeln!(s, "    const {acc} q{k} = wt[i + {k} * stride];");
        }
    }
    let mut next = 0;
    for k in 0..UNROLL {
        element(
            sig,
            &mut s,
            &format!("r{k}"),
            &format!("q{k}"),
            target,
            &mut next,
        )?;
    }
    let _ = writeln!(s, "  }}\n  for (; i < n; i += stride) {{");
    let _ = writeln!(s, "    const {st} r0 = in[i];");
    if sig.weighted {
        let _ = writeln!(s, "    const {acc} q0 = wt[i];");
    }
    element(sig, &mut s, "r0", "q0", target, &mut next)?;
    s.push_str("  }\n");
    if sig.copies > 0 {
        let _ = writeln!(
            s,
            "  __syncthreads();\n  for (int j = threadIdx.x; j < bins; j += blockDim.x) {{\n    \
             {acc} t = 0;\n    for (int c = 0; c < {}; c++) t += priv[c * bins + j];\n    \
             if (t != 0) atomicAdd(&out[j], t);\n  }}",
            sig.copies
        );
    }
    s.push_str("}\n");
    Ok(s)
}
