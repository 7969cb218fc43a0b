//! The QUIC receiver (quinn, TLS 1.3, ALPN `opgraph/1`).
//!
//! The first stream of a connection carries `SessionOpen` (credential and
//! Hello) and gets the `HelloResponse`. After that each batch comes on a
//! stream of its own and is answered with an `Ack` on that stream: a lost
//! packet delays only the batch it belonged to, which is why QUIC keeps its
//! throughput on a lossy link where one TCP stream stalls. Frames are the
//! bounded codec of `opgraph_proto::frame`. Streams deliver batches in any
//! order; one task per connection (`sequence`) hands them to the store in
//! sequence order.
//!
//! Connections that have not authenticated yet are few at a time
//! (`receivers.quic_max_unauthenticated_connections`): each holds a place
//! from before its handshake until its key is accepted, and one that finds
//! none is refused before the handshake, which is what a flood costs most.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use opgraph_proto::frame::{self, FrameKind, HEADER_LEN};
use opgraph_proto::pb;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};
use tokio::time::{Instant, sleep_until};
use tokio_util::sync::CancellationToken;

use super::in_flight::InFlight;
use super::tls::TlsMaterial;
use super::{GAP_WAIT, Prepared, ReadyBatch, Receiver, Tail};
use crate::auth::Principal;

/// Batches a gateway may have in flight on one connection.
const MAX_STREAMS: u32 = 64;
/// Largest SessionOpen frame (a key and a Hello: a few hundred bytes),
/// read before the connection is authenticated.
const MAX_SESSION_OPEN_BYTES: usize = 64 * 1024;
/// From a connection's arrival to its accepted key, at most: the
/// handshake, the first stream and its SessionOpen share it, so a stranger
/// holds its place among the unauthenticated ones this long and no longer
/// (one timeout per step let a slow one keep it for the idle timeout and
/// twice this).
const OPEN_TIMEOUT: Duration = Duration::from_secs(10);
/// Application close codes, so a gateway knows why it was dropped.
pub const CLOSE_UNAUTHORIZED: u32 = 401;
pub const CLOSE_BAD_SESSION: u32 = 400;
pub const CLOSE_FENCED: u32 = 409;
pub const CLOSE_SHUTDOWN: u32 = 0;

/// Binds and serves until `shutdown`, with at most `max_unauthenticated`
/// connections open at once that have not yet authenticated; returns the
/// bound address at once.
pub fn start(
    addr: SocketAddr,
    receiver: Arc<Receiver>,
    tls: &TlsMaterial,
    max_unauthenticated: usize,
    shutdown: CancellationToken,
) -> anyhow::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let crypto = tls.rustls_server_config(vec![frame::ALPN.to_vec()])?;
    let crypto = quinn::crypto::rustls::QuicServerConfig::try_from(crypto)?;
    let mut config = quinn::ServerConfig::with_crypto(Arc::new(crypto));
    let mut transport = quinn::TransportConfig::default();
    // One stream, the session's, until the connection is authenticated:
    // a stranger's connection must not hold a receive window per stream.
    transport.max_concurrent_bidi_streams(1u32.into());
    transport.max_concurrent_uni_streams(0u32.into());
    transport.max_idle_timeout(Some(Duration::from_secs(30).try_into()?));
    config.transport_config(Arc::new(transport));
    let endpoint = quinn::Endpoint::server(config, addr)
        .map_err(|e| anyhow::anyhow!("receivers.quic_addr {addr}: {e}"))?;
    let bound = endpoint.local_addr()?;
    let unauthenticated = Arc::new(Semaphore::new(max_unauthenticated));
    let task = tokio::spawn(async move {
        let connections = tokio_util::task::TaskTracker::new();
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                incoming = endpoint.accept() => {
                    let Some(incoming) = incoming else { break };
                    // Taken before the handshake: a handshake is most of
                    // what a stranger's connection costs.
                    let Ok(place) = Arc::clone(&unauthenticated).try_acquire_owned() else {
                        receiver.metrics.reject("quic_unauthenticated_limit");
                        tracing::debug!(
                            peer = %incoming.remote_address(),
                            "QUIC connection refused: too many connections not yet authenticated"
                        );
                        incoming.refuse();
                        continue;
                    };
                    let receiver = Arc::clone(&receiver);
                    let stop = shutdown.clone();
                    connections.spawn(async move {
                        if let Err(e) = connection(incoming, receiver, place, stop).await {
                            tracing::debug!(error = %e, "QUIC connection ended");
                        }
                    });
                }
            }
        }
        endpoint.close(CLOSE_SHUTDOWN.into(), b"shutting down");
        connections.close();
        connections.wait().await;
        endpoint.wait_idle().await;
    });
    Ok((bound, task))
}

