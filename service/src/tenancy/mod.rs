//! Tenants in `farm serve`: who calls ([`Who`], from the bearer token), what each tenant owns
//! and may use, and what it holds open ([`Connections`]). The HTTP transport's middleware
//! holds every route to it.
//!
//! The database is the `tenants` crate's (`serve.tenants_db`, by default `tenants.db` in the
//! output folder); `farm tenant` writes the same file, and a change counts at the next request.
//! A tenant's quotas and grants are read again at most every [`PROFILE_TTL`].

mod adopt;
mod held;
pub mod usage;

use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

pub use held::{Connections, Held};
use tenants::{Caller, Db, Exceeded, Kind, Owners, Quotas, Tenant, TenantId, KEY_PREFIX};

use super::error::ApiError;
use crate::error::ErrorKind;

/// How long a tenant's quotas, grants and weight are cached.
const PROFILE_TTL: Duration = Duration::from_secs(1);

/// A tenant as a request sees it: its quotas and the network policies it may name.
#[derive(Debug, Clone)]
pub struct Profile {
    pub tenant: Tenant,
    pub quotas: Quotas,
    pub grants: BTreeSet<String>,
}

impl Profile {
    pub fn id(&self) -> TenantId {
        self.tenant.id
    }

    /// The tenant of the single-token set-up: every network policy is its to name.
    pub fn is_default(&self) -> bool {
        self.tenant.id == tenants::DEFAULT
    }

    pub fn may_use_network(&self, name: &str) -> bool {
        self.is_default() || self.grants.contains(name)
    }
}

/// Who made a request (in the request's extensions for the handlers).
#[derive(Debug, Clone)]
pub struct Who {
    pub profile: Arc<Profile>,
    /// The key's id (`k-...`), `service-token`, `no-token` or `mcp:SESSION`; never a secret.
    pub key_id: String,
}

/// The key id of a caller who holds one sandbox's access token, before the sandbox's id.
const SANDBOX_ACCESS: &str = "sandbox:";

/// The key id of a caller who holds a signed file URL of one sandbox (E2B's `download_url`
/// and `upload_url`), before the sandbox's id: it opens the one file operation signed.
const SIGNED_FILE: &str = "signed-file:";

/// What a signed file URL claims (E2B's v1 signature): the operation on one path as one
/// user, until an expiry, signed with a sandbox's access token as
/// `v1_` + base64(SHA-256(`path:operation:user:token[:expiration]`)), unpadded.
pub struct SignedFile<'a> {
    pub path: &'a str,
    /// A write (an upload); otherwise a read.
    pub write: bool,
    pub user: &'a str,
    /// Seconds since the epoch after which it is refused.
    pub expiration: Option<u64>,
    pub signature: &'a str,
}

impl SignedFile<'_> {
    /// The signature `token` makes of this claim.
    fn signed_with(&self, token: &str) -> String {
        use base64::Engine;
        let operation = if self.write { "write" } else { "read" };
        let mut raw = format!("{}:{operation}:{}:{token}", self.path, self.user);
        if let Some(expiration) = self.expiration {
            raw.push_str(&format!(":{expiration}"));
        }
        let digest = Sha256::digest(raw.as_bytes());
        format!("v1_{}", base64::engine::general_purpose::STANDARD_NO_PAD.encode(digest))
    }
}

impl Who {
    pub fn tenant(&self) -> TenantId {
        self.profile.id()
    }

    /// The sandbox whose access token the caller holds, when that is how it was identified
    /// (a tenant's key or the service token: None).
    pub fn sandbox_access(&self) -> Option<&str> {
        self.key_id.strip_prefix(SANDBOX_ACCESS)
    }

    /// The sandbox whose signed file URL the caller holds, when that is how it was
    /// identified.
    pub fn signed_file(&self) -> Option<&str> {
        self.key_id.strip_prefix(SIGNED_FILE)
    }
}

