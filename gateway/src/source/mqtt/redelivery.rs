//! Recognises the messages a broker sends again although they are stored
//! already, so that a crash or a lost connection between our append and
//! the broker reading our PUBACKs does not store them twice.
//!
//! A QoS 1 broker sends again, first thing on the next connection of the
//! session, what it has not seen acknowledged, and the copies are equal
//! in topic and payload. So we remember every message from the moment it
//! is stored (or otherwise decided) until the broker has certainly read
//! its PUBACK. A PUBACK written to the socket proves nothing: the broker
//! may be far behind in reading, and what it has not read is lost with
//! the connection. Proof is a barrier: an UNSUBSCRIBE of a filter we never
//! subscribed, queued after the acks. A broker handles a connection's
//! packets in order, so its UNSUBACK means every PUBACK before it was
//! read. An answer counts only when its packet id is the one the barrier
//! was written with, on the connection it was written on: rumqttc carries
//! an unwritten UNSUBSCRIBE over to the next connection, and an answer
//! taken for the wrong barrier would cover acks the broker never read.
//! What is still remembered when a connection ends (or listed in the
//! file the last run left) may come again on the next: each message
//! arriving there equal to one of them is acknowledged and not stored; the
//! first one that is not ends the resent run. A copy recognised stays
//! listed until its batch is acknowledged: a stop in between leaves it
//! unacknowledged, and the broker sends it again.
//!
//! The list is rewritten before and after each append and when a barrier
//! covered something. Before an append it also names the batch
//! ([`Appending`]: each message's fingerprint and its record's CRC-32C):
//! a crash during the append (in its fsync, say) may leave some of the
//! records in the buffer, unacknowledged, and the next run reads the
//! buffer back to learn which. A message counts as stored only when the
//! list says it was acknowledged or its record was found, so the list
//! never makes a message be skipped that is not stored.
//!
//! That write before an append is synced before the append starts (unless
//! the buffer's `fsync` is `never`), so that a power cut cannot keep the
//! batch and lose the list naming it. The list alternates between two
//! files, each write under a generation one above the last, into the file
//! not holding the last synced list; the next run reads the readable one
//! of the higher generation. A write that a power cut tears can then only
//! lose what came after the last sync, which the synced list covers
//! (naming at worst more than may come again). What the list misses
//! leaves delivery at least once, as without it: records of an interrupted
//! append that the uplink had already shipped (and the buffer dropped).
//! What it names in excess (acks read
//! since the last barrier) matters only if a device sends, as the first
//! message after a reconnect or restart, one byte for byte equal to one of
//! them: that message would be taken for a resend.

use std::collections::{HashMap, HashSet, VecDeque};
use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::buffer::Record;
use crate::source::SourceHealth;

/// Most messages remembered; beyond it the oldest are forgotten (they
/// would be stored again if resent). A barrier answered every round trip
/// keeps far fewer.
const MAX_REMEMBERED: usize = 65_536;

/// How long a barrier may stay unanswered while messages flow on its
/// connection before the broker is taken to answer none.
const BARRIER_PATIENCE: Duration = Duration::from_secs(60);

/// How many connections in a row may end with a barrier out and none
/// answered on them before the broker is taken to close connections on a
/// barrier (as a broker that refuses an UNSUBSCRIBE of a filter never
/// subscribed may): each batch would cost a reconnect.
pub(super) const CLOSED_ON_BARRIER: u32 = 3;

/// How long after giving up on the broker the source tries again: the
/// broker may have been replaced, or the signs misread (a link failing
/// just so). A try costs a minute of remembering or three reconnects.
const RETRY_AFTER: Duration = Duration::from_secs(3600);

/// A file's first bytes, naming its format: `OGR3` carries a generation,
/// `OGR2` (written before there were two files) reads as generation 0.
const MAGIC: &[u8; 4] = b"OGR3";
const MAGIC_UNGENERATED: &[u8; 4] = b"OGR2";

/// A message's identity: its payload length and a CRC-32C of topic and
/// payload. Topics cannot hold NUL, which separates the two.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fingerprint(u64);

impl Fingerprint {
    pub fn of(topic: &str, payload: &[u8]) -> Fingerprint {
        let crc = crc32c::crc32c_append(crc32c::crc32c(topic.as_bytes()), &[0]);
        let crc = crc32c::crc32c_append(crc, payload);
        Fingerprint(((payload.len() as u64) << 32) | u64::from(crc))
    }

    /// As kept in files.
    pub fn to_bits(self) -> u64 {
        self.0
    }

    pub fn from_bits(bits: u64) -> Fingerprint {
        Fingerprint(bits)
    }
}

/// Messages that may come again, shared by the processor (which stores,
/// acknowledges and queues barriers) and the poller (which sees
/// connections and barriers answered).
#[derive(Debug)]
pub struct Redelivery {
    state: Mutex<State>,
    answered: Notify,
    /// `State::suspect` is set: the poller looks at what arrives (read
    /// without the lock on every message).
    suspecting: AtomicBool,
}

#[derive(Debug, Default)]
struct State {
    /// Messages whose PUBACK the broker may not have read, from earlier
    /// connections or runs, with the first connection on which they may
    /// come again.
    expected: VecDeque<(u64, Fingerprint)>,
    /// Messages of the current connection acknowledged (or about to be),
    /// by serial number and packet id, not yet covered by an answered
    /// barrier.
    unacked: VecDeque<(u64, u16, Fingerprint)>,
    /// Resends recognised in the batch being handled, until it is
    /// acknowledged: a stop before that leaves them unacknowledged, and
    /// the broker sends them again to the next run.
    matched: Vec<Fingerprint>,
    next_serial: u64,
    /// The barrier queued and not yet answered (at most one): it covers
    /// the messages with a serial number below `covers`.
    barrier: Option<Barrier>,
    /// The broker answers no barrier (since then): nothing is remembered
    /// until [`RETRY_AFTER`] has passed.
    given_up: Option<Instant>,
    /// A barrier was answered on the current connection.
    answered_here: bool,
    /// Connections in a row that ended with a barrier out and none
    /// answered on them, and after which the broker sent again none of
    /// the messages whose acks the barrier followed.
    closed_on_barrier: u32,
    /// The last connection ended with a barrier out and none answered on
    /// it: the acks that barrier followed, by packet id. A broker that
    /// closed on reading the barrier had read them all; if one of their
    /// messages comes again, the link failed before the broker read the
    /// barrier (cut, say, right after connecting, before any barrier
    /// could be answered), and the close does not count.
    suspect: Option<HashMap<u16, Fingerprint>>,
    /// The batch being appended, until it is remembered as acknowledged;
    /// read back from the file after a crash, until recovered.
    appending: Option<Appending>,
    files: Option<Files>,
    /// A list written for [`Redelivery::appending`] is being synced,
    /// without the lock: other lists wait for it (see `persist`).
    syncing: bool,
    /// A list that waited for that sync, and whether it is to be synced.
    deferred: Option<bool>,
    /// The latest list written names no message (saves rewriting it
    /// empty).
    file_empty: bool,
    /// The current connection, counted from 1 by the poller (0: none yet).
    connection: u64,
    /// It is up (from its CONNACK until it ends).
    up: bool,
    /// Whether the broker kept the session for it.
    session_present: bool,
    /// Where a give-up and a try again show (`/health`, `/metrics`).
    health: Option<Arc<SourceHealth>>,
}

