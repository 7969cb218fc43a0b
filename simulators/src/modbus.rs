//! `opgraph-sim modbus`: a Modbus device serving a register map, over TCP
//! or, with `--rtu-link PATH`, as Modbus RTU on a pseudo-terminal whose
//! other end is linked at PATH.
//!
//! The map is a TOML file of `[[registers]]` tables, each a value placed
//! with the gateway's own codec (`opgraph_gateway::source::modbus::value`),
//! so a test can write the same entry into the gateway's register map and
//! expect exactly `value` back:
//!
//! ```toml
//! [[registers]]
//! table = "holding_register"   # coil | discrete_input | input_register | holding_register
//! address = 0
//! type = "f32"                 # bool u16 i16 u32 i32 u64 i64 f32 f64 string
//! order = "CDAB"               # ABCD (default) DCBA BADC CDAB
//! value = 21.5
//! ```
//!
//! Unmapped addresses read as zero. Misbehaviour on request: every Nth
//! request answered with a Modbus exception (`--exception-every`), a delay
//! before each answer (`--latency`), every Nth request ending in a
//! disconnect (`--disconnect-every`: over TCP the connection is closed
//! instead of answered; over RTU the answer never comes, a device dropping
//! off the line) and, over RTU, every Nth answer sent with a wrong CRC
//! (`--crc-error-every`). Over RTU the device's answers pass through a
//! relay between two pseudo-terminal pairs, which garbles or swallows them
//! (tokio-modbus computes the CRC itself). Prints `listening modbus=ADDR`
//! (or the RTU link's path) once ready; on SIGTERM or Ctrl-C, `summary
//! {json}` with the requests served and the exceptions, disconnects and
//! wrong CRCs sent.

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use opgraph_gateway::source::modbus::Table;
use opgraph_gateway::source::modbus::rtu::reply_len;
use opgraph_gateway::source::modbus::value::{self, Order, ValueType};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::signal::unix::{SignalKind, signal};
use tokio_modbus::server::tcp::{Server, accept_tcp_connection};
use tokio_modbus::{ExceptionCode, Request, Response};

use crate::error::{Error, Result};
use crate::print;

