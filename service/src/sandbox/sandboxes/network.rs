//! `POST /v1/sandboxes/{id}/network`: a live sandbox moved to a stricter named policy, or to
//! no network, at runtime: open for a trusted set-up, then locked before the agent starts.
//! Only to a policy the operator listed after the sandbox's present one
//! (`serve.sandboxes.tighten`), or to none; never to a looser one. The VM's connections the
//! new policy would not open are cut at once, and every VM the sandbox gets later (a resume,
//! a branch, a reset) is given the new policy; a restart of the service keeps it.

use serde::{Deserialize, Serialize};

use super::{view, SandboxId, Sandboxes};
use crate::bounds;
use crate::error::{ApiError, ApiResult, ErrorKind};
use crate::tenancy::Who;
use crate::wire::SandboxView;

/// `POST /v1/sandboxes/{id}/network`: the named policy to move to, or `null` for none.
#[derive(Debug, Clone, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NetworkChange {
    pub network: Option<String>,
}

impl Sandboxes {
    /// Moves sandbox `id` to `change.network`, when that is no looser than where it is.
    pub async fn set_network(&self, who: &Who, id: &SandboxId, change: NetworkChange) -> ApiResult<SandboxView> {
        let target = change.network;
        if let Some(name) = &target {
            bounds::text("network", name, bounds::ID_BYTES)?;
            if !who.profile.may_use_network(name) || !self.networks.contains_key(name) {
                return Err(ApiError::field(
                    ErrorKind::Invalid,
                    "network",
                    format!(
                        "no network policy {name:?} is granted to tenant {}",
                        who.profile.tenant.name
                    ),
                ));
            }
        }
        let sandbox = self.get(id)?;
        let mut sandbox = sandbox.lock().await;
        let current = sandbox.sandbox().settings.network_name.clone();
        if current == target {
            return Ok(view(&sandbox));
        }
        let policy = match &target {
            None => egress::Policy::default(),
            Some(name) => {
                let listed = current
                    .as_ref()
                    .and_then(|from| self.tighten.get(from))
                    .is_some_and(|next| next.contains(name));
                if !listed {
                    let from = current.as_deref().unwrap_or("no network");
                    return Err(ApiError::field(
                        ErrorKind::Conflict,
                        "network",
                        format!(
                            "sandbox {id} is on {from}: it may move only to a stricter policy the operator listed after it (serve.sandboxes.tighten), or to none"
                        ),
                    ));
                }
                self.networks[name].clone()
            }
        };
        sandbox.run.set_network(policy.clone());
        let settings = &mut sandbox.sandbox_mut().settings;
        settings.network_name = target.clone();
        settings.request.network = target.clone();
        settings.spec.network = target.as_ref().map(|_| policy);
        self.save_record(&sandbox);
        tracing::info!(sandbox = %id, network = target.as_deref().unwrap_or("none"), "sandbox network tightened");
        Ok(view(&sandbox))
    }
}
