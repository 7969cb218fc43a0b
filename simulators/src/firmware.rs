//! `opgraph-sim firmware`: a microcontroller speaking Opgraph's framed
//! serial protocol ([`opgraph_firmware_bridge`]) on a serial line.
//!
//! Makes a pseudo-terminal pair, holds the master end, links `--link PATH`
//! to the other end for the gateway to open and prints `listening
//! serial=PATH`. Then it behaves as a device just booted does, at once: a
//! hello (`--boot`, `--device-id`, and how far acks have reached), then
//! readings numbered 1 to `--readings`, at most `--window` of them
//! unacknowledged. Each reading is kept, as the very bytes first sent,
//! until a cumulative ack of its boot covers it. When no ack has advanced
//! for `--ack-timeout`, or the host sends a hello request, the device
//! sends its hello again and then every reading still unacknowledged
//! (go-back-N): that is how real firmware survives a lost ack, line noise
//! and a gateway restart, and what the gateway's duplicate detection has
//! to cope with. `--garbage N` mixes N noise bursts and N corrupted copies
//! of readings into the first sends, so the host's resynchronisation is
//! exercised too.
//!
//! The gateway may close and reopen the port at any time (it restarts, a
//! test kills it). The simulator keeps the gateway's end open too, so the
//! line never hangs up: what the device sends meanwhile waits in the pty,
//! writes a full buffer blocks time out and are counted, and the ack
//! timeout resends what the gateway missed once it is back. Failed reads
//! (EIO or end of file, a line nobody holds) are waited out the same way:
//! nothing the line does ends the device.
//!
//! Once the last reading is acknowledged it writes `summary {json}` on
//! stdout (and to `--summary FILE`) and, with `--exit-after-acked`, exits;
//! otherwise it keeps the line open, answering hello requests, until
//! SIGTERM or Ctrl-C. Stopped before then, it writes the summary as it
//! stands (`acked` below `readings` says how far it got).
//!
//! The device itself, [`Device`], runs over any byte stream, so tests play
//! the host over a pty pair of their own.

use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use opgraph_firmware_bridge::Value as FieldValue;
use opgraph_firmware_bridge::frame::{self, Decoder, FrameWriter, Kind, MAX_ENCODED};
use opgraph_firmware_bridge::{Fields, Reading};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::signal::unix::{SignalKind, signal};
use tokio::time::Instant;

use crate::error::{Error, Result};
use crate::print;

/// How long to leave the line alone after a failed read: with nobody on
/// the other end the master fails every read at once, and retrying without
/// a pause would spin.
const READ_PAUSE: Duration = Duration::from_millis(50);

/// The longest one write may take. A gateway that holds the port but does
/// not read fills the pty's buffer and would block the device for good;
/// past this the write counts as failed and the ack timeout resends.
const WRITE_TIMEOUT: Duration = Duration::from_secs(1);

/// Simulate a microcontroller speaking Opgraph's framed serial protocol on
/// a pseudo-terminal.
#[derive(Debug, Clone, clap::Args)]
pub struct FirmwareArgs {
    /// Symlink to create to the device's serial end, for the gateway to open.
    #[arg(long)]
    pub link: PathBuf,
    /// Device id sent in the hello (1 to 64 bytes).
    #[arg(long, default_value = "sensor-1")]
    pub device_id: String,
    /// Boot id sent in the hello [default: random].
    #[arg(long)]
    pub boot: Option<u32>,
    /// Readings to send, numbered 1 to N.
    #[arg(long, default_value_t = 100)]
    pub readings: u32,
    /// Readings sent and not yet acknowledged, at most.
    #[arg(long, default_value_t = 8)]
    pub window: u32,
    /// With no ack advancing for this long (e.g. 300ms, 2s), send the hello
    /// and every unacknowledged reading again.
    #[arg(long, default_value = "300ms", value_parser = crate::parse_duration)]
    pub ack_timeout: Duration,
    /// Noise bursts, and as many corrupted copies of readings, to mix into
    /// the first sends.
    #[arg(long, default_value_t = 0)]
    pub garbage: usize,
    /// Seed [default: random, printed in the summary].
    #[arg(long)]
    pub seed: Option<u64>,
    /// Also write the summary to this file.
    #[arg(long)]
    pub summary: Option<PathBuf>,
    /// Exit as soon as the last reading is acknowledged.
    #[arg(long)]
    pub exit_after_acked: bool,
    /// Take one reading per interval (e.g. 2s), like a sensor sampling,
    /// instead of sending as fast as the window allows.
    #[arg(long, value_parser = crate::parse_duration)]
    pub every: Option<Duration>,
}

