//! The metrics, from known traffic: envoyproxy/ratelimit's per-limit statistics under its
//! Prometheus names and labels (exact counts on every store), the keys its rules give
//! (detailed_metric, wildcards, nested limits, overrides), the cap on keys built from request
//! values, the service series of a running server, and the backend's failures by kind, each
//! produced by a real Redis, with the log line that names it and no secret in it.

use std::sync::Arc;
use std::time::Duration;

use tollgate::config::Config;
use tollgate::descriptor::{LimitOverride, Request, Unit};
use tollgate::limiter::{Code, Limiter, Settings};
use tollgate::server::{Metrics, MetricsOptions};
use tollgate_testkit::backends::TestBackend;
use tollgate_testkit::in_process::InProcess;
use tollgate_testkit::net::{agent, send};
use tollgate_testkit::redis::RedisServer;
use tollgate_testkit::requests::{descriptor, request};
use tollgate_testkit::rls;
use tollgate_testkit::target::{Store, Target};
use tollgate_testkit::tollgate::Tollgate;
use tollgate_testkit::wait;

const DOMAIN: &str = "another";

/// One limit per behaviour under test, in the reference's file format.
const POLICY: &str = r#"
domain: another
descriptors:
  - key: key2
    rate_limit:
      unit: minute
      requests_per_unit: 20
      algorithm: sliding_window_log
  - key: shadow
    shadow_mode: true
    rate_limit:
      unit: minute
      requests_per_unit: 2
      algorithm: sliding_window_log
  - key: detailed
    detailed_metric: true
    rate_limit:
      unit: hour
      requests_per_unit: 1000
  - key: wild
    value: "foo*"
    rate_limit:
      unit: hour
      requests_per_unit: 1000
  - key: sharded
    rate_limit:
      unit: hour
      requests_per_unit: 8
      shards: 4
  - key: key1
    value: value1
    descriptors:
      - key: subkey1
        rate_limit:
          unit: hour
          requests_per_unit: 1000
"#;

fn config() -> Arc<Config> {
    Arc::new(Config::from_yaml("another.yaml", POLICY).expect("the test policy loads"))
}

/// The value of the sample `name{labels}` in a text exposition, `None` when absent.
fn sample(metrics: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let mut series = name.to_string();
    if !labels.is_empty() {
        let pairs: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
        series.push('{');
        series.push_str(&pairs.join(","));
        series.push('}');
    }
    metrics.lines().find_map(|line| {
        let value = line.strip_prefix(series.as_str())?.strip_prefix(' ')?;
        Some(value.trim().parse().expect("a number"))
    })
}

/// The five per-limit statistics of one series, in the order total, over, near, within,
/// shadow; absent series read as `None`.
fn per_limit(metrics: &str, labels: &[(&str, &str)]) -> [Option<f64>; 5] {
    [
        "total_hits",
        "over_limit",
        "near_limit",
        "within_limit",
        "shadow_mode",
    ]
    .map(|stat| {
        sample(
            metrics,
            &format!("ratelimit_service_rate_limit_{stat}"),
            labels,
        )
    })
}

/// Sends `request` `times` times, recording each decision as the server does.
async fn send_times(
    limiter: &Limiter<TestBackend>,
    metrics: &Metrics,
    request: &Request,
    times: usize,
) -> Vec<Code> {
    let mut codes = Vec::with_capacity(times);
    for _ in 0..times {
        let decision = limiter
            .should_rate_limit(request)
            .await
            .unwrap_or_else(|err| panic!("{request:?}: {err}"));
        metrics.observe_decision(&request.domain, &decision);
        codes.push(decision.overall);
    }
    codes
}

fn one(entries: &[(&str, &str)]) -> Request {
    request(DOMAIN, vec![descriptor(entries)])
}

