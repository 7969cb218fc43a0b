//! The query part of the [`Store`](super::Store) seam: aggregates over
//! events (totals, series, funnels, attribution), search, runs, and the
//! metric definitions and snapshots the metrics endpoint keeps.
//!
//! Every answer is computed inside the engine and comes back aggregated or
//! bounded: no call returns more rows than its `limit` (or, for series, than
//! its buckets), so the HTTP layer never holds raw events beyond a page.
//! Ranges are half-open, `[from, to)`, on event time (`timestamp`), in ms.
//!
//! The semantics a backend must reproduce are pinned by the conformance
//! suite (`store::conformance`) and written down in `docs/queries.md`.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::StoredEvent;
use crate::error::Result;

/// Event time range, `[from, to)`, ms since the epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Range {
    pub from: i64,
    pub to: i64,
}

/// Per-event totals over a range.
#[derive(Debug, Clone, Default)]
pub struct TotalsQuery {
    pub range: Option<Range>,
    pub business_id: Option<String>,
    /// Only this event name.
    pub event: Option<String>,
    /// Also count distinct `actor.id` per event (costs an index scan per
    /// returned event).
    pub unique_actors: bool,
    /// At most this many events, the most frequent first.
    pub limit: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize, ToSchema, async_graphql::SimpleObject)]
#[serde(rename_all = "camelCase")]
pub struct EventTotals {
    pub event_name: String,
    pub count: u64,
    /// Distinct `actor.id`s; absent when not asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unique_actors: Option<u64>,
    /// Sum of `outcome.revenue` (else `attribution.revenue`).
    pub revenue: f64,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Totals {
    /// The most frequent first (ties by name), at most `limit`.
    pub events: Vec<EventTotals>,
    /// Over every event name of the range, not only the listed ones.
    pub total_events: u64,
    pub total_revenue: f64,
}

/// Counts per time bucket.
#[derive(Debug, Clone)]
pub struct SeriesQuery {
    pub range: Range,
    pub business_id: Option<String>,
    pub event: Option<String>,
    /// A whole number of hours (3 600 000 or 86 400 000).
    pub bucket_ms: i64,
    /// One series per event name, for at most this many names (those with
    /// the most events in the range, then by name), instead of one in all:
    /// a workspace may have millions of names.
    pub by_event: Option<usize>,
}

/// One non-empty bucket; buckets with no events are not returned.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SeriesPoint {
    /// Bucket start, ms since the epoch (UTC hours or days).
    pub bucket: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub event_name: Option<String>,
    pub count: u64,
    pub revenue: f64,
}

/// Actors through ordered steps: an actor reaches step `k` when it did
/// steps `1..=k` in this order (each after the previous one), the first in
/// `range` and all within `window_ms` of the first.
#[derive(Debug, Clone)]
pub struct FunnelQuery {
    /// Event names, 2 to 10.
    pub steps: Vec<String>,
    pub range: Range,
    pub window_ms: i64,
    pub business_id: Option<String>,
}

#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema, async_graphql::Enum,
)]
#[serde(rename_all = "snake_case")]
pub enum AttributionModel {
    FirstTouch,
    LastTouch,
    Linear,
}

