//! The HTTP API: shared state, the extractors every handler uses
//! (credential → [`Principal`], JSON body with its limits), the route table
//! and the metrics middleware. One file per group of endpoints below.
//!
//! Every route is added through [`Routes`], which remembers it, so a test can
//! check that each one is described in the OpenAPI document.

pub mod connectors;
pub mod enforce;
pub mod events;
pub mod exports;
pub mod governance;
pub mod graphql;
pub mod health;
pub mod ingest;
pub mod intelligence;
pub mod keys;
pub mod metrics;
pub mod openapi;
pub mod proofs;
pub mod queries;
pub mod scan;
pub mod trackables;
pub mod tracking_plans;
pub mod webhooks;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::body::Body;
use axum::extract::{FromRequest, FromRequestParts, MatchedPath, Request, State};
use axum::handler::Handler;
use axum::http::request::Parts;
use axum::http::{Method, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodFilter, on};
use serde_json::Value;

use crate::auth::{Authenticator, Principal};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::store::Store;
use crate::telemetry::{Metrics, RequestLabels, RouteLabels};
use crate::usage::Usage;

/// What every handler can reach.
#[derive(Clone)]
pub struct AppState {
    pub config: Arc<Config>,
    pub store: Arc<dyn Store>,
    pub auth: Arc<Authenticator>,
    pub usage: Arc<Usage>,
    pub metrics: Arc<Metrics>,
    /// The public scan redirect's rate limiter and IP salt.
    pub scans: Arc<scan::ScanGuard>,
    pub webhooks: Arc<crate::webhooks::Webhooks>,
}

/// Authenticates, then applies the workspace's rate limit. Handlers that take
/// a `Principal` are therefore authenticated and metered.
impl FromRequestParts<AppState> for Principal {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self> {
        let principal = state.auth.authenticate(&parts.headers, state.store.as_ref()).await?;
        if let Err(e) = state.usage.admit(&principal.workspace_id) {
            state.metrics.reject(e.code());
            return Err(e);
        }
        Ok(principal)
    }
}

/// A JSON body as a raw `serde_json::Value`, after the checks that come
/// before parsing: `Content-Type` (415) and the size limit (413, decided on
/// `Content-Length` when present, else while reading).
pub struct JsonBody(pub Value);

impl FromRequest<AppState> for JsonBody {
    type Rejection = Error;

    async fn from_request(req: Request, state: &AppState) -> Result<Self> {
        let limit = usize::try_from(state.config.http.body_limit.as_u64()).unwrap_or(usize::MAX);
        let is_json = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next())
            .is_some_and(|mime| {
                let mime = mime.trim();
                mime.eq_ignore_ascii_case("application/json")
                    || (mime.starts_with("application/") && mime.ends_with("+json"))
            });
        if !is_json {
            state.metrics.reject("unsupported_media_type");
            return Err(Error::UnsupportedMediaType);
        }
        let unread = |error| {
            state.metrics.reject(opgraph_proto::serve::BodyReadError::code(error));
            Error::Body { error, limit }
        };
        opgraph_proto::serve::check_declared_length(req.headers(), limit).map_err(unread)?;
        let read = opgraph_proto::serve::read_body(req.into_body(), limit).await;
        let bytes = read.map_err(unread)?;
        serde_json::from_slice(&bytes).map(JsonBody).map_err(|e| {
            state.metrics.reject("invalid_json");
            Error::InvalidJson(e.to_string())
        })
    }
}

/// The one parameter of a route such as `/api/trackables/{id}`. axum's own
/// `Path` answers a segment that does not decode to UTF-8 (`%FF`) with a
/// plain-text 400; this answers it with the error shape, like any bad input.
pub struct PathId(pub String);

impl<S: Send + Sync> FromRequestParts<S> for PathId {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self> {
        match axum::extract::Path::<String>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path(id)) => Ok(PathId(id)),
            Err(rejection) => Err(Error::validation("id", rejection.body_text())),
        }
    }
}

