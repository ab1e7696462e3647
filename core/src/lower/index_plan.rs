//! The row path of a gather: when every index value selects a whole contiguous run (a row of
//! `index_select(0, …)` on a row-major matrix, a slab of a 3-D tensor), the launch moves runs
//! in vectors of up to 16 bytes and reads each index value once per vector, instead of
//! decoding every element's coordinates and reading its index value.
//!
//! ```
//! use strata_core::lower::{index_plan::rows, operands::IndexOperands};
//! use strata_core::{ir::IndexKind, backend::KernelArgs, DType, Device, Tensor};
//! let dev = Device::cpu();
//! let src = Tensor::zeros([8, 64], DType::F32, &dev).unwrap();
//! let index = Tensor::zeros([3, 1], DType::I64, &dev).unwrap().broadcast_to([3, 64]).unwrap();
//! let out = Tensor::zeros([3, 64], DType::F32, &dev).unwrap();
//! let args = KernelArgs {
//!     outputs: vec![out.operand().unwrap()],
//!     inputs: vec![src.operand().unwrap(), index.operand().unwrap()],
//!     scalars: vec![],
//! };
//! let ops = IndexOperands::of(IndexKind::Gather, 0, &args).unwrap();
//! let plan = rows(&ops, [0, 0], 16).unwrap();
//! assert_eq!((plan.outer, plan.count, plan.inner, plan.vector), (1, 3, 64, 4));
//! ```

use super::operands::IndexOperands;
use crate::ir::IndexKind;

/// A gather that moves whole runs: for `o < outer`, `j < count`, the run of `inner` elements
/// at `src + o·src_strides[0] + index[o·index_strides[0] + j·index_strides[1]]·src_strides[1]`
/// goes to `out + o·out_strides[0] + j·out_strides[1]`. Strides are in elements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexRows {
    /// The axes before the indexed one, merged.
    pub outer: usize,
    /// Positions along the indexed axis of the output.
    pub count: usize,
    /// Contiguous elements per run (the axes after the indexed one, merged).
    pub inner: usize,
    /// Source strides: outer, then along the indexed axis.
    pub src_strides: [isize; 2],
    /// Index strides: outer, then along the indexed axis.
    pub index_strides: [isize; 2],
    /// Output strides: outer, then along the indexed axis.
    pub out_strides: [isize; 2],
    /// Elements per vector: `inner` and every source and output stride are multiples of it,
    /// and both base addresses are aligned to it.
    pub vector: usize,
}

