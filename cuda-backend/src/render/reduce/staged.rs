//! A reduction with a row prologue ([`RowPrologue`](strata_core::ir::RowPrologue)) or a row
//! epilogue in one kernel: `(x - x.max(-1, true)).exp().sum(-1)` reads each row of `x` once.
//! A block of [`STAGE_GROUP`](crate::render::softmax::STAGE_GROUP) threads copies the row into
//! dynamic shared memory, folds the prologue if there is one (an order-free op: any order
//! gives the eager value) and writes it, computes every element's term in place (what the
//! eager kernel adds: the map's value converted to the accumulator), and then its first
//! `group` threads add the terms exactly as the eager plan's group would (the same lanes,
//! positions, order and combining tree), so the result equals the separate launches bit for
//! bit; an epilogue then runs over the row. Rows the eager plan gives a block (256 threads;
//! a warp's rows are `per_warp`'s), of whole vectors that fit the staging bytes,
//! with terms as wide as the elements (f32, f64), and one eager launch; any other reduction
//! runs as the separate launches (`strata_core::lower::prologue::split`).

use super::parts::{block_combine, contribution, declare_map_operands, decode_output};
use super::parts::{identity, repr, update, warp_reduce, Words};
use super::{ReduceSig, StagedPrologue};
use crate::render::softmax::STAGE_GROUP;
use crate::render::{
    cast, compute_type, from_storage, index_type, storage_type, to_storage, vector_type,
};
use std::fmt::Write;
use strata_core::Result;

/// Blocks of a staged row per multiprocessor: the softmax's measured three.
const STAGE_BLOCKS: usize = 3;

/// True when the kernel stages its row in the eager plan's lanes: an epilogue without a
/// prologue over rows a block adds (the plan's group is a block). The block is then the group,
/// so each thread loads the vectors its eager lane adds, in that lane's order, and adds their
/// terms as they arrive (no pass over a stage of terms); the row of input 0 stays staged, as
/// loaded, for the epilogue.
pub(crate) fn stages_in_lanes(sig: &ReduceSig) -> bool {
    sig.prologue.is_none() && sig.epilogue.is_some() && sig.group == 256
}

/// True when a block of [`STAGE_GROUP`] keeps input 0's row staged as loaded for the epilogue
/// and computes each term as it adds it, instead of writing the terms over the row: where
/// the epilogue reads input 0 outside the map's value (a layer norm's `(x − mean)·s·w + b`
/// after `Σ (x − mean)²`), which it would otherwise read again from memory, and the map reads
/// no further row (each term is input 0's element and values one a row).
pub(crate) fn keeps_row(sig: &ReduceSig) -> bool {
    let (Some(e), Some(m)) = (&sig.epilogue, &sig.map) else {
        return false;
    };
    let term = m.inputs.len();
    let substituted = if m.expr.dtype == repr(sig.op, sig.acc) {
        with_term(&e.expr, &m.expr, term)
    } else {
        e.expr.clone()
    };
    !stages_in_lanes(sig)
        && !sig.held
        && substituted.reads_input(0)
        && (1..m.inputs.len()).all(|k| m.per_output[k] || !m.expr.reads_input(k))
}

/// Threads of the staged kernel's block.
pub(crate) fn block_threads(sig: &ReduceSig) -> usize {
    if stages_in_lanes(sig) {
        sig.group
    } else {
        STAGE_GROUP
    }
}

/// Blocks a multiprocessor of a kernel whose epilogue reads rows again ([`rereads_rows`],
/// `run::reduce` asks for them with its shared memory): few, so the rows it reads again are
/// still in L2. Softmax's backward over [16384, 16384] f32 on an H200: staged in lanes (only
/// `g` read again) 0.99–1.00 ms with one, 0.90–0.92 with two, 1.12 with three; staged by a
/// block of 512 (both rows read again) 1.02–1.05 with one, 1.10–1.14 with two.
pub(crate) fn resident_blocks(sig: &ReduceSig) -> usize {
    if stages_in_lanes(sig) {
        2
    } else {
        1
    }
}

/// A kernel whose epilogue reads rows again runs [`resident_blocks`] a multiprocessor: its
/// registers are allotted for that, and its loops over the row, which load from memory, are
/// unrolled so the loads are in flight together.
fn blocks_and_unroll(sig: &ReduceSig) -> (usize, &'static str) {
    if rereads_rows(sig) {
        (resident_blocks(sig), "#pragma unroll 8\n")
    } else {
        (STAGE_BLOCKS, "")
    }
}

/// Loads and stores evicted first (CUDA's `__ldcs` and `__stcs`) for every vector type the
/// kernels move, a 32-byte vector as its two halves. Written into the kernels that use them
/// (guarded: the catalog compiles many kernels as one program), not the prelude: the prelude
/// is part of every kernel's source, and so of every shipped kernel's key.
const STREAMING: &str = "#ifndef STRATA_STREAMING
#define STRATA_STREAMING
template <typename T> __device__ __forceinline__ T ld_last(const T* p) { return __ldcs(p); }
template <> __device__ __forceinline__ uint4x2 ld_last<uint4x2>(const uint4x2* p) {
  return uint4x2{__ldcs((const uint4*)p), __ldcs((const uint4*)p + 1)};
}
template <typename T> __device__ __forceinline__ void st_stream(T* p, T v) { __stcs(p, v); }
template <> __device__ __forceinline__ void st_stream<uint4x2>(uint4x2* p, uint4x2 v) {
  __stcs((uint4*)p, v.lo);
  __stcs((uint4*)p + 1, v.hi);
}
#endif
";

