//! MQTT source end to end: `opgraph-sim rfid` publishes tag reads to an
//! MQTT broker, the gateway's MQTT source maps them into events and the
//! cloud's API is checked for exact counts and field values. Once with the
//! gateway's embedded broker, once with an external Mosquitto broker (the
//! Debian package, installed by deploy/scripts/install-test-deps.sh and
//! started here on a loopback port), and once with the gateway killed while
//! messages flow: nothing the broker handed over is lost, nothing is
//! stored twice.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use opgraph_tests::edge::*;
use opgraph_tests::{TEST_BOOTSTRAP_KEY, binary};
use serde_json::Value;
use tokio::process::Command;

const EVENT: &str = "rfid.tag.read";

/// The source's rules, after `broker` and login lines.
fn source_config(broker_tables: &str, source_lines: &str) -> String {
    format!(
        r#"
{broker_tables}

[[sources.mqtt]]
name = "rfid"
max_clock_skew = "1min"
backoff_initial = "50ms"
backoff_max = "500ms"
{source_lines}

[[sources.mqtt.rules]]
topic = "readers/{{reader}}/tags"
event = "{EVENT}"
actor = {{ type = "rfid_reader", id = "{{reader}}" }}
object = {{ type = "rfid_tag", id = "{{/epc}}" }}
trackable = {{ kind = "rfid", code = "{{/epc}}" }}
properties = {{ antenna = "{{/antenna}}", rssi = "{{/rssi}}", seq = "{{/seq}}" }}
timestamp = "{{/ts}}"
"#
    )
}

struct Site {
    _tmp: tempfile::TempDir,
    dir: PathBuf,
    cloud: CloudProc,
    config: PathBuf,
}

async fn site(extra: impl FnOnce(&Path) -> String) -> Site {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_path_buf();
    let (cloud, config) = grpc_site(&dir, &extra(&dir)).await;
    Site { _tmp: tmp, dir, cloud, config }
}

async fn start_gateway(site: &Site, env: &[(&str, String)]) -> Gateway {
    let mut all = vec![("OPGRAPH_GATEWAY_API_KEY", TEST_BOOTSTRAP_KEY.to_owned())];
    all.extend(env.iter().cloned());
    let config = site.config.display().to_string();
    let process =
        opgraph_tests::Process::start("opgraph-gateway", &["--config", &config], &all, &["http"])
            .await
            .unwrap();
    let url = format!("http://{}", process.addrs["http"]);
    Gateway { process, url }
}

/// Waits until the source is connected and subscribed.
async fn wait_subscribed(gateway: &Gateway) {
    eventually("the MQTT source subscribed", DELIVERY_TIMEOUT, || async {
        let health = gateway.health().await;
        (health["sources"][0]["connected"] == true).then_some(())
    })
    .await;
}

/// What the simulator said it sent, and every message it recorded.
struct Sent {
    summary: Value,
    /// seq -> the recorded read.
    reads: BTreeMap<u64, Value>,
    /// Reads the broker acknowledged.
    acked: BTreeSet<u64>,
}

/// Runs the simulator to its end; it must succeed with every message
/// acknowledged.
async fn simulate(dir: &Path, broker: &str, args: &[&str], env: &[(&str, &str)]) -> Sent {
    let (success, sent) = simulate_any(dir, broker, args, env).await;
    assert!(success, "simulator failed: {}", sent.summary);
    assert_eq!(sent.summary["acked"], sent.summary["sent"], "{}", sent.summary);
    sent
}

/// Runs the simulator to its end, whatever its exit status.
async fn simulate_any(
    dir: &Path,
    broker: &str,
    args: &[&str],
    env: &[(&str, &str)],
) -> (bool, Sent) {
    let record = dir.join(format!("sent-{}.jsonl", rand::random::<u32>()));
    let output = Command::new(binary("opgraph-sim").unwrap())
        .args(["rfid", "--broker", broker, "--record"])
        .arg(&record)
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(Duration::from_secs(120), output).await.unwrap().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = stdout.lines().find_map(|l| l.strip_prefix("summary ")).unwrap_or_else(|| {
        panic!("no summary line: {stdout}\n{}", String::from_utf8_lossy(&output.stderr))
    });
    let summary: Value = serde_json::from_str(line).unwrap();
    let mut reads = BTreeMap::new();
    let mut acked = BTreeSet::new();
    for line in std::fs::read_to_string(&record).unwrap().lines() {
        let m: Value = serde_json::from_str(line).unwrap();
        if m["read"].is_null() {
            continue;
        }
        let seq = m["read"]["seq"].as_u64().unwrap();
        if m["acked"] == true {
            acked.insert(seq);
        }
        reads.insert(seq, m["read"].clone());
    }
    (output.status.success(), Sent { summary, reads, acked })
}

