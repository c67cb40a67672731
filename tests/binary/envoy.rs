//! End to end through a real Envoy: its HTTP rate-limit filter calls tollgate over gRPC, and the
//! tests send real HTTP requests to Envoy and read what a client would see. tollgate serves in
//! this process (the same server the binary runs), on memory or on the binary's shared Redis and
//! Cluster under a key prefix of its own; the example deployment runs the binary (`deploy.rs`).

use std::net::SocketAddr;

use tollgate::clock::ManualClock;
use tollgate::limiter::Settings;
use tollgate_testkit::envoy::{Action, Envoy, EnvoyBuilder};
use tollgate_testkit::in_process::InProcess;
use tollgate_testkit::net::{Reply, closed_addr};
use tollgate_testkit::redis::{RedisCluster, RedisServer, unique_prefix};
use tollgate_testkit::target::Store;
use tollgate_testkit::tollgate::per_user_per_minute;

/// An Envoy whose descriptor is the `x-user` request header as the entry `user`, calling the RLS
/// at `rls` with the domain `edge`.
fn per_user_envoy(rls: SocketAddr) -> EnvoyBuilder {
    Envoy::builder("edge", rls).descriptor(vec![Action::header("x-user", "user")])
}

fn user(name: &str) -> [(&'static str, &str); 1] {
    [("x-user", name)]
}

fn header_number(reply: &Reply, name: &str) -> u64 {
    let value = reply
        .header(name)
        .unwrap_or_else(|| panic!("no {name} header in {reply:?}"));
    value
        .parse()
        .unwrap_or_else(|_| panic!("{name}: {value:?} is not a number"))
}

/// A per-user limit from a request header: five requests pass with the remaining count going
/// down to zero, the sixth is refused with Envoy's rate-limit headers and a retry time, and
/// another user is not affected.
#[test]
fn per_user_limit_from_a_request_header() {
    let tollgate = InProcess::start(&per_user_per_minute(5));
    let envoy = per_user_envoy(tollgate.grpc_addr()).start();

    for expected_remaining in (0..5).rev() {
        let reply = envoy.get("/", &user("alice"));
        assert_eq!(reply.status, 200, "{reply:?}");
        assert_eq!(reply.body, "ok");
        assert_eq!(
            header_number(&reply, "x-ratelimit-remaining"),
            expected_remaining
        );
        assert_eq!(reply.header("x-ratelimit-limit"), Some("5, 5;w=60"));
        assert!(header_number(&reply, "x-ratelimit-reset") >= 1, "{reply:?}");
    }

    let refused = envoy.get("/", &user("alice"));
    assert_eq!(refused.status, 429, "{refused:?}");
    assert_eq!(refused.header("x-envoy-ratelimited"), Some("true"));
    assert_eq!(header_number(&refused, "x-ratelimit-remaining"), 0);
    // Sliding window counter, five hits in the current minute: the sixth fits once the window
    // has slid a fifth of a minute past the next boundary, so at most 60 + 12 seconds from now.
    let retry_after = header_number(&refused, "retry-after");
    assert!((1..=72).contains(&retry_after), "retry-after {retry_after}");

    let other = envoy.get("/", &user("bob"));
    assert_eq!(other.status, 200, "{other:?}");
    assert_eq!(header_number(&other, "x-ratelimit-remaining"), 4);

    // No header, no descriptor: Envoy does not ask and the request goes through.
    let anonymous = envoy.get("/", &[]);
    assert_eq!(anonymous.status, 200, "{anonymous:?}");
    assert_eq!(anonymous.header("x-ratelimit-limit"), None);
}

/// `x-ratelimit-limit` lists every descriptor's limit with its window in seconds and its name,
/// led by the limit with the least remaining; a window that is not a whole unit is left out.
#[test]
fn ratelimit_limit_header_lists_every_named_limit() {
    let tollgate = InProcess::start(
        "domain: edge
descriptors:
  - key: user
    rate_limit: {name: per_user, unit: minute, requests_per_unit: 5}
  - key: remote_address
    rate_limit: {name: per_ip, unit: hour, requests_per_unit: 100}
  - key: generic_key
    value: global
    rate_limit: {unit: second, requests_per_unit: 1000}
  - key: path_class
    value: api
    rate_limit: {name: odd_window, window: 90s, requests_per_unit: 50}
",
    );
    let envoy = per_user_envoy(tollgate.grpc_addr())
        .descriptor(vec![Action::RemoteAddress])
        .descriptor(vec![Action::generic("global")])
        .descriptor(vec![Action::generic_keyed("path_class", "api")])
        .start();

    let reply = envoy.get("/", &user("carol"));
    assert_eq!(reply.status, 200, "{reply:?}");
    assert_eq!(
        reply.header("x-ratelimit-limit"),
        Some(r#"5, 5;w=60;name="per_user", 100;w=3600;name="per_ip", 1000;w=1"#)
    );
    assert_eq!(header_number(&reply, "x-ratelimit-remaining"), 4);

    // Once the per-user limit is spent, the request is refused although the others have room.
    for _ in 0..4 {
        assert_eq!(envoy.get("/", &user("carol")).status, 200);
    }
    let refused = envoy.get("/", &user("carol"));
    assert_eq!(refused.status, 429, "{refused:?}");
    assert_eq!(header_number(&refused, "x-ratelimit-remaining"), 0);
    // Another user still passes: only the per-user limit was spent.
    let another_user = envoy.get("/", &user("dave"));
    assert_eq!(another_user.status, 200, "{another_user:?}");
    assert_eq!(header_number(&another_user, "x-ratelimit-remaining"), 4);
}

/// A `generic_key` limit is shared by all traffic, whoever sends it.
#[test]
fn global_generic_key_limit_is_shared_by_everyone() {
    let tollgate = InProcess::start(
        "domain: edge
descriptors:
  - key: generic_key
    value: global
    rate_limit: {unit: minute, requests_per_unit: 3}
",
    );
    let envoy = Envoy::builder("edge", tollgate.grpc_addr())
        .descriptor(vec![Action::generic("global")])
        .start();

    for (name, remaining) in [("alice", 2), ("bob", 1), ("carol", 0)] {
        let reply = envoy.get("/", &user(name));
        assert_eq!(reply.status, 200, "{reply:?}");
        assert_eq!(header_number(&reply, "x-ratelimit-remaining"), remaining);
        assert_eq!(reply.header("x-ratelimit-limit"), Some("3, 3;w=60"));
    }
    let refused = envoy.get("/", &user("dave"));
    assert_eq!(refused.status, 429, "{refused:?}");
    assert!(refused.header("retry-after").is_some(), "{refused:?}");
}

/// A descriptor in shadow mode is counted but never refuses.
#[test]
fn shadow_mode_descriptor_counts_but_never_refuses() {
    let tollgate = InProcess::start(
        "domain: edge
descriptors:
  - key: user
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2}
",
    );
    let envoy = per_user_envoy(tollgate.grpc_addr()).start();

    let remaining: Vec<u64> = (0..6)
        .map(|_| {
            let reply = envoy.get("/", &user("erin"));
            assert_eq!(reply.status, 200, "{reply:?}");
            assert_eq!(reply.header("x-envoy-ratelimited"), None);
            header_number(&reply, "x-ratelimit-remaining")
        })
        .collect();
    assert_eq!(remaining, [1, 0, 0, 0, 0, 0]);
}

/// `--shadow-mode` makes every answer OK, whatever the limits say.
#[test]
fn shadow_mode_flag_never_refuses() {
    let tollgate = InProcess::builder()
        .policy("edge.yaml", &per_user_per_minute(2))
        .settings(Settings {
            shadow_mode: true,
            ..Settings::default()
        })
        .start();
    let envoy = per_user_envoy(tollgate.grpc_addr()).start();

    for _ in 0..6 {
        let reply = envoy.get("/", &user("frank"));
        assert_eq!(reply.status, 200, "{reply:?}");
        assert_eq!(reply.header("x-envoy-ratelimited"), None);
    }
}

/// A value listed with neither a limit nor children is an allow-list entry: never limited, no
/// rate-limit headers, while other values of the same key are limited.
#[test]
fn allow_listed_value_is_never_limited() {
    let tollgate = InProcess::start(
        "domain: edge
descriptors:
  - key: user
    value: admin
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 2}
",
    );
    let envoy = per_user_envoy(tollgate.grpc_addr()).start();

    for _ in 0..10 {
        let reply = envoy.get("/", &user("admin"));
        assert_eq!(reply.status, 200, "{reply:?}");
        assert_eq!(reply.header("x-ratelimit-limit"), None, "{reply:?}");
    }
    let statuses: Vec<u16> = (0..3)
        .map(|_| envoy.get("/", &user("grace")).status)
        .collect();
    assert_eq!(statuses, [200, 200, 429]);
}

