//! One MQTT session, either protocol: rumqttc's 3.1.1 client
//! (`rumqttc::*`) or its MQTT 5 client (`rumqttc::v5::*`), behind one
//! [`Client`] (acks, disconnect) and one poller that hands every PUBLISH
//! to the processor as a [`Message`].
//!
//! The poller drives the event loop: connects, subscribes on every
//! CONNACK, reconnects after errors with capped exponential backoff and
//! writes the acks and barriers the processor queues (telling
//! [`Redelivery`] of connections made and lost, and of barriers written
//! and answered). "Connected" in health means connected and subscribed
//! (SUBACK seen): from then on the broker keeps messages for the session.

use std::sync::Arc;

use bytes::Bytes;
use rand::SeedableRng;
use rand::rngs::StdRng;
use rumqttc::v5;
use rumqttc::{Outgoing, QoS};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::Retained;
use super::redelivery::Redelivery;
use super::subscriptions::Subscriptions;
use crate::backoff::Backoff;
use crate::source::SourceHealth;

/// The filter of barriers: never subscribed (an UNSUBSCRIBE names a filter
/// exactly, so a `#` subscription is not touched).
const BARRIER_FILTER: &str = "opgraph-gateway/ack-barrier";

/// Client options of either protocol.
#[derive(Clone)]
pub enum Options {
    V4(Box<rumqttc::MqttOptions>),
    V5(Box<v5::MqttOptions>),
}

/// What the processor needs of the client.
#[derive(Clone)]
pub enum Client {
    V4(rumqttc::AsyncClient),
    V5(v5::AsyncClient),
}

/// The received PUBLISH, kept to acknowledge it.
pub enum Ack {
    V4(rumqttc::Publish),
    V5(v5::mqttbytes::v5::Publish),
}

/// One message for the processor.
pub struct Message {
    pub topic: String,
    pub payload: Bytes,
    /// The broker's packet id (0 for QoS 0).
    pub pkid: u16,
    /// Which connection brought it, counted from 1.
    pub connection: u64,
    /// A retained message that the source's [`Retained`] rule says not
    /// to store here: acknowledged in its turn, nothing else.
    pub replay: bool,
    pub ack: Ack,
}

impl Client {
    /// Queues the PUBACK (nothing for QoS 0); `false` once the event loop
    /// is gone.
    pub async fn ack(&self, ack: &Ack) -> bool {
        match (self, ack) {
            (Client::V4(c), Ack::V4(p)) => c.ack(p).await.is_ok(),
            (Client::V5(c), Ack::V5(p)) => c.ack(p).await.is_ok(),
            _ => false,
        }
    }

    /// Queues an UNSUBSCRIBE of a filter never subscribed, whose UNSUBACK
    /// shows the broker has read everything queued before it (see
    /// `redelivery.rs`); `false` once the event loop is gone.
    pub async fn barrier(&self) -> bool {
        match self {
            Client::V4(c) => c.unsubscribe(BARRIER_FILTER).await.is_ok(),
            Client::V5(c) => c.unsubscribe(BARRIER_FILTER).await.is_ok(),
        }
    }

    /// Queues a DISCONNECT after everything queued before it.
    pub fn try_disconnect(&self) {
        let _ = match self {
            Client::V4(c) => c.try_disconnect().map_err(drop),
            Client::V5(c) => c.try_disconnect().map_err(drop),
        };
    }
}

/// What the poller shares across protocols.
pub struct Poller {
    pub filters: Vec<String>,
    pub qos: QoS,
    pub tx: mpsc::Sender<Message>,
    pub health: Arc<SourceHealth>,
    pub backoff: Backoff,
    /// The source is stopping: no more reconnects.
    pub shutdown: CancellationToken,
    /// Stop polling at once (after the ack flush timed out).
    pub stop: CancellationToken,
    /// Told of every connection and every barrier answered.
    pub redelivery: Arc<Redelivery>,
    /// Connections so far.
    pub connections: u64,
    pub retained: Retained,
    /// What the session holds at the broker.
    pub subscriptions: Subscriptions,
}

/// Starts the client and its poller.
pub fn start(
    options: Options,
    request_capacity: usize,
    poller: Poller,
) -> (Client, JoinHandle<()>) {
    match options {
        Options::V4(options) => {
            let (client, eventloop) = rumqttc::AsyncClient::new(*options, request_capacity);
            let task = tokio::spawn(poll_v4(eventloop, client.clone(), poller));
            (Client::V4(client), task)
        }
        Options::V5(options) => {
            let (client, eventloop) = v5::AsyncClient::new(*options, request_capacity);
            let task = tokio::spawn(poll_v5(eventloop, client.clone(), poller));
            (Client::V5(client), task)
        }
    }
}

