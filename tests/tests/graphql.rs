//! `POST /api/graphql` against the real binary: all twelve root fields of
//! the spec with their sub-fields, variables, introspection, the standard
//! error shape for unknown fields and bad arguments, and the credential
//! check in front of it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use opgraph_tests::Cloud;
use opgraph_tests::now_ms;
use reqwest::{Client, StatusCode};
use serde_json::{Value, json};

const MIN: i64 = 60_000;
const HOUR: i64 = 60 * MIN;

async fn post(client: &Client, cloud: &Cloud, path: &str, body: &Value) -> (StatusCode, Value) {
    let response =
        client.post(cloud.at(path)).bearer_auth(&cloud.key).json(body).send().await.unwrap();
    let status = response.status();
    (status, response.json().await.unwrap_or(Value::Null))
}

async fn created(client: &Client, cloud: &Cloud, path: &str, body: Value, key: &str) -> String {
    let (status, answer) = post(client, cloud, path, &body).await;
    assert_eq!(status, StatusCode::CREATED, "{path}: {answer}");
    answer[key]["id"].as_str().unwrap().to_owned()
}

async fn graphql(client: &Client, cloud: &Cloud, query: &str, variables: Value) -> Value {
    let body = json!({"query": query, "variables": variables});
    let (status, answer) = post(client, cloud, "/api/graphql", &body).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    answer
}

