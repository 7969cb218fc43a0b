//! MQTT ingest endpoint: devices publish straight to the gateway, which
//! answers each QoS 1 PUBLISH with its PUBACK only after the event is
//! durable in the buffer. No broker sits in between, so a crash can never
//! lose an acknowledged message (unlike the embedded rumqttd broker, which
//! acknowledges on receipt and keeps messages in memory).
//!
//! It is not a broker: MQTT 3.1.1 devices connect, log in and publish
//! (QoS 0 or 1); subscriptions are refused (SUBACK failure), QoS 2 closes
//! the connection. One task per connection; each read from the socket is
//! mapped and appended as one batch, then acknowledged in order, so a
//! device that keeps many messages in flight gets them stored together.
//! Packets are framed by rumqttc's 3.1.1 codec; TLS (optional) is rustls
//! on ring.
//!
//! A PUBACK lost with a connection or a crash makes a persistent device
//! send the message again, with the same packet id, right after it
//! reconnects: flagged DUP, or not (rumqttc never sets it). The latest
//! messages acknowledged per client id are remembered, in a journal beside
//! the buffer too (module `acked`), and such a copy is acknowledged without
//! being stored twice.

mod acked;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::{BufMut, BytesMut};
use bytesize::ByteSize;
use rumqttc::mqttbytes::v4::{
    ConnAck, ConnectReturnCode, Packet, PubAck, Publish, SubAck, SubscribeReasonCode, UnsubAck,
};
use rumqttc::mqttbytes::{Error as CodecError, Protocol, QoS};
use rumqttc::tokio_rustls::TlsAcceptor;
use serde::Deserialize;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::redelivery::{Fingerprint, state_file};
use super::{append, appending_from, prepare, read_back};
use crate::backoff::Backoff;
use crate::buffer::{BufferConfig, FsyncPolicy};
use crate::error::{Error, Result};
use crate::source::mapping::{RuleConfig, RuleSet};
use crate::source::{Intake, Source};
use acked::{Acked, Batch};

/// How long a device may leave our acknowledgements unread.
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the first publishes of a persistent client's connection, which
/// so far repeat what it was last acknowledged, wait for the rest of that
/// run to tell whether they are copies sent again (see
/// [`Acked::leading_copies`]); from the latest that arrived.
const RESEND_WAIT: Duration = Duration::from_secs(1);
/// Bytes read from a connection at a time.
const READ_CHUNK: usize = 64 * 1024;
/// Bytes already arrived that one batch takes at most (plus a chunk).
const READ_AHEAD: usize = 1024 * 1024;
/// The buffer of a connection between batches: a thousand idle devices
/// must not hold a [`READ_CHUNK`] each (measured: ~90 KB per connection
/// before, most of the gateway's RSS with 1000 devices). Enough for a
/// PINGREQ or a few readings; a connection reads more once it holds a batch
/// slot.
const IDLE_BUFFER: usize = 1024;

/// Longest client id accepted. MQTT 3.1.1 promises devices 23 bytes;
/// serial numbers and MAC addresses fit easily. A persistent client's id
/// is kept in memory and in the journal beside the buffer, so ids up to
/// the protocol's 64 KiB would make each such client that much dearer.
const MAX_CLIENT_ID: usize = 256;

