//! Tests of the memory backend: decisions against the window math, releases, idle keys expiring
//! within the byte budget, sweeping, and concurrent use; `one` is shared with the decorators'
//! tests, which wrap a memory backend. Kept beside `memory.rs`, not in it, so the backend reads
//! without scrolling past its tests.

use std::sync::atomic::{AtomicUsize, Ordering};

use super::*;
use crate::clock::ManualClock;

const W: u64 = 1000;

fn backend_at(now_ms: u64) -> (MemoryBackend, ManualClock) {
    let clock = ManualClock::new(now_ms);
    (MemoryBackend::with_clock(Arc::new(clock.clone())), clock)
}

fn hit(key: &str, algorithm: Algorithm, limit: u64, cost: Cost) -> Hit {
    Hit {
        key: key.to_owned(),
        algorithm,
        limit,
        window_ms: W,
        cost,
        counting: Counting::Admitted,
        shards: 1,
        lease_ms: 0,
        tentative: false,
        group: 0,
        descriptor_tag: false,
        slice: false,
    }
}

/// Decides one hit on any backend (the shard tests use it too).
pub(crate) async fn one<B: Backend>(backend: &B, hit: &Hit) -> Outcome {
    let mut results = backend.acquire(std::slice::from_ref(hit)).await;
    assert_eq!(results.len(), 1);
    results.remove(0).unwrap()
}

const BOTH: [Algorithm; 2] = [Algorithm::SlidingWindowCounter, Algorithm::SlidingWindowLog];

#[tokio::test]
async fn admits_the_limit_then_rejects_for_both_algorithms() {
    for algorithm in BOTH {
        let (backend, _clock) = backend_at(20 * W + 400);
        let h = hit("k", algorithm, 3, Cost::Consume(1));
        for expected in [2, 1, 0] {
            let outcome = one(&backend, &h).await;
            assert!(outcome.verdict.admitted, "{algorithm}");
            assert_eq!(outcome.verdict.remaining, expected);
            assert!(outcome.receipt.is_some());
        }
        let outcome = one(&backend, &h).await;
        assert!(!outcome.verdict.admitted, "{algorithm}");
        assert_eq!(outcome.verdict.remaining, 0);
        assert_eq!(
            outcome.receipt, None,
            "a rejected hit takes nothing to give back"
        );
        assert!(outcome.verdict.reset_ms >= 1);
    }
}

#[tokio::test]
async fn counter_follows_the_window_math_through_time() {
    let (backend, clock) = backend_at(8 * W - 1);
    let h = hit("c", Algorithm::SlidingWindowCounter, 100, Cost::Consume(1));
    let mut admitted = 0;
    for _ in 0..100 {
        admitted += usize::from(one(&backend, &h).await.verdict.admitted);
    }
    assert_eq!(admitted, 100);
    clock.set(8 * W + 1);
    let outcome = one(&backend, &h).await;
    assert!(!outcome.verdict.admitted, "no second burst at the edge");
    // prev = 100 weighs 99.9 at elapsed 1: a unit fits once its weight is at most 99.
    assert_eq!(outcome.verdict.reset_ms, 9);
    clock.set(8 * W + 10);
    assert!(one(&backend, &h).await.verdict.admitted);
    clock.set(8 * W + 500);
    let check = hit("c", Algorithm::SlidingWindowCounter, 100, Cost::CheckOnly);
    let outcome = one(&backend, &check).await;
    // 100 * 0.5 + 1 used.
    assert_eq!(outcome.verdict.remaining, 49);
    assert_eq!(outcome.verdict.reset_ms, 2 * W - 500);
    clock.set(10 * W);
    let outcome = one(&backend, &check).await;
    assert_eq!(
        (outcome.verdict.remaining, outcome.verdict.reset_ms),
        (100, 0)
    );
}

