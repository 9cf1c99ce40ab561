//! `git push` over smart HTTP as a push rule reads it: the ref-update commands at the start of
//! a `git-receive-pack` request body, and the check that refuses the whole push when one update
//! is outside the rule's ref patterns.

use super::GitPush;

/// One ref update of a push: `old new name` (ids in hex).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefUpdate {
    pub old: String,
    pub new: String,
    pub name: String,
}

impl RefUpdate {
    pub fn is_delete(&self) -> bool {
        !self.new.is_empty() && self.new.bytes().all(|b| b == b'0')
    }
}

/// Most bytes of ref-update commands read before the pack.
pub const MAX_COMMANDS: usize = 1 << 20;

/// Why a push is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PushError {
    #[error("the push's commands are longer than {MAX_COMMANDS} bytes")]
    TooLong,
    #[error("not a pkt-line length: {0:?}")]
    Length(String),
    #[error("a push without ref updates")]
    NoUpdates,
    #[error("a pkt-line of length {0} where commands belong")]
    ShortLine(usize),
    #[error("a ref update that is not text")]
    NotText,
    #[error("{0:?} in a push is not supported by the push rule")]
    Unsupported(String),
    #[error("not a ref update: {0:?}")]
    NotAnUpdate(String),
    #[error("the push updates {name}, which no pattern allows ({patterns})")]
    RefNotAllowed { name: String, patterns: String },
    #[error("the push deletes {0}, and the rule does not allow deletion")]
    Delete(String),
}

/// The ref-update commands at the start of a `git-receive-pack` request body (pkt-lines up
/// to the first flush packet). Ok(None): more bytes are needed. Returns the updates and how
/// many bytes they took.
pub fn receive_pack_commands(body: &[u8]) -> Result<Option<(Vec<RefUpdate>, usize)>, PushError> {
    let mut at = 0;
    let mut updates = Vec::new();
    loop {
        if body.len() < at + 4 {
            return if at + 4 > MAX_COMMANDS {
                Err(PushError::TooLong)
            } else {
                Ok(None)
            };
        }
        let len_text = String::from_utf8_lossy(&body[at..at + 4]).into_owned();
        let len = usize::from_str_radix(&len_text, 16).map_err(|_| PushError::Length(len_text))?;
        if len == 0 {
            return if updates.is_empty() {
                Err(PushError::NoUpdates)
            } else {
                Ok(Some((updates, at + 4)))
            };
        }
        if len < 4 {
            return Err(PushError::ShortLine(len));
        }
        if at + len > MAX_COMMANDS {
            return Err(PushError::TooLong);
        }
        if body.len() < at + len {
            return Ok(None);
        }
        let line = &body[at + 4..at + len];
        let line = line.split(|b| *b == 0).next().unwrap_or(b""); // capabilities after NUL
        let line = std::str::from_utf8(line)
            .map_err(|_| PushError::NotText)?
            .trim_end_matches('\n');
        if line.starts_with("push-cert") || line.starts_with("shallow") {
            return Err(PushError::Unsupported(line.split(' ').next().unwrap_or("").to_string()));
        }
        let mut parts = line.splitn(3, ' ');
        let (old, new, name) = (
            parts.next().unwrap_or(""),
            parts.next().unwrap_or(""),
            parts.next().unwrap_or(""),
        );
        let hex = |s: &str| (s.len() == 40 || s.len() == 64) && s.bytes().all(|b| b.is_ascii_hexdigit());
        if !hex(old) || !hex(new) || name.is_empty() {
            return Err(PushError::NotAnUpdate(line.to_string()));
        }
        updates.push(RefUpdate {
            old: old.into(),
            new: new.into(),
            name: name.into(),
        });
        at += len;
    }
}

/// Whether `name` matches `pattern` (`*` matches any run of characters, `/` included).
pub fn ref_matches(pattern: &str, name: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == name,
        Some((head, tail)) => {
            let Some(rest) = name.strip_prefix(head) else {
                return false;
            };
            (0..=rest.len())
                .filter(|&i| rest.is_char_boundary(i))
                .any(|i| ref_matches(tail, &rest[i..]))
        }
    }
}

/// Refuses the whole push when one update is outside the patterns, or deletes a ref the rule
/// may not delete.
pub fn check_push(rule: &GitPush, updates: &[RefUpdate]) -> Result<(), PushError> {
    for u in updates {
        if !rule.refs.iter().any(|p| ref_matches(p, &u.name)) {
            return Err(PushError::RefNotAllowed {
                name: u.name.clone(),
                patterns: rule.refs.join(", "),
            });
        }
        if u.is_delete() && !rule.allow_delete {
            return Err(PushError::Delete(u.name.clone()));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pkt(line: &str) -> String {
        format!("{:04x}{line}", line.len() + 4)
    }

    #[test]
    fn a_push_is_read_from_its_commands_and_refused_whole_outside_the_patterns() {
        let (z, a, b) = ("0".repeat(40), "a".repeat(40), "b".repeat(40));
        let body = format!(
            "{}{}0000PACK...",
            pkt(&format!("{z} {a} refs/heads/agent/fix\0report-status side-band-64k\n")),
            pkt(&format!("{a} {b} refs/heads/agent/x/y\n"))
        );
        let (updates, used) = receive_pack_commands(body.as_bytes()).unwrap().unwrap();
        assert_eq!(&body[used..], "PACK...");
        assert_eq!(
            updates.iter().map(|u| u.name.as_str()).collect::<Vec<_>>(),
            ["refs/heads/agent/fix", "refs/heads/agent/x/y"]
        );
        assert_eq!(
            receive_pack_commands(&body.as_bytes()[..30]).unwrap(),
            None,
            "more bytes needed"
        );
        let rule = GitPush {
            refs: vec!["refs/heads/agent/*".into()],
            allow_delete: false,
        };
        assert!(check_push(&rule, &updates).is_ok());
        let main = vec![
            updates[0].clone(),
            RefUpdate {
                old: a.clone(),
                new: b.clone(),
                name: "refs/heads/main".into(),
            },
        ];
        assert!(
            check_push(&rule, &main)
                .unwrap_err()
                .to_string()
                .contains("refs/heads/main"),
            "one bad ref refuses the whole push"
        );
        let tag = vec![RefUpdate {
            old: z.clone(),
            new: a.clone(),
            name: "refs/tags/v1".into(),
        }];
        assert!(check_push(&rule, &tag).is_err());
        let delete = vec![RefUpdate {
            old: a.clone(),
            new: z.clone(),
            name: "refs/heads/agent/old".into(),
        }];
        assert!(check_push(&rule, &delete).unwrap_err().to_string().contains("deletes"));
        assert!(check_push(
            &GitPush {
                allow_delete: true,
                ..rule.clone()
            },
            &delete
        )
        .is_ok());
        for bad in [
            "zzzz",
            "0003",
            &pkt("not an update\n"),
            &format!("{}0000", pkt(&format!("push-cert\0{a}\n"))),
        ] {
            assert!(receive_pack_commands(bad.as_bytes()).is_err(), "{bad}");
        }
        assert!(
            ref_matches("refs/heads/*", "refs/heads/a/b") && !ref_matches("refs/heads/agent/*", "refs/heads/agentx")
        );
    }
}
