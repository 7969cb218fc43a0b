//! [`MemoryUplink`]: an in-memory cloud behind the [`Uplink`] trait, for
//! the shipper's unit tests.
//!
//! [`MemoryCloud`] follows the cloud's delivery rules (epochs and fencing,
//! ranges that must join the stored prefix, cumulative acks that start
//! over under a new buffer id, nothing stored twice: by sequence, and by
//! event id across buffer ids) and can misbehave on request: refuse connections or the
//! credential, lose acknowledgements, answer RETRY_LATER, fence a session,
//! forget its latest acks.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use opgraph_proto::encoded_batch::EncodedBatch;
use opgraph_proto::pb;
use prost::Message;
use tokio::sync::mpsc;

use super::Uplink;
use crate::error::{Error, Result};

const ENDPOINT: &str = "memory://cloud";

/// The cloud's side: what it stored and how it misbehaves.
#[derive(Debug, Default)]
pub struct MemoryCloud {
    state: Mutex<CloudState>,
}

#[derive(Debug, Default)]
struct CloudState {
    epoch: u64,
    acked: u64,
    /// The buffer id the ack belongs to.
    buffer_id: String,
    /// Buffer ids seen, counting from 0: a new one starts the sequence over.
    generation: u64,
    /// Stored events by (generation, sequence): their ids.
    stored: BTreeMap<(u64, u64), String>,
    /// Ids stored, with the generation that stored them.
    ids: HashMap<String, u64>,
    /// Every commit of an event id (to catch duplicates).
    commits: Vec<String>,
    batches: u64,
    max_batch_events: usize,
    sessions: u64,
    refuse_connects: u32,
    unauthorized: bool,
    lose_ack_every: u64,
    retry_later_every: u64,
}

impl MemoryCloud {
    pub fn new() -> Arc<Self> {
        Arc::new(MemoryCloud::default())
    }

    fn state(&self) -> MutexGuard<'_, CloudState> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The next `n` connection attempts fail.
    pub fn refuse_connects(&self, n: u32) {
        self.state().refuse_connects = n;
    }

    /// Refuse (or accept again) the credential.
    pub fn set_unauthorized(&self, refuse: bool) {
        self.state().unauthorized = refuse;
    }

    /// Lose the acknowledgement of every `k`-th batch (0: none).
    pub fn lose_ack_every(&self, k: u64) {
        self.state().lose_ack_every = k;
    }

    /// Answer RETRY_LATER (storing nothing) to every `k`-th batch (0: none).
    pub fn retry_later_every(&self, k: u64) {
        self.state().retry_later_every = k;
    }

    /// Another session of the gateway takes over: the current one is
    /// fenced.
    pub fn fence(&self) {
        self.state().epoch += 1;
    }

    /// The cloud restarts having recorded its acks only up to `seq` (it
    /// may record an ack after sending it): the current session is fenced
    /// and the next resumes there. What it stored stays stored.
    pub fn forget_acks_after(&self, seq: u64) {
        let mut state = self.state();
        state.acked = state.acked.min(seq);
        state.epoch += 1;
    }

    /// Ids stored, in sequence order (a later buffer id's after).
    pub fn stored_ids(&self) -> Vec<String> {
        self.state().stored.values().cloned().collect()
    }

    /// Every id committed, duplicates included.
    pub fn commits(&self) -> Vec<String> {
        self.state().commits.clone()
    }

    /// The cumulative acknowledgement.
    pub fn acked(&self) -> u64 {
        self.state().acked
    }

    /// The most events any batch carried.
    pub fn max_batch_events(&self) -> usize {
        self.state().max_batch_events
    }

    /// Sessions opened.
    pub fn sessions(&self) -> u64 {
        self.state().sessions
    }

