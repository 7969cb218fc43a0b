//! `opgraph`, the command-line client: the API's everyday calls as
//! commands, files of events sent in batches, any call by method and path,
//! and `opgraph mcp`, the tool-protocol server. Same key as every client;
//! answers are printed as JSON on stdout, progress and errors on stderr.
//! Reference: `docs/cli.md`.

pub mod client;
pub mod mcp;
pub mod tools;

use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use hyper::Method;
use serde_json::{Map, Value, json};

use client::{ApiClient, Target};
use tools::Tool;

/// Events per `POST /api/ingest` when sending a file (the API's maximum).
const BATCH_EVENTS: usize = 1000;
/// Bytes of envelopes per batch, under the cloud's default 1 MiB body limit.
const BATCH_BYTES: usize = 768 * 1024;
/// Tries per batch when the cloud is busy (429, 503) or unreachable.
const BATCH_ATTEMPTS: u32 = 5;

#[derive(Parser)]
#[command(name = "opgraph", version, about = "Command-line client of an Opgraph cloud")]
pub struct Cli {
    /// The cloud's URL.
    #[arg(long, global = true, env = "OPGRAPH_URL", default_value = "http://127.0.0.1:8080")]
    url: String,
    /// An API key (og_...) or an enterprise token.
    #[arg(long, global = true, env = "OPGRAPH_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// Workspace id, for a token that names several workspaces.
    #[arg(long, global = true, env = "OPGRAPH_WORKSPACE_ID")]
    workspace: Option<String>,
    /// PEM file of the CA to trust for an https:// URL instead of the
    /// platform's roots.
    #[arg(long, global = true, env = "OPGRAPH_CA_FILE")]
    ca_file: Option<PathBuf>,
    /// Bound on each call, e.g. `30s`.
    #[arg(long, global = true, default_value = "30s", value_parser = humantime_serde::re::humantime::parse_duration)]
    timeout: Duration,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Whether the cloud is ready (`GET /api/health`).
    Health {
        /// Fail (exit 1) on any failed required check.
        #[arg(long)]
        strict: bool,
    },
    /// Record events: one from the arguments, or every envelope of
    /// `--file` (JSON values one after another, e.g. one per line, or
    /// arrays of them), sent in batches with progress on stderr.
    Ingest {
        /// Event name of the one event to send.
        #[arg(required_unless_present = "file", conflicts_with = "file")]
        event: Option<String>,
        /// A property, `key=value` (the value is read as JSON when it
        /// parses, e.g. `12.5` or `true`, else as text); repeatable.
        #[arg(long = "prop", value_name = "KEY=VALUE")]
        props: Vec<String>,
        /// Actor id.
        #[arg(long)]
        actor: Option<String>,
        /// Object id.
        #[arg(long)]
        object: Option<String>,
        #[arg(long)]
        trace_id: Option<String>,
        #[arg(long)]
        business_id: Option<String>,
        /// Makes a repeat of this command store the event once.
        #[arg(long)]
        message_id: Option<String>,
        /// Envelopes to send; `-` reads stdin.
        #[arg(long, value_name = "PATH")]
        file: Option<PathBuf>,
    },
    /// Recent events, newest first.
    Events {
        #[arg(long)]
        event: Option<String>,
        #[arg(long)]
        trace_id: Option<String>,
        #[arg(long)]
        business_id: Option<String>,
        #[arg(long)]
        limit: Option<u64>,
    },
    /// Events matching a text, case-insensitively.
    Search {
        text: String,
        #[arg(long)]
        event: Option<String>,
        #[arg(long)]
        limit: Option<u64>,
    },
    /// Record a use of a registered trackable by its code.
    Track {
        code: String,
        /// Event name (default: the trackable's).
        #[arg(long)]
        event: Option<String>,
        /// `key=value`, repeatable.
        #[arg(long = "prop", value_name = "KEY=VALUE")]
        props: Vec<String>,
    },
    /// Agent context: changes, anomalies, missing proof, next actions.
    Context {
        #[arg(long, default_value = "summarize")]
        mode: String,
        #[arg(long)]
        business_id: Option<String>,
        #[arg(long)]
        limit: Option<u64>,
    },
    /// Event counts and revenue over a range, per event name.
    Metrics {
        /// Only this event.
        #[arg(long)]
        event: Option<String>,
        /// Range start, ms since the epoch (default 30 days before `--to`).
        #[arg(long)]
        from: Option<i64>,
        /// Range end, ms since the epoch (default now).
        #[arg(long)]
        to: Option<i64>,
        /// `hour` or `day`: add a series.
        #[arg(long)]
        interval: Option<String>,
        /// Keep the values as snapshots.
        #[arg(long)]
        persist_snapshots: bool,
        #[arg(long)]
        limit: Option<u64>,
    },
    /// Register a trackable (QR code, barcode, RFID tag, sensor, ...).
    CreateTrackable {
        /// qr_code, barcode, rfid_tag, sensor, robot, ai_agent, mcp_server, cli_workflow.
        #[arg(long)]
        kind: String,
        #[arg(long)]
        name: String,
        /// Where a QR scan leads (required for qr_code).
        #[arg(long)]
        target_url: Option<String>,
        /// Event recorded when it is used.
        #[arg(long)]
        event_name: Option<String>,
        /// An external identifier to register (an EPC, a GTIN).
        #[arg(long)]
        code: Option<String>,
        /// Include the QR code as SVG.
        #[arg(long)]
        qr_svg: bool,
    },
    /// A GraphQL query.
    Graphql {
        query: String,
        /// Variables, as a JSON object.
        #[arg(long)]
        variables: Option<String>,
    },
    /// Create a tracking plan.
    CreateTrackingPlan {
        #[arg(long)]
        name: String,
        #[arg(long)]
        vertical: String,
        /// An event the plan names; repeatable.
        #[arg(long = "event")]
        events: Vec<String>,
    },
    /// Create a governance decision object.
    CreateDecision {
        #[arg(long)]
        title: String,
        /// draft, pending_approval, approved, rejected, executed, revoked, expired.
        #[arg(long, default_value = "draft")]
        status: String,
        /// low, medium, high, critical.
        #[arg(long, default_value = "low")]
        risk_level: String,
        #[arg(long)]
        description: Option<String>,
        #[arg(long)]
        trace_id: Option<String>,
    },
    /// Any API call: `opgraph api GET /api/usage`, `opgraph api POST
    /// /api/governance/enforce --data @request.json`.
    Api {
        method: String,
        /// Path with its query, e.g. `/api/events?limit=5`.
        path: String,
        /// JSON body, `@file`, or `@-` for stdin.
        #[arg(long)]
        data: Option<String>,
    },
    /// Serve the Model Context Protocol on stdin and stdout: the API as
    /// tools for an agent host.
    Mcp,
}

