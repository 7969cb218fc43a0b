//! What the proxy carried: lock-free counters while it runs, a plain
//! snapshot ([`ProxyStats`]) for tests and the CLI's summary.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::Serialize;

use super::Protocol;
use super::link::Direction;

/// One direction's counts. A "packet" is a chunk read from a TCP socket or
/// a UDP datagram. For UDP, `received_packets` minus delivered, dropped and
/// failed is what was still queued when the proxy stopped (or its mapping
/// went away); for TCP the difference is what a reset or shutdown cut off.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct DirectionStats {
    pub received_packets: u64,
    pub received_bytes: u64,
    pub delivered_packets: u64,
    pub delivered_bytes: u64,
    /// UDP datagrams dropped by random loss.
    pub dropped_loss: u64,
    /// UDP datagrams dropped because the link was partitioned.
    pub dropped_partition: u64,
    /// UDP datagrams dropped because the queue in front of the bandwidth cap
    /// or the proxy's delay queue was full.
    pub dropped_overflow: u64,
    /// UDP datagrams held back so that later ones overtake them.
    pub reordered: u64,
    /// UDP datagrams the model let through that the proxy could not send on
    /// (e.g. the upstream port is closed: ICMP port unreachable).
    pub send_failed: u64,
    /// Simulated TCP retransmissions (each costs an RTO; see `link`).
    pub retransmits: u64,
    /// TCP chunks that had to wait for a partition to heal.
    pub stalled: u64,
}

impl DirectionStats {
    /// The `summary direction=...` line of one direction, as `opgraph-sim
    /// proxy` and `opgraph-sim tunlink` print it (counts that do not apply
    /// to a link stay 0).
    pub fn write_summary(&self, f: &mut fmt::Formatter<'_>, direction: Direction) -> fmt::Result {
        writeln!(
            f,
            "summary direction={} received_packets={} received_bytes={} delivered_packets={} \
             delivered_bytes={} dropped_loss={} dropped_partition={} dropped_overflow={} \
             reordered={} send_failed={} retransmits={} stalled={}",
            direction.as_str(),
            self.received_packets,
            self.received_bytes,
            self.delivered_packets,
            self.delivered_bytes,
            self.dropped_loss,
            self.dropped_partition,
            self.dropped_overflow,
            self.reordered,
            self.send_failed,
            self.retransmits,
            self.stalled,
        )
    }
}

/// A snapshot of everything the proxy counted since it started.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProxyStats {
    pub protocol: Protocol,
    pub seed: u64,
    pub elapsed: Duration,
    /// TCP connections accepted, or UDP client mappings created.
    pub connections: u64,
    /// Connections refused (reset) because the link was partitioned in
    /// `reset` mode or the upstream could not be reached.
    pub connections_refused: u64,
    /// Established connections reset by a partition (TCP), or UDP mappings
    /// forgotten by one.
    pub connections_reset: u64,
    /// UDP mappings removed after their idle timeout.
    pub connections_expired: u64,
    /// Partitions that began (scheduled or on demand).
    pub partitions: u64,
    pub to_upstream: DirectionStats,
    pub to_client: DirectionStats,
}

impl ProxyStats {
    pub fn direction(&self, direction: Direction) -> &DirectionStats {
        match direction {
            Direction::ToUpstream => &self.to_upstream,
            Direction::ToClient => &self.to_client,
        }
    }
}

/// The CLI's summary: `key=value` lines, one for the proxy and one per
/// direction, each starting with `summary`.
impl fmt::Display for ProxyStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "summary protocol={} seed={} elapsed={:.3}s connections={} refused={} reset={} \
             expired={} partitions={}",
            self.protocol.as_str(),
            self.seed,
            self.elapsed.as_secs_f64(),
            self.connections,
            self.connections_refused,
            self.connections_reset,
            self.connections_expired,
            self.partitions,
        )?;
        for direction in Direction::BOTH {
            self.direction(direction).write_summary(f, direction)?;
        }
        Ok(())
    }
}

#[derive(Debug, Default)]
pub(crate) struct DirectionCounters {
    pub received_packets: AtomicU64,
    pub received_bytes: AtomicU64,
    pub delivered_packets: AtomicU64,
    pub delivered_bytes: AtomicU64,
    pub dropped_loss: AtomicU64,
    pub dropped_partition: AtomicU64,
    pub dropped_overflow: AtomicU64,
    pub reordered: AtomicU64,
    pub send_failed: AtomicU64,
    pub retransmits: AtomicU64,
    pub stalled: AtomicU64,
}

impl DirectionCounters {
    pub fn received(&self, len: usize) {
        add(&self.received_packets, 1);
        add(&self.received_bytes, len as u64);
    }

    pub fn delivered(&self, len: usize) {
        add(&self.delivered_packets, 1);
        add(&self.delivered_bytes, len as u64);
    }

    fn snapshot(&self) -> DirectionStats {
        DirectionStats {
            received_packets: get(&self.received_packets),
            received_bytes: get(&self.received_bytes),
            delivered_packets: get(&self.delivered_packets),
            delivered_bytes: get(&self.delivered_bytes),
            dropped_loss: get(&self.dropped_loss),
            dropped_partition: get(&self.dropped_partition),
            dropped_overflow: get(&self.dropped_overflow),
            reordered: get(&self.reordered),
            send_failed: get(&self.send_failed),
            retransmits: get(&self.retransmits),
            stalled: get(&self.stalled),
        }
    }
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub connections: AtomicU64,
    pub connections_refused: AtomicU64,
    pub connections_reset: AtomicU64,
    pub connections_expired: AtomicU64,
    pub partitions: AtomicU64,
    pub to_upstream: DirectionCounters,
    pub to_client: DirectionCounters,
}

impl Counters {
    pub fn direction(&self, direction: Direction) -> &DirectionCounters {
        match direction {
            Direction::ToUpstream => &self.to_upstream,
            Direction::ToClient => &self.to_client,
        }
    }

    pub fn snapshot(&self, protocol: Protocol, seed: u64, elapsed: Duration) -> ProxyStats {
        ProxyStats {
            protocol,
            seed,
            elapsed,
            connections: get(&self.connections),
            connections_refused: get(&self.connections_refused),
            connections_reset: get(&self.connections_reset),
            connections_expired: get(&self.connections_expired),
            partitions: get(&self.partitions),
            to_upstream: self.to_upstream.snapshot(),
            to_client: self.to_client.snapshot(),
        }
    }
}

pub(crate) fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

fn get(counter: &AtomicU64) -> u64 {
    counter.load(Ordering::Relaxed)
}
