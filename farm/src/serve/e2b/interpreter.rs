//! E2B's code interpreter (`e2b-code-interpreter`), in a sandbox: `POST /execute` and
//! `/contexts`, relayed to the interpreter server that listens on the sandbox's own
//! 127.0.0.1:49999 (`farm-interpreter` of the `code-interpreter` image, started by its
//! environment's setup, so its kernel is warm in the snapshot).
//!
//! A request is checked here as any in-sandbox request is (the sandbox's access token, in
//! `X-Access-Token` or `E2B-Traffic-Access-Token`, for the sandbox `E2b-Sandbox-Id` names),
//! its body read strictly and bounded, and only then written to the guest, anew, over the
//! VM's port channel: the guest sees a request farm made, never the client's bytes. The
//! answer is the guest's, relayed as it comes (a run's output lines), up to
//! [`MAX_ANSWER_BYTES`], to the one client that asked: a guest can only ever answer its own
//! owner.

use std::collections::BTreeMap;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::IntoResponse;
use axum::Extension;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::envd::{sandboxes, InSandbox};
use super::{refused, Relayed};
use crate::serve::http::{parse, App, Reply};
use crate::serve::tenancy::Who;
use service::{bounds, ErrorKind};

/// The port E2B's code interpreter listens on in a sandbox.
pub(in crate::serve) const PORT: u16 = 49999;
/// The most a run's code may be.
pub(in crate::serve) const MAX_CODE_BYTES: usize = 1 << 20;
/// The most an answer relayed from the guest may be (a run's output, its images included).
pub(in crate::serve) const MAX_ANSWER_BYTES: usize = 256 << 20;
/// The most an answer's head may be.
const MAX_HEAD: usize = 64 << 10;
/// How long the guest has to begin an answer (making a context starts a kernel).
const HEAD_TIMEOUT: Duration = Duration::from_secs(600);

/// `POST /execute`'s body, as the SDK sends it (all four keys, `null` when unset).
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(in crate::serve) struct Execute {
    code: String,
    context_id: Option<String>,
    language: Option<String>,
    env_vars: Option<BTreeMap<String, String>>,
}

/// `POST /contexts`'s body.
#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(in crate::serve) struct NewContext {
    #[serde(skip_serializing_if = "Option::is_none")]
    language: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cwd: Option<String>,
}

/// `POST /execute`: runs code in a context's kernel; its output streams as lines of JSON.
pub(in crate::serve) async fn execute(
    State(app): State<App>,
    Extension(who): Extension<Who>,
    InSandbox(id): InSandbox,
    body: Bytes,
) -> Reply {
    let run: Execute = parse(&body)?;
    bounds::text("code", &run.code, MAX_CODE_BYTES)?;
    if let Some(context) = &run.context_id {
        context_id(context)?;
    }
    if let Some(language) = &run.language {
        bounds::text("language", language, bounds::NAME_BYTES)?;
    }
    if let Some(vars) = &run.env_vars {
        bounds::variables("env_vars", vars)?;
    }
    relay(&app, &who, &id, "POST", "/execute", Some(&run), "application/x-ndjson").await
}

/// `POST /contexts`: a new context (a kernel of its own), `{id, language, cwd}`.
pub(in crate::serve) async fn create_context(
    State(app): State<App>,
    Extension(who): Extension<Who>,
    InSandbox(id): InSandbox,
    body: Bytes,
) -> Reply {
    let new: NewContext = parse(if body.is_empty() { b"{}" } else { &body })?;
    if let Some(language) = &new.language {
        bounds::text("language", language, bounds::NAME_BYTES)?;
    }
    if let Some(cwd) = &new.cwd {
        bounds::text("cwd", cwd, bounds::PATH_BYTES)?;
    }
    relay(&app, &who, &id, "POST", "/contexts", Some(&new), "application/json").await
}

/// `GET /contexts`: the sandbox's contexts.
pub(in crate::serve) async fn list_contexts(
    State(app): State<App>,
    Extension(who): Extension<Who>,
    InSandbox(id): InSandbox,
) -> Reply {
    relay::<()>(&app, &who, &id, "GET", "/contexts", None, "application/json").await
}

/// `DELETE /contexts/{context}`.
pub(in crate::serve) async fn remove_context(
    State(app): State<App>,
    Extension(who): Extension<Who>,
    InSandbox(id): InSandbox,
    Path(context): Path<String>,
) -> Reply {
    context_id(&context)?;
    let path = format!("/contexts/{context}");
    relay::<()>(&app, &who, &id, "DELETE", &path, None, "application/json").await
}

/// `POST /contexts/{context}/restart`: its kernel anew (its state gone). Its body says nothing
/// and is read (and dropped), so the connection stays open (`serve::unread`).
pub(in crate::serve) async fn restart_context(
    State(app): State<App>,
    Extension(who): Extension<Who>,
    InSandbox(id): InSandbox,
    Path(context): Path<String>,
    _body: axum::body::Bytes,
) -> Reply {
    context_id(&context)?;
    let path = format!("/contexts/{context}/restart");
    relay::<()>(&app, &who, &id, "POST", &path, None, "application/json").await
}

/// A context's id: `default`, or the 32 hex digits the interpreter made.
fn context_id(id: &str) -> Result<(), service::ApiError> {
    let ok = id == "default" || (id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()));
    if ok {
        Ok(())
    } else {
        Err(service::ApiError::field(
            ErrorKind::Invalid,
            "context_id",
            format!("{:?} is not a context's id (`default`, or 32 hex digits)", truncate(id)),
        ))
    }
}

