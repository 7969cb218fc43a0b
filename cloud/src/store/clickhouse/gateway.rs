//! [`GatewayStore`] on ClickHouse: a batch is two inserts, its events and
//! then one `gateway_commits` row carrying the new ack, the number of
//! events it stored (usage sums these rows) and a reservation.
//!
//! The batch is acknowledged once its events are stored; its commit row is
//! written in the background, while the gateway's next batch is inserted,
//! and waited for before the next row (so one is in flight per gateway).
//! A row only records what is already true, so losing it costs no data: a
//! failed row leaves its count to the next one, and after a crash the
//! store answers the older ack it holds. The gateway then resends from
//! there: what it already trimmed is absent from the batch (a hole, as
//! for dropped records), and what it still holds is found stored by id
//! (see [`super::events::stored_ids`]). Only a crash loses the count of
//! such events for usage.
//!
//! That id lookup costs the server about as much as the insert, so it is
//! made only while events above the ack may be stored. No event above the
//! gateway's durable reservation (`max(reserved_sequence)` of the rows
//! that landed) is ever stored: a batch reaching past it first writes a
//! commit row that raises it, and every commit row raises it a few batches
//! ahead, so in steady state this costs nothing. Hence:
//! - a session read from the database (after a restart) checks ids up to
//!   the reservation it read;
//! - after a failed insert, the session checks ids up to its reservation;
//! - otherwise nothing is stored above the ack, and no id is checked.
//!
//! Sessions are kept in memory once read or written: the workspace's lock
//! is this process's already, so no other writer can move them (one cloud
//! process per workspace, see `docs/storage.md`), and a batch then costs
//! no query for its session.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Mutex;

use async_trait::async_trait;
use clickhouse::Row;
use serde::{Deserialize, Serialize};

use super::{ClickHouseStore, DAY_MS, Sent, events, run};
use crate::error::{Error, Result};
use crate::store::NewEvent;
use crate::store::gateway::{BatchCommit, GatewaySession, GatewayStore};

/// How far past a batch each commit reserves, in batches of its span.
const RESERVE_BATCHES: u64 = 8;

/// Sequences above the ack checked for a gateway that has a session but no
/// commit rows: one acknowledged by an earlier version of this store,
/// which kept no reservation. Ten of the largest batches the receiver
/// accepts (`receiver::MAX_BATCH_EVENTS`) cover what a crash could have
/// left above its ack.
const UNRESERVED_CHECK: u64 = 100_000;

#[derive(Row, Serialize)]
struct SessionRow<'a> {
    workspace_id: &'a str,
    gateway_id: &'a str,
    epoch: u64,
    acked_sequence: u64,
    buffer_id: &'a str,
    updated_at: i64,
    version: u64,
}

#[derive(Row, Serialize)]
struct CommitRow<'a> {
    workspace_id: &'a str,
    gateway_id: &'a str,
    epoch: u64,
    acked_sequence: u64,
    reserved_sequence: u64,
    day: i64,
    events_ingested: u64,
    version: u64,
}

/// The latest `gateway_sessions` row.
#[derive(Row, Deserialize)]
struct SessionRead {
    epoch: u64,
    acked_sequence: u64,
    buffer_id: String,
    version: u64,
}

/// The latest `gateway_commits` row, and the highest reservation.
#[derive(Row, Deserialize)]
struct CommitRead {
    epoch: u64,
    acked_sequence: u64,
    version: u64,
    reserved: u64,
}

/// A gateway's session as this process knows it.
#[derive(Clone, Default)]
struct Known {
    epoch: u64,
    acked_sequence: u64,
    buffer_id: String,
    /// A durable reservation: no event of the gateway above it is stored.
    reserved: u64,
    /// Events up to it may be stored above the ack: batches below it
    /// check their ids.
    unsure_upto: u64,
    /// Events stored whose count no commit row holds yet (its write
    /// failed): the next row carries them.
    uncounted: u64,
}

impl Known {
    fn from_rows(session: Option<SessionRead>, commit: Option<CommitRead>) -> Option<Known> {
        let (reserved, unsure_upto) = match (&session, &commit) {
            (_, Some(c)) => (c.reserved, c.reserved),
            (Some(s), None) => (0, s.acked_sequence.saturating_add(UNRESERVED_CHECK)),
            (None, None) => return None,
        };
        // The later write holds the epoch and ack: a Hello, or a commit.
        let (epoch, acked_sequence) = match (&session, &commit) {
            (Some(s), Some(c)) if c.version > s.version => (c.epoch, c.acked_sequence),
            (Some(s), _) => (s.epoch, s.acked_sequence),
            (None, Some(c)) => (c.epoch, c.acked_sequence),
            (None, None) => (0, 0),
        };
        let buffer_id = session.map(|s| s.buffer_id).unwrap_or_default();
        Some(Known { epoch, acked_sequence, buffer_id, reserved, unsure_upto, uncounted: 0 })
    }
}

