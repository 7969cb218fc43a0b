//! Group commit: many concurrent appenders under `batch` share fsyncs, are
//! all answered, get disjoint consecutive numbers, and everything answered
//! is there after a reopen.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly

#[path = "support/buffer.rs"]
mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use opgraph_gateway::buffer::{Buffer, FsyncPolicy};
use support::*;

const TASKS: u64 = 32;
const APPENDS: u64 = 25;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_appenders_are_all_answered_and_durable() {
    for fsync in [FsyncPolicy::Batch, FsyncPolicy::Always] {
        let dir = tempfile::tempdir().unwrap();
        let mut config = config(dir.path(), fsync, 16 * 1024, 64 << 20);
        config.fsync_interval = Duration::from_millis(5);
        let buffer = Arc::new(open(&config).await);

        let tasks: Vec<_> = (0..TASKS)
            .map(|task| {
                let buffer = Arc::clone(&buffer);
                tokio::spawn(async move {
                    let mut got = Vec::new();
                    for i in 0..APPENDS {
                        let tag = task * 1000 + i;
                        let records = vec![payload(tag, 40); 1 + (i % 3) as usize];
                        let range = buffer.append(records).await.unwrap();
                        got.push((range, tag));
                    }
                    got
                })
            })
            .collect();

        let mut by_seq = BTreeMap::new();
        for task in tasks {
            for (range, tag) in within("appender", task).await.unwrap() {
                for seq in range {
                    assert!(by_seq.insert(seq, tag).is_none(), "{fsync:?}: {seq} given twice");
                }
            }
        }
        let total = by_seq.len() as u64;
        assert_eq!(by_seq.keys().copied().collect::<Vec<_>>(), (1..=total).collect::<Vec<_>>());
        assert_eq!(buffer.stats().appended_total, total);

        // No close: a crash right after the appends returned.
        drop(buffer);
        let buffer = open(&config).await;
        let records = read_all(&buffer, 0).await;
        assert_eq!(records.len() as u64, total, "{fsync:?}");
        for record in records {
            assert_eq!(record.payload, payload(by_seq[&record.seq], 40));
        }
        assert_eq!(buffer.stats().corrupt_skipped_total, 0);
    }
}

/// Under `batch`, an append waits for the interval only while its group
/// may still grow: once nothing more has arrived for `fsync_settle`, it is
/// made durable. With `fsync_settle = "0s"` it waits out the interval (here
/// a minute, ended by closing the buffer).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_that_stopped_growing_does_not_wait_out_the_interval() {
    for settle in [Duration::from_millis(20), Duration::ZERO] {
        let dir = tempfile::tempdir().unwrap();
        let mut config = config(dir.path(), FsyncPolicy::Batch, 4096, 1 << 20);
        config.fsync_interval = Duration::from_secs(60);
        config.fsync_settle = settle;
        let buffer = Arc::new(open(&config).await);
        // No fsync yet: the first append goes at once.
        within("the first append", buffer.append(vec![payload(1, 10)])).await.unwrap();
        let second = tokio::spawn({
            let buffer = Arc::clone(&buffer);
            async move { buffer.append(vec![payload(2, 10)]).await }
        });
        if settle.is_zero() {
            // Nothing to await: the append must still be waiting a while later.
            tokio::time::sleep(Duration::from_millis(300)).await;
            assert!(!second.is_finished(), "answered before the interval without settling");
            within("close", buffer.close()).await.unwrap();
        }
        assert_eq!(within("the second append", second).await.unwrap().unwrap(), 2..=2);
        assert_eq!(buffer.stats().appended_total, 2, "settle {settle:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_wake_on_the_watermark() {
    let dir = tempfile::tempdir().unwrap();
    let buffer = Arc::new(open(&config(dir.path(), FsyncPolicy::Batch, 4096, 1 << 20)).await);
    let mut watermark = buffer.subscribe();
    let reader = tokio::spawn({
        let buffer = Arc::clone(&buffer);
        async move {
            let mut next = 1;
            let mut seen = Vec::new();
            while next <= 50 {
                let batch = buffer.read(next, 16, usize::MAX).await.unwrap();
                if batch.is_empty() {
                    watermark.changed().await.unwrap();
                    continue;
                }
                next = batch.last().unwrap().seq + 1;
                seen.extend(batch.into_iter().map(|r| r.seq));
            }
            seen
        }
    });
    for i in 1..=50 {
        buffer.append(vec![payload(i, 10)]).await.unwrap();
    }
    let seen = within("reader", reader).await.unwrap();
    assert_eq!(seen, (1..=50).collect::<Vec<_>>());
}
