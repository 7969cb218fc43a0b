//! `POST /api/ingest`: one envelope or `{"batch": [...]}`, all or nothing.

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use opgraph_proto::{Event, TrustTier};
use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;

use super::{AppState, JsonBody};
use crate::auth::{Principal, Scope};
use crate::error::{Error, Result};
use crate::store::{AppendRequest, AppendResult, IdempotencyKey, NewEvent};
use crate::usage::QuotaHold;

/// Most envelopes in one batch.
pub const MAX_BATCH: usize = opgraph_proto::envelope::MAX_BATCH;

#[derive(Debug, Serialize, ToSchema)]
pub struct IngestResponse {
    /// Events in the request (stored now or earlier).
    pub accepted: usize,
    /// The id of each event, in request order.
    pub ids: Vec<String>,
}

/// Record one canonical event, or a batch of up to 1000.
#[utoipa::path(
    post,
    path = "/api/ingest",
    tag = "ingest",
    request_body(content = crate::api::openapi::IngestBody, description = "An event envelope, or `{\"batch\": [envelope, ...]}` (at most 1000)"),
    params(("Idempotency-Key" = Option<String>, Header, description = "Makes a retry within 24 h return the first answer; another body under the same key is a 409")),
    responses(
        (status = 202, description = "Stored durably", body = IngestResponse),
        (status = 400, description = "Invalid JSON or envelope; `field` names the path, e.g. `batch[3].event`", body = crate::error::ErrorBody),
        (status = 401, body = crate::error::ErrorBody), (status = 403, body = crate::error::ErrorBody),
        (status = 409, description = "The Idempotency-Key was used for another request", body = crate::error::ErrorBody),
        (status = 413, body = crate::error::ErrorBody), (status = 415, body = crate::error::ErrorBody),
        (status = 429, body = crate::error::ErrorBody), (status = 503, body = crate::error::ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn ingest(
    State(state): State<AppState>,
    principal: Principal,
    headers: HeaderMap,
    JsonBody(body): JsonBody,
) -> Result<impl IntoResponse> {
    principal.require(Scope::Ingest)?;
    let outcome = accept(&state, &principal, &headers, body).await;
    if let Err(e) = &outcome {
        state.metrics.reject(e.code());
    }
    let response = outcome?;
    Ok((StatusCode::ACCEPTED, axum::Json(response)))
}

async fn accept(
    state: &AppState,
    principal: &Principal,
    headers: &HeaderMap,
    body: Value,
) -> Result<IngestResponse> {
    let idempotency_key = keyed_request(headers, &body)?;
    let now = crate::now_ms();
    let events = parse_body(body, now)?;
    let accepted = events.len();
    let result =
        record(state, &principal.workspace_id, events, idempotency_key, now, "http").await?;
    Ok(IngestResponse { accepted, ids: result.ids })
}

/// The ingest path after validation: ids, the durable append within the quota,
/// metrics. `/api/track` and the scan redirect store their events through
/// it too; `source` labels the ingested-events counter.
pub async fn record(
    state: &AppState,
    workspace_id: &str,
    events: Vec<Event>,
    idempotency_key: Option<IdempotencyKey>,
    received_at: i64,
    source: &str,
) -> Result<AppendResult> {
    // The store applies the quota to what it would add, so that a replay
    // is answered however little is left.
    let want = events.len() as u64;
    let quota = state.usage.hold_quota(state.store.as_ref(), workspace_id, want).await?;
    let new_event_limit = quota.as_ref().map(QuotaHold::limit);
    let request = AppendRequest {
        events: events
            .into_iter()
            .map(|event| NewEvent { id: crate::ids::new_id("evt"), received_at, event })
            .collect(),
        idempotency_key,
        new_event_limit,
    };
    let result = state.store.append_events(workspace_id, request).await?;
    if let Some(quota) = quota {
        quota.stored(result.inserted);
    }
    state.metrics.ingested(source, result.inserted);
    Ok(result)
}

/// The `Idempotency-Key` header, if any, checked.
pub fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>> {
    let Some(value) = headers.get("idempotency-key") else { return Ok(None) };
    let key = opgraph_proto::envelope::idempotency_key(value.as_bytes())
        .map_err(|message| Error::validation("Idempotency-Key", message))?;
    Ok(Some(key.to_owned()))
}

/// The `Idempotency-Key` with the request it names, for the paths that
/// store events (`/api/ingest`, `/api/track`).
pub fn keyed_request(headers: &HeaderMap, body: &Value) -> Result<Option<IdempotencyKey>> {
    Ok(idempotency_key(headers)?.map(|key| IdempotencyKey::new(key, body)))
}

/// Validates a single envelope or a batch (the shared rules of
/// [`opgraph_proto::envelope::parse_body`]) and applies the defaults, so
/// that what is stored is complete.
pub fn parse_body(body: Value, now_ms: i64) -> Result<Vec<Event>> {
    opgraph_proto::envelope::parse_body(body, now_ms)?
        .into_iter()
        .map(|event| finish_envelope(event, now_ms))
        .collect()
}

/// The cloud's own checks on a validated envelope, then its defaults
/// (timestamp = receive time, business `default`, tier `T0`), so that what
/// is stored is complete. Every ingest path (HTTP, gRPC, QUIC) ends here.
pub fn finish_envelope(mut event: Event, received_at: i64) -> Result<Event> {
    opgraph_proto::envelope::check_entity(&event)?;
    event.timestamp.get_or_insert(received_at);
    event.business_id.get_or_insert_with(|| "default".to_owned());
    event.trust_tier.get_or_insert(TrustTier::T0);
    Ok(event)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const NOW: i64 = 1_795_322_085_000;

    fn field_of(body: Value) -> Option<String> {
        match parse_body(body, NOW) {
            Err(Error::Validation { field, .. }) => field,
            other => panic!("expected a validation error, got {other:?}"),
        }
    }

    #[test]
    fn defaults_are_applied() {
        let events = parse_body(json!({"event": "scan"}), NOW).unwrap();
        assert_eq!(events[0].timestamp, Some(NOW));
        assert_eq!(events[0].business_id.as_deref(), Some("default"));
        assert_eq!(events[0].trust_tier, Some(TrustTier::T0));
    }

    #[test]
    fn batch_errors_name_the_index() {
        let body = json!({"batch": [{"event": "a"}, {"event": "b"}, {"event": ""}]});
        assert_eq!(field_of(body).as_deref(), Some("batch[2].event"));
        assert_eq!(field_of(json!({"batch": [1]})).as_deref(), Some("batch[0]"));
    }

    #[test]
    fn batch_shape_is_checked() {
        assert_eq!(field_of(json!({"batch": []})).as_deref(), Some("batch"));
        assert_eq!(field_of(json!({"batch": {}})).as_deref(), Some("batch"));
        let too_many: Vec<Value> = (0..=MAX_BATCH).map(|_| json!({"event": "x"})).collect();
        assert_eq!(field_of(json!({ "batch": too_many })).as_deref(), Some("batch"));
        assert_eq!(
            field_of(json!({"batch": [{"event": "x"}], "event": "y"})).as_deref(),
            Some("event")
        );
    }

    #[test]
    fn entity_needs_type_and_id() {
        let body = json!({"event": "x", "entity": {"type": "store"}});
        assert_eq!(field_of(body).as_deref(), Some("entity.id"));
    }
}
