//! What the gateway logs. The embedded broker (rumqttd) logs an ERROR
//! (`router-drop`, `Recv(Disconnected)`) whenever a device disconnects
//! cleanly: the gateway's log lines leave that out, and keep the rest. A
//! test binary of its own: it installs the process's global subscriber,
//! which rumqttd's threads log to. Ports open to anyone are warned about.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use opgraph_gateway::source::mqtt::broker::{EmbeddedBroker, MqttBrokerConfig};
use opgraph_gateway::telemetry::log_layer;
use rumqttc::{AsyncClient, Event, EventLoop, MqttOptions, Packet};
use tokio::sync::Notify;
use tracing::field::{Field, Visit};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;

const WAIT: Duration = Duration::from_secs(10);

/// Records each event as `LEVEL target message field=value...`, and wakes
/// whoever waits.
#[derive(Clone, Default)]
struct Capture {
    lines: Arc<Mutex<Vec<String>>>,
    arrived: Arc<Notify>,
}

#[derive(Default)]
struct Line(String);

impl Visit for Line {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        match field.name() {
            "message" => self.0.insert_str(0, &format!("{value:?}")),
            name => self.0.push_str(&format!(" {name}={value:?}")),
        }
    }
}

impl<S: tracing::Subscriber> Layer<S> for Capture {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        let mut line = Line::default();
        event.record(&mut line);
        let meta = event.metadata();
        self.lines.lock().unwrap().push(format!("{} {} {}", meta.level(), meta.target(), line.0));
        self.arrived.notify_waiters();
    }
}

/// The gateway's log output, kept in memory.
#[derive(Clone, Default)]
struct Output(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Output {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Output {
    fn lines(&self, text: &str) -> Vec<String> {
        let bytes = self.0.lock().unwrap().clone();
        String::from_utf8_lossy(&bytes)
            .lines()
            .filter(|l| l.contains(text))
            .map(str::to_owned)
            .collect()
    }
}

impl Capture {
    fn count(&self, text: &str) -> usize {
        self.lines.lock().unwrap().iter().filter(|l| l.contains(text)).count()
    }

    /// Waits until `n` lines hold `text`.
    async fn wait_for(&self, text: &str, n: usize) {
        let seen = async {
            loop {
                let arrived = self.arrived.notified();
                if self.count(text) >= n {
                    return;
                }
                arrived.await;
            }
        };
        tokio::time::timeout(WAIT, seen).await.unwrap();
    }
}

/// A device connected to `broker`: the broker accepts once its thread is
/// up (refused until then; rumqttc connects again at the next poll).
async fn device(broker: &EmbeddedBroker, id: &str) -> (AsyncClient, EventLoop) {
    let addr = broker.client_addr();
    let mut options = MqttOptions::new(id, addr.ip().to_string(), addr.port());
    options.set_keep_alive(Duration::from_secs(5));
    let (client, mut eventloop) = AsyncClient::new(options, 10);
    let connected = async {
        loop {
            match eventloop.poll().await {
                Ok(Event::Incoming(Packet::ConnAck(_))) => return,
                Ok(_) => {}
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    };
    tokio::time::timeout(WAIT, connected).await.unwrap();
    (client, eventloop)
}

#[tokio::test]
async fn devices_leaving_are_not_logged_as_errors() {
    // Every event, and the gateway's log lines.
    let (all, output) = (Capture::default(), Output::default());
    let writer = output.clone();
    // The inner layer sees each event first: a line is written before
    // `all` wakes the test for it.
    tracing_subscriber::registry().with(log_layer(move || writer.clone())).with(all.clone()).init();

    let config = MqttBrokerConfig { listen: "127.0.0.1:0".parse().unwrap(), ..Default::default() };
    let broker = EmbeddedBroker::start(&config).unwrap();

    // One device disconnects cleanly.
    let (client, mut eventloop) = device(&broker, "device-1").await;
    client.disconnect().await.unwrap();
    let gone = async { while eventloop.poll().await.is_ok() {} };
    tokio::time::timeout(WAIT, gone).await.unwrap();
    all.wait_for("ERROR rumqttd::server::broker router-drop error=Recv(Disconnected)", 1).await;
    // Another just goes away (rumqttd says so at INFO).
    let (_client, eventloop) = device(&broker, "device-2").await;
    drop(eventloop);
    all.wait_for("INFO rumqttd::server::broker disconnected", 1).await;

    let errors = output.lines("ERROR");
    assert!(errors.is_empty(), "{errors:#?}");
    // The rest went through.
    assert_eq!(output.lines("embedded MQTT broker started").len(), 1);
    assert_eq!(output.lines("disconnected").len(), 1, "{:#?}", output.lines(""));
}

/// `warn_if_open` warns about a port bound beyond loopback with no
/// credential, naming the key to set, and says nothing otherwise.
#[test]
fn ports_open_to_anyone_beyond_loopback_are_warned_about() {
    let logged = |addr: &str, open: bool| {
        let output = Output::default();
        let sink = output.clone();
        let subscriber =
            tracing_subscriber::fmt().with_ansi(false).with_writer(move || sink.clone()).finish();
        let addr = addr.parse().unwrap();
        tracing::subscriber::with_default(subscriber, || {
            opgraph_gateway::source::warn_if_open(
                addr,
                open,
                "POST /ingest",
                "http.ingest_token_sha256",
            );
        });
        output.lines("")
    };
    let warning = logged("0.0.0.0:9100", true);
    assert_eq!(warning.len(), 1, "{warning:?}");
    assert!(warning[0].contains("WARN"), "{warning:?}");
    assert!(warning[0].contains("set http.ingest_token_sha256"), "{warning:?}");
    assert!(logged("0.0.0.0:9100", false).is_empty(), "a credential is set");
    assert!(logged("127.0.0.1:9100", true).is_empty(), "loopback only");
    assert!(logged("[::1]:9100", true).is_empty(), "loopback only");
}
