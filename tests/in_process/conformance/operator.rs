//! The operator's questions about one client (`Limiter::inspect`, `Limiter::reset`, behind `POST
//! /counters` and `POST /counters/reset`): every limit a descriptor resolves to with its usage,
//! read without consuming anything, and cleared on demand, on every store and mode: sharded
//! limits answer the sum of their shards, leased ones count what the instance holds as used.

use std::sync::{Arc, LazyLock};

use tollgate::backend::WindowState;
use tollgate::clock::ManualClock;
use tollgate::config::Config;
use tollgate::descriptor::Descriptor;
use tollgate::limiter::{Code, DescriptorUsage, InspectError, Limiter, Settings};
use tollgate_testkit::cases;
use tollgate_testkit::requests::{descriptor as d, request};
use tollgate_testkit::target::Target;

use super::support::{TestLimiter, ask_one, fresh, req, units_left};

cases! {
    inspecting_consumes_nothing_and_shows_every_limit: leased;
    limits_that_do_not_apply_answer_no_limit: every;
    reset_clears_every_limit_and_admits_again: leased;
    reset_is_safe_to_repeat: every;
    bad_requests_touch_nothing: exact;
    usage_follows_the_sliding_window: [memory, redis];
}

const POLICY: &str = r#"
domain: conformance
descriptors:
  - key: user
    rate_limit: { unit: hour, requests_per_unit: 5, name: per_user }
  - key: user_log
    rate_limit: { unit: hour, requests_per_unit: 5, algorithm: sliding_window_log }
  - key: api
    rate_limits:
      - { unit: hour, requests_per_unit: 4, name: burst }
      - { unit: day, requests_per_unit: 6, name: sustained, algorithm: sliding_window_log }
  - key: free
    rate_limit: { unlimited: true }
  - key: short
    rate_limit: { window: 10s, requests_per_unit: 10 }
  - key: short_log
    rate_limit: { window: 10s, requests_per_unit: 10, algorithm: sliding_window_log }
"#;

static CONFIG: LazyLock<Arc<Config>> = LazyLock::new(|| {
    Arc::new(Config::from_yaml("operator.yaml", POLICY).expect("the test policy loads"))
});

async fn limiter(t: &Target) -> TestLimiter {
    t.limiter(Arc::clone(&CONFIG), Settings::default()).await
}

/// What `inspect` says of one descriptor.
async fn inspect_one(limiter: &TestLimiter, descriptor: Descriptor) -> DescriptorUsage {
    let mut answer = limiter
        .inspect(&req(vec![descriptor]))
        .await
        .unwrap_or_else(|err| panic!("inspect: {err}"));
    assert_eq!(answer.len(), 1);
    answer.remove(0)
}

/// `(name, used, remaining)` of every limit of a descriptor's answer.
fn numbers(usage: &DescriptorUsage) -> Vec<(Option<String>, u64, u64)> {
    usage
        .limits
        .iter()
        .map(|l| (l.limit.name.clone(), l.state.used, l.state.remaining))
        .collect()
}

/// Hits `descriptor` until it is refused; answers how many were admitted (at most `bound`).
async fn admitted_until_refused(
    limiter: &TestLimiter,
    descriptor: &Descriptor,
    bound: usize,
) -> usize {
    for admitted in 0..=bound {
        if ask_one(limiter, descriptor.clone()).await.overall == Code::OverLimit {
            return admitted;
        }
    }
    panic!("more than {bound} hits admitted for {descriptor:?}");
}

