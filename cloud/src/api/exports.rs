//! `/api/exports`: push a workspace's recent events (or records the caller
//! supplies) to a destination, with an export receipt for every push,
//! failed or not; and the list of those receipts. Reference:
//! `docs/exports.md`.
//!
//! Every destination's configuration is checked, so a missing field is a
//! 400 naming it whichever kind is asked for. The destinations: a custom
//! HTTPS endpoint (a signed `POST`), S3 (a `PUT` of one object, signed
//! with [`sigv4`], to AWS or any S3-compatible store), GCS (the same,
//! through its S3-compatible XML API), and the warehouses BigQuery,
//! Snowflake and Redshift, each through its own API (`exports/warehouses.rs`).

mod warehouses;

use std::collections::HashMap;

use axum::Json;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use hyper::Method;
use hyper::header::{HeaderName, HeaderValue};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use utoipa::ToSchema;

use super::governance::parse_body;
use super::{AppState, JsonBody};
use crate::auth::{Principal, Scope};
use crate::error::{Error, ErrorDetail, Result};
use crate::governance::hash::sha256_hex;
use crate::outbound::{self, Answer};
use crate::sigv4;
use crate::store::governance::ExportReceipt;
use crate::store::{EventFilter, IDEMPOTENCY_WINDOW_MS};
use crate::webhooks::EXPORT_FAILED;

type ErrorBody = crate::error::ErrorBody;

/// Most records in one export, events or supplied.
pub const MAX_RECORDS: usize = 1000;
/// Recent events exported when `limit` is not given.
const DEFAULT_LIMIT: usize = 100;
/// Most extra headers for an `https` destination.
const MAX_HEADERS: usize = 20;
/// Longest `secret` accepted.
const MAX_SECRET: usize = 1024;

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DestinationExport {
    /// `bigquery`, `snowflake`, `redshift`, `s3`, `gcs` or `https`.
    pub destination: String,
    /// Settings of the destination; for `https`: `{url, secret?, headers?}`.
    #[schema(value_type = Object)]
    pub config: Value,
    /// Recent events to export, newest first: default 100, 1 to 1000.
    pub limit: Option<i64>,
    /// Records to export instead of recent events: 1 to 1000 JSON objects.
    #[schema(value_type = Option<Vec<Object>>)]
    pub records: Option<Vec<Value>>,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExportAnswer {
    pub export_receipt: ExportReceipt,
}

/// A 502: the error shape, and the receipt of the failed push beside it.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct FailedExport {
    pub error: ErrorDetail,
    pub export_receipt: ExportReceipt,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExportReceiptList {
    /// Newest first: destination exports and proof-trail pushes.
    pub export_receipts: Vec<ExportReceipt>,
}

/// What an export sends.
enum Wanted {
    /// The records of the request, checked.
    Records(Vec<Value>),
    /// The workspace's newest events, at most this many.
    Events(usize),
}

/// Where a push goes, checked.
enum Destination {
    Https(Endpoint),
    S3(Bucket),
    Warehouse(warehouses::Warehouse),
}

/// The destination kinds of the contract and the config fields each needs
/// (`redshift` needs one of `clusterId` and `workgroup` besides).
const KINDS: [(&str, &[&str]); 6] = [
    ("bigquery", &["projectId", "datasetId", "tableId"]),
    ("snowflake", &["account", "database", "schema", "table"]),
    ("redshift", &["database", "table", "region"]),
    ("s3", &["bucket", "accessKeyId", "secretAccessKey"]),
    ("gcs", &["bucket", "accessKeyId", "secretAccessKey"]),
    ("https", &["url"]),
];

/// An `https` destination, checked.
struct Endpoint {
    url: String,
    secret: Option<String>,
    headers: Vec<(HeaderName, HeaderValue)>,
}

/// An `s3` destination, checked.
struct Bucket {
    /// `s3` or `gs`: how the receipt names the object.
    scheme: &'static str,
    name: String,
    /// Object keys start with it.
    prefix: String,
    /// An S3-compatible store (`https://host[:port]`, path-style); `None`:
    /// AWS, virtual-hosted.
    endpoint: Option<String>,
    credentials: sigv4::Credentials,
}

impl Bucket {
    /// The object `key`'s URL.
    fn url(&self, key: &str) -> String {
        let key = sigv4::encode_path(key);
        match &self.endpoint {
            Some(endpoint) => format!("{}/{}/{key}", endpoint.trim_end_matches('/'), self.name),
            None => {
                format!("https://{}.s3.{}.amazonaws.com/{key}", self.name, self.credentials.region)
            }
        }
    }
}

/// Checks `config` for `destination`: every required field a non-empty
/// string, the missing ones all named.
fn check_config(destination: &str, config: &Value) -> Result<&'static str> {
    let Some((kind, required)) = KINDS.iter().find(|(kind, _)| *kind == destination) else {
        let known: Vec<&str> = KINDS.iter().map(|(kind, _)| *kind).collect();
        return Err(Error::validation(
            "destination",
            format!("unknown destination {destination:?}; one of {}", known.join(", ")),
        ));
    };
    let Some(config) = config.as_object() else {
        return Err(Error::validation("config", "`config` must be a JSON object"));
    };
    let present =
        |name: &str| config.get(name).and_then(Value::as_str).is_some_and(|s| !s.trim().is_empty());
    let mut missing: Vec<&str> = required.iter().copied().filter(|name| !present(name)).collect();
    if *kind == "redshift" && !present("clusterId") && !present("workgroup") {
        missing.push("clusterId");
    }
    if let Some(first) = missing.first() {
        let names = missing.iter().map(|m| format!("`{m}`")).collect::<Vec<_>>().join(", ");
        let also = if *kind == "redshift" { " (`clusterId` or `workgroup`)" } else { "" };
        return Err(Error::validation(
            format!("config.{first}"),
            format!("the {kind} destination needs {names} in `config` as non-empty strings{also}"),
        ));
    }
    Ok(kind)
}

