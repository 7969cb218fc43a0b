//! Start-up: from the files in the directory to a ready [`State`].
//!
//! Cost is independent of the backlog: read the cursor, list and stat the
//! segment files, and scan only the tail segment (where torn writes
//! happen). Older segments are checked lazily, as readers reach them.
//! Nothing found on disk stops start-up: a garbage cursor falls back to the
//! segments, a torn or corrupt tail is cut back to its last valid record,
//! an unreadable tail is left behind and a new one started.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::path::Path;

use opgraph_proto::dir_lock::{DirLock, try_lock_dir};

use super::State;
use super::writer::{self, Tail};
use crate::buffer::segment::{self, Header, RECORD_HEADER_BYTES, ReadAt, Scanned, Scanner};
use crate::buffer::{BufferConfig, cursor};
use crate::error::{Error, Result};

/// What start-up hands to the buffer.
pub(super) struct Recovered {
    pub state: State,
    pub tail: Tail,
    /// The directory, locked for this process ([`lock_dir`]); `None` where
    /// the filesystem has no locks.
    pub dir_lock: Option<File>,
}

/// What the scan of the tail segment found.
struct TailCheck {
    /// Open for writing, `None` when the torn part could not be cut off.
    file: Option<File>,
    /// Length of the valid records.
    len: u64,
    /// One past the last sequence number used in it.
    next_seq: u64,
    /// Sequence numbers lost to corruption.
    lost: Vec<(u64, u64)>,
}

/// Holds the buffer directory for this process: a second gateway on the
/// same directory would interleave its records with ours and hand out the
/// same sequence numbers ([`opgraph_proto::dir_lock`]). Where the
/// directory cannot be locked, the buffer opens without a lock and says so.
fn lock_dir(dir: &Path) -> Result<Option<File>> {
    match try_lock_dir(dir) {
        DirLock::Held(handle) => Ok(Some(handle)),
        DirLock::InUse => Err(Error::io(
            "lock buffer directory",
            dir,
            io::Error::new(
                io::ErrorKind::WouldBlock,
                "in use by another process (one gateway per buffer directory)",
            ),
        )),
        DirLock::Unsupported(e) => {
            tracing::warn!(dir = %dir.display(), error = %e, "buffer directory cannot be locked: make sure no other gateway uses it");
            Ok(None)
        }
    }
}

pub(super) fn recover(config: &BufferConfig) -> Result<Recovered> {
    let dir = config.dir.as_path();
    fs::create_dir_all(dir).map_err(|e| Error::io("create buffer directory", dir, e))?;
    let dir_lock = lock_dir(dir)?;
    let mut state = State::default();

    let cursor = cursor::load(dir).unwrap_or_else(|reason| {
        tracing::warn!(%reason, "buffer cursor unreadable: starting from the oldest segment (acknowledged records may be sent again)");
        None
    });
    let mut segments = list_segments(dir)?;
    let acked = match cursor {
        Some(cursor) => cursor.acked,
        None => segments.keys().next().map_or(0, |first| first.saturating_sub(1)),
    };
    let mut next_seq = cursor.map_or(1, |c| c.next_floor).max(acked + 1).max(1);

    // Segments wholly acknowledged before the last run stopped.
    let keys: Vec<u64> = segments.keys().copied().collect();
    for pair in keys.windows(2) {
        if pair[1] > acked + 1 {
            break;
        }
        let path = dir.join(segment::file_name(pair[0]));
        match fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "cannot delete acknowledged segment");
                continue;
            }
        }
        segments.remove(&pair[0]);
    }

    let mut lost = Vec::new();
    let mut tail = None;
    if let Some((&first, &size)) = segments.iter().next_back() {
        let path = dir.join(segment::file_name(first));
        match check_tail(&path, first) {
            Ok(check) => {
                segments.insert(first, check.len);
                lost = check.lost;
                next_seq = next_seq.max(check.next_seq);
                // Appends continue in this file only if numbering continues
                // seamlessly; otherwise the writer starts a new segment.
                let file = check.file.filter(|_| check.next_seq == next_seq);
                tail = Some(Tail { file, first, len: check.len });
            }
            Err(e) => {
                // Unknown content: no record can be smaller than its header,
                // so skipping this many numbers never reuses one.
                next_seq = next_seq.max(first.saturating_add(size / RECORD_HEADER_BYTES as u64));
                state.record_io_error(format!("check tail segment {}: {e}", path.display()));
                tracing::error!(path = %path.display(), error = %e, "cannot read the tail segment; starting a new one after it");
                tail = Some(Tail { file: None, first, len: 0 });
            }
        }
    }
    let tail = match tail {
        Some(tail) if tail.file.is_some() => tail,
        stale => match writer::create_segment(dir, next_seq) {
            Ok(file) => {
                segments.insert(next_seq, 0);
                Tail { file: Some(file), first: next_seq, len: 0 }
            }
            Err((op, e)) => {
                // Disk full or failing at start-up: keep going, the writer
                // creates the segment before its first write.
                state.record_io_error(format!("{op} {}: {e}", dir.display()));
                tracing::warn!(dir = %dir.display(), error = %e, "cannot create a segment yet");
                stale.unwrap_or(Tail { file: None, first: next_seq, len: 0 })
            }
        },
    };
    state.disk_bytes = segments.values().sum();
    state.segments = segments;
    state.tail_len =
        if state.segments.keys().next_back() == Some(&tail.first) { tail.len } else { 0 };
    state.next_seq = next_seq;
    state.acked = acked.min(next_seq - 1);
    for (first, last) in lost {
        state.count_corrupt(first, last);
    }
    let stats = state.stats();
    tracing::info!(
        dir = %dir.display(),
        segments = state.segments.len(),
        first_unacked = stats.first_unacked_seq,
        next_seq,
        pending_bytes = stats.pending_bytes,
        corrupt_skipped = stats.corrupt_skipped_total,
        "buffer opened"
    );
    Ok(Recovered { state, tail, dir_lock })
}

