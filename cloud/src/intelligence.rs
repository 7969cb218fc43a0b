//! The I/O-free core of the intelligence endpoints (docs/queries.md): the
//! period diff, anomaly detection on hourly counts, the business health
//! score and the next-action rules. The store computes the aggregates;
//! these functions only combine them, so every backend gets the same
//! judgement from the same numbers.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;
use utoipa::ToSchema;

use crate::store::queries::{ConnectorLoad, RunSummary, SeriesPoint, Totals};

pub const HOUR_MS: i64 = 3_600_000;
pub const DAY_MS: i64 = 24 * HOUR_MS;

// ---------------------------------------------------------------------------
// Period diff.

#[derive(Debug, Clone, PartialEq, Serialize, ToSchema, async_graphql::SimpleObject)]
#[serde(rename_all = "camelCase")]
pub struct EventDiff {
    pub event: String,
    pub current: u64,
    pub previous: u64,
    pub delta: i64,
    /// Percent change against the previous period; `null` when the previous
    /// count is 0.
    pub pct_change: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PeriodDiff {
    pub revenue_delta: f64,
    /// The largest absolute changes first (ties by name), at most `limit`.
    pub event_diffs: Vec<EventDiff>,
    /// Event types seen now and not in the previous period, by name.
    pub new_event_types: Vec<String>,
    /// Event types of the previous period not seen now, by name.
    pub disappeared_event_types: Vec<String>,
}

/// Compares two periods' per-event totals (which must list every event
/// type of their period).
pub fn period_diff(current: &Totals, previous: &Totals, limit: usize) -> PeriodDiff {
    let mut counts: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
    for e in &current.events {
        counts.entry(&e.event_name).or_default().0 = e.count;
    }
    for e in &previous.events {
        counts.entry(&e.event_name).or_default().1 = e.count;
    }
    let mut diffs: Vec<EventDiff> = counts
        .iter()
        .map(|(event, &(cur, prev))| EventDiff {
            event: (*event).to_owned(),
            current: cur,
            previous: prev,
            delta: i64::try_from(cur).unwrap_or(i64::MAX) - i64::try_from(prev).unwrap_or(0),
            pct_change: (prev > 0)
                .then(|| round2((cur as f64 - prev as f64) * 100.0 / prev as f64)),
        })
        .collect();
    // By name (`counts` is ordered), at most `limit` each, as every list.
    let new_event_types =
        diffs.iter().filter(|d| d.previous == 0).map(|d| d.event.clone()).take(limit).collect();
    let disappeared_event_types =
        diffs.iter().filter(|d| d.current == 0).map(|d| d.event.clone()).take(limit).collect();
    diffs.retain(|d| d.delta != 0);
    diffs.sort_by(|a, b| {
        b.delta.unsigned_abs().cmp(&a.delta.unsigned_abs()).then(a.event.cmp(&b.event))
    });
    diffs.truncate(limit);
    PeriodDiff {
        revenue_delta: round2(current.total_revenue - previous.total_revenue),
        event_diffs: diffs,
        new_event_types,
        disappeared_event_types,
    }
}

fn round2(v: f64) -> f64 {
    (v * 100.0).round() / 100.0
}

// ---------------------------------------------------------------------------
// Anomalies.

/// Hours of baseline before the hour judged.
pub const BASELINE_HOURS: i64 = 168;
/// `|z|` at or above this is an anomaly...
pub const Z_THRESHOLD: f64 = 3.0;
/// ...when the count is also at least this far from the baseline mean.
pub const MIN_ABS_CHANGE: f64 = 3.0;

#[derive(Debug, Clone, PartialEq, Serialize, ToSchema, async_graphql::SimpleObject)]
#[serde(rename_all = "camelCase")]
pub struct Anomaly {
    pub event_name: String,
    /// Start of the hour judged, ms.
    pub hour: i64,
    pub observed: u64,
    /// Mean of the baseline hours.
    pub expected: f64,
    pub std_dev: f64,
    pub z_score: f64,
    /// `spike` or `drop`.
    pub direction: &'static str,
}

/// Event names judged for anomalies, those with the most events in the
/// window: each takes up to 170 hourly points in memory.
pub const ANOMALY_NAMES: usize = 1000;

/// The range of hourly counts [`detect_anomalies`] needs at time `now`.
pub fn anomaly_window(now: i64) -> (i64, i64) {
    let current = now.div_euclid(HOUR_MS) * HOUR_MS;
    (current - (BASELINE_HOURS + 1) * HOUR_MS, current + HOUR_MS)
}

/// Judges, per event name, the last complete hour against the
/// [`BASELINE_HOURS`] before it (z-score of the hourly count, the standard
/// deviation floored at 1), and the current, incomplete hour for spikes
/// only (it can only grow). `points` are hourly buckets by event over
/// [`anomaly_window`]`(now)`; missing hours count as 0.
pub fn detect_anomalies(points: &[SeriesPoint], now: i64) -> Vec<Anomaly> {
    let current = now.div_euclid(HOUR_MS) * HOUR_MS;
    let last = current - HOUR_MS;
    let base_from = last - BASELINE_HOURS * HOUR_MS;
    let mut by_event: HashMap<&str, HashMap<i64, u64>> = HashMap::new();
    for p in points {
        if let Some(name) = &p.event_name {
            *by_event.entry(name).or_default().entry(p.bucket).or_default() += p.count;
        }
    }
    let mut out = Vec::new();
    for (event, hours) in by_event {
        let baseline: Vec<f64> = (0..BASELINE_HOURS)
            .map(|i| hours.get(&(base_from + i * HOUR_MS)).copied().unwrap_or(0) as f64)
            .collect();
        let mean = baseline.iter().sum::<f64>() / baseline.len() as f64;
        let var = baseline.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / baseline.len() as f64;
        let std = var.sqrt();
        for (hour, spikes_only) in [(last, false), (current, true)] {
            let observed = hours.get(&hour).copied().unwrap_or(0);
            let diff = observed as f64 - mean;
            let z = diff / std.max(1.0);
            if z.abs() >= Z_THRESHOLD && diff.abs() >= MIN_ABS_CHANGE && (!spikes_only || z > 0.0) {
                out.push(Anomaly {
                    event_name: event.to_owned(),
                    hour,
                    observed,
                    expected: round2(mean),
                    std_dev: round2(std),
                    z_score: round2(z),
                    direction: if z > 0.0 { "spike" } else { "drop" },
                });
            }
        }
    }
    out.sort_by(|a, b| {
        b.z_score.abs().total_cmp(&a.z_score.abs()).then(a.event_name.cmp(&b.event_name))
    });
    out
}

// ---------------------------------------------------------------------------
// Event kinds for business health.

/// Scans: `trackable.scanned`/`trackable.used`, names starting `rfid.`,
/// `barcode.` or `qr.`, or with a segment `scan`/`scanned`.
pub fn is_scan(event: &str) -> bool {
    event == "trackable.used"
        || ["rfid.", "barcode.", "qr."].iter().any(|p| event.starts_with(p))
        || event.split('.').any(|s| s == "scan" || s == "scanned")
}

pub fn is_lead(event: &str) -> bool {
    event.starts_with("lead.")
}

pub fn is_order(event: &str) -> bool {
    matches!(event, "order.created" | "order.placed" | "order.completed" | "checkout.completed")
}

// ---------------------------------------------------------------------------
// Health score.

/// The inputs of the health score, each in `0..=1`; see [`health_score`].
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema, async_graphql::SimpleObject)]
#[serde(rename_all = "camelCase")]
pub struct HealthComponents {
    /// Events of the last 7 days against the 7 before (capped at 1; 1 when
    /// both are active and growing, 0 with no events now).
    pub activity: f64,
    /// Completed / (completed + failed) runs of the last 7 days; 1 without
    /// finished runs.
    pub reliability: f64,
    /// 1 - rejected / received connector records of the last 7 days; 1
    /// without connector loads.
    pub data_quality: f64,
    /// 1 - anomalies / 3, at least 0.
    pub stability: f64,
    /// 1 - proof gaps / 10, at least 0.
    pub governance: f64,
}

