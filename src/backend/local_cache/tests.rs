//! Tests of the local over-limit cache: which refusals it answers and until when, that a release
//! forgets them, and its byte budget. Kept beside `local_cache.rs`, not in it, so the cache reads
//! without scrolling past its tests.

use std::sync::Mutex as StdMutex;

use super::*;
use crate::backend::MemoryBackend;
use crate::backend::memory::tests::one;
use crate::clock::ManualClock;
use crate::window::Counting;

const W: u64 = 10_000;
const BOTH: [Algorithm; 2] = [Algorithm::SlidingWindowCounter, Algorithm::SlidingWindowLog];

/// The memory backend, counting the hits it is asked to decide.
struct Counted {
    memory: MemoryBackend,
    hits: StdMutex<u64>,
}

impl Counted {
    fn asked(&self) -> u64 {
        *self.hits.lock().unwrap()
    }
}

impl Backend for Counted {
    async fn acquire(&self, hits: &[Hit]) -> Vec<Result<Outcome, BackendError>> {
        *self.hits.lock().unwrap() += hits.len() as u64;
        self.memory.acquire(hits).await
    }

    async fn release(&self, receipts: &[Receipt]) -> Result<(), BackendError> {
        self.memory.release(receipts).await
    }

    async fn ping(&self) -> Result<(), BackendError> {
        Ok(())
    }
}

fn cached_at(now_ms: u64, bytes: u64) -> (LocalCache<Counted>, ManualClock) {
    let clock = ManualClock::new(now_ms);
    let memory = MemoryBackend::with_clock(Arc::new(clock.clone()));
    let counted = Counted {
        memory,
        hits: StdMutex::new(0),
    };
    (
        LocalCache::new(counted, Arc::new(clock.clone()), bytes),
        clock,
    )
}

fn hit(key: &str, algorithm: Algorithm, limit: u64, cost: u64) -> Hit {
    Hit {
        key: key.to_owned(),
        algorithm,
        limit,
        window_ms: W,
        cost: Cost::Consume(cost),
        counting: Counting::Admitted,
        shards: 1,
        lease_ms: 0,
        tentative: false,
        group: 0,
        descriptor_tag: false,
        slice: false,
    }
}

#[tokio::test]
async fn a_refusal_is_answered_locally_until_the_backend_would_admit_it() {
    for algorithm in BOTH {
        let (cache, clock) = cached_at(100 * W + 1_234, DEFAULT_BYTES);
        let h = hit("k", algorithm, 3, 1);
        for _ in 0..3 {
            assert!(one(&cache, &h).await.verdict.admitted);
            clock.advance(700);
        }
        let refused = one(&cache, &h).await.verdict;
        assert!(!refused.admitted);
        let asked = cache.inner().asked();
        let admit_at = clock.now_ms() + refused.reset_ms;
        // Until the instant: refused here, with the time left counting down.
        while clock.now_ms() + 1 < admit_at {
            clock.advance(((admit_at - clock.now_ms()) / 3).max(1));
            let cached = one(&cache, &h).await.verdict;
            if clock.now_ms() < admit_at {
                assert!(!cached.admitted, "{algorithm}");
                assert_eq!(cached.reset_ms, admit_at - clock.now_ms(), "{algorithm}");
                assert_eq!(cached.remaining, 0);
            }
        }
        clock.set(admit_at - 1);
        assert!(!one(&cache, &h).await.verdict.admitted);
        assert_eq!(cache.inner().asked(), asked, "{algorithm}: no backend call");
        // At the instant the backend is asked again, and admits.
        clock.set(admit_at);
        assert!(one(&cache, &h).await.verdict.admitted, "{algorithm}");
        assert_eq!(cache.inner().asked(), asked + 1);
    }
}

#[tokio::test]
async fn only_the_same_limit_and_at_least_the_refused_cost_are_answered() {
    for algorithm in BOTH {
        let (cache, _clock) = cached_at(100 * W, DEFAULT_BYTES);
        assert!(
            one(&cache, &hit("k", algorithm, 10, 8))
                .await
                .verdict
                .admitted
        );
        assert!(
            !one(&cache, &hit("k", algorithm, 10, 3))
                .await
                .verdict
                .admitted
        );
        let asked = cache.inner().asked();
        // A larger cost: local.
        assert!(
            !one(&cache, &hit("k", algorithm, 10, 5))
                .await
                .verdict
                .admitted
        );
        assert_eq!(cache.inner().asked(), asked);
        // A smaller cost may fit: asked, and admitted.
        assert!(
            one(&cache, &hit("k", algorithm, 10, 2))
                .await
                .verdict
                .admitted
        );
        assert_eq!(cache.inner().asked(), asked + 1);
        // A raised limit (a reload): asked, and admitted.
        assert!(
            one(&cache, &hit("k", algorithm, 20, 3))
                .await
                .verdict
                .admitted
        );
        assert_eq!(cache.inner().asked(), asked + 2);
        // A check is never answered here.
        let mut check = hit("k", algorithm, 10, 3);
        check.cost = Cost::CheckOnly;
        one(&cache, &check).await;
        assert_eq!(cache.inner().asked(), asked + 3);
    }
}

#[tokio::test]
async fn a_release_forgets_the_refusals_of_its_window() {
    for algorithm in BOTH {
        let (cache, _clock) = cached_at(100 * W, DEFAULT_BYTES);
        let h = hit("k", algorithm, 2, 1);
        let first = one(&cache, &h).await;
        assert!(one(&cache, &h).await.verdict.admitted);
        assert!(!one(&cache, &h).await.verdict.admitted);
        assert_eq!(cache.held().0, 1);
        cache.release(&[first.receipt.unwrap()]).await.unwrap();
        assert_eq!(cache.held().0, 0);
        assert!(one(&cache, &h).await.verdict.admitted, "{algorithm}");
    }
}

