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

impl BatchCommit {
    /// The exactly-once rule every backend applies to a batch `first..=last`
    /// sent in session `epoch`, against the stored session (`stored_epoch`,
    /// `acked`): `Err` with the answer when nothing is to be stored, or
    /// `Ok(acked)`, above which the batch's events are new.
    pub fn admit(
        stored_epoch: u64,
        acked: u64,
        epoch: u64,
        (first, last): (u64, u64),
    ) -> std::result::Result<u64, BatchCommit> {
        if stored_epoch != epoch {
            return Err(BatchCommit::Fenced { current_epoch: stored_epoch });
        }
        if first > acked.saturating_add(1) {
            return Err(BatchCommit::Gap { acked_sequence: acked });
        }
        if last <= acked {
            return Err(BatchCommit::Acked { acked_sequence: acked, inserted: 0 });
        }
        Ok(acked)
    }
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
    /// stored prefix (`first <= acked + 1`). More new events than
    /// `new_event_limit` (what is left of the monthly quota) refuse the
    /// commit with [`crate::usage::quota_exceeded`]: nothing is stored and
    /// the ack stays.
    ///
    /// Commits handed over by one task in order (each future polled once
    /// when made, then all awaited in that order) are applied in that
    /// order, even while earlier ones are still pending: a receiver may
    /// hand over a gateway's next batch before the answer for the one
    /// before it, and that batch must then find its predecessor's ack (the
    /// embedded writer's queue and ClickHouse's per-workspace lock are both
    /// first come, first served).
    async fn commit_gateway_batch(
        &self,
        workspace_id: &str,
        gateway_id: &str,
        epoch: u64,
        range: (u64, u64),
        events: Vec<(u64, NewEvent)>,
        new_event_limit: Option<u64>,
    ) -> Result<BatchCommit>;
}

#[cfg(test)]
mod tests {
    use super::BatchCommit;

    #[test]
    fn admit_fences_waits_for_gaps_and_skips_what_is_acked() {
        assert_eq!(
            BatchCommit::admit(3, 10, 2, (11, 20)),
            Err(BatchCommit::Fenced { current_epoch: 3 })
        );
        assert_eq!(
            BatchCommit::admit(3, 10, 3, (12, 20)),
            Err(BatchCommit::Gap { acked_sequence: 10 })
        );
        assert_eq!(
            BatchCommit::admit(3, 10, 3, (5, 10)),
            Err(BatchCommit::Acked { acked_sequence: 10, inserted: 0 })
        );
        // Overlapping and next batches are admitted; events above 10 are new.
        assert_eq!(BatchCommit::admit(3, 10, 3, (5, 20)), Ok(10));
        assert_eq!(BatchCommit::admit(3, 10, 3, (11, 20)), Ok(10));
        assert_eq!(
            BatchCommit::admit(1, u64::MAX, 1, (1, 5)),
            Err(BatchCommit::Acked { acked_sequence: u64::MAX, inserted: 0 })
        );
    }
}
