//! Device sources: everything that turns device messages into canonical
//! events in the buffer.
//!
//! One [`Source`] per configured device connection, one file per kind
//! (`source/mqtt.rs`, `serial.rs`, `modbus.rs`, `firmware.rs`), each with its
//! config beside it, collected in [`SourcesConfig`] (`[sources]` in the
//! TOML). A source maps each message with [`mapping`] rules, hands the
//! records to its [`Intake`] and acknowledges its device only once
//! [`Intake::append`] returned: then the events are durable in the buffer.
//! What every source counts is in [`health`], shown on `/health` and
//! `/metrics`.

pub mod firmware;
pub mod health;
pub mod mapping;
pub mod modbus;
pub mod mqtt;
pub mod serial;

use std::ops::RangeInclusive;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use opgraph_proto::Event;
use prost::Message;
use serde::Deserialize;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::buffer::{Buffer, BufferConfig};
use crate::error::Result;

pub use self::firmware::{FirmwareSource, FirmwareSourceConfig};
pub use self::health::{SourceHealth, SourceSet};
use self::mapping::{Mapped, Reject};
pub use self::modbus::{ModbusSource, ModbusSourceConfig};
pub use self::mqtt::broker::{EmbeddedBroker, MqttBrokerConfig};
pub use self::mqtt::ingest::{MqttIngestConfig, MqttIngestSource};
pub use self::mqtt::{MqttSource, MqttSourceConfig};
pub use self::serial::{SerialSource, SerialSourceConfig};

/// A device connection that produces events.
///
/// Acknowledgement: a source acknowledges its device (MQTT PUBACK, frame
/// ack) only after [`Intake::append`] returned `Ok`; messages it could not
/// map are counted as rejected and acknowledged too (they would never map).
/// Errors: a source reconnects by itself with capped exponential backoff;
/// `run` returns an error only for what retrying cannot fix. Shutdown: when
/// `shutdown` is cancelled the source finishes the append in progress,
/// acknowledges it, leaves everything else unacknowledged for the device to
/// send again, and returns.
#[async_trait]
pub trait Source: Send {
    /// The configured name (health, metrics and logs).
    fn name(&self) -> &str;
    /// `mqtt`, `serial`, ...
    fn kind(&self) -> &'static str;
    /// Runs until `shutdown` is cancelled.
    async fn run(self: Box<Self>, intake: Intake, shutdown: CancellationToken) -> Result<()>;
}

/// Every source of the gateway (`[sources]`).
#[derive(Debug, Clone, PartialEq, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct SourcesConfig {
    /// The embedded MQTT broker (`[sources.mqtt_broker]`); absent: none.
    pub mqtt_broker: Option<MqttBrokerConfig>,
    /// MQTT subscriptions (`[[sources.mqtt]]`), to an external broker or
    /// the embedded one.
    pub mqtt: Vec<MqttSourceConfig>,
    /// Modbus devices (`[[sources.modbus]]`), one table each.
    pub modbus: Vec<ModbusSourceConfig>,
    /// MQTT ingest endpoints (`[[sources.mqtt_ingest]]`): devices publish
    /// to the gateway itself and get their PUBACK after the durable append.
    pub mqtt_ingest: Vec<MqttIngestConfig>,
    /// Barcode scanners and RFID readers on serial ports
    /// (`[[sources.serial]]`), one table each.
    pub serial: Vec<SerialSourceConfig>,
    /// Microcontrollers speaking Opgraph's framed protocol on serial ports
    /// (`[[sources.firmware]]`, docs/firmware.md), one table each.
    pub firmware: Vec<FirmwareSourceConfig>,
}

