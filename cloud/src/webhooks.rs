//! Webhook deliveries: when something a workspace's webhooks subscribe to
//! happens (an enforcement decided, an export failed), each of them gets a
//! signed `POST`, retried with exponential backoff until it answers 2xx or
//! the attempts run out, every attempt recorded in the delivery log.
//! Reference: `docs/webhooks.md`.
//!
//! Deliveries run in the background: the request that caused one never
//! waits for it. Which webhooks a workspace has is cached for
//! five seconds, so that the paths that notify (enforcement is one of the
//! hottest) pay a map lookup, not a store read; a change made through this
//! process applies at once, one made through another within the TTL.
//!
//! `anomaly.detected` comes from a watcher ([`Webhooks::watch_anomalies`])
//! that runs the business-health anomaly detection over the workspaces
//! that subscribe, every `webhooks.anomaly_interval`.
//!
//! A delivery not finished is kept in the store (`PendingDelivery`: the
//! payload, the attempts made, when the next is due) from before its first
//! attempt to after its last, so a process stopped or killed between
//! attempts leaves it to the next start ([`Webhooks::resume`]), which
//! sends the same bytes under the same delivery id.
//!
//! Several processes may share one ClickHouse. Each delivery is held by
//! the process carrying it on, until `webhooks.lease` past its next due
//! time; the others leave it alone until then, and take it over only
//! after (a process that stopped or died no longer renews it). ClickHouse
//! has no compare-and-set, so a takeover writes its claim and reads it
//! back, and a holder checks before each retry that the delivery is still
//! its own; two processes that claim in the same instant may both send,
//! which deliveries being at least once already allows.
//!
//! The delivery log is kept for `webhooks.log_retention` (30 days by
//! default); [`Webhooks::prune_log`] deletes what is older.

use std::collections::{HashMap, HashSet};
#[cfg(test)]
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hyper::Method;
use rand::Rng;
use serde_json::{Value, json};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::error::{Error, Result};
use crate::governance::hash::sha256_hex;
use crate::intelligence::{HOUR_MS, anomaly_window, detect_anomalies};
use crate::outbound::{self, Answer};
use crate::store::Store;
use crate::store::queries::{Range, SeriesQuery};
use crate::store::webhooks::{PendingDelivery, Webhook, WebhookAttempt};
use crate::telemetry::Metrics;

/// An enforcement call recorded its receipt; `data` is the receipt.
pub const ENFORCEMENT_DECIDED: &str = "enforcement.decided";
/// A destination export or proof push failed; `data` is its export receipt.
pub const EXPORT_FAILED: &str = "export.failed";
/// The anomaly watcher found an hourly count far off its week's baseline;
/// `data` is the anomaly, as business health shows it.
pub const ANOMALY_DETECTED: &str = "anomaly.detected";
/// The event kinds a webhook may subscribe to.
pub const KINDS: [&str; 3] = [ENFORCEMENT_DECIDED, EXPORT_FAILED, ANOMALY_DETECTED];
/// Anomalies of hours older than this are forgotten by the watcher: they
/// can no longer be found again.
const ANOMALY_MEMORY_MS: i64 = 3 * HOUR_MS;

/// How long a workspace's webhooks are taken from the cache.
const CACHE_TTL: Duration = Duration::from_secs(5);
/// Deliveries outstanding at once (sending, or waiting for a retry); past
/// it a new one is dropped, counted and logged, so that a receiver that
/// is down cannot make the cloud hold an unbounded backlog in memory.
const MAX_OUTSTANDING: usize = 10_000;
/// Their payloads' bytes at once, the same way: an enforcement decision
/// carries up to three 64 KiB documents, so the count alone would allow
/// gigabytes.
const MAX_OUTSTANDING_BYTES: usize = 128 * 1024 * 1024;
/// Requests in flight at once, across webhooks.
const MAX_SENDING: usize = 32;
/// Rows deleted per store call of the log's retention, and calls per pass.
const PRUNE_BATCH: usize = 5000;
const PRUNE_BATCHES: usize = 100;
/// Most webhooks a delivery is fanned out to: a workspace's whole list.
pub const MAX_PER_WORKSPACE: usize = 100;

