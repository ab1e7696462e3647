//! `Map` kernels: one expression tree per output element. Four access paths, planned per piece
//! by core (`lower::map_plan`): vectorized (four elements of dtypes up to 32 bits a work item,
//! each operand moved in whole `u32` words: contiguous ones at the work item's index, ones
//! strided between rows but contiguous along them at the offset decoded for the vector, and
//! an input constant along the rows, a splat, one element there), contiguous (offset = index), strided (a
//! rank-specialized decode of the index into each operand's offset) and tiled (a 2-D map of
//! 32-bit dtypes whose output runs along the rows while an input runs down the columns: each
//! workgroup passes a 32×32 tile of that input through workgroup memory, so both sides read
//! and write whole runs of memory).

use super::expr::emit;
use super::prelude::{dtypes_of, helpers};
use super::{binding, compute_type, load, Caps, ENTRY};
use std::collections::BTreeSet;
use std::fmt::Write;
use strata_core::ir::MapTrees;
use strata_core::ir::{Expr, Node};
use strata_core::lower::map_plan::{MapPiece, Path, Position, PositionKind};
use strata_core::lower::program::{Lanes, Op, Program};
use strata_core::{DType, Result, Scalar};

/// The structure of a map piece: what the generated source depends on. It borrows the
/// launch's expression tree, so a cache hit copies no part of it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct MapSig<'e> {
    /// Every output's tree.
    pub trees: MapTrees<'e>,
    /// The outputs' dtypes first, then the inputs'.
    pub dtypes: Vec<DType>,
    /// Per operand (outputs first): true when its offset is the invocation index.
    pub contiguous: Vec<bool>,
    pub position: PositionKind,
    pub scalars: Vec<DType>,
    pub rank: usize,
    /// Elements per invocation: 4 through `vec4<u32>` words, or 1.
    pub vector: usize,
    /// Per operand (outputs first), on the vector path: strided between rows but contiguous
    /// along them, whole vectors at the offset decoded for each vector's first element.
    pub rows: Vec<bool>,
    /// Per input: read through a workgroup-memory tile (the tiled path; rank 2).
    pub tiled: Vec<bool>,
}

strata_core::signature_with_trees!(MapSig {
    dtypes,
    contiguous,
    position,
    scalars,
    rank,
    vector,
    rows,
    tiled
});

impl<'e> MapSig<'e> {
    /// The signature of a piece core planned for `expr` (and the further outputs `also`),
    /// with operand dtypes `dtypes` (outputs first) and scalars of `scalars`.
    pub(crate) fn of(
        expr: &'e Expr,
        also: &'e [Expr],
        piece: &MapPiece,
        dtypes: Vec<DType>,
        scalars: Vec<DType>,
    ) -> MapSig<'e> {
        MapSig {
            trees: MapTrees::borrowed(expr, also),
            dtypes,
            contiguous: piece
                .operands
                .iter()
                .map(|o| o.path == Path::Contiguous)
                .collect(),
            position: piece.position.kind(piece.vector),
            scalars,
            rank: piece.shape.len(),
            vector: piece.vector,
            rows: piece
                .operands
                .iter()
                .map(|o| o.path == Path::Rows)
                .collect(),
            tiled: piece.operands[1 + also.len()..]
                .iter()
                .map(|o| o.path == Path::Tiled)
                .collect(),
        }
    }
}

impl MapSig<'_> {}

/// The name of lane `lane`'s bits of output `k` on the vector path.
fn lane_bits_of(k: usize, lane: usize) -> String {
    if k == 0 {
        format!("l{lane}")
    } else {
        format!("l{lane}_{k}")
    }
}

/// Slots in `params`: numel, shape, per operand its offset (and strides), the position base
/// (and strides), then two words per scalar.
struct Slots {
    offset: Vec<usize>,
    strides: Vec<Option<usize>>,
    lin_base: usize,
    lin_strides: usize,
    scalars: usize,
}

fn slots(sig: &MapSig) -> Slots {
    let mut w = 1 + sig.rank;
    let mut offset = Vec::new();
    let mut strides = Vec::new();
    for &c in &sig.contiguous {
        offset.push(w);
        w += 1;
        if c {
            strides.push(None);
        } else {
            strides.push(Some(w));
            w += sig.rank;
        }
    }
    let lin_base = w;
    if sig.position != PositionKind::Unused {
        w += 1;
    }
    let lin_strides = w;
    if sig.position == PositionKind::Strided {
        w += sig.rank;
    }
    Slots {
        offset,
        strides,
        lin_base,
        lin_strides,
        scalars: w,
    }
}

