//! Gateway → cloud delivery and gateway memory under load
//! (`cargo bench -p opgraph-tests --bench delivery`).
//!
//! Real release binaries on loopback, started through the harness of
//! `tests/src` (`opgraph-cloud` on its embedded store with both receivers,
//! `opgraph-gateway`, `opgraph-sim proxy`). Build them first; a bench cannot
//! run cargo itself (cargo holds the target directory's lock while the bench
//! runs):
//!
//! ```sh
//! cargo build --release -p opgraph-cloud -p opgraph-gateway -p opgraph-simulators --bins
//! OPGRAPH_LOG=error cargo bench -p opgraph-tests --bench delivery
//! ```
//!
//! (`OPGRAPH_LOG=error` keeps the warnings of the pre-fill gateway, which
//! cannot reach its cloud on purpose, out of the tables.)
//!
//! **(1) Sustained delivery, gRPC beside QUIC**, on two links: `loopback`
//! (gateway straight to the cloud) and `lossy` (through the flaky-link proxy
//! with 2 % loss each way and 25 ms one-way latency, a 50 ms round trip).
//! One run of one side:
//!
//! 1. a fresh cloud starts; a gateway whose uplink points nowhere takes
//!    `--events` events through its local ingest (bodies of 1000, the same
//!    bodies for every side) and is killed (SIGKILL; every accepted event
//!    was durable before its 202);
//! 2. a gateway on the same buffer starts with its uplink pointed at the
//!    cloud (or the proxy in front of it), and the clock runs from its start
//!    until its `/health` says `uplink.last_acked_sequence` reached the last
//!    event. *Whole run* is events/s over all of it, connect and handshake
//!    included; *sustained* counts from the moment the first tenth was
//!    acknowledged, without connecting and the transport's slow start.
//!    *CPU µs/ev* is the user + system time per event of the gateway (its
//!    whole life) and of the cloud (from the gateway's start), over the
//!    whole run: steadier than the rates on a shared machine.
//!
//!    Pre-filling rather than feeding while shipping keeps the load
//!    generator and the gateway's intake off the two cores while delivery
//!    is timed, and gives both transports the same backlog: the figure is
//!    what the uplink, receiver and store sustain, which is what a gateway
//!    catching up after an outage needs. (A partition that heals instead of
//!    a restart would mostly time how long QUIC takes to give up a
//!    handshake attempted during the partition.)
//!
//! **Kernel links (opt-in, root).** The proxy terminates TCP, so its
//! "lost" chunks never shrink the sending TCP's congestion window, while
//! QUIC's datagrams really are dropped. `--only=kernel` runs the same
//! impairment at the IP level instead: `opgraph-sim tunlink --loss 0.02
//! --latency 25ms` (a TUN device that drops or delays each IP packet and
//! hands it back to the kernel), so gateway and cloud talk over a real
//! kernel TCP or UDP path with a true 50 ms round trip. The bench re-runs
//! itself under `unshare -n` (a private network namespace: the host's
//! network is untouched; it brings `lo` up there and turns off the TCP
//! metrics cache, so a run does not inherit the previous run's ssthresh),
//! starts a fresh emulator per run, binds the cloud's receivers to
//! `10.77.0.1` and points the gateway at `10.77.1.1`. Two links:
//! `kernel-lossy`, with kernel TCP on Cubic (Linux's default, as quinn's),
//! and `kernel-lossy-bbr`, kernel TCP on BBR, which does not read random
//! loss as congestion; the congestion control is set on the emulated
//! route. Without root, `/dev/net/tun`, `unshare` or `ip` the bench prints
//! a `skipped` line instead.
//!
//! Two envelopes (`--envelope`): `scan`, the ~340-byte event of the cloud's
//! ingest benchmark, and `tick`, ~110 bytes, three times cheaper for the
//! store, so that the link rather than the store sets the pace.
//!
//! Baseline in the same run: `store`, the cloud's own batch ingest over
//! HTTP (`POST /api/ingest`, bodies of 1000, 4 connections) of the same
//! events into a fresh cloud: what the embedded store commits when fed
//! directly (the receivers decode protobuf instead of JSON, so they can
//! beat it by a little). Each round runs the three sides in a
//! rotated order; the verdict is the median of the per-round QUIC/gRPC
//! ratios on the lossy link. Goal (issue 3): ≥ 1.5.
//!
//! **(2) Gateway memory at 100k events/s.** A cloud with its receivers, a
//! gateway shipping to it directly (each transport in turn), and a load
//! generator posting bodies of 1000 events to the gateway's local ingest at
//! `--memory-rate` events/s (open loop: request `k` is due at
//! `k × 1000 / rate`; a late request goes at once) for `--memory-seconds`.
//! The cloud cannot take that rate, so the backlog grows on disk while the
//! gateway ships, as it would on site. `VmRSS` of the gateway is sampled
//! every 50 ms and `VmHWM` read at the end; the table shows the intake
//! achieved, what was delivered meanwhile and the peak. Goal: ≤ 64 MB.
//!
//! Options (flag after `--`, or environment variable):
//! `--events=N` / `OPGRAPH_BENCH_EVENTS` per loopback run (100000),
//! `--lossy-events=N` / `OPGRAPH_BENCH_LOSSY_EVENTS` per lossy or kernel run (100000),
//! `--rounds=N` / `OPGRAPH_BENCH_ROUNDS` (3),
//! `--memory-seconds=N` / `OPGRAPH_BENCH_MEMORY_SECONDS` (15),
//! `--memory-rate=N` / `OPGRAPH_BENCH_MEMORY_RATE` events/s (100000; 0: as
//! fast as the gateway takes them),
//! `--connections=N` / `OPGRAPH_BENCH_CONNECTIONS` load generator
//! connections for (2) (8),
//! `--envelope=scan|tick|both` / `OPGRAPH_BENCH_ENVELOPE` (both),
//! `--uplink=TOML` / `OPGRAPH_BENCH_UPLINK` extra lines for the gateway's
//! `[uplink]` table, e.g. `max_in_flight = 16` (none),
//! `--dir=PATH` / `OPGRAPH_BENCH_DIR` where data directories go (the system
//! temp directory; it must be a real disk: fsync on tmpfs costs nothing),
//! `--only=loopback|lossy|memory|kernel|kernel-lossy|kernel-lossy-bbr` /
//! `OPGRAPH_BENCH_ONLY` (without it: loopback, lossy and memory; the
//! kernel links only on request). `--lossy-events` counts for every
//! impaired link.
//! Recorded numbers and their discussion: BENCHMARKS.md.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a broken bench should fail loudly

