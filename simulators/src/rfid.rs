//! RFID readers publishing tag reads over MQTT (`opgraph-sim rfid`).
//!
//! [`plan`] is I/O-free and deterministic for a seed: tags move through
//! reader portals and are read several times per pass (as real readers
//! report a tag in the field), each read one JSON message on
//! `readers/<reader>/tags`:
//!
//! ```json
//! {"epc": "E280...", "antenna": 2, "rssi": -57, "ts": 1795000000123, "seq": 17}
//! ```
//!
//! `seq` numbers the valid reads from 0. On request some messages are
//! malformed JSON (never a valid read) and some readers' clocks are off.
//! [`cli`] publishes the plan with QoS 1 and prints a summary of exactly
//! what it sent.

pub mod cli;

use std::collections::BTreeMap;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;

/// What to simulate.
#[derive(Debug, Clone, PartialEq)]
pub struct RfidConfig {
    pub seed: u64,
    /// Readers `r0`, `r1`, ...
    pub readers: usize,
    /// Distinct tags.
    pub tags: usize,
    /// Valid reads in total.
    pub reads: usize,
    /// Malformed messages mixed in, beyond `reads`.
    pub malformed: usize,
    /// The last `skewed_readers` readers report times off by `skew`.
    pub skewed_readers: usize,
    pub skew: Duration,
    /// Topic with `{reader}` for the reader id.
    pub topic: String,
}

impl Default for RfidConfig {
    fn default() -> Self {
        RfidConfig {
            seed: 1,
            readers: 3,
            tags: 20,
            reads: 100,
            malformed: 0,
            skewed_readers: 0,
            skew: Duration::from_secs(3600),
            topic: "readers/{reader}/tags".to_owned(),
        }
    }
}

impl RfidConfig {
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if self.readers == 0 || self.readers > 100_000 {
            problems.push("readers: must be 1 to 100000".to_owned());
        }
        if self.tags == 0 || self.tags > 1_000_000 {
            problems.push("tags: must be 1 to 1000000".to_owned());
        }
        if self.reads > 10_000_000 || self.malformed > 10_000_000 {
            problems.push("reads, malformed: at most 10000000 each".to_owned());
        }
        if self.skewed_readers > self.readers {
            problems.push("skewed-readers: at most readers".to_owned());
        }
        if !self.topic.contains("{reader}") {
            problems.push("topic: must contain {reader}".to_owned());
        }
        problems
    }
}

/// One message to publish.
#[derive(Debug, Clone, PartialEq)]
pub struct RfidMessage {
    pub reader: String,
    pub topic: String,
    pub payload: Vec<u8>,
    /// `None` for a malformed message.
    pub read: Option<TagRead>,
}

/// A valid read, as sent.
#[derive(Debug, Clone, PartialEq)]
pub struct TagRead {
    pub seq: u64,
    pub epc: String,
    pub antenna: u8,
    pub rssi: i32,
    pub ts: i64,
    /// The reader's clock is off by the configured skew.
    pub skewed: bool,
}

/// The messages for `config`; device times end at `start_ms` (the CLI
/// stamps each read with its send time instead, see [`RfidMessage::stamp`]).
pub fn plan(config: &RfidConfig, start_ms: i64) -> Vec<RfidMessage> {
    let mut rng = StdRng::seed_from_u64(config.seed);
    let epcs: Vec<String> = (0..config.tags)
        .map(|_| {
            let bytes: [u8; 10] = rng.random();
            let hex: String = bytes.iter().map(|b| format!("{b:02X}")).collect();
            format!("E280{hex}")
        })
        .collect();
    let skew_ms = i64::try_from(config.skew.as_millis()).unwrap_or(i64::MAX);
    let mut reads = Vec::with_capacity(config.reads);
    let mut now = start_ms;
    while reads.len() < config.reads {
        // One tag passes one reader's portal: 1 to 6 reads a few ms apart,
        // on one or two antennas, RSSI rising then falling.
        let reader = rng.random_range(0..config.readers);
        let tag = rng.random_range(0..config.tags);
        let repeats = rng.random_range(1..=6usize).min(config.reads - reads.len());
        let antenna = rng.random_range(1..=4u8);
        let peak = rng.random_range(-65..=-40i32);
        for i in 0..repeats {
            now += rng.random_range(5..=50i64);
            let distance = i32::try_from(i.abs_diff(repeats / 2)).unwrap_or(0);
            let skewed = reader >= config.readers - config.skewed_readers;
            let read = TagRead {
                seq: reads.len() as u64,
                epc: epcs[tag].clone(),
                antenna: if i % 3 == 2 { antenna % 4 + 1 } else { antenna },
                rssi: peak - 4 * distance - rng.random_range(0..=2),
                ts: if skewed { now.saturating_sub(skew_ms) } else { now },
                skewed,
            };
            reads.push((reader, read));
        }
    }
    // Reads happened up to `start_ms`: no device time lies in the future.
    let span = now - start_ms;
    let mut messages: Vec<RfidMessage> = reads
        .into_iter()
        .map(|(reader, mut read)| {
            read.ts -= span;
            let reader = format!("r{reader}");
            RfidMessage {
                topic: config.topic.replace("{reader}", &reader),
                reader,
                payload: read.payload(),
                read: Some(read),
            }
        })
        .collect();
    const BROKEN: [&[u8]; 5] = [
        br#"{"epc": "E2801160600002"#,
        b"not json at all",
        br#"{"epc": "E280", "rssi": -50,}"#,
        b"\xff\xfe\x00garbage",
        b"",
    ];
    for i in 0..config.malformed {
        let reader = format!("r{}", rng.random_range(0..config.readers));
        let at = rng.random_range(0..=messages.len());
        messages.insert(
            at,
            RfidMessage {
                topic: config.topic.replace("{reader}", &reader),
                reader,
                payload: BROKEN[i % BROKEN.len()].to_vec(),
                read: None,
            },
        );
    }
    messages
}

