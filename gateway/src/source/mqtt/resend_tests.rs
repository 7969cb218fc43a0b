//! Messages a real Mosquitto sends again although they are stored already
//! are stored once: after a source dies while its batch is being stored,
//! after the power goes then, and after connections cut while reads flow,
//! when the broker has not read the acks in flight.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use prost::Message as _;
use rumqttc::{AsyncClient, Event, MqttOptions, Outgoing};

use super::mosquitto::Mosquitto;
use super::*;
use crate::buffer::{Buffer, MemoryBuffer};
use crate::source::SourceHealth;

/// Bound of every wait here.
const WAIT: Duration = Duration::from_secs(30);

const READS: u64 = 120;

/// A source of `test`'s own (client id and topics), so that tests that
/// end up on one broker (a port taken between picking and binding it) do
/// not mix.
fn config(broker: &str, test: &str) -> MqttSourceConfig {
    let rule: RuleConfig = toml::from_str(&format!(
        "topic = \"{test}/{{r}}/tags\"\nevent = \"rfid.tag.read\"\n\
         actor = {{ type = \"rfid_reader\", id = \"{{r}}\" }}\nproperties = {{ seq = \"{{/seq}}\" }}"
    ))
    .unwrap();
    MqttSourceConfig {
        name: "floor".into(),
        broker: broker.into(),
        client_id: format!("source-{test}"),
        batch_max: 8,
        rules: vec![rule],
        ..MqttSourceConfig::default()
    }
}

/// Runs a source on `runtime` until it stops.
async fn start(
    config: &MqttSourceConfig,
    state: &Path,
    buffer: Arc<dyn Buffer>,
    runtime: &tokio::runtime::Handle,
) -> (tokio::task::JoinHandle<Result<()>>, Arc<SourceHealth>, CancellationToken) {
    let state = crate::buffer::BufferConfig::with_dir(state);
    let source = MqttSource::build(config, None, "sources.mqtt[0]", Some(&state)).unwrap();
    let health = Arc::new(SourceHealth::new(&config.name, "mqtt"));
    let intake = Intake::new(buffer, Arc::clone(&health), Duration::MAX);
    let shutdown = CancellationToken::new();
    let task = runtime.spawn(Box::new(source).run(intake, shutdown.clone()));
    let deadline = tokio::time::Instant::now() + WAIT;
    while !health.connected() {
        assert!(tokio::time::Instant::now() < deadline, "the source did not subscribe");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    (task, health, shutdown)
}

/// How a [`HeldBuffer`] holds its first append.
enum Hold {
    /// Until notified, then it appends.
    Until(Arc<tokio::sync::Notify>),
    /// It appends, says so, and never returns: as when the process dies in
    /// the append's fsync.
    Forever(tokio::sync::oneshot::Sender<()>),
}

/// A buffer whose first append may be held; the others yield once and
/// go through.
struct HeldBuffer {
    inner: Arc<dyn Buffer>,
    hold: std::sync::Mutex<Option<Hold>>,
}

impl HeldBuffer {
    fn over(inner: &Arc<dyn Buffer>, hold: Hold) -> Arc<dyn Buffer> {
        Arc::new(HeldBuffer { inner: Arc::clone(inner), hold: Some(hold).into() })
    }

    fn yielding(inner: &Arc<dyn Buffer>) -> Arc<dyn Buffer> {
        Arc::new(HeldBuffer { inner: Arc::clone(inner), hold: None.into() })
    }
}

#[async_trait]
impl Buffer for HeldBuffer {
    async fn append(&self, records: Vec<Bytes>) -> Result<std::ops::RangeInclusive<u64>> {
        let hold = self.hold.lock().unwrap().take();
        match hold {
            None => {
                // As the log buffer's append does (it waits for its group
                // commit): the poller may see a connection end meanwhile.
                tokio::task::yield_now().await;
                self.inner.append(records).await
            }
            Some(Hold::Until(open)) => {
                open.notified().await;
                self.inner.append(records).await
            }
            Some(Hold::Forever(stalled)) => {
                let _ = self.inner.append(records).await;
                let _ = stalled.send(());
                std::future::pending().await
            }
        }
    }
    async fn read(
        &self,
        from: u64,
        max: usize,
        bytes: usize,
    ) -> Result<Vec<crate::buffer::Record>> {
        self.inner.read(from, max, bytes).await
    }
    async fn ack(&self, up_to: u64) -> Result<()> {
        self.inner.ack(up_to).await
    }
    fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.inner.subscribe()
    }
    fn stats(&self) -> crate::buffer::BufferStats {
        self.inner.stats()
    }
    async fn close(&self) -> Result<()> {
        self.inner.close().await
    }
}

