//! `LayerNormBackward` kernels (core's [`layer_norm_plan`]): a workgroup of 256 invocations
//! takes rows `part, part + parts, …`; each invocation keeps its elements of `x` and `g`
//! (elements `lane + k·256`) in registers — written out as separate variables, as the
//! softmax kernel keeps its row, since a private array indexed in a loop may be placed in
//! memory by the driver —, the workgroup adds `Σĝ`, `Σĝ·x̂` and `Σx̂` (by subgroups where the
//! adapter has them, through a workgroup buffer that alternates between rows, else a tree),
//! and each invocation writes its `dx` from the registers. `γ` is loaded once a workgroup;
//! with `columns`, each invocation keeps the sums of `g·x̂` and `g` of its columns over the
//! workgroup's rows and stores them once, in the workgroup's row of the partial sums. f32
//! only: 16-bit elements share a word, which neighbouring invocations would both write.
//!
//! [`layer_norm_plan`]: strata_core::lower::layer_norm_plan

use super::{binding, header, load, store, Caps, ENTRY};
use std::fmt::Write;
use strata_core::DType;

/// Elements of a row each invocation keeps at most.
pub(crate) const PER_INVOCATION: usize = 16;

/// The longest row the kernel takes: a workgroup's invocations, each keeping
/// [`PER_INVOCATION`] elements.
pub(crate) const LONGEST_ROW: usize = 256 * PER_INVOCATION;

/// The structure of a layer norm's backward dispatch.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct LayerNormSig {
    /// Input 4 is `γ`.
    pub weight: bool,
    /// Outputs 1 and 2 take the column sums.
    pub columns: bool,
    /// Elements of a row each invocation keeps (the row's length over 256, rounded up).
    pub per_invocation: usize,
}

impl strata_core::kernel_cache::Owned for LayerNormSig {}

/// `params`: rows, n, parts, then each binding's first element (dx, the column sums, x, g,
/// mean, rstd, γ; 0 for those not bound).
pub(crate) const PARAMS: usize = 11;