#[tokio::test]
async fn a_refusal_decided_across_a_release_is_not_stored() {
    for algorithm in BOTH {
        let (cache, clock) = cached_at(100 * W, DEFAULT_BYTES);
        let h = hit("k", algorithm, 1, 1);
        let admitted = one(&cache, &h).await;
        let receipt = admitted.receipt.expect("an admitted charge has a receipt");
        let before = cache.releases();
        let refused = one(cache.inner(), &h).await;
        assert!(!refused.verdict.admitted);
        cache.forget(std::slice::from_ref(&receipt));
        cache.store(&h, &refused, clock.now_ms(), &before);
        assert_eq!(cache.held(), (0, 0), "{algorithm}");
        // Read after the release, the same refusal is stored.
        cache.store(&h, &refused, clock.now_ms(), &cache.releases());
        assert_eq!(cache.held().0, 1, "{algorithm}");
        assert_eq!(cache.held.load(Ordering::Relaxed), 1);
    }
}

// Envoy often sends several descriptors a request; a refused request gives back the charges
// of the others, all the time under attack. Those releases must not keep the refused
// window out of the cache unless they share its stripe.
#[tokio::test]
async fn a_release_of_another_stripe_does_not_stop_a_store() {
    let (cache, clock) = cached_at(100 * W, DEFAULT_BYTES);
    let refused_hit = hit("k", Algorithm::SlidingWindowCounter, 0, 1);
    let stripe_of = |key: &str| LocalCache::<Counted>::stripe_index(cache.hash(key));
    let other = (0..)
        .map(|n| format!("other-{n}"))
        .find(|key| stripe_of(key) != stripe_of("k"))
        .expect("some key falls in another stripe");
    let other_hit = hit(&other, Algorithm::SlidingWindowCounter, 10, 1);
    let receipt = one(&cache, &other_hit).await.receipt.expect("admitted");
    let before = cache.releases();
    let refused = one(cache.inner(), &refused_hit).await;
    assert!(!refused.verdict.admitted);
    cache.forget(std::slice::from_ref(&receipt));
    cache.store(&refused_hit, &refused, clock.now_ms(), &before);
    assert_eq!(cache.held().0, 1, "the refusal of `k` is stored");
}

#[tokio::test]
async fn a_budget_of_zero_turns_the_cache_off() {
    let (cache, _clock) = cached_at(100 * W, 0);
    let h = hit("k", Algorithm::SlidingWindowCounter, 1, 1);
    for _ in 0..5 {
        one(&cache, &h).await;
    }
    assert_eq!(cache.inner().asked(), 5);
    assert_eq!(cache.answered(), 0);
    assert_eq!(cache.held(), (0, 0));
}

#[tokio::test]
async fn the_bytes_held_never_exceed_the_budget() {
    for budget in [32u64 << 10, 256 << 10, 1 << 20] {
        let (cache, clock) = cached_at(100 * W, budget);
        let mut stored_last = 0;
        for n in 0..20_000u64 {
            // Keys of varied length, each refused once (limit 0 refuses every hit).
            let key = format!("key-{n}-{}", "x".repeat((n % 97) as usize));
            let h = hit(&key, Algorithm::SlidingWindowLog, 0, 1);
            assert!(!one(&cache, &h).await.verdict.admitted);
            let (entries, bytes) = cache.held();
            assert!(bytes as u64 <= budget, "{bytes} > {budget}");
            stored_last = entries;
            clock.advance(1);
        }
        assert!(stored_last > 0, "the budget {budget} holds some entries");
        // The newest refusal is held: the soonest to expire went first.
        let newest = format!("key-19999-{}", "x".repeat((19_999 % 97) as usize));
        let asked = cache.inner().asked();
        one(&cache, &hit(&newest, Algorithm::SlidingWindowLog, 0, 1)).await;
        assert_eq!(cache.inner().asked(), asked, "budget {budget}");
    }
}

#[tokio::test]
async fn a_full_cache_drops_expired_entries_first() {
    let (cache, clock) = cached_at(100 * W, 64 << 10);
    // Fill the cache until it evicts.
    let mut n = 0;
    while cache.held().0 == n {
        let h = hit(&format!("old-{n}"), Algorithm::SlidingWindowLog, 0, 1);
        one(&cache, &h).await;
        n += 1;
    }
    let old = cache.held().0;
    assert!(old > 16, "{old}");
    assert_eq!(
        cache.held.load(Ordering::Relaxed),
        old,
        "the count follows evictions"
    );
    clock.advance(W);
    // All of them have expired; new entries (a few, so no stripe gets more than it held)
    // take their room without evicting each other.
    let new = old / 8;
    for m in 0..new {
        one(
            &cache,
            &hit(&format!("new-{m}"), Algorithm::SlidingWindowLog, 0, 1),
        )
        .await;
    }
    let asked = cache.inner().asked();
    for m in 0..new {
        one(
            &cache,
            &hit(&format!("new-{m}"), Algorithm::SlidingWindowLog, 0, 1),
        )
        .await;
    }
    assert_eq!(cache.inner().asked(), asked, "every new entry is held");
    cache.maintain().await;
    assert_eq!(cache.held().0, new);
    assert_eq!(
        cache.held.load(Ordering::Relaxed),
        new,
        "the count follows sweeps"
    );
}
