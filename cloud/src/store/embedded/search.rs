//! The search index: FTS5 trigrams of each event's searchable text, kept in
//! a database of its own (`search.db`, beside the store's) and written by a
//! thread of its own.
//!
//! Why apart from the events: tokenizing, flushing and merging the index
//! was 12 % of the store writer's time under single-event ingest and about
//! 40 % under gateway batches, all of it on the one thread every
//! acknowledgement waits for. SQLite lets one connection write a database
//! at a time, so an index in the same file could only move that work, not
//! run it beside the writer; in a file of its own it runs on the other core.
//!
//! How it stays exact:
//! - The indexer follows `events` by `seq`: the writer nudges it after
//!   each commit, and it indexes every event past the last one it indexed,
//!   in chunks, committing its position ([`Progress`]) with the entries.
//!   After a nudge it gathers commits for up to [`LINGER`] unless a search
//!   is waiting: FTS5 writes a segment per transaction and merges them
//!   later, so a transaction per group commit of a few dozen events costs
//!   several times the indexing itself.
//!   The writer hands it the searchable text of the events it inserts
//!   ([`Hints`]), so that it need not rebuild each from the row.
//!   A crash loses at most entries it re-indexes on the next start, from
//!   the events, which are the source of truth; an index that is lost, or
//!   that is ahead of the events (a restored backup), is rebuilt.
//! - An event removed later (`connectors::remove_event`) is logged in
//!   `search_removed`, in the same transaction. SQLite may give a later
//!   event the removed one's `seq` (the largest plus one), so the indexer
//!   reads the log, the events and any reused `seq` in one read snapshot,
//!   drops the removed entries and indexes what now holds their `seq`.
//! - A search first waits until the indexer has reached the newest event
//!   and log entry committed when the search began ([`SearchIndex::wait`]),
//!   so it finds every event acknowledged before it, as before. If the
//!   index cannot be written (a full disk), the wait is bounded and the
//!   search answers from what is indexed, with a warning.

use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, params};
use serde_json::Value;
use tokio::sync::watch;

use super::{FTS_AUTOMERGE, MMAP_SIZE, READ_CACHE_KIB, open_reader, sql};
use crate::error::{Error, Result};
use crate::store::columns::{fold_case, search_text_of};

/// The index's file, in the store's data directory.
pub(super) const SEARCH_FILE: &str = "search.db";

/// Events read, tokenized and committed per index transaction: large
/// enough that FTS5 writes few segments (one per transaction), small
/// enough that a search waiting behind a backlog sees progress.
const CHUNK: i64 = 4096;

/// How long the indexer gathers commits before indexing them, unless a
/// search asks for them first.
const LINGER: Duration = Duration::from_millis(200);

/// The most envelope and text bytes [`Hints`] hold for the indexer; past
/// it the writer drops them and the indexer rebuilds those texts itself.
/// About a second of gateway traffic, several of the indexer's lingers.
const HINT_BYTES: usize = 16 << 20;

/// The longest wait between attempts while indexing fails.
const RETRY_MAX: Duration = Duration::from_secs(10);

/// The index's layout. `detail = 'none'` keeps only which events hold each
/// trigram, not where: tokenizing and merging cost about 0.6 of what they
/// cost with positions, and the index is about a third of the size. Without
/// positions a search cannot ask for adjacent trigrams, so [`Needle`] asks
/// for trigrams covering the needle in any order and checks each
/// candidate's text.
const TABLE: &str = "CREATE VIRTUAL TABLE IF NOT EXISTS events_fts USING fts5 (
        body, content = '', contentless_delete = 1, tokenize = 'trigram', detail = 'none'
    )";

const SCHEMA: &str = "
    -- How far the index has followed the store: the last event `seq` and
    -- the last `search_removed` entry applied.
    CREATE TABLE IF NOT EXISTS progress (
        one     INTEGER PRIMARY KEY CHECK (one = 1),
        seq     INTEGER NOT NULL,
        removed INTEGER NOT NULL
    );
    INSERT OR IGNORE INTO progress (one, seq, removed) VALUES (1, 0, 0);";

