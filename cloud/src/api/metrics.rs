//! `POST /api/metrics/query` and the metric definitions and snapshots it
//! evaluates and keeps (docs/queries.md).

use std::collections::HashMap;

use axum::Json;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::governance::{MAX_DESCRIPTION, MAX_TEXT, optional_text, parse_body, text};
use super::queries::{DEFAULT_RANGE_MS, MAX_LIMIT, body_limit, optional_name, range_of};
use super::{AppState, JsonBody};
use crate::auth::{Principal, Scope};
use crate::error::{Error, Result};
use crate::intelligence::{DAY_MS, HOUR_MS};
use crate::store::queries::{
    Aggregation, EventTotals, MetricDefinition, MetricSnapshot, Range, SeriesQuery, TotalsQuery,
};

type ErrorBody = crate::error::ErrorBody;

/// A series has at most this many buckets.
const MAX_BUCKETS: i64 = 5000;
/// Definitions evaluated per metrics query.
const MAX_DEFINITIONS_EVALUATED: usize = 50;

#[derive(Debug, Clone, Copy, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Interval {
    Hour,
    Day,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MetricsRequest {
    /// Only this event; default every event.
    pub event_name: Option<String>,
    /// Default: 30 days before `to`.
    pub from: Option<i64>,
    /// Default: now.
    pub to: Option<i64>,
    /// Adds `series` with one bucket per hour or day (UTC), at most 5000.
    pub interval: Option<Interval>,
    /// Event names listed (the most frequent first); default 100, max 1000.
    #[serde(default, deserialize_with = "super::queries::clamped_limit")]
    pub limit: Option<u64>,
    pub business_id: Option<String>,
    /// Keeps each value as a snapshot and returns their ids.
    pub persist_snapshots: Option<bool>,
    /// Count distinct actors per event (default true). Counts and revenue
    /// come from the hourly rollup at any range; distinct actors read every
    /// event of the range in an index, so `false` makes long ranges cheap.
    pub unique_actors: Option<bool>,
}