/// The WGSL source of a layer norm's backward.
pub(crate) fn source(sig: &LayerNormSig, caps: Caps) -> String {
    let d = DType::F32;
    let k = sig.per_invocation;
    let mut src = header(caps);
    // Bindings: outputs first (dx, then the sums), then x, g, mean, rstd, γ.
    let outputs = 1 + 2 * sig.columns as usize;
    let inputs = 4 + sig.weight as usize;
    for slot in 0..outputs + inputs {
        src.push_str(&binding(slot, d, false, caps));
    }
    let (x, g, mean, rstd, w) = (
        format!("b{outputs}"),
        format!("b{}", outputs + 1),
        format!("b{}", outputs + 2),
        format!("b{}", outputs + 3),
        format!("b{}", outputs + 4),
    );
    let by_subgroups = caps.subgroups;
    if by_subgroups {
        src.push_str("var<workgroup> sha: array<f32, 512>;\nvar<workgroup> shb: array<f32, 512>;\nvar<workgroup> shc: array<f32, 512>;\n");
        src.push_str(&super::softmax::subgroup_entry());
    } else {
        src.push_str("var<workgroup> sha: array<f32, 256>;\nvar<workgroup> shb: array<f32, 256>;\nvar<workgroup> shc: array<f32, 256>;\n");
        src.push_str(ENTRY);
    }
    src.push_str(
        "  let rows = params[0];\n  let n = params[1];\n  let parts = params[2];\n  \
         let part = wg.y * nwg.x + wg.x;\n  let lane = lid;\n",
    );
    let _ = writeln!(
        src,
        "  let dxo = params[3];\n  let gxo = params[4];\n  let gso = params[5];\n  \
         let xo = params[6];\n  let go = params[7];\n  let mo = params[8];\n  let ro = params[9];\n  \
         let wo = params[10];"
    );
    for e in 0..k {
        let _ = writeln!(src, "  let c{e} = {e}u * 256u + lane;");
        let weight = match sig.weight {
            true => format!(
                "select(0.0, {}, c{e} < n)",
                load(d, &w, &format!("wo + c{e}"), caps)
            ),
            false => "1.0".into(),
        };
        let _ = writeln!(src, "  let w{e} = {weight};");
        if sig.columns {
            let _ = writeln!(src, "  var cgx{e} = 0.0;\n  var cg{e} = 0.0;");
        }
    }
    src.push_str("  var parity = 0u;\n  if (part < parts) {\n");
    src.push_str(
        "  for (var row = part; row < rows; row = row + parts) {\n    let base = row * n;\n",
    );
    for e in 0..k {
        let _ = writeln!(
            src,
            "    var x{e} = 0.0;\n    var g{e} = 0.0;\n    if (c{e} < n) {{ x{e} = {}; g{e} = {}; }}",
            load(d, &x, &format!("xo + base + c{e}"), caps),
            load(d, &g, &format!("go + base + c{e}"), caps)
        );
    }
    let _ = writeln!(
        src,
        "    let m = {};\n    let rs = {};\n    var s0 = 0.0;\n    var s1 = 0.0;\n    var s2 = 0.0;",
        load(d, &mean, "mo + row", caps),
        load(d, &rstd, "ro + row", caps)
    );
    for e in 0..k {
        let _ = writeln!(
            src,
            "    if (c{e} < n) {{ let xh = (x{e} - m) * rs; let gh = g{e} * w{e}; s0 = s0 + gh; s1 = s1 + gh * xh; s2 = s2 + xh; }}"
        );
    }
    if by_subgroups {
        // Each subgroup's sums, then the subgroups' in their order; the buffer alternates
        // between rows, so one barrier a row keeps a fast invocation's next sums from
        // overwriting ones still being read.
        src.push_str(
            "    let p0 = subgroupAdd(s0);\n    let p1 = subgroupAdd(s1);\n    let p2 = subgroupAdd(s2);\n    \
             let at = parity * 256u;\n    \
             if (sl == 0u) { sha[at + sg] = p0; shb[at + sg] = p1; shc[at + sg] = p2; }\n    \
             workgroupBarrier();\n    s0 = sha[at];\n    s1 = shb[at];\n    s2 = shc[at];\n    \
             for (var i = 1u; i < nsg; i = i + 1u) { s0 = s0 + sha[at + i]; s1 = s1 + shb[at + i]; s2 = s2 + shc[at + i]; }\n    \
             parity = 1u - parity;\n",
        );
    } else {
        src.push_str(
            "    sha[lane] = s0;\n    shb[lane] = s1;\n    shc[lane] = s2;\n    workgroupBarrier();\n    \
             for (var st = 128u; st > 0u; st = st >> 1u) {\n      \
             if (lane < st) { sha[lane] = sha[lane] + sha[lane + st]; shb[lane] = shb[lane] + shb[lane + st]; shc[lane] = shc[lane] + shc[lane + st]; }\n      \
             workgroupBarrier();\n    }\n    \
             s0 = sha[0];\n    s1 = shb[0];\n    s2 = shc[0];\n    workgroupBarrier();\n",
        );
    }
    src.push_str("    let a = s0 / f32(n);\n    let b = (s1 - a * s2) / f32(n);\n");
    for e in 0..k {
        let columns = match sig.columns {
            true => format!(" cgx{e} = cgx{e} + g{e} * xh; cg{e} = cg{e} + g{e};"),
            false => String::new(),
        };
        let _ =
            writeln!(
            src,
            "    if (c{e} < n) {{ let xh = (x{e} - m) * rs; let gh = g{e} * w{e}; {}{columns} }}",
            store(d, "b0", &format!("dxo + base + c{e}"), "((gh - a) - xh * b) * rs", caps)
        );
    }
    src.push_str("  }\n");
    if sig.columns {
        for e in 0..k {
            let _ = writeln!(
                src,
                "  if (c{e} < n) {{ {} {} }}",
                store(
                    d,
                    "b1",
                    &format!("gxo + part * n + c{e}"),
                    &format!("cgx{e}"),
                    caps
                ),
                store(
                    d,
                    "b2",
                    &format!("gso + part * n + c{e}"),
                    &format!("cg{e}"),
                    caps
                )
            );
        }
    }
    src.push_str("  }\n}\n");
    src
}

/// The structure of a layer norm's forward dispatch.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct LayerNormForwardSig {
    /// An input is `γ`.
    pub weight: bool,
    /// The last input is `β`.
    pub bias: bool,
    /// Elements of a row each invocation keeps (the row's length over 256, rounded up).
    pub per_invocation: usize,
}

impl strata_core::kernel_cache::Owned for LayerNormForwardSig {}

/// `params` of the forward: rows, n, parts, eps's bits, then each binding's first element (y,
/// mean, rstd, x, γ, β; 0 for those not bound).
pub(crate) const FORWARD_PARAMS: usize = 10;

