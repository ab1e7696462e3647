//! The Chrome trace event format (what PyTorch's profiler writes; Perfetto and
//! chrome://tracing open it): one process for the device, a "host" track with each call's
//! enqueue span and waits, one track per stream with the kernels and copies as complete
//! (`X`) events at their device times, events as instant (`i`) markers, and flow arrows from
//! each enqueue to the work it started. Times are microseconds. Several devices' profiles
//! make one trace with a process per device, on the earliest profile's clock.

use super::{Profile, ProfileRecord, RecordKind};
use crate::error::{Error, Result};
use std::fmt::Write;

/// The host's track id; stream `k` is track `k + 1`.
const HOST_TID: u64 = 0;

fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn stream_tid(r: &ProfileRecord) -> u64 {
    r.stream.0 + 1
}

/// The `args` object of a record: ops, launch, bytes, FLOPs and rates.
fn args(r: &ProfileRecord, p: &Profile) -> String {
    let mut a = vec![format!("\"ops\":{}", json_string(&r.ops.join(" ")))];
    if let Some(l) = &r.launch {
        a.push(format!("\"launch\":{}", json_string(l)));
    }
    a.push(format!("\"bytes read\":{}", r.bytes_read));
    a.push(format!("\"bytes written\":{}", r.bytes_written));
    if r.flops > 0 {
        a.push(format!("\"flops\":{}", r.flops));
    }
    if let Some(g) = r.gb_per_s() {
        a.push(format!("\"GB/s\":{g:.3}"));
    }
    if let Some(f) = p.fraction_of_copy_bandwidth(r) {
        a.push(format!("\"fraction of copy bandwidth\":{f:.4}"));
    }
    format!("{{{}}}", a.join(","))
}

/// The trace of `profiles` as JSON text: profile `k` is process `k + 1`, its times shifted
/// onto the earliest profile's clock.
pub(super) fn render(profiles: &[&Profile]) -> String {
    let first = profiles.iter().map(|p| p.started).min();
    let mut events = Vec::new();
    let mut flows = 0;
    for (k, p) in profiles.iter().enumerate() {
        let shift = first.map_or(0.0, |f| (p.started - f).as_secs_f64() * 1e6);
        events_of(p, k as u64 + 1, shift, &mut flows, &mut events);
    }
    let names: Vec<&str> = profiles.iter().map(|p| p.device.as_str()).collect();
    let timings: Vec<&str> = profiles.iter().map(|p| p.timing.as_str()).collect();
    format!(
        "{{\"traceEvents\":[\n{}\n],\"displayTimeUnit\":\"ms\",\"otherData\":{{\"device\":{},\"timing\":{}}}}}\n",
        events.join(",\n"),
        json_string(&names.join(", ")),
        json_string(&timings.join(", "))
    )
}

