//! Signature → CUDA C, and nothing else: no driver, no buffers, no compiler. Each kernel kind
//! has a file holding its signature (what the source depends on), its argument layout and its
//! renderer; this one holds what they share: the C types of each dtype, strata's cast rule in
//! C, the [`Generated`] trait of signatures, and the argument-block ABI.
//!
//! Every generated kernel takes one argument, `Args<N>`: 64-bit words holding sizes, strides,
//! pointers and scalar bits, in an order that the planner in `crate::run` packs and the
//! renderer reads. Nothing size-dependent is in the source, so one compiled kernel serves every
//! shape with the same structure.

#[cfg(test)]
mod catalog;
pub(crate) mod conv;
pub(crate) mod expr;
pub(crate) mod histogram;
pub(crate) mod index;
pub(crate) mod interpreter;
pub(crate) mod layer_norm;
pub(crate) mod map;
pub(crate) mod matmul;
pub(crate) mod moments;
pub(crate) mod reduce;
pub(crate) mod softmax;

use strata_core::kernel_cache::Signature;
use strata_core::{DType, Error, Result};

/// A generated kernel's signature (what its source depends on), which renders its program:
/// every signature of this module.
pub(crate) trait Generated: Signature {
    /// The kernel's entry point in its source.
    const NAME: &'static str;
    /// Its CUDA C (the prelude is added when it is compiled).
    fn render(&self) -> Result<Rendered>;
    /// How much NVRTC optimizes it ([`Optimization`]'s docs say which kernels compile fast).
    fn optimization(&self) -> Optimization {
        Optimization::Full
    }
}

/// A rendered kernel: its program, and, for a kernel that has one, its batched form
/// (`<name>_batch`, which runs many small launches in one block, see `run::batch`) as a
/// program of its own, compiled only when a launch first needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Rendered {
    /// The kernel's program.
    pub source: String,
    /// The batched form's program, when it has one.
    pub batched: Option<String>,
}

impl Rendered {
    /// A program without a batched form.
    pub(crate) fn single(source: String) -> Rendered {
        Rendered {
            source,
            batched: None,
        }
    }
}

/// How much NVRTC optimizes a kernel.
///
/// Most of a new kernel's first call is NVRTC's optimizer and assembler, and a fused map's
/// tree is emitted once per vector lane and once for the tail. Compiled with
/// `--Ofast-compile=min`, maps run as fast as fully optimized ones (measured on an H100:
/// copy, add, casts, `where`, exp, tanh, fused chains, GELU, softmax's maps) and a new fused
/// kernel's first call takes a third less; reductions, softmax, index and matmul kernels
/// (unrolled loops), tiled maps and maps with random draws or `erf` stay fully optimized
/// (`MapSig`'s [`Generated::optimization`]). `STRATA_CUDA_FAST_COMPILE=0` optimizes maps fully
/// too (`mid`, `max`: those levels, which compile faster still but ran copies 3× slower).
/// `min` changes no value (rounding is decided by `--fmad=false`, which all use); `max` did:
/// `relu` of a NaN came out another NaN (H200, NVRTC 13).
///
/// A `Full` kernel the disk cache does not hold is first compiled [`Optimization::Quick`]
/// and runs so while its own level compiles on a background thread (`function::Function::load`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Optimization {
    /// NVRTC's defaults (`-O3`).
    Full,
    /// `--Ofast-compile` at the compiler's level.
    FastCompile,
    /// `--Ofast-compile=min` whatever the maps' level: a [`Optimization::Full`] kernel's
    /// first launches, until its own compile is done (`STRATA_CUDA_QUICK_COMPILE=0`: none).
    Quick,
}

