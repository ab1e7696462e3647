//! IR → WGSL. Each kernel kind has a file; this one holds what they share: how each dtype is
//! stored in a storage buffer and computed in WGSL, loads and stores, and strata's cast rule.
//!
//! Storage: 32-bit dtypes live in `array<u32>` and are bitcast; 64-bit ones in `array<u64>`,
//! `array<i64>` or `array<f64>`; the 8- and 16-bit dtypes (bool, u8, i8, u16, i16, f16, bf16)
//! are packed into `array<u32>` words. A kernel that writes a packed dtype element by element
//! declares its output `array<atomic<u32>>` and changes only its own bits (`atomicAnd` then
//! `atomicOr`), so neighbouring invocations never race on a shared word.
//!
//! Compute types: bool as `bool`; u8/u16/u32 as `u32` and i8/i16/i32 as `i32`, kept in the
//! dtype's range after every operation; f16, bf16 and f32 as `f32`, rounded to the node's dtype
//! after every node (the rounding is integer code, so it is exact on every driver).
//!
//! Every kernel reads its sizes, strides, offsets and scalars from `params`, an `array<u32>`
//! bound at a dynamic offset; nothing size-dependent is in the source.

#[cfg(test)]
mod catalog;
pub(crate) mod conv;
pub(crate) mod coop_matmul;
pub(crate) mod expr;
pub(crate) mod histogram;
pub(crate) mod index;
pub(crate) mod layer_norm;
pub(crate) mod map;
pub(crate) mod matmul;
pub(crate) mod moments;
pub(crate) mod prelude;
pub(crate) mod reduce;
pub(crate) mod softmax;
pub(crate) mod staged;

use strata_core::{DType, Error};

/// What the generated code may use on this adapter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Caps {
    /// `f64` (SHADER_F64, with SHADER_INT64 for its bits).
    pub f64: bool,
    /// `i64` and `u64` (SHADER_INT64).
    pub int64: bool,
    /// f16 stored as `array<f16>` (SHADER_F16): read and written element by element, no
    /// packing and no atomics. Without it f16 is packed into `u32` words like the other
    /// 16-bit dtypes.
    pub f16: bool,
    /// `fma` rounds once (probed when the device opens: Vulkan lets a driver compute it as a
    /// rounded multiply and add, as lavapipe does). Where it does, the f32 square root is
    /// correctly rounded from an exact residual, without f64.
    pub fused_fma: bool,
    /// 16×16×16 cooperative matrices of f16 accumulating in f32, in subgroups of 32, with the
    /// workgroup memory the kernel stages in (NVIDIA's tensor cores through Vulkan): f16
    /// matmuls run on them ([`coop_matmul`]). Off unless the adapter reports all of that, and
    /// with `STRATA_WGPU_COOP=0`.
    pub coop_f16: bool,
    /// Subgroup operations in compute shaders (SUBGROUP, on Vulkan): the f32 row kernels
    /// (softmax and log-softmax: the maximum of a kept row and the sum; the staged kernel:
    /// its prologue and an f32 sum) combine through them, then across the workgroup's
    /// subgroups, instead of a tree of eight barriers.
    pub subgroups: bool,
}

/// The WGSL type a dtype's values are computed in.
pub(crate) fn compute_type(d: DType) -> &'static str {
    match d {
        DType::Bool => "bool",
        DType::U8 | DType::U16 | DType::U32 => "u32",
        DType::I8 | DType::I16 | DType::I32 => "i32",
        DType::U64 => "u64",
        DType::I64 => "i64",
        DType::F16 | DType::BF16 | DType::F32 => "f32",
        DType::F64 => "f64",
    }
}

/// The element type of the storage array holding `d` (packed dtypes share `u32` words).
pub(crate) fn array_type(d: DType, caps: Caps) -> &'static str {
    match d {
        DType::F16 if caps.f16 => "f16",
        DType::U64 => "u64",
        DType::I64 => "i64",
        DType::F64 => "f64",
        _ => "u32",
    }
}

