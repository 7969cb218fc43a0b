//! Every route of the cloud's API, as its OpenAPI document lists them,
//! against malformed input from a fully privileged caller: broken and
//! wrongly typed JSON bodies, nesting past any parser's patience, invalid
//! UTF-8, odd path parameters and query strings. Each must be answered
//! with a client error in the API's error shape, or a success, never a
//! server error or a panic, and the cloud must keep serving. The same for
//! every argument of every GraphQL root field. And the config files of
//! both binaries: a value far past any sane one is refused under its key.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose

use std::collections::HashMap;

use opgraph_tests::backends::Backend;
use opgraph_tests::{Cloud, client};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

/// Bodies no route can take as they are.
fn bad_bodies() -> Vec<Vec<u8>> {
    let wrong_types = json!({
        "name": 1, "id": [], "event": 7, "events": "x", "scopes": "all", "limit": -1,
        "amount": "NaN", "currency": 5, "from": "yesterday", "to": {}, "status": 3,
        "traceId": [1], "decisionId": {}, "grantId": false, "query": {"a": 1},
        "steps": "a,b", "records": 9, "destination": [], "config": "x", "url": 12,
        "timestamp": "now", "actor": 5, "object": [], "properties": "p", "code": {},
        "kind": 0, "metric": [], "window": "forever", "receiptIds": "r", "items": {},
    });
    let deep_array = format!("{}{}", "[".repeat(5_000), "]".repeat(5_000));
    let deep_object = format!("{}1{}", "{\"a\":".repeat(1_000), "}".repeat(1_000));
    vec![
        Vec::new(),
        b"{".to_vec(),
        b"null".to_vec(),
        b"[]".to_vec(),
        b"\"text\"".to_vec(),
        b"42".to_vec(),
        b"{}".to_vec(),
        b"{\"unknownField\": 1}".to_vec(),
        b"{\"amount\": 1e999}".to_vec(),
        b"{\"name\": \"\xff\xfe\"}".to_vec(),
        wrong_types.to_string().into_bytes(),
        deep_array.into_bytes(),
        deep_object.into_bytes(),
    ]
}

/// `schema` (of the OpenAPI document `doc`) resolved through `$ref`s and
/// the first of `oneOf`/`anyOf`.
fn resolve<'a>(doc: &'a Value, schema: &'a Value) -> &'a Value {
    let mut schema = schema;
    for _ in 0..10 {
        if let Some(reference) = schema["$ref"].as_str() {
            let name = reference.trim_start_matches("#/components/schemas/");
            schema = &doc["components"]["schemas"][name];
        } else if let Some(first) = schema["oneOf"].get(0).or_else(|| schema["anyOf"].get(0)) {
            schema = first;
        } else {
            break;
        }
    }
    schema
}

/// The first type a schema allows other than null.
fn type_of(schema: &Value) -> &str {
    match &schema["type"] {
        Value::String(t) => Some(t.as_str()),
        Value::Array(types) => types.iter().filter_map(Value::as_str).find(|t| *t != "null"),
        _ => None,
    }
    .unwrap_or(if schema["properties"].is_object() { "object" } else { "string" })
}