/// How far the index has followed the store's `events` and `search_removed`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Progress {
    pub seq: i64,
    pub removed: i64,
}

impl Progress {
    fn covers(self, target: Progress) -> bool {
        self.seq >= target.seq && self.removed >= target.removed
    }
}

/// Why the indexer wakes up.
enum Wake {
    /// The writer committed.
    Commit,
    /// A search waits for the index.
    Search,
    /// The store closes: index what is left, then stop.
    Stop,
}

/// The writer's end: tells the indexer about each commit.
pub(super) struct Nudge(mpsc::SyncSender<Wake>);

impl Nudge {
    pub(super) fn committed(&self) {
        // Full: the indexer has wake-ups pending already.
        let _ = self.0.try_send(Wake::Commit);
    }
}

/// Wake-ups pending at most; more would say nothing new.
const WAKES: usize = 8;

/// The store's handle on its indexer thread.
pub(super) struct SearchIndex {
    progress: watch::Receiver<Progress>,
    wake: mpsc::SyncSender<Wake>,
    /// How long a search waits for the indexer before answering without
    /// what it has not reached.
    wait: Duration,
    /// Index transactions that failed, for health and the log.
    failures: std::sync::Arc<AtomicU64>,
    /// Joined by [`SearchIndex::stop`].
    thread: std::sync::Mutex<Option<std::thread::JoinHandle<()>>>,
    hints: Arc<Hints>,
}

impl SearchIndex {
    /// Opens (or creates, or rebuilds) the index beside the store at
    /// `db_path` and starts its thread, which indexes whatever the store
    /// holds beyond it, then follows the commits the [`Nudge`] reports; it
    /// stops when both this handle and the nudge are gone.
    pub(super) fn start(db_path: &Path, wait: Duration) -> Result<(SearchIndex, Nudge)> {
        let events = open_reader(db_path).map_err(Error::internal)?;
        let (index, at) = open_against(db_path, &events)?;
        let (publish, progress) = watch::channel(at);
        let (wake, wakes) = mpsc::sync_channel(WAKES);
        let failures = Arc::new(AtomicU64::new(0));
        let hints = Arc::new(Hints::default());
        let indexer = Indexer { events, index, at, hints: Arc::clone(&hints) };
        let failed = Arc::clone(&failures);
        let thread = std::thread::Builder::new()
            .name("search-index".into())
            .spawn(move || indexer.run(&wakes, &publish, &failed))
            .map_err(Error::internal)?;
        let thread = std::sync::Mutex::new(Some(thread));
        let index = SearchIndex { progress, wake: wake.clone(), wait, failures, thread, hints };
        Ok((index, Nudge(wake)))
    }

    /// Where the writer leaves the searchable text of what it inserts.
    pub(super) fn hints(&self) -> Arc<Hints> {
        Arc::clone(&self.hints)
    }

    /// Has the indexer index what the store holds, then stop, and waits
    /// for it (for a clean close: the index's file is then complete and
    /// closed). Later calls do nothing.
    pub(super) async fn stop(&self) {
        let Some(thread) = self.thread.lock().ok().and_then(|mut t| t.take()) else {
            return;
        };
        let wake = self.wake.clone();
        let stopped = tokio::task::spawn_blocking(move || {
            let _ = wake.send(Wake::Stop);
            thread.join()
        });
        if !matches!(stopped.await, Ok(Ok(()))) {
            tracing::warn!("the search indexer did not stop cleanly");
        }
    }

    /// Waits until the index covers `target` (what the store held when a
    /// search began), at most the configured wait.
    pub(super) async fn wait(&self, target: Progress) {
        if self.progress.borrow().covers(target) {
            return;
        }
        let _ = self.wake.try_send(Wake::Search);
        let mut progress = self.progress.clone();
        let reached = tokio::time::timeout(self.wait, progress.wait_for(|p| p.covers(target)));
        if !matches!(reached.await, Ok(Ok(_))) {
            let at = *self.progress.borrow();
            tracing::warn!(
                indexed = at.seq,
                newest = target.seq,
                failed_attempts = self.failures.load(Ordering::SeqCst),
                "search answers without the events its index has not reached"
            );
        }
    }

