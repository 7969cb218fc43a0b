//! The flaky-link proxy: forwards TCP or UDP from a listening address to an
//! upstream through a simulated bad network.
//!
//! [`FlakyProxy::start`] binds, spawns the pumps and returns a
//! [`ProxyHandle`] to partition or heal the link on demand, change its
//! behaviour at run time, read the counters and shut it down.
//!
//! - [`link`]: the I/O-free model (loss, latency, jitter, reordering,
//!   bandwidth, partition schedule) and its config.
//! - `tcp`: one task per connection, one pump per direction.
//! - `udp`: one listening socket, one upstream socket per client (a NAT
//!   mapping), a timer queue per direction.
//! - [`stats`]: what went through.
//! - [`cli`]: the `opgraph-sim proxy` arguments.
//!
//! A partition is published on a `watch` channel that every pump observes;
//! a supervisor task flips it at the scheduled window edges and
//! [`ProxyHandle::set_partition`] flips it at once.

pub mod cli;
pub mod link;
pub mod stats;
mod tcp;
pub(crate) mod udp;

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use bytesize::ByteSize;
use serde::{Deserialize, Serialize};
use tokio::net::{TcpListener, UdpSocket};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::info;

use crate::error::{Error, Result};
use link::{Direction, Link, LinkConfig, PartitionSchedule, PartitionWindow};
use stats::{Counters, ProxyStats};

/// Which transport the proxy forwards.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    Tcp,
    /// UDP datagrams, e.g. QUIC.
    Udp,
}

impl Protocol {
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
        }
    }
}

/// What a partition does to connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum PartitionMode {
    /// TCP connections stall until the link heals, then carry on; new
    /// connections are accepted but held before reaching the upstream. UDP
    /// datagrams are dropped.
    #[default]
    Stall,
    /// TCP connections are reset (RST to both ends) when a partition
    /// begins; new connections during it are reset at once. UDP datagrams are
    /// dropped and the client mappings forgotten, so the upstream sees new
    /// source ports afterwards (a NAT rebinding).
    Reset,
}

/// The link's partition state, as every pump sees it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PartitionState {
    /// Nothing passes right now.
    pub partitioned: bool,
    /// Partitions begun since the proxy started. In `reset` mode a
    /// connection opened in an earlier epoch is reset, even if the partition
    /// healed before anyone looked.
    pub epoch: u64,
}

/// Everything about one proxy. Build it with [`ProxyConfig::new`] or from
/// TOML/JSON (only `protocol` and `upstream` are required).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProxyConfig {
    pub protocol: Protocol,
    /// Where clients connect. Default `127.0.0.1:0` (a free port; read it
    /// back from [`ProxyHandle::local_addr`]).
    #[serde(default = "defaults::listen")]
    pub listen: SocketAddr,
    /// The real server.
    pub upstream: SocketAddr,
    /// What the link does to traffic; changeable at run time with
    /// [`ProxyHandle::update`].
    #[serde(default)]
    pub link: LinkConfig,
    /// Scheduled partitions, relative to the proxy's start. Default none.
    #[serde(default)]
    pub partitions: Vec<PartitionWindow>,
    /// Default `stall`.
    #[serde(default)]
    pub partition_mode: PartitionMode,
    /// Seed of the link's RNG: the same seed and the same traffic give the
    /// same losses and delays. Default 0.
    #[serde(default)]
    pub seed: u64,
    /// Largest TCP read, the unit the link model delays and "loses".
    /// Default 16 KiB.
    #[serde(default = "defaults::tcp_chunk")]
    pub tcp_chunk: ByteSize,
    /// Chunks buffered per TCP direction before the proxy stops reading
    /// (back-pressure). Default 64: with the chunk size, this bounds the
    /// bytes in flight, so a long latency also caps throughput.
    #[serde(default = "defaults::tcp_buffer_chunks")]
    pub tcp_buffer_chunks: usize,
    /// How long to wait for the upstream to accept a TCP connection before
    /// resetting the client. Default 5 s.
    #[serde(default = "defaults::connect_timeout", with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// A UDP client mapping with no traffic either way for this long is
    /// forgotten. Default 60 s.
    #[serde(default = "defaults::udp_idle_timeout", with = "humantime_serde")]
    pub udp_idle_timeout: Duration,
    /// Datagrams waiting for their delivery time per direction (and per
    /// client on the way back) before more are dropped as overflow.
    /// Default 4096.
    #[serde(default = "defaults::udp_queue_datagrams")]
    pub udp_queue_datagrams: usize,
}

