//! `attack`: one key hammered far over its limit from many connections, as a client that ignores
//! OVER_LIMIT would do.
//!
//! The limit is small, so the warmup fills it and almost every measured call is refused. What
//! matters is what a refusal costs: decisions per second, tollgate's CPU per decision and, on the
//! Redis backends, how many script calls each refused decision makes (from `INFO commandstats`,
//! reset before every run). Every backend runs with tollgate's local over-limit cache on
//! (`--local-cache-bytes 8MiB`) and off (`0`) in the same run: without the cache every refusal is
//! one script call; with it, about one per entry's lifetime.
//!
//! tollgate runs with `--failure-mode allow` here, so a backend call that failed shows as an
//! admitted hit instead of hiding among the refusals.

use std::fmt::Write as _;

use anyhow::bail;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::doc::{
    Align, Table, count, count_range, fixed, measured, median, ms, percent, range, ratio, times,
};
use crate::load::summary::Summary;
use crate::scenario::{
    Algorithm, Bench, Phase, Scenario, ScenarioName, conditions_of, distinct, per_decision_cell,
    policy, runs_of, say, uniform_shape,
};
use crate::stand::{Backend, Stand};

/// The options of `attack`.
#[derive(Debug, Clone, clap::Args)]
pub struct AttackOptions {
    /// Backends to attack, comma-separated.
    #[arg(long = "backends", value_enum, value_delimiter = ',', default_values_t = [Backend::Memory, Backend::Redis, Backend::RedisCluster])]
    pub backends: Vec<Backend>,

    /// Hits a minute the attacked key may make.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub limit: u64,

    /// Algorithm of the limit.
    #[arg(long = "algorithm", value_enum, default_value_t = Algorithm::Counter)]
    pub algorithm: Algorithm,

    /// Calls in flight, over all connections.
    #[arg(long = "concurrency", default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub concurrency: u32,

    /// HTTP/2 connections of the load generator (the attacker's clients).
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub connections: u32,

    /// Whether tollgate's local over-limit cache is on, for each backend: `true`, `false`, or
    /// both (comma-separated, each a point of its own).
    #[arg(long = "local-cache", value_delimiter = ',', default_values_t = [true, false])]
    pub local_cache: Vec<bool>,
}

/// The `attack` scenario.
pub struct Attack {
    options: AttackOptions,
}

impl Attack {
    /// The scenario with `options`.
    pub fn new(options: AttackOptions) -> Attack {
        Attack { options }
    }
}

/// One measured run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AttackRun {
    /// Where the counters live.
    pub backend: Backend,
    /// Whether the local over-limit cache was on.
    #[serde(default = "on")]
    pub local_cache: bool,
    /// Run number, from 1.
    pub run: u32,
    /// The limit's algorithm.
    pub algorithm: Algorithm,
    /// Hits a minute.
    pub limit: u64,
    /// Calls in flight.
    pub concurrency: u32,
    /// HTTP/2 connections.
    pub connections: u32,
    /// What the load generator saw.
    pub load: Summary,
    /// Script calls the Redis masters served (none for memory).
    pub script_calls: Option<u64>,
    /// CPU seconds of tollgate.
    pub tollgate_cpu_seconds: f64,
    /// CPU seconds of all Redis processes.
    pub redis_cpu_seconds: f64,
}

fn on() -> bool {
    true
}

impl AttackRun {
    fn calls_per_rejection(&self) -> Option<f64> {
        let calls = self.script_calls?;
        (self.load.over_limit > 0).then(|| calls as f64 / self.load.over_limit as f64)
    }

    fn rejected_share(&self) -> Option<f64> {
        (self.load.decisions > 0).then(|| self.load.over_limit as f64 / self.load.decisions as f64)
    }
}

const KEY: &str = "attacked";

impl Scenario for Attack {
    fn name(&self) -> ScenarioName {
        ScenarioName::Attack
    }

