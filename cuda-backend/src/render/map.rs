//! `Map` kernels: one expression tree per output element, over operands that share the output's
//! shape. Four access paths, chosen per launch: vectorized (every operand contiguous and
//! aligned: 16-byte loads and stores), contiguous per element, strided with a
//! rank-specialized index decode, and tiled (a 2-D map where an input runs down the columns
//! while the output runs along the rows: 32×32 tiles of that input pass through shared memory,
//! so both sides read and write whole cache lines).

use super::expr::emit;
use super::{batch_capacity, storage_type, to_storage, vector_type};
use super::{compute_type, decode_offsets, from_storage, index_type, scalar_from_word};
use super::{Generated, Optimization, Rendered};
use std::fmt::Write;
use strata_core::ir::{MapTrees, UnaryOp};
use strata_core::lower::map_plan::Path;
use strata_core::lower::program::{Lanes, Op, Program, ValueId};
use strata_core::{DType, Result};

/// The structure of a map launch: what the generated source depends on.
///
/// It borrows the launch's expression tree, so a cache hit copies no part of it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct MapSig<'e> {
    /// Every output's tree.
    pub trees: MapTrees<'e>,
    /// The outputs' dtypes first, then the inputs'.
    pub dtypes: Vec<DType>,
    /// Per operand (outputs first), how core's plan reaches it: its offset is the linear
    /// index (`Contiguous`), decoded from its strides (`Strided`; on the vectorized path an
    /// input constant along the inner axis, read once per vector), whole vectors at the
    /// decoded offset (`Rows`), or an input through a shared-memory tile (`Tiled`, rank 2).
    pub paths: Vec<Path>,
    pub scalars: Vec<DType>,
    pub rank: usize,
    /// Elements per thread on the vectorized path (1: not vectorized).
    pub vector: usize,
    pub wide: bool,
}

impl MapSig<'_> {
    /// Operand `k` (0: the output) is at the linear index.
    fn contiguous(&self, k: usize) -> bool {
        self.paths[k] == Path::Contiguous
    }

    /// Operand `k` (an input) is read through a tile.
    fn tiled(&self, k: usize) -> bool {
        self.paths[k] == Path::Tiled
    }
}

strata_core::signature_with_trees!(MapSig {
    dtypes,
    paths,
    scalars,
    rank,
    vector,
    wide
});

/// Whether each work item is two vectors, `j0` and `j0 + step`, both loaded before either is
/// computed: for maps that apply a float function (many instructions an element), whose one
/// vector a thread left the memory idle while it computed (H200, 2^28 f32 GELU's derivative,
/// erf and exp: 0.57–0.58 → 0.52–0.53 ms, against a copy's 0.51). Every operand contiguous,
/// no random draws (`draws`: the trees draw; those maps loop, `run::map`). The cheap tests
/// first: the planner asks at every launch.
pub(crate) fn two_vectors_a_thread(sig: &MapSig, draws: bool) -> bool {
    !draws
        && sig.vector > 1
        && (0..sig.dtypes.len()).all(|k| sig.contiguous(k))
        && sig.trees.iter().any(applies_float_function)
}

/// Whether the tree applies a float function, each many instructions (the unary ops defined
/// for floats only: roots, reciprocals, exponentials, logarithms, trigonometric and error
/// functions).
pub(crate) fn applies_float_function(e: &strata_core::ir::Expr) -> bool {
    match &e.node {
        strata_core::ir::Node::Unary(op, _) if op.float_only() => true,
        _ => e.children().any(applies_float_function),
    }
}

/// Whether a vector holds half of each random counter's words (an i64 `randint`: four words
/// per counter, two per vector), so a warp draws each counter once and shares its words
/// (see `source`). Every operand contiguous, so vector `j` is at `j`. (Further outputs are
/// subtrees of output 0's tree: its draws are all the draws.)
pub(crate) fn counter_pairs(sig: &MapSig) -> bool {
    let v = sig.vector;
    if v <= 1 || !(0..sig.dtypes.len()).all(|k| sig.contiguous(k)) {
        return false;
    }
    // The tree's hoisted draws (each Philox word whose counters the vector's lanes share).
    let mut draws = Vec::new();
    let mut todo = vec![sig.trees.expr.as_ref()];
    while let Some(e) = todo.pop() {
        match &e.node {
            strata_core::ir::Node::Philox(w) if Program::hoists(w, v) => draws.push(*w),
            _ => todo.extend(e.children()),
        }
    }
    !draws.is_empty() && draws.iter().all(|d| d.per_counter as usize == 2 * v)
}

