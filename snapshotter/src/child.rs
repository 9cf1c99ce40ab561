//! Child snapshots of a template, content-addressed: fork the template, write files, run
//! setup commands, snapshot the result. The same template, files and commands reuse the
//! same snapshot (`farm run` makes one per task with setup or large files).

use std::time::Duration;

use sha2::{Digest, Sha256};
use vmm::ExecOptions;

use crate::build::BuildError;
use crate::fork::{ForkError, Forker};
use crate::store::{Snapshot, SnapshotStore};

/// What goes into a child snapshot.
pub struct ChildSpec<'a> {
    /// The snapshot's label in the store (for example the task's id).
    pub label: &'a str,
    /// What addresses the content besides the template: the caller's serialization of the
    /// files and commands (equal bytes, equal snapshot).
    pub content: &'a [u8],
    /// Files as (path inside `workdir`, contents, mode).
    pub files: &'a [(String, Vec<u8>, u32)],
    /// Shell commands run in `workdir`, in order.
    pub setup: &'a [String],
    pub workdir: &'a str,
    /// Limit of one setup command.
    pub setup_timeout: Duration,
}

/// Why a child snapshot could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ChildError {
    #[error(transparent)]
    Fork(#[from] ForkError),
    #[error(transparent)]
    Agent(#[from] vmm::AgentError),
    #[error("setup command {command:?} exited with {status}: {stderr}")]
    Setup {
        command: String,
        status: String,
        stderr: String,
    },
    #[error(transparent)]
    Snapshot(#[from] BuildError),
}

/// The content address of a child of `template`.
pub fn child_id(template: &Snapshot, content: &[u8]) -> String {
    child_key(template.id(), content)
}

fn child_key(template_id: &str, content: &[u8]) -> String {
    let mut h = Sha256::new();
    h.update(template_id.as_bytes());
    h.update([0]);
    h.update(content);
    format!(
        "k-{}",
        h.finalize()
            .iter()
            .take(10)
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    )
}

/// The child snapshot `spec` describes: the stored one when it is whole, else made anew.
pub async fn child_snapshot(
    store: &SnapshotStore,
    forker: &Forker,
    template: &Snapshot,
    spec: &ChildSpec<'_>,
) -> Result<Snapshot, ChildError> {
    let id = child_id(template, spec.content);
    if let Ok(existing) = store.get(&id) {
        if existing.check_files().is_ok() {
            return Ok(existing);
        }
    }
    // Setup may install a lot: the rollouts' disk limit does not apply to it.
    let fork = forker.build_fork(store, template, spec.label).await?;
    let workdir = spec.workdir.trim_end_matches('/');
    for (path, contents, mode) in spec.files {
        fork.agent()
            .write_file(&format!("{workdir}/{path}"), contents.clone(), *mode)
            .await?;
    }
    for command in spec.setup {
        let options = ExecOptions {
            cwd: Some(spec.workdir.into()),
            timeout: Some(spec.setup_timeout),
            ..ExecOptions::shell(command.clone())
        };
        let out = fork.agent().exec(options).await?;
        if out.result.exit_code != Some(0) {
            return Err(ChildError::Setup {
                command: command.clone(),
                status: out.shell_exit_code().to_string(),
                stderr: String::from_utf8_lossy(&out.stderr).chars().take(2000).collect(),
            });
        }
    }
    Ok(fork.commit(store, forker, template, spec.label, &id).await?)
}

#[cfg(test)]
mod key_tests {
    use super::*;

    #[test]
    fn child_ids_follow_the_template_and_the_content() {
        let id = child_key("t-1", b"files and setup");
        assert!(id.starts_with("k-") && id.len() == 22, "{id}");
        assert_eq!(id, child_key("t-1", b"files and setup"));
        assert_ne!(id, child_key("t-2", b"files and setup"), "another template");
        assert_ne!(id, child_key("t-1", b"files and setup!"), "other content");
        assert_ne!(
            child_key("t-1", b"2x"),
            child_key("t-12", b"x"),
            "the template id and the content do not run together"
        );
    }
}
