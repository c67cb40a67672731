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

use std::net::{IpAddr, Ipv4Addr, SocketAddr, ToSocketAddrs};
use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};

use crate::backend::memory;
use crate::backend::redis::connect::{self, Auth, Kind, SocketType, Target, TlsFiles};
use crate::config::xds::{ExtensionDefaults, XdsOptions};
use crate::config::{FailureMode, FileSource, LoadOptions, RuntimeLayout};
use crate::limiter::{self, LimitHeaders};
use crate::server::{GrpcAddr, ListenAddrs};
use crate::window::{Algorithm, Counting};

/// Which program the user started, and so which defaults apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entry {
    /// `tollgate serve`: tollgate's defaults.
    Tollgate,
    /// `ratelimit` (the reference's binary name): the reference's defaults.
    Reference,
}

/// A sliding-window algorithm, spelled as in a policy file (`--xds-default-algorithm`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum AlgorithmArg {
    /// Two fixed-window counts weighted by overlap.
    #[value(name = "sliding_window_counter")]
    SlidingWindowCounter,
    /// One entry per admitted hit, exact.
    #[value(name = "sliding_window_log")]
    SlidingWindowLog,
}

/// Where counters live (`--backend`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BackendKind {
    /// Counters in this process (one instance).
    Memory,
    /// One Redis server.
    Redis,
    /// A Redis Cluster (seed URLs).
    RedisCluster,
    /// The master Redis Sentinel names (`master-name,sentinel:port,...`).
    RedisSentinel,
}

/// Which hits a limit records (`--counting`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CountingArg {
    /// Only admitted hits are recorded; a refused request gives back what it took.
    Admitted,
    /// Every hit is recorded, refused ones included (envoyproxy/ratelimit's counting).
    All,
}

/// What a limit answers when the backend fails (`--failure-mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum FailureModeArg {
    /// Let the request through.
    Allow,
    /// Reject it.
    Deny,
}

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// How much is logged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogLevel {
    /// Everything.
    Trace,
    /// Diagnostics.
    Debug,
    /// Start-up, reloads and state changes.
    Info,
    /// Problems tollgate works around.
    Warn,
    /// Failures.
    Error,
}

impl LogLevel {
    /// The `tracing` filter directive.
    pub fn as_str(self) -> &'static str {
        match self {
            LogLevel::Trace => "trace",
            LogLevel::Debug => "debug",
            LogLevel::Info => "info",
            LogLevel::Warn => "warn",
            LogLevel::Error => "error",
        }
    }
}

