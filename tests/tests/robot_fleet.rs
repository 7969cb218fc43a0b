//! Robot fleets end to end: `opgraph-sim robots` runs missions and reports
//! over MQTT to the gateway's embedded broker, in the topic convention of
//! docs/sources.md; the gateway's rules turn runs into `robot.run.*`
//! events keyed by run id (`traceId`), faults into `robot.fault`, and
//! throttle telemetry. The cloud's API is checked against exactly what the
//! simulator says it sent.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose

use std::collections::BTreeSet;
use std::time::Duration;

use opgraph_tests::edge::*;
use opgraph_tests::{TEST_BOOTSTRAP_KEY, binary};
use serde_json::Value;

/// The embedded broker and a source with the convention's rules.
fn sources() -> String {
    format!(
        "[sources.mqtt_broker]\nlisten = \"127.0.0.1:0\"\n\n[[sources.mqtt]]\nname = \"fleet\"\n\
         broker = \"embedded\"\n{}",
        opgraph_simulators::robots::GATEWAY_RULES
    )
}

#[tokio::test]
async fn a_fleets_runs_faults_and_throttled_telemetry_arrive() {
    let tmp = tempfile::tempdir().unwrap();
    let (cloud, config) = grpc_site(tmp.path(), &sources()).await;
    let gateway = Gateway::start(&config, TEST_BOOTSTRAP_KEY).await;
    let broker = gateway.process.addrs["mqtt"].clone();
    eventually("the fleet source subscribed", DELIVERY_TIMEOUT, || async {
        (gateway.health().await["sources"][0]["connected"] == true).then_some(())
    })
    .await;

    let args = ["robots", "--broker", &broker, "--robots", "3", "--missions", "3"];
    let args = [&args[..], &["--fail-rate", "0.4", "--speed", "8", "--seed", "21"]].concat();
    // Misbehaviour: messages that are not JSON, and amr-02's clock an hour behind.
    let args = [&args[..], &["--malformed", "3", "--skewed-robots", "1", "--skew", "1h"]].concat();
    let output = tokio::process::Command::new(binary("opgraph-sim").unwrap())
        .args(&args)
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(Duration::from_secs(120), output).await.unwrap().unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let summary: Value =
        serde_json::from_str(stdout.lines().find_map(|l| l.strip_prefix("summary ")).unwrap())
            .unwrap();
    assert_eq!(summary["acked"], summary["sent"], "{summary}");
    let n = |k: &str| summary[k].as_u64().unwrap() as usize;
    assert!(n("failed") > 0 && n("completed") > 0, "both outcomes: {summary}");

    let expect = [
        ("robot.run.started", n("runs")),
        ("robot.run.step", n("steps")),
        ("robot.run.completed", n("completed")),
        ("robot.run.failed", n("failed")),
        ("robot.fault", n("faults")),
    ];
    for (event, count) in expect {
        eventually(event, DELIVERY_TIMEOUT, || async {
            let stored = cloud.events(event).await.len();
            assert!(stored <= count, "{event}: {stored} stored, {count} sent");
            (stored == count).then_some(())
        })
        .await;
    }
    // Every run that started ended, under the same trace id.
    let trace = |events: Vec<Value>| -> BTreeSet<String> {
        events.iter().map(|e| e["traceId"].as_str().unwrap().to_owned()).collect()
    };
    let started = trace(cloud.events("robot.run.started").await);
    let mut ended = trace(cloud.events("robot.run.completed").await);
    ended.extend(trace(cloud.events("robot.run.failed").await));
    assert_eq!(started, ended);
    assert_eq!(started.len(), n("runs"));
    let failed = cloud.events("robot.run.failed").await;
    assert!(failed.iter().all(|e| e["properties"]["error"] == "E-BLOCKED"), "{failed:?}");
    assert_eq!(trace(cloud.events("robot.fault").await), trace(failed));

    // Telemetry: every message received, most held back, the rest stored.
    let health = eventually("all telemetry received", DELIVERY_TIMEOUT, || async {
        let health = gateway.health().await;
        let source = &health["sources"][0];
        (source["received_total"] == summary["sent"]).then_some(health)
    })
    .await;
    let throttled = health["sources"][0]["throttled_total"].as_u64().unwrap() as usize;
    let stored = eventually("telemetry stored", DELIVERY_TIMEOUT, || async {
        let stored = cloud.events("robot.telemetry").await.len();
        (stored + throttled == n("telemetry")).then_some(stored)
    })
    .await;
    assert!(stored >= 3, "at least the first of each robot: {stored}");
    assert!(throttled > stored, "most telemetry is held back: {throttled} vs {stored}");
    let source = &health["sources"][0];
    assert_eq!(source["rejected"]["invalid_json"], 3, "{health}");
    assert_eq!(summary["malformed"], 3, "{summary}");
    assert!(source["clock_skew_total"].as_u64().unwrap() >= 3, "{health}");
    // The wrong clock's runs keep its time beside the gateway's.
    for e in cloud.events("robot.run.started").await {
        let skewed = e["actor"]["id"] == "amr-02";
        assert_eq!(e["context"]["deviceTimestamp"].is_i64(), skewed, "{e}");
        if skewed {
            let behind = e["timestamp"].as_i64().unwrap()
                - e["context"]["deviceTimestamp"].as_i64().unwrap();
            assert!(behind > 3_000_000, "{e}");
        }
    }
    let one = &cloud.events("robot.telemetry").await[0];
    assert!(one["properties"]["battery"].is_number(), "{one}");
    assert_eq!(one["actor"]["type"], "robot");
    assert!(gateway.process.terminate().await.unwrap().success());
}
