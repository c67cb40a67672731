//! `envoy`: what a global limit costs a request that goes through Envoy, with the RLS filter
//! (a call to tollgate on every request) and with the RLQS filter (tollgate assigns each Envoy
//! a slice of the limit over one stream, and Envoy decides locally), beside Envoy with no
//! rate-limit filter at all.
//!
//! Five Envoys (one worker each) in front of one tollgate on one Redis, the same plain `GET`
//! requests from h2load to each, one after the other in each run, rotating which goes first:
//!
//! - *no filter*: Envoy alone, the floor;
//! - *RLS*: the `ratelimit` filter, one `ShouldRateLimit` call per request, one script call in
//!   Redis per decision;
//! - *RLS, leased*: the same filter on a limit with `lease: true`, so tollgate decides from a
//!   slice it holds and calls Redis about twice per slice (the cache and leases of
//!   [leases.md](../../docs/leases.md));
//! - *RLQS*: the `rate_limit_quota` filter, its bucket resolving to the same limit as RLS;
//! - *RLQS, many buckets*: the same filter, the requests going to many paths and its bucket id
//!   taking the path, so tollgate keeps many slices: what one (Envoy, bucket) pair costs.
//!
//! Every other request carries the same `x-user`, under a limit no load reaches, so every request is
//! admitted and counted. Per run, saturated (closed loop: h2load's connections × streams) and
//! paced (a fixed rate below every setup's saturation, for the latency a request gains). Costs
//! per request: Envoy's, tollgate's and Redis's CPU, calls to tollgate (RLS calls; RLQS stream
//! messages, both directions) and Redis script calls. From these, the report sizes tollgate and
//! Redis for 10^5, 10^6 and 10^7 requests a second over many Envoys.

use std::fmt::Write as _;
use std::time::Duration;

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tollgate_testkit::envoy::{Action, Envoy, rlqs_bootstrap, rlqs_bootstrap_by};

use crate::doc::{Align, Table, count, fixed, measured, median, ms, percent, times_by_run};
use crate::h2load::{self, H2Load, H2LoadOptions, H2LoadSummary};
use crate::scenario::{
    Algorithm, Bench, DOMAIN, Scenario, ScenarioName, UNREACHABLE_LIMIT, conditions_of, records_of,
    rotation, run_ratios, say,
};
use crate::stand::{Backend, Stand, command_stats, script_calls};

/// The options of `envoy`.
#[derive(Debug, Clone, clap::Args)]
pub struct EnvoyOptions {
    /// The saturated runs' load.
    #[command(flatten)]
    pub h2load: H2LoadOptions,

    /// Requests a second of the paced runs, over all connections: below what every setup
    /// answers, so their latency is a request's, not a queue's.
    #[arg(long, default_value_t = 1_000, value_parser = clap::value_parser!(u32).range(1..))]
    pub paced_rate: u32,

    /// Buckets of the many-bucket RLQS Envoy: its requests go to this many paths in turn, and
    /// its bucket id takes the path.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub buckets: u32,
}

/// The `envoy` scenario.
pub struct EnvoyScenario {
    options: EnvoyOptions,
}

impl EnvoyScenario {
    /// The scenario with `options`.
    pub fn new(options: EnvoyOptions) -> EnvoyScenario {
        EnvoyScenario { options }
    }
}

/// What stands between the client and the upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Setup {
    /// Envoy with no rate-limit filter.
    NoFilter,
    /// The RLS filter: one call to tollgate per request.
    Rls,
    /// The RLS filter on a leased limit.
    RlsLeased,
    /// The RLQS filter: slices over one stream.
    Rlqs,
    /// The RLQS filter, the requests spread over many buckets.
    RlqsBuckets,
}

impl Setup {
    /// Every setup, in the order of the tables.
    pub const ALL: [Setup; 5] = [
        Setup::NoFilter,
        Setup::Rls,
        Setup::RlsLeased,
        Setup::Rlqs,
        Setup::RlqsBuckets,
    ];

