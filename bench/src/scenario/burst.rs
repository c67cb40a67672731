//! `burst`: three tollgate instances share one leased limit and receive a burst at three times
//! the limit, as fast as several concurrent callers spread evenly over the instances can send
//! it.
//!
//! Per algorithm × window × store backend, one fresh limit (a descriptor value no earlier run
//! used, so no instance holds a slice or a cached refusal of it) takes `factor × limit` calls
//! closed loop. The long window is an hour, the short one a few seconds: the burst is far shorter
//! than either, so every hit it sends falls inside one window, and a correct limiter admits at
//! most the limit (the counter up to the share of a window the burst straddles past a window's
//! start, which the scenario avoids by starting a short-window burst well inside one). Reported:
//! the hits admitted against the limit (never above it; the aim is at least 95% of it used),
//! script calls per decision, refused ones included (`INFO commandstats` `evalsha` + `eval` on
//! every master, reset before the burst; the aim is at most 0.05), and decisions per second.
//!
//! tollgate runs with its defaults otherwise (no cache flag) and `--failure-mode deny`, so a
//! failed store call is a refusal, never an admission.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::bail;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::doc::{Align, Table, count, fixed, median, opening, percent, plural};
use crate::load::generator::Shape;
use crate::load::keys::KeySampler;
use crate::load::summary::Summary;
use crate::scenario::{
    Algorithm, Bench, DOMAIN, Scenario, ScenarioName, conditions_of, distinct, runs_of, say,
};
use crate::stand::{Backend, Stand};

/// The options of `burst`.
#[derive(Debug, Clone, clap::Args)]
pub struct BurstOptions {
    /// Store backends, comma-separated.
    #[arg(long = "backends", value_enum, value_delimiter = ',', default_values_t = [Backend::Redis, Backend::RedisCluster])]
    pub backends: Vec<Backend>,

    /// Algorithms of the limit, comma-separated.
    #[arg(long = "algorithms", value_enum, value_delimiter = ',', default_values_t = [Algorithm::Counter, Algorithm::Log])]
    pub algorithms: Vec<Algorithm>,

    /// tollgate instances sharing the limit; the burst is spread evenly over them.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=16))]
    pub instances: u32,

    /// Hits an hour of the long-window limit.
    #[arg(long = "long-limit", default_value_t = 3_000, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub long_limit: u64,

    /// Hits per short window of the short-window limit.
    #[arg(long = "short-limit", default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub short_limit: u64,

    /// The short window, whole seconds, at least 2s (`window:` of the policy).
    #[arg(long = "short-window", default_value = "10s", value_parser = humantime::parse_duration)]
    pub short_window: Duration,

    /// The burst, as a multiple of the limit.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=100))]
    pub factor: u64,

    /// Calls in flight, over all connections of all instances.
    #[arg(long = "concurrency", default_value_t = 48, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub concurrency: u32,

    /// HTTP/2 connections of the load generator to each instance.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub connections: u32,
}

/// The `burst` scenario.
pub struct Burst {
    options: BurstOptions,
}

impl Burst {
    /// The scenario with `options`.
    pub fn new(options: BurstOptions) -> Burst {
        Burst { options }
    }
}

/// Which of the two limits a burst is sent to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WindowKind {
    /// An hour.
    Long,
    /// A few seconds (`--short-window`).
    Short,
}

impl WindowKind {
    /// The name in the report and the policy.
    pub fn name(self) -> &'static str {
        match self {
            WindowKind::Long => "long",
            WindowKind::Short => "short",
        }
    }
}

/// One measured burst.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BurstRun {
    /// Where the counters live.
    pub backend: Backend,
    /// The limit's algorithm.
    pub algorithm: Algorithm,
    /// Which limit.
    pub window: WindowKind,
    /// Its window, in seconds.
    pub window_seconds: f64,
    /// Hits a window.
    pub limit: u64,
    /// Run number, from 1.
    pub run: u32,
    /// tollgate instances sharing the limit.
    pub instances: u32,
    /// Calls in flight over all instances.
    pub concurrency: u32,
    /// Calls sent in the burst.
    pub sent: u64,
    /// What the load generator saw.
    pub load: Summary,
    /// Script calls every master served during the burst.
    pub script_calls: u64,
}

