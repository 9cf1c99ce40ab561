//! An answer given before its request's body was read closes the connection, and says so.
//!
//! A refusal (a bad token, a quota, an id out of bounds) is answered without reading the
//! request's body. hyper then cannot tell where the next request on the connection starts
//! unless the body is already in its buffer, and closes the connection after the answer, but
//! the answer's head may already have gone out as keep-alive. A client that sends its next
//! request on that connection at once (httpx, requests, every pooled client) sees "server
//! disconnected without a response" for a request that never reached us. So every answer to
//! a request whose body was not read to its end carries `Connection: close`: the client opens
//! a new connection instead of racing the close.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::{header, HeaderValue};
use axum::middleware::Next;
use axum::response::Response;
use http_body::{Frame, SizeHint};

/// The outermost layer of `farm serve`'s routes.
pub(super) async fn close_unread(request: Request, next: Next) -> Response {
    use http_body::Body as _;
    if request.body().is_end_stream() {
        return next.run(request).await;
    }
    let read = Arc::new(AtomicBool::new(false));
    let flag = read.clone();
    let request = request.map(move |inner| Body::new(Tracked { inner, read: flag }));
    let mut response = next.run(request).await;
    // A switch of protocols (101) and an answer that already says what becomes of the
    // connection are left as they are.
    let decided = response.status() == axum::http::StatusCode::SWITCHING_PROTOCOLS
        || response.headers().contains_key(header::CONNECTION);
    if !decided && !read.load(Ordering::Acquire) {
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

/// A request body that says when it was read to its end.
struct Tracked {
    inner: Body,
    read: Arc<AtomicBool>,
}

impl http_body::Body for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(polled, Poll::Ready(None)) || self.inner.is_end_stream() {
            self.read.store(true, Ordering::Release);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::routing::post;
    use axum::Router;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Sends `request` on `stream` and reads its answer's head and body (`Content-Length`
    /// bodies only), as raw text.
    async fn ask(stream: &mut tokio::net::TcpStream, request: &[u8]) -> String {
        stream.write_all(request).await.unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 1024];
        loop {
            let n = stream.read(&mut buf).await.unwrap();
            assert!(n > 0, "the connection closed before an answer: {got:?}");
            got.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&got).to_string();
            if let Some(end) = text.find("\r\n\r\n") {
                let length = text[..end]
                    .lines()
                    .find_map(|l| {
                        l.to_ascii_lowercase()
                            .strip_prefix("content-length:")
                            .map(|v| v.trim().to_string())
                    })
                    .map_or(0, |v| v.parse::<usize>().unwrap());
                if got.len() >= end + 4 + length {
                    return text;
                }
            }
        }
    }

    fn closes(answer: &str) -> bool {
        answer.to_ascii_lowercase().contains("connection: close")
    }

    #[tokio::test]
    async fn an_answer_before_the_body_is_read_closes_the_connection_and_one_after_keeps_it() {
        let app = Router::new()
            .route(
                "/refuse",
                post(|| async { (axum::http::StatusCode::UNAUTHORIZED, "no") }),
            )
            .route(
                "/read",
                post(|body: Bytes| async move { format!("{} bytes", body.len()) }),
            )
            .route(
                "/decided",
                post(|| async { ([(header::CONNECTION, "keep-alive")], "decided") }),
            )
            .layer(axum::middleware::from_fn(close_unread));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });

        // A refusal answered while the body has not been sent yet: the answer says close.
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let refused = ask(
            &mut stream,
            b"POST /refuse HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n",
        )
        .await;
        assert!(refused.starts_with("HTTP/1.1 401"), "{refused}");
        assert!(closes(&refused), "{refused}");

        // A body read to its end: keep-alive, and the next request on the connection answers.
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        for _ in 0..2 {
            let read = ask(
                &mut stream,
                b"POST /read HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc",
            )
            .await;
            assert!(read.starts_with("HTTP/1.1 200") && read.ends_with("3 bytes"), "{read}");
            assert!(!closes(&read), "{read}");
        }
        // A chunked body read to its end: keep-alive too.
        let chunked = ask(
            &mut stream,
            b"POST /read HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n0\r\n\r\n",
        )
        .await;
        assert!(chunked.ends_with("2 bytes"), "{chunked}");
        assert!(!closes(&chunked), "{chunked}");
        // No body at all: nothing to close for.
        let empty = ask(
            &mut stream,
            b"POST /refuse HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
        )
        .await;
        assert!(!closes(&empty), "{empty}");

        // An answer that decides the connection itself keeps its own word.
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let own = ask(
            &mut stream,
            b"POST /decided HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\n",
        )
        .await
        .to_ascii_lowercase();
        assert!(
            own.contains("connection: keep-alive") && !own.contains("connection: close"),
            "{own}"
        );
    }
}
