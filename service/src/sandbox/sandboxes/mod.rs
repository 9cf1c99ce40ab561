//! Sandboxes: live forks of an environment a client drives itself. Each is an
//! [`engine::session::Session`] without a task, held in the service's one book of open forks
//! (`Service::forks`) beside the sessions: it takes a VM slot (counted with sessions against
//! `serve.max_sessions`) while it has a VM, and goes when it is deleted, idle past its
//! timeout, past its lifetime, when its VM dies, or when the service stops.
//!
//! A command runs without the fork's lock held ([`engine::guest::Guest`]), so a long command
//! never blocks a file read, a second command or a delete (a delete stops the VM, and the
//! command ends with an error); the book counts it as a use, so it never makes the sandbox
//! idle.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use engine::book::{Ending, Kind, Timers};
use engine::guest::{Guest, GuestError};
use engine::idempotency::{Claim, Keys};
use engine::session::Judged;

mod exec;
mod files;
pub mod kept;
pub mod lifetimes;
mod mounts;
mod network;
pub mod processes;
mod reach;
pub mod saved;
mod settings;
mod told;
pub mod usage;

pub use crate::requests::SandboxRequest;
pub use engine::guest::MAX_FILE_BYTES;
pub use exec::{ExecRequest, StreamEvent};
pub use network::NetworkChange;

use super::environments::Environments;
use crate::entries::{Card, Checkpoint, Facts, Open, SandboxFacts};
use crate::error::{ApiError, ApiResult};
use crate::events::{Cause, EventType, ForkState, Happened};
use crate::forks::{Forks, InUse, VmSlot};
use crate::wire::{EnvironmentView, SandboxView};

/// What `GET /v1/sandboxes/{id}` says of a sandbox.
/// A sandbox's card: its owner, its environment and that environment's memory.
fn card(owner: tenants::TenantId, facts: &SandboxFacts) -> Card {
    let environment = &facts.settings.environment;
    Card {
        owner,
        memory_mib: u64::from(environment.spec.memory_mib),
        environment: Some(environment.id.clone()),
        ports: Default::default(),
    }
}

fn view(open: &Open) -> SandboxView {
    let facts = open.sandbox();
    let s = &facts.settings;
    let live = open.run.live().ok();
    SandboxView {
        id: open.id.clone(),
        environment: s.environment.id.clone(),
        state: match (live.is_some(), &facts.resume_failed) {
            (true, _) => "running",
            (false, None) => "paused",
            (false, Some(_)) => "resume_failed",
        }
        .into(),
        cpus: s.environment.spec.cpus,
        memory_mib: s.environment.spec.memory_mib,
        network: s.network_name.clone(),
        workdir: live.map(|l| l.place.workdir.clone()).or_else(|| s.spec.workdir.clone()),
        user: live
            .map(|l| l.place.user.clone())
            .unwrap_or_else(|| s.spec.user.clone()),
        created_at_ms: facts.created_ms,
        expires_at_ms: facts.life_from_ms + s.lifetime.as_millis() as u64,
        idle_timeout_secs: s.idle.as_secs(),
        parent: facts.parent.clone(),
        metadata: s.metadata.clone(),
        checkpoint_at_ms: facts.checkpoint.as_ref().map(|c| c.at_ms),
        workspaces: facts.mounts.iter().map(|m| m.view()).collect(),
        start: live.map(|l| l.fork.start),
    }
}

use crate::error::ErrorKind;
pub use crate::ids::SandboxId;

