//! What the store keeps for gateway delivery: per gateway, the session
//! epoch and the cumulative acknowledgement.
//!
//! The acknowledgement only advances inside the same transaction that
//! stores the batch's events, so "acked" always means "durably stored".
//! Event ids are unique per workspace as well, so even a batch that slipped
//! past the sequence checks could not store an event twice.

use async_trait::async_trait;

use super::NewEvent;
use crate::error::Result;

/// A gateway's delivery state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GatewaySession {
    /// Bumped by every Hello; batches of an older epoch are fenced.
    pub epoch: u64,
    /// Highest sequence durably stored (0: none).
    pub acked_sequence: u64,
}

/// What committing a batch did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchCommit {
    /// Stored (or already stored); the new cumulative ack.
    Acked { acked_sequence: u64, inserted: usize },
    /// A newer session of this gateway exists; nothing was stored.
    Fenced { current_epoch: u64 },
    /// The batch starts past `acked_sequence + 1`: an earlier batch is still
    /// missing. Nothing was stored; the caller may wait and retry.
    Gap { acked_sequence: u64 },
}

#[async_trait]
pub trait GatewayStore: Send + Sync {
    /// Opens a session: bumps and returns the epoch with the current ack.
    /// A `buffer_id` other than the stored one means the gateway's buffer
    /// was recreated and its sequences start over: the ack restarts at 0
    /// (event ids keep what was stored from being stored again). An empty
    /// `buffer_id` (an older gateway) changes nothing.
    async fn open_gateway_session(
        &self,
        workspace_id: &str,
        gateway_id: &str,
        buffer_id: &str,
    ) -> Result<GatewaySession>;

    /// Stores the events of a batch covering `first..=last` whose sequences
    /// are above the current ack, and advances the ack to `last`, all in one
    /// transaction, provided `epoch` is current and the range joins the
    /// stored prefix (`first <= acked + 1`).
    async fn commit_gateway_batch(
        &self,
        workspace_id: &str,
        gateway_id: &str,
        epoch: u64,
        range: (u64, u64),
        events: Vec<(u64, NewEvent)>,
    ) -> Result<BatchCommit>;
}
