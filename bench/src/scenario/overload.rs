//! `overload`: load at twice what tollgate can decide, with and without a bound on decisions in
//! flight (`--max-in-flight`).
//!
//! Each point starts tollgate with the production backend deadline (`--backend-timeout 50ms`)
//! and one bound (0: unbounded), finds its saturation rate closed loop, then sends twice that
//! open loop with many calls in flight. Unbounded, every call waits its turn: queues grow and
//! the answered calls come back late, later than Envoy's own 20 ms timeout would wait. Bounded,
//! the calls past the bound are answered at once with `RESOURCE_EXHAUSTED` (counted as
//! *refused*), and the answered ones keep their latency. tollgate's resident memory is read
//! before and after the overload phase: it stays flat when the queue is bounded.
//!
//! tollgate runs with `--failure-mode deny` under a limit no load reaches, so a decision that
//! missed its backend deadline shows as *late* (OVER_LIMIT) instead of passing for an admission.

use std::fmt::Write as _;
use std::sync::Arc;

use anyhow::bail;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::doc::{Align, Table, count, measured, median, ms};
use crate::load::summary::Summary;
use crate::proc::Layout;
use crate::scenario::{
    Algorithm, Bench, Phase, Scenario, ScenarioName, UNREACHABLE_LIMIT, conditions_of, distinct,
    policy, runs_of, say, uniform_shape,
};
use crate::stand::{Backend, Stand};

/// The options of `overload`.
#[derive(Debug, Clone, clap::Args)]
pub struct OverloadOptions {
    /// Where the counters live.
    #[arg(long, value_enum, default_value_t = Backend::Redis)]
    pub backend: Backend,

    /// `--max-in-flight` values to compare, comma-separated; 0 is unbounded.
    #[arg(long = "bounds", value_delimiter = ',', default_values_t = [0usize, 1024, 256, 64])]
    pub bounds: Vec<usize>,

    /// How many times the saturation rate the overload phase sends.
    #[arg(long, default_value_t = 2.0)]
    pub factor: f64,

    /// Calls in flight while finding the saturation rate (closed loop).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub concurrency: u32,

    /// Calls the generator may have in flight during the overload (open loop): far more than
    /// tollgate answers, so the generator does not itself hold the load back.
    #[arg(long, default_value_t = 4096, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub slots: u32,

    /// The share of a CPU Redis may use (stopped and resumed in 5 ms cycles), so that the
    /// backend, not the cores the generator shares, is what saturates; 1 runs it freely.
    #[arg(long, default_value_t = 0.2)]
    pub redis_share: f64,

    /// HTTP/2 connections of the load generator.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub connections: u32,
}

/// The `overload` scenario.
pub struct Overload {
    options: OverloadOptions,
}

impl Overload {
    /// The scenario with `options`.
    pub fn new(options: OverloadOptions) -> Overload {
        Overload { options }
    }
}

/// One measured run of one bound.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OverloadRun {
    /// Where the counters live.
    pub backend: Backend,
    /// `--max-in-flight`; 0 is unbounded.
    pub bound: usize,
    /// Run number, from 1.
    pub run: u32,
    /// Decisions per second closed loop: the saturation rate.
    pub saturation: f64,
    /// The open-loop rate of the overload phase.
    pub target_rate: f64,
    /// What the load generator saw during the overload.
    pub load: Summary,
    /// The share of a CPU Redis was held to (1: unthrottled).
    #[serde(default = "unthrottled")]
    pub redis_share: f64,
    /// tollgate's resident memory before the overload phase.
    pub rss_before: u64,
    /// tollgate's resident memory after it.
    pub rss_after: u64,
}

impl OverloadRun {
    fn refused(&self) -> u64 {
        self.load
            .errors_by_code
            .get("RESOURCE_EXHAUSTED")
            .copied()
            .unwrap_or(0)
    }
}

const KEY: &str = "user";

fn unthrottled() -> f64 {
    1.0
}

impl Scenario for Overload {
    fn name(&self) -> ScenarioName {
        ScenarioName::Overload
    }