/// Refuses a `config` field the `kind` destination does not take: a
/// misspelt optional field would otherwise be dropped without a word.
fn only_known(config: &Map<String, Value>, kind: &str, known: &[&str]) -> Result<()> {
    match config.keys().find(|k| !known.contains(&k.as_str())) {
        Some(unknown) => Err(Error::validation(
            format!("config.{unknown}"),
            format!("unknown field `{unknown}`; the {kind} destination takes {}", known.join(", ")),
        )),
        None => Ok(()),
    }
}

/// The `https` destination's `{url, secret?, headers?}`.
fn endpoint(config: &Map<String, Value>) -> Result<Endpoint> {
    only_known(config, "https", &["url", "secret", "headers"])?;
    let url = config.get("url").and_then(Value::as_str).unwrap_or_default().trim();
    match url::Url::parse(url) {
        Ok(parsed) if parsed.scheme() == "https" && parsed.host().is_some() => {}
        _ => return Err(Error::validation("config.url", "`config.url` must be an https:// URL")),
    }
    let secret = match config.get("secret") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if !s.is_empty() && s.len() <= MAX_SECRET => Some(s.clone()),
        Some(_) => {
            return Err(Error::validation(
                "config.secret",
                format!("`config.secret` must be a string of 1 to {MAX_SECRET} bytes"),
            ));
        }
    };
    let headers = match config.get("headers") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Object(map)) if map.len() <= MAX_HEADERS => {
            map.iter().map(|(name, value)| header(name, value)).collect::<Result<_>>()?
        }
        Some(_) => {
            return Err(Error::validation(
                "config.headers",
                format!("`config.headers` must be an object of at most {MAX_HEADERS} strings"),
            ));
        }
    };
    Ok(Endpoint { url: url.to_owned(), secret, headers })
}

