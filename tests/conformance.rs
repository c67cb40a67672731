//! The limiter-level semantics of design §3, run against every backend through the production
//! composition `Limiter<Sharded<AnyBackend>>`: process memory, one real `redis-server` and a real
//! Redis Cluster of three masters and three replicas (both started here on free loopback ports).
//!
//! Every case is one async fn that only sees a [`Target`], so the three tests run the very same
//! assertions. Redis reads the wall clock (`TIME`), so the assertions are chosen not to depend on
//! the instant: counting uses hour- and day-long windows (an epoch-aligned boundary falling
//! mid-test leaves the estimate where it was, to within a fraction of a unit), reset times are
//! checked against ranges, and the exact numbers are kept for the log and for the long windows.
//! Each case uses descriptor values no other case uses, so cases cannot disturb each other.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tollgate::backend::{AnyBackend, ClusterBackend, MemoryBackend, RedisBackend, Sharded};
use tollgate::config::{Config, FailureMode};
use tollgate::descriptor::{Descriptor, Entry, Request, Unit};
use tollgate::limiter::{Code, Decision, Limiter, Settings, Status};
use tollgate_testkit::redis::{RedisCluster, RedisServer};

const DOMAIN: &str = "conformance";

/// Pairs of limits that differ only in their algorithm (`<name>` is the sliding window counter,
/// `<name>_log` the sliding window log), so a case can check both with the same numbers.
const POLICY: &str = r#"
domain: conformance
descriptors:
  - key: user
    rate_limit: { unit: hour, requests_per_unit: 5, name: per_user }
  - key: user_log
    rate_limit: { unit: hour, requests_per_unit: 5, algorithm: sliding_window_log }
  - key: quota
    rate_limit: { unit: day, requests_per_unit: 10 }
  - key: quota_log
    rate_limit: { unit: day, requests_per_unit: 10, algorithm: sliding_window_log }
  - key: login
    rate_limit: { window: 2h, requests_per_unit: 3, algorithm: sliding_window_log }
  - key: shadowed
    shadow_mode: true
    rate_limit: { unit: day, requests_per_unit: 1 }
  - key: zero
    rate_limit: { unit: second, requests_per_unit: 0 }
  - key: zero_log
    rate_limit: { unit: second, requests_per_unit: 0, algorithm: sliding_window_log }
  - key: free
    rate_limit: { unlimited: true }
  - key: allow
    value: internal
  - key: general
    rate_limit: { unit: day, requests_per_unit: 100, name: general }
  - key: specific
    rate_limit: { unit: day, requests_per_unit: 1, replaces: [{ name: general }] }
  - key: race
    rate_limit: { unit: day, requests_per_unit: 150 }
  - key: race_log
    rate_limit: { unit: day, requests_per_unit: 150, algorithm: sliding_window_log }
  - key: hot
    rate_limit: { unit: day, requests_per_unit: 100, shards: 4 }
  - key: hot_log
    rate_limit: { unit: day, requests_per_unit: 100, shards: 4, algorithm: sliding_window_log }
  - key: fail_default
    rate_limit: { unit: hour, requests_per_unit: 5 }
  - key: fail_allow
    rate_limit: { unit: hour, requests_per_unit: 5, failure_mode: allow }
  - key: fail_deny
    rate_limit: { unit: hour, requests_per_unit: 5, failure_mode: deny }
"#;

/// The deadline of one backend call in the semantics cases: generous, so that a busy machine
/// never turns a decision into a failure-mode answer.
const CALL_TIMEOUT: Duration = Duration::from_secs(2);
/// The production default `--backend-timeout`, used where failures are the point.
const OUTAGE_TIMEOUT: Duration = Duration::from_millis(50);
/// How long a failure-mode answer may take with [`OUTAGE_TIMEOUT`]: bounded, not fast.
const OUTAGE_ANSWER_BOUND: Duration = Duration::from_secs(2);

const HOUR_S: u64 = 3_600;
const DAY_S: u64 = 86_400;

/// The production composition, as `tollgate serve` builds it.
type ProductionLimiter = Limiter<Sharded<AnyBackend>>;

/// Where a target's windows live.
#[derive(Debug, Clone)]
enum Store {
    Memory,
    Redis(String),
    Cluster(Vec<String>),
}

/// One backend under test: makes limiters over fresh backend instances that share the store
/// (for memory, whose store is the instance itself, each limiter has its own).
struct Target {
    store: Store,
    prefix: String,
    config: Arc<Config>,
}

impl Target {
    fn new(store: Store) -> Target {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        Target {
            store,
            prefix: format!("conformance-{}-{nanos}:", std::process::id()),
            config: Arc::new(Config::from_yaml("conformance.yaml", POLICY).expect("policy loads")),
        }
    }