/// Profile `p`'s events as process `pid`, times shifted by `shift` µs; flow ids from
/// `flows` on.
fn events_of(p: &Profile, pid: u64, shift: f64, flows: &mut usize, events: &mut Vec<String>) {
    events.extend([
        format!(
            "{{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":{pid},\"tid\":{HOST_TID},\"args\":{{\"name\":{}}}}}",
            json_string(&format!("strata {}", p.device))
        ),
        format!(
            "{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":{pid},\"tid\":{HOST_TID},\"args\":{{\"name\":\"host\"}}}}"
        ),
    ]);
    for s in p.streams() {
        events.push(format!(
            "{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":{pid},\"tid\":{},\"args\":{{\"name\":\"stream #{}\"}}}}",
            s.0 + 1,
            s.0
        ));
    }
    for r in &p.records {
        let k = *flows;
        *flows += 1;
        let name = json_string(&r.name);
        let cat = r.kind.label();
        let host_dur = (r.host_end_us - r.host_start_us).max(0.0);
        // The host's side: the call (enqueue, allocation, wait) on the host track.
        events.push(format!(
            "{{\"name\":{name},\"cat\":\"host {cat}\",\"ph\":\"X\",\"ts\":{:.3},\"dur\":{host_dur:.3},\"pid\":{pid},\"tid\":{HOST_TID},\"args\":{}}}",
            r.host_start_us + shift,
            args(r, p)
        ));
        match (r.kind, r.device_start_us, r.device_end_us) {
            (kind, Some(start), Some(end)) if kind.is_device_work() => {
                let start = start + shift;
                events.push(format!(
                    "{{\"name\":{name},\"cat\":\"{cat}\",\"ph\":\"X\",\"ts\":{start:.3},\"dur\":{:.3},\"pid\":{pid},\"tid\":{},\"args\":{}}}",
                    (end + shift - start).max(0.0),
                    stream_tid(r),
                    args(r, p)
                ));
                // A flow arrow from the enqueue to the work it started.
                events.push(format!(
                    "{{\"name\":\"enqueue\",\"cat\":\"flow\",\"ph\":\"s\",\"id\":{k},\"ts\":{:.3},\"pid\":{pid},\"tid\":{HOST_TID}}}",
                    r.host_start_us + shift
                ));
                events.push(format!(
                    "{{\"name\":\"enqueue\",\"cat\":\"flow\",\"ph\":\"f\",\"bp\":\"e\",\"id\":{k},\"ts\":{start:.3},\"pid\":{pid},\"tid\":{}}}",
                    stream_tid(r)
                ));
            }
            (RecordKind::EventRecord | RecordKind::EventWait, Some(at), _) => {
                let at = at + shift;
                events.push(format!(
                    "{{\"name\":{name},\"cat\":\"{cat}\",\"ph\":\"i\",\"s\":\"t\",\"ts\":{at:.3},\"pid\":{pid},\"tid\":{}}}",
                    stream_tid(r)
                ));
            }
            _ => {}
        }
    }
}

impl Profile {
    /// The profile in the Chrome trace event format (JSON), as PyTorch's profiler writes it.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let dev = Device::cpu();
    /// let p = dev.profile(|| Tensor::ones([4], DType::F32, &dev).map(|_| ()))?;
    /// let json = p.to_chrome_trace();
    /// assert!(json.starts_with("{\"traceEvents\":["));
    /// assert!(json.contains("\"thread_name\""));
    /// # Ok::<(), strata_core::Error>(())
    /// ```
    pub fn to_chrome_trace(&self) -> String {
        render(&[self])
    }

    /// Several devices' profiles (recorded over the same span) as one Chrome trace: a process
    /// per device with its host and stream tracks, on the earliest profile's clock.
    ///
    /// ```
    /// use strata_core::{Device, DType, Profile, Tensor};
    /// let (a, b) = (Device::cpu(), Device::cpu());
    /// let (pa, pb) = (a.start_profiling()?, b.start_profiling()?);
    /// Tensor::ones([4], DType::F32, &b)?.to_device(&a)?.realize()?;
    /// let json = Profile::chrome_trace_of(&[&pa.stop()?, &pb.stop()?]);
    /// assert!(json.contains("\"pid\":1") && json.contains("\"pid\":2"));
    /// # Ok::<(), strata_core::Error>(())
    /// ```
    pub fn chrome_trace_of(profiles: &[&Profile]) -> String {
        render(profiles)
    }

    /// Writes [`to_chrome_trace`](Profile::to_chrome_trace) to `path`, for Perfetto
    /// (ui.perfetto.dev) or chrome://tracing.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let dev = Device::cpu();
    /// let p = dev.profile(|| Tensor::ones([4], DType::F32, &dev).map(|_| ()))?;
    /// let path = std::env::temp_dir().join("strata-doc-trace.json");
    /// p.save_chrome_trace(&path)?;
    /// assert!(std::fs::read_to_string(&path).unwrap().contains("traceEvents"));
    /// # Ok::<(), strata_core::Error>(())
    /// ```
    pub fn save_chrome_trace(&self, path: impl AsRef<std::path::Path>) -> Result<()> {
        let path = path.as_ref();
        std::fs::write(path, self.to_chrome_trace()).map_err(|e| {
            Error::Invalid(format!(
                "cannot write the Chrome trace to {}: {e}",
                path.display()
            ))
        })
    }
}
