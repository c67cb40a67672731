//! Several tollgate instances on one shared store, each with the local over-limit cache as
//! `tollgate serve` has it by default: a refusal one instance caches never outlives what another
//! instance's refund made room for, so every instance admits whatever the store would.
//!
//! Several backends made by one target are several instances sharing the store. A refund comes
//! from a request with several limits (the limiter gives back what the others took when one
//! refuses) or from a leased slice settling; the store tallies such tentative charges, and a
//! refusal is cached only for as long as it stands with all of them given back.

use std::time::Duration;

use tollgate::backend::lease::lease_ms;
use tollgate::backend::local_cache::DEFAULT_BYTES;
use tollgate::backend::observe::late_refunds_total;
use tollgate::backend::redis::refund_horizon_ms;
use tollgate::backend::{Backend, Hit};
use tollgate::clock::{Clock, ManualClock};
use tollgate::window::{Cost, Counting};
use tollgate_testkit::backends::TestBackend;
use tollgate_testkit::cases;
use tollgate_testkit::hits::{ALGORITHMS, counted, fresh_key, hit, one, tentative};
use tollgate_testkit::target::CALL_TIMEOUT;
use tollgate_testkit::target::Target;

cases! {
    another_instances_refund_is_never_hidden_by_a_cached_refusal: [
        redis, redis_cluster, sharded_redis, sharded_redis_cluster,
        leased_redis, leased_redis_cluster, leased_sharded_redis, leased_sharded_redis_cluster
    ];
    three_instances_admit_what_two_refunds_made_room_for: [
        redis, redis_cluster, sharded_redis, sharded_redis_cluster
    ];
    a_refusal_with_nothing_refundable_is_answered_locally_by_each_instance: [
        redis, redis_cluster, sharded_redis, sharded_redis_cluster
    ];
    counting_all_hits_are_charged_with_the_cache_on_by_default: every;
    a_refund_after_its_horizon_is_refused_and_the_refusal_is_then_cached: [redis];
}

const HOUR_MS: u64 = 3_600_000;

/// Lets `instance` settle the slices it holds, as its housekeeping does once their lease ended:
/// a released leased hit goes back to its slice, and reaches the store when the slice settles.
async fn settle(t: &Target, instance: &TestBackend, window_ms: u64) {
    if t.leases() {
        tokio::time::sleep(Duration::from_millis(lease_ms(window_ms) + 5)).await;
        instance.maintain().await;
    }
}

/// What the store itself has left for `h` (a check consumes nothing and is never cached or
/// leased).
async fn store_left(instance: &TestBackend, h: &Hit) -> u64 {
    let probe = Hit {
        cost: Cost::CheckOnly,
        ..h.clone()
    };
    one(instance, &probe).await.verdict.remaining
}

/// Instance A holds a tentative charge (one of a request's several limits); B fills the limit
/// and is refused. A gives its charge back: B's next hit is admitted, as the store would admit
/// it, whether B's refusal was cached or not.
async fn another_instances_refund_is_never_hidden_by_a_cached_refusal(t: &Target) {
    for algorithm in ALGORITHMS {
        let (a, _) = t.counted_instance().await;
        let (b, b_store) = t.counted_instance().await;
        let limit = 4;
        let h = hit(
            &fresh_key("refunded"),
            algorithm,
            limit,
            HOUR_MS,
            Cost::Consume(1),
        );
        let held = one(&a, &tentative(h.clone())).await;
        assert!(held.verdict.admitted, "{}: {algorithm}", t.name());
        let receipt = held.receipt.expect("an admitted charge has a receipt");
        let mut admitted = 1;
        while one(&b, &h).await.verdict.admitted {
            admitted += 1;
            assert!(admitted <= limit, "{}: {algorithm}", t.name());
        }
        assert_eq!(admitted, limit, "{}: {algorithm}", t.name());
        // Refused again, from B's cache or the store: the store is full either way.
        assert!(!one(&b, &h).await.verdict.admitted);

        a.release(std::slice::from_ref(&receipt))
            .await
            .expect("the refund is given back");
        settle(t, &a, HOUR_MS).await;
        // A check on a sharded limit asks one random shard: only an unsharded limit's store
        // can say where the room is.
        if !t.name().contains("sharded") {
            assert_eq!(store_left(&b, &h).await, 1, "{}: {algorithm}", t.name());
        }
        let asked = b_store.hits();
        let after = one(&b, &h).await;
        assert!(
            after.verdict.admitted,
            "{}: {algorithm}: B refused a hit the store had room for after A's refund",
            t.name()
        );
        assert!(b_store.hits() > asked, "B asked the store");
        assert!(!one(&b, &h).await.verdict.admitted);
    }
}

