//! `grpc-floor`: tollgate on the memory backend against an empty RLS server, the floor of what
//! a decision can cost beside gRPC itself.
//!
//! The empty server ([`crate::empty`]) is the same gRPC service on the same transport, answering OK
//! without deciding; it runs as a process of its own, as tollgate does. Each run measures both
//! closed loop, one after the other, alternating which goes first so the machine's other work
//! weighs on both alike; then both open loop at half of tollgate's peak of that run, for the
//! latency a server has when it is not saturated, and at a rate far below either peak
//! ([`QUIET_RATE`]), for the latency of a call that finds nothing queued: the floor that this
//! machine and the generator put under every open-loop latency. Then the same again with a second
//! pair of servers started on one CPU and a generator of their own on the others, so that a
//! server's latency is not the time it waits for a core the generator holds. Last, where h2load is
//! installed, the first pair again under h2load, which costs about half as much a call as our
//! generator: with more of the shared cores left to the servers, the gap between them shows whole.
//! Reported: decisions per second of each, their ratio (the median of the runs' ratios), CPU per
//! decision of each process, and the latency at half the peak, sharing the cores and apart.

use std::fmt::Write as _;
use std::sync::Arc;

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::doc::{Align, Table, count, fixed, measured, median, ms, times_by_run};
use crate::empty::EmptyProcess;
use crate::h2load::{self, H2Load, H2LoadOptions, H2LoadSummary};
use crate::load::summary::Summary;
use crate::proc::Layout;
use crate::scenario::{
    Algorithm, Bench, Connections, DOMAIN, Loader, Phase, Scenario, ScenarioName, Tools,
    UNREACHABLE_LIMIT, conditions_of, load_cells, per_decision_cell, policy, records_of, rotation,
    run_ratios, runs_of, say, uniform_shape,
};
use crate::stand::{Backend, MeasuredServer, Servers, Stand};

/// The options of `grpc-floor`.
#[derive(Debug, Clone, clap::Args)]
pub struct GrpcFloorOptions {
    /// Calls in flight, over all connections.
    #[arg(long, default_value_t = 128, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub concurrency: u32,

    /// HTTP/2 connections of the load generator to each server.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub connections: u32,

    /// Distinct values of the descriptor, drawn uniformly.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    pub keys: u64,

    /// The h2load runs that follow the generator's.
    #[command(flatten)]
    pub h2load: H2LoadOptions,
}

/// The `grpc-floor` scenario.
pub struct GrpcFloor {
    options: GrpcFloorOptions,
}

impl GrpcFloor {
    /// The scenario with `options`.
    pub fn new(options: GrpcFloorOptions) -> GrpcFloor {
        GrpcFloor { options }
    }
}

/// Which server a run measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Server {
    /// tollgate on the memory backend, deciding every hit.
    Tollgate,
    /// The empty RLS server.
    Empty,
}

impl Server {
    fn label(self) -> &'static str {
        match self {
            Server::Tollgate => "tollgate, memory backend",
            Server::Empty => "empty RLS server",
        }
    }
}

/// One measured run of one server.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FloorRun {
    /// Which server.
    pub server: Server,
    /// Run number, from 1.
    pub run: u32,
    /// Calls in flight.
    pub concurrency: u32,
    /// The open-loop rate, or `None` for the closed-loop peak.
    pub target_rate: Option<f64>,
    /// What the load generator saw.
    pub load: Summary,
    /// CPU seconds the server process used during the run.
    pub cpu_seconds: f64,
    /// CPU seconds the load generator (this process) used during the run.
    #[serde(default)]
    pub generator_cpu_seconds: f64,
    /// Whether the servers ran on one CPU and the generator on the others; otherwise all share
    /// every CPU.
    #[serde(default)]
    pub apart: bool,
    /// Whether the run was open loop at [`QUIET_RATE`], not at half of tollgate's peak.
    #[serde(default)]
    pub quiet: bool,
}

/// Where a run's load stood.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Point {
    /// Closed loop: the server's peak.
    Peak,
    /// Open loop at half of tollgate's peak.
    Half,
    /// Open loop at [`QUIET_RATE`].
    Quiet,
}

