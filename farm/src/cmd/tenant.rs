//! `farm tenant`: the tenants of `farm serve`, their keys, quotas and grants, and the audit.
//! It writes the service's database directly: a change counts at the service's next request,
//! with no restart.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};

use crate::ui::outln;
use tenants::{AuditFilter, Db, Quota};

#[derive(Args)]
pub struct TenantArgs {
    /// The tenants database: `serve.tenants_db`, by default `tenants.db` in the service's
    /// output folder (made on first use).
    #[arg(long, default_value = "serve-out/tenants.db", global = true)]
    db: PathBuf,
    /// Print JSON instead of text.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: TenantCommand,
}

#[derive(Subcommand)]
enum TenantCommand {
    /// Add a tenant (it has no key until `farm tenant key add`).
    Add {
        name: String,
        /// Its share of a full node's queue against other tenants' weights (1-1000).
        #[arg(long, default_value_t = 1)]
        weight: u32,
    },
    /// Every tenant, with its live keys, quotas and granted network policies.
    List,
    /// Set a tenant's weight.
    Weight { name: String, weight: u32 },
    /// API keys.
    #[command(subcommand)]
    Key(KeyCommand),
    /// Quotas.
    #[command(subcommand)]
    Quota(QuotaCommand),
    /// Let a tenant name a network policy (`serve.sandboxes.networks`) for its sandboxes.
    Grant { name: String, policy: String },
    /// Take a network policy back.
    Ungrant { name: String, policy: String },
    /// Calls that changed state, oldest first: time, tenant, key id, route, target, status.
    Audit {
        /// Only this tenant's.
        #[arg(long)]
        tenant: Option<String>,
        /// Only the last this long (30s, 15m, 12h, 7d).
        #[arg(long)]
        since: Option<String>,
        /// The newest this many.
        #[arg(long, default_value_t = 100)]
        limit: usize,
    },
}

#[derive(Subcommand)]
enum KeyCommand {
    /// Make a key: its secret is printed this once (only its digest is kept).
    Add {
        name: String,
        /// It stops working this long from now (30s, 15m, 12h, 7d); default: never.
        #[arg(long)]
        expires_in: Option<String>,
    },
    /// Keys (never their secrets), of one tenant or all.
    List { name: Option<String> },
    /// Revoke a key by its id (`k-...`): refused from the service's next request on.
    Revoke { id: String },
}

#[derive(Subcommand)]
enum QuotaCommand {
    /// Set a quota: live, memory_mib, disk_mib, build_minutes_per_day, requests_per_second, connections;
    /// VALUE `none` removes it.
    Set { name: String, quota: String, value: String },
}

/// `30s`, `15m`, `12h`, `7d` in milliseconds.
fn duration_ms(text: &str) -> Result<u64> {
    let units = [("s", 1_000), ("m", 60_000), ("h", 3_600_000), ("d", 86_400_000u64)];
    let Some((number, scale)) = units
        .iter()
        .find_map(|(unit, scale)| text.strip_suffix(unit).map(|n| (n, *scale)))
    else {
        bail!("{text:?}: expected a number and a unit, s, m, h or d (like 30d)")
    };
    let n: u64 = number
        .parse()
        .with_context(|| format!("{text:?}: expected a number and a unit, s, m, h or d (like 30d)"))?;
    Ok(n.saturating_mul(scale))
}

