//! MQTT source: a rumqttc client (MQTT 3.1.1 or 5) of an external broker
//! or of the embedded one (`mqtt/broker.rs`), subscribing with QoS 1 and a
//! persistent session.
//!
//! Two tasks per source. The poller (`mqtt/session.rs`) drives rumqttc's
//! event loop (connections, reconnects with backoff, pings, and writing our
//! acks) and hands every PUBLISH to the processor over a bounded channel. The
//! processor takes up to `batch_max` messages at once, maps them with the
//! source's rules, appends the events to the buffer in one append and only
//! then acknowledges each message (`set_manual_acks(true)`, then
//! `client.ack`) in the order received. A crash before the append returns
//! leaves the messages unacknowledged: the broker sends them again on the
//! next session. A crash or a lost connection after the append and before
//! the broker read the acks makes it send again messages already stored;
//! `mqtt/redelivery.rs` recognises those and acknowledges them without
//! storing them twice.

pub mod broker;
pub mod ingest;
mod redelivery;
mod session;
mod subscriptions;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use bytesize::ByteSize;
use rand::SeedableRng;
use rand::rngs::StdRng;
use rumqttc::{MqttOptions, QoS};
use serde::Deserialize;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::mapping::{RuleConfig, RuleSet};
use super::{Intake, Source, now_ms};
use crate::backoff::Backoff;
use crate::buffer::{Buffer, BufferConfig, FsyncPolicy, Record};
use crate::error::{Error, Result};
use crate::uplink::Secret;
use broker::EmbeddedBroker;
use redelivery::{Fingerprint, Redelivery};
use session::{Message, Options, Poller};

/// `broker` value naming the embedded broker.
pub const EMBEDDED: &str = "embedded";

/// Acks, barriers and subscriptions queued for the event loop. Queuing an
/// ack must never wait: the processor would wait for the poller to write
/// acks while the poller waits for the processor to take messages, and
/// the source would stop for good. Unacknowledged messages are bounded by
/// the packet-id space (65,535), not by a broker's in-flight setting
/// (Mosquitto sent thousands past its default of 20 when acks came in
/// bursts, and filled a queue of 4,096), so the queue holds that many
/// plus room for the rest. flume allocates only what is queued.
const REQUEST_CAPACITY: usize = 65_536 + 1024;

/// Most records (and bytes) read back to find a batch whose append a
/// crash interrupted: its own and whatever other sources appended beside it.
const INTERRUPTED_RECORDS: usize = 100_000;
const INTERRUPTED_BYTES: usize = 64 << 20;

/// Most device connections the embedded broker or an ingest endpoint may be
/// configured for: far past what one gateway serves, and a bound on what
/// rumqttd sets aside at start (room for each connection in several
/// tables) and on the endpoint's connection permits.
const MAX_CONNECTIONS: usize = 100_000;

/// How long a stopping source keeps polling to write its last acks.
const ACK_FLUSH: Duration = Duration::from_secs(2);

