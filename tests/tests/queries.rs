//! The query and intelligence API against the real binary: metrics (with
//! series, definitions and snapshots), funnels, attribution, event search,
//! the period diff, business health, usage and agent context; one happy
//! path each, and the validation errors with their field paths. The exact
//! semantics over a hand-computed dataset are the store conformance suite
//! (`cloud/src/store/conformance.rs`); here the HTTP surface is judged.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use opgraph_tests::Cloud;
use opgraph_tests::now_ms;
use reqwest::{Client, StatusCode};
use serde_json::{Value, json};

const MIN: i64 = 60_000;
const HOUR: i64 = 60 * MIN;

struct Api {
    cloud: Cloud,
    client: Client,
}

impl Api {
    async fn start() -> Api {
        let cloud = Cloud::start(&[]).await.unwrap();
        let client = cloud.http();
        Api { cloud, client }
    }

    async fn post(&self, path: &str, body: &Value) -> (StatusCode, Value) {
        let response = self
            .client
            .post(self.cloud.at(path))
            .bearer_auth(&self.cloud.key)
            .json(body)
            .send()
            .await
            .unwrap();
        let status = response.status();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    async fn get(&self, path: &str) -> (StatusCode, Value) {
        let response =
            self.client.get(self.cloud.at(path)).bearer_auth(&self.cloud.key).send().await.unwrap();
        let status = response.status();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    async fn ingest(&self, events: Vec<Value>) {
        let (status, body) = self.post("/api/ingest", &json!({ "batch": events })).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    }

    /// Asserts a 400 `validation_failed` naming `field` ("": none).
    async fn refused(&self, path: &str, body: Value, field: &str) {
        let (status, answer) = self.post(path, &body).await;
        assert_refused(status, &answer, field, &body);
    }

    async fn refused_get(&self, path: &str, field: &str) {
        let (status, answer) = self.get(path).await;
        assert_refused(status, &answer, field, &json!(path));
    }
}

fn assert_refused(status: StatusCode, answer: &Value, field: &str, asked: &Value) {
    assert_eq!(status, StatusCode::BAD_REQUEST, "{asked} -> {answer}");
    assert_eq!(answer["error"]["code"], "validation_failed", "{asked} -> {answer}");
    // "" stands for a problem of the whole body: no field named.
    let expected = if field.is_empty() { Value::Null } else { json!(field) };
    assert_eq!(answer["error"]["field"], expected, "{asked} -> {answer}");
}

fn event(name: &str, actor: &str, at: i64) -> Value {
    json!({"event": name, "actor": {"type": "user", "id": actor}, "timestamp": at})
}

fn order(actor: &str, at: i64, revenue: f64) -> Value {
    let mut e = event("order.created", actor, at);
    e["outcome"] = json!({"revenue": revenue});
    e
}

#[tokio::test]
async fn metrics_with_series_definitions_and_snapshots() {
    let api = Api::start().await;
    let now = now_ms();
    api.ingest(vec![
        order("ann", now - 2 * HOUR, 10.0),
        order("bob", now - HOUR, 20.0),
        order("ann", now - 30 * MIN, 30.0),
        event("page.view", "ann", now - 3 * HOUR - MIN),
        event("page.view", "cy", now - 10 * MIN),
    ])
    .await;

    let (status, m) =
        api.post("/api/metrics/query", &json!({"from": now - 3 * HOUR, "interval": "hour"})).await;
    assert_eq!(status, StatusCode::OK, "{m}");
    assert_eq!(m["totalEvents"], 4, "the view before `from` is out: {m}");
    assert_eq!(m["totalRevenue"], 60.0);
    assert_eq!(
        m["metrics"][0],
        json!({"eventName": "order.created", "count": 3, "uniqueActors": 2, "revenue": 60.0})
    );
    assert_eq!(m["metrics"][1]["eventName"], "page.view");
    let series = m["series"].as_array().unwrap();
    assert!((4..=5).contains(&series.len()), "one bucket per hour touched: {m}");
    let summed: u64 = series.iter().map(|b| b["count"].as_u64().unwrap()).sum();
    assert_eq!(summed, 4);
    assert!(m.get("snapshotIds").is_none());
    let (_, counts_only) = api
        .post("/api/metrics/query", &json!({"from": now - 3 * HOUR, "uniqueActors": false}))
        .await;
    assert_eq!(
        counts_only["metrics"][0],
        json!({"eventName": "order.created", "count": 3, "revenue": 60.0})
    );

    // One event name, with a definition evaluated over the range.
    let (status, def) = api
        .post(
            "/api/metric-definitions",
            &json!({"name": "Order revenue", "eventName": "order.created",
                "aggregation": "sum", "property": "revenue"}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{def}");
    let def_id = def["metricDefinition"]["id"].as_str().unwrap().to_owned();
    assert!(def_id.starts_with("mdef_"));
    let (_, list) = api.get("/api/metric-definitions").await;
    assert_eq!(list["metricDefinitions"][0]["id"], def_id.as_str());

    let (status, m) = api
        .post(
            "/api/metrics/query",
            &json!({"eventName": "order.created", "from": now - 90 * MIN, "persistSnapshots": true}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{m}");
    assert_eq!(m["metrics"].as_array().unwrap().len(), 1);
    assert_eq!(m["metrics"][0]["count"], 2);
    assert_eq!(m["definitions"][0]["id"], def_id.as_str());
    assert_eq!(m["definitions"][0]["value"], 50.0);
    let ids = m["snapshotIds"].as_array().unwrap();
    assert_eq!(ids.len(), 2, "the event count and the definition: {m}");
    let (_, snaps) = api.get("/api/metric-snapshots").await;
    let stored: Vec<&Value> = snaps["metricSnapshots"].as_array().unwrap().iter().collect();
    assert_eq!(stored.len(), 2);
    let by_def = stored.iter().find(|s| s["definitionId"] == def_id.as_str()).unwrap();
    assert_eq!(by_def["value"], 50.0);

    // Validation.
    let q = "/api/metrics/query";
    api.refused(q, json!({"interval": "minute"}), "interval").await;
    api.refused(q, json!({"from": now, "to": now - 1}), "from").await;
    api.refused(q, json!({"from": 0, "to": 400 * 24 * HOUR, "interval": "hour"}), "interval").await;
    api.refused(q, json!({"limit": -1}), "limit").await;
    api.refused(q, json!({"limit": 1.5}), "limit").await;
    api.refused(q, json!({"persistSnapshots": "yes"}), "persistSnapshots").await;
    api.refused(q, json!({"eventName": ""}), "eventName").await;
    let (status, body) = api.post(q, &json!({"evnt": "x"})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let d = "/api/metric-definitions";
    api.refused(d, json!({"name": "x", "eventName": "e", "aggregation": "sum"}), "property").await;
    api.refused(d, json!({"name": "x", "eventName": "e", "aggregation": "avg"}), "aggregation")
        .await;
    api.refused(
        d,
        json!({"name": "x", "eventName": "e", "aggregation": "sum", "property": "a.b"}),
        "property",
    )
    .await;
    api.refused_get("/api/metric-definitions?limit=-1", "limit").await;
}

#[tokio::test]
async fn funnels_count_ordered_steps() {
    let api = Api::start().await;
    let t = now_ms() - 6 * HOUR;
    api.ingest(vec![
        // ann does it all, in order.
        event("page.view", "ann", t),
        event("cart.add", "ann", t + MIN),
        event("checkout.done", "ann", t + 2 * MIN),
        // bob checks out before viewing: only the view counts.
        event("checkout.done", "bob", t),
        event("cart.add", "bob", t + MIN),
        event("page.view", "bob", t + 2 * MIN),
        // cy views, and adds to the cart two hours later.
        event("page.view", "cy", t),
        event("cart.add", "cy", t + 2 * HOUR),
    ])
    .await;
    let steps = json!([
        {"name": "Viewed", "event": "page.view"},
        {"event": "cart.add"},
        {"name": "Bought", "event": "checkout.done"},
    ]);
    let (status, f) = api
        .post("/api/funnels/query", &json!({"steps": steps, "windowMs": HOUR, "from": t - HOUR}))
        .await;
    assert_eq!(status, StatusCode::OK, "{f}");
    let counts: Vec<(String, u64, u64)> = f["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["name"].as_str().unwrap().to_owned(),
                s["count"].as_u64().unwrap(),
                s["dropOff"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        counts,
        [("Viewed".into(), 3, 0), ("cart.add".into(), 1, 2), ("Bought".into(), 1, 0)]
    );
    assert_eq!(f["steps"][1]["conversionRate"], 0.3333);
    assert_eq!(f["windowMs"], HOUR);
    // The default window (7 days) lets cy's late cart in.
    let (_, f) = api.post("/api/funnels/query", &json!({"steps": steps, "from": t - HOUR})).await;
    assert_eq!(f["steps"][1]["count"], 2, "{f}");
    assert_eq!(f["windowMs"], 7 * 24 * HOUR);

    let q = "/api/funnels/query";
    let step = json!({"event": "a"});
    api.refused(q, json!({"steps": [step]}), "steps").await;
    api.refused(q, json!({"steps": vec![step.clone(); 11]}), "steps").await;
    api.refused(q, json!({"steps": [step, {"event": " "}]}), "steps[1].event").await;
    api.refused(q, json!({"steps": [step, {"name": "b"}]}), "steps[1].event").await;
    api.refused(q, json!({"steps": [step, step], "windowMs": 0}), "windowMs").await;
    api.refused(q, json!({"steps": [step, step], "from": -5}), "from").await;
    api.refused(q, json!({"steps": "a,b"}), "steps").await;
}

#[tokio::test]
async fn attribution_under_each_model() {
    let api = Api::start().await;
    let t = now_ms() - 5 * HOUR;
    let click = |source: &str, campaign: &str, at: i64| {
        let mut e = event("ad.click", "ann", at);
        e["attribution"] = json!({"source": source, "campaign": campaign});
        e["source"] = json!({"channel": "paid"});
        e
    };
    api.ingest(vec![
        click("google", "spring", t),
        click("newsletter", "may", t + MIN),
        order("ann", t + 2 * MIN, 100.0),
        order("bob", t + 3 * MIN, 40.0),
    ])
    .await;
    let query =
        |model: &str| json!({"model": model, "conversionEvent": "order.created", "from": t - HOUR});
    let keys = |a: &Value, dim: &str| -> Vec<(String, f64, f64)> {
        a[dim]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                (
                    r["key"].as_str().unwrap().to_owned(),
                    r["conversions"].as_f64().unwrap(),
                    r["revenue"].as_f64().unwrap(),
                )
            })
            .collect()
    };
    let (status, a) = api.post("/api/attribution/query", &query("first_touch")).await;
    assert_eq!(status, StatusCode::OK, "{a}");
    assert_eq!(
        keys(&a, "bySource"),
        [("google".into(), 1.0, 100.0), ("newsletter".into(), 0.0, 0.0)]
    );
    assert_eq!((a["conversions"].as_u64(), a["unattributed"].as_u64()), (Some(2), Some(1)));
    assert_eq!(a["revenue"], 140.0);
    assert_eq!(a["model"], "first_touch");
    let (_, a) = api.post("/api/attribution/query", &query("last_touch")).await;
    assert_eq!(keys(&a, "byCampaign"), [("may".into(), 1.0, 100.0), ("spring".into(), 0.0, 0.0)]);
    let (_, a) = api.post("/api/attribution/query", &query("linear")).await;
    assert_eq!(
        keys(&a, "bySource"),
        [("google".into(), 0.5, 50.0), ("newsletter".into(), 0.5, 50.0)]
    );
    assert_eq!(keys(&a, "byChannel"), [("paid".into(), 1.0, 100.0)]);
    assert_eq!(a["byChannel"][0]["touchpoints"], 2);
    assert!(a["byEntity"].is_array());

    let q = "/api/attribution/query";
    api.refused(q, json!({"model": "best"}), "model").await;
    api.refused(q, json!({"lookbackMs": -1}), "lookbackMs").await;
    api.refused(q, json!({"limit": "ten"}), "limit").await;
    api.refused(q, json!({"conversionEvent": 5}), "conversionEvent").await;
}

#[tokio::test]
async fn search_and_whats_changed() {
    let api = Api::start().await;
    let now = now_ms();
    let mut scan = event("pallet.scanned", "dock-3", now - 10 * MIN);
    scan["properties"] = json!({"sku": "ACME-Widget-42"});
    scan["object"] = json!({"type": "pallet", "id": "PAL-7781"});
    api.ingest(vec![
        event("legacy.sync", "job", now - 90 * MIN),
        event("page.view", "annika", now - 80 * MIN),
        scan,
        event("page.view", "annika", now - 5 * MIN),
        event("page.view", "bob", now - 4 * MIN),
    ])
    .await;

    let (status, s) = api.post("/api/analytics/event-search", &json!({"query": "widget-42"})).await;
    assert_eq!(status, StatusCode::OK, "{s}");
    assert_eq!(s["total"], 1);
    assert_eq!(s["results"][0]["event"], "pallet.scanned");
    assert!(s["results"][0]["id"].as_str().unwrap().starts_with("evt_"));
    let (_, s) = api.post("/api/analytics/event-search", &json!({"query": "pal-77"})).await;
    assert_eq!(s["total"], 1, "object ids are searched: {s}");
    let (_, s) =
        api.post("/api/analytics/event-search", &json!({"query": "ANNIKA", "limit": 1})).await;
    assert_eq!((s["total"].as_u64(), s["results"].as_array().unwrap().len()), (Some(2), 1));
    assert_eq!(s["results"][0]["timestamp"], now - 5 * MIN, "newest first");
    let (_, s) = api
        .post(
            "/api/analytics/event-search",
            &json!({"query": "page.view", "from": now - 30 * MIN, "event": "page.view"}),
        )
        .await;
    assert_eq!(s["total"], 2, "{s}");
    let (status, s) = api
        .post("/api/analytics/event-search", &json!({"query": "page.view", "to": now - 30 * MIN}))
        .await;
    assert_eq!((status, s["total"].as_u64()), (StatusCode::OK, Some(1)), "only `to`: {s}");
    // Shorter than a trigram: still found.
    let (_, s) = api.post("/api/analytics/event-search", &json!({"query": "42"})).await;
    assert_eq!((s["total"].as_u64(), s["totalCapped"].as_bool()), (Some(1), Some(false)), "{s}");
    assert_eq!(s["results"][0]["event"], "pallet.scanned");
    let q = "/api/analytics/event-search";
    api.refused(q, json!({"query": "  "}), "query").await;
    api.refused(q, json!({"query": "x".repeat(201)}), "query").await;
    api.refused(q, json!({}), "query").await;
    api.refused(q, json!({"query": "abc", "limit": -3}), "limit").await;
    api.refused(q, json!({"query": "abc", "from": 10, "to": 5}), "from").await;

    let periods = json!({
        "current": {"from": now - HOUR, "to": now + 1},
        "previous": {"from": now - 2 * HOUR, "to": now - HOUR},
    });
    let (status, c) = api.post("/api/analytics/whats-changed", &periods).await;
    assert_eq!(status, StatusCode::OK, "{c}");
    assert_eq!(c["current"]["totalEvents"], 3);
    assert_eq!(c["previous"]["totalEvents"], 2);
    assert_eq!(c["newEventTypes"], json!(["pallet.scanned"]));
    assert_eq!(c["disappearedEventTypes"], json!(["legacy.sync"]));
    let view = c["eventDiffs"].as_array().unwrap().iter().find(|d| d["event"] == "page.view");
    assert_eq!(
        view.unwrap(),
        &json!({"event": "page.view", "current": 2, "previous": 1, "delta": 1, "pctChange": 100.0})
    );
    assert_eq!(c["revenueDelta"], 0.0);
    // Defaults: the last 7 days against the 7 before.
    let (status, c) = api.post("/api/analytics/whats-changed", &json!({})).await;
    assert_eq!(status, StatusCode::OK, "{c}");
    assert_eq!(c["current"]["totalEvents"], 5);
    assert_eq!(
        c["current"]["to"].as_i64().unwrap() - c["current"]["from"].as_i64().unwrap(),
        7 * 24 * HOUR
    );
    let w = "/api/analytics/whats-changed";
    api.refused(w, json!({"current": {"from": 5, "to": 1}}), "current.from").await;
    api.refused(w, json!({"previous": {"from": 1}}), "previous.to").await;
    let (status, body) = api.post(w, &json!({"since": 1})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "unknown fields are refused: {body}");
}

#[tokio::test]
async fn health_usage_and_agent_context() {
    let api = Api::start().await;
    let now = now_ms();
    let agent = |name: &str, at: i64| {
        json!({"event": name, "traceId": "wf-9", "timestamp": at,
            "actor": {"type": "ai_agent", "id": "agent-1"}})
    };
    let mut events = vec![
        agent("workflow.started", now - 20 * MIN),
        agent("workflow.failed", now - 19 * MIN),
        json!({"event": "refund.issued", "decisionId": "dec_gap", "trustTier": "T1",
            "timestamp": now - 15 * MIN}),
        json!({"event": "trackable.scanned", "timestamp": now - 14 * MIN}),
        order("ann", now - 13 * MIN, 25.0),
    ];
    // A burst of alarms against an empty week: a spike.
    events.extend((0..12).map(|i| json!({"event": "sensor.alarm", "timestamp": now - i})));
    api.ingest(events).await;

    let (status, h) = api.get("/api/businesses/default/health?limit=5").await;
    assert_eq!(status, StatusCode::OK, "{h}");
    assert_eq!(h["businessId"], "default");
    let score = h["healthScore"].as_u64().unwrap();
    assert!(score <= 100);
    assert!(h["healthComponents"]["reliability"].as_f64().unwrap() < 1.0, "a failed run: {h}");
    assert_eq!(
        (h["revenue"].as_f64(), h["orders"].as_u64(), h["scans"].as_u64()),
        (Some(25.0), Some(1), Some(1))
    );
    assert_eq!(h["recentEvents"].as_array().unwrap().len(), 5);
    assert_eq!(h["workflows"][0]["traceId"], "wf-9");
    assert_eq!(h["workflows"][0]["status"], "failed");
    let kinds: Vec<&str> =
        h["alerts"].as_array().unwrap().iter().filter_map(|a| a["kind"].as_str()).collect();
    assert!(kinds.contains(&"run_failed") && kinds.contains(&"proof_gap"), "{h}");
    let actions: Vec<&str> =
        h["nextActions"].as_array().unwrap().iter().filter_map(|a| a["action"].as_str()).collect();
    assert!(actions.contains(&"investigate_failed_run"), "{h}");
    let export =
        h["nextActions"].as_array().unwrap().iter().find(|a| a["action"] == "export_proof_trail");
    assert_eq!(export.unwrap()["decisionObjectId"], "dec_gap");
    assert_eq!(export.unwrap()["governed"], true);
    assert!(h["metrics"].as_array().unwrap().iter().any(|m| m["eventName"] == "sensor.alarm"));
    assert!(h["attribution"]["bySource"].is_array());

    let (status, body) = api.get("/api/businesses/nowhere/health").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert_eq!(body["error"]["code"], "not_found");
    api.refused_get("/api/businesses/default/health?limit=abc", "limit").await;
    api.refused_get("/api/businesses/default/health?window=1", "window").await;

    let (status, u) = api.get("/api/usage").await;
    assert_eq!(status, StatusCode::OK, "{u}");
    assert_eq!(u["workspaceId"], "ws_default");
    assert_eq!(u["events"]["ingested"], 17);
    assert_eq!(u["events"]["quota"], Value::Null);
    assert!(u["apiCalls"].as_u64().unwrap() >= 3, "this call and those before: {u}");
    assert_eq!(u["agents"][0]["actorId"], "agent-1");
    assert_eq!(u["agents"][0]["events"], 2);
    let rate = &u["rateLimit"];
    let remaining = rate["remaining"].as_u64().expect("limited by default");
    // The bucket refills at 1000/s by default, so only bounds hold here;
    // the exact count is a unit test of `Usage::requests_left`.
    assert!(remaining <= rate["burst"].as_u64().unwrap(), "{u}");
    assert!(u["connectors"].is_array());
    api.refused_get("/api/usage?limit=-1", "limit").await;

    let ctx = "/api/intelligence/agent-context";
    let (status, a) = api.post(ctx, &json!({"mode": "detect_anomalies"})).await;
    assert_eq!(status, StatusCode::OK, "{a}");
    let spike =
        a["anomalies"].as_array().unwrap().iter().find(|x| x["eventName"] == "sensor.alarm");
    assert_eq!(spike.expect("the alarm burst is a spike")["direction"], "spike", "{a}");
    assert_eq!(a["missingProofEvents"], json!([]));
    assert_eq!(a["changes"], Value::Null);

    let (_, a) = api.post(ctx, &json!({"mode": "proof_gaps", "businessId": "default"})).await;
    assert_eq!(a["missingProofEvents"][0]["decisionId"], "dec_gap", "{a}");
    assert_eq!(a["missingProofEvents"].as_array().unwrap().len(), 1);

    let (_, a) = api.post(ctx, &json!({"mode": "recommend_next_actions", "limit": 2})).await;
    let actions = a["nextActions"].as_array().unwrap();
    assert_eq!(actions.len(), 2, "bounded by limit: {a}");
    assert_eq!(actions[0]["action"], "investigate_failed_run");
    // With the signals they come from.
    assert_eq!(a["changes"]["current"]["totalEvents"], 17, "{a}");
    assert_eq!(a["missingProofEvents"][0]["decisionId"], "dec_gap");

    let (_, a) = api.post(ctx, &json!({"mode": "summarize"})).await;
    assert_eq!(a["changes"]["current"]["totalEvents"], 17, "{a}");
    assert!(a["summary"].as_str().unwrap().contains("17 events"));
    assert!(!a["nextActions"].as_array().unwrap().is_empty());

    let (status, body) = api.post(ctx, &json!({"mode": "dance"})).await;
    assert_refused(status, &body, "mode", &json!("dance"));
    assert!(body["error"]["message"].as_str().unwrap().contains("recommend_next_actions"));
    api.refused(ctx, json!({}), "mode").await;
    api.refused(ctx, json!({"mode": "summarize", "limit": -1}), "limit").await;
    let (status, _) = api.post(ctx, &json!({"mode": "summarize", "businessId": "nowhere"})).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn entities_and_relationships_are_listed() {
    let api = Api::start().await;
    let now = now_ms();
    let assign = |robot: &str, at: i64| {
        json!({"event": "shipment.assigned", "timestamp": at,
            "actor": {"type": "robot", "id": robot}, "object": {"type": "shipment", "id": "shp-1"},
            "entity": {"type": "shipment", "id": "shp-1", "properties": {"dock": 3}}})
    };
    api.ingest(vec![assign("robot-1", now - 2 * MIN), assign("robot-2", now - MIN)]).await;
    let (status, e) = api.get("/api/entities?type=shipment").await;
    assert_eq!(status, StatusCode::OK, "{e}");
    assert_eq!(e["entities"][0]["type"], "shipment");
    assert_eq!(e["entities"][0]["properties"], json!({"dock": 3}));
    assert_eq!(e["entities"][0]["firstSeen"], now - 2 * MIN);
    let (_, r) = api.get("/api/relationships?entityType=shipment&entityId=shp-1").await;
    let from: Vec<&str> = r["relationships"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|x| x["fromId"].as_str())
        .collect();
    assert_eq!(from, ["robot-2", "robot-1"], "most recent first: {r}");
    let (_, r) = api.get("/api/relationships?entityType=robot&entityId=robot-1&limit=5").await;
    assert_eq!(r["relationships"].as_array().unwrap().len(), 1);
    api.refused_get("/api/relationships?entityId=shp-1", "entityType").await;
    api.refused_get("/api/entities?kind=x", "kind").await;
    api.refused_get("/api/entities?limit=x", "limit").await;
}
