//! RFID reader protocols on a serial line, and read smoothing. I/O-free.
//!
//! **Line protocol** (one read per CR/LF-terminated line):
//! `EPC,ANTENNA,RSSI[,TIMESTAMP_MS]`, e.g.
//! `3034F87E5C0000400000012A,2,-57.5,1795000000123`: the EPC in hex (4 to
//! 32 bytes), the antenna port (0 to 255), the RSSI in dBm (-128 to 0) and
//! optionally the reader's clock in ms since the epoch.
//!
//! **Binary protocol** (frames on a byte stream):
//! `A5 5A LEN PAYLOAD CRC16`, where `LEN` is the payload's length, `CRC16`
//! is CRC-16/CCITT-FALSE (big-endian) over `LEN` and the payload, and the
//! payload is `EPC_LEN EPC.. ANTENNA RSSI(i8) [TIMESTAMP_MS(u64 BE)]`. A
//! frame that fails its length or CRC is skipped one byte at a time until
//! the next `A5 5A`, so the decoder finds its way back after garbage.
//!
//! **Smoothing**: a reader reports a tag in its field many times a second.
//! [`Smoother`] turns that into one `rfid.tag.read` per visit once the tag
//! has been in the field for `dwell` (first and last seen, read count, peak
//! RSSI and its antenna) and one `rfid.tag.departed` once it has not been
//! seen for `depart_after`.

use std::collections::HashMap;
use std::fmt;

/// One raw read.
#[derive(Debug, Clone, PartialEq)]
pub struct TagRead {
    /// Upper-case hex.
    pub epc: String,
    pub antenna: u8,
    pub rssi: f64,
    /// The reader's clock, when it sent one.
    pub reader_ms: Option<i64>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum ReadError {
    /// A line that is not `EPC,ANTENNA,RSSI[,TS]`.
    BadLine(String),
    /// Bytes skipped while looking for a valid frame.
    BadFrame { skipped: usize },
}

impl ReadError {
    pub fn reason(&self) -> &'static str {
        match self {
            ReadError::BadLine(_) => "bad_line",
            ReadError::BadFrame { .. } => "bad_frame",
        }
    }
}

impl fmt::Display for ReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReadError::BadLine(why) => write!(f, "bad RFID line: {why}"),
            ReadError::BadFrame { skipped } => write!(f, "{skipped} bytes skipped: no valid frame"),
        }
    }
}

impl TagRead {
    /// The read as the line protocol writes it, CR LF included (for
    /// simulators and tests).
    pub fn to_line(&self) -> String {
        match self.reader_ms {
            Some(ms) => format!("{},{},{},{ms}\r\n", self.epc, self.antenna, self.rssi),
            None => format!("{},{},{}\r\n", self.epc, self.antenna, self.rssi),
        }
    }
}

/// Parses one line of the line protocol.
pub fn parse_line(line: &str) -> Result<TagRead, ReadError> {
    let bad = |why: &str| ReadError::BadLine(why.to_owned());
    let fields: Vec<&str> = line.trim().split(',').map(str::trim).collect();
    if !(3..=4).contains(&fields.len()) {
        return Err(bad("expected EPC,ANTENNA,RSSI[,TIMESTAMP_MS]"));
    }
    let epc = fields[0];
    if !(8..=64).contains(&epc.len())
        || !epc.len().is_multiple_of(2)
        || !epc.bytes().all(|b| b.is_ascii_hexdigit())
    {
        return Err(bad("the EPC must be 8 to 64 hex digits"));
    }
    let antenna: u8 = fields[1].parse().map_err(|_| bad("the antenna must be 0 to 255"))?;
    let rssi: f64 = fields[2].parse().map_err(|_| bad("the RSSI must be a number"))?;
    if !(-128.0..=0.0).contains(&rssi) {
        return Err(bad("the RSSI must be -128 to 0 dBm"));
    }
    let reader_ms = match fields.get(3) {
        Some(ts) => Some(ts.parse::<i64>().map_err(|_| bad("the timestamp must be ms"))?),
        None => None,
    };
    Ok(TagRead { epc: epc.to_ascii_uppercase(), antenna, rssi, reader_ms })
}