    fn name(&self) -> &'static str {
        match self.store {
            Store::Memory => "memory",
            Store::Redis(_) => "redis",
            Store::Cluster(_) => "redis-cluster",
        }
    }

    /// A new backend instance on this target's store, as `connect_backend` in `main.rs` makes it.
    async fn backend(&self, store: &Store, timeout: Duration) -> Sharded<AnyBackend> {
        let backend = match store {
            Store::Memory => AnyBackend::Memory(MemoryBackend::new()),
            Store::Redis(url) => AnyBackend::Redis(
                RedisBackend::connect(url, &self.prefix, timeout)
                    .await
                    .expect("redis backend"),
            ),
            Store::Cluster(seeds) => AnyBackend::Cluster(
                ClusterBackend::connect(seeds, &self.prefix, timeout)
                    .await
                    .expect("cluster backend"),
            ),
        };
        Sharded::new(backend)
    }

    /// A limiter over a new backend instance with the semantics-case deadline.
    async fn limiter(&self, settings: Settings) -> ProductionLimiter {
        self.limiter_with(&self.store.clone(), settings, CALL_TIMEOUT)
            .await
    }

    async fn limiter_with(
        &self,
        store: &Store,
        settings: Settings,
        timeout: Duration,
    ) -> ProductionLimiter {
        let backend = self.backend(store, timeout).await;
        Limiter::new(Arc::clone(&self.config), backend, settings)
    }

    /// Two tollgate instances sharing the store: two limiters over two backend instances on
    /// Redis; on memory, where instances cannot share, one limiter used twice.
    async fn two_instances(&self) -> [Arc<ProductionLimiter>; 2] {
        let first = Arc::new(self.limiter(Settings::default()).await);
        let second = match self.store {
            Store::Memory => Arc::clone(&first),
            _ => Arc::new(self.limiter(Settings::default()).await),
        };
        [first, second]
    }
}

static NEXT_VALUE: AtomicU64 = AtomicU64::new(0);

/// A descriptor value no other case uses. It carries the separators of the key layout and
/// hash-tag braces, which must neither collide nor split a limiter across cluster slots.
fn fresh(case: &str) -> String {
    format!(
        "{case}-{}:{{v}}|a.b=c",
        NEXT_VALUE.fetch_add(1, Ordering::Relaxed)
    )
}

fn d(pairs: &[(&str, &str)]) -> Descriptor {
    Descriptor {
        entries: pairs.iter().map(|(k, v)| Entry::new(*k, *v)).collect(),
        ..Descriptor::default()
    }
}

fn with_addend(mut descriptor: Descriptor, addend: u64) -> Descriptor {
    descriptor.hits_addend = Some(addend);
    descriptor
}

fn req(descriptors: Vec<Descriptor>) -> Request {
    Request {
        domain: DOMAIN.into(),
        descriptors,
        hits_addend: 0,
    }
}

async fn ask(limiter: &ProductionLimiter, request: &Request) -> Decision {
    let decision = limiter
        .should_rate_limit(request)
        .await
        .expect("a valid request");
    assert_eq!(decision.statuses.len(), request.descriptors.len());
    decision
}

async fn ask_one(limiter: &ProductionLimiter, descriptor: Descriptor) -> Decision {
    ask(limiter, &req(vec![descriptor])).await
}

/// Asks about one descriptor and asserts the overall code and the units it has left; `what`
/// names the step in the failure message.
async fn assert_one(
    limiter: &ProductionLimiter,
    descriptor: Descriptor,
    expected: (Code, u32),
    what: &str,
) {
    let decision = ask_one(limiter, descriptor).await;
    assert_eq!(
        (decision.overall, decision.statuses[0].remaining),
        expected,
        "{what}: {decision:?}"
    );
}

fn codes(decision: &Decision) -> Vec<Code> {
    decision.statuses.iter().map(|s| s.code).collect()
}

/// The reset of status `index` in whole seconds.
fn reset_s(decision: &Decision, index: usize) -> u64 {
    decision.statuses[index]
        .reset
        .unwrap_or_else(|| panic!("status {index} has no reset: {decision:?}"))
        .as_secs()
}

fn retry_after(decision: &Decision) -> Option<u64> {
    match decision.response_headers.as_slice() {
        [] => None,
        [(name, value)] if name == "retry-after" => {
            Some(value.parse().expect("retry-after is whole seconds"))
        }
        other => panic!("unexpected response headers {other:?}"),
    }
}

/// Asserts a status that no limit applied to.
fn assert_free(decision: &Decision, index: usize, what: &str) {
    let status = &decision.statuses[index];
    assert_eq!(status.code, Code::Ok, "{what}: {decision:?}");
    assert!(status.limit.is_none(), "{what}: {decision:?}");
}

const COUNTER_AND_LOG: [&str; 2] = ["", "_log"];

