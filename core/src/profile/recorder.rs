//! Recording: what the device's dispatch hooks (`device.rs`: launch, copy, allocation,
//! synchronization, event) do instead of calling the backend straight while a profile
//! records, and turning what they recorded into a [`Profile`]. With no profile recording a
//! hook costs one relaxed atomic load.

use super::{measure, table, Profile, ProfileRecord, RecordKind};
use crate::backend::{DeviceBuffer, EventId, StreamId};
use crate::backend::{KernelArgs, Operand};
use crate::device::Device;
use crate::dtype::{DType, Scalar};
use crate::error::{Error, Result};
use crate::exponent_histogram::{exponent_bin, ExponentHistogram};
use crate::ir::Expr;
use crate::ir::Kernel;
use crate::profile_record::{ProfileState, Recorder, Timing, DEVICE_TIMED_RECORDS};
use crate::sync::LockUnpoisoned;
use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard};
use std::time::Instant;

impl Device {
    fn profile_state(&self) -> &ProfileState {
        self.profile_state_ref()
    }

    fn lock_recorder(&self) -> MutexGuard<'_, Option<Recorder>> {
        self.profile_state().recorder.lock_unpoisoned()
    }

    /// True while a profile records.
    pub(crate) fn profiling(&self) -> bool {
        self.profile_state().on.load(Ordering::Relaxed)
    }

    /// Installs a recorder. The device is idle first, so device time 0 is the host's 0.
    pub(crate) fn begin_profile(&self, printing: bool, exponents: bool) -> Result<()> {
        let printing_before = {
            let mut guard = self.lock_recorder();
            if guard.as_ref().is_some_and(|r| !r.printing) {
                return Err(Error::Invalid(format!(
                    "a profile is already recording on {}; stop it before starting another",
                    self.name()
                )));
            }
            self.profile_state().on.store(false, Ordering::Relaxed);
            guard.take()
        };
        // A STRATA_PROFILE recorder prints what it has; an explicit profile takes over.
        if let Some(r) = printing_before {
            if r.records.is_empty() {
                self.release_events(&r);
            } else {
                println!("{}", table::text(&self.finish(r)?));
            }
        }
        self.synchronize()?;
        let backend = self.backend();
        // The device is idle: it reaches the base event as soon as it is recorded, so device
        // time 0 is this host instant.
        let base = backend.record_event(StreamId::DEFAULT)?;
        let zero = Instant::now();
        backend.synchronize_event(base)?;
        let timing = match backend.elapsed_ms(base, base) {
            Ok(_) => Timing::Events(base),
            Err(Error::Unsupported(_)) => {
                backend.destroy_event(base);
                Timing::PerSubmission
            }
            Err(e) => {
                backend.destroy_event(base);
                return Err(e);
            }
        };
        *self.lock_recorder() = Some(Recorder {
            zero,
            timing,
            printing,
            records: Vec::new(),
            timed: 0,
            exponents: exponents.then(Vec::new),
        });
        self.profile_state().on.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// Removes the recorder and turns it into a profile.
    pub(crate) fn stop_profiling(&self) -> Result<Profile> {
        self.flush()?;
        let recorder = self.take_recorder();
        let profile = match recorder {
            Some(r) => self.finish(r),
            None => Err(Error::Invalid(format!(
                "no profile is recording on {}",
                self.name()
            ))),
        };
        self.resume_env_profile();
        profile
    }

    /// Drops the recorder without reading it (an unstopped [`Profiler`](super::Profiler)).
    pub(crate) fn discard_profile(&self) {
        if let Some(r) = self.take_recorder() {
            let _ = self.backend().synchronize();
            self.release_events(&r);
        }
        self.resume_env_profile();
    }

    fn take_recorder(&self) -> Option<Recorder> {
        let mut guard = self.lock_recorder();
        self.profile_state().on.store(false, Ordering::Relaxed);
        guard.take()
    }

    /// With `STRATA_PROFILE=1`, records from the start (and again after an explicit profile).
    pub(crate) fn resume_env_profile(&self) {
        if std::env::var("STRATA_PROFILE").is_ok_and(|v| v == "1") {
            if let Err(e) = self.begin_profile(true, false) {
                eprintln!("STRATA_PROFILE: cannot record on {}: {e}", self.name());
            }
        }
    }

    /// In printing mode (`STRATA_PROFILE=1`), prints the table of what was recorded since the
    /// last print and starts again; otherwise nothing.
    pub(crate) fn print_profile_now(&self) -> Result<()> {
        if !self.profiling() {
            return Ok(());
        }
        let recorder = {
            let mut guard = self.lock_recorder();
            match guard.as_ref() {
                Some(r) if r.printing && !r.records.is_empty() => {
                    self.profile_state().on.store(false, Ordering::Relaxed);
                    guard.take()
                }
                _ => None,
            }
        };
        if let Some(r) = recorder {
            let profile = self.finish(r);
            self.resume_env_profile();
            println!("{}", table::text(&profile?));
        }
        Ok(())
    }

    fn finish(&self, r: Recorder) -> Result<Profile> {
        let backend = self.backend();
        let waited = backend.synchronize();
        let mut records: Vec<ProfileRecord> = r.records.iter().map(|x| x.0.clone()).collect();
        let timing = match r.timing {
            Timing::Events(base) => {
                let events: Vec<EventId> = r
                    .records
                    .iter()
                    .flat_map(|(_, a, b)| [*a, *b])
                    .flatten()
                    .collect();
                let times = waited.and_then(|_| backend.event_times_ms(base, &events));
                self.release_events(&r);
                let times = times?;
                let mut next = times.iter().map(|ms| ms * 1e3);
                for (rec, (_, a, b)) in records.iter_mut().zip(&r.records) {
                    if a.is_some() {
                        rec.device_start_us = next.next();
                    }
                    if b.is_some() {
                        rec.device_end_us = next.next();
                    }
                }
                format!(
                    "device times from {} events{}",
                    self.name(),
                    if r.timed >= DEVICE_TIMED_RECORDS {
                        format!(" (the first {DEVICE_TIMED_RECORDS} records only)")
                    } else {
                        String::new()
                    }
                )
            }
            Timing::PerSubmission | Timing::Untimed => {
                waited?;
                format!(
                    "{} cannot time events (no TIMESTAMP_QUERY): each op was waited for, and \
                     its device time runs from its enqueue to the end of that wait",
                    self.name()
                )
            }
        };
        let mut exponent_histograms = Vec::new();
        for (record, dtype, counts) in r.exponents.iter().flatten() {
            let mut bytes = vec![0u8; counts.layout.numel() * 4];
            backend.download(counts.buffer.as_ref(), 0, &mut bytes, StreamId::DEFAULT)?;
            let words: Vec<u64> = bytes
                .chunks_exact(4)
                .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]) as u64)
                .collect();
            exponent_histograms.push((*record, ExponentHistogram::from_counts(*dtype, &words)));
        }
        Ok(Profile {
            device: self.name(),
            started: r.zero,
            timing,
            copy_bandwidth_gb_per_s: self.copy_bandwidth_gb_per_s(),
            records,
            exponent_histograms,
        })
    }

    fn release_events(&self, r: &Recorder) {
        let backend = self.backend();
        for e in r.records.iter().flat_map(|(_, a, b)| [*a, *b]).flatten() {
            backend.destroy_event(e);
        }
        if let Timing::Events(base) = r.timing {
            backend.destroy_event(base);
        }
    }

    /// Whether the next record gets device events (and the recorder's mode).
    fn timing_for_next(&self) -> Option<Timing> {
        let guard = self.lock_recorder();
        let r = guard.as_ref()?;
        Some(match r.timing {
            Timing::Events(_) if r.timed >= DEVICE_TIMED_RECORDS => Timing::Untimed,
            t => t,
        })
    }

    /// Runs `work` (a call that issues device work on `stream`), bracketed by events, and
    /// records it as `record`.
    fn record_work<T>(
        &self,
        mut record: ProfileRecord,
        work: impl FnOnce() -> Result<T>,
    ) -> Result<T> {
        let Some(timing) = self.timing_for_next() else {
            return work();
        };
        let backend = self.backend();
        let stream = record.stream;
        let events = matches!(timing, Timing::Events(_));
        let start_event = if events {
            Some(backend.record_event(stream)?)
        } else {
            None
        };
        let host_start = Instant::now();
        let out = work();
        let host_end = Instant::now();
        let end_event = match (events, &out) {
            (true, Ok(_)) => Some(backend.record_event(stream)?),
            _ => None,
        };
        let waited = if timing == Timing::PerSubmission && out.is_ok() {
            backend.synchronize_stream(stream)?;
            Some(Instant::now())
        } else {
            None
        };
        let mut guard = self.lock_recorder();
        let Some(r) = guard.as_mut() else {
            drop(guard);
            for e in [start_event, end_event].into_iter().flatten() {
                backend.destroy_event(e);
            }
            return out;
        };
        record.host_start_us = r.us(host_start);
        record.host_end_us = r.us(host_end);
        if let Some(done) = waited {
            record.device_start_us = Some(record.host_start_us);
            record.device_end_us = Some(r.us(done));
        }
        if out.is_err() {
            record.name.push_str(" (failed)");
        }
        if end_event.is_some() {
            r.timed += 1;
        }
        r.records.push((record, start_event, end_event));
        out
    }

    /// Records a host-side moment or wait (allocation, synchronization) without device times.
    fn record_host<T>(&self, mut record: ProfileRecord, work: impl FnOnce() -> T) -> T {
        let host_start = Instant::now();
        let out = work();
        let host_end = Instant::now();
        if let Some(r) = self.lock_recorder().as_mut() {
            record.host_start_us = r.us(host_start);
            record.host_end_us = r.us(host_end);
            r.records.push((record, None, None));
        }
        out
    }

    /// [`record_host`](Self::record_host) of a step that says whether it did anything: only
    /// a step that did is recorded (a compile on a kernel's first use).
    fn record_host_if(
        &self,
        mut record: ProfileRecord,
        step: impl FnOnce() -> Result<bool>,
    ) -> Result<bool> {
        let host_start = Instant::now();
        let did = step()?;
        let host_end = Instant::now();
        if did {
            if let Some(r) = self.lock_recorder().as_mut() {
                record.host_start_us = r.us(host_start);
                record.host_end_us = r.us(host_end);
                r.records.push((record, None, None));
            }
        }
        Ok(did)
    }

    /// Records an event (recorded or waited for) on `stream` as a marker with its device time.
    pub(crate) fn record_marker(&self, kind: RecordKind, stream: StreamId, name: String) {
        if !self.profiling() {
            return;
        }
        let marker = match self.timing_for_next() {
            Some(Timing::Events(_)) => self.backend().record_event(stream).ok(),
            _ => None,
        };
        let mut record = ProfileRecord::new(kind, name, stream);
        let mut guard = self.lock_recorder();
        if let Some(r) = guard.as_mut() {
            record.host_start_us = r.us(Instant::now());
            record.host_end_us = record.host_start_us;
            if marker.is_some() {
                r.timed += 1;
            }
            r.records.push((record, marker, None));
        } else if let Some(e) = marker {
            self.backend().destroy_event(e);
        }
    }

    /// A launch recorded: what the backend will launch (`describe_launch`), compiled ahead
    /// (`prepare`) so the events time the kernel alone, and bracketed by events. `fused_ops`:
    /// the user ops a fused kernel holds.
    pub(crate) fn run_kernel_recorded(
        &self,
        kernel: &Kernel,
        args: &KernelArgs,
        stream: StreamId,
        fused_ops: Option<Vec<String>>,
    ) -> Result<()> {
        let backend = self.backend();
        let launch = backend.describe_launch(kernel, args);
        let record = measure::kernel_record(kernel, args, stream, launch, fused_ops);
        let mut compile = ProfileRecord::new(
            RecordKind::Compile,
            format!("compile {}", record.name),
            stream,
        );
        compile.ops = record.ops.clone();
        self.record_host_if(compile, || backend.prepare(kernel, args))?;
        self.record_work(record, || backend.run(kernel, args, stream))?;
        self.count_exponents(args, stream)
    }

    /// While exponents are counted: an exponent histogram of each dense float output of the
    /// kernel just recorded, counted on the device after it (not recorded itself), read back
    /// when the profile stops.
    fn count_exponents(&self, args: &KernelArgs, stream: StreamId) -> Result<()> {
        let record = match self.lock_recorder().as_ref() {
            Some(r) if r.exponents.is_some() => r.records.len().saturating_sub(1),
            _ => return Ok(()),
        };
        let backend = self.backend();
        for out in &args.outputs {
            let dense = out.layout.is_contiguous() && out.layout.offset() == 0;
            if !out.dtype.is_float() || !dense {
                continue;
            }
            let (bin, bins) = exponent_bin(out.dtype);
            let counts = Operand {
                buffer: backend.allocate(bins * 4, stream)?,
                layout: crate::layout::Layout::contiguous(&[bins])?,
                dtype: DType::U32,
            };
            let zero = Kernel::map(Expr::literal(Scalar::U32(0)));
            let only = |inputs: Vec<Operand>| KernelArgs {
                outputs: vec![counts.clone()],
                inputs,
                scalars: vec![],
            };
            backend.run(&zero, &only(vec![]), stream)?;
            let count = Kernel::Histogram {
                bins,
                bin,
                weighted: false,
            };
            backend.run(&count, &only(vec![out.clone()]), stream)?;
            if let Some(list) = self
                .lock_recorder()
                .as_mut()
                .and_then(|r| r.exponents.as_mut())
            {
                list.push((record, out.dtype, counts));
            }
        }
        Ok(())
    }

    /// A host-to-device or device-to-host copy of `bytes` (`kind` names its direction, `name`
    /// the record), recorded with its device time; `copy` does it.
    pub(crate) fn copy_recorded<T>(
        &self,
        kind: RecordKind,
        name: &str,
        bytes: usize,
        stream: StreamId,
        copy: impl FnOnce() -> Result<T>,
    ) -> Result<T> {
        let mut record = ProfileRecord::new(kind, name, stream);
        record.bytes_read = bytes as u64;
        record.bytes_written = bytes as u64;
        self.record_work(record, copy)
    }

    /// An allocation of `bytes`, recorded with its host time.
    pub(crate) fn allocate_recorded(
        &self,
        bytes: usize,
        stream: StreamId,
    ) -> Result<Arc<dyn DeviceBuffer>> {
        let mut record = ProfileRecord::new(RecordKind::Allocate, "allocate", stream);
        record.bytes_written = bytes as u64;
        self.record_host(record, || self.backend().allocate(bytes, stream))
    }

    /// A host wait (`what` names it), recorded with its host time.
    pub(crate) fn wait_recorded_now(
        &self,
        stream: StreamId,
        what: &str,
        wait: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        let record = ProfileRecord::new(RecordKind::Synchronize, what, stream);
        self.record_host(record, wait)
    }
}