#[tokio::test]
async fn log_follows_the_window_math_through_time() {
    let (backend, clock) = backend_at(5000);
    let h = |cost| hit("l", Algorithm::SlidingWindowLog, 10, cost);
    assert!(one(&backend, &h(Cost::Consume(6))).await.verdict.admitted);
    clock.set(5400);
    assert!(one(&backend, &h(Cost::Consume(4))).await.verdict.admitted);
    clock.set(5500);
    let outcome = one(&backend, &h(Cost::Consume(5))).await;
    assert!(!outcome.verdict.admitted);
    assert_eq!(outcome.verdict.reset_ms, 5000 + W - 5500);
    clock.set(5999);
    assert!(!one(&backend, &h(Cost::Consume(5))).await.verdict.admitted);
    clock.set(6000);
    let outcome = one(&backend, &h(Cost::Consume(5))).await;
    assert!(outcome.verdict.admitted);
    assert_eq!(outcome.verdict.remaining, 1);
    assert_eq!(outcome.verdict.reset_ms, W);
    let outcome = one(&backend, &h(Cost::CheckOnly)).await;
    assert_eq!(
        (outcome.verdict.admitted, outcome.verdict.remaining),
        (true, 1)
    );
    assert_eq!(outcome.verdict.reset_ms, W);
}

#[tokio::test]
async fn check_only_and_consume_zero_consume_nothing() {
    for algorithm in BOTH {
        let (backend, _clock) = backend_at(3 * W);
        for cost in [Cost::CheckOnly, Cost::Consume(0)] {
            for _ in 0..5 {
                let outcome = one(&backend, &hit("k", algorithm, 2, cost)).await;
                assert!(outcome.verdict.admitted);
                assert_eq!(outcome.verdict.remaining, 2);
                assert_eq!(outcome.receipt, None);
            }
        }
        assert_eq!(backend.key_count(), 0, "checks store nothing");
        one(&backend, &hit("k", algorithm, 2, Cost::Consume(2))).await;
        // Full is not above the limit: a check still passes.
        for cost in [Cost::CheckOnly, Cost::Consume(0)] {
            let outcome = one(&backend, &hit("k", algorithm, 2, cost)).await;
            assert_eq!(
                (outcome.verdict.admitted, outcome.verdict.remaining),
                (true, 0)
            );
        }
        // Above it (the limit lowered by a reload), a check is refused.
        for cost in [Cost::CheckOnly, Cost::Consume(0)] {
            let outcome = one(&backend, &hit("k", algorithm, 1, cost)).await;
            assert_eq!(
                (outcome.verdict.admitted, outcome.verdict.remaining),
                (false, 0)
            );
        }
    }
}

#[tokio::test]
async fn refused_hits_are_recorded_only_where_every_hit_counts() {
    for algorithm in BOTH {
        let (backend, _clock) = backend_at(3 * W + 100);
        let h = |key: &str, cost: Cost, counting: Counting| Hit {
            counting,
            ..hit(key, algorithm, 10, cost)
        };
        for counting in [Counting::Admitted, Counting::All] {
            let key = format!("{counting}");
            assert!(
                one(&backend, &h(&key, Cost::Consume(9), counting))
                    .await
                    .verdict
                    .admitted
            );
            let refused = one(&backend, &h(&key, Cost::Consume(5), counting)).await;
            assert!(!refused.verdict.admitted, "{algorithm} {counting}");
            assert_eq!(refused.receipt, None, "nothing gives a refused charge back");
            let check = one(&backend, &h(&key, Cost::CheckOnly, counting)).await;
            match counting {
                Counting::Admitted => {
                    assert_eq!(refused.verdict.remaining, 1, "what a smaller hit may use");
                    assert_eq!((check.verdict.admitted, check.verdict.remaining), (true, 1));
                }
                Counting::All => {
                    assert_eq!(refused.verdict.remaining, 0, "14 of 10 used");
                    assert_eq!(
                        (check.verdict.admitted, check.verdict.remaining),
                        (false, 0)
                    );
                }
            }
        }
    }
}

#[tokio::test]
async fn oversized_costs_and_zero_limits_are_rejected_with_the_full_window() {
    for algorithm in BOTH {
        let (backend, _clock) = backend_at(3 * W + 1);
        for (limit, cost) in [
            (5, Cost::Consume(6)),
            (5, Cost::Consume(u64::MAX)),
            (0, Cost::Consume(1)),
        ] {
            let outcome = one(&backend, &hit("k", algorithm, limit, cost)).await;
            assert!(!outcome.verdict.admitted);
            assert_eq!(outcome.verdict.reset_ms, W);
            assert_eq!(outcome.verdict.remaining, limit);
        }
        // Nothing is above a limit of 0 until something is charged to it.
        let outcome = one(&backend, &hit("k", algorithm, 0, Cost::CheckOnly)).await;
        assert_eq!(
            (outcome.verdict.admitted, outcome.verdict.remaining),
            (true, 0)
        );
        assert_eq!(backend.key_count(), 0);
    }
}

