//! `Softmax` kernels: a group of 1, 32, 256, 512 or 1,024 threads per row (core's
//! [`softmax_plan`](strata_core::lower::softmax_plan)) finds the row's maximum, sums its terms
//! and writes the output, reading the row from memory once. With up to 256 threads a row of up
//! to [`MAX_CACHED`] vectors per thread is loaded into registers and the three passes read it
//! there. A longer row of whole vectors, up to the device's [`row_stage_bytes`], is copied by a
//! block of [`STAGE_GROUP`] threads into dynamic shared memory in the first pass, three rows
//! to a multiprocessor: a [16384, 16384] f32 softmax on an H100 then takes a copy's time (0.72
//! ms). Any other long row gets a block of 1,024 threads that reads it in each pass, two
//! blocks per multiprocessor, so the rows in flight stay in L2 between passes (0.90 ms for the
//! same softmax; registers for 1,024 threads, or shared memory for two rows a multiprocessor,
//! measured no faster). The terms and the output are core's expressions, emitted like a map's.

use super::expr::emit_tree;
use super::{
    cast, compute_type, decode_offsets, from_storage, index_type, storage_type, to_storage,
    vector_type,
};
use super::{Generated, Rendered};
use std::fmt::Write;
use strata_core::lower::softmax_plan::{
    log_of_sum, log_softmax_from_log_sum, softmax_from_term, softmax_output, softmax_term,
};
use strata_core::{DType, Result};

/// The structure of a softmax launch.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct SoftmaxSig {
    pub dtype: DType,
    pub log: bool,
    /// Leading axes decoded per row.
    pub outer_rank: usize,
    /// Threads per row: 1, 32, 256 or 1024 (a block per row, never cached).
    pub group: usize,
    /// Elements per vector load and store (1: none; then the row stride is a word).
    pub vector: usize,
    pub wide: bool,
    /// Vectors each thread keeps in registers (a power of two, the row's share rounded up);
    /// 0: the row is read from memory in each pass.
    pub cached: usize,
    /// The row is kept in dynamic shared memory (a block of [`STAGE_GROUP`] threads, vectors).
    pub staged: bool,
}

/// The most vectors per thread a row is kept in registers for (16 × 16 bytes: 64 words).
pub(crate) const MAX_CACHED: usize = 16;

/// Threads that share a row kept in shared memory: three such blocks fill a multiprocessor
/// where three rows fit (1,536 threads, at most 42 registers each).
pub(crate) const STAGE_GROUP: usize = 512;

/// Blocks of a staged row resident per multiprocessor, the launch bound that keeps their
/// registers within the multiprocessor's.
const STAGE_BLOCKS: usize = 3;

/// The longest row kept in shared memory on a device with `per_sm` bytes of it per
/// multiprocessor and `per_block` per block: three rows to a multiprocessor (fewer rows in
/// flight measured slower than the cached three-pass path), at most 64 KiB (the longest
/// measured). A [16384, 16384] f32 softmax on an H100: 0.72 ms (a copy's time) against 0.90.
pub(crate) fn row_stage_bytes(per_sm: usize, per_block: usize) -> usize {
    // Each block also takes its static shared memory, and the driver reserves 1 KiB.
    let room = (per_sm / STAGE_BLOCKS).min(per_block).saturating_sub(2048);
    room.min(64 << 10) / 16 * 16
}

impl strata_core::kernel_cache::Owned for SoftmaxSig {}

impl Generated for SoftmaxSig {
    const NAME: &'static str = "strata_softmax";
    fn render(&self) -> Result<Rendered> {
        source(self).map(Rendered::single)
    }
}

