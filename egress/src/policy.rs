//! What a VM may reach ([`Policy`]), and what became of each attempt ([`Attempt`]).

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};

use crate::destination::{canonical, not_internet, LocalAddresses};
use crate::rules::RuleSet;

pub use crate::destination::HOST_ALIAS;

/// Where attempts are reported, besides `tracing`.
pub type AttemptLog = Arc<dyn Fn(&Attempt) + Send + Sync>;

/// What a VM may reach, and where its attempts are reported.
#[derive(Clone, Default)]
pub struct Policy {
    /// `host:port` entries (hosts compared without case), passed through whatever is sent.
    pub allow: Vec<String>,
    /// Called with every attempt and its verdict.
    pub log: Option<AttemptLog>,
    /// Request rules ([`crate::rules`]): the hosts they name are inspected request by
    /// request.
    pub rules: Arc<RuleSet>,
}

impl Policy {
    /// Whether `host:port` is on the list; the entry `*` allows every host (each attempt is
    /// still logged).
    pub fn allows(&self, host: &str, port: u16) -> bool {
        let wanted = format!("{}:{port}", host.to_ascii_lowercase());
        self.allow.iter().any(|a| a == "*" || a.to_ascii_lowercase() == wanted)
    }

    /// Whether the proxy may connect to `addresses` (what a name resolved to, or an IP
    /// literal): the reason it may not, when one of them is the service that runs the VM
    /// ([`crate::destination::protect`]: never, whatever the policy names), or is not the
    /// internet's ([`crate::NotInternet`]) and the policy does not name that address and port
    /// explicitly, by address (or as [`HOST_ALIAS`] or `localhost` for the host's loopback) in
    /// `allow` or in a rule with a port. `"*"` and host names never count as naming an address.
    pub(crate) fn refuses_destination(&self, addresses: &[SocketAddr]) -> Option<String> {
        let local = LocalAddresses::probe();
        for &address in addresses {
            if crate::destination::is_protected(address, &local) {
                return Some(format!(
                    "{address} is the service that runs this VM: no guest reaches it, whatever the policy says"
                ));
            }
            let Some(why) = not_internet(address.ip(), &local) else {
                continue;
            };
            if !self.names_explicitly(address) {
                return Some(format!(
                    "{address} is not the internet ({why}): a policy reaches it only by naming \
                     {address} explicitly (\"*\" and host names never do)"
                ));
            }
        }
        None
    }

    /// Whether `allow`, or a rule with a port, names `address` by address and port.
    fn names_explicitly(&self, address: SocketAddr) -> bool {
        let named = |host: &str, port: u16| {
            port == address.port() && literal_addresses(host).contains(&canonical(address.ip()))
        };
        self.allow.iter().any(|entry| {
            entry
                .rsplit_once(':')
                .and_then(|(host, port)| Some((host, port.parse::<u16>().ok()?)))
                .is_some_and(|(host, port)| named(host, port))
        }) || self
            .rules
            .rules()
            .iter()
            .any(|rule| rule.port.is_some_and(|port| named(&rule.host, port)))
    }

    pub(crate) fn report(&self, attempt: Attempt) {
        tracing::info!(target: "farm::net", "{attempt}");
        if let Some(log) = &self.log {
            log(&attempt);
        }
    }
}

/// The addresses a policy entry's host names literally: an IP address (IPv6 in brackets or
/// not) in its standard form, [`HOST_ALIAS`] (the host's 127.0.0.1) or `localhost` (the
/// host's 127.0.0.1 and ::1, which that name always means). Other names and spellings
/// (`127.1`, `0x7f000001`, `db.internal`) name no address.
fn literal_addresses(host: &str) -> Vec<IpAddr> {
    if host.eq_ignore_ascii_case(HOST_ALIAS) {
        return vec![IpAddr::from([127, 0, 0, 1])];
    }
    if host.eq_ignore_ascii_case("localhost") {
        return vec![
            IpAddr::from([127, 0, 0, 1]),
            IpAddr::from(std::net::Ipv6Addr::LOCALHOST),
        ];
    }
    let bare = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
    bare.parse::<IpAddr>().ok().map(canonical).into_iter().collect()
}

/// A VM's current policy (changed between template setup and snapshot, or per fork).
pub type SharedPolicy = Arc<Mutex<Policy>>;

/// One connection attempt (`host:port`) or inspected request (`METHOD [https://]host:port/path`)
/// through the proxy, and its verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempt {
    pub target: String,
    pub verdict: Verdict,
}

/// What the proxy did with an attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Relayed (a host on the allowlist) or sent upstream (an inspected request a rule
    /// allows); `detail` names the rule.
    Allowed { detail: Option<String> },
    /// The policy does not allow it (not on the allowlist, no rule allows the request).
    Denied { reason: String },
    /// Not something the proxy forwards whatever the policy: a malformed request head, or a
    /// request whose framing a server could read another way (answered 400).
    Refused { reason: String },
    /// Allowed, but the host's side of it failed: the guest gets 502 (504 on a timeout).
    UpstreamFailed { failure: UpstreamFailure, detail: String },
}

/// Where an allowed attempt failed on the host's side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpstreamFailure {
    /// The name did not resolve on the host.
    Dns,
    /// Connecting to its addresses failed.
    Connect,
    /// Resolving or connecting did not finish in time.
    Timeout,
    /// The TLS handshake with the upstream failed (its certificate, say).
    Tls,
    /// Connected, but the exchange with the upstream failed.
    Exchange,
}

impl UpstreamFailure {
    /// The status the guest gets.
    pub fn status(self) -> u16 {
        match self {
            UpstreamFailure::Timeout => 504,
            _ => 502,
        }
    }

    /// Whether the failure lies wholly outside the request's content (resolving, connecting,
    /// TLS with the upstream): nothing a guest sends can cause it.
    pub fn before_the_request(self) -> bool {
        !matches!(self, UpstreamFailure::Exchange)
    }

    fn describe(self) -> &'static str {
        match self {
            UpstreamFailure::Dns => "resolving it failed",
            UpstreamFailure::Connect => "connecting failed",
            UpstreamFailure::Timeout => "it did not answer in time",
            UpstreamFailure::Tls => "TLS with it failed",
            UpstreamFailure::Exchange => "the exchange with it failed",
        }
    }
}

impl std::fmt::Display for Attempt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let target = &self.target;
        match &self.verdict {
            Verdict::Allowed { detail: None } => write!(f, "network: allowed {target}"),
            Verdict::Allowed { detail: Some(d) } => write!(f, "network: allowed {target} ({d})"),
            Verdict::Denied { reason } => write!(f, "network: denied {target}: {reason}"),
            Verdict::Refused { reason } => write!(f, "network: refused {target}: {reason}"),
            Verdict::UpstreamFailed { failure, detail } => write!(
                f,
                "network: allowed {target}, but {}: {detail} (the guest got {})",
                failure.describe(),
                failure.status()
            ),
        }
    }
}

impl Attempt {
    pub(crate) fn new(target: impl Into<String>, verdict: Verdict) -> Attempt {
        Attempt {
            target: target.into(),
            verdict,
        }
    }
}
