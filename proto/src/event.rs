//! The canonical event envelope (interface spec 2.2) as Rust types.
//!
//! These types hold only envelopes that passed validation when they come
//! from outside: build them with [`Event::from_json`] or [`Event::from_pb`].
//! Their JSON form is exactly the public envelope: camelCase keys, absent
//! fields omitted, so `Event::from_json(v)?.to_json() == v` for every valid
//! `v` without top-level `null`s.

use std::fmt;
use std::str::FromStr;

use serde::ser::SerializeMap;
use serde::{Deserialize, Serialize, Serializer};
use serde_json::{Map, Value};

use crate::error::ValidationError;

/// A free JSON object of the envelope (`properties`, `context`, ...).
pub type JsonObject = Map<String, Value>;

/// One event: something happened, caused by an actor, against an object.
///
/// Field order follows the spec's table; `message_id` (the client's
/// idempotency key, from the API contract) comes last.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Event {
    /// Event name, usually dot-notated (`order.created`). Required.
    pub event: String,
    /// Business the event belongs to; the cloud reads absent as `default`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub business_id: Option<String>,
    /// Who or what caused the event.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub actor: Option<Party>,
    /// The thing acted on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub object: Option<Party>,
    /// Graph entity to upsert from the event.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub entity: Option<JsonObject>,
    /// Correlation id across events, agents, workflows, decisions and proofs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<String>,
    /// Channel and campaign metadata.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<JsonObject>,
    /// Touchpoint metadata.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attribution: Option<JsonObject>,
    /// Context-contract or runtime metadata.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub context: Option<JsonObject>,
    /// Identifier metadata (`kind`, `code`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trackable: Option<JsonObject>,
    /// DecisionObject id, for governed execution.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decision_id: Option<String>,
    /// Proof trail id, for evidence packaging.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub proof_id: Option<String>,
    /// Outcome metrics.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outcome: Option<JsonObject>,
    /// How far the event can be trusted; the cloud reads absent as `T0`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trust_tier: Option<TrustTier>,
    /// Control-evidence metadata.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compliance_mapping: Option<JsonObject>,
    /// Additional event-specific facts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub properties: Option<JsonObject>,
    /// Event time, ms since the Unix epoch; the cloud reads absent as the
    /// receive time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timestamp: Option<i64>,
    /// Client idempotency key: a retry with the same key within 24 h stores
    /// nothing new.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message_id: Option<String>,
}

impl Event {
    /// An event with only its name set.
    pub fn named(event: impl Into<String>) -> Self {
        Self { event: event.into(), ..Self::default() }
    }

    /// The public JSON envelope; the same value `serde_json::to_value` gives.
    pub fn to_json(&self) -> Value {
        fn put<T>(out: &mut JsonObject, key: &str, v: &Option<T>, f: impl Fn(&T) -> Value) {
            if let Some(v) = v {
                out.insert(key.to_owned(), f(v));
            }
        }
        let text = |s: &String| Value::String(s.clone());
        let object = |m: &JsonObject| Value::Object(m.clone());
        let mut out = JsonObject::new();
        out.insert("event".to_owned(), Value::String(self.event.clone()));
        put(&mut out, "businessId", &self.business_id, text);
        put(&mut out, "actor", &self.actor, Party::to_json);
        put(&mut out, "object", &self.object, Party::to_json);
        put(&mut out, "entity", &self.entity, object);
        put(&mut out, "traceId", &self.trace_id, text);
        put(&mut out, "source", &self.source, object);
        put(&mut out, "attribution", &self.attribution, object);
        put(&mut out, "context", &self.context, object);
        put(&mut out, "trackable", &self.trackable, object);
        put(&mut out, "decisionId", &self.decision_id, text);
        put(&mut out, "proofId", &self.proof_id, text);
        put(&mut out, "outcome", &self.outcome, object);
        put(&mut out, "trustTier", &self.trust_tier, |t| Value::String(t.as_str().to_owned()));
        put(&mut out, "complianceMapping", &self.compliance_mapping, object);
        put(&mut out, "properties", &self.properties, object);
        put(&mut out, "timestamp", &self.timestamp, |t| Value::from(*t));
        put(&mut out, "messageId", &self.message_id, text);
        Value::Object(out)
    }

    /// The public JSON envelope as text, written straight from the event:
    /// [`Event::to_json`] first copies every string and map into a
    /// `Value`. Keys come in field order rather than sorted; the object is
    /// the same.
    pub fn to_json_text(&self) -> String {
        // Serializing cannot fail (every map key is a string), but should
        // it, the copying path gives the same object.
        serde_json::to_string(self).unwrap_or_else(|_| self.to_json().to_string())
    }
}

/// An actor or object: a plain string, or a typed reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Party {
    /// The string form: `"user_42"`.
    Name(String),
    /// The object form: `{"type": "user", "id": "42", ...extra}`.
    Ref {
        /// The `type` key.
        kind: String,
        /// The `id` key.
        id: String,
        /// Every other key of the object. Never contains `type` or `id`
        /// when parsed; if set by hand, `kind` and `id` win on output.
        extra: JsonObject,
    },
}