async fn wait_events(cloud: &CloudProc, n: usize) -> Vec<Value> {
    eventually("the events in the cloud", DELIVERY_TIMEOUT, || async {
        let events = cloud.events(EVENT).await;
        assert!(events.len() <= n, "more events stored than sent: {}", events.len());
        (events.len() == n).then_some(events)
    })
    .await
}

/// Every event is exactly one recorded read, field by field (each read
/// once, or at least once with `redelivered`).
fn check_events(events: &[Value], sent: &Sent, redelivered: bool) {
    let mut per_reader: BTreeMap<String, u64> = BTreeMap::new();
    let mut seen = BTreeSet::new();
    for e in events {
        let seq = e["properties"]["seq"].as_u64().unwrap_or_else(|| panic!("no seq: {e}"));
        if !seen.insert(seq) {
            assert!(redelivered, "seq {seq} stored twice");
            continue;
        }
        let read = &sent.reads[&seq];
        let reader = e["actor"]["id"].as_str().unwrap().to_owned();
        assert_eq!(e["actor"]["type"], "rfid_reader", "{e}");
        assert_eq!(e["object"]["type"], "rfid_tag", "{e}");
        assert_eq!(e["object"]["id"], read["epc"], "{e}");
        assert_eq!(e["trackable"]["kind"], "rfid", "{e}");
        assert_eq!(e["trackable"]["code"], read["epc"], "{e}");
        assert_eq!(e["properties"]["antenna"], read["antenna"], "{e}");
        assert_eq!(e["properties"]["rssi"], read["rssi"], "{e}");
        let ts = read["ts"].as_i64().unwrap();
        if read["skewed"] == true {
            // The reader's clock was an hour behind: receive time instead,
            // the device's time kept beside it.
            assert_eq!(e["context"]["deviceTimestamp"], ts, "{e}");
            let stored = e["timestamp"].as_i64().unwrap();
            assert!(stored - ts > 3_000_000, "{e}");
        } else {
            assert_eq!(e["timestamp"], ts, "{e}");
            assert!(e.get("context").is_none_or(Value::is_null), "{e}");
        }
        assert!(e["receivedAt"].as_i64().unwrap() >= e["timestamp"].as_i64().unwrap() - 1_000);
        *per_reader.entry(reader).or_default() += 1;
    }
    let expected: BTreeMap<String, u64> = sent.summary["per_reader"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.as_u64().unwrap()))
        .collect();
    assert_eq!(per_reader, expected);
    assert_eq!(seen.len(), sent.reads.len());
}

