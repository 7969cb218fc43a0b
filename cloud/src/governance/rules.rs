//! The enforcement rules: pure functions from the loaded objects of one
//! `POST /api/governance/enforce` call to its checks and outcome.
//!
//! Every check is evaluated and reported, passed or not, with a detail
//! sentence; the outcome is the most severe outcome any failed check
//! demands (deny > needs_human_approval > escrow > allow). A check that
//! cannot be evaluated because the object it reads is missing fails as
//! `deny` ("not evaluated: ..."): enforcement fails closed. The table in
//! `docs/governance.md` lists every rule (check, condition, outcome, detail);
//! the tests below walk it row by row.

use opgraph_proto::TrustTier;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{DecisionStatus, Outcome};
use crate::store::governance::{AuthorityGrant, ContextContract, Decision};

/// The names of the checks, in the order they are reported.
pub const CHECKS: [&str; 16] = [
    "api_access",
    "decision_object",
    "decision_status",
    "authority_grant",
    "grant_validity",
    "grant_grantee",
    "grant_action",
    "grant_amount",
    "grant_currency",
    "approval_threshold",
    "context_contract",
    "contract_validity",
    "contract_action",
    "trust_tier",
    "compliance",
    "attestation",
];

/// The last check, reported after [`CHECKS`].
pub const ESCROW_CHECK: &str = "escrow_threshold";

/// One check's verdict.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Check {
    /// Stable snake_case name, e.g. `grant_amount`.
    pub check: String,
    pub passed: bool,
    /// What this check alone demands: `allow` when it passed.
    pub outcome: Outcome,
    /// Why, in a sentence for a human.
    pub detail: String,
}

/// What was proposed.
#[derive(Debug, Clone, Default)]
pub struct Proposal {
    pub action: String,
    /// Validated: finite, 0 ..= [`super::MAX_AMOUNT`].
    pub amount: Option<f64>,
    /// Validated: three upper-case letters (ISO 4217 form).
    pub currency: Option<String>,
    /// Who proposes to act, when the caller says (`proposedAction.actor`).
    pub actor: Option<String>,
}

/// The event whose trust tier the contract's `requiredTrustTier` is held
/// against.
#[derive(Debug, Clone, PartialEq)]
pub enum Trigger {
    /// Neither `eventId` nor `traceId` was given.
    NotNamed,
    /// `eventId` names no event of this workspace.
    EventMissing(String),
    /// `eventId` names one of the governance layer's own records (a
    /// receipt's or a status change's event, written at T3).
    OwnRecord(String),
    /// `traceId` has no (non-governance) events.
    TraceEmpty(String),
    Found {
        event_id: String,
        tier: TrustTier,
    },
}

/// Everything one enforcement call is judged on.
#[derive(Debug, Clone)]
pub struct Inputs<'a> {
    pub now_ms: i64,
    /// The credential's subject; it passed the `govern` scope check.
    pub subject: &'a str,
    pub decision_id: &'a str,
    pub decision: Option<&'a Decision>,
    pub grant_id: &'a str,
    pub grant: Option<&'a AuthorityGrant>,
    pub contract_id: &'a str,
    pub contract: Option<&'a ContextContract>,
    pub proposal: &'a Proposal,
    pub trigger: &'a Trigger,
    /// Providers of the attestations sent.
    pub attested_providers: &'a [String],
    /// Frameworks present in the compliance mapping (body and triggering
    /// event).
    pub compliance_frameworks: &'a [String],
}

#[derive(Debug, Clone, PartialEq)]
pub struct Evaluation {
    pub outcome: Outcome,
    pub checks: Vec<Check>,
}

fn pass(check: &str, detail: String) -> Check {
    Check { check: check.to_owned(), passed: true, outcome: Outcome::Allow, detail }
}

fn fail(check: &str, outcome: Outcome, detail: String) -> Check {
    Check { check: check.to_owned(), passed: false, outcome, detail }
}

/// Evaluates every check; see the module documentation.
pub fn evaluate(inputs: &Inputs<'_>) -> Evaluation {
    let mut checks = Vec::with_capacity(CHECKS.len() + 1);
    checks.push(pass(
        "api_access",
        format!("credential {} holds the `govern` scope in this workspace", inputs.subject),
    ));
    decision_checks(inputs, &mut checks);
    grant_checks(inputs, &mut checks);
    contract_checks(inputs, &mut checks);
    let outcome = checks.iter().map(|c| c.outcome).max().unwrap_or(Outcome::Allow);
    Evaluation { outcome, checks }
}

