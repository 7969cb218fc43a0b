-- Embedded store schema, version 1. Why each table and index exists:
-- docs/storage.md. Statements are idempotent: run on every start.

CREATE TABLE IF NOT EXISTS schema_version (
    version    INTEGER NOT NULL,
    applied_at INTEGER NOT NULL
);

CREATE TABLE IF NOT EXISTS workspaces (
    id         TEXT PRIMARY KEY,
    name       TEXT NOT NULL,
    created_at INTEGER NOT NULL
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS businesses (
    workspace_id TEXT NOT NULL,
    id           TEXT NOT NULL,
    name         TEXT NOT NULL,
    created_at   INTEGER NOT NULL,
    PRIMARY KEY (workspace_id, id)
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS api_keys (
    id           TEXT PRIMARY KEY,
    workspace_id TEXT NOT NULL,
    name         TEXT NOT NULL,
    key_hash     TEXT NOT NULL UNIQUE,
    hint         TEXT NOT NULL,
    scopes       TEXT NOT NULL,
    created_at   INTEGER NOT NULL,
    revoked_at   INTEGER
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS api_keys_workspace ON api_keys (workspace_id, created_at);

-- One row per event. The rowid `seq` is the insertion order and the key of
-- the full-text index. Hot filter columns are lifted out of the JSON
-- envelope so that indexes and aggregates never parse JSON.
CREATE TABLE IF NOT EXISTS events (
    seq            INTEGER PRIMARY KEY,
    workspace_id   TEXT NOT NULL,
    id             TEXT NOT NULL,
    business_id    TEXT NOT NULL,
    event          TEXT NOT NULL,
    ts             INTEGER NOT NULL,
    received_at    INTEGER NOT NULL,
    actor_type     TEXT,
    actor_id       TEXT,
    object_type    TEXT,
    object_id      TEXT,
    trace_id       TEXT,
    decision_id    TEXT,
    trust_tier     TEXT NOT NULL,
    message_id     TEXT,
    trackable_code TEXT,
    revenue        REAL,
    source         TEXT,
    channel        TEXT,
    campaign       TEXT,
    envelope       TEXT NOT NULL
);
CREATE UNIQUE INDEX IF NOT EXISTS events_id ON events (workspace_id, id);
CREATE UNIQUE INDEX IF NOT EXISTS events_message_id
    ON events (workspace_id, message_id) WHERE message_id IS NOT NULL;
-- Recent events, time ranges.
CREATE INDEX IF NOT EXISTS events_ts ON events (workspace_id, ts);
-- Metrics and funnels: one event name over a range, with the actor so that
-- per-actor step times come from the index alone.
CREATE INDEX IF NOT EXISTS events_event_ts ON events (workspace_id, event, ts, actor_id);
CREATE INDEX IF NOT EXISTS events_business_ts ON events (workspace_id, business_id, ts);
CREATE INDEX IF NOT EXISTS events_trace
    ON events (workspace_id, trace_id, ts) WHERE trace_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS events_trackable
    ON events (workspace_id, trackable_code, ts) WHERE trackable_code IS NOT NULL;

-- Case-insensitive substring search: trigram tokens of the searchable text
-- (event name, actor and object, property values). Contentless: the text
-- lives in `events.envelope`; candidates are joined back by rowid = seq.
CREATE VIRTUAL TABLE IF NOT EXISTS events_fts USING fts5 (
    body, content = '', contentless_delete = 1, tokenize = 'trigram'
);

-- Rollup maintained in the insert transaction: counts and revenue per hour,
-- so that metrics over long ranges read hours, not events.
CREATE TABLE IF NOT EXISTS event_counts_hourly (
    workspace_id TEXT NOT NULL,
    business_id  TEXT NOT NULL,
    event        TEXT NOT NULL,
    hour         INTEGER NOT NULL,
    count        INTEGER NOT NULL,
    revenue      REAL NOT NULL,
    PRIMARY KEY (workspace_id, business_id, event, hour)
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS entities (
    workspace_id TEXT NOT NULL,
    type         TEXT NOT NULL,
    id           TEXT NOT NULL,
    name         TEXT,
    properties   TEXT NOT NULL,
    first_seen   INTEGER NOT NULL,
    last_seen    INTEGER NOT NULL,
    PRIMARY KEY (workspace_id, type, id)
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS relationships (
    workspace_id TEXT NOT NULL,
    from_type    TEXT NOT NULL,
    from_id      TEXT NOT NULL,
    relation     TEXT NOT NULL,
    to_type      TEXT NOT NULL,
    to_id        TEXT NOT NULL,
    count        INTEGER NOT NULL,
    first_seen   INTEGER NOT NULL,
    last_seen    INTEGER NOT NULL,
    PRIMARY KEY (workspace_id, from_type, from_id, relation, to_type, to_id)
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS idempotency_keys (
    workspace_id TEXT NOT NULL,
    key          TEXT NOT NULL,
    response     TEXT NOT NULL,
    created_at   INTEGER NOT NULL,
    PRIMARY KEY (workspace_id, key)
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS usage_daily (
    workspace_id    TEXT NOT NULL,
    day             INTEGER NOT NULL,
    events_ingested INTEGER NOT NULL DEFAULT 0,
    api_calls       INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (workspace_id, day)
) WITHOUT ROWID;
