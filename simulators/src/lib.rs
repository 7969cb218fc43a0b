//! `opgraph-simulators`: stand-ins for the world around a gateway, for
//! tests, demos and benchmarks. The binary `opgraph-sim` has one subcommand
//! per simulator; each is deterministic with `--seed` and prints a summary
//! of exactly what it carried or sent.
//!
//! Modules:
//!
//! - [`proxy`]: the flaky-link proxy (`opgraph-sim proxy`). Clients connect
//!   to it instead of the real server; it forwards TCP or UDP through
//!   [`proxy::link`], an I/O-free model of a bad network (loss, latency,
//!   jitter, reordering, bandwidth cap, partitions), with one file per
//!   transport ([`proxy`]`::{tcp, udp}`). Tests drive it in process through
//!   [`proxy::FlakyProxy`] and [`proxy::ProxyHandle`]; the CLI wraps the
//!   same API in [`proxy::cli`].
//! - [`error`]: the crate's error type.
//!
//! Device simulators (RFID, barcode, Modbus, robots) join as sibling
//! modules, each with its own `cli` arguments, sharing their codecs with the
//! gateway.

pub mod error;
pub mod proxy;

pub use error::{Error, Result};
pub use proxy::link::{LinkConfig, PartitionWindow};
pub use proxy::stats::{DirectionStats, ProxyStats};
pub use proxy::{FlakyProxy, PartitionMode, PartitionState, Protocol, ProxyConfig, ProxyHandle};
