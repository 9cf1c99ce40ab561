//! `farm serve CONFIG.toml`: the long-running front-end of the rollout engine, for training
//! loops. Trainers submit rollouts and pull scored rows ([`api`]), or step live sessions
//! themselves and branch them. Everything finished is journaled and written to Parquet parts
//! in the service's output folder, as `farm run` does; a restart reports what was lost.
//!
//! CONFIG is a suite file (the service serves its tasks), or a service file:
//!
//! ```toml
//! [serve]
//! suites = ["humaneval.toml", "tasks.toml"]   # relative to this file (none: the sandbox API only)
//! out = "serve-out"
//! ```
//!
//! Besides the suites' rollouts and sessions, the service has a sandbox API: environments
//! built on demand and sandboxes forked from them. The service itself is the `service`
//! crate's; this folder is its transports: HTTP routes, OpenEnv's and MCP's protocols, a
//! terminal's WebSocket, the tenancy middleware, the OpenAPI document.

mod api;
mod e2b;
mod error;
mod event_routes;
pub(crate) mod hosting_routes;
mod http;
mod mcp;
mod openenv;
mod pty;
pub mod routes;
mod sandbox_routes;
mod strict;
mod tenancy;
mod unread;
mod workspace_routes;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;

use crate::signals::Signals;
pub use service::is_request_record;
use service::{load_config, Service};

#[derive(Args)]
pub struct ServeArgs {
    /// A suite file, or a service file with a `[serve]` table listing suites.
    config: PathBuf,
    /// Address to listen on. Anything but loopback needs a bearer token in the variable
    /// `serve.token_env` names (default FARM_SERVE_TOKEN).
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// Output folder: journal, Parquet parts, requests (default: `serve.out`, else
    /// `serve-out` next to CONFIG). A restart in the same folder keeps every row.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Rollouts at once (overrides `serve.concurrency`).
    #[arg(long)]
    concurrency: Option<usize>,
    /// Accelerator: auto (KVM where it runs stock guests, else TCG), kvm or tcg.
    #[arg(long, default_value = "auto")]
    accel: engine::sizing::AccelSetting,
}

pub async fn run(args: ServeArgs) -> Result<i32> {
    let (mut settings, suites, default_out) = load_config(&args.config)?;
    if let Some(listen) = args.listen {
        settings.listen = listen;
    }
    if let Some(c) = args.concurrency {
        settings.concurrency = engine::config::Count::Fixed(c.max(1));
    }
    let token = std::env::var(&settings.token_env).ok().filter(|t| !t.is_empty());
    if !settings.listen.ip().is_loopback() && token.is_none() {
        bail!(
            "listening on {} (not loopback) needs a bearer token: set {} (serve.token_env), or listen on 127.0.0.1",
            settings.listen,
            settings.token_env
        );
    }
    let out = args.out.clone().unwrap_or(default_out);
    // Listen before the slow part, so a taken port fails at once.
    let listener = tokio::net::TcpListener::bind(settings.listen)
        .await
        .with_context(|| format!("cannot listen on {}", settings.listen))?;
    // No guest's egress reaches the service's own API, whatever its policy names.
    egress::protect(listener.local_addr()?);
    let mut signals = Signals::new()?;
    let service = tokio::select! {
        service = Service::start(&settings, suites, &out, args.accel, token.as_deref()) => service?,
        code = signals.recv() => {
            tracing::info!("interrupted while preparing snapshots");
            return Ok(code);
        }
    };
    let service = Arc::new(service);
    let addr = listener.local_addr()?;
    if token.is_some() {
        tracing::info!(
            "listening on http://{addr} (bearer token required); output in {}",
            out.display()
        );
    } else {
        tracing::warn!(
            "listening on http://{addr} with no token ({} is unset): for loopback alone, and every user and \
             process of this host can call it (guests cannot: their egress never reaches the service); \
             output in {}",
            settings.token_env,
            out.display()
        );
    }
    let background = service.clone().spawn_background();
    let app = routes::router(service.clone());
    let stop = Arc::new(tokio::sync::Notify::new());
    let stopped = stop.clone();
    let server = tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async move { stopped.notified().await })
            .await
    });
    let code = signals.recv().await;
    tracing::info!("stopping: no new work is admitted; in-flight rollouts are cancelled and recorded");
    service.shut_down().await;
    stop.notify_one();
    background.abort();
    let _ = tokio::time::timeout(Duration::from_secs(10), server).await;
    service.flush().await?;
    tracing::info!("stopped");
    Ok(code)
}
