//! `POST /api/graphql`: a GraphQL server (async-graphql) over the same
//! store calls as the REST endpoints, with the twelve root fields of the
//! spec (2.5): `events`, `trackingPlans`, `metricDefinitions`, `metrics`,
//! `funnel`, `attribution`, `businessHealth`, `agentPerformance`,
//! `workflowStatus`, `decisionObjects`, `enforcementReceipts`,
//! `proofTrails`; and the graph's `entities` and `relationships`.
//!
//! The credential is checked before GraphQL runs (401/403 in the API's
//! error shape); everything after is GraphQL: variables, introspection,
//! and errors as `{"data", "errors"}` with status 200, each error carrying
//! `extensions.code`: the API's code for a resolver's error (and
//! `extensions.field` for a bad argument), `invalid_query` for a document
//! that does not parse or validate (an unknown field, a variable of the
//! wrong type).

mod types;

use std::sync::OnceLock;

use async_graphql::{Context, EmptyMutation, EmptySubscription, ErrorExtensions, Object, Schema};
use axum::Json;
use axum::extract::State;
use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;

use super::intelligence::health_of;
use super::metrics::{Interval, MetricsRequest, metrics_of};
use super::queries::range_of;
use super::{AppState, JsonBody};
use crate::auth::{Principal, Scope};
use crate::error::Error;
use crate::governance::DecisionStatus;
use crate::intelligence::DAY_MS;
use crate::store::EventFilter;
use crate::store::governance::ReceiptFilter;
use crate::store::queries::{
    Attribution, AttributionModel, AttributionQuery, FunnelQuery, MetricDefinition, Range,
    Relationship, RunQuery,
};
use types::{
    AgentPerformance, Bucket, BusinessHealth, DecisionObject, EnforcementReceipt, Event, Funnel,
    FunnelStep, FunnelStepInput, GraphEntity, HealthAlert, MetricValue, Metrics, ProofTrail,
    TrackingPlan, WorkflowStatus,
};

type ErrorBody = crate::error::ErrorBody;
type GqlResult<T> = async_graphql::Result<T>;

pub type ApiSchema = Schema<QueryRoot, EmptyMutation, EmptySubscription>;

/// The schema, built once: it holds no state (each request carries its
/// workspace and the app state as data).
pub fn schema() -> &'static ApiSchema {
    static SCHEMA: OnceLock<ApiSchema> = OnceLock::new();
    SCHEMA.get_or_init(|| {
        Schema::build(QueryRoot, EmptyMutation, EmptySubscription)
            .limit_depth(12)
            .limit_complexity(MAX_COMPLEXITY)
            .finish()
    })
}

/// The most a query may cost. A field costs 1, a list its rows (`limit`,
/// default 100) times its selection, an aggregate [`AGGREGATE`] more:
/// aliases cannot make one request read and send millions of rows, or run
/// thousands of aggregations, which a rate limit per request would not
/// see.
const MAX_COMPLEXITY: usize = 100_000;
/// What a root field that aggregates over a range of events (metrics,
/// funnel, attribution, ...) costs besides its selection: ten fit in a
/// query.
const AGGREGATE: usize = 10_000;

/// The rows a list field returns at most: its [`limit`] (none when the
/// argument is refused).
fn rows(limit: Option<i32>) -> usize {
    self::limit(limit).unwrap_or(0)
}

/// What a resolver reaches: the app and the caller's workspace.
struct Caller {
    state: AppState,
    workspace_id: String,
}

fn caller<'a>(ctx: &'a Context<'_>) -> GqlResult<&'a Caller> {
    ctx.data::<Caller>()
}

/// The API error as a GraphQL error: same message and code, the field in
/// `extensions.field`; internal causes are logged, never returned.
fn gql(e: Error) -> async_graphql::Error {
    let code = e.code();
    let (message, field) = match &e {
        Error::Internal(cause) => {
            tracing::error!(%cause, "internal error in a GraphQL resolver");
            ("internal error".to_owned(), None)
        }
        Error::Validation { field, message } => (message.clone(), field.clone()),
        other => (other.to_string(), None),
    };
    async_graphql::Error::new(message).extend_with(|_, ext| {
        ext.set("code", code);
        if let Some(field) = &field {
            ext.set("field", field.as_str());
        }
    })
}