/// Three hits of five: inspecting (twice) answers 3 used and 2 left for a counter and a log, and
/// each limit of a descriptor with several; a check (unsharded: a sharded check estimates from
/// one shard) and then real hits find exactly what it said, so inspecting consumed nothing. Leased targets hold slices in the store, counted as
/// used, so there usage is at least the hits and usage plus what is left is the limit.
async fn inspecting_consumes_nothing_and_shows_every_limit(t: &Target) {
    let limiter = limiter(t).await;
    for key in ["user", "user_log"] {
        let v = fresh("inspect");
        let descriptor = d(&[(key, &v)]);
        let idle = inspect_one(&limiter, descriptor.clone()).await;
        assert_eq!(idle.entries, descriptor.entries);
        assert_eq!(numbers(&idle).len(), 1, "{key}: {idle:?}");
        assert_eq!(
            idle.limits[0].state,
            WindowState {
                used: 0,
                remaining: 5,
                reset_ms: 0
            }
        );
        for _ in 0..3 {
            assert_eq!(
                ask_one(&limiter, descriptor.clone()).await.overall,
                Code::Ok
            );
        }
        let first = inspect_one(&limiter, descriptor.clone()).await;
        let second = inspect_one(&limiter, descriptor.clone()).await;
        let state = first.limits[0].state;
        assert_eq!(state.used + state.remaining, 5, "{key}: {first:?}");
        if t.leases() {
            assert!(state.used >= 3, "{key}: {first:?}");
        } else {
            assert_eq!((state.used, state.remaining), (3, 2), "{key}: {first:?}");
        }
        // A check on a sharded limit reports one shard's estimate; inspect sums them all.
        if !t.leases() && !t.name().contains("sharded") {
            assert_eq!(
                u64::from(units_left(&limiter, &[(key, &v)]).await),
                state.remaining,
                "{key}: a check agrees with inspect"
            );
        }
        assert!(
            state.reset_ms > 3_500_000 && state.reset_ms <= 7_200_000,
            "{key}: {state:?}"
        );
        assert_eq!(
            (
                second.limits[0].state.used,
                second.limits[0].state.remaining
            ),
            (state.used, state.remaining),
            "{key}: inspecting again changes nothing"
        );
        assert_eq!(
            admitted_until_refused(&limiter, &descriptor, 5).await,
            2,
            "{key}: the two units left are still there"
        );
    }

    let v = fresh("several");
    let api = d(&[("api", &v)]);
    for _ in 0..2 {
        assert_eq!(ask_one(&limiter, api.clone()).await.overall, Code::Ok);
    }
    let several = inspect_one(&limiter, api.clone()).await;
    let named = numbers(&several);
    assert_eq!(named.len(), 2, "{several:?}");
    assert_eq!(named[0].0.as_deref(), Some("burst"));
    assert_eq!(named[1].0.as_deref(), Some("sustained"));
    assert_eq!(named[0].1 + named[0].2, 4, "{several:?}");
    assert_eq!(named[1].1 + named[1].2, 6, "{several:?}");
    if !t.leases() {
        assert_eq!((named[0].1, named[1].1), (2, 2), "{several:?}");
    }
    assert_eq!(admitted_until_refused(&limiter, &api, 6).await, 2);
}

/// An unknown domain, a descriptor that matches nothing and an unlimited one answer no limit;
/// a request of several descriptors answers each in order.
async fn limits_that_do_not_apply_answer_no_limit(t: &Target) {
    let limiter = limiter(t).await;
    let v = fresh("none");
    let answer = limiter
        .inspect(&req(vec![
            d(&[("free", &v)]),
            d(&[("nobody", &v)]),
            d(&[("user", &v)]),
        ]))
        .await
        .expect("inspect");
    assert_eq!(answer.len(), 3);
    assert!(answer[0].limits.is_empty(), "{answer:?}");
    assert!(answer[1].limits.is_empty(), "{answer:?}");
    assert_eq!(answer[2].limits.len(), 1, "{answer:?}");
    let elsewhere = limiter
        .inspect(&request("no-such-domain", vec![d(&[("user", &v)])]))
        .await
        .expect("inspect");
    assert!(elsewhere[0].limits.is_empty(), "{elsewhere:?}");
}

/// Filled until refused, a descriptor of several limits (and a plain one) is reset: the reset
/// answers what each window held, inspect then finds them empty, and every unit is admitted
/// again at once, the local over-limit cache's refusal and any leased slice gone with them.
async fn reset_clears_every_limit_and_admits_again(t: &Target) {
    let limiter = limiter(t).await;
    let v = fresh("reset");
    let api = d(&[("api", &v)]);
    let user = d(&[("user", &v)]);
    assert_eq!(admitted_until_refused(&limiter, &api, 6).await, 4);
    assert_eq!(admitted_until_refused(&limiter, &user, 6).await, 5);
    let cleared = limiter
        .reset(&req(vec![api.clone(), user.clone()]))
        .await
        .expect("reset");
    assert_eq!(cleared.len(), 2);
    let (api_cleared, user_cleared) = (numbers(&cleared[0]), numbers(&cleared[1]));
    assert_eq!((api_cleared[0].1, api_cleared[0].2), (4, 0), "{cleared:?}");
    assert!(api_cleared[1].1 >= 4, "{cleared:?}");
    assert_eq!(
        (user_cleared[0].1, user_cleared[0].2),
        (5, 0),
        "{cleared:?}"
    );
    for descriptor in [&api, &user] {
        let after = inspect_one(&limiter, descriptor.clone()).await;
        assert!(
            after.limits.iter().all(|l| l.state.used == 0),
            "{descriptor:?}: {after:?}"
        );
    }
    // The sustained limit (6 a day) counted the four burst hits: cleared, the burst is whole.
    assert_eq!(admitted_until_refused(&limiter, &api, 6).await, 4);
    assert_eq!(admitted_until_refused(&limiter, &user, 6).await, 5);
}

