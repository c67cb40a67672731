//! envoyproxy/ratelimit's service tests (`test/service/ratelimit_test.go`) and its dynamic
//! metadata unit test (`src/service/ratelimit_test.go`): how the per-descriptor answers compose
//! into one response under shadow mode, quota mode, unlimited limits and dynamic metadata.
//!
//! The reference runs these on a mocked config and a mocked cache whose statuses it injects. Here
//! `fixtures/service/` gives each mock's limits as real policies (one domain per mock), and where
//! the reference injects an OVER_LIMIT status, setup requests fill the limit first, so the same
//! request is answered by real counting.

use serde_json::json;
use tollgate::limiter::Settings;
use tollgate::proto::RateLimitRequest;
use tollgate::proto::rate_limit_response::rate_limit::Unit::Minute;
use tollgate_testkit::cases;
use tollgate_testkit::target::Target;

use super::support::{
    Answer, Scenario, Step, addend, ask, desc, free, ok, over, pass, policy, reference_defaults,
    reject, repeat, rq, run, unlimited,
};

cases! {
    service_answers: [memory, memory_grpc, memory_tonic, redis];
    global_shadow_mode: [memory, memory_grpc, memory_tonic, redis];
    rule_shadow_mode: [memory, memory_grpc, memory_tonic, redis];
    response_headers: [memory, memory_grpc, memory_tonic, redis];
    invalid_requests: [memory, memory_grpc, memory_tonic, redis];
    cache_error: [redis, redis_cluster];
    unlimited_limits: [memory, memory_grpc, memory_tonic, redis];
    global_quota_mode: [memory, memory_grpc, memory_tonic, redis];
    metadata_of_passed_descriptors: [memory, memory_grpc, memory_tonic, redis];
    per_descriptor_quota_mode: [memory, memory_grpc, memory_tonic, redis];
    metadata_unit_cases: [memory, memory_grpc, memory_tonic, redis];
}

const SOURCE: &str = "test/service/ratelimit_test.go";
const METADATA_SOURCE: &str = "src/service/ratelimit_test.go";

/// Every scenario of this file, for the inventory.
pub fn scenarios() -> Vec<Scenario> {
    vec![
        service(),
        global_shadow(),
        rule_shadow(),
        headers(),
        invalid(),
        cache(),
        unlimiteds(),
        global_quota(),
        metadata_passed(),
        per_descriptor_quota(),
        quota_with_shadow(),
        metadata_units(),
    ]
}

fn foo_bar_hello() -> RateLimitRequest {
    rq(
        "different-domain",
        vec![desc(&[("foo", "bar")]), desc(&[("hello", "world")])],
    )
}

fn filled_foo(extra: Vec<Step>) -> Vec<Step> {
    let mut steps = repeat(10, |i| {
        ask(
            format!("fill foo=bar {i}"),
            rq("different-domain", vec![desc(&[("foo", "bar")])]),
            pass(vec![ok(10, Minute, 9 - i).named("key_name")]),
        )
        .setup()
    });
    steps.extend(extra);
    steps
}

/// `TestService` (:125-215): no limit answers OK; after the reload, one descriptor over makes
/// the request OVER_LIMIT with the statuses as they are.
fn service() -> Scenario {
    let mut steps = vec![ask(
        "no limit (:141)",
        rq("test-domain", vec![desc(&[("hello", "world")])]),
        pass(vec![free()]),
    )];
    steps.extend(filled_foo(vec![ask(
        "after the reload, one over (:170)",
        foo_bar_hello(),
        reject(vec![over(10, Minute, 0).named("key_name"), free()]),
    )]));
    Scenario::new(
        "service",
        SOURCE,
        policy("service"),
        reference_defaults(),
        steps,
    )
}

/// `TestServiceGlobalShadowMode` (:220-275): SHADOW_MODE turns the overall code OK and leaves
/// the statuses.
fn global_shadow() -> Scenario {
    Scenario::new(
        "service global shadow mode",
        SOURCE,
        policy("service"),
        Settings {
            shadow_mode: true,
            ..reference_defaults()
        },
        filled_foo(vec![ask(
            "over, in global shadow mode (:252)",
            foo_bar_hello(),
            pass(vec![over(10, Minute, 0).named("key_name"), free()]),
        )]),
    )
}

