//! Scenarios: each starts what it needs (tollgate on a backend, Redis servers, redis-benchmark),
//! measures, keeps every run as one JSON record, and renders its records as a section of
//! `docs/performance.md`.
//!
//! Adding a scenario is a new module with a type implementing [`Scenario`], an entry in
//! [`ScenarioName`] and in [`scenario`] (which `report` runs), and a subcommand in `main.rs`
//! for running it alone with its own options. A scenario gets a [`Bench`]: the scale of the run,
//! the shared Redis servers, a load generator, and the recorder its JSON lines go to. It may
//! start several tollgate processes on the same servers ([`crate::stand::Stand`]) and spread its
//! load over all of them ([`Loader::connect`]). Its render function reads only its own
//! records, so a report can be written again from `target/bench/*.jsonl` without measuring
//! (`report --render-only`).

pub mod accuracy;
pub mod attack;
pub mod burst;
pub mod cost;
pub mod envoy;
pub mod grpc_floor;
pub mod hotkey;
pub mod instructions;
pub mod keys;
pub mod lease;
pub mod limitador;
pub mod matrix;
pub mod memory;
pub mod overload;
pub mod redis_cpu;

use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, anyhow, bail};
use clap::ValueEnum;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio::runtime::Runtime;
use tollgate::proto::{RateLimitRequest, RateLimitResponse};

use crate::doc::{count, count_range, fixed, median, ms, range};
use crate::load::args::Stop;
use crate::load::client::{Client, Deadline, Failed};
use crate::load::generator::{Load, Shape, connect};
use crate::load::keys::KeySampler;
use crate::load::summary::Summary;
use crate::machine::{Conditions, Machine, utc};
use crate::stand::Servers;

/// The scenarios, by the name the command line, the records and the report use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, ValueEnum)]
pub enum ScenarioName {
    /// Backend × algorithm × shards × concurrency: the peak and CPU per decision.
    Matrix,
    /// One hot limit on the cluster, unsharded and sharded.
    Hotkey,
    /// One key hammered far over its limit.
    Attack,
    /// Twice the saturation rate, with and without a bound on decisions in flight.
    Overload,
    /// A flood of distinct keys on the memory backend: bytes per key, the budget, idle memory.
    Memory,
    /// Each algorithm's admissions against the exact limit, and memory per hit.
    Accuracy,
    /// Redis CPU per decision, beside a minimal script and the reference's commands.
    RedisCpu,
    /// The per-limit statistics' cost on the memory backend: before and after, interleaved.
    Cost,
    /// One hot limit shared by several instances, leased and unleased.
    Lease,
    /// A burst at three times a leased limit shared by three instances.
    Burst,
    /// Keys a per-client log limit keeps in Redis during load and after it stops.
    Keys,
    /// tollgate on the memory backend against an empty RLS server.
    GrpcFloor,
    /// tollgate against Kuadrant's limitador-server on the same Redis.
    Limitador,
    /// Envoy alone, with the RLS filter and with the RLQS filter, in front of tollgate.
    Envoy,
    /// Instructions per call of tollgate, the empty server and redis-server's scripts, counted
    /// by callgrind.
    Instructions,
}

impl ScenarioName {
    /// Every scenario, in report order.
    pub const ALL: [ScenarioName; 15] = [
        ScenarioName::Matrix,
        ScenarioName::Hotkey,
        ScenarioName::Attack,
        ScenarioName::Overload,
        ScenarioName::Memory,
        ScenarioName::Accuracy,
        ScenarioName::RedisCpu,
        ScenarioName::Cost,
        ScenarioName::Lease,
        ScenarioName::Burst,
        ScenarioName::Keys,
        ScenarioName::GrpcFloor,
        ScenarioName::Limitador,
        ScenarioName::Envoy,
        ScenarioName::Instructions,
    ];

