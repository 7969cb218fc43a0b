//! The [`Scanner`]: walks the records of one segment, validating each,
//! and resynchronises after corrupt bytes (see the parent module for the
//! format).

use std::io;

use bytes::Bytes;

use super::{Header, MAGIC, MAX_SEQ, RECORD_HEADER_BYTES, ReadAt};

/// How much the scanner reads at once.
const WINDOW_BYTES: usize = 256 * 1024;

/// What the scanner found next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Scanned {
    /// A record that checks out. `payload` is empty for records below the
    /// scanner's `copy_from` sequence (validated, not copied).
    Record { seq: u64, offset: u64, payload: Bytes },
    /// Bytes that are not valid records, from `offset` for `bytes` bytes
    /// (0 when only sequence numbers are missing). `missing` names the
    /// sequence numbers lost there, inclusive, when any.
    Corrupt { offset: u64, bytes: u64, missing: Option<(u64, u64)> },
}

/// Walks the records of one segment between two offsets.
pub(crate) struct Scanner<R> {
    src: R,
    /// Offset of the next record.
    pos: u64,
    /// Scan limit (exclusive): file length or the durable length.
    end: u64,
    /// Sequence number expected at `pos`.
    expected: u64,
    /// First sequence number that does not belong to this segment (the next
    /// segment's name), `u64::MAX` when unknown.
    upper: u64,
    /// Records below this sequence are validated but not copied.
    copy_from: u64,
    window: Vec<u8>,
    window_start: u64,
    done: bool,
}

impl<R: ReadAt> Scanner<R> {
    /// Scans `src` from `pos`, where a record with sequence `expected` is
    /// expected, up to offset `end`.
    pub(crate) fn new(
        src: R,
        pos: u64,
        end: u64,
        expected: u64,
        upper: u64,
        copy_from: u64,
    ) -> Self {
        Scanner {
            src,
            pos,
            end,
            expected,
            upper,
            copy_from,
            window: Vec::new(),
            window_start: 0,
            done: false,
        }
    }

    /// Offset of the next record and the sequence number expected there:
    /// a valid place to resume a later scan.
    pub(crate) fn position(&self) -> (u64, u64) {
        (self.pos, self.expected)
    }

    /// The next record or corrupt stretch; `None` at the end.
    pub(crate) fn next_item(&mut self) -> io::Result<Option<Scanned>> {
        if self.done {
            return Ok(None);
        }
        if self.pos >= self.end || self.expected >= self.upper {
            self.done = true;
            return Ok(self.lost_at_end(self.pos));
        }
        let start = self.pos;
        if let Some((header, payload)) = self.record_at(start)? {
            if header.seq == self.expected {
                self.pos += header.record_len();
                self.expected += 1;
                return Ok(Some(Scanned::Record { seq: header.seq, offset: start, payload }));
            }
            if header.seq > self.expected && header.seq < self.upper {
                // A valid record, but numbers before it are missing.
                let missing = (self.expected, header.seq - 1);
                self.expected = header.seq;
                return Ok(Some(Scanned::Corrupt {
                    offset: start,
                    bytes: 0,
                    missing: Some(missing),
                }));
            }
        }
        match self.resync(start + 1)? {
            Some((pos, seq)) => {
                let missing = (seq > self.expected).then(|| (self.expected, seq - 1));
                self.pos = pos;
                self.expected = seq;
                Ok(Some(Scanned::Corrupt { offset: start, bytes: pos - start, missing }))
            }
            None => {
                self.done = true;
                self.pos = self.end;
                Ok(self.lost_at_end(start))
            }
        }
    }

    /// The report for stopping at `offset`: sequence numbers of the
    /// segment never found, and any bytes left unread.
    fn lost_at_end(&mut self, offset: u64) -> Option<Scanned> {
        let missing = (self.upper != u64::MAX && self.expected < self.upper)
            .then(|| (self.expected, self.upper - 1));
        if missing.is_some() {
            self.expected = self.upper;
        }
        let bytes = self.end.saturating_sub(offset);
        (missing.is_some() || bytes > 0).then_some(Scanned::Corrupt { offset, bytes, missing })
    }

    /// The record at `offset` if it is complete within `end` and its
    /// checksum matches.
    fn record_at(&mut self, offset: u64) -> io::Result<Option<(Header, Bytes)>> {
        let Some(header) = Header::parse(self.fill(offset, RECORD_HEADER_BYTES)?) else {
            return Ok(None);
        };
        let len = header.record_len();
        if offset.saturating_add(len) > self.end || header.seq > MAX_SEQ {
            return Ok(None);
        }
        let copy = header.seq >= self.copy_from;
        let record = self.fill(offset, len as usize)?;
        if !header.verify(record) {
            return Ok(None);
        }
        let payload = if copy {
            Bytes::copy_from_slice(&record[RECORD_HEADER_BYTES..])
        } else {
            Bytes::new()
        };
        Ok(Some((header, payload)))
    }

    /// Finds the first offset at or after `from` holding a valid record
    /// whose sequence number belongs here (`expected..upper`).
    fn resync(&mut self, mut from: u64) -> io::Result<Option<(u64, u64)>> {
        while from.saturating_add(RECORD_HEADER_BYTES as u64) <= self.end {
            let window = self.fill(from, WINDOW_BYTES)?;
            if window.len() < MAGIC.len() {
                return Ok(None);
            }
            match window.windows(MAGIC.len()).position(|w| w == MAGIC) {
                Some(i) => {
                    let candidate = from + i as u64;
                    if let Some((header, _)) = self.record_at(candidate)?
                        && header.seq >= self.expected
                        && header.seq < self.upper
                    {
                        return Ok(Some((candidate, header.seq)));
                    }
                    from = candidate + 1;
                }
                None => from += (window.len() - (MAGIC.len() - 1)) as u64,
            }
        }
        Ok(None)
    }

