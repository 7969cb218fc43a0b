//! Serial source: a barcode scanner or an RFID reader on a serial port
//! (tokio-serial; USB adapters and pseudo-terminals alike).
//!
//! `protocol` picks the decoder: `barcode` (CR/LF-terminated lines with
//! optional AIM identifiers and GS1 element strings, [`barcode`]) makes one
//! `barcode.scanned` per valid line; `rfid_line` and `rfid_binary` ([`rfid`])
//! make smoothed `rfid.tag.read` and `rfid.tag.departed` events. What does
//! not decode is counted by reason (`not_text`, `bad_gs1`,
//! `bad_check_digit`, `bad_line`, `bad_frame`, `line_too_long`) and logged;
//! the source carries on. When the port goes away (USB unplugged, the other
//! end of a pty closed) the source reports itself disconnected and reopens
//! the path with capped backoff until it is back.

pub mod barcode;
pub mod rfid;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use rand::SeedableRng;
use rand::rngs::StdRng;
use serde::Deserialize;
use serde_json::{Map, Value, json};
use tokio::io::AsyncReadExt;
use tokio_serial::{DataBits, FlowControl, Parity, SerialPortBuilderExt, StopBits};
use tokio_util::sync::CancellationToken;

use super::mapping::Mapped;
use super::modbus::DeviceRef;
use super::{Intake, Source, SourceHealth, now_ms};
use crate::backoff::Backoff;
use crate::error::Result;
use rfid::{FrameDecoder, Smoothed, Smoother, Visit};

/// Longest line kept; a longer one is garbage (counted, dropped).
const MAX_LINE: usize = 4096;
/// How often smoothing looks at the clock while the line is quiet.
const TICK: Duration = Duration::from_millis(100);

/// One `[[sources.serial]]` table: one port.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SerialSourceConfig {
    /// Name in health, metrics and logs. Required, unique.
    pub name: String,
    /// The device path, e.g. `/dev/ttyUSB0` or `/dev/serial/by-id/...`.
    pub path: PathBuf,
    /// `barcode`, `rfid_line` or `rfid_binary`.
    pub protocol: Protocol,
    /// The event's actor: this scanner or reader.
    pub device: DeviceRef,
    #[serde(default = "default_baud")]
    pub baud: u32,
    /// 5 to 8. Default 8.
    #[serde(default = "default_data_bits")]
    pub data_bits: u8,
    #[serde(default)]
    pub parity: ParityConfig,
    /// 1 or 2. Default 1.
    #[serde(default = "default_stop_bits")]
    pub stop_bits: u8,
    #[serde(default)]
    pub flow_control: FlowConfig,
    /// RFID: how long a tag is in the field before its one read is reported.
    #[serde(default = "default_dwell", with = "humantime_serde")]
    pub dwell: Duration,
    /// RFID: unseen this long, a tag has departed. Default `3s`; at most
    /// `24h`.
    #[serde(default = "default_depart", with = "humantime_serde")]
    pub depart_after: Duration,
    /// Reopen backoff. Defaults `200ms` .. `10s`; each above 0, at most `1h`.
    #[serde(default = "default_backoff_initial", with = "humantime_serde")]
    pub backoff_initial: Duration,
    #[serde(default = "default_backoff_max", with = "humantime_serde")]
    pub backoff_max: Duration,
    /// Reader clocks further off than this are replaced by the receive time
    /// (and counted). Default `5min`.
    #[serde(default = "default_skew", with = "humantime_serde")]
    pub max_clock_skew: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Protocol {
    Barcode,
    RfidLine,
    RfidBinary,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ParityConfig {
    #[default]
    None,
    Odd,
    Even,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FlowConfig {
    #[default]
    None,
    Software,
    Hardware,
}

fn default_baud() -> u32 {
    9600
}
fn default_data_bits() -> u8 {
    8
}
fn default_stop_bits() -> u8 {
    1
}
fn default_dwell() -> Duration {
    Duration::from_secs(1)
}
fn default_depart() -> Duration {
    Duration::from_secs(3)
}
pub(super) fn default_backoff_initial() -> Duration {
    Duration::from_millis(200)
}
pub(super) fn default_backoff_max() -> Duration {
    Duration::from_secs(10)
}
pub(super) fn default_skew() -> Duration {
    Duration::from_secs(300)
}

impl SerialSourceConfig {
    /// Every problem, each with its key path below the table.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = self.port().problems();
        if self.name.trim().is_empty() {
            problems.push("name: required".to_owned());
        }
        if self.dwell >= self.depart_after {
            problems.push("dwell: must be shorter than depart_after".to_owned());
        }
        if self.depart_after > Duration::from_secs(24 * 3600) {
            // Every tag seen stays in memory until it departs.
            problems.push("depart_after: must be at most 24h".to_owned());
        }
        problems.extend(crate::backoff::problems(self.backoff_initial, self.backoff_max));
        problems
    }

    /// The port settings of this table.
    pub fn port(&self) -> PortSettings {
        PortSettings {
            path: self.path.clone(),
            baud: self.baud,
            data_bits: self.data_bits,
            parity: self.parity,
            stop_bits: self.stop_bits,
            flow_control: self.flow_control,
        }
    }
}

/// How to open a serial port: `[[sources.serial]]` has these keys at its
/// top level, a Modbus RTU device under `rtu = { ... }`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PortSettings {
    pub path: PathBuf,
    #[serde(default = "default_baud")]
    pub baud: u32,
    #[serde(default = "default_data_bits")]
    pub data_bits: u8,
    #[serde(default)]
    pub parity: ParityConfig,
    #[serde(default = "default_stop_bits")]
    pub stop_bits: u8,
    #[serde(default)]
    pub flow_control: FlowConfig,
}