/// The tenants of one service.
pub struct Tenancy {
    pub db: Db,
    pub owners: Owners,
    rate: tenants::rate::RateLimiter,
    /// The database's secret: the key of non-default tenants' MCP session tokens when the
    /// service has no token of its own.
    secret: [u8; 32],
    /// SHA-256 of the service token, when one is set.
    service_token: Option<[u8; 32]>,
    profiles: Mutex<HashMap<TenantId, (Instant, Arc<Profile>)>>,
    /// Forks being made right now, by tenant: (count, MiB), so that requests racing each other
    /// cannot pass a quota together.
    pending: Mutex<HashMap<TenantId, (u64, u64)>>,
    /// Builds running, by tenant (see `Service::admit_build`).
    builds: Mutex<HashMap<TenantId, u64>>,
    /// Whether any tenant besides `default` exists, and when that was read.
    others: Mutex<Option<(Instant, bool)>>,
    /// Connections each tenant holds open.
    pub connections: Arc<Connections>,
}

impl Tenancy {
    /// The tenants of `path`, each holding at most `connections` open connections unless its
    /// quota says otherwise.
    pub fn open(path: &Path, service_token: Option<&str>, connections: u64) -> anyhow::Result<Tenancy> {
        let db = Db::open(path)?;
        let owners = Owners::load(&db)?;
        let secret = db.secret()?;
        Ok(Tenancy {
            db,
            owners,
            rate: Default::default(),
            secret,
            service_token: service_token.map(|t| Sha256::digest(t.as_bytes()).into()),
            profiles: Mutex::new(HashMap::new()),
            pending: Mutex::new(HashMap::new()),
            builds: Mutex::new(HashMap::new()),
            others: Mutex::new(None),
            connections: Connections::new(connections),
        })
    }

    /// The tenants of a service: `serve.tenants_db`, else `tenants.db` in its output folder.
    pub fn open_for(
        settings: &super::ServeSection,
        out: &Path,
        service_token: Option<&str>,
    ) -> anyhow::Result<Arc<Tenancy>> {
        let path = settings.tenants_db.clone().unwrap_or_else(|| out.join("tenants.db"));
        Ok(Arc::new(Tenancy::open(
            &path,
            service_token,
            settings.max_connections_per_tenant,
        )?))
    }

    /// A tenant's profile, from the cache or the database.
    pub fn profile(&self, tenant: &Tenant) -> Result<Arc<Profile>, ApiError> {
        let mut cache = self.profiles.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((at, p)) = cache.get(&tenant.id) {
            if at.elapsed() < PROFILE_TTL && p.tenant == *tenant {
                return Ok(p.clone());
            }
        }
        let profile = Arc::new(Profile {
            tenant: tenant.clone(),
            quotas: self.db.quotas(tenant.id)?,
            grants: self.db.grants(tenant.id)?,
        });
        cache.insert(tenant.id, (Instant::now(), profile.clone()));
        Ok(profile)
    }

    /// The profile of a tenant by id (for work the service does on a tenant's behalf).
    pub fn profile_of(&self, id: TenantId) -> Result<Arc<Profile>, ApiError> {
        self.profile(&self.db.tenant_by_id(id)?)
    }

