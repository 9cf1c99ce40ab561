//! Background processes ([`farm_protocol::process`]): programs started by one request that
//! run on after it, each in a process group (or, for another user or a terminal, a session)
//! of its own, its output streams drained into bounded rings and its end noted by one pump
//! thread shared by all, and its standard input kept open until closed.
//!
//! The table lives in the agent server's memory, so a snapshot of the guest (a branch, a
//! pause) carries it: the processes, their rings and their pids are there afterwards as they
//! were. Its size is bounded ([`MAX_PROCESSES`], ended ones forgotten oldest first past
//! [`MAX_ENDED`]), and so is every ring, so no process, and no number of them, can make the
//! agent hold more than that.

use std::collections::{BTreeMap, VecDeque};
use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use farm_protocol::process::{
    OutputRead, ProcessInfo, ProcessRequest, ProcessResponse, ProcessStatus, ReadOutputRequest, SpawnRequest, Stream,
    TermSize, MAX_ENDED, MAX_PROCESSES, MAX_READ_BYTES, MAX_RING_BYTES,
};
use farm_protocol::{AgentError, ErrorKind, Program};

use crate::sys;
use crate::users::{self, User};

mod pump;
mod stdin;
use pump::{pump, Watch};
use stdin::write_stdin;

/// The newest bytes of one output stream, addressed by their offset from its start.
#[derive(Debug, Default)]
struct Ring {
    kept: VecDeque<u8>,
    cap: usize,
    /// Bytes written in all: the offset just past the newest byte.
    end: u64,
    /// The writer closed it.
    closed: bool,
}

impl Ring {
    fn new(cap: u64) -> Ring {
        Ring {
            cap: cap.clamp(1, MAX_RING_BYTES) as usize,
            ..Ring::default()
        }
    }

    fn push(&mut self, bytes: &[u8]) {
        self.end += bytes.len() as u64;
        let bytes = &bytes[bytes.len().saturating_sub(self.cap)..];
        let overflow = (self.kept.len() + bytes.len()).saturating_sub(self.cap);
        self.kept.drain(..overflow);
        self.kept.extend(bytes);
    }

    /// The offset of the oldest byte kept.
    fn start(&self) -> u64 {
        self.end - self.kept.len() as u64
    }

    /// Up to `max` bytes from `offset` (from the oldest kept, when it fell out): (where they
    /// start, the bytes).
    fn read(&self, offset: u64, max: u64) -> (u64, Vec<u8>) {
        let from = offset.clamp(self.start(), self.end);
        let skip = (from - self.start()) as usize;
        let take = ((self.end - from).min(max)) as usize;
        (from, self.kept.range(skip..skip + take).copied().collect())
    }
}

/// What changes while a process runs.
struct Live {
    status: ProcessStatus,
    stdout: Ring,
    stderr: Ring,
    /// Its standard input (a terminal's master, for a terminal), until closed.
    stdin: Option<File>,
    /// A terminal's master, for resizing.
    terminal: Option<File>,
    ended_at: Option<Instant>,
}

struct Process {
    pid: u32,
    command: String,
    started_unix_ms: u64,
    pty: bool,
    live: Mutex<Live>,
    changed: Condvar,
    /// Gone from the table: the pump stops draining its streams (which a leftover child of
    /// it may hold open forever).
    forgotten: AtomicBool,
    /// Held by a write to its standard input.
    writing: Mutex<()>,
}

impl Process {
    fn lock(&self) -> MutexGuard<'_, Live> {
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Its state, once `waiting` says no more or `deadline` passes, whichever comes first.
    fn wait_while(&self, deadline: Instant, mut waiting: impl FnMut(&mut Live) -> bool) -> MutexGuard<'_, Live> {
        let mut live = self.lock();
        while waiting(&mut live) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            live = self
                .changed
                .wait_timeout(live, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        live
    }

    fn info(&self) -> ProcessInfo {
        let live = self.lock();
        ProcessInfo {
            pid: self.pid,
            command: self.command.clone(),
            started_unix_ms: self.started_unix_ms,
            status: live.status,
            pty: self.pty,
            stdout_bytes: live.stdout.end,
            stderr_bytes: live.stderr.end,
            stdin_open: live.stdin.is_some(),
        }
    }

