//! The store conformance suite: one known dataset ([`load`]) and the answers
//! computed by hand, run against every [`Store`] backend.
//!
//! A backend runs the whole suite with one line in its tests:
//!
//! ```ignore
//! opgraph_cloud::store_conformance!(my_backend_opener);
//! ```
//!
//! where `my_backend_opener()` is an async fn returning `(store, guard)`:
//! a fresh, empty store, and whatever must live as long as it (a temporary
//! directory, a database name to drop). Each case gets its own store.
//!
//! The dataset (times relative to [`T`], 2026-01-01T00:00Z; `user-N` are
//! actors of type `user`):
//!
//! | actor | day 1 (`[T, T+24h)`) |
//! |---|---|
//! | user-1 | ad.click +5m (google/spring/search, ad-spring-1), page.view +10m (`/Pricing`), cart.add +20m, ad.click +25m (newsletter/may/email, ad-may-2), order.created +30m (100) |
//! | user-2 | page.view +10m, order.created +15m (20), cart.add +40m: out of order |
//! | user-3 | page.view +1h, cart.add +1h10m, order.created +3h (30, source partner): out of the 1h window |
//! | user-4 | page.view +5h, ad.click +7h (google/spring/search, ad-spring-1), page.view +8h, cart.add +8h05m, order.created +8h50m (50): restarts in time |
//! | user-5 | cart.add +2h |
//! | user-6 | page.view +2h |
//! | user-7 | (ad.click -2h google/winter/search, page.view -1m), cart.add +5m, order.created +6m (10) |
//!
//! plus `legacy.ping` at -3h (the day before), runs and governed events on
//! day 2 (`[T+24h, T+48h)`), and events of another workspace that must never
//! show. `cart.add` carries `properties.qty` (2, 1, 1, 3, 1, 1 for users
//! 1, 2, 3, 4, 5, 7).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // a test suite

use serde_json::{Value, json};

use super::queries::{
    Aggregation, AttributionModel, AttributionQuery, FunnelQuery, MetricDefinition, MetricSnapshot,
    Range, RunQuery, SearchQuery, SeriesQuery, TotalsQuery,
};
use super::{AppendRequest, NewEvent, Store, Workspace};

/// 2026-01-01T00:00:00Z.
pub const T: i64 = 1_767_225_600_000;
pub const M: i64 = 60_000;
pub const H: i64 = 60 * M;
pub const WS: &str = "ws_conformance";
pub const OTHER_WS: &str = "ws_conformance_other";
pub const DAY1: Range = Range { from: T, to: T + 24 * H };
pub const DAY2: Range = Range { from: T + 24 * H, to: T + 48 * H };

fn user(n: u32) -> Value {
    json!({"type": "user", "id": format!("user-{n}")})
}

fn click(n: u32, at: i64, source: &str, campaign: &str, channel: &str, ad: Option<&str>) -> Value {
    let mut e = json!({
        "event": "ad.click", "actor": user(n), "timestamp": at,
        "source": {"channel": channel, "campaign": campaign},
        "attribution": {"source": source},
    });
    if let Some(ad) = ad {
        e["object"] = json!({"type": "ad", "id": ad});
    }
    e
}

fn plain(n: u32, event: &str, at: i64) -> Value {
    json!({"event": event, "actor": user(n), "timestamp": at})
}

fn cart(n: u32, at: i64, qty: u32) -> Value {
    json!({"event": "cart.add", "actor": user(n), "timestamp": at, "properties": {"qty": qty}})
}

fn order(n: u32, at: i64, revenue: f64) -> Value {
    json!({"event": "order.created", "actor": user(n), "timestamp": at,
        "outcome": {"revenue": revenue, "currency": "EUR"}})
}

fn agent(event: &str, trace: &str, at: i64) -> Value {
    json!({"event": event, "traceId": trace, "timestamp": at,
        "actor": {"type": "ai_agent", "id": "agent-7"}})
}

/// The dataset of the module documentation.
pub fn dataset() -> Vec<Value> {
    let d2 = T + 24 * H;
    let mut view1 = plain(1, "page.view", T + 10 * M);
    view1["properties"] = json!({"page": "/Pricing"});
    let mut click1 = click(1, T + 5 * M, "google", "spring", "search", Some("ad-spring-1"));
    click1["entity"] = json!({"type": "campaign", "id": "spring", "name": "Spring sale"});
    let mut click4 = click(4, T + 7 * H, "google", "spring", "search", Some("ad-spring-1"));
    click4["entity"] = json!({"type": "campaign", "id": "spring", "properties": {"budget": 5}});
    let mut order3 = order(3, T + 3 * H, 30.0);
    order3["attribution"] = json!({"source": "partner"});
    vec![
        // user-1: the whole funnel, two touchpoints.
        click1,
        view1,
        cart(1, T + 20 * M, 2),
        click(1, T + 25 * M, "newsletter", "may", "email", Some("ad-may-2")),
        order(1, T + 30 * M, 100.0),
        // user-2: order before cart.
        plain(2, "page.view", T + 10 * M),
        order(2, T + 15 * M, 20.0),
        cart(2, T + 40 * M, 1),
        // user-3: the order comes 3 h after the view.
        plain(3, "page.view", T + H),
        cart(3, T + H + 10 * M, 1),
        order3,
        // user-4: a first view too early, a second one in time.
        plain(4, "page.view", T + 5 * H),
        click4,
        plain(4, "page.view", T + 8 * H),
        cart(4, T + 8 * H + 5 * M, 3),
        order(4, T + 8 * H + 50 * M, 50.0),
        // user-5 and user-6: one step each.
        cart(5, T + 2 * H, 1),
        plain(6, "page.view", T + 2 * H),
        // user-7: touchpoint and first step before the range.
        click(7, T - 2 * H, "google", "winter", "search", None),
        plain(7, "page.view", T - M),
        cart(7, T + 5 * M, 1),
        order(7, T + 6 * M, 10.0),
        // The day before.
        json!({"event": "legacy.ping", "timestamp": T - 3 * H}),
        // Day 2: runs.
        agent("workflow.started", "wf-1", d2 + H),
        agent("workflow.step", "wf-1", d2 + H + M),
        agent("workflow.completed", "wf-1", d2 + H + 2 * M),
        json!({"event": "note.added", "traceId": "wf-1", "timestamp": d2 + H + 3 * M}),
        agent("workflow.started", "wf-2", d2 + 2 * H),
        agent("workflow.failed", "wf-2", d2 + 2 * H + 5 * M),
        json!({"event": "robot.mission.started", "traceId": "rb-1", "businessId": "north",
            "timestamp": d2 + 4 * H, "actor": {"type": "robot", "id": "robot-1"}}),
        json!({"event": "robot.mission.progress", "traceId": "rb-1", "businessId": "north",
            "timestamp": d2 + 4 * H + M, "actor": {"type": "robot", "id": "robot-1"}}),
        // Day 2: governed events; only the first lacks proof.
        json!({"event": "payment.approved", "decisionId": "dec_1", "trustTier": "T2",
            "timestamp": d2 + 5 * H}),
        json!({"event": "payment.approved", "decisionId": "dec_2", "trustTier": "T3",
            "timestamp": d2 + 6 * H}),
        json!({"event": "payment.approved", "decisionId": "dec_3", "trustTier": "T1",
            "proofId": "prf_1", "timestamp": d2 + 7 * H}),
    ]
}

/// Events of another workspace, in the same hours and with the same names.
fn other_dataset() -> Vec<Value> {
    vec![
        plain(3, "page.view", T + H),
        cart(3, T + H + 20 * M, 5),
        order(3, T + H + 30 * M, 999.0),
        click(3, T + H, "google", "spring", "search", Some("ad-spring-1")),
        agent("workflow.failed", "wf-1", T + 25 * H),
    ]
}

fn to_events(values: Vec<Value>) -> Vec<NewEvent> {
    values
        .into_iter()
        .enumerate()
        .map(|(i, value)| {
            let event = opgraph_proto::Event::parse_json(&value).expect("dataset event");
            let event = crate::api::ingest::finish_envelope(event, T).expect("dataset event");
            NewEvent { id: format!("evt_conf{i:04}"), received_at: T + 48 * H, event }
        })
        .collect()
}

/// Creates the workspaces and stores the dataset.
pub async fn load(store: &dyn Store) {
    for id in [WS, OTHER_WS] {
        let ws = Workspace { id: id.into(), name: id.into(), created_at: T };
        store.create_workspace(&ws).await.unwrap();
    }
    let request = AppendRequest {
        events: to_events(dataset()),
        idempotency_key: None,
        new_event_limit: None,
    };
    store.append_events(WS, request).await.unwrap();
    let request = AppendRequest {
        events: to_events(other_dataset()),
        idempotency_key: None,
        new_event_limit: None,
    };
    store.append_events(OTHER_WS, request).await.unwrap();
}

fn counts(totals: &super::queries::Totals) -> Vec<(&str, u64)> {
    totals.events.iter().map(|e| (e.event_name.as_str(), e.count)).collect()
}

