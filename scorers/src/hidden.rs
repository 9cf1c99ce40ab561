//! Hidden tests in a fresh fork of the pristine task snapshot.
//!
//! The hidden tests and empty verdict files go in first (no code of the agent's has run in a
//! fresh fork, and the tests are locked away before any does); then the agent's files,
//! confined to the workspace and owned by the unprivileged candidate user; the workspace is
//! handed to that user. The guest agent runs the test command as the task's test user, kills
//! every process of the candidate and the checker once it ends, and only then reads the
//! verdict files ([`farm_protocol::Request::RunTests`]). The host decides from what it read.

use std::time::Duration;

use datasets::{Harness, Task, TestUser, HARNESS_TEST_FILE, TESTS_DIR, WORKSPACE};
use farm_protocol::{Program, RunTestsRequest, CANDIDATE_UID, CHECKER_UID};
use serde::Serialize;
use serde_json::json;
use vmm::{AgentClient, AgentError, FilePlacement};

use crate::{Artifacts, Verdict};

/// What the tests produced.
#[derive(Debug, Clone, Serialize)]
pub struct TestOutcome {
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub timed_out: bool,
    /// `tests`, `failures`, `errors`, `skipped` from a JUnit XML report the tests wrote.
    pub junit: Option<JunitCounts>,
    /// The number the tests wrote to the reward file, if they wrote one.
    pub reward_file: Option<f64>,
    /// Processes of the candidate and the checker killed after the tests ended.
    pub swept: u32,
    /// What the function-call harness reported (a limit of the proxy, a candidate that
    /// timed out or did not load), from the `farm-harness:` lines of its standard output.
    pub harness: Option<String>,
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
/// (`FARM_REWARD_FILE`) gets a fresh random name in the tests folder for every scoring run.
/// The agent creates both empty, owned by the test user, just before the command starts.
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

/// How the tests run.
#[derive(Debug, Clone, Copy)]
pub struct TestRunOptions {
    /// Limit of the whole test command.
    pub timeout: Duration,
    /// Limit of one call into the candidate (function-call harness).
    pub call_timeout: Duration,
    /// The VM is the rollout's own (final-state scoring): the agent ran there with whatever
    /// privileges the rollout had, so a test command that cannot even start is its doing.
    pub final_state: bool,
}

/// Writes the hidden tests and empty verdict files, places the artifacts (confined to the
/// workspace, owned by the candidate), hands the workspace to the candidate and runs the
/// tests.
pub async fn run_tests(agent: &AgentClient, task: &Task, artifacts: &Artifacts, options: &TestRunOptions) -> Result<TestOutcome, ScoringError> {
    let placing = |e: AgentError| match e {
        AgentError::Refused { message, .. } => ScoringError::Agent(format!("the agent's files could not be placed: {message}")),
        other if options.final_state => ScoringError::Agent(format!("the rollout's VM broke: {other}")),
        other => ScoringError::Environment(other),
    };
    // The tests and empty verdict files go in first, while the VM is the farm's alone: once
    // the agent's files are placed (they might use up the disk's inodes or space), nothing
    // the farm does may need room it no longer has. The agent's code runs only later.
    let setup = |e: AgentError| if options.final_state { ScoringError::Agent(format!("the rollout's VM could not take the tests: {e}")) } else { ScoringError::Environment(e) };
    // A check through the zygote uses the template's harness: the tests' copy stays out.
    let skip_harness = task.harness.is_some() && !options.final_state;
    for test in task.tests.iter().filter(|t| !(skip_harness && t.path == HARNESS_TEST_FILE)) {
        agent.write_file(&format!("{TESTS_DIR}/{}", test.path), test.contents.clone(), test.mode | 0o400).await.map_err(setup)?;
    }
    let reward_path = reward_file_path();
    for path in [reward_path.as_str(), JUNIT_FILE, &format!("{TESTS_DIR}/.tmp/.keep")] {
        agent.write_file(path, Vec::new(), 0o600).await.map_err(setup)?;
    }
    let candidate = format!("{CANDIDATE_UID}:{CANDIDATE_UID}");
    for path in &artifacts.deleted {
        agent.remove_file(path, Some(WORKSPACE)).await.map_err(placing)?;
    }
    let placement = FilePlacement { beneath: Some(WORKSPACE.into()), owner: Some(candidate.clone()) };
    for (path, contents, mode) in &artifacts.files {
        agent.write_file_placed(path, contents.clone(), *mode, &placement).await.map_err(placing)?;
    }
    // The workspace is the agent's work: its code may write there when the tests run it.
    agent.handover(WORKSPACE, &candidate).await.map_err(placing)?;
    let (request, stdin) = tests_request(task, &reward_path, options);
    let final_state = options.final_state;
    let outcome = agent.run_tests(request, stdin).await.map_err(|e| match e {
        // Refused before the command ran (the tests folder, the program missing): the
        // farm's or the task's problem in a pristine VM.
        AgentError::Refused { .. } if !final_state => ScoringError::Environment(e),
        // From here on the agent's code runs: whatever breaks is on the agent.
        other => ScoringError::Agent(format!("the scoring VM broke while the tests ran the agent's code: {other}")),
    })?;
    if !outcome.result.sweep_complete {
        return Err(ScoringError::Agent(format!(
            "processes of the agent's code survived {} kill rounds after the tests ended",
            outcome.result.swept
        )));
    }
    // The harness reports on its standard output, which the candidate's process does not hold.
    // (Only the harness's: a test command's output may be the agent's.)
    let stdout = String::from_utf8_lossy(&outcome.stdout);
    let harness: Vec<&str> = match task.harness {
        Some(_) => stdout.lines().filter_map(|l| l.strip_prefix("farm-harness: ")).collect(),
        None => Vec::new(),
    };
    let result = &outcome.result;
    Ok(TestOutcome {
        exit_code: result.exec.exit_code,
        signal: result.exec.signal,
        timed_out: result.exec.timed_out,
        junit: result.junit.as_deref().and_then(parse_junit),
        reward_file: result.reward.as_deref().and_then(|r| r.trim().parse::<f64>().ok()).filter(|r| r.is_finite()),
        swept: result.swept,
        harness: (!harness.is_empty()).then(|| harness.join("; ")),
        stdout_tail: tail(&outcome.stdout, 2000),
        stderr_tail: tail(&outcome.stderr, 2000),
    })
}

/// The agent request that runs a task's tests, and the standard input to give them.
pub fn tests_request(task: &Task, reward_path: &str, options: &TestRunOptions) -> (RunTestsRequest, Vec<u8>) {
    let private_tmp = format!("{TESTS_DIR}/.tmp");
    let mut env = std::collections::BTreeMap::from([("FARM_TESTS_DIR".to_string(), TESTS_DIR.to_string())]);
    let (program, user, stdin) = match &task.harness {
        Some(Harness::FunctionCall { module, entry_point }) => {
            // The harness reads the reward path from its standard input, after it started
            // the candidate's process: the path is never in an environment or a memory image
            // the candidate could read.
            let harness_args: Vec<String> = [
                "--tests-dir",
                TESTS_DIR,
                "--workspace",
                WORKSPACE,
                "--module",
                module,
                "--entry-point",
                entry_point,
                "--call-timeout",
                &format!("{}", options.call_timeout.as_secs_f64()),
            ]
            .iter()
            .map(|a| a.to_string())
            .collect();
            env.insert("HOME".into(), private_tmp.clone());
            env.insert("TMPDIR".into(), private_tmp.clone());
            // In the rollout's own VM (final-state scoring) the template's zygote may not be
            // what it was; start Python afresh there.
            let argv = crate::zygote::check_argv(&harness_args, options.final_state);
            (Program::Argv(argv), TestUser::Root, format!("{reward_path}\n").into_bytes())
        }
        None => {
            env.insert("FARM_REWARD_FILE".into(), reward_path.to_string());
            env.insert("FARM_JUNIT_FILE".into(), JUNIT_FILE.to_string());
            let home = if task.test_user == TestUser::Candidate { "/tmp".to_string() } else { private_tmp.clone() };
            env.insert("HOME".into(), home.clone());
            env.insert("TMPDIR".into(), home);
            if task.test_user != TestUser::Candidate {
                // Nothing a checker runs picks up the agent's files by accident: it starts in
                // its own folder, and Python puts neither the current folder nor a script's
                // folder on its path.
                env.insert("PYTHONSAFEPATH".into(), "1".into());
            }
            (Program::Shell(task.test_command.clone().unwrap_or_else(|| "false".into())), task.test_user, Vec::new())
        }
    };
    // A checker starts in the tests folder (the agent's code is reached with farm-sandbox,
    // which starts in /workspace); a candidate test command in the workspace.
    let cwd = if task.harness.is_none() && task.test_user != TestUser::Candidate { TESTS_DIR } else { WORKSPACE };
    let request = RunTestsRequest {
        program,
        cwd: cwd.into(),
        env,
        user: user.guest_user(),
        timeout_ms: options.timeout.as_millis() as u64,
        stdout_cap: 64 << 10,
        stderr_cap: 64 << 10,
        tests_dir: TESTS_DIR.into(),
        // The candidate's own test command must read the tests; any other keeps them.
        private_tests: user != TestUser::Candidate,
        reward_file: reward_path.to_string(),
        junit_file: JUNIT_FILE.into(),
        sweep_uids: vec![CANDIDATE_UID, CHECKER_UID],
    };
    (request, stdin)
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

/// The verdict from a test outcome, by the first rule that applies:
/// 1. tests that timed out give 0 (status timeout);
/// 2. a test command that failed (non-zero exit, killed) gives 0, whatever a reward file
///    says: a reward that appears after the checker failed does not count;
/// 3. with `require_reward_file`, no reward file gives 0;
/// 4. the reward file's number, clamped to [0, 1];
/// 5. a JUnit report gives 1 if it counts tests and no failures or errors;
/// 6. otherwise exit code 0 gives 1.
///
/// A reward of at least `pass_threshold` passes.
pub fn decide(outcome: &TestOutcome, pass_threshold: f64, require_reward_file: bool) -> Verdict {
    let (reward, basis) = if outcome.timed_out {
        (0.0, "the tests timed out")
    } else if outcome.exit_code != Some(0) {
        (0.0, "the test command failed; no reward counts after a failed check")
    } else if require_reward_file && outcome.reward_file.is_none() {
        (0.0, "the tests did not write the reward file the task requires")
    } else if let Some(r) = outcome.reward_file {
        (r.clamp(0.0, 1.0), "reward file written by the tests")
    } else if let Some(j) = outcome.junit {
        let ok = j.tests > 0 && j.failures == 0 && j.errors == 0;
        (if ok { 1.0 } else { 0.0 }, "JUnit report")
    } else {
        (1.0, "exit code of the test command")
    };
    let mut details = json!({ "basis": basis, "tests": outcome });
    if let Some(harness) = &outcome.harness {
        details["harness"] = json!(harness);
    }
    Verdict { reward, passed: !outcome.timed_out && reward >= pass_threshold, timed_out: outcome.timed_out, details }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(exit: i32) -> TestOutcome {
        TestOutcome {
            exit_code: Some(exit),
            signal: None,
            timed_out: false,
            junit: None,
            reward_file: None,
            swept: 0,
            harness: None,
            stdout_tail: String::new(),
            stderr_tail: String::new(),
        }
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
        let mut o = outcome(0);
        o.reward_file = Some(0.5);
        assert_eq!(decide(&o, 1.0, false).reward, 0.5);
        assert!(decide(&o, 0.5, false).passed);
        // A reward that a leftover process wrote after the checker failed does not count.
        let mut late = outcome(1);
        late.reward_file = Some(1.0);
        assert_eq!(decide(&late, 1.0, true).reward, 0.0);
        let mut killed = outcome(0);
        killed.exit_code = None;
        killed.signal = Some(9);
        killed.reward_file = Some(1.0);
        assert!(!decide(&killed, 1.0, true).passed);
        // A fake JUnit report does not pass a task that requires the reward file.
        let mut fake = outcome(0);
        fake.junit = Some(JunitCounts { tests: 3, failures: 0, errors: 0, skipped: 0 });
        assert!(!decide(&fake, 1.0, true).passed);
        assert!(decide(&fake, 1.0, false).passed);
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
        let mut h = outcome(3);
        h.harness = Some("this task cannot be checked through the isolation boundary".into());
        assert_eq!(decide(&h, 1.0, true).details["harness"], "this task cannot be checked through the isolation boundary");
    }
}