impl Generated for MapSig<'_> {
    const NAME: &'static str = "strata_map";
    fn render(&self) -> Result<Rendered> {
        render(self)
    }
    /// Fast-compiled (as fast at run time, a third less compile: `Optimization`), except with
    /// a tiled input, whose tile loops ran 12% slower so (a transposed add on an H100, 1.53
    /// against 1.37 ms), with random draws, whose Philox rounds are arithmetic-bound
    /// (`randn` 0.80 against 0.65 ms), and with `erf`, whose `erff` ran 11% slower so (GELU's
    /// derivative on an H200, 0.66 against 0.60 ms; `erfc`, `exp`, `tanh`, `sin` and `log`
    /// ran alike: `scripts/probe_gelu_backward_cupy.py levels`).
    fn optimization(&self) -> Optimization {
        if self.paths.contains(&Path::Tiled)
            || self.trees.expr.reads_linear_index()
            || self.trees.iter().any(|t| t.applies(UnaryOp::Erf))
        {
            Optimization::Full
        } else {
            Optimization::FastCompile
        }
    }
}

/// The CUDA C of a map kernel named `strata_map`, and of its batched form `strata_map_batch`
/// (`run::batch`: one block runs many small launches in order), a program of its own.
pub(crate) fn render(sig: &MapSig) -> Result<Rendered> {
    let idx = index_type(sig.wide);
    let rank = sig.rank;
    let n_ops = sig.dtypes.len();
    let n_out = sig.trees.outputs();
    // Word positions: numel, shape, then per operand its pointer and strides, then scalars.
    let shape_words: Vec<usize> = (1..=rank).collect();
    let mut ptr_words = Vec::new();
    let mut stride_words = Vec::new();
    let mut w = 1 + rank;
    for k in 0..n_ops {
        ptr_words.push(w);
        w += 1;
        if sig.contiguous(k) {
            stride_words.push(None);
        } else {
            stride_words.push(Some(w));
            w += rank;
        }
    }
    let scalar_words: Vec<usize> = (w..w + sig.scalars.len()).collect();
    let total = (w + sig.scalars.len()).max(1);

    let tiled = (n_out..n_ops).any(|k| sig.tiled(k));
    let mut s = String::new();
    if tiled {
        let _ = writeln!(
            s,
            "extern \"C\" __global__ void strata_map(const Args<{total}> p) {{"
        );
    } else {
        // The work items `first, first + step, ...`: the whole grid's share when launched
        // alone, one block's when launched in a batch.
        let _ = writeln!(
            s,
            "__device__ __forceinline__ void strata_map_items(const Args<{total}>& p, \
             const {idx} first, const {idx} step) {{"
        );
    }
    for (k, (&d, &word)) in sig.scalars.iter().zip(&scalar_words).enumerate() {
        let _ = writeln!(
            s,
            "  const {} s{k} = {};",
            compute_type(d),
            scalar_from_word(d, &format!("p.w[{word}]"))
        );
    }
    for (k, (&d, &word)) in sig.dtypes.iter().zip(&ptr_words).enumerate() {
        let q = if k < n_out { "" } else { "const " };
        let _ = writeln!(
            s,
            "  {q}{}* a{k} = ({q}{}*)p.w[{word}];",
            storage_type(d),
            storage_type(d)
        );
    }
    let _ = writeln!(s, "  const {idx} n = ({idx})p.w[0];");

    if tiled {
        tiled_body(&mut s, sig, idx, &stride_words)?;
        let _ = writeln!(s, "}}");
        return Ok(Rendered::single(s));
    }
    let mut tail_from = "first".to_string();
    if sig.vector > 1 {
        tail_from = vector_body(&mut s, sig, idx, &shape_words, &stride_words)?;
    }
    let _ = writeln!(s, "  for ({idx} li = {tail_from}; li < n; li += step) {{");
    decode_offsets(&mut s, idx, "li", &shape_words, &stride_words);
    let program = Program::build(sig.trees.iter(), Lanes::one());
    element(
        &mut s,
        sig,
        &program,
        "      ",
        &|k| format!("a{k}[off{k}]"),
        &|k, _, val| format!("a{k}[off{k}] = {val};"),
    )?;
    let _ = writeln!(s, "  }}\n}}");
    let items = s;
    let source = format!(
        "{items}extern \"C\" __global__ void strata_map(const Args<{total}> p) {{
  strata_map_items(p, ({idx})blockIdx.x * blockDim.x + threadIdx.x, ({idx})gridDim.x * blockDim.x);
}}
"
    );
    let cap = batch_capacity(total);
    // The batched form: one block runs the ops in order, a barrier after each, so an op sees
    // what the ops before it wrote.
    let batched = (!sig.wide && cap > 1).then(|| {
        format!(
            "{items}extern \"C\" __global__ void strata_map_batch(const Batch<{total}, {cap}> b) {{
  for (u64 i = 0; i < b.count; i++) {{
    strata_map_items(b.ops[i], ({idx})threadIdx.x, ({idx})blockDim.x);
    __syncthreads();
  }}
}}
"
        )
    });
    Ok(Rendered { source, batched })
}

