//! Property tests over the public API:
//! - every valid envelope survives JSON -> Event -> protobuf bytes -> Event
//!   -> JSON unchanged;
//! - a valid envelope with one field broken is refused naming that field,
//!   on the JSON path and on the protobuf path alike.

use opgraph_proto::{
    Event, MAX_EVENT_NAME_LEN, MAX_FREE_OBJECT_BYTES, MAX_ID_LEN, MAX_PARTY_LEN,
    MAX_TIMESTAMP_AGE_MS, MAX_TIMESTAMP_LEAD_MS, pb,
};
use proptest::prelude::*;
use prost::Message;
use serde_json::{Map, Value, json};

const NOW: i64 = 1_750_000_000_000;

/// Any text, including control characters, quotes and astral-plane chars.
fn text(len: std::ops::RangeInclusive<usize>) -> impl Strategy<Value = String> {
    prop_oneof![
        prop::collection::vec(any::<char>(), len.clone()).prop_map(String::from_iter),
        prop::collection::vec(prop::char::range('a', 'z'), len).prop_map(String::from_iter),
    ]
}

/// A bounded non-empty string that sometimes sits exactly at its limit.
fn bounded(max: usize) -> impl Strategy<Value = String> {
    prop_oneof![4 => text(1..=24), 1 => text(max..=max)]
}

