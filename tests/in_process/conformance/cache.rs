//! The local over-limit cache (on in every target, as `tollgate serve` runs it) is exact: a
//! refusal is answered again without a store call, only for the same limit and at least the
//! refused cost, only until the instant the store would admit the hit, and at that instant the
//! store admits it. Counted below the cache, so "no store call" is measured, not assumed.

use std::sync::{Arc, LazyLock};

use tollgate::backend::local_cache::DEFAULT_BYTES;
use tollgate::backend::{Backend, Hit};
use tollgate::clock::{Clock, ManualClock};
use tollgate::config::Config;
use tollgate::limiter::{Code, Limiter, Settings};
use tollgate::window::{Cost, Counting};
use tollgate_testkit::cases;
use tollgate_testkit::hits::{ALGORITHMS, counted, fresh_key, hit, one};
use tollgate_testkit::requests::descriptor as d;
use tollgate_testkit::target::Target;

use super::support::{ask, fresh, req};

cases! {
    refusals_are_answered_without_a_store_call: leased;
    a_raised_limit_or_smaller_cost_asks_the_store: leased;
    a_locally_refused_limit_gives_back_the_others: leased;
    cached_and_bare_agree_at_every_millisecond: [memory, redis, sharded_memory, sharded_redis];
    every_hit_counted_is_admitted_when_its_first_refusal_said: [memory, redis];
}

const HOUR_MS: u64 = 3_600_000;

/// Fills `h`'s window until the first refusal; answers how many hits were admitted.
async fn fill(backend: &impl Backend, h: &Hit) -> u64 {
    let mut admitted = 0;
    while one(backend, h).await.verdict.admitted {
        admitted += 1;
        assert!(admitted <= 100, "never refused: {h:?}");
    }
    admitted
}

/// Once the store refused a hit, the same hit and larger ones are refused with no store call,
/// for both algorithms, unit and weighted costs, and both countings (a sharded limit too: both
/// of its shards were tried and are known full).
async fn refusals_are_answered_without_a_store_call(t: &Target) {
    let (backend, store) = t.counted_backend().await;
    for algorithm in ALGORITHMS {
        for counting in [Counting::Admitted, Counting::All] {
            for cost in [1, 3] {
                let key = fresh_key("cached");
                let h = counted(
                    hit(&key, algorithm, 10, HOUR_MS, Cost::Consume(cost)),
                    counting,
                );
                fill(&backend, &h).await;
                let asked = store.hits();
                for bigger in [cost, cost, cost + 1, 10, 11] {
                    let again = with_cost(&h, bigger);
                    let outcome = one(&backend, &again).await;
                    assert!(!outcome.verdict.admitted, "{algorithm} {counting} {cost}");
                    assert_eq!(outcome.receipt, None);
                    assert!(outcome.verdict.reset_ms >= 1);
                }
                assert_eq!(
                    store.hits(),
                    asked,
                    "{}: {algorithm} {counting} cost {cost}: refused without a store call",
                    t.name()
                );
            }
        }
    }
}

/// The same hit with another cost.
fn with_cost(h: &Hit, units: u64) -> Hit {
    Hit {
        cost: Cost::Consume(units),
        ..h.clone()
    }
}

/// An entry answers only what it proves: a raised limit (a reload) and a smaller cost go to the
/// store, which admits them; a check is always asked.
async fn a_raised_limit_or_smaller_cost_asks_the_store(t: &Target) {
    let (backend, store) = t.counted_backend().await;
    for algorithm in ALGORITHMS {
        let key = fresh_key("raised");
        let h = hit(&key, algorithm, 10, HOUR_MS, Cost::Consume(4));
        // Two hits of 4 fill the limit of 10 (and each shard of 5).
        assert_eq!(fill(&backend, &h).await, 2, "{algorithm}");
        let asked = store.hits();
        let smaller = with_cost(&h, 1);
        assert!(
            one(&backend, &smaller).await.verdict.admitted,
            "{algorithm}"
        );
        assert!(store.hits() > asked, "a smaller cost is asked");

        let raised = Hit {
            limit: 40,
            ..h.clone()
        };
        let asked = store.hits();
        assert!(one(&backend, &raised).await.verdict.admitted, "{algorithm}");
        assert!(store.hits() > asked, "a raised limit is asked");

        let check = Hit {
            cost: Cost::CheckOnly,
            ..h.clone()
        };
        let asked = store.hits();
        one(&backend, &check).await;
        assert!(store.hits() > asked, "a check is asked");
    }
}

const POLICY: &str = r#"
domain: conformance
descriptors:
  - key: tight
    rate_limit: { unit: hour, requests_per_unit: 1 }
  - key: roomy
    rate_limit: { unit: hour, requests_per_unit: 5 }
"#;

static CONFIG: LazyLock<Arc<Config>> = LazyLock::new(|| {
    Arc::new(Config::from_yaml("cache.yaml", POLICY).expect("the test policy loads"))
});

