//! Enterprise tokens against the real binary: HS256, RS256 and ES256 from
//! PEM files and from a JWKS file, and every way a token can be wrong.
//! Keys are generated per run with the `openssl` command line tool.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose

use std::path::Path;
use std::process::Command;

use jsonwebtoken::jwk::{Jwk, JwkSet};
use jsonwebtoken::{Algorithm, EncodingKey, Header, encode};
use opgraph_tests::Cloud;
use reqwest::StatusCode;
use serde_json::{Value, json};

const ISSUER: &str = "https://idp.example.test";
const AUDIENCE: &str = "opgraph";
const SECRET: &str = "a-shared-secret-of-at-least-32-bytes!!";

fn now() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64
}

fn claims(overrides: Value) -> Value {
    let mut claims = json!({
        "sub": "alice@example.test",
        "iss": ISSUER,
        "aud": AUDIENCE,
        "exp": now() + 600,
        "iat": now(),
        "workspaces": ["ws_default"],
    });
    for (k, v) in overrides.as_object().unwrap() {
        if v.is_null() {
            claims.as_object_mut().unwrap().remove(k);
        } else {
            claims[k] = v.clone();
        }
    }
    claims
}

fn token(alg: Algorithm, key: &EncodingKey, kid: Option<&str>, claims: &Value) -> String {
    let mut header = Header::new(alg);
    header.kid = kid.map(str::to_owned);
    encode(&header, claims, key).unwrap()
}

fn hs(claims: &Value) -> String {
    token(Algorithm::HS256, &EncodingKey::from_secret(SECRET.as_bytes()), None, claims)
}

fn openssl(args: &[&str]) {
    let status = Command::new("openssl").args(args).status().expect("openssl is installed");
    assert!(status.success(), "openssl {args:?}");
}

/// Writes `<name>.pem` (private, PKCS#8) and `<name>.pub.pem`.
fn keypair(dir: &Path, name: &str, rsa: bool) -> (EncodingKey, std::path::PathBuf) {
    let private = dir.join(format!("{name}.pem"));
    let public = dir.join(format!("{name}.pub.pem"));
    let p = private.to_str().unwrap();
    if rsa {
        openssl(&["genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", p]);
    } else {
        openssl(&["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", p]);
    }
    openssl(&["pkey", "-in", p, "-pubout", "-out", public.to_str().unwrap()]);
    let pem = std::fs::read(&private).unwrap();
    let key = if rsa {
        EncodingKey::from_rsa_pem(&pem).unwrap()
    } else {
        EncodingKey::from_ec_pem(&pem).unwrap()
    };
    (key, public)
}

async fn ingest_status(cloud: &Cloud, token: &str, workspace: Option<&str>) -> (StatusCode, Value) {
    let mut request = cloud
        .http()
        .post(cloud.at("/api/ingest"))
        .bearer_auth(token)
        .json(&json!({"event": "badge.scanned"}));
    if let Some(ws) = workspace {
        request = request.header("X-Opgraph-Workspace-ID", ws);
    }
    let response = request.send().await.unwrap();
    let status = response.status();
    (status, response.json().await.unwrap_or(Value::Null))
}

