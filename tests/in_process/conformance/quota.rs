//! The limiter's RLQS door ([`Limiter::reserve`], [`Limiter::charge_admitted`]) on every
//! backend and mode: a slice charges the counters RLS charges, all limits of a descriptor or
//! none; what does not fit is refused with what is left; buckets no limit governs are free;
//! what a client admitted on its own is charged even over the limit.

use std::sync::{Arc, LazyLock};

use tollgate::config::{Config, Limit};
use tollgate::descriptor::{Descriptor, Entry};
use tollgate::limiter::{Code, Quota, Settings};
use tollgate_testkit::cases;
use tollgate_testkit::requests::{descriptor as d, with_addend};
use tollgate_testkit::target::Target;

use super::support::{DOMAIN, TestLimiter, ask_one, fresh};

cases! {
    a_slice_charges_what_rls_charges: [memory, redis, redis_cluster, leased_redis];
    a_slice_that_does_not_fit_is_refused_with_what_is_left: [memory, redis, redis_cluster, leased_redis];
    a_slice_of_several_limits_charges_all_or_none: [memory, redis, redis_cluster, leased_redis];
    buckets_without_a_limit_are_free: [memory, redis];
    what_a_client_admitted_alone_is_charged_even_over_the_limit: [memory, redis, redis_cluster, leased_redis];
}

const POLICY: &str = r#"
domain: conformance
descriptors:
  - key: user
    rate_limit: { unit: hour, requests_per_unit: 10, algorithm: sliding_window_log }
  - key: counted
    rate_limit: { unit: hour, requests_per_unit: 10 }
  - key: pair
    rate_limits:
      - { unit: hour, requests_per_unit: 4, name: burst }
      - { unit: day, requests_per_unit: 6, name: sustained, algorithm: sliding_window_log }
  - key: vip
    rate_limit: { unlimited: true }
  - key: shadowed
    shadow_mode: true
    rate_limit: { unit: hour, requests_per_unit: 1 }
  - key: tenant
    descriptors:
      - key: user
        rate_limit: { unit: hour, requests_per_unit: 2 }
"#;

static CONFIG: LazyLock<Arc<Config>> = LazyLock::new(|| {
    Arc::new(Config::from_yaml("quota.yaml", POLICY).expect("the test policy loads"))
});

async fn limiter(t: &Target) -> TestLimiter {
    t.limiter(Arc::clone(&CONFIG), Settings::default()).await
}

fn bucket(entries: &[(&str, &str)]) -> Descriptor {
    d(entries)
}

async fn slice(limiter: &TestLimiter, descriptor: &Descriptor, units: u64) -> Quota {
    limiter
        .reserve(DOMAIN, descriptor, |_: &[Arc<Limit>]| units, 1500)
        .await
}

/// What RLS sees left of `descriptor`'s limit (a check, which consumes nothing).
async fn left(limiter: &TestLimiter, descriptor: &Descriptor) -> u32 {
    let decision = ask_one(limiter, with_addend(descriptor.clone(), 0)).await;
    decision.statuses[0].remaining
}

/// Slices of 4 and 3 of a limit of 10 leave 3 to RLS, on a log and a counter alike.
async fn a_slice_charges_what_rls_charges(t: &Target) {
    let limiter = limiter(t).await;
    for key in ["user", "counted"] {
        let v = fresh("slice");
        let b = bucket(&[(key, &v)]);
        let Quota::Granted(first) = slice(&limiter, &b, 4).await else {
            panic!("{key}: the first slice is granted");
        };
        assert_eq!(first.units, 4);
        assert!(first.spend_ms > 0 && first.spend_ms <= 1500, "{first:?}");
        let Quota::Granted(_) = slice(&limiter, &b, 3).await else {
            panic!("{key}: the second slice is granted");
        };
        assert_eq!(left(&limiter, &b).await, 3, "{key}");
        let decision = ask_one(&limiter, b.clone()).await;
        assert_eq!(decision.overall, Code::Ok, "{key}");
    }
}

