//! Subcommands.

pub mod bench;
pub mod density;
pub mod e2b;
pub mod measure;
pub mod merge;
pub mod repair;
pub mod snapshot;
pub mod template;
pub mod tenant;
pub mod vm;

/// Resolves when SIGINT or SIGTERM arrives, with the conventional exit code (128 + signal).
pub async fn shutdown_signal() -> i32 {
    let code = crate::signals::Signals::new()
        .expect("installing the signal handlers")
        .recv()
        .await;
    eprintln!("farm: interrupted, stopping");
    code
}
