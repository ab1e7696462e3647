//! The adapter, device and queue, and the command batch: dispatches are recorded into one
//! command encoder and submitted together at a sync point, a host read, or every
//! [`MAX_BATCH`] dispatches. Launch values go into one `params` buffer per batch, each dispatch
//! binding its slice at a dynamic offset.

use crate::launch::Binding;
use crate::render::Caps;
use crate::staging::{ReadRing, UploadRing};
use std::collections::HashMap;
use std::num::NonZeroU64;
use std::sync::{Arc, Mutex};
use strata_core::sync::LockUnpoisoned;
use strata_core::{Error, Result};

/// Dispatches recorded before a batch is submitted on its own.
pub(crate) const MAX_BATCH: usize = 256;
/// Bytes of `params` one dispatch may bind.
const PARAMS_BINDING: u64 = 4096;
/// Bytes of the `params` buffer (one batch's launch values).
const PARAMS_CAPACITY: u64 = 4 << 20;
/// Timestamp slots (events with timing cycle through them).
pub(crate) const TIMESTAMP_SLOTS: u32 = 4096;

/// An adapter as [`adapters`](crate::adapters) lists it.
///
/// ```
/// for a in strata_wgpu::adapters() {
///     println!("{} ({:?}): f64 {}", a.name, a.backend, a.features.contains(wgpu::Features::SHADER_F64));
/// }
/// ```
#[derive(Debug, Clone)]
pub struct AdapterSummary {
    /// The adapter's name.
    pub name: String,
    /// Vulkan, Metal, DX12, ...
    pub backend: wgpu::Backend,
    /// Integrated, discrete, CPU, ...
    pub device_type: wgpu::DeviceType,
    /// The optional features it offers.
    pub features: wgpu::Features,
    /// Its limits.
    pub limits: wgpu::Limits,
}

/// Whether the adapter can run [`crate::render::coop_matmul`]: 16×16×16 f16 cooperative
/// matrices accumulating in f32 at subgroup scope, native f16, subgroups of exactly 32 (the
/// kernel's eight subgroups a workgroup), the workgroup memory it stages in, and
/// `unpack2x16float` (its 16-byte staging).
fn coop_f16_offered(
    adapter: &wgpu::Adapter,
    info: &wgpu::AdapterInfo,
    limits: &wgpu::Limits,
) -> bool {
    let needed = wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX
        | wgpu::Features::SUBGROUP
        | wgpu::Features::SHADER_F16;
    use wgpu::CooperativeScalarType as T;
    adapter.features().contains(needed)
        && adapter
            .get_downlevel_capabilities()
            .flags
            .contains(wgpu::DownlevelFlags::SHADER_F16_IN_F32)
        && info.subgroup_min_size == 32
        && info.subgroup_max_size == 32
        && limits.max_compute_workgroup_storage_size >= crate::render::coop_matmul::WORKGROUP_BYTES
        && adapter.cooperative_matrix_properties().iter().any(|p| {
            (p.m_size, p.n_size, p.k_size) == (16, 16, 16)
                && p.ab_type == T::F16
                && p.cr_type == T::F32
        })
        && std::env::var("STRATA_WGPU_F16").as_deref() != Ok("packed")
}

pub(crate) struct Gpu {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub info: wgpu::AdapterInfo,
    pub caps: Caps,
    pub limits: wgpu::Limits,
    pub features: wgpu::Features,
    params: wgpu::Buffer,
    layouts: Mutex<HashMap<usize, Arc<(wgpu::BindGroupLayout, wgpu::PipelineLayout)>>>,
    batch: Mutex<Batch>,
    pub timestamps: Option<wgpu::QuerySet>,
    uncaptured: Arc<Mutex<Vec<String>>>,
    /// Staging chunks large uploads reuse (`crate::staging`).
    pub(crate) uploads: Mutex<Option<UploadRing>>,
    /// Staging chunks large readbacks reuse.
    pub(crate) readbacks: Mutex<Option<ReadRing>>,
}

#[derive(Default)]
pub(crate) struct Batch {
    pub encoder: Option<wgpu::CommandEncoder>,
    /// The compute pass consecutive dispatches share (wgpu orders dispatches inside a pass as
    /// it orders passes); ended before anything else is recorded on the encoder.
    pub pass: Option<wgpu::ComputePass<'static>>,
    pub params: Vec<u8>,
    pub ops: usize,
    /// Sequence number of the batch being recorded.
    pub seq: u64,
    pub last_submitted: Option<wgpu::SubmissionIndex>,
    pub events: HashMap<u64, EventState>,
    pub next_event: u64,
    pub next_slot: u32,
}

