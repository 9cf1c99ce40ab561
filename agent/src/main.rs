//! `farm-agent`: the guest side of farm.
//!
//! It is the guest's `/sbin/init` (PID 1). As PID 1 it mounts the pseudo file systems, brings
//! up loopback, sets the hostname, then forks the *server* process and spends its life
//! reaping orphans and restarting the server should it die. The server opens the
//! virtio-serial port named [`farm_protocol::PORT_NAME`] and answers the host's requests, each
//! on a thread of its own so several can be in flight.
//!
//! Outside a guest (`farm-agent --port PATH`) it serves a given file or FIFO, which is how
//! the protocol is exercised without a VM.

#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use farm_agent::{exec, files, folders, net, process, sweep, sys, testrun, users};
use farm_protocol::{
    AgentError, Envelope, ErrorKind, FrameError, Pong, Request, Response, DEFAULT_MAX_FRAME_BYTES, PORT_NAME,
    PROTOCOL_VERSION,
};

const BASE_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

fn log(msg: &str) {
    // PID 1's stdout/stderr is /dev/console: the serial log the host keeps.
    eprintln!("farm-agent: {msg}");
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--port") {
        let Some(path) = args.get(2) else {
            eprintln!("usage: farm-agent --port PATH");
            std::process::exit(2);
        };
        serve(Path::new(path));
    }
    if args.get(1).map(String::as_str) == Some("--check-with-zygote") {
        check_with_zygote(&args[2..]);
    }
    if std::process::id() != 1 {
        eprintln!("farm-agent runs as the guest's init (PID 1), or as `farm-agent --port PATH`");
        std::process::exit(2);
    }
    init();
}

/// `farm-agent --check-with-zygote SOCKET -- python3 -I HARNESS ARGS...`: runs a
/// function-call check in the harness zygote the template started (see
/// `datasets/src/harness/function_call.py`), handing it this process's standard input,
/// output and error, and exits with the worker's status. Without a zygote (an image without
/// Python, or one started elsewhere) it runs the command after `--` in its place.
fn check_with_zygote(args: &[String]) -> ! {
    use std::os::unix::process::CommandExt;
    let (Some(socket), Some("--"), Some(fallback)) = (
        args.first(),
        args.get(1).map(String::as_str),
        args.get(2..).filter(|f| f.len() >= 3),
    ) else {
        eprintln!("usage: farm-agent --check-with-zygote SOCKET -- python3 -I HARNESS [ARGS...]");
        std::process::exit(2);
    };
    let Ok(stream) = std::os::unix::net::UnixStream::connect(socket) else {
        let error = std::process::Command::new(&fallback[0]).args(&fallback[1..]).exec();
        eprintln!("farm-agent: cannot run {}: {error}", fallback[0]);
        std::process::exit(127);
    };
    // The harness arguments, after the interpreter, its flag and the harness path.
    let request = serde_json::to_vec(&fallback[3..]).expect("strings serialize");
    if let Err(e) = sys::send_with_stdio(&stream, &request) {
        eprintln!("farm-agent: the harness zygote did not take the check: {e}");
        std::process::exit(70);
    }
    // The pid of the process that runs the check, then its status.
    let mut answer = [0u8; 8];
    match (&stream).read_exact(&mut answer) {
        Ok(()) => std::process::exit(i32::from_be_bytes(answer[4..].try_into().expect("4 bytes"))),
        Err(e) => {
            eprintln!("farm-agent: the harness zygote went away during the check: {e}");
            std::process::exit(70);
        }
    }
}

