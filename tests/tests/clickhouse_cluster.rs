//! The cloud on a real ClickHouse cluster (`OPGRAPH_CLICKHOUSE_CLUSTER`):
//! 2 shards × 2 replicas and a ZooKeeper, all private on 127.0.0.1 (the
//! layout of `deploy/clickhouse/cluster/`). Events arrive over HTTP and as a
//! gateway batch delivered three times; each node's local tables show the
//! rows spread over both shards and on both replicas of each, and the API's
//! lists and counts are exact, with no duplicate. A replica going away
//! leaves reads exact and makes ingest wait (503) until it is back.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose

use std::collections::HashSet;

use opgraph_proto::{Event, pb};
use opgraph_tests::Cloud;
use opgraph_tests::clickhouse::cluster::{CLUSTER, Cluster};
use reqwest::StatusCode;
use serde_json::{Value, json};
use tonic::transport::{Certificate, Channel, ClientTlsConfig};

const DATABASE: &str = "opgraph_cluster";
/// Events sent over HTTP, in two requests.
const HTTP_EVENTS: u64 = 200;
/// Events of a gateway batch.
const GATEWAY_EVENTS: u64 = 50;

/// One cluster at a time: two are ten processes on two cores.
static ONE_CLUSTER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn start() -> (Cluster, Cloud) {
    let cluster = Cluster::start(2, 2).await.expect("a private 2×2 ClickHouse cluster");
    let cloud = Cloud::start(&[
        ("OPGRAPH_STORE", "clickhouse".to_owned()),
        ("OPGRAPH_CLICKHOUSE_URL", cluster.entry().url()),
        ("OPGRAPH_CLICKHOUSE_DATABASE", DATABASE.to_owned()),
        ("OPGRAPH_CLICKHOUSE_CLUSTER", CLUSTER.to_owned()),
    ])
    .await;
    match cloud {
        Ok(cloud) => (cluster, cloud),
        Err(e) => {
            let logs: Vec<String> = cluster.nodes.iter().flatten().map(|n| n.log_tail()).collect();
            panic!("cloud on the cluster: {e}\nnode logs:\n{}", logs.join("\n---\n"))
        }
    }
}

async fn post(cloud: &Cloud, path: &str, body: &Value) -> (StatusCode, Value) {
    let response =
        cloud.http().post(cloud.at(path)).bearer_auth(&cloud.key).json(body).send().await.unwrap();
    let status = response.status();
    (status, response.json().await.unwrap_or(Value::Null))
}

async fn get(cloud: &Cloud, path: &str) -> (StatusCode, Value) {
    let response = cloud.http().get(cloud.at(path)).bearer_auth(&cloud.key).send().await.unwrap();
    let status = response.status();
    (status, response.json().await.unwrap_or(Value::Null))
}

async fn grpc(cloud: &Cloud) -> pb::ingest_client::IngestClient<Channel> {
    let cert = std::fs::read(cloud.data_dir.join("receiver-cert.pem")).unwrap();
    let tls =
        ClientTlsConfig::new().ca_certificate(Certificate::from_pem(cert)).domain_name("localhost");
    let channel = Channel::from_shared(format!("https://{}", cloud.process.addrs["grpc"]))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect()
        .await
        .unwrap();
    pb::ingest_client::IngestClient::new(channel)
}

fn authed<T>(message: T, key: &str) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.metadata_mut().insert("authorization", format!("Bearer {key}").parse().unwrap());
    request
}

/// Opens a session for `gw-1` and sends `batch` on it, once per copy;
/// returns the session's epoch and the acks, or the status refusing the
/// session.
async fn try_deliver(
    cloud: &Cloud,
    batch: &pb::Batch,
    copies: usize,
) -> Result<(u64, Vec<pb::Ack>), tonic::Status> {
    let mut client = grpc(cloud).await;
    let hello = pb::HelloRequest {
        gateway_id: "gw-1".into(),
        software_version: "test".into(),
        buffer_id: "buf-1".into(),
    };
    let session = client.hello(authed(hello, &cloud.key)).await?.into_inner();
    let mut batch = batch.clone();
    batch.epoch = session.epoch;
    let stream = tokio_stream::iter(vec![batch; copies]);
    let mut acks = client.send(authed(stream, &cloud.key)).await.unwrap().into_inner();
    let mut out = Vec::new();
    while out.len() < copies {
        match acks.message().await.unwrap() {
            Some(ack) => out.push(ack),
            None => break,
        }
    }
    Ok((session.epoch, out))
}

async fn deliver(cloud: &Cloud, batch: &pb::Batch, copies: usize) -> (u64, Vec<pb::Ack>) {
    try_deliver(cloud, batch, copies).await.unwrap()
}