// The reference's integration run: 25 calls on a 20-per-minute limit. Hits 17 to 20 are above
// 0.8 of the limit (near), the last five over it.
async fn per_limit_counts_follow_known_traffic(t: &Target) {
    let limiter = t.limiter(config(), Settings::default()).await;
    let metrics = Metrics::new();
    let codes = send_times(&limiter, &metrics, &one(&[("key2", "x")]), 25).await;
    assert_eq!(codes.iter().filter(|c| **c == Code::OverLimit).count(), 5);
    let text = metrics.render();
    let labels = [("domain", "another"), ("key1", "key2")];
    assert_eq!(
        per_limit(&text, &labels),
        [Some(25.0), Some(5.0), Some(4.0), Some(20.0), None],
        "{text}"
    );
}

// A shadow limit answers OK but counts its overs twice: as over_limit and as shadow_mode.
async fn shadow_limits_count_their_overs(t: &Target) {
    let limiter = t.limiter(config(), Settings::default()).await;
    let metrics = Metrics::new();
    let codes = send_times(&limiter, &metrics, &one(&[("shadow", "x")]), 3).await;
    assert_eq!(codes, [Code::Ok; 3]);
    let text = metrics.render();
    let labels = [("domain", "another"), ("key1", "shadow")];
    // Limit 2, threshold floor(2 * 0.8) = 1: the second hit is near, the third over.
    assert_eq!(
        per_limit(&text, &labels),
        [Some(3.0), Some(1.0), Some(1.0), Some(2.0), Some(1.0)],
        "{text}"
    );
}

// NEAR_LIMIT_RATIO moves the threshold: at 0.5 of 20, hits 11 to 20 are near.
async fn the_near_limit_ratio_moves_the_threshold(t: &Target) {
    let limiter = t.limiter(config(), Settings::default()).await;
    let metrics = Metrics::with_options(MetricsOptions {
        near_limit_ratio: 0.5,
        ..MetricsOptions::default()
    });
    send_times(&limiter, &metrics, &one(&[("key2", "y")]), 22).await;
    let text = metrics.render();
    let labels = [("domain", "another"), ("key1", "key2")];
    assert_eq!(
        per_limit(&text, &labels),
        [Some(22.0), Some(2.0), Some(10.0), Some(20.0), None],
        "{text}"
    );
}

// The reference's key rules: detailed_metric keys by the request's value, a wildcard by its
// pattern, a nested limit fills key2, an override is keyed by the request's entries.
async fn keys_follow_the_references_rules(t: &Target) {
    let limiter = t.limiter(config(), Settings::default()).await;
    let metrics = Metrics::new();
    send_times(&limiter, &metrics, &one(&[("detailed", "alice")]), 2).await;
    send_times(&limiter, &metrics, &one(&[("detailed", "bob")]), 1).await;
    send_times(&limiter, &metrics, &one(&[("wild", "foo1")]), 1).await;
    send_times(&limiter, &metrics, &one(&[("wild", "foo2")]), 1).await;
    send_times(
        &limiter,
        &metrics,
        &one(&[("key1", "value1"), ("subkey1", "x")]),
        3,
    )
    .await;
    let mut overridden = descriptor(&[("key2", "v"), ("sub", "w")]);
    overridden.limit = Some(LimitOverride {
        requests_per_unit: 1,
        unit: Some(Unit::Hour),
    });
    let codes = send_times(&limiter, &metrics, &request(DOMAIN, vec![overridden]), 2).await;
    assert_eq!(codes, [Code::Ok, Code::OverLimit]);
    let text = metrics.render();
    let total =
        |labels: &[(&str, &str)]| sample(&text, "ratelimit_service_rate_limit_total_hits", labels);
    assert_eq!(
        total(&[("domain", "another"), ("key1", "detailed_alice")]),
        Some(2.0),
        "{text}"
    );
    assert_eq!(
        total(&[("domain", "another"), ("key1", "detailed_bob")]),
        Some(1.0)
    );
    assert_eq!(
        total(&[("domain", "another"), ("key1", "wild_foo*")]),
        Some(2.0)
    );
    assert_eq!(
        total(&[
            ("domain", "another"),
            ("key1", "key1_value1"),
            ("key2", "subkey1")
        ]),
        Some(3.0)
    );
    assert_eq!(
        total(&[("domain", "another"), ("key1", "key2_v"), ("key2", "sub_w")]),
        Some(2.0)
    );
    assert_eq!(
        sample(
            &text,
            "ratelimit_service_rate_limit_over_limit",
            &[("domain", "another"), ("key1", "key2_v"), ("key2", "sub_w")]
        ),
        Some(1.0)
    );
    // The series use the reference's names exactly: no `_total` appended.
    assert!(
        !text.contains("ratelimit_service_rate_limit_total_hits_total"),
        "{text}"
    );
}

