//! What the profiler records, as plain data: the kinds of records, one record, and a device's
//! profiling state (the recorder a profile fills). Nothing here reaches the device, so the
//! device can hold its state; the recording itself is `recorder`'s.

use crate::backend::{EventId, StreamId};
use std::sync::atomic::AtomicBool;
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

/// What one record is.
///
/// ```
/// assert_eq!(strata_core::RecordKind::Kernel.label(), "kernel");
/// assert!(strata_core::RecordKind::Upload.is_device_work());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RecordKind {
    /// A kernel launch.
    Kernel,
    /// A copy from host memory to the device.
    Upload,
    /// A copy from the device to host memory (it waits for the stream first).
    Download,
    /// A buffer taken from the device's allocator.
    Allocate,
    /// The host waiting for the device, a stream or an event.
    Synchronize,
    /// The host compiling (or loading from the disk cache) a kernel on its first use.
    Compile,
    /// An event recorded on a stream.
    EventRecord,
    /// A stream made to wait for an event.
    EventWait,
}

impl RecordKind {
    /// A short lower-case name: `kernel`, `upload`, `download`, `allocate`, `synchronize`,
    /// `compile`, `event`, `wait`.
    ///
    /// ```
    /// assert_eq!(strata_core::RecordKind::EventWait.label(), "wait");
    /// ```
    pub fn label(self) -> &'static str {
        match self {
            RecordKind::Kernel => "kernel",
            RecordKind::Upload => "upload",
            RecordKind::Download => "download",
            RecordKind::Allocate => "allocate",
            RecordKind::Synchronize => "synchronize",
            RecordKind::Compile => "compile",
            RecordKind::EventRecord => "event",
            RecordKind::EventWait => "wait",
        }
    }

    /// Kernels and copies: work that occupies a stream on the device (a bar on the timeline).
    ///
    /// ```
    /// assert!(!strata_core::RecordKind::Synchronize.is_device_work());
    /// ```
    pub fn is_device_work(self) -> bool {
        matches!(
            self,
            RecordKind::Kernel | RecordKind::Upload | RecordKind::Download
        )
    }
}

/// One thing the device (or the host waiting for it) did while a profile recorded. Times are
/// microseconds since the profile started; device times are `None` where the backend could
/// not time them (see [`Profile::timing`](crate::profile::Profile::timing)).
///
/// ```
/// use strata_core::{Device, DType, RecordKind, Tensor};
/// let dev = Device::cpu();
/// let a = Tensor::ones([256], DType::F32, &dev)?;
/// let profile = dev.profile(|| {
///     (&a * 2.0)?.realize()?;
///     Ok(())
/// })?;
/// let k = profile.records.iter().find(|r| r.kind == RecordKind::Kernel).unwrap();
/// assert_eq!(k.ops, vec!["mul"]);
/// assert_eq!((k.bytes_read, k.bytes_written), (1024, 1024));
/// # Ok::<(), strata_core::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct ProfileRecord {
    /// Kernel, copy, allocation, synchronization or event.
    pub kind: RecordKind,
    /// The kernel function (`strata_map`, `cublasGemmEx`, ...) or what was done.
    pub name: String,
    /// The user ops the kernel computes (after fusion, the ops fused into it).
    pub ops: Vec<String>,
    /// The launch shape, where the backend says.
    pub launch: Option<String>,
    /// The stream it was issued on.
    pub stream: StreamId,
    /// When the host started issuing it.
    pub host_start_us: f64,
    /// When the call returned to the host (for asynchronous work, long before it ran).
    pub host_end_us: f64,
    /// When the device started it.
    pub device_start_us: Option<f64>,
    /// When the device finished it.
    pub device_end_us: Option<f64>,
    /// Bytes read: each operand's distinct elements (a broadcast operand counts once).
    pub bytes_read: u64,
    /// Bytes written (for an allocation: its size).
    pub bytes_written: u64,
    /// Floating-point (or integer) operations: one per arithmetic node per element, two per
    /// fused multiply-add, `2·m·n·k` per matmul.
    pub flops: u64,
}

impl ProfileRecord {
    /// Device time in microseconds, where timed.
    ///
    /// ```
    /// # use strata_core::{ProfileRecord, RecordKind, StreamId};
    /// let mut r = ProfileRecord::new(RecordKind::Kernel, "k", StreamId::DEFAULT);
    /// r.device_start_us = Some(2.0);
    /// r.device_end_us = Some(5.0);
    /// assert_eq!(r.device_us(), Some(3.0));
    /// ```
    pub fn device_us(&self) -> Option<f64> {
        Some((self.device_end_us? - self.device_start_us?).max(0.0))
    }

