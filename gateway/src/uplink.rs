//! The uplink seam: how batches reach the cloud and acknowledgements come
//! back. Both transports carry the same protobuf `Batch` and `Ack`:
//!
//! - [`grpc`]: tonic over TLS; `Hello`, then one bidirectional `Send`
//!   stream per session, zstd-compressed.
//! - [`quic`]: quinn over TLS 1.3 (ALPN `opgraph/1`); a session-open
//!   stream, then one stream per batch, so a lost packet delays one batch
//!   and not the ones behind it.
//! - [`memory`]: an in-memory cloud, for the shipper's unit tests.
//!
//! The uplink only moves messages; the delivery rules (what to send, when
//! to retry, what to acknowledge) are the shipper's (`shipper.rs`).

pub mod congestion;
pub mod grpc;
pub mod memory;
pub mod quic;
pub mod tls;

use std::path::PathBuf;
use std::time::Duration;

use async_trait::async_trait;
use bytesize::ByteSize;
use opgraph_proto::encoded_batch::EncodedBatch;
use opgraph_proto::pb;
use serde::{Deserialize, Serialize};

use crate::error::Result;

/// One connection to the cloud at a time, opened by [`Uplink::connect`].
///
/// Errors and shutdown: any error from `send` or `recv_ack` means the
/// session is broken; the caller calls [`Uplink::disconnect`] and, after a
/// backoff, `connect` again. Batches in flight when a session ends are
/// abandoned, never half-applied: the cloud commits a batch whole or not at
/// all, and the next session's Hello says how far it got.
///
/// Acknowledgements: `recv_ack` hands over the cloud's [`pb::Ack`]s as
/// they arrive, uninterpreted (status, cumulative `acked_sequence`); with
/// several batches in flight they may arrive out of order (QUIC).
#[async_trait]
pub trait Uplink: Send {
    /// Where this uplink connects, for logs and health
    /// (`grpc://host:port`, `quic://host:port`).
    fn endpoint(&self) -> &str;

    /// Opens a new session (closing any previous one): connects over TLS,
    /// presents the API key and says Hello. Returns the session's epoch and
    /// the highest sequence the cloud has stored for this gateway. Errors:
    /// [`crate::Error::Unauthorized`] when the credential is refused, other
    /// uplink errors (retryable) when the cloud cannot be reached. The
    /// caller bounds it with its connect timeout.
    async fn connect(&mut self, hello: &pb::HelloRequest) -> Result<pb::HelloResponse>;

    /// Hands a batch to the transport and returns without waiting for its
    /// acknowledgement (which comes through `recv_ack`). May wait briefly
    /// for transport flow control.
    async fn send(&mut self, batch: EncodedBatch) -> Result<()>;

    /// The next acknowledgement of this session. Cancel-safe: dropping the
    /// future loses nothing, so it can sit in a `select!`. Errors when the
    /// session broke or there is none.
    async fn recv_ack(&mut self) -> Result<pb::Ack>;

    /// Ends the session, abandoning batches in flight. Idempotent.
    async fn disconnect(&mut self);

    /// What the transport measured on its path, summed over its sessions;
    /// `None` when the kernel keeps it (gRPC's TCP).
    fn path_stats(&self) -> Option<PathStats> {
        None
    }
}

/// A transport's own view of its path (QUIC), for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PathStats {
    /// The current session's smoothed round trip.
    pub rtt: Duration,
    /// Packets sent.
    pub sent_packets: u64,
    /// Packets declared lost (and retransmitted).
    pub lost_packets: u64,
    /// Losses or ECN marks that the congestion controller saw.
    pub congestion_events: u64,
    /// Of those, the ones [`congestion::LossTolerant`] read as link noise
    /// and did not back off for.
    pub noise_losses: u64,
}

impl PathStats {
    /// The counters of `self` and `other` added (the round trip is
    /// `other`'s: the later session's).
    pub fn plus(self, other: PathStats) -> PathStats {
        PathStats {
            rtt: other.rtt,
            sent_packets: self.sent_packets + other.sent_packets,
            lost_packets: self.lost_packets + other.lost_packets,
            congestion_events: self.congestion_events + other.congestion_events,
            noise_losses: self.noise_losses + other.noise_losses,
        }
    }
}

/// Which transport carries batches to the cloud.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    /// gRPC over TLS (HTTP/2 on TCP). Works through any TCP path.
    #[default]
    Grpc,
    /// QUIC (UDP). Keeps its throughput on lossy links, where one TCP
    /// stream stalls behind every lost packet.
    Quic,
}

/// An API key: never printed.
#[derive(Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Secret(pub String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_empty() { "<unset>" } else { "<redacted>" })
    }
}

