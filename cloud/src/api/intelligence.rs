//! Business health, usage metering and agent context (docs/queries.md).
//! The store supplies aggregates (`QueryStore`); the judgements (health
//! score, anomalies, next actions) come from [`crate::intelligence`].

use std::collections::HashMap;

use axum::Json;
use axum::extract::{Query, State};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use super::governance::{MAX_TEXT, optional_text, parse_body};
use super::queries::{WhatsChangedResponse, body_limit, compare_periods};
use super::{AppState, JsonBody, PathId};
use crate::auth::{Principal, Scope};
use crate::error::{Error, Result};
use crate::governance::DecisionStatus;
use crate::intelligence::{
    ANOMALY_NAMES, ActionInputs, Anomaly, DAY_MS, HOUR_MS, HealthComponents, HealthInputs,
    NextAction, anomaly_window, detect_anomalies, health_components, health_score, is_lead,
    is_order, is_scan, next_actions,
};
use crate::store::queries::{
    AGENT_TYPES, ActorActivity, Attribution, AttributionModel, AttributionQuery, ConnectorLoad,
    EventTotals, Range, RunQuery, RunSummary, SeriesQuery, TotalsQuery,
};

type ErrorBody = crate::error::ErrorBody;

/// What the rules and the health score look at, for one business at one
/// time. Each part is gathered only when asked for.
#[derive(Default)]
struct Signals {
    changes: Option<WhatsChangedResponse>,
    anomalies: Vec<Anomaly>,
    gaps: Vec<crate::store::StoredEvent>,
    runs: Vec<RunSummary>,
    loads: Vec<ConnectorLoad>,
    pending: Vec<(String, String)>,
    events_24h: u64,
}

#[derive(Clone, Copy, Default)]
struct Want {
    changes: bool,
    anomalies: bool,
    gaps: bool,
    actions: bool,
}

impl Want {
    const ALL: Want = Want { changes: true, anomalies: true, gaps: true, actions: true };
}

async fn gather(
    state: &AppState,
    ws: &str,
    business: &str,
    now: i64,
    limit: usize,
    want: Want,
) -> Result<Signals> {
    let store = &state.store;
    let biz = Some(business.to_owned());
    let week = Range { from: now - 7 * DAY_MS, to: now + 1 };
    let mut s = Signals::default();
    if want.changes || want.actions {
        let previous = Range { from: week.from - 7 * DAY_MS, to: week.from };
        s.changes = Some(compare_periods(state, ws, biz.clone(), week, previous, limit).await?);
    }
    if want.anomalies || want.actions {
        let (from, to) = anomaly_window(now);
        let query = SeriesQuery {
            range: Range { from, to },
            business_id: biz.clone(),
            event: None,
            bucket_ms: HOUR_MS,
            by_event: Some(ANOMALY_NAMES),
        };
        let points = store.event_series(ws, &query).await?;
        s.anomalies = detect_anomalies(&points, now);
        s.anomalies.truncate(limit);
    }
    if want.gaps || want.actions {
        let month = Range { from: now - 30 * DAY_MS, to: now + 1 };
        s.gaps = store.proof_gaps(ws, month, Some(business), limit).await?;
    }
    if want.actions {
        let query = RunQuery {
            range: Some(week),
            business_id: biz.clone(),
            limit: limit.max(1),
            ..Default::default()
        };
        s.runs = store.runs(ws, &query).await?;
        s.loads = store.connector_loads(ws, week.from, limit).await?;
        for status in [DecisionStatus::PendingApproval, DecisionStatus::Draft] {
            for d in store.list_decisions(ws, Some(status), 3).await? {
                s.pending.push((d.id, d.title));
            }
        }
        let day = TotalsQuery {
            range: Some(Range { from: now - DAY_MS, to: now + 1 }),
            business_id: biz,
            limit: 0,
            ..Default::default()
        };
        s.events_24h = store.event_totals(ws, &day).await?.total_events;
    }
    Ok(s)
}

fn actions_of(s: &Signals) -> Vec<NextAction> {
    let mut gap_decisions: Vec<String> = Vec::new();
    for e in &s.gaps {
        if let Some(id) = e.envelope.get("decisionId").and_then(Value::as_str)
            && !gap_decisions.iter().any(|d| d == id)
        {
            gap_decisions.push(id.to_owned());
        }
    }
    let revenue =
        s.changes.as_ref().map_or((0.0, 0.0), |c| (c.current.revenue, c.previous.revenue));
    next_actions(&ActionInputs {
        failed_runs: s.runs.iter().filter(|r| r.status == "failed").collect(),
        anomalies: &s.anomalies,
        pending_decisions: s.pending.clone(),
        proof_gap_decisions: gap_decisions,
        loads: &s.loads,
        events_last_24h: s.events_24h,
        revenue,
    })
}

