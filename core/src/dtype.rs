//! Element types: [`DType`], its DLPack description, and the Rust types that map to it.

use crate::error::{Error, Result};
use half::{bf16, f16};
use std::fmt;

/// The binary format of a float dtype ([`DType::float_format`]): a value is
/// `±1.m × 2^e` with `mantissa_bits` bits of `m` and `min_exponent ≤ e ≤ max_exponent`, or a
/// subnormal `±0.m × 2^min_exponent`.
///
/// ```
/// let f32 = strata_core::DType::F32.float_format().unwrap();
/// assert_eq!((f32.mantissa_bits, f32.min_exponent), (23, -126));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FloatFormat {
    /// Stored mantissa (fraction) bits: f64 52, f32 23, f16 10, bf16 7.
    pub mantissa_bits: u32,
    /// The exponent of the smallest normal power of two.
    pub min_exponent: i32,
    /// The exponent of the largest finite power of two.
    pub max_exponent: i32,
}

/// The element type of a tensor.
///
/// ```
/// use strata_core::{DType, Category};
/// assert_eq!(DType::BF16.itemsize(), 2);
/// assert_eq!(DType::U8.category(), Category::Unsigned);
/// assert_eq!(DType::F32.dlpack(), (2, 32, 1));
/// assert_eq!("i64".parse::<DType>().unwrap(), DType::I64);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    /// Boolean, stored as one byte holding 0 or 1.
    Bool,
    /// Unsigned 8-bit integer.
    U8,
    /// Unsigned 16-bit integer.
    U16,
    /// Unsigned 32-bit integer.
    U32,
    /// Unsigned 64-bit integer.
    U64,
    /// Signed 8-bit integer.
    I8,
    /// Signed 16-bit integer.
    I16,
    /// Signed 32-bit integer.
    I32,
    /// Signed 64-bit integer.
    I64,
    /// IEEE half precision.
    F16,
    /// bfloat16: f32's exponent with a 7-bit mantissa.
    BF16,
    /// IEEE single precision.
    F32,
    /// IEEE double precision.
    F64,
}

/// The kind of a dtype, in the order of PyTorch's type promotion (bool < integers < floats).
///
/// ```
/// use strata_core::{DType, Category};
/// assert!(Category::Bool < Category::Unsigned && Category::Signed < Category::Float);
/// assert_eq!(DType::F16.category(), Category::Float);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Category {
    /// `bool`.
    Bool,
    /// `u8` … `u64`.
    Unsigned,
    /// `i8` … `i64`.
    Signed,
    /// `f16`, `bf16`, `f32`, `f64`.
    Float,
}

impl DType {
    /// The dtype a sum or product of this dtype accumulates in, as PyTorch's: integers and
    /// bool in i64, 16-bit floats in f32, f32 and f64 in themselves.
    ///
    /// ```
    /// use strata_core::DType;
    /// assert_eq!(DType::U8.accumulator(), DType::I64);
    /// assert_eq!(DType::BF16.accumulator(), DType::F32);
    /// assert_eq!(DType::F64.accumulator(), DType::F64);
    /// ```
    pub fn accumulator(self) -> DType {
        match self {
            DType::F16 | DType::BF16 | DType::F32 => DType::F32,
            DType::F64 => DType::F64,
            _ => DType::I64,
        }
    }

    /// Every dtype, in declaration order.
    ///
    /// ```
    /// assert_eq!(strata_core::DType::ALL.len(), 13);
    /// ```
    pub const ALL: [DType; 13] = [
        DType::Bool,
        DType::U8,
        DType::U16,
        DType::U32,
        DType::U64,
        DType::I8,
        DType::I16,
        DType::I32,
        DType::I64,
        DType::F16,
        DType::BF16,
        DType::F32,
        DType::F64,
    ];

    /// Bytes per element.
    ///
    /// ```
    /// assert_eq!(strata_core::DType::F64.itemsize(), 8);
    /// ```
    pub fn itemsize(self) -> usize {
        match self {
            DType::Bool | DType::U8 | DType::I8 => 1,
            DType::U16 | DType::I16 | DType::F16 | DType::BF16 => 2,
            DType::U32 | DType::I32 | DType::F32 => 4,
            DType::U64 | DType::I64 | DType::F64 => 8,
        }
    }

