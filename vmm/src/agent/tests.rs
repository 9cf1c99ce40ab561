//! The agent client against a scripted fake guest on an in-memory duplex stream: no VM.
use super::*;
use farm_protocol::{decode_header, AgentError as WireError, ErrorKind};
use tokio::io::{duplex, DuplexStream};

/// A fake guest: reads request frames, answers through `respond`.
fn client_with_guest() -> (AgentClient, DuplexStream) {
    let (host, guest) = duplex(1 << 20);
    let (read, write) = tokio::io::split(host);
    (AgentClient::new(read, write, 1 << 24), guest)
}

/// Runs one client call on its own task, so the test can play the guest meanwhile.
fn spawn_call<T, F, Fut>(client: &AgentClient, call: F) -> tokio::task::JoinHandle<T>
where
    F: FnOnce(AgentClient) -> Fut,
    Fut: std::future::Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    tokio::spawn(call(client.clone()))
}

async fn next_request(guest: &mut DuplexStream) -> (Envelope<Request>, Vec<u8>) {
    let (header, body) = read_frame(guest, 1 << 24).await.unwrap();
    (decode_header(&header).unwrap(), body)
}

async fn send(guest: &mut DuplexStream, id: u64, msg: Response, body: &[u8]) {
    guest
        .write_all(&encode_frame(
            &Envelope {
                v: PROTOCOL_VERSION,
                id,
                msg,
            },
            body,
        ))
        .await
        .unwrap();
}

fn exec_result(out: u64, err: u64) -> Response {
    Response::Exec(ExecResult {
        exit_code: Some(0),
        signal: None,
        timed_out: false,
        stdout_len: out,
        stderr_len: err,
        stdout_truncated: false,
        stderr_truncated: false,
        duration_us: 1,
    })
}

#[tokio::test]
async fn exec_splits_body_into_stdout_and_stderr() {
    let (client, mut guest) = client_with_guest();
    let call = spawn_call(
        &client,
        |client| async move { client.exec(ExecOptions::argv(&["x"])).await },
    );
    let (req, _) = next_request(&mut guest).await;
    send(&mut guest, req.id, exec_result(3, 2), b"outer").await;
    let out = call.await.unwrap().unwrap();
    assert_eq!(out.stdout, b"out");
    assert_eq!(out.stderr, b"er");
}

#[tokio::test]
async fn responses_out_of_order_reach_their_requests() {
    let (client, mut guest) = client_with_guest();
    let a = spawn_call(&client, |c| async move { c.read_file("/a", 10).await });
    let b = spawn_call(&client, |c| async move { c.read_file("/b", 10).await });
    let (first, _) = next_request(&mut guest).await;
    let (second, _) = next_request(&mut guest).await;
    let path_of = |r: &Envelope<Request>| match &r.msg {
        Request::ReadFile(f) => f.path.clone(),
        _ => panic!(),
    };
    send(
        &mut guest,
        second.id,
        Response::ReadFile {
            size: 1,
            truncated: false,
        },
        path_of(&second).as_bytes(),
    )
    .await;
    send(
        &mut guest,
        first.id,
        Response::ReadFile {
            size: 1,
            truncated: false,
        },
        path_of(&first).as_bytes(),
    )
    .await;
    assert_eq!(a.await.unwrap().unwrap().0, b"/a");
    assert_eq!(b.await.unwrap().unwrap().0, b"/b");
}

#[tokio::test]
async fn oversized_frame_closes_the_channel_and_fails_pending_requests() {
    let (client, mut guest) = client_with_guest();
    let call = spawn_call(&client, |c| async move { c.ping().await });
    let _ = next_request(&mut guest).await;
    // Announce a 1 GiB frame; the client must refuse without allocating or waiting.
    guest.write_all(&farm_protocol::MAGIC).await.unwrap();
    guest.write_all(&(1u32 << 30).to_be_bytes()).await.unwrap();
    guest.write_all(&4u32.to_be_bytes()).await.unwrap();
    let err = call.await.unwrap().unwrap_err();
    assert!(
        matches!(&err, AgentError::ChannelClosed(r) if r.contains("exceeds the limit")),
        "{err}"
    );
    // Later requests fail at once.
    assert!(matches!(client.ping().await, Err(AgentError::ChannelClosed(_))));
}

