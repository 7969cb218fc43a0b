//! The durable buffer between sources and the uplink.
//!
//! Sources [`Buffer::append`] encoded events and acknowledge their device
//! only once the append returned (the records are then durable per the
//! [`FsyncPolicy`]). The uplink [`Buffer::read`]s from the first
//! unacknowledged sequence number, sends, and [`Buffer::ack`]s what the
//! cloud acknowledged cumulatively. Records are opaque bytes: the buffer
//! never looks inside them.
//!
//! Implementations:
//! - [`LogBuffer`]: segmented, checksummed log on disk (`log.rs`, with the
//!   record codec in `segment.rs` and the cursor file in `cursor.rs`).
//! - [`MemoryBuffer`]: in memory, for other components' unit tests and as
//!   the model the log is checked against.

mod cursor;
pub mod identity;
mod log;
mod memory;
mod segment;

use std::ops::RangeInclusive;
use std::path::PathBuf;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use bytesize::ByteSize;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::error::{Error, Result};

pub use self::log::{FULL_GROUP_BYTES, LogBuffer};
pub use self::memory::MemoryBuffer;
pub use self::segment::RECORD_HEADER_BYTES;

/// One stored record: its sequence number and the caller's bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Per-gateway sequence number, assigned by [`Buffer::append`].
    pub seq: u64,
    /// The opaque payload as appended.
    pub payload: Bytes,
}

/// The store-and-forward seam.
///
/// Sequence numbers start at 1, are consecutive within one append, strictly
/// increasing across appends and never reused, across restarts too. Gaps
/// appear only where records were dropped (`drop_oldest`) or found corrupt;
/// both are counted in [`BufferStats`].
#[async_trait]
pub trait Buffer: Send + Sync {
    /// Stores `records` and returns the sequence numbers they received.
    ///
    /// Returns only once the records are durable per the fsync policy; only
    /// then may the producer be acknowledged. When the buffer is full it
    /// waits (`block`) or drops the oldest records (`drop_oldest`). Errors:
    /// [`Error::Closed`] after [`Buffer::close`]; a retryable
    /// [`Error::NotDurable`] when the disk failed for longer than
    /// `io_error_wait`; bad input errors that are not retryable. After an
    /// error (or a crash before the answer) a prefix of the records may
    /// still have been stored: retrying can duplicate, never lose. Dropping
    /// the future while it waits for space cancels the append; dropping it
    /// later does not stop the write.
    async fn append(&self, records: Vec<Bytes>) -> Result<RangeInclusive<u64>>;

    /// Returns durable, unacknowledged records with `seq >= from_seq`, in
    /// order, at most `max_records` and about `max_bytes` of payload (at
    /// least one record when any is available, however large).
    ///
    /// Never waits for new records: an empty vector means "nothing yet"
    /// (see [`Buffer::subscribe`]). Only durable records are visible, so a
    /// record that was sent can never be lost in a crash and its sequence
    /// number reused. Corrupt records are skipped and counted. Reading the
    /// same range again returns the same records (redelivery). Errors:
    /// [`Error::Closed`], retryable [`Error::Io`] on a read failure.
    async fn read(
        &self,
        from_seq: u64,
        max_records: usize,
        max_bytes: usize,
    ) -> Result<Vec<Record>>;

    /// Acknowledges every record up to and including `up_to_seq`
    /// (cumulative; an older acknowledgement is a no-op).
    ///
    /// Acknowledged records are never read again. The acknowledgement is
    /// persisted before storage is freed; whole segments are freed, which
    /// wakes appends blocked on a full buffer. Errors: [`Error::Closed`],
    /// [`Error::AckBeyondEnd`] for a sequence never made durable. Failing
    /// to persist the acknowledgement is counted and marks the buffer
    /// degraded but is not an error: the worst outcome is a redelivery.
    async fn ack(&self, up_to_seq: u64) -> Result<()>;

    /// Watches the durable watermark: the sequence number the next durable
    /// record will receive. It changes whenever new records become readable,
    /// so a reader can wait for it instead of polling.
    fn subscribe(&self) -> watch::Receiver<u64>;

    /// Counters and state for metrics and health.
    fn stats(&self) -> BufferStats;

    /// Writes and fsyncs everything accepted so far, then refuses further
    /// work (used on SIGTERM). Appends blocked on a full buffer fail with
    /// [`Error::Closed`]; appends already queued are written first. Returns
    /// the error if the final flush failed. Calling it twice is harmless.
    async fn close(&self) -> Result<()>;
}

/// A shared buffer is a buffer: sources and the uplink hold one
/// `Arc<dyn Buffer>`.
#[async_trait]
impl<B: Buffer + ?Sized> Buffer for std::sync::Arc<B> {
    async fn append(&self, records: Vec<Bytes>) -> Result<RangeInclusive<u64>> {
        (**self).append(records).await
    }

    async fn read(
        &self,
        from_seq: u64,
        max_records: usize,
        max_bytes: usize,
    ) -> Result<Vec<Record>> {
        (**self).read(from_seq, max_records, max_bytes).await
    }

