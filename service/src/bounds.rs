//! Every field of every request `farm serve` takes has a bound, checked before anything is
//! made, and a value past it is a 400 naming the field, the bound and the value.
//!
//! The bounds are this module's constants; [`table`] lists them for `docs/sandbox-api.md`
//! (a test keeps the two the same). Strings are bounded in bytes (UTF-8). The bounds of a
//! command, its arguments, environment, folder and user together fit the agent's largest
//! request header ([`farm_protocol::MAX_HEADER_BYTES`]) even when every byte is escaped, so
//! a request that passes them always reaches the guest.

use std::collections::BTreeMap;

use super::error::{ApiError, ApiResult};
use crate::error::ErrorKind;

/// An id a request names (environment, context, sandbox, session, network policy, suite).
pub const ID_BYTES: usize = 256;
/// A guest path (`workdir`, `cwd`, a file's or folder's `path`), as Linux's `PATH_MAX`.
pub const PATH_BYTES: usize = 4095;
/// A shell command (`command`, each `setup` step), as Linux's largest single argument
/// (`MAX_ARG_STRLEN`) less its NUL: `sh -c` could not run a longer one.
pub const COMMAND_BYTES: usize = 131_071;
/// `argv`: items, and bytes in all (Linux's `ARG_MAX` with the default 8 MiB stack: what
/// `execve` takes, arguments and environment together).
pub const ARGV_ITEMS: usize = 4096;
pub const ARGV_BYTES: usize = 2 << 20;
/// `env` (a sandbox's, an exec's) and a Dockerfile's `build_args`: variables, and bytes of
/// names and values in all.
pub const ENV_VARS: usize = 256;
pub const ENV_BYTES: usize = 16 << 10;
/// `user`.
pub const USER_BYTES: usize = 256;
/// `metadata` (a sandbox's, a session's, a submitted item's): keys, and bytes of its JSON.
pub const METADATA_KEYS: usize = 64;
pub const METADATA_BYTES: usize = 64 << 10;
/// `stdin` of an exec.
pub const STDIN_BYTES: usize = 8 << 20;
/// `cpus`, `memory_mib` and `disk_mib` of an environment or sandbox.
pub const CPUS: (u64, u64) = (1, 64);
pub const MEMORY_MIB: (u64, u64) = (128, 262_144);
pub const DISK_MIB: (u64, u64) = (64, 1 << 20);
/// A sandbox's `disk_mib`: how far its disk may grow past its environment's.
pub const SANDBOX_DISK_MIB: (u64, u64) = (1, 1 << 20);
/// An environment's `setup` steps.
pub const SETUP_STEPS: usize = 256;
/// A Dockerfile's build `target`, and an image reference.
pub const NAME_BYTES: usize = 512;
/// `items` of one `POST /v1/rollouts`.
pub const SUBMIT_ITEMS: usize = 4096;
/// An inline `task` (its JSON), and a session's submitted `answer`.
pub const TASK_BYTES: usize = 1 << 20;
pub const ANSWER_BYTES: usize = 1 << 20;
/// A session's written file (`content`).
pub const CONTENT_BYTES: usize = 8 << 20;

/// A string of at most `max` bytes.
pub fn text(field: impl Into<String>, value: &str, max: usize) -> ApiResult<()> {
    if value.len() > max {
        return Err(past(
            field,
            format!("at most {max} bytes"),
            format!("{} bytes", value.len()),
        ));
    }
    Ok(())
}

/// A number from `min` to `max` (`unit` names what it counts).
pub fn range(field: impl Into<String>, value: u64, (min, max): (u64, u64), unit: &str) -> ApiResult<()> {
    if !(min..=max).contains(&value) {
        return Err(past(field, format!("{min} to {max} {unit}"), value.to_string()));
    }
    Ok(())
}

/// At most `max` items.
pub fn count(field: impl Into<String>, items: usize, max: usize, what: &str) -> ApiResult<()> {
    if items > max {
        return Err(past(field, format!("at most {max} {what}"), format!("{items} {what}")));
    }
    Ok(())
}

