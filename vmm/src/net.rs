//! The host side of a VM's network port ([`farm_protocol::net`]): each connection the guest's
//! proxy listener accepted is read up to its HTTP proxy request (`CONNECT host:port` or an
//! absolute `http://` URL), checked against the VM's allowlist, and then relayed to that host
//! or answered `403` and closed. Every attempt is logged with its verdict. With no allowlist
//! (the default, and always for scoring VMs) every attempt is refused at once: a guest never
//! hangs waiting for a network it does not have.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use farm_protocol::net::{Frame, Kind, MAX_PAYLOAD};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

/// Where connection attempts are reported, besides `tracing`.
pub type AttemptLog = Arc<dyn Fn(&str) + Send + Sync>;

/// What a VM may reach, and where its attempts are reported.
#[derive(Clone, Default)]
pub struct Policy {
    /// `host:port` entries (hosts compared without case).
    pub allow: Vec<String>,
    /// Called with one line per connection attempt and its verdict.
    pub log: Option<AttemptLog>,
}

impl Policy {
    pub fn allows(&self, host: &str, port: u16) -> bool {
        let wanted = format!("{}:{port}", host.to_ascii_lowercase());
        self.allow.iter().any(|a| a.to_ascii_lowercase() == wanted)
    }

    fn report(&self, line: &str) {
        tracing::info!(target: "farm::net", "{line}");
        if let Some(log) = &self.log {
            log(line);
        }
    }
}

/// A VM's current policy (changed between template setup and snapshot, or per fork).
pub type SharedPolicy = Arc<Mutex<Policy>>;

/// Bytes of a request head the proxy reads at most before it must see the end of it.
const MAX_HEAD: usize = 16 << 10;

/// Serves the port until the VM goes.
pub fn spawn(stream: std::os::unix::net::UnixStream, policy: SharedPolicy) -> std::io::Result<tokio::task::JoinHandle<()>> {
    stream.set_nonblocking(true)?;
    let stream = tokio::net::UnixStream::from_std(stream)?;
    Ok(tokio::spawn(serve(stream, policy)))
}

async fn serve(stream: tokio::net::UnixStream, policy: SharedPolicy) {
    let (mut read, mut write) = stream.into_split();
    let (to_guest, mut outgoing) = mpsc::channel::<Frame>(256);
    tokio::spawn(async move {
        while let Some(frame) = outgoing.recv().await {
            if write.write_all(&frame.encode()).await.is_err() {
                return;
            }
        }
    });
    // Per connection: the request head still being read, or the channel to its upstream.
    enum Conn {
        Head(Vec<u8>),
        Relay(mpsc::Sender<Vec<u8>>),
    }
    let mut conns: HashMap<u32, Conn> = HashMap::new();
    let mut pending = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = match read.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        pending.extend_from_slice(&buf[..n]);
        loop {
            let (frame, used) = match Frame::decode(&pending) {
                Ok(Some(f)) => f,
                Ok(None) => break,
                Err(_) => return, // a guest that speaks nonsense loses its network
            };
            pending.drain(..used);
            match frame.kind {
                Kind::Open => {
                    if conns.len() >= 256 {
                        let _ = to_guest.send(Frame { conn: frame.conn, kind: Kind::Close, payload: Vec::new() }).await;
                    } else {
                        conns.insert(frame.conn, Conn::Head(Vec::new()));
                    }
                }
                Kind::Close => {
                    conns.remove(&frame.conn);
                }
                Kind::Data => match conns.get_mut(&frame.conn) {
                    Some(Conn::Relay(up)) => {
                        let gone = up.send(frame.payload).await.is_err();
                        if gone {
                            conns.remove(&frame.conn);
                        }
                    }
                    Some(Conn::Head(head)) => {
                        head.extend_from_slice(&frame.payload);
                        let Some(end) = head.windows(4).position(|w| w == b"\r\n\r\n") else {
                            if head.len() > MAX_HEAD {
                                refuse(&to_guest, frame.conn, 400, "the proxy request head is too long").await;
                                conns.remove(&frame.conn);
                            }
                            continue;
                        };
                        let head = std::mem::take(head);
                        let current = policy.lock().unwrap_or_else(|e| e.into_inner()).clone();
                        match open(frame.conn, head, end + 4, &current, to_guest.clone()).await {
                            Some(up) => {
                                conns.insert(frame.conn, Conn::Relay(up));
                            }
                            None => {
                                conns.remove(&frame.conn);
                            }
                        }
                    }
                    None => {}
                },
            }
        }
    }
}

