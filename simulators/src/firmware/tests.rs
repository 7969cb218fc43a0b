//! The device against hosts the tests play over pty pairs of their own.
use super::*;
use clap::Parser;
use tokio_serial::{SerialPort, SerialPortBuilderExt, SerialStream};

/// No test waits longer than this for anything.
const DEADLINE: Duration = Duration::from_secs(30);
const BOOT: u32 = 0xB007_0001;
/// Long enough never to fire in a test that does not want it to.
const NEVER: Duration = Duration::from_secs(60);

fn config(readings: u32, window: u32, ack_timeout: Duration, garbage: usize) -> DeviceConfig {
    DeviceConfig {
        device_id: "sensor-t".into(),
        boot: BOOT,
        readings,
        window,
        ack_timeout,
        garbage,
        seed: 7,
        every: None,
    }
}

/// One frame as the host received it.
#[derive(Debug, Clone, PartialEq)]
struct Got {
    kind: Kind,
    seq: u32,
    payload: Vec<u8>,
    /// As it came off the line, delimiter included.
    raw: Vec<u8>,
}

impl Got {
    /// The `reading` field, the other fields checked against it.
    fn reading_number(&self) -> i64 {
        let reading = Reading::parse(&self.payload).expect("a reading payload");
        assert_eq!(reading.event, "temperature.measured");
        assert!(reading.timestamp_ms.is_some());
        let fields: Vec<_> = reading.fields.iter().collect();
        let [("reading", FieldValue::Int(i)), ("celsius", FieldValue::Float(c)), ("zone", zone)] =
            fields[..]
        else {
            panic!("unexpected fields: {fields:?}");
        };
        assert_eq!(c, 18.0 + (i % 70) as f64 / 10.0);
        assert_eq!(zone, FieldValue::Text("cold-store-2"));
        i
    }
}

/// The gateway's side of the line.
struct Host {
    port: SerialStream,
    decoder: Decoder<{ frame::MAX_ENCODED }>,
    partial: Vec<u8>,
    frames: VecDeque<Got>,
    errors: usize,
}

impl Host {
    fn new(port: SerialStream) -> Host {
        Host {
            port,
            decoder: Decoder::new(),
            partial: Vec::new(),
            frames: VecDeque::new(),
            errors: 0,
        }
    }

    async fn next(&mut self) -> Got {
        loop {
            if let Some(got) = self.frames.pop_front() {
                return got;
            }
            let mut buf = [0u8; 1024];
            let n = self.port.read(&mut buf).await.expect("reading the device");
            assert!(n > 0, "the device closed the line");
            for &b in &buf[..n] {
                self.partial.push(b);
                if b == 0 {
                    let raw = std::mem::take(&mut self.partial);
                    let (frames, errors) = (&mut self.frames, &mut self.errors);
                    self.decoder.feed(&raw, |f| match f {
                        Ok(f) => frames.push_back(Got {
                            kind: f.kind,
                            seq: f.seq,
                            payload: f.payload.to_vec(),
                            raw: raw.clone(),
                        }),
                        Err(_) => *errors += 1,
                    });
                }
            }
        }
    }

    /// A hello saying acks reached reading `acked`.
    async fn expect_hello(&mut self, acked: u32) {
        let got = self.next().await;
        assert_eq!((got.kind, got.seq), (Kind::Hello, 0), "{got:?}");
        let hello = frame::Hello { boot: BOOT, acked, device_id: "sensor-t" };
        assert_eq!(frame::parse_hello(&got.payload), Ok(hello));
    }

    async fn expect_reading(&mut self, seq: u32) -> Got {
        let got = self.next().await;
        assert_eq!((got.kind, got.seq), (Kind::Reading, seq), "{got:?}");
        assert_eq!(got.reading_number(), i64::from(seq));
        got
    }

    /// The next reading `seq`, past anything else.
    async fn skip_to_reading(&mut self, seq: u32) {
        loop {
            let got = self.next().await;
            if (got.kind, got.seq) == (Kind::Reading, seq) {
                assert_eq!(got.reading_number(), i64::from(seq));
                return;
            }
        }
    }

    async fn send(&mut self, kind: Kind, seq: u32, payload: &[u8]) {
        let mut out = [0u8; MAX_ENCODED];
        let n = frame::encode(kind, seq, payload, &mut out).unwrap();
        self.port.write_all(&out[..n]).await.unwrap();
    }

