//! Start-up settings at the binary's edge: the `ratelimit` entry point serving from nothing but
//! environment variables, the reference's own example setup reloading its policies, malformed
//! and unsupported settings stopping start-up with a message naming the variable, flags winning
//! over the environment, and `serve --help` naming every flag's variable.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use tollgate_testkit::mount::Mount;
use tollgate_testkit::net::{agent, send};
use tollgate_testkit::redis::RedisServer;
use tollgate_testkit::reference::{Ratelimit, RatelimitBuilder};
use tollgate_testkit::tollgate::{Tollgate, TollgateBuilder, tollgate_bin};
use tollgate_testkit::wait;

const REQUEST: &str =
    r#"{"domain":"rl","descriptors":[{"entries":[{"key":"foo","value":"bar"}]}]}"#;

/// Policies shaped like the reference's example (`examples/ratelimit/config/`): files without a
/// `.yaml` filter in mind, one nested.
const CONFIG: &str = "domain: rl
descriptors:
  - key: foo
    value: bar
    rate_limit: {unit: minute, requests_per_unit: 2}
";
const EXAMPLE: &str = "domain: other
descriptors:
  - key: source_cluster
    value: proxy
    descriptors:
      - key: destination_cluster
        value: mock
        rate_limit: {unit: second, requests_per_unit: 1}
";

/// The variables of the reference's docker-compose example, on loopback ports of the system's
/// choosing: Redis at `redis`, the policies in `<root>/ratelimit/config`, read without watching
/// the root and skipping dotfiles (a ConfigMap's `..data` links).
fn example_setup(redis: &RedisServer, root: &Path) -> RatelimitBuilder {
    Ratelimit::builder()
        .env("USE_STATSD", "false")
        .env("REDIS_SOCKET_TYPE", "tcp")
        .env("REDIS_URL", format!("127.0.0.1:{}", redis.port()))
        .env("RUNTIME_ROOT", root.display().to_string())
        .env("RUNTIME_SUBDIRECTORY", "ratelimit")
        .env("RUNTIME_WATCH_ROOT", "false")
        .env("RUNTIME_IGNOREDOTFILES", "true")
        .loopback_ports()
}

/// The reference's docker-compose example, as a Kubernetes Deployment mounts it: its
/// variables, with the policies in a ConfigMap-shaped directory read without watching the root.
#[test]
fn the_references_example_setup_serves_and_reloads_its_config_map() {
    let redis = RedisServer::start();
    let data = tempfile::tempdir().expect("a temporary directory");
    let mut config_map = Mount::create(
        &data.path().join("ratelimit/config"),
        &[
            ("config.yaml", CONFIG.as_bytes()),
            ("example", EXAMPLE.as_bytes()),
        ],
    );
    let ratelimit = example_setup(&redis, data.path())
        .env("LOG_LEVEL", "debug")
        .env("TOLLGATE_RELOAD_INTERVAL", "200ms")
        .start_healthy();
    let client = agent();
    let rlconfig = || send(&client, "GET", &ratelimit.url("/rlconfig"), &[], None).body;
    let table = rlconfig();
    assert!(table.contains("rl.foo_bar"), "{table}");
    // The file without an extension loads too, as the reference reads every file.
    assert!(
        table.contains("other.source_cluster_proxy.destination_cluster_mock"),
        "{table}"
    );
    let decide = || send(&client, "POST", &ratelimit.url("/json"), &[], Some(REQUEST)).status;
    assert_eq!([decide(), decide(), decide()], [200, 200, 429]);

    // The ConfigMap is updated (the kubelet swaps `..data`): the new limit takes over.
    let raised = CONFIG.replace("requests_per_unit: 2", "requests_per_unit: 50");
    config_map.update(&[
        ("config.yaml", raised.as_bytes()),
        ("example", EXAMPLE.as_bytes()),
    ]);
    wait::until("the raised limit to load", Duration::from_secs(30), || {
        rlconfig().contains("50  minute")
    });
    assert_eq!(decide(), 200);
    // A broken update keeps the last good config.
    config_map.update(&[
        ("config.yaml", b"domain: rl\ndescriptors: [oops"),
        ("example", EXAMPLE.as_bytes()),
    ]);
    wait::until(
        "the failed reload to be logged",
        Duration::from_secs(30),
        || ratelimit.log().contains("config reload failed"),
    );
    assert!(rlconfig().contains("50  minute"));
    assert_eq!(decide(), 200);
}