type Hooks = Arc<Vec<Webhook>>;

pub struct Webhooks {
    store: Arc<dyn Store>,
    config: Arc<Config>,
    metrics: Arc<Metrics>,
    /// Per workspace: when read, and its webhooks.
    cache: Mutex<HashMap<String, (Instant, Hooks)>>,
    /// Per workspace, held while its webhooks are read from the store: the
    /// calls that find the cache stale together (every enforcement in the
    /// same few milliseconds) wait for one read instead of each making
    /// its own.
    refreshing: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Store reads of webhook lists, for the test of the above.
    #[cfg(test)]
    reads: AtomicUsize,
    sending: Semaphore,
    /// This process among those sharing the store: the owner written in
    /// the deliveries it holds.
    instance: String,
    /// Deliveries this process is carrying on (sending, or waiting for a
    /// retry): at most [`MAX_OUTSTANDING`], and never a second copy of one
    /// started by a resume pass.
    in_flight: Mutex<InFlight>,
    /// Deliveries over whose end the store failed to record (id to
    /// workspace): a resume pass marks them again instead of sending them
    /// again, so a store refusing writes cannot make a delivered event go
    /// out once a pass.
    unmarked: Mutex<HashMap<String, String>>,
}

impl Webhooks {
    pub fn new(store: Arc<dyn Store>, config: Arc<Config>, metrics: Arc<Metrics>) -> Arc<Self> {
        Arc::new(Webhooks {
            store,
            config,
            metrics,
            cache: Mutex::new(HashMap::new()),
            refreshing: Mutex::new(HashMap::new()),
            #[cfg(test)]
            reads: AtomicUsize::new(0),
            sending: Semaphore::new(MAX_SENDING),
            instance: crate::ids::new_id("proc"),
            in_flight: Mutex::new(InFlight::default()),
            unmarked: Mutex::new(HashMap::new()),
        })
    }

    /// Forgets the cached webhooks of `ws` (after one was created or
    /// deleted here).
    pub fn invalidate(&self, ws: &str) {
        if let Ok(mut cache) = self.cache.lock() {
            cache.remove(ws);
        }
    }

    /// Deliveries sending or waiting for a retry.
    pub fn outstanding(&self) -> usize {
        self.in_flight.lock().map_or(0, |in_flight| in_flight.payloads.len())
    }

    /// Delivers a `kind` event about `subject` to every webhook of `ws`
    /// subscribed to it, in the background. `data` is built only when one
    /// is (or when the cache must be refreshed first).
    pub fn notify(
        self: &Arc<Self>,
        ws: &str,
        kind: &'static str,
        subject: &str,
        data: impl FnOnce() -> Value,
    ) {
        let cached = self.cached(ws);
        let (ws, subject) = (ws.to_owned(), subject.to_owned());
        match cached {
            Some(hooks) => {
                if hooks.iter().any(|h| h.events.iter().any(|e| e == kind)) {
                    self.fan_out(&ws, &hooks, kind, &subject, Arc::new(data()));
                }
            }
            None => {
                let data = Arc::new(data());
                let this = Arc::clone(self);
                let happened = crate::now_ms();
                tokio::spawn(async move {
                    match this.webhooks_of(&ws).await {
                        // The list is read after the fact: a webhook made
                        // meanwhile did not exist when this happened and
                        // gets only what happens after it.
                        Ok(hooks) => {
                            let existed: Vec<Webhook> = hooks
                                .iter()
                                .filter(|h| h.created_at <= happened)
                                .cloned()
                                .collect();
                            this.fan_out(&ws, &existed, kind, &subject, data);
                        }
                        Err(error) => {
                            this.count("dropped");
                            tracing::warn!(%error, workspace = %ws, kind, "webhooks not read; event not delivered");
                        }
                    }
                });
            }
        }
    }

    /// The cached webhooks of `ws`, unless stale.
    fn cached(&self, ws: &str) -> Option<Hooks> {
        let cache = self.cache.lock().ok()?;
        cache.get(ws).filter(|(at, _)| at.elapsed() < CACHE_TTL).map(|(_, h)| Arc::clone(h))
    }