    /// The page of `docs/` its section goes on: the accuracy of the algorithms beside their
    /// explanation, Envoy's RLS against RLQS on the RLQS page, every other section on the
    /// performance page.
    pub fn page(self) -> &'static str {
        match self {
            ScenarioName::Accuracy => "algorithms.md",
            ScenarioName::Envoy => "rlqs.md",
            _ => "performance.md",
        }
    }

    /// The name in records, file names and report markers.
    pub fn name(self) -> &'static str {
        match self {
            ScenarioName::Matrix => "matrix",
            ScenarioName::Hotkey => "hotkey",
            ScenarioName::Attack => "attack",
            ScenarioName::Overload => "overload",
            ScenarioName::Memory => "memory",
            ScenarioName::Accuracy => "accuracy",
            ScenarioName::RedisCpu => "redis-cpu",
            ScenarioName::Cost => "cost",
            ScenarioName::Lease => "lease",
            ScenarioName::Burst => "burst",
            ScenarioName::Keys => "keys",
            ScenarioName::GrpcFloor => "grpc-floor",
            ScenarioName::Limitador => "limitador",
            ScenarioName::Envoy => "envoy",
            ScenarioName::Instructions => "instructions",
        }
    }
}

/// The scenario `name` with its default options.
pub fn scenario(name: ScenarioName) -> Box<dyn Scenario> {
    match name {
        ScenarioName::Matrix => Box::new(matrix::Matrix::new(defaults())),
        ScenarioName::Hotkey => Box::new(hotkey::Hotkey::new(defaults())),
        ScenarioName::Attack => Box::new(attack::Attack::new(defaults())),
        ScenarioName::Overload => Box::new(overload::Overload::new(defaults())),
        ScenarioName::Memory => Box::new(memory::Memory::new(defaults())),
        ScenarioName::Accuracy => Box::new(accuracy::Accuracy::new(defaults())),
        ScenarioName::RedisCpu => Box::new(redis_cpu::RedisCpu::new(defaults())),
        ScenarioName::Cost => Box::new(cost::Cost::new(defaults())),
        ScenarioName::Lease => Box::new(lease::Lease::new(defaults())),
        ScenarioName::Burst => Box::new(burst::Burst::new(defaults())),
        ScenarioName::Keys => Box::new(keys::Keys::new(defaults())),
        ScenarioName::GrpcFloor => Box::new(grpc_floor::GrpcFloor::new(defaults())),
        ScenarioName::Limitador => Box::new(limitador::Limitador::new(defaults())),
        ScenarioName::Envoy => Box::new(envoy::EnvoyScenario::new(defaults())),
        ScenarioName::Instructions => Box::new(instructions::Instructions::new(defaults())),
    }
}

/// The options of a scenario as its command line leaves them when no flag is given.
fn defaults<T: clap::Args + clap::FromArgMatches>() -> T {
    let command = T::augment_args(clap::Command::new("defaults"));
    let matches = command.get_matches_from(["defaults"]);
    // Every scenario option has a default or is optional, so an empty command line parses.
    T::from_arg_matches(&matches).unwrap_or_else(|error| panic!("scenario defaults: {error}"))
}

/// The closed loop several scenarios send to each server they compare, as their flags.
#[derive(Debug, Clone, clap::Args)]
pub struct ClosedLoopOptions {
    /// Calls in flight, over all HTTP/2 connections.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub concurrency: u32,

    /// HTTP/2 connections of the load generator to each server.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub connections: u32,

    /// Distinct values of each descriptor, drawn uniformly.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    pub keys: u64,
}

/// One benchmark scenario.
pub trait Scenario {
    /// Which scenario this is.
    fn name(&self) -> ScenarioName;

    /// Why this scenario cannot run on this machine (a program it needs is missing), or `None`
    /// when it can. `report` skips such a scenario and keeps its last section.
    fn unavailable(&self) -> Option<String> {
        None
    }

    /// Measures, sending every run to `bench.records`.
    fn run(&self, bench: &mut Bench) -> anyhow::Result<()>;

    /// The report section of this scenario's `records` (every record of one run of it, its
    /// [`Conditions`] among them), in Markdown.
    fn render(&self, records: &[Value]) -> anyhow::Result<String>;
}

/// How long and how often to measure, shared by every scenario.
#[derive(Debug, Clone, clap::Args)]
pub struct ScaleArgs {
    /// Measured runs of every point; reports give their median and min–max [default: 3, 1 with
    /// --quick].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub runs: Option<u32>,