/// One `[[sources.mqtt_ingest]]` table.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MqttIngestConfig {
    /// Name in health, metrics and logs. Required, unique.
    pub name: String,
    /// Where devices connect (MQTT 3.1.1, plain TCP). Default
    /// `127.0.0.1:1883`; port 0 picks a free port, printed as `listening
    /// mqtt-<name>=ADDR`.
    pub listen: SocketAddr,
    /// Device logins, user name to password. Empty (default): anonymous
    /// devices are accepted; keep the port on a trusted network then (a
    /// warning at startup when `listen` is beyond loopback).
    pub users: BTreeMap<String, String>,
    /// PEM certificate chain and private key: devices then connect with
    /// TLS (1.2 or 1.3, rustls on ring). Both or neither; neither (default):
    /// plain TCP.
    pub tls_cert_file: Option<PathBuf>,
    pub tls_key_file: Option<PathBuf>,
    /// Most device connections at once; more are closed at once. Default
    /// 1000.
    pub max_connections: usize,
    /// Largest packet accepted; a larger one closes the connection. Default
    /// `1MiB`.
    pub max_payload: ByteSize,
    /// Time a new connection has to send CONNECT. Default `5s`.
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// Longest silence of a device that asked for no keep-alive (0): one
    /// that lost power leaves its connection open here, holding one of
    /// `max_connections`, until this closes it. Devices with a keep-alive
    /// are closed after one and a half of theirs. Default `1h`; `1s` to
    /// `24h`.
    #[serde(with = "humantime_serde")]
    pub idle_timeout: Duration,
    /// Most messages of one connection mapped and appended at once.
    /// Default 1000.
    pub batch_max: usize,
    /// Memory for packets larger than 64 KiB while they arrive, all
    /// connections together: a connection whose next packet does not fit
    /// waits, its device's bytes left in the kernel's socket buffers, so
    /// that many devices each sending a large message slowly cannot make
    /// the gateway hold `max_connections` × `max_payload`. Never less than
    /// one packet of `max_payload`. Default `64MiB`; `1MiB` to `16GiB`.
    pub packet_memory: ByteSize,
    /// Most connections reading ahead, mapping and appending a batch at
    /// once; the others keep their devices' bytes in the kernel's socket
    /// buffers until a slot frees. Bounds the gateway's memory with many
    /// devices (each batch takes up to `READ_AHEAD` plus its events) without
    /// costing intake: the batches in flight still share one fsync. Default
    /// 64.
    pub max_concurrent_batches: usize,
    /// See `[[sources.mqtt]]`: device times further off are replaced.
    /// Default `30s`.
    #[serde(with = "humantime_serde")]
    pub max_clock_skew: Duration,
    /// Whether a persistent client's messages sent again without DUP after
    /// a reconnect (rumqttc never sets it) are recognised as copies: those
    /// that lead the new connection and repeat, in order, the last ones
    /// acknowledged to it. Default `true`. Turn it off for devices that may
    /// restart and send the very messages, packet ids and bytes, they last
    /// sent: then only DUP copies are recognised.
    pub resends_without_dup: bool,
    /// Mapping rules, first match wins.
    pub rules: Vec<RuleConfig>,
}

impl Default for MqttIngestConfig {
    fn default() -> Self {
        MqttIngestConfig {
            name: String::new(),
            listen: SocketAddr::from(([127, 0, 0, 1], 1883)),
            users: BTreeMap::new(),
            tls_cert_file: None,
            tls_key_file: None,
            max_connections: 1000,
            max_payload: ByteSize::mib(1),
            connect_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(3600),
            batch_max: 1000,
            max_concurrent_batches: 64,
            packet_memory: ByteSize::mib(64),
            max_clock_skew: Duration::from_secs(30),
            resends_without_dup: true,
            rules: Vec::new(),
        }
    }
}

impl MqttIngestConfig {
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if self.name.trim().is_empty() || self.name.len() > 100 {
            problems.push("name: required, at most 100 bytes".to_owned());
        }
        if self.tls_cert_file.is_some() != self.tls_key_file.is_some() {
            problems.push("tls_cert_file: needs tls_key_file, and the other way round".to_owned());
        }
        if !(1..=super::MAX_CONNECTIONS).contains(&self.max_connections) {
            problems.push(format!("max_connections: must be 1 to {}", super::MAX_CONNECTIONS));
        }
        if self.max_payload.as_u64() < 1024 || self.max_payload.as_u64() > 256 * 1024 * 1024 {
            problems.push("max_payload: must be 1KiB to 256MiB".to_owned());
        }
        if self.connect_timeout.is_zero() || self.connect_timeout > Duration::from_secs(60) {
            problems.push("connect_timeout: must be 1ms to 60s".to_owned());
        }
        if !(Duration::from_secs(1)..=Duration::from_secs(24 * 3600)).contains(&self.idle_timeout) {
            problems.push("idle_timeout: must be 1s to 24h".to_owned());
        }
        if !(1..=10_000).contains(&self.batch_max) {
            problems.push("batch_max: must be 1 to 10000".to_owned());
        }
        if !(1..=10_000).contains(&self.max_concurrent_batches) {
            problems.push("max_concurrent_batches: must be 1 to 10000".to_owned());
        }
        if !(1 << 20..=16 << 30).contains(&self.packet_memory.as_u64()) {
            problems.push("packet_memory: must be 1MiB to 16GiB".to_owned());
        }
        if self.rules.is_empty() {
            problems.push("rules: at least one rule is needed".to_owned());
        }
        if let Err(rules) = RuleSet::compile(&self.rules, "rules") {
            problems.extend(rules);
        }
        problems
    }
}

