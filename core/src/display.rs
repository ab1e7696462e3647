//! Text display: PyTorch-like `Display` (values, then a footer) and `Debug` (a summary, then
//! the values on one line, like PyTorch's `repr`). Both read the values from the device.

use crate::dtype::{DType, Element, Scalar};
use crate::error::Result;
use crate::tensor::Tensor;
use half::{bf16, f16};
use std::fmt;

/// Tensors with more elements than this are summarized with `...`.
const THRESHOLD: usize = 1000;
/// Elements shown at each end of a summarized axis.
pub(crate) const EDGE: usize = 3;
/// Rows of numbers wrap at this many characters.
const LINE_WIDTH: usize = 80;

/// Element `i` of little-endian `bytes` holding `dtype` values.
pub(crate) fn scalar_at(dtype: DType, bytes: &[u8], i: usize) -> Scalar {
    let n = dtype.itemsize();
    let b = &bytes[i * n..(i + 1) * n];
    fn one<T: Element>(b: &[u8]) -> Scalar {
        T::from_bytes(b)[0].to_scalar()
    }
    match dtype {
        DType::Bool => one::<bool>(b),
        DType::U8 => one::<u8>(b),
        DType::U16 => one::<u16>(b),
        DType::U32 => one::<u32>(b),
        DType::U64 => one::<u64>(b),
        DType::I8 => one::<i8>(b),
        DType::I16 => one::<i16>(b),
        DType::I32 => one::<i32>(b),
        DType::I64 => one::<i64>(b),
        DType::F16 => one::<f16>(b),
        DType::BF16 => one::<bf16>(b),
        DType::F32 => one::<f32>(b),
        DType::F64 => one::<f64>(b),
    }
}

/// The elements to print: all of them, or the ends of each long axis when the tensor is
/// large. Returns the (small) tensor and which axes were cut.
pub(crate) fn summary(t: &Tensor) -> Result<(Tensor, Vec<bool>)> {
    let cut: Vec<bool> = t
        .shape()
        .iter()
        .map(|&n| t.numel() > THRESHOLD && n > 2 * EDGE)
        .collect();
    if !cut.contains(&true) {
        return Ok((t.clone(), cut));
    }
    let kept: Vec<usize> = t
        .shape()
        .iter()
        .zip(&cut)
        .map(|(&n, &c)| if c { 2 * EDGE } else { n })
        .collect();
    let out = Tensor::alloc(&kept, t.dtype(), t.device())?;
    let cut_axes: Vec<usize> = (0..cut.len()).filter(|&k| cut[k]).collect();
    // One copy per corner: each cut axis contributes its first or its last EDGE elements.
    for corner in 0..1usize << cut_axes.len() {
        let (mut src, mut dst) = (t.clone(), out.clone());
        for (bit, &k) in cut_axes.iter().enumerate() {
            let high = corner >> bit & 1 == 1;
            let n = t.shape()[k];
            src = src.narrow(k as isize, if high { n - EDGE } else { 0 }, EDGE)?;
            dst = dst.narrow(k as isize, if high { EDGE } else { 0 }, EDGE)?;
        }
        dst.assign(&src)?;
    }
    Ok((out, cut))
}

/// How a tensor's floats are written, chosen from all printed values (as PyTorch does).
enum FloatStyle {
    /// Every finite value is a whole number: `3.`
    Whole,
    /// Fixed point with four decimals: `0.2500`
    Fixed,
    /// Scientific with four decimals: `1.0000e+08`
    Scientific,
}

fn float_style(values: &[f64]) -> FloatStyle {
    let finite: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
    let nonzero: Vec<f64> = finite
        .iter()
        .map(|v| v.abs())
        .filter(|&v| v > 0.0)
        .collect();
    let max = nonzero.iter().copied().fold(0.0, f64::max);
    let min = nonzero.iter().copied().fold(f64::INFINITY, f64::min);
    let wide = !nonzero.is_empty() && (max / min > 1000.0 || max > 1e8 || min < 1e-4);
    if finite.iter().all(|v| v.fract() == 0.0) {
        if max > 1e8 {
            FloatStyle::Scientific
        } else {
            FloatStyle::Whole
        }
    } else if wide {
        FloatStyle::Scientific
    } else {
        FloatStyle::Fixed
    }
}

/// Floats formatted together in the style the value tables pick for them (fixed, whole or
/// scientific), so labels elsewhere read like the table.
pub(crate) fn format_floats(values: &[f64]) -> Vec<String> {
    let style = float_style(values);
    values.iter().map(|&v| format_float(v, &style)).collect()
}

fn format_float(v: f64, style: &FloatStyle) -> String {
    if v.is_nan() {
        return "nan".into();
    }
    if v.is_infinite() {
        return if v > 0.0 { "inf".into() } else { "-inf".into() };
    }
    match style {
        FloatStyle::Whole => format!("{v:.0}."),
        FloatStyle::Fixed => format!("{v:.4}"),
        FloatStyle::Scientific => {
            let s = format!("{v:.4e}");
            let (mantissa, exp) = s.split_once('e').unwrap_or((&s, "0"));
            let exp: i32 = exp.parse().unwrap_or(0);
            format!(
                "{mantissa}e{}{:02}",
                if exp < 0 { '-' } else { '+' },
                exp.abs()
            )
        }
    }
}