    /// Who sends the bearer token `given` (empty: none) to `path`, or a 401.
    ///
    /// - A bearer token that starts with `farm_` is a tenant's key: it must be live.
    /// - On a session's MCP route, that session's MCP token is its owner.
    /// - Else the service token (when one is set) is the default tenant; with no service token
    ///   every other request is the default tenant, as before tenants.
    pub fn identify(&self, given: &str, path: &str) -> Result<Who, ApiError> {
        if given.starts_with(KEY_PREFIX) {
            return match self.db.authenticate(given, tenants::now_ms())? {
                Ok(Caller { tenant, key_id }) => Ok(Who {
                    profile: self.profile(&tenant)?,
                    key_id,
                }),
                Err(e) => Err(unauthorized(&e.to_string())),
            };
        }
        if let Some(session) = mcp_session(path).filter(|_| !given.is_empty()) {
            for owner in self.owners.of(Kind::Session, session) {
                let token = self.mcp_token(owner.tenant, session);
                if token.is_some_and(|t| bool::from(t.as_bytes().ct_eq(given.as_bytes()))) {
                    return Ok(Who {
                        profile: self.profile_of(owner.tenant)?,
                        key_id: format!("mcp:{session}"),
                    });
                }
            }
        }
        let default = || self.profile_of(tenants::DEFAULT);
        match &self.service_token {
            Some(expected) => {
                let digest: [u8; 32] = Sha256::digest(given.as_bytes()).into();
                if bool::from(digest.ct_eq(expected)) {
                    Ok(Who {
                        profile: default()?,
                        key_id: "service-token".into(),
                    })
                } else {
                    Err(unauthorized("a bearer token is required (Authorization: Bearer ...)"))
                }
            }
            // Without a service token, on loopback: anyone is `default`, until another tenant
            // exists; then a key is needed (else anyone could drop theirs and be `default`).
            None if self.has_other_tenants() => Err(unauthorized(
                "this service has tenants: a tenant's key is required (Authorization: Bearer farm_...)",
            )),
            None => Ok(Who {
                profile: default()?,
                key_id: "no-token".into(),
            }),
        }
    }

    /// The bearer token a session's MCP route also takes, for the agent in it: for the default
    /// tenant, as before tenants (none without a service token); for any other, keyed by the
    /// database's secret, and by the tenant.
    pub fn mcp_token(&self, tenant: TenantId, session: &str) -> Option<String> {
        if tenant == tenants::DEFAULT {
            return mcp_hmac(self.service_token.as_ref(), session);
        }
        // The database's secret: the service token's holder cannot make a tenant's tokens.
        mcp_hmac(Some(&self.secret), &format!("tenant {} session {session}", tenant.0))
    }

    /// The access token of sandbox `sandbox` of `tenant` that E2B's protocol hands its client
    /// (`envdAccessToken`): HMAC-SHA256 under the database's secret of the tenant and the
    /// sandbox. It opens that one sandbox's in-sandbox routes and nothing else; from it
    /// neither the tenant's key nor another sandbox's token follows.
    pub fn sandbox_access_token(&self, tenant: TenantId, sandbox: &str) -> String {
        mcp_hmac(
            Some(&self.secret),
            &format!("e2b tenant {} sandbox {sandbox}", tenant.0),
        )
        .expect("a key is given")
    }

    /// The key in E2B's host names of sandbox `sandbox`'s ports
    /// (`{port}-{sandbox}.{key}.DOMAIN`, what the SDK's `get_host` makes of a create's
    /// `domain`): 128 bits of an HMAC of the tenant and the sandbox under the tenants
    /// database's secret, apart from the access token (a URL shown to someone opens the
    /// sandbox's ports, not its processes and files).
    pub fn sandbox_host_key(&self, tenant: TenantId, sandbox: &str) -> String {
        let mac = mcp_hmac(
            Some(&self.secret),
            &format!("e2b host tenant {} sandbox {sandbox}", tenant.0),
        )
        .expect("a key is given");
        mac[..32].to_string()
    }

    /// Whether `key` is sandbox `sandbox`'s host key (compared in constant time).
    pub fn is_sandbox_host_key(&self, sandbox: &str, key: &str) -> bool {
        sandbox.len() <= crate::bounds::ID_BYTES
            && self.owners.of(Kind::Sandbox, sandbox).iter().any(|owner| {
                bool::from(
                    self.sandbox_host_key(owner.tenant, sandbox)
                        .as_bytes()
                        .ct_eq(key.as_bytes()),
                )
            })
    }

    /// Who holds `token` for sandbox `sandbox`: its owner, with the key id `sandbox:ID`
    /// (which [`Who::sandbox_access`] reads), or a 401 that says nothing of the sandbox.
    pub fn identify_sandbox_access(&self, sandbox: &str, token: &str) -> Result<Who, ApiError> {
        if !sandbox.is_empty() && !token.is_empty() && sandbox.len() <= crate::bounds::ID_BYTES {
            for owner in self.owners.of(Kind::Sandbox, sandbox) {
                let expected = self.sandbox_access_token(owner.tenant, sandbox);
                if bool::from(expected.as_bytes().ct_eq(token.as_bytes())) {
                    return Ok(Who {
                        profile: self.profile_of(owner.tenant)?,
                        key_id: format!("{SANDBOX_ACCESS}{sandbox}"),
                    });
                }
            }
        }
        Err(unauthorized(
            "a sandbox's own routes need its access token (X-Access-Token) and its id (E2b-Sandbox-Id)",
        ))
    }

