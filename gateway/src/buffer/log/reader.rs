//! Reads for the uplink, on the blocking pool.
//!
//! A read takes a snapshot of the durable watermark under the state lock
//! and never looks past it: records still being written (or rolled back
//! after a failed fsync) are invisible. It resumes from the nearest
//! position hint instead of the segment start, validates every record it
//! passes, and counts corrupt records once however often they are read.

use std::fs::File;
use std::io;
use std::path::Path;

use super::faults::Fault;
use super::shared::ReadFailures;
use super::{Shared, lock};
use crate::buffer::Record;
use crate::buffer::segment::{Scanned, Scanner};
use crate::error::{Error, Result};

/// A position hint is kept about every this many bytes scanned.
const HINT_SPACING: u64 = 1 << 20;
/// Failed reads of one segment in a row, over at least [`READ_GIVE_UP`],
/// before its remaining records are given up as lost: a bad sector must
/// not stall delivery for ever, and a passing error must not lose a
/// segment of acknowledged events (the shipper retries every few hundred
/// milliseconds, so a count alone was reached in a second).
const MAX_READ_FAILURES: u32 = 3;
pub(super) const READ_GIVE_UP: std::time::Duration = std::time::Duration::from_secs(600);

/// What to scan next, from a snapshot of the state.
struct Plan {
    segment: u64,
    /// Scan limit: the durable length for the tail, else the file length.
    end: u64,
    /// First sequence number beyond this segment.
    upper: u64,
    offset: u64,
    expected: u64,
    is_tail: bool,
}

pub(super) fn read(
    shared: &Shared,
    from_seq: u64,
    max_records: usize,
    max_bytes: usize,
) -> Result<Vec<Record>> {
    let mut out: Vec<Record> = Vec::new();
    let mut bytes = 0;
    let mut from = from_seq;
    while let Some(plan) = next_plan(shared, &mut from)? {
        let path = shared.segment_path(plan.segment);
        let opened = shared.faults.check(Fault::Read).and_then(|()| {
            shared.faults.check(Fault::ReadBusy).and_then(|()| open(&path, plan.end))
        });
        let file = match opened {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                if segment_vanished(shared, &plan, from, &path) {
                    continue;
                }
                break;
            }
            Err(e) => match read_failed(shared, &plan, from, &path, e, out.is_empty())? {
                true => continue,
                false => break,
            },
        };
        let (file, end) = file;
        let mut scanner = Scanner::new(&file, plan.offset, end, plan.expected, plan.upper, from);
        let mut hints = Vec::new();
        let mut last_hint = plan.offset;
        let full = loop {
            match scanner.next_item() {
                Ok(Some(Scanned::Record { seq, offset, payload })) => {
                    if offset >= last_hint + HINT_SPACING {
                        hints.push((seq, offset));
                        last_hint = offset;
                    }
                    if seq < from {
                        continue;
                    }
                    bytes += payload.len();
                    out.push(Record { seq, payload });
                    if out.len() >= max_records || bytes >= max_bytes {
                        break true;
                    }
                }
                Ok(Some(Scanned::Corrupt { offset, bytes: junk, missing })) => {
                    report_corrupt(shared, &path, offset, junk, missing)
                }
                Ok(None) => break false,
                Err(e) => {
                    if read_failed(shared, &plan, from, &path, e, out.is_empty())? {
                        break false;
                    }
                    return Ok(out);
                }
            }
        };
        let (offset, expected) = scanner.position();
        hints.push((expected, offset));
        {
            let mut state = lock(&shared.state);
            state.read_failures = None;
            let floor = state.first_unacked();
            for (seq, offset) in hints {
                if seq >= floor {
                    state.hints.insert(seq, plan.segment, offset);
                }
            }
        }
        if full || plan.is_tail {
            break;
        }
        from = from.max(plan.upper);
    }
    Ok(out)
}

