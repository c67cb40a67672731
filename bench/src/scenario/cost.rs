//! `cost`: what the per-limit statistics cost on the memory backend, where nothing else hides
//! it, with tracing off (its default).
//!
//! Two tollgate processes serve the same policy on the memory backend: one with
//! `DISABLE_STATS=true` (no per-limit statistics recorded: the *before*), one as it starts by
//! default (per-limit statistics on, tracing off: the *after*). Each run measures both, closed
//! loop, one after the other, alternating which goes first, so that whatever else the machine is
//! doing weighs on both alike. Reported: decisions per second of each, the ratio, and tollgate's
//! CPU time per decision, whose difference is the cost of the statistics per decision.

use std::fmt::Write as _;
use std::sync::Arc;

use anyhow::bail;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::doc::{Align, Table, count, count_range, fixed, measured, median, range};
use crate::load::summary::Summary;
use crate::scenario::{
    Algorithm, Bench, ClosedLoopOptions, Phase, Scenario, ScenarioName, UNREACHABLE_LIMIT,
    conditions_of, micros_per, policy, rotation, run_ratios, runs_of, say, uniform_shape,
};
use crate::stand::{Backend, Stand};

/// The options of `cost`.
#[derive(Debug, Clone, clap::Args)]
pub struct CostOptions {
    /// The closed loop sent to each server.
    #[command(flatten)]
    pub load: ClosedLoopOptions,
}

/// The `cost` scenario.
pub struct Cost {
    options: CostOptions,
}

impl Cost {
    /// The scenario with `options`.
    pub fn new(options: CostOptions) -> Cost {
        Cost { options }
    }
}

/// How the tollgate of a run was started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// `DISABLE_STATS=true`: no per-limit statistics.
    StatsOff,
    /// The defaults: per-limit statistics on, tracing off.
    Default,
}

impl Mode {
    fn label(self) -> &'static str {
        match self {
            Mode::StatsOff => "`DISABLE_STATS=true` (before)",
            Mode::Default => "default: per-limit statistics, tracing off (after)",
        }
    }
}

/// One measured run of one mode.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CostRun {
    /// Which tollgate.
    pub mode: Mode,
    /// Run number, from 1.
    pub run: u32,
    /// Calls in flight.
    pub concurrency: u32,
    /// Distinct descriptor values.
    pub keys: u64,
    /// What the load generator saw.
    pub load: Summary,
    /// CPU seconds tollgate used during the run.
    pub tollgate_cpu_seconds: f64,
}

const KEY: &str = "user";

impl Scenario for Cost {
    fn name(&self) -> ScenarioName {
        ScenarioName::Cost
    }

    fn run(&self, bench: &mut Bench) -> anyhow::Result<()> {
        let options = &self.options;
        let policy = policy(&[(KEY.to_owned(), Algorithm::Counter, UNREACHABLE_LIMIT, 1)]);
        bench.servers.ensure(Backend::Memory);
        let shape = uniform_shape(vec![KEY.to_owned()], options.load.keys);
        let start = |envs: &[(&str, &str)]| {
            Stand::start_under(
                &bench.servers,
                Backend::Memory,
                &policy,
                "deny",
                &[],
                envs,
                &[],
            )
        };
        let stands = [
            (Mode::StatsOff, start(&[("DISABLE_STATS", "true")])?),
            (Mode::Default, start(&[])?),
        ];
        let mut connections = Vec::new();
        for (_, stand) in &stands {
            connections.push(
                bench
                    .loader
                    .connect(&[stand.grpc_addr()], options.load.connections)?,
            );
        }
        let phase = |duration| Phase {
            shape: Arc::clone(&shape),
            concurrency: options.load.concurrency,
            rate: None,
            duration,
        };
        for c in &connections {
            bench.loader.drive(c, &phase(bench.scale.warmup))?;
        }
        for run in 1..=bench.scale.runs {
            for index in rotation(run, stands.len()) {
                let (mode, stand) = &stands[index];
                let cpu_before = stand.tollgate_cpu_seconds()?;
                let load = bench
                    .loader
                    .drive(&connections[index], &phase(bench.scale.duration))?;
                let cpu = stand.tollgate_cpu_seconds()? - cpu_before;
                if load.decisions == 0 {
                    bail!(
                        "tollgate ({mode:?}) decided nothing: {:?}\n{}",
                        load.errors_by_code,
                        stand.tollgate.log()
                    );
                }
                say(&format!(
                    "  cost {mode:?} run {run}: {}/s, {} µs CPU per decision",
                    count(Some(load.decisions_per_second)),
                    fixed(micros_per(cpu, load.decisions), 1),
                ));
                bench.records.record(
                    "run",
                    &CostRun {
                        mode: *mode,
                        run,
                        concurrency: options.load.concurrency,
                        keys: options.load.keys,
                        load,
                        tollgate_cpu_seconds: cpu,
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

/// The cost section of the report.
pub fn render(records: &[Value]) -> anyhow::Result<String> {
    let conditions = conditions_of(records)?;
    let runs: Vec<CostRun> = runs_of(records, "cost")?;
    let first = &runs[0];
    let of = |mode: Mode| runs.iter().filter(move |r| r.mode == mode);
    let rate = |mode: Mode| median(of(mode).map(|r| r.load.decisions_per_second));
    let cpu = |mode: Mode| {
        median(of(mode).filter_map(|r| micros_per(r.tollgate_cpu_seconds, r.load.decisions)))
    };
    let mut out = String::new();
    let _ = writeln!(
        out,
        "**The cost of the per-limit statistics.** {} Memory backend, one descriptor with values drawn uniformly from {} keys under a \
         limit no load reaches, {} calls in flight closed loop. Two tollgate processes with the \
         same policy, measured one after the other in every run (alternating which goes \
         first): one with `DISABLE_STATS=true`, one with the defaults (per-limit statistics \
         recorded, tracing off). Medians of the runs; CPU is tollgate's own time per decision.\n",
        measured(&conditions),
        count(Some(first.keys as f64)),
        first.concurrency,
    );
    let mut table = Table::new(&[
        ("tollgate", Align::Left),
        ("decisions/s", Align::Right),
        ("min–max", Align::Right),
        ("CPU µs/decision", Align::Right),
    ]);
    for mode in [Mode::StatsOff, Mode::Default] {
        table.row(vec![
            mode.label().to_owned(),
            count(rate(mode)),
            count_range(range(of(mode).map(|r| r.load.decisions_per_second))),
            fixed(cpu(mode), 2),
        ]);
    }
    out.push_str(&table.render());
    let throughput = median(run_ratios(
        &runs,
        |r| r.run,
        |r| r.mode == Mode::Default,
        |r| r.mode == Mode::StatsOff,
        |r| r.load.decisions_per_second,
    ));
    let per_decision = match (cpu(Mode::Default), cpu(Mode::StatsOff)) {
        (Some(after), Some(before)) => Some((after - before) * 1000.0),
        _ => None,
    };
    let _ = writeln!(
        out,
        "\nThroughput with the statistics over without, the median of the runs' ratios: {} (a \
         cost of {}% of memory-backend throughput; the goal is under 5%). Extra tollgate CPU \
         per decision (difference of the medians): {} ns.",
        fixed(throughput, 3),
        fixed(throughput.map(|t| (1.0 - t) * 100.0), 1),
        fixed(per_decision, 0),
    );
    Ok(out)
}