/// The CUDA C source of a staged reduction with a prologue or an epilogue, named
/// `strata_reduce`. Its words are the eager launch's (`reduce::source`), then the prologue's
/// output's pointer and the epilogue's, each where there is one.
pub(crate) fn source(sig: &ReduceSig) -> Result<String> {
    let Some(m) = sig
        .map
        .as_ref()
        .filter(|_| sig.prologue.is_some() || sig.epilogue.is_some())
        .filter(|_| sig.group == 256)
    else {
        return Err(strata_core::Error::Backend(
            "internal error: a reduction staged by a block has a map, a block's group and a \
             prologue or an epilogue"
                .into(),
        ));
    };
    let idx = index_type(sig.wide);
    let v = sig.vector;
    let r = repr(sig.op, sig.acc);
    let acc_t = compute_type(r);
    let vt = vector_type(v * sig.input.itemsize());
    let warps = STAGE_GROUP / 32;
    let mut s = String::new();
    if stages_in_lanes(sig) {
        s.push_str(STREAMING);
    }
    head(&mut s, sig, m, block_threads(sig), blocks_and_unroll(sig).0);
    // The row, then (in place, as wide) the terms the eager kernel adds.
    let _ = writeln!(s, "  extern __shared__ {vt} rowbuf[];");
    // (`sh_part`: a range's partial; the eager plan splits into fewer than 64, as its
    // one-thread combine requires.)
    if let Some(prologue) = sig.prologue {
        let pr_t = compute_type(repr(prologue.op, prologue.out));
        let _ = writeln!(s, "  __shared__ {pr_t} sh_p[{warps}];");
    }
    let _ = writeln!(
        s,
        "  __shared__ {acc_t} sh_v[8];\n  __shared__ i64 sh_i[8];\n  __shared__ {acc_t} sh_part[64];"
    );
    let _ = writeln!(
        s,
        "  const int warp = threadIdx.x >> 5, wl = threadIdx.x & 31;"
    );
    let _ = writeln!(s, "  for ({idx} o = blockIdx.x; o < O; o += gridDim.x) {{");
    decode_output(&mut s, idx, sig.outer_rank, &Words::of(sig));
    if stages_in_lanes(sig) {
        stage_in_lanes(&mut s, sig, m, idx)?;
    } else {
        stage_then_add(&mut s, sig, m, idx)?;
    }
    let _ = writeln!(s, "    __syncthreads();");
    write_result(&mut s, sig, "threadIdx.x == 0");
    if let Some(e) = &sig.epilogue {
        let lanes = ("threadIdx.x", block_threads(sig));
        epilogue(&mut s, sig, (e, m), lanes, blocks_and_unroll(sig).1)?;
    }
    // The next row overwrites the stage.
    let _ = writeln!(s, "    __syncthreads();\n  }}\n}}");
    Ok(s)
}

/// The kernel's signature (`threads` a block, `blocks` a multiprocessor) and its pointers:
/// the eager launch's words (`reduce::source`), then the prologue's output's pointer and the
/// epilogue's, each where there is one; `O`, `R`, `S`, `chunk`, `in0`, the map's operands,
/// `out`, `prologue_out` and `epilogue_out` declared.
pub(super) fn head(
    s: &mut String,
    sig: &ReduceSig,
    m: &strata_core::lower::operands::ReduceMap,
    threads: usize,
    blocks: usize,
) {
    let idx = index_type(sig.wide);
    let in_t = storage_type(sig.input);
    let w = Words::of(sig);
    let prologue_ptr = w.total;
    let epilogue_ptr = w.total + usize::from(sig.prologue.is_some());
    let total = epilogue_ptr + usize::from(sig.epilogue.is_some());
    let _ = writeln!(
        s,
        "extern \"C\" __global__ void __launch_bounds__({threads}, {blocks}) \
         strata_reduce(const Args<{total}> p) {{"
    );
    let _ = writeln!(
        s,
        "  const {idx} O = ({idx})p.w[0], R = ({idx})p.w[1], S = ({idx})p.w[2], chunk = ({idx})p.w[3];"
    );
    let _ = writeln!(s, "  const {in_t}* in0 = (const {in_t}*)p.w[{}];", w.in_ptr);
    declare_map_operands(s, m, &w);
    let out_t = storage_type(sig.out);
    let _ = writeln!(s, "  {out_t}* out = ({out_t}*)p.w[{}];", w.out_ptr);
    if let Some(prologue) = sig.prologue {
        let t = storage_type(prologue.out);
        let _ = writeln!(s, "  {t}* prologue_out = ({t}*)p.w[{prologue_ptr}];");
    }
    if let Some(e) = &sig.epilogue {
        let t = storage_type(e.out);
        let _ = writeln!(s, "  {t}* epilogue_out = ({t}*)p.w[{epilogue_ptr}];");
    }
}