    /// Index transactions that have failed since the store opened.
    pub(super) fn failures(&self) -> u64 {
        self.failures.load(Ordering::SeqCst)
    }

    /// How far the index has come.
    pub(super) fn progress(&self) -> Progress {
        *self.progress.borrow()
    }
}

/// What a search must wait for: the newest event and removal committed.
pub(super) fn target(conn: &Connection) -> rusqlite::Result<Progress> {
    conn.query_row(
        "SELECT (SELECT coalesce(max(seq), 0) FROM events),
                (SELECT coalesce(max(id), 0) FROM search_removed)",
        [],
        |r| Ok(Progress { seq: r.get(0)?, removed: r.get(1)? }),
    )
}

/// Records, in the removing transaction, that the event at `seq` is gone.
pub(super) fn log_removal(conn: &Connection, seq: i64) -> rusqlite::Result<()> {
    conn.prepare_cached("INSERT INTO search_removed (seq) VALUES (?1)")?.execute([seq]).map(drop)
}

/// Attaches the index to a read connection as schema `search`.
pub(super) fn attach(conn: &Connection, db_path: &Path) -> rusqlite::Result<()> {
    let path = index_path(db_path);
    conn.execute("ATTACH DATABASE ?1 AS search", [path.to_string_lossy()])?;
    // Cache and mapping are per database: without these the index would
    // be read through SQLite's 2 MB default cache, a pread per page.
    conn.pragma_update(Some("search"), "cache_size", READ_CACHE_KIB)?;
    conn.pragma_update(Some("search"), "mmap_size", MMAP_SIZE)
}

/// Indexes everything the store at `db_path` holds beyond its index, on
/// the calling thread, calling `progress` with the number indexed so far
/// after each transaction; for tools that write a store without running
/// one (`opgraph-history`), so that it opens with its index built. Answers
/// how many events it indexed.
pub fn build(db_path: &Path, mut progress: impl FnMut(u64)) -> Result<u64> {
    let events = open_reader(db_path).map_err(Error::internal)?;
    let (index, at) = open_against(db_path, &events)?;
    let mut indexer = Indexer { events, index, at, hints: Arc::default() };
    let mut indexed = 0u64;
    indexer
        .catch_up(|_, events| {
            indexed += events as u64;
            progress(indexed);
        })
        .map_err(sql)?;
    Ok(indexed)
}

fn index_path(db_path: &Path) -> PathBuf {
    db_path.with_file_name(SEARCH_FILE)
}

fn open_index(path: &Path) -> rusqlite::Result<Connection> {
    let conn = Connection::open(path)?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    // NORMAL: a power cut may lose the last index commits, never corrupt
    // the file; the lost part is indexed again from the events.
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    conn.pragma_update(None, "busy_timeout", 5000)?;
    conn.pragma_update(None, "cache_size", READ_CACHE_KIB)?;
    conn.pragma_update(None, "mmap_size", MMAP_SIZE)?;
    conn.execute(TABLE, [])?;
    conn.execute_batch(SCHEMA)?;
    // FTS5 merges a level's segments once `automerge` of them exist; its
    // default of 4 rewrites each entry about twice as often as 16, the
    // most it allows. A search reads a few more segments per trigram, a
    // seek each. Stored in the table's config.
    conn.execute(
        "INSERT INTO events_fts (events_fts, rank) VALUES ('automerge', ?1)",
        [FTS_AUTOMERGE],
    )?;
    Ok(conn)
}

