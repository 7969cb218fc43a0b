//! Generates the `opgraph.v1` protobuf and gRPC code.
//!
//! Uses `$PROTOC` when set, else the `protoc` shipped in `protoc-bin-vendored`,
//! so a fresh machine needs no system protobuf compiler.

use std::error::Error;

const PROTOS: &[&str] = &["opgraph/v1/event.proto", "opgraph/v1/ingest.proto"];

fn main() -> Result<(), Box<dyn Error>> {
    println!("cargo:rerun-if-env-changed=PROTOC");
    for proto in PROTOS {
        println!("cargo:rerun-if-changed={proto}");
    }

    // `std::env::set_var` is `unsafe` in edition 2024 and the workspace
    // forbids unsafe code, so hand the path to prost's config directly.
    let mut config = tonic_prost_build::Config::new();
    match std::env::var_os("PROTOC") {
        Some(protoc) => config.protoc_executable(protoc),
        None => config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?),
    };

    tonic_prost_build::configure()
        // prost's codec, bounds checked before decoding (src/codec.rs).
        .codec_path("crate::codec::BoundedCodec")
        .build_server(true)
        .build_client(true)
        .emit_rerun_if_changed(false)
        .compile_with_config(config, PROTOS, &["."])?;
    Ok(())
}
