//! The warehouse destinations: each export is one call of the warehouse's
//! own API that appends one row per record, `(export_id, record)`, the
//! record as JSON. BigQuery's `insertAll` (streaming insert), Snowflake's
//! SQL API and the Redshift Data API; each with an overridable `endpoint`,
//! so that it can be pointed at a proxy or a local server.
//!
//! Table names cannot be bound as parameters, so they are checked as
//! plain identifiers; the records always travel as bound values.

use hyper::header::{HeaderName, HeaderValue};
use serde_json::{Map, Value, json};

use super::only_known;
use crate::error::{Error, Result};
use crate::governance::hash::sha256_hex;
use crate::outbound;
use crate::sigv4;

/// A checked warehouse destination.
pub(super) enum Warehouse {
    BigQuery(BigQuery),
    Snowflake(Snowflake),
    Redshift(Redshift),
}

pub(super) struct BigQuery {
    endpoint: String,
    project: String,
    dataset: String,
    table: String,
    auth: GoogleAuth,
}

enum GoogleAuth {
    /// An OAuth 2.0 access token.
    Token(String),
    /// A service account's key: each call is authorized by a JWT it signs
    /// (Google's self-signed JWT access, no token exchange).
    ServiceAccount { email: String, key_id: Option<String>, key: jsonwebtoken::EncodingKey },
}

pub(super) struct Snowflake {
    endpoint: String,
    account: String,
    database: String,
    schema: String,
    table: String,
    warehouse: Option<String>,
    role: Option<String>,
    auth: SnowflakeAuth,
}

enum SnowflakeAuth {
    OAuth(String),
    /// Key-pair authentication: a JWT signed with the user's private key.
    KeyPair {
        user: String,
        fingerprint: String,
        key: jsonwebtoken::EncodingKey,
    },
}

pub(super) struct Redshift {
    endpoint: String,
    /// `ClusterIdentifier` or `WorkgroupName`, and its value.
    target: (&'static str, String),
    database: String,
    table: String,
    db_user: Option<String>,
    secret_arn: Option<String>,
    credentials: sigv4::Credentials,
}

/// One call, ready for [`outbound::send`].
pub(super) struct Call {
    pub url: String,
    pub headers: Vec<(HeaderName, HeaderValue)>,
    pub payload: Vec<u8>,
}

fn text<'a>(config: &'a Map<String, Value>, name: &str) -> Option<&'a str> {
    config.get(name).and_then(Value::as_str).map(str::trim).filter(|s| !s.is_empty())
}

fn required<'a>(config: &'a Map<String, Value>, name: &str) -> Result<&'a str> {
    text(config, name).ok_or_else(|| {
        Error::validation(format!("config.{name}"), format!("`{name}` must be a non-empty string"))
    })
}

/// `endpoint`, else `default`.
fn endpoint(config: &Map<String, Value>, default: String) -> Result<String> {
    Ok(super::endpoint_base(config)?.unwrap_or(default))
}

/// A plain SQL identifier (`a-z A-Z 0-9 _ $`, not starting with a digit),
/// or `parts` of them joined by dots.
fn identifier(config: &Map<String, Value>, name: &str, parts: usize) -> Result<String> {
    let value = required(config, name)?;
    let plain = |part: &str| {
        !part.is_empty()
            && part.len() <= 127
            && !part.starts_with(|c: char| c.is_ascii_digit())
            && part.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$')
    };
    let split: Vec<&str> = value.split('.').collect();
    if split.len() > parts || !split.iter().all(|p| plain(p)) {
        return Err(Error::validation(
            format!("config.{name}"),
            format!("`{name}` must be a plain identifier (letters, digits, `_`, `$`)"),
        ));
    }
    Ok(value.to_owned())
}

/// An RSA private key in PEM, for RS256.
fn rsa_key(config: &Map<String, Value>, name: &str) -> Result<jsonwebtoken::EncodingKey> {
    let pem = required(config, name)?;
    jsonwebtoken::EncodingKey::from_rsa_pem(pem.as_bytes()).map_err(|e| {
        Error::validation(format!("config.{name}"), format!("not an RSA private key in PEM: {e}"))
    })
}

