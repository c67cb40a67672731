//! `accuracy`: how far each algorithm's admissions are from the exact limit, and what a hit
//! costs in memory.
//!
//! The decisions are tollgate's own: the memory backend (under the sharding decorator) driven
//! by a manual clock through arrival times drawn from a seeded generator, so every number is
//! the same on every machine and every run. For each traffic pattern and algorithm the
//! admitted hits are checked against the exact rule, "no interval of one window's length holds
//! more than the limit":
//!
//! - **worst interval**: the most units admitted in any interval of one window's length, over
//!   the limit;
//! - **wrongly admitted**: admissions that took the last window's units (ending at the hit)
//!   above the limit, over all admissions;
//! - **wrongly refused**: refusals of a hit that would have fitted in the last window, over all
//!   refusals;
//! - **admitted**: units admitted over units the exact rule admits on the same arrivals.
//!
//! Then memory per hit: the memory backend's own accounting, and `MEMORY USAGE` of the keys
//! tollgate's Redis scripts write in a real redis-server.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tollgate::backend::memory::MemoryBackend;
use tollgate::backend::redis::RedisBackend;
use tollgate::backend::shard::Sharded;
use tollgate::backend::{Backend, Hit};
use tollgate::clock::ManualClock;
use tollgate::window::{Algorithm as WindowAlgorithm, Cost, Counting};

use crate::doc::{Align, Table, count, fixed};
use crate::scenario::{
    Algorithm, Bench, Scenario, ScenarioName, conditions_of, distinct, records_of, runs_of, say,
};
use crate::stand::Backend as StandBackend;

/// Units admitted per window in every pattern (weighted: units, not hits).
const LIMIT: u64 = 100;
/// The window of every pattern.
const WINDOW_MS: u64 = 60_000;
/// Where the simulated time starts: a window boundary, far from zero.
const START_MS: u64 = 1_000 * WINDOW_MS;

/// The options of `accuracy`.
#[derive(Debug, Clone, clap::Args)]
pub struct AccuracyOptions {
    /// Windows of simulated traffic per pattern [default: 500, 20 with --quick].
    #[arg(long, value_parser = clap::value_parser!(u64).range(2..=1_000_000))]
    pub windows: Option<u64>,

    /// Seed of the arrival times.
    #[arg(long, default_value_t = 20_261_123)]
    pub seed: u64,
}

/// The `accuracy` scenario.
pub struct Accuracy {
    options: AccuracyOptions,
}

impl Accuracy {
    /// The scenario with `options`.
    pub fn new(options: AccuracyOptions) -> Accuracy {
        Accuracy { options }
    }
}

/// One traffic pattern against one algorithm and shard count.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AccuracyRun {
    /// The traffic.
    pub pattern: String,
    /// The algorithm.
    pub algorithm: Algorithm,
    /// Shards of the limit.
    pub shards: u16,
    /// Simulated windows.
    pub windows: u64,
    /// Hits sent.
    pub hits: u64,
    /// Units admitted.
    pub admitted_units: u64,
    /// Units the exact rule admits on the same arrivals.
    pub exact_units: u64,
    /// The most units admitted in any interval of one window's length.
    pub worst_interval: u64,
    /// Admissions that took the last window above the limit.
    pub wrongly_admitted: u64,
    /// Hits admitted.
    pub admissions: u64,
    /// Refusals of hits that fitted in the last window.
    pub wrongly_refused: u64,
    /// Hits refused.
    pub refusals: u64,
}

/// What one hit costs in memory.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MemoryPerHit {
    /// Where: `memory` or `redis`.
    pub store: String,
    /// The algorithm.
    pub algorithm: Algorithm,
    /// Hits recorded in the one key.
    pub hits: u64,
    /// Bytes the key takes.
    pub bytes: u64,
}

/// One arrival: when, and how many units.
#[derive(Debug, Clone, Copy)]
struct Arrival {
    at_ms: u64,
    units: u64,
}

/// A traffic pattern: its name and arrivals in time order.
struct Pattern {
    name: String,
    arrivals: Vec<Arrival>,
}

/// Exponential gaps with mean `mean_ms`, from a seeded generator.
fn poisson(
    rng: &mut fastrand::Rng,
    mean_ms: f64,
    until_ms: u64,
    units: impl Fn(&mut fastrand::Rng) -> u64,
) -> Vec<Arrival> {
    let mut arrivals = Vec::new();
    let mut at = START_MS as f64;
    loop {
        // 1 - u is in (0, 1], so the logarithm is finite.
        at += -(1.0 - rng.f64()).ln() * mean_ms;
        let at_ms = at as u64;
        if at_ms >= until_ms {
            return arrivals;
        }
        let units = units(rng);
        arrivals.push(Arrival { at_ms, units });
    }
}

