//! The routes of what a sandbox hosts (its background processes, their output, its terminal,
//! its open ports): which request type each takes and which answer type it gives.

use utoipa::openapi::path::HttpMethod;

use super::{Body, Doc};
use service::wire::*;

pub(super) fn process_routes(doc: &mut Doc) {
    use service::sandbox::sandboxes::processes::ProcessStart;
    use HttpMethod::{Get, Post};
    let (body, answer) = (doc.json::<ProcessStart>(), doc.json::<ProcessView>());
    let summary = "start a background process (it outlives the request, and dies with the sandbox)";
    doc.route(
        Post,
        "/v1/sandboxes/{id}/processes",
        summary,
        &[],
        Some(body),
        vec![("201", "its handle", answer)],
    );
    let answer = doc.json::<ProcessList>();
    doc.route(
        Get,
        "/v1/sandboxes/{id}/processes",
        "every background process",
        &[],
        None,
        vec![("200", "the processes", answer)],
    );
    let answer = doc.json::<ProcessView>();
    doc.route(
        Get,
        "/v1/sandboxes/{id}/processes/{pid}",
        "one process",
        &[],
        None,
        vec![("200", "its handle", answer)],
    );
}

pub(super) fn process_output_routes(doc: &mut Doc) {
    use service::sandbox::sandboxes::processes::{SignalSend, StdinWrite};
    use HttpMethod::{Get, Post};
    let query = [
        ("stream", "stdout (default) or stderr"),
        ("offset", "the first byte (default 0)"),
        ("max", "bytes at most (default 1 MiB, at most 4 MiB)"),
        ("wait", "seconds to wait for a byte past the offset (0-300)"),
    ];
    let answer = doc.json::<OutputChunk>();
    doc.route(
        Get,
        "/v1/sandboxes/{id}/processes/{pid}/output",
        "its output from an offset",
        &query,
        None,
        vec![("200", "a chunk", answer)],
    );
    let query = [
        ("stdout", "the offset to follow stdout from"),
        ("stderr", "the offset to follow stderr from"),
    ];
    let summary =
        "follow its output as server-sent events (stdout, stderr: OutputChunk; exit: ProcessView; error: StreamError)";
    doc.route(
        Get,
        "/v1/sandboxes/{id}/processes/{pid}/output/stream",
        summary,
        &query,
        None,
        vec![("200", "events", Body::Raw("text/event-stream"))],
    );
    let (body, answer) = (doc.json::<StdinWrite>(), doc.json::<ProcessView>());
    doc.route(
        Post,
        "/v1/sandboxes/{id}/processes/{pid}/stdin",
        "write to its standard input, and close it",
        &[],
        Some(body),
        vec![("200", "its handle", answer)],
    );
    let (body, answer) = (doc.json::<SignalSend>(), doc.json::<ProcessView>());
    doc.route(
        Post,
        "/v1/sandboxes/{id}/processes/{pid}/signal",
        "send its process group a signal",
        &[],
        Some(body),
        vec![("200", "its handle", answer)],
    );
    let answer = doc.json::<ProcessView>();
    let query = [("timeout", "seconds to wait for its end (default 60, at most 300)")];
    doc.route(
        Post,
        "/v1/sandboxes/{id}/processes/{pid}/wait",
        "wait for its end",
        &query,
        None,
        vec![("200", "its handle (exited, or running past the timeout)", answer)],
    );
}

/// A terminal: its size, and its WebSocket.
pub(super) fn terminal_routes(doc: &mut Doc) {
    use crate::serve::pty::{PtyControl, PtyEvent};
    use service::sandbox::sandboxes::processes::PtySize;
    use HttpMethod::{Get, Post};
    let (body, answer) = (doc.json::<PtySize>(), doc.json::<ProcessView>());
    doc.route(
        Post,
        "/v1/sandboxes/{id}/processes/{pid}/resize",
        "resize its terminal",
        &[],
        Some(body),
        vec![("200", "its handle", answer)],
    );
    let query = [
        ("rows", "the terminal's rows (default 24, 1-1000)"),
        ("cols", "the terminal's columns (default 80, 1-1000)"),
        (
            "command",
            "a shell command line to run (default: a login shell, bash when there is one)",
        ),
        ("cwd", "its working folder"),
        ("user", "the user to run it as"),
        ("pid", "attach to this background process's terminal instead"),
        ("offset", "attaching: the output offset to replay from (default 0)"),
        (
            "keep",
            "keep the program running when the socket closes (default false: it is hung up on)",
        ),
    ];
    let _ = doc.json::<PtyControl>();
    let summary = "a terminal over a WebSocket: binary messages are its bytes both ways; text messages are the client's PtyControl and the service's PtyEvent";
    let answer = doc.json::<PtyEvent>();
    doc.route(
        Get,
        "/v1/sandboxes/{id}/pty",
        summary,
        &query,
        None,
        vec![("101", "switching to the WebSocket", answer)],
    );
}

pub(super) fn port_routes(doc: &mut Doc) {
    use crate::serve::hosting_routes::PortOpen;
    use HttpMethod::{Delete, Get, Post};
    let (body, answer) = (doc.json::<PortOpen>(), doc.json::<PortView>());
    let summary = "open a guest port to clients: its URL and token (the port listener proxies HTTP and WebSockets to the guest's 127.0.0.1:PORT)";
    doc.route(
        Post,
        "/v1/sandboxes/{id}/ports",
        summary,
        &[],
        Some(body),
        vec![("201", "the open port", answer)],
    );
    let answer = doc.json::<PortList>();
    doc.route(
        Get,
        "/v1/sandboxes/{id}/ports",
        "its open ports",
        &[],
        None,
        vec![("200", "the ports", answer)],
    );
    let answer = doc.json::<PortList>();
    doc.route(
        Delete,
        "/v1/sandboxes/{id}/ports/{port}",
        "close a port (its token stops working)",
        &[],
        None,
        vec![("200", "the ports left open", answer)],
    );
}
