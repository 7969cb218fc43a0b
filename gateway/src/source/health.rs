//! What every source counts: connected or not, last message time,
//! accepted, rejected by reason, dropped, clock corrections. Read by
//! `/health` ([`SourceSet::to_json`]) and `/metrics` ([`SourceCollector`]),
//! so both always agree.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use serde_json::{Value, json};

/// One source's counters.
#[derive(Debug)]
pub struct SourceHealth {
    pub name: String,
    pub kind: &'static str,
    connected: AtomicBool,
    /// Ms since the epoch of the last message received; 0 = none yet.
    last_message_ms: AtomicI64,
    received: AtomicU64,
    accepted: AtomicU64,
    dropped: AtomicU64,
    clock_skew: AtomicU64,
    throttled: AtomicU64,
    resent: AtomicU64,
    retained_replayed: AtomicU64,
    /// An MQTT source stopped recognising what its broker sends again
    /// (see `mqtt/redelivery.rs`): copies may be stored twice meanwhile.
    resend_check_given_up: AtomicBool,
    rejected: Mutex<BTreeMap<&'static str, u64>>,
    /// Device connections open now, and those closed at once for want of
    /// a place (sources devices connect to: the MQTT ingest endpoint).
    connections: AtomicU64,
    connections_refused: AtomicU64,
    last_error: Mutex<Option<String>>,
    /// Ms since the epoch of the last rejection logged as a warning.
    last_warning_ms: AtomicI64,
}

impl SourceHealth {
    pub fn new(name: &str, kind: &'static str) -> Self {
        SourceHealth {
            name: name.to_owned(),
            kind,
            connected: AtomicBool::new(false),
            last_message_ms: AtomicI64::new(0),
            received: AtomicU64::new(0),
            accepted: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            clock_skew: AtomicU64::new(0),
            throttled: AtomicU64::new(0),
            resent: AtomicU64::new(0),
            retained_replayed: AtomicU64::new(0),
            resend_check_given_up: AtomicBool::new(false),
            rejected: Mutex::new(BTreeMap::new()),
            connections: AtomicU64::new(0),
            connections_refused: AtomicU64::new(0),
            last_error: Mutex::new(None),
            last_warning_ms: AtomicI64::new(i64::MIN),
        }
    }

    pub fn set_connected(&self, connected: bool) {
        self.connected.store(connected, Ordering::Relaxed);
    }

    /// The last connection error (kept after reconnecting, for
    /// diagnosis).
    pub fn set_error(&self, error: String) {
        *self.last_error.lock().unwrap_or_else(|e| e.into_inner()) = Some(error);
    }

    pub fn connected(&self) -> bool {
        self.connected.load(Ordering::Relaxed)
    }

    /// A message arrived at `now_ms`.
    pub fn received(&self, now_ms: i64) {
        self.received.fetch_add(1, Ordering::Relaxed);
        self.last_message_ms.fetch_max(now_ms, Ordering::Relaxed);
    }

    /// `n` events became durable.
    pub fn accepted(&self, n: u64) {
        self.accepted.fetch_add(n, Ordering::Relaxed);
    }

    /// `n` events were given up after they mapped (the buffer refused them
    /// for good); logged where it happens.
    pub fn dropped(&self, n: u64) {
        self.dropped.fetch_add(n, Ordering::Relaxed);
    }

    /// An event got the receive time instead of the device's.
    pub fn clock_skewed(&self) {
        self.clock_skew.fetch_add(1, Ordering::Relaxed);
    }

    /// A message held back by its rule's throttle (acknowledged, not stored).
    pub fn throttled(&self) {
        self.throttled.fetch_add(1, Ordering::Relaxed);
    }

    /// `n` messages the broker sent again after they were stored
    /// (acknowledged, not stored twice).
    pub fn resent(&self, n: u64) {
        self.resent.fetch_add(n, Ordering::Relaxed);
    }

    /// `n` retained messages a resumed session had brought already
    /// (acknowledged, not stored again; `mqtt::Retained`).
    pub fn retained_replayed(&self, n: u64) {
        self.retained_replayed.fetch_add(n, Ordering::Relaxed);
    }

