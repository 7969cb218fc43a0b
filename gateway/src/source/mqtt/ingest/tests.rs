use std::collections::BTreeMap;
use std::ops::RangeInclusive;
use std::sync::atomic::AtomicU32;
use std::sync::atomic::Ordering::SeqCst;

use bytes::Bytes;
use prost::Message as _;
use rumqttc::{AsyncClient, Event, MqttOptions, Outgoing};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::{Semaphore as Gate, watch};

use super::*;
use crate::buffer::{Buffer, BufferStats, MemoryBuffer, Record};
use crate::source::SourceHealth;

/// A memory buffer whose appends can be held: at a gate, which shows when
/// PUBACKs go out relative to the append; or for good, as when the
/// process dies in the append, for a batch with reading `before` (not
/// appended) or `after` (appended first), announced on `stalled`.
struct TestBuffer {
    inner: Arc<dyn Buffer>,
    gate: Option<Arc<Gate>>,
    crash: Option<Crash>,
}

struct Crash {
    before: i64,
    after: i64,
    stalled: tokio::sync::mpsc::UnboundedSender<&'static str>,
}

impl TestBuffer {
    fn gated(gate: &Arc<Gate>) -> Arc<TestBuffer> {
        let inner = Arc::new(MemoryBuffer::new());
        Arc::new(TestBuffer { inner, gate: Some(Arc::clone(gate)), crash: None })
    }
}

/// The reading (`seq`) a record holds.
fn seq_of(record: &[u8]) -> i64 {
    let event = opgraph_proto::pb::Event::decode(record).unwrap();
    let event = opgraph_proto::Event::from_pb(event, 0).unwrap();
    event.properties.unwrap()["seq"].as_i64().unwrap()
}

#[async_trait]
impl Buffer for TestBuffer {
    async fn append(&self, records: Vec<Bytes>) -> Result<RangeInclusive<u64>> {
        let _permit = match &self.gate {
            Some(gate) => Some(gate.acquire().await.map_err(|_| Error::Closed)?),
            None => None,
        };
        let has = |seq| records.iter().any(|r| seq_of(r) == seq);
        let crash = self.crash.as_ref();
        if let Some(crash) = crash.filter(|c| has(c.before)) {
            let _ = crash.stalled.send("before");
            std::future::pending::<()>().await;
        }
        let appended = self.inner.append(records.clone()).await;
        if let Some(crash) = crash.filter(|c| has(c.after)) {
            let _ = crash.stalled.send("after");
            std::future::pending::<()>().await;
        }
        appended
    }
    async fn read(&self, from: u64, max: usize, bytes: usize) -> Result<Vec<Record>> {
        self.inner.read(from, max, bytes).await
    }
    async fn ack(&self, up_to: u64) -> Result<()> {
        self.inner.ack(up_to).await
    }
    fn subscribe(&self) -> watch::Receiver<u64> {
        self.inner.subscribe()
    }
    fn stats(&self) -> BufferStats {
        self.inner.stats()
    }
    async fn close(&self) -> Result<()> {
        self.inner.close().await
    }
}

struct Running {
    addr: SocketAddr,
    shared: Arc<Shared>,
    buffer: Arc<dyn Buffer>,
    health: Arc<SourceHealth>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<Result<()>>,
}

fn config(users: &[(&str, &str)]) -> MqttIngestConfig {
    MqttIngestConfig {
        name: "devices".into(),
        listen: "127.0.0.1:0".parse().unwrap(),
        users: users.iter().map(|(u, p)| ((*u).to_owned(), (*p).to_owned())).collect(),
        rules: vec![
            toml::from_str(
                "topic = \"readers/{r}/tags\"\nevent = \"rfid.tag.read\"\n\
                 actor = { type = \"rfid_reader\", id = \"{r}\" }\n\
                 properties = { seq = \"{/seq}\" }",
            )
            .unwrap(),
        ],
        ..MqttIngestConfig::default()
    }
}

fn start(config: &MqttIngestConfig, buffer: Arc<dyn Buffer>) -> Running {
    start_on(config, buffer, None, &tokio::runtime::Handle::current())
}

/// [`start`] keeping state in `state_dir`, on `runtime`.
fn start_on(
    config: &MqttIngestConfig,
    buffer: Arc<dyn Buffer>,
    state_dir: Option<&Path>,
    runtime: &tokio::runtime::Handle,
) -> Running {
    let state = state_dir.map(crate::buffer::BufferConfig::with_dir);
    let source = MqttIngestSource::build(config, "sources.mqtt_ingest[0]", state.as_ref()).unwrap();
    let addr = source.local_addr();
    let shared = Arc::clone(&source.shared);
    let health = Arc::new(SourceHealth::new("devices", "mqtt_ingest"));
    let intake = Intake::new(Arc::clone(&buffer), Arc::clone(&health), Duration::from_secs(30));
    let stop = CancellationToken::new();
    let task = runtime.spawn(Box::new(source).run(intake, stop.clone()));
    Running { addr, shared, buffer, health, stop, task }
}

fn client_of(
    addr: SocketAddr,
    id: &str,
    login: Option<(&str, &str)>,
) -> (AsyncClient, rumqttc::EventLoop) {
    let mut options = MqttOptions::new(id, addr.ip().to_string(), addr.port());
    options.set_keep_alive(Duration::from_secs(5));
    if let Some((u, p)) = login {
        options.set_credentials(u, p);
    }
    AsyncClient::new(options, 100)
}

