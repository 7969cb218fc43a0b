//! Congestion control for the QUIC uplink on links that drop packets
//! without being congested: site Wi-Fi, cellular modems, long radio hops.
//!
//! Cubic, quinn's default, reads every loss as congestion and cuts its
//! window by 30 %. At 2 % random loss and a 50 ms round trip it settles
//! near 240 KB/s whatever the link could carry (Mathis et al.: MSS / RTT ×
//! 1.22 / √p), and so does kernel TCP under gRPC. [`LossTolerant`] is
//! quinn's Cubic with one change in what counts as congestion. A loss is
//! passed on to Cubic (which then backs off as usual) when the path shows
//! congestion:
//!
//! - the round trip has grown by a queue ([`queue_allowance`] above the
//!   path's minimum), as it does behind a bottleneck whose buffer fills
//!   before it overflows;
//! - the smoothed loss rate is above [`MAX_NOISE_LOSS_RATE`], as behind a
//!   policer or a shallow buffer that drops without queueing;
//! - ECN marked a packet (quinn reports it as a congestion event with no
//!   lost bytes);
//! - everything sent for a while was lost (persistent congestion).
//!
//! Any other loss is link noise: quinn still retransmits the data, the
//! window stays, and [`LossTolerant::noise_losses`] counts it. Other flows
//! on a congested path therefore see Cubic; the uplink only stops paying
//! for losses that no sender could have avoided by slowing down. This is
//! the loss differentiation of TCP Veno (Fu and Liew, 2003) with a delay
//! allowance in time rather than in packets, plus a loss-rate guard in the
//! spirit of BBR v2's.

use std::any::Any;
use std::sync::Arc;
use std::time::{Duration, Instant};

use quinn::congestion::{Controller, ControllerFactory, ControllerMetrics, Cubic, CubicConfig};
use quinn_proto::RttEstimator;

/// Above this smoothed fraction of bytes lost, losses count as congestion
/// whatever the round trip says. 2 % random loss stays well below it; an
/// overshoot into a policer goes far above it within a few round trips.
pub const MAX_NOISE_LOSS_RATE: f64 = 0.05;

/// Weight of each round's loss fraction in the smoothed rate.
const LOSS_RATE_GAIN: f64 = 0.25;

/// A round closes after a round trip and at least this many bytes: at a
/// few packets per round trip, one loss in a dozen packets would read as
/// 8 % and trip [`MAX_NOISE_LOSS_RATE`]. 64 full-size packets make 2 %
/// random loss look like more than 5 % in about one round in 25, which
/// the smoothing then damps.
const MIN_ROUND_BYTES: u64 = 64 * 1200;

/// Smallest queueing delay read as congestion, whatever the path's minimum
/// round trip: timer and scheduling jitter alone move a round trip by a
/// few milliseconds.
const MIN_QUEUE_ALLOWANCE: Duration = Duration::from_millis(5);

/// The queueing delay (smoothed round trip above the minimum) from which a
/// loss counts as congestion: a quarter of the minimum round trip, at
/// least `MIN_QUEUE_ALLOWANCE`.
pub fn queue_allowance(min_rtt: Duration) -> Duration {
    (min_rtt / 4).max(MIN_QUEUE_ALLOWANCE)
}

/// Builds a [`LossTolerant`] controller per connection.
#[derive(Debug, Default)]
pub struct LossTolerantConfig {
    cubic: Arc<CubicConfig>,
}

impl ControllerFactory for LossTolerantConfig {
    fn build(self: Arc<Self>, now: Instant, current_mtu: u16) -> Box<dyn Controller> {
        Box::new(LossTolerant::new(Cubic::new(self.cubic.clone(), now, current_mtu)))
    }
}

/// Cubic that ignores losses the path does not show as congestion (see
/// the module documentation).
#[derive(Debug, Clone)]
pub struct LossTolerant {
    cubic: Cubic,
    smoothed_rtt: Option<Duration>,
    min_rtt: Duration,
    /// Bytes acknowledged and lost since `round_start`.
    round_acked: u64,
    round_lost: u64,
    round_start: Option<Instant>,
    loss_rate: f64,
    noise_losses: u64,
}

