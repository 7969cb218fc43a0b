//! Kill -9 during heavy concurrent appends: after reopening, every append
//! that returned is there with its payload, and numbers are never reused.
//!
//! The appender runs in a child process (this test binary re-executed with
//! `OPGRAPH_CRASH_DIR` set) that prints each returned range; the parent
//! kills it at a pseudo-random moment. A process kill keeps the page cache,
//! so this checks torn writes and recovery, not fsync (see the fault
//! injection tests for that).

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly

#[path = "support/buffer.rs"]
mod support;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;

use opgraph_gateway::buffer::{Buffer, FsyncPolicy};
use support::*;

const DIR_VAR: &str = "OPGRAPH_CRASH_DIR";
const ROUNDS: u64 = 8;
const TASKS: u64 = 4;

fn record_payload(tag: u64, k: u64) -> bytes::Bytes {
    payload(tag * 16 + k, 20 + ((tag + k) % 7) as usize * 30)
}

/// The child: appends until killed, printing `first last tag` per append.
#[test]
fn crash_child_appender() {
    let Ok(dir) = std::env::var(DIR_VAR) else { return };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async move {
        let config = config(std::path::Path::new(&dir), FsyncPolicy::Batch, 4096, 64 << 20);
        let buffer = Arc::new(open(&config).await);
        let tasks: Vec<_> = (0..TASKS)
            .map(|task| {
                let buffer = Arc::clone(&buffer);
                tokio::spawn(async move {
                    for i in 0u64.. {
                        let tag = (std::process::id() as u64) << 32 | task << 24 | i;
                        let count = 1 + (i % 4);
                        let records = (0..count).map(|k| record_payload(tag, k)).collect();
                        let range = buffer.append(records).await.unwrap();
                        println!("{} {} {tag}", range.start(), range.end());
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
    });
}

#[tokio::test]
async fn kill_during_appends_loses_nothing_that_returned() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), FsyncPolicy::Batch, 4096, 64 << 20);
    let mut expected: BTreeMap<u64, bytes::Bytes> = BTreeMap::new();
    let mut rng = 0x9E37_79B9_7F4A_7C15u64;
    for round in 0..ROUNDS {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let kill_after = 20 + rng % 400;
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["crash_child_appender", "--exact", "--nocapture", "--test-threads=1"])
            .env(DIR_VAR, dir.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let lines = tokio::task::spawn_blocking(move || {
            let mut lines = Vec::new();
            let mut reader = BufReader::new(stdout);
            let mut line = String::new();
            while reader.read_line(&mut line).unwrap_or(0) > 0 {
                if line.ends_with('\n') {
                    lines.push(line.clone());
                    if lines.len() as u64 == kill_after {
                        // SIGKILL mid-flight; what was printed returned.
                        child.kill().unwrap();
                    }
                }
                line.clear();
            }
            child.wait().unwrap();
            lines
        });
        let lines = within("child appender", lines).await.unwrap();
        assert!(lines.len() as u64 >= kill_after, "round {round}: child died early");

        for line in lines {
            let mut parts = line.split_whitespace().map(|p| p.parse::<u64>());
            let (Some(Ok(first)), Some(Ok(last)), Some(Ok(tag))) =
                (parts.next(), parts.next(), parts.next())
            else {
                continue; // the test harness's own output
            };
            for seq in first..=last {
                let previous = expected.insert(seq, record_payload(tag, seq - first));
                assert!(previous.is_none(), "round {round}: sequence {seq} given out twice");
            }
        }

        let buffer = open(&config).await;
        let stats = buffer.stats();
        let last_returned = *expected.keys().next_back().unwrap();
        assert!(stats.next_seq > last_returned, "round {round}: {stats:?}");
        let stored: BTreeMap<u64, bytes::Bytes> =
            read_all(&buffer, 0).await.into_iter().map(|r| (r.seq, r.payload)).collect();
        for (seq, payload) in expected.range(stats.first_unacked_seq..) {
            assert_eq!(stored.get(seq), Some(payload), "round {round}: returned record {seq} lost");
        }
        assert_eq!(
            stored.keys().copied().collect::<Vec<_>>(),
            (stats.first_unacked_seq..stats.next_seq).collect::<Vec<_>>(),
            "round {round}: no gaps"
        );
        assert_eq!(stats.corrupt_skipped_total, 0, "round {round}");
        // Records that completed but were not printed before the kill stay
        // stored and keep their numbers; the next round must not reuse them.
        for (seq, payload) in stored {
            expected.entry(seq).or_insert(payload);
        }
        // Acknowledge about half of what is pending, as an uplink would.
        let pending = stats.next_seq - stats.first_unacked_seq;
        if pending > 1 {
            buffer.ack(stats.first_unacked_seq + pending / 2).await.unwrap();
        }
        buffer.close().await.unwrap();
    }
}
