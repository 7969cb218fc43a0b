//! Governance on ClickHouse: decisions, grants, contracts, tracking plans
//! and proof trails as JSON bodies in ReplacingMergeTree tables (a status
//! change or a revocation is a newer version; reads take
//! `argMax(..., version)` per id, exact before and after merges), and the
//! receipt hash chains and export receipts in append-only MergeTree tables.
//! See [`crate::store::governance`] for the contract.
//!
//! ClickHouse has no transactions, so what the embedded store gets from one
//! SQLite write transaction is done here by one lock per workspace held
//! across the read-check-write of every governance write: two calls of
//! this process never both append at the same chain head, and enforcement
//! is judged on decisions and grants that no concurrent status change or
//! revocation can alter before its receipt is stored. The lock is the
//! process's own: one cloud process must own a workspace's governance
//! writes (docs/storage.md, "ClickHouse"). Each write returns only once
//! ClickHouse has stored it. An object is written before the events that
//! report it, so an event never claims a change that is not stored.

use clickhouse::Row;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::events::{LOOKUP_CHUNK, placeholders};
use super::{ClickHouseStore, Sent, run};
use crate::error::{Error, Result};
use crate::governance::DecisionStatus;
use crate::store::governance::{
    AuthorityGrant, ChainFrom, ChainHead, ChainPage, ContextContract, DecideReceipt, Decision,
    EnforcementInputs, EnforcementRefs, ExportReceipt, GovernanceStore, ProofTrail,
    ProofTrailSummary, Receipt, ReceiptFilter, ReceiptRow, TrackingPlan, TriggerEvent, from_json,
    to_json,
};
use crate::store::{AppendRequest, NewEvent, Store};

const GRANTS: &str = "governance_grants";
const CONTRACTS: &str = "governance_contracts";
const PLANS: &str = "tracking_plans";

/// The columns of [`ReceiptRead`], one row per receipt id.
const RECEIPT_SELECT: &str = "SELECT id, writer, sequence, prev_hash, content_hash, created_at,
        outcome, trace_id, decision_id, body
    FROM governance_receipts";

pub(super) fn limit_arg(limit: usize) -> u64 {
    u64::try_from(limit).unwrap_or(u64::MAX)
}

/// `''` for an absent optional text, as everywhere in the schema.
fn or_empty(text: Option<&String>) -> &str {
    text.map_or("", String::as_str)
}

fn non_empty(text: String) -> Option<String> {
    (!text.is_empty()).then_some(text)
}

/// A row of the grant, contract and tracking-plan tables.
#[derive(Row, Serialize)]
struct BodyRow<'a> {
    workspace_id: &'a str,
    id: &'a str,
    created_at: i64,
    body: &'a str,
    version: u64,
}

#[derive(Row, Serialize)]
struct DecisionRow<'a> {
    workspace_id: &'a str,
    id: &'a str,
    status: &'a str,
    trace_id: &'a str,
    created_at: i64,
    updated_at: i64,
    body: &'a str,
    version: u64,
}

#[derive(Row, Serialize)]
struct TrailRow<'a> {
    workspace_id: &'a str,
    id: &'a str,
    title: &'a str,
    root_hash: &'a str,
    item_count: u64,
    created_at: i64,
    body: &'a str,
    version: u64,
}

#[derive(Row, Deserialize)]
struct TrailSummaryRead {
    id: String,
    title: String,
    root_hash: String,
    item_count: u64,
    created_at: i64,
}

#[derive(Row, Serialize)]
struct ReceiptWrite<'a> {
    workspace_id: &'a str,
    id: &'a str,
    writer: &'a str,
    sequence: i64,
    prev_hash: &'a str,
    content_hash: &'a str,
    created_at: i64,
    outcome: &'a str,
    trace_id: &'a str,
    decision_id: &'a str,
    body: &'a str,
    /// Insertion order, for ties between equal `created_at`.
    seq: u64,
}

/// The column order of [`RECEIPT_SELECT`].
#[derive(Row, Deserialize)]
struct ReceiptRead {
    id: String,
    writer: String,
    sequence: i64,
    prev_hash: String,
    content_hash: String,
    created_at: i64,
    outcome: String,
    trace_id: String,
    decision_id: String,
    body: String,
}