/// Reads one whole frame: the peer finishes the stream after it. Reading to
/// the end with a bound grows the buffer only as bytes arrive, so a peer
/// that announces a large frame and stalls costs nothing.
async fn read_frame(
    recv: &mut quinn::RecvStream,
    max: usize,
) -> anyhow::Result<(FrameKind, Vec<u8>)> {
    let mut bytes = recv.read_to_end(HEADER_LEN + max).await?;
    let header: [u8; HEADER_LEN] = bytes
        .get(..HEADER_LEN)
        .and_then(|h| h.try_into().ok())
        .ok_or_else(|| anyhow::anyhow!("truncated frame"))?;
    let (kind, len) = frame::decode_header(header)?;
    if bytes.len() - HEADER_LEN != len {
        anyhow::bail!("frame says {len} bytes but carries {}", bytes.len() - HEADER_LEN);
    }
    bytes.drain(..HEADER_LEN);
    Ok((kind, bytes))
}

/// The session a connection opened: who, which gateway, and where its
/// batches start ([`Tail`]).
struct Session {
    principal: Principal,
    /// The credential, checked again at every batch: a key revoked while
    /// the connection is open must stop working.
    authorization: String,
    gateway: String,
    start: Tail,
}

/// Reads the `SessionOpen` and answers it. `place` (among the connections
/// not yet authenticated) is given back once the key is accepted, or on
/// return, whatever ended the attempt.
async fn open_session(
    connection: &quinn::Connection,
    receiver: &Receiver,
    place: OwnedSemaphorePermit,
    deadline: Instant,
) -> anyhow::Result<Session> {
    let late = |_| {
        receiver.metrics.reject("open_timeout");
        connection.close(CLOSE_BAD_SESSION.into(), b"no SessionOpen in time");
        anyhow::anyhow!("no SessionOpen within {OPEN_TIMEOUT:?} of connecting")
    };
    let (mut send, mut recv) =
        tokio::time::timeout_at(deadline, connection.accept_bi()).await.map_err(late)??;
    let opening = read_frame(&mut recv, MAX_SESSION_OPEN_BYTES);
    let (kind, body) = match tokio::time::timeout_at(deadline, opening).await.map_err(late)? {
        Ok(frame) => frame,
        Err(e) => {
            receiver.metrics.reject("bad_frame");
            connection.close(CLOSE_BAD_SESSION.into(), b"unreadable SessionOpen");
            return Err(e);
        }
    };
    let open = match kind {
        FrameKind::SessionOpen => frame::decode_message::<pb::SessionOpen>(&body)?,
        other => {
            receiver.metrics.reject("bad_frame");
            connection.close(CLOSE_BAD_SESSION.into(), b"expected SessionOpen");
            anyhow::bail!("expected SessionOpen, got {other:?}");
        }
    };
    let principal = match receiver.authenticate(&open.authorization).await {
        Ok(p) => p,
        Err(e) => {
            connection.close(CLOSE_UNAUTHORIZED.into(), e.to_string().as_bytes());
            anyhow::bail!("unauthorized gateway: {e}");
        }
    };
    drop(place);
    let hello = open.hello.unwrap_or_default();
    match receiver.hello(&principal, &hello).await {
        Ok(response) => {
            // Before the answer: a gateway opens its batch streams on it.
            connection.set_max_concurrent_bi_streams(MAX_STREAMS.into());
            send.write_all(&frame::encode_message(FrameKind::HelloResponse, &response)).await?;
            send.finish()?;
            let start = (response.epoch, response.acked_sequence);
            Ok(Session {
                principal,
                authorization: open.authorization,
                gateway: hello.gateway_id,
                start,
            })
        }
        Err(e) => {
            connection.close(CLOSE_BAD_SESSION.into(), e.to_string().as_bytes());
            anyhow::bail!("hello refused: {e}");
        }
    }
}

