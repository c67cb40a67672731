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
use crate::load::summary::Summary;
use crate::proc::OwnedChild;
use crate::scenario::{
    Algorithm, Bench, ClosedLoopOptions, DOMAIN, Phase, Scenario, ScenarioName, UNREACHABLE_LIMIT,
    WINDOW_MS, conditions_of, policy, rotation, run_ratios, runs_of, say, served_cells,
    uniform_shape,
};
use crate::stand::{Backend, Stand};

/// The options of `limitador`.
#[derive(Debug, Clone, clap::Args)]
pub struct LimitadorOptions {
    /// The limitador-server binary, built from github.com/Kuadrant/limitador.
    #[arg(long, env = "LIMITADOR_SERVER")]
    pub limitador_server: Option<PathBuf>,

    /// The closed loop sent to each server.
    #[command(flatten)]
    pub load: ClosedLoopOptions,
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
    /// CPU seconds the server process used during the run.
    pub cpu_seconds: f64,
    /// CPU seconds redis-server used during the run.
    pub redis_cpu_seconds: f64,
    /// Commands Redis served during the run (a script's own commands included).
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

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn cpu_seconds(&self) -> anyhow::Result<f64> {
        self.process.cpu_seconds()
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
        // One set of connections per server, in the order of `Server::ALL`.
        let connections = std::iter::once(tollgate.grpc_addr())
            .chain(limitadors.iter().map(|limitador| limitador.addr))
            .map(|addr| tools.loader.connect(&[addr], options.load.connections))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let cpu = |server: Server| match server {
            Server::Tollgate => tollgate.tollgate_cpu_seconds(),
            Server::LimitadorRedis => limitadors[0].cpu_seconds(),
            Server::LimitadorRedisCached => limitadors[1].cpu_seconds(),
        };
        let log = |server: Server| match server {
            Server::Tollgate => tollgate.tollgate.log(),
            Server::LimitadorRedis => limitadors[0].log(),
            Server::LimitadorRedisCached => limitadors[1].log(),
        };
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
        for run in 1..=tools.scale.runs {
            for index in rotation(run, Server::ALL.len()) {
                let server = Server::ALL[index];
                tollgate.nodes.reset_stats();
                let before = cpu(server)?;
                let redis_before = tollgate.redis_cpu_seconds()?;
                let load = tools
                    .loader
                    .drive(&connections[index], &phase(tools.scale.duration))?;
                let cpu_seconds = cpu(server)? - before;
                let redis_cpu_seconds = tollgate.redis_cpu_seconds()? - redis_before;
                let redis_commands = crate::stand::command_stats(redis)?
                    .iter()
                    .filter(|(name, _)| !matches!(name.as_str(), "info" | "config|resetstat"))
                    .map(|(_, stat)| stat.calls)
                    .sum();
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
                        cpu_seconds,
                        redis_cpu_seconds,
                        redis_commands,
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
    let mut table = Table::new(&[
        ("server", Align::Left),
        ("decisions/s", Align::Right),
        ("min–max", Align::Right),
        ("p50 ms", Align::Right),
        ("p99 ms", Align::Right),
        ("server CPU µs/decision", Align::Right),
        ("Redis CPU µs/decision", Align::Right),
        ("Redis commands/decision", Align::Right),
    ]);
    for server in Server::ALL {
        let runs: Vec<&LimitadorRun> = runs.iter().filter(|r| r.server == server).collect();
        if runs.is_empty() {
            continue;
        }
        let mut row = vec![server.label().to_owned()];
        row.extend(served_cells(
            runs.iter()
                .map(|r| (&r.load, r.cpu_seconds, r.redis_cpu_seconds)),
        ));
        row.push(fixed(
            median(
                runs.iter()
                    .filter(|r| r.load.decisions > 0)
                    .map(|r| r.redis_commands as f64 / r.load.decisions as f64),
            ),
            2,
        ));
        table.row(row);
    }
    out.push_str(&table.render());
    for other in [Server::LimitadorRedis, Server::LimitadorRedisCached] {
        let ratios = run_ratios(
            &runs,
            |r| r.run,
            |r| r.server == Server::Tollgate,
            |r| r.server == other,
            |r| r.load.decisions_per_second,
        );
        if !ratios.is_empty() {
            let _ = writeln!(
                out,
                "\ntollgate ÷ {}, the median of the runs' ratios: {}.",
                other.label(),
                times_by_run(&ratios),
            );
        }
    }
    Ok(out)
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
    fn a_missing_binary_is_named_with_how_to_get_one() {
        let scenario = |path: Option<&str>| {
            Limitador::new(LimitadorOptions {
                limitador_server: path.map(PathBuf::from),
                load: ClosedLoopOptions {
                    concurrency: 1,
                    connections: 1,
                    keys: 1,
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
