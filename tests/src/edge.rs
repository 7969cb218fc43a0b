//! Building blocks of the edge scenarios: a cloud with its receivers, a
//! gateway pointed at it (directly or through the flaky-link proxy), and
//! bounded waiting for what they eventually do.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a broken harness should fail loudly

use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::{Process, TEST_BOOTSTRAP_KEY};

/// Bound on every wait for delivery.
pub const DELIVERY_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Transport {
    Grpc,
    Quic,
}

impl Transport {
    pub fn name(self) -> &'static str {
        match self {
            Transport::Grpc => "grpc",
            Transport::Quic => "quic",
        }
    }
}

pub struct CloudProc {
    pub process: Process,
    pub url: String,
    pub dir: PathBuf,
}

impl CloudProc {
    /// A cloud on `dir` with its receivers on `grpc` / `quic` (port 0: any).
    pub async fn start(dir: &Path, grpc: &str, quic: &str) -> CloudProc {
        CloudProc::start_with(dir, grpc, quic, &[]).await
    }

    /// [`CloudProc::start`] with more environment (another store).
    pub async fn start_with(
        dir: &Path,
        grpc: &str,
        quic: &str,
        more: &[(&str, String)],
    ) -> CloudProc {
        let mut env = vec![
            ("OPGRAPH_HTTP_ADDR", "127.0.0.1:0".to_owned()),
            ("OPGRAPH_GRPC_ADDR", grpc.to_owned()),
            ("OPGRAPH_QUIC_ADDR", quic.to_owned()),
            ("OPGRAPH_DATA_DIR", dir.display().to_string()),
            ("OPGRAPH_BOOTSTRAP_KEY", TEST_BOOTSTRAP_KEY.to_owned()),
        ];
        env.extend(more.iter().cloned());
        let mut expect = vec!["http"];
        expect.extend(
            [("grpc", grpc), ("quic", quic)].iter().filter(|(_, a)| *a != "off").map(|(n, _)| *n),
        );
        let process = Process::start("opgraph-cloud", &[], &env, &expect).await.unwrap();
        let url = format!("http://{}", process.addrs["http"]);
        CloudProc { process, url, dir: dir.to_path_buf() }
    }

    pub fn receiver(&self, transport: Transport) -> String {
        self.process.addrs[transport.name()].clone()
    }

    pub fn cert(&self) -> PathBuf {
        self.dir.join("receiver-cert.pem")
    }

    /// The node's `/metrics` text (the operator's: the bootstrap key).
    pub async fn metrics(&self) -> String {
        let response = reqwest::Client::new()
            .get(format!("{}/metrics", self.url))
            .bearer_auth(TEST_BOOTSTRAP_KEY)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        response.text().await.unwrap()
    }

    /// Stored events named `event` (at most 1000), newest first.
    pub async fn events(&self, event: &str) -> Vec<Value> {
        let response = reqwest::Client::new()
            .get(format!("{}/api/events?limit=1000&event={event}", self.url))
            .bearer_auth(TEST_BOOTSTRAP_KEY)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let mut body: Value = response.json().await.unwrap();
        match body["events"].take() {
            Value::Array(events) => events,
            other => panic!("no events array: {other}"),
        }
    }

    /// Ids of stored events named `event` (at most 1000), sorted.
    pub async fn ids(&self, event: &str) -> Vec<String> {
        let events = self.events(event).await;
        let mut ids: Vec<String> =
            events.iter().map(|e| e["id"].as_str().unwrap().to_owned()).collect();
        ids.sort();
        ids
    }
}

/// Writes a gateway config into `dir`, made if need be (buffer in `dir/buffer`, gateway id
/// from the directory's name: one id per buffer); `extra` goes into its
/// `[uplink]` table.
pub fn gateway_config(
    dir: &Path,
    transport: Transport,
    endpoint: &str,
    ca: &Path,
    extra: &str,
) -> PathBuf {
    gateway_config_with(dir, transport, endpoint, ca, extra, "")
}

/// Adds `lines` to the `[http]` table of `config` (a [`gateway_config`]
/// file).
pub fn add_http_settings(config: &Path, lines: &str) {
    let text = std::fs::read_to_string(config).unwrap();
    std::fs::write(config, text.replacen("[http]\n", &format!("[http]\n{lines}\n"), 1)).unwrap();
}

/// Makes the gateway of `config` (a [`gateway_config`] file) take local
/// ingest only with `token`.
pub fn require_ingest_token(config: &Path, token: &str) {
    // Upper case: the gateway reads digests in either.
    let digest = opgraph_proto::ids::credential_hash(token).to_ascii_uppercase();
    add_http_settings(config, &format!("ingest_token_sha256 = [\"{digest}\"]"));
}

