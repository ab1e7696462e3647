//! Histograms with PyTorch's semantics (`histc`, `histogram`, `bincount`) and neon's exponent
//! histograms: each computes every element's bin as an expression and runs one
//! [`Kernel::Histogram`], which the GPU backends privatize in shared memory.

use super::reduce::Axes;
use crate::dtype::{DType, Scalar};
use crate::error::{Error, Result};
use crate::exponent_histogram::{exponent_bin, ExponentHistogram};
use crate::ir::{BinaryOp, Expr, Kernel, UnaryOp};
use crate::tensor::{launch, Tensor};

fn bin(op: BinaryOp, a: Expr, b: Expr) -> Expr {
    Expr::binary(op, a, b)
}

fn i32_lit(v: i64) -> Expr {
    Expr::literal(Scalar::I32(v as i32))
}

/// `t` contiguous from offset 0 (a copy when it is not).
fn dense(t: &Tensor) -> Result<Tensor> {
    if t.layout().is_contiguous() && t.offset() == 0 {
        Ok(t.clone())
    } else {
        t.to_dtype(t.dtype())
    }
}

/// The dtype counts are kept in: u32 unless `n` elements could overflow it.
fn count_dtype(n: usize) -> DType {
    if n < u32::MAX as usize {
        DType::U32
    } else {
        DType::U64
    }
}

/// `[bins]` of `acc`: each element of `values` added (1, or its weight) at bin `bin`, an
/// `i32` expression over input 0 and `scalars`; bins outside `0..bins` skipped.
fn count_bins(
    values: &Tensor,
    bin: Expr,
    scalars: Vec<Scalar>,
    bins: usize,
    weights: Option<&Tensor>,
    acc: DType,
) -> Result<Tensor> {
    let out = Tensor::zeros([bins], acc, values.device())?;
    if values.numel() == 0 || bins == 0 {
        return Ok(out);
    }
    let v = dense(values)?;
    if !values
        .device()
        .backend()
        .target()
        .histogram_accumulators
        .contains(&acc)
    {
        return one_hot_counts(&v, bin, scalars, bins, weights, acc);
    }
    let w = weights.map(|w| dense(&w.to_dtype(acc)?)).transpose()?;
    let mut inputs = vec![&v];
    inputs.extend(w.as_ref());
    let kernel = Kernel::Histogram {
        bins,
        bin,
        weighted: w.is_some(),
    };
    launch(kernel, &out, &inputs, scalars)?;
    Ok(out)
}

/// [`count_bins`] where the backend runs no histogram kernel: every element's bin as a map,
/// then each bin's count as a sum of a one-hot comparison (`bins · n` work).
fn one_hot_counts(
    values: &Tensor,
    bin: Expr,
    scalars: Vec<Scalar>,
    bins: usize,
    weights: Option<&Tensor>,
    acc: DType,
) -> Result<Tensor> {
    let dev = values.device();
    let layout = crate::layout::Layout::contiguous(&[values.numel()])?;
    let flat = values.flatten()?;
    let which = crate::fusion::defer_or_launch(bin, layout, vec![flat], scalars, dev, "histogram")?;
    let ids = Tensor::arange(0, bins as i64, 1, DType::I32, dev)?.unsqueeze(1)?;
    let hits = which.unsqueeze(0)?.eq(&ids)?;
    let terms = match weights {
        Some(w) => Tensor::where_cond(&hits, &w.flatten()?.to_dtype(acc)?.unsqueeze(0)?, 0)?,
        None => hits,
    };
    terms.sum(1isize, false)?.to_dtype(acc)
}

/// The float dtype a float tensor's bins are computed in: f32 for 16-bit floats.
fn compute_dtype(d: DType) -> DType {
    if d == DType::F64 {
        DType::F64
    } else {
        DType::F32
    }
}

