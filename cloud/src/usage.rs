//! Per-workspace rate limiting and usage metering.
//!
//! Rate limiting is a token bucket per workspace held in memory: cheap on
//! the hot path, and good enough per node (a cluster behind a balancer
//! multiplies the limit by its node count; documented in the README).
//! API calls are counted in memory and flushed to the store every few
//! seconds and on shutdown, so metering costs no write per request. Events
//! are counted by the store in the same transaction that stores them, so
//! that count is exact.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::config::{RateLimitConfig, UsageConfig};
use crate::error::{Error, Result};
use crate::store::Store;

struct Bucket {
    tokens: f64,
    refilled: Instant,
}

pub struct Usage {
    rate: RateLimitConfig,
    quota: UsageConfig,
    buckets: Mutex<HashMap<String, Bucket>>,
    pending_calls: Mutex<HashMap<String, u64>>,
    /// Events ingested this month per workspace, cached briefly for quota
    /// checks.
    month_counts: Mutex<HashMap<String, (Instant, u64)>>,
    /// Per workspace, the part of the quota held by store calls in flight
    /// ([`QuotaHold`]).
    quota_held: Mutex<HashMap<String, u64>>,
}

/// Part of a workspace's monthly quota held for one store call, from
/// before it starts until it says how many events it stored
/// ([`QuotaHold::stored`]; dropped unsaid, after an error, it stored none).
/// Calls of this process in flight at once then cannot together pass the
/// quota, as they could if each read what is left before the others'
/// events were counted.
pub struct QuotaHold<'a> {
    usage: &'a Usage,
    workspace_id: String,
    held: u64,
}

const QUOTA_CACHE: Duration = Duration::from_secs(2);
/// [`Usage::refresh_quota`] reads again a count with less life left than
/// this, so a hold taken right after it finds the count still cached.
const QUOTA_REFRESH_MARGIN: Duration = Duration::from_millis(500);
const MAX_TRACKED: usize = 100_000;

impl Usage {
    pub fn new(rate: RateLimitConfig, quota: UsageConfig) -> Self {
        Usage {
            rate,
            quota,
            buckets: Mutex::new(HashMap::new()),
            pending_calls: Mutex::new(HashMap::new()),
            month_counts: Mutex::new(HashMap::new()),
            quota_held: Mutex::new(HashMap::new()),
        }
    }

    pub fn rate_config(&self) -> &RateLimitConfig {
        &self.rate
    }

    /// Whole requests the workspace may make right now before being
    /// limited (its bucket refilled to this instant, nothing taken); `None`
    /// when rate limiting is off.
    pub fn requests_left(&self, workspace_id: &str) -> Option<u32> {
        let rps = f64::from(self.rate.requests_per_second);
        if rps == 0.0 {
            return None;
        }
        let burst = f64::from(self.rate.burst);
        let tokens = match self.buckets.lock().ok()?.get(workspace_id) {
            Some(b) => (b.tokens + b.refilled.elapsed().as_secs_f64() * rps).min(burst),
            None => burst,
        };
        Some(tokens.max(0.0).floor() as u32)
    }

    pub fn quota_config(&self) -> &UsageConfig {
        &self.quota
    }

