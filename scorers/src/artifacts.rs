//! Reading a rollout's artifacts out of its VM, as untrusted data.

use std::collections::BTreeMap;

use farm_protocol::FileEntry;
use serde::Serialize;

/// Bounds on what is read out of a rollout VM.
#[derive(Debug, Clone, Copy)]
pub struct ArtifactLimits {
    pub max_files: u32,
    pub max_file_bytes: u64,
    pub max_total_bytes: u64,
    /// Folders the files may need, in all: placing them must not exhaust the scoring VM's
    /// inodes (which would otherwise look like the farm's failure).
    pub max_dirs: usize,
    /// Components of one path.
    pub max_depth: usize,
}

impl ArtifactLimits {
    /// Disk a scoring VM needs beyond the task's own limit to take the artifacts: every byte
    /// twice (each file is written under a temporary name, then renamed), and the file
    /// system's own blocks for them.
    pub fn scoring_room(&self) -> u64 {
        2 * self.max_total_bytes + (16 << 20)
    }
}

impl Default for ArtifactLimits {
    fn default() -> Self {
        ArtifactLimits {
            max_files: 2000,
            max_file_bytes: 8 << 20,
            max_total_bytes: 32 << 20,
            max_dirs: 2000,
            max_depth: 32,
        }
    }
}

/// Files the agent changed or created under the workspace, files it deleted, its answer.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Artifacts {
    #[serde(skip)]
    pub files: Vec<(String, Vec<u8>, u32)>,
    pub changed: Vec<String>,
    pub deleted: Vec<String>,
    /// Files left out because of the limits, with the reason.
    pub skipped: Vec<String>,
    pub answer: Option<String>,
}

/// A path the guest reported, accepted only if it stays inside the workspace.
pub fn safe_relative(path: &str) -> bool {
    let p = std::path::Path::new(path);
    !path.is_empty()
        && !p.is_absolute()
        && p.components().all(|c| matches!(c, std::path::Component::Normal(_)))
        && !path.contains('\0')
}