/// One `[[sources.mqtt]]` table.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MqttSourceConfig {
    /// Name in health, metrics and logs. Required, unique.
    pub name: String,
    /// `embedded` (the gateway's own broker, `[sources.mqtt_broker]`),
    /// `mqtt://host:port` (default port 1883) or `mqtts://host:port` (TLS,
    /// default port 8883). Required.
    pub broker: String,
    /// Client id; the broker keeps the persistent session under it, so keep
    /// it stable and unique per gateway. Default `opgraph-<name>`.
    pub client_id: String,
    /// `"3.1.1"` (default) or `"5"`. With 5 the broker sends at most
    /// `receive_maximum` unacknowledged messages at once.
    pub protocol: MqttProtocol,
    /// MQTT 5 only: how long the broker keeps the session (and queues
    /// messages) while the gateway is away. Default `7d`; 3.1.1 brokers
    /// keep persistent sessions by their own policy.
    #[serde(with = "humantime_serde")]
    pub session_expiry: Duration,
    /// Login, when the broker wants one.
    pub username: Option<String>,
    /// Password; better: `password_env`.
    pub password: Option<Secret>,
    /// Environment variable holding the password.
    pub password_env: Option<String>,
    /// `false` (default): a persistent session, so messages published while
    /// the gateway is down or not yet acknowledged are delivered on the next
    /// connection. `true` loses them.
    pub clean_session: bool,
    /// QoS of the subscriptions: 1 (default, at least once) or 0 (at most
    /// once: nothing is acknowledged, a crash loses messages).
    pub qos: u8,
    /// Topic filters to subscribe to. Default: the rules' filters. On a
    /// persistent session, one removed is unsubscribed from on the next
    /// connection (`mqtt/subscriptions.rs`).
    pub subscriptions: Vec<String>,
    /// Keep-alive ping interval. Default `30s`.
    #[serde(with = "humantime_serde")]
    pub keep_alive: Duration,
    /// Largest message accepted; a larger one drops the connection (MQTT has
    /// no way to refuse one message), so keep it above what devices send.
    /// Default `1MiB`.
    pub max_payload: ByteSize,
    /// Most messages mapped and appended at once. Default 256.
    pub batch_max: usize,
    /// Recognise messages the broker sends again after they were stored,
    /// and store them once (QoS 1, persistent session, external broker).
    /// Needs a broker that answers an UNSUBSCRIBE of a filter never
    /// subscribed, as MQTT requires. One that does not is detected (after a
    /// minute without an answer, or three connections in a row closed on
    /// one) and the source falls back to at least once, with a warning and
    /// `resend_check_given_up` in its health, for an hour before it tries
    /// again.
    /// Default `true`; `false` skips the check (and those reconnects).
    pub recognise_resends: bool,
    /// What to do with the broker's retained messages (see [`Retained`]).
    /// Default `"new_session"`.
    pub retained: Retained,
    /// A device time further than this from the receive time is replaced by
    /// the receive time (kept in `context.deviceTimestamp`) and counted in
    /// `clock_skew`. Default `30s`.
    #[serde(with = "humantime_serde")]
    pub max_clock_skew: Duration,
    /// Certificates to trust for `mqtts://` instead of the platform roots.
    pub ca_file: Option<PathBuf>,
    /// Client certificate and key for mutual TLS.
    pub client_cert_file: Option<PathBuf>,
    pub client_key_file: Option<PathBuf>,
    /// Reconnect backoff: first delay (default `200ms`) and cap (`30s`),
    /// each above 0 and at most `1h`.
    #[serde(with = "humantime_serde")]
    pub backoff_initial: Duration,
    #[serde(with = "humantime_serde")]
    pub backoff_max: Duration,
    /// Mapping rules, first match wins (`[[sources.mqtt.rules]]`).
    pub rules: Vec<RuleConfig>,
}

impl Default for MqttSourceConfig {
    fn default() -> Self {
        MqttSourceConfig {
            name: String::new(),
            broker: String::new(),
            client_id: String::new(),
            protocol: MqttProtocol::V311,
            session_expiry: Duration::from_secs(7 * 24 * 3600),
            username: None,
            password: None,
            password_env: None,
            clean_session: false,
            qos: 1,
            subscriptions: Vec::new(),
            keep_alive: Duration::from_secs(30),
            max_payload: ByteSize::mib(1),
            batch_max: 256,
            recognise_resends: true,
            retained: Retained::NewSession,
            max_clock_skew: Duration::from_secs(30),
            ca_file: None,
            client_cert_file: None,
            client_key_file: None,
            backoff_initial: Duration::from_millis(200),
            backoff_max: Duration::from_secs(30),
            rules: Vec::new(),
        }
    }
}

/// The MQTT protocol version of a source.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
pub enum MqttProtocol {
    #[default]
    #[serde(rename = "3.1.1")]
    V311,
    #[serde(rename = "5")]
    V5,
}

