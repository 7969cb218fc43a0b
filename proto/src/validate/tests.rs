//! Table tests: each invalid envelope is refused with its field path.

use serde_json::{Value, json};

use super::*;

const NOW: i64 = 1_750_000_000_000;
const YEAR_MS: i64 = 365 * DAY_MS;

fn field_of(v: &Value) -> String {
    match Event::from_json(v, NOW) {
        Ok(e) => panic!("accepted {v}: {e:?}"),
        Err(e) => e.field,
    }
}

/// A valid envelope with one key replaced.
fn with(key: &str, value: Value) -> Value {
    let mut v = json!({"event": "page.viewed", "actor": "u1", "properties": {"a": 1}});
    if let Value::Object(m) = &mut v {
        m.insert(key.to_owned(), value);
    }
    v
}

fn big_object(bytes: usize) -> Value {
    json!({ "k": "x".repeat(bytes) })
}

#[test]
fn invalid_envelopes_name_their_field() {
    let cases: Vec<(Value, &str)> = vec![
        (json!({"actor": "u1"}), "event"),
        (json!({"event": null}), "event"),
        (with("event", json!("")), "event"),
        (with("event", json!("e".repeat(201))), "event"),
        (with("event", json!(7)), "event"),
        (with("event", json!(["a"])), "event"),
        (with("trustTier", json!("T5")), "trustTier"),
        (with("trustTier", json!("t1")), "trustTier"),
        (with("trustTier", json!(1)), "trustTier"),
        (with("timestamp", json!(1.75e12)), "timestamp"),
        (with("timestamp", json!(1_749_999_999_999.0)), "timestamp"),
        (with("timestamp", json!("1749999999999")), "timestamp"),
        (with("timestamp", json!(u64::MAX)), "timestamp"),
        (with("timestamp", json!(NOW - 11 * YEAR_MS)), "timestamp"),
        (with("timestamp", json!(NOW + 2 * DAY_MS)), "timestamp"),
        (with("timestamp", json!(i64::MIN)), "timestamp"),
        (with("actor", json!({"type": "user"})), "actor.id"),
        (with("actor", json!({"id": "1"})), "actor.type"),
        (with("actor", json!({"type": "user", "id": 1})), "actor.id"),
        (with("actor", json!({"type": "", "id": "1"})), "actor.type"),
        (with("actor", json!({"type": "u", "id": null})), "actor.id"),
        (with("actor", json!(42)), "actor"),
        (with("actor", json!("")), "actor"),
        (with("actor", json!(["u1"])), "actor"),
        (with("actor", json!("a".repeat(MAX_PARTY_LEN + 1))), "actor"),
        (with("object", json!(true)), "object"),
        (with("object", json!({"type": "sku"})), "object.id"),
        (with("object", json!({"type": "sku", "id": "1", "x": "y".repeat(65 * 1024)})), "object"),
        (with("properties", json!([1, 2])), "properties"),
        (with("properties", json!("{}")), "properties"),
        (with("properties", big_object(65 * 1024)), "properties"),
        (with("context", json!(1)), "context"),
        (with("complianceMapping", json!([])), "complianceMapping"),
        (with("entity", big_object(MAX_FREE_OBJECT_BYTES)), "entity"),
        (with("traceId", json!(5)), "traceId"),
        (with("traceId", json!("")), "traceId"),
        (with("businessId", json!("b".repeat(201))), "businessId"),
        (with("messageId", json!({})), "messageId"),
        (with("decisionId", json!(false)), "decisionId"),
        (with("proofId", json!([])), "proofId"),
        (with("colour", json!("red")), "colour"),
        (with("id", json!("evt_1")), "id"),
        (with("trust_tier", json!("T1")), "trust_tier"),
        (json!([{"event": "a"}]), ""),
        (json!("page.viewed"), ""),
        (json!(null), ""),
        (json!(12), ""),
    ];
    for (v, field) in cases {
        assert_eq!(field_of(&v), field, "for {v}");
    }
}

#[test]
fn limits_are_inclusive() {
    let at_limit = |key: &str, value: Value| {
        let v = with(key, value);
        if let Err(e) = Event::from_json(&v, NOW) {
            panic!("refused {key} at its limit: {e}");
        }
    };
    at_limit("event", json!("é".repeat(MAX_EVENT_NAME_LEN)));
    at_limit("traceId", json!("t".repeat(MAX_ID_LEN)));
    at_limit("actor", json!("a".repeat(MAX_PARTY_LEN)));
    at_limit("timestamp", json!(NOW - MAX_TIMESTAMP_AGE_MS));
    at_limit("timestamp", json!(NOW + MAX_TIMESTAMP_LEAD_MS));
    at_limit("timestamp", json!(NOW - 9 * YEAR_MS));
    // {"k":"..."} is 8 bytes of framing.
    at_limit("properties", big_object(MAX_FREE_OBJECT_BYTES - 8));
    let over = with("properties", big_object(MAX_FREE_OBJECT_BYTES - 7));
    assert_eq!(field_of(&over), "properties");
}

