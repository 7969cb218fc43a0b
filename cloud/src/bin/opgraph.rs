//! The `opgraph` binary: see [`opgraph_cloud::cli`].

fn main() -> std::process::ExitCode {
    opgraph_cloud::cli::main()
}
