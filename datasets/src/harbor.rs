//! Harbor task folders (`format = "harbor"`), as Harbor itself reads them:
//!
//! ```text
//! DATASET/
//!   <task>/
//!     instruction.md       what the agent is asked (leading canary comment lines dropped)
//!     task.toml            the older schema (`version = "1.0"`, `memory = "2G"`) or the
//!                          current one (`schema_version = "1.1"`, `[task]`, `memory_mb`, ...)
//!     environment/         a Dockerfile and its build context (or `docker_image` in task.toml)
//!     solution/solve.sh    the oracle, with its files (uploaded to /solution)
//!     tests/test.sh        the verifier, with its files (placed at /tests only to verify)
//! ```
//!
//! Keys farm has no use for are kept in the task's metadata, never refused: real datasets
//! carry their own. What farm cannot honour is refused with the reason (GPUs, Windows,
//! multi-step tasks, separate verifier environments, compose files).

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::{DatasetError, Solution, Task, TaskFile, TestUser};

/// Where Harbor places a task's tests, solution and logs in the environment.
pub const TESTS: &str = "/tests";
pub const SOLUTION: &str = "/solution";
pub const VERIFIER_LOGS: &str = "/logs/verifier";
pub const AGENT_LOGS: &str = "/logs/agent";

/// What a Harbor task brings besides farm's common task fields.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HarborTask {
    pub environment: Environment,
    /// `[environment] workdir`: overrides the image's `WORKDIR` for every command.
    pub workdir: Option<String>,
    /// `[environment.env]`: every phase's environment.
    pub env: BTreeMap<String, String>,
    /// Whether the agent phase (and the verifier, as in Harbor) may reach the network:
    /// `allow_internet`, or `network_mode` ("no-network" is false).
    pub allow_internet: bool,
    /// `[environment] allowed_hosts` (`network_mode = "allowlist"`).
    pub allowed_hosts: Vec<String>,
    pub cpus: Option<u32>,
    pub memory_mib: Option<u32>,
    pub storage_mib: Option<u64>,
    pub build_timeout_secs: f64,
    /// `[agent] timeout_sec` (None: no limit of the task's own).
    pub agent_timeout_secs: Option<f64>,
    /// `[agent] user` (None: the image's `USER`).
    pub agent_user: Option<String>,
    pub verifier_timeout_secs: f64,
    pub verifier_env: BTreeMap<String, String>,
    /// `[verifier] user` (None: root, as farm runs every verifier).
    pub verifier_user: Option<String>,
    /// `[solution.env]`.
    pub solution_env: BTreeMap<String, String>,
    /// `artifacts`: paths collected after the agent phase.
    pub artifacts: Vec<String>,
}

/// Where a task's environment comes from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Environment {
    /// `environment/Dockerfile`, built with `environment/` as the context. `digest` covers
    /// every file of the folder, so a changed environment is a changed task.
    Dockerfile { dir: std::path::PathBuf, digest: String },
    /// `[environment] docker_image`: pulled, the Dockerfile (if any) ignored, as Harbor does
    /// without `--force-build`; when the image cannot be pulled, the Dockerfile (if any) is
    /// built instead.
    Image {
        reference: String,
        dockerfile: Option<Box<Environment>>,
    },
}

/// task.toml, both schemas (unknown keys collected, not refused).
#[derive(Debug, Default, Deserialize)]
struct TaskToml {
    version: Option<String>,
    schema_version: Option<String>,
    task: Option<PackageInfo>,
    #[serde(default)]
    metadata: toml::Table,
    #[serde(default)]
    agent: AgentToml,
    #[serde(default)]
    verifier: VerifierToml,
    #[serde(default)]
    environment: EnvironmentToml,
    #[serde(default)]
    solution: SolutionToml,
    #[serde(default)]
    artifacts: Vec<toml::Value>,
    steps: Option<toml::Value>,
    #[serde(flatten)]
    other: toml::Table,
}

#[derive(Debug, Default, Deserialize)]
struct PackageInfo {
    name: Option<String>,
    #[serde(default)]
    description: String,
    #[serde(flatten)]
    other: toml::Table,
}

#[derive(Debug, Default, Deserialize)]
struct AgentToml {
    timeout_sec: Option<f64>,
    user: Option<toml::Value>,
    #[serde(flatten)]
    other: toml::Table,
}

