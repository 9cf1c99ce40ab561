//! Hidden tests in a fresh fork of the pristine task snapshot.

use std::time::Duration;

use datasets::{Task, TESTS_DIR, WORKSPACE};
use serde::Serialize;
use serde_json::json;
use vmm::{AgentClient, AgentError, ExecOptions};

use crate::{Artifacts, Verdict};

/// What the tests produced.
#[derive(Debug, Clone, Serialize)]
pub struct TestOutcome {
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub timed_out: bool,
    /// `tests`, `failures`, `errors`, `skipped` from a JUnit XML report the tests wrote.
    pub junit: Option<JunitCounts>,
    /// The number the tests wrote to the reward file, if they created it.
    pub reward_file: Option<f64>,
    pub stdout_tail: String,
    pub stderr_tail: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct JunitCounts {
    pub tests: u64,
    pub failures: u64,
    pub errors: u64,
    pub skipped: u64,
}

/// Where the tests may write a JUnit report (`FARM_JUNIT_FILE`). The reward file
/// (`FARM_REWARD_FILE`) gets a fresh random name under the tests folder for every scoring
/// run, so nothing the agent left behind can be it. Neither exists before the tests run.
pub const JUNIT_FILE: &str = "/opt/farm-tests/junit.xml";

fn reward_file_path() -> String {
    use std::io::Read;
    let mut nonce = [0u8; 12];
    let _ = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut nonce));
    let hex: String = nonce.iter().map(|b| format!("{b:02x}")).collect();
    format!("{TESTS_DIR}/.reward-{hex}")
}

