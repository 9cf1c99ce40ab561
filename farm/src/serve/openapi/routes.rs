//! Which request type each route of `farm serve` takes and which answer type it gives: the
//! table the OpenAPI document ([`super::openapi`]) is made from.

use utoipa::openapi::path::HttpMethod;

use super::{Body, Doc};
use engine::guest::CommandOutput;
use service::requests::{
    CancelBelow, ExecRequest as SessionExec, ItemRequest, SubmitRequest, SubmitSessionRequest, WriteFileRequest,
};
use service::sandbox::contexts::Uploaded;
use service::sandbox::environments::EnvironmentRequest;
use service::sandbox::sandboxes::{ExecRequest as SandboxExec, SandboxRequest};
use service::wire::*;

pub(super) fn rollout_routes(doc: &mut Doc) {
    use HttpMethod::{Get, Post};
    let (body, answer) = (doc.json::<SubmitRequest>(), doc.json::<Submitted>());
    doc.route(
        Post,
        "/v1/rollouts",
        "submit rollouts (header Idempotency-Key: a retry gets the same answer)",
        &[],
        Some(body),
        vec![("202", "admitted", answer)],
    );
    let query = [
        ("cursor", "the first row's cursor (default 0)"),
        ("max", "rows at most (1-10000, default 100)"),
        ("wait", "seconds to wait for a first row (0-300)"),
    ];
    doc.route(Get, "/v1/results", "rows from a cursor on: NDJSON, or Arrow IPC with Accept: application/vnd.apache.arrow.stream (header farm-next-cursor)", &query, None, vec![("200", "rows", Body::Raw("application/x-ndjson"))]);
    let answer = doc.json::<RolloutView>();
    doc.route(
        Get,
        "/v1/rollouts/{id}",
        "one rollout, and its row once done",
        &[],
        None,
        vec![("200", "the rollout", answer)],
    );
    let answer = doc.json::<Cancelled>();
    doc.route(
        Post,
        "/v1/rollouts/{id}/cancel",
        "cancel a queued or running rollout",
        &[],
        None,
        vec![("200", "cancelled or not", answer)],
    );
    let (body, answer) = (doc.json::<CancelBelow>(), doc.json::<CancelledCount>());
    doc.route(
        Post,
        "/v1/cancel",
        "cancel rollouts of policy versions below one",
        &[],
        Some(body),
        vec![("200", "how many", answer)],
    );
    let answer = doc.json::<Capacity>();
    doc.route(
        Get,
        "/v1/capacity",
        "slots, queue, sessions, sandboxes and memory",
        &[],
        None,
        vec![("200", "the capacity", answer)],
    );
    doc.route(
        Get,
        "/metrics",
        "Prometheus metrics",
        &[],
        None,
        vec![("200", "the metrics", Body::Raw("text/plain"))],
    );
}

pub(super) fn session_routes(doc: &mut Doc) {
    use HttpMethod::{Get, Post};
    let (body, answer) = (doc.json::<ItemRequest>(), doc.json::<SessionOpened>());
    doc.route(
        Post,
        "/v1/sessions",
        "open a session on a task",
        &[],
        Some(body),
        vec![("201", "opened", answer)],
    );
    let answer = doc.json::<SessionList>();
    doc.route(
        Get,
        "/v1/sessions",
        "every live and paused session",
        &[],
        None,
        vec![("200", "the sessions", answer)],
    );
    let (body, answer) = (doc.json::<SessionExec>(), doc.json::<Stepped>());
    doc.route(
        Post,
        "/v1/sessions/{id}/exec",
        "run a command as the session's next step",
        &[],
        Some(body),
        vec![("200", "the step", answer)],
    );
    let (body, answer) = (doc.json::<WriteFileRequest>(), doc.json::<Stepped>());
    doc.route(
        Post,
        "/v1/sessions/{id}/write_file",
        "write a file as the session's next step",
        &[],
        Some(body),
        vec![("200", "the step", answer)],
    );
    let answer = doc.json::<Branched>();
    doc.route(
        Post,
        "/v1/sessions/{id}/branch",
        "a new session from this one's state",
        &[],
        None,
        vec![("201", "the branch", answer)],
    );
    let (body, answer) = (doc.json::<SubmitSessionRequest>(), doc.json::<SessionScored>());
    doc.route(
        Post,
        "/v1/sessions/{id}/submit",
        "end and score the session",
        &[],
        Some(body),
        vec![("200", "the verdict", answer)],
    );
}

pub(super) fn session_state_routes(doc: &mut Doc) {
    use HttpMethod::{Delete, Get, Post};
    for (path, summary) in [
        ("/v1/sessions/{id}/pause", "save the session to disk and stop its VM"),
        ("/v1/sessions/{id}/resume", "fork a paused session again"),
    ] {
        let answer = doc.json::<SessionView>();
        doc.route(Post, path, summary, &[], None, vec![("200", "the session", answer)]);
    }
    let answer = doc.json::<SessionView>();
    doc.route(
        Get,
        "/v1/sessions/{id}",
        "one session",
        &[],
        None,
        vec![("200", "the session", answer)],
    );
    let answer = doc.json::<SessionEnded>();
    doc.route(
        Delete,
        "/v1/sessions/{id}",
        "end a session without a row",
        &[],
        None,
        vec![("200", "ended", answer)],
    );
}

