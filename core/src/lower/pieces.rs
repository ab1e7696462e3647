//! Splitting a launch into pieces whose operands fit a storage-binding limit (wgpu binds at most
//! 128 MiB per buffer on lavapipe, 2 GiB on NVIDIA), and the window of each operand's buffer a
//! piece binds. Pure layout arithmetic: no buffers, no devices, tested here.
//!
//! ```
//! use strata_core::lower::pieces::{split, Access};
//! // A [4, 1024] f32 operand, row-major, split until each piece binds at most 8 KiB.
//! let a = Access { strides: [1024, 1].into_iter().collect(), offset: 0, itemsize: 4, buffer_bytes: 16384 };
//! let pieces = split(&[4, 1024], &[a], 8192, 256).unwrap();
//! assert_eq!(pieces.len(), 2);
//! assert_eq!((&pieces[1].start[..], &pieces[1].len[..]), (&[2, 0][..], &[2, 1024][..]));
//! ```

use crate::error::{Error, Result};
use crate::layout::{Dims, Strides};

/// One operand of a launch as the splitter sees it: strides and offset in elements over the
/// launch's iteration shape, the element size, and the size of its buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Access {
    /// Elements between neighbours along each axis of the iteration shape.
    pub strides: Strides,
    /// The element at the iteration's origin.
    pub offset: usize,
    /// Bytes per element.
    pub itemsize: usize,
    /// Bytes of the buffer the operand lives in.
    pub buffer_bytes: u64,
}

/// What the planners need to know of an operand's buffer: its address (for the alignment of
/// vector loads; 0 where bindings start at aligned offsets) and how many bytes a binding may
/// span (the allocation's size, which a backend may round up from the tensor's).
///
/// ```
/// let b = strata_core::lower::pieces::BufferInfo { address: 0, bytes: 64 };
/// assert_eq!(b.bytes, 64);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BufferInfo {
    /// The buffer's start address.
    pub address: u64,
    /// Its size in bytes.
    pub bytes: u64,
}

impl BufferInfo {
    /// What the planners know of `buffer`: a [`PlannedBuffer`](crate::backend::PlannedBuffer)'s
    /// size at its aligned stand-in address (a launch planned before anything runs), else what
    /// `own` says of a backend's own buffer.
    ///
    /// ```
    /// use strata_core::backend::PlannedBuffer;
    /// use strata_core::lower::pieces::BufferInfo;
    /// let b = BufferInfo::of(&PlannedBuffer::new(64), |_| unreachable!()).unwrap();
    /// assert_eq!((b.address, b.bytes), (PlannedBuffer::ADDRESS, 64));
    /// ```
    pub fn of(
        buffer: &dyn crate::backend::DeviceBuffer,
        own: impl FnOnce(&dyn crate::backend::DeviceBuffer) -> crate::error::Result<BufferInfo>,
    ) -> crate::error::Result<BufferInfo> {
        match buffer
            .as_any()
            .downcast_ref::<crate::backend::PlannedBuffer>()
        {
            Some(planned) => Ok(BufferInfo {
                address: crate::backend::PlannedBuffer::ADDRESS,
                bytes: crate::backend::DeviceBuffer::len_bytes(planned) as u64,
            }),
            None => own(buffer),
        }
    }

    /// The buffers of a launch's operands (outputs, then inputs) as they are: address 0 (an
    /// aligned start) and the tensors' sizes. Backends whose allocations are larger or whose
    /// addresses matter build their own.
    pub fn of_operands(args: &crate::backend::KernelArgs) -> Vec<BufferInfo> {
        args.outputs
            .iter()
            .chain(&args.inputs)
            .map(|o| BufferInfo {
                address: 0,
                bytes: o.buffer.len_bytes() as u64,
            })
            .collect()
    }
}

/// A box of the iteration space: `start[d] .. start[d] + len[d]` per axis.
///
/// ```
/// let p = strata_core::lower::pieces::Piece::whole(&[3, 4]);
/// assert_eq!(p.numel(), 12);
/// assert_eq!(&p.whole_along(1, 9).len[..], &[3, 9]);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Piece {
    /// The first coordinate along each axis.
    pub start: Dims,
    /// The extent along each axis.
    pub len: Dims,
}

