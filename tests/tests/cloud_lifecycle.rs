//! Process-level behaviour: durability across `kill -9`, graceful SIGTERM,
//! bad configuration, the example config, the generated bootstrap key; and
//! both binaries run as the systemd units in `deploy/systemd/` run them.
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
    process.terminate().await.unwrap();

    // A key configured anew replaces it: the old one stops working.
    let rotated = "og_rotatedrotatedrotated0001";
    let mut env = env.to_vec();
    env.push(("OPGRAPH_BOOTSTRAP_KEY", rotated.to_owned()));
    let process = Process::start("opgraph-cloud", &[], &env, &["http"]).await.unwrap();
    let keys = format!("http://{}/api/keys", process.addrs["http"]);
    let status = |key: &str| reqwest::Client::new().get(&keys).bearer_auth(key).send();
    assert_eq!(status(rotated).await.unwrap().status(), StatusCode::OK);
    assert_eq!(status(&key).await.unwrap().status(), StatusCode::UNAUTHORIZED);
}

/// A unit file of `deploy/systemd/`.
fn unit(name: &str) -> String {
    let path = format!("{}/../deploy/systemd/{name}.service", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap()
}

/// The values of `key=` in a unit's text, in order.
fn unit_values<'a>(text: &'a str, key: &str) -> Vec<&'a str> {
    text.lines().filter_map(|line| line.strip_prefix(key)?.strip_prefix('=')).collect()
}

/// `5s`, `2min`, `60s` in seconds: the forms the unit and the examples use.
fn seconds(value: &str) -> u64 {
    let value = value.trim().trim_matches('"');
    let digits = value.trim_end_matches(char::is_alphabetic);
    let n: u64 = digits.parse().unwrap();
    match &value[digits.len()..] {
        "s" => n,
        "min" => n * 60,
        other => panic!("unit {other:?} of {value:?}"),
    }
}

/// Each unit passes `systemd-analyze verify` without a warning: keys in
/// the right sections, values systemd can read, an executable to run (the
/// one built here, in place of the installed path).
#[tokio::test]
async fn systemd_units_verify_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    for name in ["opgraph-gateway", "opgraph-cloud"] {
        let installed = format!("/usr/local/bin/{name}");
        let text = unit(name);
        assert_eq!(unit_values(&text, "ExecStart")[0].split(' ').next(), Some(&*installed));
        let built = opgraph_tests::binary(name).unwrap();
        let path = dir.path().join(format!("{name}.service"));
        std::fs::write(&path, text.replace(&installed, built.to_str().unwrap())).unwrap();
        let output = tokio::process::Command::new("systemd-analyze")
            .arg("verify")
            .arg(&path)
            .output()
            .await
            .expect(
                "systemd-analyze (package systemd) is needed: deploy/scripts/install-test-deps.sh",
            );
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success() && stderr.trim().is_empty(), "{name}: {stderr}");
    }
}

/// Each binary runs from its unit's command line and environment, with the
/// deploy example as its config: it keeps its state in the unit's
/// `StateDirectory`, stops on SIGTERM (systemd's stop) with success, well
/// within `TimeoutStopSec`, and a bad config exits with a status the unit
/// does not restart on.
#[tokio::test]
async fn the_binaries_run_as_their_systemd_units_say() {
    let cases = [
        ("opgraph-gateway", "gateway", "buffer/buffer-id"),
        ("opgraph-cloud", "cloud", "bootstrap-key"),
    ];
    for (name, config, kept) in cases {
        let text = unit(name);
        let state = tempfile::tempdir().unwrap();
        let state_dir = format!("/var/lib/{}", unit_values(&text, "StateDirectory")[0]);
        let local = |value: &str| {
            value
                .replace(&state_dir, state.path().to_str().unwrap())
                .replace(":1883", ":0")
                .replace(":1884", ":0")
        };
        // The example config, with the unit's state directory and free ports.
        let example = format!("{}/../deploy/{config}.example.toml", env!("CARGO_MANIFEST_DIR"));
        let example = std::fs::read_to_string(example).unwrap();
        let config_file = state.path().join(format!("{config}.toml"));
        std::fs::write(&config_file, local(&example)).unwrap();
        let exec = unit_values(&text, "ExecStart")[0];
        let installed_config = format!("/etc/opgraph/{config}.toml");
        let args: Vec<String> = exec
            .split(' ')
            .skip(1)
            .map(|arg| {
                if arg == installed_config {
                    config_file.display().to_string()
                } else {
                    arg.to_owned()
                }
            })
            .collect();
        assert!(args.contains(&config_file.display().to_string()), "{exec}");
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut env: Vec<(&str, String)> = unit_values(&text, "Environment")
            .iter()
            .filter_map(|pair| pair.split_once('='))
            .map(|(key, value)| (key, local(value)))
            .collect();
        // What an operator's EnvironmentFile would hold, and free ports.
        env.extend([
            ("OPGRAPH_GATEWAY_API_KEY", "og_unitfile0123456789abcdef".to_owned()),
            ("OPGRAPH_GATEWAY_HTTP_ADDR", "127.0.0.1:0".to_owned()),
            ("OPGRAPH_HTTP_ADDR", "127.0.0.1:0".to_owned()),
            ("OPGRAPH_GRPC_ADDR", "127.0.0.1:0".to_owned()),
            ("OPGRAPH_QUIC_ADDR", "127.0.0.1:0".to_owned()),
        ]);
        let process = Process::start(name, &args, &env, &["http"]).await.unwrap();
        assert!(state.path().join(kept).exists(), "{name} kept no {kept} in its state directory");
        let exit = process.terminate().await.unwrap();
        assert!(exit.success(), "{name} stopped with {exit}");
        let stop = seconds(unit_values(&text, "TimeoutStopSec")[0]);
        let flush =
            example.lines().find_map(|l| l.strip_prefix("shutdown_flush = ")).unwrap_or("0s");
        assert!(
            stop > seconds(flush),
            "{name}: TimeoutStopSec {stop}s within shutdown_flush {flush}"
        );

        std::fs::write(&config_file, "no_such_key = 1\n").unwrap();
        let output = tokio::process::Command::new(opgraph_tests::binary(name).unwrap())
            .args(&args)
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .output()
            .await
            .unwrap();
        let code = output.status.code().unwrap().to_string();
        assert_eq!(unit_values(&text, "RestartPreventExitStatus"), [code.as_str()], "{name}");
    }
}
