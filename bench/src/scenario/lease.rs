//! `lease`: one hot limit shared by three tollgate instances, leased and unleased, on one Redis
//! and on the Redis Cluster, beside the same instances on the memory backend.
//!
//! Two parts per algorithm. **Throughput**: closed loop on one descriptor whose limit is above
//! what this machine can send, spread evenly over the instances; decisions per second, and the
//! script calls the masters served per decision (`INFO commandstats`, reset before each run).
//! Unleased, every decision is one script call; leased, an instance answers from its slice and
//! calls the store about twice per slice (reserve, settle). The memory backend's instances share
//! nothing, so they are the ceiling: what the same three processes do with no store at all.
//! **Overload**: open loop at twice a per-second limit, spread over the instances, after a
//! warmup that fills the window; the hits admitted against what the limit allows over the run
//! (its rate times the run's length). Leased, the slices shrink as the limit nears, so the
//! admissions should reach the limit without passing it.
//!
//! tollgate runs with `--failure-mode deny`: a failed store call shows as a refusal, never as an
//! admission that would flatter the overload ratio, and in the throughput part (where the limit
//! is never reached) as a failed decision. The local over-limit cache is on in the overload part
//! (`--local-cache-bytes 8MiB`), as an operator who leases a hot limit would run it.

use std::fmt::Write as _;
use std::time::Duration;

use anyhow::bail;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::doc::{Align, Table, count, fixed, measured, median, percent, range, ratio, times};
use crate::load::summary::Summary;
use crate::scenario::{
    Algorithm, Bench, DOMAIN, Phase, Scenario, ScenarioName, conditions_of, distinct, load_cells,
    per_decision_cell, records_of, say, uniform_shape,
};
use crate::stand::{Backend, Stand};

/// The options of `lease`.
#[derive(Debug, Clone, clap::Args)]
pub struct LeaseOptions {
    /// Store backends to compare, comma-separated (the memory backend always runs as the
    /// ceiling).
    #[arg(long = "backends", value_enum, value_delimiter = ',', default_values_t = [Backend::Redis, Backend::RedisCluster])]
    pub backends: Vec<Backend>,

    /// Algorithms of the hot limit, comma-separated.
    #[arg(long = "algorithms", value_enum, value_delimiter = ',', default_values_t = [Algorithm::Counter, Algorithm::Log])]
    pub algorithms: Vec<Algorithm>,

    /// tollgate instances sharing the limit; the load is spread evenly over them.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=16))]
    pub instances: u32,

    /// Shards of the hot limit.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub shards: u16,

    /// Hits a minute of the throughput part's limit: above what the load reaches, so every hit
    /// is admitted.
    #[arg(long = "throughput-limit", default_value_t = 6_000_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub throughput_limit: u64,

    /// Hits a second of the overload part's limit.
    #[arg(long = "overload-limit", default_value_t = 2_000, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub overload_limit: u64,

    /// The overload part's offered rate, as a multiple of its limit.
    #[arg(long = "overload-factor", default_value_t = 2.0)]
    pub overload_factor: f64,

    /// Calls in flight, over all connections of all instances.
    #[arg(long = "concurrency", default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub concurrency: u32,

    /// HTTP/2 connections of the load generator to each instance.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub connections: u32,
}

/// The `lease` scenario.
pub struct Lease {
    options: LeaseOptions,
}

impl Lease {
    /// The scenario with `options`.
    pub fn new(options: LeaseOptions) -> Lease {
        Lease { options }
    }
}

/// One measured closed-loop run of the throughput part.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ThroughputRun {
    /// Where the counters live.
    pub backend: Backend,
    /// Whether the limit was leased (always false on memory, where a lease means nothing).
    pub leased: bool,
    /// Its algorithm.
    pub algorithm: Algorithm,
    /// Run number, from 1.
    pub run: u32,
    /// tollgate instances.
    pub instances: u32,
    /// Shards of the limit.
    pub shards: u16,
    /// Hits a minute.
    pub limit: u64,
    /// Calls in flight over all instances.
    pub concurrency: u32,
    /// What the load generator saw.
    pub load: Summary,
    /// Script calls the masters served (none for memory).
    pub script_calls: Option<u64>,
    /// CPU seconds of every tollgate instance.
    pub tollgate_cpu_seconds: f64,
    /// CPU seconds of every Redis process.
    pub redis_cpu_seconds: f64,
}

