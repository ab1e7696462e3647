//! The CPU index kernels (gather, scatter, scatter-add): element by element, following the
//! index values.

use super::block::{binary, with_block, with_dtype, Block, Prim};
use super::strided::View;
use crate::backend::{KernelArgs, Operand};
use crate::error::{Error, Result};
use crate::ir::{BinaryOp, IndexKind};
use crate::layout::Layout;
use crate::lower::operands::IndexOperands;

/// Row-major multi-indices of `shape`, one at a time.
fn for_each_index(shape: &[usize], mut f: impl FnMut(usize, &[usize]) -> Result<()>) -> Result<()> {
    let n: usize = shape.iter().product();
    let mut idx = vec![0usize; shape.len()];
    for flat in 0..n {
        f(flat, &idx)?;
        for k in (0..shape.len()).rev() {
            idx[k] += 1;
            if idx[k] < shape[k] {
                break;
            }
            idx[k] = 0;
        }
    }
    Ok(())
}

/// All index values, row-major.
fn index_values(index: &Operand) -> Result<Vec<i64>> {
    let view = View::new(index)?;
    let mut scratch = Vec::new();
    // SAFETY: bounds checked by View::new.
    Ok(unsafe { view.load::<i64>(0, index.layout.numel(), &mut scratch) })
}

/// The storage position in `layout` of `idx` with coordinate `axis` replaced by `at`.
fn position_with(layout: &Layout, idx: &[usize], axis: usize, at: i64) -> Result<usize> {
    let n = layout.shape()[axis];
    if at < 0 || at as usize >= n {
        return Err(Error::Index(format!(
            "index {at} is out of range for axis {axis} of size {n}"
        )));
    }
    let mut p = layout.offset() as isize;
    for (k, (&i, &s)) in idx.iter().zip(layout.strides()).enumerate() {
        p += if k == axis { at as isize } else { i as isize } * s;
    }
    Ok(p as usize)
}

/// Reads one element at a storage position.
fn read(view: &View, dtype: crate::dtype::DType, pos: usize) -> Block {
    let one = Layout::new(vec![], vec![], pos).expect("rank-0 layout");
    let v = view.with_layout(&one);
    let mut scratch = Vec::new();
    // SAFETY: the position comes from a layout inside the operand's bounds.
    with_dtype!(dtype, T => T::wrap(unsafe { v.load::<T>(0, 1, &mut scratch) }))
}

/// Writes one element at a storage position.
fn write(view: &View, pos: usize, value: &Block) {
    let one = Layout::new(vec![], vec![], pos).expect("rank-0 layout");
    let v = view.with_layout(&one);
    let mut scratch = Vec::new();
    // SAFETY: as `read`; kernels run one at a time on the CPU.
    with_block!(value, x: T => unsafe { v.store::<T>(0, x, &mut scratch) });
}

/// Executes an index kernel (`Gather`, `Scatter` or `ScatterAdd`).
pub(crate) fn run(kind: IndexKind, axis: usize, args: &KernelArgs) -> Result<()> {
    let IndexOperands {
        src,
        index,
        out,
        flag,
        ..
    } = IndexOperands::of(kind, axis, args)?;
    let mut values = index_values(index)?;
    let (vs, vo) = (View::new(src)?, View::new(out)?);
    if let Some(flag) = flag {
        // A flagged gather reads negative values from the end, and flags (and skips) the
        // positions still outside the axis, as the GPU kernels do.
        let n = src.layout.shape()[axis] as i64;
        let mut outside = false;
        for v in &mut values {
            if *v < 0 {
                *v += n;
            }
            outside |= *v < 0 || *v >= n;
        }
        if outside {
            let view = View::new(flag)?;
            // SAFETY: the flag's one element lies inside its buffer (View::new checked).
            unsafe { view.store::<u32>(0, &[1], &mut Vec::new()) };
            return Ok(());
        }
    }
    if kind == IndexKind::Gather {
        let out_shape = out.layout.shape().to_vec();
        return for_each_index(&out_shape, |flat, idx| {
            let from = position_with(&src.layout, idx, axis, values[flat])?;
            let to = out.layout.position(idx);
            write(&vo, to, &read(&vs, src.dtype, from));
            Ok(())
        });
    }
    let shape = index.layout.shape().to_vec();
    for_each_index(&shape, |flat, idx| {
        let to = position_with(&out.layout, idx, axis, values[flat])?;
        let mut v = read(&vs, src.dtype, src.layout.position(idx));
        if kind == IndexKind::ScatterAdd {
            v = binary(BinaryOp::Add, &read(&vo, out.dtype, to), &v)?;
        }
        write(&vo, to, &v);
        Ok(())
    })
}
