//! Limiter-level cases on the wall clock: `Request` in, `Decision` out, through
//! `Limiter::should_rate_limit` over each target's backend stack.
//!
//! Redis reads the wall clock (`TIME`), so the assertions are chosen not to depend on the
//! instant: counting uses hour- and day-long windows (an epoch-aligned boundary falling mid-test
//! leaves the estimate where it was, to within a fraction of a unit), reset times are checked
//! against ranges, and the exact numbers are kept for the log and for the long windows. Each case
//! uses descriptor values no other case uses.
//!
//! Cases that hold on `every` target, sharded ones included, check what was counted with
//! check-only probes against limits that split evenly over the forced shards: a sharded limit
//! reports one shard's remaining times the shard count, so it reads whole exactly when no unit
//! of it is taken.

use std::sync::{Arc, LazyLock};

use tollgate::config::{Config, MetaValue};
use tollgate::descriptor::{LimitOverride, Request, Unit};
use tollgate::limiter::{Code, Decision, LimiterError, Settings};
use tollgate::window::Counting;
use tollgate_testkit::cases;
use tollgate_testkit::requests::{descriptor as d, with_addend};
use tollgate_testkit::target::Target;

use super::support::{
    TestLimiter, ask, ask_one, assert_free, assert_one, codes, fresh, req, reset_s, retry_after,
    units_left,
};

cases! {
    statuses_follow_request_order: exact;
    no_limit_applies: leased;
    hits_addend_of_request_and_descriptor: exact;
    check_only_consumes_nothing: exact;
    cost_above_the_limit_is_over_with_the_full_window: leased;
    zero_requests_per_unit_rejects_everything: leased;
    shadow_descriptor_reports_ok_but_counts: exact;
    global_shadow_mode_changes_only_the_overall_code: exact;
    retry_after_is_the_largest_wait: exact;
    rejected_requests_consume_nothing: exact;
    concurrent_rejected_requests_leave_no_residue: leased;
    concurrent_instances_never_exceed_the_limit: leased;
    sharded_limit_stays_within_the_limit: leased;
    share_threshold_values_share_one_counter: leased;
    quota_descriptors_reject_only_when_all_are_over: leased;
    descriptor_limit_override_applies_to_any_descriptor: leased;
    invalid_requests_are_refused_and_count_nothing: leased;
    descriptor_without_entries_is_ok_without_a_limit: leased;
    global_quota_mode_rejects_only_when_every_descriptor_is_over: leased;
    dynamic_metadata_only_when_asked_in_the_reference_shape: leased;
}

