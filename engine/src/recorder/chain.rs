//! The journal's hash chain. Each line of `journal.jsonl` ends with the field
//! `"chain":"<64 hex>"`: the SHA-256 of the previous line's chain (empty for the first line)
//! followed by this line without its chain field. A line edited, removed, inserted or moved
//! breaks the chain at the first line after the change, and [`verify`] names that line.
//!
//! This finds mix-ups and careless edits (a row rewritten by hand, a line lost). It does not
//! stop a forger who rewrites the whole journal with chains of their own: nothing in a run
//! folder can, since everything in it is written by whoever holds the folder.

use sha2::{Digest, Sha256};

/// The chain field's text before its value.
const PREFIX: &[u8] = b",\"chain\":\"";
/// Bytes of the chain field at the end of a line: the prefix, 64 hex digits, `"}`.
const FIELD_LEN: usize = PREFIX.len() + 64 + 2;

/// The chain of a line whose JSON without the chain field is `content`, after `previous`.
pub fn link(previous: &str, content: &[u8]) -> String {
    let mut hash = Sha256::new();
    hash.update(previous.as_bytes());
    hash.update(content);
    format!("{:x}", hash.finalize())
}

/// `content` (a JSON object, no newline) with its chain field appended, and the chain.
pub fn seal(previous: &str, content: &[u8]) -> (Vec<u8>, String) {
    debug_assert!(content.ends_with(b"}"));
    let chain = link(previous, content);
    let mut line = content[..content.len() - 1].to_vec();
    line.extend_from_slice(PREFIX);
    line.extend_from_slice(chain.as_bytes());
    line.extend_from_slice(b"\"}");
    (line, chain)
}

/// A line's recorded chain and its content without the chain field, or None when the line
/// has no chain field at its end (a line of a farm before chains).
pub fn split(line: &[u8]) -> Option<(&str, Vec<u8>)> {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    if line.len() < FIELD_LEN + 1 || !line.ends_with(b"\"}") {
        return None;
    }
    let field = line.len() - FIELD_LEN;
    if &line[field..field + PREFIX.len()] != PREFIX {
        return None;
    }
    let chain = std::str::from_utf8(&line[field + PREFIX.len()..line.len() - 2]).ok()?;
    if !chain.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()) {
        return None;
    }
    let mut content = line[..field].to_vec();
    content.push(b'}');
    Some((chain, content))
}

/// Why a line breaks the chain.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChainError {
    #[error("the line has no hash chain (it was written by a farm before chains, or by hand)")]
    Missing,
    #[error("the hash chain breaks here: this line, or one before it, was edited, removed, inserted or moved")]
    Broken,
}

/// Checks one line against the chain so far (`previous`: the last line's chain, empty at the
/// start); returns this line's chain.
pub fn verify(previous: &str, line: &[u8]) -> Result<String, ChainError> {
    let (chain, content) = split(line).ok_or(ChainError::Missing)?;
    if link(previous, &content) != chain {
        return Err(ChainError::Broken);
    }
    Ok(chain.to_string())
}

/// Seals every chained line of the journal at `path` again, in order (after `farm repair`
/// moved lines aside, the chain would break at the gap); lines without a chain stay as they
/// are. The lengths of lines do not change. Returns how many lines got a new chain; the file
/// is replaced atomically when any did.
pub fn reseal(path: &std::path::Path) -> std::io::Result<usize> {
    let text = match std::fs::read(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e),
    };
    let (mut out, mut previous, mut changed) = (Vec::with_capacity(text.len()), String::new(), 0);
    for line in text.split_inclusive(|b| *b == b'\n') {
        match split(line) {
            Some((chain, content)) if line.ends_with(b"\n") => {
                let (sealed, next) = seal(&previous, &content);
                changed += usize::from(next != chain);
                out.extend_from_slice(&sealed);
                out.push(b'\n');
                previous = next;
            }
            _ => out.extend_from_slice(line),
        }
    }
    if changed > 0 {
        let tmp = path.with_extension("jsonl.reseal.tmp");
        std::fs::write(&tmp, &out)?;
        std::fs::File::open(&tmp)?.sync_all()?;
        std::fs::rename(&tmp, path)?;
    }
    Ok(changed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chain_finds_an_edited_removed_or_moved_line() {
        let rows = [b"{\"n\":1}".as_slice(), b"{\"n\":2}", b"{\"n\":3}"];
        let mut previous = String::new();
        let mut lines = Vec::new();
        for row in rows {
            let (line, chain) = seal(&previous, row);
            lines.push(line);
            previous = chain;
        }
        let check = |lines: &[Vec<u8>]| -> Result<(), (usize, ChainError)> {
            let mut previous = String::new();
            for (i, line) in lines.iter().enumerate() {
                previous = verify(&previous, line).map_err(|e| (i + 1, e))?;
            }
            Ok(())
        };
        assert_eq!(check(&lines), Ok(()));
        assert_eq!(split(&lines[0]).unwrap().1, rows[0]);
        let mut edited = lines.clone();
        edited[1] = String::from_utf8(edited[1].clone())
            .unwrap()
            .replace("2", "7")
            .into_bytes();
        assert_eq!(check(&edited), Err((2, ChainError::Broken)));
        let removed = vec![lines[0].clone(), lines[2].clone()];
        assert_eq!(check(&removed), Err((2, ChainError::Broken)));
        let moved = vec![lines[1].clone(), lines[0].clone(), lines[2].clone()];
        assert_eq!(check(&moved), Err((1, ChainError::Broken)));
        assert_eq!(check(&[b"{\"n\":1}".to_vec()]), Err((1, ChainError::Missing)));
    }
}