// Each hit on a sharded limit touches one shard, or two when the first was full. The counts are
// the process's, and other tests of this binary have sharded limits too: the test runs alone in
// a process of its own, where they are this test's.
async fn sharded_hits_count_the_shards_they_touch(t: &Target) {
    let name = format!(
        "metrics::sharded_hits_count_the_shards_they_touch::{}",
        t.name()
    );
    if !tollgate_testkit::process::alone(&name) {
        return;
    }
    let limiter = t.limiter(config(), Settings::default()).await;
    let metrics = Metrics::new();
    let codes = send_times(&limiter, &metrics, &one(&[("sharded", "x")]), 12).await;
    let refused = codes.iter().filter(|c| **c == Code::OverLimit).count();
    assert!(refused >= 4, "8 of 12 fit at most: {codes:?}");
    let text = metrics.render();
    let touched = |n: &str| {
        sample(&text, "tollgate_shard_hits_total", &[("shards_touched", n)]).unwrap_or(0.0)
    };
    assert_eq!(touched("1") + touched("2"), 12.0, "{text}");
    // Every refused hit was tried on a second shard first.
    assert!(touched("2") >= refused as f64, "{text}");
}

// A limit of the config keeps the series it counts into. A second registry counting the same
// decisions, and a reloaded config (new limits, the same keys), still count every hit where the
// reference does: the series go on from where they were.
async fn counts_go_on_across_registries_and_reloads(t: &Target) {
    let limiter = t.limiter(config(), Settings::default()).await;
    let (first, second) = (Metrics::new(), Metrics::new());
    let request = one(&[("key2", "x")]);
    for round in 0..2 {
        if round == 1 {
            limiter.set_config(config());
        }
        for _ in 0..3 {
            let decision = limiter
                .should_rate_limit(&request)
                .await
                .expect("a decision");
            first.observe_decision(DOMAIN, &decision);
            second.observe_decision(DOMAIN, &decision);
        }
    }
    let labels = [("domain", "another"), ("key1", "key2")];
    for metrics in [&first, &second] {
        let text = metrics.render();
        assert_eq!(
            per_limit(&text, &labels),
            [Some(6.0), None, None, Some(6.0), None],
            "{text}"
        );
    }
}

tollgate_testkit::cases! {
    counts_go_on_across_registries_and_reloads: [memory];
    sharded_hits_count_the_shards_they_touch: [memory];
    per_limit_counts_follow_known_traffic: exact;
    shadow_limits_count_their_overs: exact;
    the_near_limit_ratio_moves_the_threshold: [memory];
    keys_follow_the_references_rules: [memory, redis];
    local_cache_refusals_count_as_the_references_do: exact;
}