#[tokio::test]
async fn hits_in_one_call_are_decided_in_order() {
    let (backend, _clock) = backend_at(W);
    let hits = [
        hit("a", Algorithm::SlidingWindowCounter, 1, Cost::Consume(1)),
        hit("a", Algorithm::SlidingWindowCounter, 1, Cost::Consume(1)),
        hit("b", Algorithm::SlidingWindowLog, 1, Cost::Consume(1)),
    ];
    let admitted: Vec<bool> = backend
        .acquire(&hits)
        .await
        .into_iter()
        .map(|r| r.unwrap().verdict.admitted)
        .collect();
    assert_eq!(admitted, [true, false, true]);
    backend.ping().await.unwrap();
}

#[tokio::test]
async fn release_restores_exactly_the_charge() {
    for algorithm in BOTH {
        let (backend, _clock) = backend_at(4 * W + 100);
        let big = one(&backend, &hit("k", algorithm, 10, Cost::Consume(7))).await;
        let small = one(&backend, &hit("k", algorithm, 10, Cost::Consume(2))).await;
        let receipt = big.receipt.unwrap();
        assert_eq!(receipt.cost, 7);
        assert_eq!(receipt.algorithm, algorithm);
        if algorithm == Algorithm::SlidingWindowCounter {
            assert_eq!(receipt.token, 4, "the fixed window charged");
        } else {
            assert_ne!(Some(receipt.token), small.receipt.as_ref().map(|r| r.token));
        }
        backend
            .release(std::slice::from_ref(&receipt))
            .await
            .unwrap();
        let check = one(&backend, &hit("k", algorithm, 10, Cost::CheckOnly)).await;
        assert_eq!(
            check.verdict.remaining, 8,
            "{algorithm}: only the 7 came back"
        );
        // Releasing twice gives nothing more back for the log (the entry is gone); for the
        // counter a duplicate release would subtract again, so the limiter releases once.
        if algorithm == Algorithm::SlidingWindowLog {
            backend
                .release(std::slice::from_ref(&receipt))
                .await
                .unwrap();
            let check = one(&backend, &hit("k", algorithm, 10, Cost::CheckOnly)).await;
            assert_eq!(check.verdict.remaining, 8);
        }
        backend.release(&[small.receipt.unwrap()]).await.unwrap();
        assert_eq!(
            backend.key_count(),
            0,
            "an emptied window is dropped at once"
        );
    }
}

#[tokio::test]
async fn counter_release_reaches_the_previous_window_and_no_further() {
    let (backend, clock) = backend_at(4 * W + 900);
    let h = hit("k", Algorithm::SlidingWindowCounter, 10, Cost::Consume(4));
    let first = one(&backend, &h).await.receipt.unwrap();
    // The next window writes, so the first charge now sits in `prev`.
    clock.set(5 * W);
    let second = one(&backend, &h).await.receipt.unwrap();
    backend.release(&[first]).await.unwrap();
    let check = hit("k", Algorithm::SlidingWindowCounter, 10, Cost::CheckOnly);
    assert_eq!(one(&backend, &check).await.verdict.remaining, 6);
    // Two windows on, the second charge no longer counts; refunding it changes nothing.
    clock.set(7 * W);
    one(&backend, &h).await;
    backend.release(&[second]).await.unwrap();
    assert_eq!(one(&backend, &check).await.verdict.remaining, 6);
}