/// `limit` of a list field: default 100, clamped to 1000, negative refused.
fn limit(value: Option<i32>) -> GqlResult<usize> {
    match value {
        None => Ok(100),
        Some(n) if n < 0 => {
            Err(gql(Error::validation("limit", "`limit` must be a non-negative integer")))
        }
        Some(n) => Ok(usize::try_from(n).unwrap_or(0).min(1000)),
    }
}

fn range(from: Option<i64>, to: Option<i64>) -> GqlResult<Range> {
    range_of(from, to, 30 * DAY_MS, "").map_err(gql)
}

/// The snake_case name serde gives an enum value.
fn wire_name<T: Serialize>(value: &T) -> String {
    serde_json::to_value(value).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default()
}

// ---------------------------------------------------------------------------
// The root.

pub struct QueryRoot;

#[Object]
impl QueryRoot {
    /// Recent events, newest first.
    #[allow(clippy::too_many_arguments)]
    #[graphql(complexity = "rows(limit).saturating_mul(child_complexity)")]
    async fn events(
        &self,
        ctx: &Context<'_>,
        limit: Option<i32>,
        trace_id: Option<String>,
        event: Option<String>,
        business_id: Option<String>,
        from: Option<i64>,
        to: Option<i64>,
    ) -> GqlResult<Vec<Event>> {
        let c = caller(ctx)?;
        let filter =
            EventFilter { limit: self::limit(limit)?, event, trace_id, business_id, from, to };
        let events = c.state.store.list_events(&c.workspace_id, &filter).await.map_err(gql)?;
        Ok(events.into_iter().map(|e| Event(e.into_json())).collect())
    }

    /// Persisted tracking plans, newest first.
    #[graphql(complexity = "rows(limit).saturating_mul(child_complexity)")]
    async fn tracking_plans(
        &self,
        ctx: &Context<'_>,
        limit: Option<i32>,
    ) -> GqlResult<Vec<TrackingPlan>> {
        let c = caller(ctx)?;
        let plans = c
            .state
            .store
            .list_tracking_plans(&c.workspace_id, self::limit(limit)?)
            .await
            .map_err(gql)?;
        Ok(plans
            .into_iter()
            .map(|p| TrackingPlan {
                id: p.id,
                name: p.name,
                vertical: p.vertical,
                description: p.description,
                events: async_graphql::Json(p.events),
                created_at: p.created_at,
            })
            .collect())
    }

    /// Reusable metric definitions, newest first.
    #[graphql(complexity = "rows(limit).saturating_mul(child_complexity)")]
    async fn metric_definitions(
        &self,
        ctx: &Context<'_>,
        limit: Option<i32>,
    ) -> GqlResult<Vec<MetricDefinition>> {
        let c = caller(ctx)?;
        c.state
            .store
            .list_metric_definitions(&c.workspace_id, self::limit(limit)?)
            .await
            .map_err(gql)
    }

    /// Event counts, distinct actors and revenue per event, the total, an
    /// optional series (`interval`: `hour` or `day`) and the definitions'
    /// values; as `POST /api/metrics/query` without snapshots.
    #[allow(clippy::too_many_arguments)]
    #[graphql(complexity = "AGGREGATE + rows(limit).saturating_mul(child_complexity)")]
    async fn metrics(
        &self,
        ctx: &Context<'_>,
        event_name: Option<String>,
        from: Option<i64>,
        to: Option<i64>,
        interval: Option<String>,
        business_id: Option<String>,
        limit: Option<i32>,
    ) -> GqlResult<Metrics> {
        let c = caller(ctx)?;
        let interval = match interval.as_deref() {
            None => None,
            Some("hour") => Some(Interval::Hour),
            Some("day") => Some(Interval::Day),
            Some(_) => {
                return Err(gql(Error::validation("interval", "`interval` is `hour` or `day`")));
            }
        };
        let request = MetricsRequest {
            event_name,
            from,
            to,
            interval,
            limit: Some(self::limit(limit)? as u64),
            business_id,
            persist_snapshots: Some(false),
            // Distinct actors cost an index scan per event: only when asked.
            unique_actors: Some(ctx.look_ahead().field("metrics").field("uniqueActors").exists()),
        };
        let m = metrics_of(&c.state, &c.workspace_id, request).await.map_err(gql)?;
        Ok(Metrics {
            from: m.from,
            to: m.to,
            metrics: m.metrics,
            total_events: m.total_events,
            total_revenue: m.total_revenue,
            series: m.series.map(|s| {
                s.into_iter()
                    .map(|b| Bucket { bucket: b.bucket, count: b.count, revenue: b.revenue })
                    .collect()
            }),
            definitions: m
                .definitions
                .into_iter()
                .map(|d| MetricValue { definition: d.definition, count: d.count, value: d.value })
                .collect(),
        })
    }

