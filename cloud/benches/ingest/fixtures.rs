//! What the benchmark runs against: the envelopes, the real cloud router
//! (state built by `server::build_state`, as the binary builds it), the
//! no-op axum server, and the raw-engine baseline.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::http::{StatusCode, header};
use axum::routing::post;
use bytes::Bytes;
use opgraph_cloud::api::{self, AppState};
use opgraph_cloud::config::Config;
use opgraph_cloud::store::NewEvent;
use opgraph_cloud::store::embedded::{
    append_in_transaction, build_search_index, open_writer_connection, prepare_events,
};
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::load::BodyMaker;

/// The bootstrap (operator) key of every bench server.
pub const BENCH_KEY: &str = "og_bench0000000000000000000000000000";
pub const WORKSPACE: &str = opgraph_cloud::server::DEFAULT_WORKSPACE;

/// Writes envelope number `n`: a scanner reading an item on a line, with a
/// W3C-style trace id (random, shared by 4 consecutive events), attribution
/// and a few properties, timestamped now; about 330 bytes of JSON. No
/// `messageId`, so every envelope is a new event. Ids and timestamps move
/// like live traffic's: indexes see the insert pattern they see in
/// production, not the same keys again and again.
fn write_envelope(out: &mut String, n: u64) {
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
        opgraph_cloud::now_ms(),
    );
}

/// A well-mixed 64-bit function of `x` (SplitMix64's finaliser).
fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Request bodies of `size` envelopes: one bare envelope when `size` is
/// 1, else `{"batch": [...]}`. Numbering is shared by every caller of one
/// maker, so no two requests repeat an envelope.
pub fn body_maker(size: usize) -> BodyMaker {
    let counter = Arc::new(AtomicU64::new(0));
    Arc::new(move || {
        let first = counter.fetch_add(size as u64, Ordering::Relaxed);
        let mut out = String::with_capacity(size * 360 + 16);
        if size == 1 {
            write_envelope(&mut out, first);
        } else {
            out.push_str(r#"{"batch":["#);
            for n in first..first + size as u64 {
                if n > first {
                    out.push(',');
                }
                write_envelope(&mut out, n);
            }
            out.push_str("]}");
        }
        Bytes::from(out)
    })
}

/// A server running on the server runtime until [`Server::stop`].
pub struct Server {
    pub addr: SocketAddr,
    shutdown: CancellationToken,
    task: JoinHandle<()>,
    state: Option<AppState>,
}

async fn serve(router: Router, state: Option<AppState>) -> Server {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind 127.0.0.1:0");
    let addr = listener.local_addr().expect("local addr");
    let shutdown = CancellationToken::new();
    let stop = shutdown.clone();
    // As `server::run` serves it, limits and all; the no-op too.
    let limits = opgraph_proto::serve::ServeLimits::default();
    let task =
        tokio::spawn(opgraph_proto::serve::serve(listener, router, limits, stop.cancelled_owned()));
    Server { addr, shutdown, task, state }
}

/// The real cloud on the embedded store in `dir`: rate limiting off, the
/// bench key as bootstrap key, the rest as the cloud's environment sets it
/// (defaults, or e.g. `OPGRAPH_WRITER_CACHE` to compare store settings).
pub async fn start_cloud(dir: &Path) -> Server {
    let mut config =
        Config::load(None, |name| std::env::var(name).ok()).expect("the cloud's environment");
    config.store.data_dir = dir.to_path_buf();
    config.auth.bootstrap_key = Some(BENCH_KEY.to_owned());
    config.rate_limit.requests_per_second = 0;
    let state = opgraph_cloud::server::build_state(config).await.expect("cloud state");
    serve(api::routes().into_router(state.clone()), Some(state)).await
}

/// The same axum/hyper stack with one handler that reads the body and
/// answers 202 with a tiny JSON body: the ceiling for any handler.
pub async fn start_noop() -> Server {
    async fn noop(
        _body: Bytes,
    ) -> (StatusCode, [(header::HeaderName, &'static str); 1], &'static str) {
        (StatusCode::ACCEPTED, [(header::CONTENT_TYPE, "application/json")], r#"{"accepted":1}"#)
    }
    serve(Router::new().route("/noop", post(noop)), None).await
}

/// [`start_noop`] served by plain `axum::serve`, without the limits of
/// `opgraph_proto::serve`: the baseline of what those cost.
pub async fn start_noop_plain() -> Server {
    async fn noop(
        _body: Bytes,
    ) -> (StatusCode, [(header::HeaderName, &'static str); 1], &'static str) {
        (StatusCode::ACCEPTED, [(header::CONTENT_TYPE, "application/json")], r#"{"accepted":1}"#)
    }
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind 127.0.0.1:0");
    let addr = listener.local_addr().expect("local addr");
    let shutdown = CancellationToken::new();
    let stop = shutdown.clone();
    let router = Router::new().route("/noop", post(noop));
    let task = tokio::spawn(async move {
        let app = router.into_make_service_with_connect_info::<SocketAddr>();
        let served = axum::serve(listener, app).with_graceful_shutdown(stop.cancelled_owned());
        served.await.expect("serve");
    });
    Server { addr, shutdown, task, state: None }
}

impl Server {
    /// Stops serving (after the clients have gone), then closes the store.
    pub async fn stop(self) {
        self.shutdown.cancel();
        self.task.await.expect("server task");
        if let Some(state) = self.state {
            state.store.close().await.expect("close store");
        }
    }
}

/// The raw-engine baseline: the store's own write path
/// (`append_in_transaction`: same schema, same prepared statements, event
/// rows + rollups + usage) on a writer connection with `synchronous =
/// FULL`, one transaction per batch, then the search index of the measured
/// batches (`build_search_index`, which the store runs on a thread of its
/// own), without HTTP, JSON, validation or the writer thread. Only the
/// transactions and the indexing are timed; parsing the envelopes and
/// flattening them into rows happens outside the clock.
///
/// Runs `warmup` of timed work unmeasured, then `measure`; returns events
/// per second of timed work.
pub fn raw_insert(dir: &Path, batches: &BodyMaker, warmup: Duration, measure: Duration) -> f64 {
    let conn = open_writer_connection(dir).expect("open raw writer");
    let (mut warm, mut timed, mut events) = (Duration::ZERO, Duration::ZERO, 0u64);
    while timed < measure {
        let now = opgraph_cloud::now_ms();
        let body: Value = serde_json::from_slice(&batches()).expect("bench JSON");
        let parsed = api::ingest::parse_body(body, now).expect("valid batch");
        let rows = prepare_events(
            parsed
                .into_iter()
                .map(|event| NewEvent {
                    id: opgraph_cloud::ids::new_id("evt"),
                    received_at: now,
                    event,
                })
                .collect(),
        );
        let started = Instant::now();
        let result = append_in_transaction(&conn, WORKSPACE, rows, None).expect("raw append");
        let took = started.elapsed();
        if warm < warmup {
            warm += took;
            if warm >= warmup {
                // The warm-up's entries, outside the clock.
                build_search_index(&conn, |_| ()).expect("index the warm-up");
            }
        } else {
            timed += took;
            events += result.inserted as u64;
        }
    }
    let started = Instant::now();
    build_search_index(&conn, |_| ()).expect("index the measured batches");
    timed += started.elapsed();
    events as f64 / timed.as_secs_f64()
}
