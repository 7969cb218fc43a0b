//! Serial sources end to end over real pseudo-terminals: `opgraph-sim
//! barcode` plays a scanner (GS1, Code 128 and EAN-13 lines, wrong check
//! digits, garbage), is unplugged and plugged in again; an RFID reader
//! speaking the framed binary protocol is played by the test itself on a
//! pty pair. The cloud's API is checked for exact codes and counts, the
//! gateway's health for every rejection.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose

use std::path::Path;

use opgraph_gateway::source::serial::rfid::{TagRead, encode_frame};
use opgraph_tests::edge::*;
use opgraph_tests::{Process, TEST_BOOTSTRAP_KEY};
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;
use tokio_serial::SerialPort;

fn serial_source(name: &str, path: &Path, protocol: &str, extra: &str) -> String {
    format!(
        "\n[[sources.serial]]\nname = \"{name}\"\npath = {path:?}\nprotocol = \"{protocol}\"\n\
         device = {{ type = \"scanner\", id = \"{name}\" }}\nbackoff_initial = \"50ms\"\n\
         backoff_max = \"200ms\"\n{extra}",
        path = path.display().to_string(),
    )
}

async fn source_health(gateway: &Gateway, connected: bool) -> Value {
    eventually("the serial source's state", DELIVERY_TIMEOUT, || async {
        let health = gateway.health().await;
        let source = health["sources"][0].clone();
        (source["connected"] == connected).then_some(source)
    })
    .await
}

/// Starts the scanner simulator, waits for the gateway to open its line,
/// lets it send, and returns the codes it says it sent.
async fn scan(gateway: &Gateway, dir: &Path, link: &Path, seed: &str) -> (Process, Vec<String>) {
    let summary = dir.join(format!("summary-{seed}.json"));
    let args = [
        "barcode",
        "--link",
        &link.display().to_string(),
        "--codes",
        "12",
        "--bad-check",
        "2",
        "--garbage",
        "2",
        "--seed",
        seed,
        "--summary",
        &summary.display().to_string(),
    ];
    let sim = Process::start("opgraph-sim", &args, &[], &["serial"]).await.unwrap();
    source_health(gateway, true).await;
    sim.signal("USR1").await.unwrap();
    let summary: Value = eventually("the scanner's summary", DELIVERY_TIMEOUT, || async {
        let text = std::fs::read_to_string(&summary).ok()?;
        serde_json::from_str(&text).ok()
    })
    .await;
    let codes = summary["codes"].as_array().unwrap().iter().map(|c| c.as_str().unwrap().to_owned());
    (sim, codes.collect())
}

#[tokio::test]
async fn barcode_scanner_codes_arrive_exactly_and_survive_an_unplug() {
    let tmp = tempfile::tempdir().unwrap();
    let link = tmp.path().join("scanner");
    let source = serial_source("dock-1", &link, "barcode", "");
    let (cloud, config) = grpc_site(tmp.path(), &source).await;
    let gateway = Gateway::start(&config, TEST_BOOTSTRAP_KEY).await;
    // No scanner yet: the source waits for the device, it does not fail.
    let waiting = eventually("the missing port reported", DELIVERY_TIMEOUT, || async {
        let source = gateway.health().await["sources"][0].clone();
        source["last_error"].is_string().then_some(source)
    })
    .await;
    assert_eq!(waiting["connected"], false, "{waiting}");
    assert!(waiting["last_error"].as_str().unwrap().contains("scanner"), "{waiting}");

    let (first, mut expected) = scan(&gateway, tmp.path(), &link, "5").await;
    let stored = eventually("the first scans stored", DELIVERY_TIMEOUT, || async {
        let stored = cloud.events("barcode.scanned").await;
        (stored.len() >= expected.len()).then_some(stored)
    })
    .await;
    let mut got: Vec<String> =
        stored.iter().map(|e| e["trackable"]["code"].as_str().unwrap().to_owned()).collect();
    got.sort();
    let mut want = expected.clone();
    want.sort();
    assert_eq!(got, want, "exactly the valid codes");
    let gs1 = stored.iter().find(|e| e["properties"]["symbology"] == "]C1").unwrap();
    let props = &gs1["properties"];
    assert_eq!(
        gs1["trackable"]["code"],
        json!(format!("{}.{}", props["gtin"].as_str().unwrap(), props["serial"].as_str().unwrap()))
    );
    assert!(props["expiry"].as_str().unwrap().starts_with("20"), "{gs1}");
    assert_eq!(props["ais"]["10"], props["batch"], "{gs1}");
    assert_eq!(gs1["actor"], json!({"type": "scanner", "id": "dock-1"}));

    let health = eventually("rejections counted", DELIVERY_TIMEOUT, || async {
        let health = gateway.health().await;
        (health["sources"][0]["rejected_total"] == 4).then_some(health)
    })
    .await;
    let rejected = &health["sources"][0]["rejected"];
    assert_eq!(rejected["bad_check_digit"], 2, "{health}");
    assert_eq!(rejected["not_text"], 2, "{health}");
    // A line is a message received, whatever reads brought it.
    let source = &health["sources"][0];
    let accepted = source["accepted_total"].as_u64().unwrap();
    assert_eq!(source["received_total"].as_u64().unwrap(), accepted + 4, "{health}");

    // Unplugged: the line goes away; plugged in again: reading resumes.
    assert!(first.terminate().await.unwrap().success());
    source_health(&gateway, false).await;
    let (second, more) = scan(&gateway, tmp.path(), &link, "6").await;
    expected.extend(more);
    eventually("the scans after replugging stored", DELIVERY_TIMEOUT, || async {
        let stored = cloud.events("barcode.scanned").await;
        assert!(stored.len() <= expected.len(), "more stored than scanned");
        (stored.len() == expected.len()).then_some(())
    })
    .await;
    assert!(second.terminate().await.unwrap().success());
    assert!(gateway.process.terminate().await.unwrap().success());
}

