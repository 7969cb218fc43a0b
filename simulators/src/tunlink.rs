//! The kernel-level link emulator (`opgraph-sim tunlink`): real packets,
//! really lost and delayed, between two programs on one host.
//!
//! The flaky-link proxy ([`crate::proxy`]) terminates TCP on both sides, so
//! the sending TCP never sees a loss and its congestion window never
//! shrinks. Here nothing is terminated: the emulator owns a TUN device,
//! the kernel routes a small fake subnet into it, and every IPv4 packet the
//! kernel sends there is lost with probability `loss` or handed back to the
//! kernel after `latency`, its addresses rewritten so it reaches the other
//! program on the same host ([`packet`]'s hairpin). Kernel TCP then does
//! its own loss recovery and congestion control over a true round trip,
//! and QUIC's UDP datagrams meet the same fate per packet.
//!
//! - [`packet`]: I/O-free parsing and the hairpin rewrite (addresses,
//!   checksums).
//! - [`tun`]: the device and its kernel calls, the workspace's only
//!   `unsafe`.
//! - [`cli`]: the `opgraph-sim tunlink` arguments and the run until
//!   SIGTERM.
//!
//! Loss, latency, jitter, reordering and the bandwidth cap come from the
//! proxy's I/O-free model ([`crate::proxy::link::Link`], one per direction,
//! seeded like the proxy's), applied per IP packet, and the delay queue is
//! the proxy's UDP timer queue. The emulator changes the network of the
//! namespace it runs in (a device, an address, a route), so it refuses to
//! run in a namespace that has any interface besides `lo` unless told to:
//! run it under `unshare -n`.

pub mod cli;
pub mod packet;
pub mod tun;

use std::fmt;
use std::net::Ipv4Addr;
use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info};

use crate::error::{Error, Result};
use crate::proxy::link::{Direction, DropReason, Link, LinkConfig, Verdict, direction_seed};
use crate::proxy::stats::DirectionStats;
use crate::proxy::udp::TimerQueue;
use packet::{Hairpin, Refusal};
use tun::TunDevice;

/// Packets read per wake-up before timers get a turn, so a flood one way
/// cannot starve the releases.
const READ_BATCH: usize = 64;
/// Larger than any IPv4 packet.
const MAX_PACKET: usize = 65_536;

/// Everything about one emulated link.
#[derive(Debug, Clone, PartialEq)]
pub struct TunLinkConfig {
    /// Device name; `%d` takes the first free number. Default `optun%d`.
    pub device: String,
    /// The addresses; the device gets `hairpin.local` with a /16 netmask,
    /// which must hold the other two.
    pub hairpin: Hairpin,
    /// Default 1500, an Ethernet path: TCP segments and QUIC datagrams
    /// then have the sizes they have on a real network.
    pub mtu: u16,
    /// Applied to each IP packet, each direction with its own RNG.
    pub link: LinkConfig,
    pub seed: u64,
    /// Packets waiting for their release time, both directions together,
    /// before more are dropped as overflow. Default 16384 (at 25 ms that
    /// is 650k packets/s).
    pub queue_packets: usize,
    /// Add the device even in a namespace with other interfaces (the
    /// host's). Default false.
    pub allow_host_namespace: bool,
}

/// The /16 every address of the hairpin must share.
const NETMASK: Ipv4Addr = Ipv4Addr::new(255, 255, 0, 0);

impl TunLinkConfig {
    pub fn new() -> Self {
        Self {
            device: "optun%d".to_owned(),
            hairpin: Hairpin {
                local: Ipv4Addr::new(10, 77, 0, 1),
                remote: Ipv4Addr::new(10, 77, 1, 1),
                mirror: Ipv4Addr::new(10, 77, 1, 2),
            },
            mtu: 1500,
            link: LinkConfig::default(),
            seed: 0,
            queue_packets: 16_384,
            allow_host_namespace: false,
        }
    }