/// Publishes `n` reads with QoS 1 and returns once the broker has them all.
async fn publish(addr: SocketAddr, n: u64, test: &'static str) {
    publish_seqs(addr, 0..n, test, false).await;
}

/// Publishes the reads `seqs` with QoS 1, retained or not, to one topic;
/// returns once the broker has them all.
async fn publish_seqs(
    addr: SocketAddr,
    seqs: std::ops::Range<u64>,
    test: &'static str,
    retain: bool,
) {
    publish_on(addr, format!("{test}/r1/tags"), seqs, test, retain).await;
}

/// [`publish_seqs`] on `topic`.
async fn publish_on(
    addr: SocketAddr,
    topic: String,
    seqs: std::ops::Range<u64>,
    test: &'static str,
    retain: bool,
) {
    let n = seqs.end - seqs.start;
    let mut options =
        MqttOptions::new(format!("device-{test}"), addr.ip().to_string(), addr.port());
    options.set_keep_alive(Duration::from_secs(5));
    let (client, mut eventloop) = AsyncClient::new(options, 256);
    let publisher = tokio::spawn(async move {
        for seq in seqs {
            let payload = format!("{{\"seq\": {seq}}}");
            client.publish(topic.clone(), QoS::AtLeastOnce, retain, payload).await.unwrap();
        }
    });
    let mut acked = 0;
    tokio::time::timeout(WAIT, async {
        while acked < n {
            match eventloop.poll().await {
                Ok(Event::Incoming(rumqttc::Packet::PubAck(_))) => acked += 1,
                Ok(Event::Outgoing(Outgoing::Disconnect)) => break,
                Ok(_) => {}
                Err(e) => panic!("device: {e}"),
            }
        }
    })
    .await
    .expect("the broker did not take every read");
    publisher.await.unwrap();
}

/// A real Mosquitto on a free loopback port, killed when dropped.
async fn mosquitto(dir: &Path) -> (Mosquitto, SocketAddr) {
    let broker = Mosquitto::start(dir, &[], "", &[]).await.expect("mosquitto");
    let addr = SocketAddr::from(([127, 0, 0, 1], broker.port));
    (broker, addr)
}

