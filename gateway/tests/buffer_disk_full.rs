//! A real full disk: the buffer on a small tmpfs mounted by the test.
//! Needs root (mount); skips with a printed reason otherwise.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly

#[path = "support/buffer.rs"]
mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use opgraph_gateway::Error;
use opgraph_gateway::buffer::{Buffer, BufferConfig, FsyncPolicy, OverflowPolicy};
use support::*;

const PAYLOAD: usize = 1000;

/// A size-limited tmpfs, unmounted on drop.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(size: &str) -> Result<Tmpfs, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let output = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .output()
            .map_err(|e| format!("cannot run mount: {e}"))?;
        if !output.status.success() {
            return Err(format!(
                "mount failed: {}",
                String::from_utf8_lossy(&output.stderr).trim()
            ));
        }
        Ok(Tmpfs { dir })
    }

    fn path(&self) -> PathBuf {
        self.dir.path().join("buffer")
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.dir.path()).status();
    }
}

fn small_fs(size: &str) -> Option<Tmpfs> {
    match Tmpfs::mount(size) {
        Ok(fs) => Some(fs),
        Err(reason) => {
            println!("skipping disk-full test: {reason} (needs root to mount a tmpfs)");
            None
        }
    }
}

fn full_disk_config(dir: &Path, overflow: OverflowPolicy) -> BufferConfig {
    let mut config = config(dir, FsyncPolicy::Batch, 16 * 1024, 64 << 20);
    config.overflow = overflow;
    config.io_error_wait = Duration::from_secs(1);
    config
}

#[tokio::test]
async fn block_degrades_fails_retryably_and_recovers_when_space_returns() {
    let Some(fs) = small_fs("256k") else { return };
    let config = full_disk_config(&fs.path(), OverflowPolicy::Block);
    let buffer = Arc::new(open(&config).await);

    let mut stored = 0u64;
    let error = loop {
        match within("append", buffer.append(vec![payload(stored + 1, PAYLOAD)])).await {
            Ok(range) => {
                stored += 1;
                assert_eq!(range, stored..=stored);
                assert!(stored < 1000, "the 256k file system never filled up");
            }
            Err(e) => break e,
        }
    };
    assert!(matches!(error, Error::NotDurable { .. }), "{error}");
    assert!(error.retryable());
    let stats = buffer.stats();
    assert!(stats.degraded, "{stats:?}");
    assert!(stats.last_error.as_deref().unwrap_or("").contains("space"), "{stats:?}");
    assert!(stats.io_errors_total > 0);
    assert_eq!(stats.dropped_total, 0, "block never drops");
    assert_eq!(stats.next_seq, stored + 1, "the failed append left nothing behind");
    // Nothing stored was damaged.
    let records = read_all(&buffer, 0).await;
    assert_eq!(seqs(&records), (1..=stored).collect::<Vec<_>>());
    assert!(records.iter().all(|r| r.payload == payload(r.seq, PAYLOAD)));

    // An append waiting on the full disk completes once space returns.
    let waiting = tokio::spawn({
        let buffer = Arc::clone(&buffer);
        async move { buffer.append(vec![payload(stored + 1, PAYLOAD)]).await }
    });
    buffer.ack(stored / 2).await.unwrap();
    let range = within("append after space returned", waiting).await.unwrap().unwrap();
    assert_eq!(range, stored + 1..=stored + 1);
    assert!(!buffer.stats().degraded, "{:?}", buffer.stats());

    within("close", buffer.close()).await.unwrap();
    drop(buffer);
    let buffer = open(&config).await;
    let records = read_all(&buffer, 0).await;
    assert_eq!(seqs(&records), (stored / 2 + 1..=stored + 1).collect::<Vec<_>>());
    assert!(records.iter().all(|r| r.payload == payload(r.seq, PAYLOAD)));
    assert_eq!(buffer.stats().corrupt_skipped_total, 0);
}

#[tokio::test]
async fn drop_oldest_frees_space_on_a_full_disk() {
    let Some(fs) = small_fs("128k") else { return };
    let config = full_disk_config(&fs.path(), OverflowPolicy::DropOldest);
    let buffer = open(&config).await;
    for i in 1..=300 {
        let range = within("append", buffer.append(vec![payload(i, PAYLOAD)])).await;
        assert_eq!(range.unwrap(), i..=i, "drop_oldest keeps accepting");
    }
    let stats = buffer.stats();
    assert!(stats.io_errors_total > 0, "the disk did fill up: {stats:?}");
    assert!(!stats.degraded, "recovered by dropping: {stats:?}");
    let records = read_all(&buffer, 0).await;
    let first = records[0].seq;
    assert_eq!(seqs(&records), (first..=300).collect::<Vec<_>>());
    assert_eq!(stats.dropped_total + records.len() as u64, 300, "every drop counted");
    assert!(records.iter().all(|r| r.payload == payload(r.seq, PAYLOAD)));

    drop(buffer);
    let buffer = open(&config).await;
    assert_eq!(seqs(&read_all(&buffer, 0).await), (first..=300).collect::<Vec<_>>());
    assert_eq!(buffer.stats().corrupt_skipped_total, 0);
}