    /// The webhooks of `ws`, from the cache while fresh.
    async fn webhooks_of(&self, ws: &str) -> Result<Hooks> {
        if let Some(hooks) = self.cached(ws) {
            return Ok(hooks);
        }
        let gate = {
            let mut gates =
                self.refreshing.lock().map_err(|_| Error::internal("webhook cache poisoned"))?;
            Arc::clone(gates.entry(ws.to_owned()).or_default())
        };
        let _refreshing = gate.lock().await;
        // Read by the call this one waited for.
        if let Some(hooks) = self.cached(ws) {
            return Ok(hooks);
        }
        #[cfg(test)]
        self.reads.fetch_add(1, Ordering::Relaxed);
        let hooks = Arc::new(self.store.list_webhooks(ws, MAX_PER_WORKSPACE).await?);
        let mut cache = self.cache.lock().map_err(|_| Error::internal("webhook cache poisoned"))?;
        cache.insert(ws.to_owned(), (Instant::now(), Arc::clone(&hooks)));
        Ok(hooks)
    }

    fn fan_out(
        self: &Arc<Self>,
        ws: &str,
        hooks: &[Webhook],
        kind: &'static str,
        subject: &str,
        data: Arc<Value>,
    ) {
        for hook in hooks.iter().filter(|h| h.events.iter().any(|e| e == kind)) {
            let id = crate::ids::new_id("whd");
            let now = crate::now_ms();
            let payload = json!({
                "id": id, "type": kind, "workspaceId": ws, "subject": subject,
                "createdAt": now, "data": *data,
            })
            .to_string();
            if !self.reserve(&id, payload.len()) {
                tracing::warn!(workspace = %ws, webhook = %hook.id, kind, "{MAX_OUTSTANDING} webhook deliveries or {MAX_OUTSTANDING_BYTES} bytes outstanding; this one is dropped");
                continue;
            }
            let pending = PendingDelivery {
                delivery_id: id,
                webhook_id: hook.id.clone(),
                event: kind.to_owned(),
                subject: subject.to_owned(),
                payload,
                attempts: 0,
                due_at: now,
                owner: String::new(),
                held_until: 0,
            };
            self.start_delivery(ws, hook, kind, pending, true);
        }
    }

    /// Takes delivery `id`, its payload `bytes` long, into those this
    /// process carries on, unless [`MAX_OUTSTANDING`] are already or its
    /// payload would pass [`MAX_OUTSTANDING_BYTES`] (then counts it
    /// dropped).
    fn reserve(&self, id: &str, bytes: usize) -> bool {
        let Ok(mut in_flight) = self.in_flight.lock() else { return false };
        if in_flight.payloads.len() >= MAX_OUTSTANDING
            || in_flight.bytes.saturating_add(bytes) > MAX_OUTSTANDING_BYTES
        {
            drop(in_flight);
            self.count("dropped");
            return false;
        }
        if in_flight.payloads.insert(id.to_owned(), bytes).is_none() {
            in_flight.bytes += bytes;
        }
        true
    }

    /// The delivery is no longer this process's to carry on.
    fn forget(&self, id: &str) {
        if let Ok(mut in_flight) = self.in_flight.lock()
            && let Some(bytes) = in_flight.payloads.remove(id)
        {
            in_flight.bytes -= bytes;
        }
    }

    /// Sends `pending`, reserved already, in the background (saving it
    /// first when new).
    fn start_delivery(
        self: &Arc<Self>,
        ws: &str,
        hook: &Webhook,
        kind: &'static str,
        mut pending: PendingDelivery,
        new: bool,
    ) {
        let (this, ws, hook) = (Arc::clone(self), ws.to_owned(), hook.clone());
        tokio::spawn(async move {
            if new {
                this.save(&ws, &mut pending).await;
            }
            let id = pending.delivery_id.clone();
            this.deliver(&ws, &hook, kind, pending).await;
            this.forget(&id);
        });
    }