/// A commit row being written while the gateway's next batch goes on.
struct Pending {
    write: tokio::task::JoinHandle<Result<()>>,
    /// The reservation the row makes durable.
    reserved: u64,
    /// The events it counts.
    counted: u64,
}

type Key = (String, String);

fn key(ws: &str, gateway: &str) -> Key {
    (ws.to_owned(), gateway.to_owned())
}

/// Sessions kept in memory at most. Gateway ids are the caller's choice
/// (any key with the ingest scope may say Hello under a new one), so past
/// this a session the store holds whole is forgotten for each new one: it
/// is read back at its next use.
const MAX_KNOWN_SESSIONS: usize = 100_000;

/// Sessions as this process last read or wrote them, and the commit rows
/// in flight, by workspace and gateway.
#[derive(Default)]
pub(super) struct KnownSessions {
    known: Mutex<HashMap<Key, Known>>,
    pending: Mutex<HashMap<Key, Pending>>,
}

fn poisoned<T>(_: T) -> Error {
    Error::internal("gateway sessions poisoned")
}

impl KnownSessions {
    fn get(&self, ws: &str, gateway: &str) -> Result<Option<Known>> {
        Ok(self.known.lock().map_err(poisoned)?.get(&key(ws, gateway)).cloned())
    }

    /// `None` forgets the session: its next use reads it back.
    fn set(&self, ws: &str, gateway: &str, session: Option<Known>) -> Result<()> {
        let mut map = self.known.lock().map_err(poisoned)?;
        let key = key(ws, gateway);
        match session {
            Some(session) => {
                if map.len() >= MAX_KNOWN_SESSIONS && !map.contains_key(&key) {
                    // Only one the store holds whole: with no commit row
                    // in flight and no events uncounted.
                    let pending = self.pending.lock().map_err(poisoned)?;
                    let whole = map
                        .iter()
                        .find(|(k, known)| known.uncounted == 0 && !pending.contains_key(*k));
                    if let Some(gone) = whole.map(|(k, _)| k.clone()) {
                        map.remove(&gone);
                    }
                }
                map.insert(key, session);
            }
            None => {
                map.remove(&key);
            }
        }
        Ok(())
    }

    fn take_pending(&self, ws: &str, gateway: &str) -> Result<Option<Pending>> {
        Ok(self.pending.lock().map_err(poisoned)?.remove(&key(ws, gateway)))
    }

    fn set_pending(&self, ws: &str, gateway: &str, pending: Pending) -> Result<()> {
        self.pending.lock().map_err(poisoned)?.insert(key(ws, gateway), pending);
        Ok(())
    }

    /// The keys with a commit row in flight, of workspace `ws` (all with
    /// `None`).
    fn with_pending(&self, ws: Option<&str>) -> Result<Vec<Key>> {
        let pending = self.pending.lock().map_err(poisoned)?;
        Ok(pending.keys().filter(|(w, _)| ws.is_none_or(|ws| w == ws)).cloned().collect())
    }

    /// The keys whose sessions hold uncounted events, of workspace `ws`
    /// (all with `None`).
    fn with_uncounted(&self, ws: Option<&str>) -> Result<Vec<(Key, u64)>> {
        let known = self.known.lock().map_err(poisoned)?;
        Ok(known
            .iter()
            .filter(|((w, _), k)| k.uncounted > 0 && ws.is_none_or(|ws| w == ws))
            .map(|(key, k)| (key.clone(), k.uncounted))
            .collect())
    }
}

/// One `gateway_commits` row, before its day is stamped.
#[derive(Clone, Copy)]
struct Commit {
    epoch: u64,
    acked_sequence: u64,
    reserved_sequence: u64,
    events_ingested: u64,
    version: u64,
}

