//! Event rows of the embedded store: what one ingest writes (event row,
//! hourly rollup, actor bounds, entity and relationship, usage; the search
//! index follows on its own thread, see `search`) and how recent events are
//! listed.

use std::collections::HashMap;
use std::mem::take;

use opgraph_proto::Party;
use rusqlite::types::Value as SqlValue;
use rusqlite::{Connection, OptionalExtension, params, params_from_iter};
use serde_json::Value;

use super::search::{Hint, Hints};
use super::sql;
use crate::error::{Error, Result};
use crate::store::columns::{number_at, search_text_of, text_at};
use crate::store::{
    AppendResult, EventFilter, IDEMPOTENCY_WINDOW_MS, IdempotencyKey, NewEvent, StoredEvent,
};

pub(super) const DAY_MS: i64 = 86_400_000;
pub(super) const HOUR_MS: i64 = 3_600_000;
/// An event flattened into its columns, computed before entering the writer
/// thread so that the single writer does as little as possible.
pub(super) struct Row {
    id: String,
    business_id: String,
    event: String,
    ts: i64,
    received_at: i64,
    actor: (Option<String>, Option<String>),
    object: (Option<String>, Option<String>),
    trace_id: Option<String>,
    decision_id: Option<String>,
    trust_tier: String,
    message_id: Option<String>,
    trackable_code: Option<String>,
    revenue: Option<f64>,
    source: Option<String>,
    channel: Option<String>,
    campaign: Option<String>,
    envelope: String,
    /// What search finds it by, made here rather than by the indexer from
    /// the stored row (see `search::Hints`).
    search_text: String,
    entity: Option<EntityRow>,
}

struct EntityRow {
    kind: String,
    id: String,
    name: Option<String>,
    properties: String,
}

fn party_columns(party: Option<&Party>) -> (Option<String>, Option<String>) {
    match party {
        None => (None, None),
        Some(Party::Name(name)) => (None, Some(name.clone())),
        Some(Party::Ref { kind, id, .. }) => (Some(kind.clone()), Some(id.clone())),
    }
}

pub(super) fn prepare_rows(events: Vec<NewEvent>) -> Vec<Row> {
    events
        .into_iter()
        .map(|NewEvent { id, received_at, event: e }| {
            let actor = party_columns(e.actor.as_ref());
            let object = party_columns(e.object.as_ref());
            let revenue = number_at(e.outcome.as_ref(), "revenue")
                .or_else(|| number_at(e.attribution.as_ref(), "revenue"));
            let entity = e.entity.as_ref().and_then(|m| {
                Some(EntityRow {
                    kind: text_at(Some(m), "type")?,
                    id: text_at(Some(m), "id")?,
                    name: text_at(Some(m), "name"),
                    properties: m
                        .get("properties")
                        .filter(|p| p.is_object())
                        .map_or_else(|| "{}".to_owned(), Value::to_string),
                })
            });
            let parts = [&actor.0, &actor.1, &object.0, &object.1];
            let search_text = search_text_of(
                &e.event,
                parts.into_iter().flatten().map(String::as_str),
                e.properties.as_ref(),
            );
            Row {
                search_text,
                business_id: e.business_id.clone().unwrap_or_else(|| "default".into()),
                ts: e.timestamp.unwrap_or(received_at),
                trust_tier: e.trust_tier.map_or("T0", |t| t.as_str()).to_owned(),
                trace_id: e.trace_id.clone(),
                decision_id: e.decision_id.clone(),
                message_id: e.message_id.clone(),
                trackable_code: text_at(e.trackable.as_ref(), "code"),
                source: text_at(e.attribution.as_ref(), "source")
                    .or_else(|| text_at(e.source.as_ref(), "source")),
                channel: text_at(e.source.as_ref(), "channel")
                    .or_else(|| text_at(e.attribution.as_ref(), "channel")),
                campaign: text_at(e.source.as_ref(), "campaign")
                    .or_else(|| text_at(e.attribution.as_ref(), "campaign")),
                envelope: e.to_json_text(),
                event: e.event,
                revenue,
                actor,
                object,
                entity,
                id,
                received_at,
            }
        })
        .collect()
}