impl AttributionModel {
    pub const ALL: [&'static str; 3] = ["first_touch", "last_touch", "linear"];
}

/// Credit for conversions: each conversion of an actor is credited to that
/// actor's touchpoints at or before it (within `lookback_ms`), by `model`.
/// A touchpoint is an event with a source, channel or campaign.
#[derive(Debug, Clone)]
pub struct AttributionQuery {
    /// The conversion event; `None`: every event carrying revenue.
    pub conversion_event: Option<String>,
    pub model: AttributionModel,
    pub range: Range,
    pub lookback_ms: i64,
    pub business_id: Option<String>,
    /// Rows per dimension.
    pub limit: usize,
}

/// One key of one dimension.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema, async_graphql::SimpleObject)]
#[serde(rename_all = "camelCase")]
pub struct AttributionRow {
    /// The source, campaign, channel or entity; `(none)` when the credited
    /// touchpoint has none.
    pub key: String,
    /// Touchpoint events with this key in the range.
    pub touchpoints: u64,
    /// Conversions credited (fractional under `linear`).
    pub conversions: f64,
    /// Revenue credited.
    pub revenue: f64,
}

/// The key of a touchpoint that has no value in a dimension.
pub const NO_KEY: &str = "(none)";

/// What every backend folds its touchpoint counts and credits into: one
/// row per key in each dimension (source, campaign, channel, entity).
#[derive(Default)]
pub struct AttributionSums([std::collections::HashMap<String, AttributionRow>; 4]);

impl AttributionSums {
    /// Adds to the row of each of `keys` (source, campaign, channel,
    /// entity).
    pub fn add(&mut self, keys: [&str; 4], touchpoints: u64, conversions: f64, revenue: f64) {
        let credit = |row: &mut AttributionRow| {
            row.touchpoints += touchpoints;
            row.conversions += conversions;
            row.revenue += revenue;
        };
        for (dim, key) in self.0.iter_mut().zip(keys) {
            // Most keys repeat: look up by `&str` before allocating one.
            if let Some(row) = dim.get_mut(key) {
                credit(row);
                continue;
            }
            let mut row = AttributionRow {
                key: key.to_owned(),
                touchpoints: 0,
                conversions: 0.0,
                revenue: 0.0,
            };
            credit(&mut row);
            dim.insert(key.to_owned(), row);
        }
    }

    /// The answer, given the range's conversions, their revenue and how
    /// many of them had a touchpoint; at most `limit` rows per dimension.
    pub fn into_attribution(
        self,
        conversions: u64,
        revenue: f64,
        attributed: u64,
        limit: usize,
    ) -> Attribution {
        let [source, campaign, channel, entity] = self.0.map(|dim| rank(dim, limit));
        Attribution {
            by_source: source,
            by_campaign: campaign,
            by_channel: channel,
            by_entity: entity,
            conversions,
            revenue,
            unattributed: conversions.saturating_sub(attributed),
        }
    }
}

/// One dimension's rows as every backend answers them: sums of fractional
/// shares rounded (so `0.30000000000000004` reads `0.3`), most credited
/// first, then revenue, touchpoints and key, at most `limit`.
fn rank(
    rows: std::collections::HashMap<String, AttributionRow>,
    limit: usize,
) -> Vec<AttributionRow> {
    let mut rows: Vec<AttributionRow> = rows
        .into_values()
        .map(|mut r| {
            r.conversions = (r.conversions * 1e9).round() / 1e9;
            r.revenue = (r.revenue * 1e6).round() / 1e6;
            r
        })
        .collect();
    rows.sort_by(|a, b| {
        b.conversions
            .total_cmp(&a.conversions)
            .then(b.revenue.total_cmp(&a.revenue))
            .then(b.touchpoints.cmp(&a.touchpoints))
            .then(a.key.cmp(&b.key))
    });
    rows.truncate(limit);
    rows
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, ToSchema, async_graphql::SimpleObject)]
#[serde(rename_all = "camelCase")]
pub struct Attribution {
    pub by_source: Vec<AttributionRow>,
    pub by_campaign: Vec<AttributionRow>,
    pub by_channel: Vec<AttributionRow>,
    /// Keyed by the touchpoint's object (`type:id`, or the id alone).
    pub by_entity: Vec<AttributionRow>,
    /// Conversions in the range, credited or not.
    pub conversions: u64,
    pub revenue: f64,
    /// Conversions without any touchpoint in their lookback.
    pub unattributed: u64,
}

/// Free-text search: a case-insensitive substring of the event name, actor
/// or object type or id, or a property value.
#[derive(Debug, Clone)]
pub struct SearchQuery {
    pub text: String,
    pub range: Option<Range>,
    pub event: Option<String>,
    pub business_id: Option<String>,
    pub limit: usize,
}

/// Matches beyond this many are not counted.
pub const SEARCH_COUNT_CAP: u64 = 10_000;