/// Configuration of the uplink (`[uplink]` in the gateway's TOML).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct UplinkConfig {
    /// `grpc` (default) or `quic`.
    pub transport: Transport,
    /// The cloud's receiver as `host:port`: its gRPC address for `grpc`,
    /// its QUIC (UDP) address for `quic`. Required. Env
    /// `OPGRAPH_GATEWAY_UPLINK_ENDPOINT`.
    pub endpoint: String,
    /// Name the cloud's certificate must carry. Default: the host of
    /// `endpoint`.
    pub server_name: Option<String>,
    /// API key with the `ingest` scope (`og_...`). Required; usually given
    /// by env `OPGRAPH_GATEWAY_API_KEY` so the file holds no secret.
    pub api_key: Secret,
    /// PEM file of the certificate(s) to trust for the cloud *instead of*
    /// the platform's roots: the cloud's self-signed `receiver-cert.pem`,
    /// or a private CA. Unset: the platform's roots.
    pub ca_file: Option<PathBuf>,
    /// Client certificate chain (PEM) for mutual TLS, when the cloud
    /// requires one (`OPGRAPH_TLS_CLIENT_CA_FILE`). Set with
    /// `client_key_file`.
    pub client_cert_file: Option<PathBuf>,
    /// Private key (PEM) of `client_cert_file`.
    pub client_key_file: Option<PathBuf>,
    /// Bound on connecting, TLS and Hello. Default `10s`.
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// Bound on waiting for a batch's acknowledgement; past it the session
    /// is dropped and resumed from the cloud's acknowledgement. Default
    /// `30s`. Keep it above the time the cloud needs to commit a batch.
    #[serde(with = "humantime_serde")]
    pub request_timeout: Duration,
    /// Most events in one batch. Default 5000; at most 10000 (the cloud's
    /// limit). Larger batches mean fewer round trips and fewer commits in
    /// the cloud, and more to resend after a loss. `batch_max_bytes` caps
    /// all but small events first (5000 events of 52 bytes fill 256 KiB).
    pub batch_max_events: usize,
    /// About the most payload bytes in one batch (a single larger event is
    /// sent alone). Default `256KiB`; at most `8MiB`. The gateway's memory
    /// grows with it (a batch is read, encoded and compressed in buffers of
    /// about its size: with 1000 MQTT devices, 1 MiB cost about 4 MB more
    /// peak memory than 256 KiB for no measurable throughput).
    pub batch_max_bytes: ByteSize,
    /// How long a batch that is not full waits for more events. Default
    /// `20ms`: adds that much latency when traffic is light, saves round
    /// trips when it is heavy. At most `10s`.
    #[serde(with = "humantime_serde")]
    pub batch_linger: Duration,
    /// Batches sent and not yet acknowledged, at most. Default 8; 1 to 64
    /// (the cloud's QUIC stream limit). More hides round-trip time on long
    /// links.
    pub max_in_flight: usize,
    /// First reconnect delay. Default `200ms`; above 0, at most `1h`.
    #[serde(with = "humantime_serde")]
    pub backoff_initial: Duration,
    /// Longest reconnect delay. Default `30s`; at least `backoff_initial`,
    /// at most `1h`.
    #[serde(with = "humantime_serde")]
    pub backoff_max: Duration,
    /// QUIC only: how the uplink reads packet loss. `loss_tolerant`
    /// (default) backs off for losses that come with a growing round trip
    /// or a loss rate above 5 %, and keeps its rate through the random
    /// loss of radio links; `cubic` backs off for every loss, like kernel
    /// TCP under gRPC. See `uplink/congestion.rs`.
    pub congestion: Congestion,
}

/// The QUIC uplink's congestion controller.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Congestion {
    /// Cubic that treats loss without other signs of congestion as noise
    /// ([`congestion::LossTolerant`]).
    #[default]
    LossTolerant,
    /// quinn's Cubic (RFC 9438): every loss is congestion.
    Cubic,
}

impl Default for UplinkConfig {
    fn default() -> Self {
        UplinkConfig {
            transport: Transport::Grpc,
            endpoint: String::new(),
            server_name: None,
            api_key: Secret::default(),
            ca_file: None,
            client_cert_file: None,
            client_key_file: None,
            connect_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(30),
            batch_max_events: 5000,
            batch_max_bytes: ByteSize::kib(256),
            batch_linger: Duration::from_millis(20),
            max_in_flight: 8,
            backoff_initial: Duration::from_millis(200),
            backoff_max: Duration::from_secs(30),
            congestion: Congestion::default(),
        }
    }
}

