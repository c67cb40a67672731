//! `hotkey`: one limit that every request shares, on the Redis Cluster, unsharded and split over
//! shards.
//!
//! Unsharded, a hot limit is one key, so one master serves every call and its one core caps the
//! limit however many masters and tollgate instances there are. With `shards: N` its budget is
//! split over N keys on slots spread over the masters. Each run drives one shard count closed
//! loop with one descriptor whose value never changes; before it every node's statistics are
//! reset, and after it `INFO commandstats` tells how many script calls each master served. Runs
//! alternate between the shard counts. The limit is far above the load, so every hit is admitted
//! and is exactly one script call.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use anyhow::bail;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::doc::{Align, Table, count, fixed, measured, median, ms, percent, ratio, times};
use crate::load::summary::Summary;
use crate::scenario::{
    Algorithm, Bench, Phase, Scenario, ScenarioName, UNREACHABLE_LIMIT, conditions_of, load_cells,
    policy, runs_of, say, uniform_shape,
};
use crate::stand::{Backend, Stand};

/// The options of `hotkey`.
#[derive(Debug, Clone, clap::Args)]
pub struct HotkeyOptions {
    /// Shard counts to compare, comma-separated; the first is the baseline of the ratios.
    #[arg(long = "shards", value_delimiter = ',', default_values_t = [1u16, 8], value_parser = clap::value_parser!(u16).range(1..=64))]
    pub shards: Vec<u16>,

    /// Algorithm of the hot limit.
    #[arg(long = "algorithm", value_enum, default_value_t = Algorithm::Counter)]
    pub algorithm: Algorithm,

    /// Calls in flight, over all connections.
    #[arg(long = "concurrency", default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub concurrency: u32,

    /// HTTP/2 connections of the load generator.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub connections: u32,
}

/// The `hotkey` scenario.
pub struct Hotkey {
    options: HotkeyOptions,
}

impl Hotkey {
    /// The scenario with `options`.
    pub fn new(options: HotkeyOptions) -> Hotkey {
        Hotkey { options }
    }
}

/// What one master did during a run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MasterRun {
    /// Its port.
    pub port: u16,
    /// The slots it serves.
    pub slots: String,
    /// Script calls it served.
    pub script_calls: u64,
    /// Its CPU seconds.
    pub cpu_seconds: f64,
}

/// One measured run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HotkeyRun {
    /// Run number, from 1.
    pub run: u32,
    /// Shards of the hot limit.
    pub shards: u16,
    /// Its algorithm.
    pub algorithm: Algorithm,
    /// Calls in flight.
    pub concurrency: u32,
    /// HTTP/2 connections.
    pub connections: u32,
    /// What the load generator saw.
    pub load: Summary,
    /// Every master.
    pub masters: Vec<MasterRun>,
    /// CPU seconds of all Redis processes, replicas included.
    pub redis_cpu_seconds: f64,
    /// CPU seconds of tollgate.
    pub tollgate_cpu_seconds: f64,
}

impl HotkeyRun {
    fn busiest_share(&self) -> Option<f64> {
        let total: u64 = self.masters.iter().map(|m| m.script_calls).sum();
        let busiest = self.masters.iter().map(|m| m.script_calls).max()?;
        (total > 0).then(|| busiest as f64 / total as f64)
    }

    fn busiest_cpu(&self) -> Option<f64> {
        self.masters
            .iter()
            .max_by_key(|m| m.script_calls)
            .map(|m| m.cpu_seconds)
    }

    fn failed(&self) -> u64 {
        self.load.errors + self.load.over_limit + self.load.unknown
    }
}

fn hot_key(shards: u16) -> String {
    format!("hot_s{shards}")
}

impl Scenario for Hotkey {
    fn name(&self) -> ScenarioName {
        ScenarioName::Hotkey
    }

