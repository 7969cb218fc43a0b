//! Stripe `Charge` → `payment.succeeded` (or `payment.pending`,
//! `payment.failed`, after its `status`). Other Stripe objects are mapped
//! generically (`stripe.record`).
//!
//! Amounts are in the currency's minor unit: divided by 100, by 1 for
//! Stripe's zero-decimal currencies and by 1000 for its three-decimal ones.
//! Revenue is what was captured less what was refunded, for succeeded
//! charges only.

use serde_json::{Map, Value, json};

use super::{Mapped, child, id_of, is_true, number, object, text};

/// Stripe's zero-decimal currencies.
const ZERO_DECIMAL: [&str; 16] = [
    "bif", "clp", "djf", "gnf", "jpy", "kmf", "krw", "mga", "pyg", "rwf", "ugx", "vnd", "vuv",
    "xaf", "xof", "xpf",
];
const THREE_DECIMAL: [&str; 5] = ["bhd", "jod", "kwd", "omr", "tnd"];

/// Minor units to major units of `currency` (lower-case ISO code).
pub fn major_units(amount: f64, currency: &str) -> f64 {
    if ZERO_DECIMAL.contains(&currency) {
        amount
    } else if THREE_DECIMAL.contains(&currency) {
        amount / 1000.0
    } else {
        amount / 100.0
    }
}

pub fn map(r: &Map<String, Value>) -> Result<Mapped, String> {
    match r.get("object").and_then(Value::as_str) {
        Some("charge") | None => charge(r),
        Some(_) => {
            // A refund's or a payout's amount is not revenue.
            let mut mapped = super::generic("stripe", r)?;
            if let Value::Object(envelope) = &mut mapped.envelope {
                envelope.remove("outcome");
            }
            Ok(mapped)
        }
    }
}

