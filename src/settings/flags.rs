//! `tollgate serve`'s command-line flags (each with its `TOLLGATE_*` variable) and the value types
//! and parsers clap reads them with. Every flag is optional here: an absent flag leaves the
//! setting to the reference's variable or the default, which [`super::Settings::resolve`]
//! decides.

use std::net::SocketAddr;
use std::num::{NonZeroU32, NonZeroUsize};
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};

use crate::backend::memory;

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
    /// Let `POST /counters/reset` on the admin interface clear a client's windows; without it
    /// the endpoint answers 403. Anyone who reaches the admin port could otherwise hand a
    /// client its quota back (see docs/security.md) [default: false].
    #[arg(long, env = "TOLLGATE_ADMIN_ALLOW_RESET", num_args = 0..=1,
          default_missing_value = "true", action = clap::ArgAction::Set)]
    pub admin_allow_reset: Option<bool>,
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
    /// With dynamic metadata on, also name each refused descriptor's refusing limit in it
    /// (`overLimit: [{descriptorIndex, name}]`) [default: true; false under the `ratelimit`
    /// entry point, whose metadata is the reference's exactly].
    #[arg(long, env = "TOLLGATE_OVER_LIMIT_METADATA", num_args = 0..=1,
          default_missing_value = "true", action = clap::ArgAction::Set)]
    pub over_limit_metadata: Option<bool>,
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
    /// answers a hit the backend refused, for as long as the refusal stands whatever any
    /// instance gives back, without a backend call (also LOCAL_CACHE_SIZE_IN_BYTES); set, it
    /// also answers `counting: all` hits without charging them, as envoyproxy/ratelimit's cache
    /// does [default: 8MiB].
    #[arg(long, env = "TOLLGATE_LOCAL_CACHE_BYTES", value_parser = parse_size)]
    pub local_cache_bytes: Option<usize>,
    /// The most decisions in flight at once (gRPC and POST /json together); past it a call is
    /// answered at once with RESOURCE_EXHAUSTED (Envoy applies its failure_mode_deny). 0:
    /// unbounded [default: 256].
    #[arg(long, env = "TOLLGATE_MAX_IN_FLIGHT")]
    pub max_in_flight: Option<usize>,
    /// The most calls and streams open at once on one gRPC connection, advertised to clients as
    /// HTTP/2's MAX_CONCURRENT_STREAMS (Envoy opens another connection past it) [default: 1024].
    #[arg(long, env = "TOLLGATE_GRPC_MAX_CONCURRENT_STREAMS")]
    pub grpc_max_concurrent_streams: Option<NonZeroU32>,
    /// How long a gRPC request message may take to arrive whole once begun (a unary call's whole
    /// body); past it the call is answered DEADLINE_EXCEEDED [default: 10s].
    #[arg(long, env = "TOLLGATE_GRPC_BODY_TIMEOUT", value_parser = parse_positive_duration)]
    pub grpc_body_timeout: Option<Duration>,
    /// The most bytes of request messages still arriving on one gRPC connection (e.g. `8MiB`);
    /// the call that would pass it is answered RESOURCE_EXHAUSTED [default: 8MiB].
    #[arg(long, env = "TOLLGATE_GRPC_UNFINISHED_BYTES_PER_CONNECTION",
          value_parser = parse_size)]
    pub grpc_unfinished_bytes_per_connection: Option<usize>,
    /// The most bytes of request messages still arriving on all gRPC connections together; the
    /// call that would pass it is answered RESOURCE_EXHAUSTED [default: 64MiB].
    #[arg(long, env = "TOLLGATE_GRPC_UNFINISHED_BYTES", value_parser = parse_size)]
    pub grpc_unfinished_bytes: Option<usize>,
    /// How long a gRPC connection may stay open without sending a request before it is closed
    /// [default: 30s].
    #[arg(long, env = "TOLLGATE_GRPC_FIRST_REQUEST_TIMEOUT",
          value_parser = parse_positive_duration)]
    pub grpc_first_request_timeout: Option<Duration>,
    /// How long an admin (debug, metrics) connection may take to send a request's headers, from
    /// its start or its previous answer, and then its body; past it the connection is closed
    /// [default: 10s].
    #[arg(long, env = "TOLLGATE_ADMIN_HEADER_READ_TIMEOUT",
          value_parser = parse_positive_duration)]
    pub admin_header_read_timeout: Option<Duration>,
    /// The most connections open at once on the admin listener (and on each of the debug and
    /// metrics listeners); past it new ones wait in the kernel's backlog [default: 256].
    #[arg(long, env = "TOLLGATE_ADMIN_MAX_CONNECTIONS")]
    pub admin_max_connections: Option<NonZeroUsize>,
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

/// Reads a duration above zero (the bounds' timeouts), as `humantime` writes them (`10s`,
/// `1m30s`, `500ms`).
pub fn parse_positive_duration(text: &str) -> Result<Duration, String> {
    let duration = humantime::parse_duration(text).map_err(|err| err.to_string())?;
    if duration.is_zero() {
        return Err(format!("{:?} is not above zero", text.trim()));
    }
    Ok(duration)
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
