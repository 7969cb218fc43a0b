//! Modbus source: polls one device (Modbus TCP, or RTU on a serial line)
//! with tokio-modbus and
//! turns each poll into one `sensor.reading` event whose object is the
//! device and whose properties are the named register values, with their
//! units under `units`.
//!
//! The register map is planned once into as few requests as possible
//! ([`plan`]: adjacent and overlapping entries of one table share a request,
//! within Modbus's per-request limits). Each source polls its own device in
//! its own task, every request bounded by `timeout`, so a slow or dead
//! device never stalls another. What goes wrong is counted per device under
//! the source's `rejected` reasons: `exception` (the device answered with a
//! Modbus exception; the other requests of the poll still count),
//! `timeout`, `io` (connection lost or refused, garbled reply: the source
//! reconnects with capped backoff), `crc` (an RTU reply with a wrong CRC,
//! seen by [`rtu::CrcTap`]; the poll ends as for `io`, counted once as
//! `crc`), `bad_value` (a value that is not a
//! number JSON can carry, or a reply too short for it). A reading the buffer cannot take is counted as
//! dropped: the next poll reads the device again.

pub mod rtu;
pub mod value;

use std::collections::HashMap;
use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use rand::SeedableRng;
use rand::rngs::StdRng;
use serde::Deserialize;
use serde_json::{Map, Value, json};
use tokio_modbus::Slave;
use tokio_modbus::client::{Client, Context, Reader};
use tokio_util::sync::CancellationToken;

use super::mapping::Mapped;
use super::serial::PortSettings;
use super::{Intake, Source, now_ms};
use crate::backoff::Backoff;
use crate::error::Result;
use value::{Order, ValueType};

/// Registers one read may ask for (Modbus: 125 for registers).
const MAX_REGISTERS: u16 = 125;
/// Coils or discrete inputs one read may ask for (Modbus: 2000).
const MAX_BITS: u16 = 2000;
/// Longest `poll_interval`: a device read less often than daily is better
/// served by a job than by a source.
const MAX_POLL_INTERVAL: Duration = Duration::from_secs(24 * 3600);
/// Longest `timeout`, as for the uplink's.
const MAX_TIMEOUT: Duration = Duration::from_secs(600);

/// One `[[sources.modbus]]` table: one device.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModbusSourceConfig {
    /// Name in health, metrics and logs. Required, unique.
    pub name: String,
    /// `host:port` of a Modbus TCP device. One of `tcp` and `rtu`.
    pub tcp: Option<String>,
    /// A Modbus RTU device on a serial line: `{ path, baud, data_bits,
    /// parity, stop_bits, flow_control }` as for `[[sources.serial]]`.
    pub rtu: Option<PortSettings>,
    /// Unit (slave) id. Default 1.
    #[serde(default = "default_unit")]
    pub unit: u8,
    /// Time between polls. Default `1s`; at most `24h`.
    #[serde(default = "default_poll", with = "humantime_serde")]
    pub poll_interval: Duration,
    /// Bound on connecting and on each request. Default `1s`; at most
    /// `10min`.
    #[serde(default = "default_timeout", with = "humantime_serde")]
    pub timeout: Duration,
    /// `every_poll` (default): every poll is an event with every value;
    /// `on_change`: only values that moved by at least their `deadband`
    /// since they were last reported, and no event when none did.
    #[serde(default)]
    pub report: Report,
    /// Event name. Default `sensor.reading`.
    #[serde(default = "default_event")]
    pub event: String,
    /// The event's object: this device.
    pub device: DeviceRef,
    /// The register map. At least one.
    pub registers: Vec<RegisterConfig>,
    /// Reconnect backoff. Defaults `200ms` .. `30s`; each above 0, at most
    /// `1h`.
    #[serde(default = "default_backoff_initial", with = "humantime_serde")]
    pub backoff_initial: Duration,
    #[serde(default = "default_backoff_max", with = "humantime_serde")]
    pub backoff_max: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Report {
    #[default]
    EveryPoll,
    OnChange,
}

/// `{type, id}` of the polled device.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceRef {
    #[serde(rename = "type")]
    pub kind: String,
    pub id: String,
}

