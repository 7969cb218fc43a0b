//! Segment lifecycle on the writer thread: starting a new tail, dropping
//! the oldest segments (`drop_oldest`), replacing a fully acknowledged
//! tail, and the file operations behind them.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::path::Path;

use super::{Failure, Writer};
use crate::buffer::log::{Shared, lock};
use crate::buffer::segment;

impl Writer {
    /// Starts a new tail segment at the next sequence number. The old tail
    /// is made durable first, so only the tail can ever hold a torn write;
    /// with `delete_old` it is deleted afterwards (its unacknowledged
    /// records counted as dropped).
    pub(super) fn roll(&mut self, delete_old: bool) -> Result<(), Failure> {
        if self.unsynced {
            if let Some(file) = &self.file {
                file.sync_data().map_err(|e| {
                    Failure::new("fsync segment", self.shared.segment_path(self.tail_first), e)
                })?;
            }
            self.unsynced = false;
        }
        let dir = self.shared.dir();
        let first = self.committed_next;
        let file = create_segment(dir, first)
            .map_err(|(op, e)| Failure::new(op, self.shared.segment_path(first), e))?;
        let old = self.tail_first;
        let mut doomed = None;
        {
            let mut state = lock(&self.shared.state);
            if let Some(bytes) = state.segments.insert(first, 0) {
                state.disk_bytes = state.disk_bytes.saturating_sub(bytes); // replaced a tail that held nothing durable
            }
            if delete_old
                && old != first
                && let Some(bytes) = state.segments.remove(&old)
            {
                state.disk_bytes = state.disk_bytes.saturating_sub(bytes);
                let dropped = first.saturating_sub(old.max(state.acked + 1));
                state.dropped_total += dropped;
                doomed = Some((self.shared.segment_path(old), dropped));
            }
            state.tail_len = 0;
        }
        self.file = Some(file);
        self.tail_first = first;
        self.committed_len = 0;
        if let Some((path, dropped)) = doomed {
            remove_segment(&self.shared, &path);
            if dropped > 0 {
                tracing::warn!(dropped, path = %path.display(), "buffer full: dropped unacknowledged records");
            }
            self.shared.space.notify_waiters();
        }
        Ok(())
    }

    /// Deletes the oldest segment, acknowledged or not (`drop_oldest`);
    /// false when there is nothing left to drop.
    pub(super) fn drop_oldest(&mut self) -> Result<bool, Failure> {
        let victim = {
            let mut state = lock(&self.shared.state);
            match state.segments.keys().next().copied() {
                Some(first) if first != self.tail_first => {
                    let next = state
                        .segments
                        .range(first + 1..)
                        .next()
                        .map_or(state.next_seq, |(&k, _)| k);
                    let bytes = state.segments.remove(&first).unwrap_or(0);
                    state.disk_bytes = state.disk_bytes.saturating_sub(bytes);
                    let dropped = next.saturating_sub(first.max(state.acked + 1));
                    state.dropped_total += dropped;
                    state.hints.forget_below(next);
                    state.corrupt.forget_below(next);
                    Some((first, dropped))
                }
                _ => None,
            }
        };
        if let Some((first, dropped)) = victim {
            let path = self.shared.segment_path(first);
            remove_segment(&self.shared, &path);
            if dropped > 0 {
                tracing::warn!(dropped, path = %path.display(), "buffer full: dropped unacknowledged records");
            }
            self.shared.space.notify_waiters();
            return Ok(true);
        }
        if self.committed_len == 0 {
            return Ok(false);
        }
        self.roll(true)?;
        Ok(true)
    }

    /// Drops oldest segments until `needed` more bytes fit in `max_bytes`.
    pub(super) fn make_room(&mut self, needed: u64) -> Result<(), Failure> {
        let max = self.shared.config.max_bytes.as_u64();
        loop {
            let used = lock(&self.shared.state).disk_bytes;
            if used + needed <= max || !self.drop_oldest()? {
                return Ok(());
            }
        }
    }

    /// Replaces a fully acknowledged tail by an empty one, freeing its
    /// space. Done when the tail is worth it (a quarter of a segment) or
    /// space is wanted (appends blocked, disk full), not after every small
    /// acknowledgement.
    pub(super) fn housekeeping(&mut self, space_short: bool) {
        let wanted = {
            let state = lock(&self.shared.state);
            self.committed_next > self.tail_first
                && state.acked + 1 >= self.committed_next
                && (space_short
                    || state.blocked_appends > 0
                    || self.committed_len >= self.shared.config.segment_bytes.as_u64() / 4)
        };
        if wanted && let Err(failure) = self.roll(true) {
            self.note_failure(&failure);
        }
    }
}

/// Creates an empty segment file atomically (temporary name, rename,
/// directory fsync), replacing a same-named one. On failure, the operation
/// that failed and its error.
pub(in crate::buffer::log) fn create_segment(
    dir: &Path,
    first: u64,
) -> Result<File, (&'static str, io::Error)> {
    let name = segment::file_name(first);
    let tmp = dir.join(format!("{name}.tmp"));
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&tmp)
        .map_err(|e| ("create segment", e))?;
    if let Err(e) = fs::rename(&tmp, dir.join(&name)) {
        let _ = fs::remove_file(&tmp);
        return Err(("rename segment", e));
    }
    crate::durable::sync_dir(dir).map_err(|e| ("fsync directory", e))?;
    Ok(file)
}

/// Deletes a segment file; a failure is counted and logged, never fatal.
pub(in crate::buffer::log) fn remove_segment(shared: &Shared, path: &Path) {
    match fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => {
            lock(&shared.state).record_io_error(format!("delete segment {}: {e}", path.display()));
            tracing::warn!(path = %path.display(), error = %e, "cannot delete segment");
        }
    }
}
