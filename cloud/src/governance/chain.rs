//! Verification of the receipt chains: fed the stored receipts in chain
//! order (writer, then sequence), it recomputes each content hash and
//! checks each link, and reports the first broken one per chain.
//!
//! What a link must satisfy (docs/governance.md, "Chain verification"):
//! the body is a JSON object whose recomputed `contentHash` equals both the
//! one in the body and the stored column; the body's `id`, `writer`,
//! `sequence`, `prevHash`, `outcome`, `createdAt` agree with the stored
//! columns; sequences run 1, 2, 3, ... without gaps; the first `prevHash` is
//! 64 zeros and every other one is the previous receipt's `contentHash`.
//!
//! A walk may be cut into calls (docs/governance.md, "Paged
//! verification"): a verifier can start inside a chain, from the position
//! and hash the previous call ended at, so a link at the cut is checked as
//! if the walk had not stopped; and its report says where to go on.

use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;

use super::hash::{self, GENESIS_HASH};
use crate::store::governance::ReceiptRow;

/// Where a chain breaks, and why.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct BrokenLink {
    pub receipt_id: String,
    pub writer: String,
    pub sequence: i64,
    pub reason: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ChainReport {
    pub writer: String,
    /// Receipts of this chain checked by this call (the chain's length
    /// when the call checked all of it).
    pub length: u64,
    /// `contentHash` of the last receipt checked.
    pub head_hash: String,
    pub valid: bool,
    pub first_broken: Option<BrokenLink>,
    /// Set when this chain goes on past the last receipt checked: the
    /// query parameters that check the rest of this one chain.
    pub next: Option<Continuation>,
}

#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct VerifyReport {
    /// No broken link among the receipts checked.
    pub valid: bool,
    pub checked_receipts: u64,
    pub chains: Vec<ChainReport>,
    /// The first broken link in chain order, if any.
    pub first_broken: Option<BrokenLink>,
    /// Every receipt this call was asked about was checked; when false,
    /// `next` says where to go on.
    pub complete: bool,
    /// The query parameters of the call that checks the rest (send them
    /// as they are, with the same `limit`).
    pub next: Option<Continuation>,
}

/// Where a cut walk goes on: query parameters of the next call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Continuation {
    /// One chain: this writer's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub writer: Option<String>,
    /// The walk over every chain, from this writer's on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub from_writer: Option<String>,
    /// The first sequence to check; absent: from the chain's start.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub from_sequence: Option<i64>,
    /// `contentHash` of the receipt before `fromSequence`, as the last
    /// call read it: the next call checks its first link against this.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prev_hash: Option<String>,
}

/// Where a walk starts inside a chain: the position just before it and
/// that receipt's `contentHash`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainStart {
    pub writer: String,
    pub from_sequence: i64,
    pub prev_hash: String,
}

/// What is left after the last receipt a call checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rest {
    /// Nothing: the call checked all it was asked about.
    Nothing,
    /// More of the chain of the last receipt checked.
    SameChain,
    /// Nothing more of that chain, but this writer's chain and those
    /// after it (a walk over every chain).
    NextChain(String),
}

#[derive(Debug, Default)]
pub struct ChainVerifier {
    chains: Vec<ChainReport>,
    /// Sequence and stored content hash of the previous receipt of the
    /// current chain.
    previous: Option<(i64, String)>,
    /// Where the first chain starts when not at its beginning; used by the
    /// first receipt of that writer.
    start: Option<ChainStart>,
    checked: u64,
}

impl ChainVerifier {
    pub fn new() -> Self {
        Self::default()
    }

    /// A verifier that checks `start.writer`'s chain from
    /// `start.from_sequence` on, as if it had checked the receipts before
    /// it and found the last one's `contentHash` to be `start.prev_hash`.
    pub fn starting_at(start: ChainStart) -> Self {
        Self { start: Some(start), ..Self::default() }
    }

    /// Checks the next receipt in chain order.
    pub fn push(&mut self, row: &ReceiptRow) {
        self.checked += 1;
        let new_chain = self.chains.last().is_none_or(|c| c.writer != row.writer);
        if new_chain {
            self.chains.push(ChainReport {
                writer: row.writer.clone(),
                length: 0,
                head_hash: String::new(),
                valid: true,
                first_broken: None,
                next: None,
            });
            // The start names one chain; any other begins at genesis.
            // (The API refuses a `fromSequence` of i64::MIN, which has no
            // position before it; saturating keeps this total.)
            self.previous = self
                .start
                .take()
                .filter(|s| s.writer == row.writer)
                .map(|s| (s.from_sequence.saturating_sub(1), s.prev_hash));
        }
        let problem = link_problem(row, self.previous.as_ref());
        if let Some(chain) = self.chains.last_mut() {
            chain.length += 1;
            chain.head_hash = row.content_hash.clone();
            if let Some(reason) = problem
                && chain.first_broken.is_none()
            {
                chain.valid = false;
                chain.first_broken = Some(BrokenLink {
                    receipt_id: row.id.clone(),
                    writer: row.writer.clone(),
                    sequence: row.sequence,
                    reason,
                });
            }
        }
        self.previous = Some((row.sequence, row.content_hash.clone()));
    }