/// A cloud on its embedded store in `dir/cloud`, receiving over gRPC only,
/// and the config file of a gateway in `dir/gateway` shipping to it, with
/// `extra` after its `[uplink]` table (as [`gateway_config`]).
pub async fn grpc_site(dir: &Path, extra: &str) -> (CloudProc, PathBuf) {
    let cloud = CloudProc::start(&dir.join("cloud"), "127.0.0.1:0", "off").await;
    let grpc = cloud.receiver(Transport::Grpc);
    let config = gateway_config(&dir.join("gateway"), Transport::Grpc, &grpc, &cloud.cert(), extra);
    (cloud, config)
}

/// [`gateway_config`] with `buffer_extra` in its `[buffer]` table too.
pub fn gateway_config_with(
    dir: &Path,
    transport: Transport,
    endpoint: &str,
    ca: &Path,
    extra: &str,
    buffer_extra: &str,
) -> PathBuf {
    let text = format!(
        r#"
gateway_id = "gw-{name}"
shutdown_flush = "5s"

[http]
addr = "127.0.0.1:0"

[buffer]
dir = {buffer:?}
{buffer_extra}

[uplink]
transport = "{transport}"
endpoint = "{endpoint}"
server_name = "localhost"
ca_file = {ca:?}
connect_timeout = "5s"
request_timeout = "10s"
backoff_initial = "50ms"
backoff_max = "500ms"
{extra}
"#,
        name = dir.file_name().unwrap().to_string_lossy(),
        buffer = dir.join("buffer").display().to_string(),
        transport = transport.name(),
        ca = ca.display().to_string(),
    );
    std::fs::create_dir_all(dir).unwrap();
    let path = dir.join("gateway.toml");
    std::fs::write(&path, text).unwrap();
    path
}

pub struct Gateway {
    pub process: Process,
    pub url: String,
}

impl Gateway {
    pub async fn start(config: &Path, api_key: &str) -> Gateway {
        let env = [("OPGRAPH_GATEWAY_API_KEY", api_key.to_owned())];
        let config = config.display().to_string();
        let process = Process::start("opgraph-gateway", &["--config", &config], &env, &["http"])
            .await
            .unwrap();
        let url = format!("http://{}", process.addrs["http"]);
        Gateway { process, url }
    }

    /// Posts `n` events named `event` in bodies of up to 100 (one single
    /// envelope among them); returns the ids the gateway acknowledged.
    pub async fn post(&self, event: &str, n: usize) -> Vec<String> {
        let client = reqwest::Client::new();
        let mut ids = Vec::new();
        let mut i = 0;
        while i < n {
            let body = if i == 0 {
                json!({"event": event, "properties": {"i": i}})
            } else {
                let batch: Vec<Value> = (i..n.min(i + 100))
                    .map(|i| json!({"event": event, "properties": {"i": i}, "actor": "e2e"}))
                    .collect();
                json!({ "batch": batch })
            };
            let response =
                client.post(format!("{}/ingest", self.url)).json(&body).send().await.unwrap();
            assert_eq!(response.status(), StatusCode::ACCEPTED);
            let answer: Value = response.json().await.unwrap();
            let got: Vec<String> = answer["ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_str().unwrap().to_owned())
                .collect();
            assert_eq!(answer["accepted"].as_u64(), Some(got.len() as u64));
            i += got.len();
            ids.extend(got);
        }
        ids.sort();
        ids
    }

    pub async fn health(&self) -> Value {
        reqwest::get(format!("{}/health", self.url)).await.unwrap().json().await.unwrap()
    }

    pub async fn metrics(&self) -> String {
        reqwest::get(format!("{}/metrics", self.url)).await.unwrap().text().await.unwrap()
    }

    /// The value of one unlabelled series of `/metrics` (`None`: absent).
    pub async fn metric(&self, name: &str) -> Option<f64> {
        series_value(&self.metrics().await, name)
    }
}

/// The value of `series` (its name with any labels, as printed) in a
/// Prometheus text exposition; `None` when absent.
pub fn series_value(metrics: &str, series: &str) -> Option<f64> {
    metrics.lines().find_map(|line| {
        let (name, value) = line.rsplit_once(' ')?;
        (name == series).then(|| value.trim().parse().ok()).flatten()
    })
}

/// Polls `check` every 50 ms until it yields a value, for at most `limit`.
pub async fn eventually<T, F>(what: &str, limit: Duration, mut check: impl FnMut() -> F) -> T
where
    F: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {limit:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until the cloud holds exactly `expected` under `event`.
pub async fn wait_delivered(cloud: &CloudProc, event: &str, expected: &[String]) {
    let last = eventually("delivery", DELIVERY_TIMEOUT, || async {
        let ids = cloud.ids(event).await;
        assert!(ids.len() <= expected.len(), "more events stored than sent: {}", ids.len());
        (ids.len() == expected.len()).then_some(ids)
    })
    .await;
    assert_eq!(last, expected, "the cloud holds exactly the acknowledged ids");
}

/// Waits until the gateway's buffer holds nothing unacknowledged.
pub async fn wait_drained(gateway: &Gateway) -> Value {
    eventually("an empty buffer", DELIVERY_TIMEOUT, || async {
        let health = gateway.health().await;
        (health["buffer"]["pending_records"] == 0).then_some(health)
    })
    .await
}