impl Piece {
    /// The box covering all of `shape`.
    pub fn whole(shape: &[usize]) -> Piece {
        Piece {
            start: smallvec::smallvec![0; shape.len()],
            len: Dims::from_slice(shape),
        }
    }

    /// The number of positions in the box.
    pub fn numel(&self) -> usize {
        self.len.iter().product()
    }

    /// The same box with axis `axis` widened to all of `0..len` (an operand that a launch
    /// reads along that axis wherever an index points).
    pub fn whole_along(&self, axis: usize, len: usize) -> Piece {
        let mut p = self.clone();
        p.start[axis] = 0;
        p.len[axis] = len;
        p
    }
}

/// The part of a buffer bound for one operand of one piece, and where the operand's first
/// element lies in it.
///
/// ```
/// use strata_core::lower::pieces::{window, Access, Piece};
/// let a = Access { strides: [1].into_iter().collect(), offset: 100, itemsize: 4, buffer_bytes: 4096 };
/// let w = window(&a, &Piece { start: smallvec::smallvec![10], len: smallvec::smallvec![20] }, 256);
/// assert_eq!((w.byte_offset, w.byte_size, w.rel_offset), (256, 272, 46));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// Where the binding starts (a multiple of the offset alignment).
    pub byte_offset: u64,
    /// How many bytes it binds (a multiple of 16, within the buffer).
    pub byte_size: u64,
    /// The piece's first element, in elements from the binding's start.
    pub rel_offset: usize,
}

impl Window {
    /// All of a buffer of `bytes` bytes, from its start (the partials of a split reduction).
    ///
    /// ```
    /// assert_eq!(strata_core::lower::pieces::Window::whole(64).byte_size, 64);
    /// ```
    pub fn whole(bytes: u64) -> Window {
        Window {
            byte_offset: 0,
            byte_size: bytes,
            rel_offset: 0,
        }
    }
}

/// Element range `[lo, hi]` that `a` touches over piece `p`, and its base element.
fn reach(a: &Access, p: &Piece) -> (isize, isize, isize) {
    let mut base = a.offset as isize;
    let (mut lo, mut hi) = (0isize, 0isize);
    for ((&s, &st), &n) in p.start.iter().zip(&a.strides).zip(&p.len) {
        base += s as isize * st;
        let ext = (n.max(1) as isize - 1) * st;
        if ext < 0 {
            lo += ext;
        } else {
            hi += ext;
        }
    }
    (base + lo, base + hi, base)
}

/// The window binding `a` over piece `p`: the offset aligned down to `align`, the size rounded
/// up to 16 bytes within the buffer. An operand indexed along an empty axis is never touched,
/// but its binding must still lie inside the buffer (a zero-size view may start at the
/// buffer's end): it binds the buffer's first bytes.
pub fn window(a: &Access, p: &Piece, align: u64) -> Window {
    let untouched = p
        .len
        .iter()
        .zip(&a.strides)
        .any(|(&n, &s)| n == 0 && s != 0);
    let (lo, hi, base) = reach(a, p);
    let is = a.itemsize as u64;
    let start = (lo.max(0) as u64 * is) / align * align;
    let end = (((hi as u64 + 1) * is).div_ceil(16) * 16).min(a.buffer_bytes);
    if untouched || (p.len.contains(&0) && start >= end) {
        return Window {
            byte_offset: 0,
            byte_size: a.buffer_bytes.min(16),
            rel_offset: 0,
        };
    }
    Window {
        byte_offset: start,
        byte_size: end - start,
        rel_offset: (base as u64 - start / is) as usize,
    }
}

/// Splits the iteration box `shape` until every operand's window fits `limit` bytes, halving
/// the outermost axis that still has more than one index.
pub fn split(shape: &[usize], ops: &[Access], limit: u64, align: u64) -> Result<Vec<Piece>> {
    split_by(shape, None, limit, |p| {
        ops.iter()
            .map(|a| window(a, p, align).byte_size)
            .max()
            .unwrap_or(0)
    })
}

