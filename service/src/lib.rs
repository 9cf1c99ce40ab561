//! `farm serve`'s core: the service under every transport. It owns the live forks (sessions
//! and sandboxes, one book), the environments sandboxes are made from, the rollout queue and
//! the run folder it records into, and the tenants' owners, quotas and connections. Its
//! calls take typed requests and answer typed views ([`wire`]) or an [`ApiError`]; it has no
//! HTTP in it. The transports (`farm/src/serve`: REST, the sandbox API, OpenEnv, MCP, a
//! terminal's WebSocket) parse into these calls and serialise their answers.
//!
//! ```text
//! transport ──typed request──> Service / SandboxApi ──> engine (forks, sessions, scoring)
//!     <──── view or ApiError ───┘         └──> recorder (journal, Parquet), tenants (SQLite)
//! ```

// The checkout this crate is built in (`.cargo/config.toml`): its build is never another clone's.
const _: Option<&str> = option_env!("FARM_CHECKOUT");

pub mod admission;
pub mod bounds;
pub mod capacity;
pub mod config;
pub mod entries;
pub mod error;
pub mod events;
pub mod forks;
pub mod ids;
pub mod paused;
pub mod quotas;
pub mod record;
pub mod requests;
pub mod restore;
pub mod rollouts;
pub mod sandbox;
pub mod sessions;
pub mod state;
pub mod tenancy;
pub mod wire;
pub mod workspaces;

pub use config::{load_config, resolve_counts, ServeSection};
pub use error::{ApiError, ApiResult, ErrorKind};
pub use requests::is_record as is_request_record;
pub use state::Service;