impl Poller {
    fn connected(&mut self, session_present: bool) {
        tracing::info!(source = %self.health.name, session_present, "connected to the MQTT broker");
        self.connections += 1;
        self.redelivery.connected(self.connections, session_present);
        self.backoff.reset();
        if self.filters.is_empty() {
            self.health.set_connected(true);
        }
    }

    fn subscribed(&mut self, refused: usize) {
        if refused > 0 {
            tracing::error!(source = %self.health.name, refused, "the broker refused subscriptions");
        }
        self.subscriptions.subscribed(&self.filters);
        self.health.set_connected(true);
    }

    /// A filter the session holds and the configuration no longer names.
    fn unsubscribe(&self, queued: bool, filter: &str) {
        if queued {
            tracing::info!(source = %self.health.name, filter, "unsubscribing from a filter no longer configured");
        } else {
            tracing::warn!(source = %self.health.name, filter, "cannot queue the unsubscription of a filter no longer configured");
        }
    }

    /// Whether a message on `topic` is a retained one not to store (see
    /// [`Retained`]).
    fn replayed(&self, retain: bool, topic: &str) -> bool {
        retain && self.retained.skips(self.subscriptions.resumed_match(topic))
    }

    /// Handles one event of the 3.1.1 client; `false` once it stops.
    async fn on_v4(
        &mut self,
        event: rumqttc::Event,
        client: &rumqttc::AsyncClient,
        filters: &[rumqttc::SubscribeFilter],
    ) -> bool {
        use rumqttc::{Event, Packet, SubscribeReasonCode};
        match event {
            Event::Incoming(Packet::ConnAck(ack)) => {
                // Before the connection counts as up: no barrier is queued
                // ahead of these.
                for filter in self.subscriptions.connected(ack.session_present, &self.filters) {
                    self.unsubscribe(client.try_unsubscribe(filter.clone()).is_ok(), &filter);
                }
                self.connected(ack.session_present);
                if !filters.is_empty() && client.try_subscribe_many(filters.to_vec()).is_err() {
                    tracing::warn!(source = %self.health.name, "cannot queue the subscription");
                }
            }
            Event::Incoming(Packet::SubAck(ack)) => self.subscribed(
                ack.return_codes
                    .iter()
                    .filter(|c| matches!(c, SubscribeReasonCode::Failure))
                    .count(),
            ),
            Event::Incoming(Packet::Publish(publish)) => {
                let message = Message {
                    topic: publish.topic.clone(),
                    payload: publish.payload.clone(),
                    pkid: publish.pkid,
                    connection: self.connections,
                    replay: self.replayed(publish.retain, &publish.topic),
                    ack: Ack::V4(publish),
                };
                self.deliver(message).await;
            }
            Event::Outgoing(Outgoing::Unsubscribe(pkid)) => self.redelivery.barrier_written(pkid),
            Event::Incoming(Packet::UnsubAck(ack)) => self.redelivery.barrier_answered(ack.pkid),
            Event::Outgoing(Outgoing::Disconnect) => return false,
            _ => {}
        }
        true
    }

    /// Handles one event of the MQTT 5 client; `false` once it stops.
    async fn on_v5(
        &mut self,
        event: v5::Event,
        client: &v5::AsyncClient,
        filters: &[v5::mqttbytes::v5::Filter],
    ) -> bool {
        use v5::Event;
        use v5::mqttbytes::v5::{Packet, SubscribeReasonCode};
        match event {
            Event::Incoming(Packet::ConnAck(ack)) => {
                for filter in self.subscriptions.connected(ack.session_present, &self.filters) {
                    self.unsubscribe(client.try_unsubscribe(filter.clone()).is_ok(), &filter);
                }
                self.connected(ack.session_present);
                if !filters.is_empty() && client.try_subscribe_many(filters.to_vec()).is_err() {
                    tracing::warn!(source = %self.health.name, "cannot queue the subscription");
                }
            }
            Event::Incoming(Packet::SubAck(ack)) => self.subscribed(
                ack.return_codes
                    .iter()
                    .filter(|c| !matches!(c, SubscribeReasonCode::Success(_)))
                    .count(),
            ),
            Event::Incoming(Packet::Publish(publish)) => {
                let topic = String::from_utf8_lossy(&publish.topic).into_owned();
                let message = Message {
                    replay: self.replayed(publish.retain, &topic),
                    topic,
                    payload: publish.payload.clone(),
                    pkid: publish.pkid,
                    connection: self.connections,
                    ack: Ack::V5(publish),
                };
                self.deliver(message).await;
            }
            Event::Outgoing(Outgoing::Unsubscribe(pkid)) => self.redelivery.barrier_written(pkid),
            Event::Incoming(Packet::UnsubAck(ack)) => self.redelivery.barrier_answered(ack.pkid),
            Event::Outgoing(Outgoing::Disconnect) => return false,
            _ => {}
        }
        true
    }

