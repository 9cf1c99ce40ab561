//! What a client asks of a new sandbox (`POST /v1/sandboxes`), checked against the service's
//! environments, networks and time limits before any VM is touched.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use engine::sandbox::SandboxSpec;
use serde::{Deserialize, Serialize};

use super::super::environments::{Environment, Environments, Ready};
use super::Sandboxes;
use crate::bounds;
use crate::error::{ApiError, ApiResult};

/// `POST /v1/sandboxes`.
#[derive(Debug, Clone, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SandboxRequest {
    pub environment: String,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub workdir: Option<String>,
    #[serde(default)]
    pub user: Option<String>,
    #[serde(default)]
    pub network: Option<String>,
    #[serde(default)]
    pub disk_mib: Option<u64>,
    #[serde(default)]
    pub idle_timeout_secs: Option<u64>,
    #[serde(default)]
    pub lifetime_secs: Option<u64>,
    #[serde(default)]
    pub cpus: Option<u64>,
    #[serde(default)]
    pub memory_mib: Option<u64>,
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
}

impl SandboxRequest {
    /// The fields that need nothing of the service: their bounds, variable names, paths,
    /// the user, sizes.
    fn check(&self) -> ApiResult<()> {
        let request = self;
        bounds::text("environment", &request.environment, bounds::ID_BYTES)?;
        bounds::variables("env", &request.env)?;
        for k in request.env.keys() {
            if k.is_empty() || k.contains('=') || k.contains('\0') {
                return Err(ApiError::field(400, format!("env.{k}"), "not a variable name"));
            }
        }
        if let Some(dir) = &request.workdir {
            bounds::text("workdir", dir, bounds::PATH_BYTES)?;
            if !dir.starts_with('/') {
                return Err(ApiError::field(400, "workdir", "must be an absolute guest path"));
            }
        }
        if let Some(user) = &request.user {
            bounds::text("user", user, bounds::USER_BYTES)?;
            if user.is_empty() || user.contains(|c: char| c.is_whitespace() || c == '\0') {
                return Err(ApiError::field(400, "user", "must be a user name, UID or UID:GID"));
            }
        }
        if let Some(network) = &request.network {
            bounds::text("network", network, bounds::ID_BYTES)?;
        }
        if let Some(disk) = request.disk_mib {
            bounds::range("disk_mib", disk, bounds::SANDBOX_DISK_MIB, "MiB")?;
        }
        if let Some(cpus) = request.cpus {
            bounds::range("cpus", cpus, bounds::CPUS, "vCPUs")?;
        }
        if let Some(memory) = request.memory_mib {
            bounds::range("memory_mib", memory, bounds::MEMORY_MIB, "MiB")?;
        }
        bounds::string_metadata("metadata", &request.metadata)?;
        Ok(())
    }
}

/// A sandbox's settings, which its branches share.
#[derive(Clone)]
pub(super) struct Settings {
    pub(super) environment: Arc<Environment>,
    pub(super) ready: Ready,
    pub(super) spec: SandboxSpec,
    pub(super) network_name: Option<String>,
    pub(super) idle: Duration,
    pub(super) lifetime: Duration,
    pub(super) metadata: BTreeMap<String, String>,
    /// The request it was made with (a restart makes the settings again from it).
    pub(super) request: SandboxRequest,
}

impl Sandboxes {
    /// The settings a request asks for, or a 400 naming the field.
    pub(super) fn settings_of(&self, environments: &Environments, request: &SandboxRequest) -> ApiResult<Settings> {
        request.check()?;
        let environment = environments.get(&request.environment, "environment")?;
        let ready = environment.ready("environment")?;
        let spec = &environment.spec;
        if request.cpus.is_some_and(|c| c != u64::from(spec.cpus)) {
            return Err(ApiError::field(
                400,
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
            return Err(ApiError::field(400, "memory_mib", format!(
                "environment {} has {} MiB of memory, fixed in its snapshot: create an environment with memory_mib {} for this",
                environment.id, spec.memory_mib, request.memory_mib.unwrap_or_default()
            )));
        }
        let network = match &request.network {
            None => None,
            Some(name) => Some(self.networks.get(name).cloned().ok_or_else(|| {
                let names: Vec<&str> = self.networks.keys().map(String::as_str).collect();
                ApiError::field(
                    400,
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
