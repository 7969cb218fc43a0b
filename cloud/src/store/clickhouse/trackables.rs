//! Trackables on ClickHouse, and the link from events to them.
//!
//! A trackable is written once (registration) into a ReplacingMergeTree
//! and read with `argMax(..., version)` grouped by its id, so a row sent
//! twice is still one trackable. Uniqueness (code per workspace, scan code
//! across workspaces) is checked and written under two locks of this
//! process: the workspace's, which appends hold too, and one for all scan
//! codes. `docs/storage.md` says what a deployment of several cloud
//! processes must do.
//!
//! Resolution is the embedded store's (docs/trackables.md): [`link`] stamps
//! `trackable.id` and `trackable.kind` into the envelopes of events about to
//! be stored (from `events::insert_new`, the path every ingest takes), and
//! usage counts the workspace's events by their `trackable_code` column, so
//! events stored before the registration count too.

use std::collections::{HashMap, HashSet};

use async_trait::async_trait;
use clickhouse::Row;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::events::{EventRow, placeholders};
use super::{ClickHouseStore, Sent, run};
use crate::error::{Error, Result};
use crate::store::trackables::{
    CreateTrackable, ScanTarget, Trackable, TrackableStore, TrackableUsage,
};
use crate::trackables::TrackableKind;

/// The lock scope of scan codes, which are unique across workspaces. No
/// workspace id contains a NUL, so it never names a workspace's lock.
const SCAN_CODES: &str = "\0scan codes";

#[derive(Row, Serialize)]
struct TrackableRow<'a> {
    workspace_id: &'a str,
    id: &'a str,
    code: &'a str,
    scan_code: &'a str,
    kind: &'a str,
    name: &'a str,
    target_url: &'a str,
    event_name: &'a str,
    created_at: i64,
    version: u64,
}

/// The latest version of each trackable matching `WHERE` (appended by the
/// caller, before `GROUP BY workspace_id, id`); the order of [`Read`].
const SELECT: &str = "SELECT workspace_id, id, argMax(code, version) AS t_code,
        argMax(scan_code, version) AS t_scan_code, argMax(kind, version) AS t_kind,
        argMax(name, version) AS t_name, argMax(target_url, version) AS t_target_url,
        argMax(event_name, version) AS t_event_name, argMax(created_at, version) AS t_created_at
    FROM trackables";

#[derive(Row, Deserialize)]
struct Read {
    workspace_id: String,
    id: String,
    code: String,
    scan_code: String,
    kind: String,
    name: String,
    target_url: String,
    event_name: String,
    created_at: i64,
}

impl Read {
    fn into_trackable(self) -> Result<(String, Trackable)> {
        let kind = TrackableKind::parse(&self.kind)
            .ok_or_else(|| Error::internal(format!("unknown trackable kind {:?}", self.kind)))?;
        let optional = |text: String| (!text.is_empty()).then_some(text);
        Ok((
            self.workspace_id,
            Trackable {
                id: self.id,
                code: self.code,
                scan_code: self.scan_code,
                kind,
                name: self.name,
                target_url: optional(self.target_url),
                event_name: optional(self.event_name),
                created_at: self.created_at,
            },
        ))
    }
}

#[derive(Row, Deserialize)]
struct UsageRead {
    count: u64,
    last: i64,
}

impl ClickHouseStore {
    /// The trackables matching `condition` (a `WHERE` clause over the raw
    /// rows, with `?` for `binds`), newest first.
    async fn trackables_where(
        &self,
        condition: &str,
        binds: &[&str],
        limit: usize,
    ) -> Result<Vec<(String, Trackable)>> {
        // Ids are time-ordered, so ordering by id gives newest first, as on
        // the embedded store.
        let sql = format!(
            "{SELECT} WHERE {condition} GROUP BY workspace_id, id ORDER BY id DESC LIMIT {}",
            u64::try_from(limit).unwrap_or(u64::MAX)
        );
        let mut query = self.client.query(&sql);
        for bind in binds {
            query = query.bind(*bind);
        }
        let rows: Vec<Read> = run(query.sent().fetch_all()).await?;
        rows.into_iter().map(Read::into_trackable).collect()
    }