/// The `params` words of a piece.
pub(crate) fn params(sig: &MapSig, piece: &MapPiece, scalars: &[Scalar]) -> Vec<u32> {
    let w = slots(sig);
    let mut v = vec![0u32; w.scalars + 2 * scalars.len()];
    v[0] = piece.numel as u32;
    for (d, &n) in piece.shape.iter().enumerate() {
        v[1 + d] = n as u32;
    }
    for (k, o) in piece.operands.iter().enumerate() {
        v[w.offset[k]] = o.offset as u32;
        if let Some(s) = w.strides[k] {
            for (d, &st) in o.strides.iter().enumerate() {
                v[s + d] = st as i32 as u32;
            }
        }
    }
    match &piece.position {
        Position::Unused => {}
        Position::Linear { base } => v[w.lin_base] = *base as u32,
        Position::Strided { base, strides } => {
            v[w.lin_base] = *base as u32;
            for (d, &f) in strides.iter().enumerate() {
                v[w.lin_strides + d] = f as u32;
            }
        }
    }
    for (k, s) in scalars.iter().enumerate() {
        let [lo, hi] = crate::launch::scalar_words(*s);
        v[w.scalars + 2 * k] = lo;
        v[w.scalars + 2 * k + 1] = hi;
    }
    v
}

/// The WGSL source of a map piece.
pub(crate) fn source(sig: &MapSig, caps: Caps) -> Result<String> {
    let w = slots(sig);
    let n_out = sig.trees.outputs();
    let mut used = BTreeSet::new();
    dtypes_of(&sig.trees.expr, &mut used);
    used.extend(sig.dtypes.iter().copied());
    used.extend(sig.scalars.iter().copied());
    let mut src = super::header(caps);
    for (k, &d) in sig.dtypes.iter().enumerate() {
        if sig.vector == 4 && k < n_out && wide_words(d) {
            // 64-bit lanes written as two `vec4<u32>` words.
            let _ = writeln!(
                src,
                "@group(0) @binding({}) var<storage, read_write> b{k}: array<vec4<u32>>;",
                k + 1
            );
        } else if sig.vector == 4 && d.itemsize() < 8 {
            // Contiguous and row operands move a vector's four elements in `u32` words; a
            // splat (an input constant along the rows) is one value per vector, at any
            // element offset.
            let word = if sig.contiguous[k] || sig.rows[k] {
                vector_word(d)
            } else {
                "u32"
            };
            let _ = writeln!(
                src,
                "@group(0) @binding({}) var<storage, read_write> b{k}: array<{word}>;",
                k + 1
            );
        } else {
            src.push_str(&binding(k, d, k < n_out, caps));
        }
    }
    src.push_str(&helpers(&used, caps));
    if sig.tiled.iter().any(|&t| t) {
        for (k, _) in sig.tiled.iter().enumerate().filter(|(_, &t)| t) {
            let _ = writeln!(src, "var<workgroup> tile{}: array<u32, 1056>;", k + n_out);
        }
        src.push_str(ENTRY);
        super::scalar_lets(&sig.scalars, w.scalars, caps, &mut src);
        tiled_body(sig, &w, caps, &mut src)?;
        src.push_str("}\n");
        return Ok(src);
    }
    if coalesced_words(sig, caps) {
        src.push_str(&ENTRY.replace(
            "@builtin(local_invocation_index) lid: u32)",
            "@builtin(local_invocation_index) lid: u32,\n        \
             @builtin(subgroup_invocation_id) sl: u32, @builtin(subgroup_size) sgs: u32)",
        ));
    } else {
        src.push_str(ENTRY);
    }
    let threads = if sig.vector == 4 {
        "(params[0] / 4u)"
    } else {
        "params[0]"
    };
    let _ = writeln!(src, "  if (gid >= {threads}) {{ return; }}");
    super::scalar_lets(&sig.scalars, w.scalars, caps, &mut src);
    if sig.vector == 4 {
        vec4_body(sig, &w, caps, &mut src)?;
    } else {
        offsets(sig, &w, &mut src);
        for (k, &d) in sig.dtypes.iter().enumerate().skip(n_out) {
            let _ = writeln!(
                src,
                "  let x{} = {};",
                k - n_out,
                load(d, &format!("b{k}"), &format!("u32(o{k})"), caps)
            );
        }
        let program = Program::build(sig.trees.iter(), Lanes::one());
        let values = emit(&program, &mut src, 0, caps, &element_leaves)?;
        for (k, &v) in program.outputs[0].iter().enumerate() {
            let (b, o) = (format!("b{k}"), format!("u32(o{k})"));
            let value = &values[v];
            let _ = writeln!(
                src,
                "  {}",
                super::store(sig.dtypes[k], &b, &o, value, caps)
            );
        }
    }
    src.push_str("}\n");
    Ok(src)
}

/// The leaves of one element whose inputs are loaded as `x{k}` and whose position is `li`.
fn element_leaves(op: &Op, _: DType) -> Option<String> {
    match op {
        Op::Input { input, .. } => Some(format!("x{input}")),
        Op::Position { .. } => Some("li".to_string()),
        _ => None,
    }
}