    /// Whether Envoy decides locally, so that it may refuse when an assignment runs out.
    fn may_refuse(self) -> bool {
        matches!(self, Setup::Rlqs | Setup::RlqsBuckets)
    }

    fn label(self) -> &'static str {
        match self {
            Setup::NoFilter => "Envoy, no filter",
            Setup::Rls => "Envoy + RLS",
            Setup::RlsLeased => "Envoy + RLS, leased limit",
            Setup::Rlqs => "Envoy + RLQS",
            Setup::RlqsBuckets => "Envoy + RLQS, many buckets",
        }
    }
}

/// How a run loaded its Envoy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Pace {
    /// Closed loop: as fast as Envoy answers.
    Saturated,
    /// A fixed rate below saturation.
    Paced,
}

/// One measured run of one setup.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EnvoyRun {
    /// Which setup.
    pub setup: Setup,
    /// Saturated or paced.
    pub pace: Pace,
    /// Run number, from 1.
    pub run: u32,
    /// h2load's connections.
    pub connections: u32,
    /// h2load's requests in flight on each connection (saturated runs).
    pub streams: u32,
    /// Requests a second asked of a paced run.
    pub paced_rate: u32,
    /// Buckets the requests went to: one, or the many-bucket Envoy's.
    pub buckets: u32,
    /// The run's length, in seconds.
    pub seconds: f64,
    /// What h2load measured.
    pub load: H2LoadSummary,
    /// What the run cost.
    pub cost: Cost,
}

/// What a run cost Envoy, tollgate and Redis.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Cost {
    /// CPU seconds of the Envoy process.
    pub envoy_cpu_seconds: f64,
    /// CPU seconds of tollgate.
    pub tollgate_cpu_seconds: f64,
    /// CPU seconds of redis-server.
    pub redis_cpu_seconds: f64,
    /// Calls to tollgate: `ShouldRateLimit` calls plus RLQS messages (reports and responses).
    pub tollgate_calls: f64,
    /// Script calls Redis served (`evalsha` and `eval`).
    pub redis_calls: u64,
}

/// The descriptor key the RLS filter and the RLQS bucket id both use.
const KEY: &str = "user";

/// The descriptor key of the leased limit.
const LEASED_KEY: &str = "leased_user";

/// The header every request carries, whose value the descriptors take.
const USER_HEADER: &str = "x-user: bench";

/// One unreachable limit per key, the second leased.
fn policy() -> String {
    let algorithm = Algorithm::Counter.policy_name();
    format!(
        "domain: {DOMAIN}\ndescriptors:\n  - key: {KEY}\n    rate_limit: {{unit: minute, \
         requests_per_unit: {UNREACHABLE_LIMIT}, algorithm: {algorithm}}}\n  - key: {LEASED_KEY}\n    \
         rate_limit: {{unit: minute, requests_per_unit: {UNREACHABLE_LIMIT}, algorithm: \
         {algorithm}, lease: true}}\n"
    )
}

/// The shortest warmup of a setup, whatever the scale.
const MIN_WARMUP: Duration = Duration::from_secs(1);

/// How long an Envoy may take to answer its first request through its filter.
const FIRST_ANSWER: Duration = Duration::from_secs(30);