    fn ring(live: &mut Live, stream: Stream) -> &mut Ring {
        match stream {
            Stream::Stdout => &mut live.stdout,
            Stream::Stderr => &mut live.stderr,
        }
    }
}

/// Every background process the agent keeps.
#[derive(Default)]
pub struct Table {
    processes: Mutex<BTreeMap<u32, Arc<Process>>>,
}

fn refused(message: String) -> AgentError {
    AgentError {
        kind: ErrorKind::BadRequest,
        message,
    }
}

fn now_unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl Table {
    fn get(&self, pid: u32) -> Result<Arc<Process>, AgentError> {
        let processes = self.processes.lock().unwrap_or_else(|p| p.into_inner());
        processes.get(&pid).cloned().ok_or_else(|| AgentError {
            kind: ErrorKind::NotFound,
            message: format!("no background process {pid}"),
        })
    }

    /// Answers one request; `body` is a write's bytes. The answer's body is a read's bytes.
    pub fn handle(
        &self,
        request: ProcessRequest,
        base_env: &[(String, String)],
        body: &[u8],
    ) -> Result<(ProcessResponse, Vec<u8>), AgentError> {
        match request {
            ProcessRequest::Spawn(spawn) => Ok((ProcessResponse::Info(self.spawn(&spawn, base_env)?), Vec::new())),
            ProcessRequest::List => {
                let all: Vec<Arc<Process>> = self
                    .processes
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .values()
                    .cloned()
                    .collect();
                let processes = all.iter().map(|p| p.info()).collect();
                Ok((ProcessResponse::List { processes }, Vec::new()))
            }
            ProcessRequest::Get { pid } => Ok((ProcessResponse::Info(self.get(pid)?.info()), Vec::new())),
            ProcessRequest::Read(read) => self.read(&read),
            ProcessRequest::Write { pid, close } => {
                let bytes = write_stdin(&self.get(pid)?, body, close)?;
                Ok((ProcessResponse::Written { bytes }, Vec::new()))
            }
            ProcessRequest::Signal { pid, signal } => {
                let process = self.get(pid)?;
                if process.lock().status == ProcessStatus::Running {
                    sys::signal_group(pid, signal).map_err(|e| refused(format!("signal {signal}: {e}")))?;
                }
                Ok((ProcessResponse::Done, Vec::new()))
            }
            ProcessRequest::Wait { pid, timeout_ms } => {
                let process = self.get(pid)?;
                let deadline = Instant::now() + Duration::from_millis(timeout_ms);
                drop(process.wait_while(deadline, |live| live.status == ProcessStatus::Running));
                Ok((ProcessResponse::Info(process.info()), Vec::new()))
            }
            ProcessRequest::Resize { pid, size } => {
                let process = self.get(pid)?;
                let live = process.lock();
                let terminal = live
                    .terminal
                    .as_ref()
                    .ok_or_else(|| refused(format!("process {pid} has no terminal")))?;
                sys::set_window_size(terminal.as_raw_fd(), size.rows, size.cols)
                    .map_err(|e| refused(format!("resizing the terminal of {pid}: {e}")))?;
                Ok((ProcessResponse::Done, Vec::new()))
            }
        }
    }

    fn read(&self, read: &ReadOutputRequest) -> Result<(ProcessResponse, Vec<u8>), AgentError> {
        let process = self.get(read.pid)?;
        let deadline = Instant::now() + Duration::from_millis(read.wait_ms);
        let max = read.max_bytes.clamp(1, MAX_READ_BYTES);
        let mut live = process.wait_while(deadline, |live| {
            let ring = Process::ring(live, read.stream);
            read.offset >= ring.end && !ring.closed
        });
        let status = live.status;
        let ring = Process::ring(&mut live, read.stream);
        let (offset, bytes) = ring.read(read.offset, max);
        let next = offset + bytes.len() as u64;
        let answer = OutputRead {
            offset,
            dropped: offset.saturating_sub(read.offset),
            next,
            eof: ring.closed && next >= ring.end,
            status,
        };
        Ok((ProcessResponse::Output(answer), bytes))
    }

    // Long: one process's start, read top to bottom: the table's room, the user and its
    // environment, pipes or a terminal, the process group or session, then its threads.
    fn spawn(&self, spawn: &SpawnRequest, base_env: &[(String, String)]) -> Result<ProcessInfo, AgentError> {
        self.make_room()?;
        let user = match &spawn.user {
            None => User::ROOT,
            Some(spec) => users::resolve(spec).map_err(|e| refused(crate::describe(&e)))?,
        };
        let mut env: Vec<(String, String)> = base_env.to_vec();
        if let Some(home) = user.home.as_ref().filter(|_| !user.is_root()) {
            env.retain(|(k, _)| k != "HOME");
            env.push(("HOME".into(), home.clone()));
        }
        if spawn.pty.is_some() {
            env.retain(|(k, _)| k != "TERM");
            env.push(("TERM".into(), "xterm-256color".into()));
        }
        env.retain(|(k, _)| !spawn.env.contains_key(k));
        env.extend(spawn.env.iter().map(|(k, v)| (k.clone(), v.clone())));
        let cwd = spawn.cwd.clone().unwrap_or_else(|| "/".into());
        // std's own lookup (a fork of the agent): a background process is not started often enough
        // for the agent's lookup to pay for its fallback.
        let mut command = crate::exec::command_for(&spawn.program, &env, false).map_err(refused)?;
        command.env_clear().envs(env).current_dir(&cwd);
        if !user.is_root() {
            command.uid(user.uid).gid(user.gid);
        }
        let ends = match spawn.pty {
            Some(size) => terminal_ends(&mut command, size, &user)?,
            None => {
                command
                    .stdin(Stdio::piped())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped());
                if user.is_root() {
                    command.process_group(0);
                } else {
                    sys::new_session_on_exec(&mut command);
                }
                None
            }
        };
        let pump = pump()?;
        let mut child = command.spawn().map_err(|e| AgentError {
            kind: ErrorKind::Spawn,
            message: format!(
                "cannot start {} in {cwd:?} as uid {}: {e}",
                display(&spawn.program),
                user.uid
            ),
        })?;
        drop(command); // the terminal's other end, in the child now
        let pid = child.id();
        let (stdin, outputs, terminal, ended) = match watched(&mut child, ends) {
            Ok(watched) => watched,
            Err(e) => {
                // Not kept, so not left running: its group goes, and it is reaped.
                sys::kill_group(pid);
                let _ = child.wait();
                return Err(e);
            }
        };
        let mut stderr = Ring::new(spawn.ring_bytes);
        // A terminal has one stream: stderr is closed and empty from the start.
        stderr.closed = terminal.is_some();
        let process = Arc::new(Process {
            pid,
            command: display(&spawn.program),
            started_unix_ms: now_unix_ms(),
            pty: terminal.is_some(),
            live: Mutex::new(Live {
                status: ProcessStatus::Running,
                stdout: Ring::new(spawn.ring_bytes),
                stderr,
                stdin,
                terminal,
                ended_at: None,
            }),
            changed: Condvar::new(),
            forgotten: AtomicBool::new(false),
            writing: Mutex::new(()),
        });
        self.processes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(pid, process.clone());
        let mut watches: Vec<Watch> = outputs
            .into_iter()
            .map(|(stream, file)| Watch::Output {
                process: process.clone(),
                stream,
                file,
            })
            .collect();
        watches.push(Watch::End { process, child, ended });
        pump.add(watches);
        Ok(self.get(pid)?.info())
    }

    /// Room for one more process: ended ones past [`MAX_ENDED`] are forgotten, oldest first,
    /// and a table full of running ones refuses.
    fn make_room(&self) -> Result<(), AgentError> {
        let mut processes = self.processes.lock().unwrap_or_else(|p| p.into_inner());
        let mut ended: Vec<(Instant, u32)> = processes
            .values()
            .filter_map(|p| p.lock().ended_at.map(|at| (at, p.pid)))
            .collect();
        ended.sort();
        let excess = ended.len().saturating_sub(MAX_ENDED - 1);
        let full = processes.len() >= MAX_PROCESSES;
        let forget = if full { ended.len().max(excess) } else { excess };
        for (_, pid) in ended.into_iter().take(forget) {
            if let Some(gone) = processes.remove(&pid) {
                gone.forgotten.store(true, Ordering::Relaxed);
            }
        }
        if processes.len() >= MAX_PROCESSES {
            return Err(refused(format!(
                "{} background processes are running, the most an agent keeps: wait for or kill one",
                processes.len()
            )));
        }
        Ok(())
    }
}

