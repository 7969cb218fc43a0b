//! Durable buffer benchmark (`cargo bench -p opgraph-gateway --bench buffer`).
//!
//! [`LogBuffer`] append throughput under `fsync = "batch"` beside a raw
//! sequential write of the same bytes with the same fsync cadence, measured
//! in the same run on the same filesystem and interleaved round by round
//! (the machine is shared). `always` and `never` are measured too, for
//! context. Goal (issue 3): batch ≥ 0.6× the raw write.
//!
//! Workloads, each fixed per phase and identical for every side:
//! `--appenders` concurrent tokio tasks, each appending its share of
//! `--records` events in groups of 1 to 2×G−1 records (mean G), one append
//! after the other. G comes from `--group`, one workload per value: 16 by
//! default, small appends like a gateway's device sources make, and 500,
//! like the local ingest endpoint's batch requests (up to 1000 events in
//! one append). Payloads are random bytes of 240 to 360 bytes (mean 300,
//! the size of an encoded `pb::Event` from the local ingest endpoint),
//! drawn from a pool of 4096, with a fixed seed.
//!
//! Raw baseline: one thread writes the same payloads (same count, sizes
//! and order; payload bytes only, without the buffer's 20-byte framing) to
//! one fresh file on the same filesystem with `File::write_all`, one write
//! per chunk, where a chunk is one group from each appender in turn: what
//! one group commit of the buffer holds when every appender has one append
//! waiting. It calls `sync_data` after a write whenever `fsync_interval`
//! has passed since the previous one started (at most one fsync per
//! interval) and once at the end. So it pays the same copies and the same
//! write pattern, but no framing, checksums, queueing, writer thread or
//! per-append answer, and it never waits for an appender: it is the
//! fastest the disk takes these bytes with one fsync per interval.
//!
//! For context, a second raw row, `raw, full groups`, also fsyncs as soon
//! as [`FULL_GROUP_BYTES`] were written since the last fsync: the buffer's
//! own cadence under `batch`. When the appenders' groups together exceed
//! that size (small appends from 64 appenders do), the buffer fsyncs per
//! full group instead of per interval, and this row shows what the same
//! cadence costs a bare writer.
//!
//! Options (flag after `--`, or environment variable):
//! `--rounds=N` / `OPGRAPH_BENCH_ROUNDS` (3),
//! `--records=N` / `OPGRAPH_BENCH_RECORDS` events per phase (30 appends
//! per appender, at least 300000),
//! `--appenders=N` / `OPGRAPH_BENCH_APPENDERS` (64),
//! `--group=G,G` / `OPGRAPH_BENCH_GROUP` mean records per append, one
//! workload each (16,500),
//! `--interval=MS` / `OPGRAPH_BENCH_INTERVAL_MS` fsync interval in
//! milliseconds (the default of `BufferConfig`, 10),
//! `--settle=US` / `OPGRAPH_BENCH_SETTLE_US` `fsync_settle` in
//! microseconds (the default of `BufferConfig`),
//! `--max-seconds=N` / `OPGRAPH_BENCH_MAX_SECONDS` cap per phase (20; a
//! phase that reaches it stops early and says so),
//! `--dir=PATH` / `OPGRAPH_BENCH_DIR` where the data goes (the system temp
//! directory by default; it must be a real disk: on tmpfs an fsync costs
//! nothing), `--only=batch|always|never` / `OPGRAPH_BENCH_ONLY` one buffer
//! policy beside the raw write (for profiling). Recorded numbers and their explanation: BENCHMARKS.md.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use opgraph_gateway::buffer::{Buffer, BufferConfig, FULL_GROUP_BYTES, FsyncPolicy, LogBuffer};
use tokio::runtime::Runtime;

const GOAL: f64 = 0.6;
const POOL: usize = 4096;
const MB: f64 = 1e6;

struct Options {
    rounds: usize,
    records: Option<usize>,
    appenders: usize,
    groups: Vec<usize>,
    interval: Duration,
    settle: Duration,
    max_seconds: u64,
    dir: Option<PathBuf>,
    only: Option<FsyncPolicy>,
}

