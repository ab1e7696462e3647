//! The profiler: what the device did while it recorded. Every kernel launch, host↔device
//! copy, allocation, synchronization and event is a [`ProfileRecord`] with the user ops in the
//! kernel, its name and launch shape, the stream, the host's enqueue time, the device's start
//! and end (timed with the backend's own events: CUDA events, wgpu timestamp queries, the CPU's
//! clock), the bytes moved and the FLOPs. A [`Profile`] prints as a table, shows in a notebook
//! as a table and a stream timeline, and saves as a Chrome trace.
//!
//! Recording costs one relaxed atomic load per launch when no profile records (see
//! BENCHMARKS.md). While one records, every op is bracketed by two events, so CUDA's
//! batching of tiny launches is off and each op is timed on its own.

mod bandwidth;
mod chrome_trace;
mod measure;
mod recorder;
pub(crate) mod table;

use crate::backend::StreamId;
use crate::device::Device;
use crate::error::Result;
pub use crate::profile_record::{ProfileRecord, RecordKind};

/// What a device did while a profile recorded ([`Device::profile`]): the records in the
/// order they were issued. Prints as a table; in a notebook, a table and a timeline with one
/// lane per stream; [`save_chrome_trace`](Profile::save_chrome_trace) writes it for Perfetto.
///
/// ```
/// use strata_core::{Device, DType, RecordKind, Tensor};
/// let dev = Device::cpu();
/// let profile = dev.profile(|| {
///     let a = Tensor::from_slice(&[1.0f32, 2.0, 3.0], [3], &dev)?;
///     let total = a.exp()?.sum(strata_core::ops::Axes::All, false)?.item::<f32>()?;
///     assert!(total > 30.0);
///     Ok(())
/// })?;
/// let kinds: Vec<_> = profile.device_work().map(|r| r.kind).collect();
/// assert_eq!(kinds.first(), Some(&RecordKind::Upload));
/// assert_eq!(kinds.last(), Some(&RecordKind::Download));
/// println!("{profile}");
/// # Ok::<(), strata_core::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct Profile {
    /// The device's name.
    pub device: String,
    /// How device times were taken (events, timestamp queries, per-submission waits).
    pub timing: String,
    /// The device's measured copy bandwidth in GB/s (read plus write, measured once per
    /// device and cached on disk), for each kernel's fraction of it.
    pub copy_bandwidth_gb_per_s: Option<f64>,
    /// The host instant of time 0: every `*_us` of the records counts from it (profiles of
    /// several devices line up on one timeline through it).
    pub started: std::time::Instant,
    /// Everything recorded, in issue order.
    pub records: Vec<ProfileRecord>,
    /// With [`Device::profile_exponents`]: the exponent histogram of each float kernel
    /// output, by the index of the kernel's record (empty otherwise).
    pub exponent_histograms: Vec<(usize, crate::exponent_histogram::ExponentHistogram)>,
}

impl Profile {
    /// The kernels and copies (the records that occupy a stream).
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let dev = Device::cpu();
    /// let p = dev.profile(|| Tensor::zeros([4], DType::F32, &dev).map(|_| ()))?;
    /// assert_eq!(p.device_work().count(), 1); // the fill kernel
    /// # Ok::<(), strata_core::Error>(())
    /// ```
    pub fn device_work(&self) -> impl Iterator<Item = &ProfileRecord> {
        self.records.iter().filter(|r| r.kind.is_device_work())
    }

    /// The streams that appear, in order of id.
    ///
    /// ```
    /// use strata_core::{Device, DType, StreamId, Tensor};
    /// let dev = Device::cpu();
    /// let p = dev.profile(|| Tensor::zeros([4], DType::F32, &dev).map(|_| ()))?;
    /// assert_eq!(p.streams(), vec![StreamId::DEFAULT]);
    /// # Ok::<(), strata_core::Error>(())
    /// ```
    pub fn streams(&self) -> Vec<StreamId> {
        let mut s: Vec<StreamId> = self.records.iter().map(|r| r.stream).collect();
        s.sort();
        s.dedup();
        s
    }

    /// The span of the profile in microseconds: the latest host or device time.
    ///
    /// ```
    /// use strata_core::Device;
    /// let dev = Device::cpu();
    /// let p = dev.profile(|| Ok(()))?;
    /// assert_eq!(p.span_us(), 0.0);
    /// # Ok::<(), strata_core::Error>(())
    /// ```
    pub fn span_us(&self) -> f64 {
        self.records
            .iter()
            .map(|r| r.host_end_us.max(r.device_end_us.unwrap_or(0.0)))
            .fold(0.0, f64::max)
    }