impl RfidMessage {
    /// Sets a read's device time to `now_ms` (minus `skew_ms` for a wrong
    /// clock) and renders its payload again; malformed messages stay.
    pub fn stamp(&mut self, now_ms: i64, skew_ms: i64) {
        if let Some(read) = &mut self.read {
            read.ts = if read.skewed { now_ms.saturating_sub(skew_ms) } else { now_ms };
            self.payload = read.payload();
        }
    }
}

impl TagRead {
    /// The JSON payload of this read.
    pub fn payload(&self) -> Vec<u8> {
        json!({
            "epc": self.epc, "antenna": self.antenna, "rssi": self.rssi,
            "ts": self.ts, "seq": self.seq,
        })
        .to_string()
        .into_bytes()
    }
}

/// Counts of a plan: the summary's numbers.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RfidSummary {
    pub sent: usize,
    pub valid: usize,
    pub malformed: usize,
    pub skewed: usize,
    /// Valid reads per reader.
    pub per_reader: BTreeMap<String, usize>,
    /// Valid reads per tag.
    pub per_tag: BTreeMap<String, usize>,
}

impl RfidSummary {
    pub fn of(messages: &[RfidMessage]) -> Self {
        let mut s = RfidSummary { sent: messages.len(), ..Default::default() };
        for m in messages {
            match &m.read {
                Some(read) => {
                    s.valid += 1;
                    s.skewed += usize::from(read.skewed);
                    *s.per_reader.entry(m.reader.clone()).or_default() += 1;
                    *s.per_tag.entry(read.epc.clone()).or_default() += 1;
                }
                None => s.malformed += 1,
            }
        }
        s
    }

    /// One JSON object.
    pub fn to_json(&self) -> serde_json::Value {
        json!({
            "sent": self.sent, "valid": self.valid, "malformed": self.malformed,
            "skewed": self.skewed, "per_reader": self.per_reader, "per_tag": self.per_tag,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_are_deterministic_and_count_what_they_hold() {
        let config =
            RfidConfig { reads: 50, malformed: 7, skewed_readers: 1, ..Default::default() };
        let a = plan(&config, 1_795_000_000_000);
        assert_eq!(a, plan(&config, 1_795_000_000_000));
        assert_ne!(a, plan(&RfidConfig { seed: 2, ..config.clone() }, 1_795_000_000_000));
        let summary = RfidSummary::of(&a);
        assert_eq!((summary.sent, summary.valid, summary.malformed), (57, 50, 7));
        assert_eq!(summary.per_reader.values().sum::<usize>(), 50);
        assert!(summary.per_tag.len() <= 20);
        let seqs: Vec<u64> = a.iter().filter_map(|m| m.read.as_ref().map(|r| r.seq)).collect();
        assert_eq!(seqs, (0..50).collect::<Vec<_>>());
        for m in &a {
            let parsed = serde_json::from_slice::<serde_json::Value>(&m.payload);
            assert_eq!(
                parsed.is_ok(),
                m.read.is_some(),
                "{:?}",
                String::from_utf8_lossy(&m.payload)
            );
            assert_eq!(m.topic, format!("readers/{}/tags", m.reader));
        }
        let skewed: Vec<&TagRead> =
            a.iter().filter_map(|m| m.read.as_ref()).filter(|r| r.skewed).collect();
        assert_eq!(skewed.len(), summary.skewed);
        assert!(skewed.iter().all(|r| r.ts < 1_795_000_000_000 - 3_000_000));
        let last =
            a.iter().filter_map(|m| m.read.as_ref()).filter(|r| !r.skewed).map(|r| r.ts).max();
        assert!(last.is_some_and(|t| t <= 1_795_000_000_000));
    }
}
