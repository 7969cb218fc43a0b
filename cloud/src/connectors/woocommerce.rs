//! WooCommerce REST API (v3) order → `order.created`.
//!
//! Revenue is `total` for orders that are paid or being paid (`processing`,
//! `completed`, `on-hold`), otherwise 0. The event time is
//! `date_created_gmt` (UTC without an offset), else `date_created`. Order
//! attribution (WooCommerce 8.5+) is read from the `_wc_order_attribution_*`
//! meta data.

use serde_json::{Map, Value, json};

use super::{Mapped, id_of, number, object, text, time_field};

const PAID: [&str; 3] = ["processing", "completed", "on-hold"];

fn meta(r: &Map<String, Value>, key: &str) -> Option<String> {
    r.get("meta_data")?
        .as_array()?
        .iter()
        .find(|m| m.get("key").and_then(Value::as_str) == Some(key))
        .and_then(|m| id_of(m.get("value")))
}

pub fn map(r: &Map<String, Value>) -> Result<Mapped, String> {
    let id = id_of(r.get("id")).ok_or("`id` is required")?;
    let total = number(r.get("total")).ok_or("`total` (a decimal) is required")?;
    let status = text(r, "status");
    let revenue = if status.as_deref().is_some_and(|s| PAID.contains(&s)) { total } else { 0.0 };
    let currency = text(r, "currency");
    let customer = id_of(r.get("customer_id")).filter(|c| c != "0");
    let items: Vec<&Value> =
        r.get("line_items").and_then(Value::as_array).into_iter().flatten().collect();
    let quantity: f64 = items.iter().filter_map(|i| number(i.get("quantity"))).sum();
    let attr = |k: &str| json!(meta(r, &format!("_wc_order_attribution_{k}")));
    let attribution = object([
        ("source", attr("utm_source")),
        ("medium", attr("utm_medium")),
        ("campaign", attr("utm_campaign")),
        ("sourceType", attr("source_type")),
    ]);
    let attribution = match attribution {
        Value::Object(mut a) => {
            a.insert("revenue".into(), json!(revenue));
            Value::Object(a)
        }
        other => other,
    };
    let timestamp = match time_field(r, "date_created_gmt")? {
        Some(t) => Some(t),
        None => time_field(r, "date_created")?,
    };
    let order = format!("woocommerce:{id}");
    Ok(Mapped {
        envelope: object([
            ("event", json!("order.created")),
            (
                "actor",
                customer.map_or(
                    Value::Null,
                    |c| json!({"type": "customer", "id": format!("woocommerce:{c}")}),
                ),
            ),
            ("object", json!({"type": "order", "id": order})),
            (
                "entity",
                object([
                    ("type", json!("order")),
                    ("id", json!(order)),
                    ("name", json!(text(r, "number").map(|n| format!("#{n}")))),
                    (
                        "properties",
                        object([
                            ("status", json!(status)),
                            ("total", json!(total)),
                            ("currency", json!(currency)),
                        ]),
                    ),
                ]),
            ),
            ("outcome", object([("revenue", json!(revenue)), ("currency", json!(currency))])),
            ("attribution", attribution.clone()),
            (
                "source",
                object([
                    ("platform", json!("woocommerce")),
                    ("channel", json!(text(r, "created_via"))),
                    ("campaign", attribution.get("campaign").cloned().unwrap_or(Value::Null)),
                ]),
            ),
            (
                "properties",
                object([
                    ("number", json!(text(r, "number"))),
                    ("status", json!(status)),
                    ("totalTax", json!(number(r.get("total_tax")))),
                    ("discountTotal", json!(number(r.get("discount_total")))),
                    ("shippingTotal", json!(number(r.get("shipping_total")))),
                    ("paymentMethod", json!(text(r, "payment_method"))),
                    ("lineItems", json!(items.len())),
                    ("quantity", json!(quantity)),
                ]),
            ),
            ("timestamp", json!(timestamp)),
        ]),
        record_id: id,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connectors::{map_record, parse_datetime_ms, tests::valid};

    /// Shaped like `GET /wp-json/wc/v3/orders/<id>` (trimmed).
    fn order() -> Value {
        json!({
            "id": 727,
            "parent_id": 0,
            "number": "727",
            "order_key": "wc_order_58d2d042d1d",
            "created_via": "checkout",
            "version": "8.6.1",
            "status": "processing",
            "currency": "EUR",
            "date_created": "2026-10-22T16:28:02",
            "date_created_gmt": "2026-10-22T19:28:02",
            "discount_total": "0.00",
            "shipping_total": "10.00",
            "total": "29.35",
            "total_tax": "1.35",
            "customer_id": 0,
            "billing": {"first_name": "John", "last_name": "Doe", "email": "john.doe@example.com",
                "phone": "(555) 555-5555", "address_1": "969 Market"},
            "payment_method": "bacs",
            "payment_method_title": "Direct Bank Transfer",
            "line_items": [
                {"id": 315, "name": "Woo Single #1", "product_id": 93, "quantity": 2,
                 "subtotal": "6.00", "total": "6.00", "sku": ""},
                {"id": 316, "name": "Ship Your Idea", "product_id": 22, "quantity": 1,
                 "subtotal": "12.00", "total": "12.00", "sku": ""}
            ],
            "meta_data": [
                {"id": 13106, "key": "_wc_order_attribution_source_type", "value": "utm"},
                {"id": 13107, "key": "_wc_order_attribution_utm_source", "value": "facebook"},
                {"id": 13108, "key": "_wc_order_attribution_utm_medium", "value": "cpc"},
                {"id": 13109, "key": "_wc_order_attribution_utm_campaign", "value": "black-friday"}
            ]
        })
    }

    #[test]
    fn order_maps_with_gmt_time_and_attribution_meta() {
        let mapped = map_record("woocommerce", &order()).unwrap();
        assert_eq!(mapped.record_id, "727");
        let event = valid(&mapped);
        assert_eq!(event.event, "order.created");
        let e = &mapped.envelope;
        assert_eq!(e["outcome"], json!({"revenue": 29.35, "currency": "EUR"}));
        assert!(e.get("actor").is_none(), "guest checkout has no customer");
        assert_eq!(
            e["attribution"],
            json!({"source": "facebook", "medium": "cpc", "campaign": "black-friday",
                "sourceType": "utm", "revenue": 29.35})
        );
        assert_eq!(e["properties"]["quantity"], json!(3.0));
        assert_eq!(e["entity"]["name"], "#727");
        assert_eq!(event.timestamp, parse_datetime_ms("2026-10-22T19:28:02Z"));
        assert!(!e.to_string().contains("john.doe"));
    }

    #[test]
    fn unpaid_statuses_carry_no_revenue_and_customers_are_actors() {
        let mut o = order();
        o["status"] = json!("cancelled");
        o["customer_id"] = json!(12);
        let mapped = map_record("woocommerce", &o).unwrap();
        assert_eq!(mapped.envelope["outcome"]["revenue"], json!(0.0));
        assert_eq!(mapped.envelope["actor"], json!({"type": "customer", "id": "woocommerce:12"}));
    }

    #[test]
    fn unreadable_date_is_refused() {
        let mut o = order();
        o["date_created_gmt"] = json!("22/10/2026");
        assert!(map_record("woocommerce", &o).unwrap_err().contains("date_created_gmt"));
    }
}