    async fn one_trackable(&self, condition: &str, binds: &[&str]) -> Result<Option<Trackable>> {
        Ok(self.trackables_where(condition, binds, 1).await?.pop().map(|(_, t)| t))
    }
}

/// Sets `trackable.id` and `trackable.kind` in the envelopes of `rows` that
/// carry a code registered in `ws`, as the embedded store's `link_event`
/// does. The caller holds the workspace's lock, which registration takes
/// too, so a trackable registered before the call is always found.
pub(super) async fn link(store: &ClickHouseStore, ws: &str, rows: &mut [EventRow]) -> Result<()> {
    let codes: HashSet<&str> =
        rows.iter().map(|r| r.trackable_code.as_str()).filter(|code| !code.is_empty()).collect();
    if codes.is_empty() {
        return Ok(());
    }
    let mut registered: HashMap<String, (String, String)> = HashMap::new();
    let codes: Vec<&str> = codes.into_iter().collect();
    for chunk in codes.chunks(super::events::LOOKUP_CHUNK) {
        let condition = format!("workspace_id = ? AND code IN ({})", placeholders(chunk.len()));
        let mut binds = vec![ws];
        binds.extend(chunk);
        for (_, t) in store.trackables_where(&condition, &binds, chunk.len()).await? {
            registered.insert(t.code, (t.id, t.kind.as_str().to_owned()));
        }
    }
    for row in rows.iter_mut() {
        let Some((id, kind)) = registered.get(&row.trackable_code) else { continue };
        let mut envelope: Value = serde_json::from_str(&row.envelope).map_err(Error::internal)?;
        let Some(Value::Object(trackable)) = envelope.get_mut("trackable") else { continue };
        trackable.insert("id".into(), Value::String(id.clone()));
        trackable.insert("kind".into(), Value::String(kind.clone()));
        row.envelope = envelope.to_string();
    }
    Ok(())
}

#[async_trait]
impl TrackableStore for ClickHouseStore {
    async fn create_trackable(
        &self,
        workspace_id: &str,
        trackable: &Trackable,
    ) -> Result<CreateTrackable> {
        // The workspace's lock first, as appends take it: an event appended
        // after this returns sees the trackable.
        let workspace = self.lock_for(workspace_id)?;
        let _workspace = workspace.lock().await;
        let scan_codes = self.lock_for(SCAN_CODES)?;
        let _scan_codes = scan_codes.lock().await;
        let t = trackable;
        if self
            .one_trackable("workspace_id = ? AND code = ?", &[workspace_id, &t.code])
            .await?
            .is_some()
        {
            return Ok(CreateTrackable::CodeTaken);
        }
        if self.one_trackable("scan_code = ?", &[&t.scan_code]).await?.is_some() {
            return Ok(CreateTrackable::ScanCodeTaken);
        }
        let row = TrackableRow {
            workspace_id,
            id: &t.id,
            code: &t.code,
            scan_code: &t.scan_code,
            kind: t.kind.as_str(),
            name: &t.name,
            target_url: t.target_url.as_deref().unwrap_or_default(),
            event_name: t.event_name.as_deref().unwrap_or_default(),
            created_at: t.created_at,
            version: self.clock.next(),
        };
        self.insert_rows::<TrackableRow<'_>>("trackables", &[row]).await?;
        Ok(CreateTrackable::Created)
    }

    async fn list_trackables(&self, workspace_id: &str, limit: usize) -> Result<Vec<Trackable>> {
        let found = self.trackables_where("workspace_id = ?", &[workspace_id], limit).await?;
        Ok(found.into_iter().map(|(_, t)| t).collect())
    }