/// One measured open-loop run of the overload part.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OverloadRun {
    /// Where the counters live.
    pub backend: Backend,
    /// Whether the limit was leased.
    pub leased: bool,
    /// Its algorithm.
    pub algorithm: Algorithm,
    /// Run number, from 1.
    pub run: u32,
    /// tollgate instances.
    pub instances: u32,
    /// Shards of the limit.
    pub shards: u16,
    /// Hits a second.
    pub limit_per_second: u64,
    /// Calls a second sent, over all instances.
    pub offered_per_second: f64,
    /// Length of the run as scheduled, in seconds.
    pub duration_seconds: f64,
    /// What the load generator saw.
    pub load: Summary,
    /// Script calls the masters served.
    pub script_calls: u64,
}

impl ThroughputRun {
    fn failed(&self) -> u64 {
        self.load.errors + self.load.over_limit + self.load.unknown
    }

    fn calls_per_decision(&self) -> Option<f64> {
        let calls = self.script_calls?;
        (self.load.decisions > 0).then(|| calls as f64 / self.load.decisions as f64)
    }
}

impl OverloadRun {
    /// What the limit allows over the run: its rate times the run's length, from the first
    /// call sent to the last answer. At a steady overload a sliding window log admits exactly
    /// its rate (every hit that leaves the window makes room for one); only the run's two ends
    /// can move it, by less than one window's worth, since no window holds more than the limit.
    fn allowed(&self) -> f64 {
        self.limit_per_second as f64 * self.load.elapsed_seconds / OVERLOAD_WINDOW.as_secs_f64()
    }

    fn admitted_share(&self) -> Option<f64> {
        ratio(Some(self.load.ok as f64), Some(self.allowed()))
    }

    fn calls_per_decision(&self) -> Option<f64> {
        (self.load.decisions > 0).then(|| self.script_calls as f64 / self.load.decisions as f64)
    }
}

/// The window of the overload part's limit (`unit: second`).
const OVERLOAD_WINDOW: Duration = Duration::from_secs(1);

fn hot_key(algorithm: Algorithm, leased: bool) -> String {
    let lease = if leased { "_leased" } else { "" };
    format!("{}_hot{lease}", algorithm.name())
}

fn over_key(algorithm: Algorithm, leased: bool) -> String {
    let lease = if leased { "_leased" } else { "" };
    format!("{}_over{lease}", algorithm.name())
}

/// The policy of every point: per algorithm, the hot limit and the overload limit, each leased
/// and not.
fn lease_policy(options: &LeaseOptions) -> String {
    let mut yaml = format!("domain: {DOMAIN}\ndescriptors:\n");
    for &algorithm in &options.algorithms {
        for leased in [false, true] {
            for (key, unit, limit) in [
                (
                    hot_key(algorithm, leased),
                    "minute",
                    options.throughput_limit,
                ),
                (
                    over_key(algorithm, leased),
                    "second",
                    options.overload_limit,
                ),
            ] {
                let _ = writeln!(
                    yaml,
                    "  - key: {key}\n    rate_limit: {{unit: {unit}, requests_per_unit: {limit}, \
                     algorithm: {}, shards: {}, lease: {leased}}}",
                    algorithm.policy_name(),
                    options.shards,
                );
            }
        }
    }
    yaml
}

/// The instances of one backend.
struct Instances<'a> {
    stands: Vec<Stand<'a>>,
}

impl Instances<'_> {
    fn tollgate_cpu_seconds(&self) -> anyhow::Result<f64> {
        self.stands.iter().map(|s| s.tollgate_cpu_seconds()).sum()
    }

    fn logs(&self) -> String {
        self.stands.iter().map(|s| s.tollgate.log()).collect()
    }
}

impl Scenario for Lease {
    fn name(&self) -> ScenarioName {
        ScenarioName::Lease
    }