    /// Hands a message over; a closed channel means the processor stopped
    /// and the message stays unacknowledged.
    async fn deliver(&self, message: Message) {
        self.redelivery.arrived(message.pkid, &message.topic, &message.payload);
        let _ = self.tx.send(message).await;
    }

    /// After a connection error: `false` to stop polling, else waits the
    /// backoff delay (the event loop reconnects on its next poll).
    async fn failed(&mut self, error: String, rng: &mut StdRng) -> bool {
        self.health.set_connected(false);
        self.health.set_error(error.clone());
        if self.shutdown.is_cancelled() {
            return false;
        }
        let delay = self.backoff.next_delay(rng);
        tracing::warn!(source = %self.health.name, %error, ?delay, "MQTT connection failed; reconnecting");
        tokio::select! {
            () = tokio::time::sleep(delay) => true,
            () = self.stop.cancelled() => false,
            () = self.shutdown.cancelled() => true,
        }
    }
}

/// The poll loop of both protocols, whose event loops share no trait:
/// `$m` is the client's module, `$on` the [`Poller`]'s handler of its
/// events. Returns from the enclosing function when polling ends.
macro_rules! poll_loop {
    ($m:ident, $eventloop:ident, $client:ident, $p:ident, $filters:ident, $on:ident) => {{
        let mut rng = StdRng::from_os_rng();
        loop {
            let event = tokio::select! {
                event = $eventloop.poll() => event,
                () = $p.stop.cancelled() => return,
            };
            let error = match event {
                Ok(event) => match $p.$on(event, &$client, &$filters).await {
                    true => continue,
                    false => return,
                },
                Err($m::ConnectionError::RequestsDone) => return,
                Err(e) => e.to_string(),
            };
            // The poll that failed may have read packets of the connection
            // that ended (rumqttc reads up to ten at a time): they are its,
            // and are handled before the next connection starts.
            let left: Vec<_> = $eventloop.state.events.drain(..).collect();
            for event in left {
                if !$p.$on(event, &$client, &$filters).await {
                    return;
                }
            }
            // rumqttc would write a barrier it holds over on the next
            // connection, where its answer proves nothing.
            let queued = $eventloop.pending.len();
            $eventloop.pending.retain(|r| !matches!(r, $m::Request::Unsubscribe(_)));
            $p.redelivery.disconnected($eventloop.pending.len() < queued);
            if !$p.failed(error, &mut rng).await {
                return;
            }
        }
    }};
}

async fn poll_v4(mut eventloop: rumqttc::EventLoop, client: rumqttc::AsyncClient, mut p: Poller) {
    let filters: Vec<rumqttc::SubscribeFilter> =
        p.filters.iter().map(|f| rumqttc::SubscribeFilter::new(f.clone(), p.qos)).collect();
    poll_loop!(rumqttc, eventloop, client, p, filters, on_v4)
}

async fn poll_v5(mut eventloop: v5::EventLoop, client: v5::AsyncClient, mut p: Poller) {
    let filters: Vec<v5::mqttbytes::v5::Filter> =
        p.filters.iter().map(|f| v5::mqttbytes::v5::Filter::new(f.clone(), qos5(p.qos))).collect();
    poll_loop!(v5, eventloop, client, p, filters, on_v5)
}

fn qos5(qos: QoS) -> v5::mqttbytes::QoS {
    match qos {
        QoS::AtMostOnce => v5::mqttbytes::QoS::AtMostOnce,
        QoS::AtLeastOnce => v5::mqttbytes::QoS::AtLeastOnce,
        QoS::ExactlyOnce => v5::mqttbytes::QoS::ExactlyOnce,
    }
}
