//! `attack`: one key hammered far over its limit from many connections, as a client that ignores
//! OVER_LIMIT would do.
//!
//! The limit is small, so the warmup fills it and almost every measured call is refused. What
//! matters is what a refusal costs: decisions per second, tollgate's CPU per decision and, on the
//! Redis backends, how many script calls each refused decision makes (from `INFO commandstats`,
//! reset before every run). Every backend runs with tollgate's defaults (no cache flag at all:
//! whatever local over-limit cache the build turns on for that backend) and with the cache off
//! (`--local-cache-bytes 0`) in the same run: without the cache every refusal is one script
//! call; with it, about one per entry's lifetime. `--local-cache on` adds the cache forced on
//! (`--local-cache-bytes 8MiB`), as earlier reports measured it.
//!
//! tollgate runs with `--failure-mode allow` here, so a backend call that failed shows as an
//! admitted hit instead of hiding among the refusals.

use std::fmt::Write as _;

use anyhow::bail;
use clap::ValueEnum;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::doc::{
    Align, Table, count, count_range, fixed, measured, median, ms, percent, range, ratio, times,
    times_by_run,
};
use crate::load::summary::Summary;
use crate::scenario::{
    Algorithm, Bench, Phase, Scenario, ScenarioName, conditions_of, distinct, per_decision_cell,
    policy, run_ratios, runs_of, say, uniform_shape,
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

    /// How tollgate's local over-limit cache is set, for each backend: `default` (no flag),
    /// `on` (`--local-cache-bytes 8MiB`), `off` (`0`); comma-separated, each a point of its own.
    #[arg(long = "local-cache", value_enum, value_delimiter = ',', default_values_t = [CacheSetting::Default, CacheSetting::Off])]
    pub local_cache: Vec<CacheSetting>,
}

/// How a point of `attack` sets tollgate's local over-limit cache.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, ValueEnum, Serialize, Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum CacheSetting {
    /// No cache flag: whatever tollgate turns on by default for the backend.
    Default,
    /// `--local-cache-bytes 8MiB`, whatever the default.
    On,
    /// `--local-cache-bytes 0`.
    Off,
}

impl CacheSetting {
    /// The name in the report and the progress lines.
    pub fn name(self) -> &'static str {
        match self {
            CacheSetting::Default => "default",
            CacheSetting::On => "on",
            CacheSetting::Off => "off",
        }
    }

    /// The `tollgate serve` flags that set it.
    fn flags(self) -> Vec<String> {
        let bytes = match self {
            CacheSetting::Default => return Vec::new(),
            CacheSetting::On => "8MiB",
            CacheSetting::Off => "0",
        };
        vec!["--local-cache-bytes".to_owned(), bytes.to_owned()]
    }

    /// How the report's opening says it.
    fn described(self) -> &'static str {
        match self {
            CacheSetting::Default => {
                "with tollgate's defaults (no cache flag: the local over-limit cache is whatever \
                 the build turns on for the backend)"
            }
            CacheSetting::On => "with the local over-limit cache on (`--local-cache-bytes 8MiB`)",
            CacheSetting::Off => "with the cache off (`--local-cache-bytes 0`)",
        }
    }
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
    /// How the local over-limit cache was set (absent in records written before there was a
    /// `default` point: see `local_cache`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<CacheSetting>,
    /// Records written before `cache`: whether the cache was forced on (`8MiB`) or off (`0`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_cache: Option<bool>,
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

