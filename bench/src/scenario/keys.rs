//! `keys`: how many keys a sliding window log limit keyed per client keeps in one Redis while
//! its clients send, and how long they stay after the last hit.
//!
//! One descriptor per window (`window: 1s`, `window: 4s` by default), its value the client's
//! number: N clients each send a few hits, in turn, spread evenly over the load's length (open
//! loop), so every client is active all along. While the load runs, and then every ~250 ms after
//! its last answer until no key is left (or 30 s have passed), the scenario counts the keys under
//! the run's key prefix (`SCAN` with `MATCH`, which also drops keys whose time is up, so a key
//! past its expiry never counts). Reported: keys per active client during the load, and the
//! seconds from the last hit until every key was gone, beside the bound the product promises:
//! three windows plus one second. It only measures: whatever the keys' lifetime is, it says so.

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tollgate_testkit::redis::RedisServer;

use crate::doc::{Align, Table, count, fixed, median, opening, plural, range};
use crate::load::generator::Shape;
use crate::load::keys::KeySampler;
use crate::load::summary::Summary;
use crate::scenario::{
    Algorithm, Bench, DOMAIN, Scenario, ScenarioName, conditions_of, distinct, runs_of, say,
};
use crate::stand::{Backend, KEY_PREFIX, Stand};

/// The options of `keys`.
#[derive(Debug, Clone, clap::Args)]
pub struct KeysOptions {
    /// Windows of the per-client limit, whole seconds, comma-separated, each a point of its own.
    #[arg(long = "windows", value_delimiter = ',', default_values = ["1s", "4s"], value_parser = humantime::parse_duration)]
    pub windows: Vec<Duration>,

    /// Clients, each its own descriptor value and so its own key.
    #[arg(long, default_value_t = 2_000, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub clients: u64,

    /// Hits each client sends over the load.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=1_000))]
    pub hits: u64,

    /// Hits a window each client may make (above `--hits`, so every hit is admitted and stored).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub limit: u64,

    /// Calls in flight at most.
    #[arg(long = "concurrency", default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub concurrency: u32,

    /// How long to wait for the keys to go after the last hit.
    #[arg(long = "wait", default_value = "30s", value_parser = humantime::parse_duration)]
    pub wait: Duration,
}

/// The `keys` scenario.
pub struct Keys {
    options: KeysOptions,
}

impl Keys {
    /// The scenario with `options`.
    pub fn new(options: KeysOptions) -> Keys {
        Keys { options }
    }
}

/// One count of the keys.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct Sample {
    /// When, in seconds: from the load's start (during it) or from its last answer (after).
    pub seconds: f64,
    /// Keys under the prefix.
    pub keys: u64,
}

/// One measured run of one window.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct KeysRun {
    /// The limit's window, in seconds.
    pub window_seconds: f64,
    /// Run number, from 1.
    pub run: u32,
    /// Clients.
    pub clients: u64,
    /// Hits each client sent.
    pub hits_per_client: u64,
    /// Hits a window each client may make.
    pub limit: u64,
    /// How long the load was scheduled to last, in seconds.
    #[serde(default)]
    pub spread_seconds: f64,
    /// What the load generator saw.
    pub load: Summary,
    /// Counts while the load ran, and one as it ended.
    pub during: Vec<Sample>,
    /// Counts after the last answer, until none was left or the wait ended.
    pub after: Vec<Sample>,
    /// Seconds from the last answer to the first count of no key, if there was one.
    pub gone_after_seconds: Option<f64>,
    /// How long the scenario waited at most.
    pub wait_seconds: f64,
}

impl KeysRun {
    /// The most keys any count during the load saw.
    pub fn peak(&self) -> Option<u64> {
        self.during.iter().map(|s| s.keys).max()
    }

    /// Keys per client at the peak: every client is active all along the load.
    pub fn per_client(&self) -> Option<f64> {
        let peak = self.peak()?;
        (self.clients > 0).then(|| peak as f64 / self.clients as f64)
    }

    /// The bound the product promises for the keys of an idle limiter: three windows plus one
    /// second after the last hit.
    pub fn bound_seconds(&self) -> f64 {
        3.0 * self.window_seconds + 1.0
    }
}

/// The descriptor key of the limit of `window`.
fn client_key(window: Duration) -> String {
    format!("client_{}s", window.as_secs())
}

/// The policy: one per-client log limit per window.
fn keys_policy(options: &KeysOptions) -> String {
    let mut yaml = format!("domain: {DOMAIN}\ndescriptors:\n");
    for &window in &options.windows {
        let _ = writeln!(
            yaml,
            "  - key: {}\n    rate_limit: {{window: {}s, requests_per_unit: {}, algorithm: {}}}",
            client_key(window),
            window.as_secs(),
            options.limit,
            Algorithm::Log.policy_name(),
        );
    }
    yaml
}

