//! `workers`: how tollgate's async workers should be laid out when its decisions go to Redis.
//!
//! A Redis decision wakes tasks on two sockets (the Redis connection's and the HTTP/2
//! connection's), and with a worker per CPU those tasks often sit on another worker than the
//! decision: a worker with nothing queued parks, and the next wakeup meant for it costs a
//! system call and a context switch. One worker never wakes another, but cannot use a second
//! core. A process per CPU with one worker each, every process with its own Redis connection and
//! its share of the gRPC connections, stands in for a runtime per core inside one process: no
//! wakeups across threads, and every core used.
//!
//! Each layout serves the same policy on the same redis-server; each run measures every layout
//! closed loop (its peak), then open loop at a steady rate below every peak (a sidecar with room
//! to spare), one layout after the other, rotating which goes first. Reported: decisions per
//! second, latency, CPU per decision of tollgate (all its processes) and of Redis, and context
//! switches of tollgate's threads per decision, with each layout's CPU per decision over that of
//! the default (a worker per CPU) in the same run.

use std::fmt::Write as _;

use anyhow::bail;
use clap::ValueEnum;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::doc::{Align, Table, count, fixed, measured, median, times_by_run};
use crate::load::summary::Summary;
use crate::scenario::{
    Algorithm, Bench, Connections, Phase, Scenario, ScenarioName, UNREACHABLE_LIMIT, conditions_of,
    distinct, micros_per, policy, rotation, run_ratios, runs_of, say, served_cells, uniform_shape,
};
use crate::stand::{Backend, Stand};

/// How tollgate's workers are laid out over the machine's CPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Workers {
    /// One process with a worker per CPU: tollgate's default.
    PerCpu,
    /// One process with one worker (`--worker-threads 1`).
    One,
    /// A process per CPU with one worker each, the load spread evenly over them.
    ProcessPerCpu,
}

impl Workers {
    /// How the report names the layout.
    fn describe(self) -> &'static str {
        match self {
            Workers::PerCpu => "one process, a worker per CPU (default)",
            Workers::One => "one process, one worker",
            Workers::ProcessPerCpu => "a process per CPU, one worker each",
        }
    }

    /// How many tollgate processes the layout runs on a machine of `cpus` CPUs.
    fn processes(self, cpus: usize) -> usize {
        match self {
            Workers::PerCpu | Workers::One => 1,
            Workers::ProcessPerCpu => cpus.max(1),
        }
    }

    /// The `tollgate serve` flags of each process.
    fn flags(self) -> Vec<String> {
        match self {
            Workers::PerCpu => Vec::new(),
            Workers::One | Workers::ProcessPerCpu => {
                vec!["--worker-threads".to_owned(), "1".to_owned()]
            }
        }
    }
}

/// The options of `workers`.
#[derive(Debug, Clone, clap::Args)]
pub struct WorkersOptions {
    /// The layouts to compare, comma-separated; the first is what the others are compared with.
    #[arg(long = "layouts", value_enum, value_delimiter = ',', default_values_t = [Workers::PerCpu, Workers::One, Workers::ProcessPerCpu])]
    pub layouts: Vec<Workers>,

    /// Calls in flight closed loop, over all HTTP/2 connections.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub concurrency: u32,

    /// HTTP/2 connections of the load generator, spread evenly over a layout's processes.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub connections: u32,

    /// The open-loop rate, decisions per second: below every layout's peak, so that what is
    /// compared is the cost of a steady load, not a saturated one.
    #[arg(long, default_value_t = 20_000.0, value_parser = crate::load::args::parse_rate)]
    pub rate: f64,

    /// Distinct values of the descriptor, drawn uniformly.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    pub keys: u64,
}

/// The `workers` scenario.
pub struct WorkersScenario {
    options: WorkersOptions,
}

impl WorkersScenario {
    /// The scenario with `options`.
    pub fn new(options: WorkersOptions) -> WorkersScenario {
        WorkersScenario { options }
    }
}

/// One measured run of one layout under one load.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorkersRun {
    /// The layout measured.
    pub layout: Workers,
    /// tollgate processes of the layout.
    pub processes: usize,
    /// Run number, from 1.
    pub run: u32,
    /// The open-loop rate asked, or none for closed loop.
    pub rate: Option<f64>,
    /// Calls in flight (closed loop) or at most in flight (open loop).
    pub concurrency: u32,
    /// What the load generator saw.
    pub load: Summary,
    /// CPU seconds every tollgate process of the layout used during the run.
    pub tollgate_cpu_seconds: f64,
    /// CPU seconds redis-server used during the run.
    pub redis_cpu_seconds: f64,
    /// Context switches of every thread of the layout's processes during the run.
    pub context_switches: u64,
}