impl ClickHouseStore {
    async fn load_session(&self, ws: &str, gateway: &str) -> Result<Option<Known>> {
        if let Some(known) = self.sessions.get(ws, gateway)? {
            return Ok(Some(known));
        }
        let sessions = self
            .client
            .query(
                "SELECT argMax(epoch, version), argMax(acked_sequence, version),
                    argMax(buffer_id, version), max(version)
                 FROM gateway_sessions WHERE workspace_id = ? AND gateway_id = ?
                 GROUP BY workspace_id, gateway_id",
            )
            .bind(ws)
            .bind(gateway);
        let commits = self
            .client
            .query(
                "SELECT argMax(epoch, version), argMax(acked_sequence, version), max(version),
                    max(reserved_sequence)
                 FROM gateway_commits WHERE workspace_id = ? AND gateway_id = ?
                 GROUP BY workspace_id, gateway_id",
            )
            .bind(ws)
            .bind(gateway);
        let (sessions, commits): (Vec<SessionRead>, Vec<CommitRead>) =
            tokio::try_join!(run(sessions.sent().fetch_all()), run(commits.sent().fetch_all()))?;
        let known = Known::from_rows(sessions.into_iter().next(), commits.into_iter().next());
        if known.is_some() {
            self.sessions.set(ws, gateway, known.clone())?;
        }
        Ok(known)
    }

    /// Writes a Hello's session; a failed write forgets it, as it may
    /// still have landed.
    async fn save_session(&self, ws: &str, gateway: &str, known: Known) -> Result<()> {
        let row = SessionRow {
            workspace_id: ws,
            gateway_id: gateway,
            epoch: known.epoch,
            acked_sequence: known.acked_sequence,
            buffer_id: &known.buffer_id,
            updated_at: crate::now_ms(),
            version: self.clock.next(),
        };
        let saved = self.insert_rows::<SessionRow<'_>>("gateway_sessions", &[row]).await;
        self.sessions.set(ws, gateway, saved.is_ok().then_some(known))?;
        saved
    }

