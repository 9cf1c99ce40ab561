//! The suite model: plain structs parsed from TOML with unknown keys refused, checked once
//! at load with errors that name the file and the key.

mod count;
mod policy;

pub use count::Count;
pub use policy::{Action, PolicyConfig, PolicyError, PolicyKind, PolicyOrigin, ReplaySource};

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use snapshotter::TemplateConfig;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SuiteConfig {
    pub suite: SuiteSection,
    pub template: TemplateConfig,
    pub dataset: DatasetSection,
    pub policy: PolicyConfig,
    #[serde(default)]
    pub rollouts: RolloutsSection,
    #[serde(default)]
    pub scoring: ScoringSection,
    #[serde(default)]
    pub output: OutputSection,
    /// How Harbor tasks (`format = "harbor"`) are built and verified.
    #[serde(default)]
    pub harbor: HarborSection,
}

/// `[harbor]`: settings for Harbor tasks.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HarborSection {
    /// Where `tests/test.sh` runs: `live` (the rollout's VM, its processes alive; the
    /// default, as Harbor does) or `fresh_boot` (a VM booted from the rollout's final disk).
    #[serde(default)]
    pub verify: scorers::harbor::HarborVerify,
    /// The verifier's egress (`[harbor.verifier_network] allow`), apart from the agent's.
    #[serde(default)]
    pub verifier_network: snapshotter::Network,
    /// The egress of the `RUN` steps that build the tasks' environments.
    #[serde(default)]
    pub build_network: snapshotter::Network,
    /// `ARG` values for every task's Dockerfile (a mirror's address, for example).
    #[serde(default)]
    pub build_args: std::collections::BTreeMap<String, String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SuiteSection {
    pub name: String,
    /// Base of every rollout's seed.
    #[serde(default)]
    pub seed: u64,
    #[serde(default)]
    pub description: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatasetSection {
    /// Relative to the suite file.
    pub path: PathBuf,
    pub format: datasets::Format,
    /// Only the first N tasks.
    #[serde(default)]
    pub limit: Option<usize>,
    /// Only these task ids.
    #[serde(default)]
    pub tasks: Vec<String>,
}

/// `[rollouts] reuse`: how VMs are started when one of the same snapshot is idle.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reuse {
    /// Reset in place where that is cheaper than a fork (a QEMU that keeps its translated
    /// code across a reset), else fork.
    #[default]
    Auto,
    /// Always reset an idle VM in place.
    Reset,
    /// Always fork a new QEMU process.
    Fork,
}

impl std::str::FromStr for Reuse {
    type Err = String;
    fn from_str(s: &str) -> Result<Reuse, String> {
        match s {
            "auto" => Ok(Reuse::Auto),
            "reset" => Ok(Reuse::Reset),
            "fork" => Ok(Reuse::Fork),
            other => Err(format!("{other:?} is not a way to reuse VMs (auto, reset, fork)")),
        }
    }
}

