//! The memory backend under a flood of distinct keys: what it holds stays within its budget (by
//! its own accounting, after every decision), expired windows go first and then those expiring
//! soonest, evictions are counted, idle memory comes back on the timer without traffic, a
//! counter key costs at most 64 bytes, and a flood of one-entry logs fills the budget.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use tollgate::backend::memory::MIN_BUDGET;
use tollgate::backend::{Backend, Hit, MemoryBackend};
use tollgate::clock::ManualClock;
use tollgate::window::{Algorithm, Cost, Counting};

const SECOND: u64 = 1_000;
const HOUR: u64 = 3_600_000;
const BUDGET: usize = MIN_BUDGET;

/// Runs a future of the memory backend, which never waits, to completion.
fn block_on<F: Future>(future: F) -> F::Output {
    let mut future = pin!(future);
    let mut cx = Context::from_waker(Waker::noop());
    loop {
        if let Poll::Ready(output) = future.as_mut().poll(&mut cx) {
            return output;
        }
    }
}

fn hit(key: &str, algorithm: Algorithm, limit: u64, window_ms: u64, cost: Cost) -> Hit {
    Hit {
        key: key.to_owned(),
        algorithm,
        limit,
        window_ms,
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

fn backend(budget: usize) -> (MemoryBackend, ManualClock) {
    let clock = ManualClock::new(1_000 * HOUR);
    let backend = MemoryBackend::with_budget(Arc::new(clock.clone()), budget);
    (backend, clock)
}

fn decide(backend: &MemoryBackend, hit: &Hit) -> tollgate::backend::Outcome {
    block_on(backend.acquire(std::slice::from_ref(hit)))
        .remove(0)
        .expect("memory always decides")
}

/// Distinct keys, as an attacker sends them (long random-looking descriptor values), for both
/// algorithms and windows that outlive the flood: without a budget every one of them is kept.
#[test]
fn a_flood_of_distinct_keys_never_exceeds_the_budget() {
    let (backend, clock) = backend(BUDGET);
    for n in 0..60_000u64 {
        let algorithm = if n % 3 == 0 {
            Algorithm::SlidingWindowLog
        } else {
            Algorithm::SlidingWindowCounter
        };
        let key = format!("edge|user={n:016x}{}@c3600000", "x".repeat(200));
        let outcome = decide(&backend, &hit(&key, algorithm, 10, HOUR, Cost::Consume(1)));
        assert!(outcome.verdict.admitted, "a fresh key admits its first hit");
        if n % 7 == 0 {
            clock.advance(1);
        }
        if n % 1_000 == 0 {
            let usage = backend.usage();
            assert!(usage.bytes <= usage.budget, "after {n} keys: {usage:?}");
        }
    }
    let usage = backend.usage();
    assert!(usage.bytes <= BUDGET as u64, "{usage:?}");
    assert!(
        usage.evictions > 0,
        "the flood outgrew the budget: {usage:?}"
    );
    // The budget is used, not left idle: at least a third of it holds windows.
    assert!(usage.bytes >= BUDGET as u64 / 3, "{usage:?}");
    assert_eq!(backend.memory_usage(), Some(usage));
}

/// Windows that expire late (an hour-long limit a real user is using) outlive a flood of keys
/// whose windows end sooner; expired windows go before any live one.
#[test]
fn eviction_takes_the_expired_then_the_soonest_to_expire() {
    let (backend, clock) = backend(BUDGET);
    let kept: Vec<Hit> = (0..50)
        .map(|n| {
            hit(
                &format!("tenant-{n}"),
                Algorithm::SlidingWindowCounter,
                100,
                HOUR,
                Cost::Consume(7),
            )
        })
        .collect();
    for h in &kept {
        assert!(decide(&backend, h).verdict.admitted);
    }
    // Expired windows first: a flood that has ended costs no live window its place. (Each
    // flood here fits in the budget on its own.)
    for n in 0..3_000u64 {
        let h = hit(
            &format!("old-{n}"),
            Algorithm::SlidingWindowCounter,
            10,
            SECOND,
            Cost::Consume(1),
        );
        decide(&backend, &h);
    }
    clock.advance(10 * SECOND);
    let before = backend.usage().evictions;
    assert_eq!(before, 0);
    for n in 0..3_000u64 {
        let h = hit(
            &format!("new-{n}"),
            Algorithm::SlidingWindowCounter,
            10,
            SECOND,
            Cost::Consume(1),
        );
        decide(&backend, &h);
    }
    assert_eq!(
        backend.usage().evictions,
        before,
        "expired windows made all the room needed"
    );
    // Then the soonest to expire: a flood far over the budget evicts its own keys, not the
    // long windows.
    for n in 0..60_000u64 {
        let h = hit(
            &format!("flood-{n}"),
            Algorithm::SlidingWindowCounter,
            10,
            60 * SECOND,
            Cost::Consume(1),
        );
        decide(&backend, &h);
    }
    assert!(backend.usage().evictions > before);
    for h in &kept {
        let check = Hit {
            cost: Cost::CheckOnly,
            ..h.clone()
        };
        assert_eq!(
            decide(&backend, &check).verdict.remaining,
            93,
            "{} kept its count",
            h.key
        );
    }
}

/// Once the keys' windows are over, the timer gives their memory back with no traffic at all.
#[test]
fn idle_memory_comes_back_on_the_timer() {
    let (backend, clock) = backend(16 << 20);
    for n in 0..20_000u64 {
        let algorithm = if n % 2 == 0 {
            Algorithm::SlidingWindowLog
        } else {
            Algorithm::SlidingWindowCounter
        };
        decide(
            &backend,
            &hit(&format!("k{n}"), algorithm, 5, SECOND, Cost::Consume(1)),
        );
    }
    let busy = backend.usage();
    assert_eq!(busy.keys, 20_000, "{busy:?}");
    clock.advance(3 * SECOND);
    block_on(backend.maintain());
    let idle = backend.usage();
    assert_eq!(idle.keys, 0, "{idle:?}");
    assert!(
        idle.bytes < busy.bytes / 100,
        "the tables shrank: {busy:?} -> {idle:?}"
    );
    assert_eq!(idle.evictions, 0, "expiry is not eviction");
}

/// Sends one one-unit hit on each of `keys` distinct hour-long windows to a backend of
/// `budget` bytes, and answers what it holds after, once the flood has filled it.
fn flood(budget: usize, algorithm: Algorithm, keys: u64) -> tollgate::backend::MemoryUsage {
    let (backend, _clock) = backend(budget);
    for n in 0..keys {
        let hit = hit(&format!("user-{n}"), algorithm, 10, HOUR, Cost::Consume(1));
        decide(&backend, &hit);
    }
    let usage = backend.usage();
    assert!(usage.evictions > 0, "filled to the budget: {usage:?}");
    usage
}

/// At the budget a counter key costs at most 64 bytes of what the backend holds.
#[test]
fn a_counter_key_costs_at_most_64_bytes() {
    let usage = flood(BUDGET, Algorithm::SlidingWindowCounter, 30_000);
    let per_key = usage.bytes / usage.keys;
    assert!(per_key <= 64, "{per_key} bytes per counter key: {usage:?}");
}

/// One sliding-window log with a limit far above what its shard's share can hold entry by entry
/// stays within the budget (its oldest entries merge), and still admits exactly its limit.
#[test]
fn one_huge_log_stays_within_the_budget_and_its_limit() {
    let (backend, clock) = backend(MIN_BUDGET);
    let h = hit(
        "big",
        Algorithm::SlidingWindowLog,
        20_000,
        HOUR,
        Cost::Consume(1),
    );
    let mut admitted = 0;
    for n in 0..30_000 {
        if decide(&backend, &h).verdict.admitted {
            admitted += 1;
        }
        if n % 10 == 0 {
            clock.advance(1);
        }
        if n % 500 == 0 {
            let usage = backend.usage();
            assert!(usage.bytes <= usage.budget, "{usage:?}");
        }
    }
    assert_eq!(admitted, 20_000, "never more than the limit, and all of it");
    let usage = backend.usage();
    assert!(usage.bytes <= usage.budget, "{usage:?}");
}

/// A log held at its size merges entries; releasing one hit's receipt gives back that hit's own
/// cost and no more, whichever entry now holds it: after each release exactly one more unit fits.
#[test]
fn releasing_a_merged_hit_gives_back_only_its_own_cost() {
    let (backend, clock) = backend(MIN_BUDGET);
    let limit = 20_000;
    let one = hit(
        "merged",
        Algorithm::SlidingWindowLog,
        limit,
        HOUR,
        Cost::Consume(1),
    );
    let mut receipts = Vec::new();
    for n in 0..limit {
        let outcome = decide(&backend, &one);
        assert!(outcome.verdict.admitted, "hit {n}");
        receipts.extend(outcome.receipt);
        if n % 10 == 0 {
            clock.advance(1);
        }
    }
    let usage = backend.usage();
    assert!(usage.bytes <= usage.budget, "{usage:?}");
    assert!(
        !decide(&backend, &one).verdict.admitted,
        "the limit is reached"
    );
    // Most entries were merged into the oldest one left, which carries the id of the newest hit
    // it took in; a receipt whose entry was merged away finds nothing to give back.
    let mut given_back = 0;
    for (n, receipt) in receipts.into_iter().enumerate() {
        block_on(backend.release(&[receipt])).expect("release");
        if decide(&backend, &one).verdict.admitted {
            given_back += 1;
        }
        assert!(
            !decide(&backend, &one).verdict.admitted,
            "release {n} gave back more than its one unit"
        );
    }
    assert!(
        given_back > 0,
        "some receipts still had entries of their own"
    );
}

/// A flood of one-entry logs, the cheapest keys an attacker can make of a log limit, uses the
/// budget rather than stalling below it, at most 256 bytes a key: one-entry logs cost more than
/// counters, and the tables still grow into the room they leave.
#[test]
fn a_flood_of_one_entry_logs_uses_the_budget() {
    let budget = 4 << 20;
    let usage = flood(budget, Algorithm::SlidingWindowLog, 100_000);
    assert!(usage.bytes <= budget as u64, "{usage:?}");
    assert!(usage.bytes >= budget as u64 / 4 * 3, "{usage:?}");
    let per_key = usage.bytes / usage.keys;
    assert!(per_key <= 256, "{per_key} bytes per log key: {usage:?}");
}