    /// The write of one commit row, owning what it needs, so that it can
    /// run as a task of its own.
    fn commit_write(
        &self,
        ws: &str,
        gateway: &str,
        commit: Commit,
    ) -> Result<impl Future<Output = Result<()>> + Send + 'static> {
        let inserter = self.inserter("gateway_commits")?;
        let (ws, gateway) = (ws.to_owned(), gateway.to_owned());
        let day = crate::now_ms().div_euclid(DAY_MS);
        Ok(async move {
            let row = CommitRow {
                workspace_id: &ws,
                gateway_id: &gateway,
                epoch: commit.epoch,
                acked_sequence: commit.acked_sequence,
                reserved_sequence: commit.reserved_sequence,
                day,
                events_ingested: commit.events_ingested,
                version: commit.version,
            };
            inserter.insert::<CommitRow<'_>>("gateway_commits", &[row]).await
        })
    }

    /// Waits for the gateway's commit row in flight, if any. A row that
    /// landed makes its reservation durable; one that failed leaves its
    /// count to the next row, and its ack to the next row (or, after a
    /// restart, to the id check up to the reservation).
    async fn settle(&self, ws: &str, gateway: &str, known: &mut Known) -> Result<()> {
        let Some(pending) = self.sessions.take_pending(ws, gateway)? else { return Ok(()) };
        let failure = match pending.write.await {
            Ok(Ok(())) => {
                known.reserved = known.reserved.max(pending.reserved);
                return Ok(());
            }
            Ok(Err(e)) => e.to_string(),
            Err(e) => e.to_string(),
        };
        tracing::warn!(
            workspace = %ws, gateway = %gateway, error = %failure,
            "a gateway commit row failed; the next one carries its count"
        );
        known.uncounted = known.uncounted.saturating_add(pending.counted);
        Ok(())
    }

    /// Settles the commit rows in flight of workspace `ws` (every
    /// workspace with `None`), under each workspace's lock.
    async fn settle_all(&self, ws: Option<&str>) -> Result<()> {
        for (ws, gateway) in self.sessions.with_pending(ws)? {
            let lock = self.lock_for(&ws)?;
            let _guard = lock.lock().await;
            let known = self.sessions.get(&ws, &gateway)?;
            let mut settled = known.clone().unwrap_or_default();
            self.settle(&ws, &gateway, &mut settled).await?;
            // A forgotten session is read back at its next use.
            if known.is_some() {
                self.sessions.set(&ws, &gateway, Some(settled))?;
            }
        }
        Ok(())
    }

    /// Events of workspace `ws` stored by gateway batches whose commit
    /// rows did not land yet: usage adds them, so that it never lags.
    pub(super) async fn uncounted_gateway_events(&self, ws: &str) -> Result<u64> {
        self.settle_all(Some(ws)).await?;
        Ok(self.sessions.with_uncounted(Some(ws))?.iter().map(|(_, n)| n).sum())
    }

    /// Waits for every commit row in flight and writes the counts of
    /// failed ones: on shutdown, so that a restart reads the acks sent and
    /// checks no ids, and wherever the rows must be on the server.
    pub async fn flush_gateway_commits(&self) -> Result<()> {
        self.settle_all(None).await?;
        for ((ws, gateway), _) in self.sessions.with_uncounted(None)? {
            let lock = self.lock_for(&ws)?;
            let _guard = lock.lock().await;
            let Some(mut known) = self.sessions.get(&ws, &gateway)? else { continue };
            let commit = Commit {
                epoch: known.epoch,
                acked_sequence: known.acked_sequence,
                reserved_sequence: known.reserved,
                events_ingested: known.uncounted,
                version: self.clock.next(),
            };
            self.commit_write(&ws, &gateway, commit)?.await?;
            known.uncounted = 0;
            self.sessions.set(&ws, &gateway, Some(known))?;
        }
        Ok(())
    }

    /// Stores an admitted batch: the events above `acked`, then starts its
    /// commit row, which the next batch (or a usage read, or shutdown)
    /// waits for. The batch counts as stored once its events are: the row
    /// only records that, and a crash before it lands is covered by the
    /// reservation. Returns the events stored.
    async fn store_batch(
        &self,
        (ws, gateway): (&str, &str),
        known: &mut Known,
        acked: u64,
        (first, last): (u64, u64),
        batch: Vec<(u64, NewEvent)>,
        limit: Option<u64>,
    ) -> Result<usize> {
        let span = last.saturating_sub(first).saturating_add(1);
        let ahead = last.saturating_add(span.saturating_mul(RESERVE_BATCHES));
        if last > known.reserved {
            // The row in flight may raise it.
            self.settle(ws, gateway, known).await?;
        }
        if last > known.reserved {
            // Durable before any event above the old reservation is.
            let commit = Commit {
                epoch: known.epoch,
                acked_sequence: acked,
                reserved_sequence: ahead,
                events_ingested: known.uncounted,
                version: self.clock.next(),
            };
            self.commit_write(ws, gateway, commit)?.await?;
            known.reserved = ahead;
            known.uncounted = 0;
        }
        let fresh: Vec<_> = batch
            .into_iter()
            .filter(|(seq, _)| *seq > acked)
            .map(|(_, event)| events::to_row(ws, event))
            .collect();
        let check_ids = known.unsure_upto > acked;
        let mut landed = 0;
        let stored = if fresh.is_empty() {
            Ok(0)
        } else {
            events::store_rows_uncounted(self, ws, fresh, check_ids, limit, &mut landed)
                .await
                .map(|s| s.1)
        };
        // Events that landed before a failure are counted by the next row:
        // the resend finds them by id and stores none of them.
        known.uncounted = known.uncounted.saturating_add(landed as u64);
        let inserted = stored?;
        // One row in flight per gateway: the previous one has had this
        // batch's insert to land.
        self.settle(ws, gateway, known).await?;
        let commit = Commit {
            epoch: known.epoch,
            acked_sequence: last,
            reserved_sequence: known.reserved.max(ahead),
            events_ingested: known.uncounted,
            version: self.clock.next(),
        };
        let write = tokio::spawn(self.commit_write(ws, gateway, commit)?);
        let pending =
            Pending { write, reserved: commit.reserved_sequence, counted: commit.events_ingested };
        self.sessions.set_pending(ws, gateway, pending)?;
        known.uncounted = 0;
        known.acked_sequence = last;
        Ok(inserted)
    }
}

#[async_trait]
impl GatewayStore for ClickHouseStore {
    async fn open_gateway_session(
        &self,
        workspace_id: &str,
        gateway_id: &str,
        buffer_id: &str,
    ) -> Result<GatewaySession> {
        let lock = self.lock_for(workspace_id)?;
        let _guard = lock.lock().await;
        let mut known = self.load_session(workspace_id, gateway_id).await?.unwrap_or_default();
        let recreated =
            !known.buffer_id.is_empty() && !buffer_id.is_empty() && known.buffer_id != buffer_id;
        if recreated {
            tracing::warn!(
                workspace = %workspace_id, gateway = %gateway_id,
                previous_ack = known.acked_sequence,
                "gateway presents a new buffer: its sequences restart at 1"
            );
            known.acked_sequence = 0;
            // Whatever an earlier buffer stored lies below the reservation:
            // a replay of it is found by id.
            known.unsure_upto = known.unsure_upto.max(known.reserved);
        }
        known.epoch += 1;
        if !buffer_id.is_empty() {
            known.buffer_id = buffer_id.into();
        }
        let session = GatewaySession { epoch: known.epoch, acked_sequence: known.acked_sequence };
        self.save_session(workspace_id, gateway_id, known).await?;
        Ok(session)
    }