    /// Bytes moved per second of device time, in GB/s (10⁹ bytes).
    ///
    /// ```
    /// # use strata_core::{ProfileRecord, RecordKind, StreamId};
    /// let mut r = ProfileRecord::new(RecordKind::Kernel, "k", StreamId::DEFAULT);
    /// (r.device_start_us, r.device_end_us) = (Some(0.0), Some(1.0));
    /// (r.bytes_read, r.bytes_written) = (1000, 1000);
    /// assert_eq!(r.gb_per_s(), Some(2.0));
    /// ```
    pub fn gb_per_s(&self) -> Option<f64> {
        let us = self.device_us().filter(|&t| t > 0.0)?;
        let bytes = self.bytes_read + self.bytes_written;
        (self.kind.is_device_work() && bytes > 0).then(|| bytes as f64 / us / 1e3)
    }

    /// Operations per second of device time, in GFLOP/s.
    ///
    /// ```
    /// # use strata_core::{ProfileRecord, RecordKind, StreamId};
    /// let mut r = ProfileRecord::new(RecordKind::Kernel, "k", StreamId::DEFAULT);
    /// (r.device_start_us, r.device_end_us, r.flops) = (Some(0.0), Some(2.0), 4000);
    /// assert_eq!(r.gflop_per_s(), Some(2.0));
    /// ```
    pub fn gflop_per_s(&self) -> Option<f64> {
        let us = self.device_us().filter(|&t| t > 0.0)?;
        (self.flops > 0).then(|| self.flops as f64 / us / 1e3)
    }

    /// A record with no ops, times or bytes.
    ///
    /// ```
    /// # use strata_core::{ProfileRecord, RecordKind, StreamId};
    /// let r = ProfileRecord::new(RecordKind::Allocate, "allocate", StreamId::DEFAULT);
    /// assert_eq!(r.bytes_written, 0);
    /// ```
    pub fn new(kind: RecordKind, name: impl Into<String>, stream: StreamId) -> ProfileRecord {
        ProfileRecord {
            kind,
            name: name.into(),
            ops: Vec::new(),
            launch: None,
            stream,
            host_start_us: 0.0,
            host_end_us: 0.0,
            device_start_us: None,
            device_end_us: None,
            bytes_read: 0,
            bytes_written: 0,
            flops: 0,
        }
    }
}

/// Records with device times at most: wgpu keeps 4096 timestamps in a ring, two per record.
pub(crate) const DEVICE_TIMED_RECORDS: usize = 1500;

/// A device's profiling state (inside the device, like every other piece of state).
#[derive(Default)]
pub(crate) struct ProfileState {
    /// Whether a recorder is installed: the only thing a hook reads when none is.
    pub(crate) on: AtomicBool,
    pub(crate) recorder: Mutex<Option<Recorder>>,
    /// Measured copy bandwidth in GB/s (`None`: could not be measured).
    pub(crate) copy_bandwidth: OnceLock<Option<f64>>,
}

/// How device times are taken.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Timing {
    /// Events on the stream before and after each record, read against a base event.
    Events(EventId),
    /// The adapter cannot time events: each op is waited for, and its device time is from
    /// its enqueue to the end of that wait.
    PerSubmission,
    /// Past [`DEVICE_TIMED_RECORDS`]: recorded without device times.
    Untimed,
}

/// What a profile has recorded so far.
pub(crate) struct Recorder {
    pub(crate) zero: Instant,
    pub(crate) timing: Timing,
    /// Printing mode (`STRATA_PROFILE=1`): the table is printed at each synchronization.
    pub(crate) printing: bool,
    pub(crate) records: Vec<(ProfileRecord, Option<EventId>, Option<EventId>)>,
    pub(crate) timed: usize,
    /// While exponents are counted ([`Device::profile_exponents`](crate::Device::profile_exponents)):
    /// per float kernel output, its record's index, its dtype and the device buffer its
    /// exponent counts go to.
    pub(crate) exponents: Option<Vec<(usize, crate::dtype::DType, crate::backend::Operand)>>,
}

impl Recorder {
    pub(crate) fn us(&self, t: Instant) -> f64 {
        t.saturating_duration_since(self.zero).as_secs_f64() * 1e6
    }
}