pub(super) fn environment_routes(doc: &mut Doc) {
    use HttpMethod::{Delete, Get, Post};
    let answer = doc.json::<Uploaded>();
    doc.route(
        Post,
        "/v1/contexts",
        "upload a Dockerfile build context (a tar archive)",
        &[],
        Some(Body::Raw("application/x-tar")),
        vec![("201", "the context", answer)],
    );
    let (body, accepted, existing) = (
        doc.json::<EnvironmentRequest>(),
        doc.json::<EnvironmentView>(),
        doc.json::<EnvironmentView>(),
    );
    doc.route(
        Post,
        "/v1/environments",
        "make an environment (or find the one with the same content)",
        &[],
        Some(body),
        vec![("202", "building", accepted), ("200", "it exists", existing)],
    );
    let answer = doc.json::<EnvironmentList>();
    doc.route(
        Get,
        "/v1/environments",
        "every environment",
        &[],
        None,
        vec![("200", "the environments", answer)],
    );
    let answer = doc.json::<EnvironmentView>();
    doc.route(
        Get,
        "/v1/environments/{id}",
        "one environment",
        &[],
        None,
        vec![("200", "the environment", answer)],
    );
    let answer = doc.json::<Deleted>();
    doc.route(
        Delete,
        "/v1/environments/{id}",
        "delete an environment",
        &[],
        None,
        vec![("200", "deleted", answer)],
    );
    let query = [
        ("offset", "the first line (default 0)"),
        ("wait", "seconds to wait for a line (0-300)"),
    ];
    let answer = doc.json::<LogPage>();
    doc.route(
        Get,
        "/v1/environments/{id}/logs",
        "an environment's build lines",
        &query,
        None,
        vec![("200", "lines", answer)],
    );
}

pub(super) fn sandbox_routes(doc: &mut Doc) {
    use HttpMethod::{Delete, Get, Post};
    let (body, made, retried) = (
        doc.json::<SandboxRequest>(),
        doc.json::<SandboxView>(),
        doc.json::<SandboxView>(),
    );
    doc.route(
        Post,
        "/v1/sandboxes",
        "fork a sandbox of an environment (header Idempotency-Key)",
        &[],
        Some(body),
        vec![("201", "made", made), ("200", "a retried create", retried)],
    );
    let answer = doc.json::<SandboxList>();
    let query = [
        ("state", "running or paused"),
        (
            "metadata.KEY",
            "only sandboxes whose metadata has KEY with this value (any number of them)",
        ),
    ];
    doc.route(
        Get,
        "/v1/sandboxes",
        "the sandboxes, oldest first, filtered by state and metadata",
        &query,
        None,
        vec![("200", "the sandboxes", answer)],
    );
    let answer = doc.json::<SandboxView>();
    doc.route(
        Get,
        "/v1/sandboxes/{id}",
        "one sandbox",
        &[],
        None,
        vec![("200", "the sandbox", answer)],
    );
    let answer = doc.json::<Deleted>();
    doc.route(
        Delete,
        "/v1/sandboxes/{id}",
        "delete a sandbox (its VM stops now)",
        &[],
        None,
        vec![("200", "deleted", answer)],
    );
    let (body, answer) = (doc.json::<SandboxExec>(), doc.json::<CommandOutput>());
    doc.route(
        Post,
        "/v1/sandboxes/{id}/exec",
        "run a command",
        &[],
        Some(body),
        vec![("200", "how it ended", answer)],
    );
}

