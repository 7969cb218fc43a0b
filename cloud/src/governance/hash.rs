//! Canonical JSON and SHA-256.
//!
//! The canonical form of a JSON value, used wherever a hash must not depend
//! on how a value happened to be serialized:
//!
//! - objects: keys sorted by their UTF-8 bytes (which is Unicode code point
//!   order), each key once, written `{"k":v,...}`;
//! - arrays in their order, `[a,b]`;
//! - no whitespace anywhere;
//! - strings escaped minimally: `"` and `\` with a backslash, the control
//!   characters U+0000 to U+001F as `\b \t \n \f \r` or `\u00XX` (lower-case
//!   hex), everything else as literal UTF-8;
//! - numbers: integers in decimal without exponent or `.0`; other numbers in
//!   the shortest form that reads back as the same IEEE 754 double (Rust's
//!   `ryu` as serde_json writes it, e.g. `100.0`, `0.1`, `1e+16`); a value read as
//!   a double stays a double (`100.0`, not `100`), which is stable across a
//!   store-and-reload round trip;
//! - `true`, `false`, `null` as themselves.
//!
//! Hashes are SHA-256, written as 64 lower-case hex digits.

use serde_json::Value;
use sha2::{Digest, Sha256};

/// The hash every chain starts from: the `prevHash` of a writer's first
/// receipt.
pub const GENESIS_HASH: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// The canonical JSON text of `value` (see the module documentation).
pub fn canonical_json(value: &Value) -> String {
    let mut out = String::with_capacity(256);
    write_canonical(&mut out, value);
    out
}

fn write_canonical(out: &mut String, value: &Value) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => out.push_str(&n.to_string()),
        Value::String(s) => write_string(out, s),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(out, item);
            }
            out.push(']');
        }
        Value::Object(map) => write_object(out, map.iter()),
    }
}

fn write_object<'a>(out: &mut String, entries: impl Iterator<Item = (&'a String, &'a Value)>) {
    let mut entries: Vec<(&String, &Value)> = entries.collect();
    entries.sort_unstable_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    out.push('{');
    for (i, (key, item)) in entries.into_iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        write_string(out, key);
        out.push(':');
        write_canonical(out, item);
    }
    out.push('}');
}

fn write_string(out: &mut String, s: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.push('"');
    // Copy runs of characters that need no escape in one go; every byte
    // that needs one is ASCII, so slicing at it stays on a char boundary.
    let mut start = 0;
    for (i, b) in s.bytes().enumerate() {
        let escape = match b {
            b'"' => "\\\"",
            b'\\' => "\\\\",
            0x08 => "\\b",
            b'\t' => "\\t",
            b'\n' => "\\n",
            0x0C => "\\f",
            b'\r' => "\\r",
            0x00..=0x1F => "",
            _ => continue,
        };
        out.push_str(&s[start..i]);
        if escape.is_empty() {
            out.push_str("\\u00");
            out.push(char::from(HEX[usize::from(b >> 4)]));
            out.push(char::from(HEX[usize::from(b & 15)]));
        } else {
            out.push_str(escape);
        }
        start = i + 1;
    }
    out.push_str(&s[start..]);
    out.push('"');
}

