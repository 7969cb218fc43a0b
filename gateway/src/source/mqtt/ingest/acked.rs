//! What the ingest endpoint remembers of the messages it acknowledged,
//! per persistent client, in order, so that a copy a device sends again
//! (same packet id, with DUP or leading a reconnection) after its PUBACK
//! was lost is not stored twice, also after the gateway crashed.
//!
//! A device resends what it got no PUBACK for: after a crash those are the
//! messages of the batches in flight, appended or half appended. So the
//! memory is kept in a journal in the buffer's directory, one entry per
//! write: before a batch is appended, an *appending* entry names its
//! records (packet id, fingerprint, the record's CRC-32C) and where in the
//! buffer they start at the earliest; once appended, an *acknowledged*
//! entry names every QoS 1 message of the batch. The next run replays the
//! journal; of a batch appending and never acknowledged it reads the
//! buffer back and remembers the records it finds there, only those: a
//! message is never taken for stored that is not.
//!
//! A power cut keeps what was synced. Where the buffer is kept through
//! one (its `fsync` is not `never`), each batch's *appending* entry is
//! made durable before the batch is appended ([`Acked::synced`]), with
//! one fdatasync for the entries of every connection written meanwhile:
//! a batch the buffer holds is then always named, and a power cut leaves
//! at worst a batch appending, which the next run reads back like a
//! crash's. *Acknowledged* entries ride along with the next sync. What
//! stays stored twice are the records of an interrupted append that the
//! uplink had already shipped (the buffer no longer holds them to be read
//! back). The journal is compacted, rewritten as the memory it replays
//! to, once it grew past twice that; the rewrite is synced before it
//! replaces the journal. With many clients the rewrite is megabytes, so
//! it is written and synced on a blocking thread without the lock: the
//! connections go on, and the entries they write meanwhile are added to
//! the rewrite (and synced) under the lock, just before it replaces the
//! journal.

use std::collections::{HashMap, HashSet, VecDeque};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use rumqttc::mqttbytes::QoS;
use rumqttc::mqttbytes::v4::Publish;

use super::super::redelivery::{Fingerprint, Reader};
use crate::buffer::Record;

/// Messages remembered per client: far more than a device keeps in
/// flight.
pub(super) const ACKED_PER_CLIENT: usize = 1024;

/// The journal is compacted once it is this long at least (and twice what
/// the last compaction wrote).
const COMPACT_MIN: u64 = 4 << 20;

/// Longest entry read back: a snapshot of one client (1,024 messages and a
/// client id of up to 64 KiB) or a batch (at most 10,000 messages) fits.
const MAX_ENTRY: usize = 1 << 20;

/// A QoS 1 message as remembered: its packet id and fingerprint.
type Message = (u16, Fingerprint);

const APPENDING: u8 = 1;
const ACKNOWLEDGED: u8 = 2;

/// The memory, shared by every connection of the endpoint.
#[derive(Debug)]
pub(super) struct Acked {
    /// Shared with a compaction in progress, which takes it to finish.
    state: Arc<Mutex<State>>,
    /// Held by the one connection syncing the journal; the others wait and
    /// then find their entries synced with it.
    syncing: tokio::sync::Mutex<()>,
}

#[derive(Debug, Default)]
struct State {
    /// Per persistent client, its latest QoS 1 messages acknowledged.
    clients: HashMap<String, VecDeque<Message>>,
    /// Most clients remembered.
    max_clients: usize,
    /// Batches being appended, by number: written again when the journal
    /// is compacted.
    appending: HashMap<u64, Batch>,
    next_batch: u64,
    /// Batches of the last run appending when it stopped, by number, until
    /// [`Acked::recover`] learned what of them was stored.
    interrupted: Vec<(u64, Batch)>,
    /// Where the journal is kept, while it can be.
    path: Option<PathBuf>,
    journal: Option<Journal>,
    /// Whether [`Acked::synced`] makes entries durable.
    sync: bool,
    /// Entries written so far, and how many of them are durable.
    written: u64,
    durable: u64,
    /// While a compaction writes its rewrite without the lock: the entries
    /// written since its snapshot, to be added to the rewrite.
    tail: Option<Vec<u8>>,
}

/// A compaction's rewrite of the journal: written to `tmp`, then renamed
/// to `path`.
struct Rewrite {
    tmp: PathBuf,
    path: PathBuf,
    /// Whether what is added is synced.
    sync: bool,
    file: Option<File>,
    /// Bytes added, and of them the memory's snapshot.
    len: u64,
    snapshot: u64,
}

/// A batch about to be appended: its client, where its records start at
/// the earliest (the buffer's watermark before the append) and, per QoS 1
/// record, the packet id, the message's fingerprint and the record's
/// CRC-32C.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Batch {
    pub client: String,
    pub from_seq: u64,
    pub records: Vec<(u16, Fingerprint, u32)>,
}

/// The journal open for appending: its length, and the length at which it
/// is compacted.
#[derive(Debug)]
struct Journal {
    /// Shared with a sync in progress, which runs without the lock.
    file: Arc<File>,
    len: u64,
    compact_at: u64,
}

impl Acked {
    /// Remembers in memory only: lost connections, not restarts.
    pub fn in_memory(max_clients: usize) -> Acked {
        Acked::with(State { max_clients, ..State::default() })
    }

