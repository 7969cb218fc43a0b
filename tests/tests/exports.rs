//! Destination exports against the real binary: recent events and supplied
//! records pushed to a local HTTPS endpoint, signed, with an export receipt
//! for every push (201 when it succeeded, 502 when the destination
//! failed), listed by `GET /api/exports/receipts`; and the requests that
//! must be refused before anything is sent.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::process::{Command, Stdio};

use opgraph_tests::backends::Backend;
use opgraph_tests::https_endpoint::{header, openssl_hmac};
use opgraph_tests::{Cloud, both_backends, client, https_endpoint};
use reqwest::{Client, Method, StatusCode};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

const SECRET: &str = "whsec-test-0123456789";

async fn post(
    client: &Client,
    cloud: &Cloud,
    key: &str,
    path: &str,
    body: &Value,
) -> (StatusCode, Value) {
    cloud.call(client, key, Method::POST, path, Some(body)).await
}

async fn get(client: &Client, cloud: &Cloud, key: &str, path: &str) -> (StatusCode, Value) {
    cloud.call(client, key, Method::GET, path, None).await
}

async fn https_destination_pushes_and_records_receipts(backend: Backend) {
    let endpoint = https_endpoint::start(vec![200, 500]).await;
    let cloud = backend
        .start(&[
            ("OPGRAPH_EXPORT_CA_FILE", endpoint.ca_file.display().to_string()),
            ("OPGRAPH_EXPORT_ALLOW_PRIVATE_NETWORKS", "true".to_owned()),
            ("OPGRAPH_EXPORT_TIMEOUT", "5s".to_owned()),
        ])
        .await
        .unwrap();
    let (client, key) = (client(), cloud.key.clone());
    for n in 0..3 {
        let event =
            json!({"event": "pallet.scanned", "actor": "dock-3", "object": format!("sscc:{n}")});
        let (status, answer) = post(&client, &cloud, &key, "/api/ingest", &event).await;
        assert!(status.is_success(), "{answer}");
    }
    let config = json!({"url": endpoint.url, "secret": SECRET, "headers": {"Authorization": "Bearer dest-token"}});

    // Recent events: signed, counted, hashed, receipted.
    let body = json!({"destination": "https", "config": config, "limit": 2});
    let (status, pushed) = post(&client, &cloud, &key, "/api/exports/destinations", &body).await;
    assert_eq!(status, StatusCode::CREATED, "{pushed}");
    let receipt = pushed["exportReceipt"].clone();
    assert_eq!(receipt["status"], "succeeded", "{receipt}");
    assert_eq!(receipt["responseStatus"], 200);
    assert_eq!(receipt["externalId"], "ext-0");
    assert_eq!(receipt["recordCount"], 2);
    assert!(receipt["id"].as_str().unwrap().starts_with("exp_"));
    assert_eq!(
        receipt["destination"],
        endpoint.url.split('?').next().unwrap(),
        "no query, no secret"
    );
    let (_, newest) = get(&client, &cloud, &key, "/api/events?limit=2").await;
    {
        let received = endpoint.received.lock().unwrap();
        let (head, bytes) = &received[0];
        let hash: String = Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(receipt["payloadHash"], hash.as_str(), "hash of the exact bytes sent");
        let timestamp = header(head, "x-opgraph-timestamp").expect("timestamp header");
        let signed = [timestamp.as_bytes(), b".", bytes].concat();
        let signature = format!("sha256={}", openssl_hmac(SECRET, &signed));
        assert_eq!(header(head, "x-opgraph-signature"), Some(signature.as_str()), "{head}");
        assert_eq!(header(head, "authorization"), Some("Bearer dest-token"));
        assert_eq!(header(head, "idempotency-key"), receipt["id"].as_str());
        assert_eq!(header(head, "x-opgraph-request-id"), receipt["requestId"].as_str());
        let packet: Value = serde_json::from_slice(bytes).unwrap();
        assert_eq!(packet["source"], "events");
        assert_eq!(packet["recordCount"], 2);
        assert_eq!(
            packet["records"], newest["events"],
            "the two newest events, as the API lists them"
        );
    }

    // Supplied records; the destination answers 500: 502 with the receipt.
    let records =
        json!([{"sku": "A-1", "qty": 3}, {"sku": "B-2", "qty": 1}, {"sku": "C-3", "qty": 7}]);
    let body = json!({"destination": "https", "config": {"url": endpoint.url}, "records": records});
    let (status, failed) = post(&client, &cloud, &key, "/api/exports/destinations", &body).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{failed}");
    assert_eq!(failed["error"]["code"], "destination_failed");
    let failure = failed["exportReceipt"].clone();
    assert_eq!(failure["status"], "failed");
    assert_eq!(failure["responseStatus"], 500);
    assert_eq!(failure["recordCount"], 3);
    assert!(failure["error"].as_str().unwrap().contains("HTTP 500"), "{failure}");
    {
        let received = endpoint.received.lock().unwrap();
        let (head, bytes) = &received[1];
        assert_eq!(header(head, "x-opgraph-signature"), None, "no secret, no signature");
        let packet: Value = serde_json::from_slice(bytes).unwrap();
        assert_eq!(packet["source"], "records");
        assert_eq!(packet["records"], records);
    }

    // Both receipts, newest first, as they were answered.
    let (status, listed) = get(&client, &cloud, &key, "/api/exports/receipts").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(listed["exportReceipts"], json!([failure, receipt]));
    let (_, one) = get(&client, &cloud, &key, "/api/exports/receipts?limit=1").await;
    assert_eq!(one["exportReceipts"], json!([failure]));

    // Nothing listening: a failed receipt without a response status.
    endpoint.task.abort();
    let (status, down) = post(&client, &cloud, &key, "/api/exports/destinations", &body).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{down}");
    assert!(down["exportReceipt"].get("responseStatus").is_none_or(Value::is_null), "{down}");
    assert!(!down["exportReceipt"]["error"].as_str().unwrap().is_empty());
}

