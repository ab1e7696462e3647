//! `LayerNorm` and `LayerNormBackward` kernels: core's plan ([`layer_norm_plan`]) as CUDA C.
//! Forward, a block takes rows `blockIdx.x, + gridDim.x, …`; each thread loads its vectors of
//! `x` into registers, the block adds `Σx` and then `Σ(x − mean)²` (each a butterfly in the
//! warps, then the warps' values in one order), and each thread writes its `y` from the
//! registers; thread 0 stores the row's mean and `rstd`. Backward, a block takes
//! rows `blockIdx.x, + gridDim.x, …`; each thread loads its vectors of `x` and `g` (vectors
//! `t, t + threads, …` of the row) into registers, the block adds `Σĝ`, `Σĝ·x̂` and `Σx̂`
//! (a butterfly in each warp, then the warps' values in one order, through a shared-memory
//! buffer that alternates between rows so one barrier a row suffices), and each thread writes
//! its `dx` from the registers. `γ` is loaded once a block; with `columns`, each thread keeps
//! the sums of `g·x̂` and `g` of its columns over the block's rows and stores them once, in
//! the block's row of the partial sums.
//!
//! [`layer_norm_plan`]: strata_core::lower::layer_norm_plan

use super::{compute_type, from_storage, storage_type, to_storage, vector_type};
use super::{Generated, Rendered};
use std::fmt::Write;
use strata_core::{DType, Result};

/// The structure of a layer norm's backward launch.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct LayerNormSig {
    pub dtype: DType,
    /// Input 4 is `γ`.
    pub weight: bool,
    /// Outputs 1 and 2 take the column sums.
    pub columns: bool,
    /// Threads of a block (a power of two, at least 32).
    pub threads: usize,
    /// Elements of a row a thread keeps (a multiple of `vector`).
    pub per_thread: usize,
    /// Elements per vector load and store.
    pub vector: usize,
}

impl strata_core::kernel_cache::Owned for LayerNormSig {}

impl Generated for LayerNormSig {
    const NAME: &'static str = "strata_layer_norm_backward";
    fn render(&self) -> Result<Rendered> {
        Ok(Rendered::single(source(self)))
    }
}

/// Argument words: rows, n, then the addresses of x, g, mean, rstd, dx, γ (0 without), and
/// the two column sums (0 without).
pub(crate) const WORDS: usize = 10;

/// What both kernels' sources share: a block of `t` threads a row, each keeping `vectors`
/// vectors of `v` elements (dtype `d`, storage `st`, computed in `at`, moved as `vt`).
struct Rows {
    d: DType,
    t: usize,
    v: usize,
    vectors: usize,
    st: &'static str,
    at: &'static str,
    vt: &'static str,
    warps: usize,
}

impl Rows {
    fn new(d: DType, threads: usize, per_thread: usize, vector: usize) -> Rows {
        Rows {
            d,
            t: threads,
            v: vector,
            vectors: per_thread / vector,
            st: storage_type(d),
            at: compute_type(d.accumulator()),
            vt: vector_type(vector * d.itemsize()),
            warps: threads / 32,
        }
    }

    /// An element `e` of the dtype as a value of the accumulation type.
    fn load(&self, e: &str) -> String {
        let v = from_storage(self.d, e);
        match compute_type(self.d) == self.at {
            true => v,
            false => format!("({}){v}", self.at),
        }
    }

    /// The entry `name` taking `words` words (half a multiprocessor's threads resident: at
    /// most 64 registers a thread, as core's `parts` counts them) and the row count and length.
    fn open(&self, s: &mut String, name: &str, words: usize) {
        let (t, blocks) = (self.t, (1024 / self.t).max(1));
        let _ = writeln!(
            s,
            "extern \"C\" __global__ void __launch_bounds__({t}, {blocks}) {name}(const Args<{words}> p) {{"
        );
        let _ = writeln!(s, "  const i64 rows = (i64)p.w[0], n = (i64)p.w[1];");
    }

    /// The thread's place and the vector type; `sums` values a warp in the alternating buffer.
    fn lanes(&self, s: &mut String, sums: usize) {
        let (at, st, vt, v, warps) = (self.at, self.st, self.vt, self.v, self.warps);
        let _ = writeln!(
            s,
            "  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;"
        );
        let _ = writeln!(s, "  typedef union {{ {vt} v; {st} e[{v}]; }} Vec;");
        let _ = writeln!(s, "  __shared__ {at} sh[2][{warps}][{sums}];");
    }

    /// `body` once a vector of the thread's columns (vector j's element l is column
    /// (j·threads + t)·vector + l), with `c` its first column.
    fn vectors(&self, s: &mut String, body: &str) {
        let (vectors, t, v) = (self.vectors, self.t, self.v);
        let _ = writeln!(
            s,
            "#pragma unroll\n  for (int j = 0; j < {vectors}; j++) {{\n    const i64 c = ((i64)j * {t} + t) * {v};\n    {body}\n  }}"
        );
    }