    /// Every problem at once, each with its key path.
    pub fn validate(&self) -> Result<()> {
        let mut problems = Vec::new();
        self.link.validate("link.", &mut problems);
        let Hairpin { local, remote, mirror } = self.hairpin;
        let subnet = |a: Ipv4Addr| a.to_bits() & NETMASK.to_bits();
        for (key, addr) in [("remote", remote), ("mirror", mirror)] {
            if subnet(addr) != subnet(local) {
                problems.push(format!("{key}: {addr} is not in the /16 of local {local}"));
            }
        }
        if local == remote || local == mirror || remote == mirror {
            problems
                .push(format!("local, remote, mirror: must differ ({local}, {remote}, {mirror})"));
        }
        if self.mtu < 576 {
            problems.push(format!("mtu: at least 576 bytes (IPv4's minimum), got {}", self.mtu));
        }
        if self.queue_packets == 0 {
            problems.push("queue_packets: must be above 0".to_owned());
        }
        if problems.is_empty() { Ok(()) } else { Err(Error::InvalidConfig(problems)) }
    }
}

impl Default for TunLinkConfig {
    fn default() -> Self {
        Self::new()
    }
}

/// What the emulator carried and refused.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct TunLinkStats {
    pub seed: u64,
    pub elapsed: Duration,
    /// Client to server (packets to `remote`). `send_failed`: the kernel
    /// refused the re-injected packet.
    pub to_upstream: DirectionStats,
    /// Server to client (packets to `mirror`).
    pub to_client: DirectionStats,
    /// Packets that were not IPv4 (e.g. IPv6 router solicitations).
    pub not_ipv4: u64,
    /// Packets too short or with inconsistent lengths.
    pub malformed: u64,
    /// IPv4 packets between addresses the hairpin does not map.
    pub foreign: u64,
}

impl TunLinkStats {
    fn direction(&mut self, direction: Direction) -> &mut DirectionStats {
        match direction {
            Direction::ToUpstream => &mut self.to_upstream,
            Direction::ToClient => &mut self.to_client,
        }
    }
}

/// The CLI's summary: `key=value` lines starting with `summary`, like the
/// proxy's.
impl fmt::Display for TunLinkStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "summary link=tun seed={} elapsed={:.3}s not_ipv4={} malformed={} foreign={}",
            self.seed,
            self.elapsed.as_secs_f64(),
            self.not_ipv4,
            self.malformed,
            self.foreign
        )?;
        for direction in Direction::BOTH {
            let counts = match direction {
                Direction::ToUpstream => &self.to_upstream,
                Direction::ToClient => &self.to_client,
            };
            counts.write_summary(f, direction)?;
        }
        Ok(())
    }
}

/// A link whose device is up; [`TunLink::run`] carries packets.
#[derive(Debug)]
pub struct TunLink {
    config: TunLinkConfig,
    device: TunDevice,
}

impl TunLink {
    /// Validates `config`, creates the device and brings it up.
    pub fn open(config: TunLinkConfig) -> Result<TunLink> {
        config.validate()?;
        if !config.allow_host_namespace {
            let dev = std::fs::read_to_string("/proc/self/net/dev")
                .map_err(Error::io("reading /proc/self/net/dev"))?;
            let others = other_interfaces(&dev);
            if !others.is_empty() {
                return Err(Error::InvalidConfig(vec![format!(
                    "this network namespace has interfaces besides lo ({}): run under \
                     `unshare -n`, or pass --allow-host-namespace to add the device here anyway",
                    others.join(", ")
                )]));
            }
        }
        let device = TunDevice::create(&config.device)
            .map_err(Error::io("creating the TUN device (needs root and /dev/net/tun)"))?;
        device
            .configure(config.hairpin.local, NETMASK, config.mtu)
            .map_err(Error::io("configuring the TUN device"))?;
        info!(device = device.name(), local = %config.hairpin.local, "TUN device up");
        Ok(TunLink { config, device })
    }

    pub fn device_name(&self) -> &str {
        self.device.name()
    }

