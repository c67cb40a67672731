//! Prometheus metrics of the request path, served by `GET /metrics`.
//!
//! Labels are drawn only from closed sets (codes) so that no client can grow the metric set. The
//! xDS source's metrics carry the version of the policies in force as a label: one series at a
//! time, replaced at each update.

use std::sync::atomic::AtomicU64;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::backend::MemoryUsage;
use crate::proto::{RateLimitResponse, rate_limit_response::Code as ProtoCode};

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CodeLabel {
    code: &'static str,
}

/// The counters and histograms of the service.
///
/// The counter of each label is fetched once at startup: a `Family` lookup per request would
/// take a lock and hash the label on the hot path.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    requests: ByCode,
    /// Requests answered at once because too many decisions were in flight.
    overloaded: Counter,
    descriptors: ByCode,
    latency: Histogram,
    xds: Option<XdsMetrics>,
    memory: MemoryGauges,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VersionLabel {
    version: String,
}

/// The longest version label kept; a control plane's versions are short counters or hashes.
const MAX_VERSION_LABEL: usize = 128;

/// The xDS source's metrics, present when policies come over xDS.
#[derive(Debug)]
struct XdsMetrics {
    connects: Counter,
    updates: Counter,
    nacks: Counter,
    last_update: Gauge<f64, AtomicU64>,
    version: Family<VersionLabel, Gauge>,
}

/// What the memory backend holds, read from its own accounting when the metrics are rendered.
#[derive(Debug, Default)]
struct MemoryGauges {
    bytes: Gauge,
    budget: Gauge,
    keys: Gauge,
    evictions: Counter,
}

/// One counter per code of a family, created up front so every series exists from startup
/// (rate() works before the first request).
#[derive(Debug)]
struct ByCode {
    ok: Counter,
    over_limit: Counter,
    invalid: Counter,
}

impl ByCode {
    fn new(family: &Family<CodeLabel, Counter>, with_invalid: bool) -> Self {
        let get = |code| family.get_or_create_owned(&CodeLabel { code });
        ByCode {
            ok: get("ok"),
            over_limit: get("over_limit"),
            // Requests can be unreadable; descriptor statuses cannot.
            invalid: if with_invalid {
                get("invalid")
            } else {
                Counter::default()
            },
        }
    }

    fn count(&self, code: i32) {
        if code == ProtoCode::OverLimit as i32 {
            self.over_limit.inc();
        } else {
            self.ok.inc();
        }
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A fresh registry with every metric at zero.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("tollgate");
        let requests = Family::<CodeLabel, Counter>::default();
        let descriptors = Family::<CodeLabel, Counter>::default();
        // 50 µs .. ~1.6 s: the range between an in-memory decision and a stalled backend.
        let latency = Histogram::new(exponential_buckets(0.000_05, 2.0, 16));
        registry.register(
            "requests",
            "Rate limit requests answered, by overall code (ok, over_limit, invalid, overloaded)",
            requests.clone(),
        );
        registry.register(
            "descriptors",
            "Descriptor statuses answered, by code (ok, over_limit)",
            descriptors.clone(),
        );
        registry.register(
            "request_duration_seconds",
            "Time to decide one rate limit request",
            latency.clone(),
        );
        let memory = MemoryGauges::default();
        registry.register(
            "memory_bytes",
            "Bytes the memory backend holds (tables and log entries)",
            memory.bytes.clone(),
        );
        registry.register(
            "memory_budget_bytes",
            "The most bytes the memory backend will hold (--memory-budget)",
            memory.budget.clone(),
        );
        registry.register(
            "memory_keys",
            "Windows the memory backend holds",
            memory.keys.clone(),
        );
        registry.register(
            "memory_evictions",
            "Live windows the memory backend dropped to stay within its budget",
            memory.evictions.clone(),
        );
        let overloaded = requests.get_or_create_owned(&CodeLabel { code: "overloaded" });
        Metrics {
            registry,
            requests: ByCode::new(&requests, true),
            overloaded,
            descriptors: ByCode::new(&descriptors, false),
            latency,
            xds: None,
            memory,
        }
    }

    /// Adds the xDS source's metrics: stream connects, accepted and refused pushes, the time of
    /// the last accepted push and the version in force.
    pub fn with_xds(mut self) -> Self {
        let xds = XdsMetrics {
            connects: Counter::default(),
            updates: Counter::default(),
            nacks: Counter::default(),
            last_update: Gauge::default(),
            version: Family::default(),
        };
        self.registry.register(
            "xds_connects",
            "Connections to the xDS management server (the first and every reconnect)",
            xds.connects.clone(),
        );
        self.registry.register(
            "xds_updates",
            "xDS pushes accepted (ACKed) and put in force",
            xds.updates.clone(),
        );
        self.registry.register(
            "xds_nacks",
            "xDS pushes refused (NACKed); the policies in force stayed",
            xds.nacks.clone(),
        );
        self.registry.register(
            "xds_last_update_timestamp_seconds",
            "When the policies in force were accepted from xDS (Unix time; 0 before the first)",
            xds.last_update.clone(),
        );
        self.registry.register(
            "xds_version",
            "The xDS version of the policies in force, as the label (1 while in force)",
            xds.version.clone(),
        );
        self.xds = Some(xds);
        self
    }

    /// Records a connection to the xDS management server.
    pub fn observe_xds_connect(&self) {
        if let Some(xds) = &self.xds {
            xds.connects.inc();
        }
    }

    /// Records an accepted xDS push of `version`, at `at`.
    pub fn observe_xds_update(&self, version: &str, at: SystemTime) {
        let Some(xds) = &self.xds else { return };
        xds.updates.inc();
        let seconds = at
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs_f64();
        xds.last_update.set(seconds);
        let mut end = version.len().min(MAX_VERSION_LABEL);
        while !version.is_char_boundary(end) {
            end -= 1;
        }
        xds.version.clear();
        xds.version
            .get_or_create(&VersionLabel {
                version: version[..end].to_string(),
            })
            .set(1);
    }

    /// Records a refused xDS push.
    pub fn observe_xds_nack(&self) {
        if let Some(xds) = &self.xds {
            xds.nacks.inc();
        }
    }

    /// Records a request answered at once because too many decisions were in flight.
    pub fn observe_overloaded(&self) {
        self.overloaded.inc();
    }

    /// Records what the memory backend holds (nothing for the other backends).
    pub fn observe_memory(&self, usage: Option<MemoryUsage>) {
        let Some(usage) = usage else {
            return;
        };
        let gauge = |value: u64| i64::try_from(value).unwrap_or(i64::MAX);
        self.memory.bytes.set(gauge(usage.bytes));
        self.memory.budget.set(gauge(usage.budget));
        self.memory.keys.set(gauge(usage.keys));
        let counted = self.memory.evictions.get();
        if usage.evictions > counted {
            self.memory.evictions.inc_by(usage.evictions - counted);
        }
    }

    /// Records a request refused before it could be decided (e.g. a body that is not JSON).
    pub fn observe_unreadable(&self) {
        self.requests.invalid.inc();
    }

    /// Records one answered request.
    pub fn observe(&self, result: Result<&RateLimitResponse, ()>, elapsed: Duration) {
        self.latency.observe(elapsed.as_secs_f64());
        let Ok(response) = result else {
            self.requests.invalid.inc();
            return;
        };
        self.requests.count(response.overall_code);
        for status in &response.statuses {
            self.descriptors.count(status.code);
        }
    }

    /// The metrics in the Prometheus text format.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Encoding into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}