/// What a source does with a message the broker flags retained. A broker
/// keeps each topic's retained message and sends it, flagged, on every
/// SUBSCRIBE that matches (MQTT 3.1.1 3.3.1.3, 5 3.3.1.3): a topic's last
/// value, sent because the gateway subscribed, not because a device
/// published it now. The gateway subscribes on every connection, so
/// without a rule each reconnect and restart would store every retained
/// value again. Messages forwarded live come unflagged, retained or not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Retained {
    /// Stored on a connection that starts a new session, where the gateway
    /// may never have had them; on a resumed session (the broker says the
    /// session is present) acknowledged and not stored: that session
    /// brought each of them already, live or queued while the gateway was
    /// away.
    #[default]
    NewSession,
    /// Stored every time (each connection stores them again).
    Always,
    /// Never stored: only what devices publish while subscribed counts.
    Never,
}

impl Retained {
    /// Whether a retained message is acknowledged without being stored;
    /// `resumed`: it matches a filter that the session the connection
    /// resumed held already.
    pub fn skips(self, resumed: bool) -> bool {
        match self {
            Retained::NewSession => resumed,
            Retained::Always => false,
            Retained::Never => true,
        }
    }
}

/// Most unacknowledged messages an MQTT 5 broker may send at once.
const RECEIVE_MAXIMUM: u16 = 1000;

/// Where to connect.
#[derive(Debug, Clone, PartialEq)]
enum Endpoint {
    Embedded,
    Remote { host: String, port: u16, tls: bool },
}

fn parse_broker(broker: &str) -> std::result::Result<Endpoint, String> {
    if broker == EMBEDDED {
        return Ok(Endpoint::Embedded);
    }
    let (tls, rest) = if let Some(rest) = broker.strip_prefix("mqtt://") {
        (false, rest)
    } else if let Some(rest) = broker.strip_prefix("mqtts://") {
        (true, rest)
    } else {
        return Err(format!(
            "{broker:?}: must be \"embedded\", mqtt://host:port or mqtts://host:port"
        ));
    };
    let rest = rest.trim_end_matches('/');
    let default_port = if tls { 8883 } else { 1883 };
    let bracketed = rest.starts_with('[') && rest.ends_with(']');
    let (host, port) = match rest.rsplit_once(':') {
        Some((host, port)) if !bracketed && (!host.contains(':') || host.ends_with(']')) => {
            let port = port.parse::<u16>().map_err(|e| format!("{broker:?}: port: {e}"))?;
            (host, port)
        }
        _ => (rest, default_port),
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() || host.contains(['/', '@', '?']) {
        return Err(format!("{broker:?}: bad host"));
    }
    Ok(Endpoint::Remote { host: host.to_owned(), port, tls })
}

impl MqttSourceConfig {
    fn embedded_v5(&self) -> bool {
        self.broker == EMBEDDED && self.protocol == MqttProtocol::V5
    }

    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if self.name.trim().is_empty()
            || self.name.len() > 100
            || self.name.contains(char::is_control)
        {
            problems.push("name: required, at most 100 bytes".to_owned());
        }
        match parse_broker(&self.broker) {
            Ok(Endpoint::Remote { tls: false, .. }) if self.ca_file.is_some() => {
                problems.push("ca_file: only for mqtts://".to_owned());
            }
            Ok(_) => {}
            Err(e) => problems.push(format!("broker: {e}")),
        }
        if self.client_id.len() > 128 {
            problems.push("client_id: at most 128 bytes".to_owned());
        }
        if self.session_expiry > Duration::from_secs(u64::from(u32::MAX)) {
            problems.push("session_expiry: at most 136 years".to_owned());
        }
        if self.embedded_v5() {
            problems.push("protocol: the embedded broker is reached over 3.1.1".to_owned());
        }
        if self.qos > 1 {
            problems.push("qos: must be 0 or 1".to_owned());
        }
        if self.client_cert_file.is_some() != self.client_key_file.is_some() {
            problems.push(
                "client_cert_file: needs client_key_file, and the other way round".to_owned(),
            );
        }
        if self.password.is_some() && self.username.is_none() {
            problems.push("password: needs username".to_owned());
        }
        if self.keep_alive < Duration::from_secs(1) || self.keep_alive > Duration::from_secs(3600) {
            problems.push("keep_alive: must be 1s to 1h".to_owned());
        }
        if self.max_payload.as_u64() < 1024 || self.max_payload.as_u64() > 256 * 1024 * 1024 {
            problems.push("max_payload: must be 1KiB to 256MiB".to_owned());
        }
        if !(1..=1000).contains(&self.batch_max) {
            problems.push("batch_max: must be 1 to 1000".to_owned());
        }
        problems.extend(crate::backoff::problems(self.backoff_initial, self.backoff_max));
        if self.rules.is_empty() {
            problems.push("rules: at least one rule is needed".to_owned());
        }
        if let Err(rules) = RuleSet::compile(&self.rules, "rules") {
            problems.extend(rules);
        }
        problems
    }
}

