//! The operator's questions about a client, against the `tollgate` binary: `POST /counters`
//! answers every limit of each descriptor and consumes nothing, `POST /counters/reset` is 403
//! until `--admin-allow-reset` and then clears what it names (memory and a real Redis), bad
//! input is a 400 with its reason, and `tollgate counters get|reset` answers the same from a
//! real `redis-server` with no instance running in between.

use std::process::{Command, Output};

use serde_json::{Value, json};
use tollgate_testkit::net::{Reply, agent, send};
use tollgate_testkit::redis::{RedisServer, unique_prefix};
use tollgate_testkit::tollgate::Tollgate;

const POLICY: &str = "domain: edge
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 5, name: per_user}
  - key: tenant
    rate_limits:
      - {window: 10s, requests_per_unit: 3}
      - {unit: hour, requests_per_unit: 100, name: hourly, algorithm: sliding_window_log}
  - key: free
    rate_limit: {unlimited: true}
";

fn post(tollgate: &Tollgate, path: &str, body: &str) -> Reply {
    send(
        &agent(),
        "POST",
        &tollgate.url(path),
        &[("content-type", "application/json")],
        Some(body),
    )
}

/// A request for `edge` with one descriptor per entry list, as proto3 JSON.
fn request(descriptors: &[&[(&str, &str)]]) -> String {
    super::admin::request("edge", descriptors).to_string()
}

/// POSTs `body` to `path`, which must answer 200 with JSON.
fn answer(tollgate: &Tollgate, path: &str, body: &str) -> Value {
    let reply = post(tollgate, path, body);
    assert_eq!(reply.status, 200, "{path}: {reply:?}");
    assert_eq!(reply.header("content-type"), Some("application/json"));
    serde_json::from_str(&reply.body).unwrap_or_else(|err| panic!("{err}: {reply:?}"))
}

/// `answer` with every `resetSeconds` checked to lie in `range` and taken out, so the rest
/// compares exactly.
fn without_resets(mut answer: Value, range: std::ops::RangeInclusive<u64>) -> Value {
    if let Some(descriptors) = answer["descriptors"].as_array_mut() {
        for descriptor in descriptors {
            if let Some(limits) = descriptor["limits"].as_array_mut() {
                for limit in limits {
                    let reset = limit["resetSeconds"].as_u64().expect("resetSeconds");
                    assert!(range.contains(&reset), "{limit}");
                    limit.as_object_mut().map(|l| l.remove("resetSeconds"));
                }
            }
        }
    }
    answer
}

/// `limitRemaining` of the first status of a `POST /json` decision.
fn remaining_after_a_hit(tollgate: &Tollgate, entries: &[(&str, &str)]) -> Option<u64> {
    let reply = post(tollgate, "/json", &request(&[entries]));
    let decision: Value = serde_json::from_str(&reply.body).expect("a JSON decision");
    decision["statuses"][0]["limitRemaining"].as_u64()
}

#[test]
fn counters_answers_every_limit_and_consumes_nothing() {
    let tollgate = Tollgate::start(POLICY);
    for _ in 0..3 {
        assert_eq!(
            post(&tollgate, "/json", &request(&[&[("user", "alice")]])).status,
            200
        );
    }
    assert_eq!(
        post(&tollgate, "/json", &request(&[&[("tenant", "t1")]])).status,
        200
    );

    let body = request(&[
        &[("user", "alice")],
        &[("tenant", "t1")],
        &[("free", "x")],
        &[("nobody", "x")],
    ]);
    let expected = json!({"descriptors": [
        {"entries": [{"key": "user", "value": "alice"}], "limits": [
            {"name": "per_user", "requestsPerUnit": 5, "unit": "MINUTE",
             "algorithm": "sliding_window_counter", "used": 3, "remaining": 2}]},
        {"entries": [{"key": "tenant", "value": "t1"}], "limits": [
            {"requestsPerUnit": 3, "window": "10s", "algorithm": "sliding_window_counter",
             "used": 1, "remaining": 2},
            {"name": "hourly", "requestsPerUnit": 100, "unit": "HOUR",
             "algorithm": "sliding_window_log", "used": 1, "remaining": 99}]},
        {"entries": [{"key": "free", "value": "x"}], "limits": []},
        {"entries": [{"key": "nobody", "value": "x"}], "limits": []},
    ]});
    // Asked twice: the same answer, nothing consumed.
    for _ in 0..2 {
        assert_eq!(
            without_resets(answer(&tollgate, "/counters", &body), 1..=7200),
            expected
        );
    }
    // The next decision finds the two units the answer said were left, less its own.
    assert_eq!(
        remaining_after_a_hit(&tollgate, &[("user", "alice")]),
        Some(1)
    );
    // An unknown domain limits nothing.
    let elsewhere = answer(
        &tollgate,
        "/counters",
        r#"{"domain":"nope","descriptors":[{"entries":[{"key":"user","value":"alice"}]}]}"#,
    );
    assert_eq!(elsewhere["descriptors"][0]["limits"], json!([]));
    // Only POST carries a request.
    assert_eq!(
        send(&agent(), "GET", &tollgate.url("/counters"), &[], None).status,
        405
    );
}

