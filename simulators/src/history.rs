//! A deterministic history of a site's events, for query benchmarks
//! (`opgraph-history generate`): warehouse reads, a robot fleet's missions
//! and web traffic, interleaved over a time span. I/O-free: event `n` of a
//! history is a pure function of `(n, config)`, so any slice can be made
//! on its own and a run is reproducible from its seed.
//!
//! The mix, per 100 events: 45 warehouse (`rfid.tag.read`,
//! `item.scanned`, `pallet.moved` by dock readers and scanners, traced per
//! shipment), 25 robot fleet (missions of 20 events: `robot.mission.started`,
//! 18 `robot.telemetry`, then `robot.mission.completed` or, one in ten,
//! `robot.mission.failed`), 30 web (sessions of 8 events by one of 200 000
//! users: page views, an `ad.click` with source, campaign and channel in
//! half of them, `cart.add` in 60 %, `checkout.started` in 40 %,
//! `order.created` with revenue in 25 %).

use opgraph_proto::{Event, Party, TrustTier};
use serde_json::{Map, Value, json};

#[derive(Debug, Clone, Copy)]
pub struct HistoryConfig {
    pub events: u64,
    /// Event times run from `end_ms - span_ms` to `end_ms`.
    pub end_ms: i64,
    pub span_ms: i64,
    pub seed: u64,
}

/// A well-mixed 64-bit function of `x` (SplitMix64's finaliser).
pub fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

const WAREHOUSE: u64 = 45;
const ROBOTS: u64 = 25;
const USERS: u64 = 200_000;
const SOURCES: [(&str, &str, &str); 5] = [
    ("google", "spring-sale", "search"),
    ("meta", "retarget-q2", "social"),
    ("newsletter", "may-digest", "email"),
    ("partner", "dock-promo", "referral"),
    ("bing", "spring-sale", "search"),
];
const PAGES: [&str; 6] = ["/", "/pricing", "/catalog", "/catalog/pallets", "/about", "/contact"];

fn party(kind: &str, id: String) -> Option<Party> {
    Some(Party::Ref { kind: kind.to_owned(), id, extra: Map::new() })
}

fn object(value: Value) -> Option<Map<String, Value>> {
    match value {
        Value::Object(map) => Some(map),
        _ => None,
    }
}

/// Event `n` of the history.
pub fn event(n: u64, cfg: &HistoryConfig) -> Event {
    let step = cfg.span_ms as f64 / cfg.events.max(1) as f64;
    let jitter = (mix(n ^ cfg.seed) % 1000) as i64;
    let ts = cfg.end_ms - cfg.span_ms + (n as f64 * step) as i64 + jitter;
    let slot = n % 100;
    let round = n / 100;
    let mut e = if slot < WAREHOUSE {
        warehouse(round * WAREHOUSE + slot, cfg.seed)
    } else if slot < WAREHOUSE + ROBOTS {
        robot(round * ROBOTS + slot - WAREHOUSE, cfg.seed)
    } else {
        web(round * (100 - WAREHOUSE - ROBOTS) + slot - WAREHOUSE - ROBOTS, cfg.seed)
    };
    e.timestamp = Some(ts.min(cfg.end_ms));
    e.business_id.get_or_insert_with(|| "default".to_owned());
    e.trust_tier.get_or_insert(TrustTier::T1);
    e
}

fn warehouse(i: u64, seed: u64) -> Event {
    let r = mix(i ^ seed.rotate_left(7));
    let shipment = i / 30;
    let (name, actor) = match r % 3 {
        0 => ("rfid.tag.read", party("rfid_reader", format!("dock-{}", r % 12))),
        1 => ("item.scanned", party("scanner", format!("scanner-{:02}", r % 40))),
        _ => ("pallet.moved", party("forklift", format!("forklift-{}", r % 8))),
    };
    let mut e = Event::named(name);
    e.actor = actor;
    e.object = party("sku", format!("SKU-{:06}", mix(r) % 20_000));
    e.trace_id = Some(format!("shp-{shipment:08x}"));
    e.business_id = Some(if r.is_multiple_of(5) { "dc-north" } else { "default" }.to_owned());
    e.properties = object(json!({"site": "DC-1", "lane": r % 8, "qty": 1 + r % 4,
        "epc": format!("3034F87{:09X}", mix(r) % 0xF_FFFF_FFFF)}));
    e
}

fn robot(i: u64, seed: u64) -> Event {
    let mission = i / 20;
    let k = i % 20;
    let r = mix(mission ^ seed.rotate_left(13));
    let name = match k {
        0 => "robot.mission.started",
        19 if r.is_multiple_of(10) => "robot.mission.failed",
        19 => "robot.mission.completed",
        _ => "robot.telemetry",
    };
    let mut e = Event::named(name);
    e.actor = party("robot", format!("robot-{}", r % 50));
    e.trace_id = Some(format!("msn-{mission:08x}"));
    e.properties = object(json!({"battery": 100 - (k * 3 + r % 20), "x": mix(i) % 400,
        "y": mix(i + 1) % 300, "zone": format!("Z{}", r % 6)}));
    e
}