use opgraph_tests::bench::{cpu_seconds, rss_mb};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use opgraph_tests::edge::{CloudProc, Gateway, Transport, gateway_config};
use opgraph_tests::{Process, TEST_BOOTSTRAP_KEY};
use serde_json::Value;

const BODY_EVENTS: usize = 1000;
/// Connections of the pre-fill and of the store baseline.
const FILL_CONNECTIONS: usize = 4;
/// Bound on one delivery run.
const DELIVERY_LIMIT: Duration = Duration::from_secs(600);
/// Bound on one request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// Where the uplink points while the buffer fills: nothing listens there.
const NOWHERE: &str = "127.0.0.1:9";
const GOAL_QUIC_OVER_GRPC: f64 = 1.5;
const GOAL_RSS_MB: f64 = 64.0;
/// Distinct bodies the memory phase cycles through.
const MEMORY_BODIES: usize = 32;

struct Options {
    events: usize,
    lossy_events: usize,
    rounds: usize,
    memory_seconds: u64,
    memory_rate: u64,
    connections: usize,
    uplink: String,
    envelopes: Vec<Envelope>,
    dir: Option<PathBuf>,
    only: Option<String>,
}

impl Options {
    fn parse() -> Options {
        const FLAGS: [&str; 10] = [
            "envelope",
            "events",
            "lossy-events",
            "rounds",
            "memory-seconds",
            "memory-rate",
            "connections",
            "uplink",
            "dir",
            "only",
        ];
        let args: Vec<String> = std::env::args().skip(1).collect();
        for arg in &args {
            let known = FLAGS.iter().any(|f| arg.starts_with(&format!("--{f}=")));
            // `cargo bench` passes `--bench`; a positional filter is ignored.
            if arg.starts_with("--") && arg != "--bench" && !known {
                panic!("unknown option {arg}; see the header of tests/benches/delivery.rs");
            }
        }
        let get = |flag: &str, env: &str| -> Option<String> {
            let prefix = format!("--{flag}=");
            args.iter()
                .find_map(|a| a.strip_prefix(&prefix).map(str::to_owned))
                .or_else(|| std::env::var(env).ok())
        };
        let num = |flag: &str, env: &str, default: u64| -> u64 {
            get(flag, env).map_or(default, |v| {
                v.parse().unwrap_or_else(|_| panic!("--{flag} / {env}: not a number: {v:?}"))
            })
        };
        let whole = |n: u64| (n.max(1) as usize).div_ceil(BODY_EVENTS) * BODY_EVENTS;
        let options = Options {
            events: whole(num("events", "OPGRAPH_BENCH_EVENTS", 100_000)),
            lossy_events: whole(num("lossy-events", "OPGRAPH_BENCH_LOSSY_EVENTS", 100_000)),
            rounds: num("rounds", "OPGRAPH_BENCH_ROUNDS", 3).clamp(1, 20) as usize,
            memory_seconds: num("memory-seconds", "OPGRAPH_BENCH_MEMORY_SECONDS", 15).max(1),
            memory_rate: num("memory-rate", "OPGRAPH_BENCH_MEMORY_RATE", 100_000),
            connections: num("connections", "OPGRAPH_BENCH_CONNECTIONS", 8).clamp(1, 256) as usize,
            uplink: get("uplink", "OPGRAPH_BENCH_UPLINK").unwrap_or_default(),
            envelopes: match get("envelope", "OPGRAPH_BENCH_ENVELOPE").as_deref() {
                None | Some("both") => vec![Envelope::Scan, Envelope::Tick],
                Some("scan") => vec![Envelope::Scan],
                Some("tick") => vec![Envelope::Tick],
                Some(other) => panic!("--envelope must be scan, tick or both, not {other:?}"),
            },
            dir: get("dir", "OPGRAPH_BENCH_DIR").map(PathBuf::from),
            only: get("only", "OPGRAPH_BENCH_ONLY"),
        };
        assert!(
            matches!(
                options.only.as_deref(),
                None | Some(
                    "loopback"
                        | "lossy"
                        | "memory"
                        | "kernel"
                        | "kernel-lossy"
                        | "kernel-lossy-bbr"
                )
            ),
            "--only must be `loopback`, `lossy`, `memory`, `kernel`, `kernel-lossy` or `kernel-lossy-bbr`"
        );
        options
    }