mod defaults {
    use super::*;

    pub fn listen() -> SocketAddr {
        (Ipv4Addr::LOCALHOST, 0).into()
    }
    pub fn tcp_chunk() -> ByteSize {
        ByteSize::kib(16)
    }
    pub fn tcp_buffer_chunks() -> usize {
        64
    }
    pub fn connect_timeout() -> Duration {
        Duration::from_secs(5)
    }
    pub fn udp_idle_timeout() -> Duration {
        Duration::from_secs(60)
    }
    pub fn udp_queue_datagrams() -> usize {
        4096
    }
}

impl ProxyConfig {
    /// A proxy on `127.0.0.1:0` to `upstream` over a perfect link.
    pub fn new(protocol: Protocol, upstream: SocketAddr) -> Self {
        Self {
            protocol,
            listen: defaults::listen(),
            upstream,
            link: LinkConfig::default(),
            partitions: Vec::new(),
            partition_mode: PartitionMode::default(),
            seed: 0,
            tcp_chunk: defaults::tcp_chunk(),
            tcp_buffer_chunks: defaults::tcp_buffer_chunks(),
            connect_timeout: defaults::connect_timeout(),
            udp_idle_timeout: defaults::udp_idle_timeout(),
            udp_queue_datagrams: defaults::udp_queue_datagrams(),
        }
    }

    /// Every problem at once, each with its key path.
    pub fn validate(&self) -> Result<()> {
        let mut problems = Vec::new();
        if self.upstream.port() == 0 {
            problems.push(format!("upstream: needs a port, got {}", self.upstream));
        }
        self.link.validate("link.", &mut problems);
        if self.tcp_chunk.as_u64() == 0 || self.tcp_chunk.as_u64() > 16 << 20 {
            problems.push(format!("tcp_chunk: must be from 1 B to 16 MiB, got {}", self.tcp_chunk));
        }
        for (key, value) in [
            ("tcp_buffer_chunks", self.tcp_buffer_chunks),
            ("udp_queue_datagrams", self.udp_queue_datagrams),
        ] {
            if value == 0 {
                problems.push(format!("{key}: must be above 0"));
            }
        }
        for (key, value) in
            [("connect_timeout", self.connect_timeout), ("udp_idle_timeout", self.udp_idle_timeout)]
        {
            if value.is_zero() {
                problems.push(format!("{key}: must be above 0"));
            }
        }
        if problems.is_empty() { Ok(()) } else { Err(Error::InvalidConfig(problems)) }
    }
}

/// The proxy's entry point; see the module docs.
#[derive(Debug)]
pub struct FlakyProxy;

impl FlakyProxy {
    /// Validates the config, binds the listening socket and starts
    /// forwarding. Returns once bound.
    pub async fn start(config: ProxyConfig) -> Result<ProxyHandle> {
        config.validate()?;
        let cancel = CancellationToken::new();
        let tracker = TaskTracker::new();
        let listen = config.listen;
        let bind_err = |source| Error::Bind { addr: listen, source };
        let (shared, local_addr) = match config.protocol {
            Protocol::Tcp => {
                let listener = TcpListener::bind(listen).await.map_err(bind_err)?;
                let local_addr = listener.local_addr().map_err(bind_err)?;
                let shared = Shared::new(config);
                tracker.spawn(tcp::run(listener, shared.clone(), cancel.clone(), tracker.clone()));
                (shared, local_addr)
            }
            Protocol::Udp => {
                let socket = UdpSocket::bind(listen).await.map_err(bind_err)?;
                let local_addr = socket.local_addr().map_err(bind_err)?;
                let shared = Shared::new(config);
                tracker.spawn(udp::run(socket, shared.clone(), cancel.clone(), tracker.clone()));
                (shared, local_addr)
            }
        };
        tracker.spawn(supervise_partitions(shared.clone(), cancel.clone()));
        info!(
            protocol = shared.config.protocol.as_str(),
            %local_addr,
            upstream = %shared.config.upstream,
            seed = shared.config.seed,
            "flaky-link proxy started"
        );
        Ok(ProxyHandle { local_addr, shared, cancel, tracker })
    }
}