    /// Takes one token from the workspace's bucket, or says how long to wait.
    pub fn admit(&self, workspace_id: &str) -> Result<()> {
        if let Ok(mut calls) = self.pending_calls.lock() {
            *calls.entry(workspace_id.to_owned()).or_default() += 1;
        }
        let rps = f64::from(self.rate.requests_per_second);
        if rps == 0.0 {
            return Ok(());
        }
        let burst = f64::from(self.rate.burst);
        let mut buckets =
            self.buckets.lock().map_err(|_| Error::internal("rate limiter poisoned"))?;
        if buckets.len() >= MAX_TRACKED {
            buckets.retain(|_, b| b.refilled.elapsed() < Duration::from_secs(60));
        }
        let now = Instant::now();
        let bucket = buckets
            .entry(workspace_id.to_owned())
            .or_insert(Bucket { tokens: burst, refilled: now });
        let elapsed = now.duration_since(bucket.refilled).as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed * rps).min(burst);
        bucket.refilled = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            Ok(())
        } else {
            let wait = (1.0 - bucket.tokens) / rps;
            Err(Error::RateLimited { retry_after_secs: wait.ceil().max(1.0) as u64 })
        }
    }

    /// Holds for one store call up to `want` of the events the workspace
    /// may still store this month (what is left, less what other calls in
    /// flight hold); `None` without a quota. The call must store no more
    /// new events than [`QuotaHold::limit`]. What is left is read from a
    /// count cached for two seconds (with what this process stored since
    /// added), so other nodes may overshoot the quota by what they store
    /// in that time.
    pub async fn hold_quota(
        &self,
        store: &dyn Store,
        workspace_id: &str,
        want: u64,
    ) -> Result<Option<QuotaHold<'_>>> {
        let Some(left) = self.quota_left(store, workspace_id).await? else { return Ok(None) };
        let mut held = self.quota_held.lock().map_err(|_| Error::internal("quota poisoned"))?;
        if held.len() >= MAX_TRACKED {
            held.retain(|_, n| *n > 0);
        }
        let others = held.entry(workspace_id.to_owned()).or_default();
        let mine = want.min(left.saturating_sub(*others));
        *others += mine;
        Ok(Some(QuotaHold { usage: self, workspace_id: workspace_id.to_owned(), held: mine }))
    }

    /// Makes sure the workspace's month count is cached for at least
    /// half a second more, reading it now if need be, so that a
    /// [`Usage::hold_quota`] right after it needs no store read. The
    /// gateway receivers call it in batch order before they start each
    /// commit: a commit that had to read the count first could otherwise
    /// reach the store's queue after the next batch's (whose hold found the
    /// count another call had just cached) and be refused as out of order.
    pub async fn refresh_quota(&self, store: &dyn Store, workspace_id: &str) -> Result<()> {
        if self.quota.monthly_event_quota == 0 {
            return Ok(());
        }
        let fresh = self
            .month_counts
            .lock()
            .ok()
            .and_then(|m| m.get(workspace_id).map(|(at, _)| *at))
            .is_some_and(|at| at.elapsed() + QUOTA_REFRESH_MARGIN < QUOTA_CACHE);
        if !fresh {
            self.read_month_count(store, workspace_id).await?;
        }
        Ok(())
    }

    /// How many more events the workspace may store this month, counting
    /// nothing held; `None` without a quota.
    async fn quota_left(&self, store: &dyn Store, workspace_id: &str) -> Result<Option<u64>> {
        let quota = self.quota.monthly_event_quota;
        if quota == 0 {
            return Ok(None);
        }
        let cached = self
            .month_counts
            .lock()
            .ok()
            .and_then(|m| m.get(workspace_id).copied())
            .filter(|(at, _)| at.elapsed() < QUOTA_CACHE);
        let used = match cached {
            Some((_, used)) => used,
            None => self.read_month_count(store, workspace_id).await?,
        };
        Ok(Some(quota.saturating_sub(used)))
    }

    /// Reads the events stored this month and caches the count.
    async fn read_month_count(&self, store: &dyn Store, workspace_id: &str) -> Result<u64> {
        let now = crate::now_ms();
        let used = store.usage(workspace_id, month_start_ms(now), now).await?.events_ingested;
        if let Ok(mut m) = self.month_counts.lock() {
            if m.len() >= MAX_TRACKED {
                m.clear();
            }
            m.insert(workspace_id.to_owned(), (Instant::now(), used));
        }
        Ok(used)
    }

    /// Adds events just stored to the cached month count, so that this
    /// process's next quota check sees them without a store read.
    fn count_stored(&self, workspace_id: &str, stored: usize) {
        // Without a quota nothing reads the count: no lock on the hot path.
        if self.quota.monthly_event_quota == 0 || stored == 0 {
            return;
        }
        if let Ok(mut m) = self.month_counts.lock()
            && let Some((_, used)) = m.get_mut(workspace_id)
        {
            *used = used.saturating_add(stored as u64);
        }
    }

    /// Writes the counted API calls to the store.
    pub async fn flush(&self, store: &dyn Store) {
        let pending = match self.pending_calls.lock() {
            Ok(mut calls) => std::mem::take(&mut *calls),
            Err(_) => return,
        };
        let now = crate::now_ms();
        for (ws, calls) in pending {
            if let Err(e) = store.record_api_calls(&ws, now, calls).await {
                tracing::warn!(workspace = %ws, error = %e, "could not record API calls");
            }
        }
    }
}

impl QuotaHold<'_> {
    /// Most new events the call may store.
    pub fn limit(&self) -> u64 {
        self.held
    }

    /// The call stored `inserted` events: they count as used, and the
    /// hold is let go.
    pub fn stored(self, inserted: usize) {
        self.usage.count_stored(&self.workspace_id, inserted);
    }
}

impl Drop for QuotaHold<'_> {
    fn drop(&mut self) {
        if self.held == 0 {
            return;
        }
        if let Ok(mut held) = self.usage.quota_held.lock()
            && let Some(n) = held.get_mut(&self.workspace_id)
        {
            *n = n.saturating_sub(self.held);
        }
    }
}

