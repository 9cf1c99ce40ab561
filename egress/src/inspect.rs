//! Inspected connections: a guest connection to a host that request rules name
//! ([`crate::rules`]) is served as HTTP/1.1 by the proxy itself (hyper), one request at a
//! time. Each request is checked against the rules; an allowed one is re-serialised and sent
//! upstream alone, on a connection of its own that carries nothing else; any other gets a
//! 403 that names the rule set (or a 400 for framing the proxy never forwards), and is logged
//! with its method, host and path. A `git push` is read up to its ref updates, and refused
//! whole before anything reaches the server if one is outside the rule's patterns.
//!
//! What goes upstream is what was checked: the request line in origin form, the headers less
//! the hop-by-hop ones (the proxy's framing and connection handling are its own), `Host` set
//! to the checked host, `Connection: close`, and a body only where one belongs: a method that
//! carries one (POST, PUT, PATCH) or a rule that allows bodies. Framing a server could read
//! two ways is refused outright: `Content-Length` with `Transfer-Encoding`, several
//! `Content-Length`s, a `Transfer-Encoding` other than `chunked`, an `Upgrade`.

use std::convert::Infallible;

use bytes::Bytes;
use farm_protocol::net::Frame;
use futures_util::StreamExt;
use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
use hyper::body::{Frame as BodyFrame, Incoming};
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;

use crate::destination::{resolve, UPSTREAM_TIMEOUT};
use crate::framing::{FramingGuard, REFUSED_HEADER};
use crate::policy::{Attempt, Policy, UpstreamFailure, Verdict};
use crate::relay::{pipe, Relayed};
use crate::rules::{check_push, receive_pack_commands, Decision, GitPush};

type Body = BoxBody<Bytes, hyper::Error>;

/// Methods whose requests carry a body. Any other request with one is refused unless the
/// rule that allows it says `allow_bodies`: a server that does not read, say, a GET's body
/// would read it as the next request on the connection.
const BODY_METHODS: [&str; 3] = ["POST", "PUT", "PATCH"];

/// Headers that belong to one connection (RFC 9110 section 7.6.1), never forwarded either way.
const HOP_BY_HOP: [&str; 10] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "expect",
];

/// Serves one guest connection whose first bytes (`head`, a proxy request in absolute form)
/// were read already; returns where the guest's further bytes go.
pub(crate) fn inspect(conn: u32, head: Vec<u8>, policy: Policy, to_guest: mpsc::Sender<Frame>) -> Relayed {
    let (relayed, proxy_side) = pipe(conn, head, to_guest);
    let served = tokio::spawn(async move {
        let service = hyper::service::service_fn(move |request| {
            let policy = policy.clone();
            async move { Ok::<_, Infallible>(handle(request, &policy, None).await) }
        });
        let _ = hyper::server::conn::http1::Builder::new()
            .serve_connection(TokioIo::new(FramingGuard::new(proxy_side)), service)
            .await;
    });
    relayed.with(served.abort_handle())
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
) -> Option<Relayed> {
    let target = format!("CONNECT {host}:{port}");
    let config = match policy.rules.ca().map(|ca| ca.server_config(&host)) {
        Some(Ok(config)) => config,
        Some(Err(e)) => {
            policy.report(Attempt::new(target, Verdict::Refused { reason: e.to_string() }));
            return None;
        }
        None => return None,
    };
    let (relayed, mut proxy_side) = pipe(conn, after_head, to_guest);
    let served = tokio::spawn(async move {
        // The answer to CONNECT goes to the guest first (the pipe carries it).
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
                let reason = format!("TLS with the guest failed: {e} (does the guest trust farm's egress CA?)");
                policy.report(Attempt::new(target, Verdict::Refused { reason }));
                return;
            }
        };
        let tunnel = (host, port);
        let service = hyper::service::service_fn(move |request| {
            let (policy, tunnel) = (policy.clone(), tunnel.clone());
            async move { Ok::<_, Infallible>(handle(request, &policy, Some(&tunnel)).await) }
        });
        let _ = hyper::server::conn::http1::Builder::new()
            .serve_connection(TokioIo::new(FramingGuard::new(tls)), service)
            .await;
    });
    Some(relayed.with(served.abort_handle()))
}