/// When tollgate goes down, Envoy applies its own `failure_mode_deny`: requests pass (without
/// rate-limit headers) when it is false, and get 500 when it is true.
#[test]
fn tollgate_down_follows_envoy_failure_mode() {
    let mut tollgate = InProcess::start(&per_user_per_minute(100));
    let open = per_user_envoy(tollgate.grpc_addr()).start();
    let closed = per_user_envoy(tollgate.grpc_addr())
        .failure_mode_deny(true)
        .start();

    let up = open.get("/", &user("heidi"));
    assert_eq!(up.status, 200, "{up:?}");
    assert_eq!(header_number(&up, "x-ratelimit-remaining"), 99);
    assert_eq!(closed.get("/", &user("heidi")).status, 200);

    tollgate.shutdown();

    let down = open.get("/", &user("heidi"));
    assert_eq!(down.status, 200, "{down:?}");
    assert_eq!(down.body, "ok");
    assert_eq!(down.header("x-ratelimit-remaining"), None, "{down:?}");
    assert_eq!(closed.get("/", &user("heidi")).status, 500);
}

/// With nothing ever listening where the rate-limit service should be, the same holds.
#[test]
fn unreachable_service_follows_envoy_failure_mode() {
    let nowhere = closed_addr();
    let open = per_user_envoy(nowhere).start();
    let reply = open.get("/", &user("ivan"));
    assert_eq!(reply.status, 200, "{reply:?}");
    assert_eq!(reply.body, "ok");

    let closed = per_user_envoy(nowhere).failure_mode_deny(true).start();
    assert_eq!(closed.get("/", &user("ivan")).status, 500);
}

