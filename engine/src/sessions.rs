//! Live sessions' bookkeeping, apart from their VMs so it can be tested on its own: the state
//! machine every front-end shares (`farm serve`'s session API, the sandbox API, OpenEnv and MCP
//! all reach sessions through one book).
//!
//! A session's life: opening (a slot reserved, counted against `serve.max_sessions`) →
//! live (usable; its last use is remembered for the lease) → submitting (scored; nothing
//! else may touch it, and expiry, DELETE and shutdown leave it to finish) → gone. A live
//! session may be paused (saved to disk, its VM stopped): then it holds no slot, has no
//! lease, and a shutdown leaves it for the next start; resuming takes a slot again.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Why the book refused: a front-end tells its caller (HTTP: 429, 404, 409).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SessionRefusal {
    /// Every slot is live or opening; worth retrying later.
    #[error("{taken} sessions and sandboxes are live or opening (serve.max_sessions {max})")]
    Full { taken: usize, max: usize },
    /// No such session (never opened, or ended).
    #[error("no live session {0:?}")]
    NoLive(String),
    /// No such session, live or paused.
    #[error("no live or paused session {0:?}")]
    NoneLiveOrPaused(String),
    /// It is being submitted: nothing else may touch it.
    #[error("session {0:?} is being submitted")]
    BeingSubmitted(String),
    /// It is being submitted and scored (what pause, resume, branch and GET are told).
    #[error("session {0:?} is being submitted and scored")]
    BeingScored(String),
    /// It is paused: resume it first.
    #[error("session {0:?} is paused: resume it first (POST /v1/sessions/{0}/resume)")]
    Paused(String),
}

impl SessionRefusal {
    /// Whether the caller may retry the same request later (every slot taken).
    pub fn retryable(&self) -> bool {
        matches!(self, SessionRefusal::Full { .. })
    }
}

/// Live sessions by id, the slots of sessions still opening, and who is being submitted.
pub struct SessionBook<S> {
    live: HashMap<String, Arc<tokio::sync::Mutex<S>>>,
    /// Session id -> last use (kept outside the session's lock, so expiry never waits).
    touched: HashMap<String, Instant>,
    submitting: HashSet<String>,
    /// Sessions saved to disk, without a VM (they are in `live` too).
    paused: HashSet<String>,
    /// Slots of sessions still being opened, branched or resumed.
    reserved: usize,
}

impl<S> Default for SessionBook<S> {
    fn default() -> Self {
        SessionBook {
            live: HashMap::new(),
            touched: HashMap::new(),
            submitting: HashSet::new(),
            paused: HashSet::new(),
            reserved: 0,
        }
    }
}

impl<S> SessionBook<S> {
    /// Takes a slot for a session about to open, or says how many are live or opening.
    pub fn reserve(&mut self, max: usize) -> Result<(), SessionRefusal> {
        let taken = self.live.len() - self.paused.len() + self.reserved;
        if taken >= max {
            return Err(SessionRefusal::Full { taken, max });
        }
        self.reserved += 1;
        Ok(())
    }

    /// Gives back a slot whose session never opened.
    pub fn release(&mut self) {
        self.reserved = self.reserved.saturating_sub(1);
    }

    /// A reserved slot becomes a live session.
    pub fn open(&mut self, id: &str, session: S, now: Instant) {
        self.release();
        self.live
            .insert(id.to_string(), Arc::new(tokio::sync::Mutex::new(session)));
        self.touched.insert(id.to_string(), now);
    }

    /// A live session a caller may act on (remembered as used now): 404 when there is
    /// none, 409 while it is being submitted.
    pub fn usable(&mut self, id: &str, now: Instant) -> Result<Arc<tokio::sync::Mutex<S>>, SessionRefusal> {
        let session = self
            .live
            .get(id)
            .cloned()
            .ok_or_else(|| SessionRefusal::NoLive(id.to_string()))?;
        if self.submitting.contains(id) {
            return Err(SessionRefusal::BeingSubmitted(id.to_string()));
        }
        if self.paused.contains(id) {
            return Err(SessionRefusal::Paused(id.to_string()));
        }
        self.touched.insert(id.to_string(), now);
        Ok(session)
    }