/// How often the keys are counted.
const EVERY: Duration = Duration::from_millis(250);

/// The keys under the prefix on `server`, past-expiry ones left out.
fn resident(server: &RedisServer) -> u64 {
    server.keys(&format!("{KEY_PREFIX}*")).len() as u64
}

/// Counts the keys every [`EVERY`] until `stop` is set, from `start`.
fn count_while(server: &RedisServer, start: Instant, stop: &AtomicBool) -> Vec<Sample> {
    let mut samples = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let keys = resident(server);
        samples.push(Sample {
            seconds: start.elapsed().as_secs_f64(),
            keys,
        });
        std::thread::sleep(EVERY);
    }
    samples
}

impl Scenario for Keys {
    fn name(&self) -> ScenarioName {
        ScenarioName::Keys
    }

    fn run(&self, bench: &mut Bench) -> anyhow::Result<()> {
        let options = &self.options;
        if let Some(window) = options
            .windows
            .iter()
            .find(|w| w.as_secs() == 0 || w.subsec_nanos() != 0)
        {
            bail!(
                "--windows: {} is not a whole number of seconds of at least 1s",
                humantime::format_duration(*window)
            );
        }
        let policy = keys_policy(options);
        bench.servers.ensure(Backend::Redis);
        let (servers, tools) = bench.split();
        let stand = Stand::start(servers, Backend::Redis, &policy, "deny")?;
        let server = *stand
            .nodes
            .masters()
            .first()
            .ok_or_else(|| anyhow!("no Redis server behind the stand"))?;
        let connections = tools.loader.connect(&[stand.grpc_addr()], 2)?;
        // The load lasts the scale's run length, at least a second, so every client's hits are
        // spread over it.
        let spread = tools.scale.duration.max(Duration::from_secs(1));
        let calls = options.clients * options.hits;
        let rate = calls as f64 / spread.as_secs_f64();
        for run in 1..=tools.scale.runs {
            for &window in &options.windows {
                stand.nodes.flush();
                let shape = Arc::new(Shape {
                    domain: DOMAIN.to_owned(),
                    entry_keys: vec![client_key(window)],
                    sampler: KeySampler::sequential(0, options.clients),
                    hits_addend: 1,
                    descriptor_hits_addend: None,
                });
                let stop = AtomicBool::new(false);
                let start = Instant::now();
                let (load, during) = std::thread::scope(|scope| {
                    let counter = scope.spawn(|| count_while(server, start, &stop));
                    let load = tools.loader.drive_count(
                        &connections,
                        &shape,
                        options.concurrency,
                        Some(rate),
                        calls,
                    );
                    stop.store(true, Ordering::Relaxed);
                    let during = counter
                        .join()
                        .map_err(|_| anyhow!("the key counter stopped abnormally"));
                    (load, during)
                });
                let (load, mut during_samples) = (load?, during?);
                let ended = Instant::now();
                during_samples.push(Sample {
                    seconds: start.elapsed().as_secs_f64(),
                    keys: resident(server),
                });
                let mut after = Vec::new();
                let mut gone_after_seconds = None;
                loop {
                    let seconds = ended.elapsed().as_secs_f64();
                    let keys = resident(server);
                    after.push(Sample { seconds, keys });
                    if keys == 0 {
                        gone_after_seconds = Some(seconds);
                        break;
                    }
                    if ended.elapsed() >= options.wait {
                        break;
                    }
                    std::thread::sleep(EVERY);
                }
                let result = KeysRun {
                    window_seconds: window.as_secs_f64(),
                    run,
                    clients: options.clients,
                    hits_per_client: options.hits,
                    limit: options.limit,
                    spread_seconds: spread.as_secs_f64(),
                    load,
                    during: during_samples,
                    after,
                    gone_after_seconds,
                    wait_seconds: options.wait.as_secs_f64(),
                };
                say(&format!(
                    "  keys window {} run {run}: {} decisions, peak {} keys ({} per client), gone after {} (bound {:.1} s), errors {}",
                    humantime::format_duration(window),
                    result.load.decisions,
                    count(result.peak().map(|p| p as f64)),
                    fixed(result.per_client(), 2),
                    result
                        .gone_after_seconds
                        .map_or_else(|| "never".to_owned(), |s| format!("{s:.2} s")),
                    result.bound_seconds(),
                    result.load.errors,
                ));
                tools.records.record("run", &result)?;
            }
        }
        Ok(())
    }

    fn render(&self, records: &[Value]) -> anyhow::Result<String> {
        render(records)
    }
}