impl Options {
    fn parse() -> Options {
        let args: Vec<String> = std::env::args().skip(1).collect();
        let flags = [
            "rounds",
            "records",
            "appenders",
            "group",
            "interval",
            "settle",
            "max-seconds",
            "dir",
            "only",
        ];
        for arg in &args {
            let known = flags.iter().any(|f| arg.starts_with(&format!("--{f}=")));
            // `cargo bench` passes `--bench`; a positional filter is ignored.
            assert!(
                !arg.starts_with("--") || arg == "--bench" || known,
                "unknown option {arg}; see the header of gateway/benches/buffer.rs"
            );
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
        let default_interval = BufferConfig::default().fsync_interval.as_millis() as u64;
        let default_settle = BufferConfig::default().fsync_settle.as_micros() as u64;
        Options {
            rounds: num("rounds", "OPGRAPH_BENCH_ROUNDS", 3).clamp(1, 20) as usize,
            records: get("records", "OPGRAPH_BENCH_RECORDS").map(|_| {
                num("records", "OPGRAPH_BENCH_RECORDS", 0).clamp(1000, 100_000_000) as usize
            }),
            appenders: num("appenders", "OPGRAPH_BENCH_APPENDERS", 64).clamp(1, 100_000) as usize,
            groups: get("group", "OPGRAPH_BENCH_GROUP")
                .unwrap_or_else(|| "16,500".to_owned())
                .split(',')
                .map(|g| {
                    let g: usize = g.trim().parse().unwrap_or_else(|_| {
                        panic!("--group / OPGRAPH_BENCH_GROUP: numbers separated by commas")
                    });
                    g.clamp(1, 100_000)
                })
                .collect(),
            interval: Duration::from_millis(
                num("interval", "OPGRAPH_BENCH_INTERVAL_MS", default_interval).clamp(1, 60_000),
            ),
            settle: Duration::from_micros(num("settle", "OPGRAPH_BENCH_SETTLE_US", default_settle)),
            max_seconds: num("max-seconds", "OPGRAPH_BENCH_MAX_SECONDS", 20).max(1),
            dir: get("dir", "OPGRAPH_BENCH_DIR").map(PathBuf::from),
            only: get("only", "OPGRAPH_BENCH_ONLY").map(|v| match v.as_str() {
                "batch" => FsyncPolicy::Batch,
                "always" => FsyncPolicy::Always,
                "never" => FsyncPolicy::Never,
                _ => panic!("--only / OPGRAPH_BENCH_ONLY: `batch`, `always` or `never`, not {v:?}"),
            }),
        }
    }

    fn temp_dir(&self) -> tempfile::TempDir {
        match &self.dir {
            Some(dir) => {
                std::fs::create_dir_all(dir).expect("create --dir");
                tempfile::Builder::new().prefix("opgraph-bench-").tempdir_in(dir)
            }
            None => tempfile::Builder::new().prefix("opgraph-bench-").tempdir(),
        }
        .expect("temp dir")
    }
}

/// Deterministic pseudo-random numbers (splitmix64): the same workload in
/// every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// The appends of one phase: per appender, its groups in order.
#[derive(Clone)]
struct Workload {
    appenders: Vec<Vec<Vec<Bytes>>>,
}

impl Workload {
    fn new(appenders: usize, group: usize, records: usize) -> Workload {
        let mut rng = Rng(42);
        let pool: Vec<Bytes> = (0..POOL)
            .map(|_| {
                let len = 240 + rng.below(121);
                Bytes::from((0..len).map(|_| rng.next() as u8).collect::<Vec<u8>>())
            })
            .collect();
        let per = records.div_ceil(appenders);
        let mut left = records;
        let appenders = (0..appenders)
            .map(|_| {
                let mut mine = per.min(left);
                left -= mine;
                let mut groups = Vec::new();
                while mine > 0 {
                    let size = (1 + rng.below(2 * group - 1)).min(mine);
                    mine -= size;
                    groups.push((0..size).map(|_| pool[rng.below(POOL)].clone()).collect());
                }
                groups
            })
            .collect();
        Workload { appenders }
    }

