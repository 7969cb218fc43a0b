//! Attribution on ClickHouse: ClickHouse selects the conversions and the
//! touchpoints of the range (and the lookback before it); the cloud gives
//! each conversion's credit to its actor's touchpoints at or before it
//! within the lookback, by model, exactly as the embedded store's window
//! frames do (docs/queries.md).

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
    /// The touchpoint's key in each dimension: source, campaign, channel,
    /// entity (`type:id`, or the id alone).
    fn keys(&self) -> [Cow<'_, str>; 4] {
        fn part(s: &str) -> Cow<'_, str> {
            if s.is_empty() { NONE } else { s }.into()
        }
        let entity = match (self.object_type.as_str(), self.object_id.as_str()) {
            (_, "") => NONE.into(),
            ("", id) => id.into(),
            (kind, id) => format!("{kind}:{id}").into(),
        };
        [part(&self.source), part(&self.campaign), part(&self.channel), entity]
    }
}

const NONE: &str = "(none)";

pub(super) async fn attribution(
    store: &ClickHouseStore,
    ws: &str,
    q: &AttributionQuery,
) -> Result<Attribution> {
    let business = q.business_id.as_deref();
    let conversion = if q.conversion_event.is_some() { "event = ?" } else { "has_revenue = 1" };
    let filter = super::queries::Filter::new(ws, business, None, Some(q.range));
    let sql =
        format!("SELECT actor_id, ts, revenue FROM events WHERE {} AND {conversion}", filter.sql);
    let mut query = filter.query(store, &sql);
    if let Some(event) = &q.conversion_event {
        query = query.bind(event.as_str());
    }

    let reach = Range { from: q.range.from.saturating_sub(q.lookback_ms), to: q.range.to };
    let touch_filter = super::queries::Filter::new(ws, business, None, Some(reach));
    let touch_sql = format!(
        "SELECT actor_id, ts, seq, source, campaign, channel, object_type, object_id
         FROM events WHERE {} AND actor_id != ''
            AND (source != '' OR campaign != '' OR channel != '')",
        touch_filter.sql
    );
    // Independent reads: the server runs them side by side.
    let (conversions, touches): (Vec<ConversionRead>, Vec<TouchRead>) = tokio::try_join!(
        run(query.sent().fetch_all()),
        run(touch_filter.query(store, &touch_sql).sent().fetch_all()),
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
    for t in touches.iter().filter(|t| t.ts >= q.range.from) {
        credit(t.keys(), 0.0, 0.0, 1);
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