/// A layout's processes and the generator's connections to all of them.
struct Serving<'a> {
    layout: Workers,
    stands: Vec<Stand<'a>>,
    connections: Connections,
}

impl Serving<'_> {
    fn cpu_seconds(&self) -> anyhow::Result<f64> {
        self.stands.iter().map(Stand::tollgate_cpu_seconds).sum()
    }

    fn context_switches(&self) -> anyhow::Result<u64> {
        let mut total = 0;
        for stand in &self.stands {
            total += crate::proc::context_switches(stand.tollgate_pid()?)?;
        }
        Ok(total)
    }

    fn logs(&self) -> String {
        self.stands
            .iter()
            .map(|stand| stand.tollgate.log())
            .collect()
    }
}

const KEY: &str = "user";

impl Scenario for WorkersScenario {
    fn name(&self) -> ScenarioName {
        ScenarioName::Workers
    }

    fn run(&self, bench: &mut Bench) -> anyhow::Result<()> {
        let options = &self.options;
        if options.layouts.is_empty() {
            bail!("workers needs at least one layout");
        }
        let policy = policy(&[(KEY.to_owned(), Algorithm::Counter, UNREACHABLE_LIMIT, 1)]);
        bench.servers.ensure(Backend::Redis);
        let cpus = crate::proc::online_cpus();
        let mut layouts = Vec::new();
        for &layout in &distinct(options.layouts.iter().copied()) {
            let processes = layout.processes(cpus);
            let mut stands = Vec::new();
            for _ in 0..processes {
                stands.push(Stand::start_with(
                    &bench.servers,
                    Backend::Redis,
                    &policy,
                    "deny",
                    &layout.flags(),
                )?);
            }
            let addrs: Vec<_> = stands.iter().map(Stand::grpc_addr).collect();
            // As many connections in all (rounded up to a whole number per process), spread
            // evenly over the processes.
            let per_process = options.connections.div_ceil(processes as u32).max(1);
            let connections = bench.loader.connect(&addrs, per_process)?;
            layouts.push(Serving {
                layout,
                stands,
                connections,
            });
        }
        let shape = uniform_shape(vec![KEY.to_owned()], options.keys);
        let phase = |rate, duration| Phase {
            shape: shape.clone(),
            concurrency: options.concurrency,
            rate,
            duration,
        };
        for serving in &layouts {
            bench
                .loader
                .drive(&serving.connections, &phase(None, bench.scale.warmup))?;
        }
        for run in 1..=bench.scale.runs {
            for at in rotation(run, layouts.len()) {
                let serving = &layouts[at];
                for rate in [None, Some(options.rate)] {
                    let cpu_before = serving.cpu_seconds()?;
                    let switches_before = serving.context_switches()?;
                    let redis_before = serving.stands[0].redis_cpu_seconds()?;
                    let load = bench
                        .loader
                        .drive(&serving.connections, &phase(rate, bench.scale.duration))?;
                    let tollgate_cpu_seconds = serving.cpu_seconds()? - cpu_before;
                    let context_switches =
                        serving.context_switches()?.saturating_sub(switches_before);
                    let redis_cpu_seconds = serving.stands[0].redis_cpu_seconds()? - redis_before;
                    if load.decisions == 0 || load.over_limit > 0 || load.errors > 0 {
                        bail!(
                            "tollgate ({}) failed: {} decisions, {} refused, errors {:?}\n{}",
                            serving.layout.describe(),
                            load.decisions,
                            load.over_limit,
                            load.errors_by_code,
                            serving.logs()
                        );
                    }
                    say(&format!(
                        "  {} {} run {run}: {}/s, tollgate {} µs, Redis {} µs per decision",
                        serving.layout.describe(),
                        rate.map_or_else(|| "closed loop".to_owned(), |r| format!("at {r}/s")),
                        count(Some(load.decisions_per_second)),
                        fixed(micros_per(tollgate_cpu_seconds, load.decisions), 1),
                        fixed(micros_per(redis_cpu_seconds, load.decisions), 1),
                    ));
                    bench.records.record(
                        "run",
                        &WorkersRun {
                            layout: serving.layout,
                            processes: serving.stands.len(),
                            run,
                            rate,
                            concurrency: options.concurrency,
                            load,
                            tollgate_cpu_seconds,
                            redis_cpu_seconds,
                            context_switches,
                        },
                    )?;
                }
            }
        }
        Ok(())
    }

