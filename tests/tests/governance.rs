//! Governance against the real binary: decision objects and their
//! transitions, grants, contracts, tracking plans, every row of the rule
//! table in docs/governance.md through `POST /api/governance/enforce`,
//! receipts (chain linearity under concurrency, tamper detection), proof
//! trails (export, verify, push to a local HTTPS endpoint) and workspace
//! isolation.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashSet;
use std::sync::Arc;

use opgraph_tests::backends::{Backend, BackendCloud, BackendStore};
use opgraph_tests::now_ms;
use opgraph_tests::{Cloud, TEST_BOOTSTRAP_KEY, both_backends, client, https_endpoint};
use reqwest::{Client, Method, StatusCode};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

const DOC: &str = include_str!("../../docs/governance.md");
const HOUR: i64 = 3_600_000;

/// A fresh cloud on `backend` with `extra` in its environment.
async fn start(backend: Backend, extra: &[(&'static str, String)]) -> BackendCloud {
    backend.start(extra).await.unwrap()
}

async fn call(
    client: &Client,
    cloud: &Cloud,
    key: &str,
    method: Method,
    path: &str,
    body: Option<&Value>,
) -> (StatusCode, Value) {
    cloud.call(client, key, method, path, body).await
}

async fn post(
    client: &Client,
    cloud: &Cloud,
    key: &str,
    path: &str,
    body: &Value,
) -> (StatusCode, Value) {
    call(client, cloud, key, Method::POST, path, Some(body)).await
}

async fn get(client: &Client, cloud: &Cloud, key: &str, path: &str) -> (StatusCode, Value) {
    call(client, cloud, key, Method::GET, path, None).await
}

async fn patch(
    client: &Client,
    cloud: &Cloud,
    key: &str,
    path: &str,
    body: &Value,
) -> (StatusCode, Value) {
    call(client, cloud, key, Method::PATCH, path, Some(body)).await
}

/// Creates an object and returns its id, asserting 201.
async fn create(
    client: &Client,
    cloud: &Cloud,
    key: &str,
    path: &str,
    wrapper: &str,
    body: &Value,
) -> String {
    let (status, created) = post(client, cloud, key, path, body).await;
    assert_eq!(status, StatusCode::CREATED, "{path} {body}: {created}");
    created[wrapper]["id"].as_str().unwrap().to_owned()
}

fn code(body: &Value) -> &str {
    body["error"]["code"].as_str().unwrap_or("<none>")
}

async fn receipts(client: &Client, cloud: &Cloud, key: &str, query: &str) -> Vec<Value> {
    let (status, body) =
        get(client, cloud, key, &format!("/api/governance/receipts?limit=1000{query}")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body["receipts"].as_array().unwrap().clone()
}

async fn new_workspace(client: &Client, cloud: &Cloud, name: &str) -> String {
    let (status, body) =
        post(client, cloud, TEST_BOOTSTRAP_KEY, "/api/workspaces", &json!({"name": name})).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    body["apiKey"].as_str().unwrap().to_owned()
}

// ---------------------------------------------------------------------------
// A world in which every check passes, and its variations.

struct Scenario {
    decision: Value,
    decision_patches: Vec<&'static str>,
    grant: Value,
    revoke_grant: bool,
    contract: Value,
    event_tier: Option<&'static str>,
    /// `eventId` names the event that recorded the decision's creation.
    own_event: bool,
    body: Value,
}

fn base(now: i64, trace: &str) -> Scenario {
    Scenario {
        decision: json!({"title": "Refund order 8812", "riskLevel": "medium", "status": "approved",
            "expiresAt": now + HOUR, "owner": "ops"}),
        decision_patches: vec![],
        grant: json!({"grantee": "agent-7", "actions": ["refund"], "maxAmount": 500, "currency": "EUR",
            "approvalThreshold": 200, "validFrom": now - HOUR, "validUntil": now + HOUR}),
        revoke_grant: false,
        contract: json!({"name": "refunds", "allowedActions": ["refund"], "requiredTrustTier": "T2",
            "requiredAttestationProviders": ["notary"], "requiredCompliance": ["SOC2"],
            "escrowAbove": 100, "validUntil": now + HOUR}),
        event_tier: Some("T3"),
        own_event: false,
        body: json!({
            "proposedAction": {"action": "refund", "amount": 50, "currency": "EUR", "actor": "agent-7",
                "orderId": "8812"},
            "attestation": {"provider": "notary", "signature": "abc"},
            "traceId": trace,
            "complianceMapping": {"SOC2": ["CC6.1"]},
        }),
    }
}

/// The variation of [`base`] for one rule id of the table.
fn scenario(rule: &str, now: i64, trace: &str) -> Scenario {
    let mut s = base(now, trace);
    match rule {
        "D1" => s.body["decisionObjectId"] = json!("dec_doesnotexist"),
        "D2" => s.decision["status"] = json!("draft"),
        "D3" => s.decision["status"] = json!("pending_approval"),
        "D4" => {
            s.decision["status"] = json!("pending_approval");
            s.decision_patches = vec!["rejected"];
        }
        "D5" => s.decision_patches = vec!["revoked"],
        "D6" => s.decision_patches = vec!["expired"],
        "D7" => s.decision_patches = vec!["executed"],
        "D8" => s.decision["expiresAt"] = json!(now - 1),
        "G1" => s.body["authorityGrantId"] = json!("grt_doesnotexist"),
        "G2" => s.revoke_grant = true,
        "G3" => {
            s.grant["validFrom"] = json!(now + HOUR);
            s.grant["validUntil"] = json!(now + 2 * HOUR);
        }
        "G4" => s.grant["validUntil"] = json!(now - 1),
        "G5" => s.body["proposedAction"]["actor"] = json!("agent-8"),
        "G6" => s.grant["actions"] = json!(["payout"]),
        "G7" => {
            s.body["proposedAction"]["amount"] = json!(500.01);
            s.grant.as_object_mut().unwrap().remove("approvalThreshold");
            s.contract.as_object_mut().unwrap().remove("escrowAbove");
        }
        "G8" => s.body["proposedAction"]["currency"] = json!("USD"),
        "G9" => {
            s.body["proposedAction"]["amount"] = json!(200.5);
            s.contract.as_object_mut().unwrap().remove("escrowAbove");
        }
        "C1" => s.body["contextContractId"] = json!("ctc_doesnotexist"),
        "C2" => s.contract["validUntil"] = json!(now - 1),
        "C3" => s.contract["allowedActions"] = json!(["payout"]),
        "T1" => s.body["eventId"] = json!("evt_doesnotexist"),
        "T2" => s.event_tier = Some("T1"),
        "T3" => {
            s.body.as_object_mut().unwrap().remove("traceId");
        }
        "T4" => s.event_tier = None,
        "T5" => s.own_event = true,
        "P1" => s.body["complianceMapping"] = json!({"HIPAA": {}}),
        "A1" => {
            s.body.as_object_mut().unwrap().remove("attestation");
        }
        "E1" => s.body["proposedAction"]["amount"] = json!(100.5),
        "OK" | "S1" => {}
        other => panic!("no HTTP scenario for rule {other}"),
    }
    s
}

/// Creates the scenario's objects and returns the enforce body.
async fn prepare(client: &Client, cloud: &Cloud, key: &str, s: &Scenario) -> Value {
    let dec = create(
        client,
        cloud,
        key,
        "/api/governance/decision-objects",
        "decisionObject",
        &s.decision,
    )
    .await;
    for status in &s.decision_patches {
        let path = format!("/api/governance/decision-objects/{dec}");
        let (code, body) = patch(client, cloud, key, &path, &json!({"status": status})).await;
        assert_eq!(code, StatusCode::OK, "{body}");
    }
    let grt =
        create(client, cloud, key, "/api/governance/authority-grants", "authorityGrant", &s.grant)
            .await;
    if s.revoke_grant {
        let path = format!("/api/governance/authority-grants/{grt}");
        let (code, body) = patch(client, cloud, key, &path, &json!({"revoked": true})).await;
        assert_eq!(code, StatusCode::OK, "{body}");
        assert_eq!(body["authorityGrant"]["revoked"], true);
    }
    let ctc = create(
        client,
        cloud,
        key,
        "/api/governance/context-contracts",
        "contextContract",
        &s.contract,
    )
    .await;
    if let (Some(tier), Some(trace)) = (s.event_tier, s.body["traceId"].as_str()) {
        let event = json!({"event": "refund.requested", "traceId": trace, "trustTier": tier,
            "actor": {"type": "agent", "id": "agent-7"}});
        let (code, body) = post(client, cloud, key, "/api/ingest", &event).await;
        assert_eq!(code, StatusCode::ACCEPTED, "{body}");
    }
    let mut body = s.body.clone();
    if s.own_event {
        let path = "/api/events?event=governance.decision.created&limit=1000";
        let (code, listed) = get(client, cloud, key, path).await;
        assert_eq!(code, StatusCode::OK, "{listed}");
        let created =
            listed["events"].as_array().unwrap().iter().find(|e| e["object"]["id"] == dec);
        body["eventId"] =
            created.unwrap_or_else(|| panic!("no creation event: {listed}"))["id"].clone();
    }
    for (field, id) in
        [("decisionObjectId", dec), ("authorityGrantId", grt), ("contextContractId", ctc)]
    {
        if body.get(field).is_none() {
            body[field] = json!(id);
        }
    }
    body
}

struct Row {
    rule: String,
    check: String,
    outcome: String,
    detail: String,
}

fn rule_table() -> Vec<Row> {
    let start = DOC.find("<!-- rule-table -->").expect("rule table marker");
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
            Row {
                rule: cells[0].clone(),
                check: cells[1].clone(),
                outcome: cells[3].clone(),
                detail: cells[4].clone(),
            }
        })
        .collect()
}

async fn every_rule_row_holds_through_http(backend: Backend) {
    let cloud = start(backend, &[]).await;
    let client = client();
    let key = &cloud.key;
    let rows = rule_table();
    assert!(rows.len() >= 29, "rule table rows: {}", rows.len());
    let now = now_ms();
    let mut recorded = 0;
    for row in &rows {
        let trace = format!("trace-{}", row.rule);
        let s = scenario(&row.rule, now, &trace);
        let body = prepare(&client, &cloud, key, &s).await;
        if row.rule == "S1" {
            // A credential without `govern`: 403, and no receipt.
            let (status, created) = post(
                &client,
                &cloud,
                key,
                "/api/keys",
                &json!({"name": "reader", "scopes": ["read", "ingest"]}),
            )
            .await;
            assert_eq!(status, StatusCode::CREATED, "{created}");
            let reader = created["apiKey"].as_str().unwrap();
            let (status, answer) =
                post(&client, &cloud, reader, "/api/governance/enforce", &body).await;
            assert_eq!(status, StatusCode::FORBIDDEN, "{answer}");
            assert!(answer["error"]["message"].as_str().unwrap().contains(&row.detail), "{answer}");
            continue;
        }
        let (status, answer) = post(&client, &cloud, key, "/api/governance/enforce", &body).await;
        assert_eq!(status, StatusCode::OK, "rule {}: {answer}", row.rule);
        recorded += 1;
        assert_eq!(answer["outcome"], row.outcome.as_str(), "rule {}: {answer:#}", row.rule);
        let checks = answer["checks"].as_array().unwrap();
        assert_eq!(checks.len(), 17, "every check is reported");
        assert_eq!(answer["receipt"]["checks"], answer["checks"]);
        if row.check == "all" {
            assert!(checks.iter().all(|c| c["passed"] == true), "rule {}: {answer:#}", row.rule);
            continue;
        }
        let check = checks
            .iter()
            .find(|c| c["check"] == row.check.as_str() && c["passed"] == false)
            .unwrap_or_else(|| panic!("rule {}: {} did not fail: {answer:#}", row.rule, row.check));
        assert_eq!(check["outcome"], row.outcome.as_str(), "rule {}", row.rule);
        let detail = check["detail"].as_str().unwrap();
        assert!(
            detail.contains(&row.detail),
            "rule {}: {detail:?} lacks {:?}",
            row.rule,
            row.detail
        );
    }
    // One receipt per recorded call, S1 none.
    assert_eq!(receipts(&client, &cloud, key, "").await.len(), recorded);
}

async fn the_most_severe_outcome_wins_and_every_check_is_reported(backend: Backend) {
    let cloud = start(backend, &[]).await;
    let client = client();
    let key = &cloud.key;
    let now = now_ms();

    // escrow (attestation) + needs_human_approval (pending) + deny (action)
    let mut s = base(now, "trace-prec");
    s.decision["status"] = json!("pending_approval");
    s.grant["actions"] = json!(["payout"]);
    s.body.as_object_mut().unwrap().remove("attestation");
    let body = prepare(&client, &cloud, key, &s).await;
    let (status, answer) = post(&client, &cloud, key, "/api/governance/enforce", &body).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(answer["outcome"], "deny");
    let failed: Vec<(String, String)> = answer["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["passed"] == false)
        .map(|c| {
            (c["check"].as_str().unwrap().to_owned(), c["outcome"].as_str().unwrap().to_owned())
        })
        .collect();
    let expected = [
        ("decision_status", "needs_human_approval"),
        ("grant_action", "deny"),
        ("attestation", "escrow"),
    ];
    assert_eq!(failed, expected.map(|(a, b)| (a.to_owned(), b.to_owned())));

    // escrow + needs_human_approval → needs_human_approval
    let mut s = base(now, "trace-prec2");
    s.body["proposedAction"]["amount"] = json!(250);
    let body = prepare(&client, &cloud, key, &s).await;
    let (_, answer) = post(&client, &cloud, key, "/api/governance/enforce", &body).await;
    assert_eq!(answer["outcome"], "needs_human_approval", "{answer:#}");
    // escrow alone → escrow
    let mut s = base(now, "trace-prec3");
    s.body["proposedAction"]["amount"] = json!(150);
    let body = prepare(&client, &cloud, key, &s).await;
    let (_, answer) = post(&client, &cloud, key, "/api/governance/enforce", &body).await;
    assert_eq!(answer["outcome"], "escrow", "{answer:#}");

    // The receipt is listed by trace, decision and outcome, and is an event.
    let by_trace = receipts(&client, &cloud, key, "&traceId=trace-prec3").await;
    assert_eq!(by_trace.len(), 1);
    assert_eq!(by_trace[0], answer["receipt"]);
    let dec = answer["receipt"]["decisionObjectId"].as_str().unwrap();
    assert_eq!(receipts(&client, &cloud, key, &format!("&decisionId={dec}")).await.len(), 1);
    assert_eq!(receipts(&client, &cloud, key, "&outcome=deny").await.len(), 1);
    assert_eq!(receipts(&client, &cloud, key, "&outcome=escrow").await.len(), 1);
    let (status, one) = get(
        &client,
        &cloud,
        key,
        &format!("/api/governance/receipts/{}", answer["receiptId"].as_str().unwrap()),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(one["receipt"], answer["receipt"]);
    let (_, events) =
        get(&client, &cloud, key, "/api/events?event=governance.enforced&traceId=trace-prec3")
            .await;
    let events = events["events"].as_array().unwrap();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0]["decisionId"], dec);
    assert_eq!(events[0]["properties"]["outcome"], "escrow");
    assert_eq!(events[0]["properties"]["receiptId"], answer["receiptId"]);
}

async fn decisions_grants_contracts_and_plans_crud(backend: Backend) {
    let cloud = start(backend, &[]).await;
    let client = client();
    let key = &cloud.key;
    const DECISIONS: &str = "/api/governance/decision-objects";

    let (status, created) = post(
        &client,
        &cloud,
        key,
        DECISIONS,
        &json!({"title": "Reorder pallets", "riskLevel": "high", "traceId": "t-crud"}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let decision = &created["decisionObject"];
    assert_eq!(decision["status"], "draft");
    let id = decision["id"].as_str().unwrap().to_owned();
    assert!(id.starts_with("dec_"));
    let path = format!("{DECISIONS}/{id}");
    let (status, fetched) = get(&client, &cloud, key, &path).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(fetched["decisionObject"], *decision);

    // Allowed transitions, then refused ones (409 naming what is allowed).
    for to in ["pending_approval", "approved", "executed"] {
        let (status, body) =
            patch(&client, &cloud, key, &path, &json!({"status": to, "reason": "ok"})).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["decisionObject"]["status"], to);
    }
    let (status, body) = patch(&client, &cloud, key, &path, &json!({"status": "approved"})).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("final"), "{body}");
    let other = create(
        &client,
        &cloud,
        key,
        DECISIONS,
        "decisionObject",
        &json!({"title": "x", "riskLevel": "low"}),
    )
    .await;
    let (status, body) = patch(
        &client,
        &cloud,
        key,
        &format!("{DECISIONS}/{other}"),
        &json!({"status": "executed"}),
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert!(
        body["error"]["message"].as_str().unwrap().contains("allowed: pending_approval"),
        "{body}"
    );
    let (status, body) =
        patch(&client, &cloud, key, &format!("{DECISIONS}/{other}"), &json!({"status": "draft"}))
            .await;
    assert_eq!(status, StatusCode::CONFLICT, "same status: {body}");
    let (status, body) =
        patch(&client, &cloud, key, &format!("{DECISIONS}/{other}"), &json!({"status": "done"}))
            .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let (status, _) = patch(
        &client,
        &cloud,
        key,
        &format!("{DECISIONS}/dec_nope"),
        &json!({"status": "approved"}),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // Racing transitions from one status: exactly one wins, the rest 409.
    let racer = create(
        &client,
        &cloud,
        key,
        DECISIONS,
        "decisionObject",
        &json!({"title": "race", "riskLevel": "low", "status": "pending_approval"}),
    )
    .await;
    let path_racer = format!("{DECISIONS}/{racer}");
    let mut racing = Vec::new();
    for i in 0..10 {
        let (client, url, key) = (client.clone(), cloud.at(&path_racer), key.clone());
        let to = if i % 2 == 0 { "approved" } else { "rejected" };
        racing.push(tokio::spawn(async move {
            let response = client
                .patch(url)
                .bearer_auth(key)
                .json(&json!({"status": to}))
                .send()
                .await
                .unwrap();
            response.status()
        }));
    }
    let mut statuses = Vec::new();
    for task in racing {
        statuses.push(task.await.unwrap());
    }
    assert_eq!(statuses.iter().filter(|s| **s == StatusCode::OK).count(), 1, "{statuses:?}");
    assert!(statuses.iter().all(|s| *s == StatusCode::OK || *s == StatusCode::CONFLICT));

    // Each change is an event with the decision id.
    let (_, events) = get(
        &client,
        &cloud,
        key,
        "/api/events?event=governance.decision.status_changed&traceId=t-crud",
    )
    .await;
    let events = events["events"].as_array().unwrap();
    assert_eq!(events.len(), 3);
    assert!(events.iter().all(|e| e["decisionId"] == id.as_str()));
    let moves: HashSet<(String, String)> = events
        .iter()
        .map(|e| {
            (
                e["properties"]["from"].as_str().unwrap().to_owned(),
                e["properties"]["to"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert!(moves.contains(&("approved".to_owned(), "executed".to_owned())));

    // Listing, with the status filter.
    let (_, list) = get(&client, &cloud, key, &format!("{DECISIONS}?status=executed")).await;
    assert_eq!(list["decisionObjects"].as_array().unwrap().len(), 1);
    let (_, list) = get(&client, &cloud, key, &format!("{DECISIONS}?limit=1")).await;
    assert_eq!(list["decisionObjects"][0]["id"], racer.as_str(), "newest first");
    let (status, _) = get(&client, &cloud, key, &format!("{DECISIONS}?status=bogus")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);

    // Bad creation bodies.
    for (body, field) in [
        (json!({"title": "x"}), None),
        (json!({"title": "x", "riskLevel": "extreme"}), Some("riskLevel")),
        (json!({"title": "x", "riskLevel": "low", "status": "executed"}), Some("status")),
        (json!({"title": "", "riskLevel": "low"}), Some("title")),
        (json!({"title": "x", "riskLevel": "low", "colour": "red"}), None),
        // A null expiry would be a decision that never expires.
        (json!({"title": "x", "riskLevel": "low", "expiresAt": null}), Some("expiresAt")),
    ] {
        let (status, answer) = post(&client, &cloud, key, DECISIONS, &body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {answer}");
        if let Some(field) = field {
            assert_eq!(answer["error"]["field"], field, "{answer}");
        }
    }
    // Where leaving a key out lifts no limit, a null is the same as
    // leaving it out (the default status, draft, is the strictest).
    let (status, answer) = post(
        &client,
        &cloud,
        key,
        DECISIONS,
        &json!({"title": "nulls", "riskLevel": "low", "status": null, "description": null,
            "owner": null, "traceId": null}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{answer}");
    assert_eq!(answer["decisionObject"]["status"], "draft");

    // Grants: create, get, list, revoke once.
    const GRANTS: &str = "/api/governance/authority-grants";
    let grant = create(&client, &cloud, key, GRANTS, "authorityGrant",
        &json!({"grantee": "robot-1", "actions": ["dispatch"], "maxAmount": 10.5, "currency": "USD"})).await;
    assert!(grant.starts_with("grt_"));
    let (status, body) = get(&client, &cloud, key, &format!("{GRANTS}/{grant}")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["authorityGrant"]["revoked"], false);
    let (status, body) =
        patch(&client, &cloud, key, &format!("{GRANTS}/{grant}"), &json!({"revoked": true})).await;
    assert_eq!(status, StatusCode::OK);
    assert!(body["authorityGrant"]["revokedAt"].is_i64());
    let (status, _) =
        patch(&client, &cloud, key, &format!("{GRANTS}/{grant}"), &json!({"revoked": false})).await;
    assert_eq!(status, StatusCode::CONFLICT);
    let (_, list) = get(&client, &cloud, key, GRANTS).await;
    assert_eq!(list["authorityGrants"].as_array().unwrap().len(), 1);
    for (body, field) in [
        (json!({"grantee": "a", "actions": []}), "actions"),
        (json!({"grantee": "a", "actions": ["x"], "maxAmount": -1}), "maxAmount"),
        (json!({"grantee": "a", "actions": ["x"], "maxAmount": 1e16}), "maxAmount"),
        (json!({"grantee": "a", "actions": ["x"], "currency": "euro"}), "currency"),
        (json!({"grantee": "a", "actions": ["x"], "validFrom": 10, "validUntil": 5}), "validUntil"),
        // Each of these left out lifts a limit (no maximum, no threshold,
        // any currency, valid forever): a null is a 400, not "no limit".
        (json!({"grantee": "a", "actions": ["x"], "maxAmount": null}), "maxAmount"),
        (json!({"grantee": "a", "actions": ["x"], "approvalThreshold": null}), "approvalThreshold"),
        (json!({"grantee": "a", "actions": ["x"], "currency": null}), "currency"),
        (json!({"grantee": "a", "actions": ["x"], "validFrom": null}), "validFrom"),
        (json!({"grantee": "a", "actions": ["x"], "validUntil": null}), "validUntil"),
        (json!({"grantee": "a", "actions": ["x"], "revoked": null}), "revoked"),
    ] {
        let (status, answer) = post(&client, &cloud, key, GRANTS, &body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
        assert_eq!(code(&answer), "validation_failed", "{answer}");
        assert_eq!(answer["error"]["field"], field, "{answer}");
    }
    let (status, answer) = post(
        &client,
        &cloud,
        key,
        GRANTS,
        &json!({"grantee": "a", "actions": ["x"], "description": null}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "a null description is no description: {answer}");
    let (_, list) = get(&client, &cloud, key, GRANTS).await;
    assert_eq!(list["authorityGrants"].as_array().unwrap().len(), 2, "no refused body was stored");

    // Contracts.
    const CONTRACTS: &str = "/api/governance/context-contracts";
    let contract = create(
        &client,
        &cloud,
        key,
        CONTRACTS,
        "contextContract",
        &json!({"allowedActions": ["dispatch"], "requiredTrustTier": "T1"}),
    )
    .await;
    assert!(contract.starts_with("ctc_"));
    let (status, body) = get(&client, &cloud, key, &format!("{CONTRACTS}/{contract}")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["contextContract"]["requiredTrustTier"], "T1");
    assert_eq!(body["contextContract"]["requiredCompliance"], json!([]));
    for (body, field) in [
        (json!({"allowedActions": ["x"], "requiredTrustTier": "T9"}), "requiredTrustTier"),
        // No tier required, no escrow line, valid forever: not for a null.
        (json!({"allowedActions": ["x"], "requiredTrustTier": null}), "requiredTrustTier"),
        (json!({"allowedActions": ["x"], "escrowAbove": null}), "escrowAbove"),
        (json!({"allowedActions": ["x"], "validUntil": null}), "validUntil"),
        (json!({"allowedActions": ["x"], "requiredCompliance": null}), "requiredCompliance"),
        (
            json!({"allowedActions": ["x"], "requiredAttestationProviders": null}),
            "requiredAttestationProviders",
        ),
    ] {
        let (status, answer) = post(&client, &cloud, key, CONTRACTS, &body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {answer}");
        assert_eq!(code(&answer), "validation_failed", "{answer}");
        assert_eq!(answer["error"]["field"], field, "{answer}");
    }
    let (_, list) = get(&client, &cloud, key, CONTRACTS).await;
    assert_eq!(list["contextContracts"].as_array().unwrap().len(), 1);
    let (status, answer) =
        post(&client, &cloud, key, CONTRACTS, &json!({"allowedActions": ["x"], "name": null}))
            .await;
    assert_eq!(status, StatusCode::CREATED, "a null name is no name: {answer}");

    // Tracking plans.
    let plan = create(&client, &cloud, key, "/api/tracking-plans", "trackingPlan",
        &json!({"name": "Support agent", "vertical": "ecommerce",
            "events": ["ticket.opened", {"event": "refund.issued", "properties": {"amount": "number"}}]})).await;
    assert!(plan.starts_with("plan_"));
    let (status, body) = get(&client, &cloud, key, &format!("/api/tracking-plans/{plan}")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["trackingPlan"]["events"][1]["event"], "refund.issued");
    // A name and a vertical are enough to start a plan (spec 2.1).
    let bare = create(
        &client,
        &cloud,
        key,
        "/api/tracking-plans",
        "trackingPlan",
        &json!({"name": "Dock robots", "vertical": "warehouse"}),
    )
    .await;
    let (_, body) = get(&client, &cloud, key, &format!("/api/tracking-plans/{bare}")).await;
    assert_eq!(body["trackingPlan"]["events"], json!([]));
    let (_, list) = get(&client, &cloud, key, "/api/tracking-plans").await;
    assert_eq!(list["trackingPlans"].as_array().unwrap().len(), 2);
    let (status, answer) = post(
        &client,
        &cloud,
        key,
        "/api/tracking-plans",
        &json!({"name": "x", "vertical": "y", "events": [{"name": "no event key"}]}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(answer["error"]["field"], "events[0].event");
}

async fn bad_enforce_bodies_are_400_and_record_nothing(backend: Backend) {
    let cloud = start(backend, &[]).await;
    let client = client();
    let key = &cloud.key;
    let good = prepare(&client, &cloud, key, &base(now_ms(), "trace-bad")).await;
    let with = |f: &dyn Fn(&mut Value)| {
        let mut body = good.clone();
        f(&mut body);
        body
    };
    let cases: Vec<(Value, &str)> = vec![
        (json!([]), ""),
        (json!({}), ""),
        (
            with(&|b| {
                b.as_object_mut().unwrap().remove("decisionObjectId");
            }),
            "",
        ),
        (
            with(&|b| {
                b.as_object_mut().unwrap().remove("proposedAction");
            }),
            "",
        ),
        (
            with(&|b| b["proposedAction"] = json!({"amount": 5, "currency": "EUR"})),
            "proposedAction",
        ),
        (with(&|b| b["proposedAction"]["action"] = json!("")), "proposedAction.action"),
        (with(&|b| b["proposedAction"]["amount"] = json!(-0.01)), "proposedAction.amount"),
        (with(&|b| b["proposedAction"]["amount"] = json!(1e16)), "proposedAction.amount"),
        (with(&|b| b["proposedAction"]["amount"] = json!("NaN")), "proposedAction.amount"),
        (with(&|b| b["proposedAction"]["amount"] = json!("12")), "proposedAction.amount"),
        // A number or no key at all: a null would skip every amount check.
        (with(&|b| b["proposedAction"]["amount"] = Value::Null), "proposedAction.amount"),
        // Without a currency, or an actor, or the named event, a check is
        // skipped or judged on another event: a null must not do that.
        (
            with(&|b| {
                let action = b["proposedAction"].as_object_mut().unwrap();
                action.remove("amount");
                action.insert("currency".into(), Value::Null);
            }),
            "proposedAction.currency",
        ),
        (with(&|b| b["proposedAction"]["actor"] = Value::Null), "proposedAction.actor"),
        (with(&|b| b["eventId"] = Value::Null), "eventId"),
        (with(&|b| b["proposedAction"]["currency"] = json!("eur")), "proposedAction.currency"),
        (with(&|b| b["proposedAction"]["currency"] = json!("EURO")), "proposedAction.currency"),
        (
            with(&|b| {
                b["proposedAction"].as_object_mut().unwrap().remove("currency");
            }),
            "proposedAction.currency",
        ),
        (with(&|b| b["decisionObjectId"] = json!(42)), "decisionObjectId"),
        (with(&|b| b["attestation"] = json!({"signature": "no provider"})), "attestation"),
        (with(&|b| b["attestation"] = json!([{"provider": ""}])), "attestation[0].provider"),
        (with(&|b| b["complianceMapping"] = json!(["SOC2"])), "complianceMapping"),
        (with(&|b| b["surprise"] = json!(true)), ""),
    ];
    // Free-form JSON is recorded in the receipt (and sent to webhooks):
    // 64 KiB at most, as for an event's free objects.
    let big = "x".repeat(opgraph_proto::MAX_FREE_OBJECT_BYTES);
    let oversized: Vec<(Value, &str)> = vec![
        (with(&|b| b["proposedAction"]["note"] = json!(big)), "proposedAction"),
        (with(&|b| b["attestation"] = json!([{"provider": "p", "packet": big}])), "attestation"),
        (with(&|b| b["complianceMapping"] = json!({"SOC2": big})), "complianceMapping"),
    ];
    for (body, field) in cases.iter().chain(&oversized) {
        let (status, answer) = post(&client, &cloud, key, "/api/governance/enforce", body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {answer}");
        assert_eq!(code(&answer), "validation_failed", "{answer}");
        if !field.is_empty() {
            let got = answer["error"]["field"].as_str().unwrap_or("");
            assert!(got.starts_with(field), "{body}: field {got:?}, expected {field:?}");
        }
    }
    // Not JSON at all, and NaN literals (not JSON either).
    for raw in ["{not json", r#"{"proposedAction": {"amount": NaN}}"#] {
        let response = client
            .post(cloud.at("/api/governance/enforce"))
            .bearer_auth(key)
            .header("content-type", "application/json")
            .body(raw)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    }
    assert!(receipts(&client, &cloud, key, "").await.is_empty(), "no receipt for a bad body");
    let (_, events) = get(&client, &cloud, key, "/api/events?event=governance.enforced").await;
    assert!(events["events"].as_array().unwrap().is_empty());

    // Without an amount (and so without a currency) is fine.
    let no_amount = with(&|b| {
        let action = b["proposedAction"].as_object_mut().unwrap();
        action.remove("amount");
        action.remove("currency");
    });
    let (status, answer) = post(&client, &cloud, key, "/api/governance/enforce", &no_amount).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    // Where leaving a key out only makes the call stricter (no trigger, no
    // attestation, no compliance evidence), a null is the same.
    let stricter = with(&|b| {
        for field in ["traceId", "attestation", "complianceMapping"] {
            b[field] = Value::Null;
        }
    });
    let (status, answer) = post(&client, &cloud, key, "/api/governance/enforce", &stricter).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["outcome"], "deny", "no compliance evidence: {answer}");

    // The good body still works, and asking for a push with no endpoint
    // configured is a 400 that creates nothing.
    let (status, answer) = post(&client, &cloud, key, "/api/governance/enforce", &good).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let (status, answer) = post(
        &client,
        &cloud,
        key,
        "/api/proof-event-trails/export",
        &json!({"title": "t", "receiptIds": [answer["receiptId"]], "pushToExternalProof": true}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    assert_eq!(answer["error"]["field"], "pushToExternalProof");
    let (_, trails) = get(&client, &cloud, key, "/api/proof-event-trails").await;
    assert!(trails["proofTrails"].as_array().unwrap().is_empty());
}

async fn concurrent_enforce_calls_keep_each_chain_linear(backend: Backend) {
    let cloud = start(backend, &[]).await;
    let client = client();
    let key = cloud.key.clone();
    let body = prepare(&client, &cloud, &key, &base(now_ms(), "trace-conc")).await;
    let (status, second) =
        post(&client, &cloud, &key, "/api/keys", &json!({"name": "agent"})).await;
    assert_eq!(status, StatusCode::CREATED);
    let second = second["apiKey"].as_str().unwrap().to_owned();

    const CALLS: usize = 50;
    let cloud = Arc::new(cloud);
    let mut tasks = Vec::new();
    for i in 0..CALLS + 10 {
        let (client, cloud, body) = (client.clone(), Arc::clone(&cloud), body.clone());
        let key = if i < CALLS { key.clone() } else { second.clone() };
        tasks.push(tokio::spawn(async move {
            let (status, answer) =
                post(&client, &cloud, &key, "/api/governance/enforce", &body).await;
            assert_eq!(status, StatusCode::OK, "{answer}");
            answer["receiptId"].as_str().unwrap().to_owned()
        }));
    }
    let mut answered = HashSet::new();
    for task in tasks {
        assert!(answered.insert(task.await.unwrap()), "duplicate receipt id");
    }

    let all = receipts(&client, &cloud, &key, "").await;
    assert_eq!(all.len(), CALLS + 10, "no lost receipt");
    let stored: HashSet<String> =
        all.iter().map(|r| r["id"].as_str().unwrap().to_owned()).collect();
    assert_eq!(stored, answered);
    let writers: HashSet<String> =
        all.iter().map(|r| r["writer"].as_str().unwrap().to_owned()).collect();
    assert_eq!(writers.len(), 2);
    for writer in writers {
        let mut chain: Vec<&Value> =
            all.iter().filter(|r| r["writer"] == writer.as_str()).collect();
        chain.sort_by_key(|r| r["sequence"].as_u64().unwrap());
        let expected_len = if chain.len() == CALLS { CALLS } else { 10 };
        assert_eq!(chain.len(), expected_len);
        let mut prev = "0".repeat(64);
        for (i, receipt) in chain.iter().enumerate() {
            assert_eq!(receipt["sequence"], i as u64 + 1, "no gap, no duplicate position");
            assert_eq!(receipt["prevHash"], prev.as_str(), "linked to the one before: no fork");
            prev = receipt["contentHash"].as_str().unwrap().to_owned();
        }
    }
    let (status, report) = get(&client, &cloud, &key, "/api/governance/receipts/verify").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(report["valid"], true, "{report:#}");
    assert_eq!(report["checkedReceipts"], CALLS as u64 + 10);
    assert_eq!(report["chains"].as_array().unwrap().len(), 2);
    let (_, events) =
        get(&client, &cloud, &key, "/api/events?event=governance.enforced&limit=1000").await;
    assert_eq!(events["events"].as_array().unwrap().len(), CALLS + 10, "each receipt is an event");
}

async fn tampering_with_a_stored_receipt_is_detected(backend: Backend) {
    let cloud = start(backend, &[]).await;
    let client = client();
    let key = cloud.key.clone();
    let body = prepare(&client, &cloud, &key, &base(now_ms(), "trace-tamper")).await;
    let mut ids = Vec::new();
    for _ in 0..4 {
        let (status, answer) = post(&client, &cloud, &key, "/api/governance/enforce", &body).await;
        assert_eq!(status, StatusCode::OK);
        ids.push(answer["receiptId"].as_str().unwrap().to_owned());
    }
    let (_, report) = get(&client, &cloud, &key, "/api/governance/receipts/verify").await;
    assert_eq!(report["valid"], true, "{report}");

    // Someone with direct access to the store rewrites one receipt's body.
    let store = cloud.stop().await.unwrap();
    let mut stored = stored_receipt(&store, &ids[1]).await;
    stored["outcome"] = json!("deny");
    rewrite_receipt(&store, &ids[1], &stored, None).await;

    let cloud = store.start().await.unwrap();
    let (status, report) = get(&client, &cloud, &key, "/api/governance/receipts/verify").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(report["valid"], false, "{report:#}");
    let broken = &report["firstBroken"];
    assert_eq!(broken["receiptId"], ids[1].as_str(), "{report:#}");
    assert_eq!(broken["sequence"], 2);
    assert!(broken["reason"].as_str().unwrap().contains("contentHash mismatch"), "{broken}");
    // The listing shows the stored (tampered) body, not a cleaned-up one.
    let (_, one) =
        get(&client, &cloud, &key, &format!("/api/governance/receipts/{}", ids[1])).await;
    assert_eq!(one["receipt"]["outcome"], "deny");

    // A forger who re-hashes the edited receipt breaks the next link.
    let store = cloud.stop().await.unwrap();
    let mut forged = stored_receipt(&store, &ids[1]).await;
    forged.as_object_mut().unwrap().remove("contentHash");
    let hash = content_hash(&forged);
    forged["contentHash"] = json!(hash);
    rewrite_receipt(&store, &ids[1], &forged, Some(&hash)).await;
    let cloud = store.start().await.unwrap();
    let (_, report) = get(&client, &cloud, &key, "/api/governance/receipts/verify").await;
    assert_eq!(report["valid"], false, "{report:#}");
    assert_eq!(report["firstBroken"]["receiptId"], ids[2].as_str(), "{report:#}");
    assert!(report["firstBroken"]["reason"].as_str().unwrap().contains("prevHash"), "{report:#}");
}

/// Editing a receipt by storing a second copy of it beside the genuine
/// one: the embedded store refuses the row; ClickHouse cannot, and
/// verification reports the position stored twice (it once kept one copy
/// per id, and the edit passed while listings showed it).
async fn a_forged_copy_of_a_receipt_is_detected(backend: Backend) {
    let cloud = start(backend, &[]).await;
    let client = client();
    let key = cloud.key.clone();
    let body = prepare(&client, &cloud, &key, &base(now_ms(), "trace-copy")).await;
    let mut ids = Vec::new();
    for _ in 0..3 {
        let (status, answer) = post(&client, &cloud, &key, "/api/governance/enforce", &body).await;
        assert_eq!(status, StatusCode::OK);
        ids.push(answer["receiptId"].as_str().unwrap().to_owned());
    }
    let store = cloud.stop().await.unwrap();
    let mut forged = stored_receipt(&store, &ids[1]).await;
    forged["outcome"] = json!("deny");
    forged.as_object_mut().unwrap().remove("contentHash");
    let hash = content_hash(&forged);
    forged["contentHash"] = json!(hash);
    match store.backend {
        Backend::Embedded => {
            let conn = rusqlite::Connection::open(store.data_dir().join("opgraph.db")).unwrap();
            let copied = conn.execute(
                "INSERT INTO governance_receipts SELECT * FROM governance_receipts WHERE id = ?1",
                [&ids[1]],
            );
            assert!(copied.is_err(), "a second row for a receipt id is refused");
            return;
        }
        Backend::ClickHouse => {
            let insert = format!(
                "INSERT INTO governance_receipts (workspace_id, id, writer, sequence, prev_hash, \
                 content_hash, created_at, outcome, trace_id, decision_id, body, seq) \
                 SELECT workspace_id, id, writer, sequence, prev_hash, {}, created_at, 'deny', \
                 trace_id, decision_id, {}, seq + 1000 FROM governance_receipts WHERE id = {}",
                sql_string(&hash),
                sql_string(&forged.to_string()),
                sql_string(&ids[1])
            );
            store.clickhouse_sql(&insert).await.unwrap();
        }
    }
    let cloud = store.start().await.unwrap();
    let (status, report) = get(&client, &cloud, &key, "/api/governance/receipts/verify").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(report["valid"], false, "{report:#}");
    assert_eq!(report["firstBroken"]["receiptId"], ids[1].as_str(), "{report:#}");
    assert!(
        report["firstBroken"]["reason"].as_str().unwrap().contains("stored twice"),
        "{report:#}"
    );
}

const VERIFY: &str = "/api/governance/receipts/verify";

/// Pages `GET /api/governance/receipts/verify?{query}` as a client does:
/// each next call sends the previous answer's `next` as its query, with
/// the same `limit`, until an answer is `complete`.
async fn verify_walk(client: &Client, cloud: &Cloud, key: &str, query: &str) -> Vec<Value> {
    let limit = query.split('&').find(|p| p.starts_with("limit=")).unwrap_or("");
    let mut path = format!("{VERIFY}?{query}");
    let mut answers = Vec::new();
    for _ in 0..100 {
        let (status, answer) = get(client, cloud, key, &path).await;
        assert_eq!(status, StatusCode::OK, "{path}: {answer}");
        let next = answer["next"].clone();
        let complete = answer["complete"] == true;
        answers.push(answer);
        if complete {
            assert!(next.is_null(), "a complete answer has nowhere to go on: {next}");
            return answers;
        }
        let mut url = reqwest::Url::parse("http://x/").unwrap();
        for (name, value) in next.as_object().unwrap() {
            let value = value.as_str().map_or_else(|| value.to_string(), str::to_owned);
            url.query_pairs_mut().append_pair(name, &value);
        }
        path = format!("{VERIFY}?{}&{limit}", url.query().unwrap());
    }
    panic!("no complete answer in 100 calls from {query}");
}

/// Verification is bounded per call and pages like an audit: a chain
/// longer than the limit is walked in calls that go on from `next`, and
/// an edit is found wherever it falls, at a cut (a re-hashed receipt that
/// is the last of one call breaks the first link of the next) or inside a
/// later call.
async fn paged_verification_finds_tampering_at_a_cut_and_after_it(backend: Backend) {
    let cloud = start(backend, &[]).await;
    let client = client();
    let key = cloud.key.clone();
    let body = prepare(&client, &cloud, &key, &base(now_ms(), "trace-paged")).await;
    let (status, second) =
        post(&client, &cloud, &key, "/api/keys", &json!({"name": "agent"})).await;
    assert_eq!(status, StatusCode::CREATED);
    let second = second["apiKey"].as_str().unwrap().to_owned();
    let mut ids = Vec::new();
    for _ in 0..15 {
        let (status, answer) = post(&client, &cloud, &key, "/api/governance/enforce", &body).await;
        assert_eq!(status, StatusCode::OK, "{answer}");
        ids.push(answer["receiptId"].as_str().unwrap().to_owned());
    }
    for _ in 0..3 {
        let (status, _) = post(&client, &cloud, &second, "/api/governance/enforce", &body).await;
        assert_eq!(status, StatusCode::OK);
    }
    let first = stored_receipt(cloud.store(), &ids[0]).await;
    let writer = first["writer"].as_str().unwrap().to_owned();

    // Without parameters: everything, in one call (under the default limit).
    let (status, all) = get(&client, &cloud, &key, VERIFY).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!((all["valid"].clone(), all["complete"].clone()), (json!(true), json!(true)));
    assert_eq!(all["checkedReceipts"], 18);
    assert!(all["next"].is_null(), "{all}");

    // The walk over every chain, five receipts a call: 18 receipts in 4
    // calls, each checking at most 5, every chain checked to its end.
    let walk = verify_walk(&client, &cloud, &key, "limit=5").await;
    assert_eq!(walk.len(), 4, "{walk:#?}");
    assert!(walk.iter().all(|a| a["valid"] == true && a["checkedReceipts"].as_u64() <= Some(5)));
    assert_eq!(walk.iter().map(|a| a["checkedReceipts"].as_u64().unwrap()).sum::<u64>(), 18);
    assert!(walk[0]["next"]["fromWriter"].is_string(), "{:#}", walk[0]);
    let mut lengths = std::collections::HashMap::new();
    for chain in walk.iter().flat_map(|a| a["chains"].as_array().unwrap()) {
        *lengths.entry(chain["writer"].as_str().unwrap().to_owned()).or_insert(0) +=
            chain["length"].as_u64().unwrap();
    }
    assert_eq!(lengths.values().copied().collect::<HashSet<u64>>(), HashSet::from([15, 3]));

    // One chain, five a call: the first answer says where to go on.
    let one = verify_walk(&client, &cloud, &key, &format!("writer={writer}&limit=5")).await;
    assert_eq!(one.len(), 3);
    let fifth = stored_receipt(cloud.store(), &ids[4]).await;
    assert_eq!(
        one[0]["next"],
        json!({"writer": writer, "fromSequence": 6, "prevHash": fifth["contentHash"]}),
        "{:#}",
        one[0]
    );
    assert_eq!(one[0]["chains"][0]["next"], one[0]["next"], "the chain's own continuation");
    assert_eq!(
        one[2]["chains"][0]["headHash"],
        all["chains"].as_array().unwrap().iter().find(|c| c["writer"] == writer.as_str()).unwrap()
            ["headHash"]
    );
    // A continuation whose prevHash is not what the receipt before holds
    // breaks its first link: the cut is checked, not trusted.
    let zeros = "0".repeat(64);
    let (_, wrong) = get(
        &client,
        &cloud,
        &key,
        &format!("{VERIFY}?writer={writer}&fromSequence=6&prevHash={zeros}&limit=5"),
    )
    .await;
    assert_eq!(wrong["valid"], false, "{wrong:#}");
    assert_eq!(wrong["firstBroken"]["sequence"], 6);

    // Bad parameters are a 400 naming them.
    for (query, field) in [
        ("limit=-1", "limit"),
        ("limit=ten", "limit"),
        ("fromSequence=3&prevHash=ab", "fromSequence"),
        ("writer=k&fromSequence=3", "prevHash"),
        ("writer=k&fromWriter=k", "fromWriter"),
    ] {
        let (status, answer) = get(&client, &cloud, &key, &format!("{VERIFY}?{query}")).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}: {answer}");
        assert_eq!(answer["error"]["field"], field, "{query}: {answer}");
    }

    // Receipt 5, the last of the first call, edited and re-hashed; receipt
    // 13, inside the third call, edited.
    let store = cloud.stop().await.unwrap();
    let mut forged = stored_receipt(&store, &ids[4]).await;
    forged["outcome"] = json!("deny");
    forged.as_object_mut().unwrap().remove("contentHash");
    let hash = content_hash(&forged);
    forged["contentHash"] = json!(hash);
    rewrite_receipt(&store, &ids[4], &forged, Some(&hash)).await;
    // (A start puts back the embedded store's guard the rewrite dropped.)
    let store = store.start().await.unwrap().stop().await.unwrap();
    let mut edited = stored_receipt(&store, &ids[12]).await;
    edited["outcome"] = json!("deny");
    rewrite_receipt(&store, &ids[12], &edited, None).await;
    let cloud = store.start().await.unwrap();

    let one = verify_walk(&client, &cloud, &key, &format!("writer={writer}&limit=5")).await;
    assert_eq!(one.len(), 3);
    assert_eq!(one[0]["valid"], true, "receipt 5 is consistent on its own: {:#}", one[0]);
    assert_eq!(one[0]["next"]["prevHash"], hash.as_str(), "as read by the first call");
    let broken = &one[1]["firstBroken"];
    assert_eq!(
        (broken["sequence"].clone(), broken["receiptId"].clone()),
        (json!(6), json!(ids[5]))
    );
    assert!(broken["reason"].as_str().unwrap().contains("prevHash"), "{broken}");
    let broken = &one[2]["firstBroken"];
    assert_eq!(broken["receiptId"], ids[12].as_str(), "{:#}", one[2]);
    assert!(broken["reason"].as_str().unwrap().contains("contentHash mismatch"), "{broken}");
    // The walk over every chain finds both the same way.
    let walk = verify_walk(&client, &cloud, &key, "limit=5").await;
    let found: Vec<&Value> = walk
        .iter()
        .filter_map(|a| a["firstBroken"].as_object().map(|_| &a["firstBroken"]))
        .collect();
    let sequences: Vec<i64> = found.iter().map(|b| b["sequence"].as_i64().unwrap()).collect();
    assert_eq!(sequences, [6, 13], "{walk:#?}");
    // And one call without parameters reports the first, complete.
    let (_, all) = get(&client, &cloud, &key, VERIFY).await;
    assert_eq!((all["valid"].clone(), all["complete"].clone()), (json!(false), json!(true)));
    assert_eq!(all["firstBroken"]["receiptId"], ids[5].as_str());
}

/// A ClickHouse string literal of `text`.
fn sql_string(text: &str) -> String {
    format!("'{}'", text.replace('\\', "\\\\").replace('\'', "\\'"))
}

/// The stored body of receipt `id`, read from the store directly.
async fn stored_receipt(store: &BackendStore, id: &str) -> Value {
    let text = match store.backend {
        Backend::Embedded => {
            let conn = rusqlite::Connection::open(store.data_dir().join("opgraph.db")).unwrap();
            conn.query_row("SELECT body FROM governance_receipts WHERE id = ?1", [id], |r| r.get(0))
                .unwrap()
        }
        Backend::ClickHouse => store
            .clickhouse_sql(&format!(
                "SELECT body FROM governance_receipts WHERE id = {} FORMAT TabSeparatedRaw",
                sql_string(id)
            ))
            .await
            .unwrap(),
    };
    serde_json::from_str(&text).unwrap()
}

/// Rewrites receipt `id` behind the cloud's back: its body, its outcome
/// column and, when given, its contentHash column.
async fn rewrite_receipt(store: &BackendStore, id: &str, body: &Value, hash: Option<&str>) {
    let outcome = body["outcome"].as_str().unwrap();
    match store.backend {
        Backend::Embedded => {
            let conn = rusqlite::Connection::open(store.data_dir().join("opgraph.db")).unwrap();
            // The store itself refuses edits...
            let refused =
                conn.execute("UPDATE governance_receipts SET outcome = 'deny' WHERE id = ?1", [id]);
            assert!(refused.is_err(), "receipts are immutable through SQL");
            // ...but someone with the file can drop the guard (every start
            // puts it back) and rewrite a row.
            conn.execute_batch("DROP TRIGGER governance_receipts_no_update").unwrap();
            let changed = conn
                .execute(
                    "UPDATE governance_receipts SET body = ?2, outcome = ?3,
                        content_hash = coalesce(?4, content_hash) WHERE id = ?1",
                    rusqlite::params![id, body.to_string(), outcome, hash],
                )
                .unwrap();
            assert_eq!(changed, 1);
        }
        Backend::ClickHouse => {
            // The table is append-only for the store; a mutation is what an
            // operator with SQL access would use.
            let mut set = format!(
                "body = {}, outcome = {}",
                sql_string(&body.to_string()),
                sql_string(outcome)
            );
            if let Some(hash) = hash {
                set.push_str(&format!(", content_hash = {}", sql_string(hash)));
            }
            let update = format!(
                "ALTER TABLE governance_receipts UPDATE {set} WHERE id = {}",
                sql_string(id)
            );
            store.clickhouse_mutate(&update).await.unwrap();
            let count = format!(
                "SELECT count() FROM governance_receipts WHERE id = {} AND body = {}",
                sql_string(id),
                sql_string(&body.to_string())
            );
            assert_eq!(store.clickhouse_sql(&count).await.unwrap().trim(), "1");
        }
    }
}

/// The canonical-JSON SHA-256 of docs/governance.md, written independently
/// of the cloud's code: sorted keys, no whitespace, serde_json's escaping.
fn content_hash(value: &Value) -> String {
    fn canonical(value: &Value, out: &mut String) {
        match value {
            Value::Object(map) => {
                let mut keys: Vec<&String> = map.keys().collect();
                keys.sort();
                out.push('{');
                for (i, k) in keys.into_iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(&serde_json::to_string(k).unwrap());
                    out.push(':');
                    canonical(&map[k], out);
                }
                out.push('}');
            }
            Value::Array(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    canonical(item, out);
                }
                out.push(']');
            }
            other => out.push_str(&serde_json::to_string(other).unwrap()),
        }
    }
    let mut text = String::new();
    canonical(value, &mut text);
    Sha256::digest(text.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

async fn receipts_hash_as_documented(backend: Backend) {
    let cloud = start(backend, &[]).await;
    let client = client();
    let body = prepare(&client, &cloud, &cloud.key, &base(now_ms(), "trace-hash")).await;
    let (_, answer) = post(&client, &cloud, &cloud.key, "/api/governance/enforce", &body).await;
    let mut receipt = answer["receipt"].clone();
    let stated = receipt["contentHash"].as_str().unwrap().to_owned();
    receipt.as_object_mut().unwrap().remove("contentHash");
    assert_eq!(content_hash(&receipt), stated);
    assert_eq!(receipt["prevHash"], "0".repeat(64));
    assert_eq!(receipt["sequence"], 1);
    assert_eq!(receipt["proposedAction"]["orderId"], "8812", "extra keys are recorded");
    assert_eq!(receipt["trigger"]["trustTier"], "T3");
}

// ---------------------------------------------------------------------------
// Proof trails and the push to a local HTTPS endpoint.

async fn proof_trails_export_verify_and_push(backend: Backend) {
    let mut endpoint = https_endpoint::start(vec![200, 500]).await;
    let cloud = start(
        backend,
        &[
            ("OPGRAPH_PROOF_URL", endpoint.url.clone()),
            ("OPGRAPH_PROOF_CA_FILE", endpoint.ca_file.display().to_string()),
            ("OPGRAPH_PROOF_TIMEOUT", "5s".to_owned()),
        ],
    )
    .await;
    let client = client();
    let key = &cloud.key.clone();
    let body = prepare(&client, &cloud, key, &base(now_ms(), "trace-proof")).await;
    let (_, first) = post(&client, &cloud, key, "/api/governance/enforce", &body).await;
    let (_, second) = post(&client, &cloud, key, "/api/governance/enforce", &body).await;
    let receipt_ids = json!([first["receiptId"], second["receiptId"]]);

    // Export without a push.
    let (status, exported) = post(
        &client,
        &cloud,
        key,
        "/api/proof-event-trails/export",
        &json!({
        "title": "Refund 8812", "receiptIds": receipt_ids,
        "evidence": [{"kind": "photo", "sha256": "ab12"}, {"kind": "note", "text": "ok"}]}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{exported}");
    assert!(exported.get("exportReceipt").is_none());
    let trail = &exported["proofTrail"];
    let id = trail["id"].as_str().unwrap().to_owned();
    assert!(id.starts_with("prf_"));
    let kinds: Vec<&str> =
        trail["items"].as_array().unwrap().iter().map(|i| i["type"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "receipt",
            "receipt",
            "decision",
            "authority_grant",
            "context_contract",
            "event",
            "event",
            "event",
            "evidence",
            "evidence"
        ],
        "receipts, their objects, the trace's events (the trigger and two receipt events), evidence"
    );
    assert_eq!(trail["itemCount"], 10);
    let (status, verified) =
        get(&client, &cloud, key, &format!("/api/proof-event-trails/{id}/verify")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(verified["valid"], true, "{verified}");
    assert_eq!(verified["rootHash"], trail["rootHash"]);
    assert_eq!(verified["recomputedHash"], trail["rootHash"]);
    let (status, fetched) =
        get(&client, &cloud, key, &format!("/api/proof-event-trails/{id}")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(fetched["proofTrail"], *trail);
    assert_eq!(fetched["exportReceipts"], json!([]));

    // Push: the endpoint answers 200, then 500.
    let export = json!({"title": "pushed", "traceId": "trace-proof", "pushToExternalProof": true});
    let (status, ok) = post(&client, &cloud, key, "/api/proof-event-trails/export", &export).await;
    assert_eq!(status, StatusCode::CREATED, "{ok}");
    let receipt = &ok["exportReceipt"];
    assert_eq!(receipt["status"], "succeeded", "{receipt}");
    assert_eq!(receipt["responseStatus"], 200);
    assert_eq!(receipt["externalId"], "ext-0");
    assert!(receipt["id"].as_str().unwrap().starts_with("exp_"));
    assert_eq!(
        receipt["destination"],
        endpoint.url.split('?').next().unwrap(),
        "no query, no secret"
    );
    assert_eq!(receipt["recordCount"], ok["proofTrail"]["itemCount"]);
    {
        let received = endpoint.received.lock().unwrap();
        let (head, bytes) = &received[0];
        let hash: String = Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(receipt["payloadHash"], hash.as_str(), "hash of the exact bytes sent");
        let packet: Value = serde_json::from_slice(bytes).unwrap();
        assert_eq!(packet["proofTrail"]["rootHash"], ok["proofTrail"]["rootHash"]);
        let request_id = receipt["requestId"].as_str().unwrap();
        assert!(head.contains(&format!("x-opgraph-request-id: {request_id}")), "{head}");
    }
    let (status, failed) =
        post(&client, &cloud, key, "/api/proof-event-trails/export", &export).await;
    assert_eq!(status, StatusCode::CREATED, "the trail exists whatever the push did: {failed}");
    let receipt = &failed["exportReceipt"];
    assert_eq!(receipt["status"], "failed");
    assert_eq!(receipt["responseStatus"], 500);
    assert!(receipt["error"].as_str().unwrap().contains("HTTP 500"), "{receipt}");

    // No endpoint listening at all: failed, without a response status.
    endpoint.task.abort();
    let _ = (&mut endpoint.task).await;
    let (status, down) =
        post(&client, &cloud, key, "/api/proof-event-trails/export", &export).await;
    assert_eq!(status, StatusCode::CREATED);
    let receipt = &down["exportReceipt"];
    assert_eq!(receipt["status"], "failed", "{receipt}");
    assert!(receipt.get("responseStatus").is_none_or(Value::is_null), "{receipt}");
    assert!(!receipt["error"].as_str().unwrap().is_empty());
    let down_id = down["proofTrail"]["id"].as_str().unwrap();
    let (_, fetched) =
        get(&client, &cloud, key, &format!("/api/proof-event-trails/{down_id}")).await;
    assert_eq!(fetched["exportReceipts"][0], *receipt);

    // Missing receipt: 404 naming it, nothing created.
    let (status, answer) = post(
        &client,
        &cloud,
        key,
        "/api/proof-event-trails/export",
        &json!({"title": "x", "receiptIds": ["rcp_missing"]}),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{answer}");
    let (_, trails) = get(&client, &cloud, key, "/api/proof-event-trails").await;
    assert_eq!(trails["proofTrails"].as_array().unwrap().len(), 4);
    let (status, _) =
        post(&client, &cloud, key, "/api/proof-event-trails/export", &json!({"title": "x"})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    // Evidence alone is a packet of its own, and verifies.
    let photos = json!({"title": "Dock 3 delivery",
        "evidence": [{"kind": "photo", "sha256": "cd34"}, {"kind": "signature", "by": "ann"}]});
    let (status, only) =
        post(&client, &cloud, key, "/api/proof-event-trails/export", &photos).await;
    assert_eq!(status, StatusCode::CREATED, "{only}");
    let trail = &only["proofTrail"];
    assert_eq!(trail["itemCount"], 2, "{only}");
    assert_eq!(trail["items"][1]["id"], "evidence-0001");
    let path = format!("/api/proof-event-trails/{}/verify", trail["id"].as_str().unwrap());
    let (_, verified) = get(&client, &cloud, key, &path).await;
    assert_eq!(verified["valid"], true, "{verified}");
    let (status, _) = post(
        &client,
        &cloud,
        key,
        "/api/proof-event-trails/export",
        &json!({"title": "x", "traceId": "no-such-trace"}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "an empty packet proves nothing");

    // Tampering with a stored trail shows in verify.
    let store = cloud.stop().await.unwrap();
    match store.backend {
        Backend::Embedded => {
            let conn = rusqlite::Connection::open(store.data_dir().join("opgraph.db")).unwrap();
            conn.execute(
                "UPDATE proof_trails SET body = json_set(body, '$.items[0].body.outcome', 'deny') WHERE id = ?1",
                [&id],
            )
            .unwrap();
        }
        Backend::ClickHouse => {
            // Trails are versioned rows: a newer version is what a forger
            // with SQL access would insert.
            let read = format!(
                "SELECT body FROM proof_trails WHERE id = {} FORMAT TabSeparatedRaw",
                sql_string(&id)
            );
            let mut body: Value =
                serde_json::from_str(&store.clickhouse_sql(&read).await.unwrap()).unwrap();
            body["items"][0]["body"]["outcome"] = json!("deny");
            let insert = format!(
                "INSERT INTO proof_trails SELECT workspace_id, id, title, root_hash, item_count,
                    created_at, {}, version + 1 FROM proof_trails WHERE id = {}",
                sql_string(&body.to_string()),
                sql_string(&id)
            );
            store.clickhouse_sql(&insert).await.unwrap();
        }
    }
    let cloud = store.start().await.unwrap();
    let (_, verified) =
        get(&client, &cloud, key, &format!("/api/proof-event-trails/{id}/verify")).await;
    assert_eq!(verified["valid"], false, "{verified}");
    assert_ne!(verified["recomputedHash"], verified["rootHash"]);
    assert_eq!(verified["mismatchedItems"].as_array().unwrap().len(), 1);
}

async fn another_workspaces_objects_are_not_found(backend: Backend) {
    let cloud = start(backend, &[]).await;
    let client = client();
    let a = cloud.key.clone();
    let b = new_workspace(&client, &cloud, "other").await;
    let body = prepare(&client, &cloud, &a, &base(now_ms(), "trace-ws")).await;
    let (_, enforced) = post(&client, &cloud, &a, "/api/governance/enforce", &body).await;
    assert_eq!(enforced["outcome"], "allow", "{enforced:#}");
    let receipt = enforced["receiptId"].as_str().unwrap();
    let (_, exported) = post(
        &client,
        &cloud,
        &a,
        "/api/proof-event-trails/export",
        &json!({"title": "a", "receiptIds": [receipt]}),
    )
    .await;
    let trail = exported["proofTrail"]["id"].as_str().unwrap();
    let plan = create(
        &client,
        &cloud,
        &a,
        "/api/tracking-plans",
        "trackingPlan",
        &json!({"name": "p", "vertical": "v", "events": ["e"]}),
    )
    .await;

    let dec = body["decisionObjectId"].as_str().unwrap();
    let grt = body["authorityGrantId"].as_str().unwrap();
    let ctc = body["contextContractId"].as_str().unwrap();
    for path in [
        format!("/api/governance/decision-objects/{dec}"),
        format!("/api/governance/authority-grants/{grt}"),
        format!("/api/governance/context-contracts/{ctc}"),
        format!("/api/governance/receipts/{receipt}"),
        format!("/api/proof-event-trails/{trail}"),
        format!("/api/proof-event-trails/{trail}/verify"),
        format!("/api/tracking-plans/{plan}"),
    ] {
        let (status, answer) = get(&client, &cloud, &b, &path).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}: {answer}");
        assert_eq!(code(&answer), "not_found");
        let (status, _) = get(&client, &cloud, &a, &path).await;
        assert_eq!(status, StatusCode::OK, "{path} in its own workspace");
    }
    let (status, _) = patch(
        &client,
        &cloud,
        &b,
        &format!("/api/governance/decision-objects/{dec}"),
        &json!({"status": "executed"}),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = patch(
        &client,
        &cloud,
        &b,
        &format!("/api/governance/authority-grants/{grt}"),
        &json!({"revoked": true}),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (_, still) =
        get(&client, &cloud, &a, &format!("/api/governance/authority-grants/{grt}")).await;
    assert_eq!(still["authorityGrant"]["revoked"], false);

    // Enforcing in B with A's objects: deny, each reference "not found".
    let (status, answer) = post(&client, &cloud, &b, "/api/governance/enforce", &body).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(answer["outcome"], "deny");
    for check in ["decision_object", "authority_grant", "context_contract"] {
        let c = answer["checks"].as_array().unwrap().iter().find(|c| c["check"] == check).unwrap();
        assert_eq!(c["passed"], false);
        assert!(c["detail"].as_str().unwrap().contains("not found in this workspace"), "{c}");
    }
    // Exporting A's receipt from B: 404; B's lists hold only B's.
    let (status, _) = post(
        &client,
        &cloud,
        &b,
        "/api/proof-event-trails/export",
        &json!({"title": "b", "receiptIds": [receipt]}),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(receipts(&client, &cloud, &b, "").await.len(), 1);
    let (_, list) = get(&client, &cloud, &b, "/api/governance/decision-objects").await;
    assert_eq!(list["decisionObjects"], json!([]));
    let (_, report) = get(&client, &cloud, &b, "/api/governance/receipts/verify").await;
    assert_eq!(report["checkedReceipts"], 1);
}

both_backends!(
    every_rule_row_holds_through_http,
    the_most_severe_outcome_wins_and_every_check_is_reported,
    decisions_grants_contracts_and_plans_crud,
    bad_enforce_bodies_are_400_and_record_nothing,
    concurrent_enforce_calls_keep_each_chain_linear,
    tampering_with_a_stored_receipt_is_detected,
    a_forged_copy_of_a_receipt_is_detected,
    paged_verification_finds_tampering_at_a_cut_and_after_it,
    receipts_hash_as_documented,
    proof_trails_export_verify_and_push,
    another_workspaces_objects_are_not_found,
);
