//! The semantics of design §3, driven through the limiter with the memory backend and an
//! injected clock, so every expected number is exact.

use std::sync::Arc;
use std::time::Duration;

use tollgate::backend::MemoryBackend;
use tollgate::clock::ManualClock;
use tollgate::config::Config;
use tollgate::descriptor::{Descriptor, Entry, LimitOverride, Request, Unit};
use tollgate::limiter::{Code, Decision, Limiter, LimiterError, Settings};

const POLICY: &str = r#"
domain: edge
descriptors:
  - key: user
    rate_limit: { unit: minute, requests_per_unit: 5, name: per_user }
  - key: tenant
    rate_limit: { unit: hour, requests_per_unit: 10 }
  - key: login
    rate_limit: { window: 10s, requests_per_unit: 3, algorithm: sliding_window_log }
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
  - key: general
    rate_limit: { unit: minute, requests_per_unit: 100, name: general }
  - key: specific
    rate_limit: { unit: minute, requests_per_unit: 1, replaces: [{ name: general }] }
  - key: quota_a
    quota_mode: true
    rate_limit: { unit: minute, requests_per_unit: 1 }
  - key: quota_b
    quota_mode: true
    rate_limit: { unit: minute, requests_per_unit: 2 }
"#;

/// An epoch-aligned minute boundary plus one second, so minute windows start fresh.
const START_MS: u64 = 1_700_000_040_000 + 1_000;

struct Harness {
    clock: ManualClock,
    limiter: Limiter<MemoryBackend>,
}

fn harness_with(settings: Settings) -> Harness {
    let clock = ManualClock::new(START_MS);
    let config = Config::from_yaml("policy.yaml", POLICY).expect("test policy loads");
    let backend = MemoryBackend::with_clock(Arc::new(clock.clone()));
    Harness {
        clock,
        limiter: Limiter::new(Arc::new(config), backend, settings),
    }
}

fn harness() -> Harness {
    harness_with(Settings::default())
}

fn d(pairs: &[(&str, &str)]) -> Descriptor {
    Descriptor {
        entries: pairs.iter().map(|(k, v)| Entry::new(*k, *v)).collect(),
        ..Descriptor::default()
    }
}

fn req(descriptors: Vec<Descriptor>) -> Request {
    Request {
        domain: "edge".into(),
        descriptors,
        hits_addend: 0,
    }
}

impl Harness {
    async fn ask(&self, request: &Request) -> Decision {
        self.limiter
            .should_rate_limit(request)
            .await
            .expect("valid request")
    }

    async fn ask_one(&self, pairs: &[(&str, &str)]) -> Decision {
        self.ask(&req(vec![d(pairs)])).await
    }
}

fn codes(decision: &Decision) -> Vec<Code> {
    decision.statuses.iter().map(|s| s.code).collect()
}

#[tokio::test]
async fn admits_up_to_the_limit_then_rejects_with_remaining_and_reset() {
    let h = harness();
    for expected_remaining in (0..5).rev() {
        let decision = h.ask_one(&[("user", "alice")]).await;
        assert_eq!(decision.overall, Code::Ok);
        let status = &decision.statuses[0];
        assert_eq!(status.remaining, expected_remaining);
        let limit = status.limit.as_ref().expect("limit reported");
        assert_eq!(limit.requests_per_unit, 5);
        assert_eq!(limit.unit, Some(Unit::Minute));
        assert_eq!(limit.name.as_deref(), Some("per_user"));
    }
    let decision = h.ask_one(&[("user", "alice")]).await;
    assert_eq!(decision.overall, Code::OverLimit);
    assert_eq!(decision.statuses[0].remaining, 0);
    // Five hits in the current minute: a new hit fits once the sliding estimate drops to 4,
    // which is 12 s into the next minute (5 * (1 - e/60) <= 4); now is 1 s into this minute.
    assert_eq!(decision.statuses[0].reset, Some(Duration::from_secs(71)));
    assert_eq!(
        decision.response_headers,
        vec![("retry-after".to_string(), "71".to_string())]
    );
    // Another user has their own counter (key-only node).
    assert_eq!(h.ask_one(&[("user", "bob")]).await.overall, Code::Ok);
}

#[tokio::test]
async fn statuses_follow_request_order() {
    let h = harness();
    let decision = h
        .ask(&req(vec![
            d(&[("nothing", "here")]),
            d(&[("user", "carol")]),
            d(&[("free", "x")]),
            d(&[("allow", "internal")]),
        ]))
        .await;
    assert_eq!(decision.statuses.len(), 4);
    assert!(decision.statuses[0].limit.is_none());
    assert_eq!(decision.statuses[1].remaining, 4);
    assert_eq!(decision.statuses[2].remaining, u32::MAX);
    assert!(decision.statuses[2].limit.is_none());
    assert!(decision.statuses[3].limit.is_none());
    assert_eq!(codes(&decision), vec![Code::Ok; 4]);
}