const MAGIC: [u8; 2] = [0xA5, 0x5A];
/// Largest payload: 1 + 32 (EPC) + 1 + 1 + 8.
const MAX_PAYLOAD: usize = 43;
/// Smallest payload: a 4-byte EPC.
const MIN_PAYLOAD: usize = 7;

/// CRC-16/CCITT-FALSE: polynomial 0x1021, initial 0xFFFF.
pub fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0xFFFF;
    for &b in bytes {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 { (crc << 1) ^ 0x1021 } else { crc << 1 };
        }
    }
    crc
}

/// Encodes a read as a binary frame (for the simulator and tests).
pub fn encode_frame(read: &TagRead) -> Option<Vec<u8>> {
    let epc = hex_decode(&read.epc)?;
    let mut payload = vec![u8::try_from(epc.len()).ok()?];
    payload.extend(epc);
    payload.push(read.antenna);
    #[allow(clippy::cast_possible_truncation)] // clamped to the i8 range first
    payload.push(read.rssi.clamp(-128.0, 0.0) as i8 as u8);
    if let Some(ms) = read.reader_ms {
        payload.extend(u64::try_from(ms).ok()?.to_be_bytes());
    }
    let mut frame = MAGIC.to_vec();
    frame.push(u8::try_from(payload.len()).ok()?);
    frame.extend(&payload);
    let crc = crc16(&frame[2..]);
    frame.extend(crc.to_be_bytes());
    Some(frame)
}

fn hex_decode(hex: &str) -> Option<Vec<u8>> {
    if !hex.len().is_multiple_of(2) {
        return None;
    }
    (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok()).collect()
}

/// Decodes a frame payload (already CRC-checked).
fn parse_payload(p: &[u8]) -> Option<TagRead> {
    let (&epc_len, rest) = p.split_first()?;
    let epc_len = usize::from(epc_len);
    if !(4..=32).contains(&epc_len) {
        return None;
    }
    let epc = rest.get(..epc_len)?;
    let rest = &rest[epc_len..];
    let (antenna, rssi, ts) = match rest {
        [antenna, rssi] => (*antenna, *rssi, None),
        [antenna, rssi, ts @ ..] if ts.len() == 8 => {
            let mut b = [0; 8];
            b.copy_from_slice(ts);
            (*antenna, *rssi, Some(i64::try_from(u64::from_be_bytes(b)).ok()?))
        }
        _ => return None,
    };
    let rssi = f64::from(i8::from_ne_bytes([rssi]));
    if rssi > 0.0 {
        return None;
    }
    let epc = epc.iter().map(|b| format!("{b:02X}")).collect();
    Some(TagRead { epc, antenna, rssi, reader_ms: ts })
}

/// Incremental decoder of the binary protocol.
#[derive(Debug, Default)]
pub struct FrameDecoder {
    buf: Vec<u8>,
}

/// Bytes kept while waiting for the rest of a frame; garbage beyond it is
/// dropped (and counted) rather than buffered without bound.
const MAX_BUFFERED: usize = 4096;

impl FrameDecoder {
    /// Forgets a frame begun (its port was lost); how many bytes it held.
    pub fn reset(&mut self) -> usize {
        std::mem::take(&mut self.buf).len()
    }

    /// Adds bytes and returns every read (or skipped garbage) they complete.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<Result<TagRead, ReadError>> {
        self.buf.extend_from_slice(bytes);
        let mut out = Vec::new();
        let mut skipped = 0;
        loop {
            // Find the magic; everything before it is garbage.
            let start = self.buf.windows(2).position(|w| w == MAGIC);
            let drop = start.unwrap_or(self.buf.len().saturating_sub(1));
            if drop > 0 {
                skipped += drop;
                self.buf.drain(..drop);
            }
            if start.is_none() || self.buf.len() < 3 {
                break;
            }
            let len = usize::from(self.buf[2]);
            if !(MIN_PAYLOAD..=MAX_PAYLOAD).contains(&len) {
                skipped += 1;
                self.buf.drain(..1);
                continue;
            }
            let total = 2 + 1 + len + 2;
            if self.buf.len() < total {
                break;
            }
            let crc = u16::from_be_bytes([self.buf[total - 2], self.buf[total - 1]]);
            let read = (crc16(&self.buf[2..total - 2]) == crc)
                .then(|| parse_payload(&self.buf[3..total - 2]))
                .flatten();
            match read {
                Some(read) => {
                    if skipped > 0 {
                        out.push(Err(ReadError::BadFrame { skipped }));
                        skipped = 0;
                    }
                    out.push(Ok(read));
                    self.buf.drain(..total);
                }
                None => {
                    skipped += 1;
                    self.buf.drain(..1);
                }
            }
        }
        if self.buf.len() > MAX_BUFFERED {
            skipped += self.buf.len();
            self.buf.clear();
        }
        if skipped > 0 {
            out.push(Err(ReadError::BadFrame { skipped }));
        }
        out
    }
}