fn plain(status: StatusCode, text: &str) -> Response<Body> {
    let mut response = Response::new(
        Full::new(Bytes::from(format!("farm: {text}\n")))
            .map_err(|never| match never {})
            .boxed(),
    );
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    response
}

/// Why a request's framing is refused whatever the rules, if it is.
fn ambiguous_framing(headers: &HeaderMap) -> Option<&'static str> {
    let lengths: Vec<&HeaderValue> = headers.get_all(header::CONTENT_LENGTH).iter().collect();
    let encodings: Vec<&HeaderValue> = headers.get_all(header::TRANSFER_ENCODING).iter().collect();
    if lengths.len() > 1 {
        return Some("more than one Content-Length");
    }
    if lengths
        .first()
        .is_some_and(|v| v.is_empty() || !v.as_bytes().iter().all(u8::is_ascii_digit))
    {
        return Some("a Content-Length that is not a number");
    }
    if !lengths.is_empty() && !encodings.is_empty() {
        return Some("both Content-Length and Transfer-Encoding");
    }
    if encodings.len() > 1
        || encodings
            .first()
            .is_some_and(|v| !v.as_bytes().eq_ignore_ascii_case(b"chunked"))
    {
        return Some("a Transfer-Encoding other than chunked");
    }
    if headers.contains_key(header::UPGRADE) {
        return Some("a protocol upgrade (Upgrade), which the proxy does not inspect");
    }
    None
}

/// Whether a request says it carries a body: a non-zero length, chunks, or `Expect`.
fn announces_body(headers: &HeaderMap) -> bool {
    let length = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    length.is_some_and(|n| n > 0)
        || headers.contains_key(header::TRANSFER_ENCODING)
        || headers.contains_key(header::EXPECT)
}

/// Removes the hop-by-hop headers, and those `Connection` names.
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|token| HeaderName::from_bytes(token.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
}