/// `TestRuleShadowMode` (:277-310) and `TestMixedRuleShadowMode` (:312-349): a shadow limit
/// that is over answers OK (remaining 0, limit kept); a plain one over still rejects.
fn rule_shadow() -> Scenario {
    let both = rq(
        "rule-shadow",
        vec![desc(&[("a", "x")]), desc(&[("b", "y")])],
    );
    let mut steps = repeat(10, |i| {
        ask(
            format!("fill a and b {i}"),
            both.clone(),
            pass(vec![ok(10, Minute, 9 - i), ok(10, Minute, 9 - i)]),
        )
        .setup()
    });
    steps.push(ask(
        "both shadow limits over (:297)",
        both,
        pass(vec![ok(10, Minute, 0), ok(10, Minute, 0)]),
    ));
    steps.extend(repeat(10, |i| {
        ask(
            format!("fill c {i}"),
            rq("rule-shadow", vec![desc(&[("c", "z")])]),
            pass(vec![ok(10, Minute, 9 - i)]),
        )
        .setup()
    }));
    steps.push(ask(
        "shadow OK, plain over (:334)",
        rq(
            "rule-shadow",
            vec![desc(&[("a", "x2")]), desc(&[("c", "z")])],
        ),
        reject(vec![ok(10, Minute, 9), over(10, Minute, 0)]),
    ));
    Scenario::new(
        "service rule shadow mode",
        SOURCE,
        policy("service"),
        reference_defaults(),
        steps,
    )
}

const HEADERS_WHY: &str = "tollgate adds no RateLimit-* headers (LIMIT_RESPONSE_HEADERS_ENABLED \
                           is not implemented); it adds retry-after to OVER_LIMIT answers";

/// `TestServiceWithCustomRatelimitHeaders` (:351-408) and `...DefaultRatelimitHeaders`
/// (:410-461): with LIMIT_RESPONSE_HEADERS_ENABLED the reference adds limit, remaining and reset
/// headers of the descriptor nearest its limit.
fn headers() -> Scenario {
    let over_answer = || reject(vec![over(10, Minute, 0).named("key_name"), free()]);
    let with_retry_after = Settings {
        retry_after_header: true,
        ..reference_defaults()
    };
    Scenario::new(
        "service rate limit headers",
        SOURCE,
        policy("service"),
        with_retry_after,
        filled_foo(vec![
            ask(
                "custom header names (:389)",
                foo_bar_hello(),
                over_answer().headers(&[
                    "A-Ratelimit-Limit",
                    "A-Ratelimit-Remaining",
                    "A-Ratelimit-Reset",
                ]),
            )
            .differs(over_answer().headers(&["retry-after"]), HEADERS_WHY),
            ask(
                "default header names (:446)",
                foo_bar_hello(),
                over_answer().headers(&[
                    "RateLimit-Limit",
                    "RateLimit-Remaining",
                    "RateLimit-Reset",
                ]),
            )
            .differs(over_answer().headers(&["retry-after"]), HEADERS_WHY),
        ]),
    )
}

const INVALID_WHY: &str = "the reference fails such a call with the gRPC code UNKNOWN; tollgate \
                           says INVALID_ARGUMENT, with the same message (Envoy treats both as \
                           a failed call)";

/// `TestEmptyDomain` (:463-473) and `TestEmptyDescriptors` (:475-485).
fn invalid() -> Scenario {
    Scenario::new(
        "service invalid requests",
        SOURCE,
        policy("service"),
        reference_defaults(),
        vec![
            ask(
                "empty domain (:468)",
                rq("", vec![desc(&[("hello", "world")])]),
                Answer::Error(tonic::Code::Unknown, "rate limit domain must not be empty"),
            )
            .differs(
                Answer::Error(
                    tonic::Code::InvalidArgument,
                    "rate limit domain must not be empty",
                ),
                INVALID_WHY,
            ),
            ask(
                "no descriptors (:480)",
                rq("test-domain", Vec::new()),
                Answer::Error(
                    tonic::Code::Unknown,
                    "rate limit descriptor list must not be empty",
                ),
            )
            .differs(
                Answer::Error(
                    tonic::Code::InvalidArgument,
                    "rate limit descriptor list must not be empty",
                ),
                INVALID_WHY,
            ),
        ],
    )
}

