//! The writer thread: the only code that writes segment files.
//!
//! It drains queued appends in groups, encodes them, writes them at the end
//! of the tail segment with positional writes and makes them durable with
//! one fsync, then answers every append of the group. Under `batch` it
//! fsyncs at most once per `fsync_interval`: appends arriving meanwhile
//! join the group, so many concurrent appenders share one fsync; a group
//! that reaches [`FULL_GROUP_BYTES`] meanwhile is written and fsynced at
//! once (see [`Writer::gather`]), and so is one that stopped growing for
//! `fsync_settle` (see [`Writer::next_work`]). Blocking I/O stays off the
//! async threads.
//!
//! Failures (disk full, EIO) never panic and never leave a half record
//! behind as valid data: see [`Writer::rollback`] and [`Writer::commit`].
//! Starting, dropping and replacing segments is in `writer/rolling.rs`.

use std::collections::VecDeque;
use std::fmt;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::{Arc, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use super::faults::Fault;
use super::{Request, Shared, lock};
use crate::buffer::segment::{self, encoded_len};
use crate::buffer::{FsyncPolicy, OverflowPolicy, cursor};
use crate::error::{Error, Result};

mod rolling;

pub(super) use self::rolling::{create_segment, remove_segment};

/// Under `batch` (with `block`), a group this large is written and fsynced
/// at once instead of waiting for the interval: the disk has a worthwhile
/// amount to do, and waiting would only add latency (and, for appenders
/// that wait for their answer, cap throughput at one group per interval).
/// Smaller means more fsyncs; the rate stays bounded by bytes per fsync.
pub const FULL_GROUP_BYTES: u64 = 256 << 10;

const FIRST_BACKOFF: Duration = Duration::from_millis(10);
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// The tail segment as start-up leaves it.
pub(super) struct Tail {
    /// Open for writing; `None` when a new segment must be started first.
    pub file: Option<File>,
    pub first: u64,
    /// Durable length.
    pub len: u64,
}

pub(super) struct Writer {
    shared: Arc<Shared>,
    /// The tail segment, `None` when it cannot be written (a new one is
    /// started before the next write).
    file: Option<File>,
    tail_first: u64,
    /// Length of the tail up to the last commit.
    committed_len: u64,
    /// Sequence number of the next record to commit.
    committed_next: u64,
    /// Written but not fsynced (`never` only).
    unsynced: bool,
    last_sync: Option<Instant>,
    /// Encoding buffer, reused.
    buf: Vec<u8>,
}

/// The records of a unit: written after `committed_len` and made durable by
/// one fsync.
struct Unit {
    /// Records taken from each pending append, in order (an append that
    /// has no entry contributes none).
    taken: Vec<usize>,
    /// Bytes written.
    len: u64,
    /// Sequence number after the unit's last record.
    next_seq: u64,
    /// No more records fit (segment or `max_bytes`): the rest wait for the
    /// next unit.
    full: bool,
}

/// An append being committed, possibly over several units.
struct Pending {
    req: Request,
    /// Records of it already committed.
    done: usize,
    first_seq: u64,
}

/// A failed file operation.
pub(super) struct Failure {
    op: &'static str,
    path: PathBuf,
    source: io::Error,
}

impl Failure {
    fn new(op: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        Failure { op, path: path.into(), source }
    }

    fn is_space(&self) -> bool {
        matches!(self.source.kind(), io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded)
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}: {}", self.op, self.path.display(), self.source)
    }
}

enum Work {
    /// Appends to commit; `gather`: the group may still wait for the
    /// interval and grow (see [`Writer::gather`]); not once it settled.
    Requests {
        requests: Vec<Request>,
        gather: bool,
    },
    Housekeeping,
    Close(Option<oneshot::Sender<Result<()>>>),
    Abandon,
}

impl Writer {
    pub(super) fn new(shared: Arc<Shared>, tail: Tail) -> Self {
        let committed_next = lock(&shared.state).next_seq;
        Writer {
            shared,
            file: tail.file,
            tail_first: tail.first,
            committed_len: tail.len,
            committed_next,
            unsynced: false,
            last_sync: None,
            buf: Vec::new(),
        }
    }

