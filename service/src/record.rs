//! The restart record of a live fork, a session or a sandbox alike: one versioned JSON file,
//! written and read only here. It holds what a restart needs to put the fork back in the book,
//! paused: its id, its last checkpoint (a pause is one) and what only its kind knows.
//!
//! ```text
//! out/paused/<session id>.<ms>/session.json    a paused session's record, in its pause's folder
//! out/sandboxes/saved/<sandbox id>.json         a sandbox's record, beside its checkpoints
//! ```
//!
//! Version 2 (this one) is the same file for both kinds. Older records still load: a
//! sandbox's version 1 (its fields at the top level) and a session's file of before versions
//! (no `format_version`, a `session_id`). Any other version is refused, naming the file and
//! the version: its taker sets a sandbox's record aside as `.bad`, and records a session's
//! rollout lost, saying why.

use std::path::{Path, PathBuf};

use engine::config::RolloutsSection;
use engine::row::Step;
use serde::{Deserialize, Serialize};

use crate::requests::SandboxRequest;

/// The version this farm writes.
pub const VERSION: u32 = 2;

/// A live fork's restart record.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ForkRecord {
    pub format_version: u32,
    pub id: String,
    /// The folder of its last checkpoint (beside the record), and when it was made; None: it
    /// has none, and a restart forks a sandbox's environment again.
    pub checkpoint: Option<String>,
    pub checkpoint_ms: Option<u64>,
    /// What only its kind knows.
    pub of: Of,
}

/// The part of a record its kind owns.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Of {
    Session(SessionPart),
    Sandbox(SandboxPart),
}

/// A session's: its task and the progress of its rollout.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionPart {
    pub suite: String,
    pub task_id: String,
    /// The inline task it was opened with, if any.
    pub task_row: Option<serde_json::Value>,
    pub seed: u64,
    pub rollout_id: String,
    pub group_id: String,
    pub policy_version: Option<u64>,
    pub metadata: Option<String>,
    pub limits: RolloutsSection,
    pub steps: Vec<Step>,
    pub spent_ms: u64,
}

/// A sandbox's: what it was made with, its timers, lineage and open ports.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SandboxPart {
    /// The request it (or the sandbox it was branched from) was created with.
    pub request: SandboxRequest,
    pub idle_secs: u64,
    pub lifetime_secs: u64,
    pub created_ms: u64,
    pub parent: Option<String>,
    pub ports: Vec<SavedPort>,
    /// Whether it was paused (its checkpoint is then all of it, exactly).
    #[serde(default)]
    pub paused: bool,
    /// When its timeout paused it (`on_timeout = "pause"`), Unix ms.
    #[serde(default)]
    pub auto_paused_ms: Option<u64>,
    /// When its current lifetime began (None: at its creation).
    #[serde(default)]
    pub life_from_ms: Option<u64>,
    /// Why its last resume's checks failed.
    #[serde(default)]
    pub resume_failed: Option<String>,
    /// The workspaces mounted in it (its writable holds stay its own across a restart).
    #[serde(default)]
    pub mounts: Vec<crate::workspaces::Mounted>,
}

/// An open port as a record keeps it: a restart opens it again with the same token.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SavedPort {
    pub port: u16,
    pub token: String,
}

/// Why a record could not be read.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("reading {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{} is not a fork's restart record", path.display())]
    Parse {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("{}: format version {found} (this farm reads {VERSION}, and 1 for a sandbox's)", path.display())]
    Version { path: PathBuf, found: serde_json::Value },
    #[error("{}: the record of {found}, where a {wanted}'s was expected", path.display())]
    Kind {
        path: PathBuf,
        found: &'static str,
        wanted: &'static str,
    },
}

impl ForkRecord {
    pub fn new(id: &str, checkpoint: Option<String>, checkpoint_ms: Option<u64>, of: Of) -> ForkRecord {
        ForkRecord {
            format_version: VERSION,
            id: id.to_string(),
            checkpoint,
            checkpoint_ms,
            of,
        }
    }

