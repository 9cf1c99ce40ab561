//! The proxy against a guest that tries to get past its rules, with an upstream as careless
//! as Python's `http.server`-based apps: it never reads a request's body and keeps the
//! connection open, so any body it is sent is read as the next request. Each test sends raw
//! bytes on the VM's port, as a guest can, and checks what the upstream executed.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use farm_protocol::net::{Frame, Kind};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::policy::{Attempt, Policy, SharedPolicy, UpstreamFailure, Verdict};
use crate::rules::{Rule, RuleSet};

mod connections;
mod destinations;

/// Request lines a naive upstream executed.
type Executed = Arc<Mutex<Vec<String>>>;

/// Serves requests on `stream` as a careless app server does: each request head is parsed and
/// answered, no body is ever read, and the connection stays open unless the request said
/// `Connection: close`; whatever follows a head is read as the next request.
async fn naive_exchange<S: AsyncRead + AsyncWrite + Unpin>(mut stream: S, executed: Executed) {
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        while !buffer.windows(4).any(|w| w == b"\r\n\r\n") {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buffer.extend_from_slice(&chunk[..n]),
            }
        }
        let end = buffer.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
        let head = String::from_utf8_lossy(&buffer[..end]).to_string();
        buffer.drain(..end);
        executed
            .lock()
            .unwrap()
            .push(head.lines().next().unwrap_or("").to_string());
        if stream
            .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nok\n")
            .await
            .is_err()
        {
            return;
        }
        if head.to_ascii_lowercase().contains("\r\nconnection: close") {
            return;
        }
    }
}

/// A naive upstream on loopback: its port and what it executed.
async fn naive_upstream() -> (u16, Executed) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let executed: Executed = Default::default();
    let record = executed.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(naive_exchange(stream, record.clone()));
        }
    });
    (port, executed)
}

/// Where each of the guest's connections gets what arrives for it (None: it was closed).
type Readers = Arc<Mutex<HashMap<u32, tokio::sync::mpsc::UnboundedSender<Option<Vec<u8>>>>>>;

/// A guest's end of the VM's network port: connections on it, each read by its own channel.
struct Guest {
    to_host: Arc<tokio::sync::Mutex<tokio::net::unix::OwnedWriteHalf>>,
    readers: Readers,
}

/// One connection of the guest's: what arrives on it (None: the proxy closed it).
struct Connection {
    incoming: tokio::sync::mpsc::UnboundedReceiver<Option<Vec<u8>>>,
    received: Vec<u8>,
    closed: bool,
}

/// The frames the host sends a test's guest, decoded, until the host closes its end.
fn frames(mut from_host: impl AsyncRead + Unpin + Send + 'static) -> tokio::sync::mpsc::UnboundedReceiver<Frame> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let (mut pending, mut buf) = (Vec::new(), vec![0u8; 65536]);
        loop {
            let n = match from_host.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            pending.extend_from_slice(&buf[..n]);
            while let Some((frame, used)) = Frame::decode(&pending).unwrap() {
                pending.drain(..used);
                if tx.send(frame).is_err() {
                    return;
                }
            }
        }
    });
    rx
}

impl Guest {
    fn start(policy: Policy) -> Guest {
        let shared: SharedPolicy = Arc::new(Mutex::new(policy));
        let (guest, host) = tokio::net::UnixStream::pair().unwrap();
        tokio::spawn(crate::port::serve(
            host,
            shared,
            tokio::sync::mpsc::channel(1).1,
            tokio::sync::watch::channel(0).1,
        ));
        let (from_host, to_host) = guest.into_split();
        let readers: Readers = Default::default();
        let routes = readers.clone();
        let mut frames = frames(from_host);
        tokio::spawn(async move {
            while let Some(frame) = frames.recv().await {
                if let Some(reader) = routes.lock().unwrap().get(&frame.conn) {
                    let _ = reader.send(match frame.kind {
                        Kind::Data => Some(frame.payload),
                        _ => None,
                    });
                }
            }
        });
        Guest {
            to_host: Arc::new(tokio::sync::Mutex::new(to_host)),
            readers,
        }
    }

