//! The kernelspec and the evcxr configuration it points at.
//!
//! The kernel is stock `evcxr_jupyter`; `EVCXR_CONFIG_DIR` makes it run our `init.evcxr`
//! (the build cache and the strata dependency) and `prelude.rs` ([`PRELUDE`]).

use crate::paths;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;

/// evcxr's build cache limit, in MiB (`:cache`). strata's dependencies take about 600 MiB.
const CACHE_MIB: u32 = 4096;

/// The package the kernel's cells link: strata built once as a shared library (`dylib`), in
/// [`DYLIB_DIR`] of the repository. evcxr builds each cell as a library of its own and never
/// unloads one; linked against strata's `rlib`, each cell carried its own copy of the strata
/// code it reached (0.6–1 MB a cell, so a long session grew without end) and of strata's
/// statics. Linked against the shared library, a cell holds only its own code.
pub const DYLIB_PACKAGE: &str = "strata-dylib";

/// Where [`DYLIB_PACKAGE`] lives in the repository.
pub const DYLIB_DIR: &str = "jupyter/dylib";

/// How the kernel's `:dep` reaches the strata sources.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// `git = "file://…"`: the repository's committed `HEAD`. Cargo builds git dependencies
    /// without incremental compilation, so evcxr's cache keeps them and a new kernel starts in
    /// seconds; uncommitted edits are not seen.
    Git(PathBuf),
    /// `path = "…"`: the working tree as it is. evcxr does not cache path dependencies
    /// (they build incrementally), so every new kernel compiles strata again (about a minute).
    Path(PathBuf),
}

impl Source {
    /// `git:DIR` or `path:DIR`: where the kernel proxy takes the Cargo.lock the kernel's
    /// build starts from (the committed HEAD's, or the working tree's), so notebooks run the
    /// dependency versions the tests ran.
    pub fn lockfile_source(&self) -> String {
        match self {
            Source::Git(dir) => format!("git:{}", dir.display()),
            Source::Path(dir) => format!("path:{}", dir.display()),
        }
    }

    /// The `:dep` line for `init.evcxr`, building strata with the `backends` features
    /// (`cuda`, `wgpu`) beside the CPU's. Each backend left out makes a kernel lighter:
    /// evcxr's rust-analyzer loads its dependency tree (wgpu's is the larger: measured here,
    /// a kernel without it answers in 6 s instead of 10 s and holds 0.8 GB instead of 1.25 GB).
    pub fn dep_line(&self, backends: &[&str]) -> String {
        let mut names = vec!["\"evcxr\"".to_string()];
        names.extend(backends.iter().map(|b| format!("\"{b}\"")));
        let features = format!(
            "default-features = false, features = [{}]",
            names.join(", ")
        );
        match self {
            Source::Git(dir) => format!(
                ":dep strata = {{ package = \"{DYLIB_PACKAGE}\", git = {}, {features} }}",
                toml_string(&format!("file://{}", dir.display()))
            ),
            Source::Path(dir) => format!(
                ":dep strata = {{ package = \"{DYLIB_PACKAGE}\", path = {}, {features} }}",
                toml_string(&dir.join(DYLIB_DIR).display().to_string())
            ),
        }
    }
}

/// Whether `dir` is the top of a git work tree, and whether it has uncommitted changes to
/// tracked files (which a git source does not see).
pub fn git_state(dir: &Path) -> Option<bool> {
    let top = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(["rev-parse", "--show-toplevel"])
        .output()
        .ok()
        .filter(|o| o.status.success())?;
    let top = PathBuf::from(String::from_utf8_lossy(&top.stdout).trim());
    if fs::canonicalize(&top).ok()? != fs::canonicalize(dir).ok()? {
        return None;
    }
    let status = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(["status", "--porcelain", "--untracked-files=no"])
        .output()
        .ok()?;
    Some(!status.stdout.is_empty())
}

