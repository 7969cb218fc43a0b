//! The ClickHouse store (`store.kind = "clickhouse"`): events in a MergeTree
//! partitioned by month, metadata in ReplacingMergeTree tables read with
//! `argMax(..., version)`, over ClickHouse's HTTP interface.
//!
//! ClickHouse has no transactions and no unique keys, so what the embedded
//! store gets from SQLite is done here by ordering writes and by checking
//! before writing:
//! - Writes that must check first (event ids, `messageId`, keys, sessions)
//!   run under a lock per workspace, so two calls of this process never
//!   both see "absent" and both write.
//! - An event is stored once: before inserting, the ids already stored are
//!   looked up by `(event, ts, id)`, which the table's key serves. A batch
//!   redelivered after a crash between its events and its acknowledgement
//!   is therefore stored once, never counted twice.
//! - Acknowledgements, `messageId`s and idempotency keys are written after
//!   the events they describe, so they never claim data that is not there.
//!
//! Governance writes are serialised per workspace the same way (see
//! `clickhouse/governance.rs`).
//! The schema is `deploy/clickhouse/schema.sql`.

mod attribution;
mod cluster;
mod connectors;
mod events;
mod gateway;
mod governance;
mod graph;
mod pending;
mod queries;
mod trackables;
mod webhooks;

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use clickhouse::{Client, Row};
use serde::{Deserialize, Serialize};

use super::{
    ApiKeyRecord, AppendRequest, AppendResult, EventFilter, NewApiKey, Store, StoredEvent,
    UsageTotals, Workspace,
};
use crate::auth::Scope;
use crate::error::{Error, Result};
pub use cluster::Cluster;
pub use events::{EventRow, to_row};

/// The schema, applied statement by statement at every start.
pub const SCHEMA: &str = include_str!("../../../deploy/clickhouse/schema.sql");
/// 2: `gateway_commits` (acks, gateway usage and reservations).
/// 3: `relationship_observations.seq` (see [`ADDED_COLUMNS`]).
/// 4: `message_ids.ts`.
const SCHEMA_VERSION: u32 = 4;
/// Columns added to a table after its first version, as (table, column,
/// type): `CREATE TABLE IF NOT EXISTS` leaves a table made by an older
/// version as it was, so [`ClickHouseStore::open`] adds what it lacks. Rows
/// written before get the type's default.
const ADDED_COLUMNS: &[(&str, &str, &str)] =
    &[("relationship_observations", "seq", "UInt64"), ("message_ids", "ts", "Int64")];
/// Bound on one call to ClickHouse; past it the store counts as unavailable.
const QUERY_TIMEOUT: Duration = Duration::from_secs(30);
/// Health must answer quickly even when ClickHouse hangs.
const PING_TIMEOUT: Duration = Duration::from_secs(2);
/// Seconds a client is told to wait when ClickHouse is down or overloaded.
const RETRY_AFTER_SECS: u64 = 5;
pub(crate) const DAY_MS: i64 = 86_400_000;

/// Where the store lives: the HTTP URL (credentials may be given as
/// `http://user:password@host:8123`), the database, created if missing, and
/// the cluster of the server's `remote_servers` to lay the tables out on
/// (`None`: one server).
#[derive(Debug, Clone)]
pub struct ClickHouseConfig {
    pub url: String,
    pub database: String,
    pub cluster: Option<String>,
    /// For an `https://` URL: trust only this PEM file's CAs instead of
    /// the platform's roots.
    pub ca_file: Option<PathBuf>,
}

/// Business ids remembered as registered, across workspaces; past this the
/// memory starts over (ids are the caller's to choose).
const MAX_KNOWN_BUSINESSES: usize = 100_000;
/// Business ids looked up per query.
const BUSINESS_LOOKUP: usize = 1000;

pub struct ClickHouseStore {
    client: Client,
    /// One lock per workspace (and one for workspaces and keys themselves):
    /// see the module documentation.
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    clock: Clock,
    /// Businesses known to exist, so that ingest registers a business once
    /// instead of asking at every call.
    businesses: Mutex<HashSet<(String, String)>>,
    /// Set on a cluster; see `clickhouse/cluster.rs`.
    cluster: Option<Cluster>,
    /// On a replicated cluster, one insert per table at a time (quorum
    /// inserts into one table must not overlap on ClickHouse 18.16).
    table_locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    sessions: gateway::KnownSessions,
    /// When this process last asked for expired idempotency keys to be
    /// deleted (ms; 0 = not yet): see `events::purge_expired_keys`.
    keys_purged_at: AtomicI64,
}

/// The client and, on a replicated cluster, the table's insert lock.
struct Inserter {
    client: Client,
    table_lock: Option<Arc<tokio::sync::Mutex<()>>>,
}