fn patterns(windows: u64, seed: u64) -> Vec<Pattern> {
    let end = START_MS + windows * WINDOW_MS;
    let per_unit_ms = WINDOW_MS as f64 / LIMIT as f64;
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut patterns = Vec::new();

    // The counter's worst case: an empty window, then the whole limit in its last millisecond,
    // then a try every 10 ms through the next window. The weight of the full window decays
    // while the new one fills, so the interval around the boundary holds up to twice the limit.
    let mut boundary: Vec<Arrival> = (0..LIMIT)
        .map(|_| Arrival {
            at_ms: START_MS + 2 * WINDOW_MS - 1,
            units: 1,
        })
        .collect();
    boundary.extend((0..WINDOW_MS / 10).map(|i| Arrival {
        at_ms: START_MS + 2 * WINDOW_MS + 10 * i,
        units: 1,
    }));
    patterns.push(Pattern {
        name: "boundary burst (worst case)".to_owned(),
        arrivals: boundary,
    });

    for load in [0.5, 1.0, 1.2, 2.0, 5.0] {
        patterns.push(Pattern {
            name: format!("steady {load}× the limit (Poisson)"),
            arrivals: poisson(&mut rng, per_unit_ms / load, end, |_| 1),
        });
    }

    // Bursts: on average one per window, each 150 hits spread over two seconds.
    let mut bursts = Vec::new();
    for start in poisson(&mut rng, WINDOW_MS as f64, end, |_| 1) {
        for i in 0..150 {
            bursts.push(Arrival {
                at_ms: start.at_ms + i * 2_000 / 150,
                units: 1,
            });
        }
    }
    bursts.sort_by_key(|arrival| arrival.at_ms);
    patterns.push(Pattern {
        name: "bursts of 1.5× the limit in 2 s, one a window".to_owned(),
        arrivals: bursts,
    });

    patterns.push(Pattern {
        name: "weighted: 1–10 units a hit, 2× the limit".to_owned(),
        arrivals: poisson(&mut rng, per_unit_ms * 5.5 / 2.0, end, |rng| {
            rng.u64(1..=10)
        }),
    });
    patterns
}

/// Units admitted, by time, checked against the exact rule as they come.
#[derive(Default)]
struct Tally {
    /// Admissions within the last window: (time, units).
    recent: VecDeque<(u64, u64)>,
    recent_units: u64,
    run: AccuracyRunCounts,
}

#[derive(Default)]
struct AccuracyRunCounts {
    admitted_units: u64,
    worst_interval: u64,
    wrongly_admitted: u64,
    admissions: u64,
    wrongly_refused: u64,
    refusals: u64,
}

impl Tally {
    /// Forgets admissions that have left the window ending at `now_ms` (an admission at `t`
    /// counts at `now_ms` while `now_ms - t < window`).
    fn age(&mut self, now_ms: u64) {
        while let Some(&(at, units)) = self.recent.front() {
            if now_ms - at < WINDOW_MS {
                break;
            }
            self.recent.pop_front();
            self.recent_units -= units;
        }
    }

    fn record(&mut self, arrival: Arrival, admitted: bool) {
        self.age(arrival.at_ms);
        let fits = self.recent_units + arrival.units <= LIMIT;
        let run = &mut self.run;
        if admitted {
            run.admissions += 1;
            run.admitted_units += arrival.units;
            if !fits {
                run.wrongly_admitted += 1;
            }
            self.recent.push_back((arrival.at_ms, arrival.units));
            self.recent_units += arrival.units;
            run.worst_interval = run.worst_interval.max(self.recent_units);
        } else {
            run.refusals += 1;
            if fits {
                run.wrongly_refused += 1;
            }
        }
    }
}

/// Units the exact rule admits on `arrivals`.
fn exact_units(arrivals: &[Arrival]) -> u64 {
    let mut tally = Tally::default();
    for &arrival in arrivals {
        tally.age(arrival.at_ms);
        let fits = tally.recent_units + arrival.units <= LIMIT;
        tally.record(arrival, fits);
    }
    tally.run.admitted_units
}

fn window_algorithm(algorithm: Algorithm) -> WindowAlgorithm {
    match algorithm {
        Algorithm::Counter => WindowAlgorithm::SlidingWindowCounter,
        Algorithm::Log => WindowAlgorithm::SlidingWindowLog,
    }
}

