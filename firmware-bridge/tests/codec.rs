//! Properties of the codec over generated readings and line damage:
//! whatever is written reads back the same however the bytes are split,
//! garbage before a frame never hides it, and a flipped bit is never
//! taken for a frame. And of the host's session: a device that frames
//! anything at all (any kind, sequence number and payload, with a correct
//! checksum) gets answers and rejections, never a panic.
#![allow(clippy::unwrap_used)]

use opgraph_firmware_bridge::frame::{Hello, MAX_ENCODED, MAX_PAYLOAD, hello_payload};
use opgraph_firmware_bridge::host::Session;
use opgraph_firmware_bridge::{Decoder, Fields, FrameWriter, Kind, Reading, Value};
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Owned {
    Bool(bool),
    Int(i64),
    Float(f64),
    Text(String),
}

impl Owned {
    fn borrowed(&self) -> Value<'_> {
        match self {
            Owned::Bool(b) => Value::Bool(*b),
            Owned::Int(i) => Value::Int(*i),
            Owned::Float(f) => Value::Float(*f),
            Owned::Text(t) => Value::Text(t),
        }
    }
}

fn value() -> impl Strategy<Value = Owned> {
    prop_oneof![
        any::<bool>().prop_map(Owned::Bool),
        any::<i64>().prop_map(Owned::Int),
        any::<f64>().prop_filter("finite", |f| f.is_finite()).prop_map(Owned::Float),
        "[a-zA-Z0-9 °µ._-]{0,40}".prop_map(Owned::Text),
    ]
}

/// A reading that fits in one frame: at most 8 fields of modest size.
fn reading() -> impl Strategy<Value = (String, Option<i64>, Vec<(String, Owned)>)> {
    (
        "[a-z][a-z0-9_.]{0,60}",
        proptest::option::of(any::<i64>()),
        proptest::collection::vec(("[a-z][a-z0-9_]{0,20}", value()), 0..8),
    )
}

fn encode(seq: u32, event: &str, ts: Option<i64>, fields: &[(String, Owned)]) -> Vec<u8> {
    let borrowed: Vec<(&str, Value<'_>)> =
        fields.iter().map(|(k, v)| (k.as_str(), v.borrowed())).collect();
    let reading = Reading { event, timestamp_ms: ts, fields: Fields::Given(&borrowed) };
    let mut out = [0u8; MAX_ENCODED];
    let mut writer = FrameWriter::new(&mut out, Kind::Reading, seq).unwrap();
    reading.write(&mut writer).unwrap();
    let n = writer.finish().unwrap();
    out[..n].to_vec()
}

proptest! {
    #[test]
    fn readings_read_back_however_the_line_splits_them(
        (event, ts, fields) in reading(),
        seq in any::<u32>(),
        cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..6),
    ) {
        let bytes = encode(seq, &event, ts, &fields);
        let mut points: Vec<usize> = cuts.iter().map(|i| i.index(bytes.len())).collect();
        points.sort_unstable();
        let mut decoder = Decoder::<MAX_ENCODED>::new();
        let mut got = Vec::new();
        let mut start = 0;
        for end in points.into_iter().chain([bytes.len()]) {
            decoder.feed(&bytes[start..end], |frame| {
                let frame = frame.unwrap();
                let r = Reading::parse(frame.payload).unwrap();
                let fields: Vec<(String, String)> =
                    r.fields.iter().map(|(k, v)| (k.to_owned(), format!("{v:?}"))).collect();
                got.push((frame.seq, r.event.to_owned(), r.timestamp_ms, fields));
            });
            start = end;
        }
        let expected: Vec<(String, String)> =
            fields.iter().map(|(k, v)| (k.clone(), format!("{:?}", v.borrowed()))).collect();
        prop_assert_eq!(got, vec![(seq, event, ts, expected)]);
    }

    #[test]
    fn garbage_never_hides_the_next_frame(garbage in proptest::collection::vec(any::<u8>(), 0..2000)) {
        let frame = encode(7, "after.noise", None, &[]);
        let mut line = garbage;
        line.push(0);
        line.extend_from_slice(&frame);
        let mut decoder = Decoder::<MAX_ENCODED>::new();
        let mut last = None;
        decoder.feed(&line, |f| last = Some(f.map(|f| f.seq)));
        prop_assert_eq!(last, Some(Ok(7)));
    }

    #[test]
    fn a_flipped_bit_is_never_a_frame(
        (event, ts, fields) in reading(),
        at in any::<prop::sample::Index>(),
        bit in 0u8..8,
    ) {
        let mut bytes = encode(1, &event, ts, &fields);
        // Any byte but the delimiter: flipping that merges two frames,
        // which the next delimiter settles the same way.
        let i = at.index(bytes.len() - 1);
        bytes[i] ^= 1 << bit;
        bytes.push(0);
        let mut decoder = Decoder::<MAX_ENCODED>::new();
        let mut frames = 0;
        decoder.feed(&bytes, |f| if f.is_ok() { frames += 1 });
        prop_assert_eq!(frames, 0);
    }

    #[test]
    fn a_session_takes_whatever_a_device_frames(
        boot in any::<u32>(),
        acked in prop_oneof![Just(0u32), Just(u32::MAX), any::<u32>()],
        device_id in "[^\\x00-\\x1f]{1,16}",
        frames in proptest::collection::vec(
            (
                prop_oneof![Just(Kind::Reading), Just(Kind::Hello), Just(Kind::Ack), Just(Kind::HelloRequest)],
                prop_oneof![Just(0u32), Just(u32::MAX), 1u32..20, any::<u32>()],
                proptest::collection::vec(any::<u8>(), 0..=MAX_PAYLOAD),
            ),
            0..12,
        ),
        cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..6),
    ) {
        // A hello first, so that readings are parsed, not only refused.
        let mut out = [0u8; MAX_ENCODED];
        let mut payload = [0u8; 80];
        let hello = Hello { boot, acked, device_id: &device_id };
        let mut line = Vec::new();
        if let Ok(hello) = hello_payload(&hello, &mut payload) {
            let n = opgraph_firmware_bridge::frame::encode(Kind::Hello, 0, hello, &mut out).unwrap();
            line.extend_from_slice(&out[..n]);
        }
        for (kind, seq, payload) in &frames {
            let n = opgraph_firmware_bridge::frame::encode(*kind, *seq, payload, &mut out).unwrap();
            line.extend_from_slice(&out[..n]);
        }
        let mut points: Vec<usize> = cuts.iter().map(|i| i.index(line.len() + 1)).collect();
        points.sort_unstable();
        let mut session = Session::new("sensor");
        let mut start = 0;
        for end in points.into_iter().chain([line.len()]) {
            // Stored or not, alternately: both paths of the host.
            let step = session.feed(&line[start..end]);
            if end % 2 == 0 {
                session.stored(&step);
            } else {
                session.not_stored();
            }
            start = end;
        }
    }
}
