//! Conversions between [`Event`] and its protobuf form [`pb::Event`].
//!
//! Into protobuf is infallible: an `Event` is already valid. Out of protobuf
//! is untrusted input: the message is turned back into a JSON envelope and
//! run through [`Event::from_json`], the same validation as an HTTP body,
//! so a gRPC batch can never carry an envelope HTTP would refuse. JSON text
//! in the `*_json` bytes that does not decode, or does not decode to an
//! object, is an error naming the envelope field (`properties`).

use serde_json::{Map, Value};

use crate::error::{Result, ValidationError};
use crate::event::{Event, JsonObject, Party};
use crate::pb;

impl Event {
    /// The protobuf form of this event, with the producer's event `id` and
    /// per-gateway `sequence` (0 outside a gateway). The gateway-only
    /// `received_at_ms` and `device_timestamp_ms` are left unset for the
    /// caller to fill in.
    pub fn to_pb(&self, id: String, sequence: u64) -> pb::Event {
        let json = |m: &Option<JsonObject>| m.as_ref().map(json_bytes);
        pb::Event {
            id,
            sequence,
            received_at_ms: None,
            device_timestamp_ms: None,
            event: self.event.clone(),
            timestamp_ms: self.timestamp,
            actor: self.actor.as_ref().map(Party::to_pb),
            object: self.object.as_ref().map(Party::to_pb),
            business_id: self.business_id.clone(),
            trust_tier: self.trust_tier.map(|t| t.as_str().to_owned()),
            trace_id: self.trace_id.clone(),
            decision_id: self.decision_id.clone(),
            proof_id: self.proof_id.clone(),
            message_id: self.message_id.clone(),
            properties_json: json(&self.properties),
            context_json: json(&self.context),
            source_json: json(&self.source),
            attribution_json: json(&self.attribution),
            trackable_json: json(&self.trackable),
            outcome_json: json(&self.outcome),
            entity_json: json(&self.entity),
            compliance_mapping_json: json(&self.compliance_mapping),
        }
    }

    /// Decodes and validates an event that arrived over gRPC, received at
    /// `now_ms`. The transport fields (`id`, `sequence`, `received_at_ms`,
    /// `device_timestamp_ms`) are the caller's to read from `msg` first:
    /// the rest of it moves into the event.
    pub fn from_pb(msg: pb::Event, now_ms: i64) -> Result<Self> {
        Self::from_value(envelope_json(msg)?, now_ms)
    }
}

impl pb::Event {
    /// Same as [`Event::to_pb`].
    pub fn from_event(id: String, sequence: u64, event: &Event) -> Self {
        event.to_pb(id, sequence)
    }
}

impl Party {
    /// The protobuf form of this party.
    pub fn to_pb(&self) -> pb::Party {
        let form = match self {
            Self::Name(name) => pb::party::Form::Name(name.clone()),
            Self::Ref { kind, id, extra } => {
                let extra_json = if extra.is_empty() {
                    Vec::new()
                } else if extra.contains_key("type") || extra.contains_key("id") {
                    // Only reachable for a party built by hand; `kind` and
                    // `id` win, as in the JSON form.
                    let mut rest = extra.clone();
                    rest.remove("type");
                    rest.remove("id");
                    json_bytes(&rest)
                } else {
                    json_bytes(extra)
                };
                pb::party::Form::Ref(pb::PartyRef {
                    r#type: kind.clone(),
                    id: id.clone(),
                    extra_json,
                })
            }
        };
        pb::Party { form: Some(form) }
    }
}

/// Compact JSON text of an object.
fn json_bytes(map: &JsonObject) -> Vec<u8> {
    // Serializing string-keyed JSON into a Vec cannot fail; were it ever to,
    // the empty result is refused by `from_pb` rather than lost silently.
    serde_json::to_vec(map).unwrap_or_default()
}

/// The JSON envelope a protobuf event stands for, before validation.
fn envelope_json(msg: pb::Event) -> Result<Value> {
    let mut body = Map::new();
    let mut text = |key: &str, v: Option<String>| {
        if let Some(v) = v {
            body.insert(key.to_owned(), Value::String(v));
        }
    };
    text("businessId", msg.business_id);
    text("traceId", msg.trace_id);
    text("decisionId", msg.decision_id);
    text("proofId", msg.proof_id);
    text("messageId", msg.message_id);
    text("trustTier", msg.trust_tier);

    body.insert("event".to_owned(), Value::String(msg.event));
    if let Some(ts) = msg.timestamp_ms {
        body.insert("timestamp".to_owned(), Value::from(ts));
    }
    for (key, party) in [("actor", msg.actor), ("object", msg.object)] {
        if let Some(p) = party {
            let v = party_json(p).map_err(|e| e.within(key))?;
            body.insert(key.to_owned(), v);
        }
    }
    let free = [
        ("properties", msg.properties_json),
        ("context", msg.context_json),
        ("source", msg.source_json),
        ("attribution", msg.attribution_json),
        ("trackable", msg.trackable_json),
        ("outcome", msg.outcome_json),
        ("entity", msg.entity_json),
        ("complianceMapping", msg.compliance_mapping_json),
    ];
    for (key, bytes) in free {
        if let Some(bytes) = bytes {
            let map = decode_object(&bytes).map_err(|e| e.within(key))?;
            body.insert(key.to_owned(), Value::Object(map));
        }
    }
    Ok(Value::Object(body))
}

