//! `opgraph-history`: fills an embedded store with a long, realistic
//! history (`generate`), then times the query API against a cloud running
//! on it (`bench`). See docs/queries.md, "Performance".
//!
//! ```text
//! opgraph-history generate --dir /tmp/og10m --events 10000000
//! OPGRAPH_DATA_DIR=/tmp/og10m OPGRAPH_BOOTSTRAP_KEY=og_... opgraph-cloud &
//! opgraph-history bench --url http://127.0.0.1:8080 --key og_... --runs 20
//! ```

use std::io::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use opgraph_cloud::store::NewEvent;
use opgraph_cloud::store::embedded::{
    append_in_transaction, build_search_index, open_writer_connection, prepare_events,
};
use opgraph_simulators::history::{HistoryConfig, event, query_cases};

#[derive(Parser)]
#[command(about = "Generate a long event history and benchmark the query API on it")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Writes the history into an embedded store directory (new or
    /// existing) through the store's own insert path.
    Generate {
        #[arg(long)]
        dir: PathBuf,
        #[arg(long, default_value_t = 10_000_000)]
        events: u64,
        /// Days of history, ending now.
        #[arg(long, default_value_t = 30)]
        days: u32,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Events per transaction.
        #[arg(long, default_value_t = 50_000)]
        batch: u64,
        #[arg(long, default_value = "ws_default")]
        workspace: String,
    },
    /// Times each query endpoint of a running cloud: p50 and p95 of `runs`
    /// sequential calls after one warm-up call.
    Bench {
        #[arg(long)]
        url: String,
        #[arg(long)]
        key: String,
        #[arg(long, default_value_t = 20)]
        runs: usize,
    },
}

fn main() -> Result<()> {
    match Cli::parse().command {
        Command::Generate { dir, events, days, seed, batch, workspace } => {
            generate(dir, events, days, seed, batch.max(1), &workspace)
        }
        Command::Bench { url, key, runs } => {
            let runtime = tokio::runtime::Runtime::new()?;
            runtime.block_on(bench(&url, &key, runs.max(1)))
        }
    }
}

fn generate(
    dir: PathBuf,
    events: u64,
    days: u32,
    seed: u64,
    batch: u64,
    workspace: &str,
) -> Result<()> {
    // Refused while a cloud runs on `dir` (the connection takes its lock).
    let conn = open_writer_connection(&dir).map_err(|e| anyhow::anyhow!("{e}"))?;
    let cfg = HistoryConfig {
        events,
        end_ms: opgraph_cloud::now_ms(),
        span_ms: i64::from(days) * 86_400_000,
        seed,
    };
    let started = Instant::now();
    let mut done = 0u64;
    while done < events {
        let end = (done + batch).min(events);
        let chunk: Vec<NewEvent> = (done..end)
            .map(|n| NewEvent {
                id: format!("evt_h{seed:x}_{n:010}"),
                received_at: cfg.end_ms,
                event: event(n, &cfg),
            })
            .collect();
        append_in_transaction(&conn, workspace, prepare_events(chunk), None)
            .map_err(|e| anyhow::anyhow!("insert: {e}"))?;
        done = end;
        progress(done, events, started.elapsed());
    }
    eprintln!();
    // The index a cloud would otherwise build in the background on its
    // first start, while its searches wait.
    let indexing = Instant::now();
    eprintln!("indexing for search");
    build_search_index(&conn, |done| progress(done, events, indexing.elapsed()))
        .map_err(|e| anyhow::anyhow!("search index: {e}"))?;
    eprintln!();
    conn.execute_batch("ANALYZE; PRAGMA wal_checkpoint(TRUNCATE);").context("analyze")?;
    let secs = started.elapsed().as_secs_f64();
    println!(
        "generated {events} events into {} in {secs:.1} s ({:.0} events/s)",
        dir.display(),
        events as f64 / secs.max(1e-9)
    );
    Ok(())
}

/// `[#####.....]  45.0%  4500000/10000000  350000 ev/s  ETA 15 s`, redrawn
/// in place on stderr.
fn progress(done: u64, total: u64, elapsed: Duration) {
    const WIDTH: u64 = 30;
    let filled = (done * WIDTH / total.max(1)) as usize;
    let rate = done as f64 / elapsed.as_secs_f64().max(1e-9);
    let eta = (total - done) as f64 / rate.max(1e-9);
    eprint!(
        "\r[{}{}] {:5.1}%  {done}/{total}  {rate:.0} ev/s  ETA {eta:.0} s   ",
        "#".repeat(filled),
        ".".repeat(WIDTH as usize - filled),
        done as f64 * 100.0 / total.max(1) as f64,
    );
    let _ = std::io::stderr().flush();
}

async fn bench(url: &str, key: &str, runs: usize) -> Result<()> {
    let client = reqwest::Client::builder().timeout(Duration::from_secs(300)).build()?;
    println!("| query | p50 | p95 | max |");
    println!("|---|---|---|---|");
    for (label, method, path, body) in query_cases() {
        let mut times = Vec::with_capacity(runs);
        for i in 0..=runs {
            let request = match method {
                "GET" => client.get(format!("{url}{path}")),
                _ => client.post(format!("{url}{path}")).json(&body),
            };
            let started = Instant::now();
            let response = request.bearer_auth(key).send().await?;
            let status = response.status();
            let text = response.text().await?;
            let took = started.elapsed();
            if !status.is_success() || text.contains("\"errors\"") {
                bail!("{label}: {status} {text}");
            }
            if i > 0 {
                times.push(took);
            }
        }
        times.sort();
        let at = |q: f64| times[((times.len() - 1) as f64 * q).round() as usize];
        println!(
            "| {label} | {} | {} | {} |",
            ms(at(0.5)),
            ms(at(0.95)),
            ms(times[times.len() - 1])
        );
    }
    Ok(())
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}