    /// Actors through ordered steps (2 to 10) within `windowMs` (default 7
    /// days); as `POST /api/funnels/query`.
    #[graphql(complexity = "AGGREGATE + child_complexity")]
    async fn funnel(
        &self,
        ctx: &Context<'_>,
        steps: Vec<FunnelStepInput>,
        from: Option<i64>,
        to: Option<i64>,
        window_ms: Option<i64>,
        business_id: Option<String>,
    ) -> GqlResult<Funnel> {
        let c = caller(ctx)?;
        if !(2..=10).contains(&steps.len()) {
            return Err(gql(Error::validation("steps", "a funnel has 2 to 10 steps")));
        }
        for (i, s) in steps.iter().enumerate() {
            if s.event.trim().is_empty() {
                return Err(gql(Error::validation(
                    format!("steps[{i}].event"),
                    "a step needs an event name",
                )));
            }
        }
        let window_ms = window_ms.unwrap_or(7 * DAY_MS);
        if !(1..=90 * DAY_MS).contains(&window_ms) {
            return Err(gql(Error::validation("windowMs", "`windowMs` must be 1 ms to 90 days")));
        }
        let range = range(from, to)?;
        let query = FunnelQuery {
            steps: steps.iter().map(|s| s.event.trim().to_owned()).collect(),
            range,
            window_ms,
            business_id,
        };
        let counts = c.state.store.funnel(&c.workspace_id, &query).await.map_err(gql)?;
        let first = counts.first().copied().unwrap_or(0);
        let mut previous = first;
        let steps = steps
            .into_iter()
            .zip(counts)
            .map(|(s, count)| {
                let event = s.event.trim().to_owned();
                let step = FunnelStep {
                    name: s.name.unwrap_or_else(|| event.clone()),
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
                step
            })
            .collect();
        Ok(Funnel { steps, window_ms, from: range.from, to: range.to })
    }

    /// Conversions credited to sources, campaigns, channels and entities
    /// (default model `LAST_TOUCH`); as `POST /api/attribution/query`.
    #[allow(clippy::too_many_arguments)]
    #[graphql(complexity = "AGGREGATE + rows(limit).saturating_mul(child_complexity)")]
    async fn attribution(
        &self,
        ctx: &Context<'_>,
        model: Option<AttributionModel>,
        conversion_event: Option<String>,
        from: Option<i64>,
        to: Option<i64>,
        lookback_ms: Option<i64>,
        business_id: Option<String>,
        limit: Option<i32>,
    ) -> GqlResult<Attribution> {
        let c = caller(ctx)?;
        let lookback_ms = lookback_ms.unwrap_or(30 * DAY_MS);
        if !(0..=365 * DAY_MS).contains(&lookback_ms) {
            return Err(gql(Error::validation("lookbackMs", "`lookbackMs` must be 0 to 365 days")));
        }
        let query = AttributionQuery {
            conversion_event,
            model: model.unwrap_or(AttributionModel::LastTouch),
            range: range(from, to)?,
            lookback_ms,
            business_id,
            limit: self::limit(limit)?,
        };
        c.state.store.attribution(&c.workspace_id, &query).await.map_err(gql)
    }

    /// Operating health of a business (default `default`); as
    /// `GET /api/businesses/{id}/health`.
    #[graphql(complexity = "AGGREGATE + rows(limit).saturating_mul(child_complexity)")]
    async fn business_health(
        &self,
        ctx: &Context<'_>,
        business_id: Option<String>,
        limit: Option<i32>,
    ) -> GqlResult<BusinessHealth> {
        let c = caller(ctx)?;
        let id = business_id.unwrap_or_else(|| "default".to_owned());
        let h = health_of(&c.state, &c.workspace_id, id, self::limit(limit)?).await.map_err(gql)?;
        Ok(BusinessHealth {
            business_id: h.business_id,
            health_score: h.health_score,
            health_components: h.health_components,
            revenue: h.revenue,
            scans: h.scans,
            leads: h.leads,
            orders: h.orders,
            metrics: h.metrics,
            attribution: h.attribution,
            alerts: h
                .alerts
                .into_iter()
                .map(|a| HealthAlert {
                    kind: a.kind.to_owned(),
                    severity: a.severity.to_owned(),
                    message: a.message,
                    at: a.at,
                })
                .collect(),
            workflows: h.workflows,
            next_actions: h.next_actions,
            recent: h.recent_events,
        })
    }

    /// What an agent (or robot) did: its events (by `actor.id`) and the
    /// runs it took part in, over a range (default 30 days).
    #[graphql(complexity = "AGGREGATE + rows(limit).saturating_mul(child_complexity)")]
    async fn agent_performance(
        &self,
        ctx: &Context<'_>,
        agent_id: String,
        from: Option<i64>,
        to: Option<i64>,
        limit: Option<i32>,
    ) -> GqlResult<AgentPerformance> {
        let c = caller(ctx)?;
        let range = range(from, to)?;
        let store = &c.state.store;
        let activity = store
            .actor_activity(&c.workspace_id, range, &[], Some(&agent_id), 10)
            .await
            .map_err(gql)?;
        let query = RunQuery {
            range: Some(range),
            actor_id: Some(agent_id.clone()),
            limit: 1000,
            ..Default::default()
        };
        let runs = store.runs(&c.workspace_id, &query).await.map_err(gql)?;
        let count = |status: &str| runs.iter().filter(|r| r.status == status).count() as u64;
        let (completed, failed, running) = (count("completed"), count("failed"), count("running"));
        let latest = activity.iter().max_by_key(|a| a.last_seen);
        let mut recent_runs = runs.clone();
        recent_runs.truncate(self::limit(limit)?);
        Ok(AgentPerformance {
            agent_type: latest.and_then(|a| a.actor_type.clone()),
            events: activity.iter().map(|a| a.events).sum(),
            revenue: activity.iter().map(|a| a.revenue).sum(),
            first_seen: activity.iter().map(|a| a.first_seen).min(),
            last_seen: activity.iter().map(|a| a.last_seen).max(),
            runs: runs.len() as u64,
            completed_runs: completed,
            failed_runs: failed,
            running_runs: running,
            success_rate: (completed + failed > 0)
                .then(|| completed as f64 / (completed + failed) as f64),
            recent_runs,
            agent_id,
        })
    }

    /// The state of one workflow run (its `traceId`), from its run events;
    /// `null` when there are none.
    #[graphql(complexity = "AGGREGATE + child_complexity")]
    async fn workflow_status(
        &self,
        ctx: &Context<'_>,
        workflow_id: String,
    ) -> GqlResult<Option<WorkflowStatus>> {
        let c = caller(ctx)?;
        let store = &c.state.store;
        let query =
            RunQuery { trace_id: Some(workflow_id.clone()), limit: 1, ..Default::default() };
        let Some(run) = store.runs(&c.workspace_id, &query).await.map_err(gql)?.into_iter().next()
        else {
            return Ok(None);
        };
        let filter =
            EventFilter { limit: 1000, trace_id: Some(workflow_id.clone()), ..Default::default() };
        let mut timeline: Vec<Event> = store
            .list_events(&c.workspace_id, &filter)
            .await
            .map_err(gql)?
            .into_iter()
            .map(|e| Event(e.into_json()))
            .collect();
        timeline.reverse();
        Ok(Some(WorkflowStatus {
            workflow_id,
            status: run.status,
            kind: run.kind,
            started_at: run.started_at,
            updated_at: run.updated_at,
            events: run.events,
            last_event: run.last_event,
            actor_id: run.actor_id,
            timeline,
        }))
    }

    /// Governance DecisionObjects, newest first; `status` filters
    /// (`draft`, `pending_approval`, `approved`, ...).
    #[graphql(complexity = "rows(limit).saturating_mul(child_complexity)")]
    async fn decision_objects(
        &self,
        ctx: &Context<'_>,
        status: Option<String>,
        limit: Option<i32>,
    ) -> GqlResult<Vec<DecisionObject>> {
        let c = caller(ctx)?;
        let status = match status {
            None => None,
            Some(s) => {
                Some(DecisionStatus::ALL.into_iter().find(|d| wire_name(d) == s).ok_or_else(
                    || gql(Error::validation("status", format!("unknown decision status `{s}`"))),
                )?)
            }
        };
        let decisions = c
            .state
            .store
            .list_decisions(&c.workspace_id, status, self::limit(limit)?)
            .await
            .map_err(gql)?;
        Ok(decisions
            .into_iter()
            .map(|d| DecisionObject {
                status: wire_name(&d.status),
                risk_level: wire_name(&d.risk_level),
                id: d.id,
                title: d.title,
                description: d.description,
                owner: d.owner,
                trace_id: d.trace_id,
                expires_at: d.expires_at,
                created_at: d.created_at,
                updated_at: d.updated_at,
            })
            .collect())
    }

    /// Enforcement receipts, newest first; `traceId` filters.
    #[graphql(complexity = "rows(limit).saturating_mul(child_complexity)")]
    async fn enforcement_receipts(
        &self,
        ctx: &Context<'_>,
        trace_id: Option<String>,
        limit: Option<i32>,
    ) -> GqlResult<Vec<EnforcementReceipt>> {
        let c = caller(ctx)?;
        let filter = ReceiptFilter { limit: self::limit(limit)?, trace_id, ..Default::default() };
        let rows = c.state.store.list_receipts(&c.workspace_id, &filter).await.map_err(gql)?;
        rows.into_iter()
            .map(|r| {
                let receipt: Value =
                    serde_json::from_str(&r.body).map_err(|e| gql(Error::internal(e)))?;
                Ok(EnforcementReceipt {
                    id: r.id,
                    outcome: r.outcome,
                    writer: r.writer,
                    sequence: r.sequence,
                    prev_hash: r.prev_hash,
                    content_hash: r.content_hash,
                    created_at: r.created_at,
                    trace_id: r.trace_id,
                    decision_object_id: r.decision_id,
                    receipt: async_graphql::Json(receipt),
                })
            })
            .collect()
    }

    /// Graph entities, the most recently seen first (beyond spec 2.5).
    #[graphql(complexity = "rows(limit).saturating_mul(child_complexity)")]
    async fn entities(
        &self,
        ctx: &Context<'_>,
        #[graphql(name = "type")] kind: Option<String>,
        limit: Option<i32>,
    ) -> GqlResult<Vec<GraphEntity>> {
        let c = caller(ctx)?;
        let entities = c
            .state
            .store
            .list_entities(&c.workspace_id, kind.as_deref(), self::limit(limit)?)
            .await
            .map_err(gql)?;
        Ok(entities
            .into_iter()
            .map(|e| GraphEntity {
                kind: e.kind,
                id: e.id,
                name: e.name,
                properties: async_graphql::Json(e.properties),
                first_seen: e.first_seen,
                last_seen: e.last_seen,
            })
            .collect())
    }

    /// Relationships, the most recently seen first; of one node when
    /// `entityType` and `entityId` are given (beyond spec 2.5).
    #[graphql(complexity = "rows(limit).saturating_mul(child_complexity)")]
    async fn relationships(
        &self,
        ctx: &Context<'_>,
        entity_type: Option<String>,
        entity_id: Option<String>,
        limit: Option<i32>,
    ) -> GqlResult<Vec<Relationship>> {
        let c = caller(ctx)?;
        let node = match (&entity_type, &entity_id) {
            (Some(t), Some(i)) => Some((t.as_str(), i.as_str())),
            (None, None) => None,
            _ => {
                return Err(gql(Error::validation(
                    "entityId",
                    "`entityType` and `entityId` go together",
                )));
            }
        };
        c.state
            .store
            .list_relationships(&c.workspace_id, node, self::limit(limit)?)
            .await
            .map_err(gql)
    }

    /// Proof-ready evidence packets, newest first (without their items).
    #[graphql(complexity = "rows(limit).saturating_mul(child_complexity)")]
    async fn proof_trails(
        &self,
        ctx: &Context<'_>,
        limit: Option<i32>,
    ) -> GqlResult<Vec<ProofTrail>> {
        let c = caller(ctx)?;
        let trails = c
            .state
            .store
            .list_proof_trails(&c.workspace_id, self::limit(limit)?)
            .await
            .map_err(gql)?;
        Ok(trails
            .into_iter()
            .map(|t| ProofTrail {
                id: t.id,
                title: t.title,
                root_hash: t.root_hash,
                item_count: t.item_count as u64,
                created_at: t.created_at,
            })
            .collect())
    }
}

/// `extensions.code` of a document that does not parse or validate.
const INVALID_QUERY: &str = "invalid_query";

/// A GraphQL request (the standard JSON form).
#[derive(Debug, serde::Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct GraphqlRequest {
    pub query: String,
    #[schema(value_type = Option<Object>)]
    pub variables: Option<Value>,
    pub operation_name: Option<String>,
}

