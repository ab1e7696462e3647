//! A staged reduction whose eager plan gives each row one warp (contiguous rows shorter than
//! a block's long row: 64 to 8,191 f32): each warp of the block takes its own rows, stages
//! each in its own slice of shared memory (the whole row in flight at once: `cp.async`, which
//! takes no registers), and does everything the
//! block-of-[`STAGE_GROUP`](crate::render::softmax::STAGE_GROUP) kernel (`staged`) does —
//! the prologue, the terms in the eager lanes' order, the epilogue — with no other warp
//! waiting on it. A lane adds exactly the positions its eager lane adds (the same vectors, in
//! that order, then the same shuffle tree and the ranges' fold), so the result equals the
//! separate launches bit for bit. The row stays staged as loaded: the epilogue computes the
//! map again from it (NVRTC runs with `--fmad=false`, so the same expression gives the same
//! bits). A layer norm over [65536, 4096] f32 on an H200 staged by a block of 512 took
//! 1.00 ms, 15 of its 16 warps waiting on the one that adds; staged by warps, with γ and β
//! kept in L1 (`run::reduce` launches it on a `Grid::Cached`), 0.64 ms.

use super::parts::{contribution, decode_output, identity, repr, update, warp_reduce, Words};
use super::staged::{combine_ranges, declare_inputs, epilogue, head, load_row_inputs};
use super::staged::{epilogue_expr, write_prologue, write_result};
use super::{ReduceSig, StagedPrologue};
use crate::render::vector_type;
use crate::render::{cast, compute_type, from_storage, index_type, storage_type, to_storage};
use std::fmt::Write;
use strata_core::lower::operands::ReduceMap;
use strata_core::Result;

