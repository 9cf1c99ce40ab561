//! Verifying a Harbor task as Harbor does, with what farm adds: `tests/` placed at `/tests`
//! only now, `/logs/verifier` emptied and made afresh (a reward file planted earlier counts
//! for nothing), `bash /tests/test.sh` as the verifier user (root by default) in the working
//! folder with `[verifier.env]` and the verifier's own egress, bounded by its timeout; then
//! every process left in the VM is killed, and only then is `reward.json` or `reward.txt`
//! read.
//!
//! The VM is the rollout's own (`live`: the agent's processes are alive while `test.sh`
//! runs, as Harbor verifies), or a fresh boot of its final disk (`fresh_boot`: no process
//! of the agent's is alive). Either way the agent had root on that disk, so the verdict is
//! only hardened: see `docs/security.md`.

use std::collections::BTreeMap;
use std::time::Duration;

use datasets::harbor::{TESTS, VERIFIER_LOGS};
use datasets::{HarborTask, Task};
use serde::{Deserialize, Serialize};
use vmm::{ExecOptions, ExecOutput, Machine};

use crate::{Details, TestOutcome, Trust, TrustLevel, Verdict};

/// Where a Harbor task's tests run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum HarborVerify {
    /// In the rollout's VM after the agent's phase, its processes alive (Harbor's way).
    #[default]
    Live,
    /// In a VM booted afresh from the rollout's final disk: files only.
    FreshBoot,
}

impl HarborVerify {
    pub fn trust(self) -> TrustLevel {
        match self {
            HarborVerify::Live => TrustLevel { level: Trust::Hardened, reason: "Harbor live verification: the agent's processes were alive while test.sh ran, in a VM it had root in" },
            HarborVerify::FreshBoot => TrustLevel { level: Trust::Hardened, reason: "Harbor fresh-boot verification: test.sh ran on the disk the agent left, with root on it" },
        }
    }
}

/// How the verifier runs in this VM.
pub struct VerifyRun<'a> {
    pub mode: HarborVerify,
    /// The working folder (`[environment] workdir`, else the image's `WORKDIR`).
    pub workdir: &'a str,
    /// The image's `Env` and `[environment.env]`, in order.
    pub env: &'a [(String, String)],
    /// The verifier's egress (`host:port`), empty for none.
    pub network: &'a [String],
    pub pass_threshold: f64,
}

/// Most bytes of `reward.json` read.
const MAX_REWARD_BYTES: u64 = 64 << 10;

/// Why a Harbor verification gave no verdict: the one failure that is not the agent's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    /// A host the verifier's network names (exactly, not through `*`) failed on the host's
    /// side while test.sh ran (resolving it, connecting, TLS with it), and the tests failed:
    /// a dependency of the verifier's was down, which nothing the agent did can cause.
    #[error("the verifier's network: {target} failed on the host's side while test.sh ran ({detail}); the tests' verdict does not count")]
    DependencyDown { target: String, detail: String },
}

/// Runs the task's verifier in `fork` and reads its reward. Every failure on the VM's side
/// is the agent's (it had the VM), scored 0 with the reason; only a dependency the
/// verifier's network names that fails on the host's side is not ([`VerifyError`]).
pub async fn verify(
    machine: &Machine,
    task: &Task,
    harbor: &HarborTask,
    run: &VerifyRun<'_>,
) -> Result<Verdict, VerifyError> {
    let attempts: std::sync::Arc<std::sync::Mutex<Vec<egress::Attempt>>> = Default::default();
    let verdict = verify_with(machine, task, harbor, run, &attempts).await;
    if verdict.passed {
        return Ok(verdict);
    }
    let attempts = attempts.lock().unwrap_or_else(|p| p.into_inner()).clone();
    match dependency_down(&attempts, run.network) {
        Some((target, detail)) => Err(VerifyError::DependencyDown { target, detail }),
        None => Ok(verdict),
    }
}

/// [`verify`], then [`collect_logs`] from the same VM (after the verifier, as Harbor does).
pub async fn verify_and_collect(
    machine: &Machine,
    task: &Task,
    harbor: &HarborTask,
    run: &VerifyRun<'_>,
) -> (Result<Verdict, VerifyError>, Logs) {
    let verified = verify(machine, task, harbor, run).await;
    (verified, collect_logs(machine, harbor).await)
}

/// The first attempt that failed on the host's side (before any request: resolving,
/// connecting, TLS) at a `host:port` that `network` names exactly.
fn dependency_down(attempts: &[egress::Attempt], network: &[String]) -> Option<(String, String)> {
    attempts.iter().find_map(|a| match &a.verdict {
        egress::Verdict::UpstreamFailed { failure, detail }
            if failure.before_the_request() && network.iter().any(|n| n.eq_ignore_ascii_case(&a.target)) =>
        {
            Some((a.target.clone(), detail.clone()))
        }
        _ => None,
    })
}