    /// Reads a record of this version or an older one.
    pub fn read(path: &Path) -> Result<ForkRecord, RecordError> {
        let bytes = std::fs::read(path).map_err(|source| RecordError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let parse = |source| RecordError::Parse {
            path: path.to_path_buf(),
            source,
        };
        let value: serde_json::Value = serde_json::from_slice(&bytes).map_err(parse)?;
        let version = value.get("format_version").cloned();
        match version.as_ref().and_then(|v| v.as_u64()) {
            Some(v) if v == u64::from(VERSION) => serde_json::from_value(value).map_err(parse),
            Some(1) => upgrade_sandbox_v1(value).map_err(parse),
            None if version.is_none() && value.get("session_id").is_some() => {
                upgrade_session_v0(value, path).map_err(parse)
            }
            _ => Err(RecordError::Version {
                path: path.to_path_buf(),
                found: version.unwrap_or(serde_json::Value::Null),
            }),
        }
    }

    /// Writes the record to `path` atomically: a temporary file, synced, then renamed, so a
    /// crash leaves the previous record in force.
    pub fn write(&self, path: &Path) -> std::io::Result<()> {
        let tmp = path.with_extension("json.tmp");
        std::fs::write(&tmp, serde_json::to_vec_pretty(self).expect("a record serializes"))?;
        std::fs::File::open(&tmp)?.sync_all()?;
        std::fs::rename(&tmp, path)
    }

    /// Its session's part, or a clear error if it is a sandbox's.
    pub fn into_session(self, path: &Path) -> Result<(ForkRecord, SessionPart), RecordError> {
        match self.of.clone() {
            Of::Session(part) => Ok((self, part)),
            Of::Sandbox(_) => Err(self.kind_error(path, "session")),
        }
    }

    /// Its sandbox's part, or a clear error if it is a session's.
    pub fn into_sandbox(self, path: &Path) -> Result<(ForkRecord, SandboxPart), RecordError> {
        match self.of.clone() {
            Of::Sandbox(part) => Ok((self, part)),
            Of::Session(_) => Err(self.kind_error(path, "sandbox")),
        }
    }

    fn kind_error(&self, path: &Path, wanted: &'static str) -> RecordError {
        RecordError::Kind {
            path: path.to_path_buf(),
            found: match self.of {
                Of::Session(_) => "a session",
                Of::Sandbox(_) => "a sandbox",
            },
            wanted,
        }
    }
}

/// A sandbox's version 1: the same fields, its own at the top level.
fn upgrade_sandbox_v1(mut value: serde_json::Value) -> serde_json::Result<ForkRecord> {
    let mut take = |key: &str| value.as_object_mut().and_then(|o| o.remove(key));
    let id = take("id");
    let checkpoint = take("checkpoint");
    let checkpoint_ms = take("checkpoint_ms");
    take("format_version");
    Ok(ForkRecord {
        format_version: VERSION,
        id: serde_json::from_value(id.unwrap_or_default())?,
        checkpoint: serde_json::from_value(checkpoint.unwrap_or_default())?,
        checkpoint_ms: serde_json::from_value(checkpoint_ms.unwrap_or_default())?,
        of: Of::Sandbox(serde_json::from_value(value)?),
    })
}

/// A session's file of before versions: its fields and its id, in its pause's folder.
fn upgrade_session_v0(mut value: serde_json::Value, path: &Path) -> serde_json::Result<ForkRecord> {
    let id = value.as_object_mut().and_then(|o| o.remove("session_id"));
    let folder = path
        .parent()
        .and_then(|d| d.file_name())
        .map(|n| n.to_string_lossy().into_owned());
    Ok(ForkRecord::new(
        &serde_json::from_value::<String>(id.unwrap_or_default())?,
        folder,
        None,
        Of::Session(serde_json::from_value(value)?),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, value: serde_json::Value) -> PathBuf {
        let path = dir.join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, serde_json::to_vec(&value).unwrap()).unwrap();
        path
    }

    fn request() -> serde_json::Value {
        serde_json::json!({"environment": "py"})
    }

    #[test]
    fn a_record_reads_back_as_written() {
        let dir = tempfile::tempdir().unwrap();
        let part: SandboxPart = serde_json::from_value(serde_json::json!({
            "request": request(), "idle_secs": 60, "lifetime_secs": 3600, "created_ms": 5,
            "parent": "sb-1", "ports": [{"port": 8080, "token": "t"}]
        }))
        .unwrap();
        let record = ForkRecord::new("sb-2", Some("sb-2.9".into()), Some(9), Of::Sandbox(part));
        let path = dir.path().join("sb-2.json");
        record.write(&path).unwrap();
        let json = |r: &ForkRecord| serde_json::to_value(r).unwrap();
        assert_eq!(json(&ForkRecord::read(&path).unwrap()), json(&record));
        assert!(!path.with_extension("json.tmp").exists());
    }

    #[test]
    fn a_sandbox_record_of_version_1_still_loads() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(
            dir.path(),
            "sb-1.json",
            serde_json::json!({
                "format_version": 1, "id": "sb-1", "request": request(), "idle_secs": 60,
                "lifetime_secs": 3600, "created_ms": 5, "parent": null,
                "ports": [{"port": 3000, "token": "abc"}], "checkpoint": "sb-1.7", "checkpoint_ms": 7
            }),
        );
        let record = ForkRecord::read(&path).unwrap();
        assert_eq!(record.format_version, VERSION);
        assert_eq!(record.id, "sb-1");
        assert_eq!(record.checkpoint.as_deref(), Some("sb-1.7"));
        let (_, part) = record.into_sandbox(&path).unwrap();
        assert_eq!(
            part.ports,
            vec![SavedPort {
                port: 3000,
                token: "abc".into()
            }]
        );
        assert_eq!(part.lifetime_secs, 3600);
    }

