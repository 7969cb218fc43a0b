//! Frames: what crosses the serial line, in either direction.
//!
//! Decoded, a frame is
//!
//! | bytes | field |
//! | --- | --- |
//! | 1 | version, [`VERSION`] |
//! | 1 | kind ([`Kind`]) |
//! | 4 | sequence number, little-endian |
//! | 0 to [`MAX_PAYLOAD`] | payload, by kind |
//! | 4 | CRC-32 of all the bytes before it, little-endian |
//!
//! and on the line it is COBS-stuffed and ends with one 0x00 (`cobs.rs`).

use crate::Error;
use crate::cobs;
use crate::crc::{Crc32, crc32};

/// The protocol version this crate speaks; a frame of another is refused.
pub const VERSION: u8 = 1;
/// Version, kind and sequence number.
pub const HEADER: usize = 6;
/// Longest payload.
pub const MAX_PAYLOAD: usize = 500;
/// Longest frame, decoded.
pub const MAX_FRAME: usize = HEADER + MAX_PAYLOAD + 4;
/// Longest frame on the line: stuffing adds at most one byte per 254, and
/// the delimiter one more. A receive buffer this size never overflows on
/// a valid frame.
pub const MAX_ENCODED: usize = MAX_FRAME + MAX_FRAME / 254 + 2;

/// What a frame is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Device to host, at boot and whenever asked: who it is and where it
    /// stands. Payload ([`hello_payload`]): the boot id (`u32` LE, new at
    /// every boot), the highest reading number of this boot an ack has
    /// covered (`u32` LE, 0 at boot: a host that restarted resumes there),
    /// and the device id (UTF-8, 1 to 64 bytes). Sequence number 0.
    Hello,
    /// Device to host: one reading ([`crate::reading`]). Sequence numbers
    /// count readings from 1 within a boot.
    Reading,
    /// Host to device: every reading of this boot up to the sequence
    /// number is stored (or was refused for good); the device may forget
    /// them. Payload: the boot id (`u32` LE) it is about.
    Ack,
    /// Host to device: a reading came before any hello (the host
    /// restarted); send a hello, then the readings not acknowledged.
    HelloRequest,
}

impl Kind {
    pub const fn code(self) -> u8 {
        match self {
            Kind::Hello => 0x01,
            Kind::Reading => 0x02,
            Kind::Ack => 0x81,
            Kind::HelloRequest => 0x82,
        }
    }

    pub const fn from_code(code: u8) -> Option<Kind> {
        match code {
            0x01 => Some(Kind::Hello),
            0x02 => Some(Kind::Reading),
            0x81 => Some(Kind::Ack),
            0x82 => Some(Kind::HelloRequest),
            _ => None,
        }
    }
}

/// A decoded frame, borrowing the decoder's buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame<'a> {
    pub kind: Kind,
    pub seq: u32,
    pub payload: &'a [u8],
}

/// Writes one frame into a byte slice: header, payload in as many pieces
/// as convenient, then [`FrameWriter::finish`]. Nothing is assembled
/// twice and nothing is allocated.
pub struct FrameWriter<'o> {
    cobs: cobs::Encoder<'o>,
    crc: Crc32,
    payload: usize,
}

impl<'o> FrameWriter<'o> {
    /// Starts a frame in `out`, which should hold [`MAX_ENCODED`] bytes
    /// (a shorter one serves short frames).
    pub fn new(out: &'o mut [u8], kind: Kind, seq: u32) -> Result<Self, Error> {
        let mut writer =
            FrameWriter { cobs: cobs::Encoder::new(out)?, crc: Crc32::new(), payload: 0 };
        let [a, b, c, d] = seq.to_le_bytes();
        writer.raw(&[VERSION, kind.code(), a, b, c, d])?;
        Ok(writer)
    }

    /// Appends payload bytes.
    pub fn put(&mut self, bytes: &[u8]) -> Result<(), Error> {
        self.payload += bytes.len();
        if self.payload > MAX_PAYLOAD {
            return Err(Error::TooLong);
        }
        self.raw(bytes)
    }

    fn raw(&mut self, bytes: &[u8]) -> Result<(), Error> {
        self.crc.update(bytes);
        self.cobs.push(bytes)
    }

    /// Appends the checksum and the delimiter: the bytes to send.
    pub fn finish(mut self) -> Result<usize, Error> {
        let crc = self.crc.finish().to_le_bytes();
        self.cobs.push(&crc)?;
        self.cobs.finish()
    }
}

/// Encodes a whole frame into `out`: the number of bytes to send.
pub fn encode(kind: Kind, seq: u32, payload: &[u8], out: &mut [u8]) -> Result<usize, Error> {
    let mut writer = FrameWriter::new(out, kind, seq)?;
    writer.put(payload)?;
    writer.finish()
}

/// Finds frames in a byte stream, `N` bytes of buffer (at least
/// [`MAX_ENCODED`] to take every valid frame). Whatever is wrong with
/// one frame (line noise, a frame cut by a reset, a wrong checksum) is
/// reported and the decoder carries on at the next delimiter.
pub struct Decoder<const N: usize> {
    buf: [u8; N],
    len: usize,
    /// The current frame outgrew the buffer: skip to its end.
    overflow: bool,
}