async fn verify_with(
    machine: &Machine,
    task: &Task,
    harbor: &HarborTask,
    run: &VerifyRun<'_>,
    attempts: &std::sync::Arc<std::sync::Mutex<Vec<egress::Attempt>>>,
) -> Verdict {
    let trust = run.mode.trust();
    let failed = |reason: String| crate::orchestrate::agent_failure(reason, trust);
    if let Err(broke) = place_verifier_tests(machine, task).await {
        return failed(broke.to_string());
    }
    let out = match run_test_sh(machine, harbor, run, attempts).await {
        Ok(out) => out,
        Err(broke) => return failed(broke.to_string()),
    };
    // Everything test.sh started, and every process the agent left, is gone before the
    // reward is read: nothing rewrites it between the reading and the verdict.
    let swept = match machine.agent().sweep(Vec::new()).await {
        Ok((n, true)) => n,
        Ok((_, false)) => return failed("processes survived every attempt to kill them after test.sh ended".into()),
        Err(e) => return failed(format!("killing the processes left after test.sh: {e}")),
    };
    let tail = |b: &[u8]| {
        let text = String::from_utf8_lossy(b);
        let chars: Vec<char> = text.chars().collect();
        chars[chars.len().saturating_sub(2000)..].iter().collect::<String>()
    };
    let mut outcome = TestOutcome {
        exit_code: out.result.exit_code,
        signal: out.result.signal,
        timed_out: out.result.timed_out,
        junit: None,
        reward_file: None,
        swept,
        harness: Vec::new(),
        junit_unread: None,
        stdout_tail: tail(&out.stdout),
        stderr_tail: tail(&out.stderr),
        reset: None,
    };
    let zero = |outcome: TestOutcome, basis: String, timed_out: bool| Verdict {
        reward: 0.0,
        passed: false,
        timed_out,
        trust,
        details: Details {
            tests: Some(outcome),
            ..Details::basis(basis)
        },
    };
    if out.result.timed_out {
        let basis = format!("test.sh ran past its {} s limit", harbor.verifier_timeout_secs);
        return zero(outcome, basis, true);
    }
    let reward = match read_reward(machine).await {
        Ok(reward) => reward,
        Err(reason) => return zero(outcome, reason.to_string(), false),
    };
    outcome.reward_file = Some(reward.value);
    let basis = format!("{} (test.sh exited with {})", reward.basis, out.shell_exit_code());
    let details = Details {
        tests: Some(outcome),
        harbor_rewards: reward.all,
        ..Details::basis(basis)
    };
    Verdict {
        reward: reward.value,
        passed: reward.value >= run.pass_threshold,
        timed_out: false,
        trust,
        details,
    }
}

/// The tests go in only now; whatever the agent left at /tests or in /logs/verifier goes.
/// An error is the agent's failure (it had the VM).
async fn place_verifier_tests(machine: &Machine, task: &Task) -> Result<(), VerifierBroke> {
    let agent = machine.agent();
    for path in [TESTS, VERIFIER_LOGS] {
        agent
            .remove_tree(path)
            .await
            .map_err(|error| VerifierBroke::Clearing { path, error })?;
    }
    for test in &task.tests {
        agent
            .write_file(
                &format!("{TESTS}/{}", test.path),
                test.contents.clone(),
                test.mode | 0o400,
            )
            .await
            .map_err(VerifierBroke::PlacingTests)?;
    }
    let prepare = ExecOptions::argv(&[
        "sh",
        "-c",
        &format!("mkdir -p {VERIFIER_LOGS} && chmod 777 {VERIFIER_LOGS} && chmod +x {TESTS}/test.sh"),
    ]);
    match agent.exec(prepare).await {
        Ok(out) if out.result.exit_code == Some(0) => Ok(()),
        Ok(out) => Err(VerifierBroke::MakingLogs(
            String::from_utf8_lossy(&out.stderr).trim().to_string(),
        )),
        Err(e) => Err(VerifierBroke::MakingLogs(e.to_string())),
    }
}