impl BurstRun {
    /// Whether the whole burst, first call sent to last answer, fell inside one window.
    pub fn fits_window(&self) -> bool {
        self.load.elapsed_seconds <= self.window_seconds
    }

    /// Hits admitted over the limit.
    pub fn admitted_share(&self) -> Option<f64> {
        (self.limit > 0).then(|| self.load.ok as f64 / self.limit as f64)
    }

    /// Script calls per decision, refused ones included.
    pub fn calls_per_decision(&self) -> Option<f64> {
        (self.load.decisions > 0).then(|| self.script_calls as f64 / self.load.decisions as f64)
    }
}

/// The descriptor key of a limit.
fn limit_key(algorithm: Algorithm, window: WindowKind) -> String {
    format!("{}_{}", algorithm.name(), window.name())
}

/// The window of a policy, in whole seconds as tollgate takes it: `10s`.
fn window_text(window: Duration) -> String {
    format!("{}s", window.as_secs())
}

/// The policy: per algorithm, the long and the short limit, both leased. Each run sends its
/// burst to a value of its own, so every run starts from an empty limit.
fn burst_policy(options: &BurstOptions) -> String {
    let mut yaml = format!("domain: {DOMAIN}\ndescriptors:\n");
    for &algorithm in &options.algorithms {
        for (window, when) in [
            (WindowKind::Long, "unit: hour".to_owned()),
            (
                WindowKind::Short,
                format!("window: {}", window_text(options.short_window)),
            ),
        ] {
            let limit = match window {
                WindowKind::Long => options.long_limit,
                WindowKind::Short => options.short_limit,
            };
            let _ = writeln!(
                yaml,
                "  - key: {}\n    rate_limit: {{{when}, requests_per_unit: {limit}, algorithm: {}, \
                 lease: true}}",
                limit_key(algorithm, window),
                algorithm.policy_name(),
            );
        }
    }
    yaml
}

/// How far into the current window of `window` (counted from the epoch) the clock is.
fn into_window(window: Duration) -> Duration {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let window_ms = window.as_millis().max(1);
    Duration::from_millis((now.as_millis() % window_ms) as u64)
}

/// Waits, when less than a second (or a fifth of the window) is left of the current window of
/// `window`, until just past its end: a counter's fixed windows start at multiples of the window
/// on every implementation this was written against, so the burst then falls in one of them.
fn start_inside_a_window(window: Duration) {
    let margin = Duration::from_secs(1).min(window / 5);
    let left = window.saturating_sub(into_window(window));
    if left < margin {
        std::thread::sleep(left + Duration::from_millis(50));
    }
}

/// The descriptor value of run `run`'s burst, and of the calls that warm its instances.
fn burst_value(run: u32) -> u64 {
    u64::from(run)
}

fn warm_value(run: u32) -> u64 {
    1_000_000 + u64::from(run)
}

impl Scenario for Burst {
    fn name(&self) -> ScenarioName {
        ScenarioName::Burst
    }