/// The index of the store at `db_path`, whose events `events` reads, and
/// how far it has come: opened or made afresh ([`open_or_recreate`]), and
/// cleared when it claims more than the store holds.
fn open_against(db_path: &Path, events: &Connection) -> Result<(Connection, Progress)> {
    let (index, at) = open_or_recreate(&index_path(db_path))?;
    let newest = target(events).map_err(Error::internal)?.seq;
    let at = if at.seq > newest {
        tracing::warn!(
            indexed = at.seq,
            newest,
            "the search index is ahead of the events (a restored store?): rebuilding it"
        );
        clear(&index).map_err(Error::internal)?;
        Progress::default()
    } else {
        at
    };
    if newest - at.seq > CHUNK {
        tracing::info!(behind = newest - at.seq, "indexing events for search");
    }
    Ok((index, at))
}

/// The index and its position; an index that cannot be read (a damaged
/// file) is deleted and started afresh, since the events rebuild it: the
/// store never refuses to open over its search index.
fn open_or_recreate(path: &Path) -> Result<(Connection, Progress)> {
    let opened = open_index(path)
        .and_then(|index| Ok((read_progress(&index)?, current_layout(&index)?, index)));
    match opened {
        Ok((at, true, index)) => Ok((index, at)),
        Ok((_, false, index)) => {
            drop(index);
            tracing::info!(file = %path.display(), "the search index has an older layout: rebuilding it");
            recreate(path)
        }
        Err(e) => {
            tracing::warn!(error = %e, file = %path.display(), "the search index cannot be read: rebuilding it");
            recreate(path)
        }
    }
}

/// Whether the index's table is the one [`TABLE`] makes (SQLite keeps the
/// statement's text as written).
fn current_layout(index: &Connection) -> rusqlite::Result<bool> {
    let made: String = index.query_row(
        "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'events_fts'",
        [],
        |r| r.get(0),
    )?;
    Ok(TABLE.replace(" IF NOT EXISTS", "") == made)
}

/// Deletes the index's files and makes it afresh, empty.
fn recreate(path: &Path) -> Result<(Connection, Progress)> {
    for suffix in ["", "-wal", "-shm"] {
        let file = PathBuf::from(format!("{}{suffix}", path.display()));
        if let Err(e) = std::fs::remove_file(&file)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            return Err(Error::internal(format!("remove {}: {e}", file.display())));
        }
    }
    let index = open_index(path).map_err(Error::internal)?;
    Ok((index, Progress::default()))
}

fn read_progress(index: &Connection) -> rusqlite::Result<Progress> {
    index.query_row("SELECT seq, removed FROM progress", [], |r| {
        Ok(Progress { seq: r.get(0)?, removed: r.get(1)? })
    })
}

fn clear(index: &Connection) -> rusqlite::Result<()> {
    index.execute_batch(
        "BEGIN IMMEDIATE;
         INSERT INTO events_fts (events_fts) VALUES ('delete-all');
         UPDATE progress SET seq = 0, removed = 0;
         COMMIT;",
    )
}

/// Lets `pause` pass, gathering commits, or less if a search asks;
/// answers whether to stop (asked to, or the store is gone).
fn wait_out(wakes: &mpsc::Receiver<Wake>, pause: Duration) -> bool {
    let until = std::time::Instant::now() + pause;
    loop {
        match wakes.recv_timeout(until.saturating_duration_since(std::time::Instant::now())) {
            Ok(Wake::Commit) => {}
            Ok(Wake::Search) | Err(mpsc::RecvTimeoutError::Timeout) => return false,
            Ok(Wake::Stop) | Err(mpsc::RecvTimeoutError::Disconnected) => return true,
        }
    }
}

/// The columns an event's searchable text is made of, after `seq`: its
/// name, actor and object as `events::prepare_rows` flattened them, and
/// the stored envelope for its properties.
pub(super) const BODY_COLUMNS: &str =
    "event, actor_type, actor_id, object_type, object_id, envelope";
/// Where the envelope is among [`BODY_COLUMNS`].
const ENVELOPE_COLUMN: usize = 5;

/// The properties of a stored envelope: the one part of the searchable
/// text that has no column. Reading only them skips the rest of the
/// envelope without building it (ingest validated it).
#[derive(serde::Deserialize)]
struct Properties {
    properties: Option<serde_json::Map<String, Value>>,
}