impl Inserter {
    async fn insert<T>(&self, table: &str, rows: &[T::Value<'_>]) -> Result<()>
    where
        T: clickhouse::RowWrite,
    {
        if rows.is_empty() {
            return Ok(());
        }
        let _guard = match &self.table_lock {
            Some(lock) => Some(lock.lock().await),
            None => None,
        };
        run(async {
            let mut insert = self.client.insert::<T>(table).await?;
            for row in rows {
                insert.write(row).await?;
            }
            insert.end().await
        })
        .await
    }
}

/// Versions and insertion order: wall-clock microseconds, strictly
/// increasing within the process and above anything already stored.
struct Clock(AtomicU64);

impl Clock {
    fn next(&self) -> u64 {
        let now = u64::try_from(crate::now_ms()).unwrap_or(0).saturating_mul(1000);
        let mut current = self.0.load(Ordering::Relaxed);
        loop {
            let next = now.max(current + 1);
            match self.0.compare_exchange_weak(current, next, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return next,
                Err(seen) => current = seen,
            }
        }
    }
}

/// Whether `name` can be used as a database name without quoting.
pub fn plain_identifier(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && name.len() <= 64
}

/// `url` if the store can reach ClickHouse at it, else why not: `http://`,
/// or `https://` for a server behind TLS.
pub fn parse_url(url: &str) -> std::result::Result<url::Url, String> {
    let parsed = url::Url::parse(url)
        .map_err(|e| format!("{e} in {url:?}: expected an http:// or https:// URL"))?;
    if !matches!(parsed.scheme(), "http" | "https") || !parsed.has_host() {
        return Err(format!("must be an http:// or https:// URL with a host, got {url:?}"));
    }
    Ok(parsed)
}

/// The client for `url`, with credentials moved from the URL into headers
/// (public for the insert benchmark's raw baseline). For `https://`, the
/// server's certificate must chain to `ca_file`'s CAs, or to the
/// platform's roots without one. Reads those files: blocking.
pub fn client_for(url: &str, ca_file: Option<&Path>) -> Result<Client> {
    let mut parsed =
        parse_url(url).map_err(|problem| Error::validation("store.clickhouse_url", problem))?;
    let user = parsed.username().to_owned();
    let password = parsed.password().map(str::to_owned);
    let _ = parsed.set_username("");
    let _ = parsed.set_password(None);
    let tls = match (parsed.scheme(), ca_file) {
        ("https", ca_file) => Some(
            crate::tls_client::client_config("store.clickhouse_ca_file", ca_file)
                .map_err(|problem| Error::validation("store.clickhouse_ca_file", problem))?,
        ),
        (_, Some(_)) => {
            return Err(Error::validation(
                "store.clickhouse_ca_file",
                "only for an https:// store.clickhouse_url",
            ));
        }
        (_, None) => None,
    };
    let mut client = http_client(tls)
        .with_url(parsed.as_str().trim_end_matches('/'))
        // 18.16 lacks RowBinaryWithNamesAndTypes, which validation needs.
        .with_validation(false);
    if !user.is_empty() {
        client = client.with_user(user);
    }
    if let Some(password) = password {
        client = client.with_password(password);
    }
    Ok(client)
}

/// The crate's default HTTP client with `TCP_NODELAY`, over TLS when given
/// a TLS config. Without `TCP_NODELAY` each small insert (a session, a
/// usage row) waits out the peer's delayed ACK (~40 ms on Linux) before
/// its last chunk leaves, which capped a gateway at ~15 batches/s whatever
/// their size.
fn http_client(tls: Option<rustls::ClientConfig>) -> Client {
    use hyper_util::client::legacy::{self, connect::HttpConnector};
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    // The crate's defaults: keep-alive probes, and idle connections closed
    // before the server's 3 s keep-alive timeout does it under a request.
    connector.set_keepalive(Some(Duration::from_secs(60)));
    let mut pool = legacy::Client::builder(hyper_util::rt::TokioExecutor::new());
    pool.pool_idle_timeout(Duration::from_secs(2));
    match tls {
        None => Client::with_http_client(pool.build(connector)),
        Some(tls) => {
            // The TCP connector refuses `https://` targets unless told
            // otherwise; the TLS wrapper in front of it hands it those.
            connector.enforce_http(false);
            let https = hyper_rustls::HttpsConnectorBuilder::new()
                .with_tls_config(tls)
                .https_only()
                .enable_http1()
                .wrap_connector(connector);
            Client::with_http_client(pool.build(https))
        }
    }
}

/// Network failures and overload are worth a retry later; the rest is a bug
/// (ours or the schema's).
fn classify(e: clickhouse::error::Error) -> Error {
    let error = classify_quietly(&e);
    if matches!(error, Error::Unavailable { .. }) {
        // The answer says only "unavailable": the cause goes to the log.
        tracing::warn!(error = %e, "ClickHouse unavailable");
    }
    error
}

fn classify_quietly(e: &clickhouse::error::Error) -> Error {
    use clickhouse::error::Error as Ch;
    match e {
        Ch::Network(_) | Ch::TimedOut => Error::Unavailable { retry_after_secs: RETRY_AFTER_SECS },
        // 241 memory limit, 252 too many parts, 202 too many queries,
        // 159 timeout: the server is alive but cannot take it now; on a
        // cluster, 285 too few live replicas for the quorum, 286 another
        // quorum insert still running, 319 unknown quorum status.
        Ch::BadResponse(text)
            if [
                "Code: 241",
                "Code: 252",
                "Code: 202",
                "Code: 159",
                "Code: 285",
                "Code: 286",
                "Code: 319",
            ]
            .iter()
            .any(|code| text.contains(code)) =>
        {
            Error::Unavailable { retry_after_secs: RETRY_AFTER_SECS }
        }
        _ => Error::internal(format!("clickhouse: {e}")),
    }
}

/// Every statement sent, with its values bound: the test against current
/// ClickHouse runs each of them (`emitted_sql_runs_on_current_clickhouse`).
#[cfg(test)]
static EMITTED: Mutex<std::collections::BTreeSet<String>> =
    Mutex::new(std::collections::BTreeSet::new());

/// Marks a query as about to be sent (recorded in tests).
trait Sent {
    fn sent(self) -> Self;
}

impl Sent for clickhouse::query::Query {
    fn sent(self) -> Self {
        #[cfg(test)]
        if let Ok(mut emitted) = EMITTED.lock() {
            emitted.insert(self.sql_display().to_string());
        }
        self
    }
}

/// Runs one call to ClickHouse within [`QUERY_TIMEOUT`].
async fn run<T>(call: impl Future<Output = clickhouse::error::Result<T>>) -> Result<T> {
    match tokio::time::timeout(QUERY_TIMEOUT, call).await {
        Ok(result) => result.map_err(classify),
        Err(_) => Err(Error::Unavailable { retry_after_secs: RETRY_AFTER_SECS }),
    }
}

/// Calls made at start, tried up to three times 500 ms apart while
/// `worth_retrying` says so, so that a connection dropped once (a node
/// restarting beside the cloud) does not stop the start.
async fn tried_at_start<T, E, F, C>(call: C, worth_retrying: impl Fn(&E) -> bool) -> Result<T, E>
where
    C: Fn() -> F,
    F: Future<Output = Result<T, E>>,
{
    let mut attempts = 0;
    loop {
        match call().await {
            Err(e) if attempts < 2 && worth_retrying(&e) => attempts += 1,
            result => return result,
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// [`run`] for the idempotent calls made at start ([`tried_at_start`]).
async fn retried<T, F, C>(call: C) -> Result<T>
where
    C: Fn() -> F,
    F: Future<Output = clickhouse::error::Result<T>>,
{
    tried_at_start(|| run(call()), |e| matches!(e, Error::Unavailable { .. })).await
}

/// The first call of a start (`SELECT 1`, [`tried_at_start`]). Its failure
/// names the cause (connection refused, a certificate that does not
/// verify, a wrong password), which the store's "unavailable" would hide
/// from whoever reads why the cloud did not start.
async fn first_contact(client: &Client, url: &str) -> Result<()> {
    let ping = || async {
        match tokio::time::timeout(QUERY_TIMEOUT, client.query("SELECT 1").fetch_one::<u8>()).await
        {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(causes(&e)),
            Err(_) => Err(format!("no answer within {QUERY_TIMEOUT:?}")),
        }
    };
    tried_at_start(ping, |_| true).await.map_err(|why| {
        let at = crate::outbound::destination(url);
        Error::validation(
            "store.clickhouse_url",
            format!("store.clickhouse_url: cannot reach ClickHouse at {at}: {why}"),
        )
    })
}

/// `e: its source: its source's source ...`, without repeats (wrappers
/// often print their source as part of their own message).
fn causes(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut next = e.source();
    while let Some(cause) = next {
        let part = cause.to_string();
        if !text.contains(&part) {
            text = format!("{text}: {part}");
        }
        next = cause.source();
    }
    text
}

/// Adds the [`ADDED_COLUMNS`] that tables made by an older version lack:
/// on a cluster to the local tables and to the Distributed ones over them.
/// ClickHouse 18.16 has no `ADD COLUMN IF NOT EXISTS`, so `system.columns`
/// (of the node the store talks to) says what is missing.
async fn add_missing_columns(
    client: &Client,
    database: &str,
    cluster: Option<&cluster::Cluster>,
) -> Result<()> {
    for &(table, column, kind) in ADDED_COLUMNS {
        for (name, target) in alter_targets(table, database, cluster) {
            let present: u64 = retried(|| {
                client
                    .query(
                        "SELECT count() FROM system.columns
                         WHERE database = ? AND table = ? AND name = ?",
                    )
                    .bind(database)
                    .bind(name.as_str())
                    .bind(column)
                    .sent()
                    .fetch_one()
            })
            .await?;
            if present == 0 {
                let alter = add_column(&target, column, kind);
                retried(|| client.query(&alter).sent().execute()).await?;
                tracing::info!(table = %name, column, "added a column of a newer schema version");
            }
        }
    }
    Ok(())
}

/// The `ALTER` that adds `column` to `target` (from [`alter_targets`]).
fn add_column(target: &str, column: &str, kind: &str) -> String {
    format!("ALTER TABLE {target} ADD COLUMN {column} {kind}")
}

/// Where a column of `table` goes: per table the store makes for it, its
/// name in `system.columns` and what `ALTER TABLE` names.
fn alter_targets(
    table: &str,
    database: &str,
    cluster: Option<&cluster::Cluster>,
) -> Vec<(String, String)> {
    match cluster {
        Some(cluster) => vec![
            (format!("{table}_local"), cluster.local_table(table)),
            (table.to_owned(), format!("{database}.{table} ON CLUSTER {}", cluster.name)),
        ],
        None => vec![(table.to_owned(), table.to_owned())],
    }
}

/// The statements of [`SCHEMA`]: comments dropped, split at a semicolon
/// that ends a line.
pub fn schema_statements() -> Vec<String> {
    let text: String = SCHEMA
        .lines()
        .filter(|line| !line.trim_start().starts_with("--"))
        .map(|line| format!("{line}\n"))
        .collect();
    text.split(";\n").map(str::trim).filter(|s| !s.is_empty()).map(str::to_owned).collect()
}

#[derive(Row, Serialize)]
struct WorkspaceRow<'a> {
    id: &'a str,
    name: &'a str,
    created_at: i64,
    version: u64,
}

#[derive(Row, Serialize)]
struct BusinessRow<'a> {
    workspace_id: &'a str,
    id: &'a str,
    name: &'a str,
    created_at: i64,
    version: u64,
}

#[derive(Row, Serialize)]
struct ApiKeyRow<'a> {
    workspace_id: &'a str,
    id: &'a str,
    key_hash: &'a str,
    name: &'a str,
    hint: &'a str,
    scopes: &'a str,
    created_at: i64,
    revoked_at: i64,
    version: u64,
}

/// A key as read back; the column order of [`KEY_SELECT`].
#[derive(Row, Deserialize)]
struct KeyRead {
    id: String,
    workspace_id: String,
    name: String,
    hint: String,
    scopes: String,
    created_at: i64,
    revoked_at: i64,
    key_hash: String,
}

impl KeyRead {
    fn into_record(self) -> ApiKeyRecord {
        ApiKeyRecord {
            id: self.id,
            workspace_id: self.workspace_id,
            name: self.name,
            hint: self.hint,
            scopes: self.scopes.split_whitespace().filter_map(Scope::parse).collect(),
            created_at: self.created_at,
            revoked_at: (self.revoked_at != 0).then_some(self.revoked_at),
        }
    }
}

/// The latest version of each key matching `WHERE` (appended by the
/// caller), exact whether or not ClickHouse has merged the versions yet.
const KEY_SELECT: &str = "SELECT id, workspace_id, argMax(name, version) AS k_name,
        argMax(hint, version) AS k_hint, argMax(scopes, version) AS k_scopes,
        argMax(created_at, version) AS k_created_at, argMax(revoked_at, version) AS k_revoked_at,
        argMax(key_hash, version) AS k_hash
    FROM api_keys";

#[derive(Row, Serialize)]
struct UsageRow<'a> {
    workspace_id: &'a str,
    day: i64,
    events_ingested: u64,
    api_calls: u64,
}

#[derive(Row, Deserialize)]
struct UsageRead {
    events_ingested: u64,
    api_calls: u64,
}

impl ClickHouseStore {
    /// Connects, creates the database and schema if missing, and records
    /// the schema version. Fails when ClickHouse cannot be reached.
    pub async fn open(config: &ClickHouseConfig) -> Result<ClickHouseStore> {
        if !plain_identifier(&config.database) {
            return Err(Error::validation(
                "store.clickhouse_database",
                "letters, digits and '_' only, not starting with a digit",
            ));
        }
        let (url, ca_file) = (config.url.clone(), config.ca_file.clone());
        let mut server = tokio::task::spawn_blocking(move || client_for(&url, ca_file.as_deref()))
            .await
            .map_err(Error::internal)??;
        first_contact(&server, &config.url).await?;
        let cluster = match &config.cluster {
            Some(name) => Some(cluster::Cluster::read(&server, name, &config.database).await?),
            None => None,
        };
        let on_cluster = cluster.as_ref().map(|c| format!(" ON CLUSTER {}", c.name));
        let create = format!(
            "CREATE DATABASE IF NOT EXISTS {}{}",
            config.database,
            on_cluster.unwrap_or_default()
        );
        retried(|| server.query(&create).sent().execute()).await?;
        let statements = match &cluster {
            Some(cluster) => {
                for (name, value) in cluster.options() {
                    server = server.with_setting(name, value);
                }
                cluster.statements(&config.database, &schema_statements())?
            }
            None => schema_statements(),
        };
        let client = server.with_database(config.database.clone());
        for statement in statements {
            retried(|| client.query(&statement).sent().execute()).await?;
        }
        add_missing_columns(&client, &config.database, cluster.as_ref()).await?;
        let version: u32 =
            retried(|| client.query("SELECT max(version) FROM schema_version").sent().fetch_one())
                .await?;
        if version < SCHEMA_VERSION {
            run(client
                .query("INSERT INTO schema_version (version, applied_at) VALUES (?, ?)")
                .bind(SCHEMA_VERSION)
                .bind(crate::now_ms())
                .sent()
                .execute())
            .await?;
        }
        // Versions must keep rising across restarts even if the wall clock
        // went back: start above everything stored.
        let mut highest = 0u64;
        for (table, column) in [
            ("events", "seq"),
            ("workspaces", "version"),
            ("businesses", "version"),
            ("api_keys", "version"),
            ("message_ids", "version"),
            ("gateway_sessions", "version"),
            ("gateway_commits", "version"),
            ("governance_decisions", "version"),
            ("governance_grants", "version"),
            ("governance_contracts", "version"),
            ("tracking_plans", "version"),
            ("proof_trails", "version"),
            ("governance_receipts", "seq"),
            ("trackables", "version"),
            ("connector_records", "version"),
            ("webhooks", "version"),
            ("webhook_pending", "version"),
        ] {
            let max: u64 = retried(|| {
                client.query(&format!("SELECT max({column}) FROM {table}")).sent().fetch_one()
            })
            .await?;
            highest = highest.max(max);
        }
        Ok(ClickHouseStore {
            client,
            locks: Mutex::new(HashMap::new()),
            clock: Clock(AtomicU64::new(highest)),
            businesses: Mutex::new(HashSet::new()),
            cluster,
            table_locks: Mutex::new(HashMap::new()),
            sessions: gateway::KnownSessions::default(),
            keys_purged_at: AtomicI64::new(0),
        })
    }

