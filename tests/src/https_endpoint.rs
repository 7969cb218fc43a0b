//! A local HTTPS endpoint for the cloud's outbound pushes (proof trails,
//! destination exports): it answers from a plan and keeps every request.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a broken harness should fail loudly

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Requests received: head and body.
pub type Received = Arc<Mutex<Vec<(String, Vec<u8>)>>>;

/// A one-connection-at-a-time HTTPS endpoint with a self-signed certificate
/// for 127.0.0.1: answers each request with the next status of `plan`
/// (the last one repeats) and `{"id": "ext-N"}`, and keeps what it got.
pub struct Endpoint {
    /// `https://127.0.0.1:PORT/v1/proofs?token=secret`.
    pub url: String,
    /// The self-signed certificate, for the client to trust.
    pub ca_file: std::path::PathBuf,
    pub received: Received,
    /// Woken at every request received.
    arrived: Arc<tokio::sync::Notify>,
    /// Abort it to take the endpoint down.
    pub task: tokio::task::JoinHandle<()>,
    _dir: tempfile::TempDir,
}

pub async fn start(plan: Vec<u16>) -> Endpoint {
    start_answering(plan.into_iter().map(|status| (status, "")).collect()).await
}

/// [`start`] with the body of each answer too; `""` answers the default
/// `{"id": "ext-N"}`.
pub async fn start_answering(plan: Vec<(u16, &'static str)>) -> Endpoint {
    let dir = tempfile::tempdir().unwrap();
    let certified = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned()]).unwrap();
    let ca_file = dir.path().join("endpoint-ca.pem");
    std::fs::write(&ca_file, certified.cert.pem()).unwrap();
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(certified.signing_key.serialize_der().into());
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(vec![certified.cert.der().clone()], key)
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("https://{}/v1/proofs?token=secret", listener.local_addr().unwrap());
    let received = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&received);
    let count = Arc::new(AtomicUsize::new(0));
    let arrived = Arc::new(tokio::sync::Notify::new());
    let wake = Arc::clone(&arrived);
    let task = tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let Ok(mut tls) = acceptor.accept(tcp).await else { continue };
            let (head, body) = read_request(&mut tls).await;
            let n = count.fetch_add(1, Ordering::SeqCst);
            seen.lock().unwrap().push((head, body));
            let (status, body) = plan[n.min(plan.len() - 1)];
            let answer =
                if body.is_empty() { format!("{{\"id\": \"ext-{n}\"}}") } else { body.to_owned() };
            let response = format!(
                "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{answer}",
                answer.len()
            );
            let _ = tls.write_all(response.as_bytes()).await;
            let _ = tls.shutdown().await;
            wake.notify_waiters();
        }
    });
    Endpoint { url, ca_file, received, arrived, task, _dir: dir }
}

impl Endpoint {
    /// Waits (at most `within`) until `n` requests have been answered, for
    /// pushes the cloud sends in the background; then what it received.
    pub async fn wait_for(&self, n: usize, within: std::time::Duration) -> Vec<(String, Vec<u8>)> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let arrived = self.arrived.notified();
            tokio::pin!(arrived);
            arrived.as_mut().enable();
            {
                let received = self.received.lock().unwrap();
                if received.len() >= n {
                    return received.clone();
                }
            }
            if tokio::time::timeout_at(deadline, arrived).await.is_err() {
                let got = self.received.lock().unwrap().len();
                panic!("{got} of {n} requests arrived within {within:?}");
            }
        }
    }
}

/// The value of header `name` in a request head.
pub fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|line| {
        let (n, v) = line.split_once(':')?;
        n.eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

/// HMAC-SHA256 as `openssl` computes it: a check of a signature that is
/// independent of the cloud's own code.
pub fn openssl_hmac(key: &str, message: &[u8]) -> String {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let mut child = Command::new("openssl")
        .args(["dgst", "-sha256", "-hmac", key, "-r"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("openssl (installed by deploy/scripts/install-test-deps.sh)");
    child.stdin.take().unwrap().write_all(message).unwrap();
    let out = child.wait_with_output().unwrap();
    String::from_utf8(out.stdout).unwrap().split_whitespace().next().unwrap().to_owned()
}

/// Reads one HTTP/1.1 request: head, then `content-length` bytes of body.
async fn read_request<S: AsyncReadExt + Unpin>(stream: &mut S) -> (String, Vec<u8>) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        if let Some(pos) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break pos + 4;
        }
        let n = stream.read(&mut chunk).await.unwrap_or(0);
        if n == 0 {
            return (String::new(), Vec::new());
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    let length: usize = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length:")
                .map(|v| v.trim().parse().unwrap())
        })
        .unwrap_or(0);
    while buf.len() < head_end + length {
        let n = stream.read(&mut chunk).await.unwrap_or(0);
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    (head, buf[head_end..].to_vec())
}
