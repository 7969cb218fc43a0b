//! Entities and relationships on ClickHouse: each stored event that
//! carries `entity` adds an observation of the entity (and, when its actor
//! and object are both typed references, of the edge between them); reads
//! fold the observations the way the embedded store's upserts do: the
//! latest name given is kept, properties are JSON merge patches applied in
//! storage order, `first_seen` is the first observation's time and
//! `last_seen` the latest, edges are counted.
//!
//! Every observation carries the `seq` of the event that made it, and
//! reads count each `seq` once: a resend can write an event's observations
//! again (see [`observe_again`]) without counting it twice. Folding
//! entities is unaffected by such a repeat: the same patch applied twice
//! in a row is the same patch.

use std::collections::HashSet;

use clickhouse::Row;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::events::{EventRow, LOOKUP_CHUNK};
use super::{ClickHouseStore, Sent, run};
use crate::error::{Error, Result};
use crate::store::columns::text_at;
use crate::store::queries::{Entity, Relationship};

#[derive(Row, Serialize)]
struct EntityRow<'a> {
    workspace_id: &'a str,
    r#type: String,
    id: String,
    name: String,
    has_name: u8,
    properties: String,
    ts: i64,
    seq: u64,
}

/// One observation of an edge: what `relationship_observations` holds
/// besides the workspace.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct Edge {
    pub(super) from_type: String,
    pub(super) from_id: String,
    pub(super) relation: String,
    pub(super) to_type: String,
    pub(super) to_id: String,
    pub(super) ts: i64,
}

#[derive(Row, Serialize)]
pub(super) struct EdgeRow<'a> {
    pub(super) workspace_id: &'a str,
    pub(super) from_type: &'a str,
    pub(super) from_id: &'a str,
    pub(super) relation: &'a str,
    pub(super) to_type: &'a str,
    pub(super) to_id: &'a str,
    pub(super) ts: i64,
    /// The observing event's; 0 for edges stored before schema version 3.
    pub(super) seq: u64,
}

impl Edge {
    pub(super) fn row<'a>(&'a self, ws: &'a str, seq: u64) -> EdgeRow<'a> {
        EdgeRow {
            workspace_id: ws,
            from_type: &self.from_type,
            from_id: &self.from_id,
            relation: &self.relation,
            to_type: &self.to_type,
            to_id: &self.to_id,
            ts: self.ts,
            seq,
        }
    }
}

/// The envelope of a row that names an entity (`entity` with a type and
/// an id), with that type and id.
fn with_entity(row: &EventRow) -> Result<Option<(Value, String, String)>> {
    // Only envelopes that mention `entity` are parsed again.
    if !row.envelope.contains("\"entity\"") {
        return Ok(None);
    }
    let envelope: Value = serde_json::from_str(&row.envelope).map_err(Error::internal)?;
    let Some(entity) = envelope.get("entity").and_then(Value::as_object) else {
        return Ok(None);
    };
    let (Some(kind), Some(id)) = (text_at(Some(entity), "type"), text_at(Some(entity), "id"))
    else {
        return Ok(None);
    };
    Ok(Some((envelope, kind, id)))
}

/// The edge a stored row observed: between its actor and object when both
/// are typed references and it names an entity.
pub(super) fn edge_of(row: &EventRow) -> Result<Option<Edge>> {
    if row.actor_type.is_empty() || row.object_type.is_empty() || with_entity(row)?.is_none() {
        return Ok(None);
    }
    Ok(Some(Edge {
        from_type: row.actor_type.clone(),
        from_id: row.actor_id.clone(),
        relation: row.event.clone(),
        to_type: row.object_type.clone(),
        to_id: row.object_id.clone(),
        ts: row.ts,
    }))
}

/// Records what the freshly stored `rows` say about entities and edges;
/// the rows named in `same_edge` add no edge observation (their previous
/// version's is kept).
pub(super) async fn observe(
    store: &ClickHouseStore,
    ws: &str,
    rows: &[EventRow],
    same_edge: &HashSet<String>,
) -> Result<()> {
    let mut entities = Vec::new();
    let mut edges = Vec::new();
    for row in rows {
        let Some((envelope, kind, id)) = with_entity(row)? else {
            continue;
        };
        let Some(entity) = envelope.get("entity").and_then(Value::as_object) else {
            continue;
        };
        let name = text_at(Some(entity), "name");
        let properties = entity
            .get("properties")
            .filter(|p| p.is_object())
            .map_or_else(|| "{}".to_owned(), Value::to_string);
        entities.push(EntityRow {
            workspace_id: ws,
            r#type: kind,
            id,
            has_name: u8::from(name.is_some()),
            name: name.unwrap_or_default(),
            properties,
            ts: row.ts,
            seq: row.seq,
        });
        if !row.actor_type.is_empty() && !row.object_type.is_empty() && !same_edge.contains(&row.id)
        {
            edges.push(EdgeRow {
                workspace_id: ws,
                from_type: &row.actor_type,
                from_id: &row.actor_id,
                relation: &row.event,
                to_type: &row.object_type,
                to_id: &row.object_id,
                ts: row.ts,
                seq: row.seq,
            });
        }
    }
    // Edges first: an event's entity row then shows that its observations
    // are all stored (`observe_again`).
    store.insert_rows::<EdgeRow<'_>>("relationship_observations", &edges).await?;
    store.insert_rows::<EntityRow<'_>>("entity_observations", &entities).await
}

