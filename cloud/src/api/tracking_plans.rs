//! `/api/tracking-plans`: persisted plans for agent instrumentation
//! (`{name, vertical, events[]}`), created with the `govern` scope and read
//! with `read`.

use std::collections::HashMap;

use axum::Json;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use super::governance::{MAX_DESCRIPTION, MAX_TEXT, optional_text, parse_body, text};
use super::{AppState, JsonBody, PathId};
use crate::auth::{Principal, Scope};
use crate::error::{Error, Result};
use crate::store::governance::TrackingPlan;

const MAX_EVENTS: usize = 500;

type ErrorBody = crate::error::ErrorBody;

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateTrackingPlan {
    pub name: String,
    /// The industry or domain, e.g. `ecommerce`, `warehouse`, `fleet`.
    pub vertical: String,
    /// Up to 500 event names, or objects with a string `event`. A plan may
    /// start with a name and a vertical alone (as the spec's CLI makes one)
    /// and be filled in later.
    #[serde(default)]
    #[schema(value_type = Vec<Object>)]
    pub events: Vec<Value>,
    pub description: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TrackingPlanBody {
    pub tracking_plan: TrackingPlan,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TrackingPlanList {
    pub tracking_plans: Vec<TrackingPlan>,
}

fn check_events(events: &[Value]) -> Result<()> {
    if events.len() > MAX_EVENTS {
        return Err(Error::validation(
            "events",
            format!("`events` must hold at most {MAX_EVENTS} entries"),
        ));
    }
    for (i, entry) in events.iter().enumerate() {
        let field = format!("events[{i}]");
        match entry {
            Value::String(name) => {
                text(&field, name, MAX_TEXT)?;
            }
            Value::Object(map) => match map.get("event") {
                Some(Value::String(name)) => {
                    text(&format!("{field}.event"), name, MAX_TEXT)?;
                }
                _ => {
                    return Err(Error::validation(
                        format!("{field}.event"),
                        "`event` must be a string",
                    ));
                }
            },
            _ => {
                return Err(Error::validation(
                    field,
                    "each event is a name, or an object with a string `event`",
                ));
            }
        }
    }
    Ok(())
}

/// Create a tracking plan.
#[utoipa::path(
    post, path = "/api/tracking-plans", tag = "governance",
    request_body = CreateTrackingPlan,
    responses(
        (status = 201, body = TrackingPlanBody),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 413, body = ErrorBody),
        (status = 415, body = ErrorBody), (status = 429, body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn create(
    State(state): State<AppState>,
    principal: Principal,
    JsonBody(body): JsonBody,
) -> Result<(StatusCode, Json<TrackingPlanBody>)> {
    principal.require(Scope::Govern)?;
    let input: CreateTrackingPlan = parse_body(body)?;
    check_events(&input.events)?;
    let plan = TrackingPlan {
        id: crate::ids::new_id("plan"),
        name: text("name", &input.name, MAX_TEXT)?,
        vertical: text("vertical", &input.vertical, MAX_TEXT)?,
        description: optional_text("description", input.description.as_deref(), MAX_DESCRIPTION)?,
        events: input.events,
        created_at: crate::now_ms(),
        created_by: principal.subject.clone(),
    };
    state.store.insert_tracking_plan(&principal.workspace_id, &plan).await?;
    Ok((StatusCode::CREATED, Json(TrackingPlanBody { tracking_plan: plan })))
}

/// List tracking plans, newest first.
#[utoipa::path(
    get, path = "/api/tracking-plans", tag = "governance",
    params(("limit" = Option<u32>, Query, description = "Default 100, clamped to 1000")),
    responses(
        (status = 200, body = TrackingPlanList),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 429, body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn list(
    State(state): State<AppState>,
    principal: Principal,
    Query(params): Query<HashMap<String, String>>,
) -> Result<Json<TrackingPlanList>> {
    principal.require(Scope::Read)?;
    super::check_params(&params, &["limit"])?;
    let limit = super::limit_of(&params)?;
    let tracking_plans = state.store.list_tracking_plans(&principal.workspace_id, limit).await?;
    Ok(Json(TrackingPlanList { tracking_plans }))
}

/// One tracking plan.
#[utoipa::path(
    get, path = "/api/tracking-plans/{id}", tag = "governance",
    params(("id" = String, Path, description = "`plan_...`")),
    responses(
        (status = 200, body = TrackingPlanBody),
        (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn get(
    State(state): State<AppState>,
    principal: Principal,
    PathId(id): PathId,
) -> Result<Json<TrackingPlanBody>> {
    principal.require(Scope::Read)?;
    let plan = state
        .store
        .get_tracking_plan(&principal.workspace_id, &id)
        .await?
        .ok_or_else(|| Error::NotFound(format!("tracking plan {id}")))?;
    Ok(Json(TrackingPlanBody { tracking_plan: plan }))
}