/// Segment files by first sequence number, with their sizes. Leftover
/// temporary files of interrupted renames are removed; anything else is
/// left alone.
fn list_segments(dir: &Path) -> Result<BTreeMap<u64, u64>> {
    let entries = fs::read_dir(dir).map_err(|e| Error::io("list buffer directory", dir, e))?;
    let mut segments = BTreeMap::new();
    for entry in entries {
        let entry = match entry {
            Ok(entry) => entry,
            Err(e) => {
                tracing::warn!(dir = %dir.display(), error = %e, "cannot list a directory entry");
                continue;
            }
        };
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if name.ends_with(".tmp") {
            let _ = fs::remove_file(entry.path());
        } else if let Some(first) = segment::parse_file_name(name) {
            let size = entry.metadata().map_or(0, |m| m.len());
            segments.insert(first, size);
        }
    }
    Ok(segments)
}

/// Scans the tail segment from its start and cuts off a torn or corrupt
/// end. Corrupt records followed by valid ones are skipped and reported.
fn check_tail(path: &Path, first: u64) -> io::Result<TailCheck> {
    let file = OpenOptions::new().read(true).write(true).open(path)?;
    let file_len = file.metadata()?.len();
    let mut scanner = Scanner::new(&file, 0, file_len, first, u64::MAX, u64::MAX);
    let (mut len, mut next_seq, mut lost) = (0, first, Vec::new());
    while let Some(item) = scanner.next_item()? {
        match item {
            Scanned::Record { seq, .. } => {
                len = scanner.position().0;
                next_seq = seq + 1;
            }
            Scanned::Corrupt { missing: Some(range), .. } => lost.push(range),
            Scanned::Corrupt { .. } => {}
        }
    }
    if len == file_len {
        return Ok(TailCheck { file: Some(file), len, next_seq, lost });
    }
    // A whole record with the next number and a bad checksum was complete
    // on disk, so it may have been durable and sent: its number stays used.
    // A shorter remnant is a write that never completed (and never
    // returned): its number is free.
    let mut header = [0u8; RECORD_HEADER_BYTES];
    let complete = matches!(file.read_at(&mut header, len), Ok(n) if n == header.len())
        && Header::parse(&header)
            .is_some_and(|h| h.seq == next_seq && len + h.record_len() <= file_len);
    if complete {
        lost.push((next_seq, next_seq));
        next_seq += 1;
    }
    tracing::warn!(
        path = %path.display(),
        valid_bytes = len,
        cut_bytes = file_len - len,
        "cutting off a torn or corrupt end of the tail segment"
    );
    let cut = file.set_len(len).and_then(|()| file.sync_all());
    if let Err(e) = &cut {
        tracing::warn!(path = %path.display(), error = %e, "cannot cut the tail segment; a new one will be started");
    }
    Ok(TailCheck { file: cut.ok().map(|()| file), len, next_seq, lost })
}
