//! Compiles the vendored protos with protox (a pure-Rust protobuf compiler), so that building
//! tollgate needs no `protoc` on the machine: Envoy's RLS v3 (the service tollgate serves) and
//! the xDS messages its policy client speaks (ADS, RateLimitConfig).
//!
//! The descriptor set written out for gRPC server reflection holds only the files of the services
//! tollgate serves (RLS and RLQS) and what they import: reflection lists every service of the
//! files it is given, and tollgate does not serve the ADS service (it is its client).

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;

use prost::Message;
use prost_types::FileDescriptorSet;

/// The files of the services tollgate serves: RLS and the Rate Limit Quota Service.
const RLS: &str = "envoy/service/ratelimit/v3/rls.proto";
const RLQS: &str = "envoy/service/rate_limit_quota/v3/rlqs.proto";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = [
        RLS,
        RLQS,
        "envoy/service/discovery/v3/ads.proto",
        "ratelimit/config/ratelimit/v3/rls_conf.proto",
    ];
    println!("cargo:rerun-if-changed=proto");
    if std::env::var_os("CARGO_CFG_TOKIO_UNSTABLE").is_none() {
        // A RUSTFLAGS variable replaces the flags of .cargo/config.toml.
        println!(
            "cargo:warning=built without --cfg tokio_unstable: with a Redis backend the runtime \
             keeps tokio's default scheduling, which sends one decision per socket write under \
             load (add the cfg to RUSTFLAGS)"
        );
    }

    let descriptors = protox::compile(protos, ["proto"])?;
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out_dir.join("rls_descriptor.bin"),
        only_with_imports(&descriptors, &[RLS, RLQS]).encode_to_vec(),
    )?;
    // Every file, for the tests that pin the vendored messages to the upstream field numbers.
    std::fs::write(
        out_dir.join("all_descriptor.bin"),
        descriptors.encode_to_vec(),
    )?;

    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(descriptors)?;
    Ok(())
}

/// The files of `set` that `roots` need: themselves and everything they import, transitively.
fn only_with_imports(set: &FileDescriptorSet, roots: &[&str]) -> FileDescriptorSet {
    let by_name: HashMap<&str, _> = set.file.iter().map(|f| (f.name(), f)).collect();
    let mut needed = BTreeSet::new();
    let mut pending = roots.to_vec();
    while let Some(name) = pending.pop() {
        if needed.insert(name)
            && let Some(file) = by_name.get(name)
        {
            pending.extend(file.dependency.iter().map(String::as_str));
        }
    }
    FileDescriptorSet {
        file: set
            .file
            .iter()
            .filter(|f| needed.contains(f.name()))
            .cloned()
            .collect(),
    }
}
