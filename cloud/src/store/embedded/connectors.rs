//! Connector records in the embedded store: `(workspace, provider, record
//! id) → event id`, and the sync log.
//!
//! A known record's event is replaced: its old row is removed together with
//! what the append derived from it (search entry, hourly rollup, actor
//! bounds, the relationship count), then the new version is appended under the same id
//! through `events::append`, the path every event takes. Both happen in the
//! writer's transaction, so readers see the old version or the new one,
//! never both or neither.

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, params};

use super::search::Hints;
use super::{EmbeddedStore, events, sql};
use crate::error::{Error, Result};
use crate::store::connectors::{ConnectorRecord, ConnectorStore, ConnectorUpsert, SyncRecord};

const HOUR_MS: i64 = 3_600_000;

/// Removes an event and reverses what `events::append` derived from it.
/// Keep in step with `events::append`: whatever it adds per event, this
/// takes away. Usage counters are left alone (see [`upsert`]).
fn remove_event(conn: &Connection, ws: &str, event_id: &str) -> Result<()> {
    type Old = (i64, String, String, i64, Option<f64>, Option<[String; 4]>, bool, Option<String>);
    let old: Option<Old> = conn
        .prepare_cached(
            "SELECT seq, business_id, event, ts, revenue, actor_type, actor_id, object_type,
                object_id,
                json_type(envelope, '$.entity.type') IN ('text', 'integer', 'real')
                AND json_type(envelope, '$.entity.id') IN ('text', 'integer', 'real')
             FROM events WHERE workspace_id = ?1 AND id = ?2",
        )
        .and_then(|mut s| {
            s.query_row(params![ws, event_id], |r| {
                let parties: [Option<String>; 4] = [r.get(5)?, r.get(6)?, r.get(7)?, r.get(8)?];
                let parties = match parties {
                    [Some(a), Some(b), Some(c), Some(d)] => Some([a, b, c, d]),
                    _ => None,
                };
                Ok((
                    r.get(0)?,
                    r.get(1)?,
                    r.get(2)?,
                    r.get(3)?,
                    r.get(4)?,
                    parties,
                    r.get::<_, Option<bool>>(9)?.unwrap_or(false),
                    r.get(6)?,
                ))
            })
            .optional()
        })
        .map_err(sql)?;
    let Some((seq, business, event, ts, revenue, parties, has_entity, actor)) = old else {
        return Ok(());
    };
    let hour = ts.div_euclid(HOUR_MS);
    let run = |query: &str, args: &[&dyn rusqlite::ToSql]| -> Result<()> {
        conn.prepare_cached(query).and_then(|mut s| s.execute(args)).map(|_| ()).map_err(sql)
    };
    // The search index drops its entry when it reads the log.
    super::search::log_removal(conn, seq).map_err(sql)?;
    run(
        "UPDATE event_counts_hourly SET count = count - 1, revenue = revenue - ?5
         WHERE workspace_id = ?1 AND business_id = ?2 AND event = ?3 AND hour = ?4",
        &[&ws, &business, &event, &hour, &revenue.unwrap_or(0.0)],
    )?;
    run(
        "DELETE FROM event_counts_hourly
         WHERE workspace_id = ?1 AND business_id = ?2 AND event = ?3 AND hour = ?4
            AND count <= 0",
        &[&ws, &business, &event, &hour],
    )?;
    // The actor's other events of this name still span (first, last) when
    // this one lies strictly inside and none is queued in this transaction;
    // otherwise the bounds become unknown (i64::MIN, i64::MAX), and
    // distinct-actor counts of this event name read events from then on
    // (docs/queries.md). Its business's row and the all-businesses one ('').
    for business in [business.as_str(), ""] {
        let Some(actor) = &actor else { break };
        run(
            "INSERT INTO event_actors (workspace_id, event, business_id, actor_id, first_ts,
                last_ts)
             VALUES (?1, ?2, ?3, ?4, -9223372036854775808, 9223372036854775807)
             ON CONFLICT DO UPDATE SET first_ts = excluded.first_ts, last_ts = excluded.last_ts
             WHERE NOT (first_ts < ?5 AND last_ts > ?5) OR EXISTS (
                SELECT 1 FROM temp.pending_actors AS p WHERE p.workspace_id = ?1
                    AND p.event = ?2 AND p.business_id = ?3 AND p.actor_id = ?4)",
            &[&ws, &event, &business, actor, &ts],
        )?;
    }
    if let (true, Some([from_type, from_id, to_type, to_id])) = (has_entity, &parties) {
        run(
            "UPDATE relationships SET count = count - 1
             WHERE workspace_id = ?1 AND from_type = ?2 AND from_id = ?3 AND relation = ?4
                AND to_type = ?5 AND to_id = ?6",
            &[&ws, from_type, from_id, &event, to_type, to_id],
        )?;
        run(
            "DELETE FROM relationships
             WHERE workspace_id = ?1 AND from_type = ?2 AND from_id = ?3 AND relation = ?4
                AND to_type = ?5 AND to_id = ?6 AND count <= 0",
            &[&ws, from_type, from_id, &event, to_type, to_id],
        )?;
    }
    run("DELETE FROM events WHERE seq = ?1", &[&seq])?;
    Ok(())
}