/// Controls a running proxy. Dropping it stops the proxy (without waiting);
/// [`ProxyHandle::shutdown`] waits for every task to finish.
#[derive(Debug)]
pub struct ProxyHandle {
    local_addr: SocketAddr,
    shared: Arc<Shared>,
    cancel: CancellationToken,
    tracker: TaskTracker,
}

impl ProxyHandle {
    /// The address clients connect to.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Partitions (`true`) or heals (`false`) the link, effective when this
    /// returns. Scheduled windows still partition a healed link.
    pub fn set_partition(&self, on: bool) {
        let mut schedule = self.shared.schedule();
        schedule.set_forced(on);
        self.shared.publish_partition(&schedule);
    }

    /// Whether the link is partitioned right now.
    pub fn is_partitioned(&self) -> bool {
        self.shared.is_partitioned()
    }

    /// Follows the partition state, e.g. to await a scheduled window:
    /// `rx.wait_for(|s| s.partitioned).await`.
    pub fn partition_watch(&self) -> watch::Receiver<PartitionState> {
        self.shared.partition.subscribe()
    }

    /// Changes what the link does, in both directions, from now on (chunks
    /// and datagrams already scheduled keep their times).
    pub fn update(&self, link: LinkConfig) -> Result<()> {
        let mut problems = Vec::new();
        link.validate("link.", &mut problems);
        if !problems.is_empty() {
            return Err(Error::InvalidConfig(problems));
        }
        for direction in Direction::BOTH {
            self.shared.link(direction).set_config(link.clone());
        }
        Ok(())
    }

    pub fn stats(&self) -> ProxyStats {
        self.shared.stats()
    }

    /// Stops accepting, closes every connection and waits for all tasks;
    /// returns the final counts.
    pub async fn shutdown(&self) -> ProxyStats {
        self.cancel.cancel();
        self.tracker.close();
        self.tracker.wait().await;
        self.stats()
    }
}

impl Drop for ProxyHandle {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

/// State every task of one proxy shares.
#[derive(Debug)]
pub(crate) struct Shared {
    pub config: ProxyConfig,
    pub start: Instant,
    pub counters: Counters,
    links: [Mutex<Link>; 2],
    schedule: Mutex<PartitionSchedule>,
    partition: watch::Sender<PartitionState>,
}

impl Shared {
    fn new(config: ProxyConfig) -> Arc<Self> {
        let link =
            |d| Mutex::new(Link::new(config.link.clone(), link::direction_seed(config.seed, d)));
        let links = [link(Direction::ToUpstream), link(Direction::ToClient)];
        let schedule = PartitionSchedule::new(config.partitions.clone());
        let start = Instant::now();
        let partitioned = schedule.is_partitioned(Duration::ZERO);
        let (partition, _) =
            watch::channel(PartitionState { partitioned, epoch: u64::from(partitioned) });
        let counters = Counters::default();
        if partitioned {
            stats::add(&counters.partitions, 1);
        }
        Arc::new(Self { config, start, counters, links, schedule: Mutex::new(schedule), partition })
    }

    /// Time since the proxy started: the link model's `now`.
    pub fn now(&self) -> Duration {
        self.start.elapsed()
    }

    /// Locks one direction's link model. Never hold the guard across an
    /// `.await`.
    pub fn link(&self, direction: Direction) -> MutexGuard<'_, Link> {
        let index = match direction {
            Direction::ToUpstream => 0,
            Direction::ToClient => 1,
        };
        self.links[index].lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn partition_rx(&self) -> watch::Receiver<PartitionState> {
        self.partition.subscribe()
    }

    pub fn is_partitioned(&self) -> bool {
        self.partition.borrow().partitioned
    }

    pub fn partition_epoch(&self) -> u64 {
        self.partition.borrow().epoch
    }