/// One request from the guest: plain (`tunnel` None: the host is the request's), or inside
/// an intercepted TLS tunnel to `tunnel`.
async fn handle(request: Request<Incoming>, policy: &Policy, tunnel: Option<&(String, u16)>) -> Response<Body> {
    let method = request.method().as_str().to_string();
    let Some((host, port)) = destination(&request, tunnel) else {
        return plain(StatusCode::BAD_REQUEST, "a proxy request needs an absolute http:// URL");
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
    let answers = Answers { policy, shown };
    if let Some(reason) = request.headers().get(REFUSED_HEADER) {
        // farm's stand-in for a request the framing guard refused (see crate::framing).
        let reason = reason.to_str().unwrap_or("").replace('-', " ");
        return answers.refuse(format!(
            "a request with {reason}: framing a server could read as more than one request"
        ));
    }
    if let Some(why) = ambiguous_framing(request.headers()) {
        return answers.refuse(format!("{why}: framing a server could read as more than one request"));
    }
    let (rule, credential, git_push, bodies) = match policy.rules.decide(&method, &host, port, &target) {
        Decision::Deny(reason) => return answers.deny(reason),
        Decision::Allow {
            rule,
            credential,
            git_push,
            bodies,
        } => (
            rule,
            credential.map(|(h, v)| (h.to_string(), v.to_string())),
            git_push.cloned(),
            bodies,
        ),
    };
    if announces_body(request.headers()) && !BODY_METHODS.contains(&method.as_str()) && !bodies {
        return answers.refuse(format!(
            "a {method} with a body (a server that does not read it would take it for another request; \
             a rule with allow_bodies = true allows it)"
        ));
    }
    let (mut parts, body) = request.into_parts();
    // The body, as the upstream gets it; for a push, its commands are read and checked first.
    let body: Body = match &git_push {
        None => body.boxed(),
        Some(push) => match checked_push_body(body, &parts.headers, push, &answers).await {
            Ok(body) => body,
            Err(response) => return response,
        },
    };
    if let Err(bad) = head_for_upstream(&mut parts, &target, &host, port, tunnel.is_some()) {
        return answers.refuse(bad.to_string());
    }
    if let Some((name, value)) = &credential {
        let Some((name, value)) = credential_header(name, value) else {
            return plain(
                StatusCode::INTERNAL_SERVER_ERROR,
                "the rule's credential is not a valid header",
            );
        };
        parts.headers.insert(name, value);
    }
    let detail = format!(
        "rule {rule} of {}{}",
        policy.rules.name,
        if credential.is_some() { ", credential added" } else { "" }
    );
    let request = Request::from_parts(parts, body);
    forward(request, &host, port, tunnel.is_some(), detail, &answers).await
}

/// Where a request goes: the tunnel's end, else the request's authority (or its `Host`).
fn destination(request: &Request<Incoming>, tunnel: Option<&(String, u16)>) -> Option<(String, u16)> {
    let authority = request.uri().authority().map(|a| a.to_string()).or_else(|| {
        request
            .headers()
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .map(String::from)
    });
    let target_of = |a: &str| match a.rsplit_once(':') {
        Some((h, p)) => p.parse().ok().map(|p| (h.to_string(), p)),
        None => Some((a.to_string(), 80)),
    };
    tunnel.cloned().or_else(|| authority.as_deref().and_then(target_of))
}

/// How one guest request is answered, each answer logged as an attempt on `shown` (the
/// request as the log names it).
struct Answers<'a> {
    policy: &'a Policy,
    shown: String,
}

impl Answers<'_> {
    /// 400: framing or a form the proxy never forwards, whatever the rules.
    fn refuse(&self, reason: String) -> Response<Body> {
        let response = plain(
            StatusCode::BAD_REQUEST,
            &format!("{reason}; the proxy does not forward it"),
        );
        self.policy
            .report(Attempt::new(&self.shown, Verdict::Refused { reason }));
        response
    }

    /// 403: the request rules do not allow it.
    fn deny(&self, reason: String) -> Response<Body> {
        let response = plain(
            StatusCode::FORBIDDEN,
            &format!("{reason} (request rules: {})", self.policy.rules.name),
        );
        self.policy
            .report(Attempt::new(&self.shown, Verdict::Denied { reason }));
        response
    }
}

/// A push's body as the upstream gets it: read from the guest up to its ref updates, which
/// are checked against the push rule before any of it goes on; or the guest's answer.
async fn checked_push_body(
    mut body: Incoming,
    headers: &HeaderMap,
    push: &GitPush,
    answers: &Answers<'_>,
) -> Result<Body, Response<Body>> {
    let mut prefix = Vec::new();
    let updates = loop {
        match receive_pack_commands(&prefix) {
            Ok(Some((updates, _))) => break updates,
            Ok(None) => {}
            Err(e) => return Err(answers.deny(format!("push refused: {e}"))),
        }
        match body.frame().await {
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    prefix.extend_from_slice(&data);
                }
            }
            Some(Err(_)) | None => {
                return Err(answers.refuse("a push that ended before its ref updates".into()));
            }
        }
    };
    if headers.contains_key(header::CONTENT_ENCODING) {
        return Err(answers.deny("push refused: an encoded (compressed) push body is not read by the push rule".into()));
    }
    if let Err(e) = check_push(push, &updates) {
        return Err(answers.deny(format!("push refused: {e}")));
    }
    let first = futures_util::stream::once(async move { Ok::<_, hyper::Error>(BodyFrame::data(Bytes::from(prefix))) });
    let rest = http_body_util::BodyStream::new(body);
    Ok(BodyExt::boxed(StreamBody::new(first.chain(rest))))
}

