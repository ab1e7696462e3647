//! The Chrome trace event format (what PyTorch's profiler writes; Perfetto and
//! chrome://tracing open it): one process for the device, a "host" track with each call's
//! enqueue span and waits, one track per stream with the kernels and copies as complete
//! (`X`) events at their device times, events as instant (`i`) markers, and flow arrows from
//! each enqueue to the work it started. Times are microseconds.

use super::{Profile, ProfileRecord, RecordKind};
use crate::error::{Error, Result};
use std::fmt::Write;

/// The host's track id; stream `k` is track `k + 1`.
const HOST_TID: u64 = 0;
const PID: u64 = 1;

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

/// The trace as JSON text.
pub(super) fn render(p: &Profile) -> String {
    let mut events = vec![
        format!(
            "{{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":{PID},\"tid\":{HOST_TID},\"args\":{{\"name\":{}}}}}",
            json_string(&format!("strata {}", p.device))
        ),
        format!(
            "{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":{PID},\"tid\":{HOST_TID},\"args\":{{\"name\":\"host\"}}}}"
        ),
    ];
    for s in p.streams() {
        events.push(format!(
            "{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":{PID},\"tid\":{},\"args\":{{\"name\":\"stream #{}\"}}}}",
            s.0 + 1,
            s.0
        ));
    }
    for (k, r) in p.records.iter().enumerate() {
        let name = json_string(&r.name);
        let cat = r.kind.label();
        let host_dur = (r.host_end_us - r.host_start_us).max(0.0);
        // The host's side: the call (enqueue, allocation, wait) on the host track.
        events.push(format!(
            "{{\"name\":{name},\"cat\":\"host {cat}\",\"ph\":\"X\",\"ts\":{:.3},\"dur\":{host_dur:.3},\"pid\":{PID},\"tid\":{HOST_TID},\"args\":{}}}",
            r.host_start_us,
            args(r, p)
        ));
        match (r.kind, r.device_start_us, r.device_end_us) {
            (kind, Some(start), Some(end)) if kind.is_device_work() => {
                events.push(format!(
                    "{{\"name\":{name},\"cat\":\"{cat}\",\"ph\":\"X\",\"ts\":{start:.3},\"dur\":{:.3},\"pid\":{PID},\"tid\":{},\"args\":{}}}",
                    (end - start).max(0.0),
                    stream_tid(r),
                    args(r, p)
                ));
                // A flow arrow from the enqueue to the work it started.
                events.push(format!(
                    "{{\"name\":\"enqueue\",\"cat\":\"flow\",\"ph\":\"s\",\"id\":{k},\"ts\":{:.3},\"pid\":{PID},\"tid\":{HOST_TID}}}",
                    r.host_start_us
                ));
                events.push(format!(
                    "{{\"name\":\"enqueue\",\"cat\":\"flow\",\"ph\":\"f\",\"bp\":\"e\",\"id\":{k},\"ts\":{start:.3},\"pid\":{PID},\"tid\":{}}}",
                    stream_tid(r)
                ));
            }
            (RecordKind::EventRecord | RecordKind::EventWait, Some(at), _) => {
                events.push(format!(
                    "{{\"name\":{name},\"cat\":\"{cat}\",\"ph\":\"i\",\"s\":\"t\",\"ts\":{at:.3},\"pid\":{PID},\"tid\":{}}}",
                    stream_tid(r)
                ));
            }
            _ => {}
        }
    }
    format!(
        "{{\"traceEvents\":[\n{}\n],\"displayTimeUnit\":\"ms\",\"otherData\":{{\"device\":{},\"timing\":{}}}}}\n",
        events.join(",\n"),
        json_string(&p.device),
        json_string(&p.timing)
    )
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
        render(self)
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