/// The statements of one element (or, for a program of several lanes, of each lane): the
/// program's values, then each output's stored. `load(k)` reads operand `k` of the element
/// (of lane 0 in a one-lane program); `store(k, lane, bits)` writes output `k`. Inputs are read
/// where the program reads them; the position is `li`.
fn element(
    s: &mut String,
    sig: &MapSig,
    program: &Program,
    indent: &str,
    load: &dyn Fn(usize) -> String,
    store: &dyn Fn(usize, usize, &str) -> String,
) -> Result<()> {
    let n_out = sig.trees.outputs();
    let leaves = |op: &Op, _: DType| match *op {
        Op::Input { input, .. } => {
            let k = n_out + input;
            Some(from_storage(sig.dtypes[k], &load(k)))
        }
        Op::Position { .. } => Some("((i64)li)".to_string()),
        _ => None,
    };
    let values = emit(program, s, indent, 0, &leaves)?;
    for (lane, outputs) in program.outputs.iter().enumerate() {
        for (k, &v) in outputs.iter().enumerate() {
            let bits = to_storage(sig.dtypes[k], &values[stored(program, v)]);
            let _ = writeln!(s, "{indent}{}", store(k, lane, &bits));
        }
    }
    Ok(())
}

/// The value whose stored form output value `v` is: a cast from f32 to f16 or bf16 is left to
/// the store's conversion (the same round to nearest even), which would otherwise round the
/// value and then round it again (a plain `to_dtype(bf16)`, stochastic rounding's last step).
fn stored(program: &Program, v: ValueId) -> ValueId {
    match program.instrs[v].op {
        Op::Cast(a, false)
            if program.instrs[a].dtype == DType::F32
                && matches!(program.instrs[v].dtype, DType::F16 | DType::BF16) =>
        {
            a
        }
        _ => v,
    }
}