    async fn get_trackable(
        &self,
        workspace_id: &str,
        id: &str,
    ) -> Result<Option<(Trackable, TrackableUsage)>> {
        let Some(trackable) =
            self.one_trackable("workspace_id = ? AND id = ?", &[workspace_id, id]).await?
        else {
            return Ok(None);
        };
        let read: UsageRead = run(self
            .client
            .query(
                "SELECT count(), max(ts) FROM events
                 WHERE workspace_id = ? AND trackable_code = ?",
            )
            .bind(workspace_id)
            .bind(trackable.code.as_str())
            .sent()
            .fetch_one())
        .await?;
        let usage = TrackableUsage {
            count: read.count,
            last_used_at: (read.count > 0).then_some(read.last),
        };
        Ok(Some((trackable, usage)))
    }

    async fn trackable_by_code(&self, workspace_id: &str, code: &str) -> Result<Option<Trackable>> {
        self.one_trackable("workspace_id = ? AND code = ?", &[workspace_id, code]).await
    }

    async fn scan_target(&self, scan_code: &str) -> Result<Option<ScanTarget>> {
        let found = self.trackables_where("scan_code = ?", &[scan_code], 1).await?;
        Ok(found
            .into_iter()
            .next()
            .map(|(workspace_id, trackable)| ScanTarget { workspace_id, trackable }))
    }
}

/// Scenarios run on both backends: the ClickHouse store must answer what
/// the embedded store answers.
#[cfg(test)]
pub(super) mod tests {

    use serde_json::{Value, json};

    use crate::store::{AppendRequest, EventFilter, NewEvent, Store, Workspace};

    use super::*;

    fn trackable(code: &str, scan_code: &str, created_at: i64) -> Trackable {
        Trackable {
            id: format!("trk_{created_at:06}"),
            code: code.into(),
            scan_code: scan_code.into(),
            kind: TrackableKind::RfidTag,
            name: "pallet".into(),
            target_url: (created_at % 2 == 0).then(|| "https://example.com/p".to_owned()),
            event_name: None,
            created_at,
        }
    }

    async fn append(store: &dyn Store, ws: &str, envelope: Value) {
        let event = opgraph_proto::Event::from_json(&envelope, crate::now_ms()).unwrap();
        let events =
            vec![NewEvent { id: crate::ids::new_id("evt"), received_at: crate::now_ms(), event }];
        store
            .append_events(
                ws,
                AppendRequest { events, idempotency_key: None, new_event_limit: None },
            )
            .await
            .unwrap();
    }

    /// What a client reads after registrations (some refused), scans and
    /// events before and after a registration.
    #[derive(Debug, PartialEq)]
    pub(crate) struct Seen {
        created: Vec<CreateTrackable>,
        listed: Vec<Vec<Trackable>>,
        by_code: Vec<Option<Trackable>>,
        scans: Vec<Option<ScanTarget>>,
        got: Vec<Option<(Trackable, TrackableUsage)>>,
        envelopes: Vec<Vec<Value>>,
    }