    /// The short lowercase name (`"f32"`, `"bool"`, ...).
    ///
    /// ```
    /// assert_eq!(strata_core::DType::BF16.name(), "bf16");
    /// ```
    pub fn name(self) -> &'static str {
        match self {
            DType::Bool => "bool",
            DType::U8 => "u8",
            DType::U16 => "u16",
            DType::U32 => "u32",
            DType::U64 => "u64",
            DType::I8 => "i8",
            DType::I16 => "i16",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F32 => "f32",
            DType::F64 => "f64",
        }
    }

    /// Bool, unsigned, signed or float.
    ///
    /// ```
    /// assert_eq!(strata_core::DType::I8.category(), strata_core::Category::Signed);
    /// ```
    pub fn category(self) -> Category {
        match self {
            DType::Bool => Category::Bool,
            DType::U8 | DType::U16 | DType::U32 | DType::U64 => Category::Unsigned,
            DType::I8 | DType::I16 | DType::I32 | DType::I64 => Category::Signed,
            DType::F16 | DType::BF16 | DType::F32 | DType::F64 => Category::Float,
        }
    }

    /// True for `f16`, `bf16`, `f32`, `f64`.
    ///
    /// ```
    /// assert!(strata_core::DType::F16.is_float());
    /// ```
    pub fn is_float(self) -> bool {
        self.category() == Category::Float
    }

    /// A float dtype's binary format: stored mantissa bits and the exponents of its smallest
    /// and largest normal powers of two; `None` for the other dtypes.
    ///
    /// ```
    /// use strata_core::{dtype::FloatFormat, DType};
    /// let f16 = DType::F16.float_format().unwrap();
    /// assert_eq!(f16, FloatFormat { mantissa_bits: 10, min_exponent: -14, max_exponent: 15 });
    /// assert_eq!(DType::BF16.float_format().unwrap().max_exponent, 127);
    /// assert!(DType::I32.float_format().is_none());
    /// ```
    pub fn float_format(self) -> Option<FloatFormat> {
        let (mantissa_bits, min_exponent, max_exponent) = match self {
            DType::F16 => (10, -14, 15),
            DType::BF16 => (7, -126, 127),
            DType::F32 => (23, -126, 127),
            DType::F64 => (52, -1022, 1023),
            _ => return None,
        };
        Some(FloatFormat {
            mantissa_bits,
            min_exponent,
            max_exponent,
        })
    }

    /// True for the signed and unsigned integer dtypes (not `bool`).
    ///
    /// ```
    /// assert!(strata_core::DType::U64.is_int() && !strata_core::DType::Bool.is_int());
    /// ```
    pub fn is_int(self) -> bool {
        matches!(self.category(), Category::Unsigned | Category::Signed)
    }

    /// The DLPack `(code, bits, lanes)`: code 0 int, 1 uint, 2 float, 4 bfloat, 6 bool.
    ///
    /// ```
    /// assert_eq!(strata_core::DType::BF16.dlpack(), (4, 16, 1));
    /// assert_eq!(strata_core::DType::Bool.dlpack(), (6, 8, 1));
    /// ```
    pub fn dlpack(self) -> (u8, u8, u16) {
        let code = match self.category() {
            Category::Signed => 0,
            Category::Unsigned => 1,
            Category::Float if self == DType::BF16 => 4,
            Category::Float => 2,
            Category::Bool => 6,
        };
        (code, (self.itemsize() * 8) as u8, 1)
    }

    /// The dtype with the given DLPack `(code, bits, lanes)`.
    ///
    /// ```
    /// use strata_core::DType;
    /// assert_eq!(DType::from_dlpack(1, 8, 1).unwrap(), DType::U8);
    /// assert!(DType::from_dlpack(2, 8, 1).is_err());
    /// ```
    pub fn from_dlpack(code: u8, bits: u8, lanes: u16) -> Result<DType> {
        DType::ALL
            .into_iter()
            .find(|d| d.dlpack() == (code, bits, lanes))
            .ok_or_else(|| {
                Error::DType(format!(
                    "no strata dtype has DLPack code {code}, bits {bits}, lanes {lanes}"
                ))
            })
    }

    /// The smallest and largest finite values, as `f64` (exact for every dtype but 64-bit
    /// integers, whose bounds round to the nearest `f64`).
    ///
    /// ```
    /// assert_eq!(strata_core::DType::I8.min_max(), (-128.0, 127.0));
    /// ```
    pub fn min_max(self) -> (f64, f64) {
        match self {
            DType::Bool => (0.0, 1.0),
            DType::U8 => (0.0, u8::MAX as f64),
            DType::U16 => (0.0, u16::MAX as f64),
            DType::U32 => (0.0, u32::MAX as f64),
            DType::U64 => (0.0, u64::MAX as f64),
            DType::I8 => (i8::MIN as f64, i8::MAX as f64),
            DType::I16 => (i16::MIN as f64, i16::MAX as f64),
            DType::I32 => (i32::MIN as f64, i32::MAX as f64),
            DType::I64 => (i64::MIN as f64, i64::MAX as f64),
            DType::F16 => (f16::MIN.to_f64(), f16::MAX.to_f64()),
            DType::BF16 => (bf16::MIN.to_f64(), bf16::MAX.to_f64()),
            DType::F32 => (f32::MIN as f64, f32::MAX as f64),
            DType::F64 => (f64::MIN, f64::MAX),
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for DType {
    type Err = Error;
    fn from_str(s: &str) -> Result<DType> {
        DType::ALL
            .into_iter()
            .find(|d| d.name() == s)
            .ok_or_else(|| Error::DType(format!("unknown dtype name {s:?}")))
    }
}

/// A Rust type that is the element type of one [`DType`]; used by typed host transfers
/// (`from_slice::<T>`, `to_vec::<T>`).
///
/// ```
/// use strata_core::{DType, Element};
/// assert_eq!(<half::bf16 as Element>::DTYPE, DType::BF16);
/// assert_eq!(f32::from_scalar(7u8.into()), 7.0);
/// ```
pub trait Element: Copy + Send + Sync + PartialEq + fmt::Debug + 'static {
    /// The dtype this type stands for.
    const DTYPE: DType;
    /// The little-endian bytes of `values`, without a copy.
    fn as_bytes(values: &[Self]) -> &[u8];
    /// `n` values read by `fill`, which writes their little-endian bytes into the slice it is
    /// given: the returned `Vec`'s own memory where the type allows (no second copy).
    fn read_vec(n: usize, fill: &mut dyn FnMut(&mut [u8]) -> Result<()>) -> Result<Vec<Self>>;
    /// Reads values from little-endian bytes (`bytes.len()` a multiple of the itemsize).
    fn from_bytes(bytes: &[u8]) -> Vec<Self>;
    /// This value as a [`Scalar`].
    fn to_scalar(self) -> Scalar;
    /// A scalar converted to this type with strata's cast rules (see [`Scalar::cast`]).
    fn from_scalar(s: Scalar) -> Self;
}

macro_rules! pod_element {
    ($($t:ty => $d:ident),*) => {$(
        impl Element for $t {
            const DTYPE: DType = DType::$d;
            fn as_bytes(values: &[Self]) -> &[u8] {
                bytemuck::cast_slice(values)
            }
            fn read_vec(
                n: usize,
                fill: &mut dyn FnMut(&mut [u8]) -> Result<()>,
            ) -> Result<Vec<Self>> {
                // Zeroed by the allocator (fresh pages), so 1 GiB costs no pass of its own.
                let mut v: Vec<$t> = bytemuck::zeroed_vec(n);
                fill(bytemuck::cast_slice_mut(&mut v))?;
                Ok(v)
            }
            fn from_bytes(bytes: &[u8]) -> Vec<Self> {
                bytes
                    .chunks_exact(std::mem::size_of::<$t>())
                    .map(bytemuck::pod_read_unaligned)
                    .collect()
            }
            fn to_scalar(self) -> Scalar {
                Scalar::$d(self)
            }
            fn from_scalar(s: Scalar) -> Self {
                match s.cast(DType::$d, false) {
                    Scalar::$d(v) => v,
                    _ => unreachable!("Scalar::cast returns the requested dtype"),
                }
            }
        }
    )*};
}
pod_element!(u8 => U8, u16 => U16, u32 => U32, u64 => U64, i8 => I8, i16 => I16,
    i32 => I32, i64 => I64, f16 => F16, bf16 => BF16, f32 => F32, f64 => F64);

impl Element for bool {
    const DTYPE: DType = DType::Bool;
    fn as_bytes(values: &[Self]) -> &[u8] {
        bytemuck::cast_slice(values)
    }
    fn read_vec(n: usize, fill: &mut dyn FnMut(&mut [u8]) -> Result<()>) -> Result<Vec<Self>> {
        // Through bytes: a device byte other than 0 or 1 must not become a `bool`.
        let mut bytes = vec![0u8; n];
        fill(&mut bytes)?;
        Ok(bytes.into_iter().map(|b| b != 0).collect())
    }
    fn from_bytes(bytes: &[u8]) -> Vec<Self> {
        bytes.iter().map(|&b| b != 0).collect()
    }
    fn to_scalar(self) -> Scalar {
        Scalar::Bool(self)
    }
    fn from_scalar(s: Scalar) -> Self {
        s.to_bool()
    }
}

/// One value of any dtype: fill values, scalar operands of ops, `item()` results.
///
/// ```
/// use strata_core::{DType, Scalar};
/// let s = Scalar::from(3.7f64);
/// assert_eq!(s.dtype(), DType::F64);
/// assert_eq!(s.cast(DType::U8, false), Scalar::U8(3));
/// assert_eq!(Scalar::F32(f32::NAN).cast(DType::I32, false), Scalar::I32(0));
/// assert_eq!(Scalar::I32(300).cast(DType::U8, false), Scalar::U8(44));
/// assert_eq!(Scalar::I32(300).cast(DType::U8, true), Scalar::U8(255));
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
#[allow(missing_docs)]
pub enum Scalar {
    Bool(bool),
    U8(u8),
    U16(u16),
    U32(u32),
    U64(u64),
    I8(i8),
    I16(i16),
    I32(i32),
    I64(i64),
    F16(f16),
    BF16(bf16),
    F32(f32),
    F64(f64),
}

/// Applies `$body` to the value inside a [`Scalar`], bound as `$v`.
macro_rules! with_scalar {
    ($s:expr, $v:ident => $body:expr) => {
        match $s {
            Scalar::Bool($v) => $body,
            Scalar::U8($v) => $body,
            Scalar::U16($v) => $body,
            Scalar::U32($v) => $body,
            Scalar::U64($v) => $body,
            Scalar::I8($v) => $body,
            Scalar::I16($v) => $body,
            Scalar::I32($v) => $body,
            Scalar::I64($v) => $body,
            Scalar::F16($v) => $body,
            Scalar::BF16($v) => $body,
            Scalar::F32($v) => $body,
            Scalar::F64($v) => $body,
        }
    };
}

impl Scalar {
    /// The dtype of the value.
    ///
    /// ```
    /// assert_eq!(strata_core::Scalar::from(1i8).dtype(), strata_core::DType::I8);
    /// ```
    pub fn dtype(self) -> DType {
        with_scalar!(self, v => crate::dtype::dtype_of(&v))
    }

    /// True when the value is not zero (NaN counts as true, as in PyTorch).
    ///
    /// ```
    /// assert!(strata_core::Scalar::F32(f32::NAN).to_bool());
    /// ```
    pub fn to_bool(self) -> bool {
        match self {
            Scalar::Bool(b) => b,
            Scalar::F16(v) => v.to_f32() != 0.0,
            Scalar::BF16(v) => v.to_f32() != 0.0,
            Scalar::F32(v) => v != 0.0,
            Scalar::F64(v) => v != 0.0,
            other => other.to_i128() != 0,
        }
    }

    /// The value as `f64` (64-bit integers may round).
    ///
    /// ```
    /// assert_eq!(strata_core::Scalar::U16(9).to_f64(), 9.0);
    /// ```
    pub fn to_f64(self) -> f64 {
        match self {
            Scalar::Bool(b) => b as u8 as f64,
            Scalar::F16(v) => v.to_f64(),
            Scalar::BF16(v) => v.to_f64(),
            Scalar::F32(v) => v as f64,
            Scalar::F64(v) => v,
            other => other.to_i128() as f64,
        }
    }

    /// The value as `i128`: exact for integers and bool; floats truncate toward zero and
    /// saturate (NaN gives 0).
    ///
    /// ```
    /// assert_eq!(strata_core::Scalar::F32(-2.7).to_i128(), -2);
    /// ```
    pub fn to_i128(self) -> i128 {
        match self {
            Scalar::Bool(b) => b as i128,
            Scalar::U8(v) => v as i128,
            Scalar::U16(v) => v as i128,
            Scalar::U32(v) => v as i128,
            Scalar::U64(v) => v as i128,
            Scalar::I8(v) => v as i128,
            Scalar::I16(v) => v as i128,
            Scalar::I32(v) => v as i128,
            Scalar::I64(v) => v as i128,
            other => other.to_f64() as i128,
        }
    }

    /// Converts to `dtype` with strata's cast rules, the same on every backend: integers wrap
    /// (or clamp when `saturate`), floats to integers truncate toward zero and saturate with
    /// NaN → 0, anything to bool is `value != 0`, bool is 0 or 1.
    ///
    /// ```
    /// use strata_core::{DType, Scalar};
    /// assert_eq!(Scalar::I16(-1).cast(DType::U16, false), Scalar::U16(65535));
    /// assert_eq!(Scalar::I16(-1).cast(DType::U16, true), Scalar::U16(0));
    /// assert_eq!(Scalar::F64(1e10).cast(DType::I32, false), Scalar::I32(i32::MAX));
    /// ```
    pub fn cast(self, dtype: DType, saturate: bool) -> Scalar {
        if self.dtype() == dtype {
            return self;
        }
        if dtype == DType::Bool {
            return Scalar::Bool(self.to_bool());
        }
        if self.dtype().is_float() {
            let v = match self {
                Scalar::F64(v) => v,
                other => other.to_f64(),
            };
            // `as` from a float saturates and maps NaN to 0: exactly strata's rule.
            return match dtype {
                DType::U8 => Scalar::U8(v as u8),
                DType::U16 => Scalar::U16(v as u16),
                DType::U32 => Scalar::U32(v as u32),
                DType::U64 => Scalar::U64(v as u64),
                DType::I8 => Scalar::I8(v as i8),
                DType::I16 => Scalar::I16(v as i16),
                DType::I32 => Scalar::I32(v as i32),
                DType::I64 => Scalar::I64(v as i64),
                DType::F16 => Scalar::F16(f16::from_f64(v)),
                DType::BF16 => Scalar::BF16(bf16::from_f64(v)),
                DType::F32 => Scalar::F32(v as f32),
                DType::F64 => Scalar::F64(v),
                DType::Bool => unreachable!("handled above"),
            };
        }
        let i = self.to_i128();
        let (lo, hi) = int_bounds(dtype);
        let w = if saturate { i.clamp(lo, hi) } else { i };
        match dtype {
            DType::U8 => Scalar::U8(w as u8),
            DType::U16 => Scalar::U16(w as u16),
            DType::U32 => Scalar::U32(w as u32),
            DType::U64 => Scalar::U64(w as u64),
            DType::I8 => Scalar::I8(w as i8),
            DType::I16 => Scalar::I16(w as i16),
            DType::I32 => Scalar::I32(w as i32),
            DType::I64 => Scalar::I64(w as i64),
            DType::F16 => Scalar::F16(f16::from_f64(i as f64)),
            DType::BF16 => Scalar::BF16(bf16::from_f64(i as f64)),
            DType::F32 => Scalar::F32(i as f32),
            DType::F64 => Scalar::F64(i as f64),
            DType::Bool => unreachable!("handled above"),
        }
    }

    /// The value's bits, zero-extended to 64 (how GPU backends pass scalars to kernels).
    ///
    /// ```
    /// assert_eq!(strata_core::Scalar::I8(-1).bits(), 0xff);
    /// assert_eq!(strata_core::Scalar::F32(1.0).bits(), 0x3f80_0000);
    /// ```
    pub fn bits(self) -> u64 {
        let bytes = self.to_le_bytes();
        let mut w = [0u8; 8];
        w[..bytes.len()].copy_from_slice(&bytes);
        u64::from_le_bytes(w)
    }

    /// The value of `dtype` whose little-endian bits are the low bytes of `bits` (the inverse of
    /// [`Scalar::bits`]).
    ///
    /// ```
    /// use strata_core::{DType, Scalar};
    /// assert_eq!(Scalar::from_bits(DType::F32, 0x3f80_0000), Scalar::F32(1.0));
    /// assert_eq!(Scalar::from_bits(DType::I8, 0xff), Scalar::I8(-1));
    /// ```
    pub fn from_bits(dtype: DType, bits: u64) -> Scalar {
        let bytes = &bits.to_le_bytes()[..dtype.itemsize()];
        macro_rules! read {
            ($t:ty) => {
                <$t as Element>::from_bytes(bytes)[0].to_scalar()
            };
        }
        match dtype {
            DType::Bool => Scalar::Bool(bytes[0] != 0),
            DType::U8 => read!(u8),
            DType::U16 => read!(u16),
            DType::U32 => read!(u32),
            DType::U64 => read!(u64),
            DType::I8 => read!(i8),
            DType::I16 => read!(i16),
            DType::I32 => read!(i32),
            DType::I64 => read!(i64),
            DType::F16 => read!(f16),
            DType::BF16 => read!(bf16),
            DType::F32 => read!(f32),
            DType::F64 => read!(f64),
        }
    }

    /// The little-endian bytes of the value (one byte for bool).
    ///
    /// ```
    /// assert_eq!(strata_core::Scalar::U16(258).to_le_bytes(), vec![2, 1]);
    /// ```
    pub fn to_le_bytes(self) -> Vec<u8> {
        let mut out = Vec::with_capacity(8);
        with_scalar!(self, v => out.extend_from_slice(Element::as_bytes(&[v])));
        out
    }
}

/// The integer range of an integer dtype as `i128` (bool: 0..=1).
pub(crate) fn int_bounds(dtype: DType) -> (i128, i128) {
    match dtype {
        DType::Bool => (0, 1),
        DType::U8 => (0, u8::MAX as i128),
        DType::U16 => (0, u16::MAX as i128),
        DType::U32 => (0, u32::MAX as i128),
        DType::U64 => (0, u64::MAX as i128),
        DType::I8 => (i8::MIN as i128, i8::MAX as i128),
        DType::I16 => (i16::MIN as i128, i16::MAX as i128),
        DType::I32 => (i32::MIN as i128, i32::MAX as i128),
        DType::I64 => (i64::MIN as i128, i64::MAX as i128),
        _ => (i128::MIN, i128::MAX),
    }
}

fn dtype_of<T: Element>(_: &T) -> DType {
    T::DTYPE
}

macro_rules! scalar_from {
    ($($t:ty => $d:ident),*) => {$(
        impl From<$t> for Scalar {
            fn from(v: $t) -> Scalar {
                Scalar::$d(v)
            }
        }
    )*};
}
scalar_from!(bool => Bool, u8 => U8, u16 => U16, u32 => U32, u64 => U64, i8 => I8,
    i16 => I16, i32 => I32, i64 => I64, f16 => F16, bf16 => BF16, f32 => F32, f64 => F64);

impl fmt::Display for Scalar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        with_scalar!(*self, v => write!(f, "{v}"))
    }
}