    /// Carries on with the deliveries nobody is carrying on: those an
    /// earlier process left (stopped, or killed between attempts) and, on
    /// a store shared by several processes, those whose holder's lease ran
    /// out. At start, then every half lease (at most every minute) until
    /// `shutdown`, so that a process that died is taken over while the
    /// others run.
    pub async fn resume(self: Arc<Self>, shutdown: CancellationToken) {
        let period = (self.config.webhooks.lease / 2)
            .clamp(Duration::from_millis(100), Duration::from_secs(60));
        let mut passes = Passes::every(period);
        while passes.next(&shutdown).await {
            self.resume_once().await;
        }
    }

    async fn resume_once(self: &Arc<Self>) {
        let unmarked: Vec<(String, String)> = match self.unmarked.lock() {
            Ok(unmarked) => unmarked.iter().map(|(id, ws)| (id.clone(), ws.clone())).collect(),
            Err(_) => Vec::new(),
        };
        for (id, ws) in &unmarked {
            self.finish(ws, id).await;
        }
        let pending = match self.store.pending_deliveries(MAX_OUTSTANDING).await {
            Ok(pending) => pending,
            Err(error) => {
                tracing::warn!(%error, "pending webhook deliveries not read; the next pass tries again");
                return;
            }
        };
        let shared = self.store.shared_between_processes();
        let mut resumed = 0usize;
        for (ws, pending) in pending {
            let id = &pending.delivery_id;
            if self.in_flight.lock().map_or(true, |f| f.payloads.contains_key(id))
                || self.unmarked.lock().map_or(true, |u| u.contains_key(id))
            {
                continue;
            }
            if shared && pending.owner != self.instance && pending.held_until > crate::now_ms() {
                self.count("held_elsewhere");
                continue;
            }
            let hook = match self.webhooks_of(&ws).await {
                Ok(hooks) => hooks.iter().find(|h| h.id == pending.webhook_id).cloned(),
                Err(error) => {
                    tracing::warn!(%error, workspace = %ws, "webhooks not read; delivery left for the next pass");
                    continue;
                }
            };
            let kind = KINDS.iter().copied().find(|k| *k == pending.event);
            let (Some(hook), Some(kind)) = (hook, kind) else {
                // Its webhook was deleted meanwhile.
                self.finish(&ws, &pending.delivery_id).await;
                continue;
            };
            let id = pending.delivery_id.clone();
            if !self.reserve(&id, pending.payload.len()) {
                break;
            }
            let Some(pending) = self.claim(&ws, pending, shared).await else {
                self.forget(&id);
                continue;
            };
            resumed += 1;
            self.count("resumed");
            self.start_delivery(&ws, &hook, kind, pending, false);
        }
        if resumed > 0 {
            tracing::info!(resumed, "webhook deliveries resumed");
        }
    }

    /// Makes `pending` this process's: on a shared store, writes the claim
    /// and reads it back, `None` when another process claimed it after.
    async fn claim(
        &self,
        ws: &str,
        mut pending: PendingDelivery,
        shared: bool,
    ) -> Option<PendingDelivery> {
        if !shared {
            return Some(pending);
        }
        self.save(ws, &mut pending).await;
        match self.store.pending_delivery(ws, &pending.delivery_id).await {
            Ok(Some(read)) if read.owner == self.instance => Some(pending),
            Ok(_) => None,
            Err(error) => {
                tracing::warn!(%error, delivery = %pending.delivery_id, "claim not read back; left for the next pass");
                None
            }
        }
    }

    /// At a clean stop, on a shared store: hands the deliveries this
    /// process holds back, so that another process (or the next start)
    /// carries them on at their due time instead of a lease later.
    pub async fn release(&self) {
        if !self.store.shared_between_processes() {
            return;
        }
        let held = match self.store.pending_deliveries(MAX_OUTSTANDING).await {
            Ok(pending) => pending.into_iter().filter(|(_, p)| p.owner == self.instance),
            Err(error) => {
                tracing::warn!(%error, "webhook deliveries not handed back; others take them over a lease after their due time");
                return;
            }
        };
        for (ws, mut pending) in held {
            pending.held_until = 0;
            if let Err(error) = self.store.save_pending_delivery(&ws, &pending).await {
                tracing::warn!(%error, delivery = %pending.delivery_id, "webhook delivery not handed back");
            }
        }
    }

