//! `grpc-floor`: tollgate on the memory backend against the empty RLS server, a stock tonic
//! server: the ceiling of what a gRPC server in Rust answers, so the gap is what a decision costs.
//!
//! The empty server ([`crate::empty`]) answers the same RPC OK without deciding, in a process of
//! its own, as tollgate runs. Each run measures both closed loop, one after the other,
//! alternating which goes first so the machine's other work weighs on both alike. Then, where
//! h2load is installed, both again under h2load, which costs about half as much a call as our
//! generator: with more of the shared cores left to the servers, the gap between them shows
//! whole. Reported: decisions per second of each, their ratio (the median of the runs' ratios),
//! and CPU per decision of each process.

use std::fmt::Write as _;
use std::sync::Arc;

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::doc::{Align, Table, count, measured, ms, times_by_run};
use crate::empty::EmptyProcess;
use crate::h2load::{self, H2Load, H2LoadOptions, H2LoadSummary};
use crate::load::summary::Summary;
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
    /// What the load generator saw.
    pub load: Summary,
    /// CPU seconds the server process used during the run.
    pub cpu_seconds: f64,
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
        let servers = [Server::Tollgate, Server::Empty];
        for run in 1..=tools.scale.runs {
            for index in rotation(run, servers.len()) {
                let server = servers[index];
                let before = shared.cpu_seconds(server)?;
                let load = tools.loader.drive(
                    &shared.connections[index],
                    &phase(None, tools.scale.duration),
                )?;
                let cpu_seconds = shared.cpu_seconds(server)? - before;
                if load.decisions == 0 {
                    bail!(
                        "the {} decided nothing: {:?}\n{}",
                        server.label(),
                        load.errors_by_code,
                        shared.tollgate.tollgate.log()
                    );
                }
                say(&format!(
                    "  grpc-floor run {run} {}: {}/s, p99 {} ms",
                    server.label(),
                    count(Some(load.decisions_per_second)),
                    ms(Some(load.latency_us.p99)),
                ));
                tools.records.record(
                    "run",
                    &FloorRun {
                        server,
                        run,
                        concurrency: options.concurrency,
                        load,
                        cpu_seconds,
                    },
                )?;
            }
        }
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
        "### tollgate against a stock tonic server\n\n{} One descriptor per request, values \
         drawn uniformly, {} calls in flight, closed loop. The empty server is a stock tonic \
         server (tonic's generated service on `tonic::transport::Server`, tokio's default \
         runtime) answering OK without deciding, in a process of its own; each run measures \
         both, alternating which goes first. CPU: the server process's, per decision.\n",
        measured(&conditions),
        first.concurrency,
    );
    out.push_str(&peak_table(&runs));
    let closed = |server: Server| move |r: &FloorRun| r.server == server;
    let ratios = run_ratios(
        &runs,
        |r| r.run,
        closed(Server::Tollgate),
        closed(Server::Empty),
        |r| r.load.decisions_per_second,
    );
    let _ = writeln!(
        out,
        "\ntollgate ÷ empty server, the median of the runs' ratios: {}.",
        times_by_run(&ratios),
    );
    render_h2load(&records_of(records, "h2load")?, &mut out);
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

/// The closed-loop peaks of both servers.
fn peak_table(runs: &[FloorRun]) -> String {
    let mut table = Table::new(&[
        ("server", Align::Left),
        ("decisions/s", Align::Right),
        ("min–max", Align::Right),
        ("p50 ms", Align::Right),
        ("p99 ms", Align::Right),
        ("CPU µs/decision", Align::Right),
    ]);
    for server in [Server::Tollgate, Server::Empty] {
        let runs: Vec<&FloorRun> = runs.iter().filter(|r| r.server == server).collect();
        let mut row = vec![server.label().to_owned()];
        row.extend(load_cells(runs.iter().map(|r| &r.load)));
        row.push(per_decision_cell(
            runs.iter().map(|r| (r.cpu_seconds, r.load.decisions)),
        ));
        table.row(row);
    }
    table.render()
}

#[cfg(test)]
mod tests {
    use super::*;

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
