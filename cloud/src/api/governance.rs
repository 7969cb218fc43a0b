//! `/api/governance/*` objects: decision objects (with their status
//! transitions), authority grants and context contracts; and the body
//! parsing and validation every governance endpoint shares. Enforcement and
//! receipts are in [`super::enforce`], proof trails in [`super::proofs`].
//!
//! Handlers validate, load through the store, and leave every judgement to
//! [`crate::governance`]. Reference: `docs/governance.md`.

use std::collections::HashMap;

use axum::Json;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use opgraph_proto::TrustTier;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use utoipa::ToSchema;

use super::{AppState, JsonBody, PathId, check_params, limit_of};
use crate::auth::{Principal, Scope};
use crate::error::{Error, Result};
use crate::governance::{DecisionStatus, MAX_AMOUNT, RiskLevel, governance_event, object_of};
use crate::store::NewEvent;
use crate::store::governance::{AuthorityGrant, ContextContract, Decision};

pub const MAX_TEXT: usize = 200;
pub const MAX_DESCRIPTION: usize = 2000;
const MAX_LIST: usize = 100;

type ErrorBody = crate::error::ErrorBody;

// ---------------------------------------------------------------------------
// Body parsing and validation shared by the governance endpoints.

/// Deserializes a body into `T`, naming the JSON path of the first problem.
pub fn parse_body<T: DeserializeOwned>(body: Value) -> Result<T> {
    super::object_body(&body)?;
    serde_path_to_error::deserialize(body).map_err(|e| {
        let path = e.path().to_string();
        let message = e.into_inner().to_string();
        // serde names a missing field in its message, at the path of the
        // object that lacks it.
        let missing = message
            .strip_prefix("missing field `")
            .and_then(|m| m.strip_suffix('`'))
            .map(|name| if path == "." { name.to_owned() } else { format!("{path}.{name}") });
        Error::Validation { field: missing.or((path != ".").then_some(path)), message }
    })
}

pub fn text(field: &str, value: &str, max: usize) -> Result<String> {
    let trimmed = value.trim();
    if trimmed.is_empty() || trimmed.chars().count() > max {
        return Err(Error::validation(field, format!("`{field}` must be 1 to {max} characters")));
    }
    Ok(trimmed.to_owned())
}

pub fn optional_text(field: &str, value: Option<&str>, max: usize) -> Result<Option<String>> {
    value.map(|v| text(field, v, max)).transpose()
}

fn text_list(field: &str, values: &[String], min: usize) -> Result<Vec<String>> {
    if values.len() < min || values.len() > MAX_LIST {
        return Err(Error::validation(
            field,
            format!("`{field}` must hold {min} to {MAX_LIST} strings"),
        ));
    }
    values.iter().enumerate().map(|(i, v)| text(&format!("{field}[{i}]"), v, MAX_TEXT)).collect()
}

/// For `#[serde(default, deserialize_with = "not_null")]` on an `Option`
/// field that the docs call a value: leaving the key out is `None`, an
/// explicit `null` is refused. Plain `Option` would take `null` as absent,
/// and a client that computed a null amount would then skip every amount
/// check without knowing.
///
/// The rule for governance bodies (docs/governance.md, "Nulls"): a field
/// whose absence lifts a limit or skips a check (a maximum, a threshold, a
/// validity bound, a currency, a required tier, an expiry) takes this; a
/// field whose absence only makes things stricter or is informational
/// (a description, the default `draft` status) takes a plain `Option`, and
/// a null there is the same as leaving the key out.
pub fn not_null<'de, D, T>(d: D) -> std::result::Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    match Option::<T>::deserialize(d)? {
        Some(value) => Ok(Some(value)),
        None => Err(serde::de::Error::custom("must not be null: leave the key out instead")),
    }
}

/// An amount: finite, 0 ..= [`MAX_AMOUNT`].
pub fn amount(field: &str, value: Option<f64>) -> Result<Option<f64>> {
    match value {
        Some(v) if !v.is_finite() || !(0.0..=MAX_AMOUNT).contains(&v) => Err(Error::validation(
            field,
            format!("`{field}` must be a number from 0 to {MAX_AMOUNT:e}"),
        )),
        other => Ok(other),
    }
}

/// A currency code: three upper-case ASCII letters.
pub fn currency(field: &str, value: Option<&str>) -> Result<Option<String>> {
    match value {
        Some(c) if c.len() != 3 || !c.bytes().all(|b| b.is_ascii_uppercase()) => {
            Err(Error::validation(
                field,
                format!("`{field}` must be a three-letter ISO 4217 code like EUR"),
            ))
        }
        other => Ok(other.map(str::to_owned)),
    }
}