    /// Length of one measured run, e.g. `5s` [default: 5s, 200ms with --quick].
    #[arg(long, value_parser = crate::load::args::parse_positive_duration)]
    pub duration: Option<Duration>,

    /// Load sent before each point is measured, not counted [default: 2s, 100ms with --quick].
    #[arg(long, value_parser = humantime::parse_duration)]
    pub warmup: Option<Duration>,

    /// A smoke run: one short run per point and fewer points (one concurrency level), to check
    /// that everything works; its numbers mean little. The test that runs the commands of the
    /// documentation sets the variable, so the documented commands are checked at this scale.
    #[arg(long, env = "TOLLGATE_BENCH_QUICK", value_parser = clap::builder::BoolishValueParser::new())]
    pub quick: bool,

    /// Where the results go as JSON lines, one file per scenario (`matrix.jsonl`, ...)
    /// [default: target/bench, or target/bench/quick with --quick, so smoke results never mix
    /// with real ones; a scenario run on its own adds `by-hand` to either].
    #[arg(long)]
    pub results_dir: Option<PathBuf>,
}

impl ScaleArgs {
    /// Where the results go.
    pub fn results_dir(&self) -> PathBuf {
        self.results_dir.clone().unwrap_or_else(|| {
            let dir = tollgate_testkit::tools::manifest_dir().join("target/bench");
            if self.quick { dir.join("quick") } else { dir }
        })
    }

    /// Where a scenario run on its own puts its results unless told: apart from the report's,
    /// because its options (shards, concurrency, scale) may differ from those the report is
    /// written for, and `report --render-only` would otherwise publish them.
    pub fn by_hand_results_dir(&self) -> PathBuf {
        match &self.results_dir {
            Some(dir) => dir.clone(),
            None => self.results_dir().join("by-hand"),
        }
    }
}

/// The scale of a run, defaults applied.
#[derive(Debug, Clone)]
pub struct Scale {
    /// Measured runs per point.
    pub runs: u32,
    /// One measured run.
    pub duration: Duration,
    /// Warmup per point.
    pub warmup: Duration,
    /// A smoke run.
    pub quick: bool,
}

impl ScaleArgs {
    /// The scale, with the defaults of a full or a quick run where no flag was given.
    pub fn scale(&self) -> Scale {
        let (runs, duration, warmup) = if self.quick {
            (1, Duration::from_millis(200), Duration::from_millis(100))
        } else {
            (3, Duration::from_secs(5), Duration::from_secs(2))
        };
        Scale {
            runs: self.runs.unwrap_or(runs),
            duration: self.duration.unwrap_or(duration),
            warmup: self.warmup.unwrap_or(warmup),
            quick: self.quick,
        }
    }
}

/// Everything a scenario measures with. Its parts are separate fields so a scenario can hold a
/// [`crate::stand::Stand`] (which borrows the servers) while it drives load and records.
pub struct Bench {
    /// How long and how often.
    pub scale: Scale,
    /// The Redis servers, started on first use.
    pub servers: Servers,
    /// The load generator.
    pub loader: Loader,
    /// Where records go.
    pub records: Recorder,
    /// The machine, described once.
    pub machine: Machine,
}

impl Bench {
    /// A bench at `scale`, writing results under `results_dir`.
    pub fn new(scale: Scale, results_dir: &Path) -> anyhow::Result<Bench> {
        let tollgate_bin = tollgate_testkit::tollgate::tollgate_bin();
        Ok(Bench {
            scale,
            servers: Servers::default(),
            loader: Loader::new()?,
            records: Recorder::new(results_dir),
            machine: Machine::describe(&tollgate_bin),
        })
    }

    /// The servers, apart from the rest: a [`crate::stand::Stand`] borrows the servers while
    /// the scenario drives load and records through the [`Tools`].
    pub fn split(&mut self) -> (&Servers, Tools<'_>) {
        (
            &self.servers,
            Tools {
                scale: &self.scale,
                loader: &self.loader,
                records: &mut self.records,
            },
        )
    }

