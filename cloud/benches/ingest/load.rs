//! The load generator: N keep-alive HTTP/1.1 connections (hyper's
//! connection-level client, no pool), each sending one request after the
//! other for a fixed time and counting the answers that complete inside the
//! measured window (completions per second, the usual throughput measure).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HOST, HeaderValue};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// Makes the body of each request (fresh ids and timestamps each time).
pub type BodyMaker = Arc<dyn Fn() -> Bytes + Send + Sync>;

/// One kind of request, sent again and again.
#[derive(Clone)]
pub struct Target {
    pub addr: SocketAddr,
    pub path: &'static str,
    pub bearer: Option<HeaderValue>,
    pub body: BodyMaker,
    /// The status every answer must have.
    pub expect: u16,
}

/// What a load run measured.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Answers with the expected status inside the window.
    pub ok: u64,
    /// Answers with another status, or transport errors (the run fails).
    pub failed: u64,
    pub window: Duration,
    /// Latency of each counted answer, microseconds.
    pub latencies_us: Vec<u32>,
}

impl Outcome {
    pub fn per_second(&self) -> f64 {
        self.ok as f64 / self.window.as_secs_f64()
    }

    /// The `q` quantile of latency in milliseconds (0 when nothing counted).
    pub fn latency_ms(&mut self, q: f64) -> f64 {
        if self.latencies_us.is_empty() {
            return 0.0;
        }
        self.latencies_us.sort_unstable();
        let i = ((self.latencies_us.len() - 1) as f64 * q).round() as usize;
        f64::from(self.latencies_us[i]) / 1000.0
    }
}

/// Runs `connections` connections against `target` on the current runtime:
/// `warmup` unmeasured, then `measure`. Returns when every connection has
/// had its last answer (each request is bounded by a timeout).
pub async fn run(
    target: &Target,
    connections: usize,
    warmup: Duration,
    measure: Duration,
) -> Outcome {
    let start = Instant::now() + warmup;
    let end = start + measure;
    let tasks: Vec<_> =
        (0..connections).map(|_| tokio::spawn(connection(target.clone(), start, end))).collect();
    let mut total = Outcome { window: measure, ..Outcome::default() };
    for task in tasks {
        let part = task.await.expect("load connection panicked");
        total.ok += part.ok;
        total.failed += part.failed;
        total.latencies_us.extend(part.latencies_us);
    }
    total
}

async fn connection(target: Target, start: Instant, end: Instant) -> Outcome {
    const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
    let mut out = Outcome::default();
    let stream = TcpStream::connect(target.addr).await.expect("connect to the bench server");
    stream.set_nodelay(true).expect("TCP_NODELAY");
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake::<_, Full<Bytes>>(TokioIo::new(stream))
            .await
            .expect("HTTP/1.1 handshake");
    let driver = tokio::spawn(conn);
    let host = HeaderValue::from_str(&target.addr.to_string()).expect("host header");
    let json = HeaderValue::from_static("application/json");

    while Instant::now() < end {
        if sender.ready().await.is_err() {
            out.failed += 1;
            break;
        }
        let mut request = Request::post(target.path)
            .header(HOST, host.clone())
            .header(CONTENT_TYPE, json.clone())
            .body(Full::new((target.body)()))
            .expect("request");
        if let Some(bearer) = &target.bearer {
            request.headers_mut().insert(AUTHORIZATION, bearer.clone());
        }
        let sent = Instant::now();
        let answer = tokio::time::timeout(REQUEST_TIMEOUT, async {
            let response = sender.send_request(request).await?;
            let status = response.status().as_u16();
            response.into_body().collect().await?;
            Ok::<_, hyper::Error>(status)
        })
        .await;
        let done = Instant::now();
        match answer {
            Ok(Ok(status)) if status == target.expect => {
                if done >= start && done <= end {
                    out.ok += 1;
                    let us = done.duration_since(sent).as_micros();
                    out.latencies_us.push(u32::try_from(us).unwrap_or(u32::MAX));
                }
            }
            Ok(Ok(status)) => {
                out.failed += 1;
                eprintln!("unexpected status {status} from {}", target.path);
                break;
            }
            Ok(Err(e)) => {
                out.failed += 1;
                eprintln!("request to {} failed: {e}", target.path);
                break;
            }
            Err(_) => {
                out.failed += 1;
                eprintln!("request to {} timed out", target.path);
                break;
            }
        }
    }
    drop(sender);
    let _ = driver.await;
    out
}