impl ReceiptRead {
    fn into_row(self) -> ReceiptRow {
        ReceiptRow {
            id: self.id,
            writer: self.writer,
            sequence: self.sequence,
            prev_hash: self.prev_hash,
            content_hash: self.content_hash,
            created_at: self.created_at,
            outcome: self.outcome,
            trace_id: non_empty(self.trace_id),
            decision_id: non_empty(self.decision_id),
            body: self.body,
        }
    }
}

#[derive(Row, Serialize)]
struct ExportRow<'a> {
    workspace_id: &'a str,
    id: &'a str,
    proof_trail_id: &'a str,
    status: &'a str,
    created_at: i64,
    body: &'a str,
}

#[derive(Row, Deserialize)]
struct TriggerRead {
    id: String,
    trust_tier: String,
    envelope: String,
}

impl ClickHouseStore {
    /// Held across every governance write of `ws` (see the module
    /// documentation); not the workspace's ingest lock, so enforcement
    /// never waits for a large ingest batch.
    async fn governance_lock(&self, ws: &str) -> Result<tokio::sync::OwnedMutexGuard<()>> {
        // A space never occurs in a workspace id: no clash with the
        // workspace's own lock.
        Ok(self.lock_for(&format!("governance {ws}"))?.lock_owned().await)
    }

    /// Stores events that report governance writes, as ingest does.
    async fn append_reported(&self, ws: &str, events: Vec<NewEvent>) -> Result<()> {
        if !events.is_empty() {
            self.append_events(
                ws,
                AppendRequest { events, idempotency_key: None, new_event_limit: None },
            )
            .await?;
        }
        Ok(())
    }

    /// The latest body of `id` in one of the object tables (`table` is one
    /// of this module's names, never input).
    async fn latest_body(&self, table: &str, ws: &str, id: &str) -> Result<Option<String>> {
        let bodies: Vec<String> = run(self
            .client
            .query(&format!(
                "SELECT argMax(body, version) FROM {table}
                 WHERE workspace_id = ? AND id = ? GROUP BY id"
            ))
            .bind(ws)
            .bind(id)
            .sent()
            .fetch_all())
        .await?;
        Ok(bodies.into_iter().next())
    }

    async fn get_object<T: DeserializeOwned>(
        &self,
        table: &str,
        ws: &str,
        id: &str,
    ) -> Result<Option<T>> {
        self.latest_body(table, ws, id).await?.map(|body| from_json(&body)).transpose()
    }

    /// Newest first: ids begin with their creation time.
    async fn list_objects<T: DeserializeOwned>(
        &self,
        table: &str,
        ws: &str,
        limit: usize,
    ) -> Result<Vec<T>> {
        let bodies: Vec<String> = run(self
            .client
            .query(&format!(
                "SELECT argMax(body, version) FROM {table}
                 WHERE workspace_id = ? GROUP BY id ORDER BY id DESC LIMIT ?"
            ))
            .bind(ws)
            .bind(limit_arg(limit))
            .sent()
            .fetch_all())
        .await?;
        bodies.iter().map(|body| from_json(body)).collect()
    }

    /// Inserts a new object: a conflict when its id is stored already (the
    /// caller holds the governance lock).
    async fn insert_object<T: Serialize>(
        &self,
        table: &str,
        ws: &str,
        id: &str,
        created_at: i64,
        object: &T,
    ) -> Result<()> {
        if self.latest_body(table, ws, id).await?.is_some() {
            return Err(Error::Conflict(format!("{id} exists")));
        }
        let body = to_json(object)?;
        let row =
            BodyRow { workspace_id: ws, id, created_at, body: &body, version: self.clock.next() };
        self.insert_rows::<BodyRow<'_>>(table, &[row]).await
    }

    /// The latest version of a decision with its stored status.
    async fn decision(&self, ws: &str, id: &str) -> Result<Option<Decision>> {
        self.get_object("governance_decisions", ws, id).await
    }

    async fn write_decision(&self, ws: &str, decision: &Decision) -> Result<()> {
        let body = to_json(decision)?;
        let row = DecisionRow {
            workspace_id: ws,
            id: &decision.id,
            status: decision.status.as_str(),
            trace_id: or_empty(decision.trace_id.as_ref()),
            created_at: decision.created_at,
            updated_at: decision.updated_at,
            body: &body,
            version: self.clock.next(),
        };
        self.insert_rows::<DecisionRow<'_>>("governance_decisions", &[row]).await
    }

