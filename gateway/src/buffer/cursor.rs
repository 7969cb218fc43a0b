//! The cursor file: how far the cloud has acknowledged, and the lowest
//! sequence number the next record may receive.
//!
//! Written atomically: `cursor.tmp` is written and fsynced, renamed over
//! `cursor`, and the directory fsynced. 28 bytes, little endian: magic
//! `OGCU`, version (u32), acknowledged sequence (u64), next-sequence floor
//! (u64), crc32c of the 24 bytes before it. A missing file means a fresh
//! buffer; an unreadable or garbage file is reported and the caller falls
//! back to what the segments say (redelivering, never losing).

use std::fs::File;
use std::io::{self, Read};
use std::path::Path;

use super::segment::MAX_SEQ;

const FILE: &str = "cursor";
pub(crate) const TMP_FILE: &str = "cursor.tmp";
const MAGIC: [u8; 4] = *b"OGCU";
const VERSION: u32 = 1;
const LEN: usize = 28;

/// What the cursor file records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Cursor {
    /// Highest acknowledged sequence number (0: none).
    pub acked: u64,
    /// Every sequence number below this was handed out already.
    pub next_floor: u64,
}

impl Cursor {
    fn encode(&self) -> [u8; LEN] {
        let mut out = [0u8; LEN];
        out[..4].copy_from_slice(&MAGIC);
        out[4..8].copy_from_slice(&VERSION.to_le_bytes());
        out[8..16].copy_from_slice(&self.acked.to_le_bytes());
        out[16..24].copy_from_slice(&self.next_floor.to_le_bytes());
        let crc = crc32c::crc32c(&out[..24]);
        out[24..].copy_from_slice(&crc.to_le_bytes());
        out
    }

    fn decode(bytes: &[u8]) -> Result<Cursor, String> {
        if bytes.len() != LEN {
            return Err(format!("{} bytes, expected {LEN}", bytes.len()));
        }
        let word = |at: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&bytes[at..at + 8]);
            u64::from_le_bytes(w)
        };
        let crc = u32::from_le_bytes([bytes[24], bytes[25], bytes[26], bytes[27]]);
        if bytes[..4] != MAGIC {
            return Err("bad magic".to_owned());
        }
        if crc32c::crc32c(&bytes[..24]) != crc {
            return Err("bad checksum".to_owned());
        }
        let version = u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]);
        if version != VERSION {
            return Err(format!("unknown version {version}"));
        }
        let cursor = Cursor { acked: word(8), next_floor: word(16) };
        if cursor.acked >= MAX_SEQ || cursor.next_floor > MAX_SEQ {
            return Err("sequence numbers out of range".to_owned());
        }
        Ok(cursor)
    }
}

/// Reads the cursor in `dir`: `Ok(None)` when there is none, `Err(reason)`
/// when it exists but cannot be trusted.
pub(crate) fn load(dir: &Path) -> Result<Option<Cursor>, String> {
    let path = dir.join(FILE);
    let file = match File::open(&path) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("open {}: {e}", path.display())),
    };
    let mut bytes = Vec::with_capacity(LEN);
    file.take(LEN as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("read {}: {e}", path.display()))?;
    Cursor::decode(&bytes).map(Some).map_err(|reason| format!("{}: {reason}", path.display()))
}

/// Replaces the cursor in `dir` atomically and durably.
pub(crate) fn store(dir: &Path, cursor: &Cursor) -> io::Result<()> {
    crate::durable::replace(&dir.join(TMP_FILE), &dir.join(FILE), &cursor.encode())
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;

    #[test]
    fn round_trip_and_garbage() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(load(dir.path()), Ok(None));
        let cursor = Cursor { acked: 41, next_floor: 100 };
        store(dir.path(), &cursor).unwrap();
        assert_eq!(load(dir.path()), Ok(Some(cursor)));
        assert!(!dir.path().join(TMP_FILE).exists());

        let mut bytes = fs::read(dir.path().join(FILE)).unwrap();
        bytes[9] ^= 1;
        fs::write(dir.path().join(FILE), &bytes).unwrap();
        assert!(load(dir.path()).unwrap_err().contains("bad checksum"));

        fs::write(dir.path().join(FILE), b"garbage").unwrap();
        assert!(load(dir.path()).unwrap_err().contains("7 bytes"));
    }

    #[test]
    fn known_bytes() {
        let bytes = Cursor { acked: 1, next_floor: 2 }.encode();
        assert_eq!(&bytes[..8], b"OGCU\x01\0\0\0");
        assert_eq!(bytes[8], 1);
        assert_eq!(bytes[16], 2);
    }
}