// With the local over-limit cache on, the first refusal comes from the store and the next ones
// from the cache: the per-limit counts stay those of the reference's run, and the cache's
// answers also count under the reference's `over_limit_with_local_cache` statistic (unmapped by
// its default mapping, so named from the statsd name) and in tollgate's own series.
async fn local_cache_refusals_count_as_the_references_do(t: &Target) {
    let (backend, store) = t.counted_backend().await;
    let limiter = Limiter::new(config(), backend, Settings::default());
    let metrics = Metrics::new();
    let codes = send_times(&limiter, &metrics, &one(&[("key2", "cached")]), 25).await;
    assert_eq!(codes.iter().filter(|c| **c == Code::OverLimit).count(), 5);
    assert_eq!(
        store.hits(),
        21,
        "20 admitted and one refusal reached the store"
    );
    let text = metrics.render();
    let labels = [("domain", "another"), ("key1", "key2")];
    assert_eq!(
        per_limit(&text, &labels),
        [Some(25.0), Some(5.0), Some(4.0), Some(20.0), None],
        "{text}"
    );
    assert_eq!(
        sample(
            &text,
            "ratelimit_service_rate_limit_another_key2_over_limit_with_local_cache",
            &[]
        ),
        Some(4.0),
        "{text}"
    );
    let answers = sample(&text, "tollgate_local_cache_answers_total", &[]);
    assert!(answers.is_some_and(|n| n >= 4.0), "{text}");
}

/// 50,000 distinct detailed_metric values against the default cap of 10,000: 10,000 series of
/// their own, everything else in the domain's overflow series, counted.
#[test]
fn request_built_keys_are_capped() {
    tollgate_testkit::target::block_on(async {
        let target = Target::memory();
        let limiter = target.limiter(config(), Settings::default()).await;
        let metrics = Metrics::new();
        for i in 0..50_000 {
            let request = one(&[("detailed", &format!("user{i}"))]);
            send_times(&limiter, &metrics, &request, 1).await;
        }
        assert_eq!(metrics.request_keys(), 10_000);
        let text = metrics.render();
        assert_eq!(
            sample(
                &text,
                "ratelimit_service_rate_limit_total_hits",
                &[("domain", "another"), ("key1", "tollgate_overflow")]
            ),
            Some(40_000.0)
        );
        assert_eq!(
            sample(&text, "tollgate_metric_keys_overflowed_total", &[]),
            Some(40_000.0)
        );
        let series = text
            .lines()
            .filter(|l| l.starts_with("ratelimit_service_rate_limit_total_hits{"))
            .count();
        assert_eq!(series, 10_001);
        // A value seen before the cap keeps its own series.
        send_times(&limiter, &metrics, &one(&[("detailed", "user7")]), 1).await;
        assert_eq!(
            sample(
                &metrics.render(),
                "ratelimit_service_rate_limit_total_hits",
                &[("domain", "another"), ("key1", "detailed_user7")]
            ),
            Some(2.0)
        );
    });
}

fn get_metrics(server: &InProcess) -> String {
    let reply = send(&agent(), "GET", &server.url("/metrics"), &[], None);
    assert_eq!(reply.status, 200, "{reply:?}");
    reply.body
}

