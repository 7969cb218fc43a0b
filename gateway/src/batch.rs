//! Batch building: buffer records in, a protobuf batch with a contiguous
//! sequence range out, its events kept encoded as the buffer holds them
//! ([`EncodedBatch`]). No I/O; the shipper feeds it what it read.
//!
//! The protocol (`opgraph/v1/ingest.proto`) wants the batches of a session
//! to tile the sequence space: the first starts at the cloud's
//! `acked_sequence + 1`, each next one at the previous `last_sequence + 1`.
//! A batch carries the events of its range that still exist; sequences the
//! buffer dropped (`drop_oldest`) or found corrupt are simply absent. A
//! [`Draft`] keeps that invariant: it starts at a given sequence and only
//! ever grows at its end, over records *and* over the holes between them.

use opgraph_proto::encoded_batch::EncodedBatch;
use opgraph_proto::pb;
use prost::Message;

use crate::buffer::Record;

/// The next batch of a session, being filled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Draft {
    first: u64,
    /// Highest sequence covered; `first - 1` while the draft is empty.
    last: u64,
    records: Vec<Record>,
    bytes: usize,
}

impl Draft {
    /// An empty draft whose range will start at `first` (at least 1).
    pub fn new(first: u64) -> Self {
        let first = first.max(1);
        Draft { first, last: first - 1, records: Vec::new(), bytes: 0 }
    }

    /// First sequence of the range.
    pub fn first(&self) -> u64 {
        self.first
    }

    /// Last sequence of the range (`first - 1` when empty).
    pub fn last(&self) -> u64 {
        self.last
    }

    /// Where the next read of the buffer starts.
    pub fn read_from(&self) -> u64 {
        self.last + 1
    }

    /// True while the range covers no sequence at all.
    pub fn is_empty(&self) -> bool {
        self.last < self.first
    }

    /// Records (events) gathered.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// Payload bytes gathered.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Whether the draft has reached either limit and must be sent as is.
    pub fn is_full(&self, max_events: usize, max_bytes: usize) -> bool {
        self.records.len() >= max_events || self.bytes >= max_bytes
    }

    /// Takes in the answer of a buffer read from [`Draft::read_from`].
    ///
    /// `watermark` is the buffer's durable watermark (the next sequence it
    /// will assign) observed *before* the read. When the read returned
    /// nothing although the watermark is past `read_from`, every sequence
    /// up to the watermark is gone (dropped or corrupt) and the range grows
    /// over them, so that the cloud can acknowledge past the hole. Records
    /// at or below the current end are ignored (a buffer never returns
    /// them; this keeps the range strictly increasing regardless).
    pub fn extend(&mut self, records: Vec<Record>, watermark: u64) {
        if records.is_empty() {
            if watermark > self.read_from() {
                self.last = watermark - 1;
            }
            return;
        }
        for record in records {
            if record.seq <= self.last {
                continue;
            }
            self.last = record.seq;
            self.bytes += record.payload.len();
            self.records.push(record);
        }
    }

