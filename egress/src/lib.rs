//! Egress: what a guest may reach on the network, and how.
//!
//! A guest has no network device. Its proxy listener (in the guest agent) carries each
//! connection over the VM's network port as frames ([`farm_protocol::net`]); [`spawn`]
//! serves that port on the host. Each connection's proxy request head is read and checked
//! against the VM's [`Policy`]: hosts on the plain allowlist are relayed as bytes; hosts that
//! request rules name ([`rules`]) are *inspected*: served as HTTP by the proxy itself, request
//! by request, HTTPS included through farm's own CA ([`ca`]); everything else is refused.
//! Every attempt is logged with its verdict.
//!
//! Whatever a policy allows by name, `"*"` included, the proxy connects only to the
//! internet's addresses, checked after resolution on the address actually connected to:
//! loopback, the host's own addresses, link-local, private and unique-local ranges need the
//! policy to name that address and port explicitly, and the service that runs the VM
//! ([`protect`]) is never reached ([`NotInternet`]).
#![forbid(unsafe_code)]

// The checkout this crate is built in (`.cargo/config.toml`): its build is never another clone's.
const _: Option<&str> = option_env!("FARM_CHECKOUT");

pub mod ca;
mod destination;
mod framing;
#[cfg(test)]
mod hostile_tests;
mod inspect;
pub mod policy;
mod port;
mod relay;
pub mod rules;

pub use destination::{protect, NotInternet};
pub use policy::{Attempt, AttemptLog, Policy, SharedPolicy, UpstreamFailure, Verdict, HOST_ALIAS};
pub use port::{spawn, GuestConnector, NetPort};
pub use rules::{check_rule, Credential, Decision, GitPush, RefUpdate, Rule, RuleSet};
