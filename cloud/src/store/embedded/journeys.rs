//! Journeys of the embedded store: funnels and attribution, the two
//! queries that follow each actor's events in time order (docs/queries.md).
//!
//! - Funnels group the step events per actor and run them through
//!   `window_funnel`, an aggregate registered on every read connection
//!   ([`register_functions`]) that works like ClickHouse's `windowFunnel`:
//!   one pass over an actor's events in time order, keeping per step the
//!   latest start that reached it, so a late restart within the window is
//!   found and an out-of-order step never counts.
//! - Attribution sees each conversion's touchpoints through window frames
//!   over the actor's conversions and touchpoints (no join: a join's plan
//!   depended on statistics and could degrade to a nested loop) and sums
//!   credit per touchpoint key, split into dimensions here.

use std::collections::HashMap;

use rusqlite::Connection;
use rusqlite::functions::{Aggregate, Context, FunctionFlags};

use super::queries::{Sql, count, int};
use super::sql;
use crate::error::Result;
use crate::store::queries::{
    Attribution, AttributionModel, AttributionQuery, AttributionRow, FunnelQuery,
};

/// Registers the SQL functions the queries use; called for every read
/// connection.
pub(super) fn register_functions(conn: &Connection) -> rusqlite::Result<()> {
    conn.create_aggregate_function(
        "window_funnel",
        5,
        FunctionFlags::SQLITE_UTF8 | FunctionFlags::SQLITE_DETERMINISTIC,
        WindowFunnel,
    )
}

/// `window_funnel(window_ms, start_before_ms, steps, mask, ts ORDER BY ts)`:
/// the number of leading steps (0 to `steps`) one actor completed in order.
/// `mask` has bit `k` set when the row is an event of step `k`. For each
/// step the state keeps the latest start time of a chain that reached it
/// (a later start leaves more of the window); steps are tried from the last
/// down, so one row never advances two steps.
struct WindowFunnel;

struct FunnelState {
    window: i64,
    start_before: i64,
    starts: Vec<Option<i64>>,
}

impl Aggregate<FunnelState, i64> for WindowFunnel {
    fn init(&self, ctx: &mut Context<'_>) -> rusqlite::Result<FunnelState> {
        let steps = usize::try_from(ctx.get::<i64>(2)?).unwrap_or(0).min(63);
        Ok(FunnelState {
            window: ctx.get(0)?,
            start_before: ctx.get(1)?,
            starts: vec![None; steps],
        })
    }

    fn step(&self, ctx: &mut Context<'_>, state: &mut FunnelState) -> rusqlite::Result<()> {
        let mask: i64 = ctx.get(3)?;
        let ts: i64 = ctx.get(4)?;
        for k in (0..state.starts.len()).rev() {
            if mask & (1 << k) == 0 {
                continue;
            }
            if k == 0 {
                if ts < state.start_before {
                    state.starts[0] = Some(ts);
                }
            } else if let Some(start) = state.starts[k - 1]
                && ts - start <= state.window
            {
                state.starts[k] = Some(start);
            }
        }
        Ok(())
    }

    fn finalize(&self, _: &mut Context<'_>, state: Option<FunnelState>) -> rusqlite::Result<i64> {
        Ok(state.map_or(0, |s| s.starts.iter().rposition(Option::is_some).map_or(0, |k| k + 1))
            as i64)
    }
}

pub(super) fn funnel(conn: &Connection, ws: &str, query: &FunnelQuery) -> Result<Vec<u64>> {
    let mut q = Sql::default();
    q.bind(":ws", ws.to_owned());
    q.bind(":from", query.range.from);
    q.bind(":to", query.range.to);
    q.bind(":until", query.range.to.saturating_add(query.window_ms));
    q.bind(":window", query.window_ms);
    q.bind(":steps", int(query.steps.len()));
    let mut mask = Vec::new();
    let mut names = Vec::new();
    for (k, step) in query.steps.iter().enumerate() {
        let name = format!(":s{k}");
        mask.push(format!("(CASE WHEN event = {name} THEN {} ELSE 0 END)", 1_i64 << k));
        names.push(name.clone());
        q.bind(&name, step.clone());
    }
    let mut filter = String::new();
    if let Some(b) = &query.business_id {
        filter.push_str(" AND business_id = :biz");
        q.bind(":biz", b.clone());
    }
    let text = format!(
        "SELECT level, count(*) FROM (
            SELECT window_funnel(:window, :to, :steps, {mask}, ts ORDER BY ts, seq) AS level
            FROM events
            WHERE workspace_id = :ws AND event IN ({names}) AND ts >= :from AND ts < :until
              AND actor_id IS NOT NULL{filter}
            GROUP BY actor_id
         ) GROUP BY level",
        mask = mask.join(" | "),
        names = names.join(", "),
    );
    let mut stmt = conn.prepare_cached(&text).map_err(sql)?;
    let rows = stmt
        .query_map(q.params().as_slice(), |r| Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?)))
        .map_err(sql)?;
    let mut reached = vec![0u64; query.steps.len()];
    for row in rows {
        let (level, actors) = row.map_err(sql)?;
        let level = usize::try_from(level).unwrap_or(0).min(reached.len());
        for slot in reached.iter_mut().take(level) {
            *slot += count(actors);
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