/// The open-loop rate far below either server's peak (under a tenth of it on a machine of two
/// CPUs): no call should find another queued before it, so its latency is the round trip
/// itself, the generator's share and the machine's scheduling included.
pub const QUIET_RATE: f64 = 2_000.0;

impl FloorRun {
    /// How many cores the server and the generator kept busy on average, in that order.
    fn cores(&self) -> (Option<f64>, Option<f64>) {
        let elapsed = self.load.elapsed_seconds;
        let busy = |seconds: f64| (elapsed > 0.0).then(|| seconds / elapsed);
        (busy(self.cpu_seconds), busy(self.generator_cpu_seconds))
    }

    /// Whether this is a run of `server` at `point` in the given placement.
    fn is(&self, server: Server, point: Point, apart: bool) -> bool {
        let at = match (self.target_rate, self.quiet) {
            (None, _) => Point::Peak,
            (Some(_), false) => Point::Half,
            (Some(_), true) => Point::Quiet,
        };
        self.server == server && at == point && self.apart == apart
    }
}

/// One h2load run of one server: the same request (one descriptor value) over and over.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FloorH2LoadRun {
    /// Which server.
    pub server: Server,
    /// Run number, from 1.
    pub run: u32,
    /// h2load's connections.
    pub connections: u32,
    /// h2load's calls in flight on each connection.
    pub streams: u32,
    /// What h2load measured.
    pub load: H2LoadSummary,
    /// CPU seconds the server process used during the run.
    pub cpu_seconds: f64,
}

/// tollgate and the empty server side by side, with the generator's connections to each.
struct Pair<'a> {
    tollgate: Stand<'a>,
    empty: EmptyProcess,
    /// To tollgate, then to the empty server, as [`Server`] orders them.
    connections: [Connections; 2],
}

impl<'a> Pair<'a> {
    fn start(
        servers: &'a Servers,
        policy: &str,
        loader: &Loader,
        connections: u32,
    ) -> anyhow::Result<Pair<'a>> {
        let tollgate = Stand::start(servers, Backend::Memory, policy, "deny")?;
        let empty = EmptyProcess::start()?;
        Pair::connect(tollgate, empty, loader, connections)
    }

    /// The pair of `tollgate` and `empty`, once `loader` has opened its connections to both.
    fn connect(
        tollgate: Stand<'a>,
        empty: EmptyProcess,
        loader: &Loader,
        connections: u32,
    ) -> anyhow::Result<Pair<'a>> {
        let connections = [
            loader.connect(&[tollgate.grpc_addr()], connections)?,
            loader.connect(&[empty.grpc_addr()], connections)?,
        ];
        Ok(Pair {
            tollgate,
            empty,
            connections,
        })
    }

    fn server(&self, server: Server) -> &dyn MeasuredServer {
        match server {
            Server::Tollgate => &self.tollgate,
            Server::Empty => &self.empty,
        }
    }

    fn cpu_seconds(&self, server: Server) -> anyhow::Result<f64> {
        self.server(server).cpu_seconds()
    }

    fn pids(&self) -> anyhow::Result<[u32; 2]> {
        Ok([self.tollgate.pid()?, self.empty.pid()?])
    }
}

/// A second pair of servers, born on CPU 0, and a generator of its own, made on the other CPUs
/// ([`Layout::GeneratorApart`]): each process sizes its runtime to the CPUs it will keep, as a
/// sidecar limited to one CPU would.
struct Apart<'a> {
    pair: Pair<'a>,
    loader: Loader,
}

impl<'a> Apart<'a> {
    fn start(servers: &'a Servers, policy: &str, connections: u32) -> anyhow::Result<Apart<'a>> {
        let layout = Layout::GeneratorApart;
        let (tollgate, empty) = layout.start_servers(|| {
            Ok((
                Stand::start(servers, Backend::Memory, policy, "deny")?,
                EmptyProcess::start()?,
            ))
        })?;
        let loader = layout.start_generator(Loader::new)?;
        let pair = Pair::connect(tollgate, empty, &loader, connections)?;
        Ok(Apart { pair, loader })
    }
}

const KEY: &str = "user";

impl Scenario for GrpcFloor {
    fn name(&self) -> ScenarioName {
        ScenarioName::GrpcFloor
    }