/// The CUDA C source of a softmax kernel named `strata_softmax`.
pub(crate) fn source(sig: &SoftmaxSig) -> Result<String> {
    let (d, g, v, ro) = (sig.dtype, sig.group, sig.vector, sig.outer_rank);
    let idx = index_type(sig.wide);
    let acc = d.accumulator();
    let (ct, acc_t, st) = (compute_type(d), compute_type(acc), storage_type(d));
    // Words: rows, n, outer shape, in ptr, in outer strides, in stride, out ptr, out outer
    // strides, out stride.
    let in_ptr = 2 + ro;
    let out_ptr = in_ptr + ro + 2;
    let total = out_ptr + ro + 2;
    let mut s = String::new();
    // Two blocks of 1,024 per multiprocessor (registers capped at 32 a thread), or three
    // blocks of a staged row.
    let bounds = if sig.staged {
        format!("__launch_bounds__({g}, {STAGE_BLOCKS}) ")
    } else if g > 256 {
        format!("__launch_bounds__({g}, {}) ", 2048 / g)
    } else {
        String::new()
    };
    let _ = writeln!(
        s,
        "extern \"C\" __global__ void {bounds}strata_softmax(const Args<{total}> p) {{"
    );
    let _ = writeln!(s, "  const {idx} rows = ({idx})p.w[0], n = ({idx})p.w[1];");
    let _ = writeln!(s, "  const {st}* in = (const {st}*)p.w[{in_ptr}];");
    let _ = writeln!(s, "  {st}* out = ({st}*)p.w[{out_ptr}];");
    let _ = writeln!(
        s,
        "  const {idx} ins = ({idx})(i64)p.w[{}], outs = ({idx})(i64)p.w[{}];",
        in_ptr + ro + 1,
        out_ptr + ro + 1
    );
    let _ = writeln!(s, "  const int lane = threadIdx.x % {g};");
    let k = sig.cached;
    let vt = vector_type(v * d.itemsize());
    if k > 0 {
        let _ = writeln!(s, "  union {{ {vt} v; {st} e[{v}]; }} u[{k}];");
    }
    if sig.staged {
        let _ = writeln!(s, "  extern __shared__ {vt} rowbuf[];");
    }
    // A kept row (registers or shared memory) keeps its terms for the output (softmax: one
    // exp per element).
    let keep_terms = (k > 0 || sig.staged) && !sig.log;
    let warps = g / 32;
    if warps > 1 {
        let _ = writeln!(s, "  __shared__ {acc_t} sh[{warps}];");
    }
    let _ = writeln!(
        s,
        "  const {idx} groups = (({idx})gridDim.x * blockDim.x) / {g};"
    );
    let _ = writeln!(
        s,
        "  for ({idx} row = (({idx})blockIdx.x * blockDim.x + threadIdx.x) / {g}; row < rows; row += groups) {{"
    );
    // The row's start in the input (off0) and the output (off1).
    let shape_words: Vec<usize> = (2..2 + ro).collect();
    decode_offsets(
        &mut s,
        idx,
        "row",
        &shape_words,
        &[Some(in_ptr + 1), Some(out_ptr + 1)],
    );
    // The lanes of vector union `u` (whose load is written): `body` sees each element as
    // `x0`; with `store`, its `y` goes back into the lane.
    let lanes = |s: &mut String, u: &str, body: &str, store: bool| {
        let _ = writeln!(s, "#pragma unroll\n      for (int l = 0; l < {v}; l++) {{");
        let _ = writeln!(
            s,
            "        const {ct} x0 = {};",
            from_storage(d, &format!("{u}.e[l]"))
        );
        let _ = writeln!(s, "{body}");
        if store {
            let _ = writeln!(s, "        {u}.e[l] = {};", to_storage(d, "y"));
        }
        let _ = writeln!(s, "      }}");
    };
    // Visits the row: `body` sees the element as `x0` (a compute value) and, in the output
    // pass (`store`), sets `y`. `load`: this pass reads memory (always, unless cached).
    let visit = |s: &mut String, body: &str, load: bool, store: bool| {
        if k > 0 {
            // The thread's vectors at r = (j·group + lane)·vector, kept in u[j].
            let _ = writeln!(s, "#pragma unroll\n    for (int j = 0; j < {k}; j++) {{");
            let _ = writeln!(s, "      const {idx} r = (({idx})j * {g} + lane) * {v};");
            let _ = writeln!(s, "      if (r < n) {{");
            if load && v > 1 {
                let _ = writeln!(s, "        u[j].v = *(const {vt}*)(in + off0 + r);");
            } else if load {
                let _ = writeln!(s, "        u[j].e[0] = in[off0 + r * ins];");
            }
            lanes(s, "u[j]", body, store);
            if store && v > 1 {
                let _ = writeln!(s, "        *({vt}*)(out + off1 + r) = u[j].v;");
            } else if store {
                let _ = writeln!(s, "        out[off1 + r * outs] = u[j].e[0];");
            }
            let _ = writeln!(s, "      }}\n    }}");
        } else if sig.staged {
            // The row in shared memory: the first pass copies it there, the others read it
            // (each thread its own vectors, so no barrier between them). Unrolled: the first
            // pass's loads are in flight together.
            let _ = writeln!(
                s,
                "#pragma unroll 8\n    for ({idx} r = lane * {v}; r < n; r += {g} * {v}) {{"
            );
            let _ = writeln!(s, "      union {{ {vt} v; {st} e[{v}]; }} u;");
            if load {
                let _ = writeln!(
                    s,
                    "      u.v = *(const {vt}*)(in + off0 + r); rowbuf[r / {v}] = u.v;"
                );
            } else {
                let _ = writeln!(s, "      u.v = rowbuf[r / {v}];");
            }
            lanes(s, "u", body, store);
            if !load && !store && keep_terms {
                let _ = writeln!(s, "      rowbuf[r / {v}] = u.v;");
            }
            if store {
                let _ = writeln!(s, "      *({vt}*)(out + off1 + r) = u.v;");
            }
            let _ = writeln!(s, "    }}");
        } else if v > 1 {
            let _ = writeln!(
                s,
                "    for ({idx} r = lane * {v}; r < n; r += {g} * {v}) {{"
            );
            let _ = writeln!(
                s,
                "      union {{ {vt} v; {st} e[{v}]; }} u; u.v = *(const {vt}*)(in + off0 + r);"
            );
            lanes(s, "u", body, store);
            if store {
                let _ = writeln!(s, "      *({vt}*)(out + off1 + r) = u.v;");
            }
            let _ = writeln!(s, "    }}");
        } else {
            let _ = writeln!(s, "    for ({idx} r = lane; r < n; r += {g}) {{");
            let _ = writeln!(
                s,
                "      const {ct} x0 = {};",
                from_storage(d, "in[off0 + r * ins]")
            );
            let _ = writeln!(s, "{body}");
            if store {
                let _ = writeln!(s, "      out[off1 + r * outs] = {};", to_storage(d, "y"));
            }
            let _ = writeln!(s, "    }}");
        }
    };
    // Combines every thread's `name` over the group with `op(a, b)`; every thread ends with
    // the same value (a butterfly in the warp, then the warps' values in one order).
    let combine = |s: &mut String, name: &str, ty: &str, op: &dyn Fn(&str, &str) -> String| {
        if g >= 32 {
            let _ = writeln!(
                s,
                "    for (int d = 16; d > 0; d >>= 1) {{ const {ty} o = __shfl_xor_sync(0xffffffffu, {name}, d); {} }}",
                op(name, "o")
            );
        }
        if warps > 1 {
            let _ = writeln!(
                s,
                "    if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = {name};\n    __syncthreads();"
            );
            let _ = writeln!(
                s,
                "    {name} = sh[0];\n    for (int w = 1; w < {warps}; w++) {{ const {ty} o = sh[w]; {} }}\n    __syncthreads();",
                op(name, "o")
            );
        }
    };
    // Pass 1: the maximum, by the reduction's rule (NaN wins, +0 above -0).
    let max = |m: &str, o: &str| {
        format!("if ({o} != {o} || {o} > {m} || ({o} == {m} && !signbit({o}) && signbit({m}))) {m} = {o};")
    };
    let inf = if d == DType::F64 {
        "__longlong_as_double(0x7ff0000000000000ll)"
    } else {
        "__int_as_float(0x7f800000)"
    };
    let _ = writeln!(s, "    {ct} m = -{inf};");
    visit(&mut s, &format!("      {}", max("m", "x0")), true, false);
    combine(&mut s, "m", ct, &max);
    // Pass 2: the sum of the terms, each rounded to the dtype, in the accumulator.
    let _ = writeln!(s, "    const {ct} x1 = m;\n    {acc_t} sum = 0;");
    let mut next = 0;
    let mut term = String::new();
    let t = emit_tree(&softmax_term(d), &mut term, "      ", &mut next)?;
    let _ = write!(term, "      sum += {};", cast(&t, d, acc, false));
    if keep_terms {
        let u = if k > 0 { "u[j]" } else { "u" };
        let _ = write!(term, "\n          {u}.e[l] = {};", to_storage(d, &t));
    }
    let reread = k == 0 && !sig.staged;
    visit(&mut s, &term, reread, false);
    combine(&mut s, "sum", acc_t, &|a, b| format!("{a} = {a} + {b};"));
    // Pass 3: the output over the element, the maximum and the sum rounded to the dtype.
    let _ = writeln!(s, "    const {ct} x2 = {};", cast("sum", acc, d, false));
    let mut body = String::new();
    let output = if keep_terms {
        softmax_from_term(d)
    } else if sig.log {
        // log(s) once a row (`x3`), then `(x - m) - x3` an element.
        let l = emit_tree(&log_of_sum(d), &mut s, "    ", &mut next)?;
        let _ = writeln!(s, "    const {ct} x3 = {l};");
        log_softmax_from_log_sum(d)
    } else {
        softmax_output(d, false)
    };
    let y = emit_tree(&output, &mut body, "      ", &mut next)?;
    let _ = write!(body, "      const {ct} y = {y};");
    visit(&mut s, &body, reread, true);
    let _ = writeln!(s, "  }}\n}}");
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sig(dtype: DType, group: usize, vector: usize) -> SoftmaxSig {
        SoftmaxSig {
            dtype,
            log: false,
            outer_rank: 1,
            group,
            vector,
            wide: false,
            cached: 0,
            staged: false,
        }
    }

    #[test]
    fn a_block_per_row_combines_through_shared_memory_and_stores_vectors() {
        let src = source(&sig(DType::F32, 256, 4)).unwrap();
        assert!(src.contains("__shared__ float sh[8];"), "{src}");
        assert!(src.contains("*(uint4*)(out + off1 + r) = u.v;"), "{src}");
        assert!(src.contains("__shfl_xor_sync"), "{src}");
    }

    #[test]
    fn a_cached_row_is_read_once_and_kept_in_registers() {
        let mut s = sig(DType::F32, 256, 4);
        s.cached = 16;
        let src = source(&s).unwrap();
        assert_eq!(
            src.matches("*(const uint4*)(in + off0 + r)").count(),
            1,
            "{src}"
        );
        assert!(src.contains("} u[16];"), "{src}");
        // The terms stay in the registers: one exp per element.
        assert_eq!(src.matches("exp").count(), 1, "{src}");
        assert!(src.contains("__shared__ float sh[8];"), "{src}");
        let long = source(&SoftmaxSig {
            group: 1024,
            cached: 0,
            ..s.clone()
        })
        .unwrap();
        assert!(long.contains("__launch_bounds__(1024, 2)"), "{long}");
        assert!(long.contains("__shared__ float sh[32];"), "{long}");
        assert_eq!(long.matches("*(const uint4*)(in + off0 + r)").count(), 3);
        s.vector = 1;
        let src = source(&s).unwrap();
        assert_eq!(src.matches("in[off0 + r * ins]").count(), 1, "{src}");
    }

    #[test]
    fn a_staged_row_is_read_once_into_shared_memory() {
        let mut s = sig(DType::F32, STAGE_GROUP, 4);
        s.staged = true;
        let src = source(&s).unwrap();
        assert!(src.contains("extern __shared__ uint4 rowbuf[];"), "{src}");
        assert!(src.contains("__launch_bounds__(512, 3)"), "{src}");
        assert_eq!(src.matches("*(const uint4*)(in + off0 + r)").count(), 1);
        // Softmax writes its terms back (one exp per element); log-softmax does not.
        assert_eq!(src.matches("exp").count(), 1, "{src}");
        assert_eq!(src.matches("rowbuf[r / 4] = u.v;").count(), 2, "{src}");
        s.log = true;
        let src = source(&s).unwrap();
        assert_eq!(src.matches("rowbuf[r / 4] = u.v;").count(), 1, "{src}");
        // Its log(s) once a row.
        assert_eq!(src.matches("const float x3 = ").count(), 1, "{src}");
    }

    #[test]
    fn rows_are_staged_where_three_fit_a_multiprocessor() {
        // H100 / H200: 228 KiB a multiprocessor, 227 KiB a block; A100: 164 / 163; Turing: 64.
        assert_eq!(row_stage_bytes(228 << 10, 227 << 10), 64 << 10);
        assert_eq!(row_stage_bytes(164 << 10, 163 << 10), 53920);
        assert_eq!(row_stage_bytes(64 << 10, 64 << 10), 19792);
        assert_eq!(row_stage_bytes(0, 0), 0);
    }

    #[test]
    fn half_terms_are_rounded_before_they_are_summed_in_f32() {
        let src = source(&sig(DType::F16, 32, 1)).unwrap();
        assert!(src.contains("float sum = 0;"), "{src}");
        assert!(src.contains("round_f16("), "{src}");
        assert!(!src.contains("__shared__"), "{src}");
    }
}