    /// Who holds a signed file URL (E2B's `download_url`, `upload_url`, which name no
    /// sandbox): the owner of the one sandbox whose access token made its signature, found
    /// among the node's sandboxes (compared in constant time), with the key id
    /// `signed-file:ID` ([`Who::signed_file`]); or a 401 that says nothing of any sandbox. An
    /// expired claim is refused before any is looked at.
    pub fn identify_signed_file(&self, file: &SignedFile<'_>, now_s: u64) -> Result<Who, ApiError> {
        if file.expiration.is_some_and(|at| at < now_s) {
            return Err(unauthorized("the signed file URL has expired: sign a new one"));
        }
        if file.path.is_empty() {
            // An upload with no path writes where its parts' names say: nothing signed.
            return Err(unauthorized("a signed file URL names its file (path)"));
        }
        // `v1_` and 43 characters of base64: anything else matches no sandbox.
        if file.signature.len() == 46 && file.signature.starts_with("v1_") {
            for (sandbox, tenant) in self.owners.all(Kind::Sandbox) {
                let expected = file.signed_with(&self.sandbox_access_token(tenant, &sandbox));
                if bool::from(expected.as_bytes().ct_eq(file.signature.as_bytes())) {
                    return Ok(Who {
                        profile: self.profile_of(tenant)?,
                        key_id: format!("{SIGNED_FILE}{sandbox}"),
                    });
                }
            }
        }
        Err(unauthorized(
            "the file URL's signature is not one of a sandbox's (its path, operation, user and expiry are signed)",
        ))
    }

    /// One more connection the caller holds open (a stream, a terminal, a socket), or a 429.
    pub fn hold(&self, who: &Who) -> Result<Held, ApiError> {
        self.connections.hold(who).map_err(|e| over_quota(who, e))
    }

    /// One more connection through a port of sandbox `id`, held by its owner.
    pub fn hold_for_sandbox(&self, id: &str) -> Result<Held, ApiError> {
        let owner = self
            .owners
            .of(Kind::Sandbox, id)
            .first()
            .map(|o| o.tenant)
            .ok_or_else(|| not_found(Kind::Sandbox, id))?;
        let quota = self.profile_of(owner)?.quotas.get(tenants::Quota::Connections);
        self.connections
            .hold_for(owner, quota, None)
            .map_err(|e| ApiError::quota(&e))
    }

    /// Ends the connections opened with keys revoked or expired since (every second).
    pub async fn end_revoked(self: &Arc<Self>) {
        let this = self.clone();
        let _ = tokio::task::spawn_blocking(move || {
            let now = tenants::now_ms();
            // A key the database cannot say is live is taken as not live.
            this.connections
                .end_revoked(|key| this.db.key_live(key, now).unwrap_or(false));
        })
        .await;
    }

    /// Whether a tenant besides `default` exists (read again at most every second).
    fn has_other_tenants(&self) -> bool {
        let mut cached = self.others.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((at, yes)) = *cached {
            if at.elapsed() < PROFILE_TTL {
                return yes;
            }
        }
        // A database that cannot be read is taken to have tenants: no one is let in as default.
        let yes = self.db.tenant_count().map(|n| n > 1).unwrap_or(true);
        *cached = Some((Instant::now(), yes));
        yes
    }

    /// A message on a socket the caller opened (OpenEnv): its key must still be live (401
    /// otherwise: the socket closes), and the message is a request against its rate (429).
    pub fn admit_message(&self, who: &Who) -> Result<(), ApiError> {
        if who.key_id.starts_with("k-") && !self.db.key_live(&who.key_id, tenants::now_ms())? {
            return Err(unauthorized(&format!("key {} was revoked or has expired", who.key_id)));
        }
        self.take_request(who).map_err(|e| over_quota(who, e))
    }

