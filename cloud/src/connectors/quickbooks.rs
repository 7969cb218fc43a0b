//! QuickBooks Online API v3: `Invoice` → `invoice.created`, `Payment` →
//! `payment.received`; other entities → `quickbooks.record`.
//!
//! A record is either wrapped as the API answers a read
//! (`{"Invoice": {...}}`) or bare as in a query response's list; a bare one
//! is a Payment if it has `PaymentMethodRef`, `DepositToAccountRef` or
//! `UnappliedAmt`, an Invoice if it has `DueDate` or `Balance` with `Line`.
//! Revenue is booked on invoices (`TotalAmt`); a payment carries its amount
//! but no revenue, so that an invoice and its payment are not counted
//! twice. The event time is `MetaData.CreateTime`, else `TxnDate`.

use serde_json::{Map, Value, json};

use super::{Mapped, child, number, object, text, time_field};

pub fn map(r: &Map<String, Value>) -> Result<Mapped, String> {
    if r.len() == 1 {
        for (wrapper, f) in [("Invoice", invoice as Mapper), ("Payment", payment as Mapper)] {
            if let Some(inner) = child(r, wrapper) {
                return f(inner);
            }
        }
    }
    if ["PaymentMethodRef", "DepositToAccountRef", "UnappliedAmt"]
        .iter()
        .any(|k| r.contains_key(*k))
    {
        payment(r)
    } else if r.contains_key("Line") && (r.contains_key("DueDate") || r.contains_key("Balance")) {
        invoice(r)
    } else {
        let mut mapped = super::generic("quickbooks", r)?;
        if let Value::Object(envelope) = &mut mapped.envelope {
            envelope.remove("outcome");
        }
        Ok(mapped)
    }
}

type Mapper = fn(&Map<String, Value>) -> Result<Mapped, String>;

fn reference(r: &Map<String, Value>, key: &str) -> Option<String> {
    child(r, key).and_then(|c| text(c, "value"))
}

fn time(r: &Map<String, Value>) -> Result<Option<i64>, String> {
    if let Some(meta) = child(r, "MetaData")
        && let Some(t) = time_field(meta, "CreateTime")?
    {
        return Ok(Some(t));
    }
    time_field(r, "TxnDate")
}

fn customer(r: &Map<String, Value>) -> Value {
    reference(r, "CustomerRef")
        .map_or(Value::Null, |c| json!({"type": "customer", "id": format!("quickbooks:{c}")}))
}

fn invoice(r: &Map<String, Value>) -> Result<Mapped, String> {
    let id = text(r, "Id").ok_or("`Id` is required")?;
    let total = number(r.get("TotalAmt")).ok_or("`TotalAmt` is required")?;
    let balance = number(r.get("Balance"));
    let currency = reference(r, "CurrencyRef");
    let status = match balance {
        Some(b) if b <= 0.0 => "paid",
        Some(b) if b < total => "partially_paid",
        _ => "open",
    };
    let invoice = format!("quickbooks:{id}");
    Ok(Mapped {
        envelope: object([
            ("event", json!("invoice.created")),
            ("actor", customer(r)),
            ("object", json!({"type": "invoice", "id": invoice})),
            (
                "entity",
                object([
                    ("type", json!("invoice")),
                    ("id", json!(invoice)),
                    ("name", json!(text(r, "DocNumber").map(|n| format!("Invoice {n}")))),
                    (
                        "properties",
                        object([
                            ("status", json!(status)),
                            ("balance", json!(balance)),
                            ("dueDate", json!(text(r, "DueDate"))),
                        ]),
                    ),
                ]),
            ),
            (
                "outcome",
                object([
                    ("revenue", json!(total)),
                    ("currency", json!(currency)),
                    ("balance", json!(balance)),
                ]),
            ),
            ("source", json!({"platform": "quickbooks"})),
            (
                "properties",
                object([
                    ("docNumber", json!(text(r, "DocNumber"))),
                    ("txnDate", json!(text(r, "TxnDate"))),
                    ("dueDate", json!(text(r, "DueDate"))),
                    ("totalAmt", json!(total)),
                    ("balance", json!(balance)),
                    ("status", json!(status)),
                    ("lines", json!(r.get("Line").and_then(Value::as_array).map(Vec::len))),
                    ("syncToken", json!(text(r, "SyncToken"))),
                ]),
            ),
            ("timestamp", json!(time(r)?)),
        ]),
        record_id: id,
    })
}

