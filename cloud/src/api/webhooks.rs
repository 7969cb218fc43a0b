//! `/api/webhooks`: a workspace's subscriptions to what Opgraph learns
//! (`enforcement.decided`, `export.failed`, `anomaly.detected`) and each
//! one's delivery log.
//! Delivering is [`crate::webhooks`]; reference: `docs/webhooks.md`.

use std::collections::HashMap;

use axum::Json;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::governance::parse_body;
use super::{AppState, JsonBody, PathId, check_params, limit_of};
use crate::auth::{Principal, Scope};
use crate::error::{Error, Result};
use crate::store::webhooks::{Webhook, WebhookAttempt};
use crate::webhooks::{KINDS, MAX_PER_WORKSPACE};

type ErrorBody = crate::error::ErrorBody;

/// Shortest signing secret: a guessable one would let anyone forge
/// deliveries.
const MIN_SECRET: usize = 16;
const MAX_SECRET: usize = 1024;
const MAX_URL: usize = 2048;

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateWebhook {
    /// `https://` URL that receives the deliveries (`POST`, JSON).
    pub url: String,
    /// Event kinds to deliver: `enforcement.decided`, `export.failed`,
    /// `anomaly.detected`.
    pub events: Vec<String>,
    /// Signs every delivery (HMAC-SHA256); 16 to 1024 bytes. Never shown
    /// again.
    pub secret: String,
}

/// A webhook as the API shows it: never its secret.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct WebhookView {
    /// `whk_...`
    pub id: String,
    pub url: String,
    pub events: Vec<String>,
    pub created_at: i64,
}