#[tokio::test]
async fn embedded_broker_simulator_to_cloud() {
    let site = site(|_| {
        source_config(
            "[sources.mqtt_broker]\nlisten = \"127.0.0.1:0\"\n\
             [sources.mqtt_broker.users]\nreader = \"reader-secret\"",
            "broker = \"embedded\"",
        )
    })
    .await;
    let gateway = start_gateway(&site, &[]).await;
    let broker = gateway.process.addrs["mqtt"].clone();
    wait_subscribed(&gateway).await;

    let args = ["--seed", "42", "--readers", "4", "--tags", "25", "--reads", "300"];
    let misbehaving = ["--malformed", "9", "--skewed-readers", "1", "--skew", "1h"];
    let login = ["--username", "reader"];
    let password = [("OPGRAPH_SIM_MQTT_PASSWORD", "reader-secret")];
    let sent =
        simulate(&site.dir, &broker, &[&args[..], &misbehaving, &login].concat(), &password).await;
    assert_eq!(sent.summary["sent"], 309, "{}", sent.summary);
    assert_eq!(sent.summary["malformed"], 9);
    let skewed = sent.summary["skewed"].as_u64().unwrap();
    assert!(skewed > 0, "{}", sent.summary);

    let events = wait_events(&site.cloud, 300).await;
    check_events(&events, &sent, false);
    let health = gateway.health().await;
    let source = &health["sources"][0];
    assert_eq!(source["name"], "rfid", "{health}");
    assert_eq!(source["kind"], "mqtt", "{health}");
    assert_eq!(source["connected"], true, "{health}");
    assert_eq!(source["received_total"], 309, "{health}");
    assert_eq!(source["accepted_total"], 300, "{health}");
    assert_eq!(source["rejected_total"], 9, "{health}");
    assert_eq!(source["rejected"]["invalid_json"], 9, "{health}");
    assert_eq!(source["clock_skew_total"], skewed, "{health}");
    assert_eq!(source["dropped_total"], 0, "{health}");
    assert!(source["last_message_ms"].as_i64().unwrap() > 0, "{health}");
    let metrics = gateway.metrics().await;
    for line in [
        "opgraph_gateway_source_accepted_total{source=\"rfid\",kind=\"mqtt\"} 300".to_owned(),
        "opgraph_gateway_source_rejected_total{source=\"rfid\",kind=\"mqtt\",reason=\"invalid_json\"} 9".to_owned(),
        format!("opgraph_gateway_source_clock_skew_total{{source=\"rfid\",kind=\"mqtt\"}} {skewed}"),
        "opgraph_gateway_source_connected{source=\"rfid\",kind=\"mqtt\"} 1".to_owned(),
    ] {
        assert!(metrics.contains(&line), "{line} not in\n{metrics}");
    }
    let status = gateway.process.terminate().await.unwrap();
    assert!(status.success(), "gateway exit status {status}");
}

/// Mosquitto with two logins, and optionally a TLS listener.
struct Mosquitto {
    broker: opgraph_tests::mosquitto::Mosquitto,
    port: u16,
    /// The TLS listener's port and its self-signed certificate.
    tls: Option<(u16, PathBuf)>,
}

const GATEWAY_LOGIN: (&str, &str) = ("gateway", "gw-secret-1");
const SIM_LOGIN: (&str, &str) = ("sim", "sim-secret-2");

impl Mosquitto {
    async fn start(dir: &Path) -> Mosquitto {
        Self::start_with(dir, false).await
    }

    /// Also a TLS listener with a self-signed certificate for 127.0.0.1.
    async fn start_with(dir: &Path, tls: bool) -> Mosquitto {
        let mut extra = String::new();
        let tls = tls.then(|| {
            let certified =
                rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned()]).unwrap();
            let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
            std::fs::write(&cert, certified.cert.pem()).unwrap();
            std::fs::write(&key, certified.signing_key.serialize_pem()).unwrap();
            let tls_port = opgraph_tests::mosquitto::free_port().unwrap();
            extra = format!(
                "listener {tls_port} 127.0.0.1\ncertfile {}\nkeyfile {}\n",
                cert.display(),
                key.display()
            );
            (tls_port, cert)
        });
        let tls_ports: Vec<u16> = tls.iter().map(|t| t.0).collect();
        let broker = opgraph_tests::mosquitto::Mosquitto::start(
            dir,
            &[GATEWAY_LOGIN, SIM_LOGIN],
            &extra,
            &tls_ports,
        )
        .await
        .unwrap();
        Mosquitto { port: broker.port, broker, tls }
    }

    fn addr(&self) -> String {
        self.broker.addr()
    }
}

fn external_source(port: u16, protocol: &str) -> String {
    external_source_at(
        &format!("mqtt://127.0.0.1:{port}"),
        "opgraph-test-gw",
        &format!("protocol = \"{protocol}\""),
    )
}

/// An anonymous MQTT 3.1.1 client publishing with QoS 0: raw bytes, as a
/// device of any make would send them.
struct RawPublisher(tokio::net::TcpStream);

