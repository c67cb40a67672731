//! Leased limits (`lease: true`), on the Redis stores: instances answer from slices reserved in
//! the store, and still no window of the limit's length admits more than the limit across
//! instances; an instance that dies holding a slice strands only that slice, and only until it
//! leaves the window; a lowered limit holds once the old slices are settled.
//!
//! Several backends made by one target are several tollgate instances sharing the store. The
//! invariant is checked from outside: each admission happened somewhere between the start and
//! the end of its call, so a window is only said to hold the admissions whose whole call fell
//! inside it. That never reports a false excess, whatever the load on the machine.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tollgate::backend::lease::lease_ms;
use tollgate::backend::{Backend, Hit};
use tollgate::window::{Algorithm, Cost};
use tollgate_testkit::backends::TestBackend;
use tollgate_testkit::cases;
use tollgate_testkit::hits::{ALGORITHMS, fresh_key, hit, one};
use tollgate_testkit::target::Target;

cases! {
    slices_answer_without_a_store_call:
        [leased_redis, leased_redis_cluster, leased_sharded_redis, leased_sharded_redis_cluster];
    three_instances_never_admit_more_than_the_limit:
        [leased_redis, leased_redis_cluster, leased_sharded_redis, leased_sharded_redis_cluster];
    an_instance_killed_holding_a_slice_strands_only_that_slice:
        [leased_redis, leased_redis_cluster, leased_sharded_redis, leased_sharded_redis_cluster];
    a_lowered_limit_holds_once_the_old_slices_are_settled: [leased_redis, leased_redis_cluster];
    a_released_hit_goes_back_to_its_slice: [leased_redis, leased_redis_cluster];
    a_burst_at_three_times_the_limit_uses_it_with_few_store_calls:
        [leased_redis, leased_redis_cluster];
}

/// Wall-clock milliseconds, the frame Redis's `TIME` decides in on this machine.
fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_millis() as u64
}

/// A store-side reading of what the limit has left: a check consumes nothing, so it is never
/// leased and goes to the store, which counts every slice reserved in full.
async fn store_left(backend: &TestBackend, h: &Hit) -> u64 {
    let probe = Hit {
        cost: Cost::CheckOnly,
        ..h.clone()
    };
    one(backend, &probe).await.verdict.remaining
}

/// Hits `h` until the first refusal; answers how many were admitted.
async fn fill(backend: &TestBackend, h: &Hit) -> u64 {
    let mut admitted = 0;
    while one(backend, h).await.verdict.admitted {
        admitted += 1;
        assert!(admitted <= h.limit, "admitted beyond the limit: {h:?}");
    }
    admitted
}

/// A run of hits from one instance is answered mostly in the instance: the store sees a few
/// reservations, not one call per hit.
async fn slices_answer_without_a_store_call(t: &Target) {
    for algorithm in ALGORITHMS {
        let (backend, store) = t.counted_backend().await;
        // A 10 s window leases for a second: the hits below take far less.
        let h = hit(
            &fresh_key("slices"),
            algorithm,
            1000,
            10_000,
            Cost::Consume(1),
        );
        for n in 0..100 {
            assert!(
                one(&backend, &h).await.verdict.admitted,
                "{algorithm} hit {n}"
            );
        }
        let calls = store.hits();
        assert!(
            calls <= 10,
            "{}: {algorithm}: {calls} store calls for 100 leased hits",
            t.name()
        );
    }
}

/// One admission, seen from outside: its call started and ended at these wall-clock instants.
#[derive(Debug, Clone, Copy)]
struct Admission {
    start_ms: u64,
    end_ms: u64,
}

