//! The embedded MQTT broker (rumqttd): devices connect to the gateway
//! itself; MQTT sources with `broker = "embedded"` subscribe to it over
//! loopback like to any other broker.
//!
//! rumqttd runs on its own threads and has no stop method: it lives until
//! the process ends. It keeps messages in memory only, so the PUBACK a
//! device gets from it means "in the broker", not "in the buffer": a
//! gateway crash loses what the broker held and the source had not yet
//! appended (at most its in-flight window). Devices that need the strict
//! guarantee publish to an external broker with persistence (see
//! docs/sources.md).

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener};
use std::time::Duration;

use bytesize::ByteSize;
use rand::Rng;
use serde::Deserialize;

use crate::error::{Error, Result};

/// `[sources.mqtt_broker]`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MqttBrokerConfig {
    /// Where devices connect (MQTT 3.1.1, plain TCP). Default
    /// `127.0.0.1:1883`; `0.0.0.0:1883` for devices on the network. Port 0
    /// picks a free port, printed as `listening mqtt=ADDR`.
    pub listen: SocketAddr,
    /// Most device connections at once. Default 1000.
    pub max_connections: usize,
    /// Largest PUBLISH accepted. Default `1MiB`.
    pub max_payload: ByteSize,
    /// QoS 1 messages in flight per connection. Default 100.
    pub max_inflight: usize,
    /// Memory rumqttd keeps the latest messages of each topic filter in,
    /// delivered or not: how far the gateway's own subscriber may fall
    /// behind (a slow disk, a full buffer that blocks) before the oldest
    /// are dropped unread, and what each filter holds for good once that
    /// much has passed through. A topic published with no subscription
    /// gets such a log too. Default `32MiB`; `1MiB` to `1GiB`.
    pub log_memory: ByteSize,
    /// Time a new connection has to send CONNECT. Default `5s`.
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// Device logins, user name to password. Empty (default): anonymous
    /// devices are accepted (a warning at startup when `listen` is beyond
    /// loopback). Keep the port on a trusted network either way: the
    /// embedded broker has no TLS yet.
    pub users: BTreeMap<String, String>,
}

impl Default for MqttBrokerConfig {
    fn default() -> Self {
        MqttBrokerConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 1883)),
            max_connections: 1000,
            max_payload: ByteSize::mib(1),
            max_inflight: 100,
            log_memory: ByteSize::mib(32),
            connect_timeout: Duration::from_secs(5),
            users: BTreeMap::new(),
        }
    }
}

impl MqttBrokerConfig {
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if !(1..=super::MAX_CONNECTIONS).contains(&self.max_connections) {
            problems.push(format!("max_connections: must be 1 to {}", super::MAX_CONNECTIONS));
        }
        if self.max_payload.as_u64() < 1024 || self.max_payload.as_u64() > 256 * 1024 * 1024 {
            problems.push("max_payload: must be 1KiB to 256MiB".to_owned());
        }
        if !(1..=u16::MAX as usize).contains(&self.max_inflight) {
            problems.push("max_inflight: must be 1 to 65535".to_owned());
        }
        if !(1 << 20..=1 << 30).contains(&self.log_memory.as_u64()) {
            problems.push("log_memory: must be 1MiB to 1GiB".to_owned());
        }
        if self.connect_timeout.is_zero() || self.connect_timeout > Duration::from_secs(60) {
            problems.push("connect_timeout: must be 1ms to 60s".to_owned());
        }
        problems
    }
}

/// The running broker.
#[derive(Debug, Clone)]
pub struct EmbeddedBroker {
    /// The address it listens on.
    pub addr: SocketAddr,
    /// The gateway's own login when devices must log in.
    pub internal_login: Option<(String, String)>,
}

/// Segments of each topic filter's log in rumqttd.
const LOG_SEGMENTS: usize = 4;

/// User name of the gateway's own subscriber.
const INTERNAL_USER: &str = "opgraph-gateway-internal";

