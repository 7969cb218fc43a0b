//! The governance part of the [`Store`](super::Store) seam: decision
//! objects, authority grants, context contracts, tracking plans,
//! enforcement receipts (an append-only hash chain), proof trails and
//! export receipts.
//!
//! Every call is scoped to a workspace: an object of another workspace is
//! simply not found. Writes that record events (status changes, receipts)
//! store the object and its events in one transaction: both or neither.
//! The domain rules (which transitions are allowed, how a receipt is
//! hashed) live in [`crate::governance`]; the store only keeps what it is
//! given, with two guarantees the domain cannot give itself: a decision is
//! replaced only if its status is still the one the caller read
//! (compare-and-set), and receipts of one writer are chained in one
//! serialized order.

use async_trait::async_trait;
use opgraph_proto::TrustTier;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use super::NewEvent;
use crate::error::{Error, Result};
use crate::governance::hash::GENESIS_HASH;
use crate::governance::rules::Check;
use crate::governance::{DecisionStatus, Outcome, RiskLevel};

/// A governance object as the text both backends store it in.
pub(crate) fn to_json<T: Serialize>(value: &T) -> Result<String> {
    serde_json::to_string(value).map_err(Error::internal)
}

/// A stored governance object back; the store wrote it, so a failure is
/// internal.
pub(crate) fn from_json<T: DeserializeOwned>(text: &str) -> Result<T> {
    serde_json::from_str(text).map_err(Error::internal)
}

/// A governance record of a decision.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Decision {
    /// `dec_...`
    pub id: String,
    pub title: String,
    pub status: DecisionStatus,
    pub risk_level: RiskLevel,
    pub description: Option<String>,
    pub owner: Option<String>,
    pub trace_id: Option<String>,
    /// After this time (ms) an approved decision counts as expired.
    pub expires_at: Option<i64>,
    pub created_at: i64,
    pub updated_at: i64,
    /// The credential that created it (`key_...` or `jwt:<sub>`).
    pub created_by: String,
}

/// Authority granted to a grantee to take some actions, within limits.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AuthorityGrant {
    /// `grt_...`
    pub id: String,
    /// Who holds the authority (an agent, robot, user or service id).
    pub grantee: String,
    pub actions: Vec<String>,
    pub max_amount: Option<f64>,
    /// ISO 4217 code that amounts must be in.
    pub currency: Option<String>,
    /// Amounts above this need a human approval.
    pub approval_threshold: Option<f64>,
    pub valid_from: Option<i64>,
    pub valid_until: Option<i64>,
    pub revoked: bool,
    pub revoked_at: Option<i64>,
    pub description: Option<String>,
    pub created_at: i64,
    pub created_by: String,
}

/// The context an action must be taken in.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ContextContract {
    /// `ctc_...`
    pub id: String,
    pub name: Option<String>,
    pub allowed_actions: Vec<String>,
    /// `T0` .. `T4`: the least trust tier of the triggering event.
    #[schema(value_type = Option<String>)]
    pub required_trust_tier: Option<TrustTier>,
    pub required_attestation_providers: Vec<String>,
    pub required_compliance: Vec<String>,
    /// Amounts above this are held in escrow.
    pub escrow_above: Option<f64>,
    pub valid_until: Option<i64>,
    pub created_at: i64,
    pub created_by: String,
}

/// A persisted plan for agent instrumentation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TrackingPlan {
    /// `plan_...`
    pub id: String,
    pub name: String,
    pub vertical: String,
    pub description: Option<String>,
    /// Event names, or objects `{event, description?, properties?, ...}`.
    #[schema(value_type = Vec<Object>)]
    pub events: Vec<Value>,
    pub created_at: i64,
    pub created_by: String,
}

