//! The first queries of [`crate::store::queries::QueryStore`] on
//! ClickHouse: per-event totals and time series straight from the events
//! (no rollup: ClickHouse aggregates the raw rows fast enough), and
//! free-text search as a case-insensitive substring scan of `search_text`.

use std::collections::HashMap;

use clickhouse::Row;
use serde::Deserialize;

use super::events::{self, searchable, seconds};
use super::{ClickHouseStore, Sent, run};
use crate::error::Error;
use crate::error::Result;
use crate::store::StoredEvent;
use crate::store::queries::{
    ActorActivity, Aggregation, EventTotals, FunnelQuery, MetricDefinition, MetricSnapshot,
    RUN_PREFIXES, Range, RunQuery, RunSummary, SEARCH_COUNT_CAP, SearchQuery, SearchResult,
    SeriesPoint, SeriesQuery, Totals, TotalsQuery, run_status,
};

#[derive(Row, Deserialize)]
struct TotalsRead {
    event: String,
    count: u64,
    revenue: f64,
}

#[derive(Row, Deserialize)]
struct OverallRead {
    count: u64,
    revenue: f64,
}

#[derive(Row, Deserialize)]
struct UniqueRead {
    event: String,
    unique_actors: u64,
}

#[derive(Row, Deserialize)]
struct SeriesRead {
    bucket: i64,
    event: String,
    count: u64,
    revenue: f64,
}

/// The `WHERE` of a query over a workspace's events, with its values.
pub(super) struct Filter {
    pub(super) sql: String,
    texts: Vec<String>,
    numbers: Vec<i64>,
}

impl Filter {
    /// Texts are bound before numbers: the clauses keep that order.
    pub(super) fn new(
        ws: &str,
        business: Option<&str>,
        event: Option<&str>,
        range: Option<Range>,
    ) -> Filter {
        let mut f =
            Filter { sql: "workspace_id = ?".into(), texts: vec![ws.to_owned()], numbers: vec![] };
        if let Some(business) = business {
            f.sql.push_str(" AND business_id = ?");
            f.texts.push(business.to_owned());
        }
        if let Some(event) = event {
            f.sql.push_str(" AND event = ?");
            f.texts.push(event.to_owned());
        }
        if let Some(range) = range {
            // `time` repeats the bounds so that whole months are skipped.
            f.sql.push_str(
                " AND ts >= ? AND ts < ? AND time >= toDateTime(?) AND time <= toDateTime(?)",
            );
            f.numbers.extend([
                range.from,
                range.to,
                i64::from(seconds(range.from)),
                i64::from(seconds(range.to.saturating_sub(1))),
            ]);
        }
        f
    }

    pub(super) fn query(&self, store: &ClickHouseStore, sql: &str) -> clickhouse::query::Query {
        self.bind(store.client.query(sql))
    }

    /// Binds the filter's values to the next placeholders of `query`.
    pub(super) fn bind(&self, mut query: clickhouse::query::Query) -> clickhouse::query::Query {
        for text in &self.texts {
            query = query.bind(text.as_str());
        }
        for number in &self.numbers {
            query = query.bind(*number);
        }
        query
    }
}

