//! `GET /api/health` (readiness, no credential) and `GET /metrics`
//! (Prometheus, for the deployment's operator). Health reports what is
//! configured, never a secret's value.

use std::collections::HashMap;

use axum::Json;
use axum::extract::{Query, State};
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use serde::Serialize;
use serde_json::{Value, json};
use utoipa::ToSchema;

use super::AppState;
use crate::auth::{Principal, Scope};
use crate::config::StoreKind;

#[derive(Debug, Serialize, ToSchema)]
pub struct HealthReport {
    /// `ok`, `degraded` (works, but a recommended setting is missing) or
    /// `fail`.
    pub status: &'static str,
    pub version: &'static str,
    /// `store`, `config`, `integrations`, `rateLimiting`, `usageMetering`:
    /// each `{ok, required, ...details}`.
    #[schema(value_type = Object)]
    pub checks: Value,
}

struct Check {
    name: &'static str,
    ok: bool,
    /// A failed required check fails strict health.
    required: bool,
    detail: Value,
}

/// Runtime readiness. Without `strict` the answer is 200 unless the store is
/// unreachable; with `strict=1` any failed required check makes it 503.
#[utoipa::path(
    get,
    path = "/api/health",
    tag = "operations",
    params(("strict" = Option<String>, Query, description = "`1` fails (503) on any failed required check")),
    responses((status = 200, body = HealthReport), (status = 503, body = HealthReport)),
)]
pub async fn health(
    State(state): State<AppState>,
    Query(params): Query<HashMap<String, String>>,
) -> impl IntoResponse {
    let strict = params.get("strict").is_some_and(|v| v == "1" || v == "true");
    let config = &state.config;
    let store_ok = state.store.ping().await.is_ok();
    let mut store_detail = json!({
        "backend": match config.store.kind {
            StoreKind::Embedded => "embedded",
            StoreKind::Clickhouse => "clickhouse",
        },
        "reachable": store_ok,
    });
    if let (Value::Object(detail), Value::Object(more)) =
        (&mut store_detail, state.store.health_detail().await)
    {
        detail.extend(more);
    }
    let jwt = &config.auth.jwt;
    let receivers = &config.receivers;
    let rate = state.usage.rate_config();
    let checks = [
        Check { name: "store", ok: store_ok, required: true, detail: store_detail },
        Check {
            name: "config",
            // A configuration that fails its checks stops the process at
            // start (naming the key), so one that serves passed them.
            ok: true,
            required: true,
            detail: json!({
                "bootstrapKey": if config.auth.bootstrap_key.is_some() { "configured" } else { "generated" },
                "bodyLimitBytes": config.http.body_limit.as_u64(),
                // Public by design: every trackable's scan URL starts with it.
                "publicUrl": crate::api::trackables::public_base(config),
                "gatewayReceivers": {
                    "grpc": receivers.grpc_addr.is_some(),
                    "quic": receivers.quic_addr.is_some(),
                    "certificate": configured_or(receivers.tls_cert_file.is_some(), "self-signed"),
                    "clientCertificates": receivers.client_ca_file.is_some(),
                },
            }),
        },
        Check {
            name: "integrations",
            // Tokens without issuer and audience checks accept any token the
            // key signs: allowed, but strict health refuses it.
            ok: !jwt.enabled() || (jwt.issuer.is_some() && jwt.audience.is_some()),
            required: true,
            detail: json!({
                "enterpriseTokens": {
                    "enabled": jwt.enabled(),
                    "mode": state.auth.jwt_mode(),
                    "issuerConfigured": jwt.issuer.is_some(),
                    "audienceConfigured": jwt.audience.is_some(),
                },
                // Optional: without it a proof push is refused (400).
                "externalProof": {
                    "configured": config.governance.proof_url.is_some(),
                    "customCa": config.governance.proof_ca_file.is_some(),
                    "timeoutMs": millis(config.governance.proof_timeout),
                },
                "exports": {
                    "customCa": config.exports.ca_file.is_some(),
                    "privateNetworks": config.exports.allow_private_networks,
                    "timeoutMs": millis(config.exports.timeout),
                },
                "webhooks": {
                    "maxAttempts": config.webhooks.max_attempts,
                    "retryBaseMs": millis(config.webhooks.retry_base),
                    "anomalyIntervalMs": millis(config.webhooks.anomaly_interval),
                    "outstanding": state.webhooks.outstanding(),
                },
            }),
        },
        Check {
            name: "rateLimiting",
            ok: rate.requests_per_second > 0,
            required: true,
            detail: json!({
                "enabled": rate.requests_per_second > 0,
                "requestsPerSecond": rate.requests_per_second,
                "burst": rate.burst,
            }),
        },
        Check {
            name: "usageMetering",
            ok: true,
            required: false,
            detail: json!({
                "enabled": true,
                "monthlyEventQuota": state.usage.quota_config().monthly_event_quota,
            }),
        },
    ];
    let required_failed = checks.iter().any(|c| c.required && !c.ok);
    let status = if !store_ok {
        "fail"
    } else if required_failed {
        if strict { "fail" } else { "degraded" }
    } else {
        "ok"
    };
    let code = if status == "fail" { StatusCode::SERVICE_UNAVAILABLE } else { StatusCode::OK };
    let mut map = serde_json::Map::new();
    for check in checks {
        let mut detail = check.detail;
        if let Value::Object(fields) = &mut detail {
            fields.insert("ok".into(), Value::Bool(check.ok));
            fields.insert("required".into(), Value::Bool(check.required));
        }
        map.insert(check.name.into(), detail);
    }
    let report =
        HealthReport { status, version: env!("CARGO_PKG_VERSION"), checks: Value::Object(map) };
    (code, Json(report))
}

/// `"configured"`, or what stands in for the setting.
fn configured_or(configured: bool, default: &'static str) -> &'static str {
    if configured { "configured" } else { default }
}

fn millis(duration: std::time::Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// Prometheus text exposition. The series are the node's, across every
/// workspace, so they are the operator's (the bootstrap key's `operator`
/// scope), not any workspace's.
#[utoipa::path(
    get,
    path = "/metrics",
    tag = "operations",
    responses(
        (status = 200, description = "Prometheus text format", content_type = "text/plain"),
        (status = 401, body = crate::error::ErrorBody),
        (status = 403, description = "The credential lacks the `operator` scope", body = crate::error::ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn metrics(
    State(state): State<AppState>,
    principal: Principal,
) -> crate::error::Result<impl IntoResponse> {
    principal.require(Scope::Operator)?;
    Ok((
        [(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")],
        state.metrics.render(),
    ))
}
