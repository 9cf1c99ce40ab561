//! Idempotency keys, for every front-end that makes something on request (`farm serve`'s
//! submits, sandboxes): a retry with the same key and the same body gets the first answer; a
//! retry while the first is still being made is told to wait; the same key with another body
//! is refused. A front-end keeps one [`Keys`] per kind of answer and holds it under its own
//! lock; nothing here waits.

use std::collections::{HashMap, HashSet};

/// What a key says of a request that carries it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim<V> {
    /// Nothing was made with this key: the caller makes it now, and then [`Keys::settle`]s.
    Claimed,
    /// The answer the first request with this key and body got.
    Answered(V),
}

/// Why a key was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum KeyRefusal {
    /// A request with this key is being made right now: retry.
    #[error("a request with this key is in progress: retry")]
    InProgress,
    /// The key was used with a different body.
    #[error("this key was used with a different request body")]
    OtherBody,
}

/// Keys seen, with the digest of the body each came with and its answer, and the keys whose
/// request is being made now.
#[derive(Debug)]
pub struct Keys<V> {
    answered: HashMap<String, (String, V)>,
    in_progress: HashSet<String>,
}

impl<V> Default for Keys<V> {
    fn default() -> Self {
        Keys {
            answered: HashMap::new(),
            in_progress: HashSet::new(),
        }
    }
}

impl<V: Clone> Keys<V> {
    /// The answer `key` got before, without claiming it.
    pub fn answered(&self, key: &str, digest: &str) -> Result<Option<V>, KeyRefusal> {
        match self.answered.get(key) {
            Some((seen, _)) if seen != digest => Err(KeyRefusal::OtherBody),
            Some((_, answer)) => Ok(Some(answer.clone())),
            None => Ok(None),
        }
    }

    /// The answer `key` got before, or the key claimed for a request about to be made.
    pub fn claim(&mut self, key: &str, digest: &str) -> Result<Claim<V>, KeyRefusal> {
        if let Some(answer) = self.answered(key, digest)? {
            return Ok(Claim::Answered(answer));
        }
        if !self.in_progress.insert(key.to_string()) {
            return Err(KeyRefusal::InProgress);
        }
        Ok(Claim::Claimed)
    }

    /// The claimed request is over: its answer is kept for retries (None: it failed, and a
    /// retry makes it afresh).
    pub fn settle(&mut self, key: &str, digest: &str, answer: Option<V>) {
        self.in_progress.remove(key);
        if let Some(answer) = answer {
            self.answered.insert(key.to_string(), (digest.to_string(), answer));
        }
    }

    /// An answer recorded by an earlier process, taken up at start.
    pub fn restore(&mut self, key: String, digest: String, answer: V) {
        self.answered.insert(key, (digest, answer));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_retry_gets_the_first_answer_and_nothing_else_does() {
        let mut keys: Keys<String> = Keys::default();
        assert_eq!(keys.claim("k", "d1"), Ok(Claim::Claimed));
        assert_eq!(keys.claim("k", "d1"), Err(KeyRefusal::InProgress), "while it is made");
        keys.settle("k", "d1", Some("sb-1".into()));
        assert_eq!(keys.claim("k", "d1"), Ok(Claim::Answered("sb-1".into())));
        assert_eq!(keys.claim("k", "d2"), Err(KeyRefusal::OtherBody));
        assert_eq!(keys.answered("k", "d1"), Ok(Some("sb-1".into())));
        // A request that failed leaves its key free for a retry.
        assert_eq!(keys.claim("j", "d"), Ok(Claim::Claimed));
        keys.settle("j", "d", None);
        assert_eq!(keys.claim("j", "d"), Ok(Claim::Claimed));
        keys.restore("r".into(), "d".into(), "sb-9".into());
        assert_eq!(keys.answered("r", "d"), Ok(Some("sb-9".into())));
    }
}
