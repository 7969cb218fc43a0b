//! The embedded default store: SQLite in WAL mode in one data directory.
//!
//! Writes go to one writer thread that groups whatever is queued into one
//! transaction (group commit): each caller gets its answer only after the
//! commit is on disk, which a thread of its own ensures by syncing the
//! write-ahead log while the writer goes on with the next group
//! (`wal_sync`), so an acknowledged ingest survives `kill -9` and power loss
//! alike, while many concurrent requests share one fsync. Each request runs
//! in its own savepoint (the first of a group in the transaction alone,
//! which is rolled back and begun again if it fails), so one failing request
//! never takes its neighbours down and never leaves half of itself behind.
//!
//! Reads use a small pool of read-only connections on blocking threads; WAL
//! lets them run beside the writer, and so does a checkpointer thread that
//! copies committed WAL pages into the database file. The search index is a
//! database of its own that a third thread keeps up with the events
//! (`search`).

mod connectors;
mod events;
mod gateway;
mod governance;
mod journeys;
mod page_cache;
mod queries;
mod search;
mod sqlite_config;
mod trackables;
mod wal_sync;
mod webhooks;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use async_trait::async_trait;
use rusqlite::config::DbConfig;
use rusqlite::{Connection, OpenFlags, OptionalExtension, params};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot};

use super::{
    ApiKeyRecord, AppendRequest, AppendResult, EventFilter, NewApiKey, NewEvent, Store,
    StoredEvent, UsageTotals, Workspace,
};
use crate::auth::Scope;
use crate::error::{Error, Result};

const SCHEMA: &str = include_str!("embedded/schema.sql");
const SCHEMA_VERSION: i64 = 1;
const DB_FILE: &str = "opgraph.db";
/// Most requests folded into one transaction.
const MAX_GROUP: usize = 512;
const READ_POOL_MAX: usize = 8;

type Reply = Box<dyn FnOnce(Result<()>) + Send>;
/// Runs against the writer connection, or with `None` when the transaction
/// could not even begin, in which case it only reports the failure.
type Job = Box<dyn FnOnce(Option<&Connection>) -> (bool, Reply) + Send>;

/// Requests waiting for the writer, at most; past it, callers wait for
/// room ([`EmbeddedStore::write`]).
const QUEUE_LIMIT: usize = 4096;

enum Command {
    /// A request, with its place in the queue: room for the next caller
    /// once the writer takes it.
    Write(Job, OwnedSemaphorePermit),
    Close(oneshot::Sender<()>),
}

pub struct EmbeddedStore {
    path: PathBuf,
    writer: Mutex<Option<mpsc::Sender<Command>>>,
    /// Places in the writer's queue. Tokio's semaphore serves waiters in
    /// the order they asked, so requests enter the queue in the order
    /// their futures were first polled, full queue or not.
    queue: Arc<Semaphore>,
    readers: Arc<Mutex<Vec<Connection>>>,
    search: search::SearchIndex,
    /// The sync thread's gate ([`wal_sync::WalSync::gate`]).
    #[cfg(test)]
    sync_gate: Arc<Mutex<()>>,
    /// Held, never read: the data directory is this process's ([`create_and_lock_dir`]).
    _dir_lock: Option<std::fs::File>,
}

/// How the embedded store runs; see `StoreConfig` for what each costs.
#[derive(Debug, Clone, Copy)]
pub struct EmbeddedOptions {
    /// Extra wait to gather concurrent writes into one transaction.
    pub group_commit_window: Duration,
    /// Page cache of the writer connection, in bytes.
    pub writer_cache: u64,
    /// Size of the write-ahead log past which the writer checkpoints
    /// between two groups, so that the log restarts ([`DEFAULT_WAL_LIMIT`]).
    pub wal_limit: u64,
    /// How long a search waits for the search index to reach the events
    /// stored when it began, before it answers without the rest
    /// ([`DEFAULT_SEARCH_WAIT`]).
    pub search_wait: Duration,
}

/// The writer's default page cache; why it is this large: docs/storage.md.
pub const DEFAULT_WRITER_CACHE: u64 = 256 * 1024 * 1024;

/// The write-ahead log's bound. The checkpointer thread copies the log
/// into the database beside the writer, but SQLite only starts the log
/// over at a transaction that finds it fully copied, which a writer that
/// never pauses never does: under sustained single-event ingest the log
/// grew by 160 MB/s with nothing to stop it short of a full disk. A
/// checkpoint on the writer, between groups, copies what the checkpointer
/// has not yet (at most one interval of commits) and lets the next
/// transaction restart the log from its beginning.
pub const DEFAULT_WAL_LIMIT: u64 = 64 * 1024 * 1024;

/// Long enough for the index to catch up with any burst of ingest; it is
/// only reached when the index cannot be written, or while it is being
/// built for a store that had none (an upgrade, a restored store).
pub const DEFAULT_SEARCH_WAIT: Duration = Duration::from_secs(10);

impl Default for EmbeddedOptions {
    fn default() -> Self {
        EmbeddedOptions {
            group_commit_window: Duration::ZERO,
            writer_cache: DEFAULT_WRITER_CACHE,
            wal_limit: DEFAULT_WAL_LIMIT,
            search_wait: DEFAULT_SEARCH_WAIT,
        }
    }
}

impl EmbeddedStore {
    /// Opens (or creates) the store in `dir` and starts its writer thread.
    pub fn open(dir: &Path, options: EmbeddedOptions) -> Result<EmbeddedStore> {
        let dir_lock = create_and_lock_dir(dir)?;
        let conn = open_writer(dir, options.writer_cache)?;
        let group_commit_window = options.group_commit_window;
        let path = dir.join(DB_FILE);
        // Checkpoints move to a thread of their own ([`checkpointer`]),
        // and to the writer's group boundaries once the log outgrows its
        // limit ([`Writer::bound_wal`]). Past the limit, the log file is
        // cut back to it when the log restarts.
        conn.pragma_update(None, "wal_autocheckpoint", 0).map_err(Error::internal)?;
        let wal_limit = i64::try_from(options.wal_limit).unwrap_or(i64::MAX);
        conn.pragma_update(None, "journal_size_limit", wal_limit).map_err(Error::internal)?;
        let checkpoints = open_checkpointer(&path).map_err(Error::internal)?;
        let (nudge, nudges) = mpsc::sync_channel::<()>(1);
        std::thread::Builder::new()
            .name("store-checkpoint".into())
            .spawn(move || checkpointer(checkpoints, nudges))
            .map_err(Error::internal)?;
        let (search, index_nudge) = search::SearchIndex::start(&path, options.search_wait)?;
        // Commits write the log without syncing it; the sync thread syncs
        // it before anyone is answered ([`wal_sync`]).
        conn.pragma_update(None, "synchronous", "NORMAL").map_err(Error::internal)?;
        let wal_path = dir.join(format!("{DB_FILE}-wal"));
        let sync = wal_sync::WalSync::start(&wal_path, index_nudge)?;
        #[cfg(test)]
        let sync_gate = Arc::clone(&sync.gate);
        let (tx, rx) = mpsc::channel::<Command>();
        let writer = Writer {
            conn,
            window: group_commit_window,
            checkpoint: nudge,
            sync,
            wal: WalBound {
                path: wal_path,
                limit: options.wal_limit,
                failing: std::cell::Cell::new(false),
            },
        };
        std::thread::Builder::new()
            .name("store-writer".into())
            .spawn(move || writer.run(rx))
            .map_err(Error::internal)?;
        Ok(EmbeddedStore {
            path,
            writer: Mutex::new(Some(tx)),
            queue: Arc::new(Semaphore::new(QUEUE_LIMIT)),
            readers: Arc::new(Mutex::new(Vec::new())),
            search,
            #[cfg(test)]
            sync_gate,
            _dir_lock: dir_lock,
        })
    }

    /// Runs `f` in the writer's transaction (inside its own savepoint) and
    /// resolves once that transaction is committed.
    async fn write<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let (tx, rx) = oneshot::channel::<Result<T>>();
        let job: Job = Box::new(move |conn| {
            let result = match conn {
                Some(conn) => f(conn),
                None => Err(Error::Unavailable { retry_after_secs: 1 }),
            };
            let ok = result.is_ok();
            let reply: Reply = Box::new(move |committed: Result<()>| {
                let _ = tx.send(committed.and(result));
            });
            (ok, reply)
        });
        // A full queue makes callers wait here, off the writer: the
        // back-pressure on ingest.
        let place = Arc::clone(&self.queue)
            .acquire_owned()
            .await
            .map_err(|_| Error::Unavailable { retry_after_secs: 1 })?;
        let sender = self
            .writer
            .lock()
            .map_err(|_| Error::internal("writer lock poisoned"))?
            .clone()
            .ok_or(Error::Unavailable { retry_after_secs: 1 })?;
        sender
            .send(Command::Write(job, place))
            .map_err(|_| Error::Unavailable { retry_after_secs: 1 })?;
        rx.await.map_err(|_| Error::internal("store writer stopped"))?
    }

    /// Waits until the search index has reached every event (and removal)
    /// committed now, so that a search that starts next finds every event
    /// acknowledged before it; at most [`EmbeddedOptions::search_wait`].
    async fn wait_for_search_index(&self) -> Result<()> {
        let target = self.read(|conn| search::target(conn).map_err(sql)).await?;
        self.search.wait(target).await;
        Ok(())
    }

    /// Runs `f` on a pooled read connection on a blocking thread.
    async fn read<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let pool = Arc::clone(&self.readers);
        let path = self.path.clone();
        tokio::task::spawn_blocking(move || {
            let pooled = pool.lock().map_err(|_| Error::internal("pool poisoned"))?.pop();
            let conn = match pooled {
                Some(conn) => conn,
                None => open_reader(&path)
                    .and_then(|conn| search::attach(&conn, &path).map(|()| conn))
                    .map_err(Error::internal)?,
            };
            let result = f(&conn);
            if let Ok(mut pool) = pool.lock()
                && pool.len() < READ_POOL_MAX
            {
                pool.push(conn);
            }
            result
        })
        .await
        .map_err(Error::internal)?
    }
}

