//! Queries of the embedded store (docs/queries.md): every aggregate is one
//! SQL statement on a read connection.
//!
//! - Totals and series read whole hours from `event_counts_hourly` and only
//!   the partial hours at the range's edges from `events`, so a 30-day
//!   metric reads ~720 rollup rows per event name plus two hours of events.
//! - Distinct actors read one row per actor from `event_actors` (first and
//!   last event time), and events only when an actor's events surround the
//!   range.
//! - Funnels and attribution follow each actor's events in time order:
//!   [`journeys`](super::journeys).
//! - Search goes through the trigram index `search.events_fts` once it
//!   has reached every event stored when the search began (`search`);
//!   governed events through their partial index.

use async_trait::async_trait;
use rusqlite::types::{ToSql, Value as SqlValue};
use rusqlite::{Connection, OptionalExtension, params};

use super::events::{HOUR_MS, stored_event};
use super::search::{self, BODY_COLUMNS, Needle};
use super::{EmbeddedStore, journeys, sql};
use crate::error::{Error, Result};
use crate::store::StoredEvent;
use crate::store::queries::{
    AGENT_TYPES, ActorActivity, Aggregation, Attribution, AttributionQuery, ConnectorLoad, Entity,
    EventTotals, FunnelQuery, MetricDefinition, MetricSnapshot, QueryStore, RUN_PREFIXES, Range,
    Relationship, RunQuery, RunSummary, SEARCH_COUNT_CAP, SearchQuery, SearchResult, SeriesPoint,
    SeriesQuery, Totals, TotalsQuery, run_status,
};

/// A statement's text and its named parameters, built up from the filters
/// present (fixed `:x IS NULL OR ...` arms would defeat the planner).
#[derive(Default, Clone)]
pub(super) struct Sql {
    args: Vec<(String, SqlValue)>,
}

impl Sql {
    pub(super) fn bind(&mut self, name: &str, value: impl Into<SqlValue>) {
        if !self.args.iter().any(|(n, _)| n == name) {
            self.args.push((name.to_owned(), value.into()));
        }
    }

    pub(super) fn params(&self) -> Vec<(&str, &dyn ToSql)> {
        self.args.iter().map(|(n, v)| (n.as_str(), v as &dyn ToSql)).collect()
    }
}

pub(super) fn int(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

pub(super) fn count(n: i64) -> u64 {
    n.max(0) as u64
}

/// Splits `[from, to)` into whole hours `[h1, h2)` (hour numbers, for the
/// rollup) and the ms edges around them (for `events`).
struct Split {
    hours: (i64, i64),
    left: (i64, i64),
    right: (i64, i64),
}

fn split(range: Range) -> Split {
    let h1 = range.from.div_euclid(HOUR_MS) + i64::from(range.from.rem_euclid(HOUR_MS) != 0);
    let h2 = range.to.div_euclid(HOUR_MS);
    if h1 < h2 {
        Split { hours: (h1, h2), left: (range.from, h1 * HOUR_MS), right: (h2 * HOUR_MS, range.to) }
    } else {
        Split { hours: (0, 0), left: (range.from, range.to), right: (range.to, range.to) }
    }
}

/// The `parts(bucket, event, c, r)` rows of totals and series: rollup hours
/// plus edge events, filtered by business and event.
fn parts_sql(
    q: &mut Sql,
    range: Option<Range>,
    business: Option<&str>,
    event: Option<&str>,
    bucket_ms: i64,
) -> String {
    let mut filter = String::new();
    if let Some(b) = business {
        filter.push_str(" AND business_id = :biz");
        q.bind(":biz", b.to_owned());
    }
    if let Some(e) = event {
        filter.push_str(" AND event = :event");
        q.bind(":event", e.to_owned());
    }
    q.bind(":bucket", bucket_ms);
    let rollup = format!(
        "SELECT (hour * {HOUR_MS}) / :bucket * :bucket AS bucket, event, count AS c, revenue AS r
         FROM event_counts_hourly WHERE workspace_id = :ws{filter}"
    );
    let Some(range) = range else {
        return rollup;
    };
    let s = split(range);
    q.bind(":h1", s.hours.0);
    q.bind(":h2", s.hours.1);
    q.bind(":l1", s.left.0);
    q.bind(":l2", s.left.1);
    q.bind(":r1", s.right.0);
    q.bind(":r2", s.right.1);
    let edge = |a: &str, b: &str| {
        format!(
            "SELECT ts / :bucket * :bucket, event, 1, coalesce(revenue, 0) FROM events
             WHERE workspace_id = :ws{filter} AND ts >= {a} AND ts < {b}"
        )
    };
    format!(
        "{rollup} AND hour >= :h1 AND hour < :h2 UNION ALL {} UNION ALL {}",
        edge(":l1", ":l2"),
        edge(":r1", ":r2")
    )
}

fn totals(conn: &Connection, ws: &str, query: &TotalsQuery) -> Result<Totals> {
    let mut q = Sql::default();
    q.bind(":ws", ws.to_owned());
    let parts = parts_sql(
        &mut q,
        query.range,
        query.business_id.as_deref(),
        query.event.as_deref(),
        HOUR_MS,
    );
    let text = format!(
        "SELECT event, sum(c), sum(r) FROM ({parts}) GROUP BY event
         ORDER BY sum(c) DESC, event"
    );
    let mut stmt = conn.prepare_cached(&text).map_err(sql)?;
    let rows = stmt
        .query_map(q.params().as_slice(), |r| {
            Ok(EventTotals {
                event_name: r.get(0)?,
                count: count(r.get(1)?),
                unique_actors: None,
                revenue: r.get(2)?,
            })
        })
        .map_err(sql)?;
    let mut out = Totals::default();
    for row in rows {
        let row = row.map_err(sql)?;
        out.total_events += row.count;
        out.total_revenue += row.revenue;
        if out.events.len() < query.limit {
            out.events.push(row);
        }
    }
    if query.unique_actors {
        for row in &mut out.events {
            row.unique_actors = Some(unique_actors(
                conn,
                ws,
                &row.event_name,
                query.range,
                query.business_id.as_deref(),
            )?);
        }
    }
    Ok(out)
}

/// Distinct actor ids of one event: from `event_actors` when it knows,
/// else from the events.
fn unique_actors(
    conn: &Connection,
    ws: &str,
    event: &str,
    range: Option<Range>,
    business: Option<&str>,
) -> Result<u64> {
    match unique_actors_from_bounds(conn, ws, event, range, business)? {
        Some(n) => Ok(n),
        None => unique_actors_from_events(conn, ws, event, range, business),
    }
}

/// An actor whose first or last event of that name lies in the range has
/// one there: when no actor has events on both sides of the range without
/// either bound inside it (one that may or may not have come by in
/// between, or bounds a removal made unknown), the actors with a bound
/// inside are the answer. `None` otherwise.
fn unique_actors_from_bounds(
    conn: &Connection,
    ws: &str,
    event: &str,
    range: Option<Range>,
    business: Option<&str>,
) -> Result<Option<u64>> {
    let mut q = Sql::default();
    q.bind(":ws", ws.to_owned());
    q.bind(":event", event.to_owned());
    // No range: every known bound is inside; unknown ones (i64::MIN,
    // i64::MAX) are not.
    let r = range.unwrap_or(Range { from: i64::MIN + 1, to: i64::MAX });
    q.bind(":from", r.from);
    q.bind(":to", r.to);
    // One row per actor: its business's, or the all-businesses one ('').
    q.bind(":biz", business.unwrap_or("").to_owned());
    let text = "SELECT count(*) FILTER (WHERE (first_ts >= :from AND first_ts < :to)
                OR (last_ts >= :from AND last_ts < :to)),
            count(*) FILTER (WHERE first_ts < :from AND last_ts >= :to)
         FROM event_actors WHERE workspace_id = :ws AND event = :event AND business_id = :biz";
    let (inside, around) = conn
        .prepare_cached(text)
        .and_then(|mut s| {
            s.query_row(q.params().as_slice(), |r| Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?)))
        })
        .map_err(sql)?;
    Ok((around == 0).then(|| count(inside)))
}