fn decision_checks(inputs: &Inputs<'_>, checks: &mut Vec<Check>) {
    let id = inputs.decision_id;
    let Some(decision) = inputs.decision else {
        checks.push(fail(
            "decision_object",
            Outcome::Deny,
            format!("decision {id} not found in this workspace"),
        ));
        checks.push(fail(
            "decision_status",
            Outcome::Deny,
            format!("not evaluated: decision {id} not found"),
        ));
        return;
    };
    checks.push(pass(
        "decision_object",
        format!("decision {id} found (risk {})", serde_plain(&decision.risk_level)),
    ));
    let live = DecisionStatus::INITIAL.contains(&decision.status);
    let status = match decision.status {
        _ if live && decision.expires_at.is_some_and(|at| at <= inputs.now_ms) => fail(
            "decision_status",
            Outcome::Deny,
            format!("decision expired at {}", decision.expires_at.unwrap_or_default()),
        ),
        DecisionStatus::Approved => pass("decision_status", "decision is approved".to_owned()),
        DecisionStatus::Draft => fail(
            "decision_status",
            Outcome::NeedsHumanApproval,
            "decision is draft: it needs approval before it can be executed".to_owned(),
        ),
        DecisionStatus::PendingApproval => fail(
            "decision_status",
            Outcome::NeedsHumanApproval,
            "decision is pending_approval: it awaits a human approval".to_owned(),
        ),
        other => fail(
            "decision_status",
            Outcome::Deny,
            format!("decision is {other}: no action may be taken under it"),
        ),
    };
    checks.push(status);
}

fn grant_checks(inputs: &Inputs<'_>, checks: &mut Vec<Check>) {
    let id = inputs.grant_id;
    let Some(grant) = inputs.grant else {
        checks.push(fail(
            "authority_grant",
            Outcome::Deny,
            format!("grant {id} not found in this workspace"),
        ));
        for check in &CHECKS[4..10] {
            checks.push(fail(check, Outcome::Deny, format!("not evaluated: grant {id} not found")));
        }
        return;
    };
    let p = inputs.proposal;
    checks.push(pass("authority_grant", format!("grant {id} found (grantee {})", grant.grantee)));

    let now = inputs.now_ms;
    checks.push(if grant.revoked {
        let when = grant.revoked_at.map(|t| format!(" at {t}")).unwrap_or_default();
        fail("grant_validity", Outcome::Deny, format!("grant was revoked{when}"))
    } else if let Some(from) = grant.valid_from.filter(|from| now < *from) {
        fail("grant_validity", Outcome::Deny, format!("grant is not valid before {from}"))
    } else if let Some(until) = grant.valid_until.filter(|until| now >= *until) {
        fail("grant_validity", Outcome::Deny, format!("grant expired at {until}"))
    } else {
        pass("grant_validity", "grant is valid now and not revoked".to_owned())
    });

    checks.push(match &p.actor {
        Some(actor) if *actor != grant.grantee => fail(
            "grant_grantee",
            Outcome::Deny,
            format!("action is proposed by {actor}, but the grant is for {}", grant.grantee),
        ),
        Some(actor) => pass("grant_grantee", format!("grant is for {actor}")),
        None => pass(
            "grant_grantee",
            format!("no proposedAction.actor named; the grant is for {}", grant.grantee),
        ),
    });

    checks.push(if grant.actions.contains(&p.action) {
        pass("grant_action", format!("grant covers action {}", p.action))
    } else {
        fail(
            "grant_action",
            Outcome::Deny,
            format!("action {} is not among the grant's actions {:?}", p.action, grant.actions),
        )
    });

    checks.push(match (p.amount, grant.max_amount) {
        (Some(amount), Some(max)) if amount > max => fail(
            "grant_amount",
            Outcome::Deny,
            format!("amount {amount} exceeds the grant's maxAmount {max}"),
        ),
        (Some(amount), Some(max)) => {
            pass("grant_amount", format!("amount {amount} within the grant's maxAmount {max}"))
        }
        (None, _) => pass("grant_amount", "no amount proposed".to_owned()),
        (Some(_), None) => pass("grant_amount", "the grant sets no maxAmount".to_owned()),
    });

    checks.push(match (&p.currency, &grant.currency) {
        (Some(currency), Some(granted)) if currency != granted => fail(
            "grant_currency",
            Outcome::Deny,
            format!("currency {currency} does not match the grant's currency {granted}"),
        ),
        (Some(currency), Some(_)) => {
            pass("grant_currency", format!("currency {currency} matches the grant"))
        }
        (None, _) => pass("grant_currency", "no currency proposed".to_owned()),
        (Some(_), None) => pass("grant_currency", "the grant sets no currency".to_owned()),
    });

    checks.push(match (p.amount, grant.approval_threshold) {
        (Some(amount), Some(threshold)) if amount > threshold => fail(
            "approval_threshold",
            Outcome::NeedsHumanApproval,
            format!("amount {amount} exceeds the approval threshold {threshold}"),
        ),
        (Some(amount), Some(threshold)) => pass(
            "approval_threshold",
            format!("amount {amount} within the approval threshold {threshold}"),
        ),
        (None, _) => pass("approval_threshold", "no amount proposed".to_owned()),
        (Some(_), None) => {
            pass("approval_threshold", "the grant sets no approval threshold".to_owned())
        }
    });
}

