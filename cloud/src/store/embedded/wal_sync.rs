//! Answers the writer's callers once their commits are on disk, on a
//! thread of its own, so that the writer does not wait for the disk.
//!
//! With `synchronous = FULL`, SQLite fsyncs the write-ahead log inside each
//! `COMMIT`, on the writer thread. Under single-event ingest that wait was
//! about a third of the writer's time (one fsync per group, 1–2.5 ms on the
//! disks measured), during which it executed nothing and requests queued
//! behind it; the machine sat idle for a quarter of its CPU. The writer now
//! commits with `synchronous = NORMAL`, which writes the group's frames to
//! the log file without syncing them, and hands the group's replies here.
//! This thread syncs the log file and only then answers, while the writer
//! executes the next group. One sync covers every group committed before
//! it began, so a sync that takes longer gathers more groups behind it.
//!
//! Why an answer still means what it meant under `FULL`:
//! - A group's frames are written to the log file before its `COMMIT`
//!   returns, and its callers are answered only after an `fdatasync` of
//!   that file that began later, so what a caller was told is stored is on
//!   disk, as `FULL` would have made it at the `COMMIT`.
//! - SQLite keeps the syncs that keep the files consistent under `NORMAL`:
//!   the log before a checkpoint copies it, the database file after, and
//!   the log's header when the log starts over. A power cut before a sync
//!   loses a suffix of whole commits (log recovery stops at the last intact
//!   commit), none of whose callers had an answer: they retry, and an
//!   idempotency key or gateway sequence keeps the retry single.
//! - Readers may see a commit before it is synced, as they may see any
//!   write whose caller has not been answered yet. The search index is
//!   nudged only after the sync, so it does not run ahead of what a power
//!   cut keeps (if it ever does, the index finds itself ahead of the events
//!   on the next start and rebuilds, `search`).
//! - The log file is the same file for the store's lifetime: SQLite deletes
//!   it only when the last connection to the database closes, and the
//!   writer's connection stays open until the store closes.
//! - A failed sync answers its callers with a retryable error, as a failed
//!   commit does; what those groups wrote may or may not survive a power
//!   cut, as with a failed fsync under `FULL`.

use std::fs::File;
use std::path::Path;
use std::sync::mpsc;

use super::{Reply, search};
use crate::error::{Error, Result};

/// Committed groups waiting for a sync, at most. Past it the writer waits,
/// so a stalled disk holds back new commits as a synchronous commit did,
/// instead of piling up answered-later requests; meanwhile the writer's
/// queue fills and gathers larger groups.
const UNSYNCED_GROUPS: usize = 16;

/// The writer's end of the sync thread.
pub(super) struct WalSync {
    groups: mpsc::SyncSender<Vec<Reply>>,
    thread: std::thread::JoinHandle<()>,
    /// Held by a test to stop the thread before its next sync.
    #[cfg(test)]
    pub(super) gate: std::sync::Arc<std::sync::Mutex<()>>,
}

impl WalSync {
    /// Starts the thread that syncs `wal`, the log of the database the
    /// writer commits to, and answers after each sync; `search` is nudged
    /// after each sync.
    pub(super) fn start(wal: &Path, search: search::Nudge) -> Result<WalSync> {
        // The log exists once the writer's connection has written (the
        // schema at open); creating it here changes nothing for SQLite,
        // which treats an empty log as no log.
        let file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(wal)
            .map_err(|e| Error::internal(format!("open {}: {e}", wal.display())))?;
        let (groups, queued) = mpsc::sync_channel(UNSYNCED_GROUPS);
        #[cfg(test)]
        let gate = std::sync::Arc::new(std::sync::Mutex::new(()));
        let syncer = Syncer {
            file,
            search,
            #[cfg(test)]
            gate: std::sync::Arc::clone(&gate),
        };
        let thread = std::thread::Builder::new()
            .name("store-wal-sync".into())
            .spawn(move || syncer.run(queued))
            .map_err(Error::internal)?;
        Ok(WalSync {
            groups,
            thread,
            #[cfg(test)]
            gate,
        })
    }

    /// Answers `replies` with `committed` once the log is synced: at once
    /// when the group did not commit, since nothing of it is to be kept.
    pub(super) fn answer(&self, replies: Vec<Reply>, committed: &rusqlite::Result<()>) {
        if let Err(e) = committed {
            for reply in replies {
                reply(Err(super::classify_ref(e)));
            }
            return;
        }
        // Only a thread that has died hands the replies back.
        if let Err(mpsc::SendError(replies)) = self.groups.send(replies) {
            tracing::error!("the store's sync thread stopped; answering without it");
            for reply in replies {
                reply(Err(Error::internal("store sync thread stopped")));
            }
        }
    }

    /// Answers what is queued after a last sync, then stops the thread.
    pub(super) fn stop(self) {
        drop(self.groups);
        if self.thread.join().is_err() {
            tracing::error!("the store's sync thread panicked");
        }
    }
}

struct Syncer {
    file: File,
    search: search::Nudge,
    #[cfg(test)]
    gate: std::sync::Arc<std::sync::Mutex<()>>,
}

impl Syncer {
    /// Ends when the writer has dropped its end and every group is answered.
    fn run(self, queued: mpsc::Receiver<Vec<Reply>>) {
        while let Ok(first) = queued.recv() {
            #[cfg(test)]
            let _gate = self.gate.lock();
            // Every group queued by now was committed, so written, before
            // the sync below begins: it covers them all.
            let mut groups = vec![first];
            groups.extend(queued.try_iter());
            let synced = self.file.sync_data();
            if let Err(e) = &synced {
                tracing::error!(error = %e, "syncing the store's log failed; the writes it held are refused");
            } else {
                self.search.committed();
            }
            for reply in groups.into_iter().flatten() {
                reply(match &synced {
                    Ok(()) => Ok(()),
                    Err(_) => Err(Error::Unavailable { retry_after_secs: 5 }),
                });
            }
        }
    }
}
