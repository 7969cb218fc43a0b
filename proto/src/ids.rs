//! Opaque, prefixed identifiers (`evt_...`, `key_...`) and hex encoding,
//! shared by the cloud and the gateway so both mint ids of one shape.
//!
//! Ids are ULID-shaped: 48 bits of milliseconds then 80 random bits, in
//! Crockford base32. Sorting ids sorts them by creation time, which keeps
//! index inserts append-mostly, and 80 random bits make collisions within a
//! millisecond negligible. Within one process ids are also strictly
//! increasing (ULID's monotonic mode): an id made in the same millisecond
//! as the previous one, or after the clock stepped back, is the previous
//! one plus one, so "newest first" orders by id even for ids made within a
//! millisecond. The caller passes the time in (no clocks here).

use std::sync::Mutex;

use rand::Rng;

/// The last id made by this process, as a number.
static LAST: Mutex<u128> = Mutex::new(0);

const CROCKFORD: &[u8; 32] = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ";

/// A new id `<prefix>_<26 base32 characters>` for the time `ms` (ms since
/// the Unix epoch; negative reads as 0).
pub fn new_id_at(prefix: &str, ms: i64) -> String {
    let random: u128 = rand::rng().random::<u128>() & ((1u128 << 80) - 1);
    let fresh = ((ms.max(0) as u128 & ((1u128 << 48) - 1)) << 80) | random;
    let value = {
        // A poisoned lock still holds a valid last id.
        let mut last = LAST.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        *last = if fresh > *last { fresh } else { last.saturating_add(1) };
        *last
    };
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
    fn ids_of_one_millisecond_sort_in_creation_order() {
        let ids: Vec<String> = (0..1000).map(|_| new_id_at("trk", 7_000)).collect();
        assert!(ids.windows(2).all(|w| w[0] < w[1]), "{ids:?}");
        // A clock that steps back does not make an older-sorting id.
        let later = new_id_at("trk", 6_000);
        assert!(later > ids[999], "{later}");
    }

    #[test]
    fn hex_encodes() {
        assert_eq!(hex(&[0, 15, 255]), "000fff");
    }
}