/// The record of one enforcement call. Immutable once stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Receipt {
    /// `rcp_...`
    pub id: String,
    pub workspace_id: String,
    /// The credential that called enforce; each writer has its own chain.
    pub writer: String,
    /// Position in the writer's chain, from 1.
    pub sequence: u64,
    /// `contentHash` of the writer's previous receipt; 64 zeros for the
    /// first.
    pub prev_hash: String,
    pub created_at: i64,
    pub outcome: Outcome,
    pub decision_object_id: String,
    pub authority_grant_id: String,
    pub context_contract_id: String,
    pub trace_id: Option<String>,
    pub event_id: Option<String>,
    /// `{action, amount?, currency?, actor?, ...}` as sent.
    #[schema(value_type = Object)]
    pub proposed_action: Value,
    #[schema(value_type = Vec<Object>)]
    pub attestations: Vec<Value>,
    pub compliance_frameworks: Vec<String>,
    /// `{eventId, trustTier}` of the event the trust tier was taken from.
    #[schema(value_type = Option<Object>)]
    pub trigger: Option<Value>,
    pub checks: Vec<Check>,
    /// SHA-256 of the canonical JSON of this object without `contentHash`.
    pub content_hash: String,
}

/// A receipt as stored: its index columns and its JSON body, exactly as
/// written (so that verification sees tampering instead of hiding it).
#[derive(Debug, Clone, PartialEq)]
pub struct ReceiptRow {
    pub id: String,
    pub writer: String,
    pub sequence: i64,
    pub prev_hash: String,
    pub content_hash: String,
    pub created_at: i64,
    pub outcome: String,
    pub trace_id: Option<String>,
    pub decision_id: Option<String>,
    pub body: String,
}

/// Where the next receipt of a writer goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainHead {
    /// The new receipt's `sequence`.
    pub sequence: u64,
    /// The new receipt's `prevHash`.
    pub prev_hash: String,
}

impl ChainHead {
    /// Where the receipt after `last` (the writer's last `sequence` and
    /// `contentHash`) goes; the genesis position when the chain is empty.
    pub fn after(last: Option<(i64, String)>) -> ChainHead {
        match last {
            Some((sequence, hash)) => {
                ChainHead { sequence: u64::try_from(sequence).unwrap_or(0) + 1, prev_hash: hash }
            }
            None => ChainHead { sequence: 1, prev_hash: GENESIS_HASH.to_owned() },
        }
    }

    /// Refuses a receipt that was not sealed at this head of `writer`'s
    /// chain: storing it would fork or break the chain.
    pub fn check_sealed(&self, receipt: &Receipt, writer: &str) -> Result<()> {
        if receipt.sequence != self.sequence
            || receipt.prev_hash != self.prev_hash
            || receipt.writer != writer
        {
            return Err(Error::internal("a sealed receipt must take its writer's chain head"));
        }
        Ok(())
    }
}

/// Judges one enforcement call on the objects as they are in the write
/// transaction and returns the sealed receipt (hash included, at the given
/// chain position) with the events to store beside it.
pub type DecideReceipt =
    Box<dyn FnOnce(EnforcementInputs, &ChainHead) -> Result<(Receipt, Vec<NewEvent>)> + Send>;

/// Filters of `GET /api/governance/receipts`.
#[derive(Debug, Clone, Default)]
pub struct ReceiptFilter {
    pub limit: usize,
    pub trace_id: Option<String>,
    pub decision_id: Option<String>,
    pub outcome: Option<Outcome>,
    pub from: Option<i64>,
    pub to: Option<i64>,
}

/// Where a page of receipts in chain order (writer, then sequence) starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChainFrom {
    /// At the first receipt of this writer's chain, whatever its sequence
    /// (a hand-written row with sequence 0 is read, and reported). The
    /// empty writer is the start of every chain.
    Chain(String),
    /// Just after this position (writer, sequence), exclusive.
    After(String, i64),
}

/// One page of [`GovernanceStore::receipt_chain_page`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainPage {
    pub from: ChainFrom,
    /// Only the chain `from` names; otherwise it and every later one.
    pub one_chain: bool,
    pub limit: usize,
}

/// What an enforcement call names, loaded in one read.
#[derive(Debug, Clone, Default)]
pub struct EnforcementRefs {
    pub decision_id: String,
    pub grant_id: String,
    pub contract_id: String,
    /// When set, the triggering event is this one.
    pub event_id: Option<String>,
    /// Otherwise, the most recent event of this trace whose name does not
    /// start with `governance.`.
    pub trace_id: Option<String>,
}