    async fn commit_gateway_batch(
        &self,
        workspace_id: &str,
        gateway_id: &str,
        epoch: u64,
        (first, last): (u64, u64),
        batch: Vec<(u64, NewEvent)>,
        new_event_limit: Option<u64>,
    ) -> Result<BatchCommit> {
        let lock = self.lock_for(workspace_id)?;
        let _guard = lock.lock().await;
        let mut known = self.load_session(workspace_id, gateway_id).await?.unwrap_or_default();
        let acked =
            match BatchCommit::admit(known.epoch, known.acked_sequence, epoch, (first, last)) {
                Ok(acked) => acked,
                Err(answer) => return Ok(answer),
            };
        let ids = (workspace_id, gateway_id);
        let stored =
            self.store_batch(ids, &mut known, acked, (first, last), batch, new_event_limit).await;
        if stored.is_err() {
            // Some of its events may have landed, none above the
            // reservation: the redelivery checks ids up to it.
            known.unsure_upto = known.unsure_upto.max(known.reserved);
        }
        self.sessions.set(workspace_id, gateway_id, Some(known))?;
        Ok(BatchCommit::Acked { acked_sequence: last, inserted: stored? })
    }
}

#[cfg(test)]
mod tests {
    use opgraph_tests::clickhouse::ClickHouse;

    use super::{Known, KnownSessions, MAX_KNOWN_SESSIONS};

    #[test]
    fn sessions_kept_in_memory_are_bounded_and_never_lose_a_count() {
        let sessions = KnownSessions::default();
        let owing = Known { uncounted: 7, ..Known::default() };
        sessions.set(WS, "gw-owing", Some(owing)).unwrap();
        for n in 0..MAX_KNOWN_SESSIONS + 100 {
            sessions.set(WS, &format!("gw-{n}"), Some(Known::default())).unwrap();
        }
        assert_eq!(sessions.known.lock().unwrap().len(), MAX_KNOWN_SESSIONS);
        let kept = sessions.get(WS, "gw-owing").unwrap();
        assert_eq!(kept.map(|k| k.uncounted), Some(7), "its count is only in memory");
        assert!(sessions.get(WS, &format!("gw-{}", MAX_KNOWN_SESSIONS + 99)).unwrap().is_some());
    }

    use super::super::{ClickHouseConfig, ClickHouseStore, events};
    use super::SessionRow;
    use crate::store::gateway::{BatchCommit, GatewayStore};
    use crate::store::queries::QueryStore;
    use crate::store::{NewEvent, Store};

    const WS: &str = "ws_gateway";
    const GW: &str = "gw-1";

    fn batch(seqs: std::ops::RangeInclusive<u64>) -> Vec<(u64, NewEvent)> {
        let event =
            opgraph_proto::Event::parse_json(&serde_json::json!({"event": "tote.moved"})).unwrap();
        seqs.map(|seq| {
            (seq, NewEvent { id: format!("evt_{seq:04}"), received_at: 1, event: event.clone() })
        })
        .collect()
    }

    async fn open(server: &ClickHouse) -> ClickHouseStore {
        let config = ClickHouseConfig {
            url: server.url(),
            database: "opgraph".into(),
            cluster: None,
            ca_file: None,
        };
        ClickHouseStore::open(&config).await.unwrap()
    }

    /// How many id lookups named the event of sequence `seq`.
    async fn lookups_of(store: &ClickHouseStore, seq: u64) -> u64 {
        let like = format!("SELECT id, seq FROM events%'evt_{seq:04}'%");
        super::super::tests::queries_logged(&store.client, &like).await
    }

    /// Opens the gateway's session and stores events 1..=3; returns the epoch.
    async fn first_batch(store: &ClickHouseStore) -> u64 {
        let epoch = store.open_gateway_session(WS, GW, "buf-1").await.unwrap().epoch;
        let commit = store.commit_gateway_batch(WS, GW, epoch, (1, 3), batch(1..=3), None);
        assert_eq!(commit.await.unwrap(), BatchCommit::Acked { acked_sequence: 3, inserted: 3 });
        store.flush_gateway_commits().await.unwrap();
        epoch
    }

