//! The sandbox API of `farm serve`: environments made on demand (an image, or a Dockerfile
//! build context uploaded as a tar archive; content-addressed, so the same content gives the
//! same environment), and sandboxes forked from them that a client drives itself, as E2B,
//! Daytona and Modal users do: exec (whole, or streamed), files and folders, branch, pause,
//! resume, snapshot into a new environment, delete. A sandbox has no task and no verdict.
//!
//! - [`contexts`]: uploaded Dockerfile build contexts, unpacked as data;
//! - [`environments`]: the registry, builds (their progress and logs), what keeps an
//!   environment's snapshot through `farm snapshot gc`;
//! - [`sandboxes`]: each sandbox's life, its limits and timers;
//!
//! The HTTP routes are `serve::sandbox_routes`. Sandboxes are forks of the host core
//! ([`engine::Host`]: its forker, snapshot store, template builds and pools), held in the
//! service's one book of open forks beside the sessions, with the service's admission (its
//! memory reserve, `serve.max_sessions` shared with sessions) and auth.

mod calls;
pub mod contexts;
pub mod environments;
mod listener;
pub mod ports;
pub mod sandboxes;
mod shown;

pub use shown::EnvironmentId;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result};
use serde::Deserialize;

pub use environments::Environments;
pub use listener::{held_by_owner, Hold};
pub use sandboxes::{SandboxId, Sandboxes};

/// `[serve.sandboxes]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SandboxSection {
    /// Whether the sandbox API is served.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// A sandbox unused this long is removed, unless it asks for less.
    #[serde(default = "idle")]
    pub idle_timeout_secs: u64,
    /// No sandbox lives longer than this (its own `lifetime_secs` may be shorter).
    #[serde(default = "lifetime")]
    pub max_lifetime_secs: u64,
    /// Warm forks kept ready of each environment (0: none), from when it is ready.
    #[serde(default)]
    pub warm_pool: usize,
    /// The most an environment's pool grows to when bursts find it short, and the most VMs
    /// of ended sandboxes it keeps for a reset (0: no pools at all, every sandbox a new
    /// QEMU process; never below `warm_pool` otherwise).
    #[serde(default = "warm_pool_max")]
    pub warm_pool_max: usize,
    /// Largest uploaded build context, in MiB (at most 1024).
    #[serde(default = "context_mib")]
    pub max_context_mib: u64,
    /// Egress of the Dockerfile steps of environments built on demand.
    #[serde(default)]
    pub build_network: engine::snapshots::Network,
    /// Named egress policies a sandbox may ask for (`"network": "NAME"`): an allowlist and
    /// request rules each, as `[rollouts.network]` has. A client never supplies rules.
    #[serde(default)]
    pub networks: BTreeMap<String, engine::snapshots::Network>,
    /// Which of those policies a live sandbox may be moved to from which (`POST
    /// /v1/sandboxes/{id}/network`): from a policy only to one listed for it here, or to no
    /// network at all; never to a looser one.
    #[serde(default)]
    pub tighten: BTreeMap<String, Vec<String>>,
    /// Where the listener of sandboxes' open ports listens (default: the service's address,
    /// on a port of the system's choosing).
    #[serde(default)]
    pub ports_listen: Option<std::net::SocketAddr>,
    /// The domain of open ports' URLs (`http://TOKEN.DOMAIN:PORT/`): `localhost` (browsers
    /// resolve `*.localhost` to loopback), or a wildcard DNS name pointing at this host.
    #[serde(default = "localhost")]
    pub ports_domain: String,
    /// Checkpoint every live sandbox this often, for a restart after a crash (0: never; a
    /// pause, `POST .../checkpoint` and a graceful stop still do).
    #[serde(default)]
    pub checkpoint_secs: u64,
    /// How long a sandbox its timeout paused (`"on_timeout": "pause"`) is kept paused before
    /// it ends.
    #[serde(default = "paused_retention")]
    pub paused_retention_secs: u64,
}

fn paused_retention() -> u64 {
    7 * 24 * 3600
}

fn warm_pool_max() -> usize {
    64
}

/// The most `warm_pool` and `warm_pool_max` may be.
pub const MAX_WARM_POOL: usize = 1024;

fn localhost() -> String {
    "localhost".into()
}

/// The most any build context may be (`max_context_mib` is at most this).
pub const MAX_CONTEXT_BYTES: u64 = 1 << 30;

fn context_mib() -> u64 {
    256
}
fn yes() -> bool {
    true
}
fn idle() -> u64 {
    600
}
fn lifetime() -> u64 {
    24 * 3600
}

impl Default for SandboxSection {
    fn default() -> SandboxSection {
        toml::from_str("").expect("every key has a default")
    }
}

/// What is wrong with `[serve.sandboxes]`.
#[derive(Debug, thiserror::Error)]
pub enum SandboxConfigError {
    #[error("serve.sandboxes.idle_timeout_secs and max_lifetime_secs must be at least 1")]
    Timers,
    #[error("serve.sandboxes.networks.{name}: {error}")]
    Network {
        name: String,
        error: engine::snapshots::BadAllowEntry,
    },
    #[error("serve.sandboxes.build_network: {0}")]
    BuildNetwork(engine::snapshots::BadAllowEntry),
    #[error("serve.sandboxes.networks: {0:?} is not a network name (letters, digits, - and _)")]
    Name(String),
    #[error("serve.sandboxes.max_context_mib must be 1 to 1024")]
    ContextSize,
    #[error("serve.sandboxes.{key} is {value}: it must be at most {MAX_WARM_POOL}")]
    WarmPool { key: &'static str, value: usize },
    #[error(
        "serve.sandboxes.warm_pool is {0} but warm_pool_max is 0, which turns pools off: set warm_pool = 0, or warm_pool_max to at least {0}"
    )]
    PoolsOff(usize),
    #[error("serve.sandboxes.tighten.{from}: {to:?} is not a policy of serve.sandboxes.networks")]
    Tighten { from: String, to: String },
}

