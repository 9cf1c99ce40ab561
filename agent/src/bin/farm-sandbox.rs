//! `farm-sandbox [-C DIR] CMD [ARGS...]`: runs a command as the unprivileged candidate user
//! `farm` (uid and gid [`CANDIDATE_UID`]), in `/workspace` (the agent's folder) or `DIR`.
//!
//! A test command that checks an agent's work runs the agent's code through this helper, so
//! that code runs in a process of its own, as a user that can neither read the hidden tests
//! nor write the verdict files (they belong to the checker or root), nor see, signal or trace
//! the checker.
//!
//! It is installed setuid root, executable only by root and the `farm-checker` group
//! (mode 4750), so a checker that is not root can use it. It therefore drops every privilege
//! before it does anything else: supplementary groups, then all three gids and uids, then it
//! makes sure they cannot come back and sets no_new_privs (no later exec can raise them).
//! Only then does it read its arguments. Descriptors other than 0, 1 and 2 are closed, and
//! every `FARM_*` variable is removed from the environment (the checker's verdict files,
//! its tests folder, the scoring seed its hidden inputs may come from); HOME and TMPDIR point
//! at /tmp.
//!
//! A checker runs in a mount namespace of its own, where the workspace follows no link
//! (see the guest agent's `checker_view_on_exec`). Before it drops root, this helper moves
//! back into the namespace of PID 1, so the agent's code sees the ordinary workspace: its
//! own links work there, and they never lead the checker anywhere.

#![forbid(unsafe_code)]

use std::os::unix::process::CommandExt;

use farm_agent::sys;
use farm_protocol::{CANDIDATE_UID, CHECKER_UID};
use nix::errno::Errno;
use nix::unistd::{Gid, Uid};

/// Variables that are the checker's business only: every one whose name starts so.
const PRIVATE_PREFIX: &str = "FARM_";

/// Processes the candidate user may have at once in a scoring VM (a fork bomb stops here).
const MAX_PROCESSES: u64 = 512;

fn fail(code: i32, message: &str) -> ! {
    eprintln!("farm-sandbox: {message}");
    std::process::exit(code)
}

/// Why the privileges could not be dropped (the command is then not run).
#[derive(Debug, thiserror::Error)]
enum DropError {
    #[error("only root and the checker (uid {CHECKER_UID}) may use this, not uid {caller}")]
    Caller { caller: Uid },
    #[error("opening the mount namespace of PID 1 failed")]
    OpenNamespace(#[source] std::io::Error),
    #[error("entering the mount namespace of PID 1 failed")]
    EnterNamespace(#[source] Errno),
    #[error("dropping the supplementary groups failed")]
    Groups(#[source] Errno),
    #[error("setting gid {CANDIDATE_UID} failed")]
    Gid(#[source] Errno),
    #[error("setting uid {CANDIDATE_UID} failed")]
    Uid(#[source] Errno),
    #[error("reading the uids and gids back failed")]
    ReadIds(#[source] Errno),
    #[error("the uids or gids did not all change")]
    IdsUnchanged,
    #[error("root could be regained after dropping it")]
    RootRegained,
    #[error("setting no_new_privs failed")]
    NoNewPrivs(#[source] Errno),
}

fn drop_privileges() -> Result<(), DropError> {
    let caller = Uid::current();
    if !caller.is_root() && caller.as_raw() != CHECKER_UID {
        return Err(DropError::Caller { caller });
    }
    // The ordinary view of the file system (PID 1's), while this process is still root.
    let init_namespace = std::fs::File::open("/proc/1/ns/mnt").map_err(DropError::OpenNamespace)?;
    nix::sched::setns(init_namespace, nix::sched::CloneFlags::CLONE_NEWNS).map_err(DropError::EnterNamespace)?;
    let (uid, gid) = (Uid::from_raw(CANDIDATE_UID), Gid::from_raw(CANDIDATE_UID));
    nix::unistd::setgroups(&[]).map_err(DropError::Groups)?;
    nix::unistd::setresgid(gid, gid, gid).map_err(DropError::Gid)?;
    nix::unistd::setresuid(uid, uid, uid).map_err(DropError::Uid)?;
    let ids = nix::unistd::getresuid().map_err(DropError::ReadIds)?;
    let gids = nix::unistd::getresgid().map_err(DropError::ReadIds)?;
    if [ids.real, ids.effective, ids.saved] != [uid; 3] || [gids.real, gids.effective, gids.saved] != [gid; 3] {
        return Err(DropError::IdsUnchanged);
    }
    if nix::unistd::setuid(Uid::from_raw(0)).is_ok() {
        return Err(DropError::RootRegained);
    }
    nix::sys::prctl::set_no_new_privs().map_err(DropError::NoNewPrivs)?;
    let _ = nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_CORE, 0, 0);
    let _ = nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NPROC, MAX_PROCESSES, MAX_PROCESSES);
    Ok(())
}

fn main() {
    if let Err(e) = drop_privileges() {
        fail(126, &farm_agent::describe(&e));
    }
    sys::close_from(3);
    let mut args = std::env::args_os().skip(1).peekable();
    let mut cwd = std::ffi::OsString::from("/workspace");
    if args.peek().is_some_and(|a| a == "-C") {
        args.next();
        cwd = args.next().unwrap_or_else(|| fail(2, "-C needs a folder"));
    }
    if args.peek().is_some_and(|a| a == "--") {
        args.next();
    }
    let Some(program) = args.next() else {
        fail(
            2,
            "usage: farm-sandbox [-C DIR] CMD [ARGS...] (runs CMD as the unprivileged user farm, in /workspace or DIR)",
        );
    };
    let mut command = std::process::Command::new(&program);
    command.args(args).current_dir(&cwd);
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with(PRIVATE_PREFIX) {
            command.env_remove(name);
        }
    }
    command
        .env("HOME", "/tmp")
        .env("TMPDIR", "/tmp")
        .env("USER", "farm")
        .env("LOGNAME", "farm");
    let error = command.exec();
    fail(127, &format!("cannot run {}: {error}", program.to_string_lossy()));
}
