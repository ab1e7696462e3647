//! `strata-jupyter`: installs the strata Jupyter kernel — stock `evcxr_jupyter` with strata
//! preloaded — and checks its set-up.
//!
//! ```text
//! strata-jupyter install [--path] [--source DIR] [--no-warm] [--python PYTHON] [--all-backends]
//! strata-jupyter uninstall
//! strata-jupyter doctor
//! ```

mod doctor;
mod evcxr;
mod kernelspec;
mod paths;

use kernelspec::Source;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

const USAGE: &str = "\
strata-jupyter: the strata Jupyter kernel (\"Rust (strata)\")

  strata-jupyter install [--path] [--source DIR] [--no-warm] [--python PYTHON] [--all-backends]
      Installs evcxr_jupyter when it is missing (about 15 minutes on two cores), writes the
      kernelspec `strata`, and warms evcxr's build cache by running one cell.
      --source DIR   the strata repository to load (default: the one this was built from)
      --path         load the working tree as it is (rebuilt by every new kernel, ~1 min)
                     instead of its committed HEAD through git (cached: starts in seconds)
      --no-warm      skip running the warming cell
      --all-backends build strata with CUDA and wgpu even where this machine has no CUDA
                     device or wgpu adapter (by default a kernel leaves those out: it
                     starts faster and holds less memory)
      --python PY    a Python with jupyter_client: it runs the kernel's socket proxy and the
                     warming cell
  strata-jupyter uninstall
      Removes the kernelspec and its evcxr configuration.
  strata-jupyter doctor
      Lists the devices, evcxr, the Jupyter paths, the kernelspec and the cache.
";

struct InstallOptions {
    source: PathBuf,
    path: bool,
    warm: bool,
    python: Option<PathBuf>,
    all_backends: bool,
}

fn parse_install(args: &[String]) -> Result<InstallOptions, String> {
    let mut opts = InstallOptions {
        source: Path::new(env!("CARGO_MANIFEST_DIR")).join(".."),
        path: false,
        warm: true,
        python: None,
        all_backends: false,
    };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = || {
            it.next()
                .map(PathBuf::from)
                .ok_or_else(|| format!("{arg} needs a value"))
        };
        match arg.as_str() {
            "--path" => opts.path = true,
            "--no-warm" => opts.warm = false,
            "--all-backends" => opts.all_backends = true,
            "--source" => opts.source = value()?,
            "--python" => opts.python = Some(value()?),
            other => return Err(format!("unknown option {other:?} for install\n\n{USAGE}")),
        }
    }
    opts.source = std::fs::canonicalize(&opts.source)
        .map_err(|e| format!("strata source {}: {e}", opts.source.display()))?;
    let manifest = std::fs::read_to_string(opts.source.join("Cargo.toml")).unwrap_or_default();
    if !manifest.contains("name = \"strata\"") {
        return Err(format!(
            "{} is not the strata repository (no package `strata` in its Cargo.toml)",
            opts.source.display()
        ));
    }
    Ok(opts)
}

fn install(opts: InstallOptions) -> Result<(), String> {
    let source = match (opts.path, kernelspec::git_state(&opts.source)) {
        (false, Some(dirty)) => {
            if dirty {
                eprintln!(
                    "note: {} has uncommitted changes; the kernel loads its committed HEAD. \
                     Commit them, or install with --path.",
                    opts.source.display()
                );
            }
            Source::Git(opts.source.clone())
        }
        (false, None) => {
            eprintln!(
                "note: {} is not a git repository; loading it as a path (rebuilt by each new \
                 kernel).",
                opts.source.display()
            );
            Source::Path(opts.source.clone())
        }
        (true, _) => Source::Path(opts.source.clone()),
    };
    let evcxr_path = evcxr::find_or_install()?;
    let dir = paths::kernel_dir().ok_or("no Jupyter data dir: set HOME or JUPYTER_DATA_DIR")?;
    let python = evcxr::find_python(opts.python.as_deref(), &opts.source);
    let (backends, left_out) = kernel_backends(opts.all_backends);
    kernelspec::write(&dir, &evcxr_path, python.as_deref(), &source, &backends)
        .map_err(|e| format!("writing the kernelspec to {}: {e}", dir.display()))?;
    println!(
        "Installed the kernel \"Rust (strata)\" at {}",
        dir.display()
    );
    println!(
        "  runs {} with {}",
        evcxr_path.display(),
        source.dep_line(&backends)
    );
    for why in left_out {
        println!("  {why}; `install --all-backends` builds it in anyway");
    }
    match &python {
        Some(py) => println!(
            "  behind {} (libzmq holds IOPub and the heartbeat), run by {}",
            kernelspec::PROXY_FILE,
            py.display()
        ),
        None => println!(
            "  without the socket proxy: no Python with jupyter_client found (pass --python); \
             one stalled client can hang the kernel (issue 18)"
        ),
    }
    if !opts.warm {
        return Ok(());
    }
    let Some(python) = python else {
        println!(
            "Skipped warming the cache: no Python with jupyter_client (pip install \
             jupyter_client, or pass --python). The first notebook will build strata (minutes)."
        );
        return Ok(());
    };
    println!("Warming evcxr's build cache (the first time builds strata: several minutes)...");
    evcxr::run_cells(&python, paths::KERNEL_NAME, &[evcxr::WARM_CELL])?;
    println!("Ready: a new notebook's first cell now answers in seconds.");
    Ok(())
}

/// The backends the kernel builds strata with: those this machine can run (CUDA where a CUDA
/// device opens, wgpu where there is an adapter, lavapipe included), or both with `all`; and
/// a line for each one left out.
fn kernel_backends(all: bool) -> (Vec<&'static str>, Vec<String>) {
    use strata::prelude::{Device, DeviceExt};
    if all {
        return (vec!["cuda", "wgpu"], Vec::new());
    }
    let (mut backends, mut left_out) = (Vec::new(), Vec::new());
    match Device::cuda(0) {
        Ok(_) => backends.push("cuda"),
        Err(e) => left_out.push(format!("left out the CUDA backend: {e}")),
    }
    if strata_wgpu::adapters().is_empty() {
        left_out.push("left out the wgpu backend: no Vulkan, Metal or DX12 adapter".to_string());
    } else {
        backends.push("wgpu");
    }
    (backends, left_out)
}

fn uninstall() -> Result<(), String> {
    let dir = paths::kernel_dir().ok_or("no Jupyter data dir: set HOME or JUPYTER_DATA_DIR")?;
    if !dir.exists() {
        println!("No strata kernel at {}", dir.display());
        return Ok(());
    }
    std::fs::remove_dir_all(&dir).map_err(|e| format!("removing {}: {e}", dir.display()))?;
    println!("Removed {}", dir.display());
    if let Some(cache) = paths::evcxr_cache_dir().filter(|c| c.exists()) {
        println!(
            "evcxr's build cache at {} is shared with other evcxr kernels and was kept.",
            cache.display()
        );
    }
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("install") => parse_install(&args[1..]).and_then(install),
        Some("uninstall") => uninstall(),
        Some("doctor") => doctor::run(),
        Some("help" | "--help" | "-h") => {
            print!("{USAGE}");
            Ok(())
        }
        _ => Err(USAGE.to_string()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("strata-jupyter: {message}");
            ExitCode::FAILURE
        }
    }
}
