//! `farm serve`'s configuration: the `[serve]` table of a service file (or a suite file
//! served alone), checked when it is read.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::Deserialize;

use engine::config::{Count, Suite};
use engine::sizing;

/// The `[serve]` table.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServeSection {
    /// Suite files, relative to the service file.
    #[serde(default)]
    pub suites: Vec<PathBuf>,
    /// Output folder, relative to the service file.
    #[serde(default)]
    pub out: Option<PathBuf>,
    #[serde(default = "default_listen")]
    pub listen: SocketAddr,
    /// Rollouts at once: a number, or "auto" (one per core, within memory).
    #[serde(default)]
    pub concurrency: Count,
    /// Rollouts admitted but not started, at most; a submit past it gets 429.
    #[serde(default = "queue_limit")]
    pub queue_limit: usize,
    /// Live sessions at once, at most: a number, or "auto" (as many as memory could hold at
    /// an idle session's measured floor; the memory check then admits each one).
    #[serde(default)]
    pub max_sessions: Count,
    /// Share of MemTotal, in percent, the service keeps free: a session, branch or resume
    /// that would leave less gets 503.
    #[serde(default = "memory_reserve_percent")]
    pub memory_reserve_percent: u64,
    /// Same-page merging of the VMs' memory: "off", "on" or "on-no-aslr" (docs/commands.md, Density).
    #[serde(default)]
    pub ksm: engine::sizing::Ksm,
    /// A session idle this long is ended.
    #[serde(default = "lease")]
    pub session_lease_secs: u64,
    /// Samples of one submitted item, at most.
    #[serde(default = "max_n")]
    pub max_samples_per_item: u32,
    /// The environment variable that holds the bearer token.
    #[serde(default = "token_env")]
    pub token_env: String,
    /// Warm forks per suite template: a number, or "auto" (one per core).
    #[serde(default)]
    pub warm_pool: Count,
    /// A paused session is removed this long after it was paused.
    #[serde(default = "paused_retention")]
    pub paused_retention_secs: u64,
    /// The sandbox API (`/v1/environments`, `/v1/sandboxes`).
    #[serde(default)]
    pub sandboxes: crate::sandbox::SandboxSection,
    /// The tenants database (`farm tenant --db`), relative to the service file; default
    /// `tenants.db` in the output folder.
    #[serde(default)]
    pub tenants_db: Option<PathBuf>,
    /// Connections a tenant holds open at once (output streams, terminals, port
    /// connections, OpenEnv sockets) unless its `connections` quota says otherwise.
    #[serde(default = "max_connections_per_tenant")]
    pub max_connections_per_tenant: u64,
    /// E2B's protocol (`docs/e2b.md`).
    #[serde(default)]
    pub e2b: E2bSection,
    /// Lifecycle events and webhooks (`docs/serve.md`).
    #[serde(default)]
    pub events: crate::events::EventsSection,
}

/// `[serve.e2b]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct E2bSection {
    /// E2B template names a create may use besides an environment's id, each the image (a
    /// built-in one or a registry reference) its environment is made of, and its setup, on
    /// first use by each tenant. Default: `base` is the `python` image, and
    /// `code-interpreter-v1` (the template of E2B's code interpreter) the `code-interpreter`
    /// image with its interpreter started in the snapshot.
    #[serde(default = "e2b_templates")]
    pub templates: std::collections::BTreeMap<String, E2bTemplate>,
}

/// A template of `[serve.e2b] templates`: an image's name, or `{ image, setup }`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(from = "TemplateForm")]
pub struct E2bTemplate {
    pub image: String,
    /// Commands run in the environment before its snapshot (an environment's `setup`).
    pub setup: Vec<String>,
}

#[derive(Deserialize)]
#[serde(
    untagged,
    expecting = "an image's name, or a table { image = \"...\", setup = [\"command\", ...] }"
)]
enum TemplateForm {
    Image(String),
    Recipe {
        image: String,
        #[serde(default)]
        setup: Vec<String>,
    },
}

impl From<TemplateForm> for E2bTemplate {
    fn from(form: TemplateForm) -> E2bTemplate {
        match form {
            TemplateForm::Image(image) => E2bTemplate { image, setup: vec![] },
            TemplateForm::Recipe { image, setup } => E2bTemplate { image, setup },
        }
    }
}

impl Default for E2bSection {
    fn default() -> E2bSection {
        E2bSection {
            templates: e2b_templates(),
        }
    }
}

