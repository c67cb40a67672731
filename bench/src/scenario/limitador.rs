//! `limitador`: tollgate on one Redis against Kuadrant's limitador-server on the same Redis,
//! under the same load.
//!
//! limitador is the other Rust RLS server our users weigh tollgate against. It is not in any
//! package registry, so this scenario runs a `limitador-server` binary the operator built from
//! its repository (`cargo build --release -p limitador-server` in a checkout) and names with
//! `--limitador-server` or `$LIMITADOR_SERVER`; without one, `report` skips the scenario and
//! keeps its last section, and running it alone says what is missing.
//!
//! Both servers count the same traffic on the same redis-server: one descriptor whose value is
//! drawn uniformly from many keys, under a limit no load reaches, so every hit is admitted and
//! stored. tollgate decides with its sliding window counter; limitador with its fixed window
//! (`redis` storage: every hit goes to Redis), and, for reference, its `redis_cached` storage,
//! which counts in memory and writes to Redis in batches (it may admit past a limit across
//! instances, so it is not the comparison the ratio is about). Each run measures every server
//! closed loop, one after the other, rotating which goes first. Reported: decisions per second,
//! latency, each server's CPU and Redis's CPU per decision, and tollgate ÷ limitador.

use std::fmt::Write as _;
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::doc::{Align, Table, count, fixed, measured, median, ms, times_by_run};
use crate::h2load::{self, H2Load, H2LoadOptions, H2LoadSummary};
use crate::load::summary::Summary;
use crate::proc::OwnedChild;
use crate::scenario::{
    Algorithm, Bench, ClosedLoopOptions, DOMAIN, Phase, Scenario, ScenarioName, UNREACHABLE_LIMIT,
    WINDOW_MS, conditions_of, load_cells, per_decision_cell, policy, records_of, rotation,
    run_ratios, runs_of, say, uniform_shape,
};
use crate::stand::{Backend, MeasuredServer, Stand};

/// The options of `limitador`.
#[derive(Debug, Clone, clap::Args)]
pub struct LimitadorOptions {
    /// The limitador-server binary, built from github.com/Kuadrant/limitador.
    #[arg(long, env = "LIMITADOR_SERVER")]
    pub limitador_server: Option<PathBuf>,

    /// The closed loop sent to each server.
    #[command(flatten)]
    pub load: ClosedLoopOptions,

    /// The h2load runs that follow the generator's.
    #[command(flatten)]
    pub h2load: H2LoadOptions,
}

/// The `limitador` scenario.
pub struct Limitador {
    options: LimitadorOptions,
}

impl Limitador {
    /// The scenario with `options`.
    pub fn new(options: LimitadorOptions) -> Limitador {
        Limitador { options }
    }

    /// The limitador-server binary, or why there is none to run.
    fn binary(&self) -> Result<&Path, String> {
        match &self.options.limitador_server {
            None => Err(
                "no limitador-server: build it from github.com/Kuadrant/limitador \
                         (`cargo build --release -p limitador-server`) and name it with \
                         --limitador-server or $LIMITADOR_SERVER"
                    .to_owned(),
            ),
            Some(path) if !path.is_file() => Err(format!(
                "--limitador-server {} is not a file",
                path.display()
            )),
            Some(path) => Ok(path),
        }
    }
}

/// Which server a run measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Server {
    /// tollgate on the redis backend, sliding window counter.
    Tollgate,
    /// limitador-server with its `redis` storage.
    LimitadorRedis,
    /// limitador-server with its `redis_cached` storage.
    LimitadorRedisCached,
}

impl Server {
    const ALL: [Server; 3] = [
        Server::Tollgate,
        Server::LimitadorRedis,
        Server::LimitadorRedisCached,
    ];

    fn label(self) -> &'static str {
        match self {
            Server::Tollgate => "tollgate, redis (sliding window counter)",
            Server::LimitadorRedis => "limitador, redis (fixed window)",
            Server::LimitadorRedisCached => "limitador, redis_cached (fixed window, batched)",
        }
    }

    /// Where the server counts: limitador-server's storage argument, tollgate's backend.
    fn storage(self) -> &'static str {
        match self {
            Server::LimitadorRedisCached => "redis_cached",
            Server::Tollgate | Server::LimitadorRedis => "redis",
        }
    }
}

