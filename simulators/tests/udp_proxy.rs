//! The UDP proxy between real sockets on loopback.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::time::Duration;

use bytesize::ByteSize;
use opgraph_simulators::proxy::link::{Direction, Link, Verdict, direction_seed};
use opgraph_simulators::{FlakyProxy, LinkConfig, PartitionMode, Protocol, ProxyConfig};
use tokio::net::UdpSocket;
use tokio::time::{Instant, timeout};

const WAIT: Duration = Duration::from_secs(10);
/// Datagrams sent before waiting for them: few enough that no socket buffer
/// on the way overflows, so every drop is the proxy's.
const BURST: usize = 50;

async fn within<T>(what: &str, future: impl Future<Output = T>) -> T {
    timeout(WAIT, future).await.unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

async fn socket() -> UdpSocket {
    UdpSocket::bind("127.0.0.1:0").await.unwrap()
}

fn config(upstream: &UdpSocket, link: LinkConfig, seed: u64) -> ProxyConfig {
    let mut config = ProxyConfig::new(Protocol::Udp, upstream.local_addr().unwrap());
    config.link = link;
    config.seed = seed;
    config
}

/// Receives one numbered datagram; returns the number and the sender.
async fn recv_numbered(socket: &UdpSocket) -> (u32, SocketAddr) {
    let mut buf = [0; 2048];
    let (n, from) = within("a datagram", socket.recv_from(&mut buf)).await.unwrap();
    assert!(n >= 4);
    (u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]), from)
}

async fn send_numbered(socket: &UdpSocket, to: SocketAddr, i: u32, len: usize) {
    let mut datagram = vec![0; len.max(4)];
    datagram[..4].copy_from_slice(&i.to_be_bytes());
    socket.send_to(&datagram, to).await.unwrap();
}

/// Sends `0..count` in bursts and collects, in arrival order, the numbers
/// `expect` says get through.
async fn send_and_collect(
    client: &UdpSocket,
    upstream: &UdpSocket,
    to: SocketAddr,
    count: u32,
    expect: impl Fn(u32) -> bool,
) -> Vec<u32> {
    let mut arrived = Vec::new();
    let all: Vec<u32> = (0..count).collect();
    for burst in all.chunks(BURST) {
        for &i in burst {
            send_numbered(client, to, i, 4).await;
        }
        for _ in burst.iter().filter(|&&i| expect(i)) {
            arrived.push(recv_numbered(upstream).await.0);
        }
    }
    arrived
}

#[tokio::test]
async fn loss_drops_exactly_what_the_seeded_model_predicts() {
    let (client, upstream) = (socket().await, socket().await);
    let link = LinkConfig { loss: 0.1, ..Default::default() };
    let proxy = FlakyProxy::start(config(&upstream, link.clone(), 42)).await.unwrap();

    let mut model = Link::new(link, direction_seed(42, Direction::ToUpstream));
    let survives: Vec<bool> = (0..2000)
        .map(|_| matches!(model.datagram(Duration::ZERO, 4), Verdict::Deliver { .. }))
        .collect();
    let arrived =
        send_and_collect(&client, &upstream, proxy.local_addr(), 2000, |i| survives[i as usize])
            .await;

    let expected: Vec<u32> = (0..2000).filter(|&i| survives[i as usize]).collect();
    assert_eq!(arrived, expected, "the proxy must drop what the model with its seed drops");
    let dropped = 2000 - expected.len() as u64;
    assert!((140..=260).contains(&dropped), "{dropped} of 2000 dropped at 10% loss");
    let stats = proxy.shutdown().await;
    assert_eq!(stats.to_upstream.received_packets, 2000);
    assert_eq!(stats.to_upstream.dropped_loss, dropped);
    assert_eq!(stats.to_upstream.delivered_packets, 2000 - dropped);
    assert_eq!(stats.connections, 1);
}

#[tokio::test]
async fn reordering_lets_later_datagrams_overtake() {
    let (client, upstream) = (socket().await, socket().await);
    let link =
        LinkConfig { reorder: 0.2, reorder_delay: Duration::from_millis(30), ..Default::default() };
    let proxy = FlakyProxy::start(config(&upstream, link, 9)).await.unwrap();
    let arrived = send_and_collect(&client, &upstream, proxy.local_addr(), 200, |_| true).await;

    let mut sorted = arrived.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (0..200).collect::<Vec<_>>(), "every datagram arrives exactly once");
    let overtaken = arrived.windows(2).filter(|w| w[0] > w[1]).count();
    assert!(overtaken > 0, "no datagram was overtaken: {arrived:?}");
    let stats = proxy.shutdown().await;
    assert!((20..=60).contains(&stats.to_upstream.reordered), "{stats:?}");
}

