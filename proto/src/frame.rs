//! The QUIC uplink's framing: how protobuf messages travel on QUIC streams.
//!
//! A frame is one byte of kind, a big-endian `u32` body length, and the
//! body. Batch bodies are zstd-compressed protobuf; the others are plain
//! protobuf (they are small). A connection opens with a `SessionOpen` frame
//! answered by `HelloResponse` on the first stream; then every batch travels
//! on a stream of its own, answered by an `Ack` on that stream, so that a
//! lost packet delays one batch and not the ones behind it.
//!
//! No I/O here: the gateway and the cloud both use these functions around
//! their own stream reads and writes. Every decode is bounded (frame size,
//! decompressed size) so that a hostile peer cannot make the other side
//! allocate without limit.

use prost::Message;

use crate::pb;

/// Largest frame body on the wire.
pub const MAX_FRAME_BYTES: usize = 16 * 1024 * 1024;
/// Largest batch after decompression: the decompression-bomb bound.
pub const MAX_BATCH_BYTES: usize = 64 * 1024 * 1024;
pub const HEADER_LEN: usize = 5;
/// ALPN protocol id of the QUIC uplink.
pub const ALPN: &[u8] = b"opgraph/1";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum FrameKind {
    SessionOpen = 1,
    HelloResponse = 2,
    Batch = 3,
    Ack = 4,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrameError {
    UnknownKind(u8),
    TooLarge { len: usize, max: usize },
    Decompress(String),
    Decode(String),
    Unexpected { expected: FrameKind, got: FrameKind },
}

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FrameError::UnknownKind(k) => write!(f, "unknown frame kind {k}"),
            FrameError::TooLarge { len, max } => write!(f, "frame of {len} bytes exceeds {max}"),
            FrameError::Decompress(e) => write!(f, "batch does not decompress: {e}"),
            FrameError::Decode(e) => write!(f, "frame does not decode: {e}"),
            FrameError::Unexpected { expected, got } => {
                write!(f, "expected a {expected:?} frame, got {got:?}")
            }
        }
    }
}

impl std::error::Error for FrameError {}

impl FrameKind {
    fn from_byte(b: u8) -> Result<FrameKind, FrameError> {
        Ok(match b {
            1 => FrameKind::SessionOpen,
            2 => FrameKind::HelloResponse,
            3 => FrameKind::Batch,
            4 => FrameKind::Ack,
            other => return Err(FrameError::UnknownKind(other)),
        })
    }
}

fn frame(kind: FrameKind, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + body.len());
    out.push(kind as u8);
    out.extend_from_slice(&u32::try_from(body.len()).unwrap_or(u32::MAX).to_be_bytes());
    out.extend_from_slice(body);
    out
}

/// Reads a frame header: its kind and body length, refusing oversized ones.
pub fn decode_header(header: [u8; HEADER_LEN]) -> Result<(FrameKind, usize), FrameError> {
    let kind = FrameKind::from_byte(header[0])?;
    let len = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
    if len > MAX_FRAME_BYTES {
        return Err(FrameError::TooLarge { len, max: MAX_FRAME_BYTES });
    }
    Ok((kind, len))
}

/// A batch frame: zstd at `level` (1 is fast and already shrinks JSON-heavy
/// events several times).
pub fn encode_batch(batch: &impl Message, level: i32) -> std::io::Result<Vec<u8>> {
    let body = zstd::bulk::compress(&batch.encode_to_vec(), level)?;
    Ok(frame(FrameKind::Batch, &body))
}

/// A batch frame's body: decompressed (at most [`MAX_BATCH_BYTES`]), its
/// events counted ([`crate::codec::Admit`]), then decoded.
pub fn decode_batch(body: &[u8]) -> Result<pb::Batch, FrameError> {
    use crate::codec::Admit;
    let raw = zstd::bulk::decompress(body, MAX_BATCH_BYTES)
        .map_err(|e| FrameError::Decompress(e.to_string()))?;
    pb::Batch::admit(&raw).map_err(FrameError::Decode)?;
    pb::Batch::decode(raw.as_slice()).map_err(|e| FrameError::Decode(e.to_string()))
}

/// A plain protobuf frame (session open, hello response, ack).
pub fn encode_message(kind: FrameKind, message: &impl Message) -> Vec<u8> {
    frame(kind, &message.encode_to_vec())
}

pub fn decode_message<M: Message + Default>(body: &[u8]) -> Result<M, FrameError> {
    M::decode(body).map_err(|e| FrameError::Decode(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header_of(bytes: &[u8]) -> [u8; HEADER_LEN] {
        bytes[..HEADER_LEN].try_into().unwrap()
    }

    #[test]
    fn batch_round_trips_compressed() {
        let event = crate::Event::named("rfid.tag.read").to_pb("evt_1".into(), 7);
        let batch = pb::Batch {
            gateway_id: "gw-1".into(),
            epoch: 3,
            first_sequence: 7,
            last_sequence: 7,
            events: vec![event; 50],
        };
        let bytes = encode_batch(&batch, 1).unwrap();
        let (kind, len) = decode_header(header_of(&bytes)).unwrap();
        assert_eq!(kind, FrameKind::Batch);
        assert_eq!(len, bytes.len() - HEADER_LEN);
        assert!(len < batch.encoded_len() / 5, "50 equal events compress well");
        assert_eq!(decode_batch(&bytes[HEADER_LEN..]).unwrap(), batch);
    }

    #[test]
    fn ack_round_trips() {
        let ack = pb::Ack {
            gateway_id: "g".into(),
            epoch: 1,
            acked_sequence: 9,
            status: 1,
            error: String::new(),
        };
        let bytes = encode_message(FrameKind::Ack, &ack);
        let (kind, _) = decode_header(header_of(&bytes)).unwrap();
        assert_eq!(kind, FrameKind::Ack);
        assert_eq!(decode_message::<pb::Ack>(&bytes[HEADER_LEN..]).unwrap(), ack);
    }

    #[test]
    fn hostile_frames_are_refused() {
        assert_eq!(decode_header([9, 0, 0, 0, 1]), Err(FrameError::UnknownKind(9)));
        assert!(matches!(
            decode_header([3, 0xff, 0xff, 0xff, 0xff]),
            Err(FrameError::TooLarge { .. })
        ));
        assert!(matches!(decode_batch(b"not zstd"), Err(FrameError::Decompress(_))));
        // A decompression bomb: 100 MiB of zeros compresses to a few KiB.
        let bomb = zstd::bulk::compress(&vec![0u8; 100 * 1024 * 1024], 3).unwrap();
        assert!(bomb.len() < MAX_FRAME_BYTES);
        assert!(matches!(decode_batch(&bomb), Err(FrameError::Decompress(_))));
        // Valid zstd, garbage protobuf.
        let garbage = zstd::bulk::compress(&[0xff; 64], 1).unwrap();
        assert!(matches!(decode_batch(&garbage), Err(FrameError::Decode(_))));
    }
}