    /// What `ALTER TABLE ... DELETE` names to delete rows of `table`: on a
    /// cluster its local tables (a Distributed table takes no mutation).
    fn mutation_target(&self, table: &str) -> String {
        match &self.cluster {
            Some(cluster) => cluster.local_table(table),
            None => table.to_owned(),
        }
    }

    /// The lock that serializes check-then-write calls for `scope` (a
    /// workspace id, or `""` for workspaces and keys).
    fn lock_for(&self, scope: &str) -> Result<Arc<tokio::sync::Mutex<()>>> {
        let mut locks = self.locks.lock().map_err(|_| Error::internal("lock table poisoned"))?;
        Ok(Arc::clone(locks.entry(scope.to_owned()).or_default()))
    }

    async fn insert_rows<T>(&self, table: &str, rows: &[T::Value<'_>]) -> Result<()>
    where
        T: clickhouse::RowWrite,
    {
        self.inserter(table)?.insert::<T>(table, rows).await
    }

    /// What an insert into `table` needs, owned, so that a spawned task
    /// can make it after the call that started it has returned.
    fn inserter(&self, table: &str) -> Result<Inserter> {
        let table_lock = match &self.cluster {
            Some(cluster) if cluster.replicas > 1 => {
                let mut locks =
                    self.table_locks.lock().map_err(|_| Error::internal("lock table poisoned"))?;
                Some(Arc::clone(locks.entry(table.to_owned()).or_default()))
            }
            _ => None,
        };
        Ok(Inserter { client: self.client.clone(), table_lock })
    }

    async fn business_exists_impl(&self, ws: &str, business_id: &str) -> Result<bool> {
        let key = (ws.to_owned(), business_id.to_owned());
        if self.businesses.lock().map_err(|_| Error::internal("poisoned"))?.contains(&key) {
            return Ok(true);
        }
        let found: u64 = run(self
            .client
            .query("SELECT count() FROM businesses WHERE workspace_id = ? AND id = ?")
            .bind(ws)
            .bind(business_id)
            .sent()
            .fetch_one())
        .await?;
        if found > 0 {
            self.remember_businesses(ws, [business_id].into_iter())?;
        }
        Ok(found > 0)
    }

    /// Remembers business ids of `ws` as registered. A cache: past
    /// [`MAX_KNOWN_BUSINESSES`] it starts over, and what it forgot is
    /// looked up again.
    fn remember_businesses<'a>(
        &self,
        ws: &str,
        ids: impl ExactSizeIterator<Item = &'a str>,
    ) -> Result<()> {
        let mut known = self.businesses.lock().map_err(|_| Error::internal("poisoned"))?;
        if known.len() + ids.len() > MAX_KNOWN_BUSINESSES {
            known.clear();
        }
        known.extend(ids.map(|id| (ws.to_owned(), id.to_owned())));
        Ok(())
    }

    /// Registers the businesses an ingest names that are not known yet:
    /// one lookup per thousand unknown ids (they are the caller's to
    /// choose, up to one per event).
    async fn register_businesses(&self, ws: &str, ids: &[String]) -> Result<()> {
        let unknown: Vec<&str> = {
            let known = self.businesses.lock().map_err(|_| Error::internal("poisoned"))?;
            ids.iter()
                .filter(|id| !known.contains(&(ws.to_owned(), (*id).clone())))
                .map(String::as_str)
                .collect()
        };
        let mut found: HashSet<String> = HashSet::new();
        for chunk in unknown.chunks(BUSINESS_LOOKUP) {
            let sql = format!(
                "SELECT DISTINCT id FROM businesses WHERE workspace_id = ? AND id IN ({})",
                events::placeholders(chunk.len())
            );
            let query = chunk.iter().fold(self.client.query(&sql).bind(ws), |q, id| q.bind(id));
            found.extend(run(query.sent().fetch_all::<String>()).await?);
        }
        let missing: Vec<&str> =
            unknown.iter().copied().filter(|id| !found.contains(*id)).collect();
        let now = crate::now_ms();
        let rows: Vec<BusinessRow<'_>> = missing
            .iter()
            .map(|id| BusinessRow {
                workspace_id: ws,
                id,
                name: id,
                created_at: now,
                version: self.clock.next(),
            })
            .collect();
        self.insert_rows::<BusinessRow<'_>>("businesses", &rows).await?;
        self.remember_businesses(ws, unknown.into_iter())
    }

    async fn count_events_ingested(&self, ws: &str, inserted: usize) -> Result<()> {
        if inserted == 0 {
            return Ok(());
        }
        let row = UsageRow {
            workspace_id: ws,
            day: crate::now_ms().div_euclid(DAY_MS),
            events_ingested: inserted as u64,
            api_calls: 0,
        };
        self.insert_rows::<UsageRow<'_>>("usage_daily", &[row]).await
    }

    async fn key_by_hash(&self, hash: &str) -> Result<Option<ApiKeyRecord>> {
        let rows: Vec<KeyRead> = run(self
            .client
            .query(&format!("{KEY_SELECT} WHERE key_hash = ? GROUP BY workspace_id, id"))
            .bind(hash)
            .sent()
            .fetch_all())
        .await?;
        Ok(rows.into_iter().find(|r| r.key_hash == hash).map(KeyRead::into_record))
    }
}

#[async_trait]
impl Store for ClickHouseStore {
    async fn ping(&self) -> Result<()> {
        match tokio::time::timeout(
            PING_TIMEOUT,
            self.client.query("SELECT 1").sent().fetch_one::<u8>(),
        )
        .await
        {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(classify(e)),
            Err(_) => Err(Error::Unavailable { retry_after_secs: RETRY_AFTER_SECS }),
        }
    }