pub(super) async fn totals(store: &ClickHouseStore, ws: &str, q: &TotalsQuery) -> Result<Totals> {
    let filter = Filter::new(ws, q.business_id.as_deref(), q.event.as_deref(), q.range);
    // Only the first `limit` event names come back (a workspace may have
    // millions), the sums over all of them from a query of their own.
    let sql = format!(
        "SELECT event, count() AS c, sum(revenue) FROM events
         WHERE {} GROUP BY event ORDER BY c DESC, event LIMIT {}",
        filter.sql, q.limit
    );
    let rows: Vec<TotalsRead> = run(filter.query(store, &sql).sent().fetch_all()).await?;
    let sql = format!("SELECT count(), sum(revenue) FROM events WHERE {}", filter.sql);
    let overall: OverallRead = run(filter.query(store, &sql).sent().fetch_one()).await?;
    // uniqExact, the costly column, only when asked and only for those.
    let mut unique = HashMap::new();
    if q.unique_actors && !rows.is_empty() {
        let sql = format!(
            "SELECT event, uniqExactIf(actor_id, actor_id != '') FROM events
             WHERE {} AND event IN ({}) GROUP BY event",
            filter.sql,
            events::placeholders(rows.len())
        );
        let query = rows.iter().fold(filter.query(store, &sql), |q, r| q.bind(&r.event));
        let found: Vec<UniqueRead> = run(query.sent().fetch_all()).await?;
        unique.extend(found.into_iter().map(|r| (r.event, r.unique_actors)));
    }
    // Rows written between the two queries may be in one sum and not the
    // other: the total never counts fewer than the names listed.
    let listed: u64 = rows.iter().map(|r| r.count).sum();
    let events = rows
        .into_iter()
        .map(|row| EventTotals {
            unique_actors: q.unique_actors.then(|| unique.get(&row.event).copied().unwrap_or(0)),
            event_name: row.event,
            count: row.count,
            revenue: row.revenue,
        })
        .collect();
    Ok(Totals { total_events: overall.count.max(listed), total_revenue: overall.revenue, events })
}

pub(super) async fn series(
    store: &ClickHouseStore,
    ws: &str,
    q: &SeriesQuery,
) -> Result<Vec<SeriesPoint>> {
    let filter = Filter::new(ws, q.business_id.as_deref(), q.event.as_deref(), Some(q.range));
    let bucket_ms = q.bucket_ms.max(1);
    // Buckets are whole UTC hours or days: floor(ts / size) * size.
    let bucket =
        format!("intDiv(ts, {bucket_ms}) * {bucket_ms} - if(ts % {bucket_ms} < 0, {bucket_ms}, 0)");
    let (name, busiest) = match q.by_event {
        Some(names) => (
            "event",
            format!(
                " AND event IN (SELECT event FROM events WHERE {} GROUP BY event
                 ORDER BY count() DESC, event LIMIT {names})",
                filter.sql
            ),
        ),
        None => ("''", String::new()),
    };
    let sql = format!(
        "SELECT {bucket} AS b, {name} AS e, count(), sum(revenue) FROM events
         WHERE {}{busiest} GROUP BY b, e ORDER BY b, e",
        filter.sql
    );
    let mut query = filter.query(store, &sql);
    if q.by_event.is_some() {
        query = filter.bind(query);
    }
    let rows: Vec<SeriesRead> = run(query.sent().fetch_all()).await?;
    Ok(rows
        .into_iter()
        .map(|r| SeriesPoint {
            bucket: r.bucket,
            event_name: q.by_event.map(|_| r.event),
            count: r.count,
            revenue: r.revenue,
        })
        .collect())
}

#[derive(Row, Deserialize)]
struct FoundRead {
    id: String,
    received_at: i64,
    envelope: String,
}

pub(super) async fn search(
    store: &ClickHouseStore,
    ws: &str,
    q: &SearchQuery,
) -> Result<SearchResult> {
    let filter = Filter::new(ws, q.business_id.as_deref(), q.event.as_deref(), q.range);
    let folded = searchable(q.text.clone());
    let needles: Vec<&str> =
        if folded == q.text { vec![&folded] } else { vec![&folded, q.text.as_str()] };
    // The needles are bound last, after the filter's texts and numbers.
    let found_by = vec!["positionCaseInsensitiveUTF8(search_text, ?) > 0"; needles.len()];
    let matches = format!("{} AND ({})", filter.sql, found_by.join(" OR "));
    let list_sql = format!(
        "SELECT id, received_at, envelope FROM events WHERE {matches}
         ORDER BY ts DESC, seq DESC LIMIT {}",
        u64::try_from(q.limit).unwrap_or(u64::MAX)
    );
    let bind_needles =
        |query: clickhouse::query::Query| needles.iter().fold(query, |query, n| query.bind(*n));
    let found: Vec<FoundRead> =
        run(bind_needles(filter.query(store, &list_sql)).sent().fetch_all()).await?;
    let events = found
        .into_iter()
        .map(|r| {
            let envelope = serde_json::from_str(&r.envelope).map_err(Error::internal)?;
            Ok(StoredEvent { id: r.id, received_at: r.received_at, envelope })
        })
        .collect::<Result<Vec<_>>>()?;
    let count_sql = format!(
        "SELECT count() FROM (SELECT 1 FROM events WHERE {matches} LIMIT {})",
        SEARCH_COUNT_CAP + 1
    );
    let total: u64 = run(bind_needles(filter.query(store, &count_sql)).sent().fetch_one()).await?;
    Ok(SearchResult {
        events,
        total: total.min(SEARCH_COUNT_CAP),
        total_capped: total > SEARCH_COUNT_CAP,
    })
}