/// The text an event is found by ([`crate::store::columns::search_text`],
/// as ingest would make it), from the [`BODY_COLUMNS`] of `row` starting
/// at column `first`.
pub(super) fn body(row: &rusqlite::Row<'_>, first: usize) -> rusqlite::Result<String> {
    let name: String = row.get(first)?;
    let parts: [Option<String>; 4] =
        [row.get(first + 1)?, row.get(first + 2)?, row.get(first + 3)?, row.get(first + 4)?];
    let envelope: String = row.get(first + ENVELOPE_COLUMN)?;
    let properties = match serde_json::from_str::<Properties>(&envelope) {
        Ok(read) => read.properties,
        Err(e) => {
            tracing::warn!(error = %e, "a stored envelope does not parse; searchable without its properties");
            None
        }
    };
    Ok(search_text_of(&name, parts.iter().flatten().map(String::as_str), properties.as_ref()))
}

/// What a search looks for: the index's query, and the check each of its
/// candidates must pass.
pub(super) struct Needle {
    /// Every event that holds trigrams covering the needle, in any order;
    /// `None` for a needle shorter than a trigram, which the index cannot
    /// find.
    expression: Option<String>,
    /// The needle with its case folded as the index folds it.
    folded: String,
}

impl Needle {
    /// `None` for empty text.
    pub(super) fn new(text: &str) -> Option<Needle> {
        if text.is_empty() {
            return None;
        }
        let chars: Vec<char> = text.chars().collect();
        let expression = chars.len().checked_sub(3).map(|last| {
            // Every third trigram and the last cover the needle; the others
            // would narrow the candidates little, and each reads its own
            // list.
            let mut terms: Vec<String> = (0..=last)
                .step_by(3)
                .chain(std::iter::once(last))
                .map(|at| {
                    let trigram: String = chars[at..at + 3].iter().collect();
                    format!("\"{}\"", trigram.replace('"', "\"\""))
                })
                .collect();
            terms.sort_unstable();
            terms.dedup();
            terms.join(" AND ")
        });
        Some(Needle { expression, folded: fold_case(text) })
    }

    /// The FTS5 query for the index's candidates; `None` when the needle
    /// is shorter than a trigram.
    pub(super) fn expression(&self) -> Option<&str> {
        self.expression.as_deref()
    }

    /// Whether an event's searchable text ([`body`]) holds the needle: what
    /// a phrase query over trigram positions answered.
    pub(super) fn found_in(&self, text: &str) -> bool {
        fold_case(text).contains(&self.folded)
    }
}

/// Index entries holding trigrams that cover `text` (at least three
/// characters), read without waiting for the indexer: for tests that look
/// at the index itself.
#[cfg(test)]
pub(super) fn entries_covering(conn: &Connection, text: &str) -> rusqlite::Result<i64> {
    let needle = Needle::new(text).ok_or(rusqlite::Error::InvalidQuery)?;
    let expression = needle.expression().ok_or(rusqlite::Error::InvalidQuery)?;
    conn.query_row("SELECT count(*) FROM search.events_fts(?1)", [expression], |r| r.get(0))
}

/// The searchable text of events the writer has just inserted, handed to
/// the indexer so that it need not rebuild it from their rows: rebuilding
/// parses each stored envelope's properties, a quarter of the indexer's work.
/// A hint is only used for the row at its `seq` holding the same envelope,
/// which determines the text; so an insert that was rolled back, or a `seq`
/// reused after a removal, leaves a hint that matches nothing, and a row
/// without a hint has its text rebuilt. At most [`HINT_BYTES`] wait here.
#[derive(Default)]
pub(super) struct Hints(Mutex<HintQueue>);

#[derive(Default)]
struct HintQueue {
    /// In the order the writer inserted them: by `seq`, but for reuse.
    hints: VecDeque<Hint>,
    bytes: usize,
}

/// One inserted event's `seq`, stored envelope and searchable text.
pub(super) struct Hint {
    seq: i64,
    envelope: String,
    text: String,
}