/// What smoothing reports.
#[derive(Debug, Clone, PartialEq)]
pub enum Smoothed {
    /// The tag has been in the field for the dwell time.
    Read(Visit),
    /// The tag left the field: not seen for `depart_after`.
    Departed(Visit),
}

/// One tag's visit to the field so far.
#[derive(Debug, Clone, PartialEq)]
pub struct Visit {
    pub epc: String,
    pub first_ms: i64,
    pub last_ms: i64,
    pub count: u64,
    pub peak_rssi: f64,
    /// The antenna of the peak.
    pub antenna: u8,
    /// The reader's clock at the first read, when it sends one.
    pub reader_first_ms: Option<i64>,
    reported: bool,
}

/// Tags tracked at once; a reader flooding more unique EPCs than this has
/// the longest-unseen ones reported as departed early.
const MAX_TAGS: usize = 65_536;

/// Tags reported departed early at once when full: one pass over all of
/// them makes room for this many new ones, where a pass per new tag cost
/// a flood of unique EPCs 65,536 steps a read.
const EARLY_DEPARTURES: usize = MAX_TAGS / 16;

/// Read smoothing (see the module docs). Times are the gateway's receive
/// times in ms, passed in, so tests control the clock.
#[derive(Debug)]
pub struct Smoother {
    dwell_ms: i64,
    depart_after_ms: i64,
    tags: HashMap<String, Visit>,
}

impl Smoother {
    pub fn new(dwell_ms: i64, depart_after_ms: i64) -> Self {
        Smoother { dwell_ms, depart_after_ms, tags: HashMap::new() }
    }

    /// Records a read at `now_ms`.
    pub fn observe(&mut self, read: &TagRead, now_ms: i64) -> Vec<Smoothed> {
        let mut out = Vec::new();
        if !self.tags.contains_key(&read.epc) && self.tags.len() >= MAX_TAGS {
            let mut by_age: Vec<(i64, &String)> =
                self.tags.values().map(|v| (v.last_ms, &v.epc)).collect();
            let n = EARLY_DEPARTURES.min(by_age.len());
            if n > 0 && n < by_age.len() {
                by_age.select_nth_unstable(n);
            }
            by_age.truncate(n);
            by_age.sort_unstable();
            let oldest: Vec<String> = by_age.into_iter().map(|(_, epc)| epc.clone()).collect();
            for epc in oldest {
                if let Some(visit) = self.tags.remove(&epc) {
                    close(visit, &mut out);
                }
            }
        }
        let visit = self.tags.entry(read.epc.clone()).or_insert_with(|| Visit {
            epc: read.epc.clone(),
            first_ms: now_ms,
            last_ms: now_ms,
            count: 0,
            peak_rssi: read.rssi,
            antenna: read.antenna,
            reader_first_ms: read.reader_ms,
            reported: false,
        });
        visit.count += 1;
        visit.last_ms = visit.last_ms.max(now_ms);
        if read.rssi > visit.peak_rssi {
            visit.peak_rssi = read.rssi;
            visit.antenna = read.antenna;
        }
        out
    }