    /// One request of the caller's allowance a second.
    pub fn take_request(&self, who: &Who) -> Result<(), Exceeded> {
        match who.profile.quotas.get(tenants::Quota::RequestsPerSecond) {
            Some(rate) => self.rate.take(who.tenant(), rate, Instant::now()),
            None => Ok(()),
        }
    }

    /// Records that the caller owns these ids, visible now.
    pub fn own(&self, tenant: TenantId, kind: Kind, ids: &[String]) -> Result<(), ApiError> {
        let now = tenants::now_ms();
        Ok(self.owners.own(&self.db, kind, ids, tenant, now, now)?)
    }

    /// Whether the caller may see the id: its own.
    pub fn sees(&self, who: &Who, kind: Kind, id: &str) -> bool {
        self.owns(who.tenant(), kind, id)
    }

    /// Appends a call that changed state to the audit (a failure to is logged: the call
    /// stands).
    pub fn audit(&self, who: &Who, route: &str, target: Option<String>, status: u16) {
        let record = tenants::AuditRecord {
            at_ms: tenants::now_ms(),
            tenant: who.profile.tenant.name.clone(),
            key_id: who.key_id.clone(),
            route: route.to_string(),
            target,
            status,
        };
        if let Err(e) = self.db.audit_append(&record) {
            tracing::error!("appending to the audit: {e}");
        }
    }

    /// Whether `tenant` owns the id.
    pub fn owns(&self, tenant: TenantId, kind: Kind, id: &str) -> bool {
        self.owners.owner(kind, id, tenant).is_some()
    }
}

/// The bearer token a session's MCP endpoint (`/v1/sessions/{id}/mcp`) also accepts, for the
/// agent that acts in it: HMAC-SHA256 of the session's id under `key` (the service token's
/// digest, or the tenants database's secret). It opens that one route of that one session,
/// and from it neither the key nor another session's token follows. None without a key.
pub fn mcp_hmac(key: Option<&[u8; 32]>, session_id: &str) -> Option<String> {
    use hmac::{Hmac, Mac};
    let key = key?;
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes any key length");
    mac.update(b"farm mcp session ");
    mac.update(session_id.as_bytes());
    Some(mac.finalize().into_bytes().iter().map(|b| format!("{b:02x}")).collect())
}

/// The token of an `Authorization: Bearer TOKEN` header's value (empty: none).
pub fn bearer(authorization: Option<&str>) -> &str {
    authorization
        .and_then(|v| {
            v.get(..7)
                .filter(|s| s.eq_ignore_ascii_case("bearer "))
                .map(|_| &v[7..])
        })
        .unwrap_or("")
}

/// A 401 with the challenge header.
pub fn unauthorized(message: &str) -> ApiError {
    ApiError::new(ErrorKind::Unauthenticated, message.to_string()).challenge()
}

/// The session whose MCP endpoint `path` is, if it is one.
pub fn mcp_session(path: &str) -> Option<&str> {
    let id = path.strip_prefix("/v1/sessions/")?.strip_suffix("/mcp")?;
    (!id.is_empty() && !id.contains('/')).then_some(id)
}

/// The answer for an id the caller does not own: the same whether it is another tenant's or
/// never was.
pub fn not_found(kind: Kind, id: &str) -> ApiError {
    ApiError::new(ErrorKind::NotFound, format!("no {} {id:?}", kind.as_str()))
}

