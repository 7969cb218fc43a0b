//! Small files replaced whole, so that a crash or a power cut leaves the
//! old content or the new, never a mix: written beside, synced, renamed
//! over, the directory synced (the buffer's cursor and id; the ingest
//! endpoint's journal takes the same steps when compacted, in two parts).

use std::fs::File;
use std::io::{self, Write};
use std::path::Path;

/// Replaces `path` with `bytes` through `tmp` (in the same directory).
pub(crate) fn replace(tmp: &Path, path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut file = File::create(tmp)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    drop(file);
    std::fs::rename(tmp, path)?;
    sync_parent(path)
}

/// fsyncs the directory that holds `path`, so that its rename lasts.
pub(crate) fn sync_parent(path: &Path) -> io::Result<()> {
    // A bare file name's parent is "", which cannot be opened: it means
    // the working directory.
    match path.parent() {
        Some(dir) if dir.as_os_str().is_empty() => sync_dir(Path::new(".")),
        Some(dir) => sync_dir(dir),
        None => Ok(()),
    }
}

/// fsyncs a directory so that creations, renames and deletions in it last.
pub(crate) fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_the_whole_file_and_leaves_no_temporary_behind() {
        let dir = tempfile::tempdir().unwrap();
        let (tmp, path) = (dir.path().join("f.tmp"), dir.path().join("f"));
        std::fs::write(&path, b"a longer old content").unwrap();
        replace(&tmp, &path, b"new").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"new");
        assert!(!tmp.exists());
    }
}