/// Pairs of limits that differ only in their algorithm (`<name>` is the sliding window counter,
/// `<name>_log` the sliding window log), so a case can check both with the same numbers.
const POLICY: &str = r#"
domain: conformance
descriptors:
  - key: user
    rate_limit: { unit: hour, requests_per_unit: 5, name: per_user }
  - key: user_log
    rate_limit: { unit: hour, requests_per_unit: 5, algorithm: sliding_window_log }
  - key: quota
    rate_limit: { unit: day, requests_per_unit: 10 }
  - key: quota_log
    rate_limit: { unit: day, requests_per_unit: 10, algorithm: sliding_window_log }
  - key: login
    rate_limit: { window: 2h, requests_per_unit: 3, algorithm: sliding_window_log }
  - key: shadowed
    shadow_mode: true
    rate_limit: { unit: day, requests_per_unit: 1 }
  - key: zero
    rate_limit: { unit: second, requests_per_unit: 0 }
  - key: zero_log
    rate_limit: { unit: second, requests_per_unit: 0, algorithm: sliding_window_log }
  - key: zero_day
    rate_limit: { unit: day, requests_per_unit: 0 }
  - key: zero_day_log
    rate_limit: { unit: day, requests_per_unit: 0, algorithm: sliding_window_log }
  - key: free
    rate_limit: { unlimited: true }
  - key: allow
    value: internal
  - key: general
    rate_limit: { unit: day, requests_per_unit: 100, name: general }
  - key: specific
    rate_limit: { unit: day, requests_per_unit: 1, replaces: [{ name: general }] }
  - key: race
    rate_limit: { unit: day, requests_per_unit: 150 }
  - key: race_log
    rate_limit: { unit: day, requests_per_unit: 150, algorithm: sliding_window_log }
  - key: hot
    rate_limit: { unit: day, requests_per_unit: 100, shards: 4 }
  - key: hot_log
    rate_limit: { unit: day, requests_per_unit: 100, shards: 4, algorithm: sliding_window_log }
  - key: path
    value: /api/*
    share_threshold: true
    rate_limit: { unit: day, requests_per_unit: 2 }
  - key: quota_a
    quota_mode: true
    rate_limit: { unit: day, requests_per_unit: 1 }
  - key: quota_b
    quota_mode: true
    rate_limit: { unit: day, requests_per_unit: 2 }
  - key: fail_default
    rate_limit: { unit: hour, requests_per_unit: 5 }
  - key: fail_allow
    rate_limit: { unit: hour, requests_per_unit: 5, failure_mode: allow }
  - key: fail_deny
    rate_limit: { unit: hour, requests_per_unit: 5, failure_mode: deny }
  - key: tokens
    rate_limit: { unit: day, requests_per_unit: 1000, counting: all }
  - key: tokens_log
    rate_limit: { unit: day, requests_per_unit: 1000, counting: all, algorithm: sliding_window_log }
  - key: refunded
    rate_limit: { unit: day, requests_per_unit: 10, counting: admitted }
  - key: meta_a
    metadata: { service: { name: a }, team: payments }
    rate_limit: { unit: day, requests_per_unit: 1 }
  - key: meta_b
    metadata: { service: { name: b, tier: gold }, team: search }
    rate_limit: { unit: day, requests_per_unit: 2 }
"#;

pub(super) static CONFIG: LazyLock<Arc<Config>> = LazyLock::new(|| {
    Arc::new(Config::from_yaml("conformance.yaml", POLICY).expect("the test policy loads"))
});

const HOUR_S: u64 = 3_600;
const DAY_S: u64 = 86_400;

pub(super) const COUNTER_AND_LOG: [&str; 2] = ["", "_log"];

/// A limiter with the suite's policy over a new backend instance of `t`.
pub(super) async fn limiter(t: &Target, settings: Settings) -> TestLimiter {
    t.limiter(Arc::clone(&CONFIG), settings).await
}

/// A limiter where every hit counts unless a limit says otherwise (`--counting all`).
pub(super) async fn limiter_counting_all(t: &Target) -> TestLimiter {
    let settings = Settings {
        counting: Counting::All,
        ..Settings::default()
    };
    limiter(t, settings).await
}

/// Two tollgate instances sharing the store: two limiters over two backend instances on Redis;
/// on memory, where instances cannot share, one limiter used twice.
async fn two_instances(t: &Target) -> [Arc<TestLimiter>; 2] {
    let first = Arc::new(limiter(t, Settings::default()).await);
    let second = if t.shares_store() {
        Arc::new(limiter(t, Settings::default()).await)
    } else {
        Arc::clone(&first)
    };
    [first, second]
}

/// Runs `callers` concurrent tasks of `rounds` requests each, alternating between the two
/// instances: task `task` sends `plan(task, round)`, a request and the units it asks for, and
/// `check`s each decision. Answers the units of the requests admitted.
pub(super) async fn admitted_units(
    instances: &[Arc<TestLimiter>; 2],
    (callers, rounds): (usize, usize),
    plan: impl Fn(usize, usize) -> (Request, u64) + Send + Sync + 'static,
    check: impl Fn(&Request, &Decision) + Send + Sync + 'static,
) -> u64 {
    let (plan, check) = (Arc::new(plan), Arc::new(check));
    let tasks: Vec<_> = (0..callers)
        .map(|task| {
            let limiter = Arc::clone(&instances[task % 2]);
            let (plan, check) = (Arc::clone(&plan), Arc::clone(&check));
            tokio::spawn(async move {
                let mut admitted = 0;
                for round in 0..rounds {
                    let (request, units) = plan(task, round);
                    let decision = ask(&limiter, &request).await;
                    check(&request, &decision);
                    if decision.overall == Code::Ok {
                        admitted += units;
                    }
                }
                admitted
            })
        })
        .collect();
    let mut admitted = 0;
    for task in tasks {
        admitted += task.await.expect("task finished");
    }
    admitted
}

/// Statuses come back in request order, each with its limit, remaining and reset; once both
/// limits are full the request is over with the rejected descriptors marked.
async fn statuses_follow_request_order(t: &Target) {
    let limiter = limiter(t, Settings::default()).await;
    let v = fresh("order");
    let request = req(vec![
        d(&[("nothing", &v)]),
        d(&[("user", &v)]),
        d(&[("free", &v)]),
        d(&[("allow", "internal")]),
        d(&[("user_log", &v)]),
        d(&[("user", &v), ("deeper", "x")]),
    ]);
    for round in 0..5u32 {
        let decision = ask(&limiter, &request).await;
        assert_eq!(decision.overall, Code::Ok, "round {round}: {decision:?}");
        assert_eq!(codes(&decision), vec![Code::Ok; 6]);
        assert!(decision.response_headers.is_empty());
        assert_free(&decision, 0, "unmatched");
        assert_free(&decision, 3, "allow-listed");
        assert_free(&decision, 5, "deeper than the config");
        assert_eq!(decision.statuses[2].remaining, u32::MAX, "unlimited");
        assert_free(&decision, 2, "unlimited");

        let user = &decision.statuses[1];
        let limit = user.limit.as_ref().expect("user's limit");
        assert_eq!(
            (limit.requests_per_unit, limit.unit, limit.name.as_deref()),
            (5, Some(Unit::Hour), Some("per_user"))
        );
        assert_eq!(user.remaining, 4 - round, "round {round}");
        // The counter's hits leave with the end of the next fixed hour.
        let user_reset = reset_s(&decision, 1);
        assert!(
            (HOUR_S + 1..=2 * HOUR_S).contains(&user_reset),
            "{user_reset}"
        );

        let user_log = &decision.statuses[4];
        let limit = user_log.limit.as_ref().expect("user_log's limit");
        assert_eq!(
            (limit.requests_per_unit, limit.unit, limit.name.as_deref()),
            (5, Some(Unit::Hour), None)
        );
        assert_eq!(user_log.remaining, 4 - round, "round {round}");
        // The newest entry is this hit: the quota is whole one window from now.
        assert_eq!(reset_s(&decision, 4), HOUR_S);
    }
    let decision = ask(&limiter, &request).await;
    assert_eq!(decision.overall, Code::OverLimit);
    assert_eq!(
        codes(&decision),
        [
            Code::Ok,
            Code::OverLimit,
            Code::Ok,
            Code::Ok,
            Code::OverLimit,
            Code::Ok
        ]
    );
    assert_eq!(decision.statuses[1].remaining, 0);
    assert_eq!(decision.statuses[4].remaining, 0);
    assert_eq!(decision.statuses[2].remaining, u32::MAX);
    // Counter: 5 in this hour fit again a fifth into the next one (or sooner, had the hour
    // turned mid-test). Log: when the first hit of this test leaves the hour.
    let user_wait = reset_s(&decision, 1);
    let log_wait = reset_s(&decision, 4);
    assert!((1..=HOUR_S + 720).contains(&user_wait), "{user_wait}");
    assert!((HOUR_S - 60..=HOUR_S).contains(&log_wait), "{log_wait}");
    assert_eq!(retry_after(&decision), Some(user_wait.max(log_wait)));
}

/// Unknown domains, unmatched descriptors, allow-list entries, unlimited and replaced limits
/// answer OK without a limit and count nothing.
async fn no_limit_applies(t: &Target) {
    let limiter = limiter(t, Settings::default()).await;
    let v = fresh("nolimit");

    let mut foreign = req(vec![d(&[("quota", &v)]), d(&[("zero", &v)])]);
    foreign.domain = "elsewhere".into();
    for _ in 0..10 {
        let decision = ask(&limiter, &foreign).await;
        assert_eq!(decision.overall, Code::Ok);
        assert_free(&decision, 0, "unknown domain");
        assert_free(&decision, 1, "unknown domain");
        assert!(decision.response_headers.is_empty());
    }
    assert_eq!(
        units_left(&limiter, &[("quota", &v)]).await,
        10,
        "nothing was counted under the same descriptor while its domain was unknown"
    );

    for _ in 0..20 {
        let decision = ask(
            &limiter,
            &req(vec![
                d(&[("free", &v)]),
                d(&[("allow", "internal")]),
                d(&[("allow", &v)]),
                d(&[("nothing", &v)]),
            ]),
        )
        .await;
        assert_eq!(decision.overall, Code::Ok);
        assert_eq!(decision.statuses[0].remaining, u32::MAX, "unlimited");
        for (index, what) in [
            "unlimited",
            "allow-listed",
            "unmatched value",
            "unmatched key",
        ]
        .into_iter()
        .enumerate()
        {
            assert_free(&decision, index, what);
        }
    }

    let both = req(vec![d(&[("general", &v)]), d(&[("specific", &v)])]);
    let decision = ask(&limiter, &both).await;
    assert_eq!(decision.overall, Code::Ok);
    assert_free(&decision, 0, "replaced");
    assert_eq!(decision.statuses[1].remaining, 0);
    let decision = ask(&limiter, &both).await;
    assert_eq!(decision.overall, Code::OverLimit);
    assert_eq!(codes(&decision), [Code::Ok, Code::OverLimit]);
    assert_free(&decision, 0, "replaced");
    // Alone, general applies, and the replaced hits were never counted.
    let alone = ask_one(&limiter, with_addend(d(&[("general", &v)]), 0)).await;
    assert_eq!(alone.statuses[0].remaining, 100, "{alone:?}");
    assert_eq!(
        alone.statuses[0]
            .limit
            .as_ref()
            .map(|l| l.requests_per_unit),
        Some(100)
    );
}

/// The descriptor's hits_addend wins over the request's; the request's 0 counts as 1; a cost
/// of exactly the limit fits.
async fn hits_addend_of_request_and_descriptor(t: &Target) {
    let limiter = limiter(t, Settings::default()).await;
    for suffix in COUNTER_AND_LOG {
        let key = format!("quota{suffix}");
        let v = fresh("addend");
        let mut request = req(vec![d(&[(&key, &v)])]);
        request.hits_addend = 4;
        assert_eq!(ask(&limiter, &request).await.statuses[0].remaining, 6);
        request.descriptors = vec![with_addend(d(&[(&key, &v)]), 5)];
        assert_eq!(ask(&limiter, &request).await.statuses[0].remaining, 1);
        request.descriptors = vec![with_addend(d(&[(&key, &v)]), 2)];
        let decision = ask(&limiter, &request).await;
        assert_eq!(decision.overall, Code::OverLimit, "{key}");
        assert_eq!(decision.statuses[0].remaining, 1, "{key}: 2 did not count");
        request.descriptors = vec![with_addend(d(&[(&key, &v)]), 1)];
        let decision = ask(&limiter, &request).await;
        assert_eq!(decision.overall, Code::Ok, "{key}");
        assert_eq!(decision.statuses[0].remaining, 0);

        let w = fresh("addend");
        assert_eq!(
            ask_one(&limiter, d(&[(&key, &w)])).await.statuses[0].remaining,
            9,
            "{key}: a request hits_addend of 0 is 1"
        );
        assert_one(
            &limiter,
            with_addend(d(&[(&key, &fresh("addend"))]), 10),
            (Code::Ok, 0),
            &format!("{key}: a cost of exactly the limit fits"),
        )
        .await;
    }
}

/// A descriptor hits_addend of 0 checks without consuming: OK unless usage is above the limit,
/// so a full limit still answers OK (nothing left).
async fn check_only_consumes_nothing(t: &Target) {
    let limiter = limiter(t, Settings::default()).await;
    for suffix in COUNTER_AND_LOG {
        let key = format!("quota{suffix}");
        let v = fresh("check");
        let probe = || with_addend(d(&[(&key, &v)]), 0);
        for _ in 0..20 {
            assert_one(&limiter, probe(), (Code::Ok, 10), &key).await;
        }
        ask_one(&limiter, with_addend(d(&[(&key, &v)]), 9)).await;
        for _ in 0..5 {
            let what = format!("{key}: one unit left");
            assert_one(&limiter, probe(), (Code::Ok, 1), &what).await;
        }
        let what = format!("{key}: the probes left the last unit");
        assert_one(&limiter, d(&[(&key, &v)]), (Code::Ok, 0), &what).await;
        for _ in 0..5 {
            let what = format!("{key}: full is not over");
            assert_one(&limiter, probe(), (Code::Ok, 0), &what).await;
        }
        assert_one(&limiter, d(&[(&key, &v)]), (Code::OverLimit, 0), &key).await;
    }
}

/// A cost above the limit can never fit: OVER_LIMIT with the full window, no overflow for
/// u32::MAX / u64::MAX, and nothing consumed.
async fn cost_above_the_limit_is_over_with_the_full_window(t: &Target) {
    let limiter = limiter(t, Settings::default()).await;
    for suffix in COUNTER_AND_LOG {
        let key = format!("quota{suffix}");
        let v = fresh("big");
        for addend in [11, u64::from(u32::MAX), u64::MAX - 1, u64::MAX] {
            let decision = ask_one(&limiter, with_addend(d(&[(&key, &v)]), addend)).await;
            assert_eq!(decision.overall, Code::OverLimit, "{key} {addend}");
            assert_eq!(decision.statuses[0].remaining, 10, "{key} {addend}");
            assert_eq!(reset_s(&decision, 0), DAY_S, "{key} {addend}");
            assert_eq!(retry_after(&decision), Some(DAY_S));
        }
        let mut request = req(vec![d(&[(&key, &v)])]);
        request.hits_addend = u32::MAX;
        let decision = ask(&limiter, &request).await;
        assert_eq!(decision.overall, Code::OverLimit, "{key}");
        assert_eq!(decision.statuses[0].remaining, 10);
        assert_eq!(reset_s(&decision, 0), DAY_S);
        assert_eq!(
            units_left(&limiter, &[(&key, &v)]).await,
            10,
            "{key}: none of those consumed anything"
        );
    }
}

/// A limit of 0 rejects every hit with the full window; a check passes until something has been
/// charged to it (see `token_quota_debits_are_charged_where_every_hit_counts`), as
/// envoyproxy/ratelimit answers it.
async fn zero_requests_per_unit_rejects_everything(t: &Target) {
    let limiter = limiter(t, Settings::default()).await;
    for suffix in COUNTER_AND_LOG {
        let key = format!("zero{suffix}");
        let v = fresh("zero");
        for _ in 0..3 {
            let decision = ask_one(&limiter, d(&[(&key, &v)])).await;
            assert_eq!(decision.overall, Code::OverLimit, "{key}");
            assert_eq!(decision.statuses[0].remaining, 0);
            assert_eq!(reset_s(&decision, 0), 1, "{key}: a one-second window");
            assert_eq!(retry_after(&decision), Some(1));
            let check = ask_one(&limiter, with_addend(d(&[(&key, &v)]), 0)).await;
            assert_eq!(
                (check.overall, check.statuses[0].remaining),
                (Code::Ok, 0),
                "{key}: nothing was charged, so nothing is over"
            );
        }
    }
}

/// A shadow descriptor reports OK but is counted like any other.
async fn shadow_descriptor_reports_ok_but_counts(t: &Target) {
    let limiter = limiter(t, Settings::default()).await;
    let v = fresh("shadow");
    assert_one(
        &limiter,
        d(&[("shadowed", &v)]),
        (Code::Ok, 0),
        "the first hit",
    )
    .await;
    for _ in 0..3 {
        let decision = ask_one(&limiter, d(&[("shadowed", &v)])).await;
        assert_eq!(decision.overall, Code::Ok);
        assert_eq!(decision.statuses[0].code, Code::Ok);
        assert_eq!(
            decision.statuses[0].remaining, 0,
            "the first hit is counted"
        );
        assert!(decision.response_headers.is_empty());
    }
    // A request over only in shadow is not rejected: its other hits stay counted.
    let w = fresh("shadow");
    let decision = ask(
        &limiter,
        &req(vec![d(&[("shadowed", &v)]), d(&[("quota", &w)])]),
    )
    .await;
    assert_eq!(decision.overall, Code::Ok);
    assert_eq!(decision.statuses[1].remaining, 9);
    assert_eq!(
        ask_one(&limiter, d(&[("quota", &w)])).await.statuses[0].remaining,
        8
    );
}

/// `--shadow-mode` turns the overall code OK and changes nothing else: statuses stay, and the
/// rejected request's hits are still given back.
async fn global_shadow_mode_changes_only_the_overall_code(t: &Target) {
    let shadow = Settings {
        shadow_mode: true,
        ..Settings::default()
    };
    let limiter = limiter(t, shadow).await;
    for suffix in COUNTER_AND_LOG {
        let user_key = format!("user{suffix}");
        let quota_key = format!("quota{suffix}");
        let v = fresh("globalshadow");
        for expected in (0..5).rev() {
            let decision = ask_one(&limiter, d(&[(&user_key, &v)])).await;
            assert_eq!(decision.statuses[0].remaining, expected);
        }
        for _ in 0..3 {
            let decision = ask(
                &limiter,
                &req(vec![d(&[(&quota_key, &v)]), d(&[(&user_key, &v)])]),
            )
            .await;
            assert_eq!(decision.overall, Code::Ok, "{suffix}");
            assert_eq!(codes(&decision), [Code::Ok, Code::OverLimit], "{suffix}");
            // Its hit was given back: what is left after that.
            assert_eq!(decision.statuses[0].remaining, 10);
            assert!(decision.response_headers.is_empty());
        }
        assert_eq!(
            ask_one(&limiter, d(&[(&quota_key, &v)])).await.statuses[0].remaining,
            9,
            "{suffix}: counting is as without shadow mode"
        );
    }
}

/// `retry-after` is the largest wait among the descriptors over, only on OVER_LIMIT, and only
/// with `--retry-after-header`.
async fn retry_after_is_the_largest_wait(t: &Target) {
    let limiter = limiter(t, Settings::default()).await;
    let v = fresh("retry");
    for _ in 0..3 {
        let decision = ask_one(&limiter, d(&[("login", &v)])).await;
        assert!(decision.response_headers.is_empty(), "{decision:?}");
    }
    for _ in 0..5 {
        ask_one(&limiter, d(&[("user", &v)])).await;
    }
    let decision = ask(
        &limiter,
        &req(vec![
            d(&[("user", &v)]),
            d(&[("login", &v)]),
            d(&[("zero", &v)]),
            d(&[("quota", &v)]),
        ]),
    )
    .await;
    assert_eq!(
        codes(&decision),
        [Code::OverLimit, Code::OverLimit, Code::OverLimit, Code::Ok]
    );
    let user_wait = reset_s(&decision, 0);
    let login_wait = reset_s(&decision, 1);
    assert!((1..=HOUR_S + 720).contains(&user_wait), "{user_wait}");
    // The 2 h log frees up when its first hit leaves: longer than the counter ever waits.
    assert!(
        (2 * HOUR_S - 60..=2 * HOUR_S).contains(&login_wait),
        "{login_wait}"
    );
    assert_eq!(reset_s(&decision, 2), 1);
    assert_eq!(retry_after(&decision), Some(login_wait));
    assert_eq!(
        decision.statuses[1].limit.as_ref().map(|l| l.unit),
        Some(None),
        "a 2 h window is no whole unit"
    );

    let quiet = Settings {
        retry_after_header: false,
        ..Settings::default()
    };
    let quiet = self::limiter(t, quiet).await;
    // (zero is over on every store, memory's separate one included)
    let decision = ask_one(&quiet, d(&[("zero", &v)])).await;
    assert_eq!(decision.overall, Code::OverLimit);
    assert!(decision.response_headers.is_empty(), "{decision:?}");
}

/// A rejected request consumes nothing: the descriptor that is over does not count, and what
/// the others took (sharded limits included) is given back; their statuses report what is left
/// after that.
async fn rejected_requests_consume_nothing(t: &Target) {
    let limiter = limiter(t, Settings::default()).await;
    for suffix in COUNTER_AND_LOG {
        let (user, hot, zero) = (
            format!("user{suffix}"),
            format!("hot{suffix}"),
            format!("zero{suffix}"),
        );
        let v = fresh("refund");
        let request = req(vec![
            d(&[(&user, &v)]),
            d(&[(&hot, &v)]),
            d(&[(&zero, &v)]),
            with_addend(d(&[("quota", &v)]), 3),
        ]);
        for round in 0..10 {
            let decision = ask(&limiter, &request).await;
            assert_eq!(decision.overall, Code::OverLimit, "{suffix} round {round}");
            assert_eq!(
                codes(&decision),
                [Code::Ok, Code::Ok, Code::OverLimit, Code::Ok]
            );
            // Every round sees the counts the previous rounds gave back, and reports them.
            assert_eq!(decision.statuses[0].remaining, 5, "{suffix} round {round}");
            assert_eq!(
                decision.statuses[1].remaining, 100,
                "{suffix} round {round}"
            );
            assert_eq!(decision.statuses[3].remaining, 10, "{suffix} round {round}");
        }
        assert_eq!(
            ask_one(&limiter, d(&[(&user, &v)])).await.statuses[0].remaining,
            4,
            "{suffix}"
        );
        assert_eq!(units_left(&limiter, &[("quota", &v)]).await, 10, "{suffix}");
        // Each probe lands on a random shard: every shard got its hits back.
        for _ in 0..12 {
            assert_eq!(units_left(&limiter, &[(&hot, &v)]).await, 100, "{suffix}");
        }
    }
}

/// Refunds hold under concurrency: half the requests carry an always-over descriptor, and only
/// the other half may keep hits, exactly the limit of them in all.
async fn concurrent_rejected_requests_leave_no_residue(t: &Target) {
    for suffix in COUNTER_AND_LOG {
        let instances = two_instances(t).await;
        let key = format!("quota{suffix}");
        let v = fresh("concurrent-refund");
        let (plan_key, plan_v) = (key.clone(), v.clone());
        let plan = move |task: usize, round: usize| {
            let mut descriptors = vec![d(&[(&plan_key, &plan_v)])];
            if (task + round).is_multiple_of(2) {
                descriptors.push(d(&[("zero", &plan_v)]));
            }
            (req(descriptors), 1)
        };
        let doomed_are_over = |request: &Request, decision: &Decision| {
            if request.descriptors.len() == 2 {
                assert_eq!(decision.overall, Code::OverLimit, "{decision:?}");
            }
        };
        let admitted = admitted_units(&instances, (16, 40), plan, doomed_are_over).await;
        if t.leases() {
            // A unit released back into an instance's slice stays with that instance until
            // its lease ends: each of the two may end holding one (slices of a 10-per-hour
            // limit are one unit).
            assert!(
                (8..=10).contains(&admitted),
                "{}: {key}: {admitted}",
                t.name()
            );
        } else {
            assert_eq!(admitted, 10, "{}: {key}", t.name());
        }
        let probe = with_addend(d(&[(&key, &v)]), 0);
        assert_one(&instances[0], probe, (Code::Ok, 0), &key).await;
        assert_one(&instances[0], d(&[(&key, &v)]), (Code::OverLimit, 0), &key).await;
    }
}

/// Many concurrent callers on two instances sharing the store never admit more than the limit;
/// with a day-long window both algorithms end exactly full.
async fn concurrent_instances_never_exceed_the_limit(t: &Target) {
    for suffix in COUNTER_AND_LOG {
        let instances = two_instances(t).await;
        let key = format!("race{suffix}");
        let v = fresh("race");
        let (plan_key, plan_v) = (key.clone(), v.clone());
        let plan = move |task: usize, round: usize| {
            let cost = if (task + round).is_multiple_of(5) {
                2
            } else {
                1
            };
            let request = req(vec![with_addend(d(&[(&plan_key, &plan_v)]), cost)]);
            (request, cost)
        };
        let within = |_: &Request, decision: &Decision| {
            assert!(decision.statuses[0].remaining <= 150, "{decision:?}");
        };
        let admitted = admitted_units(&instances, (32, 25), plan, within).await;
        // 800 attempts at 150 units: never more, and the limit ends full.
        assert_eq!(admitted, 150, "{}: {key}", t.name());
        let probe = with_addend(d(&[(&key, &v)]), 0);
        assert_one(&instances[1], probe, (Code::Ok, 0), &key).await;
        assert_one(&instances[1], d(&[(&key, &v)]), (Code::OverLimit, 0), &key).await;
    }
}

/// A limit with `shards: 4` never admits more than its limit and, under uniform load from two
/// instances, uses at least 90 % of it.
async fn sharded_limit_stays_within_the_limit(t: &Target) {
    for suffix in COUNTER_AND_LOG {
        let instances = two_instances(t).await;
        let key = format!("hot{suffix}");
        let v = fresh("sharded");
        let (plan_key, plan_v) = (key.clone(), v.clone());
        let plan = move |_: usize, _: usize| (req(vec![d(&[(&plan_key, &plan_v)])]), 1);
        let within = |_: &Request, decision: &Decision| {
            let status = &decision.statuses[0];
            assert!(status.remaining <= 100, "{decision:?}");
            assert_eq!(status.limit.as_ref().map(|l| l.shards), Some(4));
        };
        let admitted = admitted_units(&instances, (16, 25), plan, within).await;
        assert!(admitted <= 100, "{}: {key} admitted {admitted}", t.name());
        assert!(admitted >= 90, "{}: {key} admitted {admitted}", t.name());
    }
}

/// A wildcard value with `share_threshold` gives every matching value one shared counter.
async fn share_threshold_values_share_one_counter(t: &Target) {
    let limiter = limiter(t, Settings::default()).await;
    for (path, expected) in [
        ("/api/a", Code::Ok),
        ("/api/b", Code::Ok),
        ("/api/c", Code::OverLimit),
    ] {
        let decision = ask_one(&limiter, d(&[("path", path)])).await;
        assert_eq!(decision.overall, expected, "{path}: {decision:?}");
    }
}

/// Quota descriptors make a request OVER_LIMIT only when all of them are over.
async fn quota_descriptors_reject_only_when_all_are_over(t: &Target) {
    let limiter = limiter(t, Settings::default()).await;
    let v = fresh("quota-mode");
    let both = req(vec![d(&[("quota_a", &v)]), d(&[("quota_b", &v)])]);
    assert_eq!(ask(&limiter, &both).await.overall, Code::Ok);
    let decision = ask(&limiter, &both).await;
    assert_eq!(codes(&decision), [Code::OverLimit, Code::Ok]);
    assert_eq!(decision.overall, Code::Ok);
    let decision = ask(&limiter, &both).await;
    assert_eq!(codes(&decision), [Code::OverLimit, Code::OverLimit]);
    assert_eq!(decision.overall, Code::OverLimit);
}

/// A descriptor's own `limit` applies to any descriptor of a known domain, matched or not, and
/// an unknown domain ignores it.
async fn descriptor_limit_override_applies_to_any_descriptor(t: &Target) {
    let limiter = limiter(t, Settings::default()).await;
    let v = fresh("override");
    let mut overridden = d(&[("user", &v)]);
    overridden.limit = Some(LimitOverride {
        requests_per_unit: 2,
        unit: Some(Unit::Hour),
    });
    let mut unmatched = d(&[("anything", &v)]);
    unmatched.limit = Some(LimitOverride {
        requests_per_unit: 1,
        unit: Some(Unit::Day),
    });
    let decision = ask(&limiter, &req(vec![overridden.clone(), unmatched.clone()])).await;
    let first = decision.statuses[0].limit.as_ref().expect("override limit");
    assert_eq!((first.requests_per_unit, first.unit), (2, Some(Unit::Hour)));
    assert_eq!(decision.statuses[1].remaining, 0);
    assert_eq!(
        codes(&ask(&limiter, &req(vec![unmatched])).await),
        [Code::OverLimit]
    );
    let mut foreign = req(vec![overridden]);
    foreign.domain = "elsewhere".into();
    assert_free(&ask(&limiter, &foreign).await, 0, "an unknown domain");
}

/// A request that breaks the protocol's rules is refused with INVALID_ARGUMENT and counts nothing,
/// not even for its valid descriptors.
async fn invalid_requests_are_refused_and_count_nothing(t: &Target) {
    let limiter = limiter(t, Settings::default()).await;
    let v = fresh("invalid");
    let long = "x".repeat(2000);
    for (broken, message) in [
        (d(&[("", "no key")]), "empty key"),
        (d(&[("quota", &long)]), "longer than"),
    ] {
        let request = req(vec![d(&[("quota", &v)]), broken]);
        for _ in 0..10 {
            match limiter.should_rate_limit(&request).await {
                Err(LimiterError::InvalidArgument(text)) => {
                    assert!(text.contains(message), "{text}")
                }
                other => panic!("expected INVALID_ARGUMENT, got {other:?}"),
            }
        }
    }
    assert_eq!(units_left(&limiter, &[("quota", &v)]).await, 10);
}

/// A descriptor with no entries is answered OK with no limit, as envoyproxy/ratelimit answers
/// it (Envoy never sends one, other clients do); with its own `limit` it is limited by that, on
/// one counter for the whole domain.
async fn descriptor_without_entries_is_ok_without_a_limit(t: &Target) {
    let limiter = limiter(t, Settings::default()).await;
    let v = fresh("empty");
    for round in 0..3 {
        let decision = ask(&limiter, &req(vec![d(&[]), d(&[("quota", &v)])])).await;
        assert_eq!(decision.overall, Code::Ok);
        assert_free(&decision, 0, "no entries");
        assert_eq!(decision.statuses[0].remaining, 0);
        assert_eq!(codes(&decision), [Code::Ok, Code::Ok], "round {round}");
    }
    let mut limited = d(&[]);
    limited.limit = Some(LimitOverride {
        requests_per_unit: 1,
        unit: Some(Unit::Day),
    });
    // An unknown domain limits nothing, overrides included.
    let mut foreign = req(vec![limited.clone()]);
    foreign.domain = fresh("empty-domain").into();
    for _ in 0..2 {
        assert_free(&ask(&limiter, &foreign).await, 0, "unknown domain");
    }
    let first = ask(&limiter, &req(vec![limited.clone(), d(&[("quota", &v)])])).await;
    assert_eq!(codes(&first), [Code::Ok, Code::Ok]);
    assert_eq!(first.statuses[0].remaining, 0);
    let limit = first.statuses[0]
        .limit
        .as_ref()
        .expect("the override applies");
    assert_eq!((limit.requests_per_unit, limit.unit), (1, Some(Unit::Day)));
    assert_eq!(
        codes(&ask(&limiter, &req(vec![limited])).await),
        [Code::OverLimit]
    );
}

/// `--quota-mode` treats every descriptor as a quota descriptor: a request is rejected only when
/// every descriptor that is not unlimited is over, and one without a limit never is.
async fn global_quota_mode_rejects_only_when_every_descriptor_is_over(t: &Target) {
    let settings = Settings {
        quota_mode: true,
        ..Settings::default()
    };
    let limiter = limiter(t, settings).await;
    let v = fresh("global-quota");
    let decision = ask(
        &limiter,
        &req(vec![d(&[("zero_day", &v)]), d(&[("quota", &v)])]),
    )
    .await;
    assert_eq!(codes(&decision), [Code::OverLimit, Code::Ok]);
    assert_eq!(decision.overall, Code::Ok, "one passed");
    assert!(decision.response_headers.is_empty(), "{decision:?}");
    let decision = ask(
        &limiter,
        &req(vec![d(&[("zero_day", &v)]), d(&[("nothing", &v)])]),
    )
    .await;
    assert_eq!(
        decision.overall,
        Code::Ok,
        "no limit is a quota that passes"
    );
    let decision = ask(
        &limiter,
        &req(vec![
            d(&[("zero_day", &v)]),
            d(&[("zero_day_log", &v)]),
            d(&[("free", &v)]),
        ]),
    )
    .await;
    assert_eq!(
        codes(&decision),
        [Code::OverLimit, Code::OverLimit, Code::Ok]
    );
    assert_eq!(
        decision.overall,
        Code::OverLimit,
        "unlimited does not count"
    );
    assert!(retry_after(&decision).is_some());
}

/// Dynamic metadata comes only with `--response-dynamic-metadata`, in envoyproxy/ratelimit's
/// shape, with the merged `metadata` of the limits that passed (first writer wins, maps merged).
async fn dynamic_metadata_only_when_asked_in_the_reference_shape(t: &Target) {
    let v = fresh("meta");
    let request = {
        let mut request = req(vec![
            d(&[("meta_a", &v)]),
            with_addend(d(&[("meta_b", &v)]), 1),
            d(&[("nothing", &v)]),
        ]);
        request.hits_addend = 1;
        request
    };
    let quiet = limiter(t, Settings::default()).await;
    let w = fresh("meta");
    let elsewhere = req(vec![d(&[("meta_a", &w)]), d(&[("meta_b", &w)])]);
    assert_eq!(ask(&quiet, &elsewhere).await.dynamic_metadata, None);

    let settings = Settings {
        response_dynamic_metadata: true,
        ..Settings::default()
    };
    let limiter = limiter(t, settings).await;
    let s = |text: &str| MetaValue::String(text.to_string());
    let map = |fields: Vec<(&str, MetaValue)>| {
        MetaValue::Map(
            fields
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect(),
        )
    };
    let expected = |metadata: MetaValue| {
        map(vec![
            ("domain", s("conformance")),
            (
                "descriptors",
                MetaValue::List(vec![
                    map(vec![(
                        "entries",
                        MetaValue::List(vec![s(&format!("meta_a={v}"))]),
                    )]),
                    map(vec![
                        ("entries", MetaValue::List(vec![s(&format!("meta_b={v}"))])),
                        ("hitsAddend", MetaValue::Number(1.0)),
                    ]),
                    map(vec![(
                        "entries",
                        MetaValue::List(vec![s(&format!("nothing={v}"))]),
                    )]),
                ]),
            ),
            ("hitsAddend", MetaValue::Number(1.0)),
            ("metadata", metadata),
        ])
    };
    // Both pass: a's values win, maps merge.
    let decision = ask(&limiter, &request).await;
    assert_eq!(codes(&decision), [Code::Ok, Code::Ok, Code::Ok]);
    let both = map(vec![
        ("service", map(vec![("name", s("a")), ("tier", s("gold"))])),
        ("team", s("payments")),
    ]);
    assert_eq!(decision.dynamic_metadata, Some(expected(both)));
    // meta_a's only unit is taken: it is over, so only meta_b's metadata is merged, and the
    // rejected request still carries metadata, and says which limit refused.
    let decision = ask(&limiter, &request).await;
    assert_eq!(codes(&decision), [Code::OverLimit, Code::Ok, Code::Ok]);
    assert_eq!(decision.overall, Code::OverLimit);
    let only_b = map(vec![
        ("service", map(vec![("name", s("b")), ("tier", s("gold"))])),
        ("team", s("search")),
    ]);
    // tollgate adds which limit refused: meta_a's, named by its full key as it has no name.
    let MetaValue::Map(mut fields) = expected(only_b) else {
        unreachable!("the expected metadata is a map");
    };
    fields.push((
        "overLimit".into(),
        MetaValue::List(vec![map(vec![
            ("descriptorIndex", MetaValue::Number(0.0)),
            ("name", s("conformance.meta_a")),
        ])]),
    ));
    assert_eq!(decision.dynamic_metadata, Some(MetaValue::Map(fields)));
}