/// Serve a Modbus TCP register map.
#[derive(Debug, Clone, clap::Args)]
pub struct ModbusArgs {
    /// Address to listen on (port 0: any free port).
    #[arg(long, default_value = "127.0.0.1:5020")]
    pub listen: SocketAddr,
    /// Serve Modbus RTU on a pseudo-terminal linked here instead of TCP.
    #[arg(long)]
    pub rtu_link: Option<PathBuf>,
    /// The register map (TOML, see `opgraph-sim modbus --help` and the docs).
    #[arg(long)]
    pub map: PathBuf,
    /// Answer every Nth request with exception 0x04 (server device failure);
    /// 0: never.
    #[arg(long, default_value_t = 0)]
    pub exception_every: u64,
    /// Delay before each answer, e.g. 50ms.
    #[arg(long, value_parser = crate::parse_duration, default_value = "0s")]
    pub latency: Duration,
    /// Every Nth request is not answered: over TCP the connection is
    /// closed, over RTU the line stays silent; 0: never.
    #[arg(long, default_value_t = 0)]
    pub disconnect_every: u64,
    /// RTU only: every Nth answer goes out with a wrong CRC; 0: never.
    #[arg(long, default_value_t = 0)]
    pub crc_error_every: u64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct MapFile {
    registers: Vec<MapEntry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct MapEntry {
    table: Table,
    address: u16,
    #[serde(rename = "type")]
    ty: ValueType,
    #[serde(default)]
    order: Order,
    /// Registers of a string.
    #[serde(default)]
    length: u16,
    value: Value,
}

/// The device's four tables; absent addresses read as zero.
#[derive(Debug, Default)]
pub struct Tables {
    bits: HashMap<(Table, u16), bool>,
    words: HashMap<(Table, u16), u16>,
}

impl Tables {
    /// Reads a map file; every problem names its entry.
    pub fn from_toml(text: &str) -> Result<Tables> {
        let file: MapFile =
            toml::from_str(text).map_err(|e| Error::InvalidConfig(vec![format!("map: {e}")]))?;
        let mut tables = Tables::default();
        let mut problems = Vec::new();
        for (i, entry) in file.registers.iter().enumerate() {
            let bits = matches!(entry.table, Table::Coil | Table::DiscreteInput);
            if bits {
                match entry.value.as_bool() {
                    Some(b) => {
                        tables.bits.insert((entry.table, entry.address), b);
                    }
                    None => problems.push(format!("registers[{i}].value: a bit is true or false")),
                }
                continue;
            }
            let Some(words) = value::encode(entry.ty, entry.order, entry.length, &entry.value)
            else {
                problems.push(format!("registers[{i}].value: does not fit {:?}", entry.ty));
                continue;
            };
            for (k, word) in words.into_iter().enumerate() {
                let Some(address) =
                    u16::try_from(k).ok().and_then(|k| entry.address.checked_add(k))
                else {
                    problems.push(format!("registers[{i}].address: runs past 65535"));
                    break;
                };
                tables.words.insert((entry.table, address), word);
            }
        }
        if problems.is_empty() { Ok(tables) } else { Err(Error::InvalidConfig(problems)) }
    }

    fn bits(&self, table: Table, start: u16, count: u16) -> Option<Vec<bool>> {
        let end = start.checked_add(count)?;
        Some((start..end).map(|a| self.bits.get(&(table, a)).copied().unwrap_or(false)).collect())
    }

    fn words(&self, table: Table, start: u16, count: u16) -> Option<Vec<u16>> {
        let end = start.checked_add(count)?;
        Some((start..end).map(|a| self.words.get(&(table, a)).copied().unwrap_or(0)).collect())
    }
}

#[derive(Debug, Default)]
struct Counters {
    requests: AtomicU64,
    exceptions: AtomicU64,
    disconnects: AtomicU64,
    crc_errors: AtomicU64,
}

/// What to do to the answer being written, set by [`Device::call`] for one
/// connection (TCP) or the line (RTU).
#[derive(Debug, Default)]
struct Misdeeds {
    /// TCP: fail the write, which closes the connection; RTU: swallow it.
    cut: AtomicBool,
    /// RTU: flip the CRC's last byte.
    garble: AtomicBool,
}

#[derive(Clone)]
struct Device {
    tables: Arc<Tables>,
    counters: Arc<Counters>,
    exception_every: u64,
    latency: Duration,
    disconnect_every: u64,
    crc_error_every: u64,
    misdeeds: Arc<Misdeeds>,
}

type Answer = Pin<Box<dyn Future<Output = std::result::Result<Response, ExceptionCode>> + Send>>;

impl tokio_modbus::server::Service for Device {
    type Request = Request<'static>;
    type Response = Response;
    type Exception = ExceptionCode;
    type Future = Answer;

    fn call(&self, request: Request<'static>) -> Answer {
        let n = self.counters.requests.fetch_add(1, Ordering::Relaxed) + 1;
        let every = |k: u64| k > 0 && n.is_multiple_of(k);
        let fail = every(self.exception_every);
        if every(self.disconnect_every) {
            self.counters.disconnects.fetch_add(1, Ordering::Relaxed);
            self.misdeeds.cut.store(true, Ordering::Relaxed);
        } else if every(self.crc_error_every) {
            self.counters.crc_errors.fetch_add(1, Ordering::Relaxed);
            self.misdeeds.garble.store(true, Ordering::Relaxed);
        }
        let answer = if fail {
            self.counters.exceptions.fetch_add(1, Ordering::Relaxed);
            Err(ExceptionCode::ServerDeviceFailure)
        } else {
            self.answer(request)
        };
        let latency = self.latency;
        Box::pin(async move {
            if !latency.is_zero() {
                tokio::time::sleep(latency).await;
            }
            answer
        })
    }
}

impl Device {
    fn answer(&self, request: Request<'static>) -> std::result::Result<Response, ExceptionCode> {
        let t = &self.tables;
        let out_of_range = ExceptionCode::IllegalDataAddress;
        match request {
            Request::ReadCoils(a, n) => {
                t.bits(Table::Coil, a, n).map(Response::ReadCoils).ok_or(out_of_range)
            }
            Request::ReadDiscreteInputs(a, n) => t
                .bits(Table::DiscreteInput, a, n)
                .map(Response::ReadDiscreteInputs)
                .ok_or(out_of_range),
            Request::ReadInputRegisters(a, n) => t
                .words(Table::InputRegister, a, n)
                .map(Response::ReadInputRegisters)
                .ok_or(out_of_range),
            Request::ReadHoldingRegisters(a, n) => t
                .words(Table::HoldingRegister, a, n)
                .map(Response::ReadHoldingRegisters)
                .ok_or(out_of_range),
            _ => Err(ExceptionCode::IllegalFunction),
        }
    }
}

/// Serves until SIGTERM or Ctrl-C; returns the summary it printed.
pub async fn run(args: ModbusArgs) -> Result<Value> {
    let text = std::fs::read_to_string(&args.map).map_err(Error::io("reading the map"))?;
    let tables = Arc::new(Tables::from_toml(&text)?);
    let counters = Arc::new(Counters::default());
    if args.crc_error_every > 0 && args.rtu_link.is_none() {
        return Err(Error::InvalidConfig(vec![
            "crc-error-every: needs --rtu-link (Modbus TCP has no CRC)".to_owned(),
        ]));
    }
    let device = Device {
        tables,
        counters: Arc::clone(&counters),
        exception_every: args.exception_every,
        latency: args.latency,
        disconnect_every: args.disconnect_every,
        crc_error_every: args.crc_error_every,
        misdeeds: Arc::default(),
    };
    let mut terminate = signal(SignalKind::terminate()).map_err(Error::io("SIGTERM handler"))?;
    let mut interrupt = signal(SignalKind::interrupt()).map_err(Error::io("SIGINT handler"))?;
    let stop = async move {
        tokio::select! {
            _ = terminate.recv() => {}
            _ = interrupt.recv() => {}
        }
    };
    match &args.rtu_link {
        Some(link) => serve_rtu(device, link, stop).await?,
        None => serve_tcp(device, args.listen, stop).await?,
    }
    let summary = json!({
        "requests": counters.requests.load(Ordering::Relaxed),
        "exceptions": counters.exceptions.load(Ordering::Relaxed),
        "disconnects": counters.disconnects.load(Ordering::Relaxed),
        "crc_errors": counters.crc_errors.load(Ordering::Relaxed),
    });
    print(&format!("summary {summary}\n"))?;
    Ok(summary)
}

async fn serve_tcp(
    device: Device,
    listen: SocketAddr,
    stop: impl Future<Output = ()> + Send + Sync + 'static,
) -> Result<()> {
    let listener =
        TcpListener::bind(listen).await.map_err(|source| Error::Bind { addr: listen, source })?;
    let local = listener.local_addr().map_err(Error::io("local address"))?;
    print(&format!("listening modbus={local}\n"))?;
    let on_connected = |stream, addr| {
        // Each connection has its own misdeeds: a cut closes only it.
        let device = Device { misdeeds: Arc::default(), ..device.clone() };
        let misdeeds = Arc::clone(&device.misdeeds);
        async move {
            let accepted = accept_tcp_connection(stream, addr, move |_| Ok(Some(device.clone())));
            accepted.map(|a| a.map(|(device, stream)| (device, Cuttable { stream, misdeeds })))
        }
    };
    Server::new(listener)
        .serve_until(&on_connected, |e| tracing::debug!(error = %e, "modbus client"), stop)
        .await
        .map_err(Error::io("serving modbus"))?;
    Ok(())
}

/// A TCP connection whose next write fails when the device decided to
/// cut it (the server then closes the connection).
struct Cuttable {
    stream: TcpStream,
    misdeeds: Arc<Misdeeds>,
}

impl AsyncRead for Cuttable {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Cuttable {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        if self.misdeeds.cut.swap(false, Ordering::Relaxed) {
            let cut = std::io::Error::new(std::io::ErrorKind::ConnectionAborted, "cut on request");
            return Poll::Ready(Err(cut));
        }
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

fn pty_pair() -> Result<(tokio_serial::SerialStream, tokio_serial::SerialStream)> {
    tokio_serial::SerialStream::pair()
        .map_err(|e| Error::Io { context: "opening a pty pair", source: e.into() })
}

/// One RTU line: the device serves the master end of one pty pair; a
/// relay carries bytes between that pair's other end and the master end
/// of a second pair, whose other end is linked for the gateway to open.
async fn serve_rtu(
    device: Device,
    link: &std::path::Path,
    stop: impl Future<Output = ()> + Send + Sync + 'static,
) -> Result<()> {
    let (line, device_side) = pty_pair()?;
    let (gateway_side, other_end) = pty_pair()?;
    let path = tokio_serial::SerialPort::name(&other_end)
        .ok_or_else(|| Error::InvalidConfig(vec!["the pty has no name".into()]))?;
    let _ = std::fs::remove_file(link);
    std::os::unix::fs::symlink(&path, link).map_err(Error::io("linking the pty"))?;
    let relay = tokio::spawn(relay(device_side, gateway_side, Arc::clone(&device.misdeeds)));
    print(&format!("listening modbus={}\n", link.display()))?;
    let served = tokio_modbus::server::rtu::Server::new(line).serve_until(device, stop).await;
    relay.abort();
    let _ = std::fs::remove_file(link);
    drop(other_end);
    served.map_err(Error::io("serving modbus rtu"))?;
    Ok(())
}

/// Requests pass unchanged; answers are framed ([`reply_len`]) and passed,
/// garbled or swallowed as the device decided for each.
async fn relay(
    device: tokio_serial::SerialStream,
    gateway: tokio_serial::SerialStream,
    misdeeds: Arc<Misdeeds>,
) {
    let (mut from_device, mut to_device) = tokio::io::split(device);
    let (mut from_gateway, mut to_gateway) = tokio::io::split(gateway);
    let requests = async {
        let _ = tokio::io::copy(&mut from_gateway, &mut to_device).await;
    };
    let answers = async {
        let mut pending: Vec<u8> = Vec::new();
        let mut chunk = [0u8; 512];
        loop {
            let n = match from_device.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            pending.extend_from_slice(&chunk[..n]);
            while let Some(len) = reply_len(&pending) {
                let mut frame: Vec<u8> = pending.drain(..len).collect();
                if misdeeds.cut.swap(false, Ordering::Relaxed) {
                    continue;
                }
                if misdeeds.garble.swap(false, Ordering::Relaxed)
                    && let Some(last) = frame.last_mut()
                {
                    *last ^= 0x5A;
                }
                if to_gateway.write_all(&frame).await.is_err() {
                    return;
                }
            }
        }
    };
    tokio::join!(requests, answers);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_map_places_values_with_the_gateway_codec() {
        let tables = Tables::from_toml(
            r#"
            [[registers]]
            table = "holding_register"
            address = 10
            type = "f32"
            order = "CDAB"
            value = 123.456
            [[registers]]
            table = "coil"
            address = 3
            type = "bool"
            value = true
            "#,
        )
        .unwrap();
        assert_eq!(tables.words(Table::HoldingRegister, 10, 2), Some(vec![0xE979, 0x42F6]));
        assert_eq!(tables.words(Table::HoldingRegister, 9, 1), Some(vec![0]));
        assert_eq!(tables.bits(Table::Coil, 2, 2), Some(vec![false, true]));
        assert_eq!(tables.words(Table::InputRegister, 65535, 2), None);
    }

    #[test]
    fn bad_maps_name_the_entry() {
        let err = Tables::from_toml(
            "[[registers]]\ntable = \"holding_register\"\naddress = 0\ntype = \"u16\"\nvalue = 70000\n",
        )
        .unwrap_err();
        assert!(err.to_string().contains("registers[0].value"), "{err}");
        assert!(Tables::from_toml("[[registers]]\ntable = \"nope\"\n").is_err());
    }
}