    fn wants(&self, part: &str) -> bool {
        self.only.as_deref().is_none_or(|only| only == part)
    }

    /// Whether to run `link`: the kernel links only on request (they need
    /// root), by part or by name.
    fn wants_link(&self, link: &Link) -> bool {
        match self.only.as_deref() {
            None => link.part != "kernel",
            Some(only) => only == link.part || only == link.name,
        }
    }

    fn temp_dir(&self) -> tempfile::TempDir {
        opgraph_tests::bench::temp_dir(self.dir.as_deref(), "opgraph-bench-")
    }
}

/// The link between gateway and cloud.
struct Link {
    name: &'static str,
    /// What `--only` names to run it (several links may share a part).
    part: &'static str,
    kind: LinkKind,
}

enum LinkKind {
    /// Straight on loopback.
    Direct,
    /// Through `opgraph-sim proxy` with these impairment arguments.
    Proxy(&'static [&'static str]),
    /// Through `opgraph-sim tunlink` with these impairment arguments, in
    /// the bench's private network namespace, kernel TCP using the
    /// congestion control `tcp` on the emulated route.
    Kernel { args: &'static [&'static str], tcp: &'static str },
}

impl Link {
    fn impaired(&self) -> bool {
        !matches!(self.kind, LinkKind::Direct)
    }

    fn describe(&self) -> String {
        match self.kind {
            LinkKind::Direct => "gateway straight to the cloud".to_owned(),
            LinkKind::Proxy(args) => format!("opgraph-sim proxy {}", args.join(" ")),
            LinkKind::Kernel { args, tcp } => format!(
                "opgraph-sim tunlink {}, a real IP path; kernel TCP congestion control {tcp}",
                args.join(" ")
            ),
        }
    }
}

/// Where the cloud's receivers listen for a kernel link, and what the
/// gateway dials instead (`opgraph-sim tunlink`'s defaults).
const TUN_LOCAL: &str = "10.77.0.1";
const TUN_REMOTE: &str = "10.77.1.1";
/// The /16 the device routes.
const TUN_SUBNET: &str = "10.77.0.0/16";
/// Set in the re-executed bench, inside its private network namespace.
const NETNS_MARK: &str = "OPGRAPH_BENCH_IN_NETNS";

const LOOPBACK: Link = Link { name: "loopback", part: "loopback", kind: LinkKind::Direct };
const LOSSY: Link = Link {
    name: "lossy",
    part: "lossy",
    kind: LinkKind::Proxy(&["--loss", "0.02", "--latency", "25ms"]),
};
/// The same impairment at the IP level; kernel TCP with Cubic, Linux's
/// default, as quinn's.
const KERNEL_LOSSY: Link = Link {
    name: "kernel-lossy",
    part: "kernel",
    kind: LinkKind::Kernel { args: &["--loss", "0.02", "--latency", "25ms"], tcp: "cubic" },
};
/// The same with BBR for kernel TCP, which does not read random loss as
/// congestion (this machine's default; quinn stays on Cubic).
const KERNEL_LOSSY_BBR: Link = Link {
    name: "kernel-lossy-bbr",
    part: "kernel",
    kind: LinkKind::Kernel { args: &["--loss", "0.02", "--latency", "25ms"], tcp: "bbr" },
};

/// What the events look like.
#[derive(Clone, Copy, PartialEq)]
enum Envelope {
    /// A scanner reading an item, with a trace id shared by four
    /// consecutive events, attribution and a few properties; about 340
    /// bytes of JSON, the envelope of the cloud's ingest benchmark.
    Scan,
    /// A sensor tick with one property, about 80 bytes: cheaper for the
    /// store to commit, so the link rather than the store sets the pace.
    Tick,
}

impl Envelope {
    fn name(self) -> &'static str {
        match self {
            Envelope::Scan => "scan",
            Envelope::Tick => "tick",
        }
    }
}

/// One body of `{"batch": [...]}` with envelopes `first ..`.
fn body(envelope: Envelope, first: u64) -> Vec<u8> {
    let now_ms = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis());
    let mut out = String::with_capacity(BODY_EVENTS * 360 + 16);
    out.push_str(r#"{"batch":["#);
    for n in first..first + BODY_EVENTS as u64 {
        if n > first {
            out.push(',');
        }
        if envelope == Envelope::Tick {
            let _ = write!(
                out,
                r#"{{"event":"sensor.tick","actor":{{"type":"sensor","id":"s-{:02}"}},"properties":{{"i":{n}}},"timestamp":{now_ms}}}"#,
                n % 97
            );
            continue;
        }
        let trace = splitmix64(n / 4);
        let _ = write!(
            out,
            r#"{{"event":"item.scanned","businessId":"default","actor":{{"type":"device","id":"scanner-{:02}"}},"object":{{"type":"sku","id":"SKU-{:06}"}},"traceId":"{:016x}{:016x}","source":{{"channel":"warehouse","campaign":"q4-restock"}},"trustTier":"T1","properties":{{"site":"DC-1","lane":{},"qty":{},"weightG":{}}},"timestamp":{}}}"#,
            n % 16,
            splitmix64(n) % 5000,
            trace,
            splitmix64(trace),
            n % 8,
            1 + n % 3,
            250 + n % 500,
            now_ms,
        );
    }
    out.push_str("]}");
    out.into_bytes()
}

