//! `redis-cpu`: what one decision costs Redis, per algorithm × backend × shards and traffic mix,
//! beside three floors measured on the same server in the same run.
//!
//! Redis CPU is read from `INFO commandstats` (reset before each run): the microseconds Redis
//! spent in `evalsha` and `eval`, which include every command a script runs inside, over the
//! calls and over the decisions tollgate made. Two traffic mixes per point: *admitted* (10,000
//! keys under a limit no load reaches) and *refused* (one key whose limit the warmup spends, so
//! nearly every measured hit is refused); the admitted share of each run is measured, not
//! assumed.
//!
//! The floors, on the single server with redis-benchmark (one call in flight per connection):
//! a minimal script (`TIME`, `HINCRBY`, `PEXPIRE`: the least a script that counts in a window
//! and keeps a TTL does), the commands an admitted hit of the log runs with no decision between
//! them, and the commands envoyproxy/ratelimit sends per decision (`INCRBY` and `EXPIRE`, no
//! script), whose microseconds per decision are the sum of the two.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::process::Command;

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tollgate_testkit::redis::RedisServer;

use crate::doc::{Align, Table, count, fixed, measured, median, percent};
use crate::load::summary::Summary;
use crate::scenario::{
    Algorithm, Bench, Phase, Scenario, ScenarioName, UNREACHABLE_LIMIT, conditions_of, distinct,
    micros_per, policy, records_of, runs_of, say, uniform_shape,
};
use crate::stand::{Backend, CommandStat, Nodes, Stand, command_stats};

/// The minimal script of the floor: count one unit in a window's field and keep a TTL.
pub const MINIMAL_SCRIPT: &str = "local now = redis.call('TIME') \
     redis.call('HINCRBY', KEYS[1], math.floor(tonumber(now[1]) / 60), 1) \
     redis.call('PEXPIRE', KEYS[1], 120000) return 1";

/// The commands an admitted hit of the sliding window log runs (`TIME`, `ZRANGEBYSCORE`,
/// `HMGET`, `ZADD`, `HSET`, two `PEXPIRE`) with no decision between them: the least the log's
/// data layout (a sorted set of entries beside a hash of its sum and last id) costs per hit. The
/// hash's key is derived from the log's, because redis-benchmark draws every `__rand_int__` of a
/// command on its own. Every number is printed as an integer, as the log prints them: Lua's own
/// conversion keeps 14 digits, so the ids of one log (16 digits) would print alike and each
/// `ZADD` would only move one member, leaving the sets far smaller than the log's; and a number
/// handed to Redis as such is formatted as a double, which costs Redis more than the command.
pub const LOG_COMMANDS_SCRIPT: &str = "local log = KEYS[1] local meta = log .. ':m' \
     local t = redis.call('TIME') \
     local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) \
     redis.call('ZRANGEBYSCORE', log, '-inf', string.format('%d', now - 60000)) \
     local state = redis.call('HMGET', meta, 'sum', 'seq') \
     local id = (tonumber(state[2]) or now * 1000) + 1 \
     redis.call('ZADD', log, string.format('%d', now), string.format('%d:1', id)) \
     redis.call('HSET', meta, 'sum', string.format('%d', (tonumber(state[1]) or 0) + 1), \
       'seq', string.format('%d', id)) \
     redis.call('PEXPIRE', meta, '65000') redis.call('PEXPIRE', log, '65000') return 1";

/// The options of `redis-cpu`.
#[derive(Debug, Clone, clap::Args)]
pub struct RedisCpuOptions {
    /// Backends to measure, comma-separated.
    #[arg(long = "backends", value_enum, value_delimiter = ',', default_values_t = [Backend::Redis, Backend::RedisCluster])]
    pub backends: Vec<Backend>,

    /// Shard counts, comma-separated.
    #[arg(long = "shards", value_delimiter = ',', default_values_t = [1u16])]
    pub shards: Vec<u16>,

