//! Start-up settings: one [`Settings`] from, in this order of precedence, `serve`'s flags, their
//! `TOLLGATE_*` variables, envoyproxy/ratelimit's environment variables (its
//! `src/settings/settings.go` names and meanings), and defaults.
//!
//! The reference's variables let a Deployment written for it, including the one Envoy Gateway
//! generates, start tollgate unchanged. They are read with the reference's rules (Go's envconfig):
//! a variable set to the empty string is set (an empty number is an error, not the default);
//! numbers take Go's base prefixes (`0x1F`, `0o17`, a leading `0` is octal); durations are Go
//! durations (`1h30m`, `250ms`, a bare `0`); booleans are `1 t T TRUE true True` and
//! `0 f F FALSE false False`. A malformed value stops start-up with a message naming the variable
//! and what it accepts. A setting tollgate does not support stops start-up where carrying on
//! would surprise (another backend), and is reported as a [`Settings::notices`] line where it is
//! harmless.
//!
//! Which defaults apply depends on the [`Entry`]: `tollgate serve` keeps tollgate's (a `memory`
//! backend, `--config PATH`); the `ratelimit` entry point (the binary called `ratelimit`, as the
//! reference's image has it at `/bin/ratelimit`) takes the reference's: a Redis backend, the
//! runtime directory layout, a debug listener on 6070 and 24 h connection ages.
//!
//! # Layout
//!
//! This file holds the [`Settings`] and [`Settings::resolve`], which reads every setting in the
//! order above; each concern's types and readers are a module of their own: `flags` (the clap
//! struct), `env` (the reference's variables and Go's syntax), `policies`, `grpc` (its TLS),
//! `backend` (memory or Redis, with Redis's TLS), `observability` (logging, metrics, tracing),
//! `behaviour`, and `ignored` (the reference's variables read only to be checked). Settings is
//! the binary's edge: it builds the options of `server`, `limiter`, `backend`, `config` and
//! `telemetry`, and none of those reads it.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::time::Duration;

use crate::config::{FailureMode, LoadOptions};
use crate::limiter::{self, LimitHeaders};
use crate::server::{GrpcAddr, ListenAddrs};
use crate::window::Counting;

mod backend;
mod behaviour;
mod env;
mod flags;
mod grpc;
mod ignored;
mod observability;
mod policies;

pub use crate::backend::Store;
pub use crate::telemetry::{ExporterProtocol, TracingSettings};
pub use backend::BackendSettings;
pub use behaviour::Behaviour;
pub use env::{boolean_var, process_env};
pub use flags::{
    AlgorithmArg, BackendKind, CountingArg, FailureModeArg, Flags, LogFormat, LogLevel,
    parse_bytes, parse_size,
};
pub use grpc::GrpcSettings;
pub use observability::{LogSettings, PrometheusSettings, StatsSettings};
pub use policies::PolicySettings;

use backend::backend;
use behaviour::behaviour;
use env::{Env, listen_addr};
use grpc::grpc_tls;
use ignored::ignored_but_typed;
use observability::{stats_sinks, tracing_settings};
use policies::policies;

/// Which program the user started, and so which defaults apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entry {
    /// `tollgate serve`: tollgate's defaults.
    Tollgate,
    /// `ratelimit` (the reference's binary name): the reference's defaults.
    Reference,
}

/// Why the settings cannot be used; the message names the variable or flag.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SettingsError {
    /// A variable's value does not parse.
    #[error("{name}={value}: {expected}")]
    Malformed {
        /// The variable.
        name: String,
        /// Its value (masked when it may hold a secret).
        value: String,
        /// What it accepts.
        expected: String,
    },
    /// A setting asks for something this build does not do.
    #[error("{0}")]
    Unsupported(String),
    /// Settings that contradict each other or are incomplete.
    #[error("{0}")]
    Invalid(String),
}

