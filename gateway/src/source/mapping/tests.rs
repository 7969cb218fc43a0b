use serde_json::json;

use super::*;

fn rule(toml_text: &str) -> Rule {
    let config: RuleConfig = toml::from_str(toml_text).unwrap();
    Rule::compile(&config, "rules[0]").unwrap()
}

fn problems(toml_text: &str) -> Vec<String> {
    let config: RuleConfig = toml::from_str(toml_text).unwrap();
    Rule::compile(&config, "rules[0]").unwrap_err()
}

const RFID: &str = r#"
    topic = "site/{site}/readers/{reader}/tags"
    event = "rfid.tag.read"
    actor = { type = "rfid_reader", id = "{reader}", site = "{site}" }
    object = { type = "epc", id = "{/epc}" }
    trackable = { kind = "rfid", code = "{/epc}" }
    properties = { antenna = "{/antenna}", rssi = "{/rssi}", label = "reader {reader} ant {/antenna}", fixed = 7 }
    timestamp = "{/ts}"
"#;

#[test]
fn topic_variables_and_pointers_fill_the_envelope() {
    let rule = rule(RFID);
    assert_eq!(rule.subscription(), "site/+/readers/+/tags");
    let payload = br#"{"epc": "E200341201", "antenna": 2, "rssi": -61.5, "ts": 1795000000123}"#;
    let mapped = rule.apply("site/dock/readers/r7/tags", payload).unwrap();
    assert_eq!(
        Value::Object(mapped.envelope),
        json!({
            "event": "rfid.tag.read",
            "actor": {"type": "rfid_reader", "id": "r7", "site": "dock"},
            "object": {"type": "epc", "id": "E200341201"},
            "trackable": {"kind": "rfid", "code": "E200341201"},
            "properties": {"antenna": 2, "rssi": -61.5, "label": "reader r7 ant 2", "fixed": 7},
        })
    );
    assert_eq!(mapped.device_time_ms, Some(1_795_000_000_123));
}

