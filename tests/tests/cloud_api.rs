//! The cloud's HTTP API against the real binary: ingest, listing, keys,
//! workspaces, every error status of the API contract.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose

use opgraph_tests::{Cloud, TEST_BOOTSTRAP_KEY};
use reqwest::{Client, StatusCode};
use serde_json::{Value, json};

async fn send(client: &Client, cloud: &Cloud, key: &str, body: &Value) -> (StatusCode, Value) {
    let response =
        client.post(cloud.at("/api/ingest")).bearer_auth(key).json(body).send().await.unwrap();
    let status = response.status();
    (status, response.json().await.unwrap_or(Value::Null))
}

async fn get(client: &Client, cloud: &Cloud, key: &str, path: &str) -> (StatusCode, Value) {
    let response = client.get(cloud.at(path)).bearer_auth(key).send().await.unwrap();
    let status = response.status();
    (status, response.json().await.unwrap_or(Value::Null))
}

fn error_code(body: &Value) -> &str {
    body["error"]["code"].as_str().unwrap_or("<no error code>")
}

async fn new_key(client: &Client, cloud: &Cloud, admin: &str, scopes: Value) -> (String, String) {
    let response = client
        .post(cloud.at("/api/keys"))
        .bearer_auth(admin)
        .json(&json!({"name": "test", "scopes": scopes}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    let body: Value = response.json().await.unwrap();
    (body["apiKey"].as_str().unwrap().to_owned(), body["key"]["id"].as_str().unwrap().to_owned())
}

#[tokio::test]
async fn ingest_then_list_round_trips_the_envelope() {
    let cloud = Cloud::start(&[]).await.unwrap();
    let client = cloud.http();
    let envelope = json!({
        "event": "rfid.tag.read",
        "actor": {"type": "rfid_reader", "id": "dock-3", "site": "north"},
        "object": "epc:3034F87",
        "traceId": "tr-1",
        "trackable": {"kind": "rfid_tag", "code": "3034F87"},
        "properties": {"rssi": -51, "antenna": 2, "ratio": 0.5},
        "trustTier": "T1",
        "timestamp": opgraph_cloud_now() - 1000
    });
    let (status, body) = send(&client, &cloud, &cloud.key, &envelope).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    assert_eq!(body["accepted"], 1);
    let id = body["ids"][0].as_str().unwrap().to_owned();
    assert!(id.starts_with("evt_"));

    let (status, list) = get(&client, &cloud, &cloud.key, "/api/events?traceId=tr-1").await;
    assert_eq!(status, StatusCode::OK);
    let events = list["events"].as_array().unwrap();
    assert_eq!(events.len(), 1);
    let stored = &events[0];
    assert_eq!(stored["id"], id.as_str());
    assert!(stored["receivedAt"].is_i64());
    // Defaults applied, everything else exactly as sent.
    assert_eq!(stored["businessId"], "default");
    let mut expected = envelope.clone();
    expected["businessId"] = json!("default");
    expected["id"] = json!(id);
    expected["receivedAt"] = stored["receivedAt"].clone();
    assert_eq!(stored, &expected);
}

fn opgraph_cloud_now() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64
}

/// Batches hold at most 1000 envelopes, and lists at most 1000 entries
/// however many are asked for: both need more than 1000 events to show.
#[tokio::test]
async fn batches_and_lists_are_bounded_at_1000() {
    let cloud = Cloud::start(&[]).await.unwrap();
    let client = cloud.http();
    let batch = |n: usize| json!({"batch": vec![json!({"event": "tick"}); n]});
    let (status, answer) = send(&client, &cloud, &cloud.key, &batch(1001)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    assert_eq!(answer["error"]["field"], "batch");
    let (_, none) = get(&client, &cloud, &cloud.key, "/api/events").await;
    assert_eq!(none["events"], json!([]), "a refused batch stored something");
    for n in [1000, 5] {
        let (status, answer) = send(&client, &cloud, &cloud.key, &batch(n)).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{answer}");
    }
    let (status, listed) = get(&client, &cloud, &cloud.key, "/api/events?limit=5000").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(listed["events"].as_array().unwrap().len(), 1000, "clamped to 1000");
}

#[tokio::test]
async fn list_filters_orders_and_limits() {
    let cloud = Cloud::start(&[]).await.unwrap();
    let client = cloud.http();
    let now = opgraph_cloud_now();
    let batch: Vec<Value> = (0..30)
        .map(|i| {
            json!({
                "event": if i % 3 == 0 { "order.created" } else { "page.viewed" },
                "businessId": if i % 2 == 0 { "shop-a" } else { "shop-b" },
                "timestamp": now - 100_000 + i * 1000,
            })
        })
        .collect();
    let (status, body) = send(&client, &cloud, &cloud.key, &json!({ "batch": batch })).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    assert_eq!(body["ids"].as_array().unwrap().len(), 30);

    let (_, all) = get(&client, &cloud, &cloud.key, "/api/events?limit=1000").await;
    let times: Vec<i64> = all["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["timestamp"].as_i64().unwrap())
        .collect();
    assert_eq!(times.len(), 30);
    assert!(times.windows(2).all(|w| w[0] >= w[1]), "newest first: {times:?}");

    let (_, orders) = get(&client, &cloud, &cloud.key, "/api/events?event=order.created").await;
    assert_eq!(orders["events"].as_array().unwrap().len(), 10);
    let (_, shop) =
        get(&client, &cloud, &cloud.key, "/api/events?businessId=shop-a&event=order.created").await;
    assert_eq!(shop["events"].as_array().unwrap().len(), 5);
    let range = format!("/api/events?from={}&to={}", now - 100_000, now - 100_000 + 5000);
    let (_, ranged) = get(&client, &cloud, &cloud.key, &range).await;
    assert_eq!(ranged["events"].as_array().unwrap().len(), 5);
    let (_, limited) = get(&client, &cloud, &cloud.key, "/api/events?limit=7").await;
    assert_eq!(limited["events"].as_array().unwrap().len(), 7);
    // Clamped, not refused.
    let (status, _) = get(&client, &cloud, &cloud.key, "/api/events?limit=100000").await;
    assert_eq!(status, StatusCode::OK);
    for bad in ["limit=-1", "limit=abc", "from=yesterday", "colour=red", "from=10&to=5"] {
        let (status, body) = get(&client, &cloud, &cloud.key, &format!("/api/events?{bad}")).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}");
        assert_eq!(error_code(&body), "validation_failed", "{bad}");
    }
}

#[tokio::test]
async fn invalid_input_gets_the_error_shape_and_stores_nothing() {
    let cloud = Cloud::start(&[("OPGRAPH_BODY_LIMIT", "4KiB".into())]).await.unwrap();
    let client = cloud.http();
    let cases: Vec<(Value, &str)> = vec![
        (json!({}), "event"),
        (json!({"event": ""}), "event"),
        (json!({"event": "x".repeat(201)}), "event"),
        (json!({"event": "a", "trustTier": "T9"}), "trustTier"),
        (json!({"event": "a", "timestamp": 1.5}), "timestamp"),
        (json!({"event": "a", "timestamp": 1000}), "timestamp"),
        (json!({"event": "a", "actor": {"type": "robot"}}), "actor.id"),
        (json!({"event": "a", "properties": [1, 2]}), "properties"),
        (json!({"event": "a", "colour": "red"}), "colour"),
        (json!({"batch": [{"event": "ok"}, {"trustTier": "T1"}]}), "batch[1].event"),
        (json!({"event": "a", "entity": {"id": "x"}}), "entity.type"),
        (json!({"event": "a", "timestamp": opgraph_cloud_now() + 2 * 86_400_000}), "timestamp"),
    ];
    for (body, field) in cases {
        let (status, answer) = send(&client, &cloud, &cloud.key, &body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
        assert_eq!(error_code(&answer), "validation_failed", "{body}");
        assert_eq!(answer["error"]["field"], field, "{body}");
        assert!(answer["error"]["message"].as_str().is_some_and(|m| !m.is_empty()));
    }
    // Not JSON at all.
    let response = client
        .post(cloud.at("/api/ingest"))
        .bearer_auth(&cloud.key)
        .header("content-type", "application/json")
        .body("{\"event\": ")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    assert_eq!(error_code(&response.json().await.unwrap()), "invalid_json");
    // Wrong media type.
    let response = client
        .post(cloud.at("/api/ingest"))
        .bearer_auth(&cloud.key)
        .header("content-type", "text/plain")
        .body("{\"event\": \"a\"}")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
    assert_eq!(error_code(&response.json().await.unwrap()), "unsupported_media_type");
    // Too large, announced by Content-Length. The server answers without
    // reading the body and closes the connection, so each oversized request
    // gets a client of its own (a pooled connection would be dead after it).
    let big = json!({"event": "a", "properties": {"blob": "x".repeat(8192)}});
    let (status, answer) = send(&reqwest::Client::new(), &cloud, &cloud.key, &big).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(error_code(&answer), "payload_too_large");
    // The same bound on every route with a body, not only ingest.
    let response = reqwest::Client::new()
        .post(cloud.at("/api/governance/enforce"))
        .bearer_auth(&cloud.key)
        .json(&big)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(error_code(&response.json().await.unwrap()), "payload_too_large");
    // Too large, streamed without a length.
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
        (0..10).map(|_| Ok(vec![b' '; 1024])).collect();
    let response = reqwest::Client::new()
        .post(cloud.at("/api/ingest"))
        .bearer_auth(&cloud.key)
        .header("content-type", "application/json")
        .body(reqwest::Body::wrap_stream(futures_stream(chunks)))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
    // Unknown route.
    let (status, answer) = get(&client, &cloud, &cloud.key, "/api/nothing-here").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(error_code(&answer), "not_found");
    // Wrong method on a known route.
    let response =
        client.put(cloud.at("/api/ingest")).bearer_auth(&cloud.key).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::METHOD_NOT_ALLOWED);
    let answer: Value = response.json().await.unwrap();
    assert_eq!(error_code(&answer), "method_not_allowed", "the error shape, like every error");

    let (_, list) = get(&client, &cloud, &cloud.key, "/api/events").await;
    assert_eq!(list["events"].as_array().unwrap().len(), 0, "a rejected request stored something");
}

fn futures_stream(
    chunks: Vec<Result<Vec<u8>, std::io::Error>>,
) -> impl futures_core_stream::Stream<Item = Result<Vec<u8>, std::io::Error>> {
    futures_core_stream::iter(chunks)
}

/// A minimal stream over a vector, to send a body without Content-Length.
mod futures_core_stream {
    pub use tokio_stream::{Stream, iter};
}

#[tokio::test]
async fn idempotency_key_and_message_id_store_once() {
    let cloud = Cloud::start(&[]).await.unwrap();
    let client = cloud.http();
    let post = |key: &'static str| {
        client
            .post(cloud.at("/api/ingest"))
            .bearer_auth(&cloud.key)
            .header("Idempotency-Key", key)
            .json(&json!({"event": "payment.succeeded"}))
            .send()
    };
    let first: Value = post("pay-1").await.unwrap().json().await.unwrap();
    let again: Value = post("pay-1").await.unwrap().json().await.unwrap();
    assert_eq!(first["ids"], again["ids"]);
    let other: Value = post("pay-2").await.unwrap().json().await.unwrap();
    assert_ne!(first["ids"], other["ids"]);
    // A retry may order its keys otherwise: still the same request.
    let reordered = client
        .post(cloud.at("/api/ingest"))
        .bearer_auth(&cloud.key)
        .header("Idempotency-Key", "pay-3")
        .header("content-type", "application/json");
    let a = reordered
        .try_clone()
        .unwrap()
        .body(r#"{"event":"refund.issued","properties":{"a":1,"b":2}}"#);
    let b = reordered.body(r#"{ "properties": {"b": 2, "a": 1}, "event": "refund.issued" }"#);
    let a: Value = a.send().await.unwrap().json().await.unwrap();
    let b: Value = b.send().await.unwrap().json().await.unwrap();
    assert_eq!(a["ids"], b["ids"], "{a} {b}");
    // A key names one call: another body under it is refused, not dropped.
    let reused = json!({"batch": [{"event": "payment.succeeded"}, {"event": "payment.refunded"}]});
    let response = client
        .post(cloud.at("/api/ingest"))
        .bearer_auth(&cloud.key)
        .header("Idempotency-Key", "pay-1")
        .json(&reused)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::CONFLICT);
    let body: Value = response.json().await.unwrap();
    assert_eq!(error_code(&body), "conflict");
    assert!(body["error"]["message"].as_str().unwrap().contains("pay-1"), "{body}");
    let (_, refunds) = get(&client, &cloud, &cloud.key, "/api/events?event=payment.refunded").await;
    assert_eq!(refunds["events"].as_array().unwrap().len(), 0, "nothing of it stored");

    let with_message = json!({"batch": [
        {"event": "scan", "messageId": "m-1"},
        {"event": "scan", "messageId": "m-2"},
    ]});
    let (_, one) = send(&client, &cloud, &cloud.key, &with_message).await;
    let overlapping = json!({"batch": [
        {"event": "scan", "messageId": "m-2"},
        {"event": "scan", "messageId": "m-3"},
    ]});
    let (status, two) = send(&client, &cloud, &cloud.key, &overlapping).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    assert_eq!(one["ids"][1], two["ids"][0], "a replayed messageId answers with the first id");

    let (_, payments) =
        get(&client, &cloud, &cloud.key, "/api/events?event=payment.succeeded").await;
    assert_eq!(payments["events"].as_array().unwrap().len(), 2);
    let (_, scans) = get(&client, &cloud, &cloud.key, "/api/events?event=scan").await;
    assert_eq!(scans["events"].as_array().unwrap().len(), 3);
}

#[tokio::test]
async fn credentials_scopes_revocation_and_workspaces() {
    let cloud = Cloud::start(&[]).await.unwrap();
    let client = cloud.http();
    let event = json!({"event": "door.opened"});

    // No, malformed and unknown credentials.
    let response = client.post(cloud.at("/api/ingest")).json(&event).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(error_code(&response.json().await.unwrap()), "unauthorized");
    let response = client
        .post(cloud.at("/api/ingest"))
        .header("authorization", "Basic dXNlcjpwYXNz")
        .json(&event)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    for bad in ["og_notarealkey000000000000000000", "og_", "not-a-token", "a.b.c"] {
        let (status, body) = send(&client, &cloud, bad, &event).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{bad}");
        assert_eq!(error_code(&body), "unauthorized");
    }

    // A read-only key reads but may not ingest or manage keys.
    let (reader, reader_id) = new_key(&client, &cloud, &cloud.key, json!(["read"])).await;
    let (status, body) = send(&client, &cloud, &reader, &event).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(error_code(&body), "forbidden");
    let (status, _) = get(&client, &cloud, &reader, "/api/events").await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = get(&client, &cloud, &reader, "/api/keys").await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    // Nor redefine the workspace's metrics, which every reader then sees.
    let definition = client
        .post(cloud.at("/api/metric-definitions"))
        .bearer_auth(&reader)
        .json(&json!({"name": "Orders", "eventName": "order.created", "aggregation": "count"}))
        .send()
        .await
        .unwrap();
    assert_eq!(definition.status(), StatusCode::FORBIDDEN);
    let (status, _) = get(&client, &cloud, &reader, "/api/metric-definitions").await;
    assert_eq!(status, StatusCode::OK);

    // Listing never shows secrets.
    let (status, keys) = get(&client, &cloud, &cloud.key, "/api/keys").await;
    assert_eq!(status, StatusCode::OK);
    let text = keys.to_string();
    assert!(!text.contains(&reader) && !text.contains(TEST_BOOTSTRAP_KEY), "secret leaked");
    assert!(keys["keys"].as_array().unwrap().iter().any(|k| k["id"] == reader_id.as_str()));
    let (status, first) = get(&client, &cloud, &cloud.key, "/api/keys?limit=1").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(first["keys"].as_array().unwrap()[..], keys["keys"].as_array().unwrap()[..1]);
    let (status, body) = get(&client, &cloud, &cloud.key, "/api/keys?limt=1").await;
    assert_eq!((status, error_code(&body)), (StatusCode::BAD_REQUEST, "validation_failed"));

    // Bad key creation bodies.
    for body in
        [json!({"scopes": ["root"]}), json!({"scopes": []}), json!({"name": 5}), json!({"x": 1})]
    {
        let response = client
            .post(cloud.at("/api/keys"))
            .bearer_auth(&cloud.key)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{body}");
    }

    // Revocation takes effect at once.
    let (ingester, ingester_id) = new_key(&client, &cloud, &cloud.key, json!(["ingest"])).await;
    assert_eq!(send(&client, &cloud, &ingester, &event).await.0, StatusCode::ACCEPTED);
    let response = client
        .delete(cloud.at(&format!("/api/keys/{ingester_id}")))
        .bearer_auth(&cloud.key)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::NO_CONTENT);
    let (status, body) = send(&client, &cloud, &ingester, &event).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(error_code(&body), "unauthorized");
    let response = client
        .delete(cloud.at("/api/keys/key_doesnotexist"))
        .bearer_auth(&cloud.key)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::NOT_FOUND);

    // Workspaces: operator only; each sees only its own data.
    let response = client
        .post(cloud.at("/api/workspaces"))
        .bearer_auth(&reader)
        .json(&json!({"name": "Plant 2"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::FORBIDDEN);
    let response = client
        .post(cloud.at("/api/workspaces"))
        .bearer_auth(&cloud.key)
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let response = client
        .post(cloud.at("/api/workspaces"))
        .bearer_auth(&cloud.key)
        .json(&json!({"name": "Plant 2"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    let created: Value = response.json().await.unwrap();
    let other_ws = created["workspace"]["id"].as_str().unwrap().to_owned();
    let other_key = created["apiKey"].as_str().unwrap().to_owned();
    assert!(other_ws.starts_with("ws_"));
    let (status, _) =
        send(&client, &cloud, &other_key, &json!({"event": "secret.plan", "traceId": "t-x"})).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let (_, mine) = get(&client, &cloud, &cloud.key, "/api/events?traceId=t-x").await;
    assert_eq!(mine["events"].as_array().unwrap().len(), 0, "cross-workspace read");
    let (_, theirs) = get(&client, &cloud, &other_key, "/api/events").await;
    assert_eq!(theirs["events"].as_array().unwrap().len(), 1);
    // The new workspace's admin may not create workspaces.
    let response = client
        .post(cloud.at("/api/workspaces"))
        .bearer_auth(&other_key)
        .json(&json!({"name": "x"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::FORBIDDEN);
    // Naming another workspace with a key is refused, naming its own is fine.
    let response = client
        .get(cloud.at("/api/events"))
        .bearer_auth(&other_key)
        .header("X-Opgraph-Workspace-ID", "ws_default")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::FORBIDDEN);
    let response = client
        .get(cloud.at("/api/events"))
        .bearer_auth(&other_key)
        .header("X-Opgraph-Workspace-ID", &other_ws)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    // Keys of another workspace cannot be revoked: 404, not 403.
    let response = client
        .delete(cloud.at(&format!("/api/keys/{reader_id}")))
        .bearer_auth(&other_key)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    assert_eq!(get(&client, &cloud, &reader, "/api/events").await.0, StatusCode::OK);
}

#[tokio::test]
async fn rate_limit_answers_429_with_retry_after() {
    let cloud = Cloud::start(&[
        ("OPGRAPH_RATE_LIMIT_RPS", "1".into()),
        ("OPGRAPH_RATE_LIMIT_BURST", "3".into()),
    ])
    .await
    .unwrap();
    let client = cloud.http();
    let mut statuses = Vec::new();
    let mut retry_after = None;
    for _ in 0..5 {
        let response =
            client.get(cloud.at("/api/events")).bearer_auth(&cloud.key).send().await.unwrap();
        statuses.push(response.status());
        if response.status() == StatusCode::TOO_MANY_REQUESTS {
            retry_after = response.headers().get("retry-after").cloned();
            assert_eq!(error_code(&response.json().await.unwrap()), "rate_limited");
        }
    }
    assert_eq!(&statuses[..3], &[StatusCode::OK; 3]);
    assert_eq!(statuses[4], StatusCode::TOO_MANY_REQUESTS);
    let secs: u64 = retry_after.unwrap().to_str().unwrap().parse().unwrap();
    assert!(secs >= 1);
    // Health is not metered.
    let response = client.get(cloud.at("/api/health")).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
}

#[tokio::test]
async fn health_openapi_and_metrics() {
    let cloud = Cloud::start(&[]).await.unwrap();
    let client = cloud.http();
    let response = client.get(cloud.at("/api/health")).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let health: Value = response.json().await.unwrap();
    assert_eq!(health["status"], "ok");
    assert_eq!(health["checks"]["store"]["reachable"], true);
    assert!(health["checks"]["store"]["searchIndex"]["behind"].is_u64(), "{health}");
    assert_eq!(health["checks"]["config"]["bootstrapKey"], "configured");
    assert_eq!(health["checks"]["config"]["publicUrl"], cloud.url);
    let receivers = &health["checks"]["config"]["gatewayReceivers"];
    assert_eq!(
        receivers,
        &json!({"grpc": true, "quic": true, "certificate": "self-signed", "clientCertificates": false})
    );
    let integrations = &health["checks"]["integrations"];
    assert_eq!(integrations["externalProof"]["configured"], false, "{health}");
    assert_eq!(integrations["exports"]["privateNetworks"], false);
    assert_eq!(integrations["webhooks"]["maxAttempts"], 6);
    assert!(!health.to_string().contains(TEST_BOOTSTRAP_KEY));
    let response = client.get(cloud.at("/api/health?strict=1")).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);

    let doc: Value =
        client.get(cloud.at("/api/openapi")).send().await.unwrap().json().await.unwrap();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3.1"));
    for path in [
        "/api/ingest",
        "/api/events",
        "/api/keys",
        "/api/keys/{id}",
        "/api/workspaces",
        "/api/health",
    ] {
        assert!(doc["paths"][path].is_object(), "{path} missing");
    }

    send(&client, &cloud, &cloud.key, &json!({"event": "a"})).await;
    send(&client, &cloud, &cloud.key, &json!({"event": ""})).await;
    // The node's series are the operator's: no credential, or a
    // workspace's own admin key, is refused.
    let response = client.get(cloud.at("/metrics")).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    let (admin, _) = new_key(&client, &cloud, &cloud.key, json!(["admin", "read"])).await;
    let (status, body) = get(&client, &cloud, &admin, "/metrics").await;
    assert_eq!((status, error_code(&body)), (StatusCode::FORBIDDEN, "forbidden"));
    let response = client.get(cloud.at("/metrics")).bearer_auth(&cloud.key).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let text = response.text().await.unwrap();
    assert!(text.contains("opgraph_events_ingested_total{source=\"http\"} 1"), "{text}");
    assert!(
        text.contains("opgraph_ingest_rejections_total{reason=\"validation_failed\"} 1"),
        "{text}"
    );
    assert!(
        text.contains(
            "opgraph_http_requests_total{method=\"POST\",route=\"/api/ingest\",status=\"202\"} 1"
        ),
        "{text}"
    );
    assert!(text.contains("opgraph_http_request_duration_seconds_bucket"));
}

#[tokio::test]
async fn strict_health_fails_on_weak_token_settings() {
    let cloud = Cloud::start(&[
        ("OPGRAPH_JWT_SECRET", "s".repeat(40)),
        ("OPGRAPH_PROOF_URL", "https://proofs.example/in?token=hush".into()),
        ("OPGRAPH_PUBLIC_URL", "https://go.example".into()),
    ])
    .await
    .unwrap();
    let client = cloud.http();
    let response = client.get(cloud.at("/api/health")).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["status"], "degraded");
    assert!(!body.to_string().contains(&"s".repeat(40)), "secret leaked");
    // What is configured is said; where it points is not.
    assert_eq!(body["checks"]["integrations"]["externalProof"]["configured"], true);
    assert_eq!(body["checks"]["config"]["publicUrl"], "https://go.example");
    assert!(!body.to_string().contains("hush"), "proof URL shown: {body}");
    let response = client.get(cloud.at("/api/health?strict=1")).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
}

#[tokio::test]
async fn monthly_quota_refuses_new_events_and_still_answers_replays() {
    let cloud = Cloud::start(&[("OPGRAPH_EVENTS_QUOTA", "2".into())]).await.unwrap();
    let client = cloud.http();
    let event = |message: &str| json!({"event": "quota.tested", "messageId": message});
    let keyed = |body: &Value| {
        client
            .post(cloud.at("/api/ingest"))
            .bearer_auth(&cloud.key)
            .header("Idempotency-Key", "batch-1")
            .json(body)
            .send()
    };
    let batch = json!({"batch": [event("m-1"), event("m-2")]});
    let first = keyed(&batch).await.unwrap();
    assert_eq!(first.status(), StatusCode::ACCEPTED);
    let ids = first.json::<Value>().await.unwrap()["ids"].clone();

    // The quota is used up: a new event is refused, with nothing stored.
    let response = client
        .post(cloud.at("/api/ingest"))
        .bearer_auth(&cloud.key)
        .json(&json!({"batch": [event("m-3"), event("m-1")]}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(response.headers()["retry-after"], "3600");
    assert_eq!(error_code(&response.json().await.unwrap()), "rate_limited");

    // Retries of what was stored are answered as the first time.
    let (status, body) = send(&client, &cloud, &cloud.key, &event("m-2")).await;
    assert_eq!((status, &body["ids"][0]), (StatusCode::ACCEPTED, &ids[1]), "{body}");
    let replay = keyed(&batch).await.unwrap();
    assert_eq!(replay.status(), StatusCode::ACCEPTED);
    assert_eq!(replay.json::<Value>().await.unwrap()["ids"], ids);

    let (status, list) = get(&client, &cloud, &cloud.key, "/api/events?event=quota.tested").await;
    assert_eq!((status, list["events"].as_array().map(Vec::len)), (StatusCode::OK, Some(2)));
    let (_, usage) = get(&client, &cloud, &cloud.key, "/api/usage").await;
    assert_eq!(
        (&usage["events"]["ingested"], &usage["events"]["remaining"]),
        (&json!(2), &json!(0))
    );
}

#[tokio::test]
async fn a_path_id_that_is_not_utf8_gets_the_error_shape() {
    let cloud = Cloud::start(&[]).await.unwrap();
    let client = cloud.http();
    for path in ["/api/trackables/%FF", "/api/keys/%C3%28", "/api/governance/receipts/%FF"] {
        let method = if path.starts_with("/api/keys") {
            reqwest::Method::DELETE
        } else {
            reqwest::Method::GET
        };
        let response =
            client.request(method, cloud.at(path)).bearer_auth(&cloud.key).send().await.unwrap();
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{path}");
        let body: Value = response.json().await.unwrap();
        assert_eq!(error_code(&body), "validation_failed", "{path}: {body}");
        assert_eq!(body["error"]["field"], "id", "{path}");
    }
}