/// A map of names to values: at most [`ENV_VARS`] entries and [`ENV_BYTES`] in all.
pub fn variables(field: &str, map: &BTreeMap<String, String>) -> ApiResult<()> {
    count(field, map.len(), ENV_VARS, "variables")?;
    let bytes: usize = map.iter().map(|(k, v)| k.len() + v.len()).sum();
    if bytes > ENV_BYTES {
        return Err(past(
            field,
            format!("at most {ENV_BYTES} bytes of names and values"),
            format!("{bytes} bytes"),
        ));
    }
    Ok(())
}

/// Metadata: at most [`METADATA_KEYS`] keys (at its top level) and [`METADATA_BYTES`] of
/// JSON.
pub fn metadata(field: &str, keys: usize, json_bytes: usize) -> ApiResult<()> {
    count(field, keys, METADATA_KEYS, "keys")?;
    if json_bytes > METADATA_BYTES {
        return Err(past(
            field,
            format!("at most {METADATA_BYTES} bytes of JSON"),
            format!("{json_bytes} bytes"),
        ));
    }
    Ok(())
}

/// A sandbox's string-to-string metadata, bounded as [`metadata`].
pub fn string_metadata(field: &str, map: &BTreeMap<String, String>) -> ApiResult<()> {
    let json = serde_json::to_vec(map).map_or(usize::MAX, |j| j.len());
    metadata(field, map.len(), json)
}

/// `argv`: at most [`ARGV_ITEMS`] items of [`ARGV_BYTES`] in all.
pub fn argv(field: &str, argv: &[String]) -> ApiResult<()> {
    count(field, argv.len(), ARGV_ITEMS, "items")?;
    let bytes: usize = argv.iter().map(String::len).sum();
    if bytes > ARGV_BYTES {
        return Err(past(
            field,
            format!("at most {ARGV_BYTES} bytes in all"),
            format!("{bytes} bytes"),
        ));
    }
    Ok(())
}

fn past(field: impl Into<String>, bound: String, value: String) -> ApiError {
    let field = field.into();
    ApiError::field(
        ErrorKind::Invalid,
        field.clone(),
        format!("{field} must be {bound}; got {value}"),
    )
}

/// The bounds as `docs/sandbox-api.md` lists them: (where, field, bound).
#[cfg(test)]
pub fn table() -> Vec<(&'static str, &'static str, String)> {
    [request_rows(), hosting_rows()].concat()
}

/// The bounds of what a sandbox hosts: processes, terminals, ports, and the calls beside them.
#[cfg(test)]
fn hosting_rows() -> Vec<(&'static str, &'static str, String)> {
    use crate::sandbox::sandboxes::processes::{MAX_STDIN_BYTES, MAX_WAIT_SECS};
    use farm_protocol::process::{MAX_ENDED, MAX_PROCESSES, MAX_READ_BYTES, MAX_RING_BYTES};
    vec![
        (
            "processes",
            "`command`, `argv`, `cwd`, `env`, `user`",
            "as exec's".into(),
        ),
        (
            "processes",
            "`ring_bytes`",
            format!("1 to {MAX_RING_BYTES} (default 1048576)"),
        ),
        (
            "processes",
            "`pty.rows`, `pty.cols`, a terminal's `rows`, `cols`",
            "1 to 1000".into(),
        ),
        (
            "processes",
            "`data` (stdin)",
            format!("at most {MAX_STDIN_BYTES} bytes"),
        ),
        ("processes", "`max` (output)", format!("1 to {MAX_READ_BYTES} bytes")),
        (
            "processes",
            "`wait`, `timeout`",
            format!("0 to {MAX_WAIT_SECS} seconds"),
        ),
        ("processes", "`signal`", "a name (TERM, KILL, ...) or 1 to 64".into()),
        (
            "processes",
            "processes a sandbox keeps",
            format!("at most {MAX_PROCESSES} running (400 past it); the oldest of {MAX_ENDED} ended ones forgotten"),
        ),
        (
            "ports",
            "`port`",
            format!(
                "1 to 65535; at most {} open a sandbox",
                crate::sandbox::ports::MAX_PORTS
            ),
        ),
        (
            "sandboxes",
            "`count` (branch)",
            format!("1 to {}", crate::sandbox::sandboxes::lifetimes::MAX_BRANCHES),
        ),
        (
            "sandboxes",
            "`expires_in_secs` (timeout)",
            "1 to what `serve.sandboxes.max_lifetime_secs` leaves it".into(),
        ),
        (
            "files",
            "`max` (entries)",
            format!("1 to {}", farm_protocol::folder::MAX_FOLDER_ENTRIES),
        ),
    ]
}