/// A request whose one limit is refused from the cache still gives back what its other limits
/// took, so they lose nothing.
async fn a_locally_refused_limit_gives_back_the_others(t: &Target) {
    let (backend, store) = t.counted_backend().await;
    let limiter = Limiter::new(Arc::clone(&CONFIG), backend, Settings::default());
    let (tight, roomy) = (fresh("tight"), fresh("roomy"));
    let both = req(vec![d(&[("tight", &tight)]), d(&[("roomy", &roomy)])]);
    assert_eq!(ask(&limiter, &both).await.overall, Code::Ok);
    // The store refuses `tight` once; from then on the cache does.
    assert_eq!(ask(&limiter, &both).await.overall, Code::OverLimit);
    for _ in 0..4 {
        let asked = store.hits();
        let decision = ask(&limiter, &both).await;
        assert_eq!(decision.overall, Code::OverLimit);
        assert_eq!(decision.statuses[0].code, Code::OverLimit);
        assert_eq!(decision.statuses[1].code, Code::Ok);
        // Only `roomy` reached the store (on each shard tried), `tight` did not. (A leased
        // `roomy` got its released unit back in its slice, and may not need the store at all.)
        let reached = store.hits() - asked;
        let least = u64::from(!t.leases());
        assert!((least..=2).contains(&reached), "{reached} store hits");
    }
    // Every charge of a refused request was given back: `roomy` still takes four more.
    let alone = req(vec![d(&[("roomy", &roomy)])]);
    let mut admitted = 0;
    while ask(&limiter, &alone).await.overall == Code::Ok {
        admitted += 1;
        assert!(admitted <= 5);
    }
    assert_eq!(admitted, 4);
}

/// A minute-aligned instant (plus 100 ms), so that a filling run stays in one fixed window.
const START_MS: u64 = 1_700_000_040_000 + 100;
const WINDOW_MS: u64 = 2_000;

/// The cached stack and a bare one (no cache, keys of their own) on the same clock get the same
/// traffic and give the same answer at every millisecond from the first refusal until the
/// first admission, which comes at the same instant; meanwhile the cached one asked its store
/// once (at that instant) and the bare one every time. Both algorithms, unit and weighted
/// costs, sharded limits included.
async fn cached_and_bare_agree_at_every_millisecond(t: &Target) {
    for algorithm in ALGORITHMS {
        for cost in [1, 3] {
            let clock = ManualClock::new(START_MS);
            let (cached, store) = t.clocked(&clock, DEFAULT_BYTES).await;
            let (bare, _) = t.clocked(&clock, 0).await;
            let key = fresh_key("agree");
            let h = hit(&key, algorithm, 10, WINDOW_MS, Cost::Consume(cost));
            let what = format!("{}: {algorithm} cost {cost}", t.name());
            // Fill both the same way, 37 ms apart, until both refuse.
            loop {
                clock.advance(37);
                let (a, b) = (one(&cached, &h).await, one(&bare, &h).await);
                assert_eq!(a.verdict.admitted, b.verdict.admitted, "{what} filling");
                if !a.verdict.admitted {
                    break;
                }
            }
            let refused_at = clock.now_ms();
            let asked = store.hits();
            loop {
                clock.advance(1);
                let (a, b) = (one(&cached, &h).await, one(&bare, &h).await);
                assert_eq!(
                    a.verdict.admitted,
                    b.verdict.admitted,
                    "{what} at {} ms after the refusal",
                    clock.now_ms() - refused_at
                );
                if a.verdict.admitted {
                    break;
                }
                assert!(clock.now_ms() - refused_at <= 2 * WINDOW_MS, "{what}");
            }
            assert_eq!(
                store.hits() - asked,
                1,
                "{what}: one store call, at the instant"
            );
        }
    }
}

/// Where every hit is counted, the store charges the first refusal, and its reset names the
/// instant it is admitted; the cache answers until then without charging, so that instant
/// stands (the bare store, charged by every refusal, would admit later).
async fn every_hit_counted_is_admitted_when_its_first_refusal_said(t: &Target) {
    for algorithm in ALGORITHMS {
        let clock = ManualClock::new(START_MS);
        let (cached, store) = t.clocked(&clock, DEFAULT_BYTES).await;
        let key = fresh_key("all");
        let h = counted(
            hit(&key, algorithm, 5, WINDOW_MS, Cost::Consume(2)),
            Counting::All,
        );
        loop {
            clock.advance(37);
            let outcome = one(&cached, &h).await;
            if !outcome.verdict.admitted {
                let admit_at = clock.now_ms() + outcome.verdict.reset_ms;
                let asked = store.hits();
                clock.set(admit_at - 1);
                assert!(!one(&cached, &h).await.verdict.admitted, "{algorithm}");
                assert_eq!(store.hits(), asked, "{algorithm}: answered locally");
                clock.set(admit_at);
                assert!(one(&cached, &h).await.verdict.admitted, "{algorithm}");
                break;
            }
        }
    }
}
