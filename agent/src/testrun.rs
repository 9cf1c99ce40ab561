//! Running a task's hidden tests in a scoring VM, in one request so the order is the agent's
//! to keep, not the host's:
//!
//! 1. lock the tests folder down: private to the test user (0700), or owned by root and
//!    read-only to everyone;
//! 2. create the verdict files empty, owned by the test user, mode 0600;
//! 3. run the test command as that user, in a session of its own, bounded by its timeout;
//! 4. kill every process of the sweep users (the candidate and the checker) and of the
//!    command's session, and wait until they are gone;
//! 5. only then read the verdict files, refusing links and anything but regular files.
//!
//! So nothing the tests started can write a verdict after the command ended.

use farm_protocol::{AgentError, ErrorKind, RunTestsRequest, TestsResult};

use crate::exec::{self, Launch, Output};
use crate::files;
use crate::reset;
use crate::sweep::{self, Targets};
use crate::users::{self, User};
use crate::zygote;

/// Largest reward file read back.
pub const MAX_REWARD_BYTES: u64 = 4096;
/// Largest JUnit report read back.
pub use farm_protocol::MAX_JUNIT_BYTES;

fn bad_request(message: String) -> AgentError {
    AgentError {
        kind: ErrorKind::BadRequest,
        message,
    }
}

/// Checks that a verdict file lies directly inside the tests folder (so the folder's lock
/// applies to it).
fn check_inside(tests_dir: &str, path: &str, what: &str) -> Result<(), AgentError> {
    match path.strip_prefix(tests_dir).and_then(|rest| rest.strip_prefix('/')) {
        Some(name) if !name.is_empty() && !name.contains('/') && name != "." && name != ".." => Ok(()),
        _ => Err(bad_request(format!(
            "the {what} {path:?} must be a file directly inside {tests_dir:?}"
        ))),
    }
}

/// What the tests left: the result, the command's output, and the JUnit report's bytes.
pub struct TestsRun {
    pub result: TestsResult,
    pub output: Output,
    pub junit: Vec<u8>,
}

/// Links, FIFOs and regular files the checker opens in folders others can write: with these
/// set, the kernel refuses to follow a link or open a FIFO or file someone else planted in a
/// sticky world-writable folder (`/tmp`, `/dev/shm`), and refuses hard links to files the
/// linker does not own. (`/workspace` itself is handled by the checker's view.)
const SCORING_SYSCTLS: [(&str, &str); 4] = [
    ("/proc/sys/fs/protected_symlinks", "1"),
    ("/proc/sys/fs/protected_hardlinks", "1"),
    ("/proc/sys/fs/protected_fifos", "2"),
    ("/proc/sys/fs/protected_regular", "2"),
];

pub fn run_tests(req: &RunTestsRequest, base_env: &[(String, String)], stdin: &[u8]) -> Result<TestsRun, AgentError> {
    let user = users::resolve(&req.user).map_err(|e| bad_request(crate::describe(&e)))?;
    if !req.tests_dir.starts_with('/') || req.tests_dir.trim_end_matches('/').is_empty() {
        return Err(bad_request(format!(
            "tests_dir {:?} must be an absolute folder below /",
            req.tests_dir
        )));
    }
    check_inside(&req.tests_dir, &req.reward_file, "reward file")?;
    check_inside(&req.tests_dir, &req.junit_file, "JUnit file")?;
    prepare_tests_dir(req, &user)?;
    for (knob, value) in SCORING_SYSCTLS {
        std::fs::write(knob, value).map_err(|e| AgentError {
            kind: ErrorKind::Io,
            message: format!("setting {knob} to {value}: {e}"),
        })?;
    }

    let mut env: Vec<(String, String)> = base_env
        .iter()
        .filter(|(k, _)| !req.env.contains_key(k))
        .cloned()
        .collect();
    env.extend(req.env.iter().map(|(k, v)| (k.clone(), v.clone())));
    let launch = Launch {
        program: &req.program,
        cwd: req.cwd.clone(),
        env,
        user: user.clone(),
        timeout_ms: Some(req.timeout_ms),
        stdout_cap: req.stdout_cap,
        stderr_cap: req.stderr_cap,
        checker_view: req.checker_view,
    };
    let (output, pid, zygote_pid) = run_command(req, &launch, &user, stdin)?;

    // Nothing the tests started may outlive them: their session or group, and every process
    // of the sweep users wherever it went.
    let swept = sweep::sweep(&Targets {
        uids: req.sweep_uids.clone(),
        group: Some(pid as i32),
        everything: false,
    });
    let reward = files::read_verdict_file(&req.reward_file, MAX_REWARD_BYTES)
        .map(|(_, b)| String::from_utf8_lossy(&b).into_owned());
    // A report past the cap is not read at all (half a report could count half the tests).
    let (junit_file_bytes, junit) = match files::read_verdict_file(&req.junit_file, MAX_JUNIT_BYTES) {
        Some((size, bytes)) if size <= MAX_JUNIT_BYTES && !bytes.is_empty() => (size, Some(bytes)),
        Some((size, _)) => (size, None),
        None => (0, None),
    };
    let reset = req
        .shared
        .as_ref()
        .map(|shared| reset::after_check(swept.complete, &req.tests_dir, &shared.workspace, zygote_pid));
    let result = TestsResult {
        exec: output.result.clone(),
        reward,
        junit_len: junit.as_ref().map(|b| b.len() as u64),
        junit_file_bytes,
        swept: swept.killed,
        sweep_complete: swept.complete,
        reset,
    };
    Ok(TestsRun {
        result,
        output,
        junit: junit.unwrap_or_default(),
    })
}