/// A running server counts gRPC calls and their time, invalid requests, and policy loads (the
/// first, a reload, a refused reload), and names the policies in force by their hash.
#[test]
fn a_server_counts_calls_errors_and_config_loads() {
    let server = InProcess::builder()
        .policy("another.yaml", POLICY)
        .reload_interval(Duration::from_millis(200))
        .start();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let mut client = rls::client(server.grpc_addr()).await.expect("connect");
        for _ in 0..3 {
            client
                .should_rate_limit(rls::request(DOMAIN, &[&[("key2", "grpc")]]))
                .await
                .expect("a decision");
        }
        let empty = client.should_rate_limit(rls::request("", &[])).await;
        assert!(empty.is_err());
    });
    let text = get_metrics(&server);
    let method = [("grpc_method", "ShouldRateLimit")];
    assert_eq!(
        sample(&text, "ratelimit_service_total_requests", &method),
        Some(4.0),
        "{text}"
    );
    assert_eq!(
        sample(
            &text,
            "ratelimit_service_response_time_seconds_count",
            &method
        ),
        Some(4.0)
    );
    assert_eq!(
        sample(
            &text,
            "ratelimit_service_should_rate_limit_error",
            &[("err_type", "service_error")]
        ),
        Some(1.0)
    );
    assert_eq!(
        sample(
            &text,
            "ratelimit_service_rate_limit_total_hits",
            &[("domain", "another"), ("key1", "key2")]
        ),
        Some(3.0)
    );
    assert_eq!(
        sample(&text, "ratelimit_service_config_load_success", &[]),
        Some(1.0)
    );
    assert!(
        text.contains("# TYPE ratelimit_service_response_time_seconds histogram"),
        "{text}"
    );
    let hash = config().content_hash();
    assert_eq!(
        sample(&text, "tollgate_config_hash", &[("hash", &hash)]),
        Some(1.0),
        "{text}"
    );
    assert!(
        sample(
            &text,
            "tollgate_config_last_load_success_timestamp_seconds",
            &[]
        ) > Some(0.0)
    );

    // A good change is a success, a broken one an error; the last good config stays.
    let file = server.config_dir().join("another.yaml");
    std::fs::write(
        &file,
        POLICY.replace("requests_per_unit: 20", "requests_per_unit: 21"),
    )
    .expect("write the policy");
    wait::until("the reload to be counted", Duration::from_secs(20), || {
        sample(
            &get_metrics(&server),
            "ratelimit_service_config_load_success",
            &[],
        ) == Some(2.0)
    });
    std::fs::write(&file, "domain: another\ndescriptors: [{key: }\n").expect("write");
    wait::until(
        "the refused reload to be counted",
        Duration::from_secs(20),
        || {
            sample(
                &get_metrics(&server),
                "ratelimit_service_config_load_error",
                &[],
            ) == Some(1.0)
        },
    );
    let text = get_metrics(&server);
    assert_eq!(
        sample(&text, "tollgate_config_hash", &[("hash", &hash)]),
        None,
        "the hash follows the policies in force: {text}"
    );

    // A reload that finds no policies at all is refused (without --allow-empty-config): an
    // error too, and the policies in force stay.
    std::fs::remove_file(&file).expect("remove the policy");
    wait::until(
        "the refused empty reload to be counted",
        Duration::from_secs(20),
        || {
            sample(
                &get_metrics(&server),
                "ratelimit_service_config_load_error",
                &[],
            ) == Some(2.0)
        },
    );
    assert_eq!(
        sample(
            &get_metrics(&server),
            "ratelimit_service_config_load_success",
            &[]
        ),
        Some(2.0)
    );
}

// Backend failures, produced by a real Redis and seen from outside the real binary: counted by
// kind, logged once per burst, with no credential in any log line or metric.

/// The password of every Redis user these tests make; it must never be printed.
const SECRET: &str = "s3cr3t-Pw-never-logged";

/// Sends `times` requests for the 20-per-minute limit; with the backend failing each is answered
/// by the limit's failure mode (allow).
fn decide_times(tollgate: &Tollgate, times: usize) {
    for _ in 0..times {
        decide(tollgate, "x");
    }
}

/// One request for the 20-per-minute limit on a value of its own (`poll-<n>`): a backend call
/// answered OK however many polls came before, for a poll that needs calls to keep succeeding (a
/// recovery is logged only after 10 s of them).
fn decide_fresh(tollgate: &Tollgate, n: usize) {
    decide(tollgate, &format!("poll-{n}"));
}

/// One request for the 20-per-minute limit with `key2` = `value`, which must be admitted.
fn decide(tollgate: &Tollgate, value: &str) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let mut client = rls::client(tollgate.grpc_addr()).await.expect("connect");
        let response = client
            .should_rate_limit(rls::request(DOMAIN, &[&[("key2", value)]]))
            .await
            .expect("a decision")
            .into_inner();
        assert_eq!(response.overall_code, 1, "allowed: {response:?}");
    });
}

fn tollgate_metrics(tollgate: &Tollgate) -> String {
    let reply = send(&agent(), "GET", &tollgate.url("/metrics"), &[], None);
    assert_eq!(reply.status, 200, "{reply:?}");
    reply.body
}