pub struct HealthInputs<'a> {
    pub events_now: u64,
    pub events_before: u64,
    pub runs: &'a [RunSummary],
    pub loads: &'a [ConnectorLoad],
    pub anomalies: usize,
    pub proof_gaps: usize,
}

pub fn health_components(i: &HealthInputs<'_>) -> HealthComponents {
    let activity = match (i.events_now, i.events_before) {
        (0, _) => 0.0,
        (_, 0) => 1.0,
        (now, before) => (now as f64 / before as f64).min(1.0),
    };
    let completed = i.runs.iter().filter(|r| r.status == "completed").count() as f64;
    let failed = i.runs.iter().filter(|r| r.status == "failed").count() as f64;
    let reliability =
        if completed + failed == 0.0 { 1.0 } else { completed / (completed + failed) };
    let received: u64 = i.loads.iter().map(|l| l.received).sum();
    let rejected: u64 = i.loads.iter().map(|l| l.rejected).sum();
    let data_quality =
        if received == 0 { 1.0 } else { 1.0 - (rejected as f64 / received as f64).min(1.0) };
    HealthComponents {
        activity: round2(activity),
        reliability: round2(reliability),
        data_quality: round2(data_quality),
        stability: round2((1.0 - i.anomalies as f64 / 3.0).max(0.0)),
        governance: round2((1.0 - i.proof_gaps as f64 / 10.0).max(0.0)),
    }
}