/// A TCP proxy to `upstream`. `cut` ends every connection open at the
/// time, dropping what the source had not passed on; of the broker's, the
/// next bytes it sends (several messages, while reads flow) reach the
/// source together with the end of the stream (in one poll of this task:
/// the tests run on one thread). Its client then reads messages and the
/// loss of their connection at once, as when a link fails under load.
/// Returns its address and the number of connections it has opened.
async fn proxy(
    upstream: SocketAddr,
    cut: Arc<tokio::sync::Notify>,
) -> (SocketAddr, tokio::sync::watch::Receiver<u64>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (opened, connections) = tokio::sync::watch::channel(0);
    tokio::spawn(async move {
        while let Ok((near, _)) = listener.accept().await {
            let Ok(far) = tokio::net::TcpStream::connect(upstream).await else { continue };
            // Counted once it hears cuts: a cut sent on seeing the count
            // reaches it.
            let cut = Arc::clone(&cut).notified_owned();
            opened.send_modify(|n| *n += 1);
            tokio::spawn(async move {
                let (mut near_rx, mut near_tx) = near.into_split();
                let (mut far_rx, mut far_tx) = far.into_split();
                let (stop_up, stopped) = tokio::sync::oneshot::channel::<()>();
                let mut stop_up = Some(stop_up);
                tokio::spawn(async move {
                    tokio::select! {
                        _ = tokio::io::copy(&mut near_rx, &mut far_tx) => {}
                        _ = stopped => {}
                    }
                    drop(far_tx);
                    // What the source sends from now on is lost, but read:
                    // closing with it unread would reset the connection,
                    // and the source would lose what it has not read yet.
                    let mut lost = tokio::io::sink();
                    let drain = tokio::io::copy(&mut near_rx, &mut lost);
                    let _ = tokio::time::timeout(WAIT, drain).await;
                });
                tokio::pin!(cut);
                let mut chunk = vec![0; 64 * 1024];
                loop {
                    tokio::select! {
                        read = far_rx.read(&mut chunk) => match read {
                            Ok(n) if n > 0 && near_tx.write_all(&chunk[..n]).await.is_ok() => {}
                            _ => break,
                        },
                        () = cut.as_mut() => {
                            // The source's acks are lost from the cut on,
                            // not after the hold: forwarded meanwhile,
                            // they would leave the broker nothing to send
                            // again, depending on how tasks interleave.
                            if let Some(stop) = stop_up.take() {
                                let _ = stop.send(());
                            }
                            // A few messages (the broker's in-flight
                            // window allows more) and then the end.
                            let mut held = Vec::new();
                            let hold = async {
                                while held.len() < 256 {
                                    match far_rx.read(&mut chunk).await {
                                        Ok(n) if n > 0 => held.extend_from_slice(&chunk[..n]),
                                        _ => break,
                                    }
                                }
                            };
                            let _ = tokio::time::timeout(Duration::from_secs(2), hold).await;
                            let _ = near_tx.write_all(&held).await;
                            break;
                        }
                    }
                }
                if let Some(stop) = stop_up {
                    let _ = stop.send(());
                }
            });
        }
    });
    (addr, connections)
}

/// What [`closing_on_unsubscribe`] does with a client's UNSUBSCRIBE.
#[derive(Clone, Copy)]
enum OnBarrier {
    /// Closes the connection, as a broker that refuses an UNSUBSCRIBE of a
    /// filter never subscribed may.
    Close,
    /// On each of the first `n` connections, loses the client's PUBACKs
    /// and cuts the connection at the UNSUBSCRIBE, as a link that fails
    /// before the broker reads them does (or at the ninth lost PUBACK:
    /// a source that sends no barrier fails all the same); then passes
    /// everything.
    CutLosingAcks(u32),
}