/// The WGSL source of a layer norm's forward: each row's `Σx`, then `Σ(x − mean)²`, combined
/// like the backward's sums, and `y` written from the kept elements.
pub(crate) fn forward_source(sig: &LayerNormForwardSig, caps: Caps) -> String {
    let d = DType::F32;
    let k = sig.per_invocation;
    let mut src = header(caps);
    // Bindings: y, mean, rstd, then x, γ, β.
    let inputs = 1 + sig.weight as usize + sig.bias as usize;
    for slot in 0..3 + inputs {
        src.push_str(&binding(slot, d, false, caps));
    }
    let (w, b) = ("b4".to_string(), format!("b{}", 4 + sig.weight as usize));
    if caps.subgroups {
        src.push_str("var<workgroup> sha: array<f32, 512>;\n");
        src.push_str(&super::softmax::subgroup_entry());
    } else {
        src.push_str("var<workgroup> sha: array<f32, 256>;\n");
        src.push_str(ENTRY);
    }
    src.push_str(
        "  let rows = params[0];\n  let n = params[1];\n  let parts = params[2];\n  \
         let eps = bitcast<f32>(params[3]);\n  let part = wg.y * nwg.x + wg.x;\n  let lane = lid;\n  \
         let yo = params[4];\n  let mo = params[5];\n  let ro = params[6];\n  let xo = params[7];\n  \
         let wo = params[8];\n  let bo = params[9];\n",
    );
    for e in 0..k {
        let _ = writeln!(src, "  let c{e} = {e}u * 256u + lane;");
        let param = |on: bool, buf: &str, first: &str, none: &str| match on {
            true => format!(
                "select(0.0, {}, c{e} < n)",
                load(d, buf, &format!("{first} + c{e}"), caps)
            ),
            false => none.to_string(),
        };
        let _ = writeln!(
            src,
            "  let w{e} = {};\n  let be{e} = {};",
            param(sig.weight, &w, "wo", "1.0"),
            param(sig.bias, &b, "bo", "0.0")
        );
    }
    // The workgroup's next row is loaded while this one is summed and written (`nx`).
    src.push_str("  var parity = 0u;\n  if (part < parts) {\n");
    for e in 0..k {
        let _ = writeln!(
            src,
            "  var x{e} = 0.0;\n  if (part < rows && c{e} < n) {{ x{e} = {}; }}",
            load(d, "b3", &format!("xo + part * n + c{e}"), caps)
        );
    }
    src.push_str(
        "  for (var row = part; row < rows; row = row + parts) {\n    let base = row * n;\n    \
         let next = row + parts;\n",
    );
    for e in 0..k {
        let _ = writeln!(
            src,
            "    var nx{e} = 0.0;\n    if (next < rows && c{e} < n) {{ nx{e} = {}; }}",
            load(d, "b3", &format!("xo + next * n + c{e}"), caps)
        );
    }
    // The workgroup's sum of `s`, every invocation ending with it.
    let combine = |src: &mut String, s: &str| {
        if caps.subgroups {
            let _ = writeln!(
                src,
                "    {{\n    let ps = subgroupAdd({s});\n    let at = parity * 256u;\n    \
                 if (sl == 0u) {{ sha[at + sg] = ps; }}\n    workgroupBarrier();\n    {s} = sha[at];\n    \
                 for (var i = 1u; i < nsg; i = i + 1u) {{ {s} = {s} + sha[at + i]; }}\n    \
                 parity = 1u - parity;\n    }}"
            );
        } else {
            let _ = writeln!(
                src,
                "    sha[lane] = {s};\n    workgroupBarrier();\n    \
                 for (var st = 128u; st > 0u; st = st >> 1u) {{\n      \
                 if (lane < st) {{ sha[lane] = sha[lane] + sha[lane + st]; }}\n      workgroupBarrier();\n    }}\n    \
                 {s} = sha[0];\n    workgroupBarrier();"
            );
        }
    };
    src.push_str("    var s0 = 0.0;\n");
    for e in 0..k {
        let _ = writeln!(src, "    s0 = s0 + x{e};");
    }
    combine(&mut src, "s0");
    src.push_str("    let m = s0 / f32(n);\n    var s1 = 0.0;\n");
    for e in 0..k {
        let _ = writeln!(
            src,
            "    if (c{e} < n) {{ let dv = x{e} - m; s1 = s1 + dv * dv; }}"
        );
    }
    combine(&mut src, "s1");
    src.push_str("    let rs = 1.0 / sqrt(s1 / f32(n) + eps);\n");
    for e in 0..k {
        let _ = writeln!(
            src,
            "    if (c{e} < n) {{ {} }}",
            store(
                d,
                "b0",
                &format!("yo + base + c{e}"),
                &format!("(x{e} - m) * rs * w{e} + be{e}"),
                caps
            )
        );
    }
    let _ = writeln!(
        src,
        "    if (lane == 0u) {{ {} {} }}",
        store(d, "b1", "mo + row", "m", caps),
        store(d, "b2", "ro + row", "rs", caps)
    );
    for e in 0..k {
        let _ = writeln!(src, "    x{e} = nx{e};");
    }
    src.push_str("  }\n  }\n}\n");
    src
}