#[tokio::test]
async fn releasing_unknown_or_mismatched_receipts_is_harmless() {
    let (backend, _clock) = backend_at(W);
    one(
        &backend,
        &hit("k", Algorithm::SlidingWindowLog, 5, Cost::Consume(2)),
    )
    .await;
    let foreign = [
        Receipt {
            key: "missing".into(),
            algorithm: Algorithm::SlidingWindowLog,
            window_ms: W,
            token: 0,
            cost: 2,
            released_remaining: 0,
            refundable_until_ms: 0,
            keep_refundable: false,
            keep: 0,
            leased: false,
        },
        Receipt {
            key: "k".into(),
            algorithm: Algorithm::SlidingWindowCounter,
            window_ms: W,
            token: 1,
            cost: 2,
            released_remaining: 0,
            refundable_until_ms: 0,
            keep_refundable: false,
            keep: 0,
            leased: false,
        },
        Receipt {
            key: "k".into(),
            algorithm: Algorithm::SlidingWindowLog,
            window_ms: 2 * W,
            token: 0,
            cost: 2,
            released_remaining: 0,
            refundable_until_ms: 0,
            keep_refundable: false,
            keep: 0,
            leased: false,
        },
        Receipt {
            key: "k".into(),
            algorithm: Algorithm::SlidingWindowLog,
            window_ms: W,
            token: 12345,
            cost: 2,
            released_remaining: 0,
            refundable_until_ms: 0,
            keep_refundable: false,
            keep: 0,
            leased: false,
        },
    ];
    backend.release(&foreign).await.unwrap();
    let check = one(
        &backend,
        &hit("k", Algorithm::SlidingWindowLog, 5, Cost::CheckOnly),
    )
    .await;
    assert_eq!(check.verdict.remaining, 3);
}

#[tokio::test]
async fn the_shards_field_is_left_to_the_sharded_adaptor() {
    let (backend, _clock) = backend_at(W);
    let mut h = hit("k", Algorithm::SlidingWindowLog, 4, Cost::Consume(1));
    h.shards = 8;
    let mut admitted = 0;
    for _ in 0..10 {
        admitted += usize::from(one(&backend, &h).await.verdict.admitted);
    }
    assert_eq!(admitted, 4);
}

#[tokio::test]
async fn a_key_reused_with_another_window_starts_afresh() {
    let (backend, _clock) = backend_at(10 * W);
    let mut h = hit("k", Algorithm::SlidingWindowCounter, 1, Cost::Consume(1));
    assert!(one(&backend, &h).await.verdict.admitted);
    h.window_ms = 2 * W;
    assert!(one(&backend, &h).await.verdict.admitted);
    h.algorithm = Algorithm::SlidingWindowLog;
    assert!(one(&backend, &h).await.verdict.admitted);
    assert!(!one(&backend, &h).await.verdict.admitted);
    // Each (key, algorithm, window) is a window of its own; the ones left behind expire.
    assert_eq!(backend.key_count(), 3);
}

#[tokio::test]
async fn a_clock_stepping_back_never_lets_more_through() {
    let (backend, clock) = backend_at(50 * W);
    let h = hit("k", Algorithm::SlidingWindowLog, 3, Cost::Consume(1));
    for _ in 0..3 {
        assert!(one(&backend, &h).await.verdict.admitted);
    }
    clock.set(10 * W);
    assert!(!one(&backend, &h).await.verdict.admitted);
    clock.set(50 * W + W);
    assert!(one(&backend, &h).await.verdict.admitted);
}

#[tokio::test]
async fn idle_keys_expire_and_memory_stays_bounded() {
    let (backend, clock) = backend_at(1_000 * W);
    let per_window = 4_000;
    let windows = 50;
    for n in 0..per_window * windows {
        let algorithm = if n % 2 == 0 {
            Algorithm::SlidingWindowCounter
        } else {
            Algorithm::SlidingWindowLog
        };
        let outcome = one(
            &backend,
            &hit(&format!("user-{n}"), algorithm, 5, Cost::Consume(1)),
        )
        .await;
        assert!(outcome.verdict.admitted);
        if n % 4 == 3 {
            clock.advance(1);
        }
    }
    // 200 000 distinct keys went through. Live are the counters of the last two windows and
    // the logs of the last one (1.5 windows' worth of keys); a shard may hold up to twice its
    // live windows plus a minimum between sweeps.
    let held = backend.key_count();
    assert!(held <= 4 * per_window, "{held} keys held");
    assert!(
        held >= per_window,
        "live keys must not be dropped early: {held}"
    );

    // A log key is gone one window after its newest entry, a counter two windows after its
    // fixed window.
    let now = clock.now_ms();
    one(
        &backend,
        &hit(
            "fresh-log",
            Algorithm::SlidingWindowLog,
            5,
            Cost::Consume(1),
        ),
    )
    .await;
    one(
        &backend,
        &hit(
            "fresh-counter",
            Algorithm::SlidingWindowCounter,
            5,
            Cost::Consume(1),
        ),
    )
    .await;
    clock.set(now + W);
    backend.sweep();
    let counter_index = now / W;
    assert!(backend.key_count() >= 1, "the counter is still counted");
    clock.set((counter_index + 2) * W - 1);
    backend.sweep();
    assert!(backend.key_count() >= 1);
    assert!(
        one(
            &backend,
            &hit(
                "fresh-counter",
                Algorithm::SlidingWindowCounter,
                5,
                Cost::CheckOnly
            )
        )
        .await
        .verdict
        .remaining
            < 5
    );
    clock.set((counter_index + 2) * W);
    backend.sweep();
    assert_eq!(backend.key_count(), 0, "every idle key is gone");
}

