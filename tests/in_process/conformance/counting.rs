//! Limiter-level cases of what a limit charges: every hit (`counting: all`, as envoyproxy/ratelimit
//! and Envoy's token quotas need) or only the admitted ones, chosen per limit over the flag; on
//! the wall clock, with the policy and helpers of [`super::limiter`].

use std::sync::Arc;

use tollgate::descriptor::Request;
use tollgate::limiter::{Code, Decision, Settings};
use tollgate_testkit::cases;
use tollgate_testkit::requests::{descriptor as d, with_addend};
use tollgate_testkit::target::Target;

use super::limiter::{COUNTER_AND_LOG, admitted_units, limiter, limiter_counting_all};
use super::support::{ask, ask_one, assert_one, codes, fresh, req, units_left};

cases! {
    token_quota_debits_are_charged_where_every_hit_counts: exact;
    counting_is_chosen_per_limit_over_the_flag: exact;
    counting_all_never_admits_more_than_the_limit: leased;
}

/// Envoy's token quota: a check (`hits_addend: 0`) on the request path, and after the response
/// an ordinary hit debiting the tokens spent, whose answer Envoy ignores. With 1000 tokens, 900
/// used and a response that spent 200, the debit does not fit but is charged, so the next check
/// is refused (where only admitted hits counted, it would pass and the quota would never bind).
async fn token_quota_debits_are_charged_where_every_hit_counts(t: &Target) {
    let limiter = limiter(t, Settings::default()).await;
    for suffix in COUNTER_AND_LOG {
        let key = format!("tokens{suffix}");
        let v = fresh("tokens");
        let check = || with_addend(d(&[(&key, &v)]), 0);
        let debit = |tokens| with_addend(d(&[(&key, &v)]), tokens);
        assert_one(&limiter, check(), (Code::Ok, 1000), &key).await;
        assert_one(&limiter, debit(900), (Code::Ok, 100), &key).await;
        assert_one(&limiter, check(), (Code::Ok, 100), &key).await;
        let refused = ask_one(&limiter, debit(200)).await;
        assert_eq!(
            (refused.overall, refused.statuses[0].remaining),
            (Code::OverLimit, 0),
            "{key}: 1100 of 1000 used"
        );
        assert_one(&limiter, check(), (Code::OverLimit, 0), &key).await;
        // A debit of any size is charged without overflow.
        assert_one(&limiter, debit(u64::MAX), (Code::OverLimit, 0), &key).await;
        assert_one(&limiter, check(), (Code::OverLimit, 0), &key).await;

        // Nothing of a rejected request is given back where every hit counts.
        let w = fresh("tokens");
        let decision = ask(
            &limiter,
            &req(vec![
                with_addend(d(&[(&key, &w)]), 10),
                d(&[("zero_day", &w)]),
            ]),
        )
        .await;
        assert_eq!(codes(&decision), [Code::Ok, Code::OverLimit]);
        assert_eq!(
            decision.statuses[0].remaining, 990,
            "{key}: kept, and reported so"
        );
        assert_eq!(units_left(&limiter, &[(&key, &w)]).await, 990, "{key}");

        // A 0 limit: checks pass until a refused hit is charged to it.
        let zero = format!("zero_day{suffix}");
        let all = limiter_counting_all(t).await;
        let check = || with_addend(d(&[(&zero, &w)]), 0);
        assert_one(&all, check(), (Code::Ok, 0), &zero).await;
        assert_one(&all, d(&[(&zero, &w)]), (Code::OverLimit, 0), &zero).await;
        assert_one(&all, check(), (Code::OverLimit, 0), &zero).await;
    }
}

/// A limit's own `counting` wins over `--counting`: `counting: admitted` gives a rejected
/// request's hit back even where every hit counts, and `--counting all` charges refusals of
/// limits without their own.
async fn counting_is_chosen_per_limit_over_the_flag(t: &Target) {
    let all = limiter_counting_all(t).await;
    let v = fresh("per-limit");
    let rejected = req(vec![
        d(&[("refunded", &v)]),
        d(&[("quota", &v)]),
        d(&[("zero_day", &v)]),
    ]);
    let decision = ask(&all, &rejected).await;
    assert_eq!(codes(&decision), [Code::Ok, Code::Ok, Code::OverLimit]);
    assert_eq!(decision.statuses[0].remaining, 10, "given back");
    assert_eq!(decision.statuses[1].remaining, 9, "kept");
    assert_eq!(units_left(&all, &[("refunded", &v)]).await, 10);
    assert_eq!(units_left(&all, &[("quota", &v)]).await, 9);
    // `quota` counts every hit under this flag: a refused debit is charged.
    assert_one(
        &all,
        with_addend(d(&[("quota", &v)]), 20),
        (Code::OverLimit, 0),
        "debit",
    )
    .await;
    assert_one(
        &all,
        with_addend(d(&[("quota", &v)]), 0),
        (Code::OverLimit, 0),
        "check",
    )
    .await;
    // `refunded` counts admitted hits only whatever the flag.
    assert_one(
        &all,
        with_addend(d(&[("refunded", &v)]), 20),
        (Code::OverLimit, 10),
        "x",
    )
    .await;
    assert_one(
        &all,
        with_addend(d(&[("refunded", &v)]), 0),
        (Code::Ok, 10),
        "y",
    )
    .await;
}

/// Where every hit counts, many concurrent callers on two instances still never get more than
/// the limit admitted; refused hits charged near the end may leave a unit or two unused.
async fn counting_all_never_admits_more_than_the_limit(t: &Target) {
    for suffix in COUNTER_AND_LOG {
        let first = Arc::new(limiter_counting_all(t).await);
        let second = if t.shares_store() {
            Arc::new(limiter_counting_all(t).await)
        } else {
            Arc::clone(&first)
        };
        let instances = [first, second];
        let key = format!("race{suffix}");
        let v = fresh("race-all");
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
        // The first refusal of a cost of at most 2 comes at 149 used (per shard, at its budget
        // less one), and nothing is admitted past a refusal charged on top of that.
        assert!(
            (148..=150).contains(&admitted),
            "{}: {key} admitted {admitted}",
            t.name()
        );
    }
}
