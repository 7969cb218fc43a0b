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

/// CPU time (user plus system, all its threads, living and gone) that a
/// process has used so far, in seconds; 0 when unknown. Far steadier
/// than a rate on a shared machine: comparing builds by it needs fewer
/// rounds.
pub fn cpu_seconds(pid: u32) -> f64 {
    // /proc counts in USER_HZ, which Linux fixes at 100 for user space.
    const USER_HZ: f64 = 100.0;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The command name may hold spaces and parentheses; fields follow
    // the last `)`, starting with the state (field 3 of proc(5)).
    let Some((_, rest)) = stat.rsplit_once(')') else { return 0.0 };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |field: usize| fields.get(field - 3).and_then(|v| v.parse::<f64>().ok());
    (ticks(14).unwrap_or(0.0) + ticks(15).unwrap_or(0.0)) / USER_HZ
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