impl EmbeddedBroker {
    /// Starts the broker on its own thread.
    ///
    /// rumqttd neither reports bind errors nor the port it bound, so the
    /// port is bound here first (and a free one picked for port 0), then
    /// released for rumqttd.
    pub fn start(config: &MqttBrokerConfig) -> Result<EmbeddedBroker> {
        let listen_error = |source| Error::Listen {
            key: "sources.mqtt_broker.listen",
            addr: config.listen,
            source,
        };
        let addr =
            TcpListener::bind(config.listen).and_then(|l| l.local_addr()).map_err(listen_error)?;
        let open = config.users.is_empty();
        crate::source::warn_if_open(addr, open, "sources.mqtt_broker", "its users");
        let internal_login = (!config.users.is_empty()).then(|| {
            let secret: [u8; 16] = rand::rng().random();
            (INTERNAL_USER.to_owned(), opgraph_proto::ids::hex(&secret))
        });
        let mut auth: HashMap<String, String> =
            config.users.iter().map(|(u, p)| (u.clone(), p.clone())).collect();
        if let Some((user, pass)) = &internal_login {
            auth.insert(user.clone(), pass.clone());
        }
        let max_payload = usize::try_from(config.max_payload.as_u64()).unwrap_or(usize::MAX);
        let log_memory = usize::try_from(config.log_memory.as_u64()).unwrap_or(usize::MAX);
        let connections = rumqttd::ConnectionSettings {
            connection_timeout_ms: u16::try_from(config.connect_timeout.as_millis())
                .unwrap_or(u16::MAX),
            max_payload_size: max_payload,
            max_inflight_count: config.max_inflight,
            auth: (!auth.is_empty()).then_some(auth),
            external_auth: None,
            dynamic_filters: true,
        };
        let server = rumqttd::ServerSettings {
            name: "opgraph-mqtt".to_owned(),
            listen: addr,
            tls: None,
            next_connection_delay_ms: 0,
            connections,
        };
        let router = rumqttd::RouterConfig {
            max_connections: config.max_connections.saturating_add(8),
            max_outgoing_packet_count: 1000,
            // A log drops whole segments, the oldest first: four of them
            // keep three quarters to all of `log_memory` (a segment passes
            // its size by at most one message).
            max_segment_size: log_memory / LOG_SEGMENTS,
            max_segment_count: LOG_SEGMENTS,
            custom_segment: None,
            initialized_filters: None,
            shared_subscriptions_strategy: Default::default(),
        };
        let broker_config = rumqttd::Config {
            id: 0,
            router,
            v4: Some(HashMap::from([("opgraph".to_owned(), server)])),
            ..Default::default()
        };
        let mut broker = rumqttd::Broker::new(broker_config);
        std::thread::Builder::new()
            .name("mqtt-broker".to_owned())
            .spawn(move || {
                if let Err(e) = broker.start() {
                    tracing::error!(error = %e, "embedded MQTT broker stopped");
                }
            })
            .map_err(listen_error)?;
        tracing::info!(%addr, "embedded MQTT broker started");
        Ok(EmbeddedBroker { addr, internal_login })
    }

    /// Where the gateway's own client connects.
    pub fn client_addr(&self) -> SocketAddr {
        let ip = match self.addr.ip() {
            ip if ip.is_unspecified() && ip.is_ipv4() => IpAddr::V4(Ipv4Addr::LOCALHOST),
            ip if ip.is_unspecified() => IpAddr::V6(std::net::Ipv6Addr::LOCALHOST),
            ip => ip,
        };
        SocketAddr::new(ip, self.addr.port())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_taken_port_is_an_error_naming_the_key() {
        let taken = TcpListener::bind("127.0.0.1:0").unwrap();
        let config =
            MqttBrokerConfig { listen: taken.local_addr().unwrap(), ..MqttBrokerConfig::default() };
        let err = EmbeddedBroker::start(&config).unwrap_err();
        assert!(err.to_string().starts_with("sources.mqtt_broker.listen"), "{err}");
    }

    #[test]
    fn defaults_are_valid_and_bad_values_named() {
        assert!(MqttBrokerConfig::default().problems().is_empty());
        let config = MqttBrokerConfig {
            max_connections: 0,
            max_inflight: 0,
            log_memory: ByteSize::gib(2),
            connect_timeout: Duration::ZERO,
            ..MqttBrokerConfig::default()
        };
        let keys: Vec<String> = config
            .problems()
            .iter()
            .map(|p| p.split(':').next().unwrap_or_default().to_owned())
            .collect();
        assert_eq!(keys, ["max_connections", "max_inflight", "log_memory", "connect_timeout"]);
        // rumqttd sets aside room for every connection at start.
        let huge = MqttBrokerConfig { max_connections: usize::MAX, ..MqttBrokerConfig::default() };
        assert_eq!(huge.problems(), ["max_connections: must be 1 to 100000"]);
    }
}
