//! Governance rows of the embedded store: objects as JSON bodies with their
//! filter columns, the receipt hash chain, proof trails and export
//! receipts. See [`crate::store::governance`] for the contract.

use rusqlite::types::Value as SqlValue;
use rusqlite::{Connection, OptionalExtension, params, params_from_iter};
use serde::de::DeserializeOwned;

use super::search::Hints;
use super::{EmbeddedStore, events, sql};
use crate::error::{Error, Result};
use crate::governance::DecisionStatus;
use crate::store::NewEvent;
use crate::store::governance::{
    AuthorityGrant, ChainFrom, ChainHead, ChainPage, ContextContract, DecideReceipt, Decision,
    EnforcementInputs, EnforcementRefs, ExportReceipt, GovernanceStore, ProofTrail,
    ProofTrailSummary, Receipt, ReceiptFilter, ReceiptRow, TrackingPlan, TriggerEvent, from_json,
    to_json,
};

const GRANTS: &str = "governance_grants";
const CONTRACTS: &str = "governance_contracts";
const PLANS: &str = "tracking_plans";
const TRAILS: &str = "proof_trails";
const RECEIPT_COLUMNS: &str = "id, writer, sequence, prev_hash, content_hash, created_at, outcome, trace_id, decision_id, body";

pub(super) fn limit_arg(limit: usize) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX)
}

/// Inserts a body into one of the plain object tables; `table` is one of
/// this module's constants, never input.
fn insert_body(
    conn: &Connection,
    table: &str,
    ws: &str,
    id: &str,
    at: i64,
    body: &str,
) -> Result<()> {
    let inserted = conn
        .prepare_cached(&format!(
            "INSERT INTO {table} (workspace_id, id, created_at, body) VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT DO NOTHING"
        ))
        .and_then(|mut s| s.execute(params![ws, id, at, body]))
        .map_err(sql)?;
    if inserted == 0 {
        return Err(Error::Conflict(format!("{id} exists")));
    }
    Ok(())
}

fn get_body<T: DeserializeOwned>(
    conn: &Connection,
    table: &str,
    ws: &str,
    id: &str,
) -> Result<Option<T>> {
    conn.prepare_cached(&format!("SELECT body FROM {table} WHERE workspace_id = ?1 AND id = ?2"))
        .and_then(|mut s| s.query_row(params![ws, id], |r| r.get::<_, String>(0)).optional())
        .map_err(sql)?
        .map(|text| from_json(&text))
        .transpose()
}

/// Newest first: ids begin with their creation time.
fn list_bodies<T: DeserializeOwned>(
    conn: &Connection,
    table: &str,
    ws: &str,
    limit: usize,
) -> Result<Vec<T>> {
    let mut stmt = conn
        .prepare_cached(&format!(
            "SELECT body FROM {table} WHERE workspace_id = ?1 ORDER BY id DESC LIMIT ?2"
        ))
        .map_err(sql)?;
    let rows =
        stmt.query_map(params![ws, limit_arg(limit)], |r| r.get::<_, String>(0)).map_err(sql)?;
    let mut out = Vec::new();
    for row in rows {
        out.push(from_json(&row.map_err(sql)?)?);
    }
    Ok(out)
}

fn get_decision(conn: &Connection, ws: &str, id: &str) -> Result<Option<Decision>> {
    conn.prepare_cached("SELECT body FROM governance_decisions WHERE workspace_id = ?1 AND id = ?2")
        .and_then(|mut s| s.query_row(params![ws, id], |r| r.get::<_, String>(0)).optional())
        .map_err(sql)?
        .map(|text| from_json(&text))
        .transpose()
}

fn append_events(conn: &Connection, ws: &str, events: Vec<NewEvent>, hints: &Hints) -> Result<()> {
    if !events.is_empty() {
        events::append(conn, ws, events::prepare_rows(events), None, Some(hints))?;
    }
    Ok(())
}

