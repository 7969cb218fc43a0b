//! Attribution on ClickHouse, computed by the server: one statement gives
//! each conversion's credit to its actor's touchpoints at or before it
//! within the lookback, by model, exactly as the embedded store's window
//! frames do (docs/queries.md), and sums the shares per touchpoint key;
//! another counts the range's touchpoints per key. A few hundred rows cross
//! the wire instead of every touchpoint of the range.

use std::borrow::Cow;

use clickhouse::Row;
use serde::Deserialize;

use super::{ClickHouseStore, Sent, run};
use crate::error::Result;
use crate::store::queries::{
    Attribution, AttributionModel, AttributionQuery, AttributionSums, NO_KEY, Range,
};

#[derive(Row, Deserialize)]
struct ConversionTotals {
    conversions: u64,
    revenue: f64,
}

/// One touchpoint key's sums: its touchpoints in the range (counted) or
/// its share of the conversions and their revenue (credited).
#[derive(Row, Deserialize)]
struct KeySums {
    source: String,
    campaign: String,
    channel: String,
    object_type: String,
    object_id: String,
    touchpoints: u64,
    conversions: f64,
    revenue: f64,
}

impl KeySums {
    /// The key in each dimension: source, campaign, channel, entity
    /// (`type:id`, or the id alone); `''` is absent.
    fn keys(&self) -> [Cow<'_, str>; 4] {
        fn part(s: &str) -> Cow<'_, str> {
            if s.is_empty() { NO_KEY } else { s }.into()
        }
        let entity = match (self.object_type.as_str(), self.object_id.as_str()) {
            (_, "") => NO_KEY.into(),
            ("", id) => id.into(),
            (kind, id) => format!("{kind}:{id}").into(),
        };
        [part(&self.source), part(&self.campaign), part(&self.channel), entity]
    }
}

const KEY_COLUMNS: &str = "source, campaign, channel, object_type, object_id";
const IS_TOUCH: &str = "actor_id != '' AND (source != '' OR campaign != '' OR channel != '')";

pub(super) async fn attribution(
    store: &ClickHouseStore,
    ws: &str,
    q: &AttributionQuery,
) -> Result<Attribution> {
    let business = q.business_id.as_deref();
    let conversion = if q.conversion_event.is_some() { "event = ?" } else { "has_revenue = 1" };
    let filter = super::queries::Filter::new(ws, business, None, Some(q.range));
    let conversions = format!("events WHERE {} AND {conversion}", filter.sql);
    let converted = |query: clickhouse::query::Query| {
        let query = filter.bind(query);
        match &q.conversion_event {
            Some(event) => query.bind(event.as_str()),
            None => query,
        }
    };
    let totals =
        converted(store.client.query(&format!("SELECT count(), sum(revenue) FROM {conversions}")));

    let count_sql = format!(
        "SELECT {KEY_COLUMNS}, count(), toFloat64(0), toFloat64(0) FROM events
         WHERE {} AND {IS_TOUCH} GROUP BY {KEY_COLUMNS}",
        filter.sql
    );
    let counts = filter.query(store, &count_sql);

    // Each conversion joins its actor's touchpoints, sorted by time and
    // arrival; the window keeps those in [ts - lookback, ts], the model
    // picks from it and splits the conversion evenly over the picks. The
    // bounds reach the lambda as arrays: 18.16 loses a subquery's columns
    // that only a lambda names.
    // GLOBAL: on a cluster the right side and the subquery run once, over
    // every shard.
    let reach = Range { from: q.range.from.saturating_sub(q.lookback_ms), to: q.range.to };
    let touch_filter = super::queries::Filter::new(ws, business, None, Some(reach));
    let picked = match q.model {
        AttributionModel::FirstTouch => "arraySlice(window, 1, 1)",
        AttributionModel::LastTouch => "arraySlice(window, -1, 1)",
        AttributionModel::Linear => "window",
    };
    let credit_sql = format!(
        "SELECT tupleElement(touch, 1) AS source, tupleElement(touch, 2) AS campaign,
            tupleElement(touch, 3) AS channel, tupleElement(touch, 4) AS object_type,
            tupleElement(touch, 5) AS object_id,
            toUInt64(0), sum(share), sum(share * revenue)
         FROM (
            SELECT revenue, {picked} AS picked, 1 / length(picked) AS share,
                arrayJoin(picked) AS touch
            FROM (
                SELECT revenue, arrayFilter(
                    (t, start, end) -> tupleElement(t, 6) >= start AND tupleElement(t, 6) <= end,
                    touches,
                    arrayResize([start], length(touches), start),
                    arrayResize([end], length(touches), end)) AS window
                FROM (
                    SELECT actor_id, ts - {lookback} AS start, ts AS end, revenue
                    FROM {conversions}
                ) AS conversion
                GLOBAL ALL INNER JOIN (
                    SELECT actor_id, arraySort(
                        t -> (tupleElement(t, 6), tupleElement(t, 7)),
                        groupArray(({KEY_COLUMNS}, ts, seq))) AS touches
                    FROM events WHERE {} AND {IS_TOUCH}
                        AND actor_id GLOBAL IN (SELECT actor_id FROM {conversions})
                    GROUP BY actor_id
                ) AS touched USING actor_id
            )
            WHERE notEmpty(window)
         )
         GROUP BY source, campaign, channel, object_type, object_id",
        touch_filter.sql,
        lookback = q.lookback_ms,
    );
    let credits = converted(touch_filter.bind(converted(store.client.query(&credit_sql))));

    // Independent reads: the server runs them side by side.
    let (totals, counts, credits): (ConversionTotals, Vec<KeySums>, Vec<KeySums>) = tokio::try_join!(
        run(totals.sent().fetch_one()),
        run(counts.sent().fetch_all()),
        run(credits.sent().fetch_all()),
    )?;

    let mut sums = AttributionSums::default();
    let mut shares = 0.0;
    for row in counts.iter().chain(&credits) {
        shares += row.conversions;
        let keys = row.keys();
        sums.add(
            keys.each_ref().map(|k| k.as_ref()),
            row.touchpoints,
            row.conversions,
            row.revenue,
        );
    }
    // Every attributed conversion hands out shares summing to 1.
    let attributed = shares.round() as u64;
    Ok(sums.into_attribution(totals.conversions, totals.revenue, attributed, q.limit))
}