impl<const N: usize> core::fmt::Debug for Decoder<N> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Decoder").field("len", &self.len).field("overflow", &self.overflow).finish()
    }
}

impl<const N: usize> Default for Decoder<N> {
    fn default() -> Self {
        Decoder { buf: [0; N], len: 0, overflow: false }
    }
}

impl<const N: usize> Decoder<N> {
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds bytes from the line; `each` gets every frame they complete,
    /// or why it was not one.
    pub fn feed(&mut self, bytes: &[u8], mut each: impl FnMut(Result<Frame<'_>, Error>)) {
        for &b in bytes {
            if b != 0 {
                if self.len < N {
                    self.buf[self.len] = b;
                    self.len += 1;
                } else {
                    self.overflow = true;
                }
                continue;
            }
            let (len, overflow) = (self.len, self.overflow);
            self.len = 0;
            self.overflow = false;
            if overflow {
                each(Err(Error::TooLong));
            } else if len > 0 {
                // Empty frames are allowed: a device may send 0x00 to end
                // whatever garbage came before it.
                each(parse(&mut self.buf[..len]));
            }
        }
    }
}

/// One stuffed frame without its delimiter, decoded in place.
fn parse(stuffed: &mut [u8]) -> Result<Frame<'_>, Error> {
    let n = cobs::decode_in_place(stuffed)?;
    let frame = &stuffed[..n];
    if n < HEADER + 4 {
        return Err(Error::TooShort);
    }
    if n > MAX_FRAME {
        return Err(Error::TooLong);
    }
    let (body, crc) = frame.split_at(n - 4);
    if crc32(body) != u32::from_le_bytes([crc[0], crc[1], crc[2], crc[3]]) {
        return Err(Error::Checksum);
    }
    if body[0] != VERSION {
        return Err(Error::Version(body[0]));
    }
    let kind = Kind::from_code(body[1]).ok_or(Error::UnknownKind(body[1]))?;
    let seq = u32::from_le_bytes([body[2], body[3], body[4], body[5]]);
    Ok(Frame { kind, seq, payload: &body[HEADER..] })
}

/// What a [`Kind::Hello`] says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello<'a> {
    pub boot: u32,
    /// The highest reading number of this boot an ack has covered.
    pub acked: u32,
    pub device_id: &'a str,
}

/// The payload of a [`Kind::Hello`]: boot id, acked, device id.
pub fn hello_payload<'b>(hello: &Hello<'_>, out: &'b mut [u8]) -> Result<&'b [u8], Error> {
    let id = hello.device_id;
    if id.is_empty() || id.len() > 64 || id.chars().any(char::is_control) {
        return Err(Error::Payload("the device id must be 1 to 64 bytes, no control characters"));
    }
    let n = 8 + id.len();
    let out = out.get_mut(..n).ok_or(Error::BufferTooSmall)?;
    out[..4].copy_from_slice(&hello.boot.to_le_bytes());
    out[4..8].copy_from_slice(&hello.acked.to_le_bytes());
    out[8..].copy_from_slice(id.as_bytes());
    Ok(out)
}

/// Reads a [`Kind::Hello`] payload.
pub fn parse_hello(payload: &[u8]) -> Result<Hello<'_>, Error> {
    if payload.len() < 9 || payload.len() > 72 {
        return Err(Error::Payload(
            "a hello holds a boot id, a count and a 1 to 64-byte device id",
        ));
    }
    let boot = u32::from_le_bytes([payload[0], payload[1], payload[2], payload[3]]);
    let acked = u32::from_le_bytes([payload[4], payload[5], payload[6], payload[7]]);
    let device_id = core::str::from_utf8(&payload[8..])
        .map_err(|_| Error::Payload("the device id is not UTF-8"))?;
    if device_id.chars().any(char::is_control) {
        return Err(Error::Payload("the device id has control characters"));
    }
    Ok(Hello { boot, acked, device_id })
}