#[derive(Debug, Deserialize)]
struct VerifierToml {
    #[serde(default = "default_verifier_timeout")]
    timeout_sec: f64,
    #[serde(default)]
    env: BTreeMap<String, String>,
    user: Option<toml::Value>,
    environment_mode: Option<String>,
    environment: Option<toml::Value>,
    #[serde(flatten)]
    other: toml::Table,
}

impl Default for VerifierToml {
    fn default() -> Self {
        VerifierToml {
            timeout_sec: default_verifier_timeout(),
            env: BTreeMap::new(),
            user: None,
            environment_mode: None,
            environment: None,
            other: toml::Table::new(),
        }
    }
}

fn default_verifier_timeout() -> f64 {
    600.0
}

#[derive(Debug, Deserialize)]
struct EnvironmentToml {
    #[serde(default = "default_build_timeout")]
    build_timeout_sec: f64,
    docker_image: Option<String>,
    os: Option<String>,
    cpus: Option<u32>,
    memory_mb: Option<u32>,
    storage_mb: Option<u64>,
    memory: Option<String>,
    storage: Option<String>,
    gpus: Option<u32>,
    allow_internet: Option<bool>,
    network_mode: Option<String>,
    allowed_hosts: Option<Vec<String>>,
    workdir: Option<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    #[serde(flatten)]
    other: toml::Table,
}

impl Default for EnvironmentToml {
    fn default() -> Self {
        toml::from_str("").expect("every key has a default")
    }
}

fn default_build_timeout() -> f64 {
    600.0
}

#[derive(Debug, Default, Deserialize)]
struct SolutionToml {
    #[serde(default)]
    env: BTreeMap<String, String>,
    #[serde(flatten)]
    other: toml::Table,
}

/// Most bytes read from one task folder (tests and solution together).
const MAX_TASK_BYTES: u64 = 64 << 20;

pub fn load_harbor_dirs(root: &Path) -> Result<Vec<Task>, DatasetError> {
    crate::folder::task_folders(root)?
        .iter()
        .map(|dir| load_harbor_dir(dir))
        .collect()
}

/// A size that is not written as Harbor reads sizes.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0:?} is not a size like \"2G\", \"512M\" or \"4096K\"")]
pub struct NotASize(pub String);

/// A size as Harbor writes it (`"2G"`, `"512M"`, `"1.5g"`) in MiB.
pub fn size_to_mib(text: &str) -> Result<u64, NotASize> {
    let not_a_size = || NotASize(text.to_string());
    let upper = text.trim().to_ascii_uppercase();
    let (number, factor) = match upper.chars().last() {
        Some('G') => (&upper[..upper.len() - 1], 1024.0),
        Some('M') => (&upper[..upper.len() - 1], 1.0),
        Some('K') => (&upper[..upper.len() - 1], 1.0 / 1024.0),
        _ => return Err(not_a_size()),
    };
    let value: f64 = number.trim().parse().map_err(|_| not_a_size())?;
    if !(value.is_finite() && value >= 0.0) {
        return Err(not_a_size());
    }
    Ok((value * factor) as u64)
}

/// An `[*.env]` value that names a host variable the host does not have.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{key} = {value:?}: the host has no {name} and no default is given")]
pub struct MissingHostVariable {
    pub key: String,
    pub value: String,
    pub name: String,
}

/// `${VAR}` or `${VAR:-default}` (the whole value) from the host's environment, as Harbor
/// resolves `[*.env]` values; anything else is literal.
fn resolve_env(key: &str, value: &str) -> Result<String, MissingHostVariable> {
    let Some(inner) = value.strip_prefix("${").and_then(|v| v.strip_suffix('}')) else {
        return Ok(value.to_string());
    };
    let (name, default) = match inner.split_once(":-") {
        Some((name, default)) => (name, Some(default)),
        None => (inner, None),
    };
    match (std::env::var(name), default) {
        (Ok(v), _) => Ok(v),
        (Err(_), Some(d)) => Ok(d.to_string()),
        (Err(_), None) => Err(MissingHostVariable {
            key: key.to_string(),
            value: value.to_string(),
            name: name.to_string(),
        }),
    }
}

fn resolve_all(table: &str, env: &BTreeMap<String, String>) -> Result<BTreeMap<String, String>, MissingHostVariable> {
    env.iter()
        .map(|(k, v)| resolve_env(&format!("[{table}] {k}"), v).map(|v| (k.clone(), v)))
        .collect()
}

