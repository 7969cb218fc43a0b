//! Flipped bits, torn writes and garbage files: start-up never refuses,
//! corrupt records are skipped and counted exactly once, everything else
//! is delivered.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly

#[path = "support/buffer.rs"]
mod support;

use std::fs;
use std::path::Path;

use opgraph_gateway::buffer::{Buffer, BufferConfig, FsyncPolicy};
use support::*;

/// 80-byte payloads: 100-byte records, 10 per 1 KiB segment.
const PAYLOAD: usize = 80;
const RECORD: u64 = 100;

/// 45 records in segments 1..=10, 11..=20, 21..=30, 31..=40 and the tail
/// 41..=45, closed cleanly.
async fn backlog(dir: &Path) -> BufferConfig {
    let config = config(dir, FsyncPolicy::Always, 1024, 1 << 20);
    let buffer = open(&config).await;
    for i in 1..=45 {
        buffer.append(vec![payload(i, PAYLOAD)]).await.unwrap();
    }
    buffer.close().await.unwrap();
    let firsts: Vec<u64> = segment_files(dir).iter().map(|(first, _)| *first).collect();
    assert_eq!(firsts, vec![1, 11, 21, 31, 41]);
    config
}

fn segment(dir: &Path, first: u64) -> std::path::PathBuf {
    dir.join(format!("{first:020}.seg"))
}

/// Offset of record `seq` in the segment starting at `first`.
fn at(first: u64, seq: u64) -> u64 {
    (seq - first) * RECORD
}

fn all_but(skipped: &[u64], last: u64) -> Vec<u64> {
    (1..=last).filter(|s| !skipped.contains(s)).collect()
}

#[tokio::test]
async fn flipped_bytes_in_old_segments_and_the_tail() {
    let dir = tempfile::tempdir().unwrap();
    let config = backlog(dir.path()).await;
    flip(&segment(dir.path(), 11), at(11, 15) + 25); // payload
    flip(&segment(dir.path(), 21), at(21, 27) + 9); // length field
    flip(&segment(dir.path(), 31), at(31, 33)); // magic
    flip(&segment(dir.path(), 41), at(41, 43) + 14); // sequence field, in the tail

    let buffer = open(&config).await;
    let stats = buffer.stats();
    assert_eq!(stats.corrupt_skipped_total, 1, "start-up checks the tail only");
    assert_eq!(stats.next_seq, 46);

    let records = read_all(&buffer, 0).await;
    assert_eq!(seqs(&records), all_but(&[15, 27, 33, 43], 45));
    for record in &records {
        assert_eq!(record.payload, payload(record.seq, PAYLOAD));
    }
    assert_eq!(buffer.stats().corrupt_skipped_total, 4);

    // Redelivery reads the same corrupt records again: counted once.
    assert_eq!(read_all(&buffer, 0).await.len(), records.len());
    assert_eq!(seqs(&buffer.read(14, 2, usize::MAX).await.unwrap()), vec![14, 16]);
    assert_eq!(buffer.stats().corrupt_skipped_total, 4);
    assert_eq!(buffer.append(vec![payload(46, 1)]).await.unwrap(), 46..=46);
    assert!(!buffer.stats().degraded);
}

#[tokio::test]
async fn corrupt_last_record_keeps_its_sequence_number_used() {
    let dir = tempfile::tempdir().unwrap();
    let config = backlog(dir.path()).await;
    // Complete on disk but failing its checksum: it was durable and may
    // have been sent, so 45 must never be given to another record.
    flip(&segment(dir.path(), 41), at(41, 45) + 50);
    let buffer = open(&config).await;
    assert_eq!(buffer.stats().corrupt_skipped_total, 1);
    assert_eq!(buffer.append(vec![payload(46, PAYLOAD)]).await.unwrap(), 46..=46);
    let records = read_all(&buffer, 41).await;
    assert_eq!(seqs(&records), vec![41, 42, 43, 44, 46]);
    assert_eq!(buffer.stats().corrupt_skipped_total, 1);
}

#[tokio::test]
async fn torn_last_write_is_cut_and_its_number_reused() {
    let dir = tempfile::tempdir().unwrap();
    let config = backlog(dir.path()).await;
    // The last append never completed (so it never returned).
    let tail = segment(dir.path(), 41);
    let len = fs::metadata(&tail).unwrap().len();
    fs::OpenOptions::new().write(true).open(&tail).unwrap().set_len(len - 30).unwrap();
    let buffer = open(&config).await;
    let stats = buffer.stats();
    assert_eq!((stats.next_seq, stats.corrupt_skipped_total), (45, 0));
    assert_eq!(fs::metadata(&tail).unwrap().len(), 4 * RECORD, "cut back to the last record");
    assert_eq!(buffer.append(vec![payload(45, PAYLOAD)]).await.unwrap(), 45..=45);
    assert_eq!(seqs(&read_all(&buffer, 0).await), (1..=45).collect::<Vec<_>>());
}

#[tokio::test]
async fn garbage_segment_garbage_cursor_and_stray_files() {
    let dir = tempfile::tempdir().unwrap();
    let config = backlog(dir.path()).await;
    {
        let buffer = open(&config).await;
        buffer.ack(5).await.unwrap();
        buffer.close().await.unwrap();
    }
    // A whole segment overwritten with noise, the cursor with garbage, and
    // files that are not ours.
    let noise: Vec<u8> =
        (0..1000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    fs::write(segment(dir.path(), 21), noise).unwrap();
    fs::write(dir.path().join("cursor"), b"not a cursor at all").unwrap();
    fs::write(dir.path().join("notes.txt"), b"hello").unwrap();
    fs::write(dir.path().join("42.seg"), b"misnamed").unwrap();

    let buffer = open(&config).await;
    let stats = buffer.stats();
    // Without a cursor, everything stored is delivered again (the cloud
    // drops duplicates), nothing is lost.
    assert_eq!((stats.first_unacked_seq, stats.next_seq), (1, 46));
    let records = read_all(&buffer, 0).await;
    assert_eq!(seqs(&records), all_but(&(21..=30).collect::<Vec<_>>(), 45));
    assert_eq!(buffer.stats().corrupt_skipped_total, 10);
    assert!(dir.path().join("notes.txt").exists());
}

#[tokio::test]
async fn tail_that_is_all_garbage_starts_empty_without_refusing() {
    let dir = tempfile::tempdir().unwrap();
    let config = backlog(dir.path()).await;
    {
        let buffer = open(&config).await;
        buffer.ack(44).await.unwrap(); // the cursor now records next = 46
        buffer.close().await.unwrap();
    }
    fs::write(segment(dir.path(), 41), vec![0xA7u8; 700]).unwrap();
    let buffer = open(&config).await;
    assert_eq!(buffer.stats().corrupt_skipped_total, 0, "45 counts once read");
    assert!(read_all(&buffer, 0).await.is_empty());
    assert_eq!(buffer.stats().corrupt_skipped_total, 1);
    // The cursor remembers that 45 was handed out.
    assert_eq!(buffer.append(vec![payload(46, 1)]).await.unwrap(), 46..=46);
}
