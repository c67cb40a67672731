//! OpenTelemetry spans for decisions, exported over OTLP when `TRACING_ENABLED=true`: one server
//! span per `ShouldRateLimit` (domain, descriptor count, overall code), joined to the caller's
//! trace by its `traceparent` (W3C) or B3 headers, with one child span per backend call.
//!
//! Off by default. While off nothing is set up and the request path pays one check of an
//! unset cell per call. The exporter is the cargo feature `otlp` (on by default); a build
//! without it refuses `TRACING_ENABLED=true` at start instead of silently sending nothing.
//!
//! The server and the limiter use only this module's types, so neither learns about the
//! OpenTelemetry SDK, and the limiter stays free of gRPC types: the server hands the incoming
//! metadata over as [`Headers`].

/// Why span export could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// Tracing was asked for, but this binary was built without the exporter.
    #[error(
        "TRACING_ENABLED=true, but this tollgate was built without span export (cargo feature \
         `otlp`); rebuild with `--features otlp` or unset TRACING_ENABLED"
    )]
    NotBuilt,
    /// The exporter or its endpoint could not be set up.
    #[error("cannot set up OTLP span export: {0}")]
    Exporter(String),
    /// Tracing was set up twice in one process.
    #[error("span export is already set up in this process")]
    AlreadySet,
}

/// Span export over OTLP (`TRACING_*`, `OTEL_EXPORTER_OTLP_ENDPOINT`), with the reference's
/// defaults: off, service name `RateLimit`, OTLP/HTTP, every trace sampled.
/// The settings read them; they are this module's because [`init`] is what uses them.
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

/// Read access to the headers (gRPC metadata) of an incoming call, by lowercase name.
pub trait Headers: Sync {
    /// The value of header `name` (lowercase), if present and text.
    fn get(&self, name: &str) -> Option<&str>;
}

/// A call without headers (an embedder's direct call).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoHeaders;

impl Headers for NoHeaders {
    fn get(&self, _name: &str) -> Option<&str> {
        None
    }
}

/// What a backend call span records as its `outcome`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallOutcome {
    /// Every hit was admitted (or the release went through).
    Ok,
    /// At least one hit was refused.
    OverLimit,
    /// At least one hit, or the call, failed.
    Error,
}

impl CallOutcome {
    /// The attribute value.
    pub fn as_str(self) -> &'static str {
        match self {
            CallOutcome::Ok => "ok",
            CallOutcome::OverLimit => "over_limit",
            CallOutcome::Error => "error",
        }
    }
}

/// The directive that quiets the `redis` crate's own log lines (it logs through `log`, which
/// reaches tollgate's subscriber): a connection lost, a slot refresh begun or failed, one line per
/// node and attempt, hundreds in one cluster failover. Every failure it meets reaches tollgate as
/// a failed call, which tollgate counts and logs by kind, at most once per interval.
pub const REDIS_CRATE_DIRECTIVE: &str = "redis=off";

/// The log filter for `directives` (a level, or `RUST_LOG`'s filter): with the `redis` crate
/// quieted ([`REDIS_CRATE_DIRECTIVE`]) unless the filter names the crate itself
/// (`RUST_LOG=info,redis=warn`) or asks for everything at `debug` or `trace`.
pub fn log_filter(directives: &str) -> String {
    let names_redis = directives.split(',').map(str::trim).any(|directive| {
        directive
            .strip_prefix("redis")
            .is_some_and(|rest| rest.is_empty() || rest.starts_with(['=', ':', '[']))
    });
    let verbose = directives.split(',').map(str::trim).any(|directive| {
        directive.eq_ignore_ascii_case("debug") || directive.eq_ignore_ascii_case("trace")
    });
    if names_redis || verbose {
        directives.to_owned()
    } else if directives.trim().is_empty() {
        format!("info,{REDIS_CRATE_DIRECTIVE}")
    } else {
        format!("{directives},{REDIS_CRATE_DIRECTIVE}")
    }
}

#[cfg(test)]
mod log_filter_tests {
    use super::log_filter;

    #[test]
    fn the_redis_crate_is_quiet_unless_asked_for() {
        assert_eq!(log_filter("info"), "info,redis=off");
        assert_eq!(log_filter("warn"), "warn,redis=off");
        assert_eq!(
            log_filter("tollgate=debug,h2=warn"),
            "tollgate=debug,h2=warn,redis=off"
        );
        assert_eq!(log_filter("info,redis=warn"), "info,redis=warn");
        assert_eq!(
            log_filter("redis::cluster_async=debug"),
            "redis::cluster_async=debug"
        );
        assert_eq!(log_filter("debug"), "debug");
        assert_eq!(
            log_filter("info,redis_other=warn"),
            "info,redis_other=warn,redis=off"
        );
    }
}

#[cfg(feature = "otlp")]
mod b3;
#[cfg(feature = "otlp")]
mod otlp;
#[cfg(feature = "otlp")]
pub use otlp::{RequestSpan, Tracing, backend_call, init, request_span};

#[cfg(not(feature = "otlp"))]
pub use off::{RequestSpan, Tracing, backend_call, init, request_span};

/// The stand-ins of a build without the exporter: the same calls, doing nothing.
#[cfg(not(feature = "otlp"))]
mod off {
    use std::future::Future;

    use super::*;

    /// Span export while it runs; this build has none.
    #[derive(Debug)]
    pub struct Tracing(());

    impl Tracing {
        /// Nothing to flush in this build.
        pub fn shutdown(self) {}
    }

    /// Refuses `TRACING_ENABLED=true`: this build cannot export spans.
    pub fn init(
        settings: &TracingSettings,
        _backend: &'static str,
    ) -> Result<Option<Tracing>, TelemetryError> {
        if settings.enabled {
            Err(TelemetryError::NotBuilt)
        } else {
            Ok(None)
        }
    }

    /// The span of one decision; never recording in this build.
    #[derive(Debug)]
    pub struct RequestSpan(());

    /// A span that records nothing.
    pub fn request_span(_: &dyn Headers, _: &str, _: usize) -> RequestSpan {
        RequestSpan(())
    }

    impl RequestSpan {
        /// Runs the future `work` makes as is.
        pub fn run<F: Future>(&self, work: impl FnOnce() -> F) -> F {
            work()
        }

        /// Nothing to end.
        pub fn finish(self, _: Result<&'static str, &str>) {}
    }

    /// Makes the call and runs it as is.
    pub fn backend_call<T, F: Future<Output = T>>(
        _: &'static str,
        _: usize,
        call: impl FnOnce() -> F,
        _: impl FnOnce(&T) -> CallOutcome,
    ) -> F {
        call()
    }
}
