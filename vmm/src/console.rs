//! A VM's serial console, read from a socket into a bounded log file.
//!
//! QEMU writes the guest's ttyS0 into a socket whose other end farm reads on a thread of
//! its own; the log file holds at most [`LOG_CAP`] bytes plus a tail. Past the cap the file
//! is rewritten with a note and the last [`TAIL`] bytes, so it always ends with the newest
//! output (what error messages quote) and a guest flooding its console cannot fill the
//! host's disk. Reading never stops, so the guest is never slowed by a full socket.

use std::collections::VecDeque;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;

/// Bytes of console output a log file holds before it is cut back to its tail.
pub const LOG_CAP: u64 = 1 << 20;
/// Bytes of the newest output kept when the log is cut.
pub const TAIL: usize = 64 << 10;

/// Copies everything from `console` into `log` until the socket closes (QEMU exited).
pub fn capture(console: UnixStream, log: PathBuf) -> std::io::Result<()> {
    let file = std::fs::File::create(&log)?;
    std::thread::Builder::new()
        .name("farm-console".into())
        .stack_size(64 << 10)
        .spawn(move || copy_bounded(console, file, LOG_CAP, TAIL))?;
    Ok(())
}

/// The copy loop: bounded by `cap` bytes of log plus `tail` bytes kept after a cut.
pub fn copy_bounded(mut input: impl Read, mut file: std::fs::File, cap: u64, tail: usize) {
    let mut recent: VecDeque<u8> = VecDeque::with_capacity(tail);
    let mut written: u64 = 0;
    let mut dropped: u64 = 0;
    let mut buffer = vec![0u8; 16 << 10];
    loop {
        let n = match input.read(&mut buffer) {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let chunk = &buffer[..n];
        for &b in chunk.iter().skip(chunk.len().saturating_sub(tail)) {
            if recent.len() == tail {
                recent.pop_front();
            }
            recent.push_back(b);
        }
        if written + n as u64 <= cap {
            if file.write_all(chunk).is_err() {
                return;
            }
            written += n as u64;
            continue;
        }
        // Over the cap: start the file again with a note and the newest bytes.
        dropped += written + n as u64 - recent.len() as u64;
        let note = format!("[farm: {dropped} earlier bytes of console output dropped]\n");
        let (a, b) = recent.as_slices();
        let rewritten = file
            .set_len(0)
            .and_then(|_| file.seek(SeekFrom::Start(0)))
            .and_then(|_| file.write_all(note.as_bytes()))
            .and_then(|_| file.write_all(a))
            .and_then(|_| file.write_all(b));
        if rewritten.is_err() {
            return;
        }
        written = (note.len() + recent.len()) as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_leaves_a_bounded_log_that_ends_with_the_newest_output() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("console.log");
        let mut flood = vec![b'x'; 5 << 20];
        flood.extend_from_slice(b"\nlast line\n");
        copy_bounded(&flood[..], std::fs::File::create(&path).unwrap(), 64 << 10, 4096);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.len() as u64 <= (64 << 10) + 4096 + 100, "{} bytes", text.len());
        assert!(
            text.starts_with("[farm: ") && text.contains("earlier bytes of console output dropped"),
            "{}",
            &text[..80]
        );
        assert!(text.ends_with("\nlast line\n"));
        // Quiet consoles are copied as they are.
        copy_bounded(&b"booted\n"[..], std::fs::File::create(&path).unwrap(), 64 << 10, 4096);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "booted\n");
    }
}
