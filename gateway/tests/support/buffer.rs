//! Helpers shared by the buffer tests.
#![allow(dead_code)]

use std::fs;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use bytesize::ByteSize;
use opgraph_gateway::buffer::{
    Buffer, BufferConfig, FsyncPolicy, LogBuffer, OverflowPolicy, RECORD_HEADER_BYTES, Record,
};

/// Every wait in these tests is bounded by this, so a bug fails instead of
/// hanging.
pub const PATIENCE: Duration = Duration::from_secs(20);

pub async fn within<F: Future>(what: &str, future: F) -> F::Output {
    match tokio::time::timeout(PATIENCE, future).await {
        Ok(output) => output,
        Err(_) => panic!("timed out after {PATIENCE:?}: {what}"),
    }
}

pub fn config(dir: &Path, fsync: FsyncPolicy, segment_bytes: u64, max_bytes: u64) -> BufferConfig {
    BufferConfig {
        dir: dir.to_owned(),
        fsync,
        fsync_interval: Duration::from_millis(2),
        fsync_settle: Duration::from_millis(1),
        segment_bytes: ByteSize(segment_bytes),
        max_bytes: ByteSize(max_bytes),
        overflow: OverflowPolicy::Block,
        io_error_wait: Duration::from_secs(5),
    }
}

/// Logs to the test output (`RUST_LOG=debug cargo test ...` for more).
pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_test_writer()
        .try_init();
}

pub async fn open(config: &BufferConfig) -> LogBuffer {
    init_tracing();
    within("open", LogBuffer::open(config.clone())).await.expect("open buffer")
}

/// A payload that tells which record it is.
pub fn payload(tag: u64, len: usize) -> Bytes {
    let mut bytes = tag.to_le_bytes().repeat(len / 8 + 1);
    bytes.truncate(len);
    Bytes::from(bytes)
}

/// Encoded size of a record with a payload of `len` bytes.
pub fn record_bytes(len: usize) -> u64 {
    (RECORD_HEADER_BYTES + len) as u64
}

/// Reads every readable record from `from`.
pub async fn read_all(buffer: &impl Buffer, from: u64) -> Vec<Record> {
    let mut out: Vec<Record> = Vec::new();
    let mut next = from;
    loop {
        let batch = within("read", buffer.read(next, 64, 1 << 20)).await.expect("read");
        let Some(last) = batch.last() else { break };
        next = last.seq + 1;
        out.extend(batch);
    }
    out
}

pub fn seqs(records: &[Record]) -> Vec<u64> {
    records.iter().map(|r| r.seq).collect()
}

/// Segment files in `dir`, oldest first, with their first sequence number.
pub fn segment_files(dir: &Path) -> Vec<(u64, PathBuf)> {
    let mut out: Vec<(u64, PathBuf)> = fs::read_dir(dir)
        .expect("list dir")
        .filter_map(|entry| {
            let path = entry.ok()?.path();
            let name = path.file_name()?.to_str()?;
            let first = name.strip_suffix(".seg")?.parse().ok()?;
            Some((first, path))
        })
        .collect();
    out.sort();
    out
}

/// Flips one bit of the byte at `offset` of `path`.
pub fn flip(path: &Path, offset: u64) {
    let mut bytes = fs::read(path).expect("read segment");
    bytes[offset as usize] ^= 0x20;
    fs::write(path, bytes).expect("write segment");
}