    /// The report of a walk that checked everything it was asked about.
    pub fn finish(self) -> VerifyReport {
        self.finish_with(Rest::Nothing, false)
    }

    /// The report, saying what is left; `one_chain` when the call was about
    /// one chain (its continuation names `writer`, else `fromWriter`).
    pub fn finish_with(mut self, rest: Rest, one_chain: bool) -> VerifyReport {
        let first_broken = self.chains.iter().find_map(|c| c.first_broken.clone());
        let complete = rest == Rest::Nothing;
        let next = match (rest, self.previous.take(), self.chains.last_mut()) {
            (Rest::Nothing, ..) => None,
            (Rest::SameChain, Some((sequence, hash)), Some(chain)) => {
                let chain_next = Continuation {
                    writer: Some(chain.writer.clone()),
                    from_writer: None,
                    // Nothing follows i64::MAX in a chain, so no caller
                    // says SameChain after it; saturating keeps it total.
                    from_sequence: Some(sequence.saturating_add(1)),
                    prev_hash: Some(hash),
                };
                chain.next = Some(chain_next.clone());
                Some(if one_chain {
                    chain_next
                } else {
                    Continuation { writer: None, from_writer: chain_next.writer, ..chain_next }
                })
            }
            // Callers say SameChain only after checking a receipt.
            (Rest::SameChain, ..) => None,
            (Rest::NextChain(writer), ..) => Some(Continuation {
                writer: None,
                from_writer: Some(writer),
                from_sequence: None,
                prev_hash: None,
            }),
        };
        VerifyReport {
            valid: first_broken.is_none(),
            checked_receipts: self.checked,
            chains: self.chains,
            first_broken,
            complete,
            next,
        }
    }
}