// ---------------------------------------------------------------------------
// Business health.

#[derive(Debug, Serialize, ToSchema, async_graphql::SimpleObject)]
#[serde(rename_all = "camelCase")]
pub struct Alert {
    /// `anomaly`, `run_failed`, `connector_rejects`, `proof_gap` or
    /// `no_recent_events`.
    pub kind: &'static str,
    /// `info`, `warning` or `critical`.
    pub severity: &'static str,
    pub message: String,
    /// When it happened, ms, if it has one time.
    pub at: Option<i64>,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct BusinessHealth {
    pub business_id: String,
    /// 0 to 100; see docs/queries.md.
    pub health_score: u32,
    pub health_components: HealthComponents,
    /// Revenue of the last 30 days.
    pub revenue: f64,
    /// Scan events of the last 30 days.
    pub scans: u64,
    pub leads: u64,
    pub orders: u64,
    /// Newest first, at most `limit`.
    #[schema(value_type = Vec<Object>)]
    pub recent_events: Vec<Value>,
    /// Per-event totals of the last 30 days, the 20 most frequent.
    pub metrics: Vec<EventTotals>,
    /// Last-touch attribution of the last 30 days, 10 rows per dimension.
    pub attribution: Attribution,
    pub alerts: Vec<Alert>,
    /// Workflow, robot and agent runs of the last 7 days.
    pub workflows: Vec<RunSummary>,
    pub next_actions: Vec<NextAction>,
}

/// Operating health of one business (`default`: the workspace's default).
#[utoipa::path(
    get, path = "/api/businesses/{id}/health", tag = "intelligence",
    params(
        ("id" = String, Path, description = "Business id; `default` for the default business"),
        ("limit" = Option<u32>, Query, description = "Recent events and runs; default 100, max 1000"),
    ),
    responses(
        (status = 200, body = BusinessHealth),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 429, body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn business_health(
    State(state): State<AppState>,
    principal: Principal,
    PathId(id): PathId,
    Query(params): Query<HashMap<String, String>>,
) -> Result<Json<BusinessHealth>> {
    principal.require(Scope::Read)?;
    super::check_params(&params, &["limit"])?;
    let limit = super::limit_of(&params)?;
    Ok(Json(health_of(&state, &principal.workspace_id, id, limit).await?))
}

/// The health of business `id` (404 when the workspace has none).
pub async fn health_of(
    state: &AppState,
    ws: &str,
    id: String,
    limit: usize,
) -> Result<BusinessHealth> {
    if !state.store.business_exists(ws, &id).await? {
        return Err(Error::NotFound(format!("business {id}")));
    }
    let now = crate::now_ms();
    let signals = gather(state, ws, &id, now, limit, Want::ALL).await?;
    let month = Range { from: now - 30 * DAY_MS, to: now + 1 };
    let totals = state
        .store
        .event_totals(
            ws,
            &TotalsQuery {
                range: Some(month),
                business_id: Some(id.clone()),
                limit: 10_000,
                ..Default::default()
            },
        )
        .await?;
    let sum = |f: fn(&str) -> bool| -> u64 {
        totals.events.iter().filter(|e| f(&e.event_name)).map(|e| e.count).sum()
    };
    let (scans, leads, orders) = (sum(is_scan), sum(is_lead), sum(is_order));
    let attribution = state
        .store
        .attribution(
            ws,
            &AttributionQuery {
                conversion_event: None,
                model: AttributionModel::LastTouch,
                range: month,
                lookback_ms: 30 * DAY_MS,
                business_id: Some(id.clone()),
                limit: 10,
            },
        )
        .await?;
    let filter =
        crate::store::EventFilter { limit, business_id: Some(id.clone()), ..Default::default() };
    let recent_events =
        state.store.list_events(ws, &filter).await?.into_iter().map(|e| e.into_json()).collect();
    let changes = signals.changes.as_ref();
    let components = health_components(&HealthInputs {
        events_now: changes.map_or(0, |c| c.current.total_events),
        events_before: changes.map_or(0, |c| c.previous.total_events),
        runs: &signals.runs,
        loads: &signals.loads,
        anomalies: signals.anomalies.len(),
        proof_gaps: signals.gaps.len(),
    });
    let next = actions_of(&signals);
    let alerts = alerts_of(&signals);
    let mut metrics = totals.events;
    metrics.truncate(20);
    Ok(BusinessHealth {
        business_id: id,
        health_score: health_score(&components),
        health_components: components,
        revenue: totals.total_revenue,
        scans,
        leads,
        orders,
        recent_events,
        metrics,
        attribution,
        alerts,
        workflows: signals.runs,
        next_actions: next,
    })
}

fn alerts_of(s: &Signals) -> Vec<Alert> {
    let mut out = Vec::new();
    if s.events_24h == 0 {
        out.push(Alert {
            kind: "no_recent_events",
            severity: "warning",
            message: "no events in the last 24 hours".into(),
            at: None,
        });
    }
    for run in s.runs.iter().filter(|r| r.status == "failed") {
        out.push(Alert {
            kind: "run_failed",
            severity: "critical",
            message: format!("{} run {} failed ({})", run.kind, run.trace_id, run.last_event),
            at: Some(run.updated_at),
        });
    }
    for a in &s.anomalies {
        out.push(Alert {
            kind: "anomaly",
            severity: if a.direction == "drop" { "warning" } else { "info" },
            message: format!(
                "{} {}: {} in the hour against {:.1} expected (z = {:.1})",
                a.event_name, a.direction, a.observed, a.expected, a.z_score
            ),
            at: Some(a.hour),
        });
    }
    for load in s.loads.iter().filter(|l| l.rejected > 0) {
        out.push(Alert {
            kind: "connector_rejects",
            severity: "warning",
            message: format!(
                "{} rejected {} of {} records",
                load.provider, load.rejected, load.received
            ),
            at: Some(load.last_sync_at),
        });
    }
    if !s.gaps.is_empty() {
        out.push(Alert {
            kind: "proof_gap",
            severity: "warning",
            message: format!("{} governed events lack proof (below T3, no proofId)", s.gaps.len()),
            at: s.gaps.first().and_then(|e| e.envelope.get("timestamp")).and_then(Value::as_i64),
        });
    }
    out
}

// ---------------------------------------------------------------------------
// Usage.

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct UsagePeriod {
    /// Start of the calendar month (UTC), ms.
    pub from: i64,
    pub to: i64,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct EventUsage {
    pub ingested: u64,
    /// Monthly quota; `null`: none.
    pub quota: Option<u64>,
    pub remaining: Option<u64>,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RateLimitState {
    /// 0: not limited.
    pub requests_per_second: u32,
    pub burst: u32,
    /// Requests the workspace may make right now before a 429 (its token
    /// bucket after this call); `null` when not limited.
    pub remaining: Option<u32>,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct UsageReport {
    pub workspace_id: String,
    pub period: UsagePeriod,
    pub events: EventUsage,
    /// Authenticated API calls this month, this one included.
    pub api_calls: u64,
    /// Connector loads this month, per provider.
    pub connectors: Vec<ConnectorLoad>,
    /// Agents, robots and tool servers (by `actor.type`) this month, the
    /// most active first, at most `limit`.
    pub agents: Vec<ActorActivity>,
    pub rate_limit: RateLimitState,
}

/// Usage metering of the workspace for the current month.
#[utoipa::path(
    get, path = "/api/usage", tag = "intelligence",
    params(("limit" = Option<u32>, Query, description = "Agents listed; default 100, max 1000")),
    responses(
        (status = 200, body = UsageReport),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 429, body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn usage(
    State(state): State<AppState>,
    principal: Principal,
    Query(params): Query<HashMap<String, String>>,
) -> Result<Json<UsageReport>> {
    principal.require(Scope::Read)?;
    super::check_params(&params, &["limit"])?;
    let limit = super::limit_of(&params)?;
    let ws = principal.workspace_id.as_str();
    // API calls are counted in memory and flushed every few seconds: flush
    // now so that the report is exact.
    state.usage.flush(state.store.as_ref()).await;
    let now = crate::now_ms();
    let from = crate::usage::month_start_ms(now);
    let totals = state.store.usage(ws, from, now).await?;
    let quota = state.usage.quota_config().monthly_event_quota;
    let quota = (quota > 0).then_some(quota);
    let connectors = state.store.connector_loads(ws, from, limit).await?;
    let agents = state
        .store
        .actor_activity(ws, Range { from, to: now + 1 }, &AGENT_TYPES, None, limit)
        .await?;
    let rate = state.usage.rate_config();
    Ok(Json(UsageReport {
        workspace_id: principal.workspace_id.clone(),
        period: UsagePeriod { from, to: now },
        events: EventUsage {
            ingested: totals.events_ingested,
            quota,
            remaining: quota.map(|q| q.saturating_sub(totals.events_ingested)),
        },
        api_calls: totals.api_calls,
        connectors,
        agents,
        rate_limit: RateLimitState {
            requests_per_second: rate.requests_per_second,
            burst: rate.burst,
            remaining: state.usage.requests_left(ws),
        },
    }))
}

// ---------------------------------------------------------------------------
// Agent context.

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Everything below.
    Summarize,
    /// `nextActions` only.
    RecommendNextActions,
    /// `anomalies` only.
    DetectAnomalies,
    /// `missingProofEvents` only.
    ProofGaps,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AgentContextRequest {
    /// `summarize`, `recommend_next_actions`, `detect_anomalies` or
    /// `proof_gaps`.
    pub mode: Mode,
    /// Default `default`.
    pub business_id: Option<String>,
    /// Bound on each list; default 100, max 1000.
    #[serde(default, deserialize_with = "super::queries::clamped_limit")]
    pub limit: Option<u64>,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentContext {
    pub mode: Mode,
    pub business_id: String,
    pub generated_at: i64,
    /// One paragraph for an agent's prompt.
    pub summary: String,
    /// The last 7 days against the 7 before (`summarize` only).
    pub changes: Option<WhatsChangedResponse>,
    pub anomalies: Vec<Anomaly>,
    /// Governed events (with `decisionId`) below `T3` and without a
    /// `proofId`, last 30 days, newest first.
    #[schema(value_type = Vec<Object>)]
    pub missing_proof_events: Vec<Value>,
    pub next_actions: Vec<NextAction>,
}

/// Changes, anomalies, proof gaps and governed next actions, for agents.
#[utoipa::path(
    post, path = "/api/intelligence/agent-context", tag = "intelligence",
    request_body = AgentContextRequest,
    responses(
        (status = 200, body = AgentContext),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 429, body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn agent_context(
    State(state): State<AppState>,
    principal: Principal,
    JsonBody(body): JsonBody,
) -> Result<Json<AgentContext>> {
    principal.require(Scope::Read)?;
    let input: AgentContextRequest = parse_body(body)?;
    let business = optional_text("businessId", input.business_id.as_deref(), MAX_TEXT)?
        .unwrap_or_else(|| "default".to_owned());
    let ws = principal.workspace_id.as_str();
    if !state.store.business_exists(ws, &business).await? {
        return Err(Error::NotFound(format!("business {business}")));
    }
    let limit = body_limit(input.limit);
    let want = match input.mode {
        // The actions are derived from every signal, which comes with
        // them as their evidence.
        Mode::Summarize | Mode::RecommendNextActions => Want::ALL,
        Mode::DetectAnomalies => Want { anomalies: true, ..Want::default() },
        Mode::ProofGaps => Want { gaps: true, ..Want::default() },
    };
    let now = crate::now_ms();
    let signals = gather(&state, ws, &business, now, limit, want).await?;
    let mut next = if want.actions { actions_of(&signals) } else { Vec::new() };
    next.truncate(limit);
    let summary = summary_of(&business, &signals, &next, want);
    Ok(Json(AgentContext {
        mode: input.mode,
        business_id: business,
        generated_at: now,
        summary,
        changes: if want.changes { signals.changes } else { None },
        anomalies: if want.anomalies { signals.anomalies } else { Vec::new() },
        missing_proof_events: if want.gaps {
            signals.gaps.into_iter().map(|e| e.into_json()).collect()
        } else {
            Vec::new()
        },
        next_actions: next,
    }))
}

fn summary_of(business: &str, s: &Signals, next: &[NextAction], want: Want) -> String {
    let mut parts = vec![format!("Business {business}")];
    if want.changes
        && let Some(c) = &s.changes
    {
        parts.push(format!(
            "{} events in the last 7 days against {} the 7 before, revenue {:.2} ({:+.2}); \
             {} new and {} disappeared event types",
            c.current.total_events,
            c.previous.total_events,
            c.current.revenue,
            c.diff.revenue_delta,
            c.diff.new_event_types.len(),
            c.diff.disappeared_event_types.len()
        ));
    }
    if want.anomalies {
        parts.push(format!("{} anomalies in hourly counts", s.anomalies.len()));
    }
    if want.gaps {
        parts.push(format!("{} governed events lack proof", s.gaps.len()));
    }
    if want.actions {
        parts.push(format!("{} next actions", next.len()));
    }
    format!("{}.", parts.join("; "))
}
