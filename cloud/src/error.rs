//! The crate's one error type, and the one place that maps it to HTTP.
//!
//! Handlers return `Result<T>`; whatever goes wrong becomes the JSON error
//! shape `{"error": {"code", "message", "field"?}}` with the status the API
//! contract assigns to that kind. Internal causes are logged here and never
//! returned to the caller.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid JSON: {0}")]
    InvalidJson(String),
    #[error("{message}")]
    Validation { field: Option<String>, message: String },
    #[error("the X-Opgraph-Workspace-ID header is required with an enterprise token")]
    MissingWorkspaceHeader,
    #[error("{0}")]
    Unauthorized(&'static str),
    #[error("{0}")]
    Forbidden(String),
    #[error("{0} not found")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    /// 413, 408 or 400: too large, too slow, or cut off.
    #[error("{}", .error.message(*.limit))]
    Body { error: opgraph_proto::serve::BodyReadError, limit: usize },
    #[error("Content-Type must be application/json")]
    UnsupportedMediaType,
    #[error("rate limit exceeded")]
    RateLimited { retry_after_secs: u64 },
    #[error("the store is unavailable")]
    Unavailable { retry_after_secs: u64 },
    #[error("{0} is not allowed on this route")]
    MethodNotAllowed(String),
    /// Anything we did not expect: logged with its cause, answered as 500
    /// without details.
    #[error("internal error: {0}")]
    Internal(String),
}

impl Error {
    pub fn validation(field: impl Into<String>, message: impl Into<String>) -> Self {
        Error::Validation { field: Some(field.into()), message: message.into() }
    }

    pub fn internal(cause: impl std::fmt::Display) -> Self {
        Error::Internal(cause.to_string())
    }

    /// Whether the same request may succeed later unchanged.
    pub fn retryable(&self) -> bool {
        matches!(self, Error::RateLimited { .. } | Error::Unavailable { .. } | Error::Internal(_))
    }

    fn status_and_code(&self) -> (StatusCode, &'static str) {
        match self {
            Error::InvalidJson(_) => (StatusCode::BAD_REQUEST, "invalid_json"),
            Error::Validation { .. } => (StatusCode::BAD_REQUEST, "validation_failed"),
            Error::MissingWorkspaceHeader => (StatusCode::BAD_REQUEST, "missing_workspace_header"),
            Error::Unauthorized(_) => (StatusCode::UNAUTHORIZED, "unauthorized"),
            Error::Forbidden(_) => (StatusCode::FORBIDDEN, "forbidden"),
            Error::NotFound(_) => (StatusCode::NOT_FOUND, "not_found"),
            Error::Conflict(_) => (StatusCode::CONFLICT, "conflict"),
            Error::Body { error, .. } => (error.status(), error.code()),
            Error::UnsupportedMediaType => {
                (StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type")
            }
            Error::RateLimited { .. } => (StatusCode::TOO_MANY_REQUESTS, "rate_limited"),
            Error::Unavailable { .. } => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
            Error::MethodNotAllowed(_) => (StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed"),
            Error::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        }
    }

    /// The machine-readable code, also used as the rejection reason label in
    /// metrics.
    pub fn code(&self) -> &'static str {
        self.status_and_code().1
    }
}

impl From<opgraph_proto::ValidationError> for Error {
    fn from(e: opgraph_proto::ValidationError) -> Self {
        Error::Validation { field: Some(e.field), message: e.message }
    }
}

/// The error body of every non-2xx answer.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ErrorDetail {
    /// Stable snake_case code, e.g. `validation_failed`.
    pub code: String,
    /// Text for a human.
    pub message: String,
    /// JSON path of the offending input, e.g. `batch[3].event`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
}

impl IntoResponse for Error {
    fn into_response(self) -> Response {
        let (status, code) = self.status_and_code();
        let message = match &self {
            Error::Internal(cause) => {
                tracing::error!(%cause, "internal error");
                "internal error".to_owned()
            }
            other => other.to_string(),
        };
        let field = match &self {
            Error::Validation { field, .. } => field.clone(),
            _ => None,
        };
        let body = ErrorBody { error: ErrorDetail { code: code.to_owned(), message, field } };
        let mut response = (status, axum::Json(body)).into_response();
        if let Error::RateLimited { retry_after_secs } | Error::Unavailable { retry_after_secs } =
            self
        {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(retry_after_secs.max(1)));
        }
        response
    }
}
