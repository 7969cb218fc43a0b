//! Telemetry throttling for a mapping rule: deadbands and rate limits.
//!
//! Robots and sensors report their state many times a second while little
//! changes. A rule with a `throttle` table lets a message through (per
//! topic, so per device when the topic names it) when it is the first, when
//! `max_interval` passed since the last one let through (a heartbeat), or
//! when at least `min_interval` passed and a property changed: a number by
//! at least its `deadband`, anything else by any difference. Held-back
//! messages are acknowledged and counted as `throttled`, never stored.
//! I/O-free: times are passed in.
//!
//! What is remembered per key is a few bytes whatever the message: a hash
//! of the key, the numbers of the properties with a deadband and hashes of
//! everything else. Topics and payloads come from devices (a topic may be
//! 64 KiB long, a payload `max_payload`), and messages reach the throttle
//! before they are validated: keeping their properties let 100,000 keys
//! hold gigabytes. Two keys or values that differ yet hash alike (one
//! chance in 2^64 per pair) would be taken for the same.

use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasher, RandomState};
use std::time::Duration;

use serde::Deserialize;
use serde_json::{Map, Value};

/// `[sources.mqtt.rules.throttle]`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ThrottleConfig {
    /// Changes closer together than this wait. Default `0s`.
    #[serde(default, with = "humantime_serde")]
    pub min_interval: Duration,
    /// A message gets through at least this often, changed or not
    /// (a heartbeat). Default: never without a change.
    #[serde(default, with = "humantime_serde::option")]
    pub max_interval: Option<Duration>,
    /// Smallest move of a numeric property that counts as a change, by
    /// property name. Properties not named change on any difference.
    #[serde(default)]
    pub deadband: BTreeMap<String, f64>,
}

impl ThrottleConfig {
    pub fn problems(&self, path: &str) -> Vec<String> {
        let mut problems = Vec::new();
        for (name, band) in &self.deadband {
            if band.is_nan() || *band < 0.0 {
                problems.push(format!("{path}.deadband.{name}: must be 0 or more"));
            }
        }
        if self.max_interval.is_some_and(|max| max < self.min_interval) {
            problems.push(format!("{path}.max_interval: must not be shorter than min_interval"));
        }
        problems
    }
}

/// What was last let through, per key.
#[derive(Debug, Default)]
pub struct ThrottleState {
    /// By a hash of the key.
    last: HashMap<u64, Seen>,
    /// Keyed at random, so that devices cannot choose colliding hashes.
    hasher: RandomState,
}

/// What is kept of a message: its time, and enough to tell a change.
#[derive(Debug)]
struct Seen {
    at: i64,
    /// Per `deadband` property, in the config's order; `None` when absent.
    banded: Vec<Option<Kept>>,
    /// A hash of the other properties, names and values.
    rest: u64,
}

/// A property with a deadband: its number, or a hash of anything else.
#[derive(Debug, PartialEq)]
enum Kept {
    Number(f64),
    Other(u64),
}

/// Keys remembered at once; beyond it the memory starts over (a burst of
/// messages gets through rather than memory growing without bound).
const MAX_KEYS: usize = 100_000;

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl ThrottleState {
    /// Whether a message with `properties` under `key` at `now_ms` gets
    /// through; remembers it when it does.
    pub fn admit(
        &mut self,
        config: &ThrottleConfig,
        key: &str,
        properties: &Map<String, Value>,
        now_ms: i64,
    ) -> bool {
        let key = self.hasher.hash_one(key);
        let now = self.seen(config, properties, now_ms);
        let through = match self.last.get(&key) {
            None => true,
            Some(last) => {
                let elapsed = now_ms.saturating_sub(last.at);
                let heartbeat = config.max_interval.is_some_and(|max| elapsed >= ms(max));
                heartbeat || (elapsed >= ms(config.min_interval) && changed(last, &now, config))
            }
        };
        if through {
            if self.last.len() >= MAX_KEYS && !self.last.contains_key(&key) {
                self.last.clear();
            }
            self.last.insert(key, now);
        }
        through
    }

    fn seen(&self, config: &ThrottleConfig, properties: &Map<String, Value>, at: i64) -> Seen {
        let kept = |value: &Value| match value.as_f64() {
            Some(n) => Kept::Number(n),
            None => Kept::Other(self.hasher.hash_one(value)),
        };
        let banded = config.deadband.keys().map(|name| properties.get(name).map(kept)).collect();
        // In name order, as the map compares, whatever order it keeps.
        let mut rest: Vec<(&String, &Value)> =
            properties.iter().filter(|(name, _)| !config.deadband.contains_key(*name)).collect();
        rest.sort_unstable_by(|a, b| a.0.cmp(b.0));
        Seen { at, banded, rest: self.hasher.hash_one(&rest) }
    }
}

