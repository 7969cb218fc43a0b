//! Record codec, segment file names and segment scanning (`scanner.rs`).
//! No clocks, no tokio: bytes come in through [`ReadAt`], so the scanner is
//! tested on plain byte vectors.
//!
//! A segment file `<first seq, 20 digits>.seg` is a plain sequence of
//! records with consecutive sequence numbers, starting at the number in its
//! name. One record, little endian:
//!
//! ```text
//! 0..4    magic A7 0B 5E C1
//! 4..8    crc32c over bytes 8..20 and the payload
//! 8..12   payload length (u32)
//! 12..20  sequence number (u64)
//! 20..    payload
//! ```
//!
//! The checksum covers the length and the sequence number, so a torn write
//! or a flipped bit anywhere in a record is detected. After a bad record the
//! [`Scanner`] resynchronises by searching for the next magic whose record
//! checks out and whose sequence number belongs to the segment, and reports
//! which sequence numbers were lost in between.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

/// Bytes of framing before each record's payload.
pub const RECORD_HEADER_BYTES: usize = 20;
/// First bytes of every record: where a scan resynchronises.
pub(crate) const MAGIC: [u8; 4] = [0xA7, 0x0B, 0x5E, 0xC1];
const SEGMENT_SUFFIX: &str = ".seg";
/// Sequence numbers above this are not ours (a file name or cursor from
/// elsewhere): rejecting them keeps all arithmetic far from overflow.
pub(crate) const MAX_SEQ: u64 = 1 << 62;

mod scanner;

pub(crate) use self::scanner::{Scanned, Scanner};

/// Encoded size of a record with a payload of `payload_len` bytes.
pub(crate) fn encoded_len(payload_len: usize) -> u64 {
    (RECORD_HEADER_BYTES + payload_len) as u64
}

/// Appends one encoded record to `buf`. The payload must fit in a u32
/// (callers check against `segment_bytes` first).
pub(crate) fn encode(buf: &mut Vec<u8>, seq: u64, payload: &[u8]) {
    let len = u32::try_from(payload.len()).unwrap_or(u32::MAX);
    let start = buf.len();
    buf.extend_from_slice(&MAGIC);
    buf.extend_from_slice(&[0; 4]);
    buf.extend_from_slice(&len.to_le_bytes());
    buf.extend_from_slice(&seq.to_le_bytes());
    let crc = crc32c::crc32c_append(crc32c::crc32c(&buf[start + 8..start + 20]), payload);
    buf[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
    buf.extend_from_slice(payload);
}

/// A record header whose magic matched; nothing else is trusted yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Header {
    pub crc: u32,
    pub len: u32,
    pub seq: u64,
}

impl Header {
    /// Parses the first [`RECORD_HEADER_BYTES`] of `bytes`; `None` when too
    /// short or the magic does not match.
    pub(crate) fn parse(bytes: &[u8]) -> Option<Header> {
        let h = bytes.get(..RECORD_HEADER_BYTES)?;
        if h[..4] != MAGIC {
            return None;
        }
        Some(Header {
            crc: u32::from_le_bytes([h[4], h[5], h[6], h[7]]),
            len: u32::from_le_bytes([h[8], h[9], h[10], h[11]]),
            seq: u64::from_le_bytes([h[12], h[13], h[14], h[15], h[16], h[17], h[18], h[19]]),
        })
    }

    /// Encoded size of the whole record.
    pub(crate) fn record_len(&self) -> u64 {
        encoded_len(self.len as usize)
    }

    /// Whether `record` (header and payload, exactly) carries this checksum.
    pub(crate) fn verify(&self, record: &[u8]) -> bool {
        record.len() as u64 == self.record_len()
            && crc32c::crc32c_append(
                crc32c::crc32c(&record[8..RECORD_HEADER_BYTES]),
                &record[RECORD_HEADER_BYTES..],
            ) == self.crc
    }
}

/// File name of the segment whose first record is `first_seq`.
pub(crate) fn file_name(first_seq: u64) -> String {
    format!("{first_seq:020}{SEGMENT_SUFFIX}")
}

/// The first sequence number encoded in a segment file name.
pub(crate) fn parse_file_name(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(SEGMENT_SUFFIX)?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok().filter(|&first| first <= MAX_SEQ)
}

/// Positional reads, so one open file serves many scanners.
pub(crate) trait ReadAt {
    /// Reads up to `buf.len()` bytes at `offset`; 0 means end of data.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize>;
}

impl ReadAt for File {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        FileExt::read_at(self, buf, offset)
    }
}

impl<T: ReadAt + ?Sized> ReadAt for &T {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        (**self).read_at(buf, offset)
    }
}

impl ReadAt for [u8] {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let start = usize::try_from(offset).unwrap_or(usize::MAX).min(self.len());
        let n = buf.len().min(self.len() - start);
        buf[..n].copy_from_slice(&self[start..start + n]);
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_bytes() {
        let mut buf = Vec::new();
        encode(&mut buf, 7, b"hi");
        assert_eq!(buf.len(), 22);
        assert_eq!(&buf[..4], &MAGIC);
        assert_eq!(&buf[8..12], &[2, 0, 0, 0]);
        assert_eq!(&buf[12..20], &[7, 0, 0, 0, 0, 0, 0, 0]);
        let crc = crc32c::crc32c(&[2, 0, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0, b'h', b'i']);
        assert_eq!(&buf[4..8], &crc.to_le_bytes());
        assert_eq!(&buf[20..], b"hi");
        let header = Header::parse(&buf).unwrap();
        assert_eq!((header.len, header.seq), (2, 7));
        assert!(header.verify(&buf));
    }

    #[test]
    fn file_names_round_trip() {
        assert_eq!(file_name(42), "00000000000000000042.seg");
        assert_eq!(parse_file_name(&file_name(42)), Some(42));
        assert_eq!(parse_file_name(&file_name(MAX_SEQ)), Some(MAX_SEQ));
        assert_eq!(parse_file_name(&file_name(u64::MAX)), None);
        assert_eq!(parse_file_name("42.seg"), None);
        assert_eq!(parse_file_name("0000000000000000004x.seg"), None);
        assert_eq!(parse_file_name("00000000000000000042.tmp"), None);
    }
}
