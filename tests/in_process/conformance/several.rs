//! Several limits on one descriptor (`rate_limits`): a hit is admitted only when every limit
//! admits it, and is charged to all of them or to none; the descriptor answers one status, that
//! of the limit with the least left, or of the limit that refused.
//!
//! The burst-then-sustained cases run on an injected clock (memory, one Redis server), where
//! every number is exact; the others run on the wall clock with hour- and day-long windows on
//! every target. Where the backend decides a descriptor's limits in one step (memory, Redis, the
//! cluster, with the cache), the concurrent cases are exact; where a mode answers limits apart
//! (sharded, leased), the limiter charges them one by one and gives back what a refusal leaves,
//! and the cases check that it never admits more than the limits.

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use tollgate::clock::{Clock, ManualClock};
use tollgate::config::{Config, MetaValue};
use tollgate::descriptor::Descriptor;
use tollgate::limiter::{Code, Decision, Limiter, Settings, Usage};
use tollgate_testkit::cases;
use tollgate_testkit::requests::{descriptor as d, with_addend};
use tollgate_testkit::target::Target;

use super::support::{TestLimiter, ask, ask_one, fresh, req};

cases! {
    burst_then_sustained: [memory, redis];
    sixty_concurrent_calls_admit_the_burst_then_exactly_the_rest: [memory, redis];
    refused_hits_charge_no_limit: leased;
    costs_count_against_every_limit: [memory, redis, redis_cluster];
    the_status_describes_the_least_left_or_the_last_retry: [memory, redis, redis_cluster];
    replaces_names_each_limit: leased;
    shadow_mode_and_checks_cover_every_limit: [memory, redis, redis_cluster];
    over_limit_metadata_names_the_refusing_limit: leased;
    each_limit_reports_under_its_own_key: [memory, redis, redis_cluster];
    a_cached_refusal_refuses_the_descriptor_and_charges_no_limit: [memory, redis, redis_cluster];
}

const POLICY: &str = r#"
domain: conformance
descriptors:
  - key: api
    rate_limits:
      - { unit: second, requests_per_unit: 3, name: burst }
      - { unit: minute, requests_per_unit: 5, name: sustained }
  - key: api_log
    rate_limits:
      - { unit: second, requests_per_unit: 3, name: burst, algorithm: sliding_window_log }
      - { unit: minute, requests_per_unit: 5, name: sustained, algorithm: sliding_window_log }
  - key: api_mixed
    rate_limits:
      - { unit: second, requests_per_unit: 3, name: burst }
      - { unit: minute, requests_per_unit: 5, name: sustained, algorithm: sliding_window_log }
  - key: pair
    rate_limits:
      - { unit: hour, requests_per_unit: 4, name: burst }
      - { unit: day, requests_per_unit: 6, name: sustained }
  - key: pair_log
    rate_limits:
      - { unit: hour, requests_per_unit: 4, name: burst, algorithm: sliding_window_log }
      - { unit: day, requests_per_unit: 6, name: sustained, algorithm: sliding_window_log }
  - key: equal
    rate_limits:
      - { unit: day, requests_per_unit: 2 }
      - { unit: hour, requests_per_unit: 2, name: hourly }
  - key: replaced
    rate_limits:
      - { unit: hour, requests_per_unit: 1, name: strict }
      - { unit: day, requests_per_unit: 4, name: daily }
  - key: relaxed
    rate_limit: { unit: day, requests_per_unit: 100, replaces: [{ name: strict }] }
  - key: shadowed
    shadow_mode: true
    rate_limits:
      - { unit: hour, requests_per_unit: 1, name: burst }
      - { unit: day, requests_per_unit: 3, name: sustained }
"#;

static CONFIG: LazyLock<Arc<Config>> = LazyLock::new(|| {
    Arc::new(Config::from_yaml("several.yaml", POLICY).expect("the test policy loads"))
});

/// The three ways of pairing the algorithms, by descriptor key.
const BURST_KEYS: [&str; 3] = ["api", "api_log", "api_mixed"];

