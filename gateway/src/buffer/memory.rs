//! [`MemoryBuffer`]: the in-memory [`Buffer`], for other components' unit
//! tests and as the reference model for [`super::LogBuffer`].
//!
//! Same contract, same sequence numbering, same byte accounting (header
//! plus payload per record) and overflow policies; nothing survives a
//! restart and `drop_oldest` drops single records instead of segments.

use std::collections::VecDeque;
use std::ops::RangeInclusive;
use std::sync::Mutex;

use async_trait::async_trait;
use bytes::Bytes;
use tokio::sync::{Notify, watch};

use super::log::lock;
use super::segment::encoded_len;
use super::{Buffer, BufferStats, OverflowPolicy, Record};
use crate::error::{Error, Result};

/// A [`Buffer`] in memory.
pub struct MemoryBuffer {
    max_bytes: u64,
    overflow: OverflowPolicy,
    state: Mutex<MemoryState>,
    space: Notify,
    watermark: watch::Sender<u64>,
}

#[derive(Debug)]
struct MemoryState {
    records: VecDeque<Record>,
    bytes: u64,
    next_seq: u64,
    acked: u64,
    closed: bool,
    stats: BufferStats,
}

impl Default for MemoryBuffer {
    fn default() -> Self {
        MemoryBuffer::new()
    }
}

impl MemoryBuffer {
    /// An unbounded buffer.
    pub fn new() -> Self {
        MemoryBuffer::with_limit(u64::MAX, OverflowPolicy::Block)
    }

    /// A buffer holding at most `max_bytes` (header plus payload per
    /// record), overflowing per `overflow`.
    pub fn with_limit(max_bytes: u64, overflow: OverflowPolicy) -> Self {
        MemoryBuffer {
            max_bytes,
            overflow,
            state: Mutex::new(MemoryState {
                records: VecDeque::new(),
                bytes: 0,
                next_seq: 1,
                acked: 0,
                closed: false,
                stats: BufferStats::default(),
            }),
            space: Notify::new(),
            watermark: watch::channel(1).0,
        }
    }
}

#[async_trait]
impl Buffer for MemoryBuffer {
    async fn append(&self, records: Vec<Bytes>) -> Result<RangeInclusive<u64>> {
        if records.is_empty() {
            return Err(Error::EmptyAppend);
        }
        let bytes: u64 = records.iter().map(|r| encoded_len(r.len())).sum();
        if bytes > self.max_bytes {
            return Err(Error::AppendTooLarge { size: bytes, limit: self.max_bytes });
        }
        loop {
            let freed = self.space.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            {
                let mut state = lock(&self.state);
                if state.closed {
                    return Err(Error::Closed);
                }
                if self.overflow == OverflowPolicy::DropOldest {
                    while state.bytes + bytes > self.max_bytes {
                        let Some(old) = state.records.pop_front() else { break };
                        state.bytes -= encoded_len(old.payload.len());
                        state.stats.dropped_total += 1;
                    }
                }
                if state.bytes + bytes <= self.max_bytes {
                    let first = state.next_seq;
                    for payload in records {
                        let seq = state.next_seq;
                        state.next_seq += 1;
                        state.records.push_back(Record { seq, payload });
                    }
                    state.bytes += bytes;
                    state.stats.appended_total += state.next_seq - first;
                    self.watermark.send_replace(state.next_seq);
                    return Ok(first..=state.next_seq - 1);
                }
            }
            freed.await;
        }
    }

    async fn read(
        &self,
        from_seq: u64,
        max_records: usize,
        max_bytes: usize,
    ) -> Result<Vec<Record>> {
        let state = lock(&self.state);
        if state.closed {
            return Err(Error::Closed);
        }
        let start = state.records.partition_point(|r| r.seq < from_seq);
        let mut out = Vec::new();
        let mut bytes = 0;
        for record in state.records.range(start..) {
            if out.len() >= max_records || (bytes >= max_bytes && !out.is_empty()) {
                break;
            }
            bytes += record.payload.len();
            out.push(record.clone());
        }
        Ok(out)
    }