/// `tollgate serve`'s flags. Each also reads its `TOLLGATE_*` variable; an absent flag (and
/// variable) leaves the setting to the reference's variable or the default.
#[derive(Debug, Clone, Default, Args)]
pub struct Flags {
    /// A YAML file or a directory of *.yaml / *.yml files (dot files ignored). Without it the
    /// reference's RUNTIME_ROOT / RUNTIME_SUBDIRECTORY / RUNTIME_APPDIRECTORY layout is read
    /// when RUNTIME_* variables are set (or under the `ratelimit` entry point).
    #[arg(long, env = "TOLLGATE_CONFIG")]
    pub config: Option<PathBuf>,
    /// Take the policies from this xDS management server instead (ADS, RateLimitConfig
    /// resources): host:port, or a http:// or https:// URL. The client's other settings are the
    /// reference's variables (CONFIG_GRPC_XDS_*, XDS_CLIENT_*) [also CONFIG_TYPE=GRPC_XDS_SOTW
    /// with CONFIG_GRPC_XDS_SERVER_URL].
    #[arg(long, env = "TOLLGATE_XDS_SERVER_URL")]
    pub xds_server_url: Option<String>,
    /// The algorithm of limits delivered over xDS that name none, for control planes that
    /// cannot set tollgate's extension [default: sliding_window_counter].
    #[arg(long, env = "TOLLGATE_XDS_DEFAULT_ALGORITHM", value_enum)]
    pub xds_default_algorithm: Option<AlgorithmArg>,
    /// Listen address of the RLS, health and reflection gRPC services [default: 0.0.0.0:8081;
    /// also GRPC_HOST, GRPC_PORT].
    #[arg(long, env = "TOLLGATE_GRPC_ADDR")]
    pub grpc_addr: Option<SocketAddr>,
    /// Serve gRPC on this unix socket instead of TCP [also GRPC_UDS].
    #[arg(long, env = "TOLLGATE_GRPC_UDS")]
    pub grpc_uds: Option<PathBuf>,
    /// Listen address of the admin HTTP interface [default: 0.0.0.0:8080; also HOST, PORT].
    #[arg(long, env = "TOLLGATE_HTTP_ADDR")]
    pub http_addr: Option<SocketAddr>,
    /// Listen address of the debug HTTP interface (/rlconfig, /metrics) [default: off; under
    /// `ratelimit` 0.0.0.0:6070; also DEBUG_HOST, DEBUG_PORT].
    #[arg(long, env = "TOLLGATE_DEBUG_ADDR")]
    pub debug_addr: Option<SocketAddr>,
    /// Also serve the metrics on a listener of their own [also USE_PROMETHEUS=true with
    /// PROMETHEUS_ADDR, PROMETHEUS_PATH].
    #[arg(long, env = "TOLLGATE_METRICS_ADDR")]
    pub metrics_addr: Option<SocketAddr>,
    /// The most distinct metric keys built from request values (detailed_metric,
    /// value_to_metric, a descriptor's own limit) that get series of their own; further ones
    /// count under their domain's `tollgate_overflow` key [default: 10000].
    #[arg(long, env = "TOLLGATE_METRICS_MAX_REQUEST_KEYS")]
    pub metrics_max_request_keys: Option<usize>,
    /// Serve gRPC over TLS with this certificate chain (PEM), re-read when it changes [also
    /// GRPC_SERVER_USE_TLS, GRPC_SERVER_TLS_CERT].
    #[arg(long, env = "TOLLGATE_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM) [also GRPC_SERVER_TLS_KEY].
    #[arg(long, env = "TOLLGATE_TLS_KEY")]
    pub tls_key: Option<PathBuf>,
    /// Require client certificates signed by this CA (mutual TLS) [also GRPC_CLIENT_TLS_CACERT,
    /// GRPC_SERVER_TLS_CA_CERT].
    #[arg(long, env = "TOLLGATE_TLS_CLIENT_CA")]
    pub tls_client_ca: Option<PathBuf>,
    /// Require this DNS name among the client certificate's SANs [also GRPC_CLIENT_TLS_SAN].
    #[arg(long, env = "TOLLGATE_TLS_CLIENT_SAN")]
    pub tls_client_san: Option<String>,
    /// Where counters live [default: memory; under `ratelimit` redis; also BACKEND_TYPE,
    /// REDIS_TYPE].
    #[arg(long, env = "TOLLGATE_BACKEND", value_enum)]
    pub backend: Option<BackendKind>,
    /// Redis address: redis:// or rediss:// URL (user and password allowed), host:port or a unix
    /// socket path; a comma-separated list of seeds for redis-cluster; `master,sentinel:port,...`
    /// for redis-sentinel [default: redis://127.0.0.1:6379; also REDIS_URL].
    #[arg(long, env = "TOLLGATE_REDIS_URL")]
    pub redis_url: Option<String>,
    /// Client certificate (PEM) for TLS to Redis; turns TLS on [also REDIS_TLS,
    /// REDIS_TLS_CLIENT_CERT].
    #[arg(long, env = "TOLLGATE_REDIS_TLS_CERT")]
    pub redis_tls_cert: Option<PathBuf>,
    /// Its private key (PEM) [also REDIS_TLS_CLIENT_KEY].
    #[arg(long, env = "TOLLGATE_REDIS_TLS_KEY")]
    pub redis_tls_key: Option<PathBuf>,
    /// The CA that signs the Redis servers' certificates (PEM); turns TLS on [also
    /// REDIS_TLS_CACERT].
    #[arg(long, env = "TOLLGATE_REDIS_TLS_CA")]
    pub redis_tls_ca: Option<PathBuf>,
    /// Count a decision only once this many replicas acknowledged its writes (Redis WAIT), so a
    /// failover never loses an admitted hit; when they do not in time each limit answers its
    /// failure mode [default: 0, off].
    #[arg(long, env = "TOLLGATE_REDIS_WAIT_REPLICAS")]
    pub redis_wait_replicas: Option<u32>,
    /// Prefix of every Redis key, so deployments can share one Redis. No braces: a hash tag in
    /// the prefix would put every limiter (and every shard) on one cluster slot [default:
    /// tollgate:; also CACHE_KEY_PREFIX].
    #[arg(long, env = "TOLLGATE_KEY_PREFIX")]
    pub key_prefix: Option<String>,
    /// Deadline of one backend call; past it each limit answers its failure mode [default:
    /// 50ms].
    #[arg(long, env = "TOLLGATE_BACKEND_TIMEOUT", value_parser = humantime::parse_duration)]
    pub backend_timeout: Option<Duration>,
    /// What a limit answers when the backend fails, unless the limit says otherwise [default:
    /// allow].
    #[arg(long, env = "TOLLGATE_FAILURE_MODE", value_enum)]
    pub failure_mode: Option<FailureModeArg>,
    /// Report, never deny: the overall code is always OK [default: false; also SHADOW_MODE].
    #[arg(long, env = "TOLLGATE_SHADOW_MODE", num_args = 0..=1, default_missing_value = "true",
          action = clap::ArgAction::Set)]
    pub shadow_mode: Option<bool>,
    /// Add `retry-after` to OVER_LIMIT responses [default: true].
    #[arg(long, env = "TOLLGATE_RETRY_AFTER_HEADER", num_args = 0..=1,
          default_missing_value = "true", action = clap::ArgAction::Set)]
    pub retry_after_header: Option<bool>,
    /// Which hits a limit without its own `counting` records: `admitted` (a refused request
    /// consumes nothing) or `all` (every hit is charged, as envoyproxy/ratelimit counts; what
    /// token quotas debited after the response need) [default: admitted for `tollgate serve`;
    /// under `ratelimit`, `all` unless STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=true].
    #[arg(long, env = "TOLLGATE_COUNTING", value_enum)]
    pub counting: Option<CountingArg>,
    /// Treat every descriptor as a quota descriptor: reject only when all are over [default:
    /// false; also QUOTA_MODE].
    #[arg(long, env = "TOLLGATE_QUOTA_MODE", num_args = 0..=1, default_missing_value = "true",
          action = clap::ArgAction::Set)]
    pub quota_mode: Option<bool>,
    /// Return dynamic metadata (domain, descriptors, hits_addend, the passed limits' metadata)
    /// in every response, in envoyproxy/ratelimit's shape [default: false; also
    /// RESPONSE_DYNAMIC_METADATA].
    #[arg(long, env = "TOLLGATE_RESPONSE_DYNAMIC_METADATA", num_args = 0..=1,
          default_missing_value = "true", action = clap::ArgAction::Set)]
    pub response_dynamic_metadata: Option<bool>,
    /// Let several files (or xDS resources) declare one domain and merge their top-level
    /// descriptors [default: false; also MERGE_DOMAIN_CONFIG].
    #[arg(long, env = "TOLLGATE_MERGE_DOMAINS", num_args = 0..=1, default_missing_value = "true",
          action = clap::ArgAction::Set)]
    pub merge_domains: Option<bool>,
    /// How often the policy files and TLS files are checked for changes (SIGHUP reloads the
    /// policies at once) [default: 2s].
    #[arg(long, env = "TOLLGATE_RELOAD_INTERVAL", value_parser = humantime::parse_duration)]
    pub reload_interval: Option<Duration>,
    /// How long changed policy files must stay unchanged before they are loaded (a file caught
    /// mid-write is never applied) [default: 1s].
    #[arg(long, env = "TOLLGATE_RELOAD_SETTLE", value_parser = humantime::parse_duration)]
    pub reload_settle: Option<Duration>,
    /// Apply a reload of the policy files that finds no policies at all (every request then
    /// allowed); otherwise such a reload is refused and the last good policies stay [default:
    /// false].
    #[arg(long, env = "TOLLGATE_ALLOW_EMPTY_CONFIG", num_args = 0..=1,
          default_missing_value = "true", action = clap::ArgAction::Set)]
    pub allow_empty_config: Option<bool>,
    /// The most bytes the memory backend holds (e.g. `256MiB`, `1GiB`, at least 1MiB); past it
    /// expired windows are dropped first, then those expiring soonest [default: 256MiB, or half
    /// the cgroup's memory limit when that is smaller].
    #[arg(long, env = "TOLLGATE_MEMORY_BUDGET", value_parser = parse_bytes)]
    pub memory_budget: Option<usize>,
    /// The most bytes the local over-limit cache holds (e.g. `8MiB`); `0` turns it off. It
    /// answers a hit the backend refused, until the instant the backend could admit it, without
    /// a backend call (also LOCAL_CACHE_SIZE_IN_BYTES) [default: 8MiB with the memory backend, 0
    /// (off) with Redis, where other instances' refunds are not seen].
    #[arg(long, env = "TOLLGATE_LOCAL_CACHE_BYTES", value_parser = parse_size)]
    pub local_cache_bytes: Option<usize>,
    /// The most decisions in flight at once (gRPC and POST /json together); past it a call is
    /// answered at once with RESOURCE_EXHAUSTED (Envoy applies its failure_mode_deny). 0:
    /// unbounded [default: 256].
    #[arg(long, env = "TOLLGATE_MAX_IN_FLIGHT")]
    pub max_in_flight: Option<usize>,
    /// Serve ShouldRateLimit on the hand-written gRPC path; `false` serves every call through
    /// tonic's generated service instead (the same answers, at some CPU per call), for a tonic
    /// upgrade or a fault suspected in the fast path [default: true].
    #[arg(long, env = "TOLLGATE_GRPC_FAST_PATH", num_args = 0..=1,
          default_missing_value = "true", action = clap::ArgAction::Set)]
    pub grpc_fast_path: Option<bool>,
    /// Threads that run decisions (the async runtime's workers); also TOKIO_WORKER_THREADS, or
    /// GOMAXPROCS as the reference's Go runtime reads it [default: the CPUs the process may
    /// use, a cgroup's CPU quota included].
    #[arg(long, env = "TOLLGATE_WORKER_THREADS")]
    pub worker_threads: Option<NonZeroUsize>,
    /// Turn health NOT_SERVING once every backend call has failed for this long (e.g. `30s`).
    /// Unset, a sustained failure is logged as an error and health stays SERVING, since each
    /// limit answers its failure_mode [default: unset].
    #[arg(long, env = "TOLLGATE_HEALTH_FAIL_AFTER", value_parser = humantime::parse_duration)]
    pub health_fail_after: Option<Duration>,
    /// How long SIGTERM waits for calls and streams in flight before exiting anyway [default:
    /// 10s].
    #[arg(long, env = "TOLLGATE_DRAIN_TIMEOUT", value_parser = humantime::parse_duration)]
    pub drain_timeout: Option<Duration>,
    /// Log level [default: info, or RUST_LOG's filter; also LOG_LEVEL].
    #[arg(long, env = "TOLLGATE_LOG_LEVEL", value_enum)]
    pub log_level: Option<LogLevel>,
    /// Log format [default: text; also LOG_FORMAT].
    #[arg(long, env = "TOLLGATE_LOG_FORMAT", value_enum)]
    pub log_format: Option<LogFormat>,
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