/// A configured MQTT subscription, built and ready to run.
pub struct MqttSource {
    name: String,
    options: Options,
    subscriptions: Vec<String>,
    qos: QoS,
    rules: RuleSet,
    batch_max: usize,
    backoff: Backoff,
    /// Where the messages that may come again are kept across restarts,
    /// and whether synced before each append; `None` when they are not
    /// looked for or there is no directory to keep them in.
    redelivery_file: Option<(PathBuf, bool)>,
    /// Whether to recognise messages sent again (`recognise_resends`, QoS
    /// 1, a persistent session, an external broker).
    recognise_resends: bool,
    retained: Retained,
    /// Where the session's filters are kept across runs (an external
    /// broker's persistent session), and the session's name there.
    subscriptions_file: Option<PathBuf>,
    session: String,
}

impl MqttSource {
    /// Builds the client options (reading certificates) and the rules.
    /// `path` is the config key (`sources.mqtt[0]`) for errors; `state`
    /// the buffer's configuration: its directory keeps the source's state
    /// across restarts, synced as the buffer is (unless its `fsync` is
    /// `never`).
    pub fn build(
        config: &MqttSourceConfig,
        embedded: Option<&EmbeddedBroker>,
        path: &str,
        state: Option<&BufferConfig>,
    ) -> Result<MqttSource> {
        let invalid = |p: String| Error::InvalidConfig { problems: vec![format!("{path}.{p}")] };
        let rules = RuleSet::compile(&config.rules, "rules").map_err(|p| Error::InvalidConfig {
            problems: p.into_iter().map(|p| format!("{path}.{p}")).collect(),
        })?;
        let endpoint = parse_broker(&config.broker).map_err(|e| invalid(format!("broker: {e}")))?;
        let external = endpoint != Endpoint::Embedded;
        let client_id = if config.client_id.is_empty() {
            format!("opgraph-{}", config.name)
        } else {
            config.client_id.clone()
        };
        let session = format!("{} {client_id}", config.broker);
        let mut login = config
            .username
            .clone()
            .map(|u| (u, config.password.as_ref().map(|p| p.0.clone()).unwrap_or_default()));
        let (host, port, tls) = match endpoint {
            Endpoint::Embedded => {
                let broker = embedded.ok_or_else(|| {
                    invalid("broker: \"embedded\" needs [sources.mqtt_broker]".into())
                })?;
                let addr = broker.client_addr();
                if let Some(internal) = &broker.internal_login {
                    login = Some(internal.clone());
                }
                (addr.ip().to_string(), addr.port(), false)
            }
            Endpoint::Remote { host, port, tls } => (host, port, tls),
        };
        let max = usize::try_from(config.max_payload.as_u64()).unwrap_or(usize::MAX);
        let transport = if tls {
            let tls = tls_config(config).map_err(invalid)?;
            rumqttc::Transport::Tls(rumqttc::TlsConfiguration::Rustls(Arc::new(tls)))
        } else {
            rumqttc::Transport::Tcp
        };
        let options = match config.protocol {
            MqttProtocol::V311 => {
                let mut options = MqttOptions::new(client_id, host, port);
                options
                    .set_clean_session(config.clean_session)
                    .set_keep_alive(config.keep_alive)
                    .set_manual_acks(true)
                    .set_request_channel_capacity(REQUEST_CAPACITY)
                    .set_max_packet_size(max.saturating_add(1024), max.saturating_add(1024))
                    .set_transport(transport);
                if let Some((user, pass)) = login {
                    options.set_credentials(user, pass);
                }
                Options::V4(Box::new(options))
            }
            MqttProtocol::V5 => {
                let mut options = rumqttc::v5::MqttOptions::new(client_id, host, port);
                let expiry = (!config.clean_session)
                    .then(|| u32::try_from(config.session_expiry.as_secs()).unwrap_or(u32::MAX));
                options
                    .set_clean_start(config.clean_session)
                    .set_session_expiry_interval(expiry)
                    .set_receive_maximum(Some(RECEIVE_MAXIMUM))
                    .set_keep_alive(config.keep_alive)
                    .set_manual_acks(true)
                    .set_request_channel_capacity(REQUEST_CAPACITY)
                    .set_max_packet_size(Some(
                        u32::try_from(max.saturating_add(1024)).unwrap_or(u32::MAX),
                    ))
                    .set_transport(transport);
                if let Some((user, pass)) = login {
                    options.set_credentials(user, pass);
                }
                Options::V5(Box::new(options))
            }
        };
        let subscriptions = if config.subscriptions.is_empty() {
            rules.subscriptions()
        } else {
            config.subscriptions.clone()
        };
        // rumqttd, the embedded broker, stops with the gateway (it keeps
        // nothing to send again after a crash) and answers no UNSUBSCRIBE of
        // a filter never subscribed (the barrier).
        let recognise_resends =
            config.recognise_resends && config.qos == 1 && !config.clean_session && external;
        Ok(MqttSource {
            name: config.name.clone(),
            options,
            subscriptions,
            qos: if config.qos == 0 { QoS::AtMostOnce } else { QoS::AtLeastOnce },
            rules,
            batch_max: config.batch_max,
            backoff: Backoff::new(config.backoff_initial, config.backoff_max),
            redelivery_file: state.filter(|_| recognise_resends).map(|state| {
                (Redelivery::path(&state.dir, &config.name), state.fsync != FsyncPolicy::Never)
            }),
            recognise_resends,
            retained: config.retained,
            subscriptions_file: state
                .filter(|_| external && !config.clean_session)
                .map(|state| subscriptions::Subscriptions::path(&state.dir, &config.name)),
            session,
        })
    }
}