fn receipt_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<ReceiptRow> {
    Ok(ReceiptRow {
        id: r.get(0)?,
        writer: r.get(1)?,
        sequence: r.get(2)?,
        prev_hash: r.get(3)?,
        content_hash: r.get(4)?,
        created_at: r.get(5)?,
        outcome: r.get(6)?,
        trace_id: r.get(7)?,
        decision_id: r.get(8)?,
        body: r.get(9)?,
    })
}

fn query_receipts(
    conn: &Connection,
    sql_text: &str,
    args: Vec<SqlValue>,
) -> Result<Vec<ReceiptRow>> {
    let mut stmt = conn.prepare_cached(sql_text).map_err(sql)?;
    let rows = stmt.query_map(params_from_iter(args), receipt_row).map_err(sql)?;
    rows.collect::<rusqlite::Result<Vec<_>>>().map_err(sql)
}

/// A trace's newest event that the governance layer did not write. The
/// `(substr(event, 1, 11) = 'governance.') = 0` term is written exactly as
/// the middle column of `events_trace_own` (schema.sql): that is what lets
/// SQLite seek past the trace's receipt events instead of stepping over
/// them. (Not LIKE, which ignores case.)
const TRIGGER_OF_TRACE: &str = "SELECT id, trust_tier, envelope FROM events
    WHERE workspace_id = ?1 AND trace_id = ?2 AND (substr(event, 1, 11) = 'governance.') = 0
    ORDER BY ts DESC, seq DESC LIMIT 1";

fn trigger_event(
    conn: &Connection,
    ws: &str,
    refs: &EnforcementRefs,
) -> Result<Option<TriggerEvent>> {
    let found: Option<(String, String, String)> = match (&refs.event_id, &refs.trace_id) {
        (Some(id), _) => conn
            .prepare_cached(
                "SELECT id, trust_tier, envelope FROM events WHERE workspace_id = ?1 AND id = ?2",
            )
            .and_then(|mut s| {
                s.query_row(params![ws, id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?))).optional()
            })
            .map_err(sql)?,
        (None, Some(trace)) => conn
            .prepare_cached(TRIGGER_OF_TRACE)
            .and_then(|mut s| {
                s.query_row(params![ws, trace], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
                    .optional()
            })
            .map_err(sql)?,
        (None, None) => None,
    };
    found.map(|(id, tier, envelope)| TriggerEvent::from_stored(id, &tier, &envelope)).transpose()
}

