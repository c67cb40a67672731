//! `matrix`: how fast tollgate decides on each backend, algorithm, shard count and concurrency,
//! and what each decision costs tollgate and Redis in CPU.
//!
//! Every limit is far above what the machine can send, so every hit is admitted: one limit
//! decided per descriptor, each its own script call (on one server a request's calls go to Redis
//! in one pipeline). For each point (a cell of the matrix) tollgate is driven closed
//! loop (every call in flight sends the next as soon as it returns) to find the peak, then open
//! loop at half the median peak for the latency a moderately loaded server shows.
//!
//! One tollgate process serves all cells of a backend: its policy has one descriptor key per
//! algorithm, shard count and descriptor position, and a cell sends only its own keys. Redis is
//! emptied before every cell, and every cell is warmed up before it is measured.

use anyhow::bail;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::doc::{Align, NONE, Table, count, count_range, fixed, measured, median, ms, plural};
use crate::load::summary::Summary;
use crate::scenario::{
    Algorithm, Bench, Phase, Scenario, ScenarioName, Tools, UNREACHABLE_LIMIT, conditions_of,
    distinct, micros_per, per_decision_cell, policy, records_of, say, uniform_shape,
};
use crate::stand::{Backend, Stand};

/// The options of `matrix`; lists are comma-separated.
#[derive(Debug, Clone, clap::Args)]
pub struct MatrixOptions {
    /// Backends to measure.
    #[arg(long = "backends", value_enum, value_delimiter = ',', default_values_t = [Backend::Memory, Backend::Redis, Backend::RedisCluster])]
    pub backends: Vec<Backend>,

    /// Algorithms of the limits.
    #[arg(long = "algorithms", value_enum, value_delimiter = ',', default_values_t = [Algorithm::Counter, Algorithm::Log])]
    pub algorithms: Vec<Algorithm>,

    /// Shard counts of the limits (`rate_limit.shards`); what sharding buys shows on one hot
    /// key (the `hotkey` scenario), so the page measures the default.
    #[arg(long = "shards", value_delimiter = ',', default_values_t = [1u16], value_parser = clap::value_parser!(u16).range(1..=64))]
    pub shards: Vec<u16>,

    /// Calls in flight, over all connections.
    #[arg(long = "concurrency", value_delimiter = ',', default_values_t = [64u32], value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub concurrency: Vec<u32>,

    /// Distinct values of each descriptor, drawn uniformly.
    #[arg(long = "keys", value_delimiter = ',', default_values_t = [10_000u64], value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    pub keys: Vec<u64>,

    /// Descriptors per request (each a limit of its own).
    #[arg(long = "descriptors", value_delimiter = ',', default_values_t = [1u32], value_parser = clap::value_parser!(u32).range(1..=16))]
    pub descriptors: Vec<u32>,

    /// HTTP/2 connections of the load generator.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub connections: u32,
}

/// The `matrix` scenario.
pub struct Matrix {
    options: MatrixOptions,
}

impl Matrix {
    /// The scenario with `options`.
    pub fn new(options: MatrixOptions) -> Matrix {
        Matrix { options }
    }
}

/// One point of the matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Cell {
    /// Where the counters live.
    pub backend: Backend,
    /// The limits' algorithm.
    pub algorithm: Algorithm,
    /// The limits' shard count.
    pub shards: u16,
    /// Calls in flight.
    pub concurrency: u32,
    /// Distinct values per descriptor.
    pub keys: u64,
    /// Descriptors per request.
    pub descriptors: u32,
}

/// The entry key of descriptor `index` of the limits with `algorithm` and `shards`.
fn entry_key(algorithm: Algorithm, shards: u16, index: u32) -> String {
    format!("{}_s{shards}_{index}", algorithm.name())
}

/// Which measurement a tollgate run is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Closed loop, as fast as the calls come back.
    Peak,
    /// Open loop at half the median peak of the cell.
    Half,
}

/// One measured run of tollgate.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TollgateRun {
    /// The point.
    #[serde(flatten)]
    pub cell: Cell,
    /// Peak or half.
    pub mode: Mode,
    /// Run number, from 1.
    pub run: u32,
    /// HTTP/2 connections.
    pub connections: u32,
    /// The open-loop rate (half mode).
    pub target_rate: Option<f64>,
    /// What the load generator saw.
    pub load: Summary,
    /// CPU seconds of the tollgate process during the run.
    pub tollgate_cpu_seconds: f64,
    /// CPU seconds of every Redis process during the run.
    pub redis_cpu_seconds: f64,
    /// CPU seconds of the load generator (this process) during the run.
    pub generator_cpu_seconds: f64,
}