const BURST_LIMIT: usize = 5;
const BURST_WINDOW_MS: u64 = 4_000;
/// An instant on an edge between two windows (windows are aligned to the epoch).
const EDGE_MS: u64 = 1_700_000_000_000;

/// A client of a `BURST_LIMIT` per `BURST_WINDOW_MS` limit of `algorithm` behind Envoy, with
/// tollgate's clock in the test's hand: the bursts below land exactly where they are meant to,
/// however loaded the machine.
struct Bursts {
    clock: ManualClock,
    envoy: Envoy,
    _tollgate: InProcess,
}

impl Bursts {
    fn new(algorithm: &str) -> Bursts {
        // The clock starts well before the first burst: the store never lets time run backwards
        // (a stepped-back wall clock must not unsort a log), so a burst set before the instant
        // its housekeeping first read would land at that instant instead.
        let clock = ManualClock::new(EDGE_MS - 10 * BURST_WINDOW_MS);
        let tollgate = InProcess::builder()
            .policy(
                "edge.yaml",
                &format!(
                    "domain: edge
descriptors:
  - key: client
    rate_limit: {{requests_per_unit: {BURST_LIMIT}, window: {}s, algorithm: {algorithm}}}
",
                    BURST_WINDOW_MS / 1000
                ),
            )
            .clock(clock.clone())
            .start();
        let envoy = Envoy::builder("edge", tollgate.grpc_addr())
            .descriptor(vec![Action::header("x-client", "client")])
            .start();
        Bursts {
            clock,
            envoy,
            _tollgate: tollgate,
        }
    }

