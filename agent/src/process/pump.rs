//! The one thread that drains every background process's output streams and notes its end.

use std::fs::File;
use std::io::{ErrorKind as IoKind, Read};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::process::ExitStatusExt;
use std::process::Child;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use farm_protocol::process::{ProcessStatus, Stream};
use farm_protocol::{AgentError, ErrorKind};

use super::Process;
use crate::sys;

/// What the pump watches: an output stream, or a process's end.
pub(super) enum Watch {
    Output {
        process: Arc<Process>,
        stream: Stream,
        file: File,
    },
    End {
        process: Arc<Process>,
        child: Child,
        ended: OwnedFd,
    },
}

impl Watch {
    fn process(&self) -> &Process {
        match self {
            Watch::Output { process, .. } | Watch::End { process, .. } => process,
        }
    }

    fn fd(&self) -> RawFd {
        match self {
            Watch::Output { file, .. } => file.as_raw_fd(),
            Watch::End { ended, .. } => ended.as_raw_fd(),
        }
    }

    /// Acts on its descriptor being ready; returns whether it is still watched.
    fn ready(&mut self, buf: &mut [u8]) -> bool {
        match self {
            Watch::Output { process, stream, file } => {
                // Ready, so the read does not block (the descriptor is non-blocking when it is
                // a terminal's master, shared with its writer: a spurious wake-up reads
                // nothing). A terminal's master reads EIO once every process left it: its end.
                let n = match file.read(buf) {
                    Ok(n) => n,
                    Err(e) if matches!(e.kind(), IoKind::WouldBlock | IoKind::Interrupted) => return true,
                    Err(_) => 0,
                };
                let mut live = process.lock();
                let ring = Process::ring(&mut live, *stream);
                if n == 0 {
                    ring.closed = true;
                } else {
                    ring.push(&buf[..n]);
                }
                process.changed.notify_all();
                n != 0
            }
            Watch::End { process, child, .. } => {
                let status = match child.try_wait() {
                    Ok(None) => return true,
                    Ok(Some(s)) => ProcessStatus::Exited {
                        exit_code: s.code(),
                        signal: s.signal(),
                    },
                    Err(_) => ProcessStatus::Exited {
                        exit_code: None,
                        signal: None,
                    },
                };
                let mut live = process.lock();
                live.status = status;
                live.ended_at = Some(Instant::now());
                process.changed.notify_all();
                false
            }
        }
    }
}

/// One thread for every background process: it waits on all their output streams and ends
/// at once and moves what is ready, so a thousand processes cost the agent one thread, not
/// three thousand (a small guest's thread limit is about two thousand).
pub(super) struct Pump {
    added: Mutex<Vec<Watch>>,
    /// Written to when `added` gains something; the pump's wait includes its read end.
    wake: OwnedFd,
}

static PUMP: OnceLock<Result<Pump, String>> = OnceLock::new();

pub(super) fn pump() -> Result<&'static Pump, AgentError> {
    let started = PUMP.get_or_init(|| {
        let (wake_read, wake) = sys::wake_pipe().map_err(|e| format!("the pump's pipe: {e}"))?;
        std::thread::Builder::new()
            .name("process-pump".into())
            .spawn(move || run_pump(wake_read))
            .map_err(|e| format!("starting the process pump: {e}"))?;
        Ok(Pump {
            added: Mutex::new(Vec::new()),
            wake,
        })
    });
    started.as_ref().map_err(|e| AgentError {
        kind: ErrorKind::Internal,
        message: e.clone(),
    })
}

impl Pump {
    pub(super) fn add(&self, watches: Vec<Watch>) {
        self.added.lock().unwrap_or_else(|p| p.into_inner()).extend(watches);
        // A full pipe already wakes the pump.
        let _ = nix::unistd::write(&self.wake, &[1]);
    }
}

fn run_pump(wake: OwnedFd) {
    let mut watches: Vec<Watch> = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    loop {
        if let Some(Ok(pump)) = PUMP.get() {
            watches.append(&mut pump.added.lock().unwrap_or_else(|p| p.into_inner()));
        }
        // An ended process's leftover streams, once the table forgot it. (Its end was seen,
        // so nothing else of it is watched.)
        watches.retain(|watch| !watch.process().forgotten.load(Ordering::Relaxed));
        let mut fds: Vec<(RawFd, bool)> = std::iter::once(wake.as_raw_fd())
            .chain(watches.iter().map(Watch::fd))
            .map(|fd| (fd, false))
            .collect();
        if sys::wait_readable(&mut fds).is_err() {
            std::thread::sleep(Duration::from_millis(10));
            continue;
        }
        if fds[0].1 {
            let mut drained = [0u8; 256];
            while matches!(nix::unistd::read(wake.as_raw_fd(), &mut drained), Ok(n) if n > 0) {}
        }
        let mut index = 0;
        watches.retain_mut(|watch| {
            index += 1;
            !fds[index].1 || watch.ready(&mut buf)
        });
    }
}