impl SourcesConfig {
    /// Every problem, each with its key path below `sources.`.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if let Some(broker) = &self.mqtt_broker {
            problems.extend(broker.problems().into_iter().map(|p| format!("mqtt_broker.{p}")));
        }
        for (i, source) in self.mqtt.iter().enumerate() {
            problems.extend(source.problems().into_iter().map(|p| format!("mqtt[{i}].{p}")));
            if source.broker == mqtt::EMBEDDED && self.mqtt_broker.is_none() {
                problems.push(format!(
                    "mqtt[{i}].broker: \"embedded\" needs a [sources.mqtt_broker] table"
                ));
            }
        }
        for (i, source) in self.modbus.iter().enumerate() {
            problems.extend(source.problems().into_iter().map(|p| format!("modbus[{i}].{p}")));
        }
        for (i, source) in self.mqtt_ingest.iter().enumerate() {
            problems.extend(source.problems().into_iter().map(|p| format!("mqtt_ingest[{i}].{p}")));
        }
        for (i, source) in self.serial.iter().enumerate() {
            problems.extend(source.problems().into_iter().map(|p| format!("serial[{i}].{p}")));
        }
        for (i, source) in self.firmware.iter().enumerate() {
            problems.extend(source.problems().into_iter().map(|p| format!("firmware[{i}].{p}")));
        }
        // Health, metrics and logs key on names: unique across every kind.
        let mut seen = std::collections::HashSet::new();
        for (key, name) in self.names() {
            if !seen.insert(name) {
                problems.push(format!("{key}.name: {name:?} is used twice"));
            }
        }
        problems
    }

    /// Every source's key path and name, in config order.
    fn names(&self) -> Vec<(String, &str)> {
        let kinds: [(&str, Vec<&String>); 5] = [
            ("mqtt", self.mqtt.iter().map(|s| &s.name).collect()),
            ("modbus", self.modbus.iter().map(|s| &s.name).collect()),
            ("mqtt_ingest", self.mqtt_ingest.iter().map(|s| &s.name).collect()),
            ("serial", self.serial.iter().map(|s| &s.name).collect()),
            ("firmware", self.firmware.iter().map(|s| &s.name).collect()),
        ];
        let mut out = Vec::new();
        for (kind, names) in kinds {
            out.extend(
                names.into_iter().enumerate().map(|(i, n)| (format!("{kind}[{i}]"), n.as_str())),
            );
        }
        out
    }

    /// Reads the secrets named by `password_env`.
    pub fn apply_env(&mut self, env: &impl Fn(&str) -> Option<String>) {
        for source in &mut self.mqtt {
            if let Some(var) = &source.password_env
                && let Some(value) = env(var)
            {
                source.password = Some(crate::uplink::Secret(value));
            }
        }
    }
}

/// The built sources, ready to run.
pub struct Sources {
    pub broker: Option<EmbeddedBroker>,
    /// Ports the sources listen on, by name (`mqtt-<name>`), to announce.
    pub listening: Vec<(String, std::net::SocketAddr)>,
    pub sources: Vec<(Box<dyn Source>, Intake)>,
    pub health: Arc<SourceSet>,
}

impl Sources {
    /// Builds every source (reading certificates) and starts the embedded
    /// broker, which then accepts devices until the process ends. The
    /// buffer's directory (`state`) keeps what sources remember across
    /// restarts.
    pub fn build(
        config: &SourcesConfig,
        buffer: &Arc<dyn Buffer>,
        state: &BufferConfig,
    ) -> Result<Sources> {
        let broker = config.mqtt_broker.as_ref().map(EmbeddedBroker::start).transpose()?;
        let mut sources = Vec::new();
        let mut health = Vec::new();
        for (i, c) in config.mqtt.iter().enumerate() {
            let path = format!("sources.mqtt[{i}]");
            let source = MqttSource::build(c, broker.as_ref(), &path, Some(state))?;
            let h = Arc::new(SourceHealth::new(&c.name, "mqtt"));
            let intake = Intake::new(Arc::clone(buffer), Arc::clone(&h), c.max_clock_skew);
            health.push(h);
            sources.push((Box::new(source) as Box<dyn Source>, intake));
        }
        for (i, c) in config.modbus.iter().enumerate() {
            let source = ModbusSource::build(c, &format!("sources.modbus[{i}]"))?;
            let h = Arc::new(SourceHealth::new(&c.name, "modbus"));
            // Polled values carry no device time: nothing to correct.
            let intake = Intake::new(Arc::clone(buffer), Arc::clone(&h), Duration::MAX);
            health.push(h);
            sources.push((Box::new(source) as Box<dyn Source>, intake));
        }
        let mut listening = Vec::new();
        for (i, c) in config.mqtt_ingest.iter().enumerate() {
            let source =
                MqttIngestSource::build(c, &format!("sources.mqtt_ingest[{i}]"), Some(state))?;
            listening.push((format!("mqtt-{}", c.name), source.local_addr()));
            let h = Arc::new(SourceHealth::new(&c.name, "mqtt_ingest"));
            let intake = Intake::new(Arc::clone(buffer), Arc::clone(&h), c.max_clock_skew);
            health.push(h);
            sources.push((Box::new(source) as Box<dyn Source>, intake));
        }
        for c in &config.serial {
            let h = Arc::new(SourceHealth::new(&c.name, "serial"));
            let intake = Intake::new(Arc::clone(buffer), Arc::clone(&h), c.max_clock_skew);
            health.push(h);
            sources.push((Box::new(SerialSource::new(c)) as Box<dyn Source>, intake));
        }
        for c in &config.firmware {
            let h = Arc::new(SourceHealth::new(&c.name, "firmware"));
            let intake = Intake::new(Arc::clone(buffer), Arc::clone(&h), c.max_clock_skew);
            health.push(h);
            sources.push((Box::new(FirmwareSource::new(c)) as Box<dyn Source>, intake));
        }
        Ok(Sources { broker, listening, sources, health: Arc::new(SourceSet::new(health)) })
    }
}