/// Bits of a packed dtype (8 or 16), or `None` for dtypes stored whole (32- and 64-bit ones,
/// and f16 where the adapter stores it natively).
pub(crate) fn packed_bits(d: DType, caps: Caps) -> Option<u32> {
    match d.itemsize() {
        1 => Some(8),
        2 if d == DType::F16 && caps.f16 => None,
        2 => Some(16),
        _ => None,
    }
}

/// `T(v)` as a WGSL literal of compute type of `d` (integers within the dtype's range).
pub(crate) fn literal(d: DType, v: i128) -> String {
    match compute_type(d) {
        "u32" => format!("{}u", v as u32),
        "i32" if v == i32::MIN as i128 => "i32(-2147483648)".into(),
        "i32" => format!("{}i", v as i32),
        "u64" => format!("{}lu", v as u64),
        "i64" if v == i64::MIN as i128 => "(-9223372036854775807li - 1li)".into(),
        "i64" => format!("{}li", v as i64),
        "f32" => format!("{v}.0f"),
        "f64" => format!("{v}.0lf"),
        _ => format!("{}", v != 0),
    }
}

/// The smallest and largest value of an integer dtype.
pub(crate) fn int_range(d: DType) -> (i128, i128) {
    let bits = (d.itemsize() * 8) as u32;
    match d {
        DType::Bool => (0, 1),
        DType::U8 | DType::U16 | DType::U32 | DType::U64 => (0, (1i128 << bits) - 1),
        _ => (-(1i128 << (bits - 1)), (1i128 << (bits - 1)) - 1),
    }
}

/// Brings an integer compute value back into its dtype's range by wrapping (u8/u16 mask,
/// i8/i16 sign-extend); 32- and 64-bit values wrap by themselves.
pub(crate) fn wrap(d: DType, v: &str) -> String {
    match d {
        DType::U8 => format!("(({v}) & 0xffu)"),
        DType::U16 => format!("(({v}) & 0xffffu)"),
        DType::I8 => format!("(bitcast<i32>(bitcast<u32>({v}) << 24u) >> 24u)"),
        DType::I16 => format!("(bitcast<i32>(bitcast<u32>({v}) << 16u) >> 16u)"),
        _ => v.to_string(),
    }
}

/// The compute value of element `idx` (a `u32` expression) of binding `buf` holding `d`.
pub(crate) fn load(d: DType, buf: &str, idx: &str, caps: Caps) -> String {
    load_from(d, buf, idx, false, caps)
}

/// [`load`] from a binding that may be `array<atomic<u32>>` (`atomic`: packed dtypes read
/// their word with `atomicLoad`).
pub(crate) fn load_from(d: DType, buf: &str, idx: &str, atomic: bool, caps: Caps) -> String {
    let part = |bits: u32| {
        let per = 32 / bits;
        let shift = per.trailing_zeros();
        let word = if atomic {
            format!("atomicLoad(&{buf}[({idx}) >> {shift}u])")
        } else {
            format!("{buf}[({idx}) >> {shift}u]")
        };
        format!(
            "(({word} >> ((({idx}) & {}u) * {bits}u)) & {}u)",
            per - 1,
            (1u64 << bits) - 1
        )
    };
    match d {
        DType::Bool => format!("({} != 0u)", part(8)),
        DType::U8 => part(8),
        DType::U16 => part(16),
        DType::I8 => wrap(d, &format!("bitcast<i32>({})", part(8))),
        DType::I16 => wrap(d, &format!("bitcast<i32>({})", part(16))),
        DType::F16 if caps.f16 => format!("f32({buf}[{idx}])"),
        DType::F16 => format!("f16_to_f32({})", part(16)),
        DType::BF16 => format!("bitcast<f32>({} << 16u)", part(16)),
        DType::U32 => format!("{buf}[{idx}]"),
        DType::I32 | DType::F32 => format!("bitcast<{}>({buf}[{idx}])", compute_type(d)),
        DType::U64 | DType::I64 | DType::F64 => format!("{buf}[{idx}]"),
    }
}