/// Distinct actor ids of one event over the `events_event_ts` index.
fn unique_actors_from_events(
    conn: &Connection,
    ws: &str,
    event: &str,
    range: Option<Range>,
    business: Option<&str>,
) -> Result<u64> {
    let mut q = Sql::default();
    q.bind(":ws", ws.to_owned());
    q.bind(":event", event.to_owned());
    let mut text = String::from(
        "SELECT count(DISTINCT actor_id) FROM events WHERE workspace_id = :ws AND event = :event",
    );
    if let Some(r) = range {
        text.push_str(" AND ts >= :from AND ts < :to");
        q.bind(":from", r.from);
        q.bind(":to", r.to);
    }
    if let Some(b) = business {
        text.push_str(" AND business_id = :biz");
        q.bind(":biz", b.to_owned());
    }
    conn.prepare_cached(&text)
        .and_then(|mut s| s.query_row(q.params().as_slice(), |r| r.get::<_, i64>(0)))
        .map(count)
        .map_err(sql)
}

fn series(conn: &Connection, ws: &str, query: &SeriesQuery) -> Result<Vec<SeriesPoint>> {
    let mut q = Sql::default();
    q.bind(":ws", ws.to_owned());
    let parts = parts_sql(
        &mut q,
        Some(query.range),
        query.business_id.as_deref(),
        query.event.as_deref(),
        query.bucket_ms,
    );
    let (select, group, busiest) = match query.by_event {
        Some(names) => {
            q.bind(":names", i64::try_from(names).unwrap_or(i64::MAX));
            let busiest = format!(
                " WHERE event IN (SELECT event FROM ({parts}) GROUP BY event
                 ORDER BY sum(c) DESC, event LIMIT :names)"
            );
            ("event", "bucket, event", busiest)
        }
        None => ("NULL", "bucket", String::new()),
    };
    // Rollup hours are whole buckets only when the bucket is a whole number
    // of hours (the API only asks for hours and days).
    let text = format!(
        "SELECT bucket, {select}, sum(c), sum(r) FROM ({parts}){busiest}
         GROUP BY {group} ORDER BY {group}"
    );
    let mut stmt = conn.prepare_cached(&text).map_err(sql)?;
    let rows = stmt
        .query_map(q.params().as_slice(), |r| {
            Ok(SeriesPoint {
                bucket: r.get(0)?,
                event_name: r.get(1)?,
                count: count(r.get(2)?),
                revenue: r.get(3)?,
            })
        })
        .map_err(sql)?;
    rows.collect::<rusqlite::Result<Vec<_>>>().map_err(sql)
}

/// How a search chooses between its two ways ([`search_planned`]).
#[derive(Debug, Clone, Copy)]
pub(super) struct SearchPlan {
    /// Index candidates counted before a needle counts as common.
    pub probe: i64,
    /// Events a walk reads at most before it gives up for the sort.
    pub walk: u64,
    /// Events read at most for a needle shorter than a trigram.
    pub scan: u64,
}

