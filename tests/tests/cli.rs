//! The `opgraph` command-line client and its MCP server against the real
//! cloud binary: commands, files of events sent in batches, errors and
//! exit codes, and the tool protocol on stdin and stdout.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Stdio;
use std::time::Duration;

use opgraph_tests::{Cloud, binary};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::Command;

/// Far above what a call on loopback takes; only bounds a failure.
const WITHIN: Duration = Duration::from_secs(60);

struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Run {
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| panic!("{e}: {}", self.stdout))
    }
}

async fn opgraph(cloud: &Cloud, key: &str, args: &[&str]) -> Run {
    let output = Command::new(binary("opgraph").unwrap())
        .args(args)
        .env("OPGRAPH_URL", &cloud.url)
        .env("OPGRAPH_API_KEY", key)
        .output();
    let output = tokio::time::timeout(WITHIN, output).await.expect("opgraph ends").unwrap();
    Run {
        code: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

#[tokio::test]
async fn commands_call_the_api_and_fail_with_the_reason() {
    let cloud = Cloud::start(&[]).await.unwrap();
    let key = cloud.key.clone();
    let args = [
        "ingest",
        "pallet.scanned",
        "--prop",
        "dock=3",
        "--prop",
        "site=north",
        "--actor",
        "reader-1",
        "--message-id",
        "m-1",
    ];
    let sent = opgraph(&cloud, &key, &args).await;
    assert_eq!(sent.code, Some(0), "{}", sent.stderr);
    let id = sent.json()["ids"][0].as_str().unwrap().to_owned();
    assert!(id.starts_with("evt_"), "{}", sent.stdout);
    // The same messageId again: stored once, answered with the same id.
    assert_eq!(opgraph(&cloud, &key, &args).await.json()["ids"][0], id.as_str());

    let listed = opgraph(&cloud, &key, &["events", "--event", "pallet.scanned"]).await;
    let events = listed.json()["events"].clone();
    assert_eq!(events.as_array().map(Vec::len), Some(1), "{events}");
    assert_eq!(events[0]["properties"], json!({"dock": 3, "site": "north"}));
    assert_eq!(events[0]["actor"], "reader-1");

    let graph = opgraph(&cloud, &key, &["graphql", "{ events(limit: 5) { id event } }"]).await;
    assert_eq!(graph.json()["data"]["events"], json!([{"id": id, "event": "pallet.scanned"}]));

    let metrics =
        opgraph(&cloud, &key, &["metrics", "--event", "pallet.scanned", "--limit", "5"]).await;
    assert_eq!(metrics.code, Some(0), "{}", metrics.stderr);
    let counted = metrics.json().to_string();
    assert!(counted.contains("pallet.scanned"), "{counted}");
    let args =
        ["create-trackable", "--kind", "rfid_tag", "--name", "Pallet 7", "--code", "3034F87"];
    let trackable = opgraph(&cloud, &key, &args).await;
    assert_eq!(trackable.json()["trackable"]["code"], "3034F87", "{}", trackable.stderr);
    let used =
        opgraph(&cloud, &key, &["track", "3034F87", "--event", "tag.read", "--prop", "antenna=2"])
            .await;
    assert_eq!(used.code, Some(0), "{}", used.stderr);
    let read = opgraph(&cloud, &key, &["events", "--event", "tag.read"]).await.json();
    assert_eq!(read["events"][0]["trackable"]["code"], "3034F87", "{read}");
    assert_eq!(read["events"][0]["properties"]["antenna"], 2);

    let usage = opgraph(&cloud, &key, &["api", "get", "/api/usage"]).await;
    assert_eq!(usage.json()["events"]["ingested"], 2, "{}", usage.stderr);
    let health = opgraph(&cloud, &key, &["health", "--strict"]).await;
    assert_eq!((health.code, &health.json()["status"]), (Some(0), &json!("ok")));

    // Refused: the API's error as one sentence on stderr, exit 1.
    let refused = opgraph(&cloud, "og_wrong", &["events"]).await;
    assert_eq!(refused.code, Some(1));
    assert!(refused.stderr.contains("HTTP 401 unauthorized"), "{}", refused.stderr);
    let invalid = opgraph(&cloud, &key, &["api", "POST", "/api/ingest", "--data", "{}"]).await;
    assert_eq!(invalid.code, Some(1));
    assert!(invalid.stderr.contains("(field event)"), "{}", invalid.stderr);
    // Wrong on the command line: exit 2, before any call.
    let bad_prop = opgraph(&cloud, &key, &["ingest", "x", "--prop", "novalue"]).await;
    assert_eq!(bad_prop.code, Some(2));
    assert!(bad_prop.stderr.contains("--prop \"novalue\""), "{}", bad_prop.stderr);
    let bad_url = Command::new(binary("opgraph").unwrap())
        .args(["--url", "ftp://x", "events"])
        .output()
        .await
        .unwrap();
    assert_eq!(bad_url.status.code(), Some(2));
    // Nobody listening: exit 1, saying so.
    let nobody = Command::new(binary("opgraph").unwrap())
        .args(["--url", "http://127.0.0.1:1", "--api-key", &key, "events"])
        .output()
        .await
        .unwrap();
    assert_eq!(nobody.status.code(), Some(1));
    let said = String::from_utf8_lossy(&nobody.stderr);
    assert!(said.contains("onnect"), "{said}");
}

#[tokio::test]
async fn a_file_of_events_is_sent_in_batches() {
    let cloud = Cloud::start(&[]).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    // One per line, then one laid out over lines, then an array.
    let mut text: String = (0..2345)
        .map(|i| format!("{{\"event\": \"file.event\", \"properties\": {{\"n\": {i}}}}}\n"))
        .collect();
    text.push_str("{\n  \"event\": \"file.event\"\n}\n[{\"event\": \"file.event\"}, {\"event\": \"file.event\"}]\n");
    let path = dir.path().join("events.json");
    std::fs::write(&path, &text).unwrap();
    let sent = opgraph(&cloud, &cloud.key, &["ingest", "--file", path.to_str().unwrap()]).await;
    assert_eq!(sent.code, Some(0), "{}", sent.stderr);
    assert_eq!(sent.json(), json!({"accepted": 2348, "batches": 3}));
    assert!(sent.stderr.contains("2348 events sent (3 batches)"), "{}", sent.stderr);
    let usage = opgraph(&cloud, &cloud.key, &["api", "GET", "/api/usage"]).await;
    assert_eq!(usage.json()["events"]["ingested"], 2348);

    // An invalid envelope in the second batch: the first is stored, the
    // error names the batch and the field.
    let mut bad: Vec<String> =
        (0..1500).map(|_| "{\"event\": \"second.file\"}".to_owned()).collect();
    bad[1200] = "{\"properties\": {}}".to_owned();
    std::fs::write(&path, bad.join("\n")).unwrap();
    let refused = opgraph(&cloud, &cloud.key, &["ingest", "--file", path.to_str().unwrap()]).await;
    assert_eq!(refused.code, Some(1));
    assert!(refused.stderr.contains("events 1001 to 1500"), "{}", refused.stderr);
    assert!(refused.stderr.contains("(field batch[200].event)"), "{}", refused.stderr);
    assert!(refused.stderr.contains("(1000 events sent before)"), "{}", refused.stderr);
    let usage = opgraph(&cloud, &cloud.key, &["api", "GET", "/api/usage"]).await;
    assert_eq!(usage.json()["events"]["ingested"], 3348);
}

/// `opgraph mcp` as an agent host runs it: messages on its stdin, answers
/// read from its stdout.
struct Mcp {
    child: tokio::process::Child,
    stdin: tokio::process::ChildStdin,
    stdout: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
}

impl Mcp {
    async fn send(&mut self, message: &str) {
        self.stdin.write_all(format!("{message}\n").as_bytes()).await.unwrap();
        self.stdin.flush().await.unwrap();
    }

    async fn answer(&mut self) -> Value {
        let line = tokio::time::timeout(WITHIN, self.stdout.next_line()).await.expect("an answer");
        serde_json::from_str(&line.unwrap().expect("stdout open")).unwrap()
    }

    async fn call(&mut self, id: u64, tool: &str, arguments: Value) -> Value {
        let request = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": tool, "arguments": arguments}});
        self.send(&request.to_string()).await;
        let answer = self.answer().await;
        assert_eq!(answer["id"], id, "{answer}");
        answer
    }
}

#[tokio::test]
async fn the_mcp_server_offers_the_api_as_tools() {
    let cloud = Cloud::start(&[]).await.unwrap();
    let mut child = Command::new(binary("opgraph").unwrap())
        .arg("mcp")
        .env("OPGRAPH_URL", &cloud.url)
        .env("OPGRAPH_API_KEY", &cloud.key)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let (stdin, stdout) = (child.stdin.take().unwrap(), child.stdout.take().unwrap());
    let mut mcp = Mcp { child, stdin, stdout: BufReader::new(stdout).lines() };

    mcp.send(r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"test","version":"1"}}}"#).await;
    let init = mcp.answer().await;
    assert_eq!(init["result"]["protocolVersion"], "2025-06-18", "{init}");
    assert_eq!(init["result"]["serverInfo"]["name"], "opgraph");
    assert!(init["result"]["capabilities"]["tools"].is_object());
    // A notification gets no answer: the next answer is the next request's.
    mcp.send(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#).await;
    mcp.send("this is not JSON").await;
    let garbage = mcp.answer().await;
    assert_eq!((&garbage["id"], &garbage["error"]["code"]), (&Value::Null, &json!(-32700)));
    mcp.send(r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#).await;
    let listed = mcp.answer().await;
    let names: Vec<&str> = listed["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    for name in ["ingest_events", "list_events", "search_events", "agent_context", "enforce_action"]
    {
        assert!(names.contains(&name), "{name} missing: {names:?}");
    }
    assert_eq!(listed["result"]["tools"][0]["inputSchema"]["required"], json!(["events"]));

    let events = json!({"events": [{"event": "agent.step", "traceId": "t-1", "actor": "agent-7"}]});
    let ingested = mcp.call(3, "ingest_events", events).await;
    assert_eq!(ingested["result"]["isError"], false, "{ingested}");
    assert_eq!(ingested["result"]["structuredContent"]["accepted"], 1);
    let listed = mcp.call(4, "list_events", json!({"traceId": "t-1"})).await;
    let stored = &listed["result"]["structuredContent"]["events"];
    assert_eq!(
        (&stored[0]["event"], &stored[0]["actor"]),
        (&json!("agent.step"), &json!("agent-7"))
    );
    let text = listed["result"]["content"][0]["text"].as_str().unwrap();
    assert!(text.contains("agent.step"), "{text}");

    // The API refuses: a result with isError, saying why, for the model.
    let refused = mcp.call(5, "ingest_events", json!({"events": [{"properties": {}}]})).await;
    assert_eq!(refused["result"]["isError"], true, "{refused}");
    let why = refused["result"]["content"][0]["text"].as_str().unwrap();
    assert!(why.contains("validation_failed") && why.contains("batch[0].event"), "{why}");
    let missing = mcp.call(6, "search_events", json!({})).await;
    assert!(
        missing["result"]["content"][0]["text"].as_str().unwrap().contains("`query` is required")
    );
    // Protocol errors: an unknown tool or method.
    assert_eq!(mcp.call(7, "drop_tables", json!({})).await["error"]["code"], -32602);
    mcp.send(r#"{"jsonrpc":"2.0","id":8,"method":"resources/list"}"#).await;
    assert_eq!(mcp.answer().await["error"]["code"], -32601);

    // The host closes stdin: the server ends on its own.
    drop(mcp.stdin);
    let status = tokio::time::timeout(WITHIN, mcp.child.wait()).await.expect("it ends").unwrap();
    assert!(status.success(), "{status}");
}