/// The compute value of a dtype of 32 bits or fewer whose stored bits are the low bits of the
/// `u32` expression `bits` (the rest zero).
fn bits_value(d: DType, bits: String) -> String {
    match d {
        DType::Bool => format!("({bits} != 0u)"),
        DType::U8 | DType::U16 | DType::U32 => bits,
        DType::I8 | DType::I16 => super::wrap(d, &format!("bitcast<i32>({bits})")),
        DType::F16 => format!("f16_to_f32({bits})"),
        DType::BF16 => format!("bitcast<f32>({bits} << 16u)"),
        _ => format!("bitcast<{}>({bits})", compute_type(d)),
    }
}

/// The four lanes of a vector as one program: each lane reads its inputs' values and its
/// Philox words, and output k's bits end in `lane_bits_of(k, lane)`. `aligned`: the vector's
/// first position (`lq · 4`) is a multiple of four, so each lane's position modulo 4 is a
/// constant: its Philox words are known and a Box–Muller pair's parity folds, so the two lanes
/// of a pair share their logarithm and square root (a compiler does not merge the lanes'
/// inlined calls by itself).
fn lanes(
    sig: &MapSig,
    caps: Caps,
    program: &Program,
    aligned: bool,
    src: &mut String,
) -> Result<()> {
    let n_out = sig.trees.outputs();
    let draws = &program.draws;
    let position = |lane: usize| {
        if aligned {
            format!("(lq * 4u + {lane}u)")
        } else {
            format!("(lb + {lane}u)")
        }
    };
    let leaves = |op: &Op, _: DType| match *op {
        Op::Input { input, lane } => {
            let k = n_out + input;
            let d = sig.dtypes[k];
            if d.itemsize() == 8 {
                // 64-bit lanes (a draw's, core's plan: contiguous) are read whole.
                let at = format!("q{k} * 4u + {lane}u");
                return Some(load(d, &format!("b{k}"), &at, caps));
            }
            let bits = if sig.contiguous[k] || sig.rows[k] {
                lane_bits(d, &format!("w{k}"), lane)
            } else {
                format!("sp{k}")
            };
            Some(bits_value(d, bits))
        }
        Op::Position { lane } => Some(position(lane)),
        Op::KnownWord { draw, group, word } => {
            let p = &draws[draw];
            Some(format!("ph{}_{}_{group}[{word}u]", p.key, p.counter))
        }
        Op::Word { draw, lane } => {
            // The lane's word of the call made for its counter.
            let p = &draws[draw];
            let (per, name) = (p.per_counter as usize, format!("ph{}_{}", p.key, p.counter));
            let li = position(lane);
            let mut pick = format!("{name}_0");
            for g in 1..=(4 / per) {
                pick = format!("select({pick}, {name}_{g}, {li} / {per}u - {name}f == {g}u)");
            }
            let word = format!(
                "(({li} % {per}u) / {}u) * {}u + {}u",
                p.shared,
                p.group_width(),
                p.word
            );
            Some(format!("{pick}[{word}]"))
        }
        _ => None,
    };
    let values = emit(program, src, 0, caps, &leaves)?;
    for (lane, outputs) in program.outputs.iter().enumerate() {
        for (k, &v) in outputs.iter().enumerate() {
            let d = sig.dtypes[k];
            let bits = if d.itemsize() == 8 {
                values[v].clone()
            } else {
                super::bits_of(d, &values[v])
            };
            let _ = writeln!(src, "  {} = {bits};", lane_bits_of(k, lane));
        }
    }
    Ok(())
}

/// The tree whose value a vector lane converts to the output's bits: a root cast from f32 to
/// f16 or bf16 is left to that conversion (the same round to nearest even), which would
/// otherwise round, widen and round again: three conversions per element for one.
fn stored(expr: &Expr) -> &Expr {
    match &expr.node {
        Node::Cast { arg, .. }
            if arg.dtype == DType::F32 && matches!(expr.dtype, DType::F16 | DType::BF16) =>
        {
            arg
        }
        _ => expr,
    }
}

/// The `u32` words that hold four elements of `d` (a dtype of 32 bits or fewer).
fn vector_word(d: DType) -> &'static str {
    match d.itemsize() {
        4 => "vec4<u32>",
        2 => "vec2<u32>",
        _ => "u32",
    }
}

/// The bits of lane `lane` (0–3) in the vector words `w` of `d`.
fn lane_bits(d: DType, w: &str, lane: usize) -> String {
    const C: [&str; 4] = ["x", "y", "z", "w"];
    match d.itemsize() {
        4 => format!("{w}.{}", C[lane]),
        2 => format!("(({w}.{} >> {}u) & 0xffffu)", C[lane / 2], 16 * (lane % 2)),
        _ => format!("(({w} >> {}u) & 0xffu)", 8 * lane),
    }
}