    /// Bytes at `offset`, at most `len` and never past `end`; shorter only
    /// at the end of the data.
    fn fill(&mut self, offset: u64, len: usize) -> io::Result<&[u8]> {
        let want = len.min(usize::try_from(self.end.saturating_sub(offset)).unwrap_or(usize::MAX));
        let window_end = self.window_start + self.window.len() as u64;
        if offset < self.window_start || offset + want as u64 > window_end {
            let size = want.max(
                WINDOW_BYTES
                    .min(usize::try_from(self.end.saturating_sub(offset)).unwrap_or(usize::MAX)),
            );
            self.window.resize(size, 0);
            let mut filled = 0;
            while filled < size {
                match self.src.read_at(&mut self.window[filled..], offset + filled as u64) {
                    Ok(0) => break,
                    Ok(n) => filled += n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
            self.window.truncate(filled);
            self.window_start = offset;
        }
        let from = (offset - self.window_start) as usize;
        let to = (from + want).min(self.window.len());
        Ok(&self.window[from..to])
    }
}

#[cfg(test)]
mod tests {
    use super::super::encode;
    use super::*;

    fn segment(first: u64, payloads: &[&[u8]]) -> Vec<u8> {
        let mut buf = Vec::new();
        for (i, p) in payloads.iter().enumerate() {
            encode(&mut buf, first + i as u64, p);
        }
        buf
    }

    fn scan_all(data: &[u8], expected: u64, upper: u64) -> Vec<Scanned> {
        let mut scanner = Scanner::new(data, 0, data.len() as u64, expected, upper, 0);
        let mut out = Vec::new();
        while let Some(item) = scanner.next_item().unwrap() {
            out.push(item);
        }
        out
    }

    fn record(seq: u64, offset: u64, payload: &'static [u8]) -> Scanned {
        Scanned::Record { seq, offset, payload: Bytes::from_static(payload) }
    }

    #[test]
    fn clean_segment() {
        let data = segment(5, &[b"a", b"bb", b""]);
        assert_eq!(
            scan_all(&data, 5, 8),
            vec![record(5, 0, b"a"), record(6, 21, b"bb"), record(7, 43, b"")]
        );
    }

    #[test]
    fn flipped_bit_in_payload_is_skipped_and_numbered() {
        let mut data = segment(1, &[b"one", b"two", b"three"]);
        data[23 + 21] ^= 0x10; // payload of record 2
        assert_eq!(
            scan_all(&data, 1, u64::MAX),
            vec![
                record(1, 0, b"one"),
                Scanned::Corrupt { offset: 23, bytes: 23, missing: Some((2, 2)) },
                record(3, 46, b"three"),
            ]
        );
    }

    #[test]
    fn corrupt_length_and_magic_resync() {
        let mut data = segment(1, &[b"one", b"two", b"three", b"four"]);
        data[23 + 9] = 0xFF; // length of record 2
        data[46] = 0; // magic of record 3
        let items = scan_all(&data, 1, 5);
        assert_eq!(
            items,
            vec![
                record(1, 0, b"one"),
                Scanned::Corrupt { offset: 23, bytes: 48, missing: Some((2, 3)) },
                record(4, 71, b"four"),
            ]
        );
    }

    #[test]
    fn torn_tail_and_missing_end() {
        let data = segment(1, &[b"one", b"two"]);
        let torn = &data[..data.len() - 1];
        // Unknown upper bound (the tail at start-up): only junk is reported.
        assert_eq!(
            scan_all(torn, 1, u64::MAX),
            vec![record(1, 0, b"one"), Scanned::Corrupt { offset: 23, bytes: 22, missing: None },]
        );
        // Known upper bound (a sealed segment): the lost numbers too.
        assert_eq!(
            scan_all(torn, 1, 4)[1],
            Scanned::Corrupt { offset: 23, bytes: 22, missing: Some((2, 3)) }
        );
    }

    #[test]
    fn records_outside_the_segment_are_ignored() {
        let mut data = segment(1, &[b"one", b"two"]);
        encode(&mut data, 9, b"stale"); // e.g. left over from a failed write
        assert_eq!(
            scan_all(&data, 1, 3),
            vec![
                record(1, 0, b"one"),
                record(2, 23, b"two"),
                Scanned::Corrupt { offset: 46, bytes: 25, missing: None },
            ]
        );
    }

    #[test]
    fn resume_from_position_and_skip_copy() {
        let data = segment(10, &[b"a", b"b", b"c"]);
        let mut scanner = Scanner::new(&data[..], 0, data.len() as u64, 10, 13, 12);
        let first = scanner.next_item().unwrap().unwrap();
        assert_eq!(first, record(10, 0, b""));
        let (pos, seq) = scanner.position();
        assert_eq!((pos, seq), (21, 11));
        let mut resumed = Scanner::new(&data[..], pos, data.len() as u64, seq, 13, 0);
        assert_eq!(resumed.next_item().unwrap().unwrap(), record(11, 21, b"b"));
    }

    #[test]
    fn large_records_span_windows() {
        let big = vec![0xA7u8; WINDOW_BYTES * 2 + 5];
        let mut data = Vec::new();
        encode(&mut data, 1, &big);
        encode(&mut data, 2, b"after");
        data[30] ^= 1; // corrupt the big one: resync must scan past it
        let items = scan_all(&data, 1, 3);
        assert_eq!(items.len(), 2, "{items:?}");
        assert!(matches!(items[0], Scanned::Corrupt { missing: Some((1, 1)), .. }));
        assert!(matches!(items[1], Scanned::Record { seq: 2, .. }));
    }
}
