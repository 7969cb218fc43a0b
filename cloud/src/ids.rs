//! Opaque, prefixed identifiers (`evt_...`, `key_...`) and hex encoding:
//! [`opgraph_proto::ids`] (shared with the gateway) on the cloud's clock.

pub use opgraph_proto::ids::{hex, new_id_at};

/// A new id with `prefix`, minted now.
pub fn new_id(prefix: &str) -> String {
    new_id_at(prefix, crate::now_ms())
}
