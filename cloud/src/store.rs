//! The `Store` seam: everything the cloud keeps, behind one trait, so that
//! the embedded default and ClickHouse answer the same calls.
//!
//! Every call that touches tenant data takes the workspace id first; there is
//! no way to ask the store for "all events" across workspaces.

pub mod clickhouse;
pub mod columns;
#[cfg(any(test, feature = "conformance"))]
pub mod conformance;
pub mod connectors;
pub mod embedded;
pub mod gateway;
pub mod governance;
pub mod queries;
pub mod trackables;
pub mod webhooks;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::auth::Scope;
use crate::error::{Error, Result};
use connectors::ConnectorStore;
use gateway::GatewayStore;
use governance::GovernanceStore;
use queries::QueryStore;
use trackables::TrackableStore;
use webhooks::WebhookStore;

/// An event accepted by an ingest path, ready to be stored.
#[derive(Debug, Clone)]
pub struct NewEvent {
    /// `evt_...`, assigned at first acceptance (by the cloud for HTTP, by the
    /// gateway for batches). Storing the same id twice stores it once.
    pub id: String,
    /// Server receive time, ms since the epoch.
    pub received_at: i64,
    /// The envelope with defaults applied (`timestamp`, `businessId`,
    /// `trustTier` always present).
    pub event: opgraph_proto::Event,
}

/// One ingest call: all of it is stored, or none of it.
#[derive(Debug, Clone, Default)]
pub struct AppendRequest {
    pub events: Vec<NewEvent>,
    /// `Idempotency-Key`: a retry within [`IDEMPOTENCY_WINDOW_MS`] returns the
    /// first answer and stores nothing.
    pub idempotency_key: Option<IdempotencyKey>,
    /// The most events this call may add (what is left of the monthly
    /// quota); more refuses the whole call with `quota_exceeded`. Replays
    /// add nothing, so a retry is answered however little is left.
    pub new_event_limit: Option<u64>,
}

pub const IDEMPOTENCY_WINDOW_MS: i64 = 24 * 60 * 60 * 1000;

/// An `Idempotency-Key` and the request it came with. A key names one
/// call: the same key with another body is refused as a conflict, not
/// answered as a replay, which would drop the new events without a word.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencyKey {
    pub key: String,
    /// SHA-256 of the request body's canonical JSON, so that a retry that
    /// orders its keys differently is still the same request.
    pub request_hash: String,
}

impl IdempotencyKey {
    pub fn new(key: String, body: &Value) -> IdempotencyKey {
        IdempotencyKey { key, request_hash: crate::governance::hash::canonical_hash(body) }
    }

    /// What the store keeps under the key: the first answer's ids and the
    /// request they answered.
    pub fn kept(&self, ids: &[String]) -> Result<String> {
        serde_json::to_string(&Kept { ids: ids.to_vec(), request: Some(self.request_hash.clone()) })
            .map_err(Error::internal)
    }

    /// The first answer's ids from what [`Self::kept`] stored, or a
    /// conflict when it answered another request. Rows kept before the
    /// request was (a bare list of ids) are answered as replays.
    pub fn replay(&self, kept: &str) -> Result<Vec<String>> {
        let kept: Kept = match serde_json::from_str::<Vec<String>>(kept) {
            Ok(ids) => Kept { ids, request: None },
            Err(_) => serde_json::from_str(kept).map_err(Error::internal)?,
        };
        match kept.request {
            Some(request) if request != self.request_hash => Err(Error::Conflict(format!(
                "Idempotency-Key {:?} was used within 24 h for another request; a key names one \
                 call, so send new events under a new key",
                self.key
            ))),
            _ => Ok(kept.ids),
        }
    }
}

/// Tests name a key alone: the request is then an empty body.
#[cfg(any(test, feature = "conformance"))]
impl From<&str> for IdempotencyKey {
    fn from(key: &str) -> IdempotencyKey {
        IdempotencyKey::new(key.to_owned(), &Value::Null)
    }
}