/// The vector path: `sig.vector` elements a work item, contiguous operands moved a vector at
/// a time, row operands at the offset decoded for the vector's first element, and inputs
/// constant along the rows read once. Random draws whose counters the lanes share come from
/// one Philox call per counter before the lanes (the compiler does not merge the lanes' calls
/// by itself). Returns where the tail loop starts.
fn vector_body(
    s: &mut String,
    sig: &MapSig,
    idx: &str,
    shape_words: &[usize],
    stride_words: &[Option<usize>],
) -> Result<String> {
    let v = sig.vector;
    let (n_ops, n_out) = (sig.dtypes.len(), sig.trees.outputs());
    // Vector loads and stores: contiguous operands at vector `j`, row operands at the offset
    // decoded for the vector's first element.
    let whole = |k: usize| sig.contiguous(k) || sig.paths[k] == Path::Rows;
    // Input `k` of lane `l`: its element of a whole vector, or the vector's one value.
    let lane_input = |k: usize, l: &str| {
        if whole(k) {
            format!("u{k}.e[{l}]")
        } else {
            format!("e{k}")
        }
    };
    // One lane repeated for each element of the vector, its words found from its place;
    // written out lane by lane where lanes read the same words (a Box–Muller pair), so the
    // program computes the pair's logarithm and root once (no draw in place: each lane's
    // position is then known only to itself).
    let looped = Program::build(sig.trees.iter(), Lanes::unaligned(1, v));
    let draws = &looped.draws;
    let shares_words = draws.iter().any(|d| d.shared >= 2)
        && draws.iter().all(|d| v >= d.per_counter as usize)
        && !looped.instrs.iter().any(|i| matches!(i.op, Op::Philox(_)));
    let pairs = counter_pairs(sig);
    let dual = two_vectors_a_thread(sig, sig.trees.iter().any(|e| e.draws_random()));
    let _ = writeln!(s, "  const {idx} nv = n / {v};");
    if pairs {
        // A counter's words cover two vectors: each thread of a warp draws one counter (32
        // counters, 64 vectors), then takes the words of vector `lane` and of vector `32 +
        // lane` from the threads that drew them, so every Philox call serves all its words and
        // neighbouring threads still store neighbouring vectors. (A warp's work items are 32
        // consecutive `first`s, in blocks of 256 in both forms, and its loop test is the same
        // for all 32, so every thread reaches each shuffle.)
        let mut counters: Vec<(usize, usize)> = Vec::new();
        for d in draws {
            if !counters.contains(&(d.key, d.counter)) {
                counters.push((d.key, d.counter));
            }
        }
        let _ = writeln!(s, "  const {idx} ng = nv / 2;");
        let _ = writeln!(s, "  const int lane = (int)(first & 31);");
        let _ = writeln!(s, "  for ({idx} g = first; g - lane < ng; g += step) {{");
        for (key, counter) in &counters {
            let _ = writeln!(
                s,
                "    u32 drawn{key}_{counter}[4];\n    philox4((u64)s{key}, (u64)s{counter} + upos(g), drawn{key}_{counter});"
            );
        }
        let _ = writeln!(s, "  for (int half = 0; half < 2; half++) {{");
        for (key, counter) in &counters {
            let _ = writeln!(
                s,
                "    u32 ph{key}_{counter}[1][4];\n    for (int q = 0; q < 4; q++) ph{key}_{counter}[0][q] = __shfl_sync(0xffffffffu, drawn{key}_{counter}[q], half * 16 + lane / 2);"
            );
        }
        let _ = writeln!(
            s,
            "    const {idx} j = 2 * (g - lane) + half * 32 + lane;\n    if (j < 2 * ng) {{"
        );
    } else if dual {
        // Vectors `j0` and `j1 = j0 + step`: both loaded, then each computed and stored.
        let _ = writeln!(
            s,
            "  for ({idx} j0 = first; j0 < nv; j0 += 2 * step) {{\n    const {idx} j1 = j0 + step;"
        );
        for k in n_out..n_ops {
            let vt = vector_type(v * sig.dtypes[k].itemsize());
            let _ = writeln!(
                s,
                "    const {vt} p{k}_0 = ((const {vt}*)a{k})[j0];\n    const {vt} p{k}_1 = j1 < nv ? ((const {vt}*)a{k})[j1] : p{k}_0;"
            );
        }
        let _ = writeln!(
            s,
            "#pragma unroll\n  for (int h = 0; h < 2; h++) {{\n    const {idx} j = h ? j1 : j0;\n    if (j >= nv) break;"
        );
    } else {
        let _ = writeln!(s, "  for ({idx} j = first; j < nv; j += step) {{");
    }
    if (0..n_ops).any(|k| !sig.contiguous(k)) {
        // Strided operands: one offset per vector (a vector lies in one row).
        decode_offsets(s, idx, &format!("(j * {v})"), shape_words, stride_words);
    }
    for (k, &d) in sig.dtypes.iter().enumerate() {
        let st = storage_type(d);
        if !whole(k) {
            if k >= n_out {
                let _ = writeln!(s, "    const {st} e{k} = a{k}[off{k}];");
            }
            continue;
        }
        let vt = vector_type(v * d.itemsize());
        let _ = writeln!(s, "    union {{ {vt} v; {st} e[{v}]; }} u{k};");
        if k >= n_out {
            let at = if dual {
                format!("h ? p{k}_1 : p{k}_0")
            } else if sig.contiguous(k) {
                format!("((const {vt}*)a{k})[j]")
            } else {
                format!("*(const {vt}*)(a{k} + off{k})")
            };
            let _ = writeln!(s, "    u{k}.v = {at};");
        }
    }
    // The Philox calls, once per counter the vector spans (or that spans it).
    let mut sources: Vec<(usize, usize, u8)> = Vec::new();
    for d in draws.iter().filter(|_| !pairs) {
        if !sources.contains(&(d.key, d.counter, d.per_counter)) {
            sources.push((d.key, d.counter, d.per_counter));
        }
    }
    for &(key, counter, per) in &sources {
        let per = per as usize;
        // A vector spans `v / per` counters, or lies inside one counter's elements.
        let (groups, first) = if v >= per {
            (v / per, format!("upos(j) * {}u", v / per))
        } else {
            (1, format!("upos(j) / {}u", per / v))
        };
        let _ = writeln!(s, "    u32 ph{key}_{counter}[{groups}][4];");
        let _ = writeln!(
            s,
            "    for (int g = 0; g < {groups}; g++) philox4((u64)s{key}, (u64)s{counter} + {first} + g, ph{key}_{counter}[g]);"
        );
    }
    let calls = |draw: usize| {
        let d = &draws[draw];
        format!("ph{}_{}", d.key, d.counter)
    };
    if shares_words {
        let program = Program::build(sig.trees.iter(), Lanes::aligned(v));
        let leaves = |op: &Op, _: DType| match *op {
            Op::Input { input, lane } => {
                let k = n_out + input;
                Some(from_storage(
                    sig.dtypes[k],
                    &lane_input(k, &lane.to_string()),
                ))
            }
            Op::Position { lane } => Some(format!("((i64)(j * {v} + {lane}))")),
            Op::KnownWord { draw, group, word } => {
                Some(format!("pick4({}[{group}], {word})", calls(draw)))
            }
            _ => None,
        };
        let values = emit(&program, s, "    ", 0, &leaves)?;
        for (lane, outputs) in program.outputs.iter().enumerate() {
            for (k, &value) in outputs.iter().enumerate() {
                let bits = to_storage(sig.dtypes[k], &values[stored(&program, value)]);
                let _ = writeln!(s, "    u{k}.e[{lane}] = {bits};");
            }
        }
    } else {
        let _ = writeln!(s, "#pragma unroll\n    for (int l = 0; l < {v}; l++) {{");
        let _ = writeln!(s, "      const {idx} li = j * {v} + l;");
        let leaves = |op: &Op, _: DType| match *op {
            Op::Input { input, .. } => {
                let k = n_out + input;
                Some(from_storage(sig.dtypes[k], &lane_input(k, "l")))
            }
            Op::Position { .. } => Some("((i64)li)".to_string()),
            Op::Word { draw, .. } => {
                let d = &draws[draw];
                let (per, shared, width) =
                    (d.per_counter as usize, d.shared as usize, d.group_width());
                // The lane's place among its counter's elements: constant per lane when a
                // vector spans whole counters, else offset by the vector's place in the counter.
                let (group, place) = if v >= per {
                    (format!("l / {per}"), format!("(l % {per})"))
                } else {
                    (
                        "0".to_string(),
                        format!("((int)(upos(j) % {}u) * {v} + l)", per / v),
                    )
                };
                Some(format!(
                    "pick4({}[{group}], ({place} / {shared}) * {width} + {})",
                    calls(draw),
                    d.word
                ))
            }
            _ => None,
        };
        let values = emit(&looped, s, "      ", 0, &leaves)?;
        for (k, &value) in looped.outputs[0].iter().enumerate() {
            let bits = to_storage(sig.dtypes[k], &values[stored(&looped, value)]);
            let _ = writeln!(s, "      u{k}.e[l] = {bits};");
        }
        let _ = writeln!(s, "    }}");
    }
    for k in 0..n_out {
        let vt = vector_type(v * sig.dtypes[k].itemsize());
        if sig.contiguous(k) {
            let _ = writeln!(s, "    (({vt}*)a{k})[j] = u{k}.v;");
        } else {
            let _ = writeln!(s, "    *({vt}*)(a{k} + off{k}) = u{k}.v;");
        }
    }
    let _ = writeln!(s, "  }}");
    if dual {
        let _ = writeln!(s, "  }}");
    }
    Ok(if pairs {
        let _ = writeln!(s, "  }}\n  }}");
        format!("ng * {} + first", 2 * v)
    } else {
        format!("nv * {v} + first")
    })
}