impl LossTolerant {
    pub fn new(cubic: Cubic) -> Self {
        LossTolerant {
            cubic,
            smoothed_rtt: None,
            min_rtt: Duration::MAX,
            round_acked: 0,
            round_lost: 0,
            round_start: None,
            loss_rate: 0.0,
            noise_losses: 0,
        }
    }

    /// Losses that were not passed on to Cubic.
    pub fn noise_losses(&self) -> u64 {
        self.noise_losses
    }

    /// The smoothed fraction of bytes lost per round trip.
    pub fn loss_rate(&self) -> f64 {
        self.loss_rate
    }

    /// Takes the path's round trips from an acknowledgement; quinn's
    /// estimator is only handed to us, so tests call this directly.
    fn observe_rtt(&mut self, smoothed: Duration, min: Duration) {
        self.smoothed_rtt = Some(smoothed);
        self.min_rtt = min;
    }

    /// Closes the current round (at least a smoothed round trip and
    /// [`MIN_ROUND_BYTES`] long) into the loss rate.
    fn end_round_if_due(&mut self, now: Instant) {
        let Some(rtt) = self.smoothed_rtt else { return };
        let start = *self.round_start.get_or_insert(now);
        let total = self.round_acked + self.round_lost;
        if now.saturating_duration_since(start) < rtt || total < MIN_ROUND_BYTES {
            return;
        }
        let sample = self.round_lost as f64 / total as f64;
        self.loss_rate += LOSS_RATE_GAIN * (sample - self.loss_rate);
        self.round_acked = 0;
        self.round_lost = 0;
        self.round_start = Some(now);
    }

    /// Whether a loss event is congestion (see the module documentation).
    fn is_congestion(&self, persistent: bool, lost_bytes: u64) -> bool {
        if persistent || lost_bytes == 0 {
            return true;
        }
        let Some(smoothed) = self.smoothed_rtt else {
            // No round trip measured yet: nothing says it is noise.
            return true;
        };
        let queue = smoothed.saturating_sub(self.min_rtt);
        queue > queue_allowance(self.min_rtt) || self.loss_rate > MAX_NOISE_LOSS_RATE
    }
}

impl Controller for LossTolerant {
    fn on_sent(&mut self, now: Instant, bytes: u64, last_packet_number: u64) {
        self.cubic.on_sent(now, bytes, last_packet_number);
    }

    fn on_ack(
        &mut self,
        now: Instant,
        sent: Instant,
        bytes: u64,
        app_limited: bool,
        rtt: &RttEstimator,
    ) {
        self.observe_rtt(rtt.get(), rtt.min());
        self.round_acked += bytes;
        self.cubic.on_ack(now, sent, bytes, app_limited, rtt);
    }

    fn on_end_acks(
        &mut self,
        now: Instant,
        in_flight: u64,
        app_limited: bool,
        largest_packet_num_acked: Option<u64>,
    ) {
        self.end_round_if_due(now);
        self.cubic.on_end_acks(now, in_flight, app_limited, largest_packet_num_acked);
    }

    fn on_congestion_event(
        &mut self,
        now: Instant,
        sent: Instant,
        is_persistent_congestion: bool,
        lost_bytes: u64,
    ) {
        self.round_lost += lost_bytes;
        if self.is_congestion(is_persistent_congestion, lost_bytes) {
            self.cubic.on_congestion_event(now, sent, is_persistent_congestion, lost_bytes);
        } else {
            self.noise_losses += 1;
        }
    }

    fn on_mtu_update(&mut self, new_mtu: u16) {
        self.cubic.on_mtu_update(new_mtu);
    }

    fn window(&self) -> u64 {
        self.cubic.window()
    }

    fn metrics(&self) -> ControllerMetrics {
        self.cubic.metrics()
    }

    fn clone_box(&self) -> Box<dyn Controller> {
        Box::new(self.clone())
    }

    fn initial_window(&self) -> u64 {
        self.cubic.initial_window()
    }

