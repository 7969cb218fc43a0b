//! Trackables in the embedded store, and the link from events to them.
//!
//! Resolution (docs/trackables.md) has two halves, both keyed by the code:
//! - at append, [`link_event`] stamps the registered `id` and `kind` into
//!   the stored envelope's `trackable` object, so every reader of the event
//!   (listing, search, exports) sees what it refers to. It runs inside
//!   `events::append`, the one path every ingest takes (HTTP, `/api/track`,
//!   scans, connectors, and gateway batches once they land).
//! - usage is counted in SQL over the `events_trackable` index on
//!   `(workspace_id, trackable_code, ts)`, so it also counts events stored
//!   before the trackable was registered.

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, params};
use serde_json::Value;

use super::{EmbeddedStore, sql};
use crate::error::{Error, Result};
use crate::store::trackables::{
    CreateTrackable, ScanTarget, Trackable, TrackableStore, TrackableUsage,
};
use crate::trackables::TrackableKind;

const COLUMNS: &str =
    "id, code, scan_code, kind, name, target_url, event_name, created_at, workspace_id";

fn from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<(String, Trackable)> {
    let kind: String = row.get(3)?;
    let kind = TrackableKind::parse(&kind).ok_or_else(|| {
        rusqlite::Error::FromSqlConversionFailure(
            3,
            rusqlite::types::Type::Text,
            format!("unknown trackable kind {kind:?}").into(),
        )
    })?;
    Ok((
        row.get(8)?,
        Trackable {
            id: row.get(0)?,
            code: row.get(1)?,
            scan_code: row.get(2)?,
            kind,
            name: row.get(4)?,
            target_url: row.get(5)?,
            event_name: row.get(6)?,
            created_at: row.get(7)?,
        },
    ))
}

/// The stored envelope with `trackable.id` and `trackable.kind` set to the
/// registered trackable's, or `None` when no trackable of the workspace has
/// this code or the envelope already says so. Runs in the writer's
/// transaction, so a trackable registered by an earlier write of the same
/// group is found.
pub(super) fn link_event(
    conn: &Connection,
    ws: &str,
    code: &str,
    envelope: &str,
) -> Result<Option<String>> {
    let found: Option<(String, String)> = conn
        .prepare_cached("SELECT id, kind FROM trackables WHERE workspace_id = ?1 AND code = ?2")
        .and_then(|mut s| s.query_row(params![ws, code], |r| Ok((r.get(0)?, r.get(1)?))).optional())
        .map_err(sql)?;
    let Some((id, kind)) = found else { return Ok(None) };
    let mut value: Value = serde_json::from_str(envelope).map_err(Error::internal)?;
    let Some(Value::Object(trackable)) = value.get_mut("trackable") else { return Ok(None) };
    if trackable.get("id").and_then(Value::as_str) == Some(id.as_str())
        && trackable.get("kind").and_then(Value::as_str) == Some(kind.as_str())
    {
        return Ok(None);
    }
    trackable.insert("id".into(), Value::String(id));
    trackable.insert("kind".into(), Value::String(kind));
    Ok(Some(value.to_string()))
}

fn usage(conn: &Connection, ws: &str, code: &str) -> Result<TrackableUsage> {
    conn.prepare_cached(
        "SELECT count(*), max(ts) FROM events WHERE workspace_id = ?1 AND trackable_code = ?2",
    )
    .and_then(|mut s| {
        s.query_row(params![ws, code], |r| {
            Ok(TrackableUsage { count: r.get::<_, i64>(0)?.max(0) as u64, last_used_at: r.get(1)? })
        })
    })
    .map_err(sql)
}