fn web(i: u64, seed: u64) -> Event {
    let session = i / 8;
    let k = i % 8;
    let r = mix(session ^ seed.rotate_left(29));
    let user = format!("user-{}", r % USERS);
    let (source, campaign, channel) = SOURCES[(r % SOURCES.len() as u64) as usize];
    let name = match k {
        1 if r.is_multiple_of(2) => "ad.click",
        5 if r % 10 < 6 => "cart.add",
        6 if r % 10 < 4 => "checkout.started",
        7 if r.is_multiple_of(4) => "order.created",
        _ => "page.view",
    };
    let mut e = Event::named(name);
    e.actor = party("user", user);
    match name {
        "ad.click" => {
            e.source = object(json!({"channel": channel, "campaign": campaign}));
            e.attribution = object(json!({"source": source}));
            e.object = party("ad", format!("ad-{campaign}"));
        }
        "order.created" => {
            e.outcome = object(json!({"revenue": 20 + mix(r) % 480, "currency": "EUR"}));
            e.object = party("order", format!("ord-{session:08x}"));
        }
        "cart.add" => e.object = party("sku", format!("SKU-{:06}", mix(r + 3) % 20_000)),
        _ => {
            e.properties = object(json!({"page": PAGES[(mix(i) % PAGES.len() as u64) as usize]}));
        }
    }
    e
}

/// The query endpoints a benchmark times over a history, as (label,
/// method, path, JSON body): the calls an operator's dashboard makes.
pub fn query_cases() -> Vec<(&'static str, &'static str, &'static str, Value)> {
    let steps = json!([{"event": "page.view"}, {"event": "cart.add"}, {"event": "order.created"}]);
    vec![
        ("metrics: all events, 30 days", "POST", "/api/metrics/query", json!({})),
        (
            "metrics: all events, without uniqueActors",
            "POST",
            "/api/metrics/query",
            json!({"uniqueActors": false}),
        ),
        (
            "metrics: one event, daily series",
            "POST",
            "/api/metrics/query",
            json!({"eventName": "order.created", "interval": "day"}),
        ),
        ("funnel: 3 steps, 30 days", "POST", "/api/funnels/query", json!({"steps": steps})),
        (
            "attribution: linear, 30 days",
            "POST",
            "/api/attribution/query",
            json!({"model": "linear", "conversionEvent": "order.created"}),
        ),
        (
            "search: a robot id",
            "POST",
            "/api/analytics/event-search",
            json!({"query": "robot-17", "limit": 100}),
        ),
        (
            "search: an EPC fragment",
            "POST",
            "/api/analytics/event-search",
            json!({"query": "F87ABC", "limit": 100}),
        ),
        ("what's changed: 7 days", "POST", "/api/analytics/whats-changed", json!({})),
        ("business health", "GET", "/api/businesses/default/health?limit=20", Value::Null),
        ("usage", "GET", "/api/usage", Value::Null),
        (
            "agent context: summarize",
            "POST",
            "/api/intelligence/agent-context",
            json!({"mode": "summarize", "limit": 20}),
        ),
        (
            "graphql: events(limit: 100)",
            "POST",
            "/api/graphql",
            json!({"query": "{ events(limit: 100) { id event timestamp actorId } }"}),
        ),
        (
            "graphql: workflowStatus",
            "POST",
            "/api/graphql",
            json!({"query": "{ workflowStatus(workflowId: \"msn-00000010\") { status events } }"}),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> HistoryConfig {
        HistoryConfig { events: 10_000, end_ms: 2_000_000_000_000, span_ms: 86_400_000, seed: 7 }
    }

    #[test]
    fn the_history_is_deterministic_ordered_and_mixed() {
        let c = cfg();
        assert_eq!(event(1234, &c), event(1234, &c));
        let events: Vec<Event> = (0..c.events).map(|n| event(n, &c)).collect();
        let count = |prefix: &str| events.iter().filter(|e| e.event.starts_with(prefix)).count();
        assert_eq!(count("robot."), 2500);
        assert!(count("order.created") > 50 && count("ad.click") > 100);
        let first = events[0].timestamp.unwrap();
        let last = events[events.len() - 1].timestamp.unwrap();
        assert!(first >= c.end_ms - c.span_ms && last <= c.end_ms && first < last);
        // Every mission starts and ends.
        let starts = count("robot.mission.started");
        let ends = count("robot.mission.completed") + count("robot.mission.failed");
        assert_eq!(starts, ends);
    }
}
