//! Who is calling, and what they may reach.
//!
//! Two credentials arrive as `Authorization: Bearer ...`:
//! - API keys (`og_...`): only their SHA-256 is stored; the key implies its
//!   workspace and carries scopes.
//! - Enterprise JWTs, verified offline ([`jwt`]): the `workspaces` claim
//!   lists what the token may reach and `X-Opgraph-Workspace-ID` picks one.
//!
//! The result is a [`Principal`], which every handler receives and which
//! scopes every store call to one workspace.

pub mod jwt;

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::http::HeaderMap;
use rand::Rng;

use crate::error::{Error, Result};
use crate::store::{ApiKeyRecord, Store};

pub const WORKSPACE_HEADER: &str = "x-opgraph-workspace-id";
const KEY_PREFIX: &str = "og_";
const KEY_RANDOM_LEN: usize = 32;

/// What a credential allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scope {
    Ingest,
    Read,
    Govern,
    Export,
    Admin,
    /// Creates workspaces; only the bootstrap key has it.
    Operator,
}

impl Scope {
    /// The scopes a new key gets unless narrowed.
    pub const DEFAULT: [Scope; 5] =
        [Scope::Ingest, Scope::Read, Scope::Govern, Scope::Export, Scope::Admin];
    pub const GRANTABLE: [&'static str; 5] = ["ingest", "read", "govern", "export", "admin"];

    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Ingest => "ingest",
            Scope::Read => "read",
            Scope::Govern => "govern",
            Scope::Export => "export",
            Scope::Admin => "admin",
            Scope::Operator => "operator",
        }
    }

    pub fn parse(s: &str) -> Option<Scope> {
        Some(match s {
            "ingest" => Scope::Ingest,
            "read" => Scope::Read,
            "govern" => Scope::Govern,
            "export" => Scope::Export,
            "admin" => Scope::Admin,
            "operator" => Scope::Operator,
            _ => return None,
        })
    }
}

/// An authenticated caller, bound to one workspace.
#[derive(Debug, Clone)]
pub struct Principal {
    pub workspace_id: String,
    pub scopes: Vec<Scope>,
    /// `key_...` for API keys, `jwt:<sub>` for tokens: who wrote a record.
    pub subject: String,
}

impl Principal {
    pub fn require(&self, scope: Scope) -> Result<()> {
        if self.scopes.contains(&scope) {
            Ok(())
        } else {
            Err(Error::Forbidden(format!("this credential lacks the `{}` scope", scope.as_str())))
        }
    }
}

/// A fresh API key: `og_` and 32 random base62 characters (190 bits).
pub fn generate_api_key() -> String {
    const ALPHABET: &[u8] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    let mut rng = rand::rng();
    let random: String = (0..KEY_RANDOM_LEN)
        .map(|_| char::from(ALPHABET[rng.random_range(0..ALPHABET.len())]))
        .collect();
    format!("{KEY_PREFIX}{random}")
}

pub fn looks_like_api_key(key: &str) -> bool {
    key.strip_prefix(KEY_PREFIX)
        .is_some_and(|rest| rest.len() >= 20 && rest.bytes().all(|b| b.is_ascii_alphanumeric()))
}

/// Lower-case hex SHA-256: what the store keeps instead of the key.
pub use opgraph_proto::ids::credential_hash as hash_key;

/// The first characters of a key, safe to show in listings.
pub fn key_hint(key: &str) -> String {
    key.chars().take(KEY_PREFIX.len() + 4).collect()
}

/// Turns request headers into a [`Principal`].
///
/// API-key lookups are cached briefly so that the hot ingest path does not
/// hit the store per request; revocation through this node clears the cache
/// at once, and other nodes see it within `KEY_CACHE_TTL`.
pub struct Authenticator {
    jwt: Option<jwt::JwtVerifier>,
    cache: Mutex<KeyCache>,
}

/// Key records by hash, read at an instant, and how often the cache was
/// cleared: a lookup that read the store before a clear must not put what
/// it read back after it (a key revoked meanwhile would pass again).
#[derive(Default)]
struct KeyCache {
    records: HashMap<String, (Instant, Option<ApiKeyRecord>)>,
    clears: u64,
}

const KEY_CACHE_TTL: Duration = Duration::from_secs(5);
const KEY_CACHE_MAX: usize = 10_000;

impl Authenticator {
    pub fn new(jwt: Option<jwt::JwtVerifier>) -> Self {
        Authenticator { jwt, cache: Mutex::new(KeyCache::default()) }
    }