impl Optimization {
    /// Its name in a recorded kernel's first line (`crate::shipped`).
    pub(crate) fn label(self) -> &'static str {
        match self {
            Optimization::Full => "full",
            Optimization::FastCompile => "fast-compile",
            Optimization::Quick => "quick",
        }
    }

    /// The optimization [`Optimization::label`] names.
    pub(crate) fn from_label(label: &str) -> Option<Optimization> {
        [Self::Full, Self::FastCompile, Self::Quick]
            .into_iter()
            .find(|o| o.label() == label)
    }
}

/// CUDA's limit on a launch's argument bytes.
pub(crate) const MAX_ARGUMENT_BYTES: usize = 4096;

/// How many launches of a kernel taking `words` argument words fit one batched launch
/// (`Batch<N, CAP>`: a count word, then CAP times N words, within the argument limit).
pub(crate) fn batch_capacity(words: usize) -> usize {
    (MAX_ARGUMENT_BYTES / 8 - 1) / words.max(1)
}

/// The device helpers every kernel includes.
pub(crate) const PRELUDE: &str = include_str!("prelude.cu");

/// The C type a dtype is stored as in device memory.
pub(crate) fn storage_type(d: DType) -> &'static str {
    match d {
        DType::Bool | DType::U8 => "u8",
        DType::U16 | DType::F16 | DType::BF16 => "u16",
        DType::U32 => "u32",
        DType::U64 => "u64",
        DType::I8 => "i8",
        DType::I16 => "i16",
        DType::I32 => "i32",
        DType::I64 => "i64",
        DType::F32 => "float",
        DType::F64 => "double",
    }
}

/// The C type values of a dtype are computed in: 16-bit floats in f32, bool as `bool`.
pub(crate) fn compute_type(d: DType) -> &'static str {
    match d {
        DType::Bool => "bool",
        DType::F16 | DType::BF16 | DType::F32 => "float",
        other => storage_type(other),
    }
}

/// A stored element `s` (of `storage_type(d)`) as a compute value.
pub(crate) fn from_storage(d: DType, s: &str) -> String {
    match d {
        DType::Bool => format!("({s} != 0)"),
        DType::F16 => format!("f16_to_f32({s})"),
        DType::BF16 => format!("bf16_to_f32({s})"),
        _ => s.to_string(),
    }
}

/// A compute value `v` of dtype `d` as its stored form.
pub(crate) fn to_storage(d: DType, v: &str) -> String {
    match d {
        DType::Bool => format!("(u8)({v} ? 1 : 0)"),
        DType::F16 => format!("f32_to_f16({v})"),
        DType::BF16 => format!("f32_to_bf16({v})"),
        _ => v.to_string(),
    }
}

/// The compute value of a scalar stored as little-endian bits in the 64-bit word `w`.
pub(crate) fn scalar_from_word(d: DType, w: &str) -> String {
    match d {
        DType::Bool => format!("({w} != 0)"),
        DType::F16 => format!("f16_to_f32((u16){w})"),
        DType::BF16 => format!("bf16_to_f32((u16){w})"),
        DType::F32 => format!("__uint_as_float((u32){w})"),
        DType::F64 => format!("__longlong_as_double((i64){w})"),
        other => format!("({})({w})", storage_type(other)),
    }
}

/// Rounds a float compute value to its dtype (a no-op for f32 and f64).
pub(crate) fn round_to(d: DType, v: String) -> String {
    match d {
        DType::F16 => format!("round_f16({v})"),
        DType::BF16 => format!("round_bf16({v})"),
        _ => v,
    }
}