/// tollgate on the Redis at `url` (which carries [`SECRET`]).
fn on_redis(url: &str) -> Tollgate {
    Tollgate::builder()
        .policy("another.yaml", POLICY)
        .args(["--backend", "redis"])
        .env("TOLLGATE_REDIS_URL", url)
        .start()
}

/// The lines of `log` that report a failure of `kind` starting.
fn failure_reports(log: &str, kind: &str) -> usize {
    log.lines()
        .filter(|l| l.contains("backend call failed") && l.contains(&format!("kind=\"{kind}\"")))
        .count()
}

/// Asserts what `times` failed decisions of `kind` leave: one error per call under its kind,
/// the reference's counts (total hits and one `redis_error` per request), the failure-mode
/// answers, one log line, and the secret nowhere.
fn assert_failures(tollgate: &Tollgate, kind: &str, times: usize) {
    let text = tollgate_metrics(tollgate);
    let n = Some(times as f64);
    assert_eq!(
        sample(
            &text,
            "tollgate_backend_errors_total",
            &[("backend", "redis"), ("kind", kind)]
        ),
        n,
        "{text}"
    );
    assert_eq!(
        sample(
            &text,
            "ratelimit_service_should_rate_limit_error",
            &[("err_type", "redis_error")]
        ),
        n
    );
    assert_eq!(
        per_limit(&text, &[("domain", "another"), ("key1", "key2")]),
        [n, None, None, None, None],
        "a failed call counts only its hits: {text}"
    );
    assert_eq!(
        sample(
            &text,
            "tollgate_failure_mode_answers_total",
            &[("limit", "another.key2"), ("answer", "allow")]
        ),
        n
    );
    assert!(
        text.contains(
            "tollgate_backend_call_duration_seconds_count{backend=\"redis\",operation=\"acquire\"}"
        ),
        "{text}"
    );
    let log = tollgate.log();
    assert_eq!(failure_reports(&log, kind), 1, "one line per burst:\n{log}");
    assert!(!log.contains(SECRET), "the password is in the log:\n{log}");
    assert!(!text.contains(SECRET), "the password is in the metrics");
}

#[test]
fn an_out_of_memory_redis_is_counted_as_oom() {
    let redis = RedisServer::start_with(&[
        "--maxmemory",
        "1",
        "--maxmemory-policy",
        "noeviction",
        "--requirepass",
        SECRET,
    ]);
    let url = format!("redis://:{SECRET}@127.0.0.1:{}", redis.port());
    let tollgate = on_redis(&url);
    decide_times(&tollgate, 7);
    assert_failures(&tollgate, "oom", 7);
}

/// A user who may not run the scripts is refused at start-up (tests/redis/hardening/permissions.rs);
/// one who loses `EVALSHA` while tollgate runs (an ACL changed under it) fails every call.
#[test]
fn a_user_without_evalsha_is_counted_as_noperm() {
    let redis = RedisServer::start();
    let set_user = |rules: &[&str]| {
        let mut args = vec!["ACL", "SETUSER", "limited", "on"];
        args.extend_from_slice(rules);
        let created = redis.cli(&args);
        assert!(created.contains("OK"), "{created}");
    };
    let password = format!(">{SECRET}");
    set_user(&[&password, "~*", "+@all"]);
    let url = format!("redis://limited:{SECRET}@127.0.0.1:{}", redis.port());
    let tollgate = on_redis(&url);
    set_user(&["-evalsha"]);
    decide_times(&tollgate, 5);
    assert_failures(&tollgate, "noperm", 5);
}