/// A host that cannot be sent as a `Host` header.
#[derive(Debug, thiserror::Error)]
#[error("{0} is not a host name")]
struct NotAHostName(String);

/// Makes a checked request's head the one that goes upstream; Err: the host cannot be a
/// `Host` header.
fn head_for_upstream(
    parts: &mut hyper::http::request::Parts,
    target: &str,
    host: &str,
    port: u16,
    tls: bool,
) -> Result<(), NotAHostName> {
    // Origin form upstream; the framing and the connection are the proxy's own (hyper frames
    // the body again: by the checked Content-Length, else in chunks); one request only.
    parts.uri = target.parse().unwrap_or_else(|_| hyper::Uri::from_static("/"));
    strip_hop_by_hop(&mut parts.headers);
    parts
        .headers
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    // The host the rules checked is the one the server hears of (no other virtual host).
    let host_header = if (tls && port == 443) || (!tls && port == 80) {
        host.to_string()
    } else {
        format!("{host}:{port}")
    };
    match HeaderValue::from_str(&host_header) {
        Ok(value) => {
            parts.headers.insert(header::HOST, value);
            Ok(())
        }
        Err(_) => Err(NotAHostName(host.to_string())),
    }
}

/// The rule's credential as a header, its value marked sensitive; None when it is not a
/// valid header.
fn credential_header(name: &str, value: &str) -> Option<(HeaderName, HeaderValue)> {
    match (HeaderName::from_bytes(name.as_bytes()), HeaderValue::from_str(value)) {
        (Ok(name), Ok(mut value)) => {
            value.set_sensitive(true);
            Some((name, value))
        }
        _ => None,
    }
}

/// Sends an allowed request upstream and answers the guest with what came back (or where it
/// failed), logged with `detail` (the rule that allowed it).
async fn forward(
    request: Request<Body>,
    host: &str,
    port: u16,
    tls: bool,
    detail: String,
    answers: &Answers<'_>,
) -> Response<Body> {
    match exchange(request, host, port, tls, answers.policy).await {
        Ok(mut response) => {
            let verdict = Verdict::Allowed { detail: Some(detail) };
            answers.policy.report(Attempt::new(&answers.shown, verdict));
            strip_hop_by_hop(response.headers_mut());
            response.map(|b| b.boxed())
        }
        Err(Failed::Refused(reason)) => answers.deny(reason),
        Err(Failed::Upstream(failure, detail)) => {
            let status = StatusCode::from_u16(failure.status()).unwrap_or(StatusCode::BAD_GATEWAY);
            let response = plain(status, &format!("{host}:{port}: {detail}"));
            let verdict = Verdict::UpstreamFailed { failure, detail };
            answers.policy.report(Attempt::new(&answers.shown, verdict));
            response
        }
    }
}

/// Why an allowed request got no answer from its upstream.
enum Failed {
    /// Its host resolved where the policy does not reach (403).
    Refused(String),
    /// The upstream failed (502, 504).
    Upstream(UpstreamFailure, String),
}

impl From<(UpstreamFailure, String)> for Failed {
    fn from((failure, detail): (UpstreamFailure, String)) -> Failed {
        Failed::Upstream(failure, detail)
    }
}

/// Sends one checked request to `host:port` on a connection of its own (over TLS verified
/// for `host` when `tls`), and returns the answer or where it failed. The addresses `host`
/// resolves to are checked against `policy` ([`Policy::refuses_destination`]) and are the
/// ones connected to.
async fn exchange(
    request: Request<Body>,
    host: &str,
    port: u16,
    tls: bool,
    policy: &Policy,
) -> Result<Response<Incoming>, Failed> {
    let timed_out = |what: &str| {
        (
            UpstreamFailure::Timeout,
            format!("{what} took over {} s", UPSTREAM_TIMEOUT.as_secs()),
        )
    };
    let addresses = match tokio::time::timeout(UPSTREAM_TIMEOUT, resolve(host, port)).await {
        Ok(Ok(a)) => a,
        Ok(Err(e)) => return Err((UpstreamFailure::Dns, format!("resolving {host} failed: {e}")).into()),
        Err(_) => return Err(timed_out("resolving").into()),
    };
    if let Some(reason) = policy.refuses_destination(&addresses) {
        return Err(Failed::Refused(reason));
    }
    send_to(request, host, &addresses, tls).await.map_err(Failed::from)
}

