//! What every VM of a run shares: the settings detected on this host (QEMU, the
//! accelerator, the RAM shim), and each VM's run folder and disk overlay.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::{io_err, MachineError};
use crate::accel::{self, Accel, AccelSetting, HostFacts};
use crate::qemu::MachineSpec;

/// Settings shared by every VM of a run.
#[derive(Debug, Clone)]
pub struct VmSettings {
    pub qemu_binary: PathBuf,
    pub accel: Accel,
    pub cpu_model: String,
    pub cpus: u32,
    pub memory_mib: u32,
    pub tcg_tb_size_mib: Option<u32>,
    /// Same-page merging of QEMU's memory (off unless asked for; see [`crate::ksm`]).
    pub ksm: crate::Ksm,
    pub boot_timeout: Duration,
    /// Where per-VM run folders are created.
    pub run_root: PathBuf,
    /// The library a fork's QEMU preloads to map its read-only RAM file (see [`crate::jail`]).
    pub ram_shim: PathBuf,
    /// RLIMIT_FSIZE of a QEMU whose disk has no limit of its own (templates, task set-up).
    pub max_file_bytes: u64,
    /// This QEMU carries farm's reset patch (`scripts/build-qemu.sh`): a reset keeps the
    /// translated code of the pages it did not change (see `machine/reset.rs`).
    pub selective_reset: bool,
}

impl VmSettings {
    /// Resolves the QEMU binary and the accelerator on this host.
    pub fn detect(accel: AccelSetting) -> Result<VmSettings, MachineError> {
        let qemu_binary = find_qemu()?;
        let accel = accel::resolve(accel, &HostFacts::probe())?;
        let ram_shim = crate::artifacts::ram_shim(&crate::artifacts::cache_dir())?.path;
        let selective_reset = qemu_version(&qemu_binary)?.contains(crate::qemu::RESET_PATCH_MARK);
        Ok(VmSettings {
            ram_shim,
            selective_reset,
            max_file_bytes: 64 << 30,
            qemu_binary,
            accel,
            cpu_model: MachineSpec::default_cpu_model(accel).to_string(),
            cpus: 1,
            memory_mib: 256,
            tcg_tb_size_mib: Some(64),
            ksm: crate::Ksm::Off,
            // A boot takes seconds; the limit only catches a guest that never comes up,
            // and a loaded host may be many times slower.
            boot_timeout: Duration::from_secs(300),
            run_root: default_run_root(),
        })
    }
}