/// Every printed element of `t` as text, in row-major order of the summary.
pub(crate) fn element_strings(t: &Tensor) -> Result<Vec<String>> {
    let bytes = t.host_bytes()?;
    let scalars: Vec<Scalar> = (0..t.numel())
        .map(|i| scalar_at(t.dtype(), &bytes, i))
        .collect();
    Ok(if t.dtype().is_float() {
        let values: Vec<f64> = scalars.iter().map(|s| s.to_f64()).collect();
        format_floats(&values)
    } else {
        scalars.iter().map(|s| s.to_string()).collect()
    })
}

struct Layouter<'a> {
    strs: &'a [String],
    cut: &'a [bool],
    width: usize,
}

impl Layouter<'_> {
    /// Writes the sub-tensor starting at element `first` with shape `shape` (axes `axis..`).
    fn write(&self, out: &mut String, first: usize, shape: &[usize], axis: usize, indent: usize) {
        if shape.is_empty() {
            out.push_str(&format!("{:>w$}", self.strs[first], w = self.width));
            return;
        }
        out.push('[');
        let inner: usize = shape[1..].iter().product();
        let per_line = ((LINE_WIDTH.saturating_sub(indent + 1)) / (self.width + 2)).max(1);
        for i in 0..shape[0] {
            if i > 0 {
                if shape.len() == 1 {
                    out.push(',');
                    if i % per_line == 0 {
                        out.push('\n');
                        out.push_str(&" ".repeat(indent + 1));
                    } else {
                        out.push(' ');
                    }
                } else {
                    out.push(',');
                    out.push_str(&"\n".repeat(shape.len() - 1));
                    out.push_str(&" ".repeat(indent + 1));
                }
            }
            if self.cut[axis] && i == EDGE {
                out.push_str("...,");
                if shape.len() == 1 {
                    out.push(' ');
                } else {
                    out.push_str(&"\n".repeat(shape.len() - 1));
                    out.push_str(&" ".repeat(indent + 1));
                }
            }
            self.write(out, first + i * inner, &shape[1..], axis + 1, indent + 1);
        }
        out.push(']');
    }
}

impl Tensor {
    /// The values as PyTorch would print them (summarized past 1000 elements), without the
    /// footer. Waits only for the work this tensor needs.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let t = Tensor::arange(0.0, 1.0, 0.25, DType::F32, &Device::cpu()).unwrap();
    /// assert_eq!(t.format_values().unwrap(), "[0.0000, 0.2500, 0.5000, 0.7500]");
    /// ```
    pub fn format_values(&self) -> Result<String> {
        let (shown, cut) = summary(self)?;
        let strs = element_strings(&shown)?;
        let width = strs.iter().map(|s| s.len()).max().unwrap_or(0);
        let mut out = String::new();
        Layouter {
            strs: &strs,
            cut: &cut,
            width,
        }
        .write(&mut out, 0, shown.shape(), 0, 0);
        Ok(out)
    }
}

/// Prints the values like PyTorch, then a footer with shape, dtype and device.
///
/// ```
/// use strata_core::{Device, DType, Tensor};
/// let t = Tensor::eye(2, DType::I32, &Device::cpu()).unwrap();
/// assert_eq!(t.to_string(), "[[1, 0],\n [0, 1]]\nshape=[2, 2], dtype=i32, device=cpu");
/// let x = Tensor::ones([1], DType::F32, &Device::cpu()).unwrap().requires_grad_(true).unwrap();
/// assert!(x.to_string().ends_with("requires_grad=true"));
/// assert!(x.exp().unwrap().to_string().ends_with("grad_fn=ExpBackward"));
/// ```
impl fmt::Display for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.format_values() {
            Ok(values) => writeln!(f, "{values}")?,
            Err(e) => writeln!(f, "<values unavailable: {e}>")?,
        }
        write!(
            f,
            "shape={:?}, dtype={}, device={}",
            self.shape(),
            self.dtype(),
            self.device().name()
        )?;
        match self.autograd_note() {
            Some(note) => write!(f, ", {note}"),
            None => Ok(()),
        }
    }
}

/// A one-line summary with the values, as PyTorch's `repr` shows them: shape, layout, dtype,
/// device, then the values on one line (summarized past 1000 elements like `Display`). It
/// waits for the work this tensor needs and reads it from the device, so that a notebook cell
/// ending in an op's `Result` without `?` (shown through `Debug` as `Ok(Tensor { … })`) still
/// shows the numbers.
///
/// ```
/// use strata_core::{Device, DType, Tensor};
/// let t = Tensor::eye(2, DType::I32, &Device::cpu()).unwrap();
/// assert_eq!(format!("{t:?}"), "Tensor { shape: [2, 2], strides: [2, 1], offset: 0, \
///     dtype: i32, device: cpu, values: [[1, 0], [0, 1]] }");
/// ```
impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Tensor {{ shape: {:?}, strides: {:?}, offset: {}, dtype: {}, device: {}{}",
            self.shape(),
            self.strides(),
            self.offset(),
            self.dtype(),
            self.device().name(),
            self.autograd_note()
                .map_or(String::new(), |n| format!(", {}", n.replace('=', ": ")))
        )?;
        match self.format_values() {
            Ok(values) => write!(f, ", values: {} }}", one_line(&values)),
            Err(e) => write!(f, ", values: <unavailable: {e}> }}"),
        }
    }
}

/// `Display`'s rows joined on one line (its indentation and blank lines dropped).
fn one_line(values: &str) -> String {
    let lines: Vec<&str> = values
        .lines()
        .map(str::trim_start)
        .filter(|l| !l.is_empty())
        .collect();
    lines.join(" ")
}
