//! MQTT intake benchmark (`cargo bench -p opgraph-tests --bench mqtt`).
//!
//! Real release binaries on loopback, started through the harness of
//! `tests/src`; build them first (a bench cannot run cargo itself):
//!
//! ```sh
//! cargo build --release -p opgraph-cloud -p opgraph-gateway -p opgraph-simulators --bins
//! OPGRAPH_LOG=error cargo bench -p opgraph-tests --bench mqtt
//! ```
//!
//! The load generator is `opgraph_simulators::fleet` (the core of
//! `opgraph-sim fleet`), in this process: one MQTT 3.1.1 connection per
//! simulated device, ~200-byte JSON readings with QoS 1, at most
//! `--inflight` unacknowledged per device. All devices connect first; the
//! clock starts when they begin publishing.
//!
//! **(1) Throughput**, with `--devices` (10 and 1000) devices publishing
//! `--messages` readings in all, as fast as acknowledged:
//!
//! - *relay* (the baseline): a real `mosquitto` on 127.0.0.1 (anonymous,
//!   no persistence, `max_inflight_messages` = `--inflight`) and one QoS 1
//!   subscriber to `fleet/+/readings` counting what arrives; messages/s
//!   until the subscriber has every message.
//! - *gateway*: the gateway's MQTT ingest endpoint
//!   (`[[sources.mqtt_ingest]]`, PUBACK after the durable append, `batch`
//!   fsync) mapping each reading to a `fleet.reading` event, shipping over
//!   gRPC to a cloud on its embedded store. Messages/s until the cloud has
//!   acknowledged (committed) every event (`uplink.last_acked_sequence` on
//!   the gateway's `/health`): end to end. Beside it: until a search could
//!   find them all (one event search, which waits for the cloud's search
//!   index to reach its commits), until the devices had every PUBACK
//!   (durable in the gateway's buffer), and the gateway's peak RSS
//!   (`VmHWM`).
//! - *CPU per message* of each server process (user + system time from
//!   `/proc`, µs): Mosquitto until the subscriber has everything; gateway
//!   and cloud from the first publish until searchable. It moves less
//!   than the rates do with the machine's neighbours, though not nothing
//!   (a crowded core runs slower): compare builds alternately, by both.
//!
//! Goal (issue 8): gateway end to end ≥ 1× the relay.
//!
//! **(2) Outage**: `--outage-devices` (100) devices publish
//! `--outage-rate` (500) messages/s in all for `--outage-seconds` + 10 s
//! to the gateway, whose uplink goes through `opgraph-sim proxy`; 3 s in,
//! the proxy partitions the link (`--partition-mode reset`: connections
//! are refused) for `--outage-seconds` (20). Reported: the backlog at the
//! heal, the time from the heal until the cloud acknowledged everything the
//! buffer held at the heal (catch-up), and after the run, from the cloud's
//! own API, every `fleet.reading` event counted by its message id: lost
//! (acknowledged to a device, not in the cloud) and duplicated (stored more
//! than once). Goals: 0 lost, 0 duplicated, caught up within 5 s.
//!
//! **(3) Subscriber**: 10 devices publish `--messages` readings to a real
//! Mosquitto (`max_inflight_messages` = `--inflight`); the gateway's MQTT
//! client source (`[[sources.mqtt]]`) subscribes and appends them to its
//! buffer. Messages/s until the gateway's health counts every one
//! accepted (durable), and the gateway's CPU per message, with
//! `recognise_resends = true` (the default: a barrier after each batch's
//! acks, the list of unacknowledged messages written around each append;
//! docs/sources.md "Sent again, stored once") beside `false` in the same
//! run, alternated: what recognising resends costs. Run only with
//! `--only=subscriber` (it found the source stopping for good at full
//! speed; BENCHMARKS.md, "MQTT intake").
//!
//! Options (after `--`): `--messages=N` (50000), `--devices=LIST` (10,1000),
//! `--inflight=N` (100), `--rounds=N` (1), `--outage-rate=N` (500),
//! `--outage-seconds=N` (20), `--outage-devices=N` (100),
//! `--only=throughput|outage|subscriber`, `--dir=PATH` (where data directories go;
//! the system temp directory by default, which must be a real disk),
//! `--uplink=TOML` (extra lines for the throughput gateway's `[uplink]`
//! table, e.g. `batch_max_events = 1000`), `--search-every=MS` (0: off;
//! during each gateway run, one event search every MS milliseconds, and a
//! line with their latencies: a search waits for the cloud's search index
//! to reach the events committed when it began), `--persistent` (devices
//! keep persistent sessions, which the endpoint journals, synced before
//! each append, for copies sent again: docs/sources.md; the relay's
//! devices too).
//! Recorded numbers: BENCHMARKS.md.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a broken bench should fail loudly

