//! Compiles the vendored Envoy RLS v3 protos with protox (a pure-Rust protobuf compiler), so that
//! building tollgate needs no `protoc` on the machine. The file descriptor set is also written out
//! for gRPC server reflection.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = ["proto/envoy/service/ratelimit/v3/rls.proto"];
    println!("cargo:rerun-if-changed=proto");

    let descriptors = protox::compile(protos, ["proto"])?;
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out_dir.join("rls_descriptor.bin"),
        prost::Message::encode_to_vec(&descriptors),
    )?;

    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(descriptors)?;
    Ok(())
}