    /// Whether `id` is still this process's to send, asked before a retry
    /// on a shared store: another process takes a delivery over when this
    /// one let its lease run out (it was paused, or cut off from the
    /// store), or finishes it. A store that cannot say is no reason to
    /// stop.
    async fn still_held(&self, ws: &str, id: &str) -> bool {
        if !self.store.shared_between_processes() {
            return true;
        }
        match self.store.pending_delivery(ws, id).await {
            Ok(Some(read)) => read.owner == self.instance,
            Ok(None) => false,
            Err(_) => true,
        }
    }

    /// Tries `pending` from its next attempt until it succeeds, the
    /// attempts run out or the webhook is deleted, recording every attempt
    /// and, between attempts, what a restart needs to carry on.
    async fn deliver(
        &self,
        ws: &str,
        hook: &Webhook,
        kind: &'static str,
        mut pending: PendingDelivery,
    ) {
        let payload = Bytes::from(pending.payload.clone().into_bytes());
        let payload_hash = sha256_hex(&payload);
        let id = pending.delivery_id.clone();
        let max_attempts = self.config.webhooks.max_attempts;
        let due_in = pending.due_at.saturating_sub(crate::now_ms());
        let mut waited = due_in > 0;
        if waited {
            tokio::time::sleep(Duration::from_millis(due_in.unsigned_abs())).await;
        }
        for attempt in pending.attempts.saturating_add(1)..=max_attempts {
            if waited && !self.still_held(ws, &id).await {
                tracing::info!(delivery = %id, "webhook delivery taken over by another process");
                return;
            }
            // Deleted meanwhile: stop. A store that cannot say is no
            // reason to give up.
            if attempt > 1
                && let Ok(hooks) = self.webhooks_of(ws).await
                && !hooks.iter().any(|h| h.id == hook.id)
            {
                break;
            }
            let (response_status, error) = self.send(hook, kind, &id, attempt, &payload).await;
            let succeeded = error.is_none();
            let wait = backoff(self.config.webhooks.retry_base, attempt);
            let last = succeeded || attempt == max_attempts;
            let wait_ms = i64::try_from(wait.as_millis()).unwrap_or(i64::MAX);
            let next_attempt_at = (!last).then(|| crate::now_ms().saturating_add(wait_ms));
            let record = WebhookAttempt {
                delivery_id: id.clone(),
                webhook_id: hook.id.clone(),
                event: kind.to_owned(),
                subject: pending.subject.clone(),
                attempt,
                status: if succeeded { "succeeded" } else { "failed" }.to_owned(),
                response_status,
                error: error.clone(),
                next_attempt_at,
                payload_hash: payload_hash.clone(),
                created_at: crate::now_ms(),
            };
            if let Err(e) = self.store.insert_webhook_attempt(ws, &record).await {
                tracing::warn!(error = %e, webhook = %hook.id, delivery = %id, "webhook attempt not logged");
            }
            self.count(if succeeded { "succeeded" } else { "failed" });
            let Some(due_at) = next_attempt_at else {
                if let Some(error) = error {
                    tracing::warn!(%error, webhook = %hook.id, delivery = %id, attempt, "webhook delivery failed for good");
                }
                break;
            };
            pending.attempts = attempt;
            pending.due_at = due_at;
            self.save(ws, &mut pending).await;
            tokio::time::sleep(wait).await;
            waited = true;
        }
        self.finish(ws, &id).await;
    }

    /// Keeps `pending` for a restart, held by this process until a lease
    /// past its due time; a store that fails costs only that.
    async fn save(&self, ws: &str, pending: &mut PendingDelivery) {
        let lease = i64::try_from(self.config.webhooks.lease.as_millis()).unwrap_or(i64::MAX);
        pending.owner.clone_from(&self.instance);
        pending.held_until = pending.due_at.max(crate::now_ms()).saturating_add(lease);
        if let Err(error) = self.store.save_pending_delivery(ws, pending).await {
            tracing::warn!(%error, delivery = %pending.delivery_id, "pending webhook delivery not saved; a restart would drop it");
        }
    }

