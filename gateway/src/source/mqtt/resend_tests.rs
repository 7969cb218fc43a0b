//! A source that dies after storing a batch and before its acks reach the
//! broker, then starts again: the broker sends the batch again, and it is
//! stored once. Run against the embedded rumqttd (which sends everything
//! from the oldest unacknowledged message again, with new packet ids) and
//! a real Mosquitto (which sends the unacknowledged ones with their ids).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::Stdio;
use std::time::Duration;

use prost::Message as _;
use rumqttc::{AsyncClient, Event, MqttOptions, Outgoing};

use super::*;
use crate::buffer::{Buffer, MemoryBuffer};
use crate::source::SourceHealth;

/// Bound of every wait here.
const WAIT: Duration = Duration::from_secs(30);

const READS: u64 = 120;

fn config(broker: &str) -> MqttSourceConfig {
    let rule: RuleConfig = toml::from_str(
        "topic = \"readers/{r}/tags\"\nevent = \"rfid.tag.read\"\n\
         actor = { type = \"rfid_reader\", id = \"{r}\" }\nproperties = { seq = \"{/seq}\" }",
    )
    .unwrap();
    MqttSourceConfig {
        name: "floor".into(),
        broker: broker.into(),
        client_id: "resend-test".into(),
        batch_max: 8,
        rules: vec![rule],
        ..MqttSourceConfig::default()
    }
}

/// Runs a source until it stops; `crash`: after storing its first batch,
/// as a crash would (no acks).
async fn start(
    config: &MqttSourceConfig,
    broker: Option<&EmbeddedBroker>,
    state: &Path,
    buffer: &Arc<dyn Buffer>,
    crash: bool,
) -> (tokio::task::JoinHandle<Result<()>>, Arc<SourceHealth>, CancellationToken) {
    let mut source = MqttSource::build(config, broker, "sources.mqtt[0]", Some(state)).unwrap();
    source.crash_before_acks = crash;
    let health = Arc::new(SourceHealth::new(&config.name, "mqtt"));
    let intake = Intake::new(Arc::clone(buffer), Arc::clone(&health), Duration::MAX);
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(Box::new(source).run(intake, shutdown.clone()));
    let deadline = tokio::time::Instant::now() + WAIT;
    while !health.connected() {
        assert!(tokio::time::Instant::now() < deadline, "the source did not subscribe");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    (task, health, shutdown)
}

/// Publishes the reads with QoS 1 and returns once the broker has them all.
async fn publish(addr: SocketAddr) {
    let mut options = MqttOptions::new("device", addr.ip().to_string(), addr.port());
    options.set_keep_alive(Duration::from_secs(5));
    let (client, mut eventloop) = AsyncClient::new(options, 256);
    for seq in 0..READS {
        let payload = format!("{{\"seq\": {seq}}}");
        client.publish("readers/r1/tags", QoS::AtLeastOnce, false, payload).await.unwrap();
    }
    let mut acked = 0;
    tokio::time::timeout(WAIT, async {
        while acked < READS {
            match eventloop.poll().await {
                Ok(Event::Incoming(rumqttc::Packet::PubAck(_))) => acked += 1,
                Ok(Event::Outgoing(Outgoing::Disconnect)) => break,
                Ok(_) => {}
                Err(e) => panic!("device: {e}"),
            }
        }
    })
    .await
    .expect("the broker did not take every read");
}

/// How often each read is in the buffer, once every read is there.
async fn stored(buffer: &Arc<dyn Buffer>) -> BTreeMap<i64, usize> {
    let mut watermark = buffer.subscribe();
    tokio::time::timeout(WAIT, async {
        loop {
            let records = buffer.read(0, usize::MAX, usize::MAX).await.unwrap();
            let mut counts = BTreeMap::new();
            for r in records {
                let event = opgraph_proto::pb::Event::decode(r.payload).unwrap();
                let event = opgraph_proto::Event::from_pb(event, 0).unwrap();
                let seq = event.properties.unwrap()["seq"].as_i64().unwrap();
                *counts.entry(seq).or_default() += 1;
            }
            if counts.len() as u64 == READS {
                return counts;
            }
            watermark.changed().await.unwrap();
        }
    })
    .await
    .expect("not every read was stored")
}

/// The scenario: the first source stores a batch and dies; the second
/// gets that batch again and the rest.
async fn crash_and_restart(
    config: &MqttSourceConfig,
    broker: Option<&EmbeddedBroker>,
    addr: SocketAddr,
) {
    let state = tempfile::tempdir().unwrap();
    let buffer: Arc<dyn Buffer> = Arc::new(MemoryBuffer::new());
    let (task, first, _) = start(config, broker, state.path(), &buffer, true).await;
    publish(addr).await;
    tokio::time::timeout(WAIT, task).await.unwrap().unwrap().unwrap();
    let stored_first = first.to_json()["accepted_total"].as_u64().unwrap();
    assert!(stored_first > 0, "the first source stored nothing");

    let (task, second, shutdown) = start(config, broker, state.path(), &buffer, false).await;
    let counts = stored(&buffer).await;
    let twice: Vec<_> = counts.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "stored twice: {twice:?}");
    let health = second.to_json();
    assert!(health["resent_total"].as_u64().unwrap() > 0, "{health}");
    assert_eq!(health["accepted_total"].as_u64().unwrap() + stored_first, READS, "{health}");
    shutdown.cancel();
    tokio::time::timeout(WAIT, task).await.unwrap().unwrap().unwrap();
    // Every ack was written before the clean stop: the next run expects
    // nothing again.
    let left = Redelivery::open(&Redelivery::path(state.path(), &config.name), "test");
    assert_eq!(left.remembered(), 0);
}

#[tokio::test]
async fn the_embedded_broker_sends_a_stored_batch_again_and_it_is_stored_once() {
    let broker_config = broker::MqttBrokerConfig {
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        ..broker::MqttBrokerConfig::default()
    };
    let broker = EmbeddedBroker::start(&broker_config).unwrap();
    crash_and_restart(&config(EMBEDDED), Some(&broker), broker.client_addr()).await;
}

#[tokio::test]
async fn mosquitto_sends_a_stored_batch_again_and_it_is_stored_once() {
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let conf = dir.path().join("mosquitto.conf");
    std::fs::write(
        &conf,
        format!("listener {port} 127.0.0.1\npersistence false\nallow_anonymous true\nuser root\n"),
    )
    .unwrap();
    // Installed by deploy/scripts/install-test-deps.sh.
    let _mosquitto = tokio::process::Command::new("/usr/sbin/mosquitto")
        .arg("-c")
        .arg(&conf)
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("mosquitto: run deploy/scripts/install-test-deps.sh");
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    tokio::time::timeout(WAIT, async {
        while tokio::net::TcpStream::connect(addr).await.is_err() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("mosquitto did not start");
    crash_and_restart(&config(&format!("mqtt://{addr}")), None, addr).await;
}
