//! The port listener (`serve.sandboxes.ports_listen`): a sandbox's service on its own
//! `127.0.0.1:PORT`, reached by clients with no network device in the guest, each connection
//! carried over the VM's network port ([`engine::guest::Guest::connect`]).
//!
//! A request names a port's token in its host (`http://TOKEN.localhost:PORT/`, so a browser
//! keeps it for every page and asset, and its cookies stay apart from every other port's), in
//! a `Farm-Port-Token` header, or in a `farm_token` query parameter. The listener reads the
//! first request head of a connection (at most [`MAX_HEAD`] bytes, within [`HEAD_TIMEOUT`]),
//! and a connection without a token of an open port is answered there and closed, without
//! touching any guest. Otherwise it is joined to the guest's port, both ways, as bytes (HTTP
//! keep-alive and WebSockets included): it can only ever reach that one guest service.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::sandboxes::Sandboxes;
use crate::error::ApiResult;

/// The most bytes of a connection's first request head read before it must end.
const MAX_HEAD: usize = 64 << 10;
/// How long a client has to send its first request head.
const HEAD_TIMEOUT: Duration = Duration::from_secs(30);

/// Counts a connection through a port of the sandbox named against its owner's bound
/// (`serve.max_connections_per_tenant`): a guard released when dropped, or why not.
pub type Hold = Arc<dyn Fn(&str) -> ApiResult<Box<dyn Send>> + Send + Sync>;

/// What counts a connection through a sandbox's port against its owner's bound.
pub fn held_by_owner(tenancy: &Arc<crate::tenancy::Tenancy>) -> Hold {
    let owners = tenancy.clone();
    Arc::new(move |id: &str| owners.hold_for_sandbox(id).map(|held| Box::new(held) as Box<dyn Send>))
}

/// What a request head names to open.
#[derive(Debug, PartialEq)]
enum Named {
    /// A port's token: the first label of its host, its `Farm-Port-Token` header, or its
    /// `farm_token` query parameter (the first one present).
    Token(String),
    /// E2B's host name of a sandbox's port, `{port}-{sandbox}.{key}.DOMAIN` (the SDK's
    /// `get_host`): any port of that sandbox, with its host key.
    E2bHost { port: u16, sandbox: String, key: String },
}

/// What the request head names, if anything.
fn named(head: &httparse::Request<'_, '_>) -> Option<Named> {
    let header = |name: &str| {
        head.headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case(name))
            .and_then(|h| std::str::from_utf8(h.value).ok())
    };
    let host = header("host").map(|h| h.to_ascii_lowercase());
    let labels: Vec<&str> = host.as_deref().map(|h| h.split('.').collect()).unwrap_or_default();
    let hex32 = |label: &str| label.len() == 32 && label.bytes().all(|b| b.is_ascii_hexdigit());
    if let Some(first) = labels.first().filter(|l| hex32(l)) {
        return Some(Named::Token(first.to_string()));
    }
    if let (Some(first), Some(key)) = (labels.first(), labels.get(1).filter(|l| hex32(l))) {
        if let Some((port, sandbox)) = first.split_once('-') {
            if let Ok(port @ 1..) = port.parse::<u16>() {
                return Some(Named::E2bHost {
                    port,
                    sandbox: sandbox.to_string(),
                    key: key.to_string(),
                });
            }
        }
    }
    let from_query = head.path.and_then(|path| {
        let query = path.split_once('?')?.1;
        query
            .split('&')
            .find_map(|pair| pair.strip_prefix("farm_token=").map(str::to_string))
    });
    header("farm-port-token")
        .map(str::to_string)
        .or(from_query)
        .map(Named::Token)
}

