//! The `opgraph-gateway` binary: `--config FILE` (with `OPGRAPH_GATEWAY_*`
//! overrides), then [`opgraph_gateway::app::run`] until SIGTERM or Ctrl-C.
//! Exit codes: 0 after a graceful shutdown, 2 for a bad configuration, 1
//! for anything else; errors are one line on stderr.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use opgraph_gateway::Error;
use opgraph_gateway::config::Config;
use tokio_util::sync::CancellationToken;

#[derive(Parser)]
#[command(name = "opgraph-gateway", version, about = "Opgraph edge gateway: buffer and forward")]
struct Args {
    /// TOML config file; OPGRAPH_GATEWAY_* environment variables override it.
    #[arg(long)]
    config: PathBuf,
}

fn main() -> ExitCode {
    let args = Args::parse();
    opgraph_gateway::telemetry::init_logging();
    // The workspace's one crypto provider, installed as the process default
    // so that nothing picks another one.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let config = match Config::load(&args.config, |k| std::env::var(k).ok()) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("opgraph-gateway: config {}: {e}", args.config.display());
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("opgraph-gateway: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async {
        let shutdown = CancellationToken::new();
        tokio::spawn(opgraph_proto::serve::stop_on_signal(shutdown.clone()));
        match opgraph_gateway::app::run(config, shutdown).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e @ Error::InvalidConfig { .. }) => {
                eprintln!("opgraph-gateway: config {}: {e}", args.config.display());
                ExitCode::from(2)
            }
            Err(e) => {
                eprintln!("opgraph-gateway: {e}");
                ExitCode::FAILURE
            }
        }
    })
}