    /// The source stopped (`true`) or resumed recognising resends.
    pub fn set_resend_check_given_up(&self, given_up: bool) {
        self.resend_check_given_up.store(given_up, Ordering::Relaxed);
    }

    fn resend_check_given_up(&self) -> bool {
        self.resend_check_given_up.load(Ordering::Relaxed)
    }

    /// Whether a line about this source at `now_ms` may be logged above
    /// debug (a rejection, a device's connection closed): at most one a
    /// second per source, so that a misbehaving fleet cannot flood the log.
    pub fn may_log(&self, now_ms: i64) -> bool {
        let last = self.last_warning_ms.load(Ordering::Relaxed);
        now_ms.saturating_sub(last) >= 1000
            && self
                .last_warning_ms
                .compare_exchange(last, now_ms, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }

    /// Counts a rejection at `now_ms` and logs `why`. A device sending
    /// garbage at full speed must not flood the log: one warning a second
    /// per source, the rest at debug (all counted).
    pub fn reject(&self, reason: &'static str, why: &dyn std::fmt::Display, now_ms: i64) {
        self.rejected(reason);
        if self.may_log(now_ms) {
            tracing::warn!(source = %self.name, kind = self.kind, reason, "input rejected: {why}");
        } else {
            tracing::debug!(source = %self.name, kind = self.kind, reason, "input rejected: {why}");
        }
    }

    /// A message did not become an event, for `reason`.
    pub fn rejected(&self, reason: &'static str) {
        let mut rejected = self.rejected.lock().unwrap_or_else(|e| e.into_inner());
        *rejected.entry(reason).or_default() += 1;
    }

    /// A device connected; it counts as connected until the guard drops.
    pub fn connection_opened(self: &Arc<Self>) -> OpenConnection {
        self.connections.fetch_add(1, Ordering::Relaxed);
        OpenConnection(Arc::clone(self))
    }

    /// A device's connection was closed at once: no place for it.
    pub fn connection_refused(&self) {
        self.connections_refused.fetch_add(1, Ordering::Relaxed);
    }

    fn rejected_by_reason(&self) -> BTreeMap<&'static str, u64> {
        self.rejected.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The `/health` entry.
    pub fn to_json(&self) -> Value {
        let rejected = self.rejected_by_reason();
        let last = self.last_message_ms.load(Ordering::Relaxed);
        json!({
            "name": self.name,
            "kind": self.kind,
            "connected": self.connected(),
            "last_message_ms": (last > 0).then_some(last),
            "received_total": self.received.load(Ordering::Relaxed),
            "accepted_total": self.accepted.load(Ordering::Relaxed),
            "rejected_total": rejected.values().sum::<u64>(),
            "rejected": rejected,
            "dropped_total": self.dropped.load(Ordering::Relaxed),
            "clock_skew_total": self.clock_skew.load(Ordering::Relaxed),
            "throttled_total": self.throttled.load(Ordering::Relaxed),
            "resent_total": self.resent.load(Ordering::Relaxed),
            "retained_replayed_total": self.retained_replayed.load(Ordering::Relaxed),
            "resend_check_given_up": self.resend_check_given_up(),
            "connections": self.connections.load(Ordering::Relaxed),
            "connections_refused_total": self.connections_refused.load(Ordering::Relaxed),
            "last_error": self.last_error.lock().unwrap_or_else(|e| e.into_inner()).clone(),
        })
    }
}

/// One device connection counted in [`SourceHealth`], until dropped.
#[derive(Debug)]
pub struct OpenConnection(Arc<SourceHealth>);

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.connections.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Every source's counters.
#[derive(Debug, Default)]
pub struct SourceSet {
    sources: Vec<Arc<SourceHealth>>,
}

impl SourceSet {
    pub fn new(sources: Vec<Arc<SourceHealth>>) -> Self {
        SourceSet { sources }
    }

    /// `/health`'s `sources` array.
    pub fn to_json(&self) -> Value {
        Value::Array(self.sources.iter().map(|s| s.to_json()).collect())
    }