/// Why scoring did not produce an outcome.
#[derive(Debug, thiserror::Error)]
pub enum ScoringError {
    /// The scoring VM failed before any of the agent's code could run: the farm's fault.
    #[error("the scoring VM failed: {0}")]
    Environment(#[source] AgentError),
    /// The agent's work could not be placed, or its code (run by the tests) broke the scoring
    /// VM: the agent's fault, scored as a failure.
    #[error("{0}")]
    Agent(String),
}

/// Writes the artifacts, then the hidden tests, into the scoring VM and runs the task's test
/// command. Until the tests start, a broken VM is an environment error; an artifact the VM
/// refuses (say, a file where the pristine workspace has a folder) and anything that goes
/// wrong once the agent's code runs under the tests are the agent's failures.
pub async fn run_tests(agent: &AgentClient, task: &Task, artifacts: &Artifacts, timeout: Duration) -> Result<TestOutcome, ScoringError> {
    let placing = |e: AgentError| match e {
        AgentError::Refused { message, .. } => ScoringError::Agent(format!("the agent's files could not be placed: {message}")),
        other => ScoringError::Environment(other),
    };
    for path in &artifacts.deleted {
        agent.remove_file(&format!("{WORKSPACE}/{path}")).await.map_err(placing)?;
    }
    for (path, contents, mode) in &artifacts.files {
        agent.write_file(&format!("{WORKSPACE}/{path}"), contents.clone(), *mode).await.map_err(placing)?;
    }
    // Only now, with the agent's work in place, do the tests appear. (In a fresh fork their
    // folder does not exist; final-state scoring clears it first, see farm's run module.)
    for test in &task.tests {
        agent
            .write_file(&format!("{TESTS_DIR}/{}", test.path), test.contents.clone(), test.mode | 0o400)
            .await
            .map_err(ScoringError::Environment)?;
    }
    let reward_path = reward_file_path();
    let command = task.test_command.clone().unwrap_or_else(|| "false".into());
    let options = ExecOptions {
        cwd: Some(WORKSPACE.into()),
        env: vec![
            ("FARM_TESTS_DIR".into(), TESTS_DIR.into()),
            ("FARM_REWARD_FILE".into(), reward_path.clone()),
            ("FARM_JUNIT_FILE".into(), JUNIT_FILE.into()),
        ],
        timeout: Some(timeout),
        stdout_cap: 64 << 10,
        stderr_cap: 64 << 10,
        ..ExecOptions::shell(command)
    };
    // From here on the agent's code runs: whatever breaks is on the agent.
    let broke = |e: AgentError| ScoringError::Agent(format!("the scoring VM broke while the tests ran the agent's code: {e}"));
    let out = agent.exec(options).await.map_err(broke)?;
    let reward_file = match agent.read_file(&reward_path, 4096).await {
        Ok((bytes, _)) => String::from_utf8_lossy(&bytes).trim().parse::<f64>().ok().filter(|r| r.is_finite()),
        Err(AgentError::Refused { .. }) => None,
        Err(e) => return Err(broke(e)),
    };
    let junit = match agent.read_file(JUNIT_FILE, 4 << 20).await {
        Ok((bytes, _)) => parse_junit(&String::from_utf8_lossy(&bytes)),
        Err(AgentError::Refused { .. }) => None,
        Err(e) => return Err(broke(e)),
    };
    Ok(TestOutcome {
        exit_code: out.result.exit_code,
        signal: out.result.signal,
        timed_out: out.result.timed_out,
        junit,
        reward_file,
        stdout_tail: tail(&out.stdout, 2000),
        stderr_tail: tail(&out.stderr, 2000),
    })
}

fn tail(bytes: &[u8], n: usize) -> String {
    let text = String::from_utf8_lossy(bytes);
    let chars: Vec<char> = text.chars().collect();
    chars[chars.len().saturating_sub(n)..].iter().collect()
}

/// Sums the counts of every `<testsuite>` (or a lone `<testsuites>`) in a JUnit report.
pub fn parse_junit(xml: &str) -> Option<JunitCounts> {
    let mut counts = JunitCounts { tests: 0, failures: 0, errors: 0, skipped: 0 };
    let mut found = false;
    for (i, _) in xml.match_indices("<testsuite") {
        let rest = &xml[i..];
        let tag_end = rest.find('>')?;
        let tag = &rest[..tag_end];
        if tag.starts_with("<testsuites") {
            continue;
        }
        found = true;
        // Counts come from the guest: never let them wrap.
        counts.tests = counts.tests.saturating_add(attr(tag, "tests"));
        counts.failures = counts.failures.saturating_add(attr(tag, "failures"));
        counts.errors = counts.errors.saturating_add(attr(tag, "errors"));
        counts.skipped = counts.skipped.saturating_add(attr(tag, "skipped"));
    }
    found.then_some(counts)
}

fn attr(tag: &str, name: &str) -> u64 {
    let key = format!(" {name}=\"");
    tag.find(&key)
        .and_then(|i| tag[i + key.len()..].split('"').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The verdict from a test outcome: a reward file the tests created wins, then a JUnit
/// report, then the exit code. With `require_reward_file`, no reward file means reward 0.
/// A reward of at least `pass_threshold` passes.
pub fn decide(outcome: &TestOutcome, pass_threshold: f64, require_reward_file: bool) -> Verdict {
    let (reward, basis) = if outcome.timed_out {
        (0.0, "the tests timed out")
    } else if require_reward_file && outcome.reward_file.is_none() {
        (0.0, "the tests did not write the reward file the task requires")
    } else if let Some(r) = outcome.reward_file {
        (r.clamp(0.0, 1.0), "reward file written by the tests")
    } else if let Some(j) = outcome.junit {
        let ok = j.tests > 0 && j.failures == 0 && j.errors == 0 && outcome.exit_code == Some(0);
        (if ok { 1.0 } else { 0.0 }, "JUnit report")
    } else {
        (if outcome.exit_code == Some(0) { 1.0 } else { 0.0 }, "exit code of the test command")
    };
    Verdict {
        reward,
        passed: !outcome.timed_out && reward >= pass_threshold,
        timed_out: outcome.timed_out,
        details: json!({ "basis": basis, "tests": outcome }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(exit: i32) -> TestOutcome {
        TestOutcome { exit_code: Some(exit), signal: None, timed_out: false, junit: None, reward_file: None, stdout_tail: String::new(), stderr_tail: String::new() }
    }

    #[test]
    fn junit_counts_are_summed_across_suites() {
        let xml = r#"<?xml version="1.0"?><testsuites><testsuite name="a" tests="3" failures="1" errors="0" skipped="1"></testsuite><testsuite name="b" tests="2" failures="0" errors="1"/></testsuites>"#;
        assert_eq!(parse_junit(xml), Some(JunitCounts { tests: 5, failures: 1, errors: 1, skipped: 1 }));
        assert_eq!(parse_junit("garbage"), None);
    }

    #[test]
    fn the_decision_prefers_reward_file_then_junit_then_exit_code() {
        assert_eq!(decide(&outcome(0), 1.0, false).reward, 1.0);
        assert!(!decide(&outcome(1), 1.0, false).passed);
        let mut o = outcome(1);
        o.reward_file = Some(0.5);
        assert_eq!(decide(&o, 1.0, false).reward, 0.5);
        assert!(decide(&o, 0.5, false).passed);
        let mut o = outcome(0);
        o.junit = Some(JunitCounts { tests: 4, failures: 1, errors: 0, skipped: 0 });
        assert!(!decide(&o, 1.0, false).passed);
        let mut o = outcome(0);
        o.timed_out = true;
        let v = decide(&o, 1.0, false);
        assert!(v.timed_out && !v.passed && v.reward == 0.0);
        assert_eq!(decide(&outcome(0), 1.0, true).reward, 0.0, "exit 0 without the required reward file");
        let mut o = outcome(0);
        o.reward_file = Some(7.0);
        assert_eq!(decide(&o, 1.0, false).reward, 1.0);
    }
}