    /// Carries packets until `cancel`; packets still waiting are dropped.
    /// An error reading the device ends the run.
    pub async fn run(self, cancel: CancellationToken) -> Result<TunLinkStats> {
        let TunLink { config, device } = self;
        let mut pump = Pump::new(&config, Instant::now());
        let mut buf = vec![0u8; MAX_PACKET];
        loop {
            tokio::select! {
                biased;
                () = cancel.cancelled() => break,
                () = pump.queue.due() => {
                    while let Some((direction, packet)) = pump.pop_due(Instant::now()) {
                        let sent = device.send(&packet);
                        pump.sent(direction, sent);
                    }
                }
                read = device.recv(&mut buf) => {
                    let Some(n) = read.map_err(Error::io("reading the TUN device"))? else {
                        continue;
                    };
                    pump.admit(&mut buf[..n]);
                    // Drain what else is waiting, up to a bound.
                    for _ in 1..READ_BATCH {
                        match device.try_recv(&mut buf).map_err(Error::io("reading the TUN device"))? {
                            Some(n) => pump.admit(&mut buf[..n]),
                            None => break,
                        }
                    }
                }
            }
        }
        pump.stats.elapsed = pump.start.elapsed();
        Ok(pump.stats)
    }
}

/// The middle of the emulator, without the device: packets in, rewritten
/// and judged by the link model; packets out when due; counts.
struct Pump {
    hairpin: Hairpin,
    /// One per direction, `ToUpstream` first, each with its own RNG.
    links: [Link; 2],
    queue: TimerQueue<(Direction, Vec<u8>)>,
    stats: TunLinkStats,
    start: Instant,
}

impl Pump {
    fn new(config: &TunLinkConfig, start: Instant) -> Self {
        Pump {
            hairpin: config.hairpin,
            links: [Direction::ToUpstream, Direction::ToClient]
                .map(|d| Link::new(config.link.clone(), direction_seed(config.seed, d))),
            queue: TimerQueue::new(config.queue_packets),
            stats: TunLinkStats { seed: config.seed, ..TunLinkStats::default() },
            start,
        }
    }

    /// A packet read from the device: refused, lost, or rewritten and
    /// queued until its release time.
    fn admit(&mut self, packet: &mut [u8]) {
        let rewritten = match self.hairpin.rewrite(packet) {
            Ok(rewritten) => rewritten,
            Err(refusal) => {
                match refusal {
                    Refusal::NotIpv4 => self.stats.not_ipv4 += 1,
                    Refusal::Malformed => self.stats.malformed += 1,
                    Refusal::Foreign => self.stats.foreign += 1,
                }
                return;
            }
        };
        let (direction, len) = (rewritten.direction, rewritten.len);
        let counts = self.stats.direction(direction);
        counts.received_packets += 1;
        counts.received_bytes += len as u64;
        let link = &mut self.links[usize::from(direction == Direction::ToClient)];
        match link.datagram(self.start.elapsed(), len) {
            Verdict::Drop(DropReason::Loss) => counts.dropped_loss += 1,
            Verdict::Drop(DropReason::Overflow) => counts.dropped_overflow += 1,
            Verdict::Deliver { at, reordered } => {
                counts.reordered += u64::from(reordered);
                if !self.queue.push(self.start + at, (direction, packet[..len].to_vec())) {
                    counts.dropped_overflow += 1;
                }
            }
        }
    }

    /// The next packet due by `now`, and which way it goes.
    fn pop_due(&mut self, now: Instant) -> Option<(Direction, Vec<u8>)> {
        self.queue.pop_due(now)
    }

    /// Counts what became of a released packet handed to the kernel.
    fn sent(&mut self, direction: Direction, sent: std::io::Result<usize>) {
        let counts = self.stats.direction(direction);
        match sent {
            Ok(n) => {
                counts.delivered_packets += 1;
                counts.delivered_bytes += n as u64;
            }
            Err(e) => {
                debug!(error = %e, "re-injecting a packet failed");
                counts.send_failed += 1;
            }
        }
    }
}

