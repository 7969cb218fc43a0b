//! Gateway receivers: where edge batches come in, over gRPC ([`grpc`]) or
//! QUIC ([`quic`]). Both transports end in [`Receiver`], which owns the
//! delivery rules, so the two cannot drift apart:
//!
//! - A session starts with Hello: the store bumps the gateway's epoch
//!   (fencing any older connection) and returns the cumulative ack, from
//!   which the gateway resends.
//! - A batch covers `first..=last`; it is checked for shape (ranges that go
//!   backwards, sequences outside the range or out of order, too many
//!   events: REJECTED, nothing stored), its envelopes are validated like
//!   HTTP ones (an invalid envelope is skipped, counted and named in the
//!   ack's `error`: one bad reading must not stall a site's delivery), and it
//!   is committed in one transaction that also advances the ack.
//! - A batch is handed to the store as soon as its predecessors were, by
//!   one task per gRPC stream or QUIC connection (`in_flight`), so the
//!   store's writer can commit several at once. One that arrives before
//!   the one in front of it (parallel QUIC streams, separate gRPC streams)
//!   waits briefly for the gap to close instead of failing.
//! - Store trouble answers RETRY_LATER: the gateway keeps its buffer.
//! - So does a workspace whose monthly event quota is used up: the events
//!   wait at the edge until the quota allows them (a new month, a raised
//!   quota) instead of being refused. Of a batch that would pass it, a
//!   prefix of as many events as are left is stored (what is left is held
//!   for it against other calls in flight, [`crate::usage::QuotaHold`])
//!   and acknowledged, with RETRY_LATER for the rest.

pub mod grpc;
mod in_flight;
pub mod quic;
pub mod tls;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::{HeaderMap, HeaderValue, header};
use opgraph_proto::validate::{MAX_TIMESTAMP_AGE_MS, MAX_TIMESTAMP_LEAD_MS};
use opgraph_proto::{Event, pb};
use serde::Deserialize;
use tokio::sync::watch;

use crate::auth::{Authenticator, Principal, Scope};
use crate::error::{Error, Result};
use crate::store::gateway::BatchCommit;
use crate::store::{NewEvent, Store};
use crate::telemetry::Metrics;
use crate::usage::{QuotaHold, Usage};

pub use opgraph_proto::codec::MAX_BATCH_EVENTS;
const MAX_GATEWAY_ID_LEN: usize = 200;
const MAX_EVENT_ID_LEN: usize = 64;
/// The highest sequence a batch may carry: what the stores hold
/// (`i64::MAX`), thousands of years of events at any rate.
const MAX_SEQUENCE: u64 = i64::MAX as u64;
/// How long a batch that arrived ahead of its predecessor waits for it.
const GAP_WAIT: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReceiverConfig {
    /// gRPC (TLS) address; port 0 picks one, printed as `listening grpc=...`.
    /// Default `127.0.0.1:50051`. Env `OPGRAPH_GRPC_ADDR`; `off` disables.
    pub grpc_addr: Option<SocketAddr>,
    /// QUIC (UDP) address, printed as `listening quic=...`. Default
    /// `127.0.0.1:4433`. Env `OPGRAPH_QUIC_ADDR`; `off` disables.
    pub quic_addr: Option<SocketAddr>,
    /// QUIC connections that may be open at once before they authenticate
    /// (handshake and `SessionOpen`); past it a new one is refused before
    /// its handshake, with QUIC's `CONNECTION_REFUSED`, and counted as
    /// `quic_unauthenticated_limit`. Each may hold one stream's receive
    /// window for the open timeout, so this bounds what strangers cost; a
    /// connection gives its place back once its key is accepted. While
    /// strangers fill every place, a gateway that was not yet connected
    /// waits for one too (it retries after its backoff). Default 256; 1 to
    /// 100000. Env `OPGRAPH_QUIC_MAX_UNAUTHENTICATED`.
    pub quic_max_unauthenticated_connections: usize,
    /// Server certificate chain (PEM). Unset: a self-signed certificate for
    /// `localhost` and `127.0.0.1` is made once and kept in the data
    /// directory (`receiver-cert.pem`), for gateways to pin. Env
    /// `OPGRAPH_TLS_CERT_FILE`.
    pub tls_cert_file: Option<PathBuf>,
    /// Private key of `tls_cert_file` (PEM). Env `OPGRAPH_TLS_KEY_FILE`.
    pub tls_key_file: Option<PathBuf>,
    /// When set, gateways must also present a client certificate signed by
    /// this CA (mutual TLS), on top of their API key. Env
    /// `OPGRAPH_TLS_CLIENT_CA_FILE`.
    pub client_ca_file: Option<PathBuf>,
}

