//! External scorer programs: run on the host with the rollout as JSON on stdin; they print
//! `{"reward": R, ...}` on stdout. Bounded by a timeout and an output cap.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::Verdict;

#[derive(Debug, thiserror::Error)]
pub enum ExternalError {
    #[error("cannot start scorer {program:?}: {source}")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("scorer {program:?} did not finish within {timeout:?}")]
    Timeout { program: String, timeout: Duration },
    #[error("scorer {program:?} exited with {status}: {stderr}")]
    Failed { program: String, status: String, stderr: String },
    #[error("scorer {program:?} printed {output:?}, expected a JSON object with a numeric \"reward\"")]
    BadOutput { program: String, output: String },
}

/// Runs `argv` with `input` on stdin and reads its verdict.
pub async fn run(argv: &[String], input: &serde_json::Value, timeout: Duration, pass_threshold: f64) -> Result<Verdict, ExternalError> {
    let program = argv.first().cloned().unwrap_or_default();
    let mut child = tokio::process::Command::new(&program)
        .args(&argv[1.min(argv.len())..])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|source| ExternalError::Spawn { program: program.clone(), source })?;
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
    let (out, err, status) = tokio::time::timeout(timeout, work).await.map_err(|_| ExternalError::Timeout { program: program.clone(), timeout })?;
    let status = status.map_err(|source| ExternalError::Spawn { program: program.clone(), source })?;
    if !status.success() {
        return Err(ExternalError::Failed { program, status: status.to_string(), stderr: String::from_utf8_lossy(&err).into_owned() });
    }
    let text = String::from_utf8_lossy(&out).into_owned();
    let value: serde_json::Value = serde_json::from_str(text.trim()).map_err(|_| ExternalError::BadOutput { program: program.clone(), output: text.clone() })?;
    let reward = value.get("reward").and_then(|r| r.as_f64()).filter(|r| r.is_finite()).ok_or(ExternalError::BadOutput { program, output: text })?;
    let reward = reward.clamp(0.0, 1.0);
    Ok(Verdict { reward, passed: reward >= pass_threshold, timed_out: false, details: serde_json::json!({ "basis": "external scorer", "scorer": value }) })
}