    async fn frame(&self, conn: u32, kind: Kind, payload: &[u8]) {
        let frame = Frame {
            conn,
            kind,
            payload: payload.to_vec(),
        };
        self.to_host.lock().await.write_all(&frame.encode()).await.unwrap();
    }

    /// Opens connection `conn` and sends `bytes` on it.
    async fn send(&self, conn: u32, bytes: &[u8]) -> Connection {
        let (tx, incoming) = tokio::sync::mpsc::unbounded_channel();
        self.readers.lock().unwrap().insert(conn, tx);
        self.frame(conn, Kind::Open, b"").await;
        if !bytes.is_empty() {
            self.frame(conn, Kind::Data, bytes).await;
        }
        Connection {
            incoming,
            received: Vec::new(),
            closed: false,
        }
    }

    /// Opens connection `conn` as a byte stream (for TLS over it).
    async fn stream(&self, conn: u32) -> tokio::io::DuplexStream {
        let mut connection = self.send(conn, b"").await;
        let (mine, theirs) = tokio::io::duplex(1 << 20);
        let (mut from_mine, mut to_mine) = tokio::io::split(mine);
        let to_host = self.to_host.clone();
        tokio::spawn(async move {
            let mut buf = vec![0u8; 16384];
            while let Ok(n) = from_mine.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                let frame = Frame {
                    conn,
                    kind: Kind::Data,
                    payload: buf[..n].to_vec(),
                };
                if to_host.lock().await.write_all(&frame.encode()).await.is_err() {
                    return;
                }
            }
        });
        tokio::spawn(async move {
            while let Some(Some(bytes)) = connection.incoming.recv().await {
                if to_mine.write_all(&bytes).await.is_err() {
                    return;
                }
            }
            let _ = to_mine.shutdown().await;
        });
        theirs
    }
}

impl Connection {
    /// Reads until `done(bytes so far, closed)` holds.
    async fn read_until(&mut self, done: impl Fn(&[u8], bool) -> bool) -> Vec<u8> {
        let wait = async {
            while !done(&self.received, self.closed) {
                match self.incoming.recv().await {
                    Some(Some(bytes)) => self.received.extend_from_slice(&bytes),
                    Some(None) | None => self.closed = true,
                }
            }
            self.received.clone()
        };
        // Generous: a loaded machine; the test is about what arrives, not when.
        tokio::time::timeout(Duration::from_secs(120), wait)
            .await
            .expect("the proxy answered")
    }

    /// Everything received until the proxy closes the connection.
    async fn reply(&mut self) -> String {
        String::from_utf8_lossy(&self.read_until(|_, closed| closed).await).to_string()
    }

    /// What was received once it holds `count` HTTP responses (or the connection closed).
    async fn responses(&mut self, count: usize) -> String {
        let bytes = self
            .read_until(|b, closed| closed || String::from_utf8_lossy(b).matches("HTTP/1.1 ").count() >= count)
            .await;
        String::from_utf8_lossy(&bytes).to_string()
    }
}

fn rule(text: &str) -> Rule {
    toml::from_str(text).unwrap()
}

/// A policy with `rules` (the inspected hosts), `allow` passed through, and a log of attempts.
fn policy(rules: &[Rule], allow: &[&str]) -> (Policy, Arc<Mutex<Vec<Attempt>>>) {
    let log: Arc<Mutex<Vec<Attempt>>> = Default::default();
    let sink = log.clone();
    let policy = Policy {
        allow: allow.iter().map(|a| a.to_string()).collect(),
        log: Some(Arc::new(move |a: &Attempt| sink.lock().unwrap().push(a.clone()))),
        rules: Arc::new(RuleSet::resolve("test rules", rules).unwrap()),
    };
    (policy, log)
}