/// How a rollout's VM failed the verifier before test.sh gave an answer: the agent's
/// failure (it had the VM).
#[derive(Debug, thiserror::Error)]
enum VerifierBroke {
    #[error("clearing {path} before the verifier: {error}")]
    Clearing { path: &'static str, error: vmm::AgentError },
    #[error("placing the tests: {0}")]
    PlacingTests(vmm::AgentError),
    #[error("making {VERIFIER_LOGS}: {0}")]
    MakingLogs(String),
    #[error("the VM broke while test.sh ran: {0}")]
    TestSh(String),
}

/// Runs test.sh with the verifier's environment and network; an error (the VM broke under
/// it) is the agent's failure.
async fn run_test_sh(
    machine: &Machine,
    harbor: &HarborTask,
    run: &VerifyRun<'_>,
    attempts: &std::sync::Arc<std::sync::Mutex<Vec<egress::Attempt>>>,
) -> Result<ExecOutput, VerifierBroke> {
    let mut env: Vec<(String, String)> = run.env.to_vec();
    env.extend(harbor.verifier_env.iter().map(|(k, v)| (k.clone(), v.clone())));
    // The verifier's network is exactly its own: none when `[harbor.verifier_network]` is
    // absent, never what the agent had. Its attempts are kept to tell a dependency that was
    // down from a failure of the agent's.
    let sink = attempts.clone();
    machine.set_network(egress::Policy {
        allow: run.network.to_vec(),
        log: Some(std::sync::Arc::new(move |attempt: &egress::Attempt| {
            sink.lock().unwrap_or_else(|p| p.into_inner()).push(attempt.clone())
        })),
        ..Default::default()
    });
    if !run.network.is_empty() {
        env.extend(snapshotter::template::proxy_env());
    }
    let timeout = Duration::from_secs_f64(harbor.verifier_timeout_secs.max(1.0));
    let options = ExecOptions {
        cwd: Some(run.workdir.to_string()),
        env,
        user: harbor.verifier_user.clone().filter(|u| u != "root" && u != "0"),
        timeout: Some(timeout),
        stdout_cap: 64 << 10,
        stderr_cap: 64 << 10,
        ..ExecOptions::argv(&["bash", "-c", &format!("{TESTS}/test.sh")])
    };
    let out = machine.agent().exec(options).await;
    machine.set_network(egress::Policy::default());
    out.map_err(|e| VerifierBroke::TestSh(machine.limit_violation().unwrap_or_else(|| e.to_string())))
}

/// Harbor's logs and artifacts of a rollout, as collected from its VM after verification:
/// `agent/` (`/logs/agent`: the oracle's output, an agent's logs), `verifier/`
/// (`/logs/verifier`: ctrf.json, the reward file, test.sh's own logs), and `artifacts/`
/// (`/logs/artifacts`, and each path task.toml's `artifacts` names, under its base name).
/// The contents are the agent's (it had the VM), so they are data only: paths are checked
/// and capped, and files and totals are capped.
#[derive(Debug, Clone, Default)]
pub struct Logs {
    pub files: Vec<LogFile>,
    /// What was left out, and why (a cap reached, a path that could not be read).
    pub notes: Vec<String>,
}

/// One collected file: its path under the rollout's folder (`agent/oracle.txt`), its size in
/// the VM, and the bytes kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogFile {
    pub path: String,
    pub size: u64,
    pub bytes: Vec<u8>,
}

impl Logs {
    /// What the row says of them: the run folder's `folder` holds them.
    pub fn record(&self, folder: String) -> LogsRecord {
        LogsRecord {
            folder,
            files: self
                .files
                .iter()
                .map(|f| LogEntry {
                    path: f.path.clone(),
                    size: f.size,
                    kept: f.bytes.len() as u64,
                })
                .collect(),
            notes: self.notes.clone(),
        }
    }
}

/// [`Logs`] as a row's `score_details` records them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LogsRecord {
    /// Under the run folder (`artifacts/<task>-<hash>-<sample>`).
    pub folder: String,
    pub files: Vec<LogEntry>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LogEntry {
    pub path: String,
    pub size: u64,
    pub kept: u64,
}

/// Most files collected per folder, bytes kept per file, and bytes kept in all.
pub const LOG_FILES: u32 = 512;
pub const LOG_FILE_BYTES: u64 = 1 << 20;
pub const LOG_TOTAL_BYTES: u64 = 16 << 20;

/// Whether `path` (from the VM's listing) is a plain relative path: components that are
/// neither empty, `.` nor `..`, of printable characters other than `\`.
pub fn plain_relative_path(path: &str) -> bool {
    !path.is_empty()
        && path.len() <= 1024
        && path
            .split('/')
            .all(|c| !c.is_empty() && c != "." && c != ".." && c.chars().all(|ch| !ch.is_control() && ch != '\\'))
}

