//! ClickHouse store benchmark (`cargo bench -p opgraph-tests --bench
//! clickhouse`, after `cargo build --release -p opgraph-cloud --bins`),
//! on a private Debian `clickhouse-server` started on 127.0.0.1.
//!
//! **Insert**: gateway batches (`--batch` events, from the query history's
//! generator) committed through the store's exactly-once path
//! (`commit_gateway_batch`: admission against the session, events, and
//! the commit row with the ack and usage), beside the `clickhouse` crate's
//! raw insert of the same rows into an identical table of another
//! database, one insert per batch, through the store's HTTP client
//! settings (`client_for`). The raw side builds its rows from the
//! same events with the store's own flattening (`to_row`), timed, and
//! its time without that flattening is printed too. The sides take turns
//! of `--block` batches, alternating which goes first, so that the
//! server's merges and the host's disk weigh on both alike; a turn of the
//! store ends once its last commit row has landed
//! (`flush_gateway_commits`), so that no work of one side runs in the
//! other's time. Each side's count is checked at the end.
//!
//! **Queries**: `--query-events` events (default 10 M, 30 days) loaded
//! through the store, then the `opgraph-cloud` binary serves them. For each
//! query endpoint of the history benchmark (`query_cases`): one warm-up
//! call whose SQL is read back from `system.query_log`, then `--runs`
//! rounds of the HTTP call beside the same SQL statements run with
//! `clickhouse-client --time` (the server's and the native client's time,
//! without the client's process start).
//!
//! Options (after `--`): `--only=insert|queries`, `--events=N` (200000 per
//! side per round), `--batch=N` (1000), `--block=N` (10 batches per
//! turn), `--rounds=N` (3),
//! `--query-events=N` (10000000), `--load-batch=N` (20000), `--runs=N` (5),
//! `--show-sql` (print each replayed statement with its time),
//! `--case=TEXT` (only the query cases whose label contains TEXT).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use clickhouse::Client;
use opgraph_cloud::store::NewEvent;
use opgraph_cloud::store::clickhouse::{
    ClickHouseConfig, ClickHouseStore, EventRow, client_for, to_row,
};
use opgraph_cloud::store::gateway::{BatchCommit, GatewayStore};
use opgraph_simulators::history::{HistoryConfig, event, query_cases};
use opgraph_tests::Cloud;
use opgraph_tests::clickhouse::{ClickHouse, flush_query_log};
use serde_json::Value;

const WORKSPACE: &str = "ws_default";
const DATABASE: &str = "opgraph";
const RAW_DATABASE: &str = "raw";
const DAY_MS: i64 = 86_400_000;

struct Options {
    only: Option<String>,
    events: usize,
    batch: usize,
    block: usize,
    rounds: usize,
    query_events: u64,
    load_batch: usize,
    runs: usize,
    show_sql: bool,
    case: String,
}

