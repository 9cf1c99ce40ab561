//! `farm snapshot ls|rm|gc`.

use std::collections::BTreeSet;

use anyhow::Result;
use clap::{Args, Subcommand};
use snapshotter::{Forker, SnapshotStore};
use vmm::{AccelSetting, GuestArtifacts, VmSettings};

#[derive(Subcommand)]
pub enum SnapshotCommand {
    /// List snapshots: id, parent, label, age, sizes, and whether this host can fork them.
    Ls(LsArgs),
    /// Check snapshots in full: every file against the SHA-256 in its manifest (forks only
    /// check sizes and the state file's checksum).
    Verify {
        /// Snapshot ids.
        #[arg(required = true)]
        ids: Vec<String>,
    },
    /// Remove a snapshot (refused while other snapshots descend from it).
    Rm {
        /// Snapshot ids.
        #[arg(required = true)]
        ids: Vec<String>,
    },
    /// Remove snapshots nothing refers to: leftovers of interrupted builds, damaged
    /// snapshots, templates made for other artifacts or host setups, and child snapshots
    /// (per-task snapshots, branches), which are caches rebuilt on demand.
    Gc {
        /// Only print what would be removed.
        #[arg(long)]
        dry_run: bool,
    },
}

#[derive(Args)]
pub struct LsArgs {
    /// Print JSON (one array of manifests).
    #[arg(long)]
    json: bool,
}

pub async fn run(command: SnapshotCommand) -> Result<i32> {
    let store = SnapshotStore::default_location();
    match command {
        SnapshotCommand::Ls(args) => ls(&store, args),
        SnapshotCommand::Rm { ids } => {
            let mut code = 0;
            for id in ids {
                match store.remove(&id) {
                    Ok(()) => crate::ui::outln!("removed {id}"),
                    Err(e) => {
                        eprintln!("farm: {e}");
                        code = 1;
                    }
                }
            }
            Ok(code)
        }
        SnapshotCommand::Gc { dry_run } => gc(&store, dry_run),
        SnapshotCommand::Verify { ids } => {
            let mut code = 0;
            for id in ids {
                match store
                    .get(&id)
                    .and_then(|s| s.check_files().and_then(|()| s.verify_checksums()))
                {
                    Ok(()) => crate::ui::outln!("{id}: ok"),
                    Err(e) => {
                        eprintln!("farm: {e}");
                        code = 1;
                    }
                }
            }
            Ok(code)
        }
    }
}

fn ls(store: &SnapshotStore, args: LsArgs) -> Result<i32> {
    let (snapshots, damaged) = store.list();
    if args.json {
        let manifests: Vec<_> = snapshots.iter().map(|s| &s.manifest).collect();
        crate::ui::outln!("{}", serde_json::to_string_pretty(&manifests)?);
        return Ok(0);
    }
    let host = VmSettings::detect(AccelSetting::Auto)
        .ok()
        .and_then(|vm| Forker::new(vm).ok())
        .map(|f| f.host);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    crate::ui::outln!(
        "{:<24} {:<24} {:<16} {:>8} {:>9} {:>9}  STATUS",
        "ID",
        "PARENT",
        "LABEL",
        "AGE",
        "RAM MiB",
        "DISK MiB"
    );
    for s in &snapshots {
        let m = &s.manifest;
        let mib = |name: &str| {
            std::fs::metadata(s.dir.join(name))
                .map(|meta| (std::os::unix::fs::MetadataExt::blocks(&meta) * 512) >> 20)
                .unwrap_or(0)
        };
        let status = match &host {
            Some(h) => match s.check_host(h) {
                Ok(()) => "ok".to_string(),
                Err(_) => "other host setup".to_string(),
            },
            None => "?".to_string(),
        };
        crate::ui::outln!(
            "{:<24} {:<24} {:<16} {:>8} {:>9} {:>9}  {}",
            m.id,
            m.parent.as_deref().unwrap_or("-"),
            truncate(&m.label, 16),
            age(now.saturating_sub(m.created_unix)),
            mib("memory"),
            mib("disk.qcow2"),
            status
        );
    }
    for (id, e) in damaged {
        crate::ui::outln!("{id:<24} damaged: {e}");
    }
    Ok(0)
}

fn gc(store: &SnapshotStore, dry_run: bool) -> Result<i32> {
    let (snapshots, _) = store.list();
    let host = Forker::new(VmSettings::detect(AccelSetting::Auto)?)?.host;
    let cache = vmm::artifacts::cache_dir();
    // Templates stay while they match this host and the current artifacts.
    let keep: BTreeSet<String> = snapshots
        .iter()
        .filter(|s| s.manifest.parent.is_none())
        .filter(|s| s.check_host(&host).is_ok())
        .filter(|s| {
            // A registry image is not looked up again (that would reach the network, and a
            // tag may have moved): its template stays while its converted image is there and
            // the kernel and agent are current.
            let spec = &s.manifest.template.image;
            let image = if spec.starts_with("registry:") {
                "minimal"
            } else {
                spec.as_str()
            };
            match GuestArtifacts::locate(&cache, image) {
                Ok(a) if image != spec => {
                    a.kernel.key == s.manifest.kernel.key
                        && a.agent.key == s.manifest.agent_key
                        && s.manifest.image.path.is_file()
                }
                Ok(a) => {
                    a.kernel.key == s.manifest.kernel.key
                        && a.image.key == s.manifest.image.key
                        && a.agent.key == s.manifest.agent_key
                }
                Err(_) => false,
            }
        })
        .map(|s| s.id().to_string())
        .collect();
    // Child snapshots go unless a kept snapshot descends from them (store.gc keeps every
    // ancestor of a kept snapshot), so one run removes whole unused branches.
    let removed = store.gc(&keep, dry_run)?;
    let verb = if dry_run { "would remove" } else { "removed" };
    for id in &removed {
        crate::ui::outln!("{verb} {id}");
    }
    crate::ui::outln!("{} snapshot folders {verb}", removed.len());
    Ok(0)
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        s.chars().take(n - 1).collect::<String>() + "~"
    }
}

fn age(secs: u64) -> String {
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86400),
    }
}