/// For stored `rows` (with their stored `seq`) that a resend found by id:
/// writes again the observations of those whose entity row is missing,
/// because the attempt that stored them failed before their observations
/// were all written. Rows whose entity row is there are complete (it is
/// written last) and are left alone: a connector event may keep an older
/// version's edge under that version's `seq`.
pub(super) async fn observe_again(
    store: &ClickHouseStore,
    ws: &str,
    rows: &[EventRow],
) -> Result<()> {
    let mut observing = Vec::new();
    for row in rows {
        if let Some((_, kind, id)) = with_entity(row)? {
            observing.push((row, kind, id));
        }
    }
    let mut present = HashSet::new();
    for chunk in observing.chunks(LOOKUP_CHUNK) {
        // Through the table's key (type, id), then the seq.
        let sql = format!(
            "SELECT DISTINCT seq FROM entity_observations
             WHERE workspace_id = ? AND (type, id, seq) IN ({})",
            vec!["(?, ?, ?)"; chunk.len()].join(", ")
        );
        let mut query = store.client.query(&sql).bind(ws);
        for (row, kind, id) in chunk {
            query = query.bind(kind.as_str()).bind(id.as_str()).bind(row.seq);
        }
        let seqs: Vec<u64> = run(query.sent().fetch_all()).await?;
        present.extend(seqs);
    }
    let missing: Vec<EventRow> = observing
        .into_iter()
        .filter(|(row, _, _)| !present.contains(&row.seq))
        .map(|(row, _, _)| row.clone())
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    observe(store, ws, &missing, &HashSet::new()).await
}

/// RFC 7396 merge patch, as SQLite's `json_patch`.
fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    if let Value::Object(map) = target {
        for (key, value) in patch {
            if value.is_null() {
                map.remove(key);
            } else {
                merge_patch(map.entry(key.clone()).or_insert(Value::Null), value);
            }
        }
    }
}

#[derive(Row, Deserialize)]
struct EntityRead {
    kind: String,
    id: String,
    name: String,
    has_name: u8,
    first_seen: i64,
    last_seen: i64,
}

#[derive(Row, Deserialize)]
struct PatchRead {
    kind: String,
    id: String,
    properties: String,
}

pub(super) async fn list_entities(
    store: &ClickHouseStore,
    ws: &str,
    kind: Option<&str>,
    limit: usize,
) -> Result<Vec<Entity>> {
    let filter = if kind.is_some() { " AND type = ?" } else { "" };
    let sql = format!(
        "SELECT type, id, argMaxIf(name, seq, has_name = 1), max(has_name),
            argMin(ts, seq), max(ts) AS last
         FROM entity_observations WHERE workspace_id = ?{filter}
         GROUP BY type, id ORDER BY last DESC, type, id LIMIT {}",
        u64::try_from(limit).unwrap_or(u64::MAX)
    );
    let mut query = store.client.query(&sql).bind(ws);
    if let Some(kind) = kind {
        query = query.bind(kind);
    }
    let found: Vec<EntityRead> = run(query.sent().fetch_all()).await?;
    if found.is_empty() {
        return Ok(Vec::new());
    }
    let sql = format!(
        "SELECT type, id, properties FROM entity_observations
         WHERE workspace_id = ? AND (type, id) IN ({}) ORDER BY seq",
        vec!["(?, ?)"; found.len()].join(", ")
    );
    let mut query = store.client.query(&sql).bind(ws);
    for e in &found {
        query = query.bind(e.kind.as_str()).bind(e.id.as_str());
    }
    let patches: Vec<PatchRead> = run(query.sent().fetch_all()).await?;
    let mut merged: std::collections::HashMap<(String, String), Value> =
        std::collections::HashMap::new();
    for p in patches {
        let patch: Value = serde_json::from_str(&p.properties).map_err(Error::internal)?;
        let slot = merged.entry((p.kind, p.id)).or_insert_with(|| Value::Object(Map::new()));
        merge_patch(slot, &patch);
    }
    Ok(found
        .into_iter()
        .map(|e| Entity {
            properties: merged
                .remove(&(e.kind.clone(), e.id.clone()))
                .unwrap_or_else(|| Value::Object(Map::new())),
            name: (e.has_name == 1).then_some(e.name),
            kind: e.kind,
            id: e.id,
            first_seen: e.first_seen,
            last_seen: e.last_seen,
        })
        .collect())
}

#[derive(Row, Deserialize)]
struct EdgeRead {
    from_type: String,
    from_id: String,
    relation: String,
    to_type: String,
    to_id: String,
    count: u64,
    first_seen: i64,
    last_seen: i64,
}

pub(super) async fn list_relationships(
    store: &ClickHouseStore,
    ws: &str,
    node: Option<(&str, &str)>,
    limit: usize,
) -> Result<Vec<Relationship>> {
    let filter = if node.is_some() {
        " AND ((from_type = ? AND from_id = ?) OR (to_type = ? AND to_id = ?))"
    } else {
        ""
    };
    let sql = format!(
        "SELECT from_type, from_id, relation, to_type, to_id,
            countIf(seq = 0) + uniqExactIf(seq, seq != 0), min(ts), max(ts) AS last
         FROM relationship_observations WHERE workspace_id = ?{filter}
         GROUP BY from_type, from_id, relation, to_type, to_id
         ORDER BY last DESC, from_type, from_id, relation, to_type, to_id LIMIT {}",
        u64::try_from(limit).unwrap_or(u64::MAX)
    );
    let mut query = store.client.query(&sql).bind(ws);
    if let Some((kind, id)) = node {
        query = query.bind(kind).bind(id).bind(kind).bind(id);
    }
    let rows: Vec<EdgeRead> = run(query.sent().fetch_all()).await?;
    Ok(rows
        .into_iter()
        .map(|r| Relationship {
            from_type: r.from_type,
            from_id: r.from_id,
            relation: r.relation,
            to_type: r.to_type,
            to_id: r.to_id,
            count: r.count,
            first_seen: r.first_seen,
            last_seen: r.last_seen,
        })
        .collect())
}
