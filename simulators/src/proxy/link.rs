//! The link model: what a flaky network does to each TCP chunk or UDP datagram.
//!
//! No I/O here: no sockets, no clock, no tokio. Every decision takes `now`
//! (time since the link started) and draws from a seeded RNG owned by the
//! model, so the same seed and the same sequence of calls give the same
//! decisions. The proxy's TCP and UDP pumps hold one [`Link`] per direction
//! and turn its verdicts into sleeps, writes and drops.
//!
//! # The model
//!
//! - **Latency and jitter**: each unit is delayed by `latency ± jitter`
//!   (uniform, never below zero). `latency` is one-way: a round trip through
//!   the proxy costs twice that.
//! - **Bandwidth**: a token bucket per direction (`bandwidth` bytes per
//!   second, `burst` bytes deep). A unit departs once the bucket has paid for
//!   it; the bucket may go into debt, which is the queue in front of the cap.
//!   UDP datagrams are tail-dropped when that queue would exceed `queue`
//!   bytes; TCP never drops (the pump's bounded buffer back-pressures the
//!   sender instead).
//! - **Loss, UDP**: a datagram is dropped with probability `loss`.
//! - **Loss, TCP**: TCP retransmits, so a lost chunk still arrives, late. A
//!   chunk is lost with probability `loss`, and each retransmission is lost
//!   again with the same probability (at most [`MAX_TCP_LOSSES`] times); `k`
//!   losses cost `rto × (2^k − 1)` (a retransmission timeout, doubling per
//!   retry). The stream stays in order, so a late chunk holds back everything
//!   behind it (head-of-line blocking), which is what makes loss hurt TCP.
//!   A chunk is one read from the socket (up to the proxy's `tcp_chunk`), so
//!   this is coarser than per-segment loss: it models the stalls, not the
//!   congestion window.
//! - **Reordering, UDP**: with probability `reorder` a datagram is held back
//!   by an extra `reorder_delay` so later ones overtake it. All others keep
//!   their order (jitter alone never reorders, like a FIFO queue). TCP ignores
//!   `reorder`: byte streams stay in order.
//! - **Partitions**: a [`PartitionSchedule`] of windows relative to the link's
//!   start, plus an on-demand switch. The model only says whether the link is
//!   partitioned at `now` and when that next changes; what a partition does to
//!   connections (stall or reset) is up to the pumps.
//!
//! Each datagram draws exactly three numbers from the RNG (loss, jitter,
//! reorder) whatever the config, so a loss pattern does not shift when, say,
//! jitter is switched on.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use bytesize::ByteSize;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

/// How many times one TCP chunk can be lost before it gets through.
pub const MAX_TCP_LOSSES: u32 = 6;

/// What the link does to traffic, the same in both directions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LinkConfig {
    /// Probability (0 to 1) that a UDP datagram is dropped, or that a TCP
    /// chunk must be retransmitted (see the module docs). Default 0.
    pub loss: f64,
    /// One-way delay added in each direction. Default 0.
    #[serde(with = "humantime_serde")]
    pub latency: Duration,
    /// The delay varies uniformly within `latency ± jitter`. Default 0.
    #[serde(with = "humantime_serde")]
    pub jitter: Duration,
    /// Probability (0 to 1) that a UDP datagram is held back by
    /// `reorder_delay` so that later ones overtake it. TCP ignores it.
    /// Default 0.
    pub reorder: f64,
    /// How long a reordered datagram is held back. Default 20 ms: longer
    /// than the gap between packets of a busy flow, short of a QUIC loss
    /// timeout.
    #[serde(with = "humantime_serde")]
    pub reorder_delay: Duration,
    /// Bandwidth cap per direction, in bytes per second. Default `None`:
    /// unlimited.
    pub bandwidth: Option<ByteSize>,
    /// Depth of the bandwidth token bucket: how much may pass at once after
    /// an idle spell. Default 16 KiB; larger lets bursts through faster
    /// than the cap.
    pub burst: ByteSize,
    /// Bytes that may wait for the bandwidth cap before UDP datagrams are
    /// tail-dropped (a router's buffer). Default 1 MiB. TCP back-pressures
    /// instead.
    pub queue: ByteSize,
    /// What one TCP loss costs before the retransmission arrives; doubled
    /// for each further loss of the same chunk. Default 200 ms, Linux's
    /// minimum retransmission timeout.
    #[serde(with = "humantime_serde")]
    pub rto: Duration,
}