impl TollgateRun {
    fn failed(&self) -> u64 {
        // Every limit is unreachable, so any OVER_LIMIT is a failed backend call.
        self.load.errors + self.load.over_limit + self.load.unknown
    }

    /// Limits decided: one per descriptor of every decision.
    fn limits(&self) -> u64 {
        self.load.decisions * u64::from(self.cell.descriptors)
    }
}

impl Scenario for Matrix {
    fn name(&self) -> ScenarioName {
        ScenarioName::Matrix
    }

    fn run(&self, bench: &mut Bench) -> anyhow::Result<()> {
        let options = &self.options;
        let max_descriptors = options.descriptors.iter().copied().max().unwrap_or(1);
        let mut limits = Vec::new();
        for &algorithm in &options.algorithms {
            for &shards in &options.shards {
                for index in 0..max_descriptors {
                    limits.push((
                        entry_key(algorithm, shards, index),
                        algorithm,
                        UNREACHABLE_LIMIT,
                        shards,
                    ));
                }
            }
        }
        let policy = policy(&limits);

        for &backend in &options.backends {
            bench.servers.ensure(backend);
            say(&format!("matrix: {backend}"));
            let (servers, mut tools) = bench.split();
            let stand = Stand::start(servers, backend, &policy, "deny")?;
            let connections = tools
                .loader
                .connect(&[stand.grpc_addr()], options.connections)?;
            for &algorithm in &options.algorithms {
                for &shards in &options.shards {
                    for &level in &options.concurrency {
                        for &keys in &options.keys {
                            for &descriptors in &options.descriptors {
                                let cell = Cell {
                                    backend,
                                    algorithm,
                                    shards,
                                    concurrency: level,
                                    keys,
                                    descriptors,
                                };
                                measure_cell(&mut tools, &stand, &connections, cell, options)?;
                            }
                        }
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

/// Warms one cell up, measures its peak `runs` times, then its latency at half the median peak.
fn measure_cell(
    tools: &mut Tools<'_>,
    stand: &Stand<'_>,
    connections: &crate::scenario::Connections,
    cell: Cell,
    options: &MatrixOptions,
) -> anyhow::Result<()> {
    let shape = uniform_shape(
        (0..cell.descriptors)
            .map(|index| entry_key(cell.algorithm, cell.shards, index))
            .collect(),
        cell.keys,
    );
    let phase = |rate: Option<f64>, duration| Phase {
        shape: shape.clone(),
        concurrency: cell.concurrency,
        rate,
        duration,
    };
    stand.nodes.flush();
    let warmup = tools
        .loader
        .drive(connections, &phase(None, tools.scale.warmup))?;
    if warmup.decisions == 0 && !tools.scale.warmup.is_zero() {
        bail!(
            "tollgate ({}) answered no call in the warmup: {:?}\n{}",
            cell.backend,
            warmup.errors_by_code,
            stand.tollgate.log()
        );
    }
    let mut peaks = Vec::new();
    for run in 1..=tools.scale.runs {
        let result = measure(
            tools,
            stand,
            connections,
            &phase(None, tools.scale.duration),
            cell,
            Mode::Peak,
            run,
            options,
        )?;
        peaks.push(result.load.decisions_per_second);
    }
    let rate = median(peaks).unwrap_or(0.0) / 2.0;
    if rate < 1.0 {
        bail!(
            "tollgate ({}) decided nothing at its peak\n{}",
            cell.backend,
            stand.tollgate.log()
        );
    }
    for run in 1..=tools.scale.runs {
        measure(
            tools,
            stand,
            connections,
            &phase(Some(rate), tools.scale.duration),
            cell,
            Mode::Half,
            run,
            options,
        )?;
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn measure(
    tools: &mut Tools<'_>,
    stand: &Stand<'_>,
    connections: &crate::scenario::Connections,
    phase: &Phase,
    cell: Cell,
    mode: Mode,
    run: u32,
    options: &MatrixOptions,
) -> anyhow::Result<TollgateRun> {
    let before = (
        stand.tollgate_cpu_seconds()?,
        stand.redis_cpu_seconds()?,
        crate::proc::own_cpu_seconds()?,
    );
    let load = tools.loader.drive(connections, phase)?;
    let after = (
        stand.tollgate_cpu_seconds()?,
        stand.redis_cpu_seconds()?,
        crate::proc::own_cpu_seconds()?,
    );
    let result = TollgateRun {
        cell,
        mode,
        run,
        connections: options.connections,
        target_rate: phase.rate,
        tollgate_cpu_seconds: after.0 - before.0,
        redis_cpu_seconds: after.1 - before.1,
        generator_cpu_seconds: after.2 - before.2,
        load,
    };
    say(&format!(
        "  {} {} shards {} c{} keys {} d{} {} run {run}: {}/s, p50 {} ms, p99 {} ms, failed {}",
        cell.backend,
        cell.algorithm.name(),
        cell.shards,
        cell.concurrency,
        cell.keys,
        cell.descriptors,
        match mode {
            Mode::Peak => "peak",
            Mode::Half => "half",
        },
        count(Some(result.load.decisions_per_second)),
        ms(Some(result.load.latency_us.p50)),
        ms(Some(result.load.latency_us.p99)),
        result.failed()
    ));
    tools.records.record("tollgate", &result)?;
    Ok(result)
}

/// The matrix section of the report: one row per cell, its closed-loop peak and CPU per
/// decision beside the latency of the open-loop runs at half that peak.
pub fn render(records: &[Value]) -> anyhow::Result<String> {
    let conditions = conditions_of(records)?;
    let runs: Vec<TollgateRun> = records_of(records, "tollgate")?;
    let Some(first) = runs.first() else {
        bail!("the matrix results hold no tollgate run");
    };
    let cells = distinct(runs.iter().map(|r| r.cell));
    let varies = |value: fn(&Cell) -> u64| distinct(cells.iter().map(value)).len() > 1;
    let (several_keys, several_descriptors) =
        (varies(|c| c.keys), varies(|c| u64::from(c.descriptors)));
    let mut columns = vec![
        ("backend", Align::Left),
        ("algorithm", Align::Left),
        ("shards", Align::Right),
        ("in flight", Align::Right),
    ];
    if several_keys {
        columns.push(("keys", Align::Right));
    }
    if several_descriptors {
        columns.push(("descriptors", Align::Right));
    }
    columns.extend([
        ("peak decisions/s", Align::Right),
        ("min–max", Align::Right),
        ("tollgate CPU µs/decision", Align::Right),
        ("Redis CPU µs/limit", Align::Right),
        ("half the peak /s", Align::Right),
        ("p50 ms", Align::Right),
        ("p99 ms", Align::Right),
        ("failed", Align::Right),
    ]);
    let mut table = Table::new(&columns);
    for cell in &cells {
        let of = |mode: Mode| -> Vec<&TollgateRun> {
            runs.iter()
                .filter(|r| r.cell == *cell && r.mode == mode)
                .collect()
        };
        let (peak, half) = (of(Mode::Peak), of(Mode::Half));
        let rates = || peak.iter().map(|r| r.load.decisions_per_second);
        let mut row = vec![
            cell.backend.to_string(),
            cell.algorithm.name().to_owned(),
            cell.shards.to_string(),
            cell.concurrency.to_string(),
        ];
        if several_keys {
            row.push(count(Some(cell.keys as f64)));
        }
        if several_descriptors {
            row.push(cell.descriptors.to_string());
        }
        row.extend([
            count(median(rates())),
            count_range(crate::doc::range(rates())),
            per_decision_cell(
                peak.iter()
                    .map(|r| (r.tollgate_cpu_seconds, r.load.decisions)),
            ),
            if cell.backend == Backend::Memory {
                NONE.to_owned()
            } else {
                fixed(
                    median(
                        peak.iter()
                            .filter_map(|r| micros_per(r.redis_cpu_seconds, r.limits())),
                    ),
                    1,
                )
            },
            count(median(half.iter().filter_map(|r| r.target_rate))),
            ms(median(half.iter().map(|r| r.load.latency_us.p50))),
            ms(median(half.iter().map(|r| r.load.latency_us.p99))),
            peak.iter()
                .chain(&half)
                .map(|r| r.failed())
                .sum::<u64>()
                .to_string(),
        ]);
        table.row(row);
    }
    let keys = match several_keys {
        true => "the key space of each row".to_owned(),
        false => format!("{} keys", count(Some(first.cell.keys as f64))),
    };
    let descriptors = match several_descriptors {
        true => "the descriptors of each row".to_owned(),
        false => format!(
            "{} descriptor{} per request",
            first.cell.descriptors,
            plural(u64::from(first.cell.descriptors))
        ),
    };
    Ok(format!(
        "{} Load: {descriptors}, values drawn uniformly from {keys}, over {} HTTP/2 connections, \
         every limit far above the load (every hit admitted and stored). *Peak*: the median of \
         the closed-loop runs; CPU is the tollgate process's per decision and every Redis \
         process's per limit decided. *p50*, *p99*: open loop at half the peak, timed from each \
         call's scheduled send. *Failed*: calls that failed or missed their deadline \
         (`--failure-mode deny`).\n\n{}",
        measured(&conditions),
        first.connections,
        table.render()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_keys_name_the_limit() {
        assert_eq!(entry_key(Algorithm::Log, 8, 2), "log_s8_2");
    }
}
