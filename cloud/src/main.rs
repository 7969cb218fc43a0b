//! The `opgraph-cloud` binary: config from `--config` and `OPGRAPH_*`,
//! then [`opgraph_cloud::server::run`] until SIGTERM or Ctrl-C.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use opgraph_cloud::config::Config;
use tokio_util::sync::CancellationToken;

// Events are many small Strings and maps freed on other threads than
// allocated them; glibc's consolidation of those was 7 % of the cloud's CPU.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(name = "opgraph-cloud", version, about = "Opgraph cloud: ingest, store, API")]
struct Args {
    /// TOML config file; OPGRAPH_* environment variables override it.
    #[arg(long)]
    config: Option<PathBuf>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("OPGRAPH_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let config = match Config::load(args.config.as_deref(), |k| std::env::var(k).ok()) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("opgraph-cloud: {e}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("opgraph-cloud: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async {
        let shutdown = CancellationToken::new();
        tokio::spawn(opgraph_proto::serve::stop_on_signal(shutdown.clone()));
        match opgraph_cloud::server::run(config, shutdown).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("opgraph-cloud: {e:#}");
                ExitCode::FAILURE
            }
        }
    })
}
