//! [`LogBuffer`]: the disk buffer, a hand-written segmented log.
//!
//! Data flow: `append` (async) reserves space and queues a request for the
//! writer thread (`log/writer.rs`), which owns the tail segment, writes
//! queued appends in groups, fsyncs once per group and answers each append
//! through a oneshot. Only then does the durable watermark (`State::next_seq`,
//! `State::tail_len`) move, and readers (`log/reader.rs`, on the blocking
//! pool) never look past it. `ack` persists the cursor and deletes whole
//! acknowledged segments; the writer deletes the tail itself once it is
//! fully acknowledged. Start-up (`log/recovery.rs`) reads the cursor, lists
//! the segments and validates only the tail.
//!
//! Files: `shared.rs` (state shared by all of them), `writer.rs` and
//! `writer/rolling.rs` (new segments, drops), `reader.rs`, `recovery.rs`,
//! `tracking.rs` (read position hints, corrupt-record dedup), `faults.rs`
//! (fault injection for tests).
//!
//! Locks: `Shared::state` and `Shared::inbox` are std mutexes held for short
//! bookkeeping only, never across I/O on the async side, never across an
//! `.await`, and never both at once.

mod faults;
mod reader;
mod recovery;
mod shared;
mod tracking;
mod writer;

use std::ops::RangeInclusive;
use std::path::Path;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::{self, JoinHandle};
use std::time::Instant;

use async_trait::async_trait;
use bytes::Bytes;
use tokio::sync::{Notify, Semaphore, oneshot, watch};

pub(super) use self::shared::lock;
use self::shared::{Inbox, Request, Shared, State};
pub use self::writer::FULL_GROUP_BYTES;
use super::segment::encoded_len;
use super::{Buffer, BufferConfig, BufferStats, OverflowPolicy, Record, cursor};
use crate::error::{Error, Result};

/// Bytes of appends queued for the writer at most (memory bound); an append
/// larger than this waits until the queue is empty.
const QUEUE_BYTES: u32 = 8 << 20;

/// The disk buffer. See the module docs for its structure and
/// [`Buffer`] for its contract.
///
/// Dropping it without [`Buffer::close`] behaves like a crash: queued
/// appends that have not been answered are abandoned (their callers get
/// [`Error::Closed`]); everything answered stays durable per the policy.
pub struct LogBuffer {
    shared: Arc<Shared>,
    writer: Mutex<Option<JoinHandle<()>>>,
    /// Serialises acknowledgements (cursor writes and segment deletion).
    acks: tokio::sync::Mutex<()>,
    queue: Arc<Semaphore>,
    /// Held, never read: dropped (and the directory unlocked) after
    /// [`Drop`] has stopped the writer.
    _dir_lock: Option<std::fs::File>,
}

impl LogBuffer {
    /// Opens (or creates) the buffer in `config.dir`.
    ///
    /// Fast whatever the backlog: reads the cursor, lists the segment files
    /// and validates only the last one (truncating a torn write). Corrupt
    /// data never stops it; only an unusable configuration or directory
    /// does.
    pub async fn open(config: BufferConfig) -> Result<LogBuffer> {
        config.validate()?;
        let for_recovery = config.clone();
        let recovered = tokio::task::spawn_blocking(move || recovery::recover(&for_recovery))
            .await
            .map_err(|e| Error::io("open buffer", &config.dir, std::io::Error::other(e)))??;
        let (watermark, _) = watch::channel(recovered.state.next_seq);
        let shared = Arc::new(Shared {
            config,
            state: Mutex::new(recovered.state),
            inbox: Mutex::new(Inbox::default()),
            inbox_ready: Condvar::new(),
            space: Notify::new(),
            watermark,
            faults: Default::default(),
        });
        let writer = writer::Writer::new(Arc::clone(&shared), recovered.tail);
        let handle = thread::Builder::new()
            .name("buffer-writer".to_owned())
            .spawn(move || writer.run())
            .map_err(|e| Error::io("start buffer writer", shared.dir(), e))?;
        Ok(LogBuffer {
            shared,
            writer: Mutex::new(Some(handle)),
            acks: tokio::sync::Mutex::new(()),
            queue: Arc::new(Semaphore::new(QUEUE_BYTES as usize)),
            _dir_lock: recovered.dir_lock,
        })
    }

    /// The directory holding the segments and the cursor.
    pub fn dir(&self) -> &Path {
        self.shared.dir()
    }

    /// Waits for `bytes` of space under `block`; reserves it.
    async fn reserve(&self, bytes: u64) -> Result<()> {
        let max = self.shared.config.max_bytes.as_u64();
        let block = self.shared.config.overflow == OverflowPolicy::Block;
        let mut blocked = None;
        loop {
            let freed = self.shared.space.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            {
                let mut state = lock(&self.shared.state);
                if state.closed {
                    return Err(Error::Closed);
                }
                if !block || state.disk_bytes + state.reserved_bytes + bytes <= max {
                    state.reserved_bytes += bytes;
                    return Ok(());
                }
                if blocked.is_none() {
                    state.blocked_appends += 1;
                    blocked = Some(Blocked(&self.shared));
                }
            }
            if blocked.is_some() {
                // A fully acknowledged tail can be replaced to free space.
                self.shared.kick();
            }
            tracing::debug!(bytes, "buffer full: append waits for acknowledgements");
            freed.await;
        }
    }
}