fn options() -> Options {
    let mut o = Options {
        only: None,
        events: 200_000,
        batch: 1000,
        block: 10,
        rounds: 3,
        query_events: 10_000_000,
        load_batch: 20_000,
        runs: 5,
        show_sql: false,
        case: String::new(),
    };
    for arg in std::env::args().skip(1) {
        let (k, v) = arg.split_once('=').unwrap_or((arg.as_str(), ""));
        let number = || v.parse::<usize>().unwrap_or_else(|_| panic!("{k}=N"));
        match k {
            "--only" => o.only = Some(v.to_owned()),
            "--events" => o.events = number(),
            "--batch" => o.batch = number().max(1),
            "--block" => o.block = number().max(1),
            "--rounds" => o.rounds = number().max(1),
            "--query-events" => o.query_events = number() as u64,
            "--load-batch" => o.load_batch = number().max(1),
            "--runs" => o.runs = number().max(1),
            "--show-sql" => o.show_sql = true,
            "--case" => o.case = v.to_owned(),
            "--bench" => {}
            other => panic!("unknown option {other} (see the header of benches/clickhouse.rs)"),
        }
    }
    o
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

async fn open_store(url: &str, database: &str) -> ClickHouseStore {
    let config = ClickHouseConfig {
        url: url.to_owned(),
        database: database.to_owned(),
        cluster: None,
        ca_file: None,
    };
    ClickHouseStore::open(&config).await.expect("open the ClickHouse store")
}

/// Events `range` of a 30-day history ending now, with the ids a gateway
/// would give them.
fn history(range: std::ops::Range<u64>, total: u64) -> Vec<NewEvent> {
    let now = opgraph_cloud::now_ms();
    let cfg = HistoryConfig { events: total, end_ms: now, span_ms: 30 * DAY_MS, seed: 1 };
    range
        .map(|n| NewEvent { id: format!("evt_b{n:012}"), received_at: now, event: event(n, &cfg) })
        .collect()
}

/// `events` cut into batches of `size`.
fn batches(events: Vec<NewEvent>, size: usize) -> Vec<Vec<NewEvent>> {
    let mut events = events.into_iter();
    std::iter::from_fn(|| Some(events.by_ref().take(size.max(1)).collect::<Vec<_>>()))
        .take_while(|batch| !batch.is_empty())
        .collect()
}

/// Commits `batch` as the gateway batch numbered from `*sequence + 1`.
async fn commit_batch(
    store: &ClickHouseStore,
    epoch: u64,
    sequence: &mut u64,
    batch: Vec<NewEvent>,
) {
    let size = batch.len() as u64;
    let (first, last) = (*sequence + 1, *sequence + size);
    *sequence = last;
    let batch: Vec<(u64, NewEvent)> = (first..).zip(batch).collect();
    match store
        .commit_gateway_batch(WORKSPACE, "bench-gateway", epoch, (first, last), batch, None)
        .await
        .expect("commit a gateway batch")
    {
        BatchCommit::Acked { inserted, .. } => {
            assert_eq!(inserted as u64, size, "every event new");
        }
        other => panic!("batch {first}..={last} not acknowledged: {other:?}"),
    }
}

/// Commits `events` as gateway batches numbered from `*sequence + 1`.
async fn commit_batches(
    store: &ClickHouseStore,
    epoch: u64,
    sequence: &mut u64,
    events: Vec<NewEvent>,
    batch: usize,
) {
    for batch in batches(events, batch) {
        commit_batch(store, epoch, sequence, batch).await;
    }
}

/// The crate's insert of one batch's rows; returns the time spent
/// flattening events into rows.
async fn raw_insert(client: &Client, batch: Vec<NewEvent>) -> Duration {
    let flatten = Instant::now();
    let rows: Vec<EventRow> = batch.into_iter().map(|e| to_row(WORKSPACE, e)).collect();
    let flattening = flatten.elapsed();
    let mut insert = client.insert::<EventRow>("events").await.unwrap();
    for row in &rows {
        insert.write(row).await.unwrap();
    }
    insert.end().await.unwrap();
    flattening
}

/// Time spent by each side on one round.
#[derive(Default)]
struct Round {
    raw: Duration,
    flattening: Duration,
    ours: Duration,
}

/// One round, in turns of `block` batches per side, alternating which
/// side goes first, so that merges running on the server and the host's
/// disk weather fall on both sides alike.
async fn run_round(
    store: &ClickHouseStore,
    epoch: u64,
    sequence: &mut u64,
    raw: &Client,
    events: Vec<NewEvent>,
    (batch, block): (usize, usize),
) -> Round {
    let mut timed = Round::default();
    let batches = batches(events, batch);
    for (i, turn) in batches.chunks(block).enumerate() {
        for side in [i % 2, 1 - i % 2] {
            let turn = turn.to_vec();
            let started = Instant::now();
            if side == 0 {
                for batch in turn {
                    timed.flattening += raw_insert(raw, batch).await;
                }
                timed.raw += started.elapsed();
            } else {
                for batch in turn {
                    commit_batch(store, epoch, sequence, batch).await;
                }
                store.flush_gateway_commits().await.expect("commit rows land");
                timed.ours += started.elapsed();
            }
        }
    }
    timed
}

async fn count(client: &Client, database: &str) -> u64 {
    client.query(&format!("SELECT count() FROM {database}.events")).fetch_one().await.unwrap()
}

async fn insert_part(o: &Options) {
    let server = ClickHouse::start_logging_queries().await.expect("a private clickhouse-server");
    let url = server.url();
    let store = open_store(&url, DATABASE).await;
    drop(open_store(&url, RAW_DATABASE).await); // the same schema, for the raw side
    // The same HTTP client settings as the store's (`TCP_NODELAY`).
    let raw = client_for(&url, None).unwrap().with_database(RAW_DATABASE);
    let epoch = store
        .open_gateway_session(WORKSPACE, "bench-gateway", "bench-buffer")
        .await
        .expect("open a gateway session")
        .epoch;
    println!(
        "\nInsert: {} events per side per round in batches of {}, turns of {} batches, {} rounds, clickhouse-server 18.16 on 127.0.0.1",
        o.events, o.batch, o.block, o.rounds
    );
    println!(
        "  round   raw ev/s (rows built + insert)   raw insert only   opgraph ev/s   ratio   ratio to insert only"
    );
    let total = (o.events * o.rounds) as u64;
    let (mut sequence, mut ratios, mut strict) = (0u64, Vec::new(), Vec::new());
    for round in 0..o.rounds {
        let events =
            history(round as u64 * o.events as u64..(round as u64 + 1) * o.events as u64, total);
        let n = events.len() as f64;
        let timed = run_round(&store, epoch, &mut sequence, &raw, events, (o.batch, o.block)).await;
        let (raw_secs, flattening, our_secs) =
            (timed.raw.as_secs_f64(), timed.flattening.as_secs_f64(), timed.ours.as_secs_f64());
        let (raw_rate, insert_only, our_rate) =
            (n / raw_secs, n / (raw_secs - flattening), n / our_secs);
        println!(
            "  {round:>5}   {raw_rate:>30.0}   {insert_only:>15.0}   {our_rate:>12.0}   {:>5.2}   {:>20.2}",
            our_rate / raw_rate,
            our_rate / insert_only
        );
        ratios.push(our_rate / raw_rate);
        strict.push(our_rate / insert_only);
    }
    let check = Client::default().with_url(&url).with_validation(false);
    assert_eq!(count(&check, DATABASE).await, total, "opgraph stored every event once");
    assert_eq!(count(&check, RAW_DATABASE).await, total, "raw side stored every event once");
    let (ratio, strict) = (median(&mut ratios), median(&mut strict));
    println!(
        "  median ratio {ratio:.2} (to the insert alone {strict:.2}); goal >= 0.8x: {}",
        if ratio >= 0.8 { "met" } else { "missed" }
    );
    server_time_by_statement(&check).await;
}

/// Where the server's time went, by statement shape (its first words).
async fn server_time_by_statement(client: &Client) {
    flush_query_log(client).await;
    let rows: Vec<(String, u64, u64)> = client
        .query(
            "SELECT substring(replaceRegexpAll(query, '[[:space:]]+', ' '), 1, 70) AS shape, count(),
                    sum(query_duration_ms)
             FROM system.query_log WHERE type = 2 GROUP BY shape ORDER BY sum(query_duration_ms) DESC
             LIMIT 12",
        )
        .fetch_all()
        .await
        .unwrap();
    println!("  server time by statement: count, total ms, shape");
    for (shape, count, ms) in rows {
        println!("  {count:>8} {ms:>8}  {shape}");
    }
}

/// Runs `sql` with `clickhouse-client` (its output discarded); the time it
/// reports (`--time`), in seconds.
fn client_time(tcp_port: u16, sql: &str) -> f64 {
    let output = Command::new("clickhouse-client")
        .args(["--host", "127.0.0.1", "--port", &tcp_port.to_string()])
        .args(["--database", DATABASE, "--time", "--query", sql])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .expect("run clickhouse-client");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "clickhouse-client failed on {sql}: {stderr}");
    stderr
        .lines()
        .rev()
        .find_map(|l| l.trim().parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no time printed for {sql}: {stderr}"))
}

/// The `SELECT`s the cloud sent since the query log was last emptied.
async fn logged_selects(control: &Client) -> Vec<String> {
    flush_query_log(control).await;
    let queries: Vec<String> = control
        .query(
            "SELECT query FROM system.query_log WHERE type = 2 AND query LIKE 'SELECT%'
             ORDER BY query_start_time, event_time",
        )
        .fetch_all()
        .await
        .unwrap();
    queries
}

async fn call(cloud: &Cloud, method: &str, path: &str, body: &Value) -> f64 {
    let http = cloud.http();
    let request = match method {
        "GET" => http.get(cloud.at(path)),
        _ => http.post(cloud.at(path)).json(body),
    };
    let started = Instant::now();
    let response = request.bearer_auth(&cloud.key).send().await.unwrap();
    let status = response.status();
    let text = response.text().await.unwrap();
    let took = started.elapsed().as_secs_f64();
    assert!(status.is_success() && !text.contains("\"errors\""), "{path}: {status} {text}");
    took
}

async fn queries_part(o: &Options) {
    let server = ClickHouse::start_logging_queries().await.expect("a private clickhouse-server");
    let url = server.url();
    // The bench's own statements stay out of the query log.
    let control =
        Client::default().with_url(&url).with_validation(false).with_setting("log_queries", "0");
    {
        let store = open_store(&url, DATABASE).await;
        let epoch = store
            .open_gateway_session(WORKSPACE, "bench-gateway", "bench-buffer")
            .await
            .expect("open a gateway session")
            .epoch;
        let started = Instant::now();
        let (mut sequence, mut done) = (0u64, 0u64);
        while done < o.query_events {
            let end = (done + 10 * o.load_batch as u64).min(o.query_events);
            let events = history(done..end, o.query_events);
            commit_batches(&store, epoch, &mut sequence, events, o.load_batch).await;
            done = end;
            let rate = done as f64 / started.elapsed().as_secs_f64();
            eprint!("\r  loading: {done}/{} events, {rate:.0} ev/s   ", o.query_events);
        }
        eprintln!();
        assert_eq!(count(&control, DATABASE).await, o.query_events);
    }
    let cloud = Cloud::start(&[
        ("OPGRAPH_STORE", "clickhouse".to_owned()),
        ("OPGRAPH_CLICKHOUSE_URL", url.clone()),
        ("OPGRAPH_CLICKHOUSE_DATABASE", DATABASE.to_owned()),
        ("OPGRAPH_GRPC_ADDR", "off".to_owned()),
        ("OPGRAPH_QUIC_ADDR", "off".to_owned()),
        ("OPGRAPH_RATE_LIMIT_RPS", "0".to_owned()),
        ("OPGRAPH_LOG", "error".to_owned()),
    ])
    .await
    .expect(
        "opgraph-cloud on the ClickHouse store (cargo build --release -p opgraph-cloud --bins)",
    );
    println!(
        "\nQueries over {} events: p50 of {} runs, opgraph over HTTP vs the same SQL with clickhouse-client",
        o.query_events, o.runs
    );
    println!("| query | statements | opgraph p50 | clickhouse-client p50 | ratio | goal <= 1.3x |");
    println!("|---|---|---|---|---|---|");
    for (label, method, path, body) in query_cases() {
        if !label.contains(o.case.as_str()) {
            continue;
        }
        // Flushed first: entries still buffered would land after the
        // truncation and count as this case's.
        flush_query_log(&control).await;
        control.query("TRUNCATE TABLE system.query_log").execute().await.unwrap();
        call(&cloud, method, path, &body).await;
        let statements = logged_selects(&control).await;
        if o.show_sql {
            for sql in &statements {
                let ms = client_time(server.tcp_port(), sql) * 1000.0;
                println!(
                    "    {ms:>8.1} ms  {}",
                    sql.split_whitespace().collect::<Vec<_>>().join(" ")
                );
            }
        }
        let (mut ours, mut raw) = (Vec::new(), Vec::new());
        for run in 0..o.runs {
            let replay = || statements.iter().map(|sql| client_time(server.tcp_port(), sql)).sum();
            if run % 2 == 0 {
                ours.push(call(&cloud, method, path, &body).await);
                raw.push(replay());
            } else {
                raw.push(replay());
                ours.push(call(&cloud, method, path, &body).await);
            }
        }
        let (ours, raw) = (median(&mut ours) * 1000.0, median(&mut raw) * 1000.0);
        let ratio = ours / raw.max(1e-9);
        println!(
            "| {label} | {} | {ours:.1} ms | {raw:.1} ms | {ratio:.2} | {} |",
            statements.len(),
            if ratio <= 1.3 { "met" } else { "missed" }
        );
    }
    drop(cloud);
}

#[tokio::main]
async fn main() {
    let o = options();
    let wants = |part: &str| o.only.as_deref().is_none_or(|only| only == part);
    if wants("insert") {
        insert_part(&o).await;
    }
    if wants("queries") {
        queries_part(&o).await;
    }
}