/// Who the device is and what it sends, fixed at boot.
#[derive(Debug, Clone)]
pub struct DeviceConfig {
    pub device_id: String,
    pub boot: u32,
    pub readings: u32,
    pub window: u32,
    pub ack_timeout: Duration,
    pub garbage: usize,
    pub seed: u64,
    /// One new reading per interval; `None`: as fast as the window allows.
    pub every: Option<Duration>,
}

/// When [`Device::serve`] returns, besides when stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Until {
    /// As soon as the last reading is acknowledged.
    AllAcked,
    /// Only when stopped: an acknowledged device still answers hello
    /// requests.
    Stopped,
}

/// Why [`Device::serve`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    AllAcked,
    Stopped,
}

/// Line noise to write just before a reading's first send.
#[derive(Debug, Clone)]
enum Garbage {
    /// A few non-zero bytes and a delimiter.
    Noise(Vec<u8>),
    /// The reading's own frame with one bit flipped, made when the frame is.
    Corrupt,
}

/// A reading sent (or due) and not acknowledged.
#[derive(Debug, Clone)]
struct Outstanding {
    seq: u32,
    /// Encoded once: a resend is the same bytes, timestamp included, as a
    /// device replaying its buffer would send.
    frame: Vec<u8>,
    /// Noise to write before the first send only.
    garbage: Vec<u8>,
    /// Whether one write of it got through, so the next is a resend.
    written: bool,
}

#[derive(Debug, Clone, Copy, Default)]
struct Stats {
    reading_frames: u64,
    resends: u64,
    hellos: u64,
    hello_requests: u64,
    bad_frames: u64,
}

/// The device's end of the line, and what went wrong writing to it.
#[derive(Debug, Default)]
struct Line {
    /// A write failed part-way, so the host may hold the start of a frame.
    dirty: bool,
    /// Writes that failed or timed out.
    write_errors: u64,
}

impl Line {
    /// Writes `bytes`; false, counted, if the line would not take them.
    async fn write<P: AsyncWrite + Unpin>(&mut self, port: &mut P, bytes: &[u8]) -> bool {
        let dirty = self.dirty;
        let attempt = async {
            if dirty {
                // Ends the cut frame, so it costs the host one bad frame
                // rather than this one too.
                port.write_all(&[0]).await?;
            }
            port.write_all(bytes).await?;
            port.flush().await
        };
        match tokio::time::timeout(WRITE_TIMEOUT, attempt).await {
            Ok(Ok(())) => {
                self.dirty = false;
                true
            }
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "firmware: write failed");
                self.failed()
            }
            Err(_) => {
                tracing::debug!("firmware: write timed out");
                self.failed()
            }
        }
    }

    fn failed(&mut self) -> bool {
        self.dirty = true;
        self.write_errors += 1;
        false
    }
}

/// What a frame from the host asks for.
#[derive(Debug, Clone, Copy)]
enum FromHost {
    Ack { boot: u32, seq: u32 },
    HelloRequest,
}

/// The simulated microcontroller: its window of unacknowledged readings
/// and its counts. [`Device::serve`] runs it over a line.
pub struct Device {
    config: DeviceConfig,
    rng: StdRng,
    /// Noise to write before a reading's first send, by sequence number.
    garbage: BTreeMap<u32, Vec<Garbage>>,
    /// Exactly the readings `acked + 1 ..= sent`, in order.
    window: VecDeque<Outstanding>,
    acked: u32,
    sent: u32,
    booted: bool,
    /// The last time an ack advanced or everything outstanding was sent
    /// again: the ack timeout counts from here.
    last_progress: Instant,
    /// When the next reading is taken, with [`DeviceConfig::every`].
    next_reading: Instant,
    decoder: Decoder<{ frame::MAX_ENCODED }>,
    line: Line,
    stats: Stats,
}