use opgraph_tests::bench::{cpu_seconds, rss_mb};
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use opgraph_simulators::fleet::{self, FleetConfig, FleetReport, Progress};
use opgraph_tests::edge::{CloudProc, Gateway, Transport, gateway_config};
use opgraph_tests::mosquitto::Mosquitto;
use opgraph_tests::{Process, TEST_BOOTSTRAP_KEY};
use serde_json::Value;

/// Bound on every wait for delivery.
const LIMIT: Duration = Duration::from_secs(300);
const EVENT: &str = "fleet.reading";
/// The outage starts this long after publishing began, and publishing
/// goes on this long after it ends.
const BEFORE_OUTAGE: Duration = Duration::from_secs(3);
const AFTER_OUTAGE: Duration = Duration::from_secs(7);
const GOAL_VS_RELAY: f64 = 1.0;
const GOAL_CATCH_UP: Duration = Duration::from_secs(5);

struct Options {
    messages: u64,
    devices: Vec<usize>,
    inflight: u16,
    rounds: usize,
    outage_rate: f64,
    outage_seconds: u64,
    outage_devices: usize,
    only: Option<String>,
    dir: Option<PathBuf>,
    /// Extra lines for the gateway's `[uplink]` table.
    uplink: String,
    /// Pause between event searches during a gateway run; zero: none.
    search_every: Duration,
    /// Devices with persistent sessions (the endpoint then journals what
    /// it acknowledged to them).
    persistent: bool,
}

impl Options {
    fn parse() -> Options {
        let mut o = Options {
            messages: 50_000,
            devices: vec![10, 1000],
            inflight: 100,
            rounds: 1,
            outage_rate: 500.0,
            outage_seconds: 20,
            outage_devices: 100,
            only: None,
            dir: None,
            uplink: String::new(),
            search_every: Duration::ZERO,
            persistent: false,
        };
        for arg in std::env::args().skip(1) {
            let (k, v) = arg.split_once('=').unwrap_or((arg.as_str(), ""));
            let num = |v: &str| v.parse::<u64>().unwrap_or_else(|_| panic!("{k}=N, not {v:?}"));
            match k {
                "--messages" => o.messages = num(v).max(1),
                "--devices" => o.devices = v.split(',').map(|d| num(d) as usize).collect(),
                "--inflight" => o.inflight = num(v).clamp(1, 65535) as u16,
                "--rounds" => o.rounds = num(v).clamp(1, 20) as usize,
                "--outage-rate" => o.outage_rate = num(v).max(1) as f64,
                "--outage-seconds" => o.outage_seconds = num(v),
                "--outage-devices" => o.outage_devices = num(v).max(1) as usize,
                "--only" => o.only = Some(v.to_owned()),
                "--dir" => o.dir = Some(PathBuf::from(v)),
                "--uplink" => o.uplink = v.to_owned(),
                "--search-every" => o.search_every = Duration::from_millis(num(v)),
                "--persistent" => o.persistent = true,
                "--bench" => {}
                other if !other.starts_with("--") => {} // a name filter: ignored
                other => panic!("unknown option {other} (see the header of benches/mqtt.rs)"),
            }
        }
        assert!(
            matches!(o.only.as_deref(), None | Some("throughput" | "outage" | "subscriber")),
            "--only must be `throughput`, `outage` or `subscriber`"
        );
        o
    }

    fn wants(&self, part: &str) -> bool {
        self.only.as_deref().is_none_or(|only| only == part)
    }

    fn temp_dir(&self) -> tempfile::TempDir {
        opgraph_tests::bench::temp_dir(self.dir.as_deref(), "opgraph-bench-mqtt-")
    }
}

fn split(addr: &str) -> (String, u16) {
    let (host, port) = addr.rsplit_once(':').unwrap();
    (host.to_owned(), port.parse().unwrap())
}

