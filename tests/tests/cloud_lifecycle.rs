//! Process-level behaviour: durability across `kill -9`, graceful SIGTERM,
//! bad configuration, the example config, the generated bootstrap key.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose

use opgraph_tests::{Cloud, Process};
use reqwest::StatusCode;
use serde_json::{Value, json};

#[tokio::test]
async fn acknowledged_ingest_survives_kill_9() {
    let mut cloud = Cloud::start(&[]).await.unwrap();
    let dir = cloud.keep_dir().unwrap();
    let client = cloud.http();
    let mut acknowledged = Vec::new();
    // Many concurrent writers so that group commits are in flight when the
    // process dies.
    let mut tasks = tokio::task::JoinSet::new();
    for writer in 0..8 {
        let (client, url, key) = (client.clone(), cloud.at("/api/ingest"), cloud.key.clone());
        tasks.spawn(async move {
            let mut ids = Vec::new();
            for i in 0..25 {
                let body = json!({"batch": [
                    {"event": "pallet.moved", "properties": {"writer": writer, "i": i}},
                    {"event": "pallet.moved", "properties": {"writer": writer, "i": i, "second": true}},
                ]});
                let response = client.post(&url).bearer_auth(&key).json(&body).send().await.unwrap();
                assert_eq!(response.status(), StatusCode::ACCEPTED);
                let body: Value = response.json().await.unwrap();
                ids.extend(body["ids"].as_array().unwrap().iter().map(|v| v.as_str().unwrap().to_owned()));
            }
            ids
        });
    }
    while let Some(ids) = tasks.join_next().await {
        acknowledged.extend(ids.unwrap());
    }
    cloud.process.kill9().await.unwrap();

    let cloud = Cloud::start_in(dir.path(), &[]).await.unwrap();
    let response = cloud
        .http()
        .get(cloud.at("/api/events?limit=1000&event=pallet.moved"))
        .bearer_auth(&cloud.key)
        .send()
        .await
        .unwrap();
    let body: Value = response.json().await.unwrap();
    let mut stored: Vec<String> = body["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["id"].as_str().unwrap().to_owned())
        .collect();
    stored.sort();
    acknowledged.sort();
    assert_eq!(acknowledged.len(), 400);
    assert_eq!(stored, acknowledged, "an acknowledged event was lost (or one appeared twice)");
}

#[tokio::test]
async fn sigterm_exits_zero_after_draining() {
    let cloud = Cloud::start(&[]).await.unwrap();
    let response = cloud
        .http()
        .post(cloud.at("/api/ingest"))
        .bearer_auth(&cloud.key)
        .json(&json!({"event": "shift.ended"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::ACCEPTED);
    let status = cloud.process.terminate().await.unwrap();
    assert!(status.success(), "exit status {status}");
}

#[tokio::test]
async fn bad_config_exits_nonzero_with_one_clear_line() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("cloud.toml");
    std::fs::write(&file, "[http]\naddr = \"127.0.0.1:0\"\nbody_limt = \"1MiB\"\n").unwrap();
    let output = tokio::process::Command::new(opgraph_tests::binary("opgraph-cloud").unwrap())
        .args(["--config", file.to_str().unwrap()])
        .env("OPGRAPH_DATA_DIR", dir.path())
        .output()
        .await
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(lines[0].contains("http.body_limt"), "{stderr}");

    let output = tokio::process::Command::new(opgraph_tests::binary("opgraph-cloud").unwrap())
        .env("OPGRAPH_DATA_DIR", dir.path())
        .env("OPGRAPH_RATE_LIMIT_RPS", "lots")
        .output()
        .await
        .unwrap();
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("OPGRAPH_RATE_LIMIT_RPS"));
}

#[tokio::test]
async fn example_config_in_deploy_is_valid() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/cloud.example.toml");
    let dir = tempfile::tempdir().unwrap();
    let process = Process::start(
        "opgraph-cloud",
        &["--config", path],
        &[
            ("OPGRAPH_HTTP_ADDR", "127.0.0.1:0".into()),
            ("OPGRAPH_GRPC_ADDR", "off".into()),
            ("OPGRAPH_QUIC_ADDR", "off".into()),
            ("OPGRAPH_DATA_DIR", dir.path().display().to_string()),
        ],
        &["http"],
    )
    .await
    .unwrap();
    assert!(process.addrs["http"].starts_with("127.0.0.1:"));
}

#[tokio::test]
async fn first_start_prints_and_saves_a_working_operator_key() {
    let dir = tempfile::tempdir().unwrap();
    let env = [
        ("OPGRAPH_HTTP_ADDR", "127.0.0.1:0".to_owned()),
        ("OPGRAPH_GRPC_ADDR", "127.0.0.1:0".to_owned()),
        ("OPGRAPH_QUIC_ADDR", "127.0.0.1:0".to_owned()),
        ("OPGRAPH_DATA_DIR", dir.path().display().to_string()),
    ];
    let process = Process::start("opgraph-cloud", &[], &env, &["http"]).await.unwrap();
    let line = process.banner.iter().find(|l| l.starts_with("bootstrap api key: ")).unwrap();
    let key = line["bootstrap api key: ".len()..].split_whitespace().next().unwrap().to_owned();
    let saved_path = dir.path().join("bootstrap-key");
    let saved = std::fs::read_to_string(&saved_path).unwrap();
    assert_eq!(saved.trim(), key);
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&saved_path).unwrap().permissions().mode() & 0o777, 0o600);
    let url = format!("http://{}/api/workspaces", process.addrs["http"]);
    let response = reqwest::Client::new()
        .post(url)
        .bearer_auth(&key)
        .json(&json!({"name": "Site B"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    // Waits for the exit: the data directory's lock goes with the process,
    // and a restart that overtakes it is rightly refused.
    process.terminate().await.unwrap();

    // A restart keeps the workspace and prints no new key.
    let process = Process::start("opgraph-cloud", &[], &env, &["http"]).await.unwrap();
    assert!(process.banner.iter().all(|l| !l.starts_with("bootstrap api key")));
}