    async fn create_workspace(&self, workspace: &Workspace) -> Result<()> {
        let lock = self.lock_for("")?;
        let _guard = lock.lock().await;
        if self.workspace_exists(&workspace.id).await? {
            return Err(Error::Conflict(format!("workspace {} exists", workspace.id)));
        }
        let row = WorkspaceRow {
            id: &workspace.id,
            name: &workspace.name,
            created_at: workspace.created_at,
            version: self.clock.next(),
        };
        self.insert_rows::<WorkspaceRow<'_>>("workspaces", &[row]).await?;
        let business = BusinessRow {
            workspace_id: &workspace.id,
            id: "default",
            name: &workspace.name,
            created_at: workspace.created_at,
            version: self.clock.next(),
        };
        self.insert_rows::<BusinessRow<'_>>("businesses", &[business]).await
    }

    async fn workspace_exists(&self, workspace_id: &str) -> Result<bool> {
        let found: u64 = run(self
            .client
            .query("SELECT count() FROM workspaces WHERE id = ?")
            .bind(workspace_id)
            .sent()
            .fetch_one())
        .await?;
        Ok(found > 0)
    }

    async fn count_workspaces(&self) -> Result<u64> {
        run(self.client.query("SELECT uniqExact(id) FROM workspaces").sent().fetch_one()).await
    }

