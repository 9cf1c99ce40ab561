//! Ids of what the service makes (sandboxes, sessions, rollouts, groups) and the tokens of
//! open ports: 128 bits from the operating system's CSPRNG (`getrandom`), as hex. An id names
//! something a tenant owns, and the owner check is what guards it; an id that cannot be
//! guessed is the second wall, so it never comes from a clock, a counter or a pid.

/// `N` random bytes from the operating system.
pub fn random<const N: usize>() -> [u8; N] {
    let mut bytes = [0u8; N];
    // The kernel's CSPRNG does not fail once it is seeded; without it nothing here is safe.
    getrandom::getrandom(&mut bytes).expect("the operating system's random number generator failed");
    bytes
}

/// 128 random bits as 32 hex digits (a DNS label too).
pub fn random_hex() -> String {
    random::<16>().iter().map(|b| format!("{b:02x}")).collect()
}

/// A new id: `PREFIX-` and 128 random bits.
pub fn new_id(prefix: &str) -> String {
    format!("{prefix}-{}", random_hex())
}

/// A sandbox id its caller owns. The transports get one only from `Sandboxes::resolve`,
/// which holds the id to its caller, and every call on a sandbox takes one: a call that skips
/// the owner check does not compile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxId(String);

impl SandboxId {
    /// One the service made or found for the caller itself (never a caller's raw id).
    pub(crate) fn trusted(id: &str) -> SandboxId {
        SandboxId(id.to_string())
    }
}

impl std::ops::Deref for SandboxId {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for SandboxId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A session id its caller owns: made only by `Service::resolve_session` and by the calls
/// that open a session, so no call on a session can skip its owner check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionId(String);

impl SessionId {
    /// One the service made or found itself (never a caller's raw id).
    pub(crate) fn trusted(id: &str) -> SessionId {
        SessionId(id.to_string())
    }
}

impl std::ops::Deref for SessionId {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for SessionId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn ids_are_128_random_bits() {
        let (a, b) = (super::new_id("sb"), super::new_id("sb"));
        assert_ne!(a, b);
        assert_eq!(a.len(), "sb-".len() + 32);
        assert!(a[3..].bytes().all(|c| c.is_ascii_hexdigit()), "{a}");
    }
}
