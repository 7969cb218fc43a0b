//! Start-up cost does not depend on the backlog: only the tail segment is
//! read at open; older segments are checked when a reader reaches them.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly

#[path = "support/buffer.rs"]
mod support;

use std::fs::{self, File};

use opgraph_gateway::buffer::{Buffer, FsyncPolicy};
use support::*;

const GIB: u64 = 1 << 30;

fn rss_bytes() -> Option<u64> {
    let status = fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[tokio::test]
async fn ten_gib_backlog_opens_without_reading_it() {
    let dir = tempfile::tempdir().unwrap();
    // Ten 1 GiB segments (sparse files: no disk used). Their content is
    // zeros, so reading any of them would count millions of corrupt
    // records; the tail is empty and valid.
    for i in 0..10u64 {
        let file =
            File::create(dir.path().join(format!("{:020}.seg", 1 + i * 10_000_000))).unwrap();
        file.set_len(GIB).unwrap();
    }
    let tail = 100_000_001u64;
    File::create(dir.path().join(format!("{tail:020}.seg"))).unwrap();
    let config = config(dir.path(), FsyncPolicy::Batch, GIB, 20 * GIB);

    let before = rss_bytes();
    let buffer = open(&config).await;
    let stats = buffer.stats();
    assert_eq!(stats.corrupt_skipped_total, 0, "no old segment was read");
    assert_eq!(stats.next_seq, tail);
    assert_eq!(stats.first_unacked_seq, 1);
    assert_eq!(stats.pending_bytes, 10 * GIB);

    let range = buffer.append(vec![payload(1, 100); 3]).await.unwrap();
    assert_eq!(range, tail..=tail + 2);
    drop(buffer);

    let buffer = open(&config).await;
    assert_eq!(buffer.stats().corrupt_skipped_total, 0);
    // Sending resumes at once from the tail's records.
    assert_eq!(
        seqs(&buffer.read(tail, 10, usize::MAX).await.unwrap()),
        vec![tail, tail + 1, tail + 2]
    );
    if let (Some(before), Some(after)) = (before, rss_bytes()) {
        assert!(after.saturating_sub(before) < 256 << 20, "memory grew from {before} to {after}");
    }

    // Acknowledging deletes the old segments without reading them.
    buffer.ack(tail - 1).await.unwrap();
    let stats = buffer.stats();
    assert_eq!(stats.corrupt_skipped_total, 0);
    assert!(stats.pending_bytes < 1024, "{stats:?}");
    assert_eq!(segment_files(dir.path()).len(), 1);
}

#[tokio::test]
async fn corruption_in_an_early_segment_is_found_only_when_read() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), FsyncPolicy::Never, 1024, 64 << 20);
    let buffer = open(&config).await;
    // 3000 records, 300 segments of 10 records.
    for i in 0..300u64 {
        let records = (1..=10).map(|j| payload(i * 10 + j, 80)).collect();
        buffer.append(records).await.unwrap();
    }
    buffer.close().await.unwrap();
    drop(buffer);
    let segments = segment_files(dir.path());
    assert_eq!(segments.len(), 300);
    flip(&segments[1].1, 130); // record 12

    let buffer = open(&config).await;
    let stats = buffer.stats();
    assert_eq!(stats.corrupt_skipped_total, 0, "open did not read segment 2");
    assert_eq!((stats.first_unacked_seq, stats.next_seq), (1, 3001));
    let records = read_all(&buffer, 0).await;
    assert_eq!(records.len(), 2999);
    assert_eq!(buffer.stats().corrupt_skipped_total, 1);
}

/// One gateway per buffer directory: a second open while the first buffer
/// lives is refused with a reason, and the directory is free again once
/// the first is gone (dropped here; the kernel releases it on a crash).
#[tokio::test]
async fn a_buffer_directory_is_held_by_one_buffer_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), FsyncPolicy::Batch, 1 << 20, 64 << 20);
    let first = open(&config).await;
    let second = opgraph_gateway::buffer::LogBuffer::open(config.clone()).await;
    let err = second.err().expect("a second buffer on the same directory").to_string();
    assert!(err.contains("in use by another process"), "{err}");
    assert!(err.contains(&dir.path().display().to_string()), "{err}");
    drop(first);
    let again = open(&config).await;
    assert_eq!(again.stats().next_seq, 1);
}