/// Sends `request` to `addresses` (`host`'s), over TLS verified for `host` when `tls`.
async fn send_to(
    request: Request<Body>,
    host: &str,
    addresses: &[std::net::SocketAddr],
    tls: bool,
) -> Result<Response<Incoming>, (UpstreamFailure, String)> {
    let timed_out = |what: &str| {
        (
            UpstreamFailure::Timeout,
            format!("{what} took over {} s", UPSTREAM_TIMEOUT.as_secs()),
        )
    };
    let stream = match tokio::time::timeout(UPSTREAM_TIMEOUT, tokio::net::TcpStream::connect(addresses)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return Err((UpstreamFailure::Connect, format!("connecting failed: {e}"))),
        Err(_) => return Err(timed_out("connecting")),
    };
    let exchange_failed = |e: hyper::Error| (UpstreamFailure::Exchange, format!("the exchange failed: {e}"));
    if !tls {
        return send(TokioIo::new(stream), request).await.map_err(exchange_failed);
    }
    // Upstream TLS, checked against the host's trust store for the name the guest asked for.
    let config = crate::ca::upstream_tls().map_err(|e| (UpstreamFailure::Tls, e.to_string()))?;
    let name = rustls::pki_types::ServerName::try_from(host.to_string())
        .map_err(|_| (UpstreamFailure::Tls, format!("{host} is not a TLS server name")))?;
    let tls = match tokio::time::timeout(
        UPSTREAM_TIMEOUT,
        tokio_rustls::TlsConnector::from(config).connect(name, stream),
    )
    .await
    {
        Ok(Ok(tls)) => tls,
        Ok(Err(e)) => return Err((UpstreamFailure::Tls, format!("TLS failed: {e}"))),
        Err(_) => return Err(timed_out("the TLS handshake")),
    };
    send(TokioIo::new(tls), request).await.map_err(exchange_failed)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        map
    }

    #[test]
    fn framing_a_server_could_read_two_ways_is_refused() {
        for bad in [
            &[("content-length", "5"), ("transfer-encoding", "chunked")][..],
            &[("content-length", "5"), ("content-length", "5")],
            &[("content-length", "+5")],
            &[("transfer-encoding", "gzip, chunked")],
            &[("transfer-encoding", "chunked"), ("transfer-encoding", "chunked")],
            &[("transfer-encoding", " chunked")],
            &[("upgrade", "h2c"), ("connection", "upgrade")],
        ] {
            assert!(ambiguous_framing(&headers(bad)).is_some(), "{bad:?}");
        }
        for fine in [
            &[("content-length", "12")][..],
            &[("transfer-encoding", "Chunked")],
            &[],
        ] {
            assert_eq!(ambiguous_framing(&headers(fine)), None, "{fine:?}");
        }
        assert!(announces_body(&headers(&[("content-length", "1")])));
        assert!(announces_body(&headers(&[("expect", "100-continue")])));
        assert!(announces_body(&headers(&[("transfer-encoding", "chunked")])));
        assert!(!announces_body(&headers(&[("content-length", "0")])));
        let mut map = headers(&[
            ("connection", "close, x-secret-hop"),
            ("x-secret-hop", "1"),
            ("keep-alive", "5"),
            ("te", "trailers"),
            ("expect", "100-continue"),
            ("accept", "*/*"),
        ]);
        strip_hop_by_hop(&mut map);
        assert_eq!(map.keys().map(|k| k.as_str()).collect::<Vec<_>>(), ["accept"]);
    }
}
