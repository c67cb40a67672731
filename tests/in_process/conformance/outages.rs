//! Limiter-level cases of a backend that fails: every limit answers its failure mode when the
//! store cannot be reached, within a bound, and decisions come back when it returns.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tollgate::config::FailureMode;
use tollgate::limiter::{Code, Limiter, Settings, Status};
use tollgate_testkit::cases;
use tollgate_testkit::requests::descriptor as d;
use tollgate_testkit::target::Target;

use super::limiter::{CONFIG, limiter};
use super::support::{TestLimiter, ask, ask_one, codes, fresh, req, units_left};

cases! {
    unreachable_backend_answers_each_failure_mode:
        [redis, redis_cluster, sharded_redis, sharded_redis_cluster];
    backend_outage_then_recovery: [redis, redis_cluster, leased_redis, leased_redis_cluster];
}

/// The production default `--backend-timeout`, used where failures are the point.
const OUTAGE_TIMEOUT: Duration = Duration::from_millis(50);
/// How long a failure-mode answer may take with [`OUTAGE_TIMEOUT`]: the point is that a call to
/// a dead backend ends, not how fast.
const OUTAGE_ANSWER_BOUND: Duration = Duration::from_secs(10);

/// Asserts that `limiter` answers the failure modes for `[fail_default, fail_allow, fail_deny]`
/// with `default` as the `--failure-mode`, within the bound, several times over.
async fn assert_failure_answers(limiter: &TestLimiter, default: FailureMode, v: &str) {
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

/// A limiter whose deadline is the production default, over a new backend instance of `t`.
async fn outage_limiter(t: &Target, failure_mode: FailureMode) -> TestLimiter {
    let settings = Settings {
        failure_mode,
        ..Settings::default()
    };
    let backend = t.backend_with_timeout(OUTAGE_TIMEOUT).await;
    Limiter::new(Arc::clone(&CONFIG), backend, settings)
}

/// With nothing listening where the backend should be, a limiter still starts and answers each
/// limit's failure_mode, whatever the default.
async fn unreachable_backend_answers_each_failure_mode(t: &Target) {
    let nowhere = t.unreachable();
    let v = fresh("nowhere");
    for default in [FailureMode::Allow, FailureMode::Deny] {
        let limiter = outage_limiter(&nowhere, default).await;
        assert_failure_answers(&limiter, default, &v).await;
    }
}

/// The store stops under limiters that were working: each limit answers its failure_mode, and
/// the same limiters answer for real once the store is back.
async fn backend_outage_then_recovery(t: &Target) {
    let mut outage = tokio::task::block_in_place(|| t.private());
    let lenient = outage_limiter(&outage, FailureMode::Allow).await;
    let strict = outage_limiter(&outage, FailureMode::Deny).await;

    // Working: a deny limit says OK only when the backend decided. (With the production
    // deadline a loaded machine may time a call out, which is what the failure mode is for.)
    let v = fresh("outage");
    until_decided(&strict, "fail_deny", &v, |s| s.code == Code::Ok).await;
    tokio::task::block_in_place(|| outage.stop());
    assert_failure_answers(&lenient, FailureMode::Allow, &v).await;
    assert_failure_answers(&strict, FailureMode::Deny, &v).await;

    // Back: the same limiters answer for real by themselves. A deny limit only says OK when the
    // backend decided, and an allow limit reports a count only then. (A 50 ms call that timed
    // out may still have been counted, hence "at most" below.)
    tokio::task::block_in_place(|| outage.restart());
    let w = fresh("recovered");
    let strict_status = until_decided(&strict, "fail_deny", &w, |s| s.code == Code::Ok).await;
    assert!(strict_status.remaining <= 4, "{}", t.name());
    let lenient_status = until_decided(&lenient, "fail_allow", &w, |s| s.remaining < 5).await;
    assert_eq!(lenient_status.code, Code::Ok);
    // The counts live in the store: another instance sees them.
    let observer = limiter(&outage, Settings::default()).await;
    for (key, status) in [
        ("fail_deny", &strict_status),
        ("fail_allow", &lenient_status),
    ] {
        let left = units_left(&observer, &[(key, &w)]).await;
        assert!(left <= status.remaining, "{}: {key}: {left}", t.name());
    }
}

/// Asks `limiter` about `key=value` until `decided` accepts the status (a minute at most).
async fn until_decided(
    limiter: &TestLimiter,
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