pub async fn totals(store: &dyn Store) {
    let q =
        TotalsQuery { range: Some(DAY1), unique_actors: true, limit: 100, ..Default::default() };
    let t = store.event_totals(WS, &q).await.unwrap();
    assert_eq!(t.total_events, 20);
    assert_eq!(t.total_revenue, 210.0);
    // Most frequent first, ties by name.
    assert_eq!(
        counts(&t),
        [("cart.add", 6), ("page.view", 6), ("order.created", 5), ("ad.click", 3)]
    );
    let unique: Vec<Option<u64>> = t.events.iter().map(|e| e.unique_actors).collect();
    assert_eq!(unique, [Some(6), Some(5), Some(5), Some(2)]);
    assert_eq!(t.events[2].revenue, 210.0);

    // One event; a limit keeps the most frequent but totals stay whole.
    let q = TotalsQuery { event: Some("order.created".into()), ..q };
    let t = store.event_totals(WS, &q).await.unwrap();
    assert_eq!(counts(&t), [("order.created", 5)]);
    let q = TotalsQuery { event: None, limit: 2, ..q };
    let t = store.event_totals(WS, &q).await.unwrap();
    assert_eq!((counts(&t), t.total_events), (vec![("cart.add", 6), ("page.view", 6)], 20));
    let unique: Vec<Option<u64>> = t.events.iter().map(|e| e.unique_actors).collect();
    assert_eq!((unique, t.total_revenue), (vec![Some(6), Some(5)], 210.0));
    let q = TotalsQuery { limit: 1, unique_actors: false, ..q };
    let t = store.event_totals(WS, &q).await.unwrap();
    assert_eq!((counts(&t), t.total_events), (vec![("cart.add", 6)], 20));
    assert_eq!(t.events[0].unique_actors, None);

    // By business.
    let q = TotalsQuery {
        range: Some(DAY2),
        business_id: Some("north".into()),
        limit: 100,
        ..Default::default()
    };
    let t = store.event_totals(WS, &q).await.unwrap();
    assert_eq!(counts(&t), [("robot.mission.progress", 1), ("robot.mission.started", 1)]);
}

pub async fn totals_at_unaligned_edges(store: &dyn Store) {
    // [T+10m, T+8h30m): from inclusive, to exclusive, neither on an hour.
    let range = Range { from: T + 10 * M, to: T + 8 * H + 30 * M };
    let q = TotalsQuery { range: Some(range), limit: 100, ..Default::default() };
    let t = store.event_totals(WS, &q).await.unwrap();
    assert_eq!(
        counts(&t),
        [("page.view", 6), ("cart.add", 5), ("order.created", 3), ("ad.click", 2)]
    );
    assert_eq!((t.total_events, t.total_revenue), (16, 150.0));
    // Inside a single hour.
    let range = Range { from: T + 6 * M, to: T + 15 * M };
    let t = store
        .event_totals(WS, &TotalsQuery { range: Some(range), limit: 100, ..Default::default() })
        .await
        .unwrap();
    assert_eq!(counts(&t), [("page.view", 2), ("order.created", 1)]);
}

pub async fn series(store: &dyn Store) {
    let buckets = |points: Vec<super::queries::SeriesPoint>| {
        points.into_iter().map(|p| (p.bucket, p.count)).collect::<Vec<_>>()
    };
    let q = SeriesQuery {
        range: Range { from: T, to: T + 4 * H },
        business_id: None,
        event: Some("order.created".into()),
        bucket_ms: H,
        by_event: None,
    };
    assert_eq!(buckets(store.event_series(WS, &q).await.unwrap()), [(T, 3), (T + 3 * H, 1)]);
    let q = SeriesQuery { range: Range { from: T + 10 * M, to: T + 2 * H }, event: None, ..q };
    assert_eq!(buckets(store.event_series(WS, &q).await.unwrap()), [(T, 7), (T + H, 2)]);
    let q =
        SeriesQuery { range: Range { from: T - 24 * H, to: T + 24 * H }, bucket_ms: 24 * H, ..q };
    assert_eq!(buckets(store.event_series(WS, &q).await.unwrap()), [(T - 24 * H, 3), (T, 20)]);
    let q =
        SeriesQuery { range: Range { from: T, to: T + H }, bucket_ms: H, by_event: Some(9), ..q };
    let by_event = async |q: &SeriesQuery| {
        let points = store.event_series(WS, q).await.unwrap();
        points
            .iter()
            .map(|p| (p.event_name.clone().unwrap_or_default(), p.count))
            .collect::<Vec<(String, u64)>>()
    };
    let expected = [("ad.click", 2), ("cart.add", 3), ("order.created", 3), ("page.view", 2)];
    let expected: Vec<(String, u64)> = expected.iter().map(|(e, n)| ((*e).into(), *n)).collect();
    assert_eq!(by_event(&q).await, expected);
    // The busiest names only, ties by name; still in time and name order.
    let busiest = SeriesQuery { by_event: Some(3), ..q.clone() };
    let kept: Vec<(String, u64)> =
        expected.iter().filter(|(e, _)| e != "page.view").cloned().collect();
    assert_eq!(by_event(&busiest).await, kept);
    // Across buckets, a name's events in all of them count: the busiest
    // is the one totals put first.
    let day = SeriesQuery { range: Range { from: T, to: T + 4 * H }, by_event: Some(1), ..q };
    let top = TotalsQuery { range: Some(day.range), limit: 1, ..Default::default() };
    let top = store.event_totals(WS, &top).await.unwrap().events[0].event_name.clone();
    let points = store.event_series(WS, &day).await.unwrap();
    assert!(points.len() > 1, "{points:?}");
    assert!(points.iter().all(|p| p.event_name.as_deref() == Some(top.as_str())), "{points:?}");
}

pub async fn funnel(store: &dyn Store) {
    let steps = |names: &[&str]| names.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    let q = FunnelQuery {
        steps: steps(&["page.view", "cart.add", "order.created"]),
        range: DAY1,
        window_ms: H,
        business_id: None,
    };
    // Step 1: users 1, 2, 3, 4, 6 (user-7's view is before the range).
    // Step 2: users 1, 2, 3, 4. Step 3: user-1, and user-4 from its second
    // view; user-2 ordered before the cart, user-3 ordered after the window.
    assert_eq!(store.funnel(WS, &q).await.unwrap(), [5, 4, 2]);
    // A wider window lets user-3 (3 h) and user-4's first view (3 h 50 m) in.
    let q = FunnelQuery { window_ms: 4 * H, ..q };
    assert_eq!(store.funnel(WS, &q).await.unwrap(), [5, 4, 3]);
    // A step repeated needs two events: only user-4 viewed twice.
    let q = FunnelQuery { steps: steps(&["page.view", "page.view"]), window_ms: 4 * H, ..q };
    assert_eq!(store.funnel(WS, &q).await.unwrap(), [5, 1]);
    // Another business has none of it.
    let q = FunnelQuery { business_id: Some("north".into()), ..q };
    assert_eq!(store.funnel(WS, &q).await.unwrap(), [0, 0]);
}

fn rows(list: &[super::queries::AttributionRow]) -> Vec<(&str, u64, f64, f64)> {
    list.iter().map(|r| (r.key.as_str(), r.touchpoints, r.conversions, r.revenue)).collect()
}

fn attribution_query(model: AttributionModel) -> AttributionQuery {
    AttributionQuery {
        conversion_event: Some("order.created".into()),
        model,
        range: DAY1,
        lookback_ms: 30 * 24 * H,
        business_id: None,
        limit: 100,
    }
}

pub async fn attribution_first_touch(store: &dyn Store) {
    let a = store.attribution(WS, &attribution_query(AttributionModel::FirstTouch)).await.unwrap();
    // Five orders (210); user-2 had no touchpoint.
    assert_eq!((a.conversions, a.revenue, a.unattributed), (5, 210.0, 1));
    // user-1 -> google (100), user-4 -> google (50), user-7 -> google (10,
    // a touchpoint before the range), user-3 -> its own order (partner).
    // newsletter only touched: touchpoints in the range, no credit.
    assert_eq!(
        rows(&a.by_source),
        [("google", 2, 3.0, 160.0), ("partner", 1, 1.0, 30.0), ("newsletter", 1, 0.0, 0.0)]
    );
    assert_eq!(
        rows(&a.by_campaign),
        [
            ("spring", 2, 2.0, 150.0),
            ("(none)", 1, 1.0, 30.0),
            ("winter", 0, 1.0, 10.0),
            ("may", 1, 0.0, 0.0)
        ]
    );
    // The same query with the default conversion (events with revenue).
    let q = AttributionQuery {
        conversion_event: None,
        ..attribution_query(AttributionModel::FirstTouch)
    };
    let b = store.attribution(WS, &q).await.unwrap();
    assert_eq!(b, a);
}

pub async fn attribution_last_touch(store: &dyn Store) {
    let a = store.attribution(WS, &attribution_query(AttributionModel::LastTouch)).await.unwrap();
    // user-1 -> newsletter (its later click), user-4 and user-7 -> google.
    assert_eq!(
        rows(&a.by_source),
        [("google", 2, 2.0, 60.0), ("newsletter", 1, 1.0, 100.0), ("partner", 1, 1.0, 30.0)]
    );
    assert_eq!(
        rows(&a.by_channel),
        [("search", 2, 2.0, 60.0), ("email", 1, 1.0, 100.0), ("(none)", 1, 1.0, 30.0)]
    );
}

pub async fn attribution_linear(store: &dyn Store) {
    let a = store.attribution(WS, &attribution_query(AttributionModel::Linear)).await.unwrap();
    // user-1's order is split between its two touchpoints.
    assert_eq!(
        rows(&a.by_source),
        [("google", 2, 2.5, 110.0), ("partner", 1, 1.0, 30.0), ("newsletter", 1, 0.5, 50.0)]
    );
    assert_eq!(
        rows(&a.by_entity),
        [
            ("(none)", 1, 2.0, 40.0),
            ("ad:ad-spring-1", 2, 1.5, 100.0),
            ("ad:ad-may-2", 1, 0.5, 50.0)
        ]
    );
    // A business without conversions.
    let q = AttributionQuery {
        business_id: Some("north".into()),
        ..attribution_query(AttributionModel::Linear)
    };
    let none = store.attribution(WS, &q).await.unwrap();
    assert_eq!((none.conversions, none.by_source.len()), (0, 0));
}