    async fn insert_api_key(&self, key: NewApiKey) -> Result<ApiKeyRecord> {
        let lock = self.lock_for("")?;
        let _guard = lock.lock().await;
        if let Some(stored) = self.key_by_hash(&key.hash).await? {
            return Ok(stored);
        }
        let r = &key.record;
        let scopes = r.scopes.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(" ");
        let row = ApiKeyRow {
            workspace_id: &r.workspace_id,
            id: &r.id,
            key_hash: &key.hash,
            name: &r.name,
            hint: &r.hint,
            scopes: &scopes,
            created_at: r.created_at,
            revoked_at: r.revoked_at.unwrap_or(0),
            version: self.clock.next(),
        };
        self.insert_rows::<ApiKeyRow<'_>>("api_keys", &[row]).await?;
        self.key_by_hash(&key.hash)
            .await?
            .ok_or_else(|| Error::internal("api key not readable after insert"))
    }

    async fn find_api_key(&self, hash: &str) -> Result<Option<ApiKeyRecord>> {
        Ok(self.key_by_hash(hash).await?.filter(|k| k.revoked_at.is_none()))
    }

    async fn list_api_keys(&self, workspace_id: &str, limit: usize) -> Result<Vec<ApiKeyRecord>> {
        let rows: Vec<KeyRead> = run(self
            .client
            .query(&format!(
                "{KEY_SELECT} WHERE workspace_id = ? GROUP BY workspace_id, id
                 ORDER BY k_created_at, id LIMIT ?"
            ))
            .bind(workspace_id)
            .bind(u64::try_from(limit).unwrap_or(u64::MAX))
            .sent()
            .fetch_all())
        .await?;
        Ok(rows.into_iter().map(KeyRead::into_record).collect())
    }