    /// A kernel's share of the device's measured copy bandwidth (`None` for host↔device
    /// copies, which cross another bus).
    ///
    /// ```
    /// # use strata_core::{Profile, ProfileRecord, RecordKind, StreamId};
    /// let mut r = ProfileRecord::new(RecordKind::Kernel, "k", StreamId::DEFAULT);
    /// (r.device_start_us, r.device_end_us, r.bytes_read) = (Some(0.0), Some(1.0), 500);
    /// let p = Profile {
    ///     device: "x".into(),
    ///     timing: String::new(),
    ///     copy_bandwidth_gb_per_s: Some(1.0),
    ///     started: std::time::Instant::now(),
    ///     records: vec![],
    ///     exponent_histograms: vec![],
    /// };
    /// assert_eq!(p.fraction_of_copy_bandwidth(&r), Some(0.5));
    /// ```
    pub fn fraction_of_copy_bandwidth(&self, record: &ProfileRecord) -> Option<f64> {
        // Host↔device copies have their own bus; the yardstick is the device's memory.
        if record.kind != RecordKind::Kernel {
            return None;
        }
        Some(record.gb_per_s()? / self.copy_bandwidth_gb_per_s.filter(|&b| b > 0.0)?)
    }
}

/// A profile being recorded: [`stop`](Profiler::stop) ends it and returns the
/// [`Profile`]. Dropping it unstopped discards what it recorded.
///
/// ```
/// use strata_core::{Device, DType, Tensor};
/// let dev = Device::cpu();
/// let profiler = dev.start_profiling()?;
/// let t = Tensor::ones([8], DType::F32, &dev)?;
/// let profile = profiler.stop()?;
/// assert_eq!(profile.device_work().count(), 1);
/// # Ok::<(), strata_core::Error>(())
/// ```
#[must_use = "stop() returns the profile"]
pub struct Profiler {
    device: Device,
    stopped: bool,
}

impl Profiler {
    /// Ends the recording: runs pending work, waits for the device, reads the device times
    /// and returns the profile.
    ///
    /// ```
    /// let dev = strata_core::Device::cpu();
    /// let p = dev.start_profiling()?.stop()?;
    /// assert!(p.records.is_empty());
    /// # Ok::<(), strata_core::Error>(())
    /// ```
    pub fn stop(mut self) -> Result<Profile> {
        self.stopped = true;
        self.device.stop_profiling()
    }
}

impl Drop for Profiler {
    fn drop(&mut self) {
        if !self.stopped {
            self.device.discard_profile();
        }
    }
}

impl Device {
    /// Starts recording a profile of everything this device does until
    /// [`Profiler::stop`]. Pending work runs and the device is waited for first, so the
    /// profile starts idle. `Err` while another profile records on this device.
    ///
    /// ```
    /// let dev = strata_core::Device::cpu();
    /// let first = dev.start_profiling()?;
    /// assert!(dev.start_profiling().is_err());
    /// first.stop()?;
    /// # Ok::<(), strata_core::Error>(())
    /// ```
    pub fn start_profiling(&self) -> Result<Profiler> {
        self.begin_profile(false, false)?;
        Ok(Profiler {
            device: self.clone(),
            stopped: false,
        })
    }

    /// Runs `f` and returns the profile of what this device did meanwhile (the work `f`
    /// left pending included). `f`'s error is returned after the recording stops.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let dev = Device::cpu();
    /// let a = Tensor::ones([1024], DType::F32, &dev)?;
    /// let profile = dev.profile(|| {
    ///     let y = (&a * 3.0)?.relu()?;
    ///     y.realize()?;
    ///     Ok(())
    /// })?;
    /// let kernel = profile.device_work().next().unwrap();
    /// if dev.fusion() {
    ///     assert_eq!(kernel.ops, vec!["mul", "relu"]); // one fused kernel
    /// }
    /// # Ok::<(), strata_core::Error>(())
    /// ```
    pub fn profile(&self, f: impl FnOnce() -> Result<()>) -> Result<Profile> {
        let profiler = self.start_profiling()?;
        let ran = f();
        let profile = profiler.stop();
        ran?;
        profile
    }

    /// [`profile`](Device::profile), also counting an exponent histogram of every float
    /// kernel output while `f` runs (neon's `hist_bins`): see where values sit against the
    /// f16 and bf16 ranges, op by op. Each count is one more small kernel after the op's
    /// (not in the records), read back when the profile stops. With fusion, a kernel's
    /// outputs are what a fused chain stores, not each op inside it.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let dev = Device::cpu();
    /// let a = Tensor::full([100], 300.0, DType::F32, &dev)?;
    /// let p = dev.profile_exponents(|| (&a * &a)?.realize())?;
    /// let (record, h) = &p.exponent_histograms[0];
    /// assert_eq!(p.records[*record].ops, vec!["mul"]);
    /// assert_eq!(h.count(16), 100); // 90000 overflows f16
    /// # Ok::<(), strata_core::Error>(())
    /// ```
    pub fn profile_exponents(&self, f: impl FnOnce() -> Result<()>) -> Result<Profile> {
        self.begin_profile(false, true)?;
        let profiler = Profiler {
            device: self.clone(),
            stopped: false,
        };
        let ran = f();
        let profile = profiler.stop();
        ran?;
        profile
    }
}
