//! How tollgate is observed: the log level and format, the metrics listeners and their options,
//! and span export, from the flags and the reference's `LOG_*`, `PROMETHEUS_*`, stats-sink and
//! `TRACING_*` variables. The tracing options themselves are [`crate::telemetry`]'s, which uses
//! them; this module only reads them.

use std::net::SocketAddr;
use std::path::PathBuf;

use super::SettingsError;
use super::env::Env;
use super::flags::{LogFormat, LogLevel};
use crate::telemetry::{ExporterProtocol, TracingSettings};

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

/// Reads the reference's sink variables, none of which tollgate needs; answers whether
/// `DISABLE_STATS` turns the per-limit statistics off.
pub(super) fn stats_sinks(env: &Env<'_>, notices: &mut Vec<String>) -> Result<bool, SettingsError> {
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

pub(super) fn tracing_settings(env: &Env<'_>) -> Result<TracingSettings, SettingsError> {
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