fn truncate(text: &str) -> &str {
    let mut end = text.len().min(64);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// Writes the request to the interpreter in sandbox `id` and relays its answer. The caller
/// holds one of its connections, and the sandbox is in use, while the answer streams.
#[allow(clippy::too_many_arguments)]
async fn relay<T: Serialize>(
    app: &App,
    who: &Who,
    id: &service::sandbox::SandboxId,
    method: &str,
    path: &str,
    body: Option<&T>,
    content_type: &'static str,
) -> Reply {
    let held = app.service.tenancy.hold(who)?;
    let (mut guest, in_use) = sandboxes(app)?.connect_port(id, PORT).await?;
    let body = body
        .map(|b| serde_json::to_vec(b).expect("requests serialize"))
        .unwrap_or_default();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let wrote = async {
        guest.write_all(head.as_bytes()).await?;
        guest.write_all(&body).await?;
        guest.flush().await
    };
    wrote.await.map_err(|e| {
        refused(
            ErrorKind::GuestFailed,
            format!("writing to sandbox {id}'s code interpreter: {e}"),
        )
    })?;
    let (status, rest) = match tokio::time::timeout(HEAD_TIMEOUT, read_head(&mut guest)).await {
        Ok(Ok(Some(found))) => found,
        Ok(Ok(None)) => {
            return Err(refused(
                ErrorKind::GuestFailed,
                format!(
                    "sandbox {id} has no code interpreter: nothing answers on its port {PORT} (create it from the template code-interpreter-v1, or an environment whose setup runs `farm-interpreter start`)"
                ),
            ))
        }
        Ok(Err(e)) => return Err(refused(ErrorKind::GuestFailed, format!("sandbox {id}'s code interpreter: {e}"))),
        Err(_) => {
            return Err(refused(
                ErrorKind::GuestTimeout,
                format!("sandbox {id}'s code interpreter did not answer in {} s", HEAD_TIMEOUT.as_secs()),
            ))
        }
    };
    let keep = (held, in_use);
    let stream = futures::stream::unfold(
        (guest, Some(rest), 0usize, Some(keep)),
        |(mut guest, first, mut sent, keep)| async move {
            keep.as_ref()?;
            if let Some(first) = first.filter(|f| !f.is_empty()) {
                sent += first.len();
                return Some((Ok::<_, std::io::Error>(Bytes::from(first)), (guest, None, sent, keep)));
            }
            let mut buf = vec![0u8; 64 << 10];
            match guest.read(&mut buf).await {
                Ok(0) | Err(_) => None,
                Ok(n) if sent + n > MAX_ANSWER_BYTES => {
                    tracing::warn!("a code interpreter's answer passed {MAX_ANSWER_BYTES} bytes: cut");
                    None
                }
                Ok(n) => {
                    buf.truncate(n);
                    Some((Ok(Bytes::from(buf)), (guest, None, sent + n, keep)))
                }
            }
        },
    );
    let mut response = (status, Body::from_stream(stream)).into_response();
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response.extensions_mut().insert(Relayed);
    Ok(response)
}

/// Reads the guest's answer head: its status and the bytes read past it. `None`: the guest
/// closed without a byte (nothing listens).
async fn read_head(guest: &mut tokio::io::DuplexStream) -> std::io::Result<Option<(StatusCode, Vec<u8>)>> {
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        if let Some(end) = head.windows(4).position(|w| w == b"\r\n\r\n") {
            let mut headers = [httparse::EMPTY_HEADER; 64];
            let mut answer = httparse::Response::new(&mut headers);
            answer
                .parse(&head[..end + 4])
                .map_err(|e| std::io::Error::other(format!("not an HTTP answer: {e}")))?;
            let status = answer
                .code
                .and_then(|c| StatusCode::from_u16(c).ok())
                .filter(|s| s.as_u16() >= 200)
                .ok_or_else(|| std::io::Error::other("an answer with no status"))?;
            return Ok(Some((status, head.split_off(end + 4))));
        }
        if head.len() > MAX_HEAD {
            return Err(std::io::Error::other("an answer head past 64 KiB"));
        }
        let n = guest.read(&mut buf).await?;
        if n == 0 {
            return if head.is_empty() {
                Ok(None)
            } else {
                Err(std::io::Error::other("the answer ended within its head"))
            };
        }
        head.extend_from_slice(&buf[..n]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn context_ids_are_default_or_hex() {
        assert!(context_id("default").is_ok());
        assert!(context_id("0123456789abcdef0123456789abcdef").is_ok());
        for bad in [
            "",
            "../x",
            "default/../../execute",
            "0123456789abcdef0123456789abcdeg",
            "x".repeat(500).as_str(),
        ] {
            assert!(context_id(bad).is_err(), "{bad}");
        }
    }

    #[tokio::test]
    async fn an_answer_head_is_read_and_what_follows_kept() {
        let (mut guest, mut server) = tokio::io::duplex(1024);
        server
            .write_all(b"HTTP/1.0 404 Not Found\r\nContent-Type: application/json\r\n\r\n{\"code\": 404}")
            .await
            .unwrap();
        drop(server);
        let (status, rest) = read_head(&mut guest).await.unwrap().unwrap();
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert_eq!(rest, b"{\"code\": 404}");
        let (mut silent, server) = tokio::io::duplex(16);
        drop(server);
        assert!(read_head(&mut silent).await.unwrap().is_none());
        let (mut garbage, mut server) = tokio::io::duplex(1024);
        server.write_all(b"SSH-2.0-x\r\n\r\n").await.unwrap();
        assert!(read_head(&mut garbage).await.is_err());
    }
}