/// Common from 50 000 candidates. A walk reads at most 2000 events: enough
/// for a page of 100 of a needle that one event in twenty holds.
/// Candidates are no measure of matches (an EPC fragment's trigrams are in
/// far more events than the fragment), so rarer needles often try the walk
/// and give up. At 10 M events that and the probe cost a search of a
/// robot id or an EPC fragment 20–35 ms, while `robot` went from 1.3–5 s
/// to 30–50 ms; a probe of 500 000 cost `robot` 30 ms more and saved the
/// others nothing (BENCHMARKS.md, 26 November, late afternoon).
///
/// A needle shorter than a trigram has no index to ask: the newest
/// 100 000 events of the range are read and checked: 0.15 s for a needle
/// found nowhere (up to 0.3 s with an event name or business), much less
/// for a common one (BENCHMARKS.md, 27 November, night).
const SEARCH_PLAN: SearchPlan = SearchPlan { probe: 50_000, walk: 2_000, scan: 100_000 };

fn search(conn: &Connection, ws: &str, query: &SearchQuery) -> Result<SearchResult> {
    search_planned(conn, ws, query, SEARCH_PLAN)
}

/// A search, exact either way:
/// - **Sorted** (most needles): the index's candidates are joined to
///   their events and sorted newest first, only their `seq` carried
///   through the sort; each is then read and checked in turn until the
///   page is full and the count reaches its cap.
/// - **Scanned** (a needle shorter than a trigram): the newest events
///   are read and checked, at most `plan.scan` of them; a count that
///   stopped there is a lower bound, and says so (`total_capped`).
/// - **Walked** (a needle with at least `plan.probe` candidates, such as
///   `robot` in a fleet's store, where joining and sorting millions took
///   seconds): the page comes from the workspace's events newest first
///   (from the index that holds the filtered events in time order), each
///   checked, which finds a common needle's newest
///   matches within a few rows; the count reads candidates unsorted up to
///   its cap. A walk that reads `plan.walk` events without filling the
///   page (the needle is common elsewhere, rare here) gives way to the
///   sort.
pub(super) fn search_planned(
    conn: &Connection,
    ws: &str,
    query: &SearchQuery,
    plan: SearchPlan,
) -> Result<SearchResult> {
    let Some(needle) = Needle::new(&query.text) else {
        return Ok(SearchResult { events: Vec::new(), total: 0, total_capped: false });
    };
    let mut q = Sql::default();
    q.bind(":ws", ws.to_owned());
    let mut filter = String::new();
    if let Some(r) = query.range {
        filter.push_str(" AND e.ts >= :from AND e.ts < :to");
        q.bind(":from", r.from);
        q.bind(":to", r.to);
    }
    if let Some(e) = &query.event {
        filter.push_str(" AND e.event = :event");
        q.bind(":event", e.clone());
    }
    if let Some(b) = &query.business_id {
        filter.push_str(" AND e.business_id = :biz");
        q.bind(":biz", b.clone());
    }
    // Reading newest first, an index that holds only the filtered events
    // in time order: the workspace's would pass over every other event
    // (0.3-0.5 s at 1 M events for an event name or a business found
    // nowhere).
    let index = match (&query.event, &query.business_id) {
        (Some(_), _) => "events_event_ts",
        (None, Some(_)) => "events_business_ts",
        (None, None) => "events_ts",
    };
    let within = Within { q: &q, filter: &filter, index };
    let Some(expression) = needle.expression() else {
        let read = newest(conn, &needle, &within, query.limit, SEARCH_COUNT_CAP + 1, plan.scan)?;
        let mut result = found(read.events, read.total);
        result.total_capped |= read.stopped;
        return Ok(result);
    };
    let mut indexed = q.clone();
    indexed.bind(":match", expression.to_owned());
    // The index gives candidates of every workspace; the join keeps ours.
    let candidates = |order: &str| {
        format!(
            "SELECT e.seq FROM search.events_fts(:match) AS f
             CROSS JOIN events AS e ON e.seq = f.rowid
             WHERE e.workspace_id = :ws{filter}{order}"
        )
    };
    let common = conn
        .prepare_cached("SELECT count(*) FROM (SELECT 1 FROM search.events_fts(?1) LIMIT ?2)")
        .and_then(|mut s| s.query_row(params![expression, plan.probe], |r| r.get::<_, i64>(0)))
        .map_err(sql)?
        >= plan.probe;
    let mut read = conn
        .prepare_cached(&format!(
            "SELECT id, received_at, {BODY_COLUMNS} FROM events WHERE seq = ?1"
        ))
        .map_err(sql)?;
    if common && let Some(events) = walk(conn, &needle, &within, query.limit, plan.walk)? {
        let mut unsorted = conn.prepare_cached(&candidates("")).map_err(sql)?;
        let mut rows = unsorted.query(indexed.params().as_slice()).map_err(sql)?;
        let (_, total) = check_in_turn(&mut rows, &mut read, &needle, 0)?;
        return Ok(found(events, total));
    }
    let mut sorted =
        conn.prepare_cached(&candidates(" ORDER BY e.ts DESC, e.seq DESC")).map_err(sql)?;
    let mut rows = sorted.query(indexed.params().as_slice()).map_err(sql)?;
    let (events, total) = check_in_turn(&mut rows, &mut read, &needle, query.limit)?;
    Ok(found(events, total))
}

/// A page and a count that stopped one past the cap, as answered.
fn found(events: Vec<StoredEvent>, total: u64) -> SearchResult {
    SearchResult {
        events,
        total: total.min(SEARCH_COUNT_CAP),
        total_capped: total > SEARCH_COUNT_CAP,
    }
}

