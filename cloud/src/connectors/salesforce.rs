//! Salesforce REST API sObjects: `Lead` → `lead.created`, `Opportunity` →
//! `deal.updated`; any other sObject → `salesforce.record`.
//!
//! The type is `attributes.type`, else the id's key prefix (`00Q` Lead,
//! `006` Opportunity). Date-times come as `2024-03-01T15:04:05.000+0000`.
//! An opportunity's `Amount` is revenue once it `IsWon`, and pipeline value
//! until then. `LeadSource` and `CampaignId` become attribution.

use serde_json::{Map, Value, json};

use super::{Mapped, child, is_true, number, object, text, time_field};

fn kind(r: &Map<String, Value>, id: &str) -> Option<String> {
    child(r, "attributes").and_then(|a| text(a, "type")).or_else(|| match id.get(..3) {
        Some("00Q") => Some("Lead".into()),
        Some("006") => Some("Opportunity".into()),
        _ => None,
    })
}

fn owner(r: &Map<String, Value>) -> Value {
    text(r, "OwnerId")
        .map_or(Value::Null, |o| json!({"type": "user", "id": format!("salesforce:{o}")}))
}

fn attribution(r: &Map<String, Value>) -> Value {
    object([("source", json!(text(r, "LeadSource"))), ("campaign", json!(text(r, "CampaignId")))])
}

pub fn map(r: &Map<String, Value>) -> Result<Mapped, String> {
    let id = text(r, "Id").ok_or("`Id` is required")?;
    match kind(r, &id).as_deref() {
        Some("Lead") => lead(r, id),
        Some("Opportunity") => opportunity(r, id),
        _ => {
            let mut mapped = super::generic("salesforce", r)?;
            mapped.record_id = id;
            Ok(mapped)
        }
    }
}

fn lead(r: &Map<String, Value>, id: String) -> Result<Mapped, String> {
    let lead = format!("salesforce:{id}");
    Ok(Mapped {
        envelope: object([
            ("event", json!("lead.created")),
            ("actor", owner(r)),
            ("object", json!({"type": "lead", "id": lead})),
            (
                "entity",
                object([
                    ("type", json!("lead")),
                    ("id", json!(lead)),
                    ("name", json!(text(r, "Company"))),
                    (
                        "properties",
                        object([
                            ("status", json!(text(r, "Status"))),
                            ("industry", json!(text(r, "Industry"))),
                            ("rating", json!(text(r, "Rating"))),
                        ]),
                    ),
                ]),
            ),
            ("attribution", attribution(r)),
            (
                "source",
                object([
                    ("platform", json!("salesforce")),
                    ("campaign", json!(text(r, "CampaignId"))),
                ]),
            ),
            (
                "properties",
                object([
                    ("status", json!(text(r, "Status"))),
                    ("company", json!(text(r, "Company"))),
                    ("industry", json!(text(r, "Industry"))),
                    ("rating", json!(text(r, "Rating"))),
                    ("leadSource", json!(text(r, "LeadSource"))),
                    ("isConverted", r.get("IsConverted").cloned().unwrap_or(Value::Null)),
                    ("country", json!(text(r, "Country"))),
                    ("annualRevenue", json!(number(r.get("AnnualRevenue")))),
                ]),
            ),
            ("timestamp", json!(time_field(r, "CreatedDate")?)),
        ]),
        record_id: id,
    })
}

