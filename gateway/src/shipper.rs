//! The delivery loop, shared by both transports: buffer → batches →
//! uplink, acknowledgements → buffer.
//!
//! One session at a time. A session starts with Hello; the cloud answers
//! with its cumulative acknowledgement, the buffer is acknowledged up to it
//! and batches are built from the next sequence on ([`Draft`]), each one
//! starting where the previous ended, holes included, as the protocol
//! wants. Up to `max_in_flight` batches travel at once; every OK ack
//! acknowledges the buffer up to its sequence (which frees disk). Anything
//! else ends the session: a batch not acknowledged within
//! `request_timeout`, RETRY_LATER, REJECTED, a broken connection; FENCED
//! too (another session took over). Then, after a capped exponential
//! backoff with jitter, a new session resumes from whatever the cloud
//! acknowledged: a batch that was lost is sent again, a batch that was
//! stored but not acknowledged is dropped by the cloud as a duplicate.
//! Nothing is acknowledged to the buffer before the cloud stored it.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use opgraph_proto::pb;
use serde::Serialize;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::backoff::Backoff;
use crate::batch::Draft;
use crate::buffer::{Buffer, identity};
use crate::error::Error;
use crate::telemetry::Metrics;
use crate::uplink::{PathStats, Uplink, UplinkConfig};

/// Buffer reads per pass of the session loop, at most (a read returns at
/// least one record or covers the rest up to the watermark, so a few
/// suffice; the bound keeps acks flowing).
const MAX_READS_PER_PASS: usize = 16;

/// What the shipper needs to know, from the `[uplink]` configuration.
#[derive(Debug, Clone)]
pub struct ShipperConfig {
    pub gateway_id: String,
    /// The buffer directory's instance id, sent with Hello.
    pub buffer_id: String,
    /// Where that id is kept, so that it can be renewed
    /// ([`crate::buffer::identity`]); `None` keeps a renewed id in memory
    /// only (tests on an in-memory buffer).
    pub buffer_dir: Option<PathBuf>,
    pub batch_max_events: usize,
    pub batch_max_bytes: usize,
    pub batch_linger: Duration,
    pub max_in_flight: usize,
    pub connect_timeout: Duration,
    pub request_timeout: Duration,
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
}

impl ShipperConfig {
    pub fn new(
        gateway_id: &str,
        buffer_id: &str,
        buffer_dir: Option<PathBuf>,
        uplink: &UplinkConfig,
    ) -> Self {
        ShipperConfig {
            gateway_id: gateway_id.to_owned(),
            buffer_id: buffer_id.to_owned(),
            buffer_dir,
            batch_max_events: uplink.batch_max_events.max(1),
            batch_max_bytes: usize::try_from(uplink.batch_max_bytes.as_u64())
                .unwrap_or(usize::MAX)
                .max(1),
            batch_linger: uplink.batch_linger,
            max_in_flight: uplink.max_in_flight.max(1),
            connect_timeout: uplink.connect_timeout,
            request_timeout: uplink.request_timeout,
            backoff_initial: uplink.backoff_initial,
            backoff_max: uplink.backoff_max,
        }
    }
}

/// Where the delivery loop stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SessionState {
    /// Connecting, authenticating, saying Hello.
    Connecting,
    /// A session is open.
    Connected,
    /// Waiting before the next attempt.
    Backoff,
    /// Stopped (shutdown).
    Stopped,
}

/// The uplink's state for health and metrics.
#[derive(Debug, Clone, Serialize)]
pub struct UplinkStatus {
    /// `grpc://host:port` or `quic://host:port`.
    pub endpoint: String,
    pub state: SessionState,
    /// True while a session is open.
    pub connected: bool,
    /// Epoch of the current (or last) session.
    pub epoch: u64,
    /// Highest sequence the cloud acknowledged.
    pub last_acked_sequence: u64,
    /// Batches sent and not yet acknowledged.
    pub in_flight_batches: usize,
    /// Why the last session failed or ended; cleared by the next ack.
    pub last_error: Option<String>,
    /// Sessions that failed since the last acknowledged batch.
    pub consecutive_failures: u32,
}