    /// After [`first_batch`], stores 4..=6 with `gateway_commits` detached:
    /// the batch is acknowledged, its commit row fails. Returns the epoch.
    async fn acked_without_a_commit_row(store: &ClickHouseStore) -> u64 {
        let epoch = first_batch(store).await;
        store.client.query("DETACH TABLE gateway_commits").execute().await.unwrap();
        let commit = store.commit_gateway_batch(WS, GW, epoch, (4, 6), batch(4..=6), None);
        assert_eq!(commit.await.unwrap(), BatchCommit::Acked { acked_sequence: 6, inserted: 3 });
        store.flush_gateway_commits().await.unwrap_err();
        store.client.query("ATTACH TABLE gateway_commits").execute().await.unwrap();
        epoch
    }

    /// Events counted by the commit rows on the server.
    async fn counted(store: &ClickHouseStore) -> u64 {
        let sql = "SELECT sum(events_ingested) FROM gateway_commits";
        store.client.query(sql).fetch_one().await.unwrap()
    }

    async fn stored(store: &ClickHouseStore) -> u64 {
        store.client.query("SELECT count() FROM events").fetch_one().await.unwrap()
    }

    /// Events that landed without their commit row (a crash between the
    /// two) are found by id after a restart, up to the reservation; past
    /// it, and in a process whose own commits all succeeded, no id is
    /// looked up.
    #[tokio::test]
    async fn ids_are_checked_only_where_an_event_may_be_stored() {
        let server = ClickHouse::start_logging_queries().await.unwrap();
        let before = open(&server).await;
        let epoch = first_batch(&before).await;
        // 4..=6 land, their commit row does not.
        let rows = batch(4..=6).into_iter().map(|(_, e)| events::to_row(WS, e)).collect();
        events::store_rows_uncounted(&before, WS, rows, false, None, &mut 0).await.unwrap();
        assert_eq!(lookups_of(&before, 1).await, 0, "a new gateway has nothing stored");

        let after = open(&server).await;
        let commit = after.commit_gateway_batch(WS, GW, epoch, (4, 6), batch(4..=6), None);
        assert_eq!(commit.await.unwrap(), BatchCommit::Acked { acked_sequence: 6, inserted: 0 });
        assert_eq!(stored(&after).await, 6);
        assert_eq!(lookups_of(&after, 4).await, 1);
        // Up to the reservation the first process made (3 + 8 * 3), ids
        // are checked; above it they need not be.
        let commit = after.commit_gateway_batch(WS, GW, epoch, (7, 30), batch(7..=30), None);
        assert_eq!(commit.await.unwrap(), BatchCommit::Acked { acked_sequence: 30, inserted: 24 });
        assert_eq!(lookups_of(&after, 7).await, 1);
        let commit = after.commit_gateway_batch(WS, GW, epoch, (31, 40), batch(31..=40), None);
        assert_eq!(commit.await.unwrap(), BatchCommit::Acked { acked_sequence: 40, inserted: 10 });
        assert_eq!(lookups_of(&after, 31).await, 0);
        assert_eq!(stored(&after).await, 40);

        // Usage counts what each batch stored, once.
        let usage = after.usage(WS, 0, i64::MAX / 2).await.unwrap();
        assert_eq!(usage.events_ingested, 3 + 24 + 10);
    }

    /// A batch is acknowledged once its events are stored; its commit row
    /// follows. One that fails (the table is detached meanwhile) leaves
    /// its count to the next row, and usage counts it meanwhile.
    #[tokio::test]
    async fn a_failed_commit_row_leaves_its_count_to_the_next() {
        let server = ClickHouse::start().await.unwrap();
        let store = open(&server).await;
        let epoch = acked_without_a_commit_row(&store).await;
        assert_eq!(counted(&store).await, 3, "the row of 4..=6 failed");
        assert_eq!(store.usage(WS, 0, i64::MAX / 2).await.unwrap().events_ingested, 6);

        let commit = store.commit_gateway_batch(WS, GW, epoch, (7, 9), batch(7..=9), None);
        assert_eq!(commit.await.unwrap(), BatchCommit::Acked { acked_sequence: 9, inserted: 3 });
        store.close().await.unwrap();
        assert_eq!(counted(&store).await, 9);
        assert_eq!(store.usage(WS, 0, i64::MAX / 2).await.unwrap().events_ingested, 9);
        assert_eq!(stored(&store).await, 9);
    }

