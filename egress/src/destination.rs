//! Where a connection really goes: names resolved on the host, and which addresses reach the
//! same listener. Rules are bound to the addresses of the hosts they name as well as to the
//! names, so another name for an inspected host (its IP literal, `localhost`, `127.1`, the
//! host's own interface address) cannot reach it uninspected.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

/// The name a guest reaches the host's own loopback by (allowlisted as `host.farm.internal:PORT`),
/// as containers have `host.docker.internal`: inside a guest, 127.0.0.1 is the guest itself.
pub const HOST_ALIAS: &str = "host.farm.internal";

/// How long resolving or connecting may take.
pub(crate) const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(15);

/// The addresses `host:port` resolves to on the host ([`HOST_ALIAS`] is the host's loopback).
/// IP literals in any form the system resolver reads (`127.1`, `0x7f.1`, `::ffff:127.0.0.1`)
/// come out as plain addresses.
pub(crate) async fn resolve(host: &str, port: u16) -> std::io::Result<Vec<SocketAddr>> {
    let name = if host.eq_ignore_ascii_case(HOST_ALIAS) {
        "127.0.0.1"
    } else {
        host
    };
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
}