    /// Descriptors per request of the admitted traffic, comma-separated (each a limit of its own;
    /// the refused traffic always sends one).
    #[arg(long = "descriptors", value_delimiter = ',', default_values_t = [1u32, 3], value_parser = clap::value_parser!(u32).range(1..=16))]
    pub descriptors: Vec<u32>,

    /// Calls in flight (tollgate's generator and redis-benchmark alike).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub concurrency: u32,

    /// HTTP/2 connections of the load generator.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub connections: u32,
}

/// The `redis-cpu` scenario.
pub struct RedisCpu {
    options: RedisCpuOptions,
}

impl RedisCpu {
    /// The scenario with `options`.
    pub fn new(options: RedisCpuOptions) -> RedisCpu {
        RedisCpu { options }
    }
}

/// What one point of the scenario measures.
#[derive(Debug, Clone, Copy)]
struct Point {
    backend: Backend,
    algorithm: Algorithm,
    shards: u16,
    mix: Mix,
    descriptors: u32,
}

impl RedisCpu {
    /// Measures `point`: tollgate serving one limit per descriptor key, driven closed loop, with
    /// Redis's statistics reset before each measured run.
    fn measure(&self, bench: &mut Bench, point: Point) -> anyhow::Result<()> {
        let options = &self.options;
        let Point {
            backend,
            algorithm,
            shards,
            mix,
            descriptors,
        } = point;
        let (limit, keys) = match mix {
            Mix::Admitted => (UNREACHABLE_LIMIT, 10_000),
            // Enough for every shard to hold some, little enough for the warmup to spend.
            Mix::Refused => (u64::from(shards) * 10, 1),
        };
        let entry_keys: Vec<String> = (0..descriptors).map(|i| format!("user{i}")).collect();
        let limits: Vec<(String, Algorithm, u64, u16)> = entry_keys
            .iter()
            .map(|key| (key.clone(), algorithm, limit, shards))
            .collect();
        // What a script call costs is measured with the local over-limit cache off: on (the
        // default), it answers the refused mix without any call (the attack scenario measures
        // that).
        let cache_off = ["--local-cache-bytes".to_owned(), "0".to_owned()];
        let stand = Stand::start_with(
            &bench.servers,
            backend,
            &policy(&limits),
            "deny",
            &cache_off,
        )?;
        stand.nodes.flush();
        let connections = bench
            .loader
            .connect(&[stand.grpc_addr()], options.connections)?;
        let shape = uniform_shape(entry_keys, keys);
        let phase = |duration| Phase {
            shape: shape.clone(),
            concurrency: options.concurrency,
            rate: None,
            duration,
        };
        for run in 1..=bench.scale.runs {
            bench
                .loader
                .drive(&connections, &phase(bench.scale.warmup))?;
            stand.nodes.reset_stats();
            let cpu_before = stand.redis_cpu_seconds()?;
            let load = bench
                .loader
                .drive(&connections, &phase(bench.scale.duration))?;
            let redis_cpu_seconds = stand.redis_cpu_seconds()? - cpu_before;
            let totals = script_totals(&stand.nodes)?;
            let result = RedisCpuRun {
                backend,
                algorithm,
                shards,
                mix,
                descriptors,
                run,
                load,
                script_calls: totals.calls,
                script_usec: totals.usec,
                redis_cpu_seconds,
            };
            say(&format!(
                "  redis-cpu {backend} {} shards {shards} {} descriptors {descriptors} run {run}: \
                 {} admitted, {} calls per decision, {} µs per call, {} µs per decision, {} µs of \
                 Redis process CPU per limit",
                algorithm.name(),
                mix.name(),
                percent(result.admitted_share()),
                fixed(result.calls_per_decision(), 2),
                fixed(result.usec_per_call(), 2),
                fixed(result.usec_per_decision(), 2),
                fixed(result.process_usec_per_limit(), 2),
            ));
            bench.records.record("run", &result)?;
        }
        Ok(())
    }
}

/// The traffic of a point.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mix {
    /// Every hit admitted.
    Admitted,
    /// One key over its limit: nearly every hit refused.
    Refused,
}