/// Events flattened into their rows, ready to be written: the part of an
/// append that needs no database (see [`prepare_events`]).
pub struct PreparedEvents(Vec<events::Row>);

/// Flattens events into rows; [`EmbeddedStore`] does this before handing a
/// request to its writer thread.
pub fn prepare_events(events: Vec<NewEvent>) -> PreparedEvents {
    PreparedEvents(events::prepare_rows(events))
}

/// Holds the data directory for this process ([`opgraph_proto::dir_lock`]).
/// SQLite would keep two clouds on one directory consistent, but each
/// assumes it is the only writer (its group commit, its gateways' acks, the
/// certificate and key files it creates on first start). Where the
/// directory cannot be locked, the store opens and says so.
fn create_and_lock_dir(dir: &Path) -> Result<Option<std::fs::File>> {
    use opgraph_proto::dir_lock::{DirLock, try_lock_dir};
    std::fs::create_dir_all(dir)
        .map_err(|e| Error::internal(format!("create {}: {e}", dir.display())))?;
    match try_lock_dir(dir) {
        DirLock::Held(handle) => Ok(Some(handle)),
        DirLock::InUse => Err(Error::validation(
            "store.data_dir",
            format!(
                "store.data_dir {}: in use by another process (one cloud per data directory)",
                dir.display()
            ),
        )),
        DirLock::Unsupported(e) => {
            tracing::warn!(dir = %dir.display(), error = %e, "data directory cannot be locked: make sure no other cloud uses it");
            Ok(None)
        }
    }
}

/// A writer connection opened by [`open_writer_connection`]; it holds the
/// data directory's lock for as long as it lives.
pub struct WriterConnection {
    conn: Connection,
    path: PathBuf,
    _dir_lock: Option<std::fs::File>,
}

impl std::ops::Deref for WriterConnection {
    type Target = Connection;

    fn deref(&self) -> &Connection {
        &self.conn
    }
}

/// Opens a writer connection on the store in `dir` as the store's writer
/// thread does (WAL, schema applied), without the thread, with
/// `synchronous = FULL` where the store has a thread sync its commits
/// (`wal_sync`), and with SQLite's automatic checkpoints, which the store
/// moves to its checkpointer thread. For tools and the ingest benchmark's raw-engine
/// baseline. It takes the directory's lock as a store does, so it is refused
/// beside a running cloud (whose writer it would fight) and a cloud is
/// refused beside it. Its page cache is [`DEFAULT_WRITER_CACHE`], as the
/// store's by default.
pub fn open_writer_connection(dir: &Path) -> Result<WriterConnection> {
    let dir_lock = create_and_lock_dir(dir)?;
    Ok(WriterConnection {
        conn: open_writer(dir, DEFAULT_WRITER_CACHE)?,
        path: dir.join(DB_FILE),
        _dir_lock: dir_lock,
    })
}

/// [`open_writer_connection`] with a page cache of `cache` bytes, for a
/// directory the caller has created and locked.
fn open_writer(dir: &Path, cache: u64) -> Result<Connection> {
    // Every store's first connection is its writer.
    sqlite_config::install();
    let path = dir.join(DB_FILE);
    let conn = Connection::open(&path)
        .map_err(|e| Error::internal(format!("open {}: {e}", path.display())))?;
    configure_writer(&conn, cache).map_err(Error::internal)?;
    migrate(&conn).map_err(Error::internal)?;
    conn.execute_batch(events::PENDING_TABLES).map_err(Error::internal)?;
    // Statistics for the planner: only tables whose size changed much since
    // their last analysis, each sampled, so this stays in milliseconds.
    conn.execute_batch("PRAGMA optimize = 0x10002").map_err(Error::internal)?;
    Ok(conn)
}

/// Writes prepared events in one transaction of their own with the same
/// statements as [`Store::append_events`] (event rows, rollups, entities,
/// usage), committed durably before returning. The search index follows
/// when a store opens on the directory, or through [`build_search_index`].
pub fn append_in_transaction(
    conn: &Connection,
    workspace_id: &str,
    rows: PreparedEvents,
    idempotency_key: Option<&super::IdempotencyKey>,
) -> Result<AppendResult> {
    in_transaction(conn, |conn| {
        let appended = events::append(conn, workspace_id, rows.0, idempotency_key, None)?;
        events::flush_pending(conn).map_err(sql)?;
        Ok(appended)
    })
}

/// Indexes for search, on the calling thread, every event of the store
/// that `conn` writes that its search index has not reached: for tools that
/// write a store through [`open_writer_connection`], so that a store they
/// made opens with its index built (the connection's directory lock keeps
/// a cloud's indexer away meanwhile). `progress` gets the number indexed so
/// far after each transaction. Answers how many events it indexed.
pub fn build_search_index(conn: &WriterConnection, progress: impl FnMut(u64)) -> Result<u64> {
    search::build(&conn.path, progress)
}

/// Runs `f` in an immediate transaction of its own: committed when `f`
/// succeeds, rolled back (when the transaction is dropped) when it fails.
fn in_transaction<T>(conn: &Connection, f: impl FnOnce(&Connection) -> Result<T>) -> Result<T> {
    let tx = rusqlite::Transaction::new_unchecked(conn, rusqlite::TransactionBehavior::Immediate)
        .map_err(sql)?;
    let value = f(&tx)?;
    tx.commit().map_err(sql)?;
    Ok(value)
}

/// Segments per level before FTS5 merges them (see [`migrate`]).
const FTS_AUTOMERGE: i64 = 16;

/// How much of the database file each connection maps.
const MMAP_SIZE: i64 = 256 * 1024 * 1024;
/// `cache_size` of every read connection and of the search index's own
/// connections (negative: KiB), 64 MiB: per database, so each attached one
/// needs it set too.
const READ_CACHE_KIB: i64 = -65536;

/// Statements kept prepared per connection. The write path alone uses more
/// than rusqlite's default of 16, and an evicted statement is parsed and
/// planned again on its next use.
const STATEMENT_CACHE: usize = 128;

fn configure_writer(conn: &Connection, cache: u64) -> rusqlite::Result<()> {
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    // Plans that do not depend on bound values. Without this, a cached
    // query whose plan consulted a bound value (planner statistics, partial
    // index checks) is parsed and planned again at every execution: the
    // enforcement path's reads of the trigger event and the chain head cost
    // about 20 µs each that way, on the single writer thread.
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    // FULL: the WAL is fsynced at each commit, so a committed write
    // survives power loss, not only a process crash. The store's writer
    // changes this to NORMAL and syncs on a thread of its own (`wal_sync`).
    conn.pragma_update(None, "synchronous", "FULL")?;
    conn.pragma_update(None, "busy_timeout", 5000)?;
    // A negative cache_size is in KiB.
    conn.pragma_update(None, "cache_size", -i64::try_from(cache / 1024).unwrap_or(i64::MAX))?;
    // Pages the cache misses are read through the mapping instead of a
    // pread and a copy each; writes still go through the WAL.
    conn.pragma_update(None, "mmap_size", MMAP_SIZE)?;
    conn.pragma_update(None, "temp_store", "MEMORY")?;
    Ok(())
}

/// How long the checkpointer gathers commits before checkpointing them
/// together: at most one fsync of the database file per interval.
const CHECKPOINT_INTERVAL: Duration = Duration::from_millis(200);

fn open_checkpointer(path: &Path) -> rusqlite::Result<Connection> {
    let conn = Connection::open(path)?;
    // A checkpoint must fsync the database file before the writer may reuse
    // the WAL frames it copied: the connection that checkpoints decides
    // that, so it is FULL here too.
    conn.pragma_update(None, "synchronous", "FULL")?;
    conn.pragma_update(None, "busy_timeout", 5000)?;
    Ok(conn)
}

/// Copies committed WAL frames into the database file, nudged by the writer
/// after each commit. SQLite's automatic checkpoint would run on the writer
/// thread inside a commit, every 1000 WAL pages: copying pages and an fsync
/// of the database file during which no request is served. A passive
/// checkpoint here runs beside the writer (WAL allows it) and never blocks
/// it. Stops when the writer has stopped; the writer checkpoints on close.
fn checkpointer(conn: Connection, nudges: mpsc::Receiver<()>) {
    while nudges.recv().is_ok() {
        let until = std::time::Instant::now() + CHECKPOINT_INTERVAL;
        loop {
            match nudges.recv_timeout(until.saturating_duration_since(std::time::Instant::now())) {
                Ok(()) => {}
                Err(mpsc::RecvTimeoutError::Timeout) => break,
                Err(mpsc::RecvTimeoutError::Disconnected) => return,
            }
        }
        if let Err(e) = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())) {
            tracing::warn!(error = %e, "WAL checkpoint failed");
        }
    }
}

fn open_reader(path: &Path) -> rusqlite::Result<Connection> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    conn.pragma_update(None, "busy_timeout", 5000)?;
    conn.pragma_update(None, "cache_size", READ_CACHE_KIB)?;
    conn.pragma_update(None, "mmap_size", MMAP_SIZE)?;
    // Attribution sorts its candidate rows: in memory, not
    // in temporary files.
    conn.pragma_update(None, "temp_store", "MEMORY")?;
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    Ok(conn)
}

/// Whether the store's schema has a table or index called `name`.
fn in_schema(conn: &Connection, name: &str) -> rusqlite::Result<bool> {
    conn.query_row("SELECT count(*) > 0 FROM sqlite_master WHERE name = ?1", [name], |r| r.get(0))
}

fn migrate(conn: &Connection) -> rusqlite::Result<()> {
    // The schema builds each replacement before the store opens; the
    // durations were measured at 10 M events.
    for (old, replacement, took) in [
        ("events_trace", "events_trace_own", "25 s"),
        ("events_trace_kind", "events_trace_own", "25 s"),
        ("events_agents", "events_agent_actors", "14 s"),
    ] {
        if in_schema(conn, old)? {
            tracing::info!(
                "replacing index {old} with {replacement}: once, about {took} per 10 M events"
            );
        }
    }
    // The search index moved to a database of its own (`search`), which
    // builds itself from the events.
    for table in ["events_fts", "search_queue"] {
        if in_schema(conn, table)? {
            tracing::info!("dropping {table}: search is indexed in search.db now");
            conn.execute_batch(&format!("DROP TABLE {table}"))?;
        }
    }
    conn.execute_batch(SCHEMA)?;
    backfill_rollups(conn)?;
    let current: Option<i64> =
        conn.query_row("SELECT max(version) FROM schema_version", [], |r| r.get(0))?;
    if current.is_none() {
        conn.execute(
            "INSERT INTO schema_version (version, applied_at) VALUES (?1, ?2)",
            params![SCHEMA_VERSION, crate::now_ms()],
        )?;
    }
    Ok(())
}