fn charge(r: &Map<String, Value>) -> Result<Mapped, String> {
    let id = id_of(r.get("id")).ok_or("`id` is required")?;
    let currency = text(r, "currency").ok_or("`currency` is required")?.to_ascii_lowercase();
    let amount = number(r.get("amount")).ok_or("`amount` (minor units) is required")?;
    let status = text(r, "status").unwrap_or_else(|| "succeeded".into());
    let event = match status.as_str() {
        "succeeded" => "payment.succeeded",
        "pending" => "payment.pending",
        "failed" => "payment.failed",
        other => return Err(format!("unknown charge status {other:?}")),
    };
    let captured = if r.contains_key("captured") && !is_true(r.get("captured")) {
        0.0
    } else {
        number(r.get("amount_captured")).unwrap_or(amount)
    };
    let refunded = number(r.get("amount_refunded")).unwrap_or(0.0);
    let revenue = (status == "succeeded").then(|| major_units(captured - refunded, &currency));
    let code = currency.to_ascii_uppercase();
    let customer = match r.get("customer") {
        Some(Value::Object(c)) => id_of(c.get("id")),
        other => id_of(other),
    };
    let created = match r.get("created") {
        None | Some(Value::Null) => None,
        Some(v) => Some(
            v.as_i64()
                .and_then(|s| s.checked_mul(1000))
                .ok_or("`created` must be a Unix time in seconds")?,
        ),
    };
    let details = child(r, "payment_method_details");
    let outcome = child(r, "outcome");
    let metadata = r.get("metadata").filter(|m| m.as_object().is_some_and(|m| !m.is_empty()));
    let charge_ref = format!("stripe:{id}");
    Ok(Mapped {
        envelope: object([
            ("event", json!(event)),
            (
                "actor",
                customer.map_or(
                    Value::Null,
                    |c| json!({"type": "customer", "id": format!("stripe:{c}")}),
                ),
            ),
            ("object", json!({"type": "charge", "id": charge_ref})),
            (
                "outcome",
                object([
                    ("revenue", json!(revenue)),
                    ("currency", json!(code)),
                    ("amount", json!(major_units(amount, &currency))),
                ]),
            ),
            ("source", json!({"platform": "stripe"})),
            (
                "properties",
                object([
                    ("status", json!(status)),
                    ("paid", r.get("paid").cloned().unwrap_or(Value::Null)),
                    ("refunded", r.get("refunded").cloned().unwrap_or(Value::Null)),
                    ("amountRefunded", json!(major_units(refunded, &currency))),
                    ("paymentIntent", json!(text(r, "payment_intent"))),
                    ("invoice", json!(text(r, "invoice"))),
                    ("description", json!(text(r, "description"))),
                    ("failureCode", json!(text(r, "failure_code"))),
                    ("paymentMethodType", json!(details.and_then(|d| text(d, "type")))),
                    ("riskLevel", json!(outcome.and_then(|o| text(o, "risk_level")))),
                    ("livemode", r.get("livemode").cloned().unwrap_or(Value::Null)),
                    ("metadata", metadata.cloned().unwrap_or(Value::Null)),
                ]),
            ),
            ("timestamp", json!(created)),
        ]),
        record_id: id,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connectors::{map_record, tests::valid};

    /// Shaped like the API's Charge object (trimmed).
    fn charge() -> Value {
        json!({
            "id": "ch_3MmlLrLkdIwHu7ix0snN0B15",
            "object": "charge",
            "amount": 1099,
            "amount_captured": 1099,
            "amount_refunded": 100,
            "balance_transaction": "txn_3MmlLrLkdIwHu7ix0uke3Ezy",
            "billing_details": {"email": "jenny@example.com", "name": "Jenny Rosen",
                "phone": null, "address": {"country": "US", "postal_code": "94103"}},
            "captured": true,
            "created": 1_793_000_000,
            "currency": "usd",
            "customer": "cus_NffrFeUfNV2Hib",
            "description": "Order #1001",
            "failure_code": null,
            "invoice": null,
            "livemode": false,
            "metadata": {"orderId": "1001"},
            "outcome": {"network_status": "approved_by_network", "risk_level": "normal",
                "seller_message": "Payment complete.", "type": "authorized"},
            "paid": true,
            "payment_intent": "pi_3MmlLrLkdIwHu7ix0HXnfgAj",
            "payment_method": "pm_1MmlLrLkdIwHu7ixJx1PVrMr",
            "payment_method_details": {"card": {"brand": "visa", "last4": "4242"}, "type": "card"},
            "receipt_email": "jenny@example.com",
            "refunded": false,
            "status": "succeeded"
        })
    }

    #[test]
    fn succeeded_charge_maps_to_payment_succeeded_net_of_refunds() {
        let mapped = map_record("stripe", &charge()).unwrap();
        assert_eq!(mapped.record_id, "ch_3MmlLrLkdIwHu7ix0snN0B15");
        let event = valid(&mapped);
        assert_eq!(event.event, "payment.succeeded");
        let e = &mapped.envelope;
        assert_eq!(e["outcome"], json!({"revenue": 9.99, "currency": "USD", "amount": 10.99}));
        assert_eq!(e["actor"], json!({"type": "customer", "id": "stripe:cus_NffrFeUfNV2Hib"}));
        assert_eq!(e["properties"]["paymentMethodType"], "card");
        assert_eq!(e["properties"]["metadata"], json!({"orderId": "1001"}));
        assert_eq!(event.timestamp, Some(1_793_000_000_000));
        assert!(!e.to_string().contains("jenny"));
    }

    #[test]
    fn failed_charge_has_no_revenue_and_zero_decimal_currencies_are_whole() {
        let mut c = charge();
        c["status"] = json!("failed");
        c["failure_code"] = json!("card_declined");
        let mapped = map_record("stripe", &c).unwrap();
        assert_eq!(mapped.envelope["event"], "payment.failed");
        assert!(mapped.envelope["outcome"].get("revenue").is_none());
        assert_eq!(major_units(500.0, "jpy"), 500.0);
        assert_eq!(major_units(1500.0, "kwd"), 1.5);
    }

    #[test]
    fn other_objects_are_generic_and_bad_status_is_refused() {
        let refund = json!({"id": "re_1", "object": "refund", "amount": 100, "currency": "usd"});
        let mapped = map_record("stripe", &refund).unwrap();
        assert_eq!(mapped.envelope["event"], "stripe.record");
        assert!(mapped.envelope.get("outcome").is_none());
        let mut c = charge();
        c["status"] = json!("exploded");
        assert!(map_record("stripe", &c).is_err());
    }
}