impl Mix {
    fn name(self) -> &'static str {
        match self {
            Mix::Admitted => "admitted",
            Mix::Refused => "refused",
        }
    }
}

/// One measured run of tollgate.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RedisCpuRun {
    /// Where the counters live.
    pub backend: Backend,
    /// The algorithm.
    pub algorithm: Algorithm,
    /// Shards of the limit.
    pub shards: u16,
    /// The traffic.
    pub mix: Mix,
    /// Descriptors per request, each a limit of its own.
    pub descriptors: u32,
    /// Run number, from 1.
    pub run: u32,
    /// What the load generator saw.
    pub load: Summary,
    /// Script calls (`evalsha` + `eval`) over every master.
    pub script_calls: u64,
    /// Microseconds of Redis CPU in those calls.
    pub script_usec: u64,
    /// CPU seconds of every Redis process over the run, from their `INFO cpu`: the scripts and
    /// the work around each command (reading, parsing, answering).
    pub redis_cpu_seconds: f64,
}

impl RedisCpuRun {
    fn admitted_share(&self) -> Option<f64> {
        let decided = self.load.ok + self.load.over_limit;
        (decided > 0).then(|| self.load.ok as f64 / decided as f64)
    }

    fn usec_per_call(&self) -> Option<f64> {
        (self.script_calls > 0).then(|| self.script_usec as f64 / self.script_calls as f64)
    }

    fn calls_per_decision(&self) -> Option<f64> {
        (self.load.decisions > 0).then(|| self.script_calls as f64 / self.load.decisions as f64)
    }

    fn usec_per_decision(&self) -> Option<f64> {
        (self.load.decisions > 0).then(|| self.script_usec as f64 / self.load.decisions as f64)
    }

    /// Redis processes' CPU per limit decided (one per descriptor of each decision).
    fn process_usec_per_limit(&self) -> Option<f64> {
        micros_per(
            self.redis_cpu_seconds,
            self.load.decisions * u64::from(self.descriptors),
        )
    }
}

/// One measured floor.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Floor {
    /// What was sent.
    pub name: String,
    /// Run number, from 1.
    pub run: u32,
    /// Microseconds of Redis CPU per decision it stands for.
    pub usec_per_decision: f64,
}

/// Sums `evalsha` and `eval` of every master.
fn script_totals(nodes: &Nodes<'_>) -> anyhow::Result<CommandStat> {
    let mut total = CommandStat::default();
    for master in nodes.masters() {
        let stats = command_stats(master)?;
        for name in ["evalsha", "eval"] {
            if let Some(stat) = stats.get(name) {
                total.calls += stat.calls;
                total.usec += stat.usec;
            }
        }
    }
    Ok(total)
}

