//! `redis-bound`: tollgate against redis-benchmark's `EVALSHA` when Redis, not the clients, is
//! what runs out.
//!
//! In the matrix every process shares two cores, so tollgate's peak is where its gRPC side, the
//! load generator's and Redis together fill them, and its ratio to redis-benchmark (a small C
//! client) says more about gRPC than about how tollgate uses Redis. Here the one redis-server is
//! held to a share of a CPU of its own ([`crate::proc::Throttle`], [`Layout::RedisApart`]),
//! low enough that the clients keep it busy with time to spare on the other cores, so both
//! clients run at the rate Redis can serve them: what is
//! compared is how much of Redis each call takes and whether the client keeps Redis fed. Both
//! send the same script on keys of the same shape with the same calls in flight:
//! redis-benchmark with one connection per call in flight, tollgate with its multiplexed
//! connection, one limit a request. Each run measures every point one after the other, rotating
//! which goes first.

use std::fmt::Write as _;

use anyhow::bail;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::ceiling::Ceiling;
use crate::doc::{
    Align, Table, count, count_range, fixed, measured, median, percent, range, times_by_run,
};
use crate::proc::Layout;
use crate::scenario::{
    Algorithm, Bench, ClosedLoopOptions, Phase, Scenario, ScenarioName, UNREACHABLE_LIMIT,
    conditions_of, distinct, micros_per, policy, rotation, run_ratios, runs_of, say, uniform_shape,
};
use crate::stand::{Backend, Stand};

/// The options of `redis-bound`.
#[derive(Debug, Clone, clap::Args)]
pub struct RedisBoundOptions {
    /// Algorithms to measure, comma-separated.
    #[arg(long = "algorithms", value_enum, value_delimiter = ',', default_values_t = [Algorithm::Counter, Algorithm::Log])]
    pub algorithms: Vec<Algorithm>,

    /// The share of one CPU redis-server may use (stopped and resumed in 5 ms cycles): low
    /// enough that the clients have cores to spare at the rate Redis then serves.
    #[arg(long, default_value_t = 0.1)]
    pub redis_share: f64,

    /// tollgate's closed loop; redis-benchmark keeps as many calls in flight, one per
    /// connection, on as many keys.
    #[command(flatten)]
    pub load: ClosedLoopOptions,
}

/// The `redis-bound` scenario.
pub struct RedisBound {
    options: RedisBoundOptions,
}

impl RedisBound {
    /// The scenario with `options`.
    pub fn new(options: RedisBoundOptions) -> RedisBound {
        RedisBound { options }
    }
}

/// Who sends the script calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Client {
    /// redis-benchmark sending `EVALSHA`, one call in flight per connection.
    RedisBenchmark,
    /// tollgate deciding gRPC requests of one descriptor each.
    Tollgate,
}

impl Client {
    fn label(self) -> &'static str {
        match self {
            Client::RedisBenchmark => "redis-benchmark, EVALSHA",
            Client::Tollgate => "tollgate, one limit a request",
        }
    }
}

/// One measured run of one algorithm and client.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RedisBoundRun {
    /// Whose script.
    pub algorithm: Algorithm,
    /// Who sent the calls.
    pub client: Client,
    /// Run number, from 1.
    pub run: u32,
    /// Calls in flight.
    pub concurrency: u32,
    /// The share of a CPU redis-server was held to.
    pub redis_share: f64,
    /// Distinct values of the descriptor.
    pub keys: u64,
    /// Decisions (tollgate) or calls (redis-benchmark) the client made.
    pub calls: u64,
    /// Script calls Redis served during the run (`INFO commandstats`).
    pub script_calls: u64,
    /// Decisions (tollgate) or calls (redis-benchmark) per second.
    pub rate: f64,
    /// Median latency, ms.
    pub p50_ms: f64,
    /// 99th percentile latency, ms.
    pub p99_ms: f64,
    /// CPU seconds redis-server used during the run.
    pub redis_cpu_seconds: f64,
}

/// The descriptor entry key of `algorithm`'s limit (and of the keys redis-benchmark imitates).
fn entry_key(algorithm: Algorithm) -> String {
    format!("{}_bound", algorithm.name())
}