    async fn ack(&self, up_to_seq: u64) -> Result<()> {
        (**self).ack(up_to_seq).await
    }

    fn subscribe(&self) -> watch::Receiver<u64> {
        (**self).subscribe()
    }

    fn stats(&self) -> BufferStats {
        (**self).stats()
    }

    async fn close(&self) -> Result<()> {
        (**self).close().await
    }
}

/// When an append counts as durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FsyncPolicy {
    /// fsync before every append returns (concurrent appends still share
    /// one fsync). Safest, slowest.
    Always,
    /// Group commit: appends queue up and one fsync at most every
    /// `fsync_interval` makes all of them durable, or sooner once a group
    /// holds 256 KiB (with `block`) or has stopped growing for
    /// `fsync_settle`. Survives power loss; adds up to `fsync_interval` of
    /// latency.
    #[default]
    Batch,
    /// Return after `write()`: survives a process crash, not a power cut.
    /// After a power cut the last records may be gone although the devices
    /// were answered (and they may have been sent), and their sequence
    /// numbers are given out again; the shipper then sees the cloud's ack
    /// run past the buffer and renews the buffer id, so the new events are
    /// not taken for the old ones. For data that may be lost.
    Never,
}

/// What a full buffer (`max_bytes`) does to new appends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OverflowPolicy {
    /// Appends wait until acknowledgements free space: back-pressure up to
    /// the devices. Nothing is lost; devices may stall during long outages.
    #[default]
    Block,
    /// Delete the oldest segments, even unacknowledged ones, counting every
    /// dropped record in `dropped_total`. Devices never stall; the oldest
    /// data is lost during long outages.
    DropOldest,
}

/// Configuration of the disk buffer (`[buffer]` in the gateway's TOML).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BufferConfig {
    /// Directory holding the segment files and the cursor (and the
    /// gateway's `buffer-id` and MQTT sources' `*.unacked` lists). Default
    /// `data/buffer`. Put it on a disk that survives reboots, not on tmpfs.
    pub dir: PathBuf,
    /// When an append is durable: `always`, `batch` (default) or `never`.
    /// See [`FsyncPolicy`] for the trade-offs.
    pub fsync: FsyncPolicy,
    /// Group-commit interval for `fsync = "batch"`: at most one fsync per
    /// interval. Default `10ms`. Longer means fewer fsyncs (more throughput
    /// on slow disks) and more latency per append.
    #[serde(with = "humantime_serde")]
    pub fsync_interval: Duration,
    /// Under `batch`: a group that has not grown for this long is made
    /// durable without waiting out the interval. Producers that wait for
    /// their answer (devices, the ingest endpoint) send nothing more until
    /// they get it, so once they have all queued, waiting longer only adds
    /// latency. Default `1ms`; `0s` turns it off (at most one fsync per
    /// interval, whatever the load). At most `fsync_interval`.
    #[serde(with = "humantime_serde")]
    pub fsync_settle: Duration,
    /// Size at which a segment file is closed and a new one started.
    /// Default `64 MiB`. Space is freed by whole segments, so smaller
    /// segments free space sooner and mean more files; larger segments make
    /// the start-up check of the last segment longer. At least 1 KiB.
    pub segment_bytes: ByteSize,
    /// Upper bound of the disk space used by segment files. Default
    /// `10 GiB`. When reached, `overflow` applies. Size it for the longest
    /// outage you must ride out at your peak event rate.
    pub max_bytes: ByteSize,
    /// What a full buffer does: `block` (default) or `drop_oldest`. See
    /// [`OverflowPolicy`].
    pub overflow: OverflowPolicy,
    /// How long an append waits while the disk fails (full, I/O errors)
    /// before it returns a retryable error. Default `5s`. Meanwhile the
    /// writer retries with a capped backoff and the buffer reports itself
    /// degraded. Longer keeps devices waiting; shorter makes them retry.
    /// At most `10min`.
    #[serde(with = "humantime_serde")]
    pub io_error_wait: Duration,
}

impl Default for BufferConfig {
    fn default() -> Self {
        BufferConfig {
            dir: PathBuf::from("data/buffer"),
            fsync: FsyncPolicy::Batch,
            fsync_interval: Duration::from_millis(10),
            fsync_settle: Duration::from_millis(1),
            segment_bytes: ByteSize::mib(64),
            max_bytes: ByteSize::gib(10),
            overflow: OverflowPolicy::Block,
            io_error_wait: Duration::from_secs(5),
        }
    }
}

/// Smallest accepted `segment_bytes` and `max_bytes`.
pub const MIN_SEGMENT_BYTES: u64 = 1024;
/// Largest accepted `segment_bytes` (record lengths are 32-bit).
pub const MAX_SEGMENT_BYTES: u64 = 1 << 30;

impl BufferConfig {
    /// A configuration for `dir` with every other field at its default.
    pub fn with_dir(dir: impl Into<PathBuf>) -> Self {
        BufferConfig { dir: dir.into(), ..BufferConfig::default() }
    }

