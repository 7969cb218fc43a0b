//! Many devices at once, for load (`opgraph-sim fleet`, and the MQTT
//! benchmark in `tests/benches/mqtt.rs`).
//!
//! Each simulated device is its own MQTT 3.1.1 connection publishing
//! readings with QoS 1 on `fleet/<device>/readings` (devices `d00000`,
//! `d00001`, ...), about 200 bytes of JSON each:
//!
//! ```json
//! {"id":"d00042-17","seq":17,"ts":1795000000123,"values":{"temperature":21.37,
//!  "humidity":48.2,"pressure":1013.25,"battery":0.873,"rssi":-61},
//!  "status":"ok","model":"env-sensor-3","site":"plant-1","fw":"2.4.1"}
//! ```
//!
//! `seq` numbers a device's messages from 0 and `id` is `<device>-<seq>`:
//! the per-device counts of the summary name every message sent, so a
//! consumer can check exact delivery (nothing lost, nothing twice). The
//! values are a function of `--seed`, device and `seq`; `ts` is the send
//! time. All devices connect first; then the clock starts and they publish
//! at `rate` messages/s for the whole fleet (spread evenly over devices and
//! time) or, with rate 0, each as fast as its broker acknowledges (at most
//! `inflight` unacknowledged), until `duration` has passed or `messages`
//! were sent. [`publish`] waits for the outstanding acknowledgements and
//! returns exactly what was published and acknowledged, per device;
//! [`Progress`] shows it while it runs.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use rumqttc::{AsyncClient, Event, MqttOptions, Packet, QoS};
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::error::{Error, Result};
use crate::print;

/// The gateway's mapping rule for the fleet's readings, to follow a
/// `[[sources.mqtt]]` or `[[sources.mqtt_ingest]]` table (replace `KIND`).
pub const GATEWAY_RULE: &str = r#"
[[sources.KIND.rules]]
topic = "fleet/{device}/readings"
event = "fleet.reading"
actor = { type = "sensor", id = "{device}" }
properties = { id = "{/id}", seq = "{/seq}", values = "{/values}", status = "{/status}" }
timestamp = "{/ts}"
"#;

/// What to simulate.
#[derive(Debug, Clone, PartialEq)]
pub struct FleetConfig {
    pub seed: u64,
    pub devices: usize,
    /// Messages per second for the whole fleet; 0: each device as fast as
    /// acknowledged.
    pub rate: f64,
    /// Stop publishing after this long (from the first publish).
    pub duration: Option<Duration>,
    /// Stop after this many messages in all (shared evenly by devices).
    pub messages: Option<u64>,
    /// QoS 1 messages in flight per device at most.
    pub inflight: u16,
    /// Waiting for connections, and for acknowledgements after the last
    /// publish, at most this long each.
    pub timeout: Duration,
    /// Client ids are `<client_prefix>-<device>`.
    pub client_prefix: String,
    pub username: Option<String>,
    pub password: Option<String>,
    /// Persistent sessions (clean session off): what a device that wants
    /// its unacknowledged messages delivered after a reconnect asks for.
    pub persistent: bool,
}

impl Default for FleetConfig {
    fn default() -> Self {
        FleetConfig {
            seed: 1,
            devices: 10,
            rate: 100.0,
            duration: Some(Duration::from_secs(10)),
            messages: None,
            inflight: 100,
            timeout: Duration::from_secs(30),
            client_prefix: "opgraph-sim-fleet".to_owned(),
            username: None,
            password: None,
            persistent: false,
        }
    }
}

impl FleetConfig {
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if self.devices == 0 || self.devices > 100_000 {
            problems.push("devices: must be 1 to 100000".to_owned());
        }
        if !(self.rate.is_finite() && self.rate >= 0.0) {
            problems.push("rate: must be 0 or more".to_owned());
        }
        if self.duration.is_none() && self.messages.is_none() {
            problems.push("duration, messages: give at least one (the fleet must stop)".to_owned());
        }
        if self.inflight == 0 {
            problems.push("inflight: must be at least 1".to_owned());
        }
        if self.timeout.is_zero() {
            problems.push("timeout: must be more than 0".to_owned());
        }
        problems
    }

    /// Messages device `i` sends at most.
    fn share(&self, i: usize) -> u64 {
        match self.messages {
            None => u64::MAX,
            Some(total) => {
                let devices = self.devices as u64;
                total / devices + u64::from((i as u64) < total % devices)
            }
        }
    }
}