#[tokio::test]
async fn unknown_domain_answers_ok_without_limits() {
    let h = harness();
    let mut request = req(vec![d(&[("user", "alice")])]);
    request.domain = "nowhere".into();
    let decision = h.ask(&request).await;
    assert_eq!(decision.overall, Code::Ok);
    assert!(decision.statuses[0].limit.is_none());
}

#[tokio::test]
async fn hits_addend_of_request_and_descriptor() {
    let h = harness();
    let mut request = req(vec![d(&[("tenant", "t1")])]);
    request.hits_addend = 4;
    assert_eq!(h.ask(&request).await.statuses[0].remaining, 6);
    // The descriptor's own addend wins over the request's.
    let mut descriptor = d(&[("tenant", "t1")]);
    descriptor.hits_addend = Some(5);
    request.descriptors = vec![descriptor];
    assert_eq!(h.ask(&request).await.statuses[0].remaining, 1);
    // 2 does not fit into the 1 left; rejected hits consume nothing.
    request.descriptors[0].hits_addend = Some(2);
    let decision = h.ask(&request).await;
    assert_eq!(decision.overall, Code::OverLimit);
    assert_eq!(decision.statuses[0].remaining, 1);
    request.descriptors[0].hits_addend = Some(1);
    let decision = h.ask(&request).await;
    assert_eq!(decision.overall, Code::Ok);
    assert_eq!(decision.statuses[0].remaining, 0);
}

#[tokio::test]
async fn check_only_consumes_nothing() {
    let h = harness();
    let mut probe = d(&[("tenant", "t2")]);
    probe.hits_addend = Some(0);
    for _ in 0..20 {
        let decision = h.ask(&req(vec![probe.clone()])).await;
        assert_eq!(decision.overall, Code::Ok);
        assert_eq!(decision.statuses[0].remaining, 10);
    }
    let mut fill = d(&[("tenant", "t2")]);
    fill.hits_addend = Some(10);
    assert_eq!(h.ask(&req(vec![fill])).await.overall, Code::Ok);
    let decision = h.ask(&req(vec![probe])).await;
    assert_eq!(decision.overall, Code::OverLimit);
    assert_eq!(decision.statuses[0].remaining, 0);
}

#[tokio::test]
async fn cost_above_the_limit_is_rejected_with_the_full_window() {
    let h = harness();
    for addend in [11, u64::from(u32::MAX), u64::MAX] {
        let mut descriptor = d(&[("tenant", "t3")]);
        descriptor.hits_addend = Some(addend);
        let decision = h.ask(&req(vec![descriptor])).await;
        assert_eq!(decision.overall, Code::OverLimit);
        assert_eq!(decision.statuses[0].remaining, 10);
        assert_eq!(decision.statuses[0].reset, Some(Duration::from_secs(3600)));
    }
    let mut request = req(vec![d(&[("tenant", "t3")])]);
    request.hits_addend = u32::MAX;
    assert_eq!(h.ask(&request).await.overall, Code::OverLimit);
}

#[tokio::test]
async fn zero_requests_per_unit_rejects_everything() {
    let h = harness();
    let decision = h.ask_one(&[("zero", "x")]).await;
    assert_eq!(decision.overall, Code::OverLimit);
    assert_eq!(decision.statuses[0].remaining, 0);
}

#[tokio::test]
async fn rejected_requests_give_back_what_other_descriptors_took() {
    let h = harness();
    // Fill zero-cost: "zero" is always over, so every request carrying it is rejected.
    for _ in 0..10 {
        let decision = h
            .ask(&req(vec![d(&[("user", "dave")]), d(&[("zero", "x")])]))
            .await;
        assert_eq!(decision.overall, Code::OverLimit);
        assert_eq!(codes(&decision), vec![Code::Ok, Code::OverLimit]);
    }
    // None of those ten hits stayed on dave's counter.
    assert_eq!(
        h.ask_one(&[("user", "dave")]).await.statuses[0].remaining,
        4
    );
}

#[tokio::test]
async fn shadow_descriptor_reports_ok_but_counts() {
    let h = harness();
    assert_eq!(
        h.ask_one(&[("shadowed", "s")]).await.statuses[0].remaining,
        0
    );
    let decision = h.ask_one(&[("shadowed", "s")]).await;
    assert_eq!(decision.overall, Code::Ok);
    assert_eq!(decision.statuses[0].code, Code::Ok);
    assert_eq!(decision.statuses[0].remaining, 0);
    assert!(decision.response_headers.is_empty());
}