#[tokio::test]
async fn rfid_frames_are_smoothed_into_one_read_and_one_departure_per_tag() {
    let tmp = tempfile::tempdir().unwrap();
    let link = tmp.path().join("reader");
    let (mut reader, line_end) = tokio_serial::SerialStream::pair().unwrap();
    std::os::unix::fs::symlink(line_end.name().unwrap(), &link).unwrap();
    let source = serial_source(
        "portal-3",
        &link,
        "rfid_binary",
        "dwell = \"200ms\"\ndepart_after = \"800ms\"\n",
    );
    let (cloud, config) = grpc_site(tmp.path(), &source).await;
    let gateway = Gateway::start(&config, TEST_BOOTSTRAP_KEY).await;
    source_health(&gateway, true).await;

    let tags = ["3034F87E5C0000400000012A", "E2801160600002084A5B3C7D"];
    let mut stream = Vec::new();
    for i in 0..10 {
        for (t, epc) in tags.iter().enumerate() {
            let rssi = if i == 6 { -42.0 } else { -60.0 - t as f64 };
            let antenna = if i == 6 { 4 } else { 1 };
            let read = TagRead { epc: (*epc).into(), antenna, rssi, reader_ms: None };
            stream.extend(encode_frame(&read).unwrap());
        }
        stream.extend(b"\x00\xA5noise"); // garbage between frames
    }
    AsyncWriteExt::write_all(&mut reader, &stream).await.unwrap();

    let departed = eventually("both tags departed", DELIVERY_TIMEOUT, || async {
        let departed = cloud.events("rfid.tag.departed").await;
        (departed.len() == 2).then_some(departed)
    })
    .await;
    let reads = cloud.events("rfid.tag.read").await;
    assert_eq!(reads.len(), 2, "one read per visit: {reads:?}");
    for epc in tags {
        let read = reads.iter().find(|e| e["trackable"]["code"] == epc).unwrap();
        assert_eq!(read["properties"]["readCount"], 10, "{read}");
        assert_eq!(read["properties"]["peakRssi"], -42.0, "{read}");
        assert_eq!(read["properties"]["antenna"], 4, "{read}");
        assert_eq!(read["object"], json!({"type": "rfid_tag", "id": epc}));
        let gone = departed.iter().find(|e| e["trackable"]["code"] == epc).unwrap();
        assert_eq!(gone["properties"]["readCount"], 10, "{gone}");
    }
    let health = gateway.health().await;
    assert!(health["sources"][0]["rejected"]["bad_frame"].as_u64().unwrap() >= 1, "{health}");
    assert!(gateway.process.terminate().await.unwrap().success());
}

/// A tag still inside its dwell when the gateway stops gets its read then,
/// not never.
#[tokio::test]
async fn a_read_inside_its_dwell_is_kept_through_a_shutdown() {
    let tmp = tempfile::tempdir().unwrap();
    let link = tmp.path().join("reader");
    let (mut reader, line_end) = tokio_serial::SerialStream::pair().unwrap();
    std::os::unix::fs::symlink(line_end.name().unwrap(), &link).unwrap();
    let source =
        serial_source("dock-1", &link, "rfid_binary", "dwell = \"1h\"\ndepart_after = \"2h\"\n");
    let (cloud, config) = grpc_site(tmp.path(), &source).await;
    let gateway = Gateway::start(&config, TEST_BOOTSTRAP_KEY).await;
    source_health(&gateway, true).await;
    let epc = "3034F87E5C0000400000012A";
    let read = TagRead { epc: epc.into(), antenna: 2, rssi: -50.0, reader_ms: None };
    AsyncWriteExt::write_all(&mut reader, &encode_frame(&read).unwrap()).await.unwrap();
    eventually("the frame read", DELIVERY_TIMEOUT, || async {
        let health = gateway.health().await;
        (health["sources"][0]["received_total"] == 1).then_some(())
    })
    .await;
    assert!(gateway.process.terminate().await.unwrap().success());

    // Whatever the stop did not ship, the next run does.
    let gateway = Gateway::start(&config, TEST_BOOTSTRAP_KEY).await;
    let reads = eventually("the read in the cloud", DELIVERY_TIMEOUT, || async {
        let reads = cloud.events("rfid.tag.read").await;
        (!reads.is_empty()).then_some(reads)
    })
    .await;
    assert_eq!(reads.len(), 1, "{reads:?}");
    assert_eq!(reads[0]["trackable"]["code"], epc);
    assert_eq!(reads[0]["properties"]["readCount"], 1);
    assert!(gateway.process.terminate().await.unwrap().success());
}