/// The sandbox API's sandboxes, with the service's limits for them.
pub struct Sandboxes {
    host: Arc<engine::Host>,
    /// Who owns each sandbox.
    tenancy: Arc<crate::tenancy::Tenancy>,
    /// Where every change of a sandbox's state is told.
    events: Arc<crate::events::Events>,
    /// The workspaces sandboxes mount.
    workspaces: Arc<crate::workspaces::Workspaces>,
    forks: Forks,
    /// Their open ports, closed when they go.
    ports: Arc<super::ports::Ports>,
    networks: BTreeMap<String, egress::Policy>,
    /// Which policy a live sandbox may be moved to from which (`serve.sandboxes.tighten`).
    tighten: BTreeMap<String, Vec<String>>,
    idle: Duration,
    lifetime: Duration,
    /// How long a sandbox its timeout paused stays paused.
    paused_retention: Duration,
    /// `OUT/sandboxes/saved`: records and checkpoints ([`saved`]).
    saved_dir: PathBuf,
    /// Idempotency keys of creates, and the sandbox each made.
    keys: Mutex<Keys<String>>,
    /// Idempotency keys of branches and snapshots, and the ids each made.
    made_keys: Mutex<Keys<Vec<String>>>,
    /// What the watch of deaths and timers remembers ([`told`]).
    watch: Mutex<told::Watch>,
    /// `serve.memory_reserve_percent`: commands wait under half of it ([`Sandboxes::room_to_run`]).
    memory_reserve_percent: u64,
}

impl Sandboxes {
    pub fn new(
        host: Arc<engine::Host>,
        events: Arc<crate::events::Events>,
        workspaces: Arc<crate::workspaces::Workspaces>,
        forks: Forks,
        ports: Arc<super::ports::Ports>,
        serve: &crate::ServeSection,
        root: &std::path::Path,
    ) -> anyhow::Result<Sandboxes> {
        let settings = &serve.sandboxes;
        let mut networks = BTreeMap::new();
        for (name, network) in &settings.networks {
            let policy = network
                .policy(&format!("serve.sandboxes.networks.{name}"))
                .map_err(|e| anyhow::anyhow!("serve.sandboxes.networks.{name}: {e:#}"))?;
            networks.insert(name.clone(), policy);
        }
        let saved_dir = root.join("saved");
        std::fs::create_dir_all(&saved_dir)?;
        // Paused sandboxes of a farm before records (they did not outlive their process).
        let _ = std::fs::remove_dir_all(root.join("paused"));
        Ok(Sandboxes {
            host,
            tenancy: events.tenancy().clone(),
            events,
            workspaces,
            forks,
            ports,
            networks,
            tighten: settings.tighten.clone(),
            idle: Duration::from_secs(settings.idle_timeout_secs),
            lifetime: Duration::from_secs(settings.max_lifetime_secs),
            paused_retention: Duration::from_secs(settings.paused_retention_secs),
            saved_dir,
            keys: Mutex::new(Keys::default()),
            made_keys: Mutex::new(Keys::default()),
            watch: Mutex::new(told::Watch::default()),
            memory_reserve_percent: serve.memory_reserve_percent,
        })
    }

    /// Ok unless the host is under half the memory reserve: a command or a process started
    /// may grow its VM, and VMs admitted at the reserve must not grow into the OOM killer
    /// (503 with `Retry-After` until memory comes back).
    pub fn room_to_run(&self) -> ApiResult<()> {
        crate::admission::step_room(self.memory_reserve_percent)
    }

    /// The caller's sandbox `id`; another's, or one that never was, is the same 404.
    pub fn resolve(&self, who: &crate::tenancy::Who, id: &str) -> ApiResult<SandboxId> {
        // A sandbox in the book is its card's; one that went, the tenants database's.
        let owner = self.forks().card(id, Kind::Sandbox).map(|card| card.owner);
        let mine = match owner {
            Some(owner) => owner == who.tenant(),
            None => self.tenancy.owns(who.tenant(), tenants::Kind::Sandbox, id),
        };
        match mine {
            true => Ok(SandboxId::trusted(id)),
            false => Err(crate::tenancy::not_found(tenants::Kind::Sandbox, id)),
        }
    }

    fn new_id(&self) -> String {
        crate::ids::new_id("sb")
    }

