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
    pub length: u64,
    /// `contentHash` of the last receipt.
    pub head_hash: String,
    pub valid: bool,
    pub first_broken: Option<BrokenLink>,
}

#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct VerifyReport {
    pub valid: bool,
    pub checked_receipts: u64,
    pub chains: Vec<ChainReport>,
    /// The first broken link in chain order, if any.
    pub first_broken: Option<BrokenLink>,
}

#[derive(Debug, Default)]
pub struct ChainVerifier {
    chains: Vec<ChainReport>,
    /// Sequence and stored content hash of the previous receipt of the
    /// current chain.
    previous: Option<(i64, String)>,
    checked: u64,
}

impl ChainVerifier {
    pub fn new() -> Self {
        Self::default()
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
            });
            self.previous = None;
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

    pub fn finish(self) -> VerifyReport {
        let first_broken = self.chains.iter().find_map(|c| c.first_broken.clone());
        VerifyReport {
            valid: first_broken.is_none(),
            checked_receipts: self.checked,
            chains: self.chains,
            first_broken,
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

    #[test]
    fn column_edit_is_found() {
        let mut rows = chain("key_a", 2);
        rows[0].outcome = "deny".into();
        let broken = verify(&rows).first_broken.unwrap();
        assert!(broken.reason.contains("`outcome`"), "{}", broken.reason);
    }
}
