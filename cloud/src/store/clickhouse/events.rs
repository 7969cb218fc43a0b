//! Event rows on ClickHouse: flattening, exactly-once appends, listing.
//!
//! The columns lifted out of the envelope are the embedded store's
//! (`docs/storage.md`), with `''` for an absent text and `has_revenue`
//! beside `revenue`.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;

use clickhouse::Row;
use opgraph_proto::Party;
use serde::{Deserialize, Serialize};

use super::{ClickHouseStore, Sent, run};
use crate::error::{Error, Result};
use crate::store::columns::{fold_case, number_at, search_text, text_at};
use crate::store::{
    AppendRequest, AppendResult, EventFilter, IDEMPOTENCY_WINDOW_MS, IdempotencyKey, NewEvent,
    StoredEvent,
};

/// Ids looked up per query: keeps the SQL text far below ClickHouse's
/// `max_query_size` (256 KiB).
pub(super) const LOOKUP_CHUNK: usize = 500;

/// Bytes of ids per event id lookup ([`stored_ids`]), for the same reason.
const LOOKUP_BYTES: usize = 64 * 1024;

/// One `events` row, in the table's column order. Public for the insert
/// benchmark, whose raw baseline writes the same rows with the crate.
#[derive(Row, Serialize, Deserialize, Debug, Clone)]
pub struct EventRow {
    pub workspace_id: String,
    pub id: String,
    pub business_id: String,
    pub event: String,
    pub ts: i64,
    /// `ts` in seconds (DateTime is unsigned 32-bit: clamped).
    pub time: u32,
    pub received_at: i64,
    pub seq: u64,
    pub actor_type: String,
    pub actor_id: String,
    pub object_type: String,
    pub object_id: String,
    pub trace_id: String,
    pub decision_id: String,
    pub proof_id: String,
    pub trust_tier: String,
    pub message_id: String,
    pub trackable_code: String,
    pub has_revenue: u8,
    pub revenue: f64,
    pub source: String,
    pub channel: String,
    pub campaign: String,
    pub search_text: String,
    pub num_keys: Vec<String>,
    pub num_values: Vec<f64>,
    pub envelope: String,
}

/// `ts` (ms) as the `time` column's seconds.
pub(super) fn seconds(ts: i64) -> u32 {
    u32::try_from(ts.div_euclid(1000).max(0)).unwrap_or(u32::MAX)
}

fn party_columns(party: Option<&Party>) -> (String, String) {
    match party {
        None => (String::new(), String::new()),
        Some(Party::Name(name)) => (String::new(), name.clone()),
        Some(Party::Ref { kind, id, .. }) => (kind.clone(), id.clone()),
    }
}

/// Text for `search_text` and needles matched against it, folded where
/// `positionCaseInsensitiveUTF8` would not: it lowers each character, so a
/// final sigma, the micro sign or a long s would not meet sigma, mu or s
/// as they do in the embedded store. It folds ASCII itself, so ASCII text
/// is kept as written. Rows stored before 27 November 2026 hold their text
/// unfolded; `search` also asks with the needle as given for them.
pub(super) fn searchable(text: String) -> String {
    if text.is_ascii() { text } else { fold_case(&text) }
}