/// The name of device `i`.
pub fn device_name(i: usize) -> String {
    format!("d{i:05}")
}

/// The topic device `i` publishes on.
pub fn topic(i: usize) -> String {
    format!("fleet/{}/readings", device_name(i))
}

/// The reading `seq` of device `i`, sent at `ts_ms`; see the module docs.
pub fn payload(seed: u64, i: usize, seq: u64, ts_ms: i64) -> Vec<u8> {
    let r = splitmix64(seed ^ splitmix64((i as u64) << 32 ^ seq));
    let unit = |shift: u32| ((r >> shift) & 0xffff) as f64 / 65535.0;
    let mut out = String::with_capacity(220);
    let _ = write!(
        out,
        r#"{{"id":"{device}-{seq}","seq":{seq},"ts":{ts_ms},"values":{{"temperature":{:.2},"humidity":{:.1},"pressure":{:.2},"battery":{:.3},"rssi":{}}},"status":"{}","model":"env-sensor-3","site":"plant-1","fw":"2.4.1"}}"#,
        15.0 + 15.0 * unit(0),
        30.0 + 40.0 * unit(16),
        990.0 + 40.0 * unit(32),
        unit(48),
        -40 - (r % 50) as i64,
        if r.is_multiple_of(97) { "warn" } else { "ok" },
        device = device_name(i),
    );
    out.into_bytes()
}

/// A well-mixed 64-bit function of `x` (SplitMix64's finaliser).
fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Live counts while a fleet runs, for a watcher (a benchmark).
#[derive(Debug, Default)]
pub struct Progress {
    /// When every device was connected and publishing began.
    pub started: std::sync::OnceLock<std::time::Instant>,
    pub connected: AtomicU64,
    /// Messages handed to the MQTT clients.
    pub published: AtomicU64,
    /// PUBACKs received.
    pub acked: AtomicU64,
    /// Connection failures after the first connect.
    pub reconnects: AtomicU64,
}

/// What one device did.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct DeviceReport {
    /// Messages handed to its client: `seq` 0 to `published - 1`.
    pub published: u64,
    /// PUBACKs it received.
    pub acked: u64,
    pub reconnects: u64,
}

/// What the fleet did, exactly.
#[derive(Debug, Clone, PartialEq)]
pub struct FleetReport {
    pub seed: u64,
    /// By device name.
    pub devices: BTreeMap<String, DeviceReport>,
    pub published: u64,
    pub acked: u64,
    pub reconnects: u64,
    /// From the first connect to the last device connected.
    pub connect_time: Duration,
    /// From the start signal to the last publish.
    pub publish_time: Duration,
    /// From the start signal to the last acknowledgement.
    pub ack_time: Duration,
    /// Every message published was acknowledged in time.
    pub complete: bool,
}

