//! Opaque, prefixed identifiers (`evt_...`, `key_...`) and hex encoding,
//! shared by the cloud and the gateway so both mint ids of one shape.
//!
//! Ids are ULID-shaped: 48 bits of milliseconds then 80 random bits, in
//! Crockford base32. Sorting ids sorts them by creation time, which keeps
//! index inserts append-mostly, and 80 random bits make collisions within a
//! millisecond negligible. The caller passes the time in (no clocks here).

use rand::Rng;

const CROCKFORD: &[u8; 32] = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ";

/// A new id `<prefix>_<26 base32 characters>` for the time `ms` (ms since
/// the Unix epoch; negative reads as 0).
pub fn new_id_at(prefix: &str, ms: i64) -> String {
    let random: u128 = rand::rng().random::<u128>() & ((1u128 << 80) - 1);
    let value = ((ms.max(0) as u128 & ((1u128 << 48) - 1)) << 80) | random;
    let mut out = String::with_capacity(prefix.len() + 27);
    out.push_str(prefix);
    out.push('_');
    for i in (0..26).rev() {
        let digit = ((value >> (i * 5)) & 31) as usize;
        out.push(char::from(CROCKFORD[digit]));
    }
    out
}

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 15)]));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_sort_by_time_and_carry_prefix() {
        let a = new_id_at("evt", 1_000);
        let b = new_id_at("evt", 2_000);
        assert!(a.starts_with("evt_") && a.len() == 30, "{a}");
        assert!(a < b);
        assert_ne!(new_id_at("evt", 5), new_id_at("evt", 5));
    }

    #[test]
    fn hex_encodes() {
        assert_eq!(hex(&[0, 15, 255]), "000fff");
    }
}