/// Flattens an event; `seq` is filled in when the row is stored.
pub fn to_row(ws: &str, new: NewEvent) -> EventRow {
    let NewEvent { id, received_at, event: e } = new;
    let (actor_type, actor_id) = party_columns(e.actor.as_ref());
    let (object_type, object_id) = party_columns(e.object.as_ref());
    let revenue = number_at(e.outcome.as_ref(), "revenue")
        .or_else(|| number_at(e.attribution.as_ref(), "revenue"));
    let ts = e.timestamp.unwrap_or(received_at);
    let search_text =
        searchable(search_text(&e, [&*actor_type, &actor_id, &object_type, &object_id]));
    let (num_keys, num_values) = e
        .properties
        .iter()
        .flat_map(|props| props.keys())
        .filter_map(|key| Some((key.clone(), number_at(e.properties.as_ref(), key)?)))
        .unzip();
    EventRow {
        num_keys,
        num_values,
        search_text,
        workspace_id: ws.to_owned(),
        business_id: e.business_id.clone().unwrap_or_else(|| "default".into()),
        ts,
        time: seconds(ts),
        seq: 0,
        trust_tier: e.trust_tier.map_or("T0", |t| t.as_str()).to_owned(),
        trace_id: e.trace_id.clone().unwrap_or_default(),
        decision_id: e.decision_id.clone().unwrap_or_default(),
        proof_id: e.proof_id.clone().unwrap_or_default(),
        message_id: e.message_id.clone().unwrap_or_default(),
        trackable_code: text_at(e.trackable.as_ref(), "code").unwrap_or_default(),
        source: text_at(e.attribution.as_ref(), "source")
            .or_else(|| text_at(e.source.as_ref(), "source"))
            .unwrap_or_default(),
        channel: text_at(e.source.as_ref(), "channel")
            .or_else(|| text_at(e.attribution.as_ref(), "channel"))
            .unwrap_or_default(),
        campaign: text_at(e.source.as_ref(), "campaign")
            .or_else(|| text_at(e.attribution.as_ref(), "campaign"))
            .unwrap_or_default(),
        has_revenue: u8::from(revenue.is_some()),
        revenue: revenue.unwrap_or(0.0),
        envelope: e.to_json_text(),
        event: e.event,
        actor_type,
        actor_id,
        object_type,
        object_id,
        id,
        received_at,
    }
}

#[derive(Row, Serialize)]
struct MessageIdRow<'a> {
    workspace_id: &'a str,
    message_id: &'a str,
    id: &'a str,
    version: u64,
    ts: i64,
}

#[derive(Row, Serialize)]
struct IdempotencyRow<'a> {
    workspace_id: &'a str,
    key: &'a str,
    response: &'a str,
    created_at: i64,
}

#[derive(Row, Deserialize)]
struct IdempotencyRead {
    response: String,
    created_at: i64,
}

#[derive(Row, Deserialize)]
struct MessageRead {
    message_id: String,
    id: String,
    ts: i64,
}

/// What the ledger holds for a `messageId`: the first event id given to
/// it and that event's `ts`.
struct Recorded {
    id: String,
    ts: i64,
    /// Whether the event may be missing and must be looked up: the ledger
    /// row is written before its event. Not for rows without `ts` (written
    /// after their event, before schema version 4) nor for events of this
    /// call.
    unsure: bool,
}

#[derive(Row, Deserialize)]
struct IdSeqRead {
    id: String,
    seq: u64,
}

#[derive(Row, Deserialize)]
struct ListRead {
    id: String,
    received_at: i64,
    envelope: String,
}

/// `?, ?, ?` for `n` values.
pub(super) fn placeholders(n: usize) -> String {
    vec!["?"; n].join(", ")
}

/// Which of `rows`' ids are stored already, with their stored `seq`.
/// Looked up through the table's key: the event names and the time span of
/// the rows narrow the search to a few granules, the ids decide.
pub(super) async fn stored_ids(
    store: &ClickHouseStore,
    ws: &str,
    rows: &[EventRow],
) -> Result<HashMap<String, u64>> {
    // As many ids per query as fit well under `max_query_size` at their
    // longest, escaped: a gateway batch of short ids is one query.
    let longest = rows.iter().map(|r| r.id.len()).max().unwrap_or(0);
    let per_query = (LOOKUP_BYTES / (2 * longest + 4)).max(1);
    let mut found = HashMap::new();
    for chunk in rows.chunks(per_query) {
        let names: HashSet<&str> = chunk.iter().map(|r| r.event.as_str()).collect();
        let (low, high) =
            chunk.iter().fold((i64::MAX, i64::MIN), |(lo, hi), r| (lo.min(r.ts), hi.max(r.ts)));
        let sql = format!(
            "SELECT id, seq FROM events WHERE workspace_id = ? AND event IN ({}) AND ts >= ?
             AND ts <= ? AND time >= toDateTime(?) AND time <= toDateTime(?) AND id IN ({})",
            placeholders(names.len()),
            placeholders(chunk.len())
        );
        let mut query = store.client.query(&sql).bind(ws);
        for name in names {
            query = query.bind(name);
        }
        query = query.bind(low).bind(high).bind(seconds(low)).bind(seconds(high));
        for row in chunk {
            query = query.bind(row.id.as_str());
        }
        let ids: Vec<IdSeqRead> = run(query.sent().fetch_all()).await?;
        found.extend(ids.into_iter().map(|r| (r.id, r.seq)));
    }
    Ok(found)
}