fn header(name: &'static str, value: &str) -> Result<(HeaderName, HeaderValue)> {
    outbound::header(name, value)
}

impl Warehouse {
    /// Checks `config` for `kind` (its required fields are present already).
    pub(super) fn parse(kind: &str, config: &Map<String, Value>) -> Result<Warehouse> {
        match kind {
            "bigquery" => BigQuery::parse(config).map(Warehouse::BigQuery),
            "snowflake" => Snowflake::parse(config).map(Warehouse::Snowflake),
            _ => Redshift::parse(config).map(Warehouse::Redshift),
        }
    }

    /// The call that appends `records` as export `id`.
    pub(super) fn call(&self, id: &str, records: &[Value], now_ms: i64) -> Result<Call> {
        match self {
            Warehouse::BigQuery(w) => w.call(id, records, now_ms),
            Warehouse::Snowflake(w) => w.call(id, records, now_ms),
            Warehouse::Redshift(w) => w.call(id, records, now_ms),
        }
    }

    /// Reads a 2xx answer: the id the warehouse gave the call, and why it
    /// failed all the same (BigQuery answers 200 with the rows it refused).
    pub(super) fn read_answer(&self, body: &[u8]) -> (Option<String>, Option<String>) {
        let answer: Value = serde_json::from_slice(body).unwrap_or_default();
        let id = |key: &str| answer[key].as_str().map(|s| s.chars().take(200).collect());
        match self {
            Warehouse::BigQuery(_) => {
                let refused = answer["insertErrors"].as_array().map_or(0, Vec::len);
                let first: String =
                    answer["insertErrors"][0].to_string().chars().take(200).collect();
                (
                    None,
                    (refused > 0)
                        .then(|| format!("BigQuery refused {refused} rows, the first: {first}")),
                )
            }
            Warehouse::Snowflake(_) => (id("statementHandle"), None),
            Warehouse::Redshift(_) => (id("Id"), None),
        }
    }
}

/// The records as JSON texts.
fn texts(records: &[Value]) -> Vec<String> {
    records.iter().map(Value::to_string).collect()
}

/// A JWT signed with `key` (RS256).
fn signed_jwt(
    key: &jsonwebtoken::EncodingKey,
    key_id: Option<&str>,
    claims: &Value,
) -> Result<String> {
    let mut head = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::RS256);
    head.kid = key_id.map(str::to_owned);
    jsonwebtoken::encode(&head, claims, key).map_err(Error::internal)
}

impl BigQuery {
    fn parse(config: &Map<String, Value>) -> Result<BigQuery> {
        only_known(
            config,
            "bigquery",
            &[
                "projectId",
                "datasetId",
                "tableId",
                "accessToken",
                "clientEmail",
                "privateKey",
                "privateKeyId",
                "endpoint",
            ],
        )?;
        let auth = match (text(config, "accessToken"), text(config, "clientEmail")) {
            (Some(token), None) => {
                header("authorization", &format!("Bearer {token}")).map_err(|_| {
                    Error::validation("config.accessToken", "must be printable ASCII")
                })?;
                GoogleAuth::Token(token.to_owned())
            }
            (None, Some(email)) => GoogleAuth::ServiceAccount {
                email: email.to_owned(),
                key_id: text(config, "privateKeyId").map(str::to_owned),
                key: rsa_key(config, "privateKey")?,
            },
            _ => {
                return Err(Error::validation(
                    "config.accessToken",
                    "the bigquery destination needs `accessToken`, or `clientEmail` and `privateKey` of a service account, not both",
                ));
            }
        };
        Ok(BigQuery {
            endpoint: endpoint(config, "https://bigquery.googleapis.com".to_owned())?,
            project: identifier_like(config, "projectId")?,
            dataset: identifier(config, "datasetId", 1)?,
            table: identifier(config, "tableId", 1)?,
            auth,
        })
    }

