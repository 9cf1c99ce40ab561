//! Tenants of `farm serve`: who is calling (an API key, stored as its SHA-256 and shown once),
//! what each tenant may use (quotas, granted network policies), which ids each one owns, an
//! append-only audit of every call that changed state, and fair admission between tenants.
//!
//! Everything lives in one SQLite database (WAL mode; the migrations in `migrations/` are
//! versioned by `PRAGMA user_version`), created on first use. `farm serve` and `farm tenant`
//! open the same file: a key added or revoked by the command counts at the service's next
//! request, with no restart.
//!
//! The single-token set-up is the tenant `default` (id 1, made by the first migration): the
//! service token, or no token on loopback, is it.

// The checkout this crate is built in (`.cargo/config.toml`): its build is never another clone's.
const _: Option<&str> = option_env!("FARM_CHECKOUT");

mod audit;
mod db;
mod events;
pub mod fair;
mod keys;
mod owners;
mod quota;
pub mod rate;
mod workspaces;

pub use audit::{AuditFilter, AuditRecord};
pub use db::{Db, Error, TenantSummary};
pub use events::{EventFilter, StoredEvent, Webhook};
pub use keys::{AuthError, KeyInfo, NewKey, KEY_PREFIX};
pub use owners::{Kind, Owner, Owners, UNKNOWN_BUILD_MS};
pub use quota::{Exceeded, Quota, Quotas};
pub use workspaces::{Claim, WorkspaceRow};

/// A tenant's id in the database.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub struct TenantId(pub i64);

/// The tenant of the single-token set-up.
pub const DEFAULT: TenantId = TenantId(1);

/// A tenant.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Tenant {
    pub id: TenantId,
    pub name: String,
    /// Its share of a full node's queue, against other tenants' weights.
    pub weight: u32,
    pub created_ms: u64,
}

/// Who made a request: a tenant, and the key it used (`service-token`, `no-token`, a key's
/// id, or `mcp:SESSION` for a session's MCP token). Never the secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub tenant: Tenant,
    pub key_id: String,
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// A tenant's name: 1 to 64 of `a-z 0-9 _ -`, starting with a letter or digit (it is a
/// metric label and a command-line word).
pub fn check_name(name: &str) -> Result<(), Error> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
        && name.as_bytes()[0].is_ascii_alphanumeric();
    if ok {
        Ok(())
    } else {
        Err(Error::Invalid(format!(
            "a tenant's name is 1 to 64 of a-z, 0-9, '_' and '-', starting with a letter or digit; got {name:?}"
        )))
    }
}