#[async_trait::async_trait]
impl GovernanceStore for EmbeddedStore {
    async fn insert_decision(
        &self,
        ws: &str,
        decision: &Decision,
        events: Vec<NewEvent>,
    ) -> Result<()> {
        let (ws, d, body) = (ws.to_owned(), decision.clone(), to_json(decision)?);
        let hints = self.search.hints();
        self.write(move |conn| {
            let inserted = conn
                .prepare_cached(
                    "INSERT INTO governance_decisions
                        (workspace_id, id, status, trace_id, created_at, updated_at, body)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) ON CONFLICT DO NOTHING",
                )
                .and_then(|mut s| {
                    s.execute(params![
                        ws,
                        d.id,
                        d.status.as_str(),
                        d.trace_id,
                        d.created_at,
                        d.updated_at,
                        body
                    ])
                })
                .map_err(sql)?;
            if inserted == 0 {
                return Err(Error::Conflict(format!("{} exists", d.id)));
            }
            append_events(conn, &ws, events, &hints)
        })
        .await
    }

    async fn get_decision(&self, ws: &str, id: &str) -> Result<Option<Decision>> {
        let (ws, id) = (ws.to_owned(), id.to_owned());
        self.read(move |conn| get_decision(conn, &ws, &id)).await
    }

    async fn list_decisions(
        &self,
        ws: &str,
        status: Option<DecisionStatus>,
        limit: usize,
    ) -> Result<Vec<Decision>> {
        let ws = ws.to_owned();
        self.read(move |conn| {
            let mut stmt = conn
                .prepare_cached(
                    "SELECT body FROM governance_decisions
                     WHERE workspace_id = ?1 AND (?2 IS NULL OR status = ?2)
                     ORDER BY id DESC LIMIT ?3",
                )
                .map_err(sql)?;
            let rows = stmt
                .query_map(params![ws, status.map(DecisionStatus::as_str), limit_arg(limit)], |r| {
                    r.get::<_, String>(0)
                })
                .map_err(sql)?;
            let mut out = Vec::new();
            for row in rows {
                out.push(from_json(&row.map_err(sql)?)?);
            }
            Ok(out)
        })
        .await
    }

    async fn update_decision(
        &self,
        ws: &str,
        expected: DecisionStatus,
        decision: &Decision,
        events: Vec<NewEvent>,
    ) -> Result<bool> {
        let (ws, d, body) = (ws.to_owned(), decision.clone(), to_json(decision)?);
        let hints = self.search.hints();
        self.write(move |conn| {
            let changed = conn
                .prepare_cached(
                    "UPDATE governance_decisions SET status = ?4, updated_at = ?5, body = ?6
                     WHERE workspace_id = ?1 AND id = ?2 AND status = ?3",
                )
                .and_then(|mut s| {
                    s.execute(params![
                        ws,
                        d.id,
                        expected.as_str(),
                        d.status.as_str(),
                        d.updated_at,
                        body
                    ])
                })
                .map_err(sql)?;
            if changed == 0 {
                return Ok(false);
            }
            append_events(conn, &ws, events, &hints)?;
            Ok(true)
        })
        .await
    }

    async fn insert_grant(&self, ws: &str, grant: &AuthorityGrant) -> Result<()> {
        let (ws, id, at, body) =
            (ws.to_owned(), grant.id.clone(), grant.created_at, to_json(grant)?);
        self.write(move |conn| insert_body(conn, GRANTS, &ws, &id, at, &body)).await
    }

    async fn get_grant(&self, ws: &str, id: &str) -> Result<Option<AuthorityGrant>> {
        let (ws, id) = (ws.to_owned(), id.to_owned());
        self.read(move |conn| get_body(conn, GRANTS, &ws, &id)).await
    }

    async fn list_grants(&self, ws: &str, limit: usize) -> Result<Vec<AuthorityGrant>> {
        let ws = ws.to_owned();
        self.read(move |conn| list_bodies(conn, GRANTS, &ws, limit)).await
    }

    async fn revoke_grant(
        &self,
        ws: &str,
        id: &str,
        at_ms: i64,
        events: Vec<NewEvent>,
    ) -> Result<Option<AuthorityGrant>> {
        let (ws, id) = (ws.to_owned(), id.to_owned());
        let hints = self.search.hints();
        self.write(move |conn| {
            let Some(mut grant) = get_body::<AuthorityGrant>(conn, GRANTS, &ws, &id)? else {
                return Ok(None);
            };
            if grant.revoked {
                return Ok(Some(grant));
            }
            grant.revoked = true;
            grant.revoked_at = Some(at_ms);
            let body = to_json(&grant)?;
            conn.prepare_cached(&format!(
                "UPDATE {GRANTS} SET body = ?3 WHERE workspace_id = ?1 AND id = ?2"
            ))
            .and_then(|mut s| s.execute(params![ws, id, body]))
            .map_err(sql)?;
            append_events(conn, &ws, events, &hints)?;
            Ok(Some(grant))
        })
        .await
    }

    async fn insert_contract(&self, ws: &str, contract: &ContextContract) -> Result<()> {
        let (ws, id, at, body) =
            (ws.to_owned(), contract.id.clone(), contract.created_at, to_json(contract)?);
        self.write(move |conn| insert_body(conn, CONTRACTS, &ws, &id, at, &body)).await
    }

    async fn get_contract(&self, ws: &str, id: &str) -> Result<Option<ContextContract>> {
        let (ws, id) = (ws.to_owned(), id.to_owned());
        self.read(move |conn| get_body(conn, CONTRACTS, &ws, &id)).await
    }

    async fn list_contracts(&self, ws: &str, limit: usize) -> Result<Vec<ContextContract>> {
        let ws = ws.to_owned();
        self.read(move |conn| list_bodies(conn, CONTRACTS, &ws, limit)).await
    }

    async fn insert_tracking_plan(&self, ws: &str, plan: &TrackingPlan) -> Result<()> {
        let (ws, id, at, body) = (ws.to_owned(), plan.id.clone(), plan.created_at, to_json(plan)?);
        self.write(move |conn| insert_body(conn, PLANS, &ws, &id, at, &body)).await
    }

    async fn get_tracking_plan(&self, ws: &str, id: &str) -> Result<Option<TrackingPlan>> {
        let (ws, id) = (ws.to_owned(), id.to_owned());
        self.read(move |conn| get_body(conn, PLANS, &ws, &id)).await
    }

    async fn list_tracking_plans(&self, ws: &str, limit: usize) -> Result<Vec<TrackingPlan>> {
        let ws = ws.to_owned();
        self.read(move |conn| list_bodies(conn, PLANS, &ws, limit)).await
    }

    async fn record_enforcement(
        &self,
        ws: &str,
        writer: &str,
        refs: &EnforcementRefs,
        decide: DecideReceipt,
    ) -> Result<Receipt> {
        let (ws, writer, refs) = (ws.to_owned(), writer.to_owned(), refs.clone());
        let hints = self.search.hints();
        self.write(move |conn| {
            let inputs = EnforcementInputs {
                decision: get_decision(conn, &ws, &refs.decision_id)?,
                grant: get_body(conn, GRANTS, &ws, &refs.grant_id)?,
                contract: get_body(conn, CONTRACTS, &ws, &refs.contract_id)?,
                trigger: trigger_event(conn, &ws, &refs)?,
            };
            let head: Option<(i64, String)> = conn
                .prepare_cached(
                    "SELECT sequence, content_hash FROM governance_receipts
                     WHERE workspace_id = ?1 AND writer = ?2 ORDER BY sequence DESC LIMIT 1",
                )
                .and_then(|mut s| {
                    s.query_row(params![ws, writer], |r| Ok((r.get(0)?, r.get(1)?))).optional()
                })
                .map_err(sql)?;
            let head = ChainHead::after(head);
            let (receipt, events) = decide(inputs, &head)?;
            head.check_sealed(&receipt, &writer)?;
            let body = to_json(&receipt)?;
            conn.prepare_cached(
                "INSERT INTO governance_receipts (workspace_id, id, writer, sequence, prev_hash,
                    content_hash, created_at, outcome, trace_id, decision_id, body)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
            )
            .and_then(|mut s| {
                s.execute(params![
                    ws,
                    receipt.id,
                    writer,
                    i64::try_from(receipt.sequence).unwrap_or(i64::MAX),
                    receipt.prev_hash,
                    receipt.content_hash,
                    receipt.created_at,
                    receipt.outcome.as_str(),
                    receipt.trace_id,
                    receipt.decision_object_id,
                    body,
                ])
            })
            .map_err(sql)?;
            append_events(conn, &ws, events, &hints)?;
            Ok(receipt)
        })
        .await
    }

    async fn list_receipts(&self, ws: &str, filter: &ReceiptFilter) -> Result<Vec<ReceiptRow>> {
        let (ws, filter) = (ws.to_owned(), filter.clone());
        self.read(move |conn| {
            let mut text =
                format!("SELECT {RECEIPT_COLUMNS} FROM governance_receipts WHERE workspace_id = ?");
            let mut args: Vec<SqlValue> = vec![ws.into()];
            let mut add = |clause: &str, value: SqlValue| {
                text.push_str(clause);
                args.push(value);
            };
            if let Some(trace) = filter.trace_id {
                add(" AND trace_id = ?", trace.into());
            }
            if let Some(decision) = filter.decision_id {
                add(" AND decision_id = ?", decision.into());
            }
            if let Some(outcome) = filter.outcome {
                add(" AND outcome = ?", outcome.as_str().to_owned().into());
            }
            if let Some(from) = filter.from {
                add(" AND created_at >= ?", from.into());
            }
            if let Some(to) = filter.to {
                add(" AND created_at < ?", to.into());
            }
            text.push_str(" ORDER BY created_at DESC, seq DESC LIMIT ?");
            args.push(limit_arg(filter.limit).into());
            query_receipts(conn, &text, args)
        })
        .await
    }

    async fn get_receipts(&self, ws: &str, ids: &[String]) -> Result<Vec<ReceiptRow>> {
        let (ws, ids) = (ws.to_owned(), ids.to_vec());
        self.read(move |conn| {
            let mut out = Vec::with_capacity(ids.len());
            let text = format!(
                "SELECT {RECEIPT_COLUMNS} FROM governance_receipts WHERE workspace_id = ?1 AND id = ?2"
            );
            let mut stmt = conn.prepare_cached(&text).map_err(sql)?;
            for id in ids {
                if let Some(row) = stmt.query_row(params![ws, id], receipt_row).optional().map_err(sql)? {
                    out.push(row);
                }
            }
            Ok(out)
        })
        .await
    }

    async fn receipt_chain_page(&self, ws: &str, page: &ChainPage) -> Result<Vec<ReceiptRow>> {
        let (ws, page) = (ws.to_owned(), page.clone());
        self.read(move |conn| {
            // Every variant binds the same four numbered parameters; the
            // chain index (workspace_id, writer, sequence) serves each.
            let ((writer, sequence), start) = match page.from {
                ChainFrom::Chain(writer) if page.one_chain => ((writer, 0), "writer = ?2"),
                ChainFrom::Chain(writer) => ((writer, 0), "writer >= ?2"),
                ChainFrom::After(writer, sequence) if page.one_chain => {
                    ((writer, sequence), "writer = ?2 AND sequence > ?3")
                }
                ChainFrom::After(writer, sequence) => {
                    ((writer, sequence), "(writer > ?2 OR (writer = ?2 AND sequence > ?3))")
                }
            };
            let text = format!(
                "SELECT {RECEIPT_COLUMNS} FROM governance_receipts
                 WHERE workspace_id = ?1 AND {start}
                 ORDER BY writer, sequence LIMIT ?4"
            );
            query_receipts(
                conn,
                &text,
                vec![ws.into(), writer.into(), sequence.into(), limit_arg(page.limit).into()],
            )
        })
        .await
    }

    async fn insert_proof_trail(&self, ws: &str, trail: &ProofTrail) -> Result<()> {
        let (ws, id, at, body) =
            (ws.to_owned(), trail.id.clone(), trail.created_at, to_json(trail)?);
        self.write(move |conn| insert_body(conn, TRAILS, &ws, &id, at, &body)).await
    }

    async fn get_proof_trail(&self, ws: &str, id: &str) -> Result<Option<ProofTrail>> {
        let (ws, id) = (ws.to_owned(), id.to_owned());
        self.read(move |conn| get_body(conn, TRAILS, &ws, &id)).await
    }

    async fn list_proof_trails(&self, ws: &str, limit: usize) -> Result<Vec<ProofTrailSummary>> {
        let ws = ws.to_owned();
        self.read(move |conn| {
            let mut stmt = conn
                .prepare_cached(
                    "SELECT id, json_extract(body, '$.title'), json_extract(body, '$.rootHash'),
                        json_extract(body, '$.itemCount'), created_at
                     FROM proof_trails WHERE workspace_id = ?1 ORDER BY id DESC LIMIT ?2",
                )
                .map_err(sql)?;
            let rows = stmt
                .query_map(params![ws, limit_arg(limit)], |r| {
                    Ok(ProofTrailSummary {
                        id: r.get(0)?,
                        title: r.get::<_, Option<String>>(1)?.unwrap_or_default(),
                        root_hash: r.get::<_, Option<String>>(2)?.unwrap_or_default(),
                        item_count: usize::try_from(r.get::<_, Option<i64>>(3)?.unwrap_or(0))
                            .unwrap_or(0),
                        created_at: r.get(4)?,
                    })
                })
                .map_err(sql)?;
            rows.collect::<rusqlite::Result<Vec<_>>>().map_err(sql)
        })
        .await
    }

    async fn insert_export_receipt(&self, ws: &str, receipt: &ExportReceipt) -> Result<()> {
        let (ws, r, body) = (ws.to_owned(), receipt.clone(), to_json(receipt)?);
        self.write(move |conn| {
            conn.prepare_cached(
                "INSERT OR REPLACE INTO export_receipts
                    (workspace_id, id, proof_trail_id, status, created_at, body)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            )
            .and_then(|mut s| {
                s.execute(params![ws, r.id, r.proof_trail_id, r.status, r.created_at, body])
            })
            .map_err(sql)?;
            Ok(())
        })
        .await
    }

    async fn get_export_receipt(&self, ws: &str, id: &str) -> Result<Option<ExportReceipt>> {
        let (ws, id) = (ws.to_owned(), id.to_owned());
        self.read(move |conn| {
            let body: Option<String> = conn
                .prepare_cached(
                    "SELECT body FROM export_receipts WHERE workspace_id = ?1 AND id = ?2",
                )
                .and_then(|mut s| s.query_row(params![ws, id], |r| r.get(0)).optional())
                .map_err(sql)?;
            body.map(|body| from_json(&body)).transpose()
        })
        .await
    }

    async fn list_export_receipts(
        &self,
        ws: &str,
        proof_trail_id: Option<&str>,
        limit: usize,
    ) -> Result<Vec<ExportReceipt>> {
        let (ws, trail) = (ws.to_owned(), proof_trail_id.map(str::to_owned));
        self.read(move |conn| {
            let mut stmt = conn
                .prepare_cached(
                    "SELECT body FROM export_receipts
                     WHERE workspace_id = ?1 AND (?2 IS NULL OR proof_trail_id = ?2)
                     ORDER BY created_at DESC, id DESC LIMIT ?3",
                )
                .map_err(sql)?;
            let rows = stmt
                .query_map(params![ws, trail, limit_arg(limit)], |r| r.get::<_, String>(0))
                .map_err(sql)?;
            let mut out = Vec::new();
            for row in rows {
                out.push(from_json(&row.map_err(sql)?)?);
            }
            Ok(out)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use rusqlite::params;

    use super::TRIGGER_OF_TRACE;
    use crate::store::NewEvent;
    use crate::store::embedded::{append_in_transaction, open_writer_connection, prepare_events};

    fn event(id: &str, name: &str, ts: i64) -> NewEvent {
        let mut event = opgraph_proto::Event::named(name);
        event.trace_id = Some("tr-1".to_owned());
        event.timestamp = Some(ts);
        NewEvent { id: id.to_owned(), received_at: ts, event }
    }

    #[test]
    fn a_traces_trigger_is_sought_past_its_receipt_events() {
        let dir = tempfile::tempdir().unwrap();
        let conn = open_writer_connection(dir.path()).unwrap();
        let t = 1_767_225_600_000_i64;
        let events = vec![
            event("evt_a", "refund.requested", t),
            event("evt_b", "refund.checked", t + 1),
            event("evt_g1", "governance.enforced", t + 2),
            event("evt_g2", "governance.enforced", t + 3),
        ];
        append_in_transaction(&conn, "ws_1", prepare_events(events), None).unwrap();
        let id: String =
            conn.query_row(TRIGGER_OF_TRACE, params!["ws_1", "tr-1"], |r| r.get(0)).unwrap();
        assert_eq!(id, "evt_b");
        // A user's event that only looks like the layer's in another case
        // is a trigger like any other (SQLite's LIKE would ignore case).
        let later = vec![event("evt_c", "Governance.manual_override", t + 4)];
        append_in_transaction(&conn, "ws_1", prepare_events(later), None).unwrap();
        let id: String =
            conn.query_row(TRIGGER_OF_TRACE, params!["ws_1", "tr-1"], |r| r.get(0)).unwrap();
        assert_eq!(id, "evt_c");

        let plan: Vec<String> = conn
            .prepare(&format!("EXPLAIN QUERY PLAN {TRIGGER_OF_TRACE}"))
            .unwrap()
            .query_map(params!["ws_1", "tr-1"], |r| r.get(3))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(
            plan,
            ["SEARCH events USING INDEX events_trace_own \
              (workspace_id=? AND trace_id=? AND <expr>=?)"],
            "a seek on the index's governance column, no sort"
        );
    }
}
