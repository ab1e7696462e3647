//! What an adapter's arithmetic does that its features do not say, found by running it once
//! when the device opens.

/// Whether the adapter's `fma` rounds once: `(1 + 2^-23)² - (1 + 2^-22)` is 2^-46, the last bit
/// of the 48-bit product, when it does, and 0 as a rounded multiply and add (or a product kept
/// to fewer bits). The operands come from a buffer, so no compiler can fold them. Any failure,
/// an error of any kind included, answers `false` (the kernels then take the path that needs no
/// fused `fma`) and leaves nothing for the device's first user call to report.
pub(crate) fn fma_is_fused(device: &wgpu::Device, queue: &wgpu::Queue) -> bool {
    let memory = device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
    let internal = device.push_error_scope(wgpu::ErrorFilter::Internal);
    let validation = device.push_error_scope(wgpu::ErrorFilter::Validation);
    let got = run(device, queue);
    let errors = [validation, internal, memory]
        .into_iter()
        .filter_map(|scope| pollster::block_on(scope.pop()))
        .count();
    errors == 0 && got == Some(2f32.powi(-46))
}

const SOURCE: &str = "
@group(0) @binding(0) var<storage, read_write> v: array<f32, 4>;
@compute @workgroup_size(1) fn main() { v[3] = fma(v[0], v[1], v[2]); }
";

fn run(device: &wgpu::Device, queue: &wgpu::Queue) -> Option<f32> {
    let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
        label: Some("strata fma probe"),
        source: wgpu::ShaderSource::Wgsl(SOURCE.into()),
    });
    let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: Some("strata fma probe"),
        layout: None,
        module: &module,
        entry_point: Some("main"),
        compilation_options: Default::default(),
        cache: None,
    });
    let values = [
        1.0 + 2f32.powi(-23),
        1.0 + 2f32.powi(-23),
        -(1.0 + 2f32.powi(-22)),
        0.0,
    ];
    let usage = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC;
    let data = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("strata fma probe"),
        size: 16,
        usage: usage | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    queue.write_buffer(&data, 0, bytemuck::cast_slice(&values));
    let readback = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("strata fma probe readback"),
        size: 16,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let group = device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: None,
        layout: &pipeline.get_bind_group_layout(0),
        entries: &[wgpu::BindGroupEntry {
            binding: 0,
            resource: data.as_entire_binding(),
        }],
    });
    let mut enc = device.create_command_encoder(&Default::default());
    {
        let mut pass = enc.begin_compute_pass(&Default::default());
        pass.set_pipeline(&pipeline);
        pass.set_bind_group(0, &group, &[]);
        pass.dispatch_workgroups(1, 1, 1);
    }
    enc.copy_buffer_to_buffer(&data, 0, &readback, 0, 16);
    let index = queue.submit([enc.finish()]);
    let (tx, rx) = std::sync::mpsc::channel();
    readback.map_async(wgpu::MapMode::Read, .., move |r| {
        let _ = tx.send(r);
    });
    device
        .poll(wgpu::PollType::Wait {
            submission_index: Some(index),
            timeout: None,
        })
        .ok()?;
    rx.recv().ok()?.ok()?;
    let bytes = readback.get_mapped_range(..).ok()?;
    let got: &[f32] = bytemuck::cast_slice(&bytes);
    Some(got[3])
}