    async fn trigger_event(
        &self,
        ws: &str,
        refs: &EnforcementRefs,
    ) -> Result<Option<TriggerEvent>> {
        let query = match (&refs.event_id, &refs.trace_id) {
            (Some(id), _) => self
                .client
                .query(
                    "SELECT id, trust_tier, envelope FROM events
                     WHERE workspace_id = ? AND id = ? LIMIT 1",
                )
                .bind(ws)
                .bind(id.as_str()),
            (None, Some(trace)) => self
                .client
                .query(
                    "SELECT id, trust_tier, envelope FROM events
                     WHERE workspace_id = ? AND trace_id = ? AND event NOT LIKE 'governance.%'
                     ORDER BY ts DESC, seq DESC LIMIT 1",
                )
                .bind(ws)
                .bind(trace.as_str()),
            (None, None) => return Ok(None),
        };
        let found: Vec<TriggerRead> = run(query.sent().fetch_all()).await?;
        found
            .into_iter()
            .next()
            .map(|e| TriggerEvent::from_stored(e.id, &e.trust_tier, &e.envelope))
            .transpose()
    }

    /// The last (`sequence`, `contentHash`) of `writer`'s chain in `ws`.
    async fn chain_end(&self, ws: &str, writer: &str) -> Result<Option<(i64, String)>> {
        #[derive(Row, Deserialize)]
        struct End {
            sequence: i64,
            content_hash: String,
        }
        let end: Vec<End> = run(self
            .client
            .query(
                "SELECT sequence, content_hash FROM governance_receipts
                 WHERE workspace_id = ? AND writer = ? ORDER BY sequence DESC LIMIT 1",
            )
            .bind(ws)
            .bind(writer)
            .sent()
            .fetch_all())
        .await?;
        Ok(end.into_iter().next().map(|e| (e.sequence, e.content_hash)))
    }

    /// Receipts matching `condition` (with its values bound by `bind`), each
    /// id once, in `order`, at most `limit`.
    async fn receipts_where(
        &self,
        condition: &str,
        order: &str,
        limit: usize,
        bind: impl FnOnce(clickhouse::query::Query) -> clickhouse::query::Query,
    ) -> Result<Vec<ReceiptRow>> {
        // An id is inserted once; `LIMIT 1 BY id` keeps even a repeated
        // insert from being counted twice.
        let sql = format!(
            "{RECEIPT_SELECT} WHERE {condition} ORDER BY {order} LIMIT 1 BY id LIMIT {}",
            limit_arg(limit)
        );
        let rows: Vec<ReceiptRead> = run(bind(self.client.query(&sql)).sent().fetch_all()).await?;
        Ok(rows.into_iter().map(ReceiptRead::into_row).collect())
    }
}

#[async_trait::async_trait]
impl GovernanceStore for ClickHouseStore {
    async fn insert_decision(
        &self,
        ws: &str,
        decision: &Decision,
        events: Vec<NewEvent>,
    ) -> Result<()> {
        let _guard = self.governance_lock(ws).await?;
        if self.latest_body("governance_decisions", ws, &decision.id).await?.is_some() {
            return Err(Error::Conflict(format!("{} exists", decision.id)));
        }
        self.write_decision(ws, decision).await?;
        self.append_reported(ws, events).await
    }

    async fn get_decision(&self, ws: &str, id: &str) -> Result<Option<Decision>> {
        self.decision(ws, id).await
    }