/// Steps 1 to 4 of a block of [`STAGE_GROUP`]: the row staged (with the prologue, if any),
/// each term written in place, then the terms added in the eager order by the group's lanes;
/// each range's partial ends in `sh_part`.
fn stage_then_add(
    s: &mut String,
    sig: &ReduceSig,
    m: &strata_core::lower::operands::ReduceMap,
    idx: &str,
) -> Result<()> {
    let v = sig.vector;
    let r = repr(sig.op, sig.acc);
    let (acc_t, in_t) = (compute_type(r), storage_type(sig.input));
    let vt = vector_type(v * sig.input.itemsize());
    let unroll = blocks_and_unroll(sig).1;
    // 1. The row into shared memory, its loads in flight together, each thread folding the
    // prologue (if any) over its vectors as they arrive (in any order: the op is order-free),
    // or the staged row summed as the eager sum adds it.
    let res = match sig.prologue {
        Some(prologue) if prologue.op == strata_core::ir::ReduceOp::Sum => {
            Some(stage_with_sum_prologue(s, sig, prologue, idx)?)
        }
        Some(prologue) => Some(stage_with_prologue(s, sig, prologue, idx)?),
        // (An epilogue alone over a block's rows is `stage_in_lanes`'.)
        None => {
            return Err(strata_core::Error::Backend(
                "internal error: a block staging its row without the eager lanes has a \
                 prologue"
                    .into(),
            ))
        }
    };
    if keeps_row(sig) {
        // 3. No stage of terms: the row stays as loaded (the epilogue reads it), each term
        // computed from it as step 4 adds it (the same value, in the same order).
        // (In a block of its own: the epilogue declares the prologue's value again.)
        let _ = writeln!(s, "    }}\n    __syncthreads();\n    {{");
        if let (Some(prologue), Some(res)) = (sig.prologue, res) {
            let _ = writeln!(
                s,
                "    const {} x{res} = {};",
                compute_type(prologue.out),
                from_storage(prologue.out, "kept")
            );
        }
        let read = |k: usize| k > 0 && Some(k) != res && m.expr.reads_input(k);
        let mut next = 0;
        let mut term = |s: &mut String| -> Result<String> {
            let indent = "            ";
            declare_inputs(s, indent, m, ("u.e[l]", true), read);
            let name = crate::render::expr::emit_tree(&m.expr, s, indent, &mut next)?;
            Ok(contribution(sig, &name, m.expr.dtype))
        };
        add_in_eager_order(s, sig, (sig.op, r), in_t, &mut term, idx)?;
        let _ = writeln!(s, "    }}");
        return Ok(());
    }
    // 3. Each thread its own vectors: one shared-memory load and store a vector.
    let _ = writeln!(
        s,
        "{unroll}      for ({idx} r = ({idx})threadIdx.x * {v}; r < R; r += {STAGE_GROUP} * {v}) {{"
    );
    let _ = writeln!(
        s,
        "        union {{ {vt} v; {in_t} e[{v}]; }} u; u.v = rowbuf[r / {v}];\n        union {{ {vt} v; {acc_t} e[{v}]; }} t;"
    );
    // (Inputs only the epilogue reads are not loaded here.)
    let read = |k: usize| k > 0 && Some(k) != res && m.expr.reads_input(k);
    load_row_inputs(s, "        ", m, v, read, "");
    let _ = writeln!(
        s,
        "#pragma unroll\n        for (int l = 0; l < {v}; l++) {{"
    );
    declare_inputs(s, "          ", m, ("u.e[l]", true), read);
    let mut next = 0;
    let name = crate::render::expr::emit_tree(&m.expr, s, "          ", &mut next)?;
    let _ = writeln!(
        s,
        "          t.e[l] = {};\n        }}\n        rowbuf[r / {v}] = t.v;\n      }}\n    }}",
        contribution(sig, &name, m.expr.dtype)
    );
    let _ = writeln!(s, "    __syncthreads();");
    // 4. The terms in the eager order.
    add_in_eager_order(
        s,
        sig,
        (sig.op, r),
        acc_t,
        &mut |_| Ok("u.e[l]".into()),
        idx,
    )
}

/// Step 4, the eager order over the staged row (`rowbuf`, elements of `elem_t` in the vector
/// `u`, element `l` added as the value `value` writes the statements of and returns): per
/// range of the row (one unless the eager plan splits it), the block's threads are its lanes
/// (`reduce::source`); each range's partial, as the partials' scratch would hold it, ends in
/// `sh_part`. (Then one thread adds the ranges' partials in order: the combine launch's fold;
/// a single range is the result.) `op` over accumulator values of `r`.
fn add_in_eager_order(
    s: &mut String,
    sig: &ReduceSig,
    (op, r): (strata_core::ir::ReduceOp, strata_core::DType),
    elem_t: &str,
    value: &mut dyn FnMut(&mut String) -> Result<String>,
    idx: &str,
) -> Result<()> {
    let (g, v) = (sig.group, sig.vector);
    let acc_t = compute_type(r);
    let vt = vector_type(v * sig.input.itemsize());
    let _ = writeln!(s, "    for ({idx} sp = 0; sp < S; sp++) {{");
    let _ = writeln!(
        s,
        "      const {idx} r0 = sp * chunk, r1 = (R - r0 < chunk) ? R : r0 + chunk;"
    );
    let _ = writeln!(
        s,
        "      {acc_t} acc = {}; i64 best = 9223372036854775807ll;",
        identity(op, r)
    );
    let _ = writeln!(s, "      if (threadIdx.x < {g}) {{");
    let _ = writeln!(
        s,
        "#pragma unroll 4\n        for ({idx} r = r0 + ({idx})threadIdx.x * {v}; r < r1; r += {g} * {v}) {{"
    );
    // (A vector of terms at once: lanes `v` elements apart would share banks.)
    let _ = writeln!(
        s,
        "          union {{ {vt} v; {elem_t} e[{v}]; }} u; u.v = rowbuf[r / {v}];"
    );
    let _ = writeln!(
        s,
        "#pragma unroll\n          for (int l = 0; l < {v}; l++) {{"
    );
    let value = value(s)?;
    let _ = writeln!(
        s,
        "            const {acc_t} v = {value}; {} }}",
        update(op, r, "v", "(i64)(r + l)")
    );
    let _ = writeln!(s, "        }}\n      }}");
    warp_reduce(s, "      ", op, r);
    block_combine(s, "      ", op, r, "wl == 0 && warp < 8");
    // (The next range writes `sh_v` again.)
    let _ = writeln!(s, "      __syncthreads();");
    let _ = writeln!(
        s,
        "      if (threadIdx.x == 0) sh_part[sp] = {};\n    }}",
        from_storage(r, &to_storage(r, "acc"))
    );
    Ok(())
}