#[tokio::test]
async fn global_shadow_mode_changes_only_the_overall_code() {
    let h = harness_with(Settings {
        shadow_mode: true,
        ..Settings::default()
    });
    for _ in 0..5 {
        h.ask_one(&[("user", "erin")]).await;
    }
    let decision = h
        .ask(&req(vec![d(&[("tenant", "t9")]), d(&[("user", "erin")])]))
        .await;
    assert_eq!(decision.overall, Code::Ok);
    assert_eq!(codes(&decision), vec![Code::Ok, Code::OverLimit]);
    assert!(decision.response_headers.is_empty());
    // Counting is as without shadow mode: the request was over, so tenant's hit was given back.
    assert_eq!(
        h.ask_one(&[("tenant", "t9")]).await.statuses[0].remaining,
        9
    );
}

#[tokio::test]
async fn retry_after_is_the_largest_wait_among_the_descriptors_over() {
    let h = harness();
    for _ in 0..3 {
        h.ask_one(&[("login", "l")]).await;
    }
    for _ in 0..5 {
        h.ask_one(&[("user", "frank")]).await;
    }
    let decision = h
        .ask(&req(vec![d(&[("login", "l")]), d(&[("user", "frank")])]))
        .await;
    assert_eq!(codes(&decision), vec![Code::OverLimit, Code::OverLimit]);
    let login_wait = decision.statuses[0].reset.expect("reset").as_secs();
    let user_wait = decision.statuses[1].reset.expect("reset").as_secs();
    assert_eq!(login_wait, 10);
    assert_eq!(user_wait, 71);
    assert_eq!(
        decision.response_headers,
        vec![("retry-after".to_string(), "71".to_string())]
    );
    let quiet = harness_with(Settings {
        retry_after_header: false,
        ..Settings::default()
    });
    assert!(
        quiet
            .ask_one(&[("zero", "x")])
            .await
            .response_headers
            .is_empty()
    );
}

#[tokio::test]
async fn sliding_log_admits_again_exactly_when_the_oldest_hit_leaves() {
    let h = harness();
    for _ in 0..3 {
        assert_eq!(h.ask_one(&[("login", "g")]).await.overall, Code::Ok);
        h.clock.advance(1_000);
    }
    // Hits at +0 s, +1 s, +2 s; now +3 s. The first leaves the 10 s window at +10 s.
    let decision = h.ask_one(&[("login", "g")]).await;
    assert_eq!(decision.overall, Code::OverLimit);
    assert_eq!(decision.statuses[0].reset, Some(Duration::from_secs(7)));
    h.clock.advance(6_999);
    assert_eq!(h.ask_one(&[("login", "g")]).await.overall, Code::OverLimit);
    h.clock.advance(1);
    assert_eq!(h.ask_one(&[("login", "g")]).await.overall, Code::Ok);
}

#[tokio::test]
async fn share_threshold_values_share_one_counter() {
    let h = harness();
    assert_eq!(h.ask_one(&[("path", "/api/a")]).await.overall, Code::Ok);
    assert_eq!(h.ask_one(&[("path", "/api/b")]).await.overall, Code::Ok);
    assert_eq!(
        h.ask_one(&[("path", "/api/c")]).await.overall,
        Code::OverLimit
    );
}

#[tokio::test]
async fn replaced_limits_do_not_apply() {
    let h = harness();
    let decision = h
        .ask(&req(vec![d(&[("general", "g")]), d(&[("specific", "s")])]))
        .await;
    assert!(decision.statuses[0].limit.is_none(), "general is replaced");
    assert_eq!(decision.statuses[1].remaining, 0);
    // Alone, general applies.
    let alone = h.ask_one(&[("general", "g")]).await;
    assert_eq!(alone.statuses[0].remaining, 99);
}

#[tokio::test]
async fn quota_descriptors_reject_only_when_all_are_over() {
    let h = harness();
    let both = || req(vec![d(&[("quota_a", "q")]), d(&[("quota_b", "q")])]);
    assert_eq!(h.ask(&both()).await.overall, Code::Ok);
    let decision = h.ask(&both()).await;
    assert_eq!(codes(&decision), vec![Code::OverLimit, Code::Ok]);
    assert_eq!(decision.overall, Code::Ok);
    let decision = h.ask(&both()).await;
    assert_eq!(codes(&decision), vec![Code::OverLimit, Code::OverLimit]);
    assert_eq!(decision.overall, Code::OverLimit);
}