/// What the table keeps of a started process: its standard input, its output streams, its
/// terminal's master, and the descriptor that says it ended.
type Ends = (Option<File>, Vec<(Stream, File)>, Option<File>, OwnedFd);

fn watched(child: &mut Child, terminal: Option<File>) -> Result<Ends, AgentError> {
    let ended = sys::pidfd_open(child.id()).map_err(|e| refused(format!("watching process {}: {e}", child.id())))?;
    let ends: Ends = match terminal {
        Some(master) => {
            let reader = master.try_clone().map_err(|e| refused(format!("the terminal: {e}")))?;
            let writer = master.try_clone().map_err(|e| refused(format!("the terminal: {e}")))?;
            (Some(writer), vec![(Stream::Stdout, reader)], Some(master), ended)
        }
        None => {
            let stdin = child.stdin.take().map(|p| File::from(OwnedFd::from(p)));
            let stdout = File::from(OwnedFd::from(child.stdout.take().expect("piped")));
            let stderr = File::from(OwnedFd::from(child.stderr.take().expect("piped")));
            (
                stdin,
                vec![(Stream::Stdout, stdout), (Stream::Stderr, stderr)],
                None,
                ended,
            )
        }
    };
    // Writes to its input never block the agent ([`write_stdin`]).
    if let Some(stdin) = &ends.0 {
        sys::set_nonblocking(stdin.as_raw_fd(), true).map_err(|e| refused(format!("its standard input: {e}")))?;
    }
    Ok(ends)
}

