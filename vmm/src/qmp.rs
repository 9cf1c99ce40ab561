//! A small asynchronous QMP client: greeting, capabilities negotiation, one command at a
//! time, events skipped.

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::UnixStream;

/// Longest QMP line accepted; QEMU's answers to the commands farm sends are far shorter.
const MAX_LINE: usize = 4 << 20;

#[derive(Debug, thiserror::Error)]
pub enum QmpError {
    #[error("the QMP connection closed (QEMU exited?)")]
    Closed,
    #[error("QMP I/O failed")]
    Io(#[from] std::io::Error),
    #[error("QMP sent something that is not JSON: {0}")]
    BadJson(String),
    #[error("QMP command {command} failed: {class}: {desc}")]
    Command {
        command: String,
        class: String,
        desc: String,
    },
}

fn request_bytes(command: &str, arguments: Option<Value>) -> Vec<u8> {
    let mut request = json!({ "execute": command });
    if let Some(arguments) = arguments {
        request["arguments"] = arguments;
    }
    let mut bytes = serde_json::to_vec(&request).expect("json");
    bytes.push(b'\n');
    bytes
}

pub struct Qmp {
    reader: BufReader<OwnedReadHalf>,
    writer: OwnedWriteHalf,
    /// Events received while waiting for command answers, newest last (bounded).
    pub events: Vec<Value>,
}

impl Qmp {
    /// Reads the greeting and enters command mode.
    pub async fn handshake(stream: UnixStream) -> Result<Qmp, QmpError> {
        let (read, write) = stream.into_split();
        let mut qmp = Qmp {
            reader: BufReader::new(read),
            writer: write,
            events: Vec::new(),
        };
        let greeting = qmp.read_message().await?;
        if greeting.get("QMP").is_none() {
            return Err(QmpError::BadJson(format!("expected the QMP greeting, got {greeting}")));
        }
        qmp.execute("qmp_capabilities", None).await?;
        Ok(qmp)
    }

    async fn read_message(&mut self) -> Result<Value, QmpError> {
        let mut line = Vec::new();
        loop {
            line.clear();
            let n = (&mut self.reader)
                .take(MAX_LINE as u64)
                .read_until(b'\n', &mut line)
                .await?;
            if n == 0 {
                return Err(QmpError::Closed);
            }
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            return serde_json::from_slice(&line)
                .map_err(|e| QmpError::BadJson(format!("{e}: {}", String::from_utf8_lossy(&line))));
        }
    }

    /// Runs one command and returns its `return` value.
    pub async fn execute(&mut self, command: &str, arguments: Option<Value>) -> Result<Value, QmpError> {
        let bytes = request_bytes(command, arguments);
        self.writer.write_all(&bytes).await?;
        self.answer(command).await
    }

    /// Hands QEMU a descriptor under `name` (`getfd`): the descriptor travels as
    /// SCM_RIGHTS with the command's first byte.
    pub async fn pass_fd(&mut self, name: &str, fd: std::os::fd::OwnedFd) -> Result<(), QmpError> {
        use std::os::fd::AsRawFd;
        let bytes = request_bytes("getfd", Some(json!({ "fdname": name })));
        let socket = self.writer.as_ref();
        let raw = fd.as_raw_fd();
        let sent = socket
            .async_io(tokio::io::Interest::WRITABLE, || {
                let rights = [raw];
                let control = [nix::sys::socket::ControlMessage::ScmRights(&rights)];
                nix::sys::socket::sendmsg::<()>(
                    socket.as_raw_fd(),
                    &[std::io::IoSlice::new(&bytes)],
                    &control,
                    nix::sys::socket::MsgFlags::empty(),
                    None,
                )
                .map_err(std::io::Error::from)
            })
            .await?;
        self.writer.write_all(&bytes[sent..]).await?;
        drop(fd);
        self.answer("getfd").await.map(|_| ())
    }

    async fn answer(&mut self, command: &str) -> Result<Value, QmpError> {
        loop {
            let message = self.read_message().await?;
            if message.get("event").is_some() {
                if self.events.len() >= 64 {
                    self.events.remove(0);
                }
                self.events.push(message);
                continue;
            }
            if let Some(ret) = message.get("return") {
                return Ok(ret.clone());
            }
            if let Some(error) = message.get("error") {
                return Err(QmpError::Command {
                    command: command.to_string(),
                    class: error.get("class").and_then(Value::as_str).unwrap_or("?").to_string(),
                    desc: error.get("desc").and_then(Value::as_str).unwrap_or("?").to_string(),
                });
            }
            return Err(QmpError::BadJson(format!("unexpected QMP message {message}")));
        }
    }
}
