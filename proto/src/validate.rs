//! Parsing and validating a JSON envelope: the only way into [`Event`] from
//! outside (the protobuf path goes through here too, see `convert`).
//!
//! Walks the `serde_json::Value` by hand rather than through serde derive so
//! every error names its JSON path. Never panics; work is bounded by the
//! input size (serde_json's parser already caps nesting at 128 levels).
//!
//! Decisions beyond the API contract:
//! - A top-level `null` is read as absent (SDKs often serialize `None` as
//!   `null`); `"event": null` is therefore "is required".
//! - Every string field must be non-empty: an empty id means nothing, and
//!   accepting it would make "absent" and "empty" two spellings of one thing.
//! - Lengths are counted in characters (Unicode scalar values), not bytes.
//! - A party object's other keys share the free-object size limit.

use std::io;

use serde_json::Value;

use crate::error::{Result, ValidationError};
use crate::event::{Event, JsonObject, Party, TrustTier};

/// Longest `event` name, in characters.
pub const MAX_EVENT_NAME_LEN: usize = 200;
/// Longest `businessId`, `traceId`, `decisionId`, `proofId` or `messageId`,
/// in characters.
pub const MAX_ID_LEN: usize = 200;
/// Longest party string (`"actor": "..."`) or party `type` / `id`, in
/// characters; longer than other ids because objects are often URLs.
pub const MAX_PARTY_LEN: usize = 512;
/// Largest free object (`properties`, `context`, ...) or set of a party's
/// extra keys, in bytes of compact JSON.
pub const MAX_FREE_OBJECT_BYTES: usize = 64 * 1024;
/// How far before the receive time a `timestamp` may be: 10 years of
/// 365.25 days.
pub const MAX_TIMESTAMP_AGE_MS: i64 = 3_652 * DAY_MS + DAY_MS / 2;
/// How far after the receive time a `timestamp` may be: 1 day of clock skew.
pub const MAX_TIMESTAMP_LEAD_MS: i64 = DAY_MS;

const DAY_MS: i64 = 24 * 60 * 60 * 1000;

/// Every top-level key of the envelope, in the spec's order.
pub const ENVELOPE_FIELDS: [&str; 18] = [
    "event",
    "businessId",
    "actor",
    "object",
    "entity",
    "traceId",
    "source",
    "attribution",
    "context",
    "trackable",
    "decisionId",
    "proofId",
    "outcome",
    "trustTier",
    "complianceMapping",
    "properties",
    "timestamp",
    "messageId",
];

impl Event {
    /// Parses and validates one envelope received at `now_ms` (ms since the
    /// Unix epoch), per the API contract's "Ingest" rules.
    pub fn from_json(value: &Value, now_ms: i64) -> Result<Self> {
        Self::from_value(value.clone(), now_ms)
    }

    /// [`Event::from_json`] for an envelope the caller owns: its strings and
    /// objects move into the event instead of being copied, which is most
    /// of the work at gateway and receiver rates.
    pub fn from_value(value: Value, now_ms: i64) -> Result<Self> {
        let event = Self::parse_value(value)?;
        event.check_timestamp(now_ms)?;
        Ok(event)
    }

    /// Like [`Event::from_json`] but without the timestamp window, which
    /// depends on when the envelope was received: for reading back envelopes
    /// that were validated at ingest.
    pub fn parse_json(value: &Value) -> Result<Self> {
        Self::parse_value(value.clone())
    }

