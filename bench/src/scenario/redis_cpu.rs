//! `redis-cpu`: what one decision costs Redis, per algorithm × backend × shards and traffic mix,
//! beside three floors measured on the same server in the same run.
//!
//! Redis CPU is read from `INFO commandstats` (reset before each run): the microseconds Redis
//! spent in `evalsha` and `eval`, which include every command a script runs inside, over the
//! calls and over the decisions tollgate made. Two traffic mixes per point: *admitted* (10,000
//! keys under a limit no load reaches) and *refused* (one key whose limit the warmup spends, so
//! nearly every measured hit is refused); the admitted share of each run is measured, not
//! assumed. With one descriptor a request, each mix also runs with several limits on the
//! descriptor (`rate_limits:`, one window each: 60 s, then 120 s, 180 s, …; in the refused
//! mix only the first can refuse), which Redis decides in one script call; beside them, on the
//! single server, `MEMORY USAGE` of the keys one descriptor value holds after its first hit.
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
    Algorithm, Bench, DOMAIN, Phase, Scenario, ScenarioName, UNREACHABLE_LIMIT, conditions_of,
    distinct, micros_per, policy, records_of, runs_of, say, uniform_shape,
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

    /// Limits on the descriptor when a request carries one, comma-separated (more than one:
    /// `rate_limits:`, decided in one script call; several descriptors always have one each).
    #[arg(long = "limits", value_delimiter = ',', default_values_t = [1u32, 2], value_parser = clap::value_parser!(u32).range(1..=WINDOWS.len() as i64))]
    pub limits: Vec<u32>,

    /// Calls in flight (tollgate's generator and redis-benchmark alike).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub concurrency: u32,

    /// HTTP/2 connections of the load generator.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub connections: u32,
}

/// The window of each limit of a `rate_limits:` list, in order (the first is the minute of a
/// single limit): distinct, so that no two limits of a descriptor count alike, and short, so
/// that the counter's integers stay below 2^53 at the unreachable limit and every limit takes
/// the script's plain path, as a lone limit does (an hour at 4e9 a window would take the exact
/// wide-integer path and measure that instead of the extra limit).
const WINDOWS: [&str; 6] = ["60s", "120s", "180s", "240s", "300s", "360s"];

/// The policy of a point: a descriptor per entry key of `entry_keys`, each with one limit per
/// value of `requests` (its `requests_per_unit`), of `algorithm` and `shards`. One limit is
/// written as `rate_limit:`, as [`policy`] writes it; several as `rate_limits:`, the n-th over
/// the n-th of [`WINDOWS`].
fn point_policy(
    entry_keys: &[String],
    algorithm: Algorithm,
    shards: u16,
    requests: &[u64],
) -> String {
    if let [limit] = requests {
        let limits: Vec<(String, Algorithm, u64, u16)> = entry_keys
            .iter()
            .map(|key| (key.clone(), algorithm, *limit, shards))
            .collect();
        return policy(&limits);
    }
    let mut yaml = format!("domain: {DOMAIN}\ndescriptors:\n");
    for key in entry_keys {
        let _ = writeln!(yaml, "  - key: {key}\n    rate_limits:");
        for (window, limit) in WINDOWS.iter().zip(requests) {
            let _ = writeln!(
                yaml,
                "      - {{window: {window}, requests_per_unit: {limit}, algorithm: {}, shards: {shards}}}",
                algorithm.policy_name()
            );
        }
    }
    yaml
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
    limits: u32,
}