impl PortSettings {
    /// Every problem, each with its key.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if self.path.as_os_str().is_empty() {
            problems.push("path: required".to_owned());
        }
        if self.baud == 0 {
            problems.push("baud: must be more than 0".to_owned());
        }
        if !(5..=8).contains(&self.data_bits) {
            problems.push("data_bits: 5, 6, 7 or 8".to_owned());
        }
        if !(1..=2).contains(&self.stop_bits) {
            problems.push("stop_bits: 1 or 2".to_owned());
        }
        problems
    }

    /// Opens the port for async I/O.
    pub fn open(&self) -> tokio_serial::Result<tokio_serial::SerialStream> {
        self.builder().open_native_async()
    }

    fn builder(&self) -> tokio_serial::SerialPortBuilder {
        let data_bits = match self.data_bits {
            5 => DataBits::Five,
            6 => DataBits::Six,
            7 => DataBits::Seven,
            _ => DataBits::Eight,
        };
        let parity = match self.parity {
            ParityConfig::None => Parity::None,
            ParityConfig::Odd => Parity::Odd,
            ParityConfig::Even => Parity::Even,
        };
        let stop_bits = if self.stop_bits == 2 { StopBits::Two } else { StopBits::One };
        let flow = match self.flow_control {
            FlowConfig::None => FlowControl::None,
            FlowConfig::Software => FlowControl::Software,
            FlowConfig::Hardware => FlowControl::Hardware,
        };
        tokio_serial::new(self.path.to_string_lossy(), self.baud)
            .data_bits(data_bits)
            .parity(parity)
            .stop_bits(stop_bits)
            .flow_control(flow)
    }
}

pub struct SerialSource {
    config: SerialSourceConfig,
}

impl SerialSource {
    pub fn new(config: &SerialSourceConfig) -> SerialSource {
        SerialSource { config: config.clone() }
    }
}

/// Turns bytes from the port into events; state survives reopening.
struct Decoder {
    protocol: Protocol,
    line: Vec<u8>,
    /// The current line overflowed: drop until its end.
    skipping: bool,
    frames: FrameDecoder,
    smoother: Smoother,
}

/// What decoding produced: envelopes to append, reasons to count.
#[derive(Default)]
struct Decoded {
    events: Vec<Mapped>,
    rejected: Vec<(&'static str, String)>,
    /// Messages that ended in this push (lines; frames and stretches of
    /// garbage), counted as received.
    messages: u64,
}

impl Decoder {
    fn new(config: &SerialSourceConfig) -> Self {
        let ms = |d: Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
        Decoder {
            protocol: config.protocol,
            line: Vec::new(),
            skipping: false,
            frames: FrameDecoder::default(),
            smoother: Smoother::new(ms(config.dwell), ms(config.depart_after)),
        }
    }

