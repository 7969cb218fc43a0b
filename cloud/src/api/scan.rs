//! `GET /r/{code}`: the public scan of a printed code. No credential.
//!
//! `code` is a scan code, unique across workspaces (see
//! [`crate::trackables`]), checked against its alphabet on the raw path
//! before any lookup, so encoded slashes, dots or NULs never reach the
//! store. A known code records a scan event (the trackable's `eventName`,
//! else `trackable.scanned`) through the ingest path, then answers 302 to
//! `targetUrl` (or a small page when the trackable has none). An unknown
//! code is a 404 page and records nothing.
//!
//! Scan floods: recording is rate-limited per code by a token bucket
//! ([`ScanGuard`]). Past the limit the scan still redirects (a printed code
//! never stops working for the people scanning it) but is not recorded, and
//! the answer says so in `X-Opgraph-Scan: not-recorded`. `HEAD` (link
//! checkers, previews) redirects without recording too.
//!
//! Privacy: the client address is kept only as a salted SHA-256
//! (`context.ipHash`, also the anonymous actor's id); the salt comes from
//! config or a file in the data directory and is never logged.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use rand::Rng;
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

use super::AppState;
use super::ingest::{parse_body, record};
use crate::config::{Config, ScanConfig};
use crate::store::trackables::Trackable;
use crate::trackables::is_scan_code;

const SALT_FILE: &str = "scan-ip-salt";
const MAX_USER_AGENT: usize = 512;
const MAX_REFERRER: usize = 2048;
/// Buckets kept at most; past it idle ones are dropped (they were full).
const MAX_BUCKETS: usize = 100_000;
/// Header saying whether a scan was recorded.
pub const SCAN_HEADER: &str = "x-opgraph-scan";

struct Bucket {
    tokens: f64,
    refilled: Instant,
}

/// The scan redirect's state: the per-code rate limiter and the IP salt.
pub struct ScanGuard {
    rate_per_minute: u32,
    burst: u32,
    trust_forwarded_for: bool,
    salt: String,
    buckets: Mutex<HashMap<String, Bucket>>,
}

impl std::fmt::Debug for ScanGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScanGuard")
            .field("rate_per_minute", &self.rate_per_minute)
            .field("burst", &self.burst)
            .field("salt", &"<secret>")
            .finish()
    }
}

