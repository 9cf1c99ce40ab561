//! The routes of what a sandbox hosts (its background processes, their output, its terminal,
//! its open ports): which request type each takes and which answer type it gives.

use utoipa::openapi::path::HttpMethod;

use super::{Body, Routes};
use service::wire::*;

pub(super) fn process_routes(r: &mut Routes) {
    use service::sandbox::sandboxes::processes::ProcessStart;
    use HttpMethod::{Get, Post};
    let (body, answer) = (r.json::<ProcessStart>(), r.json::<ProcessView>());
    let summary = "start a background process (it outlives the request, and dies with the sandbox)";
    r.add(
        Post,
        "/v1/sandboxes/{id}/processes",
        crate::serve::hosting_routes::start,
        summary,
        &[],
        Some(body),
        vec![("201", "its handle", answer)],
    );
    let answer = r.json::<ProcessList>();
    r.add(
        Get,
        "/v1/sandboxes/{id}/processes",
        crate::serve::hosting_routes::list,
        "every background process",
        &[],
        None,
        vec![("200", "the processes", answer)],
    );
    let answer = r.json::<ProcessView>();
    r.add(
        Get,
        "/v1/sandboxes/{id}/processes/{pid}",
        crate::serve::hosting_routes::one,
        "one process",
        &[],
        None,
        vec![("200", "its handle", answer)],
    );
}

pub(super) fn process_output_routes(r: &mut Routes) {
    use service::sandbox::sandboxes::processes::{SignalSend, StdinWrite};
    use HttpMethod::{Get, Post};
    let query = [
        ("stream", "stdout (default) or stderr"),
        ("offset", "the first byte (default 0)"),
        ("max", "bytes at most (default 1 MiB, at most 4 MiB)"),
        ("wait", "seconds to wait for a byte past the offset (0-300)"),
    ];
    let answer = r.json::<OutputChunk>();
    r.add(
        Get,
        "/v1/sandboxes/{id}/processes/{pid}/output",
        crate::serve::hosting_routes::output,
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
    r.add(
        Get,
        "/v1/sandboxes/{id}/processes/{pid}/output/stream",
        crate::serve::hosting_routes::follow,
        summary,
        &query,
        None,
        vec![("200", "events", Body::Raw("text/event-stream"))],
    );
    let (body, answer) = (r.json::<StdinWrite>(), r.json::<ProcessView>());
    r.add(
        Post,
        "/v1/sandboxes/{id}/processes/{pid}/stdin",
        crate::serve::hosting_routes::stdin,
        "write to its standard input, and close it",
        &[],
        Some(body),
        vec![("200", "its handle", answer)],
    );
    let (body, answer) = (r.json::<SignalSend>(), r.json::<ProcessView>());
    r.add(
        Post,
        "/v1/sandboxes/{id}/processes/{pid}/signal",
        crate::serve::hosting_routes::signal,
        "send its process group a signal",
        &[],
        Some(body),
        vec![("200", "its handle", answer)],
    );
    let answer = r.json::<ProcessView>();
    let query = [("timeout", "seconds to wait for its end (default 60, at most 300)")];
    r.add(
        Post,
        "/v1/sandboxes/{id}/processes/{pid}/wait",
        crate::serve::hosting_routes::wait,
        "wait for its end",
        &query,
        None,
        vec![("200", "its handle (exited, or running past the timeout)", answer)],
    );
}

/// A terminal: its size, and its WebSocket.
pub(super) fn terminal_routes(r: &mut Routes) {
    use crate::serve::pty::{PtyControl, PtyEvent};
    use service::sandbox::sandboxes::processes::PtySize;
    use HttpMethod::{Get, Post};
    let (body, answer) = (r.json::<PtySize>(), r.json::<ProcessView>());
    r.add(
        Post,
        "/v1/sandboxes/{id}/processes/{pid}/resize",
        crate::serve::hosting_routes::resize,
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
    let _ = r.json::<PtyControl>();
    let summary = "a terminal over a WebSocket: binary messages are its bytes both ways; text messages are the client's PtyControl and the service's PtyEvent";
    let answer = r.json::<PtyEvent>();
    r.add(
        Get,
        "/v1/sandboxes/{id}/pty",
        crate::serve::pty::open,
        summary,
        &query,
        None,
        vec![("101", "switching to the WebSocket", answer)],
    );
}

pub(super) fn port_routes(r: &mut Routes) {
    use crate::serve::hosting_routes::PortOpen;
    use HttpMethod::{Delete, Get, Post};
    let (body, answer) = (r.json::<PortOpen>(), r.json::<PortView>());
    let summary = "open a guest port to clients: its URL and token (the port listener proxies HTTP and WebSockets to the guest's 127.0.0.1:PORT)";
    r.add(
        Post,
        "/v1/sandboxes/{id}/ports",
        crate::serve::hosting_routes::open_port,
        summary,
        &[],
        Some(body),
        vec![("201", "the open port", answer)],
    );
    let answer = r.json::<PortList>();
    r.add(
        Get,
        "/v1/sandboxes/{id}/ports",
        crate::serve::hosting_routes::ports,
        "its open ports",
        &[],
        None,
        vec![("200", "the ports", answer)],
    );
    let answer = r.json::<PortList>();
    r.add(
        Delete,
        "/v1/sandboxes/{id}/ports/{port}",
        crate::serve::hosting_routes::close_port,
        "close a port (its token stops working)",
        &[],
        None,
        vec![("200", "the ports left open", answer)],
    );
}