    async fn finish(&self, ws: &str, delivery_id: &str) {
        let marked = self.store.finish_pending_delivery(ws, delivery_id).await;
        if let Ok(mut unmarked) = self.unmarked.lock() {
            if marked.is_ok() {
                unmarked.remove(delivery_id);
            } else {
                unmarked.insert(delivery_id.to_owned(), ws.to_owned());
            }
        }
        if let Err(error) = marked {
            tracing::warn!(%error, delivery = %delivery_id, "finished webhook delivery not marked; the next pass tries again, a restart may send it again");
        }
    }

    /// One attempt: `(response status, error)`, the error `None` on a 2xx.
    async fn send(
        &self,
        hook: &Webhook,
        kind: &str,
        id: &str,
        attempt: u32,
        payload: &Bytes,
    ) -> (Option<u16>, Option<String>) {
        let headers = (|| -> Result<_> {
            let mut headers =
                outbound::signature_headers(Some(&hook.secret), crate::now_ms(), payload)?;
            headers.push(outbound::header("x-opgraph-event", kind)?);
            headers.push(outbound::header("x-opgraph-delivery", id)?);
            headers.push(outbound::header("x-opgraph-attempt", &attempt.to_string())?);
            headers.push(outbound::header("idempotency-key", id)?);
            Ok(headers)
        })();
        let headers = match headers {
            Ok(headers) => headers,
            Err(e) => return (None, Some(e.to_string())),
        };
        let exports = &self.config.exports;
        let target = outbound::Target {
            setting: "webhook url",
            url: &hook.url,
            ca_file: exports.ca_file.as_deref(),
            timeout: exports.timeout,
            public_only: !exports.allow_private_networks,
        };
        let _permit = self.sending.acquire().await;
        match outbound::send(target, Method::POST, payload.clone(), &headers).await {
            Ok(Answer { status, .. }) if (200..300).contains(&status) => (Some(status), None),
            Ok(Answer { status, body }) => {
                let text: String = String::from_utf8_lossy(&body).chars().take(200).collect();
                (Some(status), Some(format!("HTTP {status}: {text}")))
            }
            Err(error) => (None, Some(error)),
        }
    }

    /// Every `webhooks.anomaly_interval` until `shutdown`: detects the
    /// anomalies of each workspace with an `anomaly.detected` webhook and
    /// delivers each one once (per process: a restart may deliver an
    /// anomaly of the current hours again, with the same `subject`).
    pub async fn watch_anomalies(self: Arc<Self>, shutdown: CancellationToken) {
        let period = self.config.webhooks.anomaly_interval;
        if period.is_zero() {
            return;
        }
        let mut delivered: HashSet<String> = HashSet::new();
        let mut passes = Passes::every(period);
        while passes.next(&shutdown).await {
            let now = crate::now_ms();
            let workspaces = match self.store.workspaces_with_webhooks().await {
                Ok(workspaces) => workspaces,
                Err(error) => {
                    tracing::warn!(%error, "anomaly watcher: webhooks not read");
                    continue;
                }
            };
            for ws in workspaces {
                if let Err(error) = self.anomalies_of(&ws, now, &mut delivered).await {
                    tracing::warn!(%error, workspace = %ws, "anomaly watcher: workspace skipped");
                }
            }
            // The key ends with the hour; only recent hours can come back.
            delivered.retain(|key| {
                key.rsplit(':')
                    .nth(1)
                    .and_then(|h| h.parse::<i64>().ok())
                    .is_some_and(|hour| hour >= now - ANOMALY_MEMORY_MS)
            });
        }
    }

