//! Making snapshots: templates (boot, set up, quiesce, snapshot) and snapshots of running
//! forks (per-task snapshots, mid-trajectory branches).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sha2::{Digest, Sha256};
use vmm::machine::{create_overlay, LaunchPlan, RunDir};
use vmm::qemu::RamBacking;
use vmm::{ExecOptions, GuestArtifacts, Machine, MachineError};

use crate::fork::{Fork, Forker};
use crate::statefile;
use crate::store::{io_err, Claim, Snapshot, SnapshotError, SnapshotManifest, SnapshotStore, SNAPSHOT_FORMAT_VERSION};
use crate::template::{hex, TemplateConfig, TemplateConfigError};

#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error(transparent)]
    Config(#[from] TemplateConfigError),
    #[error(transparent)]
    Artifacts(#[from] vmm::artifacts::ArtifactError),
    #[error(transparent)]
    Snapshot(#[from] SnapshotError),
    #[error(transparent)]
    StateFile(#[from] statefile::StateFileError),
    #[error("template machine failed")]
    Machine(#[from] MachineError),
    #[error("forking the Dockerfile's image failed")]
    Fork(#[from] crate::fork::ForkError),
    #[error("template setup")]
    Agent(#[from] vmm::AgentError),
    #[error("template setup command {index} ({command:?}) failed with {status}\n--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}")]
    SetupFailed {
        index: usize,
        command: String,
        status: String,
        stdout: String,
        stderr: String,
    },
    #[error("template file {src}")]
    File {
        src: String,
        #[source]
        source: std::io::Error,
    },
}

/// What a template build did.
pub struct Built {
    pub snapshot: Snapshot,
    /// The snapshot existed already and was reused.
    pub reused: bool,
    /// For an image from a registry: what it resolved to this time.
    pub pulled: Option<images::registry::Pulled>,
    /// Every image resolved from a registry to make it (a Dockerfile's `FROM`s and `COPY
    /// --from` images, or the template's image), with any override.
    pub images: Vec<images::registry::Pulled>,
    /// What commands of the template run with, when a Dockerfile made it (otherwise the
    /// image's own config, `images::config_of`).
    pub image_config: Option<images::ImageConfig>,
}

/// The content address of a template's snapshot: the template (config and files) plus
/// every host input that shapes the guest state.
pub fn template_snapshot_id(template_digest: &str, artifacts: &GuestArtifacts, forker: &Forker) -> String {
    template_key(
        template_digest,
        [&artifacts.kernel.key, &artifacts.image.key, &artifacts.agent.key],
        &forker.host,
    )
}

/// The id of a template snapshot from its inputs: the template's digest, the guest's
/// artifacts (kernel, image, agent), the kernel command line and the host profile a snapshot
/// only resumes on.
fn template_key(template_digest: &str, artifact_keys: [&str; 3], host: &crate::HostProfile) -> String {
    let mut h = Sha256::new();
    let accel = host.accel.to_string();
    let format = SNAPSHOT_FORMAT_VERSION.to_string();
    let cmdline = vmm::qemu::kernel_cmdline_key(host.accel);
    let parts = [
        template_digest,
        artifact_keys[0],
        artifact_keys[1],
        artifact_keys[2],
        &host.qemu_version,
        &accel,
        &host.cpu_model,
        &format,
        &cmdline,
    ];
    for part in parts {
        h.update(part.as_bytes());
        h.update([0]);
    }
    format!("t-{}", &hex(&h.finalize())[..20])
}

#[cfg(test)]
mod key_tests {
    use super::*;

    #[test]
    fn template_ids_follow_every_input_and_nothing_else() {
        let host = crate::HostProfile {
            qemu_version: "7.2.0".into(),
            accel: vmm::Accel::Tcg,
            cpu_model: "max".into(),
        };
        let id = template_key("digest", ["kernel", "image", "agent"], &host);
        assert!(id.starts_with("t-") && id.len() == 22, "{id}");
        assert_eq!(
            id,
            template_key("digest", ["kernel", "image", "agent"], &host),
            "the same inputs give the same id"
        );
        let mut ids = std::collections::BTreeSet::from([id]);
        ids.insert(template_key("digest2", ["kernel", "image", "agent"], &host));
        ids.insert(template_key("digest", ["kernel2", "image", "agent"], &host));
        ids.insert(template_key("digest", ["kernel", "image2", "agent"], &host));
        ids.insert(template_key("digest", ["kernel", "image", "agent2"], &host));
        ids.insert(template_key(
            "digest",
            ["kernel", "image", "agent"],
            &crate::HostProfile {
                qemu_version: "8.2.0".into(),
                ..host.clone()
            },
        ));
        ids.insert(template_key(
            "digest",
            ["kernel", "image", "agent"],
            &crate::HostProfile {
                cpu_model: "host".into(),
                ..host.clone()
            },
        ));
        ids.insert(template_key(
            "digest",
            ["kernel", "image", "agent"],
            &crate::HostProfile {
                accel: vmm::Accel::Kvm,
                ..host.clone()
            },
        ));
        // Parts are separated: moving a byte between two parts changes the id.
        ids.insert(template_key("digestk", ["ernel", "image", "agent"], &host));
        assert_eq!(ids.len(), 9);
    }
}

fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// What a caller adds to every template it builds, after the template's own files and
/// setup (`farm run` adds the function-call harness's zygote). Part of the snapshot id.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct TemplateExtras {
    /// (guest path, contents, mode)
    pub files: Vec<(String, Vec<u8>, u32)>,
    /// Shell commands; each must exit 0.
    pub commands: Vec<String>,
}

impl TemplateExtras {
    pub(crate) fn is_empty(&self) -> bool {
        self.files.is_empty() && self.commands.is_empty()
    }
}

/// The snapshot of a template whose image is an image (not a Dockerfile: see
/// [`crate::templates`]), built or reused, with `extras` added after the template's own
/// files and setup. The template was validated.
pub async fn build_image_template(
    store: &SnapshotStore,
    forker: &Forker,
    template: &TemplateConfig,
    base_dir: &Path,
    label: &str,
    extras: &TemplateExtras,
    progress: &(dyn Fn(&str) + Sync),
) -> Result<Built, BuildError> {
    // An image conversion (or a registry pull) blocks for seconds: not on the runtime.
    let artifacts = {
        let (image, base_dir, size) = (template.image.clone(), base_dir.to_path_buf(), template.image_size_mib);
        tokio::task::spawn_blocking(move || {
            GuestArtifacts::locate_sized(&vmm::artifacts::cache_dir(), &image, &base_dir, size)
        })
        .await
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic.into_panic()))?
    };
    let mut digest = template.digest(base_dir)?;
    if !extras.is_empty() {
        let mut h = Sha256::new();
        h.update(digest.as_bytes());
        h.update(serde_json::to_vec(extras).expect("extras serialize"));
        digest = hex(&h.finalize());
    }
    let id = template_snapshot_id(&digest, &artifacts, forker);
    let _lock = match store.existing_or_lock(&id, progress).await? {
        Claim::Existing(existing) => {
            return Ok(Built {
                snapshot: *existing,
                reused: true,
                images: artifacts.pulled.iter().cloned().collect(),
                pulled: artifacts.pulled,
                image_config: None,
            })
        }
        Claim::Build(lock) => lock,
    };
    if store.path_of(&id).exists() {
        progress(&format!("snapshot {id} is damaged or incomplete; rebuilding it"));
    }
    let staging = store.staging_dir(label)?;
    let result = build_into(
        &staging, &id, store, forker, template, base_dir, label, &artifacts, &digest, extras, progress,
    )
    .await;
    if result.is_err() {
        let _ = crate::store::remove_tree(&staging);
    }
    result.map(|snapshot| Built {
        snapshot,
        reused: false,
        images: artifacts.pulled.iter().cloned().collect(),
        pulled: artifacts.pulled,
        image_config: None,
    })
}

#[allow(clippy::too_many_arguments)]
async fn build_into(
    staging: &Path,
    id: &str,
    store: &SnapshotStore,
    forker: &Forker,
    template: &TemplateConfig,
    base_dir: &Path,
    label: &str,
    artifacts: &GuestArtifacts,
    digest: &str,
    extras: &TemplateExtras,
    progress: &(dyn Fn(&str) + Sync),
) -> Result<Snapshot, BuildError> {
    let settings = vmm::VmSettings {
        memory_mib: template.memory_mib,
        cpus: template.cpus,
        ..forker.vm.clone()
    };
    let disk = staging.join("disk.qcow2");
    create_overlay(&artifacts.image.path, "raw", &disk).await?;
    let run_dir = RunDir::create(&settings.run_root)?;
    let plan = LaunchPlan {
        kernel: Some(artifacts.kernel.path.clone()),
        disk: disk.clone(),
        ram: RamBacking::shared(staging.join("memory")),
        incoming: false,
        max_disk_bytes: None,
    };
    progress(&format!(
        "booting {} ({} MiB, {} vCPU, {})",
        template.image, template.memory_mib, template.cpus, settings.accel
    ));
    let machine = Machine::launch(&settings, plan, run_dir).await?;
    machine.wait_for_agent(settings.boot_timeout).await?;
    let image_config = images::config_of(&artifacts.image).unwrap_or_default();
    provision(&machine, template, base_dir, &image_config, extras, progress).await?;
    progress("quiescing and snapshotting");
    machine.agent().quiesce().await?;
    let raw = staging.join("state.raw");
    machine.save_state(&raw).await?;
    let _ = std::fs::copy(machine.run_dir().join("console.log"), staging.join("console.log"));
    machine.shutdown().await;
    finish(
        staging, &raw, store, id, label, None, template, digest, artifacts, forker,
    )
    .await
}

/// A template's files, setup commands (with its egress, then none) and the caller's extras,
/// on a running machine whose image config is `image_config`.
pub(crate) async fn provision(
    machine: &Machine,
    template: &TemplateConfig,
    base_dir: &Path,
    image_config: &images::ImageConfig,
    extras: &TemplateExtras,
    progress: &(dyn Fn(&str) + Sync),
) -> Result<(), BuildError> {
    let agent = machine.agent();
    if !image_config.working_dir.is_empty() {
        // A Dockerfile's last WORKDIR may not have been made by any step.
        agent
            .exec(ExecOptions::argv(&["mkdir", "-p", &image_config.working_dir]))
            .await?;
    }
    for file in &template.files {
        let src = base_dir.join(&file.src);
        let read = tokio::fs::read(&src).await;
        let contents = read.map_err(|source| BuildError::File {
            src: src.display().to_string(),
            source,
        })?;
        progress(&format!("copying {} -> {}", file.src.display(), file.dest));
        agent.write_file(&file.dest, contents, file.mode).await?;
    }
    let attempts = open_setup_network(machine, template);
    let report_attempts = || {
        for line in attempts.lock().unwrap_or_else(|e| e.into_inner()).drain(..) {
            progress(&line);
        }
    };
    for (index, command) in template.setup.iter().enumerate() {
        progress(&format!("setup [{}/{}] {command}", index + 1, template.setup.len()));
        let out = agent.exec(setup_options(template, image_config, command)).await;
        report_attempts();
        let out = out?;
        if out.result.exit_code != Some(0) {
            let status = if out.result.timed_out {
                format!("a timeout after {} s", template.setup_timeout_secs)
            } else {
                format!("exit code {}", out.shell_exit_code())
            };
            return Err(setup_failed(index + 1, command, status, &out));
        }
    }
    // Setup is over: the snapshot, and every fork of it, starts with no network.
    machine.set_network(egress::Policy::default());
    for (dest, contents, mode) in &extras.files {
        agent.write_file(dest, contents.clone(), *mode).await?;
    }
    for (index, command) in extras.commands.iter().enumerate() {
        let options = ExecOptions {
            timeout: Some(Duration::from_secs(template.setup_timeout_secs)),
            ..ExecOptions::shell(command.clone())
        };
        let out = agent.exec(options).await;
        report_attempts();
        let out = out?;
        if out.result.exit_code != Some(0) {
            let status = format!("exit code {}", out.shell_exit_code());
            return Err(setup_failed(template.setup.len() + index + 1, command, status, &out));
        }
    }
    Ok(())
}

/// Egress for the setup commands only, through farm's proxy: each attempt is kept in the
/// returned list, to be reported.
fn open_setup_network(machine: &Machine, template: &TemplateConfig) -> Arc<Mutex<Vec<String>>> {
    let attempts: Arc<Mutex<Vec<String>>> = Default::default();
    if !template.network.is_empty() {
        let sink = attempts.clone();
        machine.set_network(egress::Policy {
            allow: template.network.allow.clone(),
            log: Some(Arc::new(move |attempt: &egress::Attempt| {
                sink.lock().unwrap_or_else(|e| e.into_inner()).push(attempt.to_string())
            })),
            rules: Default::default(),
        });
    }
    attempts
}

/// A setup command as it runs: the image's Env and WorkingDir, the proxy's variables when
/// the template has egress, and the template's own env over them.
fn setup_options(template: &TemplateConfig, image_config: &images::ImageConfig, command: &str) -> ExecOptions {
    let mut env: BTreeMap<String, String> = image_config
        .env
        .iter()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    env.extend(template.network.proxy_env());
    env.extend(template.env.iter().map(|(k, v)| (k.clone(), v.clone())));
    ExecOptions {
        env: env.into_iter().collect(),
        cwd: (!image_config.working_dir.is_empty()).then(|| image_config.working_dir.clone()),
        timeout: Some(Duration::from_secs(template.setup_timeout_secs)),
        ..ExecOptions::shell(command.to_string())
    }
}

fn setup_failed(index: usize, command: &str, status: String, out: &vmm::ExecOutput) -> BuildError {
    BuildError::SetupFailed {
        index,
        command: command.to_string(),
        status,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Wraps the state, makes the empty fork overlay, writes the manifest and commits, on a
/// blocking thread (`qemu-img`, fsync), off the async runtime's workers.
#[allow(clippy::too_many_arguments)]
async fn finish(
    staging: &Path,
    raw_state: &Path,
    store: &SnapshotStore,
    id: &str,
    label: &str,
    parent: Option<String>,
    template: &TemplateConfig,
    template_digest: &str,
    artifacts: &GuestArtifacts,
    forker: &Forker,
) -> Result<Snapshot, BuildError> {
    let manifest = SnapshotManifest {
        format_version: SNAPSHOT_FORMAT_VERSION,
        id: id.to_string(),
        created_unix: now_unix(),
        label: label.to_string(),
        template: template.clone(),
        template_digest: template_digest.to_string(),
        parent,
        kernel: artifacts.kernel.clone(),
        image: artifacts.image.clone(),
        agent_key: artifacts.agent.key.clone(),
        qemu_version: forker.host.qemu_version.clone(),
        accel: forker.host.accel,
        cpu_model: forker.host.cpu_model.clone(),
        memory_mib: template.memory_mib,
        cpus: template.cpus,
        files: Default::default(),
    };
    let (staging, raw_state, store) = (staging.to_path_buf(), raw_state.to_path_buf(), store.clone());
    let commit = move || -> Result<Snapshot, BuildError> {
        statefile::write(&raw_state, &staging.join("state.bin"))?;
        std::fs::remove_file(&raw_state).map_err(io_err("removing the raw state"))?;
        // Forks' overlays point at the snapshot's final location.
        let final_disk: PathBuf = store.path_of(&manifest.id).join("disk.qcow2");
        create_overlay_unchecked(&final_disk, &staging.join("disk.qcow2"), &staging.join("overlay.qcow2"))?;
        Ok(store.commit(&staging, manifest)?)
    };
    tokio::task::spawn_blocking(commit)
        .await
        .map_err(|e| BuildError::Machine(MachineError::Overlay(format!("the snapshot's commit task failed: {e}"))))?
}

/// Creates an overlay whose backing path (`backing_final`) does not exist yet; the size is
/// read from `backing_now`, the same file at its current location.
fn create_overlay_unchecked(backing_final: &Path, backing_now: &Path, overlay: &Path) -> Result<(), BuildError> {
    let info = std::process::Command::new("qemu-img")
        .args(["info", "--output=json", "-U"])
        .arg(backing_now)
        .output()
        .map_err(|e| MachineError::Io {
            what: "running qemu-img info".into(),
            source: e,
        })?;
    let info: serde_json::Value = serde_json::from_slice(&info.stdout)
        .map_err(|e| MachineError::Overlay(format!("qemu-img info output: {e}")))?;
    let size = info
        .get("virtual-size")
        .and_then(|v| v.as_u64())
        .ok_or_else(|| MachineError::Overlay("no virtual-size".into()))?;
    let out = std::process::Command::new("qemu-img")
        .args(["create", "-q", "-f", "qcow2", "-F", "qcow2", "-u", "-b"])
        .arg(backing_final)
        .arg(overlay)
        .arg(size.to_string())
        .output()
        .map_err(|e| MachineError::Io {
            what: "running qemu-img create".into(),
            source: e,
        })?;
    if !out.status.success() {
        return Err(MachineError::Overlay(String::from_utf8_lossy(&out.stderr).trim().to_string()).into());
    }
    Ok(())
}

/// Snapshots a running fork as a child of its snapshot. The fork is paused while its state
/// is taken and resumed afterwards (pass `resume = false` to leave it paused).
///
/// A fork's RAM is private (MAP_PRIVATE), so it cannot simply be left out of the stream as
/// a template's shared RAM is. Instead the full state streams over a local socket into a
/// helper QEMU whose RAM is a new shared file; the helper then writes a state-only stream.
/// The new RAM file and that stream form the child snapshot. `id` names it (content
/// address chosen by the caller), or a unique id is made.
pub async fn snapshot_fork(
    store: &SnapshotStore,
    forker: &Forker,
    parent: &Snapshot,
    fork: &Fork,
    label: &str,
    id: Option<String>,
    resume: bool,
) -> Result<Snapshot, BuildError> {
    let id = id.unwrap_or_else(|| {
        let mut h = Sha256::new();
        h.update(parent.id().as_bytes());
        h.update(fork.identity.fork_id.as_bytes());
        h.update(
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0)
                .to_le_bytes(),
        );
        format!("c-{}", &hex(&h.finalize())[..20])
    });
    let _lock = match store.existing_or_lock(&id, &|line| tracing::info!("{line}")).await? {
        Claim::Existing(existing) => return Ok(*existing),
        Claim::Build(lock) => lock,
    };
    let staging = store.staging_dir(label)?;
    let result = snapshot_fork_into(&staging, store, forker, parent, fork, label, &id).await;
    if result.is_err() {
        let _ = crate::store::remove_tree(&staging);
    }
    if resume {
        fork.machine.resume().await?;
    }
    result
}

async fn snapshot_fork_into(
    staging: &Path,
    store: &SnapshotStore,
    forker: &Forker,
    parent: &Snapshot,
    fork: &Fork,
    label: &str,
    id: &str,
) -> Result<Snapshot, BuildError> {
    fork.agent().quiesce().await?;
    let settings = vmm::VmSettings {
        memory_mib: parent.manifest.memory_mib,
        cpus: parent.manifest.cpus,
        ..forker.vm.clone()
    };
    // The helper gets a throwaway overlay of its own; it never runs the guest, and disk
    // contents are not part of a migration, so it sits on the parent snapshot's disk (the
    // same size; the fork's own overlay belongs to the fork's QEMU user alone).
    let helper_dir = RunDir::create(&settings.run_root)?;
    let helper_disk = helper_dir.path().join("disk.qcow2");
    create_overlay(&parent.disk_path(), "qcow2", &helper_disk).await?;
    let plan = LaunchPlan {
        kernel: None,
        disk: helper_disk,
        ram: RamBacking::shared(staging.join("memory")),
        incoming: true,
        max_disk_bytes: None,
    };
    let helper = Machine::launch(&settings, plan, helper_dir).await?;
    // A socket pair joins the two QEMUs (neither may open a path or spawn a helper). The
    // helper's RAM is shared, so x-ignore-shared is off on both sides: everything streams.
    let (to_helper, from_fork) = std::os::unix::net::UnixStream::pair().map_err(|e| MachineError::Io {
        what: "creating the migration socket pair".into(),
        source: e,
    })?;
    let incoming = helper.migrate_in(to_helper.into(), false);
    let outgoing = fork.machine.migrate_out(from_fork.into(), false);
    let (incoming, outgoing) = tokio::join!(incoming, outgoing);
    outgoing?;
    incoming?;
    wait_incoming_done(&helper).await?;
    // The fork's disk at this moment becomes the child's disk (its backing is the parent's).
    let disk = staging.join("disk.qcow2");
    copy_off_runtime(&fork.machine.spec().disk, &disk).await?;
    let raw = staging.join("state.raw");
    helper.save_state(&raw).await?;
    helper.shutdown().await;
    let _ = std::fs::copy(fork.machine.run_dir().join("console.log"), staging.join("console.log"));
    finish_child(staging, &raw, store, id, label, parent, forker).await
}

/// Copies a fork's disk overlay (it may be large) on a blocking thread.
pub(crate) async fn copy_off_runtime(from: &Path, to: &Path) -> Result<(), BuildError> {
    let (from, to) = (from.to_path_buf(), to.to_path_buf());
    tokio::task::spawn_blocking(move || std::fs::copy(&from, &to))
        .await
        .unwrap_or_else(|e| Err(std::io::Error::other(e)))
        .map_err(io_err("copying the fork's disk overlay"))?;
    Ok(())
}

/// [`finish`] for a child of `parent`: the state saved at `raw_state`, the rest in `staging`.
pub(crate) async fn finish_child(
    staging: &Path,
    raw_state: &Path,
    store: &SnapshotStore,
    id: &str,
    label: &str,
    parent: &Snapshot,
    forker: &Forker,
) -> Result<Snapshot, BuildError> {
    let artifacts = GuestArtifacts {
        image_name: parent.manifest.template.image.clone(),
        kernel: parent.manifest.kernel.clone(),
        image: parent.manifest.image.clone(),
        agent: vmm::artifacts::Artifact {
            path: PathBuf::new(),
            key: parent.manifest.agent_key.clone(),
        },
        pulled: None,
    };
    finish(
        staging,
        raw_state,
        store,
        id,
        label,
        Some(parent.id().to_string()),
        &parent.manifest.template,
        &parent.manifest.template_digest,
        &artifacts,
        forker,
    )
    .await
}

async fn wait_incoming_done(helper: &Machine) -> Result<(), BuildError> {
    let started = std::time::Instant::now();
    loop {
        let status = helper.qmp("query-status", None).await?;
        match status.get("status").and_then(|s| s.as_str()).unwrap_or("") {
            "inmigrate" if started.elapsed() < Duration::from_secs(300) => {
                tokio::time::sleep(Duration::from_millis(2)).await
            }
            "paused" | "postmigrate" => return Ok(()),
            other => {
                return Err(MachineError::Migration {
                    what: "into the snapshot helper".into(),
                    detail: format!("helper state {other:?}"),
                }
                .into())
            }
        }
    }
}