/// strata's cast rule (`Scalar::cast`) from a compute value `v` of `from` to a compute value
/// of `to`: to bool is `!= 0`; float → int saturates (NaN → 0); int → int wraps or, when
/// `saturate`, clamps; conversions to floats round to nearest once (ints through f64, as core).
pub(crate) fn cast(v: &str, from: DType, to: DType, saturate: bool) -> String {
    if from == to {
        return v.to_string();
    }
    let ct = compute_type(to);
    if to == DType::Bool {
        return format!("({v} != 0)");
    }
    if from == DType::Bool {
        return format!("(({ct})({v} ? 1 : 0))");
    }
    match (from.is_float(), to.is_float()) {
        (true, false) => format!("f2i<{ct}>((double)({v}))"),
        (false, false) if saturate => format!("sat_cast<{ct}, {}>({v})", compute_type(from)),
        (false, false) => format!("(({ct})({v}))"),
        (_, true) => {
            // Floats of f32 or narrower are exact in f32; ints and f64 convert from f64.
            let wide = from == DType::F64 || !from.is_float();
            let d = format!("(double)({v})");
            match to {
                DType::F64 => d,
                DType::F32 if wide => format!("(float)({v})"),
                DType::F32 => v.to_string(),
                DType::F16 if wide => format!("f16_to_f32(f64_to_f16({d}))"),
                DType::F16 => format!("round_f16({v})"),
                DType::BF16 if wide => format!("bf16_to_f32(f64_to_bf16({d}))"),
                _ => format!("round_bf16({v})"),
            }
        }
    }
}

/// The compute value of `to` whose stored bits are those of compute value `v` of `from`, a
/// dtype of the same size (a 16-bit float's value is exact in its format, so its bits are
/// its stored form).
pub(crate) fn bitcast(v: &str, from: DType, to: DType) -> String {
    let bits = match from {
        DType::F16 | DType::BF16 => to_storage(from, v),
        DType::F32 => format!("__float_as_uint({v})"),
        DType::F64 => format!("__double_as_longlong({v})"),
        _ => v.to_string(),
    };
    scalar_from_word(to, &format!("(u64)({bits})"))
}

/// The error for an IR op the dtype does not define (the CPU backend's message).
pub(crate) fn undefined(what: impl std::fmt::Debug, dtype: DType) -> Error {
    Error::Unsupported(format!("IR op {what:?} is not defined for {dtype}"))
}

/// The C vector type moving `bytes` bytes at once.
pub(crate) fn vector_type(bytes: usize) -> &'static str {
    match bytes {
        32 => "uint4x2",
        16 => "uint4",
        8 => "uint2",
        4 => "u32",
        2 => "u16",
        _ => "u8",
    }
}

/// The integer index type of a kernel: 32-bit when every offset fits, else 64-bit.
pub(crate) fn index_type(wide: bool) -> &'static str {
    if wide {
        "i64"
    } else {
        "i32"
    }
}

/// Appends code that decodes linear index `lin` over `shape_words` (the words holding the
/// sizes, outermost first) into per-operand offsets `off{k}`, for each operand `k` whose
/// stride words begin at `strides[k]` (`None`: the operand is contiguous, offset = `lin`).
pub(crate) fn decode_offsets(
    src: &mut String,
    idx: &str,
    lin: &str,
    shape_words: &[usize],
    strides: &[Option<usize>],
) {
    use std::fmt::Write;
    for (k, s) in strides.iter().enumerate() {
        match s {
            None => {
                let _ = writeln!(src, "      const {idx} off{k} = {lin};");
            }
            Some(_) => {
                let _ = writeln!(src, "      {idx} off{k} = 0;");
            }
        }
    }
    if strides.iter().all(Option::is_none) {
        return;
    }
    let _ = writeln!(src, "      {idx} rem = {lin};");
    let rank = shape_words.len();
    for d in (0..rank).rev() {
        let coord = if d == 0 {
            "rem".to_string()
        } else {
            let _ = writeln!(
                src,
                "      const {idx} c{d} = rem % ({idx})p.w[{}]; rem /= ({idx})p.w[{}];",
                shape_words[d], shape_words[d]
            );
            format!("c{d}")
        };
        for (k, s) in strides.iter().enumerate() {
            if let Some(first) = s {
                let _ = writeln!(
                    src,
                    "      off{k} += {coord} * ({idx})(i64)p.w[{}];",
                    first + d
                );
            }
        }
    }
}