/// Where policies come from.
#[derive(Debug, Clone, PartialEq)]
pub enum PolicySettings {
    /// Files: a path, or the reference's runtime layout.
    Files(FileSource),
    /// An xDS server (`--xds-server-url`, or `CONFIG_TYPE=GRPC_XDS_SOTW`).
    XdsSotw {
        /// The client's settings, from `CONFIG_GRPC_XDS_*` and `XDS_CLIENT_*`.
        options: Box<XdsOptions>,
        /// What limits get when a push leaves tollgate's extensions out.
        defaults: ExtensionDefaults,
    },
}

/// Logging.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogSettings {
    /// The level; `None` leaves it to `RUST_LOG` (default `info`).
    pub level: Option<LogLevel>,
    /// `RUST_LOG`'s filter, when no level is given and it is set, not empty, and parses.
    pub rust_log: Option<String>,
    /// The line format.
    pub format: LogFormat,
}

impl LogSettings {
    /// The filter logging starts with: the level, else `RUST_LOG`'s, else `info`.
    pub fn directives(&self) -> &str {
        match (self.level, &self.rust_log) {
            (Some(level), _) => level.as_str(),
            (None, Some(filter)) => filter,
            (None, None) => LogLevel::Info.as_str(),
        }
    }
}

/// The gRPC server's connection behaviour.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrpcSettings {
    /// TLS, when on.
    pub tls: Option<crate::server::TlsFiles>,
    /// `GRPC_MAX_CONNECTION_AGE`: after how long a connection is sent GOAWAY (`None`: never).
    pub max_connection_age: Option<Duration>,
    /// `GRPC_MAX_CONNECTION_AGE_GRACE`: how long it may then finish its calls.
    pub max_connection_age_grace: Option<Duration>,
    /// `--grpc-fast-path`: ShouldRateLimit on the hand-written path (`false`: tonic's generated
    /// service).
    pub fast_path: bool,
}

/// The store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Store {
    /// In this process.
    Memory,
    /// A Redis deployment.
    Redis(Box<Target>),
}

/// Where counters live and how they are reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendSettings {
    /// The main store.
    pub store: Store,
    /// A second Redis for one-second windows (`REDIS_PERSECOND`).
    pub per_second: Option<Target>,
    /// The prefix of every key.
    pub key_prefix: String,
    /// The deadline of one backend call.
    pub timeout: Duration,
    /// Replicas that must acknowledge a decision's writes (0: none).
    pub wait_replicas: u32,
    /// The most bytes the memory store holds (unused by the Redis stores).
    pub memory_budget: usize,
    /// `EXPIRATION_JITTER_MAX_SECONDS`: parsed only; sliding-window keys expire when their last
    /// entry leaves the window, so there is nothing to spread.
    pub expiration_jitter_max_seconds: i64,
}

/// Settings whose behaviour other parts of tollgate implement (or will); parsed and checked here.
#[derive(Debug, Clone, PartialEq)]
pub struct Behaviour {
    /// `NEAR_LIMIT_RATIO`: the share of a limit past which a hit counts as "near limit" in the
    /// reference's metrics. Parsed for those metrics.
    pub near_limit_ratio: f64,
    /// `--local-cache-bytes` or `LOCAL_CACHE_SIZE_IN_BYTES`: the byte budget of the local
    /// over-limit cache (0: off); `None` when neither is set (the default depends on the store:
    /// see [`Behaviour::local_cache_bytes`]).
    pub local_cache_size_in_bytes: Option<u64>,
}

impl Behaviour {
    /// The local over-limit cache's budget in front of `store`: as set, else on for the memory
    /// backend (every release goes through this process, so the cache is exact) and off for Redis
    /// (another instance's refund of a rejected request's charge is not seen here, and an entry
    /// would keep refusing what that refund made room for).
    pub fn local_cache_bytes(&self, store: &Store) -> u64 {
        match (self.local_cache_size_in_bytes, store) {
            (Some(bytes), _) => bytes,
            (None, Store::Memory) => crate::backend::local_cache::DEFAULT_BYTES,
            (None, Store::Redis(_)) => 0,
        }
    }
}

/// Metrics export.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatsSettings {
    /// Where the metrics are also served on a listener of their own, and at which path.
    pub prometheus: Option<PrometheusSettings>,
    /// `PROMETHEUS_MAPPER_YAML`: a statsd_exporter mapping file for the reference-named metrics.
    pub mapper_yaml: Option<PathBuf>,
    /// `PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS`.
    pub response_time_as_milliseconds: bool,
    /// `--metrics-max-request-keys`: the cap on request-built metric keys.
    pub max_request_keys: usize,
    /// `DISABLE_STATS=true`: the per-limit statistics are not recorded (the service's own
    /// series stay).
    pub per_limit_disabled: bool,
}

