//! `POST /api/trackables`, `GET /api/trackables`, `GET /api/trackables/{id}`
//! and `POST /api/track`. The public scan redirect is in [`super::scan`];
//! codes, URL checks and the QR code in [`crate::trackables`].

use std::collections::HashMap;

use axum::Json;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use opgraph_proto::validate::MAX_EVENT_NAME_LEN;
use serde::Serialize;
use serde_json::{Map, Value, json};
use utoipa::ToSchema;

use super::ingest::{IngestResponse, keyed_request, parse_body, record};
use super::{AppState, JsonBody, PathId, optional_str};
use crate::auth::{Principal, Scope};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::store::trackables::{CreateTrackable, Trackable, TrackableUsage};
use crate::trackables::{self as codes, TrackableKind};

/// Longest trackable name, in characters.
const MAX_NAME_LEN: usize = 200;
/// Tries at drawing a free generated code before giving up (each collides
/// with probability below one in a billion until there are millions).
const CODE_ATTEMPTS: usize = 8;

/// A trackable as the API shows it.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TrackableView {
    /// `trk_...`
    pub id: String,
    /// Unique in the workspace; what events carry in `trackable.code`.
    pub code: String,
    /// `qr_code`, `barcode`, `rfid_tag`, `sensor`, `robot`, `ai_agent`,
    /// `mcp_server` or `cli_workflow`.
    pub kind: String,
    pub name: String,
    pub target_url: Option<String>,
    /// Event name recorded on use; default `trackable.scanned` for scans and
    /// `trackable.used` for `/api/track`.
    pub event_name: Option<String>,
    /// Public link (`{OPGRAPH_PUBLIC_URL}/r/{scanCode}`) that records a scan
    /// and redirects to `targetUrl`; what the QR code encodes.
    pub scan_url: String,
    pub created_at: i64,
    /// Only on `GET /api/trackables/{id}`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<UsageView>,
}

