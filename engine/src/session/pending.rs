//! A pause or a resume that the front-end records before it takes effect: it commits it once
//! its record is written, or drops (cancels) it, and the session is as it was.

use std::sync::Arc;

use super::{Change, Session, Vm};
use crate::live::LiveFork;
use crate::pause::PausedFork;

/// A session saved to disk whose VM is stopped but not yet gone: the front-end records the
/// pause, then must [`PendingPause::commit`] it (the VM goes) or [`PendingPause::cancel`] it
/// (the VM runs on, the folder goes).
pub struct PendingPause<'a> {
    pub(super) session: &'a mut Session,
    pub(super) paused: Arc<PausedFork>,
}

impl PendingPause<'_> {
    /// The saved state.
    pub fn paused(&self) -> &PausedFork {
        &self.paused
    }

    /// The pause is recorded: the VM stops and its memory is freed.
    pub fn commit(self) {
        self.session.vm = Vm::Paused(self.paused);
    }

    /// The pause could not be recorded: the session goes on as it was.
    pub async fn cancel(self) {
        if let Vm::Live(live) = &self.session.vm {
            let _ = live.fork.machine.resume().await;
        }
    }
}

/// A paused session forked again, not yet recorded as resumed.
pub struct PendingResume<'a> {
    pub(super) session: &'a mut Session,
    pub(super) live: LiveFork,
}

impl PendingResume<'_> {
    /// The new VM's guest, to look at before the resume is committed (a resume that checks
    /// what was to be kept).
    pub fn guest(&self) -> crate::guest::Guest {
        self.live.guest()
    }

    /// The resume is recorded: the session is live (its paused state goes once no branch
    /// needs it).
    pub fn commit(self) {
        self.session.changes.note(Change::Resume);
        self.session.vm = Vm::Live(Box::new(self.live));
    }
}