impl ScanGuard {
    pub fn new(config: &ScanConfig, salt: String) -> ScanGuard {
        ScanGuard {
            rate_per_minute: config.rate_per_minute,
            burst: config.burst,
            trust_forwarded_for: config.trust_forwarded_for,
            salt,
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// With the configured salt, or the one kept in the data directory
    /// (created on first start, mode 0600).
    pub fn from_config(config: &Config) -> anyhow::Result<ScanGuard> {
        let salt = match &config.scan.ip_salt {
            Some(salt) => salt.clone(),
            None => load_or_create_salt(&config.store.data_dir)?,
        };
        Ok(ScanGuard::new(&config.scan, salt))
    }

    /// Takes a token from `code`'s bucket at `now`; false past the limit.
    fn admit_at(&self, code: &str, now: Instant) -> bool {
        if self.rate_per_minute == 0 {
            return true;
        }
        let Ok(mut buckets) = self.buckets.lock() else { return false };
        let per_second = f64::from(self.rate_per_minute) / 60.0;
        let burst = f64::from(self.burst);
        if buckets.len() >= MAX_BUCKETS && !buckets.contains_key(code) {
            let full_after = Duration::from_secs_f64(burst / per_second);
            buckets.retain(|_, b| now.saturating_duration_since(b.refilled) < full_after);
            if buckets.len() >= MAX_BUCKETS {
                buckets.clear();
            }
        }
        let bucket =
            buckets.entry(code.to_owned()).or_insert(Bucket { tokens: burst, refilled: now });
        let elapsed = now.saturating_duration_since(bucket.refilled).as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed * per_second).min(burst);
        bucket.refilled = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// Hex SHA-256 of the salt and the address.
    fn hash_ip(&self, ip: IpAddr) -> String {
        let mut hasher = Sha256::new();
        hasher.update(self.salt.as_bytes());
        hasher.update([0]);
        hasher.update(ip.to_string().as_bytes());
        crate::ids::hex(&hasher.finalize())
    }

    fn client_ip(&self, headers: &HeaderMap, peer: Option<SocketAddr>) -> Option<IpAddr> {
        let forwarded = || {
            let value = headers.get("x-forwarded-for")?.to_str().ok()?;
            value.split(',').next()?.trim().parse::<IpAddr>().ok()
        };
        match self.trust_forwarded_for {
            true => forwarded().or(peer.map(|p| p.ip())),
            false => peer.map(|p| p.ip()),
        }
    }
}

fn load_or_create_salt(dir: &Path) -> anyhow::Result<String> {
    use std::io::Write;
    let path = dir.join(SALT_FILE);
    std::fs::create_dir_all(dir).map_err(|e| anyhow::anyhow!("{}: {e}", dir.display()))?;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    match options.open(&path) {
        Ok(mut file) => {
            let salt = crate::ids::hex(&rand::rng().random::<[u8; 32]>());
            file.write_all(salt.as_bytes())
                .and_then(|()| file.sync_all())
                .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
            Ok(salt)
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let salt = std::fs::read_to_string(&path)
                .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?
                .trim()
                .to_owned();
            if salt.len() < 16 {
                anyhow::bail!(
                    "{}: the scan IP salt must be at least 16 characters",
                    path.display()
                );
            }
            Ok(salt)
        }
        Err(e) => Err(anyhow::anyhow!("{}: {e}", path.display())),
    }
}

fn page(status: StatusCode, title: &str, text: &str) -> Response {
    let body = format!(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>{title}</title></head>\
         <body><h1>{title}</h1><p>{text}</p></body></html>"
    );
    let mut response = (status, body).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/html; charset=utf-8"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert("x-content-type-options", HeaderValue::from_static("nosniff"));
    response
}

fn header_text(headers: &HeaderMap, name: header::HeaderName, max: usize) -> Option<String> {
    let text = headers.get(name)?.to_str().ok()?.trim();
    (!text.is_empty()).then(|| text.chars().take(max).collect())
}

/// The scan event: through the same validation as `/api/ingest`.
fn scan_envelope(trackable: &Trackable, headers: &HeaderMap, ip_hash: Option<&str>) -> Value {
    let mut context = Map::new();
    if let Some(agent) = header_text(headers, header::USER_AGENT, MAX_USER_AGENT) {
        context.insert("userAgent".into(), Value::String(agent));
    }
    if let Some(referrer) = header_text(headers, header::REFERER, MAX_REFERRER) {
        context.insert("referrer".into(), Value::String(referrer));
    }
    let mut envelope = json!({
        "event": trackable.event_name.as_deref().unwrap_or("trackable.scanned"),
        "trackable": {"kind": trackable.kind.as_str(), "code": trackable.code, "id": trackable.id},
        "source": {"channel": "scan"},
    });
    if let Some(hash) = ip_hash {
        context.insert("ipHash".into(), Value::String(hash.to_owned()));
        envelope["actor"] = json!({"type": "visitor", "id": hash});
    }
    if !context.is_empty() {
        envelope["context"] = Value::Object(context);
    }
    envelope
}

/// Public scan of a trackable's code: records the scan, then redirects.
#[utoipa::path(
    get,
    path = "/r/{code}",
    tag = "trackables",
    params(("code" = String, Path, description = "The scan code: the last segment of a trackable's `scanUrl`")),
    responses(
        (status = 302, description = "Scan recorded (or rate-limited: `X-Opgraph-Scan: not-recorded`); `Location` is the trackable's `targetUrl`"),
        (status = 200, description = "Scan recorded; the trackable has no `targetUrl` (HTML page)"),
        (status = 404, description = "Unknown code (HTML page); nothing recorded"),
    ),
)]
pub async fn scan(State(state): State<AppState>, request: Request<Body>) -> Response {
    let segment = request.uri().path().strip_prefix("/r/").unwrap_or_default();
    if !is_scan_code(segment) {
        return not_found();
    }
    let target = match state.store.scan_target(segment).await {
        Ok(Some(target)) => target,
        Ok(None) => return not_found(),
        Err(e) => return e.into_response(),
    };
    let headers = request.headers();
    let guard = &state.scans;
    let recorded = request.method() != Method::HEAD && guard.admit_at(segment, Instant::now());
    if recorded {
        let peer = request.extensions().get::<ConnectInfo<SocketAddr>>().map(|c| c.0);
        let ip_hash = guard.client_ip(headers, peer).map(|ip| guard.hash_ip(ip));
        let envelope = scan_envelope(&target.trackable, headers, ip_hash.as_deref());
        let now = crate::now_ms();
        let stored = match parse_body(envelope, now) {
            Ok(events) => record(&state, &target.workspace_id, events, None, now, "scan").await,
            Err(e) => Err(e),
        };
        // The redirect happens whatever became of the record: a scan never
        // breaks the printed code.
        if let Err(e) = stored {
            tracing::warn!(trackable = %target.trackable.id, error = %e, "scan not recorded");
        }
    }
    let flag = HeaderValue::from_static(if recorded { "recorded" } else { "not-recorded" });
    let mut response = match target.trackable.target_url.as_deref().map(HeaderValue::from_str) {
        Some(Ok(location)) => {
            let mut response = StatusCode::FOUND.into_response();
            response.headers_mut().insert(header::LOCATION, location);
            response
                .headers_mut()
                .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
            response
        }
        Some(Err(_)) => {
            return crate::error::Error::internal("stored target URL is not a header value")
                .into_response();
        }
        None => page(StatusCode::OK, "Scanned", "Thank you: this scan was recorded."),
    };
    response.headers_mut().insert(SCAN_HEADER, flag);
    response
}

