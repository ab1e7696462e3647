//! Strided operands on the CPU: a raw base pointer plus a layout, read and written a block of
//! row-major elements at a time.

use super::block::Prim;
use super::buffer::CpuBuffer;
use crate::backend::Operand;
use crate::error::{Error, Result};
use crate::layout::Layout;

/// Elements per block: large enough to amortize dispatch, small enough to stay in L1/L2.
pub(crate) const BLOCK: usize = 2048;
/// Work at least this large is split across threads.
pub(crate) const PARALLEL_MIN: usize = 1 << 16;

impl Layout {
    /// The storage position of row-major element `i`, into `out[0]`.
    pub(crate) fn positions_into(&self, i: usize, out: &mut Vec<usize>) {
        let mut index = vec![0usize; self.ndim()];
        let mut rest = i;
        for k in (0..self.ndim()).rev() {
            index[k] = rest % self.shape()[k];
            rest /= self.shape()[k];
        }
        out.clear();
        out.push(self.position(&index));
    }
}

/// How many worker threads large work is split across. Read once: `available_parallelism`
/// reads cgroup files on Linux, which cost tens of microseconds per call.
pub(crate) fn threads() -> usize {
    static THREADS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *THREADS.get_or_init(|| std::thread::available_parallelism().map_or(1, |t| t.get()))
}

/// A strided operand resolved to a raw base pointer.
pub(crate) struct View<'a> {
    base: *mut u8,
    layout: &'a Layout,
    contiguous: bool,
    itemsize: usize,
}

// SAFETY: threads write disjoint output elements (core rejects self-overlapping outputs) and
// only read inputs; the buffers outlive the scoped threads.
unsafe impl Send for View<'_> {}
unsafe impl Sync for View<'_> {}

impl<'a> View<'a> {
    pub(crate) fn new(op: &'a Operand) -> Result<View<'a>> {
        let buf = CpuBuffer::of(op.buffer.as_ref())?;
        if op.layout.numel() > 0 {
            let (lo, hi) = op.layout.span();
            let end = hi as usize * op.dtype.itemsize();
            if lo < 0 || end > buf.len() {
                return Err(Error::Index(format!(
                    "view {:?} of {} reaches outside its buffer of {} bytes",
                    op.layout,
                    op.dtype,
                    buf.len()
                )));
            }
        }
        Ok(View {
            base: buf.ptr(),
            layout: &op.layout,
            contiguous: op.layout.is_contiguous(),
            itemsize: op.dtype.itemsize(),
        })
    }

    /// The start of the buffer (element 0 of the storage, not of the layout).
    pub(crate) fn base_ptr(&self) -> *mut u8 {
        self.base
    }

    /// The same storage seen through another layout (positions still in elements).
    pub(crate) fn with_layout<'b>(&self, layout: &'b Layout) -> View<'b> {
        View {
            base: self.base,
            layout,
            contiguous: layout.is_contiguous(),
            itemsize: self.itemsize,
        }
    }

    /// Storage positions of row-major elements `start..start + len`.
    pub(crate) fn positions(&self, start: usize, len: usize, out: &mut Vec<usize>) {
        out.clear();
        if len == 0 {
            return; // also keeps a zero-size axis out of the index arithmetic below
        }
        let shape = self.layout.shape();
        let strides = self.layout.strides();
        let mut index = vec![0usize; shape.len()];
        let mut rest = start;
        for k in (0..shape.len()).rev() {
            index[k] = rest % shape[k];
            rest /= shape[k];
        }
        let mut pos = self.layout.position(&index) as isize;
        for _ in 0..len {
            out.push(pos as usize);
            // Odometer step: bump the innermost axis, carrying outwards.
            for k in (0..shape.len()).rev() {
                index[k] += 1;
                pos += strides[k];
                if index[k] < shape[k] {
                    break;
                }
                pos -= strides[k] * shape[k] as isize;
                index[k] = 0;
            }
        }
    }

    /// # Safety
    /// The view must lie inside its buffer (checked in `new`).
    pub(crate) unsafe fn load<T: Prim>(
        &self,
        start: usize,
        len: usize,
        scratch: &mut Vec<usize>,
    ) -> Vec<T> {
        let base = self.base as *const u8;
        if self.contiguous {
            let first = self.layout.offset() + start;
            if T::DTYPE != crate::dtype::DType::Bool {
                // Plain memory of T: one copy the compiler turns into memcpy.
                return std::slice::from_raw_parts(
                    base.add(first * self.itemsize) as *const T,
                    len,
                )
                .to_vec();
            }
            (0..len)
                .map(|i| T::load(base.add((first + i) * self.itemsize)))
                .collect()
        } else {
            self.positions(start, len, scratch);
            scratch
                .iter()
                .map(|&p| T::load(base.add(p * self.itemsize)))
                .collect()
        }
    }

    /// # Safety
    /// As `load`; no other thread writes the same elements.
    pub(crate) unsafe fn store<T: Copy>(
        &self,
        start: usize,
        values: &[T],
        scratch: &mut Vec<usize>,
    ) {
        let base = self.base as *mut T;
        if self.contiguous {
            let dst = base.add(self.layout.offset() + start);
            std::ptr::copy_nonoverlapping(values.as_ptr(), dst, values.len());
        } else {
            self.positions(start, values.len(), scratch);
            for (&p, &v) in scratch.iter().zip(values) {
                *base.add(p) = v;
            }
        }
    }
}

/// An operand's values as f64, in row-major order.
pub(crate) fn load_f64(op: &Operand) -> Result<Vec<f64>> {
    let view = View::new(op)?;
    let mut scratch = Vec::new();
    // SAFETY: View::new bounds-checked the operand's layout.
    let block = super::block::with_dtype!(op.dtype, T => T::wrap(unsafe {
        view.load::<T>(0, op.layout.numel(), &mut scratch)
    }));
    match block.cast(crate::dtype::DType::F64, false) {
        super::block::Block::F64(v) => Ok(v),
        _ => unreachable!("cast to f64"),
    }
}

/// Stores `values` (one per element, row-major) into `out`, each rounded once to its dtype.
pub(crate) fn store_f64(values: Vec<f64>, out: &Operand) -> Result<()> {
    if values.len() != out.layout.numel() {
        return Err(Error::Backend(format!(
            "internal error: {} values for an output of shape {:?}",
            values.len(),
            out.layout.shape()
        )));
    }
    let result = super::block::Block::F64(values).cast(out.dtype, false);
    let view = View::new(out)?;
    let mut scratch = Vec::new();
    // SAFETY: bounds-checked by View::new; one thread writes the output.
    super::block::with_block!(&result, v: T => unsafe { view.store::<T>(0, v, &mut scratch) });
    Ok(())
}