#[test]
fn absent_lone_placeholders_are_left_out_and_interpolated_ones_reject() {
    let rule = rule(RFID);
    let mapped = rule.apply("site/a/readers/r1/tags", br#"{"epc": "E1", "antenna": 1}"#).unwrap();
    assert_eq!(
        mapped.envelope["properties"],
        json!({"antenna": 1, "label": "reader r1 ant 1", "fixed": 7})
    );
    assert_eq!(mapped.device_time_ms, None);
    let err = rule.apply("site/a/readers/r1/tags", br#"{"epc": "E1"}"#).unwrap_err();
    assert_eq!(err, Reject::MissingField("properties.label: payload /antenna".into()));
    assert_eq!(err.reason(), "missing_field");
}

#[test]
fn topic_filters_match_like_mqtt() {
    let r = rule("topic = \"a/{x}/c\"\nevent = \"e\"\npayload = \"bytes\"");
    assert!(r.matches("a/b/c"));
    assert!(!r.matches("a/b/c/d"));
    assert!(!r.matches("a/b"));
    assert!(!r.matches("x/b/c"));
    let r = rule("topic = \"a/#\"\nevent = \"e\"\npayload = \"bytes\"");
    assert!(r.matches("a"));
    assert!(r.matches("a/b/c"));
    assert!(!r.matches("b/a"));
    let r = rule("topic = \"+/b\"\nevent = \"e\"\npayload = \"bytes\"");
    assert!(r.matches("x/b"));
    assert!(r.matches("/b"));
}

#[test]
fn text_and_bytes_payloads() {
    let r = rule(
        "topic = \"scan/{scanner}\"\nevent = \"barcode.scanned\"\npayload = \"text\"\n\
         trackable = { kind = \"barcode\", code = \"{$payload}\" }\nactor = \"{scanner}\"",
    );
    let mapped = r.apply("scan/s1", b"0123456789").unwrap();
    assert_eq!(mapped.envelope["trackable"], json!({"kind": "barcode", "code": "0123456789"}));
    assert_eq!(mapped.envelope["actor"], json!("s1"));
    assert_eq!(r.apply("scan/s1", &[0xff, 0xfe]).unwrap_err(), Reject::InvalidUtf8);

    let r = rule(
        "topic = \"raw/#\"\nevent = \"raw\"\npayload = \"bytes\"\n\
         properties = { hex = \"{$payload}\", topic = \"{$topic}\" }",
    );
    let mapped = r.apply("raw/x/y", &[0x00, 0xab, 0xff]).unwrap();
    assert_eq!(mapped.envelope["properties"], json!({"hex": "00abff", "topic": "raw/x/y"}));
}

#[test]
fn malformed_payloads_are_rejected_not_panicked_on() {
    let rule = rule(RFID);
    for bad in [&b"{"[..], b"", b"\xff\xfe", b"not json", b"{\"epc\": }", &[b'['; 200][..]] {
        let err = rule.apply("site/a/readers/r1/tags", bad).unwrap_err();
        assert_eq!(err.reason(), "invalid_json", "{bad:?}");
    }
    let deep = "[".repeat(10_000);
    assert_eq!(
        rule.apply("site/a/readers/r1/tags", deep.as_bytes()).unwrap_err().reason(),
        "invalid_json"
    );
    let err = rule
        .apply("site/a/readers/r1/tags", br#"{"epc": "E", "antenna": 1, "ts": "yesterday"}"#)
        .unwrap_err();
    assert_eq!(err.reason(), "bad_timestamp");
    let err = rule
        .apply("site/a/readers/r1/tags", br#"{"epc": "E", "antenna": 1, "ts": [1]}"#)
        .unwrap_err();
    assert_eq!(err.reason(), "bad_timestamp");
    // A JSON scalar is JSON: pointers find nothing.
    let err = rule.apply("site/a/readers/r1/tags", b"42").unwrap_err();
    assert_eq!(err.reason(), "missing_field");
}

#[test]
fn timestamps_as_ms_or_rfc3339() {
    let r = rule("topic = \"t\"\nevent = \"e\"\ntimestamp = \"{/at}\"");
    let at = |v: Value| r.apply("t", v.to_string().as_bytes()).map(|m| m.device_time_ms);
    assert_eq!(at(json!({"at": 1_795_000_000_000_i64})), Ok(Some(1_795_000_000_000)));
    assert_eq!(at(json!({"at": 1_795_000_000_000.7})), Ok(Some(1_795_000_000_000)));
    assert_eq!(at(json!({"at": "2026-11-23T06:00:00Z"})), Ok(Some(1_795_413_600_000)));
    assert_eq!(at(json!({"at": "2026-11-23T06:00:00.250Z"})), Ok(Some(1_795_413_600_250)));
    // A device on local time: the offset counts, with or without a fraction.
    assert_eq!(at(json!({"at": "2026-11-23T07:00:00+01:00"})), Ok(Some(1_795_413_600_000)));
    assert_eq!(at(json!({"at": "2026-11-23T11:30:00.5+05:30"})), Ok(Some(1_795_413_600_500)));
    assert_eq!(at(json!({"at": "2026-11-23T01:00:00-05:00"})), Ok(Some(1_795_413_600_000)));
    assert_eq!(at(json!({"at": "2026-02-30T06:00:00Z"})).unwrap_err().reason(), "bad_timestamp");
    assert_eq!(at(json!({"at": 1e300})).unwrap_err().reason(), "bad_timestamp");
    assert_eq!(at(json!({"at": -1})), Ok(Some(-1)), "the envelope's validation judges the range");

    let r = rule("topic = \"t\"\nevent = \"e\"\ntimestamp = \"{/at}\"\ntimestamp_unit = \"s\"");
    let at = |v: Value| r.apply("t", v.to_string().as_bytes()).map(|m| m.device_time_ms);
    assert_eq!(at(json!({"at": 1_795_000_000})), Ok(Some(1_795_000_000_000)));
    assert_eq!(at(json!({"at": 1_795_000_000.25})), Ok(Some(1_795_000_000_250)));
    assert_eq!(at(json!({"at": i64::MAX})).unwrap_err().reason(), "bad_timestamp");
    let r = rule("topic = \"t\"\nevent = \"e\"\ntimestamp = \"{/at}\"\ntimestamp_unit = \"us\"");
    let at = |v: Value| r.apply("t", v.to_string().as_bytes()).map(|m| m.device_time_ms);
    assert_eq!(at(json!({"at": 1_795_000_000_123_456_i64})), Ok(Some(1_795_000_000_123)));
}

#[test]
fn the_event_name_and_whole_objects_can_come_from_the_payload() {
    let r = rule("topic = \"events\"\nevent = \"{/name}\"\nproperties = \"{/data}\"");
    let mapped = r.apply("events", br#"{"name": "door.opened", "data": {"door": 3}}"#).unwrap();
    assert_eq!(mapped.envelope["event"], json!("door.opened"));
    assert_eq!(mapped.envelope["properties"], json!({"door": 3}));
    assert_eq!(
        r.apply("events", br#"{"data": {}}"#).unwrap_err(),
        Reject::MissingField("event".into())
    );
}

#[test]
fn bad_rules_are_reported_with_their_key_path() {
    let p = problems("topic = \"a/{x}/{x}\"\nevent = \"e\"\nactor = \"{y}\"");
    assert_eq!(p.len(), 2, "{p:?}");
    assert!(p[0].starts_with("rules[0].topic: variable {x} appears twice"), "{p:?}");
    assert!(p[1].starts_with("rules[0].actor: unknown placeholder {y}"), "{p:?}");
    let p = problems("topic = \"a/b#\"\nevent = \"\"");
    assert!(p[0].starts_with("rules[0].topic: segment \"b#\""), "{p:?}");
    assert!(p[1].starts_with("rules[0].event: must not be empty"), "{p:?}");
    let p = problems("topic = \"#/a\"\nevent = \"e\"");
    assert!(p[0].starts_with("rules[0].topic"), "{p:?}");
    let p = problems("topic = \"a\"\nevent = \"e\"\nproperties = { x = \"{/p\" }");
    assert!(p[0].starts_with("rules[0].properties.x: unclosed"), "{p:?}");
    let p = problems("topic = \"a\"\nevent = \"e\"\npayload = \"text\"\nactor = \"{/who}\"");
    assert!(p[0].starts_with("rules[0].payload: /pointer placeholders need"), "{p:?}");
    let p = problems("topic = \"a\"\nevent = \"e\"\ntimestamp = \"at {/t}\"");
    assert!(p[0].starts_with("rules[0].timestamp: must be exactly one placeholder"), "{p:?}");
}

#[test]
fn rule_sets_pick_the_first_match_and_dedupe_subscriptions() {
    let configs: Vec<RuleConfig> = vec![
        toml::from_str("topic = \"r/{id}/tags\"\nevent = \"first\"").unwrap(),
        toml::from_str("topic = \"r/+/tags\"\nevent = \"second\"").unwrap(),
        toml::from_str("topic = \"r/#\"\nevent = \"other\"").unwrap(),
    ];
    let set = RuleSet::compile(&configs, "rules").unwrap();
    assert_eq!(set.subscriptions(), ["r/+/tags", "r/#"]);
    assert_eq!(set.apply("r/1/tags", b"{}").unwrap().envelope["event"], json!("first"));
    assert_eq!(set.apply("r/1/status", b"{}").unwrap().envelope["event"], json!("other"));
    assert_eq!(set.apply("q", b"{}").unwrap_err(), Reject::NoRule);
}

proptest::proptest! {
    /// Whatever a device sends on whatever topic, mapping answers without
    /// panicking.
    #[test]
    fn any_message_maps_or_is_rejected(
        topic in "[a-z0-9/+#{}$]{0,40}",
        payload in proptest::collection::vec(proptest::num::u8::ANY, 0..200),
        json_text in "[\\[\\]{}\":,0-9a-z. -]{0,80}",
    ) {
        let set = RuleSet::compile(
            &[
                toml::from_str(RFID).unwrap(),
                toml::from_str("topic = \"#\"\nevent = \"{/e}\"\nproperties = \"{$payload}\"").unwrap(),
            ],
            "rules",
        )
        .unwrap();
        let _ = set.apply(&topic, &payload);
        let _ = set.apply(&topic, json_text.as_bytes());
        let _ = set.apply("site/a/readers/b/tags", json_text.as_bytes());
    }
}

#[test]
fn compiled_pointers_find_what_serde_json_finds() {
    let doc = json!({
        "a/b": 1, "m~n": 2, "": {"": 3}, "arr": [10, 11, {"x": 12}], "0": "zero",
        "nested": {"deep": {"er": true}}
    });
    let pointers = [
        "/a~1b",
        "/m~0n",
        "/",
        "//",
        "/arr/0",
        "/arr/2/x",
        "/arr/01",
        "/arr/+1",
        "/arr/3",
        "/arr/-1",
        "/0",
        "/nested/deep/er",
        "/nested/missing",
        "/a~1b/deeper",
        "/~01",
    ];
    for p in pointers {
        assert_eq!(Pointer::new(p).find(&doc), doc.pointer(p), "{p}");
    }
}

#[test]
fn a_missing_field_names_its_place_in_the_rule() {
    let rule = rule(
        r#"
        topic = "t"
        event = "e"
        properties = { outer = { list = ["x", "{/gone} text"] } }
    "#,
    );
    let err = rule.apply("t", br#"{"here": 1}"#).unwrap_err();
    assert_eq!(err.to_string(), "properties.outer.list[1]: payload /gone is absent");
}

#[test]
fn compiled_pointers_take_what_they_find() {
    let doc = json!({"a/b": 1, "arr": [10, 11, {"x": 12}], "nested": {"deep": {"er": true}}});
    for p in ["/a~1b", "/arr/1", "/arr/2/x", "/nested/deep", "/arr/01", "/missing"] {
        let mut taken = doc.clone();
        let found = Pointer::new(p).find_mut(&mut taken).map(std::mem::take);
        assert_eq!(found.as_ref(), doc.pointer(p), "{p}");
    }
}

#[test]
fn values_move_only_when_no_two_placeholders_read_the_same_part() {
    let payload = br#"{"id": "t-1", "v": {"x": 1, "y": [2, 3]}, "ts": 1700000000000}"#;
    let cases = [
        // Apart: each value moves.
        (
            r#"properties = { id = "{/id}", v = "{/v}" }"#,
            true,
            json!({"id": "t-1", "v": {"x": 1, "y": [2, 3]}}),
        ),
        // The same pointer twice: the second still finds it.
        (
            r#"properties = { id = "{/id}", again = "{/id}" }"#,
            false,
            json!({"id": "t-1", "again": "t-1"}),
        ),
        // One within another.
        (
            r#"properties = { v = "{/v}", x = "{/v/x}" }"#,
            false,
            json!({"v": {"x": 1, "y": [2, 3]}, "x": 1}),
        ),
        (
            r#"properties = { x = "{/v/x}", v = "{/v}" }"#,
            false,
            json!({"x": 1, "v": {"x": 1, "y": [2, 3]}}),
        ),
        // Read in a text, then alone.
        (
            r#"properties = { label = "tag {/id}", id = "{/id}" }"#,
            false,
            json!({"label": "tag t-1", "id": "t-1"}),
        ),
        // The whole payload beside a pointer.
        (
            r#"properties = { all = "{$payload}", id = "{/id}" }"#,
            false,
            json!({"all": {"id": "t-1", "v": {"x": 1, "y": [2, 3]}, "ts": 1700000000000_i64}, "id": "t-1"}),
        ),
    ];
    for (properties, moves, expected) in cases {
        let rule = rule(&format!(
            "topic = \"tags/{{reader}}\"\nevent = \"tag.read\"\ntimestamp = \"{{/ts}}\"\n{properties}"
        ));
        assert_eq!(rule.moves, moves, "{properties}");
        let mapped = rule.apply("tags/r1", payload).unwrap();
        assert_eq!(mapped.envelope["properties"], expected, "{properties}");
        assert_eq!(mapped.device_time_ms, Some(1_700_000_000_000), "{properties}");
    }
}