/// A second reset, and a reset of windows never charged, clear nothing and fail nothing; the
/// windows stay empty.
async fn reset_is_safe_to_repeat(t: &Target) {
    let limiter = limiter(t).await;
    let v = fresh("again");
    let descriptors = vec![d(&[("user", &v)]), d(&[("short_log", &v)])];
    for descriptor in &descriptors {
        assert_eq!(
            ask_one(&limiter, descriptor.clone()).await.overall,
            Code::Ok
        );
    }
    let request = req(descriptors.clone());
    let first = limiter.reset(&request).await.expect("first reset");
    assert!(
        first.iter().all(|u| u.limits[0].state.used >= 1),
        "{first:?}"
    );
    let second = limiter.reset(&request).await.expect("second reset");
    assert!(
        second.iter().all(|u| u.limits[0].state.used == 0),
        "{second:?}"
    );
    let never = limiter
        .reset(&req(vec![d(&[("user", &fresh("never"))])]))
        .await
        .expect("reset of an empty window");
    assert_eq!(never[0].limits[0].state.used, 0);
    let after = limiter.inspect(&request).await.expect("inspect");
    assert!(
        after.iter().all(|u| u.limits[0].state.used == 0),
        "{after:?}"
    );
}

/// An empty domain and a request without descriptors are refused with the reason, and neither
/// call reaches a window.
async fn bad_requests_touch_nothing(t: &Target) {
    let limiter = limiter(t).await;
    let v = fresh("bad");
    assert_eq!(
        ask_one(&limiter, d(&[("user", &v)])).await.overall,
        Code::Ok
    );
    let empty_domain = request("", vec![d(&[("user", &v)])]);
    let no_descriptors = req(Vec::new());
    for (bad, reason) in [
        (&empty_domain, "domain must not be empty"),
        (&no_descriptors, "descriptor list must not be empty"),
    ] {
        for result in [limiter.inspect(bad).await, limiter.reset(bad).await] {
            match result {
                Err(InspectError::Invalid(err)) => {
                    assert!(err.to_string().contains(reason), "{err}")
                }
                other => panic!("{bad:?}: {other:?}"),
            }
        }
    }
    let still = inspect_one(&limiter, d(&[("user", &v)])).await;
    assert_eq!(still.limits[0].state.used, 1, "{still:?}");
}

/// On an injected clock every number is exact: a counter's usage is its weighted estimate and
/// a log's the entries still in the window, `remaining` is what a check answers, and the reset
/// is when the last recorded unit leaves.
async fn usage_follows_the_sliding_window(t: &Target) {
    // An epoch-aligned 10 s boundary.
    const START_MS: u64 = 1_700_000_040_000;
    let clock = ManualClock::new(START_MS);
    let limiter = Limiter::new(
        Arc::clone(&CONFIG),
        t.clocked_backend(&clock).await,
        Settings::default(),
    );
    let v = fresh("clocked");
    for key in ["short", "short_log"] {
        for _ in 0..4 {
            assert_eq!(ask_one(&limiter, d(&[(key, &v)])).await.overall, Code::Ok);
        }
    }
    clock.advance(5_000);
    assert_eq!(
        ask_one(&limiter, d(&[("short_log", &v)])).await.overall,
        Code::Ok
    );
    clock.advance(7_500);

    // Counter: 2.5 s into the next fixed window the first one's 4 weigh 3.
    let counter = inspect_one(&limiter, d(&[("short", &v)])).await;
    assert_eq!(
        counter.limits[0].state,
        WindowState {
            used: 3,
            remaining: 7,
            reset_ms: 7_500
        },
        "{counter:?}"
    );
    assert_eq!(units_left(&limiter, &[("short", &v)]).await, 7);
    // Log: only the hit of second 5 is still in the window; it leaves 2.5 s from now.
    let log = inspect_one(&limiter, d(&[("short_log", &v)])).await;
    assert_eq!(
        log.limits[0].state,
        WindowState {
            used: 1,
            remaining: 9,
            reset_ms: 2_500
        },
        "{log:?}"
    );
    assert_eq!(units_left(&limiter, &[("short_log", &v)]).await, 9);
}