/// A metrics listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrometheusSettings {
    /// `PROMETHEUS_ADDR`.
    pub addr: SocketAddr,
    /// `PROMETHEUS_PATH`.
    pub path: String,
}

/// Span export over OTLP (`TRACING_*`, `OTEL_EXPORTER_OTLP_ENDPOINT`), with the reference's
/// defaults: off, service name `RateLimit`, OTLP/HTTP, every trace sampled.
#[derive(Debug, Clone, PartialEq)]
pub struct TracingSettings {
    /// `TRACING_ENABLED`.
    pub enabled: bool,
    /// `TRACING_SERVICE_NAME`.
    pub service_name: String,
    /// `TRACING_SERVICE_NAMESPACE`.
    pub service_namespace: Option<String>,
    /// `TRACING_SERVICE_INSTANCE_ID`.
    pub service_instance_id: Option<String>,
    /// `TRACING_EXPORTER_PROTOCOL`.
    pub exporter_protocol: ExporterProtocol,
    /// `TRACING_SAMPLING_RATE`.
    pub sampling_rate: f64,
    /// `OTEL_EXPORTER_OTLP_ENDPOINT`.
    pub otlp_endpoint: Option<String>,
}

/// How spans are exported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExporterProtocol {
    /// OTLP over HTTP.
    Http,
    /// OTLP over gRPC.
    Grpc,
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
    /// How long SIGTERM waits for calls in flight.
    pub drain_timeout: Duration,
    /// The most decisions in flight at once; `None`: unbounded.
    pub max_in_flight: Option<usize>,
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
const DEFAULT_REDIS_URL: &str = "redis://127.0.0.1:6379";
const DEFAULT_KEY_PREFIX: &str = "tollgate:";
const DEFAULT_BACKEND_TIMEOUT: Duration = Duration::from_millis(50);
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
            drain_timeout: flags.drain_timeout.unwrap_or(Duration::from_secs(10)),
            max_in_flight: match flags.max_in_flight {
                Some(0) => None,
                Some(bound) => Some(bound),
                None => Some(DEFAULT_MAX_IN_FLIGHT),
            },
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

/// `Some(d)` unless `d` is zero (which the reference reads as "never").
fn positive(duration: Duration) -> Option<Duration> {
    (!duration.is_zero()).then_some(duration)
}

fn is_header_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_!#$%&'*+.^`|~".contains(&b))
}

fn grpc_tls(
    flags: &Flags,
    env: &Env<'_>,
    notices: &mut Vec<String>,
) -> Result<Option<crate::server::TlsFiles>, SettingsError> {
    let use_tls = flags.tls_cert.is_some()
        || flags.tls_key.is_some()
        || env.boolean("GRPC_SERVER_USE_TLS")?.unwrap_or(false);
    let path = |flag: &Option<PathBuf>, var: &str| {
        flag.clone()
            .or_else(|| env.string(var).filter(|p| !p.is_empty()).map(PathBuf::from))
    };
    let client_ca = flags.tls_client_ca.clone().or_else(|| {
        ["GRPC_CLIENT_TLS_CACERT", "GRPC_SERVER_TLS_CA_CERT"]
            .into_iter()
            .find_map(|var| env.string(var).filter(|p| !p.is_empty()))
            .map(PathBuf::from)
    });
    let client_san = flags
        .tls_client_san
        .clone()
        .or_else(|| env.string("GRPC_CLIENT_TLS_SAN"))
        .filter(|san| !san.is_empty());
    if !use_tls {
        return Ok(None);
    }
    let (Some(cert), Some(key)) = (
        path(&flags.tls_cert, "GRPC_SERVER_TLS_CERT"),
        path(&flags.tls_key, "GRPC_SERVER_TLS_KEY"),
    ) else {
        return Err(SettingsError::Invalid(
            "gRPC TLS needs a certificate and its key: set GRPC_SERVER_TLS_CERT and \
             GRPC_SERVER_TLS_KEY (or --tls-cert and --tls-key)"
                .into(),
        ));
    };
    if client_san.is_some() && client_ca.is_none() {
        notices.push(
            "GRPC_CLIENT_TLS_SAN has no effect without a client CA (GRPC_CLIENT_TLS_CACERT): \
             client certificates are not requested"
                .into(),
        );
    }
    Ok(Some(crate::server::TlsFiles {
        cert,
        key,
        client_san: client_san.filter(|_| client_ca.is_some()),
        client_ca,
    }))
}

fn policies(entry: Entry, flags: &Flags, env: &Env<'_>) -> Result<PolicySettings, SettingsError> {
    let xds_wanted = match env.string("CONFIG_TYPE").as_deref() {
        None | Some("FILE") => false,
        Some("GRPC_XDS_SOTW") => true,
        Some(_) => return Err(env.malformed("CONFIG_TYPE", "FILE or GRPC_XDS_SOTW")),
    };
    // A flag wins over the environment: --config reads files whatever CONFIG_TYPE says.
    match (&flags.config, &flags.xds_server_url) {
        (Some(_), Some(_)) => {
            return Err(SettingsError::Invalid(
                "give either --config or --xds-server-url, not both".into(),
            ));
        }
        (Some(path), None) => return Ok(PolicySettings::Files(FileSource::Path(path.clone()))),
        (None, Some(url)) => return xds_policies(flags, env, Some(url)),
        (None, None) if xds_wanted => return xds_policies(flags, env, None),
        (None, None) => {}
    }
    const RUNTIME: [&str; 5] = [
        "RUNTIME_ROOT",
        "RUNTIME_SUBDIRECTORY",
        "RUNTIME_APPDIRECTORY",
        "RUNTIME_WATCH_ROOT",
        "RUNTIME_IGNOREDOTFILES",
    ];
    if entry == Entry::Tollgate && RUNTIME.iter().all(|var| env.string(var).is_none()) {
        return Err(SettingsError::Invalid(
            "no policies: pass --config PATH (or TOLLGATE_CONFIG), or set the reference's \
             RUNTIME_ROOT / RUNTIME_SUBDIRECTORY / RUNTIME_APPDIRECTORY"
                .into(),
        ));
    }
    Ok(PolicySettings::Files(FileSource::Runtime(RuntimeLayout {
        root: PathBuf::from(
            env.string("RUNTIME_ROOT")
                .unwrap_or_else(|| "/srv/runtime_data/current".into()),
        ),
        subdirectory: env.string("RUNTIME_SUBDIRECTORY").unwrap_or_default(),
        appdirectory: env
            .string("RUNTIME_APPDIRECTORY")
            .unwrap_or_else(|| "config".into()),
        watch_root: env.boolean("RUNTIME_WATCH_ROOT")?.unwrap_or(true),
        ignore_dot_files: env.boolean("RUNTIME_IGNOREDOTFILES")?.unwrap_or(false),
    })))
}