fn toml_string(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

fn json_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The kernel's front door ([`PROXY`], run by a Python that has pyzmq), if one was found.
pub const PROXY_FILE: &str = "kernel_proxy.py";

/// The proxy that holds Jupyter's sockets with libzmq in front of evcxr_jupyter, whose
/// pure-Rust ZeroMQ hangs the whole kernel when one IOPub subscriber stops reading and stops
/// its heartbeat when one client goes away (issue 18; the file's docstring says how).
pub const PROXY: &str = include_str!("kernel_proxy.py");

/// The ROUTER socket the proxy holds the shell and stdin ports with (beside [`PROXY_FILE`]).
pub const ROUTER_FILE: &str = "zmtp_router.py";

/// [`ROUTER_FILE`]'s text: ZMTP 3.0 with evcxr's rule for a reused client identity.
pub const ROUTER: &str = include_str!("zmtp_router.py");

/// `kernel.json` for `evcxr` with its configuration in `config_dir`. With `proxy` (a Python
/// that has pyzmq, and the proxy script), the kernel starts behind the proxy; without, evcxr
/// binds Jupyter's ports itself.
/// `XDG_RUNTIME_DIR` points at `runtime_dir`: the Vulkan loader probes Wayland, whose library
/// prints `error: XDG_RUNTIME_DIR is invalid or not set` into cells when the kernel's
/// environment lacks it (a server started outside a desktop session).
/// `STRATA_KERNEL_SOURCE` tells the proxy where the lockfile is ([`Source::lockfile_source`]).
pub fn kernel_json(
    evcxr: &Path,
    proxy: Option<(&Path, &Path)>,
    config_dir: &Path,
    runtime_dir: &Path,
    source: &Source,
) -> String {
    // evcxr_jupyter prints its start-up notice and cargo's `Compiling …` lines to its own
    // output, which `jupyter console` shares with the user's terminal: they go to
    // `kernel.log` beside the kernelspec instead (cells' output travels over Jupyter's
    // sockets and is not affected).
    let log = config_dir.parent().unwrap_or(config_dir).join("kernel.log");
    let path = |p: &Path| json_string(&p.display().to_string());
    let argv = match proxy {
        Some((python, script)) => format!(
            "{}, {}, \"{{connection_file}}\", {}, {}",
            path(python),
            path(script),
            path(&log),
            path(evcxr)
        ),
        None => format!(
            "\"/bin/sh\", \"-c\", {}, {}, \"{{connection_file}}\", {}",
            // Without incremental compilation evcxr's cache serves stale cells (see the proxy).
            json_string(r#"unset CARGO_INCREMENTAL; exec "$0" --control_file "$1" >>"$2" 2>&1"#),
            path(evcxr),
            path(&log)
        ),
    };
    format!(
        "{{\n  \"argv\": [{argv}],\n  \
         \"display_name\": \"Rust (strata)\",\n  \"language\": \"rust\",\n  \
         \"interrupt_mode\": \"message\",\n  \
         \"env\": {{\"EVCXR_CONFIG_DIR\": {}, \"XDG_RUNTIME_DIR\": {}, \
         \"STRATA_KERNEL_SOURCE\": {}}}\n}}\n",
        path(config_dir),
        path(runtime_dir),
        json_string(&source.lockfile_source())
    )
}

/// A private directory for `XDG_RUNTIME_DIR` (the XDG spec asks for mode 0700).
fn make_runtime_dir(dir: &Path) -> io::Result<()> {
    fs::create_dir_all(dir)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(dir, fs::Permissions::from_mode(0o700))?;
    }
    Ok(())
}

/// `init.evcxr`: the build cache first, so that the dependency's build is cached.
pub fn init_evcxr(source: &Source, backends: &[&str]) -> String {
    // No comments: evcxr would compile a comment line as a cell.
    format!(":cache {CACHE_MIB}\n{}\n", source.dep_line(backends))
}

/// Writes the kernelspec and the evcxr configuration into `kernel_dir`; with `python` (one
/// that has pyzmq) the kernel starts behind [`PROXY`].
pub fn write(
    kernel_dir: &Path,
    evcxr: &Path,
    python: Option<&Path>,
    source: &Source,
    backends: &[&str],
) -> io::Result<()> {
    let config = paths::evcxr_config_dir(kernel_dir);
    fs::create_dir_all(&config)?;
    let runtime = kernel_dir.join("runtime");
    make_runtime_dir(&runtime)?;
    let script = kernel_dir.join(PROXY_FILE);
    for (file, text) in [(PROXY_FILE, PROXY), (ROUTER_FILE, ROUTER)] {
        let path = kernel_dir.join(file);
        match python {
            Some(_) => fs::write(&path, text)?,
            None => match fs::remove_file(&path) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                _ => {}
            },
        }
    }
    fs::write(
        kernel_dir.join("kernel.json"),
        kernel_json(
            evcxr,
            python.map(|py| (py, script.as_path())),
            &config,
            &runtime,
            source,
        ),
    )?;
    fs::write(config.join("init.evcxr"), init_evcxr(source, backends))?;
    fs::write(config.join("prelude.rs"), PRELUDE)
}