    /// Remembers in the journal at `path` too, starting with what the last
    /// run left there; `sync`: through a power cut as well (see
    /// [`Acked::synced`]). A journal that cannot be read or written is
    /// logged and leaves delivery at least once; it never stops the
    /// endpoint.
    pub fn open(path: &Path, source: &str, max_clients: usize, sync: bool) -> Acked {
        let mut state = State { max_clients, sync, ..State::default() };
        match std::fs::read(path) {
            Ok(bytes) => {
                let read = state.replay(&bytes);
                if read < bytes.len() {
                    tracing::warn!(%source, path = %path.display(), at = read, "the journal of acknowledged messages ends in a damaged entry: what follows is ignored (those messages may be stored twice if sent again)");
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(%source, path = %path.display(), error = %e, "cannot read the journal of acknowledged messages: messages sent again may be stored twice");
            }
        }
        state.interrupted = state.appending.drain().collect();
        state.interrupted.sort_by_key(|(_, b)| b.from_seq);
        if !state.clients.is_empty() || !state.interrupted.is_empty() {
            tracing::info!(%source, clients = state.clients.len(), interrupted = state.interrupted.len(), "remembered what devices may send again from before the last stop");
        }
        state.path = Some(path.to_owned());
        let acked = Acked::with(state);
        acked.lock().compact();
        acked
    }

    fn with(state: State) -> Acked {
        Acked { state: Arc::new(Mutex::new(state)), syncing: tokio::sync::Mutex::new(()) }
    }

    /// Makes every entry written so far durable, when the journal is
    /// synced: called after [`Acked::appending`] and before the append, so
    /// that no batch reaches the buffer unnamed. One connection syncs at a
    /// time; the entries others wrote meanwhile go with the next sync, one
    /// fdatasync for all of them (group commit, as the buffer's).
    pub async fn synced(&self) {
        let wanted = {
            let state = self.lock();
            if !state.sync || state.durable >= state.written {
                return;
            }
            state.written
        };
        let _one = self.syncing.lock().await;
        let (file, written) = {
            let state = self.lock();
            match &state.journal {
                Some(journal) if state.durable < wanted => {
                    (Arc::clone(&journal.file), state.written)
                }
                // Synced by another connection, or no journal any more.
                _ => return,
            }
        };
        let done = tokio::task::spawn_blocking(move || file.sync_data()).await;
        let mut state = self.lock();
        match done {
            Ok(Ok(())) => state.durable = state.durable.max(written),
            Ok(Err(e)) => state.fail("sync", &e),
            Err(e) => state.fail("sync", &std::io::Error::other(e)),
        }
    }

    /// Entries written and entries durable.
    #[cfg(test)]
    pub fn journaled(&self) -> (u64, u64) {
        let state = self.lock();
        (state.written, state.durable)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// Writes `entry` to the journal; when that makes it due for
    /// compaction, compacts it on a blocking thread (in line outside a
    /// runtime), without the lock.
    fn write(&self, mut state: MutexGuard<'_, State>, entry: &[u8]) {
        if !state.write(entry) {
            return;
        }
        let Some((mut rewrite, snapshot)) = state.begin_rewrite() else { return };
        drop(state);
        let shared = Arc::clone(&self.state);
        let compact = move || {
            // The snapshot, and the entries written meanwhile, without the
            // lock; what comes after those, with it.
            let mut added = rewrite.add(&snapshot);
            if added.is_ok() {
                let meanwhile = lock(&shared).tail.as_mut().map(std::mem::take);
                added = rewrite.add(&meanwhile.unwrap_or_default());
            }
            lock(&shared).finish_rewrite(rewrite, added);
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn_blocking(compact)),
            Err(_) => compact(),
        }
    }

    /// Where the batches appending when the last run stopped start at the
    /// earliest, if there were any: read the buffer from there and pass
    /// the records to [`Acked::recover`].
    pub fn interrupted_from(&self) -> Option<u64> {
        self.lock().interrupted.first().map(|(_, b)| b.from_seq)
    }

    /// Of the batches appending when the last run stopped, what made it
    /// into the buffer (`records`, from [`Acked::interrupted_from`] on)
    /// was stored unacknowledged, and devices send it again.
    pub fn recover(&self, records: &[Record]) {
        let mut state = self.lock();
        let stored: HashSet<u32> = records.iter().map(|r| crc32c::crc32c(&r.payload)).collect();
        let (mut found, mut of) = (0, 0);
        for (_, batch) in std::mem::take(&mut state.interrupted) {
            of += batch.records.len();
            let mine = batch
                .records
                .iter()
                .filter(|(_, _, crc)| stored.contains(crc))
                .map(|(pkid, f, _)| (*pkid, *f))
                .collect::<Vec<_>>();
            found += mine.len();
            state.remember(&batch.client, mine);
        }
        tracing::info!(
            stored = found,
            of,
            "batches were being appended at the last stop; what was stored will not be stored again"
        );
        state.compact();
    }

    /// For each publish of `client`: `true` when it is a copy (DUP, same
    /// packet id, topic and payload) of one already acknowledged.
    pub fn resent(&self, client: &str, publishes: &[Publish]) -> Vec<bool> {
        let state = self.lock();
        let Some(acked) = state.clients.get(client) else { return vec![false; publishes.len()] };
        publishes
            .iter()
            .map(|p| p.dup && acked.contains(&(p.pkid, Fingerprint::of(&p.topic, &p.payload))))
            .collect()
    }

    /// How many of the first publishes of a connection of `client` are
    /// copies sent again without DUP (rumqttc never sets it), or `None`
    /// while more publishes are needed to tell.
    ///
    /// A device sends again, right after reconnecting and before anything
    /// new, what it got no PUBACK for. PUBACKs go out in order, so those
    /// are the last messages acknowledged to it: the copies are the leading
    /// publishes that repeat, in order, a suffix of what is remembered, up
    /// to its end. A run that matches so far but stops short of the end is
    /// no resend: undecided until `last` (nothing more will be waited
    /// for), then new. Without DUP a device that restarted and sends the
    /// very messages (packet ids and bytes) it last sent cannot be told
    /// from one sending them again; `resends_without_dup = false` turns this
    /// off for such devices.
    pub fn leading_copies(&self, client: &str, publishes: &[Publish], last: bool) -> Option<usize> {
        let state = self.lock();
        let Some(mine) = state.clients.get(client) else { return Some(0) };
        let key = |p: &Publish| {
            (p.qos == QoS::AtLeastOnce).then(|| (p.pkid, Fingerprint::of(&p.topic, &p.payload)))
        };
        let Some(first) = publishes.first().and_then(key) else { return Some(0) };
        let mut keys: Vec<Option<Message>> = Vec::new();
        let (mut copies, mut open) = (0, false);
        for start in (0..mine.len()).filter(|&i| mine[i] == first) {
            let suffix = mine.len() - start;
            let n = suffix.min(publishes.len());
            // Fingerprints as far as some candidate needs them.
            keys.extend(publishes[keys.len().min(n)..n].iter().map(key));
            if mine.range(start..start + n).zip(&keys).all(|(m, k)| Some(*m) == *k) {
                if n == suffix {
                    copies = copies.max(suffix);
                } else {
                    open = true;
                }
            }
        }
        (last || !open).then_some(copies)
    }

    /// `batch` is about to be appended; pass the number returned to
    /// [`Acked::acknowledging`] once it is.
    pub fn appending(&self, batch: Batch) -> u64 {
        let mut state = self.lock();
        // From the journal: a crafted one may say u64::MAX.
        state.next_batch = state.next_batch.checked_add(1).unwrap_or(1);
        let number = state.next_batch;
        let mut entry = Vec::new();
        encode_appending(&mut entry, number, &batch);
        state.appending.insert(number, batch);
        self.write(state, &entry);
        number
    }

    /// Remembers the QoS 1 publishes of `client` stored and about to be
    /// acknowledged (not the copies among them: a message is remembered
    /// once, in the order acknowledged), and that `batch` (from
    /// [`Acked::appending`]) is stored.
    pub fn acknowledging<'a>(
        &self,
        client: &str,
        batch: Option<u64>,
        publishes: impl IntoIterator<Item = &'a Publish>,
    ) {
        let mut state = self.lock();
        if let Some(number) = batch {
            state.appending.remove(&number);
        }
        let messages: Vec<Message> = publishes
            .into_iter()
            .filter(|p| p.qos == QoS::AtLeastOnce)
            .map(|p| (p.pkid, Fingerprint::of(&p.topic, &p.payload)))
            .collect();
        let mut entry = Vec::new();
        encode_acknowledged(&mut entry, batch.unwrap_or(0), client, messages.iter().copied());
        state.remember(client, messages);
        self.write(state, &entry);
    }

