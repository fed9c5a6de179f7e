-- Times are TEXT in one fixed-width UTC form, 2006-01-02T15:04:05.000000Z,
-- so they sort as strings and match PostgreSQL's microsecond timestamptz.

CREATE TABLE tenants (
    id        TEXT PRIMARY KEY,
    name      TEXT NOT NULL,
    bootstrap INTEGER NOT NULL DEFAULT 0 CHECK (bootstrap IN (0, 1))
);

-- At most one bootstrap tenant.
CREATE UNIQUE INDEX tenants_one_bootstrap ON tenants (bootstrap) WHERE bootstrap = 1;

INSERT INTO tenants (id, name, bootstrap) VALUES ('bootstrap', 'bootstrap', 1);

-- Minted tokens: never the token, only its SHA-256.
CREATE TABLE tokens (
    id           TEXT PRIMARY KEY,               -- public ID, random, unrelated to the hash
    hash         BLOB NOT NULL UNIQUE CHECK (length(hash) = 32),
    subject_kind INTEGER NOT NULL CHECK (subject_kind IN (1, 2)), -- 1 account, 2 runner
    subject_id   TEXT NOT NULL,
    tenant_id    TEXT NOT NULL REFERENCES tenants (id),
    created_at   TEXT NOT NULL,
    revoked_at   TEXT
);

CREATE INDEX tokens_subject ON tokens (subject_kind, subject_id);

-- Enrolled Runners.
CREATE TABLE runners (
    id                TEXT PRIMARY KEY,
    tenant_id         TEXT NOT NULL REFERENCES tenants (id),
    method            TEXT NOT NULL CHECK (method IN ('projected', 'minted')),
    cluster           TEXT NOT NULL DEFAULT '',
    node_name         TEXT NOT NULL DEFAULT '',
    node_uid          TEXT NOT NULL DEFAULT '',
    pod_name          TEXT NOT NULL DEFAULT '',
    pod_uid           TEXT NOT NULL DEFAULT '',
    first_enrolled_at TEXT NOT NULL,
    last_enrolled_at  TEXT NOT NULL,
    last_seen_at      TEXT
);
