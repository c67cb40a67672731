//! The Redis backends against real servers: one conformance suite run against the memory backend,
//! a single `redis-server` and a Redis Cluster of three masters and three replicas (all started
//! here on free loopback ports), the Lua scripts held to the window math at chosen instants, and
//! what happens when Redis misbehaves: concurrency from two instances, TTLs, a server that stops
//! and comes back, SCRIPT FLUSH, a cluster master that dies.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tollgate::backend::redis::KeySpace;
use tollgate::backend::{
    Backend, BackendError, ClusterBackend, Hit, MemoryBackend, Outcome, RedisBackend,
};
use tollgate::window::{self, Algorithm, Cost, Verdict};
use tollgate_testkit::redis::{RedisCluster, RedisServer};
use tollgate_testkit::wait;

const PREFIX: &str = "tollgate-test:";
const TIMEOUT: Duration = Duration::from_millis(500);
/// A window so long that no fixed-window boundary falls inside a test run (the next is in 2039):
/// with no previous window, counter results do not depend on the instant.
const LONG_WINDOW_MS: u64 = 1 << 40;
const HOUR_MS: u64 = 3_600_000;
const ALGORITHMS: [Algorithm; 2] = [Algorithm::SlidingWindowCounter, Algorithm::SlidingWindowLog];

static NEXT_KEY: AtomicU64 = AtomicU64::new(0);

