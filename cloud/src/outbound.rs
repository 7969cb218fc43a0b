//! One HTTPS request (a `POST`, or an S3 `PUT`) to an endpoint a customer runs: the external proof
//! service (`pushToExternalProof`) and destination exports. rustls (ring)
//! and hyper, bounded by a timeout, never retried here (the export receipt
//! records the failure; the caller may send again).
//!
//! The TLS client is built per request with its own crypto provider, so
//! nothing process-wide must be installed first, and the platform's roots
//! (or, with a CA file, only that CA) are read each time: pushes are rare
//! and this keeps a rotated CA file effective without a restart.

use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::header::{CONTENT_TYPE, HOST, HeaderName, HeaderValue};
use hyper::{Method, Request};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

/// Largest answer body read (for the external id); the rest is ignored.
const MAX_ANSWER: usize = 64 * 1024;

/// Where a `POST` goes and how far it is trusted.
#[derive(Debug, Clone, Copy)]
pub struct Target<'a> {
    /// The setting or field the URL came from, for error sentences.
    pub setting: &'a str,
    pub url: &'a str,
    /// Trust only this CA instead of the platform's roots.
    pub ca_file: Option<&'a Path>,
    /// Bound on the whole exchange, connection to last byte.
    pub timeout: Duration,
}

/// What the endpoint answered.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    pub body: Bytes,
}

/// The `Host` header for `url`: the host, and the port when the URL names
/// one (what a signature over `Host` must use too).
pub fn authority(url: &url::Url) -> String {
    match url.port() {
        Some(p) => format!("{}:{p}", url.host_str().unwrap_or("")),
        None => url.host_str().unwrap_or("").to_owned(),
    }
}

/// A header of ours: `name` lower-case, `value` one we made (ids, hex,
/// digits), so a failure is a bug, answered as 500.
pub fn header(name: &'static str, value: &str) -> crate::error::Result<(HeaderName, HeaderValue)> {
    let value = HeaderValue::from_str(value).map_err(crate::error::Error::internal)?;
    Ok((HeaderName::from_static(name), value))
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

/// Sends `payload` (JSON) with `headers` to `target`; `Err` is a sentence
/// for the export receipt (no answer came, or the endpoint is unusable).
/// `Host` (see [`authority`]) and `Content-Type` are set here.
pub async fn send(
    target: Target<'_>,
    method: Method,
    payload: Bytes,
    headers: &[(HeaderName, HeaderValue)],
) -> Result<Answer, String> {
    let setting = target.setting;
    let url = url::Url::parse(target.url).map_err(|e| format!("{setting}: {e}"))?;
    if url.scheme() != "https" {
        return Err(format!("{setting} must be https"));
    }
    let ca_file = target.ca_file.map(Path::to_path_buf);
    let what = format!("{setting} CA file");
    let tls = tokio::task::spawn_blocking(move || {
        crate::tls_client::client_config(&what, ca_file.as_deref())
    })
    .await
    .map_err(|e| e.to_string())??;
    let timeout = target.timeout;
    tokio::time::timeout(timeout, exchange(&url, setting, tls, method, payload, headers))
        .await
        .map_err(|_| {
            format!("timed out after {}", humantime_serde::re::humantime::format_duration(timeout))
        })?
}

async fn exchange(
    url: &url::Url,
    setting: &str,
    tls: rustls::ClientConfig,
    method: Method,
    payload: Bytes,
    headers: &[(HeaderName, HeaderValue)],
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
        None => return Err(format!("{setting} has no host")),
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
    let authority = authority(url);
    let mut request = Request::builder()
        .method(method)
        .uri(path)
        .header(HOST, HeaderValue::from_str(&authority).map_err(|e| e.to_string())?)
        .header(CONTENT_TYPE, "application/json");
    for (name, value) in headers {
        request = request.header(name, value);
    }
    let request = request.body(Full::new(payload)).map_err(|e| e.to_string())?;
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
        let target = Target {
            setting: "governance.proof_url",
            url: "https://127.0.0.1:1/",
            ca_file: None,
            timeout: Duration::from_secs(5),
        };
        let err = send(target, Method::POST, Bytes::from_static(b"{}"), &[]).await.unwrap_err();
        assert!(err.contains("connect"), "{err}");
        let plain = Target { url: "http://127.0.0.1:1/", ..target };
        let err = send(plain, Method::POST, Bytes::from_static(b"{}"), &[]).await.unwrap_err();
        assert_eq!(err, "governance.proof_url must be https");
    }
}
