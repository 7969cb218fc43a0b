//! Google Ads API `GoogleAdsRow` (from `GoogleAdsService.SearchStream`, a
//! campaign or ad group query segmented by `segments.date`) → `ad.spend`.
//!
//! Field names are read in the REST spelling (`costMicros`) and the client
//! libraries' (`cost_micros`); int64 values arrive as strings. A row has no
//! id of its own: its record id is `{customer}/{campaign}[/{adGroup}]/{date}`,
//! so a re-sync of the same day replaces that day's numbers. Spend is
//! `costMicros / 1e6` in the account currency. The platform's conversion
//! value is kept as a property, not as revenue, so that it is never counted
//! beside the orders it claims.

use serde_json::{Map, Value, json};

use super::{Mapped, either, id_of, number, object, parse_datetime_ms};

fn part<'a>(r: &'a Map<String, Value>, snake: &str, camel: &str) -> Option<&'a Map<String, Value>> {
    either(r, &[camel, snake]).and_then(Value::as_object)
}

fn field(map: Option<&Map<String, Value>>, keys: &[&str]) -> Option<Value> {
    map.and_then(|m| either(m, keys)).cloned()
}

/// Channel names of `advertisingChannelType`.
fn channel(kind: Option<&str>) -> String {
    match kind {
        Some("SEARCH") => "paid_search".into(),
        Some("DISPLAY") => "display".into(),
        Some("VIDEO") => "video".into(),
        Some("SHOPPING") => "shopping".into(),
        Some("PERFORMANCE_MAX") => "performance_max".into(),
        Some(other) => other.to_ascii_lowercase(),
        None => "paid_search".into(),
    }
}