impl RawPublisher {
    async fn connect(broker: &str) -> RawPublisher {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut stream = tokio::net::TcpStream::connect(broker).await.unwrap();
        // Protocol "MQTT" level 4, clean session, keep-alive 60 s, id "raw".
        let connect = [&[0, 4][..], b"MQTT", &[4, 2, 0, 60, 0, 3], b"raw"].concat();
        stream.write_all(&Self::packet(0x10, &connect)).await.unwrap();
        let mut connack = [0u8; 4];
        stream.read_exact(&mut connack).await.unwrap();
        assert_eq!(connack, [0x20, 2, 0, 0], "CONNACK accepted");
        RawPublisher(stream)
    }

    async fn publish(&mut self, topic: &str, payload: &[u8]) {
        let topic_len = u16::try_from(topic.len()).unwrap().to_be_bytes();
        let body = [&topic_len[..], topic.as_bytes(), payload].concat();
        self.send(&Self::packet(0x30, &body)).await;
    }

    /// Bytes as they are, a piece of a packet say.
    async fn send(&mut self, bytes: &[u8]) {
        use tokio::io::AsyncWriteExt;
        self.0.write_all(bytes).await.unwrap();
    }

    fn packet(first: u8, body: &[u8]) -> Vec<u8> {
        let mut out = vec![first];
        let mut len = body.len();
        loop {
            let byte = (len % 128) as u8;
            len /= 128;
            out.push(if len > 0 { byte | 0x80 } else { byte });
            if len == 0 {
                return [out, body.to_vec()].concat();
            }
        }
    }
}

/// rumqttd keeps each topic filter's latest messages in memory whether or
/// not they were delivered: the gateway bounds that log (`log_memory`), so
/// what passes through the embedded broker does not stay in its memory.
#[tokio::test]
async fn the_embedded_broker_holds_at_most_its_log_memory() {
    let site = site(|_| {
        source_config(
            "[sources.mqtt_broker]\nlisten = \"127.0.0.1:0\"\n\
             max_payload = \"2MiB\"\nlog_memory = \"4MiB\"",
            "broker = \"embedded\"",
        )
    })
    .await;
    let gateway = start_gateway(&site, &[]).await;
    let broker = gateway.process.addrs["mqtt"].clone();
    wait_subscribed(&gateway).await;
    let pid = gateway.process.child.id().unwrap();
    let (before, _) = opgraph_tests::bench::rss_mb(pid);
    // 96 MB through one filter, rejected by the rule (not JSON) once read;
    // two at a time, since a subscriber more than the log behind would
    // have the oldest dropped unread.
    let mut device = RawPublisher::connect(&broker).await;
    let payload = vec![b'x'; 1_000_000];
    for sent in (2..=96).step_by(2) {
        device.publish("readers/r1/tags", &payload).await;
        device.publish("readers/r1/tags", &payload).await;
        eventually("the messages read from the broker", DELIVERY_TIMEOUT, || async {
            let health = gateway.health().await;
            (health["sources"][0]["received_total"] == sent).then_some(())
        })
        .await;
    }
    assert_eq!(gateway.health().await["sources"][0]["rejected"]["invalid_json"], 96);
    // Measured: 22-25 MB more with a 4 MiB log (buffers the messages
    // passed through), 150 MB more with the log rumqttd had before.
    let (after, _) = opgraph_tests::bench::rss_mb(pid);
    assert!(after - before < 60.0, "RSS grew from {before:.1} MB to {after:.1} MB");
}

fn external_source_at(broker: &str, client_id: &str, more: &str) -> String {
    source_config(
        "",
        &format!(
            "broker = \"{broker}\"\nclient_id = \"{client_id}\"\n\
             username = \"{}\"\npassword_env = \"TEST_MQTT_PASSWORD\"\n{more}",
            GATEWAY_LOGIN.0
        ),
    )
}

fn password_env() -> Vec<(&'static str, String)> {
    vec![("TEST_MQTT_PASSWORD", GATEWAY_LOGIN.1.to_owned())]
}

#[tokio::test]
async fn external_mosquitto_with_logins_simulator_to_cloud() {
    through_mosquitto("3.1.1").await;
}

#[tokio::test]
async fn external_mosquitto_over_mqtt5_simulator_to_cloud() {
    through_mosquitto("5").await;
}

