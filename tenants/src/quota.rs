//! Quotas: what a tenant may use at once (live forks, memory, disk) or per period (build
//! minutes a day, requests a second), and the refusal that names one.

use std::collections::BTreeMap;
use std::str::FromStr;

/// One quota of a tenant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Quota {
    /// Live sandboxes and sessions (paused ones count under disk).
    Live,
    /// MiB of guest memory of its live sandboxes and sessions.
    MemoryMib,
    /// MiB of disk of its environments and paused sandboxes and sessions.
    DiskMib,
    /// Minutes of environment builds it may start a day (UTC).
    BuildMinutesPerDay,
    /// Requests a second (a burst of as many is allowed).
    RequestsPerSecond,
    /// Connections open at once: output streams, terminals, port connections, sockets
    /// (without a quota, the service's `serve.max_connections_per_tenant`).
    Connections,
}

impl Quota {
    pub const ALL: [Quota; 6] = [
        Quota::Live,
        Quota::MemoryMib,
        Quota::DiskMib,
        Quota::BuildMinutesPerDay,
        Quota::RequestsPerSecond,
        Quota::Connections,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Quota::Live => "live",
            Quota::MemoryMib => "memory_mib",
            Quota::DiskMib => "disk_mib",
            Quota::BuildMinutesPerDay => "build_minutes_per_day",
            Quota::RequestsPerSecond => "requests_per_second",
            Quota::Connections => "connections",
        }
    }
}

impl std::fmt::Display for Quota {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Quota {
    type Err = String;
    fn from_str(s: &str) -> Result<Quota, String> {
        Quota::ALL.into_iter().find(|q| q.as_str() == s).ok_or_else(|| {
            let names: Vec<&str> = Quota::ALL.iter().map(|q| q.as_str()).collect();
            format!("no quota {s:?}; the quotas are {}", names.join(", "))
        })
    }
}

/// A tenant's quotas (absent: no limit).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Quotas(BTreeMap<Quota, u64>);

impl Quotas {
    pub fn get(&self, quota: Quota) -> Option<u64> {
        self.0.get(&quota).copied()
    }

    pub fn set(&mut self, quota: Quota, value: u64) {
        self.0.insert(quota, value);
    }

    pub fn iter(&self) -> impl Iterator<Item = (Quota, u64)> + '_ {
        self.0.iter().map(|(q, v)| (*q, *v))
    }

    /// Ok when `used + adding` stays within the quota (or there is none).
    pub fn check(&self, quota: Quota, used: u64, adding: u64) -> Result<(), Exceeded> {
        match self.get(quota) {
            Some(limit) if used.saturating_add(adding) > limit => Err(Exceeded {
                quota,
                limit,
                used,
                retry_after_secs: None,
            }),
            _ => Ok(()),
        }
    }
}

/// A request over a quota: HTTP 429 with these figures (and `Retry-After` where waiting helps).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("over the tenant's quota {quota}: the limit is {limit} and {used} is in use{}", match .retry_after_secs { Some(s) => format!("; retry after {s} s"), None => String::new() })]
pub struct Exceeded {
    pub quota: Quota,
    pub limit: u64,
    pub used: u64,
    pub retry_after_secs: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotas_parse_and_check() {
        for q in Quota::ALL {
            assert_eq!(q.as_str().parse::<Quota>(), Ok(q));
        }
        let err = "cpu".parse::<Quota>().unwrap_err();
        assert!(err.contains("live, memory_mib"), "{err}");
        let mut quotas = Quotas::default();
        assert!(quotas.check(Quota::Live, 100, 1).is_ok(), "no quota, no limit");
        quotas.set(Quota::Live, 2);
        assert!(quotas.check(Quota::Live, 1, 1).is_ok());
        let e = quotas.check(Quota::Live, 2, 1).unwrap_err();
        assert_eq!((e.limit, e.used), (2, 2));
        assert!(
            e.to_string().contains("quota live: the limit is 2 and 2 is in use"),
            "{e}"
        );
    }
}
