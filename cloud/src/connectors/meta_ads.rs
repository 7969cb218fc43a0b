//! Meta Marketing API insights row (`GET /act_<id>/insights` at campaign,
//! ad set or ad level with `time_increment=1`) → `ad.spend`.
//!
//! Numbers arrive as strings. The record id is
//! `{account_id}/{ad_id | adset_id | campaign_id}/{date_start}`, plus
//! `date_stop` when the row spans more than a day, so a re-sync of the same
//! window replaces it. Purchases and their value come from `actions` and
//! `action_values` and stay properties, not revenue (as for Google Ads).

use serde_json::{Map, Value, json};

use super::{Mapped, number, object, parse_datetime_ms, text};

/// Action types that are purchases, in the order Meta prefers them.
const PURCHASE: [&str; 3] = ["omni_purchase", "purchase", "offsite_conversion.fb_pixel_purchase"];

fn action(r: &Map<String, Value>, list: &str) -> Option<f64> {
    let actions = r.get(list)?.as_array()?;
    PURCHASE.iter().find_map(|kind| {
        actions
            .iter()
            .find(|a| a.get("action_type").and_then(Value::as_str) == Some(*kind))
            .and_then(|a| number(a.get("value")))
    })
}

pub fn map(r: &Map<String, Value>) -> Result<Mapped, String> {
    let account = text(r, "account_id").ok_or("`account_id` is required")?;
    let campaign = text(r, "campaign_id").ok_or("`campaign_id` is required")?;
    let start = text(r, "date_start").ok_or("`date_start` is required")?;
    let day = parse_datetime_ms(&start)
        .filter(|_| start.len() == 10)
        .ok_or_else(|| format!("`date_start` must be YYYY-MM-DD, not {start:?}"))?;
    let stop = text(r, "date_stop").filter(|s| *s != start);
    let level_id =
        ["ad_id", "adset_id"].iter().find_map(|k| text(r, k)).unwrap_or_else(|| campaign.clone());
    let record_id = match &stop {
        Some(stop) => format!("{account}/{level_id}/{start}/{stop}"),
        None => format!("{account}/{level_id}/{start}"),
    };
    let name = text(r, "campaign_name");
    let spend = number(r.get("spend")).unwrap_or(0.0);
    Ok(Mapped {
        envelope: object([
            ("event", json!("ad.spend")),
            ("actor", json!({"type": "ad_account", "id": format!("meta_ads:{account}")})),
            ("object", json!({"type": "campaign", "id": format!("meta_ads:{campaign}")})),
            (
                "entity",
                object([
                    ("type", json!("campaign")),
                    ("id", json!(format!("meta_ads:{campaign}"))),
                    ("name", json!(name)),
                    ("properties", object([("objective", json!(text(r, "objective")))])),
                ]),
            ),
            (
                "attribution",
                object([
                    ("source", json!("meta")),
                    ("medium", json!("paid_social")),
                    ("channel", json!("paid_social")),
                    ("campaign", json!(name)),
                    ("campaignId", json!(campaign)),
                ]),
            ),
            (
                "source",
                object([
                    ("platform", json!("meta_ads")),
                    ("channel", json!("paid_social")),
                    ("campaign", json!(name)),
                ]),
            ),
            (
                "properties",
                object([
                    ("dateStart", json!(start)),
                    ("dateStop", json!(text(r, "date_stop"))),
                    ("spend", json!(spend)),
                    ("currency", json!(text(r, "account_currency"))),
                    ("impressions", json!(number(r.get("impressions")))),
                    ("clicks", json!(number(r.get("clicks")))),
                    ("reach", json!(number(r.get("reach")))),
                    ("purchases", json!(action(r, "actions"))),
                    ("purchaseValue", json!(action(r, "action_values"))),
                    ("adsetId", json!(text(r, "adset_id"))),
                    ("adId", json!(text(r, "ad_id"))),
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

    /// One element of `data` from `GET /v21.0/act_<id>/insights?level=campaign
    /// &time_increment=1&fields=campaign_id,campaign_name,spend,...`.
    fn row() -> Value {
        json!({
            "account_id": "1029384756",
            "account_currency": "EUR",
            "campaign_id": "23851234567890123",
            "campaign_name": "Spring Sale - Advantage+",
            "objective": "OUTCOME_SALES",
            "impressions": "10234",
            "clicks": "321",
            "reach": "8012",
            "spend": "123.45",
            "cpc": "0.384579",
            "ctr": "3.136603",
            "actions": [
                {"action_type": "link_click", "value": "300"},
                {"action_type": "offsite_conversion.fb_pixel_purchase", "value": "4"},
                {"action_type": "purchase", "value": "5"}
            ],
            "action_values": [
                {"action_type": "purchase", "value": "412.50"}
            ],
            "date_start": "2026-11-01",
            "date_stop": "2026-11-01"
        })
    }

    #[test]
    fn insights_row_maps_to_ad_spend() {
        let mapped = map_record("meta_ads", &row()).unwrap();
        assert_eq!(mapped.record_id, "1029384756/23851234567890123/2026-11-01");
        let event = valid(&mapped);
        assert_eq!(event.event, "ad.spend");
        let e = &mapped.envelope;
        assert_eq!(e["properties"]["spend"], json!(123.45));
        assert_eq!(e["properties"]["currency"], "EUR");
        assert_eq!(e["properties"]["purchases"], json!(5.0));
        assert_eq!(e["properties"]["purchaseValue"], json!(412.5));
        assert_eq!(e["attribution"]["campaign"], "Spring Sale - Advantage+");
        assert_eq!(e["attribution"]["source"], "meta");
        assert!(e.get("outcome").is_none());
        assert_eq!(event.timestamp, crate::connectors::parse_datetime_ms("2026-11-01"));
    }

    #[test]
    fn ad_level_and_multi_day_rows_key_by_their_window() {
        let mut r = row();
        r["ad_id"] = json!("23851234567890999");
        r["date_stop"] = json!("2026-11-07");
        let mapped = map_record("meta_ads", &r).unwrap();
        assert_eq!(mapped.record_id, "1029384756/23851234567890999/2026-11-01/2026-11-07");
        r.as_object_mut().unwrap().remove("date_start");
        assert!(map_record("meta_ads", &r).unwrap_err().contains("date_start"));
    }
}
