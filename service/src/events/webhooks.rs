//! Tenants' webhooks: each is sent every event of its tenant made after it, one POST per
//! event, in id order, at least once (it moves on only after a 2xx; a client deduplicates by
//! `farm-event-id`). A failing URL is tried again with backoff (1 s doubling to 5 min), and
//! its place is kept in the database across restarts.
//!
//! Every delivery is signed: `farm-signature: sha256=HEX`, the HMAC-SHA256 under the
//! webhook's secret (shown once, when it is made) of `"{farm-timestamp}.{body}"`. A URL may
//! only name a host the operator allowed (`serve.events.webhook_hosts`), and redirects are
//! not followed: no tenant can point the service at the host's own network.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hmac::{Hmac, Mac};
use sha2::Sha256;
use tenants::{TenantId, Webhook};

use super::Events;
use crate::error::{ApiError, ApiResult, ErrorKind};
use crate::wire::events::{WebhookList, WebhookView};

/// The most webhooks a tenant may have.
pub const MAX_PER_TENANT: usize = 10;
/// The longest URL.
pub const MAX_URL_BYTES: usize = 2048;
/// Events one delivery round sends a webhook at most (then the next round goes on).
const ROUND: usize = 64;
const TIMEOUT: Duration = Duration::from_secs(10);

/// `POST /v1/webhooks`.
#[derive(Debug, Clone, serde::Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct WebhookRequest {
    /// `http://` or `https://`, on a host of `serve.events.webhook_hosts`.
    pub url: String,
}

fn view(hook: &Webhook, secret: bool) -> WebhookView {
    WebhookView {
        id: hook.id.clone(),
        url: hook.url.clone(),
        created_at_ms: hook.created_ms,
        delivered: hook.delivered,
        failures: hook.failures,
        last_error: hook.last_error.clone(),
        secret: secret.then(|| hex(&hook.secret)),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn db_error(e: tenants::Error) -> ApiError {
    ApiError::new(ErrorKind::Internal, format!("the tenants database: {e}"))
}

/// Whether `url` may be a webhook under `allowed` (`host` or `host:port` entries).
pub fn check_url(url: &str, allowed: &[String]) -> ApiResult<reqwest::Url> {
    let bad = |why: String| ApiError::field(ErrorKind::Invalid, "url", why);
    if url.len() > MAX_URL_BYTES {
        return Err(bad(format!("longer than {MAX_URL_BYTES} bytes")));
    }
    let parsed = reqwest::Url::parse(url).map_err(|e| bad(format!("{url:?} is not a URL: {e}")))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(bad(format!("{url:?}: a webhook is http:// or https://")));
    }
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err(bad("a webhook URL carries no user or password".into()));
    }
    let host = parsed.host_str().unwrap_or_default().to_ascii_lowercase();
    let port = parsed.port_or_known_default().unwrap_or(0);
    let ok = allowed.iter().any(|entry| {
        let entry = entry.to_ascii_lowercase();
        entry == host || entry == format!("{host}:{port}")
    });
    if !ok {
        return Err(bad(if allowed.is_empty() {
            "webhooks are off here: the operator allows no host (serve.events.webhook_hosts)".to_string()
        } else {
            format!(
                "{host}:{port} is not a host webhooks may call (serve.events.webhook_hosts: {})",
                allowed.join(", ")
            )
        }));
    }
    Ok(parsed)
}

impl Events {
    /// `POST /v1/webhooks`: a webhook of `tenant`, sent the events made from now on; the
    /// answer carries its secret, once.
    pub fn add_webhook(&self, tenant: TenantId, request: WebhookRequest) -> ApiResult<WebhookView> {
        let url = check_url(&request.url, &self.settings.webhook_hosts)?;
        let db = &self.tenancy().db;
        let hook = Webhook {
            id: crate::ids::new_id("wh"),
            tenant,
            url: url.to_string(),
            secret: crate::ids::random::<32>().to_vec(),
            created_ms: tenants::now_ms(),
            delivered: self.last_id(),
            failures: 0,
            last_error: None,
        };
        if !db.webhook_add(&hook, MAX_PER_TENANT).map_err(db_error)? {
            return Err(ApiError::field(
                ErrorKind::Invalid,
                "url",
                format!("a tenant has at most {MAX_PER_TENANT} webhooks: delete one first"),
            ));
        }
        tracing::info!(webhook = %hook.id, url = %hook.url, "webhook added");
        Ok(view(&hook, true))
    }

