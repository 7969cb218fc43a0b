//! `GET /api/openapi`: the OpenAPI 3.1 document, generated from the handler
//! annotations and the types they return.

use axum::Json;
use serde::Serialize;
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::{Modify, OpenApi, ToSchema};

/// The canonical event envelope (the only required field is `event`).
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct EventEnvelope {
    /// Event name, at most 200 characters.
    pub event: String,
    pub business_id: Option<String>,
    /// A string, or `{type, id, ...}`.
    #[schema(value_type = Option<Object>)]
    pub actor: Option<serde_json::Value>,
    /// A string, or `{type, id, ...}`.
    #[schema(value_type = Option<Object>)]
    pub object: Option<serde_json::Value>,
    /// Upserts a graph entity: `{type, id, name?, properties?}`.
    #[schema(value_type = Option<Object>)]
    pub entity: Option<serde_json::Value>,
    pub trace_id: Option<String>,
    #[schema(value_type = Option<Object>)]
    pub source: Option<serde_json::Value>,
    #[schema(value_type = Option<Object>)]
    pub attribution: Option<serde_json::Value>,
    #[schema(value_type = Option<Object>)]
    pub context: Option<serde_json::Value>,
    /// `{kind, code}`.
    #[schema(value_type = Option<Object>)]
    pub trackable: Option<serde_json::Value>,
    pub decision_id: Option<String>,
    pub proof_id: Option<String>,
    #[schema(value_type = Option<Object>)]
    pub outcome: Option<serde_json::Value>,
    /// `T0` (default) to `T4`.
    pub trust_tier: Option<String>,
    #[schema(value_type = Option<Object>)]
    pub compliance_mapping: Option<serde_json::Value>,
    #[schema(value_type = Option<Object>)]
    pub properties: Option<serde_json::Value>,
    /// Event time, ms since the epoch; default the receive time.
    pub timestamp: Option<i64>,
    /// Client idempotency key.
    pub message_id: Option<String>,
}

/// Body of `POST /api/ingest`: one envelope, or a batch.
#[derive(Debug, Serialize, ToSchema)]
#[serde(untagged)]
pub enum IngestBody {
    One(Box<EventEnvelope>),
    Batch { batch: Vec<EventEnvelope> },
}

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components
            .add_security_scheme("bearer", SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)));
    }
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Opgraph API",
        description = "Events from warehouses, factories and robot fleets, as an operating graph. \
            Errors are always `{\"error\": {\"code\", \"message\", \"field\"?}}`."
    ),
    paths(
        super::health::health,
        super::health::metrics,
        serve,
        super::ingest::ingest,
        super::events::list,
        super::keys::create,
        super::keys::list,
        super::keys::revoke,
        super::keys::create_workspace,
        super::trackables::create,
        super::trackables::list,
        super::trackables::get,
        super::trackables::track,
        super::scan::scan,
        super::connectors::ingest,
        super::governance::create_decision,
        super::governance::list_decisions,
        super::governance::get_decision,
        super::governance::patch_decision,
        super::governance::create_grant,
        super::governance::list_grants,
        super::governance::get_grant,
        super::governance::patch_grant,
        super::governance::create_contract,
        super::governance::list_contracts,
        super::governance::get_contract,
        super::enforce::enforce,
        super::enforce::list_receipts,
        super::enforce::verify_receipts,
        super::enforce::get_receipt,
        super::tracking_plans::create,
        super::tracking_plans::list,
        super::tracking_plans::get,
        super::proofs::export,
        super::proofs::list,
        super::proofs::get,
        super::proofs::verify,
        super::exports::push,
        super::exports::receipts,
        super::webhooks::create,
        super::webhooks::list,
        super::webhooks::delete,
        super::webhooks::deliveries,
        super::metrics::metrics,
        super::metrics::create_definition,
        super::metrics::list_definitions,
        super::metrics::list_snapshots,
        super::queries::funnel,
        super::queries::attribution,
        super::queries::whats_changed,
        super::queries::event_search,
        super::queries::list_entities,
        super::queries::list_relationships,
        super::intelligence::business_health,
        super::intelligence::usage,
        super::intelligence::agent_context,
        super::graphql::graphql,
    ),
    components(schemas(crate::error::ErrorBody, EventEnvelope, IngestBody)),
    modifiers(&BearerAuth)
)]
pub struct ApiDoc;

/// This document.
#[utoipa::path(
    get,
    path = "/api/openapi",
    tag = "operations",
    responses((status = 200, description = "OpenAPI 3.1 JSON")),
)]
pub async fn serve() -> Json<utoipa::openapi::OpenApi> {
    Json(ApiDoc::openapi())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fails when a route is served but not described.
    #[test]
    fn every_route_is_in_the_document() {
        let doc = serde_json::to_value(ApiDoc::openapi()).unwrap();
        assert_eq!(doc["openapi"].as_str().map(|v| &v[..3]), Some("3.1"));
        let routes = crate::api::routes();
        assert!(routes.served().len() >= 9);
        for (method, path) in routes.served() {
            let op = &doc["paths"][*path][method.as_str().to_lowercase()];
            assert!(op.is_object(), "{method} {path} is missing from the OpenAPI document");
        }
    }
}