impl Tensor {
    /// A histogram of `bins` equal bins over `[min, max]` (PyTorch's `histc`), in this float
    /// tensor's dtype. Element `x` goes to bin `⌊(x − min) · bins / (max − min)⌋` (computed in
    /// f32, or f64 for f64), `max` to the last bin; elements outside the range and NaNs are
    /// left out. When `min == max` the data's own minimum and maximum are used (read back
    /// from the device), widened by 1 each way when they are equal too.
    ///
    /// ```
    /// use strata_core::{Device, Tensor};
    /// let t = Tensor::from_slice(&[1.0f32, 2.0, 1.0, 4.0, 9.0, f32::NAN], [6], &Device::cpu()).unwrap();
    /// let h = t.histc(4, 0.0, 4.0).unwrap();
    /// assert_eq!(h.to_vec::<f32>().unwrap(), vec![0.0, 2.0, 1.0, 1.0]);
    /// ```
    #[track_caller]
    pub fn histc(&self, bins: usize, min: f64, max: f64) -> Result<Tensor> {
        let dtype = self.dtype();
        if !dtype.is_float() {
            return Err(Error::DType(format!(
                "histc counts floats, not {dtype}; convert first, or use bincount for integers"
            )));
        }
        if bins == 0 || bins > i32::MAX as usize {
            return Err(Error::Invalid(format!(
                "histc needs 1 to 2^31 - 1 bins, not {bins}"
            )));
        }
        let (mut lo, mut hi) = (min, max);
        if lo == hi && self.numel() > 0 {
            let all = Axes::All;
            lo = self
                .min(all.clone(), false)?
                .to_dtype(DType::F64)?
                .item::<f64>()?;
            hi = self.max(all, false)?.to_dtype(DType::F64)?.item::<f64>()?;
        }
        if lo == hi {
            (lo, hi) = (lo - 1.0, hi + 1.0);
        }
        if !lo.is_finite() || !hi.is_finite() {
            return Err(Error::Invalid(format!(
                "histc's range [{lo}, {hi}] is not finite"
            )));
        }
        if lo > hi {
            return Err(Error::Invalid(format!(
                "histc's max {hi} is below its min {lo}"
            )));
        }
        let c = compute_dtype(dtype);
        let x = Expr::input(0, dtype).cast(c, false);
        let (s_lo, s_hi, s_bins) = (Expr::scalar(0, c), Expr::scalar(1, c), Expr::scalar(2, c));
        let inside = bin(
            BinaryOp::LogicalAnd,
            bin(BinaryOp::Ge, x.clone(), s_lo.clone()),
            bin(BinaryOp::Le, x.clone(), s_hi.clone()),
        );
        let scaled = bin(BinaryOp::Mul, bin(BinaryOp::Sub, x, s_lo.clone()), s_bins);
        let pos = bin(BinaryOp::Div, scaled, bin(BinaryOp::Sub, s_hi, s_lo));
        let index = Expr::unary(UnaryOp::Floor, pos).cast(DType::I32, true);
        let last = i32_lit(bins as i64 - 1);
        let which = Expr::select(inside, bin(BinaryOp::Min, index, last), i32_lit(-1));
        let scalars = [lo, hi, bins as f64]
            .map(|v| Scalar::F64(v).cast(c, false))
            .to_vec();
        count_bins(self, which, scalars, bins, None, count_dtype(self.numel()))?.to_dtype(dtype)
    }

    /// A histogram over the bin `edges` (PyTorch's `histogram` with a tensor of bins): bin `k`
    /// holds `edges[k] ≤ x < edges[k+1]`, the last bin also its right edge; values outside and
    /// NaNs are left out. With `weights` (this tensor's shape) each element adds its weight
    /// instead of 1. In this float tensor's dtype. `edges` must be 1-D, at least two,
    /// increasing (checked on the host).
    ///
    /// ```
    /// use strata_core::{Device, Tensor};
    /// let dev = Device::cpu();
    /// let t = Tensor::from_slice(&[0.5f32, 1.0, 2.5, 3.0, -1.0], [5], &dev).unwrap();
    /// let edges = Tensor::from_slice(&[0.0f32, 1.0, 3.0], [3], &dev).unwrap();
    /// assert_eq!(t.histogram(&edges, None).unwrap().to_vec::<f32>().unwrap(), vec![1.0, 3.0]);
    /// ```
    #[track_caller]
    pub fn histogram(&self, edges: &Tensor, weights: Option<&Tensor>) -> Result<Tensor> {
        let dtype = self.dtype();
        if !dtype.is_float() {
            return Err(Error::DType(format!(
                "histogram counts floats, not {dtype}; use bincount for integers"
            )));
        }
        let e = edges.to_dtype(dtype)?;
        let host = e.to_dtype(DType::F64)?.to_vec::<f64>()?;
        if e.ndim() != 1 || host.len() < 2 || host.windows(2).any(|w| w[0] >= w[1] || w[0].is_nan())
        {
            return Err(Error::Invalid(format!(
                "histogram's edges must be 1-D, at least two and increasing: got {:?} {:?}",
                edges.shape(),
                &host[..host.len().min(8)]
            )));
        }
        if let Some(w) = weights {
            if w.shape() != self.shape() {
                return Err(Error::Shape(format!(
                    "histogram's weights {:?} must have the values' shape {:?}",
                    w.shape(),
                    self.shape()
                )));
            }
        }
        let bins = host.len() - 1;
        let x = self.flatten()?;
        // Edges at or below each value, but the last: 1..=bins inside the range.
        let below = x
            .unsqueeze(-1)?
            .ge(&e.narrow(0, 0, bins)?)?
            .sum(-1isize, false)?;
        let inside = x.le(host[bins])?;
        let which = Tensor::where_cond(&inside, &below.sub(1)?, -1)?;
        let acc = if weights.is_some() {
            compute_dtype(dtype)
        } else {
            count_dtype(self.numel())
        };
        let w = weights.map(|w| w.flatten()).transpose()?;
        let index = Expr::input(0, which.dtype()).cast(DType::I32, true);
        count_bins(&which, index, vec![], bins, w.as_ref(), acc)?.to_dtype(dtype)
    }