/// The body as a JSON object; anything else is a 400 about the whole
/// body (no `field`: there is no path to name).
pub fn object_body(body: &Value) -> Result<&serde_json::Map<String, Value>> {
    body.as_object().ok_or_else(|| Error::Validation {
        field: None,
        message: "the body must be a JSON object".to_owned(),
    })
}

/// Reads an optional string field of a JSON object body.
pub fn optional_str<'a>(body: &'a Value, field: &str) -> Result<Option<&'a str>> {
    match body.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(Error::validation(field, format!("`{field}` must be a string"))),
    }
}

/// `limit` of list endpoints: default 100, clamped to 1000, and a 400 for
/// anything but a non-negative integer.
pub fn parse_limit(raw: Option<&str>) -> Result<usize> {
    parse_limit_in(raw, 100, 1000)
}

/// A `limit` with an endpoint's own default and most, read as
/// [`parse_limit`] reads it.
pub fn parse_limit_in(raw: Option<&str>, default: usize, max: usize) -> Result<usize> {
    match raw {
        None => Ok(default),
        // Digits past u64::MAX are a large limit too: clamped.
        Some(text) if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) => {
            Ok(text.parse::<u64>().map_or(max, |n| usize::try_from(n).unwrap_or(max).min(max)))
        }
        Some(_) => Err(Error::validation("limit", "`limit` must be a non-negative integer")),
    }
}

/// Refuses query parameters an endpoint does not know (a typo would
/// otherwise silently widen a query).
pub fn check_params(params: &HashMap<String, String>, known: &[&str]) -> Result<()> {
    match params.keys().find(|k| !known.contains(&k.as_str())) {
        Some(unknown) => {
            Err(Error::validation(unknown.as_str(), format!("unknown parameter `{unknown}`")))
        }
        None => Ok(()),
    }
}

/// The `limit` parameter of a list endpoint (see [`parse_limit`]).
pub fn limit_of(params: &HashMap<String, String>) -> Result<usize> {
    parse_limit(params.get("limit").map(String::as_str))
}

/// Parses an optional integer query parameter (milliseconds since epoch).
pub fn parse_ms(name: &str, raw: Option<&str>) -> Result<Option<i64>> {
    raw.map(|text| {
        text.parse::<i64>().map_err(|_| {
            Error::validation(name, format!("`{name}` must be an integer (ms since the epoch)"))
        })
    })
    .transpose()
}

/// The route table, remembering every (method, path) it serves.
pub struct Routes {
    router: Router<AppState>,
    served: Vec<(Method, &'static str)>,
}

impl Routes {
    fn new() -> Self {
        Routes { router: Router::new(), served: Vec::new() }
    }