/// Where a source puts its events: validation, clock correction, encoding
/// and the durable append, counted in the source's [`SourceHealth`].
#[derive(Clone)]
pub struct Intake {
    buffer: Arc<dyn Buffer>,
    health: Arc<SourceHealth>,
    max_clock_skew_ms: i64,
}

impl Intake {
    pub fn new(buffer: Arc<dyn Buffer>, health: Arc<SourceHealth>, max_skew: Duration) -> Self {
        let max_clock_skew_ms = i64::try_from(max_skew.as_millis()).unwrap_or(i64::MAX);
        Intake { buffer, health, max_clock_skew_ms }
    }

    /// The source's counters.
    pub fn health(&self) -> &Arc<SourceHealth> {
        &self.health
    }

    /// The buffer the events go to.
    pub fn buffer(&self) -> &Arc<dyn Buffer> {
        &self.buffer
    }

    /// Turns a mapped message received at `now_ms` into a buffer record,
    /// or counts (and logs) why it cannot be one.
    pub fn prepare(&self, mapped: Result<Mapped, Reject>, now_ms: i64) -> Option<Bytes> {
        let result = mapped.and_then(|m| encode(m, now_ms, self.max_clock_skew_ms));
        match result {
            Ok((record, skewed)) => {
                if skewed {
                    self.health.clock_skewed();
                }
                Some(record)
            }
            Err(reject) => {
                self.health.reject(reject.reason(), &reject, now_ms);
                None
            }
        }
    }

    /// Appends `records` durably (see [`Buffer::append`]) and counts them
    /// as accepted. Only after this returned `Ok` may the device be
    /// acknowledged.
    pub async fn append(&self, records: Vec<Bytes>) -> Result<RangeInclusive<u64>> {
        let n = records.len() as u64;
        let range = self.buffer.append(records).await?;
        self.health.accepted(n);
        Ok(range)
    }
}

/// Warns at startup about a port that takes input from anyone who reaches
/// it (`open`: no credential configured) when it is bound beyond loopback.
pub fn warn_if_open(addr: std::net::SocketAddr, open: bool, what: &str, credential: &str) {
    if open && !addr.ip().is_loopback() {
        tracing::warn!(%addr, "{what} takes input from anyone who can reach it: set {credential} or bind it to loopback");
    }
}

/// Ms since the Unix epoch, now.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// The event time of a message: the device's time when it is within
/// `max_skew_ms` of the receive time, else the receive time (`true`: the
/// device clock was off).
pub fn correct_clock(device_ms: i64, now_ms: i64, max_skew_ms: i64) -> (i64, bool) {
    if device_ms.saturating_sub(now_ms).saturating_abs() > max_skew_ms {
        (now_ms, true)
    } else {
        (device_ms, false)
    }
}