/// Steps 1 to 4 where the block is the eager plan's group ([`stages_in_lanes`]): per range
/// of the row, each thread loads its lane's vectors in the lane's order, stages input 0's as
/// loaded, and adds each element's term as the eager kernel does (`reduce::source`: the map
/// over the same values, the same conversion and update); then the group's combine. Each
/// range's partial ends in `sh_part`.
fn stage_in_lanes(
    s: &mut String,
    sig: &ReduceSig,
    m: &strata_core::lower::operands::ReduceMap,
    idx: &str,
) -> Result<()> {
    let (g, v) = (sig.group, sig.vector);
    let r = repr(sig.op, sig.acc);
    let (acc_t, in_t) = (compute_type(r), storage_type(sig.input));
    let vt = vector_type(v * sig.input.itemsize());
    let _ = writeln!(s, "    for ({idx} sp = 0; sp < S; sp++) {{");
    let _ = writeln!(
        s,
        "      const {idx} r0 = sp * chunk, r1 = (R - r0 < chunk) ? R : r0 + chunk;"
    );
    let _ = writeln!(
        s,
        "      {acc_t} acc = {}; i64 best = 9223372036854775807ll;",
        identity(sig.op, r)
    );
    let _ = writeln!(
        s,
        "#pragma unroll 8\n      for ({idx} r = r0 + ({idx})threadIdx.x * {v}; r < r1; r += {g} * {v}) {{"
    );
    let _ = writeln!(
        s,
        "        union {{ {vt} v; {in_t} e[{v}]; }} u; u.v = ld_last((const {vt}*)(in0 + ib + r)); rowbuf[r / {v}] = u.v;"
    );
    let read = |k: usize| k > 0 && m.expr.reads_input(k);
    load_row_inputs(s, "        ", m, v, read, "");
    let _ = writeln!(
        s,
        "#pragma unroll\n        for (int l = 0; l < {v}; l++) {{"
    );
    declare_inputs(s, "          ", m, ("u.e[l]", true), read);
    let mut next = 0;
    let name = crate::render::expr::emit_tree(&m.expr, s, "          ", &mut next)?;
    let _ = writeln!(
        s,
        "          const {acc_t} v = {}; {} }}\n      }}",
        contribution(sig, &name, m.expr.dtype),
        update(sig.op, r, "v", "(i64)(r + l)")
    );
    warp_reduce(s, "      ", sig.op, r);
    block_combine(s, "      ", sig.op, r, "wl == 0");
    let _ = writeln!(
        s,
        "      if (threadIdx.x == 0) sh_part[sp] = {};",
        from_storage(r, &to_storage(r, "acc"))
    );
    // (The next range writes `sh_v` again.)
    let _ = writeln!(s, "      __syncthreads();\n    }}");
    Ok(())
}

/// Steps 1 and 2 with a prologue that sums (a layer norm's mean): the row into shared
/// memory, then its sum added exactly as the eager sum of the row adds it (its plan is the
/// reduction's own: `run::reduce` checks), written and read back as stored (`kept`, and the
/// map's input `result`). Opens the block step 3 closes; returns the input that reads it.
fn stage_with_sum_prologue(
    s: &mut String,
    sig: &ReduceSig,
    prologue: StagedPrologue,
    idx: &str,
) -> Result<usize> {
    let v = sig.vector;
    let pr = repr(prologue.op, prologue.out);
    let (in_t, prologue_st) = (storage_type(sig.input), storage_type(prologue.out));
    let vt = vector_type(v * sig.input.itemsize());
    let _ = writeln!(s, "    {prologue_st} kept;");
    let _ = writeln!(s, "    {{");
    let _ = writeln!(
        s,
        "#pragma unroll 8\n      for ({idx} r = ({idx})threadIdx.x * {v}; r < R; r += {STAGE_GROUP} * {v}) rowbuf[r / {v}] = *(const {vt}*)(in0 + ib + r);"
    );
    let _ = writeln!(s, "      __syncthreads();");
    // Each element as the eager sum converts it.
    let eager = ReduceSig {
        op: prologue.op,
        acc: prologue.out,
        ..sig.clone()
    };
    let input = sig.input;
    let mut value =
        |_: &mut String| Ok(contribution(&eager, &from_storage(input, "u.e[l]"), input));
    add_in_eager_order(s, sig, (prologue.op, pr), in_t, &mut value, idx)?;
    let _ = writeln!(s, "      __syncthreads();");
    combine_ranges(s, "      ", "pcomb", (prologue.op, pr), idx);
    // (Step 3 writes the terms over the stage: every thread has added its part of it.)
    Ok(write_prologue(
        s,
        prologue,
        ("pcomb", "threadIdx.x == 0"),
        "\n      __syncthreads();",
    ))
}

/// `result`, the reduction's value as stored: the ranges' partials in `sh_part` combined
/// ([`combine_ranges`]) by every thread, written to the output by those `lead` picks.
pub(super) fn write_result(s: &mut String, sig: &ReduceSig, lead: &str) {
    let r = repr(sig.op, sig.acc);
    combine_ranges(s, "    ", "comb", (sig.op, r), index_type(sig.wide));
    let result = cast("comb", r, sig.out, false);
    let _ = writeln!(
        s,
        "    const {} result = {};\n    if ({lead}) out[ob] = result;",
        storage_type(sig.out),
        to_storage(sig.out, &result)
    );
}

/// `T name`: the ranges' partials in `sh_part` added in order by every thread (the combine
/// launch's fold; a single range is the result), `op` over values of `r`.
pub(super) fn combine_ranges(
    s: &mut String,
    indent: &str,
    name: &str,
    (op, r): (strata_core::ir::ReduceOp, strata_core::DType),
    idx: &str,
) {
    let t = compute_type(r);
    let fold = update(op, r, "v", "0").replace("acc", name);
    let _ = writeln!(
        s,
        "{indent}{t} {name} = sh_part[0];\n{indent}if (S > 1) {{ {name} = {}; for ({idx} sp = 0; sp < S; sp++) {{ const {t} v = sh_part[sp]; {fold} }} }}",
        identity(op, r)
    );
}

