//! AWS Signature Version 4: the S3 `PUT` of the S3 and GCS destination
//! exports, and the Redshift Data API call of the Redshift destination.
//! No I/O and no clock: the caller passes the time, so tests can pin it.
//!
//! The signature covers the method, the path, the `Content-Type`, `Host`,
//! `x-amz-content-sha256` and `x-amz-date` headers (and
//! `x-amz-security-token` with temporary credentials) and the payload's
//! SHA-256, under a key derived from the secret, the day, the region and
//! the service. The e2e test checks it against botocore's signer, so it
//! does not only agree with itself.

use crate::governance::hash::{hmac_sha256, sha256_hex};

/// Credentials and where they are valid.
#[derive(Debug, Clone)]
pub struct Credentials {
    pub access_key_id: String,
    pub secret_access_key: String,
    /// With temporary credentials (STS).
    pub session_token: Option<String>,
    pub region: String,
}

/// The headers to add to an S3 `PUT`, `Authorization` last.
pub fn sign_put(
    credentials: &Credentials,
    host: &str,
    path: &str,
    content_type: &str,
    payload: &[u8],
    now_ms: i64,
) -> Vec<(&'static str, String)> {
    let request = Request { service: "s3", method: "PUT", host, path, content_type, extra: &[] };
    sign(credentials, &request, payload, now_ms)
}

/// What is signed of a request besides its payload.
pub struct Request<'a> {
    /// `s3`, `redshift-data`, ...
    pub service: &'a str,
    pub method: &'a str,
    pub host: &'a str,
    /// Encoded as sent (see [`encode_path`]).
    pub path: &'a str,
    pub content_type: &'a str,
    /// More headers to send and sign, e.g. `x-amz-target`; lower-case names.
    pub extra: &'a [(&'static str, String)],
}

/// The headers to add to `request`, `Authorization` last.
pub fn sign(
    credentials: &Credentials,
    request: &Request<'_>,
    payload: &[u8],
    now_ms: i64,
) -> Vec<(&'static str, String)> {
    let service = request.service;
    let amz_date = amz_date(now_ms);
    let day = &amz_date[..8];
    let payload_hash = sha256_hex(payload);
    let mut headers: Vec<(&'static str, String)> = vec![
        ("content-type", request.content_type.to_owned()),
        ("host", request.host.to_owned()),
        ("x-amz-content-sha256", payload_hash.clone()),
        ("x-amz-date", amz_date.clone()),
    ];
    if let Some(token) = &credentials.session_token {
        headers.push(("x-amz-security-token", token.clone()));
    }
    headers.extend(request.extra.iter().cloned());
    // The canonical form lists them sorted by name.
    headers.sort_by(|a, b| a.0.cmp(b.0));
    let canonical_headers: String =
        headers.iter().map(|(name, value)| format!("{name}:{}\n", value.trim())).collect();
    let signed_headers = headers.iter().map(|(name, _)| *name).collect::<Vec<_>>().join(";");
    let canonical_request = format!(
        "{}\n{}\n\n{canonical_headers}\n{signed_headers}\n{payload_hash}",
        request.method, request.path
    );
    let scope = format!("{day}/{}/{service}/aws4_request", credentials.region);
    let string_to_sign = format!(
        "AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{}",
        sha256_hex(canonical_request.as_bytes())
    );
    let key = [day, credentials.region.as_str(), service, "aws4_request"]
        .iter()
        .fold(format!("AWS4{}", credentials.secret_access_key).into_bytes(), |key, part| {
            hmac_sha256(&key, part.as_bytes()).to_vec()
        });
    let signature = crate::ids::hex(&hmac_sha256(&key, string_to_sign.as_bytes()));
    headers.retain(|(name, _)| *name != "host" && *name != "content-type");
    headers.push((
        "authorization",
        format!(
            "AWS4-HMAC-SHA256 Credential={}/{scope}, SignedHeaders={signed_headers}, Signature={signature}",
            credentials.access_key_id
        ),
    ));
    headers
}

/// `YYYYMMDDTHHMMSSZ` in UTC.
fn amz_date(now_ms: i64) -> String {
    let secs = u64::try_from(now_ms.max(0) / 1000).unwrap_or(0);
    let at = std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs);
    humantime_serde::re::humantime::format_rfc3339_seconds(at)
        .to_string()
        .chars()
        .filter(|c| !matches!(c, '-' | ':'))
        .collect()
}

/// Percent-encodes a path for S3: every byte but the unreserved ones
/// (`A-Z a-z 0-9 - . _ ~`) and `/`, upper-case hex. The request is sent
/// with exactly this path, so what is signed is what arrives.
pub fn encode_path(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    for b in path.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~' | b'/') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_and_paths_are_in_the_forms_aws_signs() {
        assert_eq!(amz_date(1_369_353_600_000), "20130524T000000Z");
        assert_eq!(encode_path("/b/in put/ü$.json"), "/b/in%20put/%C3%BC%24.json");
    }

    /// A fixed request signs to a fixed value (the e2e test compares the
    /// live one with botocore); and every signed part matters.
    #[test]
    fn every_part_of_the_request_changes_the_signature() {
        let credentials = Credentials {
            access_key_id: "AKIAIOSFODNN7EXAMPLE".into(),
            secret_access_key: "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY".into(),
            session_token: None,
            region: "us-east-1".into(),
        };
        let sign = |c: &Credentials, path: &str, body: &[u8], at: i64| {
            sign_put(c, "examplebucket.s3.amazonaws.com", path, "application/json", body, at)
                .into_iter()
                .find(|(n, _)| *n == "authorization")
                .map(|(_, v)| v)
                .unwrap_or_default()
        };
        let at = 1_369_353_600_000;
        let base = sign(&credentials, "/a.json", b"{}", at);
        assert!(base.starts_with(
            "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, \
             SignedHeaders=content-type;host;x-amz-content-sha256;x-amz-date, Signature="
        ));
        assert_ne!(base, sign(&credentials, "/b.json", b"{}", at));
        assert_ne!(base, sign(&credentials, "/a.json", b"[]", at));
        assert_ne!(base, sign(&credentials, "/a.json", b"{}", at + 1000));
        let mut other = credentials.clone();
        other.region = "eu-west-1".into();
        assert_ne!(base, sign(&other, "/a.json", b"{}", at));
        other.session_token = Some("token".into());
        assert!(sign(&other, "/a.json", b"{}", at).contains("x-amz-date;x-amz-security-token"));
    }
}