impl Party {
    /// The envelope's JSON form of this party.
    pub fn to_json(&self) -> Value {
        match self {
            Self::Name(name) => Value::String(name.clone()),
            Self::Ref { kind, id, extra } => {
                let mut out = extra.clone();
                out.insert("type".to_owned(), Value::String(kind.clone()));
                out.insert("id".to_owned(), Value::String(id.clone()));
                Value::Object(out)
            }
        }
    }
}

impl Serialize for Party {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Name(name) => serializer.serialize_str(name),
            Self::Ref { kind, id, extra } => {
                let rest = extra.iter().filter(|(k, _)| *k != "type" && *k != "id");
                let mut map = serializer.serialize_map(None)?;
                map.serialize_entry("type", kind)?;
                map.serialize_entry("id", id)?;
                for (k, v) in rest {
                    map.serialize_entry(k, v)?;
                }
                map.end()
            }
        }
    }
}

/// How far an event can be trusted, from raw to proof-ready.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default, Serialize, Deserialize,
)]
pub enum TrustTier {
    /// Raw: as received.
    #[default]
    T0,
    /// Observed.
    T1,
    /// Attributed.
    T2,
    /// Authority-bound.
    T3,
    /// Proof-ready.
    T4,
}

impl TrustTier {
    /// Every tier, lowest first.
    pub const ALL: [Self; 5] = [Self::T0, Self::T1, Self::T2, Self::T3, Self::T4];

    /// `"T0"` .. `"T4"`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::T0 => "T0",
            Self::T1 => "T1",
            Self::T2 => "T2",
            Self::T3 => "T3",
            Self::T4 => "T4",
        }
    }
}

impl fmt::Display for TrustTier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for TrustTier {
    type Err = ValidationError;

    /// Exact and case-sensitive, as on the wire; the error names `trustTier`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|t| t.as_str() == s)
            .ok_or_else(|| ValidationError::new("trustTier", "must be one of T0, T1, T2, T3, T4"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn trust_tier_text_round_trips() {
        for t in TrustTier::ALL {
            assert_eq!(t.as_str().parse::<TrustTier>(), Ok(t));
            assert_eq!(serde_json::to_value(t).unwrap(), json!(t.as_str()));
            assert_eq!(serde_json::from_value::<TrustTier>(json!(t.as_str())).unwrap(), t);
        }
        for bad in ["t0", "T5", "", " T1", "T01"] {
            let err = bad.parse::<TrustTier>().unwrap_err();
            assert_eq!(err.field, "trustTier");
        }
    }

    #[test]
    fn absent_fields_are_omitted() {
        let e = Event::named("page.viewed");
        assert_eq!(e.to_json(), json!({"event": "page.viewed"}));
        assert_eq!(serde_json::to_value(&e).unwrap(), e.to_json());
        let text: Value = serde_json::from_str(&e.to_json_text()).unwrap();
        assert_eq!(text, e.to_json());
    }

    #[test]
    fn every_field_uses_its_camel_case_key() {
        let obj = |k: &str| Some(JsonObject::from_iter([(k.to_owned(), json!(1))]));
        let e = Event {
            event: "e".into(),
            business_id: Some("b".into()),
            actor: Some(Party::Name("a".into())),
            object: Some(Party::Ref {
                kind: "sku".into(),
                id: "9".into(),
                extra: JsonObject::from_iter([("n".to_owned(), json!(2))]),
            }),
            entity: obj("en"),
            trace_id: Some("t".into()),
            source: obj("s"),
            attribution: obj("at"),
            context: obj("c"),
            trackable: obj("tr"),
            decision_id: Some("d".into()),
            proof_id: Some("p".into()),
            outcome: obj("o"),
            trust_tier: Some(TrustTier::T3),
            compliance_mapping: obj("cm"),
            properties: obj("pr"),
            timestamp: Some(1_700_000_000_000),
            message_id: Some("m".into()),
        };
        let expected = json!({
            "event": "e", "businessId": "b", "actor": "a",
            "object": {"type": "sku", "id": "9", "n": 2},
            "entity": {"en": 1}, "traceId": "t", "source": {"s": 1},
            "attribution": {"at": 1}, "context": {"c": 1}, "trackable": {"tr": 1},
            "decisionId": "d", "proofId": "p", "outcome": {"o": 1}, "trustTier": "T3",
            "complianceMapping": {"cm": 1}, "properties": {"pr": 1},
            "timestamp": 1_700_000_000_000_i64, "messageId": "m",
        });
        assert_eq!(e.to_json(), expected);
        assert_eq!(serde_json::to_value(&e).unwrap(), expected);
    }

    #[test]
    fn party_type_and_id_win_over_extra_keys_set_by_hand() {
        let p = Party::Ref {
            kind: "user".into(),
            id: "1".into(),
            extra: JsonObject::from_iter([("id".to_owned(), json!("spoof"))]),
        };
        let expected = json!({"type": "user", "id": "1"});
        assert_eq!(p.to_json(), expected);
        assert_eq!(serde_json::to_value(&p).unwrap(), expected);
    }
}