/// What every session starts with. The second line uses `?` once: until a session has, evcxr
/// cannot compile `(expr?).evcxr_display()` for a cell ending in `expr?` and falls back to
/// `Debug`, so the first tensor of a notebook showed a one-line summary instead of its table.
/// The third makes a panic one line (message and place) instead of a backtrace through
/// evcxr's runtime, which evcxr turns on whatever `RUST_BACKTRACE` says.
pub const PRELUDE: &str = "use strata::prelude::*;\nlet _: () = Ok::<(), strata::Error>(())?;\nstrata::install_notebook_panic_hook();\n";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_json_escapes_paths_and_names_the_config_dir() {
        let json = kernel_json(
            Path::new("/opt/my \"bin\"/evcxr_jupyter"),
            None,
            Path::new("/k/evcxr"),
            Path::new("/k/runtime"),
            &Source::Git("/src/strata".into()),
        );
        assert!(json.contains(
            r#""argv": ["/bin/sh", "-c", "unset CARGO_INCREMENTAL; exec \"$0\" --control_file \"$1\" >>\"$2\" 2>&1", "/opt/my \"bin\"/evcxr_jupyter", "{connection_file}", "/k/kernel.log"]"#
        ));
        assert!(json.contains(r#""display_name": "Rust (strata)""#));
        assert!(json.contains(
            r#""env": {"EVCXR_CONFIG_DIR": "/k/evcxr", "XDG_RUNTIME_DIR": "/k/runtime", "STRATA_KERNEL_SOURCE": "git:/src/strata"}"#
        ));
    }

    #[test]
    fn behind_the_proxy_python_runs_the_script_with_the_connection_file_log_and_evcxr() {
        let json = kernel_json(
            Path::new("/bin/evcxr_jupyter"),
            Some((Path::new("/v/bin/python"), Path::new("/k/kernel_proxy.py"))),
            Path::new("/k/evcxr"),
            Path::new("/k/runtime"),
            &Source::Git("/src/strata".into()),
        );
        assert!(json.contains(
            r#""argv": ["/v/bin/python", "/k/kernel_proxy.py", "{connection_file}", "/k/kernel.log", "/bin/evcxr_jupyter"]"#
        ), "{json}");
        assert!(PROXY.contains("zmq.PUB"));
    }

    #[test]
    fn init_sets_the_cache_before_the_dependency() {
        let git = init_evcxr(&Source::Git("/src/strata".into()), &["cuda", "wgpu"]);
        let lines: Vec<&str> = git.lines().collect();
        assert_eq!(lines[0], ":cache 4096");
        assert_eq!(
            lines[1],
            r#":dep strata = { package = "strata-dylib", git = "file:///src/strata", default-features = false, features = ["evcxr", "cuda", "wgpu"] }"#
        );
        let path = Source::Path("/src/strata".into()).dep_line(&[]);
        assert_eq!(
            path,
            r#":dep strata = { package = "strata-dylib", path = "/src/strata/jupyter/dylib", default-features = false, features = ["evcxr"] }"#
        );
    }
}
