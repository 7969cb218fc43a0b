//! HubSpot CRM v3 objects: a contact → `lead.created`, a deal →
//! `deal.updated`; other objects → `hubspot.record`.
//!
//! v3 answers carry no type, so it is taken from an `objectType` field when
//! the sync adds one (`contacts`, `deals`, or the ids `0-1`, `0-3`), else
//! from the properties (`dealname`/`dealstage` make a deal, `email`/
//! `lifecyclestage` a contact). Property values are strings, as HubSpot
//! sends them. A deal's `amount` is revenue once closed won, pipeline value
//! until then.

use serde_json::{Map, Value, json};

use super::{Mapped, child, id_of, is_true, number, object, text, time_field};

#[derive(Debug, PartialEq, Eq)]
enum Kind {
    Contact,
    Deal,
    Other,
}

fn kind(r: &Map<String, Value>, props: &Map<String, Value>) -> Kind {
    let declared = ["objectType", "objectTypeId"].iter().find_map(|k| text(r, k));
    match declared.as_deref() {
        Some("contact" | "contacts" | "0-1") => Kind::Contact,
        Some("deal" | "deals" | "0-3") => Kind::Deal,
        Some(_) => Kind::Other,
        None if props.contains_key("dealname") || props.contains_key("dealstage") => Kind::Deal,
        None if props.contains_key("email") || props.contains_key("lifecyclestage") => {
            Kind::Contact
        }
        None => Kind::Other,
    }
}

/// Event time: the first of `keys` found on the object or in its properties.
fn time(
    r: &Map<String, Value>,
    props: &Map<String, Value>,
    keys: &[&str],
) -> Result<Option<i64>, String> {
    for key in keys {
        if let Some(t) = time_field(r, key)? {
            return Ok(Some(t));
        }
        if let Some(t) = time_field(props, key)? {
            return Ok(Some(t));
        }
    }
    Ok(None)
}

fn owner(props: &Map<String, Value>) -> Value {
    text(props, "hubspot_owner_id")
        .map_or(Value::Null, |o| json!({"type": "user", "id": format!("hubspot:{o}")}))
}

fn attribution(props: &Map<String, Value>) -> Value {
    object([
        ("source", json!(text(props, "hs_analytics_source").map(|s| s.to_ascii_lowercase()))),
        ("campaign", json!(text(props, "hs_analytics_first_touch_converting_campaign"))),
    ])
}

pub fn map(r: &Map<String, Value>) -> Result<Mapped, String> {
    let id = id_of(r.get("id")).ok_or("`id` is required")?;
    let empty = Map::new();
    let props = child(r, "properties").unwrap_or(&empty);
    match kind(r, props) {
        Kind::Contact => contact(r, props, id),
        Kind::Deal => deal(r, props, id),
        Kind::Other => super::generic("hubspot", r),
    }
}

fn contact(
    r: &Map<String, Value>,
    props: &Map<String, Value>,
    id: String,
) -> Result<Mapped, String> {
    let contact = format!("hubspot:{id}");
    Ok(Mapped {
        envelope: object([
            ("event", json!("lead.created")),
            ("actor", owner(props)),
            ("object", json!({"type": "contact", "id": contact})),
            (
                "entity",
                object([
                    ("type", json!("contact")),
                    ("id", json!(contact)),
                    ("name", json!(text(props, "company"))),
                    (
                        "properties",
                        object([
                            ("lifecycleStage", json!(text(props, "lifecyclestage"))),
                            ("leadStatus", json!(text(props, "hs_lead_status"))),
                        ]),
                    ),
                ]),
            ),
            ("attribution", attribution(props)),
            ("source", json!({"platform": "hubspot"})),
            (
                "properties",
                object([
                    ("lifecycleStage", json!(text(props, "lifecyclestage"))),
                    ("leadStatus", json!(text(props, "hs_lead_status"))),
                    ("company", json!(text(props, "company"))),
                    ("analyticsSource", json!(text(props, "hs_analytics_source"))),
                    ("analyticsSourceDetail", json!(text(props, "hs_analytics_source_data_1"))),
                    ("archived", r.get("archived").cloned().unwrap_or(Value::Null)),
                ]),
            ),
            ("timestamp", json!(time(r, props, &["createdAt", "createdate"])?)),
        ]),
        record_id: id,
    })
}