impl Device {
    /// A device about to boot; refuses a config it could not run.
    pub fn new(config: DeviceConfig) -> Result<Device> {
        let mut problems = Vec::new();
        if config.window == 0 {
            problems.push("window: must be at least 1".to_owned());
        }
        if config.every.is_some_and(|every| every.is_zero()) {
            problems.push("every: must be more than 0".to_owned());
        }
        if config.ack_timeout.is_zero() {
            problems.push("ack-timeout: must be more than 0".to_owned());
        }
        if config.garbage > 0 && config.readings == 0 {
            problems.push("garbage: needs at least one reading to corrupt".to_owned());
        }
        if let Err(e) = hello_frame(config.boot, 0, &config.device_id) {
            problems.push(format!("device-id: {:?}: {e}", config.device_id));
        }
        if !problems.is_empty() {
            return Err(Error::InvalidConfig(problems));
        }
        let mut rng = StdRng::seed_from_u64(config.seed);
        let mut garbage: BTreeMap<u32, Vec<Garbage>> = BTreeMap::new();
        for _ in 0..config.garbage {
            for piece in [Garbage::Noise(noise(&mut rng)), Garbage::Corrupt] {
                let seq = rng.random_range(1..=config.readings);
                garbage.entry(seq).or_default().push(piece);
            }
        }
        Ok(Device {
            config,
            rng,
            garbage,
            window: VecDeque::new(),
            acked: 0,
            sent: 0,
            booted: false,
            last_progress: Instant::now(),
            next_reading: Instant::now(),
            decoder: Decoder::new(),
            // A device at boot cannot know what the line carried before it
            // (a reset mid-frame): its first write ends any half frame.
            line: Line { dirty: true, write_errors: 0 },
            stats: Stats::default(),
        })
    }

    pub fn all_acked(&self) -> bool {
        self.acked >= self.config.readings
    }

    /// The counts so far; see the module docs.
    pub fn summary(&self) -> Value {
        json!({
            "device": self.config.device_id,
            "boot": self.config.boot,
            "seed": self.config.seed,
            "readings": self.config.readings,
            "acked": self.acked,
            "readingFrames": self.stats.reading_frames,
            "resends": self.stats.resends,
            "hellos": self.stats.hellos,
            "helloRequests": self.stats.hello_requests,
            "garbage": self.config.garbage,
            "badFrames": self.stats.bad_frames,
            "writeErrors": self.line.write_errors,
        })
    }

    /// Runs the device over `port` until `stop` completes or, with
    /// [`Until::AllAcked`], the last reading is acknowledged. The first
    /// call boots it (hello, first window); a later one carries on where
    /// the last left off. Failed reads and writes are waited out, never
    /// returned: the only errors are frames that cannot be encoded.
    pub async fn serve<P, S>(&mut self, port: &mut P, stop: &mut S, until: Until) -> Result<Ended>
    where
        P: AsyncRead + AsyncWrite + Unpin,
        S: Future<Output = ()> + Unpin,
    {
        if !self.booted {
            self.booted = true;
            if self.send_hello(port).await? {
                self.fill_window(port).await?;
            }
            self.last_progress = Instant::now();
        }
        let mut buf = [0u8; 1024];
        let mut read_paused_until: Option<Instant> = None;
        loop {
            if until == Until::AllAcked && self.all_acked() {
                return Ok(Ended::AllAcked);
            }
            let resend_at =
                (!self.all_acked()).then(|| self.last_progress + self.config.ack_timeout);
            let sample_at =
                (self.config.every.is_some() && self.may_send()).then_some(self.next_reading);
            // Biased: after the line kept the device busy (a write timing
            // out), a signal that came meanwhile goes first.
            tokio::select! {
                biased;
                () = &mut *stop => return Ok(Ended::Stopped),
                read = port.read(&mut buf), if read_paused_until.is_none() => match read {
                    Ok(n) if n > 0 => self.received(port, &buf[..n]).await?,
                    // EIO or end of file: nobody holds the other end (the
                    // gateway is away, maybe restarting). Wait and read
                    // again; the ack timeout resends what it missed.
                    _ => read_paused_until = Some(Instant::now() + READ_PAUSE),
                },
                () = tokio::time::sleep_until(read_paused_until.unwrap_or_else(Instant::now)),
                    if read_paused_until.is_some() => read_paused_until = None,
                () = tokio::time::sleep_until(resend_at.unwrap_or_else(Instant::now)),
                    if resend_at.is_some() => self.resend(port).await?,
                () = tokio::time::sleep_until(sample_at.unwrap_or_else(Instant::now)),
                    if sample_at.is_some() => self.fill_window(port).await?,
            }
        }
    }