    async fn revoke_api_key(&self, workspace_id: &str, key_id: &str) -> Result<bool> {
        let lock = self.lock_for("")?;
        let _guard = lock.lock().await;
        let rows: Vec<KeyRead> = run(self
            .client
            .query(&format!(
                "{KEY_SELECT} WHERE workspace_id = ? AND id = ? GROUP BY workspace_id, id"
            ))
            .bind(workspace_id)
            .bind(key_id)
            .sent()
            .fetch_all())
        .await?;
        let Some(stored) = rows.into_iter().next() else {
            return Ok(false);
        };
        if stored.revoked_at != 0 {
            return Ok(true);
        }
        let row = ApiKeyRow {
            workspace_id,
            id: key_id,
            key_hash: &stored.key_hash,
            name: &stored.name,
            hint: &stored.hint,
            scopes: &stored.scopes,
            created_at: stored.created_at,
            revoked_at: crate::now_ms(),
            version: self.clock.next(),
        };
        self.insert_rows::<ApiKeyRow<'_>>("api_keys", &[row]).await?;
        Ok(true)
    }

    async fn append_events(
        &self,
        workspace_id: &str,
        request: AppendRequest,
    ) -> Result<AppendResult> {
        let lock = self.lock_for(workspace_id)?;
        let _guard = lock.lock().await;
        events::append(self, workspace_id, request).await
    }

    async fn claim_idempotency_key(
        &self,
        workspace_id: &str,
        key: &super::IdempotencyKey,
    ) -> Result<()> {
        let lock = self.lock_for(workspace_id)?;
        let _guard = lock.lock().await;
        events::claim_key(self, workspace_id, key).await
    }

    async fn list_events(
        &self,
        workspace_id: &str,
        filter: &EventFilter,
    ) -> Result<Vec<StoredEvent>> {
        events::list(self, workspace_id, filter).await
    }

    async fn record_api_calls(&self, workspace_id: &str, day_ms: i64, calls: u64) -> Result<()> {
        let row = UsageRow {
            workspace_id,
            day: day_ms.div_euclid(DAY_MS),
            events_ingested: 0,
            api_calls: calls,
        };
        self.insert_rows::<UsageRow<'_>>("usage_daily", &[row]).await
    }

    async fn usage(&self, workspace_id: &str, from_ms: i64, to_ms: i64) -> Result<UsageTotals> {
        let (from_day, to_day) = (from_ms.div_euclid(DAY_MS), to_ms.div_euclid(DAY_MS));
        let today = crate::now_ms().div_euclid(DAY_MS);
        let uncounted = if (from_day..=to_day).contains(&today) {
            self.uncounted_gateway_events(workspace_id).await?
        } else {
            0
        };
        let read: UsageRead = run(self
            .client
            .query(
                "SELECT sum(events), sum(calls) FROM (
                    SELECT events_ingested AS events, api_calls AS calls FROM usage_daily
                    WHERE workspace_id = ? AND day >= ? AND day <= ?
                    UNION ALL
                    SELECT events_ingested AS events, toUInt64(0) AS calls FROM gateway_commits
                    WHERE workspace_id = ? AND day >= ? AND day <= ?
                 )",
            )
            .bind(workspace_id)
            .bind(from_day)
            .bind(to_day)
            .bind(workspace_id)
            .bind(from_day)
            .bind(to_day)
            .sent()
            .fetch_one())
        .await?;
        let events_ingested = read.events_ingested.saturating_add(uncounted);
        Ok(UsageTotals { events_ingested, api_calls: read.api_calls })
    }

    async fn close(&self) -> Result<()> {
        // Every other write is on the server when its call returns.
        self.flush_gateway_commits().await
    }
}

#[cfg(test)]
mod tests {
    use opgraph_tests::clickhouse::ClickHouse;

    use super::*;

    /// A fresh store on a private server that lives as long as it. Fails
    /// with the reason when clickhouse-server is not installed.
    pub(super) async fn open() -> (ClickHouseStore, ClickHouse) {
        let server = ClickHouse::start().await.expect("a private ClickHouse server");
        (store_on(&server).await, server)
    }

    async fn store_on(server: &ClickHouse) -> ClickHouseStore {
        let config = ClickHouseConfig {
            url: server.url(),
            database: "opgraph".into(),
            cluster: None,
            ca_file: None,
        };
        ClickHouseStore::open(&config).await.expect("open the ClickHouse store")
    }

    /// How many queries started on the server's `system.query_log` match
    /// `like`, counting every query sent before the call.
    pub(super) async fn queries_logged(client: &clickhouse::Client, like: &str) -> u64 {
        opgraph_tests::clickhouse::flush_query_log(client).await;
        client
            .query("SELECT count() FROM system.query_log WHERE type = 1 AND query LIKE ?")
            .bind(like)
            .fetch_one()
            .await
            .unwrap()
    }

    mod conformance {
        use super::open;

        crate::store_conformance!(open);
    }

    fn event(id: &str) -> crate::store::NewEvent {
        let event =
            opgraph_proto::Event::parse_json(&serde_json::json!({"event": "pallet.scanned"}))
                .expect("event");
        crate::store::NewEvent { id: id.into(), received_at: crate::now_ms(), event }
    }