impl Default for LinkConfig {
    fn default() -> Self {
        Self {
            loss: 0.0,
            latency: Duration::ZERO,
            jitter: Duration::ZERO,
            reorder: 0.0,
            reorder_delay: Duration::from_millis(20),
            bandwidth: None,
            burst: ByteSize::kib(16),
            queue: ByteSize::mib(1),
            rto: Duration::from_millis(200),
        }
    }
}

impl LinkConfig {
    /// Appends every problem found to `problems`, each prefixed by its key
    /// path under `prefix` (e.g. `link.loss`).
    pub fn validate(&self, prefix: &str, problems: &mut Vec<String>) {
        for (name, p) in [("loss", self.loss), ("reorder", self.reorder)] {
            if !(0.0..=1.0).contains(&p) {
                problems
                    .push(format!("{prefix}{name}: must be a probability from 0 to 1, got {p}"));
            }
        }
        if self.bandwidth.is_some_and(|b| b.as_u64() == 0) {
            problems
                .push(format!("{prefix}bandwidth: must be above 0 bytes/s (omit it for no cap)"));
        }
        if self.bandwidth.is_some() && self.burst.as_u64() == 0 {
            problems.push(format!("{prefix}burst: must be above 0 bytes when a bandwidth is set"));
        }
    }
}

/// The two directions through the proxy; each has its own [`Link`] and RNG.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// From the clients that connect to the proxy to the upstream server.
    ToUpstream,
    /// From the upstream server back to the clients.
    ToClient,
}

impl Direction {
    pub const BOTH: [Direction; 2] = [Direction::ToUpstream, Direction::ToClient];

    pub fn as_str(self) -> &'static str {
        match self {
            Direction::ToUpstream => "to_upstream",
            Direction::ToClient => "to_client",
        }
    }
}

/// The RNG seed of one direction's link, derived from the proxy's `--seed`
/// (splitmix64, so neighbouring seeds give unrelated streams). Tests use it
/// to predict exactly what the proxy drops.
pub fn direction_seed(seed: u64, direction: Direction) -> u64 {
    let salt: u64 = match direction {
        Direction::ToUpstream => 0x5550_5354_5245_414d,
        Direction::ToClient => 0x434c_4945_4e54_2121,
    };
    let mut z = seed ^ salt;
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Why a datagram did not get through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropReason {
    /// Random loss.
    Loss,
    /// The queue in front of the bandwidth cap was full.
    Overflow,
}

/// The fate of one UDP datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Send it at `at` (time since the link started).
    Deliver {
        at: Duration,
        /// Held back on purpose so later datagrams overtake it.
        reordered: bool,
    },
    Drop(DropReason),
}

/// When one TCP chunk may be written on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkPlan {
    /// Release time (time since the link started); never before the
    /// previous chunk of the same stream.
    pub at: Duration,
    /// How many times the chunk was "lost" and retransmitted.
    pub losses: u32,
}

/// Per-stream ordering state: a TCP connection's direction keeps one so its
/// chunks are released in order even with jitter and losses.
#[derive(Debug, Clone, Copy, Default)]
pub struct StreamOrder {
    last: Duration,
}

/// One direction of the simulated link.
#[derive(Debug)]
pub struct Link {
    config: LinkConfig,
    rng: StdRng,
    bucket: TokenBucket,
    /// Release time of the last datagram that was not held back: the others
    /// never overtake it.
    fifo: Duration,
}