async fn connection(
    incoming: quinn::Incoming,
    receiver: Arc<Receiver>,
    place: OwnedSemaphorePermit,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + OPEN_TIMEOUT;
    let Ok(connection) = tokio::time::timeout_at(deadline, incoming).await else {
        receiver.metrics.reject("open_timeout");
        anyhow::bail!("QUIC handshake not done within {OPEN_TIMEOUT:?}");
    };
    let connection = connection?;
    let session = open_session(&connection, &receiver, place, deadline).await?;
    let principal = Arc::new(session.principal.clone());
    let authorization: Arc<str> = Arc::from(session.authorization.as_str());
    let gateway: Arc<str> = Arc::from(session.gateway.as_str());
    let streams = tokio_util::task::TaskTracker::new();
    let (handovers, to_sequencer) = mpsc::channel(MAX_STREAMS as usize);
    streams.spawn(sequence(Arc::clone(&receiver), session, to_sequencer));
    loop {
        let (send, recv) = tokio::select! {
            _ = shutdown.cancelled() => break,
            stream = connection.accept_bi() => match stream {
                Ok(stream) => stream,
                Err(_) => break,
            },
        };
        let (receiver, principal, connection, handovers, gateway, authorization) = (
            Arc::clone(&receiver),
            Arc::clone(&principal),
            connection.clone(),
            handovers.clone(),
            Arc::clone(&gateway),
            Arc::clone(&authorization),
        );
        streams.spawn(async move {
            let stream = BatchStream {
                receiver: &receiver,
                principal: &principal,
                authorization: &authorization,
                gateway: &gateway,
                handovers,
            };
            if let Err(e) = stream.run(send, recv, &connection).await {
                tracing::debug!(error = %e, "QUIC batch stream failed");
            }
        });
    }
    // The sequencer ends once the streams still running are answered.
    drop(handovers);
    streams.close();
    streams.wait().await;
    Ok(())
}

/// What a batch stream needs besides its own two halves.
struct BatchStream<'a> {
    receiver: &'a Arc<Receiver>,
    principal: &'a Principal,
    authorization: &'a str,
    /// The gateway whose session the connection opened.
    gateway: &'a str,
    handovers: mpsc::Sender<Handover>,
}

impl BatchStream<'_> {
    async fn run(
        self,
        mut send: quinn::SendStream,
        mut recv: quinn::RecvStream,
        connection: &quinn::Connection,
    ) -> anyhow::Result<()> {
        if let Err(e) = self.receiver.authenticate(self.authorization).await {
            tracing::warn!(error = %e, "a gateway's credential stopped working mid-session");
            connection.close(CLOSE_UNAUTHORIZED.into(), e.to_string().as_bytes());
            return Ok(());
        }
        let decoded = match read_frame(&mut recv, frame::MAX_FRAME_BYTES).await {
            Ok((FrameKind::Batch, body)) => frame::decode_batch(&body).map_err(anyhow::Error::from),
            Ok((other, _)) => Err(anyhow::anyhow!("expected a Batch frame, got {other:?}")),
            Err(e) => Err(e),
        };
        let ack = match decoded {
            Ok(batch) => self.answer(batch).await,
            Err(e) => {
                self.receiver.metrics.reject("bad_frame");
                tracing::warn!(error = %e, "bad QUIC batch frame");
                pb::Ack {
                    status: pb::AckStatus::Rejected as i32,
                    error: e.to_string(),
                    ..pb::Ack::default()
                }
            }
        };
        let fenced = ack.status == pb::AckStatus::Fenced as i32;
        send.write_all(&frame::encode_message(FrameKind::Ack, &ack)).await?;
        send.finish()?;
        if fenced {
            // Let the ack reach the gateway before the connection goes.
            let _ = send.stopped().await;
            connection.close(CLOSE_FENCED.into(), b"a newer session of this gateway exists");
        }
        Ok(())
    }

    /// Checks a batch and has it committed: by the connection's sequencer
    /// when it is the connection's gateway's, else here, as every batch
    /// was before (a gateway bug; the store decides, and the sequencer is
    /// not held up by it).
    async fn answer(&self, batch: pb::Batch) -> pb::Ack {
        let ready = match self.receiver.prepare(batch) {
            Prepared::Answered(ack) => return ack,
            Prepared::Ready(ready) if ready.gateway() != self.gateway => {
                return self.receiver.commit_after_predecessor(self.principal, "quic", ready).await;
            }
            Prepared::Ready(ready) => ready,
        };
        let (answer, answered) = oneshot::channel();
        match self.handovers.send(Handover { ready, answer }).await {
            Ok(()) => answered.await.unwrap_or_else(|_| retry_later()),
            Err(mpsc::error::SendError(Handover { ready, .. })) => {
                self.receiver.commit_after_predecessor(self.principal, "quic", ready).await
            }
        }
    }
}