impl FleetReport {
    /// One JSON object: totals, rates and the per-device counts.
    pub fn to_json(&self) -> Value {
        let per_device: serde_json::Map<String, Value> = self
            .devices
            .iter()
            .map(|(name, d)| (name.clone(), json!({"published": d.published, "acked": d.acked})))
            .collect();
        json!({
            "seed": self.seed,
            "devices": self.devices.len(),
            "published": self.published,
            "acked": self.acked,
            "reconnects": self.reconnects,
            "connect_ms": self.connect_time.as_millis() as u64,
            "publish_ms": self.publish_time.as_millis() as u64,
            "ack_ms": self.ack_time.as_millis() as u64,
            "acked_per_s": (self.acked as f64 / self.ack_time.as_secs_f64().max(1e-9)).round(),
            "complete": self.complete,
            "per_device": per_device,
        })
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Runs the fleet against the broker at `host:port`; see the module docs.
/// Fails only on a bad config or when not every device could connect
/// within `timeout`; an incomplete run is `complete: false`.
pub async fn publish(
    config: &FleetConfig,
    host: &str,
    port: u16,
    progress: Arc<Progress>,
) -> Result<FleetReport> {
    let problems = config.problems();
    if !problems.is_empty() {
        return Err(Error::InvalidConfig(problems));
    }
    let first_connect = Instant::now();
    let (start_tx, start_rx) = tokio::sync::watch::channel(None::<Instant>);
    let mut tasks = Vec::with_capacity(config.devices);
    for i in 0..config.devices {
        let mut options =
            MqttOptions::new(format!("{}-{}", config.client_prefix, device_name(i)), host, port);
        options
            .set_keep_alive(Duration::from_secs(30))
            .set_clean_session(!config.persistent)
            .set_inflight(config.inflight);
        if let Some(user) = &config.username {
            options.set_credentials(user.clone(), config.password.clone().unwrap_or_default());
        }
        let device = Device {
            i,
            seed: config.seed,
            share: config.share(i),
            rate: config.rate,
            devices: config.devices,
            duration: config.duration,
            inflight: config.inflight,
            timeout: config.timeout,
        };
        let (progress, start) = (Arc::clone(&progress), start_rx.clone());
        tasks.push(tokio::spawn(device.run(options, progress, start)));
    }
    // Everyone connected (or given up), then the clock starts.
    let connect_deadline = first_connect + config.timeout;
    while progress.connected.load(Ordering::Relaxed) < config.devices as u64 {
        if Instant::now() >= connect_deadline || tasks.iter().any(|t| t.is_finished()) {
            let connected = progress.connected.load(Ordering::Relaxed);
            tasks.iter().for_each(tokio::task::JoinHandle::abort);
            return Err(Error::Mqtt {
                broker: format!("{host}:{port}"),
                reason: format!(
                    "{connected} of {} devices connected within {:?}",
                    config.devices, config.timeout
                ),
            });
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let connect_time = first_connect.elapsed();
    let start = Instant::now();
    let _ = progress.started.set(start.into_std());
    let _ = start_tx.send(Some(start));
    let mut report = FleetReport {
        seed: config.seed,
        devices: BTreeMap::new(),
        published: 0,
        acked: 0,
        reconnects: 0,
        connect_time,
        publish_time: Duration::ZERO,
        ack_time: Duration::ZERO,
        complete: true,
    };
    for (i, task) in tasks.into_iter().enumerate() {
        let outcome = task.await.map_err(|e| Error::Mqtt {
            broker: format!("{host}:{port}"),
            reason: format!("device task failed: {e}"),
        })?;
        report.published += outcome.report.published;
        report.acked += outcome.report.acked;
        report.reconnects += outcome.report.reconnects;
        report.complete &= outcome.report.acked >= outcome.report.published;
        report.publish_time = report.publish_time.max(outcome.last_publish - start);
        report.ack_time = report.ack_time.max(outcome.last_ack.max(start) - start);
        report.devices.insert(device_name(i), outcome.report);
    }
    Ok(report)
}

/// One simulated device.
struct Device {
    i: usize,
    seed: u64,
    share: u64,
    rate: f64,
    devices: usize,
    duration: Option<Duration>,
    inflight: u16,
    timeout: Duration,
}

struct DeviceOutcome {
    report: DeviceReport,
    last_publish: Instant,
    last_ack: Instant,
}

impl Device {
    async fn run(
        self,
        options: MqttOptions,
        progress: Arc<Progress>,
        mut start: tokio::sync::watch::Receiver<Option<Instant>>,
    ) -> DeviceOutcome {
        let (client, mut eventloop) = AsyncClient::new(options, usize::from(self.inflight));
        let mut report = DeviceReport::default();
        // Connect (retrying) before the clock starts; the caller bounds it.
        loop {
            match eventloop.poll().await {
                Ok(Event::Incoming(Packet::ConnAck(_))) => break,
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!(device = self.i, error = %e, "fleet device cannot connect yet");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
        progress.connected.fetch_add(1, Ordering::Relaxed);
        // Keep the connection served while the others connect.
        let start = loop {
            tokio::select! {
                changed = start.changed() => {
                    if changed.is_err() {
                        return DeviceOutcome { report, last_publish: Instant::now(), last_ack: Instant::now() };
                    }
                    if let Some(at) = *start.borrow() { break at; }
                }
                polled = eventloop.poll() => {
                    if polled.is_err() {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                }
            }
        };
        // Shared by the two halves below, which run in this one task.
        let published = AtomicU64::new(0);
        let publishing = AtomicBool::new(true);
        let last_publish = std::sync::Mutex::new(start);
        let end = self.duration.map(|d| start + d);
        let publisher = async {
            // Device i's k-th message is due at (k * devices + i) / rate:
            // the fleet's messages spread evenly over time.
            let slot = |k: u64| {
                (self.rate > 0.0).then(|| {
                    let n = k as f64 * self.devices as f64 + self.i as f64;
                    start + Duration::from_secs_f64(n / self.rate)
                })
            };
            let mut seq = 0u64;
            while seq < self.share {
                let due = slot(seq).unwrap_or(start);
                if end.is_some_and(|end| due >= end || Instant::now() >= end) {
                    break;
                }
                tokio::time::sleep_until(due).await;
                let payload = payload(self.seed, self.i, seq, now_ms());
                if client.publish(topic(self.i), QoS::AtLeastOnce, false, payload).await.is_err() {
                    break;
                }
                seq += 1;
                published.store(seq, Ordering::Relaxed);
                *last_publish.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
                progress.published.fetch_add(1, Ordering::Relaxed);
            }
            publishing.store(false, Ordering::Relaxed);
        };
        let mut last_ack = start;
        let driver = async {
            let mut ack_deadline = None;
            loop {
                if !publishing.load(Ordering::Relaxed) {
                    if report.acked >= published.load(Ordering::Relaxed) {
                        break;
                    }
                    let deadline = *ack_deadline.get_or_insert(Instant::now() + self.timeout);
                    if Instant::now() >= deadline {
                        break;
                    }
                }
                // Bounded, so that the end of publishing is noticed.
                let polled =
                    tokio::time::timeout(Duration::from_millis(100), eventloop.poll()).await;
                match polled {
                    Err(_) => {}
                    Ok(Ok(Event::Incoming(Packet::PubAck(_)))) => {
                        if report.acked < published.load(Ordering::Relaxed) {
                            report.acked += 1;
                            progress.acked.fetch_add(1, Ordering::Relaxed);
                            last_ack = Instant::now();
                        }
                    }
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => {
                        report.reconnects += 1;
                        progress.reconnects.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(device = %device_name(self.i), error = %e, "fleet device lost its connection; reconnecting");
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                }
            }
        };
        // The publisher may wait on a full request channel that only the
        // driver empties: both run together; the driver ends last.
        tokio::join!(publisher, driver);
        report.published = published.load(Ordering::Relaxed);
        let _ = client.try_disconnect();
        let _ = tokio::time::timeout(Duration::from_secs(1), async {
            while let Ok(event) = eventloop.poll().await {
                if matches!(event, Event::Outgoing(rumqttc::Outgoing::Disconnect)) {
                    return;
                }
            }
        })
        .await;
        let last_publish = *last_publish.lock().unwrap_or_else(|e| e.into_inner());
        DeviceOutcome { report, last_publish, last_ack }
    }
}

/// A QoS 1 subscriber to every device's readings, counting what arrives:
/// the far end of a broker relay (the MQTT benchmark's baseline). Stops
/// when dropped.
pub struct Subscriber {
    /// Readings received.
    pub received: Arc<AtomicU64>,
    /// When the last one arrived.
    pub last: Arc<std::sync::Mutex<Option<std::time::Instant>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Subscriber {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Connects and subscribes to `fleet/+/readings` with QoS 1 (and
/// `inflight` unacknowledged messages at most), within `timeout`.
pub async fn subscribe(
    host: &str,
    port: u16,
    inflight: u16,
    timeout: Duration,
) -> Result<Subscriber> {
    let mut options = MqttOptions::new("opgraph-sim-fleet-subscriber", host, port);
    options.set_keep_alive(Duration::from_secs(30)).set_clean_session(true).set_inflight(inflight);
    options.set_max_packet_size(1 << 20, 1 << 20);
    let (client, mut eventloop) = AsyncClient::new(options, 10);
    let failed = |reason: String| Error::Mqtt { broker: format!("{host}:{port}"), reason };
    client
        .subscribe("fleet/+/readings", QoS::AtLeastOnce)
        .await
        .map_err(|e| failed(format!("subscribe: {e}")))?;
    let subscribed = tokio::time::timeout(timeout, async {
        loop {
            match eventloop.poll().await {
                Ok(Event::Incoming(Packet::SubAck(_))) => return Ok(()),
                Ok(_) => {}
                Err(e) => return Err(failed(format!("subscriber: {e}"))),
            }
        }
    })
    .await;
    subscribed.map_err(|_| failed(format!("no SUBACK within {timeout:?}")))??;
    let received = Arc::new(AtomicU64::new(0));
    let last = Arc::new(std::sync::Mutex::new(None));
    let task = {
        let (received, last) = (Arc::clone(&received), Arc::clone(&last));
        tokio::spawn(async move {
            let _client = client; // dropping it would end the event loop
            loop {
                match eventloop.poll().await {
                    Ok(Event::Incoming(Packet::Publish(_))) => {
                        received.fetch_add(1, Ordering::Relaxed);
                        *last.lock().unwrap_or_else(|e| e.into_inner()) =
                            Some(std::time::Instant::now());
                    }
                    Ok(_) => {}
                    Err(e) => {
                        tracing::warn!(error = %e, "fleet subscriber lost its connection");
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                }
            }
        })
    };
    Ok(Subscriber { received, last, task })
}

/// Simulate many MQTT devices at once, for load.
#[derive(Debug, Clone, clap::Args)]
pub struct FleetArgs {
    /// The MQTT broker or gateway ingest endpoint, HOST:PORT.
    #[arg(long, default_value = "127.0.0.1:1883")]
    pub broker: String,
    /// Login user name (every device uses it).
    #[arg(long)]
    pub username: Option<String>,
    /// Login password.
    #[arg(long, env = "OPGRAPH_SIM_MQTT_PASSWORD", hide_env_values = true)]
    pub password: Option<String>,
    /// Devices, one MQTT connection each (d00000, d00001, ...).
    #[arg(long, default_value_t = 10)]
    pub devices: usize,
    /// Messages per second for the whole fleet; 0: every device as fast as
    /// acknowledged.
    #[arg(long, default_value_t = 100.0)]
    pub rate: f64,
    /// Stop publishing after this long, e.g. 30s [default: 10s unless
    /// --messages is given].
    #[arg(long, value_parser = crate::parse_duration)]
    pub duration: Option<Duration>,
    /// Stop after this many messages in all.
    #[arg(long)]
    pub messages: Option<u64>,
    /// QoS 1 messages in flight per device at most.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u16).range(1..))]
    pub inflight: u16,
    /// Seed of the readings' values [default: random, printed in the summary].
    #[arg(long)]
    pub seed: Option<u64>,
    /// Wait this long at most for the connections, and for the
    /// acknowledgements after the last publish.
    #[arg(long, value_parser = crate::parse_duration, default_value = "30s")]
    pub timeout: Duration,
    /// Client ids are PREFIX-DEVICE [default: opgraph-sim-fleet-SEED].
    #[arg(long)]
    pub client_prefix: Option<String>,
    /// Persistent sessions (clean session off) instead of clean ones.
    #[arg(long)]
    pub persistent: bool,
}

impl FleetArgs {
    fn config(&self, seed: u64) -> FleetConfig {
        let duration = match (self.duration, self.messages) {
            (None, None) => Some(Duration::from_secs(10)),
            (duration, _) => duration,
        };
        FleetConfig {
            seed,
            devices: self.devices,
            rate: self.rate,
            duration,
            messages: self.messages,
            inflight: self.inflight,
            timeout: self.timeout,
            client_prefix: self
                .client_prefix
                .clone()
                .unwrap_or_else(|| format!("opgraph-sim-fleet-{seed}")),
            username: self.username.clone(),
            password: self.password.clone(),
            persistent: self.persistent,
        }
    }

    fn endpoint(&self) -> Result<(String, u16)> {
        crate::broker_endpoint(&self.broker)
    }
}

/// Runs the fleet and prints `summary {json}`; fails unless every message
/// published was acknowledged.
pub async fn run(args: FleetArgs) -> Result<FleetReport> {
    let seed = args.seed.unwrap_or_else(rand::random);
    let config = args.config(seed);
    let problems = config.problems();
    if !problems.is_empty() {
        return Err(Error::InvalidConfig(problems));
    }
    let (host, port) = args.endpoint()?;
    let report = publish(&config, &host, port, Arc::new(Progress::default())).await?;
    print(&format!("summary {}\n", report.to_json()))?;
    if !report.complete {
        return Err(Error::Mqtt {
            broker: args.broker,
            reason: format!(
                "{} of {} messages acknowledged within {:?} of the last publish",
                report.acked, report.published, config.timeout
            ),
        });
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        fleet: FleetArgs,
    }

    #[test]
    fn readings_are_seeded_json_of_about_200_bytes() {
        let a = payload(7, 42, 17, 1_795_000_000_123);
        assert_eq!(a, payload(7, 42, 17, 1_795_000_000_123));
        assert_ne!(a, payload(8, 42, 17, 1_795_000_000_123));
        assert!((180..=230).contains(&a.len()), "{} bytes", a.len());
        let v: Value = serde_json::from_slice(&a).unwrap();
        assert_eq!(v["id"], "d00042-17");
        assert_eq!((v["seq"].as_u64(), v["ts"].as_i64()), (Some(17), Some(1_795_000_000_123)));
        assert!(v["values"]["temperature"].as_f64().is_some_and(|t| (15.0..=30.0).contains(&t)));
        assert_eq!(topic(42), "fleet/d00042/readings");
    }

    #[test]
    fn messages_are_shared_evenly_and_the_command_line_is_checked() {
        let config = FleetConfig { devices: 3, messages: Some(10), ..Default::default() };
        assert_eq!((0..3).map(|i| config.share(i)).collect::<Vec<_>>(), [4, 3, 3]);
        let cli = Cli::try_parse_from([
            "fleet",
            "--devices",
            "1000",
            "--rate",
            "500",
            "--duration",
            "30s",
            "--broker",
            "127.0.0.1:1884",
        ])
        .unwrap();
        let config = cli.fleet.config(3);
        assert_eq!((config.devices, config.rate), (1000, 500.0));
        assert_eq!(config.duration, Some(Duration::from_secs(30)));
        assert_eq!(config.client_prefix, "opgraph-sim-fleet-3");
        assert_eq!(cli.fleet.endpoint().unwrap(), ("127.0.0.1".to_owned(), 1884));
        // Without a duration or a count, it stops after 10 s.
        let cli = Cli::try_parse_from(["fleet"]).unwrap();
        assert_eq!(cli.fleet.config(1).duration, Some(Duration::from_secs(10)));
        let cli = Cli::try_parse_from(["fleet", "--messages", "5"]).unwrap();
        assert_eq!(cli.fleet.config(1).duration, None);
        for bad in ["--devices=0", "--rate=-1"] {
            let cli = Cli::try_parse_from(["fleet", bad]).unwrap();
            assert!(!cli.fleet.config(1).problems().is_empty(), "{bad:?}");
        }
        assert!(Cli::try_parse_from(["fleet", "--inflight", "0"]).is_err());
        let cli = Cli::try_parse_from(["fleet", "--broker", "nowhere"]).unwrap();
        assert!(cli.fleet.endpoint().is_err());
    }
}
