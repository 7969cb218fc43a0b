//! The gateway process: builds the components from the configuration and
//! supervises them until shutdown.
//!
//! Tasks run under one [`TaskTracker`]; shutdown goes in steps, each with
//! its own [`CancellationToken`]: stop intake (the HTTP server finishes the
//! requests it has; device sources finish the append in progress and
//! acknowledge it), keep delivering for up to `shutdown_flush` until the
//! buffer is empty, stop the shipper, close the buffer (a final fsync).

use std::sync::Arc;

use tokio::sync::{Semaphore, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::buffer::{Buffer, LogBuffer, identity};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::http::{self, HttpState};
use crate::shipper::{Shipper, ShipperConfig, UplinkStatus};
use crate::source::Sources;
use crate::telemetry::Metrics;
use crate::uplink;

/// How long the HTTP server may take to finish its requests after the
/// buffer closed (requests blocked on a full buffer end then).
const HTTP_DRAIN: std::time::Duration = std::time::Duration::from_secs(5);

/// Runs the gateway until `shutdown` is cancelled; prints `listening
/// http=ADDR` on stdout once the local port accepts connections.
pub async fn run(config: Config, shutdown: CancellationToken) -> Result<()> {
    // Certificates first: a bad file is a configuration error.
    let uplink = uplink::build(&config.uplink)?;
    let buffer: Arc<dyn Buffer> = Arc::new(LogBuffer::open(config.buffer.clone()).await?);
    let buffer_id = identity::load_or_create(&config.buffer.dir)?;
    let sources = match Sources::build(&config.sources, &buffer, &config.buffer) {
        Ok(sources) => sources,
        Err(e) => {
            let _ = buffer.close().await;
            return Err(e);
        }
    };
    let metrics = Arc::new(Metrics::with_sources(Arc::clone(&buffer), Arc::clone(&sources.health)));
    let shipper = Shipper::new(
        Arc::clone(&buffer),
        uplink,
        ShipperConfig::new(
            &config.gateway_id,
            &buffer_id,
            Some(config.buffer.dir.clone()),
            &config.uplink,
        ),
        Arc::clone(&metrics),
    );
    let status = shipper.status();
    let state = HttpState {
        gateway_id: Arc::from(config.gateway_id.as_str()),
        buffer: Arc::clone(&buffer),
        metrics,
        uplink: status.clone(),
        sources: Arc::clone(&sources.health),
        body_limit: usize::try_from(config.http.body_limit.as_u64()).unwrap_or(usize::MAX),
        ingest_permits: Arc::new(Semaphore::new(config.http.ingest_concurrency)),
        ingest_tokens: config
            .http
            .ingest_token_sha256
            .iter()
            .map(|d| d.to_ascii_lowercase())
            .collect(),
    };
    let addr = config.http.addr;
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(|source| Error::Listen {
        key: "http.addr",
        addr,
        source,
    })?;
    let bound =
        listener.local_addr().map_err(|source| Error::Listen { key: "http.addr", addr, source })?;
    if let Some(broker) = &sources.broker {
        announce(&format!("listening mqtt={}", broker.addr));
    }
    for (name, addr) in &sources.listening {
        announce(&format!("listening {name}={addr}"));
    }
    announce(&format!("listening http={bound}"));
    tracing::info!(%bound, gateway = %config.gateway_id, "gateway started");
    let open = config.http.ingest_token_sha256.is_empty();
    crate::source::warn_if_open(bound, open, "POST /ingest", "http.ingest_token_sha256");

    let tasks = TaskTracker::new();
    let intake = CancellationToken::new();
    let delivery = CancellationToken::new();
    let stop_intake = intake.clone();
    let limits = config.http.limits();
    let mut server = tokio::spawn(async move {
        let app = http::router(state);
        opgraph_proto::serve::serve(listener, app, limits, stop_intake.cancelled_owned()).await;
    });
    tasks.spawn(shipper.run(delivery.clone()));
    tasks.close();
    let devices = TaskTracker::new();
    for (source, source_intake) in sources.sources {
        let span = tracing::info_span!("source", name = %source.name(), kind = source.kind());
        let stop = intake.clone();
        let run = async move {
            if let Err(e) = source.run(source_intake, stop).await {
                tracing::error!(error = %e, "source stopped");
            }
        };
        devices.spawn(tracing::Instrument::instrument(run, span));
    }
    devices.close();

    shutdown.cancelled().await;
    tracing::info!(flush = ?config.shutdown_flush, "shutting down: intake stopped, flushing");
    intake.cancel();
    let deadline = Instant::now() + config.shutdown_flush;
    if tokio::time::timeout_at(deadline, devices.wait()).await.is_err() {
        tracing::warn!("device sources still stopping at the flush deadline");
    }
    let mut server_done = tokio::time::timeout_at(deadline, &mut server).await.is_ok();
    let delivered = drained(buffer.as_ref(), status, deadline).await;
    if !delivered {
        let pending = buffer.stats().pending_records;
        tracing::warn!(pending, "shutdown flush ended with events still buffered");
    }
    delivery.cancel();
    tasks.wait().await;
    let closed = buffer.close().await;
    if !server_done {
        server_done = tokio::time::timeout(HTTP_DRAIN, server).await.is_ok();
    }
    if !server_done {
        tracing::warn!("HTTP requests still open at exit");
    }
    closed
}

/// Waits until the buffer holds nothing unacknowledged, or `deadline`.
/// Wakes on acknowledgements (uplink status) and appends (watermark).
async fn drained(
    buffer: &dyn Buffer,
    mut status: watch::Receiver<UplinkStatus>,
    deadline: Instant,
) -> bool {
    let mut watermark = buffer.subscribe();
    loop {
        if buffer.stats().pending_records == 0 {
            return true;
        }
        tokio::select! {
            _ = tokio::time::sleep_until(deadline) => return false,
            changed = status.changed() => if changed.is_err() { return false },
            changed = watermark.changed() => if changed.is_err() { return false },
        }
    }
}

/// One line on stdout, flushed at once (harnesses wait for it).
fn announce(line: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}
