//! `opgraph mcp`: a Model Context Protocol server on stdin and stdout, so
//! that an agent host can call the API as tools ([`super::tools::TOOLS`])
//! with the same key as every other client. JSON-RPC 2.0, one message per
//! line; logs go to stderr, never to stdout, which carries only messages.
//!
//! Requests are answered one at a time, in order. Bad input is answered
//! with the JSON-RPC error for it (parse error, invalid request, unknown
//! method or tool) and the server carries on; a tool whose API call fails
//! answers a result with `isError`, so that the model sees why.

use serde_json::{Value, json};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::client::ApiClient;
use super::tools::{TOOLS, Tool};

/// The protocol revisions this server speaks, newest first.
const VERSIONS: [&str; 3] = ["2025-06-18", "2025-03-26", "2024-11-05"];
/// Longest message line read; a longer one is answered with an error and
/// skipped. A thousand events fit many times over.
const MAX_LINE: usize = 16 * 1024 * 1024;

const PARSE_ERROR: i64 = -32700;
const INVALID_REQUEST: i64 = -32600;
const METHOD_NOT_FOUND: i64 = -32601;
const INVALID_PARAMS: i64 = -32602;

/// Serves until `input` ends.
pub async fn serve(
    client: &ApiClient,
    mut input: impl AsyncBufRead + Unpin,
    mut output: impl AsyncWrite + Unpin,
) -> std::io::Result<()> {
    let mut line = Vec::new();
    loop {
        line.clear();
        let read = (&mut input).take(MAX_LINE as u64 + 1).read_until(b'\n', &mut line).await?;
        if read == 0 {
            return Ok(());
        }
        let answer = if line.len() > MAX_LINE && line.last() != Some(&b'\n') {
            skip_rest_of_line(&mut input).await?;
            Some(error(
                Value::Null,
                INVALID_REQUEST,
                format!("message longer than {MAX_LINE} bytes"),
            ))
        } else if line.iter().all(u8::is_ascii_whitespace) {
            None
        } else {
            handle(client, &line).await
        };
        if let Some(answer) = answer {
            let mut bytes = serde_json::to_vec(&answer).map_err(std::io::Error::other)?;
            bytes.push(b'\n');
            output.write_all(&bytes).await?;
            output.flush().await?;
        }
    }
}

async fn skip_rest_of_line(input: &mut (impl AsyncBufRead + Unpin)) -> std::io::Result<()> {
    loop {
        let buffer = input.fill_buf().await?;
        if buffer.is_empty() {
            return Ok(());
        }
        match buffer.iter().position(|b| *b == b'\n') {
            Some(end) => {
                input.consume(end + 1);
                return Ok(());
            }
            None => {
                let all = buffer.len();
                input.consume(all);
            }
        }
    }
}

/// The answer to one message; `None` for a notification.
async fn handle(client: &ApiClient, line: &[u8]) -> Option<Value> {
    let message: Value = match serde_json::from_slice(line) {
        Ok(message) => message,
        Err(e) => return Some(error(Value::Null, PARSE_ERROR, format!("parse error: {e}"))),
    };
    let Some(object) = message.as_object() else {
        return Some(error(Value::Null, INVALID_REQUEST, "a message must be a JSON object".into()));
    };
    let id = object.get("id").cloned();
    let Some(method) = object.get("method").and_then(Value::as_str) else {
        // An answer to a request of ours (we send none), or garbage.
        let is_answer = object.contains_key("result") || object.contains_key("error");
        return (!is_answer)
            .then(|| error(id.unwrap_or_default(), INVALID_REQUEST, "`method` is missing".into()));
    };
    // A notification (no id) is never answered.
    let id = id?;
    let params = object.get("params").cloned().unwrap_or_default();
    let result = match method {
        "initialize" => Ok(initialize(&params)),
        "ping" => Ok(json!({})),
        "tools/list" => Ok(json!({"tools": TOOLS.iter().map(describe).collect::<Vec<_>>()})),
        "tools/call" => call_tool(client, &params).await,
        _ => Err((METHOD_NOT_FOUND, format!("unknown method `{method}`"))),
    };
    Some(match result {
        Ok(result) => json!({"jsonrpc": "2.0", "id": id, "result": result}),
        Err((code, message)) => error(id, code, message),
    })
}

fn initialize(params: &Value) -> Value {
    let asked = params["protocolVersion"].as_str();
    let version = VERSIONS.iter().find(|v| Some(**v) == asked).unwrap_or(&VERSIONS[0]);
    json!({
        "protocolVersion": version,
        "capabilities": {"tools": {"listChanged": false}},
        "serverInfo": {"name": "opgraph", "version": env!("CARGO_PKG_VERSION")},
        "instructions": "Tools over one Opgraph workspace: record events, read and search them, \
            ask for agent context and business health, query the graph with GraphQL, and ask \
            governance before acting (enforce_action).",
    })
}

fn describe(tool: &Tool) -> Value {
    json!({"name": tool.name, "description": tool.description, "inputSchema": tool.input_schema()})
}

async fn call_tool(client: &ApiClient, params: &Value) -> Result<Value, (i64, String)> {
    let name = params["name"].as_str().ok_or((INVALID_PARAMS, "`name` is missing".to_owned()))?;
    let tool =
        Tool::find(name).ok_or_else(|| (INVALID_PARAMS, format!("unknown tool `{name}`")))?;
    let outcome = match tool.call(&params["arguments"]) {
        Ok(call) => match client.call(call.method, &call.path, call.body.as_ref()).await {
            Ok(reply) => reply.into_result(),
            Err(e) => Err(format!("the cloud did not answer: {e}")),
        },
        Err(e) => Err(format!("bad arguments: {e}")),
    };
    Ok(match outcome {
        Ok(body) => {
            let text = serde_json::to_string_pretty(&body).unwrap_or_default();
            let mut result = json!({"content": [{"type": "text", "text": text}], "isError": false});
            if body.is_object() {
                result["structuredContent"] = body;
            }
            result
        }
        Err(sentence) => json!({"content": [{"type": "text", "text": sentence}], "isError": true}),
    })
}

fn error(id: Value, code: i64, message: String) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
}
