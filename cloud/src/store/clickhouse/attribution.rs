//! Attribution on ClickHouse: ClickHouse selects the conversions of the
//! range, counts the range's touchpoints by key, and selects the
//! touchpoints (range and lookback) of the actors that converted; the
//! cloud gives each conversion's credit to its actor's touchpoints at or
//! before it within the lookback, by model, exactly as the embedded store's
//! window frames do (docs/queries.md). Only converting actors' touchpoints
//! cross the wire: on a large range most touchpoints lead nowhere.

use std::borrow::Cow;
use std::collections::HashMap;

use clickhouse::Row;
use serde::Deserialize;

use super::{ClickHouseStore, Sent, run};
use crate::error::Result;
use crate::store::queries::{
    Attribution, AttributionModel, AttributionQuery, AttributionRow, Range, rank_attribution,
};

#[derive(Row, Deserialize)]
struct ConversionRead {
    actor_id: String,
    ts: i64,
    revenue: f64,
}

/// A touchpoint's key in each dimension: source, campaign, channel, entity
/// (`type:id`, or the id alone).
fn keys<'a>(
    [source, campaign, channel, object_type, object_id]: [&'a str; 5],
) -> [Cow<'a, str>; 4] {
    fn part(s: &str) -> Cow<'_, str> {
        if s.is_empty() { NONE } else { s }.into()
    }
    let entity = match (object_type, object_id) {
        (_, "") => NONE.into(),
        ("", id) => id.into(),
        (kind, id) => format!("{kind}:{id}").into(),
    };
    [part(source), part(campaign), part(channel), entity]
}

/// Columns in [`keys`]' order; rows are read by position.
#[derive(Row, Deserialize)]
struct TouchRead {
    actor_id: String,
    ts: i64,
    seq: u64,
    source: String,
    campaign: String,
    channel: String,
    object_type: String,
    object_id: String,
}

impl TouchRead {
    fn keys(&self) -> [Cow<'_, str>; 4] {
        keys([&self.source, &self.campaign, &self.channel, &self.object_type, &self.object_id])
    }
}

#[derive(Row, Deserialize)]
struct TouchCount {
    source: String,
    campaign: String,
    channel: String,
    object_type: String,
    object_id: String,
    touchpoints: u64,
}

impl TouchCount {
    fn keys(&self) -> [Cow<'_, str>; 4] {
        keys([&self.source, &self.campaign, &self.channel, &self.object_type, &self.object_id])
    }
}

const KEY_COLUMNS: &str = "source, campaign, channel, object_type, object_id";
const IS_TOUCH: &str = "actor_id != '' AND (source != '' OR campaign != '' OR channel != '')";

const NONE: &str = "(none)";

pub(super) async fn attribution(
    store: &ClickHouseStore,
    ws: &str,
    q: &AttributionQuery,
) -> Result<Attribution> {
    let business = q.business_id.as_deref();
    let conversion = if q.conversion_event.is_some() { "event = ?" } else { "has_revenue = 1" };
    let filter = super::queries::Filter::new(ws, business, None, Some(q.range));
    let conversions_sql = format!("events WHERE {} AND {conversion}", filter.sql);
    let converted = |query: clickhouse::query::Query| {
        let query = filter.bind(query);
        match &q.conversion_event {
            Some(event) => query.bind(event.as_str()),
            None => query,
        }
    };
    let query = converted(
        store.client.query(&format!("SELECT actor_id, ts, revenue FROM {conversions_sql}")),
    );

    let count_sql = format!(
        "SELECT {KEY_COLUMNS}, count() FROM events WHERE {} AND {IS_TOUCH} GROUP BY {KEY_COLUMNS}",
        filter.sql
    );
    let reach = Range { from: q.range.from.saturating_sub(q.lookback_ms), to: q.range.to };
    let touch_filter = super::queries::Filter::new(ws, business, None, Some(reach));
    // GLOBAL: on a cluster the subquery runs once, over every shard.
    let touch_sql = format!(
        "SELECT actor_id, ts, seq, {KEY_COLUMNS} FROM events WHERE {} AND {IS_TOUCH}
            AND actor_id GLOBAL IN (SELECT actor_id FROM {conversions_sql})",
        touch_filter.sql
    );
    let touch_query = converted(touch_filter.query(store, &touch_sql));
    // Independent reads: the server runs them side by side.
    let (conversions, counts, touches): (Vec<ConversionRead>, Vec<TouchCount>, Vec<TouchRead>) = tokio::try_join!(
        run(query.sent().fetch_all()),
        run(filter.query(store, &count_sql).sent().fetch_all()),
        run(touch_query.sent().fetch_all()),
    )?;

    // Rows are looked up by borrowed key: a touchpoint allocates only
    // for a key not seen before.
    let mut dims: [HashMap<String, AttributionRow>; 4] = Default::default();
    let mut credit = |keys: [Cow<'_, str>; 4], conversions: f64, revenue: f64, touchpoints: u64| {
        for (dim, key) in dims.iter_mut().zip(keys) {
            if !dim.contains_key(key.as_ref()) {
                let key = key.clone().into_owned();
                let row = AttributionRow {
                    key: key.clone(),
                    touchpoints: 0,
                    conversions: 0.0,
                    revenue: 0.0,
                };
                dim.insert(key, row);
            }
            if let Some(row) = dim.get_mut(key.as_ref()) {
                row.conversions += conversions;
                row.revenue += revenue;
                row.touchpoints += touchpoints;
            }
        }
    };
    for c in &counts {
        credit(c.keys(), 0.0, 0.0, c.touchpoints);
    }
    let mut by_actor: HashMap<&str, Vec<&TouchRead>> = HashMap::new();
    for t in &touches {
        by_actor.entry(t.actor_id.as_str()).or_default().push(t);
    }
    for list in by_actor.values_mut() {
        list.sort_unstable_by_key(|t| (t.ts, t.seq));
    }
    let mut out = Attribution {
        conversions: conversions.len() as u64,
        revenue: conversions.iter().map(|c| c.revenue).sum(),
        ..Default::default()
    };
    let mut attributed = 0u64;
    for c in &conversions {
        let Some(list) = by_actor.get(c.actor_id.as_str()).filter(|_| !c.actor_id.is_empty())
        else {
            continue;
        };
        // Touchpoints with ts in [c.ts - lookback, c.ts], ties included.
        let start = list.partition_point(|t| t.ts < c.ts.saturating_sub(q.lookback_ms));
        let end = list.partition_point(|t| t.ts <= c.ts);
        let window = &list[start..end.max(start)];
        if window.is_empty() {
            continue;
        }
        attributed += 1;
        match q.model {
            AttributionModel::FirstTouch => credit(window[0].keys(), 1.0, c.revenue, 0),
            AttributionModel::LastTouch => {
                credit(window[window.len() - 1].keys(), 1.0, c.revenue, 0);
            }
            AttributionModel::Linear => {
                let n = window.len() as f64;
                for t in window {
                    credit(t.keys(), 1.0 / n, c.revenue / n, 0);
                }
            }
        }
    }
    out.unattributed = out.conversions.saturating_sub(attributed);
    let ranked = |map| rank_attribution(map, q.limit);
    let [source, campaign, channel, entity] = dims;
    out.by_source = ranked(source);
    out.by_campaign = ranked(campaign);
    out.by_channel = ranked(channel);
    out.by_entity = ranked(entity);
    Ok(out)
}