#[tokio::test]
async fn sweeping_happens_on_its_own_as_traffic_flows() {
    let (backend, clock) = backend_at(100 * W);
    for n in 0..10_000 {
        one(
            &backend,
            &hit(
                &format!("old-{n}"),
                Algorithm::SlidingWindowLog,
                5,
                Cost::Consume(1),
            ),
        )
        .await;
    }
    assert_eq!(backend.key_count(), 10_000);
    clock.advance(5 * W);
    // Only checks on fresh keys: they store nothing, yet they drive each shard's sweep.
    for n in 0..SHARD_COUNT * 400 {
        one(
            &backend,
            &hit(
                &format!("new-{n}"),
                Algorithm::SlidingWindowLog,
                5,
                Cost::CheckOnly,
            ),
        )
        .await;
    }
    assert_eq!(backend.key_count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_tasks_never_admit_more_than_the_limit() {
    for algorithm in BOTH {
        let (backend, _clock) = backend_at(77 * W + 300);
        let backend = Arc::new(backend);
        let admitted = Arc::new(AtomicUsize::new(0));
        let tasks: Vec<_> = (0..16)
            .map(|_| {
                let backend = Arc::clone(&backend);
                let admitted = Arc::clone(&admitted);
                tokio::spawn(async move {
                    let h = hit("hot", algorithm, 500, Cost::Consume(1));
                    for _ in 0..100 {
                        if one(backend.as_ref(), &h).await.verdict.admitted {
                            admitted.fetch_add(1, Ordering::Relaxed);
                        }
                        tokio::task::yield_now().await;
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
        // 1600 attempts against a limit of 500 in one instant: exactly the limit gets in.
        assert_eq!(admitted.load(Ordering::Relaxed), 500, "{algorithm}");
    }
}

#[test]
fn concurrent_threads_on_distinct_keys_do_not_interfere() {
    let clock = ManualClock::new(9 * W);
    let backend = Arc::new(MemoryBackend::with_clock(Arc::new(clock.clone())));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let counts: Vec<(usize, usize)> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..8)
            .map(|thread| {
                let backend = Arc::clone(&backend);
                let clock = clock.clone();
                scope.spawn(move || {
                    let runtime = tokio::runtime::Builder::new_current_thread()
                        .build()
                        .unwrap();
                    let mut shared = 0;
                    let mut own = 0;
                    for n in 0..300 {
                        let shared_hit = hit(
                            "shared",
                            Algorithm::SlidingWindowLog,
                            1000,
                            Cost::Consume(1),
                        );
                        let own_hit = hit(
                            &format!("own-{thread}"),
                            Algorithm::SlidingWindowCounter,
                            100,
                            Cost::Consume(1),
                        );
                        let results = runtime.block_on(backend.acquire(&[shared_hit, own_hit]));
                        let [a, b] = <[_; 2]>::try_from(results).unwrap();
                        shared += usize::from(a.unwrap().verdict.admitted);
                        own += usize::from(b.unwrap().verdict.admitted);
                        // Time moves a little but stays inside the window.
                        if thread == 0 && n % 100 == 0 {
                            clock.advance(1);
                        }
                    }
                    (shared, own)
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    let shared: usize = counts.iter().map(|c| c.0).sum();
    assert_eq!(
        shared, 1000,
        "2400 attempts on the shared log admit exactly its limit"
    );
    for (_, own) in &counts {
        assert_eq!(*own, 100, "each thread's own key has its own full limit");
    }
    let check = hit("shared", Algorithm::SlidingWindowLog, 1000, Cost::CheckOnly);
    let outcome = runtime
        .block_on(backend.acquire(&[check]))
        .remove(0)
        .unwrap();
    assert_eq!(outcome.verdict.remaining, 0);
}
