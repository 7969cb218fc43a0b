//! The API client under the `opgraph` CLI and its MCP server: one cloud
//! URL (`http://` or `https://`), one credential, JSON in and out.

use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HeaderValue};
use hyper::{Method, Request};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::{self, connect::HttpConnector};
use serde_json::Value;

/// Largest answer read: a listing at the API's maximum `limit` fits.
const MAX_ANSWER: usize = 64 * 1024 * 1024;

/// Where the cloud is and who is calling.
#[derive(Debug, Clone)]
pub struct Target {
    pub url: String,
    /// An API key, or an enterprise token (JWT).
    pub api_key: Option<String>,
    /// `X-Opgraph-Workspace-ID`, which a token naming several workspaces needs.
    pub workspace: Option<String>,
    /// Trust only this CA for an `https://` URL.
    pub ca_file: Option<PathBuf>,
    /// Bound on one call, connection to last byte.
    pub timeout: Duration,
}

/// A call's answer: the status and the JSON body (a string when the body
/// is not JSON, `Null` when empty).
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    pub status: u16,
    pub body: Value,
}

impl Reply {
    /// The body of a 2xx answer, else the API's error as one sentence:
    /// `HTTP 400 validation_failed: ... (field batch[2].event)`.
    pub fn into_result(self) -> Result<Value, String> {
        if (200..300).contains(&self.status) {
            return Ok(self.body);
        }
        let error = &self.body["error"];
        let mut sentence = format!("HTTP {}", self.status);
        if let Some(code) = error["code"].as_str() {
            sentence.push_str(&format!(" {code}"));
        }
        match error["message"].as_str() {
            Some(message) => sentence.push_str(&format!(": {message}")),
            None if !self.body.is_null() => sentence.push_str(&format!(": {}", self.body)),
            None => {}
        }
        if let Some(field) = error["field"].as_str() {
            sentence.push_str(&format!(" (field {field})"));
        }
        Err(sentence)
    }
}

pub struct ApiClient {
    /// The URL without a trailing `/`; API paths are appended to it.
    base: String,
    authorization: Option<HeaderValue>,
    workspace: Option<HeaderValue>,
    timeout: Duration,
    http: legacy::Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
}

impl ApiClient {
    /// Checks the settings; `Err` names the one at fault.
    pub fn new(target: &Target) -> Result<ApiClient, String> {
        let url =
            url::Url::parse(&target.url).map_err(|e| format!("--url {:?}: {e}", target.url))?;
        if !matches!(url.scheme(), "http" | "https") || url.host().is_none() {
            return Err(format!("--url {:?}: must be an http:// or https:// URL", target.url));
        }
        let header = |what: &str, value: String| {
            HeaderValue::from_str(&value)
                .map_err(|_| format!("{what} holds characters a header cannot"))
        };
        let authorization = target
            .api_key
            .as_ref()
            .map(|key| header("--api-key", format!("Bearer {key}")))
            .transpose()?;
        let workspace =
            target.workspace.as_ref().map(|ws| header("--workspace", ws.clone())).transpose()?;
        let tls = crate::tls_client::client_config("--ca-file", target.ca_file.as_deref())?;
        let mut tcp = HttpConnector::new();
        tcp.set_nodelay(true);
        // The TLS wrapper hands `https://` targets to the TCP connector.
        tcp.enforce_http(false);
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(tcp);
        let http = legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build(connector);
        Ok(ApiClient {
            base: target.url.trim_end_matches('/').to_owned(),
            authorization,
            workspace,
            timeout: target.timeout,
            http,
        })
    }

    /// One call of `path` (with its query), `body` sent as JSON; `Err` when
    /// no answer came.
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Reply, String> {
        self.exchange(method, path, body, None).await
    }

    /// [`Self::call`] with an `Idempotency-Key`, so that a retry of it is
    /// answered as the first call was.
    pub async fn call_keyed(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
        key: &str,
    ) -> Result<Reply, String> {
        self.exchange(method, path, body, Some(key)).await
    }

    async fn exchange(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
        idempotency_key: Option<&str>,
    ) -> Result<Reply, String> {
        let mut request = Request::builder().method(method).uri(format!("{}{path}", self.base));
        if let Some(key) = idempotency_key {
            request = request.header("idempotency-key", key);
        }
        if let Some(value) = &self.authorization {
            request = request.header(AUTHORIZATION, value);
        }
        if let Some(value) = &self.workspace {
            request = request.header("x-opgraph-workspace-id", value);
        }
        let payload = match body {
            Some(body) => {
                request = request.header(CONTENT_TYPE, "application/json");
                Bytes::from(serde_json::to_vec(body).map_err(|e| e.to_string())?)
            }
            None => Bytes::new(),
        };
        let request = request.body(Full::new(payload)).map_err(|e| e.to_string())?;
        let exchange = async {
            let response = self.http.request(request).await.map_err(|e| describe(&e))?;
            let status = response.status().as_u16();
            let bytes = Limited::new(response.into_body(), MAX_ANSWER)
                .collect()
                .await
                .map_err(|e| format!("reading the answer: {e}"))?
                .to_bytes();
            let body = if bytes.is_empty() {
                Value::Null
            } else {
                serde_json::from_slice(&bytes)
                    .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()))
            };
            Ok(Reply { status, body })
        };
        tokio::time::timeout(self.timeout, exchange)
            .await
            .map_err(|_| format!("{}: no answer within {:?}", self.base, self.timeout))?
    }
}

/// hyper's client error with its cause (the refused connection, the TLS
/// failure), which its own message leaves out.
fn describe(error: &legacy::Error) -> String {
    let mut sentence = error.to_string();
    let mut cause = std::error::Error::source(error);
    while let Some(inner) = cause {
        sentence.push_str(&format!(": {inner}"));
        cause = inner.source();
    }
    sentence
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use serde_json::json;

    use super::*;

    #[test]
    fn an_error_answer_reads_as_one_sentence() {
        let reply = Reply {
            status: 400,
            body: json!({"error": {"code": "validation_failed", "message": "`event` is required", "field": "batch[2].event"}}),
        };
        assert_eq!(
            reply.into_result().unwrap_err(),
            "HTTP 400 validation_failed: `event` is required (field batch[2].event)"
        );
        let plain = Reply { status: 502, body: Value::String("bad gateway".into()) };
        assert_eq!(plain.into_result().unwrap_err(), "HTTP 502: \"bad gateway\"");
        let ok = Reply { status: 202, body: json!({"accepted": 1}) };
        assert_eq!(ok.into_result().unwrap(), json!({"accepted": 1}));
    }

    #[test]
    fn bad_settings_are_named() {
        let target = |url: &str| Target {
            url: url.into(),
            api_key: None,
            workspace: None,
            ca_file: None,
            timeout: Duration::from_secs(1),
        };
        let err = ApiClient::new(&target("ftp://example.com")).err().unwrap();
        assert!(err.starts_with("--url"), "{err}");
        let err = ApiClient::new(&Target { api_key: Some("a\nb".into()), ..target("http://x") })
            .err()
            .unwrap();
        assert!(err.starts_with("--api-key"), "{err}");
    }
}