/// An epoch-aligned minute boundary plus one second.
const START_MS: u64 = 1_700_000_040_000 + 1_000;

async fn limiter(t: &Target, settings: Settings) -> TestLimiter {
    t.limiter(Arc::clone(&CONFIG), settings).await
}

async fn clocked(t: &Target, clock: &ManualClock) -> Arc<TestLimiter> {
    Arc::new(Limiter::new(
        Arc::clone(&CONFIG),
        t.clocked_backend(clock).await,
        Settings::default(),
    ))
}

/// The usage before the hit of the limit called `name` in a decision's reports.
fn used(decision: &Decision, name: &str) -> u64 {
    let report = decision
        .reports
        .iter()
        .find(|report| report.limit.name.as_deref() == Some(name))
        .unwrap_or_else(|| panic!("no report of {name}: {decision:?}"));
    match report.usage {
        Usage::Decided { before, .. } => before,
        Usage::Failed(mode) => panic!("{name} failed ({mode:?}): {decision:?}"),
    }
}

/// The usage of every limit of `key=value`, by a check that consumes nothing, as
/// `(burst, sustained)`.
async fn usage(limiter: &TestLimiter, key: &str, value: &str) -> (u64, u64) {
    let decision = ask_one(limiter, with_addend(d(&[(key, value)]), 0)).await;
    (used(&decision, "burst"), used(&decision, "sustained"))
}

/// The name of the limit a status describes.
fn described(decision: &Decision, index: usize) -> Option<String> {
    decision.statuses[index]
        .limit
        .as_ref()
        .and_then(|limit| limit.name.clone())
}

/// Sends `calls` requests for `descriptor` at once and answers how many were admitted.
async fn admitted_at_once(
    limiters: &[Arc<TestLimiter>],
    calls: usize,
    descriptor: Descriptor,
) -> usize {
    let tasks: Vec<_> = (0..calls)
        .map(|call| {
            let limiter = Arc::clone(&limiters[call % limiters.len()]);
            let request = req(vec![descriptor.clone()]);
            tokio::spawn(async move { ask(&limiter, &request).await.overall == Code::Ok })
        })
        .collect();
    let mut admitted = 0;
    for task in tasks {
        if task.await.expect("task finished") {
            admitted += 1;
        }
    }
    admitted
}

/// 3 per second and 5 per minute: three hits pass, the fourth is refused by the burst limit
/// and charges neither; two seconds on, two more pass and the sustained limit refuses the
/// next, which charges neither either.
async fn burst_then_sustained(t: &Target) {
    for key in BURST_KEYS {
        let clock = ManualClock::new(START_MS);
        let limiter = clocked(t, &clock).await;
        let v = fresh("burst");
        for remaining in [2, 1, 0] {
            let decision = ask_one(&limiter, d(&[(key, &v)])).await;
            assert_eq!(decision.overall, Code::Ok, "{key}: {decision:?}");
            // The burst limit has the least left.
            assert_eq!(described(&decision, 0).as_deref(), Some("burst"), "{key}");
            assert_eq!(decision.statuses[0].remaining, remaining, "{key}");
        }
        let refused = ask_one(&limiter, d(&[(key, &v)])).await;
        assert_eq!(refused.overall, Code::OverLimit, "{key}: {refused:?}");
        assert_eq!(described(&refused, 0).as_deref(), Some("burst"), "{key}");
        assert_eq!(refused.statuses[0].remaining, 0, "{key}");
        assert_eq!(usage(&limiter, key, &v).await, (3, 3), "{key}");

        clock.advance(2_000);
        for _ in 0..2 {
            let decision = ask_one(&limiter, d(&[(key, &v)])).await;
            assert_eq!(decision.overall, Code::Ok, "{key}: {decision:?}");
        }
        let refused = ask_one(&limiter, d(&[(key, &v)])).await;
        assert_eq!(refused.overall, Code::OverLimit, "{key}: {refused:?}");
        assert_eq!(
            described(&refused, 0).as_deref(),
            Some("sustained"),
            "{key}"
        );
        // The sustained limit frees its first unit when the hits of the first second leave
        // the minute, 58 s from now for a log; a counter's estimate takes longer.
        let reset = refused.statuses[0].reset.expect("a reset").as_secs();
        if key == "api" {
            assert!((58..=72).contains(&reset), "{key}: {reset}");
        } else {
            assert_eq!(reset, 58, "{key}");
        }
        assert_eq!(usage(&limiter, key, &v).await, (2, 5), "{key}");
    }
}

