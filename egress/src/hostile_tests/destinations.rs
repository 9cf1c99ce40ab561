//! A guest on a `"*"` policy aiming at the host itself, its private networks and the service
//! that runs it: every spelling of loopback, the host's other addresses, names that resolve
//! (or rebind) to loopback, the cloud metadata address, redirects and CONNECT to private
//! addresses. Each is refused with 403 before anything is connected to, and what the policy
//! names explicitly by address and port still works.

use std::net::{IpAddr, SocketAddr};

use super::*;
use crate::destination::test_names;

/// A listener nothing should reach: whether a connection is waiting on it, without waiting.
struct Untouched(std::net::TcpListener);

impl Untouched {
    fn bind(address: &str) -> Untouched {
        let listener = std::net::TcpListener::bind(address).unwrap();
        listener.set_nonblocking(true).unwrap();
        Untouched(listener)
    }

    fn port(&self) -> u16 {
        self.0.local_addr().unwrap().port()
    }

    /// No connection arrived (the proxy answers only after it connected, so one that was
    /// made is already queued here).
    fn assert_untouched(&self, what: &str) {
        match self.0.accept() {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            other => panic!("{what}: a connection reached the listener: {other:?}"),
        }
    }
}

/// This host's addresses other than loopback (its interfaces').
fn other_host_addresses() -> Vec<IpAddr> {
    nix::ifaddrs::getifaddrs()
        .unwrap()
        .filter_map(|interface| {
            let address = interface.address?;
            match (address.as_sockaddr_in(), address.as_sockaddr_in6()) {
                (Some(v4), _) => Some(IpAddr::V4(v4.ip())),
                (_, Some(v6)) if v6.scope_id() == 0 => Some(IpAddr::V6(v6.ip())),
                _ => None,
            }
        })
        .filter(|ip| !ip.is_loopback())
        .collect()
}

fn bracketed(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => format!("[{v6}]"),
    }
}

/// Asserts the guest got 403 for `head`, naming why, and the refusal was logged.
async fn refused(guest: &Guest, conn: u32, head: &str, log: &Arc<Mutex<Vec<Attempt>>>, why: &str) {
    let reply = guest.send(conn, head.as_bytes()).await.reply().await;
    assert!(reply.starts_with("HTTP/1.1 403 Forbidden"), "{head:?}: {reply}");
    assert!(reply.contains(why), "{head:?}: {reply}");
    assert!(
        log.lock()
            .unwrap()
            .iter()
            .any(|a| matches!(&a.verdict, Verdict::Denied { reason } if reason.contains(why))),
        "{head:?}: the refusal was not logged: {:?}",
        log.lock().unwrap()
    );
}

#[tokio::test]
async fn a_star_policy_never_reaches_the_host_or_its_private_networks() {
    let target = Untouched::bind("0.0.0.0:0");
    let port = target.port();
    let (policy, log) = policy(&[], &["*"]);
    let guest = Guest::start(policy);
    let mut hosts: Vec<String> = [
        "127.0.0.1",
        "localhost",
        "127.1",
        "2130706433",
        "0x7f000001",
        "0x7f.0.0.1",
        "[::1]",
        "[::ffff:127.0.0.1]",
        "0.0.0.0",
        "[::]",
        "host.farm.internal",
        "169.254.169.254",
        "[fe80::1]",
        "10.0.0.1",
        "172.16.5.4",
        "192.168.0.1",
        "100.100.100.200",
        "[fd00::1]",
        "[::ffff:10.0.0.1]",
    ]
    .map(String::from)
    .to_vec();
    hosts.extend(other_host_addresses().into_iter().map(bracketed));
    let mut conn = 0;
    for host in &hosts {
        for head in [
            format!("CONNECT {host}:{port} HTTP/1.1\r\n\r\n"),
            format!("GET http://{host}:{port}/v1/sandboxes HTTP/1.1\r\nHost: x\r\n\r\n"),
        ] {
            conn += 1;
            refused(&guest, conn, &head, &log, "is not the internet").await;
        }
    }
    target.assert_untouched("a star policy");
}