/// PID 1: prepare the system, then supervise the server and reap every orphan.
fn init() -> ! {
    prepare_system();
    loop {
        match sys::fork() {
            // The server is not shielded from the OOM killer: its commands would inherit the
            // shield. It is small, so rarely chosen, and PID 1 restarts it if it is.
            Ok(sys::Forked::Child) => serve_guest_port(),
            Ok(sys::Forked::Parent(server)) => {
                // Reap until the server itself exits; then start a new one.
                while let Some(pid) = sys::wait_any() {
                    if pid == server {
                        log("server exited; restarting it");
                        break;
                    }
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => {
                log(&format!("fork failed: {e}; retrying"));
                std::thread::sleep(Duration::from_secs(1));
            }
        }
    }
}

fn prepare_system() {
    use nix::mount::MsFlags;
    let nosuid_nodev = MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
    let mounts: [(&str, &str, &str, MsFlags, &str); 7] = [
        // hidepid=invisible: an unprivileged user sees only its own processes in /proc (the
        // candidate cannot find the checker or the agent, let alone read their environment).
        (
            "proc",
            "/proc",
            "proc",
            nosuid_nodev | MsFlags::MS_NOEXEC,
            "hidepid=invisible",
        ),
        ("sysfs", "/sys", "sysfs", nosuid_nodev | MsFlags::MS_NOEXEC, ""),
        ("devtmpfs", "/dev", "devtmpfs", MsFlags::MS_NOSUID, "mode=0755"),
        (
            "devpts",
            "/dev/pts",
            "devpts",
            MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
            "ptmxmode=0666,gid=5,mode=0620",
        ),
        ("tmpfs", "/dev/shm", "tmpfs", nosuid_nodev, "mode=1777"),
        ("tmpfs", "/tmp", "tmpfs", nosuid_nodev, "mode=1777"),
        ("tmpfs", "/run", "tmpfs", nosuid_nodev, "mode=0755"),
    ];
    for (source, target, fstype, flags, data) in mounts {
        if let Err(e) = sys::mount(source, target, fstype, flags, data) {
            log(&format!("mounting {fstype} on {target} failed: {e}"));
        }
    }
    // Kernel pointers and the kernel log stay root's: nothing there for the candidate.
    // Links are followed, and hard links made, only where the kernel's protections allow
    // (the kernel's own default is off; Debian's userland turns them on).
    for (knob, value) in [
        ("/proc/sys/kernel/kptr_restrict", "2"),
        ("/proc/sys/kernel/dmesg_restrict", "1"),
        ("/proc/sys/fs/protected_symlinks", "1"),
        ("/proc/sys/fs/protected_hardlinks", "1"),
    ] {
        if let Err(e) = std::fs::write(knob, value) {
            log(&format!("setting {knob} failed: {e}"));
        }
    }
    if let Err(e) = sys::loopback_up() {
        log(&format!("bringing up loopback failed: {e}"));
    }
    let hostname = std::fs::read_to_string("/etc/hostname").unwrap_or_else(|_| "farm".into());
    let _ = sys::set_hostname(hostname.trim());
    std::env::set_var("PATH", BASE_PATH);
}

/// Finds the agent's virtio-serial port by its name in sysfs.
fn find_port() -> Option<PathBuf> {
    for entry in std::fs::read_dir("/sys/class/virtio-ports").ok()?.flatten() {
        let name = std::fs::read_to_string(entry.path().join("name")).unwrap_or_default();
        if name.trim() == PORT_NAME {
            return Some(Path::new("/dev").join(entry.file_name()));
        }
    }
    None
}

fn serve_guest_port() -> ! {
    let mut waited: u32 = 0;
    let port = loop {
        if let Some(port) = find_port() {
            break port;
        }
        if waited.is_multiple_of(50) {
            log(&format!("waiting for virtio-serial port {PORT_NAME}"));
        }
        waited += 1;
        std::thread::sleep(Duration::from_millis(100));
    };
    log(&format!("ready on {}", port.display()));
    // Background processes hold three descriptors each, and the proxy two per connection:
    // room for the most of both the agent keeps.
    if let Err(e) = sys::raise_open_files(16 << 10) {
        log(&format!("raising the open-file limit failed: {e}"));
    }
    net::spawn(log);
    serve(&port)
}

/// Per-agent state shared by request threads.
struct State {
    /// Environment every command starts from; the identity request extends it.
    base_env: Mutex<BTreeMap<String, String>>,
    writer: Mutex<File>,
    /// Background processes: kept in this process's memory, so a snapshot carries them.
    processes: process::Table,
}

fn serve(path: &Path) -> ! {
    let open = || {
        OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(path)
    };
    let mut reader = match open() {
        Ok(f) => f,
        Err(e) => {
            log(&format!("cannot open {}: {e}", path.display()));
            std::process::exit(1);
        }
    };
    let writer = reader.try_clone().expect("dup of the port");
    let state = Arc::new(State {
        base_env: Mutex::new(BTreeMap::from([
            ("PATH".to_string(), BASE_PATH.to_string()),
            ("HOME".to_string(), "/root".to_string()),
            ("LANG".to_string(), "C.UTF-8".to_string()),
            ("TERM".to_string(), "dumb".to_string()),
        ])),
        writer: Mutex::new(writer),
        processes: process::Table::default(),
    });
    // Announce readiness: a host that is already connected learns at once that the agent
    // serves (one that connects later pings).
    if let Ok((pong, _)) = handle(&state, Request::Ping, Vec::new()) {
        respond(&state, 0, pong, &[]);
    }
    loop {
        match farm_protocol::read_frame_resync(&mut reader, DEFAULT_MAX_FRAME_BYTES) {
            // Quick requests are answered in order on this thread: an identity request is
            // applied before the next request is even read, and no thread is started for
            // them. Commands and file transfers get a thread each, so they can overlap.
            Ok((header, body)) => match decode_request(&state, &header) {
                None => {}
                Some(envelope) if is_quick(&envelope.msg) => answer(&state, envelope, body),
                Some(envelope) => {
                    let state = Arc::clone(&state);
                    let spawned = std::thread::Builder::new()
                        .stack_size(256 * 1024)
                        .spawn(move || answer(&state, envelope, body));
                    if let Err(e) = spawned {
                        log(&format!("cannot start a request thread: {e}"));
                    }
                }
            },
            // No host on the other end (a virtio port reads 0 bytes while the host side is
            // closed); wait for one. A frame cut short by a host that went away is dropped.
            Err(FrameError::Closed) | Err(FrameError::Truncated) => std::thread::sleep(Duration::from_millis(20)),
            Err(FrameError::Io(e)) => {
                log(&format!("reading the port failed: {e}"));
                std::thread::sleep(Duration::from_millis(100));
            }
            // A bad length after a magic: nothing queued behind it can be trusted. Tell the
            // host, drop what is queued, and resynchronise on the next magic.
            Err(e) => {
                log(&format!("bad frame from host: {e}"));
                respond(&state, 0, Response::Error(bad_request(e.to_string())), &[]);
                std::thread::sleep(Duration::from_millis(50));
                drain_queued(&mut reader);
            }
        }
    }
}

fn drain_queued(file: &mut File) {
    use std::os::fd::AsRawFd;
    if sys::set_nonblocking(file.as_raw_fd(), true).is_err() {
        return;
    }
    let mut buf = [0u8; 4096];
    while let Ok(n) = file.read(&mut buf) {
        if n == 0 {
            break;
        }
    }
    let _ = sys::set_nonblocking(file.as_raw_fd(), false);
}

/// Ping, identity and quiesce: short, and (identity) order-sensitive. (Sweeps and test runs
/// take time, so they get a thread like commands do.)
fn is_quick(request: &Request) -> bool {
    matches!(request, Request::Ping | Request::Identity(_) | Request::Quiesce)
}

fn bad_request(message: String) -> AgentError {
    AgentError {
        kind: ErrorKind::BadRequest,
        message,
    }
}

fn respond(state: &State, id: u64, msg: Response, body: &[u8]) {
    let envelope = Envelope {
        v: PROTOCOL_VERSION,
        id,
        msg,
    };
    let frame = farm_protocol::encode_frame(&envelope, body);
    let mut writer = state.writer.lock().unwrap_or_else(|p| p.into_inner());
    if let Err(e) = writer.write_all(&frame) {
        log(&format!("writing response {id} failed: {e}"));
    }
}

/// Decodes a request header; a bad one is answered (under its id when that can be read at
/// all) and yields None.
fn decode_request(state: &State, header: &[u8]) -> Option<Envelope<Request>> {
    match farm_protocol::decode_header(header) {
        Ok(envelope) => Some(envelope),
        Err(e) => {
            let id = serde_json::from_slice::<serde_json::Value>(header)
                .ok()
                .and_then(|v| v.get("id").and_then(|id| id.as_u64()))
                .unwrap_or(0);
            respond(state, id, Response::Error(bad_request(e.to_string())), &[]);
            None
        }
    }
}

fn answer(state: &State, envelope: Envelope<Request>, body: Vec<u8>) {
    let id = envelope.id;
    let (response, response_body) = match handle(state, envelope.msg, body) {
        Ok(pair) => pair,
        Err(e) => (Response::Error(e), Vec::new()),
    };
    respond(state, id, response, &response_body);
}

fn base_env(state: &State) -> Vec<(String, String)> {
    state
        .base_env
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

fn io_error(what: String, e: std::io::Error) -> AgentError {
    AgentError {
        kind: ErrorKind::Io,
        message: format!("{what}: {e}"),
    }
}

fn handle(state: &State, request: Request, body: Vec<u8>) -> Result<(Response, Vec<u8>), AgentError> {
    match request {
        Request::Ping => Ok((
            Response::Pong(Pong {
                protocol_version: PROTOCOL_VERSION,
                agent_version: env!("CARGO_PKG_VERSION").to_string(),
                uptime_secs: sys::uptime_secs(),
            }),
            Vec::new(),
        )),
        Request::Exec(req) => {
            let output = exec::run(&req, &base_env(state), &body)?;
            let mut out = output.stdout;
            out.extend_from_slice(&output.stderr);
            Ok((Response::Exec(output.result), out))
        }
        Request::WriteFile(req) => {
            files::write_file(&req, &body).map(|bytes| (Response::WriteFile { bytes }, Vec::new()))
        }
        Request::ReadFile(req) => files::read_file(&req).map(|(size, data)| {
            let truncated = (data.len() as u64) < size;
            (Response::ReadFile { size, truncated }, data)
        }),
        Request::ListFiles(req) => list_files(&req),
        Request::Folder(req) => folders::handle(&req).map(|(answer, body)| (Response::Folder(answer), body)),
        Request::RemoveFile { path, beneath } => {
            files::remove_file(&path, beneath.as_deref()).map(|()| (Response::RemoveFile, Vec::new()))
        }
        Request::Handover(req) => {
            let user = users::resolve(&req.user).map_err(|e| bad_request(farm_agent::describe(&e)))?;
            files::handover(&req.root, &user, None).map(|entries| (Response::Handover { entries }, Vec::new()))
        }
        Request::RemoveTree { path } => {
            files::remove_tree(&path).map(|entries| (Response::RemoveTree { entries }, Vec::new()))
        }
        Request::Sweep(req) => {
            let targets = sweep::Targets {
                everything: req.uids.is_empty(),
                uids: req.uids,
                group: None,
            };
            let swept = sweep::sweep(&targets);
            Ok((
                Response::Sweep {
                    killed: swept.killed,
                    complete: swept.complete,
                },
                Vec::new(),
            ))
        }
        Request::RunTests(req) => {
            let run = testrun::run_tests(&req, &base_env(state), &body)?;
            let mut out = run.output.stdout;
            out.extend_from_slice(&run.output.stderr);
            out.extend_from_slice(&run.junit);
            Ok((Response::RunTests(run.result), out))
        }
        Request::Quiesce => {
            sys::sync_all();
            Ok((Response::Quiesce, Vec::new()))
        }
        Request::Identity(req) => take_identity(state, req, &body),
        Request::Process(req) => state
            .processes
            .handle(req, &base_env(state), &body)
            .map(|(response, body)| (Response::Process(response), body)),
    }
}

/// The entries beneath a folder, as JSON in the body.
fn list_files(req: &farm_protocol::ListFilesRequest) -> Result<(Response, Vec<u8>), AgentError> {
    let mut entries = Vec::new();
    let truncated = files::list_files(
        Path::new(&req.root),
        Path::new(""),
        req.max_entries.min(farm_protocol::MAX_LISTING) as usize,
        &mut entries,
        0,
    )
    .map_err(|e| io_error(format!("listing {}", req.root), e))?;
    let body = serde_json::to_vec(&entries).map_err(|e| {
        io_error(
            format!("encoding the listing of {}", req.root),
            std::io::Error::other(e),
        )
    })?;
    Ok((
        Response::ListFiles {
            count: entries.len() as u32,
            truncated,
        },
        body,
    ))
}

/// A fork's identity, before any of its commands runs: the host's entropy, the clock, the
/// hostname and the variables every later command gets.
fn take_identity(
    state: &State,
    req: farm_protocol::IdentityRequest,
    entropy: &[u8],
) -> Result<(Response, Vec<u8>), AgentError> {
    if !entropy.is_empty() {
        sys::add_entropy_and_reseed(entropy).map_err(|e| io_error("adding entropy to the kernel RNG".into(), e))?;
    }
    sys::set_realtime(req.unix_time_ns).map_err(|e| io_error("setting the clock".into(), e))?;
    if !req.hostname.is_empty() {
        sys::set_hostname(&req.hostname).map_err(|e| io_error(format!("setting hostname {:?}", req.hostname), e))?;
    }
    state.base_env.lock().unwrap_or_else(|p| p.into_inner()).extend(req.env);
    Ok((Response::Identity, Vec::new()))
}
