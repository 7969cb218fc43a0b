//! One HTTPS request (a `POST`, or an S3 `PUT`) to an endpoint a customer runs: the external proof
//! service (`pushToExternalProof`) and destination exports. rustls (ring)
//! and hyper, bounded by a timeout, never retried here (the export receipt
//! records the failure; the caller may send again).
//!
//! The TLS client is built per request with its own crypto provider, so
//! nothing process-wide must be installed first, and the platform's roots
//! (or, with a CA file, only that CA) are read each time: pushes are rare
//! and this keeps a rotated CA file effective without a restart.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
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
    /// Connect only to public addresses: the URL came from an API caller,
    /// who must not reach the cloud's own network (a metadata service at
    /// 169.254.169.254, an admin port on loopback) through it. Checked on
    /// the addresses the name resolves to, right before connecting.
    pub public_only: bool,
}

/// What the endpoint answered.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    pub body: Bytes,
}

/// Whether `ip` is an address on the public Internet: not loopback,
/// private (RFC 1918, unique-local), link-local (the cloud metadata
/// services), shared (CGNAT), reserved, documentation, benchmarking,
/// multicast or unspecified. IPv4 inside IPv6 is judged as IPv4.
pub fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, c, _] = v4.octets();
            !(v4.is_loopback()
                || v4.is_private()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_broadcast()
                || v4.is_multicast()
                || v4.is_documentation()
                || a == 0
                || (a == 100 && (64..128).contains(&b))
                || (a == 192 && b == 0 && c == 0)
                || (a == 198 && (18..20).contains(&b))
                || a >= 240)
        }
        IpAddr::V6(v6) => {
            let s = v6.segments();
            // IPv4 carried in IPv6 is judged as that IPv4 address: mapped
            // (::ffff:a.b.c.d), compatible (::a.b.c.d), NAT64 (64:ff9b::/96
            // and 64:ff9b:1::/48) and 6to4 (2002:AABB:CCDD::). A NAT64
            // gateway turns 64:ff9b::a00:5 into 10.0.0.5.
            let low = |hi: u16, lo: u16| Ipv4Addr::from((u32::from(hi) << 16) | u32::from(lo));
            let embedded = match s {
                [0, 0, 0, 0, 0, 0xffff, hi, lo] | [0x64, 0xff9b, 0, 0, 0, 0, hi, lo] => {
                    Some(low(hi, lo))
                }
                [0, 0, 0, 0, 0, 0, hi, lo] if (hi, lo) > (0, 1) => Some(low(hi, lo)),
                [0x64, 0xff9b, 1, ..] => Some(low(s[6], s[7])),
                [0x2002, hi, lo, ..] => Some(low(hi, lo)),
                _ => None,
            };
            if let Some(v4) = embedded {
                return is_public(IpAddr::V4(v4));
            }
            let first = s[0];
            !(v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || (first & 0xfe00) == 0xfc00
                || (first & 0xffc0) == 0xfe80
                // Teredo (2001::/32) hides its IPv4 server and client.
                || (first == 0x2001 && s[1] == 0)
                || (first == 0x2001 && s[1] == 0x0db8))
        }
    }
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

/// `X-Opgraph-Timestamp` and, with a secret, `X-Opgraph-Signature:
/// sha256=<hex HMAC-SHA256 of "<timestamp>.<payload>">`: the signing of
/// exports and webhooks. The timestamp is signed too, so that a captured
/// request cannot be replayed later under a fresh one.
pub fn signature_headers(
    secret: Option<&str>,
    timestamp_ms: i64,
    payload: &[u8],
) -> crate::error::Result<Vec<(HeaderName, HeaderValue)>> {
    let timestamp = timestamp_ms.to_string();
    let mut headers = vec![header("x-opgraph-timestamp", &timestamp)?];
    if let Some(secret) = secret {
        let signed = [timestamp.as_bytes(), b".", payload].concat();
        let mac = crate::governance::hash::hmac_sha256(secret.as_bytes(), &signed);
        headers.push(header("x-opgraph-signature", &format!("sha256={}", crate::ids::hex(&mac)))?);
    }
    Ok(headers)
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
    let public_only = target.public_only;
    let exchange = exchange(&url, setting, public_only, tls, method, payload, headers);
    tokio::time::timeout(timeout, exchange).await.map_err(|_| {
        format!("timed out after {}", humantime_serde::re::humantime::format_duration(timeout))
    })?
}