impl Scenario for RedisBound {
    fn name(&self) -> ScenarioName {
        ScenarioName::RedisBound
    }

    fn run(&self, bench: &mut Bench) -> anyhow::Result<()> {
        let options = &self.options;
        if options.algorithms.is_empty() {
            bail!("redis-bound needs at least one algorithm");
        }
        if !(options.redis_share > 0.0 && options.redis_share < 1.0) {
            bail!(
                "--redis-share must be above 0 and below 1, not {}",
                options.redis_share
            );
        }
        let limits: Vec<(String, Algorithm, u64, u16)> = options
            .algorithms
            .iter()
            .map(|&algorithm| (entry_key(algorithm), algorithm, UNREACHABLE_LIMIT, 1))
            .collect();
        bench.servers.ensure(Backend::Redis);
        // Calls wait for Redis's next running slice, so the production deadline would turn the
        // queue this scenario builds on purpose into failures; what it measures is throughput.
        let extra = ["--backend-timeout".to_owned(), "2s".to_owned()];
        // Redis's share is of wall-clock time: on a core it shared with tollgate and the
        // generator, the replies of each slice would wake them all inside Redis's next slice and
        // take its CPU, and the comparison would again be of the clients' CPU, not Redis's.
        let stand = Stand::start_laid_out(
            &bench.servers,
            Backend::Redis,
            &policy(&limits),
            "deny",
            &extra,
            Layout::RedisApart,
        )?;
        let connections = bench
            .loader
            .connect(&[stand.grpc_addr()], options.load.connections)?;
        let nodes = &stand.nodes;
        nodes.flush();
        let _slow = nodes.throttle(options.redis_share);

        // Per algorithm: the ceiling's script loaded and its run sized, then a warmup of both.
        let mut points = Vec::new();
        for &algorithm in &options.algorithms {
            let ceiling = Ceiling {
                backend: Backend::Redis,
                algorithm,
                entry_key: entry_key(algorithm),
                concurrency: options.load.concurrency,
                keys: options.load.keys,
            };
            let sha = ceiling.load_script(nodes)?;
            let calibration = if bench.scale.quick { 200 } else { 5_000 };
            let requests = ceiling.calibrate(nodes, &sha, calibration, bench.scale.duration)?;
            points.push((
                algorithm,
                Client::RedisBenchmark,
                Some((ceiling, sha, requests)),
            ));
            points.push((algorithm, Client::Tollgate, None));
        }
        let phase = |algorithm: Algorithm, duration| Phase {
            shape: uniform_shape(vec![entry_key(algorithm)], options.load.keys),
            concurrency: options.load.concurrency,
            rate: None,
            duration,
        };
        for &algorithm in &options.algorithms {
            bench
                .loader
                .drive(&connections, &phase(algorithm, bench.scale.warmup))?;
        }

        for run in 1..=bench.scale.runs {
            for at in rotation(run, points.len()) {
                let (algorithm, client, ceiling) = &points[at];
                nodes.reset_stats();
                let redis_before = stand.redis_cpu_seconds()?;
                let (calls, rate, p50_ms, p99_ms) = match ceiling {
                    Some((ceiling, sha, requests)) => {
                        let result = ceiling.run(nodes, sha, *requests)?;
                        (
                            result.requests,
                            result.calls_per_second,
                            result.p50_ms,
                            result.p99_ms,
                        )
                    }
                    None => {
                        let load = bench
                            .loader
                            .drive(&connections, &phase(*algorithm, bench.scale.duration))?;
                        if load.decisions == 0 || load.over_limit > 0 || load.errors > 0 {
                            bail!(
                                "tollgate failed under a throttled Redis: {} decisions, {} \
                                 refused, errors {:?}\n{}",
                                load.decisions,
                                load.over_limit,
                                load.errors_by_code,
                                stand.tollgate.log()
                            );
                        }
                        (
                            load.decisions,
                            load.decisions_per_second,
                            load.latency_us.p50 / 1_000.0,
                            load.latency_us.p99 / 1_000.0,
                        )
                    }
                };
                let redis_cpu_seconds = stand.redis_cpu_seconds()? - redis_before;
                let script_calls = nodes.script_calls()?.values().sum();
                say(&format!(
                    "  redis-bound {} {} run {run}: {}/s, Redis {} µs per call",
                    algorithm.name(),
                    client.label(),
                    count(Some(rate)),
                    fixed(micros_per(redis_cpu_seconds, script_calls), 1),
                ));
                bench.records.record(
                    "run",
                    &RedisBoundRun {
                        algorithm: *algorithm,
                        client: *client,
                        run,
                        concurrency: options.load.concurrency,
                        redis_share: options.redis_share,
                        keys: options.load.keys,
                        calls,
                        script_calls,
                        rate,
                        p50_ms,
                        p99_ms,
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

/// The goal: tollgate's decisions per second at least this share of redis-benchmark's calls.
const GOAL: f64 = 0.7;

/// The redis-bound section of the report.
pub fn render(records: &[Value]) -> anyhow::Result<String> {
    let conditions = conditions_of(records)?;
    let runs: Vec<RedisBoundRun> = runs_of(records, "redis-bound")?;
    let first = &runs[0];
    let mut out = String::new();
    let _ = writeln!(out, "### When Redis is what runs out\n");
    let _ = writeln!(
        out,
        "{} One redis-server on a CPU of its own, held to {} of it (stopped and resumed in 5 ms \
         cycles), with the clients on the other CPUs, so that both clients have time to spare \
         and Redis sets the rate. The same script on keys of the same shape ({} values drawn \
         uniformly, under a limit no load reaches), {} calls in flight: redis-benchmark with one \
         connection per call, tollgate with its one multiplexed connection, one descriptor a \
         request and a worker per CPU it runs on; each run measures every row one after the \
         other, rotating which goes first. A tollgate call is one decision. Redis \
         CPU: redis-server's process time (from its `INFO cpu`) over the script calls it served \
         (from `INFO commandstats`).\n",
        measured(&conditions),
        percent(Some(first.redis_share)),
        count(Some(first.keys as f64)),
        first.concurrency,
    );
    let mut table = Table::new(&[
        ("algorithm", Align::Left),
        ("client", Align::Left),
        ("calls/s", Align::Right),
        ("min–max", Align::Right),
        ("p50 ms", Align::Right),
        ("p99 ms", Align::Right),
        ("script calls per call", Align::Right),
        ("Redis CPU µs/call", Align::Right),
    ]);
    let point = |r: &RedisBoundRun| (r.algorithm, r.client);
    for (algorithm, client) in distinct(runs.iter().map(point)) {
        let of: Vec<&RedisBoundRun> = runs
            .iter()
            .filter(|r| point(r) == (algorithm, client))
            .collect();
        table.row(vec![
            algorithm.name().to_owned(),
            client.label().to_owned(),
            count(median(of.iter().map(|r| r.rate))),
            count_range(range(of.iter().map(|r| r.rate))),
            fixed(median(of.iter().map(|r| r.p50_ms)), 2),
            fixed(median(of.iter().map(|r| r.p99_ms)), 2),
            fixed(
                median(
                    of.iter()
                        .filter(|r| r.calls > 0)
                        .map(|r| r.script_calls as f64 / r.calls as f64),
                ),
                2,
            ),
            fixed(
                median(
                    of.iter()
                        .filter_map(|r| micros_per(r.redis_cpu_seconds, r.script_calls)),
                ),
                1,
            ),
        ]);
    }
    out.push_str(&table.render());
    for algorithm in distinct(runs.iter().map(|r| r.algorithm)) {
        let of: Vec<&RedisBoundRun> = runs.iter().filter(|r| r.algorithm == algorithm).collect();
        let by_run = run_ratios(
            &of,
            |r| r.run,
            |r| r.client == Client::Tollgate,
            |r| r.client == Client::RedisBenchmark,
            |r| r.rate,
        );
        let met = median(by_run.iter().copied()).is_some_and(|ratio| ratio >= GOAL);
        let _ = write!(
            out,
            "\n{}: tollgate's decisions/s over redis-benchmark's calls/s, the median of the runs' \
             ratios: {} (the goal, at least {}: {}).\n",
            algorithm.name(),
            times_by_run(&by_run),
            percent(Some(GOAL)),
            if met { "met" } else { "not met" },
        );
    }
    Ok(out)
}