/// A number with a deadband changed by at least the band; anything else
/// by any difference.
/// Whether a number moved from `a` to `b` by at least `band` (0: by
/// anything): the deadband rule of rule throttles and Modbus `on_change`.
pub(crate) fn moved_by_band(a: f64, b: f64, band: f64) -> bool {
    // Scaled values move in steps that floats round (0.3 - 0.2 is
    // 0.0999...): a step of the band's size counts all the same.
    a != b && (b - a).abs() >= band * (1.0 - 1e-9)
}

fn changed(last: &Seen, now: &Seen, config: &ThrottleConfig) -> bool {
    let bands = last.banded.iter().zip(&now.banded).zip(config.deadband.values());
    last.rest != now.rest
        || bands.into_iter().any(|((a, b), band)| match (a, b) {
            (Some(Kept::Number(a)), Some(Kept::Number(b))) => moved_by_band(*a, *b, *band),
            _ => a != b,
        })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn props(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => unreachable!(),
        }
    }

    #[test]
    fn deadbands_rate_limits_and_heartbeats() {
        let config: ThrottleConfig = toml::from_str(
            "min_interval = \"1s\"\nmax_interval = \"10s\"\ndeadband = { battery = 0.05, x = 0.5 }\n",
        )
        .unwrap();
        assert!(config.problems("t").is_empty());
        let mut s = ThrottleState::default();
        let at = |battery: f64, x: f64, state: &str| {
            props(json!({"battery": battery, "x": x, "state": state}))
        };
        assert!(s.admit(&config, "r1", &at(0.90, 0.0, "moving"), 0), "the first gets through");
        assert!(!s.admit(&config, "r1", &at(0.89, 0.4, "moving"), 2_000), "within the deadbands");
        assert!(!s.admit(&config, "r1", &at(0.80, 0.0, "moving"), 500), "a change, but too soon");
        assert!(s.admit(&config, "r1", &at(0.84, 0.0, "moving"), 1_000), "battery moved 0.06");
        assert!(s.admit(&config, "r1", &at(0.84, 0.0, "charging"), 2_000), "state changed");
        assert!(s.admit(&config, "r2", &at(0.84, 0.0, "charging"), 2_000), "another key");
        assert!(!s.admit(&config, "r1", &at(0.84, 0.1, "charging"), 11_999));
        assert!(s.admit(&config, "r1", &at(0.84, 0.1, "charging"), 12_000), "heartbeat");
    }

    #[test]
    fn bad_settings_are_named() {
        let config: ThrottleConfig = toml::from_str(
            "min_interval = \"5s\"\nmax_interval = \"1s\"\ndeadband = { x = -1.0 }\n",
        )
        .unwrap();
        let problems = config.problems("rules[0].throttle");
        assert!(
            problems.iter().any(|p| p.starts_with("rules[0].throttle.deadband.x:")),
            "{problems:?}"
        );
        assert!(
            problems.iter().any(|p| p.starts_with("rules[0].throttle.max_interval:")),
            "{problems:?}"
        );
    }
}