    /// Whether a rewrite of the journal is in progress.
    #[cfg(test)]
    pub fn rewriting(&self) -> bool {
        self.lock().tail.is_some()
    }

    /// Clients remembered, and messages of theirs.
    #[cfg(test)]
    pub fn remembered(&self) -> (usize, usize) {
        let state = self.lock();
        (state.clients.len(), state.clients.values().map(VecDeque::len).sum())
    }
}

impl State {
    fn remember(&mut self, client: &str, messages: impl IntoIterator<Item = Message>) {
        if !self.clients.contains_key(client) && self.clients.len() >= self.max_clients {
            // A client long gone: its PUBACKs are not waited for any more.
            let gone = self.clients.keys().next().cloned();
            if let Some(gone) = gone {
                self.clients.remove(&gone);
            }
        }
        let mine = self.clients.entry(client.to_owned()).or_default();
        for message in messages {
            if mine.len() == ACKED_PER_CLIENT {
                mine.pop_front();
            }
            mine.push_back(message);
        }
    }

    /// Applies the journal's entries; returns how many bytes were whole
    /// entries.
    fn replay(&mut self, bytes: &[u8]) -> usize {
        let mut at = 0;
        while let Some((kind, body, next)) = entry(bytes, at) {
            let mut r = Reader::new(body);
            let applied = match kind {
                APPENDING => decode_appending(&mut r).map(|(number, batch)| {
                    self.next_batch = self.next_batch.max(number);
                    self.appending.insert(number, batch);
                }),
                ACKNOWLEDGED => decode_acknowledged(&mut r).map(|(number, client, messages)| {
                    self.appending.remove(&number);
                    self.remember(&client, messages);
                }),
                _ => None,
            };
            if applied.is_none() {
                break;
            }
            at = next;
        }
        at
    }

    /// Appends `entry` to the journal; `true` when the journal is now due
    /// for compaction.
    fn write(&mut self, entry: &[u8]) -> bool {
        let Some(journal) = &mut self.journal else { return false };
        // One write per entry: a crash leaves it whole or torn at the end,
        // where replaying stops.
        if let Err(e) = (&*journal.file).write_all(entry) {
            self.fail("write", &e);
            return false;
        }
        self.written += 1;
        journal.len += entry.len() as u64;
        match &mut self.tail {
            Some(tail) => {
                tail.extend_from_slice(entry);
                false
            }
            None => journal.len >= journal.compact_at,
        }
    }

