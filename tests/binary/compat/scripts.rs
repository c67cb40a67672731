//! envoyproxy/ratelimit's docker-compose end-to-end scripts (`integration-test/scripts/*.sh`):
//! curl through Envoy to its example policy (`examples/ratelimit/config/example.yaml`, domain
//! `rl`) with RESPONSE_DYNAMIC_METADATA=true and the other settings at their defaults.
//!
//! Each call is written as the RateLimitRequest Envoy sends for it (the route's actions in
//! `examples/envoy/proxy.yaml`: `/twoheader` sends `(foo, bar)` and `(foo, baz)`, `/fourheader`
//! `(foo, bar)` and `(source_cluster, destination_cluster)`, `/fiveheader` adds `(category)`; a
//! missing header drops its descriptor), and an HTTP 429 is an OVER_LIMIT answer. Token quotas
//! check with `hits_addend: 0` on the request path and debit with `hits_addend: 1` when the
//! stream is done, an answer Envoy ignores (written here as setup steps, asserted but not counted).
//!
//! The scripts sleep 60 s to reach a new fixed window. A sliding window still holds a burst a
//! minute later, so those steps differ, and a step of tollgate's own after one more window shows
//! the quota whole again.

use serde_json::{Value as Json, json};
use tollgate::proto::rate_limit_response::rate_limit::Unit::Minute;
use tollgate::proto::{RateLimitDescriptor, RateLimitRequest};
use tollgate_testkit::cases;
use tollgate_testkit::target::Target;

use super::support::{
    Answer, Scenario, Step, addend, ask, desc, free, ok, over, pass, policy, reference_defaults,
    reject, repeat, rq, run,
};

cases! {
    multiservice_tokenquota: [memory, memory_grpc, memory_tonic, redis];
    quota: [memory, memory_grpc, memory_tonic, redis];
    replaces: [memory, memory_grpc, memory_tonic, redis];
    simple_get: [memory, memory_grpc, memory_tonic, redis];
    token_quota: [memory, memory_grpc, memory_tonic, redis];
    trigger_ratelimit: [memory, memory_grpc, memory_tonic, redis];
    trigger_shadow_mode_key: [memory, memory_grpc, memory_tonic, redis];
    value_included_in_stats_key_when_unspecified: [memory, memory_grpc, memory_tonic, redis];
}

const WINDOW_MS: u64 = 60_000;

const SLIDING_WHY: &str = "a minute after a burst that filled the limit, tollgate's sliding \
                           window still holds the burst where the reference's fixed window has \
                           just started afresh; one window later the quota is whole";

/// Every scenario of this file, for the inventory.
pub fn scenarios() -> Vec<Scenario> {
    vec![
        multiservice(),
        quotas(),
        replacing(),
        simple(),
        tokens(),
        trigger(),
        shadow(),
        unspecified(),
    ]
}

fn scenario(name: &'static str, source: &'static str, steps: Vec<Step>) -> Scenario {
    Scenario::new(
        name,
        source,
        policy("examples"),
        tollgate::limiter::Settings {
            response_dynamic_metadata: true,
            ..reference_defaults()
        },
        steps,
    )
}

fn rl(descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    rq("rl", descriptors)
}

/// What `/twoheader` sends for the headers `foo`, and `bar` and/or `baz`.
fn twoheader(
    foo_header: &str,
    bar_header: Option<&str>,
    baz_header: Option<&str>,
) -> RateLimitRequest {
    let mut descriptors = Vec::new();
    if let Some(value) = bar_header {
        descriptors.push(desc(&[("foo", foo_header), ("bar", value)]));
    }
    if let Some(value) = baz_header {
        descriptors.push(desc(&[("foo", foo_header), ("baz", value)]));
    }
    rl(descriptors)
}

/// What `/fourheader` sends: `(foo, bar)` and `(source_cluster=proxy, destination_cluster)`.
fn fourheader(foo_header: &str, bar_header: &str, destination: &str) -> RateLimitRequest {
    rl(vec![
        desc(&[("foo", foo_header), ("bar", bar_header)]),
        desc(&[
            ("source_cluster", "proxy"),
            ("destination_cluster", destination),
        ]),
    ])
}

/// What `/fiveheader` sends: `/fourheader`'s and `(category)`.
fn fiveheader(
    foo_header: &str,
    bar_header: &str,
    destination: &str,
    category: &str,
) -> RateLimitRequest {
    let mut request = fourheader(foo_header, bar_header, destination);
    request.descriptors.push(desc(&[("category", category)]));
    request
}

