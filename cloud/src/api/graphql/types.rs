//! The GraphQL output and input types that are not shared with the REST
//! endpoints (those derive `SimpleObject` where they are defined).

use async_graphql::{ComplexObject, InputObject, Object, SimpleObject};
use serde_json::Value;

use crate::intelligence::{HealthComponents, NextAction};
use crate::store::queries::{Attribution, EventTotals, MetricDefinition, RunSummary};

/// A stored event: the envelope plus `id` and `receivedAt`.
pub struct Event(pub(super) Value);

impl Event {
    fn text(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(Value::as_str)
    }

    fn json(&self, key: &str) -> Option<async_graphql::Json<Value>> {
        self.0.get(key).cloned().map(async_graphql::Json)
    }

    /// `actor`/`object` id: the string form, or the object's `id`.
    fn party_id(&self, key: &str) -> Option<&str> {
        match self.0.get(key)? {
            Value::String(s) => Some(s),
            Value::Object(map) => map.get("id").and_then(Value::as_str),
            _ => None,
        }
    }
}

#[Object]
impl Event {
    async fn id(&self) -> Option<&str> {
        self.text("id")
    }
    async fn event(&self) -> Option<&str> {
        self.text("event")
    }
    async fn business_id(&self) -> Option<&str> {
        self.text("businessId")
    }
    async fn trace_id(&self) -> Option<&str> {
        self.text("traceId")
    }
    async fn decision_id(&self) -> Option<&str> {
        self.text("decisionId")
    }
    async fn proof_id(&self) -> Option<&str> {
        self.text("proofId")
    }
    async fn trust_tier(&self) -> Option<&str> {
        self.text("trustTier")
    }
    /// Event time, ms since the epoch.
    async fn timestamp(&self) -> Option<i64> {
        self.0.get("timestamp").and_then(Value::as_i64)
    }
    async fn received_at(&self) -> Option<i64> {
        self.0.get("receivedAt").and_then(Value::as_i64)
    }
    async fn actor_id(&self) -> Option<&str> {
        self.party_id("actor")
    }
    async fn object_id(&self) -> Option<&str> {
        self.party_id("object")
    }
    async fn actor(&self) -> Option<async_graphql::Json<Value>> {
        self.json("actor")
    }
    async fn object(&self) -> Option<async_graphql::Json<Value>> {
        self.json("object")
    }
    async fn properties(&self) -> Option<async_graphql::Json<Value>> {
        self.json("properties")
    }
    async fn source(&self) -> Option<async_graphql::Json<Value>> {
        self.json("source")
    }
    async fn attribution(&self) -> Option<async_graphql::Json<Value>> {
        self.json("attribution")
    }
    async fn outcome(&self) -> Option<async_graphql::Json<Value>> {
        self.json("outcome")
    }
    async fn context(&self) -> Option<async_graphql::Json<Value>> {
        self.json("context")
    }
    async fn trackable(&self) -> Option<async_graphql::Json<Value>> {
        self.json("trackable")
    }
    async fn entity(&self) -> Option<async_graphql::Json<Value>> {
        self.json("entity")
    }
    /// The whole envelope as JSON.
    async fn envelope(&self) -> async_graphql::Json<Value> {
        async_graphql::Json(self.0.clone())
    }
}

#[derive(SimpleObject)]
pub struct TrackingPlan {
    pub(super) id: String,
    pub(super) name: String,
    pub(super) vertical: String,
    pub(super) description: Option<String>,
    /// Event names, or objects with an `event`.
    pub(super) events: async_graphql::Json<Vec<Value>>,
    pub(super) created_at: i64,
}

#[derive(SimpleObject)]
pub struct MetricValue {
    pub(super) definition: MetricDefinition,
    pub(super) count: u64,
    pub(super) value: f64,
}

#[derive(SimpleObject)]
pub struct Bucket {
    pub(super) bucket: i64,
    pub(super) count: u64,
    pub(super) revenue: f64,
}

#[derive(SimpleObject)]
pub struct Metrics {
    pub(super) from: i64,
    pub(super) to: i64,
    pub(super) metrics: Vec<EventTotals>,
    pub(super) total_events: u64,
    pub(super) total_revenue: f64,
    pub(super) series: Option<Vec<Bucket>>,
    pub(super) definitions: Vec<MetricValue>,
}