/// Stores each record's event, new or replacing, then the sync record.
/// Usage meters new events only: a replaced event is an update, so the
/// count the re-append added is taken back.
fn upsert(
    conn: &Connection,
    ws: &str,
    records: Vec<ConnectorRecord>,
    mut sync: SyncRecord,
    new_event_limit: Option<u64>,
    hints: &Hints,
) -> Result<ConnectorUpsert> {
    let now = crate::now_ms();
    let mut out =
        ConnectorUpsert { ids: Vec::with_capacity(records.len()), ingested: 0, updated: 0 };
    for ConnectorRecord { record_id, mut event } in records {
        let known: Option<String> = conn
            .prepare_cached(
                "SELECT event_id FROM connector_records
                 WHERE workspace_id = ?1 AND provider = ?2 AND record_id = ?3",
            )
            .and_then(|mut s| {
                s.query_row(params![ws, sync.provider, record_id], |r| r.get(0)).optional()
            })
            .map_err(sql)?;
        match known {
            Some(id) => {
                remove_event(conn, ws, &id)?;
                event.id = id;
                out.updated += 1;
            }
            None => out.ingested += 1,
        }
        let appended =
            events::append(conn, ws, events::prepare_rows(vec![event]), None, Some(hints))?;
        let id = appended
            .ids
            .into_iter()
            .next()
            .ok_or_else(|| Error::internal("append returned no id"))?;
        conn.prepare_cached(
            "INSERT INTO connector_records (workspace_id, provider, record_id, event_id,
                first_synced_at, last_synced_at, syncs)
             VALUES (?1, ?2, ?3, ?4, ?5, ?5, 1)
             ON CONFLICT DO UPDATE SET event_id = excluded.event_id,
                last_synced_at = excluded.last_synced_at, syncs = syncs + 1",
        )
        .and_then(|mut s| s.execute(params![ws, sync.provider, record_id, id, now]))
        .map_err(sql)?;
        out.ids.push(id);
    }
    // An error rolls the job back: nothing of it stays.
    if new_event_limit.is_some_and(|left| out.ingested > left) {
        return Err(crate::usage::quota_exceeded());
    }
    if out.updated > 0 {
        conn.prepare_cached(
            "UPDATE usage_daily SET events_ingested = max(0, events_ingested - ?3)
             WHERE workspace_id = ?1 AND day = ?2",
        )
        .and_then(|mut s| {
            s.execute(params![
                ws,
                now.div_euclid(events::DAY_MS),
                i64::try_from(out.updated).unwrap_or(i64::MAX)
            ])
        })
        .map_err(sql)?;
    }
    sync.ingested = out.ingested;
    sync.updated = out.updated;
    let count = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    conn.prepare_cached(
        "INSERT INTO connector_syncs (workspace_id, id, provider, business_id, received,
            ingested, updated, rejected, created_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
    )
    .and_then(|mut s| {
        s.execute(params![
            ws,
            sync.id,
            sync.provider,
            sync.business_id,
            count(sync.received),
            count(sync.ingested),
            count(sync.updated),
            count(sync.rejected),
            sync.created_at
        ])
    })
    .map_err(sql)?;
    Ok(out)
}

#[async_trait]
impl ConnectorStore for EmbeddedStore {
    async fn upsert_connector_records(
        &self,
        workspace_id: &str,
        records: Vec<ConnectorRecord>,
        sync: SyncRecord,
        new_event_limit: Option<u64>,
    ) -> Result<ConnectorUpsert> {
        let ws = workspace_id.to_owned();
        let hints = self.search.hints();
        self.write(move |conn| upsert(conn, &ws, records, sync, new_event_limit, &hints)).await
    }