fn deal(r: &Map<String, Value>, props: &Map<String, Value>, id: String) -> Result<Mapped, String> {
    let deal = format!("hubspot:{id}");
    let amount = number(props.get("amount"));
    let won = is_true(props.get("hs_is_closed_won"))
        || text(props, "dealstage").as_deref() == Some("closedwon");
    Ok(Mapped {
        envelope: object([
            ("event", json!("deal.updated")),
            ("actor", owner(props)),
            ("object", json!({"type": "deal", "id": deal})),
            (
                "entity",
                object([
                    ("type", json!("deal")),
                    ("id", json!(deal)),
                    ("name", json!(text(props, "dealname"))),
                    (
                        "properties",
                        object([
                            ("stage", json!(text(props, "dealstage"))),
                            ("amount", json!(amount)),
                        ]),
                    ),
                ]),
            ),
            (
                "outcome",
                object([
                    ("revenue", json!(if won { amount } else { None })),
                    ("pipeline", json!(if won { None } else { amount })),
                    ("currency", json!(text(props, "deal_currency_code"))),
                ]),
            ),
            ("attribution", attribution(props)),
            ("source", json!({"platform": "hubspot"})),
            (
                "properties",
                object([
                    ("name", json!(text(props, "dealname"))),
                    ("stage", json!(text(props, "dealstage"))),
                    ("pipeline", json!(text(props, "pipeline"))),
                    ("amount", json!(amount)),
                    ("closeDate", json!(text(props, "closedate"))),
                    ("isClosedWon", json!(won)),
                    ("archived", r.get("archived").cloned().unwrap_or(Value::Null)),
                ]),
            ),
            (
                "timestamp",
                json!(time(r, props, &["updatedAt", "hs_lastmodifieddate", "createdate"])?),
            ),
        ]),
        record_id: id,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connectors::{map_record, parse_datetime_ms, tests::valid};

    /// Shaped like `GET /crm/v3/objects/contacts/<id>` with properties.
    fn contact() -> Value {
        json!({
            "id": "512",
            "properties": {
                "createdate": "2026-10-05T10:00:00.000Z",
                "email": "maria@acme.example",
                "firstname": "Maria",
                "lastname": "Johnson",
                "company": "Acme Corp",
                "phone": "+1 555 0100",
                "lifecyclestage": "lead",
                "hs_lead_status": "NEW",
                "hs_analytics_source": "PAID_SEARCH",
                "hs_analytics_source_data_1": "google",
                "hs_analytics_first_touch_converting_campaign": "q4-brand",
                "hs_object_id": "512",
                "hubspot_owner_id": "41629779",
                "lastmodifieddate": "2026-10-06T08:30:00.000Z"
            },
            "createdAt": "2026-10-05T10:00:00.000Z",
            "updatedAt": "2026-10-06T08:30:00.000Z",
            "archived": false
        })
    }

    /// Shaped like `GET /crm/v3/objects/deals/<id>` with properties.
    fn deal() -> Value {
        json!({
            "id": "1467",
            "properties": {
                "amount": "1500.00",
                "closedate": "2026-11-01T00:00:00Z",
                "createdate": "2026-10-10T09:00:00.000Z",
                "dealname": "Acme - annual plan",
                "dealstage": "closedwon",
                "pipeline": "default",
                "deal_currency_code": "USD",
                "hs_is_closed_won": "true",
                "hs_lastmodifieddate": "2026-11-01T12:00:00.000Z",
                "hs_object_id": "1467",
                "hubspot_owner_id": "41629779"
            },
            "createdAt": "2026-10-10T09:00:00.000Z",
            "updatedAt": "2026-11-01T12:00:00.000Z",
            "archived": false
        })
    }

    #[test]
    fn contact_maps_to_lead_created() {
        let mapped = map_record("hubspot", &contact()).unwrap();
        assert_eq!(mapped.record_id, "512");
        let event = valid(&mapped);
        assert_eq!(event.event, "lead.created");
        let e = &mapped.envelope;
        assert_eq!(e["object"], json!({"type": "contact", "id": "hubspot:512"}));
        assert_eq!(e["attribution"], json!({"source": "paid_search", "campaign": "q4-brand"}));
        assert_eq!(e["properties"]["lifecycleStage"], "lead");
        assert_eq!(event.timestamp, parse_datetime_ms("2026-10-05T10:00:00Z"));
        let text = e.to_string();
        assert!(!text.contains("maria@") && !text.contains("Johnson") && !text.contains("0100"));
    }

    #[test]
    fn closed_won_deal_maps_to_deal_updated_with_revenue() {
        let mapped = map_record("hubspot", &deal()).unwrap();
        let event = valid(&mapped);
        assert_eq!(event.event, "deal.updated");
        assert_eq!(mapped.envelope["outcome"], json!({"revenue": 1500.0, "currency": "USD"}));
        assert_eq!(mapped.envelope["entity"]["name"], "Acme - annual plan");
        assert_eq!(event.timestamp, parse_datetime_ms("2026-11-01T12:00:00Z"));
        let mut open = deal();
        open["properties"]["dealstage"] = json!("contractsent");
        open["properties"]["hs_is_closed_won"] = json!("false");
        let mapped = map_record("hubspot", &open).unwrap();
        assert_eq!(mapped.envelope["outcome"], json!({"pipeline": 1500.0, "currency": "USD"}));
    }

    #[test]
    fn declared_type_wins_and_unknown_objects_are_generic() {
        let mut c = deal();
        c["objectType"] = json!("contacts");
        assert_eq!(map_record("hubspot", &c).unwrap().envelope["event"], "lead.created");
        let ticket = json!({"id": "77", "objectType": "tickets", "properties": {"subject": "x"}});
        assert_eq!(map_record("hubspot", &ticket).unwrap().envelope["event"], "hubspot.record");
    }
}