/// The list's two files (`<name>.unacked` and `<name>.unacked.b`).
#[derive(Debug)]
struct Files {
    /// Shared with a sync in progress, which runs without the lock.
    slots: [Arc<File>; 2],
    /// The slot of the last synced list (at open, of the list read): the
    /// one never written over until another list is synced.
    synced: usize,
    /// The generation of the latest list written.
    generation: u64,
    /// Whether lists written before an append are synced.
    sync: bool,
}

#[derive(Debug, Clone, Copy)]
struct Barrier {
    covers: u64,
    /// Once written: its packet id, when, and on which connection.
    written: Option<(u16, Instant, u64)>,
}

impl Redelivery {
    /// Remembers in memory only (lost connections, not restarts).
    pub fn in_memory() -> Redelivery {
        Redelivery::with(VecDeque::new(), None)
    }

    /// Where the batch that was being appended when the last run stopped
    /// starts at the earliest, if one was: read the buffer from there and
    /// pass the records to [`Redelivery::recover`].
    pub fn interrupted_append(&self) -> Option<u64> {
        self.lock().appending.as_ref().map(|a| a.from_seq)
    }

    /// Of the batch being appended when the last run stopped, what made it
    /// into the buffer (`records`, from [`Redelivery::interrupted_append`]
    /// on) was stored unacknowledged, and the broker sends it again.
    pub fn recover(&self, records: &[Record]) {
        let mut state = self.lock();
        let Some(appending) = state.appending.take() else { return };
        let stored: HashSet<u32> = records.iter().map(|r| crc32c::crc32c(&r.payload)).collect();
        let found: Vec<Fingerprint> = appending
            .records
            .iter()
            .filter(|(_, crc)| stored.contains(crc))
            .map(|(f, _)| *f)
            .collect();
        tracing::info!(
            stored = found.len(),
            of = appending.records.len(),
            "a batch was being appended at the last stop; what was stored will not be stored again"
        );
        state.expected.extend(found.into_iter().map(|f| (1, f)));
        state.persist(true);
    }

    /// A batch is about to be appended (see [`Appending`]): if the process
    /// dies before [`Redelivery::acknowledging`], the next run looks for
    /// its records in the buffer. Resolves once the list naming it is
    /// durable; one call at a time (the processor appends one batch at a
    /// time).
    pub async fn appending(self: &Arc<Self>, appending: Appending) {
        let this = Arc::clone(self);
        // On the blocking pool, and synced without the lock: the poller's
        // calls meanwhile wait for no disk. Finished there even if this
        // future is dropped, so that `syncing` never stays set.
        let done = tokio::task::spawn_blocking(move || {
            if let Some((file, slot)) = this.write_appending(appending) {
                let done = file.sync_data();
                this.lock().synced(slot, done);
            }
        })
        .await;
        if let Err(e) = done {
            tracing::warn!(error = %e, "the list of unacknowledged messages was not synced: after a power cut some may be stored twice");
        }
    }

    /// The first half of [`Redelivery::appending`]: the list naming the
    /// batch written, and the file to sync if lists are synced.
    fn write_appending(&self, appending: Appending) -> Option<(Arc<File>, usize)> {
        let mut state = self.lock();
        if state.given_up.is_some() {
            return None;
        }
        state.appending = Some(appending);
        let pending = state.write();
        state.syncing = pending.is_some();
        pending
    }