#[derive(Debug, Serialize, ToSchema, async_graphql::SimpleObject)]
#[serde(rename_all = "camelCase")]
pub struct BucketCount {
    pub bucket: i64,
    pub count: u64,
    pub revenue: f64,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DefinitionValue {
    #[serde(flatten)]
    pub definition: MetricDefinition,
    /// Events of `eventName` in the range.
    pub count: u64,
    /// The aggregation's value over the range.
    pub value: f64,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct MetricsResponse {
    pub from: i64,
    pub to: i64,
    pub metrics: Vec<EventTotals>,
    /// Every event of the range (not only those listed).
    pub total_events: u64,
    pub total_revenue: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub series: Option<Vec<BucketCount>>,
    /// Definitions (of `eventName` when given), evaluated over the range.
    pub definitions: Vec<DefinitionValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub snapshot_ids: Option<Vec<String>>,
}

/// Event counts, distinct actors and revenue per event over a range, an
/// optional series, and the metric definitions' values.
#[utoipa::path(
    post, path = "/api/metrics/query", tag = "queries",
    request_body = MetricsRequest,
    responses(
        (status = 200, body = MetricsResponse),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 429, body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn metrics(
    State(state): State<AppState>,
    principal: Principal,
    JsonBody(body): JsonBody,
) -> Result<Json<MetricsResponse>> {
    principal.require(Scope::Read)?;
    let input: MetricsRequest = parse_body(body)?;
    Ok(Json(metrics_of(&state, &principal.workspace_id, input).await?))
}

/// Answers a metrics request (validated here, field paths as in the body).
pub async fn metrics_of(
    state: &AppState,
    ws: &str,
    input: MetricsRequest,
) -> Result<MetricsResponse> {
    let range = range_of(input.from, input.to, DEFAULT_RANGE_MS, "")?;
    let event = optional_name("eventName", input.event_name.as_deref())?;
    let business = optional_name("businessId", input.business_id.as_deref())?;
    let bucket_ms = input.interval.map(|i| match i {
        Interval::Hour => HOUR_MS,
        Interval::Day => DAY_MS,
    });
    if let Some(bucket) = bucket_ms {
        let first = range.from.div_euclid(bucket);
        let buckets = (range.to - 1).div_euclid(bucket) - first + 1;
        if buckets > MAX_BUCKETS {
            return Err(Error::validation(
                "interval",
                format!("the range has {buckets} buckets of this interval; at most {MAX_BUCKETS}"),
            ));
        }
    }
    let totals = state
        .store
        .event_totals(
            ws,
            &TotalsQuery {
                range: Some(range),
                business_id: business.clone(),
                event: event.clone(),
                unique_actors: input.unique_actors.unwrap_or(true),
                limit: body_limit(input.limit),
            },
        )
        .await?;
    let series = match bucket_ms {
        Some(bucket_ms) => {
            let query = SeriesQuery {
                range,
                business_id: business.clone(),
                event: event.clone(),
                bucket_ms,
                by_event: None,
            };
            let points = state.store.event_series(ws, &query).await?;
            Some(fill_buckets(range, bucket_ms, &points))
        }
        None => None,
    };
    let mut definitions = Vec::new();
    let listed = state.store.list_metric_definitions(ws, MAX_LIMIT as usize).await?;
    for definition in listed
        .into_iter()
        .filter(|d| event.as_ref().is_none_or(|e| &d.event_name == e))
        .take(MAX_DEFINITIONS_EVALUATED)
    {
        let (count, value) =
            state.store.evaluate_metric(ws, &definition, range, business.as_deref()).await?;
        definitions.push(DefinitionValue { definition, count, value });
    }
    let snapshot_ids = if input.persist_snapshots.unwrap_or(false) {
        let now = crate::now_ms();
        let mut snapshots: Vec<MetricSnapshot> = totals
            .events
            .iter()
            .map(|m| MetricSnapshot {
                id: crate::ids::new_id("msnap"),
                definition_id: None,
                event_name: Some(m.event_name.clone()),
                business_id: business.clone(),
                from: range.from,
                to: range.to,
                count: m.count,
                unique_actors: m.unique_actors,
                value: m.count as f64,
                created_at: now,
            })
            .collect();
        snapshots.extend(definitions.iter().map(|d| MetricSnapshot {
            id: crate::ids::new_id("msnap"),
            definition_id: Some(d.definition.id.clone()),
            event_name: Some(d.definition.event_name.clone()),
            business_id: business.clone(),
            from: range.from,
            to: range.to,
            count: d.count,
            unique_actors: None,
            value: d.value,
            created_at: now,
        }));
        state.store.insert_metric_snapshots(ws, &snapshots).await?;
        Some(snapshots.into_iter().map(|s| s.id).collect())
    } else {
        None
    };
    Ok(MetricsResponse {
        from: range.from,
        to: range.to,
        metrics: totals.events,
        total_events: totals.total_events,
        total_revenue: totals.total_revenue,
        series,
        definitions,
        snapshot_ids,
    })
}

/// Every bucket of the range, empty ones as 0.
fn fill_buckets(
    range: Range,
    bucket_ms: i64,
    points: &[crate::store::queries::SeriesPoint],
) -> Vec<BucketCount> {
    let found: HashMap<i64, (u64, f64)> =
        points.iter().map(|p| (p.bucket, (p.count, p.revenue))).collect();
    let mut out = Vec::new();
    if range.to <= range.from {
        return out;
    }
    let mut bucket = range.from.div_euclid(bucket_ms) * bucket_ms;
    while bucket < range.to {
        let (count, revenue) = found.get(&bucket).copied().unwrap_or((0, 0.0));
        out.push(BucketCount { bucket, count, revenue });
        // `range_of` keeps `to` far below i64::MAX; checked all the same,
        // since a wrapped bucket would loop until memory ran out.
        let Some(next) = bucket.checked_add(bucket_ms) else { break };
        bucket = next;
    }
    out
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateMetricDefinition {
    pub name: String,
    pub event_name: String,
    pub aggregation: Aggregation,
    /// Required for `sum`: a property name (letters, digits, `_`, `-`), or
    /// `revenue` for the event's revenue.
    pub property: Option<String>,
    pub description: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct MetricDefinitionBody {
    pub metric_definition: MetricDefinition,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct MetricDefinitionList {
    pub metric_definitions: Vec<MetricDefinition>,
}

/// Create a reusable metric definition.
#[utoipa::path(
    post, path = "/api/metric-definitions", tag = "queries",
    request_body = CreateMetricDefinition,
    responses(
        (status = 201, body = MetricDefinitionBody),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 429, body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn create_definition(
    State(state): State<AppState>,
    principal: Principal,
    JsonBody(body): JsonBody,
) -> Result<(StatusCode, Json<MetricDefinitionBody>)> {
    // A definition changes what every metrics query of the workspace
    // answers, as a tracking plan changes what agents record: both need
    // `govern`, so that a dashboard's read-only key cannot redefine them.
    principal.require(Scope::Govern)?;
    let input: CreateMetricDefinition = parse_body(body)?;
    let property = optional_text("property", input.property.as_deref(), 64)?;
    if let Some(p) = &property
        && !p.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        return Err(Error::validation("property", "letters, digits, `_` and `-` only"));
    }
    if input.aggregation == Aggregation::Sum && property.is_none() {
        return Err(Error::validation("property", "`sum` needs a `property`"));
    }
    let definition = MetricDefinition {
        id: crate::ids::new_id("mdef"),
        name: text("name", &input.name, MAX_TEXT)?,
        event_name: text("eventName", &input.event_name, MAX_TEXT)?,
        aggregation: input.aggregation,
        property,
        description: optional_text("description", input.description.as_deref(), MAX_DESCRIPTION)?,
        created_at: crate::now_ms(),
        created_by: principal.subject.clone(),
    };
    state.store.insert_metric_definition(&principal.workspace_id, &definition).await?;
    Ok((StatusCode::CREATED, Json(MetricDefinitionBody { metric_definition: definition })))
}

/// List metric definitions, newest first.
#[utoipa::path(
    get, path = "/api/metric-definitions", tag = "queries",
    params(("limit" = Option<u32>, Query, description = "Default 100, clamped to 1000")),
    responses(
        (status = 200, body = MetricDefinitionList),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 429, body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn list_definitions(
    State(state): State<AppState>,
    principal: Principal,
    Query(params): Query<HashMap<String, String>>,
) -> Result<Json<MetricDefinitionList>> {
    principal.require(Scope::Read)?;
    super::check_params(&params, &["limit"])?;
    let limit = super::limit_of(&params)?;
    let metric_definitions =
        state.store.list_metric_definitions(&principal.workspace_id, limit).await?;
    Ok(Json(MetricDefinitionList { metric_definitions }))
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct MetricSnapshotList {
    pub metric_snapshots: Vec<MetricSnapshot>,
}

/// List persisted metric snapshots, newest first.
#[utoipa::path(
    get, path = "/api/metric-snapshots", tag = "queries",
    params(("limit" = Option<u32>, Query, description = "Default 100, clamped to 1000")),
    responses(
        (status = 200, body = MetricSnapshotList),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 429, body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn list_snapshots(
    State(state): State<AppState>,
    principal: Principal,
    Query(params): Query<HashMap<String, String>>,
) -> Result<Json<MetricSnapshotList>> {
    principal.require(Scope::Read)?;
    super::check_params(&params, &["limit"])?;
    let limit = super::limit_of(&params)?;
    let metric_snapshots =
        state.store.list_metric_snapshots(&principal.workspace_id, limit).await?;
    Ok(Json(MetricSnapshotList { metric_snapshots }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_filled_with_zeros() {
        let h = HOUR_MS;
        let points = [crate::store::queries::SeriesPoint {
            bucket: 2 * h,
            event_name: None,
            count: 4,
            revenue: 1.0,
        }];
        let filled = fill_buckets(Range { from: h + 5, to: 3 * h + 1 }, h, &points);
        let counts: Vec<(i64, u64)> = filled.iter().map(|b| (b.bucket, b.count)).collect();
        assert_eq!(counts, [(h, 0), (2 * h, 4), (3 * h, 0)]);
    }
}
