//! Governance enforcement benchmark (`cargo bench -p opgraph-cloud --bench
//! enforce`).
//!
//! Compares `POST /api/governance/enforce` (full path: authentication, body
//! validation, one read of decision, grant, contract and triggering event,
//! every rule, a receipt sealed onto its writer's hash chain and committed
//! durably with its `governance.enforced` event) with a plain authenticated
//! no-op `POST` (same extractors: credential and rate limit, JSON body;
//! answers 200 and does nothing), on the same router, the same connections
//! and the same load generator, alternating round by round so that load
//! from elsewhere on the machine hits both alike. Goal: enforce ≥ 0.5× the
//! no-op rate. After the run it checks through the API that the chain
//! verifies and holds exactly one receipt per answered call.
//!
//! Environment: `OPGRAPH_BENCH_SECONDS` measured seconds per phase (5),
//! `OPGRAPH_BENCH_ROUNDS` (3), `OPGRAPH_BENCH_CONNECTIONS` (32),
//! `OPGRAPH_BENCH_DIR` where the data directory goes (system temp dir; it
//! must be a real disk, or fsync costs nothing). Numbers: BENCHMARKS.md.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::http::StatusCode;
use axum::routing::post;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HOST};
use hyper_util::rt::TokioIo;
use opgraph_cloud::api::{self, AppState, JsonBody};
use opgraph_cloud::auth::Principal;
use opgraph_cloud::config::Config;
use serde_json::{Value, json};
use tokio::net::{TcpListener, TcpStream};

// The cloud binary's allocator (cloud/src/main.rs), so that the cloud
// measured here allocates as the one deployed does.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const KEY: &str = "og_benchenforce000000000000000000000";
const GOAL: f64 = 0.5;