pub(super) fn sandbox_state_routes(doc: &mut Doc) {
    use HttpMethod::Post;
    let body = doc.json::<SandboxExec>();
    doc.json::<StreamData>();
    doc.json::<StreamError>();
    doc.json::<engine::guest::CommandEnd>();
    doc.route(Post, "/v1/sandboxes/{id}/exec/stream", "run a command, its output as server-sent events (stdout, stderr: StreamData; exit: CommandEnd; error: StreamError)", &[], Some(body), vec![("200", "events", Body::Raw("text/event-stream"))]);
    use service::sandbox::sandboxes::lifetimes::{BranchRequest, TimeoutRequest};
    let (body, answer) = (doc.json::<BranchRequest>(), doc.json::<SandboxBranched>());
    doc.route(
        Post,
        "/v1/sandboxes/{id}/branch",
        "new sandboxes from this one's state: one (no body), or count of them, all or none",
        &[],
        Some(body),
        vec![("201", "the branch, or the list of them", answer)],
    );
    let answer = doc.json::<EntryView>();
    let query = [("path", "an absolute guest path")];
    doc.route(
        HttpMethod::Get,
        "/v1/sandboxes/{id}/stat",
        "a path's facts, without running a command (links are not followed)",
        &query,
        None,
        vec![("200", "the path", answer)],
    );
    let answer = doc.json::<FolderListing>();
    let query = [
        ("path", "an absolute guest folder"),
        ("max", "entries at most (default 1000, 1-10000)"),
    ];
    doc.route(
        HttpMethod::Get,
        "/v1/sandboxes/{id}/entries",
        "a folder's entries by name, without running a command",
        &query,
        None,
        vec![("200", "the listing", answer)],
    );
    let (body, answer) = (doc.json::<TimeoutRequest>(), doc.json::<SandboxView>());
    doc.route(
        Post,
        "/v1/sandboxes/{id}/timeout",
        "new idle timeout and lifetime, within the service's caps",
        &[],
        Some(body),
        vec![("200", "the sandbox", answer)],
    );
    for (path, summary, status) in [
        ("/v1/sandboxes/{id}/pause", "save it to disk and stop its VM", "200"),
        (
            "/v1/sandboxes/{id}/checkpoint",
            "save its state for a restart of the service; it runs on",
            "200",
        ),
        ("/v1/sandboxes/{id}/resume", "fork it again from its saved state", "200"),
    ] {
        let answer = doc.json::<SandboxView>();
        doc.route(Post, path, summary, &[], None, vec![(status, "the sandbox", answer)]);
    }
    let answer = doc.json::<service::wire::SandboxReset>();
    doc.route(
        Post,
        "/v1/sandboxes/{id}/reset",
        "back to its environment's snapshot, same id: files, processes, memory and disk as the environment made them, a new identity; in place (the same VM, exactly) where it can be",
        &[],
        None,
        vec![("200", "the sandbox and how it was reset", answer)],
    );
    let answer = doc.json::<EnvironmentView>();
    doc.route(
        Post,
        "/v1/sandboxes/{id}/snapshot",
        "a new environment of this sandbox's state",
        &[],
        None,
        vec![("201", "the environment", answer)],
    );
}

pub(super) fn file_routes(doc: &mut Doc) {
    use HttpMethod::{Get, Put};
    let path_query = [
        ("path", "an absolute guest path"),
        ("mode", "octal file mode (default 644)"),
    ];
    for (path, media) in [
        ("/v1/sandboxes/{id}/files", "application/octet-stream"),
        ("/v1/sandboxes/{id}/folders", "application/x-tar"),
    ] {
        let written = doc.json::<FileWritten>();
        doc.route(
            Put,
            path,
            "upload (a folder as a tar archive)",
            &path_query,
            Some(Body::Raw(media)),
            vec![("200", "written", written)],
        );
        doc.route(
            Get,
            path,
            "download (a folder as a tar archive)",
            &path_query[..1],
            None,
            vec![("200", "the bytes", Body::Raw(media))],
        );
    }
    doc.route(
        Get,
        "/v1/openapi.json",
        "this document",
        &[],
        None,
        vec![("200", "the document", Body::Raw("application/json"))],
    );
}

/// Routes whose messages other clients define: OpenEnv's and MCP's.
pub(super) fn protocol_routes(doc: &mut Doc) {
    use HttpMethod::{Get, Post};
    let message = || Body::Raw("application/json");
    doc.route(
        Post,
        "/v1/sessions/{id}/mcp",
        "MCP (JSON-RPC 2.0 over HTTP POST) for the agent in a session",
        &[],
        Some(message()),
        vec![("200", "a JSON-RPC answer", message())],
    );
    doc.route(
        Get,
        "/v1/openenv/health",
        "OpenEnv: health",
        &[],
        None,
        vec![("200", "healthy", message())],
    );
    doc.route(
        Get,
        "/v1/openenv/metadata",
        "OpenEnv: the environment's metadata",
        &[],
        None,
        vec![("200", "metadata", message())],
    );
    doc.route(
        Get,
        "/v1/openenv/schema",
        "OpenEnv: action and observation schemas",
        &[],
        None,
        vec![("200", "schemas", message())],
    );
    doc.route(
        Get,
        "/v1/openenv/ws",
        "OpenEnv: an episode over a WebSocket (reset, step, state, close)",
        &[],
        None,
        vec![("101", "switching to the WebSocket", message())],
    );
}

pub(super) fn sandbox_network_routes(doc: &mut Doc) {
    let (body, answer) = (
        doc.json::<service::sandbox::sandboxes::NetworkChange>(),
        doc.json::<SandboxView>(),
    );
    doc.route(
        HttpMethod::Post,
        "/v1/sandboxes/{id}/network",
        "move it, live, to a stricter named policy (one serve.sandboxes.tighten lists after its own) or to none (null): connections the new policy would not open are cut",
        &[],
        Some(body),
        vec![("200", "the sandbox", answer)],
    );
}