    /// Rewrites the journal as what it replays to, in line.
    fn compact(&mut self) {
        if let Some((mut rewrite, snapshot)) = self.begin_rewrite() {
            let added = rewrite.add(&snapshot);
            self.finish_rewrite(rewrite, added);
        }
    }

    /// A rewrite of the journal, and what it starts with: each client's
    /// memory, the batches being appended and those interrupted, not yet
    /// recovered. From now until [`State::finish_rewrite`] the entries
    /// written are kept for it too. `None` without a journal, or while
    /// another rewrite is in progress.
    fn begin_rewrite(&mut self) -> Option<(Rewrite, Vec<u8>)> {
        let path = self.path.clone()?;
        if self.tail.is_some() {
            return None;
        }
        let batches = || {
            let appending = self.appending.iter().map(|(n, b)| (*n, b));
            appending.chain(self.interrupted.iter().map(|(n, b)| (*n, b)))
        };
        // Allocated once: this runs under the lock, and growing tens of
        // megabytes step by step doubles the time.
        let size = self.clients.iter().map(|(c, m)| acknowledged_size(c, m.len())).sum::<usize>()
            + batches().map(|(_, b)| appending_size(b)).sum::<usize>();
        let mut bytes = Vec::with_capacity(size);
        for (client, messages) in &self.clients {
            encode_acknowledged(&mut bytes, 0, client, messages.iter().copied());
        }
        for (number, batch) in batches() {
            encode_appending(&mut bytes, number, batch);
        }
        self.tail = Some(Vec::new());
        let tmp = path.with_extension("acked.tmp");
        let snapshot = bytes.len() as u64;
        Some((Rewrite { tmp, path, sync: self.sync, file: None, len: 0, snapshot }, bytes))
    }

    /// Adds the entries written since the last taken from the tail to the
    /// rewrite (`added`: what came of adding the rest), and puts it in the
    /// journal's place. The lock is held from here to the rename, so no
    /// entry lands in the old journal after the copy.
    fn finish_rewrite(&mut self, mut rewrite: Rewrite, added: std::io::Result<()>) {
        let tail = self.tail.take().unwrap_or_default();
        if self.path.is_none() {
            // The journal failed meanwhile: it is not kept any more.
            let _ = std::fs::remove_file(&rewrite.tmp);
            return;
        }
        let replaced = added.and_then(|()| rewrite.add(&tail)).and_then(|()| {
            std::fs::rename(&rewrite.tmp, &rewrite.path)?;
            if rewrite.sync {
                crate::durable::sync_parent(&rewrite.path)?;
            }
            rewrite.file.take().ok_or_else(|| std::io::Error::other("the rewrite has no file"))
        });
        match replaced {
            Ok(file) => {
                self.journal = Some(Journal {
                    file: Arc::new(file),
                    len: rewrite.len,
                    compact_at: COMPACT_MIN.max(2 * rewrite.snapshot),
                });
                if rewrite.sync {
                    self.durable = self.written;
                }
            }
            Err(e) => self.fail("rewrite", &e),
        }
    }

    /// Stops journaling after an I/O error.
    fn fail(&mut self, doing: &str, e: &std::io::Error) {
        let path = self.path.take().unwrap_or_default();
        tracing::warn!(path = %path.display(), error = %e, "cannot {doing} the journal of acknowledged messages: after a crash, messages sent again may be stored twice");
        self.journal = None;
    }
}

