//! [`QuicUplink`]: quinn over TLS 1.3, ALPN `opgraph/1`, framed with
//! `opgraph_proto::frame`.
//!
//! A session is one QUIC connection. Its first bidirectional stream
//! carries a `SessionOpen` frame (credential and Hello; the stream is
//! finished after it) and gets the `HelloResponse`. Then each batch travels
//! on a stream of its own (Batch frame, finish) and is answered by one Ack
//! frame on that stream. Each batch stream runs in a task of the session,
//! so several are in flight at once and a lost packet delays one batch
//! only; finished streams put their ack (or error) into a channel that
//! [`Uplink::recv_ack`] reads.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use opgraph_proto::encoded_batch::EncodedBatch;
use opgraph_proto::frame::{self, FrameKind, HEADER_LEN};
use opgraph_proto::pb;
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use super::congestion::{LossTolerant, LossTolerantConfig};
use super::tls::ClientTls;
use super::{Congestion, PathStats, Uplink, UplinkConfig};
use crate::error::{Error, Result};

/// The cloud's application close codes (`cloud/src/receiver/quic.rs`).
const CLOSE_UNAUTHORIZED: u32 = 401;
const CLOSE_BAD_SESSION: u32 = 400;
const CLOSE_FENCED: u32 = 409;
/// Our close code when a session ends on our side.
const CLOSE_DONE: u32 = 0;
/// zstd level of batch frames: fast, and already several times smaller.
const ZSTD_LEVEL: i32 = 1;
/// Largest answer frame read (HelloResponse, Ack: a few bytes plus an
/// error text).
const MAX_ANSWER_BYTES: usize = HEADER_LEN + 64 * 1024;

/// The QUIC transport.
pub struct QuicUplink {
    endpoint_name: String,
    host_port: String,
    server_name: String,
    authorization: String,
    client_config: quinn::ClientConfig,
    max_in_flight: usize,
    socket: Option<quinn::Endpoint>,
    session: Option<Session>,
    /// Path counters of the sessions that ended.
    ended: PathStats,
}

struct Session {
    connection: quinn::Connection,
    acks_tx: mpsc::Sender<Result<pb::Ack>>,
    acks: mpsc::Receiver<Result<pb::Ack>>,
    streams: JoinSet<()>,
}

impl Session {
    fn path_stats(&self) -> PathStats {
        let path = self.connection.stats().path;
        let noise_losses = self
            .connection
            .congestion_state()
            .into_any()
            .downcast::<LossTolerant>()
            .map_or(0, |c| c.noise_losses());
        PathStats {
            rtt: path.rtt,
            sent_packets: path.sent_packets,
            lost_packets: path.lost_packets,
            congestion_events: path.congestion_events,
            noise_losses,
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.streams.abort_all();
        self.connection.close(CLOSE_DONE.into(), b"session ended");
    }
}

impl QuicUplink {
    pub fn new(config: &UplinkConfig, tls: ClientTls) -> Result<Self> {
        let crypto = tls.rustls_config(vec![frame::ALPN.to_vec()])?;
        let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(crypto).map_err(|e| {
            Error::InvalidConfig { problems: vec![format!("uplink: QUIC TLS configuration: {e}")] }
        })?;
        let mut client_config = quinn::ClientConfig::new(Arc::new(crypto));
        let mut transport = quinn::TransportConfig::default();
        transport.keep_alive_interval(Some(Duration::from_secs(5)));
        if let Ok(idle) = Duration::from_secs(30).try_into() {
            transport.max_idle_timeout(Some(idle));
        }
        if config.congestion == Congestion::LossTolerant {
            transport.congestion_controller_factory(Arc::new(LossTolerantConfig::default()));
        }
        client_config.transport_config(Arc::new(transport));
        let host_port = config.endpoint.trim().to_owned();
        Ok(QuicUplink {
            endpoint_name: format!("quic://{host_port}"),
            host_port,
            server_name: config.server_name(),
            authorization: format!("Bearer {}", config.api_key.0),
            client_config,
            max_in_flight: config.max_in_flight,
            socket: None,
            session: None,
            ended: PathStats::default(),
        })
    }

    fn uplink_error(&self, reason: impl std::fmt::Display) -> Error {
        Error::Uplink { endpoint: self.endpoint_name.clone(), reason: reason.to_string() }
    }

    async fn resolve(&self) -> Result<SocketAddr> {
        let mut addrs = tokio::net::lookup_host(&self.host_port)
            .await
            .map_err(|e| self.uplink_error(format_args!("resolving: {e}")))?;
        addrs.next().ok_or_else(|| self.uplink_error("resolving: no address"))
    }