/// How a session ended.
enum SessionEnd {
    /// Shutdown.
    Cancelled,
    /// The buffer closed: nothing more to do.
    Stopped,
    /// Another session of this gateway took over.
    Fenced,
    /// Anything else: reconnect after a backoff. `reason` is a metric label.
    Failed { reason: &'static str, error: String },
}

fn failed(reason: &'static str, error: impl std::fmt::Display) -> SessionEnd {
    SessionEnd::Failed { reason, error: error.to_string() }
}

/// A batch sent and not yet acknowledged.
struct Flight {
    last: u64,
    sent_at: Instant,
}

/// The delivery loop. Build with [`Shipper::new`], then [`Shipper::run`].
pub struct Shipper {
    buffer: Arc<dyn Buffer>,
    uplink: Box<dyn Uplink>,
    config: ShipperConfig,
    metrics: Arc<Metrics>,
    status: watch::Sender<UplinkStatus>,
    /// The uplink's path counters last copied into `metrics`.
    path_seen: PathStats,
    /// The highest sequence number the cloud may know from this buffer:
    /// what the buffer held when the shipper was built, or any batch it
    /// sent since. A Hello acknowledging more means the buffer rolled back
    /// behind the cloud (see [`Shipper::session`]).
    known_upto: u64,
}

impl Shipper {
    /// Build it before anything appends to `buffer` in this process (as
    /// `app.rs` does): records already there count as possibly sent.
    pub fn new(
        buffer: Arc<dyn Buffer>,
        uplink: Box<dyn Uplink>,
        config: ShipperConfig,
        metrics: Arc<Metrics>,
    ) -> Self {
        let known_upto = buffer.stats().next_seq.saturating_sub(1);
        let status = UplinkStatus {
            endpoint: uplink.endpoint().to_owned(),
            state: SessionState::Connecting,
            connected: false,
            epoch: 0,
            last_acked_sequence: 0,
            in_flight_batches: 0,
            last_error: None,
            consecutive_failures: 0,
        };
        Shipper {
            buffer,
            uplink,
            config,
            metrics,
            status: watch::channel(status).0,
            path_seen: PathStats::default(),
            known_upto,
        }
    }

    /// Watches the uplink's state (health, shutdown flush).
    pub fn status(&self) -> watch::Receiver<UplinkStatus> {
        self.status.subscribe()
    }

    fn update(&self, f: impl FnOnce(&mut UplinkStatus)) {
        self.status.send_modify(f);
    }

    /// Publishes the cloud's acknowledgement. Callers do this before they
    /// trim the buffer: health reads the two separately, and the other
    /// order let a drained buffer sit beside an older `last_acked_sequence`
    /// (seen as a flaky delivery test). The acknowledgement is a fact once
    /// received, whether or not the trim then succeeds.
    fn show_acked(&self, acked: u64) {
        self.metrics.last_acked_sequence.set(i64::try_from(acked).unwrap_or(i64::MAX));
        self.update(|s| s.last_acked_sequence = acked);
    }

