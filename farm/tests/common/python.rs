//! The Python side of the framework tests: the venvs `scripts/setup.sh` makes, and the SDK
//! as pip installs it.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The Python of the venv `name` in the artifact cache (`$FARM_CACHE_DIR`, or
/// `~/.cache/farm`), or a failure saying how to make it.
pub fn venv(name: &str) -> PathBuf {
    let cache = std::env::var_os("FARM_CACHE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap()).join(".cache/farm"));
    let python = cache.join(name).join("bin/python");
    assert!(python.exists(), "no {}: run scripts/setup.sh", python.display());
    python
}

/// The SDK (`clients/python`) installed by pip into `dir/site`, with its dist-info and so its
/// entry points (inspect_ai's and NeMo Gym's find its providers by them), from a copy: the
/// checkout stays clean. Put the returned folder on `PYTHONPATH`.
pub fn installed_sdk(dir: &Path) -> PathBuf {
    let (copy, site) = (dir.join("sdk"), dir.join("site"));
    let copied = Command::new("cp")
        .arg("-r")
        .arg(super::repo().join("clients/python"))
        .arg(&copy)
        .status()
        .unwrap();
    assert!(copied.success(), "copying the SDK");
    let installed = Command::new("python3")
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-index",
            "--no-build-isolation",
        ])
        .arg("--target")
        .arg(&site)
        .arg(&copy)
        .output()
        .unwrap();
    assert!(
        installed.status.success(),
        "pip install of the SDK: {}",
        String::from_utf8_lossy(&installed.stderr)
    );
    site
}
