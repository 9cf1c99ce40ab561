//! A folder's entries and a path's facts, read without running a command (`stat`, `ls`).
//! Nothing is followed: an entry that is a symbolic link is reported as one, with its target.

use serde::{Deserialize, Serialize};

/// The most entries one listing returns.
pub const MAX_FOLDER_ENTRIES: u32 = 10_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EntryKind {
    File,
    Dir,
    Symlink,
    Other,
}

/// One path's facts (as `lstat` gives them).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Entry {
    /// Its name in its folder (for `stat`: the path asked for).
    pub name: String,
    pub kind: EntryKind,
    pub size: u64,
    /// Permission bits (`0o7777`).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub modified_unix_ms: i64,
    /// A symbolic link's target.
    #[serde(default)]
    pub target: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum FolderRequest {
    /// One path's facts.
    Stat { path: String },
    /// A folder's entries, sorted by name, at most `max_entries`.
    List { path: String, max_entries: u32 },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum FolderResponse {
    Stat(Entry),
    /// Body: the entries as a JSON array of [`Entry`].
    List {
        count: u32,
        truncated: bool,
    },
}