/// The prologue's value `value` stored in its dtype (`kept`), written to its output by thread
/// 0, then (after `between`) read back as stored by the map's input `result`, which it returns.
pub(super) fn write_prologue(
    s: &mut String,
    prologue: StagedPrologue,
    (value, lead): (&str, &str),
    between: &str,
) -> usize {
    let pr = repr(prologue.op, prologue.out);
    let stored = to_storage(prologue.out, &cast(value, pr, prologue.out, false));
    let _ = writeln!(
        s,
        "      const {} stored = {stored}; kept = stored;",
        storage_type(prologue.out)
    );
    let _ = writeln!(s, "      if ({lead}) prologue_out[ob] = stored;{between}");
    let res = prologue.result;
    let _ = writeln!(
        s,
        "      const {} x{res} = {};",
        compute_type(prologue.out),
        from_storage(prologue.out, "stored")
    );
    res
}

/// Steps 1 and 2 with a prologue: the row into shared memory, each thread folding the
/// prologue over its vectors as they arrive; then the row's prologue, which every thread ends
/// with, written and read back as stored (`kept`, and the map's input `result`). Opens the
/// block step 3 closes; returns the input that reads the prologue.
fn stage_with_prologue(
    s: &mut String,
    sig: &ReduceSig,
    prologue: StagedPrologue,
    idx: &str,
) -> Result<usize> {
    let v = sig.vector;
    let pr = repr(prologue.op, prologue.out);
    let (pr_t, in_t, prologue_st) = (
        compute_type(pr),
        storage_type(sig.input),
        storage_type(prologue.out),
    );
    let vt = vector_type(v * sig.input.itemsize());
    let warps = STAGE_GROUP / 32;
    let _ = writeln!(s, "    {prologue_st} kept;");
    let _ = writeln!(s, "    {{");
    let _ = writeln!(
        s,
        "      {pr_t} acc = {}; i64 best = 9223372036854775807ll;",
        identity(prologue.op, pr)
    );
    let _ = writeln!(
        s,
        "#pragma unroll 8\n      for ({idx} r = ({idx})threadIdx.x * {v}; r < R; r += {STAGE_GROUP} * {v}) {{"
    );
    let _ = writeln!(
        s,
        "        union {{ {vt} v; {in_t} e[{v}]; }} u; u.v = *(const {vt}*)(in0 + ib + r); rowbuf[r / {v}] = u.v;"
    );
    let _ = writeln!(
        s,
        "#pragma unroll\n        for (int l = 0; l < {v}; l++) {{ const {pr_t} v = {}; {} }}\n      }}",
        cast(&from_storage(sig.input, "u.e[l]"), sig.input, pr, false),
        update(prologue.op, pr, "v", "0")
    );
    // 2. The prologue of the row: every thread ends with it.
    warp_reduce(s, "      ", prologue.op, pr);
    let _ = writeln!(
        s,
        "      if (wl == 0) sh_p[warp] = acc;\n      __syncthreads();"
    );
    let _ = writeln!(
        s,
        "      acc = sh_p[0];\n      for (int w = 1; w < {warps}; w++) {{ const {pr_t} v = sh_p[w]; {} }}",
        update(prologue.op, pr, "v", "0")
    );
    // 3. Each element's term reads the prologue back as stored.
    Ok(write_prologue(s, prologue, ("acc", "threadIdx.x == 0"), ""))
}

/// `const T xk = …;` (at `indent`) for input 0 at `first` where `zero` says so, and each further
/// input `read` picks: one value per output at `in{k}[ob]`, the others from their vector loads
/// (`load_row_inputs`), element `l`.
pub(super) fn declare_inputs(
    s: &mut String,
    indent: &str,
    m: &strata_core::lower::operands::ReduceMap,
    (first, zero): (&str, bool),
    read: impl Fn(usize) -> bool,
) {
    for (k, &d) in m.inputs.iter().enumerate() {
        let at = match k {
            0 if zero => first.to_string(),
            _ if k == 0 || !read(k) => continue,
            _ if m.per_output[k] => format!("in{k}[ob]"),
            _ => format!("u{k}.e[l]"),
        };
        let _ = writeln!(
            s,
            "{indent}const {} x{k} = {};",
            compute_type(d),
            from_storage(d, &at)
        );
    }
}

/// Vector loads (`u{k}`) at the row position `r` of the map's inputs `read` picks that are laid
/// out like input 0 (core's promise for every input without one value per output) or hold
/// one value per position in the row (the same `r` for every row), through the load function
/// `load` (`ld_last`: a last read, evicted first), or plain where it is empty.
pub(super) fn load_row_inputs(
    s: &mut String,
    indent: &str,
    m: &strata_core::lower::operands::ReduceMap,
    v: usize,
    read: impl Fn(usize) -> bool,
    load: &str,
) {
    for (k, &d) in m.inputs.iter().enumerate() {
        if read(k) && !m.per_output[k] {
            let (t, vt) = (storage_type(d), vector_type(v * d.itemsize()));
            // (One value per position: read by every row, kept in cache, never evicted first.)
            let (row, load) = match m.per_position[k] {
                true => ("", ""),
                false => ("ib + ", load),
            };
            let at = if load.is_empty() {
                format!("*(const {vt}*)(in{k} + {row}r)")
            } else {
                format!("{load}((const {vt}*)(in{k} + {row}r))")
            };
            let _ = writeln!(
                s,
                "{indent}union {{ {vt} v; {t} e[{v}]; }} u{k}; u{k}.v = {at};"
            );
        }
    }
}

