//! `memory`: the memory backend under a flood of distinct keys, per algorithm.
//!
//! Every request carries a value never seen before (drawn from 2^40), as an attacker flooding
//! the key space would send. Two stands per algorithm:
//!
//! - **at the budget**: hour-long windows, so nothing expires, and `--memory-budget 4MiB`; the
//!   flood runs for every run's duration in turn, and after each the backend's own accounting is
//!   read from `/metrics` (bytes held, windows held, evictions) beside tollgate's resident memory.
//!   Bytes per key is the accounting over the windows held.
//! - **idle**: two-second windows under no budget pressure; one flood, then as long idle as the
//!   windows take to expire and the timer to sweep them, and the same readings again.
//!
//! The accounting is what the budget bounds; the resident memory also holds the allocator's
//! free lists, the runtime and the connections; after a timer sweep that freed much, tollgate
//! asks the allocator to give its free pages back.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::doc::{Align, Table, count, fixed, measured};
use crate::load::generator::Shape;
use crate::load::keys::KeySampler;
use crate::scenario::{
    Algorithm, Bench, DOMAIN, Phase, Scenario, ScenarioName, conditions_of, runs_of, say,
};
use crate::stand::{Backend, Stand};

/// The budget of the stand at the budget.
const BUDGET: &str = "4MiB";
/// Distinct values the flood draws from: every request a new key.
const KEYSPACE: u64 = 1 << 40;

/// The options of `memory`.
#[derive(Debug, Clone, clap::Args)]
pub struct MemoryOptions {
    /// Algorithms to flood, comma-separated.
    #[arg(long = "algorithms", value_enum, value_delimiter = ',', default_values_t = [Algorithm::Counter, Algorithm::Log])]
    pub algorithms: Vec<Algorithm>,

    /// Calls in flight.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub concurrency: u32,

    /// HTTP/2 connections of the load generator.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub connections: u32,
}

/// The `memory` scenario.
pub struct Memory {
    options: MemoryOptions,
}

impl Memory {
    /// The scenario with `options`.
    pub fn new(options: MemoryOptions) -> Memory {
        Memory { options }
    }
}

/// What the memory backend's accounting and the process said at one moment.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct Reading {
    /// Bytes the backend holds.
    pub bytes: u64,
    /// Its budget.
    pub budget: u64,
    /// Windows held.
    pub keys: u64,
    /// Live windows evicted so far.
    pub evictions: u64,
    /// tollgate's resident memory.
    pub rss: u64,
}

impl Reading {
    fn bytes_per_key(&self) -> Option<f64> {
        (self.keys > 0).then(|| self.bytes as f64 / self.keys as f64)
    }
}

/// One reading of a flood.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MemoryRun {
    /// The limit's algorithm.
    pub algorithm: Algorithm,
    /// `budget` or `idle`.
    pub stand: String,
    /// Run number, from 1 (`idle`: 1 after the flood, 2 after the idle wait).
    pub run: u32,
    /// Distinct keys sent so far.
    pub keys_sent: u64,
    /// The readings.
    pub reading: Reading,
}

fn policy(algorithm: Algorithm, window: &str) -> String {
    format!(
        "domain: {DOMAIN}\ndescriptors:\n  - key: user\n    rate_limit: {{window: {window}, \
         requests_per_unit: 1000, algorithm: {}}}\n",
        algorithm.policy_name()
    )
}

/// Reads `/metrics` and the process.
fn read(stand: &Stand<'_>) -> anyhow::Result<Reading> {
    let metrics = tollgate_testkit::net::send(
        &tollgate_testkit::net::agent(),
        "GET",
        &stand.tollgate.url("/metrics"),
        &[],
        None,
    )
    .body;
    let sample = |name: &str| -> anyhow::Result<u64> {
        metrics
            .lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
            .and_then(|value| value.trim().parse::<f64>().ok())
            .map(|value| value as u64)
            .with_context(|| format!("no {name} in /metrics"))
    };
    Ok(Reading {
        bytes: sample("tollgate_memory_bytes")?,
        budget: sample("tollgate_memory_budget_bytes")?,
        keys: sample("tollgate_memory_keys")?,
        evictions: sample("tollgate_memory_evictions_total")?,
        rss: stand.tollgate_rss_bytes()?,
    })
}

impl Scenario for Memory {
    fn name(&self) -> ScenarioName {
        ScenarioName::Memory
    }