/// The gateway's ingest endpoint with the fleet's rule.
fn ingest_source() -> String {
    format!(
        "\n[[sources.mqtt_ingest]]\nname = \"fleet\"\nlisten = \"127.0.0.1:0\"\n\
         max_connections = 5000\nmax_clock_skew = \"1min\"\n{}",
        fleet::GATEWAY_RULE.replace("KIND", "mqtt_ingest")
    )
}

fn fleet_config(devices: usize, messages: u64, inflight: u16, prefix: &str) -> FleetConfig {
    FleetConfig {
        seed: 8,
        devices,
        rate: 0.0,
        duration: None,
        messages: Some(messages),
        inflight,
        timeout: Duration::from_secs(60),
        client_prefix: prefix.to_owned(),
        ..FleetConfig::default()
    }
}

/// Runs the fleet in the background; its progress, and its report when
/// joined.
fn spawn_fleet(
    config: FleetConfig,
    addr: &str,
) -> (Arc<Progress>, tokio::task::JoinHandle<FleetReport>) {
    let progress = Arc::new(Progress::default());
    let (host, port) = split(addr);
    let watch = Arc::clone(&progress);
    let task =
        tokio::spawn(async move { fleet::publish(&config, &host, port, watch).await.unwrap() });
    (progress, task)
}

