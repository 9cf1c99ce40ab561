//! Background processes in the guest ([`farm_protocol::process`]): started, listed, their
//! output read from an offset (waiting for more), fed, signalled, waited for and resized.
//! Every answer is checked against what was asked before it is believed.

use std::time::Duration;

use farm_protocol::process::{
    OutputRead, ProcessInfo, ProcessRequest, ProcessResponse, ReadOutputRequest, SpawnRequest, TermSize, MAX_READ_BYTES,
};
use farm_protocol::{Request, Response};

use super::{AgentClient, AgentError, SHORT_REQUEST};

impl AgentClient {
    async fn process(
        &self,
        op: &'static str,
        request: ProcessRequest,
        body: Vec<u8>,
        timeout: Duration,
    ) -> Result<(ProcessResponse, Vec<u8>), AgentError> {
        match self.request(op, Request::Process(request), body, timeout).await? {
            (Response::Process(answer), body) => Ok((answer, body)),
            (other, _) => Err(super::unexpected(op, other)),
        }
    }

    async fn info(
        &self,
        op: &'static str,
        request: ProcessRequest,
        timeout: Duration,
    ) -> Result<ProcessInfo, AgentError> {
        match self.process(op, request, Vec::new(), timeout).await? {
            (ProcessResponse::Info(info), _) => Ok(info),
            (other, _) => Err(bad(op, format!("unexpected answer {other:?}"))),
        }
    }

    /// Starts a background process; its handle.
    pub async fn spawn(&self, request: SpawnRequest) -> Result<ProcessInfo, AgentError> {
        self.info("spawn", ProcessRequest::Spawn(request), SHORT_REQUEST).await
    }

    pub async fn processes(&self) -> Result<Vec<ProcessInfo>, AgentError> {
        match self
            .process("processes", ProcessRequest::List, Vec::new(), SHORT_REQUEST)
            .await?
        {
            (ProcessResponse::List { processes }, _) => Ok(processes),
            (other, _) => Err(bad("processes", format!("unexpected answer {other:?}"))),
        }
    }

    pub async fn process_info(&self, pid: u32) -> Result<ProcessInfo, AgentError> {
        self.info("process", ProcessRequest::Get { pid }, SHORT_REQUEST).await
    }

    /// A process's output from an offset, waiting up to `wait` for more: what the read got,
    /// and the bytes.
    pub async fn read_output(&self, request: ReadOutputRequest) -> Result<(OutputRead, Vec<u8>), AgentError> {
        let asked = request.clone();
        let timeout = Duration::from_millis(request.wait_ms) + SHORT_REQUEST;
        match self
            .process("read output", ProcessRequest::Read(request), Vec::new(), timeout)
            .await?
        {
            (ProcessResponse::Output(read), bytes) => {
                let most = asked.max_bytes.min(MAX_READ_BYTES);
                let consistent = bytes.len() as u64 <= most
                    && read.next == read.offset + bytes.len() as u64
                    && read.dropped == read.offset.saturating_sub(asked.offset);
                if !consistent {
                    return Err(bad(
                        "read output",
                        format!("{read:?} with {} bytes for {asked:?}", bytes.len()),
                    ));
                }
                Ok((read, bytes))
            }
            (other, _) => Err(bad("read output", format!("unexpected answer {other:?}"))),
        }
    }

    /// Writes `bytes` to a process's standard input, then closes it when `close` and all
    /// were taken: how many the process took (fewer when it does not read; the rest was not
    /// written).
    pub async fn write_stdin(&self, pid: u32, bytes: Vec<u8>, close: bool) -> Result<u64, AgentError> {
        let asked = bytes.len() as u64;
        match self
            .process(
                "write stdin",
                ProcessRequest::Write { pid, close },
                bytes,
                SHORT_REQUEST,
            )
            .await?
        {
            (ProcessResponse::Written { bytes }, _) if bytes <= asked => Ok(bytes),
            (other, _) => Err(bad("write stdin", format!("unexpected answer {other:?}"))),
        }
    }

    /// Sends a signal to a process's group.
    pub async fn signal(&self, pid: u32, signal: i32) -> Result<(), AgentError> {
        self.done("signal", ProcessRequest::Signal { pid, signal }).await
    }

    /// Waits up to `timeout` for a process to end; its handle either way.
    pub async fn wait_process(&self, pid: u32, timeout: Duration) -> Result<ProcessInfo, AgentError> {
        let request = ProcessRequest::Wait {
            pid,
            timeout_ms: timeout.as_millis() as u64,
        };
        self.info("wait", request, timeout + SHORT_REQUEST).await
    }

    pub async fn resize(&self, pid: u32, size: TermSize) -> Result<(), AgentError> {
        self.done("resize", ProcessRequest::Resize { pid, size }).await
    }

    async fn done(&self, op: &'static str, request: ProcessRequest) -> Result<(), AgentError> {
        match self.process(op, request, Vec::new(), SHORT_REQUEST).await? {
            (ProcessResponse::Done, _) => Ok(()),
            (other, _) => Err(bad(op, format!("unexpected answer {other:?}"))),
        }
    }
}

fn bad(op: &'static str, detail: String) -> AgentError {
    AgentError::BadResponse { op, detail }
}
