//! [`EncodedBatch`]: a `Batch` whose events are already encoded.
//!
//! A gateway's buffer holds each event as an encoded `pb::Event`. Decoding
//! thousands of them into structs only for the transport to encode them
//! again costs CPU, and memory above all: a batch of 5000 decoded events
//! takes several megabytes in small allocations, and a gRPC session queues
//! up to its window of batches while the cloud's flow control holds them.
//! An `EncodedBatch` copies each record's bytes once into the encoding of
//! the `events` field and appends the event's sequence number as a trailing
//! field (a later occurrence of a scalar field overrides an earlier one), so
//! its bytes decode as the same `pb::Batch` on the other side.

use prost::Message;
use prost::bytes::{Buf, BufMut};
use prost::encoding::{DecodeContext, WireType, encode_varint};

use crate::pb;

/// `Batch.events`: field 5, length-delimited.
const EVENTS_FIELD: u32 = 5;
const EVENTS_KEY: u8 = (5 << 3) | 2;

/// A `pb::Batch` for the wire, its events kept encoded.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EncodedBatch {
    /// Every field but `events`, which stays empty here.
    header: pb::Batch,
    /// The `events` field's elements: key, length and bytes of each.
    events: Vec<u8>,
    count: usize,
}

impl EncodedBatch {
    /// An empty batch covering `first_sequence..=last_sequence`.
    pub fn new(gateway_id: &str, epoch: u64, first_sequence: u64, last_sequence: u64) -> Self {
        let header = pb::Batch {
            gateway_id: gateway_id.to_owned(),
            epoch,
            first_sequence,
            last_sequence,
            events: Vec::new(),
        };
        EncodedBatch { header, events: Vec::new(), count: 0 }
    }

    /// Room for `bytes` more bytes of events without reallocating.
    pub fn reserve(&mut self, bytes: usize) {
        self.events.reserve(bytes);
    }

    /// Appends an event given as an encoded `pb::Event`, with `sequence` as
    /// its sequence number whatever the encoding says. The caller vouches
    /// that `event` is one (a batch with anything else is refused whole).
    pub fn push_encoded(&mut self, event: &[u8], sequence: u64) {
        let sequence = pb::Event { sequence, ..pb::Event::default() };
        self.events.put_u8(EVENTS_KEY);
        encode_varint((event.len() + sequence.encoded_len()) as u64, &mut self.events);
        self.events.put_slice(event);
        sequence.encode_raw(&mut self.events);
        self.count += 1;
    }

    /// Events in the batch.
    pub fn len(&self) -> usize {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    pub fn first_sequence(&self) -> u64 {
        self.header.first_sequence
    }

    pub fn last_sequence(&self) -> u64 {
        self.header.last_sequence
    }
}

impl Message for EncodedBatch {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        self.header.encode_raw(buf);
        buf.put_slice(&self.events);
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), prost::DecodeError> {
        if tag != EVENTS_FIELD || wire_type != WireType::LengthDelimited {
            return self.header.merge_field(tag, wire_type, buf, ctx);
        }
        // Only tests decode this type (the cloud decodes `pb::Batch`), so
        // the extra copy does not matter.
        let mut event = Vec::new();
        prost::encoding::bytes::merge(wire_type, &mut event, buf, ctx)?;
        self.events.put_u8(EVENTS_KEY);
        encode_varint(event.len() as u64, &mut self.events);
        self.events.put_slice(&event);
        self.count += 1;
        Ok(())
    }

    fn encoded_len(&self) -> usize {
        self.header.encoded_len() + self.events.len()
    }

    fn clear(&mut self) {
        self.header.clear();
        self.events.clear();
        self.count = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(name: &str, sequence: u64) -> pb::Event {
        let mut e = crate::Event::named(name).to_pb(format!("evt_{name}"), 0);
        e.sequence = sequence;
        e
    }

    #[test]
    fn decodes_as_the_batch_of_the_decoded_events() {
        let mut encoded = EncodedBatch::new("gw-1", 7, 10, 14);
        // Stored without a sequence, and with a stale one: both get theirs.
        encoded.push_encoded(&event("a", 0).encode_to_vec(), 10);
        encoded.push_encoded(&event("b", 99).encode_to_vec(), 12);
        assert_eq!((encoded.len(), encoded.first_sequence(), encoded.last_sequence()), (2, 10, 14));
        let wire = encoded.encode_to_vec();
        assert_eq!(wire.len(), encoded.encoded_len());
        let expected = pb::Batch {
            gateway_id: "gw-1".into(),
            epoch: 7,
            first_sequence: 10,
            last_sequence: 14,
            events: vec![event("a", 10), event("b", 12)],
        };
        assert_eq!(pb::Batch::decode(wire.as_slice()).unwrap(), expected);
        // And back: the same bytes again.
        let again = EncodedBatch::decode(wire.as_slice()).unwrap();
        assert_eq!(again.len(), 2);
        assert_eq!(again.encode_to_vec(), wire);
    }

    #[test]
    fn an_empty_batch_is_its_header() {
        let encoded = EncodedBatch::new("gw", 1, 5, 9);
        let decoded = pb::Batch::decode(encoded.encode_to_vec().as_slice()).unwrap();
        assert_eq!((decoded.first_sequence, decoded.last_sequence), (5, 9));
        assert!(decoded.events.is_empty());
        assert!(encoded.is_empty());
    }

    #[test]
    fn a_truncated_event_is_an_error_not_a_panic() {
        let mut encoded = EncodedBatch::new("gw", 1, 1, 1);
        encoded.push_encoded(&event("a", 0).encode_to_vec(), 1);
        let wire = encoded.encode_to_vec();
        assert!(EncodedBatch::decode(&wire[..wire.len() - 3]).is_err());
    }
}