    /// Remembers in `path` (and its second file) too, starting with what
    /// the last run left there; `sync`: through a power cut as well. A
    /// file that cannot be read or written is logged and leaves delivery
    /// at least once; it never stops the source.
    pub fn open(path: &Path, source: &str, sync: bool) -> Redelivery {
        let paths = [path.to_owned(), second_file(path)];
        let read = paths.clone().map(|path| match std::fs::read(&path) {
            Ok(bytes) => decode(&bytes).or_else(|| {
                tracing::warn!(%source, path = %path.display(), "unreadable list of unacknowledged messages: ignored (what it names may be stored twice)");
                None
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => {
                tracing::warn!(%source, path = %path.display(), error = %e, "cannot read the list of unacknowledged messages (what it names may be stored twice)");
                None
            }
        });
        let newest = (0..2).max_by_key(|i| read[*i].as_ref().map(|l| l.0)).unwrap_or(0);
        let (generation, expected, appending) =
            read.into_iter().nth(newest).flatten().unwrap_or_default();
        if !expected.is_empty() {
            tracing::info!(%source, n = expected.len(), "the broker may send again messages stored before the last stop; they will not be stored twice");
        }
        let open = |path: &PathBuf| {
            OpenOptions::new().create(true).truncate(false).read(true).write(true).open(path)
        };
        // With their names synced, so that a power cut keeps the files.
        let dir_synced = || match path.parent().filter(|_| sync) {
            Some(dir) => crate::durable::sync_dir(dir),
            None => Ok(()),
        };
        let opened = (open(&paths[0]), open(&paths[1]));
        let files = match (opened.0, opened.1, dir_synced()) {
            (Ok(a), Ok(b), Ok(())) => {
                Some(Files { slots: [Arc::new(a), Arc::new(b)], synced: newest, generation, sync })
            }
            (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => {
                tracing::warn!(%source, path = %path.display(), error = %e, "cannot keep the list of unacknowledged messages: after a crash they may be stored twice");
                None
            }
        };
        let redelivery = Redelivery::with(expected, files);
        redelivery.lock().appending = appending;
        redelivery
    }

    fn with(expected: VecDeque<Fingerprint>, files: Option<Files>) -> Redelivery {
        let state = State {
            file_empty: false,
            expected: expected.into_iter().map(|f| (1, f)).collect(),
            files,
            session_present: true,
            ..State::default()
        };
        Redelivery { state: Mutex::new(state), answered: Notify::new(), suspecting: false.into() }
    }

    /// Shows in `health` when the broker is given up on and tried again.
    pub fn reporting_to(self, health: Arc<SourceHealth>) -> Redelivery {
        self.lock().health = Some(health);
        self
    }

    /// Where a source keeps its list: in `dir`, named after the source
    /// (made file-safe, with a hash of the name against collisions).
    pub fn path(dir: &Path, source: &str) -> PathBuf {
        state_file(dir, "mqtt", source, "unacked")
    }

    /// The poller got CONNACK for `connection`: what no barrier covered on
    /// earlier ones may come again on it, unless the broker kept no session
    /// (`session_present = false`), when nothing comes again.
    pub fn connected(&self, connection: u64, session_present: bool) {
        let mut state = self.lock();
        state.connection = connection;
        state.up = true;
        state.session_present = session_present;
        state.answered_here = false;
        if state.barrier.is_some_and(|b| b.written.is_some_and(|(_, _, on)| on < connection)) {
            // Never answered now (`disconnected` drops it already).
            state.barrier = None;
        }
        if session_present {
            let unacked = std::mem::take(&mut state.unacked);
            state.expected.extend(unacked.into_iter().map(|(_, _, f)| (connection, f)));
        } else {
            state.expected.clear();
            state.unacked.clear();
            state.matched.clear();
        }
        drop(state);
        // A clean stop waiting for a barrier while no connection was up
        // waits no more: nothing of this connection's is unacknowledged.
        self.answered.notify_one();
    }

    /// For each message of `connection`, in order: `true` when it is a
    /// resend of one already stored. A resent run comes first on a
    /// connection: the first message that is not a resend ends it, and
    /// what was expected on that connection is forgotten.
    pub fn resent(
        &self,
        connection: u64,
        fingerprints: impl IntoIterator<Item = Fingerprint>,
    ) -> Vec<bool> {
        let mut state = self.lock();
        if state.given_up.is_some() {
            return vec![false; fingerprints.into_iter().count()];
        }
        let due = |from: u64| from <= connection;
        fingerprints
            .into_iter()
            .map(|f| {
                if !state.expected.iter().any(|(from, _)| due(*from)) {
                    return false;
                }
                match state.expected.iter().position(|(from, e)| due(*from) && *e == f) {
                    Some(i) => {
                        state.expected.remove(i);
                        state.matched.push(f);
                        true
                    }
                    None => {
                        state.expected.retain(|(from, _)| !due(*from));
                        false
                    }
                }
            })
            .collect()
    }

    /// These messages of `connection` are stored (or decided) and their
    /// acks are about to be queued: remembered until a barrier queued after
    /// the acks is answered, or, when a newer connection has started
    /// meanwhile, until they come again on it. Packet id 0 (QoS 0, when
    /// the broker granted no more) is never sent again.
    pub fn acknowledging(
        &self,
        connection: u64,
        messages: impl IntoIterator<Item = (u16, Fingerprint)>,
    ) {
        let mut state = self.lock();
        state.appending = None;
        state.matched.clear();
        if let Some(since) = state.given_up {
            if since.elapsed() < RETRY_AFTER {
                return;
            }
            state.try_again();
        }
        let current = state.connection;
        if state.barrier.is_some_and(|b| {
            b.written.is_some_and(|(_, at, on)| on == current && at.elapsed() > BARRIER_PATIENCE)
        }) {
            state.give_up("answers no UNSUBSCRIBE of a filter never subscribed");
            return;
        }
        let messages = messages.into_iter().filter(|(pkid, _)| *pkid != 0);
        if connection >= state.connection {
            for (pkid, f) in messages {
                let serial = state.next_serial;
                state.next_serial += 1;
                state.unacked.push_back((serial, pkid, f));
            }
        } else if state.session_present {
            // Their acks go out on a later connection: each one since
            // `connection` may have brought them again already.
            state.expected.extend(messages.map(|(_, f)| (connection + 1, f)));
        }
        let excess = (state.expected.len() + state.unacked.len()).saturating_sub(MAX_REMEMBERED);
        let from_expected = excess.min(state.expected.len());
        state.expected.drain(..from_expected);
        state.unacked.drain(..excess - from_expected);
        state.persist(false);
    }

    /// Whether to queue a barrier now, after the acks queued so far: when
    /// messages wait for one, none is out and a connection is up. `true`
    /// counts it as out. Queued while none is up, a barrier would go out
    /// first thing on the next connection and cover nothing of its (what
    /// it follows is expected again there); a broker that closes on a
    /// barrier would close every connection at once.
    pub fn barrier_due(&self) -> bool {
        let mut state = self.lock();
        if !state.up || state.barrier.is_some() || state.unacked.is_empty() {
            return false;
        }
        state.barrier = Some(Barrier { covers: state.next_serial, written: None });
        true
    }

    /// The poller saw the barrier written, with this packet id, on the
    /// current connection (rumqttc writes requests in the order queued;
    /// the only other UNSUBSCRIBEs, of filters no longer configured, are
    /// queued at CONNACK before any barrier of the connection can be, and
    /// one queued before them is written before them).
    pub fn barrier_written(&self, pkid: u16) {
        let mut state = self.lock();
        let connection = state.connection;
        if let Some(barrier) = state.barrier.as_mut().filter(|b| b.written.is_none()) {
            barrier.written = Some((pkid, Instant::now(), connection));
        }
    }

    /// The connection ended. A barrier written on it is never answered
    /// now, nor one rumqttc held over for the next connection that the
    /// poller dropped (`dropped`): the processor may queue another. One
    /// still queued goes out on the next connection, after the acks queued
    /// before it, and still counts.
    pub fn disconnected(&self, dropped: bool) {
        let mut state = self.lock();
        let current = state.connection;
        state.up = false;
        // Nothing the last close's barrier followed came again on this
        // connection: that close counts.
        if state.suspect.take().is_some() {
            state.closed_on_barrier += 1;
        }
        if state.answered_here {
            state.closed_on_barrier = 0;
        }
        let out_here = state.barrier.filter(|b| b.written.is_some_and(|w| w.2 == current));
        if let Some(barrier) = out_here.filter(|_| !state.answered_here && state.given_up.is_none())
        {
            let followed: HashMap<u16, Fingerprint> = state
                .unacked
                .iter()
                .filter(|(serial, ..)| *serial < barrier.covers)
                .map(|(_, pkid, f)| (*pkid, *f))
                .collect();
            // Following none of this connection's acks (queued on the
            // last one just before it ended and written on this), it
            // tells nothing.
            if !followed.is_empty() {
                if state.closed_on_barrier + 1 >= CLOSED_ON_BARRIER {
                    state.give_up("closed the connection after an UNSUBSCRIBE of a filter never subscribed, three times in a row");
                } else {
                    state.suspect = Some(followed);
                }
            }
        }
        self.suspecting.store(state.suspect.is_some(), Ordering::Relaxed);
        if state.barrier.is_some_and(|b| dropped || b.written.is_some()) {
            state.barrier = None;
            drop(state);
            self.answered.notify_one();
        }
    }

    /// The poller got a PUBLISH. If its message is one whose ack the
    /// barrier out at the last close followed, the broker had not read
    /// that ack: the link failed, the barrier did not make the broker
    /// close (see `State::suspect`).
    pub fn arrived(&self, pkid: u16, topic: &str, payload: &[u8]) {
        if !self.suspecting.load(Ordering::Relaxed) {
            return;
        }
        let mut state = self.lock();
        let followed = state.suspect.as_ref().and_then(|s| s.get(&pkid));
        if followed.is_some_and(|f| *f == Fingerprint::of(topic, payload)) {
            state.suspect = None;
            state.closed_on_barrier = 0;
        }
        // Also cleared when giving up meanwhile, which cannot reach the
        // flag: the next message is not looked at for nothing.
        self.suspecting.store(state.suspect.is_some(), Ordering::Relaxed);
    }

    /// Resolves after a barrier was answered, for the processor to queue
    /// the next one if messages still wait (only it knows which acks are
    /// queued).
    pub async fn answered(&self) {
        self.answered.notified().await;
    }

    /// Whether messages of this connection wait for a barrier.
    pub fn waiting(&self) -> bool {
        !self.lock().unacked.is_empty()
    }

    /// The poller got an UNSUBACK for `pkid`: if it answers the barrier
    /// out, the broker read every PUBACK queued before it. Any other
    /// answer proves nothing and is ignored.
    pub fn barrier_answered(&self, pkid: u16) {
        let mut state = self.lock();
        let current = state.connection;
        let answers =
            |b: &Barrier| b.written.is_some_and(|(id, _, on)| id == pkid && on == current);
        let Some(barrier) = state.barrier.filter(answers) else {
            tracing::debug!(pkid, "an UNSUBACK that answers no barrier out: ignored");
            return;
        };
        state.barrier = None;
        state.answered_here = true;
        let before = state.unacked.len();
        while state.unacked.front().is_some_and(|(serial, ..)| *serial < barrier.covers) {
            state.unacked.pop_front();
        }
        if state.unacked.len() < before {
            state.persist(false);
        }
        drop(state);
        self.answered.notify_one();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    #[cfg(test)]
    pub(super) fn remembered(&self) -> usize {
        let state = self.lock();
        state.expected.len() + state.matched.len() + state.unacked.len()
    }
}

impl State {
    /// Stops remembering: the broker does not answer barriers as needed.
    fn give_up(&mut self, why: &str) {
        tracing::warn!(
            "the MQTT broker {why}: messages it sends again after a lost connection or a crash may be stored twice for the next hour (set recognise_resends = false to skip this check)"
        );
        self.given_up = Some(Instant::now());
        self.report_given_up(true);
        // Its answer, should one come, covers nothing remembered now; out
        // when trying again, it would be taken for unanswered.
        self.barrier = None;
        self.suspect = None;
        self.expected.clear();
        self.unacked.clear();
        self.matched.clear();
        self.persist(true);
    }

    /// Ends a give-up: the broker is tried again.
    fn try_again(&mut self) {
        tracing::info!("trying again to recognise messages the MQTT broker sends again");
        self.given_up = None;
        self.closed_on_barrier = 0;
        self.report_given_up(false);
    }

    fn report_given_up(&self, given_up: bool) {
        if let Some(health) = &self.health {
            health.set_resend_check_given_up(given_up);
        }
    }

    /// Writes the list (see [`State::write`]); with `sync`, syncs it, and
    /// it becomes the synced one. While a sync runs without the lock, the
    /// write waits for it to end ([`State::synced`]): written now, it would
    /// go into the very file being synced, which would then count as
    /// synced with bytes the sync may have missed.
    fn persist(&mut self, sync: bool) {
        if self.syncing {
            self.deferred = Some(sync || self.deferred == Some(true));
            return;
        }
        if let Some((file, slot)) = self.write().filter(|_| sync) {
            let done = file.sync_data();
            self.synced(slot, done);
        }
    }

    /// A sync of the list written into `slot` ended: on success that list
    /// is the synced one. Then writes the list that waited for it.
    fn synced(&mut self, slot: usize, done: std::io::Result<()>) {
        self.syncing = false;
        match done {
            Ok(()) => {
                if let Some(files) = &mut self.files {
                    files.synced = slot;
                }
            }
            Err(e) => self.fail(&e),
        }
        if let Some(sync) = self.deferred.take() {
            self.persist(sync);
        }
    }

    fn fail(&mut self, e: &std::io::Error) {
        tracing::warn!(error = %e, "cannot write the list of unacknowledged messages: after a crash they may be stored twice");
        self.files = None;
    }

    /// Writes what may come again (`expected`, `matched`, `unacked`) and
    /// `appending` into the file not holding the last synced list, in one
    /// write (a torn one fails its checksum and is ignored on reading).
    /// Returns that file and its slot when lists are synced, for the caller
    /// to sync and then pass to [`State::synced`].
    fn write(&mut self) -> Option<(Arc<File>, usize)> {
        let n = self.expected.len() + self.matched.len() + self.unacked.len();
        let empty = n == 0 && self.appending.is_none();
        let Some(files) = &mut self.files else { return None };
        if empty && self.file_empty {
            return None;
        }
        let fingerprints = self
            .expected
            .iter()
            .map(|(_, f)| f)
            .chain(&self.matched)
            .chain(self.unacked.iter().map(|(.., f)| f));
        files.generation += 1;
        let bytes = encode(files.generation, fingerprints, n, self.appending.as_ref());
        let slot = 1 - files.synced;
        let file = &files.slots[slot];
        match file.write_all_at(&bytes, 0) {
            Ok(()) => {
                self.file_empty = empty;
                files.sync.then(|| (Arc::clone(file), slot))
            }
            Err(e) => {
                self.fail(&e);
                None
            }
        }
    }
}

/// The list's second file, beside `path`.
fn second_file(path: &Path) -> PathBuf {
    let mut name = OsString::from(path.as_os_str());
    name.push(".b");
    PathBuf::from(name)
}

/// A file in `dir` for what a source keeps across restarts:
/// `<prefix>-<source>-<hash>.<extension>`, the source's name made
/// file-safe, with a hash of it against collisions.
pub(super) fn state_file(dir: &Path, prefix: &str, source: &str, extension: &str) -> PathBuf {
    let safe: String = source
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' })
        .take(64)
        .collect();
    let hash = crc32c::crc32c(source.as_bytes());
    dir.join(format!("{prefix}-{safe}-{hash:08x}.{extension}"))
}

/// A batch being appended: where its records start at the earliest (the
/// buffer's durable watermark before the append) and, per record, its
/// message's fingerprint and the CRC-32C of the record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Appending {
    pub from_seq: u64,
    pub records: Vec<(Fingerprint, u32)>,
}

/// Magic; generation (u64 LE); count (u32 LE) and the remembered
/// fingerprints (u64 LE); 0, or 1 and an [`Appending`] (from_seq u64,
/// count u32, fingerprint u64 and CRC u32 each); CRC-32C of all that.
/// Whatever follows (an older, longer list) is ignored.
fn encode<'a>(
    generation: u64,
    fingerprints: impl Iterator<Item = &'a Fingerprint>,
    n: usize,
    appending: Option<&Appending>,
) -> Vec<u8> {
    let tentative = appending.map_or(0, |a| a.records.len());
    let mut bytes = Vec::with_capacity(33 + 8 * n + 12 * tentative);
    bytes.extend_from_slice(MAGIC);
    bytes.extend_from_slice(&generation.to_le_bytes());
    bytes.extend_from_slice(&u32::try_from(n).unwrap_or(u32::MAX).to_le_bytes());
    for f in fingerprints {
        bytes.extend_from_slice(&f.0.to_le_bytes());
    }
    match appending {
        None => bytes.push(0),
        Some(a) => {
            bytes.push(1);
            bytes.extend_from_slice(&a.from_seq.to_le_bytes());
            bytes.extend_from_slice(&u32::try_from(tentative).unwrap_or(u32::MAX).to_le_bytes());
            for (f, crc) in &a.records {
                bytes.extend_from_slice(&f.0.to_le_bytes());
                bytes.extend_from_slice(&crc.to_le_bytes());
            }
        }
    }
    let crc = crc32c::crc32c(&bytes);
    bytes.extend_from_slice(&crc.to_le_bytes());
    bytes
}

/// A little-endian reader over a state file's bytes; `None` past the end.
pub(super) struct Reader<'a>(&'a [u8], usize);

impl<'a> Reader<'a> {
    pub fn new(bytes: &'a [u8]) -> Reader<'a> {
        Reader(bytes, 0)
    }
    fn take<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.bytes(N)?.try_into().ok()
    }
    pub fn bytes(&mut self, n: usize) -> Option<&'a [u8]> {
        let bytes = self.0.get(self.1..self.1.checked_add(n)?)?;
        self.1 += n;
        Some(bytes)
    }
    pub fn u16(&mut self) -> Option<u16> {
        self.take().map(u16::from_le_bytes)
    }
    pub fn u32(&mut self) -> Option<u32> {
        self.take().map(u32::from_le_bytes)
    }
    pub fn u64(&mut self) -> Option<u64> {
        self.take().map(u64::from_le_bytes)
    }
    /// A count of at most [`MAX_REMEMBERED`].
    fn count(&mut self) -> Option<usize> {
        usize::try_from(self.u32()?).ok().filter(|n| *n <= MAX_REMEMBERED)
    }
}