impl SandboxSection {
    pub fn check(&self) -> Result<(), SandboxConfigError> {
        if self.idle_timeout_secs == 0 || self.max_lifetime_secs == 0 {
            return Err(SandboxConfigError::Timers);
        }
        if self.max_context_mib == 0 || self.max_context_mib << 20 > MAX_CONTEXT_BYTES {
            return Err(SandboxConfigError::ContextSize);
        }
        for (key, value) in [("warm_pool", self.warm_pool), ("warm_pool_max", self.warm_pool_max)] {
            if value > MAX_WARM_POOL {
                return Err(SandboxConfigError::WarmPool { key, value });
            }
        }
        if self.warm_pool_max == 0 && self.warm_pool > 0 {
            return Err(SandboxConfigError::PoolsOff(self.warm_pool));
        }
        self.build_network.check().map_err(SandboxConfigError::BuildNetwork)?;
        for (name, network) in &self.networks {
            if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
                return Err(SandboxConfigError::Name(name.clone()));
            }
            network.check().map_err(|error| SandboxConfigError::Network {
                name: name.clone(),
                error,
            })?;
        }
        for (from, to) in &self.tighten {
            for name in std::iter::once(from).chain(to) {
                if !self.networks.contains_key(name) || to.iter().any(|t| t == from) {
                    return Err(SandboxConfigError::Tighten {
                        from: from.clone(),
                        to: name.clone(),
                    });
                }
            }
        }
        Ok(())
    }
}

/// The sandbox API's state: its engine, environments and sandboxes.
pub struct SandboxApi {
    pub environments: Arc<Environments>,
    pub sandboxes: Arc<Sandboxes>,
    /// Tenants' workspaces, which sandboxes mount.
    pub workspaces: Arc<crate::workspaces::Workspaces>,
}

impl SandboxApi {
    /// Starts the sandbox API with its state under `out/sandboxes` (`environments/`: the
    /// registry of environments, which pins their snapshots; `contexts/`: uploaded build
    /// contexts; `saved/`: every sandbox's record and checkpoints, taken up again by
    /// [`SandboxApi::restore`]).
    pub fn start(
        serve: &crate::ServeSection,
        out: &Path,
        host: Arc<engine::Host>,
        events: Arc<crate::events::Events>,
        forks: crate::forks::Forks,
        hold: listener::Hold,
    ) -> Result<SandboxApi> {
        let settings = &serve.sandboxes;
        let service_listen = serve.listen;
        let dir: PathBuf = out.join("sandboxes");
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let listen = settings
            .ports_listen
            .unwrap_or_else(|| std::net::SocketAddr::new(service_listen.ip(), 0));
        let listener = std::net::TcpListener::bind(listen)
            .with_context(|| format!("serve.sandboxes.ports_listen: cannot listen on {listen}"))?;
        listener.set_nonblocking(true)?;
        let address = listener.local_addr()?;
        // No guest's egress reaches the port listener either.
        egress::protect(address);
        let ports = Arc::new(ports::Ports::new(address, settings.ports_domain.clone()));
        let environments = Arc::new(Environments::open(
            host.clone(),
            settings,
            &dir,
            serve.memory_reserve_percent,
        )?);
        let workspaces = Arc::new(crate::workspaces::Workspaces::open(
            events.tenancy().clone(),
            &out.join("workspaces"),
        )?);
        let sandboxes = Arc::new(Sandboxes::new(
            host,
            events,
            workspaces.clone(),
            forks,
            ports.clone(),
            serve,
            &dir,
        )?);
        tokio::spawn(listener::serve(
            tokio::net::TcpListener::from_std(listener)?,
            sandboxes.clone(),
            hold,
        ));
        tracing::info!(
            "sandboxes' open ports on http://{address} (http://TOKEN.{}:{}/)",
            settings.ports_domain,
            address.port()
        );
        Ok(SandboxApi {
            environments,
            sandboxes,
            workspaces,
        })
    }

    /// Takes up the sandboxes an earlier process left, each paused.
    pub async fn restore(&self) {
        self.sandboxes.restore(&self.environments).await;
        self.workspaces.release_orphans(&self.sandboxes.ids());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn checked(toml_text: &str) -> Result<(), String> {
        let section: SandboxSection = toml::from_str(toml_text).map_err(|e| e.to_string())?;
        section.check().map_err(|e| e.to_string())
    }

    #[test]
    fn pools_are_bounded_and_cannot_be_both_on_and_off() {
        assert_eq!(checked(""), Ok(()));
        assert_eq!(
            checked("warm_pool = 100"),
            Ok(()),
            "warm_pool_max is raised to warm_pool"
        );
        assert_eq!(checked("warm_pool_max = 0"), Ok(()));
        let over = checked("warm_pool = 1025").unwrap_err();
        assert!(
            over.contains("serve.sandboxes.warm_pool is 1025") && over.contains("at most 1024"),
            "{over}"
        );
        let over = checked("warm_pool_max = 5000").unwrap_err();
        assert!(over.contains("warm_pool_max is 5000"), "{over}");
        let off = checked("warm_pool = 2\nwarm_pool_max = 0").unwrap_err();
        assert!(off.contains("warm_pool is 2 but warm_pool_max is 0"), "{off}");
    }
}
