//! The first queries of [`QueryStore`] on ClickHouse: per-event totals and
//! time series, straight from the events (ClickHouse aggregates a month of
//! events faster than SQLite reads an hourly rollup, so there is none).

use clickhouse::Row;
use serde::Deserialize;

use super::events::seconds;
use super::{ClickHouseStore, Sent, run};
use crate::error::Result;
use crate::store::queries::{EventTotals, Range, SeriesPoint, SeriesQuery, Totals, TotalsQuery};

#[derive(Row, Deserialize)]
struct TotalsRead {
    event: String,
    count: u64,
    revenue: f64,
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
struct Filter {
    sql: String,
    texts: Vec<String>,
    numbers: Vec<i64>,
}

impl Filter {
    /// Texts are bound before numbers: the clauses keep that order.
    fn new(ws: &str, business: Option<&str>, event: Option<&str>, range: Option<Range>) -> Filter {
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

    fn query(&self, store: &ClickHouseStore, sql: &str) -> clickhouse::query::Query {
        let mut query = store.client.query(sql);
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
    // uniqExact only when asked: it is the costly column.
    let unique = if q.unique_actors { "uniqExactIf(actor_id, actor_id != '')" } else { "0" };
    let sql = format!(
        "SELECT event, count() AS c, sum(revenue), toUInt64({unique}) FROM events
         WHERE {} GROUP BY event ORDER BY c DESC, event",
        filter.sql
    );
    let rows: Vec<TotalsRead> = run(filter.query(store, &sql).sent().fetch_all()).await?;
    let mut out = Totals::default();
    for row in rows {
        out.total_events += row.count;
        out.total_revenue += row.revenue;
        if out.events.len() < q.limit {
            out.events.push(EventTotals {
                event_name: row.event,
                count: row.count,
                unique_actors: q.unique_actors.then_some(row.unique_actors),
                revenue: row.revenue,
            });
        }
    }
    Ok(out)
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
    let name = if q.by_event { "event" } else { "''" };
    let sql = format!(
        "SELECT {bucket} AS b, {name} AS e, count(), sum(revenue) FROM events
         WHERE {} GROUP BY b, e ORDER BY b, e",
        filter.sql
    );
    let rows: Vec<SeriesRead> = run(filter.query(store, &sql).sent().fetch_all()).await?;
    Ok(rows
        .into_iter()
        .map(|r| SeriesPoint {
            bucket: r.bucket,
            event_name: q.by_event.then_some(r.event),
            count: r.count,
            revenue: r.revenue,
        })
        .collect())
}