/// Whether `batch` was acknowledged whole.
async fn acked(cloud: &Cloud, batch: &pb::Batch) -> bool {
    match try_deliver(cloud, batch, 1).await {
        Ok((_, acks)) => {
            acks[0].status == pb::AckStatus::Ok as i32
                && acks[0].acked_sequence == batch.last_sequence
        }
        // The session's own row may be what cannot reach its quorum.
        Err(status) => {
            assert_eq!(status.code(), tonic::Code::Unavailable, "{status}");
            false
        }
    }
}

/// One query on one node over its HTTP interface; the answer's text.
async fn query(node: &opgraph_tests::clickhouse::ClickHouse, sql: &str) -> String {
    let response = reqwest::Client::new().post(node.url()).body(sql.to_owned()).send().await;
    let response = response.unwrap();
    let ok = response.status().is_success();
    let text = response.text().await.unwrap();
    assert!(ok, "{sql}: {text}");
    text.trim().to_owned()
}

/// `SELECT count() FROM <table>_local` on one node.
async fn local_count(node: &opgraph_tests::clickhouse::ClickHouse, table: &str) -> u64 {
    query(node, &format!("SELECT count() FROM {DATABASE}.{table}_local")).await.parse().unwrap()
}

#[tokio::test]
async fn events_spread_over_shards_and_replicas_and_answers_stay_exact() {
    let _one = ONE_CLUSTER.lock().await;
    let (cluster, cloud) = start().await;
    let now = opgraph_tests_now_ms();
    // An idempotency key long expired, on one shard: the first keyed
    // request below has the cloud delete it on every shard.
    let expired = format!(
        "INSERT INTO {DATABASE}.idempotency_keys_local (workspace_id, key, response, created_at)
         VALUES ('ws_expired', 'expired', '[]', 1)"
    );
    query(&cluster.nodes[0][0], &expired).await;

    // Over HTTP: two requests, one of them sent twice with its
    // Idempotency-Key, and a client retry by messageId.
    for part in 0..2 {
        let batch: Vec<Value> = (0..HTTP_EVENTS / 2)
            .map(|i| {
                let n = part * HTTP_EVENTS / 2 + i;
                json!({"event": if n.is_multiple_of(4) { "order.created" } else { "page.view" },
                    "timestamp": now - 1000 * i64::try_from(n).unwrap(),
                    "actor": format!("user-{}", n % 10),
                    "businessId": if n.is_multiple_of(2) { "north" } else { "south" },
                    "messageId": format!("m-{n}"),
                    "outcome": {"revenue": 1.5}})
            })
            .collect();
        for _ in 0..2 {
            let response = cloud
                .http()
                .post(cloud.at("/api/ingest"))
                .bearer_auth(&cloud.key)
                .header("Idempotency-Key", format!("part-{part}"))
                .json(&json!({"batch": batch}))
                .send()
                .await
                .unwrap();
            assert_eq!(response.status(), StatusCode::ACCEPTED);
        }
    }
    let retry = json!({"event": "page.view", "timestamp": now - 1000, "messageId": "m-1"});
    assert_eq!(post(&cloud, "/api/ingest", &retry).await.0, StatusCode::ACCEPTED);

    // A gateway batch, delivered three times on one session and once more
    // on a new session (the gateway reconnected before seeing the ack).
    let batch = pb::Batch {
        gateway_id: "gw-1".into(),
        epoch: 0,
        first_sequence: 1,
        last_sequence: GATEWAY_EVENTS,
        events: (1..=GATEWAY_EVENTS)
            .map(|seq| {
                let mut e = Event::named("tote.moved").to_pb(format!("evt_gw{seq:020}"), seq);
                e.received_at_ms = Some(now);
                e
            })
            .collect(),
    };
    for (copies, expected_epoch) in [(3, 1), (1, 2)] {
        let (epoch, acks) = deliver(&cloud, &batch, copies).await;
        assert_eq!(epoch, expected_epoch);
        assert_eq!(acks.len(), copies);
        for ack in acks {
            assert_eq!(ack.status, pb::AckStatus::Ok as i32, "{ack:?}");
            assert_eq!(ack.acked_sequence, GATEWAY_EVENTS);
        }
    }

    let total = HTTP_EVENTS + GATEWAY_EVENTS;
    // Every shard holds some events, together all of them once; the second
    // replica of each shard has its shard's rows as soon as the inserts
    // were answered (quorum).
    let mut stored = 0;
    for shard in &cluster.nodes {
        let first = local_count(&shard[0], "events").await;
        assert!(first > 0 && first < total, "one shard holds {first} of {total}");
        assert_eq!(local_count(&shard[1], "events").await, first, "replicas differ");
        stored += first;
    }
    assert_eq!(stored, total);

    // The API reads through the Distributed tables: exact, no duplicate.
    let (status, list) = get(&cloud, "/api/events?limit=1000").await;
    assert_eq!(status, StatusCode::OK, "{list}");
    let ids: HashSet<&str> =
        list["events"].as_array().unwrap().iter().map(|e| e["id"].as_str().unwrap()).collect();
    assert_eq!(list["events"].as_array().unwrap().len(), usize::try_from(total).unwrap());
    assert_eq!(ids.len(), usize::try_from(total).unwrap());
    let (_, north) = get(&cloud, "/api/events?limit=1000&businessId=north").await;
    assert_eq!(north["events"].as_array().unwrap().len(), 100);

    let (status, metrics) =
        post(&cloud, "/api/metrics/query", &json!({"from": now - 3_600_000, "to": now + 1})).await;
    assert_eq!(status, StatusCode::OK, "{metrics}");
    assert_eq!(metrics["totalEvents"], total, "{metrics}");
    let by_name = |name: &str| {
        metrics["metrics"].as_array().unwrap().iter().find(|m| m["eventName"] == name).cloned()
    };
    let orders = by_name("order.created").unwrap();
    assert_eq!(orders["count"], 50);
    assert_eq!(orders["uniqueActors"], 5, "user-0, -4, -8, -2, -6");
    assert_eq!(orders["revenue"], 75.0);
    assert_eq!(by_name("page.view").unwrap()["count"], 150);
    assert_eq!(by_name("tote.moved").unwrap()["count"], GATEWAY_EVENTS);
    assert_eq!(metrics["totalRevenue"], 300.0);

    // The expired key goes (a mutation the server applies in the
    // background, so its rows are the only sign), the two live ones stay.
    let keys = format!(
        "SELECT groupArray(key) FROM (SELECT DISTINCT key FROM {DATABASE}.idempotency_keys ORDER BY key)"
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let mut stored = query(cluster.entry(), &keys).await;
    while stored.contains("expired") && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        stored = query(cluster.entry(), &keys).await;
    }
    assert_eq!(stored, "['part-0','part-1']");
}

