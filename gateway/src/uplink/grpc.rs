//! [`GrpcUplink`]: tonic over TLS.
//!
//! A session is one HTTP/2 connection: `Hello`, then one bidirectional
//! `Send` stream. Batches go into the request stream through a bounded
//! channel; a reader task moves acknowledgements from the response stream
//! into another channel, which makes [`Uplink::recv_ack`] cancel-safe.
//! Batches are zstd-compressed; the API key rides in the `authorization`
//! metadata of both calls. Both go through one `tonic::client::Grpc`
//! rather than the generated client, whose `Send` takes the decoded
//! `pb::Batch`: the stream carries [`EncodedBatch`]es, the same bytes on
//! the wire.

use std::time::Duration;

use async_trait::async_trait;
use opgraph_proto::encoded_batch::EncodedBatch;
use opgraph_proto::frame::MAX_BATCH_BYTES;
use opgraph_proto::pb;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tonic::client::Grpc;
use tonic::codec::CompressionEncoding;
use tonic::codegen::http::uri::PathAndQuery;
use tonic::metadata::MetadataValue;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint, Identity};
use tonic::{Code, Request, Status};

use super::tls::ClientTls;
use super::{Uplink, UplinkConfig};
use crate::error::{Error, Result};

/// The gRPC transport.
pub struct GrpcUplink {
    endpoint: String,
    uri: String,
    server_name: String,
    authorization: String,
    tls: ClientTls,
    connect_timeout: Duration,
    max_in_flight: usize,
    session: Option<Session>,
}

struct Session {
    /// Kept so the connection lives as long as the session.
    _client: Grpc<Channel>,
    /// `None` once the request stream was ended.
    batches: Option<mpsc::Sender<EncodedBatch>>,
    acks: mpsc::Receiver<Result<pb::Ack>>,
    reader: JoinHandle<()>,
}

impl Drop for Session {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

/// The methods of `opgraph.v1.Ingest`.
const HELLO_PATH: &str = "/opgraph.v1.Ingest/Hello";
const SEND_PATH: &str = "/opgraph.v1.Ingest/Send";

/// How long a session end waits for the cloud to close its side.
const CLOSE_WAIT: Duration = Duration::from_secs(1);

impl GrpcUplink {
    pub fn new(config: &UplinkConfig, tls: ClientTls) -> Self {
        let host_port = config.endpoint.trim().to_owned();
        GrpcUplink {
            endpoint: format!("grpc://{host_port}"),
            uri: format!("https://{host_port}"),
            server_name: config.server_name(),
            authorization: format!("Bearer {}", config.api_key.0),
            tls,
            connect_timeout: config.connect_timeout,
            max_in_flight: config.max_in_flight,
            session: None,
        }
    }

    fn error(&self, status: &Status) -> Error {
        let reason = status_text(status);
        match status.code() {
            Code::Unauthenticated | Code::PermissionDenied => {
                Error::Unauthorized { endpoint: self.endpoint.clone(), reason }
            }
            _ => Error::Uplink { endpoint: self.endpoint.clone(), reason },
        }
    }

    fn authed<T>(&self, message: T) -> Result<Request<T>> {
        let mut request = Request::new(message);
        let value = MetadataValue::try_from(self.authorization.as_str()).map_err(|_| {
            Error::InvalidConfig { problems: vec!["uplink.api_key: not a valid header".into()] }
        })?;
        request.metadata_mut().insert("authorization", value);
        Ok(request)
    }

    async fn channel(&self) -> Result<Channel> {
        let mut tls = ClientTlsConfig::new()
            .domain_name(self.server_name.clone())
            .trust_anchors(self.tls.roots.roots.iter().cloned());
        if let Some(id) = &self.tls.identity {
            tls = tls.identity(Identity::from_pem(&id.cert_pem, &id.key_pem));
        }
        let uplink = |e: &dyn std::fmt::Display| Error::Uplink {
            endpoint: self.endpoint.clone(),
            reason: e.to_string(),
        };
        let endpoint = Endpoint::from_shared(self.uri.clone())
            .map_err(|e| uplink(&e))?
            .tls_config(tls)
            .map_err(|e| uplink(&e))?
            .connect_timeout(self.connect_timeout)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(10))
            .keep_alive_timeout(Duration::from_secs(20))
            .keep_alive_while_idle(true);
        endpoint.connect().await.map_err(|e| uplink(&error_chain(&e)))
    }
}