/// Google Cloud Storage's XML API, which speaks S3 to HMAC keys.
const GCS_ENDPOINT: &str = "https://storage.googleapis.com";

/// The `s3` (or `gcs`) destination's `{bucket, accessKeyId,
/// secretAccessKey, sessionToken?, region?, prefix?, endpoint?}`. GCS is
/// the same protocol at [`GCS_ENDPOINT`] with an HMAC key of a service
/// account, region `auto`, and underscores allowed in bucket names.
fn bucket(config: &Map<String, Value>, kind: &str) -> Result<Bucket> {
    let gcs = kind == "gcs";
    only_known(
        config,
        kind,
        &[
            "bucket",
            "accessKeyId",
            "secretAccessKey",
            "sessionToken",
            "region",
            "prefix",
            "endpoint",
        ],
    )?;
    let text = |name: &str| config.get(name).and_then(Value::as_str).map(str::trim);
    let name = text("bucket").unwrap_or_default();
    let valid_bucket = (3..=63).contains(&name.len())
        && name.bytes().all(|b| {
            b.is_ascii_lowercase()
                || b.is_ascii_digit()
                || b == b'.'
                || b == b'-'
                || (gcs && b == b'_')
        });
    if !valid_bucket {
        return Err(Error::validation(
            "config.bucket",
            format!(
                "a bucket name is 3 to 63 lower-case letters, digits, dots and hyphens{}",
                if gcs { " (and underscores)" } else { "" }
            ),
        ));
    }
    let region = text("region").unwrap_or(if gcs { "auto" } else { "us-east-1" });
    if region.is_empty()
        || region.len() > 32
        || !region.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        return Err(Error::validation("config.region", "a region looks like `eu-west-1`"));
    }
    let prefix = text("prefix").unwrap_or_default();
    // A `.` or `..` segment would be resolved away in the request's URL:
    // the object would land elsewhere than the receipt says (another
    // bucket, with a path-style endpoint).
    let dotted = prefix.split('/').any(|segment| segment == "." || segment == "..");
    if prefix.len() > 512 || prefix.starts_with('/') || dotted {
        return Err(Error::validation(
            "config.prefix",
            "a prefix is at most 512 bytes, without a leading `/` or `.`/`..` segments",
        ));
    }
    let endpoint = match endpoint_base(config)? {
        None if gcs => Some(GCS_ENDPOINT.to_owned()),
        given => given,
    };
    // Sent in headers: anything a header cannot carry is the caller's error.
    let header_text = |name: &str| -> Result<Option<String>> {
        match text(name) {
            Some(v) if HeaderValue::from_str(v).is_ok() && !v.is_empty() => Ok(Some(v.to_owned())),
            None => Ok(None),
            Some(_) => Err(Error::validation(format!("config.{name}"), "must be printable ASCII")),
        }
    };
    let credentials = sigv4::Credentials {
        access_key_id: header_text("accessKeyId")?.unwrap_or_default(),
        secret_access_key: text("secretAccessKey").unwrap_or_default().to_owned(),
        session_token: header_text("sessionToken")?,
        region: region.to_owned(),
    };
    let scheme = if gcs { "gs" } else { "s3" };
    Ok(Bucket { scheme, name: name.to_owned(), prefix: prefix.to_owned(), endpoint, credentials })
}

/// `config.endpoint` when given: an `https://host[:port]` base that
/// replaces the service's own address (an S3-compatible store, a proxy, a
/// test server).
fn endpoint_base(config: &Map<String, Value>) -> Result<Option<String>> {
    let Some(raw) = config.get("endpoint").and_then(Value::as_str).map(str::trim) else {
        return Ok(None);
    };
    match url::Url::parse(raw) {
        Ok(u)
            if u.scheme() == "https"
                && u.host().is_some()
                && u.path() == "/"
                && u.query().is_none() =>
        {
            Ok(Some(raw.trim_end_matches('/').to_owned()))
        }
        _ => Err(Error::validation(
            "config.endpoint",
            "`config.endpoint` must be https://host[:port]",
        )),
    }
}