/// Touchpoints of actors who never convert count, and get no credit.
pub async fn attribution_counts_touchpoints_without_conversions(store: &dyn Store) {
    let ws = "ws_conformance_touches";
    store
        .create_workspace(&Workspace { id: ws.into(), name: ws.into(), created_at: T })
        .await
        .unwrap();
    let events = vec![
        click(8, T + H, "display", "autumn", "banner", Some("ad-autumn")),
        click(8, T + 2 * H, "display", "autumn", "banner", None),
        click(9, T + H, "google", "spring", "search", None),
        order(9, T + 2 * H, 40.0),
    ];
    let request =
        AppendRequest { events: to_events(events), idempotency_key: None, new_event_limit: None };
    store.append_events(ws, request).await.unwrap();
    let a = store.attribution(ws, &attribution_query(AttributionModel::Linear)).await.unwrap();
    assert_eq!((a.conversions, a.revenue, a.unattributed), (1, 40.0, 0));
    assert_eq!(rows(&a.by_source), [("google", 1, 1.0, 40.0), ("display", 2, 0.0, 0.0)]);
    assert_eq!(rows(&a.by_entity), [("(none)", 2, 1.0, 40.0), ("ad:ad-autumn", 1, 0.0, 0.0)]);
}

pub async fn period_diff(store: &dyn Store) {
    let totals = |range| TotalsQuery { range: Some(range), limit: 10_000, ..Default::default() };
    let current = store.event_totals(WS, &totals(DAY1)).await.unwrap();
    let previous =
        store.event_totals(WS, &totals(Range { from: T - 24 * H, to: T })).await.unwrap();
    let d = crate::intelligence::period_diff(&current, &previous, 100);
    assert_eq!(d.revenue_delta, 210.0);
    assert_eq!(d.new_event_types, ["cart.add", "order.created"]);
    assert_eq!(d.disappeared_event_types, ["legacy.ping"]);
    let diffs: Vec<(&str, u64, u64, i64, Option<f64>)> = d
        .event_diffs
        .iter()
        .map(|e| (e.event.as_str(), e.current, e.previous, e.delta, e.pct_change))
        .collect();
    assert_eq!(
        diffs,
        [
            ("cart.add", 6, 0, 6, None),
            ("order.created", 5, 0, 5, None),
            ("page.view", 6, 1, 5, Some(500.0)),
            ("ad.click", 3, 1, 2, Some(200.0)),
            ("legacy.ping", 0, 1, -1, Some(-100.0)),
        ]
    );
}

/// A search for `text` with no filter, 100 results at most.
pub fn search_query(text: &str) -> SearchQuery {
    SearchQuery { text: text.into(), range: None, event: None, business_id: None, limit: 100 }
}

pub async fn search(store: &dyn Store) {
    let query = search_query;
    let names = |r: &super::queries::SearchResult| {
        r.events
            .iter()
            .map(|e| e.envelope["event"].as_str().unwrap_or("").to_owned())
            .collect::<Vec<_>>()
    };
    // A property value, case-insensitive.
    let r = store.search_events(WS, &query("pricing")).await.unwrap();
    assert_eq!((names(&r), r.total, r.total_capped), (vec!["page.view".to_owned()], 1, false));
    assert_eq!(r.events[0].envelope["properties"]["page"], "/Pricing");
    // An actor id: newest first; the other workspace's user-3 stays out.
    let r = store.search_events(WS, &query("USER-3")).await.unwrap();
    assert_eq!(names(&r), ["order.created", "cart.add", "page.view"]);
    assert_eq!(r.total, 3);
    // An object id, an actor type, an event name.
    assert_eq!(store.search_events(WS, &query("spring-1")).await.unwrap().total, 2);
    assert_eq!(store.search_events(WS, &query("robot")).await.unwrap().total, 2);
    assert_eq!(store.search_events(WS, &query("legacy.p")).await.unwrap().total, 1);
    // Shorter than a trigram (no index lookup on the embedded store).
    let r = store.search_events(WS, &query("/p")).await.unwrap();
    assert_eq!((names(&r), r.total, r.total_capped), (vec!["page.view".to_owned()], 1, false));
    let r = store.search_events(WS, &query("-3")).await.unwrap();
    assert_eq!(names(&r), ["order.created", "cart.add", "page.view"]);
    assert_eq!((r.total, r.total_capped), (3, false));
    // Filters, and a limit that keeps the total.
    let q = SearchQuery { event: Some("page.view".into()), ..query("user-4") };
    assert_eq!(store.search_events(WS, &q).await.unwrap().total, 2);
    let q = SearchQuery { range: Some(Range { from: T + 6 * H, to: DAY1.to }), ..query("user-4") };
    assert_eq!(store.search_events(WS, &q).await.unwrap().total, 4);
    let q = SearchQuery { limit: 1, ..query("user-4") };
    let r = store.search_events(WS, &q).await.unwrap();
    assert_eq!((names(&r), r.total), (vec!["order.created".to_owned()], 5));
    // Quotes and operators are text, not query syntax.
    assert_eq!(store.search_events(WS, &query("\"OR\" NEAR(")).await.unwrap().total, 0);
    assert_eq!(store.search_events(WS, &query("nothing-like-this")).await.unwrap().total, 0);
}

/// Search folds case, not just lower case, on every backend: a final
/// sigma, the micro sign and a long s meet sigma, mu and s.
pub async fn search_folds_case(store: &dyn Store) {
    let texts = ["ΛΟΓΟΣ", "5 µm mesh", "Meſſe", "ΜΕΣΗ"];
    let mut events = to_events(
        texts
            .iter()
            .map(|text| {
                json!({"event": "label.read", "timestamp": T + 30 * H,
                "properties": {"text": text}})
            })
            .collect(),
    );
    for (i, e) in events.iter_mut().enumerate() {
        e.id = format!("evt_fold{i}");
    }
    store
        .append_events(WS, AppendRequest { events, idempotency_key: None, new_event_limit: None })
        .await
        .unwrap();
    for (needle, text) in [
        ("λογος", "ΛΟΓΟΣ"),
        ("λογοσ", "ΛΟΓΟΣ"),
        ("5 μm", "5 µm mesh"),
        ("5 µM", "5 µm mesh"),
        ("MESSE", "Meſſe"),
        ("μεση", "ΜΕΣΗ"),
    ] {
        let found = store.search_events(WS, &search_query(needle)).await.unwrap();
        let texts: Vec<_> =
            found.events.iter().map(|e| e.envelope["properties"]["text"].clone()).collect();
        assert_eq!((texts, found.total), (vec![json!(text)], 1), "{needle}");
    }
}

