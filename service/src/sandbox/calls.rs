//! The sandbox calls that make forks or change what a tenant holds, as the service takes them
//! from a caller: each is held to the caller's grants and quotas on its typed request before
//! anything forks, and what it makes is the caller's before it answers. (Calls that only use
//! a sandbox take a [`SandboxId`], which [`Sandboxes::resolve`] holds to its owner.)
//!
//! [`Sandboxes::resolve`]: super::Sandboxes::resolve

use tenants::Kind;

use super::sandboxes::kept::Keep;
use super::sandboxes::lifetimes::BranchRequest;
use super::sandboxes::{SandboxId, SandboxRequest};
use super::SandboxApi;
use crate::error::ErrorKind;
use crate::error::{ApiError, ApiResult};
use crate::state::Service;
use crate::tenancy::usage::Pending;
use crate::tenancy::Who;
use crate::wire::{EnvironmentView, SandboxBranched, SandboxList, SandboxView};

/// Branches one call may ask for, as a quota counts them (past it, the call's own bound
/// refuses it).
const MAX_COUNTED_BRANCHES: u64 = 64;

impl Service {
    /// The sandbox API, or a 404 when it is off.
    pub fn sandbox_api(&self) -> ApiResult<&SandboxApi> {
        self.sandbox.as_ref().ok_or_else(|| {
            ApiError::new(
                ErrorKind::NotFound,
                "the sandbox API is off here (serve.sandboxes.enabled = false)",
            )
        })
    }

    /// `POST /v1/sandboxes`: its environment must be the caller's (and look built to it), its
    /// network policy granted to it, and the new VM within its quotas. With an idempotency key
    /// (`key`: the key and the body's digest), a retry answers with the sandbox the first
    /// request made, and `false`.
    pub async fn create_sandbox(
        &self,
        who: &Who,
        request: SandboxRequest,
        key: Option<(String, String)>,
    ) -> ApiResult<(SandboxView, bool)> {
        let api = self.sandbox_api()?;
        let _held = self.admit_sandbox(who, &request).await?;
        let (view, made) = api
            .sandboxes
            .create(&api.environments, request, who.tenant(), key, || self.vm_slot())
            .await?;
        if made {
            self.own_sandboxes(who, std::slice::from_ref(&view))?;
        }
        Ok((view, made))
    }

    /// `POST /v1/sandboxes/{id}/branch`: one branch, or `count` of them (all or none), each
    /// within the caller's quotas.
    pub async fn branch_sandbox(
        &self,
        who: &Who,
        id: &SandboxId,
        request: BranchRequest,
        key: Option<(String, String)>,
    ) -> ApiResult<(SandboxBranched, bool)> {
        let api = self.sandbox_api()?;
        let sandboxes = &api.sandboxes;
        let count = request.count.unwrap_or(1).clamp(1, MAX_COUNTED_BRANCHES);
        let _held = self.admit_forks(who, count, self.sandbox_mib(id).await).await?;
        let make = async {
            match request.count {
                None => Ok(vec![sandboxes.branch(id, || self.vm_slot()).await?.id]),
                Some(count) => Ok(sandboxes
                    .branch_many(id, count, || self.vm_slot())
                    .await?
                    .sandboxes
                    .into_iter()
                    .map(|s| s.id)
                    .collect()),
            }
        };
        let (ids, made) = sandboxes.once(&format!("branch {id}"), key, make).await?;
        let mut views = Vec::new();
        for child in &ids {
            views.push(sandboxes.view(&SandboxId::trusted(child)).await?);
        }
        if made {
            self.own_sandboxes(who, &views)?;
        }
        let answer = match (request.count, views.pop()) {
            (None, Some(view)) if views.is_empty() => SandboxBranched::One(Box::new(view)),
            (_, last) => SandboxBranched::Many(SandboxList {
                sandboxes: views.into_iter().chain(last).collect(),
            }),
        };
        Ok((answer, made))
    }

    /// `POST /v1/sandboxes/{id}/pause`: within the caller's disk.
    pub async fn pause_sandbox(&self, who: &Who, id: &SandboxId) -> ApiResult<SandboxView> {
        let api = self.sandbox_api()?;
        self.check_disk(who)?;
        api.sandboxes.pause(id).await
    }

    /// `POST /v1/sandboxes/{id}/checkpoint`: within the caller's disk.
    pub async fn checkpoint_sandbox(&self, who: &Who, id: &SandboxId) -> ApiResult<SandboxView> {
        let api = self.sandbox_api()?;
        self.check_disk(who)?;
        api.sandboxes.checkpoint(id).await
    }