#[async_trait]
impl TrackableStore for EmbeddedStore {
    async fn create_trackable(
        &self,
        workspace_id: &str,
        trackable: &Trackable,
    ) -> Result<CreateTrackable> {
        let (ws, t) = (workspace_id.to_owned(), trackable.clone());
        self.write(move |conn| {
            let taken = |query: &str, args: &[&str]| -> Result<bool> {
                conn.prepare_cached(query)
                    .and_then(|mut s| {
                        s.query_row(rusqlite::params_from_iter(args), |_| Ok(())).optional()
                    })
                    .map(|found| found.is_some())
                    .map_err(sql)
            };
            if taken(
                "SELECT 1 FROM trackables WHERE workspace_id = ?1 AND code = ?2",
                &[&ws, &t.code],
            )? {
                return Ok(CreateTrackable::CodeTaken);
            }
            if taken("SELECT 1 FROM trackables WHERE scan_code = ?1", &[&t.scan_code])? {
                return Ok(CreateTrackable::ScanCodeTaken);
            }
            conn.execute(
                "INSERT INTO trackables (workspace_id, id, code, scan_code, kind, name,
                    target_url, event_name, created_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
                params![
                    ws,
                    t.id,
                    t.code,
                    t.scan_code,
                    t.kind.as_str(),
                    t.name,
                    t.target_url,
                    t.event_name,
                    t.created_at
                ],
            )
            .map_err(sql)?;
            Ok(CreateTrackable::Created)
        })
        .await
    }

    async fn list_trackables(&self, workspace_id: &str, limit: usize) -> Result<Vec<Trackable>> {
        let ws = workspace_id.to_owned();
        self.read(move |conn| {
            // Ids are time-ordered, so the primary key gives newest first.
            let mut stmt = conn
                .prepare_cached(&format!(
                    "SELECT {COLUMNS} FROM trackables WHERE workspace_id = ?1
                     ORDER BY id DESC LIMIT ?2"
                ))
                .map_err(sql)?;
            let rows = stmt
                .query_map(params![ws, i64::try_from(limit).unwrap_or(i64::MAX)], from_row)
                .map_err(sql)?;
            rows.map(|r| r.map(|(_, t)| t)).collect::<rusqlite::Result<Vec<_>>>().map_err(sql)
        })
        .await
    }

    async fn get_trackable(
        &self,
        workspace_id: &str,
        id: &str,
    ) -> Result<Option<(Trackable, TrackableUsage)>> {
        let (ws, id) = (workspace_id.to_owned(), id.to_owned());
        self.read(move |conn| {
            let found = conn
                .prepare_cached(&format!(
                    "SELECT {COLUMNS} FROM trackables WHERE workspace_id = ?1 AND id = ?2"
                ))
                .and_then(|mut s| s.query_row(params![ws, id], from_row).optional())
                .map_err(sql)?;
            match found {
                None => Ok(None),
                Some((_, trackable)) => {
                    let usage = usage(conn, &ws, &trackable.code)?;
                    Ok(Some((trackable, usage)))
                }
            }
        })
        .await
    }

    async fn trackable_by_code(&self, workspace_id: &str, code: &str) -> Result<Option<Trackable>> {
        let (ws, code) = (workspace_id.to_owned(), code.to_owned());
        self.read(move |conn| {
            conn.prepare_cached(&format!(
                "SELECT {COLUMNS} FROM trackables WHERE workspace_id = ?1 AND code = ?2"
            ))
            .and_then(|mut s| s.query_row(params![ws, code], from_row).optional())
            .map(|found| found.map(|(_, t)| t))
            .map_err(sql)
        })
        .await
    }