/// rustls on ring with `ca_file` (or the platform roots) and the optional
/// client certificate; problems as `key: reason`.
fn tls_config(config: &MqttSourceConfig) -> std::result::Result<rustls::ClientConfig, String> {
    let roots = crate::tls::trusted_roots(config.ca_file.as_deref())?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("broker: TLS: {e}"))?
        .with_root_certificates(roots);
    match (&config.client_cert_file, &config.client_key_file) {
        (Some(cert), Some(key)) => {
            let pem = crate::tls::read("client_cert_file", cert)?;
            let certs = crate::tls::certificates("client_cert_file", cert, &pem)?;
            let pem = crate::tls::read("client_key_file", key)?;
            let key_der = crate::tls::private_key("client_key_file", key, &pem)?;
            builder
                .with_client_auth_cert(certs, key_der)
                .map_err(|e| format!("client_key_file: {e}"))
        }
        _ => Ok(builder.with_no_client_auth()),
    }
}

#[async_trait]
impl Source for MqttSource {
    fn name(&self) -> &str {
        &self.name
    }

    fn kind(&self) -> &'static str {
        "mqtt"
    }

    async fn run(self: Box<Self>, intake: Intake, shutdown: CancellationToken) -> Result<()> {
        let this = *self;
        let redelivery = match &this.redelivery_file {
            Some((path, sync)) => Redelivery::open(path, &this.name, *sync),
            None => Redelivery::in_memory(),
        };
        let redelivery = Arc::new(redelivery.reporting_to(Arc::clone(intake.health())));
        if let Some(from_seq) = redelivery.interrupted_append() {
            redelivery.recover(&read_back(intake.buffer(), from_seq, &this.name).await);
        }
        let (tx, mut rx) = mpsc::channel::<Message>(this.batch_max.saturating_mul(2));
        let stop_polling = CancellationToken::new();
        let poller = Poller {
            filters: this.subscriptions.clone(),
            qos: this.qos,
            tx,
            health: Arc::clone(intake.health()),
            backoff: this.backoff.clone(),
            shutdown: shutdown.clone(),
            stop: stop_polling.clone(),
            redelivery: Arc::clone(&redelivery),
            connections: 0,
            retained: this.retained,
            subscriptions: subscriptions::Subscriptions::open(
                this.subscriptions_file.clone(),
                this.session.clone(),
                &this.name,
            ),
        };
        let (client, mut poller) = session::start(this.options.clone(), REQUEST_CAPACITY, poller);
        let mut backoff = this.backoff.clone();
        let mut batch = Vec::with_capacity(this.batch_max);
        'receive: loop {
            batch.clear();
            tokio::select! {
                n = rx.recv_many(&mut batch, this.batch_max) => if n == 0 { break },
                () = redelivery.answered() => {
                    if redelivery.barrier_due() && !client.barrier().await {
                        break;
                    }
                    continue;
                }
                () = shutdown.cancelled() => break,
            }
            // What came before a reconnect is remembered before the first
            // message after it is looked at.
            for run in batch.chunk_by(|a, b| a.connection == b.connection) {
                let acknowledge = if this.recognise_resends {
                    handle_resends(&this, &intake, &redelivery, run, &mut backoff, &shutdown).await
                } else {
                    let messages = run
                        .iter()
                        .filter(|m| !m.replay)
                        .map(|m| (m.topic.as_str(), &m.payload[..]));
                    process(&this.rules, &intake, messages, &mut backoff, &shutdown).await
                };
                if !acknowledge {
                    break 'receive;
                }
                let replays = run.iter().filter(|m| m.replay).count() as u64;
                if replays > 0 {
                    intake.health().retained_replayed(replays);
                    tracing::info!(source = %this.name, n = replays, "retained messages the resumed session had brought already: acknowledged, not stored again");
                }
                for message in run {
                    if !client.ack(&message.ack).await {
                        break 'receive;
                    }
                }
            }
            if redelivery.barrier_due() && !client.barrier().await {
                break;
            }
        }
        // Our last acks go out before the DISCONNECT, and a last barrier
        // shows the broker read them, so that the next run expects nothing
        // again; what is still queued stays unacknowledged for the next
        // session.
        drop(rx);
        let flushed = tokio::time::Instant::now() + ACK_FLUSH;
        let barriers = async {
            while redelivery.waiting() {
                if redelivery.barrier_due() && !client.barrier().await {
                    break;
                }
                redelivery.answered().await;
            }
        };
        let _ = tokio::time::timeout_at(flushed, barriers).await;
        client.try_disconnect();
        if tokio::time::timeout_at(flushed, &mut poller).await.is_err() {
            stop_polling.cancel();
            let _ = poller.await;
        }
        intake.health().set_connected(false);
        tracing::info!(source = %this.name, "MQTT source stopped");
        Ok(())
    }
}