    fn run(&self, bench: &mut Bench) -> anyhow::Result<()> {
        let options = &self.options;
        let policy = policy(&[(KEY.to_owned(), options.algorithm, options.limit, 1)]);
        let points = options.backends.iter().flat_map(|&backend| {
            options
                .local_cache
                .iter()
                .map(move |&cache| (backend, cache))
        });
        for (backend, local_cache) in points {
            bench.servers.ensure(backend);
            // Said either way: the default depends on the backend (on for memory only).
            let bytes = if local_cache { "8MiB" } else { "0" };
            let extra = vec!["--local-cache-bytes".to_owned(), bytes.to_owned()];
            let stand = Stand::start_with(&bench.servers, backend, &policy, "allow", &extra)?;
            let connections = bench
                .loader
                .connect(&[stand.grpc_addr()], options.connections)?;
            stand.nodes.flush();
            let phase = |duration| Phase {
                shape: uniform_shape(vec![KEY.to_owned()], 1),
                concurrency: options.concurrency,
                rate: None,
                duration,
            };
            for run in 1..=bench.scale.runs {
                // The warmup spends the limit, so the measured calls are (almost) all refused.
                let warmup = bench
                    .loader
                    .drive(&connections, &phase(bench.scale.warmup))?;
                if warmup.decisions == 0 && !bench.scale.warmup.is_zero() {
                    bail!(
                        "tollgate ({backend}) answered no call in the warmup: {:?}\n{}",
                        warmup.errors_by_code,
                        stand.tollgate.log()
                    );
                }
                stand.nodes.reset_stats();
                let before = (stand.tollgate_cpu_seconds()?, stand.redis_cpu_seconds()?);
                let load = bench
                    .loader
                    .drive(&connections, &phase(bench.scale.duration))?;
                let after = (stand.tollgate_cpu_seconds()?, stand.redis_cpu_seconds()?);
                let script_calls = if backend == Backend::Memory {
                    None
                } else {
                    Some(stand.nodes.script_calls()?.values().sum())
                };
                let result = AttackRun {
                    backend,
                    local_cache,
                    run,
                    algorithm: options.algorithm,
                    limit: options.limit,
                    concurrency: options.concurrency,
                    connections: options.connections,
                    load,
                    script_calls,
                    tollgate_cpu_seconds: after.0 - before.0,
                    redis_cpu_seconds: after.1 - before.1,
                };
                let cache = if local_cache { "cache on" } else { "cache off" };
                say(&format!(
                    "  attack {backend} ({cache}) run {run}: {}/s, {} refused, {} script calls per refusal, errors {}",
                    count(Some(result.load.decisions_per_second)),
                    percent(result.rejected_share()),
                    fixed(result.calls_per_rejection(), 4),
                    result.load.errors
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

/// The attack section of the report.
pub fn render(records: &[Value]) -> anyhow::Result<String> {
    let conditions = conditions_of(records)?;
    let runs: Vec<AttackRun> = runs_of(records, "attack")?;
    let first = &runs[0];
    let points = distinct(runs.iter().map(|run| (run.backend, run.local_cache)));
    let of = |point: (Backend, bool)| -> Vec<&AttackRun> {
        runs.iter()
            .filter(|r| (r.backend, r.local_cache) == point)
            .collect()
    };
    let rate =
        |point: (Backend, bool)| median(of(point).iter().map(|r| r.load.decisions_per_second));
    let calls =
        |point: (Backend, bool)| median(of(point).iter().filter_map(|r| r.calls_per_rejection()));

    let mut out = String::new();
    let _ = writeln!(
        out,
        "**One key far over its limit.** {} One descriptor, always the same value, limited to {} hits a minute ({}), sent closed \
         loop by {} calls in flight over {} HTTP/2 connections; the warmup spends the limit, so \
         nearly every measured call is refused. *Script calls per refusal*: `evalsha` and `eval` \
         calls the Redis masters served during the run (from `INFO commandstats`) over the \
         refused decisions. Each backend runs with tollgate's local over-limit cache on \
         (`--local-cache-bytes 8MiB`) and off (`0`). tollgate runs with `--failure-mode allow`, \
         so a failed backend call would show among the admitted.\n",
        measured(&conditions),
        first.limit,
        first.algorithm.name(),
        first.concurrency,
        first.connections,
    );
    let mut table = Table::new(&[
        ("backend", Align::Left),
        ("local cache", Align::Left),
        ("decisions/s", Align::Right),
        ("min–max", Align::Right),
        ("refused", Align::Right),
        ("admitted", Align::Right),
        ("script calls per refusal", Align::Right),
        ("tollgate CPU µs/decision", Align::Right),
        ("Redis CPU µs/decision", Align::Right),
        ("p50 ms", Align::Right),
        ("p99 ms", Align::Right),
        ("errors", Align::Right),
    ]);
    for &point in &points {
        let (backend, local_cache) = point;
        let runs = of(point);
        let is_memory = backend == Backend::Memory;
        table.row(vec![
            backend.to_string(),
            if local_cache { "on" } else { "off" }.to_owned(),
            count(rate(point)),
            count_range(range(runs.iter().map(|r| r.load.decisions_per_second))),
            percent(median(runs.iter().filter_map(|r| r.rejected_share()))),
            runs.iter().map(|r| r.load.ok).sum::<u64>().to_string(),
            fixed(calls(point), 4),
            per_decision_cell(
                runs.iter()
                    .map(|r| (r.tollgate_cpu_seconds, r.load.decisions)),
            ),
            if is_memory {
                crate::doc::NONE.to_owned()
            } else {
                per_decision_cell(runs.iter().map(|r| (r.redis_cpu_seconds, r.load.decisions)))
            },
            ms(median(runs.iter().map(|r| r.load.latency_us.p50))),
            ms(median(runs.iter().map(|r| r.load.latency_us.p99))),
            runs.iter()
                .map(|r| r.load.errors + r.load.unknown)
                .sum::<u64>()
                .to_string(),
        ]);
    }
    out.push_str(&table.render());
    let mut notes = Vec::new();
    let memory = (Backend::Memory, true);
    if points.contains(&memory) {
        for &point in points
            .iter()
            .filter(|(b, cache)| *b != Backend::Memory && *cache)
        {
            notes.push(format!(
                "{} ÷ memory {}",
                point.0,
                times(ratio(rate(point), rate(memory)))
            ));
        }
    }
    for &(backend, _) in points.iter().filter(|(_, cache)| *cache) {
        let (on, off) = ((backend, true), (backend, false));
        if backend != Backend::Memory && points.contains(&off) {
            notes.push(format!(
                "{backend} script calls per refusal {} with the cache off, {} with it on",
                fixed(calls(off), 4),
                fixed(calls(on), 4)
            ));
        }
    }
    if !notes.is_empty() {
        let _ = writeln!(
            out,
            "\nDecisions/s under attack with the cache on, and the cache's saving, same run: {}.",
            notes.join("; ")
        );
    }
    Ok(out)
}
