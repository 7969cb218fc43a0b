//! Firmware devices end to end over real pseudo-terminals: `opgraph-sim
//! firmware` plays a microcontroller speaking the framed protocol
//! (retransmitting whatever is not acknowledged), read by the gateway's
//! `firmware` source or by `opgraph-firmware-bridge` posting to a
//! gateway's local ingest. The cloud's API is checked for every reading
//! exactly once, through line noise and a host killed mid-stream.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use opgraph_tests::edge::*;
use opgraph_tests::{Process, TEST_BOOTSTRAP_KEY, binary};
use serde_json::Value;

const EVENT: &str = "temperature.measured";

fn firmware_source(name: &str, link: &Path) -> String {
    format!(
        "\n[[sources.firmware]]\nname = \"{name}\"\nport = {{ path = {path:?}, baud = 115200 }}\n\
         device_type = \"sensor\"\nbackoff_initial = \"50ms\"\nbackoff_max = \"200ms\"\n",
        path = link.display().to_string(),
    )
}

/// A cloud, and a gateway with `sources` shipping to it over gRPC; the
/// gateway's config file, to start it again.
async fn site(dir: &Path, sources: &str) -> (CloudProc, PathBuf, Gateway) {
    let (cloud, config) = grpc_site(dir, sources).await;
    let gateway = Gateway::start(&config, TEST_BOOTSTRAP_KEY).await;
    (cloud, config, gateway)
}