/// Runs redis-benchmark with `command` `requests` times (values of `__rand_int__` below 10,000)
/// against the single server, one call in flight on each of `concurrency` connections, and
/// answers its `INFO commandstats`, reset before the run.
pub fn benchmark(
    nodes: &Nodes<'_>,
    concurrency: u32,
    requests: u64,
    command: &[&str],
) -> anyhow::Result<BTreeMap<String, CommandStat>> {
    let server = nodes.masters().first().context("no Redis server")?;
    server.reset_stats();
    let output = Command::new(redis_benchmark_bin()?)
        .args(["-h", "127.0.0.1", "-p", &server.port().to_string()])
        .args(["-c", &concurrency.to_string()])
        .args(["-n", &requests.to_string()])
        .args(["-r", "10000", "-q"])
        .args(command)
        .output()
        .context("cannot run redis-benchmark")?;
    if !output.status.success() {
        bail!(
            "redis-benchmark {command:?} failed ({}): {}{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    command_stats(server)
}

/// Loads `script` on `server` and answers its SHA1, or an error naming `what` when Redis
/// refuses it.
pub fn load_script(server: &RedisServer, script: &str, what: &str) -> anyhow::Result<String> {
    let sha = server.cli(&["SCRIPT", "LOAD", script]);
    if sha.len() != 40 {
        bail!("SCRIPT LOAD of {what} answered `{sha}`");
    }
    Ok(sha)
}

fn usec_per_call(stats: &BTreeMap<String, CommandStat>, name: &str) -> anyhow::Result<f64> {
    let stat = stats
        .get(name)
        .filter(|stat| stat.calls > 0)
        .with_context(|| format!("redis-benchmark ran no `{name}`"))?;
    Ok(stat.usec as f64 / stat.calls as f64)
}

/// The floors, measured `runs` times each with `requests` calls a run.
fn floors(
    nodes: &Nodes<'_>,
    concurrency: u32,
    runs: u32,
    requests: u64,
) -> anyhow::Result<Vec<Floor>> {
    let server = nodes.masters().first().context("no Redis server")?;
    let load = |script: &str, what: &str| load_script(server, script, what);
    let scripts = [
        (
            "minimal script (TIME, HINCRBY, PEXPIRE)",
            load(MINIMAL_SCRIPT, "the minimal script")?,
            "floor:{__rand_int__}",
        ),
        (
            "the log's commands, no decision",
            load(LOG_COMMANDS_SCRIPT, "the log's commands")?,
            "floor:log:{__rand_int__}",
        ),
    ];
    let mut out = Vec::new();
    for run in 1..=runs {
        for (name, sha, key) in &scripts {
            // Each run on keys of its own, as each variant of *How the script is called* is:
            // the log's commands cost more the more entries its sets hold, and a set that kept
            // the last run's entries would make this floor read high beside the log's script.
            let key = format!("run{run}:{key}");
            let stats = benchmark(nodes, concurrency, requests, &["EVALSHA", sha, "1", &key])?;
            out.push(Floor {
                name: (*name).to_owned(),
                run,
                usec_per_decision: usec_per_call(&stats, "evalsha")?,
            });
        }
        let incr = benchmark(
            nodes,
            concurrency,
            requests,
            &["INCRBY", "ref:__rand_int__", "1"],
        )?;
        let expire = benchmark(
            nodes,
            concurrency,
            requests,
            &["EXPIRE", "ref:__rand_int__", "60"],
        )?;
        out.push(Floor {
            name: "envoyproxy/ratelimit's INCRBY + EXPIRE".to_owned(),
            run,
            usec_per_decision: usec_per_call(&incr, "incrby")? + usec_per_call(&expire, "expire")?,
        });
    }
    Ok(out)
}

impl Scenario for RedisCpu {
    fn name(&self) -> ScenarioName {
        ScenarioName::RedisCpu
    }

    fn run(&self, bench: &mut Bench) -> anyhow::Result<()> {
        let options = &self.options;
        for &backend in &options.backends {
            if backend == Backend::Memory {
                bail!("redis-cpu measures Redis: the memory backend has none");
            }
            bench.servers.ensure(backend);
        }
        if !options.backends.contains(&Backend::Redis) {
            bench.servers.ensure(Backend::Redis);
        }
        {
            let nodes = bench.servers.nodes(Backend::Redis)?;
            let requests = if bench.scale.quick { 2_000 } else { 200_000 };
            for floor in floors(&nodes, options.concurrency, bench.scale.runs, requests)? {
                say(&format!(
                    "  redis-cpu floor {} run {}: {} µs per decision",
                    floor.name,
                    floor.run,
                    fixed(Some(floor.usec_per_decision), 2)
                ));
                bench.records.record("floor", &floor)?;
            }
        }
        for &backend in &options.backends {
            for algorithm in [Algorithm::Counter, Algorithm::Log] {
                for &shards in &options.shards {
                    for mix in [Mix::Admitted, Mix::Refused] {
                        let descriptors = match mix {
                            Mix::Admitted => options.descriptors.clone(),
                            Mix::Refused => vec![1],
                        };
                        for descriptors in descriptors {
                            let point = Point {
                                backend,
                                algorithm,
                                shards,
                                mix,
                                descriptors,
                            };
                            self.measure(bench, point)?;
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

/// The redis-cpu section of the report.
pub fn render(records: &[Value]) -> anyhow::Result<String> {
    let conditions = conditions_of(records)?;
    let runs: Vec<RedisCpuRun> = runs_of(records, "redis-cpu")?;
    let floors: Vec<Floor> = records_of(records, "floor")?;
    let mut out = String::new();
    let _ = writeln!(out, "### Redis CPU per decision\n");
    let _ = writeln!(
        out,
        "{} Redis CPU from `INFO commandstats`, reset before each run: the microseconds spent in \
         `evalsha` and `eval` (a script's own commands included) over every master, per script \
         call and per decision; *Redis process*: the CPU of every Redis process from its `INFO \
         cpu`, which adds the work around each command (reading, parsing, answering), per limit decided (one \
         per descriptor). *Admitted*: 10,000 keys per descriptor under a limit no load reaches, \
         one descriptor a request or several (each a limit of its own and a script call of its own; on one \
         server a request's calls go in one pipeline); *refused*: one \
         descriptor, one key whose limit (10 a minute per shard) the warmup spends. tollgate \
         runs with its local over-limit cache off (`--local-cache-bytes 0`), so that every \
         refused hit is a script call. *Floors*, on the single server in the same run with redis-benchmark: a minimal script \
         (`TIME`, `HINCRBY`, `PEXPIRE`), the commands an admitted hit of the log runs with no \
         decision between them, and envoyproxy/ratelimit's `INCRBY` + `EXPIRE` per decision.\n",
        measured(&conditions),
    );
    let mut table = Table::new(&[
        ("floor", Align::Left),
        ("Redis µs per decision", Align::Right),
    ]);
    let mut names: Vec<&str> = Vec::new();
    for floor in &floors {
        if !names.contains(&floor.name.as_str()) {
            names.push(&floor.name);
        }
    }
    for name in names {
        table.row(vec![
            name.to_owned(),
            fixed(
                median(
                    floors
                        .iter()
                        .filter(|f| f.name == name)
                        .map(|f| f.usec_per_decision),
                ),
                2,
            ),
        ]);
    }
    out.push_str(&table.render());
    out.push('\n');
    let mut table = Table::new(&[
        ("backend", Align::Left),
        ("algorithm", Align::Left),
        ("shards", Align::Right),
        ("traffic", Align::Left),
        ("descriptors", Align::Right),
        ("admitted", Align::Right),
        ("decisions/s", Align::Right),
        ("script calls per decision", Align::Right),
        ("Redis µs per call", Align::Right),
        ("Redis µs per decision", Align::Right),
        ("Redis process µs per limit", Align::Right),
    ]);
    let point = |r: &RedisCpuRun| (r.backend, r.algorithm, r.shards, r.mix, r.descriptors);
    for at in distinct(runs.iter().map(point)) {
        let of: Vec<&RedisCpuRun> = runs.iter().filter(|r| point(r) == at).collect();
        let (backend, algorithm, shards, mix, descriptors) = at;
        table.row(vec![
            backend.to_string(),
            algorithm.name().to_owned(),
            shards.to_string(),
            mix.name().to_owned(),
            descriptors.to_string(),
            percent(median(of.iter().filter_map(|r| r.admitted_share()))),
            count(median(of.iter().map(|r| r.load.decisions_per_second))),
            fixed(median(of.iter().filter_map(|r| r.calls_per_decision())), 2),
            fixed(median(of.iter().filter_map(|r| r.usec_per_call())), 2),
            fixed(median(of.iter().filter_map(|r| r.usec_per_decision())), 2),
            fixed(
                median(of.iter().filter_map(|r| r.process_usec_per_limit())),
                2,
            ),
        ]);
    }
    out.push_str(&table.render());
    Ok(out)
}
/// The `redis-benchmark` binary: `$TOLLGATE_REDIS_BENCHMARK`, else the one on the `PATH`.
pub fn redis_benchmark_bin() -> anyhow::Result<std::path::PathBuf> {
    crate::proc::find_tool(
        "TOLLGATE_REDIS_BENCHMARK",
        "redis-benchmark",
        "it comes with the Debian package redis-tools (apt-get install redis-tools)",
    )
}