/// Fills a rollup added to the schema after events were stored, once (a
/// new store has nothing to fill: instant). At 10 M events `event_actors`
/// takes about a minute, during which the store does not open.
fn backfill_rollups(conn: &Connection) -> rusqlite::Result<()> {
    let done: Option<i64> = conn
        .query_row("SELECT built_at FROM rollup_backfills WHERE name = 'event_actors'", [], |r| {
            r.get(0)
        })
        .optional()?;
    if done.is_some() {
        return Ok(());
    }
    let started = std::time::Instant::now();
    // Per business from the events, then all businesses ('') from those.
    conn.execute_batch(
        "BEGIN IMMEDIATE;
         INSERT INTO event_actors (workspace_id, event, business_id, actor_id, first_ts, last_ts)
         SELECT workspace_id, event, business_id, actor_id, min(ts), max(ts) FROM events
         WHERE actor_id IS NOT NULL GROUP BY workspace_id, event, business_id, actor_id
         ON CONFLICT DO UPDATE SET first_ts = min(first_ts, excluded.first_ts),
            last_ts = max(last_ts, excluded.last_ts);
         INSERT INTO event_actors (workspace_id, event, business_id, actor_id, first_ts, last_ts)
         SELECT workspace_id, event, '', actor_id, min(first_ts), max(last_ts) FROM event_actors
         WHERE business_id <> '' GROUP BY workspace_id, event, actor_id
         ON CONFLICT DO UPDATE SET first_ts = min(first_ts, excluded.first_ts),
            last_ts = max(last_ts, excluded.last_ts);",
    )?;
    let marked = conn.execute(
        "INSERT INTO rollup_backfills (name, built_at) VALUES ('event_actors', ?1)",
        [crate::now_ms()],
    );
    match marked.and_then(|_| conn.execute_batch("COMMIT")) {
        Ok(()) => {
            tracing::info!(took_ms = started.elapsed().as_millis() as u64, "event_actors filled");
            Ok(())
        }
        Err(e) => {
            let _ = conn.execute_batch("ROLLBACK");
            Err(e)
        }
    }
}

/// How often the writer deletes expired idempotency keys, and how many at
/// most per transaction (milliseconds of writer time).
const PURGE_EVERY: Duration = Duration::from_secs(60);
const PURGE_BATCH: usize = 5000;

/// How often the writer refreshes the planner's statistics between groups.
const OPTIMIZE_EVERY: Duration = Duration::from_secs(3600);

/// The writer thread's connection and what it tells the rest of the store.
struct Writer {
    conn: Connection,
    /// Extra wait to gather concurrent writes into one transaction.
    window: Duration,
    /// Nudges the checkpointer after each commit.
    checkpoint: mpsc::SyncSender<()>,
    /// Answers each group once its commit is on disk, and then nudges the
    /// search indexer.
    sync: wal_sync::WalSync,
    wal: WalBound,
}

/// The log file, the size past which the writer checkpoints, and whether
/// the last such checkpoint failed (logged once, not at every group).
struct WalBound {
    path: PathBuf,
    limit: u64,
    failing: std::cell::Cell<bool>,
}

impl Writer {
    fn run(self, rx: mpsc::Receiver<Command>) {
        let mut optimized = std::time::Instant::now();
        // None: due after the first group.
        let mut purged: Option<std::time::Instant> = None;
        loop {
            let Ok(first) = rx.recv() else { return };
            let mut jobs = Vec::new();
            let mut closing = None;
            match first {
                Command::Write(job, _place) => jobs.push(job),
                Command::Close(done) => closing = Some(done),
            }
            if closing.is_none() && !self.window.is_zero() {
                std::thread::sleep(self.window);
            }
            while closing.is_none() && jobs.len() < MAX_GROUP {
                match rx.try_recv() {
                    Ok(Command::Write(job, _place)) => jobs.push(job),
                    Ok(Command::Close(done)) => closing = Some(done),
                    Err(_) => break,
                }
            }
            if !jobs.is_empty() {
                self.group(jobs);
            }
            if purged.is_none_or(|at| at.elapsed() >= PURGE_EVERY) {
                // A full batch means more may be waiting: again after the
                // next group, so a backlog drains between groups.
                purged = match self.purge_expired_keys() {
                    Some(deleted) if deleted >= PURGE_BATCH => None,
                    _ => Some(std::time::Instant::now()),
                };
            }
            if optimized.elapsed() >= OPTIMIZE_EVERY {
                // Sampled (SQLite bounds the rows it reads), so milliseconds
                // of writer time per hour.
                if let Err(e) = self.conn.execute_batch("PRAGMA optimize = 0x10002") {
                    tracing::warn!(error = %e, "optimize failed");
                }
                optimized = std::time::Instant::now();
            }
            if let Some(done) = closing {
                let Writer { conn, sync, .. } = self;
                sync.stop();
                if let Err(e) = conn.pragma_update(None, "wal_checkpoint", "TRUNCATE") {
                    tracing::warn!(error = %e, "checkpoint on close failed");
                }
                let _ = done.send(());
                return;
            }
        }
    }

    /// One transaction for the whole group, one savepoint per job after
    /// the first; the actor bounds the jobs queued are written once, at the end
    /// ([`events::flush_pending`]).
    fn group(&self, jobs: Vec<Job>) {
        let conn = &self.conn;
        if let Err(e) = conn.execute_batch("BEGIN IMMEDIATE") {
            tracing::error!(error = %e, "store transaction could not begin");
            for job in jobs {
                let (_, reply) = job(None);
                reply(Ok(()));
            }
            return;
        }
        let mut replies = Vec::with_capacity(jobs.len());
        let mut jobs = jobs.into_iter();
        // The first job runs without a savepoint: when it fails, rolling
        // the transaction back undoes it and nothing else. A savepoint
        // makes SQLite copy every page the job changes into a statement
        // journal first, which for a group of one (a gateway's batch of
        // thousands of events) is a copy of every page the batch touches.
        if let Some(job) = jobs.next() {
            let (ok, reply) = job(Some(conn));
            let ended = conn.is_autocommit();
            if ended {
                tracing::error!("SQLite rolled the transaction back; the request is refused");
                reply(Err(Error::Unavailable { retry_after_secs: 5 }));
            } else if ok {
                replies.push(reply);
            } else {
                // Its answer is its own error, whatever happens next.
                reply(Ok(()));
            }
            if ended || !ok {
                let rolled_back = if ended { Ok(()) } else { conn.execute_batch("ROLLBACK") };
                if let Err(e) = rolled_back.and_then(|()| conn.execute_batch("BEGIN IMMEDIATE")) {
                    tracing::error!(error = %e, "store transaction could not begin again");
                    refuse(replies, jobs);
                    return;
                }
            }
        }
        while let Some(job) = jobs.next() {
            if let Err(e) = run_cached(conn, "SAVEPOINT job") {
                tracing::error!(error = %e, "savepoint failed");
            }
            let (ok, reply) = job(Some(conn));
            replies.push(reply);
            if conn.is_autocommit() {
                // SQLite ends the whole transaction itself on a full disk or
                // an I/O error: the jobs before this one are undone too, and
                // the rest must not run outside a transaction, where each
                // would be stored while the group's failed commit said not.
                tracing::error!(
                    "SQLite rolled the group's transaction back; its requests are refused"
                );
                refuse(replies, jobs);
                return;
            }
            let ended = if ok {
                run_cached(conn, "RELEASE job")
            } else {
                run_cached(conn, "ROLLBACK TO job").and_then(|()| run_cached(conn, "RELEASE job"))
            };
            if let Err(e) = ended {
                tracing::error!(error = %e, "savepoint end failed");
            }
        }
        let committed = events::flush_pending(conn).and_then(|()| conn.execute_batch("COMMIT"));
        if let Err(e) = &committed {
            tracing::error!(error = %e, "commit failed; the group is rolled back");
            let _ = conn.execute_batch("ROLLBACK");
        }
        // Full means a nudge is already pending.
        let _ = self.checkpoint.try_send(());
        self.sync.answer(replies, &committed);
        // After handing the replies on: only the next group waits for it.
        self.bound_wal();
    }

    /// Deletes a batch of expired idempotency keys in a transaction of its
    /// own; `None` when it failed (logged).
    fn purge_expired_keys(&self) -> Option<usize> {
        let deleted = in_transaction(&self.conn, |conn| {
            events::purge_expired_keys(conn, crate::now_ms(), PURGE_BATCH as i64).map_err(sql)
        });
        match deleted {
            Ok(deleted) => Some(deleted),
            Err(e) => {
                tracing::warn!(error = %e, "deleting expired idempotency keys failed");
                None
            }
        }
    }

    /// Checkpoints when the log file has outgrown its limit (see
    /// [`DEFAULT_WAL_LIMIT`]). No commit can come in between, so unless the
    /// checkpointer is busy copying (then the next group tries again) or a
    /// reader still needs old pages, the whole log is copied and the next
    /// transaction writes from the log's start; when the log restarts,
    /// `journal_size_limit` cuts the file back to the limit.
    fn bound_wal(&self) {
        let wal = &self.wal;
        if std::fs::metadata(&wal.path).map_or(true, |m| m.len() <= wal.limit) {
            return;
        }
        match self.conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())) {
            Ok(()) => wal.failing.set(false),
            Err(e) => {
                if !wal.failing.replace(true) {
                    tracing::warn!(error = %e, "WAL checkpoint on the writer failed; retrying");
                }
            }
        }
    }
}

