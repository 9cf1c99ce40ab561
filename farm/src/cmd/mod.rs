//! Subcommands.

pub mod bench;
pub mod snapshot;
pub mod template;
pub mod vm;

/// Resolves when SIGINT or SIGTERM arrives, with the conventional exit code (128 + signal).
pub async fn shutdown_signal() -> i32 {
    use tokio::signal::unix::{signal, SignalKind};
    let mut interrupt = signal(SignalKind::interrupt()).expect("installing the SIGINT handler");
    let mut terminate = signal(SignalKind::terminate()).expect("installing the SIGTERM handler");
    let code = tokio::select! {
        _ = interrupt.recv() => 128 + libc::SIGINT,
        _ = terminate.recv() => 128 + libc::SIGTERM,
    };
    eprintln!("farm: interrupted, stopping");
    code
}
