//! The book of open forks: the one state machine every front-end of live forks shares
//! (`farm serve`'s sessions and sandboxes, OpenEnv and MCP), apart from the VMs so it can be
//! tested on its own. It holds each fork by id with its timers, counts VM slots, and says which
//! forks expired.
//!
//! A fork's life: opening (a slot reserved, counted against `serve.max_sessions`) → live
//! (usable; its last use is remembered, and requests in it are counted, so one that runs long
//! never makes it idle) → submitting (a session being scored: nothing else may touch it, and
//! expiry, DELETE and shutdown leave it to finish) → gone. A live fork may be paused (saved to
//! disk, its VM stopped): then it holds no slot and is never idle, though its lifetime runs;
//! resuming takes a slot again. A fork that went is remembered (bounded) with why, so a caller
//! asking for it learns what happened instead of a bare 404.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Forks that went, remembered (this many at most) to say why when they are asked for.
const MAX_REMEMBERED_ENDS: usize = 10_000;

/// Why the book refused: a front-end tells its caller (HTTP: 429, 404, 409).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// Every slot is live or opening; worth retrying later.
    #[error("{taken} sessions and sandboxes are live or opening (serve.max_sessions {max})")]
    Full { taken: usize, max: usize },
    /// No such fork (never opened, or ended).
    #[error("no live session {0:?}")]
    NoLive(String),
    /// No such fork, live or paused.
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

impl Refusal {
    /// Whether the caller may retry the same request later (every slot taken).
    pub fn retryable(&self) -> bool {
        matches!(self, Refusal::Full { .. })
    }
}

/// Which front-end a fork belongs to: each sees only its own kind (another's id is one that
/// does not exist), while slots are counted across both.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// A session: a task, scored at the end.
    Session,
    /// A sandbox: no task, no verdict.
    Sandbox,
}

/// How long a fork may live: unused (its lease), and in all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timers {
    /// Ended when unused this long while live.
    pub idle: Duration,
    /// Ended this long after it opened, live or paused (None: no limit).
    pub lifetime: Option<Duration>,
}

/// Why the book says a fork should end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Expiry {
    /// Live and unused past its idle timeout.
    Idle,
    /// Past its lifetime.
    Lifetime,
}

/// How a fork that went ended, remembered for callers that ask for it later.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending {
    /// Its front-end ended it (a delete, a submit, a timer, a shutdown), for this reason.
    Ended(String),
    /// Its VM died (it stopped answering, or its process went), for this reason.
    Died(String),
}

/// One fork in the book.
struct Held<S, C> {
    fork: Arc<tokio::sync::Mutex<S>>,
    /// What its front-end keeps of it outside the fork's lock (its owner, its size).
    card: C,
    kind: Kind,
    timers: Timers,
    opened: Instant,
    /// Its last use (kept outside the fork's lock, so expiry never waits).
    touched: Instant,
    /// Requests using it now.
    busy: usize,
}

/// Open forks by id, each with its card (`C`: what the front-end keeps of it that is read
/// without waiting on the fork's lock), the slots of forks still opening, who is being
/// submitted, and why recent ones went.
pub struct Book<S, C = ()> {
    open: HashMap<String, Held<S, C>>,
    submitting: HashSet<String>,
    /// Forks saved to disk, without a VM (they are in `open` too).
    paused: HashSet<String>,
    /// Slots of forks still being opened, branched or resumed.
    reserved: usize,
    /// How forks went, the oldest first out.
    ended: HashMap<String, Ending>,
    ended_order: VecDeque<String>,
}

impl<S, C> Default for Book<S, C> {
    fn default() -> Self {
        Book {
            open: HashMap::new(),
            submitting: HashSet::new(),
            paused: HashSet::new(),
            reserved: 0,
            ended: HashMap::new(),
            ended_order: VecDeque::new(),
        }
    }
}

impl<S, C> Book<S, C> {
    /// Takes a slot for a fork about to open (or resume), or says how many are live or
    /// opening.
    pub fn reserve(&mut self, max: usize) -> Result<(), Refusal> {
        let taken = self.live_len() + self.reserved;
        if taken >= max {
            return Err(Refusal::Full { taken, max });
        }
        self.reserved += 1;
        Ok(())
    }

    /// Gives back a slot whose fork never opened.
    pub fn release(&mut self) {
        self.reserved = self.reserved.saturating_sub(1);
    }

    /// A reserved slot becomes a live fork.
    pub fn open(&mut self, id: &str, kind: Kind, fork: S, card: C, timers: Timers, now: Instant) {
        self.release();
        self.insert(id, kind, fork, card, timers, now);
    }

    /// A paused fork of an earlier process, taken up at start (it holds no slot).
    pub fn add_paused(&mut self, id: &str, kind: Kind, fork: S, card: C, timers: Timers, now: Instant) {
        self.insert(id, kind, fork, card, timers, now);
        self.paused.insert(id.to_string());
    }

