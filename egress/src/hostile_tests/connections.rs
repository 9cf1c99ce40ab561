//! Connections that end on the host's side are forgotten by the VM's port. A guest answers a
//! close of the host's with nothing (it has nothing left to close), so a port that waited for
//! the guest's word would count every such connection forever and, past its limit, refuse the
//! guest's next connection and the host's next connection into the guest (a sandbox's open
//! port) alike.

use super::*;

/// More than the port's limit of connections open at once on each side.
const MANY: u32 = 600;

#[tokio::test]
async fn a_guests_connections_that_the_upstream_closes_are_forgotten() {
    let (port, executed) = naive_upstream().await;
    let (policy, _) = policy(&[], &[&format!("127.0.0.1:{port}")]);
    let guest = Guest::start(policy);
    for conn in 1..=MANY {
        let head = format!("GET http://127.0.0.1:{port}/{conn} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        let mut connection = guest.send(conn, head.as_bytes()).await;
        let reply = connection.reply().await;
        assert!(reply.starts_with("HTTP/1.1 200"), "connection {conn}: {reply:?}");
        // The guest's side says nothing more, as the agent does after the host's close.
    }
    assert_eq!(executed.lock().unwrap().len(), MANY as usize);
}

#[tokio::test]
async fn connections_the_host_opens_into_the_guest_and_closes_are_forgotten() {
    let (guest_end, host_end) = tokio::net::UnixStream::pair().unwrap();
    let (connects, requests) = tokio::sync::mpsc::channel(16);
    let shared: SharedPolicy = Arc::new(Mutex::new(Policy::default()));
    tokio::spawn(crate::port::serve(
        host_end,
        shared,
        requests,
        tokio::sync::watch::channel(0).1,
    ));
    let connector = crate::port::GuestConnector::from_sender(connects);
    // The guest: each connection the host opens is answered with a greeting, and nothing else
    // (no close: the host's side ends it).
    let (from_host, mut to_host) = guest_end.into_split();
    let mut frames = super::frames(from_host);
    tokio::spawn(async move {
        while let Some(frame) = frames.recv().await {
            if frame.kind == Kind::Connect {
                let hello = Frame {
                    conn: frame.conn,
                    kind: Kind::Data,
                    payload: b"hello".to_vec(),
                };
                to_host.write_all(&hello.encode()).await.unwrap();
            }
        }
    });
    for i in 0..MANY {
        let mut stream = connector
            .connect(8000)
            .await
            .unwrap_or_else(|e| panic!("connection {i}: {e}"));
        let mut greeting = [0u8; 5];
        tokio::time::timeout(Duration::from_secs(60), stream.read_exact(&mut greeting))
            .await
            .expect("the guest's greeting")
            .unwrap();
        assert_eq!(&greeting, b"hello");
        drop(stream);
        // The port forgets it once its close went out: yield so it can.
        tokio::task::yield_now().await;
    }
}
