//! Writes to a background process's standard input, which never hold the agent.

use std::fs::File;
use std::io::{ErrorKind as IoKind, Write};
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use farm_protocol::AgentError;

use super::{refused, Process};
use crate::sys;

/// How long a write to a process's standard input waits for the program to read.
const STDIN_WAIT: Duration = Duration::from_secs(2);

/// Writes `bytes` to the process's standard input, then closes it when `close` and all of
/// them were taken. A program that does not read fills its pipe (or its terminal's buffer):
/// the write takes what fits within [`STDIN_WAIT`] and answers how much that was, so the
/// writer is told and the agent is never held (backpressure, not a stuck request).
pub(super) fn write_stdin(process: &Arc<Process>, bytes: &[u8], close: bool) -> Result<u64, AgentError> {
    // One write at a time, in the order they came.
    let _writing = process.writing.lock().unwrap_or_else(|p| p.into_inner());
    let stdin = match process.lock().stdin.as_ref() {
        Some(stdin) => stdin
            .try_clone()
            .map_err(|e| refused(format!("writing to process {}: {e}", process.pid)))?,
        None if bytes.is_empty() && close => return Ok(0),
        None => return Err(refused(format!("process {}'s standard input is closed", process.pid))),
    };
    let taken = write_within(&stdin, bytes, STDIN_WAIT)
        .map_err(|e| refused(format!("writing to process {}: {e}", process.pid)))?;
    if close && taken == bytes.len() {
        process.lock().stdin = None;
    }
    Ok(taken as u64)
}

/// Writes what a non-blocking `file` takes of `bytes` within `wait`: how many it took.
fn write_within(mut file: &File, bytes: &[u8], wait: Duration) -> std::io::Result<usize> {
    let deadline = Instant::now() + wait;
    let mut taken = 0;
    while taken < bytes.len() {
        match file.write(&bytes[taken..]) {
            Ok(n) => taken += n,
            Err(e) if e.kind() == IoKind::Interrupted => {}
            Err(e) if e.kind() == IoKind::WouldBlock => {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                sys::poll(&[(file.as_fd(), nix::poll::PollFlags::POLLOUT)], left)?;
            }
            // What was taken stands; the next write says what is wrong.
            Err(_) if taken > 0 => break,
            Err(e) => return Err(e),
        }
    }
    Ok(taken)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::fd::AsRawFd;

    #[test]
    fn a_write_takes_what_a_program_reads_and_never_blocks() {
        let (read, write) = nix::unistd::pipe().unwrap();
        let (mut read, write) = (File::from(read), File::from(write));
        sys::set_nonblocking(write.as_raw_fd(), true).unwrap();
        let mega = vec![b'x'; 1 << 20];
        // Nobody reads: the pipe's buffer is taken, the rest is not, and the write returns.
        let taken = write_within(&write, &mega, Duration::from_millis(200)).unwrap();
        assert!(taken > 0 && taken < mega.len(), "{taken}");
        // A reader drains it: everything is taken.
        let reader = std::thread::spawn(move || {
            let mut all = Vec::new();
            read.read_to_end(&mut all).unwrap();
            all.len()
        });
        assert_eq!(
            write_within(&write, &mega, Duration::from_secs(30)).unwrap(),
            mega.len()
        );
        drop(write);
        assert_eq!(reader.join().unwrap(), taken + mega.len());
    }
}