/// The dynamic metadata of a request to `rl`: its descriptors, and the merged metadata when a
/// descriptor that passed has some.
fn metadata(descriptors: Json, passed: Option<&str>) -> Json {
    let mut value = json!({"domain": "rl", "descriptors": descriptors});
    if let Some(name) = passed {
        value["metadata"] = json!({"service_with_quota": {"name": name}});
    }
    value
}

/// `multiservice-tokenquota.sh`: two quota services; the metadata of the first that passes
/// routes the request to it (Envoy copies it into a header its load balancer reads), and the
/// service it went to is debited when the response is done.
fn multiservice() -> Scenario {
    let check = || {
        rl(vec![
            addend(desc(&[("service", "service_1")]), 0),
            addend(desc(&[("service", "service_2")]), 0),
        ])
    };
    let listed = json!([
        {"entries": ["service=service_1"], "hitsAddend": 0},
        {"entries": ["service=service_2"], "hitsAddend": 0},
    ]);
    let debit = |service: &str, answer: Answer| {
        ask(
            format!("debit {service} on stream done"),
            rl(vec![addend(desc(&[("service", service)]), 1)]),
            answer,
        )
        .setup()
    };
    let routed = |answer: Answer, to: Option<&str>| answer.metadata(metadata(listed.clone(), to));
    let steps = vec![
        ask(
            "1: both have quota, to service 1",
            check(),
            routed(
                pass(vec![ok(1, Minute, 1), ok(2, Minute, 2)]),
                Some("service_1"),
            ),
        ),
        debit("service_1", pass(vec![ok(1, Minute, 0)])),
        ask(
            "2: service 1 at its limit, still to it",
            check(),
            routed(
                pass(vec![ok(1, Minute, 0), ok(2, Minute, 2)]),
                Some("service_1"),
            ),
        ),
        debit("service_1", reject(vec![over(1, Minute, 0)])),
        ask(
            "3: service 1 over, to service 2",
            check(),
            routed(
                pass(vec![over(1, Minute, 0), ok(2, Minute, 2)]),
                Some("service_2"),
            ),
        ),
        debit("service_2", pass(vec![ok(2, Minute, 1)])),
        ask(
            "4: to service 2",
            check(),
            routed(
                pass(vec![over(1, Minute, 0), ok(2, Minute, 1)]),
                Some("service_2"),
            ),
        ),
        debit("service_2", pass(vec![ok(2, Minute, 0)])),
        ask(
            "5: service 2 at its limit, still to it",
            check(),
            routed(
                pass(vec![over(1, Minute, 0), ok(2, Minute, 0)]),
                Some("service_2"),
            ),
        ),
        debit("service_2", reject(vec![over(2, Minute, 0)])),
        ask(
            "6: both over: 429",
            check(),
            routed(reject(vec![over(1, Minute, 0), over(2, Minute, 0)]), None),
        ),
        ask(
            "7: after sleep 60",
            check(),
            routed(
                pass(vec![ok(1, Minute, 1), ok(2, Minute, 2)]),
                Some("service_1"),
            ),
        )
        .after(WINDOW_MS)
        .differs(
            routed(reject(vec![over(1, Minute, 0), over(2, Minute, 0)]), None),
            SLIDING_WHY,
        ),
        ask(
            "7 restated: one window later",
            check(),
            routed(
                pass(vec![ok(1, Minute, 1), ok(2, Minute, 2)]),
                Some("service_1"),
            ),
        )
        .after(WINDOW_MS)
        .setup(),
    ];
    scenario(
        "script multiservice-tokenquota",
        "integration-test/scripts/multiservice-tokenquota.sh",
        steps,
    )
}

/// `quota.sh`: two quota descriptors, each call counting on both; rejected only when both are
/// over.
fn quotas() -> Scenario {
    let call = || {
        rl(vec![
            desc(&[("service", "service_1")]),
            desc(&[("service", "service_2")]),
        ])
    };
    let steps = vec![
        ask("1", call(), pass(vec![ok(1, Minute, 0), ok(2, Minute, 1)])),
        ask(
            "2: one quota over",
            call(),
            pass(vec![over(1, Minute, 0), ok(2, Minute, 0)]),
        ),
        ask(
            "3: both over",
            call(),
            reject(vec![over(1, Minute, 0), over(2, Minute, 0)]),
        ),
        ask(
            "4: after sleep 60",
            call(),
            pass(vec![ok(1, Minute, 0), ok(2, Minute, 1)]),
        )
        .after(WINDOW_MS)
        .differs(
            reject(vec![over(1, Minute, 0), over(2, Minute, 0)]),
            SLIDING_WHY,
        ),
        // Step 4 was charged as well (every hit counts), so the quota is whole two windows on.
        ask(
            "4 restated: once every hit has left the window",
            call(),
            pass(vec![ok(1, Minute, 0), ok(2, Minute, 1)]),
        )
        .after(2 * WINDOW_MS)
        .setup(),
    ];
    scenario("script quota", "integration-test/scripts/quota.sh", steps)
}