/// The xDS source: its client settings from the reference's variables, the server from
/// `--xds-server-url` when given; files it names must be readable now.
fn xds_policies(
    flags: &Flags,
    env: &Env<'_>,
    server_url: Option<&String>,
) -> Result<PolicySettings, SettingsError> {
    let invalid =
        |error: crate::config::xds::XdsOptionsError| SettingsError::Invalid(error.to_string());
    let mut options = XdsOptions::from_env(|name| env.string(name)).map_err(invalid)?;
    if let Some(url) = server_url {
        options.server_url = url.clone();
    }
    // Whether its TLS files can be read is checked at start-up, not here, where settings are
    // only resolved.
    options.validate().map_err(invalid)?;
    let defaults = ExtensionDefaults {
        algorithm: flags
            .xds_default_algorithm
            .map(|algorithm| match algorithm {
                AlgorithmArg::SlidingWindowCounter => Algorithm::SlidingWindowCounter,
                AlgorithmArg::SlidingWindowLog => Algorithm::SlidingWindowLog,
            }),
    };
    Ok(PolicySettings::XdsSotw {
        options: Box::new(options),
        defaults,
    })
}

fn backend(
    entry: Entry,
    flags: &Flags,
    env: &Env<'_>,
    notices: &mut Vec<String>,
) -> Result<BackendSettings, SettingsError> {
    let redis_type = |var: &str| -> Result<Kind, SettingsError> {
        match env.string(var) {
            None => Ok(Kind::Single),
            Some(text) => match text.to_ascii_lowercase().as_str() {
                "single" => Ok(Kind::Single),
                "cluster" => Ok(Kind::Cluster),
                "sentinel" => Ok(Kind::Sentinel),
                _ => Err(env.malformed(var, "single, cluster or sentinel")),
            },
        }
    };
    let main_type = redis_type("REDIS_TYPE")?;
    let kind = match flags.backend {
        Some(BackendKind::Memory) => None,
        Some(BackendKind::Redis) => Some(Kind::Single),
        Some(BackendKind::RedisCluster) => Some(Kind::Cluster),
        Some(BackendKind::RedisSentinel) => Some(Kind::Sentinel),
        None => match env.string("BACKEND_TYPE").as_deref() {
            Some("redis" | "") => Some(main_type),
            Some("memcache") => {
                return Err(SettingsError::Unsupported(
                    "BACKEND_TYPE=memcache: tollgate has no memcached backend; use \
                     BACKEND_TYPE=redis (its windows need Redis's atomic scripts)"
                        .into(),
                ));
            }
            Some(_) => return Err(env.malformed("BACKEND_TYPE", "redis (or memcache)")),
            None if entry == Entry::Reference => Some(main_type),
            None => None,
        },
    };
    let key_prefix = match &flags.key_prefix {
        Some(prefix) => prefix.clone(),
        None => env
            .string("CACHE_KEY_PREFIX")
            .unwrap_or_else(|| DEFAULT_KEY_PREFIX.into()),
    };
    if key_prefix.contains(['{', '}']) {
        let name = if flags.key_prefix.is_some() {
            "--key-prefix"
        } else {
            "CACHE_KEY_PREFIX"
        };
        return Err(SettingsError::Invalid(format!(
            "{name}: a key prefix must not contain `{{` or `}}`: tollgate places the Redis hash \
             tag itself"
        )));
    }
    let timeout = flags.backend_timeout.unwrap_or(DEFAULT_BACKEND_TIMEOUT);
    let memory_budget = flags.memory_budget.unwrap_or_else(memory::default_budget);
    let expiration_jitter_max_seconds = env.int("EXPIRATION_JITTER_MAX_SECONDS")?.unwrap_or(300);
    let wait_replicas = flags.redis_wait_replicas.unwrap_or(0);
    let tls_files = redis_tls_files(flags, env)?;
    let main_tls = tls_files.is_some()
        && (env.boolean("REDIS_TLS")?.unwrap_or(false)
            || flags.redis_tls_cert.is_some()
            || flags.redis_tls_ca.is_some());
    let per_second_wanted = env.boolean("REDIS_PERSECOND")?.unwrap_or(false);

    let Some(kind) = kind else {
        if per_second_wanted {
            notices.push(
                "REDIS_PERSECOND=true is ignored: the backend is memory (set BACKEND_TYPE=redis \
                 or --backend redis)"
                    .into(),
            );
        }
        return Ok(BackendSettings {
            store: Store::Memory,
            per_second: None,
            key_prefix,
            timeout,
            wait_replicas,
            memory_budget,
            expiration_jitter_max_seconds,
        });
    };
    if flags.memory_budget.is_some() {
        notices.push(
            "--memory-budget is ignored: it bounds the memory backend, and the counters are in \
             Redis"
                .into(),
        );
    }
    if kind == Kind::Cluster && wait_replicas > 0 {
        return Err(SettingsError::Unsupported(
            "--redis-wait-replicas is for one server or sentinel, not a cluster".into(),
        ));
    }
    let (url, url_name) = match &flags.redis_url {
        Some(url) => (url.clone(), "--redis-url"),
        None => match env.string("REDIS_URL") {
            Some(url) => (url, "REDIS_URL"),
            None => (DEFAULT_REDIS_URL.to_owned(), "--redis-url"),
        },
    };
    let main = redis_target(
        env,
        RedisVars {
            url_name,
            url: &url,
            kind,
            socket_type: "REDIS_SOCKET_TYPE",
            auth: "REDIS_AUTH",
            sentinel_auth: "REDIS_SENTINEL_AUTH",
            pool_size: "REDIS_POOL_SIZE",
            timeout: "REDIS_TIMEOUT",
        },
        main_tls.then(|| tls_files.clone()).flatten(),
    )?;
    let per_second = if per_second_wanted {
        let ps_type = redis_type("REDIS_PERSECOND_TYPE")?;
        let ps_url = env.string("REDIS_PERSECOND_URL").ok_or_else(|| {
            SettingsError::Invalid("REDIS_PERSECOND=true needs REDIS_PERSECOND_URL".into())
        })?;
        let ps_tls = env.boolean("REDIS_PERSECOND_TLS")?.unwrap_or(false);
        Some(redis_target(
            env,
            RedisVars {
                url_name: "REDIS_PERSECOND_URL",
                url: &ps_url,
                kind: ps_type,
                socket_type: "REDIS_PERSECOND_SOCKET_TYPE",
                auth: "REDIS_PERSECOND_AUTH",
                sentinel_auth: "REDIS_PERSECOND_SENTINEL_AUTH",
                pool_size: "REDIS_PERSECOND_POOL_SIZE",
                timeout: "REDIS_PERSECOND_TIMEOUT",
            },
            if ps_tls {
                Some(tls_files.clone().unwrap_or_default())
            } else {
                None
            },
        )?)
    } else {
        None
    };
    if per_second.as_ref().is_some_and(|t| t.kind == Kind::Cluster) && wait_replicas > 0 {
        return Err(SettingsError::Unsupported(
            "--redis-wait-replicas is for one server or sentinel, not a per-second cluster".into(),
        ));
    }
    Ok(BackendSettings {
        store: Store::Redis(Box::new(main)),
        per_second,
        key_prefix,
        timeout,
        wait_replicas,
        memory_budget,
        expiration_jitter_max_seconds,
    })
}