/// A GET-only rule for the upstream's /simple/, and a POST rule for /upload.
fn get_only(port: u16) -> Vec<Rule> {
    vec![
        rule(&format!(
            "host = \"host.farm.internal\"\nport = {port}\nmethods = [\"GET\", \"HEAD\"]\npaths = [\"/simple/\"]"
        )),
        rule(&format!(
            "host = \"host.farm.internal\"\nport = {port}\nmethods = [\"POST\"]\npaths = [\"/upload\"]"
        )),
    ]
}

/// A request the rules deny, to be smuggled.
const SMUGGLED: &str = "POST /admin/delete HTTP/1.1\r\nHost: host.farm.internal\r\nContent-Length: 0\r\n\r\n";

#[tokio::test]
async fn a_body_on_a_method_without_one_never_reaches_a_naive_upstream() {
    let (port, executed) = naive_upstream().await;
    let (policy, log) = policy(&get_only(port), &[]);
    let guest = Guest::start(policy);
    let url = format!("http://host.farm.internal:{port}");
    let smuggles = [
        format!("GET {url}/simple/x HTTP/1.1\r\nHost: h\r\nContent-Length: {}\r\n\r\n{SMUGGLED}", SMUGGLED.len()),
        format!(
            "GET {url}/simple/x HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{SMUGGLED}\r\n0\r\n\r\n",
            SMUGGLED.len()
        ),
        format!("HEAD {url}/simple/x HTTP/1.1\r\nHost: h\r\nContent-Length: {}\r\n\r\n{SMUGGLED}", SMUGGLED.len()),
        format!(
            "GET {url}/simple/x HTTP/1.1\r\nHost: h\r\nContent-Length: {}\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n{SMUGGLED}",
            SMUGGLED.len() + 5
        ),
        format!(
            "POST {url}/upload HTTP/1.1\r\nHost: h\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n{SMUGGLED}"
        ),
        format!("GET {url}/simple/x HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\nabc"),
        format!("GET {url}/simple/x HTTP/1.1\r\nHost: h\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n"),
    ];
    for (i, request) in smuggles.iter().enumerate() {
        let conn = 10 + i as u32;
        let reply = guest.send(conn, request.as_bytes()).await.responses(1).await;
        assert!(reply.starts_with("HTTP/1.1 400"), "{request:?}: {reply}");
    }
    // Pipelined on one connection: an allowed GET, then a denied POST; each is checked.
    let pipelined = format!(
        "GET {url}/simple/a HTTP/1.1\r\nHost: h\r\n\r\nPOST {url}/admin/delete HTTP/1.1\r\nHost: h\r\nContent-Length: 0\r\n\r\n"
    );
    let replies = guest.send(30, pipelined.as_bytes()).await.responses(2).await;
    assert!(
        replies.starts_with("HTTP/1.1 200") && replies.contains("HTTP/1.1 403"),
        "{replies}"
    );
    // An allowed POST whose body holds another request: the upstream is told the
    // connection closes after this one request, so it never reads the rest as a request.
    let post = format!(
        "POST {url}/upload HTTP/1.1\r\nHost: h\r\nContent-Length: {}\r\n\r\n{SMUGGLED}",
        SMUGGLED.len()
    );
    assert!(guest
        .send(31, post.as_bytes())
        .await
        .responses(1)
        .await
        .starts_with("HTTP/1.1 200"));
    tokio::time::sleep(Duration::from_millis(200)).await; // (the upstream would have read on)
    let executed = executed.lock().unwrap().clone();
    assert_eq!(
        executed,
        ["GET /simple/a HTTP/1.1", "POST /upload HTTP/1.1"],
        "the upstream executed only checked requests"
    );
    let log = log.lock().unwrap();
    assert!(
        log.iter()
            .filter(|a| matches!(a.verdict, Verdict::Refused { .. }))
            .count()
            >= smuggles.len(),
        "{log:?}"
    );
    assert!(
        log.iter()
            .any(|a| a.target.contains("/admin/delete") && matches!(a.verdict, Verdict::Denied { .. })),
        "{log:?}"
    );
}

