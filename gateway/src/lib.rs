//! Opgraph edge gateway: accepts events on site, stores them durably and
//! forwards them to the cloud exactly once.
//!
//! Module map (data flows top to bottom):
//!
//! - sources (later: MQTT, serial, Modbus, firmware, local ingest) encode
//!   each accepted event and [`buffer::Buffer::append`] it; the device is
//!   acknowledged only once the append returned (durable).
//! - [`buffer`]: the store-and-forward seam. [`buffer::LogBuffer`] is the
//!   segmented, checksummed disk log (group commit, crash recovery, overflow
//!   policy, disk-full handling); [`buffer::MemoryBuffer`] is its in-memory
//!   fake and model.
//! - uplinks (later: gRPC, QUIC) [`buffer::Buffer::read`] from the first
//!   unacknowledged sequence number, send batches, and
//!   [`buffer::Buffer::ack`] the cloud's cumulative acknowledgement.
//! - [`error`]: the crate's one error type; [`Error::retryable`] says
//!   whether trying again can help.

pub mod buffer;
pub mod error;

pub use error::{Error, Result};