    /// `body` once an element of the thread's columns inside the row, with `e` its index
    /// among the thread's elements.
    fn each(&self, s: &mut String, body: &str) {
        let v = self.v;
        self.vectors(
            s,
            &format!("if (c < n) {{\n#pragma unroll\n      for (int l = 0; l < {v}; l++) {{\n        const int e = j * {v} + l;\n{body}\n      }}\n    }}"),
        );
    }
}

/// The CUDA C source of a layer norm's backward named `strata_layer_norm_backward`.
pub(crate) fn source(sig: &LayerNormSig) -> String {
    let rows = Rows::new(sig.dtype, sig.threads, sig.per_thread, sig.vector);
    let (d, at, st, vt, warps) = (sig.dtype, rows.at, rows.st, rows.vt, rows.warps);
    let vectors = rows.vectors;
    let load = |e: &str| rows.load(e);
    let each = |s: &mut String, body: &str| rows.each(s, body);
    let mut s = String::new();
    rows.open(&mut s, "strata_layer_norm_backward", WORDS);
    for (k, name) in ["x", "g", "mean", "rstd"].iter().enumerate() {
        let _ = writeln!(s, "  const {st}* {name} = (const {st}*)p.w[{}];", 2 + k);
    }
    let _ = writeln!(s, "  {st}* dx = ({st}*)p.w[6];");
    rows.lanes(&mut s, 3);
    let _ = writeln!(s, "  {at} w[{}];", sig.per_thread);
    if sig.weight {
        let _ = writeln!(s, "  const {st}* gamma = (const {st}*)p.w[7];");
        each(&mut s, &format!("        w[e] = {};", load("gamma[c + l]")));
    }
    if sig.columns {
        let _ = writeln!(
            s,
            "  {at}* sum_gx = ({at}*)p.w[8];\n  {at}* sum_g = ({at}*)p.w[9];"
        );
        let _ = writeln!(
            s,
            "  {at} cgx[{pt}], cg[{pt}];\n#pragma unroll\n  for (int e = 0; e < {pt}; e++) {{ cgx[e] = 0; cg[e] = 0; }}",
            pt = sig.per_thread
        );
    }
    let _ = writeln!(s, "  int parity = 0;");
    let _ = writeln!(
        s,
        "  for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {{\n  const i64 base = r * n;"
    );
    let _ = writeln!(s, "  Vec ux[{vectors}], ug[{vectors}];");
    rows.vectors(
        &mut s,
        &format!("if (c < n) {{ ux[j].v = *(const {vt}*)(x + base + c); ug[j].v = *(const {vt}*)(g + base + c); }}"),
    );
    let _ = writeln!(
        s,
        "  const {at} m = {}, rs = {};",
        load("mean[r]"),
        load("rstd[r]")
    );
    let gamma = match sig.weight {
        true => "gv * w[e]",
        false => "gv",
    };
    let values = format!(
        "        const {at} xv = {}, gv = {};\n        const {at} xh = (xv - m) * rs, gh = {gamma};",
        load("ux[j].e[l]"),
        load("ug[j].e[l]")
    );
    let _ = writeln!(s, "  {at} s0 = 0, s1 = 0, s2 = 0;");
    each(
        &mut s,
        &format!("{values}\n        s0 += gh; s1 += gh * xh; s2 += xh;"),
    );
    // The block's three sums, every thread ending with the same values.
    let _ = writeln!(
        s,
        "  for (int o = 16; o > 0; o >>= 1) {{\n    s0 += __shfl_xor_sync(0xffffffffu, s0, o);\n    s1 += __shfl_xor_sync(0xffffffffu, s1, o);\n    s2 += __shfl_xor_sync(0xffffffffu, s2, o);\n  }}"
    );
    let _ = writeln!(
        s,
        "  if (lane == 0) {{ sh[parity][warp][0] = s0; sh[parity][warp][1] = s1; sh[parity][warp][2] = s2; }}\n  __syncthreads();"
    );
    let _ = writeln!(
        s,
        "  s0 = sh[parity][0][0]; s1 = sh[parity][0][1]; s2 = sh[parity][0][2];\n  for (int k = 1; k < {warps}; k++) {{ s0 += sh[parity][k][0]; s1 += sh[parity][k][1]; s2 += sh[parity][k][2]; }}\n  parity ^= 1;"
    );
    let _ = writeln!(
        s,
        "  const {at} a = s0 / ({at})n, b = (s1 - a * s2) / ({at})n;"
    );
    let columns = match sig.columns {
        true => "\n        cgx[e] += gv * xh; cg[e] += gv;",
        false => "",
    };
    let _ = writeln!(s, "  Vec uo[{vectors}];");
    each(
        &mut s,
        &format!(
            "{values}\n        uo[j].e[l] = {};{columns}",
            to_storage(d, "(((gh - a) - xh * b) * rs)")
        ),
    );
    rows.vectors(
        &mut s,
        &format!("if (c < n) *({vt}*)(dx + base + c) = uo[j].v;"),
    );
    let _ = writeln!(s, "  }}");
    if sig.columns {
        each(
            &mut s,
            "        sum_gx[(i64)blockIdx.x * n + c + l] = cgx[e];\n        sum_g[(i64)blockIdx.x * n + c + l] = cg[e];",
        );
    }
    let _ = writeln!(s, "}}");
    s
}