/// `FARM_RUN_DIR`, or a folder under the system temporary directory.
pub fn default_run_root() -> PathBuf {
    std::env::var_os("FARM_RUN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join("farm-run"))
}

/// The QEMU farm runs: `FARM_QEMU` when set (a path, or a name on `PATH`:
/// `FARM_QEMU=qemu-system-x86_64` picks Debian's); else the QEMU with farm's reset patch when
/// the set-up built it (`scripts/build-qemu.sh`: a reset in place keeps the translated code
/// of the pages it did not change); else `qemu-system-x86_64` on `PATH`.
pub fn find_qemu() -> Result<PathBuf, MachineError> {
    if let Ok(name) = std::env::var("FARM_QEMU") {
        return qemu_named(&name);
    }
    if let Some(patched) = crate::artifacts::reset_qemu(&crate::artifacts::cache_dir()) {
        return Ok(patched);
    }
    system_qemu()
}

/// `qemu-system-x86_64` on `PATH` (Debian's), whatever else is built.
pub fn system_qemu() -> Result<PathBuf, MachineError> {
    qemu_named("qemu-system-x86_64")
}

fn qemu_named(name: &str) -> Result<PathBuf, MachineError> {
    find_program(name).ok_or(MachineError::QemuNotFound {
        binary: name.to_string(),
    })
}

fn find_program(name: &str) -> Option<PathBuf> {
    let candidate = Path::new(name);
    if candidate.components().count() > 1 {
        return candidate.is_file().then(|| candidate.to_path_buf());
    }
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

/// The version string QEMU reports (`qemu-system-x86_64 --version`, first line).
pub fn qemu_version(binary: &Path) -> Result<String, MachineError> {
    let out = Command::new(binary)
        .arg("--version")
        .output()
        .map_err(io_err(format!("running {} --version", binary.display())))?;
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()
        .unwrap_or("")
        .trim()
        .to_string())
}

/// A folder holding one VM's overlay, console log, QEMU log and private RAM file; removed
/// when dropped unless kept.
#[derive(Debug)]
pub struct RunDir {
    path: PathBuf,
    keep: bool,
}

impl RunDir {
    /// Creates a fresh folder under `root`, first sweeping folders of dead farm processes.
    pub fn create(root: &Path) -> Result<RunDir, MachineError> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        std::fs::create_dir_all(root).map_err(io_err(format!("creating {}", root.display())))?;
        static SWEPT: std::sync::Once = std::sync::Once::new();
        SWEPT.call_once(|| sweep_stale_run_dirs(root));
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let path = root.join(format!("{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).map_err(io_err(format!("creating {}", path.display())))?;
        Ok(RunDir { path, keep: false })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn keep(&mut self) {
        self.keep = true;
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        if !self.keep {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// Removes run folders whose owning process is gone (a farm killed with SIGKILL).
fn sweep_stale_run_dirs(root: &Path) {
    let Ok(entries) = std::fs::read_dir(root) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        let Some(pid) = name.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// Creates a qcow2 overlay at `overlay` over `backing` (format `backing_format`), running
/// `qemu-img` on a blocking thread, off the async runtime's workers.
pub async fn create_overlay(backing: &Path, backing_format: &str, overlay: &Path) -> Result<(), MachineError> {
    let (backing, format, overlay) = (backing.to_path_buf(), backing_format.to_string(), overlay.to_path_buf());
    tokio::task::spawn_blocking(move || create_overlay_blocking(&backing, &format, &overlay))
        .await
        .map_err(|e| MachineError::Overlay(format!("the qemu-img task failed: {e}")))?
}

fn create_overlay_blocking(backing: &Path, backing_format: &str, overlay: &Path) -> Result<(), MachineError> {
    let qemu_img = find_program("qemu-img").ok_or(MachineError::QemuImgNotFound)?;
    let out = Command::new(qemu_img)
        .args(["create", "-q", "-f", "qcow2", "-F", backing_format, "-b"])
        .arg(backing)
        .arg(overlay)
        .stdin(Stdio::null())
        .output()
        .map_err(io_err("running qemu-img create"))?;
    if !out.status.success() {
        return Err(MachineError::Overlay(
            String::from_utf8_lossy(&out.stderr).trim().to_string(),
        ));
    }
    Ok(())
}

/// The last `lines` lines of a text file (for console and QEMU logs in errors).
pub fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read(path)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    let tail = all[all.len().saturating_sub(lines)..].join("\n");
    if tail.is_empty() {
        "(empty)".into()
    } else {
        tail
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_qemu_names_the_package() {
        let err = qemu_named("/no/such/qemu-system-x86_64").unwrap_err().to_string();
        assert!(
            err.contains("qemu-system-x86") && err.contains("scripts/setup.sh"),
            "{err}"
        );
        let err = qemu_named("qemu-system-that-does-not-exist").unwrap_err().to_string();
        assert!(err.contains("qemu-system-that-does-not-exist"), "{err}");
    }

    #[test]
    fn tail_returns_the_last_lines() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("log");
        std::fs::write(&p, "1\n2\n3\n4\n").unwrap();
        assert_eq!(tail(&p, 2), "3\n4");
        assert_eq!(tail(&dir.path().join("missing"), 2), "(empty)");
    }

    #[test]
    fn run_dirs_are_removed_on_drop_unless_kept() {
        let root = tempfile::tempdir().unwrap();
        let dir = RunDir::create(root.path()).unwrap();
        let path = dir.path().to_path_buf();
        assert!(path.is_dir());
        drop(dir);
        assert!(!path.exists());
        let mut dir = RunDir::create(root.path()).unwrap();
        dir.keep();
        let path = dir.path().to_path_buf();
        drop(dir);
        assert!(path.exists());
    }
}