fn number() -> impl Strategy<Value = Value> {
    prop_oneof![
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        // Only finite floats exist in JSON.
        any::<f64>().prop_filter("finite", |f| f.is_finite()).prop_map(Value::from),
        (-1000i32..1000).prop_map(|i| Value::from(f64::from(i))),
    ]
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        number(),
        text(0..=16).prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(text(0..=8), inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn json_object() -> impl Strategy<Value = Map<String, Value>> {
    prop::collection::btree_map(text(0..=12), json_value(), 0..6)
        .prop_map(|m| m.into_iter().collect())
}

fn party() -> impl Strategy<Value = Value> {
    let extra = json_object().prop_map(|mut m| {
        m.remove("type");
        m.remove("id");
        m
    });
    prop_oneof![
        bounded(MAX_PARTY_LEN).prop_map(Value::String),
        (bounded(MAX_PARTY_LEN), bounded(MAX_PARTY_LEN), extra).prop_map(|(kind, id, mut m)| {
            m.insert("type".into(), Value::String(kind));
            m.insert("id".into(), Value::String(id));
            Value::Object(m)
        }),
    ]
}

fn timestamp() -> impl Strategy<Value = i64> {
    let (from, to) = (NOW - MAX_TIMESTAMP_AGE_MS, NOW + MAX_TIMESTAMP_LEAD_MS);
    prop_oneof![from..=to, Just(from), Just(to), Just(NOW)]
}

const ID_FIELDS: [&str; 5] = ["businessId", "traceId", "decisionId", "proofId", "messageId"];
const FREE_FIELDS: [&str; 8] = [
    "entity",
    "source",
    "attribution",
    "context",
    "trackable",
    "outcome",
    "complianceMapping",
    "properties",
];

/// Any valid envelope: every optional field independently present or not.
fn envelope() -> impl Strategy<Value = Value> {
    let ids = prop::collection::vec(prop::option::of(bounded(MAX_ID_LEN)), 5);
    let frees = prop::collection::vec(prop::option::of(json_object()), 8);
    let parties = (prop::option::of(party()), prop::option::of(party()));
    let tier = prop::option::of(prop::sample::select(vec!["T0", "T1", "T2", "T3", "T4"]));
    let ts = prop::option::of(timestamp());
    (bounded(MAX_EVENT_NAME_LEN), ids, frees, parties, tier, ts).prop_map(
        |(event, ids, frees, (actor, object), tier, ts)| {
            let mut m = Map::new();
            m.insert("event".into(), Value::String(event));
            for (key, v) in ID_FIELDS.iter().zip(ids) {
                if let Some(v) = v {
                    m.insert((*key).into(), Value::String(v));
                }
            }
            for (key, v) in FREE_FIELDS.iter().zip(frees) {
                if let Some(v) = v {
                    m.insert((*key).into(), Value::Object(v));
                }
            }
            for (key, v) in [("actor", actor), ("object", object)] {
                if let Some(v) = v {
                    m.insert(key.into(), v);
                }
            }
            if let Some(t) = tier {
                m.insert("trustTier".into(), json!(t));
            }
            if let Some(t) = ts {
                m.insert("timestamp".into(), json!(t));
            }
            Value::Object(m)
        },
    )
}

/// One way to break an envelope, and the field the error must name.
fn fault() -> impl Strategy<Value = (&'static str, Value)> {
    let over = "x".repeat(MAX_FREE_OBJECT_BYTES);
    prop_oneof![
        Just(("event", json!(""))),
        Just(("event", json!("e".repeat(MAX_EVENT_NAME_LEN + 1)))),
        Just(("event", json!(12))),
        Just(("trustTier", json!("T7"))),
        Just(("timestamp", json!(1.5e12))),
        Just(("timestamp", json!("1750000000000"))),
        (1..1000i64).prop_map(|d| ("timestamp", json!(NOW - 11 * 365 * 86_400_000 - d))),
        (1..1000i64).prop_map(|d| ("timestamp", json!(NOW + 2 * 86_400_000 + d))),
        Just(("actor", json!(7))),
        Just(("actor.id", json!({"type": "user"}))),
        Just(("object.type", json!({"id": "1", "type": 3}))),
        prop::sample::select(FREE_FIELDS.to_vec()).prop_map(|f| (f, json!([1]))),
        prop::sample::select(FREE_FIELDS.to_vec())
            .prop_map(move |f| (f, json!({ "k": over.clone() }))),
        prop::sample::select(ID_FIELDS.to_vec()).prop_map(|f| (f, json!(""))),
        prop::sample::select(ID_FIELDS.to_vec()).prop_map(|f| (f, json!(1))),
        "[A-Z][a-zA-Z]{0,10}".prop_map(|k| ("?", json!(k))),
    ]
}

/// Inserts the fault into `v`, returning the expected error field.
fn break_envelope(v: &mut Value, (field, bad): (&str, Value)) -> String {
    let Value::Object(m) = v else {
        return String::new();
    };
    if field == "?" {
        // An unknown key: envelope keys are all lower camelCase, these start
        // with a capital letter.
        let key = bad.as_str().unwrap_or("X").to_owned();
        m.insert(key.clone(), json!(true));
        return key;
    }
    let key = field.split('.').next().unwrap_or(field);
    m.insert(key.to_owned(), bad);
    field.to_owned()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn valid_envelopes_round_trip_through_protobuf(v in envelope(), seq in any::<u64>()) {
        let event = Event::from_json(&v, NOW).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(&event.to_json(), &v);
        prop_assert_eq!(&serde_json::to_value(&event).unwrap(), &v);
        let text: serde_json::Value = serde_json::from_str(&event.to_json_text()).unwrap();
        prop_assert_eq!(&text, &v);

        let msg = event.to_pb("evt_1".into(), seq);
        let bytes = msg.encode_to_vec();
        let decoded = pb::Event::decode(bytes.as_slice()).unwrap();
        prop_assert_eq!(&decoded, &msg);

        let back = Event::from_pb(decoded, NOW).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(&back, &event);
        prop_assert_eq!(back.to_json(), v);
    }

    #[test]
    fn a_broken_field_is_named_on_both_paths(mut v in envelope(), f in fault()) {
        let field = break_envelope(&mut v, f);
        let err = Event::from_json(&v, NOW).unwrap_err();
        prop_assert_eq!(&err.field, &field, "{}", err);

        // Smuggle the same fault through protobuf where the wire can carry it.
        if let Some(msg) = smuggle(&v) {
            let err = Event::from_pb(msg, NOW).unwrap_err();
            prop_assert_eq!(&err.field, &field, "{}", err);
        }
    }

    #[test]
    fn arbitrary_json_never_panics(v in json_value()) {
        let _ = Event::from_json(&v, NOW);
        let _ = Event::from_json(&json!({"event": "e", "properties": v.clone()}), NOW);
        let _ = Event::from_json(&json!({"event": "e", "actor": v}), NOW);
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        if let Ok(msg) = pb::Event::decode(bytes.as_slice()) {
            let _ = Event::from_pb(msg, NOW);
        }
        let msg = pb::Event {
            event: "e".into(),
            properties_json: Some(bytes.clone()),
            actor: Some(pb::Party {
                form: Some(pb::party::Form::Ref(pb::PartyRef {
                    r#type: "t".into(),
                    id: "i".into(),
                    extra_json: bytes,
                })),
            }),
            ..pb::Event::default()
        };
        let _ = Event::from_pb(msg, NOW);
    }
}

/// The protobuf message a careless or hostile producer would send for the
/// (invalid) envelope `v`, when the wire can express the fault at all.
fn smuggle(v: &Value) -> Option<pb::Event> {
    let m = v.as_object()?;
    let text = |k: &str| m.get(k).and_then(Value::as_str).map(str::to_owned);
    let json = |k: &str| m.get(k).map(|v| v.to_string().into_bytes());
    let party = |k: &str| -> Option<Option<pb::Party>> {
        let form = match m.get(k) {
            None => return Some(None),
            Some(Value::String(s)) => pb::party::Form::Name(s.clone()),
            Some(Value::Object(o)) => {
                let mut extra = o.clone();
                let kind = extra.remove("type")?.as_str()?.to_owned();
                let id = extra.remove("id")?.as_str()?.to_owned();
                pb::party::Form::Ref(pb::PartyRef {
                    r#type: kind,
                    id,
                    extra_json: Value::Object(extra).to_string().into_bytes(),
                })
            }
            Some(_) => return None,
        };
        Some(Some(pb::Party { form: Some(form) }))
    };
    // Keys and types that protobuf has no way to carry.
    let typed =
        ["event", "businessId", "traceId", "decisionId", "proofId", "messageId", "trustTier"];
    for (k, v) in m {
        let ok = match k.as_str() {
            k if typed.contains(&k) => v.is_string(),
            "timestamp" => v.is_i64(),
            k => FREE_FIELDS.contains(&k) || k == "actor" || k == "object",
        };
        if !ok {
            return None;
        }
    }
    Some(pb::Event {
        id: "evt_1".into(),
        event: text("event").unwrap_or_default(),
        timestamp_ms: m.get("timestamp").and_then(Value::as_i64),
        actor: party("actor")?,
        object: party("object")?,
        business_id: text("businessId"),
        trust_tier: text("trustTier"),
        trace_id: text("traceId"),
        decision_id: text("decisionId"),
        proof_id: text("proofId"),
        message_id: text("messageId"),
        properties_json: json("properties"),
        context_json: json("context"),
        source_json: json("source"),
        attribution_json: json("attribution"),
        trackable_json: json("trackable"),
        outcome_json: json("outcome"),
        entity_json: json("entity"),
        compliance_mapping_json: json("complianceMapping"),
        ..pb::Event::default()
    })
}
