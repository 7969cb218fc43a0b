//! The gateway's configuration: a TOML file (`--config`), then a few
//! `OPGRAPH_GATEWAY_*` environment variables on top (secrets belong
//! there), validated once at load.
//!
//! Unknown keys are refused; every problem is reported with its key path
//! (`uplink.batch_max_events: ...`), all of them at once where the file
//! parsed. Each component's table lives beside it: [`BufferConfig`] in
//! `buffer.rs`, [`UplinkConfig`] in `uplink.rs`.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use bytesize::ByteSize;
use serde::Deserialize;

use crate::buffer::BufferConfig;
use crate::error::{Error, Result};
use crate::source::SourcesConfig;
use crate::uplink::{Secret, UplinkConfig};

/// Everything `opgraph-gateway` can be told.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// This gateway's identity towards the cloud; its sequence numbers are
    /// per gateway id. Required; a new buffer under an old id is told apart
    /// by the buffer's instance id (see docs/delivery.md). Env
    /// `OPGRAPH_GATEWAY_ID`.
    pub gateway_id: String,
    /// How long SIGTERM keeps delivering before exiting. Default `5s`;
    /// what is not delivered by then stays in the buffer for the next
    /// start. At most `10min`.
    #[serde(with = "humantime_serde")]
    pub shutdown_flush: Duration,
    pub http: HttpConfig,
    pub buffer: BufferConfig,
    pub uplink: UplinkConfig,
    /// Device sources and the embedded MQTT broker (`[sources]`,
    /// `source.rs`). Default: none.
    pub sources: SourcesConfig,
}

/// The local HTTP port: health, metrics, local ingest.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpConfig {
    /// Address of `/health`, `/metrics` and `POST /ingest`. Default
    /// `127.0.0.1:9100`; port 0 picks a free port, printed as `listening
    /// http=...`. Env `OPGRAPH_GATEWAY_HTTP_ADDR`.
    pub addr: SocketAddr,
    /// SHA-256 digests (hex) of the bearer tokens `POST /ingest` accepts
    /// (`printf %s "$TOKEN" | sha256sum`): digests, so that the file holds
    /// nothing to post with. Empty, the default, takes every request: fit
    /// for a port on loopback only, and warned about at startup otherwise.
    /// At most 1000.
    pub ingest_token_sha256: Vec<String>,
    /// Largest ingest body; larger ones get 413. Default `1MiB`; `1KiB` to
    /// `256MiB`.
    pub body_limit: ByteSize,
    /// Most ingest bodies parsed into events at once; later requests wait
    /// holding only their body. Parsing is CPU work, so more than the cores
    /// gains nothing, and the events take several times the body's size:
    /// with `max_connections` (which bounds the bodies held) this bounds
    /// the gateway's memory however many producers post at once. Default 4.
    pub ingest_concurrency: usize,
    /// Connections served at once; more wait to be accepted. Default 1024;
    /// 1 to 1000000.
    pub max_connections: usize,
    /// Longest wait for a request's head, also on an idle kept-alive
    /// connection. Default `30s`; `100ms` to `1h`.
    #[serde(with = "humantime_serde")]
    pub header_timeout: Duration,
    /// Longest pause within a request body; a body that stalls longer is
    /// refused. Default `30s`; `100ms` to `1h`.
    #[serde(with = "humantime_serde")]
    pub body_timeout: Duration,
}

impl HttpConfig {
    /// What the local port allows each client.
    pub fn limits(&self) -> opgraph_proto::serve::ServeLimits {
        opgraph_proto::serve::ServeLimits {
            max_connections: self.max_connections,
            header_timeout: self.header_timeout,
            body_timeout: self.body_timeout,
        }
    }
}

impl Default for HttpConfig {
    fn default() -> Self {
        let defaults = opgraph_proto::serve::ServeLimits::default();
        HttpConfig {
            addr: SocketAddr::from(([127, 0, 0, 1], 9100)),
            ingest_token_sha256: Vec::new(),
            body_limit: ByteSize::mib(1),
            ingest_concurrency: 4,
            max_connections: defaults.max_connections,
            header_timeout: defaults.header_timeout,
            body_timeout: defaults.body_timeout,
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            gateway_id: String::new(),
            shutdown_flush: Duration::from_secs(5),
            http: HttpConfig::default(),
            buffer: BufferConfig::default(),
            uplink: UplinkConfig::default(),
            sources: SourcesConfig::default(),
        }
    }
}

/// Largest `http.body_limit`: a body is held whole and parsed into events
/// several times its size, `ingest_concurrency` at once.
pub const MAX_BODY_LIMIT: u64 = 256 * 1024 * 1024;

