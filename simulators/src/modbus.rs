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
//! before each answer (`--latency`). Prints `listening modbus=ADDR` (or
//! the RTU link's path) once ready; on SIGTERM or Ctrl-C, `summary {json}`
//! with the requests served and exceptions sent.

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use opgraph_gateway::source::modbus::Table;
use opgraph_gateway::source::modbus::value::{self, Order, ValueType};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::net::TcpListener;
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
    #[arg(long, value_parser = parse_duration, default_value = "0s")]
    pub latency: Duration,
}

fn parse_duration(s: &str) -> std::result::Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{e} (try e.g. 250ms, 3s)"))
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
}

#[derive(Clone)]
struct Device {
    tables: Arc<Tables>,
    counters: Arc<Counters>,
    exception_every: u64,
    latency: Duration,
}

type Answer = Pin<Box<dyn Future<Output = std::result::Result<Response, ExceptionCode>> + Send>>;

impl tokio_modbus::server::Service for Device {
    type Request = Request<'static>;
    type Response = Response;
    type Exception = ExceptionCode;
    type Future = Answer;

    fn call(&self, request: Request<'static>) -> Answer {
        let n = self.counters.requests.fetch_add(1, Ordering::Relaxed) + 1;
        let fail = self.exception_every > 0 && n.is_multiple_of(self.exception_every);
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
    let device = Device {
        tables,
        counters: Arc::clone(&counters),
        exception_every: args.exception_every,
        latency: args.latency,
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
        let device = device.clone();
        async move { accept_tcp_connection(stream, addr, move |_| Ok(Some(device.clone()))) }
    };
    Server::new(listener)
        .serve_until(&on_connected, |e| tracing::debug!(error = %e, "modbus client"), stop)
        .await
        .map_err(Error::io("serving modbus"))?;
    Ok(())
}

/// One RTU line: the device holds the pty's master end, the gateway opens
/// the linked other end.
async fn serve_rtu(
    device: Device,
    link: &std::path::Path,
    stop: impl Future<Output = ()> + Send + Sync + 'static,
) -> Result<()> {
    let (line, other_end) = tokio_serial::SerialStream::pair()
        .map_err(|e| Error::Io { context: "opening a pty pair", source: e.into() })?;
    let path = tokio_serial::SerialPort::name(&other_end)
        .ok_or_else(|| Error::InvalidConfig(vec!["the pty has no name".into()]))?;
    let _ = std::fs::remove_file(link);
    std::os::unix::fs::symlink(&path, link).map_err(Error::io("linking the pty"))?;
    print(&format!("listening modbus={}\n", link.display()))?;
    let served = tokio_modbus::server::rtu::Server::new(line).serve_until(device, stop).await;
    let _ = std::fs::remove_file(link);
    drop(other_end);
    served.map_err(Error::io("serving modbus rtu"))?;
    Ok(())
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
