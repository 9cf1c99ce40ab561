//! The two-way relay between a guest connection (frames on the VM's network port) and a byte
//! stream on the host: an upstream socket for a host that is passed through, or the proxy's
//! own end of an in-memory pipe for an inspected one.

use farm_protocol::net::{Frame, Kind, MAX_PAYLOAD};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

/// A relayed connection: where the guest's bytes go, and the tasks that move them (both
/// ways), which [`Relayed::cut`] stops at once.
pub(crate) struct Relayed {
    pub(crate) to_up: mpsc::Sender<Vec<u8>>,
    tasks: Vec<tokio::task::AbortHandle>,
}

impl Relayed {
    /// A relay whose other end is served by `task` too (an inspection), stopped with it.
    pub(crate) fn with(mut self, task: tokio::task::AbortHandle) -> Relayed {
        self.tasks.push(task);
        self
    }

    /// Stops the relay both ways now: nothing more goes up or comes down.
    pub(crate) fn cut(&self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// Relays guest connection `conn` and `stream`: `first`, then every payload sent on the
/// returned channel, is written to `stream` (which is shut down for writing when the channel
/// closes); what `stream` yields goes to the guest, and its end closes the guest's connection.
pub(crate) fn relay<S>(conn: u32, first: Vec<u8>, stream: S, to_guest: mpsc::Sender<Frame>) -> Relayed
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let (mut from_stream, mut to_stream) = tokio::io::split(stream);
    let (to_up, mut from_guest) = mpsc::channel::<Vec<u8>>(64);
    let up = tokio::spawn(async move {
        if !first.is_empty() && to_stream.write_all(&first).await.is_err() {
            return;
        }
        while let Some(bytes) = from_guest.recv().await {
            if to_stream.write_all(&bytes).await.is_err() {
                return;
            }
        }
        let _ = to_stream.shutdown().await;
    });
    let down = tokio::spawn(async move {
        let mut buf = vec![0u8; MAX_PAYLOAD];
        loop {
            match from_stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let frame = Frame {
                        conn,
                        kind: Kind::Data,
                        payload: buf[..n].to_vec(),
                    };
                    if to_guest.send(frame).await.is_err() {
                        return;
                    }
                }
            }
        }
        let close = Frame {
            conn,
            kind: Kind::Close,
            payload: Vec::new(),
        };
        let _ = to_guest.send(close).await;
    });
    Relayed {
        to_up,
        tasks: vec![up.abort_handle(), down.abort_handle()],
    }
}

/// Joins a guest connection to one end of an in-memory pipe: what the guest sends (after
/// `first`) comes out of the returned end, and what is written there goes to the guest.
pub(crate) fn pipe(conn: u32, first: Vec<u8>, to_guest: mpsc::Sender<Frame>) -> (Relayed, tokio::io::DuplexStream) {
    let (guest_side, proxy_side) = tokio::io::duplex(256 << 10);
    (relay(conn, first, guest_side, to_guest), proxy_side)
}

/// A plain-text answer to the guest, then the end of its connection.
pub(crate) async fn answer(to_guest: &mpsc::Sender<Frame>, conn: u32, status: u16, reason: &str) {
    let body = format!("farm: {reason}\n");
    let text = match status {
        400 => "Bad Request",
        403 => "Forbidden",
        502 => "Bad Gateway",
        504 => "Gateway Timeout",
        _ => "Error",
    };
    let reply = format!(
        "HTTP/1.1 {status} {text}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    for frame in [
        Frame {
            conn,
            kind: Kind::Data,
            payload: reply.into_bytes(),
        },
        Frame {
            conn,
            kind: Kind::Close,
            payload: Vec::new(),
        },
    ] {
        let _ = to_guest.send(frame).await;
    }
}
