//! Pushes a proof-trail packet to the external proof service: one HTTPS
//! `POST` over rustls (ring) and hyper, bounded by a timeout, never
//! retried here (the export receipt records the failure; the caller may
//! export again).
//!
//! The TLS client is built per push with its own crypto provider, so
//! nothing process-wide must be installed first, and the platform's roots
//! (or, with `proof_ca_file`, only that CA) are read each time: pushes are
//! rare and this keeps a rotated CA file effective without a restart.

use std::net::IpAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::Request;
use hyper::header::{CONTENT_TYPE, HOST, HeaderValue};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use crate::config::GovernanceConfig;

/// Largest answer body read (for the external id); the rest is ignored.
const MAX_ANSWER: usize = 64 * 1024;

/// What the endpoint answered.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    pub body: Bytes,
}

/// `scheme://host:port/path` of a URL: never its credentials or query.
pub fn destination(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(u) => format!(
            "{}://{}{}{}",
            u.scheme(),
            u.host_str().unwrap_or(""),
            u.port().map(|p| format!(":{p}")).unwrap_or_default(),
            u.path()
        ),
        Err(_) => "(invalid url)".to_owned(),
    }
}

/// POSTs `payload` to the configured endpoint; `Err` is a sentence for the
/// export receipt (no answer came, or the endpoint is unusable).
pub async fn post(
    config: &GovernanceConfig,
    payload: Bytes,
    request_id: &str,
    idempotency_key: &str,
) -> Result<Answer, String> {
    let url = config.proof_url.as_deref().ok_or("no proof endpoint is configured")?;
    let url = url::Url::parse(url).map_err(|e| format!("proof_url: {e}"))?;
    if url.scheme() != "https" {
        return Err("proof_url must be https".to_owned());
    }
    let ca_file = config.proof_ca_file.clone();
    let tls = tokio::task::spawn_blocking(move || {
        crate::tls_client::client_config("proof CA file", ca_file.as_deref())
    })
    .await
    .map_err(|e| e.to_string())??;
    let timeout = config.proof_timeout;
    tokio::time::timeout(timeout, exchange(&url, tls, payload, request_id, idempotency_key))
        .await
        .map_err(|_| {
        format!("timed out after {}", humantime_serde::re::humantime::format_duration(timeout))
    })?
}

async fn exchange(
    url: &url::Url,
    tls: rustls::ClientConfig,
    payload: Bytes,
    request_id: &str,
    idempotency_key: &str,
) -> Result<Answer, String> {
    let port = url.port_or_known_default().unwrap_or(443);
    let (server_name, tcp) = match url.host() {
        Some(url::Host::Domain(domain)) => (
            ServerName::try_from(domain.to_owned()).map_err(|e| e.to_string())?,
            TcpStream::connect((domain, port)).await,
        ),
        Some(url::Host::Ipv4(ip)) => {
            (ServerName::IpAddress(IpAddr::V4(ip).into()), TcpStream::connect((ip, port)).await)
        }
        Some(url::Host::Ipv6(ip)) => {
            (ServerName::IpAddress(IpAddr::V6(ip).into()), TcpStream::connect((ip, port)).await)
        }
        None => return Err("proof_url has no host".to_owned()),
    };
    let tcp = tcp.map_err(|e| format!("connect: {e}"))?;
    let stream = TlsConnector::from(Arc::new(tls))
        .connect(server_name, tcp)
        .await
        .map_err(|e| format!("TLS: {e}"))?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("HTTP: {e}"))?;
    let driver = tokio::spawn(connection);
    let path = match url.query() {
        Some(q) => format!("{}?{q}", url.path()),
        None => url.path().to_owned(),
    };
    let authority = match url.port() {
        Some(p) => format!("{}:{p}", url.host_str().unwrap_or("")),
        None => url.host_str().unwrap_or("").to_owned(),
    };
    let request = Request::post(path)
        .header(HOST, HeaderValue::from_str(&authority).map_err(|e| e.to_string())?)
        .header(CONTENT_TYPE, "application/json")
        .header("x-opgraph-request-id", request_id)
        .header("idempotency-key", idempotency_key)
        .body(Full::new(payload))
        .map_err(|e| e.to_string())?;
    let result = async {
        let response = sender.send_request(request).await.map_err(|e| format!("HTTP: {e}"))?;
        let status = response.status().as_u16();
        // The answer body only serves the external id: an unreadable or
        // oversized one is as good as none.
        let body = Limited::new(response.into_body(), MAX_ANSWER)
            .collect()
            .await
            .map(|c| c.to_bytes())
            .unwrap_or_default();
        Ok(Answer { status, body })
    }
    .await;
    driver.abort();
    result
}

/// The id the endpoint gave the payload: `id`, `externalId` or `proofId`
/// of a JSON answer.
pub fn external_id(body: &[u8]) -> Option<String> {
    let value: serde_json::Value = serde_json::from_slice(body).ok()?;
    ["id", "externalId", "proofId"].iter().find_map(|key| match value.get(*key)? {
        serde_json::Value::String(s) if !s.is_empty() => Some(s.chars().take(200).collect()),
        serde_json::Value::Number(n) => Some(n.to_string()),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn destination_drops_credentials_and_query() {
        assert_eq!(
            destination("https://user:pw@proof.example:8443/v1/packets?token=s3cret#x"),
            "https://proof.example:8443/v1/packets"
        );
    }

    #[test]
    fn external_id_is_read_from_common_fields() {
        assert_eq!(external_id(br#"{"id": "ext-1"}"#).as_deref(), Some("ext-1"));
        assert_eq!(external_id(br#"{"proofId": 42}"#).as_deref(), Some("42"));
        assert_eq!(external_id(b"not json"), None);
    }

    #[tokio::test]
    async fn unreachable_endpoint_is_an_error_not_a_panic() {
        let config = GovernanceConfig {
            proof_url: Some("https://127.0.0.1:1/".into()),
            proof_ca_file: None,
            proof_timeout: Duration::from_secs(5),
        };
        let err = post(&config, Bytes::from_static(b"{}"), "req_1", "prf_1").await.unwrap_err();
        assert!(err.contains("connect"), "{err}");
    }
}
