//! The `opgraph-sim` binary, started as a process.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::process::{Command as StdCommand, Stdio};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::process::Command;
use tokio::time::{Instant, timeout};

const BIN: &str = env!("CARGO_BIN_EXE_opgraph-sim");
const WAIT: Duration = Duration::from_secs(10);

async fn within<T>(what: &str, future: impl Future<Output = T>) -> T {
    timeout(WAIT, future).await.unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

async fn echo_server() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut rd, mut wr) = stream.split();
                let _ = tokio::io::copy(&mut rd, &mut wr).await;
            });
        }
    });
    addr
}

#[tokio::test]
async fn proxy_prints_its_address_forwards_and_summarises_on_sigterm() {
    let upstream = echo_server().await.to_string();
    let mut child = Command::new(BIN)
        .args(["proxy", "--protocol", "tcp", "--listen", "127.0.0.1:0", "--upstream", &upstream])
        .args(["--latency", "10ms", "--loss", "0.1", "--rto", "5ms", "--seed", "42"])
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    within("the listening line", stdout.read_line(&mut first)).await.unwrap();
    let addr: SocketAddr = first
        .trim_end()
        .strip_prefix("listening proxy=")
        .unwrap_or_else(|| panic!("unexpected first line {first:?}"))
        .parse()
        .unwrap();

    let mut stream = TcpStream::connect(addr).await.unwrap();
    let started = Instant::now();
    stream.write_all(b"hello").await.unwrap();
    let mut back = [0; 5];
    within("the echo", stream.read_exact(&mut back)).await.unwrap();
    assert_eq!(&back, b"hello");
    assert!(started.elapsed() >= Duration::from_millis(20));

    let pid = child.id().unwrap().to_string();
    assert!(StdCommand::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    let status = within("the exit", child.wait()).await.unwrap();
    assert!(status.success(), "exit status {status}");
    let mut summary = String::new();
    within("the summary", stdout.read_to_string(&mut summary)).await.unwrap();
    assert!(summary.contains("summary protocol=tcp seed=42 "), "{summary}");
    for direction in ["to_upstream", "to_client"] {
        let line = summary
            .lines()
            .find(|l| l.contains(&format!("direction={direction} ")))
            .unwrap_or_else(|| panic!("no {direction} line in {summary}"));
        assert!(line.contains(" delivered_bytes=5 "), "{line}");
    }
}

/// Runs the binary with bad arguments; returns its stderr.
fn rejected(args: &[&str]) -> String {
    let out = StdCommand::new(BIN).args(args).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{args:?} should be a usage error");
    assert!(out.stdout.is_empty());
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(stderr.trim_end().lines().count(), 1, "one line expected: {stderr}");
    stderr
}

#[test]
fn bad_arguments_get_one_clear_line() {
    let stderr = rejected(&["proxy", "--upstream", "127.0.0.1:1", "--loss", "2"]);
    assert!(stderr.contains("loss") && stderr.contains("0 to 1"), "{stderr}");
    let stderr = rejected(&["proxy", "--latency", "5ms"]);
    assert!(stderr.contains("--upstream"), "{stderr}");
    let stderr = rejected(&["proxy", "--upstream", "127.0.0.1:1", "--partition", "10s"]);
    assert!(stderr.contains("START+DURATION"), "{stderr}");
    let stderr = rejected(&["proxy", "--upstream", "127.0.0.1:1", "--latency", "soon"]);
    assert!(stderr.contains("--latency"), "{stderr}");
}