impl Hint {
    pub(super) fn new(seq: i64, envelope: String, text: String) -> Hint {
        Hint { seq, envelope, text }
    }

    fn bytes(&self) -> usize {
        self.envelope.len() + self.text.len()
    }
}

impl Hints {
    /// The writer's side: keeps what fits.
    pub(super) fn offer(&self, hints: Vec<Hint>) {
        let Ok(mut queue) = self.0.lock() else { return };
        for hint in hints {
            if queue.bytes + hint.bytes() > HINT_BYTES {
                break;
            }
            queue.bytes += hint.bytes();
            queue.hints.push_back(hint);
        }
    }

    /// The indexer's side: takes them all, so that the writer is not kept
    /// waiting while a chunk is read; [`Hints::put_back`] returns the rest.
    fn take(&self) -> VecDeque<Hint> {
        self.0.lock().map(|mut q| std::mem::take(&mut *q).hints).unwrap_or_default()
    }

    /// Returns hints the indexer has not reached, ahead of any offered since.
    fn put_back(&self, mut rest: VecDeque<Hint>) {
        let Ok(mut queue) = self.0.lock() else { return };
        rest.append(&mut queue.hints);
        queue.bytes = rest.iter().map(Hint::bytes).sum();
        queue.hints = rest;
    }
}

/// The text `hints` hold for the row at `seq` whose envelope is `envelope`,
/// dropping the hints it passes: those for earlier `seq`s, whose rows are
/// gone or were read, and those for this `seq` with another envelope.
fn claim(hints: &mut VecDeque<Hint>, seq: i64, envelope: &str) -> Option<String> {
    while hints.front().is_some_and(|h| h.seq <= seq) {
        let hint = hints.pop_front()?;
        if hint.seq == seq && hint.envelope == envelope {
            return Some(hint.text);
        }
    }
    None
}

/// What one chunk read from the store: the searchable text of the events
/// past the index's position, and the removals logged since, each with the
/// text of what now holds its `seq`.
struct Chunk {
    events: Vec<(i64, String)>,
    removed: BTreeMap<i64, Option<String>>,
    removed_upto: i64,
}

/// The indexer's two connections and how far it has come.
struct Indexer {
    events: Connection,
    index: Connection,
    at: Progress,
    hints: Arc<Hints>,
}

impl Indexer {
    /// Catches up, then again after commits, until the store stops it or
    /// is gone; publishes each step, and retries failures with a doubling
    /// pause.
    fn run(
        mut self,
        wakes: &mpsc::Receiver<Wake>,
        publish: &watch::Sender<Progress>,
        failures: &AtomicU64,
    ) {
        // `None` while indexing works; the pause before the next attempt
        // while it fails.
        let mut retry: Option<Duration> = None;
        let mut stopping = false;
        loop {
            match self.catch_up(|at, _| {
                publish.send_replace(at);
            }) {
                Ok(()) => {
                    if retry.take().is_some() {
                        tracing::info!("search indexing works again");
                    }
                }
                Err(e) => {
                    failures.fetch_add(1, Ordering::SeqCst);
                    if retry.is_none() {
                        tracing::warn!(error = %e, "search indexing failed; retrying");
                    }
                    retry =
                        Some(retry.map_or(Duration::from_millis(200), |r| (r * 2).min(RETRY_MAX)));
                }
            }
            if stopping {
                return;
            }
            // After the stop (or with the store gone), one last round.
            stopping = match retry {
                // Commits do not hurry a retry: under load they would make
                // one per group commit.
                Some(pause) => wait_out(wakes, pause),
                None => match wakes.recv() {
                    Ok(Wake::Commit) => wait_out(wakes, LINGER),
                    Ok(Wake::Search) => false,
                    Ok(Wake::Stop) | Err(_) => true,
                },
            };
        }
    }