/// A small world: orders with touchpoints, two workflow runs of one agent,
/// a robot run, a tracking plan, a metric definition, a decision, an
/// enforcement receipt and a proof trail.
async fn seed(client: &Client, cloud: &Cloud) {
    let now = now_ms();
    let agent = |event: &str, trace: &str, at: i64| {
        json!({"event": event, "traceId": trace, "timestamp": at,
            "actor": {"type": "ai_agent", "id": "agent-1"}})
    };
    let user = |event: &str, id: &str, at: i64| json!({"event": event, "actor": {"type": "user", "id": id}, "timestamp": at});
    let mut click = user("ad.click", "ann", now - 3 * HOUR);
    click["attribution"] = json!({"source": "google", "campaign": "spring"});
    let mut order = user("order.created", "ann", now - 2 * HOUR);
    order["outcome"] = json!({"revenue": 80});
    let batch = vec![
        user("page.view", "ann", now - 4 * HOUR),
        click,
        user("cart.add", "ann", now - 150 * MIN),
        order,
        user("page.view", "bob", now - HOUR),
        agent("workflow.started", "wf-1", now - 50 * MIN),
        agent("workflow.completed", "wf-1", now - 45 * MIN),
        agent("workflow.started", "wf-2", now - 40 * MIN),
        agent("workflow.failed", "wf-2", now - 39 * MIN),
        json!({"event": "robot.mission.started", "traceId": "rb-1", "timestamp": now - 30 * MIN,
            "actor": {"type": "robot", "id": "robot-3"}}),
        json!({"event": "shipment.assigned", "timestamp": now - 25 * MIN,
            "actor": {"type": "robot", "id": "robot-3"}, "object": {"type": "shipment", "id": "shp-1"},
            "entity": {"type": "shipment", "id": "shp-1", "name": "Shipment 1"}}),
        json!({"event": "refund.requested", "traceId": "tr-gov", "trustTier": "T3",
            "timestamp": now - 20 * MIN, "actor": {"type": "agent", "id": "agent-7"}}),
    ];
    let (status, body) = post(client, cloud, "/api/ingest", &json!({"batch": batch})).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");

    created(
        client,
        cloud,
        "/api/tracking-plans",
        json!({"name": "Checkout", "vertical": "ecommerce", "events": ["page.view", "order.created"]}),
        "trackingPlan",
    )
    .await;
    created(
        client,
        cloud,
        "/api/metric-definitions",
        json!({"name": "Orders", "eventName": "order.created", "aggregation": "count"}),
        "metricDefinition",
    )
    .await;
    let dec = created(
        client,
        cloud,
        "/api/governance/decision-objects",
        json!({"title": "Refund 8812", "riskLevel": "medium", "status": "approved"}),
        "decisionObject",
    )
    .await;
    created(
        client,
        cloud,
        "/api/governance/decision-objects",
        json!({"title": "Raise limits", "riskLevel": "high", "status": "pending_approval"}),
        "decisionObject",
    )
    .await;
    let grt = created(
        client,
        cloud,
        "/api/governance/authority-grants",
        json!({"grantee": "agent-7", "actions": ["refund"], "maxAmount": 500, "currency": "EUR"}),
        "authorityGrant",
    )
    .await;
    let ctc = created(
        client,
        cloud,
        "/api/governance/context-contracts",
        json!({"name": "refunds", "allowedActions": ["refund"]}),
        "contextContract",
    )
    .await;
    let enforce = json!({
        "decisionObjectId": dec, "authorityGrantId": grt, "contextContractId": ctc,
        "proposedAction": {"action": "refund", "amount": 50, "currency": "EUR", "actor": "agent-7"},
        "traceId": "tr-gov",
    });
    let (status, answer) = post(client, cloud, "/api/governance/enforce", &enforce).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let receipt = answer["receiptId"].as_str().unwrap().to_owned();
    let (status, answer) = post(
        client,
        cloud,
        "/api/proof-event-trails/export",
        &json!({"title": "Refund 8812", "receiptIds": [receipt]}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{answer}");
}

const EVERYTHING: &str = r#"
query Everything($limit: Int, $agent: String!, $workflow: String!, $steps: [FunnelStepInput!]!) {
  events(limit: $limit) { id event actorId timestamp receivedAt properties envelope }
  traced: events(traceId: "wf-1") { event traceId }
  trackingPlans { id name vertical events }
  metricDefinitions { id name eventName aggregation }
  metrics(interval: "hour") { totalEvents totalRevenue metrics { eventName count uniqueActors revenue } series { bucket count } definitions { definition { name } value } }
  funnel(steps: $steps) { windowMs steps { name event count conversionRate dropOff } }
  attribution(model: FIRST_TOUCH, conversionEvent: "order.created") { conversions revenue unattributed bySource { key touchpoints conversions revenue } byCampaign { key conversions } byChannel { key } byEntity { key } }
  businessHealth { businessId healthScore revenue scans leads orders nextActions { action reason governed decisionObjectId } alerts { kind severity } workflows { traceId status } recentEvents { event } healthComponents { activity reliability } }
  agentPerformance(agentId: $agent) { agentId agentType events runs completedRuns failedRuns runningRuns successRate recentRuns { traceId status } }
  workflowStatus(workflowId: $workflow) { workflowId status kind events lastEvent actorId timeline { event } }
  missing: workflowStatus(workflowId: "nope") { status }
  decisionObjects(limit: 10) { id title status riskLevel }
  pending: decisionObjects(status: "pending_approval") { title }
  enforcementReceipts(traceId: "tr-gov") { id outcome contentHash decisionObjectId receipt }
  proofTrails { id title rootHash itemCount }
  entities { type id name properties }
  relationships(entityType: "shipment", entityId: "shp-1") { fromType fromId relation toId count }
}
"#;

#[tokio::test]
async fn all_twelve_root_fields_answer_with_their_sub_fields() {
    let cloud = Cloud::start(&[]).await.unwrap();
    let client = cloud.http();
    seed(&client, &cloud).await;

    let variables = json!({
        "limit": 3, "agent": "agent-1", "workflow": "wf-2",
        "steps": [{"name": "Viewed", "event": "page.view"}, {"event": "order.created"}],
    });
    let answer = graphql(&client, &cloud, EVERYTHING, variables).await;
    assert!(answer.get("errors").is_none(), "{answer:#}");
    let d = &answer["data"];

    let events = d["events"].as_array().unwrap();
    assert_eq!(events.len(), 3, "limit from a variable");
    assert!(events[0]["id"].as_str().unwrap().starts_with("evt_"));
    assert!(events[0]["envelope"]["event"].is_string());
    assert_eq!(d["traced"].as_array().unwrap().len(), 2);
    assert_eq!(d["traced"][0]["traceId"], "wf-1");

    assert_eq!(d["trackingPlans"][0]["name"], "Checkout");
    assert_eq!(d["trackingPlans"][0]["events"], json!(["page.view", "order.created"]));
    assert_eq!(d["metricDefinitions"][0]["aggregation"], "COUNT");

    let m = &d["metrics"];
    assert!(m["totalEvents"].as_u64().unwrap() >= 11, "{m}");
    assert_eq!(m["totalRevenue"], 80.0);
    let order = m["metrics"].as_array().unwrap().iter().find(|e| e["eventName"] == "order.created");
    assert_eq!(order.unwrap()["revenue"], 80.0);
    assert!(!m["series"].as_array().unwrap().is_empty());
    assert_eq!(m["definitions"][0]["definition"]["name"], "Orders");
    assert_eq!(m["definitions"][0]["value"], 1.0);

    let f = &d["funnel"];
    assert_eq!(f["steps"][0]["count"], 2, "ann and bob viewed: {f}");
    assert_eq!(f["steps"][1]["count"], 1, "ann ordered after viewing");
    assert_eq!(f["steps"][1]["conversionRate"], 0.5);
    assert_eq!(f["steps"][1]["dropOff"], 1);

    let a = &d["attribution"];
    assert_eq!((a["conversions"].as_u64(), a["unattributed"].as_u64()), (Some(1), Some(0)));
    assert_eq!(
        a["bySource"][0],
        json!({"key": "google", "touchpoints": 1, "conversions": 1.0, "revenue": 80.0})
    );
    assert_eq!(a["byCampaign"][0]["key"], "spring");

    let h = &d["businessHealth"];
    assert_eq!(h["businessId"], "default");
    assert!(h["healthScore"].as_u64().unwrap() <= 100);
    assert_eq!(h["revenue"], 80.0);
    assert_eq!(h["orders"], 1);
    let actions: Vec<&str> =
        h["nextActions"].as_array().unwrap().iter().filter_map(|a| a["action"].as_str()).collect();
    assert!(actions.contains(&"investigate_failed_run"), "{h}");
    assert!(actions.contains(&"review_decision"), "the pending decision: {h}");
    assert!(h["workflows"].as_array().unwrap().iter().any(|w| w["traceId"] == "wf-2"));
    assert!(!h["recentEvents"].as_array().unwrap().is_empty());

    let p = &d["agentPerformance"];
    assert_eq!(p["agentId"], "agent-1");
    assert_eq!(p["agentType"], "ai_agent");
    assert_eq!((p["events"].as_u64(), p["runs"].as_u64()), (Some(4), Some(2)));
    assert_eq!((p["completedRuns"].as_u64(), p["failedRuns"].as_u64()), (Some(1), Some(1)));
    assert_eq!(p["successRate"], 0.5);
    assert_eq!(p["recentRuns"][0]["traceId"], "wf-2");

    let w = &d["workflowStatus"];
    assert_eq!(w["status"], "failed");
    assert_eq!(w["kind"], "workflow");
    assert_eq!(w["events"], 2);
    assert_eq!(w["lastEvent"], "workflow.failed");
    assert_eq!(w["actorId"], "agent-1");
    assert_eq!(w["timeline"], json!([{"event": "workflow.started"}, {"event": "workflow.failed"}]));
    assert_eq!(d["missing"], Value::Null);

    assert_eq!(d["decisionObjects"].as_array().unwrap().len(), 2);
    assert_eq!(d["pending"], json!([{"title": "Raise limits"}]));
    let r = &d["enforcementReceipts"];
    assert_eq!(r.as_array().unwrap().len(), 1, "{r}");
    assert!(r[0]["id"].as_str().unwrap().starts_with("rcp_"));
    assert_eq!(r[0]["receipt"]["contentHash"], r[0]["contentHash"]);
    assert!(r[0]["outcome"].is_string());
    assert_eq!(d["proofTrails"][0]["title"], "Refund 8812");
    assert!(d["proofTrails"][0]["itemCount"].as_u64().unwrap() >= 1);

    assert_eq!(
        d["entities"],
        json!([{"type": "shipment", "id": "shp-1", "name": "Shipment 1", "properties": {}}])
    );
    assert_eq!(
        d["relationships"],
        json!([{"fromType": "robot", "fromId": "robot-3", "relation": "shipment.assigned",
            "toId": "shp-1", "count": 1}])
    );
}

/// `n` aliases of `field`, as one query.
fn aliased(n: usize, field: &str) -> String {
    let fields: Vec<String> = (0..n).map(|i| format!("a{i}: {field}")).collect();
    format!("{{ {} }}", fields.join(" "))
}

#[tokio::test]
async fn aliases_cannot_multiply_what_one_query_reads() {
    let cloud = Cloud::start(&[]).await.unwrap();
    let client = cloud.http();
    let refused = |answer: &Value| {
        answer["data"].is_null()
            && answer["errors"][0]["message"].as_str().is_some_and(|m| m.contains("complex"))
    };
    // 200 lists of up to 1000 events: refused before anything is read.
    let answer =
        graphql(&client, &cloud, &aliased(200, "events(limit: 1000) { id }"), json!({})).await;
    assert!(refused(&answer), "{answer}");
    // Eleven aggregations over the last 30 days: refused.
    let funnel = r#"funnel(steps: [{event: "a"}, {event: "b"}]) { windowMs }"#;
    assert!(refused(&graphql(&client, &cloud, &aliased(11, funnel), json!({})).await));
    // What a dashboard asks at once still answers: a full page of events
    // with every field, and a few aggregations.
    let dashboard = format!(
        "{{ events(limit: 1000) {{ id event timestamp receivedAt actorId objectId traceId \
         businessId trustTier actor object properties envelope }} {} }}",
        aliased(4, funnel).trim_start_matches('{').trim_end_matches('}')
    );
    let answer = graphql(&client, &cloud, &dashboard, json!({})).await;
    assert!(answer.get("errors").is_none(), "{answer}");
}

#[tokio::test]
async fn introspection_errors_and_credentials() {
    let cloud = Cloud::start(&[]).await.unwrap();
    let client = cloud.http();

    let answer =
        graphql(&client, &cloud, "{ __schema { queryType { fields { name } } } }", json!({})).await;
    let names: Vec<&str> = answer["data"]["__schema"]["queryType"]["fields"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|f| f["name"].as_str())
        .collect();
    for field in [
        "events",
        "trackingPlans",
        "metricDefinitions",
        "metrics",
        "funnel",
        "attribution",
        "businessHealth",
        "agentPerformance",
        "workflowStatus",
        "decisionObjects",
        "enforcementReceipts",
        "proofTrails",
    ] {
        assert!(names.contains(&field), "{field} not in {names:?}");
    }

    // An unknown field: a validation error, status 200, no data.
    let answer = graphql(&client, &cloud, "{ events { id } nope }", json!({})).await;
    assert_eq!(answer["data"], Value::Null);
    assert!(answer["errors"][0]["message"].as_str().unwrap().contains("nope"), "{answer}");
    assert!(answer["errors"][0]["locations"].is_array());
    assert_eq!(answer["errors"][0]["extensions"]["code"], "invalid_query", "{answer}");

    // A bad argument: the API's code and field in the extensions.
    let answer =
        graphql(&client, &cloud, r#"{ funnel(steps: [{event: "a"}]) { windowMs } }"#, json!({}))
            .await;
    let error = &answer["errors"][0];
    assert_eq!(error["extensions"]["code"], "validation_failed", "{answer}");
    assert_eq!(error["extensions"]["field"], "steps");
    assert_eq!(error["path"], json!(["funnel"]));
    let answer = graphql(&client, &cloud, "{ events(limit: -1) { id } }", json!({})).await;
    assert_eq!(answer["errors"][0]["extensions"]["field"], "limit", "{answer}");
    let answer = graphql(
        &client,
        &cloud,
        r#"{ businessHealth(businessId: "nowhere") { healthScore } }"#,
        json!({}),
    )
    .await;
    assert_eq!(answer["errors"][0]["extensions"]["code"], "not_found", "{answer}");
    // A variable of the wrong type.
    let answer = graphql(
        &client,
        &cloud,
        "query($n: Int) { events(limit: $n) { id } }",
        json!({"n": "ten"}),
    )
    .await;
    assert!(answer["errors"][0]["message"].is_string(), "{answer}");
    assert_eq!(answer["errors"][0]["extensions"]["code"], "invalid_query", "{answer}");

    // Before GraphQL: the credential and the body, in the API's shape.
    let response = client
        .post(cloud.at("/api/graphql"))
        .json(&json!({"query": "{ events { id } }"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["code"], "unauthorized");
    let (status, body) = post(&client, &cloud, "/api/graphql", &json!({"variables": {}})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["field"], "query");
}