/// One extra header; those the request itself sets are refused.
fn header(name: &str, value: &Value) -> Result<(HeaderName, HeaderValue)> {
    let field = format!("config.headers.{name}");
    let parsed = HeaderName::from_bytes(name.as_bytes())
        .map_err(|_| Error::validation(field.clone(), "not a valid header name"))?;
    const OURS: [&str; 6] = [
        "host",
        "content-type",
        "content-length",
        "transfer-encoding",
        "connection",
        "idempotency-key",
    ];
    if OURS.contains(&parsed.as_str()) || parsed.as_str().starts_with("x-opgraph-") {
        return Err(Error::validation(field, "this header is set by the export itself"));
    }
    let value = value
        .as_str()
        .and_then(|v| HeaderValue::from_str(v).ok())
        .ok_or_else(|| Error::validation(field, "must be a string valid in an HTTP header"))?;
    Ok((parsed, value))
}

/// Export recent events, or supplied records, to a destination.
#[utoipa::path(
    post, path = "/api/exports/destinations", tag = "exports",
    request_body = DestinationExport,
    params(("Idempotency-Key" = Option<String>, Header, description = "Makes a retry within 24 h push under the same export id, and answer a success again without pushing; another body under the same key is a 409")),
    responses(
        (status = 201, description = "Pushed; the export receipt", body = ExportAnswer),
        (status = 400, description = "Unknown destination, a config field missing or invalid (named in `field`), a bad `limit` or `records`", body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 403, description = "The credential lacks the `export` scope", body = ErrorBody),
        (status = 409, description = "The Idempotency-Key was used for another request", body = ErrorBody),
        (status = 413, body = ErrorBody), (status = 415, body = ErrorBody),
        (status = 429, body = ErrorBody),
        (status = 502, description = "The destination failed; the export receipt records how", body = FailedExport),
    ),
    security(("bearer" = []))
)]
pub async fn push(
    State(state): State<AppState>,
    principal: Principal,
    headers: HeaderMap,
    JsonBody(body): JsonBody,
) -> Result<Response> {
    principal.require(Scope::Export)?;
    // A key names one request: the same key with another body within 24 h
    // is a 409, never answered with the first one's receipt.
    let keyed = super::ingest::keyed_request(&headers, &body)?;
    let input: DestinationExport = parse_body(body)?;
    let kind = check_config(input.destination.trim(), &input.config)?;
    let destination = match (kind, input.config.as_object()) {
        ("https", Some(config)) => Destination::Https(endpoint(config)?),
        (kind @ ("s3" | "gcs"), Some(config)) => Destination::S3(bucket(config, kind)?),
        (kind, Some(config)) => Destination::Warehouse(warehouses::Warehouse::parse(kind, config)?),
        (_, None) => return Err(Error::validation("config", "`config` must be a JSON object")),
    };
    // Checked before the key is claimed: a refused body leaves it free.
    let wanted = match (input.records, input.limit) {
        (Some(_), Some(_)) => {
            return Err(Error::validation("limit", "give `limit` or `records`, not both"));
        }
        (Some(records), None) => Wanted::Records(supplied(records)?),
        (None, None) => Wanted::Events(DEFAULT_LIMIT),
        (None, Some(n)) if n >= 1 => {
            Wanted::Events(usize::try_from(n).unwrap_or(MAX_RECORDS).min(MAX_RECORDS))
        }
        (None, Some(_)) => return Err(Error::validation("limit", "`limit` must be at least 1")),
    };
    let ws = &principal.workspace_id;
    let now = crate::now_ms();
    let id = match &keyed {
        // The same id on every try: each destination drops a repeat by it
        // (Idempotency-Key, insertId, ClientToken, requestId, object key).
        Some(key) => {
            state.store.claim_idempotency_key(ws, key).await?;
            let named = format!("{ws}\n{}\n{}", key.key, key.request_hash);
            format!("exp_{}", &sha256_hex(named.as_bytes())[..26])
        }
        None => crate::ids::new_id("exp"),
    };
    if keyed.is_some()
        && let Some(done) = state.store.get_export_receipt(ws, &id).await?
        && done.status == "succeeded"
        && now - done.created_at < IDEMPOTENCY_WINDOW_MS
    {
        // Done already: the first answer, before any event is read, and
        // nothing sent again.
        return Ok(
            (StatusCode::CREATED, Json(ExportAnswer { export_receipt: done })).into_response()
        );
    }
    let (source, records) = match wanted {
        Wanted::Records(records) => ("records", records),
        Wanted::Events(limit) => {
            let filter = EventFilter { limit, ..EventFilter::default() };
            let events = state.store.list_events(ws, &filter).await?;
            ("events", events.into_iter().map(|e| e.into_json()).collect())
        }
    };

    let count = records.len();
    let packet = || {
        serde_json::to_vec(&json!({
            "exportId": id, "workspaceId": ws, "exportedAt": now,
            "source": source, "recordCount": count, "records": records,
        }))
        .map_err(Error::internal)
    };
    // A warehouse's 2xx answer is read further (its id, refused rows).
    let mut warehouse_answer = None;
    let (setting, method, url, headers, object, payload) = match destination {
        Destination::Https(endpoint) => {
            let payload = packet()?;
            let mut headers = endpoint.headers;
            headers.extend(outbound::signature_headers(endpoint.secret.as_deref(), now, &payload)?);
            headers.push(outbound::header("idempotency-key", &id)?);
            ("config.url", Method::POST, endpoint.url, headers, None, payload)
        }
        Destination::S3(bucket) => {
            let payload = packet()?;
            let key = format!("{}{id}.json", bucket.prefix);
            let url = bucket.url(&key);
            let parsed = url::Url::parse(&url).map_err(Error::internal)?;
            let signed = sigv4::sign_put(
                &bucket.credentials,
                &outbound::authority(&parsed),
                parsed.path(),
                "application/json",
                &payload,
                now,
            );
            let headers = signed
                .iter()
                .map(|(name, value)| outbound::header(name, value))
                .collect::<Result<Vec<_>>>()?;
            let object = format!("{}://{}/{key}", bucket.scheme, bucket.name);
            ("config.endpoint", Method::PUT, url, headers, Some(object), payload)
        }
        Destination::Warehouse(warehouse) => {
            let call = warehouse.call(&id, &records, now)?;
            warehouse_answer = Some(warehouse);
            ("config.endpoint", Method::POST, call.url, call.headers, None, call.payload)
        }
    };
    let target = outbound::Target {
        setting,
        url: &url,
        ca_file: state.config.exports.ca_file.as_deref(),
        timeout: state.config.exports.timeout,
        public_only: !state.config.exports.allow_private_networks,
    };
    let (mut receipt, answer) = deliver(id, target, method, payload, headers, count, None).await?;
    if let Some(warehouse) = warehouse_answer
        && receipt.status == "succeeded"
    {
        let (external_id, refused) = warehouse.read_answer(&answer);
        receipt.external_id = external_id;
        if let Some(refused) = refused {
            receipt.status = "failed".to_owned();
            receipt.error = Some(refused);
        }
    }
    if receipt.status == "succeeded" && object.is_some() {
        // S3 answers with an empty body: the object is what it keeps.
        receipt.external_id = object;
    }
    state.store.insert_export_receipt(ws, &receipt).await?;
    notify_failure(&state, ws, &receipt);
    if receipt.status == "succeeded" {
        return Ok(
            (StatusCode::CREATED, Json(ExportAnswer { export_receipt: receipt })).into_response()
        );
    }
    let message =
        format!("the destination failed: {}", receipt.error.as_deref().unwrap_or("no answer"));
    let error = ErrorDetail { code: "destination_failed".to_owned(), message, field: None };
    Ok((StatusCode::BAD_GATEWAY, Json(FailedExport { error, export_receipt: receipt }))
        .into_response())
}