/// A well-mixed 64-bit function of `x` (SplitMix64's finaliser).
fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn client() -> reqwest::Client {
    reqwest::Client::builder().tcp_nodelay(true).timeout(REQUEST_TIMEOUT).build().unwrap()
}

/// Posts one body; the number of events accepted.
async fn post(client: &reqwest::Client, url: &str, key: Option<&str>, body: &[u8]) -> u64 {
    let mut request = client
        .post(url)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(body.to_vec());
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    let response = request.send().await.unwrap_or_else(|e| panic!("POST {url}: {e}"));
    let status = response.status();
    let text = response.text().await.unwrap_or_default();
    assert!(status.is_success(), "POST {url}: {status}: {text}");
    let answer: Value = serde_json::from_str(&text).unwrap();
    answer["accepted"].as_u64().expect("an `accepted` count")
}

/// Posts every body once from [`FILL_CONNECTIONS`] connections, each taking
/// the next body as soon as its previous one is answered; events/s.
async fn post_all(url: &str, key: Option<&str>, bodies: &Arc<Vec<Vec<u8>>>) -> f64 {
    let client = client();
    let next = Arc::new(AtomicUsize::new(0));
    let accepted = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..FILL_CONNECTIONS {
        let (client, url, key) = (client.clone(), url.to_owned(), key.map(str::to_owned));
        let (bodies, next, accepted) = (bodies.clone(), next.clone(), accepted.clone());
        tasks.push(tokio::spawn(async move {
            while let Some(body) = bodies.get(next.fetch_add(1, Ordering::Relaxed)) {
                let n = post(&client, &url, key.as_deref(), body).await;
                accepted.fetch_add(n, Ordering::Relaxed);
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let events = (bodies.len() * BODY_EVENTS) as u64;
    assert_eq!(accepted.load(Ordering::Relaxed), events, "{url} accepted every event");
    events as f64 / start.elapsed().as_secs_f64()
}

async fn health(client: &reqwest::Client, gateway: &Gateway) -> Value {
    let response = client.get(format!("{}/health", gateway.url)).send().await.unwrap();
    response.json().await.unwrap()
}

fn pid(process: &Process) -> u32 {
    process.child.id().expect("running")
}

/// The cloud's batch ingest over HTTP into a fresh store; events/s.
async fn store_rate(dir: &Path, bodies: &Arc<Vec<Vec<u8>>>) -> f64 {
    let cloud = CloudProc::start(dir, "off", "off").await;
    let url = format!("{}/api/ingest", cloud.url);
    let rate = post_all(&url, Some(TEST_BOOTSTRAP_KEY), bodies).await;
    cloud.process.terminate().await.unwrap();
    rate
}

struct Delivery {
    fill: f64,
    /// Events over the whole run, from the gateway's start.
    whole: f64,
    /// Events/s after the first tenth was acknowledged: the sustained rate,
    /// without connecting and the transport's start-up.
    rate: f64,
    rss_peak_mb: f64,
    /// CPU per event over the whole run, µs.
    gateway_cpu_us: f64,
    cloud_cpu_us: f64,
    retried: f64,
    reconnects: f64,
    /// What the kernel link's emulator carried, as a table note.
    carried: Option<String>,
    /// What the QUIC uplink measured on its path, as a table note.
    path: Option<String>,
}

/// One delivery run; see the module docs.
async fn deliver(
    dir: &Path,
    transport: Transport,
    link: &Link,
    bodies: &Arc<Vec<Vec<u8>>>,
    uplink: &str,
    seed: u64,
) -> Delivery {
    let client = client();
    // A kernel link's device must be up before the cloud binds its address.
    let tunlink = match link.kind {
        LinkKind::Kernel { args, tcp } => Some(TunLinkProc::start(args, tcp, seed).await),
        _ => None,
    };
    let receivers = if tunlink.is_some() { format!("{TUN_LOCAL}:0") } else { "127.0.0.1:0".into() };
    let cloud = CloudProc::start(&dir.join("cloud"), &receivers, &receivers).await;
    let gw_dir = dir.join("gateway");
    std::fs::create_dir_all(&gw_dir).unwrap();

    let config = gateway_config(&gw_dir, transport, NOWHERE, &cloud.cert(), uplink);
    let filler = Gateway::start(&config, TEST_BOOTSTRAP_KEY).await;
    let fill = post_all(&format!("{}/ingest", filler.url), None, bodies).await;
    let last = health(&client, &filler).await["buffer"]["next_seq"].as_u64().unwrap() - 1;
    assert_eq!(last, (bodies.len() * BODY_EVENTS) as u64, "one sequence per event");
    filler.process.kill9().await.unwrap();

    let proxy = match link.kind {
        LinkKind::Direct | LinkKind::Kernel { .. } => None,
        LinkKind::Proxy(impairment) => {
            let protocol = if transport == Transport::Grpc { "tcp" } else { "udp" };
            let upstream = cloud.receiver(transport);
            let seed = seed.to_string();
            let mut args =
                vec!["proxy", "--protocol", protocol, "--upstream", &upstream, "--seed", &seed];
            args.extend_from_slice(impairment);
            // The proxy logs at info by default; its start and stop lines
            // would interleave with the table.
            let log = ("RUST_LOG", std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()));
            Some(Process::start("opgraph-sim", &args, &[log], &["proxy"]).await.unwrap())
        }
    };
    let endpoint = match &proxy {
        Some(proxy) => proxy.addrs["proxy"].clone(),
        // The same port, dialled at the fake remote end of the link.
        None if tunlink.is_some() => {
            let receiver = cloud.receiver(transport);
            let port = receiver.rsplit_once(':').map(|(_, port)| port).unwrap();
            format!("{TUN_REMOTE}:{port}")
        }
        None => cloud.receiver(transport),
    };
    let config = gateway_config(&gw_dir, transport, &endpoint, &cloud.cert(), uplink);
    let cloud_pid = pid(&cloud.process);
    let cloud_cpu_before = cpu_seconds(cloud_pid);
    let start = Instant::now();
    let gateway = Gateway::start(&config, TEST_BOOTSTRAP_KEY).await;
    let deadline = start + DELIVERY_LIMIT;
    let tenth = last / 10;
    let mut from_tenth = None;
    loop {
        let health = health(&client, &gateway).await;
        let acked = health["uplink"]["last_acked_sequence"].as_u64().unwrap_or(0);
        if acked >= last {
            break;
        }
        if acked >= tenth && from_tenth.is_none() {
            from_tenth = Some((Instant::now(), acked));
        }
        assert!(Instant::now() < deadline, "delivery did not finish: {health}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let whole = last as f64 / start.elapsed().as_secs_f64();
    let rate =
        from_tenth.map_or(whole, |(at, acked)| (last - acked) as f64 / at.elapsed().as_secs_f64());
    let (_, rss_peak_mb) = rss_mb(pid(&gateway.process));
    let per_event_us = |seconds: f64| seconds * 1e6 / last as f64;
    let gateway_cpu_us = per_event_us(cpu_seconds(pid(&gateway.process)));
    let cloud_cpu_us = per_event_us(cpu_seconds(cloud_pid) - cloud_cpu_before);
    let metric =
        async |name: &str| gateway.metric(&format!("opgraph_gateway_{name}")).await.unwrap_or(0.0);
    let retried = metric("batches_retried_total").await;
    let reconnects = metric("reconnects_total").await;
    let path = match transport {
        Transport::Grpc => None,
        Transport::Quic => Some(format!(
            "uplink: {:.0} of {:.0} packets lost, {:.0} congestion events, {:.0} of them read as noise, round trip {:.1} ms",
            metric("uplink_lost_packets_total").await,
            metric("uplink_sent_packets_total").await,
            metric("uplink_congestion_events_total").await,
            metric("uplink_noise_losses_total").await,
            metric("uplink_rtt_seconds").await * 1000.0,
        )),
    };
    gateway.process.terminate().await.unwrap();
    if let Some(proxy) = proxy {
        proxy.terminate().await.unwrap();
    }
    cloud.process.terminate().await.unwrap();
    let carried = match tunlink {
        Some(tunlink) => Some(tunlink.stop(last).await),
        None => None,
    };
    Delivery {
        fill,
        whole,
        rate,
        rss_peak_mb,
        gateway_cpu_us,
        cloud_cpu_us,
        retried,
        reconnects,
        carried,
        path,
    }
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n % 2 == 1 { values[n / 2] } else { (values[n / 2 - 1] + values[n / 2]) / 2.0 }
}

fn verdict(met: bool) -> &'static str {
    if met { "met" } else { "MISSED" }
}

#[derive(Clone, Copy, PartialEq)]
enum Side {
    Store,
    Grpc,
    Quic,
}

async fn delivery_benchmark(options: &Options, link: &Link, envelope: Envelope) {
    let events = if link.impaired() { options.lossy_events } else { options.events };
    let bodies: Arc<Vec<Vec<u8>>> = Arc::new(
        (0..events / BODY_EVENTS).map(|b| body(envelope, (b * BODY_EVENTS) as u64)).collect(),
    );
    let size = bodies.iter().map(Vec::len).sum::<usize>() as f64 / events as f64;
    println!(
        "\n(1) delivery on link `{}` ({}): {events} `{}` events of {size:.0} B of JSON, pre-filled",
        link.name,
        link.describe(),
        envelope.name()
    );
    if !options.uplink.is_empty() {
        println!("    gateway [uplink] extra: {}", options.uplink.replace('\n', "; "));
    }
    println!(
        "    round  side    fill ev/s  whole run ev/s  sustained ev/s  vs store  gateway peak RSS MB  batches retried  reconnects  CPU us/ev gateway / cloud"
    );
    let (mut store, mut grpc, mut quic, mut ratios) = (vec![], vec![], vec![], vec![]);
    for round in 0..options.rounds {
        let tmp = options.temp_dir();
        let mut order = [Side::Store, Side::Grpc, Side::Quic];
        order.rotate_left(round % 3);
        let mut results = [0.0f64; 3];
        let mut lines = Vec::new();
        for side in order {
            let seed = 1000 + round as u64;
            match side {
                Side::Store => {
                    let rate = store_rate(&tmp.path().join("store"), &bodies).await;
                    results[0] = rate;
                    store.push(rate);
                }
                Side::Grpc | Side::Quic => {
                    let transport =
                        if side == Side::Grpc { Transport::Grpc } else { Transport::Quic };
                    let dir = tmp.path().join(transport.name());
                    let d = deliver(&dir, transport, link, &bodies, &options.uplink, seed).await;
                    let i = if side == Side::Grpc { 1 } else { 2 };
                    results[i] = d.rate;
                    lines.push((i, d));
                }
            }
        }
        println!(
            "    {:>5}  store   {:>9}  {:>14}  {:>14.0}  {:>8.2}  {:>19}  {:>15}  {:>10}",
            round + 1,
            "-",
            "-",
            results[0],
            1.0,
            "-",
            "-",
            "-"
        );
        lines.sort_by_key(|(i, _)| *i);
        for (i, d) in lines {
            println!(
                "    {:>5}  {:<6}  {:>9.0}  {:>14.0}  {:>14.0}  {:>8.2}  {:>19.1}  {:>15.0}  {:>10.0}  {:>17.1} / {:.1}",
                round + 1,
                if i == 1 { "grpc" } else { "quic" },
                d.fill,
                d.whole,
                d.rate,
                d.rate / results[0],
                d.rss_peak_mb,
                d.retried,
                d.reconnects,
                d.gateway_cpu_us,
                d.cloud_cpu_us,
            );
            for note in [&d.path, &d.carried].into_iter().flatten() {
                println!("    {:>5}  {:<6}  {note}", round + 1, "");
            }
        }
        grpc.push(results[1]);
        quic.push(results[2]);
        ratios.push(results[2] / results[1]);
        println!("    {:>5}  quic/grpc {:.2}", round + 1, results[2] / results[1]);
    }
    let (s, g, q, r) =
        (median(&mut store), median(&mut grpc), median(&mut quic), median(&mut ratios));
    println!(
        "    median: store {s:.0} ev/s; grpc {g:.0} ev/s ({:.2}x store); quic {q:.0} ev/s ({:.2}x store); quic/grpc {r:.2} (median of rounds){}",
        g / s,
        q / s,
        if link.impaired() {
            format!("   goal >= {GOAL_QUIC_OVER_GRPC}: {}", verdict(r >= GOAL_QUIC_OVER_GRPC))
        } else {
            String::new()
        }
    );
}

/// What the memory phase saw.
struct MemoryRun {
    idle_mb: f64,
    peak_mb: f64,
    intake: f64,
    delivered: f64,
    late: u64,
}

/// Posts `bodies` in turn to `url` at `rate` events/s (0: as fast as
/// answered) from `connections` connections for `seconds`; counts accepted
/// events into `accepted` and requests that went out late into `late`.
async fn post_paced(
    url: String,
    bodies: Arc<Vec<Vec<u8>>>,
    rate: u64,
    connections: usize,
    seconds: u64,
    accepted: Arc<AtomicU64>,
    late: Arc<AtomicU64>,
) {
    let client = client();
    let start = tokio::time::Instant::now();
    let end = start + Duration::from_secs(seconds);
    let period = (rate > 0).then(|| Duration::from_secs_f64(BODY_EVENTS as f64 / rate as f64));
    let mut tasks = Vec::new();
    for c in 0..connections {
        let (client, url, bodies) = (client.clone(), url.clone(), bodies.clone());
        let (accepted, late) = (accepted.clone(), late.clone());
        tasks.push(tokio::spawn(async move {
            for k in 0u64.. {
                let slot = k * connections as u64 + c as u64;
                let due = period.map_or(start, |p| start + p.mul_f64(slot as f64));
                let now = tokio::time::Instant::now();
                if now >= end || due >= end {
                    break;
                }
                if due > now {
                    tokio::time::sleep_until(due).await;
                } else if period.is_some() && now - due > Duration::from_millis(10) {
                    late.fetch_add(1, Ordering::Relaxed);
                }
                let body = &bodies[slot as usize % bodies.len()];
                let n = post(&client, &url, None, body).await;
                accepted.fetch_add(n, Ordering::Relaxed);
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
}

async fn memory_run(
    options: &Options,
    transport: Transport,
    bodies: &Arc<Vec<Vec<u8>>>,
    trace: bool,
) -> MemoryRun {
    let tmp = options.temp_dir();
    let client = client();
    let cloud = CloudProc::start(&tmp.path().join("cloud"), "127.0.0.1:0", "127.0.0.1:0").await;
    let gw_dir = tmp.path().join("gateway");
    std::fs::create_dir_all(&gw_dir).unwrap();
    let config = gateway_config(
        &gw_dir,
        transport,
        &cloud.receiver(transport),
        &cloud.cert(),
        &options.uplink,
    );
    let gateway = Gateway::start(&config, TEST_BOOTSTRAP_KEY).await;
    let pid = pid(&gateway.process);
    tokio::time::sleep(Duration::from_millis(500)).await; // connected and idle
    let (idle_mb, _) = rss_mb(pid);

    let accepted = Arc::new(AtomicU64::new(0));
    let late = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let load = tokio::spawn(post_paced(
        format!("{}/ingest", gateway.url),
        bodies.clone(),
        options.memory_rate,
        options.connections,
        options.memory_seconds,
        accepted.clone(),
        late.clone(),
    ));
    if trace {
        println!("    second by second, uplink {}:", transport.name());
        println!(
            "      second  intake ev/s  delivered ev/s  backlog events  VmRSS MB (max in the second)"
        );
    }
    let (mut last_accepted, mut last_acked, mut max_rss) = (0u64, 0u64, 0f64);
    let mut next_report = Instant::now() + Duration::from_secs(1);
    let mut second = 0;
    let mut overall = 0f64;
    // Bounded: the load ends after `memory_seconds` (each request after at
    // most REQUEST_TIMEOUT).
    while !load.is_finished() {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let rss = rss_mb(pid).0;
        max_rss = max_rss.max(rss);
        overall = overall.max(rss);
        if trace && Instant::now() >= next_report {
            next_report += Duration::from_secs(1);
            second += 1;
            let h = health(&client, &gateway).await;
            let acked = h["uplink"]["last_acked_sequence"].as_u64().unwrap_or(0);
            let now_accepted = accepted.load(Ordering::Relaxed);
            println!(
                "      {second:>6}  {:>11}  {:>14}  {:>14}  {:>8.1}",
                now_accepted - last_accepted,
                acked - last_acked,
                h["buffer"]["pending_records"].as_u64().unwrap_or(0),
                max_rss
            );
            (last_accepted, last_acked, max_rss) = (now_accepted, acked, 0.0);
        }
    }
    load.await.unwrap();
    let seconds = start.elapsed().as_secs_f64();
    let intake = accepted.load(Ordering::Relaxed) as f64 / seconds;
    let acked =
        health(&client, &gateway).await["uplink"]["last_acked_sequence"].as_u64().unwrap_or(0);
    let delivered = acked as f64 / seconds;
    let (_, hwm) = rss_mb(pid);
    let peak_mb = hwm.max(overall);
    gateway.process.kill9().await.unwrap(); // a clean stop would try to flush the backlog
    cloud.process.terminate().await.unwrap();
    MemoryRun { idle_mb, peak_mb, intake, delivered, late: late.load(Ordering::Relaxed) }
}

async fn memory_benchmark(options: &Options) {
    let rate = options.memory_rate;
    println!(
        "\n(2) gateway memory: {} for {} s from {} connections, bodies of {BODY_EVENTS}, uplink to the cloud directly",
        if rate == 0 {
            "posting as fast as answered".to_owned()
        } else {
            format!("posting {rate} events/s")
        },
        options.memory_seconds,
        options.connections
    );
    let bodies: Arc<Vec<Vec<u8>>> = Arc::new(
        (0..MEMORY_BODIES).map(|b| body(Envelope::Scan, (b * BODY_EVENTS) as u64)).collect(),
    );
    let mut rows = Vec::new();
    let mut peaks: [Vec<f64>; 2] = [vec![], vec![]];
    let mut intakes: [Vec<f64>; 2] = [vec![], vec![]];
    for round in 0..options.rounds {
        let mut order = [Transport::Grpc, Transport::Quic];
        order.rotate_left(round % 2);
        for transport in order {
            // The second-by-second trace of the first round shows how
            // memory follows the load; later rounds print their summary.
            let run = memory_run(options, transport, &bodies, round == 0).await;
            rows.push(format!(
                "    {:>5}  {:<6}  {:>11.0}  {:>13}  {:>14.0}  {:>11.1}  {:>19.1}",
                round + 1,
                transport.name(),
                run.intake,
                run.late,
                run.delivered,
                run.idle_mb,
                run.peak_mb,
            ));
            let i = usize::from(transport == Transport::Quic);
            peaks[i].push(run.peak_mb);
            intakes[i].push(run.intake);
        }
    }
    println!(
        "    round  uplink  intake ev/s  late requests  delivered ev/s  idle RSS MB  peak RSS (VmHWM) MB"
    );
    for row in rows {
        println!("{row}");
    }
    for (i, transport) in [Transport::Grpc, Transport::Quic].into_iter().enumerate() {
        let worst = peaks[i].iter().copied().fold(0.0, f64::max);
        let intake = median(&mut intakes[i]);
        println!(
            "    {}: median intake {intake:.0} ev/s, median peak RSS {:.1} MB, worst {worst:.1} MB; goal <= {GOAL_RSS_MB} MB at >= {rate} ev/s: {}{}",
            transport.name(),
            median(&mut peaks[i]),
            verdict(worst <= GOAL_RSS_MB && intake >= rate as f64 * 0.95),
            if rate > 0 && intake < rate as f64 * 0.95 { " (intake below the target)" } else { "" }
        );
    }
}

fn main() {
    let options = Options::parse();
    let kernel = [&KERNEL_LOSSY, &KERNEL_LOSSY_BBR].iter().any(|link| options.wants_link(link));
    if kernel && std::env::var_os(NETNS_MARK).is_none() {
        std::process::exit(rerun_in_network_namespace());
    }
    if kernel {
        prepare_network_namespace();
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("bench")
        .enable_all()
        .build()
        .expect("runtime");
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    let binary = opgraph_tests::binary("opgraph-gateway").expect("release binaries");
    println!(
        "opgraph delivery benchmark: {cpus} CPUs, binaries from {}, {} round(s)",
        binary.parent().unwrap().display(),
        options.rounds
    );
    runtime.block_on(async {
        for link in [&LOOPBACK, &LOSSY, &KERNEL_LOSSY, &KERNEL_LOSSY_BBR] {
            for &envelope in &options.envelopes {
                if options.wants_link(link) {
                    delivery_benchmark(&options, link, envelope).await;
                }
            }
        }
        if options.wants("memory") {
            memory_benchmark(&options).await;
        }
    });
}

/// Runs this bench again, same arguments, in a private network namespace
/// (`unshare -n`), where the kernel links may add their TUN device and
/// routes without touching the host's network; its exit code. Prints why
/// and returns 0 when this machine cannot (not root, no `/dev/net/tun`,
/// no `unshare` or `ip`).
fn rerun_in_network_namespace() -> i32 {
    let works = |program: &str, args: &[&str]| {
        std::process::Command::new(program)
            .args(args)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|status| status.success())
    };
    let tun = Path::new("/dev/net/tun").exists();
    if !tun || !works("unshare", &["-n", "true"]) || !works("ip", &["-V"]) {
        println!(
            "kernel-lossy, kernel-lossy-bbr: skipped: needs root and /dev/net/tun \
             (and `unshare`, `ip`) to emulate the link in a private network namespace"
        );
        return 0;
    }
    let exe = std::env::current_exe().unwrap();
    let status = std::process::Command::new("unshare")
        .arg("-n")
        .arg("--")
        .arg(exe)
        .args(std::env::args_os().skip(1))
        .env(NETNS_MARK, "1")
        .status()
        .expect("unshare -n");
    status.code().unwrap_or(1)
}

/// Inside the private namespace: loopback up (a new namespace has it down;
/// the harness talks to every HTTP API over it), and no TCP metrics cache,
/// so a connection does not inherit the ssthresh the previous run's
/// connection to the same address ended with (every run starts alike).
fn prepare_network_namespace() {
    let up = std::process::Command::new("ip").args(["link", "set", "lo", "up"]).status();
    assert!(up.is_ok_and(|s| s.success()), "ip link set lo up");
    std::fs::write("/proc/sys/net/ipv4/tcp_no_metrics_save", "1").unwrap();
}

/// A running `opgraph-sim tunlink`.
struct TunLinkProc(Process);

impl TunLinkProc {
    /// Starts `opgraph-sim tunlink` with `args` and `seed`, waits for its
    /// device, and pins the congestion control of kernel TCP on the
    /// emulated route to `tcp` (a route attribute: a private namespace may
    /// not change the default).
    async fn start(args: &[&str], tcp: &str, seed: u64) -> TunLinkProc {
        let seed = seed.to_string();
        let args: Vec<&str> =
            ["tunlink", "--seed", seed.as_str()].into_iter().chain(args.iter().copied()).collect();
        let log = ("RUST_LOG", std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()));
        let process =
            Process::start("opgraph-sim", &args, &[log], &["local", "remote"]).await.unwrap();
        // It prints its device before the `listening` lines.
        let device = process
            .banner
            .iter()
            .find_map(|line| line.strip_prefix("device "))
            .expect("tunlink names its device (see its stderr above)")
            .to_owned();
        let route = std::process::Command::new("ip")
            .args(["route", "replace", TUN_SUBNET, "dev", &device])
            .args(["proto", "kernel", "scope", "link", "src", TUN_LOCAL, "congctl", tcp])
            .status();
        assert!(
            route.is_ok_and(|s| s.success()),
            "ip route replace {TUN_SUBNET} ... congctl {tcp}"
        );
        TunLinkProc(process)
    }

    /// Stops it (SIGTERM) and sums up its closing counts for `events`
    /// delivered: packets and bytes each way, the share lost, bytes per
    /// event towards the cloud.
    async fn stop(self, events: u64) -> String {
        let (_, output) = self.0.stop().await.unwrap();
        let mut ways = Vec::new();
        let mut up_bytes = 0.0;
        for line in &output {
            let Some(rest) = line.strip_prefix("summary direction=") else { continue };
            let field = |key: &str| -> f64 {
                rest.split(' ')
                    .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0.0)
            };
            let (packets, bytes, lost) =
                (field("received_packets"), field("received_bytes"), field("dropped_loss"));
            let way = if rest.starts_with("to_upstream") {
                up_bytes = bytes;
                "to cloud"
            } else {
                "to gateway"
            };
            ways.push(format!(
                "{way} {packets:.0} packets, {:.2} MB, {:.2} % lost",
                bytes / 1e6,
                100.0 * lost / packets.max(1.0)
            ));
        }
        format!("link: {}; {:.1} B/event to cloud", ways.join("; "), up_bytes / events as f64)
    }
}