/// Step 5, the epilogue: each element of the row once more, with the prologue's and the
/// reduction's results as stored, in registers; each thread its own vectors, written whole
/// (core's plan aligned the output's rows). Where the epilogue reads the map's value itself
/// (`exp(x - m) / s` holds `exp(x - m)`), that value is the stage's term (the map's value as
/// the accumulator holds it, of the same width: exact), read from shared memory; the row is
/// read again (from L2) only where the epilogue still reads input 0 outside it.
pub(super) fn epilogue(
    s: &mut String,
    sig: &ReduceSig,
    (e, m): (
        &super::StagedEpilogue,
        &strata_core::lower::operands::ReduceMap,
    ),
    (lane, lanes): (&str, usize),
    unroll: &str,
) -> Result<()> {
    let idx = index_type(sig.wide);
    let v = sig.vector;
    let in_t = storage_type(sig.input);
    let vt = vector_type(v * sig.input.itemsize());
    let (res, pres) = (e.result, sig.prologue.map(|p| p.result));
    let (expr, term) = epilogue_expr(sig, e, m);
    let _ = writeln!(
        s,
        "    const {} x{res} = {};",
        compute_type(sig.out),
        from_storage(sig.out, "result")
    );
    if let Some(prologue) = sig.prologue {
        let _ = writeln!(
            s,
            "    const {} x{} = {};",
            compute_type(prologue.out),
            prologue.result,
            from_storage(prologue.out, "kept")
        );
    }
    let mut next = 0;
    let declared = |k: usize| k == res || Some(k) == pres;
    let expr = super::row_values::hoisted(s, &expr, m, &declared, ("    ", &mut next))?;
    let out_st = storage_type(e.out);
    let _ = writeln!(
        s,
        "{unroll}    for ({idx} r = ({idx}){lane} * {v}; r < R; r += {lanes} * {v}) {{"
    );
    if expr.reads_input(0) {
        // Staged in lanes, kept or by warps, the stage holds input 0's row as loaded.
        let at = if row_as_loaded(sig) {
            format!("rowbuf[r / {v}]")
        } else {
            format!("*(const {vt}*)(in0 + ib + r)")
        };
        let _ = writeln!(s, "      union {{ {vt} v; {in_t} e[{v}]; }} u; u.v = {at};");
    }
    if expr.reads_input(term) {
        let acc_t = compute_type(repr(sig.op, sig.acc));
        let _ = writeln!(
            s,
            "      union {{ {vt} v; {acc_t} e[{v}]; }} t; t.v = rowbuf[r / {v}];"
        );
    }
    let ovt = vector_type(v * e.out.itemsize());
    let read = |k: usize| k != res && Some(k) != pres && expr.reads_input(k);
    // Staged in lanes, the rows read again stay in L2 while input 0 (staged) and the output
    // stream past them: those are read and written evicted first, and the rows' second
    // read is their last.
    let lanes = stages_in_lanes(sig);
    let last = if lanes { "ld_last" } else { "" };
    load_row_inputs(s, "      ", m, v, |k| k > 0 && read(k), last);
    let _ = writeln!(s, "      union {{ {ovt} v; {out_st} e[{v}]; }} y;");
    let _ = writeln!(s, "#pragma unroll\n      for (int l = 0; l < {v}; l++) {{");
    declare_inputs(s, "        ", m, ("u.e[l]", read(0)), read);
    if expr.reads_input(term) {
        let _ = writeln!(
            s,
            "        const {} x{term} = t.e[l];",
            compute_type(m.expr.dtype)
        );
    }
    let name = crate::render::expr::emit_tree(&expr, s, "        ", &mut next)?;
    let value = to_storage(e.out, &name);
    let _ = writeln!(
        s,
        "        y.e[l] = {value};\n      }}\n      {}\n    }}",
        if lanes {
            format!("st_stream(({ovt}*)(epilogue_out + ib + r), y.v);")
        } else {
            format!("*({ovt}*)(epilogue_out + ib + r) = y.v;")
        }
    );
    Ok(())
}

/// The epilogue's expression as the kernel computes it, and the input number through which
/// it reads the staged term: the map's value, wherever the epilogue computes it, is the term
/// where the accumulator holds it in its own dtype.
pub(super) fn epilogue_expr(
    sig: &ReduceSig,
    e: &super::StagedEpilogue,
    m: &strata_core::lower::operands::ReduceMap,
) -> (strata_core::ir::Expr, usize) {
    let term = m.inputs.len();
    // (Staged in lanes or the row kept, no stage of terms: the epilogue computes the map again.)
    if m.expr.dtype == repr(sig.op, sig.acc) && !row_as_loaded(sig) {
        (with_term(&e.expr, &m.expr, term), term)
    } else {
        (e.expr.clone(), term)
    }
}

/// True when `sig`'s epilogue reads rows from memory again (from L2, while they are there):
/// a further input laid out like the rows, or input 0 outside the staged terms (not where
/// input 0's row is staged as loaded, [`stages_in_lanes`] and [`keeps_row`]). (One row of values per position,
/// read by every row, stays in cache.)
pub(crate) fn rereads_rows(sig: &ReduceSig) -> bool {
    let (Some(e), Some(m)) = (&sig.epilogue, &sig.map) else {
        return false;
    };
    let (expr, _) = epilogue_expr(sig, e, m);
    let staged = usize::from(row_as_loaded(sig));
    (staged..m.inputs.len()).any(|k| !m.per_output[k] && !m.per_position[k] && expr.reads_input(k))
}

/// True when the stage holds input 0's row as loaded through the epilogue (no stage of terms:
/// the epilogue computes the map again, and reads the row from the stage).
fn row_as_loaded(sig: &ReduceSig) -> bool {
    stages_in_lanes(sig) || keeps_row(sig) || sig.staged_by_warps()
}

/// `e` with every subtree equal to `map` read as input `term` instead.
fn with_term(
    e: &strata_core::ir::Expr,
    map: &strata_core::ir::Expr,
    term: usize,
) -> strata_core::ir::Expr {
    if e == map {
        return strata_core::ir::Expr::input(term, map.dtype);
    }
    e.map_children(|c| with_term(c, map, term))
}

#[cfg(test)]
pub(super) mod tests {
    use super::super::StagedPrologue;
    use super::*;
    use strata_core::ir::BinaryOp;
    use strata_core::ir::Expr;
    use strata_core::ir::ReduceOp;
    use strata_core::ir::UnaryOp;
    use strata_core::lower::operands::ReduceMap;
    use strata_core::DType;