/// The kernel's program alone (what tests read).
#[cfg(test)]
pub(crate) fn source(sig: &MapSig) -> Result<String> {
    render(sig).map(|r| r.source)
}

/// The tiled path: each block takes 32×32 tiles; tiled inputs are loaded down the columns
/// (coalesced for them) into shared memory, then every operand is read or written along the
/// rows.
fn tiled_body(
    s: &mut String,
    sig: &MapSig,
    idx: &str,
    stride_words: &[Option<usize>],
) -> Result<()> {
    let stride = |k: usize, d: usize| {
        let w = stride_words[k].expect("tiled operands are strided") + d;
        format!("({idx})(i64)p.w[{w}]")
    };
    let inputs = sig.trees.outputs()..sig.dtypes.len();
    for k in inputs.clone().filter(|&k| sig.tiled(k)) {
        let st = storage_type(sig.dtypes[k]);
        let _ = writeln!(s, "  __shared__ {st} tile{k}[32][33];");
    }
    let _ = writeln!(
        s,
        "  const {idx} rows = ({idx})p.w[1], cols = ({idx})p.w[2];"
    );
    let _ = writeln!(
        s,
        "  const {idx} tc = (cols + 31) / 32, tiles = ((rows + 31) / 32) * tc;"
    );
    let _ = writeln!(
        s,
        "  const int tx = threadIdx.x % 32, ty = threadIdx.x / 32;"
    );
    let _ = writeln!(
        s,
        "  for ({idx} t = blockIdx.x; t < tiles; t += gridDim.x) {{"
    );
    let _ = writeln!(s, "    const {idx} r0 = (t / tc) * 32, c0 = (t % tc) * 32;");
    let _ = writeln!(s, "    for (int j = ty; j < 32; j += 8) {{");
    let _ = writeln!(s, "      const {idx} r = r0 + tx, c = c0 + j;");
    let _ = writeln!(s, "      if (r < rows && c < cols) {{");
    for k in inputs.filter(|&k| sig.tiled(k)) {
        let _ = writeln!(
            s,
            "        tile{k}[j][tx] = a{k}[r * {} + c * {}];",
            stride(k, 0),
            stride(k, 1)
        );
    }
    let _ = writeln!(
        s,
        "      }}
    }}
    __syncthreads();"
    );
    let _ = writeln!(s, "    for (int j = ty; j < 32; j += 8) {{");
    let _ = writeln!(s, "      const {idx} r = r0 + j, c = c0 + tx;");
    let _ = writeln!(s, "      if (r < rows && c < cols) {{");
    let _ = writeln!(s, "        const {idx} li = r * cols + c;");
    for k in 0..sig.dtypes.len() {
        if !sig.tiled(k) {
            let _ = writeln!(
                s,
                "        const {idx} off{k} = r * {} + c * {};",
                stride(k, 0),
                stride(k, 1)
            );
        }
    }
    let program = Program::build(sig.trees.iter(), Lanes::one());
    element(
        s,
        sig,
        &program,
        "        ",
        &|k| {
            if sig.tiled(k) {
                format!("tile{k}[tx][j]")
            } else {
                format!("a{k}[off{k}]")
            }
        },
        &|k, _, val| format!("a{k}[off{k}] = {val};"),
    )?;
    let _ = writeln!(
        s,
        "      }}
    }}
    __syncthreads();
  }}"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_core::ir::{BinaryOp, Expr};

    fn sig(contiguous: bool, vector: usize) -> MapSig<'static> {
        let e = Expr::binary(
            BinaryOp::Add,
            Expr::input(0, DType::F32),
            Expr::input(1, DType::F32),
        );
        MapSig {
            trees: MapTrees::one(e),
            dtypes: vec![DType::F32; 3],
            paths: vec![
                if contiguous {
                    Path::Contiguous
                } else {
                    Path::Strided
                };
                3
            ],
            scalars: vec![],
            rank: 2,
            vector,
            wide: false,
        }
    }

    #[test]
    fn the_vector_path_moves_16_bytes() {
        let src = source(&sig(true, 4)).unwrap();
        assert!(src.contains("union { uint4 v; float e[4]; } u1;"), "{src}");
        assert!(src.contains("((uint4*)a0)[j] = u0.v;"));
    }

    #[test]
    fn maps_bound_by_arithmetic_load_two_vectors_a_thread_first() {
        use strata_core::ir::UnaryOp;
        // exp(a) + b: both vectors' inputs loaded, then each computed and stored.
        let mut s = sig(true, 4);
        let exp = Expr::unary(UnaryOp::Exp, Expr::input(0, DType::F32));
        s.trees = MapTrees::one(Expr::binary(BinaryOp::Add, exp, Expr::input(1, DType::F32)));
        assert!(two_vectors_a_thread(&s, false));
        assert!(!two_vectors_a_thread(&s, true));
        let src = source(&s).unwrap();
        for line in [
            "for (i32 j0 = first; j0 < nv; j0 += 2 * step) {",
            "const uint4 p1_0 = ((const uint4*)a1)[j0];",
            "const uint4 p2_1 = j1 < nv ? ((const uint4*)a2)[j1] : p2_0;",
            "const i32 j = h ? j1 : j0;",
            "u1.v = h ? p1_1 : p1_0;",
            "((uint4*)a0)[j] = u0.v;",
        ] {
            assert!(src.contains(line), "{line} in\n{src}");
        }
        // The loads come before the first store.
        assert!(src.find("p2_1 =").unwrap() < src.find("((uint4*)a0)[j] =").unwrap());
        // An add, a strided operand or one element a thread: one vector a work item.
        for other in [sig(true, 4), sig(true, 1), {
            let mut t = s.clone();
            t.paths[1] = Path::Strided;
            t
        }] {
            assert!(!two_vectors_a_thread(&other, false));
            assert!(!source(&other).unwrap().contains("j0"));
        }
    }

    #[test]
    fn strided_rows_move_whole_vectors_at_their_decoded_offsets() {
        // The output is a part of a cat (rows apart), input 0 a slice of rows, input 1
        // contiguous.
        let mut s = sig(false, 4);
        s.paths = vec![Path::Rows, Path::Rows, Path::Contiguous];
        let src = source(&s).unwrap();
        assert!(src.contains("u1.v = *(const uint4*)(a1 + off1);"), "{src}");
        assert!(src.contains("u2.v = ((const uint4*)a2)[j];"), "{src}");
        assert!(src.contains("*(uint4*)(a0 + off0) = u0.v;"), "{src}");
    }

    /// Word 0 of a Philox counter that four elements share, one word each (`rand`, `randint`).
    fn philox_word() -> Expr {
        Expr {
            dtype: DType::U32,
            node: strata_core::ir::Node::Philox(strata_core::ir::PhiloxWord {
                key: 0,
                counter: 1,
                word: 0,
                per_counter: 4,
                shared: 1,
            }),
        }
    }

    /// `rand`'s f32 expression: the top 24 bits of one Philox word per element, four
    /// elements per counter.
    fn rand_f32() -> Expr {
        let word = philox_word();
        let top = Expr::binary(
            BinaryOp::Shr,
            word.cast(DType::U64, false),
            Expr::scalar(2, DType::U64),
        );
        Expr::binary(
            BinaryOp::Mul,
            top.cast(DType::F32, false),
            Expr::scalar(3, DType::F32),
        )
    }

    #[test]
    fn the_lanes_of_a_box_muller_pair_share_their_log_and_square_root() {
        let sig = MapSig {
            trees: MapTrees::one(strata_core::random::randn_f32_expr()),
            dtypes: vec![DType::F32],
            paths: vec![Path::Contiguous],
            scalars: strata_core::random::randn_f32_scalar_dtypes(),
            rank: 1,
            vector: 4,
            wide: false,
        };
        let src = source(&sig).unwrap();
        // Four lanes, two pairs: two logs and two roots, then one of each in the tail loop.
        assert_eq!(src.matches("logf(").count(), 3, "{src}");
        assert_eq!(src.matches("sqrtf(").count(), 3, "{src}");
        // A pair's cosine and sine come from one call (one range reduction), and so do the
        // tail's, which computes both and picks one.
        assert_eq!(src.matches("sincosf(").count(), 3, "{src}");
        let vector_loop = src.split("for (i32 li").next().unwrap();
        assert!(
            !vector_loop.contains(" cosf(") && !vector_loop.contains(" sinf("),
            "{src}"
        );
        // Each lane still writes its own element, from its own cosine or sine.
        for l in 0..4 {
            assert!(src.contains(&format!("u0.e[{l}] = ")), "{src}");
        }
        let Ok(_) = crate::compile::nvrtc_version() else {
            return; // the NVRTC catalog test says whether NVRTC must be present
        };
        let compiler = crate::compile::Compiler::new(None, (9, 0));
        compiler.ptx_uncached(&src).unwrap();
    }

    #[test]
    fn a_vector_of_random_draws_makes_one_philox_call_per_counter() {
        let Ok(_) = crate::compile::nvrtc_version() else {
            return; // the NVRTC catalog test says whether NVRTC must be present
        };
        let sig = MapSig {
            trees: MapTrees::one(rand_f32()),
            dtypes: vec![DType::F32],
            paths: vec![Path::Contiguous],
            scalars: vec![DType::U64, DType::U64, DType::U64, DType::F32],
            rank: 1,
            vector: 4,
            wide: false,
        };
        let src = source(&sig).unwrap();
        let compiler = crate::compile::Compiler::new(None, (9, 0));
        let ptx = compiler.ptx_uncached(&src).unwrap();
        // Philox's 10 rounds take two high multiplies each; the vector loop, the tail loop
        // and the batched form call it once per counter each.
        let entry = ptx.split(".entry strata_map(").nth(1).unwrap_or(&ptx);
        let entry = entry.split(".entry").next().unwrap_or(entry);
        let calls = entry.matches("mul.hi.u32").count() / 20;
        assert!(calls <= 2, "{calls} Philox calls in strata_map:\n{src}");
    }

    #[test]
    fn a_counter_covering_two_vectors_is_drawn_once_and_shared_in_the_warp() {
        // randint as i64: a word per element, four per counter; a vector holds two.
        let word = philox_word();
        let sig = MapSig {
            trees: MapTrees::one(word.cast(DType::I64, false)),
            dtypes: vec![DType::I64],
            paths: vec![Path::Contiguous],
            scalars: vec![DType::U64, DType::U64],
            rank: 1,
            vector: 2,
            wide: false,
        };
        assert!(counter_pairs(&sig));
        let src = source(&sig).unwrap();
        let vector_loop = src.split("for (i32 li").next().unwrap();
        assert_eq!(vector_loop.matches("philox4(").count(), 1, "{src}");
        assert!(
            src.contains("__shfl_sync(0xffffffffu, drawn0_1[q], half * 16 + lane / 2)"),
            "{src}"
        );
        assert!(
            src.contains("const i32 j = 2 * (g - lane) + half * 32 + lane;"),
            "{src}"
        );
        assert!(src.contains("li = ng * 4 + first"), "{src}");
        let Ok(_) = crate::compile::nvrtc_version() else {
            return; // the NVRTC catalog test says whether NVRTC must be present
        };
        let compiler = crate::compile::Compiler::new(None, (9, 0));
        compiler.ptx_uncached(&src).unwrap();
    }

    #[test]
    fn a_batched_form_runs_the_same_items_in_one_block() {
        let rendered = render(&sig(true, 4)).unwrap();
        let batched = rendered.batched.unwrap();
        // 6 words (numel, two extents, three pointers) per launch: 85 fit 4096 bytes.
        assert!(
            batched.contains("strata_map_batch(const Batch<6, 85> b)"),
            "{batched}"
        );
        assert!(batched.contains("strata_map_items(b.ops[i], (i32)threadIdx.x, (i32)blockDim.x);"));
        // Two programs: each has the items and one kernel.
        assert!(!rendered.source.contains("strata_map_batch"));
        assert!(!batched.contains("void strata_map(const Args"));
        let mut wide = sig(true, 4);
        wide.wide = true;
        assert!(render(&wide).unwrap().batched.is_none());
        let mut tiled = sig(false, 1);
        tiled.paths[1] = Path::Tiled;
        assert!(render(&tiled).unwrap().batched.is_none());
    }

    #[test]
    fn column_wise_inputs_pass_through_a_shared_tile() {
        let mut s = sig(false, 1);
        s.paths[1] = Path::Tiled;
        let src = source(&s).unwrap();
        assert!(src.contains("__shared__ float tile1[32][33];"), "{src}");
        assert!(src.contains("tile1[tx][j]"));
    }

    #[test]
    fn a_multi_output_map_computes_a_shared_node_once_and_stores_it() {
        let x = Expr::input(0, DType::F32);
        let exp = Expr::unary(strata_core::ir::UnaryOp::Exp, x.clone());
        let top = Expr::binary(BinaryOp::Add, exp.clone(), x);
        let sig = |vector: usize, path: Path| MapSig {
            trees: MapTrees {
                expr: std::borrow::Cow::Owned(top.clone()),
                also: std::borrow::Cow::Owned(vec![exp.clone()]),
            },
            dtypes: vec![DType::F32; 3],
            paths: vec![path; 3],
            scalars: vec![],
            rank: 1,
            vector,
            wide: false,
        };
        let src = source(&sig(4, Path::Contiguous)).unwrap();
        // Once in the vector loop and once in the tail, not twice in each.
        assert_eq!(src.matches("expf(").count(), 2, "{src}");
        assert!(src.contains("((uint4*)a0)[j] = u0.v;"), "{src}");
        assert!(src.contains("((uint4*)a1)[j] = u1.v;"), "{src}");
        assert!(src.contains("const float* a2"), "{src}");
        let src = source(&sig(1, Path::Strided)).unwrap();
        // exp(x) is value 1 (after x): computed once, stored to output 1.
        assert_eq!(src.matches("expf(").count(), 1, "{src}");
        assert!(src.contains("a1[off1] = v1;"), "{src}");
    }

    #[test]
    fn strided_operands_decode_their_coordinates() {
        let src = source(&sig(false, 1)).unwrap();
        assert!(src.contains("rem % (i32)p.w[2]"), "{src}");
        assert!(!src.contains("uint4"));
    }
}