/// The standard GraphQL response.
#[derive(Debug, Serialize, ToSchema)]
pub struct GraphqlResponse {
    #[schema(value_type = Option<Object>)]
    pub data: Option<Value>,
    /// `[{message, locations?, path?, extensions?: {code, field?}}]`
    #[schema(value_type = Option<Vec<Object>>)]
    pub errors: Option<Vec<Value>>,
}

/// GraphQL over the operating graph. Errors of the query itself (unknown
/// fields, bad arguments) are 200 with `errors`; credentials and malformed
/// bodies are refused in the API's error shape.
#[utoipa::path(
    post, path = "/api/graphql", tag = "queries",
    request_body = GraphqlRequest,
    responses(
        (status = 200, body = GraphqlResponse),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 413, body = ErrorBody),
        (status = 415, body = ErrorBody), (status = 429, body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn graphql(
    State(state): State<AppState>,
    principal: Principal,
    JsonBody(body): JsonBody,
) -> crate::error::Result<Json<Value>> {
    principal.require(Scope::Read)?;
    if !super::object_body(&body)?.get("query").is_some_and(Value::is_string) {
        return Err(Error::validation("query", "`query` must be a string"));
    }
    let request: async_graphql::Request = serde_json::from_value(body).map_err(|e| {
        Error::Validation { field: None, message: format!("not a GraphQL request: {e}") }
    })?;
    let request = request.data(Caller { state, workspace_id: principal.workspace_id.clone() });
    let mut response = schema().execute(request).await;
    for error in &mut response.errors {
        // Parse and validation errors come from async-graphql itself,
        // without a code; a client tells them apart by this one.
        if error.extensions.is_none() && error.path.is_empty() {
            let mut extensions = async_graphql::ErrorExtensionValues::default();
            extensions.set("code", INVALID_QUERY);
            error.extensions = Some(extensions);
        }
    }
    serde_json::to_value(response).map(Json).map_err(Error::internal)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schema_has_the_twelve_root_fields() {
        let sdl = schema().sdl();
        for field in [
            "events(",
            "trackingPlans(",
            "metricDefinitions(",
            "metrics(",
            "funnel(",
            "attribution(",
            "businessHealth(",
            "agentPerformance(",
            "workflowStatus(",
            "decisionObjects(",
            "enforcementReceipts(",
            "proofTrails(",
        ] {
            assert!(sdl.contains(&format!("\t{field}")), "{field} missing from\n{sdl}");
        }
    }

    #[test]
    fn api_errors_keep_their_code_and_field() {
        let e = gql(Error::validation("steps[1].event", "bad"));
        let ext = serde_json::to_value(e.extensions).unwrap();
        assert_eq!(ext["code"], "validation_failed");
        assert_eq!(ext["field"], "steps[1].event");
        let e = gql(Error::internal("secret path /x"));
        assert_eq!(e.message, "internal error");
    }
}