/// The stored bits (`u32`, low bits) of a compute value of a 32-bit or narrower dtype.
pub(crate) fn bits_of(d: DType, v: &str) -> String {
    match d {
        DType::Bool => format!("select(0u, 1u, {v})"),
        DType::U8 | DType::U16 | DType::U32 => v.to_string(),
        DType::I8 => format!("(bitcast<u32>({v}) & 0xffu)"),
        DType::I16 => format!("(bitcast<u32>({v}) & 0xffffu)"),
        DType::I32 | DType::F32 => format!("bitcast<u32>({v})"),
        DType::F16 => format!("f32_to_f16({v})"),
        DType::BF16 => format!("f32_to_bf16({v})"),
        _ => unreachable!("64-bit dtypes are stored whole"),
    }
}

/// A statement storing compute value `v` of `d` at element `idx` of binding `buf`. Packed
/// dtypes go through atomics on their word (the binding is `array<atomic<u32>>`). A native
/// f16 is rounded by strata's integer code first, so the conversion to `f16` is exact (WGSL
/// leaves the rounding of an inexact conversion to the driver).
pub(crate) fn store(d: DType, buf: &str, idx: &str, v: &str, caps: Caps) -> String {
    if d == DType::F16 && caps.f16 {
        return format!("{buf}[{idx}] = f16(round_f16({v}));");
    }
    match packed_bits(d, caps) {
        Some(bits) => {
            let per = 32 / bits;
            let shift = per.trailing_zeros();
            let mask = (1u64 << bits) - 1;
            format!(
                "{{ let si = {idx}; let sh = (si & {}u) * {bits}u; \
                 atomicAnd(&{buf}[si >> {shift}u], ~({mask}u << sh)); \
                 atomicOr(&{buf}[si >> {shift}u], {} << sh); }}",
                per - 1,
                bits_of(d, v)
            )
        }
        None if d.itemsize() == 8 => format!("{buf}[{idx}] = {v};"),
        None => format!("{buf}[{idx}] = {};", bits_of(d, v)),
    }
}

/// The compute value of a scalar whose 64 bits are the `u32` words `lo` and `hi`.
pub(crate) fn scalar_value(d: DType, lo: &str, hi: &str) -> String {
    let wide = format!("((u64({hi}) << 32u) | u64({lo}))");
    match d {
        DType::Bool => format!("({lo} != 0u)"),
        DType::U8 | DType::U16 | DType::U32 => lo.to_string(),
        DType::I8 | DType::I16 => wrap(d, &format!("bitcast<i32>({lo})")),
        DType::I32 => format!("bitcast<i32>({lo})"),
        DType::F16 => format!("f16_to_f32({lo})"),
        DType::BF16 => format!("bitcast<f32>({lo} << 16u)"),
        DType::F32 => format!("bitcast<f32>({lo})"),
        DType::U64 => wide,
        DType::I64 => format!("bitcast<i64>({wide})"),
        DType::F64 => format!("bitcast<f64>({wide})"),
    }
}

/// The compute value of `to` whose stored bits are those of compute value `v` of `from`, a
/// dtype of the same size (16-bit floats' values are exact in their format).
pub(crate) fn bitcast(v: &str, from: DType, to: DType) -> String {
    if from.itemsize() == 8 {
        let bits = match from {
            DType::U64 => v.to_string(),
            _ => format!("bitcast<u64>({v})"),
        };
        return match to {
            DType::U64 => bits,
            DType::I64 => format!("bitcast<i64>({bits})"),
            _ => format!("bitcast<f64>({bits})"),
        };
    }
    scalar_value(to, &bits_of(from, v), "0u")
}

/// A NaN test on the bits of a float compute value (`x != x` may be folded away by drivers that
/// treat float compares as inexact).
pub(crate) fn is_nan(d: DType, v: &str) -> String {
    if compute_type(d) == "f64" {
        format!(
            "((bitcast<u64>({v}) & 0x7fffffffffffffff{}) > 0x7ff0000000000000lu)",
            "lu"
        )
    } else {
        format!("((bitcast<u32>({v}) & 0x7fffffffu) > 0x7f800000u)")
    }
}