/// Runs the command line of this process.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let target = Target {
        url: cli.url.clone(),
        api_key: cli.api_key.clone(),
        workspace: cli.workspace.clone(),
        ca_file: cli.ca_file.clone(),
        timeout: cli.timeout,
    };
    let client = match ApiClient::new(&target) {
        Ok(client) => client,
        Err(e) => {
            eprintln!("opgraph: {e}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("opgraph: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(&client, cli.command)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Usage(e)) => {
            eprintln!("opgraph: {e}");
            ExitCode::from(2)
        }
        Err(Failure::Call(e)) => {
            eprintln!("opgraph: {e}");
            ExitCode::FAILURE
        }
    }
}

enum Failure {
    /// The command line is wrong (exit 2).
    Usage(String),
    /// The call failed or was refused (exit 1).
    Call(String),
}

async fn run(client: &ApiClient, command: Command) -> Result<(), Failure> {
    let answer = match command {
        Command::Health { strict } => {
            let path = if strict { "/api/health?strict=1" } else { "/api/health" };
            request(client, Method::GET, path, None).await?
        }
        Command::Ingest { file: Some(file), .. } => return send_file(client, &file).await,
        Command::Ingest {
            event, props, actor, object, trace_id, business_id, message_id, ..
        } => {
            let mut envelope = Map::new();
            envelope.insert("event".into(), json!(event.unwrap_or_default()));
            let fields = [
                ("actor", actor),
                ("object", object),
                ("traceId", trace_id),
                ("businessId", business_id),
                ("messageId", message_id),
            ];
            for (name, value) in fields {
                if let Some(value) = value {
                    envelope.insert(name.into(), json!(value));
                }
            }
            if !props.is_empty() {
                envelope.insert("properties".into(), properties(&props)?);
            }
            tool(client, "ingest_events", json!({"events": [envelope]})).await?
        }
        Command::Events { event, trace_id, business_id, limit } => {
            let args = json!({"event": event, "traceId": trace_id, "businessId": business_id, "limit": limit});
            tool(client, "list_events", args).await?
        }
        Command::Search { text, event, limit } => {
            tool(client, "search_events", json!({"query": text, "event": event, "limit": limit}))
                .await?
        }
        Command::Track { code, event, props } => {
            let mut args = json!({"code": code, "event": event});
            if !props.is_empty() {
                args["properties"] = properties(&props)?;
            }
            tool(client, "track", args).await?
        }
        Command::Context { mode, business_id, limit } => {
            let args = json!({"mode": mode, "businessId": business_id, "limit": limit});
            tool(client, "agent_context", args).await?
        }
        Command::Metrics { event, from, to, interval, persist_snapshots, limit } => {
            let args = json!({"eventName": event, "from": from, "to": to, "interval": interval,
                "persistSnapshots": persist_snapshots.then_some(true), "limit": limit});
            tool(client, "query_metrics", args).await?
        }
        Command::CreateTrackable { kind, name, target_url, event_name, code, qr_svg } => {
            let args = json!({"kind": kind, "name": name, "targetUrl": target_url,
                "eventName": event_name, "code": code, "includeQrSvg": qr_svg.then_some(true)});
            tool(client, "create_trackable", args).await?
        }
        Command::Graphql { query, variables } => {
            let mut args = json!({"query": query});
            if let Some(variables) = variables {
                args["variables"] = serde_json::from_str(&variables)
                    .map_err(|e| Failure::Usage(format!("--variables: {e}")))?;
            }
            tool(client, "graphql", args).await?
        }
        Command::CreateTrackingPlan { name, vertical, events } => {
            let events: Vec<Value> = events.into_iter().map(|name| json!({"name": name})).collect();
            let body = json!({"name": name, "vertical": vertical, "events": events});
            request(client, Method::POST, "/api/tracking-plans", Some(&body)).await?
        }
        Command::CreateDecision { title, status, risk_level, description, trace_id } => {
            let mut body = json!({"title": title, "status": status, "riskLevel": risk_level});
            if let Some(description) = description {
                body["description"] = json!(description);
            }
            if let Some(trace_id) = trace_id {
                body["traceId"] = json!(trace_id);
            }
            request(client, Method::POST, "/api/governance/decision-objects", Some(&body)).await?
        }
        Command::Api { method, path, data } => {
            let method = Method::from_bytes(method.to_ascii_uppercase().as_bytes())
                .map_err(|_| Failure::Usage(format!("not an HTTP method: {method}")))?;
            if !path.starts_with('/') {
                return Err(Failure::Usage(format!("the path must start with `/`: {path}")));
            }
            let body = data.map(|data| read_data(&data)).transpose()?;
            request(client, method, &path, body.as_ref()).await?
        }
        Command::Mcp => {
            let stdin = tokio::io::BufReader::new(tokio::io::stdin());
            return mcp::serve(client, stdin, tokio::io::stdout())
                .await
                .map_err(|e| Failure::Call(format!("stdio: {e}")));
        }
    };
    print(&answer);
    Ok(())
}

