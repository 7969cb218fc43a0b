//! Connector mappings: provider-native records (as their public APIs return
//! them) to canonical event envelopes. Pure functions, no I/O: the API
//! layer validates what they produce through the ingest path and the store
//! upserts it by `(provider, record id)`.
//!
//! One file per provider; the table of what maps to what is in
//! docs/connectors.md. Every mapping follows the same rules:
//! - the record id is the provider's own (`id`, `Id`, or a documented
//!   composite for metrics rows), and a re-sync of it replaces the event;
//! - actor, object and entity ids are prefixed with the provider
//!   (`shopify:450789469`) so records of two providers never merge;
//! - contact details (e-mail addresses, phone numbers, person names, street
//!   addresses) are not copied: the record id links back to the provider;
//! - `context.connector` says where the event came from.

pub mod google_ads;
pub mod hubspot;
pub mod meta_ads;
pub mod quickbooks;
pub mod salesforce;
pub mod shopify;
pub mod stripe;
pub mod woocommerce;

use serde_json::{Map, Value, json};

/// Providers with a mapping of their own; any other name is generic.
pub const KNOWN_PROVIDERS: [&str; 8] = [
    "shopify",
    "woocommerce",
    "stripe",
    "salesforce",
    "hubspot",
    "quickbooks",
    "google_ads",
    "meta_ads",
];

/// Longest provider name.
pub const MAX_PROVIDER_LEN: usize = 64;

/// A record turned into an event.
#[derive(Debug, Clone, PartialEq)]
pub struct Mapped {
    /// The provider's id of the record: the deduplication key.
    pub record_id: String,
    /// The envelope, without `businessId` (the caller's) and not yet
    /// validated.
    pub envelope: Value,
}

/// A provider name: 1 to 64 of `a-z 0-9 _ -`, since it becomes part of
/// event names (`{provider}.record`) and ids.
pub fn check_provider(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= MAX_PROVIDER_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(format!("`provider` must be 1 to {MAX_PROVIDER_LEN} of a-z, 0-9, `_` and `-`"))
    }
}

/// Maps one record of `provider` (already checked with [`check_provider`]).
pub fn map_record(provider: &str, record: &Value) -> Result<Mapped, String> {
    let Value::Object(record) = record else {
        return Err("a record must be a JSON object".into());
    };
    let mut mapped = match provider {
        "shopify" => shopify::map(record),
        "woocommerce" => woocommerce::map(record),
        "stripe" => stripe::map(record),
        "salesforce" => salesforce::map(record),
        "hubspot" => hubspot::map(record),
        "quickbooks" => quickbooks::map(record),
        "google_ads" => google_ads::map(record),
        "meta_ads" => meta_ads::map(record),
        other => generic(other, record),
    }?;
    if let Value::Object(envelope) = &mut mapped.envelope {
        let connector = json!({"connector": {"provider": provider, "recordId": mapped.record_id}});
        match envelope.get_mut("context") {
            Some(Value::Object(context)) => {
                context.insert("connector".into(), connector["connector"].clone());
            }
            _ => {
                envelope.insert("context".into(), connector);
            }
        }
    }
    Ok(mapped)
}

/// Any other provider: `{provider}.record`, the record as `properties`, the
/// first of `total`, `amount`, `total_price`, `price` as revenue with
/// `currency`, and `timestamp` (ms) or `created_at`/`createdAt` (RFC 3339)
/// as the event time.
pub fn generic(provider: &str, record: &Map<String, Value>) -> Result<Mapped, String> {
    let id = ["id", "Id", "ID"]
        .iter()
        .find_map(|k| id_of(record.get(*k)))
        .ok_or("`id` (a string or a number) is required")?;
    let revenue =
        ["total", "amount", "total_price", "price"].iter().find_map(|k| number(record.get(*k)));
    let timestamp = match record.get("timestamp") {
        Some(Value::Number(n)) => n.as_i64(),
        _ => ["created_at", "createdAt"].iter().find_map(|k| time_at(record, k)),
    };
    Ok(Mapped {
        envelope: object([
            ("event", json!(format!("{provider}.record"))),
            ("object", json!({"type": "record", "id": format!("{provider}:{id}")})),
            (
                "outcome",
                object([
                    ("revenue", json!(revenue)),
                    ("currency", json!(text(record, "currency"))),
                ]),
            ),
            ("properties", Value::Object(record.clone())),
            ("timestamp", json!(timestamp)),
        ]),
        record_id: id,
    })
}

// ---- helpers shared by the provider files ----------------------------------

/// An object of the pairs whose value is not null, or null when none is:
/// absent stays absent.
pub(crate) fn object<const N: usize>(pairs: [(&str, Value); N]) -> Value {
    let map: Map<String, Value> =
        pairs.into_iter().filter(|(_, v)| !v.is_null()).map(|(k, v)| (k.to_owned(), v)).collect();
    if map.is_empty() { Value::Null } else { Value::Object(map) }
}