    /// A crash after a batch was acknowledged but before its commit row
    /// landed: the restarted store answers the older ack; the gateway
    /// resends from there, without what it trimmed, and what it still
    /// holds is found by id.
    #[tokio::test]
    async fn after_a_lost_commit_row_the_resend_stores_only_what_is_new() {
        let server = ClickHouse::start().await.unwrap();
        let before = open(&server).await;
        acked_without_a_commit_row(&before).await;
        drop(before);

        let after = open(&server).await;
        let session = after.open_gateway_session(WS, GW, "buf-1").await.unwrap();
        assert_eq!(session.acked_sequence, 3);
        // 4 was trimmed after its ack; 5 and 6 were not yet.
        let resend = batch(5..=10);
        let commit = after.commit_gateway_batch(WS, GW, session.epoch, (4, 10), resend, None);
        assert_eq!(commit.await.unwrap(), BatchCommit::Acked { acked_sequence: 10, inserted: 4 });
        assert_eq!(stored(&after).await, 10);
    }

    /// An attempt whose events landed but whose derived rows did not (the
    /// entity observations failed, so the business was never registered;
    /// the `messageId` ledger rows come before the events): the resend
    /// finds the events by id and registers the business, a later event
    /// with one of those `messageId`s is known as a replay, and the events
    /// count for usage once.
    #[tokio::test]
    async fn a_resend_restores_what_a_failed_attempt_lost_and_counts_it_once() {
        let server = ClickHouse::start().await.unwrap();
        let store = open(&server).await;
        let tote = |seq: u64| {
            let event = opgraph_proto::Event::parse_json(&serde_json::json!({
                "event": "tote.moved", "messageId": format!("m-{seq}"), "businessId": "site-7",
                "entity": {"type": "tote", "id": format!("T-{seq}")},
            }))
            .unwrap();
            NewEvent { id: format!("evt_{seq:04}"), received_at: 1, event }
        };
        let batch = || (1..=3).map(|seq| (seq, tote(seq))).collect::<Vec<_>>();
        let ledger = "SELECT count(DISTINCT message_id) FROM message_ids";
        let business = "SELECT count() FROM businesses WHERE id = 'site-7'";
        let epoch = store.open_gateway_session(WS, GW, "buf-1").await.unwrap().epoch;
        store.client.query("DETACH TABLE entity_observations").execute().await.unwrap();
        store.commit_gateway_batch(WS, GW, epoch, (1, 3), batch(), None).await.unwrap_err();
        store.client.query("ATTACH TABLE entity_observations").execute().await.unwrap();
        assert_eq!(stored(&store).await, 3);
        assert_eq!(store.client.query(ledger).fetch_one::<u64>().await.unwrap(), 3);
        assert_eq!(store.client.query(business).fetch_one::<u64>().await.unwrap(), 0);

        let commit = store.commit_gateway_batch(WS, GW, epoch, (1, 3), batch(), None);
        assert_eq!(commit.await.unwrap(), BatchCommit::Acked { acked_sequence: 3, inserted: 0 });
        // The failed attempt's events are counted once, by the resend's row.
        assert_eq!(store.usage(WS, 0, i64::MAX / 2).await.unwrap().events_ingested, 3);
        assert_eq!(store.client.query(ledger).fetch_one::<u64>().await.unwrap(), 3);
        assert_eq!(store.client.query(business).fetch_one::<u64>().await.unwrap(), 1);
        // The same message under another id, as an HTTP retry would send it.
        let mut replay = tote(2);
        replay.id = "evt_other".into();
        let rows = vec![events::to_row(WS, replay)];
        let mut landed = 0;
        let replayed = events::store_rows_uncounted(&store, WS, rows, true, None, &mut landed);
        let (ids, inserted) = replayed.await.unwrap();
        assert_eq!((ids, inserted), (vec!["evt_0002".to_owned()], 0));
        assert_eq!(stored(&store).await, 3);
    }

    /// Events observing an entity and an edge (scanner → tote).
    fn observing(seqs: std::ops::RangeInclusive<u64>) -> Vec<(u64, NewEvent)> {
        seqs.map(|seq| {
            let event = opgraph_proto::Event::parse_json(&serde_json::json!({
                "event": "tote.scanned",
                "actor": {"type": "scanner", "id": "S-1"},
                "object": {"type": "tote", "id": format!("T-{seq}")},
                "entity": {"type": "tote", "id": format!("T-{seq}"),
                           "properties": {"zone": format!("z{seq}")}},
            }))
            .unwrap();
            (seq, NewEvent { id: format!("evt_{seq:04}"), received_at: 1, event })
        })
        .collect()
    }

    /// Per edge, its count; and the entities with their `zone`.
    async fn graph(store: &ClickHouseStore) -> (Vec<(String, u64)>, Vec<(String, String)>) {
        let edges = store.list_relationships(WS, None, 100).await.unwrap();
        let mut edges: Vec<_> = edges.into_iter().map(|r| (r.to_id, r.count)).collect();
        edges.sort();
        let entities = store.list_entities(WS, None, 100).await.unwrap();
        let mut entities: Vec<_> =
            entities.into_iter().map(|e| (e.id, e.properties["zone"].to_string())).collect();
        entities.sort();
        (edges, entities)
    }