#[tokio::test]
async fn garbage_and_truncation_are_errors_not_hangs() {
    for garbage in [
        &b"FRM1\x00\x00\x00\x10\x00\x00\x00\x0cnot json!!!!"[..],
        b"FRM1\x00\x00\x00\x40\x00\x00",
        b"HTTP/1.1 200 OK\r\n",
    ] {
        let (client, mut guest) = client_with_guest();
        let call = spawn_call(&client, |c| async move { c.ping().await });
        let _ = next_request(&mut guest).await;
        guest.write_all(garbage).await.unwrap();
        drop(guest); // close mid-frame in the second case
        let err = call.await.unwrap().unwrap_err();
        assert!(matches!(err, AgentError::ChannelClosed(_)), "{err}");
    }
}

#[tokio::test]
async fn silent_guest_times_out() {
    let (client, _guest) = client_with_guest();
    let err = client.exec(ExecOptions {
        timeout: Some(Duration::from_millis(1)),
        ..ExecOptions::argv(&["x"])
    });
    tokio::time::pause();
    let err = err.await.unwrap_err();
    assert!(matches!(err, AgentError::Timeout { op: "exec", .. }), "{err}");
}

#[tokio::test]
async fn lying_headers_fail_only_that_request() {
    let (client, mut guest) = client_with_guest();
    let call = spawn_call(&client, |c| async move { c.exec(ExecOptions::argv(&["x"])).await });
    let (req, _) = next_request(&mut guest).await;
    send(&mut guest, req.id, exec_result(100, 0), b"short").await;
    let err = call.await.unwrap().unwrap_err();
    assert!(matches!(err, AgentError::BadResponse { op: "exec", .. }), "{err}");
    // Output beyond the requested cap is refused too.
    let call = spawn_call(&client, |c| async move {
        c.exec(ExecOptions {
            stdout_cap: 2,
            ..ExecOptions::argv(&["x"])
        })
        .await
    });
    let (req, _) = next_request(&mut guest).await;
    send(&mut guest, req.id, exec_result(5, 0), b"12345").await;
    assert!(matches!(call.await.unwrap(), Err(AgentError::BadResponse { .. })));
    // The channel still works.
    let call = spawn_call(&client, |c| async move { c.quiesce().await });
    let (req, _) = next_request(&mut guest).await;
    send(&mut guest, req.id, Response::Quiesce, b"").await;
    call.await.unwrap().unwrap();
}

#[tokio::test]
async fn caps_larger_than_a_response_can_carry_are_refused_up_front() {
    let (client, _guest) = client_with_guest();
    let err = client
        .exec(ExecOptions {
            stdout_cap: 1 << 30,
            ..ExecOptions::argv(&["x"])
        })
        .await
        .unwrap_err();
    assert!(matches!(err, AgentError::InvalidRequest { op: "exec", .. }), "{err}");
}

#[tokio::test]
async fn unsolicited_frames_are_counted_and_dropped() {
    let (client, mut guest) = client_with_guest();
    for id in 100..110 {
        send(&mut guest, id, Response::Quiesce, b"").await;
    }
    let call = spawn_call(&client, |c| async move { c.quiesce().await });
    let (req, _) = next_request(&mut guest).await;
    send(&mut guest, req.id, Response::Quiesce, b"").await;
    call.await.unwrap().unwrap();
    assert_eq!(client.unsolicited_frames(), 10);
}

#[tokio::test]
async fn agent_errors_are_reported_with_their_kind() {
    let (client, mut guest) = client_with_guest();
    let call = spawn_call(&client, |c| async move { c.exec(ExecOptions::argv(&["nope"])).await });
    let (req, _) = next_request(&mut guest).await;
    let error = WireError {
        kind: ErrorKind::Spawn,
        message: "not found".into(),
    };
    send(&mut guest, req.id, Response::Error(error), b"").await;
    let err = call.await.unwrap().unwrap_err();
    assert!(
        matches!(
            err,
            AgentError::Refused {
                kind: ErrorKind::Spawn,
                ..
            }
        ),
        "{err}"
    );
}

#[tokio::test]
async fn announced_agent_becomes_ready_without_waiting_for_ping_retries() {
    let (client, mut guest) = client_with_guest();
    let wait = spawn_call(&client, |c| async move { c.wait_ready(Duration::from_secs(30)).await });
    let pong = Pong {
        protocol_version: PROTOCOL_VERSION,
        agent_version: "t".into(),
        uptime_secs: 0.0,
    };
    send(&mut guest, 0, Response::Pong(pong.clone()), b"").await;
    // Answer pings until wait_ready returns.
    loop {
        let (req, _) = next_request(&mut guest).await;
        send(&mut guest, req.id, Response::Pong(pong.clone()), b"").await;
        if wait.is_finished() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        if wait.is_finished() {
            break;
        }
    }
    assert_eq!(wait.await.unwrap().unwrap().agent_version, "t");
}