    fn push(&mut self, bytes: &[u8], now: i64, device: &DeviceRef, out: &mut Decoded) {
        if self.protocol == Protocol::RfidBinary {
            for read in self.frames.push(bytes) {
                out.messages += 1;
                match read {
                    Ok(read) => smooth(self.smoother.observe(&read, now), device, out),
                    Err(e) => out.rejected.push((e.reason(), e.to_string())),
                }
            }
            return;
        }
        for &b in bytes {
            if b != b'\r' && b != b'\n' {
                if self.line.len() >= MAX_LINE {
                    if !self.skipping {
                        out.messages += 1;
                        out.rejected.push(("line_too_long", format!("over {MAX_LINE} bytes")));
                    }
                    self.skipping = true;
                    self.line.clear();
                }
                if !self.skipping {
                    self.line.push(b);
                }
                continue;
            }
            self.skipping = false;
            if self.line.is_empty() {
                continue; // the LF of a CR LF, or a blank line
            }
            let line = std::mem::take(&mut self.line);
            out.messages += 1;
            self.line_done(&line, now, device, out);
        }
    }

    fn line_done(&mut self, line: &[u8], now: i64, device: &DeviceRef, out: &mut Decoded) {
        let Ok(text) = std::str::from_utf8(line) else {
            out.rejected.push(("not_text", "not UTF-8".to_owned()));
            return;
        };
        match self.protocol {
            Protocol::Barcode => match barcode::parse(text) {
                Ok(scan) => out.events.push(scanned(&scan, device)),
                Err(e) => out.rejected.push((e.reason(), format!("{e}: {text:?}"))),
            },
            Protocol::RfidLine => match rfid::parse_line(text) {
                Ok(read) => smooth(self.smoother.observe(&read, now), device, out),
                Err(e) => out.rejected.push((e.reason(), format!("{e}: {text:?}"))),
            },
            Protocol::RfidBinary => {}
        }
    }

    /// The port was lost (`when`), or the source stops: a line or frame
    /// begun will never end (the next bytes would come from a replugged
    /// device and be glued to it), so it is dropped and counted as
    /// `cut_off`. Tags in the field stay tracked.
    fn cut(&mut self, when: &str, out: &mut Decoded) {
        let cut = self.line.len() + self.frames.reset();
        if cut > 0 && !self.skipping {
            out.messages += 1;
            out.rejected.push(("cut_off", format!("{cut} bytes of a line or frame {when}")));
        }
        self.line.clear();
        self.skipping = false;
    }

    /// The source stops: reads still waiting for their dwell go out.
    fn stop(&mut self, device: &DeviceRef, out: &mut Decoded) {
        self.cut("at shutdown", out);
        if self.protocol != Protocol::Barcode {
            smooth(self.smoother.stop(), device, out);
        }
    }

    fn tick(&mut self, now: i64, device: &DeviceRef, out: &mut Decoded) {
        if self.protocol != Protocol::Barcode {
            smooth(self.smoother.tick(now), device, out);
        }
    }
}

fn envelope(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(map) => map,
        _ => Map::new(),
    }
}

fn scanned(scan: &barcode::Scan, device: &DeviceRef) -> Mapped {
    let envelope = envelope(json!({
        "event": "barcode.scanned",
        "actor": {"type": device.kind, "id": device.id},
        "trackable": {"kind": "barcode", "code": scan.trackable_code()},
        "properties": scan.properties(),
    }));
    Mapped { envelope, device_time_ms: None }
}

fn smooth(smoothed: Vec<Smoothed>, device: &DeviceRef, out: &mut Decoded) {
    for s in smoothed {
        let (event, visit, read) = match &s {
            Smoothed::Read(v) => ("rfid.tag.read", v, true),
            Smoothed::Departed(v) => ("rfid.tag.departed", v, false),
        };
        let Visit { epc, first_ms, last_ms, count, peak_rssi, antenna, reader_first_ms, .. } =
            visit;
        let mut properties = json!({
            "epc": epc, "firstSeenMs": first_ms, "lastSeenMs": last_ms, "readCount": count,
        });
        if read {
            properties["peakRssi"] = json!(peak_rssi);
            properties["antenna"] = json!(antenna);
        }
        let envelope = envelope(json!({
            "event": event,
            "actor": {"type": device.kind, "id": device.id},
            "object": {"type": "rfid_tag", "id": epc},
            "trackable": {"kind": "rfid_tag", "code": epc},
            "properties": properties,
        }));
        // The read carries the reader's clock of its first sighting; the
        // departure happens on the gateway's clock.
        let device_time_ms = if read { *reader_first_ms } else { None };
        out.events.push(Mapped { envelope, device_time_ms });
    }
}