impl Batch {
    /// The encoder, for something other than a dispatch (ends the open compute pass).
    pub(crate) fn encoder(&mut self, device: &wgpu::Device) -> &mut wgpu::CommandEncoder {
        self.pass = None;
        self.encoder.get_or_insert_with(|| {
            device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None })
        })
    }

    /// The open compute pass (begun on the encoder when there is none).
    fn pass(&mut self, device: &wgpu::Device) -> &mut wgpu::ComputePass<'static> {
        let pass = match self.pass.take() {
            Some(pass) => pass,
            None => {
                let enc = self.encoder.get_or_insert_with(|| {
                    device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None })
                });
                enc.begin_compute_pass(&wgpu::ComputePassDescriptor::default())
                    .forget_lifetime()
            }
        };
        self.pass.insert(pass)
    }
}

pub(crate) struct EventState {
    pub seq: u64,
    pub index: Option<wgpu::SubmissionIndex>,
    pub slot: Option<u32>,
}

fn instance() -> wgpu::Instance {
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle_from_env();
    // A release build's flags in every build: debug builds would otherwise ask naga for shader
    // debug info (a line lookup per statement, quadratic in a shader's length) and the Vulkan
    // validation layers, and made the debug-built test suite several times slower on lavapipe.
    // `WGPU_DEBUG=1` / `WGPU_VALIDATION=1` turn them on.
    desc.flags = wgpu::InstanceFlags::VALIDATION_INDIRECT_CALL.with_env();
    if std::env::var_os("WGPU_BACKEND").is_none() {
        desc.backends = wgpu::Backends::VULKAN | wgpu::Backends::METAL | wgpu::Backends::DX12;
    }
    wgpu::Instance::new(desc)
}

/// Every adapter wgpu finds.
pub(crate) fn adapters() -> Vec<AdapterSummary> {
    let inst = instance();
    pollster::block_on(inst.enumerate_adapters(wgpu::Backends::all()))
        .into_iter()
        .map(|a| {
            let info = a.get_info();
            AdapterSummary {
                name: info.name,
                backend: info.backend,
                device_type: info.device_type,
                features: a.features(),
                limits: a.limits(),
            }
        })
        .collect()
}

