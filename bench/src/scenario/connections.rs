//! `connections`: how many connections tollgate should keep to one Redis server.
//!
//! Each connection is multiplexed: every decision in flight shares it, their commands written
//! and their replies read in batches. More connections split the same calls into smaller
//! batches, so both sides make more system calls per decision; fewer put every call behind one
//! connection's reader. One tollgate process per pool size (`REDIS_POOL_SIZE`) serves the same
//! policy on the same redis-server; each run measures every pool size and descriptor count
//! closed loop, one after the other, rotating which goes first. Reported: decisions per second,
//! latency, and the CPU per decision of tollgate and of Redis, with each pool size's throughput
//! over that of one connection (the default) in the same run.

use std::fmt::Write as _;

use anyhow::bail;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::doc::{Align, Table, count, fixed, measured, times_by_run};
use crate::load::summary::Summary;
use crate::scenario::{
    Algorithm, Bench, ClosedLoopOptions, Phase, Scenario, ScenarioName, UNREACHABLE_LIMIT,
    conditions_of, distinct, micros_per, policy, rotation, run_ratios, runs_of, say, served_cells,
    uniform_shape,
};
use crate::stand::{Backend, Stand};

/// The options of `connections`.
#[derive(Debug, Clone, clap::Args)]
pub struct ConnectionsOptions {
    /// Connections to the Redis server (`REDIS_POOL_SIZE`), comma-separated; the first is what
    /// the others are compared with.
    #[arg(long = "pool-sizes", value_delimiter = ',', default_values_t = [1u32, 2, 4, 8], value_parser = clap::value_parser!(u32).range(1..=64))]
    pub pool_sizes: Vec<u32>,

    /// Descriptors per request, comma-separated (each a limit of its own).
    #[arg(long = "descriptors", value_delimiter = ',', default_values_t = [1u32, 3], value_parser = clap::value_parser!(u32).range(1..=16))]
    pub descriptors: Vec<u32>,

    /// The closed loop sent to each server.
    #[command(flatten)]
    pub load: ClosedLoopOptions,
}

/// The `connections` scenario.
pub struct Connections {
    options: ConnectionsOptions,
}

impl Connections {
    /// The scenario with `options`.
    pub fn new(options: ConnectionsOptions) -> Connections {
        Connections { options }
    }
}

/// One measured run of one pool size and descriptor count.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ConnectionsRun {
    /// Connections tollgate kept to the server.
    pub pool_size: u32,
    /// Descriptors per request.
    pub descriptors: u32,
    /// Run number, from 1.
    pub run: u32,
    /// Calls in flight.
    pub concurrency: u32,
    /// What the load generator saw.
    pub load: Summary,
    /// CPU seconds tollgate used during the run.
    pub tollgate_cpu_seconds: f64,
    /// CPU seconds redis-server used during the run.
    pub redis_cpu_seconds: f64,
}

impl Scenario for Connections {
    fn name(&self) -> ScenarioName {
        ScenarioName::Connections
    }

    fn run(&self, bench: &mut Bench) -> anyhow::Result<()> {
        let options = &self.options;
        if options.pool_sizes.is_empty() || options.descriptors.is_empty() {
            bail!("connections needs at least one pool size and one descriptor count");
        }
        let most = options.descriptors.iter().copied().max().unwrap_or(1);
        let entry_keys: Vec<String> = (0..most).map(|i| format!("user{i}")).collect();
        let limits: Vec<(String, Algorithm, u64, u16)> = entry_keys
            .iter()
            .map(|key| (key.clone(), Algorithm::Counter, UNREACHABLE_LIMIT, 1))
            .collect();
        let policy = policy(&limits);
        bench.servers.ensure(Backend::Redis);
        let mut stands = Vec::new();
        for &size in &options.pool_sizes {
            let size_text = size.to_string();
            let envs = [("REDIS_POOL_SIZE", size_text.as_str())];
            let stand = Stand::start_under(
                &bench.servers,
                Backend::Redis,
                &policy,
                "deny",
                &[],
                &envs,
                &[],
            )?;
            let connections = bench
                .loader
                .connect(&[stand.grpc_addr()], options.load.connections)?;
            stands.push((size, stand, connections));
        }
        let points: Vec<(usize, u32)> = (0..stands.len())
            .flat_map(|index| options.descriptors.iter().map(move |&d| (index, d)))
            .collect();
        let phase = |descriptors: u32, duration| Phase {
            shape: uniform_shape(
                entry_keys[..descriptors as usize].to_vec(),
                options.load.keys,
            ),
            concurrency: options.load.concurrency,
            rate: None,
            duration,
        };
        for &(index, descriptors) in &points {
            let (_, _, connections) = &stands[index];
            bench
                .loader
                .drive(connections, &phase(descriptors, bench.scale.warmup))?;
        }
        for run in 1..=bench.scale.runs {
            for at in rotation(run, points.len()) {
                let (index, descriptors) = points[at];
                let (pool_size, stand, connections) = &stands[index];
                let tollgate_before = stand.tollgate_cpu_seconds()?;
                let redis_before = stand.redis_cpu_seconds()?;
                let load = bench
                    .loader
                    .drive(connections, &phase(descriptors, bench.scale.duration))?;
                let tollgate_cpu_seconds = stand.tollgate_cpu_seconds()? - tollgate_before;
                let redis_cpu_seconds = stand.redis_cpu_seconds()? - redis_before;
                if load.decisions == 0 || load.over_limit > 0 || load.errors > 0 {
                    bail!(
                        "tollgate with {pool_size} connections failed: {} decisions, {} refused, \
                         errors {:?}\n{}",
                        load.decisions,
                        load.over_limit,
                        load.errors_by_code,
                        stand.tollgate.log()
                    );
                }
                say(&format!(
                    "  connections {pool_size} descriptors {descriptors} run {run}: {}/s, \
                     tollgate {} µs, Redis {} µs per decision",
                    count(Some(load.decisions_per_second)),
                    fixed(micros_per(tollgate_cpu_seconds, load.decisions), 1),
                    fixed(micros_per(redis_cpu_seconds, load.decisions), 1),
                ));
                bench.records.record(
                    "run",
                    &ConnectionsRun {
                        pool_size: *pool_size,
                        descriptors,
                        run,
                        concurrency: options.load.concurrency,
                        load,
                        tollgate_cpu_seconds,
                        redis_cpu_seconds,
                    },
                )?;
            }
        }
        Ok(())
    }

