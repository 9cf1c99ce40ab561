//! E2B's protocol (`crate::serve::e2b`): its REST API and envd's routes in a sandbox.

use utoipa::openapi::path::HttpMethod::{Delete, Get, Post};

use axum::handler::Handler;

use super::{Body, Routes};
use crate::serve::e2b::connect::STREAM_TYPE;
use crate::serve::e2b::{control, envd, filesystem, interpreter, volumes, watch};
use crate::serve::http::App;

/// E2B's REST API and envd's routes, each body of E2B's shape.
pub(super) fn e2b_routes(r: &mut Routes) {
    control_routes(r);
    envd_routes(r);
    envd_rpc_routes(r);
    filesystem_rpc_routes(r);
    interpreter_routes(r);
}

/// E2B's REST API.
// Long: one declaration per route of E2B's API, read as a table.
fn control_routes(r: &mut Routes) {
    let json = || Body::Raw("application/json");
    let created = || vec![("201", "E2B's Sandbox", json())];
    let sandbox = || vec![("200", "E2B's Sandbox", json())];
    let none = || vec![("204", "done", Body::Raw("text/plain"))];
    for path in ["/v2/sandboxes", "/sandboxes"] {
        r.add(
            Post,
            path,
            control::create,
            "E2B: create a sandbox",
            &[],
            Some(json()),
            created(),
        );
        r.add(
            Get,
            path,
            control::list,
            "E2B: list sandboxes",
            &[("metadata", "k=v&..."), ("state", "running,paused")],
            None,
            vec![("200", "E2B's ListedSandbox list", json())],
        );
    }
    for path in ["/v2/sandboxes/{id}/connect", "/sandboxes/{id}/connect"] {
        r.add(
            Post,
            path,
            control::connect,
            "E2B: connect (resumes a paused sandbox)",
            &[],
            Some(json()),
            sandbox(),
        );
    }
    r.add(
        Get,
        "/sandboxes/{id}",
        control::info,
        "E2B: a sandbox's detail",
        &[],
        None,
        sandbox(),
    );
    r.add(
        Delete,
        "/sandboxes/{id}",
        control::kill,
        "E2B: kill a sandbox",
        &[],
        None,
        none(),
    );
    r.add(
        Post,
        "/sandboxes/{id}/timeout",
        control::set_timeout,
        "E2B: end it this many seconds from now",
        &[],
        Some(json()),
        none(),
    );
    r.add(
        Post,
        "/sandboxes/{id}/pause",
        control::pause,
        "E2B: pause a sandbox",
        &[],
        Some(json()),
        none(),
    );
    r.add(
        Post,
        "/sandboxes/{id}/fork",
        control::fork,
        "E2B: fork (farm's branch) a sandbox count times",
        &[],
        Some(json()),
        vec![("201", "E2B's fork results", json())],
    );
    r.add(
        Post,
        "/volumes",
        volumes::create,
        "E2B: create a volume (farm's workspace)",
        &[],
        Some(json()),
        created(),
    );
    r.add(
        Get,
        "/volumes",
        volumes::list,
        "E2B: list volumes",
        &[],
        None,
        vec![("200", "E2B's volumes", json())],
    );
    r.add(
        Get,
        "/volumes/{id}",
        volumes::get,
        "E2B: a volume",
        &[],
        None,
        vec![("200", "E2B's volume", json())],
    );
    r.add(
        Delete,
        "/volumes/{id}",
        volumes::destroy,
        "E2B: destroy a volume no sandbox holds",
        &[],
        None,
        none(),
    );
    r.add(
        Post,
        "/sandboxes/{id}/snapshots",
        control::snapshot,
        "E2B: a snapshot (farm's), the template of later creates",
        &[],
        Some(json()),
        vec![("201", "E2B's SnapshotInfo", json())],
    );
}

/// envd's plain HTTP routes and its process stream, in a sandbox.
fn envd_routes(r: &mut Routes) {
    let json = || Body::Raw("application/json");
    let none = || vec![("204", "done", Body::Raw("text/plain"))];
    r.add(
        Get,
        "/health",
        envd::health,
        "E2B envd (E2b-Sandbox-Id, X-Access-Token): health",
        &[],
        None,
        none(),
    );
    r.add(
        Get,
        "/files",
        envd::download,
        "E2B envd: read a file",
        &[("path", "the file")],
        None,
        vec![("200", "its bytes", Body::Raw("application/octet-stream"))],
    );
    r.add(
        Post,
        "/files",
        envd::upload,
        "E2B envd: write files (multipart, or one octet-stream)",
        &[("path", "where")],
        Some(Body::Raw("multipart/form-data")),
        vec![("200", "what was written", json())],
    );
    stream(
        r,
        "/process.Process/Start",
        envd::process_stream,
        "E2B envd, Connect RPC: start a process and stream its events",
    );
    stream(
        r,
        "/process.Process/Connect",
        envd::process_stream,
        "E2B envd, Connect RPC: a running process's events from now on",
    );
}

