//! A guard on the bytes a guest sends on an inspected connection, before the proxy's HTTP
//! server (hyper) reads them. It follows the request framing (heads, `Content-Length`
//! bodies, chunked bodies) and, at a head that carries both `Content-Length` and
//! `Transfer-Encoding`, stops: hyper is given, in that request's place, a request of farm's
//! own that the proxy answers 400, and then the end of the stream. (hyper itself would drop
//! the `Content-Length`, read the body as chunked and close the connection after it, so
//! nothing would be smuggled either way; the guard makes the request a refusal the guest
//! and the log can see.)

use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The header of farm's own stand-in request for one refused here; never forwarded.
pub(crate) const REFUSED_HEADER: &str = "x-farm-refused-framing";

/// Bytes of a request head the guard reads at most (hyper refuses longer ones itself).
const MAX_HEAD: usize = 64 << 10;

enum State {
    /// Reading a request head.
    Head(Vec<u8>),
    /// Inside a body of known length: bytes left.
    Body(u64),
    /// Inside a chunked body.
    Chunked(Chunk),
    /// Past something the guard does not follow (hyper answers it): bytes pass as they are.
    Through,
    /// Past a refused head: nothing more is read, and nothing more is given to hyper (it
    /// answers the stand-in, which asks to close, and then closes).
    Closed,
    /// The guest's end of the stream.
    Ended,
}

enum Chunk {
    /// The chunk-size line, so far.
    Size(Vec<u8>),
    /// Data bytes left in the chunk, then its CRLF.
    Data(u64),
    Crlf(u8),
    /// A trailer line, so far (the empty one ends the body).
    Trailer(Vec<u8>),
}

pub(crate) struct FramingGuard<S> {
    inner: S,
    state: State,
    /// Bytes for hyper, not yet read.
    ready: Vec<u8>,
}

impl<S> FramingGuard<S> {
    pub(crate) fn new(inner: S) -> FramingGuard<S> {
        FramingGuard {
            inner,
            state: State::Head(Vec::new()),
            ready: Vec::new(),
        }
    }

    /// Follows `bytes` through the framing, appending what hyper may read to `ready`.
    fn feed(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            match &mut self.state {
                State::Closed | State::Ended => return,
                State::Through => {
                    self.ready.extend_from_slice(bytes);
                    return;
                }
                State::Head(head) => {
                    head.extend_from_slice(bytes);
                    let (next, rest) = match judge_head(head) {
                        HeadVerdict::Partial if head.len() > MAX_HEAD => (State::Through, std::mem::take(head)),
                        HeadVerdict::Partial => return,
                        HeadVerdict::Malformed => (State::Through, std::mem::take(head)),
                        HeadVerdict::Refused(reason) => {
                            self.ready.extend_from_slice(stand_in(reason).as_bytes());
                            self.state = State::Closed;
                            return;
                        }
                        HeadVerdict::Complete { len, next } => {
                            let head = std::mem::take(head);
                            self.ready.extend_from_slice(&head[..len]);
                            (next, head[len..].to_vec())
                        }
                    };
                    self.state = next;
                    // The bytes after the head go through the next state.
                    self.feed(&rest);
                    return;
                }
                State::Body(left) => {
                    let take = (*left).min(bytes.len() as u64) as usize;
                    self.ready.extend_from_slice(&bytes[..take]);
                    *left -= take as u64;
                    bytes = &bytes[take..];
                    if *left == 0 {
                        self.state = State::Head(Vec::new());
                    }
                }
                State::Chunked(Chunk::Data(left)) => {
                    // Chunk data in bulk; its CRLF, like the rest of the framing, a byte at a time.
                    let take = (*left).min(bytes.len() as u64) as usize;
                    self.ready.extend_from_slice(&bytes[..take]);
                    *left -= take as u64;
                    bytes = &bytes[take..];
                    if *left == 0 {
                        self.state = State::Chunked(Chunk::Crlf(2));
                    }
                }
                State::Chunked(chunk) => {
                    let byte = bytes[0];
                    self.ready.push(byte);
                    bytes = &bytes[1..];
                    if let Some(next) = follow_chunk_framing(chunk, byte) {
                        self.state = next;
                    }
                }
            }
        }
    }
}

/// Follows one byte of a chunked body's framing (a chunk-size line, a chunk's CRLF, a trailer
/// line): the state it leads to, or `None` to stay in this one.
fn follow_chunk_framing(chunk: &mut Chunk, byte: u8) -> Option<State> {
    match chunk {
        Chunk::Size(line) => {
            line.push(byte);
            if byte != b'\n' {
                (line.len() > 1024).then_some(State::Through)
            } else {
                let text = String::from_utf8_lossy(line);
                let size = text.trim_end().split(';').next().unwrap_or("").trim();
                match u64::from_str_radix(size, 16) {
                    Ok(0) => Some(State::Chunked(Chunk::Trailer(Vec::new()))),
                    Ok(n) => Some(State::Chunked(Chunk::Data(n))),
                    Err(_) => Some(State::Through),
                }
            }
        }
        Chunk::Data(_) => unreachable!("chunk data is taken in bulk by feed"),
        Chunk::Crlf(left) => {
            *left -= 1;
            (*left == 0).then_some(State::Chunked(Chunk::Size(Vec::new())))
        }
        Chunk::Trailer(line) => {
            line.push(byte);
            if byte != b'\n' {
                (line.len() > 8192).then_some(State::Through)
            } else if line.as_slice() == b"\r\n" || line.as_slice() == b"\n" {
                Some(State::Head(Vec::new()))
            } else {
                Some(State::Chunked(Chunk::Trailer(Vec::new())))
            }
        }
    }
}

