//! The TCP proxy against a real echo server on loopback.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::ErrorKind;
use std::net::SocketAddr;
use std::time::Duration;

use bytesize::ByteSize;
use opgraph_simulators::{FlakyProxy, LinkConfig, PartitionMode, Protocol, ProxyConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::{Instant, timeout};

/// Bound on every wait for something that should happen.
const WAIT: Duration = Duration::from_secs(10);

async fn within<T>(what: &str, future: impl Future<Output = T>) -> T {
    timeout(WAIT, future).await.unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

async fn echo_server() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut rd, mut wr) = stream.split();
                let _ = tokio::io::copy(&mut rd, &mut wr).await;
            });
        }
    });
    addr
}

fn config(upstream: SocketAddr, link: LinkConfig) -> ProxyConfig {
    let mut config = ProxyConfig::new(Protocol::Tcp, upstream);
    config.link = link;
    config
}

async fn round_trip(stream: &mut TcpStream, msg: &[u8]) -> Duration {
    let started = Instant::now();
    stream.write_all(msg).await.unwrap();
    let mut back = vec![0; msg.len()];
    within("the echo", stream.read_exact(&mut back)).await.unwrap();
    assert_eq!(back, msg);
    started.elapsed()
}

/// Sends `data` through `addr` and returns what came back once both sides
/// closed.
async fn echo_through(addr: SocketAddr, data: Vec<u8>) -> Vec<u8> {
    let (mut rd, mut wr) = TcpStream::connect(addr).await.unwrap().into_split();
    let writer = tokio::spawn(async move {
        wr.write_all(&data).await.unwrap();
        wr.shutdown().await.unwrap();
    });
    let mut echoed = Vec::new();
    within("the whole echo", rd.read_to_end(&mut echoed)).await.unwrap();
    writer.await.unwrap();
    echoed
}

#[tokio::test]
async fn echo_delivers_every_byte_in_order_despite_loss() {
    let link = LinkConfig {
        loss: 0.2,
        latency: Duration::from_millis(2),
        jitter: Duration::from_millis(2),
        rto: Duration::from_millis(5),
        ..Default::default()
    };
    let mut config = config(echo_server().await, link);
    config.seed = 7;
    let proxy = FlakyProxy::start(config).await.unwrap();
    let data: Vec<u8> = (0..256 * 1024u32).map(|i| (i % 251) as u8).collect();
    let echoed = echo_through(proxy.local_addr(), data.clone()).await;
    assert!(echoed == data, "echo differs: {} bytes back of {}", echoed.len(), data.len());
    let stats = proxy.shutdown().await;
    assert_eq!(stats.to_upstream.delivered_bytes, data.len() as u64);
    assert_eq!(stats.to_client.delivered_bytes, data.len() as u64);
    assert_eq!(stats.connections, 1);
    let retransmits = stats.to_upstream.retransmits + stats.to_client.retransmits;
    assert!(retransmits > 0, "20% loss should have cost retransmissions: {stats:?}");
}

#[tokio::test]
async fn latency_delays_round_trips_and_can_change_at_run_time() {
    let proxy =
        FlakyProxy::start(config(echo_server().await, LinkConfig::default())).await.unwrap();
    let mut stream = TcpStream::connect(proxy.local_addr()).await.unwrap();
    round_trip(&mut stream, b"warm up").await;
    let latency = Duration::from_millis(100);
    proxy.update(LinkConfig { latency, ..Default::default() }).unwrap();
    let rtt = round_trip(&mut stream, b"ping").await;
    assert!(rtt >= 2 * latency, "a 100 ms one-way link answered in {rtt:?}");
    assert!(proxy.update(LinkConfig { loss: 1.5, ..Default::default() }).is_err());
}