    /// Runs `scenario` and answers its records (also written to `<results>/<name>.jsonl`).
    pub fn run(&mut self, scenario: &dyn Scenario) -> anyhow::Result<Vec<Value>> {
        let name = scenario.name().name();
        say(&format!("scenario {name}"));
        let started = SystemTime::now();
        let clock = Instant::now();
        let load_start = crate::proc::load_average();
        self.records.begin(name)?;
        scenario.run(self)?;
        let conditions = Conditions {
            started: utc(started),
            seconds: clock.elapsed().as_secs_f64(),
            load_start,
            load_end: crate::proc::load_average(),
            runs: self.scale.runs,
            duration_seconds: self.scale.duration.as_secs_f64(),
            warmup_seconds: self.scale.warmup.as_secs_f64(),
            quick: self.scale.quick,
            machine: self.machine.clone(),
        };
        self.records.finish(&conditions)
    }
}

/// What a scenario measures with besides the servers.
pub struct Tools<'a> {
    /// How long and how often.
    pub scale: &'a Scale,
    /// The load generator.
    pub loader: &'a Loader,
    /// Where records go.
    pub records: &'a mut Recorder,
}

/// Prints a progress line on standard error.
pub fn say(line: &str) {
    eprintln!("tollgate-bench: {line}");
}

/// The JSON records of the scenario being run: each written as one line of
/// `<results>/<scenario>.jsonl` as soon as it is measured (so an interrupted run keeps what it
/// measured), and the [`Conditions`] as the last line once the scenario is done.
pub struct Recorder {
    dir: PathBuf,
    scenario: String,
    records: Vec<Value>,
    out: Option<BufWriter<File>>,
}

impl Recorder {
    fn new(dir: &Path) -> Recorder {
        Recorder {
            dir: dir.to_owned(),
            scenario: String::new(),
            records: Vec::new(),
            out: None,
        }
    }

    fn begin(&mut self, scenario: &str) -> anyhow::Result<()> {
        std::fs::create_dir_all(&self.dir)
            .with_context(|| format!("creating {}", self.dir.display()))?;
        let path = self.path(scenario);
        let file = File::create(&path).with_context(|| format!("creating {}", path.display()))?;
        self.out = Some(BufWriter::new(file));
        self.scenario = scenario.to_owned();
        self.records.clear();
        Ok(())
    }

    /// Keeps `record` (a struct that serializes to a JSON object) with `"scenario"` and
    /// `"kind"` fields added.
    pub fn record<T: Serialize>(&mut self, kind: &str, record: &T) -> anyhow::Result<()> {
        let mut value = serde_json::to_value(record)?;
        let Some(object) = value.as_object_mut() else {
            bail!("a {kind} record is not a JSON object");
        };
        object.insert("scenario".into(), Value::from(self.scenario.as_str()));
        object.insert("kind".into(), Value::from(kind));
        if let Some(out) = self.out.as_mut() {
            serde_json::to_writer(&mut *out, &value)?;
            out.write_all(b"\n")?;
            out.flush()
                .with_context(|| format!("writing {}", self.path(&self.scenario).display()))?;
        }
        self.records.push(value);
        Ok(())
    }

    fn finish(&mut self, conditions: &Conditions) -> anyhow::Result<Vec<Value>> {
        self.record("conditions", conditions)?;
        self.out = None;
        say(&format!("results: {}", self.path(&self.scenario).display()));
        Ok(std::mem::take(&mut self.records))
    }

    fn path(&self, scenario: &str) -> PathBuf {
        self.dir.join(format!("{scenario}.jsonl"))
    }
}

/// Reads the records a previous run of `scenario` left in `dir`.
pub fn read_records(dir: &Path, scenario: ScenarioName) -> anyhow::Result<Vec<Value>> {
    let path = dir.join(format!("{}.jsonl", scenario.name()));
    let file = File::open(&path).with_context(|| format!("opening {}", path.display()))?;
    BufReader::new(file)
        .lines()
        .enumerate()
        .filter(|(_, line)| !matches!(line, Ok(line) if line.trim().is_empty()))
        .map(|(number, line)| {
            let line = line.with_context(|| format!("reading {}", path.display()))?;
            serde_json::from_str(&line)
                .with_context(|| format!("{}:{}: not a JSON record", path.display(), number + 1))
        })
        .collect()
}