/// A terminal for the command: its standard streams are the terminal's other end, and it
/// starts a session with that terminal as its controlling one. Returns the master.
fn terminal_ends(command: &mut Command, size: TermSize, user: &User) -> Result<Option<File>, AgentError> {
    let (master, slave) = sys::open_terminal(size.rows, size.cols).map_err(|e| refused(format!("a terminal: {e}")))?;
    if !user.is_root() {
        // Programs that open their terminal by name (tmux, vim) must be able to.
        sys::give_terminal(&slave, user.uid, user.gid).map_err(|e| refused(format!("the terminal: {e}")))?;
    }
    let copy = |fd: &OwnedFd| fd.try_clone().map_err(|e| refused(format!("the terminal: {e}")));
    command
        .stdin(Stdio::from(copy(&slave)?))
        .stdout(Stdio::from(copy(&slave)?))
        .stderr(Stdio::from(slave));
    sys::terminal_session_on_exec(command);
    Ok(Some(File::from(master)))
}

/// The program as a line, for listings.
fn display(program: &Program) -> String {
    match program {
        Program::Shell(script) => script.clone(),
        Program::Argv(argv) => argv.join(" "),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ring_keeps_the_newest_bytes_and_says_where_they_start() {
        let mut ring = Ring::new(4);
        ring.push(b"ab");
        assert_eq!(ring.read(0, 10), (0, b"ab".to_vec()));
        ring.push(b"cdef");
        assert_eq!((ring.start(), ring.end), (2, 6));
        assert_eq!(ring.read(0, 10), (2, b"cdef".to_vec()), "what fell out is skipped");
        assert_eq!(ring.read(3, 2), (3, b"de".to_vec()));
        assert_eq!(
            ring.read(9, 2),
            (6, Vec::new()),
            "past the end reads nothing, at the end"
        );
        ring.push(&[b'x'; 100]);
        assert_eq!((ring.start(), ring.end), (102, 106));
        assert_eq!(ring.read(0, 10).1, b"xxxx");
    }
}
