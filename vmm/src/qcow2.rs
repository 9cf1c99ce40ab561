//! Reading the backing chain of a qcow2 image from its headers.
//!
//! A jailed QEMU cannot open files by their paths (they live under root's cache), so every
//! layer of a disk is passed to it as a descriptor and named `/proc/self/fd/N`, with the
//! backing files given explicitly on the command line. This module finds those layers the
//! way QEMU would: the backing file name and format stored in each qcow2 header.
//!
//! ```text
//! qcow2 header (big endian)        offset  size
//!   magic "QFI\xfb"                0       4
//!   version (2 or 3)               4       4
//!   backing_file_offset            8       8   (0: no backing file)
//!   backing_file_size              16      4
//!   ...
//!   header_length (version 3)      100     4   (version 2: 72)
//! header extensions follow the header: type u32, length u32, data padded to 8 bytes;
//!   type 0xE2792ACA = backing file format name, type 0 = end
//! ```

use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

const MAGIC: [u8; 4] = *b"QFI\xfb";
const EXT_END: u32 = 0;
const EXT_BACKING_FORMAT: u32 = 0xE279_2ACA;
/// Deepest chain accepted (forks of forks of forks...).
pub const MAX_CHAIN: usize = 16;

/// One layer of a disk: a file and its format (`qcow2` or `raw`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layer {
    pub path: PathBuf,
    pub format: String,
}

#[derive(Debug, thiserror::Error)]
pub enum ChainError {
    #[error("reading {path} failed")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not a qcow2 image ({detail})")]
    NotQcow2 { path: PathBuf, detail: String },
    #[error("the backing chain of {path} is deeper than {MAX_CHAIN} layers")]
    TooDeep { path: PathBuf },
}

/// The backing file of a qcow2 image, if it has one: (path, format). A relative name is
/// relative to the image's folder, as QEMU resolves it.
pub fn backing_of(image: &Path) -> Result<Option<Layer>, ChainError> {
    let io = |source| ChainError::Io {
        path: image.to_path_buf(),
        source,
    };
    let bad = |detail: &str| ChainError::NotQcow2 {
        path: image.to_path_buf(),
        detail: detail.to_string(),
    };
    let mut file = std::fs::File::open(image).map_err(io)?;
    let mut header = [0u8; 104];
    let read = file.read(&mut header).map_err(io)?;
    if read < 72 || header[0..4] != MAGIC {
        return Err(bad("no qcow2 magic"));
    }
    let be32 = |at: usize| u32::from_be_bytes(header[at..at + 4].try_into().expect("4 bytes"));
    let be64 = |at: usize| u64::from_be_bytes(header[at..at + 8].try_into().expect("8 bytes"));
    let version = be32(4);
    let offset = be64(8);
    let size = be32(16) as usize;
    if offset == 0 {
        return Ok(None);
    }
    if size == 0 || size > 1023 {
        return Err(bad("backing file name of a bad length"));
    }
    let header_length = match version {
        2 => 72,
        3 if read >= 104 => be32(100) as u64,
        _ => return Err(bad("unknown version")),
    };
    let mut name = vec![0u8; size];
    file.seek(SeekFrom::Start(offset)).map_err(io)?;
    file.read_exact(&mut name).map_err(io)?;
    let name = String::from_utf8(name).map_err(|_| bad("backing file name is not UTF-8"))?;
    // Header extensions, looking for the backing format.
    let mut format = None;
    let mut at = header_length;
    for _ in 0..64 {
        if at + 8 > offset {
            break;
        }
        let mut ext = [0u8; 8];
        file.seek(SeekFrom::Start(at)).map_err(io)?;
        if file.read_exact(&mut ext).is_err() {
            break;
        }
        let kind = u32::from_be_bytes(ext[0..4].try_into().expect("4 bytes"));
        let length = u32::from_be_bytes(ext[4..8].try_into().expect("4 bytes")) as u64;
        if kind == EXT_END || length > 4096 {
            break;
        }
        if kind == EXT_BACKING_FORMAT {
            let mut data = vec![0u8; length as usize];
            file.read_exact(&mut data).map_err(io)?;
            format = String::from_utf8(data).ok();
            break;
        }
        at += 8 + length.div_ceil(8) * 8;
    }
    let path = Path::new(&name);
    let path = if path.is_absolute() {
        path.to_path_buf()
    } else {
        image.parent().unwrap_or(Path::new(".")).join(path)
    };
    let format = format.ok_or_else(|| bad("the backing format is not recorded (create overlays with -F)"))?;
    Ok(Some(Layer { path, format }))
}

/// Every layer under a qcow2 image, nearest first (the image itself not included).
pub fn backing_chain(image: &Path) -> Result<Vec<Layer>, ChainError> {
    let mut chain = Vec::new();
    let mut current = Layer {
        path: image.to_path_buf(),
        format: "qcow2".into(),
    };
    while current.format == "qcow2" {
        let Some(next) = backing_of(&current.path)? else { break };
        if chain.len() >= MAX_CHAIN {
            return Err(ChainError::TooDeep {
                path: image.to_path_buf(),
            });
        }
        chain.push(next.clone());
        current = next;
    }
    Ok(chain)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    fn qemu_img(args: &[&str]) {
        let out = Command::new("qemu-img")
            .args(args)
            .output()
            .expect("qemu-img (package qemu-utils)");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }

    /// A qcow2 overlay at `path` over `backing` (as its header names it) of `format`.
    fn overlay(path: &Path, backing: &str, format: &str) {
        qemu_img(&[
            "create",
            "-q",
            "-f",
            "qcow2",
            "-F",
            format,
            "-b",
            backing,
            path.to_str().unwrap(),
        ]);
    }

    #[test]
    fn chains_of_overlays_are_read_from_their_headers() {
        let dir = tempfile::tempdir().unwrap();
        let raw = dir.path().join("base.raw");
        std::fs::write(&raw, vec![0u8; 1 << 20]).unwrap();
        let mid = dir.path().join("mid.qcow2");
        let top = dir.path().join("top.qcow2");
        overlay(&mid, raw.to_str().unwrap(), "raw");
        overlay(&top, "mid.qcow2", "qcow2");
        let chain = backing_chain(&top).unwrap();
        assert_eq!(
            chain,
            vec![
                Layer {
                    path: dir.path().join("mid.qcow2"),
                    format: "qcow2".into()
                },
                Layer {
                    path: raw.clone(),
                    format: "raw".into()
                }
            ]
        );
        assert!(backing_chain(&raw)
            .unwrap_err()
            .to_string()
            .contains("not a qcow2 image"));
        let plain = dir.path().join("plain.qcow2");
        qemu_img(&["create", "-q", "-f", "qcow2", plain.to_str().unwrap(), "1M"]);
        assert!(backing_chain(&plain).unwrap().is_empty());
    }
}