/// Collects Harbor's log folders and the task's `artifacts` from `machine`.
pub async fn collect_logs(machine: &Machine, harbor: &HarborTask) -> Logs {
    let mut logs = Logs::default();
    let mut total = 0u64;
    let mut roots: Vec<(String, String)> = vec![
        (datasets::harbor::AGENT_LOGS.to_string(), "agent".into()),
        (VERIFIER_LOGS.to_string(), "verifier".into()),
        ("/logs/artifacts".to_string(), "artifacts".into()),
    ];
    for path in &harbor.artifacts {
        let name = path.trim_end_matches('/').rsplit('/').next().unwrap_or("").to_string();
        if plain_relative_path(&name) {
            roots.push((path.clone(), format!("artifacts/{name}")));
        } else {
            logs.notes
                .push(format!("artifacts entry {path:?} has no usable base name"));
        }
    }
    let agent = machine.agent();
    for (root, prefix) in roots {
        let mut keep = |logs: &mut Logs, path: String, size: u64, bytes: Vec<u8>| {
            if total + bytes.len() as u64 > LOG_TOTAL_BYTES {
                logs.notes
                    .push(format!("{path}: left out, past the {LOG_TOTAL_BYTES}-byte total"));
                return;
            }
            if size > bytes.len() as u64 {
                logs.notes
                    .push(format!("{path}: {size} bytes, the first {} kept", bytes.len()));
            }
            total += bytes.len() as u64;
            logs.files.push(LogFile { path, size, bytes });
        };
        match agent.list_files(&root, LOG_FILES).await {
            Ok((entries, truncated)) => {
                if truncated {
                    logs.notes
                        .push(format!("{root}: more than {LOG_FILES} files, the first kept"));
                }
                for entry in entries {
                    if !plain_relative_path(&entry.path) {
                        logs.notes
                            .push(format!("{root}: a path that is not plain was left out"));
                        continue;
                    }
                    match agent.read_file_beneath(&entry.path, LOG_FILE_BYTES, Some(&root)).await {
                        Ok((bytes, size)) => keep(&mut logs, format!("{prefix}/{}", entry.path), size, bytes),
                        Err(e) => logs.notes.push(format!("{root}/{}: {e}", entry.path)),
                    }
                }
            }
            // Not a folder: a file task.toml names, or nothing there.
            Err(_) => match agent.read_file(&root, LOG_FILE_BYTES).await {
                Ok((bytes, size)) => keep(&mut logs, prefix, size, bytes),
                Err(_) if !prefix.starts_with("artifacts/") => {} // a log folder nobody wrote
                Err(e) => logs.notes.push(format!("{root}: {e}")),
            },
        }
    }
    logs
}

/// Why no reward could be read from `/logs/verifier`: the verdict is 0, with this reason.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RewardError {
    #[error("test.sh wrote neither /logs/verifier/reward.json nor /logs/verifier/reward.txt")]
    NoFile,
    #[error("reward.json is {size} bytes, over the {MAX_REWARD_BYTES} bytes farm reads")]
    TooLarge { size: u64 },
    #[error("reward.json is not JSON: {0}")]
    NotJson(String),
    #[error("reward.json is not a JSON object of numbers")]
    NotAnObject,
    #[error("reward.json is an empty object")]
    Empty,
    #[error("reward.json: {key:?} is not a number")]
    NotANumber { key: String },
    #[error("reward.txt holds {0:?}, not a number")]
    TextNotANumber(String),
    #[error("{what} is {value}, outside [0, 1]")]
    OutOfRange { what: String, value: f64 },
}

/// A reward read from `/logs/verifier`.
#[derive(Debug, PartialEq)]
struct Reward {
    value: f64,
    basis: String,
    /// Every key of `reward.json`.
    all: Option<BTreeMap<String, f64>>,
}

async fn read_reward(machine: &Machine) -> Result<Reward, RewardError> {
    let agent = machine.agent();
    let json_path = format!("{VERIFIER_LOGS}/reward.json");
    if let Ok((bytes, size)) = agent.read_file(&json_path, MAX_REWARD_BYTES).await {
        if size > MAX_REWARD_BYTES {
            return Err(RewardError::TooLarge { size });
        }
        return parse_reward_json(&bytes);
    }
    match agent.read_file(&format!("{VERIFIER_LOGS}/reward.txt"), 4096).await {
        Ok((bytes, _)) => parse_reward_txt(&bytes),
        Err(_) => Err(RewardError::NoFile),
    }
}