/// A triggering event, reduced to what enforcement reads.
#[derive(Debug, Clone, PartialEq)]
pub struct TriggerEvent {
    pub id: String,
    pub trust_tier: TrustTier,
    /// Keys of the event's `complianceMapping`.
    pub compliance_frameworks: Vec<String>,
    /// One of the governance layer's own records (named by `eventId`; a
    /// trace's lookup leaves them out), which never triggers anything.
    pub own: bool,
}

impl TriggerEvent {
    /// From a stored event's id, `trust_tier` column and JSON envelope.
    pub fn from_stored(id: String, trust_tier: &str, envelope: &str) -> Result<TriggerEvent> {
        let envelope: Value = serde_json::from_str(envelope).map_err(Error::internal)?;
        let compliance_frameworks = envelope
            .get("complianceMapping")
            .and_then(Value::as_object)
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default();
        let own = envelope
            .get("event")
            .and_then(Value::as_str)
            .is_some_and(|name| name.starts_with(crate::governance::EVENT_PREFIX));
        Ok(TriggerEvent {
            id,
            trust_tier: trust_tier.parse().unwrap_or_default(),
            compliance_frameworks,
            own,
        })
    }
}

#[derive(Debug, Clone, Default)]
pub struct EnforcementInputs {
    pub decision: Option<Decision>,
    pub grant: Option<AuthorityGrant>,
    pub contract: Option<ContextContract>,
    /// `None` when neither reference was given or nothing matched.
    pub trigger: Option<TriggerEvent>,
}

/// One item of a proof trail.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ProofItem {
    /// `receipt`, `decision`, `authority_grant`, `context_contract`,
    /// `event` or `evidence`.
    #[serde(rename = "type")]
    pub kind: String,
    pub id: String,
    /// SHA-256 of the canonical JSON of `{"type", "id", "body"}`: the leaf
    /// data of the Merkle tree.
    pub hash: String,
    #[schema(value_type = Object)]
    pub body: Value,
}

/// A proof-ready evidence packet.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProofTrail {
    /// `prf_...`
    pub id: String,
    pub title: String,
    /// RFC 6962 Merkle root over the items' hashes, in item order.
    pub root_hash: String,
    pub item_count: usize,
    pub items: Vec<ProofItem>,
    pub receipt_ids: Vec<String>,
    pub decision_ids: Vec<String>,
    pub trace_id: Option<String>,
    pub created_at: i64,
    pub created_by: String,
}

/// A proof trail in a listing: without its items.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProofTrailSummary {
    pub id: String,
    pub title: String,
    pub root_hash: String,
    pub item_count: usize,
    pub created_at: i64,
}

/// The record of one external push, failed or not.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExportReceipt {
    /// `exp_...`
    pub id: String,
    /// Where it was sent: scheme, host, port and path (never a query or
    /// credentials).
    pub destination: String,
    /// `succeeded` or `failed`.
    pub status: String,
    /// Sent as `X-Opgraph-Request-Id`.
    pub request_id: String,
    /// HTTP status of the answer; absent when none came.
    pub response_status: Option<u16>,
    /// The id the destination gave the payload, when it said.
    pub external_id: Option<String>,
    pub error: Option<String>,
    /// SHA-256 of the exact bytes sent.
    pub payload_hash: String,
    pub record_count: u64,
    pub created_at: i64,
    /// The proof trail pushed.
    pub proof_trail_id: Option<String>,
}

#[async_trait]
pub trait GovernanceStore: Send + Sync {
    /// Stores a new decision and its events.
    async fn insert_decision(
        &self,
        ws: &str,
        decision: &Decision,
        events: Vec<NewEvent>,
    ) -> Result<()>;
    async fn get_decision(&self, ws: &str, id: &str) -> Result<Option<Decision>>;
    /// Newest first; `status` filters when set.
    async fn list_decisions(
        &self,
        ws: &str,
        status: Option<DecisionStatus>,
        limit: usize,
    ) -> Result<Vec<Decision>>;
    /// Replaces the decision with `decision` if its stored status is still
    /// `expected`, and stores `events` with it. `false` (nothing written)
    /// when the status changed meanwhile or the decision is gone.
    async fn update_decision(
        &self,
        ws: &str,
        expected: DecisionStatus,
        decision: &Decision,
        events: Vec<NewEvent>,
    ) -> Result<bool>;

