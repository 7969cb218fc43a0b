//! Trackables, scans, usage tracking and connector ingest against the real
//! binary, each case on the embedded store and on ClickHouse: every kind, every bad input, the public redirect (recorded with a
//! hashed IP, rate-limited, 404 for unknown codes), `/api/track`, events
//! from `/api/ingest` resolving to their trackable, and each connector with
//! its deduplication and per-record rejections.
//!
//! Not here yet: an event arriving in a gateway batch resolving to its
//! trackable. The resolution lives in the store's append path, which gateway
//! batches share, so it needs only its end-to-end test once the gateway
//! uplink is wired to the cloud.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose

use opgraph_tests::backends::{Backend, BackendCloud};
use opgraph_tests::now_ms;
use opgraph_tests::{TEST_BOOTSTRAP_KEY, both_backends};
use reqwest::header::{HeaderMap, LOCATION};
use reqwest::{Client, StatusCode};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

const KINDS: [&str; 8] =
    ["qr_code", "barcode", "rfid_tag", "sensor", "robot", "ai_agent", "mcp_server", "cli_workflow"];

struct Api {
    cloud: BackendCloud,
    client: Client,
    /// Never follows redirects: the scan answers are what is tested.
    raw: Client,
}

impl Api {
    async fn start(backend: Backend, env: &[(&str, String)]) -> Api {
        // Free ports for the gateway receivers too: tests run side by side.
        let mut env = env.to_vec();
        env.push(("OPGRAPH_GRPC_ADDR", "127.0.0.1:0".to_owned()));
        env.push(("OPGRAPH_QUIC_ADDR", "127.0.0.1:0".to_owned()));
        let cloud = backend.start(&env).await.unwrap();
        let raw = Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
        Api { client: cloud.http(), cloud, raw }
    }