/// Answers the jobs of a group that stored nothing, those run (`replies`)
/// and those not (`rest`), with an error that invites a retry.
fn refuse(replies: Vec<Reply>, rest: impl Iterator<Item = Job>) {
    for reply in replies.into_iter().chain(rest.map(|job| job(None).1)) {
        reply(Err(Error::Unavailable { retry_after_secs: 5 }));
    }
}

/// Runs a statement through the connection's statement cache: the
/// savepoint statements run several times per transaction.
fn run_cached(conn: &Connection, statement: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(statement)?.execute([]).map(drop)
}

/// Disk full and I/O errors are worth a retry later; the rest is a bug.
fn classify_ref(e: &rusqlite::Error) -> Error {
    use rusqlite::ffi::ErrorCode;
    match e.sqlite_error_code() {
        Some(ErrorCode::DiskFull | ErrorCode::SystemIoFailure | ErrorCode::DatabaseBusy) => {
            Error::Unavailable { retry_after_secs: 5 }
        }
        _ => Error::internal(e),
    }
}

fn sql(e: rusqlite::Error) -> Error {
    classify_ref(&e)
}

fn scopes_to_text(scopes: &[Scope]) -> String {
    scopes.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(" ")
}

fn scopes_from_text(text: &str) -> Vec<Scope> {
    text.split_whitespace().filter_map(Scope::parse).collect()
}

fn key_from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<ApiKeyRecord> {
    Ok(ApiKeyRecord {
        id: row.get(0)?,
        workspace_id: row.get(1)?,
        name: row.get(2)?,
        hint: row.get(3)?,
        scopes: scopes_from_text(&row.get::<_, String>(4)?),
        created_at: row.get(5)?,
        revoked_at: row.get(6)?,
    })
}

const KEY_COLUMNS: &str = "id, workspace_id, name, hint, scopes, created_at, revoked_at";

#[async_trait]
impl Store for EmbeddedStore {
    async fn ping(&self) -> Result<()> {
        self.read(|conn| conn.query_row("SELECT 1", [], |_| Ok(())).map_err(sql)).await
    }

    /// How far the search index trails the events, and whether it is
    /// failing: it is written beside the store, so a full disk or a
    /// backlog shows here before a search has to wait for it.
    async fn health_detail(&self) -> serde_json::Value {
        let target = self.read(|conn| search::target(conn).map_err(sql)).await;
        let at = self.search.progress();
        serde_json::json!({"searchIndex": {
            "indexedSeq": at.seq,
            "behind": target.map_or(serde_json::Value::Null, |t| (t.seq - at.seq).max(0).into()),
            "failedAttempts": self.search.failures(),
        }})
    }

    async fn create_workspace(&self, workspace: &Workspace) -> Result<()> {
        let ws = workspace.clone();
        self.write(move |conn| {
            let inserted = conn
                .execute(
                    "INSERT INTO workspaces (id, name, created_at) VALUES (?1, ?2, ?3)
                     ON CONFLICT (id) DO NOTHING",
                    params![ws.id, ws.name, ws.created_at],
                )
                .map_err(sql)?;
            if inserted == 0 {
                return Err(Error::Conflict(format!("workspace {} exists", ws.id)));
            }
            conn.execute(
                "INSERT INTO businesses (workspace_id, id, name, created_at)
                 VALUES (?1, 'default', ?2, ?3) ON CONFLICT DO NOTHING",
                params![ws.id, ws.name, ws.created_at],
            )
            .map_err(sql)?;
            Ok(())
        })
        .await
    }

    async fn workspace_exists(&self, workspace_id: &str) -> Result<bool> {
        let id = workspace_id.to_owned();
        self.read(move |conn| {
            conn.query_row("SELECT 1 FROM workspaces WHERE id = ?1", [id], |_| Ok(()))
                .optional()
                .map(|found| found.is_some())
                .map_err(sql)
        })
        .await
    }

    async fn count_workspaces(&self) -> Result<u64> {
        self.read(|conn| {
            conn.query_row("SELECT count(*) FROM workspaces", [], |r| r.get::<_, i64>(0))
                .map(|n| n.max(0) as u64)
                .map_err(sql)
        })
        .await
    }

    async fn insert_api_key(&self, key: NewApiKey) -> Result<ApiKeyRecord> {
        self.write(move |conn| {
            let r = &key.record;
            conn.execute(
                "INSERT INTO api_keys (id, workspace_id, name, key_hash, hint, scopes, created_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) ON CONFLICT (key_hash) DO NOTHING",
                params![
                    r.id,
                    r.workspace_id,
                    r.name,
                    key.hash,
                    r.hint,
                    scopes_to_text(&r.scopes),
                    r.created_at
                ],
            )
            .map_err(sql)?;
            conn.query_row(
                &format!("SELECT {KEY_COLUMNS} FROM api_keys WHERE key_hash = ?1"),
                [&key.hash],
                key_from_row,
            )
            .map_err(sql)
        })
        .await
    }

    async fn find_api_key(&self, hash: &str) -> Result<Option<ApiKeyRecord>> {
        let hash = hash.to_owned();
        self.read(move |conn| {
            conn.query_row(
                &format!(
                    "SELECT {KEY_COLUMNS} FROM api_keys WHERE key_hash = ?1 AND revoked_at IS NULL"
                ),
                [hash],
                key_from_row,
            )
            .optional()
            .map_err(sql)
        })
        .await
    }

    async fn list_api_keys(&self, workspace_id: &str, limit: usize) -> Result<Vec<ApiKeyRecord>> {
        let ws = workspace_id.to_owned();
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.read(move |conn| {
            let mut stmt = conn
                .prepare(&format!(
                    "SELECT {KEY_COLUMNS} FROM api_keys WHERE workspace_id = ?1
                     ORDER BY created_at, id LIMIT ?2"
                ))
                .map_err(sql)?;
            let rows = stmt.query_map(params![ws, limit], key_from_row).map_err(sql)?;
            rows.collect::<rusqlite::Result<Vec<_>>>().map_err(sql)
        })
        .await
    }

    async fn revoke_api_key(&self, workspace_id: &str, key_id: &str) -> Result<bool> {
        let (ws, id) = (workspace_id.to_owned(), key_id.to_owned());
        self.write(move |conn| {
            let found: Option<Option<i64>> = conn
                .query_row(
                    "SELECT revoked_at FROM api_keys WHERE workspace_id = ?1 AND id = ?2",
                    params![ws, id],
                    |r| r.get(0),
                )
                .optional()
                .map_err(sql)?;
            match found {
                None => Ok(false),
                Some(Some(_)) => Ok(true),
                Some(None) => {
                    conn.execute(
                        "UPDATE api_keys SET revoked_at = ?3 WHERE workspace_id = ?1 AND id = ?2",
                        params![ws, id, crate::now_ms()],
                    )
                    .map_err(sql)?;
                    Ok(true)
                }
            }
        })
        .await
    }

    async fn append_events(
        &self,
        workspace_id: &str,
        request: AppendRequest,
    ) -> Result<AppendResult> {
        let ws = workspace_id.to_owned();
        let rows = prepare_events(request.events);
        let (key, limit) = (request.idempotency_key, request.new_event_limit);
        let hints = self.search.hints();
        self.write(move |conn| {
            let appended = events::append(conn, &ws, rows.0, key.as_ref(), Some(&hints))?;
            // An error rolls the job back: nothing of it stays.
            if limit.is_some_and(|left| appended.inserted as u64 > left) {
                return Err(crate::usage::quota_exceeded());
            }
            Ok(appended)
        })
        .await
    }

    async fn claim_idempotency_key(
        &self,
        workspace_id: &str,
        key: &super::IdempotencyKey,
    ) -> Result<()> {
        let (ws, key) = (workspace_id.to_owned(), key.clone());
        self.write(move |conn| events::claim_key(conn, &ws, &key)).await
    }

    async fn list_events(
        &self,
        workspace_id: &str,
        filter: &EventFilter,
    ) -> Result<Vec<StoredEvent>> {
        let ws = workspace_id.to_owned();
        let filter = filter.clone();
        self.read(move |conn| events::list(conn, &ws, &filter)).await
    }

    async fn record_api_calls(&self, workspace_id: &str, day_ms: i64, calls: u64) -> Result<()> {
        let ws = workspace_id.to_owned();
        let day = day_ms.div_euclid(events::DAY_MS);
        self.write(move |conn| {
            conn.execute(
                "INSERT INTO usage_daily (workspace_id, day, api_calls) VALUES (?1, ?2, ?3)
                 ON CONFLICT (workspace_id, day) DO UPDATE SET api_calls = api_calls + ?3",
                params![ws, day, i64::try_from(calls).unwrap_or(i64::MAX)],
            )
            .map_err(sql)?;
            Ok(())
        })
        .await
    }

    async fn usage(&self, workspace_id: &str, from_ms: i64, to_ms: i64) -> Result<UsageTotals> {
        let ws = workspace_id.to_owned();
        let (from_day, to_day) =
            (from_ms.div_euclid(events::DAY_MS), to_ms.div_euclid(events::DAY_MS));
        self.read(move |conn| {
            conn.query_row(
                "SELECT coalesce(sum(events_ingested), 0), coalesce(sum(api_calls), 0)
                 FROM usage_daily WHERE workspace_id = ?1 AND day >= ?2 AND day <= ?3",
                params![ws, from_day, to_day],
                |r| {
                    Ok(UsageTotals {
                        events_ingested: r.get::<_, i64>(0)?.max(0) as u64,
                        api_calls: r.get::<_, i64>(1)?.max(0) as u64,
                    })
                },
            )
            .map_err(sql)
        })
        .await
    }

    async fn close(&self) -> Result<()> {
        let sender = self.writer.lock().map_err(|_| Error::internal("poisoned"))?.take();
        if let Some(sender) = sender {
            let (tx, rx) = oneshot::channel();
            if sender.send(Command::Close(tx)).is_ok() {
                let _ = rx.await;
            }
        }
        self.search.stop().await;
        Ok(())
    }
}

/// A store in a temporary directory that lives as long as the store is
/// used: what the store's tests open.
#[cfg(test)]
pub(crate) fn temp_store() -> (EmbeddedStore, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = EmbeddedStore::open(dir.path(), EmbeddedOptions::default()).expect("open store");
    (store, dir)
}

