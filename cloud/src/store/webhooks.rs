//! Webhooks in the [`Store`](super::Store) seam: the subscriptions of a
//! workspace (URL, event kinds, signing secret) and the log of every
//! delivery attempt. Delivering is [`crate::webhooks`]'s job; the store
//! only keeps what it is given, scoped to a workspace like everything else.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::error::Result;

/// A subscription as stored, secret included: signing needs the secret
/// itself, so it is kept as given (like the signing secrets of other
/// webhook senders) and never shown by the API.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Webhook {
    /// `whk_...`
    pub id: String,
    pub url: String,
    /// Event kinds delivered, e.g. `enforcement.decided`.
    pub events: Vec<String>,
    pub secret: String,
    pub created_at: i64,
}

/// One attempt to deliver one event to one webhook.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct WebhookAttempt {
    /// `whd_...`: the delivery, the same on every attempt (sent as
    /// `X-Opgraph-Delivery` and `Idempotency-Key`, so a receiver can drop
    /// a repeat).
    pub delivery_id: String,
    pub webhook_id: String,
    /// The event kind, e.g. `enforcement.decided`.
    pub event: String,
    /// What the event is about: a receipt's or an export receipt's id.
    pub subject: String,
    /// 1 for the first try.
    pub attempt: u32,
    /// `succeeded` (a 2xx answer) or `failed`.
    pub status: String,
    /// HTTP status of the answer; absent when none came.
    pub response_status: Option<u16>,
    pub error: Option<String>,
    /// When the next attempt is due (ms since the epoch); absent when this
    /// attempt succeeded or was the last.
    pub next_attempt_at: Option<i64>,
    /// SHA-256 of the exact bytes sent, the same on every attempt.
    pub payload_hash: String,
    pub created_at: i64,
}

/// A delivery not finished yet: what a restarted process needs to carry
/// on with it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PendingDelivery {
    pub delivery_id: String,
    pub webhook_id: String,
    pub event: String,
    pub subject: String,
    /// The exact JSON sent on every attempt.
    pub payload: String,
    /// Attempts made so far.
    pub attempts: u32,
    /// When the next attempt is due, ms since the epoch.
    pub due_at: i64,
    /// The cloud process carrying the delivery on (its instance id, new
    /// at every start); empty in rows written before processes had one.
    #[serde(default)]
    pub owner: String,
    /// Until when (ms since the epoch) the owner holds it: past its next
    /// attempt's due time by `webhooks.lease`. Other processes sharing the
    /// store leave it alone until then.
    #[serde(default)]
    pub held_until: i64,
}

#[async_trait]
pub trait WebhookStore: Send + Sync {
    /// Stores a new webhook.
    async fn insert_webhook(&self, ws: &str, webhook: &Webhook) -> Result<()>;
    /// The workspace's webhooks not deleted, oldest first, at most `limit`.
    async fn list_webhooks(&self, ws: &str, limit: usize) -> Result<Vec<Webhook>>;
    /// The workspaces that have a webhook not deleted: where the anomaly
    /// watcher looks. Operational, across workspaces, like the workspace
    /// count: ids only, never a webhook.
    async fn workspaces_with_webhooks(&self) -> Result<Vec<String>>;
    /// `false` when `ws` has no webhook `id` not deleted already.
    async fn delete_webhook(&self, ws: &str, id: &str, at_ms: i64) -> Result<bool>;
    async fn insert_webhook_attempt(&self, ws: &str, attempt: &WebhookAttempt) -> Result<()>;
    /// Stores (or replaces) a delivery still to be made.
    async fn save_pending_delivery(&self, ws: &str, pending: &PendingDelivery) -> Result<()>;
    /// The delivery is over (delivered, given up, or its webhook gone).
    async fn finish_pending_delivery(&self, ws: &str, delivery_id: &str) -> Result<()>;
    /// Deliveries not finished, across workspaces (what a starting process
    /// resumes), the earliest due first, at most `limit`.
    async fn pending_deliveries(&self, limit: usize) -> Result<Vec<(String, PendingDelivery)>>;
    /// One delivery not finished, as last saved; `None` once finished.
    async fn pending_delivery(
        &self,
        ws: &str,
        delivery_id: &str,
    ) -> Result<Option<PendingDelivery>>;
    /// Whether other cloud processes may be delivering from this store at
    /// the same time (a shared ClickHouse). The embedded store's data
    /// directory is locked by one process, so anything pending there that
    /// this process is not sending was left by an earlier one.
    fn shared_between_processes(&self) -> bool {
        false
    }
    /// Retention: deletes the attempts logged before `before_ms` and the
    /// deliveries due (or finished) before it, at most about `limit` rows.
    /// Answers how many rows went, or `None` when the store deletes in the
    /// background and cannot tell (ClickHouse mutations).
    async fn prune_webhook_log(&self, before_ms: i64, limit: usize) -> Result<Option<u64>>;
    /// Attempts of one webhook, newest first.
    async fn list_webhook_attempts(
        &self,
        ws: &str,
        webhook_id: &str,
        limit: usize,
    ) -> Result<Vec<WebhookAttempt>>;
}

/// A webhook for the stores' own tests, its secret `s3cret-to-forget`.
#[cfg(test)]
pub(crate) fn test_webhook(id: &str) -> Webhook {
    Webhook {
        id: id.to_owned(),
        url: format!("https://hooks.example/{id}"),
        events: vec!["enforcement.decided".into()],
        secret: "s3cret-to-forget".into(),
        created_at: 1,
    }
}