    /// Delivers until `cancel` fires (or the buffer closes), reconnecting
    /// with backoff as needed. Batches in flight at cancellation are
    /// abandoned: they stay in the buffer and go out after the restart.
    pub async fn run(mut self, cancel: CancellationToken) {
        let mut backoff = Backoff::new(self.config.backoff_initial, self.config.backoff_max);
        let mut delay = None;
        let mut sessions = 0u64;
        loop {
            if let Some(delay) = delay.take() {
                self.update(|s| s.state = SessionState::Backoff);
                tokio::select! {
                    _ = cancel.cancelled() => break,
                    _ = tokio::time::sleep(delay) => {}
                }
            }
            self.update(|s| s.state = SessionState::Connecting);
            // Built at every attempt: the buffer id may have been renewed.
            let hello = pb::HelloRequest {
                gateway_id: self.config.gateway_id.clone(),
                software_version: env!("CARGO_PKG_VERSION").to_owned(),
                buffer_id: self.config.buffer_id.clone(),
            };
            let timeout = self.config.connect_timeout;
            let connected = tokio::select! {
                _ = cancel.cancelled() => break,
                r = tokio::time::timeout(timeout, self.uplink.connect(&hello)) => r,
            };
            let endpoint = self.uplink.endpoint().to_owned();
            let response = match connected {
                Ok(Ok(response)) => response,
                Ok(Err(e)) => {
                    let reason = if matches!(e, Error::Unauthorized { .. }) {
                        "unauthorized"
                    } else {
                        "connect"
                    };
                    self.session_failed(reason, &e.to_string());
                    delay = Some(backoff.next_delay(&mut rand::rng()));
                    continue;
                }
                Err(_) => {
                    let e = Error::Timeout { endpoint, what: "connect", after: timeout };
                    self.session_failed("timeout", &e.to_string());
                    delay = Some(backoff.next_delay(&mut rand::rng()));
                    continue;
                }
            };
            sessions += 1;
            if sessions > 1 {
                self.metrics.reconnects.inc();
            }
            let mut progressed = false;
            let end = self.session(response, &cancel, &mut progressed).await;
            self.uplink.disconnect().await;
            self.record_path();
            self.metrics.uplink_connected.set(0);
            self.update(|s| {
                s.connected = false;
                s.in_flight_batches = 0;
            });
            if progressed {
                backoff.reset();
            }
            match end {
                SessionEnd::Cancelled | SessionEnd::Stopped => break,
                SessionEnd::Fenced => {
                    self.session_failed("fenced", "fenced: another session of this gateway");
                    delay = Some(backoff.next_delay(&mut rand::rng()));
                }
                SessionEnd::Failed { reason, error } => {
                    self.session_failed(reason, &error);
                    delay = Some(backoff.next_delay(&mut rand::rng()));
                }
            }
        }
        self.uplink.disconnect().await;
        self.metrics.uplink_connected.set(0);
        self.update(|s| {
            s.state = SessionState::Stopped;
            s.connected = false;
        });
    }

    fn record_path(&mut self) {
        if let Some(path) = self.uplink.path_stats() {
            self.metrics.record_path(&mut self.path_seen, path);
        }
    }

    fn session_failed(&self, reason: &'static str, error: &str) {
        tracing::warn!(%reason, %error, "uplink session failed; retrying after a backoff");
        self.metrics.uplink_error(reason);
        self.update(|s| {
            s.last_error = Some(error.to_owned());
            s.consecutive_failures = s.consecutive_failures.saturating_add(1);
        });
    }