/// A status with its code and causes (a failed TLS handshake is only
/// "transport error" at the top).
fn status_text(status: &Status) -> String {
    let top = format!("{:?}: {}", status.code(), status.message());
    with_sources(top, std::error::Error::source(status))
}

/// An error with its sources, on one line (tonic's top-level message is
/// often just "transport error").
fn error_chain(e: &dyn std::error::Error) -> String {
    with_sources(e.to_string(), e.source())
}

/// `text: source: its source ...`.
fn with_sources(mut text: String, mut source: Option<&dyn std::error::Error>) -> String {
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[async_trait]
impl Uplink for GrpcUplink {
    fn endpoint(&self) -> &str {
        &self.endpoint
    }

    async fn connect(&mut self, hello: &pb::HelloRequest) -> Result<pb::HelloResponse> {
        self.disconnect().await;
        let channel = self.channel().await?;
        let mut client = Grpc::new(channel)
            .send_compressed(CompressionEncoding::Zstd)
            .accept_compressed(CompressionEncoding::Zstd)
            .max_encoding_message_size(MAX_BATCH_BYTES)
            .max_decoding_message_size(1 << 20);
        let not_ready = |e: tonic::transport::Error| Error::Uplink {
            endpoint: self.endpoint.clone(),
            reason: error_chain(&e),
        };
        client.ready().await.map_err(not_ready)?;
        let codec = tonic_prost::ProstCodec::<pb::HelloRequest, pb::HelloResponse>::default();
        let response = client
            .unary(self.authed(hello.clone())?, PathAndQuery::from_static(HELLO_PATH), codec)
            .await
            .map_err(|s| self.error(&s))?
            .into_inner();
        let (batches, outgoing) = mpsc::channel(self.max_in_flight.max(1));
        client.ready().await.map_err(not_ready)?;
        let codec = tonic_prost::ProstCodec::<EncodedBatch, pb::Ack>::default();
        let request = self.authed(ReceiverStream::new(outgoing))?;
        let mut incoming = client
            .streaming(request, PathAndQuery::from_static(SEND_PATH), codec)
            .await
            .map_err(|s| self.error(&s))?
            .into_inner();
        let (ack_tx, acks) = mpsc::channel(self.max_in_flight.max(1) + 1);
        let endpoint = self.endpoint.clone();
        let unauthorized = |status: &Status| {
            matches!(status.code(), Code::Unauthenticated | Code::PermissionDenied)
        };
        let reader = tokio::spawn(async move {
            loop {
                let next = match incoming.message().await {
                    Ok(Some(ack)) => Ok(ack),
                    Ok(None) => Err(Error::Uplink {
                        endpoint: endpoint.clone(),
                        reason: "the cloud ended the stream".into(),
                    }),
                    Err(status) if unauthorized(&status) => Err(Error::Unauthorized {
                        endpoint: endpoint.clone(),
                        reason: status.message().to_owned(),
                    }),
                    Err(status) => Err(Error::Uplink {
                        endpoint: endpoint.clone(),
                        reason: status_text(&status),
                    }),
                };
                let last = next.is_err();
                if ack_tx.send(next).await.is_err() || last {
                    return;
                }
            }
        });
        self.session = Some(Session { _client: client, batches: Some(batches), acks, reader });
        Ok(response)
    }

    async fn send(&mut self, batch: EncodedBatch) -> Result<()> {
        let closed =
            || Error::Uplink { endpoint: self.endpoint.clone(), reason: "no open session".into() };
        let sender = self.session.as_ref().and_then(|s| s.batches.as_ref()).ok_or_else(closed)?;
        sender.send(batch).await.map_err(|_| Error::Uplink {
            endpoint: self.endpoint.clone(),
            reason: "the send stream is closed".into(),
        })
    }

    async fn recv_ack(&mut self) -> Result<pb::Ack> {
        let endpoint = self.endpoint.clone();
        let closed = |reason: &str| Error::Uplink { endpoint, reason: reason.to_owned() };
        let Some(session) = self.session.as_mut() else {
            return Err(closed("no open session"));
        };
        session.acks.recv().await.unwrap_or_else(|| Err(closed("the ack stream ended")))
    }

    async fn disconnect(&mut self) {
        // End the request stream first, so the cloud sees a clean end of
        // the Send call rather than a reset, and give it a moment to end
        // its side; dropping the session then closes the connection.
        if let Some(mut session) = self.session.take() {
            session.batches = None;
            let drain = async { while session.acks.recv().await.is_some() {} };
            let _ = tokio::time::timeout(CLOSE_WAIT, drain).await;
        }
    }
}