    async fn ack(&mut self, boot: u32, seq: u32) {
        self.send(Kind::Ack, seq, &boot.to_le_bytes()).await;
    }
}

/// A fresh pty as `run` holds it: the device's end, its own hold on
/// the other end, and that end's path for the host to open.
fn pty() -> (SerialStream, SerialStream, String) {
    let (master, line_end) = SerialStream::pair().unwrap();
    let name = line_end.name().unwrap();
    (master, line_end, name)
}

/// The host opens the line as a gateway does.
fn open_host(name: &str) -> Host {
    let mut port = tokio_serial::new(name, 9600).open_native_async().unwrap();
    // Exclusive access outlives the descriptor on a pty: a reopen by
    // anyone but root would fail.
    port.set_exclusive(false).unwrap();
    Host::new(port)
}

/// A device on a fresh pty, served until everything is acknowledged,
/// and a host on the other end, with the path it opened.
fn start(config: DeviceConfig) -> (tokio::task::JoinHandle<(Ended, Value)>, Host, String) {
    let mut device = Device::new(config).unwrap();
    let (mut master, line_end, name) = pty();
    let host = open_host(&name);
    let task = tokio::spawn(async move {
        let mut stop = std::future::pending::<()>();
        let ended = device.serve(&mut master, &mut stop, Until::AllAcked).await.unwrap();
        drop(line_end);
        (ended, device.summary())
    });
    (task, host, name)
}

async fn within<T>(test: impl Future<Output = T>) -> T {
    tokio::time::timeout(DEADLINE, test).await.expect("the test ran past its deadline")
}

#[tokio::test]
async fn a_host_acking_every_reading_gets_each_once_in_order() {
    within(async {
        let (device, mut host, _) = start(config(50, 8, NEVER, 0));
        host.expect_hello(0).await;
        for seq in 1..=50 {
            host.expect_reading(seq).await;
            host.ack(BOOT, seq).await;
        }
        let (ended, summary) = device.await.unwrap();
        assert_eq!(ended, Ended::AllAcked);
        assert_eq!(summary["acked"], 50);
        assert_eq!(summary["readingFrames"], 50);
        assert_eq!(summary["resends"], 0);
        assert_eq!(summary["hellos"], 1);
        assert_eq!(summary["writeErrors"], 0);
        assert_eq!(host.errors, 0);
    })
    .await;
}

#[tokio::test]
async fn a_hello_request_brings_the_hello_and_the_same_unacked_bytes_again() {
    within(async {
        let (device, mut host, _) = start(config(20, 4, NEVER, 0));
        host.expect_hello(0).await;
        let mut first = Vec::new();
        for seq in 1..=4 {
            first.push(host.expect_reading(seq).await);
        }
        // Ignored: another boot's ack, and a frame that does not decode.
        host.ack(BOOT ^ 1, 4).await;
        host.port.write_all(b"\x05\x01\x02\x03\x04\x00").await.unwrap();
        host.send(Kind::HelloRequest, 0, &[]).await;
        host.expect_hello(0).await;
        for earlier in &first {
            let again = host.expect_reading(earlier.seq).await;
            assert_eq!(again.raw, earlier.raw, "a resend is the same bytes");
        }
        host.ack(BOOT, 4).await;
        for seq in 5..=20 {
            host.expect_reading(seq).await;
            host.ack(BOOT, seq).await;
        }
        let (ended, summary) = device.await.unwrap();
        assert_eq!(ended, Ended::AllAcked);
        assert_eq!(summary["acked"], 20);
        assert_eq!(summary["resends"], 4);
        assert_eq!(summary["readingFrames"], 24);
        assert_eq!(summary["hellos"], 2);
        assert_eq!(summary["helloRequests"], 1);
        assert_eq!(summary["badFrames"], 1);
    })
    .await;
}