/// Where to look for `from` (moved up to the first unacknowledged record);
/// `None` when there is nothing durable at or after it.
fn next_plan(shared: &Shared, from: &mut u64) -> Result<Option<Plan>> {
    let state = lock(&shared.state);
    if state.closed {
        return Err(Error::Closed);
    }
    *from = (*from).max(state.first_unacked());
    if *from >= state.next_seq {
        return Ok(None);
    }
    let Some((&segment, _)) = state.segments.range(..=*from).next_back() else {
        return Ok(None);
    };
    let next = state.segments.range(segment + 1..).next().map(|(&k, _)| k);
    let (end, upper) = match next {
        Some(next) => (u64::MAX, next),
        None => (state.tail_len, state.next_seq),
    };
    let (offset, expected) = state.hints.lookup(segment, *from).unwrap_or((0, segment));
    Ok(Some(Plan { segment, end, upper, offset, expected, is_tail: next.is_none() }))
}

fn open(path: &Path, end: u64) -> io::Result<(File, u64)> {
    let file = File::open(path)?;
    let len = file.metadata()?.len();
    Ok((file, end.min(len)))
}

/// Counts and logs a corrupt stretch (once per lost sequence number).
fn report_corrupt(
    shared: &Shared,
    path: &Path,
    offset: u64,
    bytes: u64,
    missing: Option<(u64, u64)>,
) {
    let new = match missing {
        Some((first, last)) => lock(&shared.state).count_corrupt(first, last),
        None => 0,
    };
    if new > 0 {
        tracing::warn!(path = %path.display(), offset, bytes, lost = new, "skipped corrupt records");
    } else if bytes > 0 {
        tracing::debug!(path = %path.display(), offset, bytes, "skipped bytes holding no record");
    }
}

/// A segment file is gone. Deleted by an acknowledgement or a drop since
/// the plan was made: plan again. Deleted behind our back: count its
/// records as lost and move on. Returns whether to continue reading.
fn segment_vanished(shared: &Shared, plan: &Plan, from: u64, path: &Path) -> bool {
    let mut state = lock(&shared.state);
    if !state.segments.contains_key(&plan.segment) {
        return true;
    }
    if plan.is_tail {
        return false;
    }
    if let Some(bytes) = state.segments.remove(&plan.segment) {
        state.disk_bytes = state.disk_bytes.saturating_sub(bytes);
    }
    let lost = state.count_corrupt(from, plan.upper - 1);
    tracing::error!(path = %path.display(), lost, "segment file disappeared");
    true
}

/// A read failed. Counted; the caller gets a retryable error (or the
/// records read so far: returns false). After failures on the same
/// (non-tail) segment for [`READ_GIVE_UP`] its remaining records are
/// counted as lost and the segment is skipped from then on (returns true:
/// go on). Errors that say the process, not the file, is short of
/// something (descriptors, memory) never count toward that.
fn read_failed(
    shared: &Shared,
    plan: &Plan,
    from: u64,
    path: &Path,
    e: io::Error,
    nothing_read: bool,
) -> Result<bool> {
    let mut state = lock(&shared.state);
    state.io_errors_total += 1;
    // EMFILE, ENFILE, ENOMEM, EAGAIN, EINTR.
    let passing = matches!(e.raw_os_error(), Some(24 | 23 | 12 | 11 | 4))
        || matches!(e.kind(), io::ErrorKind::Interrupted | io::ErrorKind::OutOfMemory);
    let failures = match state.read_failures {
        _ if passing => None,
        Some(f) if f.segment == plan.segment => Some(ReadFailures { count: f.count + 1, ..f }),
        _ => {
            Some(ReadFailures { segment: plan.segment, count: 1, since: std::time::Instant::now() })
        }
    };
    if let Some(failures) = failures {
        state.read_failures = Some(failures);
    }
    let given_up = failures.is_some_and(|f| {
        f.count >= MAX_READ_FAILURES && f.since.elapsed() >= READ_GIVE_UP && !plan.is_tail
    });
    if given_up {
        state.read_failures = None;
        let lost = state.count_corrupt(from, plan.upper - 1);
        // Forget the segment (the file stays for inspection) so that no
        // later read tries it again.
        if let Some(bytes) = state.segments.remove(&plan.segment) {
            state.disk_bytes = state.disk_bytes.saturating_sub(bytes);
        }
        drop(state);
        tracing::error!(path = %path.display(), error = %e, lost, "segment unreadable; skipping its remaining records");
        return Ok(true);
    }
    drop(state);
    let failures = failures.map_or(0, |f| f.count);
    tracing::warn!(path = %path.display(), error = %e, failures, "cannot read segment");
    if nothing_read { Err(Error::io("read segment", path, e)) } else { Ok(false) }
}
