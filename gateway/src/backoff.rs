//! Capped exponential backoff with jitter, for every reconnect.
//!
//! I/O-free: the caller passes the random source in, so tests are
//! deterministic. Delays double from `initial` up to `max`; each delay is
//! drawn uniformly from the upper half of the current step ("equal
//! jitter"), so gateways that lost the cloud together do not come back in
//! lock step, and no delay is ever shorter than half a step.

use std::time::Duration;

use rand::Rng;

/// Longest accepted `backoff_initial` and `backoff_max`: a peer that is
/// back should not wait longer than this to be noticed.
pub const MAX_BACKOFF: Duration = Duration::from_secs(3600);

/// The problems of a `backoff_initial` .. `backoff_max` pair, each under
/// its key. Every reconnecting loop's table checks its pair here, so a
/// zero step (a loop that retries flat out) is refused everywhere alike.
pub fn problems(initial: Duration, max: Duration) -> Vec<String> {
    let mut problems = Vec::new();
    if initial.is_zero() || initial > MAX_BACKOFF {
        problems.push("backoff_initial: must be above 0 and at most 1h".to_owned());
    }
    if max < initial || max > MAX_BACKOFF {
        problems.push("backoff_max: must be at least backoff_initial and at most 1h".to_owned());
    }
    problems
}

/// Backoff state of one reconnecting loop.
#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    attempt: u32,
}

impl Backoff {
    /// A backoff starting at `initial` and capped at `max` (`max` below
    /// `initial` is read as `initial`).
    pub fn new(initial: Duration, max: Duration) -> Self {
        Backoff { initial, max: max.max(initial), attempt: 0 }
    }

    /// The delay before the next attempt; each call doubles the step until
    /// it reaches `max`.
    pub fn next_delay(&mut self, rng: &mut impl Rng) -> Duration {
        let step = self.step();
        self.attempt = self.attempt.saturating_add(1);
        let half = step / 2;
        let jitter_nanos = u64::try_from(half.as_nanos()).unwrap_or(u64::MAX);
        let jitter = if jitter_nanos == 0 { 0 } else { rng.random_range(0..=jitter_nanos) };
        (step - half) + Duration::from_nanos(jitter)
    }

    /// The step of the next attempt, before jitter.
    fn step(&self) -> Duration {
        let factor = 1u32.checked_shl(self.attempt.min(31)).unwrap_or(u32::MAX);
        self.initial.checked_mul(factor).map_or(self.max, |d| d.min(self.max))
    }

    /// Starts over from `initial` (after a session made progress).
    pub fn reset(&mut self) {
        self.attempt = 0;
    }

    /// Attempts since the last reset.
    pub fn attempts(&self) -> u32 {
        self.attempt
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    #[test]
    fn doubles_up_to_the_cap_within_the_jitter_band() {
        let mut rng = StdRng::seed_from_u64(7);
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
        let steps = [100, 200, 400, 800, 1000, 1000, 1000];
        for step in steps {
            let step = Duration::from_millis(step);
            let delay = backoff.next_delay(&mut rng);
            assert!(delay >= step / 2 && delay <= step, "{delay:?} outside {step:?}/2..={step:?}");
        }
        assert_eq!(backoff.attempts(), 7);
    }

    #[test]
    fn jitter_spreads_delays() {
        let mut rng = StdRng::seed_from_u64(1);
        let delays: Vec<Duration> = (0..20)
            .map(|_| Backoff::new(Duration::from_secs(1), Duration::from_secs(1)))
            .map(|mut b| b.next_delay(&mut rng))
            .collect();
        let distinct: std::collections::HashSet<_> = delays.iter().collect();
        assert!(distinct.len() > 10, "{delays:?}");
    }

    #[test]
    fn reset_starts_over_and_huge_attempts_stay_capped() {
        let mut rng = StdRng::seed_from_u64(3);
        let mut backoff = Backoff::new(Duration::from_millis(10), Duration::from_secs(60));
        for _ in 0..200 {
            assert!(backoff.next_delay(&mut rng) <= Duration::from_secs(60));
        }
        backoff.reset();
        assert!(backoff.next_delay(&mut rng) <= Duration::from_millis(10));
        let mut zero = Backoff::new(Duration::ZERO, Duration::ZERO);
        assert_eq!(zero.next_delay(&mut rng), Duration::ZERO);
    }
}
