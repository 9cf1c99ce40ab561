//! Hidden tests in a fresh fork of the pristine task snapshot.
//!
//! The hidden tests and empty verdict files go in first (no code of the agent's has run in a
//! fresh fork, and the tests are locked away before any does); then the agent's files,
//! confined to the workspace and owned by the unprivileged candidate user; the workspace is
//! handed to that user. The guest agent runs the test command as the task's test user, kills
//! every process of the candidate and the checker once it ends, and only then reads the
//! verdict files ([`farm_protocol::Request::RunTests`]). The host decides from what it read.

use std::time::Duration;

use datasets::{Harness, Task, TestUser, HARNESS_DIR, TESTS_DIR, WORKSPACE};
use farm_protocol::{Program, ResetResult, RunTestsRequest, SharedCheck, CANDIDATE_UID, CHECKER_UID};
use serde::{Deserialize, Serialize};
use vmm::{AgentClient, AgentError, FilePlacement, TestsOutput};

use crate::{Artifacts, Details, TrustLevel, Verdict};

/// What the tests produced.
#[derive(Debug, Clone, PartialEq, Serialize)]
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
    /// What farm's harness reported (a limit of the boundary, a candidate that timed out or
    /// did not load, the unit tests' counts), from the `farm-harness:` lines of its
    /// standard output.
    #[serde(skip)]
    pub harness: Vec<HarnessReport>,
    /// Why a JUnit report the tests wrote was not read (over the cap).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub junit_unread: Option<String>,
    pub stdout_tail: String,
    pub stderr_tail: String,
    /// After a shared check: whether the scoring VM is ready for the next.
    #[serde(skip)]
    pub reset: Option<ResetResult>,
}

/// One line of farm's harness's report. The harness writes them on its standard output,
/// which only the harness process holds, as `farm-harness: {JSON}`: its own words in
/// `message`, anything the candidate's process said in `candidate_text`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HarnessReport {
    pub kind: HarnessKind,
    #[serde(default)]
    pub message: String,
    /// Text that came from the candidate's process (its load error, an exception name it
    /// claimed...): quoted as the candidate's, never part of the harness's own words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub candidate_text: Option<String>,
    /// Unit-test mode's counts (kind `summary`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tests: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failures: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub errors: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skipped: Option<u64>,
}

/// What a harness report is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HarnessKind {
    /// The tests need something the isolation boundary cannot carry: the task's doing.
    IsolationLimit,
    /// The candidate timed out, died, broke the protocol, did not load, returned what is
    /// not plain data: the candidate's doing.
    CandidateFailure,
    /// The unit tests' counts.
    Summary,
    /// The scoring VM could not give a fresh candidate process its private view, before any
    /// of the candidate's code ran: the farm's failure.
    Environment,
}

/// The longest candidate text kept in a report.
const MAX_CANDIDATE_TEXT: usize = 500;

impl HarnessReport {
    /// Reads the harness's standard output: every well-formed `farm-harness:` line. Lines
    /// that do not parse are dropped (only the harness writes here; a broken line is a
    /// harness bug, not something to quote).
    pub fn parse_all(stdout: &str) -> Vec<HarnessReport> {
        stdout
            .lines()
            .filter_map(|l| l.strip_prefix("farm-harness: "))
            .filter_map(|json| serde_json::from_str::<HarnessReport>(json).ok())
            .map(|mut r| {
                r.message = r.message.chars().take(2000).collect();
                r.candidate_text = r.candidate_text.map(|t| t.chars().take(MAX_CANDIDATE_TEXT).collect());
                r
            })
            .collect()
    }

    /// The report as a row's error: `harness: <farm's words>`, then the candidate's own
    /// words, quoted (escaped) and marked as the candidate's.
    pub fn describe(&self) -> String {
        let class = match self.kind {
            HarnessKind::IsolationLimit => "harness",
            HarnessKind::CandidateFailure | HarnessKind::Summary => "harness (candidate failure)",
            HarnessKind::Environment => "harness (scoring VM)",
        };
        match &self.candidate_text {
            Some(text) => format!("{class}: {}; the candidate's process said: {text:?}", self.message),
            None => format!("{class}: {}", self.message),
        }
    }