#[derive(Debug, Clone)]
pub struct SearchResult {
    /// Newest first, at most `limit`.
    pub events: Vec<StoredEvent>,
    /// All matches, up to [`SEARCH_COUNT_CAP`].
    pub total: u64,
    /// `total` stopped at the cap.
    pub total_capped: bool,
}

/// Which traced events make up runs (workflow, robot, agent runs).
#[derive(Debug, Clone, Default)]
pub struct RunQuery {
    pub range: Option<Range>,
    pub business_id: Option<String>,
    /// One run: its `traceId`.
    pub trace_id: Option<String>,
    /// Only runs with an event by this `actor.id`.
    pub actor_id: Option<String>,
    pub limit: usize,
}

/// Actor types whose activity `/api/usage` reports as agents. The
/// embedded store keeps a partial index of exactly these, in this order
/// (`events_agent_actors` in `embedded/schema.sql`).
pub const AGENT_TYPES: [&str; 6] =
    ["agent", "ai_agent", "robot", "mcp_server", "cli_workflow", "workflow"];

/// Event-name prefixes whose traced events are runs.
pub const RUN_PREFIXES: [&str; 5] = ["workflow.", "robot.", "agent.", "mission.", "job."];

/// A run: the events of one `traceId` among the run events.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema, async_graphql::SimpleObject)]
#[serde(rename_all = "camelCase")]
pub struct RunSummary {
    pub trace_id: String,
    /// First segment of the first event's name: `workflow`, `robot`, ...
    pub kind: String,
    pub started_at: i64,
    pub updated_at: i64,
    pub events: u64,
    /// The newest event's name; the status comes from it.
    pub last_event: String,
    /// `completed`, `failed` or `running` (see docs/queries.md).
    pub status: String,
    /// The newest event's `actor.id`.
    pub actor_id: Option<String>,
}

/// What an actor did over a range.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema, async_graphql::SimpleObject)]
#[serde(rename_all = "camelCase")]
pub struct ActorActivity {
    pub actor_type: Option<String>,
    pub actor_id: String,
    pub events: u64,
    pub revenue: f64,
    pub first_seen: i64,
    pub last_seen: i64,
}

/// Connector loads per provider since a time.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema, async_graphql::SimpleObject)]
#[serde(rename_all = "camelCase")]
pub struct ConnectorLoad {
    pub provider: String,
    pub syncs: u64,
    pub received: u64,
    pub ingested: u64,
    pub updated: u64,
    pub rejected: u64,
    pub last_sync_at: i64,
}

#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema, async_graphql::Enum,
)]
#[serde(rename_all = "snake_case")]
pub enum Aggregation {
    /// Events of `eventName`.
    Count,
    /// Sum of the numeric property `property` (`revenue`: the event's
    /// revenue).
    Sum,
    /// Distinct `actor.id`s.
    Unique,
}

/// A reusable metric.
#[derive(
    Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema, async_graphql::SimpleObject,
)]
#[serde(rename_all = "camelCase")]
pub struct MetricDefinition {
    /// `mdef_...`
    pub id: String,
    pub name: String,
    pub event_name: String,
    pub aggregation: Aggregation,
    /// Required for `sum`.
    pub property: Option<String>,
    pub description: Option<String>,
    pub created_at: i64,
    pub created_by: String,
}

/// A metric value kept when a query asked for `persistSnapshots`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct MetricSnapshot {
    /// `msnap_...`
    pub id: String,
    /// The definition evaluated, or absent for a plain event count.
    pub definition_id: Option<String>,
    pub event_name: Option<String>,
    pub business_id: Option<String>,
    pub from: i64,
    pub to: i64,
    pub count: u64,
    pub unique_actors: Option<u64>,
    pub value: f64,
    pub created_at: i64,
}

/// A graph node upserted from events that carry `entity`.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Entity {
    #[serde(rename = "type")]
    pub kind: String,
    pub id: String,
    pub name: Option<String>,
    /// The entity's properties, merged over its events (JSON merge patch).
    #[schema(value_type = Object)]
    pub properties: serde_json::Value,
    pub first_seen: i64,
    pub last_seen: i64,
}

