//! `opgraph-sim robots`: a fleet of mobile robots running missions and
//! reporting over MQTT, in the topic convention of docs/sources.md
//! ("Robot fleets"):
//!
//! - `robots/{robot}/runs`: `{"run", "status", "ts", "detail"}` with status
//!   `started`, `step` (one per mission step), then `completed` or `failed`;
//! - `robots/{robot}/telemetry`: `{"ts", "state": {"battery", "x", "y",
//!   "mode"}}` ten times a second of simulated time;
//! - `robots/{robot}/faults`: `{"run", "ts", "detail": {"code",
//!   "severity", "message"}}` when a run fails.
//!
//! The fleet is a seeded [`plan`] in simulated time; `--speed` runs it
//! faster than real time. Misbehaviour on request: `--malformed N` mixes N
//! messages that are not JSON into the runs topics, and the last
//! `--skewed-robots` robots' clocks are `--skew` behind. Everything is
//! published with QoS 1; the summary (`summary {json}` on stdout) says
//! exactly what was sent and acknowledged.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rumqttc::{AsyncClient, Event, MqttOptions, Packet, QoS};
use serde_json::{Value, json};

use crate::error::{Error, Result};
use crate::print;

/// The gateway's mapping rules for this convention, to follow a
/// `[[sources.mqtt]]` table (docs/sources.md shows and explains them).
pub const GATEWAY_RULES: &str = r#"
[[sources.mqtt.rules]]
topic = "robots/{robot}/runs"
event = "robot.run.{/status}"
actor = { type = "robot", id = "{robot}" }
trace_id = "{/run}"
properties = "{/detail}"
timestamp = "{/ts}"

[[sources.mqtt.rules]]
topic = "robots/{robot}/faults"
event = "robot.fault"
actor = { type = "robot", id = "{robot}" }
trace_id = "{/run}"
properties = "{/detail}"
timestamp = "{/ts}"

[[sources.mqtt.rules]]
topic = "robots/{robot}/telemetry"
event = "robot.telemetry"
actor = { type = "robot", id = "{robot}" }
properties = "{/state}"
timestamp = "{/ts}"
[sources.mqtt.rules.throttle]
min_interval = "1s"
max_interval = "30s"
deadband = { battery = 0.05, x = 1.0, y = 1.0 }
"#;

/// Simulate a robot fleet publishing runs, telemetry and faults over MQTT.
#[derive(Debug, Clone, clap::Args)]
pub struct RobotsArgs {
    /// The MQTT broker, HOST:PORT.
    #[arg(long, default_value = "127.0.0.1:1883")]
    pub broker: String,
    /// Robots in the fleet (amr-00, amr-01, ...).
    #[arg(long, default_value_t = 3)]
    pub robots: usize,
    /// Missions each robot runs, one after the other.
    #[arg(long, default_value_t = 2)]
    pub missions: usize,
    /// Share of missions that fail (0 to 1).
    #[arg(long, default_value_t = 0.25)]
    pub fail_rate: f64,
    /// Simulated seconds per real second.
    #[arg(long, default_value_t = 1.0)]
    pub speed: f64,
    /// Seed [default: random, printed in the summary].
    #[arg(long)]
    pub seed: Option<u64>,
    /// Give up unless everything is acknowledged within this time.
    #[arg(long, value_parser = crate::parse_duration, default_value = "120s")]
    pub timeout: Duration,
    /// Messages that are not JSON to mix in (on the runs topics).
    #[arg(long, default_value_t = 0)]
    pub malformed: usize,
    /// How many robots (the last ones) have a wrong clock.
    #[arg(long, default_value_t = 0)]
    pub skewed_robots: usize,
    /// How far behind a wrong clock is, e.g. 1h.
    #[arg(long, value_parser = crate::parse_duration, default_value = "1h")]
    pub skew: Duration,
}

/// One message of the plan, at `at_ms` of simulated time.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    pub at_ms: u64,
    pub topic: String,
    /// The payload without its `ts`, which is stamped when sent.
    pub payload: Value,
    /// Sent instead of `payload`: bytes that are not JSON.
    pub malformed: Option<&'static [u8]>,
    /// The robot's clock is wrong.
    pub skewed: bool,
}

/// What the plan holds, by kind.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Counts {
    pub runs: usize,
    pub completed: usize,
    pub failed: usize,
    pub steps: usize,
    pub faults: usize,
    pub telemetry: usize,
    pub malformed: usize,
    /// Messages stamped by a wrong clock.
    pub skewed: usize,
}

/// Telemetry period in simulated time.
const TELEMETRY_MS: u64 = 100;
/// Time between a run's messages in simulated time.
const STEP_MS: u64 = 400;

/// Payloads of the malformed messages, in turn.
const BROKEN: [&[u8]; 4] =
    [br#"{"run": "run-x", "status": "sta"#, b"not json", b"\xff\xfe\x00garbage", b""];

/// What to plan beyond the missions: misbehaviour.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Faults {
    pub malformed: usize,
    /// The last `skewed_robots` robots' clocks are wrong.
    pub skewed_robots: usize,
}

