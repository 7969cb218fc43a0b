//! One process per directory: the gateway's buffer and the cloud's
//! embedded store each hold an advisory lock (`flock`) on their directory
//! for as long as they are open.
//!
//! The lock is on the directory itself, so there is no file to create (a
//! full disk cannot stop a start), and the kernel releases it when the
//! process dies (SIGKILL and power cuts leave nothing to clean up).

use std::fs::{File, TryLockError};
use std::io;
use std::path::Path;

/// What trying to lock a directory found.
#[derive(Debug)]
pub enum DirLock {
    /// Locked until this handle is dropped.
    Held(File),
    /// Another process holds it.
    InUse,
    /// The directory cannot be locked here (it cannot be opened as a file,
    /// as on Windows, or the filesystem has no such locks): the caller
    /// decides whether to go on without.
    Unsupported(io::Error),
}

/// Tries to lock `dir` (which must exist) for this process, without
/// waiting.
pub fn try_lock_dir(dir: &Path) -> DirLock {
    let locked = File::open(dir).map_err(TryLockError::Error).and_then(|handle| {
        handle.try_lock()?;
        Ok(handle)
    });
    match locked {
        Ok(handle) => DirLock::Held(handle),
        Err(TryLockError::WouldBlock) => DirLock::InUse,
        Err(TryLockError::Error(e)) => DirLock::Unsupported(e),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn a_directory_is_held_once_until_released() {
        let dir = std::env::temp_dir().join(format!("opgraph-dir-lock-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let first = try_lock_dir(&dir);
        assert!(matches!(first, DirLock::Held(_)), "{first:?}");
        assert!(matches!(try_lock_dir(&dir), DirLock::InUse));
        drop(first);
        assert!(matches!(try_lock_dir(&dir), DirLock::Held(_)));
        let missing = try_lock_dir(&dir.join("missing"));
        assert!(matches!(missing, DirLock::Unsupported(_)), "{missing:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
