//! The `tollgate` command: `serve` runs the rate-limit service, `check` validates policy files.
//!
//! Called `ratelimit` (the name envoyproxy/ratelimit's image gives its binary, `/bin/ratelimit`),
//! the same binary serves at once from the environment, with the reference's defaults, so a
//! Deployment written for the reference runs with only the image changed.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use tollgate::backend::redis::{ClusterBackend, RedisBackend, connect};
use tollgate::backend::{self, AnyBackend, MemoryBackend};
use tollgate::clock::{Clock, MonotonicClock, SystemClock};
use tollgate::config::{Config, LoadOptions};
use tollgate::descriptor::{Descriptor, Entry as DescriptorEntry, Request};
use tollgate::limiter::Limiter;
use tollgate::server::mapper::Mapper;
use tollgate::server::runtime::Wakeups;
use tollgate::server::{
    self, Listeners, MetricsOptions, Policies, ServeOptions, ServerTls, operator, reload, runtime,
};
use tollgate::settings::{self, Entry, Flags, LogFormat, PolicySettings, Settings, Store};
use tollgate::telemetry;

/// A sliding-window rate-limit service for Envoy (RateLimitService v3).
#[derive(Debug, Parser)]
#[command(name = "tollgate", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve the RLS gRPC API, gRPC health and reflection, and the admin HTTP interface.
    ///
    /// Every flag also reads its TOLLGATE_* variable, and the settings envoyproxy/ratelimit reads
    /// from the environment (named after each flag's help) apply to what flags leave unset.
    Serve(Box<Flags>),
    /// Validate policy files and print the resolved policy table.
    Check {
        /// A YAML file or a directory of *.yaml / *.yml files.
        #[arg(long, env = "TOLLGATE_CONFIG")]
        config: PathBuf,
        /// Let several files declare one domain and merge their top-level descriptors (also
        /// MERGE_DOMAIN_CONFIG).
        #[arg(long, env = "TOLLGATE_MERGE_DOMAINS", num_args = 0..=1,
              default_missing_value = "true", action = clap::ArgAction::Set)]
        merge_domains: Option<bool>,
    },
    /// Read or reset a client's counters straight from the store, without a running instance:
    /// the answers of the admin port's POST /counters and POST /counters/reset.
    ///
    /// Takes `serve`'s flags (and variables) for the policies and the store. The memory backend
    /// keeps its counters inside each tollgate process, so there is nothing to read from outside
    /// one: ask the running instance's admin port instead.
    #[command(subcommand)]
    Counters(CountersCommand),
}

#[derive(Debug, Subcommand)]
enum CountersCommand {
    /// Print the usage of every limit each descriptor resolves to, consuming nothing.
    Get(Box<CountersArgs>),
    /// Clear those windows (every limit, every shard) and print what they held.
    Reset(Box<CountersArgs>),
}

#[derive(Debug, Args)]
struct CountersArgs {
    /// The policy domain.
    #[arg(long)]
    domain: String,
    /// One descriptor: `key=value[,key=value...]`, entries in the order Envoy sends them
    /// (a value may not contain a comma). Repeat for several descriptors.
    #[arg(long = "descriptor", required = true)]
    descriptors: Vec<String>,
    #[command(flatten)]
    flags: Flags,
}

/// The `ratelimit` entry point: serves from the environment with envoyproxy/ratelimit's
/// defaults (a Redis backend, its runtime directory layout, ports 8081, 8080 and 6070). Flags
/// are optional and win over the environment.
#[derive(Debug, Parser)]
#[command(name = "ratelimit", version, about)]
struct RatelimitCli {
    #[command(flatten)]
    flags: Flags,
}

fn main() -> ExitCode {
    if invoked_as_ratelimit() {
        let cli = RatelimitCli::parse();
        return serve(Entry::Reference, &cli.flags);
    }
    match Cli::parse().command {
        Command::Check {
            config,
            merge_domains,
        } => check(&config, merge_domains),
        Command::Serve(flags) => serve(Entry::Tollgate, &flags),
        Command::Counters(CountersCommand::Get(args)) => counters(&args, false),
        Command::Counters(CountersCommand::Reset(args)) => counters(&args, true),
    }
}