/// Governed events (`decisionId` set) below `T3` without a `proofId`,
/// newest first.
pub(super) async fn proof_gaps(
    store: &ClickHouseStore,
    ws: &str,
    range: Range,
    business: Option<&str>,
    limit: usize,
) -> Result<Vec<StoredEvent>> {
    let filter = Filter::new(ws, business, None, Some(range));
    let sql = format!(
        "SELECT id, received_at, envelope FROM events WHERE {} AND decision_id != ''
           AND trust_tier < 'T3' AND proof_id = ''
         ORDER BY ts DESC, seq DESC LIMIT {}",
        filter.sql,
        u64::try_from(limit).unwrap_or(u64::MAX)
    );
    let found: Vec<FoundRead> = run(filter.query(store, &sql).sent().fetch_all()).await?;
    found
        .into_iter()
        .map(|r| {
            let envelope = serde_json::from_str(&r.envelope).map_err(Error::internal)?;
            Ok(StoredEvent { id: r.id, received_at: r.received_at, envelope })
        })
        .collect()
}

#[derive(Row, Deserialize)]
struct RunRead {
    trace_id: String,
    started: i64,
    updated: i64,
    events: u64,
    last_event: String,
    last_actor: String,
}

/// Runs: the traced events whose name starts with a run prefix, grouped
/// by `traceId`, the most recently updated first.
pub(super) async fn runs(
    store: &ClickHouseStore,
    ws: &str,
    q: &RunQuery,
) -> Result<Vec<RunSummary>> {
    let filter = Filter::new(ws, q.business_id.as_deref(), None, q.range);
    let prefixes: Vec<String> = RUN_PREFIXES.iter().map(|p| format!("'{p}'")).collect();
    let mut sql = format!(
        "SELECT trace_id, min(ts) AS started, max(ts) AS updated, count(),
            argMax(event, (ts, seq)), argMax(actor_id, (ts, seq))
         FROM events WHERE {} AND trace_id != ''
            AND substring(event, 1, position(event, '.')) IN ({})",
        filter.sql,
        prefixes.join(", ")
    );
    if q.trace_id.is_some() {
        sql.push_str(" AND trace_id = ?");
    }
    sql.push_str(" GROUP BY trace_id");
    if q.actor_id.is_some() {
        sql.push_str(" HAVING max(actor_id = ?) = 1");
    }
    sql.push_str(&format!(
        " ORDER BY updated DESC, trace_id LIMIT {}",
        u64::try_from(q.limit).unwrap_or(u64::MAX)
    ));
    let mut query = filter.query(store, &sql);
    for text in [&q.trace_id, &q.actor_id].into_iter().flatten() {
        query = query.bind(text.as_str());
    }
    let rows: Vec<RunRead> = run(query.sent().fetch_all()).await?;
    Ok(rows
        .into_iter()
        .map(|r| RunSummary {
            kind: r.last_event.split('.').next().unwrap_or_default().to_owned(),
            status: run_status(&r.last_event).to_owned(),
            trace_id: r.trace_id,
            started_at: r.started,
            updated_at: r.updated,
            events: r.events,
            last_event: r.last_event,
            actor_id: (!r.last_actor.is_empty()).then_some(r.last_actor),
        })
        .collect())
}

#[derive(Row, Deserialize)]
struct ActorRead {
    actor_type: String,
    actor_id: String,
    events: u64,
    revenue: f64,
    first_seen: i64,
    last_seen: i64,
}

