//! Walks the rule table of `docs/governance.md`: every row has a scenario
//! here, and the scenario yields the row's outcome on the row's check with
//! the row's detail text.

use super::*;
use crate::governance::RiskLevel;
use crate::store::governance::{AuthorityGrant, ContextContract, Decision};

const DOC: &str = include_str!("../../../../docs/governance.md");
const NOW: i64 = 1_800_000_000_000;

/// One row of the rule table.
#[derive(Debug)]
struct Row {
    rule: String,
    check: String,
    outcome: String,
    detail: String,
}

fn rule_table() -> Vec<Row> {
    let start = DOC.find("<!-- rule-table -->").expect("docs/governance.md has the rule table");
    DOC[start..]
        .lines()
        .skip(1)
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .skip(2)
        .map(|line| {
            let cells: Vec<String> = line
                .trim_matches('|')
                .split('|')
                .map(|c| c.trim().trim_matches('`').to_owned())
                .collect();
            assert_eq!(cells.len(), 5, "rule row with 5 cells: {line}");
            Row {
                rule: cells[0].clone(),
                check: cells[1].clone(),
                outcome: cells[3].clone(),
                detail: cells[4].clone(),
            }
        })
        .collect()
}

/// Objects and a proposal that pass every check.
struct World {
    decision: Option<Decision>,
    grant: Option<AuthorityGrant>,
    contract: Option<ContextContract>,
    proposal: Proposal,
    trigger: Trigger,
    attested: Vec<String>,
    frameworks: Vec<String>,
}

fn world() -> World {
    World {
        decision: Some(Decision {
            id: "dec_1".into(),
            title: "refund".into(),
            status: DecisionStatus::Approved,
            risk_level: RiskLevel::Medium,
            description: None,
            owner: None,
            trace_id: None,
            expires_at: Some(NOW + 1000),
            created_at: 0,
            updated_at: 0,
            created_by: "key_1".into(),
        }),
        grant: Some(AuthorityGrant {
            id: "grt_1".into(),
            grantee: "agent-7".into(),
            actions: vec!["refund".into()],
            max_amount: Some(500.0),
            currency: Some("EUR".into()),
            approval_threshold: Some(200.0),
            valid_from: Some(NOW - 1000),
            valid_until: Some(NOW + 1000),
            revoked: false,
            revoked_at: None,
            description: None,
            created_at: 0,
            created_by: "key_1".into(),
        }),
        contract: Some(ContextContract {
            id: "ctc_1".into(),
            name: None,
            allowed_actions: vec!["refund".into()],
            required_trust_tier: Some(TrustTier::T2),
            required_attestation_providers: vec!["notary".into()],
            required_compliance: vec!["SOC2".into()],
            escrow_above: Some(100.0),
            valid_until: Some(NOW + 1000),
            created_at: 0,
            created_by: "key_1".into(),
        }),
        proposal: Proposal {
            action: "refund".into(),
            amount: Some(50.0),
            currency: Some("EUR".into()),
            actor: Some("agent-7".into()),
        },
        trigger: Trigger::Found { event_id: "evt_1".into(), tier: TrustTier::T3 },
        attested: vec!["notary".into()],
        frameworks: vec!["soc2".into()],
    }
}

fn run(w: &World) -> Evaluation {
    evaluate(&Inputs {
        now_ms: NOW,
        subject: "key_1",
        decision_id: "dec_1",
        decision: w.decision.as_ref(),
        grant_id: "grt_1",
        grant: w.grant.as_ref(),
        contract_id: "ctc_1",
        contract: w.contract.as_ref(),
        proposal: &w.proposal,
        trigger: &w.trigger,
        attested_providers: &w.attested,
        compliance_frameworks: &w.frameworks,
    })
}

fn decision(w: &mut World) -> &mut Decision {
    w.decision.as_mut().unwrap()
}
fn grant(w: &mut World) -> &mut AuthorityGrant {
    w.grant.as_mut().unwrap()
}
fn contract(w: &mut World) -> &mut ContextContract {
    w.contract.as_mut().unwrap()
}

/// The scenario of each rule id of the table.
fn scenario(rule: &str) -> Option<World> {
    let mut w = world();
    match rule {
        "D1" => w.decision = None,
        "D2" => decision(&mut w).status = DecisionStatus::Draft,
        "D3" => decision(&mut w).status = DecisionStatus::PendingApproval,
        "D4" => decision(&mut w).status = DecisionStatus::Rejected,
        "D5" => decision(&mut w).status = DecisionStatus::Revoked,
        "D6" => decision(&mut w).status = DecisionStatus::Expired,
        "D7" => decision(&mut w).status = DecisionStatus::Executed,
        "D8" => {
            decision(&mut w).expires_at = Some(NOW);
            // Expiry wins over "awaiting approval".
            decision(&mut w).status = DecisionStatus::PendingApproval;
        }
        "G1" => w.grant = None,
        "G2" => grant(&mut w).revoked = true,
        "G3" => grant(&mut w).valid_from = Some(NOW + 1),
        "G4" => grant(&mut w).valid_until = Some(NOW),
        "G5" => w.proposal.actor = Some("agent-8".into()),
        "G6" => grant(&mut w).actions = vec!["payout".into()],
        "G7" => {
            w.proposal.amount = Some(500.01);
            contract(&mut w).escrow_above = None;
            grant(&mut w).approval_threshold = None;
        }
        "G8" => w.proposal.currency = Some("USD".into()),
        "G9" => {
            w.proposal.amount = Some(200.5);
            contract(&mut w).escrow_above = None;
        }
        "C1" => w.contract = None,
        "C2" => contract(&mut w).valid_until = Some(NOW),
        "C3" => contract(&mut w).allowed_actions = vec!["payout".into()],
        "T1" => w.trigger = Trigger::EventMissing("evt_gone".into()),
        "T2" => w.trigger = Trigger::Found { event_id: "evt_1".into(), tier: TrustTier::T1 },
        "T3" => w.trigger = Trigger::NotNamed,
        "T4" => w.trigger = Trigger::TraceEmpty("trace-x".into()),
        "T5" => w.trigger = Trigger::OwnRecord("evt_receipt".into()),
        "P1" => w.frameworks = vec!["hipaa".into()],
        "A1" => w.attested = vec![],
        "E1" => w.proposal.amount = Some(100.5),
        "OK" => {}
        _ => return None,
    }
    Some(w)
}

