-- Tenants' workspaces: named volumes that outlive every sandbox. At most one fork holds a
-- workspace writable at a time (`holder`); each new writable holder takes the next
-- `generation`, and a sync is accepted only from the holder of the current generation, so a
-- lost holder's writes are refused once another took the workspace (fencing). Its bytes are
-- a tar archive beside the service's output (`OUT/workspaces/<id>/data.tar`).
CREATE TABLE workspaces (
    id TEXT PRIMARY KEY,
    tenant INTEGER NOT NULL REFERENCES tenants(id),
    name TEXT NOT NULL,
    size_mib INTEGER NOT NULL,
    keep_days INTEGER,
    created_ms INTEGER NOT NULL,
    used_ms INTEGER NOT NULL,
    generation INTEGER NOT NULL DEFAULT 0,
    holder TEXT,
    bytes INTEGER NOT NULL DEFAULT 0,
    synced_ms INTEGER,
    UNIQUE (tenant, name)
);
