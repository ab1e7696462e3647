//! A histogram's operands ([`Kernel::Histogram`](crate::ir::Kernel::Histogram)), checked once
//! for every backend, and the plan its GPU kernels share: how many private copies of the bins
//! a block (workgroup) keeps in shared memory before it adds them to the output once.

use crate::backend::{KernelArgs, Operand};
use crate::dtype::DType;
use crate::error::{Error, Result};

/// The operands of a histogram: the values, their weights (when weighted) and the bins.
#[derive(Debug)]
pub struct HistogramOperands<'a> {
    /// The values binned (contiguous from offset 0).
    pub values: &'a Operand,
    /// Each value's weight, laid out like `values`, of the output's dtype.
    pub weights: Option<&'a Operand>,
    /// The `[bins]` output, accumulated into.
    pub out: &'a Operand,
    /// Elements binned.
    pub n: usize,
}

impl<'a> HistogramOperands<'a> {
    /// Checks `args` for a histogram of `bins` bins.
    ///
    /// ```
    /// use strata_core::{backend::KernelArgs, lower::histogram_plan::HistogramOperands};
    /// let none = KernelArgs { outputs: vec![], inputs: vec![], scalars: vec![] };
    /// assert!(HistogramOperands::of(&none, 4, false).is_err());
    /// ```
    pub fn of(args: &'a KernelArgs, bins: usize, weighted: bool) -> Result<HistogramOperands<'a>> {
        let ([out], Some(values)) = (args.outputs.as_slice(), args.inputs.first()) else {
            return Err(Error::Invalid(
                "a histogram takes its values (and weights) and one output".into(),
            ));
        };
        let weights = if weighted { args.inputs.get(1) } else { None };
        if args.inputs.len() != 1 + usize::from(weighted) || (weighted && weights.is_none()) {
            return Err(Error::Invalid(format!(
                "a histogram{} takes {} inputs, got {}",
                if weighted { " with weights" } else { "" },
                1 + usize::from(weighted),
                args.inputs.len()
            )));
        }
        let n = values.layout.numel();
        let dense = |o: &Operand| o.layout.is_contiguous() && o.layout.offset() == 0;
        let acc_ok = matches!(out.dtype, DType::U32 | DType::U64 | DType::F32 | DType::F64)
            && (weighted || !out.dtype.is_float());
        if out.layout.shape() != [bins] || !dense(out) || !dense(values) || !acc_ok {
            return Err(Error::Invalid(format!(
                "a histogram writes [{bins}] counts (u32/u64) or weight sums (f32/f64) from dense \
                 values: output {:?} {}, values {:?}",
                out.layout.shape(),
                out.dtype,
                values.layout.shape()
            )));
        }
        if let Some(w) = weights {
            if w.layout.numel() != n || !dense(w) || w.dtype != out.dtype {
                return Err(Error::Invalid(format!(
                    "a histogram's weights are laid out like its {n} values, of the output's \
                     dtype {}: got {:?} {}",
                    out.dtype,
                    w.layout.shape(),
                    w.dtype
                )));
            }
        }
        Ok(HistogramOperands {
            values,
            weights,
            out,
            n,
        })
    }
}

/// How many private copies of the bins a block keeps in `shared` bytes of shared memory
/// (each bin `item` bytes): up to `most` (one per warp spreads the atomics of a few hot bins),
/// a power of two; 0 when one copy does not fit (then every element adds to the output).
///
/// ```
/// use strata_core::lower::histogram_plan::private_copies;
/// assert_eq!(private_copies(64, 4, 48 << 10, 8), 8);
/// assert_eq!(private_copies(4096, 4, 48 << 10, 8), 2);
/// assert_eq!(private_copies(100_000, 4, 48 << 10, 8), 0);
/// ```
pub fn private_copies(bins: usize, item: usize, shared: usize, most: usize) -> usize {
    let one = bins.saturating_mul(item).max(1);
    let fit = shared / one;
    if fit == 0 {
        return 0;
    }
    let copies = fit.min(most.max(1));
    1 << copies.ilog2()
}