/// Reads the events at the `seq`s `rows` gives, in that order, and checks
/// each for the needle, until the rows end or one more than the cap hold
/// it: the first `limit` of them, and how many.
fn check_in_turn(
    rows: &mut rusqlite::Rows<'_>,
    read: &mut rusqlite::CachedStatement<'_>,
    needle: &Needle,
    limit: usize,
) -> Result<(Vec<StoredEvent>, u64)> {
    let mut events = Vec::new();
    let mut total = 0u64;
    while total <= SEARCH_COUNT_CAP {
        let Some(row) = rows.next().map_err(sql)? else { break };
        let seq: i64 = row.get(0).map_err(sql)?;
        let hit = read.query_row([seq], |r| checked(r, needle)).map_err(sql)?;
        let Some((id, received_at, envelope)) = hit else { continue };
        total += 1;
        if events.len() < limit {
            events.push(stored_event(id, received_at, &envelope)?);
        }
    }
    Ok((events, total))
}

/// Id, receive time and envelope of a row read as `id, received_at,
/// {BODY_COLUMNS}`, if its text holds the needle.
fn checked(
    r: &rusqlite::Row<'_>,
    needle: &Needle,
) -> rusqlite::Result<Option<(String, i64, String)>> {
    if !needle.found_in(&search::body(r, 2)?) {
        return Ok(None);
    }
    // The envelope is the last of the body's columns.
    Ok(Some((r.get(0)?, r.get(1)?, r.get(7)?)))
}

/// The newest `limit` events of the workspace (`within` its filter) that
/// hold the needle, reading at most `budget` events; `None` when the
/// budget ran out first.
fn walk(
    conn: &Connection,
    needle: &Needle,
    within: &Within<'_>,
    limit: usize,
    budget: u64,
) -> Result<Option<Vec<StoredEvent>>> {
    let read = newest(conn, needle, within, limit, limit as u64, budget)?;
    Ok((!read.stopped).then_some(read.events))
}

/// A search's filter: its SQL (` AND ...` on `e`) with its bindings, and
/// the index that holds the events it selects in time order.
struct Within<'a> {
    q: &'a Sql,
    filter: &'a str,
    index: &'static str,
}

/// What [`newest`] found.
struct Newest {
    /// The first `limit` matches.
    events: Vec<StoredEvent>,
    /// Matches counted.
    total: u64,
    /// The read stopped at its budget with fewer than `enough` matches.
    stopped: bool,
}

/// Reads the workspace's events `within` the filter newest first and
/// checks each for the needle, until `enough` matched, the events end, or
/// `budget` were read. `INDEXED BY`: the events must come in `ts` order
/// from the index, not from a sort of everything the filter selects.
fn newest(
    conn: &Connection,
    needle: &Needle,
    within: &Within<'_>,
    limit: usize,
    enough: u64,
    budget: u64,
) -> Result<Newest> {
    let Within { q, filter, index } = within;
    let mut stmt = conn
        .prepare_cached(&format!(
            "SELECT e.id, e.received_at, {BODY_COLUMNS} FROM events AS e INDEXED BY {index}
             WHERE e.workspace_id = :ws{filter} ORDER BY e.ts DESC, e.seq DESC"
        ))
        .map_err(sql)?;
    let mut rows = stmt.query(q.params().as_slice()).map_err(sql)?;
    let mut found = Newest { events: Vec::new(), total: 0, stopped: false };
    let mut read = 0u64;
    while found.total < enough {
        let Some(row) = rows.next().map_err(sql)? else { break };
        read += 1;
        if read > budget {
            found.stopped = true;
            break;
        }
        if let Some((id, received_at, envelope)) = checked(row, needle).map_err(sql)? {
            found.total += 1;
            if found.events.len() < limit {
                found.events.push(stored_event(id, received_at, &envelope)?);
            }
        }
    }
    Ok(found)
}

fn run_filter() -> String {
    let prefixes: Vec<String> = RUN_PREFIXES.iter().map(|p| format!("'{p}'")).collect();
    format!("substr(event, 1, instr(event, '.')) IN ({})", prefixes.join(", "))
}

fn runs(conn: &Connection, ws: &str, query: &RunQuery) -> Result<Vec<RunSummary>> {
    let mut q = Sql::default();
    q.bind(":ws", ws.to_owned());
    q.bind(":limit", int(query.limit));
    let runs = run_filter();
    let mut filter = String::new();
    if let Some(r) = query.range {
        filter.push_str(" AND ts >= :from AND ts < :to");
        q.bind(":from", r.from);
        q.bind(":to", r.to);
    }
    if let Some(b) = &query.business_id {
        filter.push_str(" AND business_id = :biz");
        q.bind(":biz", b.clone());
    }
    if let Some(t) = &query.trace_id {
        filter.push_str(" AND trace_id = :trace");
        q.bind(":trace", t.clone());
    }
    let having = match &query.actor_id {
        Some(a) => {
            q.bind(":actor", a.clone());
            " HAVING max(actor_id = :actor) = 1"
        }
        None => "",
    };
    let text = format!(
        "WITH agg AS (
            SELECT trace_id, min(ts) AS started, max(ts) AS updated, count(*) AS n FROM events
            WHERE workspace_id = :ws AND trace_id IS NOT NULL AND {runs}{filter}
            GROUP BY trace_id{having} ORDER BY updated DESC, trace_id LIMIT :limit
         )
         SELECT agg.trace_id, agg.started, agg.updated, agg.n, last.event, last.actor_id
         FROM agg JOIN events AS last ON last.seq = (
            SELECT seq FROM events WHERE workspace_id = :ws AND trace_id = agg.trace_id
                AND {runs}{filter}
            ORDER BY ts DESC, seq DESC LIMIT 1)
         ORDER BY agg.updated DESC, agg.trace_id"
    );
    let mut stmt = conn.prepare_cached(&text).map_err(sql)?;
    let rows = stmt
        .query_map(q.params().as_slice(), |r| {
            let last_event: String = r.get(4)?;
            Ok(RunSummary {
                trace_id: r.get(0)?,
                kind: last_event.split('.').next().unwrap_or_default().to_owned(),
                started_at: r.get(1)?,
                updated_at: r.get(2)?,
                events: count(r.get(3)?),
                status: run_status(&last_event).to_owned(),
                last_event,
                actor_id: r.get(5)?,
            })
        })
        .map_err(sql)?;
    rows.collect::<rusqlite::Result<Vec<_>>>().map_err(sql)
}