/// The vector words of `d` holding the four lanes' bits of output `k` (`l0`..`l3` for
/// output 0).
fn lanes_word(d: DType, k: usize) -> String {
    let l = |lane: usize| lane_bits_of(k, lane);
    match d.itemsize() {
        4 => format!("vec4<u32>({}, {}, {}, {})", l(0), l(1), l(2), l(3)),
        2 => format!(
            "vec2<u32>({} | ({} << 16u), {} | ({} << 16u))",
            l(0),
            l(1),
            l(2),
            l(3)
        ),
        _ => format!(
            "{} | ({} << 8u) | ({} << 16u) | ({} << 24u)",
            l(0),
            l(1),
            l(2),
            l(3)
        ),
    }
}

/// The bits of element `o` (an `i32` offset) of `d` in the `u32` words of binding `b`.
fn element_bits(d: DType, b: &str, o: &str) -> String {
    match d.itemsize() {
        4 => format!("{b}[u32({o})]"),
        n => {
            let (per, bits) = (4 / n, 8 * n);
            format!(
                "(({b}[u32({o}) / {per}u] >> ((u32({o}) % {per}u) * {bits}u)) & {}u)",
                (1u64 << bits) - 1
            )
        }
    }
}

/// The tiled path: workgroup `gid / 256` takes one 32×32 tile; its tiled inputs are read down
/// the columns into workgroup memory (a row of 33 words, so the transposed reads do not hit
/// one bank), then every operand is read or written along the rows. Every invocation reaches
/// the barrier: out-of-range ones only skip their loads and stores.
fn tiled_body(sig: &MapSig, w: &Slots, caps: Caps, src: &mut String) -> Result<()> {
    let offset = |k: usize, r: &str, c: &str| {
        let s = w.strides[k].expect("tiled operands are strided");
        format!(
            "u32(i32(params[{}]) + i32({r}) * bitcast<i32>(params[{s}]) + i32({c}) * bitcast<i32>(params[{}]))",
            w.offset[k],
            s + 1
        )
    };
    let _ = writeln!(src, "  let rows = params[1]; let cols = params[2];");
    let _ = writeln!(src, "  let tc = (cols + 31u) / 32u;");
    let _ = writeln!(src, "  let tile = gid / 256u;");
    let _ = writeln!(src, "  let live = tile < ((rows + 31u) / 32u) * tc;");
    let _ = writeln!(
        src,
        "  let r0 = (tile / tc) * 32u; let c0 = (tile % tc) * 32u;"
    );
    let _ = writeln!(src, "  let tx = lid % 32u; let ty = lid / 32u;");
    // Each invocation visits rows ty, ty + 8, ty + 16, ty + 24 of the tile: `coords` places
    // column `tx` and row `j` (down the columns while loading, along the rows after).
    let visit = |src: &mut String, coords: &str| {
        src.push_str("  for (var i = 0u; i < 4u; i = i + 1u) {\n");
        let _ = writeln!(src, "    let j = ty + 8u * i; {coords}");
        src.push_str("    if (live && r < rows && c < cols) {\n");
    };
    let n_out = sig.trees.outputs();
    let tiled_inputs = || {
        sig.tiled
            .iter()
            .enumerate()
            .filter(|(_, &t)| t)
            .map(move |(k, _)| k + n_out)
    };
    // A whole tile (every one but the edges'): its four loads issued before any waits. The
    // loop alone (below, for edge tiles) ran a [16384, 16384] f32 transpose in 0.98–1.07 ms
    // through NVIDIA's Vulkan driver (H200); with this, 0.73 ms.
    src.push_str("  if (live && r0 + 32u <= rows && c0 + 32u <= cols) {\n    let r = r0 + tx;\n");
    for k in tiled_inputs() {
        for i in 0..4 {
            let c = format!("(c0 + ty + {}u)", 8 * i);
            let _ = writeln!(src, "    let t{k}_{i} = b{k}[{}];", offset(k, "r", &c));
        }
        for i in 0..4 {
            let _ = writeln!(src, "    tile{k}[(ty + {}u) * 33u + tx] = t{k}_{i};", 8 * i);
        }
    }
    src.push_str("  } else {\n");
    visit(src, "let r = r0 + tx; let c = c0 + j;");
    for k in tiled_inputs() {
        let _ = writeln!(
            src,
            "      tile{k}[j * 33u + tx] = b{k}[{}];",
            offset(k, "r", "c")
        );
    }
    src.push_str("    }\n  }\n  }\n  workgroupBarrier();\n");
    visit(src, "let r = r0 + j; let c = c0 + tx;");
    for (k, &d) in sig.dtypes.iter().enumerate().skip(n_out) {
        let word = if sig.tiled[k - n_out] {
            format!("tile{k}[tx * 33u + j]")
        } else {
            format!("b{k}[{}]", offset(k, "r", "c"))
        };
        let _ = writeln!(src, "      let x{} = {};", k - n_out, bits_value(d, word));
    }
    let program = Program::build(sig.trees.iter(), Lanes::one());
    let values = emit(&program, src, 0, caps, &element_leaves)?;
    for (k, &v) in program.outputs[0].iter().enumerate() {
        let (b, o) = (format!("b{k}"), offset(k, "r", "c"));
        let value = &values[v];
        let _ = writeln!(
            src,
            "      {}",
            super::store(sig.dtypes[k], &b, &o, value, caps)
        );
    }
    src.push_str("    }\n  }\n");
    Ok(())
}