/// The ratio of two kinds of measurement within each run (`rate` of the record `numerator`
/// picks over that of the record `denominator` picks, both of the same run), in run order.
/// Each pairs measurements taken seconds apart on the same machine; their median is steadier
/// than the ratio of two medians on a machine whose speed drifts. A run missing either side,
/// or whose denominator is zero, gives no ratio.
pub fn run_ratios<R>(
    records: &[R],
    run: impl Fn(&R) -> u32,
    numerator: impl Fn(&R) -> bool,
    denominator: impl Fn(&R) -> bool,
    rate: impl Fn(&R) -> f64,
) -> Vec<f64> {
    distinct(records.iter().map(&run))
        .into_iter()
        .filter_map(|number| {
            let side = |pick: &dyn Fn(&R) -> bool| {
                records
                    .iter()
                    .find(|r| run(r) == number && pick(r))
                    .map(&rate)
            };
            let below = side(&denominator).filter(|rate| *rate > 0.0)?;
            Some(side(&numerator)? / below)
        })
        .collect()
}

/// The indices `0..len` in the order run `run` (from 1) measures them: each run starts one later
/// than the one before, so no point always runs on the warmest (or busiest) machine; with two
/// points, they alternate.
pub fn rotation(run: u32, len: usize) -> impl Iterator<Item = usize> + Clone {
    let first = (run as usize).saturating_sub(1) % len.max(1);
    (0..len).map(move |step| (first + step) % len)
}

/// The distinct values of `values`, in the order they first appear: the rows or columns of a
/// report, in the order the scenario ran them.
pub fn distinct<T: PartialEq>(values: impl IntoIterator<Item = T>) -> Vec<T> {
    let mut seen: Vec<T> = Vec::new();
    for value in values {
        if !seen.contains(&value) {
            seen.push(value);
        }
    }
    seen
}

/// The records of `kind` among `records`, as `T`.
pub fn records_of<T: DeserializeOwned>(records: &[Value], kind: &str) -> anyhow::Result<Vec<T>> {
    records
        .iter()
        .filter(|record| record["kind"] == kind)
        .map(|record| {
            serde_json::from_value(record.clone())
                .with_context(|| format!("a `{kind}` record that does not parse: {record}"))
        })
        .collect()
}

/// The `run` records of scenario `scenario` among `records`, as `T`: never empty, since a
/// section needs at least one run to report.
pub fn runs_of<T: DeserializeOwned>(records: &[Value], scenario: &str) -> anyhow::Result<Vec<T>> {
    let runs = records_of(records, "run")?;
    if runs.is_empty() {
        bail!("the {scenario} results hold no run");
    }
    Ok(runs)
}

/// The [`Conditions`] among `records`.
pub fn conditions_of(records: &[Value]) -> anyhow::Result<Conditions> {
    records_of::<Conditions>(records, "conditions")?
        .into_iter()
        .next()
        .context("the results have no conditions record")
}

/// The load generator of the scenarios: the same one `tollgate-bench load` runs, in this process.
pub struct Loader {
    runtime: Runtime,
}

/// Connections to one tollgate, reused by every phase sent to it.
pub struct Connections {
    clients: Vec<Client>,
}

/// One phase of load.
#[derive(Debug, Clone)]
pub struct Phase {
    /// What requests look like.
    pub shape: Arc<Shape>,
    /// Calls in flight.
    pub concurrency: u32,
    /// Open-loop rate, or closed loop.
    pub rate: Option<f64>,
    /// How long.
    pub duration: Duration,
}

/// Deadline of one call of a scenario: far above any latency a working stand has, so only a
/// stalled server trips it.
const CALL_TIMEOUT: Duration = Duration::from_secs(2);