/// A TCP proxy to `upstream` that closes the connection, both sides, when
/// the client sends an UNSUBSCRIBE (see [`OnBarrier`]); returns how many
/// it closed so.
async fn closing_on_unsubscribe(
    upstream: SocketAddr,
    on_barrier: OnBarrier,
) -> (SocketAddr, Arc<std::sync::atomic::AtomicU32>) {
    use std::sync::atomic::{AtomicU32, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    const PUBACK: u8 = 4;
    const UNSUBSCRIBE: u8 = 10;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let closes = Arc::new(AtomicU32::new(0));
    let counted = Arc::clone(&closes);
    tokio::spawn(async move {
        let mut accepted = 0;
        while let Ok((near, _)) = listener.accept().await {
            let Ok(far) = tokio::net::TcpStream::connect(upstream).await else { continue };
            accepted += 1;
            let (closing, losing_acks) = match on_barrier {
                OnBarrier::Close => (true, false),
                OnBarrier::CutLosingAcks(n) => (accepted <= n, accepted <= n),
            };
            let closes = Arc::clone(&counted);
            tokio::spawn(async move {
                let (mut near_rx, mut near_tx) = near.into_split();
                let (mut far_rx, mut far_tx) = far.into_split();
                let down = async {
                    let _ = tokio::io::copy(&mut far_rx, &mut near_tx).await;
                };
                let up = async {
                    let mut buf = bytes::BytesMut::new();
                    let mut acks_lost = 0;
                    loop {
                        while let Ok(header) = rumqttc::mqttbytes::check(buf.iter(), usize::MAX) {
                            let packet = buf.split_to(header.frame_length());
                            let lost = losing_acks && packet[0] >> 4 == PUBACK;
                            acks_lost += u32::from(lost);
                            if closing && (packet[0] >> 4 == UNSUBSCRIBE || acks_lost > 8) {
                                closes.fetch_add(1, Ordering::SeqCst);
                                // Closed without a reset, the broker reads
                                // what came before: it closes on the end
                                // of our stream, which ends `down`.
                                let _ = far_tx.shutdown().await;
                                let _ = tokio::io::copy(&mut near_rx, &mut tokio::io::sink()).await;
                                return;
                            }
                            if lost {
                                continue;
                            }
                            if far_tx.write_all(&packet).await.is_err() {
                                return;
                            }
                        }
                        match near_rx.read_buf(&mut buf).await {
                            Ok(n) if n > 0 => {}
                            _ => return,
                        }
                    }
                };
                tokio::select! {
                    () = down => {}
                    () = up => {}
                }
            });
        }
    });
    (addr, closes)
}

/// How often each read is in the buffer, once all `n` are there.
async fn stored(buffer: &Arc<dyn Buffer>, n: u64) -> BTreeMap<i64, usize> {
    let mut watermark = buffer.subscribe();
    tokio::time::timeout(WAIT, async {
        let (mut counts, mut next) = (BTreeMap::new(), 0);
        loop {
            for r in buffer.read(next, usize::MAX, usize::MAX).await.unwrap() {
                next = r.seq + 1;
                let event = opgraph_proto::pb::Event::decode(r.payload).unwrap();
                let event = opgraph_proto::Event::from_pb(event, 0).unwrap();
                let seq = event.properties.unwrap()["seq"].as_i64().unwrap();
                *counts.entry(seq).or_default() += 1;
            }
            if counts.len() as u64 == n {
                return counts;
            }
            watermark.changed().await.unwrap();
        }
    })
    .await
    .expect("not every read was stored")
}

#[tokio::test]
async fn a_batch_stored_as_the_process_died_and_sent_again_is_stored_once() {
    let dir = tempfile::tempdir().unwrap();
    let (_mosquitto, addr) = mosquitto(dir.path()).await;
    let config = config(&format!("mqtt://{addr}"), "crash");
    let buffer: Arc<dyn Buffer> = Arc::new(MemoryBuffer::new());
    // The first source runs on a runtime of its own: dropping that runtime
    // drops its tasks and connection at once, as a crash does.
    let doomed =
        tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let (stalled_tx, stalled) = tokio::sync::oneshot::channel();
    let held = HeldBuffer::over(&buffer, Hold::Forever(stalled_tx));
    let (_task, _, _) = start(&config, dir.path(), held, doomed.handle()).await;
    publish(addr, READS, "crash").await;
    tokio::time::timeout(WAIT, stalled).await.unwrap().unwrap();
    doomed.shutdown_background();
    let stored_first = buffer.stats().appended_total;
    assert!(stored_first > 0, "the first source stored nothing");

    let here = tokio::runtime::Handle::current();
    let (task, second, shutdown) = start(&config, dir.path(), Arc::clone(&buffer), &here).await;
    let counts = stored(&buffer, READS).await;
    let twice: Vec<_> = counts.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "stored twice: {twice:?}");
    let health = second.to_json();
    assert_eq!(health["resent_total"].as_u64().unwrap(), stored_first, "{health}");
    assert_eq!(health["accepted_total"].as_u64().unwrap() + stored_first, READS, "{health}");
    shutdown.cancel();
    tokio::time::timeout(WAIT, task).await.unwrap().unwrap().unwrap();
    // Every ack was covered by a barrier before the clean stop: the next
    // run expects nothing again.
    let left = Redelivery::open(&Redelivery::path(dir.path(), &config.name), "test", false);
    assert_eq!((left.remembered(), left.interrupted_append()), (0, None));
}

