//! The host side of a VM's network port ([`farm_protocol::net`]): each connection the guest's
//! proxy listener accepted is read up to the end of its HTTP proxy request head (parsed with
//! `httparse`: `CONNECT host:port`, or an absolute `http://` URL) and checked against the VM's
//! [`Policy`]. A host that request rules name is inspected ([`crate::inspect`]); a host on the
//! allowlist is resolved on the host, checked again by address (so that another name for an
//! inspected host is not passed through), connected to at exactly the addresses checked, and
//! relayed; anything else is answered (`403`, `400`, or `502`/`504` when an allowed host fails
//! on the host's side) and closed. Every attempt is logged with its verdict. With no allowlist
//! (the default, and always for scoring VMs) every attempt is refused at once: a guest never
//! hangs waiting for a network it does not have.

use std::collections::HashMap;
use std::sync::Arc;

use farm_protocol::net::{Frame, Kind, HOST_CONN};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

use crate::destination::{resolve, UPSTREAM_TIMEOUT};
use crate::policy::{Attempt, Policy, SharedPolicy, UpstreamFailure, Verdict};
use crate::relay::{answer, relay, Relayed};
use crate::rules::RuleSet;

/// Bytes of a request head the proxy reads at most before it must see the end of it.
const MAX_HEAD: usize = 16 << 10;

/// A request of the host's for a connection to one of the guest's own services.
pub(crate) struct GuestConnect {
    port: u16,
    reply: tokio::sync::oneshot::Sender<std::io::Result<tokio::io::DuplexStream>>,
}

/// The host's side of a VM's network port: the task serving it (stopped when this drops),
/// and the way to open connections to the guest's own services (`farm serve`'s port proxy).
pub struct NetPort {
    task: tokio::task::JoinHandle<()>,
    connects: mpsc::Sender<GuestConnect>,
    /// Told when the VM's policy changed: the guest's open connections are checked again.
    changed: tokio::sync::watch::Sender<u64>,
    traffic: Arc<Traffic>,
}

/// Bytes through a VM's network port, each way (frames as sent: relayed connections, the
/// host's connections to the guest's own services, and their framing).
#[derive(Debug, Default)]
pub struct Traffic {
    from_guest: std::sync::atomic::AtomicU64,
    to_guest: std::sync::atomic::AtomicU64,
}

impl NetPort {
    /// Bytes the guest sent out and received through this port so far.
    pub fn bytes(&self) -> (u64, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        (
            self.traffic.from_guest.load(Relaxed),
            self.traffic.to_guest.load(Relaxed),
        )
    }

    /// What opens connections to the guest's own services, usable apart from this port.
    pub fn connector(&self) -> GuestConnector {
        GuestConnector(self.connects.clone())
    }

    /// The VM's policy changed: every open connection of the guest's that the new policy
    /// would not open is cut now (a connection whose requests are inspected, whenever the
    /// rules changed: its rules were the old policy's).
    pub fn policy_changed(&self) {
        self.changed.send_modify(|n| *n += 1);
    }
}

/// Opens connections to a guest's own services over its network port; fails once the VM is
/// gone.
#[derive(Clone)]
pub struct GuestConnector(mpsc::Sender<GuestConnect>);

impl GuestConnector {
    #[cfg(test)]
    pub(crate) fn from_sender(connects: mpsc::Sender<GuestConnect>) -> GuestConnector {
        GuestConnector(connects)
    }

    /// A connection to the guest's `127.0.0.1:port`, as a byte stream: it ends when the
    /// guest's side closes, and nothing listening there closes it at once.
    pub async fn connect(&self, port: u16) -> std::io::Result<tokio::io::DuplexStream> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        let gone = || std::io::Error::new(std::io::ErrorKind::NotConnected, "the VM's network port is gone");
        self.0.send(GuestConnect { port, reply }).await.map_err(|_| gone())?;
        answer.await.map_err(|_| gone())?
    }
}