/// Runs `callers` concurrent tasks, alternating between the two instances, and sums the units
/// each reports admitted. `caller` gets its limiter and its task number.
async fn admitted_by_concurrent_callers<F, Fut>(
    instances: &[Arc<ProductionLimiter>; 2],
    callers: usize,
    caller: F,
) -> u64
where
    F: Fn(Arc<ProductionLimiter>, usize) -> Fut,
    Fut: Future<Output = u64> + Send + 'static,
{
    let tasks: Vec<_> = (0..callers)
        .map(|task| tokio::spawn(caller(Arc::clone(&instances[task % 2]), task)))
        .collect();
    let mut admitted = 0;
    for task in tasks {
        admitted += task.await.expect("task finished");
    }
    admitted
}

// ---------------------------------------------------------------------------------------------
// The cases.

/// Statuses come back in request order, each with its limit, remaining and reset; once both
/// limits are full the request is over with the rejected descriptors marked.
async fn statuses_follow_request_order(t: &Target) {
    let limiter = t.limiter(Settings::default()).await;
    let v = fresh("order");
    let request = req(vec![
        d(&[("nothing", &v)]),
        d(&[("user", &v)]),
        d(&[("free", &v)]),
        d(&[("allow", "internal")]),
        d(&[("user_log", &v)]),
        d(&[("user", &v), ("deeper", "x")]),
    ]);
    for round in 0..5u32 {
        let decision = ask(&limiter, &request).await;
        assert_eq!(decision.overall, Code::Ok, "round {round}: {decision:?}");
        assert_eq!(codes(&decision), vec![Code::Ok; 6]);
        assert!(decision.response_headers.is_empty());
        assert_free(&decision, 0, "unmatched");
        assert_free(&decision, 3, "allow-listed");
        assert_free(&decision, 5, "deeper than the config");
        assert_eq!(decision.statuses[2].remaining, u32::MAX, "unlimited");
        assert_free(&decision, 2, "unlimited");

        let user = &decision.statuses[1];
        let limit = user.limit.as_ref().expect("user's limit");
        assert_eq!(
            (limit.requests_per_unit, limit.unit, limit.name.as_deref()),
            (5, Some(Unit::Hour), Some("per_user"))
        );
        assert_eq!(user.remaining, 4 - round, "round {round}");
        // The counter's hits leave with the end of the next fixed hour.
        let user_reset = reset_s(&decision, 1);
        assert!(
            (HOUR_S + 1..=2 * HOUR_S).contains(&user_reset),
            "{user_reset}"
        );

        let user_log = &decision.statuses[4];
        let limit = user_log.limit.as_ref().expect("user_log's limit");
        assert_eq!(
            (limit.requests_per_unit, limit.unit, limit.name.as_deref()),
            (5, Some(Unit::Hour), None)
        );
        assert_eq!(user_log.remaining, 4 - round, "round {round}");
        // The newest entry is this hit: the quota is whole one window from now.
        assert_eq!(reset_s(&decision, 4), HOUR_S);
    }
    let decision = ask(&limiter, &request).await;
    assert_eq!(decision.overall, Code::OverLimit);
    assert_eq!(
        codes(&decision),
        [
            Code::Ok,
            Code::OverLimit,
            Code::Ok,
            Code::Ok,
            Code::OverLimit,
            Code::Ok
        ]
    );
    assert_eq!(decision.statuses[1].remaining, 0);
    assert_eq!(decision.statuses[4].remaining, 0);
    assert_eq!(decision.statuses[2].remaining, u32::MAX);
    // Counter: 5 in this hour fit again a fifth into the next one (or sooner, had the hour
    // turned mid-test). Log: when the first hit of this test leaves the hour.
    let user_wait = reset_s(&decision, 1);
    let log_wait = reset_s(&decision, 4);
    assert!((1..=HOUR_S + 720).contains(&user_wait), "{user_wait}");
    assert!((HOUR_S - 60..=HOUR_S).contains(&log_wait), "{log_wait}");
    assert_eq!(retry_after(&decision), Some(user_wait.max(log_wait)));
}