/// The buffer's records from `from_seq` on, where a batch appending when
/// the last run stopped begins at the earliest (bounded); none when they
/// cannot be read, which leaves its copies stored twice.
async fn read_back(buffer: &Arc<dyn Buffer>, from_seq: u64, source: &str) -> Vec<Record> {
    match buffer.read(from_seq, INTERRUPTED_RECORDS, INTERRUPTED_BYTES).await {
        Ok(records) => records,
        Err(e) => {
            tracing::warn!(%source, error = %e, "cannot read back what was being appended at the last stop: copies sent again may be stored twice");
            Vec::new()
        }
    }
}

/// Where the records of an append about to start begin at the earliest.
fn appending_from(intake: &Intake) -> u64 {
    *intake.buffer().subscribe().borrow()
}

/// [`process`] for the messages of one connection that are not resends of
/// stored ones; then remembers them all until a barrier shows the broker
/// read their acks. `true` when they may be acknowledged.
async fn handle_resends(
    source: &MqttSource,
    intake: &Intake,
    redelivery: &Arc<Redelivery>,
    run: &[Message],
    backoff: &mut Backoff,
    shutdown: &CancellationToken,
) -> bool {
    let Some(connection) = run.first().map(|m| m.connection) else { return true };
    let fingerprints: Vec<Fingerprint> =
        run.iter().map(|m| Fingerprint::of(&m.topic, &m.payload)).collect();
    let resent = redelivery.resent(connection, fingerprints.iter().copied());
    let n_resent = (0..run.len()).filter(|i| resent[*i] && !run[*i].replay).count();
    let fresh: Vec<usize> = (0..run.len()).filter(|i| !resent[*i] && !run[*i].replay).collect();
    let messages = fresh.iter().map(|i| (run[*i].topic.as_str(), &run[*i].payload[..]));
    let records = prepare(&source.rules, intake, messages);
    if !records.is_empty() {
        let from_seq = appending_from(intake);
        let records = records
            .iter()
            .map(|(k, record)| (fingerprints[fresh[*k]], crc32c::crc32c(record)))
            .collect();
        redelivery.appending(redelivery::Appending { from_seq, records }).await;
    }
    let records = records.into_iter().map(|(_, record)| record).collect();
    if !append(intake, records, backoff, shutdown).await {
        return false;
    }
    if n_resent > 0 {
        intake.health().resent(n_resent as u64);
        tracing::info!(source = %source.name, n = n_resent, "the broker sent again messages already stored: acknowledged, not stored twice");
    }
    redelivery.acknowledging(connection, run.iter().map(|m| m.pkid).zip(fingerprints));
    true
}