    async fn post_as(&self, key: &str, path: &str, body: &Value) -> (StatusCode, Value) {
        let response =
            self.client.post(self.cloud.at(path)).bearer_auth(key).json(body).send().await.unwrap();
        let status = response.status();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    async fn post(&self, path: &str, body: &Value) -> (StatusCode, Value) {
        self.post_as(&self.cloud.key, path, body).await
    }

    async fn get(&self, path: &str) -> (StatusCode, Value) {
        let response =
            self.client.get(self.cloud.at(path)).bearer_auth(&self.cloud.key).send().await.unwrap();
        let status = response.status();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    async fn create(&self, body: Value) -> Value {
        let (status, created) = self.post("/api/trackables", &body).await;
        assert_eq!(status, StatusCode::CREATED, "{body} -> {created}");
        created["trackable"].clone()
    }

    async fn events(&self, query: &str) -> Vec<Value> {
        let (status, body) = self.get(&format!("/api/events?limit=1000{query}")).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        body["events"].as_array().unwrap().clone()
    }

    /// A raw GET of a scan path (no credential, no redirect following).
    async fn scan(&self, path: &str, headers: &[(&str, &str)]) -> (StatusCode, HeaderMap, String) {
        let mut request = self.raw.get(self.cloud.at(path));
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let response = request.send().await.unwrap();
        let (status, headers) = (response.status(), response.headers().clone());
        (status, headers, response.text().await.unwrap_or_default())
    }
}

fn error(body: &Value) -> (&str, &str) {
    (
        body["error"]["code"].as_str().unwrap_or("<no code>"),
        body["error"]["field"].as_str().unwrap_or("<no field>"),
    )
}

/// The scan path of a trackable: the last segment of its `scanUrl`.
fn scan_path(trackable: &Value) -> String {
    let url = trackable["scanUrl"].as_str().unwrap();
    let code = url.rsplit('/').next().unwrap();
    format!("/r/{code}")
}

async fn every_kind_is_created_listed_and_read_back(backend: Backend) {
    let public = "https://go.example.test";
    let api = Api::start(backend, &[("OPGRAPH_PUBLIC_URL", public.to_owned())]).await;
    let mut ids = Vec::new();
    for kind in KINDS {
        let mut body = json!({"kind": kind, "name": format!("my {kind}")});
        if kind == "qr_code" {
            body["targetUrl"] = json!("https://example.com/menu");
        }
        let t = api.create(body).await;
        assert_eq!(t["kind"], kind);
        assert!(t["id"].as_str().unwrap().starts_with("trk_"), "{t}");
        let code = t["code"].as_str().unwrap();
        assert_eq!(code.len(), 10, "{t}");
        assert!(code.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()), "{code}");
        assert_eq!(t["scanUrl"], format!("{public}/r/{code}"));
        assert!(t["createdAt"].is_i64());
        ids.push(t["id"].as_str().unwrap().to_owned());
    }
    // External identifiers are registered as given; their scan URL carries a
    // generated scan code, since another workspace may hold the same EPC.
    let epc = "3034F87E5C0000400000012A";
    let t = api.create(json!({"kind": "rfid_tag", "name": "pallet 7", "code": epc})).await;
    assert_eq!(t["code"], epc);
    let scan_code = t["scanUrl"].as_str().unwrap().rsplit('/').next().unwrap().to_owned();
    assert_ne!(scan_code, epc);
    assert_eq!(scan_code.len(), 10);
    let gtin =
        api.create(json!({"kind": "barcode", "name": "tee", "code": "09506000134352"})).await;
    assert_eq!(gtin["code"], "09506000134352");

    let (status, list) = api.get("/api/trackables").await;
    assert_eq!(status, StatusCode::OK);
    let listed = list["trackables"].as_array().unwrap();
    assert_eq!(listed.len(), 10);
    assert_eq!(listed[0]["code"], "09506000134352", "newest first");
    let (_, limited) = api.get("/api/trackables?limit=2").await;
    assert_eq!(limited["trackables"].as_array().unwrap().len(), 2);
    for bad in ["limit=-1", "limit=x", "kind=robot"] {
        let (status, body) = api.get(&format!("/api/trackables?{bad}")).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {body}");
    }

    let (status, one) = api.get(&format!("/api/trackables/{}", ids[4])).await;
    assert_eq!(status, StatusCode::OK, "{one}");
    assert_eq!(one["trackable"]["kind"], "robot");
    assert_eq!(one["trackable"]["usage"], json!({"count": 0, "lastUsedAt": null}));
    let (status, missing) = api.get("/api/trackables/trk_nope").await;
    assert_eq!((status, error(&missing).0), (StatusCode::NOT_FOUND, "not_found"));

    // Another workspace sees none of it, and may register the same EPC.
    let (status, ws) =
        api.post_as(TEST_BOOTSTRAP_KEY, "/api/workspaces", &json!({"name": "b"})).await;
    assert_eq!(status, StatusCode::CREATED, "{ws}");
    let other = ws["apiKey"].as_str().unwrap();
    let response = api
        .client
        .get(api.cloud.at(&format!("/api/trackables/{}", ids[0])))
        .bearer_auth(other)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    let (status, body) = api
        .post_as(other, "/api/trackables", &json!({"kind": "rfid_tag", "name": "x", "code": epc}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
}

async fn qr_svg_is_returned_when_asked(backend: Backend) {
    let api = Api::start(backend, &[]).await;
    let (status, created) = api
        .post(
            "/api/trackables",
            &json!({"kind": "qr_code", "name": "poster", "targetUrl": "https://example.com/",
                "includeQrSvg": true}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let svg = created["qrSvg"].as_str().unwrap();
    assert!(svg.starts_with("<svg xmlns=") && svg.ends_with("</svg>"), "{svg}");
    // Without a configured public URL, scan URLs use the bound address.
    assert!(created["trackable"]["scanUrl"].as_str().unwrap().starts_with(&api.cloud.url));
    let (_, plain) = api.post("/api/trackables", &json!({"kind": "robot", "name": "amr"})).await;
    assert!(plain.get("qrSvg").is_none(), "{plain}");
}

async fn bad_inputs_are_refused_and_store_nothing(backend: Backend) {
    let api = Api::start(backend, &[]).await;
    let qr = |url: Value| json!({"kind": "qr_code", "name": "x", "targetUrl": url});
    let cases = [
        (json!({"kind": "nfc_tag", "name": "x"}), "kind"),
        (json!({"kind": "QR_CODE", "name": "x", "targetUrl": "https://e.com"}), "kind"),
        (json!({"name": "x"}), "kind"),
        (json!({"kind": "robot"}), "name"),
        (json!({"kind": "robot", "name": ""}), "name"),
        (json!({"kind": "qr_code", "name": "x"}), "targetUrl"),
        (qr(json!("javascript:alert(document.cookie)")), "targetUrl"),
        (qr(json!("JavaScript:alert(1)")), "targetUrl"),
        (qr(json!("data:text/html;base64,PHNjcmlwdD4=")), "targetUrl"),
        (qr(json!("/menu")), "targetUrl"),
        (qr(json!("//evil.example/menu")), "targetUrl"),
        (qr(json!("example.com/menu")), "targetUrl"),
        (qr(json!("ftp://example.com/menu")), "targetUrl"),
        (qr(json!("https://user:pw@example.com/")), "targetUrl"),
        (qr(json!(format!("https://example.com/{}", "a".repeat(2100)))), "targetUrl"),
        (qr(json!(5)), "targetUrl"),
        (json!({"kind": "barcode", "name": "x", "code": "has space"}), "code"),
        (json!({"kind": "barcode", "name": "x", "code": "../etc"}), "code"),
        (json!({"kind": "barcode", "name": "x", "code": "9".repeat(129)}), "code"),
        (json!({"kind": "robot", "name": "x", "includeQrSvg": "yes"}), "includeQrSvg"),
        (json!({"kind": "robot", "name": "x", "eventName": "e".repeat(201)}), "eventName"),
        (json!({"kind": "robot", "name": "x", "colour": "red"}), "colour"),
    ];
    for (body, field) in cases {
        let (status, answer) = api.post("/api/trackables", &body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body} -> {answer}");
        assert_eq!(error(&answer), ("validation_failed", field), "{body} -> {answer}");
    }
    let (_, answer) = api.post("/api/trackables", &json!({"kind": "nfc_tag", "name": "x"})).await;
    let message = answer["error"]["message"].as_str().unwrap();
    for kind in KINDS {
        assert!(message.contains(kind), "{message}");
    }
    let (_, list) = api.get("/api/trackables").await;
    assert_eq!(list["trackables"], json!([]));

    // Duplicate external code: 409, and the first is untouched.
    let body = json!({"kind": "rfid_tag", "name": "first", "code": "EPC-1"});
    api.create(body).await;
    let (status, answer) = api
        .post("/api/trackables", &json!({"kind": "barcode", "name": "second", "code": "EPC-1"}))
        .await;
    assert_eq!((status, error(&answer).0), (StatusCode::CONFLICT, "conflict"), "{answer}");
    let (_, list) = api.get("/api/trackables").await;
    assert_eq!(list["trackables"].as_array().unwrap().len(), 1);
    assert_eq!(list["trackables"][0]["name"], "first");

    // Credentials: none is 401, a read-only key may list but not create.
    let response = api
        .client
        .post(api.cloud.at("/api/trackables"))
        .json(&json!({"kind": "robot", "name": "x"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    let (_, key) = api.post("/api/keys", &json!({"name": "reader", "scopes": ["read"]})).await;
    let reader = key["apiKey"].as_str().unwrap();
    let (status, _) =
        api.post_as(reader, "/api/trackables", &json!({"kind": "robot", "name": "x"})).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
}

async fn scan_redirects_and_records_with_a_hashed_ip(backend: Backend) {
    let api = Api::start(backend, &[]).await;
    let target = "https://example.com/menu?table=4";
    let t = api.create(json!({"kind": "qr_code", "name": "menu", "targetUrl": target})).await;
    let path = scan_path(&t);
    let (status, headers, _) = api
        .scan(
            &path,
            &[("user-agent", "Mozilla/5.0 (Phone)"), ("referer", "https://poster.example/")],
        )
        .await;
    assert_eq!(status, StatusCode::FOUND);
    assert_eq!(headers[LOCATION], target);
    assert_eq!(headers["x-opgraph-scan"], "recorded");

    let events = api.events("&event=trackable.scanned").await;
    assert_eq!(events.len(), 1);
    let e = &events[0];
    assert_eq!(e["trackable"], json!({"kind": "qr_code", "code": t["code"], "id": t["id"]}));
    assert_eq!(e["context"]["userAgent"], "Mozilla/5.0 (Phone)");
    assert_eq!(e["context"]["referrer"], "https://poster.example/");
    // The address only as SHA-256(salt, 0, ip), the salt kept in the data dir.
    let salt = std::fs::read_to_string(api.cloud.data_dir.join("scan-ip-salt")).unwrap();
    let mut hasher = Sha256::new();
    hasher.update(salt.trim().as_bytes());
    hasher.update([0]);
    hasher.update(b"127.0.0.1");
    let expected: String = hasher.finalize().iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(e["context"]["ipHash"], expected.as_str());
    assert_eq!(e["actor"], json!({"type": "visitor", "id": expected}));
    assert!(!e.to_string().contains("127.0.0.1"), "{e}");
    for file in ["opgraph.db", "opgraph.db-wal"] {
        if let Ok(bytes) = std::fs::read(api.cloud.data_dir.join(file)) {
            assert!(!bytes.windows(9).any(|w| w == b"127.0.0.1"), "raw IP stored in {file}");
        }
    }
    if backend == Backend::ClickHouse {
        let sql = "SELECT count() FROM events WHERE position(envelope, '127.0.0.1') > 0";
        assert_eq!(api.cloud.store().clickhouse_sql(sql).await.unwrap().trim(), "0");
    }
    let (_, one) = api.get(&format!("/api/trackables/{}", t["id"].as_str().unwrap())).await;
    assert_eq!(one["trackable"]["usage"]["count"], 1);
    assert_eq!(one["trackable"]["usage"]["lastUsedAt"], e["timestamp"]);

    // HEAD (link checkers) redirects without recording.
    let response = api.raw.head(api.cloud.at(&path)).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::FOUND);
    assert_eq!(response.headers()["x-opgraph-scan"], "not-recorded");

    // The trackable's own event name; and a trackable without a target.
    let named = api
        .create(json!({"kind": "qr_code", "name": "door", "targetUrl": "https://example.com/d",
            "eventName": "door.checked_in"}))
        .await;
    let (status, _, _) = api.scan(&scan_path(&named), &[]).await;
    assert_eq!(status, StatusCode::FOUND);
    assert_eq!(api.events("&event=door.checked_in").await.len(), 1);
    let robot = api.create(json!({"kind": "robot", "name": "amr-7"})).await;
    let (status, headers, page) = api.scan(&scan_path(&robot), &[]).await;
    assert_eq!(status, StatusCode::OK);
    assert!(headers["content-type"].to_str().unwrap().starts_with("text/html"));
    assert!(page.contains("recorded"), "{page}");
    assert_eq!(api.events("").await.len(), 3);
}

async fn unknown_codes_and_path_tricks_are_404_and_record_nothing(backend: Backend) {
    let api = Api::start(backend, &[]).await;
    let t = api.create(json!({"kind": "qr_code", "name": "m", "targetUrl": "https://e.com"})).await;
    let code = t["code"].as_str().unwrap().to_owned();
    let long = format!("/r/{}", "a".repeat(100));
    let tricks = [
        "/r/zzzzzzzzzz".to_owned(),
        format!("/r/{}", code.to_uppercase()),
        format!("/r/{code}%00"),
        format!("/r/{code}%2F"),
        "/r/..%2Fapi%2Fhealth".to_owned(),
        "/r/%2e%2e".to_owned(),
        format!("/r/{code}.json"),
        format!("/r/%20{code}"),
        long,
    ];
    for path in &tricks {
        let (status, headers, page) = api.scan(path, &[]).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}");
        assert!(headers.get(LOCATION).is_none(), "{path}");
        if headers["content-type"].to_str().unwrap().starts_with("text/html") {
            assert!(page.contains("not registered") || page.is_empty(), "{path}: {page}");
        }
    }
    for path in [format!("/r/{code}/x"), "/r/".to_owned(), format!("/r//{code}")] {
        let (status, headers, _) = api.scan(&path, &[]).await;
        assert!(headers.get(LOCATION).is_none(), "{path} -> {status}");
    }
    assert_eq!(api.events("").await, Vec::<Value>::new());
    let (_, one) = api.get(&format!("/api/trackables/{}", t["id"].as_str().unwrap())).await;
    assert_eq!(one["trackable"]["usage"]["count"], 0);
}

async fn scan_floods_still_redirect_but_are_not_recorded(backend: Backend) {
    let api = Api::start(
        backend,
        &[("OPGRAPH_SCAN_BURST", "3".to_owned()), ("OPGRAPH_SCAN_RATE_PER_MINUTE", "1".to_owned())],
    )
    .await;
    let a =
        api.create(json!({"kind": "qr_code", "name": "a", "targetUrl": "https://e.com/a"})).await;
    let b =
        api.create(json!({"kind": "qr_code", "name": "b", "targetUrl": "https://e.com/b"})).await;
    let mut flags = Vec::new();
    for _ in 0..10 {
        let (status, headers, _) = api.scan(&scan_path(&a), &[]).await;
        assert_eq!(status, StatusCode::FOUND);
        assert_eq!(headers[LOCATION], "https://e.com/a");
        flags.push(headers["x-opgraph-scan"].to_str().unwrap().to_owned());
    }
    assert_eq!(&flags[..3], ["recorded"; 3]);
    assert_eq!(&flags[3..], ["not-recorded"; 7]);
    // Each code has its own bucket.
    let (_, headers, _) = api.scan(&scan_path(&b), &[]).await;
    assert_eq!(headers["x-opgraph-scan"], "recorded");
    let (_, one) = api.get(&format!("/api/trackables/{}", a["id"].as_str().unwrap())).await;
    assert_eq!(one["trackable"]["usage"]["count"], 3);
    assert_eq!(api.events("&event=trackable.scanned").await.len(), 4);
}

async fn track_records_usage_through_the_ingest_rules(backend: Backend) {
    let api = Api::start(backend, &[]).await;
    let agent = api.create(json!({"kind": "ai_agent", "name": "pricing agent"})).await;
    let cli = api
        .create(json!({"kind": "cli_workflow", "name": "deploy", "eventName": "workflow.ran"}))
        .await;
    let code = agent["code"].as_str().unwrap();
    let at = now_ms() - 60_000;
    let (status, body) = api
        .post(
            "/api/track",
            &json!({"code": code, "properties": {"latencyMs": 812}, "actor": {"type": "user", "id": "u1"},
                "timestamp": at}),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let id = body["ids"][0].as_str().unwrap().to_owned();
    let (status, _) =
        api.post("/api/track", &json!({"code": code, "event": "agent.run.completed"})).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let (status, _) = api.post("/api/track", &json!({"code": cli["code"]})).await;
    assert_eq!(status, StatusCode::ACCEPTED);

    let used = api.events("&event=trackable.used").await;
    assert_eq!(used.len(), 1);
    assert_eq!(used[0]["id"], id.as_str());
    assert_eq!(used[0]["trackable"], json!({"kind": "ai_agent", "code": code, "id": agent["id"]}));
    assert_eq!(used[0]["properties"], json!({"latencyMs": 812}));
    assert_eq!(used[0]["timestamp"], at);
    assert_eq!(api.events("&event=agent.run.completed").await.len(), 1);
    assert_eq!(api.events("&event=workflow.ran").await.len(), 1);
    let (_, one) = api.get(&format!("/api/trackables/{}", agent["id"].as_str().unwrap())).await;
    assert_eq!(one["trackable"]["usage"]["count"], 2);
    assert!(one["trackable"]["usage"]["lastUsedAt"].as_i64().unwrap() > at);

    let (status, body) = api.post("/api/track", &json!({"code": "nope123456"})).await;
    assert_eq!((status, error(&body).0), (StatusCode::NOT_FOUND, "not_found"));
    for (bad, field) in [
        (json!({}), "code"),
        (json!({"code": 7}), "code"),
        (json!({"code": code, "properties": [1]}), "properties"),
        (json!({"code": code, "event": ""}), "event"),
        (json!({"code": code, "timestamp": 1}), "timestamp"),
        (json!({"code": code, "actor": {"type": "user"}}), "actor.id"),
        (json!({"code": code, "trackable": {}}), "trackable"),
    ] {
        let (status, body) = api.post("/api/track", &bad).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad} -> {body}");
        assert_eq!(error(&body), ("validation_failed", field), "{bad} -> {body}");
    }
    assert_eq!(api.events("").await.len(), 3, "refused calls store nothing");
}

async fn ingested_events_with_a_registered_code_resolve_to_it(backend: Backend) {
    let api = Api::start(backend, &[]).await;
    let epc = "3034F87E5C0000400000012A";
    let tag = api.create(json!({"kind": "rfid_tag", "name": "pallet 7", "code": epc})).await;
    let read = |antenna: i64| {
        json!({"event": "rfid.tag.read", "actor": {"type": "rfid_reader", "id": "dock-3"},
            "trackable": {"code": epc, "antenna": antenna}})
    };
    let (status, body) = api.post("/api/ingest", &read(1)).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let (status, body) = api
        .post(
            "/api/ingest",
            &json!({"batch": [read(2), {"event": "rfid.tag.read",
            "trackable": {"kind": "rfid_tag", "code": "UNREGISTERED"}}]}),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");

    let events = api.events("&event=rfid.tag.read").await;
    assert_eq!(events.len(), 3);
    let linked: Vec<&Value> = events.iter().filter(|e| e["trackable"]["code"] == epc).collect();
    assert_eq!(linked.len(), 2);
    for e in linked {
        assert_eq!(e["trackable"]["id"], tag["id"]);
        assert_eq!(e["trackable"]["kind"], "rfid_tag");
    }
    let other = events.iter().find(|e| e["trackable"]["code"] == "UNREGISTERED").unwrap();
    assert_eq!(other["trackable"], json!({"kind": "rfid_tag", "code": "UNREGISTERED"}));
    let (_, one) = api.get(&format!("/api/trackables/{}", tag["id"].as_str().unwrap())).await;
    assert_eq!(one["trackable"]["usage"]["count"], 2);
}

/// A realistic record per provider, the event it becomes, and a change that
/// a re-sync brings.
fn provider_samples() -> Vec<(&'static str, Value, &'static str)> {
    vec![
        (
            "shopify",
            json!({"id": 450789469, "name": "#1001", "created_at": "2026-11-20T11:00:00-05:00",
            "currency": "USD", "total_price": "598.94", "financial_status": "paid",
            "landing_site": "/?utm_source=newsletter&utm_campaign=fall", "source_name": "web",
            "customer": {"id": 207119551, "email": "bob@example.com"},
            "line_items": [{"id": 1, "quantity": 2, "price": "299.47"}]}),
            "order.created",
        ),
        (
            "woocommerce",
            json!({"id": 727, "number": "727", "status": "processing", "currency": "EUR",
            "date_created_gmt": "2026-11-20T19:28:02", "total": "29.35", "customer_id": 0,
            "line_items": [{"id": 315, "quantity": 1}]}),
            "order.created",
        ),
        (
            "stripe",
            json!({"id": "ch_3MmlLrLkdIwHu7ix0snN0B15", "object": "charge", "amount": 1099,
            "amount_captured": 1099, "amount_refunded": 0, "captured": true, "created": now_ms() / 1000 - 3600,
            "currency": "usd", "customer": "cus_NffrFeUfNV2Hib", "paid": true, "status": "succeeded"}),
            "payment.succeeded",
        ),
        (
            "salesforce",
            json!({"attributes": {"type": "Lead"}, "Id": "00Q5e00000AbCdEFGH",
            "Company": "Greenwich Media", "Email": "sarah@example.com", "Status": "Open - Not Contacted",
            "LeadSource": "Web", "CreatedDate": "2026-11-20T15:04:05.000+0000"}),
            "lead.created",
        ),
        (
            "hubspot",
            json!({"id": "1467", "properties": {"amount": "1500.00", "dealname": "Acme annual",
            "dealstage": "closedwon", "hs_is_closed_won": "true", "deal_currency_code": "USD"},
            "createdAt": "2026-11-10T09:00:00.000Z", "updatedAt": "2026-11-20T12:00:00.000Z",
            "archived": false}),
            "deal.updated",
        ),
        (
            "quickbooks",
            json!({"Invoice": {"Id": "130", "DocNumber": "1037", "TxnDate": "2026-11-20",
            "DueDate": "2026-12-20", "CurrencyRef": {"value": "USD"}, "CustomerRef": {"value": "3"},
            "Line": [{"Amount": 362.07}], "TotalAmt": 362.07, "Balance": 362.07,
            "MetaData": {"CreateTime": "2026-11-20T12:38:17-07:00"}}}),
            "invoice.created",
        ),
        (
            "google_ads",
            json!({"customer": {"id": "1234567890", "currencyCode": "USD"},
            "campaign": {"id": "17755443322", "name": "Brand - Search", "advertisingChannelType": "SEARCH"},
            "metrics": {"clicks": "120", "impressions": "5400", "costMicros": "45670000"},
            "segments": {"date": "2026-11-20"}}),
            "ad.spend",
        ),
        (
            "meta_ads",
            json!({"account_id": "1029384756", "campaign_id": "23851234567890123",
            "campaign_name": "Spring Sale", "spend": "123.45", "impressions": "10234", "clicks": "321",
            "account_currency": "EUR", "date_start": "2026-11-20", "date_stop": "2026-11-20"}),
            "ad.spend",
        ),
        ("acme_erp", json!({"id": "ord-1", "total": 42.5, "currency": "EUR"}), "acme_erp.record"),
    ]
}

async fn each_connector_maps_and_resync_updates_without_duplicating(backend: Backend) {
    let api = Api::start(backend, &[]).await;
    let mut first_ids = Vec::new();
    for (provider, record, event) in provider_samples() {
        let (status, body) = api
            .post("/api/connectors/ingest", &json!({"provider": provider, "records": [record]}))
            .await;
        assert_eq!(status, StatusCode::OK, "{provider}: {body}");
        assert_eq!(body["provider"], provider);
        assert_eq!(
            (body["ingested"].as_i64(), body["updated"].as_i64()),
            (Some(1), Some(0)),
            "{body}"
        );
        assert_eq!(body["rejected"], json!([]));
        let id = body["ids"][0].as_str().unwrap().to_owned();
        let stored = api.events(&format!("&event={event}")).await;
        let e =
            stored.iter().find(|e| e["id"] == id.as_str()).unwrap_or_else(|| panic!("{provider}"));
        assert_eq!(e["context"]["connector"]["provider"], provider);
        assert_eq!(e["businessId"], "default");
        first_ids.push(id);
    }
    let total = api.events("").await.len();
    assert_eq!(total, provider_samples().len());
    let shopify = api.events("&event=order.created").await;
    let order =
        shopify.iter().find(|e| e["context"]["connector"]["provider"] == "shopify").unwrap();
    assert_eq!(order["outcome"], json!({"revenue": 598.94, "currency": "USD"}));
    assert_eq!(order["attribution"]["campaign"], "fall");

    // Re-sync everything; Shopify's order was refunded meanwhile.
    for (i, (provider, mut record, _)) in provider_samples().into_iter().enumerate() {
        if provider == "shopify" {
            record["financial_status"] = json!("refunded");
        }
        let (status, body) = api
            .post("/api/connectors/ingest", &json!({"provider": provider, "records": [record]}))
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(
            (body["ingested"].as_i64(), body["updated"].as_i64()),
            (Some(0), Some(1)),
            "{body}"
        );
        assert_eq!(body["ids"][0], first_ids[i].as_str(), "{provider} keeps its event id");
    }
    assert_eq!(api.events("").await.len(), total, "re-syncs never duplicate");
    let shopify = api.events("&event=order.created").await;
    let order =
        shopify.iter().find(|e| e["context"]["connector"]["provider"] == "shopify").unwrap();
    assert_eq!(order["id"], first_ids[0].as_str());
    assert_eq!(order["outcome"]["revenue"], json!(0.0));

    // Into a named business.
    let (status, body) = api
        .post(
            "/api/connectors/ingest",
            &json!({"provider": "acme_erp", "businessId": "store-12", "records": [{"id": "ord-2"}]}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(api.events("&businessId=store-12").await.len(), 1);

    // `/api/usage`: two syncs per provider (three for acme_erp), events
    // metered once.
    let (status, usage) = api.get("/api/usage").await;
    assert_eq!(status, StatusCode::OK, "{usage}");
    assert_eq!(usage["events"]["ingested"], total + 1);
    let loads = usage["connectors"].as_array().unwrap();
    assert_eq!(loads.len(), total);
    let shopify = loads.iter().find(|l| l["provider"] == "shopify").unwrap();
    assert_eq!(
        [&shopify["syncs"], &shopify["received"], &shopify["ingested"], &shopify["updated"]],
        [2, 2, 1, 1]
    );
    let acme = loads.iter().find(|l| l["provider"] == "acme_erp").unwrap();
    assert_eq!([&acme["syncs"], &acme["ingested"], &acme["updated"]], [3, 2, 1]);
    // Like every list, bounded by `limit` (any provider name is a generic
    // connector, so their number is the callers' to grow).
    let (status, usage) = api.get("/api/usage?limit=1").await;
    assert_eq!(status, StatusCode::OK, "{usage}");
    assert_eq!(usage["connectors"].as_array().unwrap().len(), 1, "{usage}");
}

async fn rejected_records_are_reported_by_index_and_the_rest_stored(backend: Backend) {
    let api = Api::start(backend, &[]).await;
    let good = |id: i64| json!({"id": id, "total_price": "10.00", "currency": "USD"});
    let records = json!([
        good(1),
        {"id": 2, "currency": "USD"},
        "not an object",
        good(4),
        {"id": 5, "total_price": "1.00", "created_at": "1999-01-01T00:00:00Z"},
        {"id": 6, "total_price": "1.00", "created_at": "last tuesday"},
        good(1),
    ]);
    let (status, body) = api
        .post("/api/connectors/ingest", &json!({"provider": "shopify", "records": records}))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["ingested"], 2);
    assert_eq!(body["updated"], 1, "the repeated record 1 is an update");
    let indexes: Vec<i64> =
        body["rejected"].as_array().unwrap().iter().map(|r| r["index"].as_i64().unwrap()).collect();
    assert_eq!(indexes, [1, 2, 4, 5]);
    let reasons: Vec<&str> =
        body["rejected"].as_array().unwrap().iter().map(|r| r["error"].as_str().unwrap()).collect();
    assert!(reasons[0].contains("total_price"), "{reasons:?}");
    assert!(reasons[1].contains("object"), "{reasons:?}");
    assert!(reasons[2].starts_with("timestamp"), "{reasons:?}");
    assert!(reasons[3].contains("created_at"), "{reasons:?}");
    assert_eq!(body["ids"].as_array().unwrap().len(), 3);
    assert_eq!(body["ids"][0], body["ids"][2]);
    assert_eq!(api.events("").await.len(), 2);

    let many: Vec<Value> = (0..1001).map(good).collect();
    for (bad, field) in [
        (json!({"records": [good(1)]}), "provider"),
        (json!({"provider": "Shopify!", "records": [good(1)]}), "provider"),
        (json!({"provider": "shopify"}), "records"),
        (json!({"provider": "shopify", "records": []}), "records"),
        (json!({"provider": "shopify", "records": good(1)}), "records"),
        (json!({"provider": "shopify", "records": many}), "records"),
        (json!({"provider": "shopify", "records": [good(1)], "businessId": ""}), "businessId"),
        (json!({"provider": "shopify", "records": [good(1)], "since": 1}), "since"),
    ] {
        let (status, answer) = api.post("/api/connectors/ingest", &bad).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
        assert_eq!(error(&answer), ("validation_failed", field), "{answer}");
    }
    assert_eq!(api.events("").await.len(), 2, "refused calls store nothing");
}

/// The document does not depend on the store: embedded only.
#[tokio::test]
async fn new_routes_are_in_the_openapi_document() {
    let api = Api::start(Backend::Embedded, &[]).await;
    let (status, doc) = api.get("/api/openapi").await;
    assert_eq!(status, StatusCode::OK);
    for (path, method) in [
        ("/api/trackables", "post"),
        ("/api/trackables", "get"),
        ("/api/trackables/{id}", "get"),
        ("/api/track", "post"),
        ("/r/{code}", "get"),
        ("/api/connectors/ingest", "post"),
    ] {
        assert!(doc["paths"][path][method].is_object(), "{method} {path}");
    }
}

both_backends!(
    every_kind_is_created_listed_and_read_back,
    qr_svg_is_returned_when_asked,
    bad_inputs_are_refused_and_store_nothing,
    scan_redirects_and_records_with_a_hashed_ip,
    unknown_codes_and_path_tricks_are_404_and_record_nothing,
    scan_floods_still_redirect_but_are_not_recorded,
    track_records_usage_through_the_ingest_rules,
    ingested_events_with_a_registered_code_resolve_to_it,
    each_connector_maps_and_resync_updates_without_duplicating,
    rejected_records_are_reported_by_index_and_the_rest_stored,
);