async fn bad_exports_are_refused_and_send_nothing(backend: Backend) {
    let endpoint = https_endpoint::start(vec![200]).await;
    let cloud = backend
        .start(&[("OPGRAPH_EXPORT_CA_FILE", endpoint.ca_file.display().to_string())])
        .await
        .unwrap();
    let (client, key) = (client(), cloud.key.clone());
    let url = endpoint.url.clone();
    let cases = [
        (json!({"destination": "ftp", "config": {}}), StatusCode::BAD_REQUEST, "destination"),
        (
            json!({"destination": "bigquery", "config": {"projectId": "p"}}),
            StatusCode::BAD_REQUEST,
            "config.datasetId",
        ),
        (
            json!({"destination": "redshift", "config": {"database": "d", "table": "t", "region": "eu-west-1"}}),
            StatusCode::BAD_REQUEST,
            "config.clusterId",
        ),
        (json!({"destination": "s3", "config": "bucket"}), StatusCode::BAD_REQUEST, "config"),
        (
            json!({"destination": "s3", "config": {"bucket": "b"}}),
            StatusCode::BAD_REQUEST,
            "config.accessKeyId",
        ),
        (
            json!({"destination": "s3", "config": {"bucket": "No_Such", "accessKeyId": "A", "secretAccessKey": "s"}}),
            StatusCode::BAD_REQUEST,
            "config.bucket",
        ),
        (
            json!({"destination": "s3", "config": {"bucket": "bkt", "accessKeyId": "A", "secretAccessKey": "s",
                "endpoint": url}}),
            StatusCode::BAD_REQUEST,
            "config.endpoint",
        ),
        (json!({"destination": "https", "config": {}}), StatusCode::BAD_REQUEST, "config.url"),
        (
            json!({"destination": "https", "config": {"url": url.replace("https://", "http://")}}),
            StatusCode::BAD_REQUEST,
            "config.url",
        ),
        (
            json!({"destination": "https", "config": {"url": url, "headers": {"Content-Length": "1"}}}),
            StatusCode::BAD_REQUEST,
            "config.headers.Content-Length",
        ),
        (
            json!({"destination": "https", "config": {"url": url}, "limit": 0}),
            StatusCode::BAD_REQUEST,
            "limit",
        ),
        (
            json!({"destination": "https", "config": {"url": url}, "limit": 5, "records": [{}]}),
            StatusCode::BAD_REQUEST,
            "limit",
        ),
        (
            json!({"destination": "https", "config": {"url": url}, "records": [{"a": 1}, 2]}),
            StatusCode::BAD_REQUEST,
            "records[1]",
        ),
        (
            json!({"destination": "https", "config": {"url": url}, "records": []}),
            StatusCode::BAD_REQUEST,
            "records",
        ),
        (
            json!({"destination": "https", "config": {"url": url}, "extra": 1}),
            StatusCode::BAD_REQUEST,
            "extra",
        ),
    ];
    for (body, expected, field) in cases {
        let (status, answer) =
            post(&client, &cloud, &key, "/api/exports/destinations", &body).await;
        assert_eq!(status, expected, "{body}: {answer}");
        assert_eq!(answer["error"]["code"], "validation_failed", "{body}: {answer}");
        assert_eq!(answer["error"]["field"], field, "{body}: {answer}");
    }
    // Warehouses: a way to authenticate, and plain table names.
    let warehouses = [
        (
            json!({"destination": "bigquery",
            "config": {"projectId": "p", "datasetId": "d", "tableId": "t"}}),
            "config.accessToken",
        ),
        (
            json!({"destination": "snowflake", "config": {"account": "xy1", "database": "d",
            "schema": "s", "table": "t; DROP TABLE t", "token": "x"}}),
            "config.table",
        ),
        (
            json!({"destination": "redshift", "config": {"workgroup": "w", "database": "d",
            "table": "t", "region": "eu-west-1", "accessKeyId": "AK"}}),
            "config.secretAccessKey",
        ),
    ];
    for (body, field) in warehouses {
        let (status, answer) =
            post(&client, &cloud, &key, "/api/exports/destinations", &body).await;
        assert_eq!(
            (status, &answer["error"]["field"]),
            (StatusCode::BAD_REQUEST, &json!(field)),
            "{answer}"
        );
    }
    // Without the `export` scope.
    let (status, created) =
        post(&client, &cloud, &key, "/api/keys", &json!({"name": "reader", "scopes": ["read"]}))
            .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let reader = created["apiKey"].as_str().unwrap();
    let ok = json!({"destination": "https", "config": {"url": url}});
    let (status, answer) = post(&client, &cloud, reader, "/api/exports/destinations", &ok).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{answer}");

    assert!(endpoint.received.lock().unwrap().is_empty(), "a refused export sent something");
    let (_, listed) = get(&client, &cloud, &key, "/api/exports/receipts").await;
    assert_eq!(listed["exportReceipts"], json!([]), "a refused export left a receipt");

    // By default an export may not reach the cloud's own network: the
    // endpoint on 127.0.0.1 gets nothing, and the receipt says why.
    let (status, answer) = post(&client, &cloud, &key, "/api/exports/destinations", &ok).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{answer}");
    let error = answer["exportReceipt"]["error"].as_str().unwrap();
    assert!(error.contains("exports.allow_private_networks"), "{error}");
    assert!(endpoint.received.lock().unwrap().is_empty(), "a private address was reached");
    let (status, answer) = get(&client, &cloud, &key, "/api/exports/receipts?limt=5").await;
    assert_eq!((status, &answer["error"]["field"]), (StatusCode::BAD_REQUEST, &json!("limt")));
}