/// Declares `o{k}` (each operand's element index) and `li` (the row-major position).
fn offsets(sig: &MapSig, w: &Slots, src: &mut String) {
    for (k, &c) in sig.contiguous.iter().enumerate() {
        if c {
            let _ = writeln!(src, "  let o{k} = params[{}] + gid;", w.offset[k]);
        } else {
            let _ = writeln!(src, "  var o{k} = i32(params[{}]);", w.offset[k]);
        }
    }
    match sig.position {
        PositionKind::Unused => {}
        PositionKind::Linear | PositionKind::Aligned => {
            let _ = writeln!(src, "  let li = params[{}] + gid;", w.lin_base);
        }
        PositionKind::Strided => {
            let _ = writeln!(src, "  var li = params[{}];", w.lin_base);
        }
    }
    if sig.contiguous.iter().all(|&c| c) && sig.position != PositionKind::Strided {
        return;
    }
    let strided: Vec<usize> = (0..w.strides.len())
        .filter(|&k| w.strides[k].is_some())
        .collect();
    decode(sig, w, &strided, "gid", src, |src, c, d| {
        if sig.position == PositionKind::Strided {
            let _ = writeln!(src, "  li = li + {c} * params[{}];", w.lin_strides + d);
        }
    });
}

/// Decodes element `first` of the piece into its coordinates (`c{d}`, the outermost `rem`)
/// and adds each to the offset `o{k}` of every operand in `strided`; `more` writes what else
/// an axis's coordinate `c` feeds.
fn decode(
    sig: &MapSig,
    w: &Slots,
    strided: &[usize],
    first: &str,
    src: &mut String,
    mut more: impl FnMut(&mut String, &str, usize),
) {
    let _ = writeln!(src, "  var rem = {first};");
    for d in (0..sig.rank).rev() {
        let c = if d == 0 {
            "rem".to_string()
        } else {
            let _ = writeln!(
                src,
                "  let c{d} = rem % params[{}]; rem = rem / params[{}];",
                1 + d,
                1 + d
            );
            format!("c{d}")
        };
        for &k in strided {
            let first = w.strides[k].expect("a strided operand has strides");
            let _ = writeln!(
                src,
                "  o{k} = o{k} + i32({c}) * bitcast<i32>(params[{}]);",
                first + d
            );
        }
        more(src, &c, d);
    }
}

