//! What every dispatch shares: a binding (a window of a buffer, planned by core's `pieces`),
//! launch scalars as `u32` words, and the pipeline cache (core's kernel cache).

use crate::memory::WgpuBuffer;
use std::sync::Arc;
use strata_core::ir::Operand;
use strata_core::lower::pieces::{Access, BufferInfo, Window};
use strata_core::{Result, Scalar};

/// A storage binding of one dispatch: a window of a buffer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Binding<'a> {
    pub buffer: &'a wgpu::Buffer,
    pub window: Window,
}

impl<'a> Binding<'a> {
    /// All of `buffer` (the partials of a split reduction).
    pub(crate) fn whole(buffer: &'a wgpu::Buffer) -> Binding<'a> {
        Binding {
            buffer,
            window: Window::whole(buffer.size()),
        }
    }

    /// The `bytes` of a tensor at the start of `buffer` (a pool buffer of its size class,
    /// which may be larger), rounded up to the 16 bytes a binding's size is a multiple of: a
    /// tensor within the binding limit binds, whatever its size class.
    pub(crate) fn tensor(buffer: &'a wgpu::Buffer, bytes: usize) -> Binding<'a> {
        let size = (bytes.max(1) as u64)
            .next_multiple_of(16)
            .min(buffer.size());
        Binding {
            buffer,
            window: Window::whole(size),
        }
    }
}

/// The wgpu buffer behind an operand.
pub(crate) fn raw(op: &Operand) -> Result<&wgpu::Buffer> {
    Ok(WgpuBuffer::of(op.buffer.as_ref())?.raw())
}

/// The buffers as core's planners see them: bindings start at aligned offsets (address 0) and
/// may span the whole allocation (a size class, larger than the tensor).
pub(crate) fn buffer_info(buffers: &[&wgpu::Buffer]) -> Vec<BufferInfo> {
    buffers
        .iter()
        .map(|b| BufferInfo {
            address: 0,
            bytes: b.size(),
        })
        .collect()
}

/// An operand's buffer as core's planners see it ([`buffer_info`]), or a stand-in's (a
/// launch planned before anything runs, for `explain`).
pub(crate) fn operand_info(op: &Operand) -> Result<BufferInfo> {
    BufferInfo::of(op.buffer.as_ref(), |b| {
        Ok(BufferInfo {
            address: 0,
            bytes: WgpuBuffer::of(b)?.raw().size(),
        })
    })
}

/// `op` as core's splitter sees it over iteration strides `strides`.
pub(crate) fn access(op: &Operand, strides: Vec<isize>) -> Result<Access> {
    Ok(Access {
        strides: strides.into(),
        offset: op.layout.offset(),
        itemsize: op.dtype.itemsize(),
        buffer_bytes: raw(op)?.size(),
    })
}

/// The two `u32` words (low, high) of a scalar's little-endian bits.
pub(crate) fn scalar_words(s: Scalar) -> [u32; 2] {
    let v = s.bits();
    [v as u32, (v >> 32) as u32]
}

/// Compiled pipelines by kernel signature, per device (core's kernel cache).
pub(crate) type PipelineCache<S> =
    strata_core::lower::cache::KernelCache<S, Arc<wgpu::ComputePipeline>>;
