//! Inspected connections: a guest connection to a host that request rules name
//! ([`crate::rules`]) is served as HTTP/1.1 by the proxy itself (hyper), one request at a
//! time. Each request is checked against the rules; an allowed one gets the rule's
//! credential header and is sent upstream on a connection of its own; any other gets a 403
//! that names the rule set, and is logged with its method, host and path. A `git push` is
//! read up to its ref updates, and refused whole before anything reaches the server if one
//! is outside the rule's patterns.

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use farm_protocol::net::{Frame, Kind, MAX_PAYLOAD};
use futures_util::StreamExt;
use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
use hyper::body::{Frame as BodyFrame, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

use crate::port::{Policy, HOST_ALIAS};
use crate::rules::{check_push, receive_pack_commands, Decision};

type Body = BoxBody<Bytes, hyper::Error>;

/// Serves one guest connection whose first bytes (`head`, a proxy request in absolute form)
/// were read already; returns where the guest's further bytes go.
pub(crate) fn inspect(
    conn: u32,
    head: Vec<u8>,
    policy: Policy,
    to_guest: mpsc::Sender<Frame>,
) -> mpsc::Sender<Vec<u8>> {
    let (to_up, proxy_side) = pump(conn, head, to_guest);
    tokio::spawn(async move {
        let service = hyper::service::service_fn(move |request| {
            let policy = policy.clone();
            async move { Ok::<_, Infallible>(handle(request, &policy, None).await) }
        });
        let _ = hyper::server::conn::http1::Builder::new()
            .serve_connection(TokioIo::new(proxy_side), service)
            .await;
    });
    to_up
}

/// Serves a guest's `CONNECT host:port` to an inspected host: answers it, then terminates the
/// guest's TLS with a certificate for `host` from the rules' CA, and serves the requests
/// inside as [`inspect`] does, upstream over TLS checked against the host's trust store.
pub(crate) fn inspect_tls(
    conn: u32,
    after_head: Vec<u8>,
    policy: Policy,
    to_guest: mpsc::Sender<Frame>,
    host: String,
    port: u16,
) -> Option<mpsc::Sender<Vec<u8>>> {
    let config = match policy.rules.ca().map(|ca| ca.server_config(&host)) {
        Some(Ok(config)) => config,
        Some(Err(e)) => {
            policy.report(&format!("network: refused CONNECT {host}:{port}: {e}"));
            return None;
        }
        None => return None,
    };
    let (to_up, mut proxy_side) = pump(conn, after_head, to_guest);
    tokio::spawn(async move {
        // The answer to CONNECT goes to the guest first (the pump carries it).
        if proxy_side
            .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
            .await
            .is_err()
        {
            return;
        }
        let tls = match tokio_rustls::TlsAcceptor::from(config).accept(proxy_side).await {
            Ok(tls) => tls,
            Err(e) => {
                policy.report(&format!("network: TLS with the guest for {host}:{port} failed: {e} (does the guest trust farm's egress CA?)"));
                return;
            }
        };
        let tunnel = (host, port);
        let service = hyper::service::service_fn(move |request| {
            let (policy, tunnel) = (policy.clone(), tunnel.clone());
            async move { Ok::<_, Infallible>(handle(request, &policy, Some(&tunnel)).await) }
        });
        let _ = hyper::server::conn::http1::Builder::new()
            .serve_connection(TokioIo::new(tls), service)
            .await;
    });
    Some(to_up)
}

/// Joins a guest connection to one end of an in-memory pipe: what the guest sends (after
/// `first`) comes out of the returned end, and what is written there goes to the guest.
fn pump(conn: u32, first: Vec<u8>, to_guest: mpsc::Sender<Frame>) -> (mpsc::Sender<Vec<u8>>, tokio::io::DuplexStream) {
    let (guest_side, proxy_side) = tokio::io::duplex(256 << 10);
    let (mut from_proxy, mut to_proxy) = tokio::io::split(guest_side);
    let (to_up, mut from_guest) = mpsc::channel::<Vec<u8>>(64);
    tokio::spawn(async move {
        if !first.is_empty() && to_proxy.write_all(&first).await.is_err() {
            return;
        }
        while let Some(bytes) = from_guest.recv().await {
            if to_proxy.write_all(&bytes).await.is_err() {
                return;
            }
        }
        let _ = to_proxy.shutdown().await;
    });
    tokio::spawn(async move {
        let mut buf = vec![0u8; MAX_PAYLOAD];
        loop {
            match from_proxy.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if to_guest
                        .send(Frame {
                            conn,
                            kind: Kind::Data,
                            payload: buf[..n].to_vec(),
                        })
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
            }
        }
        let _ = to_guest
            .send(Frame {
                conn,
                kind: Kind::Close,
                payload: Vec::new(),
            })
            .await;
    });
    (to_up, proxy_side)
}