    fn run(&self, bench: &mut Bench) -> anyhow::Result<()> {
        let options = &self.options;
        let shape = Arc::new(Shape {
            domain: DOMAIN.to_owned(),
            entry_keys: vec!["user".to_owned()],
            sampler: KeySampler::uniform(KEYSPACE),
            hits_addend: 1,
            descriptor_hits_addend: None,
        });
        let flood = |duration| Phase {
            shape: Arc::clone(&shape),
            concurrency: options.concurrency,
            rate: None,
            duration,
        };
        for &algorithm in &options.algorithms {
            // At the budget.
            let extra = ["--memory-budget".to_owned(), BUDGET.to_owned()];
            let stand = Stand::start_with(
                &bench.servers,
                Backend::Memory,
                &policy(algorithm, "1h"),
                "deny",
                &extra,
            )?;
            let connections = bench
                .loader
                .connect(&[stand.grpc_addr()], options.connections)?;
            let mut sent = 0;
            for run in 1..=bench.scale.runs {
                let load = bench
                    .loader
                    .drive(&connections, &flood(bench.scale.duration))?;
                if load.decisions == 0 {
                    bail!(
                        "the memory stand decided nothing: {:?}",
                        load.errors_by_code
                    );
                }
                sent += load.decisions;
                let reading = read(&stand)?;
                say(&format!(
                    "  memory {} at the budget, run {run}: {sent} keys sent, {} held, {} bytes \
                     ({} per key), {} evicted, RSS {} MiB",
                    algorithm.name(),
                    reading.keys,
                    reading.bytes,
                    fixed(reading.bytes_per_key(), 1),
                    reading.evictions,
                    reading.rss >> 20
                ));
                bench.records.record(
                    "run",
                    &MemoryRun {
                        algorithm,
                        stand: "budget".to_owned(),
                        run,
                        keys_sent: sent,
                        reading,
                    },
                )?;
            }
            drop(stand);

            // Idle.
            let stand = Stand::start_with(
                &bench.servers,
                Backend::Memory,
                &policy(algorithm, "2s"),
                "deny",
                &[],
            )?;
            let connections = bench
                .loader
                .connect(&[stand.grpc_addr()], options.connections)?;
            let load = bench
                .loader
                .drive(&connections, &flood(bench.scale.duration))?;
            let busy = read(&stand)?;
            // A counter window lasts two windows after its last write, and the sweep runs every
            // second.
            std::thread::sleep(Duration::from_secs(6));
            let idle = read(&stand)?;
            say(&format!(
                "  memory {} idle: {} keys held, {} bytes, RSS {} MiB -> {} keys, {} bytes, RSS {} MiB",
                algorithm.name(),
                busy.keys,
                busy.bytes,
                busy.rss >> 20,
                idle.keys,
                idle.bytes,
                idle.rss >> 20
            ));
            for (run, reading) in [(1, busy), (2, idle)] {
                bench.records.record(
                    "run",
                    &MemoryRun {
                        algorithm,
                        stand: "idle".to_owned(),
                        run,
                        keys_sent: load.decisions,
                        reading,
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

/// The memory section of the report.
pub fn render(records: &[Value]) -> anyhow::Result<String> {
    let conditions = conditions_of(records)?;
    let runs: Vec<MemoryRun> = runs_of(records, "memory")?;
    let mib = |bytes: u64| fixed(Some(bytes as f64 / f64::from(1u32 << 20)), 1);
    let mut out = String::new();
    let _ = writeln!(out, "### A flood of distinct keys on the memory backend\n");
    let _ = writeln!(
        out,
        "{} Every request carries a value never sent before. *At the budget*: hour-long \
         windows, `--memory-budget {BUDGET}`, read after each run of the flood. *Bytes* and \
         *keys* are the backend's own accounting (`tollgate_memory_bytes`, \
         `tollgate_memory_keys` on `/metrics`), *per key* their ratio; RSS is the whole \
         process.\n",
        measured(&conditions)
    );
    let mut table = Table::new(&[
        ("algorithm", Align::Left),
        ("run", Align::Right),
        ("keys sent", Align::Right),
        ("keys held", Align::Right),
        ("bytes held", Align::Right),
        ("budget", Align::Right),
        ("bytes per key", Align::Right),
        ("evicted", Align::Right),
        ("RSS MiB", Align::Right),
    ]);
    for run in runs.iter().filter(|run| run.stand == "budget") {
        let reading = &run.reading;
        table.row(vec![
            run.algorithm.name().to_owned(),
            run.run.to_string(),
            count(Some(run.keys_sent as f64)),
            count(Some(reading.keys as f64)),
            count(Some(reading.bytes as f64)),
            count(Some(reading.budget as f64)),
            fixed(reading.bytes_per_key(), 1),
            count(Some(reading.evictions as f64)),
            mib(reading.rss),
        ]);
    }
    out.push_str(&table.render());
    let _ = writeln!(
        out,
        "\n*Idle*: two-second windows; the flood for one run, then 6 s without traffic (the \
         windows expire and the timer sweeps them).\n"
    );
    let mut idle = Table::new(&[
        ("algorithm", Align::Left),
        ("keys sent", Align::Right),
        ("keys held after the flood", Align::Right),
        ("bytes held", Align::Right),
        ("RSS MiB", Align::Right),
        ("keys held idle", Align::Right),
        ("bytes held idle", Align::Right),
        ("RSS MiB idle", Align::Right),
    ]);
    let idle_runs: Vec<&MemoryRun> = runs.iter().filter(|run| run.stand == "idle").collect();
    for busy in idle_runs.iter().filter(|run| run.run == 1) {
        let Some(after) = idle_runs
            .iter()
            .find(|run| run.run == 2 && run.algorithm == busy.algorithm)
        else {
            continue;
        };
        idle.row(vec![
            busy.algorithm.name().to_owned(),
            count(Some(busy.keys_sent as f64)),
            count(Some(busy.reading.keys as f64)),
            count(Some(busy.reading.bytes as f64)),
            mib(busy.reading.rss),
            count(Some(after.reading.keys as f64)),
            count(Some(after.reading.bytes as f64)),
            mib(after.reading.rss),
        ]);
    }
    out.push_str(&idle.render());
    Ok(out)
}