#[tokio::test]
async fn names_that_resolve_or_rebind_to_loopback_are_refused() {
    let target = Untouched::bind("127.0.0.1:0");
    let port = target.port();
    let loopback: IpAddr = "127.0.0.1".parse().unwrap();
    // An address outside every refused range (documentation space).
    let elsewhere: IpAddr = "198.51.100.7".parse().unwrap();
    test_names::script("loopback.farm-test.example", vec![vec![loopback]]);
    test_names::script("mixed.farm-test.example", vec![vec![elsewhere, loopback]]);
    // Rebinding: the first answer is harmless, every later one is loopback.
    test_names::script("rebind.farm-test.example", vec![vec![elsewhere], vec![loopback]]);
    let (policy, log) = policy(&[], &["*"]);
    let guest = Guest::start(policy);
    for (conn, name) in [(1, "loopback.farm-test.example"), (2, "mixed.farm-test.example")] {
        let head = format!("CONNECT {name}:{port} HTTP/1.1\r\n\r\n");
        refused(&guest, conn, &head, &log, "127.0.0.1").await;
    }
    // Resolved once: the address checked is the address connected to, never loopback.
    let head = format!("CONNECT rebind.farm-test.example:{port} HTTP/1.1\r\n\r\n");
    let reply = guest.send(3, head.as_bytes()).await.responses(1).await;
    assert!(!reply.contains("403"), "{reply}");
    assert_eq!(test_names::lookups("rebind.farm-test.example"), 1);
    target.assert_untouched("a rebinding name");
}

#[tokio::test]
async fn what_the_policy_names_by_address_and_port_still_works() {
    let (port, executed) = naive_upstream().await;
    let other = Untouched::bind("127.0.0.1:0");
    let named = format!("127.0.0.1:{port}");
    let (policy, log) = policy(&[], &["*", &named]);
    let guest = Guest::start(policy);
    let ok = format!("GET http://127.0.0.1:{port}/ok HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(guest
        .send(1, ok.as_bytes())
        .await
        .responses(1)
        .await
        .starts_with("HTTP/1.1 200"));
    // Another port of the same address is not named.
    let head = format!("CONNECT 127.0.0.1:{} HTTP/1.1\r\n\r\n", other.port());
    refused(&guest, 2, &head, &log, "is not the internet").await;
    // The host alias names the host's loopback, by port.
    let (policy, _) = super::policy(&[], &[&format!("host.farm.internal:{port}")]);
    let guest = Guest::start(policy);
    let via_alias = format!("GET http://host.farm.internal:{port}/alias HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(guest
        .send(1, via_alias.as_bytes())
        .await
        .responses(1)
        .await
        .starts_with("HTTP/1.1 200"));
    assert_eq!(
        executed.lock().unwrap().clone(),
        ["GET /ok HTTP/1.1", "GET /alias HTTP/1.1"]
    );
    other.assert_untouched("a port the policy does not name");
}

/// An upstream that answers every request with a redirect to `location`.
async fn redirecting_upstream(location: String) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let location = location.clone();
            tokio::spawn(async move {
                let _ = read_head(&mut stream).await;
                let answer = format!(
                    "HTTP/1.1 302 Found\r\nLocation: {location}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                );
                let _ = stream.write_all(answer.as_bytes()).await;
            });
        }
    });
    port
}