    fn into_any(self: Box<Self>) -> Box<dyn Any> {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MTU: u16 = 1200;
    const MIN_RTT: Duration = Duration::from_millis(50);

    fn controller(now: Instant) -> LossTolerant {
        LossTolerant::new(Cubic::new(Arc::default(), now, MTU))
    }

    /// One round trip of acknowledgements of `acked` bytes with `lost`
    /// bytes lost in it, then the round closed.
    fn round(c: &mut LossTolerant, now: &mut Instant, smoothed: Duration, acked: u64, lost: u64) {
        c.observe_rtt(smoothed, MIN_RTT);
        c.round_acked += acked;
        c.round_lost += lost;
        c.end_round_if_due(*now);
        *now += smoothed;
        c.end_round_if_due(*now);
    }

    fn loss(c: &mut LossTolerant, now: Instant, lost: u64) {
        c.on_congestion_event(now, now - Duration::from_millis(1), false, lost);
    }

    #[test]
    fn a_random_loss_on_a_path_without_a_queue_keeps_the_window() {
        let mut now = Instant::now();
        let mut c = controller(now);
        for _ in 0..16 {
            round(&mut c, &mut now, MIN_RTT + Duration::from_millis(2), 100_000, 2_000);
        }
        let window = c.window();
        loss(&mut c, now, 1200);
        assert_eq!(c.window(), window);
        assert_eq!(c.noise_losses(), 1);
        assert!((c.loss_rate() - 0.0196).abs() < 0.002, "loss rate {}", c.loss_rate());
    }

    #[test]
    fn two_percent_loss_at_a_few_packets_per_round_trip_stays_noise() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut now = Instant::now();
        let mut c = controller(now);
        let mut highest: f64 = 0.0;
        // 5000 packets of 1200 B, 12 per round trip, each lost with p = 2 %.
        for _ in 0..5000 / 12 {
            let lost = (0..12).filter(|_| rng.random_bool(0.02)).count() as u64;
            round(&mut c, &mut now, MIN_RTT, (12 - lost) * 1200, lost * 1200);
            highest = highest.max(c.loss_rate());
        }
        assert!(highest <= MAX_NOISE_LOSS_RATE, "smoothed loss rate reached {highest}");
        assert!(c.loss_rate() > 0.005, "the rate still follows the loss: {}", c.loss_rate());
    }

    #[test]
    fn a_loss_behind_a_growing_queue_is_congestion() {
        let mut now = Instant::now();
        let mut c = controller(now);
        // 14 ms above a 50 ms minimum is past the 12.5 ms allowance.
        round(&mut c, &mut now, MIN_RTT + Duration::from_millis(14), 100_000, 0);
        let window = c.window();
        loss(&mut c, now, 1200);
        assert!(c.window() < window, "window {} stayed at {window}", c.window());
        assert_eq!(c.noise_losses(), 0);
    }

    #[test]
    fn a_high_loss_rate_is_congestion_without_a_queue() {
        let mut now = Instant::now();
        let mut c = controller(now);
        for _ in 0..8 {
            round(&mut c, &mut now, MIN_RTT, 90_000, 10_000);
        }
        assert!(c.loss_rate() > MAX_NOISE_LOSS_RATE);
        let window = c.window();
        loss(&mut c, now, 1200);
        assert!(c.window() < window);
    }

    #[test]
    fn ecn_marks_and_persistent_congestion_are_always_congestion() {
        let mut now = Instant::now();
        let mut c = controller(now);
        round(&mut c, &mut now, MIN_RTT, 100_000, 0);
        let window = c.window();
        loss(&mut c, now, 0);
        let after_ecn = c.window();
        assert!(after_ecn < window);

        now += Duration::from_secs(1);
        c.on_congestion_event(now, now - Duration::from_millis(1), true, 1200);
        assert_eq!(c.window(), 2 * u64::from(MTU), "persistent congestion: minimum window");
        assert_eq!(c.noise_losses(), 0);
    }

    #[test]
    fn a_loss_before_any_round_trip_is_congestion() {
        let now = Instant::now();
        let mut c = controller(now);
        let window = c.window();
        loss(&mut c, now, 1200);
        assert!(c.window() < window);
    }

    #[test]
    fn the_queue_allowance_scales_with_the_path_and_has_a_floor() {
        assert_eq!(queue_allowance(Duration::from_millis(100)), Duration::from_millis(25));
        assert_eq!(queue_allowance(Duration::from_millis(1)), MIN_QUEUE_ALLOWANCE);
    }
}