    fn run(&self, bench: &mut Bench) -> anyhow::Result<()> {
        let options = &self.options;
        if !(options.overload_factor > 0.0 && options.overload_factor <= 100.0) {
            bail!(
                "--overload-factor {} is not in (0, 100]",
                options.overload_factor
            );
        }
        let policy = lease_policy(options);
        let mut backends = vec![Backend::Memory];
        backends.extend(
            options
                .backends
                .iter()
                .copied()
                .filter(|&b| b != Backend::Memory),
        );
        for &backend in &backends {
            bench.servers.ensure(backend);
        }
        let (servers, tools) = bench.split();
        for &backend in &backends {
            let extra = vec!["--local-cache-bytes".to_owned(), "8MiB".to_owned()];
            let stands = (0..options.instances)
                .map(|_| Stand::start_with(servers, backend, &policy, "deny", &extra))
                .collect::<anyhow::Result<Vec<_>>>()?;
            let instances = Instances { stands };
            let addrs: Vec<_> = instances.stands.iter().map(|s| s.grpc_addr()).collect();
            let connections = tools.loader.connect(&addrs, options.connections)?;
            let nodes = &instances.stands[0].nodes;
            nodes.flush();
            let leases: &[bool] = if backend == Backend::Memory {
                &[false]
            } else {
                &[false, true]
            };
            for &algorithm in &options.algorithms {
                for run in 1..=tools.scale.runs {
                    for &leased in leases {
                        let phase = |duration| Phase {
                            shape: uniform_shape(vec![hot_key(algorithm, leased)], 1),
                            concurrency: options.concurrency,
                            rate: None,
                            duration,
                        };
                        let warmup = tools
                            .loader
                            .drive(&connections, &phase(tools.scale.warmup))?;
                        if warmup.decisions == 0 && !tools.scale.warmup.is_zero() {
                            bail!(
                                "tollgate ({backend}) answered no call in the warmup: {:?}\n{}",
                                warmup.errors_by_code,
                                instances.logs()
                            );
                        }
                        nodes.reset_stats();
                        let before = (
                            instances.tollgate_cpu_seconds()?,
                            nodes.cpu_seconds()?.values().sum::<f64>(),
                        );
                        let load = tools
                            .loader
                            .drive(&connections, &phase(tools.scale.duration))?;
                        let after = (
                            instances.tollgate_cpu_seconds()?,
                            nodes.cpu_seconds()?.values().sum::<f64>(),
                        );
                        let script_calls = (backend != Backend::Memory)
                            .then(|| nodes.script_calls().map(|c| c.values().sum()))
                            .transpose()?;
                        let result = ThroughputRun {
                            backend,
                            leased,
                            algorithm,
                            run,
                            instances: options.instances,
                            shards: options.shards,
                            limit: options.throughput_limit,
                            concurrency: options.concurrency,
                            load,
                            script_calls,
                            tollgate_cpu_seconds: after.0 - before.0,
                            redis_cpu_seconds: after.1 - before.1,
                        };
                        say(&format!(
                            "  lease {backend} {} {} run {run}: {}/s, {} script calls per decision, failed {}",
                            algorithm.name(),
                            if leased { "leased" } else { "unleased" },
                            count(Some(result.load.decisions_per_second)),
                            fixed(result.calls_per_decision(), 4),
                            result.failed(),
                        ));
                        tools.records.record("throughput", &result)?;
                    }
                }
                if backend == Backend::Memory {
                    // Instances of the memory backend share nothing: three of them admit three
                    // times the limit, so an overload has nothing to show there.
                    continue;
                }
                let rate = options.overload_factor * options.overload_limit as f64;
                for run in 1..=tools.scale.runs {
                    for &leased in leases {
                        let phase = |duration| Phase {
                            shape: uniform_shape(vec![over_key(algorithm, leased)], 1),
                            concurrency: options.concurrency,
                            rate: Some(rate),
                            duration,
                        };
                        // The warmup fills the window, so the measured run starts at the limit:
                        // at least one window long, whatever the scale.
                        let warmup = tools.scale.warmup.max(OVERLOAD_WINDOW);
                        tools.loader.drive(&connections, &phase(warmup))?;
                        nodes.reset_stats();
                        let load = tools
                            .loader
                            .drive(&connections, &phase(tools.scale.duration))?;
                        let script_calls = nodes.script_calls()?.values().sum();
                        let result = OverloadRun {
                            backend,
                            leased,
                            algorithm,
                            run,
                            instances: options.instances,
                            shards: options.shards,
                            limit_per_second: options.overload_limit,
                            offered_per_second: rate,
                            duration_seconds: tools.scale.duration.as_secs_f64(),
                            load,
                            script_calls,
                        };
                        say(&format!(
                            "  lease overload {backend} {} {} run {run}: admitted {} of {} allowed ({}), {} script calls per decision, errors {}",
                            algorithm.name(),
                            if leased { "leased" } else { "unleased" },
                            result.load.ok,
                            count(Some(result.allowed())),
                            percent(result.admitted_share()),
                            fixed(result.calls_per_decision(), 4),
                            result.load.errors,
                        ));
                        tools.records.record("overload", &result)?;
                    }
                }
            }
        }
        Ok(())
    }

