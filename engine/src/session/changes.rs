//! What a request in flight saw of its fork. A sandbox's guest is used without the fork's
//! lock (a long command never blocks a delete), so the fork may change under a request: a
//! reset or a pause swaps its VM's channel, a branch, a snapshot or a checkpoint stops the VM
//! for a moment. Such a change is not a death. A [`Guest`] carries a stamp of the changes its
//! session had seen when it was taken, and [`Session::judge`] tells a failure of the guest
//! after a change from one of a VM that really went.

use std::collections::VecDeque;
use std::sync::Mutex;

use super::{Session, SessionCallError, SessionState, Vm};
use crate::guest::{Guest, GuestError};

/// A change of a fork's VM that a request in flight may be cut by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    Reset,
    Pause,
    Resume,
    Branch,
    Snapshot,
    Checkpoint,
}

impl Change {
    /// What was done to the fork, as a past participle ("reset", "paused").
    pub fn done(self) -> &'static str {
        match self {
            Change::Reset => "reset",
            Change::Pause => "paused",
            Change::Resume => "resumed",
            Change::Branch => "branched",
            Change::Snapshot => "snapshotted",
            Change::Checkpoint => "checkpointed",
        }
    }
}

/// How many of the newest changes a session keeps: a request cut by older ones is told of the
/// oldest kept.
const KEPT: usize = 16;

/// A session's changes so far: how many, and the newest [`KEPT`] of them.
#[derive(Debug, Default)]
pub(crate) struct Changes(Mutex<(u64, VecDeque<Change>)>);

impl Changes {
    fn count(&self) -> u64 {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).0
    }

    /// The first change after the `stamp`-th (None: none since).
    fn first_since(&self, stamp: u64) -> Option<Change> {
        let changes = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let (count, kept) = &*changes;
        let newer = count.checked_sub(stamp).filter(|n| *n > 0)? as usize;
        kept.get(kept.len().saturating_sub(newer)).copied()
    }

    /// One more change, noted before it touches the VM (a request cut by it finds it).
    pub(crate) fn note(&self, change: Change) {
        let mut changes = self.0.lock().unwrap_or_else(|p| p.into_inner());
        changes.0 += 1;
        if changes.1.len() == KEPT {
            changes.1.pop_front();
        }
        changes.1.push_back(change);
    }
}

/// How a failed request to a fork's guest is to be taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Judged {
    /// The fork changed under the request (the last change); it is in `state` now, and lives.
    Changed(Change, SessionState),
    /// Its VM is gone: the channel closed or the guest missed its pings, and nothing
    /// changed under the request.
    Died(String),
    /// The request failed and the fork lives.
    Failed(GuestError),
}

/// [`Session::judge`] as a pure function: the first change since the guest was taken (if
/// any), the session's state now, the failure.
fn judge(since: Option<Change>, state: SessionState, e: GuestError) -> Judged {
    let lost = matches!(
        e,
        GuestError::ChannelClosed(_) | GuestError::MissedPings(_) | GuestError::Unanswered(_)
    );
    match since {
        Some(change) if lost => Judged::Changed(change, state),
        _ => match e {
            GuestError::ChannelClosed(why) | GuestError::MissedPings(why) => Judged::Died(why),
            e => Judged::Failed(e),
        },
    }
}

impl Session {
    /// Its guest, to use without its lock, stamped with the changes seen so far: Err while
    /// paused or once ended.
    pub fn guest(&self) -> Result<Guest, SessionCallError> {
        match &self.vm {
            Vm::Live(live) => {
                let mut guest = live.guest();
                guest.stamp = self.changes.count();
                Ok(guest)
            }
            Vm::Paused(_) => Err(SessionCallError::Paused),
            Vm::Ended => Err(SessionCallError::Ended),
        }
    }

    /// How a failure of `guest` (taken from this session) is to be taken. Call it with the
    /// session's lock held, so that a change still running has ended. A guest that did not
    /// answer after its session changed was cut by that change, which is no death; with no
    /// change, a closed channel or missed pings are its VM's end, and a request unanswered
    /// past its deadline is that request's failure alone.
    pub fn judge(&self, guest: &Guest, e: GuestError) -> Judged {
        judge(self.changes.first_since(guest.stamp), self.state(), e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn closed() -> GuestError {
        GuestError::ChannelClosed("eof".into())
    }

    #[test]
    fn a_lost_guest_after_a_change_was_cut_by_it() {
        for e in [
            closed(),
            GuestError::MissedPings("3 pings".into()),
            GuestError::Unanswered("60 s".into()),
        ] {
            assert_eq!(
                judge(Some(Change::Reset), SessionState::Live, e.clone()),
                Judged::Changed(Change::Reset, SessionState::Live),
                "{e}"
            );
        }
        assert_eq!(
            judge(Some(Change::Pause), SessionState::Paused, closed()),
            Judged::Changed(Change::Pause, SessionState::Paused)
        );
    }

    #[test]
    fn a_lost_guest_with_nothing_changed_died() {
        assert_eq!(judge(None, SessionState::Live, closed()), Judged::Died("eof".into()));
        assert_eq!(
            judge(None, SessionState::Live, GuestError::MissedPings("3".into())),
            Judged::Died("3".into())
        );
    }

    #[test]
    fn an_unanswered_request_alone_is_no_death() {
        let e = GuestError::Unanswered("write stdin within 60 s".into());
        assert_eq!(judge(None, SessionState::Live, e.clone()), Judged::Failed(e));
    }

    #[test]
    fn other_failures_are_the_requests_whatever_changed() {
        for e in [
            GuestError::Missing("/x".into()),
            GuestError::Refused("no".into()),
            GuestError::Broken("restarted".into()),
        ] {
            assert_eq!(
                judge(Some(Change::Reset), SessionState::Live, e.clone()),
                Judged::Failed(e)
            );
        }
    }

    #[test]
    fn the_first_change_since_a_stamp_is_the_one_that_cut() {
        let changes = Changes::default();
        assert_eq!((changes.count(), changes.first_since(0)), (0, None));
        changes.note(Change::Pause);
        changes.note(Change::Resume);
        assert_eq!(changes.first_since(0), Some(Change::Pause), "paused, then resumed");
        assert_eq!(changes.first_since(1), Some(Change::Resume));
        assert_eq!(changes.first_since(2), None);
        for _ in 0..2 * KEPT {
            changes.note(Change::Branch);
        }
        changes.note(Change::Reset);
        assert_eq!(changes.first_since(0), Some(Change::Branch), "the oldest kept");
        assert_eq!(changes.first_since(changes.count() - 1), Some(Change::Reset));
    }
}
