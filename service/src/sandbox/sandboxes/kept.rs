//! A resume that checks: before a resumed sandbox is handed back, farm looks in its new VM
//! for what its owner asked to be kept (files with their sizes, processes running, ports
//! listening). What is missing keeps it paused, in `resume_failed` with the reason, rather
//! than running with less than was there. The checks read the guest through farm's agent
//! (a file's facts, a process's state, the kernel's table of listening sockets); they are
//! the owner's safeguard against a lost state, not a security boundary.

use engine::guest::Guest;
use farm_protocol::process::ProcessStatus;
use std::time::Instant;

use engine::book::Timers;

use super::{view, Sandboxes};
use crate::error::{ApiError, ApiResult, ErrorKind};
use crate::events::{EventType, ForkState, Happened};
use crate::forks::VmSlot;
use crate::wire::SandboxView;

pub use crate::requests::{Keep, KeptFile, ResumeRequest, MAX_KEPT};

impl Sandboxes {
    /// `POST /v1/sandboxes/{id}/resume`: forked again from its saved state, and handed back
    /// once the new VM has what `keep` (else its create request's) names; otherwise the new VM
    /// goes and the sandbox stays paused, in `resume_failed`, with why. A sandbox its timeout
    /// paused starts a new lifetime.
    pub(crate) async fn resume(
        &self,
        id: &str,
        keep: Option<Keep>,
        slot: impl FnOnce() -> ApiResult<VmSlot>,
    ) -> ApiResult<SandboxView> {
        let sandbox = self.get(id)?;
        let mut sandbox = sandbox.lock().await;
        if sandbox.run.paused().is_none() {
            return Err(ApiError::new(
                ErrorKind::Conflict,
                format!("sandbox {id} is not paused"),
            ));
        }
        let keep = keep
            .or_else(|| sandbox.sandbox().settings.request.keep.clone())
            .unwrap_or_default();
        let remount = sandbox.sandbox().remount.clone();
        let slot = slot()?;
        let pending = sandbox.run.resume().await.map_err(|e| {
            ApiError::new(
                ErrorKind::Internal,
                format!("resuming sandbox {id}: {}", engine::describe(&e)),
            )
        })?;
        let Some(pending) = pending else {
            return Ok(view(&sandbox));
        };
        let missing = match keep.is_empty() {
            true => Vec::new(),
            false => missing(&pending.guest(), &keep).await,
        };
        if !missing.is_empty() {
            // Uncommitted, the new VM goes: the sandbox stays as it was saved.
            drop(pending);
            let why = missing.join("; ");
            sandbox.sandbox_mut().resume_failed = Some(why.clone());
            self.save_record(&sandbox);
            let failed = Happened::sandbox(EventType::ResumeFailed, ForkState::ResumeFailed).reason(&why);
            self.tell(id, failed);
            tracing::warn!(sandbox = %id, "its resume's checks failed: {why}");
            return Err(ApiError::new(
                ErrorKind::Conflict,
                format!(
                    "sandbox {id} failed its resume checks: {why}; it stays paused (resume_failed): resume it again, with other checks, or delete it"
                ),
            ));
        }
        if let Err(e) = self.remount(id, &pending.guest(), &remount).await {
            drop(pending);
            return Err(e);
        }
        pending.commit();
        slot.taken();
        let now = Instant::now();
        let facts = sandbox.sandbox_mut();
        facts.resume_failed = None;
        facts.remount.clear();
        if facts.auto_paused_ms.take().is_some() {
            facts.life_from_ms = engine::row::now_ms() as u64;
            let timers = Timers {
                idle: facts.settings.idle,
                lifetime: Some(facts.settings.lifetime),
            };
            self.forks().renew(id, now, timers);
        }
        self.forks().resume(id, now);
        self.save_record(&sandbox);
        self.tell(id, Happened::sandbox(EventType::Resumed, ForkState::Running));
        Ok(view(&sandbox))
    }
}

/// What of `keep` the guest lacks, one sentence each (empty: all there).
pub async fn missing(guest: &Guest, keep: &Keep) -> Vec<String> {
    let mut missing = Vec::new();
    for file in &keep.files {
        match guest.stat(&file.path).await {
            Ok(entry) if entry.kind != farm_protocol::folder::EntryKind::File => {
                missing.push(format!("{} is not a regular file", file.path));
            }
            Ok(entry) => {
                if let Some(size) = file.size.filter(|s| *s != entry.size) {
                    missing.push(format!("{} has {} bytes, not {size}", file.path, entry.size));
                }
            }
            Err(e) => missing.push(format!("{}: {e}", file.path)),
        }
    }
    for pid in &keep.processes {
        match guest.process(*pid).await {
            Ok(info) if matches!(info.status, ProcessStatus::Running) => {}
            Ok(_) => missing.push(format!("process {pid} has exited")),
            Err(e) => missing.push(format!("process {pid}: {e}")),
        }
    }
    if !keep.ports.is_empty() {
        let mut table = String::new();
        for file in ["/proc/net/tcp", "/proc/net/tcp6"] {
            if let Ok(bytes) = guest.read_file(file).await {
                table.push_str(&String::from_utf8_lossy(&bytes));
            }
        }
        let listening = listening_ports(&table);
        for port in &keep.ports {
            if !listening.contains(port) {
                missing.push(format!("nothing listens on port {port}"));
            }
        }
    }
    missing
}

/// The local ports of sockets in state LISTEN (`0A`) in `/proc/net/tcp` text.
fn listening_ports(table: &str) -> std::collections::BTreeSet<u16> {
    table
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (local, state) = (fields.get(1)?, fields.get(3)?);
            let port = local.rsplit_once(':')?.1;
            (*state == "0A").then(|| u16::from_str_radix(port, 16).ok()).flatten()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_listening_sockets_count() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0 100 0 0 10 0
   1: 0100007F:D431 0100007F:1F40 01 00000000:00000000 00:00000000 00000000     0        0 2 1 0 20 4 30 10 -1
   0: 00000000000000000000000000000000:0050 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000 0 0 3 1 0 100 0 0 10 0";
        assert_eq!(listening_ports(table).into_iter().collect::<Vec<_>>(), [80, 8000]);
    }

    #[test]
    fn a_keep_is_bounded_and_names_its_field() {
        let keep = Keep {
            files: vec![KeptFile {
                path: "relative".into(),
                size: None,
            }],
            ..Default::default()
        };
        assert_eq!(
            keep.check("keep").unwrap_err().field.as_deref(),
            Some("keep.files[0].path")
        );
        let keep = Keep {
            ports: vec![1; MAX_KEPT + 1],
            ..Default::default()
        };
        assert_eq!(keep.check("keep").unwrap_err().field.as_deref(), Some("keep.ports"));
    }
}