/// Unknown domains, unmatched descriptors, allow-list entries, unlimited and replaced limits
/// answer OK without a limit and count nothing.
async fn no_limit_applies(t: &Target) {
    let limiter = t.limiter(Settings::default()).await;
    let v = fresh("nolimit");

    let mut foreign = req(vec![d(&[("user", &v)]), d(&[("zero", &v)])]);
    foreign.domain = "elsewhere".into();
    for _ in 0..10 {
        let decision = ask(&limiter, &foreign).await;
        assert_eq!(decision.overall, Code::Ok);
        assert_free(&decision, 0, "unknown domain");
        assert_free(&decision, 1, "unknown domain");
        assert!(decision.response_headers.is_empty());
    }
    // Nothing was counted under the same descriptor while its domain was unknown.
    let decision = ask_one(&limiter, d(&[("user", &v)])).await;
    assert_eq!(decision.statuses[0].remaining, 4);

    for _ in 0..20 {
        let decision = ask(
            &limiter,
            &req(vec![
                d(&[("free", &v)]),
                d(&[("allow", "internal")]),
                d(&[("allow", &v)]),
                d(&[("nothing", &v)]),
            ]),
        )
        .await;
        assert_eq!(decision.overall, Code::Ok);
        assert_eq!(decision.statuses[0].remaining, u32::MAX, "unlimited");
        for (index, what) in [
            "unlimited",
            "allow-listed",
            "unmatched value",
            "unmatched key",
        ]
        .into_iter()
        .enumerate()
        {
            assert_free(&decision, index, what);
        }
    }

    let both = req(vec![d(&[("general", &v)]), d(&[("specific", &v)])]);
    let decision = ask(&limiter, &both).await;
    assert_eq!(decision.overall, Code::Ok);
    assert_free(&decision, 0, "replaced");
    assert_eq!(decision.statuses[1].remaining, 0);
    let decision = ask(&limiter, &both).await;
    assert_eq!(decision.overall, Code::OverLimit);
    assert_eq!(codes(&decision), [Code::Ok, Code::OverLimit]);
    assert_free(&decision, 0, "replaced");
    // Alone, general applies, and the replaced hits were never counted.
    let alone = ask_one(&limiter, d(&[("general", &v)])).await;
    assert_eq!(alone.statuses[0].remaining, 99);
    assert_eq!(
        alone.statuses[0]
            .limit
            .as_ref()
            .map(|l| l.requests_per_unit),
        Some(100)
    );
}

/// The descriptor's hits_addend wins over the request's; the request's 0 counts as 1; a cost
/// of exactly the limit fits.
async fn hits_addend_of_request_and_descriptor(t: &Target) {
    let limiter = t.limiter(Settings::default()).await;
    for suffix in COUNTER_AND_LOG {
        let key = format!("quota{suffix}");
        let v = fresh("addend");
        let mut request = req(vec![d(&[(&key, &v)])]);
        request.hits_addend = 4;
        assert_eq!(ask(&limiter, &request).await.statuses[0].remaining, 6);
        request.descriptors = vec![with_addend(d(&[(&key, &v)]), 5)];
        assert_eq!(ask(&limiter, &request).await.statuses[0].remaining, 1);
        request.descriptors = vec![with_addend(d(&[(&key, &v)]), 2)];
        let decision = ask(&limiter, &request).await;
        assert_eq!(decision.overall, Code::OverLimit, "{key}");
        assert_eq!(decision.statuses[0].remaining, 1, "{key}: 2 did not count");
        request.descriptors = vec![with_addend(d(&[(&key, &v)]), 1)];
        let decision = ask(&limiter, &request).await;
        assert_eq!(decision.overall, Code::Ok, "{key}");
        assert_eq!(decision.statuses[0].remaining, 0);

        let w = fresh("addend");
        assert_eq!(
            ask_one(&limiter, d(&[(&key, &w)])).await.statuses[0].remaining,
            9,
            "{key}: a request hits_addend of 0 is 1"
        );
        assert_one(
            &limiter,
            with_addend(d(&[(&key, &fresh("addend"))]), 10),
            (Code::Ok, 0),
            &format!("{key}: a cost of exactly the limit fits"),
        )
        .await;
    }
}

/// A descriptor hits_addend of 0 checks without consuming: OK while a unit is left.
async fn check_only_consumes_nothing(t: &Target) {
    let limiter = t.limiter(Settings::default()).await;
    for suffix in COUNTER_AND_LOG {
        let key = format!("quota{suffix}");
        let v = fresh("check");
        let probe = || with_addend(d(&[(&key, &v)]), 0);
        for _ in 0..20 {
            assert_one(&limiter, probe(), (Code::Ok, 10), &key).await;
        }
        ask_one(&limiter, with_addend(d(&[(&key, &v)]), 9)).await;
        for _ in 0..5 {
            let what = format!("{key}: one unit left");
            assert_one(&limiter, probe(), (Code::Ok, 1), &what).await;
        }
        let what = format!("{key}: the probes left the last unit");
        assert_one(&limiter, d(&[(&key, &v)]), (Code::Ok, 0), &what).await;
        assert_one(&limiter, probe(), (Code::OverLimit, 0), &key).await;
    }
}

