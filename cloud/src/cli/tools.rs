//! The API calls that the MCP server offers as tools and the CLI's
//! commands make: each a name, what it is for, the JSON Schema of its
//! arguments and how the arguments become a request. One table, so that
//! the two clients cannot drift apart.

use hyper::Method;
use serde_json::{Map, Value, json};

/// How a tool's arguments become a request.
#[derive(Debug, Clone, Copy)]
enum Input {
    /// The arguments object is the JSON body.
    Body,
    /// `{"events": [...]}` is sent as `{"batch": [...]}`.
    Batch,
    /// The arguments are the query string.
    Query,
    /// The argument named here fills the path's `{id}`.
    PathId(&'static str),
}

pub struct Tool {
    pub name: &'static str,
    pub description: &'static str,
    method: &'static str,
    path: &'static str,
    input: Input,
    properties: fn() -> Value,
    required: &'static [&'static str],
}

/// A request ready for [`super::client::ApiClient::call`].
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    pub method: Method,
    pub path: String,
    pub body: Option<Value>,
}

fn limit() -> Value {
    json!({"type": "integer", "minimum": 0, "maximum": 1000, "description": "Most records returned (default 100)"})
}

fn text(description: &str) -> Value {
    json!({"type": "string", "description": description})
}

fn period(description: &str) -> Value {
    json!({"type": "object", "description": description, "required": ["from", "to"],
        "properties": {"from": millis("Start"), "to": millis("End")}})
}

fn millis(description: &str) -> Value {
    json!({"type": "integer", "description": format!("{description}, ms since the Unix epoch")})
}