#[test]
fn a_stopped_redis_is_counted_as_connection_and_its_return_logged() {
    let mut redis = RedisServer::start_with(&["--requirepass", SECRET]);
    let url = format!("redis://:{SECRET}@127.0.0.1:{}", redis.port());
    let tollgate = on_redis(&url);
    decide_times(&tollgate, 1);
    redis.stop();
    decide_times(&tollgate, 6);
    let text = tollgate_metrics(&tollgate);
    let errors = sample(
        &text,
        "tollgate_backend_errors_total",
        &[("backend", "redis"), ("kind", "connection")],
    );
    assert!(errors >= Some(6.0), "{text}");
    let log = tollgate.log();
    assert_eq!(failure_reports(&log, "connection"), 1, "{log}");

    redis.restart();
    let mut polls = 0;
    wait::until("the recovery to be logged", Duration::from_secs(30), || {
        polls += 1;
        decide_fresh(&tollgate, polls);
        tollgate.log().contains("backend answers again")
    });
    let log = tollgate.log();
    let recoveries = log
        .lines()
        .filter(|l| l.contains("backend answers again") && l.contains("kind=\"connection\""))
        .count();
    assert_eq!(recoveries, 1, "{log}");
    assert!(!log.contains(SECRET), "the password is in the log:\n{log}");
    assert!(!tollgate_metrics(&tollgate).contains(SECRET));
}

/// The metric names (`tollgate_*`, `ratelimit_*`) a PromQL expression uses.
fn series_in(expr: &str) -> Vec<String> {
    expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .filter(|token| token.starts_with("tollgate_") || token.starts_with("ratelimit_"))
        .map(str::to_string)
        .collect()
}

/// Whether `/metrics` serves `name`: as a sample, or as a family (declared by `# TYPE`, which a
/// labelled family has before its first series).
fn is_served(metrics: &str, name: &str) -> bool {
    let sample = metrics.lines().any(|line| {
        line.strip_prefix(name)
            .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
    });
    let family = ["_total", "_bucket", "_count", "_sum", ""]
        .iter()
        .filter_map(|suffix| name.strip_suffix(suffix))
        .any(|base| metrics.contains(&format!("# TYPE {base} ")));
    sample || family
}

/// Every series the Grafana dashboard and the alerting rules under `deploy/` query is one a
/// server serves, once it has seen the traffic the series count.
#[test]
fn the_dashboard_and_alerts_query_served_series() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("deploy/grafana/tollgate.json")).expect("read"),
    )
    .expect("the dashboard is JSON");
    let mut names = std::collections::BTreeSet::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().expect("targets") {
            names.extend(series_in(target["expr"].as_str().expect("an expr")));
        }
    }
    let alerts = std::fs::read_to_string(root.join("deploy/prometheus/alerts.yaml")).expect("read");
    let mut alert_names = 0;
    for line in alerts.lines() {
        if let Some(expr) = line.trim().strip_prefix("expr:") {
            let found = series_in(expr);
            assert!(!found.is_empty(), "an alert on no tollgate series: {line}");
            alert_names += found.len();
            names.extend(found);
        }
    }
    assert!(alert_names >= 7 && names.len() >= 15, "{names:?}");

    let server = InProcess::builder()
        .policy("another.yaml", POLICY)
        .reload_interval(Duration::from_millis(200))
        .start();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let mut client = rls::client(server.grpc_addr()).await.expect("connect");
        for (key, times) in [("key2", 25), ("shadow", 3), ("sharded", 12)] {
            for _ in 0..times {
                client
                    .should_rate_limit(rls::request(DOMAIN, &[&[(key, "d")]]))
                    .await
                    .expect("a decision");
            }
        }
        let empty = client.should_rate_limit(rls::request("", &[])).await;
        assert!(empty.is_err());
    });
    std::fs::write(server.config_dir().join("another.yaml"), "domain: [\n").expect("write");
    wait::until("the refused reload", Duration::from_secs(20), || {
        sample(
            &get_metrics(&server),
            "ratelimit_service_config_load_error",
            &[],
        ) == Some(1.0)
    });
    // A second server on a Redis out of memory: backend failures and failure-mode answers.
    let redis = RedisServer::start_with(&["--maxmemory", "1", "--maxmemory-policy", "noeviction"]);
    let failing = InProcess::builder()
        .policy("another.yaml", POLICY)
        .store(Store::Redis(redis.url()))
        .start();
    runtime.block_on(async {
        let mut client = rls::client(failing.grpc_addr()).await.expect("connect");
        client
            .should_rate_limit(rls::request(DOMAIN, &[&[("key2", "d")]]))
            .await
            .expect("a failure-mode answer");
    });
    let metrics = get_metrics(&server) + &get_metrics(&failing);
    let missing: Vec<&String> = names.iter().filter(|n| !is_served(&metrics, n)).collect();
    assert!(missing.is_empty(), "not served: {missing:?}\n{metrics}");
}