/// The four Modbus tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Table {
    Coil,
    DiscreteInput,
    InputRegister,
    HoldingRegister,
}

impl Table {
    fn is_bits(self) -> bool {
        matches!(self, Table::Coil | Table::DiscreteInput)
    }

    fn max_count(self) -> u16 {
        if self.is_bits() { MAX_BITS } else { MAX_REGISTERS }
    }
}

/// One named value of the register map.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegisterConfig {
    /// Property name in the event.
    pub name: String,
    pub table: Table,
    /// Zero-based address (protocol address, not the 4xxxx notation).
    pub address: u16,
    /// Default `u16` for registers; coils and discrete inputs are `bool`.
    #[serde(rename = "type", default)]
    pub ty: Option<ValueType>,
    /// `ABCD` (default), `DCBA`, `BADC` or `CDAB`.
    #[serde(default)]
    pub order: Order,
    /// Registers of a `string`.
    #[serde(default)]
    pub length: u16,
    /// Reported value = raw × scale + offset (numbers only).
    #[serde(default = "one")]
    pub scale: f64,
    #[serde(default)]
    pub offset: f64,
    /// Unit, reported under `properties.units`.
    pub unit: Option<String>,
    /// Under `on_change`: smallest move that is reported. Default 0: any.
    #[serde(default)]
    pub deadband: f64,
}

impl RegisterConfig {
    fn value_type(&self) -> ValueType {
        match (self.ty, self.table.is_bits()) {
            (Some(ty), _) => ty,
            (None, true) => ValueType::Bool,
            (None, false) => ValueType::U16,
        }
    }

    fn span(&self) -> u16 {
        if self.table.is_bits() { 1 } else { self.value_type().registers(self.length) }
    }
}

fn default_unit() -> u8 {
    1
}
fn default_poll() -> Duration {
    Duration::from_secs(1)
}
fn default_timeout() -> Duration {
    Duration::from_secs(1)
}
fn default_event() -> String {
    "sensor.reading".to_owned()
}
fn default_backoff_initial() -> Duration {
    Duration::from_millis(200)
}
fn default_backoff_max() -> Duration {
    Duration::from_secs(30)
}
fn one() -> f64 {
    1.0
}

impl ModbusSourceConfig {
    /// Every problem, each with its key path below the table.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if self.name.trim().is_empty() {
            problems.push("name: required".to_owned());
        }
        match (&self.tcp, &self.rtu) {
            (Some(tcp), None) if tcp.parse::<SocketAddr>().is_err() => {
                problems.push(format!("tcp: {tcp:?} is not host:port with an IP address"));
            }
            (None, Some(rtu)) => {
                problems.extend(rtu.problems().into_iter().map(|p| format!("rtu.{p}")))
            }
            (Some(_), None) => {}
            _ => problems.push("tcp: give either tcp or rtu".to_owned()),
        }
        if self.poll_interval.is_zero() || self.poll_interval > MAX_POLL_INTERVAL {
            problems.push("poll_interval: must be more than 0 and at most 24h".to_owned());
        }
        if self.timeout.is_zero() || self.timeout > MAX_TIMEOUT {
            problems.push("timeout: must be more than 0 and at most 10min".to_owned());
        }
        problems.extend(crate::backoff::problems(self.backoff_initial, self.backoff_max));
        if self.registers.is_empty() {
            problems.push("registers: at least one is needed".to_owned());
        }
        for (i, r) in self.registers.iter().enumerate() {
            let at = format!("registers[{i}]");
            if r.name.trim().is_empty() || r.name == "units" {
                problems.push(format!("{at}.name: required, and not \"units\""));
            }
            if self.registers[..i].iter().any(|o| o.name == r.name) {
                problems.push(format!("{at}.name: {:?} is used twice", r.name));
            }
            let ty = r.value_type();
            if r.table.is_bits() && ty != ValueType::Bool {
                problems.push(format!("{at}.type: coils and discrete inputs are bool"));
            }
            if ty == ValueType::String && !(1..=MAX_REGISTERS).contains(&r.length) {
                problems
                    .push(format!("{at}.length: a string needs 1 to {MAX_REGISTERS} registers"));
            }
            if u32::from(r.address) + u32::from(r.span()) > 0x1_0000 {
                problems.push(format!("{at}.address: the value runs past address 65535"));
            }
            if !r.scale.is_finite()
                || !r.offset.is_finite()
                || r.deadband.is_nan()
                || r.deadband < 0.0
            {
                problems.push(format!("{at}: scale and offset must be finite, deadband >= 0"));
            }
        }
        problems
    }
}