/// `round(100 × (0.35 activity + 0.25 reliability + 0.15 dataQuality +
/// 0.15 stability + 0.10 governance))`, 0 to 100.
pub fn health_score(c: &HealthComponents) -> u32 {
    let weighted = 0.35 * c.activity
        + 0.25 * c.reliability
        + 0.15 * c.data_quality
        + 0.15 * c.stability
        + 0.10 * c.governance;
    (weighted * 100.0).round().clamp(0.0, 100.0) as u32
}

// ---------------------------------------------------------------------------
// Next actions.

#[derive(Debug, Clone, PartialEq, Serialize, ToSchema, async_graphql::SimpleObject)]
#[serde(rename_all = "camelCase")]
pub struct NextAction {
    pub action: String,
    pub reason: String,
    /// Whether taking it goes through governance (a DecisionObject and
    /// enforcement) before anything consequential happens.
    pub governed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decision_object_id: Option<String>,
}

/// What the rules look at.
pub struct ActionInputs<'a> {
    pub failed_runs: Vec<&'a RunSummary>,
    pub anomalies: &'a [Anomaly],
    /// Decisions waiting (`draft` or `pending_approval`): (id, title).
    pub pending_decisions: Vec<(String, String)>,
    /// Decision ids of governed events lacking proof.
    pub proof_gap_decisions: Vec<String>,
    pub loads: &'a [ConnectorLoad],
    pub events_last_24h: u64,
    /// Revenue now and in the previous period.
    pub revenue: (f64, f64),
}

/// At most this many actions of one rule.
const PER_RULE: usize = 3;