    fn run(&self, bench: &mut Bench) -> anyhow::Result<()> {
        let options = &self.options;
        let limits: Vec<_> = options
            .shards
            .iter()
            .map(|&shards| {
                (
                    hot_key(shards),
                    options.algorithm,
                    UNREACHABLE_LIMIT,
                    shards,
                )
            })
            .collect();
        bench.servers.ensure(Backend::RedisCluster);
        let stand = Stand::start(
            &bench.servers,
            Backend::RedisCluster,
            &policy(&limits),
            "deny",
        )?;
        let connections = bench
            .loader
            .connect(&[stand.grpc_addr()], options.connections)?;
        stand.nodes.flush();
        let slots = stand.nodes.slots();
        for run in 1..=bench.scale.runs {
            for &shards in &options.shards {
                let phase = |duration| Phase {
                    shape: uniform_shape(vec![hot_key(shards)], 1),
                    concurrency: options.concurrency,
                    rate: None,
                    duration,
                };
                let warmup = bench
                    .loader
                    .drive(&connections, &phase(bench.scale.warmup))?;
                if warmup.decisions == 0 && !bench.scale.warmup.is_zero() {
                    bail!(
                        "tollgate answered no call in the warmup: {:?}\n{}",
                        warmup.errors_by_code,
                        stand.tollgate.log()
                    );
                }
                stand.nodes.reset_stats();
                let cpu_before = stand.nodes.cpu_seconds()?;
                let tollgate_before = stand.tollgate_cpu_seconds()?;
                let load = bench
                    .loader
                    .drive(&connections, &phase(bench.scale.duration))?;
                let tollgate_after = stand.tollgate_cpu_seconds()?;
                let cpu_after = stand.nodes.cpu_seconds()?;
                let calls = stand.nodes.script_calls()?;
                let cpu = |port: u16| {
                    cpu_after.get(&port).copied().unwrap_or(0.0)
                        - cpu_before.get(&port).copied().unwrap_or(0.0)
                };
                let result = HotkeyRun {
                    run,
                    shards,
                    algorithm: options.algorithm,
                    concurrency: options.concurrency,
                    connections: options.connections,
                    masters: calls
                        .iter()
                        .map(|(&port, &script_calls)| MasterRun {
                            port,
                            slots: slots.get(&port).cloned().unwrap_or_default(),
                            script_calls,
                            cpu_seconds: cpu(port),
                        })
                        .collect(),
                    redis_cpu_seconds: cpu_after.keys().map(|&port| cpu(port)).sum(),
                    tollgate_cpu_seconds: tollgate_after - tollgate_before,
                    load,
                };
                say(&format!(
                    "  hotkey run {run} shards {shards}: {}/s, p99 {} ms, failed {}, script calls per master {}",
                    count(Some(result.load.decisions_per_second)),
                    ms(Some(result.load.latency_us.p99)),
                    result.failed(),
                    result
                        .masters
                        .iter()
                        .map(|m| format!(":{} {}", m.port, m.script_calls))
                        .collect::<Vec<_>>()
                        .join(" / ")
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

/// The hot-key section of the report.
pub fn render(records: &[Value]) -> anyhow::Result<String> {
    let conditions = conditions_of(records)?;
    let runs: Vec<HotkeyRun> = runs_of(records, "hotkey")?;
    let first = &runs[0];
    let mut shard_counts: Vec<u16> = Vec::new();
    let mut by_shards: BTreeMap<u16, Vec<&HotkeyRun>> = BTreeMap::new();
    for run in &runs {
        if !shard_counts.contains(&run.shards) {
            shard_counts.push(run.shards);
        }
        by_shards.entry(run.shards).or_default().push(run);
    }
    let rate = |shards: u16| {
        median(
            by_shards[&shards]
                .iter()
                .map(|r| r.load.decisions_per_second),
        )
    };
    let share = |shards: u16| median(by_shards[&shards].iter().filter_map(|r| r.busiest_share()));

    let mut out = String::new();
    let _ = writeln!(
        out,
        "**One hot limit on the cluster, unsharded and sharded.** {} Every request carries one descriptor with the same value, so every call hits one \
         limit ({}, far above the load: every hit is admitted and is one script call on the \
         master that owns its shard), closed loop with {} calls in flight over {} HTTP/2 \
         connections, against the Redis Cluster of three masters and three replicas. Runs \
         alternate between the shard counts. Script calls per master come from `INFO \
         commandstats` (`evalsha` and `eval`), reset before each run; CPU from `INFO cpu`.\n",
        measured(&conditions),
        first.algorithm.name(),
        first.concurrency,
        first.connections,
    );
    let mut table = Table::new(&[
        ("shards", Align::Right),
        ("decisions/s", Align::Right),
        ("min–max", Align::Right),
        ("p50 ms", Align::Right),
        ("p99 ms", Align::Right),
        ("busiest master's share of script calls", Align::Right),
        ("busiest master CPU s/run", Align::Right),
        ("all Redis CPU s/run", Align::Right),
        ("failed", Align::Right),
    ]);
    for &shards in &shard_counts {
        let runs = &by_shards[&shards];
        let mut row = vec![shards.to_string()];
        row.extend(load_cells(runs.iter().map(|r| &r.load)));
        row.extend([
            percent(share(shards)),
            fixed(median(runs.iter().filter_map(|r| r.busiest_cpu())), 2),
            fixed(median(runs.iter().map(|r| r.redis_cpu_seconds)), 2),
            runs.iter().map(|r| r.failed()).sum::<u64>().to_string(),
        ]);
        table.row(row);
    }
    out.push_str(&table.render());
    out.push('\n');
    let base = shard_counts[0];
    for &shards in &shard_counts[1..] {
        let _ = writeln!(
            out,
            "`shards: {shards}` over `shards: {base}`: {} the decisions/s; the busiest master's \
             share of the calls went from {} to {}.",
            times(ratio(rate(shards), rate(base))),
            percent(share(base)),
            percent(share(shards)),
        );
    }
    Ok(out)
}
