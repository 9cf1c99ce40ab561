//! The guest's way out: a proxy listener on [`net::PROXY_ADDR`] whose connections are
//! carried, as frames, over the network port to farm on the host. farm reads each
//! connection's HTTP proxy request, checks it against the VM's allowlist and either relays it
//! or answers 403 and closes. The guest has no network device, so nothing else leaves it.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use farm_protocol::net::{self, Frame, Kind};

type Conns = Arc<Mutex<HashMap<u32, TcpStream>>>;

/// Finds the network port; None in a VM started without one.
fn find_port() -> Option<PathBuf> {
    for entry in std::fs::read_dir("/sys/class/virtio-ports").ok()?.flatten() {
        let name = std::fs::read_to_string(entry.path().join("name")).unwrap_or_default();
        if name.trim() == net::PORT_NAME {
            return Some(Path::new("/dev").join(entry.file_name()));
        }
    }
    None
}

/// Starts the proxy listener and the port reader, when the VM has a network port.
pub fn spawn(log: fn(&str)) {
    let Some(port) = find_port() else { return };
    let open = || {
        OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(&port)
    };
    let (reader, writer) = match open().and_then(|r| r.try_clone().map(|w| (r, w))) {
        Ok(pair) => pair,
        Err(e) => return log(&format!("cannot open the network port {}: {e}", port.display())),
    };
    let listener = match TcpListener::bind(net::PROXY_ADDR) {
        Ok(l) => l,
        Err(e) => return log(&format!("cannot listen on {}: {e}", net::PROXY_ADDR)),
    };
    let conns: Conns = Arc::default();
    let writer = Arc::new(Mutex::new(writer));
    {
        let (conns, writer) = (conns.clone(), writer.clone());
        std::thread::spawn(move || read_port(reader, conns, writer));
    }
    std::thread::spawn(move || {
        let mut next: u32 = 0;
        for stream in listener.incoming() {
            let Ok(stream) = stream else { continue };
            // The guest's own connections are numbered below the host's.
            next = next.wrapping_add(1) % net::HOST_CONN;
            let id = next;
            let Ok(reading) = stream.try_clone() else { continue };
            conns.lock().unwrap_or_else(|e| e.into_inner()).insert(id, stream);
            if send(
                &writer,
                Frame {
                    conn: id,
                    kind: Kind::Open,
                    payload: Vec::new(),
                },
            )
            .is_err()
            {
                return;
            }
            let (writer, conns) = (writer.clone(), conns.clone());
            std::thread::spawn(move || pump(id, reading, writer, conns));
        }
    });
}

fn send(writer: &Mutex<File>, frame: Frame) -> std::io::Result<()> {
    writer
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .write_all(&frame.encode())
}

/// One client's bytes, out to the host, until it closes.
fn pump(id: u32, mut stream: TcpStream, writer: Arc<Mutex<File>>, conns: Conns) {
    let mut buf = vec![0u8; 16 << 10];
    loop {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if send(
                    &writer,
                    Frame {
                        conn: id,
                        kind: Kind::Data,
                        payload: buf[..n].to_vec(),
                    },
                )
                .is_err()
                {
                    break;
                }
            }
        }
    }
    if conns.lock().unwrap_or_else(|e| e.into_inner()).remove(&id).is_some() {
        let _ = send(
            &writer,
            Frame {
                conn: id,
                kind: Kind::Close,
                payload: Vec::new(),
            },
        );
    }
}

/// The host's frames, to their clients.
fn read_port(mut port: File, conns: Conns, writer: Arc<Mutex<File>>) {
    let mut pending: Vec<u8> = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = match port.read(&mut buf) {
            Ok(0) => {
                std::thread::sleep(std::time::Duration::from_millis(50));
                continue;
            }
            Ok(n) => n,
            Err(_) => return,
        };
        pending.extend_from_slice(&buf[..n]);
        loop {
            match Frame::decode(&pending) {
                Ok(Some((frame, used))) => {
                    pending.drain(..used);
                    if frame.kind == Kind::Connect {
                        connect(frame.conn, &frame.payload, &writer, &conns);
                        continue;
                    }
                    let mut open = conns.lock().unwrap_or_else(|e| e.into_inner());
                    match frame.kind {
                        Kind::Data => {
                            if let Some(stream) = open.get_mut(&frame.conn) {
                                if stream.write_all(&frame.payload).is_err() {
                                    open.remove(&frame.conn);
                                }
                            }
                        }
                        Kind::Close => {
                            if let Some(stream) = open.remove(&frame.conn) {
                                let _ = stream.shutdown(Shutdown::Both);
                            }
                        }
                        Kind::Open | Kind::Connect => {}
                    }
                }
                Ok(None) => break,
                // A host that speaks nonsense: drop what is buffered and go on.
                Err(_) => {
                    pending.clear();
                    break;
                }
            }
        }
    }
}

/// A connection the host opens to one of the guest's own services (`farm serve`'s port
/// proxy): to `127.0.0.1:PORT` only, for a host connection id; relayed like the guest's own,
/// or closed at once when nothing listens there.
fn connect(id: u32, payload: &[u8], writer: &Arc<Mutex<File>>, conns: &Conns) {
    let port = match payload {
        [high, low] if id & net::HOST_CONN != 0 => u16::from_be_bytes([*high, *low]),
        _ => 0,
    };
    let address = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    // Loopback answers at once; a listener whose backlog is full is given a moment.
    let stream = (port != 0)
        .then(|| TcpStream::connect_timeout(&address, std::time::Duration::from_secs(2)).ok())
        .flatten();
    let Some((stream, reading)) = stream.and_then(|s| s.try_clone().ok().map(|r| (s, r))) else {
        let _ = send(
            writer,
            Frame {
                conn: id,
                kind: Kind::Close,
                payload: Vec::new(),
            },
        );
        return;
    };
    conns.lock().unwrap_or_else(|e| e.into_inner()).insert(id, stream);
    let (writer, conns) = (writer.clone(), conns.clone());
    std::thread::spawn(move || pump(id, reading, writer, conns));
}
