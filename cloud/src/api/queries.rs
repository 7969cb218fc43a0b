//! Query endpoints (docs/queries.md): funnels, attribution, the period
//! diff, event search and the graph reads, and the validation they share
//! with [`super::metrics`]. Each validates
//! its body (every problem a 400 naming its field), then asks the store's
//! `QueryStore` part, which computes the answer inside the engine.

use std::collections::HashMap;

use axum::Json;
use axum::extract::{Query, State};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use super::governance::{MAX_TEXT, optional_text, parse_body, text};
use super::{AppState, JsonBody};
use crate::auth::{Principal, Scope};
use crate::error::{Error, Result};
use crate::intelligence::{DAY_MS, PeriodDiff, period_diff};
use crate::store::queries::{
    Attribution, AttributionModel, AttributionQuery, FunnelQuery, Range, SearchQuery, TotalsQuery,
};

type ErrorBody = crate::error::ErrorBody;

const DEFAULT_LIMIT: u64 = 100;
pub const MAX_LIMIT: u64 = 1000;
/// Ranges longer than this are refused (about ten years).
const MAX_SPAN_MS: i64 = 3660 * DAY_MS;
/// Latest time a range may name: the end of the year 9999. Far past any
/// event, and far enough from `i64::MAX` that a bucket past the range's
/// end cannot overflow.
pub const MAX_TIME_MS: i64 = 253_402_300_800_000;
/// Range of queries given no `from`.
pub const DEFAULT_RANGE_MS: i64 = 30 * DAY_MS;
const DEFAULT_FUNNEL_WINDOW_MS: i64 = 7 * DAY_MS;
const MAX_FUNNEL_WINDOW_MS: i64 = 90 * DAY_MS;
const DEFAULT_LOOKBACK_MS: i64 = 30 * DAY_MS;
/// Event types compared by the period diff.
const MAX_EVENT_TYPES: usize = 10_000;

/// `limit` of a body: default 100, clamped to 1000 (negative and
/// non-integer values are refused by deserialization, naming `limit`).
pub fn body_limit(limit: Option<u64>) -> usize {
    usize::try_from(limit.unwrap_or(DEFAULT_LIMIT).min(MAX_LIMIT)).unwrap_or(1000)
}

/// Deserializes a body's `limit`: a non-negative integer, one past
/// `u64::MAX` too (JSON carries it as a float), which [`body_limit`]
/// clamps like any other large one; negative and fractional values are
/// refused.
pub fn clamped_limit<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    struct Limit;
    impl<'de> serde::de::Visitor<'de> for Limit {
        type Value = Option<u64>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a non-negative integer")
        }
        fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Self::Value, E> {
            Ok(Some(v))
        }
        fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Self::Value, E> {
            u64::try_from(v).map(Some).map_err(|_| E::custom("`limit` must not be negative"))
        }
        fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Self::Value, E> {
            // Only integers too large for u64 come as floats.
            if v.fract() == 0.0 && v >= u64::MAX as f64 {
                Ok(Some(u64::MAX))
            } else {
                Err(E::custom("`limit` must be a non-negative integer"))
            }
        }
        fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_none<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_some<S: serde::Deserializer<'de>>(self, d: S) -> Result<Self::Value, S::Error> {
            d.deserialize_any(Limit)
        }
    }
    d.deserialize_option(Limit)
}

/// `[from, to)` from optional bounds: `to` defaults to now (inclusive of
/// this millisecond), `from` to `to - default_span`.
pub fn range_of(
    from: Option<i64>,
    to: Option<i64>,
    default_span: i64,
    field: &str,
) -> Result<Range> {
    let to = to.unwrap_or_else(|| crate::now_ms() + 1);
    // Saturating: any `to` may come from a caller, `i64::MIN` too.
    let from = from.unwrap_or(to.saturating_sub(default_span));
    let name = |f: &str| if field.is_empty() { f.to_owned() } else { format!("{field}.{f}") };
    if from < 0 || to < 0 {
        return Err(Error::validation(name("from"), "times are ms since the epoch, not negative"));
    }
    if to > MAX_TIME_MS {
        return Err(Error::validation(
            name("to"),
            "times are ms since the epoch, up to the year 9999",
        ));
    }
    if from > to {
        return Err(Error::validation(name("from"), "`from` must not be after `to`"));
    }
    if to - from > MAX_SPAN_MS {
        return Err(Error::validation(name("from"), "the range may span at most 3660 days"));
    }
    Ok(Range { from, to })
}

