//! Ingest benchmark (`cargo bench -p opgraph-cloud --bench ingest`).
//!
//! Two comparisons, each against a baseline measured in the same run and
//! interleaved with it round by round, so that load from elsewhere on the
//! machine hits both sides alike:
//!
//! - (a) single-event `POST /api/ingest` requests/s on the real router
//!   beside a no-op axum handler, same load generator and connections;
//! - (b) batch ingest events/s (`{"batch": [1000 envelopes]}`, durable)
//!   beside the store's own insert path driven directly on SQLite.
//! - (c) what serving with limits costs (connection cap, head and body
//!   timeouts: `opgraph_proto::serve`, which (a) uses on both sides): the
//!   no-op through it beside the no-op through plain `axum::serve`.
//!
//! Options (flag or environment variable):
//! `--seconds=N` / `OPGRAPH_BENCH_SECONDS` measured seconds per phase (5),
//! `--warmup=N` / `OPGRAPH_BENCH_WARMUP` unmeasured seconds first (1),
//! `--rounds=N` / `OPGRAPH_BENCH_ROUNDS` (3),
//! `--connections=N` / `OPGRAPH_BENCH_CONNECTIONS` for (a) (64),
//! `--batch-connections=N` / `OPGRAPH_BENCH_BATCH_CONNECTIONS` for (b) (4),
//! `--client-threads=N` / `OPGRAPH_BENCH_CLIENT_THREADS` (2),
//! `--dir=PATH` / `OPGRAPH_BENCH_DIR` where data directories go (system
//! temp dir; must be a real disk, not tmpfs, or fsync costs nothing),
//! `--only=single|batch|serve` / `OPGRAPH_BENCH_ONLY`. The cloud under test reads
//! its own settings from the environment as the binary does
//! (`OPGRAPH_WRITER_CACHE=32MiB`, ...).
//! Design notes and recorded numbers: BENCHMARKS.md.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod fixtures;
mod load;

use std::path::PathBuf;
use std::time::Duration;

use hyper::header::HeaderValue;
use tokio::runtime::Runtime;

use fixtures::{BENCH_KEY, Server};
use load::Target;

// The cloud binary's allocator (cloud/src/main.rs), so that the cloud
// measured here allocates as the one deployed does.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const BATCH_SIZE: usize = 1000;
const GOAL_SINGLE: f64 = 0.6;
const GOAL_BATCH: f64 = 0.7;

struct Options {
    seconds: u64,
    warmup: u64,
    rounds: usize,
    connections: usize,
    batch_connections: usize,
    client_threads: usize,
    dir: Option<PathBuf>,
    only: Option<String>,
}

impl Options {
    fn parse() -> Options {
        let args: Vec<String> = std::env::args().skip(1).collect();
        let get = |flag: &str, env: &str| -> Option<String> {
            let prefix = format!("--{flag}=");
            args.iter()
                .find_map(|a| a.strip_prefix(&prefix).map(str::to_owned))
                .or_else(|| std::env::var(env).ok())
        };
        for arg in &args {
            let known = [
                "seconds",
                "warmup",
                "rounds",
                "connections",
                "batch-connections",
                "client-threads",
                "dir",
                "only",
            ]
            .iter()
            .any(|f| arg.starts_with(&format!("--{f}=")));
            // `cargo bench` passes `--bench`; a positional filter is ignored.
            if arg.starts_with("--") && arg != "--bench" && !known {
                panic!("unknown option {arg}; see the header of cloud/benches/ingest/main.rs");
            }
        }
        let num = |flag: &str, env: &str, default: u64| -> u64 {
            get(flag, env).map_or(default, |v| {
                v.parse().unwrap_or_else(|_| panic!("--{flag} / {env}: not a number: {v:?}"))
            })
        };
        let options = Options {
            seconds: num("seconds", "OPGRAPH_BENCH_SECONDS", 5).max(1),
            warmup: num("warmup", "OPGRAPH_BENCH_WARMUP", 1),
            rounds: num("rounds", "OPGRAPH_BENCH_ROUNDS", 3).clamp(1, 20) as usize,
            connections: num("connections", "OPGRAPH_BENCH_CONNECTIONS", 64).clamp(1, 4096)
                as usize,
            batch_connections: num("batch-connections", "OPGRAPH_BENCH_BATCH_CONNECTIONS", 4)
                .clamp(1, 256) as usize,
            client_threads: num("client-threads", "OPGRAPH_BENCH_CLIENT_THREADS", 2).clamp(1, 64)
                as usize,
            dir: get("dir", "OPGRAPH_BENCH_DIR").map(PathBuf::from),
            only: get("only", "OPGRAPH_BENCH_ONLY"),
        };
        assert!(
            matches!(options.only.as_deref(), None | Some("single" | "batch" | "serve")),
            "--only must be `single`, `batch` or `serve`"
        );
        options
    }