/// The signature botocore (AWS's own Python SDK) computes for the same
/// S3 `PUT`: an implementation independent of ours.
fn botocore_authorization(url: &str, region: &str, amz_date: &str, body: &[u8]) -> String {
    botocore_signature("PUT", "s3", url, region, amz_date, "application/json", "", body)
}

/// botocore's signature of a request to `service`; `target` is its
/// `X-Amz-Target` header, if not empty.
#[allow(clippy::too_many_arguments)]
fn botocore_signature(
    method: &str,
    service: &str,
    url: &str,
    region: &str,
    amz_date: &str,
    content_type: &str,
    target: &str,
    body: &[u8],
) -> String {
    const SCRIPT: &str = r#"
import hashlib, sys
from botocore.auth import S3SigV4Auth, SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
method, service, url, amz_date, region, content_type, target, key_id, secret = sys.argv[1:10]
body = sys.stdin.buffer.read()
headers = {"Content-Type": content_type, "X-Amz-Date": amz_date,
    "X-Amz-Content-SHA256": hashlib.sha256(body).hexdigest()}
if target:
    headers["X-Amz-Target"] = target
request = AWSRequest(method=method, url=url, data=body, headers=headers)
request.context["timestamp"] = amz_date
signer = S3SigV4Auth if service == "s3" else SigV4Auth
auth = signer(Credentials(key_id, secret), service, region)
signature = auth.signature(auth.string_to_sign(request, auth.canonical_request(request)), request)
signed = auth.signed_headers(auth.headers_to_sign(request))
print(f"AWS4-HMAC-SHA256 Credential={auth.scope(request)}, SignedHeaders={signed}, Signature={signature}")
"#;
    let args = [method, service, url, amz_date, region, content_type, target, S3_KEY_ID, S3_SECRET];
    let mut child = Command::new("python3")
        .arg("-c")
        .arg(SCRIPT)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3");
    child.stdin.take().unwrap().write_all(body).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "botocore (installed by deploy/scripts/install-test-deps.sh)");
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

