//! The host's side of a line, free of I/O: frames in; readings to store,
//! rejections to count and frames to answer out. The gateway's `firmware`
//! source and the bridge binary both run it.
//!
//! Readings are taken in order. A duplicate (a resend after a lost ack) is
//! acknowledged again and not taken again; a gap (a frame lost to noise)
//! is dropped, and the ack tells the device where to resume. The caller
//! stores what a [`Step`] took, then calls [`Session::stored`] for the
//! answer: an ack never covers a reading before it is stored. Each reading
//! becomes a canonical event whose `messageId` is
//! `fw:<device>:<boot>:<seq>`, so even a resend the host cannot recognise
//! (it restarted between storing and acknowledging) is stored once by the
//! cloud.

use serde_json::{Map, Value, json};

use crate::frame::{self, MAX_ENCODED, parse_hello};
use crate::{Decoder, Error, Frame, Kind, Reading, Value as FieldValue};

/// The device on the line, once it said hello.
#[derive(Debug, Clone, PartialEq)]
struct Device {
    id: String,
    boot: u32,
    /// Readings of this boot stored (or refused for good): what the last
    /// ack said.
    stored: u32,
}

/// One line's protocol state. It outlives a reopened port: the device may
/// still be in the same boot.
#[derive(Debug)]
pub struct Session {
    device_type: String,
    device: Option<Device>,
    /// Readings taken, stored or not yet.
    taken: u32,
    decoder: Decoder<MAX_ENCODED>,
}

/// A reading as a canonical event envelope, and the device's clock.
#[derive(Debug, Clone, PartialEq)]
pub struct Taken {
    pub envelope: Map<String, Value>,
    pub device_time_ms: Option<i64>,
}

/// What one chunk of bytes from the line asks for.
#[derive(Debug, Default)]
pub struct Step {
    /// To store, in order, before [`Session::stored`].
    pub readings: Vec<Taken>,
    /// `(reason, detail)` of everything refused: counted, logged, and for
    /// a reading that can never be taken (a bad payload) acknowledged.
    pub rejected: Vec<(&'static str, String)>,
    ack: bool,
    hello_request: bool,
}

impl Session {
    /// A session whose events have actors of type `device_type`.
    pub fn new(device_type: &str) -> Session {
        Session {
            device_type: device_type.to_owned(),
            device: None,
            taken: 0,
            decoder: Decoder::new(),
        }
    }

    /// A new port: whatever half frame the old one left is dropped.
    pub fn reopened(&mut self) {
        self.decoder = Decoder::new();
    }

    /// Takes in bytes from the line.
    pub fn feed(&mut self, bytes: &[u8]) -> Step {
        let mut step = Step::default();
        let Session { device_type, device, taken, decoder } = self;
        decoder.feed(bytes, |frame| on_frame(device, taken, device_type, frame, &mut step));
        step
    }

    /// `step`'s readings are stored: the frames to answer with.
    pub fn stored(&mut self, step: &Step) -> Vec<u8> {
        let mut answer = Vec::new();
        let mut out = [0u8; MAX_ENCODED];
        if step.hello_request
            && let Ok(n) = frame::encode(Kind::HelloRequest, 0, &[], &mut out)
        {
            answer.extend_from_slice(&out[..n]);
        }
        if let Some(device) = &mut self.device {
            device.stored = self.taken;
            if step.ack
                && let Ok(n) =
                    frame::encode(Kind::Ack, device.stored, &device.boot.to_le_bytes(), &mut out)
            {
                answer.extend_from_slice(&out[..n]);
            }
        }
        answer
    }