    /// Acts on what the host sent.
    async fn received<P: AsyncWrite + Unpin>(&mut self, port: &mut P, bytes: &[u8]) -> Result<()> {
        let mut asked = Vec::new();
        let mut bad = 0;
        self.decoder.feed(bytes, |frame| match frame {
            Ok(f) => match f.kind {
                Kind::Ack => match frame::parse_ack(f.payload) {
                    Ok(boot) => asked.push(FromHost::Ack { boot, seq: f.seq }),
                    Err(_) => bad += 1,
                },
                Kind::HelloRequest => asked.push(FromHost::HelloRequest),
                // Device frames coming back: a host end left echoing.
                Kind::Hello | Kind::Reading => {}
            },
            Err(_) => bad += 1,
        });
        self.stats.bad_frames += bad;
        for request in asked {
            match request {
                // An ack for another boot is about readings this boot
                // never sent.
                FromHost::Ack { boot, seq } if boot == self.config.boot && seq > self.acked => {
                    self.acknowledged(seq);
                    self.fill_window(port).await?;
                }
                FromHost::Ack { .. } => {}
                FromHost::HelloRequest => {
                    self.stats.hello_requests += 1;
                    self.resend(port).await?;
                }
            }
        }
        Ok(())
    }

    fn acknowledged(&mut self, seq: u32) {
        // A host acking past what this boot sent (a boot id reused across
        // runs) cannot make the device forget readings it never sent.
        let seq = seq.min(self.sent);
        if seq <= self.acked {
            return;
        }
        while self.window.front().is_some_and(|r| r.seq <= seq) {
            self.window.pop_front();
        }
        self.acked = seq;
        self.last_progress = Instant::now();
    }

    /// Sends new readings until the window is full. A failed write ends
    /// it: the line is down, and the ack timeout resends what is in the
    /// window once it is back.
    async fn fill_window<P: AsyncWrite + Unpin>(&mut self, port: &mut P) -> Result<()> {
        while self.may_send() {
            if let Some(every) = self.config.every {
                // Sampling: one reading when it is due, the next later.
                if Instant::now() < self.next_reading {
                    break;
                }
                self.next_reading = Instant::now() + every;
            }
            let seq = self.sent + 1;
            let frame = reading_frame(seq, now_ms()).map_err(encoding("encoding a reading"))?;
            let garbage = self.garbage_before(seq, &frame);
            self.window.push_back(Outstanding { seq, frame, garbage, written: false });
            self.sent = seq;
            if !self.send_reading(port, self.window.len() - 1).await {
                break;
            }
        }
        Ok(())
    }

    /// Whether a new reading would fit: some are left, the window has room.
    fn may_send(&self) -> bool {
        self.sent < self.config.readings && self.sent - self.acked < self.config.window
    }

    /// The hello, then every reading in the window, in order (go-back-N).
    async fn resend<P: AsyncWrite + Unpin>(&mut self, port: &mut P) -> Result<()> {
        if self.send_hello(port).await? {
            for i in 0..self.window.len() {
                if !self.send_reading(port, i).await {
                    break;
                }
            }
        }
        self.last_progress = Instant::now();
        Ok(())
    }