enum HeadVerdict {
    Partial,
    Malformed,
    Refused(&'static str),
    /// A head of `len` bytes, and what its body is.
    Complete {
        len: usize,
        next: State,
    },
}

fn judge_head(buf: &[u8]) -> HeadVerdict {
    let mut headers = [httparse::EMPTY_HEADER; 128];
    let mut request = httparse::Request::new(&mut headers);
    let len = match request.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return HeadVerdict::Partial,
        Err(_) => return HeadVerdict::Malformed,
    };
    let named = |name: &'static str| -> Vec<&[u8]> {
        request
            .headers
            .iter()
            .filter(|h| h.name.eq_ignore_ascii_case(name))
            .map(|h| h.value)
            .collect()
    };
    let lengths = named("content-length");
    let encodings = named("transfer-encoding");
    if !lengths.is_empty() && !encodings.is_empty() {
        return HeadVerdict::Refused("content-length-and-transfer-encoding");
    }
    let next = if let Some(encoding) = encodings.last() {
        if encoding.trim_ascii().eq_ignore_ascii_case(b"chunked") && encodings.len() == 1 {
            State::Chunked(Chunk::Size(Vec::new()))
        } else {
            State::Through // hyper refuses it
        }
    } else if let Some(length) = lengths.first() {
        match std::str::from_utf8(length)
            .ok()
            .and_then(|l| l.trim().parse::<u64>().ok())
        {
            Some(0) => State::Head(Vec::new()),
            Some(n) if lengths.iter().all(|l| l == length) => State::Body(n),
            _ => State::Through, // hyper refuses it
        }
    } else {
        State::Head(Vec::new())
    };
    HeadVerdict::Complete { len, next }
}

/// farm's own request standing for a refused one: the proxy answers it 400 with the reason.
fn stand_in(reason: &str) -> String {
    format!("GET / HTTP/1.1\r\nHost: farm.invalid\r\n{REFUSED_HEADER}: {reason}\r\nConnection: close\r\n\r\n")
}

impl<S: AsyncRead + Unpin> AsyncRead for FramingGuard<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        loop {
            if !self.ready.is_empty() {
                let n = self.ready.len().min(buf.remaining());
                buf.put_slice(&self.ready[..n]);
                self.ready.drain(..n);
                return Poll::Ready(Ok(()));
            }
            match self.state {
                // Not the end of the stream: hyper would drop the stand-in's answer.
                State::Closed => return Poll::Pending,
                State::Ended => return Poll::Ready(Ok(())),
                _ => {}
            }
            let mut bytes = [0u8; 16 << 10];
            let mut read = ReadBuf::new(&mut bytes);
            match Pin::new(&mut self.inner).poll_read(cx, &mut read) {
                Poll::Ready(Ok(())) if read.filled().is_empty() => {
                    // The guest's end: whatever was held back (a partial head) goes too.
                    if let State::Head(head) = &mut self.state {
                        let rest = std::mem::take(head);
                        self.ready.extend_from_slice(&rest);
                    }
                    self.state = State::Ended;
                    if self.ready.is_empty() {
                        return Poll::Ready(Ok(()));
                    }
                }
                Poll::Ready(Ok(())) => {
                    let filled = read.filled().to_vec();
                    self.feed(&filled);
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for FramingGuard<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn through(chunks: &[&[u8]]) -> Vec<u8> {
        let mut guard = FramingGuard::new(());
        for chunk in chunks {
            guard.feed(chunk);
        }
        guard.ready
    }

    #[test]
    fn requests_pass_whole_and_an_ambiguous_one_is_replaced_by_a_refusal() {
        let get = b"GET /a HTTP/1.1\r\nHost: h\r\n\r\n".as_slice();
        let post = b"POST /b HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello".as_slice();
        let chunked =
            b"POST /c HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5;x=1\r\nhello\r\n0\r\nT: 1\r\n\r\n".as_slice();
        let all = [get, post, chunked].concat();
        assert_eq!(through(&[&all]), all, "sound requests pass as they are");
        // A byte at a time, as frames may split them.
        let bytes: Vec<&[u8]> = all.chunks(1).collect();
        assert_eq!(through(&bytes), all);
        // Both framings on one head: that request and everything after it never reach hyper.
        let smuggle = b"POST /d HTTP/1.1\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /admin HTTP/1.1\r\n\r\n";
        let out = through(&[get, smuggle]);
        let text = String::from_utf8_lossy(&out);
        assert!(text.starts_with("GET /a HTTP/1.1"), "{text}");
        assert!(
            text.contains(REFUSED_HEADER) && !text.contains("/admin") && !text.contains("/d "),
            "{text}"
        );
        // A body that looks like a head is a body.
        let inner = "GET /x HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n";
        let body_like = format!("POST /e HTTP/1.1\r\nContent-Length: {}\r\n\r\n{inner}", inner.len());
        assert_eq!(through(&[body_like.as_bytes()]), body_like.as_bytes());
    }
}