/// `replaces.sh`: a limit is not counted while a descriptor of the same request replaces it,
/// one limit may replace several, and a replaced limit keeps its own counter.
fn replacing() -> Scenario {
    let banned = || over(0, Minute, 0).named("banned_limit");
    let bkthomps = |remaining| ok(1, Minute, remaining).named("bkthomps");
    let fake = |remaining| ok(2, Minute, remaining).named("fake_name");
    let account = || fiveheader("my_foo", "bkthomps", "fake", "account");
    let mut steps = vec![
        ask(
            "1: banned (0 per minute)",
            twoheader("bkthomps", Some("banned"), None),
            reject(vec![banned()]),
        ),
        ask(
            "2: banned and mock",
            fourheader("bkthomps", "banned", "mock"),
            reject(vec![banned(), ok(1, Minute, 0)]),
        ),
        ask(
            "3: override replaces banned_limit",
            fourheader("bkthomps", "banned", "override"),
            pass(vec![free(), ok(2, Minute, 1)]),
        ),
        ask(
            "4",
            fourheader("bkthomps", "banned", "override"),
            pass(vec![free(), ok(2, Minute, 0)]),
        ),
        ask(
            "5: override over",
            fourheader("bkthomps", "banned", "override"),
            reject(vec![free(), over(2, Minute, 0)]),
        ),
        ask(
            "6: bkthomps replaced by destination bkthomps",
            fourheader("my_foo", "bkthomps", "bkthomps"),
            pass(vec![free(), ok(2, Minute, 1)]),
        ),
        ask(
            "7",
            fourheader("my_foo", "bkthomps", "bkthomps"),
            pass(vec![free(), ok(2, Minute, 0)]),
        ),
        ask(
            "8: destination bkthomps over",
            fourheader("my_foo", "bkthomps", "bkthomps"),
            reject(vec![free(), over(2, Minute, 0)]),
        ),
        ask(
            "9: not replaced, never counted while it was",
            fourheader("my_foo", "bkthomps", "not_bkthomps"),
            pass(vec![bkthomps(0), free()]),
        ),
        ask(
            "10: bkthomps over",
            fourheader("my_foo", "bkthomps", "not_bkthomps"),
            reject(vec![over(1, Minute, 0).named("bkthomps"), free()]),
        ),
        ask(
            "11: replaced again, destination still over",
            fourheader("my_foo", "bkthomps", "bkthomps"),
            reject(vec![free(), over(2, Minute, 0)]),
        ),
    ];
    steps.extend(repeat(4, |i| {
        ask(
            format!("{}: account replaces bkthomps and fake_name", 12 + i),
            account(),
            pass(vec![free(), free(), ok(4, Minute, 3 - i)]),
        )
    }));
    steps.extend([
        ask(
            "16: account over",
            account(),
            reject(vec![free(), free(), over(4, Minute, 0)]),
        ),
        ask(
            "17: another foo, a counter of its own",
            twoheader("foo_2", Some("bkthomps"), None),
            pass(vec![bkthomps(0)]),
        ),
        ask(
            "18",
            twoheader("foo_2", Some("bkthomps"), None),
            reject(vec![over(1, Minute, 0).named("bkthomps")]),
        ),
        ask(
            "19: fake_name, not counted while it was replaced",
            fourheader("foo_3", "bar_3", "fake"),
            pass(vec![ok(3, Minute, 2), fake(1)]),
        ),
        ask(
            "20",
            fourheader("foo_3", "bar_3", "fake"),
            pass(vec![ok(3, Minute, 1), fake(0)]),
        ),
        ask(
            "21: fake_name over",
            fourheader("foo_3", "bar_3", "fake"),
            reject(vec![
                ok(3, Minute, 0),
                over(2, Minute, 0).named("fake_name"),
            ]),
        ),
        ask(
            "22: account still over",
            account(),
            reject(vec![free(), free(), over(4, Minute, 0)]),
        ),
    ]);
    scenario(
        "script replaces",
        "integration-test/scripts/replaces.sh",
        steps,
    )
}