impl Reuse {
    /// Whether VMs are reset in place on a host whose QEMU does (`selective_reset`) or does
    /// not keep its translated code across a reset.
    pub fn resets(self, selective_reset: bool) -> bool {
        match self {
            Reuse::Auto => selective_reset,
            Reuse::Reset => true,
            Reuse::Fork => false,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RolloutsSection {
    /// Rollouts per task (replay of samples files: one per completion instead).
    #[serde(default = "one")]
    pub samples: u32,
    /// Rollouts running at once: a number, or "auto" (the default: see [`super::counts`]).
    #[serde(default)]
    pub concurrency: Count,
    /// Actions per rollout at most.
    #[serde(default = "max_steps")]
    pub max_steps: usize,
    /// Wall-clock limit of one rollout (actions only, not scoring).
    #[serde(default = "rollout_timeout")]
    pub timeout_secs: u64,
    /// Limit of one command.
    #[serde(default = "step_timeout")]
    pub step_timeout_secs: u64,
    /// Bytes of stdout and of stderr kept per step.
    #[serde(default = "output_cap")]
    pub output_cap_bytes: u64,
    /// A rollout VM whose disk overlay grows past this is stopped.
    #[serde(default = "max_disk")]
    pub max_disk_mib: u64,
    /// Extra attempts after an environment error (never after an agent failure).
    #[serde(default = "two_u32")]
    pub retries: u32,
    /// Forks of the template snapshot kept resumed and warm, ready to take an identity
    /// (0, the default, turns the pool off). Rollouts and scoring VMs of tasks without a
    /// snapshot of their own come from it. It cuts latency when the host has idle cores;
    /// it adds no throughput to a host whose cores are all busy (warming costs the same CPU).
    /// "auto" (the default) turns it on only where rollouts leave cores idle.
    #[serde(default)]
    pub warm_pool: Count,
    /// Shell command each pooled fork runs before it waits: warms the code paths rollouts
    /// and hidden tests will use.
    #[serde(default = "warm_up")]
    pub warm_up: String,
    /// The guest user the agent's actions run as: "root" (the default, which many tasks
    /// expect), "farm" (the image's unprivileged user, uid 1000), another user of the
    /// image, or `UID[:GID]`. For anyone but root the workspace is handed to that user when
    /// the rollout starts and the files the policy writes belong to it.
    #[serde(default = "root_user")]
    pub user: String,
    /// How a rollout's VM or a scoring VM starts when a VM of the same snapshot is idle
    /// (a finished rollout's, or a scoring VM after its check): `"reset"` it in place to the
    /// snapshot (exact: memory, vCPU and devices, disk; a new identity), or `"fork"` a new
    /// QEMU process. `"auto"` (the default) resets where that is cheaper than a fork: with
    /// a QEMU that keeps its translated code across a reset (the one the set-up builds);
    /// forks otherwise. A reset that fails gives a new fork, and the row says so.
    #[serde(default)]
    pub reuse: Reuse,
    /// Egress for the agent's actions (`[rollouts.network] allow = ["host:port"]`), through
    /// farm's proxy. None by default; scoring VMs never have any.
    #[serde(default)]
    pub network: snapshotter::Network,
}

pub use scorers::{ScoringIsolation, ScoringMode};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScoringSection {
    #[serde(default = "score_timeout")]
    pub timeout_secs: u64,
    #[serde(default)]
    pub mode: ScoringMode,
    /// Reward at or above which a rollout passes.
    #[serde(default = "threshold")]
    pub pass_threshold: f64,
    /// An external scorer (argv) run on the host; relative program paths are relative to
    /// the suite file. It gets the rollout as JSON on stdin and prints `{"reward": R}`.
    #[serde(default)]
    pub external: Vec<String>,
    /// Limit of one call into the candidate's function (function-call harness); a call
    /// past it fails the check.
    #[serde(default = "call_timeout")]
    pub call_timeout_secs: u64,
    /// `"vm"` (the default): every rollout's check in a fresh fork of its own. `"sandbox"`:
    /// checks through farm's harness (function-call and unit-test tasks without a snapshot
    /// of their own) share scoring VMs, each check with a fresh candidate process in a
    /// private view, the VM reset between checks; verdicts from a VM's second check on are
    /// trusted as `shared`.
    #[serde(default)]
    pub isolation: ScoringIsolation,
    /// Checks one scoring VM serves at most with `isolation = "sandbox"`.
    #[serde(default = "checks_per_vm")]
    pub checks_per_vm: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutputSection {
    /// Relative to the suite file unless `--out` is given.
    #[serde(default = "out_dir")]
    pub dir: PathBuf,
    /// Rows per Parquet part (a part is also written at the end and on interruption).
    #[serde(default = "rows_per_part")]
    pub rows_per_part: usize,
}

fn one() -> u32 {
    1
}
fn two_u32() -> u32 {
    2
}
fn warm_up() -> String {
    "command -v python3 >/dev/null && python3 -c pass; true".into()
}
fn max_steps() -> usize {
    50
}
fn rollout_timeout() -> u64 {
    600
}
fn step_timeout() -> u64 {
    120
}
fn output_cap() -> u64 {
    16 << 10
}
fn max_disk() -> u64 {
    2048
}
fn score_timeout() -> u64 {
    60
}
fn call_timeout() -> u64 {
    10
}
fn checks_per_vm() -> u32 {
    100
}
/// Unset: the converted image's `User`, else root (see `Engine::start`).
fn root_user() -> String {
    String::new()
}
fn threshold() -> f64 {
    1.0
}
fn out_dir() -> PathBuf {
    "out".into()
}
fn rows_per_part() -> usize {
    256
}

impl Default for RolloutsSection {
    fn default() -> Self {
        toml::from_str("").expect("defaults")
    }
}
impl Default for ScoringSection {
    fn default() -> Self {
        toml::from_str("").expect("defaults")
    }
}
impl Default for OutputSection {
    fn default() -> Self {
        toml::from_str("").expect("defaults")
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SuiteError {
    #[error("cannot read suite {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("{path}: {key}: {message}")]
    Invalid {
        path: PathBuf,
        key: String,
        message: String,
    },
    #[error(transparent)]
    Dataset(#[from] datasets::DatasetError),
    #[error("{path}: task {task:?} has neither a test command nor an expected answer, and the suite sets no scoring.external")]
    Unscorable { path: PathBuf, task: String },
}

/// A loaded suite: the config, where it lives, and its digest.
#[derive(Debug)]
pub struct Suite {
    pub config: SuiteConfig,
    pub path: PathBuf,
    pub dir: PathBuf,
    /// SHA-256 of the suite file's bytes.
    pub digest: String,
}

impl Suite {
    pub fn load(path: &Path) -> Result<Suite, SuiteError> {
        let bytes = std::fs::read(path).map_err(|source| SuiteError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let text = String::from_utf8_lossy(&bytes);
        let config: SuiteConfig = toml::from_str(&text).map_err(|e| SuiteError::Parse {
            path: path.to_path_buf(),
            message: e.to_string().trim_end().to_string(),
        })?;
        let dir = path
            .parent()
            .map(Path::to_path_buf)
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or_else(|| PathBuf::from("."));
        let suite = Suite {
            digest: Sha256::digest(&bytes).iter().map(|b| format!("{b:02x}")).collect(),
            config,
            path: path.to_path_buf(),
            dir,
        };
        suite.validate()?;
        Ok(suite)
    }

    fn validate(&self) -> Result<(), SuiteError> {
        let invalid = |key: &str, message: String| SuiteError::Invalid {
            path: self.path.clone(),
            key: key.into(),
            message,
        };
        let c = &self.config;
        if c.suite.name.trim().is_empty() {
            return Err(invalid("suite.name", "must not be empty".into()));
        }
        c.template.validate(&self.path).map_err(|e| SuiteError::Parse {
            path: self.path.clone(),
            message: e.to_string(),
        })?;
        if c.rollouts.samples == 0 {
            return Err(invalid("rollouts.samples", "must be at least 1".into()));
        }
        if c.rollouts.concurrency == Count::Fixed(0) {
            return Err(invalid(
                "rollouts.concurrency",
                "must be at least 1, or \"auto\"".into(),
            ));
        }
        if c.rollouts.max_steps == 0 {
            return Err(invalid("rollouts.max_steps", "must be at least 1".into()));
        }
        if c.scoring.checks_per_vm == 0 {
            return Err(invalid("scoring.checks_per_vm", "must be at least 1".into()));
        }
        if c.scoring.isolation == ScoringIsolation::Sandbox && c.scoring.mode != ScoringMode::FreshFork {
            return Err(invalid(
                "scoring.isolation",
                "\"sandbox\" shares fresh scoring VMs; it needs scoring.mode = \"fresh_fork\"".into(),
            ));
        }
        if c.scoring.call_timeout_secs == 0 {
            return Err(invalid("scoring.call_timeout_secs", "must be at least 1".into()));
        }
        c.rollouts
            .network
            .check()
            .map_err(|m| invalid("rollouts.network", m.to_string()))?;
        c.harbor
            .verifier_network
            .check()
            .map_err(|m| invalid("harbor.verifier_network", m.to_string()))?;
        c.harbor
            .build_network
            .check()
            .map_err(|m| invalid("harbor.build_network", m.to_string()))?;
        if !c.rollouts.user.is_empty() && !valid_user(&c.rollouts.user) {
            return Err(invalid(
                "rollouts.user",
                format!(
                    "{:?} is not a user name or UID[:GID] (e.g. \"root\", \"farm\", \"1000\")",
                    c.rollouts.user
                ),
            ));
        }
        if !(0.0..=1.0).contains(&c.scoring.pass_threshold) {
            return Err(invalid(
                "scoring.pass_threshold",
                format!("{} is not in [0, 1]", c.scoring.pass_threshold),
            ));
        }
        if c.output.rows_per_part == 0 {
            return Err(invalid("output.rows_per_part", "must be at least 1".into()));
        }
        c.policy
            .check(PolicyOrigin::Suite)
            .map_err(|e| invalid(&format!("policy.{}", e.key), e.message))?;
        let dataset = self.resolve(&c.dataset.path);
        if !dataset.exists() {
            return Err(invalid("dataset.path", format!("{} does not exist", dataset.display())));
        }
        Ok(())
    }

    /// The suite's tasks: loaded, filtered by `dataset.tasks` and limited (`limit`, else
    /// `dataset.limit`); every one must be scorable.
    pub fn tasks(&self, limit: Option<usize>) -> Result<Vec<std::sync::Arc<datasets::Task>>, SuiteError> {
        let config = &self.config;
        let dataset_path = self.resolve(&config.dataset.path);
        let mut tasks = datasets::load(&dataset_path, config.dataset.format)?;
        if !config.dataset.tasks.is_empty() {
            tasks.retain(|t| config.dataset.tasks.contains(&t.id));
        }
        if let Some(limit) = limit.or(config.dataset.limit) {
            tasks.truncate(limit);
        }
        if config.scoring.external.is_empty() {
            if let Some(t) = tasks.iter().find(|t| !t.is_scorable()) {
                return Err(SuiteError::Unscorable {
                    path: dataset_path,
                    task: t.id.clone(),
                });
            }
        }
        Ok(tasks.into_iter().map(std::sync::Arc::new).collect())
    }

    /// A path from the suite file, relative to the suite's folder.
    pub fn resolve(&self, path: &Path) -> PathBuf {
        if path.is_absolute() {
            path.to_path_buf()
        } else {
            self.dir.join(path)
        }
    }
}

/// A guest user spec: a user name (letters, digits, `_`, `-`, `.`) or `UID[:GID]`.
pub fn valid_user(spec: &str) -> bool {
    let name = |s: &str| {
        !s.is_empty()
            && s.len() <= 32
            && s.chars().all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c))
            && !s.starts_with('-')
    };
    match spec.split_once(':') {
        Some((uid, gid)) => uid.parse::<u32>().is_ok() && gid.parse::<u32>().is_ok(),
        None => name(spec),
    }
}

impl RolloutsSection {
    /// Whether the agent's actions run as root.
    pub fn runs_as_root(&self) -> bool {
        self.user.is_empty() || self.user == "root" || self.user == "0" || self.user == "0:0"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = r#"
[suite]
name = "humaneval-oracle"
[template]
image = "python"
[dataset]
path = "tasks.jsonl"
format = "humaneval"
[policy]
kind = "replay"
[rollouts]
samples = 1
concurrency = 2
[scoring]
timeout_secs = 30
[output]
dir = "out"
"#;

    fn write(dir: &Path, text: &str) -> PathBuf {
        std::fs::write(dir.join("tasks.jsonl"), "").unwrap();
        let p = dir.join("suite.toml");
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn the_minimal_suite_parses_with_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let suite = Suite::load(&write(dir.path(), MINIMAL)).unwrap();
        assert_eq!(suite.config.rollouts.retries, 2);
        assert_eq!(suite.config.scoring.timeout_secs, 30);
        assert_eq!(suite.resolve(Path::new("tasks.jsonl")), dir.path().join("tasks.jsonl"));
        assert_eq!(suite.digest.len(), 64);
    }

    #[test]
    fn vms_are_reset_in_place_by_default_only_where_that_is_cheaper_than_a_fork() {
        let dir = tempfile::tempdir().unwrap();
        let suite = Suite::load(&write(dir.path(), MINIMAL)).unwrap();
        assert_eq!(suite.config.rollouts.reuse, Reuse::Auto);
        assert!(Reuse::Auto.resets(true) && !Reuse::Auto.resets(false));
        assert!(Reuse::Reset.resets(false) && !Reuse::Fork.resets(true));
        let suite = Suite::load(&write(
            dir.path(),
            &MINIMAL.replace("concurrency = 2", "concurrency = 2\nreuse = \"fork\""),
        ))
        .unwrap();
        assert_eq!(suite.config.rollouts.reuse, Reuse::Fork);
        let err = Suite::load(&write(
            dir.path(),
            &MINIMAL.replace("concurrency = 2", "concurrency = 2\nreuse = \"always\""),
        ))
        .unwrap_err()
        .to_string();
        assert!(err.contains("reuse") && err.contains("always"), "{err}");
        assert_eq!("reset".parse::<Reuse>(), Ok(Reuse::Reset));
        assert!("sometimes".parse::<Reuse>().unwrap_err().contains("auto, reset, fork"));
    }

    #[test]
    fn unknown_keys_name_the_file_line_and_key() {
        let dir = tempfile::tempdir().unwrap();
        let text = MINIMAL.replace("concurrency = 2", "concurency = 2");
        let err = Suite::load(&write(dir.path(), &text)).unwrap_err().to_string();
        assert!(
            err.contains("suite.toml") && err.contains("concurency") && err.contains("line"),
            "{err}"
        );
    }

    #[test]
    fn bad_values_name_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let err = Suite::load(&write(dir.path(), &MINIMAL.replace("samples = 1", "samples = 0")))
            .unwrap_err()
            .to_string();
        assert!(err.contains("rollouts.samples"), "{err}");
        let err = Suite::load(&write(dir.path(), &MINIMAL.replace("\"humaneval\"", "\"csv\"")))
            .unwrap_err()
            .to_string();
        assert!(err.contains("csv"), "{err}");
        let err = Suite::load(&write(dir.path(), &MINIMAL.replace("tasks.jsonl\"", "missing.jsonl\"")))
            .unwrap_err()
            .to_string();
        assert!(err.contains("dataset.path"), "{err}");
        let err = Suite::load(&write(
            dir.path(),
            &MINIMAL.replace("concurrency = 2", "user = \"a b\""),
        ))
        .unwrap_err()
        .to_string();
        assert!(err.contains("rollouts.user"), "{err}");
        let suite = Suite::load(&write(
            dir.path(),
            &MINIMAL.replace("concurrency = 2", "user = \"farm\""),
        ))
        .unwrap();
        assert!(!suite.config.rollouts.runs_as_root());
        assert!(Suite::load(&write(dir.path(), MINIMAL))
            .unwrap()
            .config
            .rollouts
            .runs_as_root());
        for bad in [
            "concurrency = 0",
            "concurrency = -1",
            "concurrency = \"lots\"",
            "warm_pool = 1.5",
        ] {
            let err = Suite::load(&write(dir.path(), &MINIMAL.replace("concurrency = 2", bad)))
                .unwrap_err()
                .to_string();
            assert!(err.contains("concurrency") || err.contains("warm_pool"), "{bad}: {err}");
            assert!(err.contains("auto"), "{bad}: {err}");
        }
    }

    #[test]
    fn concurrency_and_the_pool_are_numbers_or_auto() {
        let dir = tempfile::tempdir().unwrap();
        let suite = Suite::load(&write(dir.path(), MINIMAL)).unwrap();
        assert_eq!(
            (suite.config.rollouts.concurrency, suite.config.rollouts.warm_pool),
            (Count::Fixed(2), Count::Auto)
        );
        let suite = Suite::load(&write(
            dir.path(),
            &MINIMAL.replace("concurrency = 2", "concurrency = \"auto\"\nwarm_pool = 3"),
        ))
        .unwrap();
        assert_eq!(
            (suite.config.rollouts.concurrency, suite.config.rollouts.warm_pool),
            (Count::Auto, Count::Fixed(3))
        );
        let suite = Suite::load(&write(dir.path(), &MINIMAL.replace("concurrency = 2", ""))).unwrap();
        assert_eq!(suite.config.rollouts.concurrency, Count::Auto);
    }
}