const INSERT_EVENT: &str = "
    INSERT INTO events (workspace_id, id, business_id, event, ts, received_at,
        actor_type, actor_id, object_type, object_id, trace_id, decision_id, trust_tier,
        message_id, trackable_code, revenue, source, channel, campaign, envelope)
    VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16,
        ?17, ?18, ?19, ?20)
    ON CONFLICT DO NOTHING";

/// Writes one ingest request; runs inside the writer's savepoint, so an
/// error leaves nothing behind. `connectors::remove_event` reverses what
/// this derives from one event (rollup, relationship count, search entry):
/// keep the two in step. Actor bounds are queued and reach `event_actors`
/// through [`flush_pending`]. The searchable text of each inserted event
/// goes to `hints`, for the search indexer; only tools writing a store that
/// is not running (`append_in_transaction`) have none.
pub(super) fn append(
    conn: &Connection,
    ws: &str,
    rows: Vec<Row>,
    idempotency_key: Option<&IdempotencyKey>,
    hints: Option<&Hints>,
) -> Result<AppendResult> {
    let now = crate::now_ms();
    if let Some(key) = idempotency_key
        && let Some(ids) = replayed(conn, ws, key, now)?
    {
        return Ok(AppendResult { ids, inserted: 0 });
    }

    let mut insert = conn.prepare_cached(INSERT_EVENT).map_err(sql)?;
    let mut ids = Vec::with_capacity(rows.len());
    let mut hourly: HashMap<(String, String, i64), (i64, f64)> = HashMap::new();
    let mut actors: HashMap<(String, String, String), (i64, i64)> = HashMap::new();
    let mut businesses: Vec<String> = Vec::new();
    let mut inserted = 0usize;
    let mut hinted = Vec::with_capacity(if hints.is_some() { rows.len() } else { 0 });

    for mut row in rows {
        // An event naming a registered trackable's code is linked to it
        // (`trackable.id`, `trackable.kind`): here, so every ingest path
        // gets it (see trackables::link_event).
        if let Some(code) = &row.trackable_code
            && let Some(linked) = super::trackables::link_event(conn, ws, code, &row.envelope)?
        {
            row.envelope = linked;
        }
        let changed = insert
            .execute(params![
                ws,
                row.id,
                row.business_id,
                row.event,
                row.ts,
                row.received_at,
                row.actor.0,
                row.actor.1,
                row.object.0,
                row.object.1,
                row.trace_id,
                row.decision_id,
                row.trust_tier,
                row.message_id,
                row.trackable_code,
                row.revenue,
                row.source,
                row.channel,
                row.campaign,
                row.envelope,
            ])
            .map_err(sql)?;
        if changed == 0 {
            // A replay: the same event id, or the same messageId. Answer with
            // the id stored first.
            ids.push(existing_id(conn, ws, &row)?);
            continue;
        }
        inserted += 1;
        if hints.is_some() {
            let (envelope, text) = (take(&mut row.envelope), take(&mut row.search_text));
            hinted.push(Hint::new(conn.last_insert_rowid(), envelope, text));
        }
        let slot = hourly
            .entry((row.business_id.clone(), row.event.clone(), row.ts.div_euclid(HOUR_MS)))
            .or_default();
        slot.0 += 1;
        slot.1 += row.revenue.unwrap_or(0.0);
        if let Some(actor) = &row.actor.1 {
            // Its business, and '' for all businesses (schema.sql).
            for business in [row.business_id.as_str(), ""] {
                let key = (row.event.clone(), business.to_owned(), actor.clone());
                let bounds = actors.entry(key).or_insert((row.ts, row.ts));
                *bounds = (bounds.0.min(row.ts), bounds.1.max(row.ts));
            }
        }
        if !businesses.contains(&row.business_id) {
            businesses.push(row.business_id.clone());
        }
        if let Some(entity) = &row.entity {
            upsert_entity(conn, ws, entity, &row)?;
        }
        ids.push(row.id);
    }

    let mut rollup = conn
        .prepare_cached(
            "INSERT INTO event_counts_hourly (workspace_id, business_id, event, hour, count, revenue)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)
             ON CONFLICT DO UPDATE SET count = count + excluded.count,
                revenue = revenue + excluded.revenue",
        )
        .map_err(sql)?;
    for ((business, event, hour), (count, revenue)) in hourly {
        rollup.execute(params![ws, business, event, hour, count, revenue]).map_err(sql)?;
    }
    let mut bounds = conn
        .prepare_cached(
            "INSERT INTO temp.pending_actors
                (workspace_id, event, business_id, actor_id, first_ts, last_ts)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)
             ON CONFLICT DO UPDATE SET first_ts = min(first_ts, excluded.first_ts),
                last_ts = max(last_ts, excluded.last_ts)",
        )
        .map_err(sql)?;
    for ((event, business, actor), (first, last)) in actors {
        bounds.execute(params![ws, event, business, actor, first, last]).map_err(sql)?;
    }
    for business in businesses {
        conn.prepare_cached(
            "INSERT INTO businesses (workspace_id, id, name, created_at) VALUES (?1, ?2, ?2, ?3)
             ON CONFLICT DO NOTHING",
        )
        .and_then(|mut s| s.execute(params![ws, business, now]))
        .map_err(sql)?;
    }
    if inserted > 0 {
        conn.prepare_cached(
            "INSERT INTO usage_daily (workspace_id, day, events_ingested) VALUES (?1, ?2, ?3)
             ON CONFLICT (workspace_id, day) DO UPDATE
             SET events_ingested = events_ingested + ?3",
        )
        .and_then(|mut s| s.execute(params![ws, now.div_euclid(DAY_MS), inserted as i64]))
        .map_err(sql)?;
    }
    if let Some(key) = idempotency_key {
        keep(conn, ws, key, &ids, now)?;
    }
    if let Some(hints) = hints {
        hints.offer(hinted);
    }
    Ok(AppendResult { ids, inserted })
}