/// A job that holds the store's writer until [`Held::release`]: what is
/// written meanwhile queues behind it, and forms the next group.
#[cfg(test)]
struct Held {
    task: tokio::task::JoinHandle<Result<()>>,
    release: mpsc::Sender<()>,
}

/// Starts a job that runs `then` once released, and returns once the
/// writer runs it (its own group already formed).
#[cfg(test)]
async fn hold_writer(
    store: &Arc<EmbeddedStore>,
    then: impl FnOnce(&Connection) -> Result<()> + Send + 'static,
) -> Held {
    let (started, is_started) = oneshot::channel();
    let (release, released) = mpsc::channel::<()>();
    let task = tokio::spawn({
        let store = Arc::clone(store);
        async move {
            store
                .write(move |conn| {
                    let _ = started.send(());
                    let _ = released.recv();
                    then(conn)
                })
                .await
        }
    });
    is_started.await.expect("the writer runs the holding job");
    Held { task, release }
}

#[cfg(test)]
impl Held {
    /// Lets the holding job finish, and waits for it.
    async fn release(self) {
        self.release.send(()).expect("release the writer");
        self.task.await.expect("holding task").expect("holding job");
    }
}

/// An event named `name`, received now: what the store's tests append.
#[cfg(test)]
fn test_event(name: &str) -> NewEvent {
    NewEvent {
        id: crate::ids::new_id("evt"),
        received_at: crate::now_ms(),
        event: opgraph_proto::Event::named(name),
    }
}

#[cfg(test)]
mod conformance {
    use super::EmbeddedStore;

    /// A fresh store in a temporary directory that lives as long as it.
    async fn open() -> (EmbeddedStore, tempfile::TempDir) {
        super::temp_store()
    }

    crate::store_conformance!(open);
}

#[cfg(test)]
mod search_index {
    use std::time::Duration;

    use super::{EmbeddedOptions, EmbeddedStore, Error, search, test_event as event};
    use crate::store::queries::{QueryStore, SearchQuery};
    use crate::store::{AppendRequest, Store};

    fn query(text: &str) -> SearchQuery {
        SearchQuery { text: text.into(), range: None, event: None, business_id: None, limit: 10 }
    }

    fn events_named(name: &str, n: usize) -> AppendRequest {
        let events = (0..n).map(|_| event(name)).collect();
        AppendRequest { events, idempotency_key: None, new_event_limit: None }
    }

    /// `name` events, one per value, each with the value as property `key`.
    fn events_with(name: &str, key: &str, values: &[&str]) -> AppendRequest {
        let events = values
            .iter()
            .map(|value| {
                let mut e = event(name);
                let property = (key.to_owned(), serde_json::Value::from(*value));
                e.event.properties = Some([property].into_iter().collect());
                e
            })
            .collect();
        AppendRequest { events, idempotency_key: None, new_event_limit: None }
    }

    /// Entries in the index matching `text`, read without waiting for it.
    async fn indexed(store: &EmbeddedStore, text: &'static str) -> i64 {
        store
            .read(move |conn| search::entries_covering(conn, text).map_err(Error::internal))
            .await
            .expect("read the index")
    }

    /// Makes every index transaction fail, as a full disk would, until
    /// [`unstick`] (the trigger lives in the index's own file).
    fn stick(dir: &std::path::Path) {
        let conn = rusqlite::Connection::open(dir.join(search::SEARCH_FILE)).expect("open index");
        conn.pragma_update(None, "busy_timeout", 5000).expect("busy timeout");
        conn.execute_batch(
            "CREATE TRIGGER stuck BEFORE UPDATE ON progress
             BEGIN SELECT RAISE(ABORT, 'disk full'); END;",
        )
        .expect("make the index stick");
    }

    fn unstick(dir: &std::path::Path) {
        let conn = rusqlite::Connection::open(dir.join(search::SEARCH_FILE)).expect("open index");
        conn.pragma_update(None, "busy_timeout", 5000).expect("busy timeout");
        conn.execute_batch("DROP TRIGGER stuck").expect("unstick the index");
    }