    pub(super) fn run(mut self) {
        loop {
            match self.next_work() {
                Work::Abandon => return,
                Work::Housekeeping => self.housekeeping(false),
                Work::Requests { requests, gather } => {
                    self.housekeeping(false);
                    self.commit(requests, gather);
                }
                Work::Close(reply) => {
                    let result = self.finish();
                    if let Some(reply) = reply {
                        let _ = reply.send(result);
                    }
                    return;
                }
            }
        }
    }

    /// Waits for something to do. Under `batch`, queued appends wait until
    /// an fsync is allowed again, gathering the appends that arrive
    /// meanwhile, unless the group is full or has settled.
    fn next_work(&mut self) -> Work {
        let config = &self.shared.config;
        let settle = config.fsync_settle;
        // The queued appends at the last check, and since when.
        let mut growth: Option<(usize, Instant)> = None;
        let mut inbox = lock(&self.shared.inbox);
        loop {
            if inbox.abandoned {
                return Work::Abandon;
            }
            if !inbox.requests.is_empty() {
                let now = Instant::now();
                let due = match (config.fsync, self.last_sync) {
                    (FsyncPolicy::Batch, Some(last)) if !inbox.closing => {
                        (last + config.fsync_interval).checked_duration_since(now)
                    }
                    _ => None,
                };
                // A full group goes now, without waiting for the interval.
                let early = self.early_writes() && inbox.queued_bytes >= FULL_GROUP_BYTES;
                // So does a group that stopped growing: its producers wait
                // for it and send no more until answered.
                let queued = inbox.requests.len();
                let still = match growth {
                    Some((n, since)) if n == queued => now.saturating_duration_since(since),
                    _ => {
                        growth = Some((queued, now));
                        Duration::ZERO
                    }
                };
                let settled = !settle.is_zero() && still >= settle;
                match due {
                    Some(wait) if !wait.is_zero() && !early && !settled => {
                        let wait = if settle.is_zero() { wait } else { wait.min(settle - still) };
                        inbox = self.shared.wait_inbox(inbox, wait);
                        continue;
                    }
                    _ => {
                        inbox.kicked = false;
                        return Work::Requests { requests: inbox.take(), gather: !settled };
                    }
                }
            }
            if inbox.closing {
                return Work::Close(inbox.close_reply.take());
            }
            if inbox.kicked {
                inbox.kicked = false;
                return Work::Housekeeping;
            }
            inbox = self.shared.inbox_ready.wait(inbox).unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Commits a group of appends, unit by unit, answering each append once
    /// all its records are durable.
    ///
    /// On failure the unit is rolled back and retried with a capped
    /// exponential backoff (woken early by acknowledgements, which may free
    /// space). Under `drop_oldest` a full disk first drops the oldest
    /// segment and retries at once. An append that waited longer than
    /// `io_error_wait` gets a retryable [`Error::NotDurable`]; on close every
    /// append still failing gets it at once.
    fn commit(&mut self, requests: Vec<Request>, gather: bool) {
        let mut pending: VecDeque<Pending> =
            requests.into_iter().map(|req| Pending { req, done: 0, first_seq: 0 }).collect();
        let mut backoff = FIRST_BACKOFF;
        let mut space_short = false;
        // Only the group's first unit waits for the interval (and gathers);
        // a continuation after a full segment or a retry after a failure
        // goes ahead, as it always has.
        let mut first = gather;
        while !pending.is_empty() {
            if self.shutting_down().1 {
                return; // abandoned: the dropped replies answer `Closed`
            }
            if space_short {
                self.housekeeping(true);
            }
            let failure = match self.commit_unit(&mut pending, std::mem::take(&mut first)) {
                Ok(()) => {
                    backoff = FIRST_BACKOFF;
                    space_short = false;
                    continue;
                }
                Err(failure) => failure,
            };
            self.rollback();
            self.note_failure(&failure);
            space_short = failure.is_space();
            if space_short && self.shared.config.overflow == OverflowPolicy::DropOldest {
                match self.drop_oldest() {
                    Ok(true) => continue,
                    Ok(false) => {}
                    Err(f) => self.note_failure(&f),
                }
            }
            let (closing, abandoned) = self.shutting_down();
            self.fail_waiting(&mut pending, &failure, closing || abandoned);
            let Some(front) = pending.front() else { return };
            let left =
                self.shared.config.io_error_wait.saturating_sub(front.req.enqueued.elapsed());
            self.pause(backoff.min(left).max(Duration::from_millis(1)));
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }

    /// Writes and fsyncs as many pending records as fit in the tail, then
    /// publishes them to readers and answers completed appends. With
    /// `gather`, under `batch`, waits for the interval first and adds the
    /// appends that queue up meanwhile.
    fn commit_unit(
        &mut self,
        pending: &mut VecDeque<Pending>,
        gather: bool,
    ) -> Result<(), Failure> {
        if self.file.is_none() {
            self.roll(false)?;
        }
        let mut unit =
            Unit { taken: Vec::new(), len: 0, next_seq: self.committed_next, full: false };
        self.stage(pending, &mut unit)?;
        if unit.len == 0 {
            return Ok(());
        }
        if gather && self.early_writes() {
            self.gather(pending, &mut unit)?;
        }
        if self.shared.config.fsync == FsyncPolicy::Never {
            self.unsynced = true;
        } else {
            let path = self.shared.segment_path(self.tail_first);
            let Some(file) = &self.file else {
                return Err(Failure::new(
                    "fsync segment",
                    path,
                    io::Error::other("no tail segment"),
                ));
            };
            // Spacing fsync starts by the interval bounds both the fsync rate
            // and the latency an append waits for the next one.
            self.last_sync = Some(Instant::now());
            self.shared
                .faults
                .check(Fault::Fsync)
                .and_then(|()| file.sync_data())
                .map_err(|e| Failure::new("fsync segment", &path, e))?;
        }
        self.publish(pending, &unit);
        Ok(())
    }

    /// Whether appends are written before their fsync is due: under `batch`
    /// with `block` (under `drop_oldest` making room may replace the tail,
    /// so nothing unsynced may sit in it while waiting).
    fn early_writes(&self) -> bool {
        let config = &self.shared.config;
        config.fsync == FsyncPolicy::Batch && config.overflow == OverflowPolicy::Block
    }

    /// Encodes the pending records that are not in `unit` yet, as many as fit
    /// in the tail segment, and writes them after the unit's earlier bytes.
    ///
    /// While `unit` is not full, every append it took from is complete, so
    /// new records start at the first append without an entry in `taken`.
    fn stage(&mut self, pending: &VecDeque<Pending>, unit: &mut Unit) -> Result<(), Failure> {
        if unit.full {
            return Ok(());
        }
        let config = &self.shared.config;
        let (segment_bytes, max_bytes) = (config.segment_bytes.as_u64(), config.max_bytes.as_u64());
        self.buf.clear();
        let mut seq = unit.next_seq;
        'build: for p in pending.iter().skip(unit.taken.len()) {
            let mut n = 0;
            for record in &p.req.records[p.done..] {
                let size = encoded_len(record.len());
                let staged = unit.len + self.buf.len() as u64;
                let used = self.committed_len + staged;
                if used > 0 && used + size > segment_bytes {
                    if staged > 0 {
                        unit.taken.push(n);
                        unit.full = true;
                        break 'build;
                    }
                    // The tail is full: seal it and continue in a new one.
                    self.roll(false)?;
                }
                if staged > 0 && staged + size > max_bytes {
                    unit.taken.push(n);
                    unit.full = true;
                    break 'build;
                }
                segment::encode(&mut self.buf, seq, record);
                seq += 1;
                n += 1;
            }
            unit.taken.push(n);
        }
        if self.buf.is_empty() {
            return Ok(());
        }
        if unit.len == 0 && self.shared.config.overflow == OverflowPolicy::DropOldest {
            self.make_room(self.buf.len() as u64)?;
        }
        let path = self.shared.segment_path(self.tail_first);
        let Some(file) = &self.file else {
            return Err(Failure::new("write segment", path, io::Error::other("no tail segment")));
        };
        let offset = self.committed_len + unit.len;
        if let Err(e) = self.shared.faults.check(Fault::Write) {
            let _ = file.write_all_at(&self.buf[..self.buf.len() / 2], offset);
            return Err(Failure::new("write segment", &path, e));
        }
        file.write_all_at(&self.buf, offset)
            .map_err(|e| Failure::new("write segment", &path, e))?;
        unit.len += self.buf.len() as u64;
        unit.next_seq = seq;
        Ok(())
    }

    /// Under `batch`: waits until the next fsync is allowed, meanwhile taking
    /// the appends that queue up into the unit (`pending`). Ends at the
    /// deadline with whatever is queued, or early once the unit holds
    /// [`FULL_GROUP_BYTES`]; closing or abandoning ends it at once.
    ///
    /// Written records stay invisible and unanswered until the fsync: a
    /// failure rolls the whole unit back and rewrites it, as before.
    fn gather(&mut self, pending: &mut VecDeque<Pending>, unit: &mut Unit) -> Result<(), Failure> {
        let Some(last) = self.last_sync else { return Ok(()) };
        let deadline = last + self.shared.config.fsync_interval;
        let mut inbox = lock(&self.shared.inbox);
        loop {
            if inbox.closing || inbox.abandoned || unit.len >= FULL_GROUP_BYTES {
                return Ok(());
            }
            let left = deadline.checked_duration_since(Instant::now()).filter(|d| !d.is_zero());
            let take = !unit.full
                && !inbox.requests.is_empty()
                && (left.is_none() || inbox.queued_bytes >= FULL_GROUP_BYTES);
            if take {
                pending.extend(inbox.take().into_iter().map(|req| Pending {
                    req,
                    done: 0,
                    first_seq: 0,
                }));
                drop(inbox);
                self.stage(pending, unit)?;
                if left.is_none() || unit.len >= FULL_GROUP_BYTES {
                    return Ok(());
                }
                inbox = lock(&self.shared.inbox);
                continue;
            }
            let Some(left) = left else { return Ok(()) };
            inbox = self.shared.wait_inbox(inbox, left);
        }
    }

    /// Moves the durable watermark past the unit just committed and answers
    /// the appends it completed.
    fn publish(&mut self, pending: &mut VecDeque<Pending>, unit: &Unit) {
        let (written, next_seq, taken) = (unit.len, unit.next_seq, &unit.taken);
        let mut seq = self.committed_next;
        self.committed_len += written;
        self.committed_next = next_seq;
        let mut answers = Vec::new();
        let recovered = {
            let mut state = lock(&self.shared.state);
            state.next_seq = next_seq;
            state.tail_len = self.committed_len;
            *state.segments.entry(self.tail_first).or_default() += written;
            state.disk_bytes += written;
            state.appended_total += next_seq - seq;
            for (p, &n) in pending.iter_mut().zip(taken) {
                if p.done == 0 {
                    p.first_seq = seq;
                }
                p.done += n;
                seq += n as u64;
            }
            while pending.front().is_some_and(|p| p.done == p.req.records.len()) {
                let Some(p) = pending.pop_front() else { break };
                state.reserved_bytes = state.reserved_bytes.saturating_sub(p.req.bytes);
                let last = p.first_seq + p.req.records.len() as u64 - 1;
                answers.push((p.req.reply, p.first_seq..=last));
            }
            state.last_error.take()
        };
        if let Some(error) = recovered {
            tracing::info!(%error, "buffer recovered: writes succeed again");
        }
        self.shared.watermark.send_replace(next_seq);
        for (reply, range) in answers {
            let _ = reply.send(Ok(range));
        }
    }

    /// Undoes a failed unit.
    ///
    /// After a failed write or fsync nothing past `committed_len` can be
    /// trusted: on Linux a failed fsync may drop the dirty pages and report
    /// success the next time, so fsyncing again would pretend durability.
    /// Instead the file is cut back to the last commit and the unit is
    /// written again from memory (its appends are still queued and were not
    /// answered), so the next fsync covers freshly written pages. Everything
    /// before `committed_len` was durable before the failure. If even the
    /// cut fails the file is abandoned: the next attempt starts a new
    /// segment named by the next sequence number, and readers ignore the
    /// stale bytes left behind (their numbers belong to the newer segment).
    fn rollback(&mut self) {
        let Some(file) = &self.file else { return };
        let cut = self.shared.faults.check(Fault::Truncate);
        if let Err(e) = cut.and_then(|()| file.set_len(self.committed_len)) {
            let path = self.shared.segment_path(self.tail_first);
            self.note_failure(&Failure::new("truncate segment", path, e));
            self.file = None;
        }
    }

    /// Answers the appends that waited too long (all of them when `all`)
    /// with a retryable error.
    fn fail_waiting(&mut self, pending: &mut VecDeque<Pending>, failure: &Failure, all: bool) {
        let budget = self.shared.config.io_error_wait;
        let mut failed = Vec::new();
        while let Some(p) = pending.front() {
            let waited = p.req.enqueued.elapsed();
            if !all && waited < budget {
                break;
            }
            let Some(p) = pending.pop_front() else { break };
            failed.push((p.req, waited));
        }
        if failed.is_empty() {
            return;
        }
        self.shared.release(failed.iter().map(|(req, _)| req.bytes).sum());
        tracing::warn!(appends = failed.len(), error = %failure, "buffer appends failed: disk still failing");
        for (req, waited) in failed {
            let _ = req.reply.send(Err(Error::NotDurable {
                first_seq: self.committed_next,
                path: failure.path.clone(),
                reason: failure.to_string(),
                waited,
            }));
        }
    }

    /// Sleeps up to `wait`, returning early on an acknowledgement (space may
    /// have been freed), close or abandonment.
    fn pause(&self, wait: Duration) {
        let deadline = Instant::now() + wait;
        let mut inbox = lock(&self.shared.inbox);
        loop {
            if inbox.closing || inbox.abandoned {
                return;
            }
            if inbox.kicked {
                inbox.kicked = false;
                return;
            }
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                return;
            };
            inbox = self.shared.wait_inbox(inbox, left);
        }
    }

    /// (closing, abandoned)
    fn shutting_down(&self) -> (bool, bool) {
        let inbox = lock(&self.shared.inbox);
        (inbox.closing, inbox.abandoned)
    }

    fn note_failure(&self, failure: &Failure) {
        let text = failure.to_string();
        if lock(&self.shared.state).record_io_error(text.clone()) {
            tracing::warn!(error = %text, "buffer degraded: disk operation failed; retrying");
        } else {
            tracing::debug!(error = %text, "buffer disk operation failed again");
        }
    }

    /// Final flush on close: fsync the tail and the directory, and persist
    /// the cursor if an acknowledgement could not be persisted earlier.
    fn finish(&mut self) -> Result<()> {
        let dir = self.shared.dir();
        if let Some(file) = &self.file {
            let path = self.shared.segment_path(self.tail_first);
            file.sync_all().map_err(|e| Error::io("fsync segment", path, e))?;
            self.unsynced = false;
        }
        crate::durable::sync_dir(dir).map_err(|e| Error::io("fsync directory", dir, e))?;
        let dirty = {
            let state = lock(&self.shared.state);
            state
                .cursor_dirty
                .then_some(cursor::Cursor { acked: state.acked, next_floor: state.next_seq })
        };
        if let Some(c) = dirty {
            cursor::store(dir, &c).map_err(|e| Error::io("store cursor", dir, e))?;
            lock(&self.shared.state).cursor_dirty = false;
        }
        Ok(())
    }
}