/// Power cut: a batch's append is durable, its PUBACKs unsent, and the
/// power goes. The list naming the batch was synced before the append, so
/// the next run, on what the disk held, recognises the broker's copies;
/// unsynced, the list would be missing and the copies stored again.
#[tokio::test]
async fn a_batch_stored_as_the_power_went_and_sent_again_is_stored_once() {
    let disk = match super::loop_disk::LoopDisk::format(64) {
        Ok(disk) => disk,
        Err(reason) => {
            println!("skipping the power-cut test: {reason} (needs root and loop devices)");
            return;
        }
    };
    let dir = tempfile::tempdir().unwrap();
    let (_mosquitto, addr) = mosquitto(dir.path()).await;
    let config = config(&format!("mqtt://{addr}"), "power");
    let state = disk.path().join("buffer");
    let open = |dir: &Path| crate::buffer::LogBuffer::open(BufferConfig::with_dir(dir));
    let buffer: Arc<dyn Buffer> = Arc::new(open(&state).await.unwrap());
    let doomed =
        tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let (stalled_tx, stalled) = tokio::sync::oneshot::channel();
    let held = HeldBuffer::over(&buffer, Hold::Forever(stalled_tx));
    let (_task, _, _) = start(&config, &state, held, doomed.handle()).await;
    publish(addr, READS, "power").await;
    tokio::time::timeout(WAIT, stalled).await.unwrap().unwrap();
    let after_cut = disk.cut().unwrap();
    doomed.shutdown_background();
    let stored_first = buffer.stats().appended_total;
    assert!(stored_first > 0, "the first source stored nothing");

    let state = after_cut.path().join("buffer");
    let buffer: Arc<dyn Buffer> = Arc::new(open(&state).await.unwrap());
    let here = tokio::runtime::Handle::current();
    let (task, second, shutdown) = start(&config, &state, Arc::clone(&buffer), &here).await;
    let counts = stored(&buffer, READS).await;
    let twice: Vec<_> = counts.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "stored twice: {twice:?}");
    let health = second.to_json();
    assert_eq!(health["resent_total"].as_u64().unwrap(), stored_first, "{health}");
    shutdown.cancel();
    tokio::time::timeout(WAIT, task).await.unwrap().unwrap().unwrap();
    buffer.close().await.unwrap();
}

#[tokio::test]
async fn reads_sent_again_after_cut_connections_are_stored_once() {
    cut_while_reads_flow(MqttProtocol::V311).await;
}

#[tokio::test]
async fn reads_sent_again_after_cut_connections_are_stored_once_over_mqtt5() {
    cut_while_reads_flow(MqttProtocol::V5).await;
}

async fn cut_while_reads_flow(protocol: MqttProtocol) {
    const N: u64 = 5_000;
    const CUTS: u64 = 5;
    let dir = tempfile::tempdir().unwrap();
    let (_mosquitto, addr) = mosquitto(dir.path()).await;
    let cut = Arc::new(tokio::sync::Notify::new());
    let test = match protocol {
        MqttProtocol::V311 => "cut",
        MqttProtocol::V5 => "cut5",
    };
    let (proxied, mut connections) = proxy(addr, Arc::clone(&cut)).await;
    let mut config = config(&format!("mqtt://{proxied}"), test);
    config.protocol = protocol;
    config.backoff_initial = Duration::from_millis(20);
    config.backoff_max = Duration::from_millis(50);
    let buffer: Arc<dyn Buffer> = Arc::new(MemoryBuffer::new());
    let here = tokio::runtime::Handle::current();
    let yielding = HeldBuffer::yielding(&buffer);
    let (task, health, shutdown) = start(&config, dir.path(), yielding, &here).await;
    let device = tokio::spawn(publish(addr, N, test));
    // Cut whenever another 800 reads were stored, while they flow, each
    // time on a new connection: the source may store a backlog (up to its
    // receive maximum over MQTT 5) after a cut, and a cut while it is not
    // connected would cut nothing.
    let mut cuts = 0;
    let mut watermark = buffer.subscribe();
    tokio::time::timeout(WAIT, async {
        while cuts < CUTS {
            tokio::select! {
                changed = watermark.changed() => changed.unwrap(),
                changed = connections.changed() => changed.unwrap(),
            }
            let connected = *connections.borrow() > cuts;
            if connected && buffer.stats().appended_total > (cuts + 1) * 800 {
                cut.notify_waiters();
                cuts += 1;
            }
        }
    })
    .await
    .expect("reads stopped flowing");
    let counts = stored(&buffer, N).await;
    let twice: Vec<_> = counts.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "{} stored twice: {twice:?}", twice.len());
    let health = health.to_json();
    assert!(health["resent_total"].as_u64().unwrap() > 0, "{health}");
    assert_eq!(health["accepted_total"].as_u64().unwrap(), N, "{health}");
    device.await.unwrap();
    shutdown.cancel();
    tokio::time::timeout(WAIT, task).await.unwrap().unwrap().unwrap();
}