    fn run(&self, bench: &mut Bench) -> anyhow::Result<()> {
        let options = &self.options;
        let backend = options.backend;
        let policy = policy(&[(KEY.to_owned(), Algorithm::Counter, UNREACHABLE_LIMIT, 1)]);
        bench.servers.ensure(backend);
        let shape = uniform_shape(vec![KEY.to_owned()], 10_000);
        for &bound in &options.bounds {
            let extra = [
                "--backend-timeout".to_owned(),
                "50ms".to_owned(),
                "--max-in-flight".to_owned(),
                bound.to_string(),
            ];
            // The generator must be able to send twice what the server answers; on shared
            // cores it would fall behind, and its own backlog would show as tollgate's latency.
            let stand = Stand::start_laid_out(
                &bench.servers,
                backend,
                &policy,
                "deny",
                &extra,
                Layout::GeneratorApart,
            )?;
            let connections = bench
                .loader
                .connect(&[stand.grpc_addr()], options.connections)?;
            stand.nodes.flush();
            let _slow = (options.redis_share < 1.0 && backend != Backend::Memory)
                .then(|| stand.nodes.throttle(options.redis_share));
            for run in 1..=bench.scale.runs {
                let closed = |duration| Phase {
                    shape: Arc::clone(&shape),
                    concurrency: options.concurrency,
                    rate: None,
                    duration,
                };
                bench
                    .loader
                    .drive(&connections, &closed(bench.scale.warmup))?;
                let peak = bench
                    .loader
                    .drive(&connections, &closed(bench.scale.duration))?;
                if peak.decisions == 0 {
                    bail!(
                        "tollgate ({backend}, --max-in-flight {bound}) decided nothing closed loop: {:?}\n{}",
                        peak.errors_by_code,
                        stand.tollgate.log()
                    );
                }
                let target_rate = peak.decisions_per_second * options.factor;
                let rss_before = stand.tollgate_rss_bytes()?;
                let load = bench.loader.drive(
                    &connections,
                    &Phase {
                        shape: Arc::clone(&shape),
                        concurrency: options.slots,
                        rate: Some(target_rate),
                        duration: bench.scale.duration,
                    },
                )?;
                let rss_after = stand.tollgate_rss_bytes()?;
                let result = OverloadRun {
                    backend,
                    bound,
                    run,
                    saturation: peak.decisions_per_second,
                    target_rate,
                    redis_share: if backend == Backend::Memory {
                        1.0
                    } else {
                        options.redis_share.min(1.0)
                    },
                    load,
                    rss_before,
                    rss_after,
                };
                say(&format!(
                    "  overload --max-in-flight {bound} run {run}: saturation {}/s, sent {}/s, \
                     decided {}/s, refused {}, p99 {} ms, RSS {} -> {} MiB",
                    count(Some(result.saturation)),
                    count(Some(result.load.requests_per_second)),
                    count(Some(result.load.decisions_per_second)),
                    result.refused(),
                    ms(Some(result.load.latency_us.p99)),
                    result.rss_before >> 20,
                    result.rss_after >> 20,
                ));
                bench.records.record("run", &result)?;
            }
        }
        Ok(())
    }

    fn render(&self, records: &[Value]) -> anyhow::Result<String> {
        render(records)
    }
}

/// The overload section of the report.
pub fn render(records: &[Value]) -> anyhow::Result<String> {
    let conditions = conditions_of(records)?;
    let runs: Vec<OverloadRun> = runs_of(records, "overload")?;
    let first = &runs[0];
    let bounds = distinct(runs.iter().map(|run| run.bound));
    let mut out = String::new();
    let _ = writeln!(
        out,
        "**Twice the saturation rate.** {} Backend {}, `--backend-timeout 50ms`, one descriptor with values drawn uniformly from \
         10,000 keys, under a limit no load reaches (`--failure-mode deny`, so a decision that \
         missed its deadline shows as *late*). Redis is held to {:.0}% of a CPU (stopped and \
         resumed in 5 ms cycles), a slow backend: what saturates is the backend, the case where \
         decisions queue inside tollgate. tollgate (one worker) and Redis share CPU 0; the \
         load generator runs on the other CPUs, so that it can send more than they answer. Per \
         run: the saturation rate closed loop, then {}× that rate open loop (*asked*) with up to \
         many calls in flight; *sent* falls short of it when the generator itself cannot keep \
         up, and latency counts from each call's scheduled time. *Refused*: calls answered at \
         once with `RESOURCE_EXHAUSTED` past the bound; latency is of the answered decisions; \
         RSS is tollgate's resident memory before and after the overload phase (medians).\n",
        measured(&conditions),
        first.backend,
        first.redis_share * 100.0,
        // Rounded: the factor read back from the results file may differ in its last bit.
        crate::doc::fixed(Some(first.target_rate / first.saturation.max(1.0)), 1),
    );
    let mut table = Table::new(&[
        ("--max-in-flight", Align::Left),
        ("saturation/s", Align::Right),
        ("asked/s", Align::Right),
        ("sent/s", Align::Right),
        ("decided/s", Align::Right),
        ("refused/s", Align::Right),
        ("late", Align::Right),
        ("p50 ms", Align::Right),
        ("p99 ms", Align::Right),
        ("p99.9 ms", Align::Right),
        ("max ms", Align::Right),
        ("RSS before MiB", Align::Right),
        ("RSS after MiB", Align::Right),
    ]);
    for &bound in &bounds {
        let runs: Vec<&OverloadRun> = runs.iter().filter(|r| r.bound == bound).collect();
        let mib = |bytes: u64| bytes as f64 / f64::from(1u32 << 20);
        table.row(vec![
            if bound == 0 {
                "unbounded".to_owned()
            } else {
                bound.to_string()
            },
            count(median(runs.iter().map(|r| r.saturation))),
            count(median(runs.iter().map(|r| r.target_rate))),
            count(median(runs.iter().map(|r| r.load.requests_per_second))),
            count(median(runs.iter().map(|r| r.load.decisions_per_second))),
            count(median(runs.iter().map(|r| {
                r.refused() as f64 / r.load.elapsed_seconds.max(f64::MIN_POSITIVE)
            }))),
            runs.iter()
                .map(|r| r.load.over_limit)
                .sum::<u64>()
                .to_string(),
            ms(median(runs.iter().map(|r| r.load.latency_us.p50))),
            ms(median(runs.iter().map(|r| r.load.latency_us.p99))),
            ms(median(runs.iter().map(|r| r.load.latency_us.p99_9))),
            ms(median(runs.iter().map(|r| r.load.latency_us.max))),
            crate::doc::fixed(median(runs.iter().map(|r| mib(r.rss_before))), 1),
            crate::doc::fixed(median(runs.iter().map(|r| mib(r.rss_after))), 1),
        ]);
    }
    out.push_str(&table.render());
    Ok(out)
}
