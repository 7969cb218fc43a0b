//! The payload of a [`Kind::Reading`](crate::Kind::Reading): one event the
//! device observed, in a compact binary form a microcontroller writes
//! without allocating.
//!
//! | bytes | field |
//! | --- | --- |
//! | 1 | flags: bit 0 set when a timestamp follows |
//! | 8 | the device's time, ms since the Unix epoch, `i64` LE (if flagged) |
//! | 1 + n | event name: length, then 1 to 100 bytes of UTF-8 |
//! | 1 | number of fields, at most [`MAX_FIELDS`] |
//! | per field | key (length, then 1 to 64 bytes of UTF-8), a type byte, the value |
//!
//! Value types: 0 `false`, 1 `true` (no value bytes), 2 an `i64` LE,
//! 3 an `f64` LE (finite), 4 text (length, then up to 255 bytes of UTF-8).

use crate::Error;
use crate::frame::FrameWriter;

/// Most fields in one reading.
pub const MAX_FIELDS: usize = 32;
const MAX_EVENT: usize = 100;
const MAX_KEY: usize = 64;

/// A field's value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Value<'a> {
    Bool(bool),
    Int(i64),
    Float(f64),
    Text(&'a str),
}

/// One reading, as the firmware builds it (borrowed, so it lives on the
/// stack) and as the host reads it back.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Reading<'a> {
    /// The event name, e.g. `temperature.measured`.
    pub event: &'a str,
    /// The device's clock, if it has one worth sending.
    pub timestamp_ms: Option<i64>,
    pub fields: Fields<'a>,
}

