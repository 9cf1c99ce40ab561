//! Environments and build contexts as a tenant calls for them: its own only, and each as a
//! build of its own. Environments are content-addressed, so a tenant could compute another's
//! id anyway; what must not show is whether another tenant asked for the same content. A
//! tenant asking for content another had built sees what a build of its own gives: 202,
//! `building`, its own time of asking, its own sandboxes, and `building` (with log lines in
//! proportion to the time since it asked) until the recorded time of the real build has
//! passed. A `force` rebuild happens only for content nobody else asked for; for a caller
//! that shares it, it is the look of a rebuild. Deleting a shared environment gives up the
//! caller's share only, with the refusals its own would give.

use std::time::Duration;

use tenants::{Kind, Owner, UNKNOWN_BUILD_MS};

use super::contexts::Uploaded;
use super::environments::EnvironmentRequest;
use crate::error::ErrorKind;
use crate::error::{ApiError, ApiResult};
use crate::state::Service;
use crate::tenancy::usage::{today, BuildSlot};
use crate::tenancy::{not_found, Who};
use crate::wire::{Deleted, EnvironmentList, EnvironmentView, LogPage};

/// An environment id its caller asked for: made only by [`Service::resolve_environment`],
/// with the caller's own record of it (when it asked).
#[derive(Debug, Clone)]
pub struct EnvironmentId {
    id: String,
    owner: Owner,
}

impl std::ops::Deref for EnvironmentId {
    type Target = str;
    fn deref(&self) -> &str {
        &self.id
    }
}

impl Service {
    /// The caller's environment `id`; another's, or one that never was, is the same 404.
    pub fn resolve_environment(&self, who: &Who, id: &str) -> ApiResult<EnvironmentId> {
        let owner = self
            .tenancy
            .owners
            .owner(Kind::Environment, id, who.tenant())
            .ok_or_else(|| not_found(Kind::Environment, id))?;
        Ok(EnvironmentId {
            id: id.to_string(),
            owner,
        })
    }

    /// `GET /v1/environments/{id}`.
    pub fn environment_view(&self, who: &Who, id: &EnvironmentId) -> ApiResult<EnvironmentView> {
        let mut view = self.sandbox_api()?.environments.get(id, "id")?.view();
        self.as_own(who, &id.owner, &mut view);
        Ok(view)
    }

    /// `GET /v1/environments`: the caller's, each as its own.
    pub fn environments(&self, who: &Who) -> ApiResult<EnvironmentList> {
        let mut environments = self.sandbox_api()?.environments.list();
        environments.retain_mut(
            |view| match self.tenancy.owners.owner(Kind::Environment, &view.id, who.tenant()) {
                Some(owner) => {
                    self.as_own(who, &owner, view);
                    true
                }
                None => false,
            },
        );
        Ok(EnvironmentList { environments })
    }

    /// `GET /v1/environments/{id}/logs`: while it does not look built to the caller, the
    /// lines a build of its own would have printed by now.
    pub async fn environment_logs(&self, id: &EnvironmentId, offset: usize, wait: Duration) -> ApiResult<LogPage> {
        let mut page = self.sandbox_api()?.environments.logs(id, offset, wait).await?;
        if !self.looks_built(id, &id.owner) {
            let shown = self.lines_shown(id, &id.owner);
            let from = page.next.saturating_sub(page.lines.len());
            let keep = shown.saturating_sub(from).min(page.lines.len());
            page.lines.truncate(keep);
            page.next = from + keep;
            page.state = "building".into();
            page.error = None;
        }
        Ok(page)
    }