/// The first answer's ids kept under `key` within the window, or a
/// conflict when they answered another request.
fn replayed(
    conn: &Connection,
    ws: &str,
    key: &IdempotencyKey,
    now: i64,
) -> Result<Option<Vec<String>>> {
    let stored: Option<(String, i64)> = conn
        .query_row(
            "SELECT response, created_at FROM idempotency_keys
             WHERE workspace_id = ?1 AND key = ?2",
            params![ws, key.key],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()
        .map_err(sql)?;
    match stored {
        Some((response, created_at)) if now - created_at < IDEMPOTENCY_WINDOW_MS => {
            key.replay(&response).map(Some)
        }
        _ => Ok(None),
    }
}

/// Keeps `key` as answered by `ids`, replacing what an expired use left.
fn keep(conn: &Connection, ws: &str, key: &IdempotencyKey, ids: &[String], now: i64) -> Result<()> {
    conn.execute(
        "INSERT INTO idempotency_keys (workspace_id, key, response, created_at)
         VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT DO UPDATE SET response = excluded.response,
            created_at = excluded.created_at",
        params![ws, key.key, key.kept(ids)?, now],
    )
    .map_err(sql)?;
    Ok(())
}

/// [`crate::store::Store::claim_idempotency_key`].
pub(super) fn claim_key(conn: &Connection, ws: &str, key: &IdempotencyKey) -> Result<()> {
    let now = crate::now_ms();
    if replayed(conn, ws, key, now)?.is_none() {
        keep(conn, ws, key, &[], now)?;
    }
    Ok(())
}

/// Keys past [`IDEMPOTENCY_WINDOW_MS`] answer nothing any more (a retry
/// then stores anew and overwrites them), but nothing else removed them:
/// the table grew by a row per keyed request, forever. Deletes at most
/// `limit` of them, oldest first; answers how many it deleted.
pub(super) fn purge_expired_keys(
    conn: &Connection,
    now: i64,
    limit: i64,
) -> rusqlite::Result<usize> {
    conn.prepare_cached(
        "DELETE FROM idempotency_keys WHERE (workspace_id, key) IN (
            SELECT workspace_id, key FROM idempotency_keys
            WHERE created_at < ?1 ORDER BY created_at LIMIT ?2)",
    )?
    .execute(params![now - IDEMPOTENCY_WINDOW_MS, limit])
}