fn time(field: &str, value: Option<i64>) -> Result<Option<i64>> {
    match value {
        Some(v) if v < 0 => {
            Err(Error::validation(field, format!("`{field}` must be ms since the epoch")))
        }
        other => Ok(other),
    }
}

pub fn event(id_at: i64, event: opgraph_proto::Event) -> NewEvent {
    NewEvent { id: crate::ids::new_id("evt"), received_at: id_at, event }
}

// ---------------------------------------------------------------------------
// Decision objects.

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateDecision {
    pub title: String,
    pub risk_level: RiskLevel,
    /// `draft` (default), `pending_approval` or `approved`.
    pub status: Option<DecisionStatus>,
    pub description: Option<String>,
    pub owner: Option<String>,
    pub trace_id: Option<String>,
    /// Left out: the decision does not expire; `null` is refused.
    #[serde(default, deserialize_with = "not_null")]
    #[schema(nullable = false)]
    pub expires_at: Option<i64>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PatchDecision {
    pub status: DecisionStatus,
    /// Why; recorded in the status-change event.
    pub reason: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DecisionBody {
    pub decision_object: Decision,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DecisionList {
    pub decision_objects: Vec<Decision>,
}

/// Create a DecisionObject.
#[utoipa::path(
    post, path = "/api/governance/decision-objects", tag = "governance",
    request_body = CreateDecision,
    responses(
        (status = 201, body = DecisionBody),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 413, body = ErrorBody),
        (status = 415, body = ErrorBody), (status = 429, body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn create_decision(
    State(state): State<AppState>,
    principal: Principal,
    JsonBody(body): JsonBody,
) -> Result<(StatusCode, Json<DecisionBody>)> {
    principal.require(Scope::Govern)?;
    let input: CreateDecision = parse_body(body)?;
    let status = input.status.unwrap_or(DecisionStatus::Draft);
    if !DecisionStatus::INITIAL.contains(&status) {
        return Err(Error::validation(
            "status",
            "a decision is created as draft, pending_approval or approved",
        ));
    }
    let now = crate::now_ms();
    let decision = Decision {
        id: crate::ids::new_id("dec"),
        title: text("title", &input.title, MAX_TEXT)?,
        status,
        risk_level: input.risk_level,
        description: optional_text("description", input.description.as_deref(), MAX_DESCRIPTION)?,
        owner: optional_text("owner", input.owner.as_deref(), MAX_TEXT)?,
        trace_id: optional_text("traceId", input.trace_id.as_deref(), MAX_TEXT)?,
        expires_at: time("expiresAt", input.expires_at)?,
        created_at: now,
        updated_at: now,
        created_by: principal.subject.clone(),
    };
    let created = governance_event(
        "decision.created",
        &principal.subject,
        Some(("decision", &decision.id)),
        decision.trace_id.as_deref(),
        Some(&decision.id),
        object_of([
            ("status", json!(status)),
            ("riskLevel", json!(decision.risk_level)),
            ("title", json!(decision.title)),
        ]),
        now,
    );
    state
        .store
        .insert_decision(&principal.workspace_id, &decision, vec![event(now, created)])
        .await?;
    Ok((StatusCode::CREATED, Json(DecisionBody { decision_object: decision })))
}

/// List DecisionObjects, newest first.
#[utoipa::path(
    get, path = "/api/governance/decision-objects", tag = "governance",
    params(
        ("limit" = Option<u32>, Query, description = "Default 100, clamped to 1000"),
        ("status" = Option<String>, Query, description = "Only decisions in this status"),
    ),
    responses(
        (status = 200, body = DecisionList),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 429, body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn list_decisions(
    State(state): State<AppState>,
    principal: Principal,
    Query(params): Query<HashMap<String, String>>,
) -> Result<Json<DecisionList>> {
    principal.require(Scope::Read)?;
    check_params(&params, &["limit", "status"])?;
    let status = params
        .get("status")
        .map(|s| {
            DecisionStatus::parse(s)
                .ok_or_else(|| Error::validation("status", "`status` must be a decision status"))
        })
        .transpose()?;
    let decision_objects =
        state.store.list_decisions(&principal.workspace_id, status, limit_of(&params)?).await?;
    Ok(Json(DecisionList { decision_objects }))
}

/// One DecisionObject.
#[utoipa::path(
    get, path = "/api/governance/decision-objects/{id}", tag = "governance",
    params(("id" = String, Path, description = "`dec_...`")),
    responses(
        (status = 200, body = DecisionBody),
        (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, description = "No such decision in this workspace", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn get_decision(
    State(state): State<AppState>,
    principal: Principal,
    PathId(id): PathId,
) -> Result<Json<DecisionBody>> {
    principal.require(Scope::Read)?;
    let decision = state
        .store
        .get_decision(&principal.workspace_id, &id)
        .await?
        .ok_or_else(|| Error::NotFound(format!("decision {id}")))?;
    Ok(Json(DecisionBody { decision_object: decision }))
}

/// Change a DecisionObject's status along the transition table.
#[utoipa::path(
    patch, path = "/api/governance/decision-objects/{id}", tag = "governance",
    params(("id" = String, Path, description = "`dec_...`")),
    request_body = PatchDecision,
    responses(
        (status = 200, body = DecisionBody),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, description = "The transition is not allowed, or the status changed meanwhile", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn patch_decision(
    State(state): State<AppState>,
    principal: Principal,
    PathId(id): PathId,
    JsonBody(body): JsonBody,
) -> Result<Json<DecisionBody>> {
    principal.require(Scope::Govern)?;
    let input: PatchDecision = parse_body(body)?;
    let reason = optional_text("reason", input.reason.as_deref(), MAX_DESCRIPTION)?;
    let ws = &principal.workspace_id;
    let current = state
        .store
        .get_decision(ws, &id)
        .await?
        .ok_or_else(|| Error::NotFound(format!("decision {id}")))?;
    let from = current.status;
    let to = input.status;
    if !from.can_move_to(to) {
        let allowed: Vec<&str> = from.next().iter().map(|s| s.as_str()).collect();
        return Err(Error::Conflict(if allowed.is_empty() {
            format!("decision {id} is {from}, a final status: it cannot move to {to}")
        } else {
            format!(
                "decision {id} cannot move from {from} to {to}; allowed: {}",
                allowed.join(", ")
            )
        }));
    }
    let now = crate::now_ms();
    let updated = Decision { status: to, updated_at: now, ..current };
    let changed = governance_event(
        "decision.status_changed",
        &principal.subject,
        Some(("decision", &id)),
        updated.trace_id.as_deref(),
        Some(&id),
        object_of([
            ("from", json!(from)),
            ("to", json!(to)),
            ("reason", reason.map_or(Value::Null, Value::String)),
        ]),
        now,
    );
    if !state.store.update_decision(ws, from, &updated, vec![event(now, changed)]).await? {
        return Err(Error::Conflict(format!(
            "decision {id} changed status meanwhile; read it again"
        )));
    }
    Ok(Json(DecisionBody { decision_object: updated }))
}

// ---------------------------------------------------------------------------
// Authority grants.

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateGrant {
    pub grantee: String,
    pub actions: Vec<String>,
    // Each of these left out lifts a limit (no maximum, any currency, no
    // threshold, valid since ever or forever), so a null, more likely a
    // client's bug than that wish, is refused instead.
    /// Left out: no maximum; `null` is refused.
    #[serde(default, deserialize_with = "not_null")]
    #[schema(nullable = false)]
    pub max_amount: Option<f64>,
    /// Left out: amounts in any currency; `null` is refused.
    #[serde(default, deserialize_with = "not_null")]
    #[schema(nullable = false)]
    pub currency: Option<String>,
    /// Left out: no approval threshold; `null` is refused.
    #[serde(default, deserialize_with = "not_null")]
    #[schema(nullable = false)]
    pub approval_threshold: Option<f64>,
    /// Left out: valid from creation on; `null` is refused.
    #[serde(default, deserialize_with = "not_null")]
    #[schema(nullable = false)]
    pub valid_from: Option<i64>,
    /// Left out: valid until revoked; `null` is refused.
    #[serde(default, deserialize_with = "not_null")]
    #[schema(nullable = false)]
    pub valid_until: Option<i64>,
    #[serde(default)]
    pub revoked: bool,
    pub description: Option<String>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PatchGrant {
    /// Only `true`: revocation is one way.
    pub revoked: bool,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct GrantBody {
    pub authority_grant: AuthorityGrant,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct GrantList {
    pub authority_grants: Vec<AuthorityGrant>,
}

/// Create an AuthorityGrant.
#[utoipa::path(
    post, path = "/api/governance/authority-grants", tag = "governance",
    request_body = CreateGrant,
    responses(
        (status = 201, body = GrantBody),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 413, body = ErrorBody),
        (status = 415, body = ErrorBody), (status = 429, body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn create_grant(
    State(state): State<AppState>,
    principal: Principal,
    JsonBody(body): JsonBody,
) -> Result<(StatusCode, Json<GrantBody>)> {
    principal.require(Scope::Govern)?;
    let input: CreateGrant = parse_body(body)?;
    let valid_from = time("validFrom", input.valid_from)?;
    let valid_until = time("validUntil", input.valid_until)?;
    if let (Some(from), Some(until)) = (valid_from, valid_until)
        && from >= until
    {
        return Err(Error::validation("validUntil", "`validUntil` must be after `validFrom`"));
    }
    let now = crate::now_ms();
    let grant = AuthorityGrant {
        id: crate::ids::new_id("grt"),
        grantee: text("grantee", &input.grantee, MAX_TEXT)?,
        actions: text_list("actions", &input.actions, 1)?,
        max_amount: amount("maxAmount", input.max_amount)?,
        currency: currency("currency", input.currency.as_deref())?,
        approval_threshold: amount("approvalThreshold", input.approval_threshold)?,
        valid_from,
        valid_until,
        revoked: input.revoked,
        revoked_at: input.revoked.then_some(now),
        description: optional_text("description", input.description.as_deref(), MAX_DESCRIPTION)?,
        created_at: now,
        created_by: principal.subject.clone(),
    };
    state.store.insert_grant(&principal.workspace_id, &grant).await?;
    Ok((StatusCode::CREATED, Json(GrantBody { authority_grant: grant })))
}

/// List AuthorityGrants, newest first.
#[utoipa::path(
    get, path = "/api/governance/authority-grants", tag = "governance",
    params(("limit" = Option<u32>, Query, description = "Default 100, clamped to 1000")),
    responses(
        (status = 200, body = GrantList),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 429, body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn list_grants(
    State(state): State<AppState>,
    principal: Principal,
    Query(params): Query<HashMap<String, String>>,
) -> Result<Json<GrantList>> {
    principal.require(Scope::Read)?;
    check_params(&params, &["limit"])?;
    let authority_grants =
        state.store.list_grants(&principal.workspace_id, limit_of(&params)?).await?;
    Ok(Json(GrantList { authority_grants }))
}

/// One AuthorityGrant.
#[utoipa::path(
    get, path = "/api/governance/authority-grants/{id}", tag = "governance",
    params(("id" = String, Path, description = "`grt_...`")),
    responses(
        (status = 200, body = GrantBody),
        (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn get_grant(
    State(state): State<AppState>,
    principal: Principal,
    PathId(id): PathId,
) -> Result<Json<GrantBody>> {
    principal.require(Scope::Read)?;
    let grant = state
        .store
        .get_grant(&principal.workspace_id, &id)
        .await?
        .ok_or_else(|| Error::NotFound(format!("authority grant {id}")))?;
    Ok(Json(GrantBody { authority_grant: grant }))
}

/// Revoke an AuthorityGrant (`{"revoked": true}`).
#[utoipa::path(
    patch, path = "/api/governance/authority-grants/{id}", tag = "governance",
    params(("id" = String, Path, description = "`grt_...`")),
    request_body = PatchGrant,
    responses(
        (status = 200, body = GrantBody),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, description = "Un-revoking is not possible", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn patch_grant(
    State(state): State<AppState>,
    principal: Principal,
    PathId(id): PathId,
    JsonBody(body): JsonBody,
) -> Result<Json<GrantBody>> {
    principal.require(Scope::Govern)?;
    let input: PatchGrant = parse_body(body)?;
    let ws = &principal.workspace_id;
    if !input.revoked {
        let grant = state
            .store
            .get_grant(ws, &id)
            .await?
            .ok_or_else(|| Error::NotFound(format!("authority grant {id}")))?;
        if grant.revoked {
            return Err(Error::Conflict(format!("grant {id} is revoked; revocation is final")));
        }
        return Ok(Json(GrantBody { authority_grant: grant }));
    }
    let now = crate::now_ms();
    let revoked = governance_event(
        "grant.revoked",
        &principal.subject,
        Some(("authority_grant", &id)),
        None,
        None,
        object_of([("authorityGrantId", json!(id))]),
        now,
    );
    let grant = state
        .store
        .revoke_grant(ws, &id, now, vec![event(now, revoked)])
        .await?
        .ok_or_else(|| Error::NotFound(format!("authority grant {id}")))?;
    Ok(Json(GrantBody { authority_grant: grant }))
}

// ---------------------------------------------------------------------------
// Context contracts.

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateContract {
    pub allowed_actions: Vec<String>,
    pub name: Option<String>,
    /// `T0` .. `T4`. Left out: no tier required; `null` is refused.
    #[serde(default, deserialize_with = "not_null")]
    #[schema(value_type = Option<String>, nullable = false)]
    pub required_trust_tier: Option<TrustTier>,
    #[serde(default)]
    pub required_attestation_providers: Vec<String>,
    #[serde(default)]
    pub required_compliance: Vec<String>,
    /// Left out: no escrow line; `null` is refused.
    #[serde(default, deserialize_with = "not_null")]
    #[schema(nullable = false)]
    pub escrow_above: Option<f64>,
    /// Left out: in force without an end; `null` is refused.
    #[serde(default, deserialize_with = "not_null")]
    #[schema(nullable = false)]
    pub valid_until: Option<i64>,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ContractBody {
    pub context_contract: ContextContract,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ContractList {
    pub context_contracts: Vec<ContextContract>,
}

/// Create a ContextContract.
#[utoipa::path(
    post, path = "/api/governance/context-contracts", tag = "governance",
    request_body = CreateContract,
    responses(
        (status = 201, body = ContractBody),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 413, body = ErrorBody),
        (status = 415, body = ErrorBody), (status = 429, body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn create_contract(
    State(state): State<AppState>,
    principal: Principal,
    JsonBody(body): JsonBody,
) -> Result<(StatusCode, Json<ContractBody>)> {
    principal.require(Scope::Govern)?;
    let input: CreateContract = parse_body(body)?;
    let now = crate::now_ms();
    let contract = ContextContract {
        id: crate::ids::new_id("ctc"),
        name: optional_text("name", input.name.as_deref(), MAX_TEXT)?,
        allowed_actions: text_list("allowedActions", &input.allowed_actions, 1)?,
        required_trust_tier: input.required_trust_tier,
        required_attestation_providers: text_list(
            "requiredAttestationProviders",
            &input.required_attestation_providers,
            0,
        )?,
        required_compliance: text_list("requiredCompliance", &input.required_compliance, 0)?,
        escrow_above: amount("escrowAbove", input.escrow_above)?,
        valid_until: time("validUntil", input.valid_until)?,
        created_at: now,
        created_by: principal.subject.clone(),
    };
    state.store.insert_contract(&principal.workspace_id, &contract).await?;
    Ok((StatusCode::CREATED, Json(ContractBody { context_contract: contract })))
}

/// List ContextContracts, newest first.
#[utoipa::path(
    get, path = "/api/governance/context-contracts", tag = "governance",
    params(("limit" = Option<u32>, Query, description = "Default 100, clamped to 1000")),
    responses(
        (status = 200, body = ContractList),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 429, body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn list_contracts(
    State(state): State<AppState>,
    principal: Principal,
    Query(params): Query<HashMap<String, String>>,
) -> Result<Json<ContractList>> {
    principal.require(Scope::Read)?;
    check_params(&params, &["limit"])?;
    let context_contracts =
        state.store.list_contracts(&principal.workspace_id, limit_of(&params)?).await?;
    Ok(Json(ContractList { context_contracts }))
}

/// One ContextContract.
#[utoipa::path(
    get, path = "/api/governance/context-contracts/{id}", tag = "governance",
    params(("id" = String, Path, description = "`ctc_...`")),
    responses(
        (status = 200, body = ContractBody),
        (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn get_contract(
    State(state): State<AppState>,
    principal: Principal,
    PathId(id): PathId,
) -> Result<Json<ContractBody>> {
    principal.require(Scope::Read)?;
    let contract = state
        .store
        .get_contract(&principal.workspace_id, &id)
        .await?
        .ok_or_else(|| Error::NotFound(format!("context contract {id}")))?;
    Ok(Json(ContractBody { context_contract: contract }))
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;
    use serde_json::json;

    use super::*;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code, reason = "only parsed")]
    struct Outer {
        name: String,
        inner: Option<Inner>,
    }

    #[derive(Debug, Deserialize)]
    #[allow(dead_code, reason = "only parsed")]
    struct Inner {
        amount: f64,
    }

    fn field(body: Value) -> Option<String> {
        match parse_body::<Outer>(body) {
            Err(Error::Validation { field, .. }) => field,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn problems_name_their_field() {
        assert_eq!(field(json!({})).as_deref(), Some("name"));
        assert_eq!(field(json!({"name": "n", "inner": {}})).as_deref(), Some("inner.amount"));
        assert_eq!(field(json!({"name": 1})).as_deref(), Some("name"));
        assert_eq!(field(json!({"name": "n", "extra": 1})).as_deref(), Some("extra"));
        assert_eq!(field(json!([1])), None, "the whole body");
    }

    /// The field a body is refused for, or `None` when it parses.
    fn refused<T: DeserializeOwned>(body: Value) -> Option<String> {
        match parse_body::<T>(body) {
            Err(Error::Validation { field, .. }) => field,
            Err(other) => panic!("{other:?}"),
            Ok(_) => None,
        }
    }

    /// Fields whose absence lifts a limit: a null is refused, naming the
    /// field; the body without the key parses.
    fn null_refused<T: DeserializeOwned>(base: Value, fields: &[&str]) {
        assert_eq!(refused::<T>(base.clone()), None, "{base}");
        for name in fields {
            let mut body = base.clone();
            body[*name] = Value::Null;
            assert_eq!(refused::<T>(body).as_deref(), Some(*name), "{name}: null");
        }
    }

    #[test]
    fn a_null_that_would_lift_a_limit_is_refused() {
        null_refused::<CreateDecision>(json!({"title": "t", "riskLevel": "low"}), &["expiresAt"]);
        null_refused::<CreateGrant>(
            json!({"grantee": "g", "actions": ["a"]}),
            &["maxAmount", "currency", "approvalThreshold", "validFrom", "validUntil"],
        );
        null_refused::<CreateContract>(
            json!({"allowedActions": ["a"]}),
            &["requiredTrustTier", "escrowAbove", "validUntil"],
        );
    }

    /// Fields whose absence is informational or stricter: a null is the
    /// same as leaving the key out.
    #[test]
    fn a_null_that_lifts_nothing_is_absent() {
        let decision: CreateDecision = parse_body(json!({"title": "t", "riskLevel": "low",
            "status": null, "description": null, "owner": null, "traceId": null}))
        .unwrap();
        assert!(decision.status.is_none() && decision.trace_id.is_none());
        let grant: CreateGrant =
            parse_body(json!({"grantee": "g", "actions": ["a"], "description": null})).unwrap();
        assert!(grant.description.is_none());
        let contract: CreateContract =
            parse_body(json!({"allowedActions": ["a"], "name": null})).unwrap();
        assert!(contract.name.is_none());
        let patch: PatchDecision =
            parse_body(json!({"status": "approved", "reason": null})).unwrap();
        assert!(patch.reason.is_none());
        // Lists and flags have no "absent" to fall back on: a null is a
        // wrong type, as before.
        assert_eq!(
            refused::<CreateContract>(json!({"allowedActions": ["a"], "requiredCompliance": null}))
                .as_deref(),
            Some("requiredCompliance")
        );
        assert_eq!(refused::<PatchGrant>(json!({"revoked": null})).as_deref(), Some("revoked"));
    }

    /// The named fields' schema of a request body type.
    fn properties<T: utoipa::PartialSchema>() -> Value {
        serde_json::to_value(T::schema()).unwrap()
    }

    #[test]
    fn the_openapi_schemas_say_which_fields_take_no_null() {
        let cases = [
            (properties::<CreateDecision>(), vec![("expiresAt", "integer")], "description"),
            (
                properties::<CreateGrant>(),
                vec![
                    ("maxAmount", "number"),
                    ("currency", "string"),
                    ("approvalThreshold", "number"),
                    ("validFrom", "integer"),
                    ("validUntil", "integer"),
                ],
                "description",
            ),
            (
                properties::<CreateContract>(),
                vec![
                    ("requiredTrustTier", "string"),
                    ("escrowAbove", "number"),
                    ("validUntil", "integer"),
                ],
                "name",
            ),
        ];
        for (schema, not_null, nullable) in cases {
            for (name, kind) in not_null {
                assert_eq!(schema["properties"][name]["type"], kind, "{name}: {schema}");
                let required = schema["required"].as_array().cloned().unwrap_or_default();
                assert!(!required.contains(&json!(name)), "{name} may be left out: {schema}");
            }
            // A field where null means absent still says so.
            assert_eq!(
                schema["properties"][nullable]["type"],
                json!(["string", "null"]),
                "{nullable}: {schema}"
            );
        }
    }
}