    /// `DELETE /v1/environments/{id}`: an environment others asked for too gives up the
    /// caller's share only, refused as the caller's own would be (while it looks to be
    /// building, while the caller has live sandboxes of it).
    pub fn delete_environment(&self, who: &Who, id: &EnvironmentId) -> ApiResult<Deleted> {
        let api = self.sandbox_api()?;
        let tenancy = &self.tenancy;
        if tenancy.owners.of(Kind::Environment, id).len() > 1 {
            if !self.looks_built(id, &id.owner) {
                return Err(ApiError::new(
                    ErrorKind::Conflict,
                    format!("environment {} is still building", &**id),
                ));
            }
            let live = self.own_live_sandboxes_of(who, id);
            if live > 0 {
                return Err(ApiError::new(
                    ErrorKind::Conflict,
                    format!("environment {} has {live} live sandboxes: delete them first", &**id),
                ));
            }
            tenancy
                .owners
                .disown(&tenancy.db, Kind::Environment, id, who.tenant())?;
        } else {
            api.environments.delete(id)?;
            let _ = tenancy.owners.disown(&tenancy.db, Kind::Environment, id, who.tenant());
        }
        Ok(Deleted {
            id: id.to_string(),
            deleted: true,
        })
    }

    /// `POST /v1/contexts`: an uploaded build context, the caller's.
    pub async fn upload_context(&self, who: &Who, archive: Vec<u8>) -> ApiResult<Uploaded> {
        let uploaded = self.sandbox_api()?.environments.contexts.upload(archive).await?;
        self.tenancy
            .own(who.tenant(), Kind::Context, std::slice::from_ref(&uploaded.context))?;
        Ok(uploaded)
    }

    /// `POST /v1/environments`: an environment of the caller's, its build counted against the
    /// caller's build minutes and disk. Its context must be the caller's upload. Whether the
    /// answer is a 202 (building, as the caller sees it) comes with it.
    pub fn create_environment(&self, who: &Who, mut request: EnvironmentRequest) -> ApiResult<(EnvironmentView, bool)> {
        let api = self.sandbox_api()?;
        if let Some(context) = request.dockerfile.as_ref().map(|d| d.context.as_str()) {
            if !self.tenancy.owns(who.tenant(), Kind::Context, context) {
                return Err(ApiError::field(
                    ErrorKind::NotFound,
                    "dockerfile.context",
                    format!("no uploaded context {context:?} (POST the tar archive to /v1/contexts first)"),
                ));
            }
        }
        let build = self.admit_build(who)?;
        self.check_disk(who)?;
        let rebuilt = self.unforce(who, &mut request);
        self.check_admitting()?;
        let (env, started) = api.environments.create(request)?;
        let mut view = env.view();
        let mut accepted = started || view.state == "building";
        let id = view.id.clone();
        let owners = self.tenancy.owners.of(Kind::Environment, &id);
        let new_here = !owners.iter().any(|o| o.tenant == who.tenant());
        // Content another tenant asked for first: to this caller, a build of its own.
        let joined = new_here && !owners.is_empty();
        if new_here {
            // The first to ask sees its build as it goes; a later asker, as a build of its own.
            let now = tenants::now_ms();
            let tenancy = &self.tenancy;
            let visible_ms = if joined { 0 } else { now };
            let ids = std::slice::from_ref(&id);
            tenancy
                .owners
                .own(&tenancy.db, Kind::Environment, ids, who.tenant(), now, visible_ms)?;
        }
        if new_here || accepted || rebuilt {
            // A build started, joined or shown: its minutes are the caller's.
            self.charge_build(who, &id, build);
        }
        let owner = self.resolve_environment(who, &id)?.owner;
        self.as_own(who, &owner, &mut view);
        if joined || rebuilt {
            // Asked for (or rebuilt) just now: a build of its own would not have ended yet.
            hide_build(&mut view);
            accepted = true;
        }
        Ok((view, accepted))
    }

