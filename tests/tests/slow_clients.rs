//! Clients that open a connection and then send nothing, or stall in the
//! middle of a body, on both binaries' HTTP ports: each is cut off after
//! the configured time, nothing of a stalled body is stored, and the
//! port keeps serving everyone else.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose

use std::time::Duration;

use opgraph_tests::edge::{Gateway, add_http_settings, grpc_site};
use opgraph_tests::{Cloud, TEST_BOOTSTRAP_KEY};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Far longer than the 300 ms the ports below allow.
const GUARD: Duration = Duration::from_secs(20);

/// Everything the server sends until it closes the connection.
async fn until_closed(stream: &mut TcpStream) -> String {
    let mut reply = Vec::new();
    let read = tokio::time::timeout(GUARD, stream.read_to_end(&mut reply));
    // A reset counts as closed too.
    let _ = read.await.expect("the server closes the connection");
    String::from_utf8_lossy(&reply).into_owned()
}

/// Opens a connection that never sends a byte, and one that sends an
/// ingest request's head and a tenth of its body, to `base` (`http://`
/// and an address); both must be closed, the second answered first.
async fn stall(base: &str, path: &str, key: &str) -> String {
    let addr = base.trim_start_matches("http://");
    let mut silent = TcpStream::connect(addr).await.unwrap();
    let mut stalled = TcpStream::connect(addr).await.unwrap();
    let body = json!({"event": "pallet.stalled"}).to_string();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {key}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    stalled.write_all(head.as_bytes()).await.unwrap();
    stalled.write_all(&body.as_bytes()[..body.len() / 10]).await.unwrap();
    let reply = until_closed(&mut stalled).await;
    assert!(until_closed(&mut silent).await.is_empty());
    reply
}

#[tokio::test]
async fn the_cloud_cuts_off_silent_and_stalled_clients() {
    let cloud = Cloud::start(&[
        ("OPGRAPH_HEADER_TIMEOUT", "300ms".into()),
        ("OPGRAPH_BODY_TIMEOUT", "300ms".into()),
    ])
    .await
    .unwrap();
    let reply = stall(&cloud.url, "/api/ingest", &cloud.key).await;
    assert!(reply.starts_with("HTTP/1.1 408") && reply.contains("request_timeout"), "{reply}");
    let (client, key, ok) = (cloud.http(), &cloud.key, json!({"event": "pallet.ok"}));
    let (status, _) = cloud.call(&client, key, Method::POST, "/api/ingest", Some(&ok)).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let (_, body) = cloud.call(&client, key, Method::GET, "/api/events?limit=10", None).await;
    let names: Vec<&str> =
        body["events"].as_array().unwrap().iter().filter_map(|e| e["event"].as_str()).collect();
    assert_eq!(names, ["pallet.ok"], "{body}");
}

#[tokio::test]
async fn the_gateway_cuts_off_silent_and_stalled_clients() {
    let tmp = tempfile::tempdir().unwrap();
    let (_cloud, config) = grpc_site(tmp.path(), "").await;
    add_http_settings(&config, "header_timeout = \"300ms\"\nbody_timeout = \"300ms\"");
    let gateway = Gateway::start(&config, TEST_BOOTSTRAP_KEY).await;
    let reply = stall(&gateway.url, "/ingest", "unused").await;
    assert!(reply.starts_with("HTTP/1.1 408") && reply.contains("request_timeout"), "{reply}");
    // Told apart from a body past the limit (1 MiB), refused unread.
    let addr = gateway.url.trim_start_matches("http://");
    let mut large = TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST /ingest HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: 2000000\r\nConnection: close\r\n\r\n"
    );
    large.write_all(head.as_bytes()).await.unwrap();
    let reply = until_closed(&mut large).await;
    assert!(reply.starts_with("HTTP/1.1 413") && reply.contains("payload_too_large"), "{reply}");
    assert_eq!(gateway.post("pallet.ok", 1).await.len(), 1);
    let health: Value = gateway.health().await;
    assert_eq!(health["buffer"]["appended_total"], 1, "{health}");
}