    /// An attempt that failed after its events (and, in the first case,
    /// its edges) landed: the resend writes the missing observations, and
    /// every edge still counts once. A complete attempt's resend writes
    /// nothing again.
    #[tokio::test]
    async fn a_resend_restores_lost_observations_and_counts_each_edge_once() {
        let server = ClickHouse::start().await.unwrap();
        let store = open(&server).await;
        let epoch = store.open_gateway_session(WS, GW, "buf-1").await.unwrap().epoch;
        let expected = |range: std::ops::RangeInclusive<u64>| {
            let edges = range.clone().map(|s| (format!("T-{s}"), 1)).collect::<Vec<_>>();
            let entities = range.map(|s| (format!("T-{s}"), format!("\"z{s}\""))).collect();
            (edges, entities)
        };
        let rows = "SELECT count() FROM relationship_observations";

        // The entity rows failed after the edges landed.
        store.client.query("DETACH TABLE entity_observations").execute().await.unwrap();
        store
            .commit_gateway_batch(WS, GW, epoch, (1, 2), observing(1..=2), None)
            .await
            .unwrap_err();
        store.client.query("ATTACH TABLE entity_observations").execute().await.unwrap();
        assert_eq!(store.client.query(rows).fetch_one::<u64>().await.unwrap(), 2);
        assert!(store.list_entities(WS, None, 100).await.unwrap().is_empty());
        let commit = store.commit_gateway_batch(WS, GW, epoch, (1, 2), observing(1..=2), None);
        assert_eq!(commit.await.unwrap(), BatchCommit::Acked { acked_sequence: 2, inserted: 0 });
        // Both edges were written again, under their events' seq.
        assert_eq!(store.client.query(rows).fetch_one::<u64>().await.unwrap(), 4);
        assert_eq!(graph(&store).await, expected(1..=2));

        // No observation landed.
        store.client.query("DETACH TABLE relationship_observations").execute().await.unwrap();
        store
            .commit_gateway_batch(WS, GW, epoch, (3, 4), observing(3..=4), None)
            .await
            .unwrap_err();
        store.client.query("ATTACH TABLE relationship_observations").execute().await.unwrap();
        let commit = store.commit_gateway_batch(WS, GW, epoch, (3, 4), observing(3..=4), None);
        assert_eq!(commit.await.unwrap(), BatchCommit::Acked { acked_sequence: 4, inserted: 0 });
        assert_eq!(graph(&store).await, expected(1..=4));

        // A complete batch resent (its ack lost): nothing is written again.
        let before = store.client.query(rows).fetch_one::<u64>().await.unwrap();
        let mut landed = 0;
        let resent = events::store_rows_uncounted(
            &store,
            WS,
            observing(3..=4).into_iter().map(|(_, e)| events::to_row(WS, e)).collect(),
            true,
            None,
            &mut landed,
        );
        assert_eq!(resent.await.unwrap().1, 0);
        assert_eq!(store.client.query(rows).fetch_one::<u64>().await.unwrap(), before);
        assert_eq!(graph(&store).await, expected(1..=4));
    }

    /// A session acknowledged before `gateway_commits` existed (a
    /// `gateway_sessions` row, no commit rows) has no reservation: events
    /// above its ack are checked by id.
    #[tokio::test]
    async fn a_session_without_commit_rows_checks_ids_above_its_ack() {
        let server = ClickHouse::start().await.unwrap();
        let before = open(&server).await;
        let old = SessionRow {
            workspace_id: WS,
            gateway_id: GW,
            epoch: 1,
            acked_sequence: 3,
            buffer_id: "buf-1",
            updated_at: 1,
            version: before.clock.next(),
        };
        before.insert_rows::<SessionRow<'_>>("gateway_sessions", &[old]).await.unwrap();
        // The old store's crash left 4..=6 above its ack.
        let rows = batch(1..=6).into_iter().map(|(_, e)| events::to_row(WS, e)).collect();
        events::store_rows_uncounted(&before, WS, rows, false, None, &mut 0).await.unwrap();

        let after = open(&server).await;
        let commit = after.commit_gateway_batch(WS, GW, 1, (4, 8), batch(4..=8), None);
        assert_eq!(commit.await.unwrap(), BatchCommit::Acked { acked_sequence: 8, inserted: 2 });
        assert_eq!(stored(&after).await, 8);
    }
}