/// Everything `serve` needs to start.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// Which defaults applied.
    pub entry: Entry,
    /// Where to listen.
    pub listen: ListenAddrs,
    /// gRPC TLS and connection ages.
    pub grpc: GrpcSettings,
    /// Logging.
    pub log: LogSettings,
    /// Where policies come from.
    pub policies: PolicySettings,
    /// How policies are gathered (`MERGE_DOMAIN_CONFIG`), for files and xDS alike.
    pub load_options: LoadOptions,
    /// `FORCE_START_WITHOUT_INITIAL_CONFIG`: serve before the first config arrives (xDS).
    pub force_start_without_initial_config: bool,
    /// `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`: health requires a config with a domain.
    pub healthy_with_at_least_one_config_loaded: bool,
    /// How often policy and TLS files are checked for changes.
    pub reload_interval: Duration,
    /// How long changed policy files must stay unchanged before they are loaded.
    pub reload_settle: Duration,
    /// Whether a reload of the policy files that finds no policies at all is applied.
    pub allow_empty_config: bool,
    /// `--admin-allow-reset`: whether `POST /counters/reset` may clear windows.
    pub admin_allow_reset: bool,
    /// How long SIGTERM waits for calls in flight.
    pub drain_timeout: Duration,
    /// The most decisions in flight at once; `None`: unbounded.
    pub max_in_flight: Option<usize>,
    /// What one client may hold: gRPC streams and unfinished messages, silent connections,
    /// admin connections and header timeouts.
    pub bounds: crate::server::Bounds,
    /// Worker threads of the async runtime (by default one per CPU the process may use).
    pub worker_threads: NonZeroUsize,
    /// Health turns NOT_SERVING once every backend call has failed for this long; `None`: a
    /// sustained failure is only logged.
    pub health_fail_after: Option<Duration>,
    /// The backend.
    pub backend: BackendSettings,
    /// What the limiter does.
    pub limiter: limiter::Settings,
    /// `LIMIT_RESPONSE_HEADERS_ENABLED` with `LIMIT_*_HEADER`: the draft RateLimit headers.
    pub limit_headers: Option<LimitHeaders>,
    /// Behaviour parsed for other parts of tollgate.
    pub behaviour: Behaviour,
    /// Metrics.
    pub stats: StatsSettings,
    /// Tracing.
    pub tracing: TracingSettings,
    /// One line per accepted setting that tollgate ignores or treats differently, for the
    /// start-up log.
    pub notices: Vec<String>,
}

const DEFAULT_GRPC: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 8081);
const DEFAULT_HTTP: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 8080);
const DEFAULT_RELOAD_SETTLE: Duration = crate::server::reload::DEFAULT_SETTLE;
const DEFAULT_MAX_IN_FLIGHT: usize = crate::server::DEFAULT_MAX_IN_FLIGHT;

impl Settings {
    /// Resolves the settings of `entry` from `flags` (which include their `TOLLGATE_*`
    /// variables) and the reference's variables as `env` answers them.
    pub fn resolve(
        entry: Entry,
        flags: &Flags,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Settings, SettingsError> {
        let env = Env { get: env };
        let reference = entry == Entry::Reference;
        let mut notices = Vec::new();

        // Listen addresses.
        let grpc = match (&flags.grpc_uds, flags.grpc_addr) {
            (Some(path), _) => GrpcAddr::Unix(path.clone()),
            (None, Some(addr)) => GrpcAddr::Tcp(addr),
            (None, None) => match env.string("GRPC_UDS").filter(|p| !p.is_empty()) {
                Some(path) => GrpcAddr::Unix(PathBuf::from(path)),
                None => GrpcAddr::Tcp(
                    env.host_port("GRPC_HOST", "GRPC_PORT", 8081)?
                        .unwrap_or(DEFAULT_GRPC),
                ),
            },
        };
        let http = match flags.http_addr {
            Some(addr) => addr,
            None => env.host_port("HOST", "PORT", 8080)?.unwrap_or(DEFAULT_HTTP),
        };
        let debug = match flags.debug_addr {
            Some(addr) => Some(addr),
            None => match env.host_port("DEBUG_HOST", "DEBUG_PORT", 6070)? {
                Some(addr) => Some(addr),
                None if reference => Some(SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), 6070)),
                None => None,
            },
        };