fn env(vars: &[(&'static str, String)]) -> Vec<(&'static str, String)> {
    let mut all = vec![
        ("OPGRAPH_JWT_ISSUER", ISSUER.to_owned()),
        ("OPGRAPH_JWT_AUDIENCE", AUDIENCE.to_owned()),
    ];
    all.extend(vars.iter().cloned());
    all
}

#[tokio::test]
async fn hs256_tokens_and_every_negative() {
    let cloud = Cloud::start(&env(&[("OPGRAPH_JWT_SECRET", SECRET.to_owned())])).await.unwrap();
    let good = hs(&claims(json!({})));
    let (status, body) = ingest_status(&cloud, &good, Some("ws_default")).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");

    let (status, body) = ingest_status(&cloud, &good, None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["error"]["code"], "missing_workspace_header");
    let (status, body) = ingest_status(&cloud, &good, Some("ws_elsewhere")).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(body["error"]["code"], "forbidden");

    let unauthorized = [
        ("expired", hs(&claims(json!({"exp": now() - 3600})))),
        ("not yet valid", hs(&claims(json!({"nbf": now() + 3600})))),
        ("no expiry", hs(&claims(json!({"exp": null})))),
        ("wrong issuer", hs(&claims(json!({"iss": "https://evil.test"})))),
        ("wrong audience", hs(&claims(json!({"aud": "someone-else"})))),
        // Configured issuer and audience must be there, not merely not wrong.
        ("no issuer", hs(&claims(json!({"iss": null})))),
        ("no audience", hs(&claims(json!({"aud": null})))),
        (
            "bad signature",
            token(
                Algorithm::HS256,
                &EncodingKey::from_secret(b"another-secret-of-at-least-32-bytes!!"),
                None,
                &claims(json!({})),
            ),
        ),
        ("alg none", {
            use base64_url as b;
            format!(
                "{}.{}.",
                b::encode(br#"{"alg":"none","typ":"JWT"}"#),
                b::encode(claims(json!({})).to_string().as_bytes())
            )
        }),
        ("garbage", "eyJhbGciOiJIUzI1NiJ9.not-json.sig".to_owned()),
    ];
    for (what, token) in unauthorized {
        let (status, body) = ingest_status(&cloud, &token, Some("ws_default")).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{what}: {body}");
        assert_eq!(body["error"]["code"], "unauthorized", "{what}");
    }

    // A token scoped to reading may read but not ingest.
    let reader = hs(&claims(json!({"scope": "read"})));
    assert_eq!(ingest_status(&cloud, &reader, Some("ws_default")).await.0, StatusCode::FORBIDDEN);
    let response = cloud
        .http()
        .get(cloud.at("/api/events"))
        .bearer_auth(&reader)
        .header("X-Opgraph-Workspace-ID", "ws_default")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let events: Value = response.json().await.unwrap();
    assert_eq!(events["events"].as_array().unwrap().len(), 1);
}

#[tokio::test]
async fn rs256_and_es256_public_keys() {
    let dir = tempfile::tempdir().unwrap();
    let (rsa, rsa_pub) = keypair(dir.path(), "rsa", true);
    let (ec, ec_pub) = keypair(dir.path(), "ec", false);
    let good = claims(json!({}));

    let cloud =
        Cloud::start(&env(&[("OPGRAPH_JWT_PUBLIC_KEY_FILE", rsa_pub.display().to_string())]))
            .await
            .unwrap();
    let rs = token(Algorithm::RS256, &rsa, None, &good);
    assert_eq!(ingest_status(&cloud, &rs, Some("ws_default")).await.0, StatusCode::ACCEPTED);
    // Another algorithm, or the right one with another key, is refused.
    let es = token(Algorithm::ES256, &ec, None, &good);
    assert_eq!(ingest_status(&cloud, &es, Some("ws_default")).await.0, StatusCode::UNAUTHORIZED);
    assert_eq!(
        ingest_status(&cloud, &hs(&good), Some("ws_default")).await.0,
        StatusCode::UNAUTHORIZED
    );
    let (other_rsa, _) = keypair(dir.path(), "rsa2", true);
    let forged = token(Algorithm::RS256, &other_rsa, None, &good);
    assert_eq!(
        ingest_status(&cloud, &forged, Some("ws_default")).await.0,
        StatusCode::UNAUTHORIZED
    );
    drop(cloud);

    let cloud =
        Cloud::start(&env(&[("OPGRAPH_JWT_PUBLIC_KEY_FILE", ec_pub.display().to_string())]))
            .await
            .unwrap();
    assert_eq!(ingest_status(&cloud, &es, Some("ws_default")).await.0, StatusCode::ACCEPTED);
    assert_eq!(ingest_status(&cloud, &rs, Some("ws_default")).await.0, StatusCode::UNAUTHORIZED);
    let expired = token(Algorithm::ES256, &ec, None, &claims(json!({"exp": now() - 3600})));
    assert_eq!(
        ingest_status(&cloud, &expired, Some("ws_default")).await.0,
        StatusCode::UNAUTHORIZED
    );
}

#[tokio::test]
async fn jwks_keys_are_chosen_by_kid() {
    let dir = tempfile::tempdir().unwrap();
    let (rsa, _) = keypair(dir.path(), "rsa", true);
    let (ec, _) = keypair(dir.path(), "ec", false);
    let mut rsa_jwk = Jwk::from_encoding_key(&rsa, Algorithm::RS256).unwrap();
    rsa_jwk.common.key_id = Some("rsa-1".into());
    let mut ec_jwk = Jwk::from_encoding_key(&ec, Algorithm::ES256).unwrap();
    ec_jwk.common.key_id = Some("ec-1".into());
    let jwks = dir.path().join("jwks.json");
    std::fs::write(&jwks, serde_json::to_vec(&JwkSet { keys: vec![rsa_jwk, ec_jwk] }).unwrap())
        .unwrap();
    let cloud =
        Cloud::start(&env(&[("OPGRAPH_JWT_JWKS_FILE", jwks.display().to_string())])).await.unwrap();
    let good = claims(json!({}));
    for (alg, key, kid) in [(Algorithm::RS256, &rsa, "rsa-1"), (Algorithm::ES256, &ec, "ec-1")] {
        let t = token(alg, key, Some(kid), &good);
        assert_eq!(
            ingest_status(&cloud, &t, Some("ws_default")).await.0,
            StatusCode::ACCEPTED,
            "{kid}"
        );
    }
    let wrong_kid = token(Algorithm::RS256, &rsa, Some("ec-1"), &good);
    assert_eq!(
        ingest_status(&cloud, &wrong_kid, Some("ws_default")).await.0,
        StatusCode::UNAUTHORIZED
    );
    let unknown = token(Algorithm::RS256, &rsa, Some("nope"), &good);
    assert_eq!(
        ingest_status(&cloud, &unknown, Some("ws_default")).await.0,
        StatusCode::UNAUTHORIZED
    );
    let no_kid = token(Algorithm::RS256, &rsa, None, &good);
    assert_eq!(
        ingest_status(&cloud, &no_kid, Some("ws_default")).await.0,
        StatusCode::UNAUTHORIZED
    );
    let hs_token = hs(&good);
    assert_eq!(
        ingest_status(&cloud, &hs_token, Some("ws_default")).await.0,
        StatusCode::UNAUTHORIZED
    );
}

/// Base64url without padding, for hand-made tokens.
mod base64_url {
    pub fn encode(bytes: &[u8]) -> String {
        const ALPHABET: &[u8; 64] =
            b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
        let mut out = String::new();
        for chunk in bytes.chunks(3) {
            let n = chunk
                .iter()
                .enumerate()
                .fold(0u32, |acc, (i, b)| acc | u32::from(*b) << (16 - 8 * i));
            for i in 0..=chunk.len() {
                out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
            }
        }
        out
    }
}
