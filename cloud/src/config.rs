//! Configuration: a TOML file (`--config`), then `OPGRAPH_*` environment
//! variables on top, validated once at load.
//!
//! Secrets (bootstrap key, JWT secret) usually come from the environment so
//! that the file can be committed to a deployment repository.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytesize::ByteSize;
use serde::Deserialize;

/// Everything `opgraph-cloud` can be told.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[derive(Default)]
pub struct Config {
    pub http: HttpConfig,
    pub store: StoreConfig,
    pub auth: AuthConfig,
    pub rate_limit: RateLimitConfig,
    pub usage: UsageConfig,
    pub scan: ScanConfig,
    pub receivers: crate::receiver::ReceiverConfig,
    pub governance: GovernanceConfig,
    pub exports: ExportsConfig,
    pub webhooks: WebhooksConfig,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpConfig {
    /// Address of the HTTP API. Default `127.0.0.1:8080`; port 0 picks a free
    /// port, printed as `listening http=...`. Env `OPGRAPH_HTTP_ADDR`.
    pub addr: SocketAddr,
    /// Largest request body accepted; larger ones get 413 before parsing.
    /// Default `1MiB`; `1KiB` to `1GiB`. Env `OPGRAPH_BODY_LIMIT`.
    pub body_limit: ByteSize,
    /// Base of the public links the API hands out (the `scanUrl` of a
    /// trackable, which its QR code encodes), e.g. `https://go.example.com`:
    /// an absolute http(s) URL without query or fragment. Default: `http://`
    /// and the bound HTTP address, which only suits local use. Env
    /// `OPGRAPH_PUBLIC_URL`.
    pub public_url: Option<String>,
    /// Connections served at once; more wait to be accepted. Default 1024;
    /// 1 to 1000000. Env `OPGRAPH_MAX_CONNECTIONS`.
    pub max_connections: usize,
    /// Longest wait for a request's head, also on an idle kept-alive
    /// connection. Default `30s`; `100ms` to `1h`. Env
    /// `OPGRAPH_HEADER_TIMEOUT`.
    #[serde(with = "humantime_serde")]
    pub header_timeout: Duration,
    /// Longest pause within a request body; a body that stalls longer is
    /// refused. Default `30s`; `100ms` to `1h`. Env `OPGRAPH_BODY_TIMEOUT`.
    #[serde(with = "humantime_serde")]
    pub body_timeout: Duration,
}

impl HttpConfig {
    /// What the server allows each client.
    pub fn limits(&self) -> opgraph_proto::serve::ServeLimits {
        opgraph_proto::serve::ServeLimits {
            max_connections: self.max_connections,
            header_timeout: self.header_timeout,
            body_timeout: self.body_timeout,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StoreKind {
    /// SQLite in `data_dir`: no server to run.
    Embedded,
    /// A ClickHouse server at `clickhouse_url`.
    Clickhouse,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreConfig {
    /// `embedded` (default) or `clickhouse`. Env `OPGRAPH_STORE`.
    pub kind: StoreKind,
    /// Directory of the embedded store; created if missing. Default
    /// `./opgraph-data`. Env `OPGRAPH_DATA_DIR`.
    pub data_dir: PathBuf,
    /// ClickHouse HTTP URL when `kind = "clickhouse"`, e.g.
    /// `http://127.0.0.1:8123`, or `https://host:8443` for a server behind
    /// TLS (credentials as `http://user:pass@host:8123`). Env
    /// `OPGRAPH_CLICKHOUSE_URL`.
    pub clickhouse_url: Option<String>,
    /// PEM file of the CAs an `https://` ClickHouse's certificate must
    /// chain to, for a private CA. Unset (default): the platform's roots.
    /// Env `OPGRAPH_CLICKHOUSE_CA_FILE`.
    pub clickhouse_ca_file: Option<PathBuf>,
    /// Database of the ClickHouse store, created if missing. Default
    /// `opgraph`. Env `OPGRAPH_CLICKHOUSE_DATABASE`.
    pub clickhouse_database: String,
    /// Cluster (a name in the ClickHouse servers' `remote_servers`) to lay
    /// the ClickHouse store out on: replicated local tables created `ON
    /// CLUSTER` and Distributed tables over them (docs/storage.md). Unset
    /// (default): one server. Env `OPGRAPH_CLICKHOUSE_CLUSTER`.
    pub clickhouse_cluster: Option<String>,
    /// How long the embedded writer waits to gather concurrent writes into
    /// one transaction (one fsync). Default `0ms`: commit as soon as the
    /// queue is drained, which already groups whatever arrived during the
    /// last commit; a window measured slower under load (docs/storage.md).
    #[serde(with = "humantime_serde")]
    pub group_commit_window: Duration,
    /// Page cache of the embedded store's writer. Each event updates
    /// indexes keyed by random ids; once they outgrow this cache, the
    /// writer spends its time reading pages back. Allocated as used, so
    /// a small store stays small. Default `256MiB`; `4MiB` to `1TiB`. Env
    /// `OPGRAPH_WRITER_CACHE`.
    pub writer_cache: ByteSize,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    /// The operator key to create (or keep) on start instead of generating
    /// one. Env `OPGRAPH_BOOTSTRAP_KEY`. Must look like `og_` + at least 20
    /// characters.
    pub bootstrap_key: Option<String>,
    pub jwt: JwtConfig,
}

/// Enterprise tokens, verified offline. Configure one of `secret`,
/// `public_key_file` or `jwks_file`; leaving all unset disables tokens.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct JwtConfig {
    /// HS256 shared secret. Env `OPGRAPH_JWT_SECRET`.
    pub secret: Option<String>,
    /// PEM public key (RSA for RS256, EC P-256 for ES256). Env
    /// `OPGRAPH_JWT_PUBLIC_KEY_FILE`.
    pub public_key_file: Option<PathBuf>,
    /// JWKS document; keys are chosen by the token's `kid`. Env
    /// `OPGRAPH_JWT_JWKS_FILE`.
    pub jwks_file: Option<PathBuf>,
    /// Required `iss`. Env `OPGRAPH_JWT_ISSUER`.
    pub issuer: Option<String>,
    /// Required `aud`. Env `OPGRAPH_JWT_AUDIENCE`.
    pub audience: Option<String>,
}

impl JwtConfig {
    pub fn enabled(&self) -> bool {
        self.secret.is_some() || self.public_key_file.is_some() || self.jwks_file.is_some()
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RateLimitConfig {
    /// Sustained requests per second per workspace; 0 disables limiting.
    /// Default 1000. Env `OPGRAPH_RATE_LIMIT_RPS`.
    pub requests_per_second: u32,
    /// Requests a workspace may make at once above the sustained rate.
    /// Default 2000. Env `OPGRAPH_RATE_LIMIT_BURST`.
    pub burst: u32,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[derive(Default)]
pub struct UsageConfig {
    /// Events a workspace may ingest per calendar month (UTC) before ingest
    /// is refused with 429. 0 means no quota. Default 0. Env
    /// `OPGRAPH_EVENTS_QUOTA`.
    pub monthly_event_quota: u64,
}

/// The public scan redirect `GET /r/{code}`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ScanConfig {
    /// Scans recorded per minute and per code, sustained; past it a scan
    /// still redirects but is not recorded, so a flood can neither fill the
    /// store nor break a printed code. 0 records every scan. Default 600.
    /// Env `OPGRAPH_SCAN_RATE_PER_MINUTE`.
    pub rate_per_minute: u32,
    /// Scans of one code recorded at once above the sustained rate. Default
    /// 60. Env `OPGRAPH_SCAN_BURST`.
    pub burst: u32,
    /// Salt of the SHA-256 under which a scanner's IP address is kept (the
    /// address itself never is). Default: 32 random bytes generated on first
    /// start and kept in `<data_dir>/scan-ip-salt` (mode 0600); set it to
    /// share hashes across nodes. At least 16 characters. Never logged. Env
    /// `OPGRAPH_SCAN_IP_SALT`.
    pub ip_salt: Option<String>,
    /// Take the client address from the first `X-Forwarded-For` entry
    /// instead of the TCP peer. Only behind a proxy that sets it: otherwise
    /// a client chooses what is hashed. Default false. Env
    /// `OPGRAPH_SCAN_TRUST_FORWARDED_FOR`.
    pub trust_forwarded_for: bool,
}

impl Default for ScanConfig {
    fn default() -> Self {
        ScanConfig { rate_per_minute: 600, burst: 60, ip_salt: None, trust_forwarded_for: false }
    }
}

/// Governance: where proof trails are pushed (`pushToExternalProof`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GovernanceConfig {
    /// HTTPS endpoint that receives proof-trail packets (POST, JSON). Unset:
    /// a request to push is a 400. Must be `https://`. Env
    /// `OPGRAPH_PROOF_URL`.
    pub proof_url: Option<String>,
    /// PEM file of the CA to trust for `proof_url` *instead of* the
    /// platform's roots (a private endpoint, or a test). Env
    /// `OPGRAPH_PROOF_CA_FILE`.
    pub proof_ca_file: Option<PathBuf>,
    /// Bound on one push, connection to last byte. Default `10s`; at most
    /// `5min`. Env `OPGRAPH_PROOF_TIMEOUT`.
    #[serde(with = "humantime_serde")]
    pub proof_timeout: Duration,
}

impl Default for GovernanceConfig {
    fn default() -> Self {
        GovernanceConfig {
            proof_url: None,
            proof_ca_file: None,
            proof_timeout: Duration::from_secs(10),
        }
    }
}

/// Destination exports (`POST /api/exports/destinations`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ExportsConfig {
    /// PEM file of the CA to trust for every export endpoint *instead of*
    /// the platform's roots (private endpoints, or a test). Env
    /// `OPGRAPH_EXPORT_CA_FILE`.
    pub ca_file: Option<PathBuf>,
    /// Bound on one export, connection to last byte. Default `30s`; at
    /// most `5min`. Env `OPGRAPH_EXPORT_TIMEOUT`.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// Let exports reach loopback, private, link-local and other
    /// non-public addresses. Off by default: the destination URL comes
    /// from an API caller, who must not reach the cloud's own network
    /// through it. Turn on for destinations inside your network (and in
    /// tests). Env `OPGRAPH_EXPORT_ALLOW_PRIVATE_NETWORKS` (`true`/`false`).
    pub allow_private_networks: bool,
}

impl Default for ExportsConfig {
    fn default() -> Self {
        ExportsConfig {
            ca_file: None,
            timeout: Duration::from_secs(30),
            allow_private_networks: false,
        }
    }
}

/// Webhook deliveries (`/api/webhooks`). They go out like exports, with
/// the `[exports]` settings for the CA, the timeout and private networks.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WebhooksConfig {
    /// Tries per delivery, the first included; 1 to 20. Default 6. Env
    /// `OPGRAPH_WEBHOOK_MAX_ATTEMPTS`.
    pub max_attempts: u32,
    /// Wait before the first retry; each later one waits twice as long,
    /// with up to a quarter added at random so that receivers coming back
    /// are not hit by every sender at once. Default `30s` (retries after
    /// about 30 s, 1, 2, 4 and 8 min); 1ms to 1h. Env
    /// `OPGRAPH_WEBHOOK_RETRY_BASE`.
    #[serde(with = "humantime_serde")]
    pub retry_base: Duration,
    /// How often the workspaces with an `anomaly.detected` webhook are
    /// checked for anomalies (hourly counts against the week before, as
    /// business health judges them). Each anomaly is delivered once per
    /// process. Default `5min`; `0s` turns the watcher off; at most `1h`.
    /// Env `OPGRAPH_WEBHOOK_ANOMALY_INTERVAL`.
    #[serde(with = "humantime_serde")]
    pub anomaly_interval: Duration,
    /// How long the delivery log keeps an attempt (and a delivery still
    /// unfinished stays due): older ones are deleted, checked every
    /// quarter of this (at most hourly). Default `30days`; `0s` keeps
    /// everything; at most `3650days`. Env `OPGRAPH_WEBHOOK_LOG_RETENTION`.
    #[serde(with = "humantime_serde")]
    pub log_retention: Duration,
    /// How long past its next attempt's due time a delivery stays with the
    /// cloud process that holds it. Several processes on one ClickHouse
    /// leave each other's deliveries alone; one whose holder stopped or
    /// died is taken over once this has passed (checked every half of it,
    /// at most every minute). Must exceed `exports.timeout`, the longest an
    /// attempt takes. Default `2min`; at most `1h`. Env
    /// `OPGRAPH_WEBHOOK_LEASE`.
    #[serde(with = "humantime_serde")]
    pub lease: Duration,
}

impl Default for WebhooksConfig {
    fn default() -> Self {
        WebhooksConfig {
            max_attempts: 6,
            retry_base: Duration::from_secs(30),
            anomaly_interval: Duration::from_secs(300),
            log_retention: Duration::from_secs(30 * 24 * 3600),
            lease: Duration::from_secs(120),
        }
    }
}

impl Default for HttpConfig {
    fn default() -> Self {
        let defaults = opgraph_proto::serve::ServeLimits::default();
        HttpConfig {
            addr: SocketAddr::from(([127, 0, 0, 1], 8080)),
            body_limit: ByteSize::mib(1),
            public_url: None,
            max_connections: defaults.max_connections,
            header_timeout: defaults.header_timeout,
            body_timeout: defaults.body_timeout,
        }
    }
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            kind: StoreKind::Embedded,
            data_dir: PathBuf::from("opgraph-data"),
            clickhouse_url: None,
            clickhouse_ca_file: None,
            clickhouse_database: "opgraph".into(),
            clickhouse_cluster: None,
            group_commit_window: Duration::ZERO,
            writer_cache: ByteSize::b(crate::store::embedded::DEFAULT_WRITER_CACHE),
        }
    }
}

impl Default for RateLimitConfig {
    fn default() -> Self {
        RateLimitConfig { requests_per_second: 1000, burst: 2000 }
    }
}

/// A configuration problem, with the key path it concerns.
#[derive(Debug, thiserror::Error)]
#[error("config: {key}: {message}")]
pub struct ConfigError {
    pub key: String,
    pub message: String,
}

fn problem(key: &str, message: impl Into<String>) -> ConfigError {
    ConfigError { key: key.to_owned(), message: message.into() }
}

impl Config {
    /// Reads the file (if any), applies the environment, validates.
    pub fn load(
        file: Option<&Path>,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigError> {
        let mut config = match file {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| problem(&path.display().to_string(), e.to_string()))?;
                Self::parse(&text)?
            }
            None => Config::default(),
        };
        config.apply_env(env)?;
        config.validate()?;
        Ok(config)
    }