    #[test]
    fn a_session_file_of_before_versions_still_loads() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(
            dir.path(),
            "s-1.42/session.json",
            serde_json::json!({
                "session_id": "s-1", "suite": "demo", "task_id": "t1", "task_row": null,
                "seed": 3, "rollout_id": "r", "group_id": "g", "policy_version": null,
                "metadata": null, "limits": serde_json::to_value(RolloutsSection::default()).unwrap(),
                "steps": [], "spent_ms": 10
            }),
        );
        let record = ForkRecord::read(&path).unwrap();
        assert_eq!(record.id, "s-1");
        assert_eq!(record.checkpoint.as_deref(), Some("s-1.42"));
        let (_, part) = record.into_session(&path).unwrap();
        assert_eq!((part.suite.as_str(), part.seed, part.spent_ms), ("demo", 3, 10));
    }

    #[test]
    fn another_version_or_kind_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(
            dir.path(),
            "x.json",
            serde_json::json!({"format_version": 7, "id": "x"}),
        );
        let e = ForkRecord::read(&path).unwrap_err().to_string();
        assert!(e.contains("x.json") && e.contains("format version 7"), "{e}");
        let path = write(dir.path(), "y.json", serde_json::json!({"id": "y"}));
        let e = ForkRecord::read(&path).unwrap_err().to_string();
        assert!(e.contains("y.json") && e.contains("format version null"), "{e}");
        let record = ForkRecord::new(
            "z",
            None,
            None,
            Of::Sandbox(
                serde_json::from_value(serde_json::json!({
                    "request": request(), "idle_secs": 1, "lifetime_secs": 1, "created_ms": 1,
                    "parent": null, "ports": []
                }))
                .unwrap(),
            ),
        );
        let e = record.into_session(Path::new("z.json")).unwrap_err().to_string();
        assert!(e.contains("a sandbox") && e.contains("session"), "{e}");
    }
}