/// The keys section of the report.
pub fn render(records: &[Value]) -> anyhow::Result<String> {
    let conditions = conditions_of(records)?;
    let runs: Vec<KeysRun> = runs_of(records, "keys")?;
    let first = &runs[0];
    let mut out = String::new();
    let _ = writeln!(
        out,
        "**Keys a per-client log limit keeps in Redis.** {} A sliding window log limit of {} \
         hits a window keyed per client (one descriptor value per client), on one Redis: {} \
         clients send {} hits each, in turn, open loop spread evenly over {} s, so every client \
         is active all along. The keys under the run's prefix are counted \
         with `SCAN … MATCH` (which leaves out keys past their expiry) every {} ms during the \
         load and after its last answer, until none is left or {} s have passed. *Keys per \
         client*: the most counted during the load over the clients. *Gone after*: from the \
         last answer to the first count of no key (to within {} ms); *bound*: three windows \
         plus one second, what the product promises.\n",
        opening(
            &conditions,
            &format!(
                "Every window: {} run{}; tables give the median and the min–max of the runs.",
                conditions.runs,
                plural(u64::from(conditions.runs))
            )
        ),
        first.limit,
        count(Some(first.clients as f64)),
        first.hits_per_client,
        first.spread_seconds,
        EVERY.as_millis(),
        first.wait_seconds,
        EVERY.as_millis(),
    );
    let mut table = Table::new(&[
        ("window", Align::Left),
        ("clients", Align::Right),
        ("decisions/s", Align::Right),
        ("keys at peak", Align::Right),
        ("keys per client", Align::Right),
        ("keys at the last hit", Align::Right),
        ("gone after s", Align::Right),
        ("min–max", Align::Right),
        ("bound s", Align::Right),
        ("within the bound", Align::Right),
        ("errors", Align::Right),
    ]);
    let windows = distinct(runs.iter().map(|r| r.window_seconds.to_bits()));
    let mut notes = Vec::new();
    for bits in windows {
        let of: Vec<&KeysRun> = runs
            .iter()
            .filter(|r| r.window_seconds.to_bits() == bits)
            .collect();
        let window = f64::from_bits(bits);
        let gone: Vec<f64> = of.iter().filter_map(|r| r.gone_after_seconds).collect();
        let within = of
            .iter()
            .filter(|r| r.gone_after_seconds.is_some_and(|s| s <= r.bound_seconds()))
            .count();
        let gone_cell = if gone.len() == of.len() {
            fixed(median(gone.iter().copied()), 2)
        } else {
            format!(
                "over {} in {} of {}",
                of[0].wait_seconds,
                of.len() - gone.len(),
                of.len()
            )
        };
        let bound = of[0].bound_seconds();
        table.row(vec![
            format!("{}", crate::doc::seconds(window)),
            count(Some(of[0].clients as f64)),
            count(median(of.iter().map(|r| r.load.decisions_per_second))),
            count(median(of.iter().filter_map(|r| r.peak().map(|p| p as f64)))),
            fixed(median(of.iter().filter_map(|r| r.per_client())), 2),
            count(median(
                of.iter()
                    .filter_map(|r| r.during.last().map(|s| s.keys as f64)),
            )),
            gone_cell,
            range(gone.iter().copied()).map_or_else(
                || crate::doc::NONE.to_owned(),
                |(a, b)| format!("{a:.2}–{b:.2}"),
            ),
            fixed(Some(bound), 1),
            format!("{within} of {}", of.len()),
            of.iter()
                .map(|r| r.load.errors + r.load.unknown)
                .sum::<u64>()
                .to_string(),
        ]);
        notes.push(format!(
            "`window: {}` {} ({} the bound of {:.1} s)",
            crate::doc::seconds(window),
            median(gone.iter().copied()).map_or_else(
                || "not gone within the wait".to_owned(),
                |s| format!("{s:.2} s")
            ),
            crate::doc::times(median(gone.iter().copied()).map(|s| s / bound)),
            bound,
        ));
    }
    out.push_str(&table.render());
    let _ = writeln!(
        out,
        "\nSeconds from the last hit until every key was gone, same run: {}.",
        notes.join("; ")
    );
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_policy_declares_one_log_limit_per_window() {
        let options = KeysOptions {
            windows: vec![Duration::from_secs(1), Duration::from_millis(4_000)],
            clients: 10,
            hits: 2,
            limit: 100,
            concurrency: 4,
            wait: Duration::from_secs(30),
        };
        assert_eq!(
            keys_policy(&options),
            "domain: bench\ndescriptors:\n\
             \x20 - key: client_1s\n    rate_limit: {window: 1s, requests_per_unit: 100, algorithm: sliding_window_log}\n\
             \x20 - key: client_4s\n    rate_limit: {window: 4s, requests_per_unit: 100, algorithm: sliding_window_log}\n"
        );
    }
}
