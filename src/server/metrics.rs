//! Prometheus metrics of the request path, served by `GET /metrics`: tollgate's own (`tollgate_*`)
//! and envoyproxy/ratelimit's statistics under the names its users query ([`ReferenceStats`]).
//!
//! tollgate's own labels are drawn only from closed sets (codes) or from the policies (limit
//! keys), so that no client can grow the metric set. The xDS source's metrics and the loaded
//! config's hash carry a version as a label: one series at a time, replaced at each update.

use std::sync::atomic::AtomicU64;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::exponential_buckets;
use prometheus_client::registry::Registry;

use super::history::History;
use super::mapper::Mapper;
use super::stats::{DEFAULT_MAX_REQUEST_KEYS, ReferenceStats};
use super::striped::{self, Histogram};
use super::top::TopRefused;
use crate::backend::MemoryUsage;
use crate::clock::{Clock, SystemClock};
use crate::config::FailureMode;
use crate::descriptor::Request;
use crate::limiter::{Code, Decision, LimitReport, Usage};

/// How the reference-named statistics are built.
#[derive(Debug, Clone)]
pub struct MetricsOptions {
    /// The statsd-to-Prometheus mapping (the reference's default, or `PROMETHEUS_MAPPER_YAML`).
    pub mapper: Mapper,
    /// `NEAR_LIMIT_RATIO`: hits above this share of a limit count as `near_limit`.
    pub near_limit_ratio: f32,
    /// The most distinct keys built from request values (`detailed_metric`, `value_to_metric`,
    /// descriptor overrides) that get series of their own.
    pub max_request_keys: usize,
    /// Whether each limit's statistics are recorded (the reference's `DISABLE_STATS=true`
    /// turns them off; the service's own series stay).
    pub per_limit: bool,
    /// Whether the local over-limit cache is on: the reference then reports its counts as the
    /// `ratelimit.localcache.*` gauges, and so do these statistics.
    pub local_cache: bool,
}

