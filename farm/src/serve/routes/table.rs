//! Which request type each route of `farm serve` takes and which answer type it gives: the
//! table the OpenAPI document ([`super::openapi`]) is made from.

use utoipa::openapi::path::HttpMethod;

use super::{Body, Routes};
use engine::guest::CommandOutput;
use service::requests::{
    CancelBelow, ExecRequest as SessionExec, ItemRequest, SubmitRequest, SubmitSessionRequest, WriteFileRequest,
};
use service::sandbox::contexts::Uploaded;
use service::sandbox::environments::EnvironmentRequest;
use service::sandbox::sandboxes::{ExecRequest as SandboxExec, SandboxRequest};
use service::wire::*;

pub(super) fn rollout_routes(r: &mut Routes) {
    use HttpMethod::{Get, Post};
    let (body, answer) = (r.json::<SubmitRequest>(), r.json::<Submitted>());
    r.add(
        Post,
        "/v1/rollouts",
        crate::serve::api::submit,
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
    r.add(Get, "/v1/results", crate::serve::api::results, "rows from a cursor on: NDJSON, or Arrow IPC with Accept: application/vnd.apache.arrow.stream (header farm-next-cursor)", &query, None, vec![("200", "rows", Body::Raw("application/x-ndjson"))]);
    let answer = r.json::<RolloutView>();
    r.add(
        Get,
        "/v1/rollouts/{id}",
        crate::serve::api::rollout,
        "one rollout, and its row once done",
        &[],
        None,
        vec![("200", "the rollout", answer)],
    );
    let answer = r.json::<Cancelled>();
    r.add(
        Post,
        "/v1/rollouts/{id}/cancel",
        crate::serve::api::cancel,
        "cancel a queued or running rollout",
        &[],
        None,
        vec![("200", "cancelled or not", answer)],
    );
    let (body, answer) = (r.json::<CancelBelow>(), r.json::<CancelledCount>());
    r.add(
        Post,
        "/v1/cancel",
        crate::serve::api::cancel_below,
        "cancel rollouts of policy versions below one",
        &[],
        Some(body),
        vec![("200", "how many", answer)],
    );
    let answer = r.json::<Capacity>();
    r.add(
        Get,
        "/v1/capacity",
        crate::serve::api::capacity,
        "slots, queue, sessions, sandboxes and memory",
        &[],
        None,
        vec![("200", "the capacity", answer)],
    );
    r.add(
        Get,
        "/metrics",
        crate::serve::api::metrics,
        "Prometheus metrics",
        &[],
        None,
        vec![("200", "the metrics", Body::Raw("text/plain"))],
    );
}

pub(super) fn session_routes(r: &mut Routes) {
    use HttpMethod::{Get, Post};
    let (body, answer) = (r.json::<ItemRequest>(), r.json::<SessionOpened>());
    r.add(
        Post,
        "/v1/sessions",
        crate::serve::api::open_session,
        "open a session on a task",
        &[],
        Some(body),
        vec![("201", "opened", answer)],
    );
    let answer = r.json::<SessionList>();
    r.add(
        Get,
        "/v1/sessions",
        crate::serve::api::list_sessions,
        "every live and paused session",
        &[],
        None,
        vec![("200", "the sessions", answer)],
    );
    let (body, answer) = (r.json::<SessionExec>(), r.json::<Stepped>());
    r.add(
        Post,
        "/v1/sessions/{id}/exec",
        crate::serve::api::exec,
        "run a command as the session's next step",
        &[],
        Some(body),
        vec![("200", "the step", answer)],
    );
    let (body, answer) = (r.json::<WriteFileRequest>(), r.json::<Stepped>());
    r.add(
        Post,
        "/v1/sessions/{id}/write_file",
        crate::serve::api::write_file,
        "write a file as the session's next step",
        &[],
        Some(body),
        vec![("200", "the step", answer)],
    );
    let answer = r.json::<Branched>();
    r.add(
        Post,
        "/v1/sessions/{id}/branch",
        crate::serve::api::branch,
        "a new session from this one's state",
        &[],
        None,
        vec![("201", "the branch", answer)],
    );
    let (body, answer) = (r.json::<SubmitSessionRequest>(), r.json::<SessionScored>());
    r.add(
        Post,
        "/v1/sessions/{id}/submit",
        crate::serve::api::submit_session,
        "end and score the session",
        &[],
        Some(body),
        vec![("200", "the verdict", answer)],
    );
}

pub(super) fn session_state_routes(r: &mut Routes) {
    use HttpMethod::{Delete, Get, Post};
    let answer = r.json::<SessionView>();
    r.add(
        Post,
        "/v1/sessions/{id}/pause",
        crate::serve::api::pause_session,
        "save the session to disk and stop its VM",
        &[],
        None,
        vec![("200", "the session", answer)],
    );
    let answer = r.json::<SessionView>();
    let resume = r.json::<service::sandbox::sandboxes::kept::ResumeRequest>();
    r.add(
        Post,
        "/v1/sessions/{id}/resume",
        crate::serve::api::resume_session,
        "fork a paused session again, handed back once it has what `keep` names",
        &[],
        Some(resume),
        vec![("200", "the session", answer)],
    );
    let answer = r.json::<SessionView>();
    r.add(
        Get,
        "/v1/sessions/{id}",
        crate::serve::api::get_session,
        "one session",
        &[],
        None,
        vec![("200", "the session", answer)],
    );
    let answer = r.json::<SessionEnded>();
    r.add(
        Delete,
        "/v1/sessions/{id}",
        crate::serve::api::end_session,
        "end a session without a row",
        &[],
        None,
        vec![("200", "ended", answer)],
    );
}

pub(super) fn environment_routes(r: &mut Routes) {
    use HttpMethod::{Delete, Get, Post};
    let (body, accepted, existing) = (
        r.json::<EnvironmentRequest>(),
        r.json::<EnvironmentView>(),
        r.json::<EnvironmentView>(),
    );
    r.add(
        Post,
        "/v1/environments",
        crate::serve::sandbox_routes::create_environment,
        "make an environment (or find the one with the same content)",
        &[],
        Some(body),
        vec![("202", "building", accepted), ("200", "it exists", existing)],
    );
    let answer = r.json::<EnvironmentList>();
    r.add(
        Get,
        "/v1/environments",
        crate::serve::sandbox_routes::list_environments,
        "every environment",
        &[],
        None,
        vec![("200", "the environments", answer)],
    );
    let answer = r.json::<EnvironmentView>();
    r.add(
        Get,
        "/v1/environments/{id}",
        crate::serve::sandbox_routes::get_environment,
        "one environment",
        &[],
        None,
        vec![("200", "the environment", answer)],
    );
    let answer = r.json::<Deleted>();
    r.add(
        Delete,
        "/v1/environments/{id}",
        crate::serve::sandbox_routes::delete_environment,
        "delete an environment",
        &[],
        None,
        vec![("200", "deleted", answer)],
    );
    let query = [
        ("offset", "the first line (default 0)"),
        ("wait", "seconds to wait for a line (0-300)"),
    ];
    let answer = r.json::<LogPage>();
    r.add(
        Get,
        "/v1/environments/{id}/logs",
        crate::serve::sandbox_routes::environment_logs,
        "an environment's build lines",
        &query,
        None,
        vec![("200", "lines", answer)],
    );
}

pub(super) fn sandbox_routes(r: &mut Routes) {
    use HttpMethod::{Delete, Get, Post};
    let (body, made, retried) = (
        r.json::<SandboxRequest>(),
        r.json::<SandboxView>(),
        r.json::<SandboxView>(),
    );
    r.add(
        Post,
        "/v1/sandboxes",
        crate::serve::sandbox_routes::create_sandbox,
        "fork a sandbox of an environment (header Idempotency-Key)",
        &[],
        Some(body),
        vec![("201", "made", made), ("200", "a retried create", retried)],
    );
    let answer = r.json::<SandboxList>();
    let query = [
        ("state", "running or paused"),
        (
            "metadata.KEY",
            "only sandboxes whose metadata has KEY with this value (any number of them)",
        ),
    ];
    r.add(
        Get,
        "/v1/sandboxes",
        crate::serve::sandbox_routes::list_sandboxes,
        "the sandboxes, oldest first, filtered by state and metadata",
        &query,
        None,
        vec![("200", "the sandboxes", answer)],
    );
    let answer = r.json::<SandboxView>();
    r.add(
        Get,
        "/v1/sandboxes/{id}",
        crate::serve::sandbox_routes::get_sandbox,
        "one sandbox",
        &[],
        None,
        vec![("200", "the sandbox", answer)],
    );
    let answer = r.json::<Deleted>();
    r.add(
        Delete,
        "/v1/sandboxes/{id}",
        crate::serve::sandbox_routes::delete_sandbox,
        "delete a sandbox (its VM stops now)",
        &[],
        None,
        vec![("200", "deleted", answer)],
    );
    let (body, answer) = (r.json::<SandboxExec>(), r.json::<CommandOutput>());
    r.add(
        Post,
        "/v1/sandboxes/{id}/exec",
        crate::serve::sandbox_routes::exec,
        "run a command",
        &[],
        Some(body),
        vec![("200", "how it ended", answer)],
    );
}

pub(super) fn sandbox_state_routes(r: &mut Routes) {
    use HttpMethod::Post;
    let body = r.json::<SandboxExec>();
    r.json::<StreamData>();
    r.json::<StreamError>();
    r.json::<engine::guest::CommandEnd>();
    r.add(Post, "/v1/sandboxes/{id}/exec/stream", crate::serve::sandbox_routes::exec_stream, "run a command, its output as server-sent events (stdout, stderr: StreamData; exit: CommandEnd; error: StreamError)", &[], Some(body), vec![("200", "events", Body::Raw("text/event-stream"))]);
    use service::sandbox::sandboxes::lifetimes::BranchRequest;
    let (body, answer) = (r.json::<BranchRequest>(), r.json::<SandboxBranched>());
    r.add(
        Post,
        "/v1/sandboxes/{id}/branch",
        crate::serve::sandbox_routes::branch,
        "new sandboxes from this one's state: one (no body), or count of them, all or none",
        &[],
        Some(body),
        vec![("201", "the branch, or the list of them", answer)],
    );
    let answer = r.json::<EntryView>();
    let query = [("path", "an absolute guest path")];
    r.add(
        HttpMethod::Get,
        "/v1/sandboxes/{id}/stat",
        crate::serve::sandbox_routes::stat,
        "a path's facts, without running a command (links are not followed)",
        &query,
        None,
        vec![("200", "the path", answer)],
    );
    let answer = r.json::<FolderListing>();
    let query = [
        ("path", "an absolute guest folder"),
        ("max", "entries at most (default 1000, 1-10000)"),
    ];
    r.add(
        HttpMethod::Get,
        "/v1/sandboxes/{id}/entries",
        crate::serve::sandbox_routes::entries,
        "a folder's entries by name, without running a command",
        &query,
        None,
        vec![("200", "the listing", answer)],
    );
}

/// A sandbox's lifetime: its timeout, pause and resume, checkpoint, reset and snapshot.
pub(super) fn sandbox_lifetime_routes(r: &mut Routes) {
    use service::sandbox::sandboxes::lifetimes::TimeoutRequest;
    use HttpMethod::Post;
    let (body, answer) = (r.json::<TimeoutRequest>(), r.json::<SandboxView>());
    r.add(
        Post,
        "/v1/sandboxes/{id}/timeout",
        crate::serve::sandbox_routes::set_timeout,
        "new idle timeout and lifetime, within the service's caps",
        &[],
        Some(body),
        vec![("200", "the sandbox", answer)],
    );
    let answer = r.json::<SandboxView>();
    r.add(
        Post,
        "/v1/sandboxes/{id}/pause",
        crate::serve::sandbox_routes::pause,
        "save it to disk and stop its VM",
        &[],
        None,
        vec![("200", "the sandbox", answer)],
    );
    let answer = r.json::<SandboxView>();
    r.add(
        Post,
        "/v1/sandboxes/{id}/checkpoint",
        crate::serve::sandbox_routes::checkpoint,
        "save its state for a restart of the service; it runs on",
        &[],
        None,
        vec![("200", "the sandbox", answer)],
    );
    let answer = r.json::<SandboxView>();
    let resume = r.json::<service::sandbox::sandboxes::kept::ResumeRequest>();
    r.add(
        Post,
        "/v1/sandboxes/{id}/resume",
        crate::serve::sandbox_routes::resume,
        "fork it again from its saved state, handed back once it has what `keep` (or its create's) names",
        &[],
        Some(resume),
        vec![("200", "the sandbox", answer)],
    );
    let answer = r.json::<service::wire::SandboxReset>();
    r.add(
        Post,
        "/v1/sandboxes/{id}/reset", crate::serve::sandbox_routes::reset,
        "back to its environment's snapshot, same id: files, processes, memory and disk as the environment made them, a new identity; in place (the same VM, exactly) where it can be",
        &[],
        None,
        vec![("200", "the sandbox and how it was reset", answer)]);
    let answer = r.json::<EnvironmentView>();
    r.add(
        Post,
        "/v1/sandboxes/{id}/snapshot",
        crate::serve::sandbox_routes::snapshot,
        "a new environment of this sandbox's state",
        &[],
        None,
        vec![("201", "the environment", answer)],
    );
}

/// A Dockerfile's build context, at most `MAX_CONTEXT_BYTES`.
pub(super) fn context_routes(r: &mut Routes) {
    let answer = r.json::<Uploaded>();
    r.add(
        HttpMethod::Post,
        "/v1/contexts",
        crate::serve::sandbox_routes::upload_context,
        "upload a Dockerfile build context (a tar archive)",
        &[],
        Some(Body::Raw("application/x-tar")),
        vec![("201", "the context", answer)],
    );
}

pub(super) fn file_routes(r: &mut Routes) {
    use HttpMethod::{Get, Put};
    let path_query = [
        ("path", "an absolute guest path"),
        ("mode", "octal file mode (default 644)"),
    ];
    let written = r.json::<FileWritten>();
    r.add(
        Put,
        "/v1/sandboxes/{id}/files",
        crate::serve::sandbox_routes::write_file,
        "upload (a folder as a tar archive)",
        &path_query,
        Some(Body::Raw("application/octet-stream")),
        vec![("200", "written", written)],
    );
    r.add(
        Get,
        "/v1/sandboxes/{id}/files",
        crate::serve::sandbox_routes::read_file,
        "download (a folder as a tar archive)",
        &path_query[..1],
        None,
        vec![("200", "the bytes", Body::Raw("application/octet-stream"))],
    );
    let written = r.json::<FileWritten>();
    r.add(
        Put,
        "/v1/sandboxes/{id}/folders",
        crate::serve::sandbox_routes::write_folder,
        "upload (a folder as a tar archive)",
        &path_query,
        Some(Body::Raw("application/x-tar")),
        vec![("200", "written", written)],
    );
    r.add(
        Get,
        "/v1/sandboxes/{id}/folders",
        crate::serve::sandbox_routes::read_folder,
        "download (a folder as a tar archive)",
        &path_query[..1],
        None,
        vec![("200", "the bytes", Body::Raw("application/x-tar"))],
    );
}

/// Routes whose messages other clients define: OpenEnv's and MCP's.
pub(super) fn protocol_routes(r: &mut Routes) {
    use HttpMethod::{Get, Post};
    let message = || Body::Raw("application/json");
    r.add(
        Get,
        "/v1/openapi.json",
        crate::serve::routes::document_route,
        "this document",
        &[],
        None,
        vec![("200", "the document", Body::Raw("application/json"))],
    );
    r.add(
        Post,
        "/v1/sessions/{id}/mcp",
        crate::serve::mcp::message,
        "MCP (JSON-RPC 2.0 over HTTP POST) for the agent in a session",
        &[],
        Some(message()),
        vec![("200", "a JSON-RPC answer", message())],
    );
    // MCP's streams are not served here: GET and DELETE say so, and are no operations.
    r.undocumented(Get, "/v1/sessions/{id}/mcp", crate::serve::mcp::not_here);
    r.undocumented(HttpMethod::Delete, "/v1/sessions/{id}/mcp", crate::serve::mcp::not_here);
    r.add(
        Get,
        "/v1/openenv/health",
        crate::serve::openenv::health,
        "OpenEnv: health",
        &[],
        None,
        vec![("200", "healthy", message())],
    );
    r.add(
        Get,
        "/v1/openenv/metadata",
        crate::serve::openenv::metadata,
        "OpenEnv: the environment's metadata",
        &[],
        None,
        vec![("200", "metadata", message())],
    );
    r.add(
        Get,
        "/v1/openenv/schema",
        crate::serve::openenv::schema_route,
        "OpenEnv: action and observation schemas",
        &[],
        None,
        vec![("200", "schemas", message())],
    );
    r.add(
        Get,
        "/v1/openenv/ws",
        crate::serve::openenv::socket,
        "OpenEnv: an episode over a WebSocket (reset, step, state, close)",
        &[],
        None,
        vec![("101", "switching to the WebSocket", message())],
    );
}

pub(super) fn sandbox_network_routes(r: &mut Routes) {
    let (body, answer) = (
        r.json::<service::sandbox::sandboxes::NetworkChange>(),
        r.json::<SandboxView>(),
    );
    r.add(
        HttpMethod::Post,
        "/v1/sandboxes/{id}/network", crate::serve::sandbox_routes::set_network,
        "move it, live, to a stricter named policy (one serve.sandboxes.tighten lists after its own) or to none (null): connections the new policy would not open are cut",
        &[],
        Some(body),
        vec![("200", "the sandbox", answer)]);
}