    #[tokio::test]
    async fn a_search_right_after_an_acknowledgement_finds_every_event() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let store = EmbeddedStore::open(dir.path(), EmbeddedOptions::default()).expect("open");
        // More than one index transaction's worth: a search that did not
        // wait for the index would see a part of them.
        store.append_events("ws", events_named("tote.scanned", 5000)).await.expect("append");
        let found = store.search_events("ws", &query("tote")).await.expect("search");
        assert_eq!(found.total, 5000);
        store.close().await.expect("close");
    }

    /// The index reads an event's text back from its columns and stored
    /// envelope: name, actor and object type and id, property values.
    #[tokio::test]
    async fn every_part_of_the_searchable_text_is_found() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let store = EmbeddedStore::open(dir.path(), EmbeddedOptions::default()).expect("open");
        let envelope = serde_json::json!({
            "event": "portal.scan", "actor": {"type": "rfid_reader", "id": "dock-7", "x": "hidden"},
            "object": "tote-991", "context": {"note": "not searchable"},
            "properties": {"epc": "3034F8", "tags": [{"lot": "LOT-55"}], "rssi": -61},
        });
        let event = opgraph_proto::Event::parse_json(&envelope).expect("envelope");
        let new =
            crate::store::NewEvent { id: "evt_1".into(), received_at: crate::now_ms(), event };
        let request =
            AppendRequest { events: vec![new], idempotency_key: None, new_event_limit: None };
        store.append_events("ws", request).await.expect("append");
        for (text, found) in [
            ("portal.sc", 1),
            ("rfid_rea", 1),
            ("dock-7", 1),
            ("tote-99", 1),
            ("3034f8", 1),
            ("lot-55", 1),
            ("-61", 1),
            ("hidden", 0),
            ("not searchable", 0),
        ] {
            let total = store.search_events("ws", &query(text)).await.expect("search").total;
            assert_eq!(total, found, "{text}");
        }
    }

    #[tokio::test]
    async fn a_store_written_without_its_index_is_indexed_on_open() {
        let dir = tempfile::tempdir().expect("temporary directory");
        {
            // A tool (or a cloud killed before its indexer ran) committed
            // events the index never saw.
            let conn = super::open_writer_connection(dir.path()).expect("open");
            let rows = super::prepare_events(vec![event("pallet.wrapped")]);
            super::append_in_transaction(&conn, "ws", rows, None).expect("append");
        }
        let store = EmbeddedStore::open(dir.path(), EmbeddedOptions::default()).expect("reopen");
        let found = store.search_events("ws", &query("wrapped")).await.expect("search");
        assert_eq!(found.total, 1);
    }

    #[test]
    fn a_tool_builds_the_index_of_the_store_it_wrote() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let conn = super::open_writer_connection(dir.path()).expect("open");
        let rows = super::prepare_events((0..5000).map(|_| event("crate.counted")).collect());
        super::append_in_transaction(&conn, "ws", rows, None).expect("append");
        assert_eq!(super::build_search_index(&conn, |_| ()).expect("build"), 5000);
        assert_eq!(super::build_search_index(&conn, |_| ()).expect("again"), 0, "nothing left");
    }

    #[tokio::test]
    async fn an_index_ahead_of_its_events_is_rebuilt() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let store = EmbeddedStore::open(dir.path(), EmbeddedOptions::default()).expect("open");
        store.append_events("ws", events_named("bin.emptied", 3)).await.expect("append");
        assert_eq!(store.search_events("ws", &query("bin")).await.unwrap().total, 3);
        store.close().await.expect("close");
        drop(store);
        // As if the events were restored from an older backup: the index
        // claims more than the store holds, and seqs will be reused.
        let index =
            rusqlite::Connection::open(dir.path().join(search::SEARCH_FILE)).expect("open index");
        index.execute("UPDATE progress SET seq = 1000", []).expect("advance");
        drop(index);
        let conn = super::open_writer_connection(dir.path()).expect("open");
        conn.execute("DELETE FROM events", []).expect("restore an empty backup");
        drop(conn);
        let store = EmbeddedStore::open(dir.path(), EmbeddedOptions::default()).expect("reopen");
        store.append_events("ws", events_named("tote.moved", 2)).await.expect("append");
        assert_eq!(store.search_events("ws", &query("bin")).await.unwrap().total, 0);
        assert_eq!(store.search_events("ws", &query("tote")).await.unwrap().total, 2);
    }

    /// A store holding three `crate.sealed` events, closed cleanly.
    async fn three_sealed_crates_closed() -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("temporary directory");
        let store = EmbeddedStore::open(dir.path(), EmbeddedOptions::default()).expect("open");
        store.append_events("ws", events_named("crate.sealed", 3)).await.expect("append");
        store.close().await.expect("close");
        dir
    }

    #[tokio::test]
    async fn a_damaged_index_is_rebuilt_and_the_store_opens() {
        let dir = three_sealed_crates_closed().await;
        // Closed cleanly: the index's log is folded into its file and gone.
        let index = dir.path().join(search::SEARCH_FILE);
        assert!(!dir.path().join(format!("{}-wal", search::SEARCH_FILE)).exists());
        std::fs::write(&index, vec![0x5a_u8; 64 * 1024]).expect("damage the index");
        let store = EmbeddedStore::open(dir.path(), EmbeddedOptions::default()).expect("reopen");
        assert_eq!(store.search_events("ws", &query("sealed")).await.unwrap().total, 3);
    }

    #[tokio::test]
    async fn a_needle_is_found_whole_not_as_scattered_trigrams() {
        let (store, _dir) = super::temp_store();
        // Each holds every trigram of "abcabc" (abc, bca, cab); only the
        // last two hold it whole, one in another case.
        let codes = ["abc-bca-cab", "abcab", "xxABCabcxx", "abcabc"];
        let request = events_with("probe.sent", "code", &codes);
        store.append_events("ws", request).await.expect("append");
        for needle in ["abcabc", "ABCABC", "cAbC"] {
            let found = store.search_events("ws", &query(needle)).await.unwrap();
            let mut codes: Vec<_> = found
                .events
                .iter()
                .map(|e| e.envelope["properties"]["code"].as_str().unwrap_or("").to_owned())
                .collect();
            codes.sort();
            assert_eq!(
                (found.total, codes),
                (2, vec!["abcabc".to_owned(), "xxABCabcxx".to_owned()]),
                "{needle}"
            );
        }
        assert_eq!(store.search_events("ws", &query("abc-bca")).await.unwrap().total, 1);
        // Shorter than a trigram: read for, not looked up.
        assert_eq!(store.search_events("ws", &query("aB")).await.unwrap().total, 4);
    }

    #[tokio::test]
    async fn a_walked_search_and_a_sorted_one_give_the_same_answer() {
        use super::queries::{SearchPlan, search_planned};
        use crate::store::queries::Range;
        let (store, _dir) = super::temp_store();
        // Times out of `seq` order and tied; every code holds "robot".
        let t0 = 1_700_000_000_000_i64;
        let events: Vec<_> = (0..60_i64)
            .map(|i| {
                let mut e = event(if i % 3 == 0 { "robot.moved" } else { "tag.read" });
                e.event.timestamp = Some(t0 + (i * 7919) % 23 * 1000);
                e.event.business_id = Some(if i % 2 == 0 { "north" } else { "south" }.into());
                let props = serde_json::json!({ "code": format!("R{:02}-robot", i % 7), "n": i });
                e.event.properties = props.as_object().cloned();
                e
            })
            .collect();
        // Newest first, ties by `seq` (the order of appending), as answered.
        let mut newest: Vec<_> =
            events.iter().enumerate().map(|(i, e)| (e.event.timestamp, i, e.id.clone())).collect();
        newest.sort_by_key(|(ts, i, _)| std::cmp::Reverse((*ts, *i)));
        let newest: Vec<String> = newest.into_iter().take(10).map(|(_, _, id)| id).collect();
        store
            .append_events(
                "ws",
                AppendRequest { events, idempotency_key: None, new_event_limit: None },
            )
            .await
            .unwrap();
        store.append_events("other", events_named("robot.moved", 5)).await.unwrap();
        store.wait_for_search_index().await.unwrap();

        let plans = [
            ("sorted", SearchPlan { probe: i64::MAX, walk: u64::MAX, scan: 0 }),
            ("walked", SearchPlan { probe: 1, walk: u64::MAX, scan: 0 }),
            ("walk given up", SearchPlan { probe: 1, walk: 3, scan: 0 }),
        ];
        let range = Range { from: t0 + 5_000, to: t0 + 12_000 };
        let queries = [
            query("robot"),
            query("ROBOT"),
            query("r03-rob"),
            query("tag.read"),
            SearchQuery { event: Some("tag.read".into()), ..query("robot") },
            SearchQuery { business_id: Some("north".into()), limit: 4, ..query("robot") },
            SearchQuery { range: Some(range), limit: 3, ..query("robot") },
            query("nowhere"),
        ];
        for q in queries {
            let mut answers = Vec::new();
            for (name, plan) in plans {
                let q = q.clone();
                let found = store
                    .read(move |conn| search_planned(conn, "ws", &q, plan))
                    .await
                    .expect("search");
                let ids: Vec<String> = found.events.into_iter().map(|e| e.id).collect();
                answers.push((name, ids, found.total));
            }
            for answer in &answers[1..] {
                assert_eq!(
                    (&answer.1, answer.2),
                    (&answers[0].1, answers[0].2),
                    "{} {q:?}",
                    answer.0
                );
            }
            if q.text == "robot"
                && q.event.is_none()
                && q.business_id.is_none()
                && q.range.is_none()
            {
                assert_eq!((&answers[0].1, answers[0].2), (&newest, 60));
            }
        }

        // A needle shorter than a trigram is checked in the newest events,
        // and finds what a longer one that means the same finds.
        let search = |q: SearchQuery, scan| {
            let plan = SearchPlan { probe: 1, walk: 1, scan };
            store.read(move |conn| search_planned(conn, "ws", &q, plan))
        };
        let ids = |r: &crate::store::queries::SearchResult| -> Vec<String> {
            r.events.iter().map(|e| e.id.clone()).collect()
        };
        let long = search(query("r03-rob"), 0).await.expect("search");
        let short = search(query("03"), u64::MAX).await.expect("search");
        assert_eq!((ids(&short), short.total, short.total_capped), (ids(&long), 9, false));
        // Also through the indexes of an event name and of a business.
        let by_event = |text| SearchQuery { event: Some("tag.read".into()), ..query(text) };
        let by_business = |text| SearchQuery { business_id: Some("north".into()), ..query(text) };
        for (long, short) in
            [(by_event("r03-rob"), by_event("03")), (by_business("r03-rob"), by_business("03"))]
        {
            let long = search(long, 0).await.expect("search");
            let short = search(short, u64::MAX).await.expect("search");
            assert!(long.total > 0);
            assert_eq!((ids(&short), short.total), (ids(&long), long.total));
        }
        // A read that stops at its budget answers the newest matches it
        // saw and says its count is a lower bound.
        let stopped = search(query("03"), 20).await.expect("search");
        assert!(stopped.total_capped, "stopped at its budget");
        assert!((1..9).contains(&stopped.total), "{}", stopped.total);
        assert_eq!(ids(&stopped), ids(&long)[..stopped.events.len()]);
    }

    #[test]
    fn a_needle_asks_the_index_for_trigrams_covering_it() {
        let expression =
            |text: &str| search::Needle::new(text).and_then(|n| n.expression().map(str::to_owned));
        assert_eq!(expression("ab"), None, "shorter than a trigram: read, not looked up");
        assert_eq!(expression("abc").as_deref(), Some(r#""abc""#));
        // Every third and the last, each once, quotes doubled.
        assert_eq!(expression("pallet-7").as_deref(), Some(r#""let" AND "pal" AND "t-7""#));
        assert_eq!(expression(r#"a"b"c"#).as_deref(), Some(r#""a""b" AND "b""c""#));
        assert_eq!(expression("abcabc").as_deref(), Some(r#""abc""#));
    }

    #[tokio::test]
    async fn an_index_of_an_older_layout_is_rebuilt() {
        let dir = three_sealed_crates_closed().await;
        // The layout before `detail = 'none'`, claiming every event indexed
        // while holding none of them.
        let path = dir.path().join(search::SEARCH_FILE);
        std::fs::remove_file(&path).expect("remove the index");
        let index = rusqlite::Connection::open(&path).expect("open index");
        index
            .execute_batch(
                "CREATE VIRTUAL TABLE events_fts USING fts5 (
                    body, content = '', contentless_delete = 1, tokenize = 'trigram');
                 CREATE TABLE progress (one INTEGER PRIMARY KEY, seq INTEGER, removed INTEGER);
                 INSERT INTO progress VALUES (1, 3, 0);",
            )
            .expect("the older index");
        drop(index);
        let store = EmbeddedStore::open(dir.path(), EmbeddedOptions::default()).expect("reopen");
        assert_eq!(store.search_events("ws", &query("sealed")).await.unwrap().total, 3);
        let made: String = store
            .read(|conn| {
                conn.query_row(
                    "SELECT sql FROM search.sqlite_master WHERE name = 'events_fts'",
                    [],
                    |r| r.get(0),
                )
                .map_err(Error::internal)
            })
            .await
            .expect("read the index's layout");
        assert!(made.contains("detail = 'none'"), "{made}");
    }

    #[tokio::test]
    async fn an_older_store_drops_its_inline_index_and_is_searchable() {
        let dir = tempfile::tempdir().expect("temporary directory");
        {
            let conn = super::open_writer_connection(dir.path()).expect("open");
            conn.execute_batch(
                "CREATE VIRTUAL TABLE events_fts USING fts5 (body, content = '',
                    contentless_delete = 1, tokenize = 'trigram');
                 CREATE TABLE search_queue (seq INTEGER PRIMARY KEY, body TEXT NOT NULL);",
            )
            .expect("the older store's tables");
            let rows = super::prepare_events(vec![event("pallet.kept")]);
            super::append_in_transaction(&conn, "ws", rows, None).expect("append");
        }
        let store = EmbeddedStore::open(dir.path(), EmbeddedOptions::default()).expect("reopen");
        let left: i64 = store
            .read(|conn| {
                conn.query_row(
                    "SELECT count(*) FROM main.sqlite_master
                     WHERE name IN ('events_fts', 'search_queue')",
                    [],
                    |r| r.get(0),
                )
                .map_err(Error::internal)
            })
            .await
            .expect("read the schema");
        assert_eq!(left, 0);
        assert_eq!(store.search_events("ws", &query("kept")).await.unwrap().total, 1);
    }

    #[tokio::test]
    async fn a_search_answers_when_the_index_cannot_be_written_and_catches_up_after() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let options = EmbeddedOptions {
            search_wait: Duration::from_millis(300),
            ..EmbeddedOptions::default()
        };
        let store = EmbeddedStore::open(dir.path(), options).expect("open");
        store.append_events("ws", events_named("pallet.indexed", 1)).await.unwrap();
        assert_eq!(store.search_events("ws", &query("pallet")).await.unwrap().total, 1);
        stick(dir.path());
        store.append_events("ws", events_named("pallet.waiting", 1)).await.unwrap();
        let found = store.search_events("ws", &query("pallet")).await.expect("an answer");
        assert_eq!(found.total, 1, "the indexed event, without the other");
        // Health shows it before anyone searches.
        let health = store.health_detail().await;
        assert_eq!(health["searchIndex"]["behind"], 1, "{health}");
        assert!(health["searchIndex"]["failedAttempts"].as_u64() > Some(0), "{health}");
        unstick(dir.path());
        // The indexer retries on its own (no nudge: nothing is written).
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while indexed(&store, "pallet").await < 2 {
            assert!(std::time::Instant::now() < deadline, "the index never caught up");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(store.search_events("ws", &query("waiting")).await.unwrap().total, 1);
        assert_eq!(store.health_detail().await["searchIndex"]["behind"], 0);
    }

    #[tokio::test]
    async fn attempts_to_write_a_stuck_index_back_off() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let store = EmbeddedStore::open(dir.path(), EmbeddedOptions::default()).expect("open");
        store.append_events("ws", events_named("crate.first", 1)).await.unwrap();
        assert_eq!(store.search_events("ws", &query("crate")).await.unwrap().total, 1);
        stick(dir.path());
        store.append_events("ws", events_named("crate.stuck", 1)).await.unwrap();
        // The passing time is what is under test: retrying every 200 ms
        // would be about 11 attempts; doubling waits (0.2, 0.4, 0.8 s...)
        // make at most 5.
        tokio::time::sleep(Duration::from_millis(2300)).await;
        let made = store.search.failures();
        assert!((1..=5).contains(&made), "{made} attempts in 2.3 s");
        assert_eq!(indexed(&store, "crate").await, 1, "not indexed, and not lost:");
        let filter = crate::store::EventFilter { limit: 10, ..Default::default() };
        assert_eq!(store.list_events("ws", &filter).await.unwrap().len(), 2);
    }
}

#[cfg(test)]
mod writer_groups {
    use std::sync::Arc;

    use super::{EmbeddedStore, Error, Held, hold_writer, temp_store};
    use crate::error::Result;

    fn insert(conn: &rusqlite::Connection, value: &str) -> Result<()> {
        conn.execute("INSERT INTO probe (v) VALUES (?1)", [value])
            .map(drop)
            .map_err(Error::internal)
    }

    /// A store with an empty table `probe` of values.
    async fn probe_store() -> (Arc<EmbeddedStore>, tempfile::TempDir) {
        let (store, dir) = temp_store();
        store
            .write(|conn| {
                conn.execute_batch("CREATE TABLE probe (v TEXT)").map_err(Error::internal)
            })
            .await
            .expect("table");
        (Arc::new(store), dir)
    }

    /// Holds the writer with a job that stores "held" once released.
    async fn hold(store: &Arc<EmbeddedStore>) -> Held {
        hold_writer(store, |conn| insert(conn, "held")).await
    }

    /// The values in `probe`, sorted.
    async fn stored(store: &EmbeddedStore) -> Vec<String> {
        store
            .read(|conn| {
                let mut stmt =
                    conn.prepare("SELECT v FROM probe ORDER BY v").map_err(Error::internal)?;
                let rows = stmt.query_map([], |r| r.get(0)).map_err(Error::internal)?;
                rows.collect::<rusqlite::Result<_>>().map_err(Error::internal)
            })
            .await
            .expect("read back")
    }

    /// Writes `value`, then fails: none of it may stay.
    async fn fail_after_writing(store: &EmbeddedStore, value: &'static str) -> Result<()> {
        store
            .write(move |conn| {
                insert(conn, value)?;
                Err(Error::validation("probe", "refused after writing"))
            })
            .await
    }

    /// The first job of a group runs without a savepoint and the rest in
    /// one each: a failing job leaves nothing behind in either place, and
    /// its neighbours are committed.
    #[tokio::test]
    async fn a_failing_job_takes_back_its_own_writes_first_in_its_group_or_not() {
        let (store, _dir) = probe_store().await;
        // Alone in its group, so first.
        assert!(fail_after_writing(&store, "alone").await.is_err());
        // A job holds the writer, its group already formed, while the next
        // group queues behind it: failing, fine, failing, fine. `join!`
        // polls them, so queues them, in that order before the release.
        let held = hold(&store).await;
        let fine = |value: &'static str| store.write(move |conn| insert(conn, value));
        let (first, second, third, fourth, ()) = tokio::join!(
            fail_after_writing(&store, "first"),
            fine("second"),
            fail_after_writing(&store, "third"),
            fine("fourth"),
            held.release(),
        );
        assert!(first.is_err() && third.is_err(), "{first:?} {third:?}");
        second.expect("second");
        fourth.expect("fourth");
        // The writer carries on after a first job's rollback.
        store.write(|conn| insert(conn, "after")).await.expect("after");
        assert_eq!(stored(&store).await, ["after", "fourth", "held", "second"]);
    }

    /// On a full database (or an I/O error) SQLite rolls the whole
    /// transaction back itself, not only the failing statement: every
    /// answer must then match what is stored, and the writer go on.
    #[tokio::test]
    async fn a_transaction_sqlite_ends_itself_is_answered_as_it_was_stored() {
        let (store, _dir) = probe_store().await;
        store
            .write(|conn| {
                // Full: the database may not grow past its size now.
                let pages: i64 = conn
                    .query_row("PRAGMA page_count", [], |r| r.get(0))
                    .map_err(Error::internal)?;
                conn.execute_batch(&format!("PRAGMA max_page_count = {pages}"))
                    .map_err(Error::internal)
            })
            .await
            .expect("a full database");
        let big = |value: &'static str| {
            store.write(move |conn| {
                conn.execute("INSERT INTO probe (v) VALUES (?1 || zeroblob(100000))", [value])
                    .map(drop)
                    .map_err(Error::internal)
            })
        };
        let fine = |value: &'static str| store.write(move |conn| insert(conn, value));
        // Too big first in its group, then one that fits.
        let held = hold(&store).await;
        let (first, fits, ()) = tokio::join!(big("big-first"), fine("fits"), held.release());
        assert!(first.is_err());
        fits.expect("a job after a first one that SQLite rolled back");
        // Fine, too big, fine: the first is undone with the transaction.
        let held = hold(&store).await;
        let (before, too_big, after, ()) =
            tokio::join!(fine("before"), big("big"), fine("after"), held.release());
        assert!(too_big.is_err());
        let kept = stored(&store).await;
        for (value, answer) in [("before", &before), ("after", &after)] {
            assert_eq!(
                answer.is_ok(),
                kept.iter().any(|v| v == value),
                "{value}: answered {answer:?}, stored: {kept:?}"
            );
        }
        store
            .write(|conn| {
                conn.execute_batch("PRAGMA max_page_count = 1073741823").map_err(Error::internal)
            })
            .await
            .expect("room again");
        store.write(|conn| insert(conn, "later")).await.expect("the writer goes on");
        assert!(stored(&store).await.contains(&"later".to_owned()));
    }
}

#[cfg(test)]
mod writer_settings {
    use super::{EmbeddedOptions, EmbeddedStore, Error};

    /// The writer commits without syncing the log (`wal_sync`): an answer
    /// must still wait for the sync, not only for the commit.
    #[tokio::test]
    async fn a_write_is_answered_only_once_the_log_is_synced() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let store = std::sync::Arc::new(
            EmbeddedStore::open(dir.path(), EmbeddedOptions::default()).expect("open"),
        );
        let mode = store
            .write(|conn| {
                conn.query_row("PRAGMA synchronous", [], |r| r.get::<_, i64>(0))
                    .map_err(Error::internal)
            })
            .await
            .expect("the writer's synchronous mode");
        assert_eq!(mode, 1, "NORMAL: the commit itself does not sync");
        // The sync thread stops at its gate, held by a thread of its own
        // so that no lock is held across an await here.
        let gate = std::sync::Arc::clone(&store.sync_gate);
        let (locked, is_locked) = std::sync::mpsc::channel();
        let (release, released) = std::sync::mpsc::channel::<()>();
        let holder = std::thread::spawn(move || {
            let _held = gate.lock();
            let _ = locked.send(());
            let _ = released.recv();
        });
        is_locked.recv().expect("gate held");
        let mut writing = tokio::spawn({
            let store = std::sync::Arc::clone(&store);
            async move {
                store
                    .write(|conn| {
                        conn.execute_batch(
                            "INSERT INTO schema_version (version, applied_at) VALUES (-7, 0)",
                        )
                        .map_err(Error::internal)
                    })
                    .await
            }
        });
        let committed = || async {
            store
                .read(|conn| {
                    conn.query_row(
                        "SELECT count(*) FROM schema_version WHERE version = -7",
                        [],
                        |r| r.get::<_, i64>(0),
                    )
                    .map_err(Error::internal)
                })
                .await
                .expect("read")
                == 1
        };
        let mut polls = 0;
        while !committed().await {
            polls += 1;
            assert!(polls < 1000, "the write was never committed");
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        // Committed and visible, but not synced: no answer yet.
        let early = tokio::time::timeout(std::time::Duration::from_millis(200), &mut writing).await;
        assert!(early.is_err(), "answered before the log was synced: {early:?}");
        release.send(()).expect("release the gate");
        writing.await.expect("write task").expect("answered once synced");
        holder.join().expect("gate holder");
    }

    /// The writer connection's `cache_size` (negative: KiB) and `mmap_size`.
    async fn writer_pragmas(options: EmbeddedOptions) -> (i64, i64) {
        let dir = tempfile::tempdir().expect("temporary directory");
        let store = EmbeddedStore::open(dir.path(), options).expect("open store");
        store
            .write(|conn| {
                let pragma = |name: &str| {
                    conn.query_row(&format!("PRAGMA {name}"), [], |r| r.get::<_, i64>(0))
                        .map_err(Error::internal)
                };
                Ok((pragma("cache_size")?, pragma("mmap_size")?))
            })
            .await
            .expect("read the writer's pragmas")
    }

    #[test]
    fn replaced_indexes_of_an_older_store_are_dropped_on_open() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let conn = super::open_writer_connection(dir.path()).expect("open");
        conn.execute_batch(
            "CREATE INDEX events_trace ON events (workspace_id, trace_id, ts);
             CREATE INDEX events_trace_trigger ON events (workspace_id, trace_id, ts)
                WHERE event NOT LIKE 'governance.%';
             DROP INDEX events_trace_own;
             CREATE INDEX events_trace_kind
                ON events (workspace_id, trace_id, event LIKE 'governance.%', ts)
                WHERE trace_id IS NOT NULL;
             DROP INDEX events_agent_actors;
             CREATE INDEX events_agents ON events (workspace_id, actor_type, actor_id, ts, revenue)
                WHERE actor_type IN ('agent', 'ai_agent', 'robot');",
        )
        .expect("the older store's indexes");
        drop(conn);
        let conn = super::open_writer_connection(dir.path()).expect("reopen");
        let names: Vec<String> = conn
            .prepare(
                "SELECT name FROM sqlite_master WHERE type = 'index'
                 AND (name LIKE 'events_trace%' OR name LIKE 'events_agent%') ORDER BY name",
            )
            .expect("prepare")
            .query_map([], |r| r.get(0))
            .expect("query")
            .collect::<rusqlite::Result<_>>()
            .expect("index names");
        assert_eq!(names, ["events_agent_actors", "events_trace_own"]);
    }

    #[tokio::test]
    async fn the_search_index_merges_sixteen_at_a_time_and_is_read_through_the_mapping() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let store = EmbeddedStore::open(dir.path(), EmbeddedOptions::default()).expect("open");
        let (automerge, mmap, cache) = store
            .read(|conn| {
                let one = |q: &str| conn.query_row(q, [], |r| r.get::<_, i64>(0));
                Ok((
                    one("SELECT v FROM search.events_fts_config WHERE k = 'automerge'"),
                    one("PRAGMA search.mmap_size"),
                    one("PRAGMA search.cache_size"),
                ))
            })
            .await
            .expect("read the index's settings");
        let automerge = automerge.expect("automerge is configured");
        assert_eq!(automerge, super::FTS_AUTOMERGE);
        assert_eq!(automerge, 16);
        assert_eq!(mmap.expect("mmap_size"), super::MMAP_SIZE);
        assert_eq!(cache.expect("cache_size"), -65536);
    }

    #[test]
    fn a_data_directory_is_held_by_one_store_at_a_time() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let first = EmbeddedStore::open(dir.path(), EmbeddedOptions::default()).expect("open");
        let second = EmbeddedStore::open(dir.path(), EmbeddedOptions::default());
        let err = second.err().expect("a second store on the same directory").to_string();
        assert!(
            err.contains("store.data_dir") && err.contains("in use by another process"),
            "{err}"
        );
        // Tools that write through their own connection take the same lock.
        let tool = super::open_writer_connection(dir.path()).err().expect("refused").to_string();
        assert!(tool.contains("in use by another process"), "{tool}");
        drop(first);
        let tool = super::open_writer_connection(dir.path()).expect("free again");
        let store = EmbeddedStore::open(dir.path(), EmbeddedOptions::default());
        assert!(store.is_err(), "a store opened beside a tool's writer connection");
        drop(tool);
        EmbeddedStore::open(dir.path(), EmbeddedOptions::default()).expect("free again");
    }

    /// A fresh store is far below 1 GiB, where SQLite's default page cache
    /// would scan itself at each commit that split a page (`page_cache`).
    #[test]
    fn commits_below_one_gibibyte_skip_the_scan_and_leave_the_store_whole() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let conn = super::open_writer_connection(dir.path()).expect("open");
        conn.execute_batch("CREATE TABLE t (k BLOB PRIMARY KEY, v BLOB) WITHOUT ROWID")
            .expect("table");
        let before = super::page_cache::spared();
        let mut stmt = conn.prepare("INSERT INTO t VALUES (?1, zeroblob(300))").expect("insert");
        let key = |i: u64| i.wrapping_mul(0x9E37_79B9_7F4A_7C15).to_be_bytes();
        for round in 0..40u64 {
            conn.execute_batch("BEGIN").expect("begin");
            for i in 0..500 {
                stmt.execute([key(round * 500 + i)]).expect("row");
            }
            // Every fourth transaction grows the file and is rolled back:
            // the pages it added must leave the cache.
            conn.execute_batch(if round % 4 == 3 { "ROLLBACK" } else { "COMMIT" }).expect("end");
        }
        assert!(super::page_cache::spared() > before, "no commit was spared the scan");
        let check: String =
            conn.query_row("PRAGMA integrity_check", [], |r| r.get(0)).expect("integrity check");
        assert_eq!(check, "ok");
        let rows: i64 = conn.query_row("SELECT count(*) FROM t", [], |r| r.get(0)).expect("count");
        assert_eq!(rows, 30 * 500);
    }

    #[tokio::test]
    async fn the_writer_uses_the_configured_cache_and_maps_the_file() {
        let default = writer_pragmas(EmbeddedOptions::default()).await;
        assert_eq!(default, (-256 * 1024, 256 * 1024 * 1024));
        let small = EmbeddedOptions { writer_cache: 8 * 1024 * 1024, ..EmbeddedOptions::default() };
        assert_eq!(writer_pragmas(small).await.0, -8 * 1024);
    }
}