/// The call of tool `name` with `args`, nulls dropped (an option not given).
async fn tool(client: &ApiClient, name: &str, args: Value) -> Result<Value, Failure> {
    let tool = Tool::find(name).ok_or_else(|| Failure::Usage(format!("no tool {name}")))?;
    let args = match args {
        Value::Object(map) => {
            Value::Object(map.into_iter().filter(|(_, v)| !v.is_null()).collect())
        }
        other => other,
    };
    let call = tool.call(&args).map_err(Failure::Usage)?;
    request(client, call.method, &call.path, call.body.as_ref()).await
}

async fn request(
    client: &ApiClient,
    method: Method,
    path: &str,
    body: Option<&Value>,
) -> Result<Value, Failure> {
    let reply = client.call(method, path, body).await.map_err(Failure::Call)?;
    reply.into_result().map_err(Failure::Call)
}

fn print(answer: &Value) {
    let text = serde_json::to_string_pretty(answer).unwrap_or_default();
    let mut stdout = std::io::stdout().lock();
    // A closed pipe (`| head`) is not an error worth reporting.
    let _ = writeln!(stdout, "{text}");
}

/// `key=value` pairs as a JSON object; a value is JSON when it parses as
/// JSON, else text.
fn properties(pairs: &[String]) -> Result<Value, Failure> {
    let mut object = Map::new();
    for pair in pairs {
        let (key, value) = pair
            .split_once('=')
            .filter(|(key, _)| !key.is_empty())
            .ok_or_else(|| Failure::Usage(format!("--prop {pair:?}: expected KEY=VALUE")))?;
        let value = serde_json::from_str(value).unwrap_or_else(|_| json!(value));
        object.insert(key.to_owned(), value);
    }
    Ok(Value::Object(object))
}