fn payment(r: &Map<String, Value>) -> Result<Mapped, String> {
    let id = text(r, "Id").ok_or("`Id` is required")?;
    let total = number(r.get("TotalAmt")).ok_or("`TotalAmt` is required")?;
    let payment = format!("quickbooks:{id}");
    let invoices: Vec<Value> = r
        .get("Line")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|line| line.get("LinkedTxn")?.as_array().cloned())
        .flatten()
        .filter(|t| t.get("TxnType").and_then(Value::as_str) == Some("Invoice"))
        .filter_map(|t| {
            t.get("TxnId").and_then(Value::as_str).map(|i| json!(format!("quickbooks:{i}")))
        })
        .collect();
    Ok(Mapped {
        envelope: object([
            ("event", json!("payment.received")),
            ("actor", customer(r)),
            ("object", json!({"type": "payment", "id": payment})),
            (
                "outcome",
                object([
                    ("amount", json!(total)),
                    ("currency", json!(reference(r, "CurrencyRef"))),
                ]),
            ),
            ("source", json!({"platform": "quickbooks"})),
            (
                "properties",
                object([
                    ("totalAmt", json!(total)),
                    ("unappliedAmt", json!(number(r.get("UnappliedAmt")))),
                    ("txnDate", json!(text(r, "TxnDate"))),
                    (
                        "invoices",
                        if invoices.is_empty() { Value::Null } else { Value::Array(invoices) },
                    ),
                ]),
            ),
            ("timestamp", json!(time(r)?)),
        ]),
        record_id: id,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connectors::{map_record, parse_datetime_ms, tests::valid};

    /// Shaped like `GET /v3/company/<realm>/invoice/130` (trimmed).
    fn invoice() -> Value {
        json!({"Invoice": {
            "Id": "130",
            "SyncToken": "0",
            "domain": "QBO",
            "sparse": false,
            "MetaData": {"CreateTime": "2026-10-12T12:38:17-07:00",
                "LastUpdatedTime": "2026-10-12T12:38:17-07:00"},
            "DocNumber": "1037",
            "TxnDate": "2026-10-12",
            "DueDate": "2026-11-11",
            "CurrencyRef": {"value": "USD", "name": "United States Dollar"},
            "CustomerRef": {"value": "3", "name": "Cool Cars"},
            "BillEmail": {"Address": "cool_cars@intuit.example"},
            "BillAddr": {"Line1": "65 Ocean Dr.", "City": "Half Moon Bay"},
            "Line": [
                {"Id": "1", "LineNum": 1, "Amount": 335.0, "DetailType": "SalesItemLineDetail",
                 "Description": "Sod", "SalesItemLineDetail": {"ItemRef": {"value": "14", "name": "Sod"},
                 "UnitPrice": 5, "Qty": 67}},
                {"Amount": 335.0, "DetailType": "SubTotalLineDetail", "SubTotalLineDetail": {}}
            ],
            "TxnTaxDetail": {"TotalTax": 27.07},
            "TotalAmt": 362.07,
            "Balance": 362.07,
            "EmailStatus": "NotSet"
        }})
    }

    /// Shaped like a Payment from `SELECT * FROM Payment`.
    fn payment() -> Value {
        json!({
            "Id": "163",
            "SyncToken": "0",
            "MetaData": {"CreateTime": "2026-10-20T09:00:00-07:00"},
            "TxnDate": "2026-10-20",
            "CurrencyRef": {"value": "USD", "name": "United States Dollar"},
            "CustomerRef": {"value": "3", "name": "Cool Cars"},
            "DepositToAccountRef": {"value": "4"},
            "TotalAmt": 362.07,
            "UnappliedAmt": 0,
            "Line": [{"Amount": 362.07, "LinkedTxn": [{"TxnId": "130", "TxnType": "Invoice"}]}]
        })
    }

    #[test]
    fn invoice_maps_to_invoice_created_with_revenue() {
        let mapped = map_record("quickbooks", &invoice()).unwrap();
        assert_eq!(mapped.record_id, "130");
        let event = valid(&mapped);
        assert_eq!(event.event, "invoice.created");
        let e = &mapped.envelope;
        assert_eq!(e["outcome"], json!({"revenue": 362.07, "currency": "USD", "balance": 362.07}));
        assert_eq!(e["actor"], json!({"type": "customer", "id": "quickbooks:3"}));
        assert_eq!(e["properties"]["status"], "open");
        assert_eq!(e["entity"]["name"], "Invoice 1037");
        assert_eq!(event.timestamp, parse_datetime_ms("2026-10-12T19:38:17Z"));
        assert!(!e.to_string().contains("Ocean"));
        // The same invoice bare, as in a query response.
        let bare = map_record("quickbooks", &invoice()["Invoice"]).unwrap();
        assert_eq!(bare.envelope, mapped.envelope);
    }

    #[test]
    fn payment_maps_to_payment_received_without_revenue() {
        let mapped = map_record("quickbooks", &payment()).unwrap();
        let event = valid(&mapped);
        assert_eq!(event.event, "payment.received");
        assert_eq!(mapped.envelope["outcome"], json!({"amount": 362.07, "currency": "USD"}));
        assert_eq!(mapped.envelope["properties"]["invoices"], json!(["quickbooks:130"]));
        let wrapped = json!({"Payment": payment()});
        assert_eq!(map_record("quickbooks", &wrapped).unwrap().envelope, mapped.envelope);
    }

    #[test]
    fn invoice_without_total_is_refused_and_others_are_generic() {
        let mut i = invoice();
        i["Invoice"].as_object_mut().unwrap().remove("TotalAmt");
        assert!(map_record("quickbooks", &i).unwrap_err().contains("TotalAmt"));
        let vendor = json!({"Id": "56", "DisplayName": "Bob's Burger Joint", "Balance": 0});
        assert_eq!(
            map_record("quickbooks", &vendor).unwrap().envelope["event"],
            "quickbooks.record"
        );
    }
}