    fn run(&self, bench: &mut Bench) -> anyhow::Result<()> {
        let options = &self.options;
        let policy = policy(&[(KEY.to_owned(), Algorithm::Counter, UNREACHABLE_LIMIT, 1)]);
        bench.servers.ensure(Backend::Memory);
        let (servers, mut tools) = bench.split();
        let shared = Pair::start(servers, &policy, tools.loader, options.connections)?;
        // A machine with one CPU has nothing to set apart.
        let apart = match crate::proc::online_cpus() {
            0..=1 => None,
            _ => Some(Apart::start(servers, &policy, options.connections)?),
        };
        let shape = uniform_shape(vec![KEY.to_owned()], options.keys);
        let phase = |rate, duration| Phase {
            shape: Arc::clone(&shape),
            concurrency: options.concurrency,
            rate,
            duration,
        };
        for c in &shared.connections {
            tools.loader.drive(c, &phase(None, tools.scale.warmup))?;
        }
        if let Some(apart) = &apart {
            for c in &apart.pair.connections {
                apart.loader.drive(c, &phase(None, tools.scale.warmup))?;
            }
        }
        let servers = [Server::Tollgate, Server::Empty];
        for run in 1..=tools.scale.runs {
            let order = rotation(run, servers.len());
            let mut measure = |pair: &Pair,
                               loader: &Loader,
                               index: usize,
                               target_rate: Option<f64>,
                               apart: bool,
                               quiet: bool|
             -> anyhow::Result<f64> {
                let server = servers[index];
                let before = (pair.cpu_seconds(server)?, crate::proc::own_cpu_seconds()?);
                let load = loader.drive(
                    &pair.connections[index],
                    &phase(target_rate, tools.scale.duration),
                )?;
                let cpu_seconds = pair.cpu_seconds(server)? - before.0;
                let generator_cpu_seconds = crate::proc::own_cpu_seconds()? - before.1;
                if load.decisions == 0 {
                    bail!(
                        "the {} decided nothing: {:?}\n{}",
                        server.label(),
                        load.errors_by_code,
                        pair.tollgate.tollgate.log()
                    );
                }
                let rate = load.decisions_per_second;
                say(&format!(
                    "  grpc-floor run {run} {}{}{}: {}/s, p99 {} ms",
                    server.label(),
                    if apart { ", apart" } else { "" },
                    target_rate.map_or(String::new(), |r| format!(" at {}/s", count(Some(r)))),
                    count(Some(rate)),
                    ms(Some(load.latency_us.p99)),
                ));
                tools.records.record(
                    "run",
                    &FloorRun {
                        server,
                        run,
                        concurrency: options.concurrency,
                        target_rate,
                        load,
                        cpu_seconds,
                        generator_cpu_seconds,
                        apart,
                        quiet,
                    },
                )?;
                Ok(rate)
            };
            let mut placements = vec![(&shared, tools.loader, false)];
            if let Some(apart) = &apart {
                placements.push((&apart.pair, &apart.loader, true));
            }
            for (pair, loader, is_apart) in placements {
                let _pinned = match is_apart {
                    true => Layout::GeneratorApart.apply(&pair.pids()?, &[])?,
                    false => None,
                };
                let mut tollgate_peak = 0.0;
                for index in order.clone() {
                    let rate = measure(pair, loader, index, None, is_apart, false)?;
                    if index == 0 {
                        tollgate_peak = rate;
                    }
                }
                for index in order.clone() {
                    measure(
                        pair,
                        loader,
                        index,
                        Some(tollgate_peak / 2.0),
                        is_apart,
                        false,
                    )?;
                }
                for index in order.clone() {
                    measure(pair, loader, index, Some(QUIET_RATE), is_apart, true)?;
                }
            }
        }
        drop(apart);
        h2load_runs(&shared, &mut tools, &options.h2load)
    }

