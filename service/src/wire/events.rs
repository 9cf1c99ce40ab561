//! Lifecycle events of sandboxes and sessions, and tenants' webhooks.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// What happened to a fork.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum EventType {
    /// Made (a new fork of its environment, or a branch: `related` names its parent).
    Created,
    /// Saved to disk and its VM stopped.
    Paused,
    /// Running again from its pause.
    Resumed,
    /// A resume's checks failed: it is held back, not running (`reason` says what was missing).
    ResumeFailed,
    /// Put back to its environment's snapshot.
    Reset,
    /// A branch was made of it (`related` names the branch).
    Branched,
    /// Taken up again by a new process of the service, paused (`reason` says from what state).
    Restored,
    /// It ends at `ends_at_ms` unless it is used (idle) or its timers move (lifetime).
    TimeoutWarning,
    /// Ended as asked or as its timers said (`cause`).
    Ended,
    /// Gone without being asked to (`cause`, `reason`).
    Died,
}

/// The state a fork is in after an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ForkState {
    Running,
    Paused,
    ResumeFailed,
    Ended,
}

/// Why a fork ended, died, paused, or is about to end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Cause {
    /// Its owner asked (DELETE, a session's end).
    Deleted,
    /// A session was submitted (scored), or its task ended it.
    Submitted,
    /// Unused past its idle timeout.
    IdleTimeout,
    /// Past its lifetime.
    Lifetime,
    /// Its owner's key was revoked.
    Revoked,
    /// The service stopped (a graceful stop pauses what runs; `Restored` follows at start).
    ServiceStop,
    /// The service's process went without a graceful stop (`kill -9`, a crash, the host).
    ServiceRestart,
    /// Its QEMU exited on its own.
    QemuExited,
    /// Its QEMU was killed by a signal (not the host's out-of-memory killer).
    QemuKilled,
    /// The host's out-of-memory killer took its QEMU.
    OutOfMemory,
    /// Its disk grew past its limit.
    DiskLimit,
    /// Its guest stopped answering farm's agent (the channel closed or pings were missed).
    AgentLost,
}

/// The fork an event is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ForkKind {
    Sandbox,
    Session,
}

/// One lifecycle event. `id`s only grow: a stream resumes after the last one it saw.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct EventView {
    pub id: u64,
    /// Unix milliseconds.
    pub at_ms: u64,
    /// The tenant whose fork it is.
    pub tenant: String,
    /// The sandbox's or session's id.
    pub sandbox: String,
    pub kind: ForkKind,
    #[serde(rename = "type")]
    pub event: EventType,
    /// Its state after the event.
    pub state: ForkState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause: Option<Cause>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// A branch's parent (`created`) or the branch made (`branched`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub related: Option<String>,
    /// When it ends (`timeout_warning`), Unix milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ends_at_ms: Option<u64>,
}

/// `GET /v1/events`: the caller's events after a cursor, oldest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct EventList {
    pub events: Vec<EventView>,
    /// The cursor of the next page (`?after=`): the last id here, or the one asked for.
    pub next_after: u64,
}

/// A webhook as its tenant sees it (its secret only in the answer that made it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct WebhookView {
    pub id: String,
    pub url: String,
    pub created_at_ms: u64,
    /// The last event id it answered with success.
    pub delivered: u64,
    /// Failed deliveries in a row (each retried with backoff).
    pub failures: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// Hex; every delivery carries `farm-signature: sha256=HMAC-SHA256(secret, "{farm-timestamp}.{body}")`.
    /// Shown once, when the webhook is made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
}

/// `GET /v1/webhooks`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct WebhookList {
    pub webhooks: Vec<WebhookView>,
}

/// `GET /v1/sandboxes/{id}/metrics`: what a sandbox uses now and has used, as the host
/// measures its VMs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct SandboxMetrics {
    pub sandbox: String,
    /// `running` or `paused`.
    pub state: String,
    /// Its VM now (absent while paused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub now: Option<UsageNow>,
    /// Over its life in this process of the service: every VM it has had.
    pub life: UsageLife,
}

/// A sandbox's VM now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct UsageNow {
    /// CPU time its QEMU has used since it started.
    pub cpu_seconds: f64,
    /// Its QEMU's resident memory.
    pub memory_bytes: u64,
    /// Of which only it holds and has written.
    pub private_dirty_bytes: u64,
    /// Its disk's writes since its snapshot (allocated bytes of its overlay).
    pub disk_bytes: u64,
    /// Through farm's network port, out of the guest and into it.
    pub network_bytes_out: u64,
    pub network_bytes_in: u64,
}

/// A sandbox's use summed over its VMs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct UsageLife {
    pub cpu_seconds: f64,
    pub network_bytes_out: u64,
    pub network_bytes_in: u64,
    /// The most memory and disk a reading saw.
    pub peak_memory_bytes: u64,
    pub peak_disk_bytes: u64,
}
