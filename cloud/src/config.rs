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
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpConfig {
    /// Address of the HTTP API. Default `127.0.0.1:8080`; port 0 picks a free
    /// port, printed as `listening http=...`. Env `OPGRAPH_HTTP_ADDR`.
    pub addr: SocketAddr,
    /// Largest request body accepted; larger ones get 413 before parsing.
    /// Default `1MiB`. Env `OPGRAPH_BODY_LIMIT`.
    pub body_limit: ByteSize,
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
    /// ClickHouse HTTP URL when `kind = "clickhouse"`. Env
    /// `OPGRAPH_CLICKHOUSE_URL`.
    pub clickhouse_url: Option<String>,
    /// How long the embedded writer gathers concurrent writes into one
    /// transaction (one fsync). Longer raises throughput under load and
    /// latency when idle. Default `0ms`: commit as soon as the queue is
    /// drained, which still groups whatever arrived during the last commit.
    #[serde(with = "humantime_serde")]
    pub group_commit_window: Duration,
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


impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            addr: SocketAddr::from(([127, 0, 0, 1], 8080)),
            body_limit: ByteSize::mib(1),
        }
    }
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            kind: StoreKind::Embedded,
            data_dir: PathBuf::from("opgraph-data"),
            clickhouse_url: None,
            group_commit_window: Duration::ZERO,
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
        if let Some(v) = env("OPGRAPH_HTTP_ADDR") {
            self.http.addr = parsed("OPGRAPH_HTTP_ADDR", v)?;
        }
        if let Some(v) = env("OPGRAPH_BODY_LIMIT") {
            self.http.body_limit = parsed("OPGRAPH_BODY_LIMIT", v)?;
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
        if self.http.body_limit.as_u64() < 1024 {
            return Err(problem("http.body_limit", "must be at least 1KiB"));
        }
        if self.store.kind == StoreKind::Clickhouse && self.store.clickhouse_url.is_none() {
            return Err(problem(
                "store.clickhouse_url",
                "required when store.kind = \"clickhouse\" (env OPGRAPH_CLICKHOUSE_URL)",
            ));
        }
        if self.store.group_commit_window > Duration::from_secs(1) {
            return Err(problem("store.group_commit_window", "must be at most 1s"));
        }
        if let Some(key) = &self.auth.bootstrap_key
            && !crate::auth::looks_like_api_key(key) {
                return Err(problem(
                    "auth.bootstrap_key",
                    "must be `og_` followed by at least 20 letters or digits",
                ));
            }
        let jwt = &self.auth.jwt;
        let sources = [jwt.secret.is_some(), jwt.public_key_file.is_some(), jwt.jwks_file.is_some()]
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
            && secret.len() < 32 {
                return Err(problem("auth.jwt.secret", "must be at least 32 bytes for HS256"));
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
    fn bad_env_value_names_the_variable() {
        let err = Config::load(None, |k| (k == "OPGRAPH_STORE").then(|| "duck".into()))
            .unwrap_err();
        assert_eq!(err.key, "OPGRAPH_STORE");
    }

    #[test]
    fn short_bootstrap_key_is_refused() {
        let err = Config::load(None, |k| (k == "OPGRAPH_BOOTSTRAP_KEY").then(|| "og_x".into()))
            .unwrap_err();
        assert_eq!(err.key, "auth.bootstrap_key");
    }

    #[test]
    fn defaults_are_valid() {
        Config::load(None, no_env).unwrap();
    }
}