/// envd's unary Connect RPCs, in a sandbox (JSON in, JSON out).
fn envd_rpc_routes(r: &mut Routes) {
    rpc(
        r,
        "/process.Process/Update",
        envd::update,
        "E2B envd, Connect RPC: resize a terminal",
    );
    rpc(
        r,
        "/process.Process/List",
        envd::list_processes,
        "E2B envd, Connect RPC: running processes",
    );
    rpc(
        r,
        "/process.Process/SendSignal",
        envd::send_signal,
        "E2B envd, Connect RPC: signal a process",
    );
    rpc(
        r,
        "/process.Process/SendInput",
        envd::send_input,
        "E2B envd, Connect RPC: a process's standard input",
    );
}

/// envd's filesystem RPCs, in a sandbox (JSON in, JSON out).
fn filesystem_rpc_routes(r: &mut Routes) {
    rpc(
        r,
        "/filesystem.Filesystem/Stat",
        filesystem::stat,
        "E2B envd, Connect RPC: a path's entry",
    );
    rpc(
        r,
        "/filesystem.Filesystem/ListDir",
        filesystem::list_dir,
        "E2B envd, Connect RPC: a folder's entries",
    );
    rpc(
        r,
        "/filesystem.Filesystem/MakeDir",
        filesystem::make_dir,
        "E2B envd, Connect RPC: make a folder",
    );
    rpc(
        r,
        "/filesystem.Filesystem/Remove",
        filesystem::remove,
        "E2B envd, Connect RPC: remove a path",
    );
    rpc(
        r,
        "/filesystem.Filesystem/Move",
        filesystem::rename,
        "E2B envd, Connect RPC: move a path",
    );
    rpc(
        r,
        "/filesystem.Filesystem/CreateWatcher",
        watch::create,
        "E2B envd, Connect RPC: watch a folder",
    );
    rpc(
        r,
        "/filesystem.Filesystem/GetWatcherEvents",
        watch::events,
        "E2B envd, Connect RPC: a watcher's events since its last poll",
    );
    rpc(
        r,
        "/filesystem.Filesystem/RemoveWatcher",
        watch::remove,
        "E2B envd, Connect RPC: stop watching",
    );
    stream(
        r,
        "/filesystem.Filesystem/WatchDir",
        watch::stream,
        "E2B envd, Connect RPC: a folder's changes as a stream",
    );
}

/// E2B's code interpreter in a sandbox (`E2b-Sandbox-Port: 49999`).
fn interpreter_routes(r: &mut Routes) {
    let json = || Body::Raw("application/json");
    let context = || vec![("200", "{id, language, cwd}", json())];
    r.add(
        Post,
        "/execute",
        interpreter::execute,
        "E2B code interpreter: run code in a context's kernel, its output as lines of JSON",
        &[],
        Some(json()),
        vec![(
            "200",
            "the run's output, a JSON object a line",
            Body::Raw("application/x-ndjson"),
        )],
    );
    r.add(
        Post,
        "/contexts",
        interpreter::create_context,
        "E2B code interpreter: a new context (a kernel of its own)",
        &[],
        Some(json()),
        context(),
    );
    r.add(
        Get,
        "/contexts",
        interpreter::list_contexts,
        "E2B code interpreter: the contexts",
        &[],
        None,
        vec![("200", "[{id, language, cwd}]", json())],
    );
    r.add(
        Delete,
        "/contexts/{context}",
        interpreter::remove_context,
        "E2B code interpreter: remove a context",
        &[],
        None,
        vec![("200", "removed", json())],
    );
    r.add(
        Post,
        "/contexts/{context}/restart",
        interpreter::restart_context,
        "E2B code interpreter: a context's kernel anew",
        &[],
        None,
        vec![("200", "restarted", json())],
    );
}

/// A unary Connect RPC: JSON in, JSON out.
fn rpc<H: Handler<T, App>, T: 'static>(r: &mut Routes, path: &str, handler: H, summary: &str) {
    let json = || Body::Raw("application/json");
    r.add(
        Post,
        path,
        handler,
        summary,
        &[],
        Some(json()),
        vec![("200", "its JSON answer", json())],
    );
}

/// A server-streaming Connect RPC: one enveloped request, the events enveloped.
fn stream<H: Handler<T, App>, T: 'static>(r: &mut Routes, path: &str, handler: H, summary: &str) {
    let events = vec![("200", "the events, enveloped", Body::Raw(STREAM_TYPE))];
    r.add(Post, path, handler, summary, &[], Some(Body::Raw(STREAM_TYPE)), events);
}