#[test]
fn reset_is_refused_without_the_flag() {
    let tollgate = Tollgate::start(POLICY);
    for _ in 0..2 {
        post(&tollgate, "/json", &request(&[&[("user", "eve")]]));
    }
    let refused = post(
        &tollgate,
        "/counters/reset",
        &request(&[&[("user", "eve")]]),
    );
    assert_eq!(refused.status, 403, "{refused:?}");
    assert!(refused.body.contains("--admin-allow-reset"), "{refused:?}");
    let still = answer(&tollgate, "/counters", &request(&[&[("user", "eve")]]));
    assert_eq!(still["descriptors"][0]["limits"][0]["used"], 2, "{still}");
}

/// Filled to 429, reset, admitted again: on memory and on a real Redis.
fn reset_clears_and_admits_again(tollgate: &Tollgate) {
    let bob = request(&[&[("user", "bob")], &[("tenant", "t2")]]);
    for _ in 0..5 {
        post(tollgate, "/json", &request(&[&[("user", "bob")]]));
    }
    post(tollgate, "/json", &request(&[&[("tenant", "t2")]]));
    assert_eq!(
        post(tollgate, "/json", &request(&[&[("user", "bob")]])).status,
        429
    );

    let cleared = answer(tollgate, "/counters/reset", &bob);
    assert_eq!(cleared["reset"], true, "{cleared}");
    let used =
        |answer: &Value, d: usize, l: usize| answer["descriptors"][d]["limits"][l]["used"].clone();
    assert_eq!(
        (
            used(&cleared, 0, 0),
            used(&cleared, 1, 0),
            used(&cleared, 1, 1)
        ),
        (json!(5), json!(1), json!(1)),
        "{cleared}"
    );
    let after = answer(tollgate, "/counters", &bob);
    assert_eq!(
        (used(&after, 0, 0), used(&after, 1, 0), used(&after, 1, 1)),
        (json!(0), json!(0), json!(0)),
        "{after}"
    );
    assert_eq!(remaining_after_a_hit(tollgate, &[("user", "bob")]), Some(4));
    // Again: nothing left to clear, and no error.
    answer(
        tollgate,
        "/counters/reset",
        &request(&[&[("tenant", "t2")]]),
    );
    assert!(
        tollgate.log().contains("counters reset"),
        "{}",
        tollgate.log()
    );
    assert!(
        tollgate.log().contains("user=bob per_user (used 5)"),
        "{}",
        tollgate.log()
    );
}

#[test]
fn reset_clears_and_admits_again_on_memory() {
    let tollgate = Tollgate::builder()
        .policy("edge.yaml", POLICY)
        .args(["--admin-allow-reset"])
        .start();
    reset_clears_and_admits_again(&tollgate);
}

#[test]
fn reset_clears_and_admits_again_on_redis() {
    let redis = RedisServer::shared();
    let tollgate = Tollgate::builder()
        .policy("edge.yaml", POLICY)
        .env("TOLLGATE_ADMIN_ALLOW_RESET", "true")
        .args(["--backend", "redis", "--redis-url", &redis.url()])
        .args(["--key-prefix", &unique_prefix("counters-reset")])
        .start();
    reset_clears_and_admits_again(&tollgate);
}