    fn schedule(&self) -> MutexGuard<'_, PartitionSchedule> {
        self.schedule.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Recomputes the partition state; called with the schedule locked so
    /// that concurrent callers publish in order.
    fn publish_partition(&self, schedule: &PartitionSchedule) {
        let on = schedule.is_partitioned(self.now());
        let changed = self.partition.send_if_modified(|state| {
            if state.partitioned == on {
                return false;
            }
            state.partitioned = on;
            state.epoch += u64::from(on);
            true
        });
        if changed {
            if on {
                stats::add(&self.counters.partitions, 1);
                info!("partition started");
            } else {
                info!("partition healed");
            }
        }
    }

    fn stats(&self) -> ProxyStats {
        self.counters.snapshot(self.config.protocol, self.config.seed, self.now())
    }
}

/// Flips the partition state at every scheduled window edge.
async fn supervise_partitions(shared: Arc<Shared>, cancel: CancellationToken) {
    loop {
        let next = {
            let schedule = shared.schedule();
            shared.publish_partition(&schedule);
            schedule.next_change(shared.now())
        };
        let Some(next) = next else { break };
        tokio::select! {
            () = cancel.cancelled() => break,
            () = tokio::time::sleep_until(shared.start + next) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[tokio::test(start_paused = true)]
    async fn scheduled_partitions_flip_at_their_edges() {
        let mut config = ProxyConfig::new(Protocol::Tcp, "127.0.0.1:9".parse().unwrap());
        config.partitions = vec!["1s+2s".parse().unwrap(), "10s+1s".parse().unwrap()];
        let t0 = Instant::now();
        let proxy = FlakyProxy::start(config).await.unwrap();
        let mut rx = proxy.partition_watch();
        assert!(!rx.borrow_and_update().partitioned);
        rx.wait_for(|s| s.partitioned).await.unwrap();
        assert_eq!(t0.elapsed(), secs(1));
        rx.wait_for(|s| !s.partitioned).await.unwrap();
        assert_eq!(t0.elapsed(), secs(3));
        // On demand, on top of the schedule.
        proxy.set_partition(true);
        assert!(proxy.is_partitioned());
        proxy.set_partition(false);
        assert!(!proxy.is_partitioned());
        rx.wait_for(|s| s.partitioned).await.unwrap();
        assert_eq!(t0.elapsed(), secs(10));
        let healed = *rx.wait_for(|s| !s.partitioned).await.unwrap();
        assert_eq!(t0.elapsed(), secs(11));
        assert_eq!(healed.epoch, 3);
        assert_eq!(proxy.shutdown().await.partitions, 3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_window_at_zero_starts_partitioned() {
        let mut config = ProxyConfig::new(Protocol::Udp, "127.0.0.1:9".parse().unwrap());
        config.partitions = vec!["0s+5s".parse().unwrap()];
        let proxy = FlakyProxy::start(config).await.unwrap();
        assert!(proxy.is_partitioned());
        proxy.partition_watch().wait_for(|s| !s.partitioned).await.unwrap();
        assert_eq!(proxy.stats().partitions, 1);
    }

    #[test]
    fn config_validation_reports_every_problem() {
        let mut config = ProxyConfig::new(Protocol::Tcp, "127.0.0.1:0".parse().unwrap());
        config.link.loss = 2.0;
        config.tcp_buffer_chunks = 0;
        let Err(Error::InvalidConfig(problems)) = config.validate() else {
            panic!("should be invalid");
        };
        assert_eq!(problems.len(), 3, "{problems:?}");
    }

    #[test]
    fn config_from_json_needs_only_protocol_and_upstream() {
        let config: ProxyConfig = serde_json::from_str(
            r#"{"protocol":"udp","upstream":"127.0.0.1:4433",
                "link":{"loss":0.02,"latency":"25ms","bandwidth":"10MiB"},
                "partitions":["10s+3s"]}"#,
        )
        .unwrap();
        assert_eq!(config.link.latency, Duration::from_millis(25));
        assert_eq!(config.link.bandwidth, Some(ByteSize::mib(10)));
        assert_eq!(config.partitions[0].start, secs(10));
        assert_eq!(config.listen, defaults::listen());
        let unknown = r#"{"protocol":"udp","upstream":"127.0.0.1:1","lost":0.1}"#;
        assert!(serde_json::from_str::<ProxyConfig>(unknown).is_err());
    }
}