/// Most `http.ingest_token_sha256` entries: each request is checked
/// against every one.
pub const MAX_INGEST_TOKENS: usize = 1000;

/// Longest gateway id (the cloud's limit).
pub const MAX_GATEWAY_ID_LEN: usize = 200;

fn invalid(problems: Vec<String>) -> Error {
    Error::InvalidConfig { problems }
}

impl Config {
    /// Reads `file`, applies the environment (`env` looks a variable up),
    /// validates.
    pub fn load(file: &Path, env: impl Fn(&str) -> Option<String>) -> Result<Config> {
        let text = std::fs::read_to_string(file)
            .map_err(|e| invalid(vec![format!("{}: {e}", file.display())]))?;
        let mut config = Self::parse(&text)?;
        config.apply_env(env)?;
        config.validate()?;
        Ok(config)
    }

    /// Parses TOML, naming the key path of the first problem.
    pub fn parse(text: &str) -> Result<Config> {
        let deserializer = toml::Deserializer::parse(text).map_err(|e| {
            let line = e.span().map(|s| text[..s.start.min(text.len())].lines().count().max(1));
            let at = line.map(|l| format!(" (line {l})")).unwrap_or_default();
            invalid(vec![format!("(file){at}: {}", e.message().trim())])
        })?;
        serde_path_to_error::deserialize(deserializer).map_err(|e| {
            let key = e.path().to_string();
            invalid(vec![format!("{key}: {}", e.into_inner().message().trim())])
        })
    }

    /// Environment overrides.
    pub fn apply_env(&mut self, env: impl Fn(&str) -> Option<String>) -> Result<()> {
        if let Some(v) = env("OPGRAPH_GATEWAY_API_KEY") {
            self.uplink.api_key = Secret(v.trim().to_owned());
        }
        if let Some(v) = env("OPGRAPH_GATEWAY_ID") {
            self.gateway_id = v.trim().to_owned();
        }
        if let Some(v) = env("OPGRAPH_GATEWAY_UPLINK_ENDPOINT") {
            self.uplink.endpoint = v.trim().to_owned();
        }
        self.sources.apply_env(&env);
        if let Some(v) = env("OPGRAPH_GATEWAY_HTTP_ADDR") {
            self.http.addr = v
                .trim()
                .parse()
                .map_err(|e| invalid(vec![format!("OPGRAPH_GATEWAY_HTTP_ADDR: {e}: {v:?}")]))?;
        }
        Ok(())
    }

