//! API keys (`/api/keys`, admin scope) and workspaces (`/api/workspaces`,
//! operator scope). A key's secret is returned once, at creation; the store
//! keeps only its SHA-256. Rotation is create-then-revoke.

use std::collections::HashMap;

use axum::Json;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;

use super::{AppState, JsonBody, PathId, optional_str};
use crate::auth::{self, Principal, Scope};
use crate::error::{Error, Result};
use crate::store::{ApiKeyRecord, NewApiKey, Workspace};

const MAX_NAME_LEN: usize = 200;

/// A key as listed: never the secret.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApiKeyView {
    pub id: String,
    pub name: String,
    /// The first characters of the key, to recognise it.
    pub hint: String,
    pub scopes: Vec<String>,
    pub created_at: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub revoked_at: Option<i64>,
}

impl From<ApiKeyRecord> for ApiKeyView {
    fn from(r: ApiKeyRecord) -> Self {
        ApiKeyView {
            id: r.id,
            name: r.name,
            hint: r.hint,
            scopes: r.scopes.iter().map(|s| s.as_str().to_owned()).collect(),
            created_at: r.created_at,
            revoked_at: r.revoked_at,
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CreatedKey {
    pub key: ApiKeyView,
    /// The secret, shown this once.
    pub api_key: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct KeyList {
    pub keys: Vec<ApiKeyView>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct WorkspaceView {
    pub id: String,
    pub name: String,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CreatedWorkspace {
    pub workspace: WorkspaceView,
    /// An admin key of the new workspace, shown this once.
    pub api_key: String,
}

/// Creates and stores a key for `workspace_id`; returns the record and the
/// secret.
pub async fn issue_key(
    state: &AppState,
    workspace_id: &str,
    name: &str,
    scopes: Vec<Scope>,
) -> Result<(ApiKeyRecord, String)> {
    let secret = auth::generate_api_key();
    let record = ApiKeyRecord {
        id: crate::ids::new_id("key"),
        workspace_id: workspace_id.to_owned(),
        name: name.to_owned(),
        hint: auth::key_hint(&secret),
        scopes,
        created_at: crate::now_ms(),
        revoked_at: None,
    };
    let stored =
        state.store.insert_api_key(NewApiKey { record, hash: auth::hash_key(&secret) }).await?;
    Ok((stored, secret))
}

fn name_field(body: &Value, default: &str) -> Result<String> {
    let name = optional_str(body, "name")?.unwrap_or(default).trim().to_owned();
    if name.is_empty() || name.chars().count() > MAX_NAME_LEN {
        return Err(Error::validation(
            "name",
            format!("`name` must be 1 to {MAX_NAME_LEN} characters"),
        ));
    }
    Ok(name)
}

fn check_fields(body: &Value, allowed: &[&str]) -> Result<()> {
    let object = super::object_body(body)?;
    match object.keys().find(|k| !allowed.contains(&k.as_str())) {
        Some(k) => Err(Error::validation(k.as_str(), format!("unknown field `{k}`"))),
        None => Ok(()),
    }
}

/// Create an API key in the caller's workspace.
#[utoipa::path(
    post,
    path = "/api/keys",
    tag = "keys",
    request_body(content = Object, description = "`{name?, scopes?: [ingest|read|govern|export|admin]}`; scopes default to all five"),
    responses(
        (status = 201, body = CreatedKey),
        (status = 400, body = crate::error::ErrorBody), (status = 401, body = crate::error::ErrorBody),
        (status = 403, body = crate::error::ErrorBody), (status = 415, body = crate::error::ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn create(
    State(state): State<AppState>,
    principal: Principal,
    JsonBody(body): JsonBody,
) -> Result<(StatusCode, Json<CreatedKey>)> {
    principal.require(Scope::Admin)?;
    check_fields(&body, &["name", "scopes"])?;
    let name = name_field(&body, "api key")?;
    let scopes = match body.get("scopes") {
        None | Some(Value::Null) => Scope::DEFAULT.to_vec(),
        Some(Value::Array(items)) if !items.is_empty() => {
            let mut scopes = Vec::new();
            for (i, item) in items.iter().enumerate() {
                let scope = item
                    .as_str()
                    .filter(|s| Scope::GRANTABLE.contains(s))
                    .and_then(Scope::parse)
                    .ok_or_else(|| {
                        Error::validation(
                            format!("scopes[{i}]"),
                            format!("must be one of {}", Scope::GRANTABLE.join(", ")),
                        )
                    })?;
                if !scopes.contains(&scope) {
                    scopes.push(scope);
                }
            }
            scopes.sort();
            scopes
        }
        Some(_) => return Err(Error::validation("scopes", "`scopes` must be a non-empty array")),
    };
    let (record, secret) = issue_key(&state, &principal.workspace_id, &name, scopes).await?;
    Ok((StatusCode::CREATED, Json(CreatedKey { key: record.into(), api_key: secret })))
}

/// List the keys of the caller's workspace (never their secrets).
#[utoipa::path(
    get,
    path = "/api/keys",
    tag = "keys",
    params(("limit" = Option<u32>, Query, description = "Default 100, clamped to 1000; oldest first")),
    responses(
        (status = 200, body = KeyList), (status = 400, body = crate::error::ErrorBody),
        (status = 401, body = crate::error::ErrorBody), (status = 403, body = crate::error::ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn list(
    State(state): State<AppState>,
    principal: Principal,
    Query(params): Query<HashMap<String, String>>,
) -> Result<Json<KeyList>> {
    principal.require(Scope::Admin)?;
    super::check_params(&params, &["limit"])?;
    let limit = super::limit_of(&params)?;
    let keys = state.store.list_api_keys(&principal.workspace_id, limit).await?;
    Ok(Json(KeyList { keys: keys.into_iter().map(ApiKeyView::from).collect() }))
}

/// Revoke a key; it stops working at once on this node.
#[utoipa::path(
    delete,
    path = "/api/keys/{id}",
    tag = "keys",
    params(("id" = String, Path, description = "`key_...`")),
    responses(
        (status = 204, description = "Revoked (also when it already was)"),
        (status = 401, body = crate::error::ErrorBody), (status = 403, body = crate::error::ErrorBody),
        (status = 404, description = "No such key in this workspace", body = crate::error::ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn revoke(
    State(state): State<AppState>,
    principal: Principal,
    PathId(id): PathId,
) -> Result<StatusCode> {
    principal.require(Scope::Admin)?;
    if !state.store.revoke_api_key(&principal.workspace_id, &id).await? {
        return Err(Error::NotFound(format!("key {id}")));
    }
    state.auth.forget_cached_keys();
    Ok(StatusCode::NO_CONTENT)
}

/// Create a workspace with its default business and an admin key
/// (operator scope: the bootstrap key only).
#[utoipa::path(
    post,
    path = "/api/workspaces",
    tag = "keys",
    request_body(content = Object, description = "`{name}`"),
    responses(
        (status = 201, body = CreatedWorkspace),
        (status = 400, body = crate::error::ErrorBody), (status = 401, body = crate::error::ErrorBody),
        (status = 403, body = crate::error::ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn create_workspace(
    State(state): State<AppState>,
    principal: Principal,
    JsonBody(body): JsonBody,
) -> Result<(StatusCode, Json<CreatedWorkspace>)> {
    principal.require(Scope::Operator)?;
    check_fields(&body, &["name"])?;
    if optional_str(&body, "name")?.is_none() {
        return Err(Error::validation("name", "`name` is required"));
    }
    let name = name_field(&body, "")?;
    let workspace = Workspace { id: crate::ids::new_id("ws"), name, created_at: crate::now_ms() };
    state.store.create_workspace(&workspace).await?;
    let (_, secret) = issue_key(&state, &workspace.id, "admin", Scope::DEFAULT.to_vec()).await?;
    Ok((
        StatusCode::CREATED,
        Json(CreatedWorkspace {
            workspace: WorkspaceView { id: workspace.id, name: workspace.name },
            api_key: secret,
        }),
    ))
}