/// Events of the workspace carrying the trackable's code, from any source.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct UsageView {
    pub count: u64,
    /// Event time of the latest, ms since the epoch.
    pub last_used_at: Option<i64>,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CreatedTrackable {
    pub trackable: TrackableView,
    /// A QR code of `scanUrl` as an SVG document; only with `includeQrSvg`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub qr_svg: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct OneTrackable {
    pub trackable: TrackableView,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct TrackableList {
    /// Newest first.
    pub trackables: Vec<TrackableView>,
}

/// Body of `POST /api/trackables` (for the document; unknown fields are a
/// 400).
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CreateTrackableBody {
    /// One of the eight kinds.
    pub kind: String,
    /// At most 200 characters.
    pub name: String,
    /// Absolute `http`/`https` URL, at most 2048 bytes, no credentials;
    /// required for `qr_code`.
    pub target_url: Option<String>,
    /// At most 200 characters.
    pub event_name: Option<String>,
    /// Adds `qrSvg` to the answer.
    pub include_qr_svg: Option<bool>,
    /// An external identifier to register (EPC hex or URN, GTIN, serial):
    /// 1 to 128 of `A-Z a-z 0-9 . _ : -`, matched exactly. Default: a
    /// generated 10-character code.
    pub code: Option<String>,
}

/// Body of `POST /api/track` (unknown fields are a 400).
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TrackBody {
    /// The trackable's `code`.
    pub code: String,
    /// Event name; default the trackable's `eventName`, then `trackable.used`.
    pub event: Option<String>,
    #[schema(value_type = Option<Object>)]
    pub properties: Option<Value>,
    /// A string, or `{type, id, ...}`.
    #[schema(value_type = Option<Object>)]
    pub actor: Option<Value>,
    /// Event time, ms since the epoch; default the receive time.
    pub timestamp: Option<i64>,
    /// Default `default`.
    pub business_id: Option<String>,
}

/// The public base of scan URLs: `http.public_url`, else the HTTP address
/// (which `server::run` replaces by the bound one).
pub fn public_base(config: &Config) -> String {
    config.http.public_url.clone().unwrap_or_else(|| format!("http://{}", config.http.addr))
}

/// Makes the bound HTTP address the public base when none is configured,
/// so that scan URLs work out of the box (port 0 included).
pub fn default_public_url(state: &mut AppState, bound: std::net::SocketAddr) {
    if state.config.http.public_url.is_none() {
        let mut config = (*state.config).clone();
        config.http.public_url = Some(format!("http://{bound}"));
        state.config = std::sync::Arc::new(config);
    }
}

fn view(config: &Config, t: Trackable, usage: Option<TrackableUsage>) -> TrackableView {
    TrackableView {
        scan_url: codes::scan_url(&public_base(config), &t.scan_code),
        id: t.id,
        code: t.code,
        kind: t.kind.as_str().to_owned(),
        name: t.name,
        target_url: t.target_url,
        event_name: t.event_name,
        created_at: t.created_at,
        usage: usage.map(|u| UsageView { count: u.count, last_used_at: u.last_used_at }),
    }
}

fn reject_unknown(body: &Map<String, Value>, known: &[&str]) -> Result<()> {
    match body.keys().find(|k| !known.contains(&k.as_str())) {
        Some(key) => Err(Error::validation(
            key.as_str(),
            format!("unknown field `{key}`; expected one of {}", known.join(", ")),
        )),
        None => Ok(()),
    }
}

fn bounded(field: &str, text: &str, max: usize) -> Result<()> {
    let n = text.chars().count();
    if n == 0 || n > max {
        return Err(Error::validation(field, format!("`{field}` must be 1 to {max} characters")));
    }
    Ok(())
}

/// The checked fields of a creation body.
struct NewTrackable {
    kind: TrackableKind,
    name: String,
    target_url: Option<String>,
    event_name: Option<String>,
    include_qr_svg: bool,
    code: Option<String>,
}

fn parse_create(body: &Value) -> Result<NewTrackable> {
    let object = super::object_body(body)?;
    reject_unknown(object, &["kind", "name", "targetUrl", "eventName", "includeQrSvg", "code"])?;
    let kind_text = optional_str(body, "kind")?
        .ok_or_else(|| Error::validation("kind", "`kind` is required"))?;
    let kind = TrackableKind::parse(kind_text).ok_or_else(|| {
        Error::validation("kind", format!("`kind` must be one of {}", TrackableKind::listing()))
    })?;
    let name = optional_str(body, "name")?
        .ok_or_else(|| Error::validation("name", "`name` is required"))?;
    bounded("name", name, MAX_NAME_LEN)?;
    let target_url = optional_str(body, "targetUrl")?;
    match target_url {
        Some(url) => codes::check_target_url(url)
            .map_err(|why| Error::validation("targetUrl", format!("`targetUrl` {why}")))?,
        None if kind == TrackableKind::QrCode => {
            return Err(Error::validation("targetUrl", "`targetUrl` is required for a qr_code"));
        }
        None => {}
    }
    let event_name = optional_str(body, "eventName")?;
    if let Some(event) = event_name {
        bounded("eventName", event, MAX_EVENT_NAME_LEN)?;
    }
    let include_qr_svg = match body.get("includeQrSvg") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => {
            return Err(Error::validation("includeQrSvg", "`includeQrSvg` must be a boolean"));
        }
    };
    let code = optional_str(body, "code")?;
    if let Some(code) = code {
        codes::check_external_code(code).map_err(|why| Error::validation("code", why))?;
    }
    Ok(NewTrackable {
        kind,
        name: name.to_owned(),
        target_url: target_url.map(str::to_owned),
        event_name: event_name.map(str::to_owned),
        include_qr_svg,
        code: code.map(str::to_owned),
    })
}