/// The TLS files for Redis from flags and `REDIS_TLS_*`, shared by both stores as in the
/// reference; `None` when TLS is not asked for at all.
fn redis_tls_files(flags: &Flags, env: &Env<'_>) -> Result<Option<TlsFiles>, SettingsError> {
    let wanted = flags.redis_tls_cert.is_some()
        || flags.redis_tls_ca.is_some()
        || env.boolean("REDIS_TLS")?.unwrap_or(false)
        || env.boolean("REDIS_PERSECOND_TLS")?.unwrap_or(false);
    let path = |flag: &Option<PathBuf>, var: &str| {
        flag.clone()
            .or_else(|| env.string(var).filter(|p| !p.is_empty()).map(PathBuf::from))
    };
    let files = TlsFiles {
        client_cert: path(&flags.redis_tls_cert, "REDIS_TLS_CLIENT_CERT"),
        client_key: path(&flags.redis_tls_key, "REDIS_TLS_CLIENT_KEY"),
        ca_cert: path(&flags.redis_tls_ca, "REDIS_TLS_CACERT"),
        skip_hostname_verification: env
            .boolean("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION")?
            .unwrap_or(false),
    };
    if files.client_cert.is_some() != files.client_key.is_some() {
        return Err(SettingsError::Invalid(
            "a Redis client certificate needs both REDIS_TLS_CLIENT_CERT and REDIS_TLS_CLIENT_KEY \
             (or --redis-tls-cert and --redis-tls-key)"
                .into(),
        ));
    }
    Ok(wanted.then_some(files))
}

/// The variable names of one Redis store (main or per-second).
struct RedisVars<'a> {
    url_name: &'a str,
    url: &'a str,
    kind: Kind,
    socket_type: &'a str,
    auth: &'a str,
    sentinel_auth: &'a str,
    pool_size: &'a str,
    timeout: &'a str,
}

fn redis_target(
    env: &Env<'_>,
    vars: RedisVars<'_>,
    tls: Option<TlsFiles>,
) -> Result<Target, SettingsError> {
    let socket_type = match env.string(vars.socket_type) {
        None => None,
        Some(text) => match text.as_str() {
            "tcp" | "tcp4" | "tcp6" => Some(SocketType::Tcp),
            "unix" => Some(SocketType::Unix),
            _ => return Err(env.malformed(vars.socket_type, "tcp or unix")),
        },
    };
    let mut target = Target::parse(vars.kind, vars.url, socket_type).map_err(|err| {
        SettingsError::Invalid(format!(
            "{}={}: {err}",
            vars.url_name,
            connect::redact(vars.url)
        ))
    })?;
    target.auth = env.secret(vars.auth).map(|text| Auth::parse(&text));
    target.sentinel_auth = env
        .secret(vars.sentinel_auth)
        .map(|text| Auth::parse(&text));
    target.tls = tls;
    target.pool_size = match env.int(vars.pool_size)? {
        Some(n) if n < 0 => return Err(env.malformed(vars.pool_size, "a count of 0 or more")),
        Some(n) => usize::try_from(n).ok(),
        None => None,
    };
    target.connect_timeout = env.duration(vars.timeout)?.and_then(positive);
    if let Some(tls) = &target.tls
        && tls.skip_hostname_verification
        && target.kind == Kind::Sentinel
    {
        return Err(SettingsError::Unsupported(
            "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION is not supported with REDIS_TYPE=sentinel; give \
             the CA that signs the servers' certificates (REDIS_TLS_CACERT) instead"
                .into(),
        ));
    }
    Ok(target)
}

/// Reads the reference's sink variables, none of which tollgate needs; answers whether
/// `DISABLE_STATS` turns the per-limit statistics off.
fn stats_sinks(env: &Env<'_>, notices: &mut Vec<String>) -> Result<bool, SettingsError> {
    if env.boolean("USE_STATSD")? == Some(true) {
        notices.push(
            "USE_STATSD=true: tollgate does not push statsd; its metrics are served in the \
             Prometheus text format on /metrics (and on PROMETHEUS_ADDR with USE_PROMETHEUS=true)"
                .into(),
        );
    }
    if env.boolean("USE_DOG_STATSD")? == Some(true) {
        notices.push(
            "USE_DOG_STATSD=true: tollgate does not push DogStatsD; its metrics are served in \
             the Prometheus text format on /metrics"
                .into(),
        );
    }
    let disabled = env.boolean("DISABLE_STATS")? == Some(true);
    env.int("STATSD_PORT")?;
    env.duration("STATS_FLUSH_INTERVAL")?;
    env.map("EXTRA_TAGS")?;
    Ok(disabled)
}

fn behaviour(flags: &Flags, env: &Env<'_>) -> Result<Behaviour, SettingsError> {
    let near_limit_ratio = env.float("NEAR_LIMIT_RATIO")?.unwrap_or(0.8);
    // The reference's 0 (its default) turns the cache off when set explicitly; unset, the
    // backend decides (`Behaviour::local_cache_bytes`).
    let local_cache_size_in_bytes = match flags.local_cache_bytes {
        Some(bytes) => Some(u64::try_from(bytes).unwrap_or(u64::MAX)),
        None => match env.int("LOCAL_CACHE_SIZE_IN_BYTES")? {
            Some(n) if n < 0 => {
                return Err(
                    env.malformed("LOCAL_CACHE_SIZE_IN_BYTES", "a size in bytes, 0 or more")
                );
            }
            Some(n) => Some(u64::try_from(n).unwrap_or(0)),
            None => None,
        },
    };
    Ok(Behaviour {
        near_limit_ratio,
        local_cache_size_in_bytes,
    })
}

