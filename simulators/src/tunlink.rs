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
        for (direction, s) in
            [(Direction::ToUpstream, &self.to_upstream), (Direction::ToClient, &self.to_client)]
        {
            writeln!(
                f,
                "summary direction={} received={} received_bytes={} delivered={} \
                 delivered_bytes={} dropped_loss={} dropped_overflow={} reordered={} send_failed={}",
                direction.as_str(),
                s.received_packets,
                s.received_bytes,
                s.delivered_packets,
                s.delivered_bytes,
                s.dropped_loss,
                s.dropped_overflow,
                s.reordered,
                s.send_failed
            )?;
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
        let start = Instant::now();
        let mut links = [Direction::ToUpstream, Direction::ToClient]
            .map(|d| Link::new(config.link.clone(), direction_seed(config.seed, d)));
        let mut queue: TimerQueue<(Direction, Vec<u8>)> = TimerQueue::new(config.queue_packets);
        let mut stats = TunLinkStats { seed: config.seed, ..TunLinkStats::default() };
        let mut buf = vec![0u8; MAX_PACKET];
        let mut carry = |buf: &mut [u8], stats: &mut TunLinkStats, queue: &mut TimerQueue<_>| {
            let rewritten = match config.hairpin.rewrite(buf) {
                Ok(rewritten) => rewritten,
                Err(refusal) => {
                    match refusal {
                        Refusal::NotIpv4 => stats.not_ipv4 += 1,
                        Refusal::Malformed => stats.malformed += 1,
                        Refusal::Foreign => stats.foreign += 1,
                    }
                    return;
                }
            };
            let (direction, len) = (rewritten.direction, rewritten.len);
            let counts = stats.direction(direction);
            counts.received_packets += 1;
            counts.received_bytes += len as u64;
            let link = &mut links[usize::from(direction == Direction::ToClient)];
            match link.datagram(start.elapsed(), len) {
                Verdict::Drop(DropReason::Loss) => counts.dropped_loss += 1,
                Verdict::Drop(DropReason::Overflow) => counts.dropped_overflow += 1,
                Verdict::Deliver { at, reordered } => {
                    counts.reordered += u64::from(reordered);
                    if !queue.push(start + at, (direction, buf[..len].to_vec())) {
                        counts.dropped_overflow += 1;
                    }
                }
            }
        };
        loop {
            tokio::select! {
                biased;
                () = cancel.cancelled() => break,
                () = queue.due() => {
                    while let Some((direction, packet)) = queue.pop_due(Instant::now()) {
                        let counts = stats.direction(direction);
                        match device.send(&packet) {
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
                read = device.recv(&mut buf) => {
                    let Some(n) = read.map_err(Error::io("reading the TUN device"))? else {
                        continue;
                    };
                    carry(&mut buf[..n], &mut stats, &mut queue);
                    // Drain what else is waiting, up to a bound.
                    for _ in 1..READ_BATCH {
                        match device.try_recv(&mut buf).map_err(Error::io("reading the TUN device"))? {
                            Some(n) => carry(&mut buf[..n], &mut stats, &mut queue),
                            None => break,
                        }
                    }
                }
            }
        }
        stats.elapsed = start.elapsed();
        Ok(stats)
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
}
