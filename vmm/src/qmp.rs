//! A small asynchronous QMP client: greeting, capabilities negotiation, a command or a few
//! sent together, and events kept for whoever waits for one.

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
    #[error("an earlier QMP exchange was cut off midway: the connection is out of step")]
    OutOfStep,
    #[error("{0} QMP commands sent together: at most {MAX_BATCH} (QEMU queues no more)")]
    Batch(usize),
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

/// Most commands [`Qmp::execute_all`] sends together: QEMU's monitor queues 8.
pub const MAX_BATCH: usize = 8;

pub struct Qmp {
    reader: BufReader<OwnedReadHalf>,
    writer: OwnedWriteHalf,
    /// Events received while waiting for command answers, newest last (bounded).
    pub events: Vec<Value>,
    /// An exchange began and has not ended: if its caller dropped it midway (a timeout), a
    /// line may be half read or a command half sent, and every later exchange fails
    /// ([`QmpError::OutOfStep`]) instead of taking another's answer.
    busy: bool,
}

impl Qmp {
    /// Reads the greeting and enters command mode.
    pub async fn handshake(stream: UnixStream) -> Result<Qmp, QmpError> {
        let (read, write) = stream.into_split();
        let mut qmp = Qmp {
            reader: BufReader::new(read),
            writer: write,
            events: Vec::new(),
            busy: false,
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

    fn begin(&mut self) -> Result<(), QmpError> {
        if self.busy {
            return Err(QmpError::OutOfStep);
        }
        self.busy = true;
        Ok(())
    }

    /// Ends an exchange that ran to its end (answered, or refused: still in step).
    fn end<T>(&mut self, result: Result<T, QmpError>) -> Result<T, QmpError> {
        if matches!(result, Ok(_) | Err(QmpError::Command { .. })) {
            self.busy = false;
        }
        result
    }

    /// Runs one command and returns its `return` value.
    pub async fn execute(&mut self, command: &str, arguments: Option<Value>) -> Result<Value, QmpError> {
        self.begin()?;
        let bytes = request_bytes(command, arguments);
        let result = match self.writer.write_all(&bytes).await {
            Ok(()) => self.answer(command).await,
            Err(e) => Err(e.into()),
        };
        self.end(result)
    }

    /// Runs commands sent together: one round trip for all of them (QEMU answers a monitor's
    /// commands in the order they came), at most [`MAX_BATCH`]. Each command's answer or
    /// refusal comes back in its place; every answer is read, so the connection stays in
    /// step. QEMU runs every command of a batch whatever became of the ones before it: only
    /// commands that do not depend on each other go together. Nothing that carries a
    /// descriptor goes in a batch ([`Qmp::pass_fd`] waits for its answer alone).
    pub async fn execute_all(
        &mut self,
        commands: &[(&str, Option<Value>)],
    ) -> Result<Vec<Result<Value, QmpError>>, QmpError> {
        if commands.len() > MAX_BATCH {
            return Err(QmpError::Batch(commands.len()));
        }
        self.begin()?;
        let result = self.send_all(commands).await;
        let in_step = result.is_ok();
        if in_step {
            self.busy = false;
        }
        result
    }

    async fn send_all(&mut self, commands: &[(&str, Option<Value>)]) -> Result<Vec<Result<Value, QmpError>>, QmpError> {
        let mut bytes = Vec::new();
        for (command, arguments) in commands {
            bytes.extend(request_bytes(command, arguments.clone()));
        }
        self.writer.write_all(&bytes).await?;
        let mut answers = Vec::with_capacity(commands.len());
        for (command, _) in commands {
            match self.answer(command).await {
                Err(e) if !matches!(e, QmpError::Command { .. }) => return Err(e),
                answer => answers.push(answer),
            }
        }
        Ok(answers)
    }

    /// Waits for the first event that `matches`, and takes it from [`Qmp::events`] (one that
    /// came while an answer was awaited counts). No command may be in flight.
    pub async fn wait_event(&mut self, matches: impl Fn(&Value) -> bool) -> Result<Value, QmpError> {
        if let Some(at) = self.events.iter().position(&matches) {
            return Ok(self.events.remove(at));
        }
        self.begin()?;
        let result = loop {
            let message = match self.read_message().await {
                Ok(message) => message,
                Err(e) => break Err(e),
            };
            if message.get("event").is_none() {
                break Err(QmpError::BadJson(format!(
                    "an answer while no command was in flight: {message}"
                )));
            }
            if matches(&message) {
                break Ok(message);
            }
            self.keep(message);
        };
        if result.is_ok() {
            self.busy = false;
        }
        result
    }

    fn keep(&mut self, event: Value) {
        if self.events.len() >= 64 {
            self.events.remove(0);
        }
        self.events.push(event);
    }

    /// Hands QEMU a descriptor under `name` (`getfd`): the descriptor travels as
    /// SCM_RIGHTS with the command's first byte.
    pub async fn pass_fd(&mut self, name: &str, fd: std::os::fd::OwnedFd) -> Result<(), QmpError> {
        self.begin()?;
        let result = self.send_fd(name, fd).await;
        self.end(result)
    }

    async fn send_fd(&mut self, name: &str, fd: std::os::fd::OwnedFd) -> Result<(), QmpError> {
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
                self.keep(message);
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

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncBufReadExt;

    /// A QMP peer that answers each command line with the next scripted lines.
    async fn peer(stream: UnixStream, script: Vec<Vec<&'static str>>) -> Vec<String> {
        let (read, mut write) = stream.into_split();
        write.write_all(b"{\"QMP\": {}}\n").await.unwrap();
        let mut lines = BufReader::new(read).lines();
        let mut seen = Vec::new();
        // The capabilities' answer, then the script.
        for answers in std::iter::once(vec!["{\"return\": {}}"]).chain(script) {
            let Some(line) = lines.next_line().await.unwrap() else {
                break;
            };
            seen.push(line);
            for answer in answers {
                write.write_all(format!("{answer}\n").as_bytes()).await.unwrap();
            }
        }
        seen
    }

    #[tokio::test]
    async fn a_batch_reads_every_answer_after_a_refusal_and_an_awaited_event_may_come_first() {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let script = vec![
            vec![
                r#"{"event": "JOB_STATUS_CHANGE", "data": {"id": "j", "status": "running"}}"#,
                r#"{"return": 1}"#,
            ],
            vec![r#"{"error": {"class": "GenericError", "desc": "no"}}"#],
            vec![
                r#"{"event": "JOB_STATUS_CHANGE", "data": {"id": "j", "status": "concluded"}}"#,
                r#"{"return": 3}"#,
            ],
            vec![r#"{"return": 4}"#],
        ];
        let peer = tokio::spawn(peer(theirs, script));
        let mut qmp = Qmp::handshake(ours).await.unwrap();
        let answers = qmp
            .execute_all(&[("one", None), ("two", Some(json!({"x": 1}))), ("three", None)])
            .await
            .unwrap();
        assert_eq!(answers[0].as_ref().unwrap(), &json!(1));
        assert!(
            matches!(&answers[1], Err(QmpError::Command { command, desc, .. }) if command == "two" && desc == "no"),
            "{answers:?}"
        );
        assert_eq!(answers[2].as_ref().unwrap(), &json!(3));
        // The connection is in step: the next answer is the fourth command's.
        assert_eq!(qmp.execute("four", None).await.unwrap(), json!(4));
        // The event came while answers were read; it is found, and taken.
        let concluded = |e: &Value| e.pointer("/data/status").and_then(Value::as_str) == Some("concluded");
        let event = qmp.wait_event(concluded).await.unwrap();
        assert_eq!(event["data"]["id"], "j");
        assert_eq!(qmp.events.len(), 1, "the other event stays: {:?}", qmp.events);
        drop(qmp);
        let seen = peer.await.unwrap();
        assert_eq!(seen.len(), 5, "{seen:?}");
        assert!(seen[2].contains("\"two\"") && seen[2].contains("\"x\":1"), "{seen:?}");
    }

    #[tokio::test]
    async fn waiting_for_an_event_reads_until_it_comes_and_keeps_the_others() {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let script = vec![vec![
            r#"{"return": {}}"#,
            r#"{"event": "STOP"}"#,
            r#"{"event": "JOB_STATUS_CHANGE", "data": {"id": "k", "status": "concluded"}}"#,
        ]];
        let peer = tokio::spawn(peer(theirs, script));
        let mut qmp = Qmp::handshake(ours).await.unwrap();
        qmp.execute("go", None).await.unwrap();
        let event = qmp
            .wait_event(|e| e.pointer("/data/id").and_then(Value::as_str) == Some("k"))
            .await
            .unwrap();
        assert_eq!(event["data"]["status"], "concluded");
        assert_eq!(qmp.events, vec![json!({"event": "STOP"})]);
        drop(qmp);
        peer.await.unwrap();
    }

    #[tokio::test]
    async fn an_exchange_cut_off_midway_fails_every_later_one_instead_of_taking_its_answer() {
        let (ours, theirs) = UnixStream::pair().unwrap();
        // The peer answers the capabilities, then takes the next command and answers late.
        let peer = tokio::spawn(async move {
            let (read, mut write) = theirs.into_split();
            write.write_all(b"{\"QMP\": {}}\n").await.unwrap();
            let mut lines = BufReader::new(read).lines();
            lines.next_line().await.unwrap();
            write.write_all(b"{\"return\": {}}\n").await.unwrap();
            lines.next_line().await.unwrap();
            tokio::time::sleep(std::time::Duration::from_millis(300)).await;
            let _ = write.write_all(b"{\"return\": \"late\"}\n").await;
        });
        let mut qmp = Qmp::handshake(ours).await.unwrap();
        let cut = tokio::time::timeout(std::time::Duration::from_millis(50), qmp.execute("slow", None)).await;
        assert!(cut.is_err(), "the slow command answered in time: {cut:?}");
        tokio::time::sleep(std::time::Duration::from_millis(400)).await;
        // Its late answer must not become the next command's.
        assert!(matches!(qmp.execute("next", None).await, Err(QmpError::OutOfStep)));
        assert!(matches!(
            qmp.execute_all(&[("a", None)]).await,
            Err(QmpError::OutOfStep)
        ));
        assert!(matches!(qmp.wait_event(|_| true).await, Err(QmpError::OutOfStep)));
        let too_many: Vec<(&str, Option<Value>)> = (0..=MAX_BATCH).map(|_| ("x", None)).collect();
        assert!(matches!(qmp.execute_all(&too_many).await, Err(QmpError::Batch(9))));
        peer.await.unwrap();
    }
}