#[tokio::test]
async fn unacked_readings_go_again_after_the_ack_timeout_even_across_a_reopen() {
    within(async {
        let (device, mut host, name) = start(config(10, 4, Duration::from_millis(150), 0));
        host.expect_hello(0).await;
        for seq in 1..=4 {
            host.expect_reading(seq).await;
        }
        host.ack(BOOT, 2).await;
        // From here on the timeout may resend at any moment on a slow
        // machine; a host takes a resend as such, so the test does too.
        host.skip_to_reading(5).await;
        host.skip_to_reading(6).await;
        // The gateway dies with 3 to 6 unacked and comes back: the
        // device sees EIO meanwhile and must carry on.
        drop(host);
        let mut host = open_host(&name);
        // The hello tells the new host where acks reached.
        loop {
            let got = host.next().await;
            if got.kind == Kind::Hello {
                let hello = frame::parse_hello(&got.payload).unwrap();
                assert_eq!((hello.boot, hello.device_id), (BOOT, "sensor-t"));
                if hello.acked == 2 {
                    break;
                }
            }
        }
        for seq in 3..=10 {
            host.skip_to_reading(seq).await;
            host.ack(BOOT, seq).await;
        }
        let (ended, summary) = device.await.unwrap();
        assert_eq!(ended, Ended::AllAcked);
        assert_eq!(summary["acked"], 10);
        assert!(summary["resends"].as_u64().unwrap() >= 4, "{summary}");
        assert!(summary["hellos"].as_u64().unwrap() >= 2, "{summary}");
    })
    .await;
}

#[tokio::test]
async fn garbage_is_reported_by_the_host_decoder_and_every_reading_still_arrives() {
    within(async {
        let (device, mut host, _) = start(config(30, 8, NEVER, 5));
        host.expect_hello(0).await;
        for seq in 1..=30 {
            host.expect_reading(seq).await;
            host.ack(BOOT, seq).await;
        }
        let (ended, summary) = device.await.unwrap();
        assert_eq!(ended, Ended::AllAcked);
        assert_eq!(summary["acked"], 30);
        assert_eq!(summary["garbage"], 5);
        assert_eq!(summary["resends"], 0);
        // Each noise burst and each corrupted copy is one bad frame.
        assert_eq!(host.errors, 10);
    })
    .await;
}

#[tokio::test]
async fn once_all_acked_it_still_answers_hello_requests_until_stopped() {
    within(async {
        let mut device = Device::new(config(3, 8, NEVER, 0)).unwrap();
        let (mut master, line_end, name) = pty();
        let mut host = open_host(&name);
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let mut never = std::future::pending::<()>();
            let first = device.serve(&mut master, &mut never, Until::AllAcked).await.unwrap();
            let mut stop = Box::pin(async {
                let _ = stop_rx.await;
            });
            let second = device.serve(&mut master, &mut stop, Until::Stopped).await.unwrap();
            drop(line_end);
            (first, second, device.summary())
        });
        host.expect_hello(0).await;
        for seq in 1..=3 {
            host.expect_reading(seq).await;
        }
        host.ack(BOOT, 3).await;
        // Two requests: had the first brought a reading, it would come
        // before the second hello.
        host.send(Kind::HelloRequest, 0, &[]).await;
        host.send(Kind::HelloRequest, 0, &[]).await;
        host.expect_hello(3).await;
        host.expect_hello(3).await;
        stop_tx.send(()).unwrap();
        let (first, second, summary) = task.await.unwrap();
        assert_eq!((first, second), (Ended::AllAcked, Ended::Stopped));
        assert_eq!(summary["helloRequests"], 2);
        assert_eq!(summary["hellos"], 3);
        assert_eq!(summary["resends"], 0);
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_line_nobody_holds_is_waited_out_until_stopped() {
    within(async {
        let mut device = Device::new(config(5, 2, Duration::from_millis(300), 0)).unwrap();
        // Reads end at once and writes fail: a line with nobody there.
        let (mut port, other_end) = tokio::io::duplex(4096);
        drop(other_end);
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let mut stop = Box::pin(async {
                let _ = stop_rx.await;
            });
            let ended = device.serve(&mut port, &mut stop, Until::AllAcked).await.unwrap();
            (ended, device.summary())
        });
        // Paused time: three seconds of the device's clock, at once.
        tokio::time::sleep(Duration::from_secs(3)).await;
        stop_tx.send(()).unwrap();
        let (ended, summary) = task.await.unwrap();
        assert_eq!(ended, Ended::Stopped);
        assert_eq!(summary["acked"], 0);
        assert_eq!(summary["hellos"], 0);
        // The boot's hello, then one per ack timeout, each refused.
        assert!(summary["writeErrors"].as_u64().unwrap() >= 10, "{summary}");
    })
    .await;
}