/// One request of a poll: `count` items of `table` from `start`, and the
/// register map entries it answers.
#[derive(Debug, Clone, PartialEq)]
pub struct Read {
    pub table: Table,
    pub start: u16,
    pub count: u16,
    /// Indexes into the register map.
    pub members: Vec<usize>,
}

/// Groups the register map into requests: entries of one table whose spans
/// touch or overlap share a request, up to the table's per-request limit.
pub fn plan(registers: &[RegisterConfig]) -> Vec<Read> {
    let mut order: Vec<usize> = (0..registers.len()).collect();
    order.sort_by_key(|&i| (registers[i].table, registers[i].address));
    let mut reads: Vec<Read> = Vec::new();
    for i in order {
        let r = &registers[i];
        let end = u32::from(r.address) + u32::from(r.span());
        if let Some(last) = reads.last_mut()
            && last.table == r.table
            && r.address <= last.start.saturating_add(last.count)
        {
            let merged =
                end.max(u32::from(last.start) + u32::from(last.count)) - u32::from(last.start);
            if merged <= u32::from(r.table.max_count()) {
                last.count = u16::try_from(merged).unwrap_or(u16::MAX);
                last.members.push(i);
                continue;
            }
        }
        let count = u16::try_from(end - u32::from(r.address)).unwrap_or(u16::MAX);
        reads.push(Read { table: r.table, start: r.address, count, members: vec![i] });
    }
    reads
}

pub struct ModbusSource {
    config: ModbusSourceConfig,
    link: Link,
    reads: Vec<Read>,
    /// RTU replies with a wrong CRC so far (see [`rtu::CrcTap`]).
    crc_errors: Arc<AtomicU64>,
}

/// How the device is reached.
enum Link {
    Tcp(SocketAddr),
    Rtu(PortSettings),
}

impl fmt::Display for Link {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Link::Tcp(addr) => write!(f, "{addr}"),
            Link::Rtu(port) => write!(f, "{}", port.path.display()),
        }
    }
}

impl ModbusSource {
    /// `at` is the table's key path, for errors.
    pub fn build(config: &ModbusSourceConfig, at: &str) -> Result<ModbusSource> {
        let invalid = |p: String| crate::error::Error::InvalidConfig { problems: vec![p] };
        let link = match (&config.tcp, &config.rtu) {
            (Some(tcp), None) => Link::Tcp(
                tcp.parse().map_err(|_| invalid(format!("{at}.tcp: {tcp:?} is not host:port")))?,
            ),
            (None, Some(rtu)) => Link::Rtu(rtu.clone()),
            _ => return Err(invalid(format!("{at}.tcp: give either tcp or rtu"))),
        };
        Ok(ModbusSource {
            config: config.clone(),
            link,
            reads: plan(&config.registers),
            crc_errors: Arc::new(AtomicU64::new(0)),
        })
    }

    /// A client context for the device.
    async fn connect(&self) -> std::io::Result<Context> {
        let slave = Slave(self.config.unit);
        match &self.link {
            Link::Tcp(addr) => tokio_modbus::client::tcp::connect_slave(*addr, slave).await,
            Link::Rtu(port) => {
                let port = rtu::CrcTap::new(port.open()?, Arc::clone(&self.crc_errors));
                Ok(tokio_modbus::client::rtu::attach_slave(port, slave))
            }
        }
    }
}

/// Why a poll ended the connection.
enum PollError {
    Timeout,
    Io(String),
}

#[async_trait]
impl Source for ModbusSource {
    fn name(&self) -> &str {
        &self.config.name
    }