/// The per-connection queue written by [`append`] and emptied by
/// [`flush_pending`] just before the transaction commits (a request rolled
/// back to its savepoint takes its entries with it): one upsert into
/// `event_actors` per event name and actor of the whole group instead of
/// one per request.
pub(super) const PENDING_TABLES: &str = "
    CREATE TEMP TABLE IF NOT EXISTS pending_actors (
        workspace_id TEXT NOT NULL, event TEXT NOT NULL, business_id TEXT NOT NULL,
        actor_id TEXT NOT NULL, first_ts INTEGER NOT NULL, last_ts INTEGER NOT NULL,
        PRIMARY KEY (workspace_id, event, business_id, actor_id)
    ) WITHOUT ROWID;";

/// Merges the queued actor bounds into `event_actors`. Call inside the
/// transaction, outside any savepoint, right before COMMIT.
pub(super) fn flush_pending(conn: &Connection) -> rusqlite::Result<()> {
    // Bounds of a removed event are widened to unknown by
    // `connectors::remove_event`; min/max keep them unknown here.
    conn.prepare_cached(
        "INSERT INTO event_actors (workspace_id, event, business_id, actor_id, first_ts, last_ts)
         SELECT workspace_id, event, business_id, actor_id, first_ts, last_ts
         FROM temp.pending_actors WHERE true
         ON CONFLICT DO UPDATE SET first_ts = min(first_ts, excluded.first_ts),
            last_ts = max(last_ts, excluded.last_ts)",
    )?
    .execute([])?;
    conn.prepare_cached("DELETE FROM temp.pending_actors")?.execute([])?;
    Ok(())
}

fn existing_id(conn: &Connection, ws: &str, row: &Row) -> Result<String> {
    let by_message = match &row.message_id {
        Some(message_id) => conn
            .query_row(
                "SELECT id FROM events WHERE workspace_id = ?1 AND message_id = ?2",
                params![ws, message_id],
                |r| r.get::<_, String>(0),
            )
            .optional()
            .map_err(sql)?,
        None => None,
    };
    Ok(by_message.unwrap_or_else(|| row.id.clone()))
}

fn upsert_entity(conn: &Connection, ws: &str, entity: &EntityRow, row: &Row) -> Result<()> {
    conn.prepare_cached(
        "INSERT INTO entities (workspace_id, type, id, name, properties, first_seen, last_seen)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?6)
         ON CONFLICT DO UPDATE SET name = coalesce(excluded.name, name),
            properties = json_patch(properties, excluded.properties),
            last_seen = max(last_seen, excluded.last_seen)",
    )
    .and_then(|mut s| {
        s.execute(params![ws, entity.kind, entity.id, entity.name, entity.properties, row.ts])
    })
    .map_err(sql)?;
    if let ((Some(from_type), Some(from_id)), (Some(to_type), Some(to_id))) =
        (&row.actor, &row.object)
    {
        conn.prepare_cached(
            "INSERT INTO relationships (workspace_id, from_type, from_id, relation, to_type,
                to_id, count, first_seen, last_seen)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, 1, ?7, ?7)
             ON CONFLICT DO UPDATE SET count = count + 1,
                last_seen = max(last_seen, excluded.last_seen)",
        )
        .and_then(|mut s| {
            s.execute(params![ws, from_type, from_id, row.event, to_type, to_id, row.ts])
        })
        .map_err(sql)?;
    }
    Ok(())
}