/// The ledger's record of each of these `messageId`s.
async fn stored_message_ids(
    store: &ClickHouseStore,
    ws: &str,
    message_ids: &[&str],
) -> Result<HashMap<String, Recorded>> {
    let mut found = HashMap::new();
    for chunk in message_ids.chunks(LOOKUP_CHUNK) {
        let sql = format!(
            "SELECT message_id, argMin(id, version), argMin(ts, version) FROM message_ids
             WHERE workspace_id = ? AND message_id IN ({}) GROUP BY message_id",
            placeholders(chunk.len())
        );
        let mut query = store.client.query(&sql).bind(ws);
        for id in chunk {
            query = query.bind(*id);
        }
        let rows: Vec<MessageRead> = run(query.sent().fetch_all()).await?;
        found.extend(
            rows.into_iter()
                .map(|r| (r.message_id, Recorded { id: r.id, ts: r.ts, unsure: r.ts != 0 })),
        );
    }
    Ok(found)
}

/// Stores the rows not stored yet (the caller holds the workspace's lock):
/// one insert for the events, then the `messageId` ledger, businesses and
/// usage. Returns each row's id (the first one stored for a replay) and
/// how many rows were added.
pub(super) async fn store_rows(
    store: &ClickHouseStore,
    ws: &str,
    rows: Vec<EventRow>,
    limit: Option<u64>,
) -> Result<(Vec<String>, usize)> {
    let mut landed = 0;
    let stored = store_rows_uncounted(store, ws, rows, true, limit, &mut landed).await;
    // Events that landed are counted even when a later write failed: the
    // retry finds them by id and adds (and counts) none of them.
    let counted = store.count_events_ingested(ws, landed).await;
    let stored = stored?;
    counted?;
    Ok(stored)
}

/// [`store_rows`] leaving usage to the caller, which `landed` tells how
/// many events were inserted as soon as they are, so that it can count
/// them when a later write of the call fails. `check_ids: false` skips the
/// lookup of stored ids, for a caller that knows none of them can be
/// stored (a gateway batch above its reservation, see `gateway.rs`);
/// `messageId`s and repeats within `rows` are still checked. More new rows
/// than `limit` refuse the call before anything is written.
pub(super) async fn store_rows_uncounted(
    store: &ClickHouseStore,
    ws: &str,
    rows: Vec<EventRow>,
    check_ids: bool,
    limit: Option<u64>,
    landed: &mut usize,
) -> Result<(Vec<String>, usize)> {
    let stored = if check_ids { stored_ids(store, ws, &rows).await? } else { HashMap::new() };
    let message_ids: Vec<&str> =
        rows.iter().map(|r| r.message_id.as_str()).filter(|m| !m.is_empty()).collect();
    let mut by_message = if message_ids.is_empty() {
        HashMap::new()
    } else {
        stored_message_ids(store, ws, &message_ids).await?
    };
    let mut seen: HashSet<String> = HashSet::new();
    let mut ids = Vec::with_capacity(rows.len());
    let mut fresh = Vec::new();
    let mut found = Vec::new();
    // Repeats of a `messageId` whose event may be missing, with the id and
    // `ts` the ledger gave it.
    let mut unsure = Vec::new();
    for mut row in rows {
        if !row.message_id.is_empty()
            && let Some(first) = by_message.get_mut(&row.message_id)
        {
            ids.push(first.id.clone());
            if first.unsure {
                // Looked up once per call, stored at most once.
                first.unsure = false;
                row.id = first.id.clone();
                row.ts = first.ts;
                row.time = seconds(first.ts);
                // A resend under the same id was looked up already.
                match stored.get(&row.id) {
                    Some(&seq) => {
                        row.seq = seq;
                        found.push(row);
                    }
                    None => unsure.push(row),
                }
            }
            continue;
        }
        if let Some(&seq) = stored.get(&row.id) {
            if !row.message_id.is_empty() {
                by_message.insert(row.message_id.clone(), recorded_here(&row));
            }
            ids.push(row.id.clone());
            row.seq = seq;
            found.push(row);
            continue;
        }
        if !seen.insert(row.id.clone()) {
            ids.push(row.id);
            continue;
        }
        if !row.message_id.is_empty() {
            by_message.insert(row.message_id.clone(), recorded_here(&row));
        }
        ids.push(row.id.clone());
        fresh.push(row);
    }
    if !unsure.is_empty() {
        // A delivery that failed after writing its ledger rows left these
        // events unstored: this repeat stores them under the recorded id.
        let present = stored_ids(store, ws, &unsure).await?;
        for mut row in unsure {
            if let Some(&seq) = present.get(&row.id) {
                row.seq = seq;
                found.push(row);
            } else if seen.insert(row.id.clone()) {
                fresh.push(row);
            }
        }
    }
    if limit.is_some_and(|left| fresh.len() as u64 > left) {
        return Err(crate::usage::quota_exceeded());
    }
    // The ledger first: a failure after it leaves a record that the next
    // delivery checks (above), where a failure before a ledger written
    // after the events would have let a retry under a new id store the
    // event twice.
    record_message_ids(store, ws, &fresh).await?;
    insert_events(store, ws, &mut fresh).await?;
    *landed = fresh.len();
    super::graph::observe(store, ws, &fresh, &HashSet::new()).await?;
    register_businesses_of(store, ws, &fresh).await?;
    // Events found stored by id may come from an attempt that failed after
    // the events insert: what derives from them is written again where it
    // may be missing (docs/storage.md).
    if !found.is_empty() {
        super::graph::observe_again(store, ws, &found).await?;
        write_ledger(store, ws, &found).await?;
    }
    Ok((ids, fresh.len()))
}