impl RedisCpu {
    /// Measures `point`: tollgate serving `limits` limits per descriptor key, driven closed
    /// loop, with Redis's statistics reset before each measured run; then, on the single server
    /// with one descriptor in the admitted mix, the bytes one descriptor value holds.
    fn measure(&self, bench: &mut Bench, point: Point) -> anyhow::Result<()> {
        let options = &self.options;
        let Point {
            backend,
            algorithm,
            shards,
            mix,
            descriptors,
            limits,
        } = point;
        let (limit, keys) = match mix {
            Mix::Admitted => (UNREACHABLE_LIMIT, 10_000),
            // Enough for every shard to hold some, little enough for the warmup to spend.
            Mix::Refused => (u64::from(shards) * 10, 1),
        };
        // The first limit is the mix's; the others of a list never refuse.
        let requests: Vec<u64> = (0..limits)
            .map(|i| if i == 0 { limit } else { UNREACHABLE_LIMIT })
            .collect();
        let entry_keys: Vec<String> = (0..descriptors).map(|i| format!("user{i}")).collect();
        // What a script call costs is measured with the local over-limit cache off: on (the
        // default), it answers the refused mix without any call (the attack scenario measures
        // that).
        let cache_off = ["--local-cache-bytes".to_owned(), "0".to_owned()];
        let stand = Stand::start_with(
            &bench.servers,
            backend,
            &point_policy(&entry_keys, algorithm, shards, &requests),
            "deny",
            &cache_off,
        )?;
        stand.nodes.flush();
        let connections = bench
            .loader
            .connect(&[stand.grpc_addr()], options.connections)?;
        let shape = uniform_shape(entry_keys.clone(), keys);
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
                limits,
                run,
                load,
                script_calls: totals.calls,
                script_usec: totals.usec,
                redis_cpu_seconds,
            };
            say(&format!(
                "  redis-cpu {backend} {} shards {shards} {} descriptors {descriptors} limits \
                 {limits} run {run}: \
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
        if backend == Backend::Redis && mix == Mix::Admitted && descriptors == 1 {
            // One hit on a fresh store: what one descriptor value holds in Redis.
            stand.nodes.flush();
            let one = uniform_shape(entry_keys, 1);
            let load = bench.loader.drive_count(&connections, &one, 1, None, 1)?;
            if load.ok != 1 {
                bail!("the hit measured for its bytes was not admitted: {load:?}");
            }
            let server = stand.nodes.masters().first().context("no Redis server")?;
            let held = server.keys("*");
            let mut bytes = 0;
            for key in &held {
                let usage = server.cli(&["MEMORY", "USAGE", key, "SAMPLES", "0"]);
                bytes += usage
                    .trim()
                    .parse::<u64>()
                    .with_context(|| format!("MEMORY USAGE {key}: {usage}"))?;
            }
            let record = KeyBytes {
                algorithm,
                limits,
                keys: held.len() as u64,
                bytes,
            };
            say(&format!(
                "  redis-cpu bytes {} limits {limits}: {bytes} B in {} keys",
                algorithm.name(),
                record.keys
            ));
            bench.records.record("key-bytes", &record)?;
        }
        Ok(())
    }
}

/// What one descriptor value holds in Redis (the single server) after its first hit.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct KeyBytes {
    /// The algorithm of every limit.
    pub algorithm: Algorithm,
    /// Limits on the descriptor.
    pub limits: u32,
    /// Keys the value holds.
    pub keys: u64,
    /// Their `MEMORY USAGE` (`SAMPLES 0`), summed.
    pub bytes: u64,
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
    /// Descriptors per request.
    pub descriptors: u32,
    /// Limits on each descriptor (records older than the field had one).
    #[serde(default = "one_limit")]
    pub limits: u32,
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

fn one_limit() -> u32 {
    1
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

    /// Redis processes' CPU per limit decided (each limit of each descriptor of a decision).
    fn process_usec_per_limit(&self) -> Option<f64> {
        micros_per(
            self.redis_cpu_seconds,
            self.load.decisions * u64::from(self.descriptors) * u64::from(self.limits),
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
                            let limits = if descriptors == 1 {
                                options.limits.clone()
                            } else {
                                vec![1]
                            };
                            for limits in limits {
                                let point = Point {
                                    backend,
                                    algorithm,
                                    shards,
                                    mix,
                                    descriptors,
                                    limits,
                                };
                                self.measure(bench, point)?;
                            }
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
    let key_bytes: Vec<KeyBytes> = records_of(records, "key-bytes")?;
    let mut out = String::new();
    let _ = writeln!(out, "### Redis CPU per decision\n");
    let floor_cells: Vec<String> = distinct(floors.iter().map(|f| f.name.as_str()))
        .into_iter()
        .map(|name| {
            let usec = median(
                floors
                    .iter()
                    .filter(|f| f.name == name)
                    .map(|f| f.usec_per_decision),
            );
            format!("{name} {}", fixed(usec, 2))
        })
        .collect();
    let _ = writeln!(
        out,
        "{} Redis CPU from `INFO commandstats`, reset before each run: the microseconds spent in \
         `evalsha` and `eval` (a script's own commands included) over every master, per script \
         call and per decision; *Redis process*: the CPU of every Redis process from its `INFO \
         cpu`, which adds the work around each command (reading, parsing, answering), per limit \
         decided (each limit of each descriptor). *Admitted*: 10,000 keys per descriptor under \
         a limit no load reaches, one descriptor a request or several (each a limit of its own \
         and a script call of its own; on one server a request's calls go in one pipeline); \
         *refused*: one descriptor, one key whose limit (10 a minute per shard) the warmup \
         spends. *Limits*: on the one descriptor, a `rate_limits:` list (one script call; \
         windows 60 s, 120 s, 180 s), the first limit the mix's, the others out of reach. \
         tollgate runs with its local over-limit cache off (`--local-cache-bytes 0`), so that \
         every refused hit is a script call. *Floors*, on the single server in the same run with \
         redis-benchmark, in Redis µs per decision: {}.\n",
        measured(&conditions),
        floor_cells.join("; "),
    );
    let mut table = Table::new(&[
        ("backend", Align::Left),
        ("algorithm", Align::Left),
        ("shards", Align::Right),
        ("traffic", Align::Left),
        ("descriptors", Align::Right),
        ("limits", Align::Right),
        ("admitted", Align::Right),
        ("decisions/s", Align::Right),
        ("script calls per decision", Align::Right),
        ("Redis µs per call", Align::Right),
        ("Redis µs per decision", Align::Right),
        ("Redis process µs per limit", Align::Right),
    ]);
    type At = (Backend, Algorithm, u16, Mix, u32, u32);
    let point = |r: &RedisCpuRun| -> At {
        (
            r.backend,
            r.algorithm,
            r.shards,
            r.mix,
            r.descriptors,
            r.limits,
        )
    };
    let per_decision = |at: At| {
        median(
            runs.iter()
                .filter(|r| point(r) == at)
                .filter_map(|r| r.usec_per_decision()),
        )
    };
    let points = distinct(runs.iter().map(point));
    for &at in &points {
        let of: Vec<&RedisCpuRun> = runs.iter().filter(|r| point(r) == at).collect();
        let (backend, algorithm, shards, mix, descriptors, limits) = at;
        table.row(vec![
            backend.to_string(),
            algorithm.name().to_owned(),
            shards.to_string(),
            mix.name().to_owned(),
            descriptors.to_string(),
            limits.to_string(),
            percent(median(of.iter().filter_map(|r| r.admitted_share()))),
            count(median(of.iter().map(|r| r.load.decisions_per_second))),
            fixed(median(of.iter().filter_map(|r| r.calls_per_decision())), 2),
            fixed(median(of.iter().filter_map(|r| r.usec_per_call())), 2),
            fixed(per_decision(at), 2),
            fixed(
                median(of.iter().filter_map(|r| r.process_usec_per_limit())),
                2,
            ),
        ]);
    }
    out.push_str(&table.render());
    let extras = extra_limits(&points, per_decision);
    if !extras.is_empty() || !key_bytes.is_empty() {
        out.push('\n');
        if !extras.is_empty() {
            let _ = write!(
                out,
                "Each extra limit on one descriptor, same run, in Redis µs per decision (at n \
                 limits less at one, over n − 1; beside one limit's): {}.",
                extras.join("; ")
            );
        }
        let bytes = bytes_per_limit(&key_bytes);
        if !bytes.is_empty() {
            let _ = write!(
                out,
                "{}Bytes one descriptor value holds in Redis after its first hit (`MEMORY USAGE` \
                 of its keys, the single server): {}.",
                if extras.is_empty() { "" } else { " " },
                bytes.join("; ")
            );
        }
        out.push('\n');
    }
    Ok(out)
}

/// Per backend, algorithm, shards and mix with one descriptor and several limit counts: what
/// each extra limit adds to one limit's Redis µs per decision, and its ratio to that.
fn extra_limits(
    points: &[(Backend, Algorithm, u16, Mix, u32, u32)],
    per_decision: impl Fn((Backend, Algorithm, u16, Mix, u32, u32)) -> Option<f64>,
) -> Vec<String> {
    let groups = distinct(
        points
            .iter()
            .filter(|p| p.4 == 1)
            .map(|&(backend, algorithm, shards, mix, _, _)| (backend, algorithm, shards, mix)),
    );
    let mut out = Vec::new();
    for (backend, algorithm, shards, mix) in groups {
        let Some(first) = per_decision((backend, algorithm, shards, mix, 1, 1)) else {
            continue;
        };
        let mut cells = Vec::new();
        for &(.., limits) in points.iter().filter(|p| {
            (p.0, p.1, p.2, p.3, p.4) == (backend, algorithm, shards, mix, 1) && p.5 > 1
        }) {
            let Some(at) = per_decision((backend, algorithm, shards, mix, 1, limits)) else {
                continue;
            };
            let extra = (at - first) / f64::from(limits - 1);
            cells.push(format!(
                "{limits} limits +{} ({}×)",
                fixed(Some(extra), 2),
                fixed(Some(extra / first), 2)
            ));
        }
        if !cells.is_empty() {
            let sharded = if shards > 1 {
                format!(" `shards: {shards}`")
            } else {
                String::new()
            };
            out.push(format!(
                "{backend} {}{sharded} {}, one limit {}: {}",
                algorithm.name(),
                mix.name(),
                fixed(Some(first), 2),
                cells.join(", ")
            ));
        }
    }
    out
}

/// Per algorithm, the bytes and keys of each limit count measured, and what each extra limit
/// adds to one limit's bytes.
fn bytes_per_limit(key_bytes: &[KeyBytes]) -> Vec<String> {
    let mut out = Vec::new();
    for algorithm in distinct(key_bytes.iter().map(|k| k.algorithm)) {
        let of: Vec<&KeyBytes> = key_bytes
            .iter()
            .filter(|k| k.algorithm == algorithm)
            .collect();
        let bytes = |limits: u32| {
            median(
                of.iter()
                    .filter(|k| k.limits == limits)
                    .map(|k| k.bytes as f64),
            )
        };
        let mut cells = Vec::new();
        for limits in distinct(of.iter().map(|k| k.limits)) {
            let keys = of.iter().find(|k| k.limits == limits).map_or(0, |k| k.keys);
            let mut cell = format!(
                "{limits} limit{} {} B in {keys} key{}",
                if limits == 1 { "" } else { "s" },
                count(bytes(limits)),
                if keys == 1 { "" } else { "s" },
            );
            if let (true, Some(first), Some(at)) = (limits > 1, bytes(1), bytes(limits)) {
                let _ = write!(
                    cell,
                    " (+{} B a limit)",
                    count(Some((at - first) / f64::from(limits - 1)))
                );
            }
            cells.push(cell);
        }
        out.push(format!("{} {}", algorithm.name(), cells.join(", ")));
    }
    out
}
/// The `redis-benchmark` binary: `$TOLLGATE_REDIS_BENCHMARK`, else the one on the `PATH`.
pub fn redis_benchmark_bin() -> anyhow::Result<std::path::PathBuf> {
    crate::proc::find_tool(
        "TOLLGATE_REDIS_BENCHMARK",
        "redis-benchmark",
        "it comes with the Debian package redis-tools (apt-get install redis-tools)",
    )
}