/// Register a trackable: a generated code, or an external one.
#[utoipa::path(
    post,
    path = "/api/trackables",
    tag = "trackables",
    request_body = CreateTrackableBody,
    responses(
        (status = 201, description = "Registered", body = CreatedTrackable),
        (status = 400, description = "Unknown kind (the message lists the kinds), missing `name`, `targetUrl` not absolute http(s) or missing for a qr_code, bad `code`", body = crate::error::ErrorBody),
        (status = 401, body = crate::error::ErrorBody), (status = 403, body = crate::error::ErrorBody),
        (status = 409, description = "The workspace has a trackable with this `code`", body = crate::error::ErrorBody),
        (status = 413, body = crate::error::ErrorBody), (status = 415, body = crate::error::ErrorBody),
        (status = 429, body = crate::error::ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn create(
    State(state): State<AppState>,
    principal: Principal,
    JsonBody(body): JsonBody,
) -> Result<impl IntoResponse> {
    principal.require(Scope::Ingest)?;
    let new = parse_create(&body)?;
    for _ in 0..CODE_ATTEMPTS {
        let scan_code = codes::generate_code();
        let trackable = Trackable {
            id: crate::ids::new_id("trk"),
            code: new.code.clone().unwrap_or_else(|| scan_code.clone()),
            scan_code,
            kind: new.kind,
            name: new.name.clone(),
            target_url: new.target_url.clone(),
            event_name: new.event_name.clone(),
            created_at: crate::now_ms(),
        };
        match state.store.create_trackable(&principal.workspace_id, &trackable).await? {
            CreateTrackable::Created => {
                let view = view(&state.config, trackable, None);
                let qr_svg = match new.include_qr_svg {
                    true => Some(codes::qr_svg(&view.scan_url).map_err(Error::internal)?),
                    false => None,
                };
                let created = CreatedTrackable { trackable: view, qr_svg };
                return Ok((StatusCode::CREATED, Json(created)));
            }
            CreateTrackable::CodeTaken if new.code.is_some() => {
                return Err(Error::Conflict(format!(
                    "a trackable with code {:?} exists in this workspace",
                    trackable.code
                )));
            }
            CreateTrackable::CodeTaken | CreateTrackable::ScanCodeTaken => {}
        }
    }
    Err(Error::internal("no free trackable code after several attempts"))
}

/// List trackables, newest first.
#[utoipa::path(
    get,
    path = "/api/trackables",
    tag = "trackables",
    params(("limit" = Option<u32>, Query, description = "Default 100, clamped to 1000")),
    responses(
        (status = 200, body = TrackableList),
        (status = 400, body = crate::error::ErrorBody), (status = 401, body = crate::error::ErrorBody),
        (status = 403, body = crate::error::ErrorBody), (status = 429, body = crate::error::ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn list(
    State(state): State<AppState>,
    principal: Principal,
    Query(params): Query<HashMap<String, String>>,
) -> Result<Json<TrackableList>> {
    principal.require(Scope::Read)?;
    super::check_params(&params, &["limit"])?;
    let limit = super::limit_of(&params)?;
    let found = state.store.list_trackables(&principal.workspace_id, limit).await?;
    Ok(Json(TrackableList {
        trackables: found.into_iter().map(|t| view(&state.config, t, None)).collect(),
    }))
}

/// One trackable with its usage: every event of the workspace carrying its
/// code, whatever the source (scans, `/api/track`, ingest, gateways).
#[utoipa::path(
    get,
    path = "/api/trackables/{id}",
    tag = "trackables",
    params(("id" = String, Path, description = "`trk_...`")),
    responses(
        (status = 200, body = OneTrackable),
        (status = 401, body = crate::error::ErrorBody), (status = 403, body = crate::error::ErrorBody),
        (status = 404, description = "No such trackable in this workspace", body = crate::error::ErrorBody),
        (status = 429, body = crate::error::ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn get(
    State(state): State<AppState>,
    principal: Principal,
    PathId(id): PathId,
) -> Result<Json<OneTrackable>> {
    principal.require(Scope::Read)?;
    let (trackable, usage) = state
        .store
        .get_trackable(&principal.workspace_id, &id)
        .await?
        .ok_or_else(|| Error::NotFound("trackable".into()))?;
    Ok(Json(OneTrackable { trackable: view(&state.config, trackable, Some(usage)) }))
}

/// Record a usage event for a trackable, named by its code. The event goes
/// through the same validation and store path as `/api/ingest`; its
/// `trackable` is `{kind, code, id}`.
#[utoipa::path(
    post,
    path = "/api/track",
    tag = "trackables",
    request_body = TrackBody,
    params(("Idempotency-Key" = Option<String>, Header, description = "Makes a retry within 24 h return the first answer; another body under the same key is a 409")),
    responses(
        (status = 202, description = "Stored durably", body = IngestResponse),
        (status = 400, description = "`field` names the offending input", body = crate::error::ErrorBody),
        (status = 401, body = crate::error::ErrorBody), (status = 403, body = crate::error::ErrorBody),
        (status = 404, description = "No trackable with this code in the workspace", body = crate::error::ErrorBody),
        (status = 409, description = "The Idempotency-Key was used for another request", body = crate::error::ErrorBody),
        (status = 413, body = crate::error::ErrorBody), (status = 415, body = crate::error::ErrorBody),
        (status = 429, body = crate::error::ErrorBody), (status = 503, body = crate::error::ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn track(
    State(state): State<AppState>,
    principal: Principal,
    headers: HeaderMap,
    JsonBody(body): JsonBody,
) -> Result<impl IntoResponse> {
    principal.require(Scope::Ingest)?;
    let object = super::object_body(&body)?;
    reject_unknown(object, &["code", "event", "properties", "actor", "timestamp", "businessId"])?;
    let code = optional_str(&body, "code")?
        .ok_or_else(|| Error::validation("code", "`code` is required"))?;
    bounded("code", code, codes::MAX_EXTERNAL_CODE_LEN)?;
    let key = keyed_request(&headers, &body)?;
    let trackable = state
        .store
        .trackable_by_code(&principal.workspace_id, code)
        .await?
        .ok_or_else(|| Error::NotFound("trackable".into()))?;
    let mut envelope = Map::new();
    for field in ["event", "properties", "actor", "timestamp", "businessId"] {
        if let Some(value) = object.get(field).filter(|v| !v.is_null()) {
            envelope.insert(field.to_owned(), value.clone());
        }
    }
    if !envelope.contains_key("event") {
        let name = trackable.event_name.clone().unwrap_or_else(|| "trackable.used".into());
        envelope.insert("event".into(), Value::String(name));
    }
    envelope.insert(
        "trackable".into(),
        json!({"kind": trackable.kind.as_str(), "code": trackable.code, "id": trackable.id}),
    );
    let now = crate::now_ms();
    let events = parse_body(Value::Object(envelope), now)?;
    let accepted = events.len();
    let result = record(&state, &principal.workspace_id, events, key, now, "track").await?;
    Ok((StatusCode::ACCEPTED, Json(IngestResponse { accepted, ids: result.ids })))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field_of(body: Value) -> Option<String> {
        match parse_create(&body) {
            Err(Error::Validation { field, .. }) => field,
            Err(other) => panic!("expected a validation error, got {other:?}"),
            Ok(_) => panic!("expected a validation error for {body}"),
        }
    }

    #[test]
    fn creation_bodies_are_checked_field_by_field() {
        let ok =
            json!({"kind": "qr_code", "name": "Menu", "targetUrl": "https://example.com/menu"});
        assert!(parse_create(&ok).is_ok());
        assert!(parse_create(&json!({"kind": "robot", "name": "AMR-7"})).is_ok());
        for (body, field) in [
            (json!({"name": "x"}), "kind"),
            (json!({"kind": "nfc", "name": "x"}), "kind"),
            (json!({"kind": "robot"}), "name"),
            (json!({"kind": "robot", "name": ""}), "name"),
            (json!({"kind": "qr_code", "name": "x"}), "targetUrl"),
            (
                json!({"kind": "qr_code", "name": "x", "targetUrl": "javascript:alert(1)"}),
                "targetUrl",
            ),
            (json!({"kind": "barcode", "name": "x", "code": "a b"}), "code"),
            (json!({"kind": "robot", "name": "x", "includeQrSvg": "yes"}), "includeQrSvg"),
            (json!({"kind": "robot", "name": "x", "eventName": ""}), "eventName"),
            (json!({"kind": "robot", "name": "x", "colour": "red"}), "colour"),
            (json!({"kind": 5, "name": "x"}), "kind"),
        ] {
            assert_eq!(field_of(body.clone()).as_deref(), Some(field), "{body}");
        }
    }

    #[test]
    fn unknown_kind_lists_the_kinds() {
        match parse_create(&json!({"kind": "nfc", "name": "x"})) {
            Err(Error::Validation { message, .. }) => {
                for kind in TrackableKind::ALL {
                    assert!(message.contains(kind.as_str()), "{message}");
                }
            }
            other => panic!("{:?}", other.map(|_| ())),
        }
    }
}