    /// Reports what the passing of time decided, as of `now_ms`.
    pub fn tick(&mut self, now_ms: i64) -> Vec<Smoothed> {
        let mut out = Vec::new();
        let mut gone = Vec::new();
        for visit in self.tags.values_mut() {
            if now_ms - visit.last_ms >= self.depart_after_ms {
                gone.push(visit.epc.clone());
            } else if !visit.reported && now_ms - visit.first_ms >= self.dwell_ms {
                visit.reported = true;
                out.push(Smoothed::Read(visit.clone()));
            }
        }
        gone.sort();
        for epc in gone {
            if let Some(visit) = self.tags.remove(&epc) {
                close(visit, &mut out);
            }
        }
        out
    }

    /// The source stops: the read of every visit whose dwell has not come
    /// yet, so that none is lost (by EPC). The visits stay open: whether
    /// their tags leave, nobody watches now.
    pub fn stop(&mut self) -> Vec<Smoothed> {
        let mut out: Vec<Smoothed> = self
            .tags
            .values_mut()
            .filter(|visit| !visit.reported)
            .map(|visit| {
                visit.reported = true;
                Smoothed::Read(visit.clone())
            })
            .collect();
        out.sort_by(|a, b| match (a, b) {
            (
                Smoothed::Read(a) | Smoothed::Departed(a),
                Smoothed::Read(b) | Smoothed::Departed(b),
            ) => a.epc.cmp(&b.epc),
        });
        out
    }

    /// Tags in the field now.
    pub fn present(&self) -> usize {
        self.tags.len()
    }
}