    /// One workspace's pass of the watcher.
    async fn anomalies_of(
        self: &Arc<Self>,
        ws: &str,
        now: i64,
        delivered: &mut HashSet<String>,
    ) -> Result<()> {
        let hooks = self.webhooks_of(ws).await?;
        if !hooks.iter().any(|h| h.events.iter().any(|e| e == ANOMALY_DETECTED)) {
            return Ok(());
        }
        let (from, to) = anomaly_window(now);
        let query = SeriesQuery {
            range: Range { from, to },
            business_id: None,
            event: None,
            bucket_ms: HOUR_MS,
            by_event: Some(crate::intelligence::ANOMALY_NAMES),
        };
        let points = self.store.event_series(ws, &query).await?;
        for anomaly in detect_anomalies(&points, now) {
            let subject =
                format!("anomaly:{}:{}:{}", anomaly.event_name, anomaly.hour, anomaly.direction);
            if delivered.insert(format!("{ws}:{subject}")) {
                self.notify(ws, ANOMALY_DETECTED, &subject, || {
                    serde_json::to_value(&anomaly).unwrap_or_default()
                });
            }
        }
        Ok(())
    }

    /// Every quarter of `webhooks.log_retention` (at most hourly, the
    /// first at start) until `shutdown`: deletes the attempts logged, and
    /// the deliveries due, longer ago than the retention.
    pub async fn prune_log(self: Arc<Self>, shutdown: CancellationToken) {
        let retention = self.config.webhooks.log_retention;
        if retention.is_zero() {
            return;
        }
        let period = (retention / 4).clamp(Duration::from_secs(1), Duration::from_secs(3600));
        let mut passes = Passes::every(period);
        while passes.next(&shutdown).await {
            let before = crate::now_ms()
                .saturating_sub(i64::try_from(retention.as_millis()).unwrap_or(i64::MAX));
            // In batches, so that the store's writer is never held long;
            // what a pass leaves the next one takes.
            for _ in 0..PRUNE_BATCHES {
                match self.store.prune_webhook_log(before, PRUNE_BATCH).await {
                    Ok(Some(deleted)) if deleted >= PRUNE_BATCH as u64 => {}
                    Ok(deleted) => {
                        tracing::debug!(?deleted, "webhook delivery log pruned");
                        break;
                    }
                    Err(error) => {
                        tracing::warn!(%error, "webhook delivery log not pruned; the next pass tries again");
                        break;
                    }
                }
            }
        }
    }

    fn count(&self, outcome: &str) {
        self.metrics.webhook(outcome);
    }
}

/// The deliveries a process carries on, by id, with their payloads' size.
#[derive(Default)]
struct InFlight {
    payloads: HashMap<String, usize>,
    bytes: usize,
}

/// The passes of a background loop: the first at once, then one every
/// period until shutdown; a pass that overruns its period delays the next
/// instead of bunching them up.
struct Passes(tokio::time::Interval);

impl Passes {
    fn every(period: Duration) -> Passes {
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Passes(tick)
    }

    /// Waits for the next pass; `false` once `shutdown` is cancelled.
    async fn next(&mut self, shutdown: &CancellationToken) -> bool {
        tokio::select! {
            _ = self.0.tick() => true,
            () = shutdown.cancelled() => false,
        }
    }
}

