//! Connector records in the store: events keyed by `(provider, record id)`
//! with update semantics, and one sync record per ingest call.
//!
//! A record seen before keeps its event id; its event is replaced, not
//! added, so every query counts it once. The mapping from records to events
//! happens before the store (`crate::connectors`); the store only upserts.

use async_trait::async_trait;

use super::NewEvent;
use crate::error::Result;

/// One provider record, mapped to its event.
#[derive(Debug, Clone)]
pub struct ConnectorRecord {
    /// The provider's id of the record (e.g. a Shopify order id).
    pub record_id: String,
    /// `event.id` is used only when the record is new; a known record keeps
    /// the id of its first event.
    pub event: NewEvent,
}

/// One `POST /api/connectors/ingest` call, for usage and business health.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncRecord {
    /// `syn_...`
    pub id: String,
    pub provider: String,
    pub business_id: String,
    /// Records in the request.
    pub received: u64,
    /// Records new to the workspace; filled in by the store.
    pub ingested: u64,
    /// Records seen before, whose event was replaced; filled in by the store.
    pub updated: u64,
    /// Records refused by mapping or validation.
    pub rejected: u64,
    pub created_at: i64,
}

/// What an upsert stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectorUpsert {
    /// The event id of each record, in order (a known record's first id).
    pub ids: Vec<String>,
    pub ingested: u64,
    pub updated: u64,
}

#[async_trait]
pub trait ConnectorStore: Send + Sync {
    /// Stores the records' events (new ones added, known ones replaced under
    /// their first id) and the sync record, all in one transaction. A record
    /// id repeated within the call is an update of its earlier occurrence.
    /// More new events than `new_event_limit` (what is left of the quota)
    /// refuse the whole call; updates do not count.
    async fn upsert_connector_records(
        &self,
        workspace_id: &str,
        records: Vec<ConnectorRecord>,
        sync: SyncRecord,
        new_event_limit: Option<u64>,
    ) -> Result<ConnectorUpsert>;
    /// The latest sync records, newest first.
    async fn list_connector_syncs(
        &self,
        workspace_id: &str,
        limit: usize,
    ) -> Result<Vec<SyncRecord>>;
}