    /// `now`: the time events are given relative to.
    pub(crate) async fn register_and_use(store: &dyn Store, now: i64) -> Seen {
        for ws in ["ws_a", "ws_b"] {
            let workspace = Workspace { id: ws.into(), name: ws.into(), created_at: 0 };
            store.create_workspace(&workspace).await.unwrap();
        }
        // Before registration: counted, but not stamped.
        append(
            store,
            "ws_a",
            json!({"event": "rfid.read", "trackable": {"code": "EPC1"},
            "timestamp": now - 5000}),
        )
        .await;
        let first = trackable("EPC1", "scan1", 1);
        let mut created = Vec::new();
        for (ws, t) in [
            ("ws_a", first.clone()),
            ("ws_a", trackable("EPC1", "scan2", 2)),
            ("ws_b", trackable("EPC1", "scan2", 3)),
            ("ws_b", trackable("EPC2", "scan1", 4)),
            ("ws_a", trackable("EPC3", "scan3", 5)),
        ] {
            created.push(store.create_trackable(ws, &t).await.unwrap());
        }
        append(
            store,
            "ws_a",
            json!({"event": "rfid.read",
            "trackable": {"code": "EPC1", "kind": "barcode", "antenna": 2},
            "timestamp": now - 1000}),
        )
        .await;
        append(store, "ws_b", json!({"event": "rfid.read", "trackable": {"code": "EPC9"}})).await;
        let filter = EventFilter { limit: 10, ..EventFilter::default() };
        let mut envelopes = Vec::new();
        for ws in ["ws_a", "ws_b"] {
            let events = store.list_events(ws, &filter).await.unwrap();
            envelopes.push(events.into_iter().map(|e| e.envelope["trackable"].clone()).collect());
        }
        Seen {
            created,
            listed: vec![
                store.list_trackables("ws_a", 10).await.unwrap(),
                store.list_trackables("ws_b", 10).await.unwrap(),
                store.list_trackables("ws_a", 1).await.unwrap(),
            ],
            by_code: vec![
                store.trackable_by_code("ws_a", "EPC1").await.unwrap(),
                store.trackable_by_code("ws_b", "EPC3").await.unwrap(),
            ],
            scans: vec![
                store.scan_target("scan1").await.unwrap(),
                store.scan_target("scan2").await.unwrap(),
                store.scan_target("nope").await.unwrap(),
            ],
            got: vec![
                store.get_trackable("ws_a", &first.id).await.unwrap(),
                store.get_trackable("ws_a", "trk_000005").await.unwrap(),
                store.get_trackable("ws_b", &first.id).await.unwrap(),
            ],
            envelopes,
        }
    }

    #[tokio::test]
    async fn trackables_read_back_as_on_the_embedded_store() {
        let (store, _server) = crate::store::clickhouse::tests::open().await;
        let now = crate::now_ms();
        let on_clickhouse = register_and_use(&store, now).await;
        let dir = tempfile::tempdir().unwrap();
        let embedded = crate::store::embedded::EmbeddedStore::open(
            dir.path(),
            crate::store::embedded::EmbeddedOptions::default(),
        )
        .unwrap();
        let on_embedded = register_and_use(&embedded, now).await;
        embedded.close().await.unwrap();
        assert_eq!(on_clickhouse, on_embedded);

        let seen = on_clickhouse;
        use CreateTrackable::*;
        assert_eq!(seen.created, [Created, CodeTaken, Created, ScanCodeTaken, Created]);
        let ids = |list: &[Trackable]| list.iter().map(|t| t.id.clone()).collect::<Vec<_>>();
        assert_eq!(ids(&seen.listed[0]), ["trk_000005", "trk_000001"]);
        assert_eq!(ids(&seen.listed[2]), ["trk_000005"]);
        assert_eq!(seen.scans[1].as_ref().unwrap().workspace_id, "ws_b");
        assert!(seen.scans[2].is_none() && seen.by_code[1].is_none() && seen.got[2].is_none());
        let (_, usage) = seen.got[0].clone().unwrap();
        assert_eq!(usage.count, 2);
        assert_eq!(seen.got[1].clone().unwrap().1, TrackableUsage::default());
        assert_eq!(
            seen.envelopes[0],
            [
                json!({"code": "EPC1", "kind": "rfid_tag", "id": "trk_000001", "antenna": 2}),
                json!({"code": "EPC1"}),
            ]
        );
        assert_eq!(seen.envelopes[1], [json!({"code": "EPC9"})]);
    }

    /// Of many registrations of one code at once, exactly one succeeds.
    #[tokio::test]
    async fn concurrent_registrations_of_one_code_store_one() {
        let (store, _server) = crate::store::clickhouse::tests::open().await;
        let store = std::sync::Arc::new(store);
        let tasks: Vec<_> = (0..8)
            .map(|i| {
                let store = std::sync::Arc::clone(&store);
                tokio::spawn(async move {
                    let t = trackable("EPC1", &format!("scan{i}"), i);
                    store.create_trackable("ws_a", &t).await.unwrap()
                })
            })
            .collect();
        let mut created = 0;
        for task in tasks {
            created += usize::from(task.await.unwrap() == CreateTrackable::Created);
        }
        assert_eq!(created, 1);
        assert_eq!(store.list_trackables("ws_a", 10).await.unwrap().len(), 1);
    }
}