async fn through_mosquitto(protocol: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let mosquitto = Mosquitto::start(tmp.path()).await;
    let site = site(|_| external_source(mosquitto.port, protocol)).await;
    let gateway = start_gateway(&site, &password_env()).await;
    wait_subscribed(&gateway).await;

    let args = ["--seed", "7", "--readers", "5", "--reads", "500", "--malformed", "5"];
    let login = ["--username", SIM_LOGIN.0];
    let sent = simulate(
        &site.dir,
        &mosquitto.addr(),
        &[&args[..], &login].concat(),
        &[("OPGRAPH_SIM_MQTT_PASSWORD", SIM_LOGIN.1)],
    )
    .await;
    assert_eq!(sent.summary["sent"], 505);

    let events = wait_events(&site.cloud, 500).await;
    check_events(&events, &sent, false);
    let health = gateway.health().await;
    let source = &health["sources"][0];
    assert_eq!(source["accepted_total"], 500, "{health}");
    assert_eq!(source["rejected"]["invalid_json"], 5, "{health}");
    assert_eq!(source["clock_skew_total"], 0, "{health}");
    let status = gateway.process.terminate().await.unwrap();
    assert!(status.success(), "gateway exit status {status}");

    // A wrong password never connects, and health says so.
    let gateway = start_gateway(&site, &[("TEST_MQTT_PASSWORD", "wrong".to_owned())]).await;
    let health = eventually("the refusal in health", DELIVERY_TIMEOUT, || async {
        let health = gateway.health().await;
        let error = health["sources"][0]["last_error"].as_str().unwrap_or_default().to_lowercase();
        error.contains("refused").then_some(health)
    })
    .await;
    assert_eq!(health["sources"][0]["connected"], false, "{health}");
    assert_eq!(health["status"], "degraded", "{health}");
    drop(mosquitto);
}

#[tokio::test]
async fn a_gateway_killed_while_reads_flow_loses_nothing_the_broker_handed_over() {
    killed_while_reads_flow("3.1.1").await;
}

#[tokio::test]
async fn a_gateway_killed_while_reads_flow_over_mqtt5_loses_nothing() {
    killed_while_reads_flow("5").await;
}

async fn killed_while_reads_flow(protocol: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let mosquitto = Mosquitto::start(tmp.path()).await;
    let site = site(|_| external_source(mosquitto.port, protocol)).await;
    let gateway = start_gateway(&site, &password_env()).await;
    wait_subscribed(&gateway).await;

    let reads = 800;
    let simulator = {
        let dir = site.dir.clone();
        let addr = mosquitto.addr();
        tokio::spawn(async move {
            let args = ["--seed", "11", "--reads", "800", "--rate", "1000"];
            let login = ["--username", SIM_LOGIN.0];
            simulate(
                &dir,
                &addr,
                &[&args[..], &login].concat(),
                &[("OPGRAPH_SIM_MQTT_PASSWORD", SIM_LOGIN.1)],
            )
            .await
        })
    };
    eventually("some reads accepted", DELIVERY_TIMEOUT, || async {
        let health = gateway.health().await;
        (health["sources"][0]["accepted_total"].as_u64().unwrap_or(0) >= 100).then_some(())
    })
    .await;
    let at_kill = gateway.health().await["sources"][0]["accepted_total"].clone();
    gateway.process.kill9().await.unwrap();
    eprintln!("killed the gateway after {at_kill} reads accepted");
    // The broker acknowledged every read to the simulator; those the
    // gateway had not acknowledged wait in its persistent session.
    let sent = simulator.await.unwrap();
    assert_eq!(sent.summary["acked"], reads);

    let gateway = start_gateway(&site, &password_env()).await;
    let events = eventually("every read in the cloud", DELIVERY_TIMEOUT, || async {
        let events = site.cloud.events(EVENT).await;
        let seqs: BTreeSet<u64> =
            events.iter().filter_map(|e| e["properties"]["seq"].as_u64()).collect();
        (seqs.len() == reads).then_some(events)
    })
    .await;
    // What the broker sent again of what was stored (acknowledged or not,
    // its append finished or not) is recognised: nothing stored twice
    // (docs/sources.md, "Sent again, stored once").
    check_events(&events, &sent, false);
    assert_eq!(events.len(), reads, "reads stored twice");
    let recognised = gateway.health().await["sources"][0]["resent_total"].clone();
    eprintln!("{recognised} reads sent again after the kill and recognised");
    let status = gateway.process.terminate().await.unwrap();
    assert!(status.success(), "gateway exit status {status}");
    drop(mosquitto);
}

