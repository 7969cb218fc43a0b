//! UDP (QUIC) through the flaky link.
//!
//! One listening socket faces the clients. Each client address gets its own
//! upstream socket, connected to the upstream (a NAT-like mapping), so the
//! upstream tells clients apart by source port as it would behind a NAT.
//!
//! - The main task reads the listening socket, asks the link model what
//!   happens to each datagram (drop, or deliver at a time) and keeps the
//!   survivors in a timer queue until they are due, then sends them from the
//!   client's upstream socket. It also expires idle mappings.
//! - One task per mapping does the same for the way back: reads the upstream
//!   socket, applies the model, sends from the listening socket to the
//!   client.
//!
//! Both directions drop datagrams while the link is partitioned, on arrival
//! and again when due. Timer queues are bounded (`udp_queue_datagrams`);
//! beyond that datagrams are dropped and counted as overflow.

use std::cmp::{Ordering, Reverse};
use std::collections::hash_map::Entry;
use std::collections::{BinaryHeap, HashMap};
use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{self, AtomicU64};

use tokio::net::UdpSocket;
use tokio::time::{Duration, Instant, MissedTickBehavior, interval, sleep_until};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, debug, info_span, warn};

use super::link::{Direction, DropReason, Verdict};
use super::stats::add;
use super::{PartitionMode, Shared};

/// Large enough for any UDP payload.
const MAX_DATAGRAM: usize = 65_535;

struct Mapping {
    socket: Arc<UdpSocket>,
    /// The partition epoch it was opened in (see `PartitionState`).
    epoch: u64,
    cancel: CancellationToken,
    /// Milliseconds since the proxy started, of the last datagram either way.
    last_active: Arc<AtomicU64>,
}

/// Forwards until cancelled.
pub(super) async fn run(
    listen: UdpSocket,
    shared: Arc<Shared>,
    cancel: CancellationToken,
    tracker: TaskTracker,
) {
    let listen = Arc::new(listen);
    let mut mappings: HashMap<SocketAddr, Mapping> = HashMap::new();
    let mut queue: TimerQueue<(Arc<UdpSocket>, Vec<u8>)> =
        TimerQueue::new(shared.config.udp_queue_datagrams);
    let mut buf = vec![0; MAX_DATAGRAM];
    let mut partition = shared.partition_rx();
    let reset_mode = shared.config.partition_mode == PartitionMode::Reset;
    let idle = shared.config.udp_idle_timeout;
    let mut sweep = interval((idle / 4).max(Duration::from_millis(10)));
    sweep.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            biased;
            () = cancel.cancelled() => break,
            () = queue.due() => {
                while let Some((socket, bytes)) = queue.pop_due(Instant::now()) {
                    if due(&shared, Direction::ToUpstream) {
                        let sent = socket.send(&bytes).await;
                        count_sent(&shared, Direction::ToUpstream, sent);
                    }
                }
            }
            received = listen.recv_from(&mut buf) => {
                let (n, client) = match received {
                    Ok(received) => received,
                    Err(e) => {
                        debug!(error = %e, "recv on the listening socket failed");
                        continue;
                    }
                };
                if reset_mode {
                    forget_mappings_older_than(&shared, &mut mappings, shared.partition_epoch());
                }
                let mapping = match mappings.entry(client) {
                    Entry::Occupied(entry) => entry.into_mut(),
                    Entry::Vacant(entry) => {
                        match open_mapping(&shared, &listen, client, &cancel, &tracker).await {
                            Ok(mapping) => entry.insert(mapping),
                            Err(e) => {
                                warn!(%client, error = %e, "cannot open an upstream socket");
                                shared.counters.to_upstream.received(n);
                                add(&shared.counters.to_upstream.send_failed, 1);
                                continue;
                            }
                        }
                    }
                };
                touch(&shared, &mapping.last_active);
                if let Some(at) = admit(&shared, Direction::ToUpstream, n)
                    && !queue.push(at, (mapping.socket.clone(), buf[..n].to_vec()))
                {
                    add(&shared.counters.to_upstream.dropped_overflow, 1);
                }
            }
            _ = sweep.tick() => {
                let now = millis(shared.now());
                mappings.retain(|client, mapping| {
                    let last = mapping.last_active.load(atomic::Ordering::Relaxed);
                    let keep = u128::from(now.saturating_sub(last)) < idle.as_millis();
                    if !keep {
                        debug!(%client, "udp mapping expired");
                        add(&shared.counters.connections_expired, 1);
                        mapping.cancel.cancel();
                    }
                    keep
                });
            }
            changed = partition.changed(), if reset_mode => {
                if changed.is_err() {
                    break;
                }
                let epoch = partition.borrow_and_update().epoch;
                forget_mappings_older_than(&shared, &mut mappings, epoch);
            }
        }
    }
    for mapping in mappings.values() {
        mapping.cancel.cancel();
    }
}