impl Default for ReceiverConfig {
    fn default() -> Self {
        ReceiverConfig {
            grpc_addr: Some(SocketAddr::from(([127, 0, 0, 1], 50051))),
            quic_addr: Some(SocketAddr::from(([127, 0, 0, 1], 4433))),
            quic_max_unauthenticated_connections: 256,
            tls_cert_file: None,
            tls_key_file: None,
            client_ca_file: None,
        }
    }
}

/// A batch's valid events with their sequences, and the sequence and a
/// description of each skipped (invalid) one.
type CheckedBatch = (Vec<(u64, NewEvent)>, Vec<(u64, String)>);

/// A batch after [`Receiver::prepare`].
pub enum Prepared {
    /// Refused whole; nothing to store.
    Answered(pb::Ack),
    /// Checked, for [`Receiver::commit`].
    Ready(ReadyBatch),
}

/// A checked batch: its valid events and what was skipped.
pub struct ReadyBatch {
    /// The answer so far (gateway id, epoch, status OK).
    ack: pb::Ack,
    range: (u64, u64),
    events: Vec<(u64, NewEvent)>,
    skipped: Vec<(u64, String)>,
}

/// How far one task has handed a session's batches to the store: the
/// session's epoch and the highest sequence handed over (or acknowledged
/// when the session opened).
pub type Tail = (u64, u64);

impl ReadyBatch {
    pub fn gateway(&self) -> &str {
        &self.ack.gateway_id
    }

    /// Whether every sequence before it is covered by what was handed over
    /// up to `tail`, in its session: the store then applies those first.
    pub fn joins(&self, tail: Option<Tail>) -> bool {
        matches!(tail, Some((epoch, last))
            if epoch == self.ack.epoch && self.range.0 <= last.saturating_add(1))
    }

    /// Moves `tail` past this batch, which is being handed over.
    pub fn advance(&self, tail: &mut Option<Tail>) {
        *tail = Some(match *tail {
            Some((epoch, last)) if epoch == self.ack.epoch => (epoch, last.max(self.range.1)),
            _ => (self.ack.epoch, self.range.1),
        });
    }

    /// Its first sequence.
    pub fn first(&self) -> u64 {
        self.range.0
    }
}

/// The transport-independent half of both receivers.
pub struct Receiver {
    store: Arc<dyn Store>,
    auth: Arc<Authenticator>,
    metrics: Arc<Metrics>,
    usage: Arc<Usage>,
    /// Per (workspace, gateway): the latest session epoch and its ack, for
    /// batches waiting on a gap. A new session replaces the old one's ack,
    /// which may be higher (a recreated buffer starts again at 0).
    acks: Mutex<HashMap<(String, String), watch::Sender<SessionAck>>>,
}

const MAX_TRACKED_GATEWAYS: usize = 100_000;

/// A gateway session's epoch and the highest sequence acked in it.
type SessionAck = (u64, u64);

impl Receiver {
    pub fn new(
        store: Arc<dyn Store>,
        auth: Arc<Authenticator>,
        metrics: Arc<Metrics>,
        usage: Arc<Usage>,
    ) -> Self {
        Receiver { store, auth, metrics, usage, acks: Mutex::new(HashMap::new()) }
    }

