//! Webhooks against the real binary: subscriptions through `/api/webhooks`,
//! signed deliveries to local HTTPS endpoints when an enforcement is
//! decided or an export fails, retries until a 2xx or the last attempt,
//! every attempt in the delivery log; deletion, scopes, workspaces and
//! bad input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use opgraph_tests::backends::{Backend, BackendCloud};
use opgraph_tests::edge::{eventually, series_value};
use opgraph_tests::https_endpoint::{self, Endpoint, header, openssl_hmac};
use opgraph_tests::{Cloud, TEST_BOOTSTRAP_KEY, both_backends, client};
use reqwest::{Client, Method, StatusCode};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

const SECRET: &str = "whsec-0123456789abcdef";
/// Far above what a delivery on loopback takes; only bounds a failure.
const WITHIN: Duration = Duration::from_secs(30);

/// A cloud whose webhooks may reach `endpoint` on loopback and retry fast:
/// three attempts, the first retry after 100 ms.
async fn start(backend: Backend, endpoint: &Endpoint) -> BackendCloud {
    start_with(backend, endpoint, &[]).await
}

async fn start_with(
    backend: Backend,
    endpoint: &Endpoint,
    more: &[(&str, String)],
) -> BackendCloud {
    let mut env = vec![
        ("OPGRAPH_EXPORT_CA_FILE", endpoint.ca_file.display().to_string()),
        ("OPGRAPH_EXPORT_ALLOW_PRIVATE_NETWORKS", "true".to_owned()),
        ("OPGRAPH_EXPORT_TIMEOUT", "5s".to_owned()),
        ("OPGRAPH_WEBHOOK_MAX_ATTEMPTS", "3".to_owned()),
        ("OPGRAPH_WEBHOOK_RETRY_BASE", "100ms".to_owned()),
    ];
    env.extend(more.iter().cloned());
    backend.start(&env).await.unwrap()
}

/// Another path on `endpoint`'s server: one certificate, so the one CA
/// file trusts every destination of a test.
fn at_path(endpoint: &Endpoint, path: &str) -> String {
    let base = endpoint.url.split("/v1/").next().unwrap();
    format!("{base}{path}")
}

async fn create(client: &Client, cloud: &Cloud, key: &str, body: &Value) -> (StatusCode, Value) {
    cloud.call(client, key, Method::POST, "/api/webhooks", Some(body)).await
}

