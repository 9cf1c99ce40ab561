-- Tenants, their keys (SHA-256 of the secret; the secret itself is never stored), quotas,
-- granted network policies, which ids each one owns, build time spent, and the audit.
CREATE TABLE tenants (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    weight INTEGER NOT NULL DEFAULT 1 CHECK (weight BETWEEN 1 AND 1000),
    created_ms INTEGER NOT NULL
);
-- The tenant of the single-token set-up: the service token (or no token, on loopback) is it.
INSERT INTO tenants (id, name, weight, created_ms) VALUES (1, 'default', 1, 0);

CREATE TABLE keys (
    id TEXT PRIMARY KEY,
    tenant INTEGER NOT NULL REFERENCES tenants(id),
    hash BLOB NOT NULL UNIQUE,
    created_ms INTEGER NOT NULL,
    expires_ms INTEGER,
    revoked_ms INTEGER
);

CREATE TABLE quotas (
    tenant INTEGER NOT NULL REFERENCES tenants(id),
    name TEXT NOT NULL,
    value INTEGER NOT NULL CHECK (value >= 0),
    PRIMARY KEY (tenant, name)
);

CREATE TABLE grants (
    tenant INTEGER NOT NULL REFERENCES tenants(id),
    policy TEXT NOT NULL,
    PRIMARY KEY (tenant, policy)
);

-- kind: rollout, session, sandbox, environment, context. since_ms: when the tenant asked for it.
-- visible_ms: when a tenant that asked for content another had built may see it as built (a
-- fresh build's time later).
CREATE TABLE owners (
    kind TEXT NOT NULL,
    id TEXT NOT NULL,
    tenant INTEGER NOT NULL REFERENCES tenants(id),
    since_ms INTEGER NOT NULL,
    visible_ms INTEGER NOT NULL,
    PRIMARY KEY (kind, id, tenant)
);

-- How long each environment's build took (what a tenant asking for the same content waits).
CREATE TABLE builds (env TEXT PRIMARY KEY, ms INTEGER NOT NULL);

CREATE TABLE build_time (
    tenant INTEGER NOT NULL REFERENCES tenants(id),
    day INTEGER NOT NULL,
    seconds REAL NOT NULL,
    PRIMARY KEY (tenant, day)
);

CREATE TABLE audit (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    at_ms INTEGER NOT NULL,
    tenant TEXT NOT NULL,
    key_id TEXT NOT NULL,
    route TEXT NOT NULL,
    target TEXT,
    status INTEGER NOT NULL
);
CREATE TRIGGER audit_no_update BEFORE UPDATE ON audit BEGIN SELECT RAISE(ABORT, 'the audit is append-only'); END;
CREATE TRIGGER audit_no_delete BEFORE DELETE ON audit BEGIN SELECT RAISE(ABORT, 'the audit is append-only'); END;
-- REPLACE deletes without firing delete triggers (recursive_triggers is off): refuse it too.
CREATE TRIGGER audit_no_replace BEFORE INSERT ON audit WHEN EXISTS (SELECT 1 FROM audit WHERE seq = NEW.seq)
BEGIN SELECT RAISE(ABORT, 'the audit is append-only'); END;

-- A secret of this database: the key of the MCP session tokens of tenants' sessions.
CREATE TABLE secrets (name TEXT PRIMARY KEY, value BLOB NOT NULL);