fn tracing_settings(env: &Env<'_>) -> Result<TracingSettings, SettingsError> {
    let enabled = env.boolean("TRACING_ENABLED")?.unwrap_or(false);
    let exporter_protocol = match env.string("TRACING_EXPORTER_PROTOCOL").as_deref() {
        None | Some("http" | "") => ExporterProtocol::Http,
        Some("grpc") => ExporterProtocol::Grpc,
        Some(_) => return Err(env.malformed("TRACING_EXPORTER_PROTOCOL", "http or grpc")),
    };
    let settings = TracingSettings {
        enabled,
        service_name: env
            .string("TRACING_SERVICE_NAME")
            .unwrap_or_else(|| "RateLimit".into()),
        service_namespace: env
            .string("TRACING_SERVICE_NAMESPACE")
            .filter(|s| !s.is_empty()),
        service_instance_id: env
            .string("TRACING_SERVICE_INSTANCE_ID")
            .filter(|s| !s.is_empty()),
        exporter_protocol,
        sampling_rate: env.float("TRACING_SAMPLING_RATE")?.unwrap_or(1.0),
        otlp_endpoint: env
            .string("OTEL_EXPORTER_OTLP_ENDPOINT")
            .filter(|s| !s.is_empty()),
    };
    Ok(settings)
}

/// Variables tollgate accepts and ignores, read with their types so that a value the reference
/// would refuse is refused here too.
fn ignored_but_typed(env: &Env<'_>, notices: &mut Vec<String>) -> Result<(), SettingsError> {
    for prefix in ["REDIS", "REDIS_PERSECOND"] {
        env.duration(&format!("{prefix}_PIPELINE_WINDOW"))?;
        env.int(&format!("{prefix}_PIPELINE_LIMIT"))?;
        let parallelism = format!("{prefix}_CLUSTER_PIPELINE_PARALLELISM");
        if env.int(&parallelism)?.is_some_and(|n| n < 0) {
            return Err(env.malformed(&parallelism, "0 (auto) or more"));
        }
        let on_empty = format!("{prefix}_POOL_ON_EMPTY_BEHAVIOR");
        if let Some(behaviour) = env.string(&on_empty)
            && !behaviour.eq_ignore_ascii_case("WAIT")
        {
            notices.push(format!(
                "{on_empty}={behaviour}: ignored; tollgate's Redis connections are multiplexed, \
                 so calls never wait for a free connection"
            ));
        }
    }
    env.boolean("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION")?;
    // Read again where a Redis store uses them; checked here whatever the backend.
    for var in ["REDIS_TIMEOUT", "REDIS_PERSECOND_TIMEOUT"] {
        env.duration(var)?;
    }
    for var in ["REDIS_POOL_SIZE", "REDIS_PERSECOND_POOL_SIZE"] {
        env.int(var)?;
    }
    for var in [
        "REDIS_TLS",
        "REDIS_PERSECOND_TLS",
        "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION",
        "REDIS_PERSECOND",
    ] {
        env.boolean(var)?;
    }
    for var in [
        "REDIS_STARTUP_INITIAL_INTERVAL",
        "REDIS_STARTUP_MAX_INTERVAL",
        "REDIS_STARTUP_MAX_ELAPSED_TIME",
        "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL",
        "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL",
        "XDS_CLIENT_BACKOFF_MAX_INTERVAL",
    ] {
        env.duration(var)?;
    }
    env.boolean("CONFIG_GRPC_XDS_SERVER_USE_TLS")?;
    env.boolean("XDS_CLIENT_BACKOFF_JITTER")?;
    env.float("XDS_CLIENT_BACKOFF_RANDOM_FACTOR")?;
    env.int("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES")?;
    env.map("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS")?;
    for var in ["MEMCACHE_TLS", "MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION"] {
        env.boolean(var)?;
    }
    env.int("MEMCACHE_MAX_IDLE_CONNS")?;
    env.duration("MEMCACHE_SRV_REFRESH")?;
    Ok(())
}

/// A listen address in Go's forms: `:9090` (every interface), `host:9090`, `[::1]:9090`.
fn listen_addr(text: &str) -> Option<SocketAddr> {
    let (host, port) = text.rsplit_once(':')?;
    let port: u16 = port.parse().ok()?;
    resolve(host.trim_start_matches('[').trim_end_matches(']'), port)
}

/// `host` (empty: every interface) and `port` as one address, resolving a host name.
fn resolve(host: &str, port: u16) -> Option<SocketAddr> {
    if host.is_empty() {
        return Some(SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), port));
    }
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Some(SocketAddr::new(ip, port));
    }
    (host, port).to_socket_addrs().ok()?.next()
}

/// Reads a size in bytes (`--memory-budget`): a number with an optional unit (`B`, `KiB`, `MiB`,
/// `GiB`, or `KB`, `MB`, `GB` in powers of ten; `K`, `M`, `G` are read as KiB, MiB, GiB), at
/// least the memory backend's smallest budget.
pub fn parse_bytes(text: &str) -> Result<usize, String> {
    let bytes = parse_size(text)?;
    if bytes < memory::MIN_BUDGET {
        return Err(format!(
            "{:?} is below the smallest memory budget, 1MiB",
            text.trim()
        ));
    }
    Ok(bytes)
}

/// Reads a size in bytes (`--local-cache-bytes`): a number with an optional unit, as
/// [`parse_bytes`] reads it, 0 included.
pub fn parse_size(text: &str) -> Result<usize, String> {
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
    Ok(bytes)
}

/// The process environment as [`Settings::resolve`] reads it (a value that is not UTF-8 is read
/// lossily).
pub fn process_env(name: &str) -> Option<String> {
    std::env::var_os(name).map(|value| value.to_string_lossy().into_owned())
}

/// Reads the boolean variable `name` from `get` with the reference's rules (`1`, `t`, `TRUE`,
/// ...); unset or empty is `None`.
pub fn boolean_var(
    name: &str,
    get: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<bool>, SettingsError> {
    Env { get }.boolean(name)
}

/// Reads variables with the reference's (Go envconfig's) rules.
struct Env<'a> {
    get: &'a dyn Fn(&str) -> Option<String>,
}

/// Variables whose value is never printed.
const SECRETS: &[&str] = &[
    "REDIS_AUTH",
    "REDIS_SENTINEL_AUTH",
    "REDIS_PERSECOND_AUTH",
    "REDIS_PERSECOND_SENTINEL_AUTH",
];