    /// The cloud's rules for one batch; `None` when the ack is lost.
    fn commit(&self, batch: &pb::Batch) -> Option<pb::Ack> {
        let mut state = self.state();
        state.batches += 1;
        state.max_batch_events = state.max_batch_events.max(batch.events.len());
        let n = state.batches;
        let mut ack = pb::Ack {
            gateway_id: batch.gateway_id.clone(),
            epoch: batch.epoch,
            acked_sequence: state.acked,
            status: pb::AckStatus::Ok as i32,
            error: String::new(),
        };
        let (first, last) = (batch.first_sequence, batch.last_sequence);
        let ordered = batch.events.windows(2).all(|w| w[0].sequence < w[1].sequence);
        let inside = batch.events.iter().all(|e| (first..=last).contains(&e.sequence));
        if first == 0 || last < first || !ordered || !inside {
            ack.status = pb::AckStatus::Rejected as i32;
            ack.error = format!("bad batch {first}..={last}");
        } else if batch.epoch != state.epoch {
            ack.status = pb::AckStatus::Fenced as i32;
        } else if state.retry_later_every > 0 && n.is_multiple_of(state.retry_later_every) {
            ack.status = pb::AckStatus::RetryLater as i32;
        } else if first > state.acked + 1 {
            ack.status = pb::AckStatus::RetryLater as i32;
            ack.error = "gap".into();
        } else if last > state.acked {
            let acked = state.acked;
            let generation = state.generation;
            for event in batch.events.iter().filter(|e| e.sequence > acked) {
                // Found by id, as the cloud does after forgetting acks or
                // under a new buffer id. Within one buffer id only the same
                // event at the same sequence counts, so that a shipper
                // sending an event twice still shows in `commits`.
                let resent = state.stored.get(&(generation, event.sequence)) == Some(&event.id);
                let earlier = state.ids.get(&event.id).is_some_and(|&g| g < generation);
                if resent || earlier {
                    continue;
                }
                state.ids.insert(event.id.clone(), generation);
                state.stored.insert((generation, event.sequence), event.id.clone());
                state.commits.push(event.id.clone());
            }
            state.acked = last;
            ack.acked_sequence = last;
        }
        let lost = state.lose_ack_every > 0 && n.is_multiple_of(state.lose_ack_every);
        (!lost).then_some(ack)
    }
}

/// The gateway's side of a [`MemoryCloud`].
pub struct MemoryUplink {
    cloud: Arc<MemoryCloud>,
    session: Option<(mpsc::UnboundedSender<pb::Ack>, mpsc::UnboundedReceiver<pb::Ack>)>,
}

impl MemoryUplink {
    pub fn new(cloud: Arc<MemoryCloud>) -> Self {
        MemoryUplink { cloud, session: None }
    }
}

fn uplink_error(reason: &str) -> Error {
    Error::Uplink { endpoint: ENDPOINT.to_owned(), reason: reason.to_owned() }
}

#[async_trait]
impl Uplink for MemoryUplink {
    fn endpoint(&self) -> &str {
        ENDPOINT
    }

    async fn connect(&mut self, hello: &pb::HelloRequest) -> Result<pb::HelloResponse> {
        self.session = None;
        let mut state = self.cloud.state();
        if state.refuse_connects > 0 {
            state.refuse_connects -= 1;
            return Err(uplink_error("connection refused"));
        }
        if state.unauthorized {
            return Err(Error::Unauthorized {
                endpoint: ENDPOINT.to_owned(),
                reason: "unknown API key".into(),
            });
        }
        if !hello.buffer_id.is_empty() && hello.buffer_id != state.buffer_id {
            if !state.buffer_id.is_empty() {
                state.generation += 1;
                state.acked = 0;
            }
            state.buffer_id = hello.buffer_id.clone();
        }
        state.epoch += 1;
        state.sessions += 1;
        let response = pb::HelloResponse { epoch: state.epoch, acked_sequence: state.acked };
        self.session = Some(mpsc::unbounded_channel());
        Ok(response)
    }

    async fn send(&mut self, batch: EncodedBatch) -> Result<()> {
        let Some((tx, _)) = &self.session else { return Err(uplink_error("no session")) };
        // Decoded as the cloud would: the bytes on the wire are what counts.
        let batch = pb::Batch::decode(batch.encode_to_vec().as_slice())
            .map_err(|e| uplink_error(&format!("undecodable batch: {e}")))?;
        if let Some(ack) = self.cloud.commit(&batch) {
            tx.send(ack).map_err(|_| uplink_error("session closed"))?;
        }
        Ok(())
    }

    async fn recv_ack(&mut self) -> Result<pb::Ack> {
        let Some((_, rx)) = &mut self.session else { return Err(uplink_error("no session")) };
        rx.recv().await.ok_or_else(|| uplink_error("session closed"))
    }

    async fn disconnect(&mut self) {
        self.session = None;
    }
}
