//! The function-call harness's zygote: a Python process the template starts before its
//! snapshot, so every scoring fork finds the interpreter started, the harness imported and
//! the candidate's process already forked (under TCG, starting and forking Python anew in a
//! fresh VM is most of a check's cost).
//!
//! The zygote runs as root on a root-only socket ([`SOCKET`], mode 0600 in a 0700 folder).
//! It forks the candidate's process (dropped to the candidate user, idle) before anything
//! secret exists, then runs its VM's one check itself, exactly as the harness would on its
//! own. A check reaches it through `farm-agent --check-with-zygote`, which falls back to
//! starting Python when there is no zygote (an image without Python).

use datasets::{HARNESS_SOURCES, HARNESS_TEST_FILE, TESTS_DIR};
use snapshotter::TemplateExtras;

/// Where the template keeps the harness's files.
pub const HARNESS_FOLDER: &str = "/usr/local/lib/farm";
/// The harness's entry point in the template, what the zygote runs: `HARNESS_ENTRY` in
/// `HARNESS_FOLDER` (a unit test holds the three together).
pub const HARNESS_PATH: &str = "/usr/local/lib/farm/harness.py";
/// The zygote's socket.
pub const SOCKET: &str = "/run/farm/zygote.sock";

/// What the zygote imports before the template's snapshot, besides Python's start and the
/// function-call checker. Part of the template (and so of its snapshot's id).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Preload {
    /// pytest and the unit-test harness too, so that a unit-test check finds them loaded.
    UnitTests,
    /// Nothing for unit tests: importing pytest is seconds of a template's start under TCG,
    /// spent for nothing when no task has unit tests. A unit-test check that comes anyway
    /// (a request's inline task in `farm serve`) imports what it needs in its own fork.
    FunctionCallOnly,
}

impl Preload {
    /// [`Preload::UnitTests`] when any of `tasks` runs unit tests through the harness.
    pub fn for_tasks<'a>(tasks: impl IntoIterator<Item = &'a datasets::Task>) -> Preload {
        let unit_tests = tasks
            .into_iter()
            .any(|t| matches!(t.harness, Some(datasets::Harness::UnitTests { .. })));
        if unit_tests {
            Preload::UnitTests
        } else {
            Preload::FunctionCallOnly
        }
    }
}

/// What `farm run` adds to its templates: the harness and, where the image has Python, the
/// zygote started and answering. The zygote tells it is ready by exiting its first process
/// (no polling loop competing with Python's start-up for the template's one vCPU).
pub fn template_extras(preload: Preload) -> TemplateExtras {
    let lean = match preload {
        Preload::UnitTests => "",
        Preload::FunctionCallOnly => " --function-call-only",
    };
    let start = format!(
        "command -v python3 >/dev/null || exit 0; \
         python3 -I {HARNESS_PATH} --zygote {SOCKET}{lean} </dev/null >/dev/null 2>&1 && [ -S {SOCKET} ] && exit 0; \
         echo 'the harness zygote did not start' >&2; exit 1"
    );
    let files = HARNESS_SOURCES
        .iter()
        .map(|(name, source)| (format!("{HARNESS_FOLDER}/{name}"), source.as_bytes().to_vec(), 0o644))
        .collect();
    TemplateExtras {
        files,
        commands: vec![start],
    }
}

/// The command that runs a function-call check: through the zygote (falling back to
/// starting Python on the template's copy of the harness), or (`direct`) by starting Python
/// on the copy written with the tests.
///
/// A scoring VM is a fresh fork of a `farm run` template, which holds the harness at
/// [`HARNESS_PATH`]. A rollout's own VM (final-state scoring) ran the agent, perhaps as root:
/// its check uses only what the tests brought.
pub fn check_argv(harness_args: &[String], direct: bool) -> Vec<String> {
    let harness = if direct {
        format!("{TESTS_DIR}/{HARNESS_TEST_FILE}")
    } else {
        HARNESS_PATH.to_string()
    };
    let python = ["/usr/bin/python3".to_string(), "-I".to_string(), harness];
    let mut argv: Vec<String> = if direct {
        Vec::new()
    } else {
        vec![
            "/sbin/farm-agent".into(),
            "--check-with-zygote".into(),
            SOCKET.into(),
            "--".into(),
        ]
    };
    argv.extend(python);
    argv.extend(harness_args.iter().cloned());
    argv
}

#[cfg(test)]
mod tests {
    use super::*;
    use datasets::HARNESS_ENTRY;

    #[test]
    fn the_zygote_path_falls_back_to_python_on_the_templates_harness() {
        let args = vec!["--module".to_string(), "solution".to_string()];
        let direct = check_argv(&args, true);
        assert_eq!(
            direct,
            [
                "/usr/bin/python3",
                "-I",
                &format!("/opt/farm-tests/{HARNESS_TEST_FILE}"),
                "--module",
                "solution"
            ]
        );
        assert_eq!(HARNESS_PATH, format!("{HARNESS_FOLDER}/{HARNESS_ENTRY}"));
        let zygote = check_argv(&args, false);
        assert_eq!(&zygote[..4], ["/sbin/farm-agent", "--check-with-zygote", SOCKET, "--"]);
        assert_eq!(zygote[6], HARNESS_PATH, "the fallback uses the template's harness");
        assert_eq!(&zygote[4..6], &direct[..2]);
        assert_eq!(&zygote[7..], &direct[3..]);
        let extras = template_extras(Preload::UnitTests);
        assert!(extras.commands[0].contains(SOCKET) && extras.files.iter().any(|f| f.0 == HARNESS_PATH));
        assert!(!extras.commands[0].contains("--function-call-only"));
        let lean = template_extras(Preload::FunctionCallOnly);
        assert!(lean.commands[0].contains(&format!("--zygote {SOCKET} --function-call-only")));
    }
}