fn user_of(value: &Option<toml::Value>) -> Option<String> {
    match value {
        Some(toml::Value::String(s)) => Some(s.clone()),
        Some(toml::Value::Integer(n)) => Some(n.to_string()),
        _ => None,
    }
}

/// `instruction.md` without the leading canary comment lines (and the blank lines after).
fn strip_canary(text: &str) -> String {
    let mut lines = text.lines().peekable();
    let mut dropped = false;
    while let Some(line) = lines.peek() {
        let l = line.trim();
        let comment = l.starts_with('#') || l.starts_with("<!--");
        if comment && l.to_ascii_lowercase().contains("canary") {
            dropped = true;
            lines.next();
        } else if dropped && l.is_empty() {
            lines.next();
        } else {
            break;
        }
    }
    if !dropped {
        return text.to_string();
    }
    lines.collect::<Vec<_>>().join("\n") + if text.ends_with('\n') { "\n" } else { "" }
}

fn load_harbor_dir(dir: &Path) -> Result<Task, DatasetError> {
    let invalid = |message: String| DatasetError::Invalid {
        path: dir.to_path_buf(),
        message,
    };
    let instruction = std::fs::read_to_string(dir.join("instruction.md"))
        .map_err(|e| invalid(format!("instruction.md: {e} (every Harbor task needs one)")))?;
    let text = std::fs::read_to_string(dir.join("task.toml"))
        .map_err(|e| invalid(format!("task.toml: {e} (every Harbor task needs one)")))?;
    let config: TaskToml = toml::from_str(&text).map_err(|e| invalid(format!("task.toml: {e}")))?;
    let refused = |e: TaskTomlError| invalid(e.to_string());
    refuse_unsupported(&config).map_err(refused)?;
    let env_cfg = &config.environment;
    let memory_mib = memory_mib(env_cfg).map_err(refused)?;
    let storage_mib = storage_mib(env_cfg).map_err(refused)?;
    let allow_internet = allow_internet(env_cfg).map_err(refused)?;
    let environment = environment_of(dir, env_cfg).map_err(refused)?;
    let mut budget = MAX_TASK_BYTES;
    let tests =
        crate::folder::read_tree(&dir.join("tests"), &mut budget).map_err(|e| invalid(format!("tests/: {e}")))?;
    if !tests.iter().any(|t| t.path == "test.sh") {
        return Err(invalid("tests/test.sh is missing (the verifier)".into()));
    }
    let solution_files =
        crate::folder::read_tree(&dir.join("solution"), &mut budget).map_err(|e| invalid(format!("solution/: {e}")))?;
    let solution_env =
        resolve_all("solution.env", &config.solution.env).map_err(|e| invalid(format!("task.toml: {e}")))?;
    let solution = oracle_solution(&solution_files, &solution_env);
    let harbor = HarborTask {
        environment,
        workdir: env_cfg.workdir.clone(),
        env: resolve_all("environment.env", &env_cfg.env).map_err(|e| invalid(format!("task.toml: {e}")))?,
        allow_internet,
        allowed_hosts: env_cfg.allowed_hosts.clone().unwrap_or_default(),
        cpus: env_cfg.cpus,
        memory_mib,
        storage_mib,
        build_timeout_secs: env_cfg.build_timeout_sec,
        agent_timeout_secs: config.agent.timeout_sec,
        agent_user: user_of(&config.agent.user),
        verifier_timeout_secs: config.verifier.timeout_sec,
        verifier_env: resolve_all("verifier.env", &config.verifier.env)
            .map_err(|e| invalid(format!("task.toml: {e}")))?,
        verifier_user: user_of(&config.verifier.user),
        solution_env,
        artifacts: artifact_paths(&config.artifacts),
    };
    let id = config.task.as_ref().and_then(|t| t.name.clone()).unwrap_or_else(|| {
        dir.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    });
    Ok(Task {
        id,
        instruction: strip_canary(&instruction),
        files: Vec::new(),
        setup: Vec::new(),
        tests,
        test_command: None,
        test_user: TestUser::Root,
        harness: None,
        solution,
        expected_answer: None,
        answer_match: Default::default(),
        completion_file: None,
        completion_prefix: String::new(),
        require_reward_file: true,
        metadata: metadata(&config),
        harbor: Some(Box::new(harbor)),
    })
}