    /// [`Event::parse_json`] for an envelope the caller owns.
    pub fn parse_value(value: Value) -> Result<Self> {
        let Value::Object(mut body) = value else {
            return Err(ValidationError::new("", "the event envelope must be a JSON object"));
        };
        if let Some(key) = body.keys().find(|k| !ENVELOPE_FIELDS.contains(&k.as_str())) {
            return Err(ValidationError::new(key.as_str(), "is not an envelope field"));
        }
        // Fields are taken in this order so that the first error reported
        // is the same whatever order the keys arrived in.
        let event = match take(&mut body, "event") {
            Some(v) => string(v, "event", MAX_EVENT_NAME_LEN)?,
            None => return Err(ValidationError::new("event", "is required")),
        };
        let id = |body: &mut JsonObject, key: &str| opt(body, key, |v| string(v, key, MAX_ID_LEN));
        let who = |body: &mut JsonObject, key: &str| {
            opt(body, key, |v| party(v).map_err(|e| e.within(key)))
        };
        let free = |body: &mut JsonObject, key: &str| opt(body, key, |v| free_object(v, key));
        let business_id = id(&mut body, "businessId")?;
        let actor = who(&mut body, "actor")?;
        let object = who(&mut body, "object")?;
        let entity = free(&mut body, "entity")?;
        let trace_id = id(&mut body, "traceId")?;
        let source = free(&mut body, "source")?;
        let attribution = free(&mut body, "attribution")?;
        let context = free(&mut body, "context")?;
        let trackable = free(&mut body, "trackable")?;
        let decision_id = id(&mut body, "decisionId")?;
        let proof_id = id(&mut body, "proofId")?;
        let outcome = free(&mut body, "outcome")?;
        let trust_tier = opt(&mut body, "trustTier", trust_tier)?;
        let compliance_mapping = free(&mut body, "complianceMapping")?;
        let properties = free(&mut body, "properties")?;
        let timestamp = opt(&mut body, "timestamp", timestamp)?;
        let message_id = id(&mut body, "messageId")?;
        Ok(Self {
            event,
            business_id,
            actor,
            object,
            entity,
            trace_id,
            source,
            attribution,
            context,
            trackable,
            decision_id,
            proof_id,
            outcome,
            trust_tier,
            compliance_mapping,
            properties,
            timestamp,
            message_id,
        })
    }

    /// Checks that `timestamp`, when present, lies within
    /// [`MAX_TIMESTAMP_AGE_MS`] before and [`MAX_TIMESTAMP_LEAD_MS`] after
    /// `now_ms`.
    pub fn check_timestamp(&self, now_ms: i64) -> Result<()> {
        let Some(ts) = self.timestamp else {
            return Ok(());
        };
        if ts < now_ms.saturating_sub(MAX_TIMESTAMP_AGE_MS) {
            return Err(ValidationError::new(
                "timestamp",
                "must not be more than 10 years before the time of receipt",
            ));
        }
        if ts > now_ms.saturating_add(MAX_TIMESTAMP_LEAD_MS) {
            return Err(ValidationError::new(
                "timestamp",
                "must not be more than 1 day after the time of receipt",
            ));
        }
        Ok(())
    }

    /// Checks an envelope built in code against the same rules as
    /// [`Event::from_json`] (e.g. before a gateway buffers it).
    pub fn validate(&self, now_ms: i64) -> Result<()> {
        Self::from_value(self.to_json(), now_ms).map(drop)
    }
}

/// The value at `key`, taken out of `body`, with `null` read as absent.
fn take(body: &mut JsonObject, key: &str) -> Option<Value> {
    body.remove(key).filter(|v| !v.is_null())
}

fn opt<T>(
    body: &mut JsonObject,
    key: &str,
    parse: impl FnOnce(Value) -> Result<T>,
) -> Result<Option<T>> {
    take(body, key).map(parse).transpose()
}

/// A non-empty string of at most `max` characters.
fn string(v: Value, path: &str, max: usize) -> Result<String> {
    let Value::String(s) = v else {
        return Err(ValidationError::new(path, "must be a string"));
    };
    if s.is_empty() {
        return Err(ValidationError::new(path, "must not be empty"));
    }
    if s.chars().nth(max).is_some() {
        return Err(ValidationError::new(path, format!("must be at most {max} characters")));
    }
    Ok(s)
}

/// A JSON object of at most [`MAX_FREE_OBJECT_BYTES`] as compact JSON.
fn free_object(v: Value, path: &str) -> Result<JsonObject> {
    let Value::Object(map) = v else {
        return Err(ValidationError::new(path, "must be a JSON object"));
    };
    check_size(&map, path)?;
    Ok(map)
}

fn check_size(map: &JsonObject, path: &str) -> Result<()> {
    if fits_in(map, MAX_FREE_OBJECT_BYTES) {
        Ok(())
    } else {
        Err(ValidationError::new(
            path,
            format!("must be at most {MAX_FREE_OBJECT_BYTES} bytes as JSON"),
        ))
    }
}