    fn seed(&self) -> u64 {
        u64::from_le_bytes(crate::ids::random())
    }

    fn forks(&self) -> std::sync::MutexGuard<'_, engine::book::Book<Open, Card>> {
        self.forks.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A sandbox by id: 404 when there is none, 410 when its VM died.
    fn get(&self, id: &str) -> ApiResult<Arc<tokio::sync::Mutex<Open>>> {
        let forks = self.forks();
        forks.any(id, Kind::Sandbox).map_err(|_| match forks.ending(id) {
            Some(Ending::Died(why)) => ApiError::new(ErrorKind::Gone, format!("sandbox {id} is gone: {why}")),
            _ => ApiError::new(ErrorKind::NotFound, format!("no sandbox {id:?} (it may have expired)")),
        })
    }

    /// A sandbox just made becomes `owner`'s live fork.
    fn add(&self, open: Open, owner: tenants::TenantId, slot: VmSlot) -> SandboxView {
        let answer = view(&open);
        let facts = open.sandbox();
        let card = card(owner, facts);
        let timers = Timers {
            idle: facts.settings.idle,
            lifetime: Some(facts.settings.lifetime),
        };
        let id = open.id.clone();
        let parent = facts.parent.clone();
        // Its first record, before it enters the book (no port is open yet).
        self.save_record_with(&open, &Default::default());
        slot.taken();
        let mut forks = self.forks();
        forks.open(&id, Kind::Sandbox, open, card, timers, Instant::now());
        engine::metrics::get()
            .sandboxes
            .set(forks.all(Kind::Sandbox).len() as i64);
        drop(forks);
        let mut created = Happened::sandbox(EventType::Created, ForkState::Running);
        if let Some(parent) = parent {
            created = created.related(parent);
        }
        self.events.emit(owner, &id, created);
        answer
    }

    /// `POST /v1/sandboxes`. With an idempotency key, a retry answers with the sandbox the
    /// first request made.
    pub(crate) async fn create(
        &self,
        environments: &Environments,
        request: SandboxRequest,
        owner: tenants::TenantId,
        key: Option<(String, String)>,
        slot: impl FnOnce() -> ApiResult<VmSlot>,
    ) -> ApiResult<(SandboxView, bool)> {
        if let Some((key, digest)) = &key {
            let claim = self.keys.lock().unwrap_or_else(|p| p.into_inner()).claim(key, digest);
            match claim.map_err(ApiError::from)? {
                Claim::Answered(id) => return Ok((self.view(&SandboxId::trusted(&id)).await?, false)),
                Claim::Claimed => {}
            }
        }
        let made = self.make(environments, &request, owner, slot).await;
        if let Some((key, digest)) = key {
            let id = made.as_ref().ok().map(|v| v.id.clone());
            self.keys
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .settle(&key, &digest, id);
        }
        made.map(|view| (view, true))
    }

    async fn make(
        &self,
        environments: &Environments,
        request: &SandboxRequest,
        owner: tenants::TenantId,
        slot: impl FnOnce() -> ApiResult<VmSlot>,
    ) -> ApiResult<SandboxView> {
        let settings = self.settings_of(environments, request)?;
        let id = self.new_id();
        // The workspaces' holds before anything forks: a conflict takes no slot and no VM.
        let claimed = self.claim_workspaces(owner, &id, &request.workspaces)?;
        let slot = slot()?;
        let pool = environments.pool(&settings.environment, &settings.ready).await;
        let run = self
            .host
            .open_sandbox(
                &settings.ready.snapshot,
                &settings.ready.image,
                &settings.spec,
                self.seed(),
                pool.map(|p| (p, pools_owner(owner))),
            )
            .await
            .map_err(|e| ApiError::new(ErrorKind::Internal, format!("starting the sandbox: {}", e.describe())))?;
        let mut run = run;
        if let Err(e) = self.mount(&run, &claimed).await {
            run.close();
            return Err(e);
        }
        tracing::info!(sandbox = %id, environment = %settings.environment.id, "sandbox created");
        let mut facts = SandboxFacts::new(settings, None);
        facts.mounts = claimed.keep();
        let open = Open {
            id,
            run,
            facts: Facts::Sandbox(Box::new(facts)),
        };
        Ok(self.add(open, owner, slot))
    }