/// A backlog far beyond any in-flight setting: Mosquitto sends the source
/// thousands of messages unacknowledged while its first append waits, and
/// its acks then pile up faster than rumqttc writes them. Queuing an ack
/// must not wait for that (the source used to stop for good once 4,096
/// were queued: the processor waited on the poller and the poller on the
/// processor).
#[tokio::test]
async fn a_backlog_of_unacknowledged_messages_does_not_stop_the_source() {
    const N: u64 = 20_000;
    let dir = tempfile::tempdir().unwrap();
    let (_mosquitto, addr) = mosquitto(dir.path()).await;
    let mut config = config(&format!("mqtt://{addr}"), "backlog");
    config.batch_max = 256;
    let buffer: Arc<dyn Buffer> = Arc::new(MemoryBuffer::new());
    let open = Arc::new(tokio::sync::Notify::new());
    let held = HeldBuffer::over(&buffer, Hold::Until(Arc::clone(&open)));
    let here = tokio::runtime::Handle::current();
    let (task, health, shutdown) = start(&config, dir.path(), held, &here).await;
    publish(addr, N, "backlog").await;
    open.notify_one();
    let counts = stored(&buffer, N).await;
    assert_eq!(counts.len() as u64, N);
    assert_eq!(health.to_json()["accepted_total"], N);
    shutdown.cancel();
    tokio::time::timeout(WAIT, task).await.unwrap().unwrap().unwrap();
}

/// Publishes `n` reads through [`closing_on_unsubscribe`] to a source
/// that reconnects at once; returns how often each was stored, how many
/// connections the proxy closed and the source's health.
async fn through_closing_proxy(
    on_barrier: OnBarrier,
    n: u64,
    test: &'static str,
) -> (BTreeMap<i64, usize>, u32, serde_json::Value) {
    let dir = tempfile::tempdir().unwrap();
    let (_mosquitto, addr) = mosquitto(dir.path()).await;
    let (proxied, closes) = closing_on_unsubscribe(addr, on_barrier).await;
    let mut config = config(&format!("mqtt://{proxied}"), test);
    config.backoff_initial = Duration::from_millis(20);
    config.backoff_max = Duration::from_millis(50);
    let buffer: Arc<dyn Buffer> = Arc::new(MemoryBuffer::new());
    let here = tokio::runtime::Handle::current();
    let (task, health, shutdown) = start(&config, dir.path(), Arc::clone(&buffer), &here).await;
    publish(addr, n, test).await;
    let counts = stored(&buffer, n).await;
    shutdown.cancel();
    tokio::time::timeout(WAIT, task).await.unwrap().unwrap().unwrap();
    (counts, closes.load(std::sync::atomic::Ordering::SeqCst), health.to_json())
}