/// Validates and encodes; the flag says the clock was corrected. A
/// corrected event keeps the device's time in `device_timestamp_ms` and in
/// `context.deviceTimestamp` (with `context.clockSkewMs`), so that the
/// cloud's API shows it.
fn encode(mapped: Mapped, now_ms: i64, max_skew_ms: i64) -> Result<(Bytes, bool), Reject> {
    let Mapped { mut envelope, device_time_ms } = mapped;
    let mut skewed = false;
    if let Some(device) = device_time_ms {
        let (timestamp, corrected) = correct_clock(device, now_ms, max_skew_ms);
        envelope.insert("timestamp".to_owned(), Value::from(timestamp));
        if corrected {
            skewed = true;
            let context =
                envelope.entry("context").or_insert_with(|| Value::Object(serde_json::Map::new()));
            if let Value::Object(context) = context {
                context.insert("deviceTimestamp".to_owned(), Value::from(device));
                context
                    .insert("clockSkewMs".to_owned(), Value::from(device.saturating_sub(now_ms)));
            }
        }
    }
    let event = Event::from_value(Value::Object(envelope), now_ms)
        .and_then(|e| opgraph_proto::envelope::check_entity(&e).map(|()| e))
        .map_err(|e| Reject::InvalidEvent(e.to_string()))?;
    let id = opgraph_proto::ids::new_id_at("evt", now_ms);
    let mut message = event.to_pb(id, 0);
    message.received_at_ms = Some(now_ms);
    if skewed {
        message.device_timestamp_ms = device_time_ms;
    }
    Ok((Bytes::from(message.encode_to_vec()), skewed))
}

#[cfg(test)]
mod tests {
    use opgraph_proto::pb;

    use super::*;

    const NOW: i64 = 1_795_000_000_000;

    fn mapped(envelope: Value, device_time_ms: Option<i64>) -> Mapped {
        let Value::Object(envelope) = envelope else { unreachable!() };
        Mapped { envelope, device_time_ms }
    }

    #[test]
    fn clock_within_the_skew_is_kept_and_beyond_it_corrected() {
        assert_eq!(correct_clock(NOW - 4_000, NOW, 5_000), (NOW - 4_000, false));
        assert_eq!(correct_clock(NOW + 5_000, NOW, 5_000), (NOW + 5_000, false));
        assert_eq!(correct_clock(NOW + 5_001, NOW, 5_000), (NOW, true));
        assert_eq!(correct_clock(i64::MIN, NOW, 5_000), (NOW, true));
    }

    #[test]
    fn encoding_keeps_device_and_receive_time() {
        let m = mapped(serde_json::json!({"event": "a"}), Some(NOW - 1_000));
        let (record, skewed) = encode(m, NOW, 5_000).unwrap();
        assert!(!skewed);
        let pb = pb::Event::decode(record).unwrap();
        assert_eq!(pb.received_at_ms, Some(NOW));
        assert_eq!(pb.timestamp_ms, Some(NOW - 1_000));
        assert_eq!(pb.device_timestamp_ms, None);
        assert!(pb.id.starts_with("evt_"));

        let m = mapped(serde_json::json!({"event": "a"}), Some(NOW - 3_600_000));
        let (record, skewed) = encode(m, NOW, 5_000).unwrap();
        assert!(skewed);
        let pb = pb::Event::decode(record).unwrap();
        assert_eq!(pb.timestamp_ms, Some(NOW));
        assert_eq!(pb.device_timestamp_ms, Some(NOW - 3_600_000));
        let event = Event::from_pb(pb, NOW).unwrap();
        let context = event.context.unwrap();
        assert_eq!(context["deviceTimestamp"], NOW - 3_600_000);
        assert_eq!(context["clockSkewMs"], -3_600_000);
    }

    #[test]
    fn invalid_envelopes_are_rejected_with_the_field() {
        let m = mapped(serde_json::json!({"event": "a", "actor": {"type": "x"}}), None);
        let err = encode(m, NOW, 5_000).unwrap_err();
        assert_eq!(err.reason(), "invalid_event");
        assert!(err.to_string().contains("actor"), "{err}");
    }
}