impl AttackRun {
    /// How the cache was set, from either field (an old record without either was forced on).
    fn setting(&self) -> CacheSetting {
        self.cache.unwrap_or(match self.local_cache {
            Some(false) => CacheSetting::Off,
            _ => CacheSetting::On,
        })
    }

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
        for (backend, cache) in points {
            bench.servers.ensure(backend);
            let extra = cache.flags();
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
                    cache: Some(cache),
                    local_cache: None,
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
                say(&format!(
                    "  attack {backend} (cache {}) run {run}: {}/s, {} refused, {} script calls per refusal, errors {}",
                    cache.name(),
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
    let points = distinct(runs.iter().map(|run| (run.backend, run.setting())));
    let of = |point: (Backend, CacheSetting)| -> Vec<&AttackRun> {
        runs.iter()
            .filter(|r| (r.backend, r.setting()) == point)
            .collect()
    };
    let rate = |point: (Backend, CacheSetting)| {
        median(of(point).iter().map(|r| r.load.decisions_per_second))
    };
    let calls = |point: (Backend, CacheSetting)| {
        median(of(point).iter().filter_map(|r| r.calls_per_rejection()))
    };
    let settings = distinct(points.iter().map(|(_, setting)| *setting));
    let described: Vec<&str> = settings.iter().map(|s| s.described()).collect();

    let mut out = String::new();
    let _ = writeln!(
        out,
        "**One key far over its limit.** {} One descriptor, always the same value, limited to {} hits a minute ({}), sent closed \
         loop by {} calls in flight over {} HTTP/2 connections; the warmup spends the limit, so \
         nearly every measured call is refused. *Script calls per refusal*: `evalsha` and `eval` \
         calls the Redis masters served during the run (from `INFO commandstats`) over the \
         refused decisions. Each backend runs {}. tollgate runs with `--failure-mode allow`, \
         so a failed backend call would show among the admitted.\n",
        measured(&conditions),
        first.limit,
        first.algorithm.name(),
        first.concurrency,
        first.connections,
        described.join(" and "),
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
        let (backend, setting) = point;
        let runs = of(point);
        let is_memory = backend == Backend::Memory;
        table.row(vec![
            backend.to_string(),
            setting.name().to_owned(),
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
    // The cache setting the notes speak for: the defaults when they ran, else the cache on.
    let Some(&main) = [CacheSetting::Default, CacheSetting::On]
        .iter()
        .find(|s| settings.contains(s))
    else {
        return Ok(out);
    };
    let mut notes = Vec::new();
    let memory = (Backend::Memory, main);
    if points.contains(&memory) {
        for &point in points
            .iter()
            .filter(|&&(b, setting)| b != Backend::Memory && setting == main)
        {
            notes.push(format!(
                "{} ÷ memory {}",
                point.0,
                times(ratio(rate(point), rate(memory)))
            ));
        }
    }
    for &(backend, _) in points.iter().filter(|&&(_, setting)| setting == main) {
        let off = (backend, CacheSetting::Off);
        if backend == Backend::Memory || !points.contains(&off) {
            continue;
        }
        let pair =
            |point: (Backend, CacheSetting)| move |r: &AttackRun| (r.backend, r.setting()) == point;
        let aim = if main == CacheSetting::Default {
            " (the aim: at most 0.01)"
        } else {
            ""
        };
        let by_run = run_ratios(
            &runs,
            |r| r.run,
            pair((backend, main)),
            pair(off),
            |r| r.calls_per_rejection().unwrap_or(f64::NAN),
        );
        let by_run: Vec<f64> = by_run.into_iter().filter(|r| r.is_finite()).collect();
        notes.push(format!(
            "{backend} script calls per refusal {} with the {}{aim}, {} with the cache off, \
             {} ÷ off {}",
            fixed(calls((backend, main)), 4),
            if main == CacheSetting::Default {
                "defaults"
            } else {
                "cache on"
            },
            fixed(calls(off), 4),
            main.name(),
            if by_run.is_empty() {
                crate::doc::NONE.to_owned()
            } else {
                times_by_run(&by_run)
            },
        ));
    }
    if !notes.is_empty() {
        let _ = writeln!(
            out,
            "\nDecisions/s under attack with the cache {}, and the script calls a refusal \
             costs, same run: {}.",
            if main == CacheSetting::Default {
                "as tollgate sets it by default"
            } else {
                "on"
            },
            notes.join("; ")
        );
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records of a run from before the `default` point: the cache forced on or off.
    const OLD_RECORDS: &str = r#"{"algorithm":"counter","backend":"redis","concurrency":64,"connections":16,"kind":"run","limit":100,"load":{"decisions":6773,"decisions_per_second":33678.28405696834,"elapsed_seconds":0.201108821,"errors":0,"errors_by_code":{},"latency_us":{"max":1000.0,"mean":1000.0,"min":1000.0,"p50":1000.0,"p90":1000.0,"p99":1000.0,"p99_9":1000.0},"ok":0,"over_limit":6773,"requests":6773,"requests_per_second":33678.28405696834,"unknown":0},"redis_cpu_seconds":0.067717,"run":1,"scenario":"attack","script_calls":0,"tollgate_cpu_seconds":0.15999999999999998,"local_cache":true}
{"algorithm":"counter","backend":"redis","concurrency":64,"connections":16,"kind":"run","limit":100,"load":{"decisions":5954,"decisions_per_second":29593.75836720151,"elapsed_seconds":0.201191073,"errors":0,"errors_by_code":{},"latency_us":{"max":1000.0,"mean":1000.0,"min":1000.0,"p50":1000.0,"p90":1000.0,"p99":1000.0,"p99_9":1000.0},"ok":0,"over_limit":5954,"requests":5954,"requests_per_second":29593.75836720151,"unknown":0},"redis_cpu_seconds":0.06274599999999997,"run":1,"scenario":"attack","script_calls":5954,"tollgate_cpu_seconds":0.16999999999999998,"local_cache":false}
{"duration_seconds":0.2,"kind":"conditions","load_end":[1.85,2.51,2.09],"load_start":[1.81,2.52,2.09],"machine":{"commit":"54f7df8","cpus":2,"hypervisor":"KVM","kernel":"6.18.44-fc-v1098","memory_gib":23.5,"model":"AMD EPYC","profile":"release","redis":"Redis server v=7.0.15","rustc":"rustc 1.95.0 (59807616e 2026-04-14)","tollgate_bin":"/work/wt/bench/target/release/tollgate"},"quick":true,"runs":1,"scenario":"attack","seconds":10.115149234,"started":"2026-12-02T01:28:33Z","warmup_seconds":0.1}"#;

    #[test]
    fn records_from_before_the_defaults_render_as_on_and_off() {
        let records: Vec<Value> = OLD_RECORDS
            .lines()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect();
        let section = render(&records).unwrap();
        assert!(section.contains("| redis | on | "), "{section}");
        assert!(section.contains("| redis | off | "), "{section}");
        assert!(
            section.contains("with the local over-limit cache on (`--local-cache-bytes 8MiB`)"),
            "{section}"
        );
        assert!(
            section.contains(
                "redis script calls per refusal 0.0000 with the cache on, 1.0000 with the cache \
                 off, on ÷ off 0.00× (runs: 0.00×)"
            ),
            "{section}"
        );
    }

    #[test]
    fn the_default_point_passes_no_cache_flag() {
        assert!(CacheSetting::Default.flags().is_empty());
        assert_eq!(CacheSetting::Off.flags(), ["--local-cache-bytes", "0"]);
    }
}