#[test]
fn counters_refuses_bad_input_with_400_and_touches_nothing() {
    let tollgate = Tollgate::builder()
        .policy("edge.yaml", POLICY)
        .args(["--admin-allow-reset"])
        .start();
    post(&tollgate, "/json", &request(&[&[("user", "dan")]]));
    let dan = r#"{"entries":[{"key":"user","value":"dan"}]}"#;
    let cases = [
        (r#"{"domain":"edge","#.to_owned(), "proto3 JSON"),
        (String::new(), "proto3 JSON"),
        (
            format!(r#"{{"domain":"","descriptors":[{dan}]}}"#),
            "domain must not be empty",
        ),
        (
            format!(r#"{{"descriptors":[{dan}]}}"#),
            "domain must not be empty",
        ),
        (
            r#"{"domain":"edge","descriptors":[]}"#.to_owned(),
            "descriptor list must not be empty",
        ),
        (
            r#"{"domain":"edge"}"#.to_owned(),
            "descriptor list must not be empty",
        ),
    ];
    for path in ["/counters", "/counters/reset"] {
        for (body, reason) in &cases {
            let reply = post(&tollgate, path, body);
            assert_eq!(reply.status, 400, "{path} {body:?}: {reply:?}");
            assert!(reply.body.contains(reason), "{path} {body:?}: {reply:?}");
        }
    }
    let still = answer(&tollgate, "/counters", &request(&[&[("user", "dan")]]));
    assert_eq!(still["descriptors"][0]["limits"][0]["used"], 1, "{still}");
}

fn tollgate_cli(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(args)
        .output()
        .expect("the tollgate binary runs")
}

#[test]
fn the_cli_reads_and_resets_a_client_in_redis() {
    let redis = RedisServer::shared();
    let prefix = unique_prefix("counters-cli");
    let url = redis.url();
    let tollgate = Tollgate::builder()
        .policy("edge.yaml", POLICY)
        .args([
            "--backend",
            "redis",
            "--redis-url",
            &url,
            "--key-prefix",
            &prefix,
        ])
        .start();
    for _ in 0..3 {
        post(&tollgate, "/json", &request(&[&[("user", "carol")]]));
    }
    let config = tollgate.config_dir().display().to_string();
    let store = [
        "--config",
        &config,
        "--backend",
        "redis",
        "--redis-url",
        &url,
        "--key-prefix",
        &prefix,
    ];
    let run_for = |domain: &str, command: &str, descriptors: &[&str]| {
        let mut args = vec!["counters", command];
        args.extend(store);
        args.extend(["--domain", domain]);
        for descriptor in descriptors {
            args.extend(["--descriptor", descriptor]);
        }
        tollgate_cli(&args)
    };
    let run = |command: &str, descriptors: &[&str]| run_for("edge", command, descriptors);
    let json_of = |out: &Output| -> Value {
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("JSON on stdout")
    };

    let got = json_of(&run("get", &["user=carol", "tenant=t9"]));
    let http = answer(
        &tollgate,
        "/counters",
        &request(&[&[("user", "carol")], &[("tenant", "t9")]]),
    );
    assert_eq!(without_resets(got, 0..=120), without_resets(http, 0..=120));
    let carol = |answer: &Value| answer["descriptors"][0]["limits"][0]["used"].clone();
    assert_eq!(carol(&json_of(&run("get", &["user=carol"]))), 3);

    let reset = run("reset", &["user=carol"]);
    let cleared = json_of(&reset);
    assert_eq!(
        (cleared["reset"].clone(), carol(&cleared)),
        (json!(true), json!(3))
    );
    assert!(
        String::from_utf8_lossy(&reset.stderr).contains("counters reset"),
        "{reset:?}"
    );
    assert_eq!(carol(&json_of(&run("get", &["user=carol"]))), 0);
    assert_eq!(
        remaining_after_a_hit(&tollgate, &[("user", "carol")]),
        Some(4)
    );

    // Bad descriptors and a request without a domain fail with the reason, touching nothing.
    for (bad, reason) in [
        ("user", "is not key=value"),
        ("=carol", "is not key=value"),
        ("user=carol,", "is not key=value"),
    ] {
        let out = run("get", &[bad]);
        assert!(!out.status.success(), "{bad}: {out:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains(reason),
            "{bad}: {out:?}"
        );
    }
    let out = run_for("", "reset", &["user=carol"]);
    assert!(!out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("domain must not be empty"),
        "{out:?}"
    );
    assert_eq!(carol(&json_of(&run("get", &["user=carol"]))), 1);
}

#[test]
fn the_cli_says_the_memory_backend_has_nothing_to_read() {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("edge.yaml"), POLICY).expect("write the policy");
    let config = dir.path().display().to_string();
    let out = tollgate_cli(&[
        "counters",
        "get",
        "--config",
        &config,
        "--backend",
        "memory",
        "--domain",
        "edge",
        "--descriptor",
        "user=alice",
    ]);
    assert!(!out.status.success(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("memory backend keeps counters inside each tollgate process"),
        "{stderr}"
    );
    assert!(stderr.contains("POST /counters"), "{stderr}");
}