    /// Indexes chunks until the index has reached the store; `each` gets
    /// the position and the number of events after each chunk.
    fn catch_up(&mut self, mut each: impl FnMut(Progress, usize)) -> rusqlite::Result<()> {
        loop {
            let chunk = self.read()?;
            if chunk.events.is_empty() && chunk.removed_upto == self.at.removed {
                return Ok(());
            }
            let events = chunk.events.len();
            self.at = self.write(chunk)?;
            each(self.at, events);
        }
    }

    /// One read snapshot of the store: the log of removals past the
    /// index's position, what holds each removed `seq` now (SQLite may have
    /// reused it), and the next events.
    fn read(&self) -> rusqlite::Result<Chunk> {
        let tx = self.events.unchecked_transaction()?;
        let mut removed = BTreeMap::new();
        let mut removed_upto = self.at.removed;
        {
            let mut log = tx.prepare_cached(
                "SELECT id, seq FROM search_removed WHERE id > ?1 ORDER BY id LIMIT ?2",
            )?;
            let mut now_at =
                tx.prepare_cached(&format!("SELECT {BODY_COLUMNS} FROM events WHERE seq = ?1"))?;
            let mut rows = log.query(params![self.at.removed, CHUNK])?;
            while let Some(row) = rows.next()? {
                let (id, seq): (i64, i64) = (row.get(0)?, row.get(1)?);
                removed_upto = id;
                // Past the index's position nothing was indexed: the scan
                // below reads whatever holds that `seq` now.
                if seq <= self.at.seq {
                    let body = now_at.query_row([seq], |r| body(r, 0)).optional()?;
                    removed.insert(seq, body);
                }
            }
        }
        let mut hints = self.hints.take();
        let events = tx
            .prepare_cached(&format!(
                "SELECT seq, {BODY_COLUMNS} FROM events WHERE seq > ?1 ORDER BY seq LIMIT ?2"
            ))?
            .query_map(params![self.at.seq, CHUNK], |r| {
                let seq = r.get(0)?;
                let hinted = r
                    .get_ref(1 + ENVELOPE_COLUMN)?
                    .as_str()
                    .ok()
                    .and_then(|e| claim(&mut hints, seq, e));
                Ok((seq, hinted.map_or_else(|| body(r, 1), Ok)?))
            })?
            .collect::<rusqlite::Result<Vec<_>>>();
        self.hints.put_back(hints);
        let events = events?;
        tx.finish()?;
        Ok(Chunk { events, removed, removed_upto })
    }