/// The ledger's record of a row this call stores or found stored.
fn recorded_here(row: &EventRow) -> Recorded {
    Recorded { id: row.id.clone(), ts: row.ts, unsure: false }
}

/// Inserts rows the caller found not stored (holding the workspace's
/// lock), in one insert: links them to trackables, numbers them, then
/// writes what derives from them (observations, the `messageId` ledger,
/// businesses). Usage is the caller's: a replaced connector event is not a
/// new one. `same_edge` names rows whose edge observation their previous
/// version left in place (`connectors`).
pub(super) async fn insert_new(
    store: &ClickHouseStore,
    ws: &str,
    fresh: &mut [EventRow],
    same_edge: &HashSet<String>,
) -> Result<()> {
    insert_events(store, ws, fresh).await?;
    write_derived(store, ws, fresh, same_edge).await
}

/// [`insert_new`]'s events insert: linked to trackables and numbered.
async fn insert_events(store: &ClickHouseStore, ws: &str, fresh: &mut [EventRow]) -> Result<()> {
    super::trackables::link(store, ws, fresh).await?;
    for row in fresh.iter_mut() {
        row.seq = store.clock.next();
    }
    store.insert_rows::<EventRow>("events", fresh).await
}

/// [`insert_new`]'s writes after the events insert.
async fn write_derived(
    store: &ClickHouseStore,
    ws: &str,
    fresh: &[EventRow],
    same_edge: &HashSet<String>,
) -> Result<()> {
    super::graph::observe(store, ws, fresh, same_edge).await?;
    write_ledger(store, ws, fresh).await
}

/// The `messageId` ledger rows and businesses of stored rows. Both are
/// idempotent: the ledger keeps the first id per `messageId`, a business
/// is registered once.
async fn write_ledger(store: &ClickHouseStore, ws: &str, rows: &[EventRow]) -> Result<()> {
    record_message_ids(store, ws, rows).await?;
    register_businesses_of(store, ws, rows).await
}

/// The `messageId` ledger rows of `rows`.
async fn record_message_ids(store: &ClickHouseStore, ws: &str, rows: &[EventRow]) -> Result<()> {
    let version = store.clock.next();
    let ledger: Vec<MessageIdRow<'_>> = rows
        .iter()
        .filter(|r| !r.message_id.is_empty())
        .map(|r| MessageIdRow {
            workspace_id: ws,
            message_id: &r.message_id,
            id: &r.id,
            version,
            ts: r.ts,
        })
        .collect();
    store.insert_rows::<MessageIdRow<'_>>("message_ids", &ledger).await
}

/// Registers the businesses `rows` name.
async fn register_businesses_of(
    store: &ClickHouseStore,
    ws: &str,
    rows: &[EventRow],
) -> Result<()> {
    let distinct: HashSet<&String> = rows.iter().map(|row| &row.business_id).collect();
    let businesses: Vec<String> = distinct.into_iter().cloned().collect();
    store.register_businesses(ws, &businesses).await
}