    pub async fn view(&self, id: &SandboxId) -> ApiResult<SandboxView> {
        Ok(view(&*self.get(id)?.lock().await))
    }

    /// `DELETE /v1/sandboxes/{id}`: its VM stops now (a command running in it ends with an
    /// error).
    pub async fn delete(&self, id: &SandboxId, why: &str) -> ApiResult<()> {
        // What it wrote to the workspaces it holds is kept first, if it can be.
        let mut why = why.to_string();
        if self.holds_workspaces(id).await {
            if let Err(e) = self.sync_workspaces(id).await {
                tracing::warn!(sandbox = %id, "its workspaces were not synced at its delete: {}", e.message);
                why = format!("{why}; its workspaces were not synced: {}", e.message);
            }
        }
        self.end(id, Ending::Ended(why), Cause::Deleted)
            .await
            .ok_or_else(|| ApiError::new(ErrorKind::NotFound, format!("no sandbox {id:?}")))
    }

    /// Takes a sandbox out of the book, as `ending` says (`cause`: why, as its owner is told),
    /// and stops its VM; None when it was not there.
    async fn end(&self, id: &str, ending: Ending, cause: Cause) -> Option<()> {
        self.forks().endable(id, Kind::Sandbox).ok()?;
        let owner = self.owner_of(id);
        let (why, event) = match &ending {
            Ending::Ended(why) => (why.clone(), EventType::Ended),
            Ending::Died(why) => (why.clone(), EventType::Died),
        };
        let reusable = matches!(ending, Ending::Ended(_));
        let removed = self.forks().remove(id, ending)?;
        let ended = Happened::sandbox(event, ForkState::Ended).cause(cause).reason(&why);
        if let Some(owner) = owner {
            self.events.emit(owner, id, ended);
        }
        // Its record goes once no change holds its lock (none writes it again: it left the
        // book).
        let mut removed = removed.lock().await;
        self.forget_record(id);
        // A VM that did not die goes back to its environment's pool, to be reset for the
        // next sandbox (a paused or branched one's VM is not the environment's: it goes).
        match removed.run.close_reusing() {
            Some(fork) if reusable => match owner {
                Some(owner) => removed
                    .sandbox()
                    .settings
                    .environment
                    .give_back(fork, pools_owner(owner)),
                None => drop(fork),
            },
            _ => {}
        }
        self.release_workspaces(id, &removed.sandbox().mounts);
        tracing::info!(sandbox = %id, "sandbox removed: {why}");
        engine::metrics::get()
            .sandboxes
            .set(self.forks().all(Kind::Sandbox).len() as i64);
        Some(())
    }

    /// The guest of a running sandbox, used without holding its lock.
    async fn guest(&self, id: &str) -> ApiResult<Guest> {
        let sandbox = self.get(id)?;
        let sandbox = sandbox.lock().await;
        sandbox
            .run
            .guest()
            .map_err(|_| ApiError::new(ErrorKind::Conflict, format!("sandbox {id} is paused: resume it first")))
    }

