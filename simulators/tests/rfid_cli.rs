//! `opgraph-sim rfid` as a process: argument errors and an unreachable
//! broker end with an exit code and one line on stderr; the summary says
//! what was (not) acknowledged. Publishing to a real broker is covered end
//! to end in tests/tests/mqtt_source.rs.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Stdio;
use std::time::Duration;

use tokio::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_opgraph-sim");

async fn run(args: &[&str]) -> std::process::Output {
    let output = Command::new(BIN).args(args).stdin(Stdio::null()).kill_on_drop(true).output();
    tokio::time::timeout(Duration::from_secs(30), output).await.unwrap().unwrap()
}

#[tokio::test]
async fn bad_arguments_exit_2_with_the_key() {
    let output = run(&["rfid", "--readers", "0"]).await;
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("readers"), "{stderr}");
    let output = run(&["rfid", "--broker", "no-port"]).await;
    assert_eq!(output.status.code(), Some(2));
}

#[tokio::test]
async fn an_unreachable_broker_fails_after_the_timeout_with_a_summary() {
    // A port nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let broker = format!("127.0.0.1:{port}");
    let output =
        run(&["rfid", "--broker", &broker, "--reads", "5", "--seed", "3", "--timeout", "1s"]).await;
    assert_eq!(output.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let summary: serde_json::Value =
        serde_json::from_str(stdout.trim().strip_prefix("summary ").unwrap()).unwrap();
    assert_eq!(summary["sent"], 5);
    assert_eq!(summary["acked"], 0);
    assert_eq!(summary["seed"], 3);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("0 of 5 messages acknowledged"), "{stderr}");
}
