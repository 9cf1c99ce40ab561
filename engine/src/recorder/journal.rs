//! Reading JSON-lines journals (`journal.jsonl`, `farm serve`'s `requests.jsonl`) without
//! ever dropping data.
//!
//! A journal is appended to, one complete line at a time, and fsynced. The only damage a
//! crash can leave is a torn last line: bytes after the last newline. Readers cut that (the
//! append it belonged to never finished). Any other line that does not parse is damage
//! nobody can explain, so readers stop with an error naming the file and the line, and leave
//! the file as it is; [`repair`] (`farm repair`) moves such lines aside into a side file,
//! byte for byte, so nothing is lost either way.

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};

/// Why a journal could not be read.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    #[error("reading {}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "{}:{line}: not a record ({message}); the file was left as it is. `farm repair {}` moves such lines into a side file and keeps the rest",
        path.display(),
        path.parent().map(|p| p.display().to_string()).unwrap_or_default()
    )]
    BadLine {
        path: PathBuf,
        line: usize,
        message: String,
    },
}

/// Where a journal's complete lines end, and whether a torn last line followed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    /// Bytes up to the end of the last complete line.
    pub good_len: u64,
    /// Bytes of a torn last line after it (0: none).
    pub torn_bytes: u64,
}

/// Calls `each(offset, line)` for every complete line of `path` (with its newline), in
/// order; a missing file has none. A line `each` refuses stops the read with the line's
/// number; a torn last line is reported in the [`Extent`], not passed on.
pub fn for_each_line<E: std::fmt::Display>(
    path: &Path,
    mut each: impl FnMut(u64, &[u8]) -> Result<(), E>,
) -> Result<Extent, JournalError> {
    let io = |source| JournalError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(Extent {
                good_len: 0,
                torn_bytes: 0,
            })
        }
        Err(e) => return Err(io(e)),
    };
    let mut reader = std::io::BufReader::new(file);
    let (mut offset, mut number) = (0u64, 0usize);
    let mut line = Vec::new();
    loop {
        line.clear();
        let n = reader.read_until(b'\n', &mut line).map_err(io)?;
        if n == 0 {
            return Ok(Extent {
                good_len: offset,
                torn_bytes: 0,
            });
        }
        number += 1;
        if line.last() != Some(&b'\n') {
            return Ok(Extent {
                good_len: offset,
                torn_bytes: n as u64,
            });
        }
        each(offset, &line).map_err(|e| JournalError::BadLine {
            path: path.to_path_buf(),
            line: number,
            message: e.to_string(),
        })?;
        offset += n as u64;
    }
}

/// What [`repair`] did to one file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Repaired {
    pub file: PathBuf,
    /// 1-based numbers of the lines moved aside.
    pub bad_lines: Vec<usize>,
    /// Where they went (None when there were none).
    pub quarantine: Option<PathBuf>,
    /// Bytes of a torn last line dropped.
    pub torn_bytes: u64,
    /// For each byte offset `b` of the old file that is a line boundary, the new offset:
    /// what a manifest that counts journal bytes needs.
    map: Vec<(u64, u64)>,
}

impl Repaired {
    /// The new offset of an old line boundary (the end of the file for anything past it).
    pub fn new_offset(&self, old: u64) -> u64 {
        match self.map.binary_search_by_key(&old, |(o, _)| *o) {
            Ok(i) => self.map[i].1,
            Err(i) => self.map.get(i.saturating_sub(1)).map(|(_, n)| *n).unwrap_or(0),
        }
    }
}

