//! `strata-jupyter doctor`: what the kernel needs, what is there, and what to do otherwise.

use crate::{evcxr, paths};
use std::path::Path;
use strata::prelude::{Device, DeviceExt};

/// One finding: whether it is fine, what it is, and the detail or the fix.
struct Check {
    status: Status,
    what: String,
    detail: String,
}

#[derive(Clone, Copy, PartialEq)]
enum Status {
    /// There and working.
    Ok,
    /// Optional and absent: said, not counted as a problem.
    Absent,
    /// Needed by the kernel and missing.
    Missing,
}

fn check(ok: bool, what: &str, detail: impl Into<String>) -> Check {
    Check {
        status: if ok { Status::Ok } else { Status::Missing },
        what: what.into(),
        detail: detail.into(),
    }
}

fn absent(what: &str, detail: impl Into<String>) -> Check {
    Check {
        status: Status::Absent,
        what: what.into(),
        detail: detail.into(),
    }
}

fn devices() -> Vec<Check> {
    let mut out = vec![check(true, "device cpu", "the CPU reference backend")];
    match Device::cuda(0) {
        Ok(dev) => out.push(check(true, "device cuda", dev.name())),
        Err(e) => out.push(absent("device cuda", e.to_string())),
    }
    let adapters = strata_wgpu::adapters();
    if adapters.is_empty() {
        out.push(absent(
            "device wgpu",
            "no adapter (on Linux without a GPU: apt-get install mesa-vulkan-drivers libvulkan1)",
        ));
    }
    for a in adapters {
        out.push(check(
            true,
            "device wgpu",
            format!("{} ({:?}, {:?})", a.name, a.backend, a.device_type),
        ));
    }
    let best = Device::auto().map_or_else(|e| format!("error: {e}"), |d| d.name());
    out.push(check(true, "Device::auto()", best));
    out
}

fn kernel(kernel_dir: Option<&Path>) -> Vec<Check> {
    let mut out = Vec::new();
    match paths::find_program("evcxr_jupyter") {
        Some(p) => out.push(check(
            true,
            "evcxr_jupyter",
            format!(
                "{} (version {})",
                p.display(),
                evcxr::installed_version().unwrap_or_else(|| "unknown".into())
            ),
        )),
        None => out.push(check(
            false,
            "evcxr_jupyter",
            "missing: `strata-jupyter install` installs it (about 15 minutes on two cores)",
        )),
    }
    for tool in ["cargo", "rustc"] {
        out.push(match paths::find_program(tool) {
            Some(p) => check(true, tool, p.display().to_string()),
            None => check(
                false,
                tool,
                "missing: evcxr compiles every cell with it (rustup.rs)",
            ),
        });
    }
    let Some(dir) = kernel_dir else {
        out.push(check(
            false,
            "Jupyter data dir",
            "unknown: set HOME or JUPYTER_DATA_DIR",
        ));
        return out;
    };
    out.push(check(
        true,
        "Jupyter data dir",
        dir.parent()
            .and_then(Path::parent)
            .map_or(String::new(), |d| d.display().to_string()),
    ));
    if dir.join("kernel.json").is_file() {
        out.push(check(true, "kernelspec", dir.display().to_string()));
        let spec = std::fs::read_to_string(dir.join("kernel.json")).unwrap_or_default();
        out.push(if spec.contains(crate::kernelspec::PROXY_FILE) {
            check(
                true,
                "socket proxy",
                "libzmq holds IOPub and the heartbeat for evcxr",
            )
        } else {
            Check {
                status: Status::Absent,
                what: "socket proxy".into(),
                detail:
                    "none: reinstall with a Python that has jupyter_client (--python) so that one \
                 stalled client cannot hang the kernel (issue 18)"
                        .into(),
            }
        });
        let init = paths::evcxr_config_dir(dir).join("init.evcxr");
        let dep = std::fs::read_to_string(&init).ok().and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(":dep"))
                .map(str::to_string)
        });
        out.push(match dep {
            Some(dep) => check(true, "strata source", dep),
            None => check(
                false,
                "strata source",
                format!("{} has no :dep line", init.display()),
            ),
        });
    } else {
        out.push(check(
            false,
            "kernelspec",
            format!("missing at {}: run `strata-jupyter install`", dir.display()),
        ));
    }
    out
}