    async fn insert_grant(&self, ws: &str, grant: &AuthorityGrant) -> Result<()>;
    async fn get_grant(&self, ws: &str, id: &str) -> Result<Option<AuthorityGrant>>;
    async fn list_grants(&self, ws: &str, limit: usize) -> Result<Vec<AuthorityGrant>>;
    /// Marks the grant revoked (once: a revoked grant stays as it is) and
    /// stores `events` when it changed. `None` when it does not exist.
    async fn revoke_grant(
        &self,
        ws: &str,
        id: &str,
        at_ms: i64,
        events: Vec<NewEvent>,
    ) -> Result<Option<AuthorityGrant>>;

    async fn insert_contract(&self, ws: &str, contract: &ContextContract) -> Result<()>;
    async fn get_contract(&self, ws: &str, id: &str) -> Result<Option<ContextContract>>;
    async fn list_contracts(&self, ws: &str, limit: usize) -> Result<Vec<ContextContract>>;

    async fn insert_tracking_plan(&self, ws: &str, plan: &TrackingPlan) -> Result<()>;
    async fn get_tracking_plan(&self, ws: &str, id: &str) -> Result<Option<TrackingPlan>>;
    async fn list_tracking_plans(&self, ws: &str, limit: usize) -> Result<Vec<TrackingPlan>>;

    /// Records one enforcement call, in one serialized write: loads what
    /// `refs` names (decision, grant, contract, triggering event) and the
    /// head of the chain of (`ws`, `writer`), lets `decide` judge and seal,
    /// and inserts the receipt and its events. Judging on the state inside
    /// the write transaction linearizes enforcement with every status
    /// change and revocation, and concurrent calls never fork the chain.
    async fn record_enforcement(
        &self,
        ws: &str,
        writer: &str,
        refs: &EnforcementRefs,
        decide: DecideReceipt,
    ) -> Result<Receipt>;
    /// Newest first.
    async fn list_receipts(&self, ws: &str, filter: &ReceiptFilter) -> Result<Vec<ReceiptRow>>;
    /// The receipts with these ids that exist in `ws`, in no order.
    async fn get_receipts(&self, ws: &str, ids: &[String]) -> Result<Vec<ReceiptRow>>;
    /// Receipts in chain order (writer, then sequence) from `page.from`,
    /// of that one chain or of it and the later ones, at most
    /// `page.limit` rows: every stored copy of a position that differs in
    /// anything (a store that cannot refuse a second row for an id shows
    /// such an edit), and all of the last position's copies even past the
    /// limit, so that the next page can start after it. A page shorter
    /// than the limit is the last.
    async fn receipt_chain_page(&self, ws: &str, page: &ChainPage) -> Result<Vec<ReceiptRow>>;

    async fn insert_proof_trail(&self, ws: &str, trail: &ProofTrail) -> Result<()>;
    async fn get_proof_trail(&self, ws: &str, id: &str) -> Result<Option<ProofTrail>>;
    async fn list_proof_trails(&self, ws: &str, limit: usize) -> Result<Vec<ProofTrailSummary>>;

    /// Stores a receipt; one with the same id (a keyed export tried
    /// again) is replaced by it.
    async fn insert_export_receipt(&self, ws: &str, receipt: &ExportReceipt) -> Result<()>;
    async fn get_export_receipt(&self, ws: &str, id: &str) -> Result<Option<ExportReceipt>>;
    /// Newest first; only those of one proof trail when given.
    async fn list_export_receipts(
        &self,
        ws: &str,
        proof_trail_id: Option<&str>,
        limit: usize,
    ) -> Result<Vec<ExportReceipt>>;
}