        // Metrics.
        let use_prometheus = env.boolean("USE_PROMETHEUS")?.unwrap_or(false);
        let prometheus_path = match env.string("PROMETHEUS_PATH").filter(|p| !p.is_empty()) {
            Some(path)
                if !path.starts_with('/')
                    || !path
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"/._~-".contains(&b)) =>
            {
                return Err(env.malformed(
                    "PROMETHEUS_PATH",
                    "a URL path such as /metrics (letters, digits, and / . _ ~ -)",
                ));
            }
            Some(path) => path,
            None => "/metrics".to_owned(),
        };
        let prometheus_addr = match env.string("PROMETHEUS_ADDR").filter(|a| !a.is_empty()) {
            Some(text) => Some(listen_addr(&text).ok_or_else(|| {
                env.malformed(
                    "PROMETHEUS_ADDR",
                    "a listen address such as :9090, 0.0.0.0:9090 or [::]:9090",
                )
            })?),
            None => None,
        };
        if prometheus_addr.is_some_and(|addr| addr == http && addr.port() != 0)
            && ["/healthcheck", "/json", "/rlconfig"].contains(&prometheus_path.as_str())
        {
            return Err(SettingsError::Invalid(format!(
                "PROMETHEUS_PATH={prometheus_path} on the admin listener (PROMETHEUS_ADDR is its \
                 address) would hide the admin endpoint of that name; choose another path"
            )));
        }
        let prometheus = match flags.metrics_addr {
            Some(addr) => Some(PrometheusSettings {
                addr,
                path: prometheus_path,
            }),
            None if use_prometheus => Some(PrometheusSettings {
                addr: prometheus_addr
                    .unwrap_or_else(|| SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), 9090)),
                path: prometheus_path,
            }),
            None => None,
        };
        let mapper_yaml = env
            .string("PROMETHEUS_MAPPER_YAML")
            .filter(|p| !p.is_empty())
            .map(PathBuf::from);
        let response_time_as_milliseconds = env
            .boolean("PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS")?
            .unwrap_or(false);
        let per_limit_disabled = stats_sinks(&env, &mut notices)?;

        // gRPC server.
        let tls = grpc_tls(flags, &env, &mut notices)?;
        let age_default = |hours: u64| reference.then(|| Duration::from_secs(hours * 3600));
        let max_connection_age = match env.duration("GRPC_MAX_CONNECTION_AGE")? {
            Some(age) => positive(age),
            None => age_default(24),
        };
        let max_connection_age_grace = match env.duration("GRPC_MAX_CONNECTION_AGE_GRACE")? {
            Some(grace) => positive(grace),
            None => age_default(1),
        };

        // Logging.
        let level = match flags.log_level {
            Some(level) => Some(level),
            None => env.log_level()?,
        };
        let format = match flags.log_format {
            Some(format) => format,
            None => match env.string("LOG_FORMAT") {
                Some(text) if text.eq_ignore_ascii_case("json") => LogFormat::Json,
                _ => LogFormat::Text,
            },
        };
        // Empty is unset, as for every other variable (an empty filter would log nothing); a
        // filter that does not parse is named, and logging starts at info.
        let rust_log = match env.string("RUST_LOG").filter(|v| !v.trim().is_empty()) {
            Some(value) if level.is_none() => {
                match tracing_subscriber::EnvFilter::try_new(&value) {
                    Ok(_) => Some(value),
                    Err(error) => {
                        notices.push(format!(
                            "RUST_LOG={value}: {error}; logging at info instead"
                        ));
                        None
                    }
                }
            }
            _ => None,
        };

        // Runtime. tokio would read TOKIO_WORKER_THREADS itself, and panic on a bad value;
        // reading it here turns that into an error that names it. GOMAXPROCS is what the
        // reference's Go runtime reads as the threads running its code at once; Go ignores a
        // value that is not a whole number of 1 or more, so a deployment that set one still
        // starts, with a notice.
        let go_max_procs = |notices: &mut Vec<String>| {
            env.count("GOMAXPROCS").unwrap_or_else(|error| {
                notices.push(format!("{error}; ignored, as Go ignores it"));
                None
            })
        };
        let worker_threads = match flags.worker_threads {
            Some(threads) => threads,
            None => env
                .count("TOKIO_WORKER_THREADS")?
                .or_else(|| go_max_procs(&mut notices))
                .unwrap_or_else(|| {
                    std::thread::available_parallelism().unwrap_or(NonZeroUsize::MIN)
                }),
        };

        // Policies.
        let policies = policies(entry, flags, &env)?;
        let force_start_without_initial_config = env
            .boolean("FORCE_START_WITHOUT_INITIAL_CONFIG")?
            .unwrap_or(false);
        let healthy_with_at_least_one_config_loaded = env
            .boolean("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED")?
            .unwrap_or(false);
        let load_options = LoadOptions {
            merge_domains: match flags.merge_domains {
                Some(merge) => merge,
                None => env.boolean("MERGE_DOMAIN_CONFIG")?.unwrap_or(false),
            },
        };

        // Backend.
        let backend = backend(entry, flags, &env, &mut notices)?;

        // Behaviour.
        let shadow_mode = match flags.shadow_mode {
            Some(shadow) => shadow,
            None => env.boolean("SHADOW_MODE")?.unwrap_or(false),
        };
        let limit_headers = match env.boolean("LIMIT_RESPONSE_HEADERS_ENABLED")? {
            Some(true) => {
                let defaults = LimitHeaders::default();
                let name = |var: &str, default: String| -> Result<String, SettingsError> {
                    match env.string(var) {
                        Some(name) if is_header_name(&name) => Ok(name),
                        Some(_) => {
                            Err(env.malformed(var, "an HTTP header name (letters, digits and -)"))
                        }
                        None => Ok(default),
                    }
                };
                Some(LimitHeaders {
                    limit: name("LIMIT_LIMIT_HEADER", defaults.limit)?,
                    remaining: name("LIMIT_REMAINING_HEADER", defaults.remaining)?,
                    reset: name("LIMIT_RESET_HEADER", defaults.reset)?,
                })
            }
            _ => None,
        };
        let limiter = limiter::Settings {
            failure_mode: match flags.failure_mode {
                Some(FailureModeArg::Deny) => FailureMode::Deny,
                Some(FailureModeArg::Allow) | None => FailureMode::Allow,
            },
            shadow_mode,
            retry_after_header: flags.retry_after_header.unwrap_or(true),
            counting: match flags.counting {
                Some(CountingArg::Admitted) => Counting::Admitted,
                Some(CountingArg::All) => Counting::All,
                // The reference charges every hit unless told to stop; `tollgate serve` keeps
                // refused requests free unless told otherwise.
                None => match env.boolean("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT")? {
                    Some(true) => Counting::Admitted,
                    Some(false) => Counting::All,
                    None if entry == Entry::Reference => Counting::All,
                    None => Counting::Admitted,
                },
            },
            quota_mode: match flags.quota_mode {
                Some(quota) => quota,
                None => env.boolean("QUOTA_MODE")?.unwrap_or(false),
            },
            response_dynamic_metadata: match flags.response_dynamic_metadata {
                Some(metadata) => metadata,
                None => env.boolean("RESPONSE_DYNAMIC_METADATA")?.unwrap_or(false),
            },
            over_limit_metadata: flags
                .over_limit_metadata
                .unwrap_or(entry != Entry::Reference),
        };
        let behaviour = behaviour(flags, &env)?;
        let tracing = tracing_settings(&env)?;
        ignored_but_typed(&env, &mut notices)?;

        Ok(Settings {
            entry,
            listen: ListenAddrs {
                grpc,
                http,
                debug,
                metrics: prometheus.as_ref().map(|p| p.addr),
            },
            grpc: GrpcSettings {
                tls,
                max_connection_age,
                max_connection_age_grace,
                fast_path: flags.grpc_fast_path.unwrap_or(true),
            },
            log: LogSettings {
                level,
                rust_log,
                format,
            },
            policies,
            load_options,
            force_start_without_initial_config,
            healthy_with_at_least_one_config_loaded,
            reload_interval: flags.reload_interval.unwrap_or(Duration::from_secs(2)),
            reload_settle: flags.reload_settle.unwrap_or(DEFAULT_RELOAD_SETTLE),
            allow_empty_config: flags.allow_empty_config.unwrap_or(false),
            admin_allow_reset: flags.admin_allow_reset.unwrap_or(false),
            drain_timeout: flags.drain_timeout.unwrap_or(Duration::from_secs(10)),
            max_in_flight: match flags.max_in_flight {
                Some(0) => None,
                Some(bound) => Some(bound),
                None => Some(DEFAULT_MAX_IN_FLIGHT),
            },
            bounds: bounds(flags)?,
            worker_threads,
            health_fail_after: flags.health_fail_after,
            backend,
            limiter,
            limit_headers,
            behaviour,
            stats: StatsSettings {
                prometheus,
                mapper_yaml,
                response_time_as_milliseconds,
                max_request_keys: flags
                    .metrics_max_request_keys
                    .unwrap_or(crate::server::stats::DEFAULT_MAX_REQUEST_KEYS),
                per_limit_disabled,
            },
            tracing,
            notices,
        })
    }
}

