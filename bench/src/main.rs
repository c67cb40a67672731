//! `tollgate-bench`: tollgate's one benchmark tool.
//!
//! `load` is a load generator for any Envoy RLS v3 gRPC server. The scenarios (`tollgate-bench
//! list` names them) start what they need (tollgate as a process, Redis and a Redis Cluster
//! through the testkit, redis-benchmark for the floors, a stock tonic RLS server, a
//! limitador-server the operator built, valgrind), measure, keep every run as a JSON line in
//! `target/bench/`, and print their report section; `report` runs several of them and writes
//! `docs/performance.md`. See `tollgate-bench --help`.

mod doc;
mod empty;
mod h2load;
mod load;
mod machine;
mod proc;
mod report;
mod scenario;
mod stand;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::load::args::LoadArgs;
use crate::report::ReportArgs;
use crate::scenario::accuracy::{Accuracy, AccuracyOptions};
use crate::scenario::attack::{Attack, AttackOptions};
use crate::scenario::burst::{Burst, BurstOptions};
use crate::scenario::cost::{Cost, CostOptions};
use crate::scenario::envoy::{EnvoyOptions, EnvoyScenario};
use crate::scenario::grpc_floor::{GrpcFloor, GrpcFloorOptions};
use crate::scenario::hotkey::{Hotkey, HotkeyOptions};
use crate::scenario::instructions::{Instructions, InstructionsOptions};
use crate::scenario::keys::{Keys, KeysOptions};
use crate::scenario::lease::{Lease, LeaseOptions};
use crate::scenario::limitador::{Limitador, LimitadorOptions};
use crate::scenario::matrix::{Matrix, MatrixOptions};
use crate::scenario::memory::{Memory, MemoryOptions};
use crate::scenario::overload::{Overload, OverloadOptions};
use crate::scenario::redis_cpu::{RedisCpu, RedisCpuOptions};
use crate::scenario::{Bench, ScaleArgs, Scenario, ScenarioName};

/// tollgate's benchmarks: a load generator for any RLS v3 server, and scenarios that start
/// tollgate and Redis themselves and report how fast it decides.
#[derive(Debug, Parser)]
#[command(name = "tollgate-bench", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Send load to any Envoy RLS v3 (`envoy.service.ratelimit.v3.RateLimitService`) server and
    /// report decisions per second, outcomes and latency.
    ///
    /// Every run is bounded: by `--requests`, or by `--duration` (10 s when neither is given).
    /// With `--rate` the load is open loop: calls are scheduled at fixed intervals, and a call
    /// sent late because every in-flight slot was busy is timed from its scheduled time, so a
    /// stalled server is not hidden by the generator waiting for it (coordinated omission).
    /// Without `--rate`, every in-flight slot sends its next call as soon as the previous one
    /// returns (closed loop). Latency covers answered calls; failed calls are counted by code.
    Load(LoadArgs),

    /// Backend × algorithm × shards × concurrency: the closed-loop peak, CPU per decision of
    /// tollgate and Redis, and the latency at half the peak.
    Matrix {
        #[command(flatten)]
        scale: ScaleArgs,
        #[command(flatten)]
        options: MatrixOptions,
    },

    /// One hot limit on the Redis Cluster, unsharded and sharded: throughput, and how the
    /// script calls spread over the masters.
    Hotkey {
        #[command(flatten)]
        scale: ScaleArgs,
        #[command(flatten)]
        options: HotkeyOptions,
    },

    /// One key hammered far over its limit: decisions per second and script calls per refusal.
    Attack {
        #[command(flatten)]
        scale: ScaleArgs,
        #[command(flatten)]
        options: AttackOptions,
    },

    /// Twice the saturation rate, with and without a bound on decisions in flight: answered
    /// latency, refusals and tollgate's memory.
    Overload {
        #[command(flatten)]
        scale: ScaleArgs,
        #[command(flatten)]
        options: OverloadOptions,
    },

    /// A flood of distinct keys on the memory backend: bytes per key at the budget, evictions,
    /// and memory after the flood.
    Memory {
        #[command(flatten)]
        scale: ScaleArgs,
        #[command(flatten)]
        options: MemoryOptions,
    },

    /// How far each algorithm's admissions are from the exact limit on simulated traffic, and
    /// what a hit costs in memory.
    Accuracy {
        #[command(flatten)]
        scale: ScaleArgs,
        #[command(flatten)]
        options: AccuracyOptions,
    },

    /// Redis CPU per decision for each algorithm, backend, shard count and traffic mix, beside
    /// a minimal script and envoyproxy/ratelimit's commands on the same server.
    RedisCpu {
        #[command(flatten)]
        scale: ScaleArgs,
        #[command(flatten)]
        options: RedisCpuOptions,
    },

    /// The per-limit statistics' cost on the memory backend: `DISABLE_STATS=true` against the
    /// defaults (tracing off), interleaved runs; throughput ratio and CPU per decision.
    Cost {
        #[command(flatten)]
        scale: ScaleArgs,
        #[command(flatten)]
        options: CostOptions,
    },

    /// One hot limit shared by several tollgate instances, leased and unleased, on Redis and the
    /// Redis Cluster beside the memory backend: decisions per second, script calls per
    /// decision, and the hits admitted at twice the limit.
    Lease {
        #[command(flatten)]
        scale: ScaleArgs,
        #[command(flatten)]
        options: LeaseOptions,
    },

    /// A burst at three times a leased limit (long and short window) shared by three tollgate
    /// instances, on Redis and the Redis Cluster: hits admitted against the limit, script calls
    /// per decision and decisions per second.
    Burst {
        #[command(flatten)]
        scale: ScaleArgs,
        #[command(flatten)]
        options: BurstOptions,
    },

    /// Keys a sliding window log limit keyed per client keeps in one Redis during load, and how
    /// long they stay after the last hit, beside the bound of three windows plus one second.
    Keys {
        #[command(flatten)]
        scale: ScaleArgs,
        #[command(flatten)]
        options: KeysOptions,
    },

    /// tollgate on the memory backend against the empty RLS server (a stock tonic server
    /// answering OK without deciding), interleaved runs: the throughput ratio, CPU per decision,
    /// and the latency at half of tollgate's peak.
    GrpcFloor {
        #[command(flatten)]
        scale: ScaleArgs,
        #[command(flatten)]
        options: GrpcFloorOptions,
    },

    /// tollgate on one Redis against Kuadrant's limitador-server (`redis` and `redis_cached`
    /// storages) on the same Redis, interleaved runs: throughput ratio, CPU of each server and
    /// of Redis per decision. Needs a limitador-server built from its repository
    /// (`--limitador-server` or `$LIMITADOR_SERVER`).
    Limitador {
        #[command(flatten)]
        scale: ScaleArgs,
        #[command(flatten)]
        options: LimitadorOptions,
    },

    /// Envoy (one worker) with no rate-limit filter, with the RLS filter (on a plain and on a
    /// leased limit) and with the RLQS filter, in front of one tollgate on one Redis, the same
    /// h2load requests to each: requests a second, added latency, CPU, calls to tollgate and to
    /// Redis per request, and a sizing table.
    Envoy {
        #[command(flatten)]
        scale: ScaleArgs,
        #[command(flatten)]
        options: EnvoyOptions,
    },

    /// Instructions per call, counted by callgrind: the empty RLS server, tollgate on the memory
    /// backend (by default, without the local cache, without per-limit statistics) and tollgate
    /// on one Redis, each under valgrind, sent the same calls by h2load (needs valgrind and
    /// h2load).
    Instructions {
        #[command(flatten)]
        scale: ScaleArgs,
        #[command(flatten)]
        options: InstructionsOptions,
    },

    /// Serve the empty RLS v3 server, a stock tonic server (every descriptor OK, nothing
    /// decided), until killed; prints `listening on ADDR` once bound. The `grpc-floor` scenario starts it.
    EmptyServer(empty::EmptyServerArgs),

    /// Run scenarios and write their results into docs/performance.md.
    Report(ReportArgs),

    /// Print the name of every scenario `report` runs, one a line, in report order.
    List,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("tollgate-bench: {error:#}");
            ExitCode::from(2)
        }
    }
}

fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Load(args) => load::run(&args),
        Command::Matrix { scale, options } => run_one(&scale, &Matrix::new(options)),
        Command::Hotkey { scale, options } => run_one(&scale, &Hotkey::new(options)),
        Command::Attack { scale, options } => run_one(&scale, &Attack::new(options)),
        Command::Overload { scale, options } => run_one(&scale, &Overload::new(options)),
        Command::Memory { scale, options } => run_one(&scale, &Memory::new(options)),
        Command::Accuracy { scale, options } => run_one(&scale, &Accuracy::new(options)),
        Command::RedisCpu { scale, options } => run_one(&scale, &RedisCpu::new(options)),
        Command::Cost { scale, options } => run_one(&scale, &Cost::new(options)),
        Command::Lease { scale, options } => run_one(&scale, &Lease::new(options)),
        Command::Burst { scale, options } => run_one(&scale, &Burst::new(options)),
        Command::Keys { scale, options } => run_one(&scale, &Keys::new(options)),
        Command::GrpcFloor { scale, options } => run_one(&scale, &GrpcFloor::new(options)),
        Command::Limitador { scale, options } => run_one(&scale, &Limitador::new(options)),
        Command::Envoy { scale, options } => run_one(&scale, &EnvoyScenario::new(options)),
        Command::Instructions { scale, options } => run_one(&scale, &Instructions::new(options)),
        Command::EmptyServer(args) => empty::run(&args),
        Command::Report(args) => report::run(&args),
        Command::List => {
            for name in ScenarioName::ALL {
                println!("{}", name.name());
            }
            Ok(())
        }
    }
}

/// Runs one scenario and prints its report section.
fn run_one(scale: &ScaleArgs, scenario: &dyn Scenario) -> anyhow::Result<()> {
    if let Some(reason) = scenario.unavailable() {
        anyhow::bail!("cannot run {}: {reason}", scenario.name().name());
    }
    let dir = scale.by_hand_results_dir();
    let mut bench = Bench::new(scale.scale(), &dir)?;
    let records = bench.run(scenario)?;
    print!("{}", scenario.render(&records)?);
    Ok(())
}