    /// `POST /v1/sandboxes/{id}/resume`: its VM within the caller's quotas, handed back once
    /// it has what `keep` names (else what its create request's `keep` does).
    pub async fn resume_sandbox(&self, who: &Who, id: &SandboxId, keep: Option<Keep>) -> ApiResult<SandboxView> {
        let api = self.sandbox_api()?;
        if let Some(keep) = &keep {
            keep.check("keep")?;
        }
        let _held = self.admit_forks(who, 1, self.sandbox_mib(id).await).await?;
        api.sandboxes.resume(id, keep, || self.vm_slot()).await
    }

    /// Resumes a sandbox its timeout paused (`on_timeout = "pause"`) for a call that uses
    /// it, within the caller's quotas; nothing for any other sandbox.
    pub async fn wake_sandbox(&self, who: &Who, id: &SandboxId) -> ApiResult<()> {
        let api = self.sandbox_api()?;
        if api.sandboxes.auto_paused(id).await {
            tracing::info!(sandbox = %id, "a call on it resumes it (its timeout paused it)");
            if let Err(e) = self.resume_sandbox(who, id, None).await {
                // Another call woke it first: it runs, as this call wants.
                let running = api.sandboxes.view(id).await.is_ok_and(|v| v.state == "running");
                if !(e.kind == ErrorKind::Conflict && running) {
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// `POST /v1/sandboxes/{id}/snapshot`: a new environment, the caller's, within its disk.
    pub async fn snapshot_sandbox(
        &self,
        who: &Who,
        id: &SandboxId,
        key: Option<(String, String)>,
    ) -> ApiResult<(EnvironmentView, bool)> {
        let api = self.sandbox_api()?;
        self.check_disk(who)?;
        let make = async { Ok(vec![api.sandboxes.snapshot(&api.environments, id).await?.id]) };
        let (ids, made) = api.sandboxes.once(&format!("snapshot {id}"), key, make).await?;
        if made {
            self.tenancy.own(who.tenant(), Kind::Environment, &ids)?;
        }
        Ok((api.environments.get(&ids[0], "environment")?.view(), made))
    }

    /// Holds a new sandbox against the caller's quotas once its request passes: the
    /// environment is the caller's and looks built to it, the network policy is granted.
    async fn admit_sandbox(&self, who: &Who, request: &SandboxRequest) -> ApiResult<Pending> {
        let env = request.environment.as_str();
        let owners = self.tenancy.owners.of(Kind::Environment, env);
        match owners.iter().find(|o| o.tenant == who.tenant()) {
            None => {
                return Err(ApiError::field(
                    ErrorKind::NotFound,
                    "environment",
                    format!("no environment {env:?}"),
                ));
            }
            Some(owner) if !self.looks_built(env, owner) => {
                return Err(ApiError::field(
                    ErrorKind::Conflict,
                    "environment",
                    format!("environment {env} is still building (GET /v1/environments/{env}/logs)"),
                ));
            }
            Some(_) => {}
        }
        if let Some(network) = &request.network {
            if !who.profile.may_use_network(network) {
                let granted: Vec<&str> = who.profile.grants.iter().map(String::as_str).collect();
                return Err(ApiError::field(
                    ErrorKind::Invalid,
                    "network",
                    format!(
                        "no network policy {network:?} is granted to tenant {} (granted: {}; farm tenant grant)",
                        who.profile.tenant.name,
                        if granted.is_empty() {
                            "none".to_string()
                        } else {
                            granted.join(", ")
                        }
                    ),
                ));
            }
        }
        let mib = request.memory_mib.or_else(|| {
            let found = self.sandbox_api().ok()?.environments.get(env, "environment").ok()?;
            Some(u64::from(found.view().memory_mib))
        });
        self.admit_forks(who, 1, mib.unwrap_or(512)).await
    }

    /// Records sandboxes just made as the caller's in the tenants database (their cards
    /// say so already).
    fn own_sandboxes(&self, who: &Who, views: &[SandboxView]) -> ApiResult<()> {
        let ids: Vec<String> = views.iter().map(|v| v.id.clone()).collect();
        self.tenancy.own(who.tenant(), Kind::Sandbox, &ids)
    }

    /// The guest memory of a sandbox, as made (0: it is not in the book).
    async fn sandbox_mib(&self, id: &SandboxId) -> u64 {
        let forks = self.forks();
        forks
            .card(id, engine::book::Kind::Sandbox)
            .map_or(0, |card| card.memory_mib)
    }

    /// Whether `owner` may see environment `env` as what it is now ([`tenants::Owner::sees_built`]).
    pub fn looks_built(&self, env: &str, owner: &tenants::Owner) -> bool {
        let found = self
            .sandbox
            .as_ref()
            .and_then(|api| api.environments.get(env, "id").ok());
        let building = found.as_ref().is_none_or(|e| e.is_building());
        let took = found
            .and_then(|e| e.built_in_ms())
            .or_else(|| self.tenancy.db.build_ms(env).ok().flatten());
        owner.sees_built(tenants::now_ms(), took, building)
    }
}