impl Link {
    pub fn new(config: LinkConfig, seed: u64) -> Self {
        let bucket = TokenBucket::full(&config);
        Self { config, rng: StdRng::seed_from_u64(seed), bucket, fifo: Duration::ZERO }
    }

    pub fn config(&self) -> &LinkConfig {
        &self.config
    }

    /// Replaces the config; the RNG and the bucket's level carry on.
    pub fn set_config(&mut self, config: LinkConfig) {
        self.config = config;
    }

    /// Decides the fate of a UDP datagram of `len` bytes that arrived at `now`.
    pub fn datagram(&mut self, now: Duration, len: usize) -> Verdict {
        let loss_draw: f64 = self.rng.random();
        let jitter_draw: f64 = self.rng.random();
        let reorder_draw: f64 = self.rng.random();
        if loss_draw < self.config.loss {
            return Verdict::Drop(DropReason::Loss);
        }
        let Some(depart) = self.bucket.depart(&self.config, now, len, true) else {
            return Verdict::Drop(DropReason::Overflow);
        };
        let at = depart + self.delay(jitter_draw);
        if reorder_draw < self.config.reorder {
            return Verdict::Deliver { at: at + self.config.reorder_delay, reordered: true };
        }
        let at = at.max(self.fifo);
        self.fifo = at;
        Verdict::Deliver { at, reordered: false }
    }

    /// Plans a TCP chunk of `len` bytes read at `now` on the stream `order`.
    pub fn chunk(&mut self, now: Duration, len: usize, order: &mut StreamOrder) -> ChunkPlan {
        let mut losses = 0;
        while losses < MAX_TCP_LOSSES && self.rng.random::<f64>() < self.config.loss {
            losses += 1;
        }
        let jitter_draw: f64 = self.rng.random();
        // Without a queue limit the bucket always says when.
        let depart = self.bucket.depart(&self.config, now, len, false).unwrap_or(now);
        let penalty = self.config.rto.saturating_mul((1u32 << losses) - 1);
        let at = (depart + self.delay(jitter_draw) + penalty).max(order.last);
        order.last = at;
        ChunkPlan { at, losses }
    }

    /// When the end of a TCP stream (FIN) read at `now` may be passed on:
    /// after the last chunk and one latency, never lost.
    pub fn fin(&self, now: Duration, order: &mut StreamOrder) -> Duration {
        let at = (now + self.config.latency).max(order.last);
        order.last = at;
        at
    }

    fn delay(&self, draw: f64) -> Duration {
        let latency = self.config.latency.as_secs_f64();
        let jitter = self.config.jitter.as_secs_f64();
        Duration::from_secs_f64((latency + jitter * (2.0 * draw - 1.0)).max(0.0))
    }
}

/// A token bucket that may go into debt: the debt is the queue waiting for
/// the cap, and the time to pay it off is the queueing delay.
#[derive(Debug)]
struct TokenBucket {
    /// Bytes available; negative while a queue waits.
    tokens: f64,
    updated: Duration,
}

impl TokenBucket {
    fn full(config: &LinkConfig) -> Self {
        Self { tokens: config.burst.as_u64() as f64, updated: Duration::ZERO }
    }

    /// When `len` bytes arriving at `now` may leave; `None` if `limit_queue`
    /// and they would overflow the queue (the bucket is then unchanged).
    fn depart(
        &mut self,
        config: &LinkConfig,
        now: Duration,
        len: usize,
        limit_queue: bool,
    ) -> Option<Duration> {
        let Some(rate) = config.bandwidth.map(|b| b.as_u64() as f64) else {
            return Some(now);
        };
        let burst = config.burst.as_u64() as f64;
        let elapsed = now.saturating_sub(self.updated).as_secs_f64();
        self.updated = self.updated.max(now);
        self.tokens = (self.tokens + elapsed * rate).min(burst);
        let after = self.tokens - len as f64;
        if limit_queue && -after > config.queue.as_u64() as f64 {
            return None;
        }
        self.tokens = after;
        if after >= 0.0 { Some(now) } else { Some(now + Duration::from_secs_f64(-after / rate)) }
    }
}