/// The issue's case: 60 concurrent calls on 3 per second and 5 per minute admit 3; a second
/// later, 60 more admit exactly 2; then none until the minute frees units.
async fn sixty_concurrent_calls_admit_the_burst_then_exactly_the_rest(t: &Target) {
    for key in BURST_KEYS {
        let clock = ManualClock::new(START_MS);
        let limiter = clocked(t, &clock).await;
        let limiters = [Arc::clone(&limiter)];
        let v = fresh("sixty");
        let admitted = admitted_at_once(&limiters, 60, d(&[(key, &v)])).await;
        assert_eq!(admitted, 3, "{key}: the first second");
        assert_eq!(usage(&limiter, key, &v).await, (3, 3), "{key}");
        clock.advance(2_000);
        let admitted = admitted_at_once(&limiters, 60, d(&[(key, &v)])).await;
        assert_eq!(admitted, 2, "{key}: two seconds on");
        clock.advance(2_000);
        let admitted = admitted_at_once(&limiters, 60, d(&[(key, &v)])).await;
        assert_eq!(admitted, 0, "{key}: the minute is full");
        assert_eq!(usage(&limiter, key, &v).await, (0, 5), "{key}");
        assert!(clock.now_ms() < START_MS + 59_000);
    }
}

/// 60 concurrent calls from two instances on 4 per hour and 6 per day: the burst limit admits
/// its 4 and the refused 56 charge no limit, so the sustained limit holds exactly 4. Modes that
/// answer a descriptor's limits apart (sharded, leased) may refuse a call that a concurrent
/// refund would have made room for, never admit more.
async fn refused_hits_charge_no_limit(t: &Target) {
    for key in ["pair", "pair_log"] {
        let first = Arc::new(limiter(t, Settings::default()).await);
        let second = if t.shares_store() {
            Arc::new(limiter(t, Settings::default()).await)
        } else {
            Arc::clone(&first)
        };
        let v = fresh("charge-none");
        let admitted = admitted_at_once(&[Arc::clone(&first), second], 60, d(&[(key, &v)])).await;
        let apart = t.leases() || t.name().contains("sharded");
        if apart {
            assert!(
                (1..=4).contains(&admitted),
                "{}: {key}: {admitted}",
                t.name()
            );
        } else {
            assert_eq!(admitted, 4, "{}: {key}", t.name());
            assert_eq!(usage(&first, key, &v).await, (4, 4), "{}: {key}", t.name());
        }
        // Whatever was admitted, no more than the burst limit ever is.
        let mut more = 0;
        for _ in 0..10 {
            if ask_one(&first, d(&[(key, &v)])).await.overall == Code::Ok {
                more += 1;
            }
        }
        assert!(
            admitted + more <= 4,
            "{}: {key}: {admitted} + {more}",
            t.name()
        );
    }
}