impl Loader {
    /// A load generator whose runtime has one worker per CPU this process may use now.
    pub fn new() -> anyhow::Result<Loader> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .context("starting the load generator's runtime")?;
        Ok(Loader { runtime })
    }

    /// Opens `connections` HTTP/2 connections to each gRPC server of `addrs`; the calls in flight
    /// of a phase are spread evenly over all of them (and so over the servers).
    pub fn connect(
        &self,
        addrs: &[std::net::SocketAddr],
        connections: u32,
    ) -> anyhow::Result<Connections> {
        let mut clients = Vec::new();
        for addr in addrs {
            clients.extend(
                self.runtime
                    .block_on(connect(&format!("http://{addr}"), connections))?,
            );
        }
        Ok(Connections { clients })
    }

    /// Sends `request` once to the gRPC server at `addr`, on a connection of its own, and
    /// returns the answer.
    pub fn call(
        &self,
        addr: std::net::SocketAddr,
        request: &RateLimitRequest,
    ) -> anyhow::Result<RateLimitResponse> {
        self.runtime.block_on(async {
            let client = Client::connect(&addr.to_string(), CALL_TIMEOUT).await?;
            client
                .should_rate_limit(request, &Deadline::new(CALL_TIMEOUT))
                .await
                .map_err(|Failed(code)| anyhow!("calling {addr}: {code:?}"))
        })
    }

    /// Sends `count` calls shaped as `shape` over `connections`, `concurrency` in flight (closed
    /// loop, or open loop at `rate` calls a second, but never stopped early), and summarises
    /// them.
    pub fn drive_count(
        &self,
        connections: &Connections,
        shape: &Arc<Shape>,
        concurrency: u32,
        rate: Option<f64>,
        count: u64,
    ) -> anyhow::Result<Summary> {
        let load = Load {
            clients: connections.clients.clone(),
            concurrency,
            rate,
            timeout: CALL_TIMEOUT,
            shape: Arc::clone(shape),
            seed: fastrand::u64(..),
        };
        let measured = self.runtime.block_on(load.run(Stop::Count(count), 1))?;
        Ok(Summary::of(&measured))
    }

    /// Sends `phase` over `connections` and summarises it.
    pub fn drive(&self, connections: &Connections, phase: &Phase) -> anyhow::Result<Summary> {
        let load = Load {
            clients: connections.clients.clone(),
            concurrency: phase.concurrency,
            rate: phase.rate,
            timeout: CALL_TIMEOUT,
            shape: Arc::clone(&phase.shape),
            seed: fastrand::u64(..),
        };
        let measured = self
            .runtime
            .block_on(load.run(Stop::After(phase.duration), 1))?;
        Ok(Summary::of(&measured))
    }
}

/// Requests of domain `bench` with one descriptor per entry key, each with one entry whose value
/// is drawn uniformly from `0..keys`.
pub fn uniform_shape(entry_keys: Vec<String>, keys: u64) -> Arc<Shape> {
    Arc::new(Shape {
        domain: DOMAIN.to_owned(),
        entry_keys,
        sampler: KeySampler::uniform(keys),
        hits_addend: 1,
        descriptor_hits_addend: None,
    })
}

/// The domain of every scenario's policy.
pub const DOMAIN: &str = "bench";

/// A limit far above what any machine here can send in its window, so every hit is admitted and
/// counted; with `--failure-mode deny`, any OVER_LIMIT is then a failed backend call.
pub const UNREACHABLE_LIMIT: u64 = 4_000_000_000;

/// The window of every scenario's limits.
pub const WINDOW_MS: u64 = 60_000;

/// The sliding-window algorithm of a limit.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    ValueEnum,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum Algorithm {
    /// `sliding_window_counter`: two fixed-window counts per key.
    Counter,
    /// `sliding_window_log`: one entry per admitted hit.
    Log,
}

impl Algorithm {
    /// The name in the report.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Counter => "counter",
            Algorithm::Log => "log",
        }
    }

    /// The `rate_limit.algorithm` of a policy.
    pub fn policy_name(self) -> &'static str {
        match self {
            Algorithm::Counter => "sliding_window_counter",
            Algorithm::Log => "sliding_window_log",
        }
    }
}

/// A policy of domain `bench`: one descriptor key per `(key, algorithm, limit, shards)`, a
/// minute window each.
pub fn policy(limits: &[(String, Algorithm, u64, u16)]) -> String {
    let mut yaml = format!("domain: {DOMAIN}\ndescriptors:\n");
    for (key, algorithm, limit, shards) in limits {
        yaml.push_str(&format!(
            "  - key: {key}\n    rate_limit: {{unit: minute, requests_per_unit: {limit}, algorithm: {}, shards: {shards}}}\n",
            algorithm.policy_name()
        ));
    }
    yaml
}

