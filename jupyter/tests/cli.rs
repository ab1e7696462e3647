//! `strata-jupyter install`, `doctor` and `uninstall` against a scratch Jupyter data directory,
//! with a stand-in `evcxr_jupyter` first on `PATH` (the real one takes 15 minutes to build).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("strata-jupyter-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("bin")).unwrap();
    dir
}

fn run(dir: &Path, args: &[&str]) -> Output {
    let path = std::env::join_paths(
        std::iter::once(dir.join("bin")).chain(std::env::split_paths(
            &std::env::var_os("PATH").unwrap_or_default(),
        )),
    )
    .unwrap();
    Command::new(env!("CARGO_BIN_EXE_strata-jupyter"))
        .args(args)
        .env("JUPYTER_DATA_DIR", dir.join("jupyter"))
        .env("XDG_CACHE_HOME", dir.join("cache"))
        .env("PATH", path)
        .output()
        .unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn install_doctor_uninstall_round_trip() {
    let dir = scratch("roundtrip");
    let fake = dir.join("bin/evcxr_jupyter");
    std::fs::write(&fake, "#!/bin/sh\nexit 0\n").unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let kernel = dir.join("jupyter/kernels/strata");

    let before = run(&dir, &["doctor"]);
    assert!(!before.status.success());
    assert!(
        text(&before).contains("MISSING kernelspec"),
        "{}",
        text(&before)
    );

    let repo = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let out = run(&dir, &["install", "--no-warm", "--path", "--source", repo]);
    assert!(out.status.success(), "{}", text(&out));
    let json = std::fs::read_to_string(kernel.join("kernel.json")).unwrap();
    // Behind the socket proxy where a Python with jupyter_client is found (the repository's
    // .venv, the active environment, python3), else evcxr alone through /bin/sh.
    let proxy = kernel.join("kernel_proxy.py");
    if proxy.is_file() {
        assert!(
            json.contains(&format!(
                "\"{}\", \"{{connection_file}}\", \"{}\", \"{}\"]",
                proxy.display(),
                kernel.join("kernel.log").display(),
                fake.display()
            )),
            "{json}"
        );
        assert!(
            text(&out).contains("behind kernel_proxy.py"),
            "{}",
            text(&out)
        );
    } else {
        assert!(
            json.contains(&format!(
                "2>&1\", \"{}\", \"{{connection_file}}\"",
                fake.display()
            )),
            "{json}"
        );
        assert!(
            text(&out).contains("without the socket proxy"),
            "{}",
            text(&out)
        );
    }
    assert!(json.contains("\"display_name\": \"Rust (strata)\""));
    let init = std::fs::read_to_string(kernel.join("evcxr/init.evcxr")).unwrap();
    assert!(init.starts_with(":cache "), "{init}");
    assert!(
        init.contains(":dep strata = { package = \"strata-dylib\", path = "),
        "{init}"
    );
    let prelude = std::fs::read_to_string(kernel.join("evcxr/prelude.rs")).unwrap();
    assert!(
        prelude.starts_with("use strata::prelude::*;\n"),
        "{prelude}"
    );
    // One use of `?`, so the first `expr?` cell of a session displays as a table.
    assert!(prelude.contains(")?;"), "{prelude}");

    let after = run(&dir, &["doctor"]);
    let report = text(&after);
    assert!(report.contains("ok      kernelspec"), "{report}");
    assert!(report.contains("device cpu"), "{report}");
    assert!(
        report.contains(":dep strata = { package = \"strata-dylib\", path = "),
        "{report}"
    );

    assert!(run(&dir, &["uninstall"]).status.success());
    assert!(!kernel.exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_arguments_are_errors_with_the_usage() {
    let dir = scratch("args");
    let out = run(&dir, &["install", "--frobnicate"]);
    assert!(!out.status.success());
    assert!(text(&out).contains("unknown option \"--frobnicate\""));
    let out = run(&dir, &["install", "--source", "/"]);
    assert!(
        text(&out).contains("is not the strata repository"),
        "{}",
        text(&out)
    );
    assert!(!run(&dir, &[]).status.success());
    let _ = std::fs::remove_dir_all(&dir);
}