    fn wants(&self, part: &str) -> bool {
        self.only.as_deref().is_none_or(|only| only == part)
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

fn runtime(name: &str, threads: usize) -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .thread_name(name)
        .enable_all()
        .build()
        .expect("runtime")
}

/// Round `round` of `base` beside `real`: which goes first alternates, so
/// that a drift in the machine's load weighs on both alike.
fn alternated(
    round: usize,
    base: &Target,
    real: &Target,
    run: impl Fn(&Target) -> load::Outcome,
) -> (load::Outcome, load::Outcome) {
    let (base, real) = if round.is_multiple_of(2) {
        let base = run(base);
        (base, run(real))
    } else {
        let real = run(real);
        (run(base), real)
    };
    assert_eq!(base.failed + real.failed, 0, "requests failed; see above");
    (base, real)
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n % 2 == 1 { values[n / 2] } else { (values[n / 2 - 1] + values[n / 2]) / 2.0 }
}

fn verdict(ratio: f64, goal: f64) -> &'static str {
    if ratio >= goal { "met" } else { "MISSED" }
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
    // The server gets a runtime sized like the binary's default (one worker
    // per CPU); the load generator has its own, so neither starves the other
    // of scheduler slots (they still share the CPUs).
    let server_rt = runtime("server", cpus);
    let client_rt = runtime("client", options.client_threads);
    let warmup = Duration::from_secs(options.warmup);
    let measure = Duration::from_secs(options.seconds);
    let probe = options.temp_dir();
    println!("opgraph ingest benchmark (release: {})", !cfg!(debug_assertions));
    println!("machine: {cpus} CPUs, {cpu_model}");
    println!(
        "data under {} ({} round(s), {}s warm-up + {}s measured per phase)",
        probe.path().parent().map_or_else(|| "?".into(), |p| p.display().to_string()),
        options.rounds,
        options.warmup,
        options.seconds
    );
    drop(probe);
    let bearer = Some(HeaderValue::from_str(&format!("Bearer {BENCH_KEY}")).expect("header"));

    if options.wants("single") {
        let dir = options.temp_dir();
        let cloud = server_rt.block_on(fixtures::start_cloud(dir.path()));
        let noop = server_rt.block_on(fixtures::start_noop());
        let body = fixtures::body_maker(1);
        let ingest = Target {
            addr: cloud.addr,
            path: "/api/ingest",
            bearer: bearer.clone(),
            body: body.clone(),
            expect: 202,
        };
        let baseline =
            Target { addr: noop.addr, path: "/noop", bearer: bearer.clone(), body, expect: 202 };
        println!();
        println!(
            "(a) single-event POST /api/ingest vs no-op axum handler, {} keep-alive connections",
            options.connections
        );
        println!("    round   no-op req/s  ingest req/s  ratio   ingest p50/p99 ms");
        let mut ratios = Vec::new();
        let (mut noops, mut ingests) = (Vec::new(), Vec::new());
        let run = |target: &Target| {
            client_rt.block_on(load::run(target, options.connections, warmup, measure))
        };
        for round in 0..options.rounds {
            let (base, mut real) = alternated(round, &baseline, &ingest, run);
            let ratio = real.per_second() / base.per_second();
            println!(
                "    {:>5}  {:>12.0}  {:>12.0}  {:>5.2}   {:.2} / {:.2}",
                round + 1,
                base.per_second(),
                real.per_second(),
                ratio,
                real.latency_ms(0.5),
                real.latency_ms(0.99)
            );
            noops.push(base.per_second());
            ingests.push(real.per_second());
            ratios.push(ratio);
        }
        let ratio = median(&mut ratios);
        println!(
            "    median {:>12.0}  {:>12.0}  {:>5.2}   goal >= {GOAL_SINGLE:.2}: {}",
            median(&mut noops),
            median(&mut ingests),
            ratio,
            verdict(ratio, GOAL_SINGLE)
        );
        server_rt.block_on(async {
            cloud.stop().await;
            noop.stop().await;
        });
    }

