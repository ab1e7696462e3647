//! Shared pieces of strata's cross-backend tests: the devices to test on and
//! [`test_device!`], which runs one test body on every backend present (after candle's idea).

use strata::prelude::*;
use strata::sync::LockUnpoisoned;

pub mod crash_trace;

/// The devices present: always the CPU, and CUDA device 0 when there is one. `STRATA_TEST_DEVICES`
/// (comma-separated device names, e.g. `cpu,wgpu`) chooses the list instead; wgpu runs only when
/// named there, since a software Vulkan (lavapipe, CI's) makes the suite several times slower
/// (`scripts/test.sh` runs it once on cpu and wgpu together).
///
/// ```
/// assert!(!strata_tests::devices().is_empty());
/// ```
pub fn devices() -> Vec<Device> {
    crash_trace::install();
    let wanted = std::env::var("STRATA_TEST_DEVICES").ok();
    let explicit = wanted.is_some();
    let names: Vec<String> = match wanted {
        Some(list) => list.split(',').map(|s| s.trim().to_string()).collect(),
        None => vec!["cpu".into(), "cuda:0".into()],
    };
    names
        .iter()
        .filter_map(|name| match open(name) {
            Ok(dev) => Some(dev),
            // A device named on purpose must be there: a silent skip would pass a GPU run
            // that tested only the CPU.
            Err(e) if explicit => panic!("STRATA_TEST_DEVICES names {name}, which failed: {e}"),
            Err(_) => None,
        })
        .collect()
}

/// The dtypes the every-dtype tests loop over: [`DType::ALL`], or those named in
/// `STRATA_TEST_DTYPES` (comma-separated, e.g. `f16`) for a run that changes how only they are
/// stored (`scripts/test.sh` runs wgpu's packed f16 that way).
///
/// ```
/// assert!(!strata_tests::dtypes().is_empty());
/// ```
pub fn dtypes() -> Vec<DType> {
    match std::env::var("STRATA_TEST_DTYPES") {
        Ok(list) => list
            .split(',')
            .map(|name| {
                name.trim()
                    .parse()
                    .unwrap_or_else(|e| panic!("STRATA_TEST_DTYPES names {name}: {e}"))
            })
            .collect(),
        Err(_) => DType::ALL.to_vec(),
    }
}

/// Opens a device by name; GPU devices are opened once per test process and shared, as a
/// notebook shares one device between cells (a context and its kernel cache are costly).
fn open(name: &str) -> Result<Device> {
    use std::sync::{Mutex, OnceLock};
    if name == "cpu" {
        return Device::parse(name);
    }
    static OPEN: OnceLock<Mutex<Vec<(String, Device)>>> = OnceLock::new();
    let mut open = OPEN
        .get_or_init(|| Mutex::new(Vec::new()))
        .lock_unpoisoned();
    if let Some((_, dev)) = open.iter().find(|(n, _)| n == name) {
        return Ok(dev.clone());
    }
    let dev = Device::parse(name)?;
    open.push((name.to_string(), dev.clone()));
    Ok(dev)
}

/// Defines `#[test] fn $name()` that runs `$body(&Device)` on every device of [`devices`],
/// naming the device when it fails.
///
/// ```
/// fn body(dev: &strata::Device) -> strata::Result<()> {
///     assert_eq!(strata::Tensor::ones([1], strata::DType::F32, dev)?.item::<f32>()?, 1.0);
///     Ok(())
/// }
/// strata_tests::test_device!(ones_is_one, body);
/// ```
#[macro_export]
macro_rules! test_device {
    ($name:ident, $body:path) => {
        #[test]
        fn $name() {
            for dev in $crate::devices() {
                if let Err(e) = $body(&dev) {
                    panic!("{} on {}: {e}", stringify!($name), dev.name());
                }
            }
        }
    };
}

/// True when the device flushes f32 subnormals to zero (NVIDIA's Vulkan driver does; the
/// difference is documented), so tests there leave subnormal f32 inputs out.
///
/// ```
/// assert!(!strata_tests::flushes_subnormals(&strata::Device::cpu()));
/// ```
pub fn flushes_subnormals(dev: &Device) -> bool {
    let tiny = Tensor::from_slice(&[1.4e-45f32], [1], dev)
        .and_then(|t| t.mul(1.0))
        .and_then(|t| t.to_vec::<f32>());
    matches!(tiny.as_deref(), Ok([v]) if *v == 0.0)
}