/// An edge from an event's actor to its object, named by the event, kept
/// for events that carry `entity`.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema, async_graphql::SimpleObject)]
#[serde(rename_all = "camelCase")]
pub struct Relationship {
    pub from_type: String,
    pub from_id: String,
    /// The event name.
    pub relation: String,
    pub to_type: String,
    pub to_id: String,
    /// Events that made or renewed it.
    pub count: u64,
    pub first_seen: i64,
    pub last_seen: i64,
}

#[async_trait]
pub trait QueryStore: Send + Sync {
    /// Per-event counts and revenue (exact at the range's edges; whole hours
    /// may come from a rollup).
    async fn event_totals(&self, ws: &str, query: &TotalsQuery) -> Result<Totals>;
    /// Non-empty buckets in time order (then by event name).
    async fn event_series(&self, ws: &str, query: &SeriesQuery) -> Result<Vec<SeriesPoint>>;
    /// Actors reaching each step, one count per step.
    async fn funnel(&self, ws: &str, query: &FunnelQuery) -> Result<Vec<u64>>;
    async fn attribution(&self, ws: &str, query: &AttributionQuery) -> Result<Attribution>;
    async fn search_events(&self, ws: &str, query: &SearchQuery) -> Result<SearchResult>;
    /// Runs, the most recently updated first.
    async fn runs(&self, ws: &str, query: &RunQuery) -> Result<Vec<RunSummary>>;
    /// Actors over a range, the most active first; only those whose
    /// `actor.type` is one of `types` when it is not empty, only `actor_id`
    /// when set.
    async fn actor_activity(
        &self,
        ws: &str,
        range: Range,
        types: &[&str],
        actor_id: Option<&str>,
        limit: usize,
    ) -> Result<Vec<ActorActivity>>;
    /// Events of governed execution (`decisionId` set) below trust tier
    /// `T3` and without a `proofId`: newest first.
    async fn proof_gaps(
        &self,
        ws: &str,
        range: Range,
        business_id: Option<&str>,
        limit: usize,
    ) -> Result<Vec<StoredEvent>>;
    async fn connector_loads(
        &self,
        ws: &str,
        since: i64,
        limit: usize,
    ) -> Result<Vec<ConnectorLoad>>;
    async fn business_exists(&self, ws: &str, business_id: &str) -> Result<bool>;
    /// Entities, the most recently seen first; only of `kind` when set.
    async fn list_entities(
        &self,
        ws: &str,
        kind: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Entity>>;
    /// Relationships, the most recently seen first; only those from or to
    /// the node `(type, id)` when set.
    async fn list_relationships(
        &self,
        ws: &str,
        node: Option<(&str, &str)>,
        limit: usize,
    ) -> Result<Vec<Relationship>>;

    async fn insert_metric_definition(&self, ws: &str, definition: &MetricDefinition)
    -> Result<()>;
    /// Newest first.
    async fn list_metric_definitions(
        &self,
        ws: &str,
        limit: usize,
    ) -> Result<Vec<MetricDefinition>>;
    /// The definition's value over a range: `(count of its event, value)`.
    async fn evaluate_metric(
        &self,
        ws: &str,
        definition: &MetricDefinition,
        range: Range,
        business_id: Option<&str>,
    ) -> Result<(u64, f64)>;
    async fn insert_metric_snapshots(&self, ws: &str, snapshots: &[MetricSnapshot]) -> Result<()>;
    /// Newest first.
    async fn list_metric_snapshots(&self, ws: &str, limit: usize) -> Result<Vec<MetricSnapshot>>;
}

/// A run's status from its newest event's name: the last segment
/// `completed`, `succeeded`, `finished` or `done` is `completed`; `failed`,
/// `error`, `errored`, `fault`, `aborted` or `cancelled` is `failed`;
/// anything else is `running`.
pub fn run_status(last_event: &str) -> &'static str {
    match last_event.rsplit('.').next().unwrap_or_default() {
        "completed" | "succeeded" | "finished" | "done" => "completed",
        "failed" | "error" | "errored" | "fault" | "aborted" | "cancelled" => "failed",
        _ => "running",
    }
}