/// [`crate::store::Store::append_events`]; the caller holds the lock.
pub(super) async fn append(
    store: &ClickHouseStore,
    ws: &str,
    request: AppendRequest,
) -> Result<AppendResult> {
    let now = crate::now_ms();
    if let Some(key) = &request.idempotency_key
        && let Some(ids) = replayed(store, ws, key, now).await?
    {
        return Ok(AppendResult { ids, inserted: 0 });
    }
    let rows = request.events.into_iter().map(|e| to_row(ws, e)).collect();
    let (ids, inserted) = store_rows(store, ws, rows, request.new_event_limit).await?;
    if let Some(key) = &request.idempotency_key {
        keep(store, ws, key, &ids, now).await?;
    }
    Ok(AppendResult { ids, inserted })
}

/// The first answer's ids kept under `key` within the window, or a
/// conflict when they answered another request.
async fn replayed(
    store: &ClickHouseStore,
    ws: &str,
    key: &IdempotencyKey,
    now: i64,
) -> Result<Option<Vec<String>>> {
    let stored: Vec<IdempotencyRead> = run(store
        .client
        .query(
            "SELECT argMax(response, created_at), max(created_at) FROM idempotency_keys
             WHERE workspace_id = ? AND key = ? GROUP BY workspace_id, key",
        )
        .bind(ws)
        .bind(key.key.as_str())
        .sent()
        .fetch_all())
    .await?;
    match stored.into_iter().next() {
        Some(first) if now - first.created_at < IDEMPOTENCY_WINDOW_MS => {
            key.replay(&first.response).map(Some)
        }
        _ => Ok(None),
    }
}

/// Keeps `key` as answered by `ids` (the newest row of a key counts).
async fn keep(
    store: &ClickHouseStore,
    ws: &str,
    key: &IdempotencyKey,
    ids: &[String],
    now: i64,
) -> Result<()> {
    let response = key.kept(ids)?;
    let row =
        IdempotencyRow { workspace_id: ws, key: &key.key, response: &response, created_at: now };
    store.insert_rows::<IdempotencyRow<'_>>("idempotency_keys", &[row]).await?;
    purge_expired_keys(store, now);
    Ok(())
}

/// [`crate::store::Store::claim_idempotency_key`]; the caller holds the
/// workspace's lock.
pub(super) async fn claim_key(
    store: &ClickHouseStore,
    ws: &str,
    key: &IdempotencyKey,
) -> Result<()> {
    let now = crate::now_ms();
    if replayed(store, ws, key, now).await?.is_none() {
        keep(store, ws, key, &[], now).await?;
    }
    Ok(())
}

/// How often a process asks ClickHouse to delete expired idempotency keys:
/// the table then holds at most this much more than the window's keys.
const KEY_PURGE_EVERY_MS: i64 = 60 * 60 * 1000;

/// Deletes the idempotency keys past [`IDEMPOTENCY_WINDOW_MS`] (they answer
/// nothing any more) when this process has not asked for it in the last
/// [`KEY_PURGE_EVERY_MS`]; called after a keyed append, so a store that
/// takes no keys never pays for it. 18.16 has no TTL, so this is an `ALTER
/// TABLE ... DELETE` mutation: the server applies it in the background by
/// rewriting the table's parts, which is why it runs hourly rather than
/// per request. It runs on its own task: the request that triggers it does
/// not wait, and a failure is logged and retried an interval later.
fn purge_expired_keys(store: &ClickHouseStore, now: i64) {
    let last = store.keys_purged_at.load(Ordering::Relaxed);
    if now - last < KEY_PURGE_EVERY_MS
        || store
            .keys_purged_at
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
    {
        return;
    }
    let delete = format!(
        "ALTER TABLE {} DELETE WHERE created_at < {}",
        store.mutation_target("idempotency_keys"),
        now - IDEMPOTENCY_WINDOW_MS
    );
    let client = store.client.clone();
    tokio::spawn(async move {
        match run(client.query(&delete).sent().execute()).await {
            Ok(()) => tracing::debug!("asked ClickHouse to delete expired idempotency keys"),
            Err(err) => tracing::warn!(error = %err, "deleting expired idempotency keys failed"),
        }
    });
}