#[test]
fn messages_are_useful() {
    let err = Event::from_json(&with("actor", json!({"type": "user"})), NOW).unwrap_err();
    assert_eq!(err.to_string(), "actor.id: is required");
    let err = Event::from_json(&with("zzz", json!(1)), NOW).unwrap_err();
    assert_eq!(err.to_string(), "zzz: is not an envelope field");
    let err = Event::from_json(&with("timestamp", json!(1.5)), NOW).unwrap_err();
    assert!(err.message.contains("integer"), "{err}");
}

#[test]
fn top_level_null_reads_as_absent() {
    let v = json!({"event": "a", "traceId": null, "properties": null, "actor": null});
    let e = Event::from_json(&v, NOW).unwrap();
    assert_eq!(e, Event::named("a"));
    assert_eq!(e.to_json(), json!({"event": "a"}));
}

#[test]
fn party_forms_parse() {
    let v = with("actor", json!({"type": "robot", "id": "r2", "site": {"n": 1}}));
    let e = Event::from_json(&v, NOW).unwrap();
    let Some(Party::Ref { kind, id, extra }) = &e.actor else {
        panic!("expected a reference: {e:?}");
    };
    assert_eq!((kind.as_str(), id.as_str()), ("robot", "r2"));
    assert_eq!(Value::Object(extra.clone()), json!({"site": {"n": 1}}));
    assert_eq!(e.to_json(), v);
}

#[test]
fn timestamp_window_is_skipped_by_parse_json_only() {
    let old = with("timestamp", json!(NOW - 20 * YEAR_MS));
    let e = Event::parse_json(&old).unwrap();
    assert_eq!(e.check_timestamp(NOW).unwrap_err().field, "timestamp");
    assert_eq!(e.validate(NOW).unwrap_err().field, "timestamp");
    assert!(e.validate(NOW - 19 * YEAR_MS).is_ok());
}

#[test]
fn window_arithmetic_does_not_overflow() {
    let v = with("timestamp", json!(i64::MAX));
    assert!(Event::from_json(&v, i64::MAX).is_ok());
    let v = with("timestamp", json!(i64::MIN));
    assert!(Event::from_json(&v, i64::MIN).is_ok());
}

#[test]
fn validate_catches_hand_built_mistakes() {
    let mut e = Event::named("");
    assert_eq!(e.validate(NOW).unwrap_err().field, "event");
    e.event = "ok".into();
    e.properties = Some(JsonObject::new());
    assert!(e.validate(NOW).is_ok());
    e.actor = Some(Party::Name(String::new()));
    assert_eq!(e.validate(NOW).unwrap_err().field, "actor");
}

#[test]
fn the_size_bound_is_never_below_the_serialized_size() {
    let samples = [
        json!({}),
        json!({"a": null, "b": true, "c": false, "d": [], "e": {}}),
        json!({"ctl": "\u{1}\u{1f}\n\t\"\\", "wide": "é€😀", "": ""}),
        json!({"n": [u64::MAX, i64::MIN, -2.2250738585072014e-308, 1e15, -0.0, 0.1]}),
        json!({"deep": [[[{"x": [1, [2, [3]]]}]]]}),
    ];
    for sample in samples {
        let Value::Object(map) = sample else { unreachable!() };
        let exact = serde_json::to_vec(&map).expect("serialize").len();
        for limit in [0, exact.saturating_sub(1), exact, 10 * exact, MAX_FREE_OBJECT_BYTES] {
            let bounded = (SizeBound { left: limit }).object(&map).is_some();
            assert!(!bounded || exact <= limit, "{map:?} bounded within {limit}, is {exact}");
            assert_eq!(fits_in(&map, limit), exact <= limit, "{map:?} at {limit}");
        }
    }
}

#[test]
fn numbers_serialize_within_their_bound_however_they_were_written() {
    // With serde_json's `arbitrary_precision`, parsed numbers would keep
    // their digits and outgrow the bound: this fails if it is ever enabled.
    for text in
        ["1".repeat(300), format!("-{}", "9".repeat(300)), format!("0.{}1", "0".repeat(330))]
    {
        let n: Value = serde_json::from_str(&text).expect("a number");
        assert!(n.to_string().len() <= MAX_NUMBER_LEN, "{text} -> {n}");
    }
}

mod size_bound {
    use proptest::prelude::*;
    use serde_json::Value;

    use super::super::SizeBound;

    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            any::<f64>().prop_filter("finite", |f| f.is_finite()).prop_map(Value::from),
            ".{0,12}".prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 48, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::btree_map(".{0,6}", inner, 0..6)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #[test]
        fn no_value_serializes_past_its_bound(v in json_value()) {
            let exact = serde_json::to_vec(&v).expect("serialize").len();
            let mut bound = SizeBound { left: usize::MAX };
            prop_assert!(bound.value(&v).is_some());
            prop_assert!(usize::MAX - bound.left >= exact, "{} bounded by {}", v, usize::MAX - bound.left);
        }
    }
}