    fn records(&self) -> usize {
        self.appenders.iter().flatten().map(Vec::len).sum()
    }

    fn appends(&self) -> usize {
        self.appenders.iter().map(Vec::len).sum()
    }

    fn payload_bytes(&self) -> usize {
        self.appenders.iter().flatten().flatten().map(Bytes::len).sum()
    }
}

/// What one phase did.
struct Outcome {
    elapsed: Duration,
    records: usize,
    bytes: usize,
    appends: usize,
    /// Per-append latencies (buffer phases only), sorted.
    latencies: Vec<Duration>,
    capped: bool,
}

impl Outcome {
    fn records_per_s(&self) -> f64 {
        self.records as f64 / self.elapsed.as_secs_f64()
    }

    fn mb_per_s(&self) -> f64 {
        self.bytes as f64 / MB / self.elapsed.as_secs_f64()
    }

    fn appends_per_s(&self) -> f64 {
        self.appends as f64 / self.elapsed.as_secs_f64()
    }

    fn latency_ms(&self, q: f64) -> f64 {
        if self.latencies.is_empty() {
            return f64::NAN;
        }
        let i = ((self.latencies.len() - 1) as f64 * q).round() as usize;
        self.latencies[i].as_secs_f64() * 1000.0
    }
}

/// The raw baseline: see the module docs.
fn raw_write(
    dir: &Path,
    work: &Workload,
    interval: Duration,
    full_group: Option<u64>,
    cap: Duration,
) -> Outcome {
    let mut file = File::create(dir.join("raw.log")).expect("create raw file");
    let rounds = work.appenders.iter().map(Vec::len).max().unwrap_or(0);
    let mut chunk = Vec::with_capacity(1 << 20);
    let (mut records, mut bytes, mut appends) = (0, 0, 0);
    let mut capped = false;
    let start = Instant::now();
    let mut last_sync = start;
    let mut unsynced = 0u64;
    for k in 0..rounds {
        chunk.clear();
        for group in work.appenders.iter().filter_map(|groups| groups.get(k)) {
            for payload in group {
                chunk.extend_from_slice(payload);
            }
            records += group.len();
            appends += 1;
        }
        file.write_all(&chunk).expect("raw write");
        bytes += chunk.len();
        unsynced += chunk.len() as u64;
        if last_sync.elapsed() >= interval || full_group.is_some_and(|full| unsynced >= full) {
            last_sync = Instant::now();
            unsynced = 0;
            file.sync_data().expect("raw fsync");
        }
        if start.elapsed() > cap {
            capped = true;
            break;
        }
    }
    file.sync_data().expect("raw fsync");
    Outcome { elapsed: start.elapsed(), records, bytes, appends, latencies: Vec::new(), capped }
}

/// The buffer: one task per appender on a multi-threaded runtime.
fn buffer_appends(
    rt: &Runtime,
    dir: &Path,
    fsync: FsyncPolicy,
    (interval, settle): (Duration, Duration),
    work: Workload,
    cap: Duration,
) -> Outcome {
    rt.block_on(async move {
        let config = BufferConfig {
            fsync,
            fsync_interval: interval,
            fsync_settle: settle.min(interval),
            ..BufferConfig::with_dir(dir.join("buffer"))
        };
        let buffer = Arc::new(LogBuffer::open(config).await.expect("open buffer"));
        let gate = Arc::new(tokio::sync::Barrier::new(work.appenders.len() + 1));
        let tasks: Vec<_> = work
            .appenders
            .into_iter()
            .map(|groups| {
                let (buffer, gate) = (Arc::clone(&buffer), Arc::clone(&gate));
                tokio::spawn(async move {
                    let mut latencies = Vec::with_capacity(groups.len());
                    let (mut records, mut bytes) = (0, 0);
                    gate.wait().await;
                    let deadline = Instant::now() + cap;
                    for group in groups {
                        if Instant::now() > deadline {
                            break;
                        }
                        let (n, size) = (group.len(), group.iter().map(Bytes::len).sum::<usize>());
                        let sent = Instant::now();
                        buffer.append(group).await.expect("append");
                        latencies.push(sent.elapsed());
                        records += n;
                        bytes += size;
                    }
                    (latencies, records, bytes)
                })
            })
            .collect();
        gate.wait().await;
        let start = Instant::now();
        let mut outcome = Outcome {
            elapsed: Duration::ZERO,
            records: 0,
            bytes: 0,
            appends: 0,
            latencies: Vec::new(),
            capped: false,
        };
        for task in tasks {
            let (latencies, records, bytes) = task.await.expect("appender");
            outcome.appends += latencies.len();
            outcome.latencies.extend(latencies);
            outcome.records += records;
            outcome.bytes += bytes;
        }
        outcome.elapsed = start.elapsed();
        outcome.capped = outcome.elapsed > cap;
        outcome.latencies.sort_unstable();
        assert_eq!(buffer.stats().appended_total, outcome.records as u64);
        buffer.close().await.expect("close buffer");
        outcome
    })
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n % 2 == 1 { values[n / 2] } else { (values[n / 2 - 1] + values[n / 2]) / 2.0 }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Side {
    Raw,
    RawFullGroups,
    Buffer(FsyncPolicy),
}

impl Side {
    fn name(self) -> &'static str {
        match self {
            Side::Raw => "raw write+fsync",
            Side::RawFullGroups => "raw, full groups",
            Side::Buffer(FsyncPolicy::Batch) => "buffer batch",
            Side::Buffer(FsyncPolicy::Always) => "buffer always",
            Side::Buffer(FsyncPolicy::Never) => "buffer never",
        }
    }
}

/// One workload (one mean group size): every side, round by round, with
/// the per-round rows and the medians.
fn run_workload(options: &Options, rt: &Runtime, group: usize, title: &str) {
    let records = options.records.unwrap_or((30 * options.appenders * group).max(300_000));
    let work = Workload::new(options.appenders, group, records);
    let cap = Duration::from_secs(options.max_seconds);
    let mean_payload = work.payload_bytes() as f64 / work.records() as f64;
    let mean_group = work.records() as f64 / work.appends() as f64;
    println!();
    println!("{title}");
    println!(
        "  {} records ({:.1} MB of payload, mean {:.0} B) in {} appends by {} appenders \
         (1..={} records per append, mean {:.1})",
        work.records(),
        work.payload_bytes() as f64 / MB,
        mean_payload,
        work.appends(),
        options.appenders,
        2 * group - 1,
        mean_group,
    );
    // Each appender has one append in flight, so one group holds at most
    // this much; below FULL_GROUP_BYTES it waits for the interval unless
    // it settles first (`fsync_settle`: nothing new for that long).
    let in_flight = options.appenders as f64 * mean_group * mean_payload;
    let cadence = if in_flight >= FULL_GROUP_BYTES as f64 {
        "fsynced as soon as full, not by the interval".to_owned()
    } else {
        format!(
            "fsynced once settled, else one per interval (ceiling without settling {:.1} MB/s)",
            in_flight / options.interval.as_secs_f64() / MB
        )
    };
    println!(
        "  in flight when every appender waits: {:.0} KiB; groups of `batch` {cadence}",
        in_flight / 1024.0
    );
    println!(
        "    round  side               records/s      MB/s   appends/s   p50 / p99 ms   vs raw"
    );
    let sides: Vec<Side> = [
        Side::Raw,
        Side::RawFullGroups,
        Side::Buffer(FsyncPolicy::Batch),
        Side::Buffer(FsyncPolicy::Always),
        Side::Buffer(FsyncPolicy::Never),
    ]
    .into_iter()
    .filter(|&side| match (side, options.only) {
        (Side::Buffer(policy), Some(only)) => policy == only,
        _ => true,
    })
    .collect();
    let mut results: Vec<Rounds> = sides
        .iter()
        .map(|&side| Rounds { side, records: Vec::new(), mbs: Vec::new(), ratios: Vec::new() })
        .collect();
    let cadence = (options.interval, options.settle);
    for round in 0..options.rounds {
        // Alternate the order so that drift on the machine hits all sides.
        let order: Vec<Side> =
            if round % 2 == 0 { sides.clone() } else { sides.iter().rev().copied().collect() };
        let mut outcomes = Vec::new();
        for side in order {
            let dir = options.temp_dir();
            let outcome = match side {
                Side::Raw => raw_write(dir.path(), &work, options.interval, None, cap),
                Side::RawFullGroups => {
                    raw_write(dir.path(), &work, options.interval, Some(FULL_GROUP_BYTES), cap)
                }
                Side::Buffer(policy) => {
                    buffer_appends(rt, dir.path(), policy, cadence, work.clone(), cap)
                }
            };
            outcomes.push((side, outcome));
        }
        let raw = outcomes.iter().find(|(s, _)| *s == Side::Raw).map(|(_, o)| o.mb_per_s());
        let raw = raw.expect("raw side");
        outcomes.sort_by_key(|(s, _)| sides.iter().position(|x| x == s));
        for (side, o) in &outcomes {
            let ratio = o.mb_per_s() / raw;
            let latency = if o.latencies.is_empty() {
                "-".to_owned()
            } else {
                format!("{:.1} / {:.1}", o.latency_ms(0.5), o.latency_ms(0.99))
            };
            println!(
                "    {:>5}  {:<16} {:>11.0} {:>9.1} {:>11.0}  {:>13}  {:>7.2}{}",
                round + 1,
                side.name(),
                o.records_per_s(),
                o.mb_per_s(),
                o.appends_per_s(),
                latency,
                ratio,
                if o.capped { "  (stopped at --max-seconds)" } else { "" }
            );
            let entry = results.iter_mut().find(|r| r.side == *side).expect("side");
            entry.records.push(o.records_per_s());
            entry.mbs.push(o.mb_per_s());
            entry.ratios.push(ratio);
        }
    }
    println!("    median side               records/s      MB/s   vs raw (median of rounds)");
    for Rounds { side, records, mbs, ratios } in &mut results {
        let ratio = median(ratios);
        let verdict = match side {
            Side::Buffer(FsyncPolicy::Batch) => {
                format!("   goal >= {GOAL:.2}: {}", if ratio >= GOAL { "met" } else { "MISSED" })
            }
            _ => String::new(),
        };
        println!(
            "           {:<16} {:>11.0} {:>9.1}  {:>7.2}{verdict}",
            side.name(),
            median(records),
            median(mbs),
            ratio
        );
    }
}

/// One side's figures over the rounds.
struct Rounds {
    side: Side,
    records: Vec<f64>,
    mbs: Vec<f64>,
    ratios: Vec<f64>,
}

fn main() {
    let options = Options::parse();
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    let cpu_model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    // One worker per CPU, like the gateway binary's runtime.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cpus)
        .enable_all()
        .build()
        .expect("runtime");
    let probe = options.temp_dir();
    println!("opgraph buffer benchmark (release: {})", !cfg!(debug_assertions));
    println!("machine: {cpus} CPUs, {cpu_model}");
    println!(
        "data under {}, {} round(s), fsync interval {:?}, settle {:?}; MB = 10^6 bytes of payload",
        probe.path().parent().map_or_else(|| "?".into(), |p| p.display().to_string()),
        options.rounds,
        options.interval,
        options.settle.min(options.interval),
    );
    drop(probe);
    for (i, &group) in options.groups.iter().enumerate() {
        let title = match i {
            0 => format!("({}) small appends, like device sources (--group={group})", i + 1),
            _ => format!("({}) large appends, like batch ingest requests (--group={group})", i + 1),
        };
        run_workload(&options, &rt, group, &title);
    }
}
