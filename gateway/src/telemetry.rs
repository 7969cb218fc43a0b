//! Prometheus metrics of the gateway, served at `GET /metrics`.
//!
//! The ingest endpoint and the shipper count into [`Metrics`]; the buffer's
//! own counters are read from [`Buffer::stats`] at each scrape (a
//! collector), so they can never drift from what health reports. Counters
//! end in `_total`; label values are small fixed sets.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::registry::Registry;

use tracing::field::{Field, Visit};
use tracing_subscriber::fmt::format::{FormatEvent, FormatFields, Writer, format};
use tracing_subscriber::fmt::{FmtContext, MakeWriter};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

use crate::buffer::Buffer;
use crate::source::SourceSet;
use crate::source::health::SourceCollector;
use crate::uplink::PathStats;

/// Logs to stderr at `OPGRAPH_LOG` (`EnvFilter` syntax; default `info`,
/// rumqttd at `warn`: the embedded broker logs every connection at info).
pub fn init_logging() {
    let levels = EnvFilter::try_from_env("OPGRAPH_LOG")
        .unwrap_or_else(|_| EnvFilter::new("info,rumqttd=warn"));
    let layer = log_layer(std::io::stderr).with_filter(levels);
    let _ = tracing_subscriber::registry().with(layer).try_init();
}

/// The gateway's log lines, written to `writer`: tracing's usual format,
/// without the errors rumqttd (the embedded broker) logs for what is
/// routine, `router-drop` with `Recv(Disconnected)` whenever a device
/// disconnects cleanly and `connection-stop`. An operator would read a
/// flood of them as a broken broker; its real failures stay. (Left out
/// when formatting: tracing-subscriber's per-event filters of one layer
/// can drop the next event on the same thread too.)
pub fn log_layer<S, W>(writer: W) -> impl Layer<S>
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    tracing_subscriber::fmt::layer().with_writer(writer).event_format(WithoutNoise(format()))
}

struct WithoutNoise<F>(F);

impl<S, N, F> FormatEvent<S, N> for WithoutNoise<F>
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
    N: for<'w> FormatFields<'w> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        writer: Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        if routine_noise(event) {
            return Ok(());
        }
        self.0.format_event(ctx, writer, event)
    }
}

fn routine_noise(event: &tracing::Event<'_>) -> bool {
    let meta = event.metadata();
    if *meta.level() != tracing::Level::ERROR || meta.target() != "rumqttd::server::broker" {
        return false;
    }
    let mut said = Said::default();
    event.record(&mut said);
    said.message == "connection-stop"
        || (said.message == "router-drop" && said.error == "Recv(Disconnected)")
}

/// The message and `error` field of an event.
#[derive(Default)]
struct Said {
    message: String,
    error: String,
}

impl Visit for Said {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        match field.name() {
            "message" => self.message = format!("{value:?}"),
            "error" => self.error = format!("{value:?}"),
            _ => {}
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: String,
}

/// Everything the gateway counts.
pub struct Metrics {
    registry: Registry,
    /// Events appended durably by the local ingest endpoint.
    pub events_accepted: Counter,
    /// Ingest requests refused, by reason (`validation_failed`, ...).
    pub ingest_rejections: Family<ReasonLabels, Counter>,
    /// Batches handed to the uplink.
    pub batches_sent: Counter,
    /// Events in those batches.
    pub events_sent: Counter,
    /// Batches the cloud acknowledged.
    pub batches_acked: Counter,
    /// Batches in flight when a session ended: they are sent again.
    pub batches_retried: Counter,
    /// Batches the cloud rejected as malformed (a bug: logged).
    pub batches_rejected: Counter,
    /// Sessions opened after the first one.
    pub reconnects: Counter,
    /// Sessions that failed or ended, by reason.
    pub uplink_errors: Family<ReasonLabels, Counter>,
    /// Highest sequence the cloud acknowledged.
    pub last_acked_sequence: Gauge,
    /// 1 while a session is open.
    pub uplink_connected: Gauge,
    /// The transport's own path measurements (QUIC; see
    /// [`crate::uplink::PathStats`]), copied by the shipper.
    pub uplink_sent_packets: Counter,
    pub uplink_lost_packets: Counter,
    pub uplink_congestion_events: Counter,
    pub uplink_noise_losses: Counter,
    pub uplink_rtt_seconds: Gauge<f64, AtomicU64>,
}

impl Metrics {
    /// The metrics, with the buffer's counters read from `buffer`.
    pub fn new(buffer: Arc<dyn Buffer>) -> Self {
        Self::with_sources(buffer, Arc::default())
    }