    /// Applies a chunk in one index transaction, with the new position.
    fn write(&self, chunk: Chunk) -> rusqlite::Result<Progress> {
        let tx = self.index.unchecked_transaction()?;
        {
            let mut delete = tx.prepare_cached("DELETE FROM events_fts WHERE rowid = ?1")?;
            let mut insert =
                tx.prepare_cached("INSERT INTO events_fts (rowid, body) VALUES (?1, ?2)")?;
            for (seq, now_at) in &chunk.removed {
                delete.execute([seq])?;
                if let Some(body) = now_at {
                    insert.execute(params![seq, body])?;
                }
            }
            for (seq, body) in &chunk.events {
                insert.execute(params![seq, body])?;
            }
        }
        let at = Progress {
            seq: chunk.events.last().map_or(self.at.seq, |(seq, _)| *seq),
            removed: chunk.removed_upto,
        };
        tx.execute("UPDATE progress SET seq = ?1, removed = ?2", params![at.seq, at.removed])?;
        tx.commit()?;
        Ok(at)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::store::NewEvent;
    use crate::store::embedded::{events, open_writer_connection};

    fn new_event(body: Value) -> NewEvent {
        let event = opgraph_proto::Event::from_json(&body, 1_000).expect("a valid envelope");
        NewEvent { id: crate::ids::new_id("evt"), received_at: 1_000, event }
    }

    /// Events whose searchable text has every part: a named and a typed
    /// party, nested and scalar leaves of each kind, text past the cap.
    fn varied() -> Vec<NewEvent> {
        vec![
            new_event(
                json!({"event": "tote.moved", "actor": "picker-7", "object": {"type": "tote", "id": "T-1"},
                "properties": {"zone": "Kühlraum", "n": 3, "ratio": 0.25, "ok": false, "nested": {"tags": ["a", 1.5e300, null]}}}),
            ),
            new_event(json!({"event": "reading", "properties": {"long": "x".repeat(3000)}})),
            new_event(json!({"event": "bare"})),
        ]
    }

    #[test]
    fn a_hint_is_claimed_only_by_its_row_and_envelope() {
        let hint = |seq, envelope: &str, text: &str| Hint::new(seq, envelope.into(), text.into());
        let mut hints = VecDeque::from([
            hint(1, "a", "one"),
            hint(2, "old", "stale"),
            hint(2, "b", "two"),
            hint(4, "d", "four"),
        ]);
        // Seq 1's row is gone: passing it drops its hint.
        assert_eq!(claim(&mut hints, 2, "b").as_deref(), Some("two"));
        assert_eq!(claim(&mut hints, 3, "c"), None, "no hint for this row");
        assert_eq!(hints.len(), 1, "a later hint stays");
        assert_eq!(claim(&mut hints, 4, "other"), None, "another envelope now holds seq 4");
        assert!(hints.is_empty());
    }

    #[test]
    fn the_writers_text_is_the_one_the_indexer_would_rebuild() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let conn = open_writer_connection(dir.path()).expect("open");
        let hints = Hints::default();
        events::append(&conn, "ws", events::prepare_rows(varied()), None, Some(&hints))
            .expect("append");
        let hinted = hints.take();
        assert_eq!(hinted.len(), 3);
        for hint in hinted {
            let rebuilt: String = conn
                .query_row(
                    &format!("SELECT {BODY_COLUMNS} FROM events WHERE seq = ?1"),
                    [hint.seq],
                    |r| body(r, 0),
                )
                .expect("the hinted row");
            let envelope: String = conn
                .query_row("SELECT envelope FROM events WHERE seq = ?1", [hint.seq], |r| r.get(0))
                .expect("the hinted row");
            assert_eq!((&hint.text, &hint.envelope), (&rebuilt, &envelope));
        }
    }

    #[test]
    fn the_indexer_uses_a_hint_that_matches_its_row_and_rebuilds_the_rest() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let conn = open_writer_connection(dir.path()).expect("open");
        let hints = Arc::new(Hints::default());
        events::append(&conn, "ws", events::prepare_rows(varied()), None, Some(&hints))
            .expect("append");
        // Texts no event holds, to see which hints were used: the first
        // with its row's envelope, the second with another's.
        let mut planted = hints.take();
        planted[0].text = "planted-here".into();
        planted[1].text = "planted-wrongly".into();
        planted[1].envelope = "{}".into();
        let (first, second) = (planted[0].seq, planted[1].seq);
        hints.put_back(planted);

        let db_path = dir.path().join(super::super::DB_FILE);
        let events = open_reader(&db_path).expect("reader");
        let (index, at) = open_against(&db_path, &events).expect("index");
        let mut indexer = Indexer { events, index, at, hints: Arc::clone(&hints) };
        indexer.catch_up(|_, _| {}).expect("index");
        let found = |text: &str| -> Vec<i64> {
            let needle = Needle::new(text).expect("a needle");
            let mut rows = indexer
                .index
                .prepare(&format!(
                    "SELECT rowid FROM events_fts('{}')",
                    needle.expression().expect("a trigram at least")
                ))
                .expect("query");
            rows.query_map([], |r| r.get(0))
                .expect("rows")
                .collect::<rusqlite::Result<_>>()
                .expect("read")
        };
        assert_eq!(found("planted-here"), [first]);
        assert_eq!(found("wrongly"), Vec::<i64>::new());
        assert_eq!(found("xxxxx"), [second], "the rebuilt text");
        assert_eq!(found("tote.moved"), Vec::<i64>::new(), "the hint replaced the text");
        assert!(hints.take().is_empty(), "every hint reached was dropped");
    }
}
