//! Where things live: Jupyter's data directory, the kernelspec, evcxr's cache, and programs on
//! `PATH`.

use std::env;
use std::path::{Path, PathBuf};

/// The kernelspec's name. Never `rust`: `evcxr_jupyter --install` overwrites that one.
pub const KERNEL_NAME: &str = "strata";

fn home() -> Option<PathBuf> {
    env::var_os("HOME")
        .or_else(|| env::var_os("USERPROFILE"))
        .map(PathBuf::from)
}

/// A per-user directory `name` in the platform's place: under `$<xdg>` (or `~/<home_rel>`) on
/// Linux, `~/<mac_rel>` on macOS, `%<win_var>%` on Windows.
fn user_dir(
    xdg: &str,
    home_rel: &str,
    mac_rel: &str,
    win_var: &str,
    name: &str,
) -> Option<PathBuf> {
    if cfg!(target_os = "macos") {
        return home().map(|h| h.join(mac_rel));
    }
    if cfg!(windows) {
        return env::var_os(win_var).map(|d| PathBuf::from(d).join(name));
    }
    match env::var_os(xdg) {
        Some(d) if !d.is_empty() => Some(PathBuf::from(d).join(name)),
        _ => home().map(|h| h.join(home_rel).join(name)),
    }
}

/// Jupyter's per-user data directory, as `jupyter --paths` reports it: `JUPYTER_DATA_DIR`,
/// else the platform's default.
pub fn jupyter_data_dir() -> Option<PathBuf> {
    match env::var_os("JUPYTER_DATA_DIR") {
        Some(dir) => Some(PathBuf::from(dir)),
        None => user_dir(
            "XDG_DATA_HOME",
            ".local/share",
            "Library/Jupyter",
            "APPDATA",
            "jupyter",
        ),
    }
}

/// The strata kernelspec directory; the evcxr configuration lives inside it, so `uninstall`
/// removes one directory.
pub fn kernel_dir() -> Option<PathBuf> {
    jupyter_data_dir().map(|d| d.join("kernels").join(KERNEL_NAME))
}

/// The `EVCXR_CONFIG_DIR` the kernel runs with.
pub fn evcxr_config_dir(kernel_dir: &Path) -> PathBuf {
    kernel_dir.join("evcxr")
}

/// evcxr's build cache (`:cache`): `$XDG_CACHE_HOME/evcxr` or the platform's cache dir.
pub fn evcxr_cache_dir() -> Option<PathBuf> {
    user_dir(
        "XDG_CACHE_HOME",
        ".cache",
        "Library/Caches/evcxr",
        "LOCALAPPDATA",
        "evcxr",
    )
}

/// `program` on `PATH`, or in cargo's bin directory (where `cargo install` puts it even when
/// that directory is not on `PATH`).
pub fn find_program(program: &str) -> Option<PathBuf> {
    let exe = format!("{program}{}", env::consts::EXE_SUFFIX);
    let cargo_bin = env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| home().map(|h| h.join(".cargo")))
        .map(|d| d.join("bin"));
    env::var_os("PATH")
        .map(|p| env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .chain(cargo_bin)
        .map(|dir| dir.join(&exe))
        .find(|p| p.is_file())
}

/// The total size in bytes of the files under `dir`, and how many there are.
pub fn du(dir: &Path) -> (u64, usize) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return (0, 0);
    };
    entries
        .flatten()
        .fold((0, 0), |(bytes, files), e| match e.file_type() {
            Ok(t) if t.is_dir() => {
                let (b, f) = du(&e.path());
                (bytes + b, files + f)
            }
            Ok(_) => (bytes + e.metadata().map_or(0, |m| m.len()), files + 1),
            Err(_) => (bytes, files),
        })
}