/// `simple-get.sh`: one call under a shadow-mode limit.
fn simple() -> Scenario {
    scenario(
        "script simple-get",
        "integration-test/scripts/simple-get.sh",
        vec![ask(
            "1",
            twoheader("test", None, Some("shady")),
            pass(vec![ok(3, Minute, 2)]),
        )],
    )
}

/// `token-quota.sh`: check with `hits_addend: 0`, debit 1 when the response is done. The third
/// check finds the quota exactly used (2 of 2: OK, nothing left); its debit takes usage above the
/// limit, and the fourth check is rejected.
fn tokens() -> Scenario {
    let check = || rl(vec![addend(desc(&[("service", "service_2")]), 0)]);
    let debit = |answer: Answer| {
        ask(
            "debit on stream done",
            rl(vec![addend(desc(&[("service", "service_2")]), 1)]),
            answer,
        )
        .setup()
    };
    let steps = vec![
        ask("1", check(), pass(vec![ok(2, Minute, 2)])),
        debit(pass(vec![ok(2, Minute, 1)])),
        ask("2", check(), pass(vec![ok(2, Minute, 1)])),
        debit(pass(vec![ok(2, Minute, 0)])),
        ask(
            "3: used up, not over",
            check(),
            pass(vec![ok(2, Minute, 0)]),
        ),
        debit(reject(vec![over(2, Minute, 0)])),
        ask("4: over: 429", check(), reject(vec![over(2, Minute, 0)])),
    ];
    scenario(
        "script token-quota",
        "integration-test/scripts/token-quota.sh",
        steps,
    )
}

/// `trigger-ratelimit.sh`: three per minute, the fourth and fifth call rejected.
fn trigger() -> Scenario {
    let call = || twoheader("pelle", None, Some("not-so-shady"));
    let steps = repeat(5, |i| {
        let answer = if i < 3 {
            pass(vec![ok(3, Minute, 2 - i)])
        } else {
            reject(vec![over(3, Minute, 0)])
        };
        ask(format!("{}", i + 1), call(), answer)
    });
    scenario(
        "script trigger-ratelimit",
        "integration-test/scripts/trigger-ratelimit.sh",
        steps,
    )
}

/// `trigger-shadow-mode-key.sh`: a shadow-mode limit never rejects; over it, it answers OK with
/// nothing left.
fn shadow() -> Scenario {
    let call = || twoheader("pelle", None, Some("shady"));
    let steps = repeat(6, |i| {
        ask(
            format!("{}", i + 1),
            call(),
            pass(vec![ok(3, Minute, 2u32.saturating_sub(i))]),
        )
    });
    scenario(
        "script trigger-shadow-mode-key",
        "integration-test/scripts/trigger-shadow-mode-key.sh",
        steps,
    )
}

/// `value-included-in-stats-key-when-unspecified.sh`: two per minute on a detailed_metric limit.
/// (Its metric check is about the reference's statsd names, not the answers.)
fn unspecified() -> Scenario {
    let call = || rl(vec![desc(&[("unspec", "unspecified_value")])]);
    scenario(
        "script value-included-in-stats-key-when-unspecified",
        "integration-test/scripts/value-included-in-stats-key-when-unspecified.sh",
        vec![
            ask("1", call(), pass(vec![ok(2, Minute, 1)])),
            ask("2", call(), pass(vec![ok(2, Minute, 0)])),
            ask("3", call(), reject(vec![over(2, Minute, 0)])),
        ],
    )
}

async fn multiservice_tokenquota(t: &Target) {
    run(t, &multiservice()).await;
}

async fn quota(t: &Target) {
    run(t, &quotas()).await;
}

async fn replaces(t: &Target) {
    run(t, &replacing()).await;
}

async fn simple_get(t: &Target) {
    run(t, &simple()).await;
}

async fn token_quota(t: &Target) {
    run(t, &tokens()).await;
}

async fn trigger_ratelimit(t: &Target) {
    run(t, &trigger()).await;
}

async fn trigger_shadow_mode_key(t: &Target) {
    run(t, &shadow()).await;
}

async fn value_included_in_stats_key_when_unspecified(t: &Target) {
    run(t, &unspecified()).await;
}
