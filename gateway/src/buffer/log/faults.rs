//! Fault injection for tests: make the writer's next writes, fsyncs or
//! truncations fail with EIO, to check the failure handling that a real
//! disk rarely exercises (a full disk is tested for real on a tmpfs).
//! Without `cfg(test)` every check is a no-op.

use std::io;
#[cfg(test)]
use std::sync::atomic::{AtomicU32, Ordering};

/// A kind of file operation that can be made to fail.
#[derive(Debug, Clone, Copy)]
pub(super) enum Fault {
    /// The write fails after writing half of its bytes.
    Write,
    Fsync,
    Truncate,
    /// A reader's open of a segment fails with EIO (the disk).
    Read,
    /// A reader's open fails with EMFILE (the process out of files).
    ReadBusy,
}

/// How many upcoming operations of each kind fail.
#[derive(Debug, Default)]
pub(super) struct Faults {
    #[cfg(test)]
    armed: [AtomicU32; 5],
}

impl Faults {
    /// `Err(EIO)` (EMFILE for `ReadBusy`) when a failure of this kind is
    /// armed (tests only).
    pub(super) fn check(&self, fault: Fault) -> io::Result<()> {
        #[cfg(test)]
        if self.armed[fault as usize]
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            let errno = if matches!(fault, Fault::ReadBusy) { 24 } else { 5 };
            return Err(io::Error::from_raw_os_error(errno));
        }
        let _ = fault;
        Ok(())
    }

    /// Makes the next `times` operations of this kind fail.
    #[cfg(test)]
    pub(super) fn arm(&self, fault: Fault, times: u32) {
        self.armed[fault as usize].store(times, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::time::Duration;

    use bytes::Bytes;

    use super::*;
    use crate::Error;
    use crate::buffer::log::reader::READ_GIVE_UP;
    use crate::buffer::log::shared::ReadFailures;
    use crate::buffer::log::{LogBuffer, lock};
    use crate::buffer::{Buffer, BufferConfig, FsyncPolicy, Record};

    fn payload(i: u64) -> Bytes {
        Bytes::from(format!("record {i:04}").repeat(5))
    }

    async fn open(dir: &std::path::Path, io_error_wait: Duration) -> LogBuffer {
        let config = BufferConfig {
            fsync: FsyncPolicy::Batch,
            fsync_interval: Duration::from_millis(1),
            segment_bytes: bytesize::ByteSize::kib(4),
            io_error_wait,
            ..BufferConfig::with_dir(dir)
        };
        LogBuffer::open(config).await.unwrap()
    }

    async fn append(buffer: &LogBuffer, range: std::ops::RangeInclusive<u64>) -> Result<(), Error> {
        let got = tokio::time::timeout(
            Duration::from_secs(20),
            buffer.append(range.clone().map(payload).collect()),
        )
        .await
        .unwrap()?;
        assert_eq!(got, range);
        Ok(())
    }

    async fn assert_holds(buffer: &LogBuffer, last: u64) {
        let records = buffer.read(1, 1000, usize::MAX).await.unwrap();
        let expected: Vec<Record> =
            (1..=last).map(|seq| Record { seq, payload: payload(seq) }).collect();
        assert_eq!(records, expected);
        let stats = buffer.stats();
        assert_eq!((stats.next_seq, stats.corrupt_skipped_total), (last + 1, 0), "{stats:?}");
    }

    /// Sum of the segment files: exactly the records, no leftovers.
    fn disk_bytes(dir: &std::path::Path) -> u64 {
        fs::read_dir(dir)
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().ends_with(".seg"))
            .map(|e| e.metadata().unwrap().len())
            .sum()
    }

    /// Reads that fail for a while lose nothing: a process out of file
    /// descriptors never, a failing disk only after failing for ten
    /// minutes (the shipper retries every few hundred milliseconds: three
    /// failures in a row once dropped a whole segment in a second).
    #[tokio::test]
    async fn segments_are_given_up_only_after_failing_for_long() {
        let dir = tempfile::tempdir().unwrap();
        let buffer = open(dir.path(), Duration::from_secs(5)).await;
        append(&buffer, 1..=200).await.unwrap();
        for (fault, times) in [(Fault::ReadBusy, 20), (Fault::Read, 20)] {
            buffer.shared.faults.arm(fault, times);
            for _ in 0..times {
                let err = buffer.read(1, 1000, usize::MAX).await.unwrap_err();
                assert!(err.retryable(), "{err}");
            }
            assert_holds(&buffer, 200).await;
        }

        // A segment failing for longer than that is given up on.
        let first = *lock(&buffer.shared.state).segments.keys().next().unwrap();
        let long_ago = std::time::Instant::now() - READ_GIVE_UP - Duration::from_secs(1);
        lock(&buffer.shared.state).read_failures =
            Some(ReadFailures { segment: first, count: 2, since: long_ago });
        buffer.shared.faults.arm(Fault::Read, 1);
        let records = buffer.read(1, 1000, usize::MAX).await.unwrap();
        let lost = buffer.stats().corrupt_skipped_total;
        assert!(lost > 0 && records.first().unwrap().seq == lost + 1, "lost {lost}");
        assert_eq!(records.last().unwrap().seq, 200);
    }

    #[tokio::test]
    async fn failed_fsyncs_are_rewritten_not_trusted() {
        let dir = tempfile::tempdir().unwrap();
        let buffer = open(dir.path(), Duration::from_secs(10)).await;
        append(&buffer, 1..=5).await.unwrap();
        buffer.shared.faults.arm(Fault::Fsync, 2);
        append(&buffer, 6..=8).await.unwrap();
        let stats = buffer.stats();
        assert_eq!(stats.io_errors_total, 2);
        assert!(!stats.degraded, "cleared by the successful retry");
        assert_holds(&buffer, 8).await;
        let size = disk_bytes(dir.path());
        assert_eq!(size, buffer.stats().pending_bytes, "written once, not twice");
        drop(buffer);
        let buffer = open(dir.path(), Duration::from_secs(10)).await;
        assert_holds(&buffer, 8).await;
        assert_eq!(disk_bytes(dir.path()), size);
    }

    #[tokio::test]
    async fn partial_writes_are_cut_back() {
        let dir = tempfile::tempdir().unwrap();
        let buffer = open(dir.path(), Duration::from_secs(10)).await;
        append(&buffer, 1..=5).await.unwrap();
        buffer.shared.faults.arm(Fault::Write, 3);
        append(&buffer, 6..=9).await.unwrap();
        assert_eq!(buffer.stats().io_errors_total, 3);
        assert_holds(&buffer, 9).await;
        assert_eq!(disk_bytes(dir.path()), buffer.stats().pending_bytes);
        drop(buffer);
        let buffer = open(dir.path(), Duration::from_secs(10)).await;
        assert_holds(&buffer, 9).await;
    }

    #[tokio::test]
    async fn a_failing_disk_degrades_fails_retryably_and_recovers() {
        let dir = tempfile::tempdir().unwrap();
        let buffer = open(dir.path(), Duration::from_millis(200)).await;
        append(&buffer, 1..=5).await.unwrap();
        buffer.shared.faults.arm(Fault::Fsync, u32::MAX);
        let err = append(&buffer, 6..=6).await.unwrap_err();
        assert!(matches!(err, Error::NotDurable { first_seq: 6, .. }), "{err}");
        assert!(err.retryable());
        let stats = buffer.stats();
        assert!(stats.degraded);
        assert!(stats.last_error.unwrap().contains("fsync segment"));
        assert_eq!(stats.next_seq, 6, "nothing unsynced became visible");
        assert_eq!(buffer.read(6, 10, usize::MAX).await.unwrap(), vec![]);

        buffer.shared.faults.arm(Fault::Fsync, 0);
        append(&buffer, 6..=7).await.unwrap();
        assert!(!buffer.stats().degraded);
        assert_holds(&buffer, 7).await;
        buffer.close().await.unwrap();
        drop(buffer);
        let buffer = open(dir.path(), Duration::from_secs(10)).await;
        assert_holds(&buffer, 7).await;
    }

    #[tokio::test]
    async fn a_file_that_cannot_be_cut_is_abandoned_for_a_new_segment() {
        let dir = tempfile::tempdir().unwrap();
        let buffer = open(dir.path(), Duration::from_secs(10)).await;
        append(&buffer, 1..=5).await.unwrap();
        buffer.shared.faults.arm(Fault::Truncate, 1);
        buffer.shared.faults.arm(Fault::Write, 1); // half a unit stays behind
        append(&buffer, 6..=8).await.unwrap();
        let segments = fs::read_dir(dir.path())
            .unwrap()
            .filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().ends_with(".seg"))
            .count();
        assert_eq!(segments, 2, "records 6.. went to a new segment");
        assert_holds(&buffer, 8).await;
        append(&buffer, 9..=9).await.unwrap();
        drop(buffer);
        let buffer = open(dir.path(), Duration::from_secs(10)).await;
        assert_holds(&buffer, 9).await;
        assert_eq!(buffer.append(vec![payload(10)]).await.unwrap(), 10..=10);
    }
}
