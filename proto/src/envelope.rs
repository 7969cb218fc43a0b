//! The body of an ingest request: one envelope, or `{"batch": [...]}` of at
//! most [`MAX_BATCH`], all or nothing.
//!
//! Shared by the cloud's `POST /api/ingest` and the gateway's local ingest
//! endpoint so that both accept exactly the same bodies and name the same
//! offending field (`batch[3].event`). Defaults (receive time, business
//! `default`, tier `T0`) are not applied here: they are the cloud's to
//! decide, and a gateway forwards events as they were given.

use serde_json::Value;

use crate::error::{Result, ValidationError};
use crate::event::Event;

/// Most envelopes in one batch body.
pub const MAX_BATCH: usize = 1000;

/// Validates a single envelope or a batch body received at `now_ms`.
pub fn parse_body(body: &Value, now_ms: i64) -> Result<Vec<Event>> {
    let Some(object) = body.as_object() else {
        return Err(ValidationError::new("", "the body must be a JSON object"));
    };
    match object.get("batch") {
        None => Ok(vec![parse_envelope(body, now_ms)?]),
        Some(batch) => {
            if let Some(other) = object.keys().find(|k| *k != "batch") {
                return Err(ValidationError::new(
                    other.as_str(),
                    "a batch body has only the `batch` field",
                ));
            }
            let items = batch
                .as_array()
                .ok_or_else(|| ValidationError::new("batch", "`batch` must be an array"))?;
            if items.is_empty() || items.len() > MAX_BATCH {
                return Err(ValidationError::new(
                    "batch",
                    format!("`batch` must hold 1 to {MAX_BATCH} envelopes"),
                ));
            }
            items
                .iter()
                .enumerate()
                .map(|(i, item)| parse_envelope(item, now_ms).map_err(|e| e.at_index("batch", i)))
                .collect()
        }
    }
}

/// One envelope: the contract's validation plus [`check_entity`].
pub fn parse_envelope(value: &Value, now_ms: i64) -> Result<Event> {
    let event = Event::from_json(value, now_ms)?;
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

    fn field_of(body: Value) -> String {
        match parse_body(&body, NOW) {
            Err(e) => e.field,
            Ok(events) => panic!("expected a validation error, got {events:?}"),
        }
    }

    #[test]
    fn single_and_batch_bodies() {
        assert_eq!(parse_body(&json!({"event": "scan"}), NOW).unwrap().len(), 1);
        let body = json!({"batch": [{"event": "a"}, {"event": "b"}]});
        let events = parse_body(&body, NOW).unwrap();
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
