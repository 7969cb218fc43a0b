//! What the async side, the writer thread and readers share: the log's
//! bookkeeping ([`State`]) and the writer's queue ([`Inbox`]).

use std::collections::{BTreeMap, VecDeque};
use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use bytes::Bytes;
use tokio::sync::{Notify, OwnedSemaphorePermit, oneshot, watch};

use super::faults::Faults;
use super::tracking::{Hints, SeqRanges};
use crate::buffer::segment;
use crate::buffer::{BufferConfig, BufferStats};
use crate::error::Result;

/// What the async side, the writer thread and readers share.
pub(super) struct Shared {
    pub(super) config: BufferConfig,
    pub(super) state: Mutex<State>,
    pub(super) inbox: Mutex<Inbox>,
    pub(super) inbox_ready: Condvar,
    /// Woken when space is freed or the buffer closes.
    pub(super) space: Notify,
    /// The durable watermark, for [`crate::buffer::Buffer::subscribe`].
    pub(super) watermark: watch::Sender<u64>,
    /// Injected failures (tests only).
    pub(super) faults: Faults,
}

/// Bookkeeping of the log; changes only under `Shared::state`.
#[derive(Debug, Default)]
pub(super) struct State {
    /// Segment files by first sequence number, with their sizes. The last
    /// one is the tail, written by the writer thread.
    pub(super) segments: BTreeMap<u64, u64>,
    /// Durable length of the tail: readers stop there.
    pub(super) tail_len: u64,
    /// Durable watermark: every record below it is durable.
    pub(super) next_seq: u64,
    /// Highest acknowledged sequence number (0: none).
    pub(super) acked: u64,
    /// Bytes of appends accepted but not yet on disk (for `block`).
    pub(super) reserved_bytes: u64,
    /// Sum of segment sizes, bounded by `max_bytes`.
    pub(super) disk_bytes: u64,
    pub(super) closed: bool,
    /// The last acknowledgement could not be persisted.
    pub(super) cursor_dirty: bool,
    pub(super) hints: Hints,
    /// Corrupt sequence numbers already counted.
    pub(super) corrupt: SeqRanges,
    pub(super) appended_total: u64,
    pub(super) acked_total: u64,
    pub(super) dropped_total: u64,
    pub(super) corrupt_total: u64,
    pub(super) io_errors_total: u64,
    /// Set while degraded.
    pub(super) last_error: Option<String>,
    /// Appends waiting for space under `block`.
    pub(super) blocked_appends: usize,
    /// Consecutive read failures of one segment.
    pub(super) read_failures: Option<ReadFailures>,
}

/// Reads of one segment failing in a row.
#[derive(Debug, Clone, Copy)]
pub(super) struct ReadFailures {
    pub segment: u64,
    pub count: u32,
    /// When the first of them failed.
    pub since: std::time::Instant,
}

impl State {
    /// The lowest sequence number a reader may still get.
    pub(super) fn first_unacked(&self) -> u64 {
        let floor = self.segments.keys().next().copied().unwrap_or(self.next_seq);
        (self.acked + 1).max(floor).min(self.next_seq)
    }

    /// Counts the corrupt sequence numbers `first..=last` that are still
    /// unacknowledged and were not counted before; returns how many.
    pub(super) fn count_corrupt(&mut self, first: u64, last: u64) -> u64 {
        let new = self.corrupt.add(first.max(self.first_unacked()), last);
        self.corrupt_total += new;
        new
    }

    /// Records a failed file operation; returns true when this made the
    /// buffer degraded (so the caller logs once, not on every retry).
    pub(super) fn record_io_error(&mut self, what: String) -> bool {
        self.io_errors_total += 1;
        self.last_error.replace(what).is_none()
    }

    pub(super) fn stats(&self) -> BufferStats {
        let first_unacked_seq = self.first_unacked();
        BufferStats {
            appended_total: self.appended_total,
            acked_total: self.acked_total,
            pending_records: self.next_seq - first_unacked_seq,
            pending_bytes: self.disk_bytes,
            dropped_total: self.dropped_total,
            corrupt_skipped_total: self.corrupt_total,
            io_errors_total: self.io_errors_total,
            degraded: self.last_error.is_some(),
            last_error: self.last_error.clone(),
            first_unacked_seq,
            next_seq: self.next_seq,
        }
    }
}

/// Work for the writer thread; changes only under `Shared::inbox`.
#[derive(Default)]
pub(super) struct Inbox {
    /// Queued appends; add with [`Inbox::push`], take with [`Inbox::take`].
    pub(super) requests: VecDeque<Request>,
    /// Encoded bytes of `requests`.
    pub(super) queued_bytes: u64,
    /// `close()` was called: write what is queued, fsync, stop.
    pub(super) closing: bool,
    pub(super) close_reply: Option<oneshot::Sender<Result<()>>>,
    /// The buffer was dropped: stop without writing anything more.
    pub(super) abandoned: bool,
    /// Something else changed (an acknowledgement): housekeeping due.
    pub(super) kicked: bool,
}

impl Inbox {
    pub(super) fn push(&mut self, request: Request) {
        self.queued_bytes += request.bytes;
        self.requests.push_back(request);
    }

    /// Takes every queued append.
    pub(super) fn take(&mut self) -> Vec<Request> {
        self.queued_bytes = 0;
        self.requests.drain(..).collect()
    }
}

/// One queued append.
pub(super) struct Request {
    pub(super) records: Vec<Bytes>,
    /// Encoded size, reserved in `State::reserved_bytes`.
    pub(super) bytes: u64,
    pub(super) reply: oneshot::Sender<Result<RangeInclusive<u64>>>,
    pub(super) enqueued: Instant,
    pub(super) _permit: OwnedSemaphorePermit,
}

/// Locks a std mutex; a panic elsewhere while holding it does not make the
/// bookkeeping unusable (every update leaves it consistent).
pub(in crate::buffer) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Shared {
    /// Waits on `inbox_ready` for at most `wait`; a poisoned lock is taken
    /// over, as in [`lock`].
    pub(super) fn wait_inbox<'a>(
        &self,
        inbox: MutexGuard<'a, Inbox>,
        wait: std::time::Duration,
    ) -> MutexGuard<'a, Inbox> {
        self.inbox_ready.wait_timeout(inbox, wait).unwrap_or_else(PoisonError::into_inner).0
    }

    pub(super) fn dir(&self) -> &Path {
        &self.config.dir
    }

    pub(super) fn segment_path(&self, first_seq: u64) -> PathBuf {
        self.dir().join(segment::file_name(first_seq))
    }

    /// Wakes the writer for housekeeping.
    pub(super) fn kick(&self) {
        lock(&self.inbox).kicked = true;
        self.inbox_ready.notify_all();
    }

    /// Gives back space reserved for an append that will not be written.
    pub(super) fn release(&self, bytes: u64) {
        let mut state = lock(&self.state);
        state.reserved_bytes = state.reserved_bytes.saturating_sub(bytes);
        drop(state);
        self.space.notify_waiters();
    }
}