/// A cost counts against every limit: 3 of 4 per hour and of 6 per day leave 1 and 3; a second
/// cost of 3 is refused by the hourly limit and charges neither; a cost of 1 still fits.
async fn costs_count_against_every_limit(t: &Target) {
    let limiter = limiter(t, Settings::default()).await;
    for key in ["pair", "pair_log"] {
        let v = fresh("costs");
        let first = ask_one(&limiter, with_addend(d(&[(key, &v)]), 3)).await;
        assert_eq!(first.overall, Code::Ok, "{key}: {first:?}");
        assert_eq!(described(&first, 0).as_deref(), Some("burst"));
        assert_eq!(first.statuses[0].remaining, 1, "{key}");
        let second = ask_one(&limiter, with_addend(d(&[(key, &v)]), 3)).await;
        assert_eq!(second.overall, Code::OverLimit, "{key}: {second:?}");
        assert_eq!(described(&second, 0).as_deref(), Some("burst"));
        assert_eq!(second.statuses[0].remaining, 1, "{key}");
        assert_eq!(usage(&limiter, key, &v).await, (3, 3), "{key}");
        let third = ask_one(&limiter, d(&[(key, &v)])).await;
        assert_eq!(third.overall, Code::Ok, "{key}: {third:?}");
        assert_eq!(third.statuses[0].remaining, 0, "{key}");
        assert_eq!(usage(&limiter, key, &v).await, (4, 4), "{key}");
    }
}

/// Admitted, the status is the limit with the least left, of equals the shorter window;
/// refused by both, the one whose retry comes last (the day), whose reset is then when both
/// would admit.
async fn the_status_describes_the_least_left_or_the_last_retry(t: &Target) {
    let limiter = limiter(t, Settings::default()).await;
    let v = fresh("status");
    let once = ask_one(&limiter, d(&[("equal", &v)])).await;
    assert_eq!(once.overall, Code::Ok);
    // 1 left of each: the hour is the shorter window.
    assert_eq!(described(&once, 0).as_deref(), Some("hourly"), "{once:?}");
    assert_eq!(once.statuses[0].remaining, 1);
    ask_one(&limiter, d(&[("equal", &v)])).await;
    let refused = ask_one(&limiter, d(&[("equal", &v)])).await;
    assert_eq!(refused.overall, Code::OverLimit);
    let status = &refused.statuses[0];
    let limit = status.limit.as_ref().expect("a limit");
    assert_eq!((limit.name.as_deref(), limit.requests_per_unit), (None, 2));
    assert_eq!(limit.window_ms, 86_400_000, "the day's retry comes last");
    assert!(status.reset.expect("a reset") > Duration::from_secs(3_600));
}

/// A limit of a list named by another descriptor's `replaces` drops out; its siblings stay.
async fn replaces_names_each_limit(t: &Target) {
    let limiter = limiter(t, Settings::default()).await;
    let v = fresh("replaces");
    let both = req(vec![d(&[("replaced", &v)]), d(&[("relaxed", &v)])]);
    for round in 0..4 {
        let decision = ask(&limiter, &both).await;
        assert_eq!(decision.overall, Code::Ok, "round {round}: {decision:?}");
        assert_eq!(described(&decision, 0).as_deref(), Some("daily"));
    }
    let decision = ask(&limiter, &both).await;
    assert_eq!(decision.overall, Code::OverLimit, "{decision:?}");
    // Alone, the strict limit applies again: it was never charged while replaced, and with
    // one hit it has the least left.
    let alone = ask_one(&limiter, d(&[("replaced", &fresh("replaces-alone"))])).await;
    assert_eq!(described(&alone, 0).as_deref(), Some("strict"));
}

/// A shadow descriptor whose burst refuses reports OK and still charges none of its limits; a
/// check (`hits_addend: 0`) consumes nothing on any.
async fn shadow_mode_and_checks_cover_every_limit(t: &Target) {
    let limiter = limiter(t, Settings::default()).await;
    let v = fresh("shadow");
    assert_eq!(
        ask_one(&limiter, d(&[("shadowed", &v)])).await.overall,
        Code::Ok
    );
    for _ in 0..3 {
        let decision = ask_one(&limiter, d(&[("shadowed", &v)])).await;
        assert_eq!(decision.overall, Code::Ok, "{decision:?}");
        assert_eq!(decision.statuses[0].code, Code::Ok);
        assert_eq!(described(&decision, 0).as_deref(), Some("burst"));
    }
    assert_eq!(usage(&limiter, "shadowed", &v).await, (1, 1));
    for _ in 0..3 {
        assert_eq!(usage(&limiter, "pair", &fresh("checks")).await, (0, 0));
    }
}