/// Waits until `envoy` answers `GET path` (with the bench's `x-user`) with 200 or 429, the
/// answers a run counts; fails with the last answer after [`FIRST_ANSWER`].
fn answers_once(envoy: &Envoy, path: &str) -> anyhow::Result<()> {
    let (name, value) = USER_HEADER
        .split_once(": ")
        .context("the user header is `name: value`")?;
    let deadline = std::time::Instant::now() + FIRST_ANSWER;
    loop {
        let reply = envoy.get(path, &[(name, value)]);
        if matches!(reply.status, 200 | 429) {
            return Ok(());
        }
        if std::time::Instant::now() >= deadline {
            bail!(
                "no answer to GET {path} in {FIRST_ANSWER:?}; the last: {} {}\n{}",
                reply.status,
                reply.body,
                envoy.log()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The sum of every sample of the metric `name` (with or without its `_total` suffix) in a
/// Prometheus text exposition.
fn metric_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let rest = line.strip_prefix(name)?;
            let rest = rest.strip_prefix("_total").unwrap_or(rest);
            let value = if rest.starts_with('{') {
                rest.rsplit_once(' ')?.1
            } else {
                rest.strip_prefix(' ')?
            };
            value.trim().parse::<f64>().ok()
        })
        .sum()
}

impl Scenario for EnvoyScenario {
    fn name(&self) -> ScenarioName {
        ScenarioName::Envoy
    }

    fn run(&self, bench: &mut Bench) -> anyhow::Result<()> {
        let options = &self.options;
        bench.servers.ensure(Backend::Redis);
        let h2load = H2Load::get(&["/".to_owned()], &[USER_HEADER])?;
        let paths: Vec<String> = (0..options.buckets).map(|n| format!("/u{n}")).collect();
        let many = H2Load::get(&paths, &[])?;
        let (servers, tools) = bench.split();
        let stand = Stand::start(servers, Backend::Redis, &policy(), "deny")?;
        let redis = stand
            .nodes
            .masters()
            .first()
            .copied()
            .context("the redis backend has no server")?;
        let rls = stand.grpc_addr();
        let user = || vec![Action::header("x-user", KEY)];
        let envoys: [Envoy; 5] = [
            Envoy::builder(DOMAIN, rls).without_filter().start(),
            Envoy::builder(DOMAIN, rls).descriptor(user()).start(),
            Envoy::builder(DOMAIN, rls)
                .descriptor(vec![Action::header("x-user", LEASED_KEY)])
                .start(),
            Envoy::start_with(rlqs_bootstrap(DOMAIN, rls)),
            Envoy::start_with(rlqs_bootstrap_by(DOMAIN, rls, ":path")),
        ];
        let agent = tollgate_testkit::net::agent();
        let tollgate_calls = || {
            let text = tollgate_testkit::net::send(
                &agent,
                "GET",
                &stand.tollgate.url("/metrics"),
                &[],
                None,
            )
            .body;
            metric_sum(&text, "ratelimit_service_total_requests")
                + metric_sum(&text, "tollgate_rlqs_messages")
        };
        // Only an RLQS Envoy may answer 429 here: when its assignment ran out before tollgate
        // renewed it (a renewal late by more than the slice's slack, on a machine this loaded),
        // which is counted and shown. Anything else failed is an error of the run.
        let check = |setup: Setup, load: &H2LoadSummary| {
            if load.failed == 0 || setup.may_refuse() {
                return Ok(());
            }
            bail!(
                "{} failed {} of {} requests:\n{}\ntollgate:\n{}",
                setup.label(),
                load.failed,
                load.done,
                envoys[setup as usize].log(),
                stand.tollgate.log(),
            )
        };
        let envoy_cpu = |setup: Setup| {
            let pid = envoys[setup as usize]
                .pid()
                .with_context(|| format!("{} is not running", setup.label()))?;
            crate::proc::cpu_seconds(pid)
        };
        let readings = |setup: Setup| {
            stand.nodes.reset_stats();
            anyhow::Ok(Cost {
                envoy_cpu_seconds: envoy_cpu(setup)?,
                tollgate_cpu_seconds: stand.tollgate_cpu_seconds()?,
                redis_cpu_seconds: stand.redis_cpu_seconds()?,
                tollgate_calls: tollgate_calls(),
                redis_calls: 0,
            })
        };
        let cost_since = |setup: Setup, before: Cost| {
            anyhow::Ok(Cost {
                envoy_cpu_seconds: envoy_cpu(setup)? - before.envoy_cpu_seconds,
                tollgate_cpu_seconds: stand.tollgate_cpu_seconds()? - before.tollgate_cpu_seconds,
                redis_cpu_seconds: stand.redis_cpu_seconds()? - before.redis_cpu_seconds,
                tollgate_calls: tollgate_calls() - before.tollgate_calls,
                redis_calls: script_calls(&command_stats(redis)?),
            })
        };
        let target = |setup: Setup| envoys[setup as usize].edge_addr();
        let run_once = |setup: Setup, pace: Pace, duration: Duration| {
            let h2load = if setup == Setup::RlqsBuckets {
                &many
            } else {
                &h2load
            };
            match pace {
                Pace::Saturated => h2load.run(target(setup), duration, &options.h2load),
                Pace::Paced => {
                    h2load.run_paced(target(setup), duration, options.paced_rate, &options.h2load)
                }
            }
        };
        // Each Envoy first answers one request on its own: Envoy is LIVE before its first
        // connection to tollgate is up, and a cold start on a loaded machine can outlast a
        // short timed warmup, which would then see no answer at all.
        for setup in Setup::ALL {
            let path = if setup == Setup::RlqsBuckets {
                "/u0"
            } else {
                "/"
            };
            answers_once(&envoys[setup as usize], path).with_context(|| {
                format!(
                    "{} never answered:\n{}",
                    setup.label(),
                    stand.tollgate.log()
                )
            })?;
        }
        // The warmup opens every connection, loads the scripts, takes the first lease and
        // brings RLQS its first assignment. It lasts a second even at smoke scale: h2load's
        // first 128 requests on fresh connections through Envoy and its filter can take longer
        // than a smoke run's 100 ms on a loaded machine, and a warmup that sees no answer fails.
        for setup in Setup::ALL {
            let warmup = tools.scale.warmup.max(MIN_WARMUP);
            let warm = run_once(setup, Pace::Saturated, warmup).with_context(|| {
                format!("the warmup of {}:\n{}", setup.label(), stand.tollgate.log())
            })?;
            check(setup, &warm)?;
        }
        for run in 1..=tools.scale.runs {
            for pace in [Pace::Saturated, Pace::Paced] {
                for index in rotation(run, Setup::ALL.len()) {
                    let setup = Setup::ALL[index];
                    let before = readings(setup)?;
                    let load = run_once(setup, pace, tools.scale.duration)?;
                    let cost = cost_since(setup, before)?;
                    check(setup, &load)?;
                    say(&format!(
                        "  envoy run {run} {} {pace:?}: {}/s, mean {} ms",
                        setup.label(),
                        count(Some(load.requests_per_second)),
                        ms(Some(load.mean_latency_us)),
                    ));
                    tools.records.record(
                        "run",
                        &EnvoyRun {
                            setup,
                            pace,
                            run,
                            connections: options.h2load.connections,
                            streams: options.h2load.streams,
                            paced_rate: options.paced_rate,
                            buckets: if setup == Setup::RlqsBuckets {
                                options.buckets
                            } else {
                                1
                            },
                            seconds: tools.scale.duration.as_secs_f64(),
                            load,
                            cost,
                        },
                    )?;
                }
            }
        }
        Ok(())
    }

    fn render(&self, records: &[Value]) -> anyhow::Result<String> {
        render(records)
    }
}

/// A setup's per-request figures: the medians of its saturated runs.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PerRequest {
    /// Requests a second through Envoy.
    pub rate: f64,
    /// Envoy's CPU µs.
    pub envoy_us: f64,
    /// tollgate's CPU µs.
    pub tollgate_us: f64,
    /// Redis's CPU µs.
    pub redis_us: f64,
    /// Calls to tollgate.
    pub tollgate_calls: f64,
    /// Redis script calls.
    pub redis_calls: f64,
}