/// `TestCacheError` (:487-504): the backend fails.
fn cache() -> Scenario {
    Scenario::new(
        "service cache error",
        SOURCE,
        policy("service"),
        reference_defaults(),
        vec![
            ask(
                "redis fails (:498)",
                rq("different-domain", vec![desc(&[("foo", "bar")])]),
                Answer::Error(tonic::Code::Unknown, ""),
            )
            .differs(
                pass(vec![ok(10, Minute, 10).named("key_name")]),
                "the reference fails the call; tollgate answers each limit's failure_mode \
                 (allow unless set otherwise), reporting the limit untouched",
            ),
        ],
    )
    .unreachable()
}

/// `TestUnlimited` (:527-565): an unlimited limit is OK with remaining 2^32 - 1 and no
/// current_limit.
fn unlimiteds() -> Scenario {
    Scenario::new(
        "service unlimited",
        SOURCE,
        policy("service"),
        reference_defaults(),
        vec![ask(
            "limited, unmatched, unlimited (:551)",
            rq(
                "some-domain",
                vec![
                    desc(&[("foo", "bar")]),
                    desc(&[("hello", "world")]),
                    desc(&[("baz", "qux")]),
                ],
            ),
            pass(vec![ok(10, Minute, 9), free(), unlimited()]),
        )],
    )
}

/// `TestServiceGlobalQuotaMode` (:676-727): under QUOTA_MODE a request is rejected when every
/// descriptor is over.
fn global_quota() -> Scenario {
    let mut steps = fill_one("quota-domain", ("foo", "bar"), 10);
    steps.extend(fill_one("quota-domain", ("hello", "world"), 5));
    steps.push(ask(
        "all over in global quota mode (:714)",
        rq(
            "quota-domain",
            vec![desc(&[("foo", "bar")]), desc(&[("hello", "world")])],
        ),
        reject(vec![over(10, Minute, 0), over(5, Minute, 0)]),
    ));
    Scenario::new(
        "service global quota mode",
        SOURCE,
        policy("service"),
        Settings {
            quota_mode: true,
            ..reference_defaults()
        },
        steps,
    )
}

/// `limit` setup requests filling one descriptor's per-minute limit of `limit`.
fn fill_one(domain: &str, (key, value): (&str, &str), limit: u32) -> Vec<Step> {
    repeat(limit, |i| {
        ask(
            format!("fill {key}={value} {i}"),
            rq(domain, vec![desc(&[(key, value)])]),
            pass(vec![ok(limit, Minute, limit - 1 - i)]),
        )
        .setup()
    })
}

fn regular_and_quota(domain: &str) -> RateLimitRequest {
    rq(
        domain,
        vec![desc(&[("regular", "limit")]), desc(&[("quota", "limit")])],
    )
}

/// The three metadata tests (:729-913), under QUOTA_MODE and RESPONSE_DYNAMIC_METADATA: the
/// metadata of the descriptors that passed is merged, the first value of a key winning.
fn metadata_passed() -> Scenario {
    let shape = |domain: &str, metadata: serde_json::Value| {
        json!({
            "domain": domain,
            "descriptors": [{"entries": ["regular=limit"]}, {"entries": ["quota=limit"]}],
            "metadata": metadata,
        })
    };
    let mut steps = fill_one("metadata-passed", ("quota", "limit"), 5);
    steps.push(ask(
        "only the passed descriptor's metadata (:771)",
        regular_and_quota("metadata-passed"),
        pass(vec![ok(10, Minute, 9), over(5, Minute, 0)])
            .metadata(shape("metadata-passed", json!({"name": "service_1"}))),
    ));
    steps.push(ask(
        "every passed descriptor's metadata (:835)",
        regular_and_quota("metadata-all-passed"),
        pass(vec![ok(10, Minute, 9), ok(5, Minute, 4)]).metadata(shape(
            "metadata-all-passed",
            json!({"name": "service_1", "some_other_name": "service_2"}),
        )),
    ));
    steps.push(ask(
        "the first value of a key wins (:896)",
        regular_and_quota("metadata-overlap"),
        pass(vec![ok(10, Minute, 9), ok(5, Minute, 4)])
            .metadata(shape("metadata-overlap", json!({"name": "service_1"}))),
    ));
    Scenario::new(
        "service metadata of passed descriptors",
        SOURCE,
        policy("service"),
        Settings {
            quota_mode: true,
            response_dynamic_metadata: true,
            ..reference_defaults()
        },
        steps,
    )
}

