//! The cloud binary on the ClickHouse store (`OPGRAPH_STORE=clickhouse`)
//! against a private clickhouse-server: ingest and listing, the calls that
//! once answered 501, and ClickHouse going away and coming back (503 with
//! Retry-After, health, automatic recovery).
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose

use opgraph_tests::Cloud;
use opgraph_tests::clickhouse::ClickHouse;
use reqwest::StatusCode;
use serde_json::{Value, json};

async fn start() -> (ClickHouse, Cloud) {
    let server = ClickHouse::start().await.expect("a private ClickHouse server");
    let cloud = Cloud::start(&[
        ("OPGRAPH_STORE", "clickhouse".to_owned()),
        ("OPGRAPH_CLICKHOUSE_URL", server.url()),
        ("OPGRAPH_CLICKHOUSE_DATABASE", "opgraph_e2e".to_owned()),
    ])
    .await
    .expect("cloud on ClickHouse");
    (server, cloud)
}

async fn ingest(cloud: &Cloud, body: &Value) -> reqwest::Response {
    cloud
        .http()
        .post(cloud.at("/api/ingest"))
        .bearer_auth(&cloud.key)
        .json(body)
        .send()
        .await
        .unwrap()
}

async fn get(cloud: &Cloud, path: &str) -> (StatusCode, Value) {
    let response = cloud.http().get(cloud.at(path)).bearer_auth(&cloud.key).send().await.unwrap();
    let status = response.status();
    (status, response.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn ingest_and_list_on_clickhouse() {
    let (_server, cloud) = start().await;
    let body = json!({"batch": [
        {"event": "pallet.scanned", "traceId": "tr-1", "timestamp": 1_767_225_600_000_i64,
         "properties": {"dock": 3}},
        {"event": "pallet.loaded", "traceId": "tr-1", "timestamp": 1_767_225_601_000_i64,
         "businessId": "north"},
        {"event": "pallet.scanned", "timestamp": 1_767_225_602_000_i64, "messageId": "m-1"},
    ]});
    let response = ingest(&cloud, &body).await;
    assert_eq!(response.status(), StatusCode::ACCEPTED);
    let answer: Value = response.json().await.unwrap();
    assert_eq!(answer["accepted"], 3);

    let (status, list) = get(&cloud, "/api/events?traceId=tr-1").await;
    assert_eq!(status, StatusCode::OK, "{list}");
    let names: Vec<&str> =
        list["events"].as_array().unwrap().iter().map(|e| e["event"].as_str().unwrap()).collect();
    assert_eq!(names, ["pallet.loaded", "pallet.scanned"]);
    assert_eq!(list["events"][1]["properties"]["dock"], 3);
    let (_, north) = get(&cloud, "/api/events?businessId=north").await;
    assert_eq!(north["events"].as_array().unwrap().len(), 1);

    // A client retry with the same messageId stores nothing new.
    let retry = json!({"event": "pallet.scanned", "timestamp": 1_767_225_602_000_i64,
        "messageId": "m-1"});
    let answer: Value = ingest(&cloud, &retry).await.json().await.unwrap();
    assert_eq!(answer["ids"][0], list_id_of_message(&cloud).await);
    let (_, all) = get(&cloud, "/api/events?limit=100").await;
    assert_eq!(all["events"].as_array().unwrap().len(), 3);
}

async fn list_id_of_message(cloud: &Cloud) -> Value {
    let (_, all) = get(cloud, "/api/events?limit=100").await;
    all["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["messageId"] == "m-1")
        .map(|e| e["id"].clone())
        .unwrap()
}

/// The calls that once answered 501 on ClickHouse answer now; their own
/// suites (governance, trackables, connectors) run on both backends.
#[tokio::test]
async fn calls_once_pending_answer_on_clickhouse() {
    let (_server, cloud) = start().await;
    for path in ["/api/governance/decision-objects", "/api/usage", "/api/trackables"] {
        let (status, body) = get(&cloud, path).await;
        assert_eq!(status, StatusCode::OK, "{path}: {body}");
    }
}

#[tokio::test]
async fn clickhouse_down_is_503_with_retry_after_and_recovers_by_itself() {
    let (mut server, cloud) = start().await;
    let event = json!({"event": "pallet.scanned"});
    assert_eq!(ingest(&cloud, &event).await.status(), StatusCode::ACCEPTED);

    server.kill();
    let response = ingest(&cloud, &event).await;
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(response.headers().contains_key("retry-after"));
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["code"], "unavailable");
    let health = cloud.http().get(cloud.at("/api/health")).send().await.unwrap();
    assert_eq!(health.status(), StatusCode::SERVICE_UNAVAILABLE);
    let report: Value = health.json().await.unwrap();
    assert_eq!(report["checks"]["store"]["backend"], "clickhouse");
    assert_eq!(report["checks"]["store"]["reachable"], false);

    server.restart().await.unwrap();
    assert_eq!(ingest(&cloud, &event).await.status(), StatusCode::ACCEPTED);
    let health = cloud.http().get(cloud.at("/api/health")).send().await.unwrap();
    assert_eq!(health.status(), StatusCode::OK);
    let (_, all) = get(&cloud, "/api/events?limit=100").await;
    assert_eq!(all["events"].as_array().unwrap().len(), 2, "the refused event was not stored");
}

/// ClickHouse behind TLS with a private CA: the cloud trusts that CA from
/// `OPGRAPH_CLICKHOUSE_CA_FILE` and stores and lists over HTTPS; with the
/// platform's roots instead, the store does not open and says that the
/// certificate is why.
#[tokio::test]
async fn clickhouse_over_https_with_a_private_ca() {
    use opgraph_cloud::store::clickhouse::{ClickHouseConfig, ClickHouseStore};

    let server = ClickHouse::start_tls().await.expect("a private ClickHouse with HTTPS");
    let cloud = Cloud::start(&[
        ("OPGRAPH_STORE", "clickhouse".to_owned()),
        ("OPGRAPH_CLICKHOUSE_URL", server.https_url()),
        ("OPGRAPH_CLICKHOUSE_CA_FILE", server.ca_file().display().to_string()),
        ("OPGRAPH_CLICKHOUSE_DATABASE", "opgraph_tls".to_owned()),
    ])
    .await
    .expect("cloud on ClickHouse over HTTPS");
    let event = json!({"event": "pallet.scanned", "traceId": "tr-tls"});
    assert_eq!(ingest(&cloud, &event).await.status(), StatusCode::ACCEPTED);
    let (status, list) = get(&cloud, "/api/events?traceId=tr-tls").await;
    assert_eq!(status, StatusCode::OK, "{list}");
    assert_eq!(list["events"].as_array().unwrap().len(), 1, "{list}");

    let untrusted = ClickHouseConfig {
        url: server.https_url(),
        database: "opgraph_tls".into(),
        cluster: None,
        ca_file: None,
    };
    let err = ClickHouseStore::open(&untrusted).await.err().expect("an unverifiable server");
    let err = err.to_string();
    assert!(err.contains("store.clickhouse_url") && err.contains("certificate"), "{err}");
}