    /// Storing `step`'s readings failed: they are forgotten, not
    /// acknowledged, and taken again when the device resends them.
    pub fn not_stored(&mut self) {
        if let Some(device) = &self.device {
            self.taken = device.stored;
        }
    }
}

fn on_frame(
    device: &mut Option<Device>,
    taken: &mut u32,
    device_type: &str,
    frame: Result<Frame<'_>, Error>,
    step: &mut Step,
) {
    let frame = match frame {
        Ok(frame) => frame,
        Err(e) => {
            step.rejected.push((e.reason(), e.to_string()));
            return;
        }
    };
    match frame.kind {
        Kind::Hello => match parse_hello(frame.payload) {
            Ok(hello) => {
                let known = device
                    .as_ref()
                    .is_some_and(|d| d.boot == hello.boot && d.id == hello.device_id);
                if !known {
                    // A new boot, or a host that restarted: resume where the
                    // device says its acks reached (0 at boot).
                    let stored = hello.acked;
                    *device =
                        Some(Device { id: hello.device_id.to_owned(), boot: hello.boot, stored });
                    *taken = stored;
                }
                step.ack = true;
            }
            Err(e) => step.rejected.push((e.reason(), e.to_string())),
        },
        Kind::Reading => {
            let Some(device) = device.as_ref() else {
                step.rejected.push(("no_hello", "a reading before any hello".to_owned()));
                step.hello_request = true;
                return;
            };
            step.ack = true;
            if frame.seq <= *taken {
                return; // a resend: its ack was lost or is on its way
            }
            if frame.seq != *taken + 1 {
                step.rejected.push(("gap", format!("reading {} after {}", frame.seq, taken)));
                return;
            }
            *taken = frame.seq;
            match Reading::parse(frame.payload) {
                Ok(reading) => step.readings.push(event(&reading, device, frame.seq, device_type)),
                // Taken all the same: resent, it would never parse.
                Err(e) => step.rejected.push((e.reason(), e.to_string())),
            }
        }
        Kind::Ack | Kind::HelloRequest => {
            step.rejected.push(("unexpected_kind", format!("{:?} from the device", frame.kind)));
        }
    }
}

/// A reading as a canonical event: its fields are the properties, beside
/// the boot id and the reading's number.
fn event(reading: &Reading<'_>, device: &Device, seq: u32, device_type: &str) -> Taken {
    let mut properties = Map::new();
    for (key, value) in reading.fields.iter() {
        let value = match value {
            FieldValue::Bool(b) => Value::from(b),
            FieldValue::Int(i) => Value::from(i),
            FieldValue::Float(f) => Value::from(f),
            FieldValue::Text(t) => Value::from(t),
        };
        properties.insert(key.to_owned(), value);
    }
    properties.insert("bootId".to_owned(), Value::from(device.boot));
    properties.insert("readingSeq".to_owned(), Value::from(seq));
    let mut envelope = Map::new();
    envelope.insert("event".to_owned(), Value::from(reading.event));
    envelope.insert("actor".to_owned(), json!({"type": device_type, "id": device.id}));
    envelope.insert("properties".to_owned(), Value::Object(properties));
    envelope.insert(
        "messageId".to_owned(),
        Value::from(format!("fw:{}:{:08x}:{seq}", device.id, device.boot)),
    );
    Taken { envelope, device_time_ms: reading.timestamp_ms }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Fields, FrameWriter};

    fn hello(boot: u32, id: &str) -> Vec<u8> {
        hello_at(boot, 0, id)
    }

    fn hello_at(boot: u32, acked: u32, id: &str) -> Vec<u8> {
        let mut payload = [0u8; 80];
        let hello = frame::Hello { boot, acked, device_id: id };
        let payload = frame::hello_payload(&hello, &mut payload).unwrap();
        let mut out = [0u8; MAX_ENCODED];
        let n = frame::encode(Kind::Hello, 0, payload, &mut out).unwrap();
        out[..n].to_vec()
    }

    fn reading(seq: u32, celsius: f64) -> Vec<u8> {
        let fields = [("celsius", FieldValue::Float(celsius)), ("zone", FieldValue::Text("z1"))];
        let reading = Reading {
            event: "temperature.measured",
            timestamp_ms: Some(1_795_000_000_000),
            fields: Fields::Given(&fields),
        };
        let mut out = [0u8; MAX_ENCODED];
        let mut writer = FrameWriter::new(&mut out, Kind::Reading, seq).unwrap();
        reading.write(&mut writer).unwrap();
        let n = writer.finish().unwrap();
        out[..n].to_vec()
    }

    /// The frames of an answer: `(kind, seq)` each.
    fn answered(bytes: &[u8]) -> Vec<(Kind, u32)> {
        let mut frames = Vec::new();
        Decoder::<MAX_ENCODED>::new().feed(bytes, |f| {
            let f = f.unwrap();
            frames.push((f.kind, f.seq));
        });
        frames
    }

    /// Feeds `bytes` and stores what they took: the step and the answer.
    fn feed(session: &mut Session, bytes: &[u8]) -> (Step, Vec<(Kind, u32)>) {
        let step = session.feed(bytes);
        let answer = session.stored(&step);
        (step, answered(&answer))
    }

    #[test]
    fn readings_in_order_become_events_acked_cumulatively() {
        let mut session = Session::new("sensor");
        let bytes = [hello(7, "press-1"), reading(1, 20.5), reading(2, 21.0)].concat();
        let (step, answer) = feed(&mut session, &bytes);
        assert_eq!(answer, [(Kind::Ack, 2)]);
        assert!(step.rejected.is_empty(), "{:?}", step.rejected);
        let e = &step.readings[1].envelope;
        assert_eq!(e["event"], "temperature.measured");
        assert_eq!(e["actor"], json!({"type": "sensor", "id": "press-1"}));
        assert_eq!(e["messageId"], "fw:press-1:00000007:2");
        assert_eq!(e["properties"]["celsius"], 21.0);
        assert_eq!(e["properties"]["zone"], "z1");
        assert_eq!(e["properties"]["readingSeq"], 2);
        assert_eq!(step.readings[1].device_time_ms, Some(1_795_000_000_000));
    }

