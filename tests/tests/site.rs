//! The README's run command: `opgraph-site` starts a cloud, a gateway and
//! simulated devices; within seconds the cloud holds events from every
//! device kind, and SIGTERM stops it all cleanly.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose

use opgraph_tests::Process;
use opgraph_tests::edge::{DELIVERY_TIMEOUT, eventually};
use serde_json::Value;

#[tokio::test]
async fn the_local_site_carries_events_from_every_device_kind() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("site");
    let ports = opgraph_tests::free_ports(5).unwrap();
    let [http, grpc, gateway, mqtt, modbus] =
        [0, 1, 2, 3, 4].map(|i| format!("127.0.0.1:{}", ports[i]));
    let args = [
        "--dir",
        &dir.display().to_string(),
        "--http",
        &http,
        "--grpc",
        &grpc,
        "--gateway-http",
        &gateway,
        "--mqtt",
        &mqtt,
        "--modbus",
        &modbus,
    ];
    let site = Process::start("opgraph-site", &args, &[], &["http", "serial"]).await.unwrap();
    let key = std::fs::read_to_string(dir.join("api-key")).unwrap();
    let client = reqwest::Client::new();
    for event in [
        "rfid.tag.read",
        "barcode.scanned",
        "sensor.reading",
        "robot.run.started",
        "temperature.measured",
    ] {
        eventually(event, DELIVERY_TIMEOUT, || async {
            let body: Value = client
                .get(format!("http://{http}/api/events?limit=1&event={event}"))
                .bearer_auth(key.trim())
                .send()
                .await
                .ok()?
                .json()
                .await
                .ok()?;
            (!body["events"].as_array()?.is_empty()).then_some(())
        })
        .await;
    }
    let status = site.terminate().await.unwrap();
    assert!(status.success(), "{status}");
}
