//! The body of an ingest request: one envelope, or `{"batch": [...]}` of at
//! most [`MAX_BATCH`], all or nothing.
//!
//! Shared by the cloud's `POST /api/ingest` and the gateway's local ingest
//! endpoint so that both accept exactly the same bodies and name the same
//! offending field (`batch[3].event`). Defaults (receive time, business
//! `default`, tier `T0`) are not applied here: they are the cloud's to
//! decide, and a gateway forwards events as they were given.

use std::collections::BTreeMap;

use serde_json::Value;
use serde_json::value::RawValue;

use crate::error::{Result, ValidationError};
use crate::event::Event;

/// Most envelopes in one batch body.
pub const MAX_BATCH: usize = 1000;

/// Validates a single envelope or a batch body received at `now_ms`. The
/// body's parts move into the events.
pub fn parse_body(body: Value, now_ms: i64) -> Result<Vec<Event>> {
    let Value::Object(mut object) = body else {
        return Err(not_an_object());
    };
    match object.remove("batch") {
        None => Ok(vec![parse_envelope(Value::Object(object), now_ms)?]),
        Some(batch) => {
            only_batch(object.keys().map(String::as_str))?;
            let Value::Array(items) = batch else {
                return Err(not_an_array());
            };
            batch_len(items.len())?;
            items
                .into_iter()
                .enumerate()
                .map(|(i, item)| parse_envelope(item, now_ms).map_err(|e| e.at_index("batch", i)))
                .collect()
        }
    }
}

/// Longest `Idempotency-Key` accepted.
pub const MAX_IDEMPOTENCY_KEY_LEN: usize = 255;

/// An `Idempotency-Key` header's value, trimmed: 1 to
/// [`MAX_IDEMPOTENCY_KEY_LEN`] visible ASCII characters (what an HTTP
/// header may hold as text); otherwise the message to answer with.
pub fn idempotency_key(value: &[u8]) -> std::result::Result<&str, String> {
    std::str::from_utf8(value)
        .ok()
        .filter(|v| v.bytes().all(|b| b == b'\t' || (b' '..=b'~').contains(&b)))
        .map(str::trim)
        .filter(|k| !k.is_empty() && k.len() <= MAX_IDEMPOTENCY_KEY_LEN)
        .ok_or_else(|| format!("must be 1 to {MAX_IDEMPOTENCY_KEY_LEN} visible ASCII characters"))
}

/// Why raw body bytes were refused.
#[derive(Debug)]
pub enum BodyError {
    /// Not JSON at all.
    Json(serde_json::Error),
    /// JSON that breaks the contract.
    Invalid(ValidationError),
}

impl From<ValidationError> for BodyError {
    fn from(e: ValidationError) -> Self {
        BodyError::Invalid(e)
    }
}

/// [`parse_body`] on the raw bytes of a body, with the same answers, but a
/// batch's envelopes are turned into trees one at a time: a 1000-event body
/// never holds more than one envelope's `Value` next to its bytes (a whole
/// body's tree is several times the size of the body).
pub fn parse_body_bytes(bytes: &[u8], now_ms: i64) -> std::result::Result<Vec<Event>, BodyError> {
    let whole: &RawValue = serde_json::from_slice(bytes).map_err(BodyError::Json)?;
    // Sorted like `Value`'s map, so that the same key is named first.
    let Ok(fields) = serde_json::from_str::<BTreeMap<String, &RawValue>>(whole.get()) else {
        return Err(not_an_object().into());
    };
    let Some(batch) = fields.get("batch") else {
        let value: Value = serde_json::from_str(whole.get()).map_err(BodyError::Json)?;
        return Ok(vec![parse_envelope(value, now_ms)?]);
    };
    only_batch(fields.keys().map(String::as_str))?;
    let items: Vec<&RawValue> = serde_json::from_str(batch.get()).map_err(|_| not_an_array())?;
    batch_len(items.len())?;
    let mut events = Vec::with_capacity(items.len());
    for (i, item) in items.into_iter().enumerate() {
        let value: Value = serde_json::from_str(item.get()).map_err(BodyError::Json)?;
        events.push(parse_envelope(value, now_ms).map_err(|e| e.at_index("batch", i))?);
    }
    Ok(events)
}

fn not_an_object() -> ValidationError {
    ValidationError::new("", "the body must be a JSON object")
}

fn not_an_array() -> ValidationError {
    ValidationError::new("batch", "`batch` must be an array")
}