    /// Checks an `Authorization` value (`Bearer og_...`) for the ingest scope.
    pub async fn authenticate(&self, authorization: &str) -> Result<Principal> {
        let mut headers = HeaderMap::new();
        let value = HeaderValue::from_str(authorization)
            .map_err(|_| Error::Unauthorized("malformed credential"))?;
        headers.insert(header::AUTHORIZATION, value);
        let principal = self.auth.authenticate(&headers, self.store.as_ref()).await;
        let principal = principal.and_then(|p| p.require(Scope::Ingest).map(|()| p));
        if let Err(e) = &principal {
            self.metrics.reject(&format!("receiver_{}", e.code()));
        }
        principal
    }

    pub async fn hello(
        &self,
        principal: &Principal,
        hello: &pb::HelloRequest,
    ) -> Result<pb::HelloResponse> {
        check_gateway_id(&hello.gateway_id)?;
        if hello.buffer_id.len() > MAX_GATEWAY_ID_LEN {
            return Err(Error::validation("bufferId", "buffer id too long"));
        }
        let session = self
            .store
            .open_gateway_session(&principal.workspace_id, &hello.gateway_id, &hello.buffer_id)
            .await?;
        self.publish(principal, &hello.gateway_id, session.epoch, session.acked_sequence);
        tracing::info!(
            workspace = %principal.workspace_id,
            gateway = %hello.gateway_id,
            epoch = session.epoch,
            acked = session.acked_sequence,
            version = %hello.software_version,
            "gateway session opened"
        );
        Ok(pb::HelloResponse { epoch: session.epoch, acked_sequence: session.acked_sequence })
    }

    /// [`Receiver::commit`] once the batch's predecessor is acknowledged,
    /// or after `GAP_WAIT`: for a batch whose predecessor the caller did
    /// not hand over itself. Batches may arrive in any order (separate
    /// gRPC streams): one that overtook its predecessor waits for it here
    /// instead of being refused by the store as a gap; the store still
    /// decides, this only saves the round trip.
    pub async fn commit_after_predecessor(
        &self,
        principal: &Principal,
        transport: &str,
        ready: ReadyBatch,
    ) -> pb::Ack {
        let previous = ready.range.0 - 1;
        self.wait_for_ack(principal, &ready.ack.gateway_id, ready.ack.epoch, previous).await;
        self.commit(principal, transport, ready).await
    }

    /// The first half of handling a batch, which needs no store: shape
    /// checks and validation of every envelope. A stream that runs it for
    /// the next batch while the previous one commits keeps the store's
    /// writer and the async threads busy at once (see `grpc`).
    pub fn prepare(&self, mut batch: pb::Batch) -> Prepared {
        let ack = pb::Ack {
            gateway_id: batch.gateway_id.clone(),
            epoch: batch.epoch,
            acked_sequence: 0,
            status: pb::AckStatus::Ok as i32,
            error: String::new(),
        };
        match self.check(&mut batch) {
            Ok((events, skipped)) => Prepared::Ready(ReadyBatch {
                ack,
                range: (batch.first_sequence, batch.last_sequence),
                events,
                skipped,
            }),
            Err(reason) => {
                self.metrics.reject("batch_rejected");
                tracing::warn!(gateway = %batch.gateway_id, %reason, "batch rejected");
                Prepared::Answered(pb::Ack {
                    status: pb::AckStatus::Rejected as i32,
                    error: reason,
                    ..ack
                })
            }
        }
    }

    /// Caches the workspace's quota count ahead of a commit (see
    /// `InFlight::hand_over`); store trouble shows again in the commit.
    pub async fn refresh_quota(&self, principal: &Principal) {
        let _ = self.usage.refresh_quota(self.store.as_ref(), &principal.workspace_id).await;
    }

