//! Reaching Redis the ways envoyproxy/ratelimit's users do, with real servers: TLS with a client
//! certificate and a private CA, an ACL user, a unix socket, the per-second Redis beside the main
//! one, and Sentinel following a forced failover during traffic. tollgate runs as `ratelimit`,
//! configured by the reference's variables.

use std::time::{Duration, Instant};

use tollgate_testkit::certs::{Ca, Usage};
use tollgate_testkit::net::{agent, send};
use tollgate_testkit::redis::{RedisServer, SentinelGroup};
use tollgate_testkit::reference::{Ratelimit, RatelimitBuilder};
use tollgate_testkit::wait;

const POLICY: &str = "domain: rl
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: burst
    rate_limit: {unit: second, requests_per_unit: 1000}
";

fn request(key: &str, value: &str) -> String {
    format!(
        r#"{{"domain":"rl","descriptors":[{{"entries":[{{"key":"{key}","value":"{value}"}}]}}]}}"#
    )
}

/// `ratelimit` on free loopback ports with [`POLICY`] in a runtime directory it reads.
fn ratelimit(policies: &tempfile::TempDir) -> RatelimitBuilder {
    ratelimit_with(policies, POLICY)
}

/// `ratelimit` on free loopback ports with `policy` in a runtime directory it reads.
fn ratelimit_with(policies: &tempfile::TempDir, policy: &str) -> RatelimitBuilder {
    let dir = policies.path().join("ratelimit/config");
    std::fs::create_dir_all(&dir).expect("create the policy directory");
    std::fs::write(dir.join("rl.yaml"), policy).expect("write the policy");
    Ratelimit::builder()
        .env("RUNTIME_ROOT", policies.path().display().to_string())
        .env("RUNTIME_SUBDIRECTORY", "ratelimit")
        .env("RUNTIME_WATCH_ROOT", "false")
        .env("USE_STATSD", "false")
        .loopback_ports()
}

/// Three calls for one user: the limit of 3 a minute admits them all, a fourth is refused.
fn decides_through_redis(ratelimit: &Ratelimit, user: &str) {
    let client = agent();
    let codes: Vec<u16> = (0..4)
        .map(|_| {
            send(
                &client,
                "POST",
                &ratelimit.url("/json"),
                &[],
                Some(&request("user", user)),
            )
            .status
        })
        .collect();
    assert_eq!(codes, [200, 200, 200, 429], "{}", ratelimit.log());
}

/// Waits until health has an answer other than "not probed yet", and answers it.
fn settled_health(ratelimit: &Ratelimit) -> (u16, String) {
    let client = agent();
    let mut last = (0, String::new());
    wait::until("a health verdict", Duration::from_secs(30), || {
        let reply = send(&client, "GET", &ratelimit.url("/healthcheck"), &[], None);
        last = (reply.status, reply.body);
        !last.1.contains("not probed yet")
    });
    last
}

#[test]
fn tls_with_a_client_certificate_and_a_private_ca() {
    let ca = Ca::new("redis-ca");
    let redis = RedisServer::start_mutual_tls(&ca, &[]);
    let tls_port = redis.tls_port().expect("a TLS port");
    let certs = tempfile::tempdir().expect("a temporary directory");
    let client = ca.issue("tollgate", &["tollgate"], Usage::Client);
    let (cert, key) = client.write(certs.path(), "tls");
    let ca_path = certs.path().join("ca.crt");
    ca.write(&ca_path);
    let policies = tempfile::tempdir().expect("a temporary directory");
    let tls = |builder: RatelimitBuilder| {
        builder
            .env("REDIS_SOCKET_TYPE", "tcp")
            .env("REDIS_URL", format!("127.0.0.1:{tls_port}"))
            .env("REDIS_TLS", "true")
            .env("REDIS_TLS_CACERT", ca_path.display().to_string())
    };
    let ratelimit = tls(ratelimit(&policies))
        .env("REDIS_TLS_CLIENT_CERT", cert.display().to_string())
        .env("REDIS_TLS_CLIENT_KEY", key.display().to_string())
        .start_healthy();
    decides_through_redis(&ratelimit, "tls");
    assert!(
        !redis.keys("tollgate:*").is_empty(),
        "no key written over TLS"
    );

    // Without the client certificate the server refuses the handshake: never healthy.
    let refused = tls(ratelimit_for_refusal(&policies)).start();
    let (status, reason) = settled_health(&refused);
    assert_eq!(status, 503, "{reason}");
}

/// A second `ratelimit` on the same policies.
fn ratelimit_for_refusal(policies: &tempfile::TempDir) -> RatelimitBuilder {
    ratelimit(policies)
}

#[test]
fn an_acl_user_from_redis_auth_or_the_url() {
    let redis = RedisServer::start_with(&[
        "--user",
        "default",
        "off",
        "--user",
        "limiter",
        "on",
        ">s3cret",
        "~tollgate:*",
        "+@all",
    ]);
    let policies = tempfile::tempdir().expect("a temporary directory");
    let by_auth = ratelimit(&policies)
        .env("REDIS_SOCKET_TYPE", "tcp")
        .env("REDIS_URL", format!("127.0.0.1:{}", redis.port()))
        .env("REDIS_AUTH", "limiter:s3cret")
        .start_healthy();
    decides_through_redis(&by_auth, "acl");
    assert!(!by_auth.log().contains("s3cret"), "{}", by_auth.log());
    let by_url = ratelimit(&policies)
        .env(
            "REDIS_URL",
            format!("redis://limiter:s3cret@127.0.0.1:{}", redis.port()),
        )
        .start_healthy();
    decides_through_redis(&by_url, "acl-url");
    assert!(!by_url.log().contains("s3cret"), "{}", by_url.log());

    let wrong = ratelimit(&policies)
        .env("REDIS_URL", format!("127.0.0.1:{}", redis.port()))
        .env("REDIS_AUTH", "limiter:wrong")
        .start();
    let (status, reason) = settled_health(&wrong);
    assert_eq!(status, 503, "{reason}");
    assert!(!wrong.log().contains("limiter:wrong"));
}