#[tokio::test]
async fn descriptor_limit_override_applies_to_matched_and_unmatched_descriptors() {
    let h = harness();
    let mut overridden = d(&[("user", "gina")]);
    overridden.limit = Some(LimitOverride {
        requests_per_unit: 2,
        unit: Some(Unit::Hour),
    });
    let mut unmatched = d(&[("anything", "goes")]);
    unmatched.limit = Some(LimitOverride {
        requests_per_unit: 1,
        unit: Some(Unit::Second),
    });
    let decision = h
        .ask(&req(vec![overridden.clone(), unmatched.clone()]))
        .await;
    let first = decision.statuses[0].limit.as_ref().expect("override limit");
    assert_eq!((first.requests_per_unit, first.unit), (2, Some(Unit::Hour)));
    assert_eq!(decision.statuses[1].remaining, 0);
    assert_eq!(
        codes(&h.ask(&req(vec![unmatched])).await),
        vec![Code::OverLimit]
    );
    // An unknown domain ignores overrides.
    let mut foreign = req(vec![overridden]);
    foreign.domain = "elsewhere".into();
    assert!(h.ask(&foreign).await.statuses[0].limit.is_none());
}

#[tokio::test]
async fn invalid_requests_are_refused_and_count_nothing() {
    let h = harness();
    let mut bad = req(vec![d(&[("user", "hank")]), d(&[("", "no key")])]);
    for _ in 0..10 {
        match h.limiter.should_rate_limit(&bad).await {
            Err(LimiterError::InvalidArgument(message)) => assert!(message.contains("empty key")),
            other => panic!("expected INVALID_ARGUMENT, got {other:?}"),
        }
    }
    bad.descriptors.pop();
    assert_eq!(h.ask(&bad).await.statuses[0].remaining, 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_callers_never_exceed_the_limit() {
    let h = Arc::new(harness());
    let mut tasks = Vec::new();
    for _ in 0..32 {
        let h = Arc::clone(&h);
        tasks.push(tokio::spawn(async move {
            let mut admitted = 0u32;
            for _ in 0..50 {
                let decision = h.ask_one(&[("login", "shared")]).await;
                if decision.overall == Code::Ok {
                    admitted += 1;
                }
                tokio::task::yield_now().await;
            }
            admitted
        }));
    }
    let mut total = 0;
    for task in tasks {
        total += task.await.expect("task finished");
    }
    assert_eq!(total, 3, "the exact log admits exactly its limit");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_rejected_requests_leave_no_residue() {
    let h = Arc::new(harness());
    let mut tasks = Vec::new();
    for i in 0..16 {
        let h = Arc::clone(&h);
        tasks.push(tokio::spawn(async move {
            for j in 0..40 {
                let mut descriptors = vec![d(&[("tenant", "busy")])];
                if (i + j) % 2 == 0 {
                    descriptors.push(d(&[("zero", "x")]));
                }
                h.ask(&req(descriptors)).await;
            }
        }));
    }
    for task in tasks {
        task.await.expect("task finished");
    }
    // Only requests without the always-over descriptor could keep a hit, and only 10 fit.
    let decision = h.ask_one(&[("tenant", "busy")]).await;
    assert_eq!(decision.overall, Code::OverLimit);
    assert_eq!(decision.statuses[0].remaining, 0);
}

/// Random descriptors, costs and clock steps: the limiter never panics, never fails a valid
/// request, and no key ever admits more than its limit within one window.
#[tokio::test]
async fn random_requests_never_panic_or_overadmit() {
    let h = harness();
    let mut rng = fastrand::Rng::with_seed(0x7011_6a7e);
    let keys = [
        "user", "tenant", "login", "shadowed", "zero", "free", "allow", "path", "x",
    ];
    let values = ["a", "b", "internal", "/api/x", "", "*", "{}", "|=~@%"];
    let mut login_admissions: Vec<u64> = Vec::new();
    for _ in 0..3_000 {
        let mut descriptors = Vec::new();
        for _ in 0..rng.usize(1..4) {
            let depth = rng.usize(1..3);
            let mut descriptor = d(&[]);
            for _ in 0..depth {
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
        let decision = h.ask(&request).await;
        assert_eq!(decision.statuses.len(), request.descriptors.len());
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
                    login_admissions.push(h.clock.now_ms_for_tests());
                }
            }
        }
        h.clock.advance(rng.u64(0..700));
    }
    // login is a 10 s exact log of 3: no 10 s window holds more than 3 admitted units.
    for (i, &t) in login_admissions.iter().enumerate() {
        let in_window = login_admissions[i..]
            .iter()
            .take_while(|&&u| u < t + 10_000)
            .count();
        assert!(in_window <= 3, "{in_window} login hits within 10 s of {t}");
    }
}

trait NowForTests {
    fn now_ms_for_tests(&self) -> u64;
}

impl NowForTests for ManualClock {
    fn now_ms_for_tests(&self) -> u64 {
        use tollgate::clock::Clock;
        self.now_ms()
    }
}