/// A cost above the limit can never fit: OVER_LIMIT with the full window, no overflow for
/// u32::MAX / u64::MAX, and nothing consumed.
async fn cost_above_the_limit_is_over_with_the_full_window(t: &Target) {
    let limiter = t.limiter(Settings::default()).await;
    for suffix in COUNTER_AND_LOG {
        let key = format!("quota{suffix}");
        let v = fresh("big");
        for addend in [11, u64::from(u32::MAX), u64::MAX - 1, u64::MAX] {
            let decision = ask_one(&limiter, with_addend(d(&[(&key, &v)]), addend)).await;
            assert_eq!(decision.overall, Code::OverLimit, "{key} {addend}");
            assert_eq!(decision.statuses[0].remaining, 10, "{key} {addend}");
            assert_eq!(reset_s(&decision, 0), DAY_S, "{key} {addend}");
            assert_eq!(retry_after(&decision), Some(DAY_S));
        }
        let mut request = req(vec![d(&[(&key, &v)])]);
        request.hits_addend = u32::MAX;
        let decision = ask(&limiter, &request).await;
        assert_eq!(decision.overall, Code::OverLimit, "{key}");
        assert_eq!(decision.statuses[0].remaining, 10);
        assert_eq!(reset_s(&decision, 0), DAY_S);
        // None of those consumed anything.
        assert_eq!(
            ask_one(&limiter, d(&[(&key, &v)])).await.statuses[0].remaining,
            9,
            "{key}"
        );
    }
}

/// A limit of 0 rejects every hit, checks included, with the full window.
async fn zero_requests_per_unit_rejects_everything(t: &Target) {
    let limiter = t.limiter(Settings::default()).await;
    for suffix in COUNTER_AND_LOG {
        let key = format!("zero{suffix}");
        let v = fresh("zero");
        for descriptor in [
            d(&[(&key, &v)]),
            with_addend(d(&[(&key, &v)]), 0),
            d(&[(&key, &v)]),
        ] {
            let decision = ask_one(&limiter, descriptor).await;
            assert_eq!(decision.overall, Code::OverLimit, "{key}");
            assert_eq!(decision.statuses[0].remaining, 0);
            assert_eq!(reset_s(&decision, 0), 1, "{key}: a one-second window");
            assert_eq!(retry_after(&decision), Some(1));
        }
    }
}

/// A shadow descriptor reports OK but is counted like any other.
async fn shadow_descriptor_reports_ok_but_counts(t: &Target) {
    let limiter = t.limiter(Settings::default()).await;
    let v = fresh("shadow");
    assert_one(
        &limiter,
        d(&[("shadowed", &v)]),
        (Code::Ok, 0),
        "the first hit",
    )
    .await;
    for _ in 0..3 {
        let decision = ask_one(&limiter, d(&[("shadowed", &v)])).await;
        assert_eq!(decision.overall, Code::Ok);
        assert_eq!(decision.statuses[0].code, Code::Ok);
        assert_eq!(
            decision.statuses[0].remaining, 0,
            "the first hit is counted"
        );
        assert!(decision.response_headers.is_empty());
    }
    // A request over only in shadow is not rejected: its other hits stay counted.
    let w = fresh("shadow");
    let decision = ask(
        &limiter,
        &req(vec![d(&[("shadowed", &v)]), d(&[("quota", &w)])]),
    )
    .await;
    assert_eq!(decision.overall, Code::Ok);
    assert_eq!(decision.statuses[1].remaining, 9);
    assert_eq!(
        ask_one(&limiter, d(&[("quota", &w)])).await.statuses[0].remaining,
        8
    );
}

/// `--shadow-mode` turns the overall code OK and changes nothing else: statuses stay, and the
/// rejected request's hits are still given back.
async fn global_shadow_mode_changes_only_the_overall_code(t: &Target) {
    let limiter = t
        .limiter(Settings {
            shadow_mode: true,
            ..Settings::default()
        })
        .await;
    for suffix in COUNTER_AND_LOG {
        let user_key = format!("user{suffix}");
        let quota_key = format!("quota{suffix}");
        let v = fresh("globalshadow");
        for expected in (0..5).rev() {
            let decision = ask_one(&limiter, d(&[(&user_key, &v)])).await;
            assert_eq!(decision.statuses[0].remaining, expected);
        }
        for _ in 0..3 {
            let decision = ask(
                &limiter,
                &req(vec![d(&[(&quota_key, &v)]), d(&[(&user_key, &v)])]),
            )
            .await;
            assert_eq!(decision.overall, Code::Ok, "{suffix}");
            assert_eq!(codes(&decision), [Code::Ok, Code::OverLimit], "{suffix}");
            assert_eq!(decision.statuses[0].remaining, 9);
            assert!(decision.response_headers.is_empty());
        }
        assert_eq!(
            ask_one(&limiter, d(&[(&quota_key, &v)])).await.statuses[0].remaining,
            9,
            "{suffix}: counting is as without shadow mode"
        );
    }
}