    /// The local UDP socket, bound once in the remote's address family.
    fn socket(&mut self, remote: SocketAddr) -> Result<quinn::Endpoint> {
        if let Some(socket) = &self.socket
            && socket.local_addr().is_ok_and(|a| a.is_ipv4() == remote.is_ipv4())
        {
            return Ok(socket.clone());
        }
        let local: SocketAddr =
            if remote.is_ipv4() { ([0, 0, 0, 0], 0).into() } else { ([0u16; 8], 0).into() };
        let mut socket =
            quinn::Endpoint::client(local).map_err(|e| self.uplink_error(format_args!("{e}")))?;
        socket.set_default_client_config(self.client_config.clone());
        self.socket = Some(socket.clone());
        Ok(socket)
    }
}

/// Why a connection went away, as our error (401 is a refused credential).
fn closed_error(endpoint: &str, connection: &quinn::Connection, fallback: String) -> Error {
    match connection.close_reason() {
        Some(quinn::ConnectionError::ApplicationClosed(close)) => {
            let reason = String::from_utf8_lossy(&close.reason).into_owned();
            let code = close.error_code.into_inner();
            if code == u64::from(CLOSE_UNAUTHORIZED) {
                Error::Unauthorized { endpoint: endpoint.to_owned(), reason }
            } else if code == u64::from(CLOSE_BAD_SESSION) {
                Error::Protocol {
                    endpoint: endpoint.to_owned(),
                    reason: format!("session refused: {reason}"),
                }
            } else if code == u64::from(CLOSE_FENCED) {
                Error::Uplink { endpoint: endpoint.to_owned(), reason: format!("fenced: {reason}") }
            } else {
                Error::Uplink {
                    endpoint: endpoint.to_owned(),
                    reason: format!("closed by the cloud ({code}): {reason}"),
                }
            }
        }
        Some(other) => Error::Uplink { endpoint: endpoint.to_owned(), reason: other.to_string() },
        None => Error::Uplink { endpoint: endpoint.to_owned(), reason: fallback },
    }
}

/// Writes `request` on a new stream, finishes it, reads the one answer
/// frame of kind `expected`.
async fn exchange(
    endpoint: &str,
    connection: &quinn::Connection,
    request: &[u8],
    expected: FrameKind,
) -> Result<Vec<u8>> {
    let lost = |e: &dyn std::fmt::Display| closed_error(endpoint, connection, e.to_string());
    let (mut send, mut recv) = connection.open_bi().await.map_err(|e| lost(&e))?;
    send.write_all(request).await.map_err(|e| lost(&e))?;
    send.finish().map_err(|e| lost(&e))?;
    let mut bytes = recv.read_to_end(MAX_ANSWER_BYTES).await.map_err(|e| lost(&e))?;
    let protocol = |reason: String| Error::Protocol { endpoint: endpoint.to_owned(), reason };
    let header: [u8; HEADER_LEN] = bytes
        .get(..HEADER_LEN)
        .and_then(|h| h.try_into().ok())
        .ok_or_else(|| protocol("truncated answer frame".into()))?;
    let (kind, len) = frame::decode_header(header).map_err(|e| protocol(e.to_string()))?;
    if kind != expected {
        return Err(protocol(format!("expected a {expected:?} frame, got {kind:?}")));
    }
    if bytes.len() - HEADER_LEN != len {
        return Err(protocol(format!("answer frame says {len} bytes, carries more or fewer")));
    }
    bytes.drain(..HEADER_LEN);
    Ok(bytes)
}

#[async_trait]
impl Uplink for QuicUplink {
    fn endpoint(&self) -> &str {
        &self.endpoint_name
    }

    async fn connect(&mut self, hello: &pb::HelloRequest) -> Result<pb::HelloResponse> {
        self.disconnect().await;
        let remote = self.resolve().await?;
        let socket = self.socket(remote)?;
        let connection = socket
            .connect(remote, &self.server_name)
            .map_err(|e| self.uplink_error(e))?
            .await
            .map_err(|e| self.uplink_error(format_args!("handshake: {e}")))?;
        let open = pb::SessionOpen {
            authorization: self.authorization.clone(),
            hello: Some(hello.clone()),
        };
        let request = frame::encode_message(FrameKind::SessionOpen, &open);
        let body =
            exchange(&self.endpoint_name, &connection, &request, FrameKind::HelloResponse).await?;
        let response = frame::decode_message::<pb::HelloResponse>(&body).map_err(|e| {
            Error::Protocol { endpoint: self.endpoint_name.clone(), reason: e.to_string() }
        })?;
        let (acks_tx, acks) = mpsc::channel(self.max_in_flight.max(1) * 2);
        self.session = Some(Session { connection, acks_tx, acks, streams: JoinSet::new() });
        Ok(response)
    }

    async fn send(&mut self, batch: EncodedBatch) -> Result<()> {
        let endpoint = self.endpoint_name.clone();
        let Some(session) = self.session.as_mut() else {
            return Err(self.uplink_error("no open session"));
        };
        while session.streams.try_join_next().is_some() {}
        let request = frame::encode_batch(&batch, ZSTD_LEVEL)
            .map_err(|e| Error::Protocol { endpoint: endpoint.clone(), reason: e.to_string() })?;
        let connection = session.connection.clone();
        let acks = session.acks_tx.clone();
        session.streams.spawn(async move {
            let answer =
                exchange(&endpoint, &connection, &request, FrameKind::Ack).await.and_then(|body| {
                    frame::decode_message::<pb::Ack>(&body)
                        .map_err(|e| Error::Protocol { endpoint, reason: e.to_string() })
                });
            let _ = acks.send(answer).await;
        });
        Ok(())
    }

    async fn recv_ack(&mut self) -> Result<pb::Ack> {
        let Some(session) = self.session.as_mut() else {
            return Err(self.uplink_error("no open session"));
        };
        // Acks that already arrived go first; then a connection that died
        // while idle ends the session even with no stream in flight.
        let connection = session.connection.clone();
        tokio::select! {
            biased;
            answer = session.acks.recv() => match answer {
                Some(answer) => answer,
                None => Err(self.uplink_error("the ack channel closed")),
            },
            reason = connection.closed() => {
                Err(closed_error(&self.endpoint_name, &connection, reason.to_string()))
            }
        }
    }

    async fn disconnect(&mut self) {
        if let Some(session) = self.session.take() {
            self.ended = self.ended.plus(session.path_stats());
        }
    }

    fn path_stats(&self) -> Option<PathStats> {
        Some(match &self.session {
            Some(session) => self.ended.plus(session.path_stats()),
            None => self.ended,
        })
    }
}