/// A broker that closes the connection on a barrier instead of answering
/// it would cost a reconnect per batch: after three connections in a row
/// end so, the source stops sending barriers (and recognising resends),
/// and the reads flow on one connection.
#[tokio::test]
async fn a_broker_that_closes_the_connection_on_a_barrier_is_given_up_on() {
    const N: u64 = 2_000;
    // At least once: every read is there (the few the broker sent again
    // after the three closes may be there twice).
    let (counts, closed, health) = through_closing_proxy(OnBarrier::Close, N, "strict").await;
    assert_eq!(counts.len() as u64, N);
    assert_eq!(closed, redelivery::CLOSED_ON_BARRIER, "{health}");
    assert_eq!(health["resend_check_given_up"], true, "{health}");
}

/// A link that fails again and again before the broker reads the acks and
/// the barrier after them is not a broker that closes the connection on a
/// barrier: the broker sends those messages again, and the source goes on
/// recognising them (given up on, it stored them twice).
#[tokio::test]
async fn connections_cut_before_the_broker_read_the_barrier_are_not_given_up_on() {
    const CUTS: u32 = 2 * redelivery::CLOSED_ON_BARRIER;
    let (counts, closed, health) =
        through_closing_proxy(OnBarrier::CutLosingAcks(CUTS), 500, "flaky").await;
    let twice: Vec<_> = counts.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "{} stored twice: {twice:?}", twice.len());
    assert_eq!(closed, CUTS);
    assert!(health["resent_total"].as_u64().unwrap() > 0, "{health}");
    assert_eq!(health["resend_check_given_up"], false, "{health}");
}

#[tokio::test]
async fn retained_values_are_stored_once_across_sessions() {
    retained_across_sessions(MqttProtocol::V311, true, "retained").await;
}

#[tokio::test]
async fn retained_values_are_stored_once_across_sessions_over_mqtt5() {
    // And without the resend check, whose path skips them too.
    retained_across_sessions(MqttProtocol::V5, false, "retained5").await;
}

/// Mosquitto sends a topic's retained message, flagged, on every SUBSCRIBE,
/// and the source subscribes on every connection: on a resumed session
/// that is a value the session brought already (stored once); on a new
/// session it may be news (stored). `retained` changes both.
async fn retained_across_sessions(protocol: MqttProtocol, resends: bool, test: &'static str) {
    let dir = tempfile::tempdir().unwrap();
    let (_mosquitto, addr) = mosquitto(dir.path()).await;
    let mut config = config(&format!("mqtt://{addr}"), test);
    config.protocol = protocol;
    config.recognise_resends = resends;
    let buffer: Arc<dyn Buffer> = Arc::new(MemoryBuffer::new());
    let here = tokio::runtime::Handle::current();
    let run = |config: MqttSourceConfig| {
        let (dir, buffer, here) = (dir.path().to_owned(), Arc::clone(&buffer), here.clone());
        async move { start(&config, &dir, buffer, &here).await }
    };
    let stop = |(task, health, shutdown): (
        tokio::task::JoinHandle<Result<()>>,
        Arc<SourceHealth>,
        CancellationToken,
    )| async move {
        shutdown.cancel();
        tokio::time::timeout(WAIT, task).await.unwrap().unwrap().unwrap();
        health.to_json()
    };

    // Read 0 is retained before the source's first session: news to it.
    // Read 1, retained too, is published while it is subscribed (and
    // forwarded unflagged); it replaces 0 as the topic's retained value.
    publish_seqs(addr, 0..1, test, true).await;
    let first = run(config.clone()).await;
    publish_seqs(addr, 1..2, test, true).await;
    assert_eq!(stored(&buffer, 2).await, BTreeMap::from([(0, 1), (1, 1)]));
    let health = stop(first).await;
    assert_eq!(health["retained_replayed_total"], 0, "{health}");

    // The session resumes: read 1 comes again, flagged, before read 2.
    let second = run(config.clone()).await;
    publish_seqs(addr, 2..3, test, false).await;
    assert_eq!(stored(&buffer, 3).await, BTreeMap::from([(0, 1), (1, 1), (2, 1)]));
    let health = stop(second).await;
    assert_eq!(health["retained_replayed_total"], 1, "{health}");
    assert_eq!(health["accepted_total"], 1, "{health}");

    // `always` stores it on every connection.
    config.retained = Retained::Always;
    let third = run(config.clone()).await;
    publish_seqs(addr, 3..4, test, false).await;
    assert_eq!(stored(&buffer, 4).await, BTreeMap::from([(0, 1), (1, 2), (2, 1), (3, 1)]));
    assert_eq!(stop(third).await["retained_replayed_total"], 0);

    // `never` stores it not even on a new session (another client id).
    config.retained = Retained::Never;
    config.client_id = format!("{}-new", config.client_id);
    let fourth = run(config.clone()).await;
    publish_seqs(addr, 4..5, test, false).await;
    let counts = stored(&buffer, 5).await;
    assert_eq!(counts, BTreeMap::from([(0, 1), (1, 2), (2, 1), (3, 1), (4, 1)]));
    assert_eq!(stop(fourth).await["retained_replayed_total"], 1);
}

