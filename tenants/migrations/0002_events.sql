-- Lifecycle events of tenants' forks (sandboxes and sessions): one row per change of state,
-- in order (seq), kept for serve.events.keep_days. `body` is the event as the service
-- serialises it (its type, the state it leaves, a cause and a reason); the columns beside it
-- are what lists and streams filter on.
CREATE TABLE events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    at_ms INTEGER NOT NULL,
    tenant INTEGER NOT NULL,
    fork TEXT NOT NULL,
    body TEXT NOT NULL
);
CREATE INDEX events_tenant ON events (tenant, seq);
CREATE INDEX events_at ON events (at_ms);

-- Tenants' webhooks: each is sent every event of its tenant after `delivered` (at least
-- once, in order, signed with `secret`), retried with backoff while its URL fails.
CREATE TABLE webhooks (
    id TEXT PRIMARY KEY,
    tenant INTEGER NOT NULL REFERENCES tenants(id),
    url TEXT NOT NULL,
    secret BLOB NOT NULL,
    created_ms INTEGER NOT NULL,
    delivered INTEGER NOT NULL,
    failures INTEGER NOT NULL DEFAULT 0,
    last_error TEXT
);
