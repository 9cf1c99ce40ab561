//! The reader side of the channel: frames from the untrusted guest, refused when oversized
//! or malformed, and routed to the requests waiting for them.

use std::sync::Weak;

use farm_protocol::{check_prefix, decode_header, Envelope, FrameError, Response, PREFIX_BYTES};
use tokio::io::{AsyncRead, AsyncReadExt};

use super::{AgentError, Inner};

/// Reads frames until the stream fails; returns why it stopped.
pub(super) async fn read_loop<R: AsyncRead + Unpin>(mut reader: R, max_frame: u32, inner: &Weak<Inner>) -> String {
    loop {
        let (header, body) = match read_frame(&mut reader, max_frame).await {
            Ok(frame) => frame,
            Err(FrameError::Closed) => return "the guest closed the channel".into(),
            // The VM went away (QEMU exited or was killed): not the guest's protocol error.
            Err(FrameError::Io(e)) => return format!("the channel failed ({e}); did QEMU exit?"),
            Err(FrameError::Truncated) => return "the channel closed in the middle of a frame".into(),
            Err(e) => return format!("the guest broke the protocol: {e}"),
        };
        let envelope: Envelope<Response> = match decode_header(&header) {
            Ok(envelope) => envelope,
            Err(e) => return format!("the guest broke the protocol: {e}"),
        };
        let Some(inner) = inner.upgrade() else {
            return "client dropped".into();
        };
        if envelope.id == 0 {
            // Unsolicited: the agent announcing itself (pong) or reporting a frame it could
            // not parse. Neither answers a request. An announcement means a (re)started agent:
            // requests sent to its predecessor will never be answered.
            if matches!(envelope.msg, Response::Pong(_)) {
                let _ = inner.ready.send(true);
                let mut shared = inner.shared.lock().unwrap_or_else(|p| p.into_inner());
                for (_, waiter) in shared.pending.drain() {
                    let _ = waiter.send(Err(AgentError::AgentRestarted { op: "request" }));
                }
            }
            continue;
        }
        let waiter = {
            let mut shared = inner.shared.lock().unwrap_or_else(|p| p.into_inner());
            let waiter = shared.pending.remove(&envelope.id);
            if waiter.is_none() {
                shared.unsolicited += 1;
            }
            waiter
        };
        if let Some(waiter) = waiter {
            let _ = waiter.send(Ok((envelope.msg, body)));
        }
    }
}

/// Reads one frame, refusing oversized ones before allocating.
pub async fn read_frame<R: AsyncRead + Unpin>(
    reader: &mut R,
    max_frame: u32,
) -> Result<(Vec<u8>, Vec<u8>), FrameError> {
    let mut prefix = [0u8; PREFIX_BYTES];
    let mut filled = 0;
    while filled < PREFIX_BYTES {
        match reader.read(&mut prefix[filled..]).await {
            Ok(0) if filled == 0 => return Err(FrameError::Closed),
            Ok(0) => return Err(FrameError::Truncated),
            Ok(n) => filled += n,
            Err(e) => return Err(FrameError::Io(e)),
        }
    }
    let (header_len, body_len) = check_prefix(prefix, max_frame)?;
    let mut header = vec![0u8; header_len];
    read_exact(reader, &mut header).await?;
    let mut body = vec![0u8; body_len];
    read_exact(reader, &mut body).await?;
    Ok((header, body))
}

async fn read_exact<R: AsyncRead + Unpin>(reader: &mut R, buf: &mut [u8]) -> Result<(), FrameError> {
    match reader.read_exact(buf).await {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Err(FrameError::Truncated),
        Err(e) => Err(FrameError::Io(e)),
    }
}
