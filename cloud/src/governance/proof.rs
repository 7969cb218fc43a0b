//! Proof-trail items and their Merkle root.
//!
//! Each item is `{type, id, hash, body}`; `hash` is the SHA-256 of the
//! canonical JSON of `{"type", "id", "body"}`. Items are ordered by type
//! (receipt, decision, authority_grant, context_contract, event, evidence)
//! and then by id; the root is the RFC 6962 Merkle tree hash ([`merkle`])
//! whose leaf data are the items' 32-byte hashes in that order.
//! Verification recomputes every item hash from its body, then the root.

use serde::Serialize;
use serde_json::{Value, json};
use utoipa::ToSchema;

use super::hash::{canonical_hash, is_hex_hash};
use super::merkle;
use crate::store::governance::{ProofItem, ProofTrail};

/// Item types, in packet order.
pub const KINDS: [&str; 6] =
    ["receipt", "decision", "authority_grant", "context_contract", "event", "evidence"];

/// Most events of the named traces put in one packet (the oldest are left
/// out first).
pub const MAX_EVENTS: usize = 1000;
/// Most evidence objects in one packet, and the size of each.
pub const MAX_EVIDENCE: usize = 100;
pub const MAX_EVIDENCE_BYTES: usize = 64 * 1024;

pub fn item_hash(kind: &str, id: &str, body: &Value) -> String {
    canonical_hash(&json!({"type": kind, "id": id, "body": body}))
}

pub fn item(kind: &str, id: &str, body: Value) -> ProofItem {
    ProofItem { kind: kind.to_owned(), id: id.to_owned(), hash: item_hash(kind, id, &body), body }
}

/// Id of the `index`th evidence object: zero-padded so ids sort in order.
pub fn evidence_id(index: usize) -> String {
    format!("evidence-{index:04}")
}

fn rank(kind: &str) -> usize {
    KINDS.iter().position(|k| *k == kind).unwrap_or(KINDS.len())
}

/// Puts items in packet order and drops repeats of the same (type, id).
pub fn order(mut items: Vec<ProofItem>) -> Vec<ProofItem> {
    items.sort_by(|a, b| rank(&a.kind).cmp(&rank(&b.kind)).then_with(|| a.id.cmp(&b.id)));
    items.dedup_by(|a, b| a.kind == b.kind && a.id == b.id);
    items
}

fn unhex(hash: &str) -> Option<[u8; 32]> {
    if !is_hex_hash(hash) {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hash.get(i * 2..i * 2 + 2)?, 16).ok()?;
    }
    Some(out)
}

/// The Merkle root (hex) over the given item hashes, in order. Malformed
/// hashes (which [`item_hash`] never makes) hash as 32 zero bytes, so a
/// forged value cannot make verification fail open.
pub fn root_hash<'a>(hashes: impl IntoIterator<Item = &'a str>) -> String {
    let leaves: Vec<[u8; 32]> = hashes.into_iter().map(|h| unhex(h).unwrap_or([0; 32])).collect();
    crate::ids::hex(&merkle::root(&leaves))
}

/// What `GET /api/proof-event-trails/{id}/verify` answers.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProofVerification {
    pub valid: bool,
    /// The root stored with the trail.
    pub root_hash: String,
    /// The root recomputed from the items' bodies.
    pub recomputed_hash: String,
    pub item_count: usize,
    /// `type/id` of items whose stored hash no longer matches their body.
    pub mismatched_items: Vec<String>,
}

pub fn verify(trail: &ProofTrail) -> ProofVerification {
    let recomputed: Vec<String> =
        trail.items.iter().map(|i| item_hash(&i.kind, &i.id, &i.body)).collect();
    let mismatched_items: Vec<String> = trail
        .items
        .iter()
        .zip(&recomputed)
        .filter(|(item, hash)| item.hash != **hash)
        .map(|(item, _)| format!("{}/{}", item.kind, item.id))
        .collect();
    let recomputed_hash = root_hash(recomputed.iter().map(String::as_str));
    ProofVerification {
        valid: recomputed_hash == trail.root_hash
            && mismatched_items.is_empty()
            && trail.item_count == trail.items.len(),
        root_hash: trail.root_hash.clone(),
        recomputed_hash,
        item_count: trail.items.len(),
        mismatched_items,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trail(items: Vec<ProofItem>) -> ProofTrail {
        let items = order(items);
        ProofTrail {
            id: "prf_1".into(),
            title: "t".into(),
            root_hash: root_hash(items.iter().map(|i| i.hash.as_str())),
            item_count: items.len(),
            items,
            receipt_ids: vec![],
            decision_ids: vec![],
            trace_id: None,
            created_at: 0,
            created_by: "key_1".into(),
        }
    }

    #[test]
    fn items_are_ordered_by_type_then_id() {
        let items = order(vec![
            item("event", "evt_2", json!({})),
            item("evidence", &evidence_id(0), json!({"a": 1})),
            item("receipt", "rcp_1", json!({})),
            item("event", "evt_1", json!({})),
            item("receipt", "rcp_1", json!({})),
        ]);
        let ids: Vec<&str> = items.iter().map(|i| i.id.as_str()).collect();
        assert_eq!(ids, ["rcp_1", "evt_1", "evt_2", "evidence-0000"]);
    }

    #[test]
    fn root_matches_merkle_over_item_hashes() {
        let t =
            trail(vec![item("receipt", "rcp_1", json!({"x": 1})), item("event", "e", json!(2))]);
        let leaves: Vec<[u8; 32]> = t.items.iter().map(|i| unhex(&i.hash).unwrap()).collect();
        assert_eq!(t.root_hash, crate::ids::hex(&merkle::root(&leaves)));
        assert!(verify(&t).valid);
    }

    #[test]
    fn a_changed_body_is_reported() {
        let mut t = trail(vec![item("receipt", "rcp_1", json!({"outcome": "deny"}))]);
        t.items[0].body = json!({"outcome": "allow"});
        let v = verify(&t);
        assert!(!v.valid);
        assert_ne!(v.root_hash, v.recomputed_hash);
        assert_eq!(v.mismatched_items, ["receipt/rcp_1"]);
    }

    #[test]
    fn a_changed_root_is_reported() {
        let mut t = trail(vec![item("decision", "dec_1", json!({}))]);
        t.root_hash = "00".repeat(32);
        assert!(!verify(&t).valid);
    }
}