/// A plain value of `schema`: its required properties only, the first
/// value of an enum.
fn sample(doc: &Value, schema: &Value, depth: usize) -> Value {
    let schema = resolve(doc, schema);
    if let Some(first) = schema["enum"].get(0) {
        return first.clone();
    }
    match type_of(schema) {
        "object" if depth < 4 => {
            let required: Vec<&str> = schema["required"]
                .as_array()
                .map(|r| r.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            let mut object = serde_json::Map::new();
            for name in required {
                object.insert(name.to_owned(), sample(doc, &schema["properties"][name], depth + 1));
            }
            Value::Object(object)
        }
        "object" => json!({}),
        "array" if depth < 4 => json!([sample(doc, &schema["items"], depth + 1)]),
        "array" => json!([]),
        "integer" => json!(1),
        "number" => json!(1.5),
        "boolean" => json!(true),
        _ => json!("x"),
    }
}

/// Values each property is set to in turn: edges of every JSON type.
fn edge_values() -> Vec<Value> {
    vec![
        Value::Null,
        json!(""),
        json!("x".repeat(70_000)),
        json!(" \u{0} \u{202e}"),
        json!(-1),
        json!(0),
        json!(i64::MAX),
        json!(i64::MIN),
        serde_json::from_str("18446744073709551616").unwrap(),
        json!(1e308),
        json!(-1e308),
        json!(0.5),
        json!(true),
        json!([]),
        json!({}),
        json!(vec![0; 10_000]),
        json!({"nested": {"deeper": [1, "two", null]}}),
    ]
}

/// Bodies for an operation whose request schema is `schema`: the plain
/// sample, then each property of it (and of its objects, three deep) set
/// to each of [`edge_values`].
fn edge_bodies(doc: &Value, schema: &Value) -> Vec<Value> {
    let mut base = sample(doc, schema, 0);
    // Optional choices made too (each enum property's first value): an
    // edge then meets the options that change a handler's path, as a
    // metric's `interval` makes it walk buckets up to `to`.
    let resolved = resolve(doc, schema);
    if let (Some(object), Some(props)) = (base.as_object_mut(), resolved["properties"].as_object())
    {
        for (name, property) in props {
            if let Some(first) = resolve(doc, property)["enum"].get(0) {
                object.entry(name.clone()).or_insert_with(|| first.clone());
            }
        }
    }
    let mut bodies = vec![base.clone()];
    let mut paths = Vec::new();
    properties(doc, schema, &mut Vec::new(), &mut paths);
    let edges = edge_values();
    for path in paths {
        for edge in &edges {
            let mut body = base.clone();
            let mut at = &mut body;
            for (i, name) in path.iter().enumerate() {
                if !at.is_object() {
                    *at = json!({});
                }
                let slot = at.as_object_mut().expect("an object").entry(name.clone());
                at = slot.or_insert(Value::Null);
                if i + 1 == path.len() {
                    *at = edge.clone();
                }
            }
            bodies.push(body);
        }
    }
    bodies
}

/// The paths to every property of `schema`, three objects deep.
fn properties(doc: &Value, schema: &Value, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    let schema = resolve(doc, schema);
    let Some(props) = schema["properties"].as_object() else { return };
    if prefix.len() >= 3 {
        return;
    }
    for (name, property) in props {
        prefix.push(name.clone());
        out.push(prefix.clone());
        properties(doc, property, prefix, out);
        prefix.pop();
    }
}

/// Values put in place of every path parameter.
const PATH_VALUES: [&str; 4] = ["missing", "%2e%2e%2fkeys", "%00%ff", "x"];

/// A query string of wrong values for the usual parameters.
const BAD_QUERY: &str = "limit=-5&from=x&to=99999999999999999999999&cursor=%ff%fe&traceId=\
    &event=%00&businessId=&outcome=sometimes&status=&strict=maybe&offset=-1&q=";

/// An operation of the OpenAPI document: method, path, and the schema of
/// its JSON body (`Null` when it takes none).
struct Operation {
    method: Method,
    path: String,
    body: Value,
}

/// The OpenAPI document and its operations.
async fn operations(cloud: &Cloud) -> (Value, Vec<Operation>) {
    let (status, doc) = cloud.call(&client(), &cloud.key, Method::GET, "/api/openapi", None).await;
    assert_eq!(status, StatusCode::OK);
    let mut operations = Vec::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for (method, operation) in item.as_object().expect("a path item") {
            if let Ok(method) = method.to_uppercase().parse::<Method>() {
                let body =
                    operation["requestBody"]["content"]["application/json"]["schema"].clone();
                operations.push(Operation { method, path: path.clone(), body });
            }
        }
    }
    (doc, operations)
}

/// The `id` of what an answer describes: at its top, or in its one object.
fn id_in(answer: &[u8]) -> Option<String> {
    let json: Value = serde_json::from_slice(answer).ok()?;
    let object = json.as_object()?;
    let id = object.get("id").or_else(|| {
        let inner: Vec<&Value> = object.values().filter(|v| v.is_object()).collect();
        inner.first().and_then(|v| v.get("id")).filter(|_| inner.len() == 1)
    });
    id.and_then(Value::as_str).map(str::to_owned)
}

/// `path` with every `{param}` replaced by `value`.
fn filled(path: &str, value: &str) -> String {
    let mut out = String::new();
    let mut rest = path;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let close = rest[open..].find('}').map_or(rest.len(), |c| open + c + 1);
        out.push_str(value);
        rest = &rest[close..];
    }
    out.push_str(rest);
    out
}

/// What is wrong with an answer to bad input to `path`, if anything.
fn problem(path: &str, status: StatusCode, body: &[u8]) -> Option<String> {
    if status.is_server_error() {
        return Some(format!("server error {status}: {}", String::from_utf8_lossy(body)));
    }
    // A scanned code's page is for people: its errors are HTML.
    if status.is_client_error() && !path.starts_with("/r/") {
        let json: Value = match serde_json::from_slice(body) {
            Ok(json) => json,
            Err(_) => return Some(format!("{status} without a JSON body")),
        };
        let shaped = json["error"]["code"].is_string() && json["error"]["message"].is_string();
        if !shaped {
            return Some(format!("{status} not in the error shape: {json}"));
        }
    }
    None
}

