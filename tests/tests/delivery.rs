//! Edge delivery end to end: real `opgraph-cloud` and `opgraph-gateway`
//! processes on loopback (and `opgraph-sim proxy` where the link must be
//! slow). Events go into the gateway's local ingest endpoint; the tests
//! judge only what the cloud's API then holds and what the gateway's
//! health says, over gRPC and over QUIC: every event exactly once, also
//! when the cloud starts late, when the gateway is killed mid-delivery, and
//! nothing at all with a wrong API key.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose

use std::path::{Path, PathBuf};

use opgraph_tests::edge::*;
use opgraph_tests::{Process, TEST_BOOTSTRAP_KEY, binary};
use reqwest::StatusCode;
use serde_json::{Value, json};

async fn delivers_exactly_once(transport: Transport) {
    let tmp = tempfile::tempdir().unwrap();
    let cloud = CloudProc::start(&tmp.path().join("cloud"), "127.0.0.1:0", "127.0.0.1:0").await;
    let gw_dir = tmp.path().join("gateway");
    let config = gateway_config(&gw_dir, transport, &cloud.receiver(transport), &cloud.cert(), "");
    let gateway = Gateway::start(&config, TEST_BOOTSTRAP_KEY).await;

    let ids = gateway.post("pallet.scanned", 750).await;
    assert_eq!(ids.len(), 750);
    wait_delivered(&cloud, "pallet.scanned", &ids).await;
    let health = wait_drained(&gateway).await;
    assert_eq!(health["status"], "ok", "{health}");
    assert_eq!(health["uplink"]["connected"], true, "{health}");
    assert_eq!(health["uplink"]["last_acked_sequence"], 750, "{health}");
    assert_eq!(health["buffer"]["appended_total"], 750, "{health}");
    let metrics = gateway.metrics().await;
    assert!(metrics.contains("opgraph_gateway_events_accepted_total 750"), "{metrics}");
    assert!(metrics.contains("opgraph_gateway_last_acked_sequence 750"), "{metrics}");
    assert!(metrics.contains("opgraph_gateway_uplink_connected 1"), "{metrics}");

    // Invalid input is refused like the cloud refuses it, nothing appended.
    let response = reqwest::Client::new()
        .post(format!("{}/api/ingest", gateway.url))
        .json(&json!({"batch": [{"event": "ok"}, {"event": ""}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["field"], "batch[1].event", "{body}");
    assert_eq!(gateway.health().await["buffer"]["appended_total"], 750);

    let status = gateway.process.terminate().await.unwrap();
    assert!(status.success(), "gateway exit status {status}");
}

#[tokio::test]
async fn grpc_delivers_every_event_exactly_once() {
    delivers_exactly_once(Transport::Grpc).await;
}

#[tokio::test]
async fn quic_delivers_every_event_exactly_once() {
    delivers_exactly_once(Transport::Quic).await;
}

#[tokio::test]
async fn a_wrong_api_key_stores_nothing_and_health_says_why() {
    let tmp = tempfile::tempdir().unwrap();
    let cloud = CloudProc::start(&tmp.path().join("cloud"), "127.0.0.1:0", "127.0.0.1:0").await;
    for transport in [Transport::Grpc, Transport::Quic] {
        let gw_dir = tmp.path().join(transport.name());
        let config =
            gateway_config(&gw_dir, transport, &cloud.receiver(transport), &cloud.cert(), "");
        let gateway = Gateway::start(&config, "og_wrongwrongwrong0123456789abcdef").await;
        let ids = gateway.post("door.opened", 5).await;
        assert_eq!(ids.len(), 5);
        let health = eventually("the uplink error in health", DELIVERY_TIMEOUT, || async {
            let health = gateway.health().await;
            let error = health["uplink"]["last_error"].as_str().unwrap_or_default().to_owned();
            error.contains("unauthorized").then_some(health)
        })
        .await;
        assert_eq!(health["degraded"], true, "{health}");
        assert_eq!(health["status"], "degraded", "{health}");
        assert_eq!(health["uplink"]["connected"], false, "{health}");
        assert_eq!(health["buffer"]["pending_records"], 5, "{health}");
        assert!(cloud.ids("door.opened").await.is_empty(), "{transport:?}: nothing stored");
        let status = gateway.process.terminate().await.unwrap();
        assert!(status.success(), "gateway exit status {status}");
    }
}

#[tokio::test]
async fn events_buffered_while_the_cloud_is_down_are_delivered_once_it_starts() {
    let tmp = tempfile::tempdir().unwrap();
    let cloud_dir = tmp.path().join("cloud");
    // A first start makes the receiver certificate and picks the port.
    let cloud = CloudProc::start(&cloud_dir, "127.0.0.1:0", "off").await;
    let grpc = cloud.receiver(Transport::Grpc);
    let cert = cloud.cert();
    assert!(cloud.process.terminate().await.unwrap().success());

    let gw_dir = tmp.path().join("gateway");
    let config = gateway_config(&gw_dir, Transport::Grpc, &grpc, &cert, "");
    let gateway = Gateway::start(&config, TEST_BOOTSTRAP_KEY).await;
    let ids = gateway.post("truck.arrived", 300).await;
    let health = eventually("the cloud to be reported unreachable", DELIVERY_TIMEOUT, || async {
        let health = gateway.health().await;
        (health["degraded"] == true).then_some(health)
    })
    .await;
    assert_eq!(health["buffer"]["pending_records"], 300, "{health}");

    let cloud = CloudProc::start(&cloud_dir, &grpc, "off").await;
    wait_delivered(&cloud, "truck.arrived", &ids).await;
    let health = wait_drained(&gateway).await;
    assert_eq!(health["status"], "ok", "{health}");
    let metrics = gateway.metrics().await;
    assert!(
        metrics.contains("opgraph_gateway_uplink_errors_total{reason=\"connect\"}"),
        "{metrics}"
    );
}

/// A gateway whose buffer directory is put back to an older copy (a VM or
/// disk snapshot restored) numbers its new events into the range the
/// cloud already acknowledged. They are delivered all the same, once each:
/// the gateway sees the cloud's ack run past anything it holds or sent,
/// renews its buffer id and sends under that.
#[tokio::test]
async fn new_events_of_a_buffer_restored_from_an_older_copy_are_delivered() {
    let tmp = tempfile::tempdir().unwrap();
    let (cloud, config) = grpc_site(tmp.path(), "").await;
    let buffer = tmp.path().join("gateway").join("buffer");
    let snapshot = tmp.path().join("snapshot");
    // The copy: the buffer as a first start leaves it, with its id.
    let gateway = Gateway::start(&config, TEST_BOOTSTRAP_KEY).await;
    assert!(gateway.process.terminate().await.unwrap().success());
    copy_flat_dir(&buffer, &snapshot);

    let gateway = Gateway::start(&config, TEST_BOOTSTRAP_KEY).await;
    let mut ids = gateway.post("bin.weighed", 120).await;
    wait_delivered(&cloud, "bin.weighed", &ids).await;
    wait_drained(&gateway).await;
    assert!(gateway.process.terminate().await.unwrap().success());

    std::fs::remove_dir_all(&buffer).unwrap();
    copy_flat_dir(&snapshot, &buffer);
    let gateway = Gateway::start(&config, TEST_BOOTSTRAP_KEY).await;
    // Numbered 1..=80 again: inside the cloud's ack of 120.
    ids.extend(gateway.post("bin.weighed", 80).await);
    ids.sort();
    wait_delivered(&cloud, "bin.weighed", &ids).await;
    let health = wait_drained(&gateway).await;
    assert_eq!(health["status"], "ok", "{health}");
    let metrics = gateway.metrics().await;
    assert_eq!(
        series_value(
            &metrics,
            "opgraph_gateway_uplink_errors_total{reason=\"acked_beyond_buffer\"}"
        ),
        Some(1.0),
        "{metrics}"
    );
    assert!(gateway.process.terminate().await.unwrap().success());
}

/// Copies the files of `from` (no subfolders) into a new folder `to`.
fn copy_flat_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        assert!(entry.file_type().unwrap().is_file(), "{:?} is not a file", entry.path());
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
}

/// A workspace gets no more gateway events than its monthly event quota:
/// of a batch that would pass it, what fits is stored; the rest waits in
/// the gateway's buffer, health says why, and it is delivered once the
/// quota allows it (here: a cloud restarted with a larger one).
#[tokio::test]
async fn events_past_the_quota_wait_at_the_gateway_until_it_allows_them() {
    let tmp = tempfile::tempdir().unwrap();
    let cloud_dir = tmp.path().join("cloud");
    let quota = |n: &str| [("OPGRAPH_EVENTS_QUOTA", n.to_owned())];
    let cloud = CloudProc::start_with(&cloud_dir, "127.0.0.1:0", "off", &quota("100")).await;
    let (grpc, cert) = (cloud.receiver(Transport::Grpc), cloud.cert());
    let gw_dir = tmp.path().join("gateway");
    let config = gateway_config(&gw_dir, Transport::Grpc, &grpc, &cert, "");
    let gateway = Gateway::start(&config, TEST_BOOTSTRAP_KEY).await;
    let first = gateway.post("crate.weighed", 60).await;
    wait_delivered(&cloud, "crate.weighed", &first).await;

    // 40 are left: 40 of these are stored, 30 wait.
    let more = gateway.post("crate.labelled", 70).await;
    eventually("the rest held back for the quota", DELIVERY_TIMEOUT, || async {
        let health = gateway.health().await;
        let error = health["uplink"]["last_error"].as_str().unwrap_or_default().to_owned();
        (error.contains("quota") && health["buffer"]["pending_records"] == 30).then_some(())
    })
    .await;
    let stored = cloud.ids("crate.labelled").await;
    assert_eq!(stored.len(), 40, "exactly what the quota allows is stored");
    assert!(stored.iter().all(|id| more.contains(id)));
    let metrics = cloud.metrics().await;
    assert!(metrics.contains("reason=\"quota_exceeded\""), "{metrics}");

    assert!(cloud.process.terminate().await.unwrap().success());
    let cloud = CloudProc::start_with(&cloud_dir, &grpc, "off", &quota("1000")).await;
    wait_delivered(&cloud, "crate.labelled", &more).await;
    let health = wait_drained(&gateway).await;
    assert_eq!(health["buffer"]["pending_records"], 0, "{health}");
    assert_eq!(cloud.ids("crate.weighed").await, first, "nothing twice");
}

/// A producer that sends a request again with its `Idempotency-Key` (its
/// 202 lost, say), also after the gateway was killed and restarted, gets
/// the ids of its first try, and the cloud stores the events once.
#[tokio::test]
async fn a_keyed_request_sent_again_is_stored_once() {
    let tmp = tempfile::tempdir().unwrap();
    let (cloud, config) = grpc_site(tmp.path(), "").await;
    let client = reqwest::Client::new();
    let send = async |gateway: &Gateway, key: &str, picks: &[u64]| -> (StatusCode, Value) {
        let batch: Vec<Value> =
            picks.iter().map(|n| json!({"event": "tote.picked", "properties": {"n": n}})).collect();
        let response = client
            .post(format!("{}/ingest", gateway.url))
            .header("Idempotency-Key", key)
            .json(&json!({ "batch": batch }))
            .send()
            .await
            .unwrap();
        (response.status(), response.json().await.unwrap())
    };
    let gateway = Gateway::start(&config, TEST_BOOTSTRAP_KEY).await;
    let (status, first) = send(&gateway, "pick-7", &[1, 2]).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{first}");
    assert_eq!(send(&gateway, "pick-7", &[1, 2]).await, (status, first.clone()));
    gateway.process.kill9().await.unwrap();
    let gateway = Gateway::start(&config, TEST_BOOTSTRAP_KEY).await;
    assert_eq!(send(&gateway, "pick-7", &[1, 2]).await, (status, first.clone()));
    // Another body under the key is another request.
    let (_, other) = send(&gateway, "pick-7", &[3]).await;
    let mut expected: Vec<String> = [&first, &other]
        .iter()
        .flat_map(|a| a["ids"].as_array().unwrap().iter().map(|v| v.as_str().unwrap().to_owned()))
        .collect();
    expected.sort();
    assert_eq!(expected.len(), 3);
    wait_delivered(&cloud, "tote.picked", &expected).await;
    // Every copy shipped, and still one stored each.
    wait_drained(&gateway).await;
    assert_eq!(cloud.ids("tote.picked").await, expected);
    // A key that is no key is refused, naming the header.
    let (status, error) = send(&gateway, " ", &[4]).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{error}");
    assert_eq!(error["error"]["field"], "Idempotency-Key", "{error}");
    assert!(gateway.process.terminate().await.unwrap().success());
}

/// A gateway given ingest token digests takes events only with one of
/// those tokens, refusing the rest before their bodies count, while its
/// health stays open to probes.
#[tokio::test]
async fn ingest_tokens_keep_strangers_out() {
    let tmp = tempfile::tempdir().unwrap();
    let (cloud, config) = grpc_site(tmp.path(), "").await;
    let token = "line-7-scanner-secret";
    require_ingest_token(&config, token);
    let gateway = Gateway::start(&config, TEST_BOOTSTRAP_KEY).await;
    let client = reqwest::Client::new();
    let post = async |event: &str, authorization: Option<&str>| {
        let mut request = client
            .post(format!("{}/ingest", gateway.url))
            .json(&json!({ "event": event, "properties": {} }));
        if let Some(value) = authorization {
            request = request.header("Authorization", value);
        }
        let response = request.send().await.unwrap();
        let challenge = response.headers().get("www-authenticate").cloned();
        (response.status(), challenge, response.json::<Value>().await.unwrap())
    };
    let wrong = [None, Some("Bearer not-the-token"), Some(token), Some("Basic bGluZTpzZWNyZXQ=")];
    for authorization in wrong {
        let (status, challenge, body) = post("door.forced", authorization).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{authorization:?}: {body}");
        assert_eq!(challenge.unwrap(), "Bearer");
        assert_eq!(body["error"]["code"], "unauthorized", "{body}");
    }
    let (status, _, body) = post("door.opened", Some(&format!("bearer {token}"))).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let ids: Vec<String> = serde_json::from_value(body["ids"].clone()).unwrap();
    wait_delivered(&cloud, "door.opened", &ids).await;
    wait_drained(&gateway).await;
    assert!(cloud.ids("door.forced").await.is_empty(), "nothing refused was stored");
    assert_eq!(gateway.health().await["status"], "ok");
    let metrics = gateway.metrics().await;
    assert!(
        metrics.contains("opgraph_gateway_ingest_rejections_total{reason=\"unauthorized\"} 4"),
        "{metrics}"
    );
    assert!(gateway.process.terminate().await.unwrap().success());
}

/// Kills the gateway with SIGKILL while a slow link (the flaky-link proxy
/// adds latency) is half way through the backlog, restarts it on the same
/// buffer, and checks the cloud ends up with every event exactly once.
async fn killed_mid_delivery_resumes(transport: Transport) {
    let tmp = tempfile::tempdir().unwrap();
    let cloud = CloudProc::start(&tmp.path().join("cloud"), "127.0.0.1:0", "127.0.0.1:0").await;
    let protocol = match transport {
        Transport::Grpc => "tcp",
        Transport::Quic => "udp",
    };
    let upstream = cloud.receiver(transport);
    let proxy = Process::start(
        "opgraph-sim",
        &["proxy", "--protocol", protocol, "--upstream", &upstream, "--latency", "15ms"],
        &[],
        &["proxy"],
    )
    .await
    .unwrap();
    let gw_dir = tmp.path().join("gateway");
    let slow = "batch_max_events = 10\nbatch_linger = \"1ms\"\nmax_in_flight = 1\n";
    let config = gateway_config(&gw_dir, transport, &proxy.addrs["proxy"], &cloud.cert(), slow);
    let gateway = Gateway::start(&config, TEST_BOOTSTRAP_KEY).await;
    let ids = gateway.post("bin.emptied", 900).await;

    eventually("a first part to be delivered", DELIVERY_TIMEOUT, || async {
        (cloud.ids("bin.emptied").await.len() >= 100).then_some(())
    })
    .await;
    gateway.process.kill9().await.unwrap();
    let at_kill = cloud.ids("bin.emptied").await.len();
    assert!(at_kill < ids.len(), "{transport:?}: killed mid-delivery ({at_kill} delivered)");

    let gateway = Gateway::start(&config, TEST_BOOTSTRAP_KEY).await;
    wait_delivered(&cloud, "bin.emptied", &ids).await;
    let health = wait_drained(&gateway).await;
    assert_eq!(health["uplink"]["last_acked_sequence"], 900, "{health}");
    assert!(gateway.process.terminate().await.unwrap().success());
}

/// A cloud with only its QUIC receiver, behind `opgraph-sim proxy`
/// (UDP) with the `link` options.
async fn quic_cloud_behind_proxy(dir: &Path, link: &[&str]) -> (CloudProc, Process) {
    let cloud = CloudProc::start(&dir.join("cloud"), "off", "127.0.0.1:0").await;
    let upstream = cloud.receiver(Transport::Quic);
    let mut args = vec!["proxy", "--protocol", "udp", "--upstream", &upstream, "--seed", "7"];
    args.extend(link);
    let proxy = Process::start("opgraph-sim", &args, &[], &["proxy"]).await.unwrap();
    (cloud, proxy)
}

/// Through a link that drops 2 % of datagrams each way without queueing
/// (the proxy, 50 ms round trip), the QUIC uplink reports what it
/// measured, and its default congestion controller reads those losses as
/// noise while plain Cubic backs off for every one.
#[tokio::test]
async fn quic_reports_its_path_and_reads_random_loss_as_noise() {
    let tmp = tempfile::tempdir().unwrap();
    // 25 ms each way: the controller allows a quarter of the round trip
    // (12.5 ms) as queueing before it calls a loss congestion, which keeps
    // a loaded test machine's scheduling jitter from looking like a queue.
    let link = ["--loss", "0.02", "--latency", "25ms"];
    let (cloud, proxy) = quic_cloud_behind_proxy(tmp.path(), &link).await;
    for congestion in ["loss_tolerant", "cubic"] {
        let gw_dir = tmp.path().join(congestion);
        // Small batches, so that the run crosses some hundreds of packets.
        let extra = format!(
            "congestion = \"{congestion}\"\nbatch_max_events = 2\nbatch_linger = \"1ms\"\n"
        );
        let config =
            gateway_config(&gw_dir, Transport::Quic, &proxy.addrs["proxy"], &cloud.cert(), &extra);
        let gateway = Gateway::start(&config, TEST_BOOTSTRAP_KEY).await;
        let event = format!("crate.{congestion}");
        let ids = gateway.post(&event, 900).await;
        wait_delivered(&cloud, &event, &ids).await;
        wait_drained(&gateway).await;

        let metric = |name: &'static str| {
            let gateway = &gateway;
            async move { gateway.metric(&format!("opgraph_gateway_{name}")).await.unwrap() }
        };
        let sent = metric("uplink_sent_packets_total").await;
        let lost = metric("uplink_lost_packets_total").await;
        let events = metric("uplink_congestion_events_total").await;
        let noise = metric("uplink_noise_losses_total").await;
        let rtt = metric("uplink_rtt_seconds").await;
        assert!(sent >= 300.0, "{congestion}: {sent} packets sent");
        assert!(lost >= 1.0 && lost < sent / 10.0, "{congestion}: {lost} of {sent} lost");
        assert!(events >= 1.0, "{congestion}: {events} congestion events");
        assert!((0.049..1.0).contains(&rtt), "{congestion}: round trip {rtt} s over 2 x 25 ms");
        if congestion == "cubic" {
            assert_eq!(noise, 0.0, "plain Cubic reads every loss as congestion");
        } else {
            assert!(noise >= 1.0 && noise <= events, "{noise} of {events} read as noise");
        }
        assert!(gateway.process.terminate().await.unwrap().success());
    }
}

/// Behind a real bottleneck (the proxy caps the link at 64 KB/s and drops
/// what does not fit in a 16 KiB queue) the losses come with a grown round
/// trip, and the default controller backs off for them like Cubic: it
/// ignores random loss only, so it still shares a congested link.
#[tokio::test]
async fn behind_a_bottleneck_quic_still_backs_off_for_its_losses() {
    let tmp = tempfile::tempdir().unwrap();
    let link = ["--bandwidth", "64KB", "--queue", "16KiB", "--latency", "5ms"];
    let (cloud, proxy) = quic_cloud_behind_proxy(tmp.path(), &link).await;
    let gw_dir = tmp.path().join("gateway");
    // Enough to keep the link busy for seconds, all of it buffered before
    // the link carries any: posted while the uplink points at a socket
    // that never answers, then the gateway restarted towards the proxy.
    // Shipped while still being posted, the events went out as they came,
    // on a loaded machine in batches too small to fill the queue (0
    // packets lost in CI runs of 27 and 28 November).
    let silent = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let nowhere = silent.local_addr().unwrap().to_string();
    let config = gateway_config(&gw_dir, Transport::Quic, &nowhere, &cloud.cert(), "");
    let gateway = Gateway::start(&config, TEST_BOOTSTRAP_KEY).await;
    gateway.post("parcel.sorted", 80_000).await;
    gateway.process.kill9().await.unwrap();
    let config = gateway_config(&gw_dir, Transport::Quic, &proxy.addrs["proxy"], &cloud.cert(), "");
    let gateway = Gateway::start(&config, TEST_BOOTSTRAP_KEY).await;
    let health = wait_drained(&gateway).await;
    assert_eq!(health["uplink"]["last_acked_sequence"], 80_000, "{health}");

    let lost = gateway.metric("opgraph_gateway_uplink_lost_packets_total").await.unwrap();
    let events = gateway.metric("opgraph_gateway_uplink_congestion_events_total").await.unwrap();
    let noise = gateway.metric("opgraph_gateway_uplink_noise_losses_total").await.unwrap();
    assert!(lost >= 1.0, "the queue never overflowed: {lost} packets lost");
    assert!(noise < events, "{noise} of {events} congestion events read as noise");
    assert!(gateway.process.terminate().await.unwrap().success());
}

#[tokio::test]
async fn grpc_gateway_killed_mid_delivery_resumes_without_loss_or_duplicates() {
    killed_mid_delivery_resumes(Transport::Grpc).await;
}

#[tokio::test]
async fn quic_gateway_killed_mid_delivery_resumes_without_loss_or_duplicates() {
    killed_mid_delivery_resumes(Transport::Quic).await;
}

#[tokio::test]
async fn bad_config_exits_2_with_one_line() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("gateway.toml");
    std::fs::write(&path, "gateway_id = \"x\"\n[uplink]\nbatch_max_event = 5\n").unwrap();
    let output = tokio::process::Command::new(binary("opgraph-gateway").unwrap())
        .args(["--config", &path.display().to_string()])
        .output()
        .await
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("uplink.batch_max_event"), "{stderr}");
}