/// The cloud's batch limit.
pub use opgraph_proto::codec::MAX_BATCH_EVENTS;
/// Largest `batch_max_bytes`: well inside the cloud's frame limit even
/// before compression.
pub const MAX_BATCH_BYTES: u64 = 8 * 1024 * 1024;
/// The cloud's QUIC stream limit.
pub const MAX_IN_FLIGHT: usize = 64;

impl UplinkConfig {
    /// Every problem, each with its key path relative to `[uplink]`.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if self.endpoint.trim().is_empty() {
            problems.push(
                "endpoint: required: the cloud receiver's host:port \
                 (env OPGRAPH_GATEWAY_UPLINK_ENDPOINT)"
                    .to_owned(),
            );
        } else if split_host_port(&self.endpoint).is_none() {
            problems.push(format!("endpoint: {:?} is not host:port", self.endpoint));
        }
        if self.api_key.0.is_empty() {
            problems.push("api_key: required (env OPGRAPH_GATEWAY_API_KEY)".to_owned());
        } else if !self.api_key.0.bytes().all(|b| b.is_ascii_graphic()) {
            problems.push("api_key: must be printable ASCII without spaces".to_owned());
        }
        if self.client_cert_file.is_some() != self.client_key_file.is_some() {
            problems.push(
                "client_cert_file: set both client_cert_file and client_key_file, or neither"
                    .to_owned(),
            );
        }
        if !(1..=MAX_BATCH_EVENTS).contains(&self.batch_max_events) {
            problems.push(format!(
                "batch_max_events: {} is outside 1 ..= {MAX_BATCH_EVENTS}",
                self.batch_max_events
            ));
        }
        if !(1..=MAX_BATCH_BYTES).contains(&self.batch_max_bytes.as_u64()) {
            problems.push(format!(
                "batch_max_bytes: {} is outside 1 B ..= {}",
                self.batch_max_bytes,
                ByteSize(MAX_BATCH_BYTES)
            ));
        }
        if self.batch_linger > Duration::from_secs(10) {
            problems.push("batch_linger: must be at most 10s".to_owned());
        }
        if !(1..=MAX_IN_FLIGHT).contains(&self.max_in_flight) {
            problems.push(format!(
                "max_in_flight: {} is outside 1 ..= {MAX_IN_FLIGHT}",
                self.max_in_flight
            ));
        }
        for (key, value) in
            [("connect_timeout", self.connect_timeout), ("request_timeout", self.request_timeout)]
        {
            if value.is_zero() || value > Duration::from_secs(600) {
                problems.push(format!("{key}: must be between 1ms and 10min"));
            }
        }
        problems.extend(crate::backoff::problems(self.backoff_initial, self.backoff_max));
        problems
    }

    /// The TLS server name: `server_name`, or the host of `endpoint`.
    pub fn server_name(&self) -> String {
        match &self.server_name {
            Some(name) => name.clone(),
            None => split_host_port(&self.endpoint).map(|(h, _)| h.to_owned()).unwrap_or_default(),
        }
    }
}

/// `host:port` or `[v6]:port` into its host (without brackets) and port.
pub fn split_host_port(endpoint: &str) -> Option<(&str, u16)> {
    let (host, port) = endpoint.trim().rsplit_once(':')?;
    let port = port.parse().ok()?;
    let host = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
    if host.is_empty() || host.contains(['/', ' ']) {
        return None;
    }
    Some((host, port))
}

/// Builds the configured transport. Reads the certificate files now, so
/// that a bad file is a start-up error ([`crate::Error::InvalidConfig`]
/// naming `uplink.<key>`), not a reconnect loop.
pub fn build(config: &UplinkConfig) -> Result<Box<dyn Uplink>> {
    let tls = tls::ClientTls::load(config)?;
    Ok(match config.transport {
        Transport::Grpc => Box::new(grpc::GrpcUplink::new(config, tls)),
        Transport::Quic => Box::new(quic::QuicUplink::new(config, tls)?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_split_into_host_and_port() {
        assert_eq!(split_host_port("127.0.0.1:50051"), Some(("127.0.0.1", 50051)));
        assert_eq!(split_host_port("cloud.example.com:443"), Some(("cloud.example.com", 443)));
        assert_eq!(split_host_port("[::1]:4433"), Some(("::1", 4433)));
        assert_eq!(split_host_port("nohost"), None);
        assert_eq!(split_host_port(":80"), None);
        assert_eq!(split_host_port("https://x:1"), None);
        let config = UplinkConfig { endpoint: "[::1]:1".into(), ..UplinkConfig::default() };
        assert_eq!(config.server_name(), "::1");
    }

    #[test]
    fn secrets_are_not_printed() {
        let config =
            UplinkConfig { api_key: Secret("og_topsecret".into()), ..UplinkConfig::default() };
        assert!(!format!("{config:?}").contains("topsecret"));
    }
}