fn environment() -> Vec<Check> {
    let mut out = Vec::new();
    if let Some(cache) = paths::evcxr_cache_dir() {
        let (bytes, files) = paths::du(&cache);
        out.push(check(
            true,
            "evcxr cache",
            if files == 0 {
                format!(
                    "{} is empty: the first notebook builds strata (minutes); \
                     `strata-jupyter install` warms it",
                    cache.display()
                )
            } else {
                format!(
                    "{}: {:.0} MiB in {files} files",
                    cache.display(),
                    bytes as f64 / 1048576.0
                )
            },
        ));
    }
    out.push(match jupyter() {
        Some(p) => check(true, "jupyter", p.display().to_string()),
        None => absent(
            "jupyter",
            "not on PATH nor in .venv (scripts/notebook.sh installs JupyterLab into .venv)",
        ),
    });
    out
}

/// `jupyter` on PATH, else the one scripts/notebook.sh puts in `.venv`.
fn jupyter() -> Option<std::path::PathBuf> {
    paths::find_program("jupyter").or_else(|| {
        let venv = Path::new(".venv/bin/jupyter");
        venv.is_file().then(|| venv.to_path_buf())
    })
}

/// Prints every finding; `Err` when something the kernel needs is missing.
pub fn run() -> Result<(), String> {
    // The device probes load the Vulkan loader, whose Wayland probe prints an error line per
    // probe without XDG_RUNTIME_DIR; the kernelspec sets it for kernels, and here likewise.
    if std::env::var_os("XDG_RUNTIME_DIR").is_none() {
        let dir = std::env::temp_dir().join(format!("strata-xdg-{}", std::process::id()));
        if std::fs::create_dir_all(&dir).is_ok() {
            // Single-threaded here: nothing reads the environment concurrently.
            std::env::set_var("XDG_RUNTIME_DIR", &dir);
        }
    }
    let kernel_dir = paths::kernel_dir();
    let checks: Vec<Check> = devices()
        .into_iter()
        .chain(kernel(kernel_dir.as_deref()))
        .chain(environment())
        .collect();
    for c in &checks {
        let status = match c.status {
            Status::Ok => "ok     ",
            Status::Absent => "-      ",
            Status::Missing => "MISSING",
        };
        println!("{status} {:<18} {}", c.what, c.detail);
    }
    let missing = checks
        .iter()
        .filter(|c| c.status == Status::Missing)
        .count();
    if missing == 0 {
        println!("\nThe strata kernel is ready: {}", start_hint());
        Ok(())
    } else {
        Err(format!("{missing} thing(s) missing (see above)"))
    }
}

/// How to start JupyterLab on the notebooks: the main job, which installs what is missing,
/// serves `notebooks/` and passes `--allow-root` where it is needed (a bare `jupyter lab`
/// refuses to run as root and serves the current folder).
fn start_hint() -> String {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(|repo| repo.join("scripts").join("notebook.sh"));
    match script.filter(|s| s.is_file()) {
        Some(s) => format!(
            "run `bash {}` (JupyterLab on the notebooks) and pick \"Rust (strata)\".",
            s.display()
        ),
        None => "start JupyterLab (`jupyter lab --notebook-dir=notebooks`, with --allow-root \
                 as root) and pick \"Rust (strata)\"."
            .into(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_start_hint_runs_the_main_job() {
        let hint = super::start_hint();
        assert!(hint.contains("scripts/notebook.sh"), "{hint}");
        assert!(!hint.contains(".venv/bin/jupyter lab"), "{hint}");
    }
}
