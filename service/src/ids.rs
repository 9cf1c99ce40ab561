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
