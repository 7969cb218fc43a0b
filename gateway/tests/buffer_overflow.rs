//! A full buffer (`max_bytes`): `drop_oldest` drops whole segments and
//! counts every record; `block` makes appends wait for acknowledgements and
//! still honours close.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly

#[path = "support/buffer.rs"]
mod support;

use std::sync::Arc;
use std::time::Duration;

use opgraph_gateway::Error;
use opgraph_gateway::buffer::{Buffer, FsyncPolicy, OverflowPolicy};
use support::*;

/// 100-byte records, 10 per 1 KiB segment.
const PAYLOAD: usize = 80;

#[tokio::test]
async fn drop_oldest_counts_every_dropped_record() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(dir.path(), FsyncPolicy::Batch, 1024, 4096);
    config.overflow = OverflowPolicy::DropOldest;
    let buffer = open(&config).await;
    for i in 1..=100 {
        assert_eq!(buffer.append(vec![payload(i, PAYLOAD)]).await.unwrap(), i..=i);
        assert!(buffer.stats().pending_bytes <= 4096);
    }
    let stats = buffer.stats();
    let records = read_all(&buffer, 0).await;
    assert!(stats.dropped_total >= 50, "{stats:?}");
    assert_eq!(stats.dropped_total + records.len() as u64, 100, "never silent");
    // What is left is the newest records, contiguous, up to the last.
    let first = records[0].seq;
    assert_eq!(seqs(&records), (first..=100).collect::<Vec<_>>());
    assert_eq!(stats.first_unacked_seq, first);
    assert_eq!(stats.next_seq, 101);

    // Drops that happened before an acknowledgement: acked records are not
    // counted as dropped.
    buffer.ack(95).await.unwrap();
    for i in 101..=130 {
        buffer.append(vec![payload(i, PAYLOAD)]).await.unwrap();
    }
    let stats = buffer.stats();
    assert_eq!(
        stats.dropped_total + read_all(&buffer, 0).await.len() as u64,
        130 - 95 + (first - 1),
        "{stats:?}"
    );

    // A reopen keeps counting from where the data is.
    drop(buffer);
    let buffer = open(&config).await;
    let records = read_all(&buffer, 0).await;
    assert_eq!(records.last().unwrap().seq, 130);
    assert_eq!(buffer.stats().corrupt_skipped_total, 0);
}

#[tokio::test]
async fn block_waits_for_an_acknowledgement() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), FsyncPolicy::Batch, 1024, 2048);
    let buffer = Arc::new(open(&config).await);
    for i in 1..=20 {
        buffer.append(vec![payload(i, PAYLOAD)]).await.unwrap();
    }
    assert_eq!(buffer.stats().pending_bytes, 2000);

    let mut blocked = tokio::spawn({
        let buffer = Arc::clone(&buffer);
        async move { buffer.append(vec![payload(21, PAYLOAD)]).await }
    });
    // Still waiting a while later (a bounded negative check, not a sync).
    assert!(tokio::time::timeout(Duration::from_millis(200), &mut blocked).await.is_err());
    assert_eq!(buffer.stats().dropped_total, 0);

    // Acknowledging part of a segment frees nothing; a whole one does.
    buffer.ack(5).await.unwrap();
    assert!(tokio::time::timeout(Duration::from_millis(100), &mut blocked).await.is_err());
    buffer.ack(10).await.unwrap();
    let range = within("blocked append", blocked).await.unwrap().unwrap();
    assert_eq!(range, 21..=21);
    assert_eq!(seqs(&read_all(&buffer, 0).await), (11..=21).collect::<Vec<_>>());
}

#[tokio::test]
async fn block_frees_a_fully_acknowledged_tail() {
    // Everything fits in the tail segment: only replacing the tail frees it.
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), FsyncPolicy::Always, 4096, 1024);
    let buffer = Arc::new(open(&config).await);
    for i in 1..=10 {
        buffer.append(vec![payload(i, PAYLOAD)]).await.unwrap();
    }
    let blocked = tokio::spawn({
        let buffer = Arc::clone(&buffer);
        async move { buffer.append(vec![payload(11, PAYLOAD)]).await }
    });
    buffer.ack(10).await.unwrap();
    assert_eq!(within("blocked append", blocked).await.unwrap().unwrap(), 11..=11);
    assert_eq!(seqs(&read_all(&buffer, 0).await), vec![11]);
}

#[tokio::test]
async fn close_releases_blocked_appends() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), FsyncPolicy::Batch, 1024, 1024);
    let buffer = Arc::new(open(&config).await);
    for i in 1..=10 {
        buffer.append(vec![payload(i, PAYLOAD)]).await.unwrap();
    }
    let blocked: Vec<_> = (0..3)
        .map(|_| {
            let buffer = Arc::clone(&buffer);
            tokio::spawn(async move { buffer.append(vec![payload(0, PAYLOAD)]).await })
        })
        .collect();
    within("close", buffer.close()).await.unwrap();
    for task in blocked {
        let result = within("blocked append", task).await.unwrap();
        assert!(matches!(result, Err(Error::Closed)), "{result:?}");
    }
    drop(buffer);
    let buffer = open(&config).await;
    assert_eq!(buffer.stats().next_seq, 11, "nothing of the refused appends stored");
}

#[tokio::test]
async fn cancelled_blocked_append_leaves_no_trace() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), FsyncPolicy::Batch, 1024, 1024);
    let buffer = open(&config).await;
    for i in 1..=10 {
        buffer.append(vec![payload(i, PAYLOAD)]).await.unwrap();
    }
    // Give up waiting for space: nothing reserved, nothing written.
    let gave_up =
        tokio::time::timeout(Duration::from_millis(50), buffer.append(vec![payload(11, PAYLOAD)]))
            .await;
    assert!(gave_up.is_err());
    buffer.ack(10).await.unwrap();
    let range = within("append", buffer.append(vec![payload(11, PAYLOAD)])).await.unwrap();
    assert_eq!(range, 11..=11);
}
