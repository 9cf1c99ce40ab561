//! The Connect protocol as E2B's SDK speaks it to envd, JSON only: a unary call is a JSON
//! request and a JSON answer; a stream's request and answer are envelopes (a flags byte, a
//! big-endian length, a JSON message), the answer's last one flagged end-of-stream and
//! holding `{}` or `{"error": {"code", "message"}}`.

use axum::http::StatusCode;
use serde::de::DeserializeOwned;

use service::{ApiError, ErrorKind};

/// The content type of a stream, exactly (the SDK compares it whole).
pub(in crate::serve) const STREAM_TYPE: &str = "application/connect+json";

/// An envelope's flag: the stream's last, with its end.
const END_STREAM: u8 = 0x02;

/// An envelope holding `message`.
pub(in crate::serve) fn frame(message: &serde_json::Value) -> Vec<u8> {
    envelope(0, &serde_json::to_vec(message).expect("JSON serializes"))
}

/// The end of a stream: `{}`, or the error it ended with.
pub(in crate::serve) fn end(error: Option<(&str, &str)>) -> Vec<u8> {
    let body = match error {
        None => serde_json::json!({}),
        Some((code, message)) => serde_json::json!({ "error": { "code": code, "message": message } }),
    };
    envelope(END_STREAM, &serde_json::to_vec(&body).expect("JSON serializes"))
}

fn envelope(flags: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(5 + payload.len());
    out.push(flags);
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// The one message of a stream's request: its envelope, whole, and nothing after it; the
/// message read strictly as every body is.
pub(in crate::serve) fn request<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let invalid = |why: String| ApiError::new(ErrorKind::Invalid, why);
    let (head, rest) = body
        .split_at_checked(5)
        .ok_or_else(|| invalid("a Connect stream's request is one envelope (5 bytes, then JSON)".into()))?;
    if head[0] != 0 {
        return Err(invalid(format!(
            "envelope flags {:#04x}: only an uncompressed message is taken",
            head[0]
        )));
    }
    let length = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
    if rest.len() != length {
        return Err(invalid(format!(
            "the envelope says {length} bytes and {} follow",
            rest.len()
        )));
    }
    crate::serve::strict::body(rest)
}

/// A unary call's JSON request, read strictly as every body is (one value, no key twice).
pub(in crate::serve) fn unary<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    crate::serve::strict::body(body)
}

/// Connect's name for a failure, from farm's kind where known, else from its status.
pub(in crate::serve) fn code(status: StatusCode, kind: Option<ErrorKind>) -> &'static str {
    match kind {
        Some(ErrorKind::GuestTimeout) => return "deadline_exceeded",
        Some(ErrorKind::Gone) => return "unavailable",
        _ => {}
    }
    match status.as_u16() {
        400 | 413 | 422 => "invalid_argument",
        401 => "unauthenticated",
        403 => "permission_denied",
        404 => "not_found",
        409 => "already_exists",
        410 | 502 | 503 => "unavailable",
        429 => "resource_exhausted",
        504 => "deadline_exceeded",
        501 => "unimplemented",
        _ => "internal",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_envelope_round_trips_and_a_bad_one_is_refused() {
        let message = serde_json::json!({ "process": { "cmd": "/bin/bash" } });
        let bytes = frame(&message);
        assert_eq!(bytes[0], 0);
        assert_eq!(
            u32::from_be_bytes(bytes[1..5].try_into().unwrap()) as usize,
            bytes.len() - 5
        );
        let back: serde_json::Value = request(&bytes).unwrap();
        assert_eq!(back, message);
        for bad in [&bytes[..3], &bytes[..bytes.len() - 1]] {
            assert_eq!(request::<serde_json::Value>(bad).unwrap_err().kind, ErrorKind::Invalid);
        }
        let mut compressed = bytes.clone();
        compressed[0] = 1;
        assert!(request::<serde_json::Value>(&compressed).is_err());
        let tail = end(Some(("not_found", "gone")));
        assert_eq!(tail[0], END_STREAM);
        let json: serde_json::Value = serde_json::from_slice(&tail[5..]).unwrap();
        assert_eq!(json["error"]["code"], "not_found");
    }

    #[test]
    fn failures_have_connect_names() {
        assert_eq!(code(StatusCode::NOT_FOUND, Some(ErrorKind::NotFound)), "not_found");
        assert_eq!(code(StatusCode::UNAUTHORIZED, None), "unauthenticated");
        assert_eq!(
            code(StatusCode::GATEWAY_TIMEOUT, Some(ErrorKind::GuestTimeout)),
            "deadline_exceeded"
        );
        assert_eq!(code(StatusCode::TOO_MANY_REQUESTS, None), "resource_exhausted");
    }
}