/// The endpoint, bound and ready to run.
pub struct MqttIngestSource {
    name: String,
    listener: std::net::TcpListener,
    addr: SocketAddr,
    shared: Arc<Shared>,
    max_connections: usize,
    tls: Option<TlsAcceptor>,
}

/// What every connection task reads.
struct Shared {
    rules: RuleSet,
    users: BTreeMap<String, String>,
    max_packet: usize,
    connect_timeout: Duration,
    idle_timeout: Duration,
    batch_max: usize,
    resends_without_dup: bool,
    /// One permit per connection working on a batch
    /// (`max_concurrent_batches`).
    batches: Semaphore,
    /// Bytes of packets over [`READ_CHUNK`] arriving (`packet_memory`).
    packet_memory: Semaphore,
    /// Per persistent client, its latest QoS 1 messages acknowledged: the
    /// ones it sends again when our PUBACK was lost with the connection or
    /// a crash.
    acked: Acked,
}

impl MqttIngestSource {
    /// Compiles the rules and binds the port (a taken port is an error
    /// now, naming `path.listen`). The buffer's directory (`state`) keeps
    /// the journal of acknowledged messages, synced as the buffer is
    /// (unless its `fsync` is `never`); without it they are remembered in
    /// memory only.
    pub fn build(
        config: &MqttIngestConfig,
        path: &str,
        state: Option<&BufferConfig>,
    ) -> Result<MqttIngestSource> {
        let rules = RuleSet::compile(&config.rules, "rules").map_err(|p| Error::InvalidConfig {
            problems: p.into_iter().map(|p| format!("{path}.{p}")).collect(),
        })?;
        let key: &'static str = "sources.mqtt_ingest.listen";
        let listen_error = |source| Error::Listen { key, addr: config.listen, source };
        let listener = std::net::TcpListener::bind(config.listen).map_err(listen_error)?;
        listener.set_nonblocking(true).map_err(listen_error)?;
        let addr = listener.local_addr().map_err(listen_error)?;
        crate::source::warn_if_open(addr, config.users.is_empty(), path, "its users");
        let max_packet = usize::try_from(config.max_payload.as_u64()).unwrap_or(usize::MAX);
        // Clients gone for good are forgotten beyond this.
        let max_clients = config.max_connections.saturating_mul(2);
        let tls = match (&config.tls_cert_file, &config.tls_key_file) {
            (Some(cert), Some(key)) => Some(
                acceptor(cert, key)
                    .map_err(|p| Error::InvalidConfig { problems: vec![format!("{path}.{p}")] })?,
            ),
            _ => None,
        };
        Ok(MqttIngestSource {
            tls,
            name: config.name.clone(),
            listener,
            addr,
            max_connections: config.max_connections,
            shared: Arc::new(Shared {
                rules,
                users: config.users.clone(),
                max_packet: max_packet.saturating_add(1024),
                connect_timeout: config.connect_timeout,
                idle_timeout: config.idle_timeout,
                batch_max: config.batch_max,
                resends_without_dup: config.resends_without_dup,
                batches: Semaphore::new(config.max_concurrent_batches),
                packet_memory: Semaphore::new(
                    usize::try_from(config.packet_memory.as_u64())
                        .unwrap_or(usize::MAX)
                        .max(max_packet.saturating_add(1024)),
                ),
                acked: match state {
                    Some(state) => Acked::open(
                        &journal_path(&state.dir, &config.name),
                        &config.name,
                        max_clients,
                        state.fsync != FsyncPolicy::Never,
                    ),
                    None => Acked::in_memory(max_clients),
                },
            }),
        })
    }
}