/// What the listener tells a client it refuses, and then closes.
async fn refuse(stream: &mut tokio::net::TcpStream, status: u16, reason: &str) {
    let text = match status {
        400 => "Bad Request",
        401 => "Unauthorized",
        409 => "Conflict",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        _ => "Not Found",
    };
    let retry = if status == 503 { "Retry-After: 5\r\n" } else { "" };
    let body = format!("farm: {reason}\n");
    let answer = format!(
        "HTTP/1.1 {status} {text}\r\nContent-Type: text/plain\r\n{retry}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.write_all(answer.as_bytes()).await;
    let _ = stream.shutdown().await;
}

/// Serves the port listener until the process ends: each connection in a task of its own.
pub async fn serve(listener: tokio::net::TcpListener, sandboxes: Arc<Sandboxes>, hold: Hold) {
    while let Ok((stream, _)) = listener.accept().await {
        let (sandboxes, hold) = (sandboxes.clone(), hold.clone());
        tokio::spawn(async move { connection(stream, &sandboxes, &hold).await });
    }
}

/// One client connection: its first head is checked, then it is joined to the guest.
async fn connection(mut stream: tokio::net::TcpStream, sandboxes: &Sandboxes, hold: &Hold) {
    let mut head = Vec::new();
    let read = tokio::time::timeout(HEAD_TIMEOUT, read_head(&mut stream, &mut head)).await;
    let Ok(Ok(())) = read else {
        return refuse(&mut stream, 400, "no request head in time (or one past 64 KiB)").await;
    };
    let mut headers = [httparse::EMPTY_HEADER; 128];
    let mut request = httparse::Request::new(&mut headers);
    if request.parse(&head).is_err() {
        return refuse(&mut stream, 400, "not an HTTP request").await;
    }
    let found = match named(&request) {
        None => {
            return refuse(
                &mut stream,
                401,
                "a port token is required (TOKEN.host, Farm-Port-Token, or ?farm_token=)",
            )
            .await
        }
        Some(Named::Token(token)) => sandboxes.port_of_token(&token),
        Some(Named::E2bHost { port, sandbox, key }) => sandboxes.is_host_key(&sandbox, &key).then_some((sandbox, port)),
    };
    let Some((sandbox, port)) = found else {
        return refuse(&mut stream, 404, "no open port has that token").await;
    };
    // One of its owner's connections while it lasts.
    let _held = match hold(&sandbox) {
        Ok(held) => held,
        Err(e) => return refuse(&mut stream, e.kind.http_status(), &e.message).await,
    };
    // In use while the connection lasts: a page open in a browser keeps its sandbox.
    let (guest, _in_use) = match sandboxes.port_guest(&sandbox).await {
        Ok(found) => found,
        // The host's memory figures are not for whoever holds a port's link.
        Err(e) if e.kind == crate::error::ErrorKind::Unavailable => {
            let why = "the host is short of memory; new connections wait until it comes back";
            return refuse(&mut stream, 503, why).await;
        }
        Err(e) => return refuse(&mut stream, e.kind.http_status(), &e.message).await,
    };
    let upstream = match guest.connect(port).await {
        Ok(upstream) => upstream,
        Err(e) => {
            tracing::warn!(sandbox = %sandbox, port = port, "a port connection failed: {e}");
            return refuse(&mut stream, 502, &format!("cannot reach the sandbox's port: {e}")).await;
        }
    };
    join(stream, upstream, head, port).await;
}

/// Joins the client to the guest's port, both ways, the head first. A guest port where
/// nothing listens closes without a byte: the client is told so (502).
async fn join(stream: tokio::net::TcpStream, upstream: tokio::io::DuplexStream, head: Vec<u8>, port: u16) {
    let (mut client_read, mut client_write) = stream.into_split();
    let (mut guest_read, mut guest_write) = tokio::io::split(upstream);
    let to_guest = tokio::spawn(async move {
        if guest_write.write_all(&head).await.is_ok() {
            let _ = tokio::io::copy(&mut client_read, &mut guest_write).await;
        }
        let _ = guest_write.shutdown().await;
    });
    let mut buf = vec![0u8; 64 << 10];
    let mut answered = false;
    loop {
        match guest_read.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                answered = true;
                if client_write.write_all(&buf[..n]).await.is_err() {
                    break;
                }
            }
        }
    }
    if !answered {
        let body = format!(
            "farm: nothing answered on the sandbox's port {port} (is a server listening on 127.0.0.1:{port}?)\n"
        );
        let answer = format!(
            "HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        let _ = client_write.write_all(answer.as_bytes()).await;
    }
    let _ = client_write.shutdown().await;
    to_guest.abort();
}

/// Reads up to the end of the first request head (whatever follows it is kept in `head` and
/// forwarded with it).
async fn read_head(stream: &mut tokio::net::TcpStream, head: &mut Vec<u8>) -> std::io::Result<()> {
    let mut buf = [0u8; 4096];
    loop {
        if head.windows(4).any(|w| w == b"\r\n\r\n") {
            return Ok(());
        }
        if head.len() > MAX_HEAD {
            return Err(std::io::Error::other("the head is too long"));
        }
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            return Err(std::io::Error::other("closed before the head ended"));
        }
        head.extend_from_slice(&buf[..n]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(raw: &[u8]) -> Option<Named> {
        let mut headers = [httparse::EMPTY_HEADER; 16];
        let mut request = httparse::Request::new(&mut headers);
        request.parse(raw).unwrap();
        named(&request)
    }

    fn token(raw: &[u8]) -> Option<String> {
        match parse(raw)? {
            Named::Token(token) => Some(token),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_token_comes_from_the_host_a_header_or_the_query() {
        let t = "0123456789abcdef0123456789abcdef";
        let host = format!("GET / HTTP/1.1\r\nHost: {t}.localhost:8766\r\n\r\n");
        assert_eq!(token(host.as_bytes()).as_deref(), Some(t));
        let header = format!("GET / HTTP/1.1\r\nHost: 127.0.0.1:8766\r\nFarm-Port-Token: {t}\r\n\r\n");
        assert_eq!(token(header.as_bytes()).as_deref(), Some(t));
        let query = format!("GET /a?x=1&farm_token={t} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
        assert_eq!(token(query.as_bytes()).as_deref(), Some(t));
        assert_eq!(token(b"GET / HTTP/1.1\r\nHost: www.example.org\r\n\r\n"), None);
        assert_eq!(token(b"GET / HTTP/1.1\r\n\r\n"), None);
    }

    #[test]
    fn e2bs_host_names_a_port_a_sandbox_and_its_key() {
        let key = "00112233445566778899aabbccddeeff";
        let raw = format!("GET / HTTP/1.1\r\nHost: 8000-sb-ab12.{key}.localhost:8766\r\n\r\n");
        assert_eq!(
            parse(raw.as_bytes()),
            Some(Named::E2bHost {
                port: 8000,
                sandbox: "sb-ab12".into(),
                key: key.into()
            })
        );
        // Not E2B's shape: port 0, past 65535, not a number, a key that is not 32 hex digits.
        for host in [
            format!("0-sb-ab12.{key}.localhost"),
            format!("70000-sb-ab12.{key}.localhost"),
            format!("x-sb-ab12.{key}.localhost"),
            "8000-sb-ab12.0011.localhost".to_string(),
        ] {
            let raw = format!("GET / HTTP/1.1\r\nHost: {host}\r\n\r\n");
            assert_eq!(parse(raw.as_bytes()), None, "{host}");
        }
    }
}