#[test]
fn every_row_of_the_rule_table_holds() {
    let rows = rule_table();
    assert!(rows.len() >= 25, "the rule table has {} rows", rows.len());
    for row in rows.iter().filter(|r| r.rule != "S1") {
        let w = scenario(&row.rule).unwrap_or_else(|| panic!("no scenario for rule {}", row.rule));
        let eval = run(&w);
        let expected = Outcome::parse(&row.outcome)
            .unwrap_or_else(|| panic!("rule {}: outcome {:?}", row.rule, row.outcome));
        assert_eq!(eval.outcome, expected, "rule {}: {:#?}", row.rule, eval.checks);
        if row.check == "all" {
            assert!(eval.checks.iter().all(|c| c.passed), "rule {}", row.rule);
            continue;
        }
        let failed: Vec<&Check> = eval.checks.iter().filter(|c| !c.passed).collect();
        let check = failed.iter().find(|c| c.check == row.check).unwrap_or_else(|| {
            panic!("rule {}: {} did not fail: {failed:#?}", row.rule, row.check)
        });
        assert_eq!(check.outcome, expected, "rule {}", row.rule);
        assert!(
            check.detail.contains(&row.detail),
            "rule {}: detail {:?} lacks {:?}",
            row.rule,
            check.detail,
            row.detail
        );
    }
}

#[test]
fn every_check_is_reported_once_in_order() {
    let eval = run(&world());
    let names: Vec<&str> = eval.checks.iter().map(|c| c.check.as_str()).collect();
    let mut expected = CHECKS.to_vec();
    expected.push(ESCROW_CHECK);
    assert_eq!(names, expected);
    assert_eq!(eval.outcome, Outcome::Allow);
    // Every check name appears in the documented table.
    let rows = rule_table();
    for name in expected.iter().filter(|n| **n != "api_access") {
        assert!(rows.iter().any(|r| r.check == *name), "{name} has no row in docs/governance.md");
    }
}

#[test]
fn missing_objects_fail_closed_on_every_dependent_check() {
    let mut w = world();
    w.grant = None;
    w.contract = None;
    let eval = run(&w);
    assert_eq!(eval.outcome, Outcome::Deny);
    assert_eq!(eval.checks.len(), CHECKS.len() + 1);
    let not_evaluated =
        eval.checks.iter().filter(|c| c.detail.starts_with("not evaluated")).count();
    assert_eq!(not_evaluated, 6 + 6);
}

#[test]
fn the_most_severe_outcome_wins() {
    // escrow + needs_human_approval → needs_human_approval
    let mut w = world();
    w.attested = vec![];
    decision(&mut w).status = DecisionStatus::PendingApproval;
    let eval = run(&w);
    assert_eq!(eval.outcome, Outcome::NeedsHumanApproval);
    assert_eq!(eval.checks.iter().filter(|c| !c.passed).count(), 2);

    // escrow + needs_human_approval + deny → deny, with all three reported
    grant(&mut w).actions = vec!["payout".into()];
    let eval = run(&w);
    assert_eq!(eval.outcome, Outcome::Deny);
    let failed: Vec<(&str, Outcome)> =
        eval.checks.iter().filter(|c| !c.passed).map(|c| (c.check.as_str(), c.outcome)).collect();
    assert_eq!(
        failed,
        [
            ("decision_status", Outcome::NeedsHumanApproval),
            ("grant_action", Outcome::Deny),
            ("attestation", Outcome::Escrow)
        ]
    );

    // escrow alone → escrow
    let mut w = world();
    w.proposal.amount = Some(150.0);
    assert_eq!(run(&w).outcome, Outcome::Escrow);
    // ... and with an amount over the approval threshold too → needs_human_approval
    w.proposal.amount = Some(250.0);
    let eval = run(&w);
    assert_eq!(eval.outcome, Outcome::NeedsHumanApproval);
    assert!(eval.checks.iter().any(|c| c.check == ESCROW_CHECK && !c.passed));
}

#[test]
fn limits_are_inclusive() {
    let mut w = world();
    w.proposal.amount = Some(100.0);
    assert_eq!(run(&w).outcome, Outcome::Allow, "escrowAbove is exclusive");
    let mut w = world();
    contract(&mut w).escrow_above = None;
    grant(&mut w).approval_threshold = None;
    w.proposal.amount = Some(500.0);
    assert_eq!(run(&w).outcome, Outcome::Allow, "maxAmount is inclusive");
    let mut w = world();
    w.trigger = Trigger::Found { event_id: "e".into(), tier: TrustTier::T2 };
    assert_eq!(run(&w).outcome, Outcome::Allow, "an equal tier suffices");
}
