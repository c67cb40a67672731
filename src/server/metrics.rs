//! Prometheus metrics of the request path, served by `GET /metrics`.
//!
//! Labels are drawn only from closed sets (codes) so that no client can grow the metric set.

use std::time::Duration;

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
    memory: MemoryGauges,
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
            memory,
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