    /// Writes a hello saying how far acks have reached, so that a host
    /// that restarted resumes there; false if the line would not take it.
    async fn send_hello<P: AsyncWrite + Unpin>(&mut self, port: &mut P) -> Result<bool> {
        let hello = hello_frame(self.config.boot, self.acked, &self.config.device_id)
            .map_err(encoding("encoding the hello"))?;
        let ok = self.line.write(port, &hello).await;
        if ok {
            self.stats.hellos += 1;
        }
        Ok(ok)
    }

    /// Writes the window's `i`-th reading, after its garbage on its first
    /// send.
    async fn send_reading<P: AsyncWrite + Unpin>(&mut self, port: &mut P, i: usize) -> bool {
        let Some(reading) = self.window.get_mut(i) else { return true };
        // Garbage goes once, even if this write fails: the host may have
        // seen some of it already.
        let mut bytes = std::mem::take(&mut reading.garbage);
        bytes.extend_from_slice(&reading.frame);
        let ok = self.line.write(port, &bytes).await;
        if ok {
            self.stats.reading_frames += 1;
            if reading.written {
                self.stats.resends += 1;
            }
            reading.written = true;
        }
        ok
    }

    /// The garbage planned for reading `seq`, as bytes.
    fn garbage_before(&mut self, seq: u32, frame: &[u8]) -> Vec<u8> {
        let mut bytes = Vec::new();
        for piece in self.garbage.remove(&seq).unwrap_or_default() {
            match piece {
                Garbage::Noise(noise) => bytes.extend_from_slice(&noise),
                Garbage::Corrupt => {
                    let copy =
                        corrupt(frame, &mut self.rng).unwrap_or_else(|| noise(&mut self.rng));
                    bytes.extend_from_slice(&copy);
                }
            }
        }
        bytes
    }
}

/// The hello frame; fails for a device id the host would refuse.
fn hello_frame(
    boot: u32,
    acked: u32,
    device_id: &str,
) -> std::result::Result<Vec<u8>, opgraph_firmware_bridge::Error> {
    let mut payload = [0u8; 72];
    let hello = frame::Hello { boot, acked, device_id };
    let payload = frame::hello_payload(&hello, &mut payload)?;
    let mut out = [0u8; MAX_ENCODED];
    let n = frame::encode(Kind::Hello, 0, payload, &mut out)?;
    Ok(out[..n].to_vec())
}

/// A frame the codec refused to encode. The device's frames are fixed in
/// shape and checked at [`Device::new`], so this is a bug, not a config.
fn encoding(context: &'static str) -> impl FnOnce(opgraph_firmware_bridge::Error) -> Error {
    move |e| Error::Io { context, source: std::io::Error::new(std::io::ErrorKind::InvalidData, e) }
}