    fn render(&self, records: &[Value]) -> anyhow::Result<String> {
        render(records)
    }
}

/// The first pair again under h2load, where it is installed: each run measures both servers,
/// rotating which goes first.
fn h2load_runs(pair: &Pair, tools: &mut Tools, options: &H2LoadOptions) -> anyhow::Result<()> {
    let h2load = match H2Load::new(H2Load::one_descriptor(DOMAIN, KEY, "0")) {
        Ok(h2load) => h2load,
        Err(error) => {
            say(&format!("  grpc-floor: no h2load runs: {error:#}"));
            return Ok(());
        }
    };
    let servers = [Server::Tollgate, Server::Empty];
    for server in servers {
        let addr = pair.server(server).grpc_addr();
        h2load
            .check_answered_ok(tools.loader, addr)
            .with_context(|| format!("{}:\n{}", server.label(), pair.tollgate.tollgate.log()))?;
        if !tools.scale.warmup.is_zero() {
            h2load.run(addr, tools.scale.warmup, options)?;
        }
    }
    for run in 1..=tools.scale.runs {
        for index in rotation(run, servers.len()) {
            let server = servers[index];
            let before = pair.cpu_seconds(server)?;
            let load = h2load.run(
                pair.server(server).grpc_addr(),
                tools.scale.duration,
                options,
            )?;
            let cpu_seconds = pair.cpu_seconds(server)? - before;
            say(&format!(
                "  grpc-floor h2load run {run} {}: {}/s",
                server.label(),
                count(Some(load.requests_per_second)),
            ));
            tools.records.record(
                "h2load",
                &FloorH2LoadRun {
                    server,
                    run,
                    connections: options.connections,
                    streams: options.streams,
                    load,
                    cpu_seconds,
                },
            )?;
        }
    }
    Ok(())
}

/// The gRPC-floor section of the report.
pub fn render(records: &[Value]) -> anyhow::Result<String> {
    let conditions = conditions_of(records)?;
    let runs: Vec<FloorRun> = runs_of(records, "grpc-floor")?;
    let first = &runs[0];
    let mut out = String::new();
    let _ = writeln!(
        out,
        "### tollgate against an empty RLS server\n\n{} One descriptor per request, values drawn \
         uniformly, {} calls in flight. The empty server is the same gRPC service on the same \
         transport answering OK without deciding, in a process of its own; each run measures \
         both closed loop, alternating which goes first, then both open loop at half of \
         tollgate's peak in that run, then both open loop at {}/s, far below either peak, where \
         no call should find another queued: its latency is the round trip itself (the \
         generator's part and the machine's scheduling included), the floor under the latency \
         at half of the peak. CPU: the server process's, per decision; in open loop, the cores \
         the server and the load generator kept busy on average, of the machine's {}.\n",
        measured(&conditions),
        first.concurrency,
        count(Some(QUIET_RATE)),
        conditions.machine.cpus,
    );
    out.push_str(&peak_table(&runs, false));
    let closed = |server: Server| move |r: &FloorRun| r.is(server, Point::Peak, false);
    let ratios = run_ratios(
        &runs,
        |r| r.run,
        closed(Server::Tollgate),
        closed(Server::Empty),
        |r| r.load.decisions_per_second,
    );
    let _ = writeln!(
        out,
        "\ntollgate ÷ empty server, the median of the runs' ratios: {}.\n",
        times_by_run(&ratios),
    );
    out.push_str(&open_loop_table(&runs, false));
    render_h2load(&records_of(records, "h2load")?, &mut out);
    if runs.iter().any(|r| r.apart) {
        let _ = writeln!(
            out,
            "\nApart: a second tollgate and empty server, started on CPU 0 (so each sizes its \
             runtime to that one CPU, as a sidecar limited to one CPU does), and a load generator \
             of their own on {}; closed loop for each server's peak on its one CPU, then open \
             loop at half of tollgate's peak apart, so a call waits for the server alone and not \
             for a core the generator holds.\n",
            match conditions.machine.cpus {
                0..=2 => "CPU 1".to_owned(),
                cpus => format!("CPUs 1–{}", cpus - 1),
            },
        );
        out.push_str(&peak_table(&runs, true));
        out.push('\n');
        out.push_str(&open_loop_table(&runs, true));
    }
    Ok(out)
}

/// The h2load runs' table and ratio, when there are any.
fn render_h2load(runs: &[FloorH2LoadRun], out: &mut String) {
    let Some(first) = runs.first() else {
        return;
    };
    let _ = writeln!(
        out,
        "\nThe same two servers under h2load (nghttp2's load generator, a C client that spends \
         about half the CPU on a call of the generator above, so it leaves the servers more of the \
         cores they share with it), after the runs above, each run rotating which goes first: \
         {} connections × {} calls in flight, every call the same request (one descriptor \
         value), checked once to be answered OK, since h2load sees only HTTP statuses. h2load \
         reports the mean latency, not percentiles.\n",
        first.connections, first.streams,
    );
    let mut table = Table::new(&[
        ("server, h2load", Align::Left),
        ("decisions/s", Align::Right),
        ("min–max", Align::Right),
        ("mean ms", Align::Right),
        ("CPU µs/decision", Align::Right),
    ]);
    for server in [Server::Tollgate, Server::Empty] {
        let runs: Vec<&FloorH2LoadRun> = runs.iter().filter(|r| r.server == server).collect();
        let mut row = vec![server.label().to_owned()];
        row.extend(h2load::load_cells(runs.iter().map(|r| &r.load)));
        // h2load counts answers, not decisions; the request was checked to be decided OK.
        row.push(per_decision_cell(
            runs.iter().map(|r| (r.cpu_seconds, r.load.succeeded)),
        ));
        table.row(row);
    }
    out.push_str(&table.render());
    let ratios = run_ratios(
        runs,
        |r| r.run,
        |r| r.server == Server::Tollgate,
        |r| r.server == Server::Empty,
        |r| r.load.requests_per_second,
    );
    let _ = writeln!(
        out,
        "\nUnder h2load, tollgate ÷ empty server, the median of the runs' ratios: {}.",
        times_by_run(&ratios),
    );
}

/// The closed-loop peaks of both servers, sharing the cores with the generator or apart from it.
fn peak_table(runs: &[FloorRun], apart: bool) -> String {
    let mut table = Table::new(&[
        (if apart { "server, apart" } else { "server" }, Align::Left),
        ("decisions/s", Align::Right),
        ("min–max", Align::Right),
        ("p50 ms", Align::Right),
        ("p99 ms", Align::Right),
        ("CPU µs/decision", Align::Right),
    ]);
    for server in [Server::Tollgate, Server::Empty] {
        let runs: Vec<&FloorRun> = runs
            .iter()
            .filter(|r| r.is(server, Point::Peak, apart))
            .collect();
        let mut row = vec![server.label().to_owned()];
        row.extend(load_cells(runs.iter().map(|r| &r.load)));
        row.push(per_decision_cell(
            runs.iter().map(|r| (r.cpu_seconds, r.load.decisions)),
        ));
        table.row(row);
    }
    table.render()
}

/// The open-loop rows of both servers, sharing the cores with the generator or apart from it.
fn open_loop_table(runs: &[FloorRun], apart: bool) -> String {
    let mut table = Table::new(&[
        (
            if apart {
                "server, open loop, apart"
            } else {
                "server, open loop"
            },
            Align::Left,
        ),
        ("target/s", Align::Right),
        ("achieved/s", Align::Right),
        ("p50 ms", Align::Right),
        ("p90 ms", Align::Right),
        ("p99 ms", Align::Right),
        ("p99.9 ms", Align::Right),
        ("server cores", Align::Right),
        ("generator cores", Align::Right),
    ]);
    for (point, server) in [Point::Half, Point::Quiet]
        .into_iter()
        .flat_map(|point| [(point, Server::Tollgate), (point, Server::Empty)])
    {
        let runs: Vec<&FloorRun> = runs.iter().filter(|r| r.is(server, point, apart)).collect();
        if runs.is_empty() {
            // Records from before the quiet point was measured.
            continue;
        }
        table.row(vec![
            server.label().to_owned(),
            count(median(runs.iter().filter_map(|r| r.target_rate))),
            count(median(runs.iter().map(|r| r.load.decisions_per_second))),
            ms(median(runs.iter().map(|r| r.load.latency_us.p50))),
            ms(median(runs.iter().map(|r| r.load.latency_us.p90))),
            ms(median(runs.iter().map(|r| r.load.latency_us.p99))),
            ms(median(runs.iter().map(|r| r.load.latency_us.p99_9))),
            fixed(median(runs.iter().filter_map(|r| r.cores().0)), 2),
            fixed(median(runs.iter().filter_map(|r| r.cores().1)), 2),
        ]);
    }
    table.render()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::summary::LatencyUs;

    fn open_run(server: Server, run: u32, rate: f64, p99_us: f64, quiet: bool) -> FloorRun {
        let latency_us = LatencyUs {
            min: 100.0,
            mean: 500.0,
            p50: 400.0,
            p90: 800.0,
            p99: p99_us,
            p99_9: 2.0 * p99_us,
            max: 3.0 * p99_us,
        };
        FloorRun {
            server,
            run,
            concurrency: 128,
            target_rate: Some(rate),
            load: Summary {
                elapsed_seconds: 5.0,
                requests: (rate * 5.0) as u64,
                ok: (rate * 5.0) as u64,
                over_limit: 0,
                unknown: 0,
                errors: 0,
                errors_by_code: Default::default(),
                decisions: (rate * 5.0) as u64,
                decisions_per_second: rate,
                requests_per_second: rate,
                latency_us,
            },
            cpu_seconds: 1.0,
            generator_cpu_seconds: 1.0,
            apart: false,
            quiet,
        }
    }

    #[test]
    fn open_loop_rows_give_half_the_peak_then_the_quiet_rate_per_server() {
        let runs = [
            open_run(Server::Tollgate, 1, 26_000.0, 4_000.0, false),
            open_run(Server::Empty, 1, 26_000.0, 3_500.0, false),
            open_run(Server::Tollgate, 1, QUIET_RATE, 1_500.0, true),
            open_run(Server::Empty, 1, QUIET_RATE, 1_250.0, true),
        ];
        let table = open_loop_table(&runs, false);
        let rows: Vec<(&str, &str, &str)> = table
            .lines()
            .skip(2)
            .map(|line| {
                let cells: Vec<&str> = line.split('|').map(str::trim).collect();
                (cells[1], cells[2], cells[6])
            })
            .collect();
        assert_eq!(
            rows,
            [
                ("tollgate, memory backend", "26,000", "4.00"),
                ("empty RLS server", "26,000", "3.50"),
                ("tollgate, memory backend", "2,000", "1.50"),
                ("empty RLS server", "2,000", "1.25"),
            ],
            "{table}"
        );
        // Records from before the quiet point give the rows at half of the peak alone.
        assert_eq!(open_loop_table(&runs[..2], false).lines().count(), 4);
    }

    #[test]
    fn h2load_runs_give_a_table_and_the_ratio_of_each_run() {
        let run = |server, run, per_second: f64, cpu_seconds| FloorH2LoadRun {
            server,
            run,
            connections: 4,
            streams: 32,
            load: H2LoadSummary::steady(per_second, 1_500.0),
            cpu_seconds,
        };
        let runs = [
            run(Server::Tollgate, 1, 90_000.0, 1.8),
            run(Server::Empty, 1, 100_000.0, 1.5),
            run(Server::Empty, 2, 100_000.0, 1.5),
            run(Server::Tollgate, 2, 80_000.0, 1.6),
        ];
        let mut out = String::new();
        render_h2load(&runs, &mut out);
        assert!(out.contains("4 connections × 32 calls in flight"), "{out}");
        assert!(
            out.contains("| tollgate, memory backend | 85,000 | 80,000–90,000 | 1.50 | 20.0 |"),
            "{out}"
        );
        assert!(
            out.contains("| empty RLS server | 100,000 | 100,000–100,000 | 1.50 | 15.0 |"),
            "{out}"
        );
        assert!(
            out.contains(
                "Under h2load, tollgate ÷ empty server, the median of the runs' ratios: 0.85× \
                 (runs: 0.90×, 0.80×)."
            ),
            "{out}"
        );
        let mut none = String::new();
        render_h2load(&[], &mut none);
        assert_eq!(none, "");
    }
}
