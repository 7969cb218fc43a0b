//! The gateway's local HTTP port (axum): `GET /health`, `GET /metrics` and
//! the local ingest endpoint (`POST /ingest`, alias `POST /api/ingest`,
//! in `http/ingest.rs`).
//!
//! Errors have the cloud's shape, `{"error": {"code", "message",
//! "field"?}}`, so that a client written against the cloud understands the
//! gateway too.

mod ingest;

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Serialize;
use serde_json::json;
use tokio::sync::{Semaphore, watch};

use crate::buffer::Buffer;
use crate::shipper::UplinkStatus;
use crate::source::SourceSet;
use crate::telemetry::Metrics;

pub use self::ingest::encode_events;

/// What the handlers share.
#[derive(Clone)]
pub struct HttpState {
    pub gateway_id: Arc<str>,
    pub buffer: Arc<dyn Buffer>,
    pub metrics: Arc<Metrics>,
    pub uplink: watch::Receiver<UplinkStatus>,
    /// Every device source's counters.
    pub sources: Arc<SourceSet>,
    /// Largest ingest body in bytes.
    pub body_limit: usize,
    /// One per ingest body being read and parsed (`http.ingest_concurrency`).
    pub ingest_permits: Arc<Semaphore>,
    /// Lower-case hex SHA-256 of each token `POST /ingest` accepts; empty,
    /// every request is accepted (`http.ingest_token_sha256`).
    pub ingest_tokens: Arc<[String]>,
}

/// The routes.
pub fn router(state: HttpState) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/ingest", post(ingest::ingest))
        .route("/api/ingest", post(ingest::ingest))
        .with_state(state)
}

/// An error answer in the cloud's shape.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    pub field: Option<String>,
    /// Seconds for `Retry-After` (503 while the disk fails).
    pub retry_after: Option<u64>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError { status, code, message: message.into(), field: None, retry_after: None }
    }
}

#[derive(Serialize)]
struct ErrorDetail<'a> {
    code: &'a str,
    message: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    field: Option<&'a str>,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let detail =
            ErrorDetail { code: self.code, message: &self.message, field: self.field.as_deref() };
        let mut response = (self.status, axum::Json(json!({ "error": detail }))).into_response();
        if let Some(secs) = self.retry_after {
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(secs.max(1)));
        }
        if self.status == StatusCode::UNAUTHORIZED {
            let bearer = HeaderValue::from_static("Bearer");
            response.headers_mut().insert(header::WWW_AUTHENTICATE, bearer);
        }
        response
    }
}

/// `GET /health`: the buffer's counters, the uplink's state, each device
/// source's (`sources`, see `source/health.rs`), and `degraded` when the
/// disk fails, the cloud cannot be reached, a source is disconnected or an
/// MQTT source stopped recognising resends. Always
/// 200: the gateway is up and keeps buffering either way; `status` says
/// `ok` or `degraded`.
async fn health(State(state): State<HttpState>) -> impl IntoResponse {
    let stats = state.buffer.stats();
    let uplink = state.uplink.borrow().clone();
    let uplink_failing = !uplink.connected && uplink.last_error.is_some();
    let degraded = stats.degraded || uplink_failing || state.sources.any_degraded();
    axum::Json(json!({
        "status": if degraded { "degraded" } else { "ok" },
        "degraded": degraded,
        "gateway_id": &*state.gateway_id,
        "version": env!("CARGO_PKG_VERSION"),
        "buffer": {
            "pending_records": stats.pending_records,
            "pending_bytes": stats.pending_bytes,
            "appended_total": stats.appended_total,
            "acked_total": stats.acked_total,
            "dropped_total": stats.dropped_total,
            "corrupt_skipped_total": stats.corrupt_skipped_total,
            "io_errors_total": stats.io_errors_total,
            "degraded": stats.degraded,
            "last_error": stats.last_error,
            "first_unacked_seq": stats.first_unacked_seq,
            "next_seq": stats.next_seq,
        },
        "uplink": uplink,
        "sources": state.sources.to_json(),
    }))
}

/// `GET /metrics`: Prometheus text format.
async fn metrics(State(state): State<HttpState>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")],
        state.metrics.render(),
    )
}