fn e2b_templates() -> std::collections::BTreeMap<String, E2bTemplate> {
    let template = |image: &str, setup: &[&str]| E2bTemplate {
        image: image.into(),
        setup: setup.iter().map(|s| s.to_string()).collect(),
    };
    [
        ("base".to_string(), template("python", &[])),
        (
            "code-interpreter-v1".to_string(),
            template("code-interpreter", &["farm-interpreter start"]),
        ),
    ]
    .into()
}

fn max_connections_per_tenant() -> u64 {
    256
}

fn paused_retention() -> u64 {
    7 * 24 * 3600
}

fn default_listen() -> SocketAddr {
    "127.0.0.1:8765".parse().expect("a valid address")
}
fn queue_limit() -> usize {
    1024
}
fn memory_reserve_percent() -> u64 {
    10
}
fn lease() -> u64 {
    600
}
fn max_n() -> u32 {
    64
}
fn token_env() -> String {
    "FARM_SERVE_TOKEN".into()
}

impl Default for ServeSection {
    fn default() -> ServeSection {
        toml::from_str("").expect("every key has a default")
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ServeFile {
    serve: ServeSection,
}

/// The suites and the `[serve]` settings CONFIG names.
pub fn load_config(path: &Path) -> Result<(ServeSection, Vec<Suite>, PathBuf)> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let table: toml::Table =
        toml::from_str(&text).map_err(|e| anyhow::anyhow!("{}: {}", path.display(), e.to_string().trim_end()))?;
    let dir = path
        .parent()
        .map(Path::to_path_buf)
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or_else(|| PathBuf::from("."));
    if table.contains_key("suite") {
        let suite = Suite::load(path)?;
        return Ok((ServeSection::default(), vec![suite], dir.join("serve-out")));
    }
    if !table.contains_key("serve") {
        bail!(
            "{}: expected a suite file (a [suite] table) or a service file (a [serve] table)",
            path.display()
        );
    }
    let file: ServeFile =
        toml::from_str(&text).map_err(|e| anyhow::anyhow!("{}: {}", path.display(), e.to_string().trim_end()))?;
    let section = file.serve;
    section
        .sandboxes
        .check()
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    section
        .events
        .check()
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    if section.suites.is_empty() && !section.sandboxes.enabled {
        bail!(
            "{}: nothing to serve: serve.suites is empty and serve.sandboxes.enabled is false",
            path.display()
        );
    }
    if section.concurrency == Count::Fixed(0) {
        bail!("{}: serve.concurrency must be at least 1, or \"auto\"", path.display());
    }
    if section.max_sessions == Count::Fixed(0) {
        bail!("{}: serve.max_sessions must be at least 1, or \"auto\"", path.display());
    }
    if section.memory_reserve_percent > 99 {
        bail!(
            "{}: serve.memory_reserve_percent must be a percentage of MemTotal below 100 (got {})",
            path.display(),
            section.memory_reserve_percent
        );
    }
    if section.queue_limit == 0 {
        bail!("{}: serve.queue_limit must be at least 1", path.display());
    }
    if section.session_lease_secs == 0 {
        bail!("{}: serve.session_lease_secs must be at least 1", path.display());
    }
    if section.max_samples_per_item == 0 {
        bail!("{}: serve.max_samples_per_item must be at least 1", path.display());
    }
    let mut suites: Vec<Suite> = Vec::new();
    for file in &section.suites {
        let suite = Suite::load(&dir.join(file)).with_context(|| format!("{}: serve.suites", path.display()))?;
        if suites.iter().any(|s| s.config.suite.name == suite.config.suite.name) {
            bail!(
                "{}: serve.suites: two suites are named {:?}; suite names must differ",
                path.display(),
                suite.config.suite.name
            );
        }
        suites.push(suite);
    }
    let out = dir.join(section.out.clone().unwrap_or_else(|| PathBuf::from("serve-out")));
    let mut section = section;
    section.tenants_db = section.tenants_db.map(|p| dir.join(p));
    Ok((section, suites, out))
}

/// How many rollouts run at once, and warm forks per template.
pub fn resolve_counts(settings: &ServeSection, guest_mib: u32) -> sizing::Counts {
    // Trainers' endpoints answer slowly compared with a step in the guest: plan as for a
    // live policy, which also keeps warm forks for sessions.
    sizing::resolve(
        settings.concurrency,
        settings.warm_pool,
        Some(1),
        guest_mib,
        &sizing::Host::probe(),
    )
}