/// The fields of a reading: a slice the firmware gives, or the checked
/// bytes of a received payload.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Fields<'a> {
    Given(&'a [(&'a str, Value<'a>)]),
    Received { count: u8, bytes: &'a [u8] },
}

impl<'a> Fields<'a> {
    /// Every `(key, value)` in order.
    pub fn iter(&self) -> FieldIter<'a> {
        match *self {
            Fields::Given(slice) => FieldIter::Given(slice.iter()),
            Fields::Received { count, bytes } => FieldIter::Received { left: count, bytes },
        }
    }

    pub fn len(&self) -> usize {
        match *self {
            Fields::Given(slice) => slice.len(),
            Fields::Received { count, .. } => usize::from(count),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

pub enum FieldIter<'a> {
    Given(core::slice::Iter<'a, (&'a str, Value<'a>)>),
    Received { left: u8, bytes: &'a [u8] },
}

impl<'a> Iterator for FieldIter<'a> {
    type Item = (&'a str, Value<'a>);

    fn next(&mut self) -> Option<Self::Item> {
        match self {
            FieldIter::Given(it) => it.next().copied(),
            FieldIter::Received { left, bytes } => {
                if *left == 0 {
                    return None;
                }
                // Checked when received: a failure here cannot happen, and
                // would end the fields rather than panic.
                let mut cursor = Cursor(bytes);
                let field = read_field(&mut cursor).ok()?;
                *bytes = cursor.0;
                *left -= 1;
                Some(field)
            }
        }
    }
}

impl<'a> Reading<'a> {
    /// Writes the reading as the payload of `frame`.
    pub fn write(&self, frame: &mut FrameWriter<'_>) -> Result<(), Error> {
        check_text(self.event, MAX_EVENT, "the event name must be 1 to 100 bytes")?;
        if self.fields.len() > MAX_FIELDS {
            return Err(Error::Payload("a reading has at most 32 fields"));
        }
        match self.timestamp_ms {
            Some(ts) => {
                frame.put(&[1])?;
                frame.put(&ts.to_le_bytes())?;
            }
            None => frame.put(&[0])?,
        }
        put_text(frame, self.event)?;
        frame.put(&[self.fields.len() as u8])?;
        for (key, value) in self.fields.iter() {
            check_text(key, MAX_KEY, "a field key must be 1 to 64 bytes")?;
            put_text(frame, key)?;
            match value {
                Value::Bool(b) => frame.put(&[u8::from(b)])?,
                Value::Int(i) => {
                    frame.put(&[2])?;
                    frame.put(&i.to_le_bytes())?;
                }
                Value::Float(f) if f.is_finite() => {
                    frame.put(&[3])?;
                    frame.put(&f.to_le_bytes())?;
                }
                Value::Float(_) => return Err(Error::Payload("a float field must be finite")),
                Value::Text(t) => {
                    if t.len() > 255 {
                        return Err(Error::Payload("a text field is at most 255 bytes"));
                    }
                    frame.put(&[4])?;
                    put_text(frame, t)?;
                }
            }
        }
        Ok(())
    }

    /// Reads a received payload, checking all of it: a reading that
    /// parses has only well-formed fields.
    pub fn parse(payload: &'a [u8]) -> Result<Reading<'a>, Error> {
        let mut cursor = Cursor(payload);
        let timestamp_ms = match cursor.byte()? {
            0 => None,
            1 => Some(i64::from_le_bytes(cursor.array()?)),
            _ => return Err(Error::Payload("unknown reading flags")),
        };
        let event = cursor.text()?;
        check_text(event, MAX_EVENT, "the event name must be 1 to 100 bytes")?;
        let count = cursor.byte()?;
        if usize::from(count) > MAX_FIELDS {
            return Err(Error::Payload("a reading has at most 32 fields"));
        }
        let fields = cursor.0;
        for _ in 0..count {
            read_field(&mut cursor)?;
        }
        if !cursor.0.is_empty() {
            return Err(Error::Payload("bytes after the last field"));
        }
        Ok(Reading { event, timestamp_ms, fields: Fields::Received { count, bytes: fields } })
    }
}

fn check_text(text: &str, max: usize, problem: &'static str) -> Result<(), Error> {
    if text.is_empty() || text.len() > max { Err(Error::Payload(problem)) } else { Ok(()) }
}

fn put_text(frame: &mut FrameWriter<'_>, text: &str) -> Result<(), Error> {
    let len = u8::try_from(text.len()).map_err(|_| Error::Payload("text longer than 255 bytes"))?;
    frame.put(&[len])?;
    frame.put(text.as_bytes())
}

fn read_field<'a>(cursor: &mut Cursor<'a>) -> Result<(&'a str, Value<'a>), Error> {
    let key = cursor.text()?;
    check_text(key, MAX_KEY, "a field key must be 1 to 64 bytes")?;
    let value = match cursor.byte()? {
        0 => Value::Bool(false),
        1 => Value::Bool(true),
        2 => Value::Int(i64::from_le_bytes(cursor.array()?)),
        3 => {
            let f = f64::from_le_bytes(cursor.array()?);
            if !f.is_finite() {
                return Err(Error::Payload("a float field must be finite"));
            }
            Value::Float(f)
        }
        4 => Value::Text(cursor.text()?),
        _ => return Err(Error::Payload("unknown field type")),
    };
    Ok((key, value))
}

/// What is left of a payload being read.
struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], Error> {
        if self.0.len() < n {
            return Err(Error::Payload("the reading ends early"));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn byte(&mut self) -> Result<u8, Error> {
        Ok(self.take(1)?[0])
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], Error> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    fn text(&mut self) -> Result<&'a str, Error> {
        let len = usize::from(self.byte()?);
        core::str::from_utf8(self.take(len)?).map_err(|_| Error::Payload("text is not UTF-8"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{Decoder, Kind, MAX_ENCODED};

    /// Frames `reading` and reads it back, as the host would.
    fn round_trip(reading: &Reading<'_>, check: impl FnOnce(Result<Reading<'_>, Error>)) {
        let mut out = [0u8; MAX_ENCODED];
        let mut writer = FrameWriter::new(&mut out, Kind::Reading, 3).unwrap();
        reading.write(&mut writer).unwrap();
        let n = writer.finish().unwrap();
        let mut decoder = Decoder::<MAX_ENCODED>::new();
        let mut check = Some(check);
        decoder.feed(&out[..n], |frame| {
            let frame = frame.unwrap();
            assert_eq!((frame.kind, frame.seq), (Kind::Reading, 3));
            if let Some(check) = check.take() {
                check(Reading::parse(frame.payload));
            }
        });
        assert!(check.is_none(), "no frame came out");
    }

    #[test]
    fn a_reading_comes_back_as_written() {
        let fields = [
            ("celsius", Value::Float(21.5)),
            ("raw", Value::Int(-4096)),
            ("door_open", Value::Bool(true)),
            ("zone", Value::Text("cold-store-2")),
        ];
        let reading = Reading {
            event: "temperature.measured",
            timestamp_ms: Some(1_795_000_000_123),
            fields: Fields::Given(&fields),
        };
        round_trip(&reading, |parsed| {
            let parsed = parsed.unwrap();
            assert_eq!(parsed.event, "temperature.measured");
            assert_eq!(parsed.timestamp_ms, Some(1_795_000_000_123));
            assert!(parsed.fields.iter().eq(fields.iter().copied()));
        });
    }

    #[test]
    fn known_payload_bytes() {
        let fields = [("on", Value::Bool(true))];
        let reading = Reading { event: "a.b", timestamp_ms: None, fields: Fields::Given(&fields) };
        let mut out = [0u8; MAX_ENCODED];
        let mut writer = FrameWriter::new(&mut out, Kind::Reading, 1).unwrap();
        reading.write(&mut writer).unwrap();
        let n = writer.finish().unwrap();
        let mut payload = Vec::new();
        Decoder::<MAX_ENCODED>::new().feed(&out[..n], |f| payload = f.unwrap().payload.to_vec());
        assert_eq!(payload, [0, 3, b'a', b'.', b'b', 1, 2, b'o', b'n', 1]);
    }

    #[test]
    fn malformed_payloads_are_refused() {
        let cases: [&[u8]; 9] = [
            &[],
            &[2, 1, b'a', 0],                   // unknown flags
            &[1, 0, 0],                         // timestamp cut short
            &[0, 0, 0],                         // empty event name
            &[0, 1, 0xFF, 0],                   // event name not UTF-8
            &[0, 1, b'a', 1, 1, b'k', 9],       // unknown field type
            &[0, 1, b'a', 1, 1, b'k', 2, 1, 2], // integer cut short
            &[0, 1, b'a', 0, 7],                // trailing bytes
            &[0, 1, b'a', 33],                  // too many fields
        ];
        for payload in cases {
            assert!(Reading::parse(payload).is_err(), "{payload:?}");
        }
        let mut nan = vec![0, 1, b'a', 1, 1, b'k', 3];
        nan.extend_from_slice(&f64::NAN.to_le_bytes());
        assert!(Reading::parse(&nan).is_err());
    }

    #[test]
    fn a_reading_too_big_for_a_frame_is_refused_when_written() {
        let long = "x".repeat(255);
        let fields: Vec<(&str, Value<'_>)> =
            (0..3).map(|_| ("k", Value::Text(long.as_str()))).collect();
        let reading = Reading { event: "e", timestamp_ms: None, fields: Fields::Given(&fields) };
        let mut out = [0u8; MAX_ENCODED];
        let mut writer = FrameWriter::new(&mut out, Kind::Reading, 1).unwrap();
        assert_eq!(reading.write(&mut writer), Err(Error::TooLong));
        let mut writer = FrameWriter::new(&mut out, Kind::Reading, 1).unwrap();
        let bad = [("k", Value::Float(f64::INFINITY))];
        let reading = Reading { event: "e", timestamp_ms: None, fields: Fields::Given(&bad) };
        assert!(reading.write(&mut writer).is_err());
    }
}