/// Reads the boot id of a [`Kind::Ack`] payload.
pub fn parse_ack(payload: &[u8]) -> Result<u32, Error> {
    match payload {
        [a, b, c, d] => Ok(u32::from_le_bytes([*a, *b, *c, *d])),
        _ => Err(Error::Payload("an ack holds the boot id")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Decoded = Result<(Kind, u32, Vec<u8>), Error>;

    fn frames(bytes: &[u8]) -> Vec<Decoded> {
        let mut decoder = Decoder::<MAX_ENCODED>::new();
        let mut out = Vec::new();
        decoder.feed(bytes, |f| out.push(f.map(|f| (f.kind, f.seq, f.payload.to_vec()))));
        out
    }

    #[test]
    fn an_ack_has_known_bytes() {
        let mut out = [0u8; MAX_ENCODED];
        let n = encode(Kind::Ack, 7, &42u32.to_le_bytes(), &mut out).unwrap();
        // Decoded: 01 81 07000000 2a000000 + CRC-32 of those ten bytes.
        let crc = crc32(&[0x01, 0x81, 0x07, 0, 0, 0, 0x2a, 0, 0, 0]).to_le_bytes();
        let mut expected = vec![0x04, 0x01, 0x81, 0x07, 0x01, 0x01, 0x02, 0x2a, 0x01, 0x01];
        // The CRC's bytes, stuffed: a block of them (none is zero here).
        assert!(!crc.contains(&0), "pick a sequence whose CRC has no zero byte");
        expected.push(5);
        expected.extend_from_slice(&crc);
        expected.push(0);
        assert_eq!(&out[..n], &expected[..]);
        assert_eq!(frames(&out[..n]), [Ok((Kind::Ack, 7, 42u32.to_le_bytes().to_vec()))]);
    }

    #[test]
    fn garbage_before_between_and_inside_frames_is_reported_and_skipped() {
        let mut line = Vec::new();
        line.extend_from_slice(b"\x13\x37noise\x00");
        let mut out = [0u8; MAX_ENCODED];
        let n = encode(Kind::Reading, 1, b"one", &mut out).unwrap();
        line.extend_from_slice(&out[..n]);
        let mut bad = out[..n].to_vec();
        bad[3] ^= 0x40; // a flipped bit
        line.extend_from_slice(&bad);
        line.extend_from_slice(&[0xFF; 2000]); // longer than any frame
        line.push(0);
        let n = encode(Kind::Reading, 2, b"two", &mut out).unwrap();
        line.extend_from_slice(&out[..n]);
        let got = frames(&line);
        assert_eq!(got.len(), 5, "{got:?}");
        assert!(got[0].is_err());
        assert_eq!(got[1], Ok((Kind::Reading, 1, b"one".to_vec())));
        assert_eq!(got[2], Err(Error::Checksum));
        assert_eq!(got[3], Err(Error::TooLong));
        assert_eq!(got[4], Ok((Kind::Reading, 2, b"two".to_vec())));
    }

    #[test]
    fn frames_split_anywhere_decode_the_same() {
        let mut out = [0u8; MAX_ENCODED];
        let n = encode(Kind::Reading, 9, &[0, 1, 0, 2, 0], &mut out).unwrap();
        let mut decoder = Decoder::<MAX_ENCODED>::new();
        let mut got = Vec::new();
        for b in &out[..n] {
            decoder.feed(core::slice::from_ref(b), |f| got.push(f.map(|f| f.payload.to_vec())));
        }
        assert_eq!(got, [Ok(vec![0, 1, 0, 2, 0])]);
    }

    #[test]
    fn limits_and_kinds_are_checked() {
        let mut out = [0u8; MAX_ENCODED];
        assert_eq!(encode(Kind::Reading, 1, &[1; MAX_PAYLOAD + 1], &mut out), Err(Error::TooLong));
        let n = encode(Kind::Reading, 1, &[1; MAX_PAYLOAD], &mut out).unwrap();
        assert!(n <= MAX_ENCODED);
        assert_eq!(frames(&out[..n]).len(), 1);
        assert_eq!(encode(Kind::Ack, 1, &[], &mut [0u8; 8]), Err(Error::BufferTooSmall));
        // A frame of an unknown kind and one of another version.
        for (version, kind, expected) in
            [(VERSION, 0x7F, Error::UnknownKind(0x7F)), (2, 0x01, Error::Version(2))]
        {
            let body = [version, kind, 1, 0, 0, 0];
            let mut raw = body.to_vec();
            raw.extend_from_slice(&crc32(&body).to_le_bytes());
            let mut stuffed = [0u8; 32];
            let mut e = cobs::Encoder::new(&mut stuffed).unwrap();
            e.push(&raw).unwrap();
            let n = e.finish().unwrap();
            assert_eq!(frames(&stuffed[..n]), [Err(expected)]);
        }
        assert_eq!(frames(&[0x01, 0x01, 0x00]), [Err(Error::TooShort)]);
    }

    #[test]
    fn hello_round_trip_and_bad_hellos() {
        let mut buf = [0u8; 80];
        let hello = Hello { boot: 0xDEAD_BEEF, acked: 12, device_id: "press-7" };
        let payload = hello_payload(&hello, &mut buf).unwrap();
        assert_eq!(&payload[..8], &[0xEF, 0xBE, 0xAD, 0xDE, 12, 0, 0, 0]);
        assert_eq!(parse_hello(payload), Ok(hello));
        assert!(hello_payload(&Hello { device_id: "", ..hello }, &mut buf).is_err());
        assert!(hello_payload(&Hello { device_id: "a\nb", ..hello }, &mut buf).is_err());
        assert!(parse_hello(&[1, 2, 3, 4, 0, 0, 0, 0]).is_err());
        assert!(parse_hello(&[1, 2, 3, 4, 0, 0, 0, 0, 0xFF]).is_err());
        assert!(parse_hello(&[1, 2, 3, 4, 0, 0, 0, 0, b'\n']).is_err());
        assert_eq!(parse_ack(&5u32.to_le_bytes()), Ok(5));
        assert!(parse_ack(&[1]).is_err());
    }
}
