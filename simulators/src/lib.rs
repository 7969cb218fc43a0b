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
//! - [`tunlink`]: the kernel-level link emulator (`opgraph-sim tunlink`).
//!   Nothing is terminated: a TUN device takes the IP packets of a fake
//!   subnet, loses or delays each with the proxy's [`proxy::link`] model
//!   and hands them back to the kernel, addresses rewritten, so two
//!   programs on one host talk over real kernel TCP or UDP with real loss
//!   and a true round trip. Needs root and a private network namespace.
//! - [`rfid`]: RFID readers publishing tag reads over MQTT (`opgraph-sim
//!   rfid`): an I/O-free, seeded [`rfid::plan`] of portal passes with
//!   repeated reads (and malformed messages or wrong clocks on request),
//!   published with QoS 1 by [`rfid::cli`].
//! - [`barcode`]: a barcode scanner on a pseudo-terminal (`opgraph-sim
//!   barcode`): GS1-128, Code 128 and EAN-13 lines, bad check digits and
//!   garbage on request.
//! - [`firmware`]: a microcontroller speaking Opgraph's framed serial
//!   protocol on a pseudo-terminal (`opgraph-sim firmware`): readings kept
//!   until acknowledged and sent again after a timeout or a hello request,
//!   noise and damaged frames on request.
//! - [`modbus`]: a Modbus TCP device serving a register map (`opgraph-sim
//!   modbus`), placed with the gateway's own register codec; exceptions and
//!   latency on request.
//! - [`robots`]: a robot fleet running missions over MQTT (`opgraph-sim
//!   robots`): run lifecycle, telemetry and faults.
//! - [`fleet`]: many MQTT devices at once, for load (`opgraph-sim fleet`
//!   and the MQTT benchmark): seeded ~200-byte readings with QoS 1, exact
//!   per-device counts of what was published and acknowledged.
//! - [`site`]: a whole local site in one process (`opgraph-site`): cloud,
//!   gateway and a simulator per device kind, with a live count.
//! - [`history`]: a long, deterministic history of warehouse, robot and
//!   web events for query benchmarks (`opgraph-history`).
//! - [`error`]: the crate's error type.
//!
//! More device simulators (barcode, Modbus, robots) join as sibling
//! modules, each with its own `cli` arguments, sharing their codecs with the
//! gateway.

pub mod barcode;
pub mod error;
pub mod firmware;
pub mod fleet;
pub mod history;
pub mod modbus;
pub mod proxy;
pub mod rfid;
pub mod robots;
pub mod site;
pub mod tunlink;

pub use error::{Error, Result};

/// Writes `text` to stdout at once: the `listening` and `summary` lines
/// that tests and scripts wait for must not sit in a buffer.
pub(crate) fn print(text: &str) -> Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes()).and_then(|()| out.flush()).map_err(Error::io("writing stdout"))
}

/// A duration flag (`250ms`, `3s`, `1m`), for clap's `value_parser`.
pub(crate) fn parse_duration(s: &str) -> std::result::Result<std::time::Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{e} (try e.g. 250ms, 3s, 1m)"))
}

/// A pseudo-terminal pair for a serial device: the device's end, and the
/// line's end, which `link` (replaced if it exists) points to for the
/// gateway to open.
pub(crate) fn linked_pty(
    link: &std::path::Path,
) -> Result<(tokio_serial::SerialStream, tokio_serial::SerialStream)> {
    use tokio_serial::SerialPort;
    let (device, line_end) = tokio_serial::SerialStream::pair()
        .map_err(|e| Error::Io { context: "opening a pty pair", source: e.into() })?;
    let path =
        line_end.name().ok_or_else(|| Error::InvalidConfig(vec!["the pty has no name".into()]))?;
    let _ = std::fs::remove_file(link);
    std::os::unix::fs::symlink(&path, link).map_err(Error::io("linking the pty"))?;
    Ok((device, line_end))
}

/// A `--broker HOST:PORT` (IPv6 hosts in brackets) as host and port, for
/// the simulators that publish over MQTT.
pub(crate) fn broker_endpoint(broker: &str) -> Result<(String, u16)> {
    let bad = || Error::InvalidConfig(vec![format!("broker: {broker:?}: expected HOST:PORT")]);
    let (host, port) = broker.rsplit_once(':').ok_or_else(bad)?;
    let port = port.parse::<u16>().map_err(|_| bad())?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() {
        return Err(bad());
    }
    Ok((host.to_owned(), port))
}

pub use proxy::link::{LinkConfig, PartitionWindow};
pub use proxy::stats::{DirectionStats, ProxyStats};
pub use proxy::{FlakyProxy, PartitionMode, PartitionState, Protocol, ProxyConfig, ProxyHandle};