async fn every_route_answers_bad_input_with_a_client_error(backend: Backend) {
    // No rate limit: thousands of requests in a row are the point here.
    let cloud = backend.start(&[("OPGRAPH_RATE_LIMIT_RPS", "0".to_owned())]).await.unwrap();
    let http = client();
    let (doc, operations) = operations(&cloud).await;
    assert!(operations.len() >= 50, "the document lists {} operations", operations.len());
    let mut problems = Vec::new();
    let mut sent = 0;
    // Ids of what the plain samples created, by collection path: the
    // routes of one item get their bodies on it too, not only on ids that
    // name nothing.
    let mut created: HashMap<String, String> = HashMap::new();
    for operation in &operations {
        let Operation { method, path, .. } = operation;
        let mut bodies: Vec<Option<Vec<u8>>> = vec![None];
        if [Method::POST, Method::PUT, Method::PATCH].contains(method) {
            bodies = bad_bodies().into_iter().map(Some).collect();
            if !operation.body.is_null() {
                let edges = edge_bodies(&doc, &operation.body);
                bodies.extend(edges.iter().map(|b| Some(b.to_string().into_bytes())));
            }
        }
        let collection = path.split("/{").next().unwrap_or(path);
        let mut values: Vec<String> = PATH_VALUES.iter().map(|v| (*v).to_owned()).collect();
        if let Some(id) = created.get(collection).filter(|_| path.contains('{')) {
            values.insert(0, id.clone());
        }
        for (i, value) in values.iter().enumerate() {
            let target = filled(path, value);
            if target == *path && i > 0 {
                continue;
            }
            // Every body with the first value, one with the others.
            let tried = if i == 0 { bodies.len() } else { 1 };
            for body in &bodies[..tried] {
                let mut url = cloud.at(&target);
                if body.is_none() {
                    url = format!("{url}?{BAD_QUERY}");
                }
                let mut request = http.request(method.clone(), &url).bearer_auth(&cloud.key);
                if let Some(body) = body {
                    request = request.header("content-type", "application/json").body(body.clone());
                }
                sent += 1;
                // A connection closed without an answer is a problem too
                // (a handler that panicked), reported with the others.
                let problem = match request.send().await {
                    Ok(response) => {
                        let status = response.status();
                        let answer = response.bytes().await.unwrap_or_default();
                        if status.is_success()
                            && *method == Method::POST
                            && !path.contains('{')
                            && let Some(id) = id_in(&answer)
                        {
                            created.entry(path.clone()).or_insert(id);
                        }
                        problem(path, status, &answer)
                    }
                    Err(e) => Some(format!("no answer: {e}")),
                };
                if let Some(problem) = problem {
                    let shown =
                        body.as_ref().map(|b| String::from_utf8_lossy(&b[..b.len().min(120)]));
                    problems.push(format!("{method} {target} body {shown:?}: {problem}"));
                }
            }
        }
    }
    assert!(sent > 2_000, "only {sent} requests");
    // The samples are good enough to create items, whose routes were
    // then tried on them.
    for collection in ["/api/governance/decision-objects", "/api/governance/authority-grants"] {
        assert!(created.contains_key(collection), "nothing created at {collection}: {created:?}");
    }
    assert!(problems.is_empty(), "{} of {sent} answers:\n{}", problems.len(), problems.join("\n"));
    // Still serving, and nothing panicked on the way.
    let (status, _) = cloud.call(&http, &cloud.key, Method::GET, "/api/health", None).await;
    assert_eq!(status, StatusCode::OK);
    let (_, log) = cloud.cloud.process.stop().await.unwrap();
    let panics: Vec<&String> = log.iter().filter(|l| l.contains("panicked")).collect();
    assert!(panics.is_empty(), "{panics:#?}");
}