fn env_num(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// The baseline: authenticated and metered like every handler, body read
/// and parsed, nothing else.
async fn noop(_principal: Principal, JsonBody(_body): JsonBody) -> StatusCode {
    StatusCode::OK
}

async fn serve(state: AppState) -> SocketAddr {
    let app = api::routes()
        .into_router(state.clone())
        .merge(Router::new().route("/bench/noop", post(noop)).with_state(state));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    // As `server::run` serves it, limits and all; the no-op too.
    let limits = opgraph_proto::serve::ServeLimits::default();
    tokio::spawn(opgraph_proto::serve::serve(listener, app, limits, std::future::pending()));
    addr
}

/// One request on a fresh connection, for setup.
async fn call(addr: SocketAddr, method: &str, path: &str, body: &Value) -> (u16, Value) {
    let mut sender = connect(addr).await;
    let request = Request::builder()
        .method(method)
        .uri(path)
        .header(HOST, addr.to_string())
        .header(AUTHORIZATION, format!("Bearer {KEY}"))
        .header(CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    let status = response.status().as_u16();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

async fn connect(addr: SocketAddr) -> hyper::client::conn::http1::SendRequest<Full<Bytes>> {
    let tcp = TcpStream::connect(addr).await.unwrap();
    tcp.set_nodelay(true).unwrap();
    let (sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await.unwrap();
    tokio::spawn(connection);
    sender
}

/// Drives `connections` keep-alive connections for `duration`, each sending
/// `body` to `path` back to back; returns answered 200s per second during
/// `duration`, and all 200s (the last requests finish after it).
async fn load(
    addr: SocketAddr,
    path: &'static str,
    body: Bytes,
    connections: usize,
    duration: Duration,
) -> (f64, u64) {
    let ok = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for _ in 0..connections {
        let (ok, stop, body) = (Arc::clone(&ok), Arc::clone(&stop), body.clone());
        tasks.push(tokio::spawn(async move {
            let mut sender = connect(addr).await;
            while !stop.load(Ordering::Relaxed) {
                let request = Request::post(path)
                    .header(HOST, "bench")
                    .header(AUTHORIZATION, format!("Bearer {KEY}"))
                    .header(CONTENT_TYPE, "application/json")
                    .body(Full::new(body.clone()))
                    .unwrap();
                let response = sender.send_request(request).await.unwrap();
                let status = response.status();
                let _ = response.into_body().collect().await.unwrap();
                assert_eq!(status, StatusCode::OK, "{path}");
                ok.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    let started = Instant::now();
    let before = ok.load(Ordering::Relaxed);
    tokio::time::sleep(duration).await;
    let done = ok.load(Ordering::Relaxed) - before;
    let elapsed = started.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.unwrap();
    }
    (done as f64 / elapsed, ok.load(Ordering::Relaxed))
}

fn main() {
    let seconds = env_num("OPGRAPH_BENCH_SECONDS", 5).max(1);
    let rounds = env_num("OPGRAPH_BENCH_ROUNDS", 3).clamp(1, 20);
    let connections = env_num("OPGRAPH_BENCH_CONNECTIONS", 32).clamp(1, 512) as usize;
    let base = std::env::var_os("OPGRAPH_BENCH_DIR").map_or_else(std::env::temp_dir, Into::into);
    let dir = tempfile::tempdir_in(base).unwrap();

    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async move {
        let config = Config::load(None, |name| match name {
            "OPGRAPH_DATA_DIR" => Some(dir.path().display().to_string()),
            "OPGRAPH_BOOTSTRAP_KEY" => Some(KEY.to_owned()),
            "OPGRAPH_RATE_LIMIT_RPS" => Some("0".to_owned()),
            _ => None,
        })
        .unwrap();
        let state = opgraph_cloud::server::build_state(config).await.unwrap();
        let addr = serve(state.clone()).await;

        // A decision, grant and contract under which the action is allowed,
        // and a T3 triggering event: every check runs and passes.
        let now = opgraph_cloud::now_ms();
        let (s, dec) = call(addr, "POST", "/api/governance/decision-objects",
            &json!({"title": "bench", "riskLevel": "low", "status": "approved"})).await;
        assert_eq!(s, 201, "{dec}");
        let (s, grt) = call(addr, "POST", "/api/governance/authority-grants",
            &json!({"grantee": "agent-1", "actions": ["refund"], "maxAmount": 1000, "currency": "EUR",
                "approvalThreshold": 500, "validFrom": now - 60_000, "validUntil": now + 86_400_000})).await;
        assert_eq!(s, 201, "{grt}");
        let (s, ctc) = call(addr, "POST", "/api/governance/context-contracts",
            &json!({"allowedActions": ["refund"], "requiredTrustTier": "T2",
                "requiredAttestationProviders": ["notary"], "requiredCompliance": ["SOC2"],
                "escrowAbove": 900})).await;
        assert_eq!(s, 201, "{ctc}");
        let (s, _) = call(addr, "POST", "/api/ingest",
            &json!({"event": "refund.requested", "traceId": "bench-trace", "trustTier": "T3"})).await;
        assert_eq!(s, 202);
        let enforce = json!({
            "decisionObjectId": dec["decisionObject"]["id"],
            "authorityGrantId": grt["authorityGrant"]["id"],
            "contextContractId": ctc["contextContract"]["id"],
            "proposedAction": {"action": "refund", "amount": 42.5, "currency": "EUR", "actor": "agent-1"},
            "attestation": {"provider": "notary"},
            "traceId": "bench-trace",
            "complianceMapping": {"SOC2": {}},
        });
        let (s, answer) = call(addr, "POST", "/api/governance/enforce", &enforce).await;
        assert_eq!((s, answer["outcome"].as_str()), (200, Some("allow")), "{answer}");
        let enforce = Bytes::from(enforce.to_string());
        // The same bytes to both, so body reading and parsing cost alike.
        let noop_body = enforce.clone();

        // Warm-up, unmeasured.
        let second = Duration::from_secs(1);
        load(addr, "/bench/noop", noop_body.clone(), connections, second).await;
        let mut receipts = 1 + load(addr, "/api/governance/enforce", enforce.clone(), connections, second).await.1;

        let duration = Duration::from_secs(seconds);
        let (mut noops, mut enforces) = (Vec::new(), Vec::new());
        println!("round  no-op POST/s  enforce/s  ratio");
        for round in 1..=rounds {
            let (n, _) = load(addr, "/bench/noop", noop_body.clone(), connections, duration).await;
            let (e, answered) =
                load(addr, "/api/governance/enforce", enforce.clone(), connections, duration).await;
            receipts += answered;
            println!("{round:>5}  {n:>12.0}  {e:>9.0}  {:.2}", e / n);
            noops.push(n);
            enforces.push(e);
        }
        let median = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let (n, e) = (median(&mut noops), median(&mut enforces));
        let ratio = e / n;
        println!(
            "median: no-op {n:.0}/s, enforce {e:.0}/s, ratio {ratio:.2} (goal >= {GOAL}) {}",
            if ratio >= GOAL { "MET" } else { "MISSED" }
        );

        // Every answered call left exactly one receipt, and the chain holds.
        // Verification is paged, so the walk follows `next` to the end.
        let (mut checked, mut query) = (0, String::new());
        for _ in 0..1000 {
            let path = format!("/api/governance/receipts/verify?limit=20000{query}");
            let (s, report) = call(addr, "GET", &path, &Value::Null).await;
            assert_eq!(s, 200, "{report}");
            assert_eq!(report["valid"], true, "{report}");
            checked += report["checkedReceipts"].as_u64().unwrap();
            if report["complete"] == true {
                break;
            }
            query = report["next"]
                .as_object()
                .unwrap()
                .iter()
                .map(|(k, v)| format!("&{k}={}", v.as_str().map_or_else(|| v.to_string(), str::to_owned)))
                .collect();
        }
        assert_eq!(checked, receipts, "one receipt per answered call");
        println!(
            "chain verified: {checked} receipts, valid=true ({connections} connections, {seconds}s x {rounds} rounds)"
        );
        state.store.close().await.unwrap();
    });
}
