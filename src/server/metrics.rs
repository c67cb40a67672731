//! Prometheus metrics of the request path, served by `GET /metrics`.
//!
//! Labels are drawn only from closed sets (codes) so that no client can grow the metric set.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::proto::{RateLimitResponse, rate_limit_response::Code as ProtoCode};

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CodeLabel {
    code: &'static str,
}

/// The counters and histograms of the service.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    requests: Family<CodeLabel, Counter>,
    descriptors: Family<CodeLabel, Counter>,
    latency: Histogram,
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
            "Rate limit requests answered, by overall code (ok, over_limit, invalid)",
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
        // Every series exists from the start, so rate() works before the first request.
        for code in ["ok", "over_limit", "invalid"] {
            drop(requests.get_or_create(&CodeLabel { code }));
        }
        for code in ["ok", "over_limit"] {
            drop(descriptors.get_or_create(&CodeLabel { code }));
        }
        Metrics {
            registry,
            requests,
            descriptors,
            latency,
        }
    }

    /// Records a request refused before it could be decided (e.g. a body that is not JSON).
    pub fn observe_unreadable(&self) {
        self.requests
            .get_or_create(&CodeLabel { code: "invalid" })
            .inc();
    }

    /// Records one answered request.
    pub fn observe(&self, result: Result<&RateLimitResponse, ()>, elapsed: Duration) {
        self.latency.observe(elapsed.as_secs_f64());
        let Ok(response) = result else {
            self.requests
                .get_or_create(&CodeLabel { code: "invalid" })
                .inc();
            return;
        };
        self.requests
            .get_or_create(&CodeLabel {
                code: code_label(response.overall_code),
            })
            .inc();
        for status in &response.statuses {
            self.descriptors
                .get_or_create(&CodeLabel {
                    code: code_label(status.code),
                })
                .inc();
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

fn code_label(code: i32) -> &'static str {
    if code == ProtoCode::OverLimit as i32 {
        "over_limit"
    } else {
        "ok"
    }
}