pub fn optional_name(field: &str, value: Option<&str>) -> Result<Option<String>> {
    optional_text(field, value, MAX_TEXT)
}

// ---------------------------------------------------------------------------
// Funnels.

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FunnelStep {
    /// Label; default the event name.
    pub name: Option<String>,
    pub event: String,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FunnelRequest {
    /// 2 to 10 steps, in order.
    pub steps: Vec<FunnelStep>,
    /// First steps at or after this; default 30 days before `to`.
    pub from: Option<i64>,
    /// First steps before this; default now.
    pub to: Option<i64>,
    /// Every step within this long after the first; default 7 days, max 90.
    pub window_ms: Option<i64>,
    pub business_id: Option<String>,
}

#[derive(Debug, Serialize, ToSchema, async_graphql::SimpleObject)]
#[serde(rename_all = "camelCase")]
pub struct FunnelStepResult {
    pub name: String,
    pub event: String,
    /// Actors who reached this step.
    pub count: u64,
    /// `count` / the first step's count (0 when nobody started).
    pub conversion_rate: f64,
    /// Actors lost since the previous step.
    pub drop_off: u64,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct FunnelResponse {
    pub steps: Vec<FunnelStepResult>,
    pub window_ms: i64,
    pub from: i64,
    pub to: i64,
}

/// Actors through ordered steps within a window.
#[utoipa::path(
    post, path = "/api/funnels/query", tag = "queries",
    request_body = FunnelRequest,
    responses(
        (status = 200, body = FunnelResponse),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 429, body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn funnel(
    State(state): State<AppState>,
    principal: Principal,
    JsonBody(body): JsonBody,
) -> Result<Json<FunnelResponse>> {
    principal.require(Scope::Read)?;
    let input: FunnelRequest = parse_body(body)?;
    if !(2..=10).contains(&input.steps.len()) {
        return Err(Error::validation("steps", "a funnel has 2 to 10 steps"));
    }
    let mut steps = Vec::with_capacity(input.steps.len());
    for (i, step) in input.steps.iter().enumerate() {
        let event = text(&format!("steps[{i}].event"), &step.event, MAX_TEXT)?;
        let name = optional_text(&format!("steps[{i}].name"), step.name.as_deref(), MAX_TEXT)?
            .unwrap_or_else(|| event.clone());
        steps.push((name, event));
    }
    let window_ms = input.window_ms.unwrap_or(DEFAULT_FUNNEL_WINDOW_MS);
    if !(1..=MAX_FUNNEL_WINDOW_MS).contains(&window_ms) {
        return Err(Error::validation("windowMs", "`windowMs` must be 1 ms to 90 days"));
    }
    let range = range_of(input.from, input.to, DEFAULT_RANGE_MS, "")?;
    let query = FunnelQuery {
        steps: steps.iter().map(|(_, e)| e.clone()).collect(),
        range,
        window_ms,
        business_id: optional_name("businessId", input.business_id.as_deref())?,
    };
    let counts = state.store.funnel(&principal.workspace_id, &query).await?;
    let first = counts.first().copied().unwrap_or(0);
    let mut previous = first;
    let steps = steps
        .into_iter()
        .zip(counts)
        .map(|((name, event), count)| {
            let result = FunnelStepResult {
                name,
                event,
                count,
                conversion_rate: if first == 0 {
                    0.0
                } else {
                    (count as f64 / first as f64 * 10_000.0).round() / 10_000.0
                },
                drop_off: previous.saturating_sub(count),
            };
            previous = count;
            result
        })
        .collect();
    Ok(Json(FunnelResponse { steps, window_ms, from: range.from, to: range.to }))
}

// ---------------------------------------------------------------------------
// Attribution.

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AttributionRequest {
    /// Default: every event carrying revenue.
    pub conversion_event: Option<String>,
    /// `first_touch`, `last_touch` (default) or `linear`.
    pub model: Option<AttributionModel>,
    /// Conversions at or after this; default 30 days before `to`.
    pub from: Option<i64>,
    pub to: Option<i64>,
    /// Touchpoints count this long before a conversion; default 30 days.
    pub lookback_ms: Option<i64>,
    pub business_id: Option<String>,
    /// Rows per dimension; default 100, max 1000.
    #[serde(default, deserialize_with = "clamped_limit")]
    pub limit: Option<u64>,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AttributionResponse {
    pub model: AttributionModel,
    pub from: i64,
    pub to: i64,
    #[serde(flatten)]
    pub attribution: Attribution,
}

/// Conversions credited to sources, campaigns, channels and entities.
#[utoipa::path(
    post, path = "/api/attribution/query", tag = "queries",
    request_body = AttributionRequest,
    responses(
        (status = 200, body = AttributionResponse),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 429, body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn attribution(
    State(state): State<AppState>,
    principal: Principal,
    JsonBody(body): JsonBody,
) -> Result<Json<AttributionResponse>> {
    principal.require(Scope::Read)?;
    let input: AttributionRequest = parse_body(body)?;
    let lookback_ms = input.lookback_ms.unwrap_or(DEFAULT_LOOKBACK_MS);
    if !(0..=365 * DAY_MS).contains(&lookback_ms) {
        return Err(Error::validation("lookbackMs", "`lookbackMs` must be 0 to 365 days"));
    }
    let model = input.model.unwrap_or(AttributionModel::LastTouch);
    let range = range_of(input.from, input.to, DEFAULT_RANGE_MS, "")?;
    let query = AttributionQuery {
        conversion_event: optional_name("conversionEvent", input.conversion_event.as_deref())?,
        model,
        range,
        lookback_ms,
        business_id: optional_name("businessId", input.business_id.as_deref())?,
        limit: body_limit(input.limit),
    };
    let attribution = state.store.attribution(&principal.workspace_id, &query).await?;
    Ok(Json(AttributionResponse { model, from: range.from, to: range.to, attribution }))
}

// ---------------------------------------------------------------------------
// What's changed.

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Period {
    pub from: i64,
    pub to: i64,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WhatsChangedRequest {
    pub business_id: Option<String>,
    /// Default: the last 7 days.
    pub current: Option<Period>,
    /// Default: as long as `current`, right before it.
    pub previous: Option<Period>,
    /// Event diffs listed; default 100, max 1000.
    #[serde(default, deserialize_with = "clamped_limit")]
    pub limit: Option<u64>,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PeriodTotals {
    pub from: i64,
    pub to: i64,
    pub total_events: u64,
    pub revenue: f64,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct WhatsChangedResponse {
    pub current: PeriodTotals,
    pub previous: PeriodTotals,
    #[serde(flatten)]
    pub diff: PeriodDiff,
}

/// The last 7 days (or `current`) against the period before.
pub async fn compare_periods(
    state: &AppState,
    ws: &str,
    business: Option<String>,
    current: Range,
    previous: Range,
    limit: usize,
) -> Result<WhatsChangedResponse> {
    let totals = |range| TotalsQuery {
        range: Some(range),
        business_id: business.clone(),
        event: None,
        unique_actors: false,
        limit: MAX_EVENT_TYPES,
    };
    let now = state.store.event_totals(ws, &totals(current)).await?;
    let before = state.store.event_totals(ws, &totals(previous)).await?;
    let diff = period_diff(&now, &before, limit);
    let period = |r: Range, t: &crate::store::queries::Totals| PeriodTotals {
        from: r.from,
        to: r.to,
        total_events: t.total_events,
        revenue: t.total_revenue,
    };
    Ok(WhatsChangedResponse {
        current: period(current, &now),
        previous: period(previous, &before),
        diff,
    })
}

/// Period-over-period diff: revenue delta, per-event changes, new and
/// disappeared event types.
#[utoipa::path(
    post, path = "/api/analytics/whats-changed", tag = "queries",
    request_body = WhatsChangedRequest,
    responses(
        (status = 200, body = WhatsChangedResponse),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 429, body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn whats_changed(
    State(state): State<AppState>,
    principal: Principal,
    JsonBody(body): JsonBody,
) -> Result<Json<WhatsChangedResponse>> {
    principal.require(Scope::Read)?;
    let input: WhatsChangedRequest = parse_body(body)?;
    let current = match &input.current {
        Some(p) => range_of(Some(p.from), Some(p.to), 0, "current")?,
        None => range_of(None, None, 7 * DAY_MS, "current")?,
    };
    let previous = match &input.previous {
        Some(p) => range_of(Some(p.from), Some(p.to), 0, "previous")?,
        None => {
            let span = current.to - current.from;
            range_of(Some((current.from - span).max(0)), Some(current.from), 0, "previous")?
        }
    };
    let business = optional_name("businessId", input.business_id.as_deref())?;
    let limit = body_limit(input.limit);
    let answer =
        compare_periods(&state, &principal.workspace_id, business, current, previous, limit)
            .await?;
    Ok(Json(answer))
}

// ---------------------------------------------------------------------------
// Event search.

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SearchRequest {
    /// 1 to 200 characters (no NUL), matched case-insensitively as a
    /// substring of event names, actor and object types and ids, and
    /// property values.
    /// On the embedded store a query shorter than 3 characters is checked
    /// against the newest 100,000 events of the range only
    /// (`totalCapped` then says the count may be higher).
    pub query: String,
    pub from: Option<i64>,
    pub to: Option<i64>,
    /// Only this event name.
    pub event: Option<String>,
    pub business_id: Option<String>,
    /// Default 100, max 1000.
    #[serde(default, deserialize_with = "clamped_limit")]
    pub limit: Option<u64>,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SearchResponse {
    /// Envelopes plus `id` and `receivedAt`, newest first.
    #[schema(value_type = Vec<Object>)]
    pub results: Vec<Value>,
    /// Matches in all, counted up to 10 000.
    pub total: u64,
    /// `total` stopped at 10 000.
    pub total_capped: bool,
}

/// Free-text search over events, newest first.
#[utoipa::path(
    post, path = "/api/analytics/event-search", tag = "queries",
    request_body = SearchRequest,
    responses(
        (status = 200, body = SearchResponse),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 429, body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn event_search(
    State(state): State<AppState>,
    principal: Principal,
    JsonBody(body): JsonBody,
) -> Result<Json<SearchResponse>> {
    principal.require(Scope::Read)?;
    let input: SearchRequest = parse_body(body)?;
    let text = input.query.trim();
    let chars = text.chars().count();
    if !(1..=200).contains(&chars) {
        return Err(Error::validation("query", "`query` must be 1 to 200 characters"));
    }
    // SQLite's full-text query parser stops at a NUL: no store could
    // search for one.
    if text.contains('\0') {
        return Err(Error::validation("query", "`query` must not contain NUL characters"));
    }
    // Search is bounded by `limit`, not by a span: either bound alone is
    // "everything after" or "everything before".
    let range = match (input.from, input.to) {
        (None, None) => None,
        (from, to) => {
            let range = Range { from: from.unwrap_or(0), to: to.unwrap_or(i64::MAX) };
            if range.from < 0 || range.to < 0 {
                return Err(Error::validation(
                    "from",
                    "times are ms since the epoch, not negative",
                ));
            }
            if range.from > range.to {
                return Err(Error::validation("from", "`from` must not be after `to`"));
            }
            Some(range)
        }
    };
    let query = SearchQuery {
        text: text.to_owned(),
        range,
        event: optional_name("event", input.event.as_deref())?,
        business_id: optional_name("businessId", input.business_id.as_deref())?,
        limit: body_limit(input.limit),
    };
    let found = state.store.search_events(&principal.workspace_id, &query).await?;
    Ok(Json(SearchResponse {
        results: found.events.into_iter().map(|e| e.into_json()).collect(),
        total: found.total,
        total_capped: found.total_capped,
    }))
}

// ---------------------------------------------------------------------------
// The graph: entities and relationships.

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct EntityList {
    pub entities: Vec<crate::store::queries::Entity>,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RelationshipList {
    pub relationships: Vec<crate::store::queries::Relationship>,
}

/// Graph entities (upserted from events with `entity`), the most recently
/// seen first.
#[utoipa::path(
    get, path = "/api/entities", tag = "queries",
    params(
        ("type" = Option<String>, Query, description = "Only entities of this type"),
        ("limit" = Option<u32>, Query, description = "Default 100, clamped to 1000"),
    ),
    responses(
        (status = 200, body = EntityList),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 429, body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn list_entities(
    State(state): State<AppState>,
    principal: Principal,
    Query(params): Query<HashMap<String, String>>,
) -> Result<Json<EntityList>> {
    principal.require(Scope::Read)?;
    super::check_params(&params, &["type", "limit"])?;
    let limit = super::limit_of(&params)?;
    let kind = params.get("type").map(String::as_str);
    let entities = state.store.list_entities(&principal.workspace_id, kind, limit).await?;
    Ok(Json(EntityList { entities }))
}

/// Relationships (actor → object, named by the event), the most recently
/// seen first; `entityType` and `entityId` together keep those of one node.
#[utoipa::path(
    get, path = "/api/relationships", tag = "queries",
    params(
        ("entityType" = Option<String>, Query),
        ("entityId" = Option<String>, Query),
        ("limit" = Option<u32>, Query, description = "Default 100, clamped to 1000"),
    ),
    responses(
        (status = 200, body = RelationshipList),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 429, body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn list_relationships(
    State(state): State<AppState>,
    principal: Principal,
    Query(params): Query<HashMap<String, String>>,
) -> Result<Json<RelationshipList>> {
    principal.require(Scope::Read)?;
    super::check_params(&params, &["entityType", "entityId", "limit"])?;
    let limit = super::limit_of(&params)?;
    let node = match (params.get("entityType"), params.get("entityId")) {
        (Some(t), Some(i)) => Some((t.as_str(), i.as_str())),
        (None, None) => None,
        (None, Some(_)) => {
            return Err(Error::validation("entityType", "`entityId` needs `entityType`"));
        }
        (Some(_), None) => {
            return Err(Error::validation("entityId", "`entityType` needs `entityId`"));
        }
    };
    let relationships =
        state.store.list_relationships(&principal.workspace_id, node, limit).await?;
    Ok(Json(RelationshipList { relationships }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_in_bodies_are_clamped_or_refused() {
        let limit = |body: &str| {
            serde_json::from_str::<AttributionRequest>(body).map(|r| body_limit(r.limit))
        };
        assert_eq!(limit("{}").unwrap(), 100);
        assert_eq!(limit(r#"{"limit": null}"#).unwrap(), 100);
        assert_eq!(limit(r#"{"limit": 7}"#).unwrap(), 7);
        assert_eq!(limit(r#"{"limit": 5000}"#).unwrap(), 1000);
        assert_eq!(limit(r#"{"limit": 18446744073709551616}"#).unwrap(), 1000);
        assert_eq!(limit(r#"{"limit": 1e30}"#).unwrap(), 1000);
        for bad in
            [r#"{"limit": -1}"#, r#"{"limit": 1.5}"#, r#"{"limit": "5"}"#, r#"{"limit": -1e30}"#]
        {
            assert!(limit(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn ranges_default_and_refuse_bad_bounds() {
        let r = range_of(Some(10), Some(20), 5, "").unwrap();
        assert_eq!((r.from, r.to), (10, 20));
        let r = range_of(None, Some(100), 30, "").unwrap();
        assert_eq!((r.from, r.to), (70, 100));
        let field = |e: Error| match e {
            Error::Validation { field, .. } => field,
            _ => None,
        };
        assert_eq!(field(range_of(Some(30), Some(20), 5, "").unwrap_err()).unwrap(), "from");
        assert_eq!(
            field(range_of(Some(-1), Some(20), 5, "current").unwrap_err()).unwrap(),
            "current.from"
        );
        assert!(range_of(Some(0), Some(MAX_SPAN_MS + 1), 5, "").is_err());
        // A `to` near i64::MAX would overflow the buckets after it.
        assert_eq!(field(range_of(None, Some(i64::MAX), 5, "").unwrap_err()).unwrap(), "to");
        assert!(range_of(None, Some(MAX_TIME_MS), 5, "").is_ok());
    }

    #[test]
    fn limits_default_and_clamp() {
        assert_eq!(body_limit(None), 100);
        assert_eq!(body_limit(Some(5000)), 1000);
        assert_eq!(body_limit(Some(0)), 0);
    }
}