/// The per-descriptor quota mode tests (:915-1284): a plain descriptor over rejects; quota
/// descriptors reject only when all of them are over; global shadow mode then turns OVER_LIMIT
/// into OK.
fn per_descriptor_quota() -> Scenario {
    let quotas = || {
        rq(
            "quota-modes",
            vec![desc(&[("quota1", "a")]), desc(&[("quota2", "a")])],
        )
    };
    let mut steps = fill_one("quota-modes", ("regular", "over"), 5);
    steps.push(ask(
        "plain over, quota under (TestServicePerDescriptorQuotaMode :950)",
        rq(
            "quota-modes",
            vec![desc(&[("regular", "over")]), desc(&[("quota", "under")])],
        ),
        reject(vec![over(5, Minute, 0), ok(3, Minute, 2)]),
    ));
    steps.extend(fill_one("quota-modes", ("quota", "over"), 3));
    steps.push(ask(
        "plain under, the only quota over (TestServiceMixedPerDescriptorModes :1002)",
        rq(
            "quota-modes",
            vec![desc(&[("regular", "under")]), desc(&[("quota", "over")])],
        ),
        reject(vec![ok(5, Minute, 4), over(3, Minute, 0)]),
    ));
    steps.push(ask(
        "both under (TestServiceMixedPerDescriptorModesUnderLimit :1054)",
        rq(
            "quota-modes",
            vec![desc(&[("regular", "fresh")]), desc(&[("quota", "fresh")])],
        ),
        pass(vec![ok(5, Minute, 4), ok(3, Minute, 2)]),
    ));
    steps.extend(fill_one("quota-modes", ("quota1", "a"), 3));
    steps.push(ask(
        "one quota over, one under (TestServiceQuotaModeOnlySomeOverTheLimit :1152)",
        quotas(),
        pass(vec![over(3, Minute, 0), ok(3, Minute, 2)]),
    ));
    // quota2=a took one hit in the step above: two more fill it.
    steps.extend(
        fill_one("quota-modes", ("quota2", "a"), 3)
            .into_iter()
            .skip(1),
    );
    steps.push(ask(
        "all quota over (TestServiceQuotaModeOnlyAllOverTheLimit :1104)",
        quotas(),
        reject(vec![over(3, Minute, 0), over(3, Minute, 0)]),
    ));
    Scenario::new(
        "service per-descriptor quota mode",
        SOURCE,
        policy("service"),
        reference_defaults(),
        steps,
    )
}

/// `TestServiceQuotaModeWithShadowMode` (:1166-1229) and `TestServiceMixedModeWithShadowMode`
/// (:1231-1284): global shadow mode turns a rejection by quota descriptors OK as any other.
fn quota_with_shadow() -> Scenario {
    let mut steps = fill_one("quota-modes", ("quota1", "s"), 3);
    steps.extend(fill_one("quota-modes", ("quota2", "s"), 3));
    steps.push(ask(
        "all quota over, global shadow mode (:1214)",
        rq(
            "quota-modes",
            vec![desc(&[("quota1", "s")]), desc(&[("quota2", "s")])],
        ),
        pass(vec![over(3, Minute, 0), over(3, Minute, 0)]),
    ));
    steps.extend(fill_one("quota-modes", ("regular", "s"), 5));
    steps.extend(fill_one("quota-modes", ("quota", "s"), 3));
    steps.push(ask(
        "plain and quota over, global shadow mode (:1269)",
        rq(
            "quota-modes",
            vec![desc(&[("regular", "s")]), desc(&[("quota", "s")])],
        ),
        pass(vec![over(5, Minute, 0), over(3, Minute, 0)]),
    ));
    Scenario::new(
        "service quota mode with global shadow mode",
        SOURCE,
        policy("service"),
        Settings {
            shadow_mode: true,
            ..reference_defaults()
        },
        steps,
    )
}