/// `retry-after` is the largest wait among the descriptors over, only on OVER_LIMIT, and only
/// with `--retry-after-header`.
async fn retry_after_is_the_largest_wait(t: &Target) {
    let limiter = t.limiter(Settings::default()).await;
    let v = fresh("retry");
    for _ in 0..3 {
        let decision = ask_one(&limiter, d(&[("login", &v)])).await;
        assert!(decision.response_headers.is_empty(), "{decision:?}");
    }
    for _ in 0..5 {
        ask_one(&limiter, d(&[("user", &v)])).await;
    }
    let decision = ask(
        &limiter,
        &req(vec![
            d(&[("user", &v)]),
            d(&[("login", &v)]),
            d(&[("zero", &v)]),
            d(&[("quota", &v)]),
        ]),
    )
    .await;
    assert_eq!(
        codes(&decision),
        [Code::OverLimit, Code::OverLimit, Code::OverLimit, Code::Ok]
    );
    let user_wait = reset_s(&decision, 0);
    let login_wait = reset_s(&decision, 1);
    assert!((1..=HOUR_S + 720).contains(&user_wait), "{user_wait}");
    // The 2 h log frees up when its first hit leaves: longer than the counter ever waits.
    assert!(
        (2 * HOUR_S - 60..=2 * HOUR_S).contains(&login_wait),
        "{login_wait}"
    );
    assert_eq!(reset_s(&decision, 2), 1);
    assert_eq!(retry_after(&decision), Some(login_wait));
    assert_eq!(
        decision.statuses[1].limit.as_ref().map(|l| l.unit),
        Some(None),
        "a 2 h window is no whole unit"
    );

    let quiet = t
        .limiter(Settings {
            retry_after_header: false,
            ..Settings::default()
        })
        .await;
    // (zero is over on every store, memory's separate one included)
    let decision = ask_one(&quiet, d(&[("zero", &v)])).await;
    assert_eq!(decision.overall, Code::OverLimit);
    assert!(decision.response_headers.is_empty(), "{decision:?}");
}

/// A rejected request consumes nothing: the descriptor that is over does not count, and what
/// the others took (sharded limits included) is given back.
async fn rejected_requests_consume_nothing(t: &Target) {
    let limiter = t.limiter(Settings::default()).await;
    for suffix in COUNTER_AND_LOG {
        let (user, hot, zero) = (
            format!("user{suffix}"),
            format!("hot{suffix}"),
            format!("zero{suffix}"),
        );
        let v = fresh("refund");
        let request = req(vec![
            d(&[(&user, &v)]),
            d(&[(&hot, &v)]),
            d(&[(&zero, &v)]),
            with_addend(d(&[("quota", &v)]), 3),
        ]);
        for round in 0..10 {
            let decision = ask(&limiter, &request).await;
            assert_eq!(decision.overall, Code::OverLimit, "{suffix} round {round}");
            assert_eq!(
                codes(&decision),
                [Code::Ok, Code::Ok, Code::OverLimit, Code::Ok]
            );
            // Every round sees the counts the previous rounds gave back.
            assert_eq!(decision.statuses[0].remaining, 4, "{suffix} round {round}");
            assert_eq!(decision.statuses[1].remaining, 96, "{suffix} round {round}");
            assert_eq!(decision.statuses[3].remaining, 7, "{suffix} round {round}");
        }
        assert_eq!(
            ask_one(&limiter, d(&[(&user, &v)])).await.statuses[0].remaining,
            4,
            "{suffix}"
        );
        assert_eq!(
            ask_one(&limiter, with_addend(d(&[("quota", &v)]), 0))
                .await
                .statuses[0]
                .remaining,
            10,
            "{suffix}"
        );
        // Each probe lands on a random shard: every shard got its hits back.
        for _ in 0..12 {
            let probe = ask_one(&limiter, with_addend(d(&[(&hot, &v)]), 0)).await;
            assert_eq!(probe.statuses[0].remaining, 100, "{suffix}");
        }
    }
}

/// Refunds hold under concurrency: half the requests carry an always-over descriptor, and only
/// the other half may keep hits, exactly the limit of them in all.
async fn concurrent_rejected_requests_leave_no_residue(t: &Target) {
    for suffix in COUNTER_AND_LOG {
        let instances = t.two_instances().await;
        let key = format!("quota{suffix}");
        let v = fresh("concurrent-refund");
        let admitted = admitted_by_concurrent_callers(&instances, 16, |limiter, task| {
            let (key, v) = (key.clone(), v.clone());
            async move {
                let mut admitted = 0u64;
                for round in 0..40usize {
                    let doomed = (task + round) % 2 == 0;
                    let mut descriptors = vec![d(&[(&key, &v)])];
                    if doomed {
                        descriptors.push(d(&[("zero", &v)]));
                    }
                    let decision = ask(&limiter, &req(descriptors)).await;
                    if doomed {
                        assert_eq!(decision.overall, Code::OverLimit);
                    } else if decision.overall == Code::Ok {
                        admitted += 1;
                    }
                }
                admitted
            }
        })
        .await;
        assert_eq!(admitted, 10, "{}: {key}", t.name());
        let probe = with_addend(d(&[(&key, &v)]), 0);
        assert_one(&instances[0], probe, (Code::OverLimit, 0), &key).await;
    }
}