    fn call(&self, id: &str, records: &[Value], now_ms: i64) -> Result<Call> {
        let url = format!(
            "{}/bigquery/v2/projects/{}/datasets/{}/tables/{}/insertAll",
            self.endpoint, self.project, self.dataset, self.table
        );
        // insertId lets BigQuery drop a row sent twice (best effort, about
        // a minute): a retried export does not double its rows.
        let rows: Vec<Value> = texts(records)
            .into_iter()
            .enumerate()
            .map(|(i, record)| json!({"insertId": format!("{id}:{i}"), "json": {"export_id": id, "record": record}}))
            .collect();
        let body = json!({"kind": "bigquery#tableDataInsertAllRequest", "rows": rows});
        let token = match &self.auth {
            GoogleAuth::Token(token) => token.clone(),
            GoogleAuth::ServiceAccount { email, key_id, key } => {
                let now = now_ms / 1000;
                let claims = json!({"iss": email, "sub": email,
                    "aud": "https://bigquery.googleapis.com/", "iat": now, "exp": now + 3600});
                signed_jwt(key, key_id.as_deref(), &claims)?
            }
        };
        Ok(Call {
            url,
            headers: vec![header("authorization", &format!("Bearer {token}"))?],
            payload: serde_json::to_vec(&body).map_err(Error::internal)?,
        })
    }
}

/// A project id: lower-case letters, digits and hyphens (and a domain
/// prefix with `:` for old projects); it goes into the URL path as is.
fn identifier_like(config: &Map<String, Value>, name: &str) -> Result<String> {
    let value = required(config, name)?;
    if value.len() > 128
        || !value.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | ':' | '_'))
    {
        return Err(Error::validation(
            format!("config.{name}"),
            format!("`{name}` must be letters, digits, `-`, `.`, `:` and `_`"),
        ));
    }
    Ok(value.to_owned())
}

impl Snowflake {
    fn parse(config: &Map<String, Value>) -> Result<Snowflake> {
        only_known(
            config,
            "snowflake",
            &[
                "account",
                "database",
                "schema",
                "table",
                "warehouse",
                "role",
                "token",
                "user",
                "privateKey",
                "publicKeyFingerprint",
                "endpoint",
            ],
        )?;
        let account = identifier_like(config, "account")?;
        let auth = match (text(config, "token"), text(config, "user")) {
            (Some(token), None) => {
                header("authorization", &format!("Bearer {token}"))
                    .map_err(|_| Error::validation("config.token", "must be printable ASCII"))?;
                SnowflakeAuth::OAuth(token.to_owned())
            }
            (None, Some(user)) => {
                let fingerprint = required(config, "publicKeyFingerprint")?;
                if !fingerprint.starts_with("SHA256:") {
                    return Err(Error::validation(
                        "config.publicKeyFingerprint",
                        "the fingerprint Snowflake shows as RSA_PUBLIC_KEY_FP: `SHA256:...`",
                    ));
                }
                SnowflakeAuth::KeyPair {
                    user: user.to_ascii_uppercase(),
                    fingerprint: fingerprint.to_owned(),
                    key: rsa_key(config, "privateKey")?,
                }
            }
            _ => {
                return Err(Error::validation(
                    "config.token",
                    "the snowflake destination needs `token` (OAuth), or `user`, `privateKey` and `publicKeyFingerprint` (key pair), not both",
                ));
            }
        };
        let default = format!("https://{}.snowflakecomputing.com", account.to_ascii_lowercase());
        Ok(Snowflake {
            endpoint: endpoint(config, default)?,
            account,
            database: identifier(config, "database", 1)?,
            schema: identifier(config, "schema", 1)?,
            table: identifier(config, "table", 1)?,
            warehouse: text(config, "warehouse")
                .map(|_| identifier(config, "warehouse", 1))
                .transpose()?,
            role: text(config, "role").map(|_| identifier(config, "role", 1)).transpose()?,
            auth,
        })
    }

