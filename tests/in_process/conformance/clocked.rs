//! Limiter-level cases with an injected clock, so every expected number is exact: retry times to
//! the second, a log that admits again the very millisecond its oldest hit leaves, and random
//! traffic over many windows. They run where the clock can be told: memory, and one Redis
//! server whose scripts take the instant with each call (a cluster reads its own clock).

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use tollgate::clock::{Clock, ManualClock};
use tollgate::config::Config;
use tollgate::descriptor::{Entry, Unit};
use tollgate::limiter::{Code, Limiter, Settings};
use tollgate_testkit::cases;
use tollgate_testkit::requests::descriptor as d;
use tollgate_testkit::target::Target;

use super::support::{TestLimiter, ask, ask_one, codes, req, reset_s, retry_after};

cases! {
    exact_counter_retry_time: [memory, redis];
    retry_after_names_the_longest_exact_wait: [memory, redis];
    exact_log_admits_when_the_oldest_hit_leaves: [memory, redis];
    random_requests_never_panic_or_overadmit: [memory, redis];
}

const POLICY: &str = r#"
domain: conformance
descriptors:
  - key: user
    rate_limit: { unit: minute, requests_per_unit: 5, name: per_user }
  - key: tenant
    rate_limit: { unit: hour, requests_per_unit: 10 }
  - key: login
    rate_limit: { unit: minute, requests_per_unit: 3, algorithm: sliding_window_log }
  - key: shadowed
    shadow_mode: true
    rate_limit: { unit: minute, requests_per_unit: 1 }
  - key: zero
    rate_limit: { unit: second, requests_per_unit: 0 }
  - key: free
    rate_limit: { unlimited: true }
  - key: allow
    value: internal
  - key: path
    value: /api/*
    share_threshold: true
    rate_limit: { unit: minute, requests_per_unit: 2 }
"#;

static CONFIG: LazyLock<Arc<Config>> = LazyLock::new(|| {
    Arc::new(Config::from_yaml("clocked.yaml", POLICY).expect("the test policy loads"))
});

/// An epoch-aligned minute boundary plus one second, so minute windows start fresh.
const START_MS: u64 = 1_700_000_040_000 + 1_000;

/// The `login` log's window.
const LOGIN_WINDOW_MS: u64 = 60_000;

/// A limiter over a new backend instance of `t` that decides at the instants of the clock it
/// answers, which stands at [`START_MS`].
async fn clocked(t: &Target, settings: Settings) -> (ManualClock, TestLimiter) {
    let clock = ManualClock::new(START_MS);
    let backend = t.clocked_backend(&clock).await;
    (clock, Limiter::new(Arc::clone(&CONFIG), backend, settings))
}

/// A counter admits its limit, then names the exact time the next hit fits; each key-only value
/// has its own counter.
async fn exact_counter_retry_time(t: &Target) {
    let (_clock, limiter) = clocked(t, Settings::default()).await;
    for expected_remaining in (0..5).rev() {
        let decision = ask_one(&limiter, d(&[("user", "alice")])).await;
        assert_eq!(decision.overall, Code::Ok);
        let status = &decision.statuses[0];
        assert_eq!(status.remaining, expected_remaining);
        let limit = status.limit.as_ref().expect("limit reported");
        assert_eq!(limit.requests_per_unit, 5);
        assert_eq!(limit.unit, Some(Unit::Minute));
        assert_eq!(limit.name.as_deref(), Some("per_user"));
    }
    let decision = ask_one(&limiter, d(&[("user", "alice")])).await;
    assert_eq!(decision.overall, Code::OverLimit);
    assert_eq!(decision.statuses[0].remaining, 0);
    // Five hits in the current minute: a new hit fits once the sliding estimate drops to 4,
    // which is 12 s into the next minute (5 * (1 - e/60) <= 4); now is 1 s into this minute.
    assert_eq!(decision.statuses[0].reset, Some(Duration::from_secs(71)));
    assert_eq!(
        decision.response_headers,
        vec![("retry-after".to_string(), "71".to_string())]
    );
    let bob = ask_one(&limiter, d(&[("user", "bob")])).await;
    assert_eq!(
        bob.overall,
        Code::Ok,
        "another user has a counter of their own"
    );
}

/// `retry-after` is the longest of the exact waits of the descriptors over, and only with
/// `--retry-after-header`.
async fn retry_after_names_the_longest_exact_wait(t: &Target) {
    let (_clock, limiter) = clocked(t, Settings::default()).await;
    for _ in 0..3 {
        ask_one(&limiter, d(&[("login", "l")])).await;
    }
    for _ in 0..5 {
        ask_one(&limiter, d(&[("user", "frank")])).await;
    }
    let decision = ask(
        &limiter,
        &req(vec![d(&[("login", "l")]), d(&[("user", "frank")])]),
    )
    .await;
    assert_eq!(codes(&decision), [Code::OverLimit, Code::OverLimit]);
    // The log's first hit leaves a minute after it came; the counter frees a unit 71 s from now.
    assert_eq!(reset_s(&decision, 0), 60);
    assert_eq!(reset_s(&decision, 1), 71);
    assert_eq!(retry_after(&decision), Some(71));

    let quiet = Settings {
        retry_after_header: false,
        ..Settings::default()
    };
    let (_clock, quiet) = clocked(t, quiet).await;
    let decision = ask_one(&quiet, d(&[("zero", "x")])).await;
    assert_eq!(decision.overall, Code::OverLimit);
    assert!(decision.response_headers.is_empty(), "{decision:?}");
}

/// The log admits again exactly when its oldest hit leaves the window, not a millisecond before.
async fn exact_log_admits_when_the_oldest_hit_leaves(t: &Target) {
    let (clock, limiter) = clocked(t, Settings::default()).await;
    for _ in 0..3 {
        let decision = ask_one(&limiter, d(&[("login", "g")])).await;
        assert_eq!(decision.overall, Code::Ok);
        clock.advance(1_000);
    }
    // Hits at +0 s, +1 s, +2 s; now +3 s. The first leaves the 60 s window at +60 s.
    let decision = ask_one(&limiter, d(&[("login", "g")])).await;
    assert_eq!(decision.overall, Code::OverLimit);
    assert_eq!(decision.statuses[0].reset, Some(Duration::from_secs(57)));
    clock.advance(56_999);
    let early = ask_one(&limiter, d(&[("login", "g")])).await;
    assert_eq!(early.overall, Code::OverLimit, "a millisecond early");
    clock.advance(1);
    let on_time = ask_one(&limiter, d(&[("login", "g")])).await;
    assert_eq!(on_time.overall, Code::Ok, "on time");
}

/// Random descriptors, costs and clock steps: the limiter never panics, never fails a valid
/// request, and no key ever admits more than its limit within one window.
async fn random_requests_never_panic_or_overadmit(t: &Target) {
    let (clock, limiter) = clocked(t, Settings::default()).await;
    let mut rng = fastrand::Rng::with_seed(0x7011_6a7e);
    let keys = [
        "user", "tenant", "login", "shadowed", "zero", "free", "allow", "path", "x",
    ];
    let values = ["a", "b", "internal", "/api/x", "", "*", "{}", "|=~@%"];
    let mut login_admissions: Vec<u64> = Vec::new();
    for _ in 0..3_000 {
        let mut descriptors = Vec::new();
        for _ in 0..rng.usize(1..4) {
            let mut descriptor = d(&[]);
            for _ in 0..rng.usize(1..3) {
                descriptor.entries.push(Entry::new(
                    keys[rng.usize(..keys.len())],
                    values[rng.usize(..values.len())],
                ));
            }
            descriptor.hits_addend = match rng.u8(0..6) {
                0 => Some(0),
                1 => Some(rng.u64(..)),
                2 => Some(rng.u64(1..4)),
                _ => None,
            };
            descriptors.push(descriptor);
        }
        let mut request = req(descriptors);
        request.hits_addend = if rng.bool() { 0 } else { rng.u32(..) };
        let decision = ask(&limiter, &request).await;
        if decision.overall == Code::Ok {
            // The request kept its hits: record what each login=a descriptor consumed.
            for descriptor in &request.descriptors {
                if descriptor.entries != [Entry::new("login", "a")] {
                    continue;
                }
                let cost = match descriptor.hits_addend {
                    Some(n) => n,
                    None => u64::from(request.hits_addend.max(1)),
                };
                assert!(
                    cost <= 3,
                    "a cost of {cost} can never be admitted by a limit of 3"
                );
                for _ in 0..cost {
                    login_admissions.push(clock.now_ms());
                }
            }
        }
        clock.advance(rng.u64(0..700));
    }
    // login is an exact log of 3 a minute: no window of a minute holds more than 3 units.
    for (i, &at) in login_admissions.iter().enumerate() {
        let in_window = login_admissions[i..]
            .iter()
            .take_while(|&&later| later < at + LOGIN_WINDOW_MS)
            .count();
        assert!(
            in_window <= 3,
            "{in_window} login hits within a minute of {at}"
        );
    }
}
