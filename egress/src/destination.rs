//! Where a connection really goes: names resolved on the host, which addresses reach the
//! same listener, and which are not the internet's. Rules are bound to the addresses of the
//! hosts they name as well as to the names, so another name for an inspected host (its IP
//! literal, `localhost`, `127.1`, the host's own interface address) cannot reach it
//! uninspected. And whatever a policy allows by name (`"*"` included), the proxy connects
//! to the host itself, to private, link-local or otherwise non-internet addresses only where
//! the policy names that address and port explicitly ([`NotInternet`]), and to the service
//! that runs the VM never ([`protect`]).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Mutex;
use std::time::Duration;

/// The name a guest reaches the host's own loopback by (allowlisted as `host.farm.internal:PORT`),
/// as containers have `host.docker.internal`: inside a guest, 127.0.0.1 is the guest itself.
pub const HOST_ALIAS: &str = "host.farm.internal";

/// How long resolving or connecting may take.
pub(crate) const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(15);

/// The addresses `host:port` resolves to on the host ([`HOST_ALIAS`] is the host's loopback).
/// IP literals in any form the system resolver reads (`127.1`, `0x7f.1`, `::ffff:127.0.0.1`)
/// come out as plain addresses. Each connection resolves once: the addresses checked are the
/// addresses connected to, so a name that answers differently the second time (DNS
/// rebinding) has no second time.
pub(crate) async fn resolve(host: &str, port: u16) -> std::io::Result<Vec<SocketAddr>> {
    let name = if host.eq_ignore_ascii_case(HOST_ALIAS) {
        "127.0.0.1"
    } else {
        host
    };
    #[cfg(test)]
    if let Some(addresses) = test_names::answer(name, port) {
        return Ok(addresses);
    }
    let addresses: Vec<SocketAddr> = tokio::net::lookup_host((name, port))
        .await?
        .map(|a| SocketAddr::new(canonical(a.ip()), a.port()))
        .collect();
    if addresses.is_empty() {
        return Err(std::io::Error::other("the name has no address"));
    }
    Ok(addresses)
}

/// An IPv4-mapped IPv6 address as the IPv4 address it is.
pub(crate) fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
        v4 => v4,
    }
}

/// Why an address is not the internet's: the proxy connects there only when the policy
/// names that address and port explicitly, never for `"*"` or a name that resolves there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotInternet {
    /// 127.0.0.0/8, ::1.
    Loopback,
    /// 0.0.0.0/8, :: (a connection there reaches the host itself).
    Unspecified,
    /// One of this host's interface addresses.
    ThisHost,
    /// 169.254.0.0/16 (the cloud metadata address among them), fe80::/10.
    LinkLocal,
    /// 10/8, 172.16/12, 192.168/16.
    Private,
    /// fc00::/7 (and the old site-local fec0::/10).
    UniqueLocal,
    /// 100.64.0.0/10, carrier-grade NAT (some clouds' metadata services live there).
    SharedAddressSpace,
    /// Multicast, broadcast and reserved ranges (224.0.0.0/3, ff00::/8).
    Multicast,
}

impl std::fmt::Display for NotInternet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            NotInternet::Loopback => "loopback",
            NotInternet::Unspecified => "the unspecified address (the host itself)",
            NotInternet::ThisHost => "an address of this host",
            NotInternet::LinkLocal => "link-local (cloud metadata lives there)",
            NotInternet::Private => "a private address",
            NotInternet::UniqueLocal => "a unique-local address",
            NotInternet::SharedAddressSpace => "shared address space (carrier-grade NAT)",
            NotInternet::Multicast => "multicast, broadcast or reserved",
        })
    }
}

/// Whether `ip` is not the internet's, and why. IPv4 addresses carried in IPv6 forms
/// (IPv4-mapped, IPv4-compatible, NAT64 `64:ff9b::/96`, 6to4 `2002::/16`) are judged as the
/// IPv4 address they carry. Documentation and benchmarking ranges are *not* refused: some
/// networks (this project's development machines among them) route them as the internet.
pub(crate) fn not_internet(ip: IpAddr, local: &LocalAddresses) -> Option<NotInternet> {
    let ip = canonical(ip);
    if local.0.contains(&ip) {
        return Some(NotInternet::ThisHost);
    }
    match ip {
        IpAddr::V4(v4) => not_internet_v4(v4),
        IpAddr::V6(v6) => not_internet_v6(v6),
    }
}

fn not_internet_v4(ip: Ipv4Addr) -> Option<NotInternet> {
    let [a, b, ..] = ip.octets();
    Some(match (a, b) {
        (127, _) => NotInternet::Loopback,
        (0, _) => NotInternet::Unspecified,
        (169, 254) => NotInternet::LinkLocal,
        (10, _) | (192, 168) => NotInternet::Private,
        (172, b) if (16..32).contains(&b) => NotInternet::Private,
        (100, b) if (64..128).contains(&b) => NotInternet::SharedAddressSpace,
        (a, _) if a >= 224 => NotInternet::Multicast,
        _ => return None,
    })
}