#[test]
fn noise_and_corrupted_copies_are_each_one_bad_frame() {
    let mut rng = StdRng::seed_from_u64(1);
    for seq in 1..=300 {
        let frame = reading_frame(seq, now_ms()).unwrap();
        let copy = corrupt(&frame, &mut rng).expect("a corruption");
        assert_eq!(copy.len(), frame.len());
        assert_eq!(copy.iter().filter(|&&b| b != 0).count(), frame.len() - 1);
        assert!(one_bad_frame(&copy));
        assert!(one_bad_frame(&noise(&mut rng)));
    }
}

#[test]
fn configs_it_cannot_run_are_refused() {
    for bad in [
        DeviceConfig { window: 0, ..config(5, 8, NEVER, 0) },
        DeviceConfig { ack_timeout: Duration::ZERO, ..config(5, 8, NEVER, 0) },
        DeviceConfig { device_id: String::new(), ..config(5, 8, NEVER, 0) },
        DeviceConfig { device_id: "a\nb".into(), ..config(5, 8, NEVER, 0) },
        DeviceConfig { device_id: "x".repeat(65), ..config(5, 8, NEVER, 0) },
        config(0, 8, NEVER, 1),
    ] {
        assert!(matches!(Device::new(bad.clone()), Err(Error::InvalidConfig(_))), "{bad:?}");
    }
}

#[test]
fn the_flags_parse() {
    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        args: FirmwareArgs,
    }
    let cli = Cli::try_parse_from([
        "opgraph-sim",
        "--link",
        "/tmp/fw",
        "--boot",
        "9",
        "--readings",
        "12",
        "--window",
        "3",
        "--ack-timeout",
        "250ms",
        "--garbage",
        "2",
        "--seed",
        "5",
        "--summary",
        "/tmp/fw.json",
        "--exit-after-acked",
    ])
    .unwrap();
    let args = cli.args;
    assert_eq!(args.device_id, "sensor-1");
    assert_eq!((args.boot, args.readings, args.window), (Some(9), 12, 3));
    assert_eq!(args.ack_timeout, Duration::from_millis(250));
    assert_eq!((args.garbage, args.seed), (2, Some(5)));
    assert!(args.exit_after_acked);
    let defaults = Cli::try_parse_from(["opgraph-sim", "--link", "/tmp/fw"]).unwrap().args;
    assert_eq!((defaults.readings, defaults.window), (100, 8));
    assert_eq!(defaults.ack_timeout, Duration::from_millis(300));
    assert_eq!((defaults.boot, defaults.seed, defaults.garbage), (None, None, 0));
    assert!(!defaults.exit_after_acked);
}

/// With `every`, readings are taken one per interval (on tokio's paused
/// clock, so the spacing is exact and nothing waits for real).
#[tokio::test(start_paused = true)]
async fn sampling_takes_one_reading_per_interval() {
    let every = Duration::from_secs(2);
    let config = DeviceConfig { every: Some(every), ..config(4, 8, NEVER, 0) };
    let mut device = Device::new(config).unwrap();
    let (mut port, mut host) = tokio::io::duplex(64 * 1024);
    let device = tokio::spawn(async move {
        let mut stop = std::future::pending::<()>();
        device.serve(&mut port, &mut stop, Until::AllAcked).await.unwrap()
    });
    let mut decoder = Decoder::<MAX_ENCODED>::new();
    let mut times = Vec::new();
    let mut buf = [0u8; 4096];
    while times.len() < 4 {
        let n = within(tokio::io::AsyncReadExt::read(&mut host, &mut buf)).await.unwrap();
        let mut acks = Vec::new();
        decoder.feed(&buf[..n], |f| {
            let f = f.unwrap();
            if f.kind == Kind::Reading {
                times.push(Instant::now());
                acks.push(f.seq);
            }
        });
        for seq in acks {
            let mut out = [0u8; MAX_ENCODED];
            let len = frame::encode(Kind::Ack, seq, &BOOT.to_le_bytes(), &mut out).unwrap();
            tokio::io::AsyncWriteExt::write_all(&mut host, &out[..len]).await.unwrap();
        }
    }
    assert_eq!(within(device).await.unwrap(), Ended::AllAcked);
    let gaps: Vec<Duration> = times.windows(2).map(|w| w[1] - w[0]).collect();
    assert!(gaps.iter().all(|g| *g >= every), "{gaps:?}");
}