impl Drop for NetPort {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Serves the port until the VM goes.
pub fn spawn(stream: std::os::unix::net::UnixStream, policy: SharedPolicy) -> std::io::Result<NetPort> {
    stream.set_nonblocking(true)?;
    let stream = tokio::net::UnixStream::from_std(stream)?;
    let (connects, requests) = mpsc::channel(16);
    let (changed, changes) = tokio::sync::watch::channel(0);
    let traffic = Arc::new(Traffic::default());
    Ok(NetPort {
        task: tokio::spawn(serve_counting(stream, policy, requests, changes, traffic.clone())),
        connects,
        changed,
        traffic,
    })
}

/// Connections the guest may have open at once through its port, and the host as many more.
const MAX_CONNS: usize = 256;

/// Per connection: the request head still being read, or its relay and where it goes.
enum Conn {
    Head(Vec<u8>),
    Relay(Relayed, Destination),
}

/// Where a relayed connection goes, as the policy that opened it judged it.
#[derive(Clone)]
pub(crate) enum Destination {
    /// A host on the allowlist, passed through.
    Passed { host: String, port: u16 },
    /// A host whose requests are inspected under these rules.
    Inspected(Arc<RuleSet>),
    /// One the host opened to the guest's own service (never cut by the guest's policy).
    Host,
}

impl Destination {
    /// Whether `policy` would open this connection as it is.
    fn allowed_by(&self, policy: &Policy) -> bool {
        match self {
            Destination::Passed { host, port } => policy.allows(host, *port) && !policy.rules.inspects(host, *port),
            Destination::Inspected(rules) => Arc::ptr_eq(rules, &policy.rules),
            Destination::Host => true,
        }
    }
}

#[cfg(test)]
pub(crate) async fn serve(
    stream: tokio::net::UnixStream,
    policy: SharedPolicy,
    connects: mpsc::Receiver<GuestConnect>,
    changes: tokio::sync::watch::Receiver<u64>,
) {
    serve_counting(stream, policy, connects, changes, Arc::default()).await
}

async fn serve_counting(
    stream: tokio::net::UnixStream,
    policy: SharedPolicy,
    mut connects: mpsc::Receiver<GuestConnect>,
    mut changes: tokio::sync::watch::Receiver<u64>,
    traffic: Arc<Traffic>,
) {
    let (mut read, write) = stream.into_split();
    let (closed_tx, mut closed) = mpsc::unbounded_channel();
    let to_guest = spawn_writer(write, closed_tx, traffic.clone());
    let mut conns: HashMap<u32, Conn> = HashMap::new();
    let mut pending = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    let mut host_conns: u32 = 0;
    loop {
        let n = tokio::select! {
            n = read.read(&mut buf) => match n {
                Ok(0) => return tracing::debug!("the guest's network port closed"),
                Err(e) => return tracing::debug!("the guest's network port failed: {e}"),
                Ok(n) => {
                    traffic.from_guest.fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
                    n
                }
            },
            Some(conn) = closed.recv() => {
                conns.remove(&conn);
                continue;
            }
            Ok(()) = changes.changed() => {
                let now = policy.lock().unwrap_or_else(|e| e.into_inner()).clone();
                cut_what_is_no_longer_allowed(&mut conns, &now, &to_guest).await;
                continue;
            }
            Some(GuestConnect { port, reply }) = connects.recv() => {
                let host_count = conns.keys().filter(|id| **id & HOST_CONN != 0).count();
                if host_count >= MAX_CONNS {
                    let _ = reply.send(Err(std::io::Error::other(format!("{MAX_CONNS} connections to the guest are open"))));
                    continue;
                }
                host_conns = host_conns.wrapping_add(1) % HOST_CONN;
                let id = HOST_CONN | host_conns;
                let (ours, theirs) = tokio::io::duplex(256 << 10);
                conns.insert(id, Conn::Relay(relay(id, Vec::new(), ours, to_guest.clone()), Destination::Host));
                let connect = Frame { conn: id, kind: Kind::Connect, payload: port.to_be_bytes().to_vec() };
                if to_guest.send(connect).await.is_err() {
                    return tracing::debug!("the guest's network port stopped taking frames");
                }
                let _ = reply.send(Ok(theirs));
                continue;
            }
        };
        pending.extend_from_slice(&buf[..n]);
        loop {
            let (frame, used) = match Frame::decode(&pending) {
                Ok(Some(f)) => f,
                Ok(None) => break,
                Err(e) => {
                    return tracing::warn!(
                        "the guest sent a bad frame on its network port ({e:?}): it loses its network"
                    )
                }
            };
            pending.drain(..used);
            if !on_frame(frame, &mut conns, &policy, &to_guest).await {
                return tracing::warn!("the guest broke the network port's protocol: it loses its network");
            }
        }
    }
}

/// One frame from the guest; false when the guest broke the protocol.
async fn on_frame(
    frame: Frame,
    conns: &mut HashMap<u32, Conn>,
    policy: &SharedPolicy,
    to_guest: &mpsc::Sender<Frame>,
) -> bool {
    match frame.kind {
        // Only the host asks for connections into the guest.
        Kind::Connect => return false,
        // The guest's own connections are numbered below the host's.
        Kind::Open if frame.conn & HOST_CONN != 0 => return false,
        Kind::Open => {
            let guest_count = conns.keys().filter(|id| **id & HOST_CONN == 0).count();
            if guest_count >= MAX_CONNS {
                let _ = to_guest
                    .send(Frame {
                        conn: frame.conn,
                        kind: Kind::Close,
                        payload: Vec::new(),
                    })
                    .await;
            } else {
                conns.insert(frame.conn, Conn::Head(Vec::new()));
            }
        }
        Kind::Close => {
            conns.remove(&frame.conn);
        }
        Kind::Data => match conns.get_mut(&frame.conn) {
            Some(Conn::Relay(up, _)) => {
                let gone = up.to_up.send(frame.payload).await.is_err();
                if gone {
                    conns.remove(&frame.conn);
                }
            }
            Some(Conn::Head(head)) => {
                head.extend_from_slice(&frame.payload);
                let current = || policy.lock().unwrap_or_else(|e| e.into_inner()).clone();
                let opened = match parse_head(head) {
                    Head::Partial => return true,
                    Head::Refused { line, reason } => {
                        answer(to_guest, frame.conn, 400, &reason).await;
                        current().report(Attempt::new(format!("{line:?}"), Verdict::Refused { reason }));
                        None
                    }
                    Head::Proxy(request) => open(frame.conn, request, head, &current(), to_guest.clone()).await,
                };
                match opened {
                    Some((up, destination)) => {
                        conns.insert(frame.conn, Conn::Relay(up, destination));
                    }
                    None => {
                        conns.remove(&frame.conn);
                    }
                }
            }
            None => {}
        },
    }
    true
}

/// Cuts every relayed connection of the guest's that `policy` would not open (and tells the
/// guest it is closed), after the VM's policy changed.
async fn cut_what_is_no_longer_allowed(
    conns: &mut HashMap<u32, Conn>,
    policy: &Policy,
    to_guest: &mpsc::Sender<Frame>,
) {
    let cut: Vec<u32> = conns
        .iter()
        .filter_map(|(id, conn)| match conn {
            Conn::Relay(relayed, destination) if !destination.allowed_by(policy) => {
                relayed.cut();
                Some(*id)
            }
            _ => None,
        })
        .collect();
    for id in cut {
        conns.remove(&id);
        let close = Frame {
            conn: id,
            kind: Kind::Close,
            payload: Vec::new(),
        };
        if to_guest.send(close).await.is_err() {
            return;
        }
        tracing::info!(target: "farm::net", "connection {id} cut: the VM's new policy does not allow it");
    }
}

/// The task that writes every frame for the guest, in the order sent on the channel it returns.
/// Each connection it closes is told on `closed`: the guest answers a close of the host's
/// with nothing, so the port forgets the connection then (or its count would only grow).
fn spawn_writer(
    mut write: tokio::net::unix::OwnedWriteHalf,
    closed: mpsc::UnboundedSender<u32>,
    traffic: Arc<Traffic>,
) -> mpsc::Sender<Frame> {
    let (to_guest, mut outgoing) = mpsc::channel::<Frame>(256);
    tokio::spawn(async move {
        while let Some(frame) = outgoing.recv().await {
            let bytes = frame.encode();
            if write.write_all(&bytes).await.is_err() {
                return;
            }
            traffic
                .to_guest
                .fetch_add(bytes.len() as u64, std::sync::atomic::Ordering::Relaxed);
            if frame.kind == Kind::Close {
                let _ = closed.send(frame.conn);
            }
        }
    });
    to_guest
}

/// Header lines a request head may have at most (a proxy client sends a handful).
const MAX_HEADERS: usize = 128;

/// What a connection's request head says so far.
#[derive(Debug, PartialEq, Eq)]
enum Head {
    /// The head has not ended yet.
    Partial,
    /// Not a proxy request, malformed, or too long: answered 400.
    Refused { line: String, reason: String },
    /// A proxy request, to be checked against the allowlist.
    Proxy(ProxyRequest),
}

/// Where a proxy request goes and what is sent there first.
#[derive(Debug, PartialEq, Eq)]
struct ProxyRequest {
    host: String,
    port: u16,
    /// `CONNECT`: answered `200` and then relayed as bytes.
    tunnel: bool,
    /// For a tunnel, the bytes after the head; for a plain request, the head with its request
    /// line in origin form (`GET /path HTTP/1.1`) and the bytes after it.
    first: Vec<u8>,
}

/// Reads the request head at the front of `buf` (`httparse`): `CONNECT host:port`, or any
/// method with an absolute `http://` URL. A head must end within [`MAX_HEAD`] bytes.
fn parse_head(buf: &[u8]) -> Head {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut request = httparse::Request::new(&mut headers);
    let refused = |reason: String| Head::Refused {
        line: request_line(buf),
        reason,
    };
    let head_len = match request.parse(buf) {
        Ok(httparse::Status::Complete(n)) if n <= MAX_HEAD => n,
        Ok(httparse::Status::Partial) if buf.len() <= MAX_HEAD => return Head::Partial,
        Ok(_) => return refused(format!("the proxy request head is too long (at most {MAX_HEAD} bytes)")),
        Err(e) => return refused(format!("not a proxy request: malformed request head ({e})")),
    };
    let (method, uri, version) = (
        request.method.unwrap_or(""),
        request.path.unwrap_or(""),
        request.version.unwrap_or(1),
    );
    let not_proxy = || refused("not a proxy request: use CONNECT host:port or an absolute http:// URL".into());
    if method == "CONNECT" {
        let Some((host, port)) = authority(uri, None) else {
            return not_proxy();
        };
        return Head::Proxy(ProxyRequest {
            host,
            port,
            tunnel: true,
            first: buf[head_len..].to_vec(),
        });
    }
    let Some(rest) = uri.strip_prefix("http://") else {
        return not_proxy();
    };
    let (authority_text, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let Some((host, port)) = authority(authority_text, Some(80)) else {
        return not_proxy();
    };
    let mut first = format!("{method} {path} HTTP/1.{version}\r\n").into_bytes();
    first.extend_from_slice(&buf[request_line_end(buf) + 1..]);
    Head::Proxy(ProxyRequest {
        host,
        port,
        tunnel: false,
        first,
    })
}

/// `host:port`, or `host` with `default_port`; an IPv6 host is in brackets.
fn authority(text: &str, default_port: Option<u16>) -> Option<(String, u16)> {
    let (host, port) = match text.strip_prefix('[') {
        Some(bracketed) => {
            let (host, after) = bracketed.split_once(']')?;
            match after {
                "" => (host, None),
                _ => (host, Some(after.strip_prefix(':')?)),
            }
        }
        None => match text.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (text, None),
        },
    };
    let port = match port {
        Some(p) => p.parse().ok()?,
        None => default_port?,
    };
    (!host.is_empty()).then(|| (host.to_string(), port))
}

/// Where the request line ends (its `\n`), past any empty lines before it.
fn request_line_end(buf: &[u8]) -> usize {
    let start = buf
        .iter()
        .position(|b| !matches!(b, b'\r' | b'\n'))
        .unwrap_or(buf.len());
    buf[start..]
        .iter()
        .position(|&b| b == b'\n')
        .map_or(buf.len(), |i| start + i)
}

/// The request line as text, for the log (at most 200 characters).
fn request_line(buf: &[u8]) -> String {
    let line = String::from_utf8_lossy(&buf[..request_line_end(buf).min(buf.len())]);
    line.trim().chars().take(200).collect()
}

/// Checks a connection's request and connects it upstream; None when it was answered.
async fn open(
    conn: u32,
    request: ProxyRequest,
    head: &[u8],
    policy: &Policy,
    to_guest: mpsc::Sender<Frame>,
) -> Option<(Relayed, Destination)> {
    let ProxyRequest {
        host,
        port,
        tunnel,
        first,
    } = request;
    let target = format!("{host}:{port}");
    if policy.rules.inspects(&host, port) {
        let inspected = Destination::Inspected(policy.rules.clone());
        if tunnel {
            let refused = to_guest.clone();
            let opened = crate::inspect::inspect_tls(conn, first, policy.clone(), to_guest, host.clone(), port);
            if opened.is_none() {
                let reason = format!("{target} could not be intercepted (see the log)");
                answer(&refused, conn, 403, &reason).await;
            }
            return opened.map(|relayed| (relayed, inspected));
        }
        return Some((
            crate::inspect::inspect(conn, head.to_vec(), policy.clone(), to_guest),
            inspected,
        ));
    }
    let reply = Reply {
        to_guest: &to_guest,
        conn,
        policy,
        target: &target,
    };
    if !policy.allows(&host, port) {
        let allowed = if policy.allow.is_empty() {
            "none".to_string()
        } else {
            policy.allow.join(", ")
        };
        reply
            .deny(format!("egress to {target} is not allowed (allowlist: {allowed})"))
            .await;
        return None;
    }
    let upstream = connect_checked(&host, port, &reply).await?;
    policy.report(Attempt::new(&target, Verdict::Allowed { detail: None }));
    if tunnel {
        let established = Frame {
            conn,
            kind: Kind::Data,
            payload: b"HTTP/1.1 200 Connection established\r\n\r\n".to_vec(),
        };
        let _ = to_guest.send(established).await;
    }
    Some((
        relay(conn, first, upstream, to_guest),
        Destination::Passed { host, port },
    ))
}

/// Resolves an allowed host and connects to it, refusing an address of an inspected host;
/// None when the connection was answered.
async fn connect_checked(host: &str, port: u16, reply: &Reply<'_>) -> Option<tokio::net::TcpStream> {
    // The addresses checked are the ones connected to: a name cannot resolve once for the
    // check and again, elsewhere, for the connection.
    let addresses = match tokio::time::timeout(UPSTREAM_TIMEOUT, resolve(host, port)).await {
        Ok(Ok(addresses)) => addresses,
        Ok(Err(e)) => {
            reply
                .failed(UpstreamFailure::Dns, format!("resolving {host} failed: {e}"))
                .await;
            return None;
        }
        Err(_) => {
            let detail = format!("resolving {host} took over {} s", UPSTREAM_TIMEOUT.as_secs());
            reply.failed(UpstreamFailure::Timeout, detail).await;
            return None;
        }
    };
    if let Some(inspected) = reply.policy.rules.inspected_at(&addresses).await {
        reply
            .deny(format!(
                "{} is an address of {inspected}, which request rules inspect: reach it by that name",
                reply.target
            ))
            .await;
        return None;
    }
    if let Some(reason) = reply.policy.refuses_destination(&addresses) {
        reply.deny(reason).await;
        return None;
    }
    match tokio::time::timeout(UPSTREAM_TIMEOUT, tokio::net::TcpStream::connect(&addresses[..])).await {
        Ok(Ok(s)) => Some(s),
        Ok(Err(e)) => {
            reply
                .failed(UpstreamFailure::Connect, format!("connecting failed: {e}"))
                .await;
            None
        }
        Err(_) => {
            let detail = format!("connecting took over {} s", UPSTREAM_TIMEOUT.as_secs());
            reply.failed(UpstreamFailure::Timeout, detail).await;
            None
        }
    }
}

/// How a connection that goes no further is answered and reported.
struct Reply<'a> {
    to_guest: &'a mpsc::Sender<Frame>,
    conn: u32,
    policy: &'a Policy,
    target: &'a str,
}