/// Runs the test command: a function-call check goes straight to the harness zygote when
/// one answers (as root, which the zygote's socket requires); anything else starts as a
/// command. A shared check (a VM that serves more) runs only there: only the zygote gives
/// each candidate a view of its own. Returns the output, the process whose session the sweep
/// takes, and the zygote's pid (None without one).
fn run_command(
    req: &RunTestsRequest,
    launch: &Launch,
    user: &User,
    stdin: &[u8],
) -> Result<(Output, u32, Option<i32>), AgentError> {
    let zygote = zygote::parse(&req.program)
        .filter(|_| user.is_root())
        .and_then(|check| zygote::connect(check.socket).map(|c| (check, c)));
    if req.shared.is_some() && zygote.is_none() {
        return Err(AgentError {
            kind: ErrorKind::Spawn,
            message: "a check in a shared scoring VM needs the harness zygote, and none answered".into(),
        });
    }
    match zygote {
        Some((check, (stream, zygote_pid))) => {
            let (output, pid) = zygote::run(stream, zygote_pid, &check, launch, stdin, req.shared.is_some())?;
            Ok((output, pid, Some(zygote_pid)))
        }
        None => {
            let (output, pid) = exec::run_launch(launch, stdin)?;
            Ok((output, pid, None))
        }
    }
}

/// Locks the tests folder and creates the verdict files and a private temporary folder
/// (`.tmp`, owned by the test user).
fn prepare_tests_dir(req: &RunTestsRequest, user: &User) -> Result<(), AgentError> {
    let dir = &req.tests_dir;
    std::fs::create_dir_all(dir).map_err(|e| AgentError {
        kind: ErrorKind::Io,
        message: format!("creating {dir}: {e}"),
    })?;
    if req.private_tests {
        // Only the test user (and root) can enter: the candidate cannot read the tests.
        let modes = |is_dir: bool, mode: u32| if is_dir { 0o700 } else { (mode & 0o777) | 0o400 };
        files::handover(dir, user, Some(&modes))?;
    } else {
        // Readable and runnable by everyone, writable by root alone: the tests cannot be
        // changed under the command by the code it runs.
        let modes = |is_dir: bool, mode: u32| {
            if is_dir {
                0o755
            } else if mode & 0o111 != 0 {
                0o555
            } else {
                0o444
            }
        };
        files::handover(dir, &User::ROOT, Some(&modes))?;
    }
    files::create_private_file(&req.reward_file, user)?;
    files::create_private_file(&req.junit_file, user)?;
    let tmp = format!("{}/.tmp", dir.trim_end_matches('/'));
    // A real folder there (the host makes it with the tests) is kept; anything else goes.
    if !std::fs::symlink_metadata(&tmp).is_ok_and(|m| m.is_dir()) {
        let _ = files::remove_tree(&tmp);
        std::fs::create_dir(&tmp).map_err(|e| AgentError {
            kind: ErrorKind::Io,
            message: format!("creating {tmp}: {e}"),
        })?;
    }
    let none = |is_dir: bool, _: u32| if is_dir { 0o700 } else { 0o600 };
    files::handover(&tmp, user, Some(&none))?;
    Ok(())
}
