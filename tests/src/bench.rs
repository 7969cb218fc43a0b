//! What the benchmarks in `tests/benches/` share: where their data goes
//! and how they read a process's memory.

use std::path::Path;

/// A fresh temporary directory for one run, under `dir` (`--dir`) when
/// given: it must be a real disk for fsync to cost what it costs.
pub fn temp_dir(dir: Option<&Path>, prefix: &str) -> tempfile::TempDir {
    let builder = tempfile::Builder::new().prefix(prefix).clone();
    match dir {
        Some(dir) => {
            std::fs::create_dir_all(dir).expect("create --dir");
            builder.tempdir_in(dir)
        }
        None => builder.tempdir(),
    }
    .expect("temp dir")
}

/// `VmRSS` and `VmHWM` of a process, in MB (10^6 bytes); 0 when unknown.
pub fn rss_mb(pid: u32) -> (f64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| -> f64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            .map_or(0.0, |kb| kb * 1024.0 / 1e6)
    };
    (field("VmRSS:"), field("VmHWM:"))
}