    /// Parses TOML, naming the key path of the first problem.
    pub fn parse(text: &str) -> Result<Config, ConfigError> {
        let deserializer = toml::Deserializer::parse(text)
            .map_err(|e| problem("(file)", e.message().to_owned()))?;
        serde_path_to_error::deserialize(deserializer).map_err(|e| {
            let key = e.path().to_string();
            problem(&key, e.into_inner().message().to_owned())
        })
    }

    fn apply_env(&mut self, env: impl Fn(&str) -> Option<String>) -> Result<(), ConfigError> {
        fn parsed<T: std::str::FromStr>(name: &str, value: String) -> Result<T, ConfigError>
        where
            T::Err: std::fmt::Display,
        {
            value.trim().parse().map_err(|e: T::Err| problem(name, format!("{e}: {value:?}")))
        }
        /// `30s`, `5min`, `30days`: what the TOML file takes too.
        fn duration(name: &str, value: String) -> Result<Duration, ConfigError> {
            humantime_serde::re::humantime::parse_duration(value.trim())
                .map_err(|e| problem(name, format!("{e}: {value:?}")))
        }
        if let Some(v) = env("OPGRAPH_HTTP_ADDR") {
            self.http.addr = parsed("OPGRAPH_HTTP_ADDR", v)?;
        }
        if let Some(v) = env("OPGRAPH_BODY_LIMIT") {
            self.http.body_limit = parsed("OPGRAPH_BODY_LIMIT", v)?;
        }
        if let Some(v) = env("OPGRAPH_PUBLIC_URL") {
            self.http.public_url = Some(v);
        }
        if let Some(v) = env("OPGRAPH_MAX_CONNECTIONS") {
            self.http.max_connections = parsed("OPGRAPH_MAX_CONNECTIONS", v)?;
        }
        if let Some(v) = env("OPGRAPH_HEADER_TIMEOUT") {
            self.http.header_timeout = duration("OPGRAPH_HEADER_TIMEOUT", v)?;
        }
        if let Some(v) = env("OPGRAPH_BODY_TIMEOUT") {
            self.http.body_timeout = duration("OPGRAPH_BODY_TIMEOUT", v)?;
        }
        if let Some(v) = env("OPGRAPH_SCAN_RATE_PER_MINUTE") {
            self.scan.rate_per_minute = parsed("OPGRAPH_SCAN_RATE_PER_MINUTE", v)?;
        }
        if let Some(v) = env("OPGRAPH_SCAN_BURST") {
            self.scan.burst = parsed("OPGRAPH_SCAN_BURST", v)?;
        }
        if let Some(v) = env("OPGRAPH_SCAN_IP_SALT") {
            self.scan.ip_salt = Some(v);
        }
        if let Some(v) = env("OPGRAPH_SCAN_TRUST_FORWARDED_FOR") {
            self.scan.trust_forwarded_for = parsed("OPGRAPH_SCAN_TRUST_FORWARDED_FOR", v)?;
        }
        for (name, slot) in [
            ("OPGRAPH_GRPC_ADDR", &mut self.receivers.grpc_addr),
            ("OPGRAPH_QUIC_ADDR", &mut self.receivers.quic_addr),
        ] {
            if let Some(v) = env(name) {
                *slot = if v.trim() == "off" { None } else { Some(parsed(name, v)?) };
            }
        }
        if let Some(v) = env("OPGRAPH_QUIC_MAX_UNAUTHENTICATED") {
            self.receivers.quic_max_unauthenticated_connections =
                parsed("OPGRAPH_QUIC_MAX_UNAUTHENTICATED", v)?;
        }
        for (name, slot) in [
            ("OPGRAPH_TLS_CERT_FILE", &mut self.receivers.tls_cert_file),
            ("OPGRAPH_TLS_KEY_FILE", &mut self.receivers.tls_key_file),
            ("OPGRAPH_TLS_CLIENT_CA_FILE", &mut self.receivers.client_ca_file),
        ] {
            if let Some(v) = env(name) {
                *slot = Some(PathBuf::from(v));
            }
        }
        if let Some(v) = env("OPGRAPH_PROOF_URL") {
            self.governance.proof_url = Some(v);
        }
        if let Some(v) = env("OPGRAPH_PROOF_CA_FILE") {
            self.governance.proof_ca_file = Some(PathBuf::from(v));
        }
        if let Some(v) = env("OPGRAPH_PROOF_TIMEOUT") {
            self.governance.proof_timeout = duration("OPGRAPH_PROOF_TIMEOUT", v)?;
        }
        if let Some(v) = env("OPGRAPH_EXPORT_CA_FILE") {
            self.exports.ca_file = Some(PathBuf::from(v));
        }
        if let Some(v) = env("OPGRAPH_EXPORT_ALLOW_PRIVATE_NETWORKS") {
            self.exports.allow_private_networks =
                parsed("OPGRAPH_EXPORT_ALLOW_PRIVATE_NETWORKS", v)?;
        }
        if let Some(v) = env("OPGRAPH_EXPORT_TIMEOUT") {
            self.exports.timeout = duration("OPGRAPH_EXPORT_TIMEOUT", v)?;
        }
        if let Some(v) = env("OPGRAPH_WEBHOOK_MAX_ATTEMPTS") {
            self.webhooks.max_attempts = parsed("OPGRAPH_WEBHOOK_MAX_ATTEMPTS", v)?;
        }
        if let Some(v) = env("OPGRAPH_WEBHOOK_ANOMALY_INTERVAL") {
            self.webhooks.anomaly_interval = duration("OPGRAPH_WEBHOOK_ANOMALY_INTERVAL", v)?;
        }
        if let Some(v) = env("OPGRAPH_WEBHOOK_LOG_RETENTION") {
            self.webhooks.log_retention = duration("OPGRAPH_WEBHOOK_LOG_RETENTION", v)?;
        }
        if let Some(v) = env("OPGRAPH_WEBHOOK_LEASE") {
            self.webhooks.lease = duration("OPGRAPH_WEBHOOK_LEASE", v)?;
        }
        if let Some(v) = env("OPGRAPH_WEBHOOK_RETRY_BASE") {
            self.webhooks.retry_base = duration("OPGRAPH_WEBHOOK_RETRY_BASE", v)?;
        }
        if let Some(v) = env("OPGRAPH_WRITER_CACHE") {
            self.store.writer_cache = parsed("OPGRAPH_WRITER_CACHE", v)?;
        }
        if let Some(v) = env("OPGRAPH_DATA_DIR") {
            self.store.data_dir = PathBuf::from(v);
        }
        if let Some(v) = env("OPGRAPH_STORE") {
            self.store.kind = match v.trim() {
                "embedded" => StoreKind::Embedded,
                "clickhouse" => StoreKind::Clickhouse,
                other => {
                    return Err(problem(
                        "OPGRAPH_STORE",
                        format!("expected `embedded` or `clickhouse`, got {other:?}"),
                    ));
                }
            };
        }
        if let Some(v) = env("OPGRAPH_CLICKHOUSE_URL") {
            self.store.clickhouse_url = Some(v);
        }
        if let Some(v) = env("OPGRAPH_CLICKHOUSE_CA_FILE") {
            self.store.clickhouse_ca_file = Some(PathBuf::from(v));
        }
        if let Some(v) = env("OPGRAPH_CLICKHOUSE_DATABASE") {
            self.store.clickhouse_database = v;
        }
        if let Some(v) = env("OPGRAPH_CLICKHOUSE_CLUSTER") {
            self.store.clickhouse_cluster = Some(v);
        }
        if let Some(v) = env("OPGRAPH_BOOTSTRAP_KEY") {
            self.auth.bootstrap_key = Some(v);
        }
        let jwt = &mut self.auth.jwt;
        if let Some(v) = env("OPGRAPH_JWT_SECRET") {
            jwt.secret = Some(v);
        }
        if let Some(v) = env("OPGRAPH_JWT_PUBLIC_KEY_FILE") {
            jwt.public_key_file = Some(PathBuf::from(v));
        }
        if let Some(v) = env("OPGRAPH_JWT_JWKS_FILE") {
            jwt.jwks_file = Some(PathBuf::from(v));
        }
        if let Some(v) = env("OPGRAPH_JWT_ISSUER") {
            jwt.issuer = Some(v);
        }
        if let Some(v) = env("OPGRAPH_JWT_AUDIENCE") {
            jwt.audience = Some(v);
        }
        if let Some(v) = env("OPGRAPH_RATE_LIMIT_RPS") {
            self.rate_limit.requests_per_second = parsed("OPGRAPH_RATE_LIMIT_RPS", v)?;
        }
        if let Some(v) = env("OPGRAPH_RATE_LIMIT_BURST") {
            self.rate_limit.burst = parsed("OPGRAPH_RATE_LIMIT_BURST", v)?;
        }
        if let Some(v) = env("OPGRAPH_EVENTS_QUOTA") {
            self.usage.monthly_event_quota = parsed("OPGRAPH_EVENTS_QUOTA", v)?;
        }
        Ok(())
    }

