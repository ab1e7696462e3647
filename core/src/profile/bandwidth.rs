//! The device's copy bandwidth, the yardstick for each kernel's GB/s: measured once per
//! device (a copy of a large buffer, best of five) and cached on disk, so no profile pays for
//! it twice. The cache is `$STRATA_CACHE_DIR/copy-bandwidth.tsv` (else
//! `$XDG_CACHE_HOME/strata/`, else `~/.cache/strata/`): one `device name<TAB>GB/s` per line.

use crate::backend::BackendKind;
use crate::device::Device;
use crate::dtype::DType;
use crate::error::Result;
use crate::tensor::Tensor;
use std::path::PathBuf;
use std::time::Instant;

const FILE: &str = "copy-bandwidth.tsv";

impl Device {
    /// The device's copy bandwidth in GB/s (bytes read plus bytes written per second by a
    /// copy of a large buffer), measured the first time it is asked for on this machine and
    /// cached on disk; `None` when it cannot be measured. Profiles report each kernel's
    /// share of it.
    ///
    /// ```
    /// let dev = strata_core::Device::cpu();
    /// let gbs = dev.copy_bandwidth_gb_per_s().unwrap();
    /// assert!(gbs > 0.0);
    /// assert_eq!(dev.copy_bandwidth_gb_per_s(), Some(gbs)); // measured once
    /// ```
    pub fn copy_bandwidth_gb_per_s(&self) -> Option<f64> {
        *self.profile_state_ref().copy_bandwidth.get_or_init(|| {
            // A debug build's CPU backend is several times slower: its own line.
            let name = if cfg!(debug_assertions) {
                format!("{} (debug build)", self.name())
            } else {
                self.name()
            };
            cached(&name).or_else(|| {
                let measured = measure(self).ok().filter(|g| g.is_finite() && *g > 0.0)?;
                store(&name, measured);
                Some(measured)
            })
        })
    }
}

fn cache_dir() -> Option<PathBuf> {
    let env = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    env("STRATA_CACHE_DIR")
        .or_else(|| env("XDG_CACHE_HOME").map(|d| d.join("strata")))
        .or_else(|| env("HOME").map(|d| d.join(".cache").join("strata")))
}

fn cached(name: &str) -> Option<f64> {
    let text = std::fs::read_to_string(cache_dir()?.join(FILE)).ok()?;
    text.lines()
        .filter_map(|l| l.rsplit_once('\t'))
        .find(|(n, _)| *n == name)
        .and_then(|(_, v)| v.trim().parse().ok())
}

/// Adds (or replaces) the line of `name`. A cache: failing to write only means measuring
/// again next time.
fn store(name: &str, gb_per_s: f64) {
    let Some(dir) = cache_dir() else { return };
    let path = dir.join(FILE);
    let mut lines: Vec<String> = std::fs::read_to_string(&path)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.rsplit_once('\t').is_some_and(|(n, _)| n != name))
        .map(str::to_string)
        .collect();
    lines.push(format!(
        "{}\t{gb_per_s:.1}",
        name.replace(['\t', '\n'], " ")
    ));
    let _ = std::fs::create_dir_all(&dir);
    let _ = std::fs::write(path, lines.join("\n") + "\n");
}

/// Best of five copies of a buffer large enough to reach the bandwidth (timed with events
/// where the device has them, else by the host around a wait).
fn measure(dev: &Device) -> Result<f64> {
    let bytes: usize = match dev.kind() {
        BackendKind::Cuda => 256 << 20,
        _ => 32 << 20,
    };
    let src = Tensor::zeros([bytes / 4], DType::F32, dev)?;
    let dst = Tensor::zeros([bytes / 4], DType::F32, dev)?;
    let stream = dev.current_stream();
    let mut best = f64::INFINITY;
    for _ in 0..5 {
        dev.synchronize()?;
        let host = Instant::now();
        let start = stream.record_event()?;
        dst.assign(&src)?;
        let end = stream.record_event()?;
        end.synchronize()?;
        let ms = start
            .elapsed_ms(&end)
            .unwrap_or_else(|_| host.elapsed().as_secs_f64() * 1e3);
        best = best.min(ms);
    }
    Ok(2.0 * bytes as f64 / (best.max(1e-6) * 1e6))
}