/// A broker keeps a session's subscriptions: a rule removed from the
/// configuration would go on bringing its messages on every resumed
/// session (each rejected as `no_rule`). The source unsubscribes what it no
/// longer wants; and a filter added later is new to the session, so the
/// retained value it matches is stored.
#[tokio::test]
async fn the_session_follows_the_configured_filters() {
    const TEST: &str = "filters";
    let dir = tempfile::tempdir().unwrap();
    let (_mosquitto, addr) = mosquitto(dir.path()).await;
    let tags = config(&format!("mqtt://{addr}"), TEST);
    let mut both = tags.clone();
    let temps: RuleConfig = toml::from_str(&format!(
        "topic = \"{TEST}/{{r}}/temps\"\nevent = \"sensor.temperature\"\n\
         actor = {{ type = \"sensor\", id = \"{{r}}\" }}\nproperties = {{ seq = \"{{/seq}}\" }}"
    ))
    .unwrap();
    both.rules.push(temps);
    let buffer: Arc<dyn Buffer> = Arc::new(MemoryBuffer::new());
    let here = tokio::runtime::Handle::current();
    let run = |config: &MqttSourceConfig| {
        let (config, dir, buffer) = (config.clone(), dir.path().to_owned(), Arc::clone(&buffer));
        let here = here.clone();
        async move {
            let (task, health, shutdown) = start(&config, &dir, buffer, &here).await;
            (task, health, shutdown)
        }
    };
    let temps_topic = || format!("{TEST}/r1/temps");

    let (task, _, shutdown) = run(&both).await;
    shutdown.cancel();
    tokio::time::timeout(WAIT, task).await.unwrap().unwrap().unwrap();

    // The temperature rule removed: its reading comes first and must not
    // come at all.
    let (task, health, shutdown) = run(&tags).await;
    publish_on(addr, temps_topic(), 100..101, TEST, false).await;
    publish_seqs(addr, 0..1, TEST, false).await;
    assert_eq!(stored(&buffer, 1).await, BTreeMap::from([(0, 1)]));
    let json = health.to_json();
    assert_eq!(
        (json["received_total"].as_u64(), json["rejected_total"].as_u64()),
        (Some(1), Some(0)),
        "{json}"
    );
    shutdown.cancel();
    tokio::time::timeout(WAIT, task).await.unwrap().unwrap().unwrap();

    // Retained while the session did not hold the filter: news once the
    // rule is back.
    publish_on(addr, temps_topic(), 200..201, TEST, true).await;
    let (task, health, shutdown) = run(&both).await;
    publish_seqs(addr, 1..2, TEST, false).await;
    assert_eq!(stored(&buffer, 3).await, BTreeMap::from([(0, 1), (1, 1), (200, 1)]));
    assert_eq!(health.to_json()["retained_replayed_total"], 0);
    shutdown.cancel();
    tokio::time::timeout(WAIT, task).await.unwrap().unwrap().unwrap();
}