    fn kind(&self) -> &'static str {
        "modbus"
    }

    async fn run(self: Box<Self>, intake: Intake, shutdown: CancellationToken) -> Result<()> {
        let this = *self;
        let health = std::sync::Arc::clone(intake.health());
        let mut backoff = Backoff::new(this.config.backoff_initial, this.config.backoff_max);
        let mut rng = StdRng::from_os_rng();
        let mut reported = Reported::default();
        let mut connection: Option<Context> = None;
        // Polling does not wait for each reading to be durable (no device
        // waits for an acknowledgement): an appender task makes what queued
        // durable in one append while the next polls run.
        let (readings, queued) = tokio::sync::mpsc::channel(READINGS_QUEUED);
        let appender = tokio::spawn(append_readings(
            intake.clone(),
            queued,
            this.config.name.clone(),
            Arc::clone(&reported.forgotten),
        ));
        let mut ticker = tokio::time::interval(this.config.poll_interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            let ctx = match connection.as_mut() {
                Some(ctx) => ctx,
                None => {
                    let connect = tokio::time::timeout(this.config.timeout, this.connect());
                    let outcome = tokio::select! {
                        outcome = connect => outcome,
                        () = shutdown.cancelled() => break,
                    };
                    match outcome {
                        Ok(Ok(ctx)) => {
                            health.set_connected(true);
                            connection.insert(ctx)
                        }
                        failed => {
                            let why = match failed {
                                Ok(Err(e)) => e.to_string(),
                                _ => "connect timed out".to_owned(),
                            };
                            health.set_connected(false);
                            health.rejected("io");
                            health.set_error(format!("modbus {}: {why}", this.link));
                            tracing::warn!(source = %this.config.name, device = %this.link, error = %why, "modbus connect failed");
                            let delay = backoff.next_delay(&mut rng);
                            tokio::select! {
                                () = tokio::time::sleep(delay) => continue,
                                () = shutdown.cancelled() => break,
                            }
                        }
                    }
                }
            };
            tokio::select! {
                _ = ticker.tick() => {}
                () = shutdown.cancelled() => break,
            }
            let now = now_ms();
            let crc_before = this.crc_errors.load(Ordering::Relaxed);
            let polled = poll(ctx, &this, &intake).await;
            let crc = this.crc_errors.load(Ordering::Relaxed) - crc_before;
            for _ in 0..crc {
                health.rejected("crc");
            }
            let values = match polled {
                Ok(values) => values,
                Err(e) => {
                    // A wrong CRC is why the poll failed (tokio-modbus
                    // skipped the frame and timed out): counted as `crc`.
                    let (reason, why) = match e {
                        _ if crc > 0 => (None, "reply with a wrong CRC".to_owned()),
                        PollError::Timeout => (Some("timeout"), "request timed out".to_owned()),
                        PollError::Io(why) => (Some("io"), why),
                    };
                    if let Some(reason) = reason {
                        health.rejected(reason);
                    }
                    health.set_connected(false);
                    health.set_error(format!("modbus {}: {why}", this.link));
                    tracing::warn!(source = %this.config.name, device = %this.link, error = %why, "modbus poll failed; reconnecting");
                    connection = None;
                    continue;
                }
            };
            backoff.reset();
            health.received(now);
            let Some(envelope) = reading(&this.config, values, &mut reported) else { continue };
            let Some(record) = intake.prepare(Ok(Mapped { envelope, device_time_ms: None }), now)
            else {
                continue;
            };
            // Waits only when the appender is READINGS_QUEUED behind.
            if readings.send(record).await.is_err() {
                break;
            }
        }
        if let Some(mut ctx) = connection {
            let _ = tokio::time::timeout(this.config.timeout, ctx.disconnect()).await;
        }
        drop(readings);
        let _ = appender.await;
        health.set_connected(false);
        Ok(())
    }
}

/// Readings queued for the appender before polling waits for it.
const READINGS_QUEUED: usize = 1024;