#[test]
fn a_unix_socket_and_a_per_second_redis() {
    let sockets = tempfile::tempdir().expect("a temporary directory");
    let socket = sockets.path().join("redis.sock");
    let socket_text = socket.display().to_string();
    let main = RedisServer::start_with(&["--unixsocket", &socket_text, "--unixsocketperm", "700"]);
    let per_second = RedisServer::start();
    let policies = tempfile::tempdir().expect("a temporary directory");
    let ratelimit = ratelimit(&policies)
        .env("REDIS_SOCKET_TYPE", "unix")
        .env("REDIS_URL", &socket_text)
        .env("REDIS_PERSECOND", "true")
        .env("REDIS_PERSECOND_SOCKET_TYPE", "tcp")
        .env(
            "REDIS_PERSECOND_URL",
            format!("127.0.0.1:{}", per_second.port()),
        )
        .start_healthy();
    decides_through_redis(&ratelimit, "unix");
    let client = agent();
    let reply = send(
        &client,
        "POST",
        &ratelimit.url("/json"),
        &[],
        Some(&request("burst", "x")),
    );
    assert_eq!(reply.status, 200);
    // Minute windows live in the main Redis (over the socket), one-second windows in the other.
    let main_keys = main.keys("tollgate:*");
    let per_second_keys = per_second.keys("tollgate:*");
    assert!(
        main_keys.iter().all(|k| k.contains("user")) && !main_keys.is_empty(),
        "{main_keys:?}"
    );
    assert!(
        per_second_keys.iter().all(|k| k.contains("burst")) && !per_second_keys.is_empty(),
        "{per_second_keys:?}"
    );
}

/// The outcome of one call during the failover test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    /// OK.
    Admitted,
    /// Over the limit.
    Refused,
    /// The backend could not decide in time (the failure mode, deny, answers: OVER_LIMIT with
    /// a one-second reset, where a full one-hour log window answers a longer one).
    Failed,
}

#[test]
fn sentinel_follows_a_forced_failover_during_traffic_without_over_admitting() {
    const LIMIT: usize = 120;
    let group = SentinelGroup::start("mymaster", 2, 3);
    let policies = tempfile::tempdir().expect("a temporary directory");
    let policy = format!(
        "domain: rl
descriptors:
  - key: user
    rate_limit: {{unit: hour, requests_per_unit: {LIMIT}, algorithm: sliding_window_log}}
"
    );
    let ratelimit = ratelimit_with(&policies, &policy)
        .env("REDIS_TYPE", "sentinel")
        .env("REDIS_URL", group.url())
        // Decisions count only once both replicas hold them, so a promotion cannot lose an
        // admitted hit; a decision that cannot be made in time is refused.
        .env("TOLLGATE_REDIS_WAIT_REPLICAS", "2")
        .env("TOLLGATE_FAILURE_MODE", "deny")
        .env("TOLLGATE_BACKEND_TIMEOUT", "1s")
        .start_healthy();

    let client = agent();
    let ask = || {
        let reply = send(
            &client,
            "POST",
            &ratelimit.url("/json"),
            &[],
            Some(&request("user", "everyone")),
        );
        match reply.status {
            200 => Answer::Admitted,
            429 if reply.body.contains(r#""durationUntilReset":"1s""#) => Answer::Failed,
            429 => Answer::Refused,
            other => panic!("no decision: {other} {}\n{}", reply.body, ratelimit.log()),
        }
    };
    let mut answers = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while answers.iter().filter(|a| **a == Answer::Admitted).count() < LIMIT / 3 {
        assert!(
            Instant::now() < deadline,
            "admissions stalled before the failover: {answers:?}\n{}",
            ratelimit.log()
        );
        answers.push(ask());
    }
    let old_master = group.master_port();
    let failover = std::thread::scope(|scope| {
        let failing_over = scope.spawn(|| group.fail_over());
        // Traffic goes on while the sentinels promote a replica.
        while !failing_over.is_finished() {
            answers.push(ask());
            std::thread::sleep(Duration::from_millis(20));
        }
        failing_over.join().expect("the failover")
    });
    assert_ne!(failover, old_master);
    let after_failover = answers.len();
    // Then until the limit is spent: a run of refusals on the new master (once the replicas
    // follow it, decisions are acknowledged again).
    let deadline = Instant::now() + Duration::from_secs(90);
    while !answers.ends_with(&[Answer::Refused; 20]) {
        assert!(
            Instant::now() < deadline,
            "the limit was never reached: {answers:?}"
        );
        answers.push(ask());
    }
    let admitted = answers.iter().filter(|a| **a == Answer::Admitted).count();
    assert!(
        admitted <= LIMIT,
        "{admitted} admitted against a limit of {LIMIT}\n{}",
        ratelimit.log()
    );
    assert!(
        answers[after_failover..].contains(&Answer::Admitted),
        "nothing was admitted by the new master: {answers:?}\n{}",
        ratelimit.log()
    );
    assert!(
        group
            .master()
            .keys("tollgate:*")
            .iter()
            .any(|key| key.contains("everyone")),
        "the new master holds no window"
    );
}