#[tokio::test]
async fn a_lost_replica_keeps_reads_exact_and_holds_acks_until_it_returns() {
    let _one = ONE_CLUSTER.lock().await;
    let (mut cluster, cloud) = start().await;
    let now = opgraph_tests_now_ms();
    let event = json!({"event": "pallet.scanned"});
    for _ in 0..20 {
        assert_eq!(post(&cloud, "/api/ingest", &event).await.0, StatusCode::ACCEPTED);
    }
    // The replica that serves shard 2 first (configuration order) goes.
    cluster.nodes[1][0].kill();
    let (status, list) = get(&cloud, "/api/events?limit=1000").await;
    assert_eq!(status, StatusCode::OK, "{list}");
    assert_eq!(list["events"].as_array().unwrap().len(), 20, "the other replica has them all");

    // Once ZooKeeper has ended the lost replica's session (10 s), its peer
    // sees one active replica.
    let active = format!(
        "SELECT active_replicas FROM system.replicas
         WHERE database = '{DATABASE}' AND table = 'events_local'"
    );
    let mut seen_lost = false;
    for _ in 0..300 {
        if query(&cluster.nodes[1][1], &active).await == "1" {
            seen_lost = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(seen_lost, "ZooKeeper ends the killed replica's session");

    // Shard 2's part of a batch cannot reach its quorum: the batch is not
    // acknowledged, so nothing acknowledged lives on one disk only. Shard
    // 1's part may be stored already.
    let batch = pb::Batch {
        gateway_id: "gw-1".into(),
        epoch: 0,
        first_sequence: 1,
        last_sequence: GATEWAY_EVENTS,
        events: (1..=GATEWAY_EVENTS)
            .map(|seq| {
                let mut e = Event::named("tote.moved").to_pb(format!("evt_gw{seq:020}"), seq);
                e.received_at_ms = Some(now);
                e
            })
            .collect(),
    };
    assert!(!acked(&cloud, &batch).await, "acknowledged without its quorum");

    cluster.nodes[1][0].restart().await.unwrap();
    // The restarted replica rejoins asynchronously (ZooKeeper session,
    // replication queue); the gateway redelivers as it would on RetryLater.
    let mut stored = false;
    for _ in 0..100 {
        if acked(&cloud, &batch).await {
            stored = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    assert!(stored, "the batch is acknowledged once the replica is back");
    let (_, list) = get(&cloud, "/api/events?limit=1000").await;
    let events = list["events"].as_array().unwrap();
    let ids: HashSet<&str> = events.iter().map(|e| e["id"].as_str().unwrap()).collect();
    let expected = 20 + usize::try_from(GATEWAY_EVENTS).unwrap();
    assert_eq!((events.len(), ids.len()), (expected, expected), "stored once each");
    for shard in &cluster.nodes {
        assert_eq!(local_count(&shard[0], "events").await, local_count(&shard[1], "events").await);
    }
}

fn opgraph_tests_now_ms() -> i64 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
    i64::try_from(since.as_millis()).unwrap()
}