pub fn map(r: &Map<String, Value>) -> Result<Mapped, String> {
    let campaign = part(r, "campaign", "campaign").ok_or("`campaign` is required")?;
    let metrics = part(r, "metrics", "metrics").ok_or("`metrics` is required")?;
    let segments = part(r, "segments", "segments");
    let customer = part(r, "customer", "customer");
    let ad_group = part(r, "ad_group", "adGroup");

    let campaign_id = id_of(campaign.get("id")).ok_or("`campaign.id` is required")?;
    let resource = campaign.get("resourceName").or_else(|| campaign.get("resource_name"));
    let customer_id = customer
        .and_then(|c| id_of(c.get("id")))
        .or_else(|| {
            let name = resource?.as_str()?;
            name.strip_prefix("customers/")?.split('/').next().map(str::to_owned)
        })
        .ok_or("`customer.id` or `campaign.resourceName` is required")?;
    let date = segments
        .and_then(|s| s.get("date"))
        .and_then(Value::as_str)
        .ok_or("`segments.date` is required: rows must be segmented by day")?;
    let day = parse_datetime_ms(date)
        .filter(|_| date.len() == 10)
        .ok_or_else(|| format!("`segments.date` must be YYYY-MM-DD, not {date:?}"))?;
    let ad_group_id = ad_group.and_then(|g| id_of(g.get("id")));

    let cost_micros = number(either(metrics, &["costMicros", "cost_micros"])).unwrap_or(0.0);
    let spend = (cost_micros / 10_000.0).round() / 100.0;
    let currency = customer.and_then(|c| either(c, &["currencyCode", "currency_code"])).cloned();
    let name = field(Some(campaign), &["name"]);
    let channel = channel(
        either(campaign, &["advertisingChannelType", "advertising_channel_type"])
            .and_then(Value::as_str),
    );
    let metric = |keys: &[&str]| json!(number(either(metrics, keys)));

    let record_id = match &ad_group_id {
        Some(g) => format!("{customer_id}/{campaign_id}/{g}/{date}"),
        None => format!("{customer_id}/{campaign_id}/{date}"),
    };
    Ok(Mapped {
        envelope: object([
            ("event", json!("ad.spend")),
            ("actor", json!({"type": "ad_account", "id": format!("google_ads:{customer_id}")})),
            ("object", json!({"type": "campaign", "id": format!("google_ads:{campaign_id}")})),
            (
                "entity",
                object([
                    ("type", json!("campaign")),
                    ("id", json!(format!("google_ads:{campaign_id}"))),
                    ("name", name.clone().unwrap_or(Value::Null)),
                    (
                        "properties",
                        object([(
                            "status",
                            field(Some(campaign), &["status"]).unwrap_or(Value::Null),
                        )]),
                    ),
                ]),
            ),
            (
                "attribution",
                object([
                    ("source", json!("google")),
                    ("medium", json!("cpc")),
                    ("channel", json!(channel)),
                    ("campaign", name.clone().unwrap_or(Value::Null)),
                    ("campaignId", json!(campaign_id)),
                ]),
            ),
            (
                "source",
                object([
                    ("platform", json!("google_ads")),
                    ("channel", json!(channel)),
                    ("campaign", name.unwrap_or(Value::Null)),
                ]),
            ),
            (
                "properties",
                object([
                    ("date", json!(date)),
                    ("spend", json!(spend)),
                    ("currency", currency.unwrap_or(Value::Null)),
                    ("impressions", metric(&["impressions"])),
                    ("clicks", metric(&["clicks"])),
                    ("conversions", metric(&["conversions"])),
                    ("conversionValue", metric(&["conversionsValue", "conversions_value"])),
                    ("adGroupId", json!(ad_group_id)),
                    ("campaignStatus", field(Some(campaign), &["status"]).unwrap_or(Value::Null)),
                ]),
            ),
            ("timestamp", json!(day)),
        ]),
        record_id,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connectors::{map_record, tests::valid};

    /// A `SearchStream` result row in REST JSON for
    /// `SELECT customer.id, customer.currency_code, campaign.id, campaign.name,
    /// campaign.status, campaign.advertising_channel_type, metrics.*,
    /// segments.date FROM campaign`.
    fn row() -> Value {
        json!({
            "customer": {"resourceName": "customers/1234567890", "id": "1234567890",
                "currencyCode": "USD"},
            "campaign": {"resourceName": "customers/1234567890/campaigns/17755443322",
                "id": "17755443322", "name": "Brand - Search", "status": "ENABLED",
                "advertisingChannelType": "SEARCH"},
            "metrics": {"clicks": "120", "impressions": "5400", "costMicros": "45670000",
                "conversions": 7.0, "conversionsValue": 820.5, "ctr": 0.0222,
                "averageCpc": "380583.33"},
            "segments": {"date": "2026-11-01"}
        })
    }

    #[test]
    fn campaign_row_maps_to_ad_spend_with_campaign_attribution() {
        let mapped = map_record("google_ads", &row()).unwrap();
        assert_eq!(mapped.record_id, "1234567890/17755443322/2026-11-01");
        let event = valid(&mapped);
        assert_eq!(event.event, "ad.spend");
        let e = &mapped.envelope;
        assert_eq!(e["properties"]["spend"], json!(45.67));
        assert_eq!(e["properties"]["currency"], "USD");
        assert_eq!(e["properties"]["clicks"], json!(120.0));
        assert_eq!(e["properties"]["conversionValue"], json!(820.5));
        assert_eq!(
            e["attribution"],
            json!({"source": "google", "medium": "cpc", "channel": "paid_search",
                "campaign": "Brand - Search", "campaignId": "17755443322"})
        );
        assert!(e.get("outcome").is_none(), "conversion value is not revenue");
        assert_eq!(event.timestamp, crate::connectors::parse_datetime_ms("2026-11-01"));
    }

    #[test]
    fn snake_case_rows_and_ad_groups_key_separately() {
        let row = json!({
            "campaign": {"resource_name": "customers/99/campaigns/5", "id": 5, "name": "PMax",
                "advertising_channel_type": "PERFORMANCE_MAX"},
            "ad_group": {"id": 77},
            "metrics": {"cost_micros": 1_500_000, "clicks": 3},
            "segments": {"date": "2026-11-02"}
        });
        let mapped = map_record("google_ads", &row).unwrap();
        assert_eq!(mapped.record_id, "99/5/77/2026-11-02");
        assert_eq!(mapped.envelope["properties"]["spend"], json!(1.5));
        assert_eq!(mapped.envelope["source"]["channel"], "performance_max");
    }

    #[test]
    fn rows_without_a_day_are_refused() {
        let mut r = row();
        r.as_object_mut().unwrap().remove("segments");
        assert!(map_record("google_ads", &r).unwrap_err().contains("segments.date"));
        r["segments"] = json!({"date": "2026-11-01T00:00:00Z"});
        assert!(map_record("google_ads", &r).is_err());
    }
}