    /// The second half of handling a batch: stores a prepared batch and
    /// answers for it; never fails: every outcome is an ack the gateway can
    /// act on. The store applies a gateway's commits in the order
    /// they are handed over (see `GatewayStore::commit_gateway_batch`), so
    /// one task may start the next batch's commit before this one's answer.
    pub async fn commit(
        &self,
        principal: &Principal,
        transport: &str,
        ready: ReadyBatch,
    ) -> pb::Ack {
        let ReadyBatch { mut ack, mut range, mut events, skipped } = ready;
        let (gateway, epoch) = (ack.gateway_id.clone(), ack.epoch);
        let workspace = &principal.workspace_id;
        let want = events.len() as u64;
        // Store trouble here shows again in the commit and is answered there.
        let quota =
            self.usage.hold_quota(self.store.as_ref(), workspace, want).await.ok().flatten();
        // Past the quota, what fits of the batch is stored (a prefix: the
        // ack is cumulative) and the rest waits at the gateway.
        let limit = quota.as_ref().map(QuotaHold::limit);
        let fits = limit.unwrap_or(want);
        let held_back = fits < want;
        if held_back {
            if fits == 0 {
                self.metrics.reject("quota_exceeded");
                tracing::info!(%gateway, "monthly event quota used up: the batch waits at the gateway");
                return quota_used_up(ack);
            }
            events.truncate(usize::try_from(fits).unwrap_or(usize::MAX));
            range.1 = events.last().map_or(range.1, |(seq, _)| *seq);
        }
        // Those past the prefix come again with the rest, and count then.
        let skipped: Vec<String> =
            skipped.into_iter().filter(|(seq, _)| *seq <= range.1).map(|(_, s)| s).collect();
        let outcome =
            self.store.commit_gateway_batch(workspace, &gateway, epoch, range, events, limit).await;
        match outcome {
            Ok(BatchCommit::Acked { acked_sequence, inserted }) => {
                if let Some(quota) = quota {
                    quota.stored(inserted);
                }
                self.metrics.ingested(transport, inserted);
                self.publish(principal, &gateway, epoch, acked_sequence);
                ack.acked_sequence = acked_sequence;
                if !skipped.is_empty() {
                    self.metrics
                        .rejections
                        .get_or_create(&crate::telemetry::ReasonLabels {
                            reason: "invalid_event".into(),
                        })
                        .inc_by(skipped.len() as u64);
                    ack.error = format!(
                        "skipped {} invalid event(s): {}",
                        skipped.len(),
                        skipped.join("; ")
                    );
                }
                if held_back {
                    self.metrics.reject("quota_exceeded");
                    tracing::info!(%gateway, acked_sequence, "monthly event quota used up: the rest of the batch waits at the gateway");
                    return quota_used_up(ack);
                }
            }
            Ok(BatchCommit::Gap { acked_sequence }) => {
                ack.status = pb::AckStatus::RetryLater as i32;
                ack.acked_sequence = acked_sequence;
                ack.error = format!(
                    "batch starts at {} but only {acked_sequence} is stored: an earlier batch is missing",
                    range.0
                );
            }
            Ok(BatchCommit::Fenced { current_epoch }) => {
                self.metrics.reject("fenced");
                ack.status = pb::AckStatus::Fenced as i32;
                ack.error = format!("epoch {epoch} is stale; current is {current_epoch}");
            }
            Err(e) => {
                tracing::warn!(%gateway, error = %e, "batch not stored");
                self.metrics.reject("store_unavailable");
                ack.status = if e.retryable() {
                    pb::AckStatus::RetryLater as i32
                } else {
                    pb::AckStatus::Rejected as i32
                };
                ack.error = e.to_string();
            }
        }
        ack
    }

