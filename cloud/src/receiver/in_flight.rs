//! A gateway's batches handed to the store ahead of their answers, by one
//! task, oldest first. The store applies commits in the order one task
//! hands them over (`GatewayStore::commit_gateway_batch`): each is polled
//! once here when handed over, and only the oldest is polled after that.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;

use opgraph_proto::pb;

use super::{ReadyBatch, Receiver};
use crate::auth::Principal;

/// Batches handed over ahead of their answers, at most: the gateway's
/// default window (`uplink.max_in_flight`).
pub const MAX_IN_FLIGHT: usize = 8;

/// A batch's commit, or its answer already.
type Commit = Pin<Box<dyn Future<Output = pb::Ack> + Send>>;

/// Commits in the order handed over, each with what its answer goes to.
pub struct InFlight<T> {
    queue: VecDeque<(Commit, T)>,
}

impl<T> InFlight<T> {
    pub fn new() -> Self {
        InFlight { queue: VecDeque::new() }
    }

    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    pub fn is_full(&self) -> bool {
        self.queue.len() >= MAX_IN_FLIGHT
    }

    /// Starts `ready`'s commit: after this it is in the store's queue,
    /// behind every commit handed over before it.
    pub async fn hand_over(
        &mut self,
        receiver: &Arc<Receiver>,
        principal: &Principal,
        transport: &'static str,
        ready: ReadyBatch,
        to: T,
    ) {
        // Before the commit exists, so that its first poll reaches the
        // store's queue without a store read (`Usage::refresh_quota`).
        receiver.refresh_quota(principal).await;
        let (receiver, principal) = (Arc::clone(receiver), principal.clone());
        let mut commit: Commit =
            Box::pin(async move { receiver.commit(&principal, transport, ready).await });
        let first = std::future::poll_fn(|cx| Poll::Ready(commit.as_mut().poll(cx))).await;
        match first {
            Poll::Ready(ack) => self.answered(ack, to),
            Poll::Pending => self.queue.push_back((commit, to)),
        }
    }

    /// An answer known already, to go out after those handed over before.
    pub fn answered(&mut self, ack: pb::Ack, to: T) {
        self.queue.push_back((Box::pin(std::future::ready(ack)), to));
    }

    /// The oldest answer, once ready; `None` when nothing is in flight.
    /// Cancel-safe: a wait given up leaves the commit in place.
    pub async fn next(&mut self) -> Option<(pb::Ack, T)> {
        let (commit, _) = self.queue.front_mut()?;
        let ack = commit.await;
        self.queue.pop_front().map(|(_, to)| (ack, to))
    }
}
