//! What an adapter's arithmetic does that its features do not say, found by running it once
//! when the device opens.

use crate::gpu::Gpu;
use crate::launch::Binding;

/// Whether the adapter's `fma` rounds once: `(1 + 2^-23)² - (1 + 2^-22)` is 2^-46, the last bit
/// of the 48-bit product, when it does, and 0 as a rounded multiply and add (or a product kept
/// to fewer bits). The operands come from a buffer, so no compiler can fold them. The kernel
/// runs like any other (compiled, dispatched in the batch, read back); any error answers
/// `false`, and the kernels then take the path that needs no fused `fma`.
pub(crate) fn fma_is_fused(gpu: &Gpu) -> bool {
    let run = || -> strata_core::Result<bool> {
        let pipeline = gpu.pipeline(SOURCE, 1)?;
        let data = gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("strata fma probe"),
            size: 16,
            usage: wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_SRC
                | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let one = 1.0 + 2f32.powi(-23);
        let values = [one, one, -(1.0 + 2f32.powi(-22)), 0.0];
        gpu.write(&data, 0, bytemuck::cast_slice(&values))?;
        gpu.dispatch(&pipeline, &[], &[Binding::whole(&data)], 1)?;
        let got = gpu.read(&data, 12, 4)?;
        Ok(f32::from_le_bytes([got[0], got[1], got[2], got[3]]) == 2f32.powi(-46))
    };
    run().unwrap_or(false)
}

/// The kernel: binding 0 is the launch parameters every strata kernel's layout starts with.
const SOURCE: &str = "
@group(0) @binding(0) var<storage, read> params: array<u32>;
@group(0) @binding(1) var<storage, read_write> v: array<f32, 4>;
@compute @workgroup_size(1) fn main() { v[3] = fma(v[0], v[1], v[2]); }
";