/// Copies from global to shared memory that take no registers and are all in flight at once
/// (`cp.async`, compute capability 8.0 on; a plain copy before it), for the 8- and 16-byte
/// vectors the rows are read in, and the wait for a thread's copies. Guarded: the catalog
/// compiles many kernels as one program.
const STAGE_ASYNC: &str = "#ifndef STRATA_STAGE_ASYNC
#define STRATA_STAGE_ASYNC
template <typename T> __device__ __forceinline__ void stage_async(T* dst, const T* src) {
#if __CUDA_ARCH__ >= 800
  const unsigned at = (unsigned)__cvta_generic_to_shared(dst);
  if (sizeof(T) == 16) {
    asm volatile(\"cp.async.cg.shared.global [%0], [%1], 16;\\n\" :: \"r\"(at), \"l\"(src) : \"memory\");
  } else {
    asm volatile(\"cp.async.ca.shared.global [%0], [%1], %2;\\n\" :: \"r\"(at), \"l\"(src), \"n\"(sizeof(T)) : \"memory\");
  }
#else
  *dst = *src;
#endif
}
__device__ __forceinline__ void stage_wait() {
#if __CUDA_ARCH__ >= 800
  asm volatile(\"cp.async.wait_all;\\n\" ::: \"memory\");
#endif
}
#endif
";

/// The most warps (rows at once) of a block.
pub(crate) const MAX_WARPS: usize = 8;

/// Blocks a multiprocessor the kernel's registers are bounded for (each at most
/// [`MAX_WARPS`] warps; its rows, at most the target's `row_stage_bytes` together, fit three
/// to a multiprocessor).
const BLOCKS: usize = 3;

/// Warps (rows at once) of a block for rows of `row_bytes` staged, within `stage_bytes` of
/// shared memory a block: at least one.
pub(crate) fn warps(row_bytes: usize, stage_bytes: usize) -> usize {
    (stage_bytes / row_bytes.max(1)).clamp(1, MAX_WARPS)
}

/// The CUDA C source of `sig` (a staged reduction, [`ReduceSig::staged_by_warps`]), named `strata_reduce`. Its
/// words are `staged::source`'s; its block is a whole number of warps, each taking rows
/// `blockIdx.x · warps + warp`, then every `gridDim.x · warps`-th, each staged at its slice
/// of the dynamic shared memory (`R` elements a warp).
pub(crate) fn source(sig: &ReduceSig) -> Result<String> {
    let Some(m) = sig.map.as_ref().filter(|_| sig.staged_by_warps()) else {
        return Err(strata_core::Error::Backend(
            "internal error: a reduction staged by warps has a map, a warp's group and a \
             prologue or an epilogue"
                .into(),
        ));
    };
    let idx = index_type(sig.wide);
    let v = sig.vector;
    let r = repr(sig.op, sig.acc);
    let vt = vector_type(v * sig.input.itemsize());
    let mut s = String::from(STAGE_ASYNC);
    head(&mut s, sig, m, MAX_WARPS * 32, BLOCKS);
    // Each warp's row, and its ranges' partials (the eager plan splits into fewer than 64).
    let _ = writeln!(s, "  extern __shared__ {vt} stage[];");
    let _ = writeln!(
        s,
        "  __shared__ {} parts[{MAX_WARPS}][64];",
        compute_type(r)
    );
    if let Some(prologue) = sig.prologue {
        let pr_t = compute_type(repr(prologue.op, prologue.out));
        let _ = writeln!(s, "  __shared__ {pr_t} sh_p[{MAX_WARPS}];");
    }
    let _ = writeln!(
        s,
        "  const int warp = threadIdx.x >> 5, wl = threadIdx.x & 31;\n  const {idx} W = ({idx})(blockDim.x >> 5);"
    );
    let _ = writeln!(
        s,
        "  {vt}* rowbuf = stage + ({idx})warp * (R / {v});\n  {}* sh_part = parts[warp];",
        compute_type(r)
    );
    let _ = writeln!(
        s,
        "  for ({idx} o = ({idx})blockIdx.x * W + warp; o < O; o += ({idx})gridDim.x * W) {{"
    );
    decode_output(&mut s, idx, sig.outer_rank, &Words::of(sig));
    // The whole row in flight at once, each lane its eager lane's vectors; every pass then
    // reads the stage. (A range's lanes may differ from the row's: a lane reads what
    // another staged.)
    let _ = writeln!(
        s,
        "#pragma unroll 8\n    for ({idx} r = ({idx})wl * {v}; r < R; r += 32 * {v}) stage_async(&rowbuf[r / {v}], (const {vt}*)(in0 + ib + r));\n    stage_wait();\n    __syncwarp();"
    );
    let res = match sig.prologue {
        Some(p) if p.op == strata_core::ir::ReduceOp::Sum => Some(sum_prologue(&mut s, sig, p)),
        Some(p) => Some(order_free_prologue(&mut s, sig, p)),
        None => {
            let _ = writeln!(s, "    {{");
            None
        }
    };
    terms(&mut s, sig, m, res)?;
    let _ = writeln!(s, "    }}\n    __syncwarp();");
    write_result(&mut s, sig, "wl == 0");
    if let Some(e) = &sig.epilogue {
        // (Where a range's lanes differ from the row's, a lane reads what another staged.)
        let _ = writeln!(s, "    __syncwarp();");
        debug_assert_eq!(epilogue_expr(sig, e, m).0, e.expr);
        epilogue(&mut s, sig, (e, m), ("wl", 32), "#pragma unroll 4\n")?;
    }
    // The next row overwrites the stage.
    let _ = writeln!(s, "    __syncwarp();\n  }}\n}}");
    Ok(s)
}

/// Per range of the row, the lanes' loop over their vectors in the eager order, `body` for
/// each (vector `u` at row position `r`), then the warp's shuffle tree; each range's partial
/// (as the partials' scratch would hold it) in `sh_part`, from lane 0.
fn ranges(
    s: &mut String,
    sig: &ReduceSig,
    (op, r): (strata_core::ir::ReduceOp, strata_core::DType),
    body: &mut dyn FnMut(&mut String) -> Result<()>,
) -> Result<()> {
    let idx = index_type(sig.wide);
    let v = sig.vector;
    let _ = writeln!(s, "      for ({idx} sp = 0; sp < S; sp++) {{");
    let _ = writeln!(
        s,
        "        const {idx} r0 = sp * chunk, r1 = (R - r0 < chunk) ? R : r0 + chunk;"
    );
    let _ = writeln!(
        s,
        "        {} acc = {}; i64 best = 9223372036854775807ll;",
        compute_type(r),
        identity(op, r)
    );
    let _ = writeln!(
        s,
        "#pragma unroll 8\n        for ({idx} r = r0 + ({idx})wl * {v}; r < r1; r += 32 * {v}) {{"
    );
    body(s)?;
    let _ = writeln!(s, "        }}");
    warp_reduce(s, "        ", op, r);
    let _ = writeln!(
        s,
        "        if (wl == 0) sh_part[sp] = {};\n      }}",
        from_storage(r, &to_storage(r, "acc"))
    );
    Ok(())
}

/// `union { vt v; T e[v]; } u`: the staged row's vector at row position `r`.
fn row_vector(s: &mut String, sig: &ReduceSig) {
    let v = sig.vector;
    let (in_t, vt) = (
        storage_type(sig.input),
        vector_type(v * sig.input.itemsize()),
    );
    let _ = writeln!(
        s,
        "          union {{ {vt} v; {in_t} e[{v}]; }} u; u.v = rowbuf[r / {v}];"
    );
}

/// The prologue that sums (a layer norm's mean): each element of the staged row added as the
/// eager sum of the row converts and adds it (its plan is the reduction's own: `run::reduce`
/// checks), the ranges folded, written and read back as stored (`kept`, and the map's input
/// `result`). Opens the block [`source`] closes; returns the
/// input that reads it.
fn sum_prologue(s: &mut String, sig: &ReduceSig, prologue: StagedPrologue) -> usize {
    let pr = repr(prologue.op, prologue.out);
    let _ = writeln!(s, "    {} kept;\n    {{", storage_type(prologue.out));
    let eager = ReduceSig {
        op: prologue.op,
        acc: prologue.out,
        ..sig.clone()
    };
    let input = sig.input;
    let mut body = |s: &mut String| {
        row_vector(s, sig);
        let value = contribution(&eager, &from_storage(input, "u.e[l]"), input);
        let _ = writeln!(
            s,
            "#pragma unroll\n          for (int l = 0; l < {}; l++) {{ const {} v = {value}; {} }}",
            sig.vector,
            compute_type(pr),
            update(prologue.op, pr, "v", "0")
        );
        Ok(())
    };
    // (No error: the body writes no expression.)
    let _ = ranges(s, sig, (prologue.op, pr), &mut body);
    let _ = writeln!(s, "      __syncwarp();");
    combine_ranges(
        s,
        "      ",
        "pcomb",
        (prologue.op, pr),
        index_type(sig.wide),
    );
    write_prologue(s, prologue, ("pcomb", "wl == 0"), "")
}

/// An order-free prologue (softmax's maximum): each lane folding its elements of the staged row
/// in any order, then the warp's; every lane takes lane 0's, written and read back as stored (`kept`, and the map's input `result`). Opens the block [`source`]
/// closes; returns the input that reads it.
fn order_free_prologue(s: &mut String, sig: &ReduceSig, prologue: StagedPrologue) -> usize {
    let idx = index_type(sig.wide);
    let v = sig.vector;
    let pr = repr(prologue.op, prologue.out);
    let pr_t = compute_type(pr);
    let _ = writeln!(s, "    {} kept;\n    {{", storage_type(prologue.out));
    let _ = writeln!(
        s,
        "      {pr_t} acc = {}; i64 best = 9223372036854775807ll;",
        identity(prologue.op, pr)
    );
    let _ = writeln!(
        s,
        "#pragma unroll 8\n      for ({idx} r = ({idx})wl * {v}; r < R; r += 32 * {v}) {{"
    );
    row_vector(s, sig);
    let _ = writeln!(
        s,
        "#pragma unroll\n          for (int l = 0; l < {v}; l++) {{ const {pr_t} v = {}; {} }}\n      }}",
        cast(&from_storage(sig.input, "u.e[l]"), sig.input, pr, false),
        update(prologue.op, pr, "v", "0")
    );
    warp_reduce(s, "      ", prologue.op, pr);
    let _ = writeln!(
        s,
        "      if (wl == 0) sh_p[warp] = acc;\n      __syncwarp();\n      acc = sh_p[warp];"
    );
    write_prologue(s, prologue, ("acc", "wl == 0"), "")
}

/// The main reduction: each element's term (the map over the staged row and the further
/// inputs) converted and added in the eager lanes' order; reads the prologue's value from the register.
fn terms(s: &mut String, sig: &ReduceSig, m: &ReduceMap, res: Option<usize>) -> Result<()> {
    let v = sig.vector;
    let r = repr(sig.op, sig.acc);
    // (Its values of one a row computed once, before the row: `s / n` of `(x − s/n)²`.)
    let mut next = 0;
    let declared = |k: usize| Some(k) == res;
    let expr = super::row_values::hoisted(s, &m.expr, m, &declared, ("      ", &mut next))?;
    let read = |k: usize| k > 0 && Some(k) != res && expr.reads_input(k);
    let mut body = |s: &mut String| -> Result<()> {
        row_vector(s, sig);
        load_row_inputs(s, "          ", m, v, read, "");
        let _ = writeln!(
            s,
            "#pragma unroll\n          for (int l = 0; l < {v}; l++) {{"
        );
        declare_inputs(s, "            ", m, ("u.e[l]", true), read);
        let name = crate::render::expr::emit_tree(&expr, s, "            ", &mut next)?;
        let _ = writeln!(
            s,
            "            const {} v = {}; {} }}",
            compute_type(r),
            contribution(sig, &name, m.expr.dtype),
            update(sig.op, r, "v", "(i64)(r + l)")
        );
        Ok(())
    };
    ranges(s, sig, (sig.op, r), &mut body)
}

#[cfg(test)]
mod tests {
    use super::super::{StagedEpilogue, StagedPrologue};
    use super::*;
    use strata_core::ir::{BinaryOp, Expr, ReduceOp, UnaryOp};
    use strata_core::DType;

    fn x(k: usize) -> Expr {
        Expr::input(k, DType::F32)
    }

    /// A layer norm over a warp's rows (`staged`'s tests' fixture).
    fn layer_norm() -> ReduceSig {
        super::super::staged::tests::layer_norm(32)
    }

    #[test]
    fn each_warp_stages_its_own_row_once_and_adds_in_its_eager_lanes() {
        let sig = layer_norm();
        assert!(sig.staged_by_warps());
        let src = source(&sig).unwrap();
        // Its own slice of the stage and of the partials; its own rows.
        assert!(
            src.contains("uint4* rowbuf = stage + (i32)warp * (R / 4);"),
            "{src}"
        );
        assert!(src.contains("float* sh_part = parts[warp];"), "{src}");
        assert!(src.contains("o = (i32)blockIdx.x * W + warp; o < O; o += (i32)gridDim.x * W"));
        // The row read from memory once, all of it in flight, then the mean, the variance's
        // terms and the epilogue read the stage, the sums in the eager warp's lanes.
        let stage = "stage_async(&rowbuf[r / 4], (const uint4*)(in0 + ib + r));";
        assert_eq!(src.matches("in0 + ib").count(), 1, "{src}");
        assert!(
            src.contains(stage) && src.contains("stage_wait();"),
            "{src}"
        );
        let lanes = "r = r0 + (i32)wl * 4; r < r1; r += 32 * 4";
        assert_eq!(src.matches(lanes).count(), 2, "{src}");
        assert_eq!(src.matches("u.v = rowbuf[r / 4];").count(), 3, "{src}");
        assert!(src.contains("r = (i32)wl * 4; r < R; r += 32 * 4"), "{src}");
        // The mean as stored, from every lane's fold of the ranges; lane 0 writes the results.
        assert!(src.contains("pcomb = sh_part[0];"), "{src}");
        assert!(
            src.contains("if (wl == 0) prologue_out[ob] = stored;"),
            "{src}"
        );
        assert!(src.contains("if (wl == 0) out[ob] = result;"), "{src}");
        assert!(src.contains("const float x1 = stored;"), "{src}");
        // The weight and bias at the row's positions; no block-wide barrier anywhere.
        assert!(src.contains("u3.v = *(const uint4*)(in3 + r);"), "{src}");
        assert!(
            !src.contains("__syncthreads") && !src.contains("sh_v["),
            "{src}"
        );
        assert!(src.contains("__launch_bounds__(256, 3)"), "{src}");
        // `s / n` and `rsqrt(v)` once a row, before the loops over the row.
        let epilogue = src
            .find("r = (i32)wl * 4; r < R; r += 32 * 4) {\n")
            .expect(&src);
        let variance = src.rfind("r = r0 + (i32)wl * 4").expect(&src);
        assert_eq!(src.matches("sqrtf").count(), 1, "{src}");
        assert!(src.find("sqrtf").is_some_and(|at| at < epilogue), "{src}");
        let variance_loop =
            &src[variance..variance + src[variance..].find("shfl_down").expect(&src)];
        assert!(
            !variance_loop.contains(" / v") && !src[epilogue..].contains(" / v"),
            "{src}"
        );
    }

    #[test]
    fn softmax_from_its_primitives_folds_the_maximum_in_each_lane_then_the_warp() {
        // `exp(x − max) / Σ exp(x − max)`: the epilogue computes the term again from the row.
        let mut sig = layer_norm();
        let term = Expr::unary(UnaryOp::Exp, Expr::binary(BinaryOp::Sub, x(0), x(1)));
        sig.map = Some(ReduceMap {
            expr: term.clone(),
            inputs: vec![DType::F32; 3],
            per_output: vec![false, true, true],
            per_position: vec![false; 3],
            scalars: vec![],
        });
        sig.prologue = Some(StagedPrologue {
            op: ReduceOp::Max,
            result: 1,
            out: DType::F32,
        });
        sig.epilogue = Some(StagedEpilogue {
            expr: Expr::binary(BinaryOp::Div, term, x(2)),
            result: 2,
            out: DType::F32,
        });
        let src = source(&sig).unwrap();
        assert!(src.contains("r = (i32)wl * 4; r < R; r += 32 * 4"), "{src}");
        assert!(src.contains("if (wl == 0) sh_p[warp] = acc;"), "{src}");
        assert!(src.contains("acc = sh_p[warp];"), "{src}");
        assert_eq!(src.matches("in0 + ib").count(), 1, "{src}");
        assert!(!src.contains("t.v = rowbuf"), "{src}");
        assert!(!src.contains("in1[") && !src.contains("in2["), "{src}");
        assert_eq!(
            src.matches("__expf").count() + src.matches("expf(").count(),
            2
        );
    }

    #[test]
    fn an_epilogue_alone_stages_the_row_and_reads_further_rows_as_vectors() {
        // Softmax's backward: Σ y·g, then y·(g − Σ y·g); y input 0, g input 1, the sum input 2.
        let mut sig = layer_norm();
        sig.prologue = None;
        sig.map = Some(ReduceMap {
            expr: Expr::binary(BinaryOp::Mul, x(0), x(1)),
            inputs: vec![DType::F32; 3],
            per_output: vec![false, false, true],
            per_position: vec![false; 3],
            scalars: vec![],
        });
        sig.epilogue = Some(StagedEpilogue {
            expr: Expr::binary(BinaryOp::Mul, x(0), Expr::binary(BinaryOp::Sub, x(1), x(2))),
            result: 2,
            out: DType::F32,
        });
        let src = source(&sig).unwrap();
        assert!(
            !src.contains("prologue_out") && !src.contains("sh_p["),
            "{src}"
        );
        assert_eq!(src.matches("in0 + ib").count(), 1, "{src}");
        let g = "u1.v = *(const uint4*)(in1 + ib + r);";
        assert_eq!(src.matches(g).count(), 2, "{src}");
        assert!(src.contains("const float x2 = result;"), "{src}");
        // The epilogue's pointer right after the eager words.
        let w = Words::of(&sig);
        let at = format!("epilogue_out = (float*)p.w[{}];", w.total);
        assert!(src.contains(&at), "{src}");
        assert!(src.contains(&format!("Args<{}>", w.total + 1)), "{src}");
    }

    #[test]
    fn a_block_holds_as_many_rows_as_its_stage_takes() {
        assert_eq!(warps(4096 * 4, 64 << 10), 4);
        assert_eq!(warps(64 * 4, 64 << 10), MAX_WARPS);
        assert_eq!(warps(8191 * 4, 64 << 10), 2);
        assert_eq!(warps(1 << 20, 64 << 10), 1);
        let mut block = layer_norm();
        block.group = 256;
        assert!(!block.staged_by_warps() && source(&block).is_err());
    }
}