/// The JSON form of a protobuf party; errors are relative to the party.
fn party_json(p: pb::Party) -> Result<Value> {
    match p.form {
        None => Err(ValidationError::new("", "must be a name or a reference with `type` and `id`")),
        Some(pb::party::Form::Name(name)) => Ok(Value::String(name)),
        Some(pb::party::Form::Ref(r)) => {
            let mut map =
                if r.extra_json.is_empty() { Map::new() } else { decode_object(&r.extra_json)? };
            if map.contains_key("type") || map.contains_key("id") {
                return Err(ValidationError::new("", "extra keys must not repeat `type` or `id`"));
            }
            map.insert("type".to_owned(), Value::String(r.r#type));
            map.insert("id".to_owned(), Value::String(r.id));
            Ok(Value::Object(map))
        }
    }
}

/// JSON text that must hold one object. `null` is refused here: in protobuf
/// a set field is present, and JSON `null` would read as absent.
fn decode_object(bytes: &[u8]) -> Result<JsonObject> {
    match serde_json::from_slice(bytes) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(ValidationError::new("", "must be a JSON object")),
        Err(e) => Err(ValidationError::new("", format!("is not valid JSON: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TrustTier;
    use serde_json::json;

    const NOW: i64 = 1_750_000_000_000;

    fn full() -> Event {
        let v = json!({
            "event": "order.created", "businessId": "biz_1",
            "actor": {"type": "user", "id": "u1", "plan": "pro"}, "object": "sku_9",
            "traceId": "t1", "trustTier": "T2", "timestamp": NOW - 1000,
            "properties": {"amount": 12, "big": u64::MAX, "ratio": 0.1},
            "context": {}, "messageId": "m1",
        });
        Event::from_json(&v, NOW).unwrap()
    }

    #[test]
    fn pb_round_trip_keeps_everything() {
        let e = full();
        let msg = e.to_pb("evt_1".into(), 42);
        assert_eq!(msg.id, "evt_1");
        assert_eq!(msg.sequence, 42);
        assert_eq!(msg.trust_tier.as_deref(), Some("T2"));
        assert_eq!(msg.context_json.as_deref(), Some(&b"{}"[..]));
        assert_eq!(pb::Event::from_event("evt_1".into(), 42, &e), msg);
        assert_eq!(Event::from_pb(msg.clone(), NOW).unwrap(), e);
        assert_eq!(e.trust_tier, Some(TrustTier::T2));
    }

    #[test]
    fn party_without_extra_keys_sends_empty_extra_json() {
        let p = Party::Ref { kind: "user".into(), id: "1".into(), extra: Map::new() };
        let Some(pb::party::Form::Ref(r)) = p.to_pb().form else {
            panic!("expected a reference");
        };
        assert!(r.extra_json.is_empty());
    }

    fn rejects(msg: &pb::Event, field: &str) {
        let err = Event::from_pb(msg.clone(), NOW).unwrap_err();
        assert_eq!(err.field, field, "{err}");
    }

    #[test]
    fn bad_json_bytes_name_their_field() {
        let base = full().to_pb("evt_1".into(), 1);
        for bad in [&b"{not json"[..], b"[1,2]", b"null", b"", b"\xff\xfe"] {
            let mut m = base.clone();
            m.properties_json = Some(bad.to_vec());
            rejects(&m, "properties");
            let mut m = base.clone();
            m.compliance_mapping_json = Some(bad.to_vec());
            rejects(&m, "complianceMapping");
        }
    }

    #[test]
    fn protobuf_input_gets_the_same_validation_as_json() {
        let base = full().to_pb("evt_1".into(), 1);
        type Mutation = fn(&mut pb::Event);
        let cases: Vec<(&str, Mutation)> = vec![
            ("event", |m| m.event.clear()),
            ("event", |m| m.event = "x".repeat(201)),
            ("trustTier", |m| m.trust_tier = Some("T9".into())),
            ("timestamp", |m| m.timestamp_ms = Some(NOW + 2 * 86_400_000)),
            ("traceId", |m| m.trace_id = Some(String::new())),
            ("actor", |m| m.actor = Some(pb::Party { form: None })),
            ("object", |m| m.object = Some(pb::Party::default())),
            ("actor.id", |m| {
                m.actor = Some(pb::Party {
                    form: Some(pb::party::Form::Ref(pb::PartyRef {
                        r#type: "user".into(),
                        id: String::new(),
                        extra_json: Vec::new(),
                    })),
                });
            }),
            ("actor", |m| {
                m.actor = Some(pb::Party {
                    form: Some(pb::party::Form::Ref(pb::PartyRef {
                        r#type: "user".into(),
                        id: "1".into(),
                        extra_json: br#"{"id":"2"}"#.to_vec(),
                    })),
                });
            }),
            ("actor", |m| {
                m.actor = Some(pb::Party {
                    form: Some(pb::party::Form::Ref(pb::PartyRef {
                        r#type: "user".into(),
                        id: "1".into(),
                        extra_json: b"[]".to_vec(),
                    })),
                });
            }),
            ("properties", |m| {
                let big = format!(r#"{{"k":"{}"}}"#, "x".repeat(65 * 1024));
                m.properties_json = Some(big.into_bytes());
            }),
        ];
        for (field, mutate) in cases {
            let mut m = base.clone();
            mutate(&mut m);
            rejects(&m, field);
        }
    }
}