    #[tokio::test]
    async fn a_text_stored_before_folding_is_found_by_the_needle_as_given() {
        // Rows written before 27 November 2026 hold their search text as
        // written, here with a final sigma the fold turns into sigma.
        use crate::store::queries::QueryStore as _;
        let (store, _server) = open().await;
        let mut row = events::to_row("ws", event("evt_1"));
        row.search_text = "pallet.scanned λογος".into();
        store.insert_rows::<events::EventRow>("events", &[row]).await.unwrap();
        let query = crate::store::conformance::search_query;
        let found = store.search_events("ws", &query("λογος")).await.unwrap();
        assert_eq!(found.total, 1);
        assert_eq!(found.events[0].id, "evt_1");
        // A row stored now holds the folded text, found either way.
        let mut new = event("evt_2");
        new.event.event = "ΛΟΓΟΣ.read".into();
        let request =
            AppendRequest { events: vec![new], idempotency_key: None, new_event_limit: None };
        store.append_events("ws", request).await.unwrap();
        assert_eq!(store.search_events("ws", &query("λογος")).await.unwrap().total, 2);
        assert_eq!(store.search_events("ws", &query("ΛΟΓΟΣ")).await.unwrap().total, 1);
    }

    #[tokio::test]
    async fn many_new_businesses_are_looked_up_together_and_registered_once() {
        let server = ClickHouse::start_logging_queries().await.unwrap();
        let store = store_on(&server).await;
        let events = |round: usize| {
            (0..2500)
                .map(|n| {
                    let mut new = event(&format!("evt_{round}_{n}"));
                    new.event.business_id = Some(format!("site-{n}"));
                    new
                })
                .collect::<Vec<_>>()
        };
        for round in 0..2 {
            let request = AppendRequest {
                events: events(round),
                idempotency_key: None,
                new_event_limit: None,
            };
            store.append_events("ws", request).await.unwrap();
            // The next round finds them in memory: forget them.
            store.businesses.lock().unwrap().clear();
        }
        assert!(store.business_exists_impl("ws", "site-2499").await.unwrap());
        let count = |sql: &'static str| store.client.query(sql).fetch_one::<u64>();
        assert_eq!(count("SELECT count() FROM businesses FINAL").await.unwrap(), 2500);
        let lookups =
            queries_logged(&store.client, "SELECT%FROM businesses WHERE workspace_id%").await;
        // Three per round of 2,500 (a thousand at a time), and the check.
        assert_eq!(lookups, 7);
    }

    #[tokio::test]
    async fn opening_twice_keeps_data_and_schema_version() {
        let (store, server) = open().await;
        let request = AppendRequest {
            events: vec![event("evt_1")],
            idempotency_key: None,
            new_event_limit: None,
        };
        store.append_events("ws", request).await.unwrap();
        let config = ClickHouseConfig {
            url: server.url(),
            database: "opgraph".into(),
            cluster: None,
            ca_file: None,
        };
        let reopened = ClickHouseStore::open(&config).await.unwrap();
        let filter = EventFilter { limit: 10, ..Default::default() };
        assert_eq!(reopened.list_events("ws", &filter).await.unwrap().len(), 1);
        let versions: Vec<u32> =
            reopened.client.query("SELECT version FROM schema_version").fetch_all().await.unwrap();
        assert_eq!(versions, [SCHEMA_VERSION]);
        // Versions keep rising across the reopen.
        assert!(reopened.clock.next() > store.clock.next() - 1_000_000);
    }

    #[tokio::test]
    async fn a_stopped_server_is_unavailable_and_recovery_needs_nothing() {
        let (store, mut server) = open().await;
        server.kill();
        assert!(matches!(store.ping().await, Err(Error::Unavailable { .. })));
        let request = AppendRequest {
            events: vec![event("evt_1")],
            idempotency_key: None,
            new_event_limit: None,
        };
        let err = store.append_events("ws", request.clone()).await.unwrap_err();
        assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
        let response = axum::response::IntoResponse::into_response(err);
        assert_eq!(response.status(), axum::http::StatusCode::SERVICE_UNAVAILABLE);
        assert!(response.headers().contains_key(axum::http::header::RETRY_AFTER));

        server.restart().await.unwrap();
        store.ping().await.unwrap();
        let stored = store.append_events("ws", request).await.unwrap();
        assert_eq!(stored.inserted, 1);
    }