    /// One session, from its Hello answer until it ends.
    async fn session(
        &mut self,
        hello: pb::HelloResponse,
        cancel: &CancellationToken,
        progressed: &mut bool,
    ) -> SessionEnd {
        let epoch = hello.epoch;
        let mut watermark = self.buffer.subscribe();
        let durable_end = watermark.borrow().saturating_sub(1);
        let mut acked = hello.acked_sequence;
        if acked > self.known_upto {
            return self.rolled_back(acked, durable_end);
        }
        self.show_acked(acked);
        if let Err(end) = ack_buffer(self.buffer.as_ref(), acked.min(durable_end)).await {
            return end;
        }
        tracing::info!(epoch, acked, "uplink session open");
        self.metrics.uplink_connected.set(1);
        self.update(|s| {
            s.state = SessionState::Connected;
            s.connected = true;
            s.epoch = epoch;
        });

        let c = self.config.clone();
        let mut in_flight: VecDeque<Flight> = VecDeque::with_capacity(c.max_in_flight);
        // Saturating: the ack is the cloud's word, whatever it says.
        let mut draft = Draft::new(acked.saturating_add(1));
        let mut linger_until: Option<Instant> = None;
        let mut highest_sent = acked;
        // Bounded by cancellation: every pass either makes progress or
        // waits in the select below.
        loop {
            let room = in_flight.len() < c.max_in_flight;
            if room {
                // Read until the draft is full or has everything durable
                // (a read may return less than asked for).
                let mark = *watermark.borrow_and_update();
                for _ in 0..MAX_READS_PER_PASS {
                    if draft.is_full(c.batch_max_events, c.batch_max_bytes)
                        || mark <= draft.read_from()
                    {
                        break;
                    }
                    let events = c.batch_max_events - draft.len();
                    let bytes = c.batch_max_bytes.saturating_sub(draft.bytes()).max(1);
                    match self.buffer.read(draft.read_from(), events, bytes).await {
                        Ok(records) => {
                            let was_empty = draft.is_empty();
                            draft.extend(records, mark);
                            if was_empty && !draft.is_empty() {
                                linger_until = Some(Instant::now() + c.batch_linger);
                            }
                        }
                        Err(Error::Closed) => return SessionEnd::Stopped,
                        Err(e) => return failed("buffer", e),
                    }
                }
            }
            let lingered = linger_until.is_some_and(|t| t <= Instant::now());
            if room
                && !draft.is_empty()
                && (lingered || draft.is_full(c.batch_max_events, c.batch_max_bytes))
            {
                let next = Draft::new(draft.last() + 1);
                let ready = std::mem::replace(&mut draft, next);
                let last = ready.last();
                let (batch, undecodable) = ready.into_batch(&c.gateway_id, epoch);
                if !undecodable.is_empty() {
                    tracing::error!(?undecodable, "buffer records that are not events: skipped");
                    for _ in &undecodable {
                        self.metrics.uplink_error("undecodable_record");
                    }
                }
                let events = batch.len() as u64;
                if let Err(e) = self.uplink.send(batch).await {
                    return failed("send", e);
                }
                self.metrics.batches_sent.inc();
                self.metrics.events_sent.inc_by(events);
                in_flight.push_back(Flight { last, sent_at: Instant::now() });
                highest_sent = last;
                self.known_upto = self.known_upto.max(last);
                linger_until = None;
                let n = in_flight.len();
                self.update(|s| s.in_flight_batches = n);
                continue;
            }

            let ack_deadline = in_flight.front().map(|f| f.sent_at + c.request_timeout);
            let want_data = room && !draft.is_full(c.batch_max_events, c.batch_max_bytes);
            let end = tokio::select! {
                biased;
                _ = cancel.cancelled() => Some(SessionEnd::Cancelled),
                ack = self.uplink.recv_ack() => match ack {
                    Ok(ack) => {
                        self.on_ack(ack, epoch, highest_sent, &mut acked, &mut in_flight, progressed)
                            .await
                    }
                    Err(e) => Some(failed("connection", e)),
                },
                _ = sleep_until(ack_deadline), if ack_deadline.is_some() => {
                    let endpoint = self.uplink.endpoint().to_owned();
                    let after = c.request_timeout;
                    Some(failed("timeout", Error::Timeout { endpoint, what: "batch ack", after }))
                },
                changed = watermark.changed(), if want_data => {
                    changed.is_err().then_some(SessionEnd::Stopped)
                },
                _ = sleep_until(linger_until), if room && linger_until.is_some() => None,
            };
            if let Some(end) = end {
                if !matches!(end, SessionEnd::Cancelled | SessionEnd::Stopped) {
                    self.metrics.batches_retried.inc_by(in_flight.len() as u64);
                }
                return end;
            }
        }
    }