    fn run(&self, bench: &mut Bench) -> anyhow::Result<()> {
        let options = &self.options;
        if options.short_window < Duration::from_secs(2) || options.short_window.subsec_nanos() != 0
        {
            bail!(
                "--short-window {} is not a whole number of seconds of at least 2s",
                humantime::format_duration(options.short_window)
            );
        }
        let policy = burst_policy(options);
        let backends: Vec<Backend> = options
            .backends
            .iter()
            .copied()
            .filter(|&b| b != Backend::Memory)
            .collect();
        if backends.is_empty() {
            bail!(
                "burst needs a store backend (redis, redis-cluster): instances on memory share nothing"
            );
        }
        for &backend in &backends {
            bench.servers.ensure(backend);
        }
        let (servers, tools) = bench.split();
        for &backend in &backends {
            let stands = (0..options.instances)
                .map(|_| Stand::start(servers, backend, &policy, "deny"))
                .collect::<anyhow::Result<Vec<_>>>()?;
            let addrs: Vec<_> = stands.iter().map(|s| s.grpc_addr()).collect();
            let connections = tools.loader.connect(&addrs, options.connections)?;
            let nodes = &stands[0].nodes;
            nodes.flush();
            let every_connection = options.instances * options.connections;
            for run in 1..=tools.scale.runs {
                for &algorithm in &options.algorithms {
                    for window in [WindowKind::Long, WindowKind::Short] {
                        let key = limit_key(algorithm, window);
                        let (limit, window_length) = match window {
                            WindowKind::Long => (options.long_limit, Duration::from_secs(3_600)),
                            WindowKind::Short => (options.short_limit, options.short_window),
                        };
                        let shape = |value| {
                            Arc::new(Shape {
                                domain: DOMAIN.to_owned(),
                                entry_keys: vec![key.clone()],
                                sampler: KeySampler::sequential(value, 1),
                                hits_addend: 1,
                                descriptor_hits_addend: None,
                            })
                        };
                        // A few calls on another value of the same limit load its scripts on
                        // every master and open every connection, so the burst pays neither.
                        let warm = tools.loader.drive_count(
                            &connections,
                            &shape(warm_value(run)),
                            every_connection,
                            None,
                            u64::from(every_connection) * 2,
                        )?;
                        if warm.decisions == 0 {
                            let logs: String = stands.iter().map(|s| s.tollgate.log()).collect();
                            bail!(
                                "tollgate ({backend}) answered no call before the burst: {:?}\n{logs}",
                                warm.errors_by_code
                            );
                        }
                        if window == WindowKind::Short {
                            start_inside_a_window(window_length);
                        }
                        nodes.reset_stats();
                        let sent = options.factor * limit;
                        let load = tools.loader.drive_count(
                            &connections,
                            &shape(burst_value(run)),
                            options.concurrency,
                            None,
                            sent,
                        )?;
                        let script_calls = nodes.script_calls()?.values().sum();
                        let result = BurstRun {
                            backend,
                            algorithm,
                            window,
                            window_seconds: window_length.as_secs_f64(),
                            limit,
                            run,
                            instances: options.instances,
                            concurrency: options.concurrency,
                            sent,
                            load,
                            script_calls,
                        };
                        say(&format!(
                            "  burst {backend} {} {} run {run}: admitted {} of {} ({}) in {:.2}s, {} script calls per decision, {}/s, errors {}",
                            algorithm.name(),
                            window.name(),
                            result.load.ok,
                            limit,
                            percent(result.admitted_share()),
                            result.load.elapsed_seconds,
                            fixed(result.calls_per_decision(), 4),
                            count(Some(result.load.decisions_per_second)),
                            result.load.errors,
                        ));
                        tools.records.record("run", &result)?;
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

/// A ratio to three decimals: `0.998`.
fn share(value: Option<f64>) -> String {
    fixed(value, 3)
}

/// The share of the limit a burst should use, the aim the section states each row against.
const AIM_USED: f64 = 0.95;
/// The script calls per decision a burst should cost at most, likewise.
const AIM_CALLS: f64 = 0.05;

/// The burst section of the report.
pub fn render(records: &[Value]) -> anyhow::Result<String> {
    let conditions = conditions_of(records)?;
    let runs: Vec<BurstRun> = runs_of(records, "burst")?;
    let first = &runs[0];
    let short = runs
        .iter()
        .find(|r| r.window == WindowKind::Short)
        .map_or(f64::NAN, |r| r.window_seconds);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "**A burst at {}× a leased limit shared by {} instances.** {} Each run sends one \
         burst per row, after a few calls on another value of the same limit that load its \
         scripts and open every connection, to a limit no earlier run touched (`lease: true`), {} calls in flight closed \
         loop spread evenly over the instances, as fast as they are answered. *Long*: {} hits \
         an hour; *short*: {} hits per `window: {}`, the burst started at least a second (or a \
         fifth of the window) before the end of a window counted from the epoch, where a \
         counter's fixed windows start; a burst that outlasted its window is marked `*` \
         (its admissions then span more than one window). *Admitted / limit*: the highest run, \
         never above 1 for a correct limiter within one window; *limit used*: the lowest run \
         (the aim: at least {}). *Script calls per decision*: `evalsha` and `eval` on every \
         master (`INFO commandstats`, reset before the burst) over every decision, refused \
         ones included (the aim: at most {AIM_CALLS}). tollgate runs with its defaults (no \
         cache flag) and `--failure-mode deny`, so a failed store call is a refusal.\n",
        runs.iter()
            .map(|r| r.sent / r.limit.max(1))
            .max()
            .unwrap_or(0),
        first.instances,
        opening(
            &conditions,
            &format!(
                "Every row: {} run{} of one burst each; tables give the median, or the \
                 worst run where said.",
                conditions.runs,
                plural(u64::from(conditions.runs))
            )
        ),
        first.concurrency,
        count(
            runs.iter()
                .find(|r| r.window == WindowKind::Long)
                .map(|r| r.limit as f64)
        ),
        count(
            runs.iter()
                .find(|r| r.window == WindowKind::Short)
                .map(|r| r.limit as f64)
        ),
        crate::doc::seconds(short),
        percent(Some(AIM_USED)),
    );
    let mut table = Table::new(&[
        ("algorithm", Align::Left),
        ("window", Align::Left),
        ("backend", Align::Left),
        ("burst", Align::Right),
        ("admitted", Align::Right),
        ("limit", Align::Right),
        ("admitted / limit", Align::Right),
        ("limit used", Align::Right),
        ("script calls per decision", Align::Right),
        ("decisions/s", Align::Right),
        ("burst s", Align::Right),
        ("errors", Align::Right),
    ]);
    let points = distinct(runs.iter().map(|r| (r.algorithm, r.window, r.backend)));
    let (mut within, mut used, mut cheap) = (0, 0, 0);
    for &(algorithm, window, backend) in &points {
        let of: Vec<&BurstRun> = runs
            .iter()
            .filter(|r| (r.algorithm, r.window, r.backend) == (algorithm, window, backend))
            .collect();
        let shares = || of.iter().filter_map(|r| r.admitted_share());
        let highest = shares().fold(None, |top: Option<f64>, s| {
            Some(top.map_or(s, |t| t.max(s)))
        });
        let lowest = shares().fold(None, |low: Option<f64>, s| {
            Some(low.map_or(s, |l| l.min(s)))
        });
        let calls = median(of.iter().filter_map(|r| r.calls_per_decision()));
        let fits = of.iter().all(|r| r.fits_window());
        within += usize::from(fits && highest.is_some_and(|h| h <= 1.0));
        used += usize::from(lowest.is_some_and(|l| l >= AIM_USED));
        cheap += usize::from(calls.is_some_and(|c| c <= AIM_CALLS));
        let mark = if fits { "" } else { " *" };
        table.row(vec![
            algorithm.name().to_owned(),
            window.name().to_owned(),
            backend.name().to_owned(),
            count(median(of.iter().map(|r| r.sent as f64))),
            count(median(of.iter().map(|r| r.load.ok as f64))),
            count(Some(of[0].limit as f64)),
            format!("{}{mark}", share(highest)),
            percent(lowest),
            fixed(calls, 4),
            count(median(of.iter().map(|r| r.load.decisions_per_second))),
            fixed(median(of.iter().map(|r| r.load.elapsed_seconds)), 2),
            of.iter()
                .map(|r| r.load.errors + r.load.unknown)
                .sum::<u64>()
                .to_string(),
        ]);
    }
    out.push_str(&table.render());
    let rows = points.len();
    let _ = writeln!(
        out,
        "\nOf the {rows} rows, same run: within the limit in every run (the burst inside one \
         window, admitted / limit at most 1), {within}; at least {} of the limit used in every \
         run, {used}; at most {AIM_CALLS} script calls per decision, {cheap}.",
        percent(Some(AIM_USED)),
    );
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_policy_declares_a_long_and_a_short_leased_limit_per_algorithm() {
        let options = BurstOptions {
            backends: vec![Backend::Redis],
            algorithms: vec![Algorithm::Log],
            instances: 3,
            long_limit: 3_000,
            short_limit: 300,
            short_window: Duration::from_secs(2),
            factor: 3,
            concurrency: 48,
            connections: 2,
        };
        assert_eq!(
            burst_policy(&options),
            "domain: bench\ndescriptors:\n\
             \x20 - key: log_long\n    rate_limit: {unit: hour, requests_per_unit: 3000, algorithm: sliding_window_log, lease: true}\n\
             \x20 - key: log_short\n    rate_limit: {window: 2s, requests_per_unit: 300, algorithm: sliding_window_log, lease: true}\n"
        );
        assert_eq!(window_text(Duration::from_secs(10)), "10s");
        assert!(into_window(Duration::from_secs(10)) < Duration::from_secs(10));
    }
}
