//! `/api/proof-event-trails`: export a proof trail (receipts, the objects
//! they reference, the events of their traces, extra evidence, under one
//! Merkle root), read it back, verify it, and optionally push it to the
//! external proof service with an export receipt. Reference:
//! `docs/governance.md`, "Proof trails".

use std::collections::{BTreeMap, BTreeSet, HashMap};

use axum::Json;
use axum::extract::{Query, State};
use axum::http::{Method, StatusCode};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use utoipa::ToSchema;

use super::enforce::receipt_json;
use super::governance::{MAX_TEXT, parse_body, text};
use super::{AppState, JsonBody, PathId};
use crate::auth::{Principal, Scope};
use crate::error::{Error, Result};
use crate::governance::proof::{
    self, MAX_EVENTS, MAX_EVIDENCE, MAX_EVIDENCE_BYTES, ProofVerification,
};
use crate::outbound;
use crate::store::EventFilter;
use crate::store::governance::{
    ExportReceipt, ProofItem, ProofTrail, ProofTrailSummary, ReceiptFilter, ReceiptRow,
};

/// Most receipt ids and decision ids named, and most receipts in a packet.
const MAX_IDS: usize = 1000;

type ErrorBody = crate::error::ErrorBody;

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExportRequest {
    pub title: String,
    #[serde(default)]
    pub receipt_ids: Vec<String>,
    pub trace_id: Option<String>,
    #[serde(default)]
    pub decision_ids: Vec<String>,
    /// Up to 100 JSON objects of at most 64 KiB each.
    #[serde(default)]
    #[schema(value_type = Vec<Object>)]
    pub evidence: Vec<Value>,
    /// Also POST the packet to the configured proof endpoint.
    #[serde(default)]
    pub push_to_external_proof: bool,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExportResponse {
    pub proof_trail: ProofTrail,
    /// Present when a push was asked for, succeeded or not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub export_receipt: Option<ExportReceipt>,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TrailBody {
    pub proof_trail: ProofTrail,
    /// Pushes of this trail, newest first.
    pub export_receipts: Vec<ExportReceipt>,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TrailList {
    pub proof_trails: Vec<ProofTrailSummary>,
}

fn ids(field: &str, values: &[String]) -> Result<Vec<String>> {
    if values.len() > MAX_IDS {
        return Err(Error::validation(field, format!("at most {MAX_IDS} ids")));
    }
    let mut seen = BTreeSet::new();
    for (i, v) in values.iter().enumerate() {
        seen.insert(text(&format!("{field}[{i}]"), v, MAX_TEXT)?);
    }
    Ok(seen.into_iter().collect())
}

fn check_evidence(evidence: &[Value]) -> Result<()> {
    if evidence.len() > MAX_EVIDENCE {
        return Err(Error::validation("evidence", format!("at most {MAX_EVIDENCE} objects")));
    }
    for (i, item) in evidence.iter().enumerate() {
        if !item.is_object() {
            return Err(Error::validation(format!("evidence[{i}]"), "evidence must be objects"));
        }
        if item.to_string().len() > MAX_EVIDENCE_BYTES {
            return Err(Error::validation(
                format!("evidence[{i}]"),
                format!("at most {MAX_EVIDENCE_BYTES} bytes serialized"),
            ));
        }
    }
    Ok(())
}

/// Build (and optionally push) a proof trail.
#[utoipa::path(
    post, path = "/api/proof-event-trails/export", tag = "governance",
    request_body = ExportRequest,
    responses(
        (status = 201, description = "Created; with `exportReceipt` when a push was asked for, whether it succeeded or failed", body = ExportResponse),
        (status = 400, description = "Invalid body, nothing to prove, or a push asked for with no endpoint configured", body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, description = "A named receipt or decision is not in this workspace", body = ErrorBody),
        (status = 413, body = ErrorBody), (status = 415, body = ErrorBody),
        (status = 429, body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn export(
    State(state): State<AppState>,
    principal: Principal,
    JsonBody(body): JsonBody,
) -> Result<(StatusCode, Json<ExportResponse>)> {
    principal.require(Scope::Export)?;
    let input: ExportRequest = parse_body(body)?;
    let title = text("title", &input.title, MAX_TEXT)?;
    let receipt_ids = ids("receiptIds", &input.receipt_ids)?;
    let decision_ids = ids("decisionIds", &input.decision_ids)?;
    let trace_id = input.trace_id.as_deref().map(|t| text("traceId", t, MAX_TEXT)).transpose()?;
    check_evidence(&input.evidence)?;
    // Evidence alone is a packet too (photos of a delivery, a signed
    // checklist): the contract makes every source optional.
    if receipt_ids.is_empty()
        && decision_ids.is_empty()
        && trace_id.is_none()
        && input.evidence.is_empty()
    {
        return Err(Error::validation(
            "receiptIds",
            "name receiptIds, decisionIds, a traceId or evidence: there is nothing to prove",
        ));
    }
    if input.push_to_external_proof && state.config.governance.proof_url.is_none() {
        return Err(Error::validation(
            "pushToExternalProof",
            "no external proof endpoint is configured (governance.proof_url, OPGRAPH_PROOF_URL)",
        ));
    }
    let ws = &principal.workspace_id;
    let store = state.store.as_ref();

    // Receipts: named ones must all exist; then those of the trace and of
    // the named decisions.
    let mut receipts: BTreeMap<String, ReceiptRow> = BTreeMap::new();
    for row in store.get_receipts(ws, &receipt_ids).await? {
        receipts.insert(row.id.clone(), row);
    }
    if let Some(missing) = receipt_ids.iter().find(|id| !receipts.contains_key(*id)) {
        return Err(Error::NotFound(format!("receipt {missing}")));
    }
    let mut items: Vec<ProofItem> = Vec::new();
    for id in &decision_ids {
        let decision = store
            .get_decision(ws, id)
            .await?
            .ok_or_else(|| Error::NotFound(format!("decision {id}")))?;
        items.push(proof::item("decision", id, to_value(&decision)?));
    }
    let mut filters: Vec<ReceiptFilter> = decision_ids
        .iter()
        .map(|id| ReceiptFilter { decision_id: Some(id.clone()), ..Default::default() })
        .collect();
    if let Some(trace) = &trace_id {
        filters.push(ReceiptFilter { trace_id: Some(trace.clone()), ..Default::default() });
    }
    for mut filter in filters {
        filter.limit = MAX_IDS.saturating_sub(receipts.len());
        if filter.limit == 0 {
            break;
        }
        for row in store.list_receipts(ws, &filter).await? {
            receipts.entry(row.id.clone()).or_insert(row);
        }
    }

    // What the receipts reference.
    let mut decisions = BTreeSet::new();
    let mut grants = BTreeSet::new();
    let mut contracts = BTreeSet::new();
    let mut traces: BTreeSet<String> = trace_id.iter().cloned().collect();
    for row in receipts.values() {
        let body = receipt_json(row)?;
        let field = |key: &str| body.get(key).and_then(Value::as_str).map(str::to_owned);
        decisions.extend(field("decisionObjectId"));
        grants.extend(field("authorityGrantId"));
        contracts.extend(field("contextContractId"));
        traces.extend(field("traceId"));
        items.push(proof::item("receipt", &row.id, body));
    }
    for id in decisions.difference(&decision_ids.iter().cloned().collect()) {
        if let Some(decision) = store.get_decision(ws, id).await? {
            items.push(proof::item("decision", id, to_value(&decision)?));
        }
    }
    for id in &grants {
        if let Some(grant) = store.get_grant(ws, id).await? {
            items.push(proof::item("authority_grant", id, to_value(&grant)?));
        }
    }
    for id in &contracts {
        if let Some(contract) = store.get_contract(ws, id).await? {
            items.push(proof::item("context_contract", id, to_value(&contract)?));
        }
    }
    let mut events = 0usize;
    for trace in &traces {
        let filter = EventFilter {
            limit: MAX_EVENTS - events,
            trace_id: Some(trace.clone()),
            ..Default::default()
        };
        if filter.limit == 0 {
            break;
        }
        for stored in store.list_events(ws, &filter).await? {
            events += 1;
            let id = stored.id.clone();
            items.push(proof::item("event", &id, stored.into_json()));
        }
    }
    for (i, evidence) in input.evidence.into_iter().enumerate() {
        items.push(proof::item("evidence", &proof::evidence_id(i), evidence));
    }

    let items = proof::order(items);
    if items.is_empty() {
        return Err(Error::validation("traceId", "the packet would be empty: nothing to prove"));
    }
    let trail = ProofTrail {
        id: crate::ids::new_id("prf"),
        title,
        root_hash: proof::root_hash(items.iter().map(|i| i.hash.as_str())),
        item_count: items.len(),
        items,
        receipt_ids: receipts.keys().cloned().collect(),
        decision_ids,
        trace_id,
        created_at: crate::now_ms(),
        created_by: principal.subject.clone(),
    };
    store.insert_proof_trail(ws, &trail).await?;

    let export_receipt = if input.push_to_external_proof {
        let receipt = push(&state, ws, &trail).await?;
        store.insert_export_receipt(ws, &receipt).await?;
        super::exports::notify_failure(&state, ws, &receipt);
        Some(receipt)
    } else {
        None
    };
    Ok((StatusCode::CREATED, Json(ExportResponse { proof_trail: trail, export_receipt })))
}

fn to_value<T: Serialize>(value: &T) -> Result<Value> {
    serde_json::to_value(value).map_err(Error::internal)
}

/// Pushes the trail and describes what happened, success or failure.
async fn push(state: &AppState, ws: &str, trail: &ProofTrail) -> Result<ExportReceipt> {
    let config = &state.config.governance;
    let payload = serde_json::to_vec(&json!({"workspaceId": ws, "proofTrail": trail}))
        .map_err(Error::internal)?;
    let target = outbound::Target {
        setting: "governance.proof_url",
        url: config.proof_url.as_deref().unwrap_or_default(),
        ca_file: config.proof_ca_file.as_deref(),
        timeout: config.proof_timeout,
        // The operator configured it: a private proof service is fine.
        public_only: false,
    };
    let headers = vec![outbound::header("idempotency-key", &trail.id)?];
    let id = crate::ids::new_id("exp");
    let count = trail.items.len();
    super::exports::deliver(
        id,
        target,
        Method::POST,
        payload,
        headers,
        count,
        Some(trail.id.clone()),
    )
    .await
    .map(|(receipt, _)| receipt)
}

/// List proof trails, newest first (without their items).
#[utoipa::path(
    get, path = "/api/proof-event-trails", tag = "governance",
    params(("limit" = Option<u32>, Query, description = "Default 100, clamped to 1000")),
    responses(
        (status = 200, body = TrailList),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 429, body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn list(
    State(state): State<AppState>,
    principal: Principal,
    Query(params): Query<HashMap<String, String>>,
) -> Result<Json<TrailList>> {
    principal.require(Scope::Read)?;
    super::check_params(&params, &["limit"])?;
    let limit = super::limit_of(&params)?;
    let proof_trails = state.store.list_proof_trails(&principal.workspace_id, limit).await?;
    Ok(Json(TrailList { proof_trails }))
}

async fn load(state: &AppState, principal: &Principal, id: &str) -> Result<ProofTrail> {
    principal.require(Scope::Read)?;
    state
        .store
        .get_proof_trail(&principal.workspace_id, id)
        .await?
        .ok_or_else(|| Error::NotFound(format!("proof trail {id}")))
}

/// One proof trail, with its export receipts.
#[utoipa::path(
    get, path = "/api/proof-event-trails/{id}", tag = "governance",
    params(("id" = String, Path, description = "`prf_...`")),
    responses(
        (status = 200, body = TrailBody),
        (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn get(
    State(state): State<AppState>,
    principal: Principal,
    PathId(id): PathId,
) -> Result<Json<TrailBody>> {
    let proof_trail = load(&state, &principal, &id).await?;
    let export_receipts =
        state.store.list_export_receipts(&principal.workspace_id, Some(&id), 1000).await?;
    Ok(Json(TrailBody { proof_trail, export_receipts }))
}

/// Recompute a proof trail's item hashes and Merkle root.
#[utoipa::path(
    get, path = "/api/proof-event-trails/{id}/verify", tag = "governance",
    params(("id" = String, Path, description = "`prf_...`")),
    responses(
        (status = 200, description = "`valid` is false when an item or the root no longer matches", body = ProofVerification),
        (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn verify(
    State(state): State<AppState>,
    principal: Principal,
    PathId(id): PathId,
) -> Result<Json<ProofVerification>> {
    let trail = load(&state, &principal, &id).await?;
    Ok(Json(proof::verify(&trail)))
}
