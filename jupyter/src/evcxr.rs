//! The kernel program (`evcxr_jupyter`): finding it, installing it, and warming its cache.

use crate::paths;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The evcxr release strata is tested with.
pub const EVCXR_VERSION: &str = "0.22.0";

/// The client that runs cells in a fresh kernel (needs Python's `jupyter_client`).
const RUN_CELLS_PY: &str = include_str!("run_cells.py");

/// The cell that warms the cache: it builds strata, opens the best device and displays a
/// tensor, which is what a notebook's first cell does.
pub const WARM_CELL: &str =
    "let dev = Device::auto()?;\nlet t = Tensor::ones([2, 3], DType::F32, &dev)?;\nt";

/// `evcxr_jupyter`, installing it with cargo when it is missing.
pub fn find_or_install() -> Result<PathBuf, String> {
    if let Some(path) = paths::find_program("evcxr_jupyter") {
        return Ok(path);
    }
    eprintln!(
        "evcxr_jupyter is not installed. Installing it now with\n  \
         cargo install evcxr_jupyter --version {EVCXR_VERSION} --locked\n\
         This compiles about 400 crates: expect about 15 minutes on two cores."
    );
    let status = Command::new("cargo")
        .args([
            "install",
            "evcxr_jupyter",
            "--version",
            EVCXR_VERSION,
            "--locked",
        ])
        .status()
        .map_err(|e| format!("could not run cargo to install evcxr_jupyter: {e}"))?;
    if !status.success() {
        return Err(format!(
            "`cargo install evcxr_jupyter --version {EVCXR_VERSION} --locked` failed ({status})"
        ));
    }
    paths::find_program("evcxr_jupyter").ok_or_else(|| {
        "evcxr_jupyter was installed but is not on PATH nor in ~/.cargo/bin".to_string()
    })
}

/// The installed evcxr_jupyter's version, from `cargo install --list`.
pub fn installed_version() -> Option<String> {
    let out = Command::new("cargo")
        .args(["install", "--list"])
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("evcxr_jupyter v"))
        .map(|rest| rest.trim_end_matches(':').to_string())
}

/// A Python that has `jupyter_client`: `--python`, the active virtual environment, the
/// repository's `.venv`, then `python3`.
pub fn find_python(explicit: Option<&Path>, repo: &Path) -> Option<PathBuf> {
    let candidates: Vec<PathBuf> = explicit
        .map(Path::to_path_buf)
        .into_iter()
        .chain(std::env::var_os("VIRTUAL_ENV").map(|v| PathBuf::from(v).join("bin/python")))
        .chain([repo.join(".venv/bin/python"), PathBuf::from("python3")])
        .collect();
    let python = candidates.into_iter().find(|py| {
        Command::new(py)
            .args(["-c", "import jupyter_client"])
            .output()
            .is_ok_and(|o| o.status.success())
    })?;
    // A kernelspec names it by an absolute path (a virtual environment's `python` is not
    // resolved through its symlink, which would leave the environment).
    if python.components().count() == 1 {
        return crate::paths::find_program(&python.to_string_lossy());
    }
    std::path::absolute(&python).ok()
}

/// Runs `cells` in a fresh kernel named `kernel` with `python`, printing the timings.
pub fn run_cells(python: &Path, kernel: &str, cells: &[&str]) -> Result<(), String> {
    let script = std::env::temp_dir().join(format!("strata-run-cells-{}.py", std::process::id()));
    std::fs::write(&script, RUN_CELLS_PY).map_err(|e| format!("{}: {e}", script.display()))?;
    let status = Command::new(python)
        .arg(&script)
        .arg(kernel)
        .args(cells)
        .status();
    let _ = std::fs::remove_file(&script);
    match status {
        Ok(s) if s.success() => Ok(()),
        Ok(s) => Err(format!("a cell failed in the {kernel} kernel ({s})")),
        Err(e) => Err(format!("could not run {}: {e}", python.display())),
    }
}