    /// Also with every device source's counters (`source_*`).
    pub fn with_sources(buffer: Arc<dyn Buffer>, sources: Arc<SourceSet>) -> Self {
        let mut registry = Registry::with_prefix("opgraph_gateway");
        let metrics = Metrics {
            events_accepted: Counter::default(),
            ingest_rejections: Family::default(),
            batches_sent: Counter::default(),
            events_sent: Counter::default(),
            batches_acked: Counter::default(),
            batches_retried: Counter::default(),
            batches_rejected: Counter::default(),
            reconnects: Counter::default(),
            uplink_errors: Family::default(),
            last_acked_sequence: Gauge::default(),
            uplink_connected: Gauge::default(),
            uplink_sent_packets: Counter::default(),
            uplink_lost_packets: Counter::default(),
            uplink_congestion_events: Counter::default(),
            uplink_noise_losses: Counter::default(),
            uplink_rtt_seconds: Gauge::default(),
            registry: Registry::default(),
        };
        let m = &metrics;
        registry.register(
            "events_accepted",
            "Events appended durably by local ingest",
            m.events_accepted.clone(),
        );
        registry.register(
            "ingest_rejections",
            "Local ingest requests refused, by reason",
            m.ingest_rejections.clone(),
        );
        registry.register("batches_sent", "Batches handed to the uplink", m.batches_sent.clone());
        registry.register("events_sent", "Events in batches sent", m.events_sent.clone());
        registry.register(
            "batches_acked",
            "Batches the cloud acknowledged",
            m.batches_acked.clone(),
        );
        registry.register(
            "batches_retried",
            "Batches in flight when a session ended, to be sent again",
            m.batches_retried.clone(),
        );
        registry.register(
            "batches_rejected",
            "Batches the cloud rejected as malformed",
            m.batches_rejected.clone(),
        );
        registry.register(
            "reconnects",
            "Uplink sessions opened after the first",
            m.reconnects.clone(),
        );
        registry.register(
            "uplink_errors",
            "Uplink sessions that failed or ended, by reason",
            m.uplink_errors.clone(),
        );
        registry.register(
            "last_acked_sequence",
            "Highest sequence the cloud acknowledged",
            m.last_acked_sequence.clone(),
        );
        registry.register(
            "uplink_connected",
            "1 while an uplink session is open",
            m.uplink_connected.clone(),
        );
        registry.register(
            "uplink_sent_packets",
            "Packets the uplink sent (QUIC only)",
            m.uplink_sent_packets.clone(),
        );
        registry.register(
            "uplink_lost_packets",
            "Packets the uplink declared lost and sent again (QUIC only)",
            m.uplink_lost_packets.clone(),
        );
        registry.register(
            "uplink_congestion_events",
            "Losses and ECN marks the uplink's congestion controller saw (QUIC only)",
            m.uplink_congestion_events.clone(),
        );
        registry.register(
            "uplink_noise_losses",
            "Of those, losses read as link noise, without backing off (QUIC, loss_tolerant)",
            m.uplink_noise_losses.clone(),
        );
        registry.register(
            "uplink_rtt_seconds",
            "Smoothed round trip of the uplink session (QUIC only)",
            m.uplink_rtt_seconds.clone(),
        );
        registry.register_collector(Box::new(BufferCollector { buffer }));
        registry.register_collector(Box::new(SourceCollector(sources)));
        Metrics { registry, ..metrics }
    }

    /// Counts one uplink error of kind `reason`.
    pub fn uplink_error(&self, reason: &str) {
        self.uplink_errors.get_or_create(&ReasonLabels { reason: reason.to_owned() }).inc();
    }

    /// Counts one refused ingest request.
    pub fn ingest_rejected(&self, reason: &str) {
        self.ingest_rejections.get_or_create(&ReasonLabels { reason: reason.to_owned() }).inc();
    }

    /// Copies the uplink's path counters, given what was copied before.
    pub fn record_path(&self, seen: &mut PathStats, now: PathStats) {
        let add = |counter: &Counter, before: u64, after: u64| {
            counter.inc_by(after.saturating_sub(before));
        };
        add(&self.uplink_sent_packets, seen.sent_packets, now.sent_packets);
        add(&self.uplink_lost_packets, seen.lost_packets, now.lost_packets);
        add(&self.uplink_congestion_events, seen.congestion_events, now.congestion_events);
        add(&self.uplink_noise_losses, seen.noise_losses, now.noise_losses);
        self.uplink_rtt_seconds.set(now.rtt.as_secs_f64());
        *seen = now;
    }

    /// The text exposition format.
    pub fn render(&self) -> String {
        let mut out = String::new();
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            tracing::error!(error = %e, "metrics encoding failed");
        }
        out
    }
}

/// Reads [`Buffer::stats`] at scrape time.
struct BufferCollector {
    buffer: Arc<dyn Buffer>,
}

impl std::fmt::Debug for BufferCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BufferCollector")
    }
}

fn gauge(encoder: &mut DescriptorEncoder, name: &str, help: &str, value: u64) -> std::fmt::Result {
    let metric = ConstGauge::new(i64::try_from(value).unwrap_or(i64::MAX));
    metric.encode(encoder.encode_descriptor(name, help, None, metric.metric_type())?)
}

fn counter(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    value: u64,
) -> std::fmt::Result {
    let metric = ConstCounter::new(value);
    metric.encode(encoder.encode_descriptor(name, help, None, metric.metric_type())?)
}

impl Collector for BufferCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let s = self.buffer.stats();
        let e = &mut encoder;
        gauge(
            e,
            "buffer_pending_records",
            "Sequences stored and not yet acknowledged",
            s.pending_records,
        )?;
        gauge(e, "buffer_pending_bytes", "Bytes of buffer segment files", s.pending_bytes)?;
        counter(e, "buffer_appended", "Records made durable", s.appended_total)?;
        counter(e, "buffer_acked", "Sequences acknowledged", s.acked_total)?;
        counter(
            e,
            "buffer_dropped",
            "Unacknowledged records dropped by drop_oldest",
            s.dropped_total,
        )?;
        counter(
            e,
            "buffer_corrupt_skipped",
            "Records lost to corruption",
            s.corrupt_skipped_total,
        )?;
        counter(e, "buffer_io_errors", "Failed buffer file operations", s.io_errors_total)?;
        gauge(e, "buffer_degraded", "1 while the buffer's disk is failing", u64::from(s.degraded))?;
        gauge(e, "buffer_next_sequence", "Sequence the next record will get", s.next_seq)?;
        Ok(())
    }
}
