//! Shopify Admin API `Order` → `order.created`.
//!
//! Revenue is `total_price` in the shop currency, or 0 once the order is
//! cancelled, voided or refunded (a re-sync brings that change in). UTM
//! parameters of `landing_site` become attribution.

use serde_json::{Map, Value, json};

use super::{Mapped, child, id_of, number, object, text, time_field, utm_params};

pub fn map(r: &Map<String, Value>) -> Result<Mapped, String> {
    let id = id_of(r.get("id")).ok_or("`id` is required")?;
    let total = number(r.get("total_price")).ok_or("`total_price` (a decimal) is required")?;
    let currency = text(r, "currency");
    let financial = text(r, "financial_status");
    let cancelled = r.get("cancelled_at").is_some_and(|v| !v.is_null());
    let refunded = matches!(financial.as_deref(), Some("refunded" | "voided"));
    let revenue = if cancelled || refunded { 0.0 } else { total };
    let customer = child(r, "customer").and_then(|c| id_of(c.get("id")));
    let items: Vec<&Value> =
        r.get("line_items").and_then(Value::as_array).into_iter().flatten().collect();
    let quantity: f64 = items.iter().filter_map(|i| number(i.get("quantity"))).sum();
    let mut utm = r.get("landing_site").and_then(Value::as_str).map(utm_params).unwrap_or_default();
    if !utm.is_empty() {
        utm.insert("revenue".into(), json!(revenue));
    }
    let order = format!("shopify:{id}");
    Ok(Mapped {
        envelope: object([
            ("event", json!("order.created")),
            (
                "actor",
                customer.map_or(
                    Value::Null,
                    |c| json!({"type": "customer", "id": format!("shopify:{c}")}),
                ),
            ),
            ("object", json!({"type": "order", "id": order})),
            (
                "entity",
                object([
                    ("type", json!("order")),
                    ("id", json!(order)),
                    ("name", json!(text(r, "name"))),
                    (
                        "properties",
                        object([
                            ("financialStatus", json!(financial)),
                            ("fulfillmentStatus", json!(text(r, "fulfillment_status"))),
                            ("totalPrice", json!(total)),
                            ("currency", json!(currency)),
                        ]),
                    ),
                ]),
            ),
            ("outcome", object([("revenue", json!(revenue)), ("currency", json!(currency))])),
            ("attribution", if utm.is_empty() { Value::Null } else { Value::Object(utm.clone()) }),
            (
                "source",
                object([
                    ("platform", json!("shopify")),
                    ("channel", json!(text(r, "source_name"))),
                    ("campaign", utm.get("campaign").cloned().unwrap_or(Value::Null)),
                ]),
            ),
            (
                "properties",
                object([
                    ("orderNumber", r.get("order_number").cloned().unwrap_or(Value::Null)),
                    ("name", json!(text(r, "name"))),
                    ("subtotalPrice", json!(number(r.get("subtotal_price")))),
                    ("totalTax", json!(number(r.get("total_tax")))),
                    ("totalDiscounts", json!(number(r.get("total_discounts")))),
                    ("financialStatus", json!(financial)),
                    ("fulfillmentStatus", json!(text(r, "fulfillment_status"))),
                    ("lineItems", json!(items.len())),
                    ("quantity", json!(quantity)),
                    ("cancelledAt", json!(text(r, "cancelled_at"))),
                    ("test", r.get("test").cloned().unwrap_or(Value::Null)),
                ]),
            ),
            ("timestamp", json!(time_field(r, "created_at")?)),
        ]),
        record_id: id,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connectors::{map_record, parse_datetime_ms, tests::valid};

    /// Shaped like the Admin REST API's Order resource (trimmed).
    fn order() -> Value {
        json!({
            "id": 450789469,
            "admin_graphql_api_id": "gid://shopify/Order/450789469",
            "order_number": 1001,
            "name": "#1001",
            "email": "bob.norman@mail.example.com",
            "created_at": "2026-10-12T11:00:00-05:00",
            "updated_at": "2026-10-12T11:05:00-05:00",
            "cancelled_at": null,
            "currency": "USD",
            "presentment_currency": "USD",
            "subtotal_price": "597.00",
            "total_discounts": "10.00",
            "total_tax": "11.94",
            "total_price": "598.94",
            "financial_status": "paid",
            "fulfillment_status": null,
            "source_name": "web",
            "landing_site": "/products/ipod?utm_source=newsletter&utm_medium=email&utm_campaign=fall%20launch",
            "referring_site": "https://mail.example.com/",
            "test": false,
            "customer": {"id": 207119551, "email": "bob.norman@mail.example.com",
                "first_name": "Bob", "last_name": "Norman"},
            "line_items": [
                {"id": 466157049, "title": "IPod Nano - 8gb", "quantity": 1, "price": "199.00",
                 "sku": "IPOD2008GREEN"},
                {"id": 518995019, "title": "IPod Nano - 8gb", "quantity": 2, "price": "199.00",
                 "sku": "IPOD2008RED"}
            ],
            "shipping_address": {"address1": "Chestnut Street 92", "city": "Louisville"}
        })
    }

    #[test]
    fn order_maps_to_order_created_with_revenue_and_attribution() {
        let mapped = map_record("shopify", &order()).unwrap();
        assert_eq!(mapped.record_id, "450789469");
        let event = valid(&mapped);
        assert_eq!(event.event, "order.created");
        let e = &mapped.envelope;
        assert_eq!(e["outcome"], json!({"revenue": 598.94, "currency": "USD"}));
        assert_eq!(e["actor"], json!({"type": "customer", "id": "shopify:207119551"}));
        assert_eq!(e["object"], json!({"type": "order", "id": "shopify:450789469"}));
        assert_eq!(e["entity"]["name"], "#1001");
        assert_eq!(
            e["attribution"],
            json!({"source": "newsletter", "medium": "email", "campaign": "fall launch", "revenue": 598.94})
        );
        assert_eq!(
            e["source"],
            json!({"platform": "shopify", "channel": "web", "campaign": "fall launch"})
        );
        assert_eq!(e["properties"]["quantity"], json!(3.0));
        assert_eq!(e["properties"]["lineItems"], json!(2));
        assert_eq!(event.timestamp, parse_datetime_ms("2026-10-12T16:00:00Z"));
        // Contact details stay in Shopify.
        let text = e.to_string();
        assert!(!text.contains("bob.norman") && !text.contains("Chestnut"), "{text}");
    }

    #[test]
    fn cancelled_order_carries_no_revenue() {
        let mut o = order();
        o["cancelled_at"] = json!("2026-10-13T09:00:00-05:00");
        o["financial_status"] = json!("voided");
        let mapped = map_record("shopify", &o).unwrap();
        assert_eq!(mapped.envelope["outcome"]["revenue"], json!(0.0));
    }

    #[test]
    fn order_without_total_is_refused() {
        let mut o = order();
        o.as_object_mut().unwrap().remove("total_price");
        assert!(map_record("shopify", &o).unwrap_err().contains("total_price"));
    }
}
