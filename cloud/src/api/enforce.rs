//! `POST /api/governance/enforce` and the receipts it records:
//! `GET /api/governance/receipts` (list and one) and the chain check
//! `GET /api/governance/receipts/verify`. Reference: `docs/governance.md`,
//! "Enforcement" and "Receipts".

use std::collections::{BTreeSet, HashMap};

use axum::Json;
use axum::extract::{Query, State};
use opgraph_proto::{MAX_FREE_OBJECT_BYTES, value_fits_in};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use utoipa::ToSchema;

use super::governance::{
    MAX_TEXT, amount, currency, event, not_null, optional_text, parse_body, text,
};
use super::{AppState, JsonBody, PathId, parse_ms};
use super::{check_params, limit_of, parse_limit_in};
use crate::auth::{Principal, Scope};
use crate::error::{Error, Result};
use crate::governance::chain::{ChainStart, ChainVerifier, Rest, VerifyReport};
use crate::governance::rules::{self, Check, Proposal, Trigger};
use crate::governance::{Outcome, governance_event, hash, object_of};
use crate::store::NewEvent;
use crate::store::governance::{
    ChainFrom, ChainHead, ChainPage, EnforcementInputs, EnforcementRefs, Receipt, ReceiptFilter,
    ReceiptRow,
};
use crate::webhooks::ENFORCEMENT_DECIDED;

const MAX_ATTESTATIONS: usize = 20;
/// Receipts read per store page while verifying chains.
const VERIFY_PAGE: usize = 1000;
/// Receipts one verification call checks, by default and at most: each
/// call's work is bounded, and a longer walk goes on in the next call.
const VERIFY_DEFAULT_LIMIT: usize = 10_000;
const VERIFY_MAX_LIMIT: usize = 100_000;

type ErrorBody = crate::error::ErrorBody;