/// The structure of a layer norm's forward launch.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct LayerNormForwardSig {
    pub dtype: DType,
    /// An input is `γ`.
    pub weight: bool,
    /// The last input is `β`.
    pub bias: bool,
    /// Threads of a block (a power of two, at least 32).
    pub threads: usize,
    /// Elements of a row a thread keeps (a multiple of `vector`).
    pub per_thread: usize,
    /// Elements per vector load and store.
    pub vector: usize,
}

impl strata_core::kernel_cache::Owned for LayerNormForwardSig {}

impl Generated for LayerNormForwardSig {
    const NAME: &'static str = "strata_layer_norm";
    fn render(&self) -> Result<Rendered> {
        Ok(Rendered::single(forward_source(self)))
    }
}

/// Argument words of the forward: rows, n, then the addresses of x, y, mean, rstd, γ (0
/// without), β (0 without), then eps's bits (the accumulator dtype).
pub(crate) const FORWARD_WORDS: usize = 9;

/// The CUDA C source of a layer norm's forward named `strata_layer_norm`.
pub(crate) fn forward_source(sig: &LayerNormForwardSig) -> String {
    let rows = Rows::new(sig.dtype, sig.threads, sig.per_thread, sig.vector);
    let (d, at, st, vt, warps) = (sig.dtype, rows.at, rows.st, rows.vt, rows.warps);
    let vectors = rows.vectors;
    let load = |e: &str| rows.load(e);
    let each = |s: &mut String, body: &str| rows.each(s, body);
    let eps = match d.accumulator() {
        DType::F64 => "__longlong_as_double((long long)p.w[8])",
        _ => "__uint_as_float((unsigned)p.w[8])",
    };
    let mut s = String::new();
    rows.open(&mut s, "strata_layer_norm", FORWARD_WORDS);
    let _ = writeln!(
        s,
        "  const {st}* x = (const {st}*)p.w[2];\n  {st}* y = ({st}*)p.w[3];\n  {st}* mean = ({st}*)p.w[4];\n  {st}* rstd = ({st}*)p.w[5];\n  const {at} eps = {eps};"
    );
    rows.lanes(&mut s, 2);
    let pt = sig.per_thread;
    let _ = writeln!(s, "  {at} w[{pt}], b[{pt}];");
    for (on, name, word, field) in [(sig.weight, "gamma", 6, "w"), (sig.bias, "beta", 7, "b")] {
        if on {
            let _ = writeln!(s, "  const {st}* {name} = (const {st}*)p.w[{word}];");
            each(
                &mut s,
                &format!("        {field}[e] = {};", load(&format!("{name}[c + l]"))),
            );
        }
    }
    // Two rows an iteration, `r` and `r + gridDim.x` (the second where there is one), their
    // sums side by side through the same barriers: one row at a time left the memory idle
    // while a block summed it (630 µs for [65536, 4096] f32 on an H200, 84% of a copy's rate,
    // against 569; the next row loaded ahead of the barriers did no better). `k` picks the row.
    let row = |v: &str, k: usize| format!("{v}{}", ["", "2"][k]);
    // The block's sums of `a` and `b`, every thread ending with them; the buffer alternates
    // between sums, so one barrier a sum suffices.
    let block_sum = |s: &mut String, a: &str, b: &str| {
        let _ = writeln!(
            s,
            "  for (int o = 16; o > 0; o >>= 1) {{ {a} += __shfl_xor_sync(0xffffffffu, {a}, o); {b} += __shfl_xor_sync(0xffffffffu, {b}, o); }}\n  if (lane == 0) {{ sh[parity][warp][0] = {a}; sh[parity][warp][1] = {b}; }}\n  __syncthreads();\n  {a} = sh[parity][0][0]; {b} = sh[parity][0][1];\n  for (int k = 1; k < {warps}; k++) {{ {a} += sh[parity][k][0]; {b} += sh[parity][k][1]; }}\n  parity ^= 1;"
        );
    };
    let _ = writeln!(s, "  int parity = 0;");
    let _ = writeln!(
        s,
        "  for (i64 r = blockIdx.x; r < rows; r += 2 * (i64)gridDim.x) {{\n  const i64 r2 = r + gridDim.x;\n  const bool two = r2 < rows;\n  const i64 base = r * n, base2 = r2 * n;\n  Vec ux[{vectors}], ux2[{vectors}];"
    );
    rows.vectors(
        &mut s,
        &format!("if (c < n) {{ ux[j].v = *(const {vt}*)(x + base + c); if (two) ux2[j].v = *(const {vt}*)(x + base2 + c); }}"),
    );
    let _ = writeln!(s, "  {at} s0 = 0, s02 = 0;");
    each(
        &mut s,
        &format!(
            "        s0 += {};\n        if (two) s02 += {};",
            load("ux[j].e[l]"),
            load("ux2[j].e[l]")
        ),
    );
    block_sum(&mut s, "s0", "s02");
    let _ = writeln!(
        s,
        "  const {at} m = s0 / ({at})n, m2 = s02 / ({at})n;\n  {at} s1 = 0, s12 = 0;"
    );
    each(
        &mut s,
        &format!(
            "        const {at} dv = {} - m; s1 += dv * dv;\n        if (two) {{ const {at} dv2 = {} - m2; s12 += dv2 * dv2; }}",
            load("ux[j].e[l]"),
            load("ux2[j].e[l]")
        ),
    );
    block_sum(&mut s, "s1", "s12");
    let _ = writeln!(
        s,
        "  const {at} rs = ({at})1 / sqrt(s1 / ({at})n + eps), rs2 = ({at})1 / sqrt(s12 / ({at})n + eps);"
    );
    let (scale, shift) = (
        if sig.weight { " * w[e]" } else { "" },
        if sig.bias { " + b[e]" } else { "" },
    );
    for k in 0..2 {
        let (u, m, rs, base) = (row("ux", k), row("m", k), row("rs", k), row("base", k));
        let value = format!(
            "(({} - {m}) * {rs}{scale}{shift})",
            load(&format!("{u}[j].e[l]"))
        );
        each(
            &mut s,
            &format!("        {u}[j].e[l] = {};", to_storage(d, &value)),
        );
        let guard = ["", "two && "][k];
        rows.vectors(
            &mut s,
            &format!("if ({guard}c < n) *({vt}*)(y + {base} + c) = {u}[j].v;"),
        );
    }
    let _ = writeln!(
        s,
        "  if (t == 0) {{ mean[r] = {}; rstd[r] = {}; if (two) {{ mean[r2] = {}; rstd[r2] = {}; }} }}\n  }}\n}}",
        to_storage(d, "m"),
        to_storage(d, "rs"),
        to_storage(d, "m2"),
        to_storage(d, "rs2")
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_row_in_registers_and_syncs_once_a_row() {
        let sig = LayerNormSig {
            dtype: DType::F32,
            weight: true,
            columns: true,
            threads: 512,
            per_thread: 8,
            vector: 4,
        };
        let src = source(&sig);
        // One load of each of x and g a vector, one store of dx: nothing read twice.
        assert_eq!(
            src.matches("*(const uint4*)(x + base + c)").count(),
            1,
            "{src}"
        );
        assert_eq!(
            src.matches("*(const uint4*)(g + base + c)").count(),
            1,
            "{src}"
        );
        assert_eq!(src.matches("__syncthreads").count(), 1, "{src}");
        assert!(src.contains("cgx[e] += gv * xh"), "{src}");
        let plain = source(&LayerNormSig {
            weight: false,
            columns: false,
            ..sig
        });
        assert!(
            !plain.contains("gamma") && !plain.contains("cgx"),
            "{plain}"
        );
    }

    #[test]
    fn the_forward_reads_each_row_once_and_syncs_once_a_sum() {
        let sig = LayerNormForwardSig {
            dtype: DType::F32,
            weight: true,
            bias: true,
            threads: 512,
            per_thread: 8,
            vector: 4,
        };
        let src = forward_source(&sig);
        // Two rows an iteration, each read once and written once.
        assert_eq!(
            src.matches("*(const uint4*)(x + base + c)").count(),
            1,
            "{src}"
        );
        assert_eq!(src.matches("*(const uint4*)(x + base2 + c)").count(), 1);
        assert_eq!(src.matches("*(uint4*)(y + base + c)").count(), 1, "{src}");
        assert_eq!(src.matches("*(uint4*)(y + base2 + c)").count(), 1, "{src}");
        assert_eq!(src.matches("__syncthreads").count(), 2, "{src}");
        assert!(src.contains("* w[e] + b[e]"), "{src}");
    }
}