/// The binary as `ratelimit`, with only `vars` set, run until it exits: its status and log.
fn ratelimit_exits_with(vars: &[(&str, &str)]) -> (bool, String) {
    let (status, log) = Ratelimit::builder()
        .envs(vars.iter().copied())
        .run_to_exit();
    (status.success(), log)
}

#[test]
fn malformed_settings_stop_start_up_naming_the_variable() {
    for (vars, expected) in [
        (
            &[("PORT", "abc")][..],
            "ratelimit: PORT=abc: expected a port number from 0 to 65535, such as 8080",
        ),
        (
            &[("REDIS_TYPE", "ring")][..],
            "ratelimit: REDIS_TYPE=ring: expected single, cluster or sentinel",
        ),
        (
            &[("BACKEND_TYPE", "memcache")][..],
            "ratelimit: BACKEND_TYPE=memcache: tollgate has no memcached backend",
        ),
        (
            &[("USE_PROMETHEUS", "yes")][..],
            "ratelimit: USE_PROMETHEUS=yes: expected true or false",
        ),
        (
            // The async runtime would panic on this one; the settings name it first.
            &[("TOKIO_WORKER_THREADS", "0")][..],
            "ratelimit: TOKIO_WORKER_THREADS=0: expected a whole number of 1 or more",
        ),
        (
            &[("CONFIG_TYPE", "GRPC_XDS_SOTW")][..],
            "ratelimit: CONFIG_GRPC_XDS_SERVER_URL is not set",
        ),
        (
            &[
                ("RUNTIME_ROOT", "/nonexistent"),
                ("RUNTIME_SUBDIRECTORY", "ratelimit"),
                ("RUNTIME_WATCH_ROOT", "false"),
            ][..],
            "/nonexistent/ratelimit/config:1:1: the policy directory",
        ),
    ] {
        let (success, log) = ratelimit_exits_with(vars);
        assert!(!success, "{vars:?} started");
        assert!(!log.contains("panicked"), "{vars:?}:\n{log}");
        assert!(
            log.contains(expected),
            "{vars:?}: expected {expected:?} in\n{log}"
        );
    }
}

#[test]
fn unsupported_but_harmless_settings_get_one_warning_line() {
    let data = tempfile::tempdir().expect("a temporary directory");
    let ratelimit = Ratelimit::builder()
        .envs([
            ("BACKEND_TYPE", "redis"),
            ("USE_STATSD", "true"),
            ("USE_DOG_STATSD", "true"),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
        ])
        .loopback_ports()
        .env("RUNTIME_ROOT", data.path().display().to_string())
        .start();
    let log = ratelimit.log();
    for var in ["USE_STATSD=true", "USE_DOG_STATSD=true"] {
        let lines: Vec<&str> = log.lines().filter(|line| line.contains(var)).collect();
        assert_eq!(lines.len(), 1, "{var}:\n{log}");
        assert!(lines[0].contains("WARN"), "{}", lines[0]);
    }
}