fn actor_activity(
    conn: &Connection,
    ws: &str,
    range: Range,
    types: &[String],
    actor: Option<&str>,
    limit: usize,
) -> Result<Vec<ActorActivity>> {
    let (q, text) = actor_activity_sql(ws, range, types, actor, limit);
    let mut stmt = conn.prepare_cached(&text).map_err(sql)?;
    let rows = stmt
        .query_map(q.params().as_slice(), |r| {
            Ok(ActorActivity {
                actor_type: r.get(0)?,
                actor_id: r.get(1)?,
                events: count(r.get(2)?),
                revenue: r.get(3)?,
                first_seen: r.get(4)?,
                last_seen: r.get(5)?,
            })
        })
        .map_err(sql)?;
    rows.collect::<rusqlite::Result<Vec<_>>>().map_err(sql)
}

/// The statement of [`actor_activity`] and its parameters.
fn actor_activity_sql(
    ws: &str,
    range: Range,
    types: &[String],
    actor: Option<&str>,
    limit: usize,
) -> (Sql, String) {
    let mut q = Sql::default();
    q.bind(":ws", ws.to_owned());
    q.bind(":from", range.from);
    q.bind(":to", range.to);
    q.bind(":limit", int(limit));
    let mut filter = String::new();
    if *types == AGENT_TYPES[..] {
        // The partial index `events_agent_actors` serves only a query that
        // repeats its WHERE term literally (SQLite cannot tell that bound
        // values match it).
        filter.push_str(&format!(" AND {}", agent_types_term()));
    } else if !types.is_empty() {
        let names: Vec<String> = (0..types.len()).map(|i| format!(":t{i}")).collect();
        for (name, t) in names.iter().zip(types) {
            q.bind(name, t.clone());
        }
        filter.push_str(&format!(" AND actor_type IN ({})", names.join(", ")));
    }
    if let Some(a) = actor {
        filter.push_str(" AND actor_id = :actor");
        q.bind(":actor", a.to_owned());
    }
    let text = format!(
        "SELECT actor_type, actor_id, count(*), coalesce(sum(revenue), 0), min(ts), max(ts)
         FROM events WHERE workspace_id = :ws AND ts >= :from AND ts < :to
            AND actor_id IS NOT NULL{filter}
         GROUP BY actor_type, actor_id ORDER BY count(*) DESC, actor_id LIMIT :limit"
    );
    (q, text)
}

/// `(actor_type = 'agent' OR ...)`: the WHERE term of `events_agent_actors`.
fn agent_types_term() -> String {
    let equalities: Vec<String> =
        AGENT_TYPES.iter().map(|t| format!("actor_type = '{t}'")).collect();
    format!("({})", equalities.join(" OR "))
}

fn proof_gaps(
    conn: &Connection,
    ws: &str,
    range: Range,
    business: Option<&str>,
    limit: usize,
) -> Result<Vec<StoredEvent>> {
    let mut q = Sql::default();
    q.bind(":ws", ws.to_owned());
    q.bind(":from", range.from);
    q.bind(":to", range.to);
    q.bind(":limit", int(limit));
    let mut filter = String::new();
    if let Some(b) = business {
        filter.push_str(" AND business_id = :biz");
        q.bind(":biz", b.to_owned());
    }
    let text = format!(
        "SELECT id, received_at, envelope FROM events INDEXED BY events_decision
         WHERE workspace_id = :ws AND ts >= :from AND ts < :to AND decision_id IS NOT NULL
           AND trust_tier < 'T3' AND json_extract(envelope, '$.proofId') IS NULL{filter}
         ORDER BY ts DESC, seq DESC LIMIT :limit"
    );
    let mut stmt = conn.prepare_cached(&text).map_err(sql)?;
    let rows = stmt
        .query_map(q.params().as_slice(), |r| {
            Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?, r.get::<_, String>(2)?))
        })
        .map_err(sql)?;
    let mut out = Vec::new();
    for row in rows {
        let (id, received_at, envelope) = row.map_err(sql)?;
        out.push(stored_event(id, received_at, &envelope)?);
    }
    Ok(out)
}

fn evaluate(
    conn: &Connection,
    ws: &str,
    definition: &MetricDefinition,
    range: Range,
    business: Option<&str>,
) -> Result<(u64, f64)> {
    let mut q = Sql::default();
    q.bind(":ws", ws.to_owned());
    q.bind(":event", definition.event_name.clone());
    q.bind(":from", range.from);
    q.bind(":to", range.to);
    let value = match (definition.aggregation, definition.property.as_deref()) {
        (Aggregation::Count, _) => "count(*)".to_owned(),
        // Filled in below from the rollup.
        (Aggregation::Unique, _) => "0.0".to_owned(),
        (Aggregation::Sum, Some("revenue") | None) => "coalesce(sum(revenue), 0)".to_owned(),
        (Aggregation::Sum, Some(property)) => {
            q.bind(":path", format!("$.properties.\"{}\"", property.replace('"', "")));
            "coalesce(sum(json_extract(envelope, :path)), 0)".to_owned()
        }
    };
    let mut filter = String::new();
    if let Some(b) = business {
        filter.push_str(" AND business_id = :biz");
        q.bind(":biz", b.to_owned());
    }
    let text = format!(
        "SELECT count(*), {value} FROM events
         WHERE workspace_id = :ws AND event = :event AND ts >= :from AND ts < :to{filter}"
    );
    let (events, value) = conn
        .prepare_cached(&text)
        .and_then(|mut s| {
            s.query_row(q.params().as_slice(), |r| {
                Ok((count(r.get::<_, i64>(0)?), r.get::<_, f64>(1)?))
            })
        })
        .map_err(sql)?;
    if definition.aggregation == Aggregation::Unique {
        let actors = unique_actors(conn, ws, &definition.event_name, Some(range), business)? as f64;
        return Ok((events, actors));
    }
    Ok((events, value))
}