/// A list read back: its generation, the fingerprints that may come
/// again and the batch that was being appended.
type Listed = (u64, VecDeque<Fingerprint>, Option<Appending>);

/// `None` for anything [`encode`] did not write; an empty file is an empty
/// list of generation 0.
fn decode(bytes: &[u8]) -> Option<Listed> {
    if bytes.is_empty() {
        return Some(Listed::default());
    }
    let mut r = Reader::new(bytes);
    let generation = match &r.take::<4>()? {
        magic if magic == MAGIC => r.u64()?,
        magic if magic == MAGIC_UNGENERATED => 0,
        _ => return None,
    };
    let n = r.count()?;
    let expected = (0..n).map(|_| r.u64().map(Fingerprint)).collect::<Option<VecDeque<_>>>()?;
    let appending = match r.take::<1>()? {
        [0] => None,
        [1] => {
            let from_seq = r.u64()?;
            let m = r.count()?;
            let records = (0..m)
                .map(|_| Some((Fingerprint(r.u64()?), r.u32()?)))
                .collect::<Option<Vec<_>>>()?;
            Some(Appending { from_seq, records })
        }
        _ => return None,
    };
    let end = r.1;
    (crc32c::crc32c(&bytes[..end]) == r.u32()?).then_some((generation, expected, appending))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fp(payload: &str) -> Fingerprint {
        Fingerprint::of("t", payload.as_bytes())
    }

    fn fps(payloads: &[&str]) -> Vec<Fingerprint> {
        payloads.iter().map(|p| fp(p)).collect()
    }

    #[test]
    fn fingerprints_tell_topic_from_payload() {
        assert_ne!(Fingerprint::of("ab", b"c"), Fingerprint::of("a", b"bc"));
        assert_ne!(Fingerprint::of("t", b"1"), Fingerprint::of("t", b"2"));
        assert_eq!(Fingerprint::of("t", b"1"), Fingerprint::of("t", b"1"));
    }

    /// Queues a barrier after what is remembered, writes and answers it.
    fn barrier(r: &Redelivery) {
        assert!(r.barrier_due());
        r.barrier_written(9);
        r.barrier_answered(9);
    }

    #[test]
    fn after_a_reconnect_what_no_barrier_covered_is_recognised_once_then_the_run_ends() {
        let r = Redelivery::in_memory();
        r.connected(1, false);
        assert_eq!(r.resent(1, fps(&["a", "b", "c", "d"])), [false; 4]);
        r.acknowledging(1, [(1, fp("a"))]);
        barrier(&r);
        r.acknowledging(1, [(2, fp("b")), (3, fp("c")), (4, fp("d"))]);
        // The connection is lost with a barrier out: b, c and d may come
        // again. c's ack got through, so Mosquitto sends b and d, then new
        // ones.
        assert!(r.barrier_due());
        r.connected(2, true);
        assert_eq!(r.resent(2, fps(&["b", "d", "b", "e"])), [true, true, false, false]);
        // The run ended at the new "b": c is forgotten, a later d is new.
        assert_eq!(r.resent(2, fps(&["c", "d"])), [false, false]);
    }

    #[tokio::test]
    async fn a_barrier_covers_only_what_was_queued_before_it_and_asks_for_the_next() {
        let r = Redelivery::in_memory();
        r.connected(1, true);
        assert!(!r.barrier_due(), "nothing waits");
        r.acknowledging(1, [(1, fp("a"))]);
        assert!(r.barrier_due());
        r.barrier_written(5);
        r.acknowledging(1, [(2, fp("b"))]);
        assert!(!r.barrier_due(), "one barrier out at a time");
        r.barrier_answered(5);
        assert_eq!(r.remembered(), 1);
        // b still waits: the processor is told to queue the next barrier.
        tokio::time::timeout(Duration::from_secs(5), r.answered()).await.unwrap();
        assert!(r.waiting());
        barrier(&r);
        assert!(!r.waiting());
        assert_eq!(r.remembered(), 0);
        // An answer without a barrier out covers nothing.
        r.acknowledging(1, [(3, fp("c"))]);
        r.barrier_answered(9);
        assert_eq!(r.remembered(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_broker_that_answers_no_barrier_is_given_up_on() {
        let health = Arc::new(SourceHealth::new("s", "mqtt"));
        let given_up = || health.to_json()["resend_check_given_up"] == true;
        let r = Redelivery::in_memory().reporting_to(Arc::clone(&health));
        r.connected(1, true);
        r.acknowledging(1, [(1, fp("a"))]);
        assert!(r.barrier_due());
        // Queued, not yet written: the time does not count against it.
        tokio::time::advance(BARRIER_PATIENCE * 2).await;
        r.acknowledging(1, [(2, fp("b"))]);
        r.barrier_written(1);
        // Nor does it once the connection ended.
        r.disconnected(false);
        tokio::time::advance(BARRIER_PATIENCE * 2).await;
        r.connected(2, true);
        r.acknowledging(2, [(2, fp("b"))]);
        assert!(r.barrier_due());
        r.barrier_written(2);
        tokio::time::advance(BARRIER_PATIENCE / 2).await;
        r.acknowledging(2, [(3, fp("c"))]);
        assert_eq!(r.remembered(), 4);
        // A minute on with messages flowing and no answer: given up.
        tokio::time::advance(BARRIER_PATIENCE).await;
        assert!(!given_up());
        r.acknowledging(2, [(4, fp("d"))]);
        assert_eq!(r.remembered(), 0);
        assert!(!r.barrier_due());
        assert!(given_up(), "shown in health");
        r.connected(3, true);
        assert_eq!(r.resent(3, fps(&["a", "b"])), [false, false]);
        r.acknowledging(3, [(5, fp("e"))]);
        assert_eq!(r.remembered(), 0);
        // An hour on, it tries again, with a barrier of its own.
        tokio::time::advance(RETRY_AFTER).await;
        r.acknowledging(3, [(6, fp("f"))]);
        assert!(!given_up());
        assert_eq!(r.remembered(), 1);
        assert!(r.barrier_due());
        r.barrier_written(3);
        r.barrier_answered(3);
        assert_eq!(r.remembered(), 0);
    }

    #[test]
    fn a_broker_that_closes_connections_on_a_barrier_is_given_up_on() {
        let health = Arc::new(SourceHealth::new("s", "mqtt"));
        let r = Redelivery::in_memory().reporting_to(Arc::clone(&health));
        let mut serial = 0;
        let mut connection = |r: &Redelivery, n: u64, answered: bool| {
            r.connected(n, true);
            // The broker read the ack of the last message with packet id
            // 2 and sends a new one with it.
            r.arrived(2, "t", format!("new on {n}").as_bytes());
            if answered {
                serial += 1;
                r.acknowledging(n, [(1, fp(&format!("{serial}")))]);
                barrier(r);
            }
            serial += 1;
            r.acknowledging(n, [(2, fp(&format!("{serial}")))]);
            assert!(r.barrier_due());
            r.barrier_written(3);
            r.disconnected(false);
        };
        // Two ends on a barrier, then a connection on which one was
        // answered: a bad network, not the broker.
        connection(&r, 1, false);
        connection(&r, 2, false);
        connection(&r, 3, true);
        connection(&r, 4, false);
        connection(&r, 5, false);
        assert!(r.remembered() > 0);
        assert_eq!(health.to_json()["resend_check_given_up"], false);
        // The third in a row.
        connection(&r, 6, false);
        assert_eq!(r.remembered(), 0);
        assert_eq!(health.to_json()["resend_check_given_up"], true);
        r.acknowledging(7, [(1, fp("x"))]);
        assert!(!r.barrier_due(), "no more barriers");
    }

    /// A link cut again and again before the broker read the barrier (as
    /// right after each connect, before any barrier could be answered) is
    /// not a broker that closes on barriers: what the barrier followed
    /// comes again.
    #[test]
    fn connections_cut_before_the_broker_read_the_barrier_are_not_taken_for_closes_on_it() {
        let r = Redelivery::in_memory();
        for n in 1..=2 * u64::from(CLOSED_ON_BARRIER) {
            r.connected(n, true);
            if n > 1 {
                r.arrived(2, "t", format!("{}", n - 1).as_bytes());
            }
            r.acknowledging(n, [(2, fp(&format!("{n}")))]);
            assert!(r.barrier_due(), "given up before connection {n}");
            r.barrier_written(3);
            r.disconnected(false);
        }
        assert!(r.remembered() > 0);
    }

    /// A barrier queued on one connection and written on the next,
    /// which is cut before the answer, followed none of that connection's
    /// acks: it tells nothing about the broker.
    #[test]
    fn a_barrier_carried_over_to_a_cut_connection_does_not_count() {
        let r = Redelivery::in_memory();
        for k in 1..=2 * u64::from(CLOSED_ON_BARRIER) {
            r.connected(2 * k - 1, true);
            r.acknowledging(2 * k - 1, [(2, fp(&format!("{k}")))]);
            assert!(r.barrier_due(), "given up before connection {}", 2 * k - 1);
            r.disconnected(false);
            r.connected(2 * k, true);
            r.barrier_written(3);
            r.disconnected(false);
        }
        assert!(r.remembered() > 0);
    }

    #[test]
    fn only_the_answer_to_the_barrier_out_on_its_connection_counts() {
        let r = Redelivery::in_memory();
        r.connected(1, true);
        r.acknowledging(1, [(1, fp("a"))]);
        assert!(r.barrier_due());
        r.barrier_written(7);
        // Written on a connection that ended: never answered now.
        r.disconnected(false);
        r.connected(2, true);
        r.acknowledging(2, [(1, fp("x"))]);
        assert!(r.barrier_due());
        r.barrier_written(8);
        r.acknowledging(2, [(2, fp("y"))]);
        // An answer to another packet id proves nothing about x's ack, and
        // leaves the barrier out.
        r.barrier_answered(7);
        assert_eq!(r.remembered(), 3);
        assert!(!r.barrier_due());
        r.barrier_answered(8);
        assert_eq!(r.remembered(), 2, "a is still expected, y waits");

        // Queued when the connection ended and held over by rumqttc, which
        // the poller dropped: another may be queued once one is up.
        assert!(r.barrier_due());
        r.disconnected(true);
        assert!(!r.barrier_due(), "none while no connection is up");
        r.connected(3, true);
        r.acknowledging(3, [(1, fp("z"))]);
        assert!(r.barrier_due(), "the dropped barrier is not waited for");
        // Still queued when the connection ended: it goes out on the next,
        // after the acks queued before it, and counts there.
        r.disconnected(false);
        r.connected(4, true);
        r.acknowledging(4, [(1, fp("w"))]);
        r.barrier_written(3);
        r.barrier_answered(3);
        assert_eq!(r.remembered(), 4, "a, y and z expected, w not covered");
        barrier(&r);
        assert_eq!(r.remembered(), 3);
    }

    #[test]
    fn messages_of_the_old_connection_handled_after_the_reconnect_are_expected_on_the_new() {
        let r = Redelivery::in_memory();
        r.connected(1, true);
        r.acknowledging(1, [(1, fp("a"))]);
        r.connected(2, true);
        // Still in the processor's queue when the connection changed: b,
        // and an "a" equal to the one expected, which is no resend on its
        // own connection.
        assert_eq!(r.resent(1, fps(&["b", "a"])), [false, false]);
        r.acknowledging(1, [(2, fp("b")), (3, fp("a"))]);
        // No barrier on the new connection covers them.
        assert!(!r.barrier_due());
        assert_eq!(r.resent(2, fps(&["a", "b", "a", "a"])), [true, true, true, false]);

        // Handled after two reconnects: they may come again on the first.
        r.connected(3, true);
        r.connected(4, true);
        r.acknowledging(2, [(4, fp("c"))]);
        assert_eq!(r.resent(3, fps(&["c", "d"])), [true, false]);
    }

    #[test]
    fn a_new_session_or_an_answered_barrier_expects_nothing() {
        let r = Redelivery::in_memory();
        r.connected(1, true);
        r.acknowledging(1, [(1, fp("a")), (2, fp("b"))]);
        barrier(&r);
        r.connected(2, true);
        assert_eq!(r.resent(2, fps(&["a", "b"])), [false, false]);

        r.acknowledging(2, [(3, fp("c"))]);
        r.connected(3, false);
        assert_eq!(r.resent(3, fps(&["c"])), [false]);
        // Without a session, late messages of an old connection are not
        // expected either.
        r.acknowledging(2, [(4, fp("d"))]);
        assert_eq!(r.remembered(), 0);
        // QoS 0 messages are not remembered: nothing would come again.
        r.acknowledging(3, [(5, fp("x")), (0, fp("y"))]);
        assert_eq!(r.remembered(), 1);
    }

    #[test]
    fn what_a_crash_leaves_is_expected_by_the_next_run() {
        let dir = tempfile::tempdir().unwrap();
        let path = Redelivery::path(dir.path(), "floor/1 readers");
        assert!(path.file_name().unwrap().to_str().unwrap().starts_with("mqtt-floor_1_readers-"));
        let r = Redelivery::open(&path, "s", true);
        r.connected(1, true);
        r.acknowledging(1, [(7, fp("a"))]);
        barrier(&r);
        r.acknowledging(1, [(8, fp("b")), (9, fp("c"))]);
        drop(r); // the crash: no barrier covered b and c

        let r = Redelivery::open(&path, "s", true);
        r.connected(1, true);
        assert_eq!(r.resent(1, fps(&["b"])), [true]);
        // The resend is remembered again until a barrier covers it: a
        // second crash now would still recognise b and c.
        r.acknowledging(1, [(1, fp("b"))]);
        drop(r);
        let r = Redelivery::open(&path, "s", true);
        r.connected(1, true);
        assert_eq!(r.resent(1, fps(&["b", "c", "c"])), [true, true, false]);
        r.acknowledging(1, [(1, fp("b")), (2, fp("c")), (3, fp("c"))]);
        barrier(&r);
        drop(r);
        // All covered: nothing expected.
        let r = Redelivery::open(&path, "s", true);
        assert_eq!(r.remembered(), 0);
        // A broker that lost the session sends nothing again.
        r.acknowledging(0, [(1, fp("a"))]);
        drop(r);
        let r = Redelivery::open(&path, "s", true);
        r.connected(1, false);
        assert_eq!(r.resent(1, fps(&["a"])), [false]);
    }

    #[tokio::test]
    async fn copies_recognised_in_a_batch_that_was_not_acknowledged_are_expected_again() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("list");
        let r = Arc::new(Redelivery::open(&path, "s", true));
        r.connected(1, true);
        r.acknowledging(1, [(1, fp("a")), (2, fp("b"))]);
        drop(r); // a crash before a barrier: a and b may come again

        let r = Arc::new(Redelivery::open(&path, "s", true));
        r.connected(1, true);
        assert_eq!(r.resent(1, fps(&["a", "x"])), [true, false]);
        let crc = crc32c::crc32c(b"record x");
        r.appending(Appending { from_seq: 1, records: vec![(fp("x"), crc)] }).await;
        drop(r); // a crash while x is appended: a is not acknowledged either

        let r = Arc::new(Redelivery::open(&path, "s", true));
        r.recover(&[]);
        r.connected(1, true);
        assert_eq!(r.resent(1, fps(&["a", "x"])), [true, false]);
        // Stopped again before anything else was written: still listed.
        drop(r);
        let r = Arc::new(Redelivery::open(&path, "s", true));
        r.connected(1, true);
        assert_eq!(r.resent(1, fps(&["a", "y"])), [true, false]);
        r.acknowledging(1, [(1, fp("a")), (3, fp("y"))]);
        assert_eq!(r.remembered(), 2, "both wait for a barrier, nothing else");
    }

    /// The newest readable list of the two files.
    fn newest(path: &Path) -> Listed {
        [path.to_owned(), second_file(path)]
            .iter()
            .filter_map(|p| decode(&std::fs::read(p).unwrap_or_default()))
            .max_by_key(|l| l.0)
            .unwrap()
    }

    #[tokio::test]
    async fn a_damaged_list_is_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("list");
        let r = Arc::new(Redelivery::open(&path, "s", true));
        r.acknowledging(0, [(1, fp("a")), (2, fp("b"))]);
        r.appending(Appending { from_seq: 7, records: vec![(fp("c"), 99)] }).await;
        drop(r);
        let (generation, list, appending) = newest(&path);
        assert_eq!((generation, Vec::from(list)), (2, fps(&["a", "b"])));
        assert_eq!(appending, Some(Appending { from_seq: 7, records: vec![(fp("c"), 99)] }));
        let mut bytes = std::fs::read(&path).unwrap();
        for at in [4, 10, 24, 30, bytes.len() - 1] {
            let mut damaged = bytes.clone();
            damaged[at] ^= 1;
            assert!(decode(&damaged).is_none(), "byte {at}");
        }
        bytes[20] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        let r = Arc::new(Redelivery::open(&path, "s", true));
        assert_eq!((r.remembered(), r.interrupted_append()), (0, None));
        for bad in
            [&b"OGR3"[..], b"OGR3\0\0\0\0\0\0\0\0\xff\xff\xff\xff", b"XXXX\0\0\0\0", &bytes[..13]]
        {
            assert!(decode(bad).is_none(), "{bad:?}");
        }
        // A shorter list over a longer one: the tail is ignored.
        r.connected(1, true);
        r.acknowledging(1, [(1, fp("a")), (2, fp("b"))]);
        assert!(r.barrier_due());
        r.barrier_written(1);
        r.acknowledging(1, [(3, fp("c"))]);
        r.barrier_answered(1);
        r.acknowledging(1, [(4, fp("d"))]);
        drop(r);
        let (_, list, appending) = newest(&path);
        assert_eq!((Vec::from(list), appending), (fps(&["c", "d"]), None));
    }

    /// A power cut may tear the write after the last synced list: the
    /// next run reads the synced one, which names the batch appending.
    /// Lists written before two files were kept read as generation 0.
    #[tokio::test]
    async fn a_torn_write_leaves_the_synced_list() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("list");
        let r = Arc::new(Redelivery::open(&path, "s", true));
        r.connected(1, true);
        r.appending(Appending { from_seq: 3, records: vec![(fp("a"), 11)] }).await;
        r.acknowledging(1, [(1, fp("a"))]);
        drop(r);
        // The synced list went to one file, the later one to the other.
        let synced = decode(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!((synced.0, synced.2.map(|a| a.from_seq)), (1, Some(3)));
        let later = decode(&std::fs::read(second_file(&path)).unwrap()).unwrap();
        assert_eq!((later.0, later.2), (2, None));
        let mut torn = std::fs::read(second_file(&path)).unwrap();
        torn.truncate(torn.len() / 2);
        std::fs::write(second_file(&path), &torn).unwrap();
        let r = Arc::new(Redelivery::open(&path, "s", true));
        assert_eq!(r.interrupted_append(), Some(3));
        drop(r);

        let old = dir.path().join("old");
        let mut bytes = encode(9, fps(&["x"]).iter(), 1, None);
        bytes.splice(..12, MAGIC_UNGENERATED.iter().copied());
        let crc = crc32c::crc32c(&bytes[..bytes.len() - 4]);
        let at = bytes.len() - 4;
        bytes[at..].copy_from_slice(&crc.to_le_bytes());
        std::fs::write(&old, &bytes).unwrap();
        assert_eq!(decode(&bytes).map(|l| (l.0, Vec::from(l.1))), Some((0, fps(&["x"]))));
        let r = Arc::new(Redelivery::open(&old, "s", true));
        r.connected(1, true);
        assert_eq!(r.resent(1, fps(&["x"])), [true]);
    }

    /// What the poller changes while the list naming a batch is synced is
    /// written after the sync, into the other file: written into the file
    /// being synced, it would count as synced unsynced.
    #[test]
    fn a_list_changed_during_a_sync_is_written_after_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("list");
        let r = Redelivery::open(&path, "s", true);
        r.connected(1, true);
        r.acknowledging(1, [(1, fp("a"))]);
        assert!(r.barrier_due());
        r.barrier_written(7);
        // `appending`, stopped between its write and the end of its sync.
        let batch = Appending { from_seq: 5, records: vec![(fp("b"), 11)] };
        let (file, slot) = r.write_appending(batch.clone()).unwrap();
        let slots = [path.clone(), second_file(&path)];
        let being_synced = std::fs::read(&slots[slot]).unwrap();
        r.barrier_answered(7); // a's ack was read: a is no longer listed
        assert_eq!(std::fs::read(&slots[slot]).unwrap(), being_synced);
        assert_eq!(r.remembered(), 0);

        r.lock().synced(slot, file.sync_data());
        let synced = decode(&being_synced).unwrap();
        let (generation, list, appending) = newest(&path);
        assert_eq!(generation, synced.0 + 1);
        assert_eq!((Vec::from(list), appending), (vec![], Some(batch)));
        let later = decode(&std::fs::read(&slots[1 - slot]).unwrap()).unwrap();
        assert_eq!(later.0, generation, "the later list went into the other file");
        // The next write goes beside the synced list again.
        r.acknowledging(1, [(2, fp("b"))]);
        assert_eq!(std::fs::read(&slots[slot]).unwrap(), being_synced);
    }

    fn record(seq: u64, payload: &str) -> Record {
        Record { seq, payload: bytes::Bytes::from(payload.to_owned()) }
    }

    #[tokio::test]
    async fn what_an_interrupted_append_stored_is_expected_and_the_rest_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("list");
        let r = Arc::new(Redelivery::open(&path, "s", true));
        assert_eq!(r.interrupted_append(), None);
        r.connected(1, true);
        r.acknowledging(1, [(1, fp("a"))]);
        let crc = |p: &str| crc32c::crc32c(p.as_bytes());
        let batch = vec![(fp("b"), crc("record b")), (fp("c"), crc("record c"))];
        r.appending(Appending { from_seq: 40, records: batch }).await;
        drop(r); // the crash: the append had stored b's record, not c's

        let r = Arc::new(Redelivery::open(&path, "s", true));
        assert_eq!(r.interrupted_append(), Some(40));
        r.recover(&[record(40, "another source's"), record(41, "record b")]);
        assert_eq!(r.interrupted_append(), None);
        r.connected(1, true);
        assert_eq!(r.resent(1, fps(&["a", "b", "c"])), [true, true, false]);

        // A finished append leaves nothing to look for.
        r.appending(Appending { from_seq: 50, records: vec![(fp("d"), crc("record d"))] }).await;
        r.acknowledging(1, [(2, fp("d"))]);
        drop(r);
        assert_eq!(Redelivery::open(&path, "s", true).interrupted_append(), None);
    }

    #[test]
    fn memory_is_bounded() {
        let r = Redelivery::in_memory();
        for i in 0..3u16 {
            r.acknowledging(0, (1..30_001u16).map(|p| (p, fp(&format!("{i}-{p}")))));
        }
        assert_eq!(r.remembered(), MAX_REMEMBERED);
    }
}