#[derive(InputObject)]
pub struct FunnelStepInput {
    /// Label; default the event name.
    pub(super) name: Option<String>,
    pub(super) event: String,
}

#[derive(SimpleObject)]
pub struct FunnelStep {
    pub(super) name: String,
    pub(super) event: String,
    pub(super) count: u64,
    pub(super) conversion_rate: f64,
    pub(super) drop_off: u64,
}

#[derive(SimpleObject)]
pub struct Funnel {
    pub(super) steps: Vec<FunnelStep>,
    pub(super) window_ms: i64,
    pub(super) from: i64,
    pub(super) to: i64,
}

#[derive(SimpleObject)]
#[graphql(complex)]
pub struct BusinessHealth {
    pub(super) business_id: String,
    pub(super) health_score: u32,
    pub(super) health_components: HealthComponents,
    pub(super) revenue: f64,
    pub(super) scans: u64,
    pub(super) leads: u64,
    pub(super) orders: u64,
    pub(super) metrics: Vec<EventTotals>,
    pub(super) attribution: Attribution,
    pub(super) alerts: Vec<HealthAlert>,
    pub(super) workflows: Vec<RunSummary>,
    pub(super) next_actions: Vec<NextAction>,
    #[graphql(skip)]
    pub(super) recent: Vec<Value>,
}

#[ComplexObject]
impl BusinessHealth {
    async fn recent_events(&self) -> Vec<Event> {
        self.recent.iter().cloned().map(Event).collect()
    }
}

#[derive(SimpleObject)]
pub struct HealthAlert {
    pub(super) kind: String,
    pub(super) severity: String,
    pub(super) message: String,
    pub(super) at: Option<i64>,
}

#[derive(SimpleObject)]
pub struct AgentPerformance {
    pub(super) agent_id: String,
    /// `actor.type` of its latest events.
    pub(super) agent_type: Option<String>,
    pub(super) events: u64,
    pub(super) revenue: f64,
    pub(super) first_seen: Option<i64>,
    pub(super) last_seen: Option<i64>,
    pub(super) runs: u64,
    pub(super) completed_runs: u64,
    pub(super) failed_runs: u64,
    pub(super) running_runs: u64,
    /// completed / (completed + failed); `null` without finished runs.
    pub(super) success_rate: Option<f64>,
    /// Its most recent runs, at most `limit`.
    pub(super) recent_runs: Vec<RunSummary>,
}

#[derive(SimpleObject)]
pub struct WorkflowStatus {
    pub(super) workflow_id: String,
    /// `completed`, `failed` or `running`.
    pub(super) status: String,
    pub(super) kind: String,
    pub(super) started_at: i64,
    pub(super) updated_at: i64,
    pub(super) events: u64,
    pub(super) last_event: String,
    pub(super) actor_id: Option<String>,
    /// The run's events, oldest first (at most 1000).
    pub(super) timeline: Vec<Event>,
}

#[derive(SimpleObject)]
pub struct DecisionObject {
    pub(super) id: String,
    pub(super) title: String,
    pub(super) status: String,
    pub(super) risk_level: String,
    pub(super) description: Option<String>,
    pub(super) owner: Option<String>,
    pub(super) trace_id: Option<String>,
    pub(super) expires_at: Option<i64>,
    pub(super) created_at: i64,
    pub(super) updated_at: i64,
}

#[derive(SimpleObject)]
pub struct EnforcementReceipt {
    pub(super) id: String,
    pub(super) outcome: String,
    pub(super) writer: String,
    pub(super) sequence: i64,
    pub(super) prev_hash: String,
    pub(super) content_hash: String,
    pub(super) created_at: i64,
    pub(super) trace_id: Option<String>,
    pub(super) decision_object_id: Option<String>,
    /// The whole receipt (checks, proposed action, attestations).
    pub(super) receipt: async_graphql::Json<Value>,
}

#[derive(SimpleObject)]
pub struct ProofTrail {
    pub(super) id: String,
    pub(super) title: String,
    pub(super) root_hash: String,
    pub(super) item_count: u64,
    pub(super) created_at: i64,
}

#[derive(SimpleObject)]
pub struct GraphEntity {
    #[graphql(name = "type")]
    pub(super) kind: String,
    pub(super) id: String,
    pub(super) name: Option<String>,
    pub(super) properties: async_graphql::Json<Value>,
    pub(super) first_seen: i64,
    pub(super) last_seen: i64,
}