fn not_internet_v6(ip: Ipv6Addr) -> Option<NotInternet> {
    let segments = ip.segments();
    let embedded = |high: u16, low: u16| Ipv4Addr::from(((high as u32) << 16) | low as u32);
    if ip.is_loopback() {
        return Some(NotInternet::Loopback);
    }
    if ip.is_unspecified() {
        return Some(NotInternet::Unspecified);
    }
    match segments {
        // IPv4-compatible (::a.b.c.d, deprecated) and NAT64's well-known prefix.
        [0, 0, 0, 0, 0, 0, high, low] | [0x64, 0xff9b, 0, 0, 0, 0, high, low] => {
            return not_internet_v4(embedded(high, low));
        }
        // 6to4: 2002:AABB:CCDD::/48 carries a.b.c.d.
        [0x2002, high, low, ..] => return not_internet_v4(embedded(high, low)),
        _ => {}
    }
    let first = segments[0];
    if first & 0xffc0 == 0xfe80 {
        Some(NotInternet::LinkLocal)
    } else if first & 0xfe00 == 0xfc00 || first & 0xffc0 == 0xfec0 {
        Some(NotInternet::UniqueLocal)
    } else if first & 0xff00 == 0xff00 {
        Some(NotInternet::Multicast)
    } else {
        None
    }
}

/// The listeners of the service that runs the VMs (`farm serve`'s address): no guest
/// connection goes there, whatever its policy names.
static PROTECTED: Mutex<Vec<SocketAddr>> = Mutex::new(Vec::new());

/// Marks `listener` as the control plane of this process: the proxy refuses every connection
/// to it (and, when it listens on an unspecified address, to that port on any address of
/// this host), even one a policy names explicitly.
pub fn protect(listener: SocketAddr) {
    let mut protected = PROTECTED.lock().unwrap_or_else(|e| e.into_inner());
    if !protected.contains(&listener) {
        protected.push(listener);
    }
}

/// Whether `address` reaches a listener given to [`protect`].
pub(crate) fn is_protected(address: SocketAddr, local: &LocalAddresses) -> bool {
    let protected = PROTECTED.lock().unwrap_or_else(|e| e.into_inner());
    protected.iter().any(|listener| {
        listener.port() == address.port()
            && (local.same_destination(listener.ip(), address.ip())
                || listener.ip().is_unspecified() && local.is_local(address.ip()))
    })
}

/// This host's own addresses: every interface's (a listener on 0.0.0.0 answers on each).
pub(crate) struct LocalAddresses(Vec<IpAddr>);

impl LocalAddresses {
    pub(crate) fn probe() -> LocalAddresses {
        let addresses = nix::ifaddrs::getifaddrs()
            .map(|all| {
                all.filter_map(|interface| {
                    let address = interface.address?;
                    let ip = match (address.as_sockaddr_in(), address.as_sockaddr_in6()) {
                        (Some(v4), _) => IpAddr::V4(v4.ip()),
                        (_, Some(v6)) => IpAddr::V6(v6.ip()),
                        _ => return None,
                    };
                    Some(canonical(ip))
                })
                .collect()
            })
            .unwrap_or_default();
        LocalAddresses(addresses)
    }

    /// Whether `ip` is this host: loopback (all of 127.0.0.0/8 and ::1), unspecified
    /// (0.0.0.0 and :: connect to the host itself) or an interface's address.
    pub(crate) fn is_local(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        ip.is_loopback() || ip.is_unspecified() || self.0.contains(&ip)
    }

    /// Whether two addresses reach the same listener: the same address, or both this host.
    pub(crate) fn same_destination(&self, a: IpAddr, b: IpAddr) -> bool {
        canonical(a) == canonical(b) || (self.is_local(a) && self.is_local(b))
    }
}

/// Names with scripted answers, for tests: each lookup of a name takes the next answer (the
/// last one repeats), so a name can answer differently the second time, as a rebinding DNS
/// server's does.
#[cfg(test)]
pub(crate) mod test_names {
    use std::collections::HashMap;
    use std::net::{IpAddr, SocketAddr};
    use std::sync::Mutex;

    /// Each name's answers, and how many times it was looked up.
    type Scripted = HashMap<String, (Vec<Vec<IpAddr>>, usize)>;

    static ANSWERS: Mutex<Option<Scripted>> = Mutex::new(None);

    /// Scripts `name`'s answers (names are per test: tests run at once).
    pub(crate) fn script(name: &str, answers: Vec<Vec<IpAddr>>) {
        let mut all = ANSWERS.lock().unwrap();
        all.get_or_insert_with(HashMap::new)
            .insert(name.to_ascii_lowercase(), (answers, 0));
    }

    /// How many times `name` was looked up.
    pub(crate) fn lookups(name: &str) -> usize {
        let all = ANSWERS.lock().unwrap();
        all.as_ref()
            .and_then(|m| m.get(&name.to_ascii_lowercase()))
            .map_or(0, |(_, n)| *n)
    }