/// Rewrites `path` with only the lines `valid` accepts; the others are appended, byte for
/// byte, to `<path>.quarantine`. A torn last line is dropped. The new file replaces the old
/// atomically. Nothing happens to a file that is already sound.
pub fn repair(path: &Path, valid: impl Fn(&[u8]) -> bool) -> Result<Repaired, JournalError> {
    let io = |source| JournalError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut repaired = Repaired {
        file: path.to_path_buf(),
        bad_lines: Vec::new(),
        quarantine: None,
        torn_bytes: 0,
        map: vec![(0, 0)],
    };
    let mut good: Vec<u8> = Vec::new();
    let mut bad: Vec<u8> = Vec::new();
    let mut number = 0;
    let extent = for_each_line(path, |offset, line| -> Result<(), std::convert::Infallible> {
        number += 1;
        if valid(line) {
            good.extend_from_slice(line);
        } else {
            repaired.bad_lines.push(number);
            bad.extend_from_slice(line);
        }
        repaired.map.push((offset + line.len() as u64, good.len() as u64));
        Ok(())
    })?;
    repaired.torn_bytes = extent.torn_bytes;
    if repaired.bad_lines.is_empty() && extent.torn_bytes == 0 {
        return Ok(repaired);
    }
    if !bad.is_empty() {
        let quarantine = PathBuf::from(format!("{}.quarantine", path.display()));
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&quarantine)
            .map_err(io)?;
        file.write_all(&bad).and_then(|_| file.sync_all()).map_err(io)?;
        repaired.quarantine = Some(quarantine);
    }
    let tmp = PathBuf::from(format!("{}.repair.tmp", path.display()));
    let mut file = std::fs::File::create(&tmp).map_err(io)?;
    file.write_all(&good).and_then(|_| file.sync_all()).map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)?;
    Ok(repaired)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, text: &[u8]) -> PathBuf {
        let path = dir.join("journal.jsonl");
        std::fs::write(&path, text).unwrap();
        path
    }

    /// A test line: `{"n": N}`.
    #[derive(serde::Deserialize)]
    struct Numbered {
        n: u64,
    }

    fn numbers(path: &Path) -> Result<(Vec<u64>, Extent), JournalError> {
        let mut seen = Vec::new();
        let extent = for_each_line(path, |_, line| -> Result<(), serde_json::Error> {
            seen.push(serde_json::from_slice::<Numbered>(line)?.n);
            Ok(())
        })?;
        Ok((seen, extent))
    }

    #[test]
    fn a_torn_last_line_is_cut_and_every_good_line_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), b"{\"n\":1}\n{\"n\":2}\n{\"n\":");
        let (seen, extent) = numbers(&path).unwrap();
        assert_eq!(seen, [1, 2]);
        assert_eq!(
            extent,
            Extent {
                good_len: 16,
                torn_bytes: 5
            }
        );
        assert_eq!(numbers(&dir.path().join("missing")).unwrap().1.good_len, 0);
    }

    #[test]
    fn a_bad_line_elsewhere_is_an_error_naming_the_file_and_line() {
        let dir = tempfile::tempdir().unwrap();
        let text = b"{\"n\":1}\n{\"n\":2\n{\"n\":3}\n";
        let path = write(dir.path(), text);
        let err = numbers(&path).unwrap_err().to_string();
        assert!(
            err.contains("journal.jsonl:2: not a record") && err.contains("farm repair"),
            "{err}"
        );
        assert_eq!(std::fs::read(&path).unwrap(), text, "the data stays untouched");
    }

    #[test]
    fn repair_moves_bad_lines_aside_byte_for_byte() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), b"{\"n\":1}\nGARBAGE\n{\"n\":3}\n{\"n\"");
        let valid = |l: &[u8]| serde_json::from_slice::<serde_json::Value>(l).is_ok();
        let repaired = repair(&path, valid).unwrap();
        assert_eq!(repaired.bad_lines, [2]);
        assert_eq!(repaired.torn_bytes, 4);
        assert_eq!(std::fs::read(&path).unwrap(), b"{\"n\":1}\n{\"n\":3}\n");
        assert_eq!(
            std::fs::read(repaired.quarantine.as_ref().unwrap()).unwrap(),
            b"GARBAGE\n"
        );
        // Old line boundaries map to new ones: after line 1 (8), after the bad line (16 -> 8),
        // after line 3 (24 -> 16).
        assert_eq!(
            (repaired.new_offset(8), repaired.new_offset(16), repaired.new_offset(24)),
            (8, 8, 16)
        );
        assert_eq!(numbers(&path).unwrap().0, [1, 3]);
        // A sound file is left alone.
        let again = repair(&path, valid).unwrap();
        assert!(again.bad_lines.is_empty() && again.quarantine.is_none());
    }
}
