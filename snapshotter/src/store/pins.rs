//! Pins: snapshots something outside the store still needs (a paused session's folder, the
//! holder), kept by `gc` while their holder exists.

use std::collections::BTreeSet;
use std::path::Path;

use super::{io_err, SnapshotError, SnapshotStore};
use crate::template::hex;

impl SnapshotStore {
    /// Keeps `id` (and its ancestors) through `gc` while `holder` exists.
    pub fn pin(&self, id: &str, holder: &Path) -> Result<(), SnapshotError> {
        let dir = self.root.join(".pins");
        std::fs::create_dir_all(&dir).map_err(io_err(format!("creating {}", dir.display())))?;
        let holder = holder.to_string_lossy().to_string();
        let path = dir.join(format!("{}.json", &pin_digest(holder.as_bytes())[..24]));
        let tmp = path.with_extension("json.tmp");
        std::fs::write(
            &tmp,
            serde_json::json!({ "snapshot": id, "holder": holder }).to_string(),
        )
        .map_err(io_err(format!("writing {}", tmp.display())))?;
        std::fs::rename(&tmp, &path).map_err(io_err(format!("writing {}", path.display())))
    }

    /// Drops the pin of `holder`, if any.
    pub fn unpin(&self, holder: &Path) {
        let holder = holder.to_string_lossy().to_string();
        let _ = std::fs::remove_file(
            self.root
                .join(".pins")
                .join(format!("{}.json", &pin_digest(holder.as_bytes())[..24])),
        );
    }

    /// The snapshots pinned by holders that still exist; pins of holders that are gone are
    /// removed (unless `dry_run`).
    pub fn pinned(&self, dry_run: bool) -> BTreeSet<String> {
        let mut out = BTreeSet::new();
        let Ok(entries) = std::fs::read_dir(self.root.join(".pins")) else {
            return out;
        };
        for entry in entries.flatten() {
            let pin: Option<serde_json::Value> = std::fs::read_to_string(entry.path())
                .ok()
                .and_then(|t| serde_json::from_str(&t).ok());
            let (snapshot, holder) = match &pin {
                Some(p) => (p["snapshot"].as_str().unwrap_or(""), p["holder"].as_str().unwrap_or("")),
                None => ("", ""),
            };
            if !snapshot.is_empty() && !holder.is_empty() && Path::new(holder).exists() {
                out.insert(snapshot.to_string());
            } else if !dry_run {
                let _ = std::fs::remove_file(entry.path());
            }
        }
        out
    }
}

/// SHA-256 of a holder's path, as hex: pins are named by it.
fn pin_digest(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex(&sha2::Sha256::digest(bytes))
}
