//! Lifecycle events: every change of a fork's state (made, paused, resumed, reset, branched,
//! taken up after a restart, about to time out, ended, died) is one event, with an id that
//! only grows, the time, its tenant and its fork, kept in the tenants database for
//! `serve.events.keep_days`. Clients list them (`GET /v1/events`), follow them as a stream
//! that resumes after the last id it saw, or have them sent to a webhook ([`webhooks`]).
//!
//! An event is stored and published under one lock, so a stream sees them in id order: a
//! follower subscribes before it reads what is stored, and what it reads twice it skips by
//! id. A follower that falls behind the live channel reads the database again from its last
//! id, so a slow client misses nothing.

mod calls;
pub mod webhooks;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tenants::{EventFilter, TenantId};
use tokio::sync::{broadcast, mpsc};

use crate::error::{ApiError, ApiResult, ErrorKind};
pub use crate::wire::events::{Cause, EventList, EventType, EventView, ForkKind, ForkState};

/// The most events one list answers with.
pub const MAX_LIST: usize = 1000;
/// The longest reason an event keeps, in bytes.
pub const MAX_REASON: usize = 1024;

/// `[serve.events]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventsSection {
    /// Events older than this many days are forgotten (1-365).
    #[serde(default = "keep_days")]
    pub keep_days: u64,
    /// A `timeout_warning` comes this long before a sandbox's idle timeout or lifetime ends
    /// it (0: none).
    #[serde(default = "warn_before")]
    pub warn_before_secs: u64,
    /// Hosts a tenant's webhook may point at (`host` or `host:port`; none by default, so no
    /// tenant can make the service call into the host's own network).
    #[serde(default)]
    pub webhook_hosts: Vec<String>,
}

fn keep_days() -> u64 {
    7
}
fn warn_before() -> u64 {
    60
}

impl Default for EventsSection {
    fn default() -> EventsSection {
        toml::from_str("").expect("every key has a default")
    }
}

impl EventsSection {
    pub fn check(&self) -> Result<(), String> {
        if !(1..=365).contains(&self.keep_days) {
            return Err("serve.events.keep_days must be 1 to 365".into());
        }
        for host in &self.webhook_hosts {
            if host.is_empty() || host.contains('/') || host.contains('@') || host.chars().any(char::is_whitespace) {
                return Err(format!(
                    "serve.events.webhook_hosts: {host:?} is not a host or host:port"
                ));
            }
        }
        Ok(())
    }
}

/// What happened, as a caller of [`Events::emit`] says it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Happened {
    pub kind: ForkKind,
    #[serde(rename = "type")]
    pub event: EventType,
    pub state: ForkState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause: Option<Cause>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub related: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ends_at_ms: Option<u64>,
}

impl Happened {
    pub fn sandbox(event: EventType, state: ForkState) -> Happened {
        Happened {
            kind: ForkKind::Sandbox,
            event,
            state,
            cause: None,
            reason: None,
            related: None,
            ends_at_ms: None,
        }
    }

    pub fn session(event: EventType, state: ForkState) -> Happened {
        Happened {
            kind: ForkKind::Session,
            ..Happened::sandbox(event, state)
        }
    }

    pub fn cause(mut self, cause: Cause) -> Happened {
        self.cause = Some(cause);
        self
    }

    /// Why (cut at [`MAX_REASON`] bytes: a guest's words can be in it).
    pub fn reason(mut self, reason: impl Into<String>) -> Happened {
        let mut reason: String = reason.into();
        if reason.len() > MAX_REASON {
            let mut end = MAX_REASON;
            while !reason.is_char_boundary(end) {
                end -= 1;
            }
            reason.truncate(end);
            reason.push('…');
        }
        self.reason = Some(reason);
        self
    }

    pub fn related(mut self, id: impl Into<String>) -> Happened {
        self.related = Some(id.into());
        self
    }

    pub fn ends_at(mut self, ms: u64) -> Happened {
        self.ends_at_ms = Some(ms);
        self
    }
}

/// What the database keeps of an event beside its columns.
#[derive(Serialize, Deserialize)]
struct Body {
    tenant: String,
    #[serde(flatten)]
    happened: Happened,
}

/// The service's events.
pub struct Events {
    db: Arc<crate::tenancy::Tenancy>,
    /// Held across an event's insert and its publication (ids reach the channel in order).
    order: Mutex<()>,
    live: broadcast::Sender<Arc<(TenantId, EventView)>>,
    names: Mutex<HashMap<TenantId, String>>,
    pub settings: EventsSection,
}

impl Events {
    pub fn new(tenancy: Arc<crate::tenancy::Tenancy>, settings: &EventsSection) -> Events {
        Events {
            db: tenancy,
            order: Mutex::new(()),
            live: broadcast::channel(1024).0,
            names: Mutex::new(HashMap::new()),
            settings: settings.clone(),
        }
    }

    /// A tenant's name (cached).
    pub fn tenant_name(&self, tenant: TenantId) -> String {
        self.name_of(tenant)
    }

    fn name_of(&self, tenant: TenantId) -> String {
        let mut names = self.names.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(name) = names.get(&tenant) {
            return name.clone();
        }
        let name = self
            .db
            .db
            .tenant_by_id(tenant)
            .map(|t| t.name)
            .unwrap_or_else(|_| format!("#{}", tenant.0));
        names.insert(tenant, name.clone());
        name
    }