/// The answer to events past the monthly quota: 429, retry in an hour.
pub fn quota_exceeded() -> Error {
    Error::RateLimited { retry_after_secs: 3600 }
}

/// Start of the calendar month (UTC) containing `ms`.
pub fn month_start_ms(ms: i64) -> i64 {
    let days = ms.div_euclid(86_400_000);
    let (year, month, _) = opgraph_proto::datetime::civil_from_days(days);
    opgraph_proto::datetime::days_from_civil(year, month, 1) * 86_400_000
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn month_start_is_the_first_at_midnight() {
        // 2026-11-22T04:34:45Z -> 2026-11-01T00:00:00Z
        assert_eq!(month_start_ms(1_795_322_085_000), 1_793_491_200_000);
        assert_eq!(month_start_ms(0), 0);
    }

    #[test]
    fn bucket_refuses_past_burst_and_says_when_to_retry() {
        let usage = Usage::new(
            RateLimitConfig { requests_per_second: 1, burst: 2 },
            UsageConfig { monthly_event_quota: 0 },
        );
        usage.admit("ws").unwrap();
        usage.admit("ws").unwrap();
        match usage.admit("ws") {
            Err(Error::RateLimited { retry_after_secs }) => assert!(retry_after_secs >= 1),
            other => panic!("expected rate limit, got {other:?}"),
        }
        assert_eq!(usage.requests_left("ws"), Some(0));
        // Other workspaces have their own bucket.
        assert_eq!(usage.requests_left("other"), Some(2));
        usage.admit("other").unwrap();
    }

    #[tokio::test]
    async fn calls_in_flight_hold_their_part_of_the_quota() {
        let (store, _dir) = crate::store::embedded::temp_store();
        let usage = Usage::new(
            RateLimitConfig { requests_per_second: 0, burst: 0 },
            UsageConfig { monthly_event_quota: 10 },
        );
        let hold = async |want| usage.hold_quota(&store, "ws", want).await.unwrap().unwrap();
        let a = hold(6).await;
        let b = hold(6).await;
        assert_eq!((a.limit(), b.limit()), (6, 4), "b gets what a does not hold");
        assert_eq!(hold(1).await.limit(), 0);
        // a failed: what it held is free again.
        drop(a);
        let c = hold(8).await;
        assert_eq!(c.limit(), 6);
        // b stored 3 of its 4, c all 6: one is left.
        b.stored(3);
        c.stored(6);
        assert_eq!(hold(5).await.limit(), 1);
        assert_eq!(usage.hold_quota(&store, "other", 20).await.unwrap().unwrap().limit(), 10);
        // Without a quota nothing is held.
        let free = Usage::new(
            RateLimitConfig { requests_per_second: 0, burst: 0 },
            UsageConfig { monthly_event_quota: 0 },
        );
        assert!(free.hold_quota(&store, "ws", 5).await.unwrap().is_none());
    }

    /// Polls `future` once: its output if it finished without waiting.
    fn poll_once<F: Future>(future: F) -> Option<F::Output> {
        let mut future = std::pin::pin!(future);
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        match future.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(out) => Some(out),
            std::task::Poll::Pending => None,
        }
    }

    /// After `refresh_quota`, a hold needs no store read: taken in order,
    /// it cannot fall behind a later one that found the count cached.
    #[tokio::test]
    async fn a_refreshed_quota_is_held_without_waiting_for_the_store() {
        let (store, _dir) = crate::store::embedded::temp_store();
        let usage = Usage::new(
            RateLimitConfig { requests_per_second: 0, burst: 0 },
            UsageConfig { monthly_event_quota: 10 },
        );
        assert!(poll_once(usage.hold_quota(&store, "ws", 1)).is_none(), "a cold count waits");
        usage.refresh_quota(&store, "ws").await.unwrap();
        let hold = poll_once(usage.hold_quota(&store, "ws", 4)).expect("held at once");
        assert_eq!(hold.unwrap().unwrap().limit(), 4);
        // A count about to expire is read again, not trusted.
        if let Ok(mut counts) = usage.month_counts.lock() {
            let aged = Instant::now().checked_sub(QUOTA_CACHE - QUOTA_REFRESH_MARGIN / 2);
            counts.insert("ws".to_owned(), (aged.unwrap(), 7));
        }
        usage.refresh_quota(&store, "ws").await.unwrap();
        let hold = poll_once(usage.hold_quota(&store, "ws", 10)).expect("held at once");
        assert_eq!(hold.unwrap().unwrap().limit(), 10, "read again: nothing stored yet");
    }
}
