//! The `tollgate` command: `serve` runs the rate-limit service, `check` validates policy files.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Parser, Subcommand, ValueEnum};
use tollgate::backend::redis::{ClusterBackend, RedisBackend};
use tollgate::backend::shard::Sharded;
use tollgate::backend::{AnyBackend, MemoryBackend, memory};
use tollgate::config::{Config, FailureMode};
use tollgate::limiter::{Limiter, Settings};
use tollgate::server::{self, Listeners, ServeOptions};

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
    Serve(Box<ServeArgs>),
    /// Validate policy files and print the resolved policy table.
    Check {
        /// A YAML file or a directory of *.yaml / *.yml files.
        #[arg(long, env = "TOLLGATE_CONFIG")]
        config: PathBuf,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum BackendKind {
    /// Counters in this process (one instance).
    Memory,
    /// One Redis server.
    Redis,
    /// A Redis Cluster (seed URLs).
    RedisCluster,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum FailureModeArg {
    Allow,
    Deny,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Args)]
struct ServeArgs {
    /// A YAML file or a directory of *.yaml / *.yml files (dot files ignored).
    #[arg(long, env = "TOLLGATE_CONFIG")]
    config: PathBuf,
    /// Listen address of the RLS, health and reflection gRPC services.
    #[arg(long, env = "TOLLGATE_GRPC_ADDR", default_value = "0.0.0.0:8081")]
    grpc_addr: SocketAddr,
    /// Listen address of the admin HTTP interface.
    #[arg(long, env = "TOLLGATE_HTTP_ADDR", default_value = "0.0.0.0:8080")]
    http_addr: SocketAddr,
    /// Where counters live.
    #[arg(long, env = "TOLLGATE_BACKEND", value_enum, default_value = "memory")]
    backend: BackendKind,
    /// Redis URL (redis:// or rediss://, user and password allowed); for redis-cluster a
    /// comma-separated list of seed node URLs.
    #[arg(
        long,
        env = "TOLLGATE_REDIS_URL",
        default_value = "redis://127.0.0.1:6379"
    )]
    redis_url: String,
    /// Prefix of every Redis key, so deployments can share one Redis. No braces: a hash tag in
    /// the prefix would put every limiter (and every shard) on one cluster slot.
    #[arg(long, env = "TOLLGATE_KEY_PREFIX", default_value = "tollgate:", value_parser = parse_key_prefix)]
    key_prefix: String,
    /// Deadline of one backend call; past it each limit answers its failure mode.
    #[arg(long, env = "TOLLGATE_BACKEND_TIMEOUT", default_value = "50ms", value_parser = humantime::parse_duration)]
    backend_timeout: Duration,
    /// What a limit answers when the backend fails, unless the limit says otherwise.
    #[arg(
        long,
        env = "TOLLGATE_FAILURE_MODE",
        value_enum,
        default_value = "allow"
    )]
    failure_mode: FailureModeArg,
    /// Report, never deny: the overall code is always OK.
    #[arg(long, env = "TOLLGATE_SHADOW_MODE", num_args = 0..=1, default_value = "false",
          default_missing_value = "true", action = clap::ArgAction::Set)]
    shadow_mode: bool,
    /// Add `retry-after` to OVER_LIMIT responses.
    #[arg(long, env = "TOLLGATE_RETRY_AFTER_HEADER", num_args = 0..=1, default_value = "true",
          default_missing_value = "true", action = clap::ArgAction::Set)]
    retry_after_header: bool,
    /// How often the config path is checked for changes (SIGHUP reloads at once).
    #[arg(long, env = "TOLLGATE_RELOAD_INTERVAL", default_value = "2s", value_parser = humantime::parse_duration)]
    reload_interval: Duration,
    /// How long a changed config must stay unchanged before it is loaded (a file caught
    /// mid-write is never applied).
    #[arg(long, env = "TOLLGATE_RELOAD_SETTLE", default_value = "1s", value_parser = humantime::parse_duration)]
    reload_settle: Duration,
    /// Apply a reloaded config that has no policies at all (every request then allowed); by
    /// default such a reload is refused and the last good policies stay.
    #[arg(long, env = "TOLLGATE_ALLOW_EMPTY_CONFIG", num_args = 0..=1, default_value = "false",
          default_missing_value = "true", action = clap::ArgAction::Set)]
    allow_empty_config: bool,
    /// The most bytes the memory backend holds (e.g. `256MiB`, `1GiB`, at least 1MiB); past it
    /// expired windows are dropped first, then those expiring soonest. Default: 256MiB, or half
    /// the cgroup's memory limit when that is smaller.
    #[arg(long, env = "TOLLGATE_MEMORY_BUDGET", value_parser = parse_bytes)]
    memory_budget: Option<usize>,
    /// The most decisions in flight at once; past it a call is answered at once with
    /// RESOURCE_EXHAUSTED (Envoy applies its failure_mode_deny). 0: unbounded.
    #[arg(long, env = "TOLLGATE_MAX_IN_FLIGHT", default_value_t = server::DEFAULT_MAX_IN_FLIGHT)]
    max_in_flight: usize,
    /// Turn health NOT_SERVING once every backend call has failed for this long (e.g. `30s`).
    /// Unset: a sustained failure is logged as an error and health stays SERVING, since each
    /// limit answers its failure_mode.
    #[arg(long, env = "TOLLGATE_HEALTH_FAIL_AFTER", value_parser = humantime::parse_duration)]
    health_fail_after: Option<Duration>,
    /// How long SIGTERM waits for calls and streams in flight before exiting anyway.
    #[arg(long, env = "TOLLGATE_DRAIN_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    drain_timeout: Duration,
    /// Log format.
    #[arg(long, env = "TOLLGATE_LOG_FORMAT", value_enum, default_value = "text")]
    log_format: LogFormat,
}

