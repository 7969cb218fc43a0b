//! The writer thread: the only code that writes segment files.
//!
//! It drains queued appends in groups, encodes them into one buffer, writes
//! it at the end of the tail segment with one positional write and makes it
//! durable with one fsync, then answers every append of the group. Under
//! `batch` it fsyncs at most once per `fsync_interval`: appends arriving
//! meanwhile wait in the queue and join the next group, so many concurrent
//! appenders share one fsync. Blocking I/O stays off the async threads.
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
    Requests(Vec<Request>),
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
                Work::Requests(requests) => {
                    self.housekeeping(false);
                    self.commit(requests);
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
    /// an fsync is allowed again, gathering the appends that arrive meanwhile.
    fn next_work(&mut self) -> Work {
        let config = &self.shared.config;
        let mut inbox = lock(&self.shared.inbox);
        loop {
            if inbox.abandoned {
                return Work::Abandon;
            }
            if !inbox.requests.is_empty() {
                let due = match (config.fsync, self.last_sync) {
                    (FsyncPolicy::Batch, Some(last)) if !inbox.closing => {
                        (last + config.fsync_interval).checked_duration_since(Instant::now())
                    }
                    _ => None,
                };
                match due {
                    Some(wait) if !wait.is_zero() => {
                        inbox = self
                            .shared
                            .inbox_ready
                            .wait_timeout(inbox, wait)
                            .unwrap_or_else(PoisonError::into_inner)
                            .0;
                        continue;
                    }
                    _ => {
                        inbox.kicked = false;
                        return Work::Requests(inbox.requests.drain(..).collect());
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
    fn commit(&mut self, requests: Vec<Request>) {
        let mut pending: VecDeque<Pending> =
            requests.into_iter().map(|req| Pending { req, done: 0, first_seq: 0 }).collect();
        let mut backoff = FIRST_BACKOFF;
        let mut space_short = false;
        while !pending.is_empty() {
            if self.shutting_down().1 {
                return; // abandoned: the dropped replies answer `Closed`
            }
            if space_short {
                self.housekeeping(true);
            }
            let failure = match self.commit_unit(&mut pending) {
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
    /// publishes them to readers and answers completed appends.
    fn commit_unit(&mut self, pending: &mut VecDeque<Pending>) -> Result<(), Failure> {
        if self.file.is_none() {
            self.roll(false)?;
        }
        let config = &self.shared.config;
        let (segment_bytes, max_bytes) = (config.segment_bytes.as_u64(), config.max_bytes.as_u64());
        self.buf.clear();
        let mut seq = self.committed_next;
        let mut taken = Vec::with_capacity(pending.len());
        'build: for p in pending.iter() {
            let mut n = 0;
            for record in &p.req.records[p.done..] {
                let size = encoded_len(record.len());
                let unit = self.buf.len() as u64;
                let used = self.committed_len + unit;
                if used > 0 && used + size > segment_bytes {
                    if unit > 0 {
                        taken.push(n);
                        break 'build;
                    }
                    // The tail is full: seal it and continue in a new one.
                    self.roll(false)?;
                }
                if unit > 0 && unit + size > max_bytes {
                    taken.push(n);
                    break 'build;
                }
                segment::encode(&mut self.buf, seq, record);
                seq += 1;
                n += 1;
            }
            taken.push(n);
        }
        if self.buf.is_empty() {
            return Ok(());
        }
        if self.shared.config.overflow == OverflowPolicy::DropOldest {
            self.make_room(self.buf.len() as u64)?;
        }
        let path = self.shared.segment_path(self.tail_first);
        let Some(file) = &self.file else {
            return Err(Failure::new("write segment", path, io::Error::other("no tail segment")));
        };
        if let Err(e) = self.shared.faults.check(Fault::Write) {
            let _ = file.write_all_at(&self.buf[..self.buf.len() / 2], self.committed_len);
            return Err(Failure::new("write segment", &path, e));
        }
        file.write_all_at(&self.buf, self.committed_len)
            .map_err(|e| Failure::new("write segment", &path, e))?;
        if self.shared.config.fsync == FsyncPolicy::Never {
            self.unsynced = true;
        } else {
            // Spacing fsync starts by the interval bounds both the fsync rate
            // and the latency an append waits for the next one.
            self.last_sync = Some(Instant::now());
            self.shared
                .faults
                .check(Fault::Fsync)
                .and_then(|()| file.sync_data())
                .map_err(|e| Failure::new("fsync segment", &path, e))?;
        }
        self.publish(pending, &taken, seq);
        Ok(())
    }

    /// Moves the durable watermark past the unit just committed and answers
    /// the appends it completed.
    fn publish(&mut self, pending: &mut VecDeque<Pending>, taken: &[usize], next_seq: u64) {
        let written = self.buf.len() as u64;
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
            inbox = self
                .shared
                .inbox_ready
                .wait_timeout(inbox, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
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
        cursor::sync_dir(dir).map_err(|e| Error::io("fsync directory", dir, e))?;
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