#[tokio::test]
async fn a_rule_may_allow_bodies_on_any_method() {
    let (port, executed) = naive_upstream().await;
    let rules = [rule(&format!(
        "host = \"host.farm.internal\"\nport = {port}\nmethods = [\"GET\"]\npaths = [\"/search\"]\nallow_bodies = true"
    ))];
    let (policy, _) = policy(&rules, &[]);
    let guest = Guest::start(policy);
    let request =
        format!("GET http://host.farm.internal:{port}/search HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\n\r\n{{}}");
    assert!(guest
        .send(1, request.as_bytes())
        .await
        .responses(1)
        .await
        .starts_with("HTTP/1.1 200"));
    assert_eq!(executed.lock().unwrap().clone(), ["GET /search HTTP/1.1"]);
}

#[tokio::test]
async fn other_names_for_an_inspected_host_are_not_passed_through() {
    let (port, executed) = naive_upstream().await;
    let (policy, log) = policy(&get_only(port), &["*"]);
    let guest = Guest::start(policy);
    let heads = [
        format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n"),
        format!("CONNECT localhost:{port} HTTP/1.1\r\n\r\n"),
        format!("GET http://127.1:{port}/admin HTTP/1.1\r\nHost: x\r\n\r\n"),
        format!("GET http://[::ffff:127.0.0.1]:{port}/admin HTTP/1.1\r\nHost: x\r\n\r\n"),
        format!("GET http://0.0.0.0:{port}/admin HTTP/1.1\r\nHost: x\r\n\r\n"),
        format!("GET http://0x7f.0.0.1:{port}/admin HTTP/1.1\r\nHost: x\r\n\r\n"),
    ];
    for (i, head) in heads.iter().enumerate() {
        let conn = i as u32 + 1;
        let reply = guest.send(conn, head.as_bytes()).await.reply().await;
        assert!(
            reply.starts_with("HTTP/1.1 403") && reply.contains("host.farm.internal"),
            "{head:?}: {reply}"
        );
    }
    assert!(executed.lock().unwrap().is_empty(), "{:?}", executed.lock().unwrap());
    // The name the rules use still works, inspected.
    let ok = format!("GET http://host.farm.internal:{port}/simple/ok HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(guest
        .send(20, ok.as_bytes())
        .await
        .responses(1)
        .await
        .starts_with("HTTP/1.1 200"));
    assert_eq!(executed.lock().unwrap().clone(), ["GET /simple/ok HTTP/1.1"]);
    assert!(log
        .lock()
        .unwrap()
        .iter()
        .any(|a| a.to_string().contains("is an address of host.farm.internal")));
}

#[tokio::test]
async fn an_allowed_host_that_fails_on_the_hosts_side_answers_502_not_403() {
    let closed = || {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let (closed, inspected_closed) = (closed(), closed());
    let (port, _) = naive_upstream().await;
    let mut rules = get_only(port);
    rules.push(rule(&format!(
        "host = \"host.farm.internal\"\nport = {inspected_closed}\nmethods = [\"GET\"]"
    )));
    // Loopback is reached only where the policy names the address and port (never by "*").
    let named = [format!("127.0.0.2:{closed}"), format!("host.farm.internal:{closed}")];
    let (policy, log) = policy(&rules, &["*", &named[0], &named[1]]);
    let guest = Guest::start(policy);
    let cases = [
        (
            format!("CONNECT 127.0.0.2:{closed} HTTP/1.1\r\n\r\n"),
            UpstreamFailure::Connect,
        ),
        (
            "CONNECT no-such-host.invalid:443 HTTP/1.1\r\n\r\n".to_string(),
            UpstreamFailure::Dns,
        ),
        (
            format!("GET http://host.farm.internal:{closed}/simple/x HTTP/1.1\r\nHost: x\r\n\r\n"),
            UpstreamFailure::Connect,
        ),
        (
            format!("GET http://host.farm.internal:{inspected_closed}/x HTTP/1.1\r\nHost: x\r\n\r\n"),
            UpstreamFailure::Connect,
        ),
    ];
    for (i, (head, failure)) in cases.iter().enumerate() {
        let conn = i as u32 + 1;
        let reply = guest.send(conn, head.as_bytes()).await.responses(1).await;
        assert!(reply.starts_with("HTTP/1.1 502 Bad Gateway"), "{head:?}: {reply}");
        assert!(
            log.lock()
                .unwrap()
                .iter()
                .any(|a| matches!(&a.verdict, Verdict::UpstreamFailed { failure: f, .. } if f == failure)),
            "{head:?}: {:?}",
            log.lock().unwrap()
        );
    }
}

/// Reads from `stream` up to the end of a response head.
async fn read_head<S: AsyncRead + Unpin>(stream: &mut S) -> String {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(stream.read(&mut byte).await.unwrap(), 1, "closed after {head:?}");
        head.push(byte[0]);
    }
    String::from_utf8_lossy(&head).to_string()
}