/// A scheduled partition: nothing passes from `start` (time since the proxy
/// started) for `duration`. Written `START+DURATION`, e.g. `10s+3s`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct PartitionWindow {
    pub start: Duration,
    pub duration: Duration,
}

impl PartitionWindow {
    pub fn end(&self) -> Duration {
        self.start.saturating_add(self.duration)
    }

    fn contains(&self, now: Duration) -> bool {
        self.start <= now && now < self.end()
    }
}

impl FromStr for PartitionWindow {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (start, duration) = s
            .split_once('+')
            .ok_or_else(|| format!("partition {s:?}: expected START+DURATION, e.g. 10s+3s"))?;
        let parse = |what: &str, v: &str| {
            humantime::parse_duration(v.trim())
                .map_err(|e| format!("partition {s:?}: bad {what} {v:?}: {e}"))
        };
        let window = Self { start: parse("start", start)?, duration: parse("duration", duration)? };
        if window.duration.is_zero() {
            return Err(format!("partition {s:?}: duration must be above 0"));
        }
        Ok(window)
    }
}

impl TryFrom<String> for PartitionWindow {
    type Error = String;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl From<PartitionWindow> for String {
    fn from(w: PartitionWindow) -> Self {
        w.to_string()
    }
}

impl fmt::Display for PartitionWindow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}+{}",
            humantime::format_duration(self.start),
            humantime::format_duration(self.duration)
        )
    }
}

/// Scheduled partition windows plus an on-demand switch.
#[derive(Debug, Clone, Default)]
pub struct PartitionSchedule {
    windows: Vec<PartitionWindow>,
    forced: bool,
}

impl PartitionSchedule {
    pub fn new(mut windows: Vec<PartitionWindow>) -> Self {
        windows.sort_by_key(|w| w.start);
        Self { windows, forced: false }
    }

    /// Partitions (`true`) or heals (`false`) the link on demand, on top of
    /// the schedule: a scheduled window still partitions a healed link.
    pub fn set_forced(&mut self, on: bool) {
        self.forced = on;
    }

    pub fn is_partitioned(&self, now: Duration) -> bool {
        self.forced || self.windows.iter().any(|w| w.contains(now))
    }