    fn render(&self, records: &[Value]) -> anyhow::Result<String> {
        render(records)
    }
}

/// The load of a run as the report names it.
fn load_name(rate: Option<f64>) -> String {
    rate.map_or_else(
        || "closed loop".to_owned(),
        |rate| format!("{}/s", count(Some(rate))),
    )
}

/// The workers section of the report.
pub fn render(records: &[Value]) -> anyhow::Result<String> {
    let conditions = conditions_of(records)?;
    let runs: Vec<WorkersRun> = runs_of(records, "workers")?;
    let first = &runs[0];
    let mut out = String::new();
    let _ = writeln!(out, "### Worker threads on the Redis path\n");
    let _ = writeln!(
        out,
        "{} Every layout serves the same policy (a sliding window counter under a limit no load \
         reaches, one descriptor, values drawn uniformly) on the same redis-server, each process \
         with its own multiplexed connection to it; the generator's HTTP/2 connections are \
         spread evenly over a layout's processes. Per run and layout: closed loop at {} calls in \
         flight, then open loop at a steady rate below every peak; each run measures every \
         layout one after the other, rotating which goes first. CPU: all of the layout's \
         tollgate processes and redis-server, per decision; context switches: of every thread \
         of the layout's processes (from `/proc`), per decision.\n",
        measured(&conditions),
        first.concurrency,
    );
    let mut table = Table::new(&[
        ("load", Align::Left),
        ("layout", Align::Left),
        ("decisions/s", Align::Right),
        ("min–max", Align::Right),
        ("p50 ms", Align::Right),
        ("p99 ms", Align::Right),
        ("tollgate CPU µs/decision", Align::Right),
        ("Redis CPU µs/decision", Align::Right),
        ("context switches/decision", Align::Right),
    ]);
    let loads = distinct(runs.iter().map(|r| r.rate.map(f64::to_bits)));
    let layouts = distinct(runs.iter().map(|r| r.layout));
    let of = |load: Option<u64>, layout: Workers| -> Vec<&WorkersRun> {
        runs.iter()
            .filter(|r| r.rate.map(f64::to_bits) == load && r.layout == layout)
            .collect()
    };
    for &load in &loads {
        for &layout in &layouts {
            let of = of(load, layout);
            if of.is_empty() {
                continue;
            }
            let mut row = vec![
                load_name(load.map(f64::from_bits)),
                layout.describe().to_owned(),
            ];
            row.extend(served_cells(
                of.iter()
                    .map(|r| (&r.load, r.tollgate_cpu_seconds, r.redis_cpu_seconds)),
            ));
            row.push(fixed(
                median(
                    of.iter()
                        .map(|r| r.context_switches as f64 / r.load.decisions as f64),
                ),
                2,
            ));
            table.row(row);
        }
    }
    out.push_str(&table.render());
    let Some(&base) = layouts.first() else {
        return Ok(out);
    };
    for &load in &loads {
        let at_load: Vec<&WorkersRun> = runs
            .iter()
            .filter(|r| r.rate.map(f64::to_bits) == load)
            .collect();
        let mut ratios = Vec::new();
        for &layout in layouts.iter().skip(1) {
            let ratio = |value: fn(&WorkersRun) -> f64| {
                times_by_run(&run_ratios(
                    &at_load,
                    |r| r.run,
                    |r| r.layout == layout,
                    |r| r.layout == base,
                    |r| value(r),
                ))
            };
            let cpu = ratio(|r| r.tollgate_cpu_seconds / r.load.decisions.max(1) as f64);
            let text = match load {
                None => format!(
                    "{}: decisions/s {}, tollgate CPU per decision {cpu}",
                    layout.describe(),
                    ratio(|r| r.load.decisions_per_second)
                ),
                Some(_) => format!("{}: tollgate CPU per decision {cpu}", layout.describe()),
            };
            ratios.push(text);
        }
        if ratios.is_empty() {
            continue;
        }
        let _ = write!(
            out,
            "\n{}, each layout over {}, the median of the runs' ratios: {}.\n",
            match load {
                None => "Closed loop".to_owned(),
                Some(rate) => format!("At {}/s", count(Some(f64::from_bits(rate)))),
            },
            base.describe(),
            ratios.join("; "),
        );
    }
    Ok(out)
}