fn contract_checks(inputs: &Inputs<'_>, checks: &mut Vec<Check>) {
    let id = inputs.contract_id;
    let Some(contract) = inputs.contract else {
        checks.push(fail(
            "context_contract",
            Outcome::Deny,
            format!("contract {id} not found in this workspace"),
        ));
        for check in CHECKS[11..].iter().chain([&ESCROW_CHECK]) {
            checks.push(fail(
                check,
                Outcome::Deny,
                format!("not evaluated: contract {id} not found"),
            ));
        }
        return;
    };
    let p = inputs.proposal;
    checks.push(pass("context_contract", format!("contract {id} found")));

    checks.push(match contract.valid_until {
        Some(until) if inputs.now_ms >= until => {
            fail("contract_validity", Outcome::Deny, format!("contract expired at {until}"))
        }
        _ => pass("contract_validity", "contract is in force".to_owned()),
    });

    checks.push(if contract.allowed_actions.contains(&p.action) {
        pass("contract_action", format!("contract allows action {}", p.action))
    } else {
        fail(
            "contract_action",
            Outcome::Deny,
            format!(
                "action {} is not allowed by the contract (allowed: {:?})",
                p.action, contract.allowed_actions
            ),
        )
    });

    checks.push(trust_tier_check(inputs.trigger, contract.required_trust_tier));

    let missing: Vec<&str> = contract
        .required_compliance
        .iter()
        .filter(|required| {
            !inputs.compliance_frameworks.iter().any(|have| have.eq_ignore_ascii_case(required))
        })
        .map(String::as_str)
        .collect();
    checks.push(if missing.is_empty() {
        pass(
            "compliance",
            if contract.required_compliance.is_empty() {
                "the contract requires no compliance framework".to_owned()
            } else {
                format!("compliance mapping covers {:?}", contract.required_compliance)
            },
        )
    } else {
        fail(
            "compliance",
            Outcome::Deny,
            format!("required compliance framework absent: {}", missing.join(", ")),
        )
    });

    let missing: Vec<&str> = contract
        .required_attestation_providers
        .iter()
        .filter(|required| {
            !inputs.attested_providers.iter().any(|have| have.eq_ignore_ascii_case(required))
        })
        .map(String::as_str)
        .collect();
    checks.push(if missing.is_empty() {
        pass(
            "attestation",
            if contract.required_attestation_providers.is_empty() {
                "the contract requires no attestation".to_owned()
            } else {
                format!("attested by {:?}", contract.required_attestation_providers)
            },
        )
    } else {
        fail(
            "attestation",
            Outcome::Escrow,
            format!("required attestation missing from provider: {}", missing.join(", ")),
        )
    });

    checks.push(match (p.amount, contract.escrow_above) {
        (Some(amount), Some(line)) if amount > line => fail(
            ESCROW_CHECK,
            Outcome::Escrow,
            format!("amount {amount} is above the contract's escrow line {line}"),
        ),
        (Some(amount), Some(line)) => {
            pass(ESCROW_CHECK, format!("amount {amount} within the escrow line {line}"))
        }
        (None, _) => pass(ESCROW_CHECK, "no amount proposed".to_owned()),
        (Some(_), None) => pass(ESCROW_CHECK, "the contract sets no escrow line".to_owned()),
    });
}

fn trust_tier_check(trigger: &Trigger, required: Option<TrustTier>) -> Check {
    const CHECK: &str = "trust_tier";
    match trigger {
        Trigger::EventMissing(id) => {
            return fail(
                CHECK,
                Outcome::Deny,
                format!("triggering event {id} not found in this workspace"),
            );
        }
        Trigger::OwnRecord(id) => {
            return fail(
                CHECK,
                Outcome::Deny,
                format!("event {id} is the governance layer's own record, not a triggering event"),
            );
        }
        _ => {}
    }
    let Some(required) = required else {
        return pass(CHECK, "the contract requires no trust tier".to_owned());
    };
    match trigger {
        Trigger::Found { event_id, tier } if *tier >= required => pass(
            CHECK,
            format!("triggering event {event_id} has trust tier {tier}, required {required}"),
        ),
        Trigger::Found { event_id, tier } => fail(
            CHECK,
            Outcome::NeedsHumanApproval,
            format!(
                "triggering event {event_id} has trust tier {tier}, below the required {required}"
            ),
        ),
        Trigger::TraceEmpty(trace) => fail(
            CHECK,
            Outcome::NeedsHumanApproval,
            format!("no triggering event: trace {trace} has no events; required {required}"),
        ),
        Trigger::NotNamed | Trigger::EventMissing(_) | Trigger::OwnRecord(_) => fail(
            CHECK,
            Outcome::NeedsHumanApproval,
            format!("no triggering event: name a traceId or eventId; required {required}"),
        ),
    }
}

fn serde_plain<T: Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(s)) => s,
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests;