    /// The cloud acknowledged `cloud_acked`, more than this buffer ever
    /// held or sent: the buffer rolled back behind the cloud (a disk
    /// snapshot restored, a power cut under `fsync = "never"`, a copied
    /// directory). The numbers from the rollback point on now name new
    /// events, which the cloud would take for ones it has and drop:
    /// acknowledging them would lose them. So nothing is acknowledged;
    /// the buffer id is renewed (durably, before anything is sent under
    /// it) and the next session starts a new sequence under it, in which
    /// everything unacknowledged is sent again and event ids keep what the
    /// cloud already has from being stored twice.
    fn rolled_back(&mut self, cloud_acked: u64, durable_end: u64) -> SessionEnd {
        let renewed = match &self.config.buffer_dir {
            Some(dir) => identity::renew(dir),
            None => Ok(identity::new_id()),
        };
        let old = std::mem::take(&mut self.config.buffer_id);
        match renewed {
            Ok(id) => {
                tracing::error!(
                    cloud_acked,
                    known_upto = self.known_upto,
                    buffer_end = durable_end,
                    old_buffer_id = %old,
                    new_buffer_id = %id,
                    "the cloud acknowledged sequences this buffer never sent: the buffer \
                     was rolled back (restored snapshot, power cut without fsync?); \
                     resending everything unacknowledged under a new buffer id"
                );
                self.config.buffer_id = id;
            }
            Err(e) => {
                self.config.buffer_id = old;
                return failed("acked_beyond_buffer", format!("cannot renew the buffer id: {e}"));
            }
        }
        failed("acked_beyond_buffer", "the buffer was rolled back behind the cloud's ack")
    }

    /// Applies one acknowledgement; `Some` ends the session.
    async fn on_ack(
        &mut self,
        ack: pb::Ack,
        epoch: u64,
        highest_sent: u64,
        acked: &mut u64,
        in_flight: &mut VecDeque<Flight>,
        progressed: &mut bool,
    ) -> Option<SessionEnd> {
        let status = pb::AckStatus::try_from(ack.status).unwrap_or(pb::AckStatus::Unspecified);
        match status {
            pb::AckStatus::Ok if ack.epoch != epoch => {
                tracing::debug!(ack.epoch, epoch, "ack of another session ignored");
                None
            }
            pb::AckStatus::Ok => {
                if ack.acked_sequence > highest_sent {
                    tracing::warn!(
                        ack.acked_sequence,
                        highest_sent,
                        "the cloud acknowledged beyond what this session sent"
                    );
                }
                let up_to = ack.acked_sequence.min(highest_sent);
                if up_to > *acked {
                    // Shown before the buffer trims (see `show_acked`).
                    self.show_acked(up_to);
                    if let Err(end) = ack_buffer(self.buffer.as_ref(), up_to).await {
                        return Some(end);
                    }
                    *acked = up_to;
                    *progressed = true;
                }
                while in_flight.front().is_some_and(|f| f.last <= *acked) {
                    in_flight.pop_front();
                    self.metrics.batches_acked.inc();
                }
                self.record_path();
                if !ack.error.is_empty() {
                    tracing::warn!(error = %ack.error, "the cloud skipped events of a batch");
                }
                let (n, p) = (in_flight.len(), *progressed);
                self.update(|s| {
                    s.in_flight_batches = n;
                    if p {
                        s.last_error = None;
                        s.consecutive_failures = 0;
                    }
                });
                None
            }
            pb::AckStatus::RetryLater => Some(failed(
                "retry_later",
                format!("the cloud asked to retry later: {}", ack.error),
            )),
            pb::AckStatus::Fenced => Some(SessionEnd::Fenced),
            pb::AckStatus::Rejected | pb::AckStatus::Unspecified => {
                self.metrics.batches_rejected.inc();
                tracing::error!(error = %ack.error, "the cloud rejected a batch (a gateway bug)");
                Some(failed("rejected", format!("batch rejected: {}", ack.error)))
            }
        }
    }
}

/// Acknowledges the buffer up to `seq`; `Err` ends the session.
async fn ack_buffer(buffer: &dyn Buffer, seq: u64) -> Result<(), SessionEnd> {
    if seq == 0 {
        return Ok(());
    }
    match buffer.ack(seq).await {
        Ok(()) => Ok(()),
        Err(Error::Closed) => Err(SessionEnd::Stopped),
        Err(e) => Err(failed("buffer", e)),
    }
}

/// Sleeps until `deadline`; never returns without one (the select arms
/// using it are disabled then).
async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests;