/// Four lanes of the tree on the `u32` words that hold four elements of each operand (see
/// [`vector_word`]); the output's words are written whole, so narrow outputs need no atomics.
/// An operand strided between rows (core's `Rows` path: a part of a `cat`, a slice of rows) is
/// reached in whole words at the offset decoded for the vector's first element, which core
/// aligned to four elements. Any other input is a splat (core's plan: constant along the
/// rows, which vectors do not cross): one value, at the offset decoded for that element.
/// 64-bit operands (core gives them vectors only in a contiguous map that draws, so that one
/// Philox call serves the four lanes, or whose inputs are narrower) are read whole, lane by
/// lane, and written as two `vec4<u32>` words (see [`wide_words`]).
fn vec4_body(sig: &MapSig, w: &Slots, caps: Caps, src: &mut String) -> Result<()> {
    let n_out = sig.trees.outputs();
    let decoded: Vec<usize> = (0..sig.dtypes.len())
        .filter(|&k| !sig.contiguous[k])
        .collect();
    for k in (0..sig.dtypes.len()).filter(|&k| sig.contiguous[k]) {
        let _ = writeln!(src, "  let q{k} = (params[{}] >> 2u) + gid;", w.offset[k]);
    }
    if !decoded.is_empty() {
        for &k in &decoded {
            let _ = writeln!(src, "  var o{k} = i32(params[{}]);", w.offset[k]);
        }
        decode(sig, w, &decoded, "gid * 4u", src, |_, _, _| {});
        for k in decoded.iter().copied().filter(|&k| sig.rows[k]) {
            let _ = writeln!(src, "  let q{k} = u32(o{k}) >> 2u;");
        }
    }
    for (k, &d) in sig.dtypes.iter().enumerate().skip(n_out) {
        if d.itemsize() == 8 {
            // Read whole, lane by lane (see `lanes`).
        } else if sig.contiguous[k] || sig.rows[k] {
            let _ = writeln!(src, "  let w{k} = b{k}[q{k}];");
        } else {
            let bits = element_bits(d, &format!("b{k}"), &format!("o{k}"));
            let _ = writeln!(src, "  let sp{k} = {bits};");
        }
    }
    for k in 0..n_out {
        // The lanes' bits in `u32` words, or a 64-bit lane's value.
        let ty = match sig.dtypes[k].itemsize() {
            8 => compute_type(sig.dtypes[k]),
            _ => "u32",
        };
        let names: Vec<String> = (0..4).map(|lane| lane_bits_of(k, lane)).collect();
        let _ = writeln!(src, "  var {}: {ty};", names.join(&format!(": {ty}; var ")));
    }
    // Lanes at a position that is a multiple of four (every launch in practice) know their
    // position modulo 4 at compile time: each picks its Philox word by constant, and a
    // Box–Muller pair's parity test folds away, so a lane computes only the cosine or the
    // sine. Other launches take the general lanes, in a kernel of their own.
    let aligned = sig.position == PositionKind::Aligned;
    let stored_trees: Vec<Expr> = sig.trees.iter().map(|e| stored(e).clone()).collect();
    // Splats are one value for the four lanes: what they compute from those alone (a batch
    // norm's `s / n`) is computed once a vector.
    let splats = (n_out..sig.dtypes.len())
        .filter(|&k| !sig.contiguous[k] && !sig.rows[k] && sig.dtypes[k].itemsize() < 8)
        .filter(|&k| k - n_out < 64)
        .fold(0u64, |m, k| m | 1 << (k - n_out));
    let lanes_of = if aligned {
        Lanes::aligned(4)
    } else {
        Lanes::unaligned(4, 4)
    }
    .sharing(splats);
    let program = Program::build(&stored_trees, lanes_of);
    // Random draws: one Philox call per counter the vector spans, before the lanes.
    let mut sources: Vec<(usize, usize, u8)> = Vec::new();
    for p in &program.draws {
        if !sources.contains(&(p.key, p.counter, p.per_counter)) {
            sources.push((p.key, p.counter, p.per_counter));
        }
    }
    if !sources.is_empty() {
        let _ = writeln!(src, "  let li0 = params[{}] + gid * 4u;", w.lin_base);
    }
    for &(k, c, per) in &sources {
        // The vector's four positions span counters pf..=(li0 + 3) / per: at most 4 / per + 1
        // of them (one more when the first position is not on a counter boundary).
        let name = format!("ph{k}_{c}");
        let _ = writeln!(src, "  let {name}f = li0 / {per}u;");
        for g in 0..=(4 / per as usize) {
            let call = format!(
                "philox4(s{k}lo, s{k}hi, s{c}lo + {name}f + {g}u, \
                 s{c}hi + select(0u, 1u, s{c}lo + {name}f + {g}u < {name}f + {g}u))"
            );
            if g == 0 {
                let _ = writeln!(src, "  let {name}_0 = {call};");
            } else {
                let _ = writeln!(
                    src,
                    "  var {name}_{g} = {name}_{};\n  if ({name}f + {g}u <= (li0 + 3u) / {per}u) {{ {name}_{g} = {call}; }}",
                    g - 1
                );
            }
        }
    }
    if sig.position != PositionKind::Unused {
        let _ = writeln!(src, "  let lb = params[{}] + gid * 4u;", w.lin_base);
    }
    // A strided position never takes the vector path (core's planner gives it one element a
    // work item), so only the linear kinds reach here.
    if aligned {
        src.push_str("  let lq = lb / 4u;\n");
    }
    lanes(sig, caps, &program, aligned, src)?;
    let coalesce = coalesced_words(sig, caps);
    if coalesce {
        // The subgroup stores its words together (see `coalesced_words`) where it is whole and
        // its invocations hold consecutive vectors; else each invocation its own two.
        src.push_str(
            "  let coalesce = (sgs & 1u) == 0u && subgroupAdd(1u) == sgs\n    \
             && subgroupAll(gid == subgroupBroadcastFirst(gid) + sl);\n  \
             let odd = (sl & 1u) == 1u;\n",
        );
    }
    for k in 0..n_out {
        if wide_words(sig.dtypes[k]) {
            let w = |lane: usize| {
                let u = format!("bitcast<u64>({})", lane_bits_of(k, lane));
                format!("u32({u} & 0xfffffffflu), u32({u} >> 32u)")
            };
            for half in 0..2 {
                let _ = writeln!(
                    src,
                    "  let w{k}_{half} = vec4<u32>({}, {});",
                    w(2 * half),
                    w(2 * half + 1)
                );
            }
            let own = format!("b{k}[q{k} * 2u] = w{k}_0; b{k}[q{k} * 2u + 1u] = w{k}_1;");
            if coalesce {
                // Store `s` of lane `sl` writes the subgroup's vector `sgs·s + sl`: half
                // `sl % 2` of lane `(sgs·s + sl) / 2`'s.
                let from = |at: &str| {
                    format!(
                        "select(subgroupShuffle(w{k}_0, {at}), subgroupShuffle(w{k}_1, {at}), odd)"
                    )
                };
                let _ = writeln!(
                    src,
                    "  if (coalesce) {{\n    let x0 = {};\n    let x1 = {};\n    \
                     let v = (q{k} - sl) * 2u + sl;\n    b{k}[v] = x0; b{k}[v + sgs] = x1;\n  \
                     }} else {{ {own} }}",
                    from("sl / 2u"),
                    from("(sgs + sl) / 2u"),
                );
            } else {
                let _ = writeln!(src, "  {own}");
            }
        } else {
            let _ = writeln!(src, "  b{k}[q{k}] = {};", lanes_word(sig.dtypes[k], k));
        }
    }
    Ok(())
}