/// Every argument of every GraphQL root field (as introspection lists
/// them) set to the edges of its type: each answer is data or errors in
/// GraphQL's shape with status 200, never an internal error.
async fn every_graphql_argument_takes_its_edges(backend: Backend) {
    let cloud = backend.start(&[("OPGRAPH_RATE_LIMIT_RPS", "0".to_owned())]).await.unwrap();
    let http = client();
    let introspect = json!({"query": "{ __schema { queryType { fields { name \
        args { name type { name kind ofType { name kind ofType { name kind } } } } \
        type { kind ofType { kind } } } } } }"});
    let (status, schema) =
        cloud.call(&http, &cloud.key, Method::POST, "/api/graphql", Some(&introspect)).await;
    assert_eq!(status, StatusCode::OK, "{schema}");
    let fields = schema["data"]["__schema"]["queryType"]["fields"].as_array().expect("fields");
    // Times are 64-bit Ints here; limits 32-bit.
    let ints =
        ["0", "-1", "2147483647", "-2147483648", "9223372036854775807", "-9223372036854775808"];
    let strings = [
        "\"\"",
        "\"\\u0000\"",
        "\"%_*\"",
        "\"\\u202e\\ud7ff\"",
        &format!("\"{}\"", "x".repeat(5000)),
    ];
    let lists = ["[]", "[{event: \"\"}]", "[{event: \"a\", name: \"\\u0000\"}]"];
    let mut problems = Vec::new();
    let mut sent = 0;
    for field in fields {
        let name = field["name"].as_str().expect("a name");
        for arg in field["args"].as_array().into_iter().flatten() {
            let arg_name = arg["name"].as_str().expect("an argument name");
            let ty = &arg["type"];
            let named = ty["name"].as_str().or(ty["ofType"]["name"].as_str());
            let edges: Vec<&str> = match (named, ty["kind"].as_str()) {
                (Some("Int"), _) => ints.to_vec(),
                (Some("String"), _) => strings.to_vec(),
                (_, Some("LIST")) | (None, _) => lists.to_vec(),
                _ => continue, // enums: validated by GraphQL itself
            };
            for edge in edges {
                // `__typename` fits whatever the field returns.
                let query =
                    json!({"query": format!("{{ {name}({arg_name}: {edge}) {{ __typename }} }}")});
                let (status, answer) =
                    cloud.call(&http, &cloud.key, Method::POST, "/api/graphql", Some(&query)).await;
                sent += 1;
                let internal = answer["errors"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|e| e["extensions"]["code"] == "internal");
                if status != StatusCode::OK || internal || answer.is_null() {
                    problems.push(format!(
                        "{name}({arg_name}: {}): {status} {answer}",
                        &edge[..edge.len().min(40)]
                    ));
                }
            }
        }
    }
    assert!(sent > 100, "only {sent} queries");
    assert!(problems.is_empty(), "{} of {sent}:\n{}", problems.len(), problems.join("\n"));
    let (_, log) = cloud.cloud.process.stop().await.unwrap();
    let panics: Vec<&String> = log.iter().filter(|l| l.contains("panicked")).collect();
    assert!(panics.is_empty(), "{panics:#?}");
}

opgraph_tests::both_backends!(
    every_route_answers_bad_input_with_a_client_error,
    every_graphql_argument_takes_its_edges
);

/// The gateway's example with one table of each source kind it lacks,
/// every duration of theirs written out.
fn gateway_example_with_every_source() -> String {
    let example = include_str!("../../deploy/gateway.example.toml");
    format!(
        "{example}\n\
         [sources.mqtt_ingest.rules.throttle]\nmin_interval = \"1s\"\nmax_interval = \"30s\"\n\
         [[sources.serial]]\nname = \"dock\"\npath = \"/dev/ttyUSB0\"\nprotocol = \"rfid_line\"\n\
         device = {{ type = \"reader\", id = \"dock\" }}\ndwell = \"1s\"\ndepart_after = \"3s\"\n\
         backoff_initial = \"200ms\"\nbackoff_max = \"10s\"\nmax_clock_skew = \"5min\"\n\
         [[sources.firmware]]\nname = \"fw\"\nport = {{ path = \"/dev/ttyACM0\" }}\n\
         backoff_initial = \"200ms\"\nbackoff_max = \"10s\"\nmax_clock_skew = \"5min\"\n\
         [[sources.modbus]]\nname = \"press\"\ntcp = \"127.0.0.1:502\"\npoll_interval = \"1s\"\n\
         timeout = \"1s\"\nbackoff_initial = \"200ms\"\nbackoff_max = \"30s\"\n\
         device = {{ type = \"plc\", id = \"press\" }}\n\
         [[sources.modbus.registers]]\nname = \"t\"\ntable = \"holding_register\"\naddress = 0\n"
    )
}