#[tokio::test]
async fn mqtts_to_mosquitto_with_a_private_certificate() {
    let tmp = tempfile::tempdir().unwrap();
    let mosquitto = Mosquitto::start_with(tmp.path(), true).await;
    let (tls_port, cert) = mosquitto.tls.clone().unwrap();
    let broker = format!("mqtts://127.0.0.1:{tls_port}");
    let site =
        site(|_| external_source_at(&broker, "opgraph-test-gw", &format!("ca_file = {cert:?}")))
            .await;
    let gateway = start_gateway(&site, &password_env()).await;
    wait_subscribed(&gateway).await;

    let args = ["--seed", "5", "--reads", "60", "--username", SIM_LOGIN.0];
    let password = [("OPGRAPH_SIM_MQTT_PASSWORD", SIM_LOGIN.1)];
    let sent = simulate(&site.dir, &mosquitto.addr(), &args, &password).await;
    let events = wait_events(&site.cloud, 60).await;
    check_events(&events, &sent, false);
    let status = gateway.process.terminate().await.unwrap();
    assert!(status.success(), "gateway exit status {status}");

    // Without the certificate the platform roots do not trust the broker.
    let config = gateway_config(
        &site.dir.join("gateway-untrusted"),
        Transport::Grpc,
        &site.cloud.receiver(Transport::Grpc),
        &site.cloud.cert(),
        &external_source_at(&broker, "untrusted", ""),
    );
    let site = Site { config, ..site };
    let gateway = start_gateway(&site, &password_env()).await;
    let health = eventually("the TLS failure in health", DELIVERY_TIMEOUT, || async {
        let health = gateway.health().await;
        let error = health["sources"][0]["last_error"].as_str().unwrap_or_default().to_lowercase();
        error.contains("certificate").then_some(health)
    })
    .await;
    assert_eq!(health["sources"][0]["connected"], false, "{health}");
    drop(mosquitto);
}

fn ingest_config(users: &str) -> String {
    format!(
        r#"
[[sources.mqtt_ingest]]
name = "rfid"
listen = "127.0.0.1:0"
max_clock_skew = "1min"
users = {{ {users} }}

[[sources.mqtt_ingest.rules]]
topic = "readers/{{reader}}/tags"
event = "{EVENT}"
actor = {{ type = "rfid_reader", id = "{{reader}}" }}
object = {{ type = "rfid_tag", id = "{{/epc}}" }}
trackable = {{ kind = "rfid", code = "{{/epc}}" }}
properties = {{ antenna = "{{/antenna}}", rssi = "{{/rssi}}", seq = "{{/seq}}" }}
timestamp = "{{/ts}}"
"#
    )
}

/// A device idle with the start of its next message read keeps that much
/// of the gateway's memory, not the buffer its last batch was read into
/// (a large message's, here).
#[tokio::test]
async fn idle_ingest_connections_keep_only_what_they_hold() {
    let site = site(|_| ingest_config("")).await;
    let gateway = start_gateway(&site, &[]).await;
    let endpoint = gateway.process.addrs["mqtt-rfid"].clone();
    let pid = gateway.process.child.id().unwrap();
    let (before, _) = opgraph_tests::bench::rss_mb(pid);
    let large = vec![b'x'; 600_000];
    let mut devices = Vec::new();
    for n in 1..=50 {
        let mut device = RawPublisher::connect(&endpoint).await;
        device.publish("readers/r1/tags", &large).await;
        // The start of the next message, which never ends.
        device.send(&[0x30, 0xff, 0x7f, 0, 15]).await;
        device.send(b"readers/r1/tags").await;
        device.send(&[b'{'; 1500]).await;
        eventually("the message read", DELIVERY_TIMEOUT, || async {
            let health = gateway.health().await;
            (health["sources"][0]["received_total"] == n).then_some(())
        })
        .await;
        devices.push(device);
    }
    // Measured: 6-7 MB more; 32 MB more when each connection kept its
    // large message's buffer alive through the start of the next.
    let (after, _) = opgraph_tests::bench::rss_mb(pid);
    assert!(after - before < 15.0, "RSS grew from {before:.1} MB to {after:.1} MB");
}