fn opportunity(r: &Map<String, Value>, id: String) -> Result<Mapped, String> {
    let deal = format!("salesforce:{id}");
    let amount = number(r.get("Amount"));
    let won = is_true(r.get("IsWon"));
    let currency = text(r, "CurrencyIsoCode");
    let timestamp = match time_field(r, "LastModifiedDate")? {
        Some(t) => Some(t),
        None => time_field(r, "CreatedDate")?,
    };
    Ok(Mapped {
        envelope: object([
            ("event", json!("deal.updated")),
            ("actor", owner(r)),
            ("object", json!({"type": "deal", "id": deal})),
            (
                "entity",
                object([
                    ("type", json!("deal")),
                    ("id", json!(deal)),
                    ("name", json!(text(r, "Name"))),
                    (
                        "properties",
                        object([
                            ("stage", json!(text(r, "StageName"))),
                            ("amount", json!(amount)),
                            (
                                "account",
                                json!(text(r, "AccountId").map(|a| format!("salesforce:{a}"))),
                            ),
                        ]),
                    ),
                ]),
            ),
            (
                "outcome",
                object([
                    ("revenue", json!(if won { amount } else { None })),
                    ("pipeline", json!(if won { None } else { amount })),
                    ("currency", json!(currency)),
                ]),
            ),
            ("attribution", attribution(r)),
            (
                "source",
                object([
                    ("platform", json!("salesforce")),
                    ("campaign", json!(text(r, "CampaignId"))),
                ]),
            ),
            (
                "properties",
                object([
                    ("name", json!(text(r, "Name"))),
                    ("stage", json!(text(r, "StageName"))),
                    ("amount", json!(amount)),
                    ("probability", json!(number(r.get("Probability")))),
                    ("isWon", json!(won)),
                    ("isClosed", json!(is_true(r.get("IsClosed")))),
                    ("closeDate", json!(text(r, "CloseDate"))),
                    ("type", json!(text(r, "Type"))),
                    ("forecastCategory", json!(text(r, "ForecastCategoryName"))),
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

    /// Shaped like `GET /services/data/v60.0/sobjects/Lead/<id>` (trimmed).
    fn lead() -> Value {
        json!({
            "attributes": {"type": "Lead", "url": "/services/data/v60.0/sobjects/Lead/00Q5e00000AbCdEFGH"},
            "Id": "00Q5e00000AbCdEFGH",
            "IsDeleted": false,
            "FirstName": "Sarah",
            "LastName": "Loehr",
            "Company": "Greenwich Media",
            "Title": "CFO",
            "Email": "sarah@greenwich.example",
            "Phone": "(212) 555-0123",
            "Status": "Open - Not Contacted",
            "LeadSource": "Web",
            "Industry": "Media",
            "Rating": "Warm",
            "AnnualRevenue": 1_200_000.0,
            "Country": "USA",
            "IsConverted": false,
            "OwnerId": "0055e000001AbCdAAK",
            "CreatedDate": "2026-10-01T15:04:05.000+0000",
            "LastModifiedDate": "2026-10-02T08:00:00.000+0000",
            "SystemModstamp": "2026-10-02T08:00:00.000+0000"
        })
    }

    /// Shaped like `GET /services/data/v60.0/sobjects/Opportunity/<id>`.
    fn opportunity() -> Value {
        json!({
            "attributes": {"type": "Opportunity", "url": "/services/data/v60.0/sobjects/Opportunity/0065e00000XyZabAAB"},
            "Id": "0065e00000XyZabAAB",
            "AccountId": "0015e00000Qwerty1AAB",
            "Name": "Greenwich Media - 500 seats",
            "StageName": "Closed Won",
            "Amount": 25000.0,
            "Probability": 100.0,
            "CloseDate": "2026-10-30",
            "Type": "New Customer",
            "LeadSource": "Partner Referral",
            "IsClosed": true,
            "IsWon": true,
            "ForecastCategoryName": "Closed",
            "CampaignId": "7015e000000ABCDAA4",
            "OwnerId": "0055e000001AbCdAAK",
            "CreatedDate": "2026-09-01T10:00:00.000+0000",
            "LastModifiedDate": "2026-10-30T17:45:12.000+0000"
        })
    }

    #[test]
    fn lead_maps_to_lead_created_without_contact_details() {
        let mapped = map_record("salesforce", &lead()).unwrap();
        assert_eq!(mapped.record_id, "00Q5e00000AbCdEFGH");
        let event = valid(&mapped);
        assert_eq!(event.event, "lead.created");
        let e = &mapped.envelope;
        assert_eq!(e["object"], json!({"type": "lead", "id": "salesforce:00Q5e00000AbCdEFGH"}));
        assert_eq!(e["actor"], json!({"type": "user", "id": "salesforce:0055e000001AbCdAAK"}));
        assert_eq!(e["attribution"], json!({"source": "Web"}));
        assert_eq!(e["properties"]["status"], "Open - Not Contacted");
        assert_eq!(event.timestamp, parse_datetime_ms("2026-10-01T15:04:05Z"));
        let text = e.to_string();
        assert!(!text.contains("sarah") && !text.contains("555-0123") && !text.contains("Loehr"));
    }

    #[test]
    fn won_opportunity_maps_to_deal_updated_with_revenue() {
        let mapped = map_record("salesforce", &opportunity()).unwrap();
        let event = valid(&mapped);
        assert_eq!(event.event, "deal.updated");
        let e = &mapped.envelope;
        assert_eq!(e["outcome"], json!({"revenue": 25000.0}));
        assert_eq!(
            e["attribution"],
            json!({"source": "Partner Referral", "campaign": "7015e000000ABCDAA4"})
        );
        assert_eq!(e["properties"]["stage"], "Closed Won");
        assert_eq!(event.timestamp, parse_datetime_ms("2026-10-30T17:45:12Z"));

        let mut open = opportunity();
        open["IsWon"] = json!(false);
        open["IsClosed"] = json!(false);
        open["StageName"] = json!("Negotiation/Review");
        let mapped = map_record("salesforce", &open).unwrap();
        assert_eq!(mapped.envelope["outcome"], json!({"pipeline": 25000.0}));
    }

    #[test]
    fn type_from_the_id_prefix_and_other_sobjects_are_generic() {
        let mut bare = lead();
        bare.as_object_mut().unwrap().remove("attributes");
        assert_eq!(map_record("salesforce", &bare).unwrap().envelope["event"], "lead.created");
        let account = json!({"attributes": {"type": "Account"}, "Id": "0015e00000Qwerty1AAB",
            "Name": "Greenwich Media"});
        let mapped = map_record("salesforce", &account).unwrap();
        assert_eq!(mapped.envelope["event"], "salesforce.record");
        assert_eq!(mapped.record_id, "0015e00000Qwerty1AAB");
        assert!(map_record("salesforce", &json!({"Name": "x"})).unwrap_err().contains("Id"));
    }
}