const S3_KEY_ID: &str = "AKIAOPGRAPHTEST00001";
const S3_SECRET: &str = "s3cr3t/OPGRAPH+test/0123456789abcdefghij";

/// S3 on an S3-compatible endpoint (path-style): one signed `PUT` of the
/// export as an object under the prefix, the object named in the receipt.
#[tokio::test]
async fn s3_destination_puts_one_signed_object() {
    object_store_puts_one_signed_object("s3", Some("eu-central-1")).await;
}

/// GCS through its S3-compatible XML API: the same `PUT`, region `auto`
/// unless told, the object named `gs://`.
#[tokio::test]
async fn gcs_destination_puts_one_signed_object() {
    object_store_puts_one_signed_object("gcs", None).await;
}

async fn object_store_puts_one_signed_object(kind: &str, region: Option<&str>) {
    let endpoint = https_endpoint::start(vec![200, 403]).await;
    let cloud = cloud_for(Backend::Embedded, &endpoint).await;
    let (client, key) = (client(), cloud.key.clone());
    let base = endpoint.url.split("/v1/").next().unwrap().to_owned();
    let mut config = json!({"bucket": "opgraph-exports", "prefix": "site a/",
        "endpoint": base, "accessKeyId": S3_KEY_ID, "secretAccessKey": S3_SECRET});
    if let Some(region) = region {
        config["region"] = json!(region);
    }
    let records = json!([{"sku": "A-1"}]);
    let body = json!({"destination": kind, "config": config, "records": records});
    let (status, pushed) = post(&client, &cloud, &key, "/api/exports/destinations", &body).await;
    assert_eq!(status, StatusCode::CREATED, "{pushed}");
    let receipt = &pushed["exportReceipt"];
    let id = receipt["id"].as_str().unwrap();
    let scheme = if kind == "gcs" { "gs" } else { "s3" };
    let object = format!("{scheme}://opgraph-exports/site a/{id}.json");
    assert_eq!(receipt["externalId"], object.as_str());
    let path = format!("/opgraph-exports/site%20a/{id}.json");
    assert_eq!(receipt["destination"], format!("{base}{path}"));
    let (head, bytes) = endpoint.received.lock().unwrap()[0].clone();
    assert!(head.starts_with(&format!("PUT {path} HTTP/1.1\r\n")), "{head}");
    let packet: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(packet["records"], records);
    let amz_date = header(&head, "x-amz-date").expect("x-amz-date");
    let region = region.unwrap_or("auto");
    let expected = botocore_authorization(&format!("{base}{path}"), region, amz_date, &bytes);
    assert_eq!(header(&head, "authorization"), Some(expected.as_str()), "{head}");

    // The store refuses (403): 502, the receipt says so, no object named.
    let (status, failed) = post(&client, &cloud, &key, "/api/exports/destinations", &body).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{failed}");
    assert_eq!(failed["exportReceipt"]["responseStatus"], 403);
    assert_ne!(failed["exportReceipt"]["externalId"], object.as_str(), "no object claimed");
}