/// Each duration or size `text` sets, as the text with that one value
/// far past any sane one (`u64::MAX` seconds, 16 EiB), and its key.
fn far_out_values(text: &str) -> Vec<(String, &str)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut variants = Vec::new();
    for (n, line) in lines.iter().enumerate() {
        let Some((key, value)) = line.split_once(" = ").filter(|_| !line.starts_with('#')) else {
            continue;
        };
        let value = value.split('#').next().unwrap_or_default().trim().trim_matches('"');
        // A number and a unit: "10ms", "30days", "256KiB".
        let unit = value.trim_start_matches(|c: char| c.is_ascii_digit() || c == '.');
        if unit.len() == value.len() || unit.is_empty() || !unit.chars().all(char::is_alphabetic) {
            continue;
        }
        let far = if unit.ends_with('B') { "\"16EiB\"" } else { "\"18446744073709551615s\"" };
        let mut changed = lines.clone();
        let replaced = format!("{key} = {far}");
        changed[n] = &replaced;
        variants.push((changed.join("\n"), key));
    }
    variants
}

/// A problem's key path (before its first `:`) ends with `key`.
fn names(problem: &str, key: &str) -> bool {
    problem.split(':').next().is_some_and(|at| at.ends_with(key))
}

fn gateway_config(text: &str) -> Result<opgraph_gateway::config::Config, Vec<String>> {
    let env = |k: &str| (k == "OPGRAPH_GATEWAY_API_KEY").then(|| "og_e0123456789abcdef".into());
    let read = || {
        let mut config = opgraph_gateway::config::Config::parse(text)?;
        config.apply_env(env)?;
        config.validate()?;
        Ok(config)
    };
    read().map_err(|e| match e {
        opgraph_gateway::error::Error::InvalidConfig { problems } => problems,
        other => vec![other.to_string()],
    })
}

/// Every duration and size in every table of the gateway's config, set
/// far past any sane value, is refused under its own key, except where a
/// longer value only means "never" and nothing is held for it (throttle
/// intervals, clock skew) and the buffer's disk bound (a full disk is its
/// own case).
#[test]
fn every_gateway_duration_and_size_has_a_ceiling() {
    let text = gateway_example_with_every_source();
    gateway_config(&text).unwrap();
    let unbounded = ["min_interval", "max_interval", "max_clock_skew", "max_bytes"];
    let mut checked = Vec::new();
    for (changed, key) in far_out_values(&text) {
        let problems = match gateway_config(&changed) {
            Ok(_) if unbounded.contains(&key) => continue,
            Ok(_) => panic!("{key} far out accepted"),
            Err(problems) => problems,
        };
        let named = problems.iter().any(|p| names(p, key));
        assert_eq!(named, !unbounded.contains(&key), "{key} far out: {problems:?}");
        checked.push(key);
    }
    for key in ["backoff_max", "poll_interval", "depart_after", "io_error_wait", "body_limit"] {
        assert!(checked.contains(&key), "{key} not reached: {checked:?}");
    }
    assert!(checked.len() > 25, "{checked:?}");
}

/// A reconnecting loop with a zero first step would retry flat out.
#[test]
fn every_gateway_backoff_starts_above_zero() {
    let text = gateway_example_with_every_source()
        .replace("backoff_initial = \"200ms\"", "backoff_initial = \"0s\"");
    let problems = gateway_config(&text).unwrap_err();
    let keys: Vec<&str> = problems.iter().filter_map(|p| p.split(':').next()).collect();
    assert_eq!(
        keys,
        [
            "uplink.backoff_initial",
            "sources.mqtt[0].backoff_initial",
            "sources.modbus[0].backoff_initial",
            "sources.serial[0].backoff_initial",
            "sources.firmware[0].backoff_initial",
        ],
    );
}

/// The same for every duration and size of the cloud's example config.
#[test]
fn every_cloud_duration_and_size_has_a_ceiling() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("cloud.toml");
    let load = |text: &str| {
        std::fs::write(&file, text).unwrap();
        opgraph_cloud::config::Config::load(Some(&file), |_| None)
    };
    let text = include_str!("../../deploy/cloud.example.toml");
    load(text).unwrap();
    let mut checked = Vec::new();
    for (changed, key) in far_out_values(text) {
        let Err(problem) = load(&changed) else { panic!("{key} far out accepted") };
        assert!(problem.key.ends_with(key), "{key} far out: {problem}");
        checked.push(key);
    }
    assert_eq!(
        checked,
        [
            "body_limit",
            "header_timeout",
            "body_timeout",
            "group_commit_window",
            "writer_cache",
            "timeout",
            "retry_base",
            "anomaly_interval",
            "log_retention",
            "lease"
        ]
    );
}