    fn validate(&self) -> Result<(), ConfigError> {
        // A body is held whole while it is parsed; the ceilings below only
        // catch a unit typed wrong, so that it is not read as "no limit".
        if !(ByteSize::kib(1)..=ByteSize::gib(1)).contains(&self.http.body_limit) {
            return Err(problem("http.body_limit", "must be 1KiB to 1GiB"));
        }
        if let Some((key, why)) = opgraph_proto::serve::problems(&self.http.limits()).first() {
            return Err(problem(&format!("http.{key}"), *why));
        }
        if self.store.kind == StoreKind::Clickhouse && self.store.clickhouse_url.is_none() {
            return Err(problem(
                "store.clickhouse_url",
                "required when store.kind = \"clickhouse\" (env OPGRAPH_CLICKHOUSE_URL)",
            ));
        }
        if let Some(url) = &self.store.clickhouse_url {
            let parsed = crate::store::clickhouse::parse_url(url)
                .map_err(|why| problem("store.clickhouse_url", why))?;
            if self.store.clickhouse_ca_file.is_some() && parsed.scheme() != "https" {
                return Err(problem(
                    "store.clickhouse_ca_file",
                    "only for an https:// store.clickhouse_url",
                ));
            }
        }
        if let Some(cluster) = &self.store.clickhouse_cluster
            && !crate::store::clickhouse::plain_identifier(cluster)
        {
            return Err(problem(
                "store.clickhouse_cluster",
                "letters, digits and '_' only, not starting with a digit, at most 64",
            ));
        }
        if !crate::store::clickhouse::plain_identifier(&self.store.clickhouse_database) {
            return Err(problem(
                "store.clickhouse_database",
                "letters, digits and '_' only, not starting with a digit, at most 64",
            ));
        }
        if self.store.group_commit_window > Duration::from_secs(1) {
            return Err(problem("store.group_commit_window", "must be at most 1s"));
        }
        if !(ByteSize::mib(4)..=ByteSize::tib(1)).contains(&self.store.writer_cache) {
            return Err(problem("store.writer_cache", "must be 4MiB to 1TiB"));
        }
        // 0 would refuse every gateway; the ceiling catches a typo, not a
        // real deployment (each place may cost a stream's receive window).
        if !(1..=100_000).contains(&self.receivers.quic_max_unauthenticated_connections) {
            return Err(problem(
                "receivers.quic_max_unauthenticated_connections",
                "must be 1 to 100000",
            ));
        }
        if let Some(key) = &self.auth.bootstrap_key
            && !crate::auth::looks_like_api_key(key)
        {
            return Err(problem(
                "auth.bootstrap_key",
                "must be `og_` followed by at least 20 letters or digits",
            ));
        }
        let jwt = &self.auth.jwt;
        let sources =
            [jwt.secret.is_some(), jwt.public_key_file.is_some(), jwt.jwks_file.is_some()]
                .into_iter()
                .filter(|set| *set)
                .count();
        if sources > 1 {
            return Err(problem(
                "auth.jwt",
                "set only one of secret, public_key_file and jwks_file",
            ));
        }
        if let Some(secret) = &jwt.secret
            && secret.len() < 32
        {
            return Err(problem("auth.jwt.secret", "must be at least 32 bytes for HS256"));
        }
        if let Some(url) = &self.http.public_url
            && let Err(why) = crate::trackables::check_public_base_url(url)
        {
            return Err(problem("http.public_url", why));
        }
        if self.scan.rate_per_minute > 0 && self.scan.burst == 0 {
            return Err(problem("scan.burst", "must be at least 1 when scan limiting is on"));
        }
        if let Some(salt) = &self.scan.ip_salt
            && salt.chars().count() < 16
        {
            return Err(problem("scan.ip_salt", "must be at least 16 characters"));
        }
        if let Some(url) = &self.governance.proof_url
            && !url.starts_with("https://")
        {
            return Err(problem("governance.proof_url", "must be an https:// URL"));
        }
        if self.governance.proof_timeout.is_zero()
            || self.governance.proof_timeout > Duration::from_secs(300)
        {
            return Err(problem("governance.proof_timeout", "must be between 1ms and 5min"));
        }
        if self.exports.timeout.is_zero() || self.exports.timeout > Duration::from_secs(300) {
            return Err(problem("exports.timeout", "must be between 1ms and 5min"));
        }
        if !(1..=20).contains(&self.webhooks.max_attempts) {
            return Err(problem("webhooks.max_attempts", "must be between 1 and 20"));
        }
        if self.webhooks.retry_base.is_zero()
            || self.webhooks.retry_base > Duration::from_secs(3600)
        {
            return Err(problem("webhooks.retry_base", "must be between 1ms and 1h"));
        }
        if self.webhooks.lease <= self.exports.timeout
            || self.webhooks.lease > Duration::from_secs(3600)
        {
            return Err(problem(
                "webhooks.lease",
                "must be longer than exports.timeout (an attempt's limit) and at most 1h",
            ));
        }
        if self.webhooks.log_retention > Duration::from_secs(3650 * 24 * 3600) {
            return Err(problem(
                "webhooks.log_retention",
                "must be at most 3650days (0s: keep everything)",
            ));
        }
        if self.webhooks.anomaly_interval > Duration::from_secs(3600) {
            return Err(problem("webhooks.anomaly_interval", "must be at most 1h (0s: off)"));
        }
        if self.rate_limit.requests_per_second > 0 && self.rate_limit.burst == 0 {
            return Err(problem("rate_limit.burst", "must be at least 1 when limiting is on"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    /// Whatever a variable the cloud reads is set to, loading answers with
    /// a config or the problem, never a panic. The variables are read from
    /// this file, so a new one is covered as it is added.
    #[test]
    fn no_environment_value_makes_loading_panic() {
        let source = include_str!("config.rs");
        let mut names: Vec<&str> = source
            .match_indices("\"OPGRAPH_")
            .filter_map(|(at, _)| source[at + 1..].split('"').next())
            .filter(|name| name.len() > "OPGRAPH_".len())
            .collect();
        names.sort_unstable();
        names.dedup();
        assert!(names.len() > 30, "{names:?}");
        let long = "x".repeat(10_000);
        let edges = [
            "",
            " ",
            "-1",
            "0",
            "18446744073709551616",
            "1e400",
            "NaN",
            "16EiB",
            "-1MiB",
            "5000000000y",
            "0s",
            "\0",
            &long,
            "true",
            "127.0.0.1:99999",
            "[::1]:0",
            "off",
            "https://",
            "og_",
            "\u{202e}",
        ];
        for name in &names {
            for edge in edges {
                let env = |k: &str| (k == *name).then(|| edge.to_owned());
                let loaded = std::panic::catch_unwind(|| Config::load(None, env).map(|_| ()));
                assert!(loaded.is_ok(), "{name}={edge:?} panicked");
            }
        }
    }

    #[test]
    fn unknown_key_is_reported_with_its_path() {
        let err = Config::parse("[http]\nadress = \"127.0.0.1:1\"\n").unwrap_err();
        assert_eq!(err.key, "http.adress");
        assert!(err.message.contains("adress"), "{err}");
    }

    #[test]
    fn bad_value_is_reported_with_its_path() {
        let err = Config::parse("[rate_limit]\nburst = -3\n").unwrap_err();
        assert_eq!(err.key, "rate_limit.burst");
    }

    #[test]
    fn env_overrides_file() {
        let config = Config::parse("[http]\naddr = \"127.0.0.1:9000\"\nbody_limit = \"2MiB\"\n")
            .and_then(|mut c| {
                c.apply_env(|k| (k == "OPGRAPH_HTTP_ADDR").then(|| "127.0.0.1:0".to_owned()))?;
                Ok(c)
            })
            .unwrap();
        assert_eq!(config.http.addr.port(), 0);
        assert_eq!(config.http.body_limit, ByteSize::mib(2));
    }

    #[test]
    fn writer_cache_has_a_floor_and_an_env_override() {
        let with = |size: &'static str| {
            move |k: &str| (k == "OPGRAPH_WRITER_CACHE").then(|| size.to_owned())
        };
        let config = Config::load(None, with("64MiB")).unwrap();
        assert_eq!(config.store.writer_cache, ByteSize::mib(64));
        assert_eq!(Config::load(None, with("1MiB")).unwrap_err().key, "store.writer_cache");
        assert_eq!(Config::load(None, with("lots")).unwrap_err().key, "OPGRAPH_WRITER_CACHE");
    }

    #[test]
    fn bad_env_value_names_the_variable() {
        let err =
            Config::load(None, |k| (k == "OPGRAPH_STORE").then(|| "duck".into())).unwrap_err();
        assert_eq!(err.key, "OPGRAPH_STORE");
    }

    #[test]
    fn clickhouse_cluster_must_be_a_plain_name() {
        let with = |name: &'static str| {
            move |k: &str| (k == "OPGRAPH_CLICKHOUSE_CLUSTER").then(|| name.to_owned())
        };
        let config = Config::load(None, with("opgraph_2x2")).unwrap();
        assert_eq!(config.store.clickhouse_cluster.as_deref(), Some("opgraph_2x2"));
        let err = Config::load(None, with("c; DROP TABLE events")).unwrap_err();
        assert_eq!(err.key, "store.clickhouse_cluster");
    }

    #[test]
    fn clickhouse_url_is_http_or_https_and_a_ca_file_needs_https() {
        let with = |url: &'static str, ca: Option<&'static str>| {
            move |k: &str| match k {
                "OPGRAPH_CLICKHOUSE_URL" => Some(url.to_owned()),
                "OPGRAPH_CLICKHOUSE_CA_FILE" => ca.map(str::to_owned),
                _ => None,
            }
        };
        assert!(Config::load(None, with("http://127.0.0.1:8123", None)).is_ok());
        let tls = Config::load(None, with("https://ch.example:8443", Some("/etc/ca.pem"))).unwrap();
        assert_eq!(tls.store.clickhouse_ca_file.as_deref(), Some(Path::new("/etc/ca.pem")));
        for url in ["clickhouse:8123", "http://", "tcp://h:9000", "file:///tmp/x"] {
            let err = Config::load(None, with(url, None)).unwrap_err();
            assert_eq!(err.key, "store.clickhouse_url", "{url}");
            assert!(err.message.contains("https://"), "{err}");
        }
        let err =
            Config::load(None, with("http://127.0.0.1:8123", Some("/etc/ca.pem"))).unwrap_err();
        assert_eq!(err.key, "store.clickhouse_ca_file");
    }

    #[test]
    fn short_bootstrap_key_is_refused() {
        let err = Config::load(None, |k| (k == "OPGRAPH_BOOTSTRAP_KEY").then(|| "og_x".into()))
            .unwrap_err();
        assert_eq!(err.key, "auth.bootstrap_key");
    }

    #[test]
    fn public_url_must_be_an_absolute_http_base() {
        let with =
            |url: &'static str| move |k: &str| (k == "OPGRAPH_PUBLIC_URL").then(|| url.to_owned());
        let config = Config::load(None, with("https://go.example.com")).unwrap();
        assert_eq!(config.http.public_url.as_deref(), Some("https://go.example.com"));
        for bad in ["go.example.com", "ftp://x.example", "https://x.example/?a=1", "javascript:x"] {
            let err = Config::load(None, with(bad)).unwrap_err();
            assert_eq!(err.key, "http.public_url", "{bad}");
        }
    }

    #[test]
    fn scan_settings_are_checked() {
        let err = Config::parse("[scan]\nburst = 0\n").and_then(|c| c.validate()).unwrap_err();
        assert_eq!(err.key, "scan.burst");
        let err = Config::load(None, |k| (k == "OPGRAPH_SCAN_IP_SALT").then(|| "short".into()))
            .unwrap_err();
        assert_eq!(err.key, "scan.ip_salt");
        assert!(!err.to_string().contains("short"), "the salt is never echoed: {err}");
    }

    #[test]
    fn webhook_retries_are_bounded() {
        let config = Config::parse("[webhooks]\nmax_attempts = 3\nretry_base = \"2s\"\n").unwrap();
        assert_eq!((config.webhooks.max_attempts, config.webhooks.retry_base.as_secs()), (3, 2));
        for (text, key) in [
            ("[webhooks]\nmax_attempts = 0\n", "webhooks.max_attempts"),
            ("[webhooks]\nmax_attempts = 21\n", "webhooks.max_attempts"),
            ("[webhooks]\nretry_base = \"2h\"\n", "webhooks.retry_base"),
            ("[webhooks]\nretry_base = \"0s\"\n", "webhooks.retry_base"),
            ("[webhooks]\nanomaly_interval = \"2h\"\n", "webhooks.anomaly_interval"),
            ("[webhooks]\nlease = \"30s\"\n", "webhooks.lease"),
            ("[webhooks]\nlease = \"2h\"\n", "webhooks.lease"),
        ] {
            let err = Config::parse(text).and_then(|c| c.validate()).unwrap_err();
            assert_eq!(err.key, key, "{text}");
        }
        let with = |v: &'static str| {
            move |k: &str| (k == "OPGRAPH_WEBHOOK_RETRY_BASE").then(|| v.to_owned())
        };
        assert_eq!(Config::load(None, with("50ms")).unwrap().webhooks.retry_base.as_millis(), 50);
        assert_eq!(Config::load(None, with("soon")).unwrap_err().key, "OPGRAPH_WEBHOOK_RETRY_BASE");
    }

    #[test]
    fn the_bound_on_unauthenticated_quic_connections_is_checked() {
        assert_eq!(
            Config::load(None, no_env).unwrap().receivers.quic_max_unauthenticated_connections,
            256
        );
        let with = |v: &'static str| {
            move |k: &str| (k == "OPGRAPH_QUIC_MAX_UNAUTHENTICATED").then(|| v.to_owned())
        };
        let config = Config::load(None, with("8")).unwrap();
        assert_eq!(config.receivers.quic_max_unauthenticated_connections, 8);
        for bad in ["0", "100001"] {
            let err = Config::load(None, with(bad)).unwrap_err();
            assert_eq!(err.key, "receivers.quic_max_unauthenticated_connections", "{bad}");
        }
        let err = Config::parse("[receivers]\nquic_max_unauthenticated_connections = 0\n")
            .and_then(|c| c.validate())
            .unwrap_err();
        assert_eq!(err.key, "receivers.quic_max_unauthenticated_connections");
    }

    #[test]
    fn defaults_are_valid() {
        Config::load(None, no_env).unwrap();
    }
}
