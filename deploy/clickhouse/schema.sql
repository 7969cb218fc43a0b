-- The ClickHouse store's schema (docs/storage.md, "ClickHouse").
--
-- Applied statement by statement at every start of opgraph-cloud with
-- OPGRAPH_STORE=clickhouse; every statement is idempotent. Valid on
-- ClickHouse 18.16 (Debian's package) and on current releases: no
-- DateTime64, Map, JSON functions, CODEC, TTL, skip indexes or CTEs.
-- Statements are separated by a semicolon at the end of a line.
--
-- Conventions: times are milliseconds since the epoch in Int64 columns; an
-- absent optional text is ''. Metadata tables are ReplacingMergeTree on a
-- `version` column; the store reads them with argMax(..., version) grouped
-- by the key, which is exact whether or not parts have been merged yet.

CREATE TABLE IF NOT EXISTS schema_version (
    version UInt32,
    applied_at Int64
) ENGINE = MergeTree() ORDER BY version;

-- One row per event. `time` is `ts` in seconds: months partition on it, and
-- range filters repeat it so that whole months are skipped. The key serves
-- the event-name and time filters of the API, and finds one event by
-- (event, ts, id) for exactly-once storage. `seq` is insertion order, for
-- stable ties between equal timestamps. `search_text` is what free-text
-- search matches (event name, actor and object, property values; 2 KiB at
-- most), searched case-insensitively as a substring. `num_keys` and
-- `num_values` hold the top-level numeric properties (numbers, or text that
-- reads as one), which metrics sum without parsing JSON.
CREATE TABLE IF NOT EXISTS events (
    workspace_id String,
    id String,
    business_id String,
    event String,
    ts Int64,
    time DateTime,
    received_at Int64,
    seq UInt64,
    actor_type String,
    actor_id String,
    object_type String,
    object_id String,
    trace_id String,
    decision_id String,
    proof_id String,
    trust_tier String,
    message_id String,
    trackable_code String,
    has_revenue UInt8,
    revenue Float64,
    source String,
    channel String,
    campaign String,
    search_text String,
    num_keys Array(String),
    num_values Array(Float64),
    envelope String
) ENGINE = MergeTree()
PARTITION BY toYYYYMM(time)
ORDER BY (workspace_id, event, ts, id);

CREATE TABLE IF NOT EXISTS workspaces (
    id String,
    name String,
    created_at Int64,
    version UInt64
) ENGINE = ReplacingMergeTree(version) ORDER BY id;

CREATE TABLE IF NOT EXISTS businesses (
    workspace_id String,
    id String,
    name String,
    created_at Int64,
    version UInt64
) ENGINE = ReplacingMergeTree(version) ORDER BY (workspace_id, id);

-- Only the SHA-256 of a key is kept. A revocation is a newer version with
-- revoked_at set (0: active).
CREATE TABLE IF NOT EXISTS api_keys (
    workspace_id String,
    id String,
    key_hash String,
    name String,
    hint String,
    scopes String,
    created_at Int64,
    revoked_at Int64,
    version UInt64
) ENGINE = ReplacingMergeTree(version) ORDER BY (workspace_id, id);

-- Client idempotency: the first event id given to each messageId, and its
-- `ts`. Written before the event (docs/storage.md): a messageId whose event
-- is missing is stored under that id by its next delivery. Rows from before
-- schema version 4 have `ts` 0 and were written after their event.
CREATE TABLE IF NOT EXISTS message_ids (
    workspace_id String,
    message_id String,
    id String,
    version UInt64,
    ts Int64
) ENGINE = ReplacingMergeTree(version) ORDER BY (workspace_id, message_id);

-- Idempotency-Key: the first answer (JSON array of ids), kept 24 hours.
CREATE TABLE IF NOT EXISTS idempotency_keys (
    workspace_id String,
    key String,
    response String,
    created_at Int64
) ENGINE = ReplacingMergeTree(created_at) ORDER BY (workspace_id, key);

-- Daily counters: every write adds a row, reads sum, merges only compact.
CREATE TABLE IF NOT EXISTS usage_daily (
    workspace_id String,
    day Int64,
    events_ingested UInt64,
    api_calls UInt64
) ENGINE = SummingMergeTree() ORDER BY (workspace_id, day);

-- Metric definitions and the snapshots a metrics query persisted, kept
-- whole as JSON (`body`); written once, never changed.
CREATE TABLE IF NOT EXISTS metric_definitions (
    workspace_id String,
    id String,
    created_at Int64,
    body String
) ENGINE = MergeTree() ORDER BY (workspace_id, created_at, id);

CREATE TABLE IF NOT EXISTS metric_snapshots (
    workspace_id String,
    id String,
    created_at Int64,
    body String
) ENGINE = MergeTree() ORDER BY (workspace_id, created_at, id);

-- What events carrying `entity` said about entities and edges, one row per
-- stored event; reads fold them (name: the latest given; properties: JSON
-- merge patches in storage order; edges: counted). `seq` is the observing
-- event's, so a resend that writes an observation again repeats its `seq`
-- and reads count each `seq` once (edges stored before schema version 3
-- have 0 and count one each).
CREATE TABLE IF NOT EXISTS entity_observations (
    workspace_id String,
    type String,
    id String,
    name String,
    has_name UInt8,
    properties String,
    ts Int64,
    seq UInt64
) ENGINE = MergeTree() ORDER BY (workspace_id, type, id);

CREATE TABLE IF NOT EXISTS relationship_observations (
    workspace_id String,
    from_type String,
    from_id String,
    relation String,
    to_type String,
    to_id String,
    ts Int64,
    seq UInt64
) ENGINE = MergeTree() ORDER BY (workspace_id, from_type, from_id, relation, to_type, to_id);

-- Gateway delivery: per gateway, the session epoch, buffer and ack as each
-- Hello left them. Batches advance the ack in `gateway_commits`.
CREATE TABLE IF NOT EXISTS gateway_sessions (
    workspace_id String,
    gateway_id String,
    epoch UInt64,
    acked_sequence UInt64,
    buffer_id String,
    updated_at Int64,
    version UInt64
) ENGINE = ReplacingMergeTree(version) ORDER BY (workspace_id, gateway_id);

-- One row per committed gateway batch, written after its events so that an
-- ack never runs ahead of the data (a batch redelivered after a crash
-- between the two writes is recognised by its event ids): the ack, the
-- events the batch stored (usage adds them to `usage_daily`), and the
-- reservation, above which no event of the gateway is stored. The latest
-- version of this table and `gateway_sessions` is the session.
CREATE TABLE IF NOT EXISTS gateway_commits (
    workspace_id String,
    gateway_id String,
    epoch UInt64,
    acked_sequence UInt64,
    reserved_sequence UInt64,
    day Int64,
    events_ingested UInt64,
    version UInt64
) ENGINE = MergeTree() ORDER BY (workspace_id, gateway_id, version);

-- Trackables: written once at registration. Codes are unique per workspace
-- and scan codes across workspaces; the store checks both before writing
-- (see docs/storage.md). An absent target URL or event name is ''.
CREATE TABLE IF NOT EXISTS trackables (
    workspace_id String,
    id String,
    code String,
    scan_code String,
    kind String,
    name String,
    target_url String,
    event_name String,
    created_at Int64,
    version UInt64
) ENGINE = ReplacingMergeTree(version) ORDER BY (workspace_id, id);

-- Connector records: which event a provider's record is stored as. A
-- re-sync writes a new version (same event id, later sync time, one more
-- sync) and replaces the event itself.
CREATE TABLE IF NOT EXISTS connector_records (
    workspace_id String,
    provider String,
    record_id String,
    event_id String,
    first_synced_at Int64,
    last_synced_at Int64,
    syncs UInt64,
    version UInt64
) ENGINE = ReplacingMergeTree(version) ORDER BY (workspace_id, provider, record_id);

-- One row per connector ingest call, append-only; reads take each id once.
CREATE TABLE IF NOT EXISTS connector_syncs (
    workspace_id String,
    id String,
    provider String,
    business_id String,
    received UInt64,
    ingested UInt64,
    updated UInt64,
    rejected UInt64,
    created_at Int64
) ENGINE = MergeTree() ORDER BY (workspace_id, created_at, id);

-- Governance objects (docs/governance.md), each kept whole as JSON (`body`)
-- beside the columns reads filter on. A decision's status change and a
-- grant's revocation are newer versions of the same id; contracts,
-- tracking plans and proof trails are written once.
CREATE TABLE IF NOT EXISTS governance_decisions (
    workspace_id String,
    id String,
    status String,
    trace_id String,
    created_at Int64,
    updated_at Int64,
    body String,
    version UInt64
) ENGINE = ReplacingMergeTree(version) ORDER BY (workspace_id, id);

CREATE TABLE IF NOT EXISTS governance_grants (
    workspace_id String,
    id String,
    created_at Int64,
    body String,
    version UInt64
) ENGINE = ReplacingMergeTree(version) ORDER BY (workspace_id, id);

CREATE TABLE IF NOT EXISTS governance_contracts (
    workspace_id String,
    id String,
    created_at Int64,
    body String,
    version UInt64
) ENGINE = ReplacingMergeTree(version) ORDER BY (workspace_id, id);

CREATE TABLE IF NOT EXISTS tracking_plans (
    workspace_id String,
    id String,
    created_at Int64,
    body String,
    version UInt64
) ENGINE = ReplacingMergeTree(version) ORDER BY (workspace_id, id);

CREATE TABLE IF NOT EXISTS proof_trails (
    workspace_id String,
    id String,
    title String,
    root_hash String,
    item_count UInt64,
    created_at Int64,
    body String,
    version UInt64
) ENGINE = ReplacingMergeTree(version) ORDER BY (workspace_id, id);

-- Enforcement receipts: append-only hash chains, one per (workspace,
-- writer), never changed after insert; ordered by chain position so that
-- the chain head and verification read the key. `body` is the receipt as
-- sealed, which verification rehashes. `seq` is insertion order.
CREATE TABLE IF NOT EXISTS governance_receipts (
    workspace_id String,
    id String,
    writer String,
    sequence Int64,
    prev_hash String,
    content_hash String,
    created_at Int64,
    outcome String,
    trace_id String,
    decision_id String,
    body String,
    seq UInt64
) ENGINE = MergeTree() ORDER BY (workspace_id, writer, sequence);

-- One row per push of a proof trail to an external endpoint, append-only.
CREATE TABLE IF NOT EXISTS export_receipts (
    workspace_id String,
    id String,
    proof_trail_id String,
    status String,
    created_at Int64,
    body String
) ENGINE = MergeTree() ORDER BY (workspace_id, id);

-- Webhooks (docs/webhooks.md): a deletion is a newer version with
-- `deleted_at` set; reads take `argMax(..., version)` per id.
CREATE TABLE IF NOT EXISTS webhooks (
    workspace_id String,
    id String,
    deleted_at Int64,
    body String,
    version UInt64
) ENGINE = ReplacingMergeTree(version) ORDER BY (workspace_id, id);

-- Every delivery attempt of a webhook, append-only. Written once per
-- attempt: the ReplacingMergeTree only folds a row sent twice.
CREATE TABLE IF NOT EXISTS webhook_attempts (
    workspace_id String,
    webhook_id String,
    created_at Int64,
    delivery_id String,
    attempt UInt32,
    body String
) ENGINE = ReplacingMergeTree() ORDER BY (workspace_id, webhook_id, created_at, delivery_id, attempt);

-- Webhook deliveries not finished, for a restart to carry on with: each
-- attempt writes a newer version, the last one with `done` set.
CREATE TABLE IF NOT EXISTS webhook_pending (
    workspace_id String,
    delivery_id String,
    due_at Int64,
    done UInt8,
    body String,
    version UInt64
) ENGINE = ReplacingMergeTree(version) ORDER BY (workspace_id, delivery_id);
