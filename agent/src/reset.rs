//! Making a scoring VM ready for its next check (`[scoring] isolation = "sandbox"`).
//!
//! A scoring VM that serves many checks gives each a fresh candidate process in a private
//! view of the file system (every mount read-only but the workspace, fresh tmpfs at /tmp,
//! /var/tmp and /dev/shm, all gone with the process; see the harness's
//! `enter_private_view`). What a candidate could still leave behind is what outlives a
//! process without living in a mount of its own view. After the verdict is read, the agent
//! removes all of it:
//!
//! - every process of the candidate and checker users (the sweep, already complete, or the
//!   VM is not reused);
//! - the workspace and the tests folder (the host writes both afresh for the next check);
//! - every System V IPC object (shared memory, message queues, semaphores) and every POSIX
//!   message queue: the kernel keeps them with no process and no file behind them.
//!
//! The VM is ready only if every step worked and the zygote still runs; otherwise the host
//! retires it.

use std::path::Path;

use farm_protocol::{AgentError, ResetResult};

use crate::files;
use crate::sys::{self, SysvIpc};

/// Where the agent mounts the POSIX message queue file system to empty it (root's alone).
const MQUEUE_DIR: &str = "/run/farm-reset/mqueue";

/// Resets the VM after a check whose sweep was `sweep_complete`; `zygote` is the zygote's
/// pid (None: no zygote served the check).
pub fn after_check(sweep_complete: bool, tests_dir: &str, workspace: &str, zygote: Option<i32>) -> ResetResult {
    let steps = || -> Result<(), ResetProblem> {
        if !sweep_complete {
            return Err(ResetProblem::Survivors);
        }
        match zygote {
            Some(pid) if alive(pid) => {}
            Some(_) => return Err(ResetProblem::ZygoteGone),
            None => return Err(ResetProblem::NoZygote),
        }
        files::remove_tree(tests_dir).map_err(ResetProblem::Remove)?;
        empty_workspace(workspace)?;
        remove_sysv_ipc()?;
        remove_message_queues()?;
        Ok(())
    };
    match steps() {
        Ok(()) => ResetResult {
            ready: true,
            problem: None,
        },
        Err(problem) => ResetResult {
            ready: false,
            problem: Some(problem.to_string()),
        },
    }
}

/// Why a scoring VM is not ready for another check (the host retires it, saying this).
#[derive(Debug, thiserror::Error)]
enum ResetProblem {
    #[error("processes of the check survived the sweep")]
    Survivors,
    #[error("the harness zygote is gone")]
    ZygoteGone,
    #[error("no harness zygote served the check")]
    NoZygote,
    #[error("{}", .0.message)]
    Remove(AgentError),
    #[error("{what} {path}: {error}")]
    Io {
        what: &'static str,
        path: String,
        error: std::io::Error,
    },
    #[error("removing the System V IPC object {id} of {table}: {error}")]
    Ipc {
        id: i32,
        table: &'static str,
        error: std::io::Error,
    },
}

impl ResetProblem {
    fn io(what: &'static str, path: impl std::fmt::Display) -> impl FnOnce(std::io::Error) -> ResetProblem {
        let path = path.to_string();
        move |error| ResetProblem::Io { what, path, error }
    }
}

/// Whether a process runs (not a zombie).
fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            stat.rfind(')')
                .and_then(|i| stat[i + 1..].split_whitespace().next().map(str::to_owned))
        })
        .is_some_and(|state| state != "Z" && state != "X")
}

/// The workspace removed (without following anything planted in it) and made again, empty,
/// root's, mode 0755.
fn empty_workspace(workspace: &str) -> Result<(), ResetProblem> {
    files::remove_tree(workspace).map_err(ResetProblem::Remove)?;
    std::fs::create_dir(workspace).map_err(ResetProblem::io("making again", workspace))?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(workspace, std::fs::Permissions::from_mode(0o755))
        .map_err(ResetProblem::io("setting the mode of", workspace))
}

/// Removes every System V IPC object, whoever made it.
fn remove_sysv_ipc() -> Result<(), ResetProblem> {
    for (kind, table) in [
        (SysvIpc::SharedMemory, "/proc/sysvipc/shm"),
        (SysvIpc::MessageQueue, "/proc/sysvipc/msg"),
        (SysvIpc::Semaphores, "/proc/sysvipc/sem"),
    ] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue; // a kernel without System V IPC has none to leave
        };
        for id in ipc_ids(&text) {
            match sys::remove_sysv_ipc(kind, id) {
                Ok(()) => {}
                // Removed meanwhile (a segment whose last user detached).
                Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL) | Some(libc::EIDRM)) => {}
                Err(error) => return Err(ResetProblem::Ipc { id, table, error }),
            }
        }
    }
    Ok(())
}

/// The ids in a `/proc/sysvipc` table (the second column, after the header line).
pub fn ipc_ids(table: &str) -> Vec<i32> {
    table
        .lines()
        .skip(1)
        .filter_map(|line| line.split_whitespace().nth(1)?.parse().ok())
        .collect()
}

/// Removes every POSIX message queue, through the mqueue file system mounted where only
/// root looks.
fn remove_message_queues() -> Result<(), ResetProblem> {
    if !Path::new("/proc/filesystems").exists()
        || !std::fs::read_to_string("/proc/filesystems").is_ok_and(|f| f.contains("mqueue"))
    {
        return Ok(()); // a kernel without POSIX message queues
    }
    if !is_mount_point(MQUEUE_DIR) {
        std::fs::create_dir_all(MQUEUE_DIR).map_err(ResetProblem::io("making", MQUEUE_DIR))?;
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions("/run/farm-reset", std::fs::Permissions::from_mode(0o700));
        let flags = nix::mount::MsFlags::MS_NOSUID | nix::mount::MsFlags::MS_NODEV | nix::mount::MsFlags::MS_NOEXEC;
        sys::mount("mqueue", MQUEUE_DIR, "mqueue", flags, "")
            .map_err(ResetProblem::io("mounting mqueue on", MQUEUE_DIR))?;
    }
    let entries = std::fs::read_dir(MQUEUE_DIR).map_err(ResetProblem::io("reading", MQUEUE_DIR))?;
    for entry in entries.flatten() {
        std::fs::remove_file(entry.path())
            .map_err(ResetProblem::io("removing the message queue", entry.path().display()))?;
    }
    Ok(())
}

fn is_mount_point(path: &str) -> bool {
    std::fs::read_to_string("/proc/self/mountinfo")
        .is_ok_and(|info| info.lines().any(|line| line.split_whitespace().nth(4) == Some(path)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipc_ids_are_the_second_column_after_the_header() {
        let shm = "       key      shmid perms                  size  cpid\n         0          5   600                  4096   120\n  12345678         17  666 1 2\n";
        assert_eq!(ipc_ids(shm), vec![5, 17]);
        assert_eq!(ipc_ids("key semid perms\n"), Vec::<i32>::new());
    }
}
