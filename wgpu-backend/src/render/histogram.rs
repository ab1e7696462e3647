//! `Histogram` shaders: each invocation walks the values a workgroup-grid stride apart,
//! computes each element's bin (core's expression) and adds to a private copy of the bins in
//! workgroup memory (one copy per group of invocations, so a few hot bins do not serialize a
//! workgroup); at the end each workgroup adds its copies to the output once. Bins that do not
//! fit in workgroup memory are added to the output directly. Counts are `u32` (`atomicAdd`),
//! f32 weights are added by compare-and-swap on their bits (WGSL has no float atomics).

use super::expr::emit_tree;
use super::prelude::{dtypes_of, helpers};
use super::{binding, compute_type, header, load, scalar_lets, Caps, ENTRY};
use std::collections::BTreeSet;
use std::fmt::Write;
use strata_core::ir::Expr;
use strata_core::{DType, Result};

/// The structure of a histogram dispatch. Bindings: 0 the output's bins `[base, base +
/// bins)` (`array<atomic<u32>>`), 1 the values, 2 the weights (when weighted). Params: `[0]`
/// elements, `[1]` the values' first element in their window, `[2]` the weights', `[3]` the
/// first bin bound (`base`: bins past a binding are dispatched in ranges), `[4]` its element
/// in the output's window, then two words per scalar.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct HistogramSig {
    /// Each element's bin, over input 0 (`x0`) and the scalars.
    pub bin: Expr,
    pub values: DType,
    /// The output's dtype: u32 counts or f32 weight sums.
    pub acc: DType,
    pub weighted: bool,
    pub scalars: Vec<DType>,
    /// Bins bound (all of them, or a range that fits a binding).
    pub bins: usize,
    /// Private copies of the bins in workgroup memory; 0: none.
    pub copies: usize,
}

impl strata_core::kernel_cache::Owned for HistogramSig {}

/// The first scalar word.
pub(crate) const FIRST_SCALAR: usize = 5;

/// A statement adding `v` (a `u32` count or an f32 value) to atomic `slot`.
fn add(acc: DType, slot: &str, v: &str) -> String {
    if acc == DType::F32 {
        format!(
            "{{ var old = atomicLoad(&{slot}); loop {{ let r = atomicCompareExchangeWeak(&{slot}, \
             old, bitcast<u32>(bitcast<f32>(old) + {v})); if (r.exchanged) {{ break; }} \
             old = r.old_value; }} }}"
        )
    } else {
        format!("atomicAdd(&{slot}, {v});")
    }
}

/// The WGSL source of a histogram dispatch.
pub(crate) fn source(sig: &HistogramSig, caps: Caps) -> Result<String> {
    let mut used = BTreeSet::from([sig.values, sig.acc]);
    dtypes_of(&sig.bin, &mut used);
    let mut src = header(caps);
    src.push_str("@group(0) @binding(1) var<storage, read_write> b0: array<atomic<u32>>;\n");
    src.push_str(&binding(1, sig.values, false, caps));
    if sig.weighted {
        src.push_str(&binding(2, sig.acc, false, caps));
    }
    let (bins, copies) = (sig.bins, sig.copies);
    if copies > 0 {
        let _ = writeln!(
            src,
            "var<workgroup> private_bins: array<atomic<u32>, {}>;",
            copies * bins
        );
    }
    src.push_str(&helpers(&used, caps));
    src.push_str(ENTRY);
    scalar_lets(&sig.scalars, FIRST_SCALAR, caps, &mut src);
    let target = if copies > 0 {
        let _ = writeln!(
            src,
            "  for (var j = lid; j < {all}u; j = j + 256u) {{ atomicStore(&private_bins[j], 0u); }}\n  \
             workgroupBarrier();\n  let mine = ((lid / 32u) % {copies}u) * {bins}u;",
            all = copies * bins
        );
        "private_bins[mine + u32(b)]"
    } else {
        "b0[u32(b) + params[4]]"
    };
    let _ = writeln!(
        src,
        "  let n = params[0];\n  let stride = nwg.x * nwg.y * 256u;\n  \
         for (var i = gid; i < n; i = i + stride) {{\n    let x0: {} = {};",
        compute_type(sig.values),
        load(sig.values, "b1", "params[1] + i", caps)
    );
    let mut body = String::new();
    let mut next = 0;
    let b = emit_tree(&sig.bin, &mut body, &mut next, caps)?;
    src.push_str(&body);
    let one = if sig.weighted {
        load(sig.acc, "b2", "params[2] + i", caps)
    } else {
        "1u".to_string()
    };
    let _ = writeln!(
        src,
        "    let b = {b} - bitcast<i32>(params[3]);\n    if (b >= 0 && b < {bins}) {{ {} }}\n  }}",
        add(sig.acc, target, &one)
    );
    if copies > 0 {
        let total = if sig.acc == DType::F32 {
            "var t = 0.0;"
        } else {
            "var t = 0u;"
        };
        let read = if sig.acc == DType::F32 {
            "bitcast<f32>(atomicLoad(&private_bins[c * {bins}u + j]))"
        } else {
            "atomicLoad(&private_bins[c * {bins}u + j])"
        }
        .replace("{bins}", &bins.to_string());
        let zero = if sig.acc == DType::F32 { "0.0" } else { "0u" };
        let _ = writeln!(
            src,
            "  workgroupBarrier();\n  for (var j = lid; j < {bins}u; j = j + 256u) {{\n    {total}\n    \
             for (var c = 0u; c < {copies}u; c = c + 1u) {{ t = t + {read}; }}\n    \
             if (t != {zero}) {{ {} }}\n  }}",
            add(sig.acc, "b0[j + params[4]]", "t")
        );
    }
    src.push_str("}\n");
    Ok(src)
}
