//! Opgraph edge gateway: accepts events on site, stores them durably and
//! forwards them to the cloud exactly once.
//!
//! Module map (data flows top to bottom):
//!
//! - [`http`]: the local port. `POST /ingest` takes the cloud's envelope
//!   (single or batch, validated by `opgraph_proto::envelope`), gives each
//!   event an `evt_` id and its receive time, appends the encoded
//!   `pb::Event`s to the buffer and answers 202 only once that append is
//!   durable. Also `/health` and Prometheus `/metrics` ([`telemetry`]).
//! - [`source`]: device sources, the same way: each maps its messages
//!   with [`source::mapping`] rules, appends them and acknowledges the
//!   device only once the append is durable. MQTT now ([`source::mqtt`],
//!   client of an external broker and/or the embedded rumqttd broker);
//!   serial, Modbus and firmware frames come next.
//! - [`buffer`]: the store-and-forward seam. [`buffer::LogBuffer`] is the
//!   segmented, checksummed disk log (group commit, crash recovery, overflow
//!   policy, disk-full handling); [`buffer::MemoryBuffer`] is its in-memory
//!   fake and model.
//! - [`shipper`]: the delivery loop. Hello, then batches built by
//!   [`batch`] (I/O-free; contiguous ranges that tile the sequence space)
//!   from the first sequence the cloud lacks, several in flight;
//!   cumulative acks [`buffer::Buffer::ack`] the buffer; reconnects with
//!   [`backoff`].
//! - [`uplink`]: the transport seam, [`uplink::grpc`] (tonic) and
//!   [`uplink::quic`] (quinn), both TLS on rustls/ring; an in-memory cloud
//!   in [`uplink::memory`] for tests.
//! - [`config`]: the TOML file and env overrides; [`app`] wires it all
//!   and runs the shutdown sequence; [`error`]: the crate's one error type,
//!   whose [`Error::retryable`] says whether trying again can help.

pub mod app;
pub mod backoff;
pub mod batch;
pub mod buffer;
pub mod config;
mod durable;
pub mod error;
pub mod http;
pub mod shipper;
pub mod source;
pub mod telemetry;
pub mod tls;
pub mod uplink;

pub use error::{Error, Result};