pub const TOOLS: &[Tool] = &[
    Tool {
        name: "ingest_events",
        description: "Record events (at most 1000 per call). Each is an Opgraph envelope: \
            `event` (required), optional `actor` and `object` (a string or {type, id, ...}), \
            `traceId`, `businessId`, `properties`, `messageId` (makes a retry store once), \
            `timestamp` (ms). Answers the stored ids.",
        method: "POST",
        path: "/api/ingest",
        input: Input::Batch,
        properties: || {
            json!({"events": {"type": "array", "minItems": 1, "maxItems": 1000,
                "items": {"type": "object"}, "description": "Event envelopes"}})
        },
        required: &["events"],
    },
    Tool {
        name: "list_events",
        description: "Recent events, newest first, with their ids; filter by name, trace, \
            business and time.",
        method: "GET",
        path: "/api/events",
        input: Input::Query,
        properties: || {
            json!({"event": text("Event name"), "traceId": text("Trace id"),
                "businessId": text("Business id"), "from": millis("Earliest"),
                "to": millis("Latest"), "limit": limit()})
        },
        required: &[],
    },
    Tool {
        name: "search_events",
        description: "Case-insensitive search over event names, property values and actor and \
            object ids.",
        method: "POST",
        path: "/api/analytics/event-search",
        input: Input::Body,
        properties: || {
            json!({"query": text("Text to find"), "event": text("Only this event name"),
                "businessId": text("Only this business"),
                "from": millis("Earliest"), "to": millis("Latest"), "limit": limit()})
        },
        required: &["query"],
    },
    Tool {
        name: "agent_context",
        description: "What an agent should know now: changes, anomalies, missing proof events \
            and governed next actions.",
        method: "POST",
        path: "/api/intelligence/agent-context",
        input: Input::Body,
        properties: || {
            json!({"mode": {"type": "string", "enum": ["summarize", "recommend_next_actions",
                    "detect_anomalies", "proof_gaps"]},
                "businessId": text("Business id"), "limit": limit()})
        },
        required: &["mode"],
    },
    Tool {
        name: "query_metrics",
        description: "Event counts and revenue over a range (default the last 30 days), per \
            event name, optionally as an hourly or daily series, with the workspace's metric \
            definitions evaluated.",
        method: "POST",
        path: "/api/metrics/query",
        input: Input::Body,
        properties: || {
            json!({"eventName": text("Only this event"), "from": millis("Range start"),
                "to": millis("Range end"), "interval": {"type": "string", "enum": ["hour", "day"]},
                "businessId": text("Business id"),
                "persistSnapshots": {"type": "boolean", "description": "Keep the values as snapshots"},
                "limit": limit()})
        },
        required: &[],
    },
    Tool {
        name: "whats_changed",
        description: "Period-over-period diff (default: the last 7 days against the 7 before): \
            totals, revenue, event diffs, new and disappeared event types.",
        method: "POST",
        path: "/api/analytics/whats-changed",
        input: Input::Body,
        properties: || {
            json!({"businessId": text("Business id"), "limit": limit(),
                "current": period("The period looked at (default the last 7 days)"),
                "previous": period("The period compared with (default as long, right before)")})
        },
        required: &[],
    },
    Tool {
        name: "business_health",
        description: "A business's health score with its reasons and anomalies.",
        method: "GET",
        path: "/api/businesses/{id}/health",
        input: Input::PathId("businessId"),
        properties: || json!({"businessId": text("Business id, e.g. `default`")}),
        required: &["businessId"],
    },
    Tool {
        name: "graphql",
        description: "A GraphQL query over the operating graph (events, entities, metrics, \
            receipts, ...); the schema is introspectable.",
        method: "POST",
        path: "/api/graphql",
        input: Input::Body,
        properties: || {
            json!({"query": text("GraphQL document"),
                "variables": {"type": "object", "description": "Variables of the document"}})
        },
        required: &["query"],
    },
    Tool {
        name: "enforce_action",
        description: "Ask governance whether a proposed action may go ahead. Answers the \
            outcome (allow, escrow, needs_human_approval or deny), every check, and the id of \
            the receipt recorded.",
        method: "POST",
        path: "/api/governance/enforce",
        input: Input::Body,
        properties: || {
            json!({"decisionObjectId": text("Decision object id"),
                "authorityGrantId": text("Authority grant id"),
                "contextContractId": text("Context contract id"),
                "proposedAction": {"type": "object",
                    "description": "{action, amount?, currency?, actor?, ...}"}})
        },
        required: &["decisionObjectId", "authorityGrantId", "contextContractId", "proposedAction"],
    },
    Tool {
        name: "track",
        description: "Record a use of a registered trackable (QR code, barcode, RFID tag, \
            sensor, robot, agent) by its code.",
        method: "POST",
        path: "/api/track",
        input: Input::Body,
        properties: || {
            json!({"code": text("The trackable's code"), "event": text("Event name"),
                "properties": {"type": "object"}, "actor": {}})
        },
        required: &["code"],
    },
    Tool {
        name: "create_trackable",
        description: "Register a trackable (a QR code, barcode, RFID tag, sensor, robot, AI \
            agent, MCP server or CLI workflow) and get its code and scan URL; a QR code needs \
            `targetUrl`.",
        method: "POST",
        path: "/api/trackables",
        input: Input::Body,
        properties: || {
            json!({"kind": {"type": "string", "enum": ["qr_code", "barcode", "rfid_tag", "sensor",
                    "robot", "ai_agent", "mcp_server", "cli_workflow"]},
                "name": text("What it is"), "targetUrl": text("Where a QR scan leads"),
                "eventName": text("Event recorded when it is used"),
                "code": text("An external identifier (an EPC, a GTIN) to register"),
                "includeQrSvg": {"type": "boolean", "description": "Return the QR code as SVG"}})
        },
        required: &["kind", "name"],
    },
    Tool {
        name: "usage",
        description: "Usage metering of the workspace: events this month and the quota, API \
            calls, connector load, agent activity.",
        method: "GET",
        path: "/api/usage",
        input: Input::Query,
        properties: || json!({"limit": limit()}),
        required: &[],
    },
];