#[tokio::test]
async fn inside_intercepted_https_the_same_checks_hold() {
    use rustls::pki_types::{pem::PemObject, CertificateDer, ServerName};
    // An HTTPS upstream for localhost, as careless as the others, with a private CA that the
    // proxy is told to trust (the only test here that makes upstream TLS).
    let upstream_ca = crate::ca::Ca::generate("upstream").unwrap();
    let dir = std::env::temp_dir().join(format!("farm-egress-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("ca.pem"), upstream_ca.pem()).unwrap();
    std::env::set_var("FARM_EGRESS_EXTRA_CA", dir.join("ca.pem"));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let executed: Executed = Default::default();
    let (record, server) = (executed.clone(), upstream_ca.server_config("localhost").unwrap());
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (record, server) = (record.clone(), server.clone());
            tokio::spawn(async move {
                if let Ok(tls) = tokio_rustls::TlsAcceptor::from(server).accept(stream).await {
                    naive_exchange(tls, record).await;
                }
            });
        }
    });
    let rules = [rule(&format!(
        "host = \"localhost\"\nport = {port}\nmethods = [\"GET\", \"POST\"]\npaths = [\"/simple/\"]"
    ))];
    let (policy, _) = policy(&rules, &[]);
    // The guest trusts farm's egress CA, as guests with rules do.
    let mut roots = rustls::RootCertStore::empty();
    let ca = policy.rules.ca().unwrap().pem().to_string();
    roots
        .add(CertificateDer::from_pem_slice(ca.as_bytes()).unwrap())
        .unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let client = Arc::new(
        rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth(),
    );
    let guest = Guest::start(policy);
    let exchange = |conn: u32, request: String| {
        let (guest, client) = (&guest, client.clone());
        async move {
            let mut stream = guest.stream(conn).await;
            stream
                .write_all(format!("CONNECT localhost:{port} HTTP/1.1\r\n\r\n").as_bytes())
                .await
                .unwrap();
            assert!(read_head(&mut stream).await.starts_with("HTTP/1.1 200"));
            let name = ServerName::try_from("localhost").unwrap();
            let mut tls = tokio_rustls::TlsConnector::from(client)
                .connect(name, stream)
                .await
                .unwrap();
            tls.write_all(request.as_bytes()).await.unwrap();
            read_head(&mut tls).await
        }
    };
    let smuggle = format!(
        "GET /simple/x HTTP/1.1\r\nHost: localhost\r\nContent-Length: {}\r\n\r\n{SMUGGLED}",
        SMUGGLED.len()
    );
    let both = format!(
        "POST /simple/x HTTP/1.1\r\nHost: localhost\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n{SMUGGLED}"
    );
    for (conn, request) in [(1, smuggle), (2, both)] {
        let reply = exchange(conn, request.clone()).await;
        assert!(reply.starts_with("HTTP/1.1 400"), "{request:?}: {reply}");
    }
    let reply = exchange(3, "GET /simple/ok HTTP/1.1\r\nHost: localhost\r\n\r\n".into()).await;
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    assert_eq!(executed.lock().unwrap().clone(), ["GET /simple/ok HTTP/1.1"]);
    let _ = std::fs::remove_dir_all(&dir);
}
