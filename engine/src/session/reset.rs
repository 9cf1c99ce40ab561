//! A sandbox put back to its environment's snapshot, same id: in place where its VM allows
//! (the same QEMU, exactly as the snapshot: `vmm/src/machine/reset.rs`), else by a new fork of
//! the environment, and the answer says which and why.

use std::sync::Arc;
use std::time::{Duration, Instant};

use snapshotter::ForkIdentity;

use super::{Session, SessionCallError, Vm};
use crate::errors::describe;
use crate::live::{install_ca, LiveFork};
use crate::metrics::{Role, VmGauge};

/// How a reset was made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResetWay {
    /// The same QEMU process, put back exactly to the snapshot.
    InPlace { took: Duration },
    /// A new fork of the environment took the VM's place: why the reset could not be made in
    /// place (or failed there).
    FreshFork { why: String, took: Duration },
}

/// Why a reset did not happen (the sandbox keeps the VM it had).
#[derive(Debug, thiserror::Error)]
pub enum SessionResetError {
    #[error(transparent)]
    Call(#[from] SessionCallError),
    #[error("a session with a task cannot be reset: open a new one")]
    HasTask,
    #[error("forking the environment again")]
    Fork(#[source] snapshotter::ForkError),
    #[error(transparent)]
    Ca(#[from] crate::live::CaInstallError),
}

impl Session {
    /// Puts a live sandbox back to its environment's snapshot: files, processes, memory and
    /// disk as the environment made them, with a new identity (entropy, clock, hostname,
    /// `seed`) and the same variables, working folder, user and network.
    pub async fn reset(&mut self, seed: u64) -> Result<ResetWay, SessionResetError> {
        if self.task.is_some() {
            return Err(SessionResetError::HasTask);
        }
        let started = Instant::now();
        let live = match &mut self.vm {
            Vm::Live(live) => live,
            Vm::Paused(_) => return Err(SessionCallError::Paused.into()),
            Vm::Ended => return Err(SessionCallError::Ended.into()),
        };
        self.changes.note(super::Change::Reset);
        let identity = ForkIdentity {
            env: live.fork.identity.env.clone(),
            ..ForkIdentity::new(seed)
        };
        let why = if live.fork.snapshot_id != self.snapshot.id() {
            "its VM is a fork of a pause or a branch, not of its environment".to_string()
        } else if !live.fork.machine.resettable() {
            "its VM was not started resettable".to_string()
        } else {
            match live.fork.reset(identity.clone()).await {
                Ok(_) => {
                    install_ca(&live.fork, &self.network).await?;
                    return Ok(ResetWay::InPlace {
                        took: started.elapsed(),
                    });
                }
                Err(e) => format!("the reset in place failed: {}", describe(&e)),
            }
        };
        tracing::info!(snapshot = %self.snapshot.id(), %why, "sandbox reset by a new fork");
        let fork = self
            .forker
            .fork(&self.snapshot, identity)
            .await
            .map_err(SessionResetError::Fork)?;
        install_ca(&fork, &self.network).await?;
        fork.machine.set_network(self.network.clone());
        let place = live.place.clone();
        self.vm = Vm::Live(Box::new(LiveFork::new(
            fork,
            Arc::new(Vec::new()),
            place,
            VmGauge::new(Role::Sandbox),
        )));
        self._branch = None;
        Ok(ResetWay::FreshFork {
            why,
            took: started.elapsed(),
        })
    }
}