/// The row plan of a gather, or `None` when the index varies inside a run, a run is not
/// contiguous in the source or the output, the outer axes do not merge, or runs are shorter
/// than 4 elements (the element path is as fast then). `addresses`: the byte addresses of the
/// source's and the output's first elements; `vector_bytes`: the widest access the target has.
pub fn rows(ops: &IndexOperands, addresses: [u64; 2], vector_bytes: usize) -> Option<IndexRows> {
    if ops.kind != IndexKind::Gather {
        return None;
    }
    let space = ops.out.layout.shape();
    let a = ops.axis;
    let (src, index, out) = (
        ops.src.layout.strides(),
        ops.index.layout.strides(),
        ops.out.layout.strides(),
    );
    // After the axis: the index is constant, source and output are dense over the space.
    let mut dense = 1isize;
    for d in (a + 1..space.len()).rev() {
        if space[d] != 1 && (index[d] != 0 || src[d] != dense || out[d] != dense) {
            return None;
        }
        dense *= space[d] as isize;
    }
    let inner = dense as usize;
    if inner < 4 {
        return None;
    }
    // Before the axis: one merged axis for every operand.
    let mut outer = 1usize;
    let mut outer_strides = [0isize; 3];
    for d in (0..a).rev() {
        if space[d] == 1 {
            continue;
        }
        let st = [src[d], index[d], out[d]];
        if outer == 1 {
            outer_strides = st;
        } else if (0..3).any(|k| st[k] != outer_strides[k] * outer as isize) {
            return None;
        }
        outer *= space[d];
    }
    let count = space.get(a).copied().unwrap_or(1);
    let (itemsize, base) = (ops.out.dtype.itemsize(), [addresses[0], addresses[1]]);
    let mut vector = (vector_bytes / itemsize).max(1);
    let fits = |v: usize| {
        let bytes = (v * itemsize) as u64;
        inner.is_multiple_of(v)
            && base.iter().all(|&p| p % bytes == 0)
            && [outer_strides[0], src[a], outer_strides[2], out[a]]
                .iter()
                .all(|&s| s.unsigned_abs() % v == 0)
    };
    while vector > 1 && !fits(vector) {
        vector /= 2;
    }
    Some(IndexRows {
        outer,
        count,
        inner,
        src_strides: [outer_strides[0], src[a]],
        index_strides: [outer_strides[1], index[a]],
        out_strides: [outer_strides[2], out[a]],
        vector,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::KernelArgs;
    use crate::{DType, Device, Tensor};

    fn plan_of(src: &Tensor, index: &Tensor, out: &Tensor, axis: usize) -> Option<IndexRows> {
        let args = KernelArgs {
            outputs: vec![out.operand().unwrap()],
            inputs: vec![src.operand().unwrap(), index.operand().unwrap()],
            scalars: vec![],
        };
        let ops = IndexOperands::of(IndexKind::Gather, axis, &args).unwrap();
        rows(&ops, [0, 0], 16)
    }

    #[test]
    fn runs_after_the_axis_merge_and_outer_axes_merge() {
        let dev = Device::cpu();
        let src = Tensor::zeros([2, 3, 5, 4, 2], DType::F16, &dev).unwrap();
        let idx = Tensor::zeros([1, 1, 7, 1, 1], DType::I64, &dev).unwrap();
        let idx = idx.broadcast_to([2, 3, 7, 4, 2]).unwrap();
        let out = Tensor::zeros([2, 3, 7, 4, 2], DType::F16, &dev).unwrap();
        let p = plan_of(&src, &idx, &out, 2).unwrap();
        assert_eq!((p.outer, p.count, p.inner, p.vector), (6, 7, 8, 8));
        assert_eq!((p.src_strides, p.out_strides), ([40, 8], [56, 8]));
        assert_eq!(p.index_strides, [0, 1]);
    }

    #[test]
    fn no_row_path_when_the_index_varies_inside_a_run_or_runs_are_strided() {
        let dev = Device::cpu();
        let src = Tensor::zeros([8, 16], DType::F32, &dev).unwrap();
        let full = Tensor::zeros([8, 16], DType::I64, &dev).unwrap();
        let out = Tensor::zeros([8, 16], DType::F32, &dev).unwrap();
        assert_eq!(plan_of(&src, &full, &out, 0), None);
        let row = Tensor::zeros([8, 1], DType::I64, &dev).unwrap();
        let row = row.broadcast_to([8, 16]).unwrap();
        assert!(plan_of(&src, &row, &out, 0).is_some());
        assert_eq!(plan_of(&src.t().unwrap(), &row, &out, 0), None);
        // Runs of 2 take the element path.
        let (s2, o2) = (src.reshape([64, 2]).unwrap(), out.reshape([64, 2]).unwrap());
        let r2 = Tensor::zeros([64, 1], DType::I64, &dev).unwrap();
        assert_eq!(
            plan_of(&s2, &r2.broadcast_to([64, 2]).unwrap(), &o2, 0),
            None
        );
    }

    #[test]
    fn vectors_shrink_to_the_alignment_of_runs() {
        let dev = Device::cpu();
        let src = Tensor::zeros([8, 6], DType::F32, &dev).unwrap();
        let idx = Tensor::zeros([3, 1], DType::I64, &dev).unwrap();
        let out = Tensor::zeros([3, 6], DType::F32, &dev).unwrap();
        let p = plan_of(&src, &idx.broadcast_to([3, 6]).unwrap(), &out, 0).unwrap();
        assert_eq!(p.vector, 2);
    }
}