/// The dynamic metadata unit test (src/service/ratelimit_test.go:17-223): the shape of the
/// metadata for four requests, under RESPONSE_DYNAMIC_METADATA.
fn metadata_units() -> Scenario {
    let mut steps = vec![ask(
        "no descriptor passed with metadata (:30)",
        rq("fake-domain", vec![desc(&[("key1", "val1")])]),
        pass(vec![free()]).metadata(json!({
            "descriptors": [{"entries": ["key1=val1"]}],
            "domain": "fake-domain",
        })),
    )];
    steps.push(ask(
        "a quota descriptor passed with metadata (:74)",
        rq("quota-domain", vec![desc(&[("quota_key", "quota_val")])]),
        pass(vec![ok(10, Minute, 9)]).metadata(json!({
            "descriptors": [{"entries": ["quota_key=quota_val"]}],
            "domain": "quota-domain",
            "metadata": {"name": "service_1"},
        })),
    ));
    steps.extend(fill_one("mixed-domain", ("regular_key", "regular_val"), 1));
    steps.push(ask(
        "only the passed descriptors' metadata, the first winning (:127)",
        rq(
            "mixed-domain",
            vec![
                desc(&[("regular_key", "regular_val")]),
                desc(&[("quota_key", "quota_val")]),
                desc(&[("another_quota", "another_val")]),
            ],
        ),
        reject(vec![
            over(1, Minute, 0),
            ok(10, Minute, 9),
            ok(10, Minute, 9),
        ])
        .metadata(json!({
            "descriptors": [
                {"entries": ["regular_key=regular_val"]},
                {"entries": ["quota_key=quota_val"]},
                {"entries": ["another_quota=another_val"]},
            ],
            "domain": "mixed-domain",
            "metadata": {"name": "service_2"},
        })),
    ));
    let mut with_addend = rq("addend-domain", vec![desc(&[("test_key", "test_val")])]);
    with_addend.hits_addend = 5;
    steps.push(ask(
        "the request's hits_addend, no metadata (:196)",
        with_addend,
        pass(vec![ok(10, Minute, 5)]).metadata(json!({
            "descriptors": [{"entries": ["test_key=test_val"]}],
            "domain": "addend-domain",
            "hitsAddend": 5,
        })),
    ));
    // A descriptor's own hits_addend is listed too (the shape the code under that test builds;
    // its cases leave it out), so this one is tollgate's own check, not counted.
    steps.push(
        ask(
            "a descriptor's own hits_addend",
            rq(
                "addend-domain",
                vec![addend(desc(&[("test_key", "other")]), 0)],
            ),
            pass(vec![free()]).metadata(json!({
                "descriptors": [{"entries": ["test_key=other"], "hitsAddend": 0}],
                "domain": "addend-domain",
            })),
        )
        .setup(),
    );
    Scenario::new(
        "service dynamic metadata",
        METADATA_SOURCE,
        policy("service"),
        Settings {
            response_dynamic_metadata: true,
            ..reference_defaults()
        },
        steps,
    )
}

async fn service_answers(t: &Target) {
    run(t, &service()).await;
}

async fn global_shadow_mode(t: &Target) {
    run(t, &global_shadow()).await;
    run(t, &quota_with_shadow()).await;
}

async fn rule_shadow_mode(t: &Target) {
    run(t, &rule_shadow()).await;
}

async fn response_headers(t: &Target) {
    run(t, &headers()).await;
}

async fn invalid_requests(t: &Target) {
    run(t, &invalid()).await;
}

async fn cache_error(t: &Target) {
    run(t, &cache()).await;
}

async fn unlimited_limits(t: &Target) {
    run(t, &unlimiteds()).await;
}

async fn global_quota_mode(t: &Target) {
    run(t, &global_quota()).await;
}

async fn metadata_of_passed_descriptors(t: &Target) {
    run(t, &metadata_passed()).await;
}

async fn per_descriptor_quota_mode(t: &Target) {
    run(t, &per_descriptor_quota()).await;
}

async fn metadata_unit_cases(t: &Target) {
    run(t, &metadata_units()).await;
}