/// With dynamic metadata on, a refused descriptor is named in `overLimit` by its refusing
/// limit's name, or by its full key when it has none; a passing one is not.
async fn over_limit_metadata_names_the_refusing_limit(t: &Target) {
    let settings = Settings {
        response_dynamic_metadata: true,
        ..Settings::default()
    };
    let limiter = limiter(t, settings).await;
    let (v, w) = (fresh("meta"), fresh("meta-other"));
    for _ in 0..4 {
        ask_one(&limiter, d(&[("pair", &v)])).await;
    }
    for _ in 0..2 {
        ask_one(&limiter, d(&[("equal", &v)])).await;
    }
    let request = req(vec![
        d(&[("pair", &w)]),
        d(&[("pair", &v)]),
        d(&[("equal", &v)]),
    ]);
    let decision = ask(&limiter, &request).await;
    assert_eq!(decision.overall, Code::OverLimit, "{decision:?}");
    let metadata = decision.dynamic_metadata.expect("metadata");
    let MetaValue::Map(fields) = metadata else {
        panic!("metadata is a map");
    };
    let over = fields
        .iter()
        .find(|(name, _)| name == "overLimit")
        .map(|(_, value)| value.clone())
        .expect("overLimit");
    let entry = |index: f64, name: &str| {
        MetaValue::Map(vec![
            ("descriptorIndex".into(), MetaValue::Number(index)),
            ("name".into(), MetaValue::String(name.into())),
        ])
    };
    assert_eq!(
        over,
        MetaValue::List(vec![entry(1.0, "burst"), entry(2.0, "conformance.equal")])
    );
}

/// Each limit of a descriptor is reported on its own, under its own statistics key.
async fn each_limit_reports_under_its_own_key(t: &Target) {
    let limiter = limiter(t, Settings::default()).await;
    let v = fresh("reports");
    let decision = ask_one(&limiter, d(&[("pair", &v)])).await;
    let keys: Vec<&str> = decision.reports.iter().map(|r| r.stat_key()).collect();
    assert_eq!(
        keys,
        ["conformance.pair.burst", "conformance.pair.sustained"]
    );
    let decision = ask_one(&limiter, d(&[("equal", &v)])).await;
    let keys: Vec<&str> = decision.reports.iter().map(|r| r.stat_key()).collect();
    assert_eq!(keys, ["conformance.equal.1", "conformance.equal.hourly"]);
}

/// Once the burst limit refused, the local over-limit cache refuses the descriptor without
/// asking the store: the sustained limit is neither asked nor charged, and nothing is reported
/// for it.
async fn a_cached_refusal_refuses_the_descriptor_and_charges_no_limit(t: &Target) {
    let limiter = limiter(t, Settings::default()).await;
    for key in ["pair", "pair_log"] {
        let v = fresh("cached");
        for _ in 0..4 {
            assert_eq!(ask_one(&limiter, d(&[(key, &v)])).await.overall, Code::Ok);
        }
        assert_eq!(
            ask_one(&limiter, d(&[(key, &v)])).await.overall,
            Code::OverLimit
        );
        for round in 0..5 {
            let decision = ask_one(&limiter, d(&[(key, &v)])).await;
            assert_eq!(
                decision.overall,
                Code::OverLimit,
                "{key} {round}: {decision:?}"
            );
            assert_eq!(described(&decision, 0).as_deref(), Some("burst"));
            assert_eq!(decision.reports.len(), 1, "{key} {round}: {decision:?}");
            assert!(
                decision.reports[0].local_cache,
                "{key} {round}: {decision:?}"
            );
        }
        assert_eq!(usage(&limiter, key, &v).await, (4, 4), "{key}");
    }
}