/// Splits the iteration box `shape` (never along `keep`) until `largest(piece)`, the largest
/// window a piece binds, fits `limit` bytes; pieces come out in order.
///
/// ```
/// use strata_core::lower::pieces::split_by;
/// let pieces = split_by(&[8, 3], Some(0), 100, |p| 40 * p.len[1] as u64).unwrap();
/// assert_eq!(pieces.iter().map(|p| p.len[1]).collect::<Vec<_>>(), vec![1, 2]);
/// assert!(split_by(&[8, 3], Some(1), 10, |_| 20).is_err());
/// ```
pub fn split_by(
    shape: &[usize],
    keep: Option<usize>,
    limit: u64,
    largest: impl Fn(&Piece) -> u64,
) -> Result<Vec<Piece>> {
    let mut out = Vec::new();
    let mut todo = vec![Piece::whole(shape)];
    while let Some(p) = todo.pop() {
        if largest(&p) <= limit {
            out.push(p);
            continue;
        }
        let Some(d) = (0..p.len.len()).find(|&d| p.len[d] > 1 && Some(d) != keep) else {
            return Err(Error::Unsupported(format!(
                "an element window does not fit the adapter's {limit}-byte storage binding"
            )));
        };
        let half = p.len[d] / 2;
        let mut a = p.clone();
        a.len[d] = half;
        let mut b = p;
        b.start[d] += half;
        b.len[d] -= half;
        // Pieces come out in order: the second half is pushed first.
        todo.push(b);
        todo.push(a);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn access(strides: Vec<isize>, offset: usize, bytes: u64) -> Access {
        Access {
            strides: strides.into(),
            offset,
            itemsize: 4,
            buffer_bytes: bytes,
        }
    }

    #[test]
    fn pieces_cover_the_box_in_order_and_fit() {
        let shape = [5, 7, 9];
        let ops = [
            access(vec![63, 9, 1], 0, 5 * 63 * 4),
            access(vec![1, 5, 35], 3, 400 * 4),
            access(vec![0, 0, -1], 8, 64),
        ];
        let pieces = split(&shape, &ops, 512, 32).unwrap();
        let mut seen = vec![0u8; 5 * 7 * 9];
        for p in &pieces {
            for a in &ops {
                let w = window(a, p, 32);
                assert!(w.byte_size <= 512 && w.byte_offset.is_multiple_of(32));
                assert!(w.byte_offset + w.byte_size <= a.buffer_bytes);
            }
            for i in p.start[0]..p.start[0] + p.len[0] {
                for j in p.start[1]..p.start[1] + p.len[1] {
                    for k in p.start[2]..p.start[2] + p.len[2] {
                        seen[(i * 7 + j) * 9 + k] += 1;
                    }
                }
            }
        }
        assert!(seen.iter().all(|&n| n == 1), "every position once");
        let firsts: Vec<_> = pieces.iter().map(|p| p.start.clone()).collect();
        let mut sorted = firsts.clone();
        sorted.sort();
        assert_eq!(firsts, sorted);
    }

    #[test]
    fn a_window_holds_every_element_of_its_piece() {
        let a = access(vec![-10, 3], 95, 4096);
        let p = Piece {
            start: smallvec::smallvec![2, 1],
            len: smallvec::smallvec![3, 4],
        };
        let w = window(&a, &p, 64);
        for i in 0..3isize {
            for j in 0..4isize {
                let e = w.rel_offset as isize + i * -10 + j * 3;
                assert!(e >= 0 && (e as u64 + 1) * 4 <= w.byte_size, "{e}");
            }
        }
    }

    #[test]
    fn an_empty_view_at_the_end_of_its_buffer_binds_inside_it() {
        let a = access(vec![16, 4, 1], 32, 128);
        let p = Piece {
            start: smallvec::smallvec![0, 0, 0],
            len: smallvec::smallvec![0, 4, 4],
        };
        let w = window(&a, &p, 32);
        assert!(w.byte_offset + w.byte_size <= 128 && w.byte_size > 0);
    }
}