/// SHA-256 of `bytes`, raw.
pub fn sha256(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

/// SHA-256 of `bytes`, as 64 lower-case hex digits.
pub fn sha256_hex(bytes: &[u8]) -> String {
    crate::ids::hex(&sha256(bytes))
}

/// HMAC-SHA256 (RFC 2104) of `message` under `key`, raw: how destination
/// exports sign what they send. A dozen lines over `sha2` rather than one
/// more crate for one function.
pub fn hmac_sha256(key: &[u8], message: &[u8]) -> [u8; 32] {
    const BLOCK: usize = 64;
    let mut block = [0u8; BLOCK];
    if key.len() > BLOCK {
        block[..32].copy_from_slice(&sha256(key));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    let pad = |byte: u8| block.map(|b| b ^ byte);
    let inner = Sha256::new().chain_update(pad(0x36)).chain_update(message).finalize();
    Sha256::new().chain_update(pad(0x5c)).chain_update(inner).finalize().into()
}

/// SHA-256 of the canonical JSON of `value`.
pub fn canonical_hash(value: &Value) -> String {
    sha256_hex(canonical_json(value).as_bytes())
}

/// A receipt's `contentHash`: SHA-256 over the canonical JSON of the receipt
/// object without its `contentHash` key (every other key, `prevHash`
/// included, is covered).
pub fn content_hash(receipt: &Value) -> String {
    match receipt {
        // Skipped while writing rather than removed from a copy: a receipt
        // is hashed on the store's single writer thread, where copying the
        // whole object was a quarter of the sealing work.
        Value::Object(map) => {
            let mut out = String::with_capacity(2048);
            write_object(&mut out, map.iter().filter(|(key, _)| *key != "contentHash"));
            sha256_hex(out.as_bytes())
        }
        other => canonical_hash(other),
    }
}

/// Whether `text` looks like a hash this module writes.
pub fn is_hex_hash(text: &str) -> bool {
    text.len() == 64 && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn keys_are_sorted_and_whitespace_dropped() {
        let value: Value =
            serde_json::from_str(r#"{ "b": 1, "a": [true, null, {"d": "x", "c": 2.5}], "A": "" }"#)
                .unwrap();
        assert_eq!(canonical_json(&value), r#"{"A":"","a":[true,null,{"c":2.5,"d":"x"}],"b":1}"#);
    }

    #[test]
    fn key_order_is_by_code_point_not_insertion() {
        let a = json!({"z": 1, "é": 2, "a": 3});
        let b = json!({"a": 3, "z": 1, "é": 2});
        assert_eq!(canonical_json(&a), canonical_json(&b));
        assert_eq!(canonical_json(&a), "{\"a\":3,\"z\":1,\"é\":2}");
    }

    #[test]
    fn strings_are_escaped_minimally() {
        let value = json!("q\"b\\n\nt\tc\u{1}é€😀/");
        assert_eq!(canonical_json(&value), "\"q\\\"b\\\\n\\nt\\tc\\u0001é€😀/\"");
    }

    #[test]
    fn numbers_are_stable_across_a_round_trip() {
        let value = json!({"i": 100, "n": -7, "f": 100.0, "d": 0.1, "big": 1e16, "u": u64::MAX});
        let text = canonical_json(&value);
        assert_eq!(
            text,
            r#"{"big":1e+16,"d":0.1,"f":100.0,"i":100,"n":-7,"u":18446744073709551615}"#
        );
        let reparsed: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(canonical_json(&reparsed), text);
    }

    proptest::proptest! {
        /// Strings are written exactly as serde_json writes them, and read
        /// back unchanged.
        #[test]
        fn strings_match_serde_json(text in "\\PC*|[\\x00-\\x1f\"\\\\a-z]*") {
            let canonical = canonical_json(&Value::String(text.clone()));
            proptest::prop_assert_eq!(&canonical, &serde_json::to_string(&text).unwrap());
            let back: String = serde_json::from_str(&canonical).unwrap();
            proptest::prop_assert_eq!(back, text);
        }
    }

    #[test]
    fn hmac_sha256_matches_rfc_4231() {
        // Test case 2 (a short key) and 6 (a key longer than a block).
        assert_eq!(
            crate::ids::hex(&hmac_sha256(b"Jefe", b"what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        assert_eq!(
            crate::ids::hex(&hmac_sha256(
                &[0xaa; 131],
                b"Test Using Larger Than Block-Size Key - Hash Key First"
            )),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"
        );
    }

    #[test]
    fn sha256_of_canonical_text() {
        // SHA-256("{}"), computed independently.
        assert_eq!(
            canonical_hash(&json!({})),
            "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"
        );
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn content_hash_ignores_only_its_own_field() {
        let receipt = json!({"id": "rcp_1", "prevHash": GENESIS_HASH, "outcome": "allow"});
        let mut sealed = receipt.clone();
        sealed["contentHash"] = json!(content_hash(&receipt));
        assert_eq!(content_hash(&sealed), content_hash(&receipt));
        let mut tampered = sealed.clone();
        tampered["outcome"] = json!("deny");
        assert_ne!(content_hash(&tampered), content_hash(&receipt));
        assert!(is_hex_hash(&content_hash(&receipt)));
        let mut without = sealed.as_object().unwrap().clone();
        without.remove("contentHash");
        assert_eq!(content_hash(&sealed), canonical_hash(&Value::Object(without)));
    }
}
