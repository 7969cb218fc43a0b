//! `opgraph-sim rfid`: publishes a [`plan`] to an MQTT broker
//! with QoS 1, each read stamped with its send time (minus the skew of a
//! wrong clock), waits until the broker acknowledged every message, then
//! prints `summary {json}` on stdout: exactly what was sent (counts per
//! reader and per tag, malformed, skewed, published, acknowledged) and the
//! seed. `--record FILE` also writes every message handed to the client
//! as a JSON line, with whether the broker acknowledged it.

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rumqttc::{AsyncClient, Event, MqttOptions, Outgoing, Packet, QoS};
use serde_json::json;

use super::{RfidConfig, RfidMessage, RfidSummary, plan};
use crate::error::{Error, Result};
use crate::print;

/// Simulate RFID readers publishing tag reads over MQTT.
#[derive(Debug, Clone, clap::Args)]
pub struct RfidArgs {
    /// The MQTT broker, HOST:PORT (the gateway's embedded broker or any other).
    #[arg(long, default_value = "127.0.0.1:1883")]
    pub broker: String,
    /// Login user name.
    #[arg(long)]
    pub username: Option<String>,
    /// Login password.
    #[arg(long, env = "OPGRAPH_SIM_MQTT_PASSWORD", hide_env_values = true)]
    pub password: Option<String>,
    /// Number of readers (r0, r1, ...).
    #[arg(long, default_value_t = 3)]
    pub readers: usize,
    /// Number of distinct tags.
    #[arg(long, default_value_t = 20)]
    pub tags: usize,
    /// Valid tag reads to send.
    #[arg(long, default_value_t = 100)]
    pub reads: usize,
    /// Malformed JSON messages to mix in (beyond --reads).
    #[arg(long, default_value_t = 0)]
    pub malformed: usize,
    /// How many readers (the last ones) have a wrong clock.
    #[arg(long, default_value_t = 0)]
    pub skewed_readers: usize,
    /// How far behind a wrong clock is, e.g. 1h.
    #[arg(long, value_parser = crate::parse_duration, default_value = "1h")]
    pub skew: Duration,
    /// Topic; {reader} is replaced by the reader id.
    #[arg(long, default_value = "readers/{reader}/tags")]
    pub topic: String,
    /// Seed of the plan [default: random, printed in the summary].
    #[arg(long)]
    pub seed: Option<u64>,
    /// Messages per second; 0 sends as fast as the broker takes them.
    #[arg(long, default_value_t = 0.0)]
    pub rate: f64,
    /// Write every message sent as a JSON line to this file.
    #[arg(long)]
    pub record: Option<PathBuf>,
    /// Give up unless the broker acknowledged everything within this time.
    #[arg(long, value_parser = crate::parse_duration, default_value = "60s")]
    pub timeout: Duration,
    /// QoS 1 messages in flight (sent, not yet acknowledged) at most.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u16).range(1..))]
    pub inflight: u16,
    /// MQTT connections; readers share them round robin (at most one per
    /// reader). Each gets --rate divided by the number of connections.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub connections: u32,
    /// MQTT client id [default: opgraph-sim-rfid-SEED]; with several
    /// connections, -0, -1, ... is appended.
    #[arg(long)]
    pub client_id: Option<String>,
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

impl RfidArgs {
    fn config(&self, seed: u64) -> RfidConfig {
        RfidConfig {
            seed,
            readers: self.readers,
            tags: self.tags,
            reads: self.reads,
            malformed: self.malformed,
            skewed_readers: self.skewed_readers,
            skew: self.skew,
            topic: self.topic.clone(),
        }
    }