/// The fleet's messages in send order, and their counts.
pub fn plan(
    seed: u64,
    robots: usize,
    missions: usize,
    fail_rate: f64,
    faults: Faults,
) -> (Vec<Message>, Counts) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut messages = Vec::new();
    let mut counts = Counts::default();
    for r in 0..robots {
        let robot = format!("amr-{r:02}");
        let mut t = rng.random_range(0..STEP_MS);
        let (mut x, mut y, mut battery): (f64, f64, f64) = (0.0, 0.0, rng.random_range(0.6..1.0));
        for m in 0..missions {
            let run = format!("run-{robot}-{m}");
            let mission = format!("pick-{}", rng.random_range(100..999));
            let steps = rng.random_range(2..5);
            let fails = rng.random_bool(fail_rate.clamp(0.0, 1.0));
            let started = t;
            let runs = format!("robots/{robot}/runs");
            messages.push(Message {
                at_ms: t,
                topic: runs.clone(),
                payload: json!({"run": run, "status": "started", "detail": {"mission": mission}}),
                malformed: None,
                skewed: false,
            });
            for step in 1..=steps {
                t += STEP_MS;
                messages.push(Message {
                    at_ms: t,
                    topic: runs.clone(),
                    payload: json!({"run": run, "status": "step", "detail": {"mission": mission, "step": step}}),
                    malformed: None,
                    skewed: false,
                });
                counts.steps += 1;
            }
            t += STEP_MS;
            let end = if fails { "failed" } else { "completed" };
            let mut detail = json!({"mission": mission, "steps": steps});
            if fails {
                detail["error"] = json!("E-BLOCKED");
                messages.push(Message {
                    at_ms: t,
                    topic: format!("robots/{robot}/faults"),
                    payload: json!({"run": run, "detail": {"code": "E-BLOCKED", "severity": "error", "message": "path blocked"}}),
                    malformed: None,
                    skewed: false,
                });
                counts.faults += 1;
            }
            messages.push(Message {
                at_ms: t,
                topic: runs.clone(),
                payload: json!({"run": run, "status": end, "detail": detail}),
                malformed: None,
                skewed: false,
            });
            counts.runs += 1;
            if fails {
                counts.failed += 1
            } else {
                counts.completed += 1
            }
            // Telemetry through the run: moving, battery draining.
            let mut at = started;
            while at <= t {
                x += 0.05;
                y += 0.02;
                battery = (battery - 0.0005).max(0.0);
                messages.push(Message {
                    at_ms: at,
                    topic: format!("robots/{robot}/telemetry"),
                    payload: json!({"state": {"battery": (battery * 1000.0).round() / 1000.0, "x": (x * 100.0).round() / 100.0, "y": (y * 100.0).round() / 100.0, "mode": "moving"}}),
                    malformed: None,
                    skewed: false,
                });
                counts.telemetry += 1;
                at += TELEMETRY_MS;
            }
            t += STEP_MS;
        }
    }
    for m in &mut messages {
        let robot: usize = m
            .topic
            .split('/')
            .nth(1)
            .and_then(|r| r.strip_prefix("amr-")?.parse().ok())
            .unwrap_or(0);
        m.skewed = robot + faults.skewed_robots >= robots;
        counts.skewed += usize::from(m.skewed);
    }
    messages.sort_by_key(|m| m.at_ms);
    let end = messages.last().map_or(0, |m| m.at_ms);
    for i in 0..faults.malformed {
        let robot = format!("amr-{:02}", rng.random_range(0..robots.max(1)));
        let at_ms = rng.random_range(0..=end);
        let at = messages.partition_point(|m| m.at_ms <= at_ms);
        messages.insert(
            at,
            Message {
                at_ms,
                topic: format!("robots/{robot}/runs"),
                payload: Value::Null,
                malformed: Some(BROKEN[i % BROKEN.len()]),
                skewed: false,
            },
        );
        counts.malformed += 1;
    }
    (messages, counts)
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Publishes the plan; see the module docs. Returns the summary.
pub async fn run(args: RobotsArgs) -> Result<Value> {
    let mut problems = Vec::new();
    if !(args.speed.is_finite() && args.speed > 0.0) {
        problems.push("speed: must be more than 0".to_owned());
    }
    if !(0.0..=1.0).contains(&args.fail_rate) {
        problems.push("fail_rate: must be 0 to 1".to_owned());
    }
    if args.robots.saturating_mul(args.missions) > 100_000 {
        problems.push("robots x missions: at most 100000".to_owned());
    }
    if args.malformed > 100_000 {
        problems.push("malformed: at most 100000".to_owned());
    }
    if args.skewed_robots > args.robots {
        problems.push("skewed-robots: at most robots".to_owned());
    }
    let (host, port) = args
        .broker
        .rsplit_once(':')
        .and_then(|(h, p)| Some((h.to_owned(), p.parse::<u16>().ok()?)))
        .ok_or_else(|| {
            Error::InvalidConfig(vec![format!("broker: {:?} is not HOST:PORT", args.broker)])
        })?;
    if !problems.is_empty() {
        return Err(Error::InvalidConfig(problems));
    }
    let seed = args.seed.unwrap_or_else(rand::random);
    let faults = Faults { malformed: args.malformed, skewed_robots: args.skewed_robots };
    let (messages, counts) = plan(seed, args.robots, args.missions, args.fail_rate, faults);
    let skew_ms = i64::try_from(args.skew.as_millis()).unwrap_or(i64::MAX);
    let total = messages.len();
    let mut options = MqttOptions::new(format!("opgraph-sim-robots-{seed}"), host, port);
    options.set_keep_alive(Duration::from_secs(30));
    let (client, mut eventloop) = AsyncClient::new(options, 1000);
    let speed = args.speed;
    let publisher = tokio::spawn(async move {
        let start = tokio::time::Instant::now();
        for m in messages {
            #[allow(clippy::cast_precision_loss)] // simulated ms stay far below 2^52
            let due = Duration::from_secs_f64(m.at_ms as f64 / 1000.0 / speed);
            tokio::time::sleep_until(start + due).await;
            let bytes = match m.malformed {
                Some(broken) => broken.to_vec(),
                None => {
                    let mut payload = m.payload;
                    let now = now_ms();
                    payload["ts"] = json!(if m.skewed { now.saturating_sub(skew_ms) } else { now });
                    payload.to_string().into_bytes()
                }
            };
            if client.publish(m.topic, QoS::AtLeastOnce, false, bytes).await.is_err() {
                return;
            }
        }
    });
    let mut acked = 0usize;
    let done = tokio::time::timeout(args.timeout, async {
        while acked < total {
            match eventloop.poll().await {
                Ok(Event::Incoming(Packet::PubAck(_))) => acked += 1,
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "MQTT connection failed; reconnecting");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
    })
    .await;
    publisher.abort();
    let summary = json!({
        "seed": seed, "robots": args.robots, "runs": counts.runs, "completed": counts.completed,
        "failed": counts.failed, "steps": counts.steps, "faults": counts.faults,
        "telemetry": counts.telemetry, "malformed": counts.malformed,
        "skewed": counts.skewed, "sent": total, "acked": acked,
    });
    print(&format!("summary {summary}\n"))?;
    if done.is_err() {
        return Err(Error::Mqtt {
            broker: args.broker,
            reason: format!("{acked} of {total} acknowledged within {:?}", args.timeout),
        });
    }
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plan_is_seeded_and_every_run_starts_and_ends() {
        let (messages, counts) = plan(3, 4, 3, 0.5, Faults::default());
        assert_eq!(plan(3, 4, 3, 0.5, Faults::default()).0, messages);
        assert!(messages.iter().all(|m| m.malformed.is_none() && !m.skewed));
        assert_eq!(counts.runs, 12);
        assert_eq!(counts.completed + counts.failed, 12);
        assert_eq!(counts.faults, counts.failed);
        let of = |status: &str| messages.iter().filter(|m| m.payload["status"] == status).count();
        assert_eq!(of("started"), 12);
        assert_eq!(of("step"), counts.steps);
        assert_eq!(of("completed"), counts.completed);
        assert!(messages.windows(2).all(|w| w[0].at_ms <= w[1].at_ms), "send order is time order");
        let telemetry = messages.iter().filter(|m| m.topic.ends_with("/telemetry")).count();
        assert_eq!(telemetry, counts.telemetry);
        assert!(telemetry > 10 * counts.runs, "ten a second through every run");
    }

    #[test]
    fn malformed_messages_and_wrong_clocks_are_planned_and_counted() {
        let faults = Faults { malformed: 5, skewed_robots: 1 };
        let (messages, counts) = plan(3, 4, 3, 0.5, faults);
        assert_eq!(plan(3, 4, 3, 0.5, faults).0, messages);
        let (clean, clean_counts) = plan(3, 4, 3, 0.5, Faults::default());
        assert_eq!(messages.len(), clean.len() + 5);
        assert_eq!(counts.malformed, 5);
        assert!(messages.windows(2).all(|w| w[0].at_ms <= w[1].at_ms), "still in time order");
        for m in messages.iter().filter(|m| m.malformed.is_some()) {
            let bytes = m.malformed.unwrap();
            assert!(serde_json::from_slice::<Value>(bytes).is_err(), "{bytes:?}");
            assert!(m.topic.ends_with("/runs"));
        }
        let skewed: Vec<&Message> = messages.iter().filter(|m| m.skewed).collect();
        assert_eq!(skewed.len(), counts.skewed);
        assert!(skewed.iter().all(|m| m.topic.starts_with("robots/amr-03/")));
        let of_last = clean.iter().filter(|m| m.topic.starts_with("robots/amr-03/")).count();
        assert_eq!(counts.skewed, of_last);
        assert_eq!(clean_counts.skewed, 0);
    }
}