    fn call(&self, id: &str, records: &[Value], now_ms: i64) -> Result<Call> {
        let placeholders = vec!["(?, ?)"; records.len()].join(", ");
        let statement = format!(
            "INSERT INTO {}.{}.{} (export_id, record) SELECT column1, PARSE_JSON(column2) FROM VALUES {placeholders}",
            self.database, self.schema, self.table
        );
        let mut bindings = Map::new();
        for (i, record) in texts(records).into_iter().enumerate() {
            bindings.insert((2 * i + 1).to_string(), json!({"type": "TEXT", "value": id}));
            bindings.insert((2 * i + 2).to_string(), json!({"type": "TEXT", "value": record}));
        }
        let mut body = json!({"statement": statement, "bindings": bindings, "timeout": 60,
            "database": self.database, "schema": self.schema});
        if let Some(warehouse) = &self.warehouse {
            body["warehouse"] = json!(warehouse);
        }
        if let Some(role) = &self.role {
            body["role"] = json!(role);
        }
        let (token, kind) = match &self.auth {
            SnowflakeAuth::OAuth(token) => (token.clone(), "OAUTH"),
            SnowflakeAuth::KeyPair { user, fingerprint, key } => {
                // The account locator alone, upper-case, as Snowflake names it.
                let account =
                    self.account.split('.').next().unwrap_or_default().to_ascii_uppercase();
                let now = now_ms / 1000;
                let claims = json!({"iss": format!("{account}.{user}.{fingerprint}"),
                    "sub": format!("{account}.{user}"), "iat": now, "exp": now + 3600});
                (signed_jwt(key, None, &claims)?, "KEYPAIR_JWT")
            }
        };
        // The same request id on a retry of this export: Snowflake runs a
        // statement once per request id.
        Ok(Call {
            url: format!("{}/api/v2/statements?requestId={}", self.endpoint, uuid_of(id)),
            headers: vec![
                header("authorization", &format!("Bearer {token}"))?,
                header("x-snowflake-authorization-token-type", kind)?,
                header("accept", "application/json")?,
            ],
            payload: serde_json::to_vec(&body).map_err(Error::internal)?,
        })
    }
}

/// A UUID-shaped id derived from `id`, for APIs that want one.
fn uuid_of(id: &str) -> String {
    let hex = sha256_hex(id.as_bytes());
    format!("{}-{}-{}-{}-{}", &hex[..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..32])
}

impl Redshift {
    fn parse(config: &Map<String, Value>) -> Result<Redshift> {
        only_known(
            config,
            "redshift",
            &[
                "clusterId",
                "workgroup",
                "database",
                "table",
                "region",
                "dbUser",
                "secretArn",
                "accessKeyId",
                "secretAccessKey",
                "sessionToken",
                "endpoint",
            ],
        )?;
        let target = match (text(config, "clusterId"), text(config, "workgroup")) {
            (Some(cluster), None) => ("ClusterIdentifier", cluster.to_owned()),
            (None, Some(workgroup)) => ("WorkgroupName", workgroup.to_owned()),
            _ => {
                return Err(Error::validation(
                    "config.clusterId",
                    "the redshift destination needs `clusterId` (provisioned) or `workgroup` (serverless), not both",
                ));
            }
        };
        let region = identifier_like(config, "region")?;
        let key_id = required(config, "accessKeyId")?;
        let session_token = text(config, "sessionToken").map(str::to_owned);
        for (name, value) in
            [("accessKeyId", Some(key_id)), ("sessionToken", session_token.as_deref())]
        {
            if value.is_some_and(|v| HeaderValue::from_str(v).is_err()) {
                return Err(Error::validation(format!("config.{name}"), "must be printable ASCII"));
            }
        }
        Ok(Redshift {
            endpoint: endpoint(config, format!("https://redshift-data.{region}.amazonaws.com"))?,
            target,
            database: required(config, "database")?.to_owned(),
            table: identifier(config, "table", 3)?,
            db_user: text(config, "dbUser").map(str::to_owned),
            secret_arn: text(config, "secretArn").map(str::to_owned),
            credentials: sigv4::Credentials {
                access_key_id: key_id.to_owned(),
                secret_access_key: required(config, "secretAccessKey")?.to_owned(),
                session_token,
                region,
            },
        })
    }

