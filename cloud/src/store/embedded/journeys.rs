//! Journeys of the embedded store: funnels and attribution, the two
//! queries that follow each actor's events in time order (docs/queries.md).
//!
//! - Funnels read the step events of the range from the `(workspace,
//!   event, ts, actor)` index, one index range per step event, group them
//!   per actor here and run each actor's events, in time order, through
//!   [`WindowFunnel`], which works like ClickHouse's `windowFunnel`: one
//!   pass, keeping per step the latest start that reached it, so a late
//!   restart within the window is found and an out-of-order step never
//!   counts. (Grouping in SQL meant sorting every row by actor text in
//!   SQLite's sorter: three times slower.)
//! - Attribution sees each conversion's touchpoints through window frames
//!   over the actor's conversions and touchpoints (no join: a join's plan
//!   depended on statistics and could degrade to a nested loop) and sums
//!   credit per touchpoint key, split into dimensions here.

use std::collections::HashMap;

use rusqlite::Connection;

use super::queries::Sql;
use super::sql;
use crate::error::Result;
use crate::store::queries::{
    Attribution, AttributionModel, AttributionQuery, AttributionRow, FunnelQuery,
};

/// One actor's progress: the number of leading steps it completed in
/// order. Rows come in time order; `mask` has bit `k` set when the row is
/// an event of step `k`. For each step the state keeps the latest start
/// time of a chain that reached it (a later start leaves more of the
/// window); steps are tried from the last down, so one row never advances
/// two steps.
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

/// A step event of one actor: the actor as a number (its text is interned
/// once), the steps it is an event of, and its place in time and storage.
#[derive(Clone, Copy)]
struct StepRow {
    actor: u32,
    mask: u32,
    ts: i64,
    seq: i64,
}

pub(super) fn funnel(conn: &Connection, ws: &str, query: &FunnelQuery) -> Result<Vec<u64>> {
    let steps = query.steps.len().min(31);
    // One read per distinct event name; a name used by several steps (a
    // repeated step) carries all their bits.
    let mut names: Vec<(&str, u32)> = Vec::new();
    for (k, step) in query.steps.iter().take(steps).enumerate() {
        match names.iter_mut().find(|(name, _)| *name == step.as_str()) {
            Some((_, mask)) => *mask |= 1 << k,
            None => names.push((step.as_str(), 1 << k)),
        }
    }
    let mut q = Sql::default();
    q.bind(":ws", ws.to_owned());
    q.bind(":from", query.range.from);
    q.bind(":until", query.range.to.saturating_add(query.window_ms));
    let mut filter = String::new();
    if let Some(b) = &query.business_id {
        filter.push_str(" AND business_id = :biz");
        q.bind(":biz", b.clone());
    }
    let text = format!(
        "SELECT actor_id, ts, seq FROM events
         WHERE workspace_id = :ws AND event = :event AND ts >= :from AND ts < :until
           AND actor_id IS NOT NULL{filter}"
    );
    let mut actors: HashMap<String, u32> = HashMap::new();
    let mut rows: Vec<StepRow> = Vec::new();
    let mut per_actor: Vec<u32> = Vec::new();
    for (name, mask) in names {
        let mut q = q.clone();
        q.bind(":event", name.to_owned());
        let mut stmt = conn.prepare_cached(&text).map_err(sql)?;
        let params = q.params();
        let mut found = stmt.query(params.as_slice()).map_err(sql)?;
        while let Some(row) = found.next().map_err(sql)? {
            let actor = row.get_ref(0).and_then(|v| Ok(v.as_str()?)).map_err(sql)?;
            let actor = match actors.get(actor) {
                Some(&id) => id,
                None => {
                    let id = u32::try_from(actors.len()).unwrap_or(u32::MAX);
                    actors.insert(actor.to_owned(), id);
                    per_actor.push(0);
                    id
                }
            };
            per_actor[actor as usize] += 1;
            let (ts, seq) = (row.get(1).map_err(sql)?, row.get(2).map_err(sql)?);
            rows.push(StepRow { actor, mask, ts, seq });
        }
    }
    drop(actors);
    // Each actor's rows side by side (a counting sort: one pass, where a
    // comparison sort of millions of rows took longer than reading them),
    // then each actor's few rows in time order.
    let mut start = Vec::with_capacity(per_actor.len() + 1);
    let mut at = 0usize;
    start.push(0);
    for n in &per_actor {
        at += *n as usize;
        start.push(at);
    }
    let mut next = start.clone();
    let mut grouped = vec![StepRow { actor: 0, mask: 0, ts: 0, seq: 0 }; rows.len()];
    for row in rows {
        let slot = &mut next[row.actor as usize];
        grouped[*slot] = row;
        *slot += 1;
    }
    let mut reached = vec![0u64; query.steps.len()];
    for bounds in start.windows(2) {
        let events = &mut grouped[bounds[0]..bounds[1]];
        events.sort_unstable_by_key(|r| (r.ts, r.seq));
        let mut actor = WindowFunnel::new(query.window_ms, query.range.to, steps);
        for e in events.iter() {
            actor.step(e.mask, e.ts);
        }
        for slot in reached.iter_mut().take(actor.level()) {
            *slot += 1;
        }
    }
    Ok(reached)
}

