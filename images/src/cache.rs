//! The artifact cache that `scripts/setup.sh` fills: where it is, what one artifact is, and
//! which images it builds. Both the artifact lookup (`artifacts`) and image conversion
//! (`image`) build on this, so neither needs the other's internals.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// The images the set-up script builds.
pub const IMAGES: [&str; 3] = ["minimal", "python", "code-interpreter"];

/// The cache directory: `FARM_CACHE_DIR`, or `~/.cache/farm`.
pub fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("FARM_CACHE_DIR") {
        return PathBuf::from(dir);
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/root"));
    home.join(".cache").join("farm")
}

/// One built artifact: its file and the key (input hash) from its manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Artifact {
    pub path: PathBuf,
    pub key: String,
}