/// Actors over a range, the most active first.
pub(super) async fn actor_activity(
    store: &ClickHouseStore,
    ws: &str,
    range: Range,
    types: &[&str],
    actor_id: Option<&str>,
    limit: usize,
) -> Result<Vec<ActorActivity>> {
    let filter = Filter::new(ws, None, None, Some(range));
    let mut sql = format!(
        "SELECT actor_type, actor_id, count() AS n, sum(revenue), min(ts), max(ts)
         FROM events WHERE {} AND actor_id != ''",
        filter.sql
    );
    if !types.is_empty() {
        sql.push_str(&format!(" AND actor_type IN ({})", vec!["?"; types.len()].join(", ")));
    }
    if actor_id.is_some() {
        sql.push_str(" AND actor_id = ?");
    }
    sql.push_str(&format!(
        " GROUP BY actor_type, actor_id ORDER BY n DESC, actor_id LIMIT {}",
        u64::try_from(limit).unwrap_or(u64::MAX)
    ));
    let mut query = filter.query(store, &sql);
    for text in types.iter().copied().chain(actor_id) {
        query = query.bind(text);
    }
    let rows: Vec<ActorRead> = run(query.sent().fetch_all()).await?;
    Ok(rows
        .into_iter()
        .map(|r| ActorActivity {
            actor_type: (!r.actor_type.is_empty()).then_some(r.actor_type),
            actor_id: r.actor_id,
            events: r.events,
            revenue: r.revenue,
            first_seen: r.first_seen,
            last_seen: r.last_seen,
        })
        .collect())
}

/// One actor's progress through a funnel, as in the embedded store
/// (`embedded/journeys.rs`, docs/queries.md): rows come in time order,
/// `mask` has bit `k` set for an event of step `k`; per step the latest
/// start of a chain that reached it is kept, and steps are tried from the
/// last down so one row never advances two steps. ClickHouse's own
/// `windowFunnel` lets one event satisfy two equal steps, so the fold is
/// done here over rows ClickHouse sorts.
struct WindowFunnel {
    window: i64,
    start_before: i64,
    starts: Vec<Option<i64>>,
}

impl WindowFunnel {
    fn new(window: i64, start_before: i64, steps: usize) -> WindowFunnel {
        WindowFunnel { window, start_before, starts: vec![None; steps] }
    }

    fn step(&mut self, mask: u32, ts: i64) {
        for k in (0..self.starts.len()).rev() {
            if mask & (1 << k) == 0 {
                continue;
            }
            if k == 0 {
                if ts < self.start_before {
                    self.starts[0] = Some(ts);
                }
            } else if let Some(start) = self.starts[k - 1]
                && ts - start <= self.window
            {
                self.starts[k] = Some(start);
            }
        }
    }

    fn level(&self) -> usize {
        self.starts.iter().rposition(Option::is_some).map_or(0, |k| k + 1)
    }
}

#[derive(Row, Deserialize)]
struct StepRead {
    actor_id: String,
    ts: i64,
    event: String,
}

pub(super) async fn funnel(store: &ClickHouseStore, ws: &str, q: &FunnelQuery) -> Result<Vec<u64>> {
    let steps = q.steps.len().min(31);
    let mut names: Vec<(&str, u32)> = Vec::new();
    for (k, step) in q.steps.iter().take(steps).enumerate() {
        match names.iter_mut().find(|(name, _)| *name == step.as_str()) {
            Some((_, mask)) => *mask |= 1 << k,
            None => names.push((step.as_str(), 1 << k)),
        }
    }
    // Later steps may come up to the window after the range's end.
    let until = q.range.to.saturating_add(q.window_ms);
    let range = Range { from: q.range.from, to: until };
    let filter = Filter::new(ws, q.business_id.as_deref(), None, Some(range));
    let sql = format!(
        "SELECT actor_id, ts, event FROM events WHERE {} AND actor_id != ''
            AND event IN ({}) ORDER BY actor_id, ts, seq",
        filter.sql,
        vec!["?"; names.len()].join(", ")
    );
    let mut query = filter.query(store, &sql);
    for (name, _) in &names {
        query = query.bind(*name);
    }
    let mut cursor = query.sent().fetch::<StepRead>().map_err(super::classify)?;
    let mut reached = vec![0u64; q.steps.len()];
    let mut count = |actor: &WindowFunnel| {
        for slot in reached.iter_mut().take(actor.level()) {
            *slot += 1;
        }
    };
    let mut current: Option<(String, WindowFunnel)> = None;
    while let Some(row) = run(cursor.next()).await? {
        let mask = names.iter().find(|(name, _)| *name == row.event).map_or(0, |(_, m)| *m);
        match &mut current {
            Some((actor, state)) if *actor == row.actor_id => state.step(mask, row.ts),
            _ => {
                if let Some((_, state)) = current.take() {
                    count(&state);
                }
                let mut state = WindowFunnel::new(q.window_ms, q.range.to, steps);
                state.step(mask, row.ts);
                current = Some((row.actor_id, state));
            }
        }
    }
    if let Some((_, state)) = current {
        count(&state);
    }
    Ok(reached)
}