    async fn ack(&self, up_to_seq: u64) -> Result<()> {
        let mut state = lock(&self.state);
        if state.closed {
            return Err(Error::Closed);
        }
        if up_to_seq >= state.next_seq {
            return Err(Error::AckBeyondEnd { seq: up_to_seq, last: state.next_seq - 1 });
        }
        if up_to_seq <= state.acked {
            return Ok(());
        }
        state.acked = up_to_seq;
        while state.records.front().is_some_and(|r| r.seq <= up_to_seq) {
            let Some(old) = state.records.pop_front() else { break };
            state.bytes -= encoded_len(old.payload.len());
            state.stats.acked_total += 1;
        }
        drop(state);
        self.space.notify_waiters();
        Ok(())
    }

    fn subscribe(&self) -> watch::Receiver<u64> {
        self.watermark.subscribe()
    }

    fn stats(&self) -> BufferStats {
        let state = lock(&self.state);
        let first_unacked_seq = state.records.front().map_or(state.next_seq, |r| r.seq);
        BufferStats {
            pending_records: state.next_seq - first_unacked_seq,
            pending_bytes: state.bytes,
            first_unacked_seq,
            next_seq: state.next_seq,
            ..state.stats.clone()
        }
    }

    async fn close(&self) -> Result<()> {
        lock(&self.state).closed = true;
        self.space.notify_waiters();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn payloads(n: usize) -> Vec<Bytes> {
        (0..n).map(|i| Bytes::from(vec![i as u8; 10])).collect()
    }

    #[tokio::test]
    async fn append_read_ack() {
        let buffer = MemoryBuffer::new();
        assert_eq!(buffer.append(payloads(3)).await.unwrap(), 1..=3);
        assert_eq!(buffer.append(payloads(2)).await.unwrap(), 4..=5);
        let read = buffer.read(2, 2, usize::MAX).await.unwrap();
        assert_eq!(read.iter().map(|r| r.seq).collect::<Vec<_>>(), vec![2, 3]);
        buffer.ack(3).await.unwrap();
        let read = buffer.read(0, 10, usize::MAX).await.unwrap();
        assert_eq!(read.iter().map(|r| r.seq).collect::<Vec<_>>(), vec![4, 5]);
        assert!(matches!(buffer.ack(6).await, Err(Error::AckBeyondEnd { seq: 6, last: 5 })));
        let stats = buffer.stats();
        assert_eq!((stats.pending_records, stats.first_unacked_seq, stats.next_seq), (2, 4, 6));
    }

    #[tokio::test]
    async fn drop_oldest_counts() {
        let buffer = MemoryBuffer::with_limit(3 * encoded_len(10), OverflowPolicy::DropOldest);
        buffer.append(payloads(3)).await.unwrap();
        buffer.append(payloads(2)).await.unwrap();
        assert_eq!(buffer.stats().dropped_total, 2);
        assert_eq!(buffer.read(0, 10, usize::MAX).await.unwrap()[0].seq, 3);
    }

    #[tokio::test]
    async fn block_waits_for_ack_and_close() {
        let buffer = std::sync::Arc::new(MemoryBuffer::with_limit(
            2 * encoded_len(10),
            OverflowPolicy::Block,
        ));
        buffer.append(payloads(2)).await.unwrap();
        let blocked = tokio::spawn({
            let buffer = buffer.clone();
            async move { buffer.append(payloads(1)).await }
        });
        tokio::task::yield_now().await;
        assert!(!blocked.is_finished());
        buffer.ack(1).await.unwrap();
        let range =
            tokio::time::timeout(Duration::from_secs(5), blocked).await.unwrap().unwrap().unwrap();
        assert_eq!(range, 3..=3);

        let blocked = tokio::spawn({
            let buffer = buffer.clone();
            async move { buffer.append(payloads(1)).await }
        });
        tokio::task::yield_now().await;
        buffer.close().await.unwrap();
        let result = tokio::time::timeout(Duration::from_secs(5), blocked).await.unwrap().unwrap();
        assert!(matches!(result, Err(Error::Closed)));
    }
}
