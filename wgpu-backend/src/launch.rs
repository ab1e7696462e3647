//! What every kernel launch shares: splitting a launch into pieces whose operands fit the
//! storage-binding limit, the binding window of each operand, and the pipeline cache.

use crate::memory::WgpuBuffer;
use std::sync::Arc;
use strata_core::ir::Operand;
use strata_core::{Error, Result, Scalar};

/// One operand of a launch as the splitter sees it: strides and offset in elements over the
/// launch's iteration shape, and the element size.
#[derive(Debug, Clone)]
pub(crate) struct Access<'a> {
    pub buffer: &'a WgpuBuffer,
    pub strides: Vec<isize>,
    pub offset: usize,
    pub itemsize: usize,
}

impl<'a> Access<'a> {
    /// `op` over iteration strides `strides` (already permuted/coalesced by the caller).
    pub(crate) fn of(op: &'a Operand, strides: Vec<isize>) -> Result<Access<'a>> {
        Ok(Access {
            buffer: WgpuBuffer::of(op.buffer.as_ref())?,
            strides,
            offset: op.layout.offset(),
            itemsize: op.dtype.itemsize(),
        })
    }
}

/// A box of the iteration space: `start[d] .. start[d] + len[d]` per axis.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Piece {
    pub start: Vec<usize>,
    pub len: Vec<usize>,
}

/// The part of a buffer bound for one operand of one piece, and the operand's first element
/// relative to it.
#[derive(Debug, Clone)]
pub(crate) struct Window<'a> {
    pub buffer: &'a wgpu::Buffer,
    pub byte_offset: u64,
    pub byte_size: u64,
    /// Element offset of the piece's first element within the window.
    pub rel_offset: usize,
}

impl<'a> Window<'a> {
    /// All of `buffer`, from its start (the partials of a split reduction).
    pub fn whole(buffer: &'a wgpu::Buffer) -> Window<'a> {
        Window {
            buffer,
            byte_offset: 0,
            byte_size: buffer.size(),
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

/// The window binding `a` over piece `p` (offset aligned down to `align`, size rounded up to
/// 16 bytes within the buffer).
pub(crate) fn window<'a>(a: &Access<'a>, p: &Piece, align: u64) -> Window<'a> {
    let raw = a.buffer.raw();
    // An operand indexed along an empty axis is never touched, but its binding must still lie
    // inside the buffer (a zero-size view may start at the buffer's end): bind its first bytes.
    let untouched = p
        .len
        .iter()
        .zip(&a.strides)
        .any(|(&n, &s)| n == 0 && s != 0);
    let (lo, hi, base) = reach(a, p);
    let is = a.itemsize as u64;
    let start = (lo.max(0) as u64 * is) / align * align;
    let end = (((hi as u64 + 1) * is).div_ceil(16) * 16).min(raw.size());
    if untouched || (p.len.contains(&0) && start >= end) {
        return Window {
            buffer: raw,
            byte_offset: 0,
            byte_size: raw.size().min(16),
            rel_offset: 0,
        };
    }
    Window {
        buffer: raw,
        byte_offset: start,
        byte_size: end - start,
        rel_offset: (base as u64 - start / is) as usize,
    }
}

/// Splits the iteration box `shape` until every operand's window fits `limit` bytes, halving
/// the outermost axis that still has more than one index.
pub(crate) fn split(shape: &[usize], ops: &[Access], limit: u64, align: u64) -> Result<Vec<Piece>> {
    split_by(shape, None, limit, |p| {
        ops.iter()
            .map(|a| window(a, p, align).byte_size)
            .max()
            .unwrap_or(0)
    })
}

/// Splits the iteration box `shape` (never along `keep`) until `largest(piece)`, the largest
/// window a piece binds, fits `limit` bytes; pieces come out in order.
pub(crate) fn split_by(
    shape: &[usize],
    keep: Option<usize>,
    limit: u64,
    largest: impl Fn(&Piece) -> u64,
) -> Result<Vec<Piece>> {
    let whole = Piece {
        start: vec![0; shape.len()],
        len: shape.to_vec(),
    };
    let mut out = Vec::new();
    let mut todo = vec![whole];
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

impl Piece {
    /// The same box with axis `axis` widened to all of `0..len` (an operand that a launch
    /// reads along that axis wherever an index points).
    pub(crate) fn whole_along(&self, axis: usize, len: usize) -> Piece {
        let mut p = self.clone();
        p.start[axis] = 0;
        p.len[axis] = len;
        p
    }
}

/// Row-major strides of `shape`, as `isize`.
pub(crate) fn dense(shape: &[usize]) -> Vec<isize> {
    strata_core::layout::contiguous_strides(shape)
}

/// The two `u32` words (low, high) of a scalar's little-endian bits.
pub(crate) fn scalar_words(s: Scalar) -> [u32; 2] {
    let v = s.bits();
    [v as u32, (v >> 32) as u32]
}

/// Compiled pipelines by kernel signature, per device (core's kernel cache).
pub(crate) type PipelineCache<S> =
    strata_core::lower::cache::KernelCache<S, Arc<wgpu::ComputePipeline>>;