/// Two instances each hold tentative charges while a third is refused, several times over;
/// each refund makes room the third instance uses at once. (Leased, the released hits would go
/// back to slices still held, not to the store: the case above covers that.)
async fn three_instances_admit_what_two_refunds_made_room_for(t: &Target) {
    for algorithm in ALGORITHMS {
        let (a, _) = t.counted_instance().await;
        let (b, _) = t.counted_instance().await;
        let (c, _) = t.counted_instance().await;
        let limit = 6;
        let h = hit(
            &fresh_key("two-refunds"),
            algorithm,
            limit,
            HOUR_MS,
            Cost::Consume(1),
        );
        let mut receipts = Vec::new();
        for instance in [&a, &b, &a, &b] {
            let outcome = one(instance, &tentative(h.clone())).await;
            assert!(outcome.verdict.admitted, "{}: {algorithm}", t.name());
            receipts.push(outcome.receipt.expect("a receipt"));
        }
        assert!(one(&c, &h).await.verdict.admitted);
        assert!(one(&c, &h).await.verdict.admitted);
        for _ in 0..3 {
            assert!(!one(&c, &h).await.verdict.admitted, "{}: full", t.name());
        }
        for (n, receipt) in receipts.into_iter().enumerate() {
            let giver = if n % 2 == 0 { &a } else { &b };
            giver
                .release(std::slice::from_ref(&receipt))
                .await
                .expect("the refund is given back");
            settle(t, giver, HOUR_MS).await;
            assert!(
                one(&c, &h).await.verdict.admitted,
                "{}: {algorithm}: refund {n} made room, and C must see it",
                t.name()
            );
            assert!(!one(&c, &h).await.verdict.admitted);
        }
    }
}

/// With only final charges (requests of one limit), each instance's first refusal is cached:
/// the next hits are answered without a store call, on every instance.
async fn a_refusal_with_nothing_refundable_is_answered_locally_by_each_instance(t: &Target) {
    for algorithm in ALGORITHMS {
        let instances = [
            t.counted_instance().await,
            t.counted_instance().await,
            t.counted_instance().await,
        ];
        let h = hit(&fresh_key("final"), algorithm, 3, HOUR_MS, Cost::Consume(1));
        for (instance, _) in &instances {
            assert!(one(instance, &h).await.verdict.admitted);
        }
        for (instance, store) in &instances {
            assert!(!one(instance, &h).await.verdict.admitted);
            let asked = store.hits();
            for _ in 0..20 {
                let outcome = one(instance, &h).await;
                assert!(!outcome.verdict.admitted);
                assert!(outcome.cached, "{}: {algorithm}", t.name());
            }
            assert_eq!(store.hits(), asked, "{}: {algorithm}", t.name());
        }
    }
}

/// Under `counting: all` every hit is charged, refused ones included: with the cache on by
/// default, each still reaches the store, so what is charged is what it would be without it.
async fn counting_all_hits_are_charged_with_the_cache_on_by_default(t: &Target) {
    for algorithm in ALGORITHMS {
        let (instance, store) = t.counted_instance().await;
        let h = counted(
            hit(&fresh_key("all"), algorithm, 2, HOUR_MS, Cost::Consume(1)),
            Counting::All,
        );
        let mut refused = 0;
        for _ in 0..6 {
            let outcome = one(&instance, &h).await;
            assert!(!outcome.cached, "{}: {algorithm}", t.name());
            if !outcome.verdict.admitted {
                refused += 1;
            }
        }
        assert_eq!(refused, 4, "{}: {algorithm}", t.name());
        assert!(
            store.hits() >= 6,
            "{}: {algorithm}: every hit asked",
            t.name()
        );
    }
}

/// On a clock the test sets: a refusal of a window holding a tentative charge is not cached
/// while that charge may still come back; once its horizon has passed, a refund is refused (the
/// charge stands, and is counted as late), and once the second it ended in is over, the next
/// refusal is cached for its whole reset.
async fn a_refund_after_its_horizon_is_refused_and_the_refusal_is_then_cached(t: &Target) {
    let horizon = refund_horizon_ms(CALL_TIMEOUT);
    for algorithm in ALGORITHMS {
        let clock = ManualClock::new(1_700_000_000_000);
        let (backend, store) = t.clocked(&clock, DEFAULT_BYTES).await;
        let h = hit(&fresh_key("late"), algorithm, 2, HOUR_MS, Cost::Consume(1));
        let held = one(&backend, &tentative(h.clone())).await;
        let receipt = held.receipt.expect("an admitted charge has a receipt");
        assert_eq!(receipt.refundable_until_ms, clock.now_ms() + horizon);
        assert!(one(&backend, &h).await.verdict.admitted);
        let refused = one(&backend, &h).await;
        assert!(!refused.verdict.admitted);
        assert_eq!(
            refused.stands_ms, 0,
            "{algorithm}: the refund could make room now"
        );
        let asked = store.hits();
        assert!(!one(&backend, &h).await.verdict.admitted);
        assert_eq!(
            store.hits(),
            asked + 1,
            "{algorithm}: not cached, asked again"
        );

        clock.advance(horizon + 1);
        let late = late_refunds_total();
        backend
            .release(std::slice::from_ref(&receipt))
            .await
            .expect("a late refund is answered");
        assert!(late_refunds_total() > late, "{algorithm}: counted as late");
        // The tally counts by the second a horizon ends in: once that second is over too,
        // nothing is refundable.
        clock.advance(1000);
        let refused = one(&backend, &h).await;
        assert!(!refused.verdict.admitted, "{algorithm}: the charge stands");
        assert_eq!(refused.stands_ms, refused.verdict.reset_ms, "{algorithm}");
        let asked = store.hits();
        let cached = one(&backend, &h).await;
        assert!(cached.cached && !cached.verdict.admitted, "{algorithm}");
        assert_eq!(store.hits(), asked, "{algorithm}: answered from the cache");
    }
}