/// Newest first, ties in insertion order (newest first too), as on the
/// embedded store.
pub(super) async fn list(
    store: &ClickHouseStore,
    ws: &str,
    filter: &EventFilter,
) -> Result<Vec<StoredEvent>> {
    let mut sql =
        String::from("SELECT id, received_at, envelope FROM events WHERE workspace_id = ?");
    let mut texts: Vec<&str> = vec![ws];
    if let Some(event) = &filter.event {
        sql.push_str(" AND event = ?");
        texts.push(event);
    }
    if let Some(trace) = &filter.trace_id {
        sql.push_str(" AND trace_id = ?");
        texts.push(trace);
    }
    if let Some(business) = &filter.business_id {
        sql.push_str(" AND business_id = ?");
        texts.push(business);
    }
    let mut numbers: Vec<i64> = Vec::new();
    if let Some(from) = filter.from {
        // `time` repeats the bound so that whole months are skipped.
        sql.push_str(" AND ts >= ? AND time >= toDateTime(?)");
        numbers.extend([from, i64::from(seconds(from))]);
    }
    if let Some(to) = filter.to {
        sql.push_str(" AND ts < ? AND time <= toDateTime(?)");
        numbers.extend([to, i64::from(seconds(to.saturating_sub(1)))]);
    }
    sql.push_str(" ORDER BY ts DESC, seq DESC LIMIT ?");
    let mut query = store.client.query(&sql);
    for text in texts {
        query = query.bind(text);
    }
    for number in numbers {
        query = query.bind(number);
    }
    query = query.bind(u64::try_from(filter.limit).unwrap_or(u64::MAX));
    let rows: Vec<ListRead> = run(query.sent().fetch_all()).await?;
    rows.into_iter()
        .map(|r| {
            let envelope = serde_json::from_str(&r.envelope).map_err(Error::internal)?;
            Ok(StoredEvent { id: r.id, received_at: r.received_at, envelope })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;
    use crate::store::Store;

    async fn stored_keys(store: &ClickHouseStore) -> Vec<String> {
        store
            .client
            .query("SELECT key FROM idempotency_keys ORDER BY key")
            .fetch_all()
            .await
            .expect("read idempotency keys")
    }

    /// Two keys from yesterday and one from an hour ago are stored; a keyed
    /// append (the first of this process) has the expired two deleted,
    /// while the live one still answers its replay.
    #[tokio::test]
    async fn a_keyed_append_has_expired_keys_deleted() {
        let (store, _server) = crate::store::clickhouse::tests::open().await;
        let now = crate::now_ms();
        let yesterday = now - IDEMPOTENCY_WINDOW_MS - 60_000;
        let rows = [
            ("expired-1", yesterday, r#"["evt_old1"]"#),
            ("expired-2", yesterday, r#"["evt_old2"]"#),
            ("live", now - 3_600_000, r#"["evt_live"]"#),
        ]
        .map(|(key, created_at, response)| IdempotencyRow {
            workspace_id: "ws",
            key,
            response,
            created_at,
        });
        store.insert_rows::<IdempotencyRow<'_>>("idempotency_keys", &rows).await.unwrap();

        let event = |id: &str| {
            let event =
                opgraph_proto::Event::parse_json(&serde_json::json!({"event": "pallet.scanned"}))
                    .expect("event");
            NewEvent { id: id.into(), received_at: now, event }
        };
        let fresh = AppendRequest {
            events: vec![event("evt_new")],
            idempotency_key: Some("fresh".into()),
            new_event_limit: None,
        };
        store.append_events("ws", fresh).await.unwrap();

        // ClickHouse applies the mutation in the background; nothing
        // announces its end but the rows themselves.
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut keys = stored_keys(&store).await;
        while keys.len() > 2 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
            keys = stored_keys(&store).await;
        }
        assert_eq!(keys, ["fresh", "live"]);

        let replay = AppendRequest {
            events: vec![event("evt_other")],
            idempotency_key: Some("live".into()),
            new_event_limit: None,
        };
        let answer = store.append_events("ws", replay).await.unwrap();
        assert_eq!((answer.ids, answer.inserted), (vec!["evt_live".to_owned()], 0));
    }
}