    #[test]
    fn resends_are_acked_not_taken_and_gaps_wait_for_the_missing_reading() {
        let mut session = Session::new("sensor");
        feed(&mut session, &[hello(7, "press-1"), reading(1, 1.0)].concat());
        // Reading 2 was lost on the line: 3 is a gap; 1 again is a resend.
        let (step, answer) = feed(&mut session, &[reading(3, 3.0), reading(1, 1.0)].concat());
        assert!(step.readings.is_empty());
        assert_eq!(answer, [(Kind::Ack, 1)], "the device learns where to resume");
        assert_eq!(step.rejected[0].0, "gap");
        let (step, answer) = feed(&mut session, &[reading(2, 2.0), reading(3, 3.0)].concat());
        assert_eq!(step.readings.len(), 2);
        assert_eq!(answer, [(Kind::Ack, 3)]);
        // The same hello again (the device timed out) keeps the state.
        let (step, answer) = feed(&mut session, &[hello(7, "press-1"), reading(3, 3.0)].concat());
        assert!(step.readings.is_empty());
        assert_eq!(answer, [(Kind::Ack, 3)]);
        // A new boot counts from 1 again.
        let (step, answer) = feed(&mut session, &[hello(8, "press-1"), reading(1, 9.0)].concat());
        assert_eq!(step.readings.len(), 1);
        assert_eq!(answer, [(Kind::Ack, 1)]);
        assert_eq!(step.readings[0].envelope["messageId"], "fw:press-1:00000008:1");
    }

    #[test]
    fn readings_not_stored_are_not_acked_and_are_taken_again() {
        let mut session = Session::new("sensor");
        feed(&mut session, &[hello(1, "d"), reading(1, 1.0)].concat());
        let step = session.feed(&reading(2, 2.0));
        assert_eq!(step.readings.len(), 1);
        session.not_stored();
        let (step, answer) = feed(&mut session, &reading(2, 2.0));
        assert_eq!(step.readings.len(), 1, "taken again, not mistaken for a resend");
        assert_eq!(answer, [(Kind::Ack, 2)]);
    }

    #[test]
    fn readings_before_a_hello_noise_and_bad_payloads_are_counted() {
        let mut session = Session::new("sensor");
        let mut bad = reading(2, 2.0);
        bad[4] ^= 0x08;
        let bytes = [reading(1, 1.0), b"\x01\x02garbage\x00".to_vec(), bad].concat();
        let (step, answer) = feed(&mut session, &bytes);
        assert_eq!(answer, [(Kind::HelloRequest, 0)]);
        let reasons: Vec<&str> = step.rejected.iter().map(|(r, _)| *r).collect();
        assert_eq!(reasons.len(), 3, "{reasons:?}");
        assert_eq!(reasons[0], "no_hello");
        // A reading whose payload does not parse is taken: counted, acked.
        let mut out = [0u8; MAX_ENCODED];
        let n = frame::encode(Kind::Reading, 1, &[9, 9], &mut out).unwrap();
        let (step, answer) = feed(&mut session, &[hello(3, "d"), out[..n].to_vec()].concat());
        assert_eq!(answer, [(Kind::Ack, 1)]);
        assert_eq!(step.rejected[0].0, "bad_payload");
    }

    #[test]
    fn a_restarted_host_resumes_where_the_device_says_its_acks_reached() {
        let mut session = Session::new("sensor");
        // Readings 1 to 40 were acked by the host before this one.
        let (step, answer) = feed(
            &mut session,
            &[hello_at(5, 40, "d"), reading(41, 1.0), reading(42, 2.0)].concat(),
        );
        assert_eq!(step.readings.len(), 2, "{:?}", step.rejected);
        assert_eq!(answer, [(Kind::Ack, 42)]);
    }

    #[test]
    fn a_half_frame_from_an_old_port_is_dropped_on_reopen() {
        let mut session = Session::new("sensor");
        let frame = [hello(1, "d"), reading(1, 1.0)].concat();
        session.feed(&frame[..frame.len() - 3]);
        session.reopened();
        let (step, answer) = feed(&mut session, &frame);
        assert_eq!(step.readings.len(), 1);
        assert!(step.rejected.is_empty(), "{:?}", step.rejected);
        assert_eq!(answer, [(Kind::Ack, 1)]);
    }
}
