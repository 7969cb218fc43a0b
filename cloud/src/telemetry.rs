//! Prometheus metrics of the cloud, served at `GET /metrics`.
//!
//! Counters end in `_total`; label values are bounded sets (route templates,
//! not raw paths; error codes, not messages) so that a hostile client cannot
//! grow the registry.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub method: String,
    pub route: String,
    pub status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabels {
    pub route: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SourceLabels {
    pub source: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: String,
}

pub struct Metrics {
    registry: Registry,
    pub requests: Family<RequestLabels, Counter>,
    pub latency: Family<RouteLabels, Histogram>,
    pub events_ingested: Family<SourceLabels, Counter>,
    pub rejections: Family<ReasonLabels, Counter>,
    pub webhooks: Family<OutcomeLabels, Counter>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    pub outcome: String,
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("opgraph");
        let requests = Family::<RequestLabels, Counter>::default();
        let latency = Family::<RouteLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.0005, 2.0, 16))
        });
        let events_ingested = Family::<SourceLabels, Counter>::default();
        let rejections = Family::<ReasonLabels, Counter>::default();
        registry.register("http_requests", "HTTP requests answered", requests.clone());
        registry.register(
            "http_request_duration_seconds",
            "Time to answer an HTTP request",
            latency.clone(),
        );
        registry.register(
            "events_ingested",
            "Events newly stored, by ingest path",
            events_ingested.clone(),
        );
        registry.register(
            "ingest_rejections",
            "Ingest requests or events refused, by reason",
            rejections.clone(),
        );
        let webhooks = Family::<OutcomeLabels, Counter>::default();
        registry.register(
            "webhook_deliveries",
            "Webhook delivery attempts by outcome (succeeded, failed), and deliveries \
             dropped unsent (dropped)",
            webhooks.clone(),
        );
        Metrics { registry, requests, latency, events_ingested, rejections, webhooks }
    }

    pub fn reject(&self, reason: &str) {
        self.rejections.get_or_create(&ReasonLabels { reason: reason.to_owned() }).inc();
    }

    pub fn ingested(&self, source: &str, n: usize) {
        self.events_ingested
            .get_or_create(&SourceLabels { source: source.to_owned() })
            .inc_by(n as u64);
    }

    pub fn webhook(&self, outcome: &str) {
        self.webhooks.get_or_create(&OutcomeLabels { outcome: outcome.to_owned() }).inc();
    }

    /// The text exposition format.
    pub fn render(&self) -> String {
        let mut out = String::new();
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            tracing::error!(error = %e, "metrics encoding failed");
        }
        out
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}