    /// The unit tests' counts, as a JUnit report would give them.
    fn counts(&self) -> Option<JunitCounts> {
        (self.kind == HarnessKind::Summary).then(|| JunitCounts {
            tests: self.tests.unwrap_or(0),
            failures: self.failures.unwrap_or(0),
            errors: self.errors.unwrap_or(0),
            skipped: self.skipped.unwrap_or(0),
        })
    }
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
    /// The scoring VM failed before any of the agent's bytes reached it: the farm's fault.
    #[error("the scoring VM failed")]
    Environment(#[source] AgentError),
    /// The agent's work could not be placed, or its code (run by the tests) broke the scoring
    /// VM: the agent's fault, scored as a failure.
    #[error("{0}")]
    Agent(String),
    /// A shared scoring VM could not sandbox the candidate before its code ran (the
    /// harness said so): the farm's fault.
    #[error("{0}")]
    Sandbox(String),
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
    /// The checkers' `FARM_SEED` (drawn afresh for each scoring run): the rollout never
    /// saw it, and `farm-sandbox` keeps it from the agent's code.
    pub seed: u64,
    /// The scoring VM serves more checks after this one (sandbox isolation).
    pub shared: bool,
}

/// Writes the hidden tests and empty verdict files, places the artifacts (confined to the
/// workspace, owned by the candidate), hands the workspace to the candidate and runs the
/// tests.
pub async fn run_tests(
    agent: &AgentClient,
    task: &Task,
    artifacts: &Artifacts,
    options: &TestRunOptions,
) -> Result<TestOutcome, ScoringError> {
    let reward_path = reward_file_path();
    place_tests(agent, task, &reward_path, options).await?;
    place_artifacts(agent, artifacts).await?;
    let (request, stdin) = tests_request(task, &reward_path, options);
    let final_state = options.final_state;
    let outcome = agent.run_tests(request, stdin).await.map_err(|e| match e {
        // Refused before the command ran (the tests folder, the program missing): the
        // farm's or the task's problem in a pristine VM.
        AgentError::Refused { .. } if !final_state => ScoringError::Environment(e),
        // From here on the agent's code runs: whatever breaks is on the agent.
        other => ScoringError::Agent(format!(
            "the scoring VM broke while the tests ran the agent's code: {other}"
        )),
    })?;
    if !outcome.result.sweep_complete {
        return Err(ScoringError::Agent(format!(
            "processes of the agent's code survived {} kill rounds after the tests ended",
            outcome.result.swept
        )));
    }
    let outcome = TestOutcome::read(task, &outcome);
    if let Some(report) = outcome.harness.iter().find(|r| r.kind == HarnessKind::Environment) {
        return Err(ScoringError::Sandbox(report.describe()));
    }
    Ok(outcome)
}

/// The tests and empty verdict files go in first, while the VM is the farm's alone: once
/// the agent's files are placed (they might use up the disk's inodes or space), nothing the
/// farm does may need room it no longer has. The agent's code runs only later.
async fn place_tests(
    agent: &AgentClient,
    task: &Task,
    reward_path: &str,
    options: &TestRunOptions,
) -> Result<(), ScoringError> {
    let setup = |e: AgentError| {
        if options.final_state {
            ScoringError::Agent(format!("the rollout's VM could not take the tests: {e}"))
        } else {
            ScoringError::Environment(e)
        }
    };
    // A check through the zygote uses the template's harness: the tests' copy stays out.
    let skip_harness = task.harness.is_some() && !options.final_state;
    for test in task
        .tests
        .iter()
        .filter(|t| !(skip_harness && t.path.starts_with(HARNESS_DIR)))
    {
        agent
            .write_file(
                &format!("{TESTS_DIR}/{}", test.path),
                test.contents.clone(),
                test.mode | 0o400,
            )
            .await
            .map_err(setup)?;
    }
    for path in [reward_path, JUNIT_FILE, &format!("{TESTS_DIR}/.tmp/.keep")] {
        agent.write_file(path, Vec::new(), 0o600).await.map_err(setup)?;
    }
    Ok(())
}

/// Places the agent's files in the workspace (and removes what it deleted), then hands the
/// workspace to the candidate, whose code may write there when the tests run it.
///
/// From the first byte of the agent's files on, whatever goes wrong is the agent's: its
/// bytes are in the VM (a placement that fills the disk, a VM killed past its disk limit by
/// them). The scoring VM has room for the whole artifact budget on top of the task's limit,
/// so honest work never meets that.
async fn place_artifacts(agent: &AgentClient, artifacts: &Artifacts) -> Result<(), ScoringError> {
    let placing = |e: AgentError| match e {
        AgentError::Refused { message, .. } => {
            ScoringError::Agent(format!("the agent's files could not be placed: {message}"))
        }
        other => ScoringError::Agent(format!(
            "the scoring VM broke while the agent's files were placed: {other}"
        )),
    };
    let candidate = format!("{CANDIDATE_UID}:{CANDIDATE_UID}");
    for path in &artifacts.deleted {
        agent.remove_file(path, Some(WORKSPACE)).await.map_err(placing)?;
    }
    let placement = FilePlacement {
        beneath: Some(WORKSPACE.into()),
        owner: Some(candidate.clone()),
    };
    for (path, contents, mode) in &artifacts.files {
        agent
            .write_file_placed(path, contents.clone(), *mode, &placement)
            .await
            .map_err(placing)?;
    }
    agent.handover(WORKSPACE, &candidate).await.map_err(placing)?;
    Ok(())
}

impl TestOutcome {
    /// What the tests' run says, as scoring reads it.
    fn read(task: &Task, outcome: &TestsOutput) -> TestOutcome {
        // The harness reports on its standard output, which the candidate's process does
        // not hold. (Only the harness's: a test command's output may be the agent's.)
        let harness = match task.harness {
            Some(_) => HarnessReport::parse_all(&String::from_utf8_lossy(&outcome.stdout)),
            None => Vec::new(),
        };
        let result = &outcome.result;
        let junit_unread = (result.junit_file_bytes > farm_protocol::MAX_JUNIT_BYTES).then(|| {
            format!(
                "the JUnit report is {} bytes, over the {} bytes farm reads; it was not read",
                result.junit_file_bytes,
                farm_protocol::MAX_JUNIT_BYTES
            )
        });
        let junit = harness
            .iter()
            .find_map(HarnessReport::counts)
            .or_else(|| parse_junit(&String::from_utf8_lossy(&outcome.junit)));
        TestOutcome {
            exit_code: result.exec.exit_code,
            signal: result.exec.signal,
            timed_out: result.exec.timed_out,
            junit,
            reward_file: result
                .reward
                .as_deref()
                .and_then(|r| r.trim().parse::<f64>().ok())
                .filter(|r| r.is_finite()),
            swept: result.swept,
            harness,
            junit_unread,
            stdout_tail: tail(&outcome.stdout, 2000),
            stderr_tail: tail(&outcome.stderr, 2000),
            reset: result.reset.clone(),
        }
    }
}

/// The agent request that runs a task's tests, and the standard input to give them.
pub fn tests_request(task: &Task, reward_path: &str, options: &TestRunOptions) -> (RunTestsRequest, Vec<u8>) {
    let private_tmp = format!("{TESTS_DIR}/.tmp");
    let mut env = std::collections::BTreeMap::from([
        ("FARM_TESTS_DIR".to_string(), TESTS_DIR.to_string()),
        ("FARM_SEED".to_string(), options.seed.to_string()),
    ]);
    let (program, user, stdin) = match &task.harness {
        Some(harness) => {
            // The harness reads the reward path from its standard input, after it started
            // the candidate's process: the path is never in an environment or a memory image
            // the candidate could read.
            let harness_args = harness_args(harness, options);
            env.insert("HOME".into(), private_tmp.clone());
            env.insert("TMPDIR".into(), private_tmp.clone());
            // In the rollout's own VM (final-state scoring) the template's zygote may not be
            // what it was; start Python afresh there.
            let argv = crate::zygote::check_argv(&harness_args, options.final_state);
            (
                Program::Argv(argv),
                TestUser::Root,
                format!("{reward_path}\n").into_bytes(),
            )
        }
        None => {
            env.insert("FARM_REWARD_FILE".into(), reward_path.to_string());
            env.insert("FARM_JUNIT_FILE".into(), JUNIT_FILE.to_string());
            let home = if task.test_user == TestUser::Candidate {
                "/tmp".to_string()
            } else {
                private_tmp.clone()
            };
            env.insert("HOME".into(), home.clone());
            env.insert("TMPDIR".into(), home);
            if task.test_user != TestUser::Candidate {
                // Nothing a checker runs picks up the agent's files by accident: it starts in
                // its own folder, and Python puts neither the current folder nor a script's
                // folder on its path.
                env.insert("PYTHONSAFEPATH".into(), "1".into());
            }
            (
                Program::Shell(task.test_command.clone().unwrap_or_else(|| "false".into())),
                task.test_user,
                Vec::new(),
            )
        }
    };
    // A checker (and farm's harness) starts in the tests folder (the agent's code is reached
    // with farm-sandbox, or by the harness's candidate process, which start in /workspace);
    // a candidate test command in the workspace.
    let cwd = if task.harness.is_some() || task.test_user != TestUser::Candidate {
        TESTS_DIR
    } else {
        WORKSPACE
    };
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
        // A checker's test command sees the workspace through a view that follows no link
        // the agent planted (farm's harness never opens the workspace as root: its candidate
        // process does, as the candidate).
        checker_view: task.harness.is_none() && task.test_user != TestUser::Candidate,
        shared: (options.shared && task.harness.is_some()).then(|| SharedCheck {
            workspace: WORKSPACE.into(),
        }),
    };
    (request, stdin)
}