/// A TLS acceptor for the certificate chain and key files; problems as
/// `key: reason`.
fn acceptor(cert: &Path, key: &Path) -> std::result::Result<TlsAcceptor, String> {
    use crate::tls;
    let certs = tls::certificates("tls_cert_file", cert, &tls::read("tls_cert_file", cert)?)?;
    let key_der = tls::private_key("tls_key_file", key, &tls::read("tls_key_file", key)?)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("tls_cert_file: {e}"))?
        .with_no_client_auth()
        .with_single_cert(certs, key_der)
        .map_err(|e| format!("tls_key_file: {e}"))?;
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// Where an endpoint keeps its journal of acknowledged messages.
fn journal_path(dir: &Path, source: &str) -> PathBuf {
    state_file(dir, "mqtt-ingest", source, "acked")
}

impl MqttIngestSource {
    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

#[async_trait]
impl Source for MqttIngestSource {
    fn name(&self) -> &str {
        &self.name
    }

    fn kind(&self) -> &'static str {
        "mqtt_ingest"
    }

    async fn run(self: Box<Self>, intake: Intake, shutdown: CancellationToken) -> Result<()> {
        let key: &'static str = "sources.mqtt_ingest.listen";
        let listener = TcpListener::from_std(self.listener).map_err(|source| Error::Listen {
            key,
            addr: self.addr,
            source,
        })?;
        // Devices wait in the listen queue meanwhile: their copies must
        // meet the memory complete.
        if let Some(from_seq) = self.shared.acked.interrupted_from() {
            self.shared.acked.recover(&read_back(intake.buffer(), from_seq, &self.name).await);
        }
        let slots = Arc::new(Semaphore::new(self.max_connections));
        let connections = TaskTracker::new();
        intake.health().set_connected(true);
        loop {
            let accepted = tokio::select! {
                accepted = listener.accept() => accepted,
                () = shutdown.cancelled() => break,
            };
            let (stream, peer) = match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors and the like: pause, go on.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
                intake.health().connection_refused();
                if intake.health().may_log(crate::source::now_ms()) {
                    tracing::warn!(%peer, "too many device connections: closed");
                }
                continue;
            };
            let (shared, intake, stop) =
                (Arc::clone(&self.shared), intake.clone(), shutdown.clone());
            let tls = self.tls.clone();
            let open = intake.health().connection_opened();
            let task = async move {
                let _slot = (slot, open);
                let served = match tls {
                    None => serve(stream, &shared, &intake, &stop).await,
                    // Boxed: inline, a TLS connection's state would size
                    // every connection's task (5.3 KB each instead of
                    // 1.2 KB, measured; a thousand devices are a thousand
                    // tasks).
                    Some(tls) => {
                        Box::pin(async {
                            let handshake =
                                tokio::time::timeout(shared.connect_timeout, tls.accept(stream));
                            match handshake.await {
                                Ok(Ok(stream)) => serve(stream, &shared, &intake, &stop).await,
                                Ok(Err(e)) => Err(format!("TLS handshake: {e}")),
                                Err(_) => Err("no TLS handshake in time".to_owned()),
                            }
                        })
                        .await
                    }
                };
                if let Err(reason) = served {
                    if intake.health().may_log(crate::source::now_ms()) {
                        tracing::info!(%peer, %reason, "device connection closed");
                    } else {
                        tracing::debug!(%peer, %reason, "device connection closed");
                    }
                }
            };
            connections.spawn(task);
        }
        connections.close();
        connections.wait().await;
        intake.health().set_connected(false);
        Ok(())
    }
}

