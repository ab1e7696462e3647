//! Batch norm's statistics in one read
//! ([`Kernel::ChannelMoments`](crate::ir::Kernel::ChannelMoments)): its operands, checked
//! once, and the launch plan a GPU backend renders. A block takes a slice of a channel (its
//! values split into `parts` equal slices, enough blocks to fill the device); each thread
//! keeps a running count, mean and sum of squared deviations (Welford's, merged a few vectors
//! at a time by Chan's formula), the block merges its threads' the same way, and one thread
//! stores the slice's mean and variance. With one slice a channel that is the channel's; with
//! several, a second small launch merges them — equal slices make the channel's mean the
//! slices' mean and its variance the mean of each slice's variance plus its mean's squared
//! distance from the channel's. The composition reads `x` twice (the mean, then the variance
//! around it). Batch norm's backward sums
//! ([`Kernel::ChannelGradSums`](crate::ir::Kernel::ChannelGradSums): `Σg` and `Σg·x̂`) take
//! the same slices, each thread adding its values of `x` and `g` read at the same places, and
//! the slices' sums are added the same way; the composition reads `g` twice.
//!
//! ```
//! use strata_core::lower::moments_plan::{parts, SHORTEST_RUN};
//! use strata_core::target::Target;
//! let t = Target { parallel_slots: 132 * 2048, ..Target::cpu(1) };
//! // [256, 256, 28, 28]: 256 channels of 200,704 values, two slices each.
//! assert_eq!(parts(256, 256 * 784, &t), 2);
//! // Eight channels: more slices, each a divisor of the channel's values.
//! assert_eq!(parts(8, 64 * 1024, &t), 32);
//! assert_eq!(parts(8, 4099, &t), 1); // a prime count of values: one slice
//! assert!(SHORTEST_RUN >= 16);
//! ```

use crate::backend::{KernelArgs, Operand};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::target::Target;

/// Threads of a block.
pub const THREADS: usize = 256;

/// Vectors each thread loads before it merges them into its running statistics: loads in
/// flight while the block's earlier ones are still arriving.
pub const ROUND: usize = 4;

/// The fewest values a slice holds (a block's threads each merge a few rounds).
pub const SHORTEST_SLICE: usize = 2048;

/// The shortest contiguous run (`inner`, batch norm's `H·W`) core takes this kernel for:
/// a block reads a channel's runs one after another, and runs shorter than this leave most of
/// each memory transaction unused (`[N, C]` inputs, `inner` = 1, take the two reductions, whose
/// lanes run along the channels).
pub const SHORTEST_RUN: usize = 16;

/// How many equal slices share each of `channels` channels of `count` values: about two
/// blocks of [`THREADS`] a multiprocessor of `target` (a quarter of its threads), each slice a
/// divisor of `count` of at least [`SHORTEST_SLICE`] values (one where there is none). More,
/// shorter slices measured slower: on an H200, [256, 256, 28, 28] f32 took 64 µs in 256 or
/// 512 blocks, 70–74 in 1,024, 119 in 8,192 (each block's start and merge over fewer values).
pub fn parts(channels: usize, count: usize, target: &Target) -> usize {
    let wanted = (target.parallel_slots / (4 * THREADS))
        .div_ceil(channels.max(1))
        .max(1);
    (1..=wanted.min(count / SHORTEST_SLICE).max(1))
        .rev()
        .find(|&p| count.is_multiple_of(p))
        .unwrap_or(1)
}

/// The operands of a channel moments kernel, checked.
#[derive(Debug)]
pub struct MomentsOperands<'a> {
    /// The input, `[outer, channels, inner]`.
    pub x: &'a Operand,
    /// Each channel's mean, `[channels]`.
    pub mean: &'a Operand,
    /// Each channel's biased variance, `[channels]`.
    pub var: &'a Operand,
    /// `x`'s leading axis (batch norm's samples).
    pub outer: usize,
    /// Channels.
    pub channels: usize,
    /// `x`'s trailing axis (batch norm's positions).
    pub inner: usize,
    /// The dtype of every operand.
    pub dtype: DType,
}

