//! The gateway's buffer under disk faults, end to end: a full disk (a
//! size-limited tmpfs the test mounts over the buffer directory) under each
//! overflow policy, and bytes flipped in a segment file between runs.
//!
//! In every case the cloud is down while the fault happens (a first start
//! makes its receiver certificate and picks its port, as an outage would
//! find it), then comes back, and the test checks what it holds against
//! what the gateway acknowledged and what it counted as lost.
//!
//! Mounting needs root (CAP_SYS_ADMIN), which the test machines and CI
//! have; elsewhere the disk-full tests say so on stderr and pass without
//! running, rather than fail on a missing privilege.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use opgraph_tests::TEST_BOOTSTRAP_KEY;
use opgraph_tests::edge::{
    CloudProc, DELIVERY_TIMEOUT, Gateway, Transport, eventually, gateway_config_with, wait_drained,
};
use reqwest::StatusCode;
use serde_json::{Value, json};

/// A tmpfs of `size` mounted on `dir` for the life of the value.
struct Tmpfs {
    dir: PathBuf,
}

impl Tmpfs {
    /// `None` when this machine does not let the test mount.
    fn mount(dir: &Path, size: &str) -> Option<Tmpfs> {
        std::fs::create_dir_all(dir).unwrap();
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .status();
        match status {
            Ok(s) if s.success() => Some(Tmpfs { dir: dir.to_path_buf() }),
            other => {
                eprintln!("SKIPPED: cannot mount a tmpfs on {} ({other:?})", dir.display());
                None
            }
        }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        // Lazy: the gateway may still hold files open while it is dropped.
        let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
    }
}

/// A stopped cloud (its port and certificate known) and a gateway config
/// pointing at it, with `buffer` settings.
async fn outage(tmp: &Path, buffer: &str) -> (PathBuf, String, PathBuf, PathBuf) {
    let cloud_dir = tmp.join("cloud");
    let cloud = CloudProc::start(&cloud_dir, "127.0.0.1:0", "off").await;
    let grpc = cloud.receiver(Transport::Grpc);
    let cert = cloud.cert();
    assert!(cloud.process.terminate().await.unwrap().success());
    let gw_dir = tmp.join("gateway");
    let config = gateway_config_with(&gw_dir, Transport::Grpc, &grpc, &cert, "", buffer);
    (cloud_dir, grpc, cert, config)
}

/// One body of 50 events named `event`, numbered from `from` (in the
/// properties and the `messageId`, by which a retried body is recognised).
fn body(event: &str, from: usize) -> Value {
    let batch: Vec<Value> = (from..from + 50)
        .map(|i| {
            json!({"event": event, "messageId": format!("m-{i}"), "actor": "line-7", "properties": {"i": i}})
        })
        .collect();
    json!({ "batch": batch })
}

/// Posts one body; the acknowledged ids, or the refusal's status.
async fn post(gateway: &Gateway, body: &Value) -> Result<Vec<String>, StatusCode> {
    let response = reqwest::Client::new()
        .post(format!("{}/ingest", gateway.url))
        .json(body)
        .send()
        .await
        .unwrap();
    if response.status() != StatusCode::ACCEPTED {
        return Err(response.status());
    }
    let answer: Value = response.json().await.unwrap();
    Ok(answer["ids"].as_array().unwrap().iter().map(|v| v.as_str().unwrap().to_owned()).collect())
}

fn free_bytes(dir: &Path) -> u64 {
    let out = Command::new("df").args(["--output=avail", "-B1"]).arg(dir).output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    text.lines().nth(1).unwrap().trim().parse().unwrap()
}

/// `block`: once the disk is full the gateway refuses new events with 503
/// and reports itself degraded, keeps running and keeps what it had
/// acknowledged; when space is freed it accepts again by itself. The
/// producer retries the refused body, as a careful one does (a prefix of a
/// refused append may have been stored: retrying may repeat, never lose),
/// and the cloud ends up with every message once.
#[tokio::test]
async fn full_disk_under_block_refuses_then_recovers_without_loss() {
    let tmp = tempfile::tempdir().unwrap();
    let buffer = r#"
segment_bytes = "16KiB"
overflow = "block"
io_error_wait = "300ms"
"#;
    let (cloud_dir, grpc, _cert, config) = outage(tmp.path(), buffer).await;
    let Some(_mount) = Tmpfs::mount(&tmp.path().join("gateway/buffer"), "512k") else { return };
    let gateway = Gateway::start(&config, TEST_BOOTSTRAP_KEY).await;

    // Leave the buffer about 64 KiB: a few hundred events.
    let filler = tmp.path().join("gateway/buffer/filler");
    let room = free_bytes(filler.parent().unwrap());
    std::fs::write(&filler, vec![0u8; (room - (64 << 10)) as usize]).unwrap();

    let mut acked = 0;
    let mut refused = None;
    for n in 0..200 {
        match post(&gateway, &body("bin.scanned", n * 50)).await {
            Ok(ids) => acked += ids.len(),
            Err(status) => {
                refused = Some((n, status));
                break;
            }
        }
    }
    let Some((refused, status)) = refused else { panic!("the disk never filled") };
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "the full disk is refused");
    assert!(acked > 0, "some events fit before the disk filled");
    let health = gateway.health().await;
    assert_eq!(health["buffer"]["degraded"], true, "{health}");
    assert!(health["buffer"]["io_errors_total"].as_u64().unwrap() > 0, "{health}");
    assert!(health["buffer"]["last_error"].as_str().unwrap().contains("No space"), "{health}");
    assert_eq!(health["buffer"]["dropped_total"], 0, "block never drops: {health}");
    assert!(health["buffer"]["pending_records"].as_u64().unwrap() >= acked as u64, "{health}");

    // The operator frees space; the refused body goes in without a restart.
    std::fs::remove_file(&filler).unwrap();
    eventually("appends to succeed again", DELIVERY_TIMEOUT, || async {
        post(&gateway, &body("bin.scanned", refused * 50)).await.ok()
    })
    .await;
    let health = gateway.health().await;
    assert_eq!(health["buffer"]["degraded"], false, "recovered: {health}");

    let cloud = CloudProc::start(&cloud_dir, &grpc, "off").await;
    wait_drained(&gateway).await;
    let expected: Vec<String> = (0..(refused + 1) * 50).map(|i| format!("m-{i}")).collect();
    let mut stored = message_ids(&cloud, "bin.scanned").await;
    stored.sort_by_key(|m| m[2..].parse::<usize>().unwrap());
    assert_eq!(stored, expected, "every message once");
    assert!(gateway.process.terminate().await.unwrap().success());
}