/// Reads until one packet is complete.
async fn read_packet(
    stream: &mut (impl AsyncRead + Unpin),
    buf: &mut BytesMut,
    max: usize,
) -> std::result::Result<Packet, String> {
    loop {
        match Packet::read(buf, max) {
            Ok(packet) => return Ok(packet),
            Err(CodecError::InsufficientBytes(_)) => {}
            Err(e) => return Err(format!("malformed packet: {e}")),
        }
        if stream.read_buf(buf).await.map_err(|e| e.to_string())? == 0 {
            return Err("closed before CONNECT".to_owned());
        }
    }
}

fn write(out: &mut BytesMut, packet: Packet) {
    // Our own small packets always fit.
    let _ = packet.write(out, usize::MAX);
}

/// Writes `out` and empties it; a device that stops reading for
/// [`WRITE_TIMEOUT`] is dropped, and so is every device at shutdown.
async fn send(
    stream: &mut (impl AsyncWrite + Unpin),
    out: &mut BytesMut,
    shutdown: &CancellationToken,
) -> std::result::Result<(), String> {
    tokio::select! {
        written = tokio::time::timeout(WRITE_TIMEOUT, stream.write_all(out)) => match written {
            Ok(result) => result.map_err(|e| e.to_string())?,
            Err(_) => return Err("the device stopped reading".to_owned()),
        },
        () = shutdown.cancelled() => return Err("shutting down".to_owned()),
    }
    out.clear();
    Ok(())
}