fn link_problem(row: &ReceiptRow, previous: Option<&(i64, String)>) -> Option<String> {
    let body: Value = match serde_json::from_str(&row.body) {
        Ok(Value::Object(map)) => Value::Object(map),
        _ => return Some("the stored body is not a JSON object".to_owned()),
    };
    let recomputed = hash::content_hash(&body);
    let in_body = body.get("contentHash").and_then(Value::as_str).unwrap_or("");
    if recomputed != in_body || recomputed != row.content_hash {
        return Some(format!(
            "contentHash mismatch: stored {}, recomputed {recomputed}",
            if in_body == row.content_hash { in_body } else { "(body and column differ)" }
        ));
    }
    let text = |key: &str| body.get(key).and_then(Value::as_str).map(str::to_owned);
    let columns = [
        ("id", text("id") == Some(row.id.clone())),
        ("writer", text("writer") == Some(row.writer.clone())),
        ("sequence", body.get("sequence").and_then(Value::as_i64) == Some(row.sequence)),
        ("prevHash", text("prevHash") == Some(row.prev_hash.clone())),
        ("outcome", text("outcome") == Some(row.outcome.clone())),
        ("createdAt", body.get("createdAt").and_then(Value::as_i64) == Some(row.created_at)),
        ("traceId", text("traceId") == row.trace_id),
        ("decisionObjectId", text("decisionObjectId") == row.decision_id),
    ];
    if let Some((field, _)) = columns.iter().find(|(_, agrees)| !agrees) {
        return Some(format!("stored column `{field}` disagrees with the receipt body"));
    }
    let (expected_sequence, expected_prev) = match previous {
        None => (1, GENESIS_HASH),
        // A stored sequence is outside input too: one at the end of the
        // range (written into the table by hand) is a break, not a panic.
        Some((sequence, hash)) => match sequence.checked_add(1) {
            Some(next) => (next, hash.as_str()),
            None => return Some(format!("sequence {sequence} cannot be followed by another")),
        },
    };
    if previous.is_some_and(|(sequence, _)| *sequence == row.sequence) {
        return Some(format!(
            "sequence {} stored twice, with different contents (a receipt edited by a copy)",
            row.sequence
        ));
    }
    if row.sequence != expected_sequence {
        return Some(format!(
            "sequence gap: expected {expected_sequence}, found {} (a receipt is missing)",
            row.sequence
        ));
    }
    if row.prev_hash != expected_prev {
        return Some(format!(
            "prevHash {} does not match the previous receipt's contentHash {expected_prev}",
            row.prev_hash
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn chain(writer: &str, n: i64) -> Vec<ReceiptRow> {
        let mut prev = GENESIS_HASH.to_owned();
        (1..=n)
            .map(|sequence| {
                let mut body = json!({
                    "id": format!("rcp_{writer}{sequence}"), "writer": writer,
                    "sequence": sequence, "prevHash": prev, "outcome": "allow",
                    "createdAt": 1000 + sequence, "decisionObjectId": "dec_1",
                });
                let content = hash::content_hash(&body);
                body["contentHash"] = json!(content);
                let row = ReceiptRow {
                    id: format!("rcp_{writer}{sequence}"),
                    writer: writer.to_owned(),
                    sequence,
                    prev_hash: prev.clone(),
                    content_hash: content.clone(),
                    created_at: 1000 + sequence,
                    outcome: "allow".into(),
                    trace_id: None,
                    decision_id: Some("dec_1".into()),
                    body: body.to_string(),
                };
                prev = content;
                row
            })
            .collect()
    }

    fn verify(rows: &[ReceiptRow]) -> VerifyReport {
        let mut v = ChainVerifier::new();
        rows.iter().for_each(|r| v.push(r));
        v.finish()
    }

    #[test]
    fn intact_chains_verify() {
        let mut rows = chain("key_a", 5);
        rows.extend(chain("key_b", 3));
        let report = verify(&rows);
        assert!(report.valid, "{report:?}");
        assert_eq!(report.checked_receipts, 8);
        assert_eq!(report.chains.len(), 2);
        assert_eq!(report.chains[0].head_hash, rows[4].content_hash);
    }

    #[test]
    fn edited_body_is_found() {
        let mut rows = chain("key_a", 4);
        rows[2].body = rows[2].body.replace("\"allow\"", "\"deny\"");
        let report = verify(&rows);
        let broken = report.first_broken.unwrap();
        assert_eq!(broken.sequence, 3);
        assert!(broken.reason.contains("contentHash mismatch"), "{}", broken.reason);
    }

    #[test]
    fn rehashed_edit_breaks_the_next_link() {
        let mut rows = chain("key_a", 4);
        let mut body: Value = serde_json::from_str(&rows[1].body).unwrap();
        body["createdAt"] = json!(1);
        body.as_object_mut().unwrap().remove("contentHash");
        let forged = hash::content_hash(&body);
        body["contentHash"] = json!(forged);
        rows[1].body = body.to_string();
        rows[1].content_hash = forged;
        rows[1].created_at = 1;
        let broken = verify(&rows).first_broken.unwrap();
        assert_eq!(broken.sequence, 3);
        assert!(broken.reason.contains("prevHash"), "{}", broken.reason);
    }

    #[test]
    fn deleted_receipt_is_a_gap() {
        let mut rows = chain("key_a", 4);
        rows.remove(1);
        let broken = verify(&rows).first_broken.unwrap();
        assert!(broken.reason.contains("sequence gap"), "{}", broken.reason);
    }

    #[test]
    fn a_sequence_at_the_end_of_the_range_is_a_break_not_a_panic() {
        let mut rows = chain("key_a", 3);
        rows[1].sequence = i64::MAX;
        let report = verify(&rows);
        assert!(!report.valid);
        assert_eq!(report.checked_receipts, 3, "every receipt is still checked");
    }

    /// Verifies `rows` in calls of at most `limit` receipts, each going on
    /// from the last one's continuation, as a client pages the endpoint.
    fn verify_paged(rows: &[ReceiptRow], limit: usize) -> Vec<VerifyReport> {
        let mut reports: Vec<VerifyReport> = Vec::new();
        for (i, page) in rows.chunks(limit).enumerate() {
            let mut v = match reports.last().and_then(|r| r.next.clone()) {
                Some(next) => ChainVerifier::starting_at(ChainStart {
                    writer: next.writer.unwrap(),
                    from_sequence: next.from_sequence.unwrap(),
                    prev_hash: next.prev_hash.unwrap(),
                }),
                None => ChainVerifier::new(),
            };
            page.iter().for_each(|r| v.push(r));
            let last = (i + 1) * limit >= rows.len();
            reports.push(v.finish_with(if last { Rest::Nothing } else { Rest::SameChain }, true));
        }
        reports
    }

    #[test]
    fn a_paged_walk_says_where_to_go_on() {
        let rows = chain("key_a", 5);
        let reports = verify_paged(&rows, 2);
        assert_eq!(reports.len(), 3);
        assert!(reports.iter().all(|r| r.valid), "{reports:?}");
        let next = reports[0].next.clone().unwrap();
        assert_eq!(next.writer.as_deref(), Some("key_a"));
        assert_eq!(next.from_writer, None);
        assert_eq!(next.from_sequence, Some(3));
        assert_eq!(next.prev_hash.as_deref(), Some(rows[1].content_hash.as_str()));
        assert_eq!(reports[0].chains[0].next, Some(next));
        assert!(!reports[0].complete && !reports[1].complete && reports[2].complete);
        assert_eq!(reports[2].next, None);
        assert_eq!(reports[2].chains[0].next, None);
        assert_eq!(reports.iter().map(|r| r.checked_receipts).sum::<u64>(), 5);
        assert_eq!(reports[2].chains[0].head_hash, rows[4].content_hash);
    }

    #[test]
    fn a_rehashed_edit_at_a_cut_breaks_the_next_calls_first_link() {
        let mut rows = chain("key_a", 6);
        let mut body: Value = serde_json::from_str(&rows[2].body).unwrap();
        body["createdAt"] = json!(1);
        body.as_object_mut().unwrap().remove("contentHash");
        let forged = hash::content_hash(&body);
        body["contentHash"] = json!(forged);
        rows[2].body = body.to_string();
        rows[2].content_hash = forged;
        rows[2].created_at = 1;
        let reports = verify_paged(&rows, 3);
        assert!(reports[0].valid, "the edited receipt is self-consistent: {reports:?}");
        let broken = reports[1].first_broken.clone().unwrap();
        assert_eq!(broken.sequence, 4, "the first link of the next call");
        assert!(broken.reason.contains("prevHash"), "{}", broken.reason);
    }

    #[test]
    fn a_start_checks_the_first_link_against_the_hash_given() {
        let rows = chain("key_a", 4);
        let start = |prev_hash: &str, from_sequence| ChainStart {
            writer: "key_a".into(),
            from_sequence,
            prev_hash: prev_hash.into(),
        };
        let verify_from = |start: ChainStart, rows: &[ReceiptRow]| {
            let mut v = ChainVerifier::starting_at(start);
            rows.iter().for_each(|r| v.push(r));
            v.finish()
        };
        let good = verify_from(start(&rows[1].content_hash, 3), &rows[2..]);
        assert!(good.valid, "{good:?}");
        assert_eq!(good.chains[0].length, 2);
        let wrong = verify_from(start(GENESIS_HASH, 3), &rows[2..]);
        assert_eq!(wrong.first_broken.unwrap().sequence, 3);
        // Receipt 3 deleted: the first link read is a gap.
        let gap = verify_from(start(&rows[1].content_hash, 3), &rows[3..]);
        assert!(gap.first_broken.unwrap().reason.contains("sequence gap"));
        // Another writer's chain starts at genesis, whatever the start.
        let mut other = chain("key_b", 2);
        other.extend(chain("key_c", 1));
        let mut v = ChainVerifier::starting_at(start(&rows[1].content_hash, 3));
        other.iter().for_each(|r| v.push(r));
        assert!(v.finish().valid);
    }

    #[test]
    fn a_walk_over_every_chain_goes_on_with_from_writer() {
        let rows = chain("key_a", 3);
        let mut v = ChainVerifier::new();
        rows[..2].iter().for_each(|r| v.push(r));
        let cut = v.finish_with(Rest::SameChain, false);
        let next = cut.next.unwrap();
        assert_eq!((next.writer, next.from_writer.as_deref()), (None, Some("key_a")));
        assert_eq!(next.from_sequence, Some(3));
        // The chain's own continuation names it as one chain.
        assert_eq!(cut.chains[0].next.clone().unwrap().writer.as_deref(), Some("key_a"));
        // Cut between chains: the next one from its start, no hash needed.
        let mut v = ChainVerifier::new();
        rows.iter().for_each(|r| v.push(r));
        let between = v.finish_with(Rest::NextChain("key_b".into()), false);
        assert!(!between.complete);
        assert_eq!(
            serde_json::to_value(&between.next).unwrap(),
            json!({"fromWriter": "key_b"}),
            "absent fields are left out, so `next` is the query as it is"
        );
        assert_eq!(between.chains[0].next, None, "key_a was checked to its end");
    }

    #[test]
    fn column_edit_is_found() {
        let mut rows = chain("key_a", 2);
        rows[0].outcome = "deny".into();
        let broken = verify(&rows).first_broken.unwrap();
        assert!(broken.reason.contains("`outcome`"), "{}", broken.reason);
    }
}