/// `v != 0` for a compute value of `d`; NaN counts as non-zero. Floats are tested on their
/// bits: a driver that flushes subnormals (NVIDIA's, for f32) would call 1e-45 zero, and some
/// compile a float `!=` as an ordered compare.
pub(crate) fn ne_zero(d: DType, v: &str) -> String {
    match d {
        DType::Bool => v.to_string(),
        _ if compute_type(d) == "f64" => {
            format!("((bitcast<u64>({v}) & 0x7fffffffffffffff{}) != 0lu)", "lu")
        }
        _ if d.is_float() => format!("((bitcast<u32>({v}) & 0x7fffffffu) != 0u)"),
        _ => format!("({v} != {})", literal(d, 0)),
    }
}

/// Rounds an `f32` compute value to a 16-bit float dtype (a no-op for f32 and f64).
pub(crate) fn round_to(d: DType, v: String) -> String {
    match d {
        DType::F16 => format!("round_f16({v})"),
        DType::BF16 => format!("round_bf16({v})"),
        _ => v,
    }
}

/// The low 32 bits of an integer compute value, as `u32`.
fn low_bits(from: DType, v: &str) -> String {
    match compute_type(from) {
        "u32" => v.to_string(),
        "i32" => format!("bitcast<u32>({v})"),
        "u64" => format!("u32({v} & 0xfffffffflu)"),
        _ => format!("u32(bitcast<u64>({v}) & 0xfffffffflu)"),
    }
}

/// The value of float `v` as the float type `ft` literal `x` (for clamping bounds).
fn float_lit(ft: &str, x: i128) -> String {
    let f = x as f64;
    if ft == "f64" {
        format!("{f:?}lf")
    } else {
        format!("{:?}f", f as f32)
    }
}

/// strata's cast rule (`Scalar::cast`) from a compute value `v` of `from` to one of `to`:
/// to bool is `!= 0`; float → int saturates (NaN → 0); int → int wraps or, when `saturate`,
/// clamps; conversions to 16-bit floats round once, to nearest even.
pub(crate) fn cast(v: &str, from: DType, to: DType, saturate: bool) -> String {
    if from == to {
        return v.to_string();
    }
    let ct = compute_type(to);
    if to == DType::Bool {
        return ne_zero(from, v);
    }
    if from == DType::Bool {
        return format!("select({}, {}, {v})", literal(to, 0), literal(to, 1));
    }
    match (from.is_float(), to.is_float()) {
        (true, false) => {
            let ft = compute_type(from);
            let (lo, hi) = int_range(to);
            // Bounds rounded to the float type; at or past them the result saturates.
            format!(
                "select(select(select({ct}({v}), {}, {v} >= {}), {}, {v} <= {}), {}, {})",
                literal(to, hi),
                float_lit(ft, hi),
                literal(to, lo),
                float_lit(ft, lo),
                literal(to, 0),
                is_nan(from, v)
            )
        }
        (false, false) => {
            let (flo, fhi) = int_range(from);
            let (tlo, thi) = int_range(to);
            let plain = int_to_int(v, from, to);
            if !saturate {
                return plain;
            }
            let mut out = plain;
            if thi < fhi {
                out = format!(
                    "select({out}, {}, {v} > {})",
                    literal(to, thi),
                    literal(from, thi)
                );
            }
            if tlo > flo {
                out = format!(
                    "select({out}, {}, {v} < {})",
                    literal(to, tlo),
                    literal(from, tlo)
                );
            }
            out
        }
        (false, true) => {
            let f = match to {
                DType::F64 => format!("f64({v})"),
                _ => format!("f32({v})"),
            };
            round_to(to, f)
        }
        (true, true) => match (from, to) {
            (_, DType::F64) => format!("f64({v})"),
            (DType::F64, _) => round_to(to, format!("f32({v})")),
            _ => round_to(to, v.to_string()),
        },
    }
}

