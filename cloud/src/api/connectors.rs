//! `POST /api/connectors/ingest`: provider records to events, deduplicated
//! by `(provider, record id)` with update semantics.
//!
//! Each record is mapped ([`crate::connectors`]) and then validated exactly
//! like an `/api/ingest` envelope; a record failing either is reported by
//! index and the rest are stored. The store upserts: a record seen before
//! replaces its event under the same id, so queries count it once. Every
//! call leaves a sync record, for usage and business health.

use axum::Json;
use axum::extract::State;
use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;

use super::ingest::parse_body;
use super::{AppState, JsonBody, optional_str};
use crate::auth::{Principal, Scope};
use crate::connectors::{check_provider, map_record};
use crate::error::{Error, Result};
use crate::store::NewEvent;
use crate::store::connectors::{ConnectorRecord, SyncRecord};

/// Most records in one call.
pub const MAX_RECORDS: usize = 1000;
/// Longest record id (composite ids of metrics rows included).
const MAX_RECORD_ID_LEN: usize = 256;

/// Body of `POST /api/connectors/ingest` (for the document; unknown fields
/// are a 400).
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConnectorIngestBody {
    /// `shopify`, `woocommerce`, `stripe`, `salesforce`, `hubspot`,
    /// `quickbooks`, `google_ads`, `meta_ads`, or any other name (1 to 64 of
    /// `a-z 0-9 _ -`) for generic `{provider}.record` events.
    pub provider: String,
    /// 1 to 1000 provider-native records, as the provider's API returns
    /// them (docs/connectors.md).
    #[schema(value_type = Vec<Object>)]
    pub records: Vec<Value>,
    /// Business the events belong to; default `default`.
    pub business_id: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct RejectedRecord {
    /// Index of the record in `records`.
    pub index: usize,
    /// Why it was refused (mapping or envelope validation).
    pub error: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ConnectorIngestResponse {
    pub provider: String,
    /// Records new to the workspace.
    pub ingested: u64,
    /// Records seen before, whose event was replaced (same id).
    pub updated: u64,
    /// The event id of each accepted record, in request order.
    pub ids: Vec<String>,
    pub rejected: Vec<RejectedRecord>,
}

/// Normalize provider records into events.
#[utoipa::path(
    post,
    path = "/api/connectors/ingest",
    tag = "connectors",
    request_body = ConnectorIngestBody,
    responses(
        (status = 200, description = "Stored; refused records are listed by index", body = ConnectorIngestResponse),
        (status = 400, description = "Bad `provider`, `records` not an array of 1 to 1000, bad `businessId`, unknown field", body = crate::error::ErrorBody),
        (status = 401, body = crate::error::ErrorBody), (status = 403, body = crate::error::ErrorBody),
        (status = 413, body = crate::error::ErrorBody), (status = 415, body = crate::error::ErrorBody),
        (status = 429, body = crate::error::ErrorBody), (status = 503, body = crate::error::ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn ingest(
    State(state): State<AppState>,
    principal: Principal,
    JsonBody(body): JsonBody,
) -> Result<Json<ConnectorIngestResponse>> {
    principal.require(Scope::Ingest)?;
    let object = super::object_body(&body)?;
    if let Some(key) =
        object.keys().find(|k| !["provider", "records", "businessId"].contains(&k.as_str()))
    {
        return Err(Error::validation(key.as_str(), format!("unknown field `{key}`")));
    }
    let provider = optional_str(&body, "provider")?
        .ok_or_else(|| Error::validation("provider", "`provider` is required"))?;
    check_provider(provider).map_err(|why| Error::validation("provider", why))?;
    let records = match object.get("records") {
        Some(Value::Array(records)) if (1..=MAX_RECORDS).contains(&records.len()) => records,
        _ => {
            return Err(Error::validation(
                "records",
                format!("`records` must be an array of 1 to {MAX_RECORDS} objects"),
            ));
        }
    };
    let business_id = optional_str(&body, "businessId")?.unwrap_or("default");
    let business_len = business_id.chars().count();
    if business_len == 0 || business_len > opgraph_proto::validate::MAX_ID_LEN {
        return Err(Error::validation("businessId", "`businessId` must be 1 to 200 characters"));
    }

    let now = crate::now_ms();
    let mut accepted = Vec::with_capacity(records.len());
    let mut rejected = Vec::new();
    for (index, record) in records.iter().enumerate() {
        match to_event(provider, business_id, record, now) {
            Ok(record) => accepted.push(record),
            Err(error) => rejected.push(RejectedRecord { index, error }),
        }
    }
    // The store applies the quota to new events only: a re-sync of known
    // records is an update and passes however little is left.
    let want = accepted.len() as u64;
    let quota = state.usage.hold_quota(state.store.as_ref(), &principal.workspace_id, want).await?;
    let new_event_limit = quota.as_ref().map(crate::usage::QuotaHold::limit);
    let sync = SyncRecord {
        id: crate::ids::new_id("syn"),
        provider: provider.to_owned(),
        business_id: business_id.to_owned(),
        received: records.len() as u64,
        ingested: 0,
        updated: 0,
        rejected: rejected.len() as u64,
        created_at: now,
    };
    let stored = state
        .store
        .upsert_connector_records(&principal.workspace_id, accepted, sync, new_event_limit)
        .await?;
    let ingested = usize::try_from(stored.ingested).unwrap_or(usize::MAX);
    if let Some(quota) = quota {
        quota.stored(ingested);
    }
    state.metrics.ingested("connector", ingested);
    Ok(Json(ConnectorIngestResponse {
        provider: provider.to_owned(),
        ingested: stored.ingested,
        updated: stored.updated,
        ids: stored.ids,
        rejected,
    }))
}

/// One record to its event, or the reason it is refused.
fn to_event(
    provider: &str,
    business_id: &str,
    record: &Value,
    now: i64,
) -> Result<ConnectorRecord, String> {
    let mapped = map_record(provider, record)?;
    if mapped.record_id.chars().count() > MAX_RECORD_ID_LEN {
        return Err(format!("the record id is longer than {MAX_RECORD_ID_LEN} characters"));
    }
    let mut envelope = mapped.envelope;
    if let Value::Object(map) = &mut envelope {
        map.insert("businessId".into(), Value::String(business_id.to_owned()));
    }
    let mut events = parse_body(envelope, now).map_err(|e| match e {
        Error::Validation { field: Some(field), message } if !field.is_empty() => {
            format!("{field}: {message}")
        }
        other => other.to_string(),
    })?;
    let event = events.pop().ok_or("the record produced no event")?;
    Ok(ConnectorRecord {
        record_id: mapped.record_id,
        event: NewEvent { id: crate::ids::new_id("evt"), received_at: now, event },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const NOW: i64 = 1_795_322_085_000;

    #[test]
    fn each_known_provider_is_mapped_not_generic() {
        // The smallest record each mapping accepts, checked for its event
        // name so that no provider silently falls back to the generic one.
        let cases = [
            (
                "shopify",
                json!({"id": 1, "total_price": "1.00", "currency": "USD"}),
                "order.created",
            ),
            (
                "woocommerce",
                json!({"id": 1, "total": "1.00", "status": "completed"}),
                "order.created",
            ),
            (
                "stripe",
                json!({"id": "ch_1", "object": "charge", "amount": 100, "currency": "usd",
                "status": "succeeded"}),
                "payment.succeeded",
            ),
            ("salesforce", json!({"attributes": {"type": "Lead"}, "Id": "00Q1"}), "lead.created"),
            ("hubspot", json!({"id": "1", "properties": {"dealname": "d"}}), "deal.updated"),
            (
                "quickbooks",
                json!({"Invoice": {"Id": "1", "TotalAmt": 1.0, "Line": [], "Balance": 1.0}}),
                "invoice.created",
            ),
            (
                "google_ads",
                json!({"customer": {"id": "1"}, "campaign": {"id": "2"}, "metrics": {},
                "segments": {"date": "2026-11-01"}}),
                "ad.spend",
            ),
            (
                "meta_ads",
                json!({"account_id": "1", "campaign_id": "2", "date_start": "2026-11-01"}),
                "ad.spend",
            ),
            ("acme", json!({"id": 1}), "acme.record"),
        ];
        assert_eq!(cases.len(), crate::connectors::KNOWN_PROVIDERS.len() + 1);
        for (provider, record, event) in cases {
            let mapped = to_event(provider, "default", &record, NOW)
                .unwrap_or_else(|e| panic!("{provider}: {e}"));
            assert_eq!(mapped.event.event.event, event, "{provider}");
            assert_eq!(mapped.event.event.business_id.as_deref(), Some("default"));
        }
    }

    #[test]
    fn validation_failures_name_the_field() {
        let old = json!({"id": 1, "created_at": "1990-01-01T00:00:00Z"});
        let error = to_event("acme", "default", &old, NOW).unwrap_err();
        assert!(error.starts_with("timestamp:"), "{error}");
        let long = json!({"id": "x".repeat(300)});
        assert!(to_event("acme", "default", &long, NOW).unwrap_err().contains("record id"));
    }
}