/// Sends `pattern` through tollgate's memory backend and checks every answer.
async fn simulate(
    pattern: &Pattern,
    algorithm: Algorithm,
    shards: u16,
    windows: u64,
) -> anyhow::Result<AccuracyRun> {
    let clock = ManualClock::new(START_MS);
    let backend = Sharded::new(MemoryBackend::with_clock(Arc::new(clock.clone())));
    let mut tally = Tally::default();
    for &arrival in &pattern.arrivals {
        clock.set(arrival.at_ms);
        let hit = Hit {
            key: "accuracy".to_owned(),
            algorithm: window_algorithm(algorithm),
            limit: LIMIT,
            window_ms: WINDOW_MS,
            cost: Cost::Consume(arrival.units),
            counting: Counting::Admitted,
            shards,
            lease_ms: 0,
            tentative: false,
            group: 0,
            descriptor_tag: false,
            slice: false,
        };
        let outcome = backend
            .acquire(std::slice::from_ref(&hit))
            .await
            .pop()
            .context("the memory backend answered no hit")?
            .context("the memory backend failed")?;
        tally.record(arrival, outcome.verdict.admitted);
    }
    let run = tally.run;
    Ok(AccuracyRun {
        pattern: pattern.name.clone(),
        algorithm,
        shards,
        windows,
        hits: pattern.arrivals.len() as u64,
        admitted_units: run.admitted_units,
        exact_units: exact_units(&pattern.arrivals),
        worst_interval: run.worst_interval,
        wrongly_admitted: run.wrongly_admitted,
        admissions: run.admissions,
        wrongly_refused: run.wrongly_refused,
        refusals: run.refusals,
    })
}

/// Bytes of one key holding `hits` hits, in the memory backend and in Redis at `redis_url`.
async fn memory_per_hit(
    bench: &Bench,
    redis_url: &str,
    algorithm: Algorithm,
    hits: u64,
) -> anyhow::Result<Vec<MemoryPerHit>> {
    let hit = |key: &str| Hit {
        key: key.to_owned(),
        algorithm: window_algorithm(algorithm),
        limit: 10 * hits,
        window_ms: 3_600_000,
        cost: Cost::Consume(1),
        counting: Counting::Admitted,
        shards: 1,
        lease_ms: 0,
        tentative: false,
        group: 0,
        descriptor_tag: false,
        slice: false,
    };
    let key = format!("perhit-{}-{hits}", algorithm.name());
    let memory = MemoryBackend::new();
    let redis = RedisBackend::connect(redis_url, "accuracy:", Duration::from_secs(2))
        .await
        .map_err(|error| anyhow::anyhow!("connecting to {redis_url}: {error}"))?;
    let one = [hit(&key)];
    for _ in 0..hits {
        for answer in memory.acquire(&one).await {
            answer.context("the memory backend failed")?;
        }
        for answer in redis.acquire(&one).await {
            answer.map_err(|error| anyhow::anyhow!("redis: {error}"))?;
        }
    }
    let held = memory.usage();
    let nodes = bench.servers.nodes(StandBackend::Redis)?;
    let server = nodes.masters().first().context("no redis server")?;
    let keys = server.cli(&["--scan", "--pattern", &format!("accuracy:*{key}*")]);
    let mut redis_bytes = 0;
    let mut found = 0;
    for redis_key in keys.lines().filter(|line| !line.is_empty()) {
        let usage = server.cli(&["MEMORY", "USAGE", redis_key, "SAMPLES", "0"]);
        redis_bytes += usage
            .trim()
            .parse::<u64>()
            .with_context(|| format!("MEMORY USAGE {redis_key}: {usage}"))?;
        found += 1;
    }
    if found == 0 {
        bail!("no Redis key for {key}: {keys}");
    }
    Ok(vec![
        MemoryPerHit {
            store: "memory".to_owned(),
            algorithm,
            hits,
            bytes: held.bytes,
        },
        MemoryPerHit {
            store: "redis".to_owned(),
            algorithm,
            hits,
            bytes: redis_bytes,
        },
    ])
}

impl Scenario for Accuracy {
    fn name(&self) -> ScenarioName {
        ScenarioName::Accuracy
    }

    fn run(&self, bench: &mut Bench) -> anyhow::Result<()> {
        let windows = self
            .options
            .windows
            .unwrap_or(if bench.scale.quick { 20 } else { 500 });
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("starting a runtime")?;
        for pattern in patterns(windows, self.options.seed) {
            for algorithm in [Algorithm::Counter, Algorithm::Log] {
                let run = runtime.block_on(simulate(&pattern, algorithm, 1, windows))?;
                say(&format!(
                    "  accuracy {} {}: worst interval {} of {LIMIT}, {} of {} admissions wrong",
                    pattern.name,
                    algorithm.name(),
                    run.worst_interval,
                    run.wrongly_admitted,
                    run.admissions
                ));
                bench.records.record("run", &run)?;
            }
        }
        // Sharding: the budget split over shards, at twice the limit.
        let steady = patterns(windows, self.options.seed)
            .into_iter()
            .find(|pattern| pattern.name.starts_with("steady 2×"))
            .context("no steady pattern at twice the limit")?;
        for shards in [4, 8] {
            for algorithm in [Algorithm::Counter, Algorithm::Log] {
                // The sharded adaptor picks its shards with this thread's generator (the
                // simulation runs here): seeded, these rows come out the same on every run too.
                fastrand::seed(self.options.seed ^ u64::from(shards));
                let run = runtime.block_on(simulate(&steady, algorithm, shards, windows))?;
                bench.records.record("run", &run)?;
            }
        }
        bench.servers.ensure(StandBackend::Redis);
        let url = {
            let nodes = bench.servers.nodes(StandBackend::Redis)?;
            let server = nodes.masters().first().context("no redis server")?;
            server.url()
        };
        for algorithm in [Algorithm::Counter, Algorithm::Log] {
            for hits in [100, 10_000] {
                for row in runtime.block_on(memory_per_hit(bench, &url, algorithm, hits))? {
                    bench.records.record("bytes", &row)?;
                }
            }
        }
        Ok(())
    }