    fn insert(&mut self, id: &str, kind: Kind, fork: S, card: C, timers: Timers, now: Instant) {
        let held = Held {
            fork: Arc::new(tokio::sync::Mutex::new(fork)),
            card,
            kind,
            timers,
            opened: now,
            touched: now,
            busy: 0,
        };
        self.open.insert(id.to_string(), held);
    }

    /// A live fork a caller may act on (remembered as used now): 404 when there is none,
    /// 409 while it is being submitted or is paused.
    pub fn usable(&mut self, id: &str, kind: Kind, now: Instant) -> Result<Arc<tokio::sync::Mutex<S>>, Refusal> {
        let held = self
            .open
            .get_mut(id)
            .filter(|h| h.kind == kind)
            .ok_or_else(|| Refusal::NoLive(id.to_string()))?;
        if self.submitting.contains(id) {
            return Err(Refusal::BeingSubmitted(id.to_string()));
        }
        if self.paused.contains(id) {
            return Err(Refusal::Paused(id.to_string()));
        }
        held.touched = now;
        Ok(held.fork.clone())
    }

    /// A fork, live or paused, for pause, resume, branch and GET: 404 when there is none,
    /// 409 while it is being submitted.
    pub fn any(&self, id: &str, kind: Kind) -> Result<Arc<tokio::sync::Mutex<S>>, Refusal> {
        let held = self
            .open
            .get(id)
            .filter(|h| h.kind == kind)
            .ok_or_else(|| Refusal::NoneLiveOrPaused(id.to_string()))?;
        if self.submitting.contains(id) {
            return Err(Refusal::BeingScored(id.to_string()));
        }
        Ok(held.fork.clone())
    }

    /// A fork's card, live or paused (None: no fork of `kind` is in the book by that id).
    pub fn card(&self, id: &str, kind: Kind) -> Option<&C> {
        self.open.get(id).filter(|h| h.kind == kind).map(|h| &h.card)
    }

    /// A fork's card to change, live or paused (None: no fork of `kind` is in the book by
    /// that id).
    pub fn card_mut(&mut self, id: &str, kind: Kind) -> Option<&mut C> {
        self.open.get_mut(id).filter(|h| h.kind == kind).map(|h| &mut h.card)
    }

    /// Every fork's card: its id, kind, whether it is paused, and the card.
    pub fn cards(&self) -> impl Iterator<Item = (&str, Kind, bool, &C)> {
        self.open
            .iter()
            .map(|(id, h)| (id.as_str(), h.kind, self.paused.contains(id), &h.card))
    }

    /// When the fork opened (None: it is not in the book).
    pub fn opened(&self, id: &str) -> Option<Instant> {
        self.open.get(id).map(|h| h.opened)
    }

    /// Its timers (None: it is not in the book).
    pub fn timers(&self, id: &str) -> Option<Timers> {
        self.open.get(id).map(|h| h.timers)
    }

    /// Whether a fork is paused.
    /// New timers for an open fork (its lifetime still counts from its opening); false when
    /// it is not open.
    pub fn set_timers(&mut self, id: &str, timers: Timers) -> bool {
        match self.open.get_mut(id) {
            Some(held) => {
                held.timers = timers;
                true
            }
            None => false,
        }
    }

    pub fn is_paused(&self, id: &str) -> bool {
        self.paused.contains(id)
    }

    /// A live fork was saved to disk: its slot is free.
    pub fn pause(&mut self, id: &str) {
        if self.open.contains_key(id) {
            self.paused.insert(id.to_string());
        }
    }

    /// A paused fork runs again, in the slot reserved for it.
    pub fn resume(&mut self, id: &str, now: Instant) {
        self.release();
        self.paused.remove(id);
        if let Some(held) = self.open.get_mut(id) {
            held.touched = now;
        }
    }

    /// Ids of the paused forks of `kind`.
    pub fn paused_ids(&self, kind: Kind) -> Vec<String> {
        self.paused
            .iter()
            .filter(|id| self.open.get(*id).is_some_and(|h| h.kind == kind))
            .cloned()
            .collect()
    }

    /// Every fork of `kind`, live or paused.
    pub fn all(&self, kind: Kind) -> Vec<(String, Arc<tokio::sync::Mutex<S>>)> {
        self.open
            .iter()
            .filter(|(_, h)| h.kind == kind)
            .map(|(id, h)| (id.clone(), h.fork.clone()))
            .collect()
    }

    /// Every fork of `kind` whose card `keep` keeps (a tenant's own), live or paused.
    pub fn all_with(&self, kind: Kind, keep: impl Fn(&C) -> bool) -> Vec<(String, Arc<tokio::sync::Mutex<S>>)> {
        self.open
            .iter()
            .filter(|(_, h)| h.kind == kind && keep(&h.card))
            .map(|(id, h)| (id.clone(), h.fork.clone()))
            .collect()
    }

    /// Remembers a use of a fork that is still open.
    pub fn touch(&mut self, id: &str, now: Instant) {
        if let Some(held) = self.open.get_mut(id) {
            held.touched = now;
        }
    }

    /// A request starts using the fork: it is not idle until [`Book::finish`].
    pub fn begin(&mut self, id: &str, now: Instant) {
        if let Some(held) = self.open.get_mut(id) {
            held.busy += 1;
            held.touched = now;
        }
    }