    pub fn jwt_mode(&self) -> Option<&'static str> {
        self.jwt.as_ref().map(jwt::JwtVerifier::mode)
    }

    pub fn forget_cached_keys(&self) {
        if let Ok(mut cache) = self.cache.lock() {
            cache.records.clear();
            cache.clears += 1;
        }
    }

    pub async fn authenticate(&self, headers: &HeaderMap, store: &dyn Store) -> Result<Principal> {
        let value = headers
            .get(axum::http::header::AUTHORIZATION)
            .ok_or(Error::Unauthorized("missing Authorization header"))?;
        let value =
            value.to_str().map_err(|_| Error::Unauthorized("malformed Authorization header"))?;
        let credential = value
            .strip_prefix("Bearer ")
            .or_else(|| value.strip_prefix("bearer "))
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .ok_or(Error::Unauthorized("expected `Authorization: Bearer <credential>`"))?;
        let requested = match headers.get(WORKSPACE_HEADER) {
            None => None,
            Some(v) => Some(
                v.to_str()
                    .map_err(|_| Error::validation(WORKSPACE_HEADER, "must be visible ASCII"))?
                    .trim()
                    .to_owned(),
            ),
        };
        if credential.starts_with(KEY_PREFIX) {
            let record = self.lookup_key(credential, store).await?;
            let record = record.ok_or(Error::Unauthorized("unknown or revoked API key"))?;
            if let Some(ws) = requested.filter(|ws| *ws != record.workspace_id) {
                return Err(Error::Forbidden(format!(
                    "this API key belongs to another workspace than {ws:?}"
                )));
            }
            Ok(Principal {
                workspace_id: record.workspace_id,
                scopes: record.scopes,
                subject: record.id,
            })
        } else {
            let verifier = self.jwt.as_ref().ok_or(Error::Unauthorized("unknown credential"))?;
            let claims = verifier.verify(credential)?;
            let workspace_id = requested.ok_or(Error::MissingWorkspaceHeader)?;
            if !claims.workspaces.contains(&workspace_id) {
                return Err(Error::Forbidden(format!(
                    "the token does not grant workspace {workspace_id:?}"
                )));
            }
            if !store.workspace_exists(&workspace_id).await? {
                return Err(Error::Forbidden(format!("unknown workspace {workspace_id:?}")));
            }
            Ok(Principal { workspace_id, scopes: claims.scopes, subject: claims.subject })
        }
    }

    async fn lookup_key(&self, key: &str, store: &dyn Store) -> Result<Option<ApiKeyRecord>> {
        if !looks_like_api_key(key) {
            return Ok(None);
        }
        let hash = hash_key(key);
        let clears = match self.cached(&hash) {
            Ok(record) => return Ok(record),
            Err(clears) => clears,
        };
        let record = store.find_api_key(&hash).await?;
        self.cache_read(hash, record.clone(), clears);
        Ok(record)
    }

    /// The cached record of `hash` while fresh; else how often the cache
    /// had been cleared before the store is read (`None`: unusable cache).
    fn cached(&self, hash: &str) -> std::result::Result<Option<ApiKeyRecord>, Option<u64>> {
        let Ok(cache) = self.cache.lock() else { return Err(None) };
        match cache.records.get(hash) {
            Some((at, record)) if at.elapsed() < KEY_CACHE_TTL => Ok(record.clone()),
            _ => Err(Some(cache.clears)),
        }
    }

    /// Caches what the store said of `hash`, unless the cache was cleared
    /// since the read began (`clears` then differs): the read may predate
    /// a revocation.
    fn cache_read(&self, hash: String, record: Option<ApiKeyRecord>, clears: Option<u64>) {
        if let Ok(mut cache) = self.cache.lock()
            && Some(cache.clears) == clears
        {
            if cache.records.len() >= KEY_CACHE_MAX {
                cache.records.clear();
            }
            cache.records.insert(hash, (Instant::now(), record));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_keys_are_well_formed_and_distinct() {
        let a = generate_api_key();
        let b = generate_api_key();
        assert!(looks_like_api_key(&a), "{a}");
        assert_ne!(a, b);
        assert_eq!(hash_key(&a).len(), 64);
    }

    #[test]
    fn key_shape_is_checked() {
        assert!(!looks_like_api_key("og_short"));
        assert!(!looks_like_api_key("xx_0123456789012345678901"));
        assert!(!looks_like_api_key("og_01234567890123456789-!"));
    }

    /// A lookup that read the store before a revocation cleared the cache
    /// must not put what it read back afterwards.
    #[test]
    fn a_read_that_predates_a_revocation_is_not_cached() {
        let auth = Authenticator::new(None);
        let record = ApiKeyRecord {
            id: "key_1".into(),
            workspace_id: "ws_1".into(),
            name: "k".into(),
            hint: "og_a".into(),
            scopes: vec![Scope::Ingest],
            created_at: 0,
            revoked_at: None,
        };
        let Err(before) = auth.cached("h") else { panic!("nothing cached yet") };
        auth.forget_cached_keys(); // the revocation, while the read runs
        auth.cache_read("h".into(), Some(record.clone()), before);
        assert!(auth.cached("h").is_err(), "the stale read was cached");
        // A read that began after it is cached as usual.
        let Err(after) = auth.cached("h") else { panic!("nothing cached yet") };
        auth.cache_read("h".into(), Some(record.clone()), after);
        let cached = auth.cached("h").ok().flatten().map(|r| r.id);
        assert_eq!(cached.as_deref(), Some("key_1"));
    }

    #[test]
    fn sha256_matches_known_vector() {
        assert_eq!(
            hash_key("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