impl<'a> MomentsOperands<'a> {
    /// Checks `args` for `ChannelMoments`.
    ///
    /// ```
    /// use strata_core::lower::moments_plan::MomentsOperands;
    /// use strata_core::{backend::KernelArgs, DType, Device, Tensor};
    /// let dev = Device::cpu();
    /// let z = |s: &[usize], d| Tensor::zeros(s.to_vec(), d, &dev).unwrap().operand().unwrap();
    /// let mut args = KernelArgs {
    ///     outputs: vec![z(&[3], DType::F16), z(&[3], DType::F16)],
    ///     inputs: vec![z(&[4, 3, 16], DType::F16)],
    ///     scalars: vec![],
    /// };
    /// let ops = MomentsOperands::of(&args).unwrap();
    /// assert_eq!((ops.outer, ops.channels, ops.inner), (4, 3, 16));
    /// args.outputs[1] = z(&[3], DType::F32); // not x's dtype
    /// assert!(MomentsOperands::of(&args).is_err());
    /// ```
    pub fn of(args: &'a KernelArgs) -> Result<MomentsOperands<'a>> {
        let (ins, outs) = (args.inputs.as_slice(), args.outputs.as_slice());
        let ([x], [mean, var]) = (ins, outs) else {
            return Err(Error::Invalid(format!(
                "channel moments take one input and two outputs: got {} and {}",
                ins.len(),
                outs.len()
            )));
        };
        let dtype = x.dtype;
        let [outer, channels, inner] = *x.layout.shape() else {
            return Err(Error::Invalid(format!(
                "channel moments take x of shape [outer, channels, inner]: got {:?}",
                x.layout.shape()
            )));
        };
        if !dtype.is_float() || !x.layout.is_contiguous() {
            return Err(Error::Invalid(format!(
                "channel moments take a contiguous float x: got dtype {dtype}, strides {:?}",
                x.layout.strides()
            )));
        }
        for (name, o) in [("mean", mean), ("var", var)] {
            if o.layout.shape() != [channels] || o.dtype != dtype || !o.layout.is_contiguous() {
                return Err(Error::Invalid(format!(
                    "channel moments of {channels} channels take {name} contiguous of shape \
                     [{channels}] and x's dtype {dtype}: got shape {:?}, strides {:?}, dtype {}",
                    o.layout.shape(),
                    o.layout.strides(),
                    o.dtype
                )));
            }
        }
        Ok(MomentsOperands {
            x,
            mean,
            var,
            outer,
            channels,
            inner,
            dtype,
        })
    }
}

/// How a GPU backend launches channel moments: a block of [`THREADS`] a slice (block
/// `c·parts + p` takes slice `p` of channel `c`), each thread vectors `t, t + THREADS, …` of
/// the slice, [`ROUND`] of them a round; with several slices, a second launch merges them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MomentsPlan {
    /// Elements per vector load (1: none); a vector never crosses a run.
    pub vector: usize,
    /// Slices a channel ([`parts`]).
    pub parts: usize,
    /// Values a slice.
    pub count: usize,
}

/// Plans `ops` on `target`, `x` starting at `address`.
///
/// ```
/// use strata_core::lower::moments_plan::{plan, MomentsOperands};
/// use strata_core::target::Target;
/// use strata_core::{backend::KernelArgs, DType, Device, Tensor};
/// let dev = Device::cpu();
/// let z = |s: &[usize], d| Tensor::zeros(s.to_vec(), d, &dev).unwrap().operand().unwrap();
/// let args = KernelArgs {
///     outputs: vec![z(&[256], DType::F32), z(&[256], DType::F32)],
///     inputs: vec![z(&[256, 256, 784], DType::F32)],
///     scalars: vec![],
/// };
/// let ops = MomentsOperands::of(&args).unwrap();
/// let t = Target { vector_bytes: 16, parallel_slots: 132 * 2048, ..Target::cpu(1) };
/// let p = plan(&ops, 256, &t);
/// assert_eq!((p.vector, p.parts, p.count), (4, 2, 100352));
/// assert_eq!(plan(&ops, 4, &t).vector, 1); // x not on a vector
/// ```
pub fn plan(ops: &MomentsOperands, address: u64, target: &Target) -> MomentsPlan {
    slices(
        ops.outer,
        ops.channels,
        ops.inner,
        ops.dtype,
        &[address],
        target,
    )
}

