//! Exponent histograms (neon's `hist_bins`): counts of a float's values by power of two, as
//! plain data, and the bin expression that counts them from a float's bits. Kept low in the
//! crate: the profiler counts them per kernel output, the ops count them per tensor.

use crate::dtype::{DType, Scalar};
use crate::ir::{BinaryOp, Expr};

fn bin(op: BinaryOp, a: Expr, b: Expr) -> Expr {
    Expr::binary(op, a, b)
}

fn i32_lit(v: i64) -> Expr {
    Expr::literal(Scalar::I32(v as i32))
}

/// The bin of an element of float `dtype` (input 0) among its exponent counts, and how many
/// bins: `[zero, subnormal, infinite, NaN, 2^min … 2^max]`.
pub(crate) fn exponent_bin(dtype: DType) -> (Expr, usize) {
    let f = dtype.float_format().expect("a float");
    let u = match dtype.itemsize() {
        2 => DType::U16,
        4 => DType::U32,
        _ => DType::U64,
    };
    let lit = |v: u64| Expr::literal(Scalar::U64(v).cast(u, false));
    let bits = Expr::input(0, dtype).bitcast(u);
    let all_ones = (1u64 << (8 * dtype.itemsize() as u32 - 1 - f.mantissa_bits)) - 1;
    let exponent = bin(
        BinaryOp::BitAnd,
        bin(BinaryOp::Shr, bits.clone(), lit(f.mantissa_bits as u64)),
        lit(all_ones),
    );
    let fraction = bin(BinaryOp::BitAnd, bits, lit((1u64 << f.mantissa_bits) - 1));
    let no_fraction = bin(BinaryOp::Eq, fraction, lit(0));
    let power = bin(
        BinaryOp::Add,
        exponent.clone().cast(DType::I32, false),
        i32_lit(3),
    );
    let special = Expr::select(no_fraction.clone(), i32_lit(2), i32_lit(3));
    let tiny = Expr::select(no_fraction, i32_lit(0), i32_lit(1));
    let b = Expr::select(
        bin(BinaryOp::Eq, exponent.clone(), lit(0)),
        tiny,
        Expr::select(bin(BinaryOp::Eq, exponent, lit(all_ones)), special, power),
    );
    (b, 4 + all_ones as usize - 1)
}

/// A histogram of a tensor's values by power of two (neon's `hist_bins`): how many elements
/// have each exponent `⌊log2|x|⌋` of the dtype's normal range, with zeros, subnormals,
/// infinities and NaNs counted apart. Made by
/// [`Tensor::exponent_histogram`](crate::Tensor::exponent_histogram); shown in a
/// notebook as a bar chart with the f16 and bf16 ranges marked.
///
/// ```
/// use strata_core::{Device, Tensor};
/// let t = Tensor::from_slice(&[0.75f32, 1.0, 3.0, 0.0, f32::INFINITY], [5], &Device::cpu()).unwrap();
/// let h = t.exponent_histogram().unwrap();
/// assert_eq!((h.count(-1), h.count(0), h.count(1)), (1, 1, 1));
/// assert_eq!((h.zeros, h.infinities, h.nans), (1, 1, 0));
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct ExponentHistogram {
    /// The dtype whose exponents were counted (integers are counted as f64).
    pub dtype: DType,
    /// The exponent of `counts[0]`: the dtype's smallest normal one.
    pub min_exponent: i32,
    /// Elements with exponent `min_exponent + k`, for each `k`.
    pub counts: Vec<u64>,
    /// Elements equal to ±0.
    pub zeros: u64,
    /// Subnormal elements (below `2^min_exponent`, not zero).
    pub subnormals: u64,
    /// ±∞.
    pub infinities: u64,
    /// NaNs.
    pub nans: u64,
}

impl ExponentHistogram {
    /// The histogram of `dtype` from the counts of [`exponent_bin`]'s bins.
    pub(crate) fn from_counts(dtype: DType, counts: &[u64]) -> ExponentHistogram {
        let at = |k: usize| counts.get(k).copied().unwrap_or(0);
        ExponentHistogram {
            dtype,
            min_exponent: dtype.float_format().map_or(0, |f| f.min_exponent),
            counts: counts.get(4..).unwrap_or(&[]).to_vec(),
            zeros: at(0),
            subnormals: at(1),
            infinities: at(2),
            nans: at(3),
        }
    }

    /// How many elements have exponent `e` (`2^e ≤ |x| < 2^(e+1)`); 0 outside the range.
    ///
    /// ```
    /// use strata_core::{Device, Tensor};
    /// let t = Tensor::from_slice(&[1024.0f32, 1500.0], [2], &Device::cpu()).unwrap();
    /// assert_eq!(t.exponent_histogram().unwrap().count(10), 2);
    /// ```
    pub fn count(&self, e: i32) -> u64 {
        usize::try_from(e - self.min_exponent)
            .ok()
            .and_then(|k| self.counts.get(k))
            .copied()
            .unwrap_or(0)
    }

    /// Every element counted (`numel` of the tensor).
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::ones([3, 4], DType::F16, &Device::cpu()).unwrap();
    /// assert_eq!(t.exponent_histogram().unwrap().total(), 12);
    /// ```
    pub fn total(&self) -> u64 {
        self.counts.iter().sum::<u64>() + self.zeros + self.subnormals + self.infinities + self.nans
    }

    /// The smallest and largest exponent that occur, if any normal value does.
    ///
    /// ```
    /// use strata_core::{Device, Tensor};
    /// let t = Tensor::from_slice(&[0.1f64, 300.0], [2], &Device::cpu()).unwrap();
    /// assert_eq!(t.exponent_histogram().unwrap().range(), Some((-4, 8)));
    /// ```
    pub fn range(&self) -> Option<(i32, i32)> {
        let first = self.counts.iter().position(|&c| c > 0)?;
        let last = self.counts.iter().rposition(|&c| c > 0)?;
        Some((
            self.min_exponent + first as i32,
            self.min_exponent + last as i32,
        ))
    }
}