fn from_body<T: serde::de::DeserializeOwned>(body: &str) -> Result<T> {
    serde_json::from_str(body).map_err(Error::internal)
}

#[async_trait]
impl QueryStore for EmbeddedStore {
    async fn event_totals(&self, ws: &str, query: &TotalsQuery) -> Result<Totals> {
        let (ws, query) = (ws.to_owned(), query.clone());
        self.read(move |conn| totals(conn, &ws, &query)).await
    }

    async fn event_series(&self, ws: &str, query: &SeriesQuery) -> Result<Vec<SeriesPoint>> {
        let (ws, query) = (ws.to_owned(), query.clone());
        self.read(move |conn| series(conn, &ws, &query)).await
    }

    async fn funnel(&self, ws: &str, query: &FunnelQuery) -> Result<Vec<u64>> {
        let (ws, query) = (ws.to_owned(), query.clone());
        self.read(move |conn| journeys::funnel(conn, &ws, &query)).await
    }

    async fn attribution(&self, ws: &str, query: &AttributionQuery) -> Result<Attribution> {
        let (ws, query) = (ws.to_owned(), query.clone());
        self.read(move |conn| journeys::attribution(conn, &ws, &query)).await
    }

    async fn search_events(&self, ws: &str, query: &SearchQuery) -> Result<SearchResult> {
        // An index that cannot be written (a full disk) makes this wait
        // end at its bound: the search answers without what it lacks.
        self.wait_for_search_index().await?;
        let (ws, query) = (ws.to_owned(), query.clone());
        self.read(move |conn| search(conn, &ws, &query)).await
    }

    async fn runs(&self, ws: &str, query: &RunQuery) -> Result<Vec<RunSummary>> {
        let (ws, query) = (ws.to_owned(), query.clone());
        self.read(move |conn| runs(conn, &ws, &query)).await
    }

    async fn actor_activity(
        &self,
        ws: &str,
        range: Range,
        types: &[&str],
        actor_id: Option<&str>,
        limit: usize,
    ) -> Result<Vec<ActorActivity>> {
        let ws = ws.to_owned();
        let types: Vec<String> = types.iter().map(|t| (*t).to_owned()).collect();
        let actor = actor_id.map(str::to_owned);
        self.read(move |conn| actor_activity(conn, &ws, range, &types, actor.as_deref(), limit))
            .await
    }

    async fn proof_gaps(
        &self,
        ws: &str,
        range: Range,
        business_id: Option<&str>,
        limit: usize,
    ) -> Result<Vec<StoredEvent>> {
        let (ws, business) = (ws.to_owned(), business_id.map(str::to_owned));
        self.read(move |conn| proof_gaps(conn, &ws, range, business.as_deref(), limit)).await
    }

    async fn connector_loads(
        &self,
        ws: &str,
        since: i64,
        limit: usize,
    ) -> Result<Vec<ConnectorLoad>> {
        let ws = ws.to_owned();
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.read(move |conn| {
            let mut stmt = conn
                .prepare_cached(
                    "SELECT provider, count(*), sum(received), sum(ingested), sum(updated),
                        sum(rejected), max(created_at)
                     FROM connector_syncs WHERE workspace_id = ?1 AND created_at >= ?2
                     GROUP BY provider ORDER BY provider LIMIT ?3",
                )
                .map_err(sql)?;
            let rows = stmt
                .query_map(params![ws, since, limit], |r| {
                    Ok(ConnectorLoad {
                        provider: r.get(0)?,
                        syncs: count(r.get(1)?),
                        received: count(r.get(2)?),
                        ingested: count(r.get(3)?),
                        updated: count(r.get(4)?),
                        rejected: count(r.get(5)?),
                        last_sync_at: r.get(6)?,
                    })
                })
                .map_err(sql)?;
            rows.collect::<rusqlite::Result<Vec<_>>>().map_err(sql)
        })
        .await
    }

    async fn business_exists(&self, ws: &str, business_id: &str) -> Result<bool> {
        let (ws, id) = (ws.to_owned(), business_id.to_owned());
        self.read(move |conn| {
            conn.query_row(
                "SELECT 1 FROM businesses WHERE workspace_id = ?1 AND id = ?2",
                params![ws, id],
                |_| Ok(()),
            )
            .optional()
            .map(|found| found.is_some())
            .map_err(sql)
        })
        .await
    }