/// `--data`: inline JSON, `@file` or `@-`.
fn read_data(data: &str) -> Result<Value, Failure> {
    let text = match data.strip_prefix('@') {
        Some("-") => std::io::read_to_string(std::io::stdin())
            .map_err(|e| Failure::Usage(format!("--data @-: {e}")))?,
        Some(path) => std::fs::read_to_string(path)
            .map_err(|e| Failure::Usage(format!("--data @{path}: {e}")))?,
        None => data.to_owned(),
    };
    serde_json::from_str(&text).map_err(|e| Failure::Usage(format!("--data: not JSON: {e}")))
}

/// Sends every envelope of `path` in batches. A batch the cloud refuses as
/// invalid stops the run, naming the envelope's position in the file;
/// everything before it is stored.
async fn send_file(client: &ApiClient, path: &PathBuf) -> Result<(), Failure> {
    let reader: Box<dyn BufRead> = if path.as_os_str() == "-" {
        Box::new(std::io::BufReader::new(std::io::stdin()))
    } else {
        let file = std::fs::File::open(path)
            .map_err(|e| Failure::Usage(format!("--file {}: {e}", path.display())))?;
        Box::new(std::io::BufReader::new(file))
    };
    let mut envelopes = Envelopes::new(reader);
    let (mut sent, mut batches) = (0usize, 0usize);
    let run = crate::ids::new_id("cli");
    loop {
        let batch = envelopes.next_batch().map_err(|e| {
            Failure::Usage(format!("--file {}: {e} ({sent} events sent before)", path.display()))
        })?;
        if batch.is_empty() {
            break;
        }
        let body = json!({"batch": batch});
        // The same key on every try of this batch: a retry after a lost
        // answer stores nothing twice.
        let key = format!("{run}-{batches}");
        send_batch(client, &body, &key).await.map_err(|e| {
            Failure::Call(format!(
                "events {} to {}: {e} ({sent} events sent before)",
                sent + 1,
                sent + batch.len()
            ))
        })?;
        sent += batch.len();
        batches += 1;
        eprintln!("opgraph: {sent} events sent ({batches} batches)");
    }
    print(&json!({"accepted": sent, "batches": batches}));
    Ok(())
}

/// One batch, retried while the cloud is busy or unreachable.
async fn send_batch(client: &ApiClient, body: &Value, key: &str) -> Result<(), String> {
    let mut wait = Duration::from_millis(500);
    let mut attempt = 1;
    loop {
        let failure = match client.call_keyed(Method::POST, "/api/ingest", Some(body), key).await {
            Ok(reply) if !matches!(reply.status, 429 | 503) => {
                return reply.into_result().map(drop);
            }
            Ok(busy) => busy.into_result().err().unwrap_or_default(),
            Err(unreachable) => unreachable,
        };
        if attempt == BATCH_ATTEMPTS {
            return Err(failure);
        }
        eprintln!("opgraph: {failure}; trying again in {wait:?}");
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(Duration::from_secs(30));
        attempt += 1;
    }
}

