//! How the backends are doing: the latency of each call by backend and operation, and failures
//! by kind, as Prometheus metrics; and failure logging that stays quiet under a flood (each kind
//! at most once per [`LOG_EVERY`], with the count of what was not logged, and once on recovery,
//! after [`LOG_EVERY`] without a failure of the kind: a connection that keeps breaking and
//! reopening is one burst, not one line per reconnect).
//!
//! Backends record into one process-wide set, which the server's registry exposes: the backends
//! stay free of the server's types, and every backend instance (the main store, the per-second
//! store) lands in the same series, told apart by the `backend` label.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// How often one kind of failure is logged while it continues.
pub const LOG_EVERY: Duration = Duration::from_secs(10);

/// What went wrong with a backend call, as an operator tells failures apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FailureKind {
    /// The call did not finish within the backend deadline.
    Timeout,
    /// The server could not be reached, or the connection broke.
    Connection,
    /// The server is out of memory (`maxmemory` reached with a no-eviction policy).
    Oom,
    /// The user lacks a permission (ACL) the scripts need.
    NoPerm,
    /// The server did not know a script and it could not be sent along.
    NoScript,
    /// A script failed while running.
    Script,
    /// The cluster is down (slots not covered).
    ClusterDown,
    /// The cluster asked to try again (a slot migrating, a failover).
    TryAgain,
    /// The cluster redirected the call (MOVED / ASK) more than the client follows.
    Redirect,
    /// The server is a replica now and refuses writes (a failover).
    ReadOnly,
    /// The server is loading its data set or otherwise busy.
    Busy,
    /// An answer tollgate cannot use, or anything else.
    Other,
}