impl Default for MetricsOptions {
    fn default() -> Self {
        MetricsOptions {
            mapper: Mapper::default_mapping(),
            near_limit_ratio: 0.8,
            max_request_keys: DEFAULT_MAX_REQUEST_KEYS,
            per_limit: true,
            local_cache: false,
        }
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FailureLabels {
    limit: String,
    answer: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HashLabel {
    hash: String,
}

/// The policies' metrics: loads, when the last one took, and what is in force.
#[derive(Debug)]
struct ConfigMetrics {
    last_success: Gauge<f64, AtomicU64>,
    hash: Family<HashLabel, Gauge>,
}

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
    overloaded: striped::Counter,
    descriptors: ByCode,
    latency: Histogram,
    xds: Option<XdsMetrics>,
    memory: MemoryGauges,
    stats: std::sync::Arc<ReferenceStats>,
    failure_answers: Family<FailureLabels, Counter>,
    config: ConfigMetrics,
    /// Whether each limit's statistics are recorded ([`MetricsOptions::per_limit`]).
    per_limit: bool,
    /// Who was refused lately (`GET /top`, `tollgate_top_refused`).
    top: std::sync::Arc<TopRefused>,
    /// What each limit decided lately (the admin page's charts).
    history: History,
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
    ok: striped::Counter,
    over_limit: striped::Counter,
    invalid: striped::Counter,
}

impl ByCode {
    fn new(family: &Family<CodeLabel, striped::Counter>, with_invalid: bool) -> Self {
        let get = |code| family.get_or_create_owned(&CodeLabel { code });
        ByCode {
            ok: get("ok"),
            over_limit: get("over_limit"),
            // Requests can be unreadable; descriptor statuses cannot.
            invalid: if with_invalid {
                get("invalid")
            } else {
                striped::Counter::default()
            },
        }
    }

    fn count(&self, code: Code) {
        match code {
            Code::OverLimit => self.over_limit.inc(),
            Code::Ok => self.ok.inc(),
        }
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A fresh registry with every metric at zero and the reference's default mapping.
    pub fn new() -> Self {
        Self::with_options(MetricsOptions::default())
    }

    /// A fresh registry with every metric at zero, the reference-named statistics built as
    /// `options` say.
    pub fn with_options(options: MetricsOptions) -> Self {
        let per_limit = options.per_limit;
        let mut registry = Registry::default();
        let overflowed = Counter::default();
        let stats = std::sync::Arc::new(
            ReferenceStats::new(
                options.mapper,
                options.near_limit_ratio,
                options.max_request_keys,
                overflowed.clone(),
            )
            .with_local_cache(options.local_cache),
        );
        registry.register_collector(Box::new(std::sync::Arc::clone(&stats)));
        let top = std::sync::Arc::new(TopRefused::default());
        registry.register_collector(Box::new(std::sync::Arc::clone(&top)));
        let own = registry.sub_registry_with_prefix("tollgate");
        // Counted at every call by every worker: split per worker ([`striped`]).
        let requests = Family::<CodeLabel, striped::Counter>::default();
        let descriptors = Family::<CodeLabel, striped::Counter>::default();
        // 50 µs .. ~1.6 s: the range between an in-memory decision and a stalled backend.
        let latency = Histogram::new(exponential_buckets(0.000_05, 2.0, 16));
        own.register(
            "requests",
            "Rate limit requests answered, by overall code (ok, over_limit, invalid, overloaded)",
            requests.clone(),
        );
        own.register(
            "descriptors",
            "Descriptor statuses answered, by code (ok, over_limit)",
            descriptors.clone(),
        );
        own.register(
            "request_duration_seconds",
            "Time to decide one rate limit request",
            latency.clone(),
        );
        let memory = MemoryGauges::default();
        own.register(
            "memory_bytes",
            "Bytes the memory backend holds (tables and log entries)",
            memory.bytes.clone(),
        );
        own.register(
            "memory_budget_bytes",
            "The most bytes the memory backend will hold (--memory-budget)",
            memory.budget.clone(),
        );
        own.register(
            "memory_keys",
            "Windows the memory backend holds",
            memory.keys.clone(),
        );
        own.register(
            "memory_evictions",
            "Live windows the memory backend dropped to stay within its budget",
            memory.evictions.clone(),
        );
        let overloaded = requests.get_or_create_owned(&CodeLabel { code: "overloaded" });
        let failure_answers = Family::<FailureLabels, Counter>::default();
        own.register(
            "failure_mode_answers",
            "Limits answered by their failure_mode because the backend failed, by limit (its \
             full key; `<domain>.(override)` for a descriptor's own limit) and answer",
            failure_answers.clone(),
        );
        own.register(
            "metric_keys_overflowed",
            "Hits counted under a domain's tollgate_overflow key because more distinct \
             request-built metric keys (detailed_metric, value_to_metric, overrides) were seen \
             than the cap allows",
            overflowed,
        );
        let config = ConfigMetrics {
            last_success: Gauge::default(),
            hash: Family::default(),
        };
        own.register(
            "config_last_load_success_timestamp_seconds",
            "When the policies in force were loaded (Unix time)",
            config.last_success.clone(),
        );
        own.register(
            "config_hash",
            "A hash of the policies in force (their resolved table), as the label (1 while in \
             force)",
            config.hash.clone(),
        );
        crate::backend::observe::register(own);
        crate::backend::local_cache::register(own);
        crate::backend::lease::register(own);
        super::rlqs::register(own);
        Metrics {
            registry,
            requests: ByCode::new(&requests, true),
            overloaded,
            descriptors: ByCode::new(&descriptors, false),
            latency,
            xds: None,
            memory,
            stats,
            failure_answers,
            config,
            per_limit,
            top,
            history: History::default(),
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
        let own = self.registry.sub_registry_with_prefix("tollgate");
        own.register(
            "xds_connects",
            "Connections to the xDS management server (the first and every reconnect)",
            xds.connects.clone(),
        );
        own.register(
            "xds_updates",
            "xDS pushes accepted (ACKed) and put in force",
            xds.updates.clone(),
        );
        own.register(
            "xds_nacks",
            "xDS pushes refused (NACKed); the policies in force stayed",
            xds.nacks.clone(),
        );
        own.register(
            "xds_last_update_timestamp_seconds",
            "When the policies in force were accepted from xDS (Unix time; 0 before the first)",
            xds.last_update.clone(),
        );
        own.register(
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

    /// Records a policy load: `Ok(hash)` of the config put in force at `at`, or a load that failed
    /// (the last good config stays).
    pub fn observe_config_load(&self, loaded: Result<&str, ()>, at: SystemTime) {
        match loaded {
            Ok(hash) => {
                self.stats.count("ratelimit.service.config_load_success", 1);
                let seconds = at
                    .duration_since(UNIX_EPOCH)
                    .unwrap_or_default()
                    .as_secs_f64();
                self.config.last_success.set(seconds);
                self.config.hash.clear();
                self.config
                    .hash
                    .get_or_create(&HashLabel {
                        hash: hash.to_string(),
                    })
                    .set(1);
            }
            Err(()) => self.stats.count("ratelimit.service.config_load_error", 1),
        }
    }

    /// Records what the limiter decided for a request of `domain`: the reference's per-limit
    /// statistics, its `should_rate_limit` backend errors and global shadow mode, and tollgate's
    /// failure-mode answers.
    pub fn observe_decision(&self, domain: &str, decision: &Decision) {
        let mut backend_failed = false;
        for report in &decision.reports {
            if matches!(report.usage, Usage::Failed(_)) {
                backend_failed = true;
            }
            if !self.per_limit {
                continue;
            }
            self.stats.record(domain, report);
            if let Usage::Failed(mode) = report.usage {
                self.failure_answers
                    .get_or_create(&FailureLabels {
                        limit: failure_label(domain, report),
                        answer: match mode {
                            FailureMode::Allow => "allow",
                            FailureMode::Deny => "deny",
                        },
                    })
                    .inc();
            }
        }
        if backend_failed {
            // One per request, as the reference counts a failed Redis pipeline.
            self.stats
                .count("ratelimit.service.call.should_rate_limit.redis_error", 1);
        }
        if decision.shadowed {
            self.stats.count("ratelimit.service.global_shadow_mode", 1);
        }
    }

    /// Records who `decision` refused (for `GET /top`) and what each of the policies' limits
    /// decided (for the admin page's charts). An admitted request only adds to its limits' slot
    /// counters; a refusal also counts its descriptor under its domain's lock.
    pub fn observe_outcomes(&self, request: &Request, decision: &Decision) {
        if decision.reports.is_empty() {
            return;
        }
        let now_ms = SystemClock.now_ms();
        for report in &decision.reports {
            let refused = matches!(
                report.usage,
                Usage::Decided {
                    admitted: false,
                    ..
                }
            ) && !report.limit.shadow_mode;
            if !report.overridden {
                self.history.record(&report.limit, refused, now_ms);
            }
            if refused && let Some(descriptor) = request.descriptors.get(report.descriptor) {
                self.top.record_entries(
                    &request.domain,
                    &descriptor.entries,
                    (&report.limit, report.overridden),
                    1,
                    now_ms,
                );
            }
        }
    }

    /// Records what an RLQS client reported of the bucket `entries` of `domain`, governed by
    /// `limits`: its requests in each limit's chart, its denied ones as refusals of the bucket's
    /// descriptor for `GET /top`.
    pub fn observe_quota_outcomes(
        &self,
        domain: &str,
        entries: &[(String, String)],
        limits: &[std::sync::Arc<crate::config::Limit>],
        (allowed, denied): (u64, u64),
    ) {
        let now_ms = SystemClock.now_ms();
        for limit in limits {
            self.history
                .record_many(limit, allowed.saturating_add(denied), denied, now_ms);
        }
        let Some(first) = limits.first() else {
            return;
        };
        // The denials are the bucket's, not one limit's: they are listed under the first
        // (a bucket resolves to its descriptor's limits, most often one).
        self.top.record(
            domain,
            entries.iter().map(|(k, v)| (k.as_str(), v.as_str())),
            (super::top::limit_label(first), false),
            denied,
            now_ms,
        );
    }

    /// Who was refused lately, by domain.
    pub fn top(&self) -> &TopRefused {
        &self.top
    }

    /// What each limit decided lately.
    pub fn history(&self) -> &History {
        &self.history
    }

    /// Records what an RLQS client reported of a bucket governed by `limits`: its admitted
    /// requests as hits within the limit, its denied ones as hits over it, under each limit's
    /// reference-named series (`total_hits`, `within_limit`, `over_limit`).
    pub fn observe_quota_usage(
        &self,
        domain: &str,
        limits: &[std::sync::Arc<crate::config::Limit>],
        allowed: u64,
        denied: u64,
    ) {
        if !self.per_limit {
            return;
        }
        for limit in limits {
            let units = u64::from(limit.requests_per_unit);
            let parts = [
                (
                    allowed,
                    Usage::Decided {
                        before: 0,
                        after: allowed.min(units),
                        admitted: true,
                    },
                ),
                (
                    denied,
                    Usage::Decided {
                        before: units,
                        after: units.saturating_add(denied),
                        admitted: false,
                    },
                ),
            ];
            for (cost, usage) in parts {
                if cost == 0 {
                    continue;
                }
                self.stats.record(
                    domain,
                    &LimitReport {
                        descriptor: 0,
                        limit: std::sync::Arc::clone(limit),
                        request_key: None,
                        overridden: false,
                        cost,
                        usage,
                        local_cache: false,
                    },
                );
            }
        }
    }

    /// Records a request the limiter refused as invalid (the reference's `service_error`).
    pub fn observe_service_error(&self) {
        self.stats
            .count("ratelimit.service.call.should_rate_limit.service_error", 1);
    }

    /// Records one gRPC `ShouldRateLimit` call that took `elapsed`: the reference's
    /// `total_requests` and `response_time` of its gRPC interceptor.
    pub fn observe_grpc(&self, elapsed: Duration) {
        self.stats.grpc_call(elapsed.as_secs_f64() * 1000.0);
    }

    /// Records a request refused before it could be decided (e.g. a body that is not JSON).
    pub fn observe_unreadable(&self) {
        self.requests.invalid.inc();
    }

    /// Records one answered request.
    pub fn observe(&self, result: Result<&Decision, ()>, elapsed: Duration) {
        self.latency.observe(elapsed.as_secs_f64());
        let Ok(decision) = result else {
            self.requests.invalid.inc();
            return;
        };
        self.requests.count(decision.overall);
        for status in &decision.statuses {
            self.descriptors.count(status.code);
        }
    }

    /// How many request-built metric keys have series of their own.
    pub fn request_keys(&self) -> u64 {
        self.stats.request_keys()
    }

    /// The metrics in the Prometheus text format.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Encoding into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// The `limit` label of a failure-mode answer: the limit's series key, which comes from the
/// policies, except for a descriptor's own limit, whose key the request made.
fn failure_label(domain: &str, report: &LimitReport) -> String {
    if report.overridden {
        format!("{domain}.(override)")
    } else {
        report.limit.series_key.clone()
    }
}