async fn refuse(to_guest: &mpsc::Sender<Frame>, conn: u32, status: u16, reason: &str) {
    let body = format!("farm: {reason}\n");
    let text = if status == 403 { "Forbidden" } else { "Bad Request" };
    let reply = format!("HTTP/1.1 {status} {text}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len());
    let _ = to_guest.send(Frame { conn, kind: Kind::Data, payload: reply.into_bytes() }).await;
    let _ = to_guest.send(Frame { conn, kind: Kind::Close, payload: Vec::new() }).await;
}

/// The target of a proxy request: (host, port, whether it is CONNECT, the request line in
/// origin form for a plain request).
fn target(request_line: &str) -> Option<(String, u16, bool, String)> {
    let mut parts = request_line.split_whitespace();
    let (method, uri, version) = (parts.next()?, parts.next()?, parts.next()?);
    if method == "CONNECT" {
        let (host, port) = uri.rsplit_once(':')?;
        return Some((host.trim_matches(['[', ']']).to_string(), port.parse().ok()?, true, String::new()));
    }
    let rest = uri.strip_prefix("http://")?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) => (h, p.parse().ok()?),
        None => (authority, 80),
    };
    Some((host.to_string(), port, false, format!("{method} {path} {version}")))
}

/// Checks a connection's request and connects it upstream; None when refused.
async fn open(conn: u32, head: Vec<u8>, head_len: usize, policy: &Policy, to_guest: mpsc::Sender<Frame>) -> Option<mpsc::Sender<Vec<u8>>> {
    let text = String::from_utf8_lossy(&head[..head_len]).into_owned();
    let line = text.lines().next().unwrap_or("").to_string();
    let Some((host, port, connect, origin_line)) = target(&line) else {
        policy.report(&format!("network: refused {line:?}: not a proxy request (CONNECT host:port, or an absolute http:// URL)"));
        refuse(&to_guest, conn, 400, "not a proxy request: use CONNECT host:port or an absolute http:// URL").await;
        return None;
    };
    if !policy.allows(&host, port) {
        let allowed = if policy.allow.is_empty() { "none".to_string() } else { policy.allow.join(", ") };
        policy.report(&format!("network: denied {host}:{port} (allowed: {allowed})"));
        refuse(&to_guest, conn, 403, &format!("egress to {host}:{port} is not allowed (allowlist: {allowed})")).await;
        return None;
    }
    let upstream = match tokio::time::timeout(Duration::from_secs(15), tokio::net::TcpStream::connect((host.as_str(), port))).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            policy.report(&format!("network: allowed {host}:{port}, but connecting failed: {e}"));
            refuse(&to_guest, conn, 403, &format!("connecting to {host}:{port} failed: {e}")).await;
            return None;
        }
        Err(_) => {
            policy.report(&format!("network: allowed {host}:{port}, but it did not answer within 15 s"));
            refuse(&to_guest, conn, 403, &format!("{host}:{port} did not answer within 15 s")).await;
            return None;
        }
    };
    policy.report(&format!("network: allowed {host}:{port}"));
    let (mut up_read, mut up_write) = upstream.into_split();
    let first: Vec<u8> = if connect {
        let _ = to_guest.send(Frame { conn, kind: Kind::Data, payload: b"HTTP/1.1 200 Connection established\r\n\r\n".to_vec() }).await;
        head[head_len..].to_vec()
    } else {
        let mut rewritten = origin_line.into_bytes();
        let after_line = text.find("\r\n").unwrap_or(0);
        rewritten.extend_from_slice(&head[after_line..]);
        rewritten
    };
    let (to_up, mut from_guest) = mpsc::channel::<Vec<u8>>(64);
    tokio::spawn(async move {
        if !first.is_empty() && up_write.write_all(&first).await.is_err() {
            return;
        }
        while let Some(bytes) = from_guest.recv().await {
            if up_write.write_all(&bytes).await.is_err() {
                return;
            }
        }
        let _ = up_write.shutdown().await;
    });
    tokio::spawn(async move {
        let mut buf = vec![0u8; MAX_PAYLOAD];
        loop {
            match up_read.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if to_guest.send(Frame { conn, kind: Kind::Data, payload: buf[..n].to_vec() }).await.is_err() {
                        return;
                    }
                }
            }
        }
        let _ = to_guest.send(Frame { conn, kind: Kind::Close, payload: Vec::new() }).await;
    });
    Some(to_up)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proxy_requests_name_their_target() {
        assert_eq!(target("CONNECT pypi.org:443 HTTP/1.1"), Some(("pypi.org".into(), 443, true, String::new())));
        assert_eq!(target("GET http://127.0.0.1:8080/simple/x/ HTTP/1.1"), Some(("127.0.0.1".into(), 8080, false, "GET /simple/x/ HTTP/1.1".into())));
        assert_eq!(target("GET http://example.org HTTP/1.0").map(|t| (t.1, t.3)), Some((80, "GET / HTTP/1.0".into())));
        assert_eq!(target("GET /relative HTTP/1.1"), None);
        let policy = Policy { allow: vec!["PyPI.org:443".into()], log: None };
        assert!(policy.allows("pypi.org", 443));
        assert!(!policy.allows("pypi.org", 80));
        assert!(!policy.allows("evil.org", 443));
    }
}
