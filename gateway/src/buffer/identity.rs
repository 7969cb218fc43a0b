//! The buffer directory's identity, sent with every Hello.
//!
//! Made once, when the directory is new, and kept in it (`buffer-id`). The
//! cloud keys a gateway's acknowledgements by it: a new identity means the
//! buffer's sequence numbers start over, so the cloud's acknowledgement
//! starts over too, and event ids keep what it already stored from being
//! stored twice. The shipper renews it when it finds the buffer rolled back
//! behind what the cloud acknowledged (a restored disk snapshot, a power cut
//! under `fsync = "never"`): the numbers it hands out next were already
//! acknowledged under the old identity.

use std::path::Path;

use crate::error::{Error, Result};

const BUFFER_ID_FILE: &str = "buffer-id";
/// Longer content is not an id of ours.
const MAX_ID_LEN: usize = 64;

/// The directory's identity, made (and stored) when it has none.
pub fn load_or_create(dir: &Path) -> Result<String> {
    let path = dir.join(BUFFER_ID_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) if !text.trim().is_empty() && text.trim().len() <= MAX_ID_LEN => {
            return Ok(text.trim().to_owned());
        }
        Ok(_) => tracing::warn!(path = %path.display(), "unreadable buffer id: making a new one"),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(source) => return Err(Error::Io { op: "read", path, source }),
    }
    renew(dir)
}

/// Replaces the directory's identity by a new one, durably, and returns it.
/// Nothing may be sent under the new identity before this returned: a
/// crash in between must find either the old identity or the new one.
pub fn renew(dir: &Path) -> Result<String> {
    let path = dir.join(BUFFER_ID_FILE);
    let id = new_id();
    let tmp = dir.join(format!("{BUFFER_ID_FILE}.tmp"));
    crate::durable::replace(&tmp, &path, id.as_bytes()).map_err(|source| Error::Io {
        op: "write",
        path: path.clone(),
        source,
    })?;
    Ok(id)
}

/// A fresh identity (`buf_...`), unique per directory and moment.
pub fn new_id() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
    opgraph_proto::ids::new_id_at("buf", now)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_across_loads_and_replaced_by_renew() {
        let dir = tempfile::tempdir().unwrap();
        let first = load_or_create(dir.path()).unwrap();
        assert!(first.starts_with("buf_"), "{first}");
        assert_eq!(load_or_create(dir.path()).unwrap(), first);
        let renewed = renew(dir.path()).unwrap();
        assert_ne!(renewed, first);
        assert_eq!(load_or_create(dir.path()).unwrap(), renewed);
    }
}