/// `PROMETHEUS_MAPPER_YAML` maps the reference's statistics by the file's rules (here Envoy
/// Gateway's form plus a rule of its own), and names once the keys it does not support.
#[test]
fn a_mapping_file_names_the_series_and_its_unsupported_keys() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let file = dir.path().join("conf.yaml");
    std::fs::write(
        &file,
        "defaults:\n  ttl: 1m\nmappings:\n\
         - match: \"ratelimit.service.rate_limit.*.*.total_hits\"\n  name: \"hits_by_key\"\n  labels:\n    d: \"$1\"\n    k: \"$2\"\n\
         - match: \"ratelimit.service.rate_limit.*.*.*\"\n  action: drop\n  name: dropped\n\
         - match: \"ratelimit_server.*.response_time\"\n  name: \"rls_time\"\n  timer_type: histogram\n  ttl: 5m\n  labels:\n    method: \"$1\"\n",
    )
    .expect("write the mapping");
    let tollgate = Tollgate::builder()
        .policy("another.yaml", POLICY)
        .env("PROMETHEUS_MAPPER_YAML", &file.display().to_string())
        .start();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let mut client = rls::client(tollgate.grpc_addr()).await.expect("connect");
        for _ in 0..2 {
            client
                .should_rate_limit(rls::request(DOMAIN, &[&[("key2", "m")]]))
                .await
                .expect("a decision");
        }
    });
    let text = tollgate_metrics(&tollgate);
    assert_eq!(
        sample(&text, "hits_by_key", &[("d", "another"), ("k", "key2")]),
        Some(2.0),
        "{text}"
    );
    // Dropped by the file's rule; the default mapping's names are not used.
    assert!(!text.contains("within_limit"), "{text}");
    assert_eq!(
        sample(&text, "rls_time_count", &[("method", "ShouldRateLimit")]),
        Some(2.0),
        "{text}"
    );
    let log = tollgate.log();
    let warning = log
        .lines()
        .find(|l| l.contains("PROMETHEUS_MAPPER_YAML"))
        .unwrap_or_else(|| panic!("no line names the file:\n{log}"));
    assert!(
        warning.contains("WARN") && warning.contains("defaults.ttl, mappings[].ttl"),
        "{warning}"
    );
}

// DISABLE_STATS=true, as in the reference, records no per-limit statistics; the service's own
// series (calls, decisions by code) still count, so health and alerts on them keep working.
#[test]
fn disable_stats_records_no_per_limit_series() {
    let tollgate = Tollgate::builder()
        .policy("another.yaml", POLICY)
        .env("DISABLE_STATS", "true")
        .start();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let mut client = rls::client(tollgate.grpc_addr()).await.expect("connect");
        for _ in 0..3 {
            client
                .should_rate_limit(rls::request(DOMAIN, &[&[("key2", "off")]]))
                .await
                .expect("a decision");
        }
    });
    let text = tollgate_metrics(&tollgate);
    let labels = [("domain", "another"), ("key1", "key2")];
    assert_eq!(per_limit(&text, &labels), [None; 5], "{text}");
    assert!(!text.contains("ratelimit_service_rate_limit_"), "{text}");
    assert_eq!(
        sample(
            &text,
            "ratelimit_service_total_requests",
            &[("grpc_method", "ShouldRateLimit")]
        ),
        Some(3.0),
        "{text}"
    );
    assert!(
        !tollgate.log().contains("DISABLE_STATS"),
        "no warning says it is ignored"
    );
}