#[async_trait]
impl Buffer for LogBuffer {
    async fn append(&self, records: Vec<Bytes>) -> Result<RangeInclusive<u64>> {
        if records.is_empty() {
            return Err(Error::EmptyAppend);
        }
        let limit = self.shared.config.segment_bytes.as_u64();
        let mut bytes = 0;
        for record in &records {
            let size = encoded_len(record.len());
            if size > limit {
                return Err(Error::RecordTooLarge { size, limit });
            }
            bytes += size;
        }
        let max = self.shared.config.max_bytes.as_u64();
        if bytes > max {
            return Err(Error::AppendTooLarge { size: bytes, limit: max });
        }
        let permits = u32::try_from(bytes).unwrap_or(u32::MAX).min(QUEUE_BYTES);
        let permit =
            Arc::clone(&self.queue).acquire_many_owned(permits).await.map_err(|_| Error::Closed)?;
        self.reserve(bytes).await?;
        // From here on no await until the request is queued: cancelling the
        // append cannot leak the reservation.
        let (reply, answer) = oneshot::channel();
        {
            let mut inbox = lock(&self.shared.inbox);
            if inbox.closing || inbox.abandoned {
                drop(inbox);
                self.shared.release(bytes);
                return Err(Error::Closed);
            }
            inbox.push(Request {
                records,
                bytes,
                reply,
                enqueued: Instant::now(),
                _permit: permit,
            });
        }
        self.shared.inbox_ready.notify_all();
        answer.await.unwrap_or(Err(Error::Closed))
    }

    async fn read(
        &self,
        from_seq: u64,
        max_records: usize,
        max_bytes: usize,
    ) -> Result<Vec<Record>> {
        if max_records == 0 {
            return Ok(Vec::new());
        }
        let shared = Arc::clone(&self.shared);
        tokio::task::spawn_blocking(move || reader::read(&shared, from_seq, max_records, max_bytes))
            .await
            .map_err(|e| Error::io("read buffer", self.dir(), std::io::Error::other(e)))?
    }

    async fn ack(&self, up_to_seq: u64) -> Result<()> {
        let _serial = self.acks.lock().await;
        let cursor = {
            let state = lock(&self.shared.state);
            if state.closed {
                return Err(Error::Closed);
            }
            if up_to_seq <= state.acked {
                return Ok(());
            }
            if up_to_seq >= state.next_seq {
                return Err(Error::AckBeyondEnd { seq: up_to_seq, last: state.next_seq - 1 });
            }
            cursor::Cursor { acked: up_to_seq, next_floor: state.next_seq }
        };
        // The cursor goes to disk before any segment is deleted.
        let dir = self.dir().to_owned();
        let stored = tokio::task::spawn_blocking(move || cursor::store(&dir, &cursor))
            .await
            .unwrap_or_else(|e| Err(std::io::Error::other(e)));
        let doomed = {
            let mut state = lock(&self.shared.state);
            if let Err(e) = &stored {
                state.cursor_dirty = true;
                if state.record_io_error(format!("store cursor: {e}")) {
                    tracing::warn!(dir = %self.dir().display(), error = %e, "buffer degraded: cannot persist the acknowledgement cursor");
                }
            } else {
                state.cursor_dirty = false;
            }
            let before = state.first_unacked();
            state.acked = up_to_seq;
            state.acked_total += (up_to_seq + 1).saturating_sub(before);
            let keys: Vec<u64> = state.segments.keys().copied().collect();
            let mut doomed = Vec::new();
            for pair in keys.windows(2) {
                if pair[1] > up_to_seq + 1 {
                    break;
                }
                if let Some(bytes) = state.segments.remove(&pair[0]) {
                    state.disk_bytes = state.disk_bytes.saturating_sub(bytes);
                    doomed.push(self.shared.segment_path(pair[0]));
                }
            }
            state.hints.forget_below(up_to_seq + 1);
            state.corrupt.forget_below(up_to_seq + 1);
            doomed
        };
        if !doomed.is_empty() {
            let shared = Arc::clone(&self.shared);
            let _ = tokio::task::spawn_blocking(move || {
                for path in doomed {
                    writer::remove_segment(&shared, &path);
                }
            })
            .await;
            self.shared.space.notify_waiters();
        }
        // The tail may now be fully acknowledged: the writer replaces it.
        self.shared.kick();
        Ok(())
    }

    fn subscribe(&self) -> watch::Receiver<u64> {
        self.shared.watermark.subscribe()
    }

    fn stats(&self) -> BufferStats {
        lock(&self.shared.state).stats()
    }

    async fn close(&self) -> Result<()> {
        {
            let mut state = lock(&self.shared.state);
            if state.closed {
                return Ok(());
            }
            state.closed = true;
        }
        self.shared.space.notify_waiters();
        let (reply, done) = oneshot::channel();
        {
            let mut inbox = lock(&self.shared.inbox);
            inbox.closing = true;
            inbox.close_reply = Some(reply);
        }
        self.shared.inbox_ready.notify_all();
        let result = done.await.unwrap_or(Ok(()));
        let handle = lock(&self.writer).take();
        if let Some(handle) = handle {
            let _ = tokio::task::spawn_blocking(move || handle.join()).await;
        }
        self.queue.close();
        tracing::info!(dir = %self.dir().display(), ok = result.is_ok(), "buffer closed");
        result
    }
}

/// Counts an append blocked on a full buffer while it waits (cancellation
/// included).
struct Blocked<'a>(&'a Shared);

impl Drop for Blocked<'_> {
    fn drop(&mut self) {
        let mut state = lock(&self.0.state);
        state.blocked_appends = state.blocked_appends.saturating_sub(1);
    }
}

impl Drop for LogBuffer {
    fn drop(&mut self) {
        lock(&self.shared.state).closed = true;
        lock(&self.shared.inbox).abandoned = true;
        self.shared.inbox_ready.notify_all();
        self.shared.space.notify_waiters();
        // The writer stops at its next step (at most one file operation), so
        // a reopen of the same directory never races with it.
        if let Some(handle) = lock(&self.writer).take() {
            let _ = handle.join();
        }
    }
}