async fn exchange(
    url: &url::Url,
    setting: &str,
    public_only: bool,
    tls: rustls::ClientConfig,
    method: Method,
    payload: Bytes,
    headers: &[(HeaderName, HeaderValue)],
) -> Result<Answer, String> {
    let port = url.port_or_known_default().unwrap_or(443);
    let (server_name, addrs): (ServerName<'static>, Vec<SocketAddr>) = match url.host() {
        Some(url::Host::Domain(domain)) => (
            ServerName::try_from(domain.to_owned()).map_err(|e| e.to_string())?,
            tokio::net::lookup_host((domain, port))
                .await
                .map_err(|e| format!("resolve {domain}: {e}"))?
                .collect(),
        ),
        Some(url::Host::Ipv4(ip)) => {
            (ServerName::IpAddress(IpAddr::V4(ip).into()), vec![(ip, port).into()])
        }
        Some(url::Host::Ipv6(ip)) => {
            (ServerName::IpAddress(IpAddr::V6(ip).into()), vec![(ip, port).into()])
        }
        None => return Err(format!("{setting} has no host")),
    };
    let allowed: Vec<SocketAddr> =
        addrs.iter().copied().filter(|a| !public_only || is_public(a.ip())).collect();
    if allowed.is_empty() {
        let host = url.host_str().unwrap_or_default();
        return Err(match addrs.first() {
            Some(addr) => format!(
                "{host} is a private or reserved address ({}); exports go to public \
                 addresses unless exports.allow_private_networks is set",
                addr.ip()
            ),
            None => format!("{host} resolves to no address"),
        });
    }
    let tcp = TcpStream::connect(&allowed[..]).await.map_err(|e| format!("connect: {e}"))?;
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
    fn only_public_addresses_are_public() {
        for private in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "0.0.0.0",
            "100.64.0.1",
            "192.0.0.8",
            "198.18.0.1",
            "224.0.0.1",
            "255.255.255.255",
            "240.0.0.1",
            "192.0.2.1",
            "::1",
            "::",
            "fd00::1",
            "fe80::1",
            "ff02::1",
            "2001:db8::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "::10.0.0.5",
            "64:ff9b::a00:5",
            "64:ff9b::127.0.0.1",
            "64:ff9b:1::a9fe:a9fe",
            "2002:a00:5::1",
            "2002:7f00:1::",
            "2001:0:4136:e378:8000:63bf:3fff:fdd2",
        ] {
            assert!(!is_public(private.parse().unwrap()), "{private}");
        }
        for public in [
            "1.1.1.1",
            "8.8.8.8",
            "100.128.0.1",
            "2606:4700::1111",
            "::ffff:1.1.1.1",
            "64:ff9b::808:808",
            "2002:808:808::1",
        ] {
            assert!(is_public(public.parse().unwrap()), "{public}");
        }
    }

    #[tokio::test]
    async fn a_private_address_is_refused_before_connecting() {
        let target = Target {
            setting: "config.url",
            url: "https://127.0.0.1:1/",
            ca_file: None,
            timeout: Duration::from_secs(5),
            public_only: true,
        };
        let err = send(target, Method::POST, Bytes::from_static(b"{}"), &[]).await.unwrap_err();
        assert!(err.contains("exports.allow_private_networks"), "{err}");
        let named = Target { url: "https://localhost:1/", ..target };
        let err = send(named, Method::POST, Bytes::from_static(b"{}"), &[]).await.unwrap_err();
        assert!(
            err.contains("private or reserved"),
            "a name is judged by what it resolves to: {err}"
        );
    }

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
            public_only: false,
        };
        let err = send(target, Method::POST, Bytes::from_static(b"{}"), &[]).await.unwrap_err();
        assert!(err.contains("connect"), "{err}");
        let plain = Target { url: "http://127.0.0.1:1/", ..target };
        let err = send(plain, Method::POST, Bytes::from_static(b"{}"), &[]).await.unwrap_err();
        assert_eq!(err, "governance.proof_url must be https");
    }
}
