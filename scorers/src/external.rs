//! External scorer programs: run on the host with the rollout as JSON on stdin; they print
//! `{"reward": R, ...}` on stdout. Bounded by a timeout and an output cap.
//!
//! The input holds the agent's bytes (its answer, its artifacts' names, the tests' output),
//! so a scorer that fails on it has failed on the agent's doing: that is a verdict of 0 with
//! the error recorded, never an environment error (which would take the rollout out of the
//! statistics, and an agent could crash its scorer whenever it would fail). A scorer that
//! knows a failure is its own says so with the exit code [`OWN_FAILURE_EXIT`]. A scorer that
//! runs out of time is the agent's failure when the input was over [`AGENT_SIZED_INPUT`]
//! bytes, the environment's otherwise.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The exit code with which an external scorer says a failure is its own, not the agent's
/// (EX_TEMPFAIL of sysexits.h): the row is an `env_error`. Every other failure is a 0.
pub const OWN_FAILURE_EXIT: i32 = 75;

/// Input (answer plus artifacts) past which a scorer's timeout is blamed on the agent.
pub const AGENT_SIZED_INPUT: u64 = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum ExternalError {
    #[error("cannot start scorer {program:?}")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("scorer {program:?} did not finish within {timeout:?}")]
    Timeout { program: String, timeout: Duration },
    #[error("scorer {program:?} exited with {status}: {stderr}")]
    Failed {
        program: String,
        status: String,
        code: Option<i32>,
        stderr: String,
    },
    #[error("scorer {program:?} printed {output:?}, expected a JSON object with a numeric \"reward\"")]
    BadOutput { program: String, output: String },
}

/// Whose a scorer's failure is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Blame {
    /// The scorer said so, or it could not start, or it ran out of time on a small input.
    Environment,
    /// It failed on the agent's output: a verdict of 0.
    Agent,
}

impl ExternalError {
    /// Whose failure this is, given how many bytes of the agent's the input carried.
    pub fn blame(&self, agent_bytes: u64) -> Blame {
        match self {
            ExternalError::Spawn { .. } => Blame::Environment,
            ExternalError::Failed {
                code: Some(OWN_FAILURE_EXIT),
                ..
            } => Blame::Environment,
            ExternalError::Timeout { .. } if agent_bytes <= AGENT_SIZED_INPUT => Blame::Environment,
            ExternalError::Timeout { .. } | ExternalError::Failed { .. } | ExternalError::BadOutput { .. } => {
                Blame::Agent
            }
        }
    }
}

/// What a scorer decided.
#[derive(Debug, Clone, PartialEq)]
pub struct ScorerOutput {
    /// In [0, 1].
    pub reward: f64,
    /// Everything it printed (a JSON object).
    pub printed: serde_json::Value,
}

/// Runs `argv` with `input` on stdin and reads its verdict.
pub async fn run(argv: &[String], input: &serde_json::Value, timeout: Duration) -> Result<ScorerOutput, ExternalError> {
    let program = argv.first().cloned().unwrap_or_default();
    let mut child = tokio::process::Command::new(&program)
        .args(&argv[1.min(argv.len())..])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|source| ExternalError::Spawn {
            program: program.clone(),
            source,
        })?;
    let mut stdin = child.stdin.take().expect("piped");
    let payload = serde_json::to_vec(input).expect("json");
    let mut stdout = child.stdout.take().expect("piped");
    let mut stderr = child.stderr.take().expect("piped");
    let work = async {
        let _ = stdin.write_all(&payload).await;
        drop(stdin);
        let mut out = Vec::new();
        let mut err = Vec::new();
        // Both pipes at once, so a scorer that fills one while we wait on the other cannot
        // stall; beyond the caps the rest is read and dropped.
        let read_out = async {
            let _ = (&mut stdout).take(1 << 20).read_to_end(&mut out).await;
            let _ = tokio::io::copy(&mut stdout, &mut tokio::io::sink()).await;
        };
        let read_err = async {
            let _ = (&mut stderr).take(64 << 10).read_to_end(&mut err).await;
            let _ = tokio::io::copy(&mut stderr, &mut tokio::io::sink()).await;
        };
        tokio::join!(read_out, read_err);
        let status = child.wait().await;
        (out, err, status)
    };
    let (out, err, status) = tokio::time::timeout(timeout, work)
        .await
        .map_err(|_| ExternalError::Timeout {
            program: program.clone(),
            timeout,
        })?;
    let status = status.map_err(|source| ExternalError::Spawn {
        program: program.clone(),
        source,
    })?;
    if !status.success() {
        let stderr = String::from_utf8_lossy(&err);
        let stderr: String = stderr
            .chars()
            .rev()
            .take(2000)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        return Err(ExternalError::Failed {
            program,
            status: status.to_string(),
            code: status.code(),
            stderr,
        });
    }
    let text = String::from_utf8_lossy(&out).into_owned();
    let bad = || ExternalError::BadOutput {
        program: program.clone(),
        output: text.chars().take(2000).collect(),
    };
    let printed: serde_json::Value = serde_json::from_str(text.trim()).map_err(|_| bad())?;
    let reward = printed
        .get("reward")
        .and_then(|r| r.as_f64())
        .filter(|r| r.is_finite())
        .ok_or_else(bad)?;
    Ok(ScorerOutput {
        reward: reward.clamp(0.0, 1.0),
        printed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> Vec<String> {
        vec!["/bin/sh".into(), "-c".into(), script.into()]
    }

    async fn outcome(script: &str) -> Result<ScorerOutput, ExternalError> {
        run(
            &sh(script),
            &serde_json::json!({"answer": "maybe 41?"}),
            Duration::from_secs(5),
        )
        .await
    }

    #[tokio::test]
    async fn a_scorer_failing_on_the_agents_output_is_the_agents_failure() {
        // A scorer that parses the answer and dies on a malformed one.
        let crashed = outcome("cat >/dev/null; echo 'json.decoder.JSONDecodeError' >&2; exit 1")
            .await
            .unwrap_err();
        assert_eq!(crashed.blame(10), Blame::Agent);
        assert!(crashed.to_string().contains("JSONDecodeError"), "{crashed}");
        let garbage = outcome("cat >/dev/null; echo not-json").await.unwrap_err();
        assert_eq!(garbage.blame(10), Blame::Agent);
        // Only the reserved code says the failure is the scorer's own.
        let own = outcome(&format!("cat >/dev/null; exit {OWN_FAILURE_EXIT}"))
            .await
            .unwrap_err();
        assert_eq!(own.blame(10), Blame::Environment);
        let missing = run(
            &["/nonexistent/scorer".to_string()],
            &serde_json::json!({}),
            Duration::from_secs(5),
        )
        .await
        .unwrap_err();
        assert_eq!(missing.blame(10), Blame::Environment);
        let ok = outcome("cat >/dev/null; echo '{\"reward\": 7}'").await.unwrap();
        assert_eq!(ok.reward, 1.0);
    }

    #[tokio::test]
    async fn a_timeout_is_the_agents_only_on_an_agent_sized_input() {
        let slow = run(&sh("sleep 5"), &serde_json::json!({}), Duration::from_millis(200))
            .await
            .unwrap_err();
        assert!(matches!(slow, ExternalError::Timeout { .. }));
        assert_eq!(slow.blame(100), Blame::Environment);
        assert_eq!(slow.blame(AGENT_SIZED_INPUT + 1), Blame::Agent);
    }
}
