//! What every dispatch shares: a binding (a window of a buffer, planned by core's `pieces`),
//! an operand's buffer as the planners see it, launch scalars as `u32` words, and the pipeline
//! cache (core's kernel cache).

use crate::memory::WgpuBuffer;
use std::sync::Arc;
use strata_core::backend::Operand;
use strata_core::lower::pieces::{BufferInfo, Window};
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

/// The two `u32` words (low, high) of a scalar's little-endian bits.
pub(crate) fn scalar_words(s: Scalar) -> [u32; 2] {
    let v = s.bits();
    [v as u32, (v >> 32) as u32]
}

/// Compiled pipelines by kernel signature, per device (core's kernel cache).
pub(crate) type PipelineCache<S> =
    strata_core::kernel_cache::KernelCache<S, Arc<wgpu::ComputePipeline>>;