    /// A failure of `guest` (taken from sandbox `id`) as the client sees it. Only a VM that
    /// went takes its sandbox with it (502; later requests for it get 410 with why): a
    /// request cut by a reset, a pause, a branch or a snapshot is a 409 saying so, and one
    /// the guest left unanswered a 504, and the sandbox lives. One deleted while the request
    /// ran is 410. `path`: the request names a guest path (a missing one is 404).
    async fn guest_error(&self, id: &str, guest: &Guest, e: GuestError, path: Option<&str>) -> ApiError {
        let removed = || {
            ApiError::new(
                ErrorKind::Gone,
                format!("sandbox {id} was removed while the request ran"),
            )
        };
        let judged = match self.get(id) {
            Ok(sandbox) => sandbox.lock().await.run.judge(guest, e),
            Err(_) => return removed(),
        };
        let e = match judged {
            Judged::Changed(change, state) => {
                let now = match state {
                    engine::session::SessionState::Live => "running",
                    engine::session::SessionState::Paused => "paused",
                    engine::session::SessionState::Ended => "ended",
                };
                return ApiError::new(
                    ErrorKind::Conflict,
                    format!(
                        "sandbox {id} was {} while the request ran, which cut it short; the sandbox is {now}",
                        change.done()
                    ),
                );
            }
            Judged::Died(why) => {
                // Its QEMU's own end says more than the channel that closed with it (given a
                // moment to be reaped).
                let mut gone = None;
                for _ in 0..20 {
                    gone = match self.get(id) {
                        Ok(sandbox) => sandbox.lock().await.run.vm_gone(),
                        Err(_) => None,
                    };
                    if gone.is_some() {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                let (cause, why) = match gone {
                    Some(gone) => told::death(&gone, false),
                    None => (Cause::AgentLost, format!("its VM died: {why}")),
                };
                return match self.end(id, Ending::Died(why.clone()), cause).await {
                    Some(()) => ApiError::new(ErrorKind::GuestFailed, format!("sandbox {id} {why}; it is removed")),
                    None => removed(),
                };
            }
            Judged::Failed(e) => e,
        };
        match (e, path) {
            (GuestError::Unanswered(why), _) => ApiError::new(
                ErrorKind::GuestTimeout,
                format!("sandbox {id}'s guest did not answer in time: {why}; the sandbox goes on"),
            ),
            (GuestError::Broken(why), _) => ApiError::new(
                ErrorKind::GuestFailed,
                format!("sandbox {id}'s guest failed the request: {why}; the sandbox goes on"),
            ),
            (GuestError::Missing(m), Some(path)) => {
                ApiError::field(ErrorKind::NotFound, "path", format!("{path}: {m}"))
            }
            (GuestError::TooLarge(m), _) => ApiError::field(ErrorKind::TooLarge, "path", m),
            (GuestError::Failed(m), Some(_)) => ApiError::field(ErrorKind::Invalid, "path", m),
            (e, Some(path)) => ApiError::field(ErrorKind::Invalid, "path", format!("{path}: {e}")),
            (e, None) => ApiError::new(ErrorKind::Invalid, e.to_string()),
        }
    }

    /// `POST /v1/sandboxes/{id}/branch`: a new sandbox that continues from this one's state.
    pub(crate) async fn branch(&self, id: &str, slot: impl FnOnce() -> ApiResult<VmSlot>) -> ApiResult<SandboxView> {
        let sandbox = self.get(id)?;
        let sandbox = sandbox.lock().await;
        sandbox
            .run
            .live()
            .map_err(|_| ApiError::new(ErrorKind::Conflict, format!("sandbox {id} is paused: resume it first")))?;
        let slot = slot()?;
        // A branch is its parent's owner's.
        let owner = self
            .forks()
            .card(id, Kind::Sandbox)
            .map(|card| card.owner)
            .ok_or_else(|| ApiError::new(ErrorKind::NotFound, format!("no sandbox {id:?} (it may have expired)")))?;
        let run = sandbox
            .run
            .branch(&self.host.store, self.seed(), None)
            .await
            .map_err(|e| {
                ApiError::new(
                    ErrorKind::Internal,
                    format!("branching sandbox {id}: {}", engine::describe(&e)),
                )
            })?;
        let child_id = self.new_id();
        tracing::info!(sandbox = %child_id, parent = %id, "sandbox branched");
        let mut facts = SandboxFacts::new(sandbox.sandbox().settings.clone(), Some(id.to_string()));
        facts.mounts = sandbox.sandbox().mounts.iter().map(|m| m.for_branch()).collect();
        drop(sandbox);
        let open = Open {
            id: child_id.clone(),
            run,
            facts: Facts::Sandbox(Box::new(facts)),
        };
        let child = self.add(open, owner, slot);
        let branched = Happened::sandbox(EventType::Branched, ForkState::Running).related(child_id);
        self.events.emit(owner, id, branched);
        Ok(child)
    }

    /// `POST /v1/sandboxes/{id}/pause`: saved to disk, its VM stopped, its slot given back.
    pub(crate) async fn pause(&self, id: &str) -> ApiResult<SandboxView> {
        let sandbox = self.get(id)?;
        let mut sandbox = sandbox.lock().await;
        // Its VM's last reading, before the VM goes.
        let reading = sandbox.run.usage();
        sandbox.sandbox_mut().spent.observe(reading);
        let dir = self.checkpoint_dir(&sandbox.id);
        let pending = sandbox.run.pause(&dir).await.map_err(|e| match e {
            engine::session::SessionPauseError::Refused(_) => {
                ApiError::new(ErrorKind::Conflict, format!("sandbox {id} is paused already"))
            }
            e => ApiError::new(
                ErrorKind::Internal,
                format!("pausing sandbox {id}: {}", engine::describe(&e)),
            ),
        })?;
        pending.commit();
        self.forks().pause(id);
        let fork = sandbox.run.paused().expect("just paused").clone();
        sandbox.sandbox_mut().checkpoint = Some(Checkpoint {
            fork,
            at_ms: engine::row::now_ms() as u64,
        });
        self.save_record(&sandbox);
        self.tell(id, Happened::sandbox(EventType::Paused, ForkState::Paused));
        Ok(view(&sandbox))
    }

    /// Whether its timeout paused it and it waits for a call to resume it.
    pub async fn auto_paused(&self, id: &SandboxId) -> bool {
        let Ok(sandbox) = self.get(id) else { return false };
        let open = sandbox.lock().await;
        open.run.paused().is_some() && open.sandbox().auto_paused_ms.is_some() && open.sandbox().resume_failed.is_none()
    }

    /// `POST /v1/sandboxes/{id}/snapshot`: a new environment of this sandbox's state.
    pub(crate) async fn snapshot(&self, environments: &Environments, id: &str) -> ApiResult<EnvironmentView> {
        let sandbox = self.get(id)?;
        let sandbox = sandbox.lock().await;
        let live = sandbox
            .run
            .live()
            .map_err(|_| ApiError::new(ErrorKind::Conflict, format!("sandbox {id} is paused: resume it first")))?;
        let snapshot = sandbox.run.snapshot_into_environment().await.map_err(|e| match e {
            engine::sandbox::SnapshotSandboxError::Resumed => ApiError::new(ErrorKind::Conflict, e.to_string()),
            other => ApiError::new(
                ErrorKind::Internal,
                format!("snapshotting sandbox {id}: {}", other.describe()),
            ),
        })?;
        let settings = &sandbox.sandbox().settings;
        let env = environments.add_snapshot(
            id,
            &settings.environment,
            snapshot,
            live.origin().cloned(),
            settings.ready.image.clone(),
        )?;
        Ok(env.view())
    }

    /// The ids of the sandboxes in the book.
    pub fn ids(&self) -> std::collections::HashSet<String> {
        self.forks().all(Kind::Sandbox).into_iter().map(|(id, _)| id).collect()
    }

    /// Marks a sandbox in use until the guard drops (then used last at that moment).
    fn begin(&self, id: &str) -> InUse {
        InUse::begin(&self.forks, id)
    }
}

/// A tenant as an environment pool's owner of the VMs it gives back.
fn pools_owner(tenant: tenants::TenantId) -> u64 {
    tenant.0 as u64
}
