//! The gRPC receiver (tonic over TLS): `Hello` opens a session, `Send` is a
//! bidirectional stream of batches and acks on one HTTP/2 stream.
//!
//! The credential travels in the `authorization` metadata. Batches may be
//! zstd-compressed; tonic enforces the decoded size limit, so neither a huge
//! message nor a decompression bomb is ever held in memory.

use std::net::SocketAddr;
use std::sync::Arc;

use opgraph_proto::frame::MAX_BATCH_BYTES;
use opgraph_proto::pb;
use opgraph_proto::pb::ingest_server::{Ingest, IngestServer};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::codec::CompressionEncoding;
use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig};
use tonic::{Request, Response, Status, Streaming};

use super::in_flight::InFlight;
use super::tls::TlsMaterial;
use super::{Prepared, Receiver, Tail};
use crate::auth::Principal;
use crate::error::Error;

pub struct GrpcReceiver {
    receiver: Arc<Receiver>,
    /// Ends open Send streams on shutdown: HTTP/2 graceful shutdown waits
    /// for streams, and a gateway's stream never ends by itself.
    shutdown: CancellationToken,
}

fn status(e: Error) -> Status {
    match e {
        Error::Unauthorized(m) => Status::unauthenticated(m),
        Error::Forbidden(m) => Status::permission_denied(m),
        Error::Validation { message, .. } => Status::invalid_argument(message),
        e if e.retryable() => Status::unavailable(e.to_string()),
        e => Status::internal(e.to_string()),
    }
}

impl GrpcReceiver {
    async fn principal<T>(&self, request: &Request<T>) -> Result<Principal, Status> {
        let value = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .ok_or_else(|| Status::unauthenticated("missing authorization metadata"))?;
        self.receiver.authenticate(value).await.map_err(status)
    }
}

#[tonic::async_trait]
impl Ingest for GrpcReceiver {
    async fn hello(
        &self,
        request: Request<pb::HelloRequest>,
    ) -> Result<Response<pb::HelloResponse>, Status> {
        let principal = self.principal(&request).await?;
        self.receiver.hello(&principal, request.get_ref()).await.map(Response::new).map_err(status)
    }

    type SendStream = ReceiverStream<Result<pb::Ack, Status>>;

    async fn send(
        &self,
        request: Request<Streaming<pb::Batch>>,
    ) -> Result<Response<Self::SendStream>, Status> {
        let principal = self.principal(&request).await?;
        // Checked again at every batch: a stream lives as long as its
        // gateway, and a key revoked meanwhile must stop working.
        let authorization = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let mut batches = request.into_inner();
        let (tx, rx) = mpsc::channel(16);
        let receiver = Arc::clone(&self.receiver);
        let shutdown = self.shutdown.clone();
        tokio::spawn(async move {
            // A batch whose predecessors were all handed to the store by
            // this stream is handed over as soon as it is checked, up to
            // MAX_IN_FLIGHT ahead of the answers: the store applies them
            // in the order handed over, and its writer can take several in
            // one transaction while this task checks the next. Any other
            // batch (a stream's first, one after a hole) waits for the
            // answers before it and for its predecessor's ack, as every
            // batch did before: its predecessor may be on another stream.
            // Answers go back in stream order.
            let mut in_flight = InFlight::new();
            let mut tail: Option<Tail> = None;
            loop {
                let next = tokio::select! {
                    biased;
                    _ = shutdown.cancelled() => {
                        // Commits already handed over still land; the
                        // gateway resends them and the store keeps one copy.
                        let _ = tx.send(Err(Status::unavailable("the cloud is shutting down"))).await;
                        return;
                    }
                    Some((ack, ())) = in_flight.next() => {
                        if !send_ack(&tx, ack).await {
                            return;
                        }
                        continue;
                    }
                    next = batches.message(), if !in_flight.is_full() => next,
                };
                let batch = match next {
                    Ok(Some(batch)) => batch,
                    Ok(None) => {
                        drain(&mut in_flight, &tx).await;
                        return;
                    }
                    Err(e) => {
                        // Undecodable or oversized frame: tell the client why
                        // and end the stream; nothing of it was stored.
                        receiver.metrics.reject("bad_frame");
                        tracing::warn!(error = %e, "bad gRPC batch frame");
                        if drain(&mut in_flight, &tx).await {
                            let _ = tx
                                .send(Err(Status::invalid_argument(e.message().to_owned())))
                                .await;
                        }
                        return;
                    }
                };
                if let Err(e) = receiver.authenticate(&authorization).await {
                    tracing::warn!(error = %e, "a gateway's credential stopped working mid-stream");
                    if drain(&mut in_flight, &tx).await {
                        let _ = tx.send(Err(status(e))).await;
                    }
                    return;
                }
                match receiver.prepare(batch) {
                    Prepared::Answered(ack) => in_flight.answered(ack, ()),
                    Prepared::Ready(ready) if ready.joins(tail) => {
                        ready.advance(&mut tail);
                        in_flight.hand_over(&receiver, &principal, "grpc", ready, ()).await;
                    }
                    Prepared::Ready(ready) => {
                        if !drain(&mut in_flight, &tx).await {
                            return;
                        }
                        ready.advance(&mut tail);
                        let ack =
                            receiver.commit_after_predecessor(&principal, "grpc", ready).await;
                        in_flight.answered(ack, ());
                    }
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

/// Sends every answer in flight, in order; false if the stream ended first.
async fn drain(in_flight: &mut InFlight<()>, tx: &mpsc::Sender<Result<pb::Ack, Status>>) -> bool {
    while let Some((ack, ())) = in_flight.next().await {
        if !send_ack(tx, ack).await {
            return false;
        }
    }
    true
}

/// Sends an answer; false when the stream should end (the gateway left, or
/// it was fenced).
async fn send_ack(tx: &mpsc::Sender<Result<pb::Ack, Status>>, ack: pb::Ack) -> bool {
    let fenced = ack.status == pb::AckStatus::Fenced as i32;
    tx.send(Ok(ack)).await.is_ok() && !fenced
}

/// Binds and serves until `shutdown`; returns the bound address at once.
pub async fn start(
    addr: SocketAddr,
    receiver: Arc<Receiver>,
    tls: &TlsMaterial,
    shutdown: CancellationToken,
) -> anyhow::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let mut tls_config =
        ServerTlsConfig::new().identity(Identity::from_pem(&tls.cert_pem, &tls.key_pem));
    if let Some(ca) = &tls.client_ca_pem {
        tls_config = tls_config.client_ca_root(Certificate::from_pem(ca));
    }
    let service = IngestServer::new(GrpcReceiver { receiver, shutdown: shutdown.clone() })
        .accept_compressed(CompressionEncoding::Zstd)
        .max_decoding_message_size(MAX_BATCH_BYTES);
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("receivers.grpc_addr {addr}: {e}"))?;
    let bound = listener.local_addr()?;
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    let router = Server::builder().tls_config(tls_config)?.add_service(service);
    let task = tokio::spawn(async move {
        if let Err(e) =
            router.serve_with_incoming_shutdown(incoming, shutdown.cancelled_owned()).await
        {
            tracing::error!(error = %e, "gRPC receiver stopped");
        }
    });
    Ok((bound, task))
}