/// Many concurrent callers on two instances sharing the store never admit more than the limit;
/// with a day-long window both algorithms end exactly full.
async fn concurrent_instances_never_exceed_the_limit(t: &Target) {
    for suffix in COUNTER_AND_LOG {
        let instances = t.two_instances().await;
        let key = format!("race{suffix}");
        let v = fresh("race");
        let admitted = admitted_by_concurrent_callers(&instances, 32, |limiter, task| {
            let (key, v) = (key.clone(), v.clone());
            async move {
                let mut admitted = 0u64;
                for round in 0..25usize {
                    let cost = if (task + round) % 5 == 0 { 2 } else { 1 };
                    let decision = ask_one(&limiter, with_addend(d(&[(&key, &v)]), cost)).await;
                    assert!(decision.statuses[0].remaining <= 150);
                    if decision.overall == Code::Ok {
                        admitted += cost;
                    }
                }
                admitted
            }
        })
        .await;
        // 800 attempts at 150 units: never more, and the limit ends full.
        assert_eq!(admitted, 150, "{}: {key}", t.name());
        let probe = with_addend(d(&[(&key, &v)]), 0);
        assert_one(&instances[1], probe, (Code::OverLimit, 0), &key).await;
    }
}

/// A limit with `shards: 4` never admits more than its limit and, under uniform load from two
/// instances, uses at least 90 % of it.
async fn sharded_limit_stays_within_the_limit(t: &Target) {
    for suffix in COUNTER_AND_LOG {
        let instances = t.two_instances().await;
        let key = format!("hot{suffix}");
        let v = fresh("sharded");
        let admitted = admitted_by_concurrent_callers(&instances, 16, |limiter, _| {
            let (key, v) = (key.clone(), v.clone());
            async move {
                let mut admitted = 0u64;
                for _ in 0..25 {
                    let decision = ask_one(&limiter, d(&[(&key, &v)])).await;
                    let status = &decision.statuses[0];
                    assert!(status.remaining <= 100, "{decision:?}");
                    assert_eq!(status.limit.as_ref().map(|l| l.shards), Some(4));
                    if decision.overall == Code::Ok {
                        admitted += 1;
                    }
                }
                admitted
            }
        })
        .await;
        assert!(admitted <= 100, "{}: {key} admitted {admitted}", t.name());
        assert!(admitted >= 90, "{}: {key} admitted {admitted}", t.name());
    }
}

/// Every case above, in order, on one target.
async fn semantics(t: &Target) {
    statuses_follow_request_order(t).await;
    no_limit_applies(t).await;
    hits_addend_of_request_and_descriptor(t).await;
    check_only_consumes_nothing(t).await;
    cost_above_the_limit_is_over_with_the_full_window(t).await;
    zero_requests_per_unit_rejects_everything(t).await;
    shadow_descriptor_reports_ok_but_counts(t).await;
    global_shadow_mode_changes_only_the_overall_code(t).await;
    retry_after_is_the_largest_wait(t).await;
    rejected_requests_consume_nothing(t).await;
    concurrent_rejected_requests_leave_no_residue(t).await;
    concurrent_instances_never_exceed_the_limit(t).await;
    sharded_limit_stays_within_the_limit(t).await;
}

// ---------------------------------------------------------------------------------------------
// Failure modes (Redis only: the memory backend cannot fail).

/// Asserts that `limiter` answers the failure modes for `[fail_default, fail_allow, fail_deny]`
/// with `default` as the `--failure-mode`, within the bound, several times over.
async fn assert_failure_answers(limiter: &ProductionLimiter, default: FailureMode, v: &str) {
    let request = req(vec![
        d(&[("fail_default", v)]),
        d(&[("fail_allow", v)]),
        d(&[("fail_deny", v)]),
    ]);
    let default_code = match default {
        FailureMode::Allow => Code::Ok,
        FailureMode::Deny => Code::OverLimit,
    };
    for _ in 0..5 {
        let started = Instant::now();
        let decision = ask(limiter, &request).await;
        let waited = started.elapsed();
        assert!(waited < OUTAGE_ANSWER_BOUND, "answered after {waited:?}");
        assert_eq!(
            codes(&decision),
            [default_code, Code::Ok, Code::OverLimit],
            "default {default:?}: {decision:?}"
        );
        assert_eq!(decision.overall, Code::OverLimit);
        // An allowed limit reports itself as untouched.
        assert_eq!(decision.statuses[1].remaining, 5);

        let started = Instant::now();
        let decision = ask(
            limiter,
            &req(vec![d(&[("fail_allow", v)]), d(&[("fail_default", v)])]),
        )
        .await;
        assert!(started.elapsed() < OUTAGE_ANSWER_BOUND);
        assert_eq!(
            decision.overall, default_code,
            "default {default:?}: {decision:?}"
        );
    }
}