/// A test CA and a gateway client certificate it signed, as PEM files in
/// `dir`: (ca, cert, key).
fn client_pki(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    use rcgen::{
        BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose,
        IsCa, KeyPair,
    };
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(DnType::CommonName, "opgraph test gateway CA");
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    let mut params = CertificateParams::new(vec!["gw-e2e".to_owned()]).unwrap();
    params.distinguished_name.push(DnType::CommonName, "gw-e2e");
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, &ca).unwrap();
    let paths = (dir.join("client-ca.pem"), dir.join("client.pem"), dir.join("client-key.pem"));
    std::fs::write(&paths.0, ca.pem()).unwrap();
    std::fs::write(&paths.1, cert.pem()).unwrap();
    std::fs::write(&paths.2, key.serialize_pem()).unwrap();
    paths
}

#[tokio::test]
async fn mutual_tls_needs_the_client_certificate() {
    let tmp = tempfile::tempdir().unwrap();
    let (ca, cert, key) = client_pki(tmp.path());
    let cloud_dir = tmp.path().join("cloud");
    let env = [
        ("OPGRAPH_HTTP_ADDR", "127.0.0.1:0".to_owned()),
        ("OPGRAPH_GRPC_ADDR", "127.0.0.1:0".to_owned()),
        ("OPGRAPH_QUIC_ADDR", "127.0.0.1:0".to_owned()),
        ("OPGRAPH_DATA_DIR", cloud_dir.display().to_string()),
        ("OPGRAPH_BOOTSTRAP_KEY", TEST_BOOTSTRAP_KEY.to_owned()),
        ("OPGRAPH_TLS_CLIENT_CA_FILE", ca.display().to_string()),
    ];
    let process =
        Process::start("opgraph-cloud", &[], &env, &["http", "grpc", "quic"]).await.unwrap();
    let url = format!("http://{}", process.addrs["http"]);
    let cloud = CloudProc { process, url, dir: cloud_dir };
    let with_cert = format!(
        "client_cert_file = {:?}\nclient_key_file = {:?}\n",
        cert.display().to_string(),
        key.display().to_string()
    );
    for transport in [Transport::Grpc, Transport::Quic] {
        // Without the client certificate: refused at the TLS handshake.
        let dir = tmp.path().join(format!("{}-nocert", transport.name()));
        std::fs::create_dir_all(&dir).unwrap();
        let event = format!("mtls.{}", transport.name());
        let config = gateway_config(&dir, transport, &cloud.receiver(transport), &cloud.cert(), "");
        let gateway = Gateway::start(&config, TEST_BOOTSTRAP_KEY).await;
        gateway.post(&event, 3).await;
        eventually("the handshake failure in health", DELIVERY_TIMEOUT, || async {
            let health = gateway.health().await;
            (health["degraded"] == true).then_some(())
        })
        .await;
        assert!(cloud.ids(&event).await.is_empty());
        gateway.process.kill9().await.unwrap();

        // With it: delivered.
        let dir = tmp.path().join(format!("{}-cert", transport.name()));
        std::fs::create_dir_all(&dir).unwrap();
        let config =
            gateway_config(&dir, transport, &cloud.receiver(transport), &cloud.cert(), &with_cert);
        let gateway = Gateway::start(&config, TEST_BOOTSTRAP_KEY).await;
        let ids = gateway.post(&event, 40).await;
        wait_delivered(&cloud, &event, &ids).await;
        assert!(gateway.process.terminate().await.unwrap().success());
    }
}

