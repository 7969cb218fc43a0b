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
    encode(prefix, value)
}

/// Ids of the same shape as [`new_id_at`]'s for the `n` items of a
/// request, made from `request` (its key and body, say) and each item's
/// position instead of the time and chance: the same request always gets
/// the same ids, so one sent again is given the ids of its first try (and
/// the store keeps one copy). 128 bits of the SHA-256 of the request's
/// parts, each preceded by its length so that no two lists of parts run
/// together, and the position. Such ids do not sort by time.
pub fn derived_ids(prefix: &str, request: &[&[u8]], n: usize) -> Vec<String> {
    use sha2::{Digest, Sha256};
    let mut base = Sha256::new();
    for part in request {
        base.update((part.len() as u64).to_le_bytes());
        base.update(part);
    }
    (0..n as u64)
        .map(|i| {
            let digest = base.clone().chain_update(i.to_le_bytes()).finalize();
            let mut top = [0u8; 16];
            top.copy_from_slice(&digest[..16]);
            encode(prefix, u128::from_be_bytes(top))
        })
        .collect()
}

/// `<prefix>_` and `value` in 26 Crockford base32 characters.
fn encode(prefix: &str, value: u128) -> String {
    let mut out = String::with_capacity(prefix.len() + 27);
    out.push_str(prefix);
    out.push('_');
    for i in (0..26).rev() {
        let digit = ((value >> (i * 5)) & 31) as usize;
        out.push(char::from(CROCKFORD[digit]));
    }
    out
}

/// Lower-case hex SHA-256 of a credential: what is kept in its place (the
/// cloud's API keys, the gateway's ingest tokens), so that a stolen store
/// or config file holds nothing to log in with.
pub fn credential_hash(secret: &str) -> String {
    use sha2::{Digest, Sha256};
    hex(&Sha256::digest(secret.as_bytes()))
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
    fn derived_ids_depend_on_every_part_its_bounds_and_the_position() {
        let ids = derived_ids("evt", &[b"key-1", b"body"], 2);
        assert!(ids.iter().all(|id| id.starts_with("evt_") && id.len() == 30), "{ids:?}");
        assert_ne!(ids[0], ids[1]);
        assert_eq!(ids, derived_ids("evt", &[b"key-1", b"body"], 2));
        assert_eq!(ids[..1], derived_ids("evt", &[b"key-1", b"body"], 1));
        assert_ne!(ids[0], derived_ids("evt", &[b"key-2", b"body"], 1)[0]);
        // Parts do not run together.
        assert_ne!(derived_ids("evt", &[b"ab", b"c"], 1), derived_ids("evt", &[b"a", b"bc"], 1));
    }

    #[test]
    fn hex_encodes() {
        assert_eq!(hex(&[0, 15, 255]), "000fff");
    }
}