/// `tollgate counters get|reset`: the operator's answers from the store itself.
fn counters(args: &CountersArgs, reset: bool) -> ExitCode {
    match counters_answer(args, reset) {
        Ok(answer) => {
            println!("{answer}");
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("tollgate counters: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn counters_answer(args: &CountersArgs, reset: bool) -> anyhow::Result<String> {
    let descriptors = args
        .descriptors
        .iter()
        .map(|text| parse_descriptor(text))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let request = Request {
        domain: args.domain.as_str().into(),
        descriptors,
        hits_addend: 0,
    };
    let settings = Settings::resolve(Entry::Tollgate, &args.flags, &settings::process_env)?;
    if settings.backend.store == Store::Memory {
        anyhow::bail!(
            "the memory backend keeps counters inside each tollgate process; there is no store \
             to read from outside one. Ask the running instance instead: POST /counters on its \
             admin port, or pick the store with --backend redis|redis-cluster and --redis-url"
        );
    }
    let PolicySettings::Files(source) = &settings.policies else {
        anyhow::bail!("counters reads the policies from files: give --config");
    };
    let config = source.load_with(settings.load_options)?;
    // Only what a reset clears is worth a log line (to stderr, as `serve` logs).
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("warn"))
        .with_writer(std::io::stderr)
        .try_init();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async {
        let backend = connect_backend(&settings).await?;
        let limiter = Limiter::new(Arc::new(config), backend, settings.limiter);
        let usages = if reset {
            let usages = limiter.reset(&request).await?;
            operator::log_reset(&request, &usages, "tollgate counters reset");
            usages
        } else {
            limiter.inspect(&request).await?
        };
        Ok(serde_json::to_string(&operator::usages_json(
            &usages, reset,
        ))?)
    })
}

/// One `--descriptor`: `key=value[,key=value...]`.
fn parse_descriptor(text: &str) -> anyhow::Result<Descriptor> {
    let entries = text
        .split(',')
        .map(|pair| match pair.split_once('=') {
            Some((key, value)) if !key.is_empty() => Ok(DescriptorEntry::new(key, value)),
            _ => Err(anyhow::anyhow!(
                "--descriptor {text:?}: {pair:?} is not key=value (expected \
                 key=value[,key=value...], keys not empty)"
            )),
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok(Descriptor {
        entries,
        limit: None,
        hits_addend: None,
    })
}

/// Whether the binary was started under the reference's name.
fn invoked_as_ratelimit() -> bool {
    std::env::args_os()
        .next()
        .and_then(|arg0| Path::new(&arg0).file_name().map(|name| name == "ratelimit"))
        .unwrap_or(false)
}

fn serve(entry: Entry, flags: &Flags) -> ExitCode {
    let program = match entry {
        Entry::Tollgate => "tollgate",
        Entry::Reference => "ratelimit",
    };
    let settings = match Settings::resolve(entry, flags, &settings::process_env) {
        Ok(settings) => settings,
        Err(error) => {
            eprintln!("{program}: {error}");
            return ExitCode::FAILURE;
        }
    };
    init_logging(&settings);
    for notice in &settings.notices {
        tracing::warn!("{notice}");
    }
    let (policies, config) = match &settings.policies {
        PolicySettings::Files(source) => {
            // An invalid config stops startup with exactly the message `check` prints.
            let config = match source.load_with(settings.load_options) {
                Ok(config) => config,
                Err(error) => {
                    eprintln!("{error}");
                    return ExitCode::FAILURE;
                }
            };
            if let Some(why) = source.reads_nothing() {
                tracing::warn!("{why}; every request is allowed");
            }
            for warning in config.warnings() {
                tracing::warn!("{warning}");
            }
            reload::log_skipped(&config);
            tracing::info!(source = %source.describe(), domains = config.len(), "policies loaded");
            (Policies::Files(source.clone()), config)
        }
        // The policies arrive with the first push; until then there are none (and, unless
        // FORCE_START_WITHOUT_INITIAL_CONFIG, the service is not ready).
        PolicySettings::XdsSotw { options, defaults } => {
            if let Err(error) = options.check_files() {
                eprintln!("{program}: {error}");
                return ExitCode::FAILURE;
            }
            (
                Policies::Xds {
                    options: options.clone(),
                    defaults: *defaults,
                },
                Config::empty(),
            )
        }
    };
    match run_serve(settings, policies, config) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("{program}: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn check(path: &Path, merge_domains: Option<bool>) -> ExitCode {
    let merge_domains = match merge_domains {
        Some(merge) => merge,
        None => match settings::boolean_var("MERGE_DOMAIN_CONFIG", &settings::process_env) {
            Ok(merge) => merge.unwrap_or(false),
            Err(error) => {
                eprintln!("tollgate: {error}");
                return ExitCode::FAILURE;
            }
        },
    };
    match Config::load_with(path, LoadOptions { merge_domains }) {
        Ok(config) => {
            for warning in config.warnings() {
                eprintln!("{warning}");
            }
            print!("{}", config.table());
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("{error}");
            ExitCode::FAILURE
        }
    }
}

/// Logging as the settings resolved it (their notices follow, once it is up).
fn init_logging(settings: &Settings) {
    let filter = tracing_subscriber::EnvFilter::new(tollgate::telemetry::log_filter(
        settings.log.directives(),
    ));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    match settings.log.format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

fn run_serve(settings: Settings, policies: Policies, config: Config) -> anyhow::Result<()> {
    let tls = match &settings.grpc.tls {
        Some(files) => Some(ServerTls::load(files.clone()).context("gRPC TLS")?),
        None => None,
    };
    let wakeups = Wakeups::for_store(&settings.backend.store);
    let runtime = runtime::build(settings.worker_threads, wakeups)
        .context("cannot start the async runtime")?;
    runtime.block_on(async move {
        // Before anything listens, so a tracing setup that cannot work stops the start.
        let spans = telemetry::init(&settings.tracing, backend_name(&settings))?;
        let served = serve_with(settings, policies, config, tls).await;
        // The batch exporter holds the last spans; send them before the process exits.
        if let Some(spans) = spans {
            let _ = tokio::task::spawn_blocking(move || spans.shutdown()).await;
        }
        served
    })
}

/// The backend as spans name it.
fn backend_name(settings: &Settings) -> &'static str {
    match &settings.backend.store {
        Store::Memory => "memory",
        Store::Redis(target) => match target.kind {
            connect::Kind::Single => "redis",
            connect::Kind::Cluster => "redis-cluster",
            connect::Kind::Sentinel => "redis-sentinel",
        },
    }
}

async fn serve_with(
    settings: Settings,
    policies: Policies,
    config: Config,
    tls: Option<Arc<ServerTls>>,
) -> anyhow::Result<()> {
    let backend = connect_backend(&settings).await?;
    let mut limiter = Limiter::new(Arc::new(config), backend, settings.limiter);
    if let Some(names) = settings.limit_headers.clone() {
        limiter = limiter.with_limit_headers(names);
    }
    let listeners = Listeners::bind_all(&settings.listen).await?;
    let options = ServeOptions {
        policies,
        load_options: settings.load_options,
        reload_interval: settings.reload_interval,
        reload_settle: settings.reload_settle,
        allow_empty_config: settings.allow_empty_config,
        drain_timeout: settings.drain_timeout,
        max_in_flight: settings.max_in_flight,
        health_fail_after: settings.health_fail_after,
        tls,
        max_connection_age: settings.grpc.max_connection_age,
        max_connection_age_grace: settings.grpc.max_connection_age_grace,
        metrics_path: settings
            .stats
            .prometheus
            .as_ref()
            .map_or_else(|| "/metrics".to_owned(), |p| p.path.clone()),
        require_config: settings.healthy_with_at_least_one_config_loaded,
        metrics: metrics_options(&settings),
        grpc_fast_path: settings.grpc.fast_path,
        admin_allow_reset: settings.admin_allow_reset,
        bounds: settings.bounds,
    };
    server::serve(Arc::new(limiter), listeners, options, termination())
        .await
        .context("serving failed")
}

/// How the reference-named statistics are built: the mapping file of `PROMETHEUS_MAPPER_YAML`
/// when it reads, else the reference's default mapping (in milliseconds when asked).
fn metrics_options(settings: &Settings) -> MetricsOptions {
    let stats = &settings.stats;
    let default = || {
        if stats.response_time_as_milliseconds {
            Mapper::default_mapping_in_milliseconds()
        } else {
            Mapper::default_mapping()
        }
    };
    let mapper = match &stats.mapper_yaml {
        None => default(),
        Some(path) => {
            let read = std::fs::read_to_string(path)
                .map_err(|e| e.to_string())
                .and_then(|text| Mapper::parse(&text).map_err(|e| e.to_string()));
            match read {
                Ok(mapper) => {
                    if !mapper.unsupported().is_empty() {
                        tracing::warn!(
                            "PROMETHEUS_MAPPER_YAML={}: these keys are not supported and are \
                             ignored: {} (supported: match, match_type, name, labels, \
                             match_metric_type, action, scale, help, timer_type, observer_type, \
                             defaults.match_type)",
                            path.display(),
                            mapper.unsupported().join(", ")
                        );
                    } else {
                        tracing::info!(
                            "PROMETHEUS_MAPPER_YAML={}: the reference-named metrics are mapped \
                             by this file",
                            path.display()
                        );
                    }
                    mapper
                }
                Err(error) => {
                    tracing::warn!(
                        "PROMETHEUS_MAPPER_YAML={}: not usable ({error}); the reference's default \
                         mapping is used instead",
                        path.display()
                    );
                    default()
                }
            }
        }
    };
    MetricsOptions {
        mapper,
        // The reference reads the ratio as a 32-bit float and computes in it.
        near_limit_ratio: settings.behaviour.near_limit_ratio as f32,
        max_request_keys: stats.max_request_keys,
        per_limit: !stats.per_limit_disabled,
        local_cache: settings.behaviour.local_cache_bytes() > 0,
    }
}

/// The store and what stands on it ([`backend::stack`]).
async fn connect_backend(settings: &Settings) -> anyhow::Result<backend::Stack> {
    let backend = &settings.backend;
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let main = match &backend.store {
        Store::Memory => {
            tracing::info!(budget_bytes = backend.memory_budget, "memory backend");
            AnyBackend::Memory(MemoryBackend::with_budget(
                Arc::clone(&clock),
                backend.memory_budget,
            ))
        }
        Store::Redis(target) => {
            connect_redis(
                target,
                &backend.key_prefix,
                backend.timeout,
                backend.wait_replicas,
            )
            .await?
        }
    };
    let per_second = match &backend.per_second {
        Some(target) => Some(
            connect_redis(
                target,
                &backend.key_prefix,
                backend.timeout,
                backend.wait_replicas,
            )
            .await
            .context("the per-second Redis (REDIS_PERSECOND_*)")?,
        ),
        None => None,
    };
    let cache_bytes = settings.behaviour.local_cache_bytes();
    let answer_counted = settings.behaviour.local_cache_answers_counted();
    tracing::info!(
        budget_bytes = cache_bytes,
        answers_counting_all = answer_counted,
        "local over-limit cache"
    );
    let (cache_clock, shared): (Arc<dyn Clock>, bool) = match &backend.store {
        // The memory backend decides by this clock: the cache reads the very same one.
        Store::Memory => (clock, false),
        // Redis decides by its own clock (TIME): durations are measured on a monotonic one.
        Store::Redis(_) => (Arc::new(MonotonicClock::new()), true),
    };
    Ok(backend::stack(
        main,
        per_second,
        backend::CacheOptions {
            clock: cache_clock,
            bytes: cache_bytes,
            answer_counted,
        },
        shared,
    ))
}

async fn connect_redis(
    target: &connect::Target,
    key_prefix: &str,
    timeout: std::time::Duration,
    wait_replicas: u32,
) -> anyhow::Result<AnyBackend> {
    tracing::info!(
        redis = %target.describe(),
        kind = target.kind.as_str(),
        "connecting to redis"
    );
    Ok(match target.kind {
        connect::Kind::Cluster => AnyBackend::Cluster(
            ClusterBackend::connect_to(target, key_prefix, timeout)
                .await
                .context("cannot set up the redis-cluster backend")?,
        ),
        connect::Kind::Single | connect::Kind::Sentinel => AnyBackend::Redis(
            RedisBackend::connect_to(target, key_prefix, timeout, wait_replicas)
                .await
                .context("cannot set up the redis backend")?,
        ),
    })
}

/// Resolves on SIGTERM or Ctrl-C.
async fn termination() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