impl FailureKind {
    /// The `kind` label and log field.
    pub fn as_str(self) -> &'static str {
        match self {
            FailureKind::Timeout => "timeout",
            FailureKind::Connection => "connection",
            FailureKind::Oom => "oom",
            FailureKind::NoPerm => "noperm",
            FailureKind::NoScript => "noscript",
            FailureKind::Script => "script",
            FailureKind::ClusterDown => "clusterdown",
            FailureKind::TryAgain => "tryagain",
            FailureKind::Redirect => "moved_ask",
            FailureKind::ReadOnly => "readonly",
            FailureKind::Busy => "busy",
            FailureKind::Other => "other",
        }
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CallLabels {
    backend: &'static str,
    operation: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabels {
    backend: &'static str,
    kind: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ShardLabels {
    shards_touched: &'static str,
}

#[derive(Debug)]
struct Observer {
    latency: Family<CallLabels, Histogram>,
    errors: Family<ErrorLabels, Counter>,
    shard_hits: Family<ShardLabels, Counter>,
    /// The two series of `shard_hits` (one shard touched, two), once created.
    one_shard: OnceLock<Counter>,
    two_shards: OnceLock<Counter>,
    log: Mutex<HashMap<(&'static str, FailureKind), Burst>>,
    /// Set while some failure is going on; lets every success skip the lock.
    failing: AtomicBool,
    /// When a success may first end a burst ([`millis`]): [`LOG_EVERY`] after the latest failure
    /// of any kind; lets the successes before it skip the lock.
    quiet_at: AtomicU64,
    late_refunds: Counter,
}

/// One kind of failure of one backend while it lasts: from its first failure until a success
/// after [`LOG_EVERY`] without one.
#[derive(Debug)]
struct Burst {
    /// When it was last logged.
    last_logged: Instant,
    /// Its latest failure.
    last_failure: Instant,
    /// Failures not logged since the last line.
    suppressed: u64,
    /// Failures since it began.
    total: u64,
}

fn observer() -> &'static Observer {
    static OBSERVER: OnceLock<Observer> = OnceLock::new();
    OBSERVER.get_or_init(|| Observer {
        latency: Family::new_with_constructor(|| {
            // 100 µs .. ~3.3 s: a loopback Redis call up to a stalled one.
            Histogram::new(exponential_buckets(0.000_1, 2.0, 16))
        }),
        errors: Family::default(),
        shard_hits: Family::default(),
        one_shard: OnceLock::new(),
        two_shards: OnceLock::new(),
        log: Mutex::new(HashMap::new()),
        failing: AtomicBool::new(false),
        quiet_at: AtomicU64::new(0),
        late_refunds: Counter::default(),
    })
}

/// Adds the backend metrics to `registry` (whose prefix the names get).
pub fn register(registry: &mut Registry) {
    let observer = observer();
    registry.register(
        "backend_call_duration_seconds",
        "Time of one backend call, by backend (redis, redis-cluster) and operation (acquire, \
         release, ping, load_scripts), failed calls included",
        observer.latency.clone(),
    );
    registry.register(
        "backend_errors",
        "Failed backend calls by backend and kind (timeout, connection, oom, noperm, noscript, \
         script, clusterdown, tryagain, moved_ask, readonly, busy, other)",
        observer.errors.clone(),
    );
    registry.register(
        "shard_hits",
        "Hits on sharded limits by how many shards they touched: 1, or 2 when the first shard \
         refused and another was tried",
        observer.shard_hits.clone(),
    );
    registry.register(
        "backend_late_refunds",
        "Refunds a shared store refused because they came after the charge's refund horizon: \
         the charges stand (fewer admissions later, never more)",
        observer.late_refunds.clone(),
    );
}

/// Counts `refunds` the store refused as too late.
pub fn late_refunds(refunds: usize) {
    if refunds > 0 {
        observer().late_refunds.inc_by(refunds as u64);
        tracing::debug!(
            refunds,
            "refunds came after their charges' refund horizon; the charges stand"
        );
    }
}

/// Refunds refused as too late since start, in this process.
pub fn late_refunds_total() -> u64 {
    observer().late_refunds.get()
}

/// The series of `labels` in `family`, taken from the family the first time and kept in `slot`:
/// a family lookup hashes the labels under the family's lock, which every decision would pay
/// for. The series still appears when it is first used, as with a lookup per use.
fn series<'a, L, M>(slot: &'a OnceLock<M>, family: &Family<L, M>, labels: L) -> &'a M
where
    L: Clone + Hash + Eq,
    M: Clone,
{
    slot.get_or_init(|| family.get_or_create_owned(&labels))
}

/// Records `hits` hits on sharded limits, of which `retried` touched a second shard.
pub fn shard_hits(hits: usize, retried: usize) {
    let observer = observer();
    let add = |slot, shards_touched, n: usize| {
        if n > 0 {
            series(slot, &observer.shard_hits, ShardLabels { shards_touched }).inc_by(n as u64);
        }
    };
    add(&observer.one_shard, "1", hits.saturating_sub(retried));
    add(&observer.two_shards, "2", retried);
}

/// A backend call, as the latency histogram's `operation` label names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    /// Deciding hits.
    Acquire,
    /// Giving back a rejected request's charges.
    Release,
    /// A health check.
    Ping,
    /// Loading the scripts.
    LoadScripts,
}

impl Operation {
    /// The `operation` label.
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Acquire => "acquire",
            Operation::Release => "release",
            Operation::Ping => "ping",
            Operation::LoadScripts => "load_scripts",
        }
    }
}

/// The latency histograms of one backend's calls, one per operation, each taken from its family
/// on first use (see `series`).
#[derive(Debug)]
pub struct CallLatency {
    backend: &'static str,
    acquire: OnceLock<Histogram>,
    release: OnceLock<Histogram>,
    ping: OnceLock<Histogram>,
    load_scripts: OnceLock<Histogram>,
}

impl CallLatency {
    /// The histograms of `backend`'s calls (its `backend` label).
    pub fn new(backend: &'static str) -> Self {
        CallLatency {
            backend,
            acquire: OnceLock::new(),
            release: OnceLock::new(),
            ping: OnceLock::new(),
            load_scripts: OnceLock::new(),
        }
    }