    /// Shape checks, then per-event validation. Returns the valid events
    /// with their sequences, and a description of each skipped one. The
    /// events move out of `batch` into them.
    fn check(&self, batch: &mut pb::Batch) -> Result<CheckedBatch, String> {
        check_gateway_id(&batch.gateway_id).map_err(|e| e.to_string())?;
        let (first, last) = (batch.first_sequence, batch.last_sequence);
        if first == 0 || last < first {
            return Err(format!("invalid sequence range {first}..={last}"));
        }
        // The stores keep sequences as signed 64-bit integers.
        if last > MAX_SEQUENCE {
            return Err(format!(
                "sequence range {first}..={last} passes the highest sequence, {MAX_SEQUENCE}"
            ));
        }
        if batch.events.len() > MAX_BATCH_EVENTS {
            return Err(format!(
                "{} events exceed the limit of {MAX_BATCH_EVENTS}",
                batch.events.len()
            ));
        }
        let now = crate::now_ms();
        let mut previous = first - 1;
        let mut valid = Vec::with_capacity(batch.events.len());
        let mut skipped = Vec::new();
        for (i, mut message) in std::mem::take(&mut batch.events).into_iter().enumerate() {
            let seq = message.sequence;
            if seq <= previous || seq > last {
                return Err(format!(
                    "events[{i}]: sequence {seq} is out of order or outside {first}..={last}"
                ));
            }
            previous = seq;
            if message.id.is_empty() || message.id.len() > MAX_EVENT_ID_LEN {
                return Err(format!("events[{i}]: id must be 1 to {MAX_EVENT_ID_LEN} bytes"));
            }
            // The gateway's clock dates events that carry no timestamp of
            // their own, so it is held to the window a timestamp must lie
            // in; one further off gives way to the cloud's.
            let window = now.saturating_sub(MAX_TIMESTAMP_AGE_MS)..=now + MAX_TIMESTAMP_LEAD_MS;
            let received_at = message.received_at_ms.filter(|t| window.contains(t));
            let received_at = received_at.unwrap_or(now);
            let id = std::mem::take(&mut message.id);
            let event = Event::from_pb(message, now)
                .map_err(Error::from)
                .and_then(|e| crate::api::ingest::finish_envelope(e, received_at));
            match event {
                Ok(event) => valid.push((seq, NewEvent { id, received_at, event })),
                Err(e) => skipped.push((seq, format!("seq {seq} ({id}): {e}"))),
            }
        }
        Ok((valid, skipped))
    }

    /// Records `gateway`'s ack in session `epoch`. A later epoch replaces
    /// whatever an earlier one recorded; a late answer of a fenced session
    /// changes nothing.
    fn publish(&self, principal: &Principal, gateway: &str, epoch: u64, acked: u64) {
        let Ok(mut acks) = self.acks.lock() else { return };
        if acks.len() >= MAX_TRACKED_GATEWAYS {
            acks.retain(|_, tx| tx.receiver_count() > 0);
        }
        let key = (principal.workspace_id.clone(), gateway.to_owned());
        let sender = acks.entry(key).or_insert_with(|| watch::channel((0, 0)).0);
        sender.send_if_modified(|current| {
            let advanced = (epoch, acked) > *current;
            if advanced {
                *current = (epoch, acked);
            }
            advanced
        });
    }

    /// Waits (at most [`GAP_WAIT`]) until `gateway`'s ack in session
    /// `epoch` reaches `at_least`. Returns at once when this process knows
    /// no ack of that session (none since its start, forgotten among too
    /// many gateways, or a newer session exists): the store judges better
    /// than a wait on a stale value.
    async fn wait_for_ack(&self, principal: &Principal, gateway: &str, epoch: u64, at_least: u64) {
        let receiver = {
            let Ok(acks) = self.acks.lock() else { return };
            let key = (principal.workspace_id.clone(), gateway.to_owned());
            match acks.get(&key) {
                Some(sender) => sender.subscribe(),
                None => return,
            }
        };
        let mut receiver = receiver;
        let ready = |&(e, acked): &SessionAck| e != epoch || acked >= at_least;
        let _ = tokio::time::timeout(GAP_WAIT, receiver.wait_for(ready)).await;
    }
}

/// The answer while the workspace's monthly event quota is used up: retry
/// later, the events stay in the gateway's buffer (what `ack` acknowledges
/// of the batch is stored).
fn quota_used_up(ack: pb::Ack) -> pb::Ack {
    pb::Ack {
        status: pb::AckStatus::RetryLater as i32,
        error: "the workspace's monthly event quota is used up: the events stay in the gateway's buffer until it allows them".to_owned(),
        ..ack
    }
}

fn check_gateway_id(id: &str) -> Result<()> {
    if id.is_empty() || id.len() > MAX_GATEWAY_ID_LEN || id.chars().any(char::is_control) {
        return Err(Error::validation(
            "gatewayId",
            format!(
                "gateway id must be 1 to {MAX_GATEWAY_ID_LEN} bytes without control characters"
            ),
        ));
    }
    Ok(())
}