    /// Everything the store sent while the core conformance cases ran on
    /// 18.16 is run again on current ClickHouse (chdb, in-process), so
    /// that the SQL stays valid on both.
    #[tokio::test]
    async fn emitted_sql_runs_on_current_clickhouse() {
        use crate::store::conformance as c;
        for case in 0..17 {
            let (store, _server) = open().await;
            c::load(&store).await;
            match case {
                0 => c::workspaces_and_keys(&store).await,
                1 => c::list_events(&store).await,
                2 => c::appends_are_idempotent(&store).await,
                3 => c::usage_counters(&store).await,
                4 => c::gateway_batches(&store).await,
                5 => c::totals(&store).await,
                6 => c::series(&store).await,
                7 => c::search(&store).await,
                8 => c::proof_gaps(&store).await,
                9 => c::runs_and_actors(&store).await,
                10 => c::funnel(&store).await,
                11 => c::metric_definitions_and_snapshots(&store).await,
                12 => c::entities_and_relationships(&store).await,
                13 => {
                    trackables::tests::register_and_use(&store, crate::now_ms()).await;
                }
                14 => {
                    connectors::tests::resync(&store, crate::now_ms()).await;
                }
                15 => c::attribution_first_touch(&store).await,
                _ => c::governance(&store).await,
            }
        }
        let mut emitted: Vec<String> = EMITTED.lock().unwrap().iter().cloned().collect();
        assert!(emitted.len() > 20, "{emitted:?}");
        // The cluster layout's DDL and mutations as well, as far as one
        // process can run them (check_current.py).
        let cluster = Cluster { name: "opgraph".into(), database: "opgraph".into(), replicas: 2 };
        emitted.extend(cluster.statements("opgraph", &schema_statements()).unwrap());
        emitted
            .push(format!("ALTER TABLE {} DELETE WHERE id = 'x'", cluster.local_table("events")));
        for (table, column, kind) in ADDED_COLUMNS {
            for (_, target) in alter_targets(table, "opgraph", Some(&cluster)) {
                emitted.push(add_column(&target, column, kind));
            }
        }
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("statements.json");
        std::fs::write(&file, serde_json::to_string(&emitted).unwrap()).unwrap();
        let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../deploy/clickhouse/check_current.py");
        let output = tokio::process::Command::new("python3")
            .arg(&script)
            .arg(&file)
            .output()
            .await
            .expect("python3 (installed by deploy/scripts/install-test-deps.sh)");
        assert!(
            output.status.success(),
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }

    /// An HTTP append whose events landed before a later write failed
    /// counts them; its retry finds them by id and counts none again.
    #[tokio::test]
    async fn a_failed_append_counts_the_events_that_landed_once() {
        let (store, _server) = open().await;
        // The same events again, as a gateway's resend (or a client that
        // names its event ids) sends them.
        let append = || {
            let events = ["evt_a", "evt_b"].map(|id| {
                let event = opgraph_proto::Event::parse_json(&serde_json::json!({
                    "event": "pallet.scanned", "timestamp": 1_764_064_800_000_i64,
                    "entity": {"type": "pallet", "id": id},
                }))
                .unwrap();
                crate::store::NewEvent { id: id.into(), received_at: 1, event }
            });
            store.append_events(
                "ws",
                AppendRequest {
                    events: events.into(),
                    idempotency_key: None,
                    new_event_limit: None,
                },
            )
        };
        store.client.query("DETACH TABLE entity_observations").execute().await.unwrap();
        append().await.unwrap_err();
        store.client.query("ATTACH TABLE entity_observations").execute().await.unwrap();
        assert_eq!(store.usage("ws", 0, i64::MAX / 2).await.unwrap().events_ingested, 2);
        assert_eq!(append().await.unwrap().inserted, 0);
        assert_eq!(store.usage("ws", 0, i64::MAX / 2).await.unwrap().events_ingested, 2);
    }

    /// A `messageId` delivered again under a new id (as an HTTP retry
    /// is), after a failure that left the event stored without its derived
    /// rows, and after one that left the ledger row without the event: it
    /// is stored exactly once, under the first id.
    #[tokio::test]
    async fn a_retried_message_id_is_stored_once_whatever_failed() {
        let (store, _server) = open().await;
        let send = |id: &str, message: &str| {
            let event = opgraph_proto::Event::parse_json(&serde_json::json!({
                "event": "pallet.scanned", "messageId": message,
                "entity": {"type": "pallet", "id": message},
            }))
            .unwrap();
            let events = vec![crate::store::NewEvent { id: id.into(), received_at: 7, event }];
            store.append_events(
                "ws",
                AppendRequest { events, idempotency_key: None, new_event_limit: None },
            )
        };
        let client = store.client.clone();
        let stored = |message: &'static str| {
            let query = client
                .query("SELECT id FROM events WHERE workspace_id = 'ws' AND message_id = ?")
                .bind(message);
            async move {
                let mut ids: Vec<String> = query.fetch_all().await.unwrap();
                ids.sort();
                ids
            }
        };

        // The events landed, the derived rows after them did not.
        store.client.query("DETACH TABLE entity_observations").execute().await.unwrap();
        send("evt_1", "m-1").await.unwrap_err();
        store.client.query("ATTACH TABLE entity_observations").execute().await.unwrap();
        assert_eq!(send("evt_1b", "m-1").await.unwrap().ids, ["evt_1"]);
        assert_eq!(stored("m-1").await, ["evt_1"]);

        // The ledger row landed, the event did not: what a crash between
        // the two leaves.
        let ledger = "INSERT INTO message_ids (workspace_id, message_id, id, version, ts)
                      VALUES ('ws', 'm-2', 'evt_2', 1, 7)";
        store.client.query(ledger).execute().await.unwrap();
        let retry = send("evt_2b", "m-2").await.unwrap();
        assert_eq!((retry.ids, retry.inserted), (vec!["evt_2".to_owned()], 1));
        assert_eq!(send("evt_2c", "m-2").await.unwrap().inserted, 0);
        assert_eq!(stored("m-2").await, ["evt_2"]);
    }

    /// A store made before schema version 3 (edges without `seq`) gets the
    /// column at the next start; its edges keep counting one row each.
    #[tokio::test]
    async fn opening_an_older_schema_adds_the_missing_columns() {
        let (store, server) = open().await;
        let drop = "ALTER TABLE relationship_observations DROP COLUMN seq";
        store.client.query(drop).execute().await.unwrap();
        let legacy = "INSERT INTO relationship_observations
            (workspace_id, from_type, from_id, relation, to_type, to_id, ts)
            VALUES ('ws', 'scanner', 'S-1', 'tote.scanned', 'tote', 'T-1', 5)";
        for _ in 0..2 {
            store.client.query(legacy).execute().await.unwrap();
        }
        let config = ClickHouseConfig {
            url: server.url(),
            database: "opgraph".into(),
            cluster: None,
            ca_file: None,
        };
        let reopened = ClickHouseStore::open(&config).await.unwrap();
        let edges =
            crate::store::queries::QueryStore::list_relationships(&reopened, "ws", None, 10);
        let edges = edges.await.unwrap();
        assert_eq!(edges.iter().map(|e| e.count).collect::<Vec<_>>(), [2]);
        let seqs: Vec<u64> = reopened
            .client
            .query("SELECT seq FROM relationship_observations")
            .fetch_all()
            .await
            .unwrap();
        assert_eq!(seqs, [0, 0]);
    }

    #[test]
    fn schema_statements_split_cleanly() {
        let statements = schema_statements();
        assert!(statements.len() >= 9, "{statements:?}");
        assert!(statements.iter().all(|s| s.starts_with("CREATE TABLE IF NOT EXISTS")));
        assert!(statements.iter().all(|s| !s.contains(';')));
    }
}