fn parse_key_prefix(prefix: &str) -> Result<String, String> {
    if prefix.contains(['{', '}']) {
        Err(
            "a key prefix must not contain `{` or `}`: tollgate places the Redis hash tag itself"
                .into(),
        )
    } else {
        Ok(prefix.to_string())
    }
}

/// Reads a size in bytes: a number with an optional unit (`B`, `KiB`, `MiB`, `GiB`, or `KB`,
/// `MB`, `GB` in powers of ten; `K`, `M`, `G` are read as KiB, MiB, GiB).
fn parse_bytes(text: &str) -> Result<usize, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: usize = number
        .parse()
        .map_err(|_| format!("{text:?} is not a size: expected a number such as 256MiB"))?;
    let scale: usize = match unit.trim() {
        "" | "B" => 1,
        "K" | "KiB" | "k" => 1 << 10,
        "M" | "MiB" => 1 << 20,
        "G" | "GiB" => 1 << 30,
        "KB" | "kB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        other => {
            return Err(format!(
                "unknown size unit {other:?} in {text:?}: use B, KiB, MiB, GiB, KB, MB or GB"
            ));
        }
    };
    let bytes = number
        .checked_mul(scale)
        .ok_or_else(|| format!("{text:?} is too large"))?;
    if bytes < memory::MIN_BUDGET {
        return Err(format!(
            "{text:?} is below the smallest memory budget, 1MiB"
        ));
    }
    Ok(bytes)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Check { config } => check(&config),
        Command::Serve(args) => {
            init_logging(args.log_format);
            // An invalid config stops startup with exactly the message `check` prints.
            let config = match Config::load(&args.config) {
                Ok(config) => config,
                Err(error) => {
                    eprintln!("{error}");
                    return ExitCode::FAILURE;
                }
            };
            match run_serve(*args, config) {
                Ok(()) => ExitCode::SUCCESS,
                Err(error) => {
                    eprintln!("tollgate: {error:#}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

fn check(path: &Path) -> ExitCode {
    match Config::load(path) {
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

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

fn run_serve(args: ServeArgs, config: Config) -> anyhow::Result<()> {
    for warning in config.warnings() {
        tracing::warn!("{warning}");
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async move {
        let backend = connect_backend(&args).await?;
        let settings = Settings {
            failure_mode: match args.failure_mode {
                FailureModeArg::Allow => FailureMode::Allow,
                FailureModeArg::Deny => FailureMode::Deny,
            },
            shadow_mode: args.shadow_mode,
            retry_after_header: args.retry_after_header,
        };
        let limiter = Arc::new(Limiter::new(Arc::new(config), backend, settings));
        let listeners = Listeners::bind(args.grpc_addr, args.http_addr).await?;
        let options = ServeOptions {
            config_path: args.config.clone(),
            reload_interval: args.reload_interval,
            reload_settle: args.reload_settle,
            allow_empty_config: args.allow_empty_config,
            drain_timeout: args.drain_timeout,
            max_in_flight: (args.max_in_flight > 0).then_some(args.max_in_flight),
            health_fail_after: args.health_fail_after,
        };
        server::serve(limiter, listeners, options, termination())
            .await
            .context("serving failed")
    })
}

async fn connect_backend(args: &ServeArgs) -> anyhow::Result<Sharded<AnyBackend>> {
    let backend = match args.backend {
        BackendKind::Memory => {
            let budget = args.memory_budget.unwrap_or_else(memory::default_budget);
            tracing::info!(budget_bytes = budget, "memory backend");
            AnyBackend::Memory(MemoryBackend::with_budget(
                Arc::new(tollgate::clock::SystemClock),
                budget,
            ))
        }
        BackendKind::Redis => AnyBackend::Redis(
            RedisBackend::connect(&args.redis_url, &args.key_prefix, args.backend_timeout)
                .await
                .context("cannot set up the redis backend")?,
        ),
        BackendKind::RedisCluster => {
            let seeds: Vec<String> = args
                .redis_url
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect();
            AnyBackend::Cluster(
                ClusterBackend::connect(&seeds, &args.key_prefix, args.backend_timeout)
                    .await
                    .context("cannot set up the redis-cluster backend")?,
            )
        }
    };
    Ok(Sharded::new(backend))
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