/// A visit ends: its read (if the dwell never came) and its departure.
fn close(mut visit: Visit, out: &mut Vec<Smoothed>) {
    if !visit.reported {
        visit.reported = true;
        out.push(Smoothed::Read(visit.clone()));
    }
    out.push(Smoothed::Departed(visit));
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn read(epc: &str, antenna: u8, rssi: f64) -> TagRead {
        TagRead { epc: epc.into(), antenna, rssi, reader_ms: None }
    }

    #[test]
    fn a_flood_of_unique_tags_departs_the_longest_unseen_in_batches() {
        let mut smoother = Smoother::new(0, 60_000);
        let epc = |n: usize| format!("E2{n:022X}");
        for n in 0..MAX_TAGS {
            smoother.observe(&read(&epc(n), 1, -50.0), i64::try_from(n).unwrap());
        }
        let out = smoother.observe(&read(&epc(MAX_TAGS), 1, -50.0), 1 << 40);
        let departed: Vec<&str> = out
            .iter()
            .filter_map(|s| match s {
                Smoothed::Departed(v) => Some(v.epc.as_str()),
                Smoothed::Read(_) => None,
            })
            .collect();
        let oldest: Vec<String> = (0..EARLY_DEPARTURES).map(epc).collect();
        assert_eq!(departed, oldest, "the longest unseen, oldest first");
        assert_eq!(smoother.tags.len(), MAX_TAGS - EARLY_DEPARTURES + 1);
        // Room for the next ones without another pass.
        let next = smoother.observe(&read(&epc(MAX_TAGS + 1), 1, -50.0), 1 << 40);
        assert!(next.iter().all(|s| !matches!(s, Smoothed::Departed(_))));
    }

    #[test]
    fn lines_parse_and_bad_ones_say_why() {
        let r = parse_line("3034f87e5c0000400000012a,2,-57.5,1795000000123\r").unwrap();
        assert_eq!(r.epc, "3034F87E5C0000400000012A");
        assert_eq!((r.antenna, r.rssi, r.reader_ms), (2, -57.5, Some(1_795_000_000_123)));
        assert_eq!(parse_line("E2000017,1,-40").unwrap().reader_ms, None);
        assert_eq!(parse_line(&r.to_line()), Ok(r));
        for bad in [
            "",
            "E2000017,1",
            "E20017,1,-40",
            "XYZ00017,1,-40",
            "E2000017,300,-40",
            "E2000017,1,5",
            "E2000017,1,-40,soon",
            "E2000017,1,-40,1,2",
        ] {
            let err = parse_line(bad).unwrap_err();
            assert_eq!(err.reason(), "bad_line", "{bad}");
        }
    }

    #[test]
    fn crc_matches_the_published_check_value() {
        assert_eq!(crc16(b"123456789"), 0x29B1);
    }

    #[test]
    fn frames_decode_across_chunks_and_resync_after_garbage() {
        let a = TagRead {
            epc: "3034F87E5C0000400000012A".into(),
            antenna: 3,
            rssi: -61.0,
            reader_ms: Some(1_795_000_000_000),
        };
        let b = read("E2000017", 1, -40.0);
        let mut stream = b"\x00garbage\xA5".to_vec();
        stream.extend(encode_frame(&a).unwrap());
        let mut corrupt = encode_frame(&b).unwrap();
        corrupt[5] ^= 0xFF; // CRC fails
        stream.extend(&corrupt);
        stream.extend(encode_frame(&b).unwrap());
        let mut decoder = FrameDecoder::default();
        let mut got = Vec::new();
        for chunk in stream.chunks(5) {
            got.extend(decoder.push(chunk));
        }
        let reads: Vec<TagRead> = got.iter().filter_map(|r| r.clone().ok()).collect();
        assert_eq!(reads, vec![a, b]);
        let skipped: usize = got
            .iter()
            .filter_map(|r| match r {
                Err(ReadError::BadFrame { skipped }) => Some(*skipped),
                _ => None,
            })
            .sum();
        assert_eq!(skipped, 9 + corrupt.len(), "the garbage and the corrupt frame");
    }

    #[test]
    fn smoothing_makes_one_read_per_visit_and_a_departure() {
        let mut s = Smoother::new(1_000, 3_000);
        let t0 = 1_000_000;
        // Ten reads in 900 ms on two antennas: nothing yet.
        for i in 0..10 {
            let rssi = if i == 4 { -41.0 } else { -60.0 };
            assert!(
                s.observe(&read("E2000017", if i == 4 { 2 } else { 1 }, rssi), t0 + i * 100)
                    .is_empty()
            );
            assert!(s.tick(t0 + i * 100).is_empty());
        }
        let out = s.tick(t0 + 1_000);
        let [Smoothed::Read(visit)] = out.as_slice() else { panic!("{out:?}") };
        assert_eq!((visit.count, visit.first_ms, visit.last_ms), (10, t0, t0 + 900));
        assert_eq!((visit.peak_rssi, visit.antenna), (-41.0, 2));
        // Still in the field: more reads, no second read event.
        s.observe(&read("E2000017", 1, -50.0), t0 + 2_000);
        assert!(s.tick(t0 + 4_999).is_empty());
        let out = s.tick(t0 + 5_000);
        let [Smoothed::Departed(visit)] = out.as_slice() else { panic!("{out:?}") };
        assert_eq!((visit.count, visit.last_ms), (11, t0 + 2_000));
        assert_eq!(s.present(), 0);
        // Back again: a new visit.
        s.observe(&read("E2000017", 1, -50.0), t0 + 9_000);
        assert!(matches!(s.tick(t0 + 10_000).as_slice(), [Smoothed::Read(v)] if v.count == 1));
    }

    #[test]
    fn a_tag_gone_before_the_dwell_still_reports_its_read() {
        let mut s = Smoother::new(10_000, 1_000);
        s.observe(&read("E2000017", 1, -50.0), 0);
        let out = s.tick(1_000);
        assert!(matches!(out.as_slice(), [Smoothed::Read(_), Smoothed::Departed(_)]), "{out:?}");
    }

    proptest! {
        #[test]
        fn any_bytes_decode_without_panicking_or_growing(chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..200), 0..20)) {
            let mut decoder = FrameDecoder::default();
            for chunk in &chunks {
                let _ = decoder.push(chunk);
                prop_assert!(decoder.buf.len() <= MAX_BUFFERED);
            }
        }

        #[test]
        fn every_read_survives_the_frame_roundtrip(epc in "([0-9A-F]{2}){4,32}", antenna in any::<u8>(), rssi in -128i8..=0, ts in proptest::option::of(0i64..i64::MAX)) {
            let r = TagRead { epc, antenna, rssi: f64::from(rssi), reader_ms: ts };
            let mut decoder = FrameDecoder::default();
            let got = decoder.push(&encode_frame(&r).unwrap());
            prop_assert_eq!(got, vec![Ok(r)]);
        }
    }
}