    fn endpoint(&self) -> Result<(String, u16)> {
        crate::broker_endpoint(&self.broker)
    }
}

/// Publishes the plan and prints the summary; see the module docs.
pub async fn run(args: RfidArgs) -> Result<RfidSummary> {
    let seed = args.seed.unwrap_or_else(rand::random);
    let config = args.config(seed);
    let mut problems = config.problems();
    if !(args.rate.is_finite() && args.rate >= 0.0) {
        problems.push("rate: must be 0 or more".to_owned());
    }
    if !problems.is_empty() {
        return Err(Error::InvalidConfig(problems));
    }
    let (host, port) = args.endpoint()?;
    let messages = plan(&config, now_ms());
    let summary = RfidSummary::of(&messages);
    let skew_ms = i64::try_from(args.skew.as_millis()).unwrap_or(i64::MAX);
    let client_id = args.client_id.clone().unwrap_or_else(|| format!("opgraph-sim-rfid-{seed}"));
    let total = messages.len();
    // Readers share the connections round robin, each keeping its order.
    let connections = (args.connections as usize).min(config.readers).max(1);
    let mut groups: Vec<Vec<RfidMessage>> = vec![Vec::new(); connections];
    for m in messages {
        let reader: usize = m.reader.trim_start_matches('r').parse().unwrap_or(0);
        groups[reader % connections].push(m);
    }
    let deadline = tokio::time::Instant::now() + args.timeout;
    let rate = args.rate / connections as f64;
    let mut tasks = Vec::new();
    for (i, group) in groups.into_iter().enumerate() {
        let id = if connections == 1 { client_id.clone() } else { format!("{client_id}-{i}") };
        let mut options = MqttOptions::new(id, host.clone(), port);
        options
            .set_keep_alive(Duration::from_secs(30))
            .set_clean_session(true)
            .set_inflight(args.inflight);
        if let Some(user) = &args.username {
            options.set_credentials(user.clone(), args.password.clone().unwrap_or_default());
        }
        let inflight = usize::from(args.inflight);
        tasks.push(tokio::spawn(connection(options, inflight, group, rate, skew_ms, deadline)));
    }
    let mut sent = Vec::with_capacity(total);
    let mut acked_flags = Vec::with_capacity(total);
    let mut reconnects = 0;
    let mut complete = true;
    for task in tasks {
        let outcome = task.await.map_err(|e| Error::Mqtt {
            broker: args.broker.clone(),
            reason: format!("publisher task failed: {e}"),
        })?;
        complete &= outcome.complete;
        reconnects += outcome.reconnects;
        acked_flags.extend((0..outcome.sent.len()).map(|i| outcome.acked.contains(&i)));
        sent.extend(outcome.sent);
    }
    if let Some(path) = &args.record {
        record(path, &sent, &acked_flags)?;
    }
    let acked = acked_flags.iter().filter(|a| **a).count();
    let mut line = summary.to_json();
    line["seed"] = json!(seed);
    line["connections"] = json!(connections);
    line["published"] = json!(sent.len());
    line["acked"] = json!(acked);
    line["reconnects"] = json!(reconnects);
    print(&format!("summary {line}\n"))?;
    if !complete {
        return Err(Error::Mqtt {
            broker: args.broker.clone(),
            reason: format!("{acked} of {total} messages acknowledged within {:?}", args.timeout),
        });
    }
    Ok(summary)
}

/// What one connection published and had acknowledged.
struct ConnectionOutcome {
    /// Messages handed to the client, in order, stamped with their send time.
    sent: Vec<RfidMessage>,
    /// Indexes into `sent` the broker acknowledged.
    acked: BTreeSet<usize>,
    reconnects: u64,
    /// Every message acknowledged before the deadline.
    complete: bool,
}

/// Publishes `messages` over one connection at `rate` per second (0: as
/// fast as acknowledged) until all are acknowledged or `deadline`.
async fn connection(
    options: MqttOptions,
    inflight: usize,
    messages: Vec<RfidMessage>,
    rate: f64,
    skew_ms: i64,
    deadline: tokio::time::Instant,
) -> ConnectionOutcome {
    let (client, mut eventloop) = AsyncClient::new(options, inflight);
    let total = messages.len();
    let interval = (rate > 0.0).then(|| Duration::from_secs_f64(1.0 / rate));
    let sent: Arc<Mutex<Vec<RfidMessage>>> = Arc::new(Mutex::new(Vec::with_capacity(total)));
    let publisher = {
        let client = client.clone();
        let sent = Arc::clone(&sent);
        tokio::spawn(async move {
            let mut tick = interval.map(tokio::time::interval);
            for mut m in messages {
                if let Some(tick) = tick.as_mut() {
                    tick.tick().await;
                }
                m.stamp(now_ms(), skew_ms);
                let (topic, payload) = (m.topic.clone(), m.payload.clone());
                sent.lock().unwrap_or_else(|e| e.into_inner()).push(m);
                if client.publish(topic, QoS::AtLeastOnce, false, payload).await.is_err() {
                    return;
                }
            }
        })
    };
    let mut tracker = AckTracker::default();
    let mut reconnects = 0u64;
    let outcome = tokio::time::timeout_at(deadline, async {
        while tracker.acked.len() < total {
            match eventloop.poll().await {
                Ok(Event::Outgoing(Outgoing::Publish(pkid))) => tracker.published(pkid),
                Ok(Event::Incoming(Packet::PubAck(ack))) => tracker.acknowledged(ack.pkid),
                Ok(Event::Incoming(Packet::ConnAck(ack))) if !ack.session_present => {
                    tracker.session_lost();
                }
                Ok(_) => {}
                Err(e) => {
                    reconnects += 1;
                    tracing::warn!(error = %e, "MQTT connection failed; reconnecting");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
    })
    .await;
    publisher.abort();
    let _ = publisher.await;
    if outcome.is_ok() {
        let _ = client.try_disconnect();
        let _ = tokio::time::timeout(Duration::from_secs(2), async {
            loop {
                match eventloop.poll().await {
                    Ok(Event::Outgoing(Outgoing::Disconnect)) | Err(_) => return,
                    Ok(_) => {}
                }
            }
        })
        .await;
    }
    let sent = std::mem::take(&mut *sent.lock().unwrap_or_else(|e| e.into_inner()));
    ConnectionOutcome { sent, acked: tracker.acked, reconnects, complete: outcome.is_ok() }
}

/// Which messages the broker acknowledged: the n-th new PUBLISH written is
/// the n-th message handed to the client; a PUBACK names its packet id.
#[derive(Default)]
struct AckTracker {
    next: usize,
    in_flight: HashMap<u16, usize>,
    acked: BTreeSet<usize>,
}

impl AckTracker {
    fn published(&mut self, pkid: u16) {
        // A packet id still in flight is a retransmission, not a new message.
        if pkid != 0 && !self.in_flight.contains_key(&pkid) {
            self.in_flight.insert(pkid, self.next);
            self.next += 1;
        }
    }

    fn acknowledged(&mut self, pkid: u16) {
        if let Some(i) = self.in_flight.remove(&pkid) {
            self.acked.insert(i);
        }
    }

    /// A new session: the client dropped what was in flight (never acked).
    fn session_lost(&mut self) {
        self.in_flight.clear();
    }
}

/// One JSON line per message handed to the client, in order, with whether
/// the broker acknowledged it.
fn record(path: &PathBuf, messages: &[RfidMessage], acked: &[bool]) -> Result<()> {
    let mut out = String::new();
    for (i, m) in messages.iter().enumerate() {
        let line = json!({
            "topic": m.topic,
            "reader": m.reader,
            "payload": String::from_utf8_lossy(&m.payload),
            "acked": acked.get(i).copied().unwrap_or(false),
            "read": m.read.as_ref().map(|r| json!({
                "seq": r.seq, "epc": r.epc, "antenna": r.antenna, "rssi": r.rssi,
                "ts": r.ts, "skewed": r.skewed,
            })),
        });
        out.push_str(&line.to_string());
        out.push('\n');
    }
    std::fs::write(path, out).map_err(Error::io("writing --record"))
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        rfid: RfidArgs,
    }

    #[test]
    fn the_command_line_parses_and_bad_values_are_refused() {
        let cli = Cli::try_parse_from([
            "rfid",
            "--broker",
            "127.0.0.1:1884",
            "--reads",
            "10",
            "--malformed",
            "2",
            "--skewed-readers",
            "1",
            "--skew",
            "2h",
            "--seed",
            "7",
        ])
        .unwrap();
        let config = cli.rfid.config(7);
        assert_eq!((config.reads, config.malformed, config.skewed_readers), (10, 2, 1));
        assert_eq!(config.skew, Duration::from_secs(7200));
        assert_eq!(cli.rfid.endpoint().unwrap(), ("127.0.0.1".to_owned(), 1884));
        let cli = Cli::try_parse_from(["rfid", "--broker", "nowhere"]).unwrap();
        assert!(cli.rfid.endpoint().is_err());
        assert!(Cli::try_parse_from(["rfid", "--skew", "soon"]).is_err());
        let cli = Cli::try_parse_from(["rfid", "--readers", "0"]).unwrap();
        assert!(!cli.rfid.config(1).problems().is_empty());
    }
}