/// The bounds of requests in general, sandboxes', sessions' and rollouts'.
#[cfg(test)]
fn request_rows() -> Vec<(&'static str, &'static str, String)> {
    let bytes = |n: usize| format!("at most {n} bytes");
    let between = |(min, max): (u64, u64), unit: &str| format!("{min} to {max} {unit}");
    let vars = format!("at most {ENV_VARS} variables, {ENV_BYTES} bytes of names and values");
    let meta = format!("at most {METADATA_KEYS} keys, {METADATA_BYTES} bytes of JSON");
    vec![
        (
            "every request",
            "ids (`environment`, `network`, `dockerfile.context`, `suite`, `task_id`, a path's `{id}`)",
            bytes(ID_BYTES),
        ),
        (
            "every request",
            "guest paths (`workdir`, `cwd`, `path`, `dockerfile.path`)",
            bytes(PATH_BYTES),
        ),
        ("every request", "`user`", bytes(USER_BYTES)),
        ("every request", "`env`, `dockerfile.build_args`", vars),
        ("every request", "`metadata`", meta),
        ("environments", "`cpus`", between(CPUS, "vCPUs")),
        ("environments", "`memory_mib`", between(MEMORY_MIB, "MiB")),
        ("environments", "`disk_mib`", between(DISK_MIB, "MiB")),
        (
            "environments",
            "`setup`",
            format!("at most {SETUP_STEPS} steps of {COMMAND_BYTES} bytes"),
        ),
        ("environments", "`image`, `dockerfile.target`", bytes(NAME_BYTES)),
        ("sandboxes", "`disk_mib`", between(SANDBOX_DISK_MIB, "MiB")),
        (
            "sandboxes",
            "`cpus`, `memory_mib`",
            "its environment's (fixed in the snapshot)".into(),
        ),
        (
            "sandboxes",
            "`idle_timeout_secs`",
            "1 to `serve.sandboxes.idle_timeout_secs` (600)".into(),
        ),
        (
            "sandboxes",
            "`lifetime_secs`",
            "1 to `serve.sandboxes.max_lifetime_secs` (86400)".into(),
        ),
        ("exec", "`command`", bytes(COMMAND_BYTES)),
        (
            "exec",
            "`argv`",
            format!("at most {ARGV_ITEMS} items, {ARGV_BYTES} bytes in all"),
        ),
        ("exec", "`stdin`", bytes(STDIN_BYTES)),
        ("exec", "`timeout_secs`", "more than 0, at most 86400".into()),
        ("exec", "`max_output_bytes`", format!("1 to {}", 16 << 20)),
        (
            "files",
            "a file's body",
            format!("at most {} bytes (413 past it)", 64 << 20),
        ),
        (
            "files",
            "a folder's tar body",
            format!("at most {} bytes (413 past it)", 64 << 20),
        ),
        (
            "contexts",
            "a context's tar body",
            "at most `serve.sandboxes.max_context_mib` (256) MiB (413 past it)".into(),
        ),
        ("sessions", "`command`", bytes(COMMAND_BYTES)),
        ("sessions", "`content` (`write_file`)", bytes(CONTENT_BYTES)),
        ("sessions", "`answer` (`submit`)", bytes(ANSWER_BYTES)),
        (
            "sessions",
            "`task` (inline)",
            format!("at most {TASK_BYTES} bytes of JSON"),
        ),
        ("rollouts", "`items`", format!("at most {SUBMIT_ITEMS}")),
        ("rollouts", "`n`", "1 to `serve.max_samples_per_item` (64)".into()),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_past_its_bound_names_the_field_the_bound_and_the_value() {
        let e = range("disk_mib", 1_000_000_000_000, SANDBOX_DISK_MIB, "MiB").unwrap_err();
        assert_eq!((e.kind, e.field.as_deref()), (ErrorKind::Invalid, Some("disk_mib")));
        assert!(
            e.message.contains("1 to 1048576 MiB") && e.message.contains("1000000000000"),
            "{}",
            e.message
        );
        let big: BTreeMap<String, String> = (0..65).map(|i| (format!("k{i}"), "v".into())).collect();
        let e = string_metadata("metadata", &big).unwrap_err();
        assert!(
            e.message.contains("at most 64 keys") && e.message.contains("65 keys"),
            "{}",
            e.message
        );
        let wide = BTreeMap::from([("k".to_string(), "v".repeat(200_000))]);
        let e = string_metadata("metadata", &wide).unwrap_err();
        assert!(
            e.message.contains("65536 bytes of JSON") && e.message.contains("200008"),
            "{}",
            e.message
        );
        assert!(text("cwd", &"a".repeat(PATH_BYTES), PATH_BYTES).is_ok());
        assert_eq!(
            text("cwd", &"a".repeat(PATH_BYTES + 1), PATH_BYTES)
                .unwrap_err()
                .field
                .as_deref(),
            Some("cwd")
        );
        let env = BTreeMap::from([("A".to_string(), "x".repeat(ENV_BYTES))]);
        assert!(variables("env", &env).unwrap_err().message.contains("16385 bytes"));
        assert!(argv("argv", &vec!["a".to_string(); ARGV_ITEMS + 1]).is_err());
    }

    /// The worst a bounded command can be, every byte escaped in the agent's JSON header,
    /// still fits that header: a request within the bounds always reaches the guest.
    #[test]
    fn a_command_within_the_bounds_fits_the_agent_header() {
        let shell = farm_protocol::Program::Shell("\u{1}".repeat(COMMAND_BYTES));
        let argv = farm_protocol::Program::Argv(vec!["\u{1}".repeat(ARGV_BYTES / 16); 16]);
        for program in [shell, argv] {
            fits_the_agent_header(program);
        }
    }

    fn fits_the_agent_header(program: farm_protocol::Program) {
        // A sandbox's variables and the command's own, each at their bound.
        let env: BTreeMap<String, String> = (0..4)
            .map(|i| (format!("V{i}"), "\u{1}".repeat(ENV_BYTES / 2 - 2)))
            .collect();
        let request = farm_protocol::Request::Exec(farm_protocol::ExecRequest {
            program,
            cwd: Some("\u{1}".repeat(PATH_BYTES)),
            env,
            timeout_ms: Some(u64::MAX),
            stdout_cap: u64::MAX,
            stderr_cap: u64::MAX,
            user: Some("\u{1}".repeat(USER_BYTES)),
        });
        let header = serde_json::to_vec(&farm_protocol::Envelope {
            v: 3,
            id: 1,
            msg: request,
        })
        .unwrap();
        assert!(
            header.len() < farm_protocol::MAX_HEADER_BYTES as usize,
            "{} bytes",
            header.len()
        );
    }

    #[test]
    fn the_docs_list_every_bound() {
        let doc = include_str!("../../docs/sandbox-api.md");
        for (place, field, bound) in table() {
            let row = format!("| {place} | {field} | {bound} |");
            assert!(doc.contains(&row), "docs/sandbox-api.md lacks the row\n{row}");
        }
    }
}