/// `reset` mode: a partition forgets the mappings opened before it began,
/// even if it has healed since.
fn forget_mappings_older_than(
    shared: &Shared,
    mappings: &mut HashMap<SocketAddr, Mapping>,
    epoch: u64,
) {
    mappings.retain(|client, mapping| {
        let keep = mapping.epoch == epoch;
        if !keep {
            debug!(%client, "udp mapping forgotten by a partition");
            add(&shared.counters.connections_reset, 1);
            mapping.cancel.cancel();
        }
        keep
    });
}

async fn open_mapping(
    shared: &Arc<Shared>,
    listen: &Arc<UdpSocket>,
    client: SocketAddr,
    cancel: &CancellationToken,
    tracker: &TaskTracker,
) -> io::Result<Mapping> {
    let upstream = shared.config.upstream;
    let any: SocketAddr = if upstream.is_ipv4() {
        (Ipv4Addr::UNSPECIFIED, 0).into()
    } else {
        (Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let socket = UdpSocket::bind(any).await?;
    socket.connect(upstream).await?;
    let socket = Arc::new(socket);
    add(&shared.counters.connections, 1);
    let mapping = Mapping {
        socket: socket.clone(),
        epoch: shared.partition_epoch(),
        cancel: cancel.child_token(),
        last_active: Arc::new(AtomicU64::new(millis(shared.now()))),
    };
    let span = info_span!("udp_mapping", %client, local = ?socket.local_addr().ok());
    tracker.spawn(
        to_client(
            socket,
            listen.clone(),
            client,
            shared.clone(),
            mapping.cancel.clone(),
            mapping.last_active.clone(),
        )
        .instrument(span),
    );
    Ok(mapping)
}

/// The way back for one mapping: upstream socket → model → client.
async fn to_client(
    socket: Arc<UdpSocket>,
    listen: Arc<UdpSocket>,
    client: SocketAddr,
    shared: Arc<Shared>,
    cancel: CancellationToken,
    last_active: Arc<AtomicU64>,
) {
    let mut queue: TimerQueue<Vec<u8>> = TimerQueue::new(shared.config.udp_queue_datagrams);
    let mut buf = vec![0; MAX_DATAGRAM];
    loop {
        tokio::select! {
            biased;
            () = cancel.cancelled() => break,
            () = queue.due() => {
                while let Some(bytes) = queue.pop_due(Instant::now()) {
                    if due(&shared, Direction::ToClient) {
                        let sent = listen.send_to(&bytes, client).await;
                        count_sent(&shared, Direction::ToClient, sent);
                    }
                }
            }
            received = socket.recv(&mut buf) => {
                let n = match received {
                    Ok(n) => n,
                    // e.g. ICMP port unreachable while the upstream restarts.
                    Err(e) => {
                        debug!(error = %e, "recv from the upstream failed");
                        continue;
                    }
                };
                touch(&shared, &last_active);
                if let Some(at) = admit(&shared, Direction::ToClient, n)
                    && !queue.push(at, buf[..n].to_vec())
                {
                    add(&shared.counters.to_client.dropped_overflow, 1);
                }
            }
        }
    }
}

/// Counts a datagram in and asks the model about it: `Some(time)` to send
/// it then, `None` if it is dropped (already counted).
fn admit(shared: &Shared, direction: Direction, len: usize) -> Option<Instant> {
    let counters = shared.counters.direction(direction);
    counters.received(len);
    if shared.is_partitioned() {
        add(&counters.dropped_partition, 1);
        return None;
    }
    match shared.link(direction).datagram(shared.now(), len) {
        Verdict::Drop(DropReason::Loss) => add(&counters.dropped_loss, 1),
        Verdict::Drop(DropReason::Overflow) => add(&counters.dropped_overflow, 1),
        Verdict::Deliver { at, reordered } => {
            if reordered {
                add(&counters.reordered, 1);
            }
            return Some(shared.start + at);
        }
    }
    None
}

/// Whether a datagram that is due may be sent: not if the link became
/// partitioned while it waited (then it is counted as dropped).
fn due(shared: &Shared, direction: Direction) -> bool {
    if shared.is_partitioned() {
        add(&shared.counters.direction(direction).dropped_partition, 1);
        return false;
    }
    true
}

fn count_sent(shared: &Shared, direction: Direction, sent: io::Result<usize>) {
    match sent {
        Ok(n) => shared.counters.direction(direction).delivered(n),
        Err(e) => {
            debug!(direction = direction.as_str(), error = %e, "send failed");
            add(&shared.counters.direction(direction).send_failed, 1);
        }
    }
}

fn touch(shared: &Shared, last_active: &AtomicU64) {
    last_active.store(millis(shared.now()), atomic::Ordering::Relaxed);
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Datagrams waiting for their delivery time, earliest first; ties keep
/// arrival order. Bounded: `push` refuses beyond `capacity`. Also the
/// delay line of the kernel-level emulator (`crate::tunlink`).
pub(crate) struct TimerQueue<T> {
    heap: BinaryHeap<Reverse<Pending<T>>>,
    next_seq: u64,
    capacity: usize,
}

struct Pending<T> {
    at: Instant,
    seq: u64,
    item: T,
}

impl<T> PartialEq for Pending<T> {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}

impl<T> Eq for Pending<T> {}

impl<T> PartialOrd for Pending<T> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl<T> Ord for Pending<T> {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
}

impl<T> TimerQueue<T> {
    pub(crate) fn new(capacity: usize) -> Self {
        Self { heap: BinaryHeap::new(), next_seq: 0, capacity }
    }

    pub(crate) fn push(&mut self, at: Instant, item: T) -> bool {
        if self.heap.len() >= self.capacity {
            return false;
        }
        self.heap.push(Reverse(Pending { at, seq: self.next_seq, item }));
        self.next_seq += 1;
        true
    }

    /// Resolves when the earliest item is due; never if the queue is empty.
    pub(crate) async fn due(&self) {
        match self.heap.peek() {
            Some(Reverse(first)) => sleep_until(first.at).await,
            None => std::future::pending().await,
        }
    }

    pub(crate) fn pop_due(&mut self, now: Instant) -> Option<T> {
        if self.heap.peek().is_some_and(|Reverse(first)| first.at <= now) {
            self.heap.pop().map(|Reverse(p)| p.item)
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn timer_queue_releases_in_time_order_and_is_bounded() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut q = TimerQueue::new(3);
        assert!(q.push(t0 + ms(20), "b"));
        assert!(q.push(t0 + ms(10), "a"));
        assert!(q.push(t0 + ms(20), "c"));
        assert!(!q.push(t0, "over capacity"));
        assert_eq!(q.pop_due(t0), None);
        q.due().await;
        assert_eq!(t0.elapsed(), ms(10));
        assert_eq!(q.pop_due(Instant::now()), Some("a"));
        q.due().await;
        assert_eq!(q.pop_due(Instant::now()), Some("b"), "ties keep arrival order");
        assert_eq!(q.pop_due(Instant::now()), Some("c"));
        assert_eq!(q.pop_due(Instant::now()), None);
    }
}