    /// Records and publishes an event of `tenant`'s fork `fork`; its id (None when the
    /// database refused it, which is logged: the change it reports stands).
    pub fn emit(&self, tenant: TenantId, fork: &str, happened: Happened) -> Option<u64> {
        let body = Body {
            tenant: self.name_of(tenant),
            happened,
        };
        let text = serde_json::to_string(&body).expect("events serialize");
        let at_ms = tenants::now_ms();
        let _order = self.order.lock().unwrap_or_else(|p| p.into_inner());
        match self.db.db.event_append(at_ms, tenant, fork, &text) {
            Ok(id) => {
                tracing::debug!(fork, id, event = ?body.happened.event, "event");
                let view = view(id, at_ms, fork, body);
                let _ = self.live.send(Arc::new((tenant, view)));
                Some(id)
            }
            Err(e) => {
                tracing::error!(fork, "recording an event: {e}");
                None
            }
        }
    }

    /// `tenant`'s events after `after` (of `fork` alone when given), oldest first.
    pub fn list(&self, tenant: TenantId, after: u64, fork: Option<&str>, limit: usize) -> ApiResult<EventList> {
        let events = self.read(tenant, after, fork, limit.clamp(1, MAX_LIST))?;
        let next_after = events.last().map_or(after, |e| e.id);
        Ok(EventList { events, next_after })
    }

    fn read(&self, tenant: TenantId, after: u64, fork: Option<&str>, limit: usize) -> ApiResult<Vec<EventView>> {
        let filter = EventFilter {
            tenant: Some(tenant),
            after,
            fork: fork.map(String::from),
            limit,
        };
        let stored = self
            .db
            .db
            .events(&filter)
            .map_err(|e| ApiError::new(ErrorKind::Internal, format!("reading events: {e}")))?;
        stored
            .into_iter()
            .map(|s| {
                let body: Body = serde_json::from_str(&s.body).map_err(|e| {
                    ApiError::new(
                        ErrorKind::Internal,
                        format!("event {} of the tenants database is not readable: {e}", s.seq),
                    )
                })?;
                Ok(view(s.seq, s.at_ms, &s.fork, body))
            })
            .collect()
    }

    /// `tenant`'s events after `after` (of `fork` alone when given), as they happen: those
    /// stored first, then the live ones. The stream ends when the receiver is dropped.
    pub fn follow(self: &Arc<Self>, tenant: TenantId, after: u64, fork: Option<String>) -> mpsc::Receiver<EventView> {
        let (tx, rx) = mpsc::channel(16);
        let events = self.clone();
        tokio::spawn(async move {
            let mut last = after;
            loop {
                // Subscribed before reading: whatever is not read yet is in the channel.
                let mut live = events.live.subscribe();
                loop {
                    let page = match events.read(tenant, last, fork.as_deref(), 256) {
                        Ok(page) => page,
                        Err(e) => {
                            tracing::error!("following events: {}", e.message);
                            return;
                        }
                    };
                    let full = page.len() == 256;
                    for event in page {
                        last = event.id;
                        if tx.send(event).await.is_err() {
                            return;
                        }
                    }
                    if !full {
                        break;
                    }
                }
                loop {
                    let next = tokio::select! {
                        next = live.recv() => next,
                        _ = tx.closed() => return,
                    };
                    match next {
                        Ok(sent) => {
                            let (of, event) = &*sent;
                            let mine =
                                *of == tenant && event.id > last && fork.as_ref().is_none_or(|f| *f == event.sandbox);
                            if mine {
                                last = event.id;
                                if tx.send(event.clone()).await.is_err() {
                                    return;
                                }
                            }
                        }
                        // Behind the channel: read the database again from `last`.
                        Err(broadcast::error::RecvError::Lagged(_)) => break,
                        Err(broadcast::error::RecvError::Closed) => return,
                    }
                }
            }
        });
        rx
    }

    /// Forgets events past their retention.
    pub fn prune(&self) {
        let keep = Duration::from_secs(self.settings.keep_days * 24 * 3600);
        let before = tenants::now_ms().saturating_sub(keep.as_millis() as u64);
        match self.db.db.events_prune(before) {
            Ok(0) => {}
            Ok(n) => tracing::info!("forgot {n} events older than {} days", self.settings.keep_days),
            Err(e) => tracing::warn!("forgetting old events: {e}"),
        }
    }

    /// The newest event's id.
    pub fn last_id(&self) -> u64 {
        self.db.db.last_event().unwrap_or(0)
    }

    pub(crate) fn tenancy(&self) -> &Arc<crate::tenancy::Tenancy> {
        &self.db
    }
}

fn view(id: u64, at_ms: u64, fork: &str, body: Body) -> EventView {
    let h = body.happened;
    EventView {
        id,
        at_ms,
        tenant: body.tenant,
        sandbox: fork.to_string(),
        kind: h.kind,
        event: h.event,
        state: h.state,
        cause: h.cause,
        reason: h.reason,
        related: h.related,
        ends_at_ms: h.ends_at_ms,
    }
}

#[cfg(test)]
mod tests;