    fn sig(group: usize) -> ReduceSig {
        let x = |k| Expr::input(k, DType::F32);
        ReduceSig {
            op: ReduceOp::Sum,
            input: DType::F32,
            acc: DType::F32,
            out: DType::F32,
            outer_rank: 1,
            reduced_rank: 1,
            group,
            vector: 4,
            wide: false,
            combine: false,
            map: Some(ReduceMap {
                expr: Expr::unary(UnaryOp::Exp, Expr::binary(BinaryOp::Sub, x(0), x(1))),
                inputs: vec![DType::F32; 2],
                per_output: vec![false, true],
                per_position: vec![false; 2],
                scalars: vec![],
            }),
            prologue: Some(StagedPrologue {
                op: ReduceOp::Max,
                result: 1,
                out: DType::F32,
            }),
            epilogue: None,
            held: false,
            stores_map: false,
            out_vector: 1,
        }
    }

    #[test]
    fn the_row_is_staged_once_and_the_blocks_lanes_add_the_terms_in_the_eager_order() {
        let src = source(&sig(256)).unwrap();
        assert!(src.contains("extern __shared__ uint4 rowbuf[];"), "{src}");
        assert_eq!(src.matches("*(const uint4*)(in0").count(), 1, "{src}");
        // The prologue's result is read from the register, never from its buffer.
        assert!(src.contains("const float x1 = stored;"), "{src}");
        assert!(!src.contains("in1["), "{src}");
        assert!(src.contains("r += 256 * 4"), "{src}");
        assert!(src.contains("comb = comb + v;"), "{src}");
        assert!(src.contains("sh_v[threadIdx.x >> 5] = acc"), "{src}");
        // Softmax from its primitives reads only the staged terms: three blocks.
        assert!(src.contains("__launch_bounds__(512, 3)"), "{src}");
        // A warp's rows are `per_warp`'s.
        assert!(source(&sig(32)).is_err());
    }

    #[test]
    fn a_layer_norms_weight_and_bias_are_read_at_the_position_in_the_row() {
        // `(x - m) · rsqrt(v / n + eps) · w + b`: the mean and the sum of squares one value a
        // row, the weight and bias one value a position of every row.
        let x = |k| Expr::input(k, DType::F32);
        let mut sig = sig(256);
        sig.prologue = None;
        let centred = Expr::binary(BinaryOp::Sub, x(0), x(1));
        sig.map = Some(ReduceMap {
            expr: Expr::binary(BinaryOp::Mul, centred.clone(), centred.clone()),
            inputs: vec![DType::F32; 5],
            per_output: vec![false, true, true, false, false],
            per_position: vec![false, false, false, true, true],
            scalars: vec![],
        });
        let scale = Expr::unary(UnaryOp::Rsqrt, x(2));
        let normalized = Expr::binary(BinaryOp::Mul, centred, scale);
        sig.epilogue = Some(super::super::StagedEpilogue {
            expr: Expr::binary(
                BinaryOp::Add,
                Expr::binary(BinaryOp::Mul, normalized, x(3)),
                x(4),
            ),
            result: 2,
            out: DType::F32,
        });
        // The weight and bias are one row for every row: no row read again from memory.
        assert!(!rereads_rows(&sig));
        let src = source(&sig).unwrap();
        let tail = &src[src.find("const float x2 = result;").expect(&src)..];
        for k in [3, 4] {
            let load = format!("u{k}.v = *(const uint4*)(in{k} + r);");
            assert!(tail.contains(&load), "{tail}");
            assert!(!tail.contains(&format!("in{k} + ib")), "{tail}");
        }
        assert!(tail.contains("const float x1 = in1[ob];"), "{tail}");
    }

    /// A layer norm over rows of the plan's `group`: the mean's sum as the prologue, `Σ (x −
    /// s/n)²`, then `(x − s/n)·rsqrt(v)·w + b`, the weight and bias one value a position.
    pub(in crate::render::reduce) fn layer_norm(group: usize) -> ReduceSig {
        let x = |k| Expr::input(k, DType::F32);
        let mut sig = sig(group);
        if let Some(p) = sig.prologue.as_mut() {
            p.op = ReduceOp::Sum;
        }
        let mean = Expr::binary(BinaryOp::Div, x(1), Expr::scalar(0, DType::F32));
        let centred = Expr::binary(BinaryOp::Sub, x(0), mean);
        sig.map = Some(ReduceMap {
            expr: Expr::binary(BinaryOp::Mul, centred.clone(), centred.clone()),
            inputs: vec![DType::F32; 5],
            per_output: vec![false, true, true, false, false],
            per_position: vec![false, false, false, true, true],
            scalars: vec![DType::F32],
        });
        let normalized = Expr::binary(BinaryOp::Mul, centred, Expr::unary(UnaryOp::Rsqrt, x(2)));
        sig.epilogue = Some(super::super::StagedEpilogue {
            expr: Expr::binary(
                BinaryOp::Add,
                Expr::binary(BinaryOp::Mul, normalized, x(3)),
                x(4),
            ),
            result: 2,
            out: DType::F32,
        });
        sig
    }

    #[test]
    fn a_layer_norm_sums_its_mean_in_the_eager_order_and_keeps_the_row() {
        let sig = layer_norm(256);
        assert!(keeps_row(&sig) && !rereads_rows(&sig));
        let src = source(&sig).unwrap();
        let (body, tail) = src.split_at(src.find("const float x2 = result;").expect(&src));
        // The sum of the staged row in the eager lanes' order, stored and read back as stored.
        let prologue = &body[..body.find("prologue_out[ob] = stored;").expect(body)];
        assert!(prologue.contains("r = r0 + (i32)threadIdx.x * 4; r < r1; r += 256 * 4"));
        assert!(prologue.contains("pcomb = sh_part[0];"), "{prologue}");
        assert!(!prologue.contains("fmaxf"), "{prologue}");
        // No stage of terms; the epilogue reads the row from the stage and the weight and
        // bias at the row's positions.
        assert!(!body.contains("rowbuf[r / 4] = t.v;"), "{body}");
        assert!(tail.contains("u.v = rowbuf[r / 4];"), "{tail}");
        assert!(tail.contains("u3.v = *(const uint4*)(in3 + r);"), "{tail}");
        assert!(src.contains("__launch_bounds__(512, 3)"), "{src}");
    }