impl Tool {
    pub fn find(name: &str) -> Option<&'static Tool> {
        TOOLS.iter().find(|tool| tool.name == name)
    }

    /// The JSON Schema of the arguments.
    pub fn input_schema(&self) -> Value {
        json!({"type": "object", "properties": (self.properties)(), "required": self.required})
    }

    /// The request `args` (an object) stand for; `Err` says which argument
    /// is missing or unusable.
    pub fn call(&self, args: &Value) -> Result<Call, String> {
        let empty = Map::new();
        let args = match args {
            Value::Object(args) => args,
            Value::Null => &empty,
            _ => return Err("the arguments must be an object".into()),
        };
        for name in self.required {
            if args.get(*name).is_none_or(Value::is_null) {
                return Err(format!("`{name}` is required"));
            }
        }
        let method = Method::from_bytes(self.method.as_bytes()).map_err(|e| e.to_string())?;
        let mut path = self.path.to_owned();
        let body = match self.input {
            Input::Body => Some(Value::Object(args.clone())),
            Input::Batch => Some(json!({"batch": args.get("events").cloned().unwrap_or_default()})),
            Input::Query => {
                let mut query = url::form_urlencoded::Serializer::new(String::new());
                for (name, value) in args {
                    match value {
                        Value::String(text) => query.append_pair(name, text),
                        Value::Number(_) | Value::Bool(_) => {
                            query.append_pair(name, &value.to_string())
                        }
                        Value::Null => &mut query,
                        _ => return Err(format!("`{name}` must be a string, number or boolean")),
                    };
                }
                let query = query.finish();
                if !query.is_empty() {
                    path = format!("{path}?{query}");
                }
                None
            }
            Input::PathId(name) => {
                let id = args.get(name).and_then(Value::as_str).filter(|id| !id.is_empty());
                let id = id.ok_or_else(|| format!("`{name}` must be a non-empty string"))?;
                let encoded: String = url::form_urlencoded::byte_serialize(id.as_bytes()).collect();
                path = path.replace("{id}", &encoded.replace('+', "%20"));
                None
            }
        };
        Ok(Call { method, path, body })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn call(name: &str, args: Value) -> Result<Call, String> {
        Tool::find(name).unwrap().call(&args)
    }

    #[test]
    fn arguments_become_body_query_or_path() {
        let ingest = call("ingest_events", json!({"events": [{"event": "a"}]})).unwrap();
        assert_eq!((ingest.method, ingest.path.as_str()), (Method::POST, "/api/ingest"));
        assert_eq!(ingest.body, Some(json!({"batch": [{"event": "a"}]})));
        let listed = call("list_events", json!({"event": "door opened", "limit": 5})).unwrap();
        assert_eq!(listed.path, "/api/events?event=door+opened&limit=5");
        assert_eq!(listed.body, None);
        assert_eq!(call("usage", Value::Null).unwrap().path, "/api/usage");
        let health = call("business_health", json!({"businessId": "north/dock 3"})).unwrap();
        assert_eq!(health.path, "/api/businesses/north%2Fdock%203/health");
        let periods = json!({"current": {"from": 10, "to": 20}, "previous": {"from": 0, "to": 10}});
        let changed = call("whats_changed", periods.clone()).unwrap();
        assert_eq!(changed.body, Some(periods), "the periods are the API's own fields");
        let schema = Tool::find("whats_changed").unwrap().input_schema();
        assert_eq!(schema["properties"]["current"]["required"], json!(["from", "to"]));
    }

    #[test]
    fn missing_or_unusable_arguments_are_named() {
        assert_eq!(call("search_events", json!({})).unwrap_err(), "`query` is required");
        assert_eq!(
            call("graphql", json!("{ events }")).unwrap_err(),
            "the arguments must be an object"
        );
        assert!(call("list_events", json!({"event": ["a"]})).unwrap_err().contains("`event`"));
        assert!(
            call("business_health", json!({"businessId": 7})).unwrap_err().contains("businessId")
        );
    }

    #[test]
    fn every_tool_has_a_schema_naming_its_required_arguments() {
        for tool in TOOLS {
            let schema = tool.input_schema();
            for name in tool.required {
                assert!(schema["properties"][name].is_object(), "{}: {name}", tool.name);
            }
        }
    }
}