#[async_trait]
impl Source for SerialSource {
    fn name(&self) -> &str {
        &self.config.name
    }

    fn kind(&self) -> &'static str {
        "serial"
    }

    async fn run(self: Box<Self>, intake: Intake, shutdown: CancellationToken) -> Result<()> {
        let config = self.config;
        let health = Arc::clone(intake.health());
        let mut decoder = Decoder::new(&config);
        let mut backoff = Backoff::new(config.backoff_initial, config.backoff_max);
        let mut buf = vec![0u8; 4096];
        let port_settings = config.port();
        'reopen: loop {
            let Some(mut port) =
                open_port(&port_settings, &config.name, &health, &mut backoff, &shutdown).await
            else {
                break 'reopen;
            };
            let mut ticker = tokio::time::interval(TICK);
            loop {
                let mut decoded = Decoded::default();
                tokio::select! {
                    read = AsyncReadExt::read(&mut port, &mut buf) => match read {
                        Ok(n) if n > 0 => {
                            let now = now_ms();
                            backoff.reset();
                            decoder.push(&buf[..n], now, &config.device, &mut decoded);
                        }
                        // 0 bytes or an error: the port is gone.
                        result => {
                            decoder.cut("when the port was lost", &mut decoded);
                            deliver(&intake, decoded, &config.name).await;
                            if port_lost(&port_settings, &config.name, result, &health, &mut backoff, &shutdown).await {
                                continue 'reopen;
                            }
                            break 'reopen;
                        }
                    },
                    _ = ticker.tick() => decoder.tick(now_ms(), &config.device, &mut decoded),
                    () = shutdown.cancelled() => break 'reopen,
                }
                deliver(&intake, decoded, &config.name).await;
            }
        }
        let mut decoded = Decoded::default();
        decoder.stop(&config.device, &mut decoded);
        deliver(&intake, decoded, &config.name).await;
        health.set_connected(false);
        Ok(())
    }
}

/// Opens `port` for source `name`, its state in `health`, retrying with
/// `backoff` while it cannot be opened (a device not plugged in yet, a
/// pty not made yet): the port, or `None` once `shutdown` is cancelled.
/// An open does not reset `backoff`: the caller does once bytes arrive,
/// so a port that opens and fails at once is retried ever more slowly.
pub(super) async fn open_port(
    port: &PortSettings,
    name: &str,
    health: &SourceHealth,
    backoff: &mut Backoff,
    shutdown: &CancellationToken,
) -> Option<tokio_serial::SerialStream> {
    let mut rng = StdRng::from_os_rng();
    while !shutdown.is_cancelled() {
        match port.open() {
            Ok(stream) => {
                health.set_connected(true);
                tracing::info!(source = %name, path = %port.path.display(), "serial port open");
                return Some(stream);
            }
            Err(e) => {
                health.set_connected(false);
                health.set_error(format!("serial {}: {e}", port.path.display()));
                let delay = backoff.next_delay(&mut rng);
                tokio::select! {
                    () = tokio::time::sleep(delay) => {}
                    () = shutdown.cancelled() => return None,
                }
            }
        }
    }
    None
}