/// Waits for the fleet to start publishing; when it did.
async fn started(progress: &Progress) -> Instant {
    let deadline = Instant::now() + LIMIT;
    loop {
        if let Some(at) = progress.started.get() {
            return *at;
        }
        assert!(Instant::now() < deadline, "the fleet never started");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

struct Relay {
    rate: f64,
    rss_mb: f64,
    /// Mosquitto's CPU per message, µs.
    cpu_us: f64,
}

/// Fleet → Mosquitto → one QoS 1 subscriber.
async fn relay(options: &Options, devices: usize) -> Relay {
    let tmp = options.temp_dir();
    let extra = format!("max_inflight_messages {}\n", options.inflight);
    let broker = Mosquitto::start(tmp.path(), &[], &extra, &[]).await.unwrap();
    let (host, port) = split(&broker.addr());
    let subscriber =
        fleet::subscribe(&host, port, options.inflight, Duration::from_secs(10)).await.unwrap();
    let config = FleetConfig {
        persistent: options.persistent,
        ..fleet_config(devices, options.messages, options.inflight, "relay")
    };
    let (progress, fleet) = spawn_fleet(config, &broker.addr());
    let cpu = || broker.pid().map_or(0.0, cpu_seconds);
    let start = started(&progress).await;
    let cpu_before = cpu();
    let deadline = start + LIMIT;
    while subscriber.received.load(Ordering::Relaxed) < options.messages {
        assert!(
            Instant::now() < deadline,
            "the relay delivered {} of {}",
            subscriber.received.load(Ordering::Relaxed),
            options.messages
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let last = subscriber.last.lock().unwrap().unwrap();
    let cpu_us = per_message_us(cpu() - cpu_before, options.messages);
    let report = fleet.await.unwrap();
    assert_eq!(report.acked, options.messages, "mosquitto acknowledged every message");
    let rss_mb = broker.pid().map_or(0.0, |pid| rss_mb(pid).1);
    Relay { rate: options.messages as f64 / (last - start).as_secs_f64(), rss_mb, cpu_us }
}

struct Intake {
    /// Messages/s until the cloud acknowledged every event.
    end_to_end: f64,
    /// Messages/s until a search could find every event: the cloud's
    /// search index follows its commits on a thread of its own, and a
    /// search waits for it to reach them.
    searchable: f64,
    /// Messages/s until the devices had every PUBACK.
    durable: f64,
    idle_mb: f64,
    peak_mb: f64,
    /// CPU per message, µs, from the first publish until searchable.
    gateway_cpu_us: f64,
    cloud_cpu_us: f64,
}

fn per_message_us(seconds: f64, messages: u64) -> f64 {
    seconds * 1e6 / messages as f64
}

/// Fleet → gateway ingest endpoint → buffer → gRPC → cloud.
async fn gateway(options: &Options, devices: usize) -> Intake {
    let tmp = options.temp_dir();
    let cloud = CloudProc::start(&tmp.path().join("cloud"), "127.0.0.1:0", "off").await;
    let gw_dir = tmp.path().join("gateway");
    std::fs::create_dir_all(&gw_dir).unwrap();
    let grpc = cloud.receiver(Transport::Grpc);
    let extra = format!("{}\n{}", options.uplink, ingest_source());
    let config = gateway_config(&gw_dir, Transport::Grpc, &grpc, &cloud.cert(), &extra);
    let gateway = Gateway::start(&config, TEST_BOOTSTRAP_KEY).await;
    let pid = gateway.process.child.id().unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await; // uplink connected, idle
    let (idle_mb, _) = rss_mb(pid);
    let endpoint = gateway.process.addrs["mqtt-fleet"].clone();
    let config = FleetConfig {
        persistent: options.persistent,
        ..fleet_config(devices, options.messages, options.inflight, "gw")
    };
    let cloud_pid = cloud.process.child.id().unwrap();
    let cpu = || (cpu_seconds(pid), cpu_seconds(cloud_pid));
    let (progress, fleet) = spawn_fleet(config, &endpoint);
    let start = started(&progress).await;
    let cpu_before = cpu();
    let client = reqwest::Client::new();
    let probe = (!options.search_every.is_zero()).then(|| {
        let took = Arc::new(std::sync::Mutex::new(Vec::new()));
        let every = options.search_every;
        let task = tokio::spawn(searches_under_load(cloud.url.clone(), every, Arc::clone(&took)));
        (task, took)
    });
    let deadline = start + LIMIT;
    loop {
        let health: Value = client
            .get(format!("{}/health", gateway.url))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if health["uplink"]["last_acked_sequence"].as_u64().unwrap_or(0) >= options.messages {
            break;
        }
        assert!(Instant::now() < deadline, "delivery did not finish: {health}");
        // Each look costs the gateway a little: 10 ms keeps it small.
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let end_to_end = options.messages as f64 / start.elapsed().as_secs_f64();
    if let Some((task, took)) = probe {
        task.abort();
        report_searches(&took.lock().unwrap());
    }
    let found = search(&client, &cloud.url).await;
    assert!(found["total"].as_u64().unwrap_or(0) > 0, "search found nothing: {found}");
    let searchable = options.messages as f64 / start.elapsed().as_secs_f64();
    let cpu_after = cpu();
    let gateway_cpu_us = per_message_us(cpu_after.0 - cpu_before.0, options.messages);
    let cloud_cpu_us = per_message_us(cpu_after.1 - cpu_before.1, options.messages);
    let report = fleet.await.unwrap();
    assert_eq!(report.acked, options.messages, "the gateway acknowledged every message");
    let durable = report.acked as f64 / report.ack_time.as_secs_f64();
    let (_, peak_mb) = rss_mb(pid);
    gateway.process.kill9().await.unwrap();
    cloud.process.terminate().await.unwrap();
    Intake { end_to_end, searchable, durable, idle_mb, peak_mb, gateway_cpu_us, cloud_cpu_us }
}

/// One event search for the benchmark's events; the answer.
async fn search(client: &reqwest::Client, cloud_url: &str) -> Value {
    client
        .post(format!("{cloud_url}/api/analytics/event-search"))
        .bearer_auth(TEST_BOOTSTRAP_KEY)
        .json(&serde_json::json!({"query": EVENT, "limit": 1}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// Searches every `every` until aborted, adding each latency to `took`.
async fn searches_under_load(
    cloud_url: String,
    every: Duration,
    took: Arc<std::sync::Mutex<Vec<Duration>>>,
) {
    let client = reqwest::Client::new();
    loop {
        let asked = Instant::now();
        search(&client, &cloud_url).await;
        took.lock().unwrap().push(asked.elapsed());
        tokio::time::sleep(every).await;
    }
}

fn report_searches(took: &[Duration]) {
    let mut took = took.to_vec();
    if took.is_empty() {
        println!("             searches during the run: none finished");
        return;
    }
    took.sort();
    let at = |q: f64| took[((took.len() - 1) as f64 * q).round() as usize].as_secs_f64() * 1e3;
    println!(
        "             searches during the run: {}, p50 {:.0} ms, p90 {:.0} ms, max {:.0} ms",
        took.len(),
        at(0.5),
        at(0.9),
        at(1.0)
    );
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n % 2 == 1 { values[n / 2] } else { (values[n / 2 - 1] + values[n / 2]) / 2.0 }
}

fn verdict(met: bool) -> &'static str {
    if met { "met" } else { "MISSED" }
}

async fn throughput(options: &Options) {
    println!(
        "\n(1) throughput: {} readings of ~200 B per run, QoS 1, {} in flight per device, as fast as acknowledged",
        options.messages, options.inflight
    );
    println!(
        "    devices  round  relay msg/s  gateway end-to-end msg/s  searchable msg/s  gateway durable-ack msg/s  vs relay  gateway RSS idle/peak MB  mosquitto peak MB  CPU us/msg mosquitto / gateway / cloud"
    );
    for &devices in &options.devices {
        let mut ratios = Vec::new();
        for round in 0..options.rounds {
            // Alternate the order, so neither side always runs on a
            // warmer (or more crowded) machine.
            let (r, g) = if round % 2 == 0 {
                let r = relay(options, devices).await;
                (r, gateway(options, devices).await)
            } else {
                let g = gateway(options, devices).await;
                (relay(options, devices).await, g)
            };
            let ratio = g.end_to_end / r.rate;
            ratios.push(ratio);
            println!(
                "    {devices:>7}  {:>5}  {:>11.0}  {:>24.0}  {:>16.0}  {:>25.0}  {ratio:>8.2}  {:>11.1} / {:<10.1}  {:>17.1}  {:>18.1} / {:.1} / {:.1}",
                round + 1,
                r.rate,
                g.end_to_end,
                g.searchable,
                g.durable,
                g.idle_mb,
                g.peak_mb,
                r.rss_mb,
                r.cpu_us,
                g.gateway_cpu_us,
                g.cloud_cpu_us,
            );
        }
        let m = median(&mut ratios);
        println!(
            "    {devices} devices: gateway end to end / relay = {m:.2} (median); goal >= {GOAL_VS_RELAY}: {}",
            verdict(m >= GOAL_VS_RELAY)
        );
    }
}

/// Fleet → Mosquitto → the gateway's MQTT client source → buffer: messages/s
/// until every message is accepted, and the gateway's CPU per message, µs.
async fn subscriber_run(options: &Options, recognise_resends: bool) -> (f64, f64) {
    const DEVICES: usize = 10;
    let tmp = options.temp_dir();
    let extra = format!("max_inflight_messages {}\n", options.inflight);
    let broker = Mosquitto::start(tmp.path(), &[], &extra, &[]).await.unwrap();
    let cloud = CloudProc::start(&tmp.path().join("cloud"), "127.0.0.1:0", "off").await;
    let gw_dir = tmp.path().join("gateway");
    std::fs::create_dir_all(&gw_dir).unwrap();
    let source = format!(
        "\n[[sources.mqtt]]\nname = \"fleet\"\nbroker = \"mqtt://{}\"\n\
         recognise_resends = {recognise_resends}\nmax_clock_skew = \"1min\"\n{}",
        broker.addr(),
        fleet::GATEWAY_RULE.replace("KIND", "mqtt")
    );
    let grpc = cloud.receiver(Transport::Grpc);
    let extra = format!("{}\n{source}", options.uplink);
    let config = gateway_config(&gw_dir, Transport::Grpc, &grpc, &cloud.cert(), &extra);
    let gateway = Gateway::start(&config, TEST_BOOTSTRAP_KEY).await;
    let pid = gateway.process.child.id().unwrap();
    let client = reqwest::Client::new();
    let deadline = Instant::now() + LIMIT;
    // Subscribed first: what is published before has no session to go to.
    while !health(&client, &gateway).await["sources"][0]["connected"].as_bool().unwrap_or(false) {
        assert!(Instant::now() < deadline, "the MQTT source never subscribed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let config = fleet_config(DEVICES, options.messages, options.inflight, "sub");
    let (progress, fleet) = spawn_fleet(config, &broker.addr());
    let start = started(&progress).await;
    let cpu_before = cpu_seconds(pid);
    loop {
        let health = health(&client, &gateway).await;
        if health["sources"][0]["accepted_total"].as_u64().unwrap_or(0) >= options.messages {
            break;
        }
        assert!(Instant::now() < deadline, "the source did not take every message: {health}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let rate = options.messages as f64 / start.elapsed().as_secs_f64();
    let cpu_us = per_message_us(cpu_seconds(pid) - cpu_before, options.messages);
    let report = fleet.await.unwrap();
    assert_eq!(report.acked, options.messages, "mosquitto acknowledged every message");
    gateway.process.kill9().await.unwrap();
    cloud.process.terminate().await.unwrap();
    (rate, cpu_us)
}

async fn subscriber(options: &Options) {
    println!(
        "\n(3) subscriber: {} readings from 10 devices through Mosquitto ({} in flight) to the gateway's MQTT client source, until accepted",
        options.messages, options.inflight
    );
    println!(
        "    round  resends recognised msg/s  not recognised msg/s  ratio  CPU us/msg on / off"
    );
    let mut ratios = Vec::new();
    for round in 0..options.rounds {
        let (on, off) = if round % 2 == 0 {
            let on = subscriber_run(options, true).await;
            (on, subscriber_run(options, false).await)
        } else {
            let off = subscriber_run(options, false).await;
            (subscriber_run(options, true).await, off)
        };
        let ratio = on.0 / off.0;
        ratios.push(ratio);
        println!(
            "    {:>5}  {:>24.0}  {:>20.0}  {ratio:>5.2}  {:>10.1} / {:.1}",
            round + 1,
            on.0,
            off.0,
            on.1,
            off.1
        );
    }
    println!("    recognised / not recognised = {:.2} (median)", median(&mut ratios));
}

/// Every stored `fleet.reading`, by message id: how many times each is
/// stored. Pages back through event time (the API lists newest first,
/// 1000 at most); events at a page's boundary millisecond are fetched
/// again and counted once by their event id.
async fn stored_by_message(cloud: &CloudProc) -> HashMap<String, u64> {
    let client = reqwest::Client::new();
    let mut seen: HashSet<String> = HashSet::new();
    let mut by_message: HashMap<String, u64> = HashMap::new();
    let mut to: Option<i64> = None;
    loop {
        let mut url = format!("{}/api/events?limit=1000&event={EVENT}", cloud.url);
        if let Some(to) = to {
            url.push_str(&format!("&to={to}"));
        }
        let body: Value = client
            .get(url)
            .bearer_auth(TEST_BOOTSTRAP_KEY)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let events = body["events"].as_array().unwrap();
        let mut new = 0;
        let mut oldest = i64::MAX;
        for e in events {
            oldest = oldest.min(e["timestamp"].as_i64().unwrap());
            if seen.insert(e["id"].as_str().unwrap().to_owned()) {
                new += 1;
                let message = e["properties"]["id"].as_str().unwrap().to_owned();
                *by_message.entry(message).or_default() += 1;
            }
        }
        if events.len() < 1000 || new == 0 {
            return by_message;
        }
        to = Some(oldest + 1);
    }
}

async fn health(client: &reqwest::Client, gateway: &Gateway) -> Value {
    client.get(format!("{}/health", gateway.url)).send().await.unwrap().json().await.unwrap()
}

async fn outage(options: &Options) {
    let outage = Duration::from_secs(options.outage_seconds);
    let flow = BEFORE_OUTAGE + outage + AFTER_OUTAGE;
    println!(
        "\n(2) outage: {} devices, {} msg/s in all for {} s; the gateway's uplink (through opgraph-sim proxy) down for {} s from {} s in",
        options.outage_devices,
        options.outage_rate,
        flow.as_secs(),
        outage.as_secs(),
        BEFORE_OUTAGE.as_secs()
    );
    let tmp = options.temp_dir();
    let cloud = CloudProc::start(&tmp.path().join("cloud"), "127.0.0.1:0", "off").await;
    let upstream = cloud.receiver(Transport::Grpc);
    let args = ["proxy", "--protocol", "tcp", "--upstream", &upstream, "--partition-mode", "reset"];
    let log = ("RUST_LOG", std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()));
    let proxy = Process::start("opgraph-sim", &args, &[log], &["proxy"]).await.unwrap();
    let gw_dir = tmp.path().join("gateway");
    std::fs::create_dir_all(&gw_dir).unwrap();
    let config = gateway_config(
        &gw_dir,
        Transport::Grpc,
        &proxy.addrs["proxy"],
        &cloud.cert(),
        &ingest_source(),
    );
    let gateway = Gateway::start(&config, TEST_BOOTSTRAP_KEY).await;
    let pid = gateway.process.child.id().unwrap();
    let client = reqwest::Client::new();
    let config = FleetConfig {
        rate: options.outage_rate,
        duration: Some(flow),
        messages: None,
        ..fleet_config(options.outage_devices, 0, options.inflight, "outage")
    };
    let (progress, fleet) = spawn_fleet(config, &gateway.process.addrs["mqtt-fleet"]);
    let start = started(&progress).await;

    tokio::time::sleep_until((start + BEFORE_OUTAGE).into()).await;
    proxy.signal("USR1").await.unwrap();
    let down = Instant::now();
    // Anything in flight when the link went down may still be acknowledged
    // in the first moments; what the cloud acknowledges later would mean
    // the link was not down.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let acked_after_cut =
        health(&client, &gateway).await["uplink"]["last_acked_sequence"].as_u64().unwrap_or(0);
    tokio::time::sleep_until((down + outage).into()).await;
    let h = health(&client, &gateway).await;
    let acked_at_heal = h["uplink"]["last_acked_sequence"].as_u64().unwrap_or(0);
    let held = h["buffer"]["next_seq"].as_u64().unwrap() - 1;
    proxy.signal("USR2").await.unwrap();
    let healed = Instant::now();
    let deadline = healed + LIMIT;
    let catch_up = loop {
        let acked =
            health(&client, &gateway).await["uplink"]["last_acked_sequence"].as_u64().unwrap_or(0);
        if acked >= held {
            break healed.elapsed();
        }
        assert!(Instant::now() < deadline, "no catch-up within {LIMIT:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let report = fleet.await.unwrap();
    // Everything accepted reaches the cloud before counting.
    let deadline = Instant::now() + LIMIT;
    loop {
        let h = health(&client, &gateway).await;
        let last = h["buffer"]["next_seq"].as_u64().unwrap() - 1;
        if h["uplink"]["last_acked_sequence"].as_u64().unwrap_or(0) >= last {
            break;
        }
        assert!(Instant::now() < deadline, "the gateway did not drain: {h}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (_, peak_mb) = rss_mb(pid);
    let stored = stored_by_message(&cloud).await;
    let mut lost = 0u64;
    let mut unacked_stored = 0u64;
    for (device, d) in &report.devices {
        // A device's PUBACKs come in order: its first `acked` messages.
        for seq in 0..d.published {
            let present = stored.contains_key(&format!("{device}-{seq}"));
            if seq < d.acked && !present {
                lost += 1;
            }
            if seq >= d.acked && present {
                unacked_stored += 1;
            }
        }
    }
    let duplicated: u64 = stored.values().map(|n| n - 1).sum();
    let stored_total: u64 = stored.values().sum();
    println!(
        "    published {}, acknowledged to devices {}, device reconnects {}; stored in the cloud {} ({} distinct)",
        report.published,
        report.acked,
        report.reconnects,
        stored_total,
        stored.len()
    );
    println!(
        "    cloud acknowledgements during the outage (after its first second): {}",
        acked_at_heal - acked_after_cut
    );
    println!(
        "    backlog at the heal: {} events; caught up {:.2} s after the heal; gateway peak RSS {peak_mb:.1} MB",
        held - acked_at_heal,
        catch_up.as_secs_f64()
    );
    println!(
        "    lost {lost}, duplicated {duplicated}, stored although never acknowledged {unacked_stored}"
    );
    println!(
        "    goals: 0 lost {}, 0 duplicated {}, caught up within {} s {}",
        verdict(lost == 0),
        verdict(duplicated == 0),
        GOAL_CATCH_UP.as_secs(),
        verdict(catch_up <= GOAL_CATCH_UP)
    );
    gateway.process.terminate().await.unwrap();
    proxy.terminate().await.unwrap();
    cloud.process.terminate().await.unwrap();
}

fn main() {
    let options = Options::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("bench")
        .enable_all()
        .build()
        .expect("runtime");
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    let binary = opgraph_tests::binary("opgraph-gateway").expect("release binaries");
    println!(
        "opgraph MQTT benchmark: {cpus} CPUs, binaries from {}, load generator in this process",
        binary.parent().unwrap().display()
    );
    runtime.block_on(async {
        if options.wants("throughput") {
            throughput(&options).await;
        }
        if options.wants("outage") {
            outage(&options).await;
        }
        // Only when asked for: not part of the issue-8 goal.
        if options.only.as_deref() == Some("subscriber") {
            subscriber(&options).await;
        }
    });
}