fn time(ms: u64) -> String {
    let secs = ms / 1000;
    let (days, rest) = (secs / 86_400, secs % 86_400);
    // Civil date from days since the epoch (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

pub fn run(args: TenantArgs) -> Result<i32> {
    let db = Db::open(&args.db)?;
    let json = args.json;
    match args.command {
        TenantCommand::Add { name, weight } => {
            let t = db.add_tenant(&name, weight)?;
            if json {
                print_json(&t)?;
            } else {
                outln!(
                    "tenant {} added (weight {}); make it a key: farm tenant key add {}",
                    t.name,
                    t.weight,
                    t.name
                );
            }
        }
        TenantCommand::List => list(&db, json)?,
        TenantCommand::Weight { name, weight } => {
            db.set_weight(&name, weight)?;
            outln!("tenant {name}: weight {weight}");
        }
        TenantCommand::Key(command) => key(&db, command, json)?,
        TenantCommand::Quota(QuotaCommand::Set { name, quota, value }) => {
            let q: Quota = quota.parse().map_err(|e: String| anyhow::anyhow!("QUOTA: {e}"))?;
            let v = match value.as_str() {
                "none" => None,
                v => Some(
                    v.parse::<u64>()
                        .with_context(|| format!("VALUE: expected a whole number or `none`; got {v:?}"))?,
                ),
            };
            db.set_quota(&name, q, v)?;
            outln!(
                "tenant {name}: {q} {}",
                v.map_or("has no limit".to_string(), |v| format!("= {v}"))
            );
        }
        TenantCommand::Grant { name, policy } => {
            db.grant(&name, &policy, true)?;
            outln!("tenant {name} may name the network policy {policy:?}");
        }
        TenantCommand::Ungrant { name, policy } => {
            db.grant(&name, &policy, false)?;
            outln!("tenant {name} may no longer name the network policy {policy:?}");
        }
        TenantCommand::Audit { tenant, since, limit } => audit(&db, tenant, since, limit, json)?,
    }
    Ok(0)
}

fn print_json(value: &impl serde::Serialize) -> Result<()> {
    outln!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

fn list(db: &Db, json: bool) -> Result<()> {
    let all = db.tenants()?;
    if json {
        return print_json(&all);
    }
    for s in all {
        let quotas: Vec<String> = s.quotas.iter().map(|(q, v)| format!("{q}={v}")).collect();
        let grants: Vec<&str> = s.grants.iter().map(String::as_str).collect();
        outln!(
            "{:<20} weight {:<4} keys {:<3} quotas [{}] networks [{}]",
            s.tenant.name,
            s.tenant.weight,
            s.live_keys,
            quotas.join(" "),
            grants.join(" ")
        );
    }
    Ok(())
}

fn key(db: &Db, command: KeyCommand, json: bool) -> Result<()> {
    match command {
        KeyCommand::Add { name, expires_in } => {
            let expires = expires_in
                .as_deref()
                .map(duration_ms)
                .transpose()?
                .map(|d| tenants::now_ms().saturating_add(d));
            let key = db.add_key(&name, expires)?;
            if json {
                return print_json(&key);
            }
            outln!("{}", key.secret);
            eprintln!(
                "key {} of tenant {}{}: the line above is its secret, shown this once (use it as the bearer token)",
                key.id,
                key.tenant,
                key.expires_ms
                    .map(|e| format!(", expires {}", time(e)))
                    .unwrap_or_default()
            );
        }
        KeyCommand::List { name } => {
            let keys = db.keys(name.as_deref())?;
            if json {
                return print_json(&keys);
            }
            for k in keys {
                let state = match (k.revoked_ms, k.expires_ms) {
                    (Some(r), _) => format!("revoked {}", time(r)),
                    (None, Some(e)) if e <= tenants::now_ms() => format!("expired {}", time(e)),
                    (None, Some(e)) => format!("expires {}", time(e)),
                    (None, None) => "live".to_string(),
                };
                outln!("{:<16} {:<20} made {} {state}", k.id, k.tenant, time(k.created_ms));
            }
        }
        KeyCommand::Revoke { id } => {
            db.revoke_key(&id)?;
            outln!("key {id} revoked");
        }
    }
    Ok(())
}

fn audit(db: &Db, tenant: Option<String>, since: Option<String>, limit: usize, json: bool) -> Result<()> {
    let since_ms = since
        .as_deref()
        .map(duration_ms)
        .transpose()?
        .map(|d| tenants::now_ms().saturating_sub(d));
    let records = db.audit(&AuditFilter {
        tenant,
        since_ms,
        limit,
    })?;
    if json {
        return print_json(&records);
    }
    for r in records {
        outln!(
            "{} {:<16} {:<14} {:<44} {:<24} {}",
            time(r.at_ms),
            r.tenant,
            r.key_id,
            r.route,
            r.target.as_deref().unwrap_or("-"),
            r.status
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_and_times() {
        assert_eq!(duration_ms("30d").unwrap(), 30 * 86_400_000);
        assert_eq!(duration_ms("15m").unwrap(), 900_000);
        assert!(duration_ms("15").is_err());
        assert!(duration_ms("xh").is_err());
        assert!(duration_ms("").is_err());
        assert!(
            duration_ms("5é").is_err(),
            "a unit that is not ASCII is an error, not a panic"
        );
        assert_eq!(duration_ms("99999999999999999d").unwrap(), u64::MAX);
        assert_eq!(time(0), "1970-01-01T00:00:00Z");
        assert_eq!(time(1_798_761_600_000), "2027-01-01T00:00:00Z");
    }
}