/// Reading `seq` as sent on the line, delimiter included.
pub fn reading_frame(
    seq: u32,
    timestamp_ms: i64,
) -> std::result::Result<Vec<u8>, opgraph_firmware_bridge::Error> {
    let fields = [
        ("reading", FieldValue::Int(i64::from(seq))),
        ("celsius", FieldValue::Float(18.0 + f64::from(seq % 70) / 10.0)),
        ("zone", FieldValue::Text("cold-store-2")),
    ];
    let reading = Reading {
        event: "temperature.measured",
        timestamp_ms: Some(timestamp_ms),
        fields: Fields::Given(&fields),
    };
    let mut out = [0u8; MAX_ENCODED];
    let mut writer = FrameWriter::new(&mut out, Kind::Reading, seq)?;
    reading.write(&mut writer)?;
    let n = writer.finish()?;
    Ok(out[..n].to_vec())
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// A noise burst: 2 to 9 non-zero bytes and a delimiter. Unstuffed, 9
/// bytes are at most 8, shorter than any frame's header and checksum, so
/// it is never a valid frame, and the delimiter keeps it from eating the
/// frame after it.
fn noise(rng: &mut StdRng) -> Vec<u8> {
    let len = rng.random_range(2..=9);
    let mut bytes: Vec<u8> = (0..len).map(|_| rng.random_range(1..=255u8)).collect();
    bytes.push(0);
    bytes
}

/// `frame` with one bit flipped, checked to be exactly one bad frame to a
/// host; `None` if no try gives one.
fn corrupt(frame: &[u8], rng: &mut StdRng) -> Option<Vec<u8>> {
    // Never the delimiter: without it the copy would swallow the real
    // frame that follows.
    let body = frame.len().checked_sub(1).filter(|&n| n > 0)?;
    for _ in 0..32 {
        let mut copy = frame.to_vec();
        let at = rng.random_range(0..body);
        copy[at] ^= 1 << rng.random_range(0..8);
        // A zero would make it two frames, or a lone delimiter and a frame.
        if copy[at] == 0 {
            continue;
        }
        // A flipped bit in the data always fails the CRC, but one in the
        // byte stuffing moves bytes around: ask the decoder rather than
        // argue.
        if one_bad_frame(&copy) {
            return Some(copy);
        }
    }
    None
}

/// Whether a host decoding `bytes` sees exactly one bad frame and nothing
/// else.
fn one_bad_frame(bytes: &[u8]) -> bool {
    let (mut good, mut bad) = (0, 0);
    Decoder::<{ frame::MAX_ENCODED }>::new().feed(bytes, |f| match f {
        Ok(_) => good += 1,
        Err(_) => bad += 1,
    });
    good == 0 && bad == 1
}

/// Runs the device on a pseudo-terminal; see the module docs. Returns the
/// summary.
pub async fn run(args: FirmwareArgs) -> Result<Value> {
    let config = DeviceConfig {
        device_id: args.device_id.clone(),
        boot: args.boot.unwrap_or_else(rand::random),
        readings: args.readings,
        window: args.window,
        ack_timeout: args.ack_timeout,
        garbage: args.garbage,
        seed: args.seed.unwrap_or_else(rand::random),
        every: args.every,
    };
    let mut device = Device::new(config)?;
    let (mut pty, line_end) = crate::linked_pty(&args.link)?;
    // `line_end` stays open until the device stops, though only the
    // gateway reads it. Were the gateway its only holder, its restart
    // would hang the master up, and tokio keeps a hang-up for good: every
    // read with no data after the gateway is back would then spin on
    // EAGAIN inside `poll_read` and starve the device. Held, the master
    // never hangs up; what the device writes while the gateway is away
    // waits in the pty for the restarted gateway, which takes the stale
    // frames as resends, and a full buffer times the writes out.
    let result = serve_cli(&args, &mut device, &mut pty).await;
    drop(line_end);
    let _ = std::fs::remove_file(&args.link);
    result.map(|()| device.summary())
}

async fn serve_cli(
    args: &FirmwareArgs,
    device: &mut Device,
    pty: &mut tokio_serial::SerialStream,
) -> Result<()> {
    let mut terminate = signal(SignalKind::terminate()).map_err(Error::io("SIGTERM handler"))?;
    let mut interrupt = signal(SignalKind::interrupt()).map_err(Error::io("SIGINT handler"))?;
    print(&format!("listening serial={}\n", args.link.display()))?;
    let mut stop = std::pin::pin!(async move {
        tokio::select! {
            _ = terminate.recv() => {}
            _ = interrupt.recv() => {}
        }
    });
    let ended = device.serve(pty, &mut stop, Until::AllAcked).await?;
    publish(args.summary.as_deref(), &device.summary())?;
    if ended == Ended::AllAcked && !args.exit_after_acked {
        device.serve(pty, &mut stop, Until::Stopped).await?;
    }
    Ok(())
}

/// Writes the summary to `path` (whole or not at all) and to stdout.
fn publish(path: Option<&Path>, summary: &Value) -> Result<()> {
    if let Some(path) = path {
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, summary.to_string())
            .and_then(|()| std::fs::rename(&tmp, path))
            .map_err(Error::io("writing the summary"))?;
    }
    print(&format!("summary {summary}\n"))
}

#[cfg(test)]
mod tests;
