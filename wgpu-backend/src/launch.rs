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
