//! The network channel: a second virtio-serial port that carries the guest's proxy
//! connections to farm on the host, which allows or refuses each by its allowlist. The guest
//! has no network device; this port is its only way out.

/// The port's name.
pub const PORT_NAME: &str = "org.farm.net.0";
/// Where the agent listens for proxy clients in the guest (`HTTP(S)_PROXY`).
pub const PROXY_ADDR: &str = "127.0.0.1:3128";
/// The proxy's URL, as guests are told it.
pub const PROXY_URL: &str = "http://127.0.0.1:3128";
/// Bytes of payload in one frame at most.
pub const MAX_PAYLOAD: usize = 64 << 10;
/// Frame header: connection id (u32), kind (u8), payload length (u32), big-endian.
pub const HEADER_BYTES: usize = 9;

/// What a frame says about its connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The guest accepted a new proxy client.
    Open = 1,
    /// Bytes, either way.
    Data = 2,
    /// That side closed the connection.
    Close = 3,
    /// The host asks the guest to connect to its own `127.0.0.1:PORT` (the payload: the port,
    /// two bytes big-endian) for a connection of the host's (its id has [`HOST_CONN`] set): a
    /// guest service reached through `farm serve`'s port proxy. The guest answers with Data
    /// frames, or Close when nothing listens.
    Connect = 4,
}

/// Set in the ids of connections the host opens ([`Kind::Connect`]); the guest numbers its
/// own below it.
pub const HOST_CONN: u32 = 1 << 31;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub conn: u32,
    pub kind: Kind,
    pub payload: Vec<u8>,
}

impl Frame {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER_BYTES + self.payload.len());
        out.extend_from_slice(&self.conn.to_be_bytes());
        out.push(self.kind as u8);
        out.extend_from_slice(&(self.payload.len() as u32).to_be_bytes());
        out.extend_from_slice(&self.payload);
        out
    }

    /// A frame from the front of `buf` and the bytes it took; `Ok(None)` when more bytes
    /// are needed; `Err` for a frame no peer of farm's sends.
    pub fn decode(buf: &[u8]) -> Result<Option<(Frame, usize)>, BadFrame> {
        if buf.len() < HEADER_BYTES {
            return Ok(None);
        }
        let conn = u32::from_be_bytes(buf[0..4].try_into().expect("4 bytes"));
        let kind = match buf[4] {
            1 => Kind::Open,
            2 => Kind::Data,
            3 => Kind::Close,
            4 => Kind::Connect,
            other => return Err(BadFrame::Kind(other)),
        };
        let len = u32::from_be_bytes(buf[5..9].try_into().expect("4 bytes")) as usize;
        if len > MAX_PAYLOAD {
            return Err(BadFrame::TooLong(len));
        }
        if buf.len() < HEADER_BYTES + len {
            return Ok(None);
        }
        Ok(Some((
            Frame {
                conn,
                kind,
                payload: buf[HEADER_BYTES..HEADER_BYTES + len].to_vec(),
            },
            HEADER_BYTES + len,
        )))
    }
}

/// A network frame no peer of farm's sends.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadFrame {
    #[error("unknown frame kind {0}")]
    Kind(u8),
    #[error("a frame of {0} bytes (at most {MAX_PAYLOAD})")]
    TooLong(usize),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_bad_ones_are_refused() {
        let f = Frame {
            conn: 7,
            kind: Kind::Data,
            payload: b"GET".to_vec(),
        };
        let mut bytes = f.encode();
        assert_eq!(Frame::decode(&bytes[..5]).unwrap(), None);
        bytes.extend_from_slice(b"rest");
        assert_eq!(Frame::decode(&bytes).unwrap(), Some((f, HEADER_BYTES + 3)));
        assert!(Frame::decode(&[0, 0, 0, 1, 9, 0, 0, 0, 0]).is_err());
        assert!(Frame::decode(&[0, 0, 0, 1, 2, 0xff, 0, 0, 0]).is_err());
    }
}