    fn render(&self, records: &[Value]) -> anyhow::Result<String> {
        render(records)
    }
}

/// A share to a hundredth of a percent: the overload's admissions differ from the limit by a
/// few hits in ten thousand, which whole percents would hide.
fn share(value: Option<f64>) -> String {
    value.map_or_else(|| "–".to_owned(), |v| format!("{:.2}%", v * 100.0))
}

fn mode(backend: Backend, leased: bool) -> &'static str {
    match (backend, leased) {
        (Backend::Memory, _) => "no store",
        (_, true) => "leased",
        (_, false) => "unleased",
    }
}

/// The leased-quota section of the report.
pub fn render(records: &[Value]) -> anyhow::Result<String> {
    let conditions = conditions_of(records)?;
    let throughput: Vec<ThroughputRun> = records_of(records, "throughput")?;
    let overload: Vec<OverloadRun> = records_of(records, "overload")?;
    let Some(first) = throughput.first() else {
        bail!("the lease results hold no throughput run");
    };
    let mut out = String::new();
    let _ = writeln!(
        out,
        "**One hot limit shared by {} instances, leased and unleased.** {} {} tollgate \
         processes share one limit of {} hits a minute (`shards: {}`), above what the load \
         reaches, so every hit is admitted; closed loop with {} calls in flight spread \
         evenly over the instances. Unleased, each decision is one script call; leased \
         (`lease: true`), an instance answers from the slice it reserved. The memory backend's \
         instances share nothing: they are the ceiling, the same processes with no store. Script \
         calls from `INFO commandstats` on every master, reset before each run; tollgate's CPU \
         from `/proc`, Redis's from `INFO cpu`.\n",
        first.instances,
        measured(&conditions),
        first.instances,
        count(Some(first.limit as f64)),
        first.shards,
        first.concurrency,
    );
    let points = distinct(
        throughput
            .iter()
            .map(|r| (r.algorithm, r.backend, r.leased)),
    );
    let of = |algorithm: Algorithm, backend: Backend, leased: bool| -> Vec<&ThroughputRun> {
        throughput
            .iter()
            .filter(|r| r.algorithm == algorithm && r.backend == backend && r.leased == leased)
            .collect()
    };
    let rate = |runs: &[&ThroughputRun]| median(runs.iter().map(|r| r.load.decisions_per_second));
    let mut table = Table::new(&[
        ("algorithm", Align::Left),
        ("backend", Align::Left),
        ("quota", Align::Left),
        ("decisions/s", Align::Right),
        ("min–max", Align::Right),
        ("p50 ms", Align::Right),
        ("p99 ms", Align::Right),
        ("script calls per decision", Align::Right),
        ("tollgate CPU µs/decision", Align::Right),
        ("Redis CPU µs/decision", Align::Right),
        ("failed", Align::Right),
    ]);
    for &(algorithm, backend, leased) in &points {
        let runs = of(algorithm, backend, leased);
        let calls = if backend == Backend::Memory {
            "–".to_owned()
        } else {
            fixed(
                median(runs.iter().filter_map(|r| r.calls_per_decision())),
                4,
            )
        };
        let mut row = vec![
            algorithm.name().to_owned(),
            backend.name().to_owned(),
            mode(backend, leased).to_owned(),
        ];
        row.extend(load_cells(runs.iter().map(|r| &r.load)));
        row.extend([
            calls,
            per_decision_cell(
                runs.iter()
                    .map(|r| (r.tollgate_cpu_seconds, r.load.decisions)),
            ),
            per_decision_cell(runs.iter().map(|r| (r.redis_cpu_seconds, r.load.decisions))),
            runs.iter().map(|r| r.failed()).sum::<u64>().to_string(),
        ]);
        table.row(row);
    }
    out.push_str(&table.render());
    // One sentence for every leased point: how it compares with the same limit unleased and
    // with the instances that share nothing.
    let compared: Vec<String> = points
        .iter()
        .filter(|&&(_, _, leased)| leased)
        .map(|&(algorithm, backend, _)| {
            let leased_rate = rate(&of(algorithm, backend, true));
            format!(
                "{} on {} {} the unleased and {} the memory backend's",
                algorithm.name(),
                backend.name(),
                times(ratio(leased_rate, rate(&of(algorithm, backend, false)))),
                times(ratio(
                    leased_rate,
                    rate(&of(algorithm, Backend::Memory, false))
                )),
            )
        })
        .collect();
    if !compared.is_empty() {
        let _ = writeln!(out, "\nLeased decisions/s: {}.\n", compared.join("; "));
    } else {
        out.push('\n');
    }

    if let Some(first) = overload.first() {
        let _ = writeln!(
            out,
            "**Twice the limit from {} instances.** A limit of {} hits a second, offered {}/s open loop spread over the instances, \
             after a warmup that fills the window. *Allowed* is the limit's rate times the run's \
             length, from its first call sent to its last answer: what a sliding window log \
             admits at a steady overload (no window ever holds more than the limit), while the \
             counter admits what its estimate lets through. The warmup lasts at least one \
             window. The local over-limit cache is on \
             (`--local-cache-bytes 8MiB`).\n",
            first.instances,
            count(Some(first.limit_per_second as f64)),
            count(Some(first.offered_per_second)),
        );
        let mut table = Table::new(&[
            ("algorithm", Align::Left),
            ("backend", Align::Left),
            ("quota", Align::Left),
            ("admitted", Align::Right),
            ("allowed", Align::Right),
            ("admitted / allowed", Align::Right),
            ("min–max", Align::Right),
            ("script calls per decision", Align::Right),
            ("errors", Align::Right),
        ]);
        let points = distinct(overload.iter().map(|r| (r.algorithm, r.backend, r.leased)));
        for (algorithm, backend, leased) in points {
            let runs: Vec<&OverloadRun> = overload
                .iter()
                .filter(|r| r.algorithm == algorithm && r.backend == backend && r.leased == leased)
                .collect();
            let shares = runs.iter().filter_map(|r| r.admitted_share());
            let (low, high) = range(shares.clone()).unwrap_or((f64::NAN, f64::NAN));
            table.row(vec![
                algorithm.name().to_owned(),
                backend.name().to_owned(),
                mode(backend, leased).to_owned(),
                count(median(runs.iter().map(|r| r.load.ok as f64))),
                count(median(runs.iter().map(|r| r.allowed()))),
                share(median(shares)),
                format!("{}–{}", share(Some(low)), share(Some(high))),
                fixed(
                    median(runs.iter().filter_map(|r| r.calls_per_decision())),
                    4,
                ),
                runs.iter().map(|r| r.load.errors).sum::<u64>().to_string(),
            ]);
        }
        out.push_str(&table.render());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_policy_declares_each_limit_leased_and_not() {
        let options = LeaseOptions {
            backends: vec![Backend::Redis],
            algorithms: vec![Algorithm::Log],
            instances: 3,
            shards: 1,
            throughput_limit: 600,
            overload_limit: 20,
            overload_factor: 2.0,
            concurrency: 8,
            connections: 1,
        };
        let yaml = lease_policy(&options);
        assert_eq!(
            yaml,
            "domain: bench\ndescriptors:\n\
             \x20 - key: log_hot\n    rate_limit: {unit: minute, requests_per_unit: 600, algorithm: sliding_window_log, shards: 1, lease: false}\n\
             \x20 - key: log_over\n    rate_limit: {unit: second, requests_per_unit: 20, algorithm: sliding_window_log, shards: 1, lease: false}\n\
             \x20 - key: log_hot_leased\n    rate_limit: {unit: minute, requests_per_unit: 600, algorithm: sliding_window_log, shards: 1, lease: true}\n\
             \x20 - key: log_over_leased\n    rate_limit: {unit: second, requests_per_unit: 20, algorithm: sliding_window_log, shards: 1, lease: true}\n"
        );
    }
}
