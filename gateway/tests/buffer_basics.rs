//! The log buffer's contract on the happy path and on bad input.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly

#[path = "support/buffer.rs"]
mod support;

use opgraph_gateway::Error;
use opgraph_gateway::buffer::{Buffer, FsyncPolicy};
use support::*;

#[tokio::test]
async fn append_read_ack_reopen_for_every_fsync_policy() {
    for fsync in [FsyncPolicy::Always, FsyncPolicy::Batch, FsyncPolicy::Never] {
        let dir = tempfile::tempdir().unwrap();
        let config = config(dir.path(), fsync, 1024, 1 << 20);
        let buffer = open(&config).await;
        let mut watermark = buffer.subscribe();
        assert_eq!(*watermark.borrow_and_update(), 1);

        let first = buffer.append(vec![payload(1, 10), payload(2, 0)]).await.unwrap();
        assert_eq!(first, 1..=2);
        assert!(watermark.has_changed().unwrap());
        assert_eq!(*watermark.borrow_and_update(), 3);
        for i in 3..=40 {
            assert_eq!(buffer.append(vec![payload(i, 100)]).await.unwrap(), i..=i);
        }
        assert!(segment_files(dir.path()).len() > 3, "{fsync:?}: rolls segments");

        let records = read_all(&buffer, 0).await;
        assert_eq!(seqs(&records), (1..=40).collect::<Vec<_>>());
        assert_eq!(records[0].payload, payload(1, 10));
        assert_eq!(records[1].payload, payload(2, 0));
        assert_eq!(records[39].payload, payload(40, 100));

        // Limits: count, bytes (at least one record).
        assert_eq!(seqs(&buffer.read(5, 3, usize::MAX).await.unwrap()), vec![5, 6, 7]);
        assert_eq!(seqs(&buffer.read(5, 10, 150).await.unwrap()), vec![5, 6]);
        assert_eq!(seqs(&buffer.read(5, 10, 0).await.unwrap()), vec![5]);
        assert!(buffer.read(41, 10, usize::MAX).await.unwrap().is_empty());

        buffer.ack(20).await.unwrap();
        buffer.ack(10).await.unwrap(); // older: no-op
        assert_eq!(seqs(&buffer.read(0, 1, usize::MAX).await.unwrap()), vec![21]);
        let stats = buffer.stats();
        assert_eq!(stats.first_unacked_seq, 21);
        assert_eq!(stats.next_seq, 41);
        assert_eq!(stats.pending_records, 20);
        assert_eq!(stats.appended_total, 40);
        assert_eq!(stats.acked_total, 20);
        assert!(!stats.degraded);
        buffer.close().await.unwrap();
        buffer.close().await.unwrap();
        assert!(matches!(buffer.append(vec![payload(0, 1)]).await, Err(Error::Closed)));
        assert!(matches!(buffer.read(0, 1, 1).await, Err(Error::Closed)));
        drop(buffer);

        let buffer = open(&config).await;
        let stats = buffer.stats();
        assert_eq!((stats.first_unacked_seq, stats.next_seq), (21, 41), "{fsync:?}");
        assert_eq!(seqs(&read_all(&buffer, 0).await), (21..=40).collect::<Vec<_>>());
        assert_eq!(buffer.append(vec![payload(41, 1)]).await.unwrap(), 41..=41);
        // Acknowledging everything frees the segments before the tail.
        buffer.ack(41).await.unwrap();
        assert!(read_all(&buffer, 0).await.is_empty());
        assert!(segment_files(dir.path()).len() <= 2);
        buffer.close().await.unwrap();
    }
}

#[tokio::test]
async fn sequence_numbers_survive_deleting_every_segment() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), FsyncPolicy::Always, 1024, 1 << 20);
    let buffer = open(&config).await;
    buffer.append(vec![payload(1, 300); 9]).await.unwrap();
    buffer.ack(9).await.unwrap();
    drop(buffer);
    for (_, path) in segment_files(dir.path()) {
        std::fs::remove_file(path).unwrap();
    }
    let buffer = open(&config).await;
    assert_eq!(buffer.append(vec![payload(10, 1)]).await.unwrap(), 10..=10);
}

#[tokio::test]
async fn bad_input_is_rejected_and_not_retryable() {
    let dir = tempfile::tempdir().unwrap();
    let buffer = open(&config(dir.path(), FsyncPolicy::Batch, 1024, 4096)).await;
    let cases = [
        buffer.append(Vec::new()).await.unwrap_err(),
        buffer.append(vec![payload(0, 1024)]).await.unwrap_err(),
        buffer.append(vec![payload(0, 1000); 5]).await.unwrap_err(),
        buffer.ack(1).await.unwrap_err(),
    ];
    assert!(matches!(cases[0], Error::EmptyAppend));
    assert!(matches!(cases[1], Error::RecordTooLarge { size: 1044, limit: 1024 }));
    assert!(matches!(cases[2], Error::AppendTooLarge { size: 5100, limit: 4096 }));
    assert!(matches!(cases[3], Error::AckBeyondEnd { seq: 1, last: 0 }));
    assert!(cases.iter().all(|e| !e.retryable()));
    assert_eq!(buffer.stats().next_seq, 1);

    let mut bad = config(dir.path(), FsyncPolicy::Batch, 10, 10);
    bad.dir = Default::default();
    let Err(Error::InvalidConfig { problems }) =
        opgraph_gateway::buffer::LogBuffer::open(bad).await
    else {
        panic!("expected InvalidConfig");
    };
    assert_eq!(problems.len(), 3, "{problems:?}");
}

#[tokio::test]
async fn records_larger_than_the_read_window_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), FsyncPolicy::Batch, 4 << 20, 64 << 20);
    let buffer = open(&config).await;
    let big = payload(7, 3 << 20);
    buffer.append(vec![big.clone(), payload(8, 5)]).await.unwrap();
    drop(buffer);
    let buffer = open(&config).await;
    let records = read_all(&buffer, 1).await;
    assert_eq!(seqs(&records), vec![1, 2]);
    assert_eq!(records[0].payload, big);
}