    /// Checks every field and reports all problems at once, each with its
    /// key path relative to the buffer's table (`segment_bytes: ...`).
    pub fn validate(&self) -> Result<()> {
        let mut problems = Vec::new();
        if self.dir.as_os_str().is_empty() {
            problems.push("dir: must not be empty".to_owned());
        }
        let segment = self.segment_bytes.as_u64();
        if !(MIN_SEGMENT_BYTES..=MAX_SEGMENT_BYTES).contains(&segment) {
            problems.push(format!(
                "segment_bytes: {} is outside {} ..= {}",
                self.segment_bytes,
                ByteSize(MIN_SEGMENT_BYTES),
                ByteSize(MAX_SEGMENT_BYTES)
            ));
        }
        if self.max_bytes.as_u64() < MIN_SEGMENT_BYTES {
            problems.push(format!(
                "max_bytes: {} is below the minimum of {}",
                self.max_bytes,
                ByteSize(MIN_SEGMENT_BYTES)
            ));
        }
        if self.fsync_interval > Duration::from_secs(60) {
            problems.push(format!(
                "fsync_interval: {:?} is above the maximum of 60s (appends wait that long)",
                self.fsync_interval
            ));
        }
        if self.io_error_wait > Duration::from_secs(600) {
            problems.push(format!(
                "io_error_wait: {:?} is above the maximum of 10min (appends wait that long)",
                self.io_error_wait
            ));
        }
        if self.fsync_settle > self.fsync_interval {
            problems.push(format!(
                "fsync_settle: {:?} is above fsync_interval ({:?})",
                self.fsync_settle, self.fsync_interval
            ));
        }
        if problems.is_empty() { Ok(()) } else { Err(Error::InvalidConfig { problems }) }
    }
}

/// A snapshot of the buffer's counters and state, for metrics and health.
///
/// `*_total` counters count since the buffer was opened.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BufferStats {
    /// Records made durable.
    pub appended_total: u64,
    /// Sequence numbers acknowledged.
    pub acked_total: u64,
    /// Sequence numbers stored and not yet acknowledged (`next_seq -
    /// first_unacked_seq`; records later found corrupt are included).
    pub pending_records: u64,
    /// Bytes of segment files, the figure bounded by `max_bytes` (freed by
    /// whole segments, so it may include some acknowledged records).
    pub pending_bytes: u64,
    /// Unacknowledged records deleted by `drop_oldest`.
    pub dropped_total: u64,
    /// Records lost to corruption (bad checksum, torn write), each counted
    /// once when first found.
    pub corrupt_skipped_total: u64,
    /// Failed file operations (write, fsync, read, delete, cursor).
    pub io_errors_total: u64,
    /// True while the disk is failing; cleared by the next successful
    /// commit.
    pub degraded: bool,
    /// The error that made the buffer degraded.
    pub last_error: Option<String>,
    /// The lowest sequence number a reader can still get: one past the last
    /// acknowledgement, or higher after drops.
    pub first_unacked_seq: u64,
    /// The sequence number the next durable record will receive.
    pub next_seq: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_toml() {
        let config: BufferConfig = toml::from_str(
            r#"
            dir = "/var/lib/opgraph/buffer"
            fsync = "always"
            fsync_interval = "25ms"
            segment_bytes = "8 MiB"
            max_bytes = "2GiB"
            overflow = "drop_oldest"
            "#,
        )
        .unwrap();
        assert_eq!(config.fsync, FsyncPolicy::Always);
        assert_eq!(config.fsync_interval, Duration::from_millis(25));
        assert_eq!(config.segment_bytes, ByteSize::mib(8));
        assert_eq!(config.max_bytes, ByteSize::gib(2));
        assert_eq!(config.overflow, OverflowPolicy::DropOldest);
        assert_eq!(config.io_error_wait, Duration::from_secs(5));
        assert_eq!(config.fsync_settle, Duration::from_millis(1));
        config.validate().unwrap();

        let empty: BufferConfig = toml::from_str("").unwrap();
        assert_eq!(empty, BufferConfig::default());
        assert_eq!(empty.fsync, FsyncPolicy::Batch);
        assert_eq!(empty.overflow, OverflowPolicy::Block);
    }

    #[test]
    fn unknown_keys_and_bad_values_are_reported() {
        let err = toml::from_str::<BufferConfig>("fsink = \"always\"").unwrap_err();
        assert!(err.to_string().contains("fsink"), "{err}");

        let config = BufferConfig {
            dir: PathBuf::new(),
            segment_bytes: ByteSize::b(10),
            max_bytes: ByteSize::b(0),
            fsync_settle: Duration::from_millis(20),
            ..BufferConfig::default()
        };
        let Err(Error::InvalidConfig { problems }) = config.validate() else {
            panic!("expected InvalidConfig");
        };
        assert_eq!(problems.len(), 4, "{problems:?}");
        assert!(problems[0].starts_with("dir:"));
        assert!(problems[1].starts_with("segment_bytes:"));
        assert!(problems[2].starts_with("max_bytes:"));
        assert!(problems[3].starts_with("fsync_settle:"), "{problems:?}");
    }
}