/// The interfaces other than `lo` in `/proc/net/dev`'s listing (two header
/// lines, then `name: counters...`). A namespace fresh from `unshare -n`
/// has none: that is how the emulator tells a private namespace from the
/// host's (`/proc/1/ns/net`, the direct test, needs CAP_SYS_PTRACE, which
/// a container's root may lack).
fn other_interfaces(dev: &str) -> Vec<String> {
    dev.lines()
        .filter_map(|line| line.split_once(':'))
        .map(|(name, _)| name.trim().to_owned())
        .filter(|name| !name.is_empty() && name != "lo")
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fresh_namespace_has_only_lo() {
        let fresh = "Inter-|   Receive                            |  Transmit\n \
                     face |bytes    packets errs drop fifo frame compressed multicast|bytes\n    \
                     lo:       0       0    0    0    0     0          0         0        0\n";
        assert!(other_interfaces(fresh).is_empty());
        let host = format!("{fresh}  eth0: 123 4 0 0 0 0 0 0 567\n");
        assert_eq!(other_interfaces(&host), ["eth0"]);
        assert!(other_interfaces("garbage").is_empty());
    }

    #[test]
    fn the_default_config_is_valid() {
        TunLinkConfig::default().validate().unwrap();
    }

    /// A UDP packet (no checksum) from `src` to `dst`.
    fn udp(src: Ipv4Addr, dst: Ipv4Addr) -> Vec<u8> {
        let mut p = vec![0u8; 28];
        p[0] = 0x45;
        p[3] = 28;
        p[8] = 64;
        p[9] = 17;
        p[12..16].copy_from_slice(&src.octets());
        p[16..20].copy_from_slice(&dst.octets());
        p[20..24].copy_from_slice(&[0x9c, 0x40, 0x01, 0xbb]); // 40000 -> 443
        p[25] = 8;
        p
    }

    #[tokio::test(start_paused = true)]
    async fn packets_are_released_after_the_latency_rewritten() {
        let mut config = TunLinkConfig::default();
        config.link.latency = Duration::from_millis(25);
        let h = config.hairpin;
        let start = Instant::now();
        let mut pump = Pump::new(&config, start);
        pump.admit(&mut udp(h.local, h.remote));
        pump.admit(&mut udp(h.local, h.mirror));
        pump.admit(&mut [0x60; 40]);
        pump.admit(&mut udp(h.remote, h.local));
        assert_eq!(pump.pop_due(Instant::now()), None, "nothing before the latency");
        pump.queue.due().await;
        assert_eq!(start.elapsed(), Duration::from_millis(25));
        let (direction, packet) = pump.pop_due(Instant::now()).unwrap();
        assert_eq!(direction, Direction::ToUpstream);
        assert_eq!(packet[12..20], [h.mirror.octets(), h.local.octets()].concat());
        pump.sent(direction, Ok(packet.len()));
        let (direction, _) = pump.pop_due(Instant::now()).unwrap();
        assert_eq!(direction, Direction::ToClient);
        pump.sent(direction, Err(std::io::Error::other("refused")));
        assert_eq!(pump.pop_due(Instant::now()), None);
        let stats = &pump.stats;
        assert_eq!((stats.not_ipv4, stats.foreign, stats.malformed), (1, 1, 0));
        assert_eq!(stats.to_upstream.delivered_packets, 1);
        assert_eq!(stats.to_client.send_failed, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn loss_and_a_full_queue_drop_and_count() {
        let mut config = TunLinkConfig::default();
        config.link.loss = 1.0;
        let h = config.hairpin;
        let mut pump = Pump::new(&config, Instant::now());
        pump.admit(&mut udp(h.local, h.remote));
        assert_eq!(pump.stats.to_upstream.dropped_loss, 1);

        config.link.loss = 0.0;
        config.queue_packets = 1;
        let mut pump = Pump::new(&config, Instant::now());
        pump.admit(&mut udp(h.local, h.remote));
        pump.admit(&mut udp(h.local, h.remote));
        assert_eq!(pump.stats.to_upstream.received_packets, 2);
        assert_eq!(pump.stats.to_upstream.dropped_overflow, 1);
    }
}