/// True for a 64-bit dtype, whose four lanes a vector writes as two `vec4<u32>` words:
/// through NVIDIA's Vulkan driver (H200), 2^28 `i64` random integers took 1.21 ms so against
/// 1.67 stored lane by lane, and f64 uniforms 1.21 against 1.66.
fn wide_words(d: DType) -> bool {
    d.itemsize() == 8
}

/// Whether a vector's 64-bit output words go out through subgroup shuffles, so that each
/// store of a subgroup writes consecutive 16-byte vectors: stored directly, an invocation's
/// two vectors leave every other vector of a store to the next store (2^28 i64 random
/// integers 1.21 ms so, 0.74 shuffled; an H200 through Vulkan).
fn coalesced_words(sig: &MapSig, caps: Caps) -> bool {
    caps.subgroups
        && sig.vector == 4
        && sig.dtypes[..sig.trees.outputs()]
            .iter()
            .any(|&d| wide_words(d))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Four lanes of a contiguous cast from f32 to `to`.
    fn cast_source(to: DType) -> String {
        let sig = MapSig {
            trees: MapTrees::one(Expr::input(0, DType::F32).cast(to, false)),
            dtypes: vec![to, DType::F32],
            contiguous: vec![true, true],
            position: PositionKind::Unused,
            scalars: vec![],
            rank: 1,
            vector: 4,
            rows: vec![false; 2],
            tiled: vec![false],
        };
        source(&sig, Caps::default()).unwrap()
    }

    #[test]
    fn what_lanes_compute_from_splats_alone_is_computed_once_a_vector() {
        // x0 · (x1 / s0), x1 constant along the rows (a batch norm's per-channel sum).
        let x = |k| Expr::input(k, DType::F32);
        let s0 = Expr::scalar(0, DType::F32);
        let div = Expr::binary(strata_core::ir::BinaryOp::Div, x(1), s0);
        let e = Expr::binary(strata_core::ir::BinaryOp::Mul, x(0), div);
        let sig = MapSig {
            trees: MapTrees::one(e),
            dtypes: vec![DType::F32; 3],
            contiguous: vec![true, true, false],
            position: PositionKind::Unused,
            scalars: vec![DType::F32],
            rank: 2,
            vector: 4,
            rows: vec![false; 3],
            tiled: vec![false],
        };
        let src = source(&sig, Caps::default()).unwrap();
        let body = &src[src.find("@compute").unwrap()..];
        assert_eq!(body.matches("div_f32(").count(), 1, "{body}");
    }

    #[test]
    fn aligned_lanes_of_a_box_muller_pair_share_their_log_and_square_root() {
        let sig = MapSig {
            trees: MapTrees::one(strata_core::random::randn_f32_expr()),
            dtypes: vec![DType::F32],
            contiguous: vec![true],
            position: PositionKind::Aligned,
            scalars: strata_core::random::randn_f32_scalar_dtypes(),
            rank: 1,
            vector: 4,
            rows: vec![false],
            tiled: vec![false],
        };
        let caps = Caps {
            f64: true,
            int64: true,
            f16: false,
            fused_fma: false,
            coop_f16: false,
            subgroups: false,
        };
        let src = source(&sig, caps).unwrap();
        let body = &src[src.find("@compute").unwrap()..];
        // Aligned lanes only: no test of the position and no general lanes.
        assert!(!body.contains("lb % 4u"), "{body}");
        let aligned = &body[body.find("let lq = lb / 4u;").unwrap()..];
        // Two pairs: a logarithm and a root each; every lane still writes its own bits.
        assert_eq!(aligned.matches("log_fast_f32(").count(), 2, "{aligned}");
        assert_eq!(aligned.matches("sqrt_f32(").count(), 2, "{aligned}");
        // And one sine-and-cosine call a pair: one lane takes its cosine, the other its sine.
        assert_eq!(aligned.matches("sincos_fast_f32(").count(), 2, "{aligned}");
        for lane in 0..4 {
            assert!(aligned.contains(&format!("  l{lane} = ")), "{aligned}");
        }
        let module = naga::front::wgsl::parse_str(&src)
            .unwrap_or_else(|e| panic!("{}\n{src}", e.emit_to_string(&src)));
        use naga::valid::Capabilities as C;
        naga::valid::Validator::new(
            naga::valid::ValidationFlags::all(),
            C::FLOAT64 | C::SHADER_INT64,
        )
        .validate(&module)
        .unwrap_or_else(|e| panic!("{}\n{src}", e.emit_to_string(&src)));
    }

    #[test]
    fn whole_tiles_issue_their_loads_first_and_i64_lanes_store_words() {
        let mut sig = MapSig {
            trees: MapTrees::one(Expr::input(0, DType::F32)),
            dtypes: vec![DType::F32; 2],
            contiguous: vec![false; 2],
            position: PositionKind::Unused,
            scalars: vec![],
            rank: 2,
            vector: 1,
            rows: vec![false; 2],
            tiled: vec![true],
        };
        let src = source(&sig, Caps::default()).unwrap();
        let body = &src[src.find("@compute").unwrap()..];
        let whole = &body[body.find("r0 + 32u <= rows").unwrap()..body.find("} else {").unwrap()];
        // Four loads, then four stores into the tile.
        let last_load = whole.rfind("let t1_3 = b1[").unwrap();
        assert!(whole.find("tile1[").unwrap() > last_load, "{whole}");
        // Four i64 lanes: two word groups, no store lane by lane.
        sig = MapSig {
            trees: MapTrees::one(Expr::input(0, DType::I32).cast(DType::I64, false)),
            dtypes: vec![DType::I64, DType::I32],
            contiguous: vec![true; 2],
            rows: vec![false; 2],
            vector: 4,
            tiled: vec![false],
            ..sig
        };
        let caps = Caps {
            int64: true,
            ..Caps::default()
        };
        let src = source(&sig, caps).unwrap();
        assert!(
            src.contains("var<storage, read_write> b0: array<vec4<u32>>"),
            "{src}"
        );
        assert!(src.contains("let w0_1 = vec4<u32>("), "{src}");
        assert!(src.contains("b0[q0 * 2u + 1u] = w0_1;"), "{src}");
        assert!(
            !src.contains("b0[q0 * 4u") && !src.contains("subgroup"),
            "{src}"
        );
        // With subgroups, a whole subgroup's stores go out as consecutive vectors (shuffled),
        // its own two vectors an invocation's otherwise; f64 lanes alike.
        let caps = Caps {
            subgroups: true,
            f64: true,
            ..caps
        };
        for d in [DType::I64, DType::F64] {
            let sig = MapSig {
                trees: MapTrees::one(Expr::input(0, DType::I32).cast(d, false)),
                dtypes: vec![d, DType::I32],
                ..sig.clone()
            };
            let src = source(&sig, caps).unwrap();
            assert!(src.contains("@builtin(subgroup_size) sgs: u32"), "{src}");
            assert!(
                src.contains("subgroupShuffle(w0_1, (sgs + sl) / 2u)"),
                "{src}"
            );
            assert!(src.contains("b0[v] = x0; b0[v + sgs] = x1;"), "{src}");
            assert!(src.contains("} else { b0[q0 * 2u] = w0_0;"), "{src}");
            let module = naga::front::wgsl::parse_str(&src)
                .unwrap_or_else(|e| panic!("{}\n{src}", e.emit_to_string(&src)));
            use naga::valid::Capabilities as C;
            naga::valid::Validator::new(
                naga::valid::ValidationFlags::all(),
                C::FLOAT64 | C::SHADER_INT64 | C::SUBGROUP,
            )
            .subgroup_stages(naga::valid::ShaderStages::COMPUTE)
            .subgroup_operations(naga::valid::SubgroupOperationSet::all())
            .validate(&module)
            .unwrap_or_else(|e| panic!("{}\n{src}", e.emit_to_string(&src)));
        }
    }

    #[test]
    fn a_vector_cast_to_a_half_type_converts_each_lane_once() {
        for (to, convert, round) in [
            (DType::F16, "f32_to_f16(", "round_f16("),
            (DType::BF16, "f32_to_bf16(", "round_bf16("),
        ] {
            let src = cast_source(to);
            let body = &src[src.find("@compute").unwrap()..];
            assert_eq!(body.matches(convert).count(), 4, "{body}");
            assert!(!body.contains(round), "{body}");
            assert!(
                body.contains("b0[q0] = vec2<u32>(l0 | (l1 << 16u)"),
                "{body}"
            );
        }
    }
}