/// With 3 left, a slice of 5 is refused and says so; a slice of 3 then fits.
async fn a_slice_that_does_not_fit_is_refused_with_what_is_left(t: &Target) {
    let limiter = limiter(t).await;
    let v = fresh("refused");
    let b = bucket(&[("user", &v)]);
    assert!(matches!(slice(&limiter, &b, 7).await, Quota::Granted(_)));
    let Quota::Refused(refusal) = slice(&limiter, &b, 5).await else {
        panic!("a slice past the limit is refused");
    };
    assert_eq!(refusal.remaining, 3, "{refusal:?}");
    assert!(refusal.reset_ms > 0, "{refusal:?}");
    assert!(matches!(slice(&limiter, &b, 3).await, Quota::Granted(_)));
    assert!(matches!(slice(&limiter, &b, 1).await, Quota::Refused(_)));
    assert_eq!(left(&limiter, &b).await, 0);
}

/// A descriptor of two limits (4 an hour, 6 a day): a slice of 3 charges both; a slice of 2
/// then fits the day but not the hour, and charges neither.
async fn a_slice_of_several_limits_charges_all_or_none(t: &Target) {
    let limiter = limiter(t).await;
    let v = fresh("pair");
    let b = bucket(&[("pair", &v)]);
    let Quota::Granted(grant) = slice(&limiter, &b, 3).await else {
        panic!("the first slice is granted");
    };
    assert_eq!(grant.limits.len(), 2);
    assert_eq!(grant.remaining, 1, "the hour has the least left: {grant:?}");
    let Quota::Refused(refusal) = slice(&limiter, &b, 2).await else {
        panic!("the hour refuses a slice of 2");
    };
    assert_eq!(refusal.remaining, 1, "{refusal:?}");
    // Nothing of the refused slice was charged: RLS finds 1 of the hour and 3 of the day left.
    let decision = ask_one(&limiter, with_addend(b.clone(), 0)).await;
    let lefts: Vec<u64> = decision
        .reports
        .iter()
        .map(|r| match r.usage {
            tollgate::limiter::Usage::Decided { before, .. } => {
                u64::from(r.limit.requests_per_unit) - before
            }
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(lefts, vec![1, 3], "{decision:?}");
}

/// Unknown domains, unmatched descriptors and unlimited limits are free; shadow-mode limits
/// answer Shadow; a bucket's entries are put in the tree's order before they are resolved.
async fn buckets_without_a_limit_are_free(t: &Target) {
    let limiter = limiter(t).await;
    let free = |q: &Quota| matches!(q, Quota::Free);
    assert!(free(&slice(&limiter, &bucket(&[("vip", "x")]), 5).await));
    assert!(free(&slice(&limiter, &bucket(&[("nobody", "x")]), 5).await));
    let unknown = limiter
        .reserve(
            "elsewhere",
            &bucket(&[("user", "x")]),
            |_: &[Arc<Limit>]| 1,
            1500,
        )
        .await;
    assert!(free(&unknown));
    assert!(matches!(
        slice(&limiter, &bucket(&[("shadowed", "x")]), 5).await,
        Quota::Shadow(_)
    ));
    // A bucket id is a map: {user, tenant} is the descriptor [tenant, user].
    let v = fresh("nested");
    let ordered = limiter.bucket_descriptor(
        DOMAIN,
        vec![Entry::new("user", v.as_str()), Entry::new("tenant", "acme")],
    );
    let keys: Vec<&str> = ordered.entries.iter().map(|e| e.key.as_str()).collect();
    assert_eq!(keys, ["tenant", "user"]);
    assert!(matches!(
        slice(&limiter, &ordered, 2).await,
        Quota::Granted(_)
    ));
    assert!(matches!(
        slice(&limiter, &ordered, 1).await,
        Quota::Refused(_)
    ));
}

/// Requests a client admitted without a slice are charged whatever is left, so a limit of 10
/// charged 12 refuses the next slice, and RLS refuses too.
async fn what_a_client_admitted_alone_is_charged_even_over_the_limit(t: &Target) {
    let limiter = limiter(t).await;
    let v = fresh("alone");
    let b = bucket(&[("user", &v)]);
    let charged = limiter.charge_admitted(DOMAIN, &b, 12).await;
    assert_eq!(charged.len(), 1);
    assert!(matches!(slice(&limiter, &b, 1).await, Quota::Refused(_)));
    assert_eq!(ask_one(&limiter, b.clone()).await.overall, Code::OverLimit);
    // Nothing limits vip: nothing charged.
    assert!(
        limiter
            .charge_admitted(DOMAIN, &bucket(&[("vip", "x")]), 3)
            .await
            .is_empty()
    );
}