fn not_found() -> Response {
    page(StatusCode::NOT_FOUND, "Not found", "This code is not registered.")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trackables::TrackableKind;

    fn guard(rate_per_minute: u32, burst: u32) -> ScanGuard {
        let config = ScanConfig { rate_per_minute, burst, ..ScanConfig::default() };
        ScanGuard::new(&config, "pepper-pepper-pepper".into())
    }

    #[test]
    fn bucket_limits_each_code_and_refills() {
        let g = guard(60, 3);
        let t0 = Instant::now();
        assert!((0..3).all(|_| g.admit_at("abc", t0)));
        assert!(!g.admit_at("abc", t0));
        assert!(g.admit_at("other", t0), "codes have their own buckets");
        assert!(g.admit_at("abc", t0 + Duration::from_secs(1)), "one per second refills");
        assert!(!g.admit_at("abc", t0 + Duration::from_secs(1)));
        assert!((0..100).all(|_| guard(0, 0).admit_at("abc", t0)), "0 disables limiting");
    }

    #[test]
    fn ip_hash_is_salted_and_never_the_address() {
        let ip: IpAddr = "203.0.113.7".parse().unwrap();
        let a = guard(1, 1).hash_ip(ip);
        assert_eq!(a.len(), 64);
        assert!(!a.contains("203.0.113.7"));
        assert_eq!(a, guard(1, 1).hash_ip(ip));
        let other = ScanGuard::new(&ScanConfig::default(), "another-salt-value".into());
        assert_ne!(a, other.hash_ip(ip));
        assert!(!format!("{other:?}").contains("another-salt"));
    }

    #[test]
    fn forwarded_for_is_used_only_when_trusted() {
        let mut headers = HeaderMap::new();
        headers.insert("x-forwarded-for", HeaderValue::from_static("198.51.100.4, 10.0.0.1"));
        let peer: SocketAddr = "127.0.0.1:5000".parse().unwrap();
        let g = guard(1, 1);
        assert_eq!(g.client_ip(&headers, Some(peer)), Some(peer.ip()));
        let trusting = ScanGuard::new(
            &ScanConfig { trust_forwarded_for: true, ..ScanConfig::default() },
            "pepper-pepper-pepper".into(),
        );
        assert_eq!(trusting.client_ip(&headers, Some(peer)), "198.51.100.4".parse().ok());
    }

    #[test]
    fn salt_file_is_created_once_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let first = load_or_create_salt(dir.path()).unwrap();
        assert_eq!(first.len(), 64);
        assert_eq!(load_or_create_salt(dir.path()).unwrap(), first);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(dir.path().join(SALT_FILE)).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
    }

    #[test]
    fn scan_envelope_is_a_valid_event() {
        let trackable = Trackable {
            id: "trk_1".into(),
            code: "abc".into(),
            scan_code: "abc".into(),
            kind: TrackableKind::QrCode,
            name: "menu".into(),
            target_url: Some("https://example.com".into()),
            event_name: None,
            created_at: 0,
        };
        let mut headers = HeaderMap::new();
        headers.insert(header::USER_AGENT, HeaderValue::from_static("Mozilla/5.0"));
        let envelope = scan_envelope(&trackable, &headers, Some("ab12"));
        let events = parse_body(envelope.clone(), crate::now_ms()).unwrap();
        assert_eq!(events[0].event, "trackable.scanned");
        assert_eq!(envelope["context"], json!({"userAgent": "Mozilla/5.0", "ipHash": "ab12"}));
        assert_eq!(envelope["trackable"], json!({"kind": "qr_code", "code": "abc", "id": "trk_1"}));
    }
}