/// What in a task's `task.toml` (or its `environment/`) farm cannot take, said as the task
/// folder's error.
#[derive(Debug, thiserror::Error)]
enum TaskTomlError {
    #[error("task.toml: [environment] gpus = {0}: farm's microVMs have no GPUs; this task cannot run here")]
    Gpus(u32),
    #[error("task.toml: [environment] os = {0:?}: farm runs Linux guests only")]
    Os(String),
    #[error("task.toml: [[steps]] (multi-step tasks) are not supported")]
    Steps,
    #[error(
        "task.toml: a separate verifier environment is not supported (farm verifies in the task's own environment)"
    )]
    SeparateVerifier,
    #[error("task.toml: [environment] {0}: {1}")]
    Size(&'static str, NotASize),
    #[error("task.toml: [environment] network_mode = {0:?}: expected no-network, public or allowlist")]
    NetworkMode(String),
    #[error("environment/: {0}")]
    EnvironmentFolder(std::io::Error),
    #[error(
        "environment/docker-compose.yaml without a Dockerfile or docker_image: compose environments are not supported"
    )]
    ComposeOnly,
    #[error("environment/Dockerfile is missing and task.toml sets no [environment] docker_image")]
    NoEnvironment,
}

/// Refuses, with the reason, what a task asks of its environment that farm cannot honour:
/// GPUs, an OS other than Linux, several steps, a verifier environment of its own.
fn refuse_unsupported(config: &TaskToml) -> Result<(), TaskTomlError> {
    let env_cfg = &config.environment;
    if let Some(gpus) = env_cfg.gpus.filter(|g| *g > 0) {
        return Err(TaskTomlError::Gpus(gpus));
    }
    if let Some(os) = env_cfg.os.as_deref().filter(|os| !os.eq_ignore_ascii_case("linux")) {
        return Err(TaskTomlError::Os(os.to_string()));
    }
    if config.steps.is_some() {
        return Err(TaskTomlError::Steps);
    }
    if config.verifier.environment.is_some() || config.verifier.environment_mode.as_deref() == Some("separate") {
        return Err(TaskTomlError::SeparateVerifier);
    }
    Ok(())
}

/// `[environment] memory_mb`, else `memory` as a size.
fn memory_mib(env_cfg: &EnvironmentToml) -> Result<Option<u32>, TaskTomlError> {
    Ok(match (env_cfg.memory_mb, &env_cfg.memory) {
        (Some(mb), _) => Some(mb),
        (None, Some(text)) => Some(size_to_mib(text).map_err(|e| TaskTomlError::Size("memory", e))? as u32),
        (None, None) => None,
    })
}

/// `[environment] storage_mb`, else `storage` as a size.
fn storage_mib(env_cfg: &EnvironmentToml) -> Result<Option<u64>, TaskTomlError> {
    Ok(match (env_cfg.storage_mb, &env_cfg.storage) {
        (Some(mb), _) => Some(mb),
        (None, Some(text)) => Some(size_to_mib(text).map_err(|e| TaskTomlError::Size("storage", e))?),
        (None, None) => None,
    })
}

/// Whether the task may reach the network: `network_mode` when it is set, else
/// `allow_internet` (true by default).
fn allow_internet(env_cfg: &EnvironmentToml) -> Result<bool, TaskTomlError> {
    match (env_cfg.network_mode.as_deref(), env_cfg.allow_internet) {
        (Some("no-network"), _) => Ok(false),
        (Some("public" | "allowlist"), _) => Ok(true),
        (Some(other), _) => Err(TaskTomlError::NetworkMode(other.to_string())),
        (None, allow) => Ok(allow.unwrap_or(true)),
    }
}