    async fn list_entities(
        &self,
        ws: &str,
        kind: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Entity>> {
        let (ws, kind) = (ws.to_owned(), kind.map(str::to_owned));
        self.read(move |conn| {
            let mut q = Sql::default();
            q.bind(":ws", ws);
            q.bind(":limit", int(limit));
            let mut filter = String::new();
            if let Some(k) = kind {
                filter.push_str(" AND type = :kind");
                q.bind(":kind", k);
            }
            let text = format!(
                "SELECT type, id, name, properties, first_seen, last_seen FROM entities
                 WHERE workspace_id = :ws{filter}
                 ORDER BY last_seen DESC, type, id LIMIT :limit"
            );
            let mut stmt = conn.prepare_cached(&text).map_err(sql)?;
            let rows = stmt
                .query_map(q.params().as_slice(), |r| {
                    Ok((
                        r.get::<_, String>(0)?,
                        r.get::<_, String>(1)?,
                        r.get::<_, Option<String>>(2)?,
                        r.get::<_, String>(3)?,
                        r.get::<_, i64>(4)?,
                        r.get::<_, i64>(5)?,
                    ))
                })
                .map_err(sql)?;
            let mut out = Vec::new();
            for row in rows {
                let (kind, id, name, properties, first_seen, last_seen) = row.map_err(sql)?;
                let properties = serde_json::from_str(&properties).map_err(Error::internal)?;
                out.push(Entity { kind, id, name, properties, first_seen, last_seen });
            }
            Ok(out)
        })
        .await
    }

    async fn list_relationships(
        &self,
        ws: &str,
        node: Option<(&str, &str)>,
        limit: usize,
    ) -> Result<Vec<Relationship>> {
        let ws = ws.to_owned();
        let node = node.map(|(t, i)| (t.to_owned(), i.to_owned()));
        self.read(move |conn| {
            let mut q = Sql::default();
            q.bind(":ws", ws);
            q.bind(":limit", int(limit));
            let mut filter = String::new();
            if let Some((t, i)) = node {
                filter.push_str(
                    " AND ((from_type = :nt AND from_id = :ni) OR (to_type = :nt AND to_id = :ni))",
                );
                q.bind(":nt", t);
                q.bind(":ni", i);
            }
            let text = format!(
                "SELECT from_type, from_id, relation, to_type, to_id, count, first_seen, last_seen
                 FROM relationships WHERE workspace_id = :ws{filter}
                 ORDER BY last_seen DESC, from_type, from_id, relation, to_type, to_id
                 LIMIT :limit"
            );
            let mut stmt = conn.prepare_cached(&text).map_err(sql)?;
            let rows = stmt
                .query_map(q.params().as_slice(), |r| {
                    Ok(Relationship {
                        from_type: r.get(0)?,
                        from_id: r.get(1)?,
                        relation: r.get(2)?,
                        to_type: r.get(3)?,
                        to_id: r.get(4)?,
                        count: count(r.get(5)?),
                        first_seen: r.get(6)?,
                        last_seen: r.get(7)?,
                    })
                })
                .map_err(sql)?;
            rows.collect::<rusqlite::Result<Vec<_>>>().map_err(sql)
        })
        .await
    }

    async fn insert_metric_definition(
        &self,
        ws: &str,
        definition: &MetricDefinition,
    ) -> Result<()> {
        let ws = ws.to_owned();
        let body = serde_json::to_string(definition).map_err(Error::internal)?;
        let (id, created_at) = (definition.id.clone(), definition.created_at);
        self.write(move |conn| {
            conn.execute(
                "INSERT INTO metric_definitions (workspace_id, id, created_at, body)
                 VALUES (?1, ?2, ?3, ?4)",
                params![ws, id, created_at, body],
            )
            .map(drop)
            .map_err(sql)
        })
        .await
    }

    async fn list_metric_definitions(
        &self,
        ws: &str,
        limit: usize,
    ) -> Result<Vec<MetricDefinition>> {
        let ws = ws.to_owned();
        self.read(move |conn| list_bodies(conn, "metric_definitions", &ws, limit)).await
    }

    async fn evaluate_metric(
        &self,
        ws: &str,
        definition: &MetricDefinition,
        range: Range,
        business_id: Option<&str>,
    ) -> Result<(u64, f64)> {
        let (ws, definition) = (ws.to_owned(), definition.clone());
        let business = business_id.map(str::to_owned);
        self.read(move |conn| evaluate(conn, &ws, &definition, range, business.as_deref())).await
    }

    async fn insert_metric_snapshots(&self, ws: &str, snapshots: &[MetricSnapshot]) -> Result<()> {
        let ws = ws.to_owned();
        let rows = snapshots
            .iter()
            .map(|s| Ok((s.id.clone(), s.created_at, serde_json::to_string(s)?)))
            .collect::<serde_json::Result<Vec<_>>>()
            .map_err(Error::internal)?;
        self.write(move |conn| {
            let mut stmt = conn
                .prepare_cached(
                    "INSERT INTO metric_snapshots (workspace_id, id, created_at, body)
                     VALUES (?1, ?2, ?3, ?4)",
                )
                .map_err(sql)?;
            for (id, created_at, body) in rows {
                stmt.execute(params![ws, id, created_at, body]).map_err(sql)?;
            }
            Ok(())
        })
        .await
    }

    async fn list_metric_snapshots(&self, ws: &str, limit: usize) -> Result<Vec<MetricSnapshot>> {
        let ws = ws.to_owned();
        self.read(move |conn| list_bodies(conn, "metric_snapshots", &ws, limit)).await
    }
}

/// Newest first from a `(workspace_id, id, created_at, body)` table.
fn list_bodies<T: serde::de::DeserializeOwned>(
    conn: &Connection,
    table: &str,
    ws: &str,
    limit: usize,
) -> Result<Vec<T>> {
    let mut stmt = conn
        .prepare_cached(&format!(
            "SELECT body FROM {table} WHERE workspace_id = ?1
             ORDER BY created_at DESC, id DESC LIMIT ?2"
        ))
        .map_err(sql)?;
    let rows = stmt.query_map(params![ws, int(limit)], |r| r.get::<_, String>(0)).map_err(sql)?;
    let mut out = Vec::new();
    for row in rows {
        out.push(from_body(&row.map_err(sql)?)?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_keeps_whole_hours_for_the_rollup_and_edges_for_events() {
        let h = HOUR_MS;
        let s = split(Range { from: 10 * h + 5, to: 13 * h + 7 });
        assert_eq!(s.hours, (11, 13));
        assert_eq!(s.left, (10 * h + 5, 11 * h));
        assert_eq!(s.right, (13 * h, 13 * h + 7));
        let s = split(Range { from: 10 * h, to: 12 * h });
        assert_eq!((s.hours, s.left.0 == s.left.1, s.right.0 == s.right.1), ((10, 12), true, true));
        // Inside one hour: no rollup at all.
        let s = split(Range { from: 10 * h + 1, to: 10 * h + 9 });
        assert_eq!(s.hours, (0, 0));
        assert_eq!(s.left, (10 * h + 1, 10 * h + 9));
    }

    #[test]
    fn agents_are_read_through_their_partial_index_with_the_same_answer() {
        use crate::store::NewEvent;
        use crate::store::embedded::{
            append_in_transaction, open_writer_connection, prepare_events,
        };
        let dir = tempfile::tempdir().unwrap();
        let conn = open_writer_connection(dir.path()).unwrap();
        let actors = [("robot", "r1"), ("robot", "r1"), ("ai_agent", "a1"), ("user", "u1")];
        let events = actors
            .iter()
            .enumerate()
            .map(|(i, (kind, id))| {
                let mut e = opgraph_proto::Event::named("step.done");
                e.actor = Some(opgraph_proto::Party::Ref {
                    kind: (*kind).into(),
                    id: (*id).into(),
                    extra: Default::default(),
                });
                e.timestamp = Some(1000 + i as i64);
                NewEvent { id: format!("evt_{i}"), received_at: 0, event: e }
            })
            .collect();
        append_in_transaction(&conn, "ws", prepare_events(events), None).unwrap();
        let range = Range { from: 0, to: 10_000 };
        let agents: Vec<String> = AGENT_TYPES.iter().map(|t| (*t).to_owned()).collect();
        let plan = |types: &[String]| {
            let (q, text) = actor_activity_sql("ws", range, types, None, 10);
            let mut stmt = conn.prepare(&format!("EXPLAIN QUERY PLAN {text}")).unwrap();
            let rows = stmt.query_map(q.params().as_slice(), |r| r.get::<_, String>(3)).unwrap();
            rows.collect::<rusqlite::Result<Vec<_>>>().unwrap().join("; ")
        };
        assert!(plan(&agents).contains("events_agent_actors"), "{}", plan(&agents));
        assert!(!plan(&["user".to_owned()]).contains("events_agent_actors"));

        // The literal term answers as the bound one did.
        let literal = actor_activity(&conn, "ws", range, &agents, None, 10).unwrap();
        let mut reordered = agents.clone();
        reordered.reverse(); // not the index's list: bound parameters
        let bound = actor_activity(&conn, "ws", range, &reordered, None, 10).unwrap();
        let ids: Vec<(&str, u64)> =
            literal.iter().map(|a| (a.actor_id.as_str(), a.events)).collect();
        assert_eq!(ids, [("r1", 2), ("a1", 1)]);
        assert_eq!(format!("{literal:?}"), format!("{bound:?}"));
    }

    #[test]
    fn distinct_actors_from_bounds_match_the_events_for_every_range() {
        use crate::store::NewEvent;
        use crate::store::embedded::{
            append_in_transaction, open_writer_connection, prepare_events,
        };
        let h = HOUR_MS;
        let dir = tempfile::tempdir().unwrap();
        let conn = open_writer_connection(dir.path()).unwrap();
        // (actor, business, hour): robot-a surrounds hours 2 to 4, robot-d
        // is in two businesses.
        let stops = [
            ("robot-a", "default", 1),
            ("robot-a", "default", 5),
            ("robot-b", "default", 3),
            ("robot-c", "default", 3),
            ("robot-c", "north", 6),
            ("robot-d", "north", 2),
            ("robot-d", "default", 4),
        ];
        let events = stops
            .iter()
            .enumerate()
            .map(|(i, (actor, business, hour))| {
                let mut e = opgraph_proto::Event::named("shift.ping");
                e.actor = Some(opgraph_proto::Party::Name((*actor).into()));
                e.business_id = Some((*business).into());
                e.timestamp = Some(hour * h);
                NewEvent { id: format!("evt_{i}"), received_at: 0, event: e }
            })
            .collect();
        append_in_transaction(&conn, "ws", prepare_events(events), None).unwrap();
        let mut ranges = vec![None];
        for from in 0..8 {
            for to in from..9 {
                ranges.push(Some(Range { from: from * h, to: to * h }));
            }
        }
        for range in ranges {
            for business in [None, Some("default"), Some("north")] {
                let scan =
                    unique_actors_from_events(&conn, "ws", "shift.ping", range, business).unwrap();
                let fast = unique_actors(&conn, "ws", "shift.ping", range, business).unwrap();
                assert_eq!(fast, scan, "{range:?} {business:?}");
            }
        }
        let bounds = |from: i64, to: i64| {
            let range = Some(Range { from: from * h, to: to * h });
            unique_actors_from_bounds(&conn, "ws", "shift.ping", range, None).unwrap()
        };
        // Everything, or a range that no actor surrounds: from the bounds.
        assert_eq!(bounds(0, 9), Some(4));
        assert_eq!(bounds(1, 7), Some(4));
        // robot-a was seen before and after [2h, 4h): the events decide.
        assert_eq!(bounds(2, 4), None);
        assert_eq!(
            unique_actors(&conn, "ws", "shift.ping", Some(Range { from: 2 * h, to: 4 * h }), None)
                .unwrap(),
            3
        );
    }
}