/// Appends queued readings, everything queued at once, until the poller
/// stops. A reading the buffer refuses is counted as dropped, and
/// `forgotten` set: under `on_change` the next poll reports every value
/// again, since what the dropped readings reported never arrived.
async fn append_readings(
    intake: Intake,
    mut queued: tokio::sync::mpsc::Receiver<bytes::Bytes>,
    source: String,
    forgotten: Arc<AtomicBool>,
) {
    let mut batch = Vec::with_capacity(READINGS_QUEUED);
    while queued.recv_many(&mut batch, READINGS_QUEUED).await > 0 {
        let n = batch.len() as u64;
        if let Err(e) = intake.append(std::mem::take(&mut batch)).await {
            forgotten.store(true, Ordering::Relaxed);
            intake.health().dropped(n);
            tracing::warn!(%source, error = %e, readings = n, "modbus readings not buffered; the next polls read again");
        }
    }
}

/// What `on_change` last reported, per register.
#[derive(Default)]
struct Reported {
    values: HashMap<usize, Value>,
    /// Set by the appender when it dropped readings: what they reported
    /// must be reported again.
    forgotten: Arc<AtomicBool>,
}

/// One poll: every planned read, decoded. An exception answer skips that
/// read's values; a timeout or transport error ends the poll.
async fn poll(
    ctx: &mut Context,
    source: &ModbusSource,
    intake: &Intake,
) -> std::result::Result<Vec<(usize, Value)>, PollError> {
    let registers = &source.config.registers;
    let mut values = Vec::new();
    for read in &source.reads {
        let request = async {
            match read.table {
                Table::Coil => {
                    ctx.read_coils(read.start, read.count).await.map(|r| r.map(Items::Bits))
                }
                Table::DiscreteInput => ctx
                    .read_discrete_inputs(read.start, read.count)
                    .await
                    .map(|r| r.map(Items::Bits)),
                Table::InputRegister => ctx
                    .read_input_registers(read.start, read.count)
                    .await
                    .map(|r| r.map(Items::Words)),
                Table::HoldingRegister => ctx
                    .read_holding_registers(read.start, read.count)
                    .await
                    .map(|r| r.map(Items::Words)),
            }
        };
        let items = match tokio::time::timeout(source.config.timeout, request).await {
            Err(_) => return Err(PollError::Timeout),
            Ok(Err(e)) => return Err(PollError::Io(e.to_string())),
            Ok(Ok(Err(exception))) => {
                intake.health().rejected("exception");
                tracing::warn!(source = %source.config.name, start = read.start, count = read.count, %exception, "modbus exception");
                continue;
            }
            Ok(Ok(Ok(items))) => items,
        };
        for &i in &read.members {
            let r = &registers[i];
            let offset = usize::from(r.address - read.start);
            let decoded = match &items {
                Items::Bits(bits) => bits
                    .get(offset)
                    .map(|b| Value::from(*b))
                    .ok_or(value::DecodeError::Short { want: offset + 1, got: bits.len() }),
                Items::Words(words) => {
                    let ty = r.value_type();
                    value::decode(ty, r.order, r.length, words.get(offset..).unwrap_or(&[]))
                        .and_then(|v| value::scale(v, r.scale, r.offset))
                }
            };
            match decoded {
                Ok(v) => values.push((i, v)),
                Err(e) => {
                    intake.health().rejected("bad_value");
                    tracing::warn!(source = %source.config.name, register = %r.name, error = %e, "modbus value unusable");
                }
            }
        }
    }
    Ok(values)
}

enum Items {
    Bits(Vec<bool>),
    Words(Vec<u16>),
}

/// The event for one poll's values, or `None` when `on_change` finds
/// nothing worth reporting. Remembers what it reports in `reported`.
fn reading(
    config: &ModbusSourceConfig,
    values: Vec<(usize, Value)>,
    reported: &mut Reported,
) -> Option<Map<String, Value>> {
    if reported.forgotten.swap(false, Ordering::Relaxed) {
        reported.values.clear();
    }
    let mut properties = Map::new();
    let mut units = Map::new();
    for (i, v) in values {
        let r = &config.registers[i];
        if config.report == Report::OnChange && !moved(reported.values.get(&i), &v, r.deadband) {
            continue;
        }
        if let Some(unit) = &r.unit {
            units.insert(r.name.clone(), Value::from(unit.clone()));
        }
        properties.insert(r.name.clone(), v.clone());
        reported.values.insert(i, v);
    }
    if properties.is_empty() {
        return None;
    }
    if !units.is_empty() {
        properties.insert("units".to_owned(), Value::Object(units));
    }
    let envelope = json!({
        "event": config.event,
        "object": {"type": config.device.kind, "id": config.device.id},
        "properties": properties,
        "context": {"source": config.name},
    });
    match envelope {
        Value::Object(map) => Some(map),
        _ => None,
    }
}