/// A limiter identity no other test uses.
fn fresh_key(name: &str) -> String {
    format!(
        "{name}|{}|{}",
        std::process::id(),
        NEXT_KEY.fetch_add(1, Ordering::Relaxed)
    )
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn hit(key: &str, algorithm: Algorithm, limit: u64, window_ms: u64, cost: Cost) -> Hit {
    Hit {
        key: key.to_owned(),
        algorithm,
        limit,
        window_ms,
        cost,
        shards: 1,
    }
}

async fn connect(url: &str, timeout: Duration) -> RedisBackend {
    RedisBackend::connect(url, PREFIX, timeout)
        .await
        .expect("connect")
}

async fn connect_cluster(urls: &[String], timeout: Duration) -> ClusterBackend {
    ClusterBackend::connect(urls, PREFIX, timeout)
        .await
        .expect("connect")
}

/// The outcome of one hit decided at the instant `now` (ms since the epoch).
async fn one_at(backend: &RedisBackend, hit: &Hit, now: u64) -> Outcome {
    backend
        .acquire_at(std::slice::from_ref(hit), now)
        .await
        .remove(0)
        .expect("decided")
}

async fn one<B: Backend>(backend: &B, hit: &Hit) -> Outcome {
    let mut results = backend.acquire(std::slice::from_ref(hit)).await;
    assert_eq!(results.len(), 1);
    results
        .remove(0)
        .unwrap_or_else(|err| panic!("{hit:?}: {err}"))
}

/// Asserts whether a hit was admitted and what it left, whatever its reset.
fn assert_admitted(outcome: &Outcome, admitted: bool, remaining: u64) {
    assert_eq!(
        (outcome.verdict.admitted, outcome.verdict.remaining),
        (admitted, remaining),
        "{outcome:?}"
    );
}

/// Asserts an admitted hit's counts; the reset time is checked against the bounds the wall clock
/// allows around the call.
fn assert_verdict(outcome: &Outcome, admitted: bool, remaining: u64, reset_range: (u64, u64)) {
    let Verdict {
        admitted: got_admitted,
        remaining: got_remaining,
        reset_ms,
    } = outcome.verdict;
    assert_eq!(
        (got_admitted, got_remaining),
        (admitted, remaining),
        "{outcome:?}"
    );
    assert!(
        (reset_range.0..=reset_range.1).contains(&reset_ms),
        "reset {reset_ms} outside {reset_range:?} in {outcome:?}"
    );
}

/// The time until the end of the fixed window after the current one, from either side of a call.
fn counter_reset_bounds(before: u64, after: u64) -> (u64, u64) {
    let end = (after / LONG_WINDOW_MS + 2) * LONG_WINDOW_MS;
    (end - after - 1000, end - before + 1000)
}

// ---------------------------------------------------------------------------------------------
// The conformance suite: the same cases against every backend.

async fn conformance<B: Backend>(backend: &B) {
    admits_up_to_the_limit(backend).await;
    weighted_costs(backend).await;
    check_only_consumes_nothing(backend).await;
    cost_above_the_limit_never_fits(backend).await;
    release_restores_the_quota(backend).await;
    several_limiters_in_one_call(backend).await;
    log_retry_waits_for_the_oldest_entry(backend).await;
}

async fn admits_up_to_the_limit<B: Backend>(backend: &B) {
    for algorithm in ALGORITHMS {
        let key = fresh_key("up-to-limit");
        let h = hit(&key, algorithm, 5, LONG_WINDOW_MS, Cost::Consume(1));
        for remaining in (0..5).rev() {
            let before = now_ms();
            let outcome = one(backend, &h).await;
            let after = now_ms();
            let reset = match algorithm {
                Algorithm::SlidingWindowCounter => counter_reset_bounds(before, after),
                Algorithm::SlidingWindowLog => (LONG_WINDOW_MS, LONG_WINDOW_MS),
            };
            assert_verdict(&outcome, true, remaining, reset);
            let receipt = outcome.receipt.expect("an admitted charge has a receipt");
            assert_eq!((receipt.cost, receipt.algorithm), (1, algorithm));
        }
        let before = now_ms();
        let refused = one(backend, &h).await;
        let after = now_ms();
        assert_eq!(refused.receipt, None);
        // counter: curr = 5 must slide out of the next window far enough for one more unit;
        // log: the oldest entry must leave the window
        let expected = |now: u64| match algorithm {
            Algorithm::SlidingWindowCounter => {
                window::counter_decide(5, LONG_WINDOW_MS, now, 0, 5, Cost::Consume(1)).reset_ms
            }
            Algorithm::SlidingWindowLog => LONG_WINDOW_MS - 1,
        };
        let bounds = match algorithm {
            Algorithm::SlidingWindowCounter => (expected(after + 1000), expected(before - 1000)),
            // the oldest entry is a little older than now
            Algorithm::SlidingWindowLog => (LONG_WINDOW_MS - 60_000, LONG_WINDOW_MS),
        };
        assert_verdict(&refused, false, 0, bounds);
    }
}

async fn weighted_costs<B: Backend>(backend: &B) {
    for algorithm in ALGORITHMS {
        let key = fresh_key("weighted");
        let at = |cost| hit(&key, algorithm, 10, LONG_WINDOW_MS, cost);
        let first = one(backend, &at(Cost::Consume(4))).await;
        assert_admitted(&first, true, 6);
        assert_eq!(first.receipt.as_ref().map(|r| r.cost), Some(4));

        let too_much = one(backend, &at(Cost::Consume(7))).await;
        assert!(!too_much.verdict.admitted, "{too_much:?}");
        assert_eq!(
            too_much.verdict.remaining, 6,
            "a refused hit consumes nothing"
        );
        assert!(too_much.verdict.reset_ms > 0);

        assert_admitted(&one(backend, &at(Cost::Consume(6))).await, true, 0);
        assert_admitted(&one(backend, &at(Cost::Consume(1))).await, false, 0);
    }
}

async fn check_only_consumes_nothing<B: Backend>(backend: &B) {
    for algorithm in ALGORITHMS {
        let key = fresh_key("check-only");
        let at = |cost| hit(&key, algorithm, 2, LONG_WINDOW_MS, cost);
        for cost in [Cost::CheckOnly, Cost::Consume(0)] {
            let check = one(backend, &at(cost)).await;
            // nothing counted yet: the quota is whole, so there is nothing to wait for
            assert_verdict(&check, true, 2, (0, 0));
            assert_eq!(check.receipt, None, "a check has nothing to give back");
        }
        assert!(one(backend, &at(Cost::Consume(1))).await.verdict.admitted);
        let half = one(backend, &at(Cost::CheckOnly)).await;
        assert_admitted(&half, true, 1);
        assert!(half.verdict.reset_ms > 0, "{half:?}");
        assert!(one(backend, &at(Cost::Consume(1))).await.verdict.admitted);
        let full = one(backend, &at(Cost::CheckOnly)).await;
        assert_admitted(&full, false, 0);
        assert!(full.verdict.reset_ms > 0);
    }
}

async fn cost_above_the_limit_never_fits<B: Backend>(backend: &B) {
    for algorithm in ALGORITHMS {
        let key = fresh_key("too-big");
        let at = |limit, cost| hit(&key, algorithm, limit, HOUR_MS, cost);
        for cost in [4, 1 << 53, u64::MAX - 1, u64::MAX] {
            let refused = one(backend, &at(3, Cost::Consume(cost))).await;
            assert_verdict(&refused, false, 3, (HOUR_MS, HOUR_MS));
            assert_eq!(refused.receipt, None);
        }
        // nothing was consumed by the refusals
        assert_admitted(&one(backend, &at(3, Cost::Consume(3))).await, true, 0);
        // a limit of 0 refuses everything, checks included, for a full window
        let zero_key = fresh_key("zero");
        for cost in [Cost::CheckOnly, Cost::Consume(1)] {
            let refused = one(backend, &hit(&zero_key, algorithm, 0, HOUR_MS, cost)).await;
            assert_verdict(&refused, false, 0, (HOUR_MS, HOUR_MS));
        }
        // a huge limit with a huge cost is exact
        let huge_key = fresh_key("huge");
        let limit = (1 << 53) - 1;
        let huge = |cost| hit(&huge_key, algorithm, limit, LONG_WINDOW_MS, cost);
        assert_admitted(
            &one(backend, &huge(Cost::Consume(limit - 1))).await,
            true,
            1,
        );
        assert_admitted(&one(backend, &huge(Cost::Consume(2))).await, false, 1);
    }
}

async fn release_restores_the_quota<B: Backend>(backend: &B) {
    for algorithm in ALGORITHMS {
        let key = fresh_key("release");
        let at = |cost| hit(&key, algorithm, 5, LONG_WINDOW_MS, cost);
        let kept = one(backend, &at(Cost::Consume(2))).await;
        let given_back = one(backend, &at(Cost::Consume(3))).await;
        assert_eq!(given_back.verdict.remaining, 0);
        let receipt = given_back.receipt.expect("a receipt");
        backend
            .release(std::slice::from_ref(&receipt))
            .await
            .expect("release");
        let check = one(backend, &at(Cost::CheckOnly)).await;
        assert_eq!(check.verdict.remaining, 3, "exactly that charge came back");
        if algorithm == Algorithm::SlidingWindowLog {
            // the entry is gone: giving it back twice gives nothing more (a counter cannot
            // tell, and only saturates at zero)
            backend.release(&[receipt]).await.expect("release again");
            assert_eq!(
                one(backend, &at(Cost::CheckOnly)).await.verdict.remaining,
                3
            );
        }
        backend
            .release(&[kept.receipt.expect("a receipt")])
            .await
            .expect("release");
        assert_admitted(&one(backend, &at(Cost::Consume(5))).await, true, 0);
        backend.release(&[]).await.expect("releasing nothing");
    }
}

async fn several_limiters_in_one_call<B: Backend>(backend: &B) {
    let counter = fresh_key("many-counter");
    let log = fresh_key("many-log");
    let hits = [
        hit(
            &counter,
            Algorithm::SlidingWindowCounter,
            3,
            LONG_WINDOW_MS,
            Cost::Consume(2),
        ),
        hit(
            &log,
            Algorithm::SlidingWindowLog,
            1,
            LONG_WINDOW_MS,
            Cost::Consume(1),
        ),
        hit(
            &log,
            Algorithm::SlidingWindowLog,
            1,
            LONG_WINDOW_MS,
            Cost::Consume(1),
        ),
        hit(
            &counter,
            Algorithm::SlidingWindowCounter,
            3,
            LONG_WINDOW_MS,
            Cost::Consume(2),
        ),
    ];
    let results: Vec<Outcome> = backend
        .acquire(&hits)
        .await
        .into_iter()
        .map(|result| result.expect("decided"))
        .collect();
    let answers: Vec<(bool, u64)> = results
        .iter()
        .map(|o| (o.verdict.admitted, o.verdict.remaining))
        .collect();
    // each hit is decided on its own, in order
    assert_eq!(answers, [(true, 1), (true, 0), (false, 0), (false, 1)]);
    assert!(backend.acquire(&[]).await.is_empty());
}

async fn log_retry_waits_for_the_oldest_entry<B: Backend>(backend: &B) {
    let key = fresh_key("log-retry");
    let at = |cost| hit(&key, Algorithm::SlidingWindowLog, 4, HOUR_MS, cost);
    let start = now_ms();
    assert!(one(backend, &at(Cost::Consume(3))).await.verdict.admitted);
    assert!(one(backend, &at(Cost::Consume(1))).await.verdict.admitted);
    // one more unit needs the cost-3 entry (the oldest) to leave; so do 2 and 3 more units;
    // 4 units need both entries gone
    let end = now_ms();
    for cost in [1, 3] {
        let refused = one(backend, &at(Cost::Consume(cost))).await;
        let after = now_ms();
        assert_verdict(
            &refused,
            false,
            0,
            (
                (start + HOUR_MS).saturating_sub(after),
                end + HOUR_MS - start,
            ),
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_memory() {
    conformance(&MemoryBackend::new()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_redis() {
    let server = RedisServer::start();
    let backend = connect(&server.url(), TIMEOUT).await;
    conformance(&backend).await;
    backend.ping().await.expect("ping");
    assert_every_key_has_a_ttl(&server.keys_with_ttls(&format!("{PREFIX}*")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_redis_cluster() {
    let cluster = RedisCluster::start();
    let backend = connect_cluster(&cluster.urls(), TIMEOUT).await;
    conformance(&backend).await;
    backend.ping().await.expect("ping");
    let keys = cluster.keys_with_ttls(&format!("{PREFIX}*"));
    assert_every_key_has_a_ttl(&keys);

    // every key of one limiter is in one slot, and the limiters spread over the masters
    let any = cluster.running().next().expect("a node");
    let mut slots_of_limiter: HashMap<String, Vec<u16>> = HashMap::new();
    for (key, _) in &keys {
        let slot: u16 = any
            .cli(&["CLUSTER", "KEYSLOT", key])
            .parse()
            .expect("a slot");
        assert_eq!(slot, tollgate::backend::redis::keys::slot(key), "{key}");
        let limiter = key.rsplit_once(':').map_or(key.as_str(), |(base, _)| base);
        slots_of_limiter
            .entry(limiter.to_owned())
            .or_default()
            .push(slot);
    }
    let logs_with_both_keys = slots_of_limiter
        .values()
        .filter(|slots| slots.len() == 2)
        .count();
    assert!(logs_with_both_keys > 0, "{slots_of_limiter:?}");
    for (limiter, slots) in &slots_of_limiter {
        assert!(
            slots.windows(2).all(|pair| pair[0] == pair[1]),
            "{limiter}: {slots:?}"
        );
    }
    let masters_used = cluster
        .running()
        .filter(|node| node.info_field("replication", "role").as_deref() == Some("master"))
        .filter(|node| node.cli(&["DBSIZE"]) != "0")
        .count();
    assert!(masters_used >= 2, "the limiters all landed on one master");
}

fn assert_every_key_has_a_ttl(keys: &[(String, i64)]) {
    assert!(!keys.is_empty(), "the suite wrote no keys");
    for (key, ttl) in keys {
        assert!(*ttl > 0, "{key} has no TTL ({ttl})");
    }
}

// ---------------------------------------------------------------------------------------------
// The scripts against the window math, at chosen instants.

/// Random hits at increasing instants on a few limiters, the same hits fed to a model that keeps
/// what was admitted and decides with `tollgate::window`; every verdict must be identical, and
/// every released charge leaves the model too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_follow_the_window_math() {
    let server = RedisServer::start();
    let backend = connect(&server.url(), TIMEOUT).await;
    let mut rng = fastrand::Rng::with_seed(7);
    // (limit, window): ordinary, tiny, and large enough that limit * window passes 2^53
    let shapes: [(u64, u64); 5] = [
        (10, 1000),
        (3, 7000),
        (1, 1000),
        (4_294_967_295, 31_536_000_000),
        ((1 << 40) + 7, 86_400_000),
    ];
    for (limit, window_ms) in shapes {
        for algorithm in ALGORITHMS {
            let key = fresh_key("model");
            let mut now = 1_700_000_000_000 + rng.u64(0..window_ms);
            let mut counts: BTreeMap<u64, u64> = BTreeMap::new();
            let mut entries: Vec<(u64, u64, u64)> = Vec::new(); // (time, cost, id)
            let mut receipts = Vec::new();
            for step in 0..300 {
                now += match rng.u8(0..10) {
                    0 => window_ms + rng.u64(0..window_ms),
                    1..=3 => rng.u64(0..window_ms / 2 + 1),
                    _ => rng.u64(0..window_ms / 20 + 1),
                };
                if rng.u8(0..8) == 0 && !receipts.is_empty() {
                    let receipt: tollgate::backend::Receipt =
                        receipts.swap_remove(rng.usize(0..receipts.len()));
                    backend
                        .release(std::slice::from_ref(&receipt))
                        .await
                        .expect("release");
                    match algorithm {
                        Algorithm::SlidingWindowCounter => {
                            if let Some(count) = counts.get_mut(&receipt.token) {
                                *count = count.saturating_sub(receipt.cost);
                            }
                        }
                        Algorithm::SlidingWindowLog => {
                            entries.retain(|&(_, _, id)| id != receipt.token)
                        }
                    }
                    continue;
                }
                let cost = match rng.u8(0..10) {
                    0 => Cost::CheckOnly,
                    1 => Cost::Consume(limit + rng.u64(1..3)),
                    2 => Cost::Consume(rng.u64(1..=limit.max(1))),
                    _ => Cost::Consume(rng.u64(1..=(limit / 3).clamp(1, 4))),
                };
                let h = hit(&key, algorithm, limit, window_ms, cost);
                let outcome = one_at(&backend, &h, now).await;
                let k = now / window_ms;
                let expected = match algorithm {
                    Algorithm::SlidingWindowCounter => {
                        let prev = k.checked_sub(1).and_then(|p| counts.get(&p)).copied();
                        let curr = counts.get(&k).copied();
                        window::counter_decide(
                            limit,
                            window_ms,
                            now,
                            prev.unwrap_or(0),
                            curr.unwrap_or(0),
                            cost,
                        )
                    }
                    Algorithm::SlidingWindowLog => {
                        let pairs: Vec<(u64, u64)> =
                            entries.iter().map(|&(t, c, _)| (t, c)).collect();
                        window::log_decide(limit, window_ms, now, &pairs, cost)
                    }
                };
                assert_eq!(
                    outcome.verdict, expected,
                    "step {step}: {h:?} at {now} (limit {limit}, window {window_ms})"
                );
                if let Some(receipt) = outcome.receipt {
                    let Cost::Consume(units) = cost else {
                        panic!("a check got a receipt")
                    };
                    match algorithm {
                        Algorithm::SlidingWindowCounter => {
                            assert_eq!(receipt.token, k);
                            *counts.entry(k).or_default() += units;
                        }
                        Algorithm::SlidingWindowLog => entries.push((now, units, receipt.token)),
                    }
                    receipts.push(receipt);
                }
            }
        }
    }
}

/// The retry time is exact: the same hit one millisecond earlier is refused, at it admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_time_is_the_first_instant_that_admits() {
    let server = RedisServer::start();
    let backend = connect(&server.url(), TIMEOUT).await;
    let window_ms = 60_000;
    let base = 1_700_000_040_000; // a window boundary
    for algorithm in ALGORITHMS {
        for (fill_at, fill, cost, ask_at) in [
            (base + 1000, 10, Cost::Consume(1), base + 30_000),
            (base + 1000, 10, Cost::Consume(4), base + 50_000),
            (base + 59_000, 8, Cost::Consume(5), base + 70_000),
            (base + 5000, 10, Cost::CheckOnly, base + 6000),
        ] {
            let key = fresh_key("retry");
            let h = |cost| hit(&key, algorithm, 10, window_ms, cost);
            let filled = one_at(&backend, &h(Cost::Consume(fill)), fill_at).await;
            assert!(filled.verdict.admitted);
            let refused = one_at(&backend, &h(cost), ask_at).await;
            assert!(!refused.verdict.admitted, "{refused:?}");
            let retry = refused.verdict.reset_ms;
            assert!(retry > 0);
            let early = one_at(&backend, &h(cost), ask_at + retry - 1).await;
            assert!(
                !early.verdict.admitted,
                "{algorithm} {cost:?}: admitted before {retry} ms"
            );
            let on_time = one_at(&backend, &h(cost), ask_at + retry).await;
            assert!(
                on_time.verdict.admitted,
                "{algorithm} {cost:?}: refused at {retry} ms"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Several instances, TTLs, failures.

/// Two backends (two tollgate instances) on one Redis, many concurrent hits on one limiter: the
/// limit is never exceeded; the log admits exactly the limit, and so does the counter here, where
/// there is no previous window to weigh.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_never_admit_more_than_the_limit() {
    let server = RedisServer::start();
    let instances = [
        Arc::new(connect(&server.url(), Duration::from_secs(5)).await),
        Arc::new(connect(&server.url(), Duration::from_secs(5)).await),
    ];
    for algorithm in ALGORITHMS {
        let key = fresh_key("race");
        let limit = 150;
        let admitted = Arc::new(AtomicU64::new(0));
        let mut tasks = Vec::new();
        for task in 0..32 {
            let backend = Arc::clone(&instances[task % 2]);
            let admitted = Arc::clone(&admitted);
            let key = key.clone();
            tasks.push(tokio::spawn(async move {
                for round in 0..25 {
                    let cost = if (task + round) % 5 == 0 { 2 } else { 1 };
                    let h = hit(&key, algorithm, limit, LONG_WINDOW_MS, Cost::Consume(cost));
                    let outcome = one(backend.as_ref(), &h).await;
                    if outcome.verdict.admitted {
                        admitted.fetch_add(cost, Ordering::Relaxed);
                    }
                }
            }));
        }
        for task in tasks {
            task.await.expect("task");
        }
        // 800 attempts for 150 units: the limiter ends full
        assert_eq!(admitted.load(Ordering::Relaxed), limit, "{algorithm}");
        let check = one(
            instances[0].as_ref(),
            &hit(&key, algorithm, limit, LONG_WINDOW_MS, Cost::CheckOnly),
        )
        .await;
        assert_eq!(check.verdict.remaining, 0);
    }
}

/// Every key the scripts write carries a TTL no longer than its useful life plus a margin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_key_written_has_a_bounded_ttl() {
    let server = RedisServer::start();
    let backend = connect(&server.url(), TIMEOUT).await;
    let window_ms = 10_000;
    let mut receipts = Vec::new();
    for algorithm in ALGORITHMS {
        for n in 0..20 {
            let key = fresh_key("ttl");
            let cost = if n % 3 == 0 {
                Cost::CheckOnly
            } else {
                Cost::Consume(n)
            };
            let outcome = one(&backend, &hit(&key, algorithm, 10, window_ms, cost)).await;
            receipts.extend(outcome.receipt);
        }
    }
    backend
        .release(&receipts[..receipts.len() / 2])
        .await
        .expect("release");
    let keys = server.keys_with_ttls(&format!("{PREFIX}*"));
    assert_every_key_has_a_ttl(&keys);
    for (key, ttl) in keys {
        let bound = if key.ends_with(":c") {
            2 * window_ms
        } else {
            window_ms
        } + 5000;
        assert!(ttl as u64 <= bound, "{key}: TTL {ttl} ms above {bound}");
    }
}

/// Redis stops: calls fail within the deadline, for the affected hits only, and the backend
/// answers again once Redis is back, without being rebuilt. Then a server that hangs: timeouts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopped_redis_fails_fast_and_recovers() {
    let mut server = RedisServer::start();
    let timeout = Duration::from_millis(200);
    let backend = connect(&server.url(), timeout).await;
    let key = fresh_key("outage");
    let h = hit(
        &key,
        Algorithm::SlidingWindowLog,
        100,
        HOUR_MS,
        Cost::Consume(1),
    );
    assert!(one(&backend, &h).await.verdict.admitted);

    server.stop();
    for _ in 0..20 {
        let started = Instant::now();
        let bad = hit(&key, Algorithm::SlidingWindowLog, 100, 0, Cost::Consume(1));
        let results = backend.acquire(&[h.clone(), bad]).await;
        // generous: the point is "bounded by the deadline", not how fast
        assert!(
            started.elapsed() < timeout + Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
        assert!(
            matches!(
                results[0],
                Err(BackendError::Unavailable(_) | BackendError::Timeout(_))
            ),
            "{results:?}"
        );
        assert!(
            matches!(results[1], Err(BackendError::Protocol(_))),
            "{results:?}"
        );
    }
    assert!(backend.ping().await.is_err());

    server.restart();
    wait::until(
        "the backend to answer again",
        Duration::from_secs(15),
        || futures_block_on(backend.ping()).is_ok(),
    );
    // the restarted server is empty and has no scripts cached: the scripts are sent again
    let fresh = one(&backend, &h).await;
    assert_eq!(fresh.verdict.remaining, 99);

    // a server that accepts nothing (stopped by SIGSTOP) yields timeouts within the deadline
    let pid = server.pid().expect("running");
    signal(pid, "-STOP");
    let started = Instant::now();
    let result = backend.acquire(std::slice::from_ref(&h)).await.remove(0);
    let waited = started.elapsed();
    signal(pid, "-CONT");
    assert_eq!(result, Err(BackendError::Timeout(timeout)));
    assert!(waited < timeout + Duration::from_secs(2), "{waited:?}");
    wait::until(
        "the backend to answer again",
        Duration::from_secs(15),
        || futures_block_on(backend.ping()).is_ok(),
    );
    assert_eq!(one(&backend, &h).await.verdict.remaining, 98);
}

fn signal(pid: u32, which: &str) {
    let status = std::process::Command::new("kill")
        .args([which, &pid.to_string()])
        .status()
        .expect("run kill");
    assert!(status.success());
}

/// Runs a future to completion from a synchronous poll loop inside the multi-threaded runtime.
fn futures_block_on<F: std::future::Future>(future: F) -> F::Output {
    tokio::task::block_in_place(|| tokio::runtime::Handle::current().block_on(future))
}

/// SCRIPT FLUSH empties the script cache; the next calls reload the scripts and the counts
/// carry on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_flush_is_survived() {
    let server = RedisServer::start();
    let backend = connect(&server.url(), TIMEOUT).await;
    let cluster = RedisCluster::start();
    let cluster_backend = connect_cluster(&cluster.urls(), TIMEOUT).await;
    for algorithm in ALGORITHMS {
        let key = fresh_key("flush");
        let h = hit(&key, algorithm, 10, LONG_WINDOW_MS, Cost::Consume(1));
        let hits = [h.clone(), h.clone()];
        for (remaining, flush) in [(8, false), (6, true), (4, true)] {
            if flush {
                server.script_flush();
                cluster.script_flush();
            }
            for backend_result in [
                backend.acquire(&hits).await,
                cluster_backend.acquire(&hits).await,
            ] {
                let outcomes: Vec<Outcome> = backend_result
                    .into_iter()
                    .map(|result| result.expect("decided after SCRIPT FLUSH"))
                    .collect();
                assert_eq!(outcomes[1].verdict.remaining, remaining);
            }
            let receipts: Vec<_> = [one(&backend, &h).await, one(&cluster_backend, &h).await]
                .into_iter()
                .map(|o| o.receipt.expect("a receipt"))
                .collect();
            if flush {
                server.script_flush();
                cluster.script_flush();
            }
            backend
                .release(&receipts[..1])
                .await
                .expect("release after flush");
            cluster_backend
                .release(&receipts[1..])
                .await
                .expect("release after flush");
        }
    }
}

/// A cluster master dies; once its replica has taken over, the backend (the same instance, not
/// rebuilt) answers again with the counts the replica had, and limiters on other masters are
/// unaffected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_failover_is_followed() {
    let mut cluster = RedisCluster::start();
    let backend = connect_cluster(&cluster.urls(), Duration::from_millis(300)).await;
    let spaces = KeySpace::new(PREFIX);
    let mut victims = Vec::new();
    for algorithm in ALGORITHMS {
        let key = fresh_key("failover");
        let h = hit(&key, algorithm, 10, LONG_WINDOW_MS, Cost::Consume(1));
        for _ in 0..3 {
            assert!(one(&backend, &h).await.verdict.admitted);
        }
        victims.push(h);
    }
    // the replica must hold the writes before its master dies
    cluster.wait_replicas_synced(Duration::from_secs(10));
    let victim_key = KeySpace::counter(&spaces.base(&victims[0].key));
    let killed = cluster.fail_over_master_of(&victim_key);
    assert!(!cluster.nodes[killed].is_running());

    for h in &victims {
        let answered = {
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                match backend.acquire(std::slice::from_ref(h)).await.remove(0) {
                    Ok(outcome) => break outcome,
                    Err(err) => {
                        assert!(Instant::now() < deadline, "no answer after failover: {err}");
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                }
            }
        };
        assert!(answered.verdict.admitted, "{answered:?}");
        assert_eq!(
            answered.verdict.remaining, 6,
            "the replica kept the counts: {answered:?}"
        );
        // and it keeps counting on the new master up to the limit, never past it
        let mut admitted = 1;
        for _ in 0..10 {
            let outcome = one(&backend, h).await;
            if outcome.verdict.admitted {
                admitted += 1;
            }
        }
        assert_eq!(admitted, 7);
    }
    // limiters anywhere in the cluster work
    for n in 0..30 {
        let h = hit(
            &fresh_key(&format!("after-{n}")),
            Algorithm::SlidingWindowCounter,
            2,
            HOUR_MS,
            Cost::Consume(2),
        );
        assert_admitted(&one(&backend, &h).await, true, 0);
    }
    backend.ping().await.expect("all running masters answer");
}

/// A server with a password: the URL's credentials are used.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn password_from_the_url() {
    let server = RedisServer::start_with(&["--requirepass", "s3cret"]);
    let url = format!("redis://:s3cret@127.0.0.1:{}", server.port());
    let backend = connect(&url, TIMEOUT).await;
    let h = hit(
        &fresh_key("auth"),
        Algorithm::SlidingWindowCounter,
        2,
        HOUR_MS,
        Cost::Consume(1),
    );
    assert_eq!(one(&backend, &h).await.verdict.remaining, 1);
    let user_url = format!("redis://default:s3cret@127.0.0.1:{}", server.port());
    let with_user = connect(&user_url, TIMEOUT).await;
    assert_eq!(one(&with_user, &h).await.verdict.remaining, 0);

    let wrong = format!("redis://:wrong@127.0.0.1:{}", server.port());
    let refused = RedisBackend::connect(&wrong, PREFIX, TIMEOUT)
        .await
        .expect("a backend");
    assert!(refused.acquire(std::slice::from_ref(&h)).await[0].is_err());
    assert!(
        RedisBackend::connect("not a url", PREFIX, TIMEOUT)
            .await
            .is_err()
    );
}

/// `rediss://`: the same backend over TLS (the test server's certificate is self-signed, so the
/// URL asks to skip verification).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_from_a_rediss_url() {
    let server = RedisServer::start_tls();
    let port = server.tls_port().expect("a TLS port");
    let url = format!("rediss://127.0.0.1:{port}/#insecure");
    let backend = connect(&url, TIMEOUT).await;
    let h = hit(
        &fresh_key("tls"),
        Algorithm::SlidingWindowLog,
        2,
        HOUR_MS,
        Cost::Consume(1),
    );
    assert_eq!(one(&backend, &h).await.verdict.remaining, 1);
    backend.ping().await.expect("ping over TLS");
    // the plain port sees the same data
    assert_eq!(server.keys_with_ttls(&format!("{PREFIX}*")).len(), 2);
}

/// Watches the commands clients send to some Redis servers (with `redis-cli monitor`), leaving
/// out the ones scripts run inside Redis: `INFO commandstats` counts both alike.
struct ClientCommands {
    monitors: Vec<std::process::Child>,
    readers: Vec<std::thread::JoinHandle<Vec<String>>>,
}

impl ClientCommands {
    fn watch<'a>(servers: impl Iterator<Item = &'a RedisServer>) -> Self {
        use std::io::BufRead;
        let mut monitors = Vec::new();
        let mut readers = Vec::new();
        for server in servers {
            let mut child = std::process::Command::new("redis-cli")
                .args([
                    "-h",
                    "127.0.0.1",
                    "-p",
                    &server.port().to_string(),
                    "monitor",
                ])
                .stdout(std::process::Stdio::piped())
                .spawn()
                .expect("redis-cli monitor starts");
            let mut lines = std::io::BufReader::new(child.stdout.take().expect("stdout")).lines();
            // MONITOR answers OK once it is watching.
            assert_eq!(lines.next().and_then(Result::ok).as_deref(), Some("OK"));
            readers.push(std::thread::spawn(move || {
                lines.map_while(Result::ok).collect()
            }));
            monitors.push(child);
        }
        ClientCommands { monitors, readers }
    }

    /// Stops watching and counts each client command by name.
    fn stop(mut self) -> BTreeMap<String, u64> {
        // Give the last replies' MONITOR lines time to arrive.
        std::thread::sleep(Duration::from_millis(300));
        for monitor in &mut self.monitors {
            let _ = monitor.kill();
            let _ = monitor.wait();
        }
        let mut counts = BTreeMap::new();
        for reader in self.readers {
            for line in reader.join().expect("monitor reader") {
                // `<time> [<db> <source>] "<command>" ...`; scripts' commands have source `lua`.
                let Some((source, rest)) = line.split_once("] ") else {
                    continue;
                };
                if source.ends_with(" lua") {
                    continue;
                }
                let name = rest.split('"').nth(1).unwrap_or("").to_ascii_lowercase();
                *counts.entry(name).or_insert(0) += 1;
            }
        }
        counts
    }
}

/// Admitted decisions of three limiters each, both algorithms mixed.
fn three_limiters(round: usize) -> [Hit; 3] {
    [
        hit(
            &fresh_key(&format!("calls-c-{round}")),
            Algorithm::SlidingWindowCounter,
            1000,
            HOUR_MS,
            Cost::Consume(1),
        ),
        hit(
            &fresh_key(&format!("calls-l-{round}")),
            Algorithm::SlidingWindowLog,
            1000,
            HOUR_MS,
            Cost::Consume(2),
        ),
        hit(
            &fresh_key("calls-shared"),
            Algorithm::SlidingWindowCounter,
            1000,
            HOUR_MS,
            Cost::CheckOnly,
        ),
    ]
}

/// One decision costs one script execution per limiter and nothing else: no GET, no EXPIRE, no
/// SCRIPT LOAD per request, on one server and on the cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_script_call_per_limiter_and_no_other_command() {
    const ROUNDS: usize = 20;
    let expected = BTreeMap::from([("evalsha".to_string(), (ROUNDS * 3) as u64)]);

    let server = RedisServer::start();
    let backend = connect(&server.url(), TIMEOUT).await;
    // The first call loads the scripts; only what follows is counted.
    backend.acquire(&three_limiters(usize::MAX)).await;
    let watch = ClientCommands::watch(std::iter::once(&server));
    for round in 0..ROUNDS {
        for result in backend.acquire(&three_limiters(round)).await {
            assert!(result.expect("decided").verdict.admitted);
        }
    }
    assert_eq!(watch.stop(), expected, "one server");

    let cluster = RedisCluster::start();
    let backend = connect_cluster(&cluster.urls(), TIMEOUT).await;
    backend.acquire(&three_limiters(usize::MAX)).await;
    let watch = ClientCommands::watch(cluster.masters());
    for round in 0..ROUNDS {
        for result in backend.acquire(&three_limiters(round)).await {
            assert!(result.expect("decided").verdict.admitted);
        }
    }
    assert_eq!(watch.stop(), expected, "cluster masters");
}