    /// Whether any source is not connected to its device or broker, or
    /// stopped recognising resends (its guarantee fell to at least once).
    pub fn any_degraded(&self) -> bool {
        self.sources.iter().any(|s| !s.connected() || s.resend_check_given_up())
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SourceLabels {
    source: String,
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    source: String,
    kind: String,
    reason: String,
}

/// A metric's name, help and how to read it from a source.
type Metric<T> = (&'static str, &'static str, fn(&SourceHealth) -> T);

/// Reads every [`SourceHealth`] at scrape time.
#[derive(Debug)]
pub struct SourceCollector(pub Arc<SourceSet>);

impl Collector for SourceCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let sources = &self.0.sources;
        if sources.is_empty() {
            return Ok(());
        }
        let labels =
            |s: &SourceHealth| SourceLabels { source: s.name.clone(), kind: s.kind.into() };
        let gauges: [Metric<i64>; 4] = [
            ("source_connected", "1 while the source is connected to its device or broker", |s| {
                i64::from(s.connected())
            }),
            ("source_last_message_ms", "Time of the last message, ms since the epoch", |s| {
                s.last_message_ms.load(Ordering::Relaxed)
            }),
            (
                "source_resend_check_given_up",
                "1 while resends of the broker are not recognised (may be stored twice)",
                |s| i64::from(s.resend_check_given_up()),
            ),
            ("source_connections", "Device connections open (sources devices connect to)", |s| {
                i64::try_from(s.connections.load(Ordering::Relaxed)).unwrap_or(i64::MAX)
            }),
        ];
        for (name, help, read) in gauges {
            let gauge = ConstGauge::new(0i64);
            let mut family = encoder.encode_descriptor(name, help, None, gauge.metric_type())?;
            for s in sources {
                ConstGauge::new(read(s)).encode(family.encode_family(&labels(s))?)?;
            }
        }
        let counters: [Metric<u64>; 8] = [
            ("source_received", "Messages received", |s| s.received.load(Ordering::Relaxed)),
            ("source_accepted", "Events appended durably", |s| s.accepted.load(Ordering::Relaxed)),
            ("source_dropped", "Mapped events the buffer refused for good", |s| {
                s.dropped.load(Ordering::Relaxed)
            }),
            ("source_clock_skew", "Events whose device time was replaced", |s| {
                s.clock_skew.load(Ordering::Relaxed)
            }),
            ("source_throttled", "Messages held back by a rule's throttle", |s| {
                s.throttled.load(Ordering::Relaxed)
            }),
            ("source_resent", "Messages sent again by the broker after they were stored", |s| {
                s.resent.load(Ordering::Relaxed)
            }),
            ("source_retained_replayed", "Retained messages a resumed session had brought", |s| {
                s.retained_replayed.load(Ordering::Relaxed)
            }),
            ("source_connections_refused", "Device connections closed at once: no place", |s| {
                s.connections_refused.load(Ordering::Relaxed)
            }),
        ];
        for (name, help, read) in counters {
            let counter = ConstCounter::new(0u64);
            let mut family = encoder.encode_descriptor(name, help, None, counter.metric_type())?;
            for s in sources {
                ConstCounter::new(read(s)).encode(family.encode_family(&labels(s))?)?;
            }
        }
        let counter = ConstCounter::new(0u64);
        let mut family = encoder.encode_descriptor(
            "source_rejected",
            "Messages that did not become events, by reason",
            None,
            counter.metric_type(),
        )?;
        for s in sources {
            for (reason, n) in s.rejected_by_reason() {
                let labels = ReasonLabels {
                    source: s.name.clone(),
                    kind: s.kind.into(),
                    reason: reason.into(),
                };
                ConstCounter::new(n).encode(family.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejections_warn_at_most_once_a_second() {
        let health = SourceHealth::new("s", "mqtt");
        assert!(health.may_log(10_000));
        assert!(!health.may_log(10_500));
        assert!(health.may_log(11_000));
        assert!(!health.may_log(11_999));
    }

    #[test]
    fn a_source_that_stopped_recognising_resends_degrades_the_gateway() {
        let source = Arc::new(SourceHealth::new("s", "mqtt"));
        source.set_connected(true);
        let set = SourceSet::new(vec![Arc::clone(&source)]);
        assert!(!set.any_degraded());
        source.set_resend_check_given_up(true);
        assert!(set.any_degraded());
        assert_eq!(set.to_json()[0]["resend_check_given_up"], true);
        source.set_resend_check_given_up(false);
        assert!(!set.any_degraded());
    }
}