pub async fn runs_and_actors(store: &dyn Store) {
    let q = RunQuery { range: Some(DAY2), limit: 100, ..Default::default() };
    let runs = store.runs(WS, &q).await.unwrap();
    let summary: Vec<(&str, &str, &str, u64, &str)> = runs
        .iter()
        .map(|r| {
            (
                r.trace_id.as_str(),
                r.kind.as_str(),
                r.status.as_str(),
                r.events,
                r.last_event.as_str(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            ("rb-1", "robot", "running", 2, "robot.mission.progress"),
            ("wf-2", "workflow", "failed", 2, "workflow.failed"),
            ("wf-1", "workflow", "completed", 3, "workflow.completed"),
        ]
    );
    let wf1 = &runs[2];
    assert_eq!((wf1.started_at, wf1.updated_at), (DAY2.from + H, DAY2.from + H + 2 * M));
    assert_eq!(wf1.actor_id.as_deref(), Some("agent-7"));

    let one = store
        .runs(WS, &RunQuery { trace_id: Some("wf-1".into()), limit: 10, ..Default::default() })
        .await
        .unwrap();
    assert_eq!(one.len(), 1);
    let by_agent = store
        .runs(WS, &RunQuery { actor_id: Some("agent-7".into()), limit: 10, ..Default::default() })
        .await
        .unwrap();
    assert_eq!(by_agent.iter().map(|r| r.trace_id.as_str()).collect::<Vec<_>>(), ["wf-2", "wf-1"]);
    let north = store
        .runs(WS, &RunQuery { business_id: Some("north".into()), limit: 10, ..Default::default() })
        .await
        .unwrap();
    assert_eq!(north.iter().map(|r| r.trace_id.as_str()).collect::<Vec<_>>(), ["rb-1"]);
    let limited = store.runs(WS, &RunQuery { limit: 1, ..Default::default() }).await.unwrap();
    assert_eq!(limited.len(), 1);

    let actors = store.actor_activity(WS, DAY2, &["ai_agent", "robot"], None, 10).await.unwrap();
    let a: Vec<(&str, u64)> = actors.iter().map(|a| (a.actor_id.as_str(), a.events)).collect();
    assert_eq!(a, [("agent-7", 5), ("robot-1", 2)]);
    let users = store.actor_activity(WS, DAY1, &[], Some("user-1"), 10).await.unwrap();
    assert_eq!(users.len(), 1);
    assert_eq!((users[0].events, users[0].revenue), (5, 100.0));
    assert_eq!((users[0].first_seen, users[0].last_seen), (T + 5 * M, T + 30 * M));
}

pub async fn proof_gaps(store: &dyn Store) {
    let gaps = store.proof_gaps(WS, DAY2, None, 10).await.unwrap();
    let ids: Vec<&str> = gaps.iter().filter_map(|e| e.envelope["decisionId"].as_str()).collect();
    assert_eq!(ids, ["dec_1"]);
    assert!(store.proof_gaps(WS, DAY1, None, 10).await.unwrap().is_empty());
    assert!(store.proof_gaps(WS, DAY2, Some("north"), 10).await.unwrap().is_empty());
}

pub async fn metric_definitions_and_snapshots(store: &dyn Store) {
    let def = |id: &str, event: &str, aggregation, property: Option<&str>| MetricDefinition {
        id: id.into(),
        name: format!("{id} name"),
        event_name: event.into(),
        aggregation,
        property: property.map(str::to_owned),
        description: None,
        created_at: T + i64::from(id.as_bytes()[id.len() - 1]),
        created_by: "test".into(),
    };
    let revenue = def("mdef_1", "order.created", Aggregation::Sum, Some("revenue"));
    let viewers = def("mdef_2", "page.view", Aggregation::Unique, None);
    let qty = def("mdef_3", "cart.add", Aggregation::Sum, Some("qty"));
    let carts = def("mdef_4", "cart.add", Aggregation::Count, None);
    for d in [&revenue, &viewers, &qty, &carts] {
        store.insert_metric_definition(WS, d).await.unwrap();
    }
    let listed = store.list_metric_definitions(WS, 10).await.unwrap();
    assert_eq!(
        listed.iter().map(|d| d.id.as_str()).collect::<Vec<_>>(),
        ["mdef_4", "mdef_3", "mdef_2", "mdef_1"]
    );
    assert_eq!(listed[3], revenue);
    assert_eq!(store.list_metric_definitions(WS, 2).await.unwrap().len(), 2);
    assert!(store.list_metric_definitions(OTHER_WS, 10).await.unwrap().is_empty());

    assert_eq!(store.evaluate_metric(WS, &revenue, DAY1, None).await.unwrap(), (5, 210.0));
    assert_eq!(store.evaluate_metric(WS, &viewers, DAY1, None).await.unwrap(), (6, 5.0));
    assert_eq!(store.evaluate_metric(WS, &qty, DAY1, None).await.unwrap(), (6, 9.0));
    assert_eq!(store.evaluate_metric(WS, &carts, DAY1, None).await.unwrap(), (6, 6.0));
    assert_eq!(store.evaluate_metric(WS, &carts, DAY1, Some("north")).await.unwrap(), (0, 0.0));

    let snapshot = MetricSnapshot {
        id: "msnap_1".into(),
        definition_id: Some("mdef_1".into()),
        event_name: Some("order.created".into()),
        business_id: None,
        from: DAY1.from,
        to: DAY1.to,
        count: 5,
        unique_actors: Some(5),
        value: 210.0,
        created_at: T,
    };
    store.insert_metric_snapshots(WS, std::slice::from_ref(&snapshot)).await.unwrap();
    assert_eq!(store.list_metric_snapshots(WS, 10).await.unwrap(), [snapshot]);
    assert!(store.list_metric_snapshots(OTHER_WS, 10).await.unwrap().is_empty());
}

pub async fn businesses(store: &dyn Store) {
    assert!(store.business_exists(WS, "default").await.unwrap());
    assert!(store.business_exists(WS, "north").await.unwrap(), "registered by its events");
    assert!(!store.business_exists(WS, "south").await.unwrap());
    assert!(!store.business_exists(OTHER_WS, "north").await.unwrap());
}

pub async fn entities_and_relationships(store: &dyn Store) {
    let entities = store.list_entities(WS, None, 10).await.unwrap();
    assert_eq!(entities.len(), 1);
    let spring = &entities[0];
    assert_eq!((spring.kind.as_str(), spring.id.as_str()), ("campaign", "spring"));
    assert_eq!(
        spring.name.as_deref(),
        Some("Spring sale"),
        "a later event without a name keeps it"
    );
    assert_eq!(spring.properties, json!({"budget": 5}));
    assert_eq!((spring.first_seen, spring.last_seen), (T + 5 * M, T + 7 * H));
    assert!(store.list_entities(WS, Some("store"), 10).await.unwrap().is_empty());
    assert!(store.list_entities(OTHER_WS, None, 10).await.unwrap().is_empty());

    let edges = store.list_relationships(WS, Some(("ad", "ad-spring-1")), 10).await.unwrap();
    let summary: Vec<(&str, &str, &str, u64)> = edges
        .iter()
        .map(|r| (r.from_id.as_str(), r.relation.as_str(), r.to_id.as_str(), r.count))
        .collect();
    assert_eq!(
        summary,
        [("user-4", "ad.click", "ad-spring-1", 1), ("user-1", "ad.click", "ad-spring-1", 1)]
    );
    let from_user1 = store.list_relationships(WS, Some(("user", "user-1")), 10).await.unwrap();
    assert_eq!(from_user1.len(), 1);
    assert_eq!(store.list_relationships(WS, None, 1).await.unwrap().len(), 1);
    assert!(store.list_relationships(WS, Some(("user", "user-2")), 10).await.unwrap().is_empty());
}

fn api_key(id: &str, ws: &str, created_at: i64) -> super::NewApiKey {
    super::NewApiKey {
        record: super::ApiKeyRecord {
            id: id.into(),
            workspace_id: ws.into(),
            name: format!("{id} name"),
            hint: "og_...abcd".into(),
            scopes: vec![crate::auth::Scope::Ingest, crate::auth::Scope::Read],
            created_at,
            revoked_at: None,
        },
        hash: format!("hash-of-{id}"),
    }
}

pub async fn workspaces_and_keys(store: &dyn Store) {
    let again = Workspace { id: WS.into(), name: "again".into(), created_at: T };
    let err = store.create_workspace(&again).await.unwrap_err();
    assert!(matches!(err, crate::error::Error::Conflict(_)), "{err:?}");
    assert!(store.workspace_exists(WS).await.unwrap());
    assert!(!store.workspace_exists("ws_nope").await.unwrap());
    assert_eq!(store.count_workspaces().await.unwrap(), 2);
    assert!(store.business_exists(WS, "default").await.unwrap(), "created with the workspace");

    let first = store.insert_api_key(api_key("key_b", WS, T + 2)).await.unwrap();
    assert_eq!((first.id.as_str(), first.revoked_at), ("key_b", None));
    store.insert_api_key(api_key("key_a", WS, T + 1)).await.unwrap();
    store.insert_api_key(api_key("key_o", OTHER_WS, T)).await.unwrap();
    // The same secret again (a restart with the same bootstrap key): the
    // stored key is kept.
    let mut same = api_key("key_new", WS, T + 9);
    same.hash = "hash-of-key_b".into();
    assert_eq!(store.insert_api_key(same).await.unwrap().id, "key_b");

    let found = store.find_api_key("hash-of-key_b").await.unwrap().unwrap();
    assert_eq!((found.workspace_id.as_str(), found.name.as_str()), (WS, "key_b name"));
    assert_eq!(found.scopes, [crate::auth::Scope::Ingest, crate::auth::Scope::Read]);
    assert!(store.find_api_key("hash-of-nothing").await.unwrap().is_none());
    let listed = store.list_api_keys(WS, 1000).await.unwrap();
    assert_eq!(listed.iter().map(|k| k.id.as_str()).collect::<Vec<_>>(), ["key_a", "key_b"]);
    let first = store.list_api_keys(WS, 1).await.unwrap();
    assert_eq!(first.iter().map(|k| k.id.as_str()).collect::<Vec<_>>(), ["key_a"], "bounded");

    assert!(!store.revoke_api_key(OTHER_WS, "key_b").await.unwrap(), "another workspace's");
    assert!(!store.revoke_api_key(WS, "key_nope").await.unwrap());
    assert!(store.revoke_api_key(WS, "key_b").await.unwrap());
    assert!(store.revoke_api_key(WS, "key_b").await.unwrap(), "revoking twice is fine");
    assert!(store.find_api_key("hash-of-key_b").await.unwrap().is_none());
    let listed = store.list_api_keys(WS, 1000).await.unwrap();
    assert!(listed[1].revoked_at.is_some() && listed[0].revoked_at.is_none());
    assert!(store.find_api_key("hash-of-key_a").await.unwrap().is_some());
    assert_eq!(store.list_api_keys(OTHER_WS, 1000).await.unwrap().len(), 1);
}

fn listed_names(events: &[super::StoredEvent]) -> Vec<String> {
    events.iter().map(|e| e.envelope["event"].as_str().unwrap_or("").to_owned()).collect()
}

pub async fn list_events(store: &dyn Store) {
    let list = |filter: super::EventFilter| async move {
        store.list_events(WS, &super::EventFilter { limit: 1000, ..filter }).await.unwrap()
    };
    let all = list(Default::default()).await;
    assert_eq!(all.len(), dataset().len());
    // Newest first: day 2's governed events, and the day before last.
    assert_eq!(all[0].envelope["decisionId"], "dec_3");
    assert_eq!(listed_names(&all[all.len() - 1..]), ["legacy.ping"]);
    assert!(
        all.windows(2)
            .all(|w| w[0].envelope["timestamp"].as_i64() >= w[1].envelope["timestamp"].as_i64())
    );
    // The stored envelope comes back whole, with id and receivedAt.
    let order = all.iter().find(|e| e.id == "evt_conf0004").unwrap().clone().into_json();
    assert_eq!(order["outcome"]["revenue"], 100.0);
    assert_eq!(
        (order["receivedAt"].as_i64(), order["businessId"].as_str()),
        (Some(T + 48 * H), Some("default"))
    );

    let page_views =
        list(super::EventFilter { event: Some("page.view".into()), ..Default::default() }).await;
    assert_eq!(page_views.len(), 7);
    let wf1 =
        list(super::EventFilter { trace_id: Some("wf-1".into()), ..Default::default() }).await;
    assert_eq!(
        listed_names(&wf1),
        ["note.added", "workflow.completed", "workflow.step", "workflow.started"]
    );
    let north =
        list(super::EventFilter { business_id: Some("north".into()), ..Default::default() }).await;
    assert_eq!(north.len(), 2);
    // `from` inclusive, `to` exclusive.
    let day1 =
        list(super::EventFilter { from: Some(DAY1.from), to: Some(DAY1.to), ..Default::default() })
            .await;
    assert_eq!(day1.len(), 20);
    let edge = list(super::EventFilter {
        from: Some(T + 10 * M),
        to: Some(T + 15 * M),
        ..Default::default()
    })
    .await;
    assert_eq!(listed_names(&edge), ["page.view", "page.view"]);
    let combined = list(super::EventFilter {
        event: Some("order.created".into()),
        from: Some(T + H),
        ..Default::default()
    })
    .await;
    assert_eq!(combined.len(), 2);
    let newest = store
        .list_events(WS, &super::EventFilter { limit: 2, ..Default::default() })
        .await
        .unwrap();
    assert_eq!(
        newest.iter().map(|e| e.id.as_str()).collect::<Vec<_>>(),
        [all[0].id.as_str(), all[1].id.as_str()]
    );
    let other = store
        .list_events(OTHER_WS, &super::EventFilter { limit: 100, ..Default::default() })
        .await
        .unwrap();
    assert_eq!(other.len(), other_dataset().len());

    // Equal timestamps list in insertion order, the later first.
    const TWINS: i64 = T + 30 * H + 30 * M;
    let mut twins = to_events(vec![plain(8, "twin.first", TWINS), plain(8, "twin.second", TWINS)]);
    twins[0].id = "evt_twin1".into();
    twins[1].id = "evt_twin2".into();
    store
        .append_events(
            WS,
            AppendRequest { events: twins, idempotency_key: None, new_event_limit: None },
        )
        .await
        .unwrap();
    let tied =
        list(super::EventFilter { from: Some(TWINS), to: Some(TWINS + 1), ..Default::default() })
            .await;
    assert_eq!(listed_names(&tied), ["twin.second", "twin.first"]);
}

pub async fn appends_are_idempotent(store: &dyn Store) {
    let count = || async {
        store
            .list_events(WS, &super::EventFilter { limit: 1000, ..Default::default() })
            .await
            .unwrap()
            .len()
    };
    let before = count().await;
    // The same ids again (a redelivered batch): nothing is added.
    let again = AppendRequest {
        events: to_events(dataset()),
        idempotency_key: None,
        new_event_limit: None,
    };
    let result = store.append_events(WS, again).await.unwrap();
    assert_eq!(result.inserted, 0);
    assert_eq!(result.ids[0], "evt_conf0000");
    assert_eq!(count().await, before);
    // Within one request, a repeated id is stored once.
    let mut twice =
        to_events(vec![plain(9, "dup.event", T + 40 * H), plain(9, "dup.event", T + 40 * H)]);
    twice[0].id = "evt_dup".into();
    twice[1].id = "evt_dup".into();
    let result = store
        .append_events(
            WS,
            AppendRequest { events: twice, idempotency_key: None, new_event_limit: None },
        )
        .await
        .unwrap();
    assert_eq!(
        (result.ids, result.inserted),
        (vec!["evt_dup".to_owned(), "evt_dup".to_owned()], 1)
    );

    // messageId: a client retry under a new id answers with the first id.
    let with_message = |id: &str| {
        let mut value = plain(9, "msg.event", T + 41 * H);
        value["messageId"] = json!("m-1");
        let mut events = to_events(vec![value]);
        events[0].id = id.into();
        AppendRequest { events, idempotency_key: None, new_event_limit: None }
    };
    let first = store.append_events(WS, with_message("evt_m1")).await.unwrap();
    assert_eq!((first.ids.clone(), first.inserted), (vec!["evt_m1".to_owned()], 1));
    let retry = store.append_events(WS, with_message("evt_m2")).await.unwrap();
    assert_eq!((retry.ids, retry.inserted), (vec!["evt_m1".to_owned()], 0));
    assert_eq!(count().await, before + 2);
    // Another workspace may use the same messageId.
    let elsewhere = store.append_events(OTHER_WS, with_message("evt_m3")).await.unwrap();
    assert_eq!(elsewhere.inserted, 1);

    // Idempotency-Key: the retry gets the first answer, whatever it carries.
    let keyed = |id: &str| {
        let mut events = to_events(vec![plain(9, "keyed.event", T + 42 * H)]);
        events[0].id = id.into();
        AppendRequest { events, idempotency_key: Some("key-1".into()), new_event_limit: None }
    };
    let first = store.append_events(WS, keyed("evt_k1")).await.unwrap();
    let retry = store.append_events(WS, keyed("evt_k2")).await.unwrap();
    assert_eq!((retry.ids, retry.inserted), (first.ids.clone(), 0));
    assert_eq!(count().await, before + 3);
    // The same key with another request is a conflict, and stores nothing.
    let mut other = keyed("evt_k4");
    other.idempotency_key =
        Some(crate::store::IdempotencyKey::new("key-1".into(), &json!({"a": 1})));
    let refused = store.append_events(WS, other).await;
    assert!(matches!(refused, Err(crate::error::Error::Conflict(_))), "{refused:?}");
    assert_eq!(count().await, before + 3);
    // A key claimed by a call that stores no events (an export): the same
    // request again is fine, another one is a conflict, here and in an
    // append under the key; keys already used by appends are claimed too.
    let export = |body: Value| crate::store::IdempotencyKey::new("key-2".into(), &body);
    store.claim_idempotency_key(WS, &export(json!({"limit": 1}))).await.unwrap();
    store.claim_idempotency_key(WS, &export(json!({"limit": 1}))).await.unwrap();
    let refused = store.claim_idempotency_key(WS, &export(json!({"limit": 2}))).await;
    assert!(matches!(refused, Err(crate::error::Error::Conflict(_))), "{refused:?}");
    store.claim_idempotency_key(OTHER_WS, &export(json!({"limit": 2}))).await.unwrap();
    let mut appended = keyed("evt_k5");
    appended.idempotency_key = Some(export(json!({"limit": 2})));
    let refused = store.append_events(WS, appended).await;
    assert!(matches!(refused, Err(crate::error::Error::Conflict(_))), "{refused:?}");
    let refused = store.claim_idempotency_key(WS, &"key-1".into()).await;
    assert!(refused.is_ok(), "key-1 names the same (empty) request as its appends: {refused:?}");
    let other = crate::store::IdempotencyKey::new("key-1".into(), &json!({"b": 1}));
    let refused = store.claim_idempotency_key(WS, &other).await;
    assert!(matches!(refused, Err(crate::error::Error::Conflict(_))), "{refused:?}");
    assert_eq!(count().await, before + 3);

    // The quota limits what is new: with nothing left a replay is still
    // answered; new events past the limit refuse the whole call.
    let no_quota_left = |mut request: AppendRequest| {
        request.new_event_limit = Some(0);
        request
    };
    let replay = store.append_events(WS, no_quota_left(with_message("evt_m4"))).await.unwrap();
    assert_eq!((replay.ids, replay.inserted), (vec!["evt_m1".to_owned()], 0));
    let replay = store.append_events(WS, no_quota_left(keyed("evt_k3"))).await.unwrap();
    assert_eq!((replay.ids, replay.inserted), (first.ids, 0));
    let mut events = to_events(vec![
        plain(9, "quota.event", T + 43 * H),
        plain(10, "quota.event", T + 43 * H),
        plain(9, "msg.event", T + 41 * H),
    ]);
    for (event, id) in events.iter_mut().zip(["evt_q1", "evt_q2", "evt_m5"]) {
        event.id = id.into();
    }
    events[2].event.message_id = Some("m-1".into());
    let over = AppendRequest { events, idempotency_key: None, new_event_limit: Some(1) };
    let refused = store.append_events(WS, over.clone()).await.unwrap_err();
    assert_eq!(refused.code(), "rate_limited");
    assert_eq!(count().await, before + 3, "a refused call stores nothing");
    let within = AppendRequest { new_event_limit: Some(2), ..over };
    let stored = store.append_events(WS, within).await.unwrap();
    assert_eq!(stored.ids, ["evt_q1", "evt_q2", "evt_m1"]);
    assert_eq!((stored.inserted, count().await), (2, before + 5));
}

pub async fn usage_counters(store: &dyn Store) {
    let now = crate::now_ms();
    let day = 86_400_000;
    let usage = store.usage(WS, now - day, now + day).await.unwrap();
    assert_eq!(usage.events_ingested, dataset().len() as u64, "counted on the day of ingest");
    store.record_api_calls(WS, now, 3).await.unwrap();
    store.record_api_calls(WS, now, 4).await.unwrap();
    store.record_api_calls(WS, now - 10 * day, 100).await.unwrap();
    let usage = store.usage(WS, now, now).await.unwrap();
    assert_eq!(usage.api_calls, 7);
    assert_eq!(store.usage(WS, now - 10 * day, now).await.unwrap().api_calls, 107);
    let other = store.usage(OTHER_WS, now, now).await.unwrap();
    assert_eq!((other.events_ingested, other.api_calls), (other_dataset().len() as u64, 0));
    // A replay adds nothing.
    let again = AppendRequest {
        events: to_events(other_dataset()),
        idempotency_key: None,
        new_event_limit: None,
    };
    store.append_events(OTHER_WS, again).await.unwrap();
    assert_eq!(store.usage(OTHER_WS, now, now).await.unwrap().events_ingested, 5);
}

pub async fn gateway_batches(store: &dyn Store) {
    use super::gateway::{BatchCommit, GatewaySession};
    let batch = |from: u64, names: &[&str]| -> Vec<(u64, NewEvent)> {
        let values = names.iter().map(|n| plain(1, n, T + 50 * H)).collect();
        to_events(values)
            .into_iter()
            .zip(from..)
            .map(|(mut e, seq)| {
                e.id = format!("evt_gw{seq:04}");
                (seq, e)
            })
            .collect()
    };
    let ingested = async || store.usage(WS, 0, i64::MAX / 2).await.unwrap().events_ingested;
    let ingested_before = ingested().await;
    let session = store.open_gateway_session(WS, "gw-1", "buf-1").await.unwrap();
    assert_eq!(session, GatewaySession { epoch: 1, acked_sequence: 0 });
    let commit =
        store.commit_gateway_batch(WS, "gw-1", 1, (1, 3), batch(1, &["a", "b", "c"]), None);
    assert_eq!(commit.await.unwrap(), BatchCommit::Acked { acked_sequence: 3, inserted: 3 });
    // Redelivered whole, or overlapping the ack: only what is new is stored.
    let again = store.commit_gateway_batch(WS, "gw-1", 1, (1, 3), batch(1, &["a", "b", "c"]), None);
    assert_eq!(again.await.unwrap(), BatchCommit::Acked { acked_sequence: 3, inserted: 0 });
    let overlap = store.commit_gateway_batch(WS, "gw-1", 1, (3, 4), batch(3, &["c", "d"]), None);
    assert_eq!(overlap.await.unwrap(), BatchCommit::Acked { acked_sequence: 4, inserted: 1 });
    // More new events than the quota leaves refuse the commit whole (the
    // gap below shows the ack stayed); with none left a redelivery passes.
    let over = store.commit_gateway_batch(WS, "gw-1", 1, (5, 6), batch(5, &["e", "f"]), Some(1));
    assert_eq!(over.await.unwrap_err().code(), "rate_limited");
    let redelivered =
        store.commit_gateway_batch(WS, "gw-1", 1, (3, 4), batch(3, &["c", "d"]), Some(0));
    assert_eq!(redelivered.await.unwrap(), BatchCommit::Acked { acked_sequence: 4, inserted: 0 });
    let gap = store.commit_gateway_batch(WS, "gw-1", 1, (6, 6), batch(6, &["f"]), None);
    assert_eq!(gap.await.unwrap(), BatchCommit::Gap { acked_sequence: 4 });
    // A new session fences the old one and keeps the ack.
    let session = store.open_gateway_session(WS, "gw-1", "buf-1").await.unwrap();
    assert_eq!(session, GatewaySession { epoch: 2, acked_sequence: 4 });
    let stale = store.commit_gateway_batch(WS, "gw-1", 1, (5, 5), batch(5, &["e"]), None);
    assert_eq!(stale.await.unwrap(), BatchCommit::Fenced { current_epoch: 2 });
    // A recreated buffer restarts the ack; ids already stored stay stored
    // once.
    let session = store.open_gateway_session(WS, "gw-1", "buf-2").await.unwrap();
    assert_eq!(session, GatewaySession { epoch: 3, acked_sequence: 0 });
    let replay = store.commit_gateway_batch(WS, "gw-1", 3, (1, 2), batch(1, &["a", "b"]), None);
    assert_eq!(replay.await.unwrap(), BatchCommit::Acked { acked_sequence: 2, inserted: 0 });
    // Another gateway and another workspace are separate.
    let other = store.open_gateway_session(OTHER_WS, "gw-1", "buf-1").await.unwrap();
    assert_eq!(other, GatewaySession { epoch: 1, acked_sequence: 0 });
    let stored = store
        .list_events(
            WS,
            &super::EventFilter { limit: 100, from: Some(T + 50 * H), ..Default::default() },
        )
        .await
        .unwrap();
    assert_eq!(listed_names(&stored).len(), 4);
    // Usage counts each stored event once.
    assert_eq!(ingested().await - ingested_before, 4);
}

/// A receiver hands a gateway's next batch over before the answer for the
/// one before it: commits first polled in order are applied in order.
pub async fn gateway_batches_in_flight(store: &dyn Store) {
    use super::gateway::BatchCommit;
    use std::task::Poll;
    const BATCHES: u64 = 24;
    const SPAN: u64 = 5;
    let session = store.open_gateway_session(WS, "gw-window", "buf-1").await.unwrap();
    let mut commits = Vec::new();
    for b in 0..BATCHES {
        let first = b * SPAN + 1;
        let events = (first..first + SPAN)
            .map(|seq| {
                let mut e = to_events(vec![plain(1, "tote.moved", T + 60 * H)]).remove(0);
                e.id = format!("evt_window{seq:04}");
                (seq, e)
            })
            .collect();
        let range = (first, first + SPAN - 1);
        let mut commit =
            store.commit_gateway_batch(WS, "gw-window", session.epoch, range, events, None);
        // Polled once, as a receiver does before taking the next batch.
        let early = std::future::poll_fn(|cx| Poll::Ready(commit.as_mut().poll(cx))).await;
        commits.push((range, early, commit));
    }
    for (range, early, commit) in commits {
        let answer = match early {
            Poll::Ready(answer) => answer,
            Poll::Pending => commit.await,
        };
        let expected = BatchCommit::Acked { acked_sequence: range.1, inserted: SPAN as usize };
        assert_eq!(answer.unwrap(), expected, "batch {range:?}");
    }
}

/// Governance objects and receipts: the latest version of each object,
/// compare-and-set of decisions, revocation once, the triggering event,
/// one linear receipt chain per writer, each receipt listed once, and
/// nothing of another workspace.
pub async fn governance(store: &dyn Store) {
    use super::governance::{
        AuthorityGrant, ChainFrom, ChainHead, ChainPage, ContextContract, Decision,
        EnforcementInputs, EnforcementRefs, ExportReceipt, ProofTrail, Receipt, ReceiptFilter,
        TrackingPlan,
    };
    use crate::error::Error;
    use crate::governance::hash::GENESIS_HASH;
    use crate::governance::{DecisionStatus as S, Outcome, RiskLevel};

    let decision = |id: &str, status, at| Decision {
        id: id.into(),
        title: format!("{id} title"),
        status,
        risk_level: RiskLevel::Low,
        description: None,
        owner: None,
        trace_id: Some("wf-1".into()),
        expires_at: None,
        created_at: T,
        updated_at: at,
        created_by: "key_1".into(),
    };
    let report = |id: &str| {
        let value = json!({"event": "governance.enforced", "traceId": "wf-1",
            "timestamp": T + 72 * H});
        let event = opgraph_proto::Event::parse_json(&value).unwrap();
        let event = crate::api::ingest::finish_envelope(event, T).unwrap();
        NewEvent { id: id.into(), received_at: T + 72 * H, event }
    };
    store
        .insert_decision(WS, &decision("dec_a", S::Draft, T), vec![report("evt_g1")])
        .await
        .unwrap();
    store.insert_decision(WS, &decision("dec_b", S::Approved, T), vec![]).await.unwrap();
    let again = store.insert_decision(WS, &decision("dec_a", S::Draft, T), vec![]).await;
    assert!(matches!(again, Err(Error::Conflict(_))), "{again:?}");
    let approved = decision("dec_a", S::Approved, T + 1);
    assert!(store.update_decision(WS, S::Draft, &approved, vec![report("evt_g2")]).await.unwrap());
    let stale = decision("dec_a", S::Rejected, T + 2);
    assert!(!store.update_decision(WS, S::Draft, &stale, vec![]).await.unwrap(), "compare-and-set");
    assert!(!store.update_decision(OTHER_WS, S::Approved, &stale, vec![]).await.unwrap());
    assert_eq!(store.get_decision(WS, "dec_a").await.unwrap(), Some(approved.clone()));
    assert_eq!(store.get_decision(OTHER_WS, "dec_a").await.unwrap(), None);
    let ids = |list: Vec<Decision>| list.into_iter().map(|d| d.id).collect::<Vec<_>>();
    assert_eq!(ids(store.list_decisions(WS, None, 10).await.unwrap()), ["dec_b", "dec_a"]);
    assert_eq!(ids(store.list_decisions(WS, Some(S::Approved), 1).await.unwrap()), ["dec_b"]);
    assert!(store.list_decisions(WS, Some(S::Draft), 10).await.unwrap().is_empty(), "latest only");

    let grant = AuthorityGrant {
        id: "grt_a".into(),
        grantee: "agent-7".into(),
        actions: vec!["refund".into()],
        max_amount: Some(500.0),
        currency: Some("EUR".into()),
        approval_threshold: None,
        valid_from: None,
        valid_until: None,
        revoked: false,
        revoked_at: None,
        description: None,
        created_at: T,
        created_by: "key_1".into(),
    };
    store.insert_grant(WS, &grant).await.unwrap();
    assert!(matches!(store.insert_grant(WS, &grant).await, Err(Error::Conflict(_))));
    assert_eq!(store.revoke_grant(OTHER_WS, "grt_a", T + 5, vec![]).await.unwrap(), None);
    let revoked = store.revoke_grant(WS, "grt_a", T + 5, vec![report("evt_g3")]).await.unwrap();
    assert_eq!(revoked.as_ref().and_then(|g| g.revoked_at), Some(T + 5));
    let twice = store.revoke_grant(WS, "grt_a", T + 9, vec![]).await.unwrap();
    assert_eq!(twice, revoked, "revoked once");
    assert_eq!(store.list_grants(WS, 10).await.unwrap(), [revoked.clone().unwrap()]);
    assert!(store.list_grants(OTHER_WS, 10).await.unwrap().is_empty());

    let contract = ContextContract {
        id: "ctc_a".into(),
        name: Some("refunds".into()),
        allowed_actions: vec!["refund".into()],
        required_trust_tier: None,
        required_attestation_providers: vec![],
        required_compliance: vec![],
        escrow_above: None,
        valid_until: None,
        created_at: T,
        created_by: "key_1".into(),
    };
    store.insert_contract(WS, &contract).await.unwrap();
    assert_eq!(store.get_contract(WS, "ctc_a").await.unwrap(), Some(contract.clone()));
    assert_eq!(store.list_contracts(WS, 10).await.unwrap(), [contract]);
    let plan = TrackingPlan {
        id: "plan_a".into(),
        name: "p".into(),
        vertical: "v".into(),
        description: None,
        events: vec![json!("e"), json!({"event": "f"})],
        created_at: T,
        created_by: "key_1".into(),
    };
    store.insert_tracking_plan(WS, &plan).await.unwrap();
    assert_eq!(store.get_tracking_plan(WS, "plan_a").await.unwrap(), Some(plan.clone()));
    assert_eq!(store.list_tracking_plans(WS, 10).await.unwrap(), [plan]);
    assert!(store.get_tracking_plan(OTHER_WS, "plan_a").await.unwrap().is_none());

    // Three receipts of one writer, one of another; the trigger is taken by
    // id, or as the trace's latest event that is not a governance one.
    let mut sealed = Vec::new();
    for (n, writer) in (0i64..).zip(["key_1", "key_1", "key_2", "key_1"]) {
        let refs = EnforcementRefs {
            decision_id: "dec_a".into(),
            grant_id: "grt_a".into(),
            contract_id: "ctc_a".into(),
            event_id: (n == 0).then(|| "evt_conf0031".to_owned()),
            trace_id: Some("wf-1".into()),
        };
        let id = format!("rcp_{n}");
        let (decision, grant) = (approved.clone(), revoked.clone());
        let decide: super::governance::DecideReceipt =
            Box::new(move |inputs: EnforcementInputs, head: &ChainHead| {
                assert_eq!(inputs.decision, Some(decision));
                assert_eq!(inputs.grant, grant);
                assert_eq!(inputs.contract.map(|c| c.id).as_deref(), Some("ctc_a"));
                let trigger = inputs.trigger.unwrap();
                let expected = if n == 0 { ("evt_conf0031", "T2") } else { ("evt_conf0026", "T0") };
                assert_eq!((trigger.id.as_str(), trigger.trust_tier.as_str()), expected);
                let receipt = Receipt {
                    id: id.clone(),
                    workspace_id: WS.into(),
                    writer: writer.into(),
                    sequence: head.sequence,
                    prev_hash: head.prev_hash.clone(),
                    created_at: T + 80 * H + n,
                    outcome: if n == 1 { Outcome::Deny } else { Outcome::Allow },
                    decision_object_id: "dec_a".into(),
                    authority_grant_id: "grt_a".into(),
                    context_contract_id: "ctc_a".into(),
                    trace_id: Some("wf-1".into()),
                    event_id: Some(trigger.id),
                    proposed_action: json!({"action": "refund"}),
                    attestations: vec![],
                    compliance_frameworks: vec![],
                    trigger: None,
                    checks: vec![],
                    content_hash: format!("{id}-hash"),
                };
                Ok((receipt, vec![report(&format!("evt_r{n}"))]))
            });
        sealed.push(store.record_enforcement(WS, writer, &refs, decide).await.unwrap());
    }
    let positions: Vec<(&str, u64, &str)> =
        sealed.iter().map(|r| (r.writer.as_str(), r.sequence, r.prev_hash.as_str())).collect();
    assert_eq!(
        positions,
        [
            ("key_1", 1, GENESIS_HASH),
            ("key_1", 2, "rcp_0-hash"),
            ("key_2", 1, GENESIS_HASH),
            ("key_1", 3, "rcp_1-hash")
        ]
    );
    let filter = |f: ReceiptFilter| ReceiptFilter { limit: 10, ..f };
    let listed = |rows: Vec<super::governance::ReceiptRow>| {
        rows.into_iter().map(|r| r.id).collect::<Vec<_>>()
    };
    let all = store.list_receipts(WS, &filter(ReceiptFilter::default())).await.unwrap();
    assert_eq!(all[1].body, serde_json::to_string(&sealed[2]).unwrap(), "stored as sealed");
    assert_eq!(all[1].decision_id.as_deref(), Some("dec_a"));
    assert_eq!(listed(all), ["rcp_3", "rcp_2", "rcp_1", "rcp_0"]);
    let denied = ReceiptFilter { outcome: Some(Outcome::Deny), ..filter(ReceiptFilter::default()) };
    assert_eq!(listed(store.list_receipts(WS, &denied).await.unwrap()), ["rcp_1"]);
    let window = ReceiptFilter {
        from: Some(T + 80 * H + 1),
        to: Some(T + 80 * H + 3),
        trace_id: Some("wf-1".into()),
        decision_id: Some("dec_a".into()),
        limit: 1,
        ..Default::default()
    };
    assert_eq!(listed(store.list_receipts(WS, &window).await.unwrap()), ["rcp_2"]);
    assert!(
        store.list_receipts(OTHER_WS, &filter(ReceiptFilter::default())).await.unwrap().is_empty()
    );
    let wanted = vec!["rcp_2".to_owned(), "rcp_0".to_owned(), "rcp_nope".to_owned()];
    let mut got = listed(store.get_receipts(WS, &wanted).await.unwrap());
    got.sort();
    assert_eq!(got, ["rcp_0", "rcp_2"]);
    assert!(store.get_receipts(OTHER_WS, &wanted).await.unwrap().is_empty());
    // Chain pages: key_1 holds rcp_0, rcp_1, rcp_3 (sequences 1..=3),
    // key_2 holds rcp_2.
    let chain_page = |from: ChainFrom, one_chain: bool, limit: usize| {
        let page = ChainPage { from, one_chain, limit };
        async move { listed(store.receipt_chain_page(WS, &page).await.unwrap()) }
    };
    let chain = |writer: &str| ChainFrom::Chain(writer.into());
    let after = |writer: &str, sequence: i64| ChainFrom::After(writer.into(), sequence);
    assert_eq!(chain_page(chain(""), false, 2).await, ["rcp_0", "rcp_1"]);
    assert_eq!(
        chain_page(after("key_1", 2), false, 2).await,
        ["rcp_3", "rcp_2"],
        "chain order: writer, then sequence"
    );
    assert_eq!(chain_page(chain(""), false, 10).await, ["rcp_0", "rcp_1", "rcp_3", "rcp_2"]);
    // One chain, from its start or after a position, never into the next.
    assert_eq!(chain_page(chain("key_1"), true, 10).await, ["rcp_0", "rcp_1", "rcp_3"]);
    assert_eq!(chain_page(after("key_1", 1), true, 10).await, ["rcp_1", "rcp_3"]);
    assert_eq!(chain_page(after("key_1", 3), true, 10).await, Vec::<String>::new());
    assert_eq!(chain_page(chain("key_2"), true, 10).await, ["rcp_2"]);
    assert_eq!(chain_page(chain("key_"), true, 10).await, Vec::<String>::new(), "not a prefix");
    // From a writer's chain on: it and the later ones, in writer order.
    assert_eq!(chain_page(chain("key_15"), false, 10).await, ["rcp_2"]);
    assert_eq!(chain_page(chain("key_1"), false, 1).await, ["rcp_0"]);
    assert_eq!(chain_page(after("key_1", 3), false, 10).await, ["rcp_2"]);
    let other = ChainPage { from: chain(""), one_chain: false, limit: 10 };
    assert!(store.receipt_chain_page(OTHER_WS, &other).await.unwrap().is_empty());

    // Every reporting event was stored once, beside the receipts.
    let reports = super::EventFilter {
        event: Some("governance.enforced".into()),
        limit: 100,
        ..Default::default()
    };
    assert_eq!(store.list_events(WS, &reports).await.unwrap().len(), 7);

    let trail = |id: &str, at| ProofTrail {
        id: id.into(),
        title: format!("{id} title"),
        root_hash: format!("{id}-root"),
        item_count: 1,
        items: vec![],
        receipt_ids: vec!["rcp_0".into()],
        decision_ids: vec![],
        trace_id: None,
        created_at: at,
        created_by: "key_1".into(),
    };
    store.insert_proof_trail(WS, &trail("prf_a", T)).await.unwrap();
    store.insert_proof_trail(WS, &trail("prf_b", T + 1)).await.unwrap();
    assert!(matches!(
        store.insert_proof_trail(WS, &trail("prf_a", T)).await,
        Err(Error::Conflict(_))
    ));
    assert_eq!(store.get_proof_trail(WS, "prf_a").await.unwrap(), Some(trail("prf_a", T)));
    assert!(store.get_proof_trail(OTHER_WS, "prf_a").await.unwrap().is_none());
    let summaries = store.list_proof_trails(WS, 10).await.unwrap();
    let summary: Vec<(&str, &str, &str, usize, i64)> = summaries
        .iter()
        .map(|s| {
            (s.id.as_str(), s.title.as_str(), s.root_hash.as_str(), s.item_count, s.created_at)
        })
        .collect();
    assert_eq!(
        summary,
        [
            ("prf_b", "prf_b title", "prf_b-root", 1, T + 1),
            ("prf_a", "prf_a title", "prf_a-root", 1, T)
        ]
    );
    let export = |id: &str, trail: Option<&str>| ExportReceipt {
        id: id.into(),
        destination: "https://proof.example/in".into(),
        status: "failed".into(),
        request_id: "req".into(),
        response_status: None,
        external_id: None,
        error: Some("HTTP 500".into()),
        payload_hash: "h".into(),
        record_count: 1,
        created_at: T,
        proof_trail_id: trail.map(str::to_owned),
    };
    store.insert_export_receipt(WS, &export("exp_a", Some("prf_a"))).await.unwrap();
    store.insert_export_receipt(WS, &export("exp_b", Some("prf_b"))).await.unwrap();
    store.insert_export_receipt(WS, &export("exp_c", None)).await.unwrap();
    let exports = |list: Vec<ExportReceipt>| list.into_iter().map(|e| e.id).collect::<Vec<_>>();
    assert_eq!(exports(store.list_export_receipts(WS, None, 2).await.unwrap()), ["exp_c", "exp_b"]);
    assert_eq!(
        exports(store.list_export_receipts(WS, Some("prf_a"), 10).await.unwrap()),
        ["exp_a"]
    );
    assert_eq!(
        store.list_export_receipts(WS, None, 10).await.unwrap()[2],
        export("exp_a", Some("prf_a"))
    );
    assert!(store.list_export_receipts(OTHER_WS, None, 10).await.unwrap().is_empty());
    // A keyed export tried again: its new receipt replaces the first, and
    // the list goes by time, not by id.
    let again =
        ExportReceipt { status: "succeeded".into(), created_at: T + 5, ..export("exp_a", None) };
    store.insert_export_receipt(WS, &again).await.unwrap();
    assert_eq!(store.get_export_receipt(WS, "exp_a").await.unwrap(), Some(again.clone()));
    assert_eq!(store.get_export_receipt(OTHER_WS, "exp_a").await.unwrap(), None);
    assert_eq!(store.get_export_receipt(WS, "exp_none").await.unwrap(), None);
    let listed = store.list_export_receipts(WS, None, 10).await.unwrap();
    assert_eq!(exports(listed.clone()), ["exp_a", "exp_c", "exp_b"]);
    assert_eq!(listed[0], again);
}

/// Webhooks: listed oldest first without the deleted ones, deleted once,
/// never across workspaces; attempts listed newest first per webhook.
pub async fn webhooks(store: &dyn Store) {
    use super::webhooks::{Webhook, WebhookAttempt};
    let hook = |id: &str, at: i64| Webhook {
        id: id.into(),
        url: format!("https://hooks.example/{id}"),
        events: vec!["enforcement.decided".into()],
        secret: "s3cret".into(),
        created_at: at,
    };
    store.insert_webhook(WS, &hook("whk_a", T)).await.unwrap();
    store.insert_webhook(WS, &hook("whk_b", T + 1)).await.unwrap();
    store.insert_webhook(WS, &hook("whk_c", T + 2)).await.unwrap();
    let ids = |list: Vec<Webhook>| list.into_iter().map(|w| w.id).collect::<Vec<_>>();
    assert_eq!(ids(store.list_webhooks(WS, 10).await.unwrap()), ["whk_a", "whk_b", "whk_c"]);
    assert_eq!(store.list_webhooks(WS, 10).await.unwrap()[1], hook("whk_b", T + 1));
    assert_eq!(ids(store.list_webhooks(WS, 2).await.unwrap()), ["whk_a", "whk_b"]);
    assert!(!store.delete_webhook(OTHER_WS, "whk_b", T + 5).await.unwrap());
    assert!(store.delete_webhook(WS, "whk_b", T + 5).await.unwrap());
    assert!(!store.delete_webhook(WS, "whk_b", T + 6).await.unwrap(), "deleted once");
    assert!(!store.delete_webhook(WS, "whk_none", T + 6).await.unwrap());
    assert_eq!(ids(store.list_webhooks(WS, 10).await.unwrap()), ["whk_a", "whk_c"]);
    assert!(store.list_webhooks(OTHER_WS, 10).await.unwrap().is_empty());
    assert_eq!(store.workspaces_with_webhooks().await.unwrap(), [WS]);
    store.insert_webhook(OTHER_WS, &hook("whk_o", T)).await.unwrap();
    let mut both = vec![WS.to_owned(), OTHER_WS.to_owned()];
    both.sort();
    assert_eq!(store.workspaces_with_webhooks().await.unwrap(), both);
    assert!(store.delete_webhook(OTHER_WS, "whk_o", T + 7).await.unwrap());
    assert_eq!(store.workspaces_with_webhooks().await.unwrap(), [WS], "deleted ones do not count");

    let attempt = |delivery: &str, n: u32, at: i64| WebhookAttempt {
        delivery_id: delivery.into(),
        webhook_id: "whk_a".into(),
        event: "enforcement.decided".into(),
        subject: "rcp_1".into(),
        attempt: n,
        status: if n == 2 { "succeeded" } else { "failed" }.into(),
        response_status: Some(if n == 2 { 200 } else { 500 }),
        error: (n != 2).then(|| "HTTP 500".to_owned()),
        next_attempt_at: (n != 2).then_some(at + 1000),
        payload_hash: "h".into(),
        created_at: at,
    };
    store.insert_webhook_attempt(WS, &attempt("whd_1", 1, T)).await.unwrap();
    store.insert_webhook_attempt(WS, &attempt("whd_1", 2, T + 1000)).await.unwrap();
    store.insert_webhook_attempt(WS, &attempt("whd_2", 1, T + 500)).await.unwrap();
    let log = store.list_webhook_attempts(WS, "whk_a", 10).await.unwrap();
    let order: Vec<(&str, u32)> = log.iter().map(|a| (a.delivery_id.as_str(), a.attempt)).collect();
    assert_eq!(order, [("whd_1", 2), ("whd_2", 1), ("whd_1", 1)]);
    assert_eq!(log[2], attempt("whd_1", 1, T));
    assert_eq!(store.list_webhook_attempts(WS, "whk_a", 1).await.unwrap().len(), 1);
    assert!(store.list_webhook_attempts(WS, "whk_c", 10).await.unwrap().is_empty());
    assert!(store.list_webhook_attempts(OTHER_WS, "whk_a", 10).await.unwrap().is_empty());

    use super::webhooks::PendingDelivery;
    let pending = |id: &str, attempts: u32, due_at: i64| PendingDelivery {
        delivery_id: id.into(),
        webhook_id: "whk_a".into(),
        event: "enforcement.decided".into(),
        subject: "rcp_1".into(),
        payload: "{\"id\":\"x\"}".into(),
        attempts,
        due_at,
        owner: format!("proc_{attempts}"),
        held_until: due_at + 1000,
    };
    store.save_pending_delivery(WS, &pending("whd_1", 0, T + 50)).await.unwrap();
    store.save_pending_delivery(OTHER_WS, &pending("whd_2", 0, T + 10)).await.unwrap();
    store.save_pending_delivery(WS, &pending("whd_1", 1, T + 5)).await.unwrap();
    store.save_pending_delivery(WS, &pending("whd_3", 0, T + 30)).await.unwrap();
    let due = store.pending_deliveries(10).await.unwrap();
    let order: Vec<(&str, &str, u32)> =
        due.iter().map(|(ws, p)| (ws.as_str(), p.delivery_id.as_str(), p.attempts)).collect();
    assert_eq!(order, [(WS, "whd_1", 1), (OTHER_WS, "whd_2", 0), (WS, "whd_3", 0)]);
    assert_eq!(due[0].1, pending("whd_1", 1, T + 5), "the latest save, whole");
    assert_eq!(store.pending_deliveries(1).await.unwrap().len(), 1);
    // One delivery by id, as last saved (its holder included), in its
    // workspace only.
    let one = store.pending_delivery(WS, "whd_1").await.unwrap();
    assert_eq!(one, Some(pending("whd_1", 1, T + 5)));
    assert_eq!(store.pending_delivery(OTHER_WS, "whd_1").await.unwrap(), None);
    assert_eq!(store.pending_delivery(WS, "whd_9").await.unwrap(), None);
    store.finish_pending_delivery(WS, "whd_1").await.unwrap();
    assert_eq!(store.pending_delivery(WS, "whd_1").await.unwrap(), None, "finished");
    store.finish_pending_delivery(WS, "whd_2").await.unwrap(); // another workspace's: kept
    let left: Vec<String> = store
        .pending_deliveries(10)
        .await
        .unwrap()
        .into_iter()
        .map(|(_, p)| p.delivery_id)
        .collect();
    assert_eq!(left, ["whd_2", "whd_3"]);

    // Retention. whd_4 finished early, while its next attempt was still
    // due in an hour: it must not come back as pending when its last
    // version goes before an earlier one.
    let now = crate::now_ms();
    store.save_pending_delivery(WS, &pending("whd_4", 1, now + 3_600_000)).await.unwrap();
    store.finish_pending_delivery(WS, "whd_4").await.unwrap();
    store.save_pending_delivery(WS, &pending("whd_5", 1, now + 3_600_000)).await.unwrap();
    store.prune_webhook_log(T + 600, 100).await.unwrap();
    let logged = || async {
        let log = store.list_webhook_attempts(WS, "whk_a", 10).await.unwrap();
        log.into_iter().map(|a| (a.delivery_id, a.attempt)).collect::<Vec<_>>()
    };
    let due = || async {
        let due = store.pending_deliveries(10).await.unwrap();
        due.into_iter().map(|(_, p)| p.delivery_id).collect::<Vec<_>>()
    };
    // ClickHouse deletes in the background: wait for it, bounded.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while (logged().await.len(), due().await.len()) != (1, 1)
        && std::time::Instant::now() < deadline
    {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(logged().await, [("whd_1".to_owned(), 2)], "attempts before the cut are gone");
    assert_eq!(due().await, ["whd_5"], "due before the cut: gone; finished: stays finished");
    // whd_6, due before the next cut, shows when its deletion has run.
    store.save_pending_delivery(WS, &pending("whd_6", 1, now + 30_000)).await.unwrap();
    store.prune_webhook_log(now + 60_000, 100).await.unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while (!logged().await.is_empty() || due().await.contains(&"whd_6".to_owned()))
        && std::time::Instant::now() < deadline
    {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(logged().await.is_empty());
    assert_eq!(due().await, ["whd_5"], "whd_4 stays finished; whd_5 is due after the cut");
}

/// Runs the whole suite against a backend: one test per case, each on a
/// fresh store from `$open()` (an async fn returning `(store, guard)`).
/// The cases cover [`Store`]'s own methods, [`super::gateway::GatewayStore`]
/// and the query API; the embedded and ClickHouse stores both run them all.
#[macro_export]
macro_rules! store_conformance {
    ($open:path) => {
        $crate::store_conformance!(@cases $open;
            workspaces_and_keys, list_events, appends_are_idempotent, usage_counters,
            gateway_batches, gateway_batches_in_flight,
            totals, totals_at_unaligned_edges, series, funnel, attribution_first_touch,
            attribution_last_touch, attribution_linear,
            attribution_counts_touchpoints_without_conversions, period_diff, search, search_folds_case,
            runs_and_actors,
            proof_gaps, metric_definitions_and_snapshots, businesses, entities_and_relationships,
            governance, webhooks);
    };
    (@cases $open:path; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test]
            async fn $case() {
                let (store, _guard) = $open().await;
                $crate::store::conformance::load(&store).await;
                $crate::store::conformance::$case(&store).await;
            }
        )*
    };
}