    /// The next time after `now` at which a window starts or ends: when the
    /// state may change without anyone calling [`Self::set_forced`].
    pub fn next_change(&self, now: Duration) -> Option<Duration> {
        self.windows.iter().flat_map(|w| [w.start, w.end()]).filter(|&t| t > now).min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn link(config: LinkConfig) -> Link {
        Link::new(config, 42)
    }

    fn deliveries(link: &mut Link, now: Duration, n: usize, len: usize) -> Vec<Verdict> {
        (0..n).map(|_| link.datagram(now, len)).collect()
    }

    #[test]
    fn same_seed_same_decisions_and_loss_rate_matches() {
        let config =
            LinkConfig { loss: 0.1, jitter: 5 * MS, latency: 10 * MS, ..Default::default() };
        let a = deliveries(&mut link(config.clone()), Duration::ZERO, 10_000, 100);
        let b = deliveries(&mut link(config.clone()), Duration::ZERO, 10_000, 100);
        assert_eq!(a, b);
        let c = deliveries(&mut Link::new(config, 43), Duration::ZERO, 10_000, 100);
        assert_ne!(a, c);
        let lost = a.iter().filter(|v| **v == Verdict::Drop(DropReason::Loss)).count();
        assert!((850..=1150).contains(&lost), "lost {lost} of 10000 at 10%");
    }

    #[test]
    fn loss_pattern_does_not_depend_on_other_settings() {
        let plain = LinkConfig { loss: 0.3, ..Default::default() };
        let busy = LinkConfig { jitter: 7 * MS, reorder: 0.5, ..plain.clone() };
        let dropped = |c: LinkConfig| -> Vec<bool> {
            deliveries(&mut link(c), Duration::ZERO, 1000, 10)
                .iter()
                .map(|v| matches!(v, Verdict::Drop(_)))
                .collect()
        };
        assert_eq!(dropped(plain), dropped(busy));
    }

    #[test]
    fn delay_stays_within_latency_plus_minus_jitter_and_keeps_fifo_order() {
        let mut l = link(LinkConfig { latency: 50 * MS, jitter: 10 * MS, ..Default::default() });
        let mut last = Duration::ZERO;
        for i in 0..1000u64 {
            let now = Duration::from_micros(i * 100);
            let Verdict::Deliver { at, reordered: false } = l.datagram(now, 100) else {
                panic!("nothing should be dropped or reordered");
            };
            assert!(at >= now + 40 * MS && at <= (now + 60 * MS).max(last), "at {at:?}");
            assert!(at >= last, "jitter alone must not reorder");
            last = at;
        }
    }

    #[test]
    fn reordered_datagrams_are_held_back_and_overtaken() {
        let mut l = link(LinkConfig { reorder: 0.2, reorder_delay: 30 * MS, ..Default::default() });
        let verdicts = deliveries(&mut l, Duration::ZERO, 1000, 10);
        let held = verdicts
            .iter()
            .filter(|v| matches!(v, Verdict::Deliver { reordered: true, at } if *at == 30 * MS))
            .count();
        assert!((150..=250).contains(&held), "held back {held} of 1000 at 20%");
        assert!(verdicts.iter().all(|v| matches!(v, Verdict::Deliver { reordered: true, .. })
            || *v == Verdict::Deliver { at: Duration::ZERO, reordered: false }));
    }

    #[test]
    fn bandwidth_cap_spaces_departures_after_the_burst() {
        // 1000 bytes/s, 100-byte bucket: the first 100 bytes go at once,
        // then one 100-byte datagram every 100 ms.
        let config = LinkConfig {
            bandwidth: Some(ByteSize::b(1000)),
            burst: ByteSize::b(100),
            ..Default::default()
        };
        let mut l = link(config);
        let ats: Vec<Duration> = deliveries(&mut l, Duration::ZERO, 4, 100)
            .into_iter()
            .map(|v| match v {
                Verdict::Deliver { at, .. } => at,
                Verdict::Drop(r) => panic!("dropped: {r:?}"),
            })
            .collect();
        assert_eq!(ats, [0, 100, 200, 300].map(|ms| ms * MS));
        // After an idle second the bucket is full again, never fuller.
        let now = Duration::from_secs(2);
        assert_eq!(l.datagram(now, 100), Verdict::Deliver { at: now, reordered: false });
        assert_eq!(l.datagram(now, 100), Verdict::Deliver { at: now + 100 * MS, reordered: false });
    }

    #[test]
    fn udp_queue_overflow_tail_drops_without_charging_the_bucket() {
        let config = LinkConfig {
            bandwidth: Some(ByteSize::b(1000)),
            burst: ByteSize::b(100),
            queue: ByteSize::b(250),
            ..Default::default()
        };
        let mut l = link(config);
        let v = deliveries(&mut l, Duration::ZERO, 5, 100);
        // 100 from the bucket, 200 queued, the fourth would make 300 > 250.
        assert_eq!(v[3], Verdict::Drop(DropReason::Overflow));
        assert_eq!(v[4], Verdict::Drop(DropReason::Overflow));
        // 50 ms later 50 bytes have drained: 150 queued + 100 fits.
        assert!(matches!(l.datagram(50 * MS, 100), Verdict::Deliver { .. }));
    }

    #[test]
    fn tcp_chunks_stay_in_order_and_losses_cost_doubling_rtos() {
        let config = LinkConfig {
            loss: 0.3,
            latency: 10 * MS,
            jitter: 10 * MS,
            rto: 100 * MS,
            ..Default::default()
        };
        let mut l = link(config);
        let mut order = StreamOrder::default();
        let mut last = Duration::ZERO;
        let mut lossy = 0;
        for i in 0..1000u64 {
            let now = Duration::from_millis(i);
            let plan = l.chunk(now, 1000, &mut order);
            assert!(plan.at >= last, "TCP chunks must stay in order");
            let penalty = 100 * MS * ((1 << plan.losses) - 1);
            assert!(plan.at >= now + penalty, "a loss must cost its RTOs");
            assert!(plan.losses <= MAX_TCP_LOSSES);
            lossy += usize::from(plan.losses > 0);
            last = plan.at;
        }
        assert!((250..=350).contains(&lossy), "{lossy} lossy chunks of 1000 at 30%");
        let fin = l.fin(Duration::from_secs(1), &mut order);
        assert!(fin >= last);
    }

    #[test]
    fn tcp_bandwidth_queues_without_dropping() {
        let config = LinkConfig {
            bandwidth: Some(ByteSize::b(1000)),
            burst: ByteSize::b(100),
            queue: ByteSize::b(100),
            ..Default::default()
        };
        let mut l = link(config);
        let mut order = StreamOrder::default();
        let last = (0..10).map(|_| l.chunk(Duration::ZERO, 100, &mut order).at).last();
        assert_eq!(last, Some(900 * MS));
    }

    #[test]
    fn partition_schedule_reports_state_and_next_change() {
        let windows = vec!["30s+5s".parse().unwrap(), "10s+3s".parse().unwrap()];
        let mut s = PartitionSchedule::new(windows);
        let secs = Duration::from_secs;
        assert!(!s.is_partitioned(secs(0)));
        assert_eq!(s.next_change(secs(0)), Some(secs(10)));
        assert!(s.is_partitioned(secs(10)));
        assert_eq!(s.next_change(secs(10)), Some(secs(13)));
        assert!(!s.is_partitioned(secs(13)));
        assert_eq!(s.next_change(secs(13)), Some(secs(30)));
        assert_eq!(s.next_change(secs(35)), None);
        s.set_forced(true);
        assert!(s.is_partitioned(secs(20)));
        s.set_forced(false);
        assert!(!s.is_partitioned(secs(20)));
        assert!(s.is_partitioned(secs(31)), "healing on demand does not cancel the schedule");
    }

    #[test]
    fn partition_windows_parse_and_print() {
        let w: PartitionWindow = "1m 30s+500ms".parse().unwrap();
        assert_eq!(w.start, Duration::from_secs(90));
        assert_eq!(w.duration, 500 * MS);
        assert_eq!(w.to_string(), "1m 30s+500ms");
        assert_eq!(w.to_string().parse::<PartitionWindow>(), Ok(w));
        for bad in ["10s", "10s+", "x+3s", "10s+0s"] {
            assert!(bad.parse::<PartitionWindow>().is_err(), "{bad} should not parse");
        }
    }

    #[test]
    fn validation_names_every_bad_key() {
        let config = LinkConfig {
            loss: 1.5,
            reorder: -0.1,
            bandwidth: Some(ByteSize::b(0)),
            ..Default::default()
        };
        let mut problems = Vec::new();
        config.validate("link.", &mut problems);
        assert_eq!(problems.len(), 3, "{problems:?}");
        assert!(problems[0].starts_with("link.loss:"));
        assert!(problems[1].starts_with("link.reorder:"));
        assert!(problems[2].starts_with("link.bandwidth:"));
        let mut none = Vec::new();
        LinkConfig::default().validate("", &mut none);
        assert!(none.is_empty());
    }

    #[test]
    fn direction_seeds_differ() {
        assert_ne!(
            direction_seed(42, Direction::ToUpstream),
            direction_seed(42, Direction::ToClient)
        );
        assert_ne!(
            direction_seed(1, Direction::ToUpstream),
            direction_seed(2, Direction::ToUpstream)
        );
    }
}
