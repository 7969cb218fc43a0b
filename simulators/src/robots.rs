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
//! faster than real time. Everything is published with QoS 1; the summary
//! (`summary {json}` on stdout) says exactly what was sent and acknowledged.

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
    #[arg(long, value_parser = parse_duration, default_value = "120s")]
    pub timeout: Duration,
}

fn parse_duration(s: &str) -> std::result::Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{e} (try e.g. 30s)"))
}

/// One message of the plan, at `at_ms` of simulated time.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    pub at_ms: u64,
    pub topic: String,
    /// The payload without its `ts`, which is stamped when sent.
    pub payload: Value,
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
}

/// Telemetry period in simulated time.
const TELEMETRY_MS: u64 = 100;
/// Time between a run's messages in simulated time.
const STEP_MS: u64 = 400;

/// The fleet's messages in send order, and their counts.
pub fn plan(seed: u64, robots: usize, missions: usize, fail_rate: f64) -> (Vec<Message>, Counts) {
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
            });
            for step in 1..=steps {
                t += STEP_MS;
                messages.push(Message {
                    at_ms: t,
                    topic: runs.clone(),
                    payload: json!({"run": run, "status": "step", "detail": {"mission": mission, "step": step}}),
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
                });
                counts.faults += 1;
            }
            messages.push(Message {
                at_ms: t,
                topic: runs.clone(),
                payload: json!({"run": run, "status": end, "detail": detail}),
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
                });
                counts.telemetry += 1;
                at += TELEMETRY_MS;
            }
            t += STEP_MS;
        }
    }
    messages.sort_by_key(|m| m.at_ms);
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
    let (messages, counts) = plan(seed, args.robots, args.missions, args.fail_rate);
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
            let mut payload = m.payload;
            payload["ts"] = json!(now_ms());
            if client.publish(m.topic, QoS::AtLeastOnce, false, payload.to_string()).await.is_err()
            {
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
        "telemetry": counts.telemetry, "sent": total, "acked": acked,
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
        let (messages, counts) = plan(3, 4, 3, 0.5);
        assert_eq!(plan(3, 4, 3, 0.5).0, messages);
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
}