/// Envelopes read from JSON values one after another: objects, arrays of
/// objects, or `{"batch": [...]}`, cut into batches.
struct Envelopes {
    values:
        serde_json::StreamDeserializer<'static, serde_json::de::IoRead<Box<dyn BufRead>>, Value>,
    /// Read but not yet sent (the rest of an array).
    queued: std::collections::VecDeque<Value>,
    /// Position in the file of the next envelope, for error sentences.
    read: usize,
}

impl Envelopes {
    fn new(reader: Box<dyn BufRead>) -> Envelopes {
        Envelopes {
            values: serde_json::Deserializer::from_reader(reader).into_iter(),
            queued: Default::default(),
            read: 0,
        }
    }

    fn next_batch(&mut self) -> Result<Vec<Value>, String> {
        let (mut batch, mut bytes) = (Vec::new(), 0usize);
        while batch.len() < BATCH_EVENTS && bytes < BATCH_BYTES {
            let Some(envelope) = self.next_envelope()? else { break };
            bytes += envelope.to_string().len();
            batch.push(envelope);
        }
        Ok(batch)
    }

    fn next_envelope(&mut self) -> Result<Option<Value>, String> {
        loop {
            if let Some(envelope) = self.queued.pop_front() {
                self.read += 1;
                if !envelope.is_object() {
                    return Err(format!("envelope {} is not a JSON object", self.read));
                }
                return Ok(Some(envelope));
            }
            match self.values.next() {
                None => return Ok(None),
                Some(Err(e)) => return Err(format!("after envelope {}: {e}", self.read)),
                Some(Ok(Value::Array(items))) => self.queued.extend(items),
                Some(Ok(Value::Object(mut object))) => match object.remove("batch") {
                    Some(Value::Array(items)) if object.is_empty() => self.queued.extend(items),
                    Some(other) => {
                        object.insert("batch".into(), other);
                        self.queued.push_back(Value::Object(object));
                    }
                    None => self.queued.push_back(Value::Object(object)),
                },
                Some(Ok(other)) => self.queued.push_back(other),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn batches(text: &str) -> Result<Vec<Vec<Value>>, String> {
        let mut envelopes =
            Envelopes::new(Box::new(std::io::Cursor::new(text.as_bytes().to_vec())));
        let mut all = Vec::new();
        loop {
            let batch = envelopes.next_batch()?;
            if batch.is_empty() {
                return Ok(all);
            }
            all.push(batch);
        }
    }

    #[test]
    fn envelopes_are_read_however_they_are_laid_out() {
        let text = "{\"event\": \"a\"}\n{\n  \"event\": \"b\"\n}\n[{\"event\": \"c\"}]\n\
                    {\"batch\": [{\"event\": \"d\"}]}";
        let names: Vec<Value> =
            batches(text).unwrap().concat().iter().map(|e| e["event"].clone()).collect();
        assert_eq!(names, [json!("a"), json!("b"), json!("c"), json!("d")]);
        let many: String = (0..2500).map(|i| format!("{{\"event\": \"e{i}\"}}\n")).collect();
        let sizes: Vec<usize> = batches(&many).unwrap().iter().map(Vec::len).collect();
        assert_eq!(sizes, [1000, 1000, 500]);
    }

    #[test]
    fn a_bad_value_is_placed_in_the_file() {
        let err = batches("{\"event\": \"a\"}\n{\"event\": \"b\"}\n{\"event\": ").unwrap_err();
        assert!(err.starts_with("after envelope 2: "), "{err}");
        let err = batches("{\"event\": \"a\"}\n7\n").unwrap_err();
        assert_eq!(err, "envelope 2 is not a JSON object");
    }

    #[test]
    fn properties_read_json_values_or_text() {
        let props = properties(&["dock=3".into(), "ok=true".into(), "site=north".into()]);
        assert_eq!(props.ok().unwrap(), json!({"dock": 3, "ok": true, "site": "north"}));
        assert!(properties(&["=3".into()]).is_err());
        assert!(properties(&["novalue".into()]).is_err());
    }
}
