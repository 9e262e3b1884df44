//! Compiles `proto/**/*.proto` with `protox` (pure Rust; no `protoc` needed)
//! and generates prost messages plus tonic client and server stubs.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("proto");
    let files = [
        root.join("cipherlora/adapter/v1/adapter.proto"),
        root.join("cipherlora/split/v1/split.proto"),
    ];
    for file in &files {
        println!("cargo:rerun-if-changed={}", file.display());
    }
    let fds = protox::compile(&files, [&root])?;
    tonic_prost_build::configure()
        // Every `bytes` field becomes `bytes::Bytes`: ciphertexts are sliced
        // out of the received buffer without copying.
        .bytes(".")
        .build_transport(false)
        // Undecodable messages are the caller's fault: INVALID_ARGUMENT, not
        // tonic-prost's INTERNAL.
        .codec_path("crate::codec::ProtoCodec")
        .compile_fds(fds)?;
    Ok(())
}