impl From<Webhook> for WebhookView {
    fn from(w: Webhook) -> Self {
        WebhookView { id: w.id, url: w.url, events: w.events, created_at: w.created_at }
    }
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct WebhookBody {
    pub webhook: WebhookView,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct WebhookList {
    /// Oldest first.
    pub webhooks: Vec<WebhookView>,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeliveryLog {
    /// Every attempt, newest first.
    pub deliveries: Vec<WebhookAttempt>,
}

/// Checks a new webhook's fields, naming the first bad one.
fn check(input: CreateWebhook) -> Result<(String, Vec<String>, String)> {
    let url = input.url.trim();
    match url::Url::parse(url) {
        Ok(u) if u.scheme() == "https" && u.host().is_some() && url.len() <= MAX_URL => {}
        _ => {
            return Err(Error::validation(
                "url",
                format!("`url` must be an https:// URL of at most {MAX_URL} bytes"),
            ));
        }
    }
    if input.events.is_empty() {
        return Err(Error::validation(
            "events",
            format!("`events` must name at least one of {}", KINDS.join(", ")),
        ));
    }
    let mut events: Vec<String> = Vec::new();
    for (i, kind) in input.events.iter().enumerate() {
        let kind = kind.trim();
        if !KINDS.contains(&kind) {
            let message =
                format!("unknown event kind {kind:?}; the kinds are {}", KINDS.join(", "));
            return Err(Error::validation(format!("events[{i}]"), message));
        }
        if !events.iter().any(|e| e == kind) {
            events.push(kind.to_owned());
        }
    }
    if !(MIN_SECRET..=MAX_SECRET).contains(&input.secret.len()) {
        return Err(Error::validation(
            "secret",
            format!("`secret` must be {MIN_SECRET} to {MAX_SECRET} bytes"),
        ));
    }
    Ok((url.to_owned(), events, input.secret))
}

/// Subscribe a URL to event kinds.
#[utoipa::path(
    post, path = "/api/webhooks", tag = "webhooks",
    request_body = CreateWebhook,
    responses(
        (status = 201, body = WebhookBody),
        (status = 400, description = "A field missing or invalid, named in `field`", body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 403, description = "The credential lacks the `admin` scope", body = ErrorBody),
        (status = 409, description = "The workspace has 100 webhooks already", body = ErrorBody),
        (status = 413, body = ErrorBody), (status = 415, body = ErrorBody),
        (status = 429, body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn create(
    State(state): State<AppState>,
    principal: Principal,
    JsonBody(body): JsonBody,
) -> Result<(StatusCode, Json<WebhookBody>)> {
    principal.require(Scope::Admin)?;
    let (url, events, secret) = check(parse_body(body)?)?;
    let ws = &principal.workspace_id;
    if state.store.list_webhooks(ws, MAX_PER_WORKSPACE).await?.len() >= MAX_PER_WORKSPACE {
        return Err(Error::Conflict(format!(
            "a workspace has at most {MAX_PER_WORKSPACE} webhooks; delete one first"
        )));
    }
    let webhook =
        Webhook { id: crate::ids::new_id("whk"), url, events, secret, created_at: crate::now_ms() };
    state.store.insert_webhook(ws, &webhook).await?;
    state.webhooks.invalidate(ws);
    Ok((StatusCode::CREATED, Json(WebhookBody { webhook: webhook.into() })))
}

/// The workspace's webhooks, oldest first.
#[utoipa::path(
    get, path = "/api/webhooks", tag = "webhooks",
    params(("limit" = Option<u32>, Query, description = "Default 100, clamped to 1000")),
    responses(
        (status = 200, body = WebhookList),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 429, body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn list(
    State(state): State<AppState>,
    principal: Principal,
    Query(params): Query<HashMap<String, String>>,
) -> Result<Json<WebhookList>> {
    principal.require(Scope::Admin)?;
    check_params(&params, &["limit"])?;
    let limit = limit_of(&params)?;
    let webhooks = state.store.list_webhooks(&principal.workspace_id, limit).await?;
    Ok(Json(WebhookList { webhooks: webhooks.into_iter().map(Into::into).collect() }))
}

/// Delete a webhook: nothing more is sent to it, retries included.
#[utoipa::path(
    delete, path = "/api/webhooks/{id}", tag = "webhooks",
    params(("id" = String, Path, description = "`whk_...`")),
    responses(
        (status = 204, description = "Deleted"),
        (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, description = "No such webhook in this workspace", body = ErrorBody),
        (status = 429, body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn delete(
    State(state): State<AppState>,
    principal: Principal,
    PathId(id): PathId,
) -> Result<StatusCode> {
    principal.require(Scope::Admin)?;
    let ws = &principal.workspace_id;
    if !state.store.delete_webhook(ws, &id, crate::now_ms()).await? {
        return Err(Error::NotFound(format!("webhook {id}")));
    }
    state.webhooks.invalidate(ws);
    Ok(StatusCode::NO_CONTENT)
}

/// A webhook's delivery log: every attempt, newest first.
#[utoipa::path(
    get, path = "/api/webhooks/{id}/deliveries", tag = "webhooks",
    params(
        ("id" = String, Path, description = "`whk_...`"),
        ("limit" = Option<u32>, Query, description = "Default 100, clamped to 1000"),
    ),
    responses(
        (status = 200, body = DeliveryLog),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody),
        (status = 404, description = "No such webhook in this workspace", body = ErrorBody),
        (status = 429, body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn deliveries(
    State(state): State<AppState>,
    principal: Principal,
    PathId(id): PathId,
    Query(params): Query<HashMap<String, String>>,
) -> Result<Json<DeliveryLog>> {
    principal.require(Scope::Admin)?;
    check_params(&params, &["limit"])?;
    let limit = limit_of(&params)?;
    let ws = &principal.workspace_id;
    let hooks = state.store.list_webhooks(ws, MAX_PER_WORKSPACE).await?;
    if !hooks.iter().any(|h| h.id == id) {
        return Err(Error::NotFound(format!("webhook {id}")));
    }
    let deliveries = state.store.list_webhook_attempts(ws, &id, limit).await?;
    Ok(Json(DeliveryLog { deliveries }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(url: &str, events: &[&str], secret: &str) -> CreateWebhook {
        CreateWebhook {
            url: url.into(),
            events: events.iter().map(|e| (*e).to_owned()).collect(),
            secret: secret.into(),
        }
    }

    fn field(result: Result<(String, Vec<String>, String)>) -> Option<String> {
        match result {
            Err(Error::Validation { field, .. }) => field,
            other => panic!("expected a validation error, got {other:?}"),
        }
    }

    #[test]
    fn every_field_is_checked() {
        let secret = "0123456789abcdef";
        let ok = check(input("https://h.example/in", &["export.failed", "export.failed"], secret));
        assert_eq!(ok.unwrap().1, ["export.failed"], "kinds are deduplicated");
        assert_eq!(
            field(check(input("http://h.example/", &["export.failed"], secret))).as_deref(),
            Some("url")
        );
        assert_eq!(
            field(check(input("https://h.example/", &[], secret))).as_deref(),
            Some("events")
        );
        assert_eq!(
            field(check(input("https://h.example/", &["export.failed", "x"], secret))).as_deref(),
            Some("events[1]")
        );
        assert_eq!(
            field(check(input("https://h.example/", &["export.failed"], "short"))).as_deref(),
            Some("secret")
        );
    }
}
