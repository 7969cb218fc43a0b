//! `opgraph-sim`: one subcommand per simulator; see the library docs.

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::error::ErrorKind;
use clap::{Parser, Subcommand};
use opgraph_simulators::Error;
use opgraph_simulators::barcode::{self, BarcodeArgs};
use opgraph_simulators::firmware::{self, FirmwareArgs};
use opgraph_simulators::fleet::{self, FleetArgs};
use opgraph_simulators::modbus::{self, ModbusArgs};
use opgraph_simulators::proxy::cli::{self as proxy_cli, ProxyArgs};
use opgraph_simulators::rfid::cli::{self as rfid_cli, RfidArgs};
use opgraph_simulators::robots::{self, RobotsArgs};
use opgraph_simulators::tunlink::cli::{self as tunlink_cli, TunLinkArgs};
use tracing_subscriber::EnvFilter;

#[derive(Debug, Parser)]
#[command(name = "opgraph-sim", version, about = "Opgraph device and network simulators")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Forward TCP or UDP through a simulated flaky link: loss, latency,
    /// jitter, reordering, bandwidth cap and partitions.
    Proxy(ProxyArgs),
    /// Emulate a lossy link at the IP level through a TUN device: real
    /// kernel TCP and UDP, really lost and delayed (root, private network
    /// namespace).
    Tunlink(TunLinkArgs),
    /// RFID readers publishing tag reads over MQTT (QoS 1), then a summary
    /// of exactly what was sent.
    Rfid(RfidArgs),
    /// A Modbus TCP device serving a register map, with exceptions and
    /// latency on request.
    Modbus(ModbusArgs),
    /// A barcode scanner on a pseudo-terminal: GS1 and plain codes, bad
    /// check digits and garbage on request.
    Barcode(BarcodeArgs),
    /// A microcontroller on a pseudo-terminal speaking Opgraph's framed
    /// serial protocol: readings resent until acknowledged, garbage on
    /// request.
    Firmware(FirmwareArgs),
    /// A robot fleet running missions over MQTT: runs, telemetry, faults.
    Robots(RobotsArgs),
    /// Many MQTT devices at once, for load: QoS 1 readings of ~200 bytes,
    /// then a summary of exactly what was published and acknowledged.
    Fleet(FleetArgs),
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return usage_error(&e),
    };
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Proxy(args) => proxy_cli::run(args).await.map(drop),
            Command::Tunlink(args) => tunlink_cli::run(args).await.map(drop),
            Command::Rfid(args) => rfid_cli::run(args).await.map(drop),
            Command::Modbus(args) => modbus::run(args).await.map(drop),
            Command::Barcode(args) => barcode::run(args).await.map(drop),
            Command::Firmware(args) => firmware::run(args).await.map(drop),
            Command::Robots(args) => robots::run(args).await.map(drop),
            Command::Fleet(args) => fleet::run(args).await.map(drop),
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e @ Error::InvalidConfig(_)) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Help and version as clap prints them; any other argument error as one
/// line on stderr.
fn usage_error(e: &clap::Error) -> ExitCode {
    if matches!(
        e.kind(),
        ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    ) {
        let _ = e.print();
        return if e.use_stderr() { ExitCode::from(2) } else { ExitCode::SUCCESS };
    }
    let rendered = e.render().to_string();
    let first_paragraph: Vec<&str> =
        rendered.lines().map(str::trim).take_while(|line| !line.is_empty()).collect();
    eprintln!("{} (see --help)", first_paragraph.join(" "));
    ExitCode::from(2)
}