impl PerRequest {
    fn of<'a>(runs: impl Iterator<Item = &'a EnvoyRun> + Clone) -> PerRequest {
        let per = |f: fn(&EnvoyRun) -> f64| {
            median(
                runs.clone()
                    .filter(|r| r.load.succeeded > 0)
                    .map(|r| f(r) / r.load.succeeded as f64),
            )
            .unwrap_or(0.0)
        };
        PerRequest {
            rate: median(runs.clone().map(|r| r.load.requests_per_second)).unwrap_or(0.0),
            envoy_us: per(|r| r.cost.envoy_cpu_seconds * 1e6),
            tollgate_us: per(|r| r.cost.tollgate_cpu_seconds * 1e6),
            redis_us: per(|r| r.cost.redis_cpu_seconds * 1e6),
            tollgate_calls: per(|r| r.cost.tollgate_calls),
            redis_calls: per(|r| r.cost.redis_calls as f64),
        }
    }
}

/// The `envoy` section of the report.
pub fn render(records: &[Value]) -> anyhow::Result<String> {
    let conditions = conditions_of(records)?;
    let runs: Vec<EnvoyRun> = records_of(records, "run")?;
    let Some(first) = runs.first() else {
        bail!("no envoy runs");
    };
    let mut out = String::new();
    let _ = writeln!(
        out,
        "### Envoy with RLS and with RLQS\n\n{} Five Envoys (one worker each) in front of one \
         tollgate on one redis-server: no rate-limit filter; the RLS filter (a `ShouldRateLimit` \
         call per request); the RLS filter on a `lease: true` limit; the RLQS filter (slices of \
         the limit over one stream); the RLQS filter with its requests spread over {} paths, \
         its bucket id the path. Every other request is h2load's `GET /` with the same \
         `x-user`. Every limit is out of the load's reach, so every request is admitted and \
         counted. *Saturated*: \
         {} connections × {} requests in flight; *paced*: {} requests a second, where latency \
         is a request's own. Each run measures every Envoy, rotating which goes first. *Refused*: \
         requests Envoy answered 429, the share of the run's. CPU per request: each process's; *calls to tollgate*: `ShouldRateLimit` calls and RLQS \
         messages both ways, counted by tollgate while the run lasts, so each row also holds the \
         idle RLQS Envoys' renewals (Envoy alone's row shows how many); *Redis calls*: `evalsha` and `eval` (`INFO commandstats`).\n",
        measured(&conditions),
        runs.iter().map(|r| r.buckets).max().unwrap_or(1),
        first.connections,
        first.streams,
        first.paced_rate,
    );
    let mut table = Table::new(&[
        ("saturated", Align::Left),
        ("requests/s", Align::Right),
        ("min–max", Align::Right),
        ("mean ms", Align::Right),
        ("refused", Align::Right),
        ("Envoy CPU µs/request", Align::Right),
        ("tollgate CPU µs/request", Align::Right),
        ("Redis CPU µs/request", Align::Right),
        ("calls to tollgate/request", Align::Right),
        ("Redis calls/request", Align::Right),
    ]);
    let of = |setup: Setup, pace: Pace| {
        runs.iter()
            .filter(move |r| r.setup == setup && r.pace == pace)
    };
    for setup in Setup::ALL {
        let saturated = of(setup, Pace::Saturated);
        if saturated.clone().next().is_none() {
            continue;
        }
        let per = PerRequest::of(saturated.clone());
        let mut row = vec![setup.label().to_owned()];
        row.extend(h2load::load_cells(saturated.clone().map(|r| &r.load)));
        row.push(percent(median(
            saturated
                .filter(|r| r.load.done > 0)
                .map(|r| r.load.failed as f64 / r.load.done as f64),
        )));
        row.extend([
            fixed(Some(per.envoy_us), 1),
            fixed(Some(per.tollgate_us), 1),
            fixed(Some(per.redis_us), 1),
            fixed(Some(per.tollgate_calls), 4),
            fixed(Some(per.redis_calls), 4),
        ]);
        table.row(row);
    }
    out.push_str(&table.render());
    let ratios = run_ratios(
        &runs
            .iter()
            .filter(|r| r.pace == Pace::Saturated)
            .collect::<Vec<_>>(),
        |r| r.run,
        |r| r.setup == Setup::Rlqs,
        |r| r.setup == Setup::Rls,
        |r| r.load.requests_per_second,
    );
    if !ratios.is_empty() {
        let _ = writeln!(
            out,
            "\nRequests a second through Envoy, RLQS ÷ RLS, the median of the runs' ratios: {}.",
            times_by_run(&ratios)
        );
    }
    let floor = median(of(Setup::NoFilter, Pace::Paced).map(|r| r.load.mean_latency_us));
    let mut paced = Table::new(&[
        ("paced", Align::Left),
        ("requests/s", Align::Right),
        ("mean ms", Align::Right),
        ("added ms", Align::Right),
    ]);
    for setup in Setup::ALL {
        let runs = of(setup, Pace::Paced);
        if runs.clone().next().is_none() {
            continue;
        }
        let mean = median(runs.clone().map(|r| r.load.mean_latency_us));
        paced.row(vec![
            setup.label().to_owned(),
            count(median(runs.map(|r| r.load.requests_per_second))),
            ms(mean),
            if setup == Setup::NoFilter {
                "—".to_owned()
            } else {
                ms(mean.zip(floor).map(|(mean, floor)| mean - floor))
            },
        ]);
    }
    let _ = writeln!(
        out,
        "\nPaced, the mean latency of a request and what the filter adds to Envoy alone's:\n"
    );
    out.push_str(&paced.render());
    out.push_str(&sizing(
        &PerRequest::of(of(Setup::Rls, Pace::Saturated)),
        &PerRequest::of(of(Setup::RlsLeased, Pace::Saturated)),
        &PairCost::of(of(Setup::RlqsBuckets, Pace::Saturated)),
    ));
    Ok(out)
}