/// Whether `map` serializes to at most `limit` bytes. Most objects are far
/// below the limit, and a bound on their size from lengths alone settles
/// them ([`SizeBound`]): serializing them to count was a sixth of the
/// gateway's work per MQTT message. One the bound cannot settle is
/// serialized, stopping as soon as it is over, so an oversized object
/// costs at most `limit` bytes of work.
fn fits_in(map: &JsonObject, limit: usize) -> bool {
    (SizeBound { left: limit }).object(map).is_some()
        || serde_json::to_writer(Budget(limit), map).is_ok()
}

/// Whether `value`, any JSON value, serializes to at most `limit` bytes
/// of compact JSON, settled the way an event's free objects are: the
/// bound other APIs put on the free-form JSON they take (governance's
/// `proposedAction`, say).
pub fn value_fits_in(value: &Value, limit: usize) -> bool {
    (SizeBound { left: limit }).value(value).is_some()
        || serde_json::to_writer(Budget(limit), value).is_ok()
}

/// A writer that fails once more than its budget was written.
struct Budget(usize);

impl io::Write for Budget {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0 = self.0.checked_sub(buf.len()).ok_or_else(|| io::Error::other("over budget"))?;
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Longest compact JSON of a number: an `f64` in shortest form, such as
/// `-2.2250738585072014e-308` (24), or an `i64` or `u64` (20).
const MAX_NUMBER_LEN: usize = 24;

/// Spends at least the compact JSON size of values from `left`; `None` once
/// that may exceed it. A string costs its quotes and six bytes per byte (a
/// control character becomes `\u00XX`; nothing else grows), a number
/// [`MAX_NUMBER_LEN`], and each member or element a separator.
struct SizeBound {
    left: usize,
}

impl SizeBound {
    fn spend(&mut self, bytes: usize) -> Option<()> {
        self.left = self.left.checked_sub(bytes)?;
        Some(())
    }

    fn string(&mut self, s: &str) -> Option<()> {
        self.spend(s.len().checked_mul(6)?.checked_add(2)?)
    }

    fn object(&mut self, map: &JsonObject) -> Option<()> {
        // Braces, and a colon and a comma per member.
        self.spend(map.len().checked_mul(2)?.checked_add(2)?)?;
        map.iter().try_for_each(|(key, value)| {
            self.string(key)?;
            self.value(value)
        })
    }

    fn value(&mut self, value: &Value) -> Option<()> {
        match value {
            Value::Null | Value::Bool(_) => self.spend(5),
            Value::Number(_) => self.spend(MAX_NUMBER_LEN),
            Value::String(s) => self.string(s),
            Value::Array(items) => {
                self.spend(items.len().checked_add(2)?)?;
                items.iter().try_for_each(|item| self.value(item))
            }
            Value::Object(map) => self.object(map),
        }
    }
}

/// A party; errors are relative to the party (`type`, not `actor.type`).
fn party(v: Value) -> Result<Party> {
    match v {
        Value::String(_) => Ok(Party::Name(string(v, "", MAX_PARTY_LEN)?)),
        Value::Object(mut extra) => {
            let mut required = |key: &str| match take(&mut extra, key) {
                Some(v) => string(v, key, MAX_PARTY_LEN),
                None => Err(ValidationError::new(key, "is required")),
            };
            let kind = required("type")?;
            let id = required("id")?;
            check_size(&extra, "")?;
            Ok(Party::Ref { kind, id, extra })
        }
        _ => Err(ValidationError::new(
            "",
            "must be a string or an object with string `type` and `id`",
        )),
    }
}

fn trust_tier(v: Value) -> Result<TrustTier> {
    match v {
        Value::String(s) => s.parse(),
        _ => Err(ValidationError::new("trustTier", "must be one of T0, T1, T2, T3, T4")),
    }
}

/// An integer number of ms; `1.7e12` and `"1700000000000"` are refused so
/// that a wrong unit or type is caught rather than guessed at.
fn timestamp(v: Value) -> Result<i64> {
    let fail = |message: &str| Err(ValidationError::new("timestamp", message));
    match v {
        Value::Number(n) => match n.as_i64() {
            Some(ms) => Ok(ms),
            None if n.is_u64() => fail("is out of range for milliseconds since the Unix epoch"),
            None => fail("must be an integer number of milliseconds since the Unix epoch"),
        },
        _ => fail("must be an integer number of milliseconds since the Unix epoch"),
    }
}

#[cfg(test)]
mod tests;