    /// A session, live or paused, for pause, resume, branch and GET: 404 when there is none,
    /// 409 while it is being submitted.
    pub fn any(&self, id: &str) -> Result<Arc<tokio::sync::Mutex<S>>, SessionRefusal> {
        let session = self
            .live
            .get(id)
            .cloned()
            .ok_or_else(|| SessionRefusal::NoneLiveOrPaused(id.to_string()))?;
        if self.submitting.contains(id) {
            return Err(SessionRefusal::BeingScored(id.to_string()));
        }
        Ok(session)
    }

    /// Whether a session is paused.
    pub fn is_paused(&self, id: &str) -> bool {
        self.paused.contains(id)
    }

    /// A live session was saved to disk: its slot is free.
    pub fn pause(&mut self, id: &str) {
        if self.live.contains_key(id) {
            self.paused.insert(id.to_string());
        }
    }

    /// A paused session runs again, in the slot reserved for it.
    pub fn resume(&mut self, id: &str, now: Instant) {
        self.release();
        self.paused.remove(id);
        self.touched.insert(id.to_string(), now);
    }

    /// A paused session of an earlier process, taken up at start.
    pub fn add_paused(&mut self, id: &str, session: S) {
        self.live
            .insert(id.to_string(), Arc::new(tokio::sync::Mutex::new(session)));
        self.paused.insert(id.to_string());
    }

    /// Ids of the paused sessions.
    pub fn paused_ids(&self) -> Vec<String> {
        self.paused.iter().cloned().collect()
    }

    /// Every session, live or paused.
    pub fn all(&self) -> Vec<(String, Arc<tokio::sync::Mutex<S>>)> {
        self.live.iter().map(|(id, s)| (id.clone(), s.clone())).collect()
    }

    /// Remembers a use of a session that is still live.
    pub fn touch(&mut self, id: &str, now: Instant) {
        if self.live.contains_key(id) {
            self.touched.insert(id.to_string(), now);
        }
    }

    /// Marks a session as being submitted; false when it already is.
    pub fn begin_submit(&mut self, id: &str) -> bool {
        self.submitting.insert(id.to_string())
    }

    /// A submit that found the session already ended.
    pub fn abandon_submit(&mut self, id: &str) {
        self.submitting.remove(id);
    }

    /// Whether a session may be ended without a row (DELETE, expiry, shutdown).
    pub fn endable(&self, id: &str) -> Result<(), SessionRefusal> {
        if !self.live.contains_key(id) {
            return Err(SessionRefusal::NoLive(id.to_string()));
        }
        if self.submitting.contains(id) {
            return Err(SessionRefusal::BeingSubmitted(id.to_string()));
        }
        Ok(())
    }

    /// The session is gone.
    pub fn remove(&mut self, id: &str) {
        self.live.remove(id);
        self.touched.remove(id);
        self.submitting.remove(id);
        self.paused.remove(id);
    }