    /// Sends `BURST_LIMIT` requests at `at_ms` (relative to the edge) and answers how many
    /// were let through.
    fn burst(&self, at_ms: i64) -> usize {
        self.clock.set(EDGE_MS.saturating_add_signed(at_ms));
        (0..BURST_LIMIT)
            .filter(|_| self.envoy.get("/", &[("x-client", "bursty")]).status == 200)
            .count()
    }
}

/// Sliding window counter: a full burst just before a window edge, and right after the edge the
/// previous window still weighs almost fully, so a second burst is refused (a fixed window would
/// admit all of it again). The estimate frees one hit per fifth of the window past the edge.
#[test]
fn boundary_burst_is_not_admitted_twice_by_the_sliding_window_counter() {
    let bursts = Bursts::new("sliding_window_counter");
    assert_eq!(bursts.burst(-600), BURST_LIMIT, "the first burst fits");
    assert_eq!(bursts.burst(50), 0, "right after the edge");
    assert_eq!(bursts.burst(800), 1, "a fifth of the window past the edge");
}

/// Sliding window log: exact, so nothing of a second burst fits while the first is inside the
/// window, and all of it once the first has left.
#[test]
fn boundary_burst_is_not_admitted_twice_by_the_sliding_window_log() {
    let bursts = Bursts::new("sliding_window_log");
    assert_eq!(bursts.burst(-600), BURST_LIMIT, "the first burst fits");
    assert_eq!(bursts.burst(50), 0, "right after the edge");
    assert_eq!(
        bursts.burst(3_399),
        0,
        "a millisecond before the first burst leaves"
    );
    assert_eq!(
        bursts.burst(3_400),
        BURST_LIMIT,
        "once the first burst has left"
    );
}

/// Two tollgate instances sharing one Redis, each behind its own Envoy: together they admit the
/// limit once, not once each.
#[test]
fn two_instances_sharing_redis_admit_the_limit_once() {
    let policy = per_user_per_minute(5);
    let prefix = unique_prefix("two-instances");
    let start = || {
        InProcess::builder()
            .policy("edge.yaml", &policy)
            .store(Store::Redis(RedisServer::shared().url()))
            .key_prefix(&prefix)
            .start()
    };
    let (first, second) = (start(), start());
    let envoys = [first.grpc_addr(), second.grpc_addr()].map(|rls| per_user_envoy(rls).start());

    let statuses: Vec<u16> = (0..10)
        .map(|turn| envoys[turn % 2].get("/", &user("judy")).status)
        .collect();
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429, 429, 429, 429, 429]);
    let last = envoys[1].get("/", &user("judy"));
    assert_eq!(last.status, 429, "{last:?}");
    assert!(last.header("retry-after").is_some(), "{last:?}");
}

/// When Redis is unreachable, each limit answers its own `failure_mode`: a `deny` limit refuses
/// (429 through Envoy) while an `allow` limit lets the request through.
#[test]
fn redis_outage_answers_each_limits_failure_mode() {
    let mut redis = RedisServer::start();
    let tollgate = InProcess::builder()
        .policy(
            "edge.yaml",
            "domain: edge
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: generic_key
    value: global
    rate_limit: {unit: minute, requests_per_unit: 1000, failure_mode: deny}
",
        )
        .store(Store::Redis(redis.url()))
        .start();
    let per_user = per_user_envoy(tollgate.grpc_addr()).start();
    let global = Envoy::builder("edge", tollgate.grpc_addr())
        .descriptor(vec![Action::generic("global")])
        .start();
    assert_eq!(per_user.get("/", &user("kim")).status, 200);
    assert_eq!(global.get("/", &user("kim")).status, 200);

    redis.stop();

    let allowed = per_user.get("/", &user("kim"));
    assert_eq!(allowed.status, 200, "{allowed:?}");
    let denied = global.get("/", &user("kim"));
    assert_eq!(denied.status, 429, "{denied:?}");
    assert_eq!(denied.header("x-envoy-ratelimited"), Some("true"));
}