/// Where the task's environment comes from: `docker_image` (with the Dockerfile, if any, to
/// fall back on), else `environment/Dockerfile`; a compose file alone is refused.
fn environment_of(dir: &Path, env_cfg: &EnvironmentToml) -> Result<Environment, TaskTomlError> {
    let env_dir = dir.join("environment");
    let dockerfile = if env_dir.join("Dockerfile").is_file() {
        let dir = std::fs::canonicalize(&env_dir).map_err(TaskTomlError::EnvironmentFolder)?;
        Some(Environment::Dockerfile {
            digest: tree_digest(&dir).map_err(TaskTomlError::EnvironmentFolder)?,
            dir,
        })
    } else {
        None
    };
    match (&env_cfg.docker_image, dockerfile) {
        (Some(reference), dockerfile) => Ok(Environment::Image {
            reference: reference.clone(),
            dockerfile: dockerfile.map(Box::new),
        }),
        (None, Some(dockerfile)) => Ok(dockerfile),
        (None, None)
            if env_dir.join("docker-compose.yaml").is_file() || env_dir.join("docker-compose.yml").is_file() =>
        {
            Err(TaskTomlError::ComposeOnly)
        }
        (None, None) => Err(TaskTomlError::NoEnvironment),
    }
}

/// The oracle, when `solution/` has a solve.sh: its files uploaded to [`SOLUTION`], run as
/// Harbor runs it ([`oracle_command`]).
fn oracle_solution(solution_files: &[TaskFile], solution_env: &BTreeMap<String, String>) -> Option<Solution> {
    solution_files.iter().any(|f| f.path == "solve.sh").then(|| Solution {
        files: solution_files
            .iter()
            .map(|f| TaskFile {
                path: format!("{SOLUTION}/{}", f.path),
                ..f.clone()
            })
            .collect(),
        commands: vec![oracle_command(solution_env)],
        answer: None,
    })
}

/// `artifacts`: each a path, or a table with its `source`.
fn artifact_paths(artifacts: &[toml::Value]) -> Vec<String> {
    artifacts
        .iter()
        .filter_map(|a| {
            a.as_str()
                .map(str::to_string)
                .or_else(|| a.get("source").and_then(|s| s.as_str()).map(str::to_string))
        })
        .collect()
}

/// Bytes of the end of solve.sh's output the oracle's step keeps (all of it stays in
/// `/logs/agent/oracle.txt`, collected with the run's artifacts).
pub const ORACLE_TAIL_BYTES: u32 = 16 << 10;

/// The oracle as Harbor runs it: `solve.sh` made executable and run through bash (a script
/// without `#!` is read by bash), with `DEBIAN_FRONTEND=noninteractive` and `[solution.env]`,
/// its output in `/logs/agent/oracle.txt`. The step then shows the end of that output and
/// ends with solve.sh's own exit status, so a solve.sh that failed half-way is seen.
fn oracle_command(env: &BTreeMap<String, String>) -> String {
    let quote = |s: &str| format!("'{}'", s.replace('\'', "'\\''"));
    let mut exports = String::from("export DEBIAN_FRONTEND=noninteractive; ");
    for (k, v) in env {
        exports.push_str(&format!("export {k}={}; ", quote(v)));
    }
    format!(
        "{exports}chmod +x {SOLUTION}/solve.sh && mkdir -p {AGENT_LOGS} && \
         {{ bash -c {SOLUTION}/solve.sh > {AGENT_LOGS}/oracle.txt 2>&1; status=$?; \
         tail -c {ORACLE_TAIL_BYTES} {AGENT_LOGS}/oracle.txt; exit $status; }}"
    )
}

/// Everything of task.toml farm does not use, for the rows' metadata: `[metadata]`, `[task]`
/// (name, description, authors, keywords...), the schema version and every unknown key.
fn metadata(config: &TaskToml) -> serde_json::Value {
    let mut out = serde_json::Map::new();
    let json = |t: &toml::Table| serde_json::to_value(t).unwrap_or(serde_json::Value::Null);
    for (k, v) in &config.metadata {
        out.insert(k.clone(), serde_json::to_value(v).unwrap_or_default());
    }
    if let Some(version) = config.schema_version.as_ref().or(config.version.as_ref()) {
        out.insert("harbor_schema_version".into(), version.clone().into());
    }
    if let Some(task) = &config.task {
        out.insert(
            "harbor_task".into(),
            serde_json::json!({ "name": task.name, "description": task.description, "other": json(&task.other) }),
        );
    }
    let unknown: Vec<(&str, &toml::Table)> = vec![
        ("", &config.other),
        ("agent", &config.agent.other),
        ("verifier", &config.verifier.other),
        ("environment", &config.environment.other),
        ("solution", &config.solution.other),
    ];
    let mut kept = serde_json::Map::new();
    for (table, keys) in unknown {
        for (k, v) in keys {
            let name = if table.is_empty() {
                k.clone()
            } else {
                format!("{table}.{k}")
            };
            kept.insert(name, serde_json::to_value(v).unwrap_or_default());
        }
    }
    if !kept.is_empty() {
        out.insert("harbor_other_keys".into(), serde_json::Value::Object(kept));
    }
    serde_json::Value::Object(out)
}

