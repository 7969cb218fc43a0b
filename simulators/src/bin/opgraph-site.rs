//! `opgraph-site`: the cloud, a gateway and simulated devices in one
//! process; see [`opgraph_simulators::site`].

use std::process::ExitCode;

use clap::Parser;

#[derive(Debug, Parser)]
#[command(
    name = "opgraph-site",
    version,
    about = "A whole Opgraph site on this machine: cloud, gateway, simulated devices"
)]
struct Cli {
    #[command(flatten)]
    site: opgraph_simulators::site::SiteArgs,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Warnings and errors only: the live count owns the terminal.
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("OPGRAPH_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("opgraph-site: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(opgraph_simulators::site::run(cli.site)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("opgraph-site: {e}");
            ExitCode::FAILURE
        }
    }
}