/// The harness's arguments for a task's check.
fn harness_args(harness: &Harness, options: &TestRunOptions) -> Vec<String> {
    let timeout = format!("{}", options.call_timeout.as_secs_f64());
    let mut args: Vec<&str> = match harness {
        Harness::FunctionCall { module, entry_point } => vec!["--module", module, "--entry-point", entry_point],
        Harness::UnitTests { modules } => {
            let mut args = vec!["--mode", "unit-tests"];
            for module in modules {
                args.extend(["--module", module.as_str()]);
            }
            args
        }
    };
    args.extend([
        "--tests-dir",
        TESTS_DIR,
        "--workspace",
        WORKSPACE,
        "--call-timeout",
        &timeout,
    ]);
    args.iter().map(|a| a.to_string()).collect()
}

fn tail(bytes: &[u8], n: usize) -> String {
    let text = String::from_utf8_lossy(bytes);
    let chars: Vec<char> = text.chars().collect();
    chars[chars.len().saturating_sub(n)..].iter().collect()
}

/// Sums the counts of every `<testsuite>` (or a lone `<testsuites>`) in a JUnit report.
pub fn parse_junit(xml: &str) -> Option<JunitCounts> {
    let mut counts = JunitCounts {
        tests: 0,
        failures: 0,
        errors: 0,
        skipped: 0,
    };
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
/// 5. a JUnit report over the cap gives 0 (it was not read; the error names the cap);
/// 6. a JUnit report gives 1 if it counts tests and no failures or errors;
/// 7. otherwise exit code 0 gives 1.
///
/// A reward of at least `pass_threshold` passes. `trust` says how far the outcome could be
/// touched by the agent's code.
pub fn decide(outcome: TestOutcome, pass_threshold: f64, require_reward_file: bool, trust: TrustLevel) -> Verdict {
    let (reward, basis) = if outcome.timed_out {
        (0.0, "the tests timed out")
    } else if outcome.exit_code != Some(0) {
        (0.0, "the test command failed; no reward counts after a failed check")
    } else if require_reward_file && outcome.reward_file.is_none() {
        (0.0, "the tests did not write the reward file the task requires")
    } else if let Some(r) = outcome.reward_file {
        (r.clamp(0.0, 1.0), "reward file written by the tests")
    } else if outcome.junit_unread.is_some() {
        (0.0, "the JUnit report was over the size farm reads")
    } else if let Some(j) = outcome.junit {
        let ok = j.tests > 0 && j.failures == 0 && j.errors == 0;
        (if ok { 1.0 } else { 0.0 }, "JUnit report")
    } else {
        (1.0, "exit code of the test command")
    };
    let timed_out = outcome.timed_out;
    let details = Details {
        harness: outcome.harness.clone(),
        tests: Some(outcome),
        ..Details::basis(basis)
    };
    Verdict {
        reward,
        passed: !timed_out && reward >= pass_threshold,
        timed_out,
        trust,
        details,
    }
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
            harness: Vec::new(),
            junit_unread: None,
            stdout_tail: String::new(),
            stderr_tail: String::new(),
            reset: None,
        }
    }

    fn decide(o: &TestOutcome, threshold: f64, require: bool) -> Verdict {
        super::decide(o.clone(), threshold, require, TrustLevel::ANSWER)
    }

    #[test]
    fn junit_counts_are_summed_across_suites() {
        let xml = r#"<?xml version="1.0"?><testsuites><testsuite name="a" tests="3" failures="1" errors="0" skipped="1"></testsuite><testsuite name="b" tests="2" failures="0" errors="1"/></testsuites>"#;
        assert_eq!(
            parse_junit(xml),
            Some(JunitCounts {
                tests: 5,
                failures: 1,
                errors: 1,
                skipped: 1
            })
        );
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
        fake.junit = Some(JunitCounts {
            tests: 3,
            failures: 0,
            errors: 0,
            skipped: 0,
        });
        assert!(!decide(&fake, 1.0, true).passed);
        assert!(decide(&fake, 1.0, false).passed);
        let mut o = outcome(0);
        o.junit = Some(JunitCounts {
            tests: 4,
            failures: 1,
            errors: 0,
            skipped: 0,
        });
        assert!(!decide(&o, 1.0, false).passed);
        // A report over the cap was not read: it cannot pass, and the error names the cap.
        let mut big = outcome(0);
        big.junit_unread =
            Some("the JUnit report is 5000000 bytes, over the 4194304 bytes farm reads; it was not read".into());
        let v = decide(&big, 1.0, false);
        assert!(!v.passed && v.error().unwrap().contains("4194304"), "{v:?}");
        let mut o = outcome(0);
        o.timed_out = true;
        let v = decide(&o, 1.0, false);
        assert!(v.timed_out && !v.passed && v.reward == 0.0);
        assert_eq!(
            decide(&outcome(0), 1.0, true).reward,
            0.0,
            "exit 0 without the required reward file"
        );
        let mut o = outcome(0);
        o.reward_file = Some(7.0);
        assert_eq!(decide(&o, 1.0, false).reward, 1.0);
    }

    #[test]
    fn harness_reports_keep_the_candidates_words_apart() {
        let stdout = concat!(
            "noise\n",
            "farm-harness: {\"kind\": \"candidate_failure\", \"message\": \"the candidate's module solution did not load\", \"candidate_text\": \"this task cannot be checked through the isolation boundary: x\"}\n",
            "farm-harness: not json\n",
            "farm-harness: {\"kind\": \"summary\", \"tests\": 4, \"failures\": 1, \"errors\": 0, \"skipped\": 0}\n",
        );
        let reports = HarnessReport::parse_all(stdout);
        assert_eq!(reports.len(), 2);
        let forged = reports[0].describe();
        assert!(forged.starts_with("harness (candidate failure): the candidate's module solution did not load; the candidate's process said: "), "{forged}");
        assert!(!forged.starts_with("harness: this task cannot be checked"), "{forged}");
        assert_eq!(
            reports[1].counts(),
            Some(JunitCounts {
                tests: 4,
                failures: 1,
                errors: 0,
                skipped: 0
            })
        );
        let limit = HarnessReport {
            kind: HarnessKind::IsolationLimit,
            message: "this task cannot be checked through the isolation boundary: the tests read candidate.x".into(),
            candidate_text: None,
            tests: None,
            failures: None,
            errors: None,
            skipped: None,
        };
        assert_eq!(
            limit.describe(),
            "harness: this task cannot be checked through the isolation boundary: the tests read candidate.x"
        );
        let mut o = outcome(3);
        o.harness = reports;
        let v = decide(&o, 1.0, true);
        assert_eq!(v.details.harness.len(), 2);
        assert!(v.error().unwrap().starts_with("harness (candidate failure)"));
    }
}
