//! The snapshot state file: QEMU's state-only migration stream behind a header that makes
//! corruption and format drift detectable before QEMU ever reads it.
//!
//! ```text
//! offset 0   8 bytes   magic "FARMSTAT"
//! offset 8   4 bytes   format version (u32, little endian)
//! offset 12  8 bytes   payload length (u64, little endian)
//! offset 20  32 bytes  SHA-256 of the payload
//! offset 52  12 bytes  zero padding
//! offset 64  ...       payload: QEMU migration stream (device and CPU state, no RAM)
//! ```

use std::io::{Read, Write};
use std::path::Path;

use sha2::{Digest, Sha256};

pub const MAGIC: [u8; 8] = *b"FARMSTAT";
pub const FORMAT_VERSION: u32 = 1;
pub const HEADER_BYTES: u64 = 64;

#[derive(Debug, thiserror::Error)]
pub enum StateFileError {
    #[error("reading or writing state file {path} failed")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("state file {path} is not a farm state file (bad magic)")]
    BadMagic { path: String },
    #[error(
        "state file {path} has format version {found}; this farm reads version {FORMAT_VERSION}: rebuild the snapshot"
    )]
    Version { path: String, found: u32 },
    #[error("state file {path} is corrupt: {detail}")]
    Corrupt { path: String, detail: String },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> StateFileError + '_ {
    move |source| StateFileError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// Wraps the raw migration stream at `raw` into a state file at `out` (fsynced).
pub fn write(raw: &Path, out: &Path) -> Result<(), StateFileError> {
    let payload = std::fs::read(raw).map_err(io(raw))?;
    let mut header = Vec::with_capacity(HEADER_BYTES as usize);
    header.extend_from_slice(&MAGIC);
    header.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    header.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    header.extend_from_slice(&Sha256::digest(&payload));
    header.resize(HEADER_BYTES as usize, 0);
    let mut file = std::fs::File::create(out).map_err(io(out))?;
    file.write_all(&header).map_err(io(out))?;
    file.write_all(&payload).map_err(io(out))?;
    file.sync_all().map_err(io(out))?;
    Ok(())
}

/// Checks magic, version, length and checksum. Returns the payload length.
pub fn verify(path: &Path) -> Result<u64, StateFileError> {
    let mut file = std::fs::File::open(path).map_err(io(path))?;
    let mut header = [0u8; HEADER_BYTES as usize];
    let p = || path.display().to_string();
    file.read_exact(&mut header).map_err(|_| StateFileError::Corrupt {
        path: p(),
        detail: "shorter than its header".into(),
    })?;
    if header[0..8] != MAGIC {
        return Err(StateFileError::BadMagic { path: p() });
    }
    let version = u32::from_le_bytes(header[8..12].try_into().expect("4 bytes"));
    if version != FORMAT_VERSION {
        return Err(StateFileError::Version {
            path: p(),
            found: version,
        });
    }
    let len = u64::from_le_bytes(header[12..20].try_into().expect("8 bytes"));
    let mut payload = Vec::new();
    file.read_to_end(&mut payload).map_err(io(path))?;
    if payload.len() as u64 != len {
        return Err(StateFileError::Corrupt {
            path: p(),
            detail: format!("payload is {} bytes, header says {len}", payload.len()),
        });
    }
    if Sha256::digest(&payload)[..] != header[20..52] {
        return Err(StateFileError::Corrupt {
            path: p(),
            detail: "checksum mismatch".into(),
        });
    }
    Ok(len)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wrapped(payload: &[u8]) -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let raw = dir.path().join("raw");
        std::fs::write(&raw, payload).unwrap();
        let out = dir.path().join("state.bin");
        write(&raw, &out).unwrap();
        (dir, out)
    }

    #[test]
    fn round_trip_keeps_the_payload_after_the_header() {
        let payload: Vec<u8> = (0..100_000u32).map(|i| i as u8).collect();
        let (_dir, out) = wrapped(&payload);
        assert_eq!(verify(&out).unwrap(), payload.len() as u64);
        let bytes = std::fs::read(&out).unwrap();
        assert_eq!(&bytes[HEADER_BYTES as usize..], &payload[..]);
    }

    #[test]
    fn a_flipped_byte_is_detected() {
        let (_dir, out) = wrapped(b"qemu state stream");
        let mut bytes = std::fs::read(&out).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        std::fs::write(&out, &bytes).unwrap();
        assert!(matches!(verify(&out), Err(StateFileError::Corrupt { .. })));
    }

    #[test]
    fn truncation_and_foreign_files_are_refused() {
        let (_dir, out) = wrapped(b"qemu state stream");
        let bytes = std::fs::read(&out).unwrap();
        std::fs::write(&out, &bytes[..bytes.len() - 3]).unwrap();
        assert!(matches!(verify(&out), Err(StateFileError::Corrupt { .. })));
        std::fs::write(&out, [b'x'; 100]).unwrap();
        assert!(matches!(verify(&out), Err(StateFileError::BadMagic { .. })));
        std::fs::write(&out, b"short").unwrap();
        assert!(matches!(verify(&out), Err(StateFileError::Corrupt { .. })));
    }

    #[test]
    fn another_format_version_is_named() {
        let (_dir, out) = wrapped(b"x");
        let mut bytes = std::fs::read(&out).unwrap();
        bytes[8..12].copy_from_slice(&7u32.to_le_bytes());
        std::fs::write(&out, &bytes).unwrap();
        let err = verify(&out).unwrap_err().to_string();
        assert!(err.contains("version 7") && err.contains("rebuild"), "{err}");
    }
}
