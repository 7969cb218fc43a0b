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
-- A trace's events, the governance layer's own apart: an enforcement call's
-- triggering event is the trace's newest event with the middle column 0,
-- found without stepping over the trace's receipt events. One index for
-- both, since trace ids are random keys: each entry dirties a leaf page of
-- its own at every commit (a second trace index cost 10 % of single-event
-- ingest).
-- The middle column compares the prefix as written: LIKE would ignore case
-- and take a user's `Governance.review` for one of the layer's events.
CREATE INDEX IF NOT EXISTS events_trace_own
    ON events (workspace_id, trace_id, substr(event, 1, 11) = 'governance.', ts)
    WHERE trace_id IS NOT NULL;
-- Replaced by events_trace_own.
DROP INDEX IF EXISTS events_trace;
DROP INDEX IF EXISTS events_trace_trigger;
DROP INDEX IF EXISTS events_trace_kind;
CREATE INDEX IF NOT EXISTS events_trackable
    ON events (workspace_id, trackable_code, ts) WHERE trackable_code IS NOT NULL;

-- Case-insensitive substring search lives in `search.db` beside this
-- file, written by a thread of its own (`search.rs`); an older store's
-- `events_fts` and `search_queue` are dropped on open. Events removed
-- after they were stored are logged here for it, in the removing
-- transaction: SQLite may give a later event a removed event's `seq`.
CREATE TABLE IF NOT EXISTS search_removed (
    id  INTEGER PRIMARY KEY,
    seq INTEGER NOT NULL
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

-- Rollup for distinct actors (docs/queries.md), maintained once per group
-- commit (`events::flush_pending`): per event name and actor, the times of
-- its first and last event. An actor whose first or last event lies in a
-- range certainly has one there, so counting distinct actors reads one row
-- per actor instead of one per event; only an actor whose events surround
-- the range (first before, last after) is unknown, and then the count reads
-- the events. Each actor has a row per business and one more under
-- business '' (never a business id) for all of them, so that no count
-- needs DISTINCT. `first_ts` = -2^63 and `last_ts` = 2^63-1 mark bounds
-- that an event removal made unknown (`connectors::remove_event`).
CREATE TABLE IF NOT EXISTS event_actors (
    workspace_id TEXT NOT NULL,
    event        TEXT NOT NULL,
    business_id  TEXT NOT NULL,
    actor_id     TEXT NOT NULL,
    first_ts     INTEGER NOT NULL,
    last_ts      INTEGER NOT NULL,
    PRIMARY KEY (workspace_id, event, business_id, actor_id)
) WITHOUT ROWID;

-- Rollups added after events existed are filled from them once, at open
-- (`backfill_rollups` in embedded.rs); a row here says it was done.
CREATE TABLE IF NOT EXISTS rollup_backfills (
    name     TEXT PRIMARY KEY,
    built_at INTEGER NOT NULL
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
-- Keys past the 24-hour window are deleted oldest first, a bounded batch
-- at a time (`events::purge_expired_keys`).
CREATE INDEX IF NOT EXISTS idempotency_keys_created ON idempotency_keys (created_at);

CREATE TABLE IF NOT EXISTS usage_daily (
    workspace_id    TEXT NOT NULL,
    day             INTEGER NOT NULL,
    events_ingested INTEGER NOT NULL DEFAULT 0,
    api_calls       INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (workspace_id, day)
) WITHOUT ROWID;

-- Gateway delivery: the session epoch (fencing) and the cumulative ack,
-- advanced in the transaction that stores the batch.
CREATE TABLE IF NOT EXISTS gateway_sessions (
    workspace_id   TEXT NOT NULL,
    gateway_id     TEXT NOT NULL,
    epoch          INTEGER NOT NULL,
    acked_sequence INTEGER NOT NULL,
    buffer_id      TEXT NOT NULL DEFAULT '',
    updated_at     INTEGER NOT NULL,
    PRIMARY KEY (workspace_id, gateway_id)
) WITHOUT ROWID;

-- Governance (docs/governance.md). Objects are kept as their JSON body with
-- the columns that listing and enforcement filter on lifted out.
CREATE TABLE IF NOT EXISTS governance_decisions (
    workspace_id TEXT NOT NULL,
    id           TEXT NOT NULL,
    status       TEXT NOT NULL,
    trace_id     TEXT,
    created_at   INTEGER NOT NULL,
    updated_at   INTEGER NOT NULL,
    body         TEXT NOT NULL,
    PRIMARY KEY (workspace_id, id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS governance_decisions_status
    ON governance_decisions (workspace_id, status, id);


CREATE TABLE IF NOT EXISTS governance_grants (
    workspace_id TEXT NOT NULL,
    id           TEXT NOT NULL,
    created_at   INTEGER NOT NULL,
    body         TEXT NOT NULL,
    PRIMARY KEY (workspace_id, id)
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS governance_contracts (
    workspace_id TEXT NOT NULL,
    id           TEXT NOT NULL,
    created_at   INTEGER NOT NULL,
    body         TEXT NOT NULL,
    PRIMARY KEY (workspace_id, id)
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS tracking_plans (
    workspace_id TEXT NOT NULL,
    id           TEXT NOT NULL,
    created_at   INTEGER NOT NULL,
    body         TEXT NOT NULL,
    PRIMARY KEY (workspace_id, id)
) WITHOUT ROWID;

-- Enforcement receipts: append-only hash chains, one per (workspace,
-- writer). The unique (writer, sequence) index makes a fork impossible even
-- for a buggy writer: one receipt per position (and a prevHash is always
-- the head's hash, read in the same transaction).
CREATE TABLE IF NOT EXISTS governance_receipts (
    seq          INTEGER PRIMARY KEY,
    workspace_id TEXT NOT NULL,
    id           TEXT NOT NULL,
    writer       TEXT NOT NULL,
    sequence     INTEGER NOT NULL,
    prev_hash    TEXT NOT NULL,
    content_hash TEXT NOT NULL,
    created_at   INTEGER NOT NULL,
    outcome      TEXT NOT NULL,
    trace_id     TEXT,
    decision_id  TEXT,
    body         TEXT NOT NULL
);
CREATE UNIQUE INDEX IF NOT EXISTS governance_receipts_id ON governance_receipts (workspace_id, id);
CREATE UNIQUE INDEX IF NOT EXISTS governance_receipts_chain
    ON governance_receipts (workspace_id, writer, sequence);
CREATE INDEX IF NOT EXISTS governance_receipts_ts ON governance_receipts (workspace_id, created_at);
CREATE INDEX IF NOT EXISTS governance_receipts_trace
    ON governance_receipts (workspace_id, trace_id, created_at) WHERE trace_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS governance_receipts_decision
    ON governance_receipts (workspace_id, decision_id, created_at);
-- Immutability through the API's own connection; someone with the file can
-- drop these, which is what the hash chain is for.
CREATE TRIGGER IF NOT EXISTS governance_receipts_no_update
    BEFORE UPDATE ON governance_receipts
    BEGIN SELECT RAISE(ABORT, 'enforcement receipts are immutable'); END;
CREATE TRIGGER IF NOT EXISTS governance_receipts_no_delete
    BEFORE DELETE ON governance_receipts
    BEGIN SELECT RAISE(ABORT, 'enforcement receipts are immutable'); END;

CREATE TABLE IF NOT EXISTS proof_trails (
    workspace_id TEXT NOT NULL,
    id           TEXT NOT NULL,
    created_at   INTEGER NOT NULL,
    body         TEXT NOT NULL,
    PRIMARY KEY (workspace_id, id)
) WITHOUT ROWID;

-- One row per external push (proof push, destination export), failed or not.
CREATE TABLE IF NOT EXISTS export_receipts (
    workspace_id   TEXT NOT NULL,
    id             TEXT NOT NULL,
    proof_trail_id TEXT,
    status         TEXT NOT NULL,
    created_at     INTEGER NOT NULL,
    body           TEXT NOT NULL,
    PRIMARY KEY (workspace_id, id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS export_receipts_trail
    ON export_receipts (workspace_id, proof_trail_id) WHERE proof_trail_id IS NOT NULL;
-- Listed newest first: a keyed export's id is not time-ordered.
CREATE INDEX IF NOT EXISTS export_receipts_created
    ON export_receipts (workspace_id, created_at);

-- Webhooks (docs/webhooks.md): a deleted one keeps its row, marked, so
-- its delivery log stays explained. Ids are time-ordered: the key lists
-- oldest first.
CREATE TABLE IF NOT EXISTS webhooks (
    workspace_id TEXT NOT NULL,
    id           TEXT NOT NULL,
    deleted_at   INTEGER,
    body         TEXT NOT NULL,
    PRIMARY KEY (workspace_id, id)
) WITHOUT ROWID;

-- Every delivery attempt, in the order the log is read (newest last).
CREATE TABLE IF NOT EXISTS webhook_attempts (
    workspace_id TEXT NOT NULL,
    webhook_id   TEXT NOT NULL,
    created_at   INTEGER NOT NULL,
    delivery_id  TEXT NOT NULL,
    attempt      INTEGER NOT NULL,
    body         TEXT NOT NULL,
    PRIMARY KEY (workspace_id, webhook_id, created_at, delivery_id, attempt)
) WITHOUT ROWID;
-- Retention deletes the oldest first, across workspaces.
CREATE INDEX IF NOT EXISTS webhook_attempts_created ON webhook_attempts (created_at);

-- Deliveries not finished, so that a restart carries on with them; a
-- finished one is deleted.
CREATE TABLE IF NOT EXISTS webhook_pending (
    workspace_id TEXT NOT NULL,
    delivery_id  TEXT NOT NULL,
    due_at       INTEGER NOT NULL,
    body         TEXT NOT NULL,
    PRIMARY KEY (workspace_id, delivery_id)
) WITHOUT ROWID;

-- Trackables (docs/trackables.md). `code` is unique per workspace and is
-- what events carry in `trackable.code` (matched through `events_trackable`);
-- `scan_code` is unique across workspaces: the public `/r/{scan_code}` link
-- finds its trackable without a credential. Ids are time-ordered, so the
-- primary key also lists newest first.
CREATE TABLE IF NOT EXISTS trackables (
    workspace_id TEXT NOT NULL,
    id           TEXT NOT NULL,
    code         TEXT NOT NULL,
    scan_code    TEXT NOT NULL,
    kind         TEXT NOT NULL,
    name         TEXT NOT NULL,
    target_url   TEXT,
    event_name   TEXT,
    created_at   INTEGER NOT NULL,
    PRIMARY KEY (workspace_id, id)
) WITHOUT ROWID;
CREATE UNIQUE INDEX IF NOT EXISTS trackables_code ON trackables (workspace_id, code);
CREATE UNIQUE INDEX IF NOT EXISTS trackables_scan_code ON trackables (scan_code);

-- Connector records (docs/connectors.md): the event each provider record
-- became, so that a re-sync replaces it under the same id.
CREATE TABLE IF NOT EXISTS connector_records (
    workspace_id    TEXT NOT NULL,
    provider        TEXT NOT NULL,
    record_id       TEXT NOT NULL,
    event_id        TEXT NOT NULL,
    first_synced_at INTEGER NOT NULL,
    last_synced_at  INTEGER NOT NULL,
    syncs           INTEGER NOT NULL,
    PRIMARY KEY (workspace_id, provider, record_id)
) WITHOUT ROWID;

-- One row per connector ingest call, for usage and business health.
CREATE TABLE IF NOT EXISTS connector_syncs (
    workspace_id TEXT NOT NULL,
    id           TEXT NOT NULL,
    provider     TEXT NOT NULL,
    business_id  TEXT NOT NULL,
    received     INTEGER NOT NULL,
    ingested     INTEGER NOT NULL,
    updated      INTEGER NOT NULL,
    rejected     INTEGER NOT NULL,
    created_at   INTEGER NOT NULL,
    PRIMARY KEY (workspace_id, id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS connector_syncs_recent ON connector_syncs (workspace_id, created_at);

-- Queries (docs/queries.md). Attribution's touchpoints and conversions
-- and the proof gaps of governed events are small subsets of all events; without these
-- partial indexes both would read every event of their range. Each query
-- repeats its index's WHERE term literally, so that the planner can use it.
CREATE INDEX IF NOT EXISTS events_touchpoint ON events (workspace_id, ts)
    WHERE source IS NOT NULL OR campaign IS NOT NULL OR channel IS NOT NULL;
CREATE INDEX IF NOT EXISTS events_decision ON events (workspace_id, ts)
    WHERE decision_id IS NOT NULL;
-- Attribution's default conversions: events carrying revenue.
CREATE INDEX IF NOT EXISTS events_revenue ON events (workspace_id, ts)
    WHERE revenue IS NOT NULL;
-- Usage's agents (`queries::AGENT_TYPES`, same order): the month's events
-- of agent actors, grouped by actor straight from the index (it covers
-- the columns read), instead of a scan of every event of the month.
-- Equalities, not `actor_type IN (...)`: SQLite evaluates a partial
-- index's term at every insert, and an IN list of more than two values
-- builds a temporary b-tree each time, with its own pager and page cache,
-- for every event whatever its actor.
CREATE INDEX IF NOT EXISTS events_agent_actors
    ON events (workspace_id, actor_type, actor_id, ts, revenue)
    WHERE actor_type = 'agent' OR actor_type = 'ai_agent' OR actor_type = 'robot'
        OR actor_type = 'mcp_server' OR actor_type = 'cli_workflow' OR actor_type = 'workflow';
-- Replaced by events_agent_actors.
DROP INDEX IF EXISTS events_agents;

-- Reusable metric definitions, and the metric
-- values kept when a query asks for `persistSnapshots`.
CREATE TABLE IF NOT EXISTS metric_definitions (
    workspace_id TEXT NOT NULL,
    id           TEXT NOT NULL,
    created_at   INTEGER NOT NULL,
    body         TEXT NOT NULL,
    PRIMARY KEY (workspace_id, id)
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS metric_snapshots (
    workspace_id TEXT NOT NULL,
    id           TEXT NOT NULL,
    created_at   INTEGER NOT NULL,
    body         TEXT NOT NULL,
    PRIMARY KEY (workspace_id, id)
) WITHOUT ROWID;