    fn render(&self, records: &[Value]) -> anyhow::Result<String> {
        render(records)
    }
}

fn share(part: u64, whole: u64) -> String {
    if whole == 0 {
        "–".to_owned()
    } else {
        format!("{:.3}%", part as f64 * 100.0 / whole as f64)
    }
}

/// The accuracy section of the report: per traffic pattern, how far each algorithm's
/// admissions are from the exact limit; then the bytes one key takes by the hits it holds.
pub fn render(records: &[Value]) -> anyhow::Result<String> {
    let conditions = conditions_of(records)?;
    let runs: Vec<AccuracyRun> = runs_of(records, "accuracy")?;
    let bytes: Vec<MemoryPerHit> = records_of(records, "bytes")?;
    let first = &runs[0];
    let mut out = String::new();
    let _ = writeln!(
        out,
        "### Accuracy of the algorithms\n\nSimulated {} at commit `{}`: tollgate's memory \
         backend under a manual clock, {} windows of one minute per pattern, a limit of {LIMIT} \
         units a minute, arrival times from a seeded generator (the same numbers on every \
         machine). *Worst*: the most units admitted in any one-minute interval, over the limit. \
         *Wrongly admitted*: admissions that took the minute ending at the hit above the limit. \
         *÷ exact*: units admitted over units the exact rule admits on the same arrivals.\n",
        conditions.started, conditions.machine.commit, first.windows,
    );
    let mut table = Table::new(&[
        ("traffic", Align::Left),
        ("shards", Align::Right),
        ("counter worst", Align::Right),
        ("counter wrongly admitted", Align::Right),
        ("counter ÷ exact", Align::Right),
        ("log worst", Align::Right),
        ("log wrongly admitted", Align::Right),
        ("log ÷ exact", Align::Right),
    ]);
    for (pattern, shards) in distinct(runs.iter().map(|r| (r.pattern.as_str(), r.shards))) {
        let mut row = vec![pattern.to_owned(), shards.to_string()];
        for algorithm in [Algorithm::Counter, Algorithm::Log] {
            let run = runs
                .iter()
                .find(|r| r.pattern == pattern && r.shards == shards && r.algorithm == algorithm);
            row.extend(match run {
                Some(run) => [
                    format!("{:.2}×", run.worst_interval as f64 / LIMIT as f64),
                    share(run.wrongly_admitted, run.admissions),
                    fixed(
                        Some(run.admitted_units as f64 / run.exact_units.max(1) as f64),
                        3,
                    ),
                ],
                None => ["–".to_owned(), "–".to_owned(), "–".to_owned()],
            });
        }
        table.row(row);
    }
    out.push_str(&table.render());
    let _ = writeln!(
        out,
        "\nBytes of one key by the hits it holds: the memory backend's own accounting (one key \
         alone, its tables' smallest allocation included), and `MEMORY USAGE` of the keys \
         tollgate's scripts write in Redis (a log is a sorted set, packed up to 128 entries).\n"
    );
    let held = distinct(bytes.iter().map(|r| r.hits));
    let mut columns = vec![("store", Align::Left), ("algorithm", Align::Left)];
    let names: Vec<String> = held
        .iter()
        .map(|hits| format!("{} hits: bytes", count(Some(*hits as f64))))
        .collect();
    columns.extend(names.iter().map(|name| (name.as_str(), Align::Right)));
    let mut table = Table::new(&columns);
    for (store, algorithm) in distinct(bytes.iter().map(|r| (r.store.as_str(), r.algorithm))) {
        let mut row = vec![store.to_owned(), algorithm.name().to_owned()];
        for hits in &held {
            let key = bytes
                .iter()
                .find(|r| r.store == store && r.algorithm == algorithm && r.hits == *hits);
            row.push(key.map_or("–".to_owned(), |r| count(Some(r.bytes as f64))));
        }
        table.row(row);
    }
    out.push_str(&table.render());
    Ok(out)
}
