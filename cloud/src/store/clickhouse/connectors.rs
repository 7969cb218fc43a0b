//! Connector records on ClickHouse: `(workspace, provider, record id) →
//! event id` in a ReplacingMergeTree, the sync log append-only, and the
//! replacement of a known record's event.
//!
//! ClickHouse cannot update a row in place, and a record's new version may
//! change what the events table is ordered by (a Stripe charge's status is
//! its event name, a Salesforce opportunity's time its last change). So a
//! known record's event is deleted with a mutation, and the call waits
//! until the mutation has removed it before inserting the new version under
//! the same id through `events::insert_new`, the path every event takes.
//! A reader may therefore miss the record for that moment, but never sees
//! it twice. Its edge observation goes the same way unless the new version
//! observes the same edge (the usual re-sync), which then stays in place.
//!
//! Order of writes, for a crash at any point (the client retries a call
//! that was not answered): the record → event id rows first, then the
//! deletions, then the events, usage and the sync record last. A retry
//! therefore finds every record with the id it was given, and a record
//! whose event is not stored (a crash before the insert) counts as new.
//!
//! The caller holds the workspace's lock, which appends take too.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use clickhouse::Row;
use serde::{Deserialize, Serialize};

use super::events::{EventRow, LOOKUP_CHUNK, insert_new, placeholders, to_row};
use super::graph::{Edge, edge_of};
use super::{ClickHouseStore, QUERY_TIMEOUT, RETRY_AFTER_SECS, Sent, run};
use crate::error::{Error, Result};
use crate::store::NewEvent;
use crate::store::connectors::{ConnectorRecord, ConnectorStore, ConnectorUpsert, SyncRecord};
use crate::store::queries::ConnectorLoad;

/// First pause between two looks at a running mutation; doubled up to
/// [`MUTATION_POLL_MAX`].
const MUTATION_POLL: Duration = Duration::from_millis(5);
const MUTATION_POLL_MAX: Duration = Duration::from_millis(200);

#[derive(Row, Serialize)]
struct RecordRow<'a> {
    workspace_id: &'a str,
    provider: &'a str,
    record_id: &'a str,
    event_id: &'a str,
    first_synced_at: i64,
    last_synced_at: i64,
    syncs: u64,
    version: u64,
}

#[derive(Row, Deserialize)]
struct RecordRead {
    record_id: String,
    event_id: String,
    first_synced_at: i64,
    syncs: u64,
}

#[derive(Row, Serialize, Deserialize)]
struct SyncRow {
    workspace_id: String,
    id: String,
    provider: String,
    business_id: String,
    received: u64,
    ingested: u64,
    updated: u64,
    rejected: u64,
    created_at: i64,
}

#[derive(Row, Deserialize)]
struct LoadRead {
    provider: String,
    syncs: u64,
    received: u64,
    ingested: u64,
    updated: u64,
    rejected: u64,
    last_sync_at: i64,
}

/// The sync log's rows, one per id even if an insert reached the server
/// twice; columns named apart from the table's so that `WHERE` reads the
/// table's.
const SYNCS_BY_ID: &str = "SELECT any(workspace_id) AS s_workspace_id, id,
        any(provider) AS s_provider, any(business_id) AS s_business_id,
        any(received) AS s_received, any(ingested) AS s_ingested, any(updated) AS s_updated,
        any(rejected) AS s_rejected, any(created_at) AS s_created_at
    FROM connector_syncs";

/// A record of the call: its latest version and how often it came.
struct Incoming {
    event: NewEvent,
    occurrences: u64,
}

/// The stored mapping of these records of `provider`.
async fn known_records(
    store: &ClickHouseStore,
    ws: &str,
    provider: &str,
    record_ids: &[&str],
) -> Result<HashMap<String, RecordRead>> {
    let mut known = HashMap::new();
    for chunk in record_ids.chunks(LOOKUP_CHUNK) {
        let sql = format!(
            "SELECT record_id, argMax(event_id, version), argMax(first_synced_at, version),
                argMax(syncs, version)
             FROM connector_records
             WHERE workspace_id = ? AND provider = ? AND record_id IN ({})
             GROUP BY record_id",
            placeholders(chunk.len())
        );
        let mut query = store.client.query(&sql).bind(ws).bind(provider);
        for id in chunk {
            query = query.bind(*id);
        }
        let rows: Vec<RecordRead> = run(query.sent().fetch_all()).await?;
        known.extend(rows.into_iter().map(|r| (r.record_id.clone(), r)));
    }
    Ok(known)
}

