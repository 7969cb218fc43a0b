//! The QUIC receiver (quinn, TLS 1.3, ALPN `opgraph/1`).
//!
//! The first stream of a connection carries `SessionOpen` (credential and
//! Hello) and gets the `HelloResponse`. After that each batch comes on a
//! stream of its own and is answered with an `Ack` on that stream: a lost
//! packet delays only the batch it belonged to, which is why QUIC keeps its
//! throughput on a lossy link where one TCP stream stalls. Frames are the
//! bounded codec of `opgraph_proto::frame`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use opgraph_proto::frame::{self, FrameKind, HEADER_LEN};
use opgraph_proto::pb;
use tokio_util::sync::CancellationToken;

use super::Receiver;
use super::tls::TlsMaterial;
use crate::auth::Principal;

/// Batches a gateway may have in flight on one connection.
const MAX_STREAMS: u32 = 64;
const OPEN_TIMEOUT: Duration = Duration::from_secs(10);
/// Application close codes, so a gateway knows why it was dropped.
pub const CLOSE_UNAUTHORIZED: u32 = 401;
pub const CLOSE_BAD_SESSION: u32 = 400;
pub const CLOSE_FENCED: u32 = 409;
pub const CLOSE_SHUTDOWN: u32 = 0;

/// Binds and serves until `shutdown`; returns the bound address at once.
pub fn start(
    addr: SocketAddr,
    receiver: Arc<Receiver>,
    tls: &TlsMaterial,
    shutdown: CancellationToken,
) -> anyhow::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let crypto = tls.rustls_server_config(vec![frame::ALPN.to_vec()])?;
    let crypto = quinn::crypto::rustls::QuicServerConfig::try_from(crypto)?;
    let mut config = quinn::ServerConfig::with_crypto(Arc::new(crypto));
    let mut transport = quinn::TransportConfig::default();
    transport.max_concurrent_bidi_streams(MAX_STREAMS.into());
    transport.max_concurrent_uni_streams(0u32.into());
    transport.max_idle_timeout(Some(Duration::from_secs(30).try_into()?));
    config.transport_config(Arc::new(transport));
    let endpoint = quinn::Endpoint::server(config, addr)
        .map_err(|e| anyhow::anyhow!("receivers.quic_addr {addr}: {e}"))?;
    let bound = endpoint.local_addr()?;
    let task = tokio::spawn(async move {
        let connections = tokio_util::task::TaskTracker::new();
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                incoming = endpoint.accept() => {
                    let Some(incoming) = incoming else { break };
                    let receiver = Arc::clone(&receiver);
                    let stop = shutdown.clone();
                    connections.spawn(async move {
                        if let Err(e) = connection(incoming, receiver, stop).await {
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
async fn read_frame(recv: &mut quinn::RecvStream) -> anyhow::Result<(FrameKind, Vec<u8>)> {
    let mut bytes = recv.read_to_end(HEADER_LEN + frame::MAX_FRAME_BYTES).await?;
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

async fn open_session(
    connection: &quinn::Connection,
    receiver: &Receiver,
) -> anyhow::Result<Principal> {
    let (mut send, mut recv) = tokio::time::timeout(OPEN_TIMEOUT, connection.accept_bi()).await??;
    let (kind, body) = tokio::time::timeout(OPEN_TIMEOUT, read_frame(&mut recv)).await??;
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
    let hello = open.hello.unwrap_or_default();
    match receiver.hello(&principal, &hello).await {
        Ok(response) => {
            send.write_all(&frame::encode_message(FrameKind::HelloResponse, &response)).await?;
            send.finish()?;
            Ok(principal)
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
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let connection = incoming.await?;
    let principal = Arc::new(open_session(&connection, &receiver).await?);
    let streams = tokio_util::task::TaskTracker::new();
    loop {
        let (send, recv) = tokio::select! {
            _ = shutdown.cancelled() => break,
            stream = connection.accept_bi() => match stream {
                Ok(stream) => stream,
                Err(_) => break,
            },
        };
        let (receiver, principal, connection) =
            (Arc::clone(&receiver), Arc::clone(&principal), connection.clone());
        streams.spawn(async move {
            if let Err(e) = batch_stream(send, recv, &receiver, &principal, &connection).await {
                tracing::debug!(error = %e, "QUIC batch stream failed");
            }
        });
    }
    streams.close();
    streams.wait().await;
    Ok(())
}

async fn batch_stream(
    mut send: quinn::SendStream,
    mut recv: quinn::RecvStream,
    receiver: &Receiver,
    principal: &Principal,
    connection: &quinn::Connection,
) -> anyhow::Result<()> {
    let decoded = match read_frame(&mut recv).await {
        Ok((FrameKind::Batch, body)) => frame::decode_batch(&body).map_err(anyhow::Error::from),
        Ok((other, _)) => Err(anyhow::anyhow!("expected a Batch frame, got {other:?}")),
        Err(e) => Err(e),
    };
    let ack = match decoded {
        Ok(batch) => receiver.batch(principal, "quic", batch).await,
        Err(e) => {
            receiver.metrics.reject("bad_frame");
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