/// The bounds of the flags, each flag's default where it is not given.
fn bounds(flags: &Flags) -> Result<crate::server::Bounds, SettingsError> {
    let default = crate::server::Bounds::default();
    let bytes = |value: Option<usize>, flag: &str, default: usize| match value {
        Some(0) => Err(SettingsError::Invalid(format!(
            "{flag} must be above 0 bytes (it bounds request messages still arriving)"
        ))),
        Some(bytes) => Ok(bytes),
        None => Ok(default),
    };
    Ok(crate::server::Bounds {
        grpc_max_concurrent_streams: flags
            .grpc_max_concurrent_streams
            .map_or(default.grpc_max_concurrent_streams, |n| n.get()),
        grpc_body_timeout: flags.grpc_body_timeout.unwrap_or(default.grpc_body_timeout),
        grpc_unfinished_bytes_per_connection: bytes(
            flags.grpc_unfinished_bytes_per_connection,
            "--grpc-unfinished-bytes-per-connection",
            default.grpc_unfinished_bytes_per_connection,
        )?,
        grpc_unfinished_bytes: bytes(
            flags.grpc_unfinished_bytes,
            "--grpc-unfinished-bytes",
            default.grpc_unfinished_bytes,
        )?,
        grpc_first_request_timeout: flags
            .grpc_first_request_timeout
            .unwrap_or(default.grpc_first_request_timeout),
        admin_header_read_timeout: flags
            .admin_header_read_timeout
            .unwrap_or(default.admin_header_read_timeout),
        admin_max_connections: flags
            .admin_max_connections
            .map_or(default.admin_max_connections, |n| n.get()),
    })
}

/// `Some(d)` unless `d` is zero (which the reference reads as "never").
pub(super) fn positive(duration: Duration) -> Option<Duration> {
    (!duration.is_zero()).then_some(duration)
}

fn is_header_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_!#$%&'*+.^`|~".contains(&b))
}

#[cfg(test)]
mod tests;