#[tokio::test]
async fn replies_come_back_through_per_client_mappings_with_latency() {
    let upstream = socket().await;
    let latency = Duration::from_millis(50);
    let link = LinkConfig { latency, ..Default::default() };
    let proxy = FlakyProxy::start(config(&upstream, link, 1)).await.unwrap();
    let (a, b) = (socket().await, socket().await);

    let started = Instant::now();
    send_numbered(&a, proxy.local_addr(), 1, 100).await;
    send_numbered(&b, proxy.local_addr(), 2, 100).await;
    let (first, from_first) = recv_numbered(&upstream).await;
    let (second, from_second) = recv_numbered(&upstream).await;
    assert_ne!(from_first, from_second, "each client gets its own upstream port");
    for (i, from) in [(first, from_first), (second, from_second)] {
        upstream.send_to(&(i + 100).to_be_bytes(), from).await.unwrap();
    }
    assert_eq!(recv_numbered(&a).await, (101, proxy.local_addr()));
    assert_eq!(recv_numbered(&b).await, (102, proxy.local_addr()));
    let rtt = started.elapsed();
    assert!(rtt >= 2 * latency, "a 50 ms one-way link answered in {rtt:?}");
    let stats = proxy.shutdown().await;
    assert_eq!(stats.connections, 2);
    assert_eq!(stats.to_client.delivered_packets, 2);
}

#[tokio::test]
async fn a_partition_drops_datagrams_until_it_heals() {
    let (client, upstream) = (socket().await, socket().await);
    let proxy = FlakyProxy::start(config(&upstream, LinkConfig::default(), 3)).await.unwrap();
    send_numbered(&client, proxy.local_addr(), 0, 4).await;
    assert_eq!(recv_numbered(&upstream).await.0, 0);

    proxy.set_partition(true);
    for i in 1..=10 {
        send_numbered(&client, proxy.local_addr(), i, 4).await;
    }
    // The proxy handles datagrams in order: once the marker sent after
    // healing arrives, all ten were handled, and none may have got through.
    let lost = timeout(Duration::from_millis(200), recv_numbered(&upstream)).await;
    assert!(lost.is_err(), "a datagram passed the partition");
    proxy.set_partition(false);
    send_numbered(&client, proxy.local_addr(), 11, 4).await;
    assert_eq!(recv_numbered(&upstream).await.0, 11);
    let stats = proxy.shutdown().await;
    assert_eq!(stats.to_upstream.dropped_partition, 10);
    assert_eq!(stats.to_upstream.delivered_packets, 2);
}

#[tokio::test]
async fn reset_mode_forgets_mappings_like_a_nat_reboot() {
    let (client, upstream) = (socket().await, socket().await);
    let mut config = config(&upstream, LinkConfig::default(), 4);
    config.partition_mode = PartitionMode::Reset;
    let proxy = FlakyProxy::start(config).await.unwrap();
    send_numbered(&client, proxy.local_addr(), 1, 4).await;
    let (_, before) = recv_numbered(&upstream).await;
    // Even a partition too short for the proxy to notice at once counts.
    proxy.set_partition(true);
    proxy.set_partition(false);
    send_numbered(&client, proxy.local_addr(), 2, 4).await;
    let (n, after) = recv_numbered(&upstream).await;
    assert_eq!(n, 2);
    assert_ne!(before, after, "the upstream should see a new source port");
    let stats = proxy.shutdown().await;
    assert_eq!((stats.connections, stats.connections_reset), (2, 1));
}

#[tokio::test]
async fn the_bandwidth_cap_limits_throughput() {
    let (client, upstream) = (socket().await, socket().await);
    let link = LinkConfig {
        bandwidth: Some(ByteSize::kib(100)),
        burst: ByteSize::kib(10),
        ..Default::default()
    };
    let proxy = FlakyProxy::start(config(&upstream, link, 5)).await.unwrap();
    let started = Instant::now();
    for i in 0..40 {
        send_numbered(&client, proxy.local_addr(), i, 1000).await;
    }
    for i in 0..40 {
        assert_eq!(recv_numbered(&upstream).await.0, i);
    }
    let elapsed = started.elapsed();
    // (40,000 B - 10 KiB burst) / 100 KiB/s = 290.6 ms at the very least.
    assert!(elapsed >= Duration::from_millis(290), "40 kB at 100 KiB/s took {elapsed:?}");
}

#[tokio::test(start_paused = true)]
async fn idle_mappings_expire() {
    let (client, upstream) = (socket().await, socket().await);
    let mut config = config(&upstream, LinkConfig::default(), 6);
    config.udp_idle_timeout = Duration::from_secs(1);
    let proxy = FlakyProxy::start(config).await.unwrap();
    send_numbered(&client, proxy.local_addr(), 1, 4).await;
    let (_, before) = recv_numbered(&upstream).await;
    // Paused clock: this advances virtual time past the idle timeout.
    tokio::time::sleep(Duration::from_secs(3)).await;
    send_numbered(&client, proxy.local_addr(), 2, 4).await;
    let (_, after) = recv_numbered(&upstream).await;
    assert_ne!(before, after);
    let stats = proxy.stats();
    assert_eq!((stats.connections, stats.connections_expired), (2, 1));
}