#[cfg(test)]
mod writer_queue {
    use std::sync::{Arc, Mutex};
    use std::task::Poll;

    use super::{EmbeddedOptions, EmbeddedStore, QUEUE_LIMIT, hold_writer};

    /// A gRPC stream hands the store a gateway's batches before their
    /// answers, each polled once in order and then awaited in order; with
    /// the writer's queue full, they must still reach the writer in that
    /// order (see `GatewayStore::commit_gateway_batch`).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn writes_that_find_the_queue_full_enter_it_in_the_order_they_asked() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let store = EmbeddedStore::open(dir.path(), EmbeddedOptions::default()).expect("open");
        let store = Arc::new(store);
        // The writer is held inside a job until released.
        let held = hold_writer(&store, |_| Ok(())).await;
        // Every place in the queue taken.
        let fillers: Vec<_> = (0..QUEUE_LIMIT)
            .map(|_| {
                let store = Arc::clone(&store);
                tokio::spawn(async move { store.write(|_| Ok(())).await })
            })
            .collect();
        for _ in 0..1_000_000 {
            if store.queue.available_permits() == 0 {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert_eq!(store.queue.available_permits(), 0, "the fillers took the queue");
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut waiting = Vec::new();
        for i in 0..64 {
            let order = Arc::clone(&order);
            let mut write = Box::pin(store.write(move |_| {
                order.lock().expect("order").push(i);
                Ok(())
            }));
            let early = std::future::poll_fn(|cx| Poll::Ready(write.as_mut().poll(cx))).await;
            assert!(early.is_pending(), "write {i} found room in a full queue");
            waiting.push(write);
        }
        held.release().await;
        for write in waiting {
            write.await.expect("write");
        }
        assert_eq!(*order.lock().expect("order"), (0..64).collect::<Vec<_>>());
        for filler in fillers {
            filler.await.expect("filler task").expect("filler");
        }
    }
}

#[cfg(test)]
mod wal_bound {
    use std::sync::Arc;