    /// Records one call of `operation` that took `elapsed`.
    pub fn record(&self, operation: Operation, elapsed: Duration) {
        let slot = match operation {
            Operation::Acquire => &self.acquire,
            Operation::Release => &self.release,
            Operation::Ping => &self.ping,
            Operation::LoadScripts => &self.load_scripts,
        };
        let labels = CallLabels {
            backend: self.backend,
            operation: operation.as_str(),
        };
        series(slot, &observer().latency, labels).observe(elapsed.as_secs_f64());
    }
}

/// Records a failure of `kind` on `backend`: counted always; logged when this kind starts
/// failing and then at most once per [`LOG_EVERY`], with how many were not logged. A burst ends
/// only once a call succeeds after [`LOG_EVERY`] without a failure of its kind, so a failure that
/// comes and goes (a connection killed every 100 ms, a failover's reconnects) is still one burst
/// and logged once per interval, not once per success in between. `detail` must hold no
/// credential (the redis crate's error texts do not carry the URL).
pub fn failure(backend: &'static str, kind: FailureKind, detail: &dyn std::fmt::Display) {
    let observer = observer();
    observer
        .errors
        .get_or_create(&ErrorLabels {
            backend,
            kind: kind.as_str(),
        })
        .inc();
    let now = Instant::now();
    observer
        .quiet_at
        .fetch_max(millis(now + LOG_EVERY), Ordering::Relaxed);
    let Ok(mut log) = observer.log.lock() else {
        return;
    };
    // Under the lock, as a success clears it under the lock once no burst is left.
    observer.failing.store(true, Ordering::Relaxed);
    match log.get_mut(&(backend, kind)) {
        None => {
            log.insert(
                (backend, kind),
                Burst {
                    last_logged: now,
                    last_failure: now,
                    suppressed: 0,
                    total: 1,
                },
            );
            drop(log);
            tracing::warn!(
                backend,
                kind = kind.as_str(),
                "backend call failed: {detail}; each affected limit answers its failure_mode"
            );
        }
        Some(burst) => {
            burst.total += 1;
            burst.last_failure = now;
            if now.duration_since(burst.last_logged) >= LOG_EVERY {
                let suppressed = burst.suppressed;
                burst.suppressed = 0;
                burst.last_logged = now;
                drop(log);
                tracing::warn!(
                    backend,
                    kind = kind.as_str(),
                    suppressed,
                    "backend call still failing: {detail}; {suppressed} more failures of this \
                     kind since the last report"
                );
            } else {
                burst.suppressed += 1;
            }
        }
    }
}

/// Records a successful call on `backend`: each kind of failure that has been quiet for
/// [`LOG_EVERY`] is reported over, once, with its count. Until then a success says nothing (the
/// failure may be back at once), and it costs a clock read, not the lock.
pub fn success(backend: &'static str) {
    let observer = observer();
    if !observer.failing.load(Ordering::Relaxed) {
        return;
    }
    let now = Instant::now();
    if millis(now) < observer.quiet_at.load(Ordering::Relaxed) {
        return;
    }
    let Ok(mut log) = observer.log.lock() else {
        return;
    };
    let mut recovered: Vec<(FailureKind, u64)> = Vec::new();
    log.retain(|(b, kind), burst| {
        if *b == backend && now.duration_since(burst.last_failure) >= LOG_EVERY {
            recovered.push((*kind, burst.total));
            false
        } else {
            true
        }
    });
    if log.is_empty() {
        observer.failing.store(false, Ordering::Relaxed);
    }
    drop(log);
    recovered.sort();
    for (kind, failures) in recovered {
        tracing::info!(
            backend,
            kind = kind.as_str(),
            failures,
            "backend answers again after {failures} failures of kind {}, none for {}s",
            kind.as_str(),
            LOG_EVERY.as_secs()
        );
    }
}

/// `at` in milliseconds since the first call, for instants kept in an atomic.
fn millis(at: Instant) -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    let start = *START.get_or_init(Instant::now);
    u64::try_from(at.saturating_duration_since(start).as_millis()).unwrap_or(u64::MAX)
}