/// The `messageId`s of the (at most 1000) events named `event` the cloud
/// holds, duplicates included.
async fn message_ids(cloud: &CloudProc, event: &str) -> Vec<String> {
    let events = cloud.events(event).await;
    events.iter().map(|e| e["messageId"].as_str().unwrap().to_owned()).collect()
}

/// `drop_oldest`: a full disk never refuses an event; the oldest records
/// make room, every one of them counted, and the cloud receives exactly
/// the rest, the newest among them.
#[tokio::test]
async fn full_disk_under_drop_oldest_counts_every_drop() {
    let tmp = tempfile::tempdir().unwrap();
    let buffer = r#"
segment_bytes = "4KiB"
overflow = "drop_oldest"
io_error_wait = "300ms"
"#;
    let (cloud_dir, grpc, _cert, config) = outage(tmp.path(), buffer).await;
    let Some(_mount) = Tmpfs::mount(&tmp.path().join("gateway/buffer"), "64k") else { return };
    let gateway = Gateway::start(&config, TEST_BOOTSTRAP_KEY).await;

    let mut acked = Vec::new();
    let mut last = Vec::new();
    for n in 0..40 {
        last =
            post(&gateway, &body("bin.scanned", n * 50)).await.expect("drop_oldest never refuses");
        acked.extend(last.iter().cloned());
    }
    let health = gateway.health().await;
    let dropped = health["buffer"]["dropped_total"].as_u64().unwrap();
    assert!(dropped > 0, "2,000 events do not fit in 64 KiB: {health}");
    assert_eq!(health["buffer"]["corrupt_skipped_total"], 0, "{health}");
    let kept = acked.len() - dropped as usize;
    assert_eq!(health["buffer"]["pending_records"], kept, "{health}");
    assert!(kept <= 1000, "the check lists at most 1000 events: {kept}");

    let cloud = CloudProc::start(&cloud_dir, &grpc, "off").await;
    wait_drained(&gateway).await;
    let stored = cloud.ids("bin.scanned").await;
    assert_eq!(stored.len(), kept, "the cloud holds what was not dropped");
    let acked: HashSet<String> = acked.into_iter().collect();
    assert!(stored.iter().all(|id| acked.contains(id)), "only acknowledged events");
    let stored: HashSet<String> = stored.into_iter().collect();
    assert!(last.iter().all(|id| stored.contains(id)), "the newest events survive");
    let metrics = gateway.metrics().await;
    assert!(metrics.contains(&format!("buffer_dropped_total {dropped}")), "{metrics}");
    assert!(gateway.process.terminate().await.unwrap().success());
}

/// Bytes flipped in a segment between runs: the gateway starts anyway,
/// counts the records it cannot trust and delivers every other one.
#[tokio::test]
async fn flipped_bytes_in_a_segment_are_skipped_counted_and_the_rest_delivered() {
    let tmp = tempfile::tempdir().unwrap();
    let (cloud_dir, grpc, _cert, config) = outage(tmp.path(), r#"segment_bytes = "4KiB""#).await;
    let gateway = Gateway::start(&config, TEST_BOOTSTRAP_KEY).await;
    let mut acked = Vec::new();
    for n in 0..10 {
        acked.extend(post(&gateway, &body("bin.scanned", n * 50)).await.unwrap());
    }
    assert!(gateway.process.terminate().await.unwrap().success());

    let buffer_dir = tmp.path().join("gateway/buffer");
    let mut segments: Vec<PathBuf> = std::fs::read_dir(&buffer_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "seg"))
        .collect();
    segments.sort();
    assert!(segments.len() >= 3, "500 events span several 4 KiB segments: {segments:?}");
    let victim = &segments[1];
    let mut bytes = std::fs::read(victim).unwrap();
    let middle = bytes.len() / 2;
    for b in &mut bytes[middle..middle + 8] {
        *b ^= 0x5a;
    }
    std::fs::write(victim, bytes).unwrap();

    let gateway = Gateway::start(&config, TEST_BOOTSTRAP_KEY).await;
    let cloud = CloudProc::start(&cloud_dir, &grpc, "off").await;
    let health = wait_drained(&gateway).await;
    let skipped = health["buffer"]["corrupt_skipped_total"].as_u64().unwrap();
    assert!(skipped >= 1, "the damage is counted: {health}");
    assert!(skipped < 50, "only the damaged records are lost: {health}");
    let stored = cloud.ids("bin.scanned").await;
    assert_eq!(stored.len() + skipped as usize, acked.len(), "everything else arrives");
    let acked: HashSet<String> = acked.into_iter().collect();
    assert!(stored.iter().all(|id| acked.contains(id)), "only acknowledged events");
    assert!(gateway.process.terminate().await.unwrap().success());
}
