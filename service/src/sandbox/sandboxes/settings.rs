//! What a client asks of a new sandbox (`POST /v1/sandboxes`), checked against the service's
//! environments, networks and time limits before any VM is touched.

use std::time::Duration;

use engine::sandbox::SandboxSpec;

use super::super::environments::Environments;
use super::Sandboxes;
use crate::bounds;
use crate::entries::Settings;
use crate::error::ErrorKind;
use crate::error::{ApiError, ApiResult};
use crate::requests::SandboxRequest;

impl Sandboxes {
    /// The settings a request asks for, or a 400 naming the field.
    pub(super) fn settings_of(&self, environments: &Environments, request: &SandboxRequest) -> ApiResult<Settings> {
        request.check()?;
        let environment = environments.get(&request.environment, "environment")?;
        let ready = environment.ready("environment")?;
        let spec = &environment.spec;
        if request.cpus.is_some_and(|c| c != u64::from(spec.cpus)) {
            return Err(ApiError::field(
                ErrorKind::Invalid,
                "cpus",
                format!(
                    "environment {} has {} vCPUs, fixed in its snapshot: create an environment with cpus {} for this",
                    environment.id,
                    spec.cpus,
                    request.cpus.unwrap_or_default()
                ),
            ));
        }
        if request.memory_mib.is_some_and(|m| m != u64::from(spec.memory_mib)) {
            return Err(ApiError::field(ErrorKind::Invalid, "memory_mib", format!(
                "environment {} has {} MiB of memory, fixed in its snapshot: create an environment with memory_mib {} for this",
                environment.id, spec.memory_mib, request.memory_mib.unwrap_or_default()
            )));
        }
        let network = match &request.network {
            None => None,
            Some(name) => Some(self.networks.get(name).cloned().ok_or_else(|| {
                let names: Vec<&str> = self.networks.keys().map(String::as_str).collect();
                ApiError::field(
                    ErrorKind::Invalid,
                    "network",
                    format!(
                        "no network policy {name:?} in serve.sandboxes.networks (the service has: {})",
                        if names.is_empty() {
                            "none".to_string()
                        } else {
                            names.join(", ")
                        }
                    ),
                )
            })?),
        };
        let timer = |name: &str, asked: Option<u64>, max: Duration| -> ApiResult<Duration> {
            match asked {
                Some(s) => {
                    bounds::range(name, s, (1, max.as_secs()), "seconds (the service's limit)")?;
                    Ok(Duration::from_secs(s))
                }
                None => Ok(max),
            }
        };
        Ok(Settings {
            environment: environment.clone(),
            ready,
            spec: SandboxSpec {
                env: request.env.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
                workdir: request.workdir.clone(),
                user: request.user.clone(),
                network,
                max_disk_bytes: request.disk_mib.map(|m| m << 20),
            },
            network_name: request.network.clone(),
            idle: timer("idle_timeout_secs", request.idle_timeout_secs, self.idle)?,
            lifetime: timer("lifetime_secs", request.lifetime_secs, self.lifetime)?,
            metadata: request.metadata.clone(),
            request: request.clone(),
        })
    }
}