/// Through a Redis Cluster: a per-user limit, and a hot global limit split over shards on
/// different slots, which together never admit more than the limit.
#[test]
fn redis_cluster_per_user_and_sharded_global_limits() {
    let tollgate = InProcess::builder()
        .policy(
            "edge.yaml",
            "domain: edge
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: generic_key
    value: global
    rate_limit: {unit: minute, requests_per_unit: 8, shards: 4}
",
        )
        .store(Store::Cluster(RedisCluster::shared().urls()))
        .start();
    let per_user = per_user_envoy(tollgate.grpc_addr()).start();
    let statuses: Vec<u16> = (0..4)
        .map(|_| per_user.get("/", &user("leo")).status)
        .collect();
    assert_eq!(statuses, [200, 200, 200, 429]);

    let global = Envoy::builder("edge", tollgate.grpc_addr())
        .descriptor(vec![Action::generic("global")])
        .start();
    let admitted = (0..20)
        .filter(|_| global.get("/", &[]).status == 200)
        .count();
    // A hit tries two of the four shards, so it may be refused while another shard still has
    // room; it is never admitted beyond the limit.
    assert!(
        (1..=8).contains(&admitted),
        "admitted {admitted} of a limit of 8"
    );
}

/// Several limits on one descriptor, through a real Envoy: the burst limit refuses the third
/// request; the RateLimit headers describe it (not the sustained limit, which still has room),
/// and Envoy's access log prints its name from the filter's dynamic metadata (`overLimit`).
#[test]
fn the_refusing_limit_is_named_in_the_headers_and_the_access_log() {
    let tollgate = InProcess::builder()
        .policy(
            "edge.yaml",
            "domain: edge
descriptors:
  - key: user
    rate_limits:
      - {name: burst, unit: minute, requests_per_unit: 2}
      - {name: sustained, unit: hour, requests_per_unit: 50}
",
        )
        .settings(Settings {
            response_dynamic_metadata: true,
            ..Settings::default()
        })
        .limit_headers()
        .start();
    // The format docs/configuration.md shows.
    let envoy = per_user_envoy(tollgate.grpc_addr())
        .access_log("%RESPONSE_CODE% %DYNAMIC_METADATA(envoy.filters.http.ratelimit:overLimit)%")
        .start();

    let first = envoy.get("/", &user("erin"));
    assert_eq!(first.status, 200, "{first:?}");
    // Admitted: the limit with the least left, the burst limit.
    assert_eq!(first.header("ratelimit-limit"), Some("2"), "{first:?}");
    assert_eq!(header_number(&first, "ratelimit-remaining"), 1);
    assert_eq!(envoy.get("/", &user("erin")).status, 200);
    let refused = envoy.get("/", &user("erin"));
    assert_eq!(refused.status, 429, "{refused:?}");
    assert_eq!(refused.header("ratelimit-limit"), Some("2"), "{refused:?}");
    assert_eq!(header_number(&refused, "ratelimit-remaining"), 0);
    assert_eq!(
        refused.header("x-ratelimit-limit"),
        Some(r#"2, 2;w=60;name="burst""#)
    );

    let lines = tollgate_testkit::wait::until_some(
        "Envoy to write three access log lines",
        std::time::Duration::from_secs(20),
        || {
            let lines = envoy.access_log();
            (lines.len() >= 3).then_some(lines)
        },
    );
    assert_eq!(lines[0], "200 -", "{lines:?}");
    assert_eq!(lines[1], "200 -", "{lines:?}");
    assert_eq!(
        lines[2], r#"429 [{"descriptorIndex":0,"name":"burst"}]"#,
        "{lines:?}"
    );
}