    /// How often each value `0, 1, …` occurs in this 1-D tensor of non-negative integers
    /// (PyTorch's `bincount`): `max(max + 1, minlength)` bins (`minlength` for an empty one).
    /// Counts are i64; with `weights` (this tensor's shape) each value adds its weight, as f32
    /// for f32 weights and f64 otherwise. The maximum and the sign check are read back from
    /// the device.
    ///
    /// ```
    /// use strata_core::{Device, Tensor};
    /// let t = Tensor::from_slice(&[4i64, 3, 6, 3, 4], [5], &Device::cpu()).unwrap();
    /// assert_eq!(t.bincount(None, 0).unwrap().to_vec::<i64>().unwrap(), vec![0, 0, 0, 2, 2, 0, 1]);
    /// ```
    #[track_caller]
    pub fn bincount(&self, weights: Option<&Tensor>, minlength: usize) -> Result<Tensor> {
        let dtype = self.dtype();
        if !dtype.is_int() || self.ndim() != 1 {
            return Err(Error::DType(format!(
                "bincount counts a 1-D tensor of integers, not {:?} {dtype}",
                self.shape()
            )));
        }
        let acc = match weights.map(|w| w.dtype()) {
            None => count_dtype(self.numel()),
            Some(DType::F32) => DType::F32,
            Some(_) => DType::F64,
        };
        if let Some(w) = weights {
            if w.shape() != self.shape() {
                return Err(Error::Shape(format!(
                    "bincount's weights {:?} must have the values' shape {:?}",
                    w.shape(),
                    self.shape()
                )));
            }
        }
        let mut bins = minlength;
        if self.numel() > 0 {
            let all = Axes::All;
            let lo = self
                .min(all.clone(), false)?
                .to_dtype(DType::I64)?
                .item::<i64>()?;
            if lo < 0 {
                return Err(Error::Invalid(format!(
                    "bincount counts non-negative integers; found {lo}"
                )));
            }
            let hi = self.max(all, false)?.to_dtype(DType::I64)?.item::<i64>()?;
            if hi >= i32::MAX as i64 {
                return Err(Error::Invalid(format!(
                    "bincount's largest value {hi} would need more than 2^31 - 1 bins"
                )));
            }
            bins = bins.max(hi as usize + 1);
        }
        let index = Expr::input(0, dtype).cast(DType::I32, true);
        let out = count_bins(self, index, vec![], bins, weights, acc)?;
        if weights.is_some() {
            Ok(out)
        } else {
            out.to_dtype(DType::I64)
        }
    }

    /// Counts of this tensor's values by power of two (neon's exponent histograms): see
    /// [`ExponentHistogram`]. Integers are counted as f64. Reads the counts back (a sync).
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::from_slice(&[1e-6f32, 70000.0], [2], &Device::cpu()).unwrap();
    /// let h = t.exponent_histogram().unwrap();
    /// assert_eq!(h.count(-20) + h.count(16), 2); // 2^-20 ≤ 1e-6, 2^16 ≤ 70000
    /// ```
    #[track_caller]
    pub fn exponent_histogram(&self) -> Result<ExponentHistogram> {
        let source = match self.dtype() {
            DType::Bool => {
                return Err(Error::DType(
                    "exponent_histogram counts numbers, not bool".into(),
                ))
            }
            d if d.is_float() => self.clone(),
            _ => self.to_dtype(DType::F64)?,
        };
        let dtype = source.dtype();
        let (which, bins) = exponent_bin(dtype);
        let counted = count_bins(
            &source,
            which,
            vec![],
            bins,
            None,
            count_dtype(self.numel()),
        )?;
        // Read as counted (no conversion kernel before the read-back).
        let counts: Vec<u64> = match counted.dtype() {
            DType::U32 => counted
                .to_vec::<u32>()?
                .into_iter()
                .map(u64::from)
                .collect(),
            _ => counted.to_dtype(DType::U64)?.to_vec::<u64>()?,
        };
        Ok(ExponentHistogram::from_counts(dtype, &counts))
    }
}