/// Why a workspace could not be told apart from its baseline.
#[derive(Debug, thiserror::Error)]
pub enum ListingError {
    #[error("listing the workspace")]
    Agent(#[from] vmm::AgentError),
    /// More files than a listing holds: what changed, and what was deleted, cannot be told.
    #[error("the workspace holds more than {max} files, the most farm lists; what changed and what was deleted cannot be told")]
    TooManyFiles { max: u32 },
}

/// Lists the whole workspace (every regular file, up to [`farm_protocol::MAX_LISTING`]).
/// The baseline taken when a rollout starts, and the listing its artifacts are told apart
/// with, are complete: a deletion is never hidden behind a cut listing.
pub async fn list_workspace(agent: &vmm::AgentClient) -> Result<Vec<FileEntry>, ListingError> {
    let max = farm_protocol::MAX_LISTING;
    match agent.list_files(datasets::WORKSPACE, max).await? {
        (_, true) => Err(ListingError::TooManyFiles { max }),
        (entries, false) => Ok(entries),
    }
}

/// The changed files worth reading (in path order), and the reasons others are skipped:
/// unsafe paths, files over the size limit, paths too deep, and files whose folders would
/// pass the folder limit.
pub fn select(baseline: &[FileEntry], now: &[FileEntry], limits: &ArtifactLimits) -> (Vec<String>, Vec<String>) {
    let before: BTreeMap<&str, &FileEntry> = baseline.iter().map(|e| (e.path.as_str(), e)).collect();
    let after: BTreeMap<&str, &FileEntry> = now.iter().map(|e| (e.path.as_str(), e)).collect();
    let (mut wanted, mut skipped) = (Vec::new(), Vec::new());
    let mut dirs: std::collections::BTreeSet<&str> = std::collections::BTreeSet::new();
    for (path, entry) in &after {
        let unchanged = before
            .get(path)
            .is_some_and(|b| b.size == entry.size && b.mtime_ns == entry.mtime_ns && b.mode == entry.mode);
        if unchanged {
            continue;
        }
        if !safe_relative(path) {
            skipped.push(format!("{path:?}: unsafe path"));
            continue;
        }
        if entry.size > limits.max_file_bytes {
            skipped.push(format!("{path}: {} bytes, over the artifact limits", entry.size));
            continue;
        }
        let parents: Vec<&str> = path.match_indices('/').map(|(i, _)| &path[..i]).collect();
        if parents.len() + 1 > limits.max_depth {
            skipped.push(format!("{path}: deeper than {} folders", limits.max_depth));
            continue;
        }
        let new_dirs = parents.iter().filter(|d| !dirs.contains(*d)).count();
        if dirs.len() + new_dirs > limits.max_dirs {
            skipped.push(format!(
                "{path}: its folders would pass the limit of {} folders",
                limits.max_dirs
            ));
            continue;
        }
        dirs.extend(parents);
        wanted.push(path.to_string());
    }
    (wanted, skipped)
}

/// Compares the workspace with `baseline` and reads what changed: at most
/// `limits.max_files` changed files (the rest are listed as skipped), and every deletion.
pub async fn collect_artifacts(
    agent: &vmm::AgentClient,
    baseline: &[FileEntry],
    limits: &ArtifactLimits,
) -> Result<Artifacts, ListingError> {
    let now = list_workspace(agent).await?;
    let before: BTreeMap<&str, &FileEntry> = baseline.iter().map(|e| (e.path.as_str(), e)).collect();
    let after: BTreeMap<&str, &FileEntry> = now.iter().map(|e| (e.path.as_str(), e)).collect();
    let mut artifacts = Artifacts::default();
    let (mut wanted, skipped) = select(baseline, &now, limits);
    if wanted.len() > limits.max_files as usize {
        let over = wanted.split_off(limits.max_files as usize);
        artifacts.skipped.push(format!(
            "{} changed files past the first {} were not read (the artifact limits)",
            over.len(),
            limits.max_files
        ));
    }
    artifacts.skipped.extend(skipped);
    let mut total = 0u64;
    for path in &wanted {
        let entry = after[path.as_str()];
        if total + entry.size > limits.max_total_bytes {
            artifacts
                .skipped
                .push(format!("{path}: {} bytes, over the artifact limits", entry.size));
            continue;
        }
        // Read confined to the workspace: a file the agent swapped for a link since the
        // listing is refused (and skipped), never followed.
        let contents = match agent
            .read_file_beneath(path, limits.max_file_bytes, Some(datasets::WORKSPACE))
            .await
        {
            Ok((contents, _)) => contents,
            Err(vmm::AgentError::Refused { message, .. }) => {
                artifacts.skipped.push(format!("{path}: not read ({message})"));
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        total += contents.len() as u64;
        artifacts.changed.push(path.to_string());
        artifacts.files.push((path.to_string(), contents, entry.mode & 0o777));
    }
    for path in before.keys() {
        if !after.contains_key(path) && safe_relative(path) {
            artifacts.deleted.push(path.to_string());
        }
    }
    Ok(artifacts)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(path: &str) -> FileEntry {
        FileEntry {
            path: path.into(),
            size: 1,
            mtime_ns: 1,
            mode: 0o644,
        }
    }

    /// The limits on folders, checked without a VM: [`select`] is what `collect_artifacts`
    /// applies to a listing.
    #[test]
    fn deep_or_numerous_folders_are_skipped() {
        let limits = ArtifactLimits {
            max_dirs: 3,
            max_depth: 3,
            ..ArtifactLimits::default()
        };
        let now = vec![entry("a/b/c/d"), entry("a/b/x"), entry("p/q/r"), entry("z")];
        let (kept, skipped) = select(&[], &now, &limits);
        assert_eq!(kept, ["a/b/x", "z"], "{skipped:?}");
        assert!(skipped.iter().any(|s| s.starts_with("a/b/c/d: deeper")), "{skipped:?}");
        assert!(
            skipped.iter().any(|s| s.starts_with("p/q/r: its folders")),
            "{skipped:?}"
        );
    }

    #[test]
    fn only_plain_relative_paths_are_accepted() {
        assert!(safe_relative("a/b.py"));
        for bad in ["", "/etc/passwd", "../x", "a/../../x", "./a", "a\0b"] {
            assert!(!safe_relative(bad), "{bad:?}");
        }
    }
}