impl Env<'_> {
    fn string(&self, name: &str) -> Option<String> {
        (self.get)(name)
    }

    /// A secret: empty means none.
    fn secret(&self, name: &str) -> Option<String> {
        self.string(name).filter(|s| !s.is_empty())
    }

    fn malformed(&self, name: &str, expected: &str) -> SettingsError {
        let value = self.string(name).unwrap_or_default();
        let value = if SECRETS.contains(&name) {
            "<redacted>".to_owned()
        } else if name.contains("URL") {
            connect::redact(&value)
        } else {
            value
        };
        SettingsError::Malformed {
            name: name.to_owned(),
            value,
            expected: format!("expected {expected}"),
        }
    }

    fn boolean(&self, name: &str) -> Result<Option<bool>, SettingsError> {
        match self.string(name).as_deref() {
            None => Ok(None),
            Some("1" | "t" | "T" | "TRUE" | "true" | "True") => Ok(Some(true)),
            Some("0" | "f" | "F" | "FALSE" | "false" | "False") => Ok(Some(false)),
            Some(_) => Err(self.malformed(name, "true or false (also 1, 0, t, f, TRUE, FALSE)")),
        }
    }

    fn int(&self, name: &str) -> Result<Option<i64>, SettingsError> {
        match self.string(name) {
            None => Ok(None),
            Some(text) => go_int(&text)
                .map(Some)
                .ok_or_else(|| self.malformed(name, "a whole number")),
        }
    }

    /// A positive whole number; unset or empty is `None`.
    fn count(&self, name: &str) -> Result<Option<NonZeroUsize>, SettingsError> {
        match self.string(name).as_deref().map(str::trim) {
            None | Some("") => Ok(None),
            Some(text) => text
                .parse::<NonZeroUsize>()
                .map(Some)
                .map_err(|_| self.malformed(name, "a whole number of 1 or more")),
        }
    }

    fn float(&self, name: &str) -> Result<Option<f64>, SettingsError> {
        match self.string(name) {
            None => Ok(None),
            Some(text) => text
                .parse::<f64>()
                .map(Some)
                .map_err(|_| self.malformed(name, "a number such as 0.8")),
        }
    }

    fn duration(&self, name: &str) -> Result<Option<Duration>, SettingsError> {
        match self.string(name) {
            None => Ok(None),
            Some(text) => go_duration(&text).map(Some).ok_or_else(|| {
                self.malformed(
                    name,
                    "a duration such as 10s, 250ms or 1h30m (units ns, us, ms, s, m, h)",
                )
            }),
        }
    }

    fn map(&self, name: &str) -> Result<Option<Vec<(String, String)>>, SettingsError> {
        let Some(text) = self.string(name) else {
            return Ok(None);
        };
        if text.trim().is_empty() {
            return Ok(Some(Vec::new()));
        }
        text.split(',')
            .map(|item| {
                let parts: Vec<&str> = item.split(':').collect();
                match parts.as_slice() {
                    [key, value] => Ok(((*key).to_owned(), (*value).to_owned())),
                    _ => Err(self.malformed(name, "key:value pairs separated by commas")),
                }
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }

    /// A host variable and a port variable as one address; `None` when neither is set.
    fn host_port(
        &self,
        host_var: &str,
        port_var: &str,
        default_port: u16,
    ) -> Result<Option<SocketAddr>, SettingsError> {
        let host = self.string(host_var);
        let port = match self.int(port_var) {
            Ok(None) => None,
            Ok(Some(port)) => Some(
                u16::try_from(port)
                    .map_err(|_| self.malformed(port_var, "a port number from 0 to 65535"))?,
            ),
            Err(_) => {
                return Err(self.malformed(port_var, "a port number from 0 to 65535, such as 8080"));
            }
        };
        if host.is_none() && port.is_none() {
            return Ok(None);
        }
        let host = host.unwrap_or_else(|| "0.0.0.0".into());
        let port = port.unwrap_or(default_port);
        resolve(&host, port)
            .map(Some)
            .ok_or_else(|| self.malformed(host_var, "an IP address or a host name that resolves"))
    }

    fn log_level(&self) -> Result<Option<LogLevel>, SettingsError> {
        let Some(text) = self.string("LOG_LEVEL") else {
            return Ok(None);
        };
        match text.to_ascii_lowercase().as_str() {
            "trace" => Ok(Some(LogLevel::Trace)),
            "debug" => Ok(Some(LogLevel::Debug)),
            "info" => Ok(Some(LogLevel::Info)),
            "warn" | "warning" => Ok(Some(LogLevel::Warn)),
            "error" | "fatal" | "panic" => Ok(Some(LogLevel::Error)),
            _ => Err(self.malformed(
                "LOG_LEVEL",
                "trace, debug, info, warn (warning), error, fatal or panic",
            )),
        }
    }
}

/// Go's `strconv.ParseInt(text, 0, 64)`: an optional sign, then `0x`/`0o`/`0b` or a leading `0`
/// (octal) for the base, with `_` allowed between digits when a base prefix is given.
fn go_int(text: &str) -> Option<i64> {
    let (negative, digits) = match text.as_bytes().first()? {
        b'-' => (true, &text[1..]),
        b'+' => (false, &text[1..]),
        _ => (false, text),
    };
    let lower = digits.to_ascii_lowercase();
    let (radix, body, prefixed): (u32, String, bool) = if let Some(rest) = lower.strip_prefix("0x")
    {
        (16, rest.to_owned(), true)
    } else if let Some(rest) = lower.strip_prefix("0o") {
        (8, rest.to_owned(), true)
    } else if let Some(rest) = lower.strip_prefix("0b") {
        (2, rest.to_owned(), true)
    } else if lower.len() > 1 && lower.starts_with('0') {
        (8, lower[1..].to_owned(), true)
    } else {
        (10, lower.clone(), false)
    };
    if body.is_empty() || body.starts_with('_') || body.ends_with('_') || body.contains("__") {
        return None;
    }
    // Base 0 allows `_` between digits, with or without a prefix (`1_000` parses).
    let _ = prefixed;
    let clean: String = body.chars().filter(|c| *c != '_').collect();
    if !clean.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    let magnitude = i128::from_str_radix(&clean, radix).ok()?;
    let value = if negative { -magnitude } else { magnitude };
    i64::try_from(value).ok()
}

/// Go's `time.ParseDuration`: a sequence of decimal numbers, each with an optional fraction and
/// a unit (`ns`, `us`, `µs`, `ms`, `s`, `m`, `h`), with an optional sign; `0` alone is allowed.
/// A negative duration reads as zero (the reference treats both alike).
fn go_duration(text: &str) -> Option<Duration> {
    let (negative, mut rest) = match text.as_bytes().first()? {
        b'-' => (true, &text[1..]),
        b'+' => (false, &text[1..]),
        _ => (false, text),
    };
    if rest == "0" {
        return Some(Duration::ZERO);
    }
    if rest.is_empty() {
        return None;
    }
    let mut total_nanos: f64 = 0.0;
    while !rest.is_empty() {
        let number_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let number = &rest[..number_end];
        if number.is_empty() || number == "." || number.matches('.').count() > 1 {
            return None;
        }
        let value: f64 = number.parse().ok()?;
        rest = &rest[number_end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let nanos_per_unit = match &rest[..unit_end] {
            "ns" => 1.0,
            "us" | "µs" | "μs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            _ => return None,
        };
        rest = &rest[unit_end..];
        total_nanos += value * nanos_per_unit;
    }
    if negative || total_nanos <= 0.0 {
        return Some(Duration::ZERO);
    }
    Some(Duration::from_nanos(total_nanos.min(u64::MAX as f64) as u64))
}

#[cfg(test)]
mod tests;
