//! Power cuts on a real file system: ext4 on a loop device over an image
//! file. [`LoopDisk::cut`] copies the image as the "disk" holds it at that
//! instant (what was synced, and whatever the kernel wrote back on its
//! own, which within a test's seconds is next to nothing) and mounts the
//! copy, whose journal ext4 replays as after a power cut; the run that
//! goes on there is the one after the power came back. Needs root (mount,
//! loop devices) and e2fsprogs.
//!
//! Self-contained (std and tempfile only) so that the gateway's own unit
//! tests can include it with `#[path]`: they cannot depend on this crate,
//! which depends on the gateway.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A mounted ext4 image, unmounted on drop.
pub struct LoopDisk {
    /// Holds the image and the mount point; removed after the unmount.
    _dir: tempfile::TempDir,
    image: PathBuf,
    mount: PathBuf,
}

impl LoopDisk {
    /// A fresh file system of `mib` MiB (sparse), mounted; `Err` says why
    /// not (not root, no loop device, no mkfs.ext4).
    pub fn format(mib: u64) -> Result<LoopDisk, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let image = dir.path().join("disk.img");
        let file = std::fs::File::create(&image).map_err(|e| e.to_string())?;
        file.set_len(mib << 20).map_err(|e| e.to_string())?;
        // Everything initialised now: no lazy init writing behind a test.
        run("mkfs.ext4", &["-q", "-E", "lazy_itable_init=0,lazy_journal_init=0"], &image)?;
        LoopDisk::mounted(dir, image)
    }

    fn mounted(dir: tempfile::TempDir, image: PathBuf) -> Result<LoopDisk, String> {
        let mount = dir.path().join("mnt");
        std::fs::create_dir(&mount).map_err(|e| e.to_string())?;
        run("mount", &["-o", "loop", &image.display().to_string()], &mount)?;
        Ok(LoopDisk { _dir: dir, image, mount })
    }

    /// The disk as a power cut at this instant leaves it, mounted apart.
    /// Copied sparsely: only the blocks in use are written.
    pub fn cut(&self) -> Result<LoopDisk, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let image = dir.path().join("disk.img");
        let copy = Command::new("cp").arg("--sparse=always").arg(&self.image).arg(&image).status();
        if !copy.map_err(|e| format!("cannot run cp: {e}"))?.success() {
            return Err("cp of the disk image failed".to_owned());
        }
        LoopDisk::mounted(dir, image)
    }

    /// Where the file system is mounted.
    pub fn path(&self) -> &Path {
        &self.mount
    }
}

impl Drop for LoopDisk {
    fn drop(&mut self) {
        // Lazily: a run cut short may still hold files open there.
        let _ = Command::new("umount").arg("-l").arg(&self.mount).status();
    }
}

fn run(program: &str, args: &[&str], last: &Path) -> Result<(), String> {
    let output = Command::new(program)
        .args(args)
        .arg(last)
        .output()
        .map_err(|e| format!("cannot run {program}: {e}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!("{program}: {}", String::from_utf8_lossy(&output.stderr).trim()))
    }
}