    fn call(&self, id: &str, records: &[Value], now_ms: i64) -> Result<Call> {
        let rows: Vec<String> =
            (0..records.len()).map(|i| format!("(:export_id, JSON_PARSE(:r{i}))")).collect();
        let sql =
            format!("INSERT INTO {} (export_id, record) VALUES {}", self.table, rows.join(", "));
        let mut parameters = vec![json!({"name": "export_id", "value": id})];
        for (i, record) in texts(records).into_iter().enumerate() {
            parameters.push(json!({"name": format!("r{i}"), "value": record}));
        }
        let mut body = json!({
            self.target.0: self.target.1, "Database": self.database, "Sql": sql,
            "Parameters": parameters, "StatementName": format!("opgraph {id}"),
            // Redshift runs a statement once per client token.
            "ClientToken": id,
        });
        if let Some(user) = &self.db_user {
            body["DbUser"] = json!(user);
        }
        if let Some(arn) = &self.secret_arn {
            body["SecretArn"] = json!(arn);
        }
        let payload = serde_json::to_vec(&body).map_err(Error::internal)?;
        let url = format!("{}/", self.endpoint);
        let parsed = url::Url::parse(&url).map_err(Error::internal)?;
        let extra = [("x-amz-target", "RedshiftData.ExecuteStatement".to_owned())];
        let request = sigv4::Request {
            service: "redshift-data",
            method: "POST",
            host: &outbound::authority(&parsed),
            path: "/",
            content_type: "application/x-amz-json-1.1",
            extra: &extra,
        };
        let headers = sigv4::sign(&self.credentials, &request, &payload, now_ms)
            .iter()
            .map(|(name, value)| header(name, value))
            .collect::<Result<Vec<_>>>()?;
        Ok(Call { url, headers, payload })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn config(value: Value) -> Map<String, Value> {
        value.as_object().unwrap().clone()
    }

    #[test]
    fn table_names_are_plain_identifiers() {
        let base = json!({"database": "d", "table": "t; DROP TABLE x", "region": "us-east-1",
            "clusterId": "c", "accessKeyId": "AK", "secretAccessKey": "s"});
        let Err(err) = Redshift::parse(&config(base.clone())) else { panic!("accepted") };
        assert!(err.to_string().contains("table"), "{err}");
        let mut ok = base;
        ok["table"] = json!("public.exports");
        assert!(Redshift::parse(&config(ok)).is_ok());
    }

    #[test]
    fn each_warehouse_needs_exactly_one_way_to_authenticate() {
        let both = json!({"projectId": "p", "datasetId": "d", "tableId": "t",
            "accessToken": "x", "clientEmail": "a@b"});
        assert!(BigQuery::parse(&config(both)).is_err());
        let none = json!({"account": "xy12345", "database": "d", "schema": "s", "table": "t"});
        assert!(Snowflake::parse(&config(none)).is_err());
        let bad_key = json!({"account": "xy12345", "database": "d", "schema": "s", "table": "t",
            "user": "u", "privateKey": "not a key", "publicKeyFingerprint": "SHA256:abc"});
        let Err(err) = Snowflake::parse(&config(bad_key)) else { panic!("accepted") };
        assert!(err.to_string().contains("RSA private key"), "{err}");
    }

    #[test]
    fn records_travel_as_bound_values() {
        let snowflake = Snowflake::parse(&config(json!({"account": "xy12345.eu-west-1",
            "database": "d", "schema": "s", "table": "t", "token": "tok"})))
        .unwrap();
        let records = [json!({"event": "a'); DROP TABLE t; --"}), json!({"event": "b"})];
        let call = snowflake.call("exp_1", &records, 0).unwrap();
        assert!(call.url.starts_with(
            "https://xy12345.eu-west-1.snowflakecomputing.com/api/v2/statements?requestId="
        ));
        let body: Value = serde_json::from_slice(&call.payload).unwrap();
        assert_eq!(
            body["statement"],
            "INSERT INTO d.s.t (export_id, record) SELECT column1, PARSE_JSON(column2) FROM VALUES (?, ?), (?, ?)"
        );
        assert_eq!(body["bindings"]["2"]["value"], records[0].to_string());
        assert_eq!(body["bindings"]["3"]["value"], "exp_1");
        assert_eq!(uuid_of("exp_1").len(), 36);
    }
}