    /// `GET /v1/webhooks`: `tenant`'s.
    pub fn webhooks(&self, tenant: TenantId) -> ApiResult<WebhookList> {
        let hooks = self.tenancy().db.webhooks(Some(tenant)).map_err(db_error)?;
        Ok(WebhookList {
            webhooks: hooks.iter().map(|h| view(h, false)).collect(),
        })
    }

    /// `DELETE /v1/webhooks/{id}`: another tenant's is the same 404 as none.
    pub fn remove_webhook(&self, tenant: TenantId, id: &str) -> ApiResult<()> {
        match self.tenancy().db.webhook_remove(tenant, id).map_err(db_error)? {
            true => Ok(()),
            false => Err(ApiError::new(ErrorKind::NotFound, format!("no webhook {id:?}"))),
        }
    }
}

/// Sends webhooks their events, for as long as the service runs.
pub async fn deliver_forever(events: Arc<Events>) {
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(TIMEOUT)
        .build()
        .expect("an HTTP client builds");
    let state = Arc::new(Mutex::new(Rounds::default()));
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    loop {
        tick.tick().await;
        let hooks = match events.tenancy().db.webhooks(None) {
            Ok(hooks) => hooks,
            Err(e) => {
                tracing::warn!("reading webhooks: {e}");
                continue;
            }
        };
        let last = events.last_id();
        for hook in hooks {
            if hook.delivered >= last || !state.lock().unwrap_or_else(|p| p.into_inner()).start(&hook.id) {
                continue;
            }
            let (events, client, state) = (events.clone(), client.clone(), state.clone());
            tokio::spawn(async move {
                let failed = deliver(&events, &client, &hook).await;
                state
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .end(&hook.id, failed, hook.failures);
            });
        }
    }
}

/// Which webhooks are being delivered, and when a failing one is tried again.
#[derive(Default)]
struct Rounds {
    running: HashSet<String>,
    next: HashMap<String, Instant>,
}

impl Rounds {
    fn start(&mut self, id: &str) -> bool {
        if self.running.contains(id) || self.next.get(id).is_some_and(|at| Instant::now() < *at) {
            return false;
        }
        self.running.insert(id.to_string())
    }

    fn end(&mut self, id: &str, failed: bool, failures_before: u64) {
        self.running.remove(id);
        if failed {
            let wait = Duration::from_secs(1u64 << failures_before.min(9)).min(Duration::from_secs(300));
            self.next.insert(id.to_string(), Instant::now() + wait);
        } else {
            self.next.remove(id);
        }
    }
}

/// One round: the webhook's next events, in order, until one fails; whether one did.
async fn deliver(events: &Events, client: &reqwest::Client, hook: &Webhook) -> bool {
    let db = &events.tenancy().db;
    let batch = match events.read(hook.tenant, hook.delivered, None, ROUND) {
        Ok(batch) => batch,
        Err(e) => {
            tracing::warn!(webhook = %hook.id, "reading its events: {}", e.message);
            return true;
        }
    };
    for event in batch {
        let body = serde_json::to_string(&event).expect("events serialize");
        let at = tenants::now_ms() / 1000;
        let signature = sign(&hook.secret, at, &body);
        let sent = client
            .post(&hook.url)
            .header("content-type", "application/json")
            .header("farm-webhook-id", &hook.id)
            .header("farm-event-id", event.id.to_string())
            .header("farm-timestamp", at.to_string())
            .header("farm-signature", format!("sha256={signature}"))
            .body(body)
            .send()
            .await;
        let error = match sent {
            Ok(answer) if answer.status().is_success() => None,
            Ok(answer) => Some(format!("{} answered {}", hook.url, answer.status())),
            Err(e) => Some(format!("{}: {e}", hook.url)),
        };
        let _ = db.webhook_progress(&hook.id, event.id, error.as_deref());
        if let Some(error) = error {
            tracing::info!(webhook = %hook.id, event = event.id, "delivery failed, to be retried: {error}");
            return true;
        }
    }
    false
}

/// The hex HMAC-SHA256 under `secret` of `"{timestamp}.{body}"`.
pub fn sign(secret: &[u8], timestamp: u64, body: &str) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes any key length");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body.as_bytes());
    hex(&mac.finalize().into_bytes())
}