/// Three instances, three callers each, hammer one limit for two windows. Log: no window of
/// the limit's length holds more than the limit of the admissions known to fall inside it.
/// Counter: no fixed window holds more than the limit (its charges there never exceed it, and a
/// slice never outlives the fixed window it was charged to).
async fn three_instances_never_admit_more_than_the_limit(t: &Target) {
    const LIMIT: u64 = 40;
    const WINDOW_MS: u64 = 1000;
    for algorithm in ALGORITHMS {
        let h = hit(
            &fresh_key("invariant"),
            algorithm,
            LIMIT,
            WINDOW_MS,
            Cost::Consume(1),
        );
        let mut instances = Vec::new();
        for _ in 0..3 {
            instances.push(std::sync::Arc::new(t.backend().await));
        }
        let until = Instant::now() + Duration::from_millis(2 * WINDOW_MS);
        let mut callers = Vec::new();
        for instance in &instances {
            for _ in 0..3 {
                let instance = std::sync::Arc::clone(instance);
                let h = h.clone();
                callers.push(tokio::spawn(async move {
                    let mut admitted = Vec::new();
                    while Instant::now() < until {
                        let start_ms = wall_ms();
                        let outcome = one(&*instance, &h).await;
                        let end_ms = wall_ms();
                        if outcome.verdict.admitted {
                            admitted.push(Admission { start_ms, end_ms });
                        }
                    }
                    admitted
                }));
            }
        }
        let mut all = Vec::new();
        for caller in callers {
            all.extend(caller.await.expect("a caller panicked"));
        }
        assert!(
            all.len() as u64 >= LIMIT,
            "{}: {algorithm}: only {} admitted in two windows",
            t.name(),
            all.len()
        );
        let worst = match algorithm {
            Algorithm::SlidingWindowLog => most_in_a_sliding_window(&all, WINDOW_MS),
            Algorithm::SlidingWindowCounter => most_in_a_fixed_window(&all, WINDOW_MS),
        };
        assert!(
            worst <= LIMIT,
            "{}: {algorithm}: {worst} admissions certainly inside one window of {WINDOW_MS} ms \
             (limit {LIMIT})",
            t.name()
        );
    }
}

/// A burst at three times a leased limit, from three callers on each of three instances, for a
/// long and a short window: no window admits more than the limit, at least 95% of it is used,
/// and the store sees at most 0.05 script calls (reservations, settlements, refusals asked) per
/// decision, refused ones included: slices grow with the demand each instance sees, and at the
/// limit refusals are answered from each instance's cache.
async fn a_burst_at_three_times_the_limit_uses_it_with_few_store_calls(t: &Target) {
    const LIMIT: u64 = 3000;
    const CALLERS_PER_INSTANCE: u64 = 3;
    for window_ms in [3_600_000, 10_000] {
        for algorithm in ALGORITHMS {
            let h = hit(
                &fresh_key("burst"),
                algorithm,
                LIMIT,
                window_ms,
                Cost::Consume(1),
            );
            let mut instances = Vec::new();
            let mut stores = Vec::new();
            for _ in 0..3 {
                let (instance, store) = t.counted_instance().await;
                instances.push(std::sync::Arc::new(instance));
                stores.push(store);
            }
            let each = 3 * LIMIT / (3 * CALLERS_PER_INSTANCE);
            let mut callers = Vec::new();
            for instance in &instances {
                for _ in 0..CALLERS_PER_INSTANCE {
                    let instance = std::sync::Arc::clone(instance);
                    let h = h.clone();
                    callers.push(tokio::spawn(async move {
                        let mut admitted = Vec::new();
                        for _ in 0..each {
                            let start_ms = wall_ms();
                            let outcome = one(&*instance, &h).await;
                            if outcome.verdict.admitted {
                                admitted.push(Admission {
                                    start_ms,
                                    end_ms: wall_ms(),
                                });
                            }
                        }
                        admitted
                    }));
                }
            }
            let mut all = Vec::new();
            for caller in callers {
                all.extend(caller.await.expect("a caller panicked"));
            }
            let decisions = each * 3 * CALLERS_PER_INSTANCE;
            let calls: u64 = stores.iter().map(|s| s.hits() + s.refunds()).sum();
            let name = format!("{}: {algorithm}, window {window_ms} ms", t.name());
            let worst = match algorithm {
                Algorithm::SlidingWindowLog => most_in_a_sliding_window(&all, window_ms),
                Algorithm::SlidingWindowCounter => most_in_a_fixed_window(&all, window_ms),
            };
            assert!(worst <= LIMIT, "{name}: {worst} admitted in one window");
            assert!(
                (all.len() as u64) * 100 >= LIMIT * 95,
                "{name}: only {} of {LIMIT} used",
                all.len()
            );
            assert!(
                calls * 100 <= decisions * 5,
                "{name}: {calls} store calls for {decisions} decisions"
            );
        }
    }
}

/// The most admissions whose calls lie wholly inside one window `(a, a + window]` (a window
/// starting just before some call did).
fn most_in_a_sliding_window(all: &[Admission], window_ms: u64) -> u64 {
    all.iter()
        .map(|first| {
            // Windows are half-open at whole milliseconds: (start - 1, start - 1 + window].
            let last = first.start_ms.saturating_sub(1) + window_ms;
            all.iter()
                .filter(|a| a.start_ms >= first.start_ms && a.end_ms <= last)
                .count() as u64
        })
        .max()
        .unwrap_or(0)
}