/// The delivery log of `id` once it holds `n` attempts (the log is written
/// after each answer, in the background).
async fn log_of(client: &Client, cloud: &Cloud, key: &str, id: &str, n: usize) -> Vec<Value> {
    let path = format!("/api/webhooks/{id}/deliveries");
    let deadline = tokio::time::Instant::now() + WITHIN;
    loop {
        let (status, log) = cloud.call(client, key, Method::GET, &path, None).await;
        assert_eq!(status, StatusCode::OK, "{log}");
        let attempts = log["deliveries"].as_array().unwrap().clone();
        if attempts.len() >= n {
            return attempts;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} of {n} attempts logged",
            attempts.len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// An enforcement call naming objects that do not exist: a `deny`, and a
/// receipt like any other.
fn enforcement() -> Value {
    json!({"decisionObjectId": "dec_none", "authorityGrantId": "grt_none",
        "contextContractId": "ctr_none",
        "proposedAction": {"action": "refund", "amount": 20, "currency": "EUR", "actor": "agent-7"}})
}

/// A webhook for `enforcement.decided` to `endpoint`, then one enforcement
/// call: the webhook's id and the call's answer.
async fn subscribe_and_enforce(
    client: &Client,
    cloud: &Cloud,
    key: &str,
    endpoint: &Endpoint,
) -> (String, Value) {
    let body = json!({"url": endpoint.url, "events": ["enforcement.decided"], "secret": SECRET});
    let (_, created) = create(client, cloud, key, &body).await;
    let id = created["webhook"]["id"].as_str().unwrap().to_owned();
    let (status, decided) = cloud
        .call(client, key, Method::POST, "/api/governance/enforce", Some(&enforcement()))
        .await;
    assert_eq!(status, StatusCode::OK, "{decided}");
    (id, decided)
}

fn sha256(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// A request signed with `SECRET` over its timestamp and body, checked by
/// `openssl`.
fn assert_signed(head: &str, body: &[u8]) {
    let timestamp = header(head, "x-opgraph-timestamp").expect("timestamp header");
    let signed = [timestamp.as_bytes(), b".", body].concat();
    let expected = format!("sha256={}", openssl_hmac(SECRET, &signed));
    assert_eq!(header(head, "x-opgraph-signature"), Some(expected.as_str()), "{head}");
}

async fn enforcement_is_delivered_signed_and_retried(backend: Backend) {
    // The endpoint fails the first request and accepts the next ones.
    let endpoint = https_endpoint::start(vec![500, 200]).await;
    let cloud = start(backend, &endpoint).await;
    let (client, key) = (client(), cloud.key.clone());
    let body = json!({"url": endpoint.url, "events": ["enforcement.decided"], "secret": SECRET});
    let (status, created) = create(&client, &cloud, &key, &body).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let hook = created["webhook"].clone();
    let id = hook["id"].as_str().unwrap().to_owned();
    assert!(id.starts_with("whk_"), "{hook}");
    assert_eq!(hook["events"], json!(["enforcement.decided"]));
    assert!(!created.to_string().contains(SECRET), "the secret is never shown: {created}");
    let (_, listed) = cloud.call(&client, &key, Method::GET, "/api/webhooks", None).await;
    assert_eq!(listed["webhooks"], json!([hook]));

    let enforce = enforcement();
    let (status, decided) =
        cloud.call(&client, &key, Method::POST, "/api/governance/enforce", Some(&enforce)).await;
    assert_eq!(status, StatusCode::OK, "{decided}");

    // Two attempts of one delivery: the same bytes, each signed afresh.
    let received = endpoint.wait_for(2, WITHIN).await;
    let (first_head, first) = &received[0];
    let (second_head, second) = &received[1];
    assert_eq!(first, second, "a retry sends the same payload");
    assert_signed(first_head, first);
    assert_signed(second_head, second);
    let delivery = header(first_head, "x-opgraph-delivery").unwrap();
    assert!(delivery.starts_with("whd_"), "{first_head}");
    assert_eq!(header(second_head, "x-opgraph-delivery"), Some(delivery));
    assert_eq!(header(first_head, "idempotency-key"), Some(delivery));
    assert_eq!(header(first_head, "x-opgraph-event"), Some("enforcement.decided"));
    assert_eq!(header(first_head, "x-opgraph-attempt"), Some("1"));
    assert_eq!(header(second_head, "x-opgraph-attempt"), Some("2"));
    let payload: Value = serde_json::from_slice(first).unwrap();
    assert_eq!(payload["id"], delivery);
    assert_eq!(payload["type"], "enforcement.decided");
    assert_eq!(payload["workspaceId"], "ws_default");
    assert_eq!(payload["data"], decided["receipt"], "the receipt as the caller got it");

    // The log: newest first, the failure with its retry time, then success.
    let log = log_of(&client, &cloud, &key, &id, 2).await;
    assert_eq!(log.len(), 2, "{log:?}");
    let (ok, failed) = (&log[0], &log[1]);
    assert_eq!((failed["attempt"].as_u64(), ok["attempt"].as_u64()), (Some(1), Some(2)));
    assert_eq!(failed["status"], "failed");
    assert_eq!(failed["responseStatus"], 500);
    assert!(failed["error"].as_str().unwrap().contains("HTTP 500"), "{failed}");
    assert!(failed["nextAttemptAt"].as_i64().unwrap() > failed["createdAt"].as_i64().unwrap());
    assert_eq!(ok["status"], "succeeded");
    assert_eq!(ok["responseStatus"], 200);
    assert!(ok["nextAttemptAt"].is_null(), "{ok}");
    for attempt in [ok, failed] {
        assert_eq!(attempt["deliveryId"], delivery);
        assert_eq!(attempt["subject"], decided["receiptId"]);
        assert_eq!(attempt["event"], "enforcement.decided");
        assert_eq!(attempt["payloadHash"], sha256(first).as_str());
    }
    let response = client.get(cloud.at("/metrics")).bearer_auth(TEST_BOOTSTRAP_KEY).send().await;
    let text = response.unwrap().text().await.unwrap();
    assert!(text.contains("opgraph_webhook_deliveries_total{outcome=\"failed\"} 1"), "{text}");
    assert!(text.contains("opgraph_webhook_deliveries_total{outcome=\"succeeded\"} 1"), "{text}");
}

async fn export_failures_reach_subscribers_until_attempts_run_out(backend: Backend) {
    // Every request fails: the export's destination and the webhook alike
    // (both are paths of this one endpoint, so one CA serves them).
    let endpoint = https_endpoint::start(vec![503]).await;
    let cloud = start(backend, &endpoint).await;
    let (client, key) = (client(), cloud.key.clone());
    let hook_url = at_path(&endpoint, "/hooks/exports");
    let body = json!({"url": hook_url, "events": ["export.failed"], "secret": SECRET});
    let (status, created) = create(&client, &cloud, &key, &body).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let id = created["webhook"]["id"].as_str().unwrap().to_owned();
    // Subscribed to the other kind only: gets nothing from an export.
    let other = json!({"url": at_path(&endpoint, "/hooks/enforce"), "events": ["enforcement.decided"], "secret": SECRET});
    let (status, _) = create(&client, &cloud, &key, &other).await;
    assert_eq!(status, StatusCode::CREATED);
    // Deleted before the export: gets nothing either, though this process
    // had its workspace's webhooks cached (the enforcement read them).
    let gone = json!({"url": at_path(&endpoint, "/hooks/gone"), "events": ["export.failed"], "secret": SECRET});
    let (_, deleted) = create(&client, &cloud, &key, &gone).await;
    let (status, _) = cloud
        .call(&client, &key, Method::POST, "/api/governance/enforce", Some(&enforcement()))
        .await;
    assert_eq!(status, StatusCode::OK);
    let gone_path = format!("/api/webhooks/{}", deleted["webhook"]["id"].as_str().unwrap());
    let (status, _) = cloud.call(&client, &key, Method::DELETE, &gone_path, None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, again) = cloud.call(&client, &key, Method::DELETE, &gone_path, None).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{again}");
    let (status, _) =
        cloud.call(&client, &key, Method::GET, &format!("{gone_path}/deliveries"), None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    let export = json!({"destination": "https", "config": {"url": at_path(&endpoint, "/dest")},
        "records": [{"sku": "A-1"}]});
    let (status, failed) =
        cloud.call(&client, &key, Method::POST, "/api/exports/destinations", Some(&export)).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{failed}");
    let receipt = failed["exportReceipt"].clone();

    // The export, then three attempts at the one webhook subscribed to
    // its failure (beside three at the enforcement's subscriber).
    let log = log_of(&client, &cloud, &key, &id, 3).await;
    let received = endpoint.wait_for(7, WITHIN).await;
    let path = |head: &str| head.split_whitespace().nth(1).unwrap().to_owned();
    let exports: Vec<&(String, Vec<u8>)> =
        received.iter().filter(|(head, _)| path(head) != "/hooks/enforce").collect();
    let paths: Vec<String> = exports.iter().map(|(head, _)| path(head)).collect();
    assert_eq!(paths, ["/dest", "/hooks/exports", "/hooks/exports", "/hooks/exports"]);
    let payload: Value = serde_json::from_slice(&exports[1].1).unwrap();
    assert_eq!(payload["type"], "export.failed");
    assert_eq!(payload["data"], receipt, "the export receipt as the caller got it");
    assert_signed(&exports[3].0, &exports[3].1);
    let attempts: Vec<(u64, &str, bool)> = log
        .iter()
        .map(|a| {
            (
                a["attempt"].as_u64().unwrap(),
                a["status"].as_str().unwrap(),
                a["nextAttemptAt"].is_null(),
            )
        })
        .collect();
    assert_eq!(
        attempts,
        [(3, "failed", true), (2, "failed", false), (1, "failed", false)],
        "the last attempt schedules no other"
    );
    assert_eq!(log[0]["subject"], receipt["id"]);

    // Another workspace sees none of it.
    let (status, ws) = cloud
        .call(&client, &key, Method::POST, "/api/workspaces", Some(&json!({"name": "Plant 2"})))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{ws}");
    let other_key = ws["apiKey"].as_str().unwrap();
    let (_, theirs) = cloud.call(&client, other_key, Method::GET, "/api/webhooks", None).await;
    assert_eq!(theirs["webhooks"], json!([]));
    let mine = format!("/api/webhooks/{id}");
    for (method, path) in [(Method::GET, format!("{mine}/deliveries")), (Method::DELETE, mine)] {
        let (status, answer) = cloud.call(&client, other_key, method, &path, None).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}: {answer}");
    }
}

async fn anomalies_are_delivered_once_each(backend: Backend) {
    let endpoint = https_endpoint::start(vec![200]).await;
    let watch = [("OPGRAPH_WEBHOOK_ANOMALY_INTERVAL", "100ms".to_owned())];
    let cloud = start_with(backend, &endpoint, &watch).await;
    let (client, key) = (client(), cloud.key.clone());
    let body = json!({"url": endpoint.url, "events": ["anomaly.detected"], "secret": SECRET});
    let (status, created) = create(&client, &cloud, &key, &body).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    // Ten of one event in an hour after a silent week: a spike.
    let burst = |event: &str| {
        let batch: Vec<Value> =
            (0..10).map(|i| json!({"event": event, "object": format!("sscc:{i}")})).collect();
        json!({ "batch": batch })
    };
    let ingest = burst("pallet.scanned");
    let (status, _) = cloud.call(&client, &key, Method::POST, "/api/ingest", Some(&ingest)).await;
    assert!(status.is_success());
    let received = endpoint.wait_for(1, WITHIN).await;
    let payload: Value = serde_json::from_slice(&received[0].1).unwrap();
    assert_signed(&received[0].0, &received[0].1);
    assert_eq!(payload["type"], "anomaly.detected", "{payload}");
    let anomaly = &payload["data"];
    assert_eq!(anomaly["eventName"], "pallet.scanned");
    assert_eq!(anomaly["direction"], "spike");
    assert_eq!(anomaly["observed"], 10);
    let subject = format!("anomaly:pallet.scanned:{}:spike", anomaly["hour"]);
    assert_eq!(payload["subject"], subject.as_str());
    // Other spikes are delivered in their turn, and the first, found
    // again at every pass meanwhile, is not delivered again.
    for (n, event) in [(2, "door.opened"), (3, "gate.closed")] {
        let ingest = burst(event);
        let (status, _) =
            cloud.call(&client, &key, Method::POST, "/api/ingest", Some(&ingest)).await;
        assert!(status.is_success());
        endpoint.wait_for(n, WITHIN).await;
    }
    let names: Vec<Value> = endpoint
        .received
        .lock()
        .unwrap()
        .iter()
        .map(|(_, body)| {
            serde_json::from_slice::<Value>(body).unwrap()["data"]["eventName"].clone()
        })
        .collect();
    assert_eq!(names[..3], [json!("pallet.scanned"), json!("door.opened"), json!("gate.closed")]);
}

async fn a_delivery_left_by_a_killed_cloud_is_resumed(backend: Backend) {
    let endpoint = https_endpoint::start(vec![503, 200]).await;
    // A second a retry: time enough to kill the cloud in between. On
    // ClickHouse the killed process holds the delivery a lease past that.
    let slow = [
        ("OPGRAPH_WEBHOOK_RETRY_BASE", "1s".to_owned()),
        ("OPGRAPH_WEBHOOK_LEASE", "6s".to_owned()),
    ];
    let cloud = start_with(backend, &endpoint, &slow).await;
    let (client, key) = (client(), cloud.key.clone());
    let (id, decided) = subscribe_and_enforce(&client, &cloud, &key, &endpoint).await;
    let first = endpoint.wait_for(1, WITHIN).await;
    // Killed between the failed attempt and its retry.
    let cloud = cloud.kill().await.unwrap().start().await.unwrap();
    let received = endpoint.wait_for(2, WITHIN).await;
    let (head, body) = &received[1];
    let delivery = header(&first[0].0, "x-opgraph-delivery").unwrap();
    assert_eq!(header(head, "x-opgraph-delivery"), Some(delivery), "the same delivery");
    assert_eq!(body, &first[0].1, "the same bytes");
    assert_signed(head, body);
    // The killed cloud may not have logged its attempt; the resumed one
    // logs the success.
    let path = format!("/api/webhooks/{id}/deliveries");
    let done = eventually("the success logged", WITHIN, || async {
        let (_, log) = cloud.call(&client, &key, Method::GET, &path, None).await;
        let newest = log["deliveries"].get(0)?.clone();
        (newest["status"] == "succeeded").then_some(newest)
    })
    .await;
    assert_eq!(done["deliveryId"], delivery);
    assert_eq!(done["subject"], decided["receiptId"]);
}

/// What `/metrics` counts for `outcome` of webhook deliveries.
async fn deliveries_counted(client: &Client, cloud: &Cloud, outcome: &str) -> u64 {
    let response = client.get(cloud.at("/metrics")).bearer_auth(TEST_BOOTSTRAP_KEY).send().await;
    let text = response.unwrap().text().await.unwrap();
    let series = format!("opgraph_webhook_deliveries_total{{outcome=\"{outcome}\"}}");
    series_value(&text, &series).map_or(0, |n| n as u64)
}

/// Two clouds on one ClickHouse: the one that did not start a delivery
/// leaves it to the one that holds it, and takes it over once that one
/// died and its lease ran out, with the same delivery id and bytes.
#[tokio::test]
async fn clouds_sharing_clickhouse_send_each_delivery_from_one_of_them() {
    // Each enforcement: a failed first attempt, then a retry that succeeds.
    let endpoint = https_endpoint::start(vec![503, 200, 503, 200]).await;
    let lease = [
        ("OPGRAPH_WEBHOOK_RETRY_BASE", "5s".to_owned()),
        ("OPGRAPH_WEBHOOK_LEASE", "6s".to_owned()),
    ];
    let a = start_with(Backend::ClickHouse, &endpoint, &lease).await;
    let (client, key) = (client(), a.key.clone());
    let (id, _) = subscribe_and_enforce(&client, &a, &key, &endpoint).await;
    endpoint.wait_for(1, WITHIN).await;
    // B starts while A waits to retry; its first pass finds A's delivery.
    let b = a.store().start_beside(&lease).await.unwrap();
    eventually("B sees the delivery held by A", WITHIN, || async {
        (deliveries_counted(&client, &b, "held_elsewhere").await >= 1).then_some(())
    })
    .await;
    let log = log_of(&client, &a, &key, &id, 2).await;
    assert_eq!(log[0]["status"], "succeeded", "{log:?}");
    assert_eq!(endpoint.received.lock().unwrap().len(), 2, "sent once per attempt, by A alone");
    assert_eq!(deliveries_counted(&client, &b, "resumed").await, 0);

    // A fails a first attempt, then dies before its retry: B carries on.
    let (status, _) =
        a.call(&client, &key, Method::POST, "/api/governance/enforce", Some(&enforcement())).await;
    assert_eq!(status, StatusCode::OK);
    let third = endpoint.wait_for(3, WITHIN).await.remove(2);
    // Killed once the failed attempt is saved (a kill before that repeats
    // the attempt's number, as a restart would).
    let delivery = header(&third.0, "x-opgraph-delivery").unwrap();
    let saved = format!(
        "SELECT argMax(body, version) FROM webhook_pending WHERE delivery_id = '{delivery}'"
    );
    eventually("the failed attempt saved", WITHIN, || async {
        let body = a.store().clickhouse_sql(&saved).await.unwrap();
        body.contains("\"attempts\":1").then_some(())
    })
    .await;
    let store = a.kill().await.unwrap();
    let fourth = endpoint.wait_for(4, WITHIN).await.remove(3);
    assert_eq!(header(&fourth.0, "x-opgraph-delivery"), Some(delivery), "the same delivery");
    assert_eq!(header(&fourth.0, "x-opgraph-attempt"), Some("2"));
    assert_eq!(fourth.1, third.1, "the same bytes");
    assert_signed(&fourth.0, &fourth.1);
    assert_eq!(deliveries_counted(&client, &b, "resumed").await, 1);
    let log = log_of(&client, &b, &key, &id, 4).await;
    assert_eq!(
        (log[0]["status"].as_str(), log[0]["deliveryId"].as_str()),
        (Some("succeeded"), Some(delivery))
    );
    drop(b);
    drop(store);
}

/// The delivery log keeps attempts for `webhooks.log_retention` only.
#[tokio::test]
async fn the_delivery_log_forgets_attempts_past_its_retention() {
    let endpoint = https_endpoint::start(vec![500]).await;
    let short = [
        ("OPGRAPH_WEBHOOK_MAX_ATTEMPTS", "1".to_owned()),
        ("OPGRAPH_WEBHOOK_LOG_RETENTION", "2s".to_owned()),
    ];
    let cloud = start_with(Backend::Embedded, &endpoint, &short).await;
    let (client, key) = (client(), cloud.key.clone());
    let (id, _) = subscribe_and_enforce(&client, &cloud, &key, &endpoint).await;
    let logged = log_of(&client, &cloud, &key, &id, 1).await;
    assert_eq!(logged[0]["status"], "failed");
    let path = format!("/api/webhooks/{id}/deliveries");
    eventually("the attempt pruned", WITHIN, || async {
        let (_, log) = cloud.call(&client, &key, Method::GET, &path, None).await;
        log["deliveries"].as_array().is_some_and(Vec::is_empty).then_some(())
    })
    .await;
    // The webhook itself stays.
    let (_, listed) = cloud.call(&client, &key, Method::GET, "/api/webhooks", None).await;
    assert_eq!(listed["webhooks"][0]["id"], id.as_str());
}

async fn bad_webhooks_are_refused(backend: Backend) {
    let endpoint = https_endpoint::start(vec![200]).await;
    let cloud = start(backend, &endpoint).await;
    let (client, key) = (client(), cloud.key.clone());
    let url = endpoint.url.clone();
    for (body, field) in [
        (
            json!({"url": "http://hooks.example/in", "events": ["export.failed"], "secret": SECRET}),
            "url",
        ),
        (json!({"url": "not a url", "events": ["export.failed"], "secret": SECRET}), "url"),
        (json!({"url": url, "events": [], "secret": SECRET}), "events"),
        (json!({"url": url, "events": ["order.created"], "secret": SECRET}), "events[0]"),
        (
            json!({"url": url, "events": ["export.failed", "anomaly.guessed"], "secret": SECRET}),
            "events[1]",
        ),
        (json!({"url": url, "events": ["export.failed"], "secret": "short"}), "secret"),
        (json!({"url": url, "events": ["export.failed"]}), ""),
        (json!({"url": url, "events": ["export.failed"], "secret": SECRET, "extra": 1}), ""),
        (json!({"url": url, "events": "export.failed", "secret": SECRET}), "events"),
        (json!([1, 2]), ""),
    ] {
        let (status, answer) = create(&client, &cloud, &key, &body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {answer}");
        assert_eq!(answer["error"]["code"], "validation_failed", "{answer}");
        if !field.is_empty() {
            assert_eq!(answer["error"]["field"], field, "{body}: {answer}");
        }
    }
    let (status, answer) =
        cloud.call(&client, &key, Method::GET, "/api/webhooks?limit=many", None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    let (status, _) =
        cloud.call(&client, &key, Method::GET, "/api/webhooks/whk_none/deliveries", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    // Managing webhooks takes the `admin` scope.
    let (status, created) = cloud
        .call(
            &client,
            &key,
            Method::POST,
            "/api/keys",
            Some(&json!({"name": "r", "scopes": ["read", "govern"]})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let reader = created["apiKey"].as_str().unwrap();
    let ok = json!({"url": url, "events": ["enforcement.decided"], "secret": SECRET});
    let (status, _) = create(&client, &cloud, reader, &ok).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, _) = cloud.call(&client, reader, Method::GET, "/api/webhooks", None).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (_, listed) = cloud.call(&client, &key, Method::GET, "/api/webhooks", None).await;
    assert_eq!(listed["webhooks"], json!([]), "a refused webhook was stored");

    // Nothing was subscribed, so an enforcement sends nothing; a webhook
    // made now gets the next one only.
    let enforce = enforcement();
    let (status, first) =
        cloud.call(&client, reader, Method::POST, "/api/governance/enforce", Some(&enforce)).await;
    assert_eq!(status, StatusCode::OK, "{first}");
    let (status, _) = create(&client, &cloud, &key, &ok).await;
    assert_eq!(status, StatusCode::CREATED);
    let (_, second) =
        cloud.call(&client, reader, Method::POST, "/api/governance/enforce", Some(&enforce)).await;
    let received = endpoint.wait_for(1, WITHIN).await;
    let payload: Value = serde_json::from_slice(&received[0].1).unwrap();
    assert_eq!(payload["data"]["id"], second["receiptId"], "{payload}");
}

both_backends!(
    enforcement_is_delivered_signed_and_retried,
    export_failures_reach_subscribers_until_attempts_run_out,
    anomalies_are_delivered_once_each,
    a_delivery_left_by_a_killed_cloud_is_resumed,
    bad_webhooks_are_refused,
);