    pub(super) fn answer(name: &str, port: u16) -> Option<Vec<SocketAddr>> {
        let mut all = ANSWERS.lock().unwrap();
        let (answers, used) = all.as_mut()?.get_mut(&name.to_ascii_lowercase())?;
        let answer = answers.get(*used).or(answers.last())?.clone();
        *used += 1;
        Some(answer.into_iter().map(|ip| SocketAddr::new(ip, port)).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn other_names_for_the_host_resolve_to_the_same_destination() {
        let local = LocalAddresses::probe();
        let loopback: IpAddr = "127.0.0.1".parse().unwrap();
        for name in [
            "127.1",
            "127.0.0.1",
            "localhost",
            "0x7f.0.0.1",
            "::ffff:127.0.0.1",
            "0.0.0.0",
            HOST_ALIAS,
        ] {
            let addresses = resolve(name, 80).await.unwrap();
            assert!(
                addresses.iter().all(|a| local.same_destination(a.ip(), loopback)),
                "{name}: {addresses:?}"
            );
        }
        assert!(local.same_destination("127.0.0.5".parse().unwrap(), "::1".parse().unwrap()));
        assert!(!local.same_destination("192.0.2.7".parse().unwrap(), loopback));
        assert!(local.same_destination("192.0.2.7".parse().unwrap(), "::ffff:192.0.2.7".parse().unwrap()));
        assert!(resolve("no-such-host.invalid", 80).await.is_err());
    }

    #[test]
    fn what_is_not_the_internet() {
        let local = LocalAddresses(vec!["192.0.2.2".parse().unwrap(), "fd00::2".parse().unwrap()]);
        let judged = |text: &str| not_internet(text.parse().unwrap(), &local);
        for (address, why) in [
            ("127.0.0.1", NotInternet::Loopback),
            ("127.255.0.9", NotInternet::Loopback),
            ("::1", NotInternet::Loopback),
            ("::ffff:127.0.0.1", NotInternet::Loopback),
            ("::127.0.0.1", NotInternet::Loopback),
            ("64:ff9b::7f00:1", NotInternet::Loopback),
            ("2002:7f00:1::", NotInternet::Loopback),
            ("0.0.0.0", NotInternet::Unspecified),
            ("0.1.2.3", NotInternet::Unspecified),
            ("::", NotInternet::Unspecified),
            ("192.0.2.2", NotInternet::ThisHost),
            ("::ffff:192.0.2.2", NotInternet::ThisHost),
            ("fd00::2", NotInternet::ThisHost),
            ("169.254.169.254", NotInternet::LinkLocal),
            ("::ffff:169.254.169.254", NotInternet::LinkLocal),
            ("fe80::1", NotInternet::LinkLocal),
            ("10.0.0.1", NotInternet::Private),
            ("172.16.0.1", NotInternet::Private),
            ("172.31.255.255", NotInternet::Private),
            ("192.168.1.1", NotInternet::Private),
            ("::ffff:10.1.2.3", NotInternet::Private),
            ("fc00::1", NotInternet::UniqueLocal),
            ("fdff::1", NotInternet::UniqueLocal),
            ("fec0::1", NotInternet::UniqueLocal),
            ("100.64.0.1", NotInternet::SharedAddressSpace),
            ("100.100.100.200", NotInternet::SharedAddressSpace),
            ("224.0.0.1", NotInternet::Multicast),
            ("255.255.255.255", NotInternet::Multicast),
            ("ff02::1", NotInternet::Multicast),
        ] {
            assert_eq!(judged(address), Some(why), "{address}");
        }
        for address in [
            "8.8.8.8",
            "172.15.0.1",
            "172.32.0.1",
            "100.63.0.1",
            "100.128.0.1",
            "203.0.113.80",
            "192.0.2.9",
            "2606:4700::1111",
            "::ffff:8.8.8.8",
            "2002:808:808::",
        ] {
            assert_eq!(judged(address), None, "{address}");
        }
    }

    #[test]
    fn a_protected_listener_is_refused_on_every_address_of_the_host() {
        let local = LocalAddresses(vec!["192.0.2.2".parse().unwrap()]);
        // A port no other test uses: held open while the test runs.
        let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = held.local_addr().unwrap().port();
        protect(SocketAddr::new("0.0.0.0".parse().unwrap(), port));
        for address in [
            "127.0.0.1",
            "127.0.0.2",
            "::1",
            "192.0.2.2",
            "0.0.0.0",
            "::ffff:127.0.0.1",
        ] {
            let at = SocketAddr::new(address.parse().unwrap(), port);
            assert!(is_protected(at, &local), "{at}");
        }
        assert!(!is_protected(
            SocketAddr::new("127.0.0.1".parse().unwrap(), port ^ 1),
            &local
        ));
        assert!(!is_protected(SocketAddr::new("8.8.8.8".parse().unwrap(), port), &local));
    }
}