    if options.wants("batch") {
        let body = fixtures::body_maker(BATCH_SIZE);
        println!();
        println!(
            "(b) batch ingest ({BATCH_SIZE} events/request, {} connections, durable commits) \
             vs raw engine insert (1 transaction per {BATCH_SIZE} rows, synchronous=FULL)",
            options.batch_connections
        );
        println!("    request body {} KiB", body().len() / 1024);
        println!("    round     raw ev/s   ingest ev/s  ratio   request p50/p99 ms");
        let mut ratios = Vec::new();
        let (mut raws, mut ingests) = (Vec::new(), Vec::new());
        for round in 0..options.rounds {
            let raw = || {
                let dir = options.temp_dir();
                fixtures::raw_insert(dir.path(), &body, warmup, measure)
            };
            let http = || {
                let dir = options.temp_dir();
                let cloud: Server = server_rt.block_on(fixtures::start_cloud(dir.path()));
                let target = Target {
                    addr: cloud.addr,
                    path: "/api/ingest",
                    bearer: bearer.clone(),
                    body: body.clone(),
                    expect: 202,
                };
                let outcome = client_rt.block_on(load::run(
                    &target,
                    options.batch_connections,
                    warmup,
                    measure,
                ));
                server_rt.block_on(cloud.stop());
                outcome
            };
            let (raw_rate, mut real) = if round % 2 == 0 {
                let raw_rate = raw();
                (raw_rate, http())
            } else {
                let real = http();
                (raw(), real)
            };
            assert_eq!(real.failed, 0, "requests failed; see above");
            let events = real.per_second() * BATCH_SIZE as f64;
            let ratio = events / raw_rate;
            println!(
                "    {:>5}  {:>11.0}  {:>12.0}  {:>5.2}   {:.1} / {:.1}",
                round + 1,
                raw_rate,
                events,
                ratio,
                real.latency_ms(0.5),
                real.latency_ms(0.99)
            );
            raws.push(raw_rate);
            ingests.push(events);
            ratios.push(ratio);
        }
        let ratio = median(&mut ratios);
        println!(
            "    median {:>11.0}  {:>12.0}  {:>5.2}   goal >= {GOAL_BATCH:.2}: {}",
            median(&mut raws),
            median(&mut ingests),
            ratio,
            verdict(ratio, GOAL_BATCH)
        );
    }

    if options.wants("serve") {
        let limited = server_rt.block_on(fixtures::start_noop());
        let plain = server_rt.block_on(fixtures::start_noop_plain());
        let target = |addr| Target {
            addr,
            path: "/noop",
            bearer: bearer.clone(),
            body: fixtures::body_maker(1),
            expect: 202,
        };
        let (limited_target, plain_target) = (target(limited.addr), target(plain.addr));
        println!();
        println!(
            "(c) no-op with serving limits vs plain axum::serve, {} keep-alive connections",
            options.connections
        );
        println!("    round   plain req/s  limits req/s  ratio");
        let (mut plains, mut limiteds, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
        let run = |target: &Target| {
            client_rt.block_on(load::run(target, options.connections, warmup, measure))
        };
        for round in 0..options.rounds {
            let (base, real) = alternated(round, &plain_target, &limited_target, run);
            let ratio = real.per_second() / base.per_second();
            println!(
                "    {:>5}  {:>12.0}  {:>12.0}  {:>5.2}",
                round + 1,
                base.per_second(),
                real.per_second(),
                ratio
            );
            plains.push(base.per_second());
            limiteds.push(real.per_second());
            ratios.push(ratio);
        }
        println!(
            "    median {:>11.0}  {:>12.0}  {:>5.2}",
            median(&mut plains),
            median(&mut limiteds),
            median(&mut ratios)
        );
        server_rt.block_on(async {
            limited.stop().await;
            plain.stop().await;
        });
    }
}