    async fn list_decisions(
        &self,
        ws: &str,
        status: Option<DecisionStatus>,
        limit: usize,
    ) -> Result<Vec<Decision>> {
        // The filter applies to each decision's latest status, not to any
        // of its versions: hence the grouping first.
        let mut sql = String::from(
            "SELECT d_body FROM (
                SELECT id, argMax(status, version) AS d_status, argMax(body, version) AS d_body
                FROM governance_decisions WHERE workspace_id = ? GROUP BY id)",
        );
        if status.is_some() {
            sql.push_str(" WHERE d_status = ?");
        }
        sql.push_str(" ORDER BY id DESC LIMIT ?");
        let mut query = self.client.query(&sql).bind(ws);
        if let Some(status) = status {
            query = query.bind(status.as_str());
        }
        let bodies: Vec<String> = run(query.bind(limit_arg(limit)).sent().fetch_all()).await?;
        bodies.iter().map(|body| from_json(body)).collect()
    }

    async fn update_decision(
        &self,
        ws: &str,
        expected: DecisionStatus,
        decision: &Decision,
        events: Vec<NewEvent>,
    ) -> Result<bool> {
        let _guard = self.governance_lock(ws).await?;
        match self.decision(ws, &decision.id).await? {
            Some(stored) if stored.status == expected => {}
            _ => return Ok(false),
        }
        self.write_decision(ws, decision).await?;
        self.append_reported(ws, events).await?;
        Ok(true)
    }

    async fn insert_grant(&self, ws: &str, grant: &AuthorityGrant) -> Result<()> {
        let _guard = self.governance_lock(ws).await?;
        self.insert_object(GRANTS, ws, &grant.id, grant.created_at, grant).await
    }

    async fn get_grant(&self, ws: &str, id: &str) -> Result<Option<AuthorityGrant>> {
        self.get_object(GRANTS, ws, id).await
    }

    async fn list_grants(&self, ws: &str, limit: usize) -> Result<Vec<AuthorityGrant>> {
        self.list_objects(GRANTS, ws, limit).await
    }

    async fn revoke_grant(
        &self,
        ws: &str,
        id: &str,
        at_ms: i64,
        events: Vec<NewEvent>,
    ) -> Result<Option<AuthorityGrant>> {
        let _guard = self.governance_lock(ws).await?;
        let Some(mut grant) = self.get_object::<AuthorityGrant>(GRANTS, ws, id).await? else {
            return Ok(None);
        };
        if grant.revoked {
            return Ok(Some(grant));
        }
        grant.revoked = true;
        grant.revoked_at = Some(at_ms);
        let body = to_json(&grant)?;
        let row = BodyRow {
            workspace_id: ws,
            id,
            created_at: grant.created_at,
            body: &body,
            version: self.clock.next(),
        };
        self.insert_rows::<BodyRow<'_>>(GRANTS, &[row]).await?;
        self.append_reported(ws, events).await?;
        Ok(Some(grant))
    }

    async fn insert_contract(&self, ws: &str, contract: &ContextContract) -> Result<()> {
        let _guard = self.governance_lock(ws).await?;
        self.insert_object(CONTRACTS, ws, &contract.id, contract.created_at, contract).await
    }

    async fn get_contract(&self, ws: &str, id: &str) -> Result<Option<ContextContract>> {
        self.get_object(CONTRACTS, ws, id).await
    }

    async fn list_contracts(&self, ws: &str, limit: usize) -> Result<Vec<ContextContract>> {
        self.list_objects(CONTRACTS, ws, limit).await
    }

    async fn insert_tracking_plan(&self, ws: &str, plan: &TrackingPlan) -> Result<()> {
        let _guard = self.governance_lock(ws).await?;
        self.insert_object(PLANS, ws, &plan.id, plan.created_at, plan).await
    }

    async fn get_tracking_plan(&self, ws: &str, id: &str) -> Result<Option<TrackingPlan>> {
        self.get_object(PLANS, ws, id).await
    }

    async fn list_tracking_plans(&self, ws: &str, limit: usize) -> Result<Vec<TrackingPlan>> {
        self.list_objects(PLANS, ws, limit).await
    }

    async fn record_enforcement(
        &self,
        ws: &str,
        writer: &str,
        refs: &EnforcementRefs,
        decide: DecideReceipt,
    ) -> Result<Receipt> {
        let _guard = self.governance_lock(ws).await?;
        let inputs = EnforcementInputs {
            decision: self.decision(ws, &refs.decision_id).await?,
            grant: self.get_object(GRANTS, ws, &refs.grant_id).await?,
            contract: self.get_object(CONTRACTS, ws, &refs.contract_id).await?,
            trigger: self.trigger_event(ws, refs).await?,
        };
        let head = ChainHead::after(self.chain_end(ws, writer).await?);
        let (receipt, events) = decide(inputs, &head)?;
        head.check_sealed(&receipt, writer)?;
        let body = to_json(&receipt)?;
        let row = ReceiptWrite {
            workspace_id: ws,
            id: &receipt.id,
            writer,
            sequence: i64::try_from(receipt.sequence).unwrap_or(i64::MAX),
            prev_hash: &receipt.prev_hash,
            content_hash: &receipt.content_hash,
            created_at: receipt.created_at,
            outcome: receipt.outcome.as_str(),
            trace_id: or_empty(receipt.trace_id.as_ref()),
            decision_id: &receipt.decision_object_id,
            body: &body,
            seq: self.clock.next(),
        };
        self.insert_rows::<ReceiptWrite<'_>>("governance_receipts", &[row]).await?;
        self.append_reported(ws, events).await?;
        Ok(receipt)
    }

    async fn list_receipts(&self, ws: &str, filter: &ReceiptFilter) -> Result<Vec<ReceiptRow>> {
        let mut condition = String::from("workspace_id = ?");
        let mut texts: Vec<&str> = vec![ws];
        if let Some(trace) = &filter.trace_id {
            condition.push_str(" AND trace_id = ?");
            texts.push(trace);
        }
        if let Some(decision) = &filter.decision_id {
            condition.push_str(" AND decision_id = ?");
            texts.push(decision);
        }
        if let Some(outcome) = filter.outcome {
            condition.push_str(" AND outcome = ?");
            texts.push(outcome.as_str());
        }
        let mut numbers: Vec<i64> = Vec::new();
        if let Some(from) = filter.from {
            condition.push_str(" AND created_at >= ?");
            numbers.push(from);
        }
        if let Some(to) = filter.to {
            condition.push_str(" AND created_at < ?");
            numbers.push(to);
        }
        self.receipts_where(&condition, "created_at DESC, seq DESC", filter.limit, |mut query| {
            for text in texts {
                query = query.bind(text);
            }
            for number in numbers {
                query = query.bind(number);
            }
            query
        })
        .await
    }

    async fn get_receipts(&self, ws: &str, ids: &[String]) -> Result<Vec<ReceiptRow>> {
        let mut out = Vec::with_capacity(ids.len());
        for chunk in ids.chunks(LOOKUP_CHUNK) {
            let condition = format!("workspace_id = ? AND id IN ({})", placeholders(chunk.len()));
            out.extend(
                self.receipts_where(&condition, "id", chunk.len(), |query| {
                    chunk.iter().fold(query.bind(ws), |query, id| query.bind(id.as_str()))
                })
                .await?,
            );
        }
        Ok(out)
    }

    async fn receipt_chain_page(&self, ws: &str, page: &ChainPage) -> Result<Vec<ReceiptRow>> {
        let limit = page.limit;
        // Every stored copy that differs in anything, not one per id as
        // elsewhere (identical copies of a repeated insert are one): the
        // table cannot refuse a second row with an id, so an edit made by
        // inserting a copy shows here as a position stored twice, which
        // verification reports.
        let select = RECEIPT_SELECT.replacen("SELECT", "SELECT DISTINCT", 1);
        let start = match (&page.from, page.one_chain) {
            (ChainFrom::Chain(_), true) => "writer = ?",
            (ChainFrom::Chain(_), false) => "writer >= ?",
            (ChainFrom::After(..), true) => "writer = ? AND sequence > ?",
            (ChainFrom::After(..), false) => "(writer > ? OR (writer = ? AND sequence > ?))",
        };
        let sql = format!(
            "{select} WHERE workspace_id = ? AND {start} ORDER BY writer, sequence LIMIT {}",
            limit_arg(limit)
        );
        let query = self.client.query(&sql).bind(ws);
        let query = match (&page.from, page.one_chain) {
            (ChainFrom::Chain(writer), _) => query.bind(writer.as_str()),
            (ChainFrom::After(writer, sequence), true) => {
                query.bind(writer.as_str()).bind(sequence)
            }
            (ChainFrom::After(writer, sequence), false) => {
                query.bind(writer.as_str()).bind(writer.as_str()).bind(sequence)
            }
        };
        let page: Vec<ReceiptRead> = run(query.sent().fetch_all()).await?;
        let mut rows: Vec<ReceiptRow> = page.into_iter().map(ReceiptRead::into_row).collect();
        // A full page ends only after every copy of its last position (the
        // next one starts past it); ClickHouse 18 has no LIMIT WITH TIES.
        if let Some(last) = rows.last().filter(|_| rows.len() >= limit).cloned() {
            let sql = format!("{select} WHERE workspace_id = ? AND writer = ? AND sequence = ?");
            let query = self.client.query(&sql).bind(ws).bind(last.writer.as_str());
            let copies: Vec<ReceiptRead> =
                run(query.bind(last.sequence).sent().fetch_all()).await?;
            for copy in copies.into_iter().map(ReceiptRead::into_row) {
                if !rows
                    .iter()
                    .rev()
                    .take_while(|r| r.sequence == last.sequence)
                    .any(|r| *r == copy)
                {
                    rows.push(copy);
                }
            }
        }
        Ok(rows)
    }

    async fn insert_proof_trail(&self, ws: &str, trail: &ProofTrail) -> Result<()> {
        let _guard = self.governance_lock(ws).await?;
        if self.latest_body("proof_trails", ws, &trail.id).await?.is_some() {
            return Err(Error::Conflict(format!("{} exists", trail.id)));
        }
        let body = to_json(trail)?;
        let row = TrailRow {
            workspace_id: ws,
            id: &trail.id,
            title: &trail.title,
            root_hash: &trail.root_hash,
            item_count: u64::try_from(trail.item_count).unwrap_or(u64::MAX),
            created_at: trail.created_at,
            body: &body,
            version: self.clock.next(),
        };
        self.insert_rows::<TrailRow<'_>>("proof_trails", &[row]).await
    }

    async fn get_proof_trail(&self, ws: &str, id: &str) -> Result<Option<ProofTrail>> {
        self.get_object("proof_trails", ws, id).await
    }

    async fn list_proof_trails(&self, ws: &str, limit: usize) -> Result<Vec<ProofTrailSummary>> {
        let rows: Vec<TrailSummaryRead> = run(self
            .client
            .query(
                "SELECT id, argMax(title, version) AS t_title, argMax(root_hash, version) AS t_root,
                    argMax(item_count, version) AS t_items, argMax(created_at, version) AS t_at
                 FROM proof_trails WHERE workspace_id = ? GROUP BY id ORDER BY id DESC LIMIT ?",
            )
            .bind(ws)
            .bind(limit_arg(limit))
            .sent()
            .fetch_all())
        .await?;
        Ok(rows
            .into_iter()
            .map(|r| ProofTrailSummary {
                id: r.id,
                title: r.title,
                root_hash: r.root_hash,
                item_count: usize::try_from(r.item_count).unwrap_or(usize::MAX),
                created_at: r.created_at,
            })
            .collect())
    }

    async fn insert_export_receipt(&self, ws: &str, receipt: &ExportReceipt) -> Result<()> {
        let body = to_json(receipt)?;
        let row = ExportRow {
            workspace_id: ws,
            id: &receipt.id,
            proof_trail_id: or_empty(receipt.proof_trail_id.as_ref()),
            status: &receipt.status,
            created_at: receipt.created_at,
            body: &body,
        };
        self.insert_rows::<ExportRow<'_>>("export_receipts", &[row]).await
    }

    async fn get_export_receipt(&self, ws: &str, id: &str) -> Result<Option<ExportReceipt>> {
        let bodies: Vec<String> = run(self
            .client
            .query(
                "SELECT body FROM export_receipts WHERE workspace_id = ? AND id = ?
                 ORDER BY created_at DESC LIMIT 1",
            )
            .bind(ws)
            .bind(id)
            .sent()
            .fetch_all())
        .await?;
        bodies.first().map(|body| from_json(body)).transpose()
    }

    async fn list_export_receipts(
        &self,
        ws: &str,
        proof_trail_id: Option<&str>,
        limit: usize,
    ) -> Result<Vec<ExportReceipt>> {
        let mut sql = String::from("SELECT body FROM export_receipts WHERE workspace_id = ?");
        if proof_trail_id.is_some() {
            sql.push_str(" AND proof_trail_id = ?");
        }
        // The newest row of each id: a keyed export tried again writes
        // its receipt anew under the same id.
        sql.push_str(" ORDER BY created_at DESC, id DESC LIMIT 1 BY id LIMIT ?");
        let mut query = self.client.query(&sql).bind(ws);
        if let Some(trail) = proof_trail_id {
            query = query.bind(trail);
        }
        let bodies: Vec<String> = run(query.bind(limit_arg(limit)).sent().fetch_all()).await?;
        bodies.iter().map(|body| from_json(body)).collect()
    }
}