    /// `force` on content another tenant asked for too: a rebuild would change what they use,
    /// so the request goes on without it, and a caller that owned the environment sees it
    /// built again after a build's time (its share is renewed). True: it was turned so.
    fn unforce(&self, who: &Who, request: &mut EnvironmentRequest) -> bool {
        if !request.force {
            return false;
        }
        let Ok(api) = self.sandbox_api() else { return false };
        let Some(id) = api.environments.id_of(request) else {
            return false;
        };
        let tenancy = &self.tenancy;
        let owners = tenancy.owners.of(Kind::Environment, &id);
        let exists = api.environments.get(&id, "id").is_ok();
        let sole = owners.len() == 1 && owners[0].tenant == who.tenant();
        if sole || (owners.is_empty() && !exists) {
            return false;
        }
        request.force = false;
        let renewed = owners.iter().any(|o| o.tenant == who.tenant());
        if renewed {
            if let Err(e) = tenancy
                .owners
                .renew(&tenancy.db, Kind::Environment, &id, who.tenant(), tenants::now_ms())
            {
                tracing::error!("renewing an environment's owner: {e}");
            }
        }
        renewed
    }

    /// Charges the caller's build minutes for an environment it asked for: the build's time
    /// once it ends (or the recorded time of the build another tenant ran). `slot` is held
    /// against the minutes until then.
    fn charge_build(&self, who: &Who, id: &str, slot: BuildSlot) {
        let Ok(api) = self.sandbox_api() else { return };
        let environments = api.environments.clone();
        let tenancy = self.tenancy.clone();
        let (tenant, id) = (who.tenant(), id.to_string());
        tokio::spawn(async move {
            let _slot = slot;
            loop {
                let Ok(env) = environments.get(&id, "id") else { return };
                if !env.is_building() {
                    // This process's build time when it built it, else the one recorded before.
                    let ms = match env.built_in_ms() {
                        Some(ms) => {
                            let _ = tenancy.db.set_build_ms(&id, ms);
                            ms
                        }
                        None => tenancy.db.build_ms(&id).ok().flatten().unwrap_or(UNKNOWN_BUILD_MS),
                    };
                    let _ = tenancy.db.add_build_seconds(tenant, today().0, ms as f64 / 1000.0);
                    return;
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        });
    }

    /// An environment's view as `owner` sees it: its own time of asking, its own sandboxes,
    /// and, until a build of its own would have ended, building.
    fn as_own(&self, who: &Who, owner: &Owner, view: &mut EnvironmentView) {
        let own_sandboxes = self.own_live_sandboxes_of(who, &view.id);
        view.created_at_ms = owner.since_ms;
        view.sandboxes = own_sandboxes;
        // The pool is shared by every tenant of the same content: how warm it is, and what
        // it did, tell of the others' sandboxes, so only the operator (the default tenant)
        // sees them, and a tenant its warm count once it has sandboxes there itself.
        let operator = who.profile.is_default();
        if own_sandboxes == 0 && !operator {
            view.warm = 0;
        }
        if !operator {
            view.pool = None;
        }
        if !self.looks_built(&view.id, owner) {
            hide_build(view);
            view.log_lines = self.lines_shown(&view.id, owner);
        }
    }

    /// The caller's live sandboxes made from an environment.
    fn own_live_sandboxes_of(&self, who: &Who, env: &str) -> usize {
        let book = self.forks();
        book.cards()
            .filter(|(_, kind, _, card)| {
                *kind == engine::book::Kind::Sandbox
                    && card.owner == who.tenant()
                    && card.environment.as_deref() == Some(env)
            })
            .count()
    }

    /// How many of an environment's log lines a build of `owner`'s own would have printed
    /// by now (the last one, ready or why it failed, only once it looks built).
    fn lines_shown(&self, id: &str, owner: &Owner) -> usize {
        let Some(env) = self
            .sandbox
            .as_ref()
            .and_then(|api| api.environments.get(id, "id").ok())
        else {
            return 0;
        };
        let total = env.view().log_lines;
        let took = env
            .built_in_ms()
            .or_else(|| self.tenancy.db.build_ms(id).ok().flatten())
            .unwrap_or(UNKNOWN_BUILD_MS)
            .max(1);
        let elapsed = tenants::now_ms().saturating_sub(owner.since_ms);
        ((total as u64 * elapsed / took) as usize).min(total.saturating_sub(1))
    }
}

/// An environment's view as of a build still running.
fn hide_build(view: &mut EnvironmentView) {
    view.state = "building".into();
    view.snapshot = None;
    view.error = None;
    view.log_lines = 0;
}