/// Polls until `n` PUBACKs arrived (or an error, returned).
async fn acks(eventloop: &mut rumqttc::EventLoop, n: usize) -> std::result::Result<usize, String> {
    let mut acked = 0;
    while acked < n {
        match eventloop.poll().await {
            Ok(Event::Incoming(rumqttc::Packet::PubAck(_))) => acked += 1,
            Ok(_) => {}
            Err(e) => return Err(e.to_string()),
        }
    }
    Ok(acked)
}

const WAIT: Duration = Duration::from_secs(10);

#[tokio::test]
async fn publishes_are_stored_then_acknowledged_and_bad_ones_counted() {
    let running = start(&config(&[("reader", "pw")]), Arc::new(MemoryBuffer::new()));
    let (client, mut eventloop) = client_of(running.addr, "r1", Some(("reader", "pw")));
    for seq in 0..50 {
        let payload = format!("{{\"seq\": {seq}}}");
        client.publish("readers/r1/tags", QoS::AtLeastOnce, false, payload).await.unwrap();
    }
    client.publish("readers/r1/tags", QoS::AtLeastOnce, false, "{oops").await.unwrap();
    client.publish("other/topic", QoS::AtMostOnce, false, "{}").await.unwrap();
    client.publish("readers/r2/tags", QoS::AtMostOnce, false, "{\"seq\": 99}").await.unwrap();
    let acked = tokio::time::timeout(WAIT, acks(&mut eventloop, 51)).await.unwrap();
    assert_eq!(acked, Ok(51));
    // QoS 0 has no ack: wait for its append.
    tokio::time::timeout(WAIT, async {
        while running.buffer.stats().appended_total < 51 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .unwrap();
    let json = running.health.to_json();
    assert_eq!(json["accepted_total"], 51, "{json}");
    assert_eq!(json["rejected"]["invalid_json"], 1, "{json}");
    assert_eq!(json["rejected"]["no_rule"], 1, "{json}");
    assert_eq!(json["connected"], true, "{json}");

    // A subscription is refused; the connection stays usable.
    client.subscribe("readers/#", QoS::AtLeastOnce).await.unwrap();
    let suback = tokio::time::timeout(WAIT, async {
        loop {
            if let Ok(Event::Incoming(rumqttc::Packet::SubAck(ack))) = eventloop.poll().await {
                return ack;
            }
        }
    })
    .await
    .unwrap();
    assert_eq!(suback.return_codes, [rumqttc::SubscribeReasonCode::Failure]);

    running.stop.cancel();
    tokio::time::timeout(WAIT, running.task).await.unwrap().unwrap().unwrap();
    assert_eq!(running.health.to_json()["connected"], false);
}

#[tokio::test]
async fn no_puback_before_the_append_returns() {
    let gate = Arc::new(Gate::new(0));
    let buffer = TestBuffer::gated(&gate);
    let running = start(&config(&[]), buffer);
    let (client, mut eventloop) = client_of(running.addr, "r1", None);
    client.publish("readers/r1/tags", QoS::AtLeastOnce, false, "{\"seq\": 1}").await.unwrap();
    // The append waits at the gate: no PUBACK comes.
    let early = tokio::time::timeout(Duration::from_millis(300), acks(&mut eventloop, 1)).await;
    assert!(early.is_err(), "a PUBACK before the append returned");
    assert_eq!(running.buffer.stats().appended_total, 0);
    gate.add_permits(1);
    let acked = tokio::time::timeout(WAIT, acks(&mut eventloop, 1)).await.unwrap();
    assert_eq!(acked, Ok(1));
    assert_eq!(running.buffer.stats().appended_total, 1);
    running.stop.cancel();
    gate.add_permits(100);
    tokio::time::timeout(WAIT, running.task).await.unwrap().unwrap().unwrap();
}

/// Polls until the source has taken `n` messages off the wire.
async fn received(running: &Running, n: u64) {
    tokio::time::timeout(WAIT, async {
        while running.health.to_json()["received_total"].as_u64() < Some(n) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn connections_wait_for_a_batch_slot() {
    let gate = Arc::new(Gate::new(0));
    let buffer = TestBuffer::gated(&gate);
    let running = start(&MqttIngestConfig { max_concurrent_batches: 1, ..config(&[]) }, buffer);
    let (first, mut first_loop) = client_of(running.addr, "r1", None);
    let (second, mut second_loop) = client_of(running.addr, "r2", None);
    first.publish("readers/r1/tags", QoS::AtLeastOnce, false, "{\"seq\": 1}").await.unwrap();
    let first_acks = tokio::spawn(async move { acks(&mut first_loop, 1).await });
    // r1's batch holds the only slot while its append waits at the gate.
    received(&running, 1).await;
    second.publish("readers/r2/tags", QoS::AtLeastOnce, false, "{\"seq\": 2}").await.unwrap();
    let early = tokio::time::timeout(Duration::from_millis(300), acks(&mut second_loop, 1)).await;
    assert!(early.is_err(), "r2 acknowledged while r1 held the only slot");
    assert_eq!(running.health.to_json()["received_total"], 1, "r2 was read without a slot");
    gate.add_permits(1);
    assert_eq!(tokio::time::timeout(WAIT, first_acks).await.unwrap().unwrap(), Ok(1));
    // The slot is free again: r2's batch goes next.
    received(&running, 2).await;
    gate.add_permits(1);
    assert_eq!(tokio::time::timeout(WAIT, acks(&mut second_loop, 1)).await.unwrap(), Ok(1));
    assert_eq!(running.buffer.stats().appended_total, 2);
    running.stop.cancel();
    gate.add_permits(100);
    tokio::time::timeout(WAIT, running.task).await.unwrap().unwrap().unwrap();
}

#[tokio::test]
async fn bad_logins_other_protocols_and_garbage_are_refused() {
    let running = start(&config(&[("reader", "pw")]), Arc::new(MemoryBuffer::new()));
    let (_client, mut eventloop) = client_of(running.addr, "r1", Some(("reader", "wrong")));
    let err = tokio::time::timeout(WAIT, eventloop.poll()).await.unwrap().unwrap_err();
    assert!(err.to_string().contains("BadUserNamePassword"), "{err}");
    let (_client, mut eventloop) = client_of(running.addr, "r2", None);
    let err = tokio::time::timeout(WAIT, eventloop.poll()).await.unwrap().unwrap_err();
    assert!(err.to_string().contains("BadUserNamePassword"), "{err}");

    // Garbage instead of CONNECT, then garbage after a good CONNECT: the
    // connection closes, the endpoint carries on.
    let mut raw = TcpStream::connect(running.addr).await.unwrap();
    raw.write_all(&[0xff; 64]).await.unwrap();
    let mut sink = Vec::new();
    let closed = tokio::time::timeout(WAIT, raw.read_to_end(&mut sink)).await.unwrap();
    assert!(closed.is_ok() || closed.is_err());
    // A client id past what the journal keeps, with the right login.
    let long_id = "d".repeat(super::MAX_CLIENT_ID + 1);
    let (_client, mut eventloop) = client_of(running.addr, &long_id, Some(("reader", "pw")));
    let err = tokio::time::timeout(WAIT, eventloop.poll()).await.unwrap().unwrap_err();
    assert!(err.to_string().contains("BadClientId"), "{err}");
    let (client, mut eventloop) = client_of(running.addr, "r3", Some(("reader", "pw")));
    client.publish("readers/r3/tags", QoS::AtLeastOnce, false, "{\"seq\": 7}").await.unwrap();
    assert_eq!(tokio::time::timeout(WAIT, acks(&mut eventloop, 1)).await.unwrap(), Ok(1));
    let mut raw = TcpStream::connect(running.addr).await.unwrap();
    let mut hello = BytesMut::new();
    let mut connect = rumqttc::Connect::new("raw");
    connect.set_login("reader", "pw");
    Packet::Connect(connect).write(&mut hello, usize::MAX).unwrap();
    hello.extend_from_slice(&[0x30, 0xff, 0xff, 0xff, 0xff, 0x7f]); // bad remaining length
    raw.write_all(&hello).await.unwrap();
    let _ = tokio::time::timeout(WAIT, raw.read_to_end(&mut sink)).await.unwrap();
    assert_eq!(running.health.to_json()["rejected"]["malformed_packet"], 1);

    running.stop.cancel();
    tokio::time::timeout(WAIT, running.task).await.unwrap().unwrap().unwrap();
    let _ = Outgoing::PingReq;
}

#[tokio::test]
async fn a_device_without_keep_alive_is_closed_once_silent_too_long() {
    let config = MqttIngestConfig { idle_timeout: Duration::from_secs(1), ..config(&[]) };
    let running = start(&config, Arc::new(MemoryBuffer::new()));
    let mut stream = TcpStream::connect(running.addr).await.unwrap();
    let mut connect = rumqttc::Connect::new("asleep");
    connect.keep_alive = 0;
    let mut hello = BytesMut::new();
    Packet::Connect(connect).write(&mut hello, usize::MAX).unwrap();
    stream.write_all(&hello).await.unwrap();
    let mut reply = Vec::new();
    tokio::time::timeout(WAIT, stream.read_to_end(&mut reply)).await.unwrap().unwrap();
    assert_eq!(reply, [0x20, 0x02, 0x00, 0x00], "a CONNACK, then the close");
    running.stop.cancel();
    tokio::time::timeout(WAIT, running.task).await.unwrap().unwrap().unwrap();
}

/// A device speaking raw MQTT 3.1.1, to send DUP flags and packet ids of
/// its choosing.
struct RawDevice {
    stream: TcpStream,
    buf: BytesMut,
}

impl RawDevice {
    async fn connect(addr: SocketAddr, id: &str, clean_session: bool) -> RawDevice {
        let mut device =
            RawDevice { stream: TcpStream::connect(addr).await.unwrap(), buf: BytesMut::new() };
        let mut connect = rumqttc::Connect::new(id);
        connect.clean_session = clean_session;
        device.send(Packet::Connect(connect)).await;
        let answer = device.read().await;
        assert!(matches!(answer, Packet::ConnAck(a) if a.session_present != clean_session));
        device
    }

    async fn send(&mut self, packet: Packet) {
        let mut out = BytesMut::new();
        packet.write(&mut out, usize::MAX).unwrap();
        self.stream.write_all(&out).await.unwrap();
    }

    async fn read(&mut self) -> Packet {
        let read = read_packet(&mut self.stream, &mut self.buf, usize::MAX);
        tokio::time::timeout(WAIT, read).await.unwrap().unwrap()
    }

    /// Publishes reading `seq` with QoS 1 and waits for the PUBACK.
    async fn publish(&mut self, pkid: u16, dup: bool, seq: u64) {
        self.send_reading(pkid, dup, seq).await;
        assert!(matches!(self.read().await, Packet::PubAck(a) if a.pkid == pkid));
    }

    /// Publishes with QoS 1, not waiting for the PUBACK.
    async fn send_reading(&mut self, pkid: u16, dup: bool, seq: u64) {
        let payload = format!("{{\"seq\": {seq}}}");
        let mut publish = Publish::new("readers/r1/tags", QoS::AtLeastOnce, payload);
        publish.pkid = pkid;
        publish.dup = dup;
        self.send(Packet::Publish(publish)).await;
    }

    /// Sends these messages again (QoS 1, without waiting), then reads
    /// their PUBACKs, as a device does after a reconnect.
    async fn resend(&mut self, messages: &[(u16, bool, u64)]) {
        for &(pkid, dup, seq) in messages {
            self.send_reading(pkid, dup, seq).await;
        }
        for &(pkid, _, _) in messages {
            assert!(matches!(self.read().await, Packet::PubAck(a) if a.pkid == pkid));
        }
    }
}

#[tokio::test]
async fn a_message_sent_again_after_a_lost_puback_is_stored_once() {
    let running = start(&config(&[]), Arc::new(MemoryBuffer::new()));
    let mut device = RawDevice::connect(running.addr, "dev-1", false).await;
    device.publish(7, false, 1).await;
    device.publish(8, false, 2).await;
    // The connection goes; the device missed both PUBACKs and sends the
    // messages again, flagged DUP, with their packet ids.
    drop(device);
    let mut device = RawDevice::connect(running.addr, "dev-1", false).await;
    device.publish(7, true, 1).await;
    device.publish(8, true, 2).await;
    assert_eq!(running.buffer.stats().appended_total, 2);
    assert_eq!(running.health.to_json()["resent_total"], 2);
    // Not copies: a new reading equal to an old one (no DUP), a DUP with
    // another payload or another packet id, and another client's.
    device.publish(9, false, 1).await;
    device.publish(7, true, 3).await;
    device.publish(10, true, 2).await;
    let mut other = RawDevice::connect(running.addr, "dev-2", false).await;
    other.publish(8, true, 2).await;
    // A clean-session device keeps no session: nothing is taken for a copy.
    let mut clean = RawDevice::connect(running.addr, "dev-3", true).await;
    clean.publish(5, false, 4).await;
    clean.publish(5, true, 4).await;
    assert_eq!(running.buffer.stats().appended_total, 8);
    assert_eq!(running.health.to_json()["resent_total"], 2);
    running.stop.cancel();
    drop((device, other, clean));
    tokio::time::timeout(WAIT, running.task).await.unwrap().unwrap().unwrap();
}

/// A link between devices and the endpoint that can lose what the endpoint
/// answers on the connections open (PUBACKs lost on the way), then cut
/// them.
struct LossyLink {
    addr: SocketAddr,
    /// The generation of connections that lose what the endpoint answers.
    lose: Arc<AtomicU32>,
    /// The generation of connections: a new one closes the others.
    cut: watch::Sender<u32>,
}

impl LossyLink {
    async fn start(to: SocketAddr) -> LossyLink {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let link = LossyLink {
            addr: listener.local_addr().unwrap(),
            lose: Arc::new(AtomicU32::new(u32::MAX)),
            cut: watch::Sender::new(0),
        };
        let (lose, cut) = (Arc::clone(&link.lose), link.cut.clone());
        tokio::spawn(async move {
            while let Ok((device, _)) = listener.accept().await {
                let (lose, mut cut) = (Arc::clone(&lose), cut.subscribe());
                let generation = *cut.borrow_and_update();
                tokio::spawn(async move {
                    let endpoint = TcpStream::connect(to).await.unwrap();
                    let ((mut dr, mut dw), (mut er, mut ew)) =
                        (device.into_split(), endpoint.into_split());
                    let up = tokio::io::copy(&mut dr, &mut ew);
                    let down = async {
                        let mut chunk = vec![0; 4096];
                        while let Ok(n @ 1..) = er.read(&mut chunk).await {
                            if lose.load(SeqCst) != generation {
                                dw.write_all(&chunk[..n]).await?;
                            }
                        }
                        std::io::Result::Ok(())
                    };
                    // Either side closing, or a cut, closes both.
                    tokio::select! {
                        _ = up => {}
                        _ = down => {}
                        _ = cut.changed() => {}
                    }
                });
            }
        });
        link
    }

    fn lose(&self) {
        self.lose.store(*self.cut.borrow(), SeqCst);
    }

    fn cut(&self) {
        self.cut.send_modify(|n| *n += 1);
    }
}

#[tokio::test]
async fn rumqttc_sending_again_without_dup_after_lost_pubacks_is_stored_once() {
    let running = start(&config(&[]), Arc::new(MemoryBuffer::new()));
    let mut durable = running.buffer.subscribe();
    let link = LossyLink::start(running.addr).await;
    let mut options = MqttOptions::new("dev-r", "127.0.0.1", link.addr.port());
    options.set_clean_session(false);
    let (client, mut eventloop) = AsyncClient::new(options, 100);
    let (acks_tx, mut acks) = tokio::sync::mpsc::unbounded_channel();
    let device = tokio::spawn(async move {
        for _ in 0..10_000 {
            // An error is a cut: rumqttc connects again at the next poll.
            if let Ok(Event::Incoming(rumqttc::Packet::PubAck(a))) = eventloop.poll().await {
                let _ = acks_tx.send(a.pkid);
            }
        }
    });
    let publish = async |seq: u64| {
        let payload = format!("{{\"seq\": {seq}}}");
        client.publish("readers/r1/tags", QoS::AtLeastOnce, false, payload).await.unwrap();
    };
    let acked = async |acks: &mut tokio::sync::mpsc::UnboundedReceiver<u16>, n: usize| {
        for _ in 0..n {
            tokio::time::timeout(WAIT, acks.recv()).await.unwrap().unwrap();
        }
    };
    for seq in 1..=3 {
        publish(seq).await;
    }
    acked(&mut acks, 3).await;
    // Stored and acknowledged, but the PUBACKs never reach the device.
    link.lose();
    let from = *durable.borrow();
    for seq in 4..=6 {
        publish(seq).await;
    }
    tokio::time::timeout(WAIT, durable.wait_for(|next| *next >= from + 3)).await.unwrap().unwrap();
    link.cut();
    // rumqttc reconnects and sends 4 to 6 again, without DUP; then a new
    // one.
    acked(&mut acks, 3).await;
    publish(7).await;
    acked(&mut acks, 1).await;
    let counts = stored_counts(&running.buffer).await;
    assert_eq!(counts, (1..=7).map(|seq| (seq, 1)).collect::<BTreeMap<_, _>>());
    assert_eq!(running.health.to_json()["resent_total"], 3);
    device.abort();
    running.stop.cancel();
    tokio::time::timeout(WAIT, running.task).await.unwrap().unwrap().unwrap();
}

#[tokio::test]
async fn only_a_run_that_ends_what_was_acknowledged_is_taken_for_copies_without_dup() {
    let running = start(&config(&[]), Arc::new(MemoryBuffer::new()));
    let mut device = RawDevice::connect(running.addr, "dev-1", false).await;
    for (pkid, seq) in [(1, 1), (2, 2), (3, 3)] {
        device.publish(pkid, false, seq).await;
    }
    // Restarted, the device sends its first message again, then others:
    // no resend of the last ones acknowledged, all new.
    let mut device = RawDevice::connect(running.addr, "dev-1", false).await;
    device.resend(&[(1, false, 1), (2, false, 20)]).await;
    // A run that matches so far but stops short of the end is held for
    // a while, then stored.
    let mut device = RawDevice::connect(running.addr, "dev-1", false).await;
    device.resend(&[(1, false, 1)]).await;
    assert_eq!(running.buffer.stats().appended_total, 6);
    assert_eq!(running.health.to_json()["resent_total"], 0);
    // The last one acknowledged, without DUP: a copy; then new ones.
    let mut device = RawDevice::connect(running.addr, "dev-1", false).await;
    device.resend(&[(1, false, 1), (4, false, 4)]).await;
    // Not leading the connection: new.
    device.publish(4, false, 4).await;
    assert_eq!(running.buffer.stats().appended_total, 8);
    assert_eq!(running.health.to_json()["resent_total"], 1);
    running.stop.cancel();
    drop(device);
    tokio::time::timeout(WAIT, running.task).await.unwrap().unwrap().unwrap();

    // Turned off, only DUP copies are recognised.
    let config = MqttIngestConfig { resends_without_dup: false, ..config(&[]) };
    let running = start(&config, Arc::new(MemoryBuffer::new()));
    let mut device = RawDevice::connect(running.addr, "dev-1", false).await;
    device.publish(1, false, 1).await;
    let mut device = RawDevice::connect(running.addr, "dev-1", false).await;
    device.resend(&[(1, false, 1)]).await;
    device.resend(&[(1, true, 1)]).await;
    assert_eq!(running.buffer.stats().appended_total, 2);
    assert_eq!(running.health.to_json()["resent_total"], 1);
    running.stop.cancel();
    drop(device);
    tokio::time::timeout(WAIT, running.task).await.unwrap().unwrap().unwrap();
}

/// How often each reading (`seq`) is in the buffer.
async fn stored_counts(buffer: &Arc<dyn Buffer>) -> BTreeMap<i64, usize> {
    let mut counts = BTreeMap::new();
    for r in buffer.read(0, usize::MAX, usize::MAX).await.unwrap() {
        *counts.entry(seq_of(&r.payload)).or_default() += 1;
    }
    counts
}

#[tokio::test]
async fn messages_sent_again_after_a_crash_are_stored_once_and_none_is_lost() {
    let dir = tempfile::tempdir().unwrap();
    let buffer: Arc<dyn Buffer> = Arc::new(MemoryBuffer::new());
    let (stalled_tx, mut stalled) = tokio::sync::mpsc::unbounded_channel();
    let crash = Crash { before: 10, after: 3, stalled: stalled_tx };
    let crashing: Arc<dyn Buffer> =
        Arc::new(TestBuffer { inner: Arc::clone(&buffer), gate: None, crash: Some(crash) });
    // The first run is on a runtime of its own: dropping it drops the
    // endpoint and its connections at once, as a crash does.
    let doomed =
        tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let first = start_on(&config(&[]), crashing, Some(dir.path()), doomed.handle());
    let mut device = RawDevice::connect(first.addr, "dev-1", false).await;
    device.publish(1, false, 1).await;
    // Stored and acknowledged, but the PUBACK is lost with the crash.
    device.publish(2, false, 2).await;
    // Stored, the process dies in the append's fsync.
    device.send_reading(3, false, 3).await;
    // Not stored: the process dies before the append.
    let mut other = RawDevice::connect(first.addr, "dev-2", false).await;
    other.send_reading(1, false, 10).await;
    let mut both = [tokio::time::timeout(WAIT, stalled.recv()).await.unwrap().unwrap(), ""];
    both[1] = tokio::time::timeout(WAIT, stalled.recv()).await.unwrap().unwrap();
    both.sort_unstable();
    assert_eq!(both, ["after", "before"]);
    doomed.shutdown_background();
    drop((device, other));

    // The next run, on the same buffer and state: the devices send again
    // what they got no PUBACK for, one without DUP (as rumqttc does), one
    // with it.
    let here = tokio::runtime::Handle::current();
    let second = start_on(&config(&[]), Arc::clone(&buffer), Some(dir.path()), &here);
    let mut device = RawDevice::connect(second.addr, "dev-1", false).await;
    device.resend(&[(2, false, 2), (3, false, 3), (4, false, 4)]).await;
    let mut other = RawDevice::connect(second.addr, "dev-2", false).await;
    other.publish(1, true, 10).await;
    let counts = stored_counts(&buffer).await;
    assert_eq!(counts, BTreeMap::from([(1, 1), (2, 1), (3, 1), (4, 1), (10, 1)]));
    assert_eq!(second.health.to_json()["resent_total"], 2);
    second.stop.cancel();
    drop((device, other));
    tokio::time::timeout(WAIT, second.task).await.unwrap().unwrap().unwrap();
}

use crate::source::mqtt::loop_disk::LoopDisk;

/// Power cut: a batch whose append is durable, its PUBACK not yet sent.
/// The journal naming it was synced before the append, so the run after
/// the cut recognises the device's copies and stores each reading once;
/// unsynced, the journal would be missing from the disk and the copies
/// stored again. The buffer keeps everything it acknowledged.
#[tokio::test]
async fn messages_sent_again_after_a_power_cut_are_stored_once() {
    let disk = match LoopDisk::format(64) {
        Ok(disk) => disk,
        Err(reason) => {
            println!("skipping the power-cut test: {reason} (needs root and loop devices)");
            return;
        }
    };
    let state = crate::buffer::BufferConfig::with_dir(disk.path().join("buffer"));
    let buffer: Arc<dyn Buffer> =
        Arc::new(crate::buffer::LogBuffer::open(state.clone()).await.unwrap());
    let (stalled_tx, mut stalled) = tokio::sync::mpsc::unbounded_channel();
    // Reading 3 is appended, durably, then the power goes.
    let crash = Crash { before: i64::MIN, after: 3, stalled: stalled_tx };
    let crashing: Arc<dyn Buffer> =
        Arc::new(TestBuffer { inner: Arc::clone(&buffer), gate: None, crash: Some(crash) });
    let doomed =
        tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let first = start_on(&config(&[]), crashing, Some(&state.dir), doomed.handle());
    let mut device = RawDevice::connect(first.addr, "dev-1", false).await;
    device.publish(1, false, 1).await;
    device.publish(2, false, 2).await;
    device.send_reading(3, false, 3).await;
    assert_eq!(tokio::time::timeout(WAIT, stalled.recv()).await.unwrap(), Some("after"));
    let after_cut = disk.cut().unwrap();
    doomed.shutdown_background();
    drop(device);

    // The next run, on what the disk held: the device sends again, without
    // DUP, the PUBACKs it missed (2 was lost with the power, 3 never sent).
    let state = crate::buffer::BufferConfig::with_dir(after_cut.path().join("buffer"));
    let buffer: Arc<dyn Buffer> =
        Arc::new(crate::buffer::LogBuffer::open(state.clone()).await.unwrap());
    let here = tokio::runtime::Handle::current();
    let second = start_on(&config(&[]), Arc::clone(&buffer), Some(&state.dir), &here);
    let mut device = RawDevice::connect(second.addr, "dev-1", false).await;
    device.resend(&[(2, false, 2), (3, false, 3), (4, false, 4)]).await;
    let counts = stored_counts(&buffer).await;
    assert_eq!(counts, BTreeMap::from([(1, 1), (2, 1), (3, 1), (4, 1)]));
    assert_eq!(second.health.to_json()["resent_total"], 2);
    second.stop.cancel();
    drop(device);
    tokio::time::timeout(WAIT, second.task).await.unwrap().unwrap().unwrap();
    buffer.close().await.unwrap();
}

/// A self-signed certificate for 127.0.0.1 made by the openssl command
/// (installed by deploy/scripts/install-test-deps.sh).
fn certificate(dir: &std::path::Path) -> (PathBuf, PathBuf) {
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    let status = std::process::Command::new("openssl")
        .args(["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"])
        .args(["-nodes", "-days", "1", "-subj", "/CN=localhost"])
        .args(["-addext", "subjectAltName=IP:127.0.0.1"])
        .args(["-addext", "basicConstraints=critical,CA:FALSE"])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .stderr(std::process::Stdio::null())
        .status()
        .expect("openssl: run deploy/scripts/install-test-deps.sh");
    assert!(status.success());
    (cert, key)
}

#[tokio::test]
async fn devices_can_publish_over_tls() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = certificate(dir.path());
    let mut config = config(&[]);
    config.tls_cert_file = Some(cert.clone());
    config.tls_key_file = Some(key);
    let running = start(&config, Arc::new(MemoryBuffer::new()));

    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(&cert).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let mut options = MqttOptions::new("tls", "127.0.0.1", running.addr.port());
    options
        .set_transport(rumqttc::Transport::Tls(rumqttc::TlsConfiguration::Rustls(Arc::new(tls))));
    let (client, mut eventloop) = AsyncClient::new(options, 10);
    for seq in 0..5 {
        let payload = format!("{{\"seq\": {seq}}}");
        client.publish("readers/r1/tags", QoS::AtLeastOnce, false, payload).await.unwrap();
    }
    assert_eq!(tokio::time::timeout(WAIT, acks(&mut eventloop, 5)).await.unwrap(), Ok(5));
    assert_eq!(running.buffer.stats().appended_total, 5);

    // Plain MQTT to the TLS port gets nowhere.
    let (_plain, mut eventloop) = client_of(running.addr, "plain", None);
    assert!(tokio::time::timeout(WAIT, eventloop.poll()).await.unwrap().is_err());

    // Half a TLS configuration is a problem with its key.
    let half =
        MqttIngestConfig { tls_key_file: Some("key.pem".into()), ..MqttIngestConfig::default() };
    assert!(half.problems().iter().any(|p| p.starts_with("tls_cert_file:")));
    running.stop.cancel();
    tokio::time::timeout(WAIT, running.task).await.unwrap().unwrap().unwrap();
}

proptest::proptest! {
    /// Whatever bytes a device sends, framing them answers without
    /// panicking (the endpoint reads untrusted devices with this codec).
    #[test]
    fn the_codec_never_panics_on_device_bytes(
        bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..300),
        first in 0u8..=255,
    ) {
        let mut buf = BytesMut::new();
        buf.extend_from_slice(&[first]);
        buf.extend_from_slice(&bytes);
        for _ in 0..100 {
            match Packet::read(&mut buf, 1024) {
                Ok(_) => {}
                Err(_) => break,
            }
        }
    }
}

/// A packet too large for a connection to hold on its own waits for room
/// in `packet_memory` before it is read on: with room for one such packet,
/// a second device's waits, unread and unacknowledged, until the first
/// device's packet is stored.
#[tokio::test]
async fn large_packets_wait_for_packet_memory() {
    let config = MqttIngestConfig {
        max_payload: ByteSize::mib(1),
        packet_memory: ByteSize::mib(1),
        ..config(&[])
    };
    let running = start(&config, Arc::new(MemoryBuffer::new()));
    let room = running.shared.packet_memory.available_permits();
    let large = |seq: u64| {
        let payload = format!("{{\"seq\": {seq}, \"pad\": \"{}\"}}", "x".repeat(600 << 10));
        let mut publish = Publish::new("readers/r1/tags", QoS::AtLeastOnce, payload);
        publish.pkid = 1;
        let mut bytes = BytesMut::new();
        Packet::Publish(publish).write(&mut bytes, usize::MAX).unwrap();
        bytes
    };
    let (first_packet, second_packet) = (large(1), large(2));
    let mut first = RawDevice::connect(running.addr, "first", true).await;
    let mut second = RawDevice::connect(running.addr, "second", true).await;
    let half = first_packet.len() / 2;
    first.stream.write_all(&first_packet[..half]).await.unwrap();
    let reserved = room - first_packet.len();
    tokio::time::timeout(WAIT, async {
        while running.shared.packet_memory.available_permits() != reserved {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("room reserved for the first packet");
    // The second packet, whole: more than the kernel's buffers may take
    // while it is not read, so written by a task of its own.
    let (mut second_reader, mut second_writer) = second.stream.into_split();
    let writing = tokio::spawn(async move { second_writer.write_all(&second_packet).await });
    let mut second_buf = std::mem::take(&mut second.buf);
    let early = tokio::time::timeout(
        Duration::from_millis(300),
        read_packet(&mut second_reader, &mut second_buf, usize::MAX),
    )
    .await;
    assert!(early.is_err(), "the second packet was taken in without room: {early:?}");
    assert_eq!(running.health.to_json()["received_total"], 0);
    first.stream.write_all(&first_packet[half..]).await.unwrap();
    assert!(matches!(first.read().await, Packet::PubAck(a) if a.pkid == 1));
    let acked = read_packet(&mut second_reader, &mut second_buf, usize::MAX);
    let acked = tokio::time::timeout(WAIT, acked).await.unwrap().unwrap();
    assert!(matches!(&acked, Packet::PubAck(a) if a.pkid == 1), "{acked:?}");
    writing.await.unwrap().unwrap();
    let records = running.buffer.read(1, 10, usize::MAX).await.unwrap();
    let readings: Vec<i64> = records.iter().map(|r| seq_of(&r.payload)).collect();
    assert_eq!(readings, [1, 2], "stored in the order room was made");
    assert_eq!(running.shared.packet_memory.available_permits(), room, "all room given back");
    running.stop.cancel();
    tokio::time::timeout(WAIT, running.task).await.unwrap().unwrap().unwrap();
}

/// Health counts the devices connected, and those turned away past
/// `max_connections`, which the endpoint closes at once.
#[tokio::test]
async fn connections_are_counted_and_those_past_the_limit_refused() {
    let running = start(&MqttIngestConfig { max_connections: 2, ..config(&[]) }, {
        Arc::new(MemoryBuffer::new())
    });
    let health = |key: &str| running.health.to_json()[key].as_u64().unwrap();
    let until = async |key: &str, n: u64| {
        tokio::time::timeout(WAIT, async {
            while health(key) != n {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("{key} never reached {n}"));
    };
    let first = RawDevice::connect(running.addr, "first", true).await;
    let _second = RawDevice::connect(running.addr, "second", true).await;
    assert_eq!(health("connections"), 2);
    let mut third = TcpStream::connect(running.addr).await.unwrap();
    let mut reply = Vec::new();
    let _ = tokio::time::timeout(WAIT, third.read_to_end(&mut reply)).await.unwrap();
    assert!(reply.is_empty(), "closed unanswered: {reply:?}");
    assert_eq!(health("connections_refused_total"), 1);
    drop(first);
    until("connections", 1).await;
    let _again = RawDevice::connect(running.addr, "first", true).await;
    assert_eq!(health("connections"), 2);
    running.stop.cancel();
    tokio::time::timeout(WAIT, running.task).await.unwrap().unwrap().unwrap();
    assert_eq!(running.health.to_json()["connections"], 0, "all closed at shutdown");
}

/// A CONNECT past a chunk closes the connection unanswered: before its
/// login a device gets no more memory than that.
#[tokio::test]
async fn a_connect_past_a_chunk_is_refused() {
    let running = start(&config(&[]), Arc::new(MemoryBuffer::new()));
    for (will, answered) in [(READ_CHUNK - 100, true), (READ_CHUNK + 1, false)] {
        let mut connect = rumqttc::Connect::new("willing");
        connect.last_will =
            Some(rumqttc::LastWill::new("t", vec![b'w'; will], QoS::AtMostOnce, false));
        let mut hello = BytesMut::new();
        Packet::Connect(connect).write(&mut hello, usize::MAX).unwrap();
        let mut stream = TcpStream::connect(running.addr).await.unwrap();
        stream.write_all(&hello).await.unwrap();
        stream.shutdown().await.unwrap();
        let mut reply = Vec::new();
        // Closed with bytes unread, the connection may be reset.
        let _ = tokio::time::timeout(WAIT, stream.read_to_end(&mut reply)).await.unwrap();
        assert_eq!(reply.starts_with(&[0x20, 0x02]), answered, "a will of {will} bytes: {reply:?}");
    }
    running.stop.cancel();
    tokio::time::timeout(WAIT, running.task).await.unwrap().unwrap().unwrap();
}

/// Scanning tells whole packets from the one still arriving, and how long
/// that one is once its header is in; scanning on counts the same.
#[test]
fn scans_find_whole_packets_and_the_length_of_the_next() {
    let mut bytes = BytesMut::new();
    for payload in [vec![b'a'; 10], vec![b'b'; 200]] {
        let publish = Publish::new("t", QoS::AtMostOnce, payload);
        Packet::Publish(publish).write(&mut bytes, usize::MAX).unwrap();
    }
    let two = bytes.len();
    let large = Publish::new("t", QoS::AtMostOnce, vec![b'c'; 100_000]);
    Packet::Publish(large).write(&mut bytes, usize::MAX).unwrap();
    let frame = bytes.len() - two;
    let seen = scan(&bytes[..two + 4], 1 << 20, 10);
    assert_eq!((seen.complete, seen.end, seen.next), (2, two, frame));
    assert_eq!(scan(&bytes[..two + 3], 1 << 20, 10).next, 4, "header not all in yet");
    assert_eq!(scan(&bytes[..two + 3], 1 << 20, 1).complete, 1, "at most as asked");
    let on = scan_on(scan(&bytes[..two - 1], 1 << 20, 10), &bytes, 1 << 20, 10);
    assert_eq!((on.complete, on.end), (3, bytes.len()));
    assert!(scan(&bytes, 1000, 10).bad.is_some(), "past the largest packet");
}

#[test]
fn batch_slots_are_validated() {
    let problems = MqttIngestConfig { max_concurrent_batches: 0, ..config(&[]) }.problems();
    assert_eq!(problems, ["max_concurrent_batches: must be 1 to 10000"]);
    // Its connection permits: tokio's semaphore panics past 2^61.
    let problems = MqttIngestConfig { max_connections: usize::MAX, ..config(&[]) }.problems();
    assert_eq!(problems, ["max_connections: must be 1 to 100000"]);
    assert!(config(&[]).problems().is_empty());
}

/// A run held to be told copies or new is decided at a batch's count or
/// at the read-ahead's bytes, not only when its wait is over: a device
/// replaying large messages must not make its connection hold up to
/// `batch_max` of them.
#[test]
fn held_publishes_are_bounded_in_count_and_bytes() {
    let publish = |bytes: usize| {
        Publish::new("readers/r1/tags", QoS::AtLeastOnce, Bytes::from(vec![b'x'; bytes]))
    };
    let small = vec![publish(100); 3];
    assert!(!held_is_full(&small, 4));
    assert!(held_is_full(&small, 3));
    let half = READ_AHEAD / 2 + 1;
    assert!(!held_is_full(&[publish(half)], 1000));
    assert!(held_is_full(&[publish(half), publish(half)], 1000));
    assert!(held_is_full(&[publish(READ_AHEAD)], 1000));
}