    /// Checks everything and reports every problem with its key path.
    pub fn validate(&self) -> Result<()> {
        let mut problems = Vec::new();
        let id = &self.gateway_id;
        if id.trim().is_empty() {
            problems.push("gateway_id: required (env OPGRAPH_GATEWAY_ID)".to_owned());
        } else if id.len() > MAX_GATEWAY_ID_LEN || id.chars().any(char::is_control) {
            problems.push(format!(
                "gateway_id: must be 1 to {MAX_GATEWAY_ID_LEN} bytes without control characters"
            ));
        }
        if self.shutdown_flush > Duration::from_secs(600) {
            problems.push("shutdown_flush: must be at most 10min".to_owned());
        }
        if !(1024..=MAX_BODY_LIMIT).contains(&self.http.body_limit.as_u64()) {
            problems.push("http.body_limit: must be 1KiB to 256MiB".to_owned());
        }
        let limits = opgraph_proto::serve::problems(&self.http.limits());
        problems.extend(limits.into_iter().map(|(key, why)| format!("http.{key}: {why}")));
        if self.http.ingest_token_sha256.len() > MAX_INGEST_TOKENS {
            problems.push(format!("http.ingest_token_sha256: at most {MAX_INGEST_TOKENS}"));
        }
        for (i, digest) in self.http.ingest_token_sha256.iter().enumerate() {
            if digest.len() != 64 || !digest.bytes().all(|b| b.is_ascii_hexdigit()) {
                problems.push(format!(
                    "http.ingest_token_sha256[{i}]: must be 64 hex digits, the SHA-256 of a \
                     token (printf %s \"$TOKEN\" | sha256sum), not the token"
                ));
            }
        }
        if !(1..=1024).contains(&self.http.ingest_concurrency) {
            problems.push("http.ingest_concurrency: must be 1 to 1024".to_owned());
        }
        if let Err(Error::InvalidConfig { problems: buffer }) = self.buffer.validate() {
            problems.extend(buffer.into_iter().map(|p| format!("buffer.{p}")));
        }
        problems.extend(self.uplink.problems().into_iter().map(|p| format!("uplink.{p}")));
        problems.extend(self.sources.problems().into_iter().map(|p| format!("sources.{p}")));
        if problems.is_empty() { Ok(()) } else { Err(invalid(problems)) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::uplink::Transport;

    fn problems(result: Result<impl std::fmt::Debug>) -> Vec<String> {
        match result {
            Err(Error::InvalidConfig { problems }) => problems,
            other => panic!("expected InvalidConfig, got {other:?}"),
        }
    }

    const MINIMAL: &str = r#"
        gateway_id = "site-1"
        [uplink]
        endpoint = "127.0.0.1:50051"
        api_key = "og_abcdefghijklmnopqrstuvwxyz"
    "#;

    #[test]
    fn minimal_file_gets_the_defaults() {
        let config = Config::parse(MINIMAL).unwrap();
        config.validate().unwrap();
        assert_eq!(config.uplink.transport, Transport::Grpc);
        assert_eq!(config.uplink.batch_max_events, 5000);
        assert_eq!(config.uplink.batch_max_bytes, ByteSize::kib(256));
        assert_eq!(config.uplink.congestion, crate::uplink::Congestion::LossTolerant);
        assert_eq!(config.shutdown_flush, Duration::from_secs(5));
        assert_eq!(config.http.addr.port(), 9100);
    }

    #[test]
    fn unknown_keys_are_reported_with_their_path() {
        let text = format!("{MINIMAL}\nbatch_max_event = 5\n");
        let problems = problems(Config::parse(&text));
        assert!(problems[0].starts_with("uplink.batch_max_event:"), "{problems:?}");
        let problems = problems_of("[buffer]\nfsink = \"always\"\n");
        assert!(problems[0].starts_with("buffer.fsink:"), "{problems:?}");
    }

    fn problems_of(text: &str) -> Vec<String> {
        problems(Config::parse(text))
    }

    #[test]
    fn bad_values_are_reported_with_their_path() {
        let problems = problems_of("[uplink]\nbatch_linger = \"soon\"\n");
        assert!(problems[0].starts_with("uplink.batch_linger:"), "{problems:?}");
        let problems = problems_of("[uplink]\ntransport = \"carrier-pigeon\"\n");
        assert!(problems[0].starts_with("uplink.transport:"), "{problems:?}");
        let problems = problems_of("[uplink]\ncongestion = \"bbr\"\n");
        assert!(problems[0].starts_with("uplink.congestion:"), "{problems:?}");
        let config = Config::parse("[uplink]\ncongestion = \"cubic\"\n").unwrap();
        assert_eq!(config.uplink.congestion, crate::uplink::Congestion::Cubic);
        let problems = problems_of("[buffer]\nmax_bytes = -1\n");
        assert!(problems[0].starts_with("buffer.max_bytes:"), "{problems:?}");
        let problems = problems_of("gateway_id = [\n");
        assert!(problems[0].starts_with("(file) (line 1):"), "{problems:?}");
    }

    #[test]
    fn validation_reports_every_problem_at_once() {
        let config = Config::parse(
            r#"
            [uplink]
            batch_max_events = 0
            max_in_flight = 1000
            client_cert_file = "/etc/cert.pem"
            [buffer]
            segment_bytes = "10B"
            [http]
            ingest_concurrency = 0
            "#,
        )
        .unwrap();
        let problems = problems(config.validate());
        let keys: Vec<&str> =
            problems.iter().map(|p| p.split(':').next().unwrap_or_default()).collect();
        assert_eq!(
            keys,
            [
                "gateway_id",
                "http.ingest_concurrency",
                "buffer.segment_bytes",
                "uplink.endpoint",
                "uplink.api_key",
                "uplink.client_cert_file",
                "uplink.batch_max_events",
                "uplink.max_in_flight",
            ],
            "{problems:?}"
        );
    }

    #[test]
    fn environment_overrides_the_file_and_names_bad_variables() {
        let mut config = Config::parse("gateway_id = \"a\"\n").unwrap();
        config
            .apply_env(|k| match k {
                "OPGRAPH_GATEWAY_API_KEY" => Some("og_fromenv0123456789abcdef".into()),
                "OPGRAPH_GATEWAY_UPLINK_ENDPOINT" => Some("localhost:1".into()),
                "OPGRAPH_GATEWAY_ID" => Some("b".into()),
                _ => None,
            })
            .unwrap();
        config.validate().unwrap();
        assert_eq!(config.gateway_id, "b");
        assert_eq!(config.uplink.api_key.0, "og_fromenv0123456789abcdef");
        let err = config
            .apply_env(|k| (k == "OPGRAPH_GATEWAY_HTTP_ADDR").then(|| "nowhere".into()))
            .unwrap_err();
        assert!(err.to_string().contains("OPGRAPH_GATEWAY_HTTP_ADDR"), "{err}");
    }

    #[test]
    fn the_example_config_parses_and_validates() {
        let text = include_str!("../../deploy/gateway.example.toml");
        let mut config = Config::parse(text).unwrap();
        config
            .apply_env(|k| {
                (k == "OPGRAPH_GATEWAY_API_KEY").then(|| "og_example0123456789abcdef".into())
            })
            .unwrap();
        config.validate().unwrap();
        assert_eq!(config.uplink.max_in_flight, UplinkConfig::default().max_in_flight);
        assert_eq!(config.sources.mqtt[0].name, "rfid");
        assert_eq!(config.sources.mqtt[0].rules.len(), 2);
        assert!(config.sources.mqtt_broker.is_some());
    }

    /// Whatever a key of the example is set to (the edges of each TOML
    /// type), reading the file answers with a config or its problems,
    /// never a panic.
    #[test]
    fn no_value_makes_reading_the_config_panic() {
        let text = include_str!("../../deploy/gateway.example.toml");
        let edges = [
            "-1",
            "0",
            "18446744073709551615",
            "-9223372036854775808",
            "1e300",
            "nan",
            "inf",
            "true",
            "\"\"",
            "\"18446744073709551615s\"",
            "\"5000000000y\"",
            "\"16EiB\"",
            "\"-1MiB\"",
            "\"\\u0000\"",
            "[]",
            "{}",
            "[[1]]",
            "{ a = { b = 1 } }",
        ];
        let env = |k: &str| (k == "OPGRAPH_GATEWAY_API_KEY").then(|| "og_e0123456789abcdef".into());
        let lines: Vec<&str> = text.lines().collect();
        let mut tried = 0;
        for (n, line) in lines.iter().enumerate() {
            let Some((key, _)) = line.split_once(" = ").filter(|_| !line.starts_with('#')) else {
                continue;
            };
            for edge in edges {
                let mut changed = lines.clone();
                let replaced = format!("{key} = {edge}");
                changed[n] = &replaced;
                let changed = changed.join("\n");
                let read = std::panic::catch_unwind(|| {
                    let mut config = Config::parse(&changed)?;
                    config.apply_env(env)?;
                    config.validate()
                });
                assert!(read.is_ok(), "line {}: {key} = {edge} panicked", n + 1);
                tried += 1;
            }
        }
        assert!(tried > 1000, "only {tried} variants");
    }

    #[test]
    fn sources_are_checked_with_their_key_paths() {
        let text = format!(
            "{MINIMAL}\n[[sources.mqtt]]\nname = \"a\"\nbroker = \"embedded\"\nqos = 2\n\
             [[sources.mqtt.rules]]\ntopic = \"t/{{x}}\"\nevent = \"e\"\nactor = \"{{y}}\"\n\
             [[sources.mqtt]]\nname = \"a\"\nbroker = \"tcp://x\"\n"
        );
        let problems = problems(Config::parse(&text).unwrap().validate());
        let keys: Vec<&str> =
            problems.iter().map(|p| p.split(':').next().unwrap_or_default()).collect();
        assert_eq!(
            keys,
            [
                "sources.mqtt[0].qos",
                "sources.mqtt[0].rules[0].actor",
                "sources.mqtt[0].broker",
                "sources.mqtt[1].broker",
                "sources.mqtt[1].rules",
                "sources.mqtt[1].name",
            ],
            "{problems:?}"
        );
        let problems = problems_of("[[sources.mqtt]]\nname = \"a\"\nbrokr = \"x\"\n");
        assert!(problems[0].starts_with("sources.mqtt[0].brokr:"), "{problems:?}");
        let problems = problems_of(
            "[[sources.mqtt]]\nname = \"a\"\n[[sources.mqtt.rules]]\ntopic = \"t\"\nevnt = \"e\"\n",
        );
        assert!(problems[0].starts_with("sources.mqtt[0].rules[0].evnt:"), "{problems:?}");
        let problems = problems_of("[[sources.mqtt]]\nprotocol = \"4\"\n");
        assert!(problems[0].starts_with("sources.mqtt[0].protocol:"), "{problems:?}");
        let problems = problems_of("[sources.mqtt_broker]\nlisten = \"nowhere\"\n");
        assert!(problems[0].starts_with("sources.mqtt_broker.listen:"), "{problems:?}");
    }

    #[test]
    fn ingest_tokens_are_digests_not_tokens() {
        let digest = "BA7816BF8F01CFEA414140DE5DAE2223B00361A396177A9CB410FF61F20015AD";
        let text = format!("{MINIMAL}\n[http]\ningest_token_sha256 = [\"{digest}\", \"s3cret\"]\n");
        let problems = problems(Config::parse(&text).unwrap().validate());
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems[0].starts_with("http.ingest_token_sha256[1]: must be 64 hex"),
            "{problems:?}"
        );
    }
}