    /// A request that [`Book::begin`] counted is over (the fork was used last now).
    pub fn finish(&mut self, id: &str, now: Instant) {
        if let Some(held) = self.open.get_mut(id) {
            held.busy = held.busy.saturating_sub(1);
            held.touched = now;
        }
    }

    /// Marks a fork as being submitted; false when it already is.
    pub fn begin_submit(&mut self, id: &str) -> bool {
        self.submitting.insert(id.to_string())
    }

    /// A submit that found the fork already ended.
    pub fn abandon_submit(&mut self, id: &str) {
        self.submitting.remove(id);
    }

    /// Whether a fork may be ended without a row (DELETE, expiry, shutdown).
    pub fn endable(&self, id: &str, kind: Kind) -> Result<(), Refusal> {
        if !self.open.get(id).is_some_and(|h| h.kind == kind) {
            return Err(Refusal::NoLive(id.to_string()));
        }
        if self.submitting.contains(id) {
            return Err(Refusal::BeingSubmitted(id.to_string()));
        }
        Ok(())
    }

    /// The fork is gone, as `ending` says (remembered for callers that ask for it later);
    /// its handle, if it was there.
    pub fn remove(&mut self, id: &str, ending: Ending) -> Option<Arc<tokio::sync::Mutex<S>>> {
        self.submitting.remove(id);
        self.paused.remove(id);
        let held = self.open.remove(id)?;
        if self.ended_order.len() >= MAX_REMEMBERED_ENDS {
            if let Some(oldest) = self.ended_order.pop_front() {
                self.ended.remove(&oldest);
            }
        }
        self.ended.insert(id.to_string(), ending);
        self.ended_order.push_back(id.to_string());
        Some(held.fork)
    }

    /// How a fork that went ended (None: never heard of, or forgotten).
    pub fn ending(&self, id: &str) -> Option<&Ending> {
        self.ended.get(id)
    }

    /// Forks of `kind` to end now, and why: live ones unused past their idle timeout (never
    /// one in use or being submitted), and any past its lifetime (never one being submitted).
    pub fn expired(&self, kind: Kind, now: Instant) -> Vec<(String, Expiry)> {
        let mut out = Vec::new();
        for (id, held) in &self.open {
            if held.kind != kind || self.submitting.contains(id) {
                continue;
            }
            if held
                .timers
                .lifetime
                .is_some_and(|l| now.duration_since(held.opened) > l)
            {
                out.push((id.clone(), Expiry::Lifetime));
            } else if held.busy == 0 && !self.paused.contains(id) && now.duration_since(held.touched) > held.timers.idle
            {
                out.push((id.clone(), Expiry::Idle));
            }
        }
        out.sort();
        out
    }

    /// A new life for a fork: its lifetime counts from `now`, under `timers`; false when it
    /// is not open.
    pub fn renew(&mut self, id: &str, now: Instant, timers: Timers) -> bool {
        match self.open.get_mut(id) {
            Some(held) => {
                held.opened = now;
                held.touched = now;
                held.timers = timers;
                true
            }
            None => false,
        }
    }

    /// When each live fork of `kind` would end if nothing changed: why, and how long from
    /// `now` (a fork in use never idles; paused ones and those being submitted are left out).
    pub fn ends(&self, kind: Kind, now: Instant) -> Vec<(String, Expiry, std::time::Duration)> {
        let mut out = Vec::new();
        for (id, held) in &self.open {
            if held.kind != kind || self.submitting.contains(id) || self.paused.contains(id) {
                continue;
            }
            let lifetime = held
                .timers
                .lifetime
                .map(|l| (held.opened + l).saturating_duration_since(now));
            let idle = (held.busy == 0).then(|| (held.touched + held.timers.idle).saturating_duration_since(now));
            let end = match (idle, lifetime) {
                (Some(i), Some(l)) if i < l => (Expiry::Idle, i),
                (_, Some(l)) => (Expiry::Lifetime, l),
                (Some(i), None) => (Expiry::Idle, i),
                (None, None) => continue,
            };
            out.push((id.clone(), end.0, end.1));
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// Live forks of `kind` that are not being submitted (what a shutdown ends; paused ones
    /// stay).
    pub fn endable_ids(&self, kind: Kind) -> Vec<String> {
        self.open
            .iter()
            .filter(|(id, h)| h.kind == kind && !self.submitting.contains(*id) && !self.paused.contains(*id))
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// Live forks (with a VM), of every kind: what takes slots.
    pub fn live_len(&self) -> usize {
        self.open.len() - self.paused.len()
    }

    /// Forks of `kind`: (live, paused).
    pub fn count(&self, kind: Kind) -> (usize, usize) {
        let (mut live, mut paused) = (0, 0);
        for (id, held) in &self.open {
            if held.kind == kind {
                if self.paused.contains(id) {
                    paused += 1;
                } else {
                    live += 1;
                }
            }
        }
        (live, paused)
    }

    pub fn paused_len(&self) -> usize {
        self.paused.len()
    }
}

#[cfg(test)]
mod tests;
