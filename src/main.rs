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
use tollgate::backend::{AnyBackend, MemoryBackend};
use tollgate::config::xds::{ExtensionDefaults, XdsOptions, parse_go_bool};
use tollgate::config::{Config, FailureMode};
use tollgate::limiter::{Limiter, Settings};
use tollgate::server::{self, Listeners, PolicySource, ServePlan};
use tollgate::window::Algorithm;

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
    Serve(ServeArgs),
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

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum AlgorithmArg {
    /// Spelled as in a policy file.
    #[value(name = "sliding_window_counter")]
    SlidingWindowCounter,
    #[value(name = "sliding_window_log")]
    SlidingWindowLog,
}

#[derive(Debug, Args)]
struct ServeArgs {
    /// A YAML file or a directory of *.yaml / *.yml files (dot files ignored). Either this or
    /// an xDS server (--xds-server-url, or CONFIG_TYPE=GRPC_XDS_SOTW).
    #[arg(long, env = "TOLLGATE_CONFIG")]
    config: Option<PathBuf>,
    /// Take the policies from this xDS management server instead (ADS, RateLimitConfig
    /// resources): host:port, or a http:// or https:// URL. The client's other settings are
    /// envoyproxy/ratelimit's variables (CONFIG_GRPC_XDS_*, XDS_CLIENT_*).
    #[arg(long, env = "TOLLGATE_XDS_SERVER_URL")]
    xds_server_url: Option<String>,
    /// The algorithm of limits delivered over xDS that name none (their control plane cannot
    /// set tollgate's extensions): default sliding_window_counter.
    #[arg(long, env = "TOLLGATE_XDS_DEFAULT_ALGORITHM", value_enum)]
    xds_default_algorithm: Option<AlgorithmArg>,
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

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Check { config } => check(&config),
        Command::Serve(args) => {
            init_logging(args.log_format);
            let lookup = |name: &str| std::env::var(name).ok();
            let (config, plan) = match plan(&args, lookup) {
                Ok(Source::Files(path, plan)) => match Config::load(&path) {
                    Ok(config) => (config, plan),
                    // An invalid config stops startup with exactly the message `check` prints.
                    Err(error) => {
                        eprintln!("{error}");
                        return ExitCode::FAILURE;
                    }
                },
                Ok(Source::Xds(plan)) => (Config::empty(), plan),
                Err(error) => {
                    eprintln!("tollgate: {error}");
                    return ExitCode::FAILURE;
                }
            };
            match run_serve(args, config, plan) {
                Ok(()) => ExitCode::SUCCESS,
                Err(error) => {
                    eprintln!("tollgate: {error:#}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

/// Where `serve` takes its policies from, and how it serves them.
enum Source {
    /// A config path (loaded before serving).
    Files(PathBuf, ServePlan),
    /// An xDS management server.
    Xds(ServePlan),
}

/// Chooses the policy source: `--config`, else `--xds-server-url`, else the reference's
/// `CONFIG_TYPE=GRPC_XDS_SOTW` with `CONFIG_GRPC_XDS_SERVER_URL`. The xDS client's settings and
/// `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED` are read through `lookup` (the environment).
fn plan(args: &ServeArgs, lookup: impl Fn(&str) -> Option<String>) -> anyhow::Result<Source> {
    let require_domain = match lookup("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED") {
        Some(text) if !text.is_empty() => {
            parse_go_bool("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", &text)?
        }
        _ => false,
    };
    let config_type = lookup("CONFIG_TYPE").filter(|t| !t.is_empty());
    match (&args.config, &args.xds_server_url, config_type.as_deref()) {
        (Some(_), Some(_), _) => {
            anyhow::bail!("give either --config or --xds-server-url, not both")
        }
        (Some(path), None, _) => {
            let source = PolicySource::Files {
                path: path.clone(),
                reload_interval: args.reload_interval,
            };
            return Ok(Source::Files(
                path.clone(),
                ServePlan {
                    source,
                    require_domain,
                    drain_timeout: args.drain_timeout,
                },
            ));
        }
        (None, Some(_), _) => {}
        (None, None, Some(kind)) if kind.eq_ignore_ascii_case("GRPC_XDS_SOTW") => {}
        (None, None, Some(kind)) if !kind.eq_ignore_ascii_case("FILE") => anyhow::bail!(
            "CONFIG_TYPE={kind} is not supported; tollgate reads FILE (with --config) and \
             GRPC_XDS_SOTW"
        ),
        (None, None, _) => anyhow::bail!(
            "no policies to serve: give --config PATH, or an xDS server with --xds-server-url \
             (or CONFIG_TYPE=GRPC_XDS_SOTW and CONFIG_GRPC_XDS_SERVER_URL)"
        ),
    }
    let mut options = XdsOptions::from_env(&lookup)?;
    if let Some(url) = &args.xds_server_url {
        options.server_url = url.clone();
    }
    options.validate()?;
    options.check_files()?;
    let defaults = ExtensionDefaults {
        algorithm: args.xds_default_algorithm.map(|algorithm| match algorithm {
            AlgorithmArg::SlidingWindowCounter => Algorithm::SlidingWindowCounter,
            AlgorithmArg::SlidingWindowLog => Algorithm::SlidingWindowLog,
        }),
    };
    Ok(Source::Xds(ServePlan {
        source: PolicySource::Xds {
            options: Box::new(options),
            defaults,
        },
        require_domain,
        drain_timeout: args.drain_timeout,
    }))
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

fn run_serve(args: ServeArgs, config: Config, plan: ServePlan) -> anyhow::Result<()> {
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
        server::serve_with(limiter, listeners, plan, termination())
            .await
            .context("serving failed")
    })
}

async fn connect_backend(args: &ServeArgs) -> anyhow::Result<Sharded<AnyBackend>> {
    let backend = match args.backend {
        BackendKind::Memory => AnyBackend::Memory(MemoryBackend::new()),
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