#[tokio::test]
async fn ingest_endpoint_simulator_to_cloud() {
    let site = site(|_| ingest_config("reader = \"reader-secret\"")).await;
    let gateway = start_gateway(&site, &[]).await;
    let endpoint = gateway.process.addrs["mqtt-rfid"].clone();
    let args = ["--seed", "21", "--readers", "3", "--reads", "400", "--malformed", "6"];
    let args = [&args[..], &["--connections", "3"]].concat();
    let misbehaving = ["--skewed-readers", "1", "--username", "reader"];
    let password = [("OPGRAPH_SIM_MQTT_PASSWORD", "reader-secret")];
    let sent = simulate(&site.dir, &endpoint, &[&args[..], &misbehaving].concat(), &password).await;
    // Every PUBACK came after the append: the events are in the buffer
    // already, the cloud gets them next.
    let health = gateway.health().await;
    let source = &health["sources"][0];
    assert_eq!(source["kind"], "mqtt_ingest", "{health}");
    assert_eq!(source["accepted_total"], 400, "{health}");
    assert_eq!(source["rejected"]["invalid_json"], 6, "{health}");
    assert_eq!(source["clock_skew_total"], sent.summary["skewed"], "{health}");
    let events = wait_events(&site.cloud, 400).await;
    check_events(&events, &sent, false);

    // A wrong password is refused.
    let (ok, refused) = simulate_any(
        &site.dir,
        &endpoint,
        &["--reads", "1", "--timeout", "1s", "--username", "reader"],
        &[("OPGRAPH_SIM_MQTT_PASSWORD", "wrong")],
    )
    .await;
    assert!(!ok);
    assert_eq!(refused.summary["acked"], 0);
    let status = gateway.process.terminate().await.unwrap();
    assert!(status.success(), "gateway exit status {status}");
}

#[tokio::test]
async fn ingest_endpoint_killed_while_reads_flow_loses_no_acknowledged_read() {
    let site = site(|_| ingest_config("")).await;
    let gateway = start_gateway(&site, &[]).await;
    let endpoint = gateway.process.addrs["mqtt-rfid"].clone();
    let simulator = {
        let dir = site.dir.clone();
        tokio::spawn(async move {
            let args = ["--seed", "13", "--reads", "900", "--rate", "1500", "--timeout", "3s"];
            simulate_any(&dir, &endpoint, &args, &[]).await
        })
    };
    eventually("some reads accepted", DELIVERY_TIMEOUT, || async {
        let health = gateway.health().await;
        (health["sources"][0]["accepted_total"].as_u64().unwrap_or(0) >= 100).then_some(())
    })
    .await;
    gateway.process.kill9().await.unwrap();
    let (finished, sent) = simulator.await.unwrap();
    assert!(!finished, "the simulator cannot finish without the gateway");
    let acked = sent.acked.clone();
    assert!(acked.len() >= 100 && acked.len() < 900, "{} acknowledged", acked.len());
    eprintln!("killed the gateway after {} reads acknowledged", acked.len());

    // The restarted gateway ships what its buffer holds: every
    // acknowledged read (and perhaps some stored but not yet acknowledged).
    let gateway = start_gateway(&site, &[]).await;
    let events = eventually("every acknowledged read in the cloud", DELIVERY_TIMEOUT, || async {
        let events = site.cloud.events(EVENT).await;
        let seqs: BTreeSet<u64> =
            events.iter().filter_map(|e| e["properties"]["seq"].as_u64()).collect();
        acked.is_subset(&seqs).then_some(events)
    })
    .await;
    eprintln!("{} reads stored", events.len());
    let health = wait_drained(&gateway).await;
    assert_eq!(health["buffer"]["pending_records"], 0, "{health}");
    let status = gateway.process.terminate().await.unwrap();
    assert!(status.success(), "gateway exit status {status}");
}