/// Whether `now` differs from the last reported value by at least
/// `deadband` (numbers; 0: by anything), or at all (other values).
fn moved(last: Option<&Value>, now: &Value, deadband: f64) -> bool {
    match (last.and_then(Value::as_f64), now.as_f64()) {
        (Some(a), Some(b)) => super::mapping::throttle::moved_by_band(a, b, deadband),
        _ => last != Some(now),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reg(name: &str, table: Table, address: u16, ty: Option<ValueType>) -> RegisterConfig {
        RegisterConfig {
            name: name.to_owned(),
            table,
            address,
            ty,
            order: Order::Abcd,
            length: 4,
            scale: 1.0,
            offset: 0.0,
            unit: None,
            deadband: 0.0,
        }
    }

    #[test]
    fn adjacent_registers_share_a_request_per_table() {
        let map = vec![
            reg("b", Table::HoldingRegister, 2, Some(ValueType::F32)), // 2..4
            reg("a", Table::HoldingRegister, 0, Some(ValueType::U32)), // 0..2
            reg("far", Table::HoldingRegister, 10, None),              // gap: own request
            reg("s", Table::HoldingRegister, 11, Some(ValueType::String)), // 11..15, touches 10
            reg("in", Table::InputRegister, 0, None),
            reg("c1", Table::Coil, 5, None),
            reg("c2", Table::Coil, 6, None),
        ];
        let reads = plan(&map);
        let shape: Vec<(Table, u16, u16, Vec<usize>)> =
            reads.into_iter().map(|r| (r.table, r.start, r.count, r.members)).collect();
        assert_eq!(
            shape,
            vec![
                (Table::Coil, 5, 2, vec![5, 6]),
                (Table::InputRegister, 0, 1, vec![4]),
                (Table::HoldingRegister, 0, 4, vec![1, 0]),
                (Table::HoldingRegister, 10, 5, vec![2, 3]),
            ]
        );
    }

    #[test]
    fn requests_stay_within_the_protocol_limit() {
        let map: Vec<RegisterConfig> = (0..100)
            .map(|i| reg(&format!("r{i}"), Table::HoldingRegister, i * 2, Some(ValueType::U32)))
            .collect();
        let reads = plan(&map);
        assert!(reads.iter().all(|r| r.count <= MAX_REGISTERS), "{reads:?}");
        assert_eq!(reads.iter().map(|r| r.members.len()).sum::<usize>(), 100);
        assert_eq!(reads.len(), 2);
    }

    #[test]
    fn on_change_reports_only_moves_beyond_the_deadband() {
        let mut config: ModbusSourceConfig = toml::from_str(
            r#"
            name = "plc"
            tcp = "127.0.0.1:502"
            report = "on_change"
            device = { type = "plc", id = "press-4" }
            [[registers]]
            name = "temperature"
            table = "holding_register"
            address = 0
            deadband = 0.5
            unit = "C"
            [[registers]]
            name = "running"
            table = "coil"
            address = 0
            "#,
        )
        .unwrap();
        assert!(config.problems().is_empty(), "{:?}", config.problems());
        let mut seen = Reported::default();
        let first = reading(&config, vec![(0, json!(20.0)), (1, json!(true))], &mut seen).unwrap();
        assert_eq!(
            first["properties"],
            json!({"temperature": 20.0, "running": true, "units": {"temperature": "C"}})
        );
        assert_eq!(first["object"], json!({"type": "plc", "id": "press-4"}));
        assert!(reading(&config, vec![(0, json!(20.4)), (1, json!(true))], &mut seen).is_none());
        let moved = reading(&config, vec![(0, json!(20.6)), (1, json!(true))], &mut seen).unwrap();
        assert_eq!(
            moved["properties"],
            json!({"temperature": 20.6, "units": {"temperature": "C"}})
        );
        let flipped =
            reading(&config, vec![(0, json!(20.6)), (1, json!(false))], &mut seen).unwrap();
        assert_eq!(flipped["properties"], json!({"running": false}));

        assert!(super::moved(Some(&json!(0.2)), &json!(0.3), 0.1), "a step of a scale of 0.1");
        assert!(!super::moved(Some(&json!(0.2)), &json!(0.29), 0.1));
        // A move of exactly the deadband counts.
        let step = reading(&config, vec![(0, json!(21.1)), (1, json!(false))], &mut seen).unwrap();
        assert_eq!(step["properties"]["temperature"], 21.1);
        assert!(reading(&config, vec![(0, json!(21.1)), (1, json!(false))], &mut seen).is_none());

        // The appender dropped readings: everything is reported again.
        seen.forgotten.store(true, Ordering::Relaxed);
        let again = reading(&config, vec![(0, json!(21.1)), (1, json!(false))], &mut seen).unwrap();
        assert_eq!(again["properties"]["running"], false);
        assert!(reading(&config, vec![(0, json!(21.1)), (1, json!(false))], &mut seen).is_none());

        config.report = Report::EveryPoll;
        let again = reading(&config, vec![(0, json!(20.6))], &mut seen).unwrap();
        assert_eq!(again["properties"]["temperature"], 20.6);
    }

    /// A buffer that refuses readings makes the appender say they were
    /// forgotten.
    #[tokio::test]
    async fn readings_the_buffer_refuses_are_forgotten() {
        let buffer = Arc::new(crate::buffer::MemoryBuffer::new());
        crate::buffer::Buffer::close(&*buffer).await.unwrap();
        let health = Arc::new(crate::source::SourceHealth::new("plc", "modbus"));
        let intake = Intake::new(buffer, Arc::clone(&health), Duration::ZERO);
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let forgotten = Arc::new(AtomicBool::new(false));
        let appender =
            tokio::spawn(append_readings(intake, rx, "plc".into(), Arc::clone(&forgotten)));
        tx.send(bytes::Bytes::from_static(b"reading")).await.unwrap();
        drop(tx);
        appender.await.unwrap();
        assert!(forgotten.load(Ordering::Relaxed));
        assert_eq!(health.to_json()["dropped_total"], 1);
    }

    #[test]
    fn bad_register_maps_name_their_keys() {
        let config: ModbusSourceConfig = toml::from_str(
            r#"
            name = "plc"
            tcp = "plc.local"
            poll_interval = "0s"
            device = { type = "plc", id = "p" }
            [[registers]]
            name = "a"
            table = "holding_register"
            address = 65535
            type = "u32"
            [[registers]]
            name = "a"
            table = "coil"
            address = 0
            type = "f32"
            [[registers]]
            name = "s"
            table = "input_register"
            address = 0
            type = "string"
            "#,
        )
        .unwrap();
        let problems = config.problems();
        for key in [
            "tcp:",
            "poll_interval:",
            "registers[0].address:",
            "registers[1].name:",
            "registers[1].type:",
            "registers[2].length:",
        ] {
            assert!(problems.iter().any(|p| p.starts_with(key)), "{key} in {problems:?}");
        }
        let both: ModbusSourceConfig = toml::from_str(
            "name = \"x\"\ntcp = \"127.0.0.1:502\"\nrtu = { path = \"/dev/ttyS0\", stop_bits = 3 }\n\
             device = { type = \"plc\", id = \"p\" }\nregisters = []\n",
        )
        .unwrap();
        assert!(
            both.problems().iter().any(|p| p.starts_with("tcp: give either")),
            "{:?}",
            both.problems()
        );
        let mut rtu = both.clone();
        rtu.tcp = None;
        assert!(
            rtu.problems().iter().any(|p| p.starts_with("rtu.stop_bits:")),
            "{:?}",
            rtu.problems()
        );
        let unknown = toml::from_str::<ModbusSourceConfig>("name = \"x\"\nbaud = 9600\n");
        assert!(unknown.is_err());
    }
}