/// A string or number as an id; empty strings are no id.
pub(crate) fn id_of(value: Option<&Value>) -> Option<String> {
    match value? {
        Value::String(s) if !s.trim().is_empty() => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// A non-empty string (or number, as text) at `key`.
pub(crate) fn text(map: &Map<String, Value>, key: &str) -> Option<String> {
    id_of(map.get(key))
}

/// A finite number, or a string holding one (APIs send money and int64
/// counters as strings).
pub(crate) fn number(value: Option<&Value>) -> Option<f64> {
    match value? {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.trim().parse::<f64>().ok(),
        _ => None,
    }
    .filter(|v| v.is_finite())
}

/// The first of `keys` present: for APIs that spell a field in camelCase
/// over REST and snake_case in client libraries.
pub(crate) fn either<'a>(map: &'a Map<String, Value>, keys: &[&str]) -> Option<&'a Value> {
    keys.iter().find_map(|k| map.get(*k).filter(|v| !v.is_null()))
}

pub(crate) fn child<'a>(map: &'a Map<String, Value>, key: &str) -> Option<&'a Map<String, Value>> {
    map.get(key).and_then(Value::as_object)
}

pub(crate) fn is_true(value: Option<&Value>) -> bool {
    match value {
        Some(Value::Bool(b)) => *b,
        Some(Value::String(s)) => s.eq_ignore_ascii_case("true"),
        _ => false,
    }
}

/// Event time from a date-time field: absent is `None`, unreadable is an
/// error naming the field.
pub(crate) fn time_field(map: &Map<String, Value>, key: &str) -> Result<Option<i64>, String> {
    match map.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => parse_datetime_ms(s)
            .map(Some)
            .ok_or_else(|| format!("`{key}` is not an RFC 3339 date-time: {s:?}")),
        Some(_) => Err(format!("`{key}` must be a date-time string")),
    }
}

fn time_at(map: &Map<String, Value>, key: &str) -> Option<i64> {
    time_field(map, key).ok().flatten()
}

/// `utm_*` parameters of a URL or path, for attribution.
pub(crate) fn utm_params(url: &str) -> Map<String, Value> {
    let query = url.split_once('?').map_or("", |(_, q)| q);
    let query = query.split_once('#').map_or(query, |(q, _)| q);
    url::form_urlencoded::parse(query.as_bytes())
        .filter_map(|(k, v)| {
            let key = match k.as_ref() {
                "utm_source" => "source",
                "utm_medium" => "medium",
                "utm_campaign" => "campaign",
                "utm_content" => "content",
                "utm_term" => "term",
                _ => return None,
            };
            (!v.is_empty()).then(|| (key.to_owned(), Value::String(v.into_owned())))
        })
        .collect()
}

pub use opgraph_proto::datetime::parse_datetime_ms;

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A mapped envelope must pass the same validation as `/api/ingest`.
    pub(crate) fn valid(mapped: &Mapped) -> opgraph_proto::Event {
        opgraph_proto::Event::parse_json(&mapped.envelope)
            .unwrap_or_else(|e| panic!("{e:?} in {}", mapped.envelope))
    }

    #[test]
    fn utm_parameters_are_read_from_a_landing_path() {
        let utm = utm_params("/products/tee?utm_source=newsletter&utm_campaign=spring%20sale&x=1");
        assert_eq!(Value::Object(utm), json!({"source": "newsletter", "campaign": "spring sale"}));
        assert!(utm_params("/products/tee").is_empty());
    }

    #[test]
    fn provider_names() {
        for good in ["shopify", "google_ads", "acme-erp", "x1"] {
            assert!(check_provider(good).is_ok(), "{good}");
        }
        for bad in ["", "Shopify", "a.b", "a b", &"a".repeat(65)] {
            assert!(check_provider(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn generic_record_as_in_the_spec_sample() {
        let record = json!({"id": "ord_1001", "total": 129.5, "currency": "EUR",
            "created_at": "2026-11-01T09:30:00Z", "channel": "market"});
        let mapped = map_record("acme_erp", &record).unwrap();
        assert_eq!(mapped.record_id, "ord_1001");
        let event = valid(&mapped);
        assert_eq!(event.event, "acme_erp.record");
        assert_eq!(mapped.envelope["outcome"], json!({"revenue": 129.5, "currency": "EUR"}));
        assert_eq!(mapped.envelope["properties"], record);
        assert_eq!(mapped.envelope["object"], json!({"type": "record", "id": "acme_erp:ord_1001"}));
        assert_eq!(event.timestamp, parse_datetime_ms("2026-11-01T09:30:00Z"));
        assert_eq!(
            mapped.envelope["context"],
            json!({"connector": {"provider": "acme_erp", "recordId": "ord_1001"}})
        );
    }

    #[test]
    fn records_without_an_id_or_not_objects_are_refused() {
        assert!(map_record("acme", &json!({"total": 1})).unwrap_err().contains("id"));
        assert!(map_record("acme", &json!({"id": ""})).is_err());
        assert!(map_record("acme", &json!([1])).unwrap_err().contains("object"));
        assert!(map_record("shopify", &json!("x")).is_err());
    }
}