    /// Sessions unused for longer than `lease` (never one being submitted).
    pub fn idle(&mut self, lease: Duration, now: Instant) -> Vec<String> {
        let SessionBook {
            touched,
            live,
            submitting,
            ..
        } = self;
        touched.retain(|id, _| live.contains_key(id));
        let paused = &self.paused;
        touched
            .iter()
            .filter(|(id, t)| now.duration_since(**t) > lease && !submitting.contains(*id) && !paused.contains(*id))
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// Live sessions that are not being submitted (what a shutdown ends; paused sessions
    /// stay for the next start).
    pub fn endable_ids(&self) -> Vec<String> {
        self.live
            .keys()
            .filter(|id| !self.submitting.contains(*id) && !self.paused.contains(*id))
            .cloned()
            .collect()
    }

    /// Live sessions (with a VM).
    pub fn live_len(&self) -> usize {
        self.live.len() - self.paused.len()
    }

    pub fn paused_len(&self) -> usize {
        self.paused.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_counted_from_reservation_to_the_end() {
        let mut book: SessionBook<()> = SessionBook::default();
        book.reserve(2).unwrap();
        book.reserve(2).unwrap();
        let full = book.reserve(2).unwrap_err();
        assert_eq!(
            full,
            SessionRefusal::Full { taken: 2, max: 2 },
            "two opening take both slots"
        );
        assert!(full.retryable());
        // One never opens (its slot comes back), the other opens (its slot becomes it).
        book.release();
        book.open("s-1", (), Instant::now());
        assert_eq!(book.live_len(), 1);
        book.reserve(2).unwrap();
        assert!(book.reserve(2).is_err(), "one live and one opening");
        book.remove("s-1");
        book.reserve(2).unwrap();
    }

    #[test]
    fn a_session_being_submitted_is_left_alone() {
        let mut book: SessionBook<()> = SessionBook::default();
        let start = Instant::now();
        book.reserve(4).unwrap();
        book.open("s-1", (), start);
        assert!(book.usable("s-1", start).is_ok());
        assert_eq!(
            book.usable("s-2", start).unwrap_err(),
            SessionRefusal::NoLive("s-2".into())
        );
        assert!(book.begin_submit("s-1"));
        assert!(!book.begin_submit("s-1"), "a second submit is refused");
        assert_eq!(
            book.usable("s-1", start).unwrap_err(),
            SessionRefusal::BeingSubmitted("s-1".into())
        );
        assert_eq!(
            book.endable("s-1").unwrap_err(),
            SessionRefusal::BeingSubmitted("s-1".into()),
            "no DELETE mid-scoring"
        );
        assert!(book.endable_ids().is_empty(), "a shutdown leaves it to finish");
        let later = start + Duration::from_secs(100);
        assert!(
            book.idle(Duration::from_secs(10), later).is_empty(),
            "nor does it expire"
        );
        book.remove("s-1");
        assert_eq!(book.endable("s-1").unwrap_err(), SessionRefusal::NoLive("s-1".into()));
    }

    #[test]
    fn idle_sessions_expire_after_their_lease_and_use_renews_it() {
        let mut book: SessionBook<()> = SessionBook::default();
        let start = Instant::now();
        for id in ["s-1", "s-2"] {
            book.reserve(4).unwrap();
            book.open(id, (), start);
        }
        book.touch("s-2", start + Duration::from_secs(8));
        book.touch("s-gone", start + Duration::from_secs(8));
        assert_eq!(
            book.idle(Duration::from_secs(10), start + Duration::from_secs(12)),
            ["s-1"]
        );
        assert_eq!(book.endable_ids().len(), 2);
    }

    #[test]
    fn a_paused_session_frees_its_slot_never_expires_survives_shutdown_and_is_refused_mid_scoring() {
        let mut book: SessionBook<()> = SessionBook::default();
        let start = Instant::now();
        book.reserve(1).unwrap();
        book.open("s-1", (), start);
        assert!(book.reserve(1).is_err());
        book.pause("s-1");
        assert_eq!((book.live_len(), book.paused_len()), (0, 1));
        assert_eq!(
            book.usable("s-1", start).unwrap_err(),
            SessionRefusal::Paused("s-1".into()),
            "a paused session takes no exec"
        );
        assert!(book.any("s-1").is_ok());
        assert!(
            book.idle(Duration::from_secs(1), start + Duration::from_secs(100))
                .is_empty(),
            "no lease while paused"
        );
        assert!(book.endable_ids().is_empty(), "a shutdown leaves it");
        // Its slot is free: another session opens, and the resume must wait for a slot.
        book.reserve(1).unwrap();
        book.open("s-2", (), start);
        assert!(book.reserve(1).is_err(), "no slot to resume into");
        book.remove("s-2");
        book.reserve(1).unwrap();
        book.resume("s-1", start);
        assert_eq!((book.live_len(), book.paused_len()), (1, 0));
        assert!(book.usable("s-1", start).is_ok());
        // Being scored: a pause is refused.
        assert!(book.begin_submit("s-1"));
        assert_eq!(book.any("s-1").unwrap_err(), SessionRefusal::BeingScored("s-1".into()));
    }
}
