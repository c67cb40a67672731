//! `tollgate-bench load`: a load generator for any Envoy RLS v3 gRPC server (tollgate or
//! another). It keeps a fixed number of HTTP/2 connections and in-flight calls, draws descriptor
//! values from a uniform or Zipf key space, and reports decisions per second, outcome counts and
//! an HDR latency histogram. The scenarios drive tollgate with the same generator.

pub mod args;
pub mod client;
pub mod generator;
pub mod keys;
pub mod summary;

use std::sync::Arc;

use anyhow::Context;

use crate::load::args::{Distribution, LoadArgs, Stop};
use crate::load::generator::{Load, Shape, connect};
use crate::load::keys::KeySampler;
use crate::load::summary::{Report, Summary};

impl LoadArgs {
    /// What every request of this run looks like.
    pub fn shape(&self) -> anyhow::Result<Shape> {
        let sampler = match self.distribution {
            Distribution::Uniform => KeySampler::uniform(self.keys),
            Distribution::Zipf => KeySampler::zipf(self.keys, self.zipf_exponent)?,
        };
        Ok(Shape {
            domain: self.domain.clone(),
            entry_keys: (0..self.descriptors).map(|i| self.entry_key(i)).collect(),
            sampler,
            hits_addend: self.hits_addend,
            descriptor_hits_addend: self.descriptor_hits_addend,
        })
    }
}

/// Runs `tollgate-bench load`: connects, warms up, measures and prints the report.
pub fn run(args: &LoadArgs) -> anyhow::Result<()> {
    let shape = Arc::new(args.shape()?);
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

    let report = Report {
        args,
        summary: Summary::of(&measured),
    };
    if args.json {
        println!("{}", report.to_json());
    } else {
        print!("{}", report.to_text());
    }
    Ok(())
}