    #[test]
    fn an_epilogue_alone_over_a_blocks_rows_adds_terms_as_the_lanes_load_them() {
        // Softmax's backward over long rows: the eager plan's group is a block.
        let x = |k| Expr::input(k, DType::F32);
        let mut sig = sig(256);
        sig.prologue = None;
        sig.map = Some(ReduceMap {
            expr: Expr::binary(BinaryOp::Mul, x(0), x(1)),
            inputs: vec![DType::F32; 3],
            per_output: vec![false, false, true],
            per_position: vec![false; 3],
            scalars: vec![],
        });
        sig.epilogue = Some(super::super::StagedEpilogue {
            expr: Expr::binary(BinaryOp::Mul, x(0), Expr::binary(BinaryOp::Sub, x(1), x(2))),
            result: 2,
            out: DType::F32,
        });
        assert!(stages_in_lanes(&sig) && rereads_rows(&sig));
        assert_eq!(block_threads(&sig), 256);
        let src = source(&sig).unwrap();
        let (body, tail) = src.split_at(src.find("const float x2 = result;").expect(&src));
        // Each lane loads its own vectors of both rows in the eager lanes' order, stages
        // input 0's as loaded and adds the terms as they arrive: no stage of terms.
        assert!(
            body.contains("r = r0 + (i32)threadIdx.x * 4; r < r1; r += 256 * 4"),
            "{body}"
        );
        assert!(
            body.contains("u.v = ld_last((const uint4*)(in0 + ib + r)); rowbuf[r / 4] = u.v;"),
            "{body}"
        );
        assert!(
            body.contains("const float v = v2; acc = acc + v; }"),
            "{body}"
        );
        assert!(!body.contains("rowbuf[r / 4] = t.v;"), "{body}");
        assert!(body.contains("sh_v[threadIdx.x >> 5] = acc"), "{body}");
        // The epilogue reads input 0 from the stage and only g from memory again.
        assert!(tail.contains("u.v = rowbuf[r / 4];"), "{tail}");
        assert!(!tail.contains("in0 + ib"), "{tail}");
        // Input 0 and the output stream past the row read again (evicted first), whose
        // second read is its last.
        assert!(
            tail.contains("u1.v = ld_last((const uint4*)(in1 + ib + r));"),
            "{tail}"
        );
        assert!(
            tail.contains("st_stream((uint4*)(epilogue_out + ib + r), y.v);"),
            "{tail}"
        );
        assert!(tail.contains("r += 256 * 4"), "{tail}");
        let bounds = format!("__launch_bounds__(256, {})", resident_blocks(&sig));
        assert!(src.contains(&bounds), "{src}");
        // An epilogue that reads only input 0's row and the sum reads nothing again.
        if let Some(e) = sig.epilogue.as_mut() {
            e.expr = Expr::binary(BinaryOp::Mul, x(0), x(2));
        }
        assert!(!rereads_rows(&sig));
    }

    #[test]
    fn an_epilogue_reads_the_row_again_with_both_results_in_registers() {
        // Softmax from its primitives: `exp(x - m) / s`, the sum read through input 2.
        let x = |k| Expr::input(k, DType::F32);
        let mut sig = sig(256);
        if let Some(m) = sig.map.as_mut() {
            m.inputs.push(DType::F32);
            m.per_output.push(true);
            m.per_position.push(false);
        }
        let term = Expr::unary(UnaryOp::Exp, Expr::binary(BinaryOp::Sub, x(0), x(1)));
        sig.epilogue = Some(super::super::StagedEpilogue {
            expr: Expr::binary(BinaryOp::Div, term, x(2)),
            result: 2,
            out: DType::F32,
        });
        let src = source(&sig).unwrap();
        let tail = &src[src.find("const float x2 = result;").expect(&src)..];
        // The maximum and the sum as stored, never read from their buffers; the terms read
        // from the stage (the row is not read again) and the output written whole.
        assert!(tail.contains("const float x1 = kept;"), "{tail}");
        assert!(!src.contains("in1[") && !src.contains("in2["), "{src}");
        assert!(tail.contains("t.v = rowbuf[r / 4];"), "{tail}");
        assert!(!tail.contains("in0 + ib + r"), "{tail}");
        assert!(
            tail.contains("*(uint4*)(epilogue_out + ib + r) = y.v;"),
            "{tail}"
        );
        // An epilogue that reads the row outside the term keeps the row staged as loaded:
        // each term computed as it is added, the row read from the stage, not from memory.
        if let Some(e) = sig.epilogue.as_mut() {
            e.expr = Expr::binary(BinaryOp::Mul, e.expr.clone(), x(0));
        }
        assert!(keeps_row(&sig) && !rereads_rows(&sig));
        let src = source(&sig).unwrap();
        let (body, tail) = src.split_at(src.find("const float x2 = result;").expect(&src));
        assert!(!body.contains("rowbuf[r / 4] = t.v;"), "{body}");
        assert!(body.contains("const float x1 = kept;"), "{body}");
        assert!(tail.contains("u.v = rowbuf[r / 4];"), "{tail}");
        assert!(!tail.contains("in0 + ib + r"), "{tail}");
        assert!(src.contains("__launch_bounds__(512, 3)"), "{src}");
        // Its output pointer follows the prologue's.
        let w = Words::of(&sig);
        assert!(
            src.contains(&format!("epilogue_out = (float*)p.w[{}];", w.total + 1)),
            "{src}"
        );
    }
}
