//! `tollgate-bench`: a load generator for any Envoy RLS v3 gRPC server (tollgate or another).
//!
//! It keeps a fixed number of HTTP/2 connections and in-flight calls, draws descriptor values
//! from a uniform or Zipf key space, and reports decisions per second, outcome counts and an HDR
//! latency histogram. See `tollgate-bench --help`.

mod args;
mod keys;
mod load;
mod report;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use tollgate::proto::rate_limit_service_client::RateLimitServiceClient;
use tonic::transport::{Channel, Endpoint};

use crate::args::{Args, Distribution, Stop};
use crate::keys::KeySampler;
use crate::load::{Load, Shape};
use crate::report::Report;

/// How long to wait for each connection to the target before giving up.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("tollgate-bench: {error:#}");
            ExitCode::from(2)
        }
    }
}

fn run(args: &Args) -> anyhow::Result<()> {
    let sampler = match args.distribution {
        Distribution::Uniform => KeySampler::uniform(args.keys),
        Distribution::Zipf => KeySampler::zipf(args.keys, args.zipf_exponent)?,
    };
    let shape = Arc::new(Shape {
        domain: args.domain.clone(),
        entry_keys: (0..args.descriptors).map(|i| args.entry_key(i)).collect(),
        sampler,
        hits_addend: args.hits_addend,
        descriptor_hits_addend: args.descriptor_hits_addend,
    });

    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    runtime.enable_all();
    if let Some(threads) = args.threads {
        runtime.worker_threads(threads as usize);
    }
    let runtime = runtime.build().context("starting the runtime")?;

    let measured = runtime.block_on(async {
        let load = Load {
            clients: connect(&args.target, args.connections).await?,
            concurrency: args.concurrency,
            rate: args.rate,
            timeout: args.timeout,
            shape,
            seed: args.seed.unwrap_or_else(|| fastrand::u64(..)),
        };
        if !args.warmup.is_zero() {
            load.run(Stop::After(args.warmup), 0).await?;
        }
        load.run(args.stop(), 1).await
    })?;

    let report = Report { args, measured };
    if args.json {
        println!("{}", report.to_json());
    } else {
        print!("{}", report.to_text());
    }
    Ok(())
}

/// Opens `connections` separate HTTP/2 connections to `target` (each endpoint connects on its
/// own, so calls really are spread over that many TCP connections).
async fn connect(
    target: &str,
    connections: u32,
) -> anyhow::Result<Vec<RateLimitServiceClient<Channel>>> {
    let uri = if target.contains("://") {
        target.to_owned()
    } else {
        format!("http://{target}")
    };
    let endpoint = Endpoint::from_shared(uri)
        .with_context(|| format!("`{target}` is not a valid target URI"))?
        .connect_timeout(CONNECT_TIMEOUT)
        .tcp_nodelay(true);
    let mut clients = Vec::with_capacity(connections as usize);
    for _ in 0..connections {
        let channel = endpoint
            .connect()
            .await
            .with_context(|| format!("cannot connect to {target}"))?;
        clients.push(RateLimitServiceClient::new(channel));
    }
    Ok(clients)
}