#[derive(Row, serde::Serialize)]
struct BodyRow<'a> {
    workspace_id: &'a str,
    id: &'a str,
    created_at: i64,
    body: String,
}

/// Stores metric definitions or snapshots, kept whole as JSON.
pub(super) async fn insert_bodies<T: serde::Serialize>(
    store: &ClickHouseStore,
    table: &str,
    ws: &str,
    items: &[(&str, i64, &T)],
) -> Result<()> {
    let rows = items
        .iter()
        .map(|(id, created_at, item)| {
            Ok(BodyRow {
                workspace_id: ws,
                id,
                created_at: *created_at,
                body: serde_json::to_string(item).map_err(Error::internal)?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    store.insert_rows::<BodyRow<'_>>(table, &rows).await
}

/// The newest first.
pub(super) async fn list_bodies<T: serde::de::DeserializeOwned>(
    store: &ClickHouseStore,
    table: &str,
    ws: &str,
    limit: usize,
) -> Result<Vec<T>> {
    let sql = format!(
        "SELECT body FROM {table} WHERE workspace_id = ? ORDER BY created_at DESC, id DESC
         LIMIT {}",
        u64::try_from(limit).unwrap_or(u64::MAX)
    );
    let bodies: Vec<String> = run(store.client.query(&sql).bind(ws).sent().fetch_all()).await?;
    bodies.iter().map(|b| serde_json::from_str(b).map_err(Error::internal)).collect()
}

pub(super) async fn list_metric_definitions(
    store: &ClickHouseStore,
    ws: &str,
    limit: usize,
) -> Result<Vec<MetricDefinition>> {
    list_bodies(store, "metric_definitions", ws, limit).await
}

pub(super) async fn list_metric_snapshots(
    store: &ClickHouseStore,
    ws: &str,
    limit: usize,
) -> Result<Vec<MetricSnapshot>> {
    list_bodies(store, "metric_snapshots", ws, limit).await
}

#[derive(Row, Deserialize)]
struct MetricRead {
    events: u64,
    value: f64,
}

/// `(events of the definition's event, value)` over a range.
pub(super) async fn evaluate_metric(
    store: &ClickHouseStore,
    ws: &str,
    definition: &MetricDefinition,
    range: Range,
    business: Option<&str>,
) -> Result<(u64, f64)> {
    let filter = Filter::new(ws, business, Some(&definition.event_name), Some(range));
    let property = match (definition.aggregation, definition.property.as_deref()) {
        (Aggregation::Sum, Some(p)) if p != "revenue" => Some(p),
        _ => None,
    };
    let value = match (definition.aggregation, property) {
        (Aggregation::Count, _) => "toFloat64(count())",
        (Aggregation::Unique, _) => "toFloat64(uniqExactIf(actor_id, actor_id != ''))",
        (Aggregation::Sum, None) => "sum(revenue)",
        // indexOf is 0 when absent, and element 0 of an array is 0.
        (Aggregation::Sum, Some(_)) => "sum(num_values[indexOf(num_keys, ?)])",
    };
    let sql = format!("SELECT count(), {value} FROM events WHERE {}", filter.sql);
    // The property's placeholder comes first in the text.
    let mut query = store.client.query(&sql);
    if let Some(property) = property {
        query = query.bind(property);
    }
    let read: MetricRead = run(filter.bind(query).sent().fetch_one()).await?;
    Ok((read.events, read.value))
}