/// A limiter on a Redis that is down answers each limit's failure_mode within a bound of the
/// deadline, whichever instance asks, and the same limiter answers for real once Redis is back.
async fn failure_modes_and_recovery(t: &Target, stop: impl FnOnce(), restart: impl FnOnce()) {
    let deny_by_default = Settings {
        failure_mode: FailureMode::Deny,
        ..Settings::default()
    };
    let store = t.store.clone();
    let lenient = t
        .limiter_with(&store, Settings::default(), OUTAGE_TIMEOUT)
        .await;
    let strict = t
        .limiter_with(&store, deny_by_default, OUTAGE_TIMEOUT)
        .await;

    // Nothing listens: a limiter can start before its Redis and still answer.
    let nowhere = format!("redis://{}", tollgate_testkit::net::free_addr());
    let nowhere = match store {
        Store::Cluster(_) => Store::Cluster(vec![nowhere]),
        _ => Store::Redis(nowhere),
    };
    let v = fresh("nowhere");
    let orphan = t
        .limiter_with(&nowhere, Settings::default(), OUTAGE_TIMEOUT)
        .await;
    assert_failure_answers(&orphan, FailureMode::Allow, &v).await;
    let orphan = t
        .limiter_with(&nowhere, deny_by_default, OUTAGE_TIMEOUT)
        .await;
    assert_failure_answers(&orphan, FailureMode::Deny, &v).await;

    // Redis stops under limiters that were working.
    let v = fresh("outage");
    let before = ask_one(&strict, d(&[("fail_deny", &v)])).await;
    assert_eq!(before.overall, Code::Ok, "{}: {before:?}", t.name());
    tokio::task::block_in_place(stop);
    assert_failure_answers(&lenient, FailureMode::Allow, &v).await;
    assert_failure_answers(&strict, FailureMode::Deny, &v).await;

    // Back: the same limiters answer for real by themselves. A deny limit only says OK when the
    // backend decided, and an allow limit reports a count only then. (A 50 ms call that timed
    // out may still have been counted, hence "at most" below.)
    tokio::task::block_in_place(restart);
    let w = fresh("recovered");
    let strict_status = until_decided(&strict, "fail_deny", &w, |s| s.code == Code::Ok).await;
    assert!(strict_status.remaining <= 4, "{}", t.name());
    let lenient_status = until_decided(&lenient, "fail_allow", &w, |s| s.remaining < 5).await;
    assert_eq!(lenient_status.code, Code::Ok);
    // The counts live in the store: another instance sees them.
    let observer = t.limiter(Settings::default()).await;
    for (key, status) in [
        ("fail_deny", &strict_status),
        ("fail_allow", &lenient_status),
    ] {
        let probe = ask_one(&observer, with_addend(d(&[(key, &w)]), 0)).await;
        assert!(
            probe.statuses[0].remaining <= status.remaining,
            "{}: {key}: {probe:?}",
            t.name()
        );
    }
}

/// Asks `limiter` about `key=value` until `decided` accepts the status (a minute at most).
async fn until_decided(
    limiter: &ProductionLimiter,
    key: &str,
    value: &str,
    decided: impl Fn(&Status) -> bool,
) -> Status {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let decision = ask_one(limiter, d(&[(key, value)])).await;
        if decided(&decision.statuses[0]) {
            return decision.statuses[0].clone();
        }
        assert!(
            Instant::now() < deadline,
            "{key}: no real decision a minute after the backend came back: {decision:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

// ---------------------------------------------------------------------------------------------
// The three targets.

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn conformance_memory() {
    semantics(&Target::new(Store::Memory)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn conformance_redis() {
    let server = RedisServer::start();
    let target = Target::new(Store::Redis(server.url()));
    semantics(&target).await;
    let server = std::sync::Mutex::new(server);
    failure_modes_and_recovery(
        &target,
        || server.lock().expect("server").stop(),
        || server.lock().expect("server").restart(),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn conformance_redis_cluster() {
    let cluster = RedisCluster::start();
    let target = Target::new(Store::Cluster(cluster.urls()));
    semantics(&target).await;
    let cluster = std::sync::Mutex::new(cluster);
    failure_modes_and_recovery(
        &target,
        || {
            let mut cluster = cluster.lock().expect("cluster");
            for node in &mut cluster.nodes {
                node.stop();
            }
        },
        || {
            let mut cluster = cluster.lock().expect("cluster");
            // Masters first (creation order), then replicas: every node comes back with its
            // cluster config, empty.
            for node in &mut cluster.nodes {
                node.restart();
            }
            cluster.wait_healthy(Duration::from_secs(60));
        },
    )
    .await;
}