/// Compares without an early exit on the first difference.
fn same(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// One device connection, until it closes, misbehaves or shutdown.
async fn serve(
    mut stream: impl AsyncRead + AsyncWrite + Unpin,
    shared: &Shared,
    intake: &Intake,
    shutdown: &CancellationToken,
) -> std::result::Result<(), String> {
    let mut buf = BytesMut::with_capacity(IDLE_BUFFER);
    let mut out = BytesMut::new();
    let first = tokio::time::timeout(
        shared.connect_timeout,
        // Before its login a connection may not make the gateway hold
        // more than a chunk: CONNECT carries no reading.
        read_packet(&mut stream, &mut buf, shared.max_packet.min(READ_CHUNK)),
    )
    .await
    .map_err(|_| "no CONNECT in time".to_owned())??;
    let Packet::Connect(connect) = first else {
        return Err("the first packet was not CONNECT".to_owned());
    };
    let refuse = |code| Packet::ConnAck(ConnAck::new(code, false));
    let allowed = shared.users.is_empty()
        || connect.login.as_ref().is_some_and(|login| {
            shared.users.get(&login.username).is_some_and(|p| same(p, &login.password))
        });
    let answer = if connect.protocol != Protocol::V4 {
        refuse(ConnectReturnCode::RefusedProtocolVersion)
    } else if connect.client_id.len() > MAX_CLIENT_ID {
        refuse(ConnectReturnCode::BadClientId)
    } else if !allowed {
        refuse(ConnectReturnCode::BadUserNamePassword)
    } else {
        // No session state is kept here; claiming the session makes a
        // persistent client send its unacknowledged messages again.
        Packet::ConnAck(ConnAck::new(ConnectReturnCode::Success, !connect.clean_session))
    };
    let accepted = matches!(&answer, Packet::ConnAck(a) if a.code == ConnectReturnCode::Success);
    write(&mut out, answer);
    send(&mut stream, &mut out, shutdown).await?;
    if !accepted {
        let shown: String = connect.client_id.chars().take(64).collect();
        let bytes = connect.client_id.len();
        return Err(format!("login refused for client {shown:?} ({bytes} bytes)"));
    }
    // A persistent client sends again what it got no PUBACK for (ConnAck
    // says we keep its session).
    let persistent =
        (!connect.clean_session && !connect.client_id.is_empty()).then_some(&connect.client_id);
    // Its first publishes may be copies without DUP: held, unacknowledged,
    // until `Acked::leading_copies` can tell.
    let mut leading = persistent.filter(|_| shared.resends_without_dup);
    let mut held: Vec<Publish> = Vec::new();
    let mut held_until: Option<tokio::time::Instant> = None;
    // The device must speak within 1.5 keep-alive intervals.
    let idle = match connect.keep_alive {
        0 => shared.idle_timeout,
        seconds => Duration::from_millis(u64::from(seconds) * 1500),
    };
    let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
    // Room in `packet_memory` for the first packet in `buf`, held until
    // that packet is taken into a batch.
    let mut reserved = None;
    loop {
        // A batch that stopped at batch_max leaves whole packets behind:
        // handle them before waiting for more.
        let first = match scan(&buf, shared.max_packet, 1) {
            Scan { complete: 0, bad: Some(e), .. } => {
                intake.health().rejected("malformed_packet");
                return Err(format!("malformed packet: {e}"));
            }
            first => first,
        };
        let complete = first.complete > 0;
        // The packet arriving is bigger than a connection may hold on its
        // own: it waits for room in `packet_memory` before reading more.
        if !complete && first.next > READ_CHUNK && reserved.is_none() {
            let bytes = u32::try_from(first.next).unwrap_or(u32::MAX);
            reserved = tokio::select! {
                permit = shared.packet_memory.acquire_many(bytes) => {
                    Some(permit.map_err(|_| "shutting down".to_owned())?)
                }
                () = shutdown.cancelled() => return Ok(()),
            };
        }
        // Small until the connection holds a batch slot: a thousand devices
        // waiting for one must not hold a [`READ_CHUNK`] each. A packet
        // with room reserved is read to its end.
        let wanted = first.next.saturating_sub(buf.len());
        let room = if reserved.is_some() { wanted } else { wanted.clamp(IDLE_BUFFER, READ_CHUNK) };
        if !complete {
            buf.reserve(room);
        }
        let read = async {
            if complete {
                return Ok(usize::MAX);
            }
            let limited = &mut (&mut buf).limit(room);
            tokio::time::timeout(idle, stream.read_buf(limited))
                .await
                .unwrap_or_else(|_| Err(std::io::Error::other("silent past its keep-alive")))
        };
        let waited = async {
            match held_until {
                Some(until) => tokio::time::sleep_until(until).await,
                None => std::future::pending().await,
            }
        };
        let n = tokio::select! {
            n = read => n.map_err(|e| e.to_string())?,
            // Decide on what is held.
            () = waited => usize::MAX,
            () = shutdown.cancelled() => return Ok(()),
        };
        if n == 0 && held.is_empty() {
            return Ok(());
        }
        // Nothing whole yet: no batch to take a slot for.
        if n != 0 && n != usize::MAX && scan(&buf, shared.max_packet, 1).complete == 0 {
            continue;
        }
        // Held until the batch is durable: reading ahead, the packets and
        // their events are what a connection costs in memory.
        let slot = tokio::select! {
            slot = shared.batches.acquire() => slot.map_err(|_| "shutting down".to_owned())?,
            () = shutdown.cancelled() => return Ok(()),
        };
        // Take whatever else has arrived already, so that one append (and
        // one fsync) covers everything the device has in flight: whole
        // packets, up to what one batch takes, and at most a chunk of the
        // packet after them (more of it waits for room reserved).
        let most = shared.batch_max.saturating_sub(held.len()).max(1);
        let mut ahead = scan(&buf, shared.max_packet, most);
        let mut eof = n == 0;
        while !eof && buf.len() < READ_AHEAD && ahead.complete < most && ahead.bad.is_none() {
            let room = (ahead.end + READ_CHUNK).saturating_sub(buf.len());
            if room == 0 {
                break;
            }
            if buf.capacity() - buf.len() < IDLE_BUFFER {
                buf.reserve(READ_CHUNK);
            }
            // A zero timeout polls the read once: data already there, or
            // nothing (reading is cancel safe).
            let limited = &mut (&mut buf).limit(room);
            match tokio::time::timeout(Duration::ZERO, stream.read_buf(limited)).await {
                Ok(Ok(0)) => {
                    eof = true;
                    break;
                }
                Ok(Ok(_)) => {}
                Ok(Err(e)) => return Err(e.to_string()),
                Err(_) => break,
            }
            ahead = scan_on(ahead, &buf, shared.max_packet, most);
        }
        let mut closing = eof.then_some(Ok(()));
        // Per batch: kept between batches, its capacity (up to a hundred
        // packets) would stay with every idle connection.
        let mut publishes = std::mem::take(&mut held);
        let were_held = publishes.len();
        let unparsed = buf.len();
        let grown = buf.capacity() > IDLE_BUFFER;
        while publishes.len() < shared.batch_max {
            match Packet::read(&mut buf, shared.max_packet) {
                Ok(Packet::Publish(publish)) => {
                    if publish.qos == QoS::ExactlyOnce {
                        closing = Some(Err("QoS 2 is not supported".to_owned()));
                        break;
                    }
                    publishes.push(publish);
                }
                Ok(Packet::PingReq) => write(&mut out, Packet::PingResp),
                Ok(Packet::Subscribe(s)) => {
                    let codes = vec![SubscribeReasonCode::Failure; s.filters.len()];
                    write(&mut out, Packet::SubAck(SubAck::new(s.pkid, codes)));
                }
                Ok(Packet::Unsubscribe(u)) => {
                    write(&mut out, Packet::UnsubAck(UnsubAck::new(u.pkid)));
                }
                Ok(Packet::Disconnect) => {
                    closing = Some(Ok(()));
                    break;
                }
                Ok(Packet::Connect(_)) => {
                    closing = Some(Err("a second CONNECT".to_owned()));
                    break;
                }
                Ok(_) => {}
                Err(CodecError::InsufficientBytes(_)) => break,
                Err(e) => {
                    intake.health().rejected("malformed_packet");
                    closing = Some(Err(format!("malformed packet: {e}")));
                    break;
                }
            }
        }
        let mut copies = 0;
        if let Some(client) = leading.filter(|_| !publishes.is_empty()) {
            let last = closing.is_some()
                || held_is_full(&publishes, shared.batch_max)
                || held_until.is_some_and(|until| until <= tokio::time::Instant::now());
            match shared.acked.leading_copies(client, &publishes, last) {
                Some(n) => {
                    (copies, leading, held_until) = (n, None, None);
                }
                None => {
                    // Waits for more of the run, from its latest publish.
                    if publishes.len() > were_held {
                        held_until = Some(tokio::time::Instant::now() + RESEND_WAIT);
                    }
                    held = publishes;
                    drop(slot);
                    if buf.len() < unparsed {
                        reserved = None;
                    }
                    if !out.is_empty() {
                        send(&mut stream, &mut out, shutdown).await?;
                    }
                    continue;
                }
            }
        }
        if !publishes.is_empty() {
            // Boxed: the mapping and append state is only needed while a
            // batch is processed.
            let batch = Box::pin(store(
                shared,
                intake,
                persistent,
                &publishes,
                copies,
                &mut backoff,
                shutdown,
            ));
            if !batch.await {
                // Shutdown before the append: nothing is acknowledged.
                return Ok(());
            }
            for p in publishes.drain(..) {
                if p.qos == QoS::AtLeastOnce {
                    write(&mut out, Packet::PubAck(PubAck::new(p.pkid)));
                }
            }
        }
        drop(slot);
        // The packet room was reserved for is stored.
        if buf.len() < unparsed {
            reserved = None;
        }
        if !out.is_empty() {
            send(&mut stream, &mut out, shutdown).await?;
        }
        if let Some(result) = closing {
            return result;
        }
        // Between batches a connection keeps only what it has of the next
        // packet, in an allocation of its own: a view into the batch's
        // would keep all of it alive (a read-ahead's megabyte, a large
        // message) for as long as the device stays idle. A message with
        // room reserved stays where it is.
        if grown && reserved.is_none() {
            buf = own_copy(&buf);
        }
    }
}

/// `bytes` in a buffer of their own, at least [`IDLE_BUFFER`] large.
fn own_copy(bytes: &[u8]) -> BytesMut {
    let mut own = BytesMut::with_capacity(bytes.len().max(IDLE_BUFFER));
    own.extend_from_slice(bytes);
    own
}

/// What a connection's buffer starts with.
#[derive(Debug)]
struct Scan {
    /// Whole packets, counted up to the most asked for.
    complete: usize,
    /// Where they end.
    end: usize,
    /// The length of the packet after them, once its fixed header is in
    /// (before, a little more than the bytes there).
    next: usize,
    /// What is wrong with the packet after them.
    bad: Option<CodecError>,
}

/// Walks the whole packets at the start of `buf`, at most `most`.
fn scan(buf: &[u8], max: usize, most: usize) -> Scan {
    let from = Scan { complete: 0, end: 0, next: 0, bad: None };
    scan_on(from, buf, max, most)
}

/// [`scan`] from where an earlier scan of the same buffer, since grown,
/// stopped: reading ahead rescans no packet.
fn scan_on(mut scan: Scan, buf: &[u8], max: usize, most: usize) -> Scan {
    scan.bad = None;
    while scan.complete < most {
        match rumqttc::mqttbytes::check(buf[scan.end..].iter(), max) {
            Ok(header) => {
                scan.end += header.frame_length();
                scan.complete += 1;
            }
            Err(CodecError::InsufficientBytes(missing)) => {
                scan.next = buf.len() - scan.end + missing;
                break;
            }
            Err(e) => {
                scan.bad = Some(e);
                break;
            }
        }
    }
    scan
}

/// Whether publishes held to be told copies or new must be decided now,
/// however the run would go on: they are bounded like a batch, in count,
/// and in bytes by the read-ahead (a device replaying large messages must
/// not make a connection hold more).
fn held_is_full(publishes: &[Publish], batch_max: usize) -> bool {
    let bytes: usize = publishes.iter().map(|p| p.payload.len()).sum();
    publishes.len() >= batch_max || bytes >= READ_AHEAD
}

/// Maps and appends one batch of a connection, leaving out what a
/// persistent client sent again of messages already stored (the first
/// `copies`, and DUP copies), and remembers its messages as acknowledged;
/// `true` when they may be (appended, rejected or refused for good),
/// `false` when shutdown came first.
async fn store(
    shared: &Shared,
    intake: &Intake,
    persistent: Option<&String>,
    publishes: &[Publish],
    copies: usize,
    backoff: &mut Backoff,
    shutdown: &CancellationToken,
) -> bool {
    let mut resent = match persistent {
        Some(client) => shared.acked.resent(client, publishes),
        None => vec![false; publishes.len()],
    };
    resent.iter_mut().take(copies).for_each(|r| *r = true);
    let fresh: Vec<&Publish> =
        publishes.iter().zip(&resent).filter(|(_, r)| !**r).map(|(p, _)| p).collect();
    let records =
        prepare(&shared.rules, intake, fresh.iter().map(|p| (p.topic.as_str(), &p.payload[..])));
    // A crash during the append may leave some of the records stored and
    // their PUBACKs unsent: the journal names them, to be looked for.
    let batch = persistent.filter(|_| !records.is_empty()).map(|client| {
        let records = records
            .iter()
            .filter(|(i, _)| fresh[*i].qos == QoS::AtLeastOnce)
            .map(|(i, record)| {
                let p = fresh[*i];
                (p.pkid, Fingerprint::of(&p.topic, &p.payload), crc32c::crc32c(record))
            })
            .collect();
        let from_seq = appending_from(intake);
        shared.acked.appending(Batch { client: client.clone(), from_seq, records })
    });
    if batch.is_some() {
        shared.acked.synced().await;
    }
    let records = records.into_iter().map(|(_, record)| record).collect();
    if !append(intake, records, backoff, shutdown).await {
        return false;
    }
    let n_resent = resent.iter().filter(|r| **r).count();
    if n_resent > 0 {
        intake.health().resent(n_resent as u64);
        tracing::info!(client = ?persistent, n = n_resent, "a device sent again messages already stored: acknowledged, not stored twice");
    }
    if let Some(client) = persistent {
        shared.acked.acknowledging(client, batch, fresh);
    }
    true
}

#[cfg(test)]
mod tests;