/// Maps and appends one batch; `true` when its messages may be
/// acknowledged (appended, rejected, or refused for good), `false` when
/// shutdown came first (they stay unacknowledged).
async fn process<'a>(
    rules: &RuleSet,
    intake: &Intake,
    batch: impl IntoIterator<Item = (&'a str, &'a [u8])>,
    backoff: &mut Backoff,
    shutdown: &CancellationToken,
) -> bool {
    let records = prepare(rules, intake, batch).into_iter().map(|(_, r)| r).collect();
    append(intake, records, backoff, shutdown).await
}

/// Maps one batch into buffer records, counting the messages that do not
/// become one; each record comes with the position of its message.
fn prepare<'a>(
    rules: &RuleSet,
    intake: &Intake,
    batch: impl IntoIterator<Item = (&'a str, &'a [u8])>,
) -> Vec<(usize, Bytes)> {
    let now = now_ms();
    batch
        .into_iter()
        .enumerate()
        .filter_map(|(i, (topic, payload))| {
            intake.health().received(now);
            let mapped = rules.apply(topic, payload);
            if let Ok(m) = &mapped
                && !rules.admit(topic, m, now)
            {
                intake.health().throttled();
                return None;
            }
            intake.prepare(mapped, now).map(|record| (i, record))
        })
        .collect()
}

/// Appends the records of one batch, retrying while the buffer fails;
/// `true` as [`process`].
async fn append(
    intake: &Intake,
    records: Vec<Bytes>,
    backoff: &mut Backoff,
    shutdown: &CancellationToken,
) -> bool {
    if records.is_empty() {
        return true;
    }
    let mut rng = StdRng::from_os_rng();
    loop {
        match intake.append(records.clone()).await {
            Ok(_) => {
                backoff.reset();
                return true;
            }
            Err(Error::Closed) => return false,
            Err(e) if e.retryable() => {
                let delay = backoff.next_delay(&mut rng);
                tracing::warn!(error = %e, ?delay, "append failed; retrying, messages not acknowledged");
                tokio::select! {
                    () = tokio::time::sleep(delay) => {}
                    () = shutdown.cancelled() => return false,
                }
            }
            Err(e) => {
                tracing::error!(error = %e, n = records.len(), "the buffer refused these events for good: dropped");
                intake.health().dropped(records.len() as u64);
                return true;
            }
        }
    }
}