/// The next-action rules, in priority order (docs/queries.md).
pub fn next_actions(i: &ActionInputs<'_>) -> Vec<NextAction> {
    let mut out = Vec::new();
    let plain = |action: &str, reason: String| NextAction {
        action: action.to_owned(),
        reason,
        governed: false,
        decision_object_id: None,
    };
    if i.events_last_24h == 0 {
        out.push(plain(
            "check_event_sources",
            "no events in the last 24 hours: a source, gateway or connector may be down".into(),
        ));
    }
    for run in i.failed_runs.iter().take(PER_RULE) {
        out.push(plain(
            "investigate_failed_run",
            format!("{} run {} failed ({})", run.kind, run.trace_id, run.last_event),
        ));
    }
    for a in i.anomalies.iter().take(PER_RULE) {
        let action = if a.direction == "drop" { "investigate_drop" } else { "review_spike" };
        out.push(plain(
            action,
            format!(
                "{}: {} events in the hour against {:.1} expected (z = {:.1})",
                a.event_name, a.observed, a.expected, a.z_score
            ),
        ));
    }
    let (now, before) = i.revenue;
    if before > 0.0 && now < before * 0.8 {
        out.push(plain(
            "investigate_revenue_drop",
            format!("revenue {now:.2} against {before:.2} in the previous period"),
        ));
    }
    for (id, title) in i.pending_decisions.iter().take(PER_RULE) {
        out.push(NextAction {
            action: "review_decision".into(),
            reason: format!("decision \"{title}\" is waiting for approval"),
            governed: true,
            decision_object_id: Some(id.clone()),
        });
    }
    for id in i.proof_gap_decisions.iter().take(PER_RULE) {
        out.push(NextAction {
            action: "export_proof_trail".into(),
            reason: format!("events of decision {id} lack proof (below T3, no proofId)"),
            governed: true,
            decision_object_id: Some(id.clone()),
        });
    }
    for load in i.loads.iter().filter(|l| l.rejected > 0).take(PER_RULE) {
        out.push(plain(
            "fix_connector_mapping",
            format!(
                "{} rejected {} of {} records recently",
                load.provider, load.rejected, load.received
            ),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::queries::EventTotals;

    fn totals(rows: &[(&str, u64, f64)]) -> Totals {
        Totals {
            events: rows
                .iter()
                .map(|(e, c, r)| EventTotals {
                    event_name: (*e).to_owned(),
                    count: *c,
                    unique_actors: None,
                    revenue: *r,
                })
                .collect(),
            total_events: rows.iter().map(|r| r.1).sum(),
            total_revenue: rows.iter().map(|r| r.2).sum(),
        }
    }

    #[test]
    fn diff_lists_changes_new_and_disappeared_types() {
        let now = totals(&[("a", 10, 5.0), ("b", 3, 0.0), ("c", 4, 0.0)]);
        let before = totals(&[("a", 5, 2.0), ("b", 3, 0.0), ("d", 2, 0.0)]);
        let d = period_diff(&now, &before, 10);
        assert_eq!(d.revenue_delta, 3.0);
        assert_eq!(d.new_event_types, ["c"]);
        assert_eq!(d.disappeared_event_types, ["d"]);
        let names: Vec<&str> = d.event_diffs.iter().map(|e| e.event.as_str()).collect();
        assert_eq!(names, ["a", "c", "d"], "unchanged b left out, largest change first");
        assert_eq!(d.event_diffs[0].pct_change, Some(100.0));
        assert_eq!(d.event_diffs[1].pct_change, None);
        assert_eq!(d.event_diffs[2].delta, -2);

        // Every list holds at most `limit`.
        let now = totals(&[("n1", 1, 0.0), ("n2", 1, 0.0), ("n3", 1, 0.0)]);
        let before = totals(&[("g1", 1, 0.0), ("g2", 1, 0.0), ("g3", 1, 0.0)]);
        let d = period_diff(&now, &before, 2);
        assert_eq!(
            (d.new_event_types, d.disappeared_event_types),
            (vec!["n1".to_owned(), "n2".to_owned()], vec!["g1".to_owned(), "g2".to_owned()])
        );
        assert_eq!(d.event_diffs.len(), 2);
    }

    fn point(event: &str, bucket: i64, count: u64) -> SeriesPoint {
        SeriesPoint { bucket, event_name: Some(event.into()), count, revenue: 0.0 }
    }

    #[test]
    fn a_spike_and_a_drop_are_found_and_steady_traffic_is_not() {
        let now = 1_000 * HOUR_MS + 30 * 60_000;
        let (from, to) = anomaly_window(now);
        let mut points = Vec::new();
        let mut h = from;
        while h < to - 2 * HOUR_MS {
            points.push(point("steady", h, 10));
            points.push(point("dropping", h, 20));
            h += HOUR_MS;
        }
        let last = to - 2 * HOUR_MS;
        points.push(point("steady", last, 11));
        points.push(point("dropping", last, 0));
        points.push(point("spiking", last + HOUR_MS, 40));
        let found = detect_anomalies(&points, now);
        let summary: Vec<(&str, &str)> =
            found.iter().map(|a| (a.event_name.as_str(), a.direction)).collect();
        assert_eq!(summary, [("spiking", "spike"), ("dropping", "drop")]);
        assert_eq!(found[1].expected, 20.0);
    }

    #[test]
    fn score_weights_the_components() {
        let all = HealthComponents {
            activity: 1.0,
            reliability: 1.0,
            data_quality: 1.0,
            stability: 1.0,
            governance: 1.0,
        };
        assert_eq!(health_score(&all), 100);
        assert_eq!(health_score(&HealthComponents { activity: 0.0, ..all.clone() }), 65);
        assert_eq!(health_score(&HealthComponents { reliability: 0.5, ..all }), 88);
    }

    #[test]
    fn kinds_of_events() {
        assert!(is_scan("trackable.scanned") && is_scan("rfid.tag.read") && is_scan("qr.scan"));
        assert!(!is_scan("order.created"));
        assert!(is_order("order.created") && !is_order("order.refunded"));
        assert!(is_lead("lead.created"));
    }
}