    async fn scan_target(&self, scan_code: &str) -> Result<Option<ScanTarget>> {
        let scan_code = scan_code.to_owned();
        self.read(move |conn| {
            conn.prepare_cached(&format!("SELECT {COLUMNS} FROM trackables WHERE scan_code = ?1"))
                .and_then(|mut s| s.query_row(params![scan_code], from_row).optional())
                .map(|found| {
                    found.map(|(workspace_id, trackable)| ScanTarget { workspace_id, trackable })
                })
                .map_err(sql)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{AppendRequest, EventFilter, NewEvent, Store, Workspace};
    use serde_json::json;

    fn trackable(code: &str, scan_code: &str) -> Trackable {
        Trackable {
            id: crate::ids::new_id("trk"),
            code: code.into(),
            scan_code: scan_code.into(),
            kind: TrackableKind::RfidTag,
            name: "pallet".into(),
            target_url: None,
            event_name: None,
            created_at: crate::now_ms(),
        }
    }

    async fn store() -> (tempfile::TempDir, EmbeddedStore) {
        let (store, dir) = crate::store::embedded::temp_store();
        for ws in ["ws_a", "ws_b"] {
            let workspace = Workspace { id: ws.into(), name: ws.into(), created_at: 0 };
            store.create_workspace(&workspace).await.unwrap();
        }
        (dir, store)
    }

    async fn append(store: &EmbeddedStore, ws: &str, envelope: serde_json::Value) -> String {
        let event = opgraph_proto::Event::from_json(&envelope, crate::now_ms()).unwrap();
        let request = AppendRequest {
            events: vec![NewEvent {
                id: crate::ids::new_id("evt"),
                received_at: crate::now_ms(),
                event,
            }],
            idempotency_key: None,
            new_event_limit: None,
        };
        store.append_events(ws, request).await.unwrap().ids.remove(0)
    }

    #[tokio::test]
    async fn codes_are_unique_per_workspace_and_scan_codes_globally() {
        let (_dir, store) = store().await;
        let first = trackable("EPC1", "scan1");
        assert_eq!(store.create_trackable("ws_a", &first).await.unwrap(), CreateTrackable::Created);
        let same_code = trackable("EPC1", "scan2");
        assert_eq!(
            store.create_trackable("ws_a", &same_code).await.unwrap(),
            CreateTrackable::CodeTaken
        );
        // Another workspace may register the same external code...
        assert_eq!(
            store.create_trackable("ws_b", &same_code).await.unwrap(),
            CreateTrackable::Created
        );
        // ...but never reuse a scan code.
        assert_eq!(
            store.create_trackable("ws_b", &trackable("EPC2", "scan1")).await.unwrap(),
            CreateTrackable::ScanCodeTaken
        );
        let target = store.scan_target("scan2").await.unwrap().unwrap();
        assert_eq!(target.workspace_id, "ws_b");
        assert_eq!(target.trackable, same_code);
        assert!(store.scan_target("nope").await.unwrap().is_none());
        assert!(store.get_trackable("ws_b", &first.id).await.unwrap().is_none());
        let listed = store.list_trackables("ws_a", 10).await.unwrap();
        assert_eq!(listed, vec![first]);
        store.close().await.unwrap();
    }

    #[tokio::test]
    async fn events_with_the_code_link_to_the_trackable_and_count_as_usage() {
        let (_dir, store) = store().await;
        let now = crate::now_ms();
        // Before registration: counted, but not stamped.
        append(
            &store,
            "ws_a",
            json!({"event": "rfid.read", "trackable": {"code": "EPC9"},
            "timestamp": now - 5000}),
        )
        .await;
        let t = trackable("EPC9", "scan9");
        store.create_trackable("ws_a", &t).await.unwrap();
        append(&store, "ws_a", json!({"event": "rfid.read",
            "trackable": {"code": "EPC9", "kind": "barcode", "antenna": 2}, "timestamp": now - 1000}))
        .await;
        // Same code in another workspace: neither linked nor counted.
        append(&store, "ws_b", json!({"event": "rfid.read", "trackable": {"code": "EPC9"}})).await;

        let (_, usage) = store.get_trackable("ws_a", &t.id).await.unwrap().unwrap();
        assert_eq!(usage, TrackableUsage { count: 2, last_used_at: Some(now - 1000) });
        let filter = EventFilter { limit: 10, ..EventFilter::default() };
        let events = store.list_events("ws_a", &filter).await.unwrap();
        assert_eq!(
            events[0].envelope["trackable"],
            json!({"code": "EPC9", "kind": "rfid_tag", "id": t.id, "antenna": 2})
        );
        assert_eq!(events[1].envelope["trackable"], json!({"code": "EPC9"}));
        let other = store.list_events("ws_b", &filter).await.unwrap();
        assert_eq!(other[0].envelope["trackable"], json!({"code": "EPC9"}));
        store.close().await.unwrap();
    }

    #[tokio::test]
    async fn usage_is_read_through_the_trackable_index() {
        let (_dir, store) = store().await;
        let plan: String = store
            .read(|conn| {
                conn.query_row(
                    "EXPLAIN QUERY PLAN SELECT count(*), max(ts) FROM events
                     WHERE workspace_id = 'ws_a' AND trackable_code = 'x'",
                    [],
                    |r| r.get::<_, String>(3),
                )
                .map_err(sql)
            })
            .await
            .unwrap();
        assert!(plan.contains("events_trackable"), "{plan}");
        store.close().await.unwrap();
    }
}