/// The wait after failed attempt `attempt` (1-based): `base` doubled per
/// attempt before, plus up to a quarter at random.
fn backoff(base: Duration, attempt: u32) -> Duration {
    let wait = base.saturating_mul(1u32 << attempt.saturating_sub(1).min(20));
    let jitter = rand::rng().random_range(0.0..0.25);
    wait.saturating_add(wait.mul_f64(jitter))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    /// Webhooks over a fresh embedded store, with the store itself and the
    /// directory that must outlive both.
    fn on_temp_store() -> (Arc<dyn Store>, Arc<Webhooks>, tempfile::TempDir) {
        let (store, dir) = crate::store::embedded::temp_store();
        let store: Arc<dyn Store> = Arc::new(store);
        let webhooks = Webhooks::new(
            Arc::clone(&store),
            Arc::new(Config::default()),
            Arc::new(Metrics::new()),
        );
        (store, webhooks, dir)
    }

    /// A webhook for `enforcement.decided` at an address nothing serves.
    fn hook(id: &str, created_at: i64) -> Webhook {
        Webhook {
            id: id.into(),
            url: "https://127.0.0.1:9/hook".into(),
            events: vec![ENFORCEMENT_DECIDED.into()],
            secret: "whsec-0123456789abcdef".into(),
            created_at,
        }
    }

    #[tokio::test]
    async fn a_delivery_whose_end_was_not_recorded_is_marked_again_not_sent_again() {
        let (store, webhooks, _dir) = on_temp_store();
        let pending = PendingDelivery {
            delivery_id: "whd_1".into(),
            webhook_id: "whk_1".into(),
            event: ENFORCEMENT_DECIDED.into(),
            subject: "rcp_1".into(),
            payload: "{}".into(),
            attempts: 1,
            due_at: 0,
            owner: String::new(),
            held_until: 0,
        };
        store.insert_webhook("ws_a", &hook("whk_1", 0)).await.unwrap();
        store.save_pending_delivery("ws_a", &pending).await.unwrap();
        // Delivered, but the store refused to record the end.
        webhooks.unmarked.lock().unwrap().insert("whd_1".into(), "ws_a".into());
        webhooks.resume_once().await;
        assert_eq!(webhooks.outstanding(), 0, "not resumed");
        assert!(store.pending_deliveries(10).await.unwrap().is_empty(), "marked this time");
        assert!(webhooks.unmarked.lock().unwrap().is_empty());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn calls_that_find_the_cache_stale_together_read_the_store_once() {
        let (_store, webhooks, _dir) = on_temp_store();
        let calls: Vec<_> = (0..50)
            .map(|_| {
                let webhooks = Arc::clone(&webhooks);
                tokio::spawn(async move { webhooks.webhooks_of("ws_a").await.map(|h| h.len()) })
            })
            .collect();
        for call in calls {
            assert_eq!(call.await.unwrap().unwrap(), 0);
        }
        assert_eq!(webhooks.reads.load(Ordering::Relaxed), 1);
        // Another workspace has a cache entry of its own.
        webhooks.webhooks_of("ws_b").await.unwrap();
        assert_eq!(webhooks.reads.load(Ordering::Relaxed), 2);
    }

    /// With the list not cached, it is read after the event: a webhook
    /// made meanwhile (here: one dated after it) is not sent the event.
    #[tokio::test]
    async fn a_webhook_made_after_an_event_is_not_sent_it() {
        let (store, webhooks, _dir) = on_temp_store();
        store.insert_webhook("ws_a", &hook("whk_before", 0)).await.unwrap();
        let later = crate::now_ms() + 60_000;
        store.insert_webhook("ws_a", &hook("whk_after", later)).await.unwrap();
        webhooks.notify("ws_a", ENFORCEMENT_DECIDED, "rcp_1", || json!({}));
        // On this one-thread runtime the notifying task fills the cache and
        // fans out in one step: once the cache is there, so are they.
        tokio::time::timeout(Duration::from_secs(10), async {
            while webhooks.cached("ws_a").is_none() {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the list was read");
        assert_eq!(webhooks.outstanding(), 1, "only the webhook that existed");
    }

    #[tokio::test]
    async fn outstanding_deliveries_are_bounded_in_bytes_too() {
        let (_store, webhooks, _dir) = on_temp_store();
        let big = MAX_OUTSTANDING_BYTES / 4;
        for n in 0..4 {
            assert!(webhooks.reserve(&format!("whd_{n}"), big), "{n} fits");
        }
        assert!(!webhooks.reserve("whd_4", 1), "past the bytes, though far from the count");
        webhooks.forget("whd_0");
        assert!(webhooks.reserve("whd_4", big), "room again once one is done");
        assert_eq!(webhooks.outstanding(), 4);
        assert_eq!(webhooks.in_flight.lock().unwrap().bytes, 4 * big);
    }

    #[test]
    fn backoff_doubles_with_bounded_jitter() {
        let base = Duration::from_secs(30);
        for (attempt, expected) in [(1, 30), (2, 60), (3, 120), (5, 480)] {
            let wait = backoff(base, attempt);
            let low = Duration::from_secs(expected);
            assert!(wait >= low && wait <= low.mul_f64(1.25), "attempt {attempt}: {wait:?}");
        }
        assert!(backoff(Duration::from_secs(3600), 40) > Duration::ZERO, "no overflow");
    }
}