#[tokio::test]
async fn a_redirect_to_loopback_is_not_followed_and_its_next_hop_is_refused() {
    let target = Untouched::bind("127.0.0.1:0");
    let location = format!("http://127.0.0.1:{}/v1/sandboxes", target.port());
    let passed = redirecting_upstream(location.clone()).await;
    let inspected = redirecting_upstream(location.clone()).await;
    let rules = [rule(&format!(
        "host = \"host.farm.internal\"\nport = {inspected}\nmethods = [\"GET\"]"
    ))];
    let (policy, log) = policy(&rules, &["*", &format!("127.0.0.1:{passed}")]);
    let guest = Guest::start(policy);
    for (conn, head) in [
        (1, format!("GET http://127.0.0.1:{passed}/ HTTP/1.1\r\nHost: x\r\n\r\n")),
        (
            2,
            format!("GET http://host.farm.internal:{inspected}/ HTTP/1.1\r\nHost: x\r\n\r\n"),
        ),
    ] {
        // The proxy hands the redirect to the guest as it came; it follows nothing itself.
        let reply = guest.send(conn, head.as_bytes()).await.responses(1).await;
        assert!(
            reply.starts_with("HTTP/1.1 302") && reply.contains(&location),
            "{head:?}: {reply}"
        );
    }
    // The guest's next hop is a request of its own, checked as any other.
    let next = format!("GET {location} HTTP/1.1\r\nHost: x\r\n\r\n");
    refused(&guest, 3, &next, &log, "is not the internet").await;
    target.assert_untouched("a redirect's next hop");
}

#[tokio::test]
async fn inspected_hosts_that_resolve_to_private_addresses_are_refused() {
    let target = Untouched::bind("127.0.0.1:0");
    let port = target.port();
    test_names::script("api.inside.farm-test.example", vec![vec!["127.0.0.1".parse().unwrap()]]);
    // A wildcard rule allows the name; where the name leads is checked all the same.
    let rules = [rule("host = \"*.inside.farm-test.example\"\nmethods = [\"GET\"]")];
    let (policy, log) = policy(&rules, &[]);
    let guest = Guest::start(policy);
    let head = format!("GET http://api.inside.farm-test.example:{port}/ HTTP/1.1\r\nHost: x\r\n\r\n");
    let reply = guest.send(1, head.as_bytes()).await.responses(1).await;
    assert!(
        reply.starts_with("HTTP/1.1 403") && reply.contains("is not the internet"),
        "{reply}"
    );
    assert!(log
        .lock()
        .unwrap()
        .iter()
        .any(|a| matches!(&a.verdict, Verdict::Denied { reason } if reason.contains("127.0.0.1"))));
    target.assert_untouched("an inspected name that resolves to loopback");
}

#[tokio::test]
async fn the_service_that_runs_the_vm_is_refused_even_when_named() {
    let service = Untouched::bind("127.0.0.1:0");
    let port = service.port();
    crate::destination::protect(SocketAddr::from(([127, 0, 0, 1], port)));
    let why = "the service that runs this VM";
    // Named in the allowlist, by address and by the host alias.
    let named = [format!("127.0.0.1:{port}"), format!("host.farm.internal:{port}")];
    let (policy, log) = policy(&[], &["*", &named[0], &named[1]]);
    let guest = Guest::start(policy);
    for (conn, head) in [
        (1, format!("CONNECT host.farm.internal:{port} HTTP/1.1\r\n\r\n")),
        (2, format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n")),
        (
            3,
            format!("GET http://localhost:{port}/v1/sandboxes HTTP/1.1\r\nHost: x\r\n\r\n"),
        ),
    ] {
        refused(&guest, conn, &head, &log, why).await;
    }
    // Named by a request rule, inspected.
    let rules = [rule(&format!("host = \"127.0.0.1\"\nport = {port}"))];
    let (policy, log) = super::policy(&rules, &[]);
    let guest = Guest::start(policy);
    let head = format!("GET http://127.0.0.1:{port}/v1/sandboxes HTTP/1.1\r\nHost: x\r\n\r\n");
    let reply = guest.send(1, head.as_bytes()).await.responses(1).await;
    assert!(reply.starts_with("HTTP/1.1 403") && reply.contains(why), "{reply}");
    assert!(log
        .lock()
        .unwrap()
        .iter()
        .any(|a| matches!(&a.verdict, Verdict::Denied { reason } if reason.contains(why))));
    service.assert_untouched("the service's own listener");
}