#[test]
fn flags_win_over_the_environment_and_serve_help_names_every_variable() {
    let redis = RedisServer::start();
    let policies = tempfile::tempdir().expect("a temporary directory");
    std::fs::write(policies.path().join("rl.yaml"), CONFIG).expect("write a policy");
    // REDIS_URL points nowhere; the flag's URL is used.
    let ratelimit = Ratelimit::builder()
        .envs([
            ("REDIS_URL", "127.0.0.1:1"),
            ("GRPC_PORT", "not a port, but the flag wins"),
            ("PORT", "0"),
            ("HOST", "127.0.0.1"),
            ("DEBUG_PORT", "0"),
            ("DEBUG_HOST", "127.0.0.1"),
            ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
        ])
        .args([
            "--redis-url".to_owned(),
            redis.url(),
            "--grpc-addr".to_owned(),
            "127.0.0.1:0".to_owned(),
            "--config".to_owned(),
            policies.path().display().to_string(),
        ])
        .start_healthy();
    let client = agent();
    let reply = send(&client, "POST", &ratelimit.url("/json"), &[], Some(REQUEST));
    assert_eq!(reply.status, 200, "{}", reply.body);
    // LIMIT_RESPONSE_HEADERS_ENABLED adds the draft RateLimit headers.
    assert!(
        reply
            .body
            .contains(r#"{"key":"RateLimit-Limit","value":"2"},{"key":"RateLimit-Remaining","value":"1"},{"key":"RateLimit-Reset","value":""#),
        "{}",
        reply.body
    );

    let help = Command::new(tollgate_bin())
        .args(["serve", "--help"])
        .output()
        .expect("run tollgate serve --help");
    let help = String::from_utf8_lossy(&help.stdout);
    let flags = help
        .lines()
        .filter(|line| line.trim_start().starts_with("--"))
        .count();
    let named = help.matches("[env: TOLLGATE_").count();
    assert!(flags >= 20, "{help}");
    // Every flag names its variable (`-h, --help` aside, which the count leaves out).
    assert_eq!(named, flags, "{help}");
    for reference in [
        "GRPC_PORT",
        "REDIS_URL",
        "GRPC_SERVER_TLS_CERT",
        "CACHE_KEY_PREFIX",
        "LOG_LEVEL",
    ] {
        assert!(help.contains(reference), "{reference} missing from\n{help}");
    }
}

#[test]
fn with_no_variables_and_no_flags_serve_behaves_as_before() {
    let output = Command::new(tollgate_bin())
        .arg("serve")
        .env_clear()
        .output()
        .expect("run tollgate serve");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--config"), "{stderr}");
}

#[test]
fn serve_config_reads_top_level_yaml_and_names_what_it_skipped() {
    let tollgate = Tollgate::builder()
        .policy("rl.yaml", CONFIG)
        .policy("README.md", "not a policy")
        .policy(".hidden.yaml", "not read either")
        .start();
    let log = tollgate.log();
    let skipped: Vec<&str> = log
        .lines()
        .filter(|line| line.contains("skipped"))
        .collect();
    assert_eq!(skipped.len(), 1, "{log}");
    assert!(skipped[0].contains("README.md"), "{log}");
    let rlconfig = send(&agent(), "GET", &tollgate.url("/rlconfig"), &[], None).body;
    assert!(rlconfig.contains("rl.foo_bar"), "{rlconfig}");
}

#[test]
fn gomaxprocs_sizes_the_runtime_as_it_sizes_the_references_and_the_flag_wins() {
    let workers = |builder: TollgateBuilder| {
        let log = builder.policy("rl.yaml", CONFIG).start().log();
        let line = log
            .lines()
            .find(|line| line.contains("tollgate listening"))
            .unwrap_or_else(|| panic!("no listening line in\n{log}"))
            .to_owned();
        line.split_whitespace()
            .find_map(|field| field.strip_prefix("workers="))
            .unwrap_or_else(|| panic!("no workers= in {line}"))
            .to_owned()
    };
    assert_eq!(workers(Tollgate::builder().env("GOMAXPROCS", "3")), "3");
    // Empty is unset: one worker per CPU this process may use, as tollgate's would be.
    let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    assert_eq!(
        workers(Tollgate::builder().env("TOKIO_WORKER_THREADS", "")),
        cpus.to_string()
    );
    assert_eq!(
        workers(
            Tollgate::builder()
                .env("GOMAXPROCS", "3")
                .args(["--worker-threads", "1"])
        ),
        "1"
    );
}

#[test]
fn a_rust_log_that_does_not_parse_is_named_and_logging_goes_on_at_info() {
    let log = Tollgate::builder()
        .policy("rl.yaml", CONFIG)
        .env("RUST_LOG", "tollgate=loud")
        .start()
        .log();
    let warning = log
        .lines()
        .find(|line| line.contains("RUST_LOG=tollgate=loud: "))
        .unwrap_or_else(|| panic!("no warning naming RUST_LOG in\n{log}"));
    assert!(warning.contains("WARN"), "{warning}");
    assert!(warning.ends_with("logging at info instead"), "{warning}");
    // An empty RUST_LOG is unset: info, where an empty filter would have logged nothing (the
    // start waits for the info line that names the listening addresses).
    let log = Tollgate::builder()
        .policy("rl.yaml", CONFIG)
        .env("RUST_LOG", "")
        .start()
        .log();
    assert!(log.contains("tollgate listening"), "{log}");
}

/// The value of the unlabelled sample `name` in a Prometheus text exposition.
fn gauge(metrics: &str, name: &str) -> Option<f64> {
    metrics.lines().find_map(|line| {
        let value = line.strip_prefix(name)?.strip_prefix(' ')?;
        value.trim().parse().ok()
    })
}

/// `LOCAL_CACHE_SIZE_IN_BYTES` turns the local over-limit cache on in front of Redis, and its
/// counts appear under the reference's `ratelimit.localcache.*` gauge names, as its Prometheus
/// sink exports them unmapped: refusals answered locally are hits, every hit looked up is a
/// lookup. Without the cache, as in the reference, there are no such gauges.
#[test]
fn the_local_cache_reports_the_references_gauges_only_while_it_is_on() {
    let redis = RedisServer::start();
    let data = tempfile::tempdir().expect("a temporary directory");
    let _config = Mount::create(
        &data.path().join("ratelimit/config"),
        &[("config.yaml", CONFIG.as_bytes())],
    );
    let start = |bytes: &str| {
        // Each instance counts under its own prefix: the second starts with no usage.
        example_setup(&redis, data.path())
            .env(
                "CACHE_KEY_PREFIX",
                if bytes == "0" { "plain_" } else { "cached_" },
            )
            .env("LOCAL_CACHE_SIZE_IN_BYTES", bytes)
            .start_healthy()
    };
    let client = agent();

    let cached = start("1048576");
    let decide = || send(&client, "POST", &cached.url("/json"), &[], Some(REQUEST)).status;
    // A limit of 2 a minute: two admitted, the third refused by Redis, the next two locally.
    let codes: Vec<u16> = (0..5).map(|_| decide()).collect();
    assert_eq!(codes, [200, 200, 429, 429, 429]);
    let metrics = send(&client, "GET", &cached.url("/metrics"), &[], None).body;
    let expected = [
        ("hitCount", 2.0),
        ("missCount", 3.0),
        ("lookupCount", 5.0),
        ("entryCount", 1.0),
        ("evacuateCount", 0.0),
        ("expiredCount", 0.0),
        ("overwriteCount", 0.0),
    ];
    for (stat, value) in expected {
        let name = format!("ratelimit_localcache_{stat}");
        assert_eq!(gauge(&metrics, &name), Some(value), "{name} in\n{metrics}");
        let family = format!("# TYPE {name} gauge\n");
        assert!(metrics.contains(&family), "no {family:?} in\n{metrics}");
    }
    // The reference's statistic of the same refusals, per limit.
    assert_eq!(
        gauge(
            &metrics,
            "ratelimit_service_rate_limit_rl_foo_bar_over_limit_with_local_cache"
        ),
        Some(2.0),
        "{metrics}"
    );

    // The cache is on by default: only a size of 0 turns it, and its gauges, off.
    let plain = start("0");
    assert_eq!(
        send(&client, "POST", &plain.url("/json"), &[], Some(REQUEST)).status,
        200
    );
    let metrics = send(&client, "GET", &plain.url("/metrics"), &[], None).body;
    assert!(!metrics.contains("ratelimit_localcache_"), "{metrics}");
}