/// A batch body has no field beside `batch`.
fn only_batch<'a>(mut keys: impl Iterator<Item = &'a str>) -> Result<()> {
    match keys.find(|k| *k != "batch") {
        Some(other) => Err(ValidationError::new(other, "a batch body has only the `batch` field")),
        None => Ok(()),
    }
}

fn batch_len(n: usize) -> Result<()> {
    if n == 0 || n > MAX_BATCH {
        return Err(ValidationError::new(
            "batch",
            format!("`batch` must hold 1 to {MAX_BATCH} envelopes"),
        ));
    }
    Ok(())
}

/// One envelope: the contract's validation plus [`check_entity`].
pub fn parse_envelope(value: Value, now_ms: i64) -> Result<Event> {
    let event = Event::from_value(value, now_ms)?;
    check_entity(&event)?;
    Ok(event)
}

/// An `entity` to upsert needs a non-empty string `type` and `id`.
pub fn check_entity(event: &Event) -> Result<()> {
    if let Some(entity) = &event.entity {
        for key in ["type", "id"] {
            match entity.get(key) {
                Some(Value::String(s)) if !s.is_empty() => {}
                _ => {
                    return Err(ValidationError::new(
                        format!("entity.{key}"),
                        format!("`entity.{key}` must be a non-empty string"),
                    ));
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const NOW: i64 = 1_795_322_085_000;

    /// The field named by both parsers, which must agree.
    fn field_of(body: Value) -> String {
        let from_bytes = match parse_body_bytes(body.to_string().as_bytes(), NOW) {
            Err(BodyError::Invalid(e)) => e,
            other => panic!("expected a validation error from bytes, got {other:?}"),
        };
        match parse_body(body.clone(), NOW) {
            Err(e) => {
                assert_eq!(e, from_bytes, "{body}");
                e.field
            }
            Ok(events) => panic!("expected a validation error, got {events:?}"),
        }
    }

    #[test]
    fn bytes_and_tree_parse_alike() {
        let bodies = [
            json!({"event": "scan", "actor": {"type": "reader", "id": "r1"}}),
            json!({"batch": [{"event": "a", "properties": {"n": 1.5}}, {"event": "b"}]}),
        ];
        for body in bodies {
            let from_bytes = parse_body_bytes(body.to_string().as_bytes(), NOW).unwrap();
            assert_eq!(from_bytes, parse_body(body.clone(), NOW).unwrap());
        }
        // Later duplicates win, as in a `Value`.
        let twice = br#"{"batch": [{"event": "a"}], "batch": [{"event": "b"}]}"#;
        assert_eq!(parse_body_bytes(twice, NOW).unwrap()[0].event, "b");
        for broken in [&b"{"[..], b"", b"{\"batch\": [1,]}", b"\xff"] {
            assert!(matches!(parse_body_bytes(broken, NOW), Err(BodyError::Json(_))));
        }
    }

    #[test]
    fn single_and_batch_bodies() {
        assert_eq!(parse_body(json!({"event": "scan"}), NOW).unwrap().len(), 1);
        let body = json!({"batch": [{"event": "a"}, {"event": "b"}]});
        let events = parse_body(body.clone(), NOW).unwrap();
        assert_eq!(events.iter().map(|e| e.event.as_str()).collect::<Vec<_>>(), ["a", "b"]);
        // No defaults are applied here.
        assert_eq!(events[0].timestamp, None);
        assert_eq!(events[0].business_id, None);
    }

    #[test]
    fn batch_errors_name_the_index() {
        let body = json!({"batch": [{"event": "a"}, {"event": "b"}, {"event": ""}]});
        assert_eq!(field_of(body), "batch[2].event");
        assert_eq!(field_of(json!({"batch": [1]})), "batch[0]");
        assert_eq!(field_of(json!([1])), "");
    }

    #[test]
    fn batch_shape_is_checked() {
        assert_eq!(field_of(json!({"batch": []})), "batch");
        assert_eq!(field_of(json!({"batch": {}})), "batch");
        let too_many: Vec<Value> = (0..=MAX_BATCH).map(|_| json!({"event": "x"})).collect();
        assert_eq!(field_of(json!({ "batch": too_many })), "batch");
        assert_eq!(field_of(json!({"batch": [{"event": "x"}], "event": "y"})), "event");
    }

    #[test]
    fn entity_needs_type_and_id() {
        assert_eq!(field_of(json!({"event": "x", "entity": {"type": "store"}})), "entity.id");
        let body = json!({"batch": [{"event": "x", "entity": {"id": "1"}}]});
        assert_eq!(field_of(body), "batch[0].entity.type");
    }
}