/// Requests a second one Envoy serves in the sizing table.
const SIZING_ENVOY_RATE: f64 = 2_000.0;

/// Buckets (limits a request resolves to) active at once on one Envoy in the sizing table.
const SIZING_BUCKETS_PER_ENVOY: f64 = 10.0;

/// The share of a core a Redis shard (one main thread) is planned at.
const REDIS_SHARD_CORE: f64 = 0.7;

/// What one (Envoy, bucket) pair of RLQS costs a second, whatever its rate: each is renewed
/// about as often as a slice lives.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PairCost {
    /// tollgate's CPU µs.
    pub tollgate_us: f64,
    /// Redis's CPU µs.
    pub redis_us: f64,
    /// Stream messages, both ways.
    pub messages: f64,
}

impl PairCost {
    /// The medians over `runs` of the many-bucket Envoy's cost per bucket and second.
    fn of<'a>(runs: impl Iterator<Item = &'a EnvoyRun> + Clone) -> PairCost {
        let per = |f: fn(&Cost) -> f64| {
            median(
                runs.clone()
                    .filter(|r| r.buckets > 0 && r.seconds > 0.0)
                    .map(|r| f(&r.cost) / (f64::from(r.buckets) * r.seconds)),
            )
            .unwrap_or(0.0)
        };
        PairCost {
            tollgate_us: per(|c| c.tollgate_cpu_seconds * 1e6),
            redis_us: per(|c| c.redis_cpu_seconds * 1e6),
            messages: per(|c| c.tollgate_calls),
        }
    }
}