/// One measured run of one server.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LimitadorRun {
    /// Which server.
    pub server: Server,
    /// Run number, from 1.
    pub run: u32,
    /// Calls in flight.
    pub concurrency: u32,
    /// What the load generator saw.
    pub load: Summary,
    /// What the run cost the server and Redis (its fields at the record's top level, as
    /// records written before h2load runs were).
    #[serde(flatten)]
    pub cost: Cost,
}

/// One h2load run of one server: the same request (one descriptor value) over and over.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct H2LoadRun {
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
    /// What the run cost the server and Redis.
    pub cost: Cost,
}

/// What a run cost the server and Redis.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct Cost {
    /// CPU seconds the server process used.
    pub cpu_seconds: f64,
    /// CPU seconds redis-server used.
    pub redis_cpu_seconds: f64,
    /// Commands Redis served (a script's own commands included).
    pub redis_commands: u64,
}

/// limitador-server as a child process, killed when dropped.
struct LimitadorProcess {
    process: OwnedChild,
    addr: SocketAddr,
    log: PathBuf,
}

/// How long limitador-server may take to listen.
const START_TIMEOUT: Duration = Duration::from_secs(60);

impl LimitadorProcess {
    /// Starts `binary` with `limits` counting in `storage` at `redis_url`, and waits until its
    /// RLS port accepts connections.
    fn start(
        binary: &Path,
        dir: &Path,
        storage: &str,
        redis_url: &str,
        limits: &Path,
    ) -> anyhow::Result<LimitadorProcess> {
        let [addr, http] = tollgate_testkit::net::free_addrs();
        let log = dir.join(format!("limitador-{storage}.log"));
        let out =
            std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let child = Command::new(binary)
            .arg("--rls-ip")
            .arg(addr.ip().to_string())
            .arg("--rls-port")
            .arg(addr.port().to_string())
            .arg("--http-ip")
            .arg(http.ip().to_string())
            .arg("--http-port")
            .arg(http.port().to_string())
            .arg(limits)
            .arg(storage)
            .arg(redis_url)
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        let mut process = LimitadorProcess {
            process: OwnedChild::new(child),
            addr,
            log,
        };
        let started = Instant::now();
        loop {
            if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                return Ok(process);
            }
            if let Some(status) = process.process.child().try_wait()? {
                bail!(
                    "limitador-server ({storage}) exited with {status} before listening:\n{}",
                    process.log()
                );
            }
            if started.elapsed() > START_TIMEOUT {
                bail!(
                    "limitador-server ({storage}) did not listen on {addr} within {}s:\n{}",
                    START_TIMEOUT.as_secs(),
                    process.log()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl MeasuredServer for LimitadorProcess {
    fn grpc_addr(&self) -> SocketAddr {
        self.addr
    }

    fn pid(&self) -> anyhow::Result<u32> {
        Ok(self.process.id())
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

const KEY: &str = "user";

/// limitador's limits file for the same traffic: one counter per value of the descriptor's
/// `user` entry, in the domain the requests name, under the same limit and window.
fn limits_yaml() -> String {
    format!(
        "- namespace: {DOMAIN}\n  max_value: {UNREACHABLE_LIMIT}\n  seconds: {}\n  \
         conditions: []\n  variables:\n    - descriptors[0].{KEY}\n",
        WINDOW_MS / 1000
    )
}

impl Scenario for Limitador {
    fn name(&self) -> ScenarioName {
        ScenarioName::Limitador
    }

    fn unavailable(&self) -> Option<String> {
        self.binary().err()
    }

    fn run(&self, bench: &mut Bench) -> anyhow::Result<()> {
        let options = &self.options;
        let binary = self.binary().map_err(anyhow::Error::msg)?.to_path_buf();
        let policy = policy(&[(KEY.to_owned(), Algorithm::Counter, UNREACHABLE_LIMIT, 1)]);
        bench.servers.ensure(Backend::Redis);
        // Removed when dropped, after the processes whose logs it holds (declared later).
        let temp = tempfile::Builder::new()
            .prefix("tollgate-bench-limitador-")
            .tempdir()
            .context("creating a directory for limitador-server's files")?;
        let dir = temp.path();
        let limits = dir.join("limits.yaml");
        std::fs::write(&limits, limits_yaml())
            .with_context(|| format!("writing {}", limits.display()))?;
        let (servers, tools) = bench.split();
        let tollgate = Stand::start(servers, Backend::Redis, &policy, "deny")?;
        let redis = tollgate
            .nodes
            .masters()
            .first()
            .copied()
            .context("the redis backend has no server")?;
        let redis_url = redis.url();
        let limitadors = [Server::LimitadorRedis, Server::LimitadorRedisCached]
            .into_iter()
            .map(|server| {
                LimitadorProcess::start(&binary, dir, server.storage(), &redis_url, &limits)
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        // In the order of `Server::ALL`, which is the enum's own, so `server as usize` indexes it.
        let measured: [&dyn MeasuredServer; 3] = [&tollgate, &limitadors[0], &limitadors[1]];
        // One set of connections per server.
        let connections = measured
            .iter()
            .map(|server| {
                tools
                    .loader
                    .connect(&[server.grpc_addr()], options.load.connections)
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let cpu = |server: Server| measured[server as usize].cpu_seconds();
        let log = |server: Server| measured[server as usize].log();
        let shape = uniform_shape(vec![KEY.to_owned()], options.load.keys);
        let phase = |duration| Phase {
            shape: Arc::clone(&shape),
            concurrency: options.load.concurrency,
            rate: None,
            duration,
        };
        for (index, server) in Server::ALL.into_iter().enumerate() {
            let load = tools
                .loader
                .drive(&connections[index], &phase(tools.scale.warmup))?;
            if load.decisions == 0 || !load.errors_by_code.is_empty() {
                bail!(
                    "the warmup of {} failed: {} decisions, errors {:?}\n{}",
                    server.label(),
                    load.decisions,
                    load.errors_by_code,
                    log(server)
                );
            }
        }
        // What a run costs the server and Redis: readings before it, then the cost since them.
        let readings = |server: Server| {
            tollgate.nodes.reset_stats();
            anyhow::Ok((cpu(server)?, tollgate.redis_cpu_seconds()?))
        };
        let cost_since = |server: Server, (cpu_before, redis_before): (f64, f64)| {
            anyhow::Ok(Cost {
                cpu_seconds: cpu(server)? - cpu_before,
                redis_cpu_seconds: tollgate.redis_cpu_seconds()? - redis_before,
                redis_commands: crate::stand::command_stats(redis)?
                    .iter()
                    .filter(|(name, _)| !matches!(name.as_str(), "info" | "config|resetstat"))
                    .map(|(_, stat)| stat.calls)
                    .sum(),
            })
        };
        for run in 1..=tools.scale.runs {
            for index in rotation(run, Server::ALL.len()) {
                let server = Server::ALL[index];
                let before = readings(server)?;
                let load = tools
                    .loader
                    .drive(&connections[index], &phase(tools.scale.duration))?;
                let cost = cost_since(server, before)?;
                if load.decisions == 0 {
                    bail!(
                        "{} decided nothing: {:?}\n{}",
                        server.label(),
                        load.errors_by_code,
                        log(server)
                    );
                }
                say(&format!(
                    "  limitador run {run} {}: {}/s, p99 {} ms",
                    server.label(),
                    count(Some(load.decisions_per_second)),
                    ms(Some(load.latency_us.p99)),
                ));
                tools.records.record(
                    "run",
                    &LimitadorRun {
                        server,
                        run,
                        concurrency: options.load.concurrency,
                        load,
                        cost,
                    },
                )?;
            }
        }

        // The same servers under h2load, where it is installed.
        let h2load = match H2Load::new(H2Load::one_descriptor(DOMAIN, KEY, "0")) {
            Ok(h2load) => h2load,
            Err(error) => {
                say(&format!("  limitador: no h2load runs: {error:#}"));
                return Ok(());
            }
        };
        let h2load_run = |server: Server, duration| {
            h2load.run(
                measured[server as usize].grpc_addr(),
                duration,
                &options.h2load,
            )
        };
        for server in Server::ALL {
            h2load
                .check_answered_ok(tools.loader, measured[server as usize].grpc_addr())
                .with_context(|| format!("{}:\n{}", server.label(), log(server)))?;
            if !tools.scale.warmup.is_zero() {
                h2load_run(server, tools.scale.warmup)?;
            }
        }
        for run in 1..=tools.scale.runs {
            for index in rotation(run, Server::ALL.len()) {
                let server = Server::ALL[index];
                let before = readings(server)?;
                let load = h2load_run(server, tools.scale.duration)?;
                let cost = cost_since(server, before)?;
                say(&format!(
                    "  limitador h2load run {run} {}: {}/s",
                    server.label(),
                    count(Some(load.requests_per_second)),
                ));
                tools.records.record(
                    "h2load",
                    &H2LoadRun {
                        server,
                        run,
                        connections: options.h2load.connections,
                        streams: options.h2load.streams,
                        load,
                        cost,
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

/// The limitador section of the report.
pub fn render(records: &[Value]) -> anyhow::Result<String> {
    let conditions = conditions_of(records)?;
    let runs: Vec<LimitadorRun> = runs_of(records, "limitador")?;
    let first = &runs[0];
    let mut out = String::new();
    let _ = writeln!(
        out,
        "### tollgate against limitador on the same Redis\n\n{} One descriptor per request, \
         values drawn uniformly, under a limit no load reaches, so every hit is admitted and \
         stored; closed loop, {} calls in flight; every server counts on the same redis-server, \
         one after the other in each run, rotating which goes first. limitador-server is built \
         from github.com/Kuadrant/limitador; its `redis` storage sends every hit to Redis, its \
         `redis_cached` storage counts in memory and writes to Redis in batches. CPU: the \
         server process's and redis-server's, per decision; Redis commands as `INFO \
         commandstats` counts them (a script's own commands included).\n",
        measured(&conditions),
        first.concurrency,
    );
    let mut table = cost_table(&[
        ("server", Align::Left),
        ("decisions/s", Align::Right),
        ("min–max", Align::Right),
        ("p50 ms", Align::Right),
        ("p99 ms", Align::Right),
    ]);
    for server in Server::ALL {
        let runs: Vec<&LimitadorRun> = runs.iter().filter(|r| r.server == server).collect();
        if runs.is_empty() {
            continue;
        }
        let mut row = vec![server.label().to_owned()];
        row.extend(load_cells(runs.iter().map(|r| &r.load)));
        row.extend(cost_cells(runs.iter().map(|r| (r.cost, r.load.decisions))));
        table.row(row);
    }
    out.push_str(&table.render());
    write_ratios(
        &mut out,
        "tollgate",
        &runs,
        |r| (r.server, r.run),
        |r| r.load.decisions_per_second,
    );
    render_h2load(&records_of(records, "h2load")?, &mut out);
    Ok(out)
}

/// The h2load runs' table and ratios, when there are any.
fn render_h2load(runs: &[H2LoadRun], out: &mut String) {
    let Some(first) = runs.first() else {
        return;
    };
    let _ = writeln!(
        out,
        "\nThe same servers under h2load (nghttp2's load generator, a C client that spends far \
         less CPU on a call than the generator above, so it leaves the servers more of the \
         cores they share with it), after the runs above, each run rotating which goes first: \
         {} connections × {} calls in flight, every call the same request (one descriptor \
         value, so one counter in Redis), checked once to be answered OK, since h2load sees only \
         HTTP statuses. h2load reports the mean latency, not percentiles.\n",
        first.connections, first.streams,
    );
    let mut table = cost_table(&[
        ("server", Align::Left),
        ("decisions/s", Align::Right),
        ("min–max", Align::Right),
        ("mean ms", Align::Right),
    ]);
    for server in Server::ALL {
        let runs: Vec<&H2LoadRun> = runs.iter().filter(|r| r.server == server).collect();
        if runs.is_empty() {
            continue;
        }
        let mut row = vec![server.label().to_owned()];
        row.extend(h2load::load_cells(runs.iter().map(|r| &r.load)));
        // h2load counts answers, not decisions; the request was checked to be decided OK.
        row.extend(cost_cells(runs.iter().map(|r| (r.cost, r.load.succeeded))));
        table.row(row);
    }
    out.push_str(&table.render());
    write_ratios(
        out,
        "Under h2load, tollgate",
        runs,
        |r| (r.server, r.run),
        |r| r.load.requests_per_second,
    );
}

/// The columns of what the runs cost, the same under either load generator.
const COST_COLUMNS: [(&str, Align); 3] = [
    ("server CPU µs/decision", Align::Right),
    ("Redis CPU µs/decision", Align::Right),
    ("Redis commands/decision", Align::Right),
];

/// A table of `load` columns followed by [`COST_COLUMNS`].
fn cost_table(load: &[(&'static str, Align)]) -> Table {
    Table::new(&[load, &COST_COLUMNS].concat())
}

/// The cells under [`COST_COLUMNS`] for one server's runs, each its cost and the decisions it
/// paid for: the medians of the runs' server and Redis CPU and Redis commands per decision.
fn cost_cells(runs: impl IntoIterator<Item = (Cost, u64)>) -> [String; 3] {
    let runs: Vec<(Cost, u64)> = runs.into_iter().collect();
    [
        per_decision_cell(runs.iter().map(|(c, n)| (c.cpu_seconds, *n))),
        per_decision_cell(runs.iter().map(|(c, n)| (c.redis_cpu_seconds, *n))),
        fixed(
            median(
                runs.iter()
                    .filter(|(_, n)| *n > 0)
                    .map(|(c, n)| c.redis_commands as f64 / *n as f64),
            ),
            2,
        ),
    ]
}

/// One line "`lead` ÷ limitador, the median of the runs' ratios: …" giving the ratio to each
/// storage of limitador that `runs` measured beside tollgate; `of` names a run's server and
/// number.
fn write_ratios<R>(
    out: &mut String,
    lead: &str,
    runs: &[R],
    of: impl Fn(&R) -> (Server, u32),
    rate: impl Fn(&R) -> f64,
) {
    let mut each = Vec::new();
    for other in [Server::LimitadorRedis, Server::LimitadorRedisCached] {
        let ratios = run_ratios(
            runs,
            |r| of(r).1,
            |r| of(r).0 == Server::Tollgate,
            |r| of(r).0 == other,
            &rate,
        );
        if !ratios.is_empty() {
            let storage = other.label().trim_start_matches("limitador, ");
            each.push(format!("{storage}, {}", times_by_run(&ratios)));
        }
    }
    if !each.is_empty() {
        let _ = writeln!(
            out,
            "\n{lead} ÷ limitador, the median of the runs' ratios: {}.",
            each.join("; "),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_count_per_user_in_the_bench_domain_over_the_same_window() {
        assert_eq!(
            limits_yaml(),
            "- namespace: bench\n  max_value: 4000000000\n  seconds: 60\n  conditions: []\n  \
             variables:\n    - descriptors[0].user\n"
        );
    }

    #[test]
    fn h2load_runs_give_a_table_and_the_ratio_of_each_run() {
        let run = |server, run, per_second: f64, cpu_seconds| H2LoadRun {
            server,
            run,
            connections: 4,
            streams: 32,
            load: H2LoadSummary::steady(per_second, 2_000.0),
            cost: Cost {
                cpu_seconds,
                redis_cpu_seconds: 0.5,
                redis_commands: 4 * per_second as u64,
            },
        };
        let runs = [
            run(Server::Tollgate, 1, 60_000.0, 1.2),
            run(Server::LimitadorRedis, 1, 20_000.0, 1.0),
            run(Server::Tollgate, 2, 50_000.0, 1.0),
            run(Server::LimitadorRedis, 2, 20_000.0, 1.0),
        ];
        let mut out = String::new();
        render_h2load(&runs, &mut out);
        assert!(out.contains("4 connections × 32 calls in flight"), "{out}");
        assert!(
            out.contains(
                "| tollgate, redis (sliding window counter) | 55,000 | 50,000–60,000 | 2.00 | 20.0 | \
                 9.2 | 4.00 |"
            ),
            "{out}"
        );
        assert!(
            out.contains(
                "Under h2load, tollgate ÷ limitador, the median of the runs' ratios: redis \
                 (fixed window), 2.75× (runs: 3.00×, 2.50×)."
            ),
            "{out}"
        );
        assert!(!out.contains("redis_cached"), "{out}");
        let mut none = String::new();
        render_h2load(&[], &mut none);
        assert_eq!(none, "");
    }

    #[test]
    fn a_missing_binary_is_named_with_how_to_get_one() {
        let scenario = |path: Option<&str>| {
            Limitador::new(LimitadorOptions {
                limitador_server: path.map(PathBuf::from),
                load: ClosedLoopOptions {
                    concurrency: 1,
                    connections: 1,
                    keys: 1,
                },
                h2load: H2LoadOptions {
                    connections: 1,
                    streams: 1,
                },
            })
        };
        let none = scenario(None).unavailable().unwrap_or_default();
        assert!(
            none.contains("cargo build --release -p limitador-server"),
            "{none}"
        );
        let missing = scenario(Some("/nonexistent/limitador-server"))
            .unavailable()
            .unwrap_or_default();
        assert!(
            missing.contains("/nonexistent/limitador-server is not a file"),
            "{missing}"
        );
    }
}
