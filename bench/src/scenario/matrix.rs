//! `matrix`: how fast tollgate decides on each backend, algorithm, shard count and concurrency,
//! beside the ceiling of the Redis it talks to.
//!
//! Every limit is far above what the machine can send, so every hit is admitted: one limit
//! decided per descriptor, each its own script call (on one server a request's calls go to Redis
//! in one pipeline). For each point (a cell of the matrix) tollgate is driven closed
//! loop (every call in flight sends the next as soon as it returns) to find the peak, then open
//! loop at half the median peak for the latency a moderately loaded server shows. After a Redis
//! backend's cells, redis-benchmark measures its ceiling: `EVALSHA` of the same script on keys of
//! the same shape at the same concurrency against the same server or cluster (see
//! [`crate::ceiling`]).
//!
//! One tollgate process serves all cells of a backend: its policy has one descriptor key per
//! algorithm, shard count and descriptor position, and a cell sends only its own keys. Redis is
//! emptied before every cell, and every cell is warmed up before it is measured.

use std::collections::BTreeMap;

use anyhow::bail;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::ceiling::{Ceiling, CeilingResult};
use crate::doc::{
    Align, NONE, Table, count, count_range, fixed, measured, median, ms, percent, plural, range,
    ratio, times,
};
use crate::load::summary::{LatencyUs, Summary};
use crate::machine::Conditions;
use crate::scenario::{
    Algorithm, Bench, Phase, Scenario, ScenarioName, Tools, UNREACHABLE_LIMIT, conditions_of,
    load_cells, micros_per, per_decision_cell, policy, records_of, say, uniform_shape,
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

    /// Shard counts of the limits (`rate_limit.shards`); ratios compare each with the first.
    #[arg(long = "shards", value_delimiter = ',', default_values_t = [1u16, 8], value_parser = clap::value_parser!(u16).range(1..=64))]
    pub shards: Vec<u16>,

    /// Calls in flight, over all connections [default: 16,64; 16 with --quick].
    #[arg(long = "concurrency", value_delimiter = ',', value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub concurrency: Option<Vec<u32>>,

    /// Distinct values of each descriptor, drawn uniformly.
    #[arg(long = "keys", value_delimiter = ',', default_values_t = [10_000u64], value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    pub keys: Vec<u64>,

    /// Descriptors per request (each a limit of its own).
    #[arg(long = "descriptors", value_delimiter = ',', default_values_t = [1u32], value_parser = clap::value_parser!(u32).range(1..=16))]
    pub descriptors: Vec<u32>,

    /// HTTP/2 connections of the load generator.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub connections: u32,

    /// Do not measure the redis-benchmark ceiling.
    #[arg(long)]
    pub no_ceiling: bool,
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

    fn concurrency(&self, quick: bool) -> Vec<u32> {
        match &self.options.concurrency {
            Some(levels) => levels.clone(),
            None if quick => vec![16],
            None => vec![16, 64],
        }
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

/// One measured run of the ceiling.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CeilingRun {
    /// `redis` or `redis-cluster`.
    pub backend: Backend,
    /// Whose script.
    pub algorithm: Algorithm,
    /// Connections of redis-benchmark, one call in flight each.
    pub concurrency: u32,
    /// Distinct values.
    pub keys: u64,
    /// Run number, from 1.
    pub run: u32,
    /// The command, `<sha>` for the script's digest.
    pub command: String,
    /// What it measured.
    #[serde(flatten)]
    pub result: CeilingResult,
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
        let concurrency = self.concurrency(bench.scale.quick);

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
                    for &level in &concurrency {
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
            drop(connections);
            let nodes = stand.nodes;
            drop(stand.tollgate);
            if backend == Backend::Memory || options.no_ceiling {
                continue;
            }
            for &algorithm in &options.algorithms {
                for &level in &concurrency {
                    for &keys in &options.keys {
                        let ceiling = Ceiling {
                            backend,
                            algorithm,
                            entry_key: entry_key(algorithm, 1, 0),
                            concurrency: level,
                            keys,
                        };
                        nodes.flush();
                        let sha = ceiling.load_script(&nodes)?;
                        let calibration = if tools.scale.quick { 1_000 } else { 20_000 };
                        let requests =
                            ceiling.calibrate(&nodes, &sha, calibration, tools.scale.duration)?;
                        for run in 1..=tools.scale.runs {
                            let result = ceiling.run(&nodes, &sha, requests)?;
                            say(&format!(
                                "  ceiling {backend} {} c{level} keys {keys} run {run}: {} EVALSHA/s, p99 {:.2} ms",
                                algorithm.name(),
                                count(Some(result.calls_per_second)),
                                result.p99_ms
                            ));
                            tools.records.record(
                                "ceiling",
                                &CeilingRun {
                                    backend,
                                    algorithm,
                                    concurrency: level,
                                    keys,
                                    run,
                                    command: ceiling.display(),
                                    result,
                                },
                            )?;
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

/// The runs of one cell.
#[derive(Default)]
struct CellRuns<'a> {
    peak: Vec<&'a TollgateRun>,
    half: Vec<&'a TollgateRun>,
}

/// The median over `runs` of what `value` reads from each (runs where it is `None` left out).
fn median_of<'a>(
    runs: &[&'a TollgateRun],
    value: impl Fn(&'a TollgateRun) -> Option<f64>,
) -> Option<f64> {
    median(runs.iter().filter_map(|run| value(run)))
}

/// What a ceiling is measured for: backend, algorithm, calls in flight, keys.
type CeilingKey = (Backend, Algorithm, u32, u64);

/// The matrix results of one run, grouped for the tables.
struct Results<'a> {
    conditions: Conditions,
    /// The cells in the order they ran.
    order: Vec<Cell>,
    cells: BTreeMap<Cell, CellRuns<'a>>,
    ceilings: BTreeMap<CeilingKey, Vec<&'a CeilingRun>>,
    /// Whether the key space or the descriptor count varies, and so needs a column.
    several_keys: bool,
    several_descriptors: bool,
}

impl<'a> Results<'a> {
    fn new(
        conditions: Conditions,
        runs: &'a [TollgateRun],
        ceiling_runs: &'a [CeilingRun],
    ) -> Results<'a> {
        let mut order = Vec::new();
        let mut cells: BTreeMap<Cell, CellRuns<'a>> = BTreeMap::new();
        for run in runs {
            if !cells.contains_key(&run.cell) {
                order.push(run.cell);
            }
            let entry = cells.entry(run.cell).or_default();
            match run.mode {
                Mode::Peak => entry.peak.push(run),
                Mode::Half => entry.half.push(run),
            }
        }
        let mut ceilings: BTreeMap<CeilingKey, Vec<&CeilingRun>> = BTreeMap::new();
        for run in ceiling_runs {
            ceilings
                .entry((run.backend, run.algorithm, run.concurrency, run.keys))
                .or_default()
                .push(run);
        }
        Results {
            conditions,
            several_keys: distinct(order.iter().map(|c| c.keys)).len() > 1,
            several_descriptors: distinct(order.iter().map(|c| c.descriptors)).len() > 1,
            order,
            cells,
            ceilings,
        }
    }

    /// Median peak decisions/s of `cell`.
    fn peak(&self, cell: Cell) -> Option<f64> {
        let runs = self.cells.get(&cell)?;
        median_of(&runs.peak, |r| Some(r.load.decisions_per_second))
    }

    /// Median peak limits decided a second in `cell` (decisions × descriptors).
    fn peak_limits(&self, cell: Cell) -> Option<f64> {
        let runs = self.cells.get(&cell)?;
        median_of(&runs.peak, |r| {
            Some(r.load.decisions_per_second * f64::from(r.cell.descriptors))
        })
    }

    /// Median ceiling calls/s.
    fn ceiling(&self, key: CeilingKey) -> Option<f64> {
        median(
            self.ceilings
                .get(&key)?
                .iter()
                .map(|r| r.result.calls_per_second),
        )
    }

    /// The `naming` columns, keys and descriptors when they vary, then `extra`.
    fn columns(&self, naming: &[Column], extra: &[(&'static str, Align)]) -> Vec<(String, Align)> {
        let mut columns: Vec<(String, Align)> = naming
            .iter()
            .map(|column| (column.header().to_owned(), column.align()))
            .collect();
        if self.several_keys {
            columns.push(("keys".to_owned(), Align::Right));
        }
        if self.several_descriptors {
            columns.push(("descriptors".to_owned(), Align::Right));
        }
        columns.extend(extra.iter().map(|(n, a)| ((*n).to_owned(), *a)));
        columns
    }

    /// The cells naming `cell` in a row under [`Results::columns`] of `naming`.
    fn naming(&self, cell: &Cell, naming: &[Column]) -> Vec<String> {
        let mut row: Vec<String> = naming.iter().map(|column| column.value(cell)).collect();
        if self.several_keys {
            row.push(count(Some(cell.keys as f64)));
        }
        if self.several_descriptors {
            row.push(cell.descriptors.to_string());
        }
        row
    }

    fn intro(&self, connections: u32) -> String {
        let first = &self.order[0];
        let keys = if self.several_keys {
            "the key space of each row".to_owned()
        } else {
            format!("{} keys", count(Some(first.keys as f64)))
        };
        let descriptors = if self.several_descriptors {
            "the descriptors of each row".to_owned()
        } else {
            format!(
                "{} descriptor{} per request",
                first.descriptors,
                plural(u64::from(first.descriptors))
            )
        };
        format!(
            "### Decisions per backend, algorithm and shard count\n\n\
             {} The peak is the median of the closed-loop runs; each open-loop run then sends at \
             half of it. Load: {descriptors}, values drawn uniformly from {keys}, over \
             {connections} HTTP/2 connections; every limit is far above the load, so every hit is \
             admitted: one limit decided per descriptor, each its own script call (on one server a \
             request's calls go in one pipeline), and *failed* counts any call that failed or \
             was refused: tollgate runs with `--failure-mode deny`.\n\n",
            measured(&self.conditions),
        )
    }

    fn peak_table(&self) -> String {
        let columns = self.columns(
            &ALL_COLUMNS,
            &[
                ("decisions/s", Align::Right),
                ("min–max", Align::Right),
                ("p50 ms", Align::Right),
                ("p99 ms", Align::Right),
                ("tollgate CPU µs/decision", Align::Right),
                ("Redis CPU µs/limit", Align::Right),
                ("generator CPU µs/decision", Align::Right),
                ("failed", Align::Right),
            ],
        );
        let mut table = Table::new(&borrowed(&columns));
        for cell in &self.order {
            let peak = &self.cells[cell].peak;
            let mut row = self.naming(cell, &ALL_COLUMNS);
            row.extend(load_cells(peak.iter().map(|r| &r.load)));
            row.extend([
                per_decision_cell(
                    peak.iter()
                        .map(|r| (r.tollgate_cpu_seconds, r.load.decisions)),
                ),
                if cell.backend == Backend::Memory {
                    NONE.to_owned()
                } else {
                    fixed(
                        median_of(peak, |r| micros_per(r.redis_cpu_seconds, r.limits())),
                        1,
                    )
                },
                fixed(
                    median_of(peak, |r| {
                        micros_per(r.generator_cpu_seconds, r.load.decisions)
                    }),
                    1,
                ),
                peak.iter().map(|r| r.failed()).sum::<u64>().to_string(),
            ]);
            table.row(row);
        }
        format!(
            "#### Peak: closed loop\n\n\
             CPU columns: CPU time of the tollgate process, of all Redis processes and of the \
             load generator during the run, per decision or per limit decided.\n\n{}\n",
            table.render()
        )
    }

    fn half_table(&self) -> String {
        let columns = self.columns(
            &ALL_COLUMNS,
            &[
                ("target/s", Align::Right),
                ("achieved/s", Align::Right),
                ("p50 ms", Align::Right),
                ("p90 ms", Align::Right),
                ("p99 ms", Align::Right),
                ("p99.9 ms", Align::Right),
                ("max ms", Align::Right),
                ("failed", Align::Right),
            ],
        );
        let mut table = Table::new(&borrowed(&columns));
        for cell in &self.order {
            let half = &self.cells[cell].half;
            if half.is_empty() {
                continue;
            }
            let latency = |quantile: fn(&LatencyUs) -> f64| {
                ms(median_of(half, |r| Some(quantile(&r.load.latency_us))))
            };
            let mut row = self.naming(cell, &ALL_COLUMNS);
            row.extend([
                count(median_of(half, |r| r.target_rate)),
                count(median_of(half, |r| Some(r.load.decisions_per_second))),
                latency(|l| l.p50),
                latency(|l| l.p90),
                latency(|l| l.p99),
                latency(|l| l.p99_9),
                latency(|l| l.max),
                half.iter().map(|r| r.failed()).sum::<u64>().to_string(),
            ]);
            table.row(row);
        }
        format!(
            "#### Latency at half the peak: open loop\n\n\
             Calls are sent on a fixed schedule; a call that waits for a free slot is timed from \
             its scheduled time, so a stalled server shows in the tail instead of slowing the \
             schedule.\n\n{}\n",
            table.render()
        )
    }

    fn ceiling_table(&self) -> String {
        let Some(example) = self
            .ceilings
            .values()
            .flatten()
            .find(|run| run.backend == Backend::Redis)
            .or_else(|| self.ceilings.values().flatten().next())
        else {
            return String::new();
        };
        let mut columns = vec![
            ("target".to_owned(), Align::Left),
            ("algorithm".to_owned(), Align::Left),
            ("in flight".to_owned(), Align::Right),
        ];
        if self.several_keys {
            columns.push(("keys".to_owned(), Align::Right));
        }
        for name in [
            "EVALSHA/s",
            "min–max",
            "p50 ms",
            "p99 ms",
            "Redis CPU µs/call",
        ] {
            columns.push((name.to_owned(), Align::Right));
        }
        let mut table = Table::new(&borrowed(&columns));
        for (&key, runs) in &self.ceilings {
            let (backend, algorithm, level, keys) = key;
            let mut row = vec![
                backend.to_string(),
                algorithm.name().to_owned(),
                level.to_string(),
            ];
            if self.several_keys {
                row.push(count(Some(keys as f64)));
            }
            row.extend([
                count(self.ceiling(key)),
                count_range(range(runs.iter().map(|r| r.result.calls_per_second))),
                fixed(median(runs.iter().map(|r| r.result.p50_ms)), 2),
                fixed(median(runs.iter().map(|r| r.result.p99_ms)), 2),
                fixed(
                    median(
                        runs.iter().filter_map(|r| {
                            micros_per(r.result.redis_cpu_seconds, r.result.requests)
                        }),
                    ),
                    1,
                ),
            ]);
            table.row(row);
        }
        format!(
            "#### Ceiling: redis-benchmark running the same script\n\n\
             redis-benchmark (a C client) sends `EVALSHA` of the script tollgate runs per \
             descriptor, on keys of the same shape, with one call in flight per connection and as \
             many connections as tollgate had calls in flight, against the same server or cluster \
             (with `--cluster` and a `{{tag}}` in the key, so each call goes to its master). For \
             example: `{}`. Redis CPU is that of every Redis process, replicas included.\n\n{}\n",
            example.command,
            table.render()
        )
    }

    fn backends(&self) -> Vec<Backend> {
        distinct(self.order.iter().map(|c| c.backend))
    }

    /// Peak ratios between the memory backend and each Redis backend, and of each Redis backend
    /// against its ceiling; also answers memory ÷ redis and redis ÷ ceiling of every row, for the
    /// targets.
    fn ratio_table(&self) -> (String, Vec<f64>, Vec<f64>) {
        let backends = self.backends();
        let with_memory = backends.contains(&Backend::Memory);
        let redis: Vec<Backend> = backends
            .iter()
            .copied()
            .filter(|b| *b != Backend::Memory)
            .collect();
        let (mut memory_over_redis, mut redis_over_ceiling) = (Vec::new(), Vec::new());
        if redis.is_empty() {
            return (String::new(), memory_over_redis, redis_over_ceiling);
        }
        let mut headers: Vec<String> = Vec::new();
        if with_memory {
            headers.extend(redis.iter().map(|b| format!("memory ÷ {b}")));
        }
        headers.extend(redis.iter().map(|b| format!("{b} ÷ ceiling")));
        let naming = [Column::Algorithm, Column::Shards, Column::InFlight];
        let mut columns = self.columns(&naming, &[]);
        columns.extend(headers.into_iter().map(|h| (h, Align::Right)));
        let mut table = Table::new(&borrowed(&columns));
        let mut rows_seen: Vec<Cell> = Vec::new();
        for cell in &self.order {
            let shape = Cell {
                backend: Backend::Memory,
                ..*cell
            };
            if rows_seen.contains(&shape) {
                continue;
            }
            rows_seen.push(shape);
            let on = |backend| Cell { backend, ..shape };
            let mut row = self.naming(&shape, &naming);
            if with_memory {
                for &backend in &redis {
                    let value = ratio(self.peak(on(Backend::Memory)), self.peak(on(backend)));
                    if backend == Backend::Redis {
                        memory_over_redis.extend(value);
                    }
                    row.push(times(value));
                }
            }
            for &backend in &redis {
                let value = ratio(
                    self.peak_limits(on(backend)),
                    self.ceiling((backend, shape.algorithm, shape.concurrency, shape.keys)),
                );
                if backend == Backend::Redis {
                    redis_over_ceiling.extend(value);
                }
                row.push(percent(value));
            }
            table.row(row);
        }
        let text = format!(
            "#### Ratios (numbers of this one run)\n\n\
             *memory ÷ X*: peak decisions/s of the memory backend over that of X. *X ÷ ceiling*: \
             the limits tollgate decided a second on X at its peak (decisions/s × descriptors) \
             over the redis-benchmark ceiling at the same concurrency (one limit a call).\n\n{}\n",
            table.render()
        );
        (text, memory_over_redis, redis_over_ceiling)
    }

    /// Peak ratios between shard counts (each over the first) and between the algorithms, per
    /// backend and concurrency.
    fn variant_table(&self) -> String {
        let shard_counts = distinct(self.order.iter().map(|c| c.shards));
        let algorithms = distinct(self.order.iter().map(|c| c.algorithm));
        let both_algorithms =
            algorithms.contains(&Algorithm::Counter) && algorithms.contains(&Algorithm::Log);
        if shard_counts.len() < 2 && !both_algorithms {
            return String::new();
        }
        let mut headers = Vec::new();
        for &algorithm in &algorithms {
            for &shards in &shard_counts[1..] {
                headers.push(format!(
                    "shards {shards} ÷ {} ({})",
                    shard_counts[0],
                    algorithm.name()
                ));
            }
        }
        if both_algorithms {
            for &shards in &shard_counts {
                headers.push(format!("log ÷ counter (shards {shards})"));
            }
        }
        let naming = [Column::Backend, Column::InFlight];
        let mut columns = self.columns(&naming, &[]);
        columns.extend(headers.into_iter().map(|h| (h, Align::Right)));
        let mut table = Table::new(&borrowed(&columns));
        let mut rows_seen: Vec<Cell> = Vec::new();
        for cell in &self.order {
            let group = Cell {
                algorithm: Algorithm::Counter,
                shards: 0,
                ..*cell
            };
            if rows_seen.contains(&group) {
                continue;
            }
            rows_seen.push(group);
            let at = |algorithm, shards| {
                self.peak(Cell {
                    algorithm,
                    shards,
                    ..group
                })
            };
            let mut row = self.naming(&group, &naming);
            for &algorithm in &algorithms {
                for &shards in &shard_counts[1..] {
                    row.push(times(ratio(
                        at(algorithm, shards),
                        at(algorithm, shard_counts[0]),
                    )));
                }
            }
            if both_algorithms {
                for &shards in &shard_counts {
                    row.push(times(ratio(
                        at(Algorithm::Log, shards),
                        at(Algorithm::Counter, shards),
                    )));
                }
            }
            table.row(row);
        }
        format!(
            "Peak decisions/s of one shard count over the first, and of the log over the counter, \
             per backend:\n\n{}\n",
            table.render()
        )
    }

    fn targets(&self, memory_over_redis: &[f64], redis_over_ceiling: &[f64]) -> String {
        let p99s: Vec<f64> = self
            .order
            .iter()
            .filter_map(|cell| median_of(&self.cells[cell].half, |r| Some(r.load.latency_us.p99)))
            .collect();
        format!(
            "Targets, over the cells of this run:\n\n\
             - memory ÷ redis peak ≥ 3×: {}\n\
             - redis limits ÷ EVALSHA ceiling ≥ 70%: {}\n\
             - p99 at half the peak < 2 ms: {}\n",
            target_line(memory_over_redis, |v| v >= 3.0, |v| times(Some(v))),
            target_line(redis_over_ceiling, |v| v >= 0.7, |v| percent(Some(v))),
            target_line(&p99s, |v| v < 2_000.0, |v| format!("{} ms", ms(Some(v)))),
        )
    }
}

/// A column that names the cell of a row.
#[derive(Debug, Clone, Copy)]
enum Column {
    Backend,
    Algorithm,
    Shards,
    InFlight,
}

/// Every naming column, in table order.
const ALL_COLUMNS: [Column; 4] = [
    Column::Backend,
    Column::Algorithm,
    Column::Shards,
    Column::InFlight,
];

impl Column {
    fn header(self) -> &'static str {
        match self {
            Column::Backend => "backend",
            Column::Algorithm => "algorithm",
            Column::Shards => "shards",
            Column::InFlight => "in flight",
        }
    }

    fn align(self) -> Align {
        match self {
            Column::Backend | Column::Algorithm => Align::Left,
            Column::Shards | Column::InFlight => Align::Right,
        }
    }

    fn value(self, cell: &Cell) -> String {
        match self {
            Column::Backend => cell.backend.to_string(),
            Column::Algorithm => cell.algorithm.name().to_owned(),
            Column::Shards => cell.shards.to_string(),
            Column::InFlight => cell.concurrency.to_string(),
        }
    }
}

fn borrowed(columns: &[(String, Align)]) -> Vec<(&str, Align)> {
    columns.iter().map(|(n, a)| (n.as_str(), *a)).collect()
}

/// The matrix section of the report.
pub fn render(records: &[Value]) -> anyhow::Result<String> {
    let conditions = conditions_of(records)?;
    let runs: Vec<TollgateRun> = records_of(records, "tollgate")?;
    let ceilings: Vec<CeilingRun> = records_of(records, "ceiling")?;
    let Some(first) = runs.first() else {
        bail!("the matrix results hold no tollgate run");
    };
    let results = Results::new(conditions, &runs, &ceilings);
    let (ratios, memory_over_redis, redis_over_ceiling) = results.ratio_table();
    Ok([
        results.intro(first.connections),
        results.peak_table(),
        results.half_table(),
        results.ceiling_table(),
        ratios,
        results.variant_table(),
        results.targets(&memory_over_redis, &redis_over_ceiling),
    ]
    .concat())
}

/// `met in 3 of 8 cells (1.81×–3.10×)`, or that nothing was measured.
fn target_line(values: &[f64], met: impl Fn(f64) -> bool, show: impl Fn(f64) -> String) -> String {
    match range(values.iter().copied()) {
        None => "not measured in this run.".to_owned(),
        Some((low, high)) => format!(
            "met in {} of {} cells ({}–{}).",
            values.iter().filter(|v| met(**v)).count(),
            values.len(),
            show(low),
            show(high)
        ),
    }
}

/// The distinct values, in the order they first appear.
fn distinct<T: PartialEq + Copy>(values: impl Iterator<Item = T>) -> Vec<T> {
    let mut seen = Vec::new();
    for value in values {
        if !seen.contains(&value) {
            seen.push(value);
        }
    }
    seen
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn target_lines_count_the_cells_that_meet_it() {
        assert_eq!(
            target_line(&[1.5, 3.2, 4.0], |v| v >= 3.0, |v| times(Some(v))),
            "met in 2 of 3 cells (1.50×–4.00×)."
        );
        assert_eq!(
            target_line(&[], |_| true, |v| v.to_string()),
            "not measured in this run."
        );
    }

    #[test]
    fn entry_keys_name_the_limit() {
        assert_eq!(entry_key(Algorithm::Log, 8, 2), "log_s8_2");
    }
}