impl Rewrite {
    /// Adds `bytes` to the rewrite (created by the first), synced when the
    /// journal is.
    fn add(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        let file = match &mut self.file {
            Some(_) if bytes.is_empty() => return Ok(()),
            Some(file) => file,
            None => self.file.insert(
                OpenOptions::new().create(true).write(true).truncate(true).open(&self.tmp)?,
            ),
        };
        file.write_all(bytes)?;
        if self.sync {
            file.sync_data()?;
        }
        self.len += bytes.len() as u64;
        Ok(())
    }
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The entry at `at`: kind, body and where the next starts; `None` at the
/// end or at a torn or damaged entry. An entry is its body's length (u32
/// LE), its CRC-32C (u32 LE) and the body: kind (u8) and fields.
fn entry(bytes: &[u8], at: usize) -> Option<(u8, &[u8], usize)> {
    let mut r = Reader::new(bytes.get(at..)?);
    let len = usize::try_from(r.u32()?).ok().filter(|n| (1..=MAX_ENTRY).contains(n))?;
    let crc = r.u32()?;
    let body = r.bytes(len)?;
    (crc32c::crc32c(body) == crc).then(|| (body[0], &body[1..], at + 8 + len))
}

/// Appends an entry of `kind` to `out`, its fields written by `fields`.
fn frame(out: &mut Vec<u8>, kind: u8, fields: impl FnOnce(&mut Vec<u8>)) {
    // Written in place (a rewrite of the journal is megabytes of entries):
    // length and CRC are filled in once the body is there.
    let start = out.len();
    out.extend_from_slice(&[0; 8]);
    out.push(kind);
    fields(out);
    let body = &out[start + 8..];
    let len = u32::try_from(body.len()).unwrap_or(u32::MAX).to_le_bytes();
    let crc = crc32c::crc32c(body).to_le_bytes();
    out[start..start + 4].copy_from_slice(&len);
    out[start + 4..start + 8].copy_from_slice(&crc);
}

/// Client ids are at most 65,535 bytes in MQTT; a longer one (not
/// possible from the codec) is cut.
fn put_client(fields: &mut Vec<u8>, client: &str) {
    let bytes = &client.as_bytes()[..client.len().min(usize::from(u16::MAX))];
    fields.extend_from_slice(&u16::try_from(bytes.len()).unwrap_or(u16::MAX).to_le_bytes());
    fields.extend_from_slice(bytes);
}

/// Number (u64), client, from_seq (u64), count (u32), then packet id
/// (u16), fingerprint (u64) and CRC (u32) per record.
fn encode_appending(out: &mut Vec<u8>, number: u64, batch: &Batch) {
    out.reserve(appending_size(batch));
    frame(out, APPENDING, |fields| {
        fields.extend_from_slice(&number.to_le_bytes());
        put_client(fields, &batch.client);
        fields.extend_from_slice(&batch.from_seq.to_le_bytes());
        fields.extend_from_slice(&u32::try_from(batch.records.len()).unwrap_or(0).to_le_bytes());
        for (pkid, f, crc) in &batch.records {
            fields.extend_from_slice(&pkid.to_le_bytes());
            fields.extend_from_slice(&f.to_bits().to_le_bytes());
            fields.extend_from_slice(&crc.to_le_bytes());
        }
    });
}

/// Number (u64, 0 for none), client, count (u32), then packet id (u16)
/// and fingerprint (u64) per message.
fn encode_acknowledged(
    out: &mut Vec<u8>,
    number: u64,
    client: &str,
    messages: impl ExactSizeIterator<Item = Message>,
) {
    out.reserve(acknowledged_size(client, messages.len()));
    frame(out, ACKNOWLEDGED, |fields| {
        fields.extend_from_slice(&number.to_le_bytes());
        put_client(fields, client);
        fields.extend_from_slice(&u32::try_from(messages.len()).unwrap_or(0).to_le_bytes());
        for (pkid, f) in messages {
            fields.extend_from_slice(&pkid.to_le_bytes());
            fields.extend_from_slice(&f.to_bits().to_le_bytes());
        }
    });
}

/// Bytes of an entry from [`encode_appending`]: 8 of frame, the kind, 22
/// of fields besides the client and the records.
fn appending_size(batch: &Batch) -> usize {
    31 + batch.client.len() + 14 * batch.records.len()
}

/// Bytes of an entry from [`encode_acknowledged`], as for
/// [`appending_size`].
fn acknowledged_size(client: &str, messages: usize) -> usize {
    23 + client.len() + 10 * messages
}

fn get_client(r: &mut Reader<'_>) -> Option<String> {
    let len = usize::from(r.u16()?);
    String::from_utf8(r.bytes(len)?.to_vec()).ok()
}

fn decode_appending(r: &mut Reader<'_>) -> Option<(u64, Batch)> {
    let number = r.u64()?;
    let client = get_client(r)?;
    let from_seq = r.u64()?;
    let n = r.u32()?;
    let records = (0..n)
        .map(|_| Some((r.u16()?, Fingerprint::from_bits(r.u64()?), r.u32()?)))
        .collect::<Option<Vec<_>>>()?;
    Some((number, Batch { client, from_seq, records }))
}

fn decode_acknowledged(r: &mut Reader<'_>) -> Option<(u64, String, Vec<Message>)> {
    let number = r.u64()?;
    let client = get_client(r)?;
    let n = r.u32()?;
    let messages = (0..n)
        .map(|_| Some((r.u16()?, Fingerprint::from_bits(r.u64()?))))
        .collect::<Option<Vec<_>>>()?;
    Some((number, client, messages))
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;

    fn publish(pkid: u16, payload: &str) -> Publish {
        let mut p = Publish::new("readers/r1/tags", QoS::AtLeastOnce, payload.to_owned());
        p.pkid = pkid;
        p.dup = true;
        p
    }

    /// A synced journal in a temporary directory, opened.
    fn synced_journal() -> (tempfile::TempDir, PathBuf, Acked) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j.acked");
        let acked = Acked::open(&path, "test", 10, true);
        (dir, path, acked)
    }

    #[test]
    fn a_journal_whose_batch_number_is_the_largest_does_not_overflow_the_count() {
        let (_dir, path, acked) = synced_journal();
        drop(acked);
        let batch = Batch { client: "dev".into(), from_seq: 0, records: Vec::new() };
        let mut crafted = Vec::new();
        encode_appending(&mut crafted, u64::MAX, &batch);
        std::fs::write(&path, crafted).unwrap();
        let acked = Acked::open(&path, "test", 10, true);
        assert_eq!(acked.appending(batch), 1, "counted again from 1");
    }

    fn record(p: &Publish) -> (u16, Fingerprint, u32) {
        (p.pkid, Fingerprint::of(&p.topic, &p.payload), crc32c::crc32c(&p.payload))
    }