/// Tells the workspace's webhooks (`export.failed`) when `receipt` records
/// a failure.
pub(super) fn notify_failure(state: &AppState, ws: &str, receipt: &ExportReceipt) {
    if receipt.status != "succeeded" {
        state.webhooks.notify(ws, EXPORT_FAILED, &receipt.id, || {
            serde_json::to_value(receipt).unwrap_or_default()
        });
    }
}

/// The caller's records: 1 to [`MAX_RECORDS`] JSON objects.
fn supplied(records: Vec<Value>) -> Result<Vec<Value>> {
    if records.is_empty() || records.len() > MAX_RECORDS {
        return Err(Error::validation(
            "records",
            format!("`records` must hold 1 to {MAX_RECORDS} objects"),
        ));
    }
    if let Some(i) = records.iter().position(|r| !r.is_object()) {
        return Err(Error::validation(
            format!("records[{i}]"),
            "each record must be a JSON object",
        ));
    }
    Ok(records)
}

/// Sends `payload` and describes what happened, success or failure, as
/// export receipt `id`, with the answer's body (empty when none came);
/// shared by destination exports and proof-trail pushes.
pub(super) async fn deliver(
    id: String,
    target: outbound::Target<'_>,
    method: Method,
    payload: Vec<u8>,
    mut headers: Vec<(HeaderName, HeaderValue)>,
    record_count: usize,
    proof_trail_id: Option<String>,
) -> Result<(ExportReceipt, Bytes)> {
    let request_id = crate::ids::new_id("req");
    headers.push(outbound::header("x-opgraph-request-id", &request_id)?);
    let mut receipt = ExportReceipt {
        id,
        destination: outbound::destination(target.url),
        status: "failed".to_owned(),
        request_id,
        response_status: None,
        external_id: None,
        error: None,
        payload_hash: sha256_hex(&payload),
        record_count: u64::try_from(record_count).unwrap_or(u64::MAX),
        created_at: crate::now_ms(),
        proof_trail_id,
    };
    let mut answer = Bytes::new();
    match outbound::send(target, method, Bytes::from(payload), &headers).await {
        Ok(Answer { status, body }) => {
            receipt.response_status = Some(status);
            receipt.external_id = outbound::external_id(&body);
            if (200..300).contains(&status) {
                receipt.status = "succeeded".to_owned();
            } else {
                let text: String = String::from_utf8_lossy(&body).chars().take(200).collect();
                receipt.error = Some(format!("HTTP {status}: {text}"));
            }
            answer = body;
        }
        Err(error) => {
            tracing::warn!(%error, export = %receipt.id, destination = %receipt.destination, "export failed");
            receipt.error = Some(error);
        }
    }
    Ok((receipt, answer))
}