fn plain(status: StatusCode, text: String) -> Response<Body> {
    let mut response = Response::new(
        Full::new(Bytes::from(format!("farm: {text}\n")))
            .map_err(|never| match never {})
            .boxed(),
    );
    *response.status_mut() = status;
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/plain"),
    );
    response
}

/// One request from the guest: plain (`tunnel` None: the host is the request's), or inside
/// an intercepted TLS tunnel to `tunnel`.
async fn handle(request: Request<Incoming>, policy: &Policy, tunnel: Option<&(String, u16)>) -> Response<Body> {
    let method = request.method().as_str().to_string();
    let authority = request.uri().authority().map(|a| a.to_string()).or_else(|| {
        request
            .headers()
            .get(hyper::header::HOST)
            .and_then(|h| h.to_str().ok())
            .map(String::from)
    });
    let target_of = |a: &str| match a.rsplit_once(':') {
        Some((h, p)) => p.parse().ok().map(|p| (h.to_string(), p)),
        None => Some((a.to_string(), 80)),
    };
    let Some((host, port)) = tunnel.cloned().or_else(|| authority.as_deref().and_then(target_of)) else {
        return plain(
            StatusCode::BAD_REQUEST,
            "a proxy request needs an absolute http:// URL".into(),
        );
    };
    let target = request
        .uri()
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "/".into());
    let scheme = if tunnel.is_some() { "https://" } else { "" };
    let shown = format!(
        "{method} {scheme}{host}:{port}{}",
        target.split('?').next().unwrap_or("")
    );
    let (credential, git_push, rule) = match policy.rules.decide(&method, &host, port, &target) {
        Decision::Deny(reason) => {
            policy.report(&format!("network: denied {shown}: {reason}"));
            return plain(
                StatusCode::FORBIDDEN,
                format!("{reason} (request rules: {})", policy.rules.name),
            );
        }
        Decision::Allow {
            rule,
            credential,
            git_push,
        } => (
            credential.map(|(h, v)| (h.to_string(), v.to_string())),
            git_push.cloned(),
            rule,
        ),
    };
    let (mut parts, body) = request.into_parts();
    // The body, as the upstream gets it; for a push, its commands are read and checked first.
    let body: Body = match &git_push {
        None => body.boxed(),
        Some(push) => {
            let mut body = body;
            let mut prefix = Vec::new();
            let updates = loop {
                match receive_pack_commands(&prefix) {
                    Ok(Some((updates, _))) => break updates,
                    Ok(None) => {}
                    Err(e) => {
                        policy.report(&format!("network: denied {shown}: {e}"));
                        return plain(
                            StatusCode::FORBIDDEN,
                            format!("push refused: {e} (request rules: {})", policy.rules.name),
                        );
                    }
                }
                match body.frame().await {
                    Some(Ok(frame)) => {
                        if let Ok(data) = frame.into_data() {
                            prefix.extend_from_slice(&data);
                        }
                    }
                    Some(Err(_)) | None => {
                        return plain(StatusCode::BAD_REQUEST, "the push ended before its ref updates".into())
                    }
                }
            };
            if parts.headers.contains_key(hyper::header::CONTENT_ENCODING) {
                policy.report(&format!("network: denied {shown}: an encoded push body"));
                return plain(
                    StatusCode::FORBIDDEN,
                    "push refused: an encoded (compressed) push body is not read by the push rule".into(),
                );
            }
            if let Err(e) = check_push(push, &updates) {
                policy.report(&format!("network: denied {shown}: {e}"));
                return plain(
                    StatusCode::FORBIDDEN,
                    format!("push refused: {e} (request rules: {})", policy.rules.name),
                );
            }
            let first =
                futures_util::stream::once(async move { Ok::<_, hyper::Error>(BodyFrame::data(Bytes::from(prefix))) });
            let rest = http_body_util::BodyStream::new(body);
            BodyExt::boxed(StreamBody::new(first.chain(rest)))
        }
    };
    // Origin form upstream; the proxy's own headers stay here; the credential is the rule's.
    parts.uri = target.parse().unwrap_or_else(|_| hyper::Uri::from_static("/"));
    for name in ["proxy-connection", "proxy-authorization"] {
        parts.headers.remove(name);
    }
    // The host the rules checked is the one the server hears of (no other virtual host).
    let host_header = if (tunnel.is_some() && port == 443) || (tunnel.is_none() && port == 80) {
        host.clone()
    } else {
        format!("{host}:{port}")
    };
    match hyper::header::HeaderValue::from_str(&host_header) {
        Ok(value) => {
            parts.headers.insert(hyper::header::HOST, value);
        }
        Err(_) => return plain(StatusCode::BAD_REQUEST, format!("{host} is not a host name")),
    }
    if let Some((header, value)) = &credential {
        match (
            hyper::header::HeaderName::from_bytes(header.as_bytes()),
            hyper::header::HeaderValue::from_str(value),
        ) {
            (Ok(name), Ok(mut value)) => {
                value.set_sensitive(true);
                parts.headers.insert(name, value);
            }
            _ => {
                return plain(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "the rule's credential is not a valid header".into(),
                )
            }
        }
    }
    let upstream_host = if host.eq_ignore_ascii_case(HOST_ALIAS) {
        "127.0.0.1".to_string()
    } else {
        host.clone()
    };
    let stream = match tokio::time::timeout(
        Duration::from_secs(15),
        tokio::net::TcpStream::connect((upstream_host.as_str(), port)),
    )
    .await
    {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            return plain(
                StatusCode::BAD_GATEWAY,
                format!("connecting to {host}:{port} failed: {e}"),
            )
        }
        Err(_) => {
            return plain(
                StatusCode::GATEWAY_TIMEOUT,
                format!("{host}:{port} did not answer within 15 s"),
            )
        }
    };
    let request = Request::from_parts(parts, body);
    let sent = if tunnel.is_some() {
        // Upstream TLS, checked against the host's trust store for the name the guest asked for.
        let config = match crate::ca::upstream_tls() {
            Ok(c) => c,
            Err(e) => return plain(StatusCode::BAD_GATEWAY, e),
        };
        let Ok(name) = rustls::pki_types::ServerName::try_from(host.clone()) else {
            return plain(StatusCode::BAD_GATEWAY, format!("{host} is not a TLS server name"));
        };
        let tls = match tokio_rustls::TlsConnector::from(config).connect(name, stream).await {
            Ok(tls) => tls,
            Err(e) => {
                policy.report(&format!("network: TLS to {host}:{port} failed: {e}"));
                return plain(StatusCode::BAD_GATEWAY, format!("TLS to {host}:{port} failed: {e}"));
            }
        };
        send(TokioIo::new(tls), request).await
    } else {
        send(TokioIo::new(stream), request).await
    };
    policy.report(&format!(
        "network: allowed {shown} (rule {rule} of {}{})",
        policy.rules.name,
        if credential.is_some() { ", credential added" } else { "" }
    ));
    match sent {
        Ok(response) => response.map(|b| b.boxed()),
        Err(e) => plain(StatusCode::BAD_GATEWAY, format!("{host}:{port} failed: {e}")),
    }
}

/// One request on a new upstream connection.
async fn send<T>(io: TokioIo<T>, request: Request<Body>) -> Result<Response<Incoming>, hyper::Error>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, connection) = hyper::client::conn::http1::handshake(io).await?;
    tokio::spawn(connection);
    sender.send_request(request).await
}