    #[test]
    fn copies_without_dup_are_the_leading_run_that_ends_what_was_acknowledged() {
        let acked = Acked::in_memory(10);
        let sent: Vec<Publish> = (1..=5).map(|n| publish(n, &format!("r{n}"))).collect();
        acked.acknowledging("dev-1", None, &sent);
        let again = |ns: &[usize]| -> Vec<Publish> {
            ns.iter()
                .map(|&n| {
                    let mut p = sent[n - 1].clone();
                    p.dup = false;
                    p
                })
                .collect()
        };
        let new = |pkid| {
            let mut p = publish(pkid, "new");
            p.dup = false;
            p
        };
        let copies = |publishes: &[Publish], last| acked.leading_copies("dev-1", publishes, last);
        // The last two PUBACKs were lost: 4 and 5 come again, then new ones.
        assert_eq!(copies(&[again(&[4, 5]), vec![new(6)]].concat(), false), Some(2));
        assert_eq!(copies(&again(&[5]), false), Some(1));
        // A run that stops short of the end may go on: wait, unless nothing
        // more comes; then it is no resend.
        assert_eq!(copies(&again(&[3, 4]), false), None);
        assert_eq!(copies(&again(&[3, 4]), true), Some(0));
        // Broken runs, QoS 0 and unknown messages or clients are new.
        assert_eq!(copies(&[again(&[3]), vec![new(4)]].concat(), false), Some(0));
        assert_eq!(copies(&again(&[5, 4]), false), Some(1));
        let mut qos0 = again(&[5]);
        qos0[0].qos = QoS::AtMostOnce;
        assert_eq!(copies(&qos0, false), Some(0));
        assert_eq!(copies(&[new(5)], false), Some(0));
        assert_eq!(copies(&[], false), Some(0));
        assert_eq!(acked.leading_copies("dev-2", &again(&[5]), false), Some(0));
        // A device that reuses one packet id: the longest run that ends
        // what was acknowledged, once no longer one may come.
        acked.acknowledging("dev-3", None, &[publish(1, "a"), publish(1, "b"), publish(1, "a")]);
        let mut a = publish(1, "a");
        a.dup = false;
        let a = [a];
        assert_eq!(acked.leading_copies("dev-3", &a, false), None);
        assert_eq!(acked.leading_copies("dev-3", &a, true), Some(1));
    }

    #[test]
    fn what_is_remembered_is_bounded() {
        let acked = Acked::in_memory(2);
        let publishes: Vec<Publish> =
            (1..=ACKED_PER_CLIENT as u16 + 5).map(|n| publish(n, &n.to_string())).collect();
        for client in ["a", "b", "c"] {
            acked.acknowledging(client, None, &publishes);
        }
        assert_eq!(acked.remembered(), (2, 2 * ACKED_PER_CLIENT));
        // The oldest of a client are forgotten first.
        assert_eq!(acked.resent("c", &publishes[..6]), [false, false, false, false, false, true]);
    }

    #[test]
    fn acknowledged_messages_are_remembered_by_the_next_run() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j.acked");
        let (a, b, c) = (publish(1, "a"), publish(2, "b"), publish(3, "c"));
        let acked = Acked::open(&path, "test", 10, true);
        let number = acked.appending(Batch {
            client: "dev-1".into(),
            from_seq: 0,
            records: vec![record(&a), record(&b)],
        });
        acked.acknowledging("dev-1", Some(number), &[a.clone(), b.clone()]);
        acked.acknowledging("dev-2", None, std::slice::from_ref(&c));
        drop(acked);