/// An RSA key pair made by openssl: the private key (PKCS#8 PEM, as
/// Google's service-account keys and Snowflake's key pairs are) and the
/// public key.
fn rsa_pair() -> (String, String) {
    let private = Command::new("openssl")
        .args(["genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"])
        .output()
        .expect("openssl");
    assert!(private.status.success());
    let mut child = Command::new("openssl")
        .args(["pkey", "-pubout"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(&private.stdout).unwrap();
    let public = child.wait_with_output().unwrap();
    (String::from_utf8(private.stdout).unwrap(), String::from_utf8(public.stdout).unwrap())
}

/// The JWT of `Authorization: Bearer`, checked against `public`.
fn verified_jwt(
    head: &str,
    public: &str,
    audience: Option<&str>,
) -> jsonwebtoken::TokenData<Value> {
    let token = header(head, "authorization").unwrap().strip_prefix("Bearer ").unwrap();
    let mut validation = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::RS256);
    match audience {
        Some(audience) => validation.set_audience(&[audience]),
        None => validation.validate_aud = false,
    }
    let key = jsonwebtoken::DecodingKey::from_rsa_pem(public.as_bytes()).unwrap();
    jsonwebtoken::decode::<Value>(token, &key, &validation).expect("a valid RS256 token")
}

fn base_of(endpoint: &https_endpoint::Endpoint) -> String {
    endpoint.url.split("/v1/").next().unwrap().to_owned()
}

/// BigQuery's `insertAll` with a service account's key: one row per
/// record, `(export_id, record)`, each with an insertId; a 200 that
/// refuses rows is a failed export.
#[tokio::test]
async fn bigquery_destination_streams_rows_signed_by_a_service_account() {
    let refused = r#"{"insertErrors": [{"index": 1, "errors": [{"reason": "invalid"}]}]}"#;
    let endpoint = https_endpoint::start_answering(vec![(200, "{}"), (200, refused)]).await;
    let cloud = cloud_for(Backend::Embedded, &endpoint).await;
    let (client, key) = (client(), cloud.key.clone());
    let (private, public) = rsa_pair();
    let email = "exporter@plant-7.iam.gserviceaccount.com";
    let config = json!({"projectId": "plant-7", "datasetId": "ops", "tableId": "events",
        "clientEmail": email, "privateKey": private, "privateKeyId": "k1", "endpoint": base_of(&endpoint)});
    let records = json!([{"sku": "A-1"}, {"sku": "B-2", "qty": 3}]);
    let body = json!({"destination": "bigquery", "config": config, "records": records});
    let (status, pushed) = post(&client, &cloud, &key, "/api/exports/destinations", &body).await;
    assert_eq!(status, StatusCode::CREATED, "{pushed}");
    let id = pushed["exportReceipt"]["id"].as_str().unwrap().to_owned();
    let (head, bytes) = endpoint.received.lock().unwrap()[0].clone();
    let path = "/bigquery/v2/projects/plant-7/datasets/ops/tables/events/insertAll";
    assert!(head.starts_with(&format!("POST {path} HTTP/1.1\r\n")), "{head}");
    let token = verified_jwt(&head, &public, Some("https://bigquery.googleapis.com/"));
    assert_eq!((&token.claims["iss"], &token.claims["sub"]), (&json!(email), &json!(email)));
    assert_eq!(token.header.kid.as_deref(), Some("k1"));
    let sent: Value = serde_json::from_slice(&bytes).unwrap();
    let rows = sent["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[1]["insertId"], format!("{id}:1"));
    assert_eq!(rows[1]["json"]["export_id"], id.as_str());
    let record: Value = serde_json::from_str(rows[1]["json"]["record"].as_str().unwrap()).unwrap();
    assert_eq!(record, records[1]);

    let (status, failed) = post(&client, &cloud, &key, "/api/exports/destinations", &body).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{failed}");
    let error = failed["exportReceipt"]["error"].as_str().unwrap();
    assert!(error.starts_with("BigQuery refused 1 rows"), "{error}");
}

/// Snowflake's SQL API with key-pair authentication: one INSERT with the
/// records bound, a request id per export, the statement handle kept.
#[tokio::test]
async fn snowflake_destination_inserts_through_the_sql_api() {
    let answer = r#"{"statementHandle": "01b2c3d4-0000-0001", "message": "Statement executed successfully."}"#;
    let endpoint = https_endpoint::start_answering(vec![(200, answer)]).await;
    let cloud = cloud_for(Backend::Embedded, &endpoint).await;
    let (client, key) = (client(), cloud.key.clone());
    let (private, public) = rsa_pair();
    let config = json!({"account": "xy12345.eu-central-1", "database": "OPS", "schema": "PUBLIC",
        "table": "EVENTS", "warehouse": "LOAD_WH", "user": "exporter", "privateKey": private,
        "publicKeyFingerprint": "SHA256:q1w2e3=", "endpoint": base_of(&endpoint)});
    let records = json!([{"sku": "A-1', 'x'); DROP TABLE EVENTS; --"}]);
    let body = json!({"destination": "snowflake", "config": config, "records": records});
    let (status, pushed) = post(&client, &cloud, &key, "/api/exports/destinations", &body).await;
    assert_eq!(status, StatusCode::CREATED, "{pushed}");
    let receipt = &pushed["exportReceipt"];
    assert_eq!(receipt["externalId"], "01b2c3d4-0000-0001");
    let (head, bytes) = endpoint.received.lock().unwrap()[0].clone();
    assert!(head.starts_with("POST /api/v2/statements?requestId="), "{head}");
    assert_eq!(header(&head, "x-snowflake-authorization-token-type"), Some("KEYPAIR_JWT"));
    let token = verified_jwt(&head, &public, None);
    assert_eq!(token.claims["iss"], "XY12345.EXPORTER.SHA256:q1w2e3=");
    assert_eq!(token.claims["sub"], "XY12345.EXPORTER");
    let sent: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(
        sent["statement"],
        "INSERT INTO OPS.PUBLIC.EVENTS (export_id, record) SELECT column1, PARSE_JSON(column2) FROM VALUES (?, ?)"
    );
    assert_eq!(sent["bindings"]["1"]["value"], receipt["id"]);
    let record: Value =
        serde_json::from_str(sent["bindings"]["2"]["value"].as_str().unwrap()).unwrap();
    assert_eq!(record, records[0], "the record travels bound, not in the SQL");
    assert_eq!(sent["warehouse"], "LOAD_WH");
}

/// The Redshift Data API: `ExecuteStatement` signed with SigV4 (checked
/// against botocore), the records bound, the export id as client token.
#[tokio::test]
async fn redshift_destination_executes_a_signed_statement() {
    let answer = r#"{"Id": "d9b6c0c9-0747-4bf4-b142-e8883df97e12", "Database": "dev"}"#;
    let endpoint = https_endpoint::start_answering(vec![(200, answer)]).await;
    let cloud = cloud_for(Backend::Embedded, &endpoint).await;
    let (client, key) = (client(), cloud.key.clone());
    let base = base_of(&endpoint);
    let config = json!({"workgroup": "analytics", "database": "dev", "table": "public.exports",
        "region": "eu-west-1", "accessKeyId": S3_KEY_ID, "secretAccessKey": S3_SECRET, "endpoint": base});
    let records = json!([{"sku": "A-1"}, {"sku": "B-2"}]);
    let body = json!({"destination": "redshift", "config": config, "records": records});
    let (status, pushed) = post(&client, &cloud, &key, "/api/exports/destinations", &body).await;
    assert_eq!(status, StatusCode::CREATED, "{pushed}");
    let receipt = &pushed["exportReceipt"];
    assert_eq!(receipt["externalId"], "d9b6c0c9-0747-4bf4-b142-e8883df97e12");
    let (head, bytes) = endpoint.received.lock().unwrap()[0].clone();
    assert!(head.starts_with("POST / HTTP/1.1\r\n"), "{head}");
    let target = "RedshiftData.ExecuteStatement";
    assert_eq!(header(&head, "x-amz-target"), Some(target));
    let amz_date = header(&head, "x-amz-date").unwrap();
    let content_type = "application/x-amz-json-1.1";
    let url = format!("{base}/");
    let expected = botocore_signature(
        "POST",
        "redshift-data",
        &url,
        "eu-west-1",
        amz_date,
        content_type,
        target,
        &bytes,
    );
    assert_eq!(header(&head, "authorization"), Some(expected.as_str()), "{head}");
    let sent: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(sent["WorkgroupName"], "analytics");
    assert_eq!(sent["ClientToken"], receipt["id"]);
    assert_eq!(
        sent["Sql"],
        "INSERT INTO public.exports (export_id, record) VALUES (:export_id, JSON_PARSE(:r0)), (:export_id, JSON_PARSE(:r1))"
    );
    let second: Value =
        serde_json::from_str(sent["Parameters"][2]["value"].as_str().unwrap()).unwrap();
    assert_eq!((&sent["Parameters"][2]["name"], &second), (&json!("r1"), &records[1]));
}

/// With an `Idempotency-Key`, every try pushes under one export id (by
/// which the destination drops a repeat), and a try after a success answers
/// the first receipt again without pushing.
async fn a_keyed_export_is_pushed_under_one_id(backend: Backend) {
    let endpoint = https_endpoint::start(vec![500, 200]).await;
    let cloud = cloud_for(backend, &endpoint).await;
    let (client, key) = (client(), cloud.key.clone());
    let body = json!({"destination": "https", "config": {"url": endpoint.url},
        "records": [{"sku": "A-1"}]});
    let send = |idempotency: &'static str| {
        client
            .post(cloud.at("/api/exports/destinations"))
            .bearer_auth(&key)
            .header("Idempotency-Key", idempotency)
            .json(&body)
            .send()
    };
    let first = send("nightly-2026-11-27").await.unwrap();
    assert_eq!(first.status(), StatusCode::BAD_GATEWAY);
    let failed: Value = first.json().await.unwrap();
    let id = failed["exportReceipt"]["id"].as_str().unwrap().to_owned();
    let second = send("nightly-2026-11-27").await.unwrap();
    assert_eq!(second.status(), StatusCode::CREATED);
    let done: Value = second.json().await.unwrap();
    assert_eq!(done["exportReceipt"]["id"], id.as_str(), "{done}");
    let third = send("nightly-2026-11-27").await.unwrap();
    assert_eq!(third.status(), StatusCode::CREATED);
    assert_eq!(third.json::<Value>().await.unwrap(), done, "the first success, again");
    let received = endpoint.received.lock().unwrap().clone();
    assert_eq!(received.len(), 2, "the third try pushed nothing");
    for (head, _) in &received {
        assert_eq!(header(head, "idempotency-key"), Some(id.as_str()), "{head}");
    }
    let (_, list) = get(&client, &cloud, &key, "/api/exports/receipts").await;
    let receipts = list["exportReceipts"].as_array().unwrap();
    assert_eq!(receipts.len(), 1, "one receipt per export, the latest: {list}");
    assert_eq!(receipts[0]["status"], "succeeded");
    // Another key: another export.
    let other = send("nightly-2026-11-28").await.unwrap().json::<Value>().await.unwrap();
    assert_ne!(other["exportReceipt"]["id"], id.as_str());
    // The same key with other records is a 409: a key names one request,
    // and B-2 is neither pushed nor answered with A-1's receipt.
    let with_key = |key_value: &'static str, body: Value| {
        client
            .post(cloud.at("/api/exports/destinations"))
            .bearer_auth(&key)
            .header("Idempotency-Key", key_value)
            .json(&body)
            .send()
    };
    let changed = json!({"destination": "https", "config": {"url": endpoint.url},
        "records": [{"sku": "B-2"}]});
    let response = with_key("nightly-2026-11-27", changed.clone()).await.unwrap();
    assert_eq!(response.status(), StatusCode::CONFLICT);
    let error: Value = response.json().await.unwrap();
    assert_eq!(error["error"]["code"], "conflict", "{error}");
    assert_eq!(endpoint.received.lock().unwrap().len(), 3, "B-2 not pushed");
    // A refused body does not take its key: the body put right goes out.
    let bad = json!({"destination": "https", "config": {"url": endpoint.url},
        "records": [{"sku": "C-3"}], "limit": 5});
    let response = with_key("nightly-2026-11-29", bad).await.unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let response = with_key("nightly-2026-11-29", changed).await.unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    assert_eq!(endpoint.received.lock().unwrap().len(), 4, "B-2 pushed under a new key");
    // Keys are one namespace with ingest's: a key of an export names that
    // export there too.
    let response = client
        .post(cloud.at("/api/ingest"))
        .bearer_auth(&key)
        .header("Idempotency-Key", "nightly-2026-11-29")
        .json(&json!({"event": "export.noted"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::CONFLICT);
}

/// A cloud that trusts `endpoint` and may reach it on loopback.
async fn cloud_for(
    backend: Backend,
    endpoint: &https_endpoint::Endpoint,
) -> opgraph_tests::backends::BackendCloud {
    backend
        .start(&[
            ("OPGRAPH_EXPORT_CA_FILE", endpoint.ca_file.display().to_string()),
            ("OPGRAPH_EXPORT_ALLOW_PRIVATE_NETWORKS", "true".to_owned()),
        ])
        .await
        .unwrap()
}

both_backends!(
    a_keyed_export_is_pushed_under_one_id,
    https_destination_pushes_and_records_receipts,
    bad_exports_are_refused_and_send_nothing
);
