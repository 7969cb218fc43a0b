//! The governance layer's domain: decision statuses and their transition
//! table, enforcement outcomes, the enforcement rules, receipt hashing and
//! chain verification, and the Merkle construction of proof trails.
//!
//! Nothing here does I/O: the HTTP handlers ([`crate::api::governance`],
//! [`crate::api::enforce`], [`crate::api::proofs`]) load objects through the
//! [`crate::store::governance::GovernanceStore`] seam, call these pure
//! functions, and store what they return. The human-readable reference,
//! including the rule table that [`rules`] implements row by row, is
//! `docs/governance.md`.
//!
//! - [`rules`]: one enforcement call → every check with its detail, and the
//!   most severe outcome.
//! - [`hash`]: canonical JSON and SHA-256 (receipt content hashes, payload
//!   hashes, proof item hashes).
//! - [`chain`]: walks stored receipts and reports the first broken link.
//! - [`merkle`]: RFC 6962 Merkle tree hash over proof items.
//! - [`proof`]: assembles proof-trail items and recomputes their root.

pub mod chain;
pub mod hash;
pub mod merkle;
pub mod proof;
pub mod rules;

use std::fmt;

use opgraph_proto::{Event, JsonObject, Party};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

/// Where a DecisionObject is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum DecisionStatus {
    Draft,
    PendingApproval,
    Approved,
    Rejected,
    Executed,
    Revoked,
    Expired,
}

impl DecisionStatus {
    pub const ALL: [DecisionStatus; 7] = [
        DecisionStatus::Draft,
        DecisionStatus::PendingApproval,
        DecisionStatus::Approved,
        DecisionStatus::Rejected,
        DecisionStatus::Executed,
        DecisionStatus::Revoked,
        DecisionStatus::Expired,
    ];

    /// Statuses a decision may be created in; the others are reached only by
    /// a transition.
    pub const INITIAL: [DecisionStatus; 3] =
        [DecisionStatus::Draft, DecisionStatus::PendingApproval, DecisionStatus::Approved];

    pub fn as_str(self) -> &'static str {
        match self {
            DecisionStatus::Draft => "draft",
            DecisionStatus::PendingApproval => "pending_approval",
            DecisionStatus::Approved => "approved",
            DecisionStatus::Rejected => "rejected",
            DecisionStatus::Executed => "executed",
            DecisionStatus::Revoked => "revoked",
            DecisionStatus::Expired => "expired",
        }
    }

    pub fn parse(text: &str) -> Option<DecisionStatus> {
        DecisionStatus::ALL.into_iter().find(|s| s.as_str() == text)
    }

    /// The transition table (docs/governance.md, "Decision statuses"): the
    /// statuses this one may move to by `PATCH`. Terminal statuses have none.
    pub fn next(self) -> &'static [DecisionStatus] {
        use DecisionStatus::*;
        match self {
            Draft => &[PendingApproval, Approved, Revoked, Expired],
            PendingApproval => &[Approved, Rejected, Draft, Revoked, Expired],
            Approved => &[Executed, Revoked, Expired],
            Rejected | Executed | Revoked | Expired => &[],
        }
    }

    pub fn can_move_to(self, to: DecisionStatus) -> bool {
        self.next().contains(&to)
    }
}

impl fmt::Display for DecisionStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How much harm a decision can do; informational for enforcement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RiskLevel {
    Low,
    Medium,
    High,
    Critical,
}

/// The result of one enforcement call, or what one check demands.
///
/// Declared from least to most severe, so `Ord` is severity: the outcome of
/// a call is the maximum over its checks.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Allow,
    Escrow,
    NeedsHumanApproval,
    Deny,
}

impl Outcome {
    pub const ALL: [Outcome; 4] =
        [Outcome::Allow, Outcome::Escrow, Outcome::NeedsHumanApproval, Outcome::Deny];

    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Allow => "allow",
            Outcome::Escrow => "escrow",
            Outcome::NeedsHumanApproval => "needs_human_approval",
            Outcome::Deny => "deny",
        }
    }

    pub fn parse(text: &str) -> Option<Outcome> {
        Outcome::ALL.into_iter().find(|o| o.as_str() == text)
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Largest amount accepted anywhere in governance (enforce bodies, grant
/// limits, escrow lines): larger values are a 400, not a comparison.
pub const MAX_AMOUNT: f64 = 1e15;

/// Event names beginning with this are the governance layer's own records
/// (receipts, status changes); they never count as a triggering event.
pub const EVENT_PREFIX: &str = "governance.";

/// An event the governance layer records about itself, attributed to the
/// credential that caused it.
pub fn governance_event(
    name: &str,
    subject: &str,
    object: Option<(&str, &str)>,
    trace_id: Option<&str>,
    decision_id: Option<&str>,
    properties: JsonObject,
    at_ms: i64,
) -> Event {
    let mut event = Event::named(format!("{EVENT_PREFIX}{name}"));
    event.business_id = Some("default".to_owned());
    event.actor = Some(Party::Ref {
        kind: "principal".to_owned(),
        id: subject.to_owned(),
        extra: JsonObject::new(),
    });
    event.object = object.map(|(kind, id)| Party::Ref {
        kind: kind.to_owned(),
        id: id.to_owned(),
        extra: JsonObject::new(),
    });
    event.trace_id = trace_id.map(str::to_owned);
    event.decision_id = decision_id.map(str::to_owned);
    event.properties = Some(properties);
    event.trust_tier = Some(opgraph_proto::TrustTier::T3);
    event.timestamp = Some(at_ms);
    event
}

/// Builds a JSON object from pairs, skipping `null`s.
pub fn object_of(pairs: impl IntoIterator<Item = (&'static str, Value)>) -> JsonObject {
    pairs.into_iter().filter(|(_, v)| !v.is_null()).map(|(k, v)| (k.to_owned(), v)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn severity_order_is_deny_first() {
        let mut all = Outcome::ALL.to_vec();
        all.sort();
        assert_eq!(all.last(), Some(&Outcome::Deny));
        assert!(Outcome::Deny > Outcome::NeedsHumanApproval);
        assert!(Outcome::NeedsHumanApproval > Outcome::Escrow);
        assert!(Outcome::Escrow > Outcome::Allow);
    }

    #[test]
    fn transition_table_matches_docs() {
        use DecisionStatus::*;
        assert!(Draft.can_move_to(PendingApproval));
        assert!(PendingApproval.can_move_to(Approved));
        assert!(Approved.can_move_to(Executed));
        assert!(!Approved.can_move_to(Draft));
        assert!(!Executed.can_move_to(Approved));
        for terminal in [Rejected, Executed, Revoked, Expired] {
            assert!(terminal.next().is_empty(), "{terminal} is terminal");
        }
        for status in DecisionStatus::ALL {
            assert!(!status.can_move_to(status), "{status} to itself");
            assert_eq!(DecisionStatus::parse(status.as_str()), Some(status));
        }
    }

    #[test]
    fn statuses_serialize_as_documented() {
        assert_eq!(
            serde_json::to_value(DecisionStatus::PendingApproval).unwrap(),
            "pending_approval"
        );
        assert_eq!(
            serde_json::to_value(Outcome::NeedsHumanApproval).unwrap(),
            "needs_human_approval"
        );
    }
}
