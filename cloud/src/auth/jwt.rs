//! Enterprise tokens: JWTs checked offline against one configured key source.
//!
//! Exactly one algorithm family is accepted per deployment (HS256 with a
//! secret, RS256/ES256 with a PEM public key, or RS256/ES256 keys from a JWKS
//! file chosen by `kid`). Pinning the algorithm to the key closes the classic
//! confusion attacks (`alg: none`, HS256 signed with a public key).

use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{Algorithm, DecodingKey, Validation, decode, decode_header};
use serde::Deserialize;

use super::Scope;
use crate::config::JwtConfig;
use crate::error::{Error, Result};

enum KeySource {
    Single { key: DecodingKey, algorithm: Algorithm },
    Jwks(JwkSet),
}

pub struct JwtVerifier {
    source: KeySource,
    issuer: Option<String>,
    audience: Option<String>,
}

/// What a verified token grants.
#[derive(Debug, Clone)]
pub struct TokenClaims {
    pub subject: String,
    pub workspaces: Vec<String>,
    pub scopes: Vec<Scope>,
}

#[derive(Deserialize)]
struct RawClaims {
    sub: Option<String>,
    #[serde(default)]
    workspaces: Vec<String>,
    /// OAuth style: space-separated scopes. Absent: every scope but `admin`.
    scope: Option<String>,
}

impl JwtVerifier {
    /// Builds the verifier from config; `Ok(None)` when tokens are disabled.
    pub fn from_config(config: &JwtConfig) -> anyhow::Result<Option<JwtVerifier>> {
        let source = if let Some(secret) = &config.secret {
            KeySource::Single {
                key: DecodingKey::from_secret(secret.as_bytes()),
                algorithm: Algorithm::HS256,
            }
        } else if let Some(path) = &config.public_key_file {
            let pem = std::fs::read(path)
                .map_err(|e| anyhow::anyhow!("auth.jwt.public_key_file {}: {e}", path.display()))?;
            if let Ok(key) = DecodingKey::from_rsa_pem(&pem) {
                KeySource::Single { key, algorithm: Algorithm::RS256 }
            } else if let Ok(key) = DecodingKey::from_ec_pem(&pem) {
                KeySource::Single { key, algorithm: Algorithm::ES256 }
            } else {
                anyhow::bail!(
                    "auth.jwt.public_key_file {}: not an RSA or EC P-256 public key in PEM",
                    path.display()
                );
            }
        } else if let Some(path) = &config.jwks_file {
            let text = std::fs::read_to_string(path)
                .map_err(|e| anyhow::anyhow!("auth.jwt.jwks_file {}: {e}", path.display()))?;
            let set: JwkSet = serde_json::from_str(&text)
                .map_err(|e| anyhow::anyhow!("auth.jwt.jwks_file {}: {e}", path.display()))?;
            if set.keys.is_empty() {
                anyhow::bail!("auth.jwt.jwks_file {}: holds no keys", path.display());
            }
            KeySource::Jwks(set)
        } else {
            return Ok(None);
        };
        Ok(Some(JwtVerifier {
            source,
            issuer: config.issuer.clone(),
            audience: config.audience.clone(),
        }))
    }

    /// A short description for the health endpoint (never the key itself).
    pub fn mode(&self) -> &'static str {
        match &self.source {
            KeySource::Single { algorithm: Algorithm::HS256, .. } => "hs256",
            KeySource::Single { algorithm: Algorithm::RS256, .. } => "rs256",
            KeySource::Single { .. } => "es256",
            KeySource::Jwks(_) => "jwks",
        }
    }

    pub fn verify(&self, token: &str) -> Result<TokenClaims> {
        let header = decode_header(token).map_err(|_| Error::Unauthorized("malformed token"))?;
        let (key, algorithm) = match &self.source {
            KeySource::Single { key, algorithm } => (key.clone(), *algorithm),
            KeySource::Jwks(set) => {
                if !matches!(header.alg, Algorithm::RS256 | Algorithm::ES256) {
                    return Err(Error::Unauthorized("token algorithm not accepted"));
                }
                let kid = header.kid.as_deref().ok_or(Error::Unauthorized("token has no kid"))?;
                let jwk = set.find(kid).ok_or(Error::Unauthorized("unknown token key id"))?;
                let key = DecodingKey::from_jwk(jwk)
                    .map_err(|_| Error::Unauthorized("unusable token key"))?;
                (key, header.alg)
            }
        };
        if header.alg != algorithm {
            return Err(Error::Unauthorized("token algorithm not accepted"));
        }
        let mut validation = Validation::new(algorithm);
        validation.validate_nbf = true;
        validation.leeway = 30;
        match &self.issuer {
            Some(iss) => validation.set_issuer(&[iss]),
            None => validation.iss = None,
        }
        match &self.audience {
            Some(aud) => validation.set_audience(&[aud]),
            None => validation.validate_aud = false,
        }
        // jsonwebtoken checks `iss` and `aud` only when the token carries
        // them: a configured one must be there, or a token the same
        // provider minted for another service would pass.
        let mut required = vec!["exp"];
        required.extend(self.issuer.as_ref().map(|_| "iss"));
        required.extend(self.audience.as_ref().map(|_| "aud"));
        validation.set_required_spec_claims(&required);
        let data = decode::<RawClaims>(token, &key, &validation).map_err(|e| {
            use jsonwebtoken::errors::ErrorKind;
            Error::Unauthorized(match e.kind() {
                ErrorKind::ExpiredSignature => "token expired",
                ErrorKind::ImmatureSignature => "token not yet valid",
                ErrorKind::InvalidIssuer => "token issuer not accepted",
                ErrorKind::InvalidAudience => "token audience not accepted",
                ErrorKind::InvalidSignature => "token signature invalid",
                ErrorKind::MissingRequiredClaim(claim) if claim == "iss" => "token has no issuer",
                ErrorKind::MissingRequiredClaim(claim) if claim == "aud" => "token has no audience",
                _ => "invalid token",
            })
        })?;
        let claims = data.claims;
        let scopes = match claims.scope {
            None => vec![Scope::Ingest, Scope::Read, Scope::Govern, Scope::Export],
            Some(list) => {
                // Unknown scope names are ignored so that identity providers
                // may carry scopes meant for other services.
                let mut scopes: Vec<Scope> = list
                    .split_whitespace()
                    .filter_map(Scope::parse)
                    .filter(|s| *s != Scope::Operator)
                    .collect();
                scopes.sort();
                scopes.dedup();
                scopes
            }
        };
        let subject = format!("jwt:{}", claims.sub.unwrap_or_else(|| "anonymous".into()));
        Ok(TokenClaims { subject, workspaces: claims.workspaces, scopes })
    }
}