#[derive(Serialize, Deserialize)]
struct Kept {
    ids: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    request: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppendResult {
    /// The id of each request event, in order; for a replay (same
    /// `messageId`, same id, same `Idempotency-Key`) the id stored first.
    pub ids: Vec<String>,
    /// How many rows this call actually added.
    pub inserted: usize,
}

/// Filters of `GET /api/events`; all optional but the limit.
#[derive(Debug, Clone, Default)]
pub struct EventFilter {
    pub limit: usize,
    pub event: Option<String>,
    pub trace_id: Option<String>,
    pub business_id: Option<String>,
    pub from: Option<i64>,
    pub to: Option<i64>,
}

/// A stored event as the API shows it: the envelope plus `id` and
/// `receivedAt`.
#[derive(Debug, Clone)]
pub struct StoredEvent {
    pub id: String,
    pub received_at: i64,
    pub envelope: Value,
}

impl StoredEvent {
    pub fn into_json(self) -> Value {
        let mut value = self.envelope;
        if let Value::Object(map) = &mut value {
            map.insert("id".into(), Value::String(self.id));
            map.insert("receivedAt".into(), Value::from(self.received_at));
        }
        value
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workspace {
    pub id: String,
    pub name: String,
    pub created_at: i64,
}

/// A key as stored: never the secret, only its hash and a short hint.
#[derive(Debug, Clone)]
pub struct ApiKeyRecord {
    pub id: String,
    pub workspace_id: String,
    pub name: String,
    pub hint: String,
    pub scopes: Vec<Scope>,
    pub created_at: i64,
    pub revoked_at: Option<i64>,
}

#[derive(Debug, Clone)]
pub struct NewApiKey {
    pub record: ApiKeyRecord,
    pub hash: String,
}

/// Per-workspace counters for quotas and `/api/usage`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UsageTotals {
    pub events_ingested: u64,
    pub api_calls: u64,
}

#[async_trait]
pub trait Store:
    GovernanceStore
    + GatewayStore
    + TrackableStore
    + WebhookStore
    + ConnectorStore
    + QueryStore
    + Send
    + Sync
    + 'static
{
    /// Cheap liveness check for health; an error means the store is down.
    async fn ping(&self) -> Result<()>;

    /// What health shows about the backend beyond reachability (camelCase
    /// keys merged into the `store` check); nothing by default.
    async fn health_detail(&self) -> Value {
        Value::Null
    }

    /// Creates a workspace with its default business. Conflict if the id
    /// exists.
    async fn create_workspace(&self, workspace: &Workspace) -> Result<()>;
    async fn workspace_exists(&self, workspace_id: &str) -> Result<bool>;
    async fn count_workspaces(&self) -> Result<u64>;

    /// Stores a key. If the same hash exists already (a restart with the
    /// same bootstrap key), the stored one is kept and returned.
    async fn insert_api_key(&self, key: NewApiKey) -> Result<ApiKeyRecord>;
    /// The active (not revoked) key with this hash.
    async fn find_api_key(&self, hash: &str) -> Result<Option<ApiKeyRecord>>;
    /// The workspace's keys, oldest first, at most `limit`.
    async fn list_api_keys(&self, workspace_id: &str, limit: usize) -> Result<Vec<ApiKeyRecord>>;
    /// Revokes; `false` when the key does not exist in that workspace.
    async fn revoke_api_key(&self, workspace_id: &str, key_id: &str) -> Result<bool>;

    /// Stores all events of the request atomically and durably before
    /// returning (the caller acknowledges its client after this).
    async fn append_events(
        &self,
        workspace_id: &str,
        request: AppendRequest,
    ) -> Result<AppendResult>;
    /// Keeps `key` for [`IDEMPOTENCY_WINDOW_MS`] as naming a call that
    /// stores no events (an export): within the window the same key with
    /// another request is a conflict, and with the same request nothing
    /// changes. One namespace with the keys of [`Self::append_events`].
    async fn claim_idempotency_key(&self, workspace_id: &str, key: &IdempotencyKey) -> Result<()>;
    /// Newest first.
    async fn list_events(
        &self,
        workspace_id: &str,
        filter: &EventFilter,
    ) -> Result<Vec<StoredEvent>>;

    /// Adds to the API-call counter of the current day.
    async fn record_api_calls(&self, workspace_id: &str, day_ms: i64, calls: u64) -> Result<()>;
    /// Sums usage over `[from_ms, to_ms)`.
    async fn usage(&self, workspace_id: &str, from_ms: i64, to_ms: i64) -> Result<UsageTotals>;

    /// Flushes and releases resources; called once on shutdown.
    async fn close(&self) -> Result<()>;
}