/// The sizing table: tollgate and Redis for 10^5, 10^6 and 10^7 requests a second, from the
/// measured costs of RLS and leased RLS per request and of RLQS per (Envoy, bucket) pair.
fn sizing(rls: &PerRequest, leased: &PerRequest, pair: &PairCost) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\n**Sizing**, from the costs above. RLS costs in proportion to requests; RLQS in \
         proportion to the (Envoy, bucket) pairs active, whatever their rate, since each is \
         renewed about as often as a slice lives: measured on the many-bucket Envoy, a pair \
         costs tollgate {} µs and Redis {} µs of CPU a second in {} messages. Assumed: every \
         Envoy serves {} requests a second and holds {} active buckets (limits its requests \
         resolve to); a Redis shard is planned at {:.0}% of a core (its main thread); the \
         leased row's Redis cost holds for hot limits only, since a lease serves one limit on \
         one instance (a flood of distinct keys costs what RLS does). Cores are this machine's.\n",
        fixed(Some(pair.tollgate_us), 0),
        fixed(Some(pair.redis_us), 0),
        fixed(Some(pair.messages), 1),
        count(Some(SIZING_ENVOY_RATE)),
        SIZING_BUCKETS_PER_ENVOY,
        REDIS_SHARD_CORE * 100.0,
    );
    let mut table = Table::new(&[
        ("requests/s", Align::Right),
        ("Envoys", Align::Right),
        ("RLS: tollgate cores", Align::Right),
        ("Redis shards", Align::Right),
        ("RLS leased: tollgate cores", Align::Right),
        ("Redis shards", Align::Right),
        ("RLQS: tollgate cores", Align::Right),
        ("Redis shards", Align::Right),
    ]);
    let shards = |redis_us_per_second: f64| {
        let cores = redis_us_per_second / 1e6;
        format!("{}", (cores / REDIS_SHARD_CORE).ceil().max(1.0))
    };
    let cores = |us_per_second: f64| fixed(Some(us_per_second / 1e6), 1);
    for rate in [1e5, 1e6, 1e7] {
        let envoys = rate / SIZING_ENVOY_RATE;
        let pairs = envoys * SIZING_BUCKETS_PER_ENVOY;
        table.row(vec![
            count(Some(rate)),
            count(Some(envoys)),
            cores(rate * rls.tollgate_us),
            shards(rate * rls.redis_us),
            cores(rate * leased.tollgate_us),
            shards(rate * leased.redis_us),
            cores(pairs * pair.tollgate_us),
            shards(pairs * pair.redis_us),
        ]);
    }
    out.push_str(&table.render());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_are_summed_over_their_series_with_or_without_the_suffix() {
        let text = "# HELP x\nratelimit_service_total_requests_total{grpc_method=\"ShouldRateLimit\"} 7\n\
                    tollgate_rlqs_messages_total{direction=\"received\"} 2\n\
                    tollgate_rlqs_messages_total{direction=\"sent\"} 3\n\
                    tollgate_rlqs_messages_other 100\n";
        assert_eq!(metric_sum(text, "ratelimit_service_total_requests"), 7.0);
        assert_eq!(metric_sum(text, "tollgate_rlqs_messages"), 5.0);
        assert_eq!(metric_sum(text, "tollgate_missing"), 0.0);
    }

    #[test]
    fn the_policy_has_one_limit_per_key_the_second_leased() {
        let policy = policy();
        assert!(policy.contains("- key: user\n"), "{policy}");
        assert!(policy.contains("- key: leased_user\n"), "{policy}");
        assert_eq!(policy.matches("lease: true").count(), 1, "{policy}");
    }

    #[test]
    fn sizing_scales_rls_by_requests_and_rlqs_by_buckets() {
        let rls = PerRequest {
            tollgate_us: 10.0,
            redis_us: 7.0,
            ..PerRequest::default()
        };
        let pair = PairCost {
            tollgate_us: 20.0,
            redis_us: 14.0,
            messages: 2.0,
        };
        let out = sizing(&rls, &rls, &pair);
        // 10^6 requests a second: 10 tollgate cores and 7/0.7 = 10 Redis shards for RLS; 500
        // Envoys × 10 buckets = 5,000 pairs at 20 µs and 14 µs a second: 0.1 tollgate cores,
        // one shard.
        assert!(
            out.contains("| 1,000,000 | 500 | 10.0 | 10 | 10.0 | 10 | 0.1 | 1 |"),
            "{out}"
        );
        assert!(
            out.contains("tollgate 20 µs and Redis 14 µs of CPU a second in 2.0 messages"),
            "{out}"
        );
    }
}