/// The most admissions whose calls lie wholly inside one epoch-aligned fixed window.
fn most_in_a_fixed_window(all: &[Admission], window_ms: u64) -> u64 {
    let mut counts = std::collections::HashMap::new();
    for a in all {
        if a.start_ms / window_ms == a.end_ms / window_ms {
            *counts.entry(a.start_ms / window_ms).or_insert(0u64) += 1;
        }
    }
    counts.into_values().max().unwrap_or(0)
}

/// An instance that takes a slice and dies (dropped: it never settles) leaves the slice charged;
/// another instance can use everything else, and the stranded units come back once they leave
/// the window.
async fn an_instance_killed_holding_a_slice_strands_only_that_slice(t: &Target) {
    const LIMIT: u64 = 100;
    const WINDOW_MS: u64 = 2000;
    // The largest slice: the limit's rate over the lease.
    let largest = LIMIT * lease_ms(WINDOW_MS) / WINDOW_MS;
    let h = hit(
        &fresh_key("killed"),
        Algorithm::SlidingWindowLog,
        LIMIT,
        WINDOW_MS,
        Cost::Consume(1),
    );
    let dying = t.backend().await;
    assert!(one(&dying, &h).await.verdict.admitted);
    drop(dying);

    let survivor = t.backend().await;
    let admitted = fill(&survivor, &h).await;
    assert!(
        admitted < LIMIT - 1,
        "{}: the dead instance held no slice: {admitted} admitted after it",
        t.name()
    );
    assert!(
        admitted + largest >= LIMIT,
        "{}: more than one slice stranded: {admitted} admitted of {LIMIT}",
        t.name()
    );
    // The stranded units are not lost for good: once everything has left the window, the store
    // has the whole limit again.
    let deadline = Instant::now() + Duration::from_secs(30);
    while store_left(&survivor, &h).await < LIMIT {
        assert!(
            Instant::now() < deadline,
            "{}: the stranded slice never left the window",
            t.name()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A limit lowered while slices are out (a reload): the old slice is settled at the next hit,
/// and from then on the instances together admit no more than the new limit allows.
async fn a_lowered_limit_holds_once_the_old_slices_are_settled(t: &Target) {
    for algorithm in ALGORITHMS {
        let key = fresh_key("lowered");
        // An hour-long window, so the counter's fixed window does not turn during the test, and
        // a limit whose rate over the second-long lease is 100: the first instance holds a slice
        // of 100 when the limit drops to 20.
        let old = hit(&key, algorithm, 360_000, 3_600_000, Cost::Consume(1));
        let new = Hit {
            limit: 20,
            ..old.clone()
        };
        let first = t.backend().await;
        let second = t.backend().await;
        for _ in 0..5 {
            assert!(one(&first, &old).await.verdict.admitted);
        }
        // After the reload: both instances, the first still holding a slice of the old limit.
        let mut admitted = 0;
        loop {
            let a = one(&first, &new).await.verdict.admitted;
            let b = one(&second, &new).await.verdict.admitted;
            if !a && !b {
                break;
            }
            admitted += u64::from(a) + u64::from(b);
            assert!(admitted <= 20, "{}: {algorithm}: {admitted}", t.name());
        }
        assert_eq!(
            admitted + 5,
            20,
            "{}: {algorithm}: the new limit less what was spent before",
            t.name()
        );
    }
}

/// A hit answered from a slice and released (another limit of its request refused) is spent no
/// more: the slice has the unit again, and the next hit leaves what the released one left.
async fn a_released_hit_goes_back_to_its_slice(t: &Target) {
    for algorithm in ALGORITHMS {
        // An hour-long window (no fixed window turns during the test) and a limit whose rate
        // over the lease is a slice of 100.
        let h = hit(
            &fresh_key("released"),
            algorithm,
            360_000,
            3_600_000,
            Cost::Consume(1),
        );
        let backend = t.backend().await;
        let first = one(&backend, &h).await;
        let second = one(&backend, &h).await;
        assert_eq!(
            second.verdict.remaining + 1,
            first.verdict.remaining,
            "{}: {algorithm}: one more unit spent from the slice",
            t.name()
        );
        let receipt = second.receipt.expect("an admitted hit has a receipt");
        backend.release(&[receipt]).await.expect("release");
        let third = one(&backend, &h).await;
        assert_eq!(
            third.verdict.remaining,
            second.verdict.remaining,
            "{}: {algorithm}: the released unit was spent again",
            t.name()
        );
    }
}