/// A digest of every file under `dir` (paths, modes and bytes), in order.
fn tree_digest(dir: &Path) -> std::io::Result<String> {
    let mut budget = u64::MAX;
    let files = crate::folder::read_tree(dir, &mut budget)?;
    let mut h = Sha256::new();
    for f in &files {
        h.update(f.path.as_bytes());
        h.update([0]);
        h.update(f.mode.to_le_bytes());
        h.update((f.contents.len() as u64).to_le_bytes());
        h.update(&f.contents);
    }
    Ok(format!("{:x}", h.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{load, Format};

    fn task_folder(root: &Path, name: &str, toml: &str) -> std::path::PathBuf {
        let t = root.join(name);
        for d in ["environment", "tests", "solution"] {
            std::fs::create_dir_all(t.join(d)).unwrap();
        }
        std::fs::write(
            t.join("instruction.md"),
            "<!-- BENCHMARK DATA SHOULD NEVER APPEAR. canary GUID 1234 -->\n\nFix the server.\n",
        )
        .unwrap();
        std::fs::write(t.join("task.toml"), toml).unwrap();
        std::fs::write(t.join("environment/Dockerfile"), "FROM farm:minimal\nWORKDIR /app\n").unwrap();
        std::fs::write(t.join("tests/test.sh"), "echo 1 > /logs/verifier/reward.txt\n").unwrap();
        std::fs::write(t.join("solution/solve.sh"), "echo solved\n").unwrap();
        t
    }

    const OLD: &str = "version = \"1.0\"\n[metadata]\ndifficulty = \"easy\"\ncategory = \"web\"\n[verifier]\ntimeout_sec = 120.0\n[agent]\ntimeout_sec = 900.0\n[environment]\nbuild_timeout_sec = 600.0\nmemory = \"2G\"\nstorage = \"10G\"\n";
    const NEW: &str = "schema_version = \"1.1\"\nartifacts = [\"/srv/out.log\"]\nfuture_key = 7\n[task]\nname = \"farm/serve-it\"\ndescription = \"a server\"\nauthors = [{ name = \"A\" }]\n\
        [agent]\ntimeout_sec = 600.0\nuser = \"app\"\n[verifier]\ntimeout_sec = 300.0\nenv = { MODE = \"strict\", TOKEN = \"${FARM_HARBOR_TEST_TOKEN:-none}\" }\n\
        [environment]\ncpus = 2\nmemory_mb = 1024\nstorage_mb = 4096\ngpus = 0\nallow_internet = false\nmcp_servers = []\nworkdir = \"/srv\"\n[environment.env]\nA = \"1\"\n\
        [solution.env]\nS = \"it's\"\n";

    #[test]
    fn both_task_toml_schemas_load_and_unknown_keys_become_metadata() {
        let root = tempfile::tempdir().unwrap();
        task_folder(root.path(), "a-old", OLD);
        task_folder(root.path(), "b-new", NEW);
        let tasks = load(root.path(), Format::Harbor).unwrap();
        let (old, new) = (&tasks[0], &tasks[1]);
        assert_eq!(old.id, "a-old");
        assert_eq!(old.instruction, "Fix the server.\n", "the canary is dropped");
        let h = old.harbor.as_ref().unwrap();
        assert_eq!(
            (
                h.memory_mib,
                h.storage_mib,
                h.verifier_timeout_secs,
                h.agent_timeout_secs
            ),
            (Some(2048), Some(10240), 120.0, Some(900.0))
        );
        assert!(h.allow_internet);
        assert!(matches!(&h.environment, Environment::Dockerfile { .. }));
        let with_image = task_folder(
            root.path(),
            "c-image",
            "[environment]\ndocker_image = \"reg.lan/app:1\"\n",
        );
        let task = crate::harbor::load_harbor_dir(&with_image).unwrap();
        assert!(
            matches!(&task.harbor.as_ref().unwrap().environment, Environment::Image { reference, dockerfile: Some(_) } if reference == "reg.lan/app:1"),
            "the Dockerfile is kept for when the image cannot be pulled"
        );
        assert_eq!(old.metadata["difficulty"], "easy");
        assert_eq!(old.tests[0].path, "test.sh");
        assert!(old.solution.as_ref().unwrap().commands[0].contains("bash -c /solution/solve.sh"));

        assert_eq!(new.id, "farm/serve-it");
        let h = new.harbor.as_ref().unwrap();
        assert_eq!(
            (
                h.cpus,
                h.memory_mib,
                h.storage_mib,
                h.workdir.as_deref(),
                h.agent_user.as_deref()
            ),
            (Some(2), Some(1024), Some(4096), Some("/srv"), Some("app"))
        );
        assert!(!h.allow_internet);
        assert_eq!(
            h.verifier_env["TOKEN"], "none",
            "a ${{VAR:-default}} value without the variable on the host"
        );
        assert_eq!(h.artifacts, ["/srv/out.log"]);
        assert!(new.solution.as_ref().unwrap().commands[0].contains("export S='it'\\''s'"));
        assert_eq!(new.metadata["harbor_other_keys"]["future_key"], 7);
        assert_eq!(
            new.metadata["harbor_other_keys"]["environment.mcp_servers"],
            serde_json::json!([])
        );
        assert_eq!(new.metadata["harbor_task"]["description"], "a server");
        assert!(new.has_tests());
    }

    #[test]
    fn what_farm_cannot_honour_is_refused_with_the_reason() {
        let root = tempfile::tempdir().unwrap();
        let cases = [
            ("[environment]\ngpus = 1\n", "gpus = 1: farm's microVMs have no GPUs"),
            ("[environment]\nmemory = \"2GB\"\n", "memory: \"2GB\" is not a size"),
            ("[environment]\nos = \"windows\"\n", "Linux guests only"),
            ("[[steps]]\nname = \"one\"\n", "multi-step"),
            (
                "[environment]\nnetwork_mode = \"bridge\"\n",
                "network_mode = \"bridge\": expected no-network, public or allowlist",
            ),
            (
                "[verifier]\nenvironment_mode = \"separate\"\n",
                "separate verifier environment",
            ),
            (
                "[verifier.env]\nK = \"${FARM_SURELY_UNSET_VARIABLE}\"\n",
                "[verifier.env] K = \"${FARM_SURELY_UNSET_VARIABLE}\": the host has no FARM_SURELY_UNSET_VARIABLE",
            ),
        ];
        for (toml, expected) in cases {
            let dir = task_folder(root.path(), "t", toml);
            let err = load(root.path(), Format::Harbor).unwrap_err().to_string();
            assert!(err.contains(expected) && err.contains("/t"), "{toml}: {err}");
            std::fs::remove_dir_all(dir).unwrap();
        }
        // An environment folder with a compose file and no Dockerfile, then with neither.
        let dir = task_folder(root.path(), "t", "");
        std::fs::remove_file(dir.join("environment/Dockerfile")).unwrap();
        std::fs::write(dir.join("environment/docker-compose.yaml"), "services: {}\n").unwrap();
        let err = load(root.path(), Format::Harbor).unwrap_err().to_string();
        assert!(err.contains("compose environments are not supported"), "{err}");
        std::fs::remove_file(dir.join("environment/docker-compose.yaml")).unwrap();
        let err = load(root.path(), Format::Harbor).unwrap_err().to_string();
        assert!(err.contains("environment/Dockerfile is missing"), "{err}");
        std::fs::remove_dir_all(dir).unwrap();
        let dir = task_folder(root.path(), "t", "");
        std::fs::remove_file(dir.join("tests/test.sh")).unwrap();
        assert!(load(root.path(), Format::Harbor)
            .unwrap_err()
            .to_string()
            .contains("tests/test.sh is missing"));
    }

    #[test]
    fn sizes_as_harbor_reads_them() {
        assert_eq!(size_to_mib("2G").unwrap(), 2048);
        assert_eq!(size_to_mib("1.5g").unwrap(), 1536);
        assert_eq!(size_to_mib("512M").unwrap(), 512);
        assert_eq!(size_to_mib("4096k").unwrap(), 4);
        for bad in ["2GB", "2Gi", "2048", "-1G"] {
            assert!(size_to_mib(bad).is_err(), "{bad}");
        }
    }
}