    fn add<H, T>(mut self, method: Method, path: &'static str, handler: H) -> Self
    where
        H: Handler<T, AppState>,
        T: 'static,
    {
        let filter = match MethodFilter::try_from(method.clone()) {
            Ok(filter) => filter,
            Err(_) => return self,
        };
        self.router = self.router.route(path, on(filter, handler));
        self.served.push((method, path));
        self
    }

    /// Every (method, path) served, in the order added.
    pub fn served(&self) -> &[(Method, &'static str)] {
        &self.served
    }

    pub fn into_router(self, state: AppState) -> Router {
        self.router
            .route_layer(middleware::from_fn(contain_panics))
            .route_layer(middleware::from_fn_with_state(state.clone(), observe))
            .fallback(|| async { Error::NotFound("route".into()) })
            .method_not_allowed_fallback(|method: Method| async move {
                Error::MethodNotAllowed(method.to_string())
            })
            .with_state(state)
    }
}

/// The whole API.
pub fn routes() -> Routes {
    Routes::new()
        .add(Method::GET, "/api/health", health::health)
        .add(Method::GET, "/api/openapi", openapi::serve)
        .add(Method::GET, "/metrics", health::metrics)
        .add(Method::POST, "/api/ingest", ingest::ingest)
        .add(Method::GET, "/api/events", events::list)
        .add(Method::POST, "/api/keys", keys::create)
        .add(Method::GET, "/api/keys", keys::list)
        .add(Method::DELETE, "/api/keys/{id}", keys::revoke)
        .add(Method::POST, "/api/workspaces", keys::create_workspace)
        .add(Method::POST, "/api/trackables", trackables::create)
        .add(Method::GET, "/api/trackables", trackables::list)
        .add(Method::GET, "/api/trackables/{id}", trackables::get)
        .add(Method::POST, "/api/track", trackables::track)
        .add(Method::GET, "/r/{code}", scan::scan)
        .add(Method::POST, "/api/connectors/ingest", connectors::ingest)
        .add(Method::POST, "/api/exports/destinations", exports::push)
        .add(Method::GET, "/api/exports/receipts", exports::receipts)
        .add(Method::POST, "/api/webhooks", webhooks::create)
        .add(Method::GET, "/api/webhooks", webhooks::list)
        .add(Method::DELETE, "/api/webhooks/{id}", webhooks::delete)
        .add(Method::GET, "/api/webhooks/{id}/deliveries", webhooks::deliveries)
        .governance()
        .queries()
}

impl Routes {
    /// Governance: decision objects, grants, contracts, tracking plans,
    /// enforcement, receipts and proof trails (docs/governance.md).
    fn governance(self) -> Self {
        use governance as g;
        const DECISIONS: &str = "/api/governance/decision-objects";
        const GRANTS: &str = "/api/governance/authority-grants";
        const CONTRACTS: &str = "/api/governance/context-contracts";
        self.add(Method::POST, DECISIONS, g::create_decision)
            .add(Method::GET, DECISIONS, g::list_decisions)
            .add(Method::GET, "/api/governance/decision-objects/{id}", g::get_decision)
            .add(Method::PATCH, "/api/governance/decision-objects/{id}", g::patch_decision)
            .add(Method::POST, GRANTS, g::create_grant)
            .add(Method::GET, GRANTS, g::list_grants)
            .add(Method::GET, "/api/governance/authority-grants/{id}", g::get_grant)
            .add(Method::PATCH, "/api/governance/authority-grants/{id}", g::patch_grant)
            .add(Method::POST, CONTRACTS, g::create_contract)
            .add(Method::GET, CONTRACTS, g::list_contracts)
            .add(Method::GET, "/api/governance/context-contracts/{id}", g::get_contract)
            .add(Method::POST, "/api/governance/enforce", enforce::enforce)
            .add(Method::GET, "/api/governance/receipts", enforce::list_receipts)
            .add(Method::GET, "/api/governance/receipts/verify", enforce::verify_receipts)
            .add(Method::GET, "/api/governance/receipts/{id}", enforce::get_receipt)
            .add(Method::POST, "/api/tracking-plans", tracking_plans::create)
            .add(Method::GET, "/api/tracking-plans", tracking_plans::list)
            .add(Method::GET, "/api/tracking-plans/{id}", tracking_plans::get)
            .add(Method::POST, "/api/proof-event-trails/export", proofs::export)
            .add(Method::GET, "/api/proof-event-trails", proofs::list)
            .add(Method::GET, "/api/proof-event-trails/{id}", proofs::get)
            .add(Method::GET, "/api/proof-event-trails/{id}/verify", proofs::verify)
    }
}

impl Routes {
    /// Queries and intelligence (docs/queries.md).
    fn queries(self) -> Self {
        use {intelligence as i, metrics as m, queries as q};
        const DEFINITIONS: &str = "/api/metric-definitions";
        self.add(Method::POST, "/api/metrics/query", m::metrics)
            .add(Method::POST, DEFINITIONS, m::create_definition)
            .add(Method::GET, DEFINITIONS, m::list_definitions)
            .add(Method::GET, "/api/metric-snapshots", m::list_snapshots)
            .add(Method::POST, "/api/funnels/query", q::funnel)
            .add(Method::POST, "/api/attribution/query", q::attribution)
            .add(Method::POST, "/api/analytics/whats-changed", q::whats_changed)
            .add(Method::POST, "/api/analytics/event-search", q::event_search)
            .add(Method::GET, "/api/entities", q::list_entities)
            .add(Method::GET, "/api/relationships", q::list_relationships)
            .add(Method::GET, "/api/businesses/{id}/health", i::business_health)
            .add(Method::GET, "/api/usage", i::usage)
            .add(Method::POST, "/api/intelligence/agent-context", i::agent_context)
            .add(Method::POST, "/api/graphql", graphql::graphql)
    }
}

/// Counts and times every request by its route template.
async fn observe(State(state): State<AppState>, request: Request<Body>, next: Next) -> Response {
    let started = Instant::now();
    let method = request.method().to_string();
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |p| p.as_str().to_owned());
    let response = next.run(request).await;
    let status = response.status().as_u16();
    state
        .metrics
        .latency
        .get_or_create(&RouteLabels { route: route.clone() })
        .observe(started.elapsed().as_secs_f64());
    state.metrics.requests.get_or_create(&RequestLabels { method, route, status }).inc();
    response
}

/// Answers a handler's panic with a 500 in the error shape, counted like
/// any answer, instead of a connection closed without one. Handlers must
/// not panic on any input; this keeps a bug that slips through from
/// looking like a network failure to the client (who would retry it).
async fn contain_panics(request: Request<Body>, next: Next) -> Response {
    use std::panic::{AssertUnwindSafe, catch_unwind};
    use std::task::Poll;
    let mut handling = std::pin::pin!(next.run(request));
    // Unwind safety: the handler's state is dropped with its future; what
    // it shares (the store, caches) is behind locks that poison or is
    // left consistent by each write.
    let polled = std::future::poll_fn(|cx| {
        match catch_unwind(AssertUnwindSafe(|| handling.as_mut().poll(cx))) {
            Ok(Poll::Ready(response)) => Poll::Ready(Ok(response)),
            Ok(Poll::Pending) => Poll::Pending,
            Err(panic) => Poll::Ready(Err(panic)),
        }
    });
    match polled.await {
        Ok(response) => response,
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".to_owned());
            Error::internal(format!("handler panicked: {what}")).into_response()
        }
    }
}

impl IntoResponse for JsonBody {
    fn into_response(self) -> Response {
        axum::Json(self.0).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_limits_are_clamped_or_refused() {
        assert_eq!(parse_limit(None).unwrap(), 100);
        assert_eq!(parse_limit(Some("0")).unwrap(), 0);
        assert_eq!(parse_limit(Some("5000")).unwrap(), 1000);
        assert_eq!(parse_limit(Some("99999999999999999999999")).unwrap(), 1000);
        for bad in ["", "-5", "1.5", "x", "%ff"] {
            assert!(parse_limit(Some(bad)).is_err(), "{bad}");
        }
    }

    #[tokio::test]
    async fn a_handler_that_panics_answers_500_in_the_error_shape() {
        use tower::ServiceExt;
        async fn boom() -> &'static str {
            panic!("boom")
        }
        let router: Router = Router::new()
            .route("/boom", axum::routing::get(boom))
            .route("/fine", axum::routing::get(|| async { "fine" }))
            .route_layer(middleware::from_fn(contain_panics));
        let call = |path: &'static str| {
            let router = router.clone();
            async move {
                let request = Request::get(path).body(Body::empty()).unwrap();
                let response = router.oneshot(request).await.unwrap();
                let status = response.status();
                let body = axum::body::to_bytes(response.into_body(), 1 << 20).await.unwrap();
                (status, body)
            }
        };
        let (status, body) = call("/boom").await;
        assert_eq!(status, axum::http::StatusCode::INTERNAL_SERVER_ERROR);
        let json: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(json["error"]["code"], "internal", "{json}");
        assert_eq!(call("/fine").await.1, "fine");
    }

    #[test]
    fn limit_defaults_clamps_and_rejects() {
        assert_eq!(parse_limit(None).unwrap(), 100);
        assert_eq!(parse_limit(Some("5000")).unwrap(), 1000);
        assert_eq!(parse_limit(Some("0")).unwrap(), 0);
        assert!(parse_limit(Some("-1")).is_err());
        assert!(parse_limit(Some("1.5")).is_err());
        assert!(parse_limit(Some("ten")).is_err());
    }
}