/// Separates a touchpoint's attributes in its key, and stands for an
/// absent one (never in real text: ASCII unit and record separators).
const SEP: char = '\u{1f}';
const NONE: char = '\u{1e}';

pub(super) fn attribution(
    conn: &Connection,
    ws: &str,
    query: &AttributionQuery,
) -> Result<Attribution> {
    let mut q = Sql::default();
    q.bind(":ws", ws.to_owned());
    q.bind(":from", query.range.from);
    q.bind(":to", query.range.to);
    q.bind(":lookback", query.lookback_ms);
    let mut biz = String::new();
    if let Some(b) = &query.business_id {
        biz.push_str(" AND business_id = :biz");
        q.bind(":biz", b.clone());
    }
    // Without a conversion event, conversions are the events with revenue,
    // read through their partial index (schema.sql: `events_revenue`).
    let (conv_index, conversion) = match &query.conversion_event {
        Some(e) => {
            q.bind(":conv", e.clone());
            ("", "event = :conv")
        }
        None => (" INDEXED BY events_revenue", "revenue IS NOT NULL"),
    };
    // Each touchpoint as one text key of its four attributes; each
    // conversion sees its actor's touchpoints through a window frame
    // reaching `lookback` back (no join: one sort of the candidate rows).
    // `first`/`last` pick by the touchpoint's (ts, seq), packed in front
    // of its key; `linear` spreads each conversion over the `n`
    // touchpoints of its frame, summed per touchpoint by a frame reaching
    // `lookback` forward.
    let credit = match query.model {
        AttributionModel::FirstTouch | AttributionModel::LastTouch => {
            let pick = if query.model == AttributionModel::FirstTouch { "first" } else { "last" };
            format!(
                "SELECT 'c', substr({pick}, 31), count(*), sum(r) FROM w
                 WHERE is_conv = 1 AND n > 0 GROUP BY 2"
            )
        }
        AttributionModel::Linear => "SELECT 'c', k, sum(credit), sum(rev) FROM (
                SELECT is_conv, k,
                    sum(CASE WHEN is_conv = 1 AND n > 0 THEN 1.0 / n END) OVER fwd AS credit,
                    sum(CASE WHEN is_conv = 1 AND n > 0 THEN r / n END) OVER fwd AS rev
                FROM w
                WINDOW fwd AS (PARTITION BY a ORDER BY ts
                    RANGE BETWEEN CURRENT ROW AND :lookback FOLLOWING)
             ) WHERE is_conv = 0 AND credit > 0 GROUP BY k"
            .to_owned(),
    };
    let text = format!(
        "WITH conv AS MATERIALIZED (
            SELECT seq, actor_id AS a, ts, coalesce(revenue, 0) AS r FROM events{conv_index}
            WHERE workspace_id = :ws AND ts >= :from AND ts < :to AND {conversion}{biz}
         ),
         tp AS MATERIALIZED (
            SELECT seq, actor_id AS a, ts,
                coalesce(source, char(30)) || char(31) || coalesce(campaign, char(30))
                || char(31) || coalesce(channel, char(30)) || char(31)
                || coalesce(CASE WHEN object_id IS NULL THEN NULL
                                 WHEN object_type IS NULL THEN object_id
                                 ELSE object_type || ':' || object_id END, char(30)) AS k
            FROM events INDEXED BY events_touchpoint
            WHERE workspace_id = :ws AND ts >= :from - :lookback AND ts < :to
              AND actor_id IS NOT NULL
              AND (source IS NOT NULL OR campaign IS NOT NULL OR channel IS NOT NULL){biz}
         ),
         w AS MATERIALIZED (
            SELECT a, ts, is_conv, r, k,
                sum(1 - is_conv) OVER back AS n,
                min(CASE WHEN is_conv = 0 THEN printf('%015d%015d', ts, seq) || k END)
                    OVER back AS first,
                max(CASE WHEN is_conv = 0 THEN printf('%015d%015d', ts, seq) || k END)
                    OVER back AS last
            FROM (SELECT a, ts, seq, 1 AS is_conv, r, NULL AS k FROM conv WHERE a IS NOT NULL
                  UNION ALL SELECT a, ts, seq, 0, 0, k FROM tp)
            WINDOW back AS (PARTITION BY a ORDER BY ts
                RANGE BETWEEN :lookback PRECEDING AND CURRENT ROW)
         )
         {credit}
         UNION ALL SELECT 't', k, count(*), 0 FROM tp WHERE ts >= :from GROUP BY k
         UNION ALL SELECT 'n', '', count(*), coalesce(sum(r), 0) FROM conv
         UNION ALL SELECT 'a', '', count(*), 0 FROM w WHERE is_conv = 1 AND n > 0"
    );
    let mut stmt = conn.prepare_cached(&text).map_err(sql)?;
    let rows = stmt
        .query_map(q.params().as_slice(), |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, f64>(2)?,
                r.get::<_, f64>(3)?,
            ))
        })
        .map_err(sql)?;
    let mut dims: [HashMap<String, AttributionRow>; 4] = Default::default();
    let mut out = Attribution::default();
    let mut attributed = 0u64;
    for row in rows {
        let (kind, key, a, b) = row.map_err(sql)?;
        match kind.as_str() {
            "c" | "t" => {
                for (d, part) in key.split(SEP).take(4).enumerate() {
                    let name = if part.starts_with(NONE) { "(none)" } else { part };
                    let row = dims[d].entry(name.to_owned()).or_insert_with(|| empty_row(name));
                    if kind == "c" {
                        row.conversions += a;
                        row.revenue += b;
                    } else {
                        row.touchpoints += a.max(0.0) as u64;
                    }
                }
            }
            "n" => {
                out.conversions = a.max(0.0) as u64;
                out.revenue = b;
            }
            _ => attributed = a.max(0.0) as u64,
        }
    }
    out.unattributed = out.conversions.saturating_sub(attributed);
    let [source, campaign, channel, entity] = dims;
    let ranked = |map: HashMap<String, AttributionRow>| {
        let mut rows: Vec<AttributionRow> = map
            .into_values()
            .map(|mut r| {
                // Sums of shares: round away float noise (0.30000000000000004).
                r.conversions = (r.conversions * 1e9).round() / 1e9;
                r.revenue = (r.revenue * 1e6).round() / 1e6;
                r
            })
            .collect();
        rows.sort_by(|a, b| {
            b.conversions
                .total_cmp(&a.conversions)
                .then(b.revenue.total_cmp(&a.revenue))
                .then(b.touchpoints.cmp(&a.touchpoints))
                .then(a.key.cmp(&b.key))
        });
        rows.truncate(query.limit);
        rows
    };
    out.by_source = ranked(source);
    out.by_campaign = ranked(campaign);
    out.by_channel = ranked(channel);
    out.by_entity = ranked(entity);
    Ok(out)
}

fn empty_row(key: &str) -> AttributionRow {
    AttributionRow { key: key.to_owned(), touchpoints: 0, conversions: 0.0, revenue: 0.0 }
}