/// Plans batch norm's backward sums `ops` on `target`, `x` and `g` starting at `addresses` (as
/// [`plan`]: both are read at the same places).
///
/// ```
/// use strata_core::lower::moments_plan::{grad_plan, GradSumsOperands};
/// use strata_core::target::Target;
/// use strata_core::{backend::KernelArgs, DType, Device, Tensor};
/// let dev = Device::cpu();
/// let z = |s: &[usize]| Tensor::zeros(s.to_vec(), DType::F32, &dev).unwrap().operand().unwrap();
/// let args = KernelArgs {
///     outputs: vec![z(&[64]), z(&[64])],
///     inputs: vec![z(&[256, 64, 1024]), z(&[256, 64, 1024]), z(&[64]), z(&[64])],
///     scalars: vec![],
/// };
/// let ops = GradSumsOperands::of(&args).unwrap();
/// let t = Target { vector_bytes: 16, parallel_slots: 132 * 2048, ..Target::cpu(1) };
/// let p = grad_plan(&ops, [0, 16], &t);
/// assert_eq!((p.vector, p.parts, p.count), (4, 4, 65536));
/// assert_eq!(grad_plan(&ops, [0, 8], &t).vector, 2); // g on 8 bytes
/// ```
pub fn grad_plan(ops: &GradSumsOperands, addresses: [u64; 2], target: &Target) -> MomentsPlan {
    slices(
        ops.outer,
        ops.channels,
        ops.inner,
        ops.dtype,
        &addresses,
        target,
    )
}

/// The slices of `channels` channels of `outer·inner` values of `dtype`, read from
/// `addresses`.
fn slices(
    outer: usize,
    channels: usize,
    inner: usize,
    dtype: DType,
    addresses: &[u64],
    target: &Target,
) -> MomentsPlan {
    let values = outer * inner;
    let parts = parts(channels, values, target);
    let count = values / parts;
    let size = dtype.itemsize();
    let lanes = (target.vector_bytes / size).clamp(1, 4);
    let vector = [lanes, 2, 1]
        .into_iter()
        .find(|&v| {
            v <= lanes
                && inner.is_multiple_of(v)
                && count.is_multiple_of(v)
                && addresses
                    .iter()
                    .all(|a| a.is_multiple_of((v * size) as u64))
        })
        .unwrap_or(1);
    MomentsPlan {
        vector,
        parts,
        count,
    }
}

/// The operands of batch norm's backward sums
/// ([`Kernel::ChannelGradSums`](crate::ir::Kernel::ChannelGradSums)), checked.
#[derive(Debug)]
pub struct GradSumsOperands<'a> {
    /// The normalized input, `[outer, channels, inner]`.
    pub x: &'a Operand,
    /// The upstream gradient, as `x`.
    pub g: &'a Operand,
    /// Each channel's mean, `[channels]`.
    pub mean: &'a Operand,
    /// Each channel's `1 / sqrt(var + eps)`, `[channels]`.
    pub rstd: &'a Operand,
    /// Each channel's `Σg`, `[channels]`.
    pub sum_g: &'a Operand,
    /// Each channel's `Σg·x̂`, `[channels]`.
    pub sum_gx: &'a Operand,
    /// `x`'s leading axis.
    pub outer: usize,
    /// Channels.
    pub channels: usize,
    /// `x`'s trailing axis.
    pub inner: usize,
    /// The dtype of every operand.
    pub dtype: DType,
}

impl<'a> GradSumsOperands<'a> {
    /// Checks `args` for `ChannelGradSums`.
    pub fn of(args: &'a KernelArgs) -> Result<GradSumsOperands<'a>> {
        let (ins, outs) = (args.inputs.as_slice(), args.outputs.as_slice());
        let ([x, g, mean, rstd], [sum_g, sum_gx]) = (ins, outs) else {
            return Err(Error::Invalid(format!(
                "channel gradient sums take four inputs and two outputs: got {} and {}",
                ins.len(),
                outs.len()
            )));
        };
        let dtype = x.dtype;
        let [outer, channels, inner] = *x.layout.shape() else {
            return Err(Error::Invalid(format!(
                "channel gradient sums take x of shape [outer, channels, inner]: got {:?}",
                x.layout.shape()
            )));
        };
        let full = x.layout.shape().to_vec();
        for (name, o, shape) in [
            ("x", x, &full),
            ("g", g, &full),
            ("mean", mean, &vec![channels]),
            ("rstd", rstd, &vec![channels]),
            ("Σg", sum_g, &vec![channels]),
            ("Σg·x̂", sum_gx, &vec![channels]),
        ] {
            if o.layout.shape() != shape.as_slice()
                || o.dtype != dtype
                || !o.layout.is_contiguous()
                || !dtype.is_float()
            {
                return Err(Error::Invalid(format!(
                    "channel gradient sums take {name} contiguous of shape {shape:?} and float \
                     dtype {dtype}: got shape {:?}, strides {:?}, dtype {}",
                    o.layout.shape(),
                    o.layout.strides(),
                    o.dtype
                )));
            }
        }
        Ok(GradSumsOperands {
            x,
            g,
            mean,
            rstd,
            sum_g,
            sum_gx,
            outer,
            channels,
            inner,
            dtype,
        })
    }
}