        let next = Acked::open(&path, "test", 10, true);
        assert_eq!(next.interrupted_from(), None, "the batch was acknowledged");
        assert_eq!(next.resent("dev-1", &[a.clone(), b, c.clone()]), [true, true, false]);
        assert_eq!(next.resent("dev-2", std::slice::from_ref(&c)), [true]);
        // Only copies: the same message without DUP is a new one.
        let mut again = a;
        again.dup = false;
        assert_eq!(next.resent("dev-1", &[again]), [false]);
    }

    /// Connections syncing at once all find their entries durable; a
    /// journal kept as the buffer is under `fsync = "never"` is not synced.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn entries_are_durable_once_synced_by_any_connection() {
        let dir = tempfile::tempdir().unwrap();
        let acked = Arc::new(Acked::open(&dir.path().join("j.acked"), "test", 100, true));
        let (written, durable) = acked.journaled();
        assert_eq!(written, durable, "opening compacts, synced");
        let tasks: Vec<_> = (0..20u16)
            .map(|n| {
                let acked = Arc::clone(&acked);
                tokio::spawn(async move {
                    let p = publish(n, &format!("r{n}"));
                    let records = vec![record(&p)];
                    acked.appending(Batch { client: format!("dev-{n}"), from_seq: 0, records });
                    // At least this connection's entry, maybe others' too.
                    let (mine, _) = acked.journaled();
                    acked.synced().await;
                    let (written, durable) = acked.journaled();
                    assert!(mine <= durable && durable <= written, "{mine} {durable} {written}");
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
        let (written, durable) = acked.journaled();
        assert_eq!((written, durable), (20, 20));

        let unsynced = Acked::open(&dir.path().join("k.acked"), "test", 100, false);
        unsynced.appending(Batch { client: "dev".into(), from_seq: 0, records: Vec::new() });
        unsynced.synced().await;
        assert_eq!(unsynced.journaled(), (1, 0));
    }

    #[test]
    fn of_an_interrupted_append_only_what_the_buffer_holds_is_remembered() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j.acked");
        let batch: Vec<Publish> = (1..=4).map(|n| publish(n, &format!("r{n}"))).collect();
        let other = publish(9, "other");
        let acked = Acked::open(&path, "test", 10, true);
        acked.appending(Batch {
            client: "dev-1".into(),
            from_seq: 40,
            records: batch.iter().map(record).collect(),
        });
        acked.appending(Batch {
            client: "dev-2".into(),
            from_seq: 42,
            records: vec![record(&other)],
        });
        // The process dies in the appends.
        drop(acked);

        let next = Acked::open(&path, "test", 10, true);
        assert_eq!(next.interrupted_from(), Some(40));
        // The buffer holds the first two of dev-1's batch and someone
        // else's record; dev-2's never made it.
        let stored = [&batch[0], &batch[1], &publish(7, "x")]
            .iter()
            .enumerate()
            .map(|(i, p)| Record { seq: 40 + i as u64, payload: Bytes::from(p.payload.to_vec()) })
            .collect::<Vec<_>>();
        next.recover(&stored);
        assert_eq!(next.interrupted_from(), None);
        assert_eq!(next.resent("dev-1", &batch), [true, true, false, false]);
        assert_eq!(next.resent("dev-2", std::slice::from_ref(&other)), [false]);
        drop(next);
        // What was recovered is in the journal, and nothing is read back
        // again.
        let third = Acked::open(&path, "test", 10, true);
        assert_eq!(third.interrupted_from(), None);
        assert_eq!(third.resent("dev-1", &batch[..2]), [true, true]);
    }

    #[test]
    fn an_interrupted_append_not_yet_recovered_survives_another_restart() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j.acked");
        let a = publish(1, "a");
        let acked = Acked::open(&path, "test", 10, true);
        acked.appending(Batch { client: "dev-1".into(), from_seq: 5, records: vec![record(&a)] });
        drop(acked);
        // Opened (compacted) and stopped before recovering.
        drop(Acked::open(&path, "test", 10, true));
        let next = Acked::open(&path, "test", 10, true);
        assert_eq!(next.interrupted_from(), Some(5));
        next.recover(&[Record { seq: 5, payload: Bytes::from_static(b"a") }]);
        assert_eq!(next.resent("dev-1", &[a]), [true]);
    }

    #[test]
    fn a_damaged_journal_keeps_what_precedes_the_damage() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j.acked");
        let (a, b) = (publish(1, "a"), publish(2, "b"));
        let acked = Acked::open(&path, "test", 10, true);
        acked.acknowledging("dev-1", None, std::slice::from_ref(&a));
        let whole = std::fs::metadata(&path).unwrap().len();
        acked.acknowledging("dev-1", None, std::slice::from_ref(&b));
        drop(acked);
        let mut bytes = std::fs::read(&path).unwrap();
        // A flipped bit in the second entry, then a torn third.
        let at = usize::try_from(whole).unwrap() + 12;
        bytes[at] ^= 1;
        bytes.extend_from_slice(&[7, 0, 0]);
        std::fs::write(&path, &bytes).unwrap();

        let next = Acked::open(&path, "test", 10, true);
        assert_eq!(next.resent("dev-1", &[a, b]), [true, false]);
        // Garbage from the start is no memory at all, and no panic.
        std::fs::write(&path, b"\xff\xff\xff\xff garbage").unwrap();
        assert_eq!(Acked::open(&path, "test", 10, true).remembered(), (0, 0));
        std::fs::write(&path, [16, 0, 0, 0]).unwrap();
        assert_eq!(Acked::open(&path, "test", 10, true).remembered(), (0, 0));
    }

    /// Acknowledges round `round`'s 100 messages, of dev-1 and dev-2 in
    /// turn.
    fn acknowledge_round(acked: &Acked, round: u32) {
        let batch: Vec<Publish> =
            (0..100u16).map(|n| publish(n, &format!("{round}-{n}"))).collect();
        acked.acknowledging(if round.is_multiple_of(2) { "dev-1" } else { "dev-2" }, None, &batch);
    }

    #[test]
    fn the_journal_is_compacted_as_it_grows() {
        let (_dir, path, acked) = synced_journal();
        let mut largest = 0;
        // About 10 MiB of entries for two clients.
        for round in 0..10_000u32 {
            acknowledge_round(&acked, round);
            largest = largest.max(std::fs::metadata(&path).unwrap().len());
        }
        assert!(largest <= COMPACT_MIN + 2048, "the journal grew to {largest} bytes");
        drop(acked);
        let next = Acked::open(&path, "test", 10, true);
        assert_eq!(next.remembered(), (2, 2 * ACKED_PER_CLIENT));
        let last = publish(99, "9999-99");
        assert_eq!(next.resent("dev-2", &[last]), [true]);
    }

    #[test]
    fn connections_go_on_while_the_journal_is_rewritten() {
        // The blocking pool's one thread is kept busy: the rewrite waits
        // behind it, as behind a slow disk.
        let runtime =
            tokio::runtime::Builder::new_current_thread().max_blocking_threads(1).build().unwrap();
        let _in_runtime = runtime.enter();
        let (_dir, path, acked) = synced_journal();
        let (release, wait) = std::sync::mpsc::channel::<()>();
        let busy = runtime.spawn_blocking(move || wait.recv());
        let mut round = 0u32;
        while !acked.rewriting() {
            acknowledge_round(&acked, round);
            round += 1;
            assert!(round < 100_000, "the journal never became due");
        }
        // The call that made it due came back, and so do the next ones:
        // their entries go to the old journal and to the rewrite.
        let during = publish(7, "acknowledged during the rewrite");
        acked.acknowledging("dev-3", None, [&during]);
        let batch = acked.appending(Batch {
            client: "dev-4".into(),
            from_seq: 0,
            records: vec![record(&during)],
        });
        assert_eq!(acked.resent("dev-3", std::slice::from_ref(&during)), [true]);
        let grown = std::fs::metadata(&path).unwrap().len();
        assert!(grown >= COMPACT_MIN, "{grown} bytes: rewritten before the pool was free");

        release.send(()).unwrap();
        runtime.block_on(busy).unwrap().unwrap();
        // The pool's one thread takes tasks in order: this one runs after
        // the rewrite.
        runtime.block_on(tokio::task::spawn_blocking(|| ())).unwrap();
        assert!(!acked.rewriting());
        let rewritten = std::fs::metadata(&path).unwrap().len();
        assert!(rewritten < grown / 2, "{rewritten} bytes, from {grown}");
        assert_eq!(acked.journaled().0, acked.journaled().1, "the rewrite is synced");
        drop(acked);

        let next = Acked::open(&path, "test", 10, true);
        assert_eq!(next.resent("dev-3", std::slice::from_ref(&during)), [true]);
        assert_eq!(next.interrupted_from(), Some(0), "batch {batch} appending, named");
        assert_eq!(next.remembered(), (3, 2 * ACKED_PER_CLIENT + 1));
    }

    #[test]
    fn entries_written_during_a_rewrite_are_kept_by_it() {
        let (_dir, path, acked) = synced_journal();
        let before = publish(1, "before");
        acked.acknowledging("dev-1", None, std::slice::from_ref(&before));
        let (mut rewrite, snapshot) = acked.lock().begin_rewrite().unwrap();
        let during = publish(2, "during");
        acked.acknowledging("dev-2", None, std::slice::from_ref(&during));
        let added = rewrite.add(&snapshot);
        acked.lock().finish_rewrite(rewrite, added);
        assert_eq!(acked.journaled().0, acked.journaled().1, "synced");
        drop(acked);
        let next = Acked::open(&path, "test", 10, true);
        assert_eq!(next.resent("dev-1", &[before]), [true]);
        assert_eq!(next.resent("dev-2", &[during]), [true]);
    }

    #[test]
    fn a_batch_whose_entry_makes_the_journal_due_is_named_by_the_rewrite() {
        let (_dir, path, acked) = synced_journal();
        let p = publish(1, "r1");
        let no_publishes: [&Publish; 0] = [];
        for from_seq in 0..10_000u64 {
            let before = std::fs::metadata(&path).unwrap().len();
            let records = vec![record(&p); 1000];
            let number = acked.appending(Batch { client: "dev".into(), from_seq, records });
            if std::fs::metadata(&path).unwrap().len() < before {
                // Rewritten by this batch's entry, and stopped mid-append.
                drop(acked);
                let next = Acked::open(&path, "test", 10, true);
                assert_eq!(next.interrupted_from(), Some(from_seq));
                return;
            }
            acked.acknowledging("dev", Some(number), no_publishes);
        }
        panic!("the journal was never rewritten");
    }

    #[test]
    fn entry_sizes_are_reckoned_exactly() {
        let p = publish(3, "r3");
        let batch = Batch { client: "dev-1".into(), from_seq: 5, records: vec![record(&p); 3] };
        let mut out = Vec::new();
        encode_appending(&mut out, 1, &batch);
        assert_eq!(out.len(), appending_size(&batch));
        out.clear();
        let messages = [(3, Fingerprint::of(&p.topic, &p.payload)); 4];
        encode_acknowledged(&mut out, 1, "dev-1", messages.into_iter());
        assert_eq!(out.len(), acknowledged_size("dev-1", 4));
    }

    /// Not a check but a measurement: the calls that hold up the
    /// connections longest while 2,000 persistent clients fill the
    /// journal, with its rewrites in line (outside a runtime, as before 29
    /// November) and beside them. BENCHMARKS.md, "29 November", has the
    /// command.
    #[test]
    #[ignore = "a measurement, for a release build on a real disk"]
    fn journal_rewrite_stalls() {
        let base =
            std::env::var_os("OPGRAPH_BENCH_DIR").map_or_else(std::env::temp_dir, Into::into);
        for beside in [false, true] {
            let runtime = tokio::runtime::Builder::new_multi_thread().build().unwrap();
            let in_runtime = beside.then(|| runtime.enter());
            let dir = tempfile::tempdir_in(&base).unwrap();
            let path = dir.path().join("j.acked");
            let acked = Acked::open(&path, "test", 2000, true);
            let mut slow = Vec::new();
            for round in 0..60_000u32 {
                let batch: Vec<Publish> =
                    (0..64u16).map(|n| publish(n, &format!("{round}-{n}"))).collect();
                let started = std::time::Instant::now();
                acked.acknowledging(&format!("dev-{}", round % 2000), None, &batch);
                let took = started.elapsed();
                if took > std::time::Duration::from_millis(2) {
                    slow.push(format!("{:.1}", took.as_secs_f64() * 1e3));
                }
            }
            drop(in_runtime);
            let how = if beside { "beside" } else { "in line" };
            eprintln!("rewrites {how}: calls over 2 ms took {} ms", slow.join(", "));
        }
    }

    #[test]
    fn an_unwritable_journal_leaves_the_memory_working() {
        let dir = tempfile::tempdir().unwrap();
        // A directory where the journal should be: it cannot be written.
        let path = dir.path().join("j.acked");
        std::fs::create_dir(&path).unwrap();
        let acked = Acked::open(&path, "test", 10, true);
        let a = publish(1, "a");
        acked.acknowledging("dev-1", None, std::slice::from_ref(&a));
        assert_eq!(acked.resent("dev-1", &[a]), [true]);
    }
}