    async fn list_connector_syncs(
        &self,
        workspace_id: &str,
        limit: usize,
    ) -> Result<Vec<SyncRecord>> {
        let ws = workspace_id.to_owned();
        self.read(move |conn| {
            let mut stmt = conn
                .prepare_cached(
                    "SELECT id, provider, business_id, received, ingested, updated, rejected,
                        created_at
                     FROM connector_syncs WHERE workspace_id = ?1
                     ORDER BY created_at DESC, id DESC LIMIT ?2",
                )
                .map_err(sql)?;
            let count = |v: i64| v.max(0) as u64;
            let rows = stmt
                .query_map(params![ws, i64::try_from(limit).unwrap_or(i64::MAX)], |r| {
                    Ok(SyncRecord {
                        id: r.get(0)?,
                        provider: r.get(1)?,
                        business_id: r.get(2)?,
                        received: count(r.get(3)?),
                        ingested: count(r.get(4)?),
                        updated: count(r.get(5)?),
                        rejected: count(r.get(6)?),
                        created_at: r.get(7)?,
                    })
                })
                .map_err(sql)?;
            rows.collect::<rusqlite::Result<Vec<_>>>().map_err(sql)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{EventFilter, NewEvent, Store, UsageTotals, Workspace};
    use serde_json::json;

    fn record(id: &str, total: f64, now: i64) -> ConnectorRecord {
        record_at(id, total, now, now - 60_000)
    }

    fn record_at(id: &str, total: f64, now: i64, at: i64) -> ConnectorRecord {
        let envelope = json!({
            "event": "order.created",
            "businessId": "default",
            "actor": {"type": "customer", "id": "shopify:7"},
            "object": {"type": "order", "id": format!("shopify:{id}")},
            "entity": {"type": "order", "id": format!("shopify:{id}")},
            "outcome": {"revenue": total, "currency": "USD"},
            "properties": {"note": format!("total {total}")},
            "timestamp": at,
        });
        ConnectorRecord {
            record_id: id.into(),
            event: NewEvent {
                id: crate::ids::new_id("evt"),
                received_at: now,
                event: opgraph_proto::Event::from_json(&envelope, now).unwrap(),
            },
        }
    }

    fn sync(received: u64) -> SyncRecord {
        SyncRecord {
            id: crate::ids::new_id("syn"),
            provider: "shopify".into(),
            business_id: "default".into(),
            received,
            ingested: 0,
            updated: 0,
            rejected: 0,
            created_at: crate::now_ms(),
        }
    }

    /// A replaced event that was the newest gives its `seq` to its
    /// replacement (SQLite takes the largest plus one): the search index,
    /// which had indexed the first, must drop it and index the second.
    #[tokio::test]
    async fn a_replacement_that_reuses_the_seq_is_what_search_finds() {
        use crate::store::queries::{QueryStore, SearchQuery};
        let (store, _dir) = crate::store::embedded::temp_store();
        let now = crate::now_ms();
        let search = |text: &str| SearchQuery {
            text: text.into(),
            range: None,
            event: None,
            business_id: None,
            limit: 10,
        };
        async fn newest_seq(store: &EmbeddedStore) -> i64 {
            let newest = store.read(|conn| {
                conn.query_row("SELECT max(seq) FROM events", [], |r| r.get::<_, i64>(0))
                    .map_err(sql)
            });
            newest.await.unwrap()
        }
        store
            .upsert_connector_records("ws_a", vec![record("1", 10.0, now)], sync(1), None)
            .await
            .unwrap();
        assert_eq!(store.search_events("ws_a", &search("total 10")).await.unwrap().total, 1);
        let before = newest_seq(&store).await;
        store
            .upsert_connector_records("ws_a", vec![record("1", 12.0, now)], sync(1), None)
            .await
            .unwrap();
        assert_eq!(newest_seq(&store).await, before, "the replacement took the same seq");
        assert_eq!(store.search_events("ws_a", &search("total 10")).await.unwrap().total, 0);
        assert_eq!(store.search_events("ws_a", &search("total 12")).await.unwrap().total, 1);
    }

    #[tokio::test]
    async fn resync_replaces_the_event_and_its_derived_rows() {
        let (store, _dir) = crate::store::embedded::temp_store();
        let ws = Workspace { id: "ws_a".into(), name: "a".into(), created_at: 0 };
        store.create_workspace(&ws).await.unwrap();
        let now = crate::now_ms();

        let first = store
            .upsert_connector_records(
                "ws_a",
                vec![record("1", 10.0, now), record("2", 5.0, now)],
                sync(2),
                None,
            )
            .await
            .unwrap();
        assert_eq!((first.ingested, first.updated), (2, 0));
        // Record 1 again, twice in one call, with a new total.
        let second = store
            .upsert_connector_records(
                "ws_a",
                vec![record("1", 12.0, now), record("1", 15.0, now), record("3", 1.0, now)],
                sync(3),
                None,
            )
            .await
            .unwrap();
        assert_eq!((second.ingested, second.updated), (1, 2));
        assert_eq!(second.ids[0], first.ids[0]);
        assert_eq!(second.ids[1], first.ids[0]);

        let events = store
            .list_events("ws_a", &EventFilter { limit: 100, ..EventFilter::default() })
            .await
            .unwrap();
        assert_eq!(events.len(), 3);
        let one = events.iter().find(|e| e.id == first.ids[0]).unwrap();
        assert_eq!(one.envelope["outcome"]["revenue"], json!(15.0));

        // Replaced, and the replacements may have taken the removed
        // events' `seq`: once the index has caught up it holds one entry
        // per event that remains.
        store.wait_for_search_index().await.unwrap();
        let (rollup, relation, fts, usage) = store
            .read(|conn| {
                let one = |q: &str| conn.query_row(q, [], |r| r.get::<_, f64>(0)).map_err(sql);
                Ok((
                    (
                        one("SELECT sum(count) FROM event_counts_hourly")?,
                        one("SELECT sum(revenue) FROM event_counts_hourly")?,
                    ),
                    one("SELECT sum(count) FROM relationships")?,
                    super::super::search::entries_covering(conn, "total").map_err(sql)?,
                    one("SELECT sum(events_ingested) FROM usage_daily")?,
                ))
            })
            .await
            .unwrap();
        assert_eq!(rollup, (3.0, 21.0));
        assert_eq!(relation, 3.0);
        assert_eq!(fts, 3);
        assert_eq!(usage, 3.0);
        let totals = store.usage("ws_a", now - 1000, now + 1000).await.unwrap();
        assert_eq!(totals, UsageTotals { events_ingested: 3, api_calls: 0 });

        let syncs = store.list_connector_syncs("ws_a", 10).await.unwrap();
        assert_eq!(syncs.len(), 2);
        assert_eq!((syncs[0].received, syncs[0].ingested, syncs[0].updated), (3, 1, 2));
        store.close().await.unwrap();
    }

    #[tokio::test]
    async fn a_replaced_event_keeps_the_actor_bounds_true() {
        use crate::store::queries::{QueryStore, Range, TotalsQuery};
        let (store, _dir) = crate::store::embedded::temp_store();
        let ws = Workspace { id: "ws_a".into(), name: "a".into(), created_at: 0 };
        store.create_workspace(&ws).await.unwrap();
        let now = crate::now_ms();
        let m = 60_000;
        let at = |id: &str, minutes_ago: i64| record_at(id, 1.0, now, now - minutes_ago * m);
        let records = vec![at("1", 30), at("2", 20), at("3", 10)];
        store.upsert_connector_records("ws_a", records, sync(3), None).await.unwrap();
        let bounds = || {
            store.read(|conn| {
                let q = "SELECT first_ts, last_ts FROM event_actors WHERE business_id = ''";
                conn.query_row(q, [], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?)))
                    .map_err(sql)
            })
        };
        let unique = |from_ago: i64, to_ago: i64| {
            let query = TotalsQuery {
                range: Some(Range { from: now - from_ago * m, to: now - to_ago * m }),
                unique_actors: true,
                limit: 10,
                ..TotalsQuery::default()
            };
            let store = &store;
            async move {
                let totals = store.event_totals("ws_a", &query).await.unwrap();
                totals.events.iter().map(|e| e.unique_actors.unwrap()).sum::<u64>()
            }
        };
        assert_eq!(bounds().await.unwrap(), (now - 30 * m, now - 10 * m));
        // The middle one replaced: the bounds still hold.
        store.upsert_connector_records("ws_a", vec![at("2", 20)], sync(1), None).await.unwrap();
        assert_eq!(bounds().await.unwrap(), (now - 30 * m, now - 10 * m));
        // The first one moved later: its old time was a bound, now unknown;
        // counts read the events.
        store.upsert_connector_records("ws_a", vec![at("1", 15)], sync(1), None).await.unwrap();
        assert_eq!(bounds().await.unwrap(), (i64::MIN, i64::MAX));
        assert_eq!(unique(40, 0).await, 1);
        assert_eq!(unique(40, 25).await, 0);
        assert_eq!(unique(16, 14).await, 1);
        store.close().await.unwrap();
    }
}