/// A 429 naming the quota, its limit and its use (with `Retry-After` where waiting helps).
pub fn over_quota(who: &Who, e: Exceeded) -> ApiError {
    engine::metrics::get()
        .tenant_refusals
        .with_label_values(&[who.profile.tenant.name.as_str(), e.quota.as_str()])
        .inc();
    ApiError::quota(&e)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(auth: Option<&str>) -> &str {
        bearer(auth)
    }

    #[test]
    fn who_calls_by_key_service_token_or_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tenants.db");
        // No tenant, no service token (loopback): anyone is `default`, as before tenants.
        let t = Tenancy::open(&path, None, 8).unwrap();
        assert_eq!(t.identify(headers(None), "/v1/sandboxes").unwrap().key_id, "no-token");
        drop(t);
        let db = Db::open(&path).unwrap();
        let a = db.add_tenant("a", 1).unwrap();
        let key = db.add_key("a", None).unwrap();
        drop(db);
        // Once a tenant exists, no key is no entry (else B could drop its key to be default).
        let t = Tenancy::open(&path, None, 8).unwrap();
        assert_eq!(
            t.identify(headers(None), "/v1/sandboxes").unwrap_err().kind,
            ErrorKind::Unauthenticated
        );
        let who = t
            .identify(headers(Some(&format!("bearer {}", key.secret))), "/v1/sandboxes")
            .unwrap();
        assert_eq!(
            (who.profile.tenant.name.as_str(), who.key_id.as_str()),
            ("a", key.id.as_str())
        );
        for bad in ["Bearer farm_0000", "Bearer farm_", "Bearer x"] {
            assert_eq!(
                t.identify(headers(Some(bad)), "/v1/sandboxes").unwrap_err().kind,
                ErrorKind::Unauthenticated,
                "{bad}"
            );
        }
        // With a service token: it is `default`; nothing else but keys opens.
        let s = Tenancy::open(&path, Some("svc"), 8).unwrap();
        assert_eq!(
            s.identify(headers(Some("Bearer svc")), "/").unwrap().key_id,
            "service-token"
        );
        assert_eq!(
            s.identify(headers(None), "/").unwrap_err().kind,
            ErrorKind::Unauthenticated
        );
        // A tenant's MCP token is keyed by the database's secret, never by the service token,
        // and opens its own session's MCP route only.
        s.own(a.id, Kind::Session, &["s-1".to_string()]).unwrap();
        let token = s.mcp_token(a.id, "s-1").unwrap();
        assert_eq!(
            t.mcp_token(a.id, "s-1").unwrap(),
            token,
            "the same whatever the service token"
        );
        let svc_digest: [u8; 32] = Sha256::digest(b"svc").into();
        assert_ne!(super::mcp_hmac(Some(&svc_digest), "s-1").unwrap(), token);
        let bearer = format!("Bearer {token}");
        let who = s.identify(headers(Some(&bearer)), "/v1/sessions/s-1/mcp").unwrap();
        assert_eq!((who.tenant(), who.key_id.as_str()), (a.id, "mcp:s-1"));
        for path in ["/v1/sessions/s-2/mcp", "/v1/sessions/s-1", "/v1/sandboxes"] {
            assert_eq!(
                s.identify(headers(Some(&bearer)), path).unwrap_err().kind,
                ErrorKind::Unauthenticated,
                "{path}"
            );
        }
    }

    #[test]
    fn an_mcp_token_opens_one_sessions_endpoint_only() {
        let key = |t: &str| -> [u8; 32] { Sha256::digest(t.as_bytes()).into() };
        let (a, b) = (key("secret"), key("other"));
        let t = mcp_hmac(Some(&a), "s-1").unwrap();
        assert_eq!(t.len(), 64);
        assert_eq!(
            mcp_hmac(Some(&a), "s-1"),
            Some(t.clone()),
            "stable across calls (and restarts)"
        );
        assert_ne!(mcp_hmac(Some(&a), "s-2").unwrap(), t);
        assert_ne!(mcp_hmac(Some(&b), "s-1").unwrap(), t, "keyed by the service token");
        assert_eq!(mcp_hmac(None, "s-1"), None);
        assert_eq!(mcp_session("/v1/sessions/s-1/mcp"), Some("s-1"));
        for path in [
            "/v1/sessions/s-1",
            "/v1/sessions//mcp",
            "/v1/sessions/s-1/x/mcp",
            "/v1/sessions/s-1/mcp/",
        ] {
            assert_eq!(mcp_session(path), None, "{path}");
        }
    }
}