/// Starts the device; `extra` are more of its flags.
async fn device(dir: &Path, link: &Path, readings: u32, extra: &[&str]) -> Process {
    let summary = dir.join("device-summary.json");
    let mut args = vec![
        "firmware".to_owned(),
        "--link".to_owned(),
        link.display().to_string(),
        "--device-id".to_owned(),
        "cold-1".to_owned(),
        "--boot".to_owned(),
        "77".to_owned(),
        "--readings".to_owned(),
        readings.to_string(),
        "--ack-timeout".to_owned(),
        "200ms".to_owned(),
        "--summary".to_owned(),
        summary.display().to_string(),
    ];
    args.extend(extra.iter().map(|a| (*a).to_owned()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Process::start("opgraph-sim", &args, &[], &["serial"]).await.unwrap()
}

/// The device's summary once every reading is acknowledged.
async fn all_acked(dir: &Path, readings: u32) -> Value {
    let path = dir.join("device-summary.json");
    eventually("every reading acknowledged", DELIVERY_TIMEOUT, || async {
        let summary: Value = serde_json::from_str(&std::fs::read_to_string(&path).ok()?).ok()?;
        (summary["acked"] == readings).then_some(summary)
    })
    .await
}

/// Waits for `readings` events in the cloud and checks they are readings
/// 1..=`readings` of device `cold-1`, boot 77, each once.
async fn exactly_once(cloud: &CloudProc, readings: u32) -> Vec<Value> {
    let events = eventually("every reading in the cloud", DELIVERY_TIMEOUT, || async {
        let events = cloud.events(EVENT).await;
        assert!(events.len() <= readings as usize, "more events than readings: {}", events.len());
        (events.len() == readings as usize).then_some(events)
    })
    .await;
    let seqs: BTreeSet<u64> =
        events.iter().map(|e| e["properties"]["readingSeq"].as_u64().unwrap()).collect();
    assert_eq!(seqs, (1..=u64::from(readings)).collect(), "each reading once");
    for e in &events {
        assert_eq!(e["actor"]["id"], "cold-1", "{e}");
        assert_eq!(e["properties"]["bootId"], 77);
        assert_eq!(e["properties"]["zone"], "cold-store-2");
        assert_eq!(
            e["properties"]["reading"], e["properties"]["readingSeq"],
            "the device's own field beside the protocol's number"
        );
    }
    events
}

#[tokio::test]
async fn readings_arrive_exactly_once_through_line_noise() {
    let tmp = tempfile::tempdir().unwrap();
    let link = tmp.path().join("sensor");
    let (cloud, _, gateway) = site(tmp.path(), &firmware_source("sensors", &link)).await;
    let _device = device(tmp.path(), &link, 200, &["--garbage", "6", "--seed", "11"]).await;

    let summary = all_acked(tmp.path(), 200).await;
    let events = exactly_once(&cloud, 200).await;
    assert_eq!(events[0]["actor"]["type"], "sensor");
    let health = gateway.health().await;
    let source = &health["sources"][0];
    assert_eq!(source["kind"], "firmware", "{source}");
    assert_eq!(source["accepted_total"], 200, "{source}");
    // Six noise bursts and six damaged frames, each refused at least once
    // (a flipped bit that makes a 0x00 splits a frame in two).
    let rejected = source["rejected_total"].as_u64().unwrap();
    assert!(rejected >= 12, "noise counted: {source}");
    assert_eq!(summary["garbage"], 6);
}

#[tokio::test]
async fn a_gateway_killed_mid_stream_loses_and_repeats_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let link = tmp.path().join("sensor");
    let (cloud, config, gateway) = site(tmp.path(), &firmware_source("sensors", &link)).await;
    let _device = device(tmp.path(), &link, 600, &["--window", "4"]).await;
    eventually("readings flowing", DELIVERY_TIMEOUT, || async {
        let accepted = gateway.health().await["sources"][0]["accepted_total"].as_u64()?;
        (accepted >= 100).then_some(())
    })
    .await;
    // Killed between appends and acks: the device resends what it holds,
    // some of it already stored; the restarted gateway no longer knows.
    gateway.process.kill9().await.unwrap();
    let gateway = Gateway::start(&config, TEST_BOOTSTRAP_KEY).await;
    all_acked(tmp.path(), 600).await;
    wait_drained(&gateway).await;
    exactly_once(&cloud, 600).await;
}

#[tokio::test]
async fn the_bridge_posts_to_a_gateway_and_survives_its_own_restart() {
    let tmp = tempfile::tempdir().unwrap();
    let link = tmp.path().join("sensor");
    let (cloud, _, gateway) = site(tmp.path(), "").await;
    let _device = device(tmp.path(), &link, 300, &["--garbage", "3", "--seed", "5"]).await;
    let link_arg = link.display().to_string();
    let args = ["--port", &link_arg, "--gateway", &gateway.url, "--device-type", "sensor"];
    let bridge = Process::start("opgraph-firmware-bridge", &args, &[], &[]).await.unwrap();
    eventually("readings flowing", DELIVERY_TIMEOUT, || async {
        (cloud.events(EVENT).await.len() >= 50).then_some(())
    })
    .await;
    bridge.kill9().await.unwrap();
    let bridge = Process::start("opgraph-firmware-bridge", &args, &[], &[]).await.unwrap();
    all_acked(tmp.path(), 300).await;
    exactly_once(&cloud, 300).await;
    let (status, lines) = bridge.stop().await.unwrap();
    assert!(status.success(), "{status:?}");
    let summary: Value = lines
        .iter()
        .find_map(|l| l.strip_prefix("summary "))
        .map(|s| serde_json::from_str(s).unwrap())
        .expect("the bridge's summary");
    assert!(summary["readings"].as_u64().unwrap() > 0, "{summary}");
    assert_eq!(summary["refused"], 0, "{summary}");
}

/// Behind a gateway that takes ingest only with a token, the bridge
/// without one stops with an error saying so, its readings left with the
/// device; given the token by its environment, it delivers them all.
#[tokio::test]
async fn the_bridge_brings_the_gateways_ingest_token() {
    let tmp = tempfile::tempdir().unwrap();
    let link = tmp.path().join("sensor");
    let (cloud, config, gateway) = site(tmp.path(), "").await;
    assert!(gateway.process.terminate().await.unwrap().success());
    let token = "cold-room-bridge";
    require_ingest_token(&config, token);
    let gateway = Gateway::start(&config, TEST_BOOTSTRAP_KEY).await;
    let _device = device(tmp.path(), &link, 200, &[]).await;
    let link_arg = link.display().to_string();
    let args = ["--port", &link_arg, "--gateway", &gateway.url, "--device-type", "sensor"];
    let refused = tokio::process::Command::new(binary("opgraph-firmware-bridge").unwrap())
        .args(args)
        .env_remove("OPGRAPH_GATEWAY_INGEST_TOKEN")
        .output();
    let refused = tokio::time::timeout(DELIVERY_TIMEOUT, refused).await.unwrap().unwrap();
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("asks for a token"), "{stderr}");
    assert!(stderr.contains("OPGRAPH_GATEWAY_INGEST_TOKEN"), "{stderr}");
    let env = [("OPGRAPH_GATEWAY_INGEST_TOKEN", token.to_owned())];
    let bridge = Process::start("opgraph-firmware-bridge", &args, &env, &[]).await.unwrap();
    all_acked(tmp.path(), 200).await;
    exactly_once(&cloud, 200).await;
    assert!(bridge.stop().await.unwrap().0.success());
}
