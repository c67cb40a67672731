//! envoyproxy/ratelimit's Go integration tests (`test/integration/integration_test.go`), whose
//! requests go through its gRPC service to a real Redis: the basic config with and without
//! `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`, a config reload, and share_threshold.
//!
//! The reference runs these on the wall clock and uses random values so counters start fresh;
//! here the values are fixed and each run has a key prefix of its own, and the clock is told, so
//! every hit of a loop lands in one window as the reference assumes.

use std::sync::Arc;

use tollgate::config::Config;
use tollgate::limiter::Settings;
use tollgate::proto::RateLimitRequest;
use tollgate::proto::rate_limit_response::rate_limit::Unit::{Day, Hour, Minute, Second};
use tollgate::window::Counting;
use tollgate_testkit::cases;
use tollgate_testkit::target::Target;

use super::support::{
    Scenario, Step, ask, desc, fixtures, free, ok, over, pass, policy, reference_defaults, reject,
    reload, repeat, rq, run,
};

cases! {
    basic_config: [memory, memory_grpc, memory_tonic, redis];
    basic_config_stop_increment_when_over_limit: [memory, memory_grpc, memory_tonic, redis];
    config_reload: [memory, memory_grpc, memory_tonic, redis];
    share_threshold: [memory, memory_grpc, memory_tonic, redis, redis_cluster];
}

const SOURCE: &str = "test/integration/integration_test.go";

/// Every scenario of this file, for the inventory.
pub fn scenarios() -> Vec<Scenario> {
    vec![
        basic(reference_defaults(), false),
        basic(
            Settings {
                counting: Counting::Admitted,
                ..reference_defaults()
            },
            true,
        ),
        reloaded(),
        shared(),
    ]
}

fn another(entries: &[(&str, &str)]) -> RateLimitRequest {
    rq("another", vec![desc(entries)])
}

/// `testBasicBaseConfig` (integration_test.go:549-781). With `stop_flag`, as the reference runs
/// it with `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=true`, which tollgate's counting of admitted
/// hits answers alike: a descriptor of a rejected request keeps the count it had.
fn basic(settings: Settings, stop_flag: bool) -> Scenario {
    let mut steps = vec![
        ask(
            "unknown domain (:569)",
            rq("foo", vec![desc(&[("hello", "world")])]),
            pass(vec![free()]),
        ),
        ask(
            "first hit of a second (:583)",
            rq("basic", vec![desc(&[("key1", "foo")])]),
            pass(vec![ok(50, Second, 49)]),
        ),
    ];
    // 25 hits on a 20/minute limit (:606-651).
    steps.extend(repeat(25, |i| {
        let request = another(&[("key2", "2718281828")]);
        let label = format!("key2 loop i={i} (:615)");
        if i < 20 {
            ask(label, request, pass(vec![ok(20, Minute, 19 - i)]))
        } else {
            ask(label, request, reject(vec![over(20, Minute, 0)]))
        }
    }));
    // 15 requests with a 20/minute and a 10/hour descriptor (:655-738): the request is rejected
    // from the 11th on; whether the 20/minute descriptor keeps counting depends on the flag.
    steps.extend(repeat(15, |i| {
        let request = rq(
            "another",
            vec![
                desc(&[("key2", "3141592653")]),
                desc(&[("key3", "2718281828")]),
            ],
        );
        let label = format!("key2+key3 loop i={i} (:694)");
        let key2_left = if stop_flag && i >= 10 { 10 } else { 19 - i };
        let key2 = ok(20, Minute, key2_left);
        if i < 10 {
            ask(label, request, pass(vec![key2, ok(10, Hour, 9 - i)]))
        } else {
            ask(label, request, reject(vec![key2, over(10, Hour, 0)]))
        }
    }));
    // The reset of a day limit counts down between two hits 2 s apart (:768-779).
    steps.push(ask(
        "key4 first (:769)",
        another(&[("key4", "durTest")]),
        pass(vec![ok(20, Day, 19)]),
    ));
    steps.push(
        ask(
            "key4 2 s later (:776)",
            another(&[("key4", "durTest")]),
            pass(vec![ok(20, Day, 18)]),
        )
        .after(2_000)
        .reset_shrinks(),
    );
    let name = if stop_flag {
        "integration basic config, STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=true"
    } else {
        "integration basic config"
    };
    Scenario::new(name, SOURCE, policy("integration"), settings, steps)
}

/// `testConfigReload` (integration_test.go:806-862): a domain unknown until its file is added.
fn reloaded() -> Scenario {
    // The reloaded directory: the three files and reload.yaml beside them.
    let dir = tempfile::tempdir().expect("a scratch directory");
    for name in ["basic.yaml", "another.yaml", "share_threshold.yaml"] {
        std::fs::copy(fixtures("integration").join(name), dir.path().join(name))
            .expect("copy a fixture");
    }
    std::fs::copy(
        fixtures("integration-reload/reload.yaml"),
        dir.path().join("reload.yaml"),
    )
    .expect("copy reload.yaml");
    let reloaded = Arc::new(Config::load(dir.path()).unwrap_or_else(|err| panic!("{err}")));
    Scenario::new(
        "integration config reload",
        SOURCE,
        policy("integration"),
        reference_defaults(),
        vec![
            ask(
                "before reload.yaml is in the config directory (:813)",
                rq("reload", vec![desc(&[("block", "foo")])]),
                pass(vec![free()]),
            ),
            reload("reload.yaml copied in (:822)", reloaded),
            ask(
                "after the reload (:843)",
                rq("reload", vec![desc(&[("key1", "foo")])]),
                pass(vec![ok(50, Second, 49)]),
            ),
        ],
    )
}

/// `testShareThreshold` (integration_test.go:914-991): every value a shared wildcard matches
/// counts against one counter; without share_threshold each value has its own. The reference
/// accepts OK or OVER_LIMIT in its first loop because its hour window outlives a run; here the
/// counters start fresh, so the answers are exact.
fn shared() -> Scenario {
    let mut steps: Vec<Step> = repeat(10, |i| {
        ask(
            format!("files/a.pdf i={i} (:925)"),
            rq(
                "share-threshold-test",
                vec![desc(&[("files", "files/a.pdf")])],
            ),
            pass(vec![ok(10, Hour, 9 - i)]),
        )
    });
    steps.push(ask(
        "files/b.csv shares the counter (:945)",
        rq(
            "share-threshold-test",
            vec![desc(&[("files", "files/b.csv")])],
        ),
        reject(vec![over(10, Hour, 0)]),
    ));
    steps.extend(repeat(10, |i| {
        let value = format!("files_no_share/{i}-unique");
        ask(
            format!("files_no_share own counter i={i} (:964)"),
            rq(
                "share-threshold-test",
                vec![desc(&[("files_no_share", &value)])],
            ),
            pass(vec![ok(10, Hour, 9)]),
        )
    }));
    Scenario::new(
        "integration share_threshold",
        SOURCE,
        policy("integration/share_threshold.yaml"),
        reference_defaults(),
        steps,
    )
}

async fn basic_config(t: &Target) {
    run(t, &basic(reference_defaults(), false)).await;
}

async fn basic_config_stop_increment_when_over_limit(t: &Target) {
    let settings = Settings {
        counting: Counting::Admitted,
        ..reference_defaults()
    };
    run(t, &basic(settings, true)).await;
}

async fn config_reload(t: &Target) {
    run(t, &reloaded()).await;
}

async fn share_threshold(t: &Target) {
    run(t, &shared()).await;
}