/// The stored events with these ids.
async fn stored_events(store: &ClickHouseStore, ws: &str, ids: &[&str]) -> Result<Vec<EventRow>> {
    let mut found = Vec::new();
    for chunk in ids.chunks(LOOKUP_CHUNK) {
        // `EventRow` has the table's columns in the table's order.
        let sql = format!(
            "SELECT * FROM events WHERE workspace_id = ? AND id IN ({})",
            placeholders(chunk.len())
        );
        let mut query = store.client.query(&sql).bind(ws);
        for id in chunk {
            query = query.bind(*id);
        }
        found.extend(run(query.sent().fetch_all::<EventRow>()).await?);
    }
    Ok(found)
}

/// Deletes the rows of `table` matching `condition` (with `?` for
/// `binds`) and returns once no reader can see them. ClickHouse 18.16 runs
/// a mutation in the background and cannot be asked to wait
/// (`mutations_sync` is newer), so the rows themselves are watched: gone
/// from every part is what matters here.
async fn delete_and_wait(
    store: &ClickHouseStore,
    table: &str,
    condition: &str,
    binds: &[String],
) -> Result<()> {
    let query = |sql: &str| {
        let mut query = store.client.query(sql);
        for bind in binds {
            query = query.bind(bind.as_str());
        }
        query.sent()
    };
    // A Distributed table takes no mutation: on a cluster the local tables
    // do, on every shard.
    let target = match &store.cluster {
        Some(cluster) => cluster.local_table(table),
        None => table.to_owned(),
    };
    run(query(&format!("ALTER TABLE {target} DELETE WHERE {condition}")).execute()).await?;
    let deadline = Instant::now() + QUERY_TIMEOUT;
    let mut pause = MUTATION_POLL;
    loop {
        let left: u64 =
            run(query(&format!("SELECT count() FROM {table} WHERE {condition}")).fetch_one())
                .await?;
        if left == 0 {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(Error::Unavailable { retry_after_secs: RETRY_AFTER_SECS });
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(MUTATION_POLL_MAX);
    }
}

/// `(?, ?, ?, ?, ?, ?)` with an edge's values, for a tuple `IN` list.
fn edge_binds(edge: &Edge, binds: &mut Vec<String>) {
    binds.extend([
        edge.from_type.clone(),
        edge.from_id.clone(),
        edge.relation.clone(),
        edge.to_type.clone(),
        edge.to_id.clone(),
        edge.ts.to_string(),
    ]);
}

#[derive(Row, Deserialize)]
struct EdgeCount {
    from_type: String,
    from_id: String,
    relation: String,
    to_type: String,
    to_id: String,
    ts: i64,
    seq: u64,
    count: u64,
}

/// Takes one observation away from `relationship_observations` for each
/// edge of `gone` (an edge twice, two). An observation is one `seq` (its
/// repeats by a resend included) or one row of `seq` 0 (stored before
/// schema version 3); which one of identical edges goes does not matter.
/// The matching rows are all deleted and the others written back, one row
/// per `seq`.
async fn forget_edges(store: &ClickHouseStore, ws: &str, gone: &[Edge]) -> Result<()> {
    let mut taken: HashMap<&Edge, u64> = HashMap::new();
    for edge in gone {
        *taken.entry(edge).or_default() += 1;
    }
    let distinct: Vec<&Edge> = taken.keys().copied().collect();
    for chunk in distinct.chunks(LOOKUP_CHUNK) {
        let condition = format!(
            "workspace_id = ? AND (from_type, from_id, relation, to_type, to_id, toString(ts))
                IN ({})",
            vec!["(?, ?, ?, ?, ?, ?)"; chunk.len()].join(", ")
        );
        let mut binds = vec![ws.to_owned()];
        for edge in chunk {
            edge_binds(edge, &mut binds);
        }
        let sql = format!(
            "SELECT from_type, from_id, relation, to_type, to_id, ts, seq, count()
             FROM relationship_observations WHERE {condition}
             GROUP BY from_type, from_id, relation, to_type, to_id, ts, seq"
        );
        let mut query = store.client.query(&sql);
        for bind in &binds {
            query = query.bind(bind.as_str());
        }
        let counts: Vec<EdgeCount> = run(query.sent().fetch_all()).await?;
        delete_and_wait(store, "relationship_observations", &condition, &binds).await?;
        let mut observations: Vec<(Edge, u64)> = Vec::new();
        for c in counts {
            let edge = Edge {
                from_type: c.from_type,
                from_id: c.from_id,
                relation: c.relation,
                to_type: c.to_type,
                to_id: c.to_id,
                ts: c.ts,
            };
            let units = if c.seq == 0 { c.count } else { 1 };
            observations.extend((0..units).map(|_| (edge.clone(), c.seq)));
        }
        let mut kept = Vec::new();
        for (edge, seq) in &observations {
            match taken.get_mut(edge) {
                Some(left) if *left > 0 => *left -= 1,
                _ => kept.push(edge.row(ws, *seq)),
            }
        }
        store.insert_rows::<super::graph::EdgeRow<'_>>("relationship_observations", &kept).await?;
    }
    Ok(())
}

/// [`ConnectorStore::upsert_connector_records`]; the caller holds the
/// workspace's lock.
async fn upsert(
    store: &ClickHouseStore,
    ws: &str,
    records: Vec<ConnectorRecord>,
    mut sync: SyncRecord,
    new_event_limit: Option<u64>,
) -> Result<ConnectorUpsert> {
    let now = crate::now_ms();
    let provider = sync.provider.clone();
    // A record repeated within the call is an update of its earlier
    // occurrence: only its latest version is stored.
    let order: Vec<String> = records.iter().map(|r| r.record_id.clone()).collect();
    let mut incoming: HashMap<String, Incoming> = HashMap::new();
    let mut first_seen: Vec<String> = Vec::new();
    for ConnectorRecord { record_id, event } in records {
        match incoming.get_mut(&record_id) {
            Some(known) => {
                // The first occurrence's id names a new record's event.
                let id = std::mem::take(&mut known.event.id);
                known.event = NewEvent { id, ..event };
                known.occurrences += 1;
            }
            None => {
                first_seen.push(record_id.clone());
                incoming.insert(record_id, Incoming { event, occurrences: 1 });
            }
        }
    }
    let record_ids: Vec<&str> = first_seen.iter().map(String::as_str).collect();
    let known = known_records(store, ws, &provider, &record_ids).await?;
    let old_ids: Vec<&str> = known.values().map(|r| r.event_id.as_str()).collect();
    let old_rows = stored_events(store, ws, &old_ids).await?;
    let still_stored: HashSet<&str> = old_rows.iter().map(|r| r.id.as_str()).collect();

    let mut event_ids: HashMap<&str, String> = HashMap::new();
    let mut mapping = Vec::with_capacity(first_seen.len());
    let mut rows = Vec::with_capacity(first_seen.len());
    let mut out = ConnectorUpsert { ids: Vec::with_capacity(order.len()), ingested: 0, updated: 0 };
    for record_id in &first_seen {
        let Some(Incoming { event, occurrences }) = incoming.remove(record_id) else {
            continue;
        };
        let previous = known.get(record_id);
        let id = previous.map_or_else(|| event.id.clone(), |r| r.event_id.clone());
        // New unless its event is stored: a mapping whose event is missing
        // was left by a call that failed before storing it.
        let new = !still_stored.contains(id.as_str());
        out.ingested += u64::from(new);
        out.updated += occurrences - u64::from(new);
        mapping.push((
            record_id.as_str(),
            id.clone(),
            previous.map_or(now, |r| r.first_synced_at),
            previous.map_or(0, |r| r.syncs) + occurrences,
        ));
        rows.push(to_row(ws, NewEvent { id: id.clone(), ..event }));
        event_ids.insert(record_id.as_str(), id);
    }
    for record_id in &order {
        let id = event_ids
            .get(record_id.as_str())
            .ok_or_else(|| Error::internal("connector record without an event id"))?;
        out.ids.push(id.clone());
    }
    if new_event_limit.is_some_and(|left| out.ingested > left) {
        return Err(crate::usage::quota_exceeded());
    }

    let version = store.clock.next();
    let mapping_rows: Vec<RecordRow<'_>> = mapping
        .iter()
        .map(|(record_id, event_id, first_synced_at, syncs)| RecordRow {
            workspace_id: ws,
            provider: &provider,
            record_id,
            event_id,
            first_synced_at: *first_synced_at,
            last_synced_at: now,
            syncs: *syncs,
            version,
        })
        .collect();
    store.insert_rows::<RecordRow<'_>>("connector_records", &mapping_rows).await?;

    // An edge the new version observes exactly as the old one did stays.
    let mut new_edges: HashMap<&str, Edge> = HashMap::new();
    for row in &rows {
        if let Some(edge) = edge_of(row)? {
            new_edges.insert(row.id.as_str(), edge);
        }
    }
    let mut same_edge = HashSet::new();
    let mut gone = Vec::new();
    for old in &old_rows {
        let Some(edge) = edge_of(old)? else { continue };
        if new_edges.get(old.id.as_str()) == Some(&edge) {
            same_edge.insert(old.id.clone());
        } else {
            gone.push(edge);
        }
    }
    let replaced: Vec<&str> = still_stored.iter().copied().collect();
    for chunk in replaced.chunks(LOOKUP_CHUNK) {
        let condition = format!("workspace_id = ? AND id IN ({})", placeholders(chunk.len()));
        let mut binds = vec![ws.to_owned()];
        binds.extend(chunk.iter().map(|id| (*id).to_owned()));
        delete_and_wait(store, "events", &condition, &binds).await?;
    }
    forget_edges(store, ws, &gone).await?;
    insert_new(store, ws, &mut rows, &same_edge).await?;
    store.count_events_ingested(ws, usize::try_from(out.ingested).unwrap_or(usize::MAX)).await?;

    sync.ingested = out.ingested;
    sync.updated = out.updated;
    let row = SyncRow {
        workspace_id: ws.to_owned(),
        id: sync.id,
        provider: sync.provider,
        business_id: sync.business_id,
        received: sync.received,
        ingested: sync.ingested,
        updated: sync.updated,
        rejected: sync.rejected,
        created_at: sync.created_at,
    };
    store.insert_rows::<SyncRow>("connector_syncs", &[row]).await?;
    Ok(out)
}

/// [`crate::store::queries::QueryStore::connector_loads`]: the sync log
/// summed per provider, each sync once.
pub(super) async fn loads(
    store: &ClickHouseStore,
    ws: &str,
    since: i64,
    limit: usize,
) -> Result<Vec<ConnectorLoad>> {
    let sql = format!(
        "SELECT s_provider, count(), sum(s_received), sum(s_ingested), sum(s_updated),
            sum(s_rejected), max(s_created_at)
         FROM ({SYNCS_BY_ID} WHERE workspace_id = ? AND created_at >= ? GROUP BY id)
         GROUP BY s_provider ORDER BY s_provider LIMIT {}",
        super::governance::limit_arg(limit)
    );
    let rows: Vec<LoadRead> =
        run(store.client.query(&sql).bind(ws).bind(since).sent().fetch_all()).await?;
    Ok(rows
        .into_iter()
        .map(|r| ConnectorLoad {
            provider: r.provider,
            syncs: r.syncs,
            received: r.received,
            ingested: r.ingested,
            updated: r.updated,
            rejected: r.rejected,
            last_sync_at: r.last_sync_at,
        })
        .collect())
}

#[async_trait]
impl ConnectorStore for ClickHouseStore {
    async fn upsert_connector_records(
        &self,
        workspace_id: &str,
        records: Vec<ConnectorRecord>,
        sync: SyncRecord,
        new_event_limit: Option<u64>,
    ) -> Result<ConnectorUpsert> {
        let lock = self.lock_for(workspace_id)?;
        let _guard = lock.lock().await;
        upsert(self, workspace_id, records, sync, new_event_limit).await
    }

    async fn list_connector_syncs(
        &self,
        workspace_id: &str,
        limit: usize,
    ) -> Result<Vec<SyncRecord>> {
        let sql = format!(
            "{SYNCS_BY_ID} WHERE workspace_id = ? GROUP BY id
             ORDER BY s_created_at DESC, id DESC LIMIT {}",
            u64::try_from(limit).unwrap_or(u64::MAX)
        );
        let rows: Vec<SyncRow> =
            run(self.client.query(&sql).bind(workspace_id).sent().fetch_all()).await?;
        Ok(rows
            .into_iter()
            .map(|r| SyncRecord {
                id: r.id,
                provider: r.provider,
                business_id: r.business_id,
                received: r.received,
                ingested: r.ingested,
                updated: r.updated,
                rejected: r.rejected,
                created_at: r.created_at,
            })
            .collect())
    }
}

/// Scenarios run on both backends: the ClickHouse store must answer what
/// the embedded store answers.
#[cfg(test)]
pub(super) mod tests {

    use serde_json::json;

    use crate::store::queries::{ConnectorLoad, QueryStore, Range, Relationship, TotalsQuery};
    use crate::store::{EventFilter, NewEvent, Store, StoredEvent, UsageTotals, Workspace};

    use super::*;

    const WS: &str = "ws_a";
    const M: i64 = 60_000;

    /// An order of customer `customer` as `event`, `minutes_ago` old.
    fn record(
        now: i64,
        id: &str,
        event: &str,
        customer: u32,
        total: f64,
        minutes_ago: i64,
    ) -> ConnectorRecord {
        let envelope = json!({
            "event": event,
            "businessId": "default",
            "actor": {"type": "customer", "id": format!("shopify:{customer}")},
            "object": {"type": "order", "id": format!("shopify:{id}")},
            "entity": {"type": "order", "id": format!("shopify:{id}")},
            "outcome": {"revenue": total, "currency": "USD"},
            "properties": {"note": format!("total {total}")},
            "timestamp": now - minutes_ago * M,
        });
        ConnectorRecord {
            record_id: id.into(),
            event: NewEvent {
                id: crate::ids::new_id("evt"),
                received_at: now,
                event: opgraph_proto::Event::from_json(&envelope, now).expect("record event"),
            },
        }
    }

    fn sync(provider: &str, received: u64, rejected: u64) -> SyncRecord {
        SyncRecord {
            id: crate::ids::new_id("syn"),
            provider: provider.into(),
            business_id: "default".into(),
            received,
            ingested: 0,
            updated: 0,
            rejected,
            created_at: crate::now_ms(),
        }
    }

    /// Everything a client can read after the scenario, ids left out (they
    /// are drawn at random).
    #[derive(Debug, PartialEq)]
    pub(crate) struct Seen {
        counts: Vec<(u64, u64)>,
        events: Vec<serde_json::Value>,
        totals: Vec<(String, u64, f64)>,
        relationships: Vec<Relationship>,
        usage: UsageTotals,
        syncs: Vec<(String, u64, u64, u64, u64)>,
        loads: Vec<ConnectorLoad>,
    }

    /// Two syncs of shopify orders and one of a generic provider; the
    /// second shopify sync repeats record 1 (twice, new totals), moves
    /// record 2 to another customer, event name and time, and adds record 3.
    /// `now`: the time the records are given relative to.
    pub(crate) async fn resync(store: &dyn Store, now: i64) -> Seen {
        let workspace = Workspace { id: WS.into(), name: WS.into(), created_at: 0 };
        store.create_workspace(&workspace).await.unwrap();
        let record = |id, event, customer, total, ago| record(now, id, event, customer, total, ago);
        let first = store
            .upsert_connector_records(
                WS,
                vec![
                    record("1", "order.created", 7, 10.0, 30),
                    record("2", "order.created", 7, 5.0, 20),
                ],
                sync("shopify", 3, 1),
                None,
            )
            .await
            .unwrap();
        let second = store
            .upsert_connector_records(
                WS,
                vec![
                    record("1", "order.created", 7, 12.0, 30),
                    record("2", "order.cancelled", 8, 0.0, 10),
                    record("1", "order.created", 7, 15.0, 30),
                    record("3", "order.created", 7, 1.0, 5),
                ],
                sync("shopify", 4, 0),
                None,
            )
            .await
            .unwrap();
        assert_eq!(second.ids[0], first.ids[0]);
        assert_eq!(second.ids[1], first.ids[1]);
        assert_eq!(second.ids[2], first.ids[0]);
        let third = store
            .upsert_connector_records(
                WS,
                vec![record("1", "acme.record", 9, 2.0, 1)],
                sync("acme", 1, 0),
                None,
            )
            .await
            .unwrap();
        assert_ne!(third.ids[0], first.ids[0], "providers' record ids never merge");

        let filter = EventFilter { limit: 100, ..EventFilter::default() };
        let listed: Vec<StoredEvent> = store.list_events(WS, &filter).await.unwrap();
        let query = TotalsQuery {
            range: Some(Range { from: now - 60 * M, to: now + M }),
            limit: 10,
            ..TotalsQuery::default()
        };
        let totals = store.event_totals(WS, &query).await.unwrap();
        let syncs = store.list_connector_syncs(WS, 10).await.unwrap();
        Seen {
            counts: [first, second, third].iter().map(|u| (u.ingested, u.updated)).collect(),
            events: listed.into_iter().map(|e| e.envelope).collect(),
            totals: totals.events.into_iter().map(|e| (e.event_name, e.count, e.revenue)).collect(),
            relationships: store.list_relationships(WS, None, 10).await.unwrap(),
            usage: store.usage(WS, now - 1000, now + 1000).await.unwrap(),
            syncs: syncs
                .into_iter()
                .map(|s| (s.provider, s.received, s.ingested, s.updated, s.rejected))
                .collect(),
            loads: store
                .connector_loads(WS, 0, 100)
                .await
                .unwrap()
                .into_iter()
                .map(|l| ConnectorLoad { last_sync_at: 0, ..l })
                .collect(),
        }
    }

    /// What is left of the quota limits new records only: a re-sync of
    /// known ones passes with nothing left, and a call with one record too
    /// many stores nothing, its sync record included.
    async fn quota_counts_new_records_only(store: &dyn Store, now: i64) {
        let workspace = Workspace { id: WS.into(), name: WS.into(), created_at: 0 };
        store.create_workspace(&workspace).await.unwrap();
        let record = |id, total| record(now, id, "order.created", 7, total, 5);
        let upsert = |records, limit| {
            store.upsert_connector_records(WS, records, sync("shopify", 2, 0), limit)
        };
        upsert(vec![record("1", 1.0), record("2", 2.0)], None).await.unwrap();
        let again = upsert(vec![record("1", 3.0), record("2", 4.0)], Some(0)).await.unwrap();
        assert_eq!((again.ingested, again.updated), (0, 2));
        let refused = upsert(vec![record("1", 5.0), record("3", 6.0)], Some(0)).await.unwrap_err();
        assert_eq!(refused.code(), "rate_limited");
        assert_eq!(store.list_connector_syncs(WS, 10).await.unwrap().len(), 2);
        let within = upsert(vec![record("1", 5.0), record("3", 6.0)], Some(1)).await.unwrap();
        assert_eq!((within.ingested, within.updated), (1, 1));
        let filter = crate::store::EventFilter { limit: 10, ..Default::default() };
        assert_eq!(store.list_events(WS, &filter).await.unwrap().len(), 3);
    }

    #[tokio::test]
    async fn the_quota_counts_new_records_only() {
        let now = crate::now_ms();
        let (store, _server) = crate::store::clickhouse::tests::open().await;
        quota_counts_new_records_only(&store, now).await;
        let dir = tempfile::tempdir().unwrap();
        let embedded = crate::store::embedded::EmbeddedStore::open(
            dir.path(),
            crate::store::embedded::EmbeddedOptions::default(),
        )
        .unwrap();
        quota_counts_new_records_only(&embedded, now).await;
        embedded.close().await.unwrap();
    }

    async fn resync_on_embedded(now: i64) -> Seen {
        let dir = tempfile::tempdir().unwrap();
        let embedded = crate::store::embedded::EmbeddedStore::open(
            dir.path(),
            crate::store::embedded::EmbeddedOptions::default(),
        )
        .unwrap();
        let seen = resync(&embedded, now).await;
        embedded.close().await.unwrap();
        seen
    }

    /// On a cluster the replaced events and edges are deleted from the
    /// local tables of every shard (`ALTER ... ON CLUSTER`): the
    /// Distributed tables take no mutation. One replica per shard: 18.16
    /// does not mutate a shard's latest part inserted with `insert_quorum`
    /// (ClickHouse issue 7133, docs/storage.md).
    #[tokio::test]
    async fn a_resync_on_a_cluster_reads_back_as_on_the_embedded_store() {
        use opgraph_tests::clickhouse::cluster::{CLUSTER, Cluster};
        let cluster = Cluster::start(2, 1).await.expect("a private 2-shard ClickHouse cluster");
        let config = super::super::ClickHouseConfig {
            url: cluster.entry().url(),
            database: "opgraph".into(),
            cluster: Some(CLUSTER.into()),
            ca_file: None,
        };
        let store = ClickHouseStore::open(&config).await.expect("open the store on the cluster");
        let now = crate::now_ms();
        let on_cluster = resync(&store, now).await;
        assert_eq!(on_cluster, resync_on_embedded(now).await);
        assert_eq!(on_cluster.events.len(), 4, "the replaced versions are gone");
    }

    #[tokio::test]
    async fn a_resync_reads_back_as_on_the_embedded_store() {
        let (store, _server) = crate::store::clickhouse::tests::open().await;
        let now = crate::now_ms();
        let on_clickhouse = resync(&store, now).await;
        assert_eq!(on_clickhouse, resync_on_embedded(now).await);

        // And what that is: each record once, with its latest state.
        let seen = on_clickhouse;
        assert_eq!(seen.counts, [(2, 0), (1, 3), (1, 0)]);
        assert_eq!(seen.events.len(), 4);
        let revenue: f64 = seen.totals.iter().map(|t| t.2).sum();
        assert_eq!(revenue, 15.0 + 0.0 + 1.0 + 2.0);
        let orders = seen.totals.iter().find(|t| t.0 == "order.created").unwrap();
        assert_eq!((orders.1, orders.2), (2, 16.0));
        // Record 2's edge moved from customer 7 to customer 8.
        let edges: Vec<(&str, &str, u64)> = seen
            .relationships
            .iter()
            .map(|r| (r.from_id.as_str(), r.relation.as_str(), r.count))
            .collect();
        assert_eq!(edges.len(), 4, "{edges:?}");
        assert!(edges.contains(&("shopify:8", "order.cancelled", 1)), "{edges:?}");
        assert!(!edges.iter().any(|e| e.0 == "shopify:7" && e.1 == "order.cancelled"));
        assert_eq!(seen.usage.events_ingested, 4);
        assert_eq!(seen.loads.len(), 2);
        assert_eq!(
            seen.loads[1],
            ConnectorLoad {
                provider: "shopify".into(),
                syncs: 2,
                received: 7,
                ingested: 3,
                updated: 3,
                rejected: 1,
                last_sync_at: 0,
            }
        );
    }

    #[tokio::test]
    async fn a_sync_row_sent_twice_counts_once() {
        let (store, _server) = crate::store::clickhouse::tests::open().await;
        let once = sync("shopify", 2, 1);
        let row = || SyncRow {
            workspace_id: WS.into(),
            id: once.id.clone(),
            provider: once.provider.clone(),
            business_id: once.business_id.clone(),
            received: 2,
            ingested: 1,
            updated: 0,
            rejected: 1,
            created_at: once.created_at,
        };
        store.insert_rows::<SyncRow>("connector_syncs", &[row()]).await.unwrap();
        store.insert_rows::<SyncRow>("connector_syncs", &[row()]).await.unwrap();
        let loads = store.connector_loads(WS, 0, 100).await.unwrap();
        assert_eq!((loads[0].syncs, loads[0].received, loads[0].rejected), (1, 2, 1));
        assert_eq!(store.list_connector_syncs(WS, 10).await.unwrap().len(), 1);
        assert!(store.connector_loads(WS, once.created_at + 1, 100).await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_record_whose_event_never_landed_counts_as_new() {
        let (store, _server) = crate::store::clickhouse::tests::open().await;
        let workspace = Workspace { id: WS.into(), name: WS.into(), created_at: 0 };
        store.create_workspace(&workspace).await.unwrap();
        // What a call that failed after writing its mapping leaves behind.
        let row = RecordRow {
            workspace_id: WS,
            provider: "shopify",
            record_id: "1",
            event_id: "evt_orphan",
            first_synced_at: 1,
            last_synced_at: 1,
            syncs: 1,
            version: store.clock.next(),
        };
        store.insert_rows::<RecordRow<'_>>("connector_records", &[row]).await.unwrap();
        let retry = vec![record(crate::now_ms(), "1", "order.created", 7, 10.0, 1)];
        let stored =
            store.upsert_connector_records(WS, retry, sync("shopify", 1, 0), None).await.unwrap();
        assert_eq!((stored.ingested, stored.updated), (1, 0));
        assert_eq!(stored.ids, ["evt_orphan"]);
        let filter = EventFilter { limit: 10, ..EventFilter::default() };
        let events = store.list_events(WS, &filter).await.unwrap();
        assert_eq!(events.iter().map(|e| e.id.as_str()).collect::<Vec<_>>(), ["evt_orphan"]);
        let now = crate::now_ms();
        assert_eq!(store.usage(WS, now - 1000, now + 1000).await.unwrap().events_ingested, 1);
    }
}