/// Seconds of CPU per event, in microseconds.
pub fn micros_per(seconds: f64, events: u64) -> Option<f64> {
    (events > 0).then(|| seconds / events as f64 * 1e6)
}

/// The four cells most tables give a set of runs of one point, under the columns
/// `decisions/s`, `min–max`, `p50 ms` and `p99 ms`: the median and the range of the runs'
/// decisions per second, and the median of their p50 and of their p99 latency.
pub fn load_cells<'a>(loads: impl IntoIterator<Item = &'a Summary>) -> [String; 4] {
    let loads: Vec<&Summary> = loads.into_iter().collect();
    let per_second = || loads.iter().map(|l| l.decisions_per_second);
    [
        count(median(per_second())),
        count_range(range(per_second())),
        ms(median(loads.iter().map(|l| l.latency_us.p50))),
        ms(median(loads.iter().map(|l| l.latency_us.p99))),
    ]
}

/// The cell of a CPU-per-decision column (`… CPU µs/decision`): over a set of runs, each a
/// pair of CPU seconds and the decisions they were spent on, the median of their microseconds
/// per decision, to a tenth; a run without decisions has none to give.
pub fn per_decision_cell(runs: impl IntoIterator<Item = (f64, u64)>) -> String {
    fixed(
        median(
            runs.into_iter()
                .filter_map(|(seconds, decisions)| micros_per(seconds, decisions)),
        ),
        1,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_scenario_has_defaults_and_its_name() {
        for name in ScenarioName::ALL {
            assert_eq!(scenario(name).name(), name);
        }
    }

    #[test]
    fn a_scenario_run_by_hand_keeps_its_results_apart_from_the_reports() {
        let args = |quick, results_dir: Option<&str>| ScaleArgs {
            runs: None,
            duration: None,
            warmup: None,
            quick,
            results_dir: results_dir.map(PathBuf::from),
        };
        let bench = tollgate_testkit::tools::manifest_dir().join("target/bench");
        assert_eq!(args(false, None).results_dir(), bench);
        assert_eq!(
            args(false, None).by_hand_results_dir(),
            bench.join("by-hand")
        );
        assert_eq!(
            args(true, None).by_hand_results_dir(),
            bench.join("quick/by-hand")
        );
        // A directory named on the command line is used as it is, by hand or not.
        let named = args(false, Some("/tmp/shards-16"));
        assert_eq!(named.by_hand_results_dir(), PathBuf::from("/tmp/shards-16"));
        assert_eq!(named.results_dir(), PathBuf::from("/tmp/shards-16"));
    }

    #[test]
    fn ratios_pair_the_two_sides_of_each_run_and_skip_incomplete_runs() {
        // (run, side, rate): run 2 has no denominator, run 3's denominator is zero.
        let records = [
            (1, 'a', 90.0),
            (1, 'b', 100.0),
            (2, 'a', 50.0),
            (3, 'b', 0.0),
            (3, 'a', 10.0),
            (4, 'b', 40.0),
            (4, 'a', 60.0),
        ];
        let ratios = run_ratios(&records, |r| r.0, |r| r.1 == 'a', |r| r.1 == 'b', |r| r.2);
        assert_eq!(ratios, vec![0.9, 1.5]);
        assert_eq!(rotation(1, 3).collect::<Vec<_>>(), [0, 1, 2]);
        assert_eq!(rotation(2, 3).collect::<Vec<_>>(), [1, 2, 0]);
        assert_eq!(rotation(4, 2).collect::<Vec<_>>(), [1, 0]);
        assert_eq!(rotation(1, 0).count(), 0);
        assert_eq!(
            crate::doc::times_by_run(&ratios),
            "1.20× (runs: 0.90×, 1.50×)"
        );
    }

    #[test]
    fn policies_name_every_limit() {
        let yaml = policy(&[("log_s8_0".into(), Algorithm::Log, 100, 8)]);
        assert_eq!(
            yaml,
            "domain: bench\ndescriptors:\n  - key: log_s8_0\n    rate_limit: {unit: minute, \
             requests_per_unit: 100, algorithm: sliding_window_log, shards: 8}\n"
        );
    }
}
