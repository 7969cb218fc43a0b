//! Model-based property test of the log buffer: random appends, reads,
//! acknowledgements and crashes (with and without a torn last write),
//! checked against a plain in-memory model.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly

#[path = "support/buffer.rs"]
mod support;

use std::collections::VecDeque;
use std::fs::OpenOptions;

use bytes::Bytes;
use opgraph_gateway::Error;
use opgraph_gateway::buffer::{Buffer, BufferConfig, FsyncPolicy, LogBuffer, Record};
use proptest::prelude::*;
use support::*;

#[derive(Debug, Clone)]
enum Op {
    /// Append records with these payload sizes.
    Append(Vec<usize>),
    /// Read from (first unacknowledged + offset), at most `max` records.
    Read { offset: u64, max: usize },
    /// Acknowledge `fraction` (per mille) of what is pending.
    Ack { per_mille: u64 },
    /// Acknowledge something already acknowledged, or beyond the end.
    AckOutOfRange { beyond: bool },
    /// Drop the buffer without closing it and reopen.
    Crash,
    /// Append, then crash and cut `per_mille` of that append's bytes in the
    /// tail segment off the file: the last append never returned.
    TornCrash { sizes: Vec<usize>, per_mille: u64 },
    /// Close cleanly and reopen.
    Restart,
}

fn op() -> impl Strategy<Value = Op> {
    let sizes = || prop::collection::vec(prop_oneof![0..40usize, 100..300usize], 1..6);
    prop_oneof![
        6 => sizes().prop_map(Op::Append),
        3 => (0..30u64, 1..12usize).prop_map(|(offset, max)| Op::Read { offset, max }),
        3 => (0..=1000u64).prop_map(|per_mille| Op::Ack { per_mille }),
        1 => any::<bool>().prop_map(|beyond| Op::AckOutOfRange { beyond }),
        1 => Just(Op::Crash),
        1 => (sizes(), 1..=1000u64).prop_map(|(sizes, per_mille)| Op::TornCrash { sizes, per_mille }),
        1 => Just(Op::Restart),
    ]
}

/// What the buffer must hold: unacknowledged records in order.
#[derive(Debug, Default)]
struct Model {
    records: VecDeque<Record>,
    next_seq: u64,
    acked: u64,
    tag: u64,
}

impl Model {
    fn payloads(&mut self, sizes: &[usize]) -> Vec<Bytes> {
        sizes
            .iter()
            .map(|&len| {
                self.tag += 1;
                payload(self.tag, len)
            })
            .collect()
    }

    fn push(&mut self, first: u64, payloads: Vec<Bytes>) {
        self.next_seq = first + payloads.len() as u64;
        for (i, payload) in payloads.into_iter().enumerate() {
            self.records.push_back(Record { seq: first + i as u64, payload });
        }
    }

    fn expected_read(&self, from: u64, max: usize) -> Vec<Record> {
        self.records.iter().filter(|r| r.seq >= from).take(max).cloned().collect()
    }
}

async fn check_stats(buffer: &LogBuffer, model: &Model) -> Result<(), TestCaseError> {
    let stats = buffer.stats();
    prop_assert_eq!(stats.next_seq, model.next_seq);
    prop_assert_eq!(stats.first_unacked_seq, model.acked + 1);
    prop_assert_eq!(stats.pending_records, model.records.len() as u64);
    prop_assert_eq!(stats.corrupt_skipped_total, 0);
    prop_assert_eq!(stats.dropped_total, 0);
    prop_assert!(!stats.degraded, "{:?}", stats.last_error);
    Ok(())
}

async fn run(fsync: FsyncPolicy, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let dir = tempfile::tempdir().unwrap();
    let config: BufferConfig = config(dir.path(), fsync, 1024, 64 << 20);
    let mut buffer = open(&config).await;
    let mut model = Model { next_seq: 1, ..Model::default() };
    for op in ops {
        match op {
            Op::Append(sizes) => {
                let payloads = model.payloads(&sizes);
                let range = buffer.append(payloads.clone()).await.unwrap();
                prop_assert_eq!(*range.start(), model.next_seq, "consecutive, never reused");
                prop_assert_eq!(*range.end(), model.next_seq + sizes.len() as u64 - 1);
                model.push(*range.start(), payloads);
            }
            Op::Read { offset, max } => {
                let from = model.acked + 1 + offset;
                let got = buffer.read(from, max, usize::MAX).await.unwrap();
                prop_assert_eq!(got, model.expected_read(from, max));
                // A read from before the acknowledged prefix starts after it.
                let got = buffer.read(0, max, usize::MAX).await.unwrap();
                prop_assert_eq!(got, model.expected_read(0, max));
            }
            Op::Ack { per_mille } => {
                let pending = model.records.len() as u64;
                let count = pending * per_mille / 1000;
                if count > 0 {
                    let up_to = model.acked + count;
                    buffer.ack(up_to).await.unwrap();
                    model.acked = up_to;
                    while model.records.front().is_some_and(|r| r.seq <= up_to) {
                        model.records.pop_front();
                    }
                }
            }
            Op::AckOutOfRange { beyond } => {
                if beyond {
                    let err = buffer.ack(model.next_seq).await.unwrap_err();
                    prop_assert!(matches!(err, Error::AckBeyondEnd { .. }), "{err}");
                } else {
                    buffer.ack(model.acked).await.unwrap();
                }
            }
            Op::Crash => {
                drop(buffer);
                buffer = open(&config).await;
            }
            Op::Restart => {
                buffer.close().await.unwrap();
                drop(buffer);
                buffer = open(&config).await;
            }
            Op::TornCrash { sizes, per_mille } => {
                let payloads = model.payloads(&sizes);
                let range = buffer.append(payloads.clone()).await.unwrap();
                prop_assert_eq!(*range.start(), model.next_seq);
                drop(buffer);
                // Bytes of this append that are in the tail segment.
                let (tail_first, tail_path) = segment_files(dir.path()).pop().unwrap();
                let in_tail: u64 = (*range.start()..=*range.end())
                    .zip(&sizes)
                    .filter(|(seq, _)| *seq >= tail_first)
                    .map(|(_, &len)| record_bytes(len))
                    .sum();
                let cut = (in_tail * per_mille / 1000).max(1);
                let file = OpenOptions::new().write(true).open(&tail_path).unwrap();
                let len = file.metadata().unwrap().len();
                file.set_len(len - cut).unwrap();
                drop(file);

                buffer = open(&config).await;
                // A prefix of the unanswered append may survive; the rest of
                // its numbers are free again.
                let next = buffer.stats().next_seq;
                prop_assert!(
                    next >= *range.start() && next <= *range.end(),
                    "next {next} for {range:?}"
                );
                let survived = (next - range.start()) as usize;
                if survived > 0 {
                    model.push(*range.start(), payloads[..survived].to_vec());
                }
            }
        }
        check_stats(&buffer, &model).await?;
    }
    // Everything the model holds is readable, in order, exactly.
    let all = read_all(&buffer, 0).await;
    prop_assert_eq!(all, model.records.iter().cloned().collect::<Vec<_>>());
    buffer.close().await.unwrap();
    Ok(())
}

/// 128 cases by default (a few seconds); `PROPTEST_CASES=2000` for a soak.
fn cases() -> u32 {
    std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(128)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn log_matches_model(
        fsync in prop_oneof![Just(FsyncPolicy::Always), Just(FsyncPolicy::Batch)],
        ops in prop::collection::vec(op(), 1..40),
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(run(fsync, ops))?;
    }
}