// ---------------------------------------------------------------------------
// Enforcement.

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EnforceRequest {
    pub decision_object_id: String,
    pub authority_grant_id: String,
    pub context_contract_id: String,
    pub proposed_action: ProposedAction,
    /// One attestation or an array of up to 20.
    #[schema(value_type = Option<Object>)]
    pub attestation: Option<Attestations>,
    /// The triggering event is the most recent event of this trace.
    pub trace_id: Option<String>,
    /// The triggering event (takes precedence over `traceId`). May be left
    /// out, but not `null`: that would judge the trust tier on the trace's
    /// latest event instead of the one meant.
    #[serde(default, deserialize_with = "not_null")]
    #[schema(nullable = false)]
    pub event_id: Option<String>,
    /// Framework name → control evidence.
    #[schema(value_type = Option<Object>)]
    pub compliance_mapping: Option<Map<String, Value>>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProposedAction {
    pub action: String,
    /// Finite, 0 ..= 1e15. May be left out, but not `null`.
    #[serde(default, deserialize_with = "not_null")]
    #[schema(nullable = false)]
    pub amount: Option<f64>,
    /// Three upper-case letters; required with `amount`. May be left out
    /// (without an amount), but not `null`: the grant's currency check
    /// would pass as "no currency proposed".
    #[serde(default, deserialize_with = "not_null")]
    #[schema(nullable = false)]
    pub currency: Option<String>,
    /// Who proposes to act; must be the grant's grantee when given. May be
    /// left out, but not `null`: the grantee check would be skipped.
    #[serde(default, deserialize_with = "not_null")]
    #[schema(nullable = false)]
    pub actor: Option<String>,
    /// Other keys are recorded as sent.
    #[serde(flatten)]
    #[schema(value_type = Object)]
    pub extra: Map<String, Value>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Attestations {
    One(Attestation),
    Many(Vec<Attestation>),
}

#[derive(Debug, Deserialize)]
pub struct Attestation {
    pub provider: String,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct EnforceResponse {
    pub outcome: Outcome,
    pub receipt_id: String,
    pub checks: Vec<Check>,
    pub receipt: Receipt,
}

/// A validated enforcement request.
struct Validated {
    refs: EnforcementRefs,
    proposal: Proposal,
    /// `proposedAction` as sent.
    proposed_action: Value,
    attestations: Vec<Value>,
    providers: Vec<String>,
    frameworks: Vec<String>,
}

fn validate_enforce(body: Value) -> Result<Validated> {
    // Recorded in the receipt as sent, and sent on to webhooks.
    for field in ["proposedAction", "attestation", "complianceMapping"] {
        if body.get(field).is_some_and(|v| !value_fits_in(v, MAX_FREE_OBJECT_BYTES)) {
            return Err(Error::validation(
                field,
                format!("must be at most {MAX_FREE_OBJECT_BYTES} bytes as JSON"),
            ));
        }
    }
    let proposed_action = body.get("proposedAction").cloned().unwrap_or(Value::Null);
    let attestation_raw = body.get("attestation").cloned();
    let input: EnforceRequest = parse_body(body)?;
    let id = |field: &str, value: &str| text(field, value, MAX_TEXT);
    let p = &input.proposed_action;
    let amount = amount("proposedAction.amount", p.amount)?;
    let currency = currency("proposedAction.currency", p.currency.as_deref())?;
    if amount.is_some() && currency.is_none() {
        return Err(Error::validation(
            "proposedAction.currency",
            "`proposedAction.currency` is required with an amount",
        ));
    }
    let proposal = Proposal {
        action: text("proposedAction.action", &p.action, MAX_TEXT)?,
        amount,
        currency,
        actor: optional_text("proposedAction.actor", p.actor.as_deref(), MAX_TEXT)?,
    };
    let (attestations, providers) = match (input.attestation, attestation_raw) {
        (None, _) | (_, None) => (Vec::new(), Vec::new()),
        (Some(parsed), Some(raw)) => {
            let (list, raw_list) = match (parsed, raw) {
                (Attestations::One(a), raw) => (vec![a], vec![raw]),
                (Attestations::Many(list), Value::Array(raw)) => (list, raw),
                (Attestations::Many(_), _) => (Vec::new(), Vec::new()),
            };
            if list.len() > MAX_ATTESTATIONS {
                return Err(Error::validation(
                    "attestation",
                    format!("at most {MAX_ATTESTATIONS} attestations"),
                ));
            }
            let providers = list
                .iter()
                .enumerate()
                .map(|(i, a)| text(&format!("attestation[{i}].provider"), &a.provider, MAX_TEXT))
                .collect::<Result<Vec<_>>>()?;
            (raw_list, providers)
        }
    };
    let frameworks =
        input.compliance_mapping.map(|m| m.keys().cloned().collect::<Vec<_>>()).unwrap_or_default();
    Ok(Validated {
        refs: EnforcementRefs {
            decision_id: id("decisionObjectId", &input.decision_object_id)?,
            grant_id: id("authorityGrantId", &input.authority_grant_id)?,
            contract_id: id("contextContractId", &input.context_contract_id)?,
            event_id: optional_text("eventId", input.event_id.as_deref(), MAX_TEXT)?,
            trace_id: optional_text("traceId", input.trace_id.as_deref(), MAX_TEXT)?,
        },
        proposal,
        proposed_action,
        attestations,
        providers,
        frameworks,
    })
}

/// Decide whether a consequential action may proceed, and record a receipt.
#[utoipa::path(
    post, path = "/api/governance/enforce", tag = "governance",
    request_body = EnforceRequest,
    responses(
        (status = 200, description = "Evaluated and recorded; `outcome` is deny > needs_human_approval > escrow > allow over the checks", body = EnforceResponse),
        (status = 400, description = "Malformed or incomplete body; no receipt recorded", body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 403, description = "The credential lacks the `govern` scope; no receipt recorded", body = ErrorBody),
        (status = 413, body = ErrorBody), (status = 415, body = ErrorBody),
        (status = 429, body = ErrorBody), (status = 503, body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn enforce(
    State(state): State<AppState>,
    principal: Principal,
    JsonBody(body): JsonBody,
) -> Result<Json<EnforceResponse>> {
    principal.require(Scope::Govern)?;
    let v = validate_enforce(body)?;
    let refs = v.refs.clone();
    let (ws, subject) = (principal.workspace_id.clone(), principal.subject.clone());
    let decide = Box::new(move |inputs: EnforcementInputs, head: &ChainHead| {
        decide(v, inputs, head, ws, subject)
    });
    let receipt = state
        .store
        .record_enforcement(&principal.workspace_id, &principal.subject, &refs, decide)
        .await?;
    state.webhooks.notify(&principal.workspace_id, ENFORCEMENT_DECIDED, &receipt.id, || {
        serde_json::to_value(&receipt).unwrap_or_default()
    });
    Ok(Json(EnforceResponse {
        outcome: receipt.outcome,
        receipt_id: receipt.id.clone(),
        checks: receipt.checks.clone(),
        receipt,
    }))
}

/// Judges the call on `inputs` (read in the store's write transaction) and
/// seals its receipt at `head`; also makes the receipt's event.
fn decide(
    v: Validated,
    inputs: EnforcementInputs,
    head: &ChainHead,
    workspace_id: String,
    subject: String,
) -> Result<(Receipt, Vec<NewEvent>)> {
    let trigger = match (&inputs.trigger, &v.refs.event_id, &v.refs.trace_id) {
        (Some(found), _, _) if found.own => Trigger::OwnRecord(found.id.clone()),
        (Some(found), _, _) => {
            Trigger::Found { event_id: found.id.clone(), tier: found.trust_tier }
        }
        (None, Some(event_id), _) => Trigger::EventMissing(event_id.clone()),
        (None, None, Some(trace)) => Trigger::TraceEmpty(trace.clone()),
        (None, None, None) => Trigger::NotNamed,
    };
    let frameworks: Vec<String> = v
        .frameworks
        .iter()
        .chain(inputs.trigger.iter().flat_map(|t| &t.compliance_frameworks))
        .cloned()
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let now = crate::now_ms();
    let evaluation = rules::evaluate(&rules::Inputs {
        now_ms: now,
        subject: &subject,
        decision_id: &v.refs.decision_id,
        decision: inputs.decision.as_ref(),
        grant_id: &v.refs.grant_id,
        grant: inputs.grant.as_ref(),
        contract_id: &v.refs.contract_id,
        contract: inputs.contract.as_ref(),
        proposal: &v.proposal,
        trigger: &trigger,
        attested_providers: &v.providers,
        compliance_frameworks: &frameworks,
    });

    let receipt_id = crate::ids::new_id("rcp");
    let trace_id = v.refs.trace_id.clone();
    let enforced = governance_event(
        "enforced",
        &subject,
        Some(("receipt", &receipt_id)),
        trace_id.as_deref(),
        Some(&v.refs.decision_id),
        object_of([
            ("receiptId", json!(receipt_id)),
            ("outcome", json!(evaluation.outcome)),
            ("action", json!(v.proposal.action)),
            ("amount", v.proposal.amount.map_or(Value::Null, |a| json!(a))),
            ("currency", v.proposal.currency.as_ref().map_or(Value::Null, |c| json!(c))),
            ("authorityGrantId", json!(v.refs.grant_id)),
            ("contextContractId", json!(v.refs.contract_id)),
        ]),
        now,
    );
    let mut receipt = Receipt {
        id: receipt_id,
        workspace_id,
        writer: subject,
        sequence: head.sequence,
        prev_hash: head.prev_hash.clone(),
        created_at: now,
        outcome: evaluation.outcome,
        decision_object_id: v.refs.decision_id,
        authority_grant_id: v.refs.grant_id,
        context_contract_id: v.refs.contract_id,
        trace_id,
        event_id: v.refs.event_id,
        proposed_action: v.proposed_action,
        attestations: v.attestations,
        compliance_frameworks: frameworks,
        trigger: inputs.trigger.map(|t| json!({"eventId": t.id, "trustTier": t.trust_tier})),
        checks: evaluation.checks,
        content_hash: String::new(),
    };
    let value = serde_json::to_value(&receipt).map_err(Error::internal)?;
    receipt.content_hash = hash::content_hash(&value);
    Ok((receipt, vec![event(now, enforced)]))
}

// ---------------------------------------------------------------------------
// Receipts.

#[derive(Debug, Serialize, ToSchema)]
pub struct ReceiptList {
    /// Receipts as stored, newest first.
    #[schema(value_type = Vec<Receipt>)]
    pub receipts: Vec<Value>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ReceiptBody {
    #[schema(value_type = Receipt)]
    pub receipt: Value,
}

/// The stored body of a receipt, as stored (tampering shows).
pub fn receipt_json(row: &ReceiptRow) -> Result<Value> {
    serde_json::from_str(&row.body).map_err(Error::internal)
}

/// List enforcement receipts, newest first.
#[utoipa::path(
    get, path = "/api/governance/receipts", tag = "governance",
    params(
        ("limit" = Option<u32>, Query, description = "Default 100, clamped to 1000"),
        ("traceId" = Option<String>, Query),
        ("decisionId" = Option<String>, Query),
        ("outcome" = Option<String>, Query, description = "allow, deny, escrow or needs_human_approval"),
        ("from" = Option<i64>, Query, description = "createdAt at or after, ms"),
        ("to" = Option<i64>, Query, description = "createdAt before, ms"),
    ),
    responses(
        (status = 200, body = ReceiptList),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 429, body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn list_receipts(
    State(state): State<AppState>,
    principal: Principal,
    Query(params): Query<HashMap<String, String>>,
) -> Result<Json<ReceiptList>> {
    principal.require(Scope::Read)?;
    check_params(&params, &["limit", "traceId", "decisionId", "outcome", "from", "to"])?;
    let filter = ReceiptFilter {
        limit: limit_of(&params)?,
        trace_id: params.get("traceId").cloned(),
        decision_id: params.get("decisionId").cloned(),
        outcome: params
            .get("outcome")
            .map(|o| {
                Outcome::parse(o).ok_or_else(|| {
                    Error::validation(
                        "outcome",
                        "`outcome` must be allow, deny, escrow or needs_human_approval",
                    )
                })
            })
            .transpose()?,
        from: parse_ms("from", params.get("from").map(String::as_str))?,
        to: parse_ms("to", params.get("to").map(String::as_str))?,
    };
    if let (Some(from), Some(to)) = (filter.from, filter.to)
        && from > to
    {
        return Err(Error::validation("from", "`from` must not be after `to`"));
    }
    let rows = state.store.list_receipts(&principal.workspace_id, &filter).await?;
    let receipts = rows.iter().map(receipt_json).collect::<Result<Vec<_>>>()?;
    Ok(Json(ReceiptList { receipts }))
}

/// One enforcement receipt.
#[utoipa::path(
    get, path = "/api/governance/receipts/{id}", tag = "governance",
    params(("id" = String, Path, description = "`rcp_...`")),
    responses(
        (status = 200, body = ReceiptBody),
        (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn get_receipt(
    State(state): State<AppState>,
    principal: Principal,
    PathId(id): PathId,
) -> Result<Json<ReceiptBody>> {
    principal.require(Scope::Read)?;
    let rows = state.store.get_receipts(&principal.workspace_id, std::slice::from_ref(&id)).await?;
    let row = rows.first().ok_or_else(|| Error::NotFound(format!("receipt {id}")))?;
    Ok(Json(ReceiptBody { receipt: receipt_json(row)? }))
}

/// What one verification call is asked to check.
#[derive(Debug, Clone, PartialEq)]
struct VerifyScope {
    from: ChainFrom,
    one_chain: bool,
    /// Set when the walk starts inside a chain (a continuation).
    start: Option<ChainStart>,
    limit: usize,
}

fn verify_scope(params: &HashMap<String, String>) -> Result<VerifyScope> {
    check_params(params, &["writer", "fromWriter", "fromSequence", "prevHash", "limit"])?;
    let limit = parse_limit_in(
        params.get("limit").map(String::as_str),
        VERIFY_DEFAULT_LIMIT,
        VERIFY_MAX_LIMIT,
    )?;
    if limit == 0 {
        // A walk of no receipts never gets anywhere, however often called.
        return Err(Error::validation("limit", "`limit` must be at least 1"));
    }
    let (chain, one_chain) = match (params.get("writer"), params.get("fromWriter")) {
        (Some(_), Some(_)) => {
            return Err(Error::validation(
                "fromWriter",
                "give `writer` (one chain) or `fromWriter` (every chain from that one on), not both",
            ));
        }
        (Some(writer), None) => (Some(("writer", writer)), true),
        (None, Some(writer)) => (Some(("fromWriter", writer)), false),
        (None, None) => (None, false),
    };
    if let Some((name, writer)) = chain
        && writer.is_empty()
    {
        return Err(Error::validation(name, format!("`{name}` must not be empty")));
    }
    let from_sequence = params
        .get("fromSequence")
        .map(|text| {
            text.parse::<i64>()
                .map_err(|_| Error::validation("fromSequence", "`fromSequence` must be an integer"))
        })
        .transpose()?;
    // A position names a chain, and the link to it is checked against the
    // hash the previous call read: without it a continuation would trust
    // whatever is stored before the cut now.
    let (from, start) = match (chain, from_sequence, params.get("prevHash")) {
        (chain, None, None) => {
            (ChainFrom::Chain(chain.map_or_else(String::new, |(_, w)| w.clone())), None)
        }
        (None, Some(_), _) => {
            return Err(Error::validation(
                "fromSequence",
                "`fromSequence` is a position in one chain: give `writer` or `fromWriter` too",
            ));
        }
        (_, Some(_), None) => {
            return Err(Error::validation(
                "prevHash",
                "`prevHash` is required with `fromSequence`: the contentHash of the receipt \
                 before it, as a previous call's `next` gives it",
            ));
        }
        (_, None, Some(_)) => {
            return Err(Error::validation("prevHash", "`prevHash` goes with `fromSequence`"));
        }
        (Some((_, writer)), Some(from_sequence), Some(prev_hash)) => {
            let Some(before) = from_sequence.checked_sub(1) else {
                return Err(Error::validation("fromSequence", "`fromSequence` is out of range"));
            };
            let start =
                ChainStart { writer: writer.clone(), from_sequence, prev_hash: prev_hash.clone() };
            (ChainFrom::After(writer.clone(), before), Some(start))
        }
    };
    Ok(VerifyScope { from, one_chain, start, limit })
}

/// Walk the receipt chains of the workspace (or one chain, or from a
/// continuation on), at most `limit` receipts, and report the first broken
/// link.
#[utoipa::path(
    get, path = "/api/governance/receipts/verify", tag = "governance",
    params(
        ("writer" = Option<String>, Query, description = "Only this writer's chain"),
        ("fromWriter" = Option<String>, Query, description = "Every chain from this writer's on, in writer order (how a walk over every chain goes on)"),
        ("fromSequence" = Option<i64>, Query, description = "Start at this sequence of the first chain; needs `writer` or `fromWriter`, and `prevHash`"),
        ("prevHash" = Option<String>, Query, description = "contentHash of the receipt before `fromSequence`, as the previous call's `next` gave it: the first link is checked against it"),
        ("limit" = Option<u32>, Query, description = "Receipts checked by this call: default 10000, clamped to 100000, at least 1"),
    ),
    responses(
        (status = 200, description = "`valid` is false when a checked link is broken; `firstBroken` says where and why. `complete` is false when there is more to check: send `next` as the query of the next call", body = VerifyReport),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 429, body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn verify_receipts(
    State(state): State<AppState>,
    principal: Principal,
    Query(params): Query<HashMap<String, String>>,
) -> Result<Json<VerifyReport>> {
    principal.require(Scope::Read)?;
    let scope = verify_scope(&params)?;
    let ws = &principal.workspace_id;
    let mut verifier = match scope.start.clone() {
        Some(start) => ChainVerifier::starting_at(start),
        None => ChainVerifier::new(),
    };
    let mut from = scope.from.clone();
    let mut budget = scope.limit;
    let rest = loop {
        let limit = budget.min(VERIFY_PAGE);
        let asked = ChainPage { from, one_chain: scope.one_chain, limit };
        let page = state.store.receipt_chain_page(ws, &asked).await?;
        page.iter().for_each(|row| verifier.push(row));
        // A page may hold more than asked for (every copy of its last
        // position): only a short one is the last.
        let Some(last) = page.last().filter(|_| page.len() >= limit) else {
            break Rest::Nothing;
        };
        from = ChainFrom::After(last.writer.clone(), last.sequence);
        budget = budget.saturating_sub(page.len());
        if budget == 0 {
            // One receipt more says whether anything is left, and whether
            // the cut is inside a chain or between two.
            let probe = ChainPage { from, one_chain: scope.one_chain, limit: 1 };
            let after = state.store.receipt_chain_page(ws, &probe).await?;
            break match after.first() {
                None => Rest::Nothing,
                Some(row) if row.writer == last.writer => Rest::SameChain,
                Some(row) => Rest::NextChain(row.writer.clone()),
            };
        }
    };
    Ok(Json(verifier.finish_with(rest, scope.one_chain)))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn body(proposed_action: Value) -> Value {
        json!({
            "decisionObjectId": "dec_1",
            "authorityGrantId": "grt_1",
            "contextContractId": "ctc_1",
            "proposedAction": proposed_action,
        })
    }

    #[test]
    fn a_null_amount_is_refused_and_an_absent_one_is_none() {
        let null = validate_enforce(body(json!({"action": "refund", "amount": null})));
        match null {
            Err(Error::Validation { field, .. }) => {
                assert_eq!(field.as_deref(), Some("proposedAction.amount"));
            }
            Err(other) => panic!("{other:?}"),
            Ok(v) => panic!("accepted, as amount {:?}", v.proposal.amount),
        }
        let absent = validate_enforce(body(json!({"action": "refund"}))).unwrap();
        assert_eq!(absent.proposal.amount, None);
        let given =
            validate_enforce(body(json!({"action": "refund", "amount": 5, "currency": "EUR"})))
                .unwrap();
        assert_eq!(given.proposal.amount, Some(5.0));
    }

    #[test]
    fn a_null_that_would_skip_a_check_is_refused() {
        let refused = |body: Value| match validate_enforce(body) {
            Err(Error::Validation { field, .. }) => field,
            Err(other) => panic!("{other:?}"),
            Ok(_) => None,
        };
        for name in ["currency", "actor"] {
            let mut action = json!({"action": "refund"});
            action[name] = Value::Null;
            let field = format!("proposedAction.{name}");
            assert_eq!(refused(body(action)).as_deref(), Some(field.as_str()));
        }
        let mut named = body(json!({"action": "refund"}));
        named["eventId"] = Value::Null;
        assert_eq!(refused(named).as_deref(), Some("eventId"));
        // Nulls whose absence only makes the call stricter are absent.
        let mut stricter = body(json!({"action": "refund"}));
        for name in ["traceId", "attestation", "complianceMapping"] {
            stricter[name] = Value::Null;
        }
        let v = validate_enforce(stricter).unwrap();
        assert!(v.refs.trace_id.is_none() && v.providers.is_empty() && v.frameworks.is_empty());
    }

    fn scope(query: &[(&str, &str)]) -> Result<VerifyScope> {
        verify_scope(&query.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect())
    }

    fn refused_param(query: &[(&str, &str)]) -> Option<String> {
        match scope(query) {
            Err(Error::Validation { field, .. }) => field,
            other => panic!("{query:?}: {other:?}"),
        }
    }

    #[test]
    fn verify_walks_everything_by_default_bounded_per_call() {
        let all = scope(&[]).unwrap();
        assert_eq!(all.from, ChainFrom::Chain(String::new()));
        assert!(!all.one_chain && all.start.is_none());
        assert_eq!(all.limit, VERIFY_DEFAULT_LIMIT);
        assert_eq!(scope(&[("limit", "99999999999999999999")]).unwrap().limit, VERIFY_MAX_LIMIT);
        assert_eq!(scope(&[("limit", "7")]).unwrap().limit, 7);
    }

    #[test]
    fn verify_goes_on_from_a_continuation() {
        let one = scope(&[("writer", "key_a")]).unwrap();
        assert_eq!((one.from, one.one_chain), (ChainFrom::Chain("key_a".into()), true));
        let on = scope(&[("writer", "key_a"), ("fromSequence", "6"), ("prevHash", "ab")]).unwrap();
        assert_eq!(on.from, ChainFrom::After("key_a".into(), 5));
        assert_eq!(
            on.start,
            Some(ChainStart { writer: "key_a".into(), from_sequence: 6, prev_hash: "ab".into() })
        );
        let walk = scope(&[("fromWriter", "key_b")]).unwrap();
        assert_eq!((walk.from, walk.one_chain), (ChainFrom::Chain("key_b".into()), false));
    }

    #[test]
    fn bad_verify_parameters_are_400_naming_them() {
        for (query, field) in [
            (&[("limit", "-1")][..], "limit"),
            (&[("limit", "1.5")], "limit"),
            (&[("limit", "0")], "limit"),
            (&[("writer", "a"), ("fromWriter", "b")], "fromWriter"),
            (&[("writer", "")], "writer"),
            (&[("fromSequence", "3"), ("prevHash", "ab")], "fromSequence"),
            (&[("writer", "a"), ("fromSequence", "x"), ("prevHash", "ab")], "fromSequence"),
            (&[("writer", "a"), ("fromSequence", "3")], "prevHash"),
            (&[("writer", "a"), ("prevHash", "ab")], "prevHash"),
            (
                &[("writer", "a"), ("fromSequence", &i64::MIN.to_string()), ("prevHash", "ab")],
                "fromSequence",
            ),
            (&[("sequence", "3")], "sequence"),
        ] {
            assert_eq!(refused_param(query).as_deref(), Some(field), "{query:?}");
        }
    }

    #[test]
    fn the_openapi_schema_says_amount_is_a_number_not_null() {
        let schema = serde_json::to_value(<ProposedAction as utoipa::PartialSchema>::schema());
        let schema = schema.unwrap();
        // `extra` is flattened: the named fields are one part of an `allOf`.
        let fields = schema["allOf"]
            .as_array()
            .and_then(|parts| parts.iter().find(|p| p.get("properties").is_some()))
            .unwrap_or_else(|| panic!("no properties in {schema}"));
        assert_eq!(fields["properties"]["amount"]["type"], "number", "{schema}");
        assert_eq!(fields["properties"]["currency"]["type"], "string", "{schema}");
        assert_eq!(fields["properties"]["actor"]["type"], "string", "{schema}");
        assert_eq!(fields["required"], json!(["action"]), "{schema}");
        let request = serde_json::to_value(<EnforceRequest as utoipa::PartialSchema>::schema());
        let request = request.unwrap();
        assert_eq!(request["properties"]["eventId"]["type"], "string", "{request}");
        assert_eq!(request["properties"]["traceId"]["type"], json!(["string", "null"]));
    }
}
