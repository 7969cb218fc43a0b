//! `GET /api/events`: stored events, newest first.

use std::collections::HashMap;

use axum::Json;
use axum::extract::{Query, State};
use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;

use super::{AppState, parse_ms};
use crate::auth::{Principal, Scope};
use crate::error::{Error, Result};
use crate::store::EventFilter;

#[derive(Debug, Serialize, ToSchema)]
pub struct EventList {
    /// Envelopes with defaults applied, plus `id` and `receivedAt`.
    #[schema(value_type = Vec<Object>)]
    pub events: Vec<Value>,
}

/// List stored events, newest first.
#[utoipa::path(
    get,
    path = "/api/events",
    tag = "events",
    params(
        ("limit" = Option<u32>, Query, description = "Default 100, clamped to 1000"),
        ("event" = Option<String>, Query, description = "Only this event name"),
        ("traceId" = Option<String>, Query),
        ("businessId" = Option<String>, Query),
        ("from" = Option<i64>, Query, description = "Event time at or after, ms"),
        ("to" = Option<i64>, Query, description = "Event time before, ms"),
    ),
    responses(
        (status = 200, body = EventList),
        (status = 400, body = crate::error::ErrorBody), (status = 401, body = crate::error::ErrorBody),
        (status = 403, body = crate::error::ErrorBody), (status = 429, body = crate::error::ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn list(
    State(state): State<AppState>,
    principal: Principal,
    Query(params): Query<HashMap<String, String>>,
) -> Result<Json<EventList>> {
    principal.require(Scope::Read)?;
    const KNOWN: [&str; 6] = ["limit", "event", "traceId", "businessId", "from", "to"];
    super::check_params(&params, &KNOWN)?;
    let filter = EventFilter {
        limit: super::limit_of(&params)?,
        event: params.get("event").cloned(),
        trace_id: params.get("traceId").cloned(),
        business_id: params.get("businessId").cloned(),
        from: parse_ms("from", params.get("from").map(String::as_str))?,
        to: parse_ms("to", params.get("to").map(String::as_str))?,
    };
    if let (Some(from), Some(to)) = (filter.from, filter.to)
        && from > to
    {
        return Err(Error::validation("from", "`from` must not be after `to`"));
    }
    let events = state.store.list_events(&principal.workspace_id, &filter).await?;
    Ok(Json(EventList { events: events.into_iter().map(|e| e.into_json()).collect() }))
}