/// `reward.txt`: one number in [0, 1] (surrounding whitespace allowed).
fn parse_reward_txt(bytes: &[u8]) -> Result<Reward, RewardError> {
    let text = String::from_utf8_lossy(bytes);
    let value: f64 = text
        .trim()
        .parse()
        .map_err(|_| RewardError::TextNotANumber(text.trim().chars().take(100).collect()))?;
    check_range("reward.txt", value)?;
    Ok(Reward {
        value,
        basis: format!("reward.txt: {value}"),
        all: None,
    })
}

/// `reward.json`: an object of numbers (Harbor's form). The reward is its `reward` key, else
/// its only key, else the mean of its values; every key is kept in the details.
fn parse_reward_json(bytes: &[u8]) -> Result<Reward, RewardError> {
    let value: serde_json::Value = serde_json::from_slice(bytes).map_err(|e| RewardError::NotJson(e.to_string()))?;
    let object = value.as_object().ok_or(RewardError::NotAnObject)?;
    let mut all = BTreeMap::new();
    for (key, v) in object {
        let number = match v {
            serde_json::Value::Number(n) => n.as_f64(),
            serde_json::Value::Bool(b) => Some(if *b { 1.0 } else { 0.0 }),
            serde_json::Value::String(s) => s.trim().parse().ok(),
            _ => None,
        };
        let number = number.ok_or_else(|| RewardError::NotANumber { key: key.clone() })?;
        check_range(&format!("reward.json: {key:?}"), number)?;
        all.insert(key.clone(), number);
    }
    let (value, basis) = match (all.get("reward"), all.len()) {
        (Some(r), _) => (*r, "reward.json: reward".to_string()),
        (None, 1) => {
            let (k, v) = all.iter().next().expect("one key");
            (*v, format!("reward.json: {k}"))
        }
        (None, 0) => return Err(RewardError::Empty),
        (None, n) => (
            all.values().sum::<f64>() / n as f64,
            format!("reward.json: the mean of {n} keys"),
        ),
    };
    Ok(Reward {
        value,
        basis,
        all: Some(all),
    })
}

fn check_range(what: &str, value: f64) -> Result<(), RewardError> {
    if value.is_finite() && (0.0..=1.0).contains(&value) {
        Ok(())
    } else {
        Err(RewardError::OutOfRange {
            what: what.to_string(),
            value,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_named_dependency_down_on_the_hosts_side_is_not_the_agents_failure() {
        let failed = |target: &str, failure| egress::Attempt {
            target: target.into(),
            verdict: egress::Verdict::UpstreamFailed {
                failure,
                detail: "connection refused".into(),
            },
        };
        let network = ["deps.internal:443".to_string()];
        let down = [failed("deps.internal:443", egress::UpstreamFailure::Connect)];
        assert_eq!(
            dependency_down(&down, &network).map(|(t, _)| t).as_deref(),
            Some("deps.internal:443")
        );
        // Not named exactly (an allow of "*" lets the agent's leftovers point anywhere),
        // an exchange that failed after its request, or a denial: the agent's failure.
        assert!(dependency_down(&down, &["*".to_string()]).is_none());
        assert!(dependency_down(
            &[failed("deps.internal:443", egress::UpstreamFailure::Exchange)],
            &network
        )
        .is_none());
        let denied = egress::Attempt {
            target: "elsewhere:80".into(),
            verdict: egress::Verdict::Denied {
                reason: "not allowed".into(),
            },
        };
        assert!(dependency_down(&[denied], &network).is_none());
    }

    #[test]
    fn reward_files_in_harbors_forms() {
        assert_eq!(parse_reward_txt(b" 1\n").unwrap().value, 1.0);
        assert_eq!(parse_reward_txt(b"0.25").unwrap().value, 0.25);
        for bad in [&b"yes"[..], b"", b"1.5", b"nan", b"-0.1"] {
            assert!(parse_reward_txt(bad).is_err(), "{bad:?}");
        }
        let r = parse_reward_json(br#"{"reward": 0.5, "tests_passed": 3}"#);
        assert!(r
            .unwrap_err()
            .to_string()
            .contains("\"tests_passed\" is 3, outside [0, 1]"));
        let r = parse_reward_json(br#"{"reward": 0.5, "style": 1}"#).unwrap();
        assert_eq!((r.value, r.all.unwrap().len()), (0.5, 2));
        assert_eq!(parse_reward_json(br#"{"accuracy": "0.75"}"#).unwrap().value, 0.75);
        assert_eq!(parse_reward_json(br#"{"a": 1, "b": 0}"#).unwrap().value, 0.5);
        assert_eq!(parse_reward_json(br#"{"a": true}"#).unwrap().value, 1.0);
        for bad in [&br#"[1]"#[..], br#"{"a": null}"#, br#"{}"#, b"not json"] {
            assert!(parse_reward_json(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
    }
}