/// Records that `port` of source `name` is gone, as the `read` that
/// found it so (0 bytes, or an error), and waits out the next step of
/// `backoff` before it is reopened: `false` once `shutdown` is cancelled.
/// The step grows while reopened ports bring no bytes (a device that
/// fails as soon as it is opened), so such a port is not retried flat out.
pub(super) async fn port_lost(
    port: &PortSettings,
    name: &str,
    read: std::io::Result<usize>,
    health: &SourceHealth,
    backoff: &mut Backoff,
    shutdown: &CancellationToken,
) -> bool {
    let why = read.err().map_or_else(|| "closed".to_owned(), |e| e.to_string());
    health.set_connected(false);
    health.set_error(format!("serial {}: {why}", port.path.display()));
    let delay = backoff.next_delay(&mut StdRng::from_os_rng());
    tracing::warn!(source = %name, error = %why, retry_in = ?delay, "serial port lost; reopening");
    tokio::select! {
        () = tokio::time::sleep(delay) => true,
        () = shutdown.cancelled() => false,
    }
}

/// Counts what was rejected and appends the events in one durable append.
async fn deliver(intake: &Intake, decoded: Decoded, source: &str) {
    let now = now_ms();
    for _ in 0..decoded.messages {
        intake.health().received(now);
    }
    for (reason, why) in decoded.rejected {
        intake.health().reject(reason, &why, now);
    }
    let records: Vec<Bytes> =
        decoded.events.into_iter().filter_map(|m| intake.prepare(Ok(m), now)).collect();
    if records.is_empty() {
        return;
    }
    let n = records.len() as u64;
    if let Err(e) = intake.append(records).await {
        intake.health().dropped(n);
        tracing::error!(%source, error = %e, events = n, "serial events not buffered");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decoder(protocol: &str) -> (Decoder, DeviceRef) {
        let config: SerialSourceConfig = toml::from_str(&format!(
            "name = \"s\"\npath = \"/dev/ttyUSB0\"\nprotocol = \"{protocol}\"\n\
             device = {{ type = \"scanner\", id = \"s1\" }}\ndwell = \"1h\"\ndepart_after = \"2h\""
        ))
        .unwrap();
        (Decoder::new(&config), config.device.clone())
    }

    /// An unplug in the middle of a line: the next scan, from the replugged
    /// scanner, is itself, not the end of the line before.
    #[test]
    fn a_line_cut_by_the_port_lost_is_not_glued_to_the_next() {
        let (mut decoder, device) = decoder("barcode");
        let mut out = Decoded::default();
        decoder.push(b"PALLET-00", 0, &device, &mut out);
        decoder.cut("when the port was lost", &mut out);
        decoder.push(b"]C10109506000134352\r\n", 1, &device, &mut out);
        assert_eq!(out.messages, 2, "the line cut off, then the scan");
        assert_eq!(out.rejected.len(), 1);
        assert_eq!(out.rejected[0].0, "cut_off");
        assert_eq!(out.events.len(), 1);
        assert_eq!(out.events[0].envelope["trackable"]["code"], "09506000134352");
    }

    /// A tag inside its dwell when the source stops gets its read then.
    #[test]
    fn reads_waiting_for_their_dwell_go_out_when_the_source_stops() {
        let (mut decoder, device) = decoder("rfid_line");
        let mut out = Decoded::default();
        decoder.push(b"3034F87E5C0000400000012A,2,-57.5\n3034", 0, &device, &mut out);
        decoder.tick(1000, &device, &mut out);
        assert!(out.events.is_empty(), "an hour's dwell");
        decoder.stop(&device, &mut out);
        assert_eq!(out.events.len(), 1);
        assert_eq!(out.events[0].envelope["event"], "rfid.tag.read");
        assert_eq!(out.events[0].envelope["properties"]["readCount"], 1);
        assert_eq!(out.rejected.iter().map(|r| r.0).collect::<Vec<_>>(), ["cut_off"]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_port_that_brings_no_bytes_is_reopened_ever_more_slowly() {
        let port: PortSettings = toml::from_str("path = \"/dev/ttyUSB9\"").unwrap();
        let health = SourceHealth::new("s", "serial");
        let mut backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(60));
        let shutdown = CancellationToken::new();
        let mut waits = Vec::new();
        for _ in 0..4 {
            let start = tokio::time::Instant::now();
            let eio = Err(std::io::Error::from_raw_os_error(5));
            assert!(port_lost(&port, "s", eio, &health, &mut backoff, &shutdown).await);
            waits.push(start.elapsed());
        }
        assert!(!health.connected());
        // Steps of 1s, 2s, 4s, 8s, each waited for at least its half.
        for (wait, step) in waits.iter().zip([1u64, 2, 4, 8]) {
            let step = Duration::from_secs(step);
            assert!(*wait >= step / 2 && *wait <= step, "{waits:?}");
        }
        // Bytes read start it over; a shutdown ends the wait.
        backoff.reset();
        let start = tokio::time::Instant::now();
        assert!(port_lost(&port, "s", Ok(0), &health, &mut backoff, &shutdown).await);
        assert!(start.elapsed() <= Duration::from_secs(1));
        shutdown.cancel();
        assert!(!port_lost(&port, "s", Ok(0), &health, &mut backoff, &shutdown).await);
    }

    fn config(protocol: &str) -> SerialSourceConfig {
        toml::from_str(&format!(
            "name = \"s\"\npath = \"/dev/null\"\nprotocol = \"{protocol}\"\n\
             device = {{ type = \"scanner\", id = \"dock-1\" }}\n"
        ))
        .unwrap()
    }

    fn decode(protocol: &str, chunks: &[&[u8]]) -> Decoded {
        let config = config(protocol);
        let mut decoder = Decoder::new(&config);
        let mut out = Decoded::default();
        for chunk in chunks {
            decoder.push(chunk, 1_000, &config.device, &mut out);
        }
        out
    }

    #[test]
    fn barcode_lines_split_on_cr_lf_across_chunks() {
        let out = decode(
            "barcode",
            &[b"]C10109506000134352\r", b"\nPALLET-", b"0042\n\r\n]C10109506000134353\n\xff\xfe\n"],
        );
        let codes: Vec<&Value> =
            out.events.iter().map(|m| &m.envelope["trackable"]["code"]).collect();
        assert_eq!(codes, [&json!("09506000134352"), &json!("PALLET-0042")]);
        assert_eq!(out.events[0].envelope["actor"], json!({"type": "scanner", "id": "dock-1"}));
        let reasons: Vec<&str> = out.rejected.iter().map(|(r, _)| *r).collect();
        assert_eq!(reasons, ["bad_check_digit", "not_text"]);
    }

    #[test]
    fn overlong_lines_are_dropped_once_and_the_next_line_reads() {
        let long = vec![b'7'; MAX_LINE * 3];
        let out = decode("barcode", &[&long, b"\nOK-1\n"]);
        assert_eq!(out.rejected.len(), 1);
        assert_eq!(out.rejected[0].0, "line_too_long");
        assert_eq!(out.events.len(), 1);
    }

    #[test]
    fn rfid_lines_are_smoothed_into_one_read_and_a_departure() {
        let mut config = config("rfid_line");
        config.dwell = Duration::from_millis(500);
        config.depart_after = Duration::from_millis(2_000);
        let mut decoder = Decoder::new(&config);
        let mut out = Decoded::default();
        for i in 0..20 {
            decoder.push(b"E2000017,1,-50\r\n", 10_000 + i * 50, &config.device, &mut out);
            decoder.tick(10_000 + i * 50, &config.device, &mut out);
        }
        decoder.push(b"garbage\r\n", 11_000, &config.device, &mut out);
        decoder.tick(13_000, &config.device, &mut out);
        let events: Vec<&Value> = out.events.iter().map(|m| &m.envelope["event"]).collect();
        assert_eq!(events, [&json!("rfid.tag.read"), &json!("rfid.tag.departed")]);
        assert_eq!(out.events[0].envelope["properties"]["readCount"], 11, "reads within the dwell");
        assert_eq!(out.events[1].envelope["properties"]["readCount"], 20);
        assert_eq!(out.rejected.len(), 1);
    }

    #[test]
    fn bad_settings_name_their_keys() {
        let mut c = config("barcode");
        c.data_bits = 9;
        c.stop_bits = 3;
        c.baud = 0;
        c.dwell = Duration::from_secs(10);
        let problems = c.problems();
        for key in ["data_bits:", "stop_bits:", "baud:", "dwell:"] {
            assert!(problems.iter().any(|p| p.starts_with(key)), "{key} in {problems:?}");
        }
        assert!(toml::from_str::<SerialSourceConfig>("name = \"s\"\npath = \"x\"\nprotocol = \"morse\"\ndevice = { type = \"a\", id = \"b\" }\n").is_err());
    }
}