/// Export receipts, newest first.
#[utoipa::path(
    get, path = "/api/exports/receipts", tag = "exports",
    params(("limit" = Option<u32>, Query, description = "Default 100, clamped to 1000")),
    responses(
        (status = 200, body = ExportReceiptList),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 429, body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn receipts(
    State(state): State<AppState>,
    principal: Principal,
    Query(params): Query<HashMap<String, String>>,
) -> Result<Json<ExportReceiptList>> {
    principal.require(Scope::Read)?;
    super::check_params(&params, &["limit"])?;
    let limit = super::limit_of(&params)?;
    let export_receipts =
        state.store.list_export_receipts(&principal.workspace_id, None, limit).await?;
    Ok(Json(ExportReceiptList { export_receipts }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_config_fields_are_all_named() {
        let err = check_config("bigquery", &json!({"projectId": "p"})).unwrap_err();
        let Error::Validation { field, message } = err else { panic!("{err:?}") };
        assert_eq!(field.as_deref(), Some("config.datasetId"));
        assert!(message.contains("`datasetId`, `tableId`"), "{message}");
        let err = check_config("redshift", &json!({"database": "d", "table": "t", "region": "r"}));
        assert!(format!("{:?}", err.unwrap_err()).contains("clusterId"));
        assert!(
            check_config(
                "redshift",
                &json!({"database": "d", "table": "t", "region": "r", "workgroup": "w"})
            )
            .is_ok()
        );
        assert!(check_config("ftp", &json!({})).is_err());
        assert!(check_config("s3", &json!("bucket")).is_err());
    }

    #[test]
    fn buckets_go_to_aws_or_gcs_unless_an_endpoint_is_named() {
        let config = |v: Value| v.as_object().cloned().unwrap_or_default();
        let keys = json!({"bucket": "logs_2026", "accessKeyId": "A", "secretAccessKey": "s"});
        let gcs = bucket(&config(keys.clone()), "gcs").map_err(|e| e.to_string());
        let gcs = gcs.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(gcs.url("a b.json"), "https://storage.googleapis.com/logs_2026/a%20b.json");
        assert_eq!((gcs.scheme, gcs.credentials.region.as_str()), ("gs", "auto"));
        assert!(bucket(&config(keys), "s3").is_err(), "no underscore in an S3 bucket name");
        let s3 = config(json!({"bucket": "logs", "accessKeyId": "A", "secretAccessKey": "s"}));
        let s3 = bucket(&s3, "s3").map_err(|e| e.to_string()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(s3.url("k.json"), "https://logs.s3.us-east-1.amazonaws.com/k.json");
        // Dot segments would be resolved away: another bucket than the
        // receipt names.
        for prefix in ["../other-bucket/", "a/./b/", "a/.."] {
            let dotted = config(json!({"bucket": "logs", "accessKeyId": "A",
                "secretAccessKey": "s", "prefix": prefix}));
            let field = match bucket(&dotted, "s3") {
                Err(Error::Validation { field, .. }) => field,
                _ => None,
            };
            assert_eq!(field.as_deref(), Some("config.prefix"), "{prefix}");
        }
        let dots_inside = config(json!({"bucket": "logs", "accessKeyId": "A",
            "secretAccessKey": "s", "prefix": "v1.2/..x/"}));
        assert!(bucket(&dots_inside, "s3").is_ok());
    }

    #[test]
    fn https_config_is_checked_field_by_field() {
        let config = |v: Value| v.as_object().cloned().unwrap_or_default();
        let field = |v: Value| match endpoint(&config(v)) {
            Err(Error::Validation { field, .. }) => field,
            other => panic!("{:?}", other.map(|e| e.url)),
        };
        assert_eq!(field(json!({"url": "http://x.example/"})).as_deref(), Some("config.url"));
        assert_eq!(
            field(json!({"url": "https://x.example/", "sekret": "s"})).as_deref(),
            Some("config.sekret")
        );
        assert_eq!(
            field(json!({"url": "https://x.example/", "secret": ""})).as_deref(),
            Some("config.secret")
        );
        let reserved =
            json!({"url": "https://x.example/", "headers": {"X-Opgraph-Signature": "forged"}});
        assert_eq!(field(reserved).as_deref(), Some("config.headers.X-Opgraph-Signature"));
        let bad = json!({"url": "https://x.example/", "headers": {"a b": "v"}});
        assert_eq!(field(bad).as_deref(), Some("config.headers.a b"));
        let ok = endpoint(&config(
            json!({"url": "https://x.example/in", "secret": "s", "headers": {"Authorization": "Bearer t"}}),
        ));
        let ok = ok.map_err(|e| e.to_string()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(ok.headers.len(), 1);
    }
}