/// Row-major multi-indices of `shape`, in order.
///
/// ```
/// assert_eq!(strata_tests::indices(&[2, 2]), vec![vec![0, 0], vec![0, 1], vec![1, 0], vec![1, 1]]);
/// ```
pub fn indices(shape: &[usize]) -> Vec<Vec<usize>> {
    let mut out = vec![vec![]];
    for &n in shape {
        out = out
            .into_iter()
            .flat_map(|prefix| {
                (0..n).map(move |i| {
                    let mut p = prefix.clone();
                    p.push(i);
                    p
                })
            })
            .collect();
    }
    out
}

/// A device of another kind for tests of cross-device errors on machines without a GPU: a
/// backend that reports itself as `Wgpu` named `stand-in` and runs everything on the CPU.
///
/// ```
/// let d = strata_tests::stand_in_device();
/// assert_eq!(d.name(), "stand-in");
/// assert!(!d.shares_memory_with(&strata::Device::cpu()));
/// ```
pub fn stand_in_device() -> Device {
    Device::from_backend(std::sync::Arc::new(StandIn(strata::cpu::CpuBackend::new())))
}

#[derive(Debug)]
struct StandIn(strata::cpu::CpuBackend);

impl strata::Backend for StandIn {
    fn kind(&self) -> strata::BackendKind {
        strata::BackendKind::Wgpu
    }
    fn name(&self) -> String {
        "stand-in".into()
    }
    fn check_dtype(&self, d: DType) -> Result<()> {
        self.0.check_dtype(d)
    }
    fn target(&self) -> &strata::target::Target {
        self.0.target()
    }
    fn allocate(
        &self,
        n: usize,
        s: strata::StreamId,
    ) -> Result<std::sync::Arc<dyn strata::DeviceBuffer>> {
        self.0.allocate(n, s)
    }
    fn upload(
        &self,
        b: &dyn strata::DeviceBuffer,
        o: usize,
        d: &[u8],
        s: strata::StreamId,
    ) -> Result<()> {
        self.0.upload(b, o, d, s)
    }
    fn download(
        &self,
        b: &dyn strata::DeviceBuffer,
        o: usize,
        out: &mut [u8],
        s: strata::StreamId,
    ) -> Result<()> {
        self.0.download(b, o, out, s)
    }
    fn run(
        &self,
        k: &strata::ir::Kernel,
        a: &strata::backend::KernelArgs,
        s: strata::StreamId,
    ) -> Result<()> {
        self.0.run(k, a, s)
    }
    fn memory_stats(&self) -> strata::MemoryStats {
        self.0.memory_stats()
    }
    fn empty_cache(&self) {}
    fn new_stream(&self) -> Result<strata::StreamId> {
        self.0.new_stream()
    }
    fn destroy_stream(&self, s: strata::StreamId) {
        self.0.destroy_stream(s)
    }
    fn record_event(&self, s: strata::StreamId) -> Result<strata::EventId> {
        self.0.record_event(s)
    }
    fn wait_event(&self, s: strata::StreamId, e: strata::EventId) -> Result<()> {
        self.0.wait_event(s, e)
    }
    fn synchronize_event(&self, e: strata::EventId) -> Result<()> {
        self.0.synchronize_event(e)
    }
    fn elapsed_ms(&self, a: strata::EventId, b: strata::EventId) -> Result<f64> {
        self.0.elapsed_ms(a, b)
    }
    fn destroy_event(&self, e: strata::EventId) {
        self.0.destroy_event(e)
    }
    fn synchronize_stream(&self, s: strata::StreamId) -> Result<()> {
        self.0.synchronize_stream(s)
    }
    fn synchronize(&self) -> Result<()> {
        self.0.synchronize()
    }
}

/// SplitMix64: small, seedable, the same sequence everywhere (the random programs and
/// chains draw from it).
///
/// ```
/// let mut a = strata_tests::Rng(7);
/// let mut b = strata_tests::Rng(7);
/// assert_eq!(a.word(), b.word());
/// assert!(a.below(3) < 3);
/// ```
pub struct Rng(pub u64);

impl Rng {
    /// The next 64 random bits.
    pub fn word(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// A number below `n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.word() % n.max(1) as u64) as usize
    }
    /// True `percent` times in a hundred.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.word() % 100 < percent
    }
    /// One of `items` (which must not be empty).
    pub fn pick<T: Clone>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())].clone()
    }
}