impl Reply<'_> {
    async fn deny(&self, reason: String) {
        answer(self.to_guest, self.conn, 403, &reason).await;
        self.policy
            .report(Attempt::new(self.target, Verdict::Denied { reason }));
    }

    async fn failed(&self, failure: UpstreamFailure, detail: String) {
        let text = format!("{}: {detail}", self.target);
        answer(self.to_guest, self.conn, failure.status(), &text).await;
        self.policy
            .report(Attempt::new(self.target, Verdict::UpstreamFailed { failure, detail }));
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    fn proxy(head: &[u8]) -> ProxyRequest {
        match parse_head(head) {
            Head::Proxy(request) => request,
            other => panic!("{:?}: {other:?}", String::from_utf8_lossy(head)),
        }
    }

    fn refused(head: &[u8]) -> String {
        match parse_head(head) {
            Head::Refused { reason, .. } => reason,
            other => panic!("{:?} was not refused: {other:?}", String::from_utf8_lossy(head)),
        }
    }

    #[test]
    fn proxy_requests_name_their_target() {
        let tunnel = proxy(b"CONNECT pypi.org:443 HTTP/1.1\r\nHost: pypi.org:443\r\n\r\nTLS");
        assert_eq!(
            tunnel,
            ProxyRequest {
                host: "pypi.org".into(),
                port: 443,
                tunnel: true,
                first: b"TLS".to_vec()
            }
        );
        assert_eq!(proxy(b"CONNECT [::1]:8443 HTTP/1.1\r\n\r\n").host, "::1");
        let plain = proxy(b"GET http://127.0.0.1:8080/simple/x/ HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
        assert_eq!(
            (plain.host.as_str(), plain.port, plain.tunnel),
            ("127.0.0.1", 8080, false)
        );
        assert_eq!(plain.first, b"GET /simple/x/ HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
        let bare = proxy(b"POST http://example.org HTTP/1.0\r\n\r\nbody");
        assert_eq!((bare.port, bare.first), (80, b"POST / HTTP/1.0\r\n\r\nbody".to_vec()));
        let policy = Policy {
            allow: vec!["PyPI.org:443".into()],
            ..Default::default()
        };
        assert!(policy.allows("pypi.org", 443));
        assert!(!policy.allows("pypi.org", 80));
        assert!(!policy.allows("evil.org", 443));
        let any = Policy {
            allow: vec!["*".into()],
            ..Default::default()
        };
        assert!(any.allows("evil.org", 443) && any.allows("host.farm.internal", 8080));
    }

    #[test]
    fn malformed_and_non_proxy_heads_are_refused() {
        for head in [
            &b"GET /relative HTTP/1.1\r\n\r\n"[..],
            b"CONNECT pypi.org HTTP/1.1\r\n\r\n",
            b"CONNECT :443 HTTP/1.1\r\n\r\n",
            b"CONNECT pypi.org:https HTTP/1.1\r\n\r\n",
            b"GET https://pypi.org/ HTTP/1.1\r\n\r\n",
            b"GET http://:80/ HTTP/1.1\r\n\r\n",
            b"GET http://x:99999/ HTTP/1.1\r\n\r\n",
        ] {
            assert!(
                refused(head).contains("use CONNECT host:port or an absolute http:// URL"),
                "{:?}",
                String::from_utf8_lossy(head)
            );
        }
        for head in [
            &b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"[..],
            b"GET http://x/ HTTP/2.0\r\n\r\n",
            b"GET http://x/ HTTP/1.1\r\nBad Header\r\n\r\n",
            b"GET  HTTP/1.1\r\n\r\n",
        ] {
            assert!(
                refused(head).contains("malformed request head"),
                "{:?}",
                String::from_utf8_lossy(head)
            );
        }
        let many: String = (0..MAX_HEADERS + 1).map(|i| format!("X-{i}: y\r\n")).collect();
        assert!(refused(format!("GET http://x/ HTTP/1.1\r\n{many}\r\n").as_bytes()).contains("malformed"));
    }

    #[test]
    fn heads_may_arrive_in_pieces_but_not_past_the_limit() {
        let head = b"GET http://example.org:8080/a HTTP/1.1\r\nHost: example.org\r\n\r\n";
        for cut in 1..head.len() {
            assert_eq!(parse_head(&head[..cut]), Head::Partial, "cut at {cut}");
        }
        assert_eq!(proxy(head).port, 8080);
        let mut long = b"GET http://example.org/ HTTP/1.1\r\n".to_vec();
        while long.len() <= MAX_HEAD {
            long.extend_from_slice(format!("X-Padding: {}\r\n", "a".repeat(1000)).as_bytes());
        }
        assert_eq!(parse_head(&long[..MAX_HEAD]), Head::Partial);
        assert!(refused(&long).contains("too long"));
        long.extend_from_slice(b"\r\n");
        assert!(
            refused(&long).contains("too long"),
            "a complete head past the limit is refused too"
        );
    }

    /// Frames from a fake guest through the served port: a head split across frames reaches
    /// an allowed upstream with its request line in origin form; a malformed head gets 400,
    /// an unlisted host 403.
    #[tokio::test]
    async fn the_port_relays_allowed_requests_and_answers_the_rest() {
        let upstream = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = upstream.local_addr().unwrap().port();
        let policy: SharedPolicy = Arc::new(Mutex::new(Policy {
            allow: vec![format!("127.0.0.1:{port}")],
            ..Default::default()
        }));
        let (guest, host) = tokio::net::UnixStream::pair().unwrap();
        tokio::spawn(serve(
            host,
            policy,
            mpsc::channel(1).1,
            tokio::sync::watch::channel(0).1,
        ));
        let (mut from_host, mut to_host) = guest.into_split();
        let send = |conn: u32, kind: Kind, payload: &[u8]| {
            Frame {
                conn,
                kind,
                payload: payload.to_vec(),
            }
            .encode()
        };
        let head = format!("GET http://127.0.0.1:{port}/pkg HTTP/1.1\r\nHost: x\r\n\r\n");
        let (first, second) = head.as_bytes().split_at(20);
        for frame in [
            send(1, Kind::Open, b""),
            send(1, Kind::Data, first),
            send(1, Kind::Data, second),
        ] {
            to_host.write_all(&frame).await.unwrap();
        }
        let (mut served, _) = upstream.accept().await.unwrap();
        let mut got = vec![0u8; head.len()];
        let expected = b"GET /pkg HTTP/1.1\r\nHost: x\r\n\r\n";
        served.read_exact(&mut got[..expected.len()]).await.unwrap();
        assert_eq!(&got[..expected.len()], expected);

        for (conn, head) in [
            (2, "NOT A REQUEST\r\n\r\n".to_string()),
            (3, "CONNECT evil.org:443 HTTP/1.1\r\n\r\n".to_string()),
        ] {
            to_host.write_all(&send(conn, Kind::Open, b"")).await.unwrap();
            to_host
                .write_all(&send(conn, Kind::Data, head.as_bytes()))
                .await
                .unwrap();
        }
        let mut replies: HashMap<u32, String> = HashMap::new();
        let mut pending = Vec::new();
        let mut buf = vec![0u8; 4096];
        while replies.values().filter(|r| r.contains("\r\n\r\nfarm:")).count() < 2 {
            let n = from_host.read(&mut buf).await.unwrap();
            assert!(n > 0, "the port closed early: {replies:?}");
            pending.extend_from_slice(&buf[..n]);
            while let Some((frame, used)) = Frame::decode(&pending).unwrap() {
                pending.drain(..used);
                replies
                    .entry(frame.conn)
                    .or_default()
                    .push_str(&String::from_utf8_lossy(&frame.payload));
            }
        }
        assert!(replies[&2].starts_with("HTTP/1.1 400 Bad Request"), "{}", replies[&2]);
        assert!(
            replies[&3].starts_with("HTTP/1.1 403 Forbidden") && replies[&3].contains("evil.org:443"),
            "{}",
            replies[&3]
        );
    }

    /// A tunnel to an allowed upstream carries bytes; then the policy is tightened (the
    /// upstream is no longer on the allowlist): the tunnel is cut at once, both ways, and the
    /// guest is told its connection closed, while a connection the new policy still allows
    /// goes on.
    #[tokio::test]
    async fn a_tighter_policy_cuts_the_connections_it_would_not_open() {
        let upstream = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let kept = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (port, kept_port) = (upstream.local_addr().unwrap().port(), kept.local_addr().unwrap().port());
        let policy: SharedPolicy = Arc::new(Mutex::new(Policy {
            allow: vec![format!("127.0.0.1:{port}"), format!("127.0.0.1:{kept_port}")],
            ..Default::default()
        }));
        let (guest, host) = tokio::net::UnixStream::pair().unwrap();
        let (changed, changes) = tokio::sync::watch::channel(0);
        tokio::spawn(serve(host, policy.clone(), mpsc::channel(1).1, changes));
        let (mut from_host, mut to_host) = guest.into_split();
        let send = |conn: u32, kind: Kind, payload: &[u8]| {
            Frame {
                conn,
                kind,
                payload: payload.to_vec(),
            }
            .encode()
        };
        for (conn, port) in [(1, port), (2, kept_port)] {
            let head = format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n");
            to_host.write_all(&send(conn, Kind::Open, b"")).await.unwrap();
            to_host
                .write_all(&send(conn, Kind::Data, head.as_bytes()))
                .await
                .unwrap();
        }
        let (mut served, _) = upstream.accept().await.unwrap();
        let (mut served_kept, _) = kept.accept().await.unwrap();
        to_host.write_all(&send(1, Kind::Data, b"before")).await.unwrap();
        let mut got = [0u8; 6];
        served.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"before");

        policy.lock().unwrap().allow = vec![format!("127.0.0.1:{kept_port}")];
        changed.send_modify(|n| *n += 1);
        // The guest hears that connection 1 closed (after its two tunnels' `200`s).
        let mut pending = Vec::new();
        let mut buf = vec![0u8; 4096];
        let closed = loop {
            let read = tokio::time::timeout(std::time::Duration::from_secs(10), from_host.read(&mut buf)).await;
            let n = read.expect("the guest was never told of a cut").unwrap();
            assert!(n > 0, "the port closed early");
            pending.extend_from_slice(&buf[..n]);
            let mut closed = None;
            while let Some((frame, used)) = Frame::decode(&pending).unwrap() {
                pending.drain(..used);
                if frame.kind == Kind::Close {
                    closed = Some(frame.conn);
                }
            }
            if let Some(conn) = closed {
                break conn;
            }
        };
        assert_eq!(closed, 1, "the connection the new policy does not allow");
        // Nothing more of the guest's reaches the cut upstream; the kept one still carries.
        to_host.write_all(&send(1, Kind::Data, b"after")).await.unwrap();
        to_host.write_all(&send(2, Kind::Data, b"still")).await.unwrap();
        let mut kept_got = [0u8; 5];
        served_kept.read_exact(&mut kept_got).await.unwrap();
        assert_eq!(&kept_got, b"still");
        let mut rest = Vec::new();
        let read = tokio::time::timeout(std::time::Duration::from_secs(5), served.read_to_end(&mut rest)).await;
        assert_eq!(read.expect("the cut upstream sees its end").unwrap(), 0, "{rest:?}");
    }
}