impl Gpu {
    /// Opens the adapter named by `STRATA_WGPU_ADAPTER` (a substring of its name or its backend),
    /// else the high-performance one.
    pub(crate) fn open() -> Result<Gpu> {
        let inst = instance();
        let wanted = std::env::var("STRATA_WGPU_ADAPTER")
            .ok()
            .filter(|s| !s.trim().is_empty());
        let adapter =
            match &wanted {
                Some(w) => {
                    let w = w.to_ascii_lowercase();
                    pollster::block_on(inst.enumerate_adapters(wgpu::Backends::all()))
                        .into_iter()
                        .find(|a| {
                            let i = a.get_info();
                            i.name.to_ascii_lowercase().contains(&w)
                                || format!("{:?}", i.backend).to_ascii_lowercase() == w
                        })
                        .ok_or_else(|| {
                            Error::DeviceUnavailable(format!(
                            "wgpu: no adapter matches STRATA_WGPU_ADAPTER={w:?}; adapters: {:?}",
                            adapters().iter().map(|a| a.name.clone()).collect::<Vec<_>>()
                        ))
                        })?
                }
                None => pollster::block_on(inst.request_adapter(&wgpu::RequestAdapterOptions {
                    power_preference: wgpu::PowerPreference::HighPerformance,
                    ..Default::default()
                }))
                .map_err(|e| {
                    Error::DeviceUnavailable(format!(
                        "wgpu: no adapter found ({e}); install a Vulkan driver (on Debian: \
                     apt-get install mesa-vulkan-drivers libvulkan1) or use Device::cpu()"
                    ))
                })?,
            };
        let info = adapter.get_info();
        let offered = adapter.features();
        let wanted_features = wgpu::Features::SHADER_F16
            | wgpu::Features::SHADER_F64
            | wgpu::Features::SHADER_INT64
            | wgpu::Features::TIMESTAMP_QUERY
            | wgpu::Features::SUBGROUP;
        let limits = adapter.limits();
        let coop_f16 = coop_f16_offered(&adapter, &info, &limits)
            && std::env::var("STRATA_WGPU_COOP").as_deref() != Ok("0");
        let features = offered
            & (wanted_features
                | if coop_f16 {
                    wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX
                } else {
                    wgpu::Features::empty()
                });
        // SAFETY: the experimental feature (cooperative matrices) is asked for only where the
        // adapter reports the one configuration strata's f16 matmul uses, and only that
        // generated kernel uses it; every other shader is compiled as without it. Its known
        // defect: under the Vulkan memory model it brings, naga 30's barriers lack
        // availability/visibility operations (gfx-rs/wgpu#8805), so the kernel's workgroup
        // hand-offs rely on the driver's coherent workgroup memory (NVIDIA's: tested there).
        let experimental_features = if coop_f16 {
            unsafe { wgpu::ExperimentalFeatures::enabled() }
        } else {
            wgpu::ExperimentalFeatures::disabled()
        };
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("strata"),
            required_features: features,
            required_limits: limits.clone(),
            experimental_features,
            memory_hints: wgpu::MemoryHints::Performance,
            trace: wgpu::Trace::Off,
        }))
        .map_err(|e| Error::DeviceUnavailable(format!("wgpu: {}: {e}", info.name)))?;
        let uncaptured = Arc::new(Mutex::new(Vec::new()));
        let sink = uncaptured.clone();
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            sink.lock_unpoisoned().push(describe(&e));
        }));
        let int64 = features.contains(wgpu::Features::SHADER_INT64);
        let caps = Caps {
            int64,
            f64: int64 && features.contains(wgpu::Features::SHADER_F64),
            // STRATA_WGPU_F16=packed keeps f16 in u32 words even where the adapter has it
            // natively (the tests reach the packed path that way).
            f16: features.contains(wgpu::Features::SHADER_F16)
                && std::env::var("STRATA_WGPU_F16").as_deref() != Ok("packed"),
            // Probed below, once the device can run a kernel.
            fused_fma: false,
            coop_f16,
            // Vulkan only: the generated subgroup code is validated for SPIR-V (the catalog).
            subgroups: features.contains(wgpu::Features::SUBGROUP)
                && info.backend == wgpu::Backend::Vulkan
                && std::env::var("STRATA_WGPU_SUBGROUPS").as_deref() != Ok("0"),
        };
        let params = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("strata params"),
            size: PARAMS_CAPACITY,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let timestamps = features.contains(wgpu::Features::TIMESTAMP_QUERY).then(|| {
            device.create_query_set(&wgpu::QuerySetDescriptor {
                label: Some("strata events"),
                ty: wgpu::QueryType::Timestamp,
                count: TIMESTAMP_SLOTS,
            })
        });
        let gpu = Gpu {
            device,
            queue,
            info,
            caps,
            limits,
            features,
            params,
            layouts: Mutex::new(HashMap::new()),
            batch: Mutex::new(Batch::default()),
            timestamps,
            uploads: Mutex::new(None),
            readbacks: Mutex::new(None),
            uncaptured,
        };
        Ok(gpu)
    }

    pub(crate) fn batch(&self) -> std::sync::MutexGuard<'_, Batch> {
        self.batch.lock_unpoisoned()
    }

    /// The bind group and pipeline layouts for kernels with `tensors` tensor bindings.
    pub(crate) fn layout(
        &self,
        tensors: usize,
    ) -> Arc<(wgpu::BindGroupLayout, wgpu::PipelineLayout)> {
        let mut map = self.layouts.lock_unpoisoned();
        map.entry(tensors)
            .or_insert_with(|| {
                let storage =
                    |binding: u32, read_only: bool, dynamic: bool| wgpu::BindGroupLayoutEntry {
                        binding,
                        visibility: wgpu::ShaderStages::COMPUTE,
                        ty: wgpu::BindingType::Buffer {
                            ty: wgpu::BufferBindingType::Storage { read_only },
                            has_dynamic_offset: dynamic,
                            min_binding_size: None,
                        },
                        count: None,
                    };
                let mut entries = vec![storage(0, true, true)];
                entries.extend((0..tensors).map(|k| storage(k as u32 + 1, false, false)));
                let bgl = self
                    .device
                    .create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                        label: None,
                        entries: &entries,
                    });
                let pl = self
                    .device
                    .create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                        label: None,
                        bind_group_layouts: &[Some(&bgl)],
                        immediate_size: 0,
                    });
                Arc::new((bgl, pl))
            })
            .clone()
    }

    /// Compiles a compute pipeline from WGSL `source` with `tensors` tensor bindings; shader
    /// errors come back as `Err` with the source's first lines for context.
    pub(crate) fn pipeline(
        &self,
        source: &str,
        tensors: usize,
    ) -> Result<Arc<wgpu::ComputePipeline>> {
        dump(source);
        let layout = self.layout(tensors);
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let descriptor = wgpu::ShaderModuleDescriptor {
            label: None,
            source: wgpu::ShaderSource::Wgsl(source.into()),
        };
        let module = if shader_checks() {
            self.device.create_shader_module(descriptor)
        } else {
            // SAFETY: the source is strata's own generated WGSL (never user text). Its loops
            // run to counts read from the launch's parameters, so every one ends (the promise
            // `force_loop_bounding: false` asks for); its indices stay within the windows core
            // planned and bound, and where the platform bounds buffer accesses itself
            // (Vulkan's robustBufferAccess, which wgpu enables) that still holds.
            unsafe {
                self.device.create_shader_module_trusted(
                    descriptor,
                    wgpu::ShaderRuntimeChecks::unchecked(),
                )
            }
        };
        let pipeline = self
            .device
            .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: None,
                layout: Some(&layout.1),
                module: &module,
                entry_point: Some("main"),
                compilation_options: Default::default(),
                cache: None,
            });
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(Error::Backend(format!(
                "wgpu ({}): a generated shader failed: {}",
                self.info.name,
                describe(&e)
            )));
        }
        Ok(Arc::new(pipeline))
    }

    /// Records one dispatch of `threads` invocations (256 per workgroup) of `pipeline`.
    pub(crate) fn dispatch(
        &self,
        pipeline: &wgpu::ComputePipeline,
        params: &[u32],
        bindings: &[Binding],
        threads: usize,
    ) -> Result<()> {
        if threads == 0 {
            return Ok(());
        }
        let groups = threads.div_ceil(256) as u64;
        let max = self.limits.max_compute_workgroups_per_dimension as u64;
        let x = groups.min(max);
        let y = groups.div_ceil(x);
        if y > max {
            return Err(Error::Unsupported(format!(
                "a launch of {threads} invocations exceeds {max}×{max} workgroups"
            )));
        }
        let bytes: &[u8] = bytemuck::cast_slice(params);
        if bytes.len() as u64 > PARAMS_BINDING {
            return Err(Error::Unsupported(format!(
                "a launch needs {} bytes of parameters (at most {PARAMS_BINDING})",
                bytes.len()
            )));
        }
        let layout = self.layout(bindings.len());
        let mut b = self.batch();
        let align = self.limits.min_storage_buffer_offset_alignment as u64;
        let mut at = (b.params.len() as u64).div_ceil(align) * align;
        if at + PARAMS_BINDING > PARAMS_CAPACITY || b.ops >= MAX_BATCH {
            self.flush_locked(&mut b)?;
            at = 0;
        }
        b.params.resize(at as usize, 0);
        b.params.extend_from_slice(bytes);
        let mut entries = vec![wgpu::BindGroupEntry {
            binding: 0,
            resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                buffer: &self.params,
                offset: 0,
                size: NonZeroU64::new(PARAMS_BINDING),
            }),
        }];
        for (k, binding) in bindings.iter().enumerate() {
            entries.push(wgpu::BindGroupEntry {
                binding: k as u32 + 1,
                resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                    buffer: binding.buffer,
                    offset: binding.window.byte_offset,
                    size: NonZeroU64::new(binding.window.byte_size.max(4)),
                }),
            });
        }
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let group = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &layout.0,
            entries: &entries,
        });
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(Error::Backend(format!(
                "wgpu ({}): {}",
                self.info.name,
                describe(&e)
            )));
        }
        let pass = b.pass(&self.device);
        pass.set_pipeline(pipeline);
        pass.set_bind_group(0, &group, &[at as u32]);
        pass.dispatch_workgroups(x as u32, y as u32, 1);
        b.ops += 1;
        Ok(())
    }

    /// Records a buffer-to-buffer copy (offsets and size multiples of 4).
    pub(crate) fn copy(
        &self,
        src: &wgpu::Buffer,
        src_offset: u64,
        dst: &wgpu::Buffer,
        dst_offset: u64,
        size: u64,
    ) {
        let mut b = self.batch();
        let enc = b.encoder(&self.device);
        enc.copy_buffer_to_buffer(src, src_offset, dst, dst_offset, size);
        b.ops += 1;
    }

    /// Appends a copy of `size` bytes (from `src_offset` of `src` to `dst_offset` of `dst`) to
    /// the batch and submits the batch, returning that submission.
    pub(crate) fn copy_and_submit(
        &self,
        (src, src_offset): (&wgpu::Buffer, u64),
        (dst, dst_offset): (&wgpu::Buffer, u64),
        size: u64,
    ) -> Result<wgpu::SubmissionIndex> {
        let mut b = self.batch();
        let enc = b.encoder(&self.device);
        enc.copy_buffer_to_buffer(src, src_offset, dst, dst_offset, size);
        self.flush_locked(&mut b)?;
        b.last_submitted
            .clone()
            .ok_or_else(|| Error::Backend("wgpu: a staged copy was not submitted".into()))
    }

    pub(crate) fn flush_locked(&self, b: &mut Batch) -> Result<()> {
        b.pass = None;
        let Some(enc) = b.encoder.take() else {
            return Ok(());
        };
        if !b.params.is_empty() {
            let len = b.params.len().div_ceil(4) * 4;
            b.params.resize(len, 0);
            self.queue.write_buffer(&self.params, 0, &b.params);
        }
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let index = self.queue.submit([enc.finish()]);
        let err = pollster::block_on(scope.pop());
        let seq = b.seq;
        for ev in b.events.values_mut() {
            if ev.seq == seq {
                ev.index = Some(index.clone());
            }
        }
        b.last_submitted = Some(index);
        b.params.clear();
        b.ops = 0;
        b.seq += 1;
        match err {
            Some(e) => Err(Error::Backend(format!(
                "wgpu ({}): {}",
                self.info.name,
                describe(&e)
            ))),
            None => self.take_uncaptured(),
        }
    }

    fn take_uncaptured(&self) -> Result<()> {
        let mut errs = self.uncaptured.lock_unpoisoned();
        if errs.is_empty() {
            return Ok(());
        }
        let msg = errs.join("; ");
        errs.clear();
        Err(Error::Backend(format!("wgpu ({}): {msg}", self.info.name)))
    }

    /// Blocks until submission `index` (or everything submitted) completes.
    pub(crate) fn wait(&self, index: Option<wgpu::SubmissionIndex>) -> Result<()> {
        self.device
            .poll(wgpu::PollType::Wait {
                submission_index: index,
                timeout: None,
            })
            .map(|_| ())
            .map_err(|e| Error::Backend(format!("wgpu ({}): {e}", self.info.name)))
    }

    /// Submits everything and waits for it.
    pub(crate) fn synchronize(&self) -> Result<()> {
        let index = {
            let mut b = self.batch();
            self.flush_locked(&mut b)?;
            b.last_submitted.clone()
        };
        if index.is_some() {
            self.wait(index)?;
        }
        Ok(())
    }
}

/// A wgpu error with its chain of sources (its `Display` says only "Validation Error").
fn describe(e: &wgpu::Error) -> String {
    let mut msg = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(s) = src {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        src = s.source();
    }
    msg
}

/// With `STRATA_WGPU_DUMP=<dir>`, writes every shader compiled to `<dir>/NNNN.wgsl` in compile
/// order, for reading a driver's miscompile off the exact source (errors writing are ignored:
/// a debugging aid must not change results).
fn dump(source: &str) {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    if let Some(dir) = std::env::var_os("STRATA_WGPU_DUMP") {
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let _ = std::fs::create_dir_all(&dir);
        let _ = std::fs::write(
            std::path::Path::new(&dir).join(format!("{n:04}.wgsl")),
            source,
        );
    }
}

/// True when wgpu's runtime checks stay in the shaders (`STRATA_WGPU_SHADER_CHECKS=1`): a
/// clamp on every index and a counter on every loop, which cost the tiled and looping kernels
/// time; off by default, on to tell a strata indexing bug from a driver's.
fn shader_checks() -> bool {
    static CHECKS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *CHECKS.get_or_init(|| std::env::var("STRATA_WGPU_SHADER_CHECKS").is_ok_and(|v| v == "1"))
}