/// Newest first, choosing the index by the filters present (a fixed query
/// with `? IS NULL OR ...` arms would defeat SQLite's planner).
pub(super) fn list(conn: &Connection, ws: &str, filter: &EventFilter) -> Result<Vec<StoredEvent>> {
    let mut sql_text =
        String::from("SELECT id, received_at, envelope FROM events WHERE workspace_id = ?");
    let mut args: Vec<SqlValue> = vec![ws.to_owned().into()];
    let mut add = |clause: &str, value: SqlValue| {
        sql_text.push_str(clause);
        args.push(value);
    };
    if let Some(event) = &filter.event {
        add(" AND event = ?", event.clone().into());
    }
    if let Some(trace) = &filter.trace_id {
        add(" AND trace_id = ?", trace.clone().into());
    }
    if let Some(business) = &filter.business_id {
        add(" AND business_id = ?", business.clone().into());
    }
    if let Some(from) = filter.from {
        add(" AND ts >= ?", from.into());
    }
    if let Some(to) = filter.to {
        add(" AND ts < ?", to.into());
    }
    sql_text.push_str(" ORDER BY ts DESC, seq DESC LIMIT ?");
    args.push(i64::try_from(filter.limit).unwrap_or(i64::MAX).into());
    let mut stmt = conn.prepare_cached(&sql_text).map_err(sql)?;
    let rows = stmt
        .query_map(params_from_iter(args), |r| {
            Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?, r.get::<_, String>(2)?))
        })
        .map_err(sql)?;
    let mut out = Vec::new();
    for row in rows {
        let (id, received_at, envelope) = row.map_err(sql)?;
        out.push(stored_event(id, received_at, &envelope)?);
    }
    Ok(out)
}

/// A stored event as read back: its row's id and receive time, and its
/// envelope parsed from the stored text.
pub(super) fn stored_event(id: String, received_at: i64, envelope: &str) -> Result<StoredEvent> {
    let envelope = serde_json::from_str(envelope).map_err(Error::internal)?;
    Ok(StoredEvent { id, received_at, envelope })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(name: &str) -> Vec<Row> {
        let mut event = opgraph_proto::Event::named(name);
        event.actor = Some(Party::Name("user-1".into()));
        prepare_rows(vec![NewEvent { id: crate::ids::new_id("evt"), received_at: 1_000, event }])
    }

    #[test]
    fn an_event_insert_builds_no_temporary_table() {
        // A partial index whose term is an IN list of more than two values
        // makes every insert build, fill and drop a temporary b-tree.
        let dir = tempfile::tempdir().unwrap();
        let conn = super::super::open_writer_connection(dir.path()).unwrap();
        let program: Vec<String> = conn
            .prepare(&format!("EXPLAIN {INSERT_EVENT}"))
            .unwrap()
            .query_map(params_from_iter([rusqlite::types::Null; 20]), |r| r.get::<_, String>(1))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        assert!(program.iter().any(|op| op == "IdxInsert"), "{program:?}");
        assert!(!program.iter().any(|op| op == "OpenEphemeral"), "{program:?}");
    }

    #[test]
    fn queued_actor_bounds_reach_their_table_at_the_flush_and_leave_with_a_rolled_back_request() {
        let dir = tempfile::tempdir().unwrap();
        let conn = super::super::open_writer_connection(dir.path()).unwrap();
        conn.execute_batch("BEGIN IMMEDIATE; SAVEPOINT job").unwrap();
        append(&conn, "ws", rows("pallet.kept"), None, None).unwrap();
        conn.execute_batch("RELEASE job; SAVEPOINT job").unwrap();
        append(&conn, "ws", rows("pallet.dropped"), None, None).unwrap();
        conn.execute_batch("ROLLBACK TO job; RELEASE job").unwrap();
        let bounds = |conn: &Connection| -> Vec<(String, i64, i64)> {
            conn.prepare(
                "SELECT event || '/' || business_id, first_ts, last_ts FROM event_actors
                 WHERE actor_id = 'user-1' ORDER BY business_id",
            )
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap()
        };
        assert_eq!(bounds(&conn), [], "queued, not yet merged");
        flush_pending(&conn).unwrap();
        conn.execute_batch("COMMIT").unwrap();
        let kept = |key: &str| (key.to_owned(), 1_000, 1_000);
        assert_eq!(bounds(&conn), [kept("pallet.kept/"), kept("pallet.kept/default")]);
        let queued: i64 =
            conn.query_row("SELECT count(*) FROM temp.pending_actors", [], |r| r.get(0)).unwrap();
        assert_eq!(queued, 0);
    }
}