/// An `i32` value's 64 bits, sign-extended from its own bits. Mesa's lavapipe (22.3) miscompiles
/// WGSL's `i64(x)` (SPIR-V `OpSConvert`) when the result reaches a 64-bit division, comparison
/// or shift: `-3 // 5` gave 0 and `100 >> 2` gave 0. This form has no conversion to get wrong.
fn sign_extend(v: &str) -> String {
    format!("(u64(bitcast<u32>({v})) | select(0lu, 0xffffffff00000000lu, {v} < 0i))")
}

/// Wrapping integer conversion (two's complement, low bits kept).
fn int_to_int(v: &str, from: DType, to: DType) -> String {
    let signed_from = compute_type(from).starts_with('i');
    match compute_type(to) {
        "u32" => wrap(to, &low_bits(from, v)),
        "i32" => wrap(to, &format!("bitcast<i32>({})", low_bits(from, v))),
        "u64" => match compute_type(from) {
            "u32" => format!("u64({v})"),
            "i32" => sign_extend(v),
            _ => format!("bitcast<u64>({v})"),
        },
        _ => match compute_type(from) {
            // u32 → u64 zero-extends; a direct u32 → i64 conversion would sign-extend.
            "u32" => format!("bitcast<i64>(u64({v}))"),
            "i32" => format!("bitcast<i64>({})", sign_extend(v)),
            _ if signed_from => v.to_string(),
            _ => format!("bitcast<i64>({v})"),
        },
    }
}

/// The error for an IR op the dtype does not define (the CPU backend's message).
pub(crate) fn undefined(what: impl std::fmt::Debug, dtype: DType) -> Error {
    Error::Unsupported(format!("IR op {what:?} is not defined for {dtype}"))
}

/// The opening every kernel shares: the `params` binding and the index of the invocation
/// over a 2-D grid of 256-wide workgroups (`gid`).
pub(crate) const ENTRY: &str = "@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
  let gid = (wg.y * nwg.x + wg.x) * 256u + lid;
";

/// The start of every kernel: `enable f16;` where f16 is native, and the `params` binding the
/// kernel reads its launch values from.
pub(crate) fn header(caps: Caps) -> String {
    let enable = if caps.f16 { "enable f16;\n" } else { "" };
    format!("{enable}@group(0) @binding(0) var<storage, read> params: array<u32>;\n")
}

/// A tensor binding `b{slot}` (binding `slot + 1`) of dtype `d`; `atomic` for packed outputs
/// written element by element.
pub(crate) fn binding(slot: usize, d: DType, atomic: bool, caps: Caps) -> String {
    let ty = if atomic && packed_bits(d, caps).is_some() {
        "atomic<u32>".to_string()
    } else {
        array_type(d, caps).to_string()
    };
    format!(
        "@group(0) @binding({}) var<storage, read_write> b{slot}: array<{ty}>;\n",
        slot + 1
    )
}

/// A tensor binding `b{slot}` read as `vec4<{scalar}>` groups (16-byte loads).
pub(crate) fn vector_binding(slot: usize, scalar: &str) -> String {
    format!(
        "@group(0) @binding({}) var<storage, read_write> b{slot}: array<vec4<{scalar}>>;\n",
        slot + 1
    )
}

/// Declares `s{k}lo`, `s{k}hi` (the words from `params[first]` on) and `s{k}`, each scalar's
/// value (where the adapter has its type).
pub(crate) fn scalar_lets(scalars: &[DType], first: usize, caps: Caps, src: &mut String) {
    use std::fmt::Write;
    for (k, &d) in scalars.iter().enumerate() {
        let (lo, hi) = (first + 2 * k, first + 2 * k + 1);
        let _ = writeln!(
            src,
            "  let s{k}lo = params[{lo}]; let s{k}hi = params[{hi}];"
        );
        let wide_ok = match d {
            DType::U64 | DType::I64 => caps.int64,
            DType::F64 => caps.f64,
            _ => true,
        };
        if wide_ok {
            let _ = writeln!(
                src,
                "  let s{k}: {} = {};",
                compute_type(d),
                scalar_value(d, &format!("s{k}lo"), &format!("s{k}hi"))
            );
        }
    }
}