fn retry_later() -> pb::Ack {
    pb::Ack {
        status: pb::AckStatus::RetryLater as i32,
        error: "the batch was not committed; send it again".into(),
        ..pb::Ack::default()
    }
}

/// A checked batch on its way to the sequencer, and where its answer goes.
struct Handover {
    ready: ReadyBatch,
    answer: oneshot::Sender<pb::Ack>,
}

/// Hands a connection's batches to the store in sequence order, from this
/// one task: parallel streams deliver them in any order, and a batch that
/// reached the store before its predecessor would be refused as a gap. A
/// batch whose predecessors were all handed over goes at once, up to
/// `MAX_IN_FLIGHT` ahead of the answers, so that the store's writer can
/// take several in one transaction; one that arrived early waits here for
/// them, at most [`GAP_WAIT`], and then goes anyway (the store decides).
async fn sequence(
    receiver: Arc<Receiver>,
    session: Session,
    mut handovers: mpsc::Receiver<Handover>,
) {
    let Session { principal, start, .. } = session;
    let mut tail = Some(start);
    let mut in_flight: InFlight<oneshot::Sender<pb::Ack>> = InFlight::new();
    // Batches that arrived before a predecessor, by first sequence, then
    // arrival; with the time they give up waiting.
    let mut early: BTreeMap<(u64, u64), (Handover, Instant)> = BTreeMap::new();
    let mut arrivals = 0u64;
    let mut open = true;
    while open || !in_flight.is_empty() || !early.is_empty() {
        let give_up = early.values().map(|(_, at)| *at).min();
        tokio::select! {
            biased;
            Some((ack, answer)) = in_flight.next() => {
                let _ = answer.send(ack);
            }
            handover = handovers.recv(), if open && !in_flight.is_full() => {
                let Some(handover) = handover else {
                    open = false;
                    continue;
                };
                if handover.ready.joins(tail) {
                    hand_over(&mut in_flight, &mut tail, &receiver, &principal, handover).await;
                } else {
                    arrivals += 1;
                    let key = (handover.ready.first(), arrivals);
                    early.insert(key, (handover, Instant::now() + GAP_WAIT));
                }
            }
            () = sleep_until(give_up.unwrap_or_else(Instant::now)), if give_up.is_some() && !in_flight.is_full() => {
                let now = Instant::now();
                let expired = early.iter().find(|(_, (_, at))| *at <= now).map(|(key, _)| *key);
                if let Some((handover, _)) = expired.and_then(|key| early.remove(&key)) {
                    hand_over(&mut in_flight, &mut tail, &receiver, &principal, handover).await;
                }
            }
        }
        // Early batches that the last hand-over joined go next, in order.
        while !in_flight.is_full() {
            let Some(entry) = early.first_entry() else { break };
            if !entry.get().0.ready.joins(tail) {
                break;
            }
            let (handover, _) = entry.remove();
            hand_over(&mut in_flight, &mut tail, &receiver, &principal, handover).await;
        }
    }
}

async fn hand_over(
    in_flight: &mut InFlight<oneshot::Sender<pb::Ack>>,
    tail: &mut Option<Tail>,
    receiver: &Arc<Receiver>,
    principal: &Principal,
    Handover { ready, answer }: Handover,
) {
    ready.advance(tail);
    in_flight.hand_over(receiver, principal, "quic", ready, answer).await;
}