    fn render(&self, records: &[Value]) -> anyhow::Result<String> {
        render(records)
    }
}

/// The connections section of the report.
pub fn render(records: &[Value]) -> anyhow::Result<String> {
    let conditions = conditions_of(records)?;
    let runs: Vec<ConnectionsRun> = runs_of(records, "connections")?;
    let first = &runs[0];
    let mut out = String::new();
    let _ = writeln!(out, "### Connections to one Redis server\n");
    let _ = writeln!(
        out,
        "{} One tollgate process per pool size (`REDIS_POOL_SIZE`: multiplexed connections kept \
         to the server, every call in flight sharing them) on the same redis-server, the same \
         policy (sliding window counters under a limit no load reaches, one per descriptor), \
         {} calls in flight closed loop, values drawn uniformly; each run measures every row \
         one after the other, rotating which goes first. CPU: tollgate's and redis-server's, \
         per decision.\n",
        measured(&conditions),
        first.concurrency,
    );
    let mut table = Table::new(&[
        ("descriptors", Align::Right),
        ("connections", Align::Right),
        ("decisions/s", Align::Right),
        ("min–max", Align::Right),
        ("p50 ms", Align::Right),
        ("p99 ms", Align::Right),
        ("tollgate CPU µs/decision", Align::Right),
        ("Redis CPU µs/decision", Align::Right),
    ]);
    let point = |r: &ConnectionsRun| (r.descriptors, r.pool_size);
    let mut points = distinct(runs.iter().map(point));
    // Grouped by descriptors, pool sizes in the order they were given.
    points.sort_by_key(|&(descriptors, _)| descriptors);
    for (descriptors, pool_size) in points {
        let of: Vec<&ConnectionsRun> = runs
            .iter()
            .filter(|r| point(r) == (descriptors, pool_size))
            .collect();
        let mut row = vec![descriptors.to_string(), pool_size.to_string()];
        row.extend(served_cells(
            of.iter()
                .map(|r| (&r.load, r.tollgate_cpu_seconds, r.redis_cpu_seconds)),
        ));
        table.row(row);
    }
    out.push_str(&table.render());
    let sizes = distinct(runs.iter().map(|r| r.pool_size));
    let Some(&base) = sizes.first() else {
        return Ok(out);
    };
    for descriptors in distinct(runs.iter().map(|r| r.descriptors)) {
        let of: Vec<&ConnectionsRun> = runs
            .iter()
            .filter(|r| r.descriptors == descriptors)
            .collect();
        let mut ratios = Vec::new();
        for &size in sizes.iter().skip(1) {
            let by_run = run_ratios(
                &of,
                |r| r.run,
                |r| r.pool_size == size,
                |r| r.pool_size == base,
                |r| r.load.decisions_per_second,
            );
            ratios.push(format!("{size}: {}", times_by_run(&by_run)));
        }
        let _ = write!(
            out,
            "\n{descriptors} descriptor{} a request, decisions/s of each pool size over {base} \
             connection{}, the median of the runs' ratios: {}.\n",
            if descriptors == 1 { "" } else { "s" },
            if base == 1 { "" } else { "s" },
            ratios.join("; "),
        );
    }
    Ok(out)
}