#[tokio::test]
async fn a_partition_stalls_connections_until_it_heals() {
    let proxy =
        FlakyProxy::start(config(echo_server().await, LinkConfig::default())).await.unwrap();
    let mut stream = TcpStream::connect(proxy.local_addr()).await.unwrap();
    round_trip(&mut stream, b"before").await;

    proxy.set_partition(true);
    stream.write_all(b"during").await.unwrap();
    let mut back = [0; 6];
    let stalled = timeout(Duration::from_millis(300), stream.read_exact(&mut back)).await;
    assert!(stalled.is_err(), "nothing may pass a partition");
    // A connection opened during the partition is held, not refused.
    let mut late = TcpStream::connect(proxy.local_addr()).await.unwrap();
    late.write_all(b"late").await.unwrap();

    proxy.set_partition(false);
    within("the stalled echo", stream.read_exact(&mut back)).await.unwrap();
    assert_eq!(&back, b"during");
    let mut late_back = [0; 4];
    within("the held connection", late.read_exact(&mut late_back)).await.unwrap();
    assert_eq!(&late_back, b"late");
    round_trip(&mut stream, b"after").await;

    let stats = proxy.shutdown().await;
    assert_eq!(stats.partitions, 1);
    assert!(stats.to_upstream.stalled >= 1, "{stats:?}");
    assert_eq!(stats.connections_reset, 0);
}

#[tokio::test]
async fn a_scheduled_partition_holds_traffic_for_its_window() {
    let window = Duration::from_millis(400);
    let mut config = config(echo_server().await, LinkConfig::default());
    config.partitions = vec!["0s+400ms".parse().unwrap()];
    let t0 = Instant::now();
    let proxy = FlakyProxy::start(config).await.unwrap();
    assert!(proxy.is_partitioned());
    let mut stream = TcpStream::connect(proxy.local_addr()).await.unwrap();
    round_trip(&mut stream, b"hello").await;
    assert!(t0.elapsed() >= window, "answered after {:?}, inside the window", t0.elapsed());
    assert!(!proxy.is_partitioned());
    assert_eq!(proxy.stats().partitions, 1);
}

#[tokio::test]
async fn reset_mode_resets_connections_and_refuses_new_ones() {
    let mut config = config(echo_server().await, LinkConfig::default());
    config.partition_mode = PartitionMode::Reset;
    let proxy = FlakyProxy::start(config).await.unwrap();
    let mut stream = TcpStream::connect(proxy.local_addr()).await.unwrap();
    round_trip(&mut stream, b"before").await;

    proxy.set_partition(true);
    let mut buf = [0; 16];
    let err = within("the reset", stream.read(&mut buf)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ConnectionReset);
    let mut refused = TcpStream::connect(proxy.local_addr()).await.unwrap();
    let err = within("the refusal", refused.read(&mut buf)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ConnectionReset);

    proxy.set_partition(false);
    let mut healed = TcpStream::connect(proxy.local_addr()).await.unwrap();
    round_trip(&mut healed, b"after").await;
    let stats = proxy.shutdown().await;
    assert_eq!((stats.connections_reset, stats.connections_refused), (1, 1));
}

#[tokio::test]
async fn the_bandwidth_cap_limits_throughput() {
    let link = LinkConfig {
        bandwidth: Some(ByteSize::kib(512)),
        burst: ByteSize::kib(16),
        ..Default::default()
    };
    let proxy = FlakyProxy::start(config(echo_server().await, link)).await.unwrap();
    let data = vec![7; 256 * 1024];
    let started = Instant::now();
    let echoed = echo_through(proxy.local_addr(), data.clone()).await;
    let elapsed = started.elapsed();
    assert_eq!(echoed.len(), data.len());
    // (256 KiB - 16 KiB burst) / 512 KiB/s = 469 ms at the very least.
    assert!(elapsed >= Duration::from_millis(469), "256 KiB at 512 KiB/s took {elapsed:?}");
}

#[tokio::test]
async fn an_unreachable_upstream_resets_the_client() {
    let gone = TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap();
    let proxy = FlakyProxy::start(config(gone, LinkConfig::default())).await.unwrap();
    let mut stream = TcpStream::connect(proxy.local_addr()).await.unwrap();
    let mut buf = [0; 1];
    let err = within("the reset", stream.read(&mut buf)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ConnectionReset);
    assert_eq!(proxy.stats().connections_refused, 1);
}