    use super::{DB_FILE, EmbeddedOptions, EmbeddedStore, test_event};
    use crate::store::{AppendRequest, Store};

    fn request(name: &str) -> AppendRequest {
        let events = (0..20).map(|_| test_event(name)).collect();
        AppendRequest { events, idempotency_key: None, new_event_limit: None }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_log_stays_near_its_limit_while_the_writer_never_pauses() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let limit = 256 * 1024;
        let options = EmbeddedOptions { wal_limit: limit, ..EmbeddedOptions::default() };
        let store = Arc::new(EmbeddedStore::open(dir.path(), options).expect("open store"));
        // Eight writers that each send their next request once the last
        // is answered keep a request waiting at every commit: megabytes
        // of log, and no pause in which the checkpointer could finish.
        let writers: Vec<_> = (0..8)
            .map(|w| {
                let store = Arc::clone(&store);
                tokio::spawn(async move {
                    let mut inserted = 0usize;
                    for _ in 0..60 {
                        let name = format!("conveyor.{w}.tote_scanned");
                        inserted += store.append_events("ws", request(&name)).await?.inserted;
                    }
                    crate::error::Result::<usize>::Ok(inserted)
                })
            })
            .collect();
        let mut inserted = 0;
        for writer in writers {
            inserted += writer.await.expect("writer task").expect("append");
        }
        assert_eq!(inserted, 8 * 60 * 20);
        let wal = std::fs::metadata(dir.path().join(format!("{DB_FILE}-wal"))).expect("log");
        // Without the bound: about 18 MB. The slack is for groups committed
        // while the checkpointer thread held the checkpoint (on a loaded
        // machine it may be descheduled holding it).
        assert!(wal.len() <= 16 * limit, "log of {} bytes, limit {limit}", wal.len());
    }
}

#[cfg(test)]
mod idempotency_keys {
    use super::{EmbeddedOptions, EmbeddedStore, Error, PURGE_BATCH, test_event};
    use crate::store::{AppendRequest, IDEMPOTENCY_WINDOW_MS, Store};

    fn keyed(key: &str) -> AppendRequest {
        let events = vec![test_event("label.printed")];
        AppendRequest { events, idempotency_key: Some(key.into()), new_event_limit: None }
    }

    #[tokio::test]
    async fn expired_keys_are_deleted_in_batches_and_live_ones_still_answer() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let store = EmbeddedStore::open(dir.path(), EmbeddedOptions::default()).expect("open");
        let expired = i64::try_from(PURGE_BATCH).expect("small") + 1000;
        let now = crate::now_ms();
        store
            .write(move |conn| {
                conn.execute(
                    "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?1)
                     INSERT INTO idempotency_keys (workspace_id, key, response, created_at)
                     SELECT 'ws', 'old-' || i, '[\"evt_old\"]', ?2 FROM n",
                    rusqlite::params![expired, now - IDEMPOTENCY_WINDOW_MS - 60_000],
                )
                .map_err(Error::internal)?;
                conn.execute(
                    "INSERT INTO idempotency_keys (workspace_id, key, response, created_at)
                     VALUES ('ws', 'live', '[\"evt_live\"]', ?1)",
                    [now - 3_600_000],
                )
                .map_err(Error::internal)
            })
            .await
            .expect("keys of yesterday and of an hour ago");
        // The writer deletes one batch after each group while a batch comes
        // back full: these two groups give it the turns it needs.
        let replay = store.append_events("ws", keyed("live")).await.expect("replay");
        store.append_events("ws", keyed("new")).await.expect("append");
        assert_eq!((replay.ids, replay.inserted), (vec!["evt_live".to_owned()], 0));
        let keys: Vec<String> = store
            .read(|conn| {
                let mut stmt = conn
                    .prepare("SELECT key FROM idempotency_keys ORDER BY key")
                    .map_err(Error::internal)?;
                let keys = stmt
                    .query_map([], |r| r.get(0))
                    .and_then(Iterator::collect)
                    .map_err(Error::internal)?;
                Ok(keys)
            })
            .await
            .expect("read the keys");
        assert_eq!(keys, ["live", "new"]);
    }
}