/// An event that names a trackable by its code, sent through a gateway,
/// is resolved in the cloud like one sent over HTTP: it carries the
/// trackable's id and counts in its usage; an unregistered code is kept as
/// sent and resolves nothing.
#[tokio::test]
async fn trackable_codes_from_a_gateway_resolve_to_registered_trackables() {
    let tmp = tempfile::tempdir().unwrap();
    let cloud = CloudProc::start(&tmp.path().join("cloud"), "127.0.0.1:0", "off").await;
    let http = reqwest::Client::new();
    let epc = "3034F87E5C0000400000012A";
    let created: Value = http
        .post(format!("{}/api/trackables", cloud.url))
        .bearer_auth(TEST_BOOTSTRAP_KEY)
        .json(&json!({"kind": "rfid_tag", "name": "Pallet 7", "code": epc}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let trackable_id = created["trackable"]["id"].as_str().unwrap().to_owned();

    let gw_dir = tmp.path().join("gateway");
    let grpc = cloud.receiver(Transport::Grpc);
    let config = gateway_config(&gw_dir, Transport::Grpc, &grpc, &cloud.cert(), "");
    let gateway = Gateway::start(&config, TEST_BOOTSTRAP_KEY).await;
    let body = json!({"batch": [
        {"event": "rfid.tag.read", "actor": {"type": "rfid_reader", "id": "dock-3"},
         "trackable": {"kind": "rfid_tag", "code": epc}},
        {"event": "rfid.tag.read", "actor": {"type": "rfid_reader", "id": "dock-3"},
         "trackable": {"kind": "rfid_tag", "code": "E200UNREGISTERED"}},
    ]});
    let response = http.post(format!("{}/ingest", gateway.url)).json(&body).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::ACCEPTED);
    wait_drained(&gateway).await;

    let events = cloud.events("rfid.tag.read").await;
    assert_eq!(events.len(), 2, "{events:?}");
    let by_code = |code: &str| {
        events.iter().find(|e| e["trackable"]["code"] == code).unwrap()["trackable"].clone()
    };
    assert_eq!(by_code(epc), json!({"kind": "rfid_tag", "code": epc, "id": trackable_id}));
    assert_eq!(
        by_code("E200UNREGISTERED"),
        json!({"kind": "rfid_tag", "code": "E200UNREGISTERED"})
    );

    let one: Value = http
        .get(format!("{}/api/trackables/{trackable_id}", cloud.url))
        .bearer_auth(TEST_BOOTSTRAP_KEY)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(one["trackable"]["usage"]["count"], 1, "{one}");
    assert!(gateway.process.terminate().await.unwrap().success());
}