    /// The batch of this draft for `gateway_id` in session `epoch`, and the
    /// sequences whose payload was not a `pb::Event` (impossible for records
    /// this gateway wrote, whose checksums held; they are left out like
    /// corrupt records, and the caller counts them). Each payload is still
    /// decoded once, to check it, since the cloud refuses a batch whole for
    /// one event it cannot decode; the decoded event is dropped at once, and
    /// the batch carries the payload's bytes.
    pub fn into_batch(self, gateway_id: &str, epoch: u64) -> (EncodedBatch, Vec<u64>) {
        let mut undecodable = Vec::new();
        let mut batch = EncodedBatch::new(gateway_id, epoch, self.first, self.last);
        // Per event: key, length and sequence, at most 1 + 3 + 11 bytes.
        batch.reserve(self.bytes + 16 * self.records.len());
        for record in self.records {
            if pb::Event::decode(record.payload.as_ref()).is_ok() {
                batch.push_encoded(&record.payload, record.seq);
            } else {
                undecodable.push(record.seq);
            }
        }
        (batch, undecodable)
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use opgraph_proto::Event;

    use super::*;

    fn record(seq: u64) -> Record {
        let event = Event::named("tote.moved").to_pb(format!("evt_{seq}"), 0);
        Record { seq, payload: Bytes::from(event.encode_to_vec()) }
    }

    fn records(seqs: &[u64]) -> Vec<Record> {
        seqs.iter().copied().map(record).collect()
    }

    /// What the cloud decodes from the draft's batch.
    fn into_batch(draft: Draft, gateway_id: &str, epoch: u64) -> (pb::Batch, Vec<u64>) {
        let (batch, bad) = draft.into_batch(gateway_id, epoch);
        let decoded = pb::Batch::decode(batch.encode_to_vec().as_slice()).expect("a valid batch");
        assert_eq!(decoded.events.len(), batch.len());
        (decoded, bad)
    }

    #[test]
    fn a_batch_covers_its_records_and_carries_their_sequences() {
        let mut draft = Draft::new(5);
        assert!(draft.is_empty());
        assert_eq!(draft.read_from(), 5);
        draft.extend(records(&[5, 6, 7]), 8);
        assert_eq!((draft.first(), draft.last(), draft.len()), (5, 7, 3));
        let (batch, bad) = into_batch(draft, "gw-1", 3);
        assert!(bad.is_empty());
        assert_eq!((batch.gateway_id.as_str(), batch.epoch), ("gw-1", 3));
        assert_eq!((batch.first_sequence, batch.last_sequence), (5, 7));
        let seqs: Vec<u64> = batch.events.iter().map(|e| e.sequence).collect();
        assert_eq!(seqs, [5, 6, 7]);
        assert_eq!(batch.events[1].id, "evt_6");
    }

    #[test]
    fn holes_inside_and_before_the_records_stay_in_the_range() {
        // Acked up to 9; 10 and 11 were dropped, 13 is corrupt.
        let mut draft = Draft::new(10);
        draft.extend(records(&[12, 14]), 15);
        let (batch, _) = into_batch(draft, "gw", 1);
        assert_eq!((batch.first_sequence, batch.last_sequence), (10, 14));
        assert_eq!(batch.events.len(), 2);
    }

    #[test]
    fn an_empty_read_below_the_watermark_covers_the_hole() {
        let mut draft = Draft::new(3);
        draft.extend(records(&[3]), 4);
        // 4..=6 became durable and then vanished (dropped): the read finds
        // nothing although the watermark says 7.
        draft.extend(Vec::new(), 7);
        assert_eq!((draft.first(), draft.last()), (3, 6));
        // Nothing new and nothing past the end: no change.
        draft.extend(Vec::new(), 7);
        assert_eq!(draft.last(), 6);
        // A draft of holes only is a valid, empty batch.
        let mut holes = Draft::new(1);
        holes.extend(Vec::new(), 4);
        let (batch, _) = into_batch(holes, "gw", 1);
        assert_eq!((batch.first_sequence, batch.last_sequence, batch.events.len()), (1, 3, 0));
    }

    #[test]
    fn consecutive_drafts_tile_the_sequence_space() {
        let available: Vec<u64> = (1..=50).filter(|s| s % 7 != 0).collect();
        let mut next = 1;
        let mut covered = Vec::new();
        for chunk in available.chunks(6) {
            let mut draft = Draft::new(next);
            draft.extend(records(chunk), 51);
            assert!(draft.is_full(6, usize::MAX) || chunk.len() < 6);
            covered.push((draft.first(), draft.last()));
            next = draft.last() + 1;
        }
        for pair in covered.windows(2) {
            assert_eq!(pair[1].0, pair[0].1 + 1, "{covered:?}");
        }
        assert_eq!(covered.first().map(|c| c.0), Some(1));
        assert_eq!(covered.last().map(|c| c.1), Some(50));
    }

    #[test]
    fn limits_and_stale_records() {
        let mut draft = Draft::new(1);
        draft.extend(records(&[1, 2]), 3);
        assert!(draft.is_full(2, usize::MAX));
        assert!(!draft.is_full(3, usize::MAX));
        assert!(draft.is_full(100, draft.bytes()));
        draft.extend(records(&[2, 1]), 3);
        assert_eq!(draft.len(), 2, "records at or below the end are ignored");
    }

    #[test]
    fn undecodable_payloads_are_left_out_and_reported() {
        let mut draft = Draft::new(1);
        let mut input = records(&[1, 3]);
        input.insert(1, Record { seq: 2, payload: Bytes::from_static(&[0xff, 0xff, 0xff]) });
        draft.extend(input, 4);
        let (batch, bad) = into_batch(draft, "gw", 1);
        assert_eq!(bad, [2]);
        assert_eq!((batch.first_sequence, batch.last_sequence, batch.events.len()), (1, 3, 2));
    }
}
