//! The `Ingest` service's gRPC codec: prost's, except that a message is
//! checked against its bounds before it is decoded ([`Admit`]).
//!
//! Decoding is where a hostile peer's bytes become memory. An empty `Event`
//! takes two bytes on the wire and a few hundred in memory, so a batch
//! within the decompressed-size bound ([`frame::MAX_BATCH_BYTES`]) could
//! still decode into tens of millions of events, gigabytes, before its
//! event count was looked at. Counting a batch's events in the raw bytes
//! first costs one pass over them and refuses such a batch outright. The
//! QUIC receiver runs the same check ([`frame::decode_batch`]).
//!
//! [`frame::MAX_BATCH_BYTES`]: crate::frame::MAX_BATCH_BYTES
//! [`frame::decode_batch`]: crate::frame::decode_batch

use std::marker::PhantomData;

use prost::Message;
use prost::bytes::Buf;
use tonic::Status;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic_prost::{ProstDecoder, ProstEncoder};

use crate::pb;

/// Most events in one batch, on every path (the gateway's
/// `batch_max_events` may not exceed it).
pub const MAX_BATCH_EVENTS: usize = 10_000;

/// What a message's raw bytes must satisfy before they are decoded.
pub trait Admit {
    /// `Err` with the reason when the message must not be decoded.
    fn admit(_raw: &[u8]) -> Result<(), String> {
        Ok(())
    }
}

impl Admit for pb::HelloRequest {}
impl Admit for pb::HelloResponse {}
impl Admit for pb::Ack {}

impl Admit for pb::Batch {
    fn admit(raw: &[u8]) -> Result<(), String> {
        /// `Batch.events`.
        const EVENTS: u64 = 5;
        let events = count_field(raw, EVENTS).ok_or("a malformed batch")?;
        if events > MAX_BATCH_EVENTS {
            return Err(format!("{events} events exceed the limit of {MAX_BATCH_EVENTS}"));
        }
        Ok(())
    }
}

/// How often top-level field `number` occurs in an encoded message; `None`
/// when the bytes are not a sequence of well-formed fields.
fn count_field(mut raw: &[u8], number: u64) -> Option<usize> {
    let mut count = 0;
    while !raw.is_empty() {
        let key = varint(&mut raw)?;
        let skip = match key & 7 {
            0 => {
                varint(&mut raw)?;
                0
            }
            1 => 8,
            2 => usize::try_from(varint(&mut raw)?).ok()?,
            5 => 4,
            // Groups (3, 4) are not used by these messages.
            _ => return None,
        };
        raw = raw.get(skip..)?;
        count += usize::from(key >> 3 == number);
    }
    Some(count)
}

/// A base-128 varint off the front of `raw`.
fn varint(raw: &mut &[u8]) -> Option<u64> {
    let mut value = 0u64;
    for i in 0..10 {
        let (&byte, rest) = raw.split_first()?;
        *raw = rest;
        value |= u64::from(byte & 0x7f) << (7 * i);
        if byte < 0x80 {
            return Some(value);
        }
    }
    None
}

/// prost's codec with [`Admit`] before each decode (named by the generated
/// service code, `proto/build.rs`).
#[derive(Debug, Clone)]
pub struct BoundedCodec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for BoundedCodec<T, U> {
    fn default() -> Self {
        BoundedCodec(PhantomData)
    }
}

/// The decoding half of [`BoundedCodec`].
#[derive(Debug)]
pub struct BoundedDecoder<U>(ProstDecoder<U>);

impl<U: Message + Default + Admit> Decoder for BoundedDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        // A message arrives whole: `chunk` is all of it.
        U::admit(buf.chunk()).map_err(Status::invalid_argument)?;
        self.0.decode(buf)
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.0.buffer_settings()
    }
}

impl<T, U> Codec for BoundedCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Admit + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = BoundedDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder::new(BufferSettings::default())
    }

    fn decoder(&mut self) -> Self::Decoder {
        BoundedDecoder(ProstDecoder::new(BufferSettings::default()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(events: usize) -> Vec<u8> {
        let batch = pb::Batch {
            gateway_id: "gw".into(),
            first_sequence: 1,
            last_sequence: events as u64,
            events: vec![pb::Event::default(); events],
            ..pb::Batch::default()
        };
        batch.encode_to_vec()
    }

    #[test]
    fn batches_are_counted_before_they_are_decoded() {
        assert_eq!(count_field(&batch(3), 5), Some(3));
        assert!(pb::Batch::admit(&batch(MAX_BATCH_EVENTS)).is_ok());
        let err = pb::Batch::admit(&batch(MAX_BATCH_EVENTS + 1)).unwrap_err();
        assert!(err.contains("10001 events"), "{err}");
        // Two bytes an event: a megabyte of them would be half a million.
        let bomb = [0x2a, 0x00].repeat(500_000);
        assert!(pb::Batch::admit(&bomb).is_err());
        for garbage in [&[0x2a, 0x05, 0x00][..], &[0xff; 11], &[0x0b]] {
            assert!(pb::Batch::admit(garbage).is_err(), "{garbage:?}");
        }
        assert_eq!(count_field(&[], 5), Some(0));
    }
}