/// The tests crate's power-cut disk, Mosquitto and its ports, for the tests of both
/// MQTT sources: this crate cannot depend on that one.
#[cfg(test)]
#[path = "../../../tests/src/loop_disk.rs"]
mod loop_disk;
#[cfg(test)]
#[path = "../../../tests/src/mosquitto.rs"]
#[allow(dead_code, reason = "the tests crate's helper, of which these tests need a part")]
mod mosquitto;
#[cfg(test)]
#[path = "../../../tests/src/ports.rs"]
mod ports;
#[cfg(test)]
mod resend_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::buffer::MemoryBuffer;
    use crate::source::SourceHealth;

    fn rules() -> RuleSet {
        let config: RuleConfig = toml::from_str(
            "topic = \"readers/{r}/tags\"\nevent = \"rfid.tag.read\"\n\
             actor = { type = \"rfid_reader\", id = \"{r}\" }\ntimestamp = \"{/ts}\"",
        )
        .unwrap();
        RuleSet::compile(&[config], "rules").unwrap()
    }

    #[tokio::test]
    async fn a_batch_is_appended_before_it_may_be_acknowledged() {
        let buffer: Arc<dyn Buffer> = Arc::new(MemoryBuffer::new());
        let health = Arc::new(SourceHealth::new("t", "mqtt"));
        let intake = Intake::new(Arc::clone(&buffer), Arc::clone(&health), Duration::from_secs(30));
        let skewed = format!("{{\"ts\": {}}}", now_ms() - 3_600_000);
        let batch: Vec<(&str, &[u8])> = vec![
            ("readers/r1/tags", b"{}"),
            ("readers/r2/tags", b"{not json"),
            ("elsewhere", b"{}"),
            ("readers/r3/tags", skewed.as_bytes()),
        ];
        let mut backoff = Backoff::new(Duration::from_millis(1), Duration::from_millis(2));
        let shutdown = CancellationToken::new();
        assert!(process(&rules(), &intake, batch.clone(), &mut backoff, &shutdown).await);
        assert_eq!(buffer.stats().appended_total, 2);
        let json = health.to_json();
        assert_eq!(json["received_total"], 4, "{json}");
        assert_eq!(json["accepted_total"], 2, "{json}");
        assert_eq!(json["rejected"]["invalid_json"], 1, "{json}");
        assert_eq!(json["rejected"]["no_rule"], 1, "{json}");
        assert_eq!(json["clock_skew_total"], 1, "{json}");

        // A closed buffer: nothing appended, nothing may be acknowledged.
        buffer.close().await.unwrap();
        assert!(!process(&rules(), &intake, batch[..1].to_vec(), &mut backoff, &shutdown).await);
        assert_eq!(health.to_json()["accepted_total"], 2);
        // Only rejected messages: acknowledged without an append.
        assert!(process(&rules(), &intake, batch[1..3].to_vec(), &mut backoff, &shutdown).await);
    }

    #[test]
    fn broker_addresses() {
        assert_eq!(parse_broker("embedded"), Ok(Endpoint::Embedded));
        assert_eq!(
            parse_broker("mqtt://10.0.0.5"),
            Ok(Endpoint::Remote { host: "10.0.0.5".into(), port: 1883, tls: false })
        );
        assert_eq!(
            parse_broker("mqtts://broker.local:9883"),
            Ok(Endpoint::Remote { host: "broker.local".into(), port: 9883, tls: true })
        );
        assert_eq!(
            parse_broker("mqtt://[::1]:1884"),
            Ok(Endpoint::Remote { host: "::1".into(), port: 1884, tls: false })
        );
        assert_eq!(
            parse_broker("mqtts://[::1]"),
            Ok(Endpoint::Remote { host: "::1".into(), port: 8883, tls: true })
        );
        assert!(parse_broker("tcp://x:1").is_err());
        assert!(parse_broker("mqtt://:1").is_err());
        assert!(parse_broker("mqtt://x:port").is_err());
    }
}
