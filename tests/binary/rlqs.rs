//! Envoy's Rate Limit Quota Service through real Envoys: their `rate_limit_quota` filter holds
//! a stream to tollgate, enforces the slices tollgate assigns with no call on the request path,
//! and reports what it admitted. The tests send real HTTP requests and check what clients saw
//! against the limit: never more than the limit in any window, most of it usable, and the same
//! counters as RLS.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tollgate::proto::rate_limit_response::Code;
use tollgate_testkit::envoy::{Envoy, rlqs_bootstrap};
use tollgate_testkit::in_process::InProcess;
use tollgate_testkit::net::{agent, send};
use tollgate_testkit::redis::{RedisCluster, RedisServer, unique_prefix};
use tollgate_testkit::rls;
use tollgate_testkit::target::Store;

/// 20 requests per 10 seconds per user, exactly (a log); `vip` is unlimited.
const POLICY: &str = "domain: edge
descriptors:
  - key: user
    value: vip
    rate_limit: {unlimited: true}
  - key: user
    rate_limit: {window: 10s, requests_per_unit: 20, algorithm: sliding_window_log}
";

const LIMIT: usize = 20;
const WINDOW: Duration = Duration::from_secs(10);

/// One request a client sent: when it left, when its answer came, and whether it passed.
#[derive(Debug, Clone, Copy)]
struct Sent {
    sent: Instant,
    answered: Instant,
    admitted: bool,
}

/// Sends requests for `user` through `envoy` every `every` until `until`.
fn drive(envoy: &Envoy, user: &str, every: Duration, until: Instant) -> Vec<Sent> {
    let mut sent = Vec::new();
    let mut next = Instant::now();
    while next < until {
        let at = Instant::now();
        let reply = envoy.get("/", &[("x-user", user)]);
        assert!(
            reply.status == 200 || reply.status == 429,
            "unexpected answer {reply:?}"
        );
        sent.push(Sent {
            sent: at,
            answered: Instant::now(),
            admitted: reply.status == 200,
        });
        next += every;
        if let Some(wait) = next.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
    }
    sent
}

/// The most admitted requests certainly decided within one window (sent at or after its start,
/// answered before its end), over every window that starts at an admitted request.
fn most_in_a_window(all: &[Sent]) -> usize {
    let admitted: Vec<&Sent> = all.iter().filter(|s| s.admitted).collect();
    admitted
        .iter()
        .map(|start| {
            let end = start.sent + WINDOW - Duration::from_millis(1);
            admitted
                .iter()
                .filter(|s| s.sent >= start.sent && s.answered <= end)
                .count()
        })
        .max()
        .unwrap_or(0)
}

/// What RLS answers one hit of `user` in `edge` now.
fn rls_code(grpc: SocketAddr, user: &str) -> Code {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let mut client = rls::client(grpc).await.expect("connect to tollgate");
        let response = client
            .should_rate_limit(rls::request("edge", &[&[("user", user)]]))
            .await
            .expect("a decision")
            .into_inner();
        Code::try_from(response.overall_code).expect("a known code")
    })
}

/// Two Envoys, each asked five times a second for one user, share a limit of two a second: no
/// window of ten seconds admits more than its 20, and at least 90% of what a log can admit at
/// its limit is used. RLS, asked afterwards, finds the limit spent.
fn two_envoys_share_one_limit(store: Store) {
    let tollgate = InProcess::builder()
        .policy("edge.yaml", POLICY)
        .store(store)
        .start();
    let envoys = [
        Envoy::start_with(rlqs_bootstrap("edge", tollgate.grpc_addr())),
        Envoy::start_with(rlqs_bootstrap("edge", tollgate.grpc_addr())),
    ];
    let start = Instant::now();
    let until = start + Duration::from_secs(30);
    let sent: Vec<Sent> = std::thread::scope(|scope| {
        let drivers: Vec<_> = envoys
            .iter()
            .map(|envoy| {
                scope.spawn(move || drive(envoy, "alice", Duration::from_millis(200), until))
            })
            .collect();
        drivers
            .into_iter()
            .flat_map(|driver| driver.join().expect("a driver"))
            .collect()
    });
    let most = most_in_a_window(&sent);
    assert!(
        most <= LIMIT,
        "{most} requests admitted within one window of a limit of {LIMIT}"
    );
    // The demand (10 a second) is far above the limit (2 a second) throughout. A slice is
    // stamped 1.5 s after its decision, so at the limit a log admits its limit per window and
    // 1.5 s (docs/rlqs.md): of that, at least 90%.
    let admitted = sent.iter().filter(|s| s.admitted).count();
    let run = until.duration_since(start).as_secs_f64();
    let usable = LIMIT as f64 * run / (WINDOW.as_secs_f64() + 1.5);
    assert!(
        admitted as f64 >= 0.9 * usable,
        "{admitted} admitted in {run:.0} s, of {usable:.0} usable; admitted at {:.1?}",
        sent.iter()
            .filter(|s| s.admitted)
            .map(|s| s.sent.duration_since(start).as_secs_f64())
            .collect::<Vec<_>>()
    );
    assert_eq!(rls_code(tollgate.grpc_addr(), "alice"), Code::OverLimit);
    // What the Envoys reported counts under the limit's reference series, and the service's own.
    let metrics = send(&agent(), "GET", &tollgate.url("/metrics"), &[], None).body;
    for series in [
        "ratelimit_service_rate_limit_within_limit{domain=\"edge\",key1=\"user\"}",
        "ratelimit_service_rate_limit_over_limit{domain=\"edge\",key1=\"user\"}",
        "tollgate_rlqs_assignments_total{kind=\"slice\"}",
        "tollgate_rlqs_slice_units_total",
    ] {
        assert!(metrics.contains(series), "no {series} in\n{metrics}");
    }
    // Process-wide, and other tests' streams may be open too: at least these two.
    let streams = metrics
        .lines()
        .find_map(|line| line.strip_prefix("tollgate_rlqs_streams "))
        .and_then(|value| value.trim().parse::<i64>().ok());
    assert!(
        streams.is_some_and(|n| n >= 2),
        "streams {streams:?} in\n{metrics}"
    );
    // Each Envoy reported at once and was answered: the messages both ways.
    for direction in ["received", "sent"] {
        let series = format!("tollgate_rlqs_messages_total{{direction=\"{direction}\"}} ");
        let messages = metrics
            .lines()
            .find_map(|line| line.strip_prefix(series.as_str()))
            .and_then(|value| value.trim().parse::<f64>().ok());
        assert!(
            messages.is_some_and(|n| n >= 2.0),
            "{direction} messages {messages:?} in\n{metrics}"
        );
    }
}

#[test]
fn two_envoys_share_one_limit_on_memory() {
    two_envoys_share_one_limit(Store::Memory);
}

#[test]
fn two_envoys_share_one_limit_on_redis() {
    two_envoys_share_one_limit(Store::Redis(RedisServer::shared().url()));
}

/// What RLS spent, RLQS does not give again: a user whose limit RLS calls used up is refused
/// by Envoy after its first request (which Envoy admits before any assignment, and which is
/// charged when reported).
#[test]
fn rlqs_sees_what_rls_spent() {
    let tollgate = InProcess::builder().policy("edge.yaml", POLICY).start();
    for _ in 0..LIMIT {
        assert_eq!(rls_code(tollgate.grpc_addr(), "carol"), Code::Ok);
    }
    let envoy = Envoy::start_with(rlqs_bootstrap("edge", tollgate.grpc_addr()));
    let first = envoy.get("/", &[("x-user", "carol")]);
    assert_eq!(
        first.status, 200,
        "admitted before any assignment: {first:?}"
    );
    std::thread::sleep(Duration::from_millis(300));
    for _ in 0..10 {
        let reply = envoy.get("/", &[("x-user", "carol")]);
        assert_eq!(reply.status, 429, "{reply:?}");
    }
}

/// Buckets no limit governs are never refused: an unlimited descriptor, and a bucket whose
/// entries no policy names.
#[test]
fn unlimited_and_unknown_buckets_are_allowed() {
    let tollgate = InProcess::builder().policy("edge.yaml", POLICY).start();
    let envoy = Envoy::start_with(rlqs_bootstrap("edge", tollgate.grpc_addr()));
    for _ in 0..3 * LIMIT {
        let vip = envoy.get("/", &[("x-user", "vip")]);
        assert_eq!(vip.status, 200, "{vip:?}");
        let anonymous = envoy.get("/", &[]);
        assert_eq!(anonymous.status, 200, "{anonymous:?}");
    }
}

/// The policy and the Envoy bootstrap docs/rlqs.md shows, run as shown (the ports moved to
/// free ones, and an admin listener added for the test to know Envoy is up): of a user's 40
/// requests in ten seconds, at most 20 pass, and at least half of that. No upstream runs behind
/// it, so the admitted ones answer 503.
#[test]
fn the_configuration_in_the_docs_works() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/rlqs.md"))
        .expect("read docs/rlqs.md");
    let blocks: Vec<String> = doc
        .split("```yaml\n")
        .skip(1)
        .filter_map(|rest| rest.split("```").next().map(str::to_owned))
        .collect();
    let [policy, bootstrap] = blocks.as_slice() else {
        panic!("docs/rlqs.md should show a policy and a bootstrap, found {blocks:?}");
    };
    let tollgate = InProcess::builder().policy("edge.yaml", policy).start();
    let grpc = tollgate.grpc_addr();
    let envoy = Envoy::start_with(|admin, edge, upstream| {
        let yaml = bootstrap
            .replace("port_value: 10000", &format!("port_value: {}", edge.port()))
            .replace("port_value: 8081", &format!("port_value: {}", grpc.port()))
            .replace(
                "port_value: 8000",
                &format!("port_value: {}", upstream.port()),
            )
            .replace("address: 0.0.0.0", "address: 127.0.0.1");
        format!(
            "admin:\n  address:\n    socket_address: {{address: 127.0.0.1, port_value: {}}}\n{yaml}",
            admin.port()
        )
    });
    // Four a second for ten seconds: twice the limit, all within one window.
    let mut statuses = Vec::new();
    for _ in 0..2 * LIMIT {
        statuses.push(envoy.get("/", &[("x-user", "dana")]).status);
        std::thread::sleep(Duration::from_millis(250));
    }
    // Never more than the limit; the first slices hold the limit's own rate until Envoy's
    // first report, and what a replaced slice had left stays charged (docs/rlqs.md), so some
    // of the limit may go unused.
    let admitted = statuses.iter().filter(|s| **s != 429).count();
    assert!(admitted <= LIMIT, "{statuses:?}");
    assert!(admitted * 2 >= LIMIT, "{statuses:?}");
    assert!(
        statuses.iter().all(|s| *s == 429 || *s == 503),
        "{statuses:?}"
    );
    // The bucket no policy names is never refused.
    for _ in 0..LIMIT + 5 {
        assert_ne!(envoy.get("/", &[]).status, 429);
    }
}

/// Drives every Envoy for `user` at five requests a second until `until`, all at once.
fn drive_all(envoys: &[&Envoy], user: &str, until: Instant) -> Vec<Vec<Sent>> {
    std::thread::scope(|scope| {
        let drivers: Vec<_> = envoys
            .iter()
            .map(|envoy| scope.spawn(move || drive(envoy, user, Duration::from_millis(200), until)))
            .collect();
        drivers
            .into_iter()
            .map(|driver| driver.join().expect("a driver"))
            .collect()
    })
}

/// Three Envoys on two tollgates sharing one store: the instances' slices come from one
/// counter, so no window admits more than the limit across all three, and at least 90% of
/// what a log admits at its limit is used.
fn three_envoys_on_two_tollgates(store: Store) {
    let prefix = unique_prefix("rlqs-two");
    let start_one = || {
        InProcess::builder()
            .policy("edge.yaml", POLICY)
            .store(store.clone())
            .key_prefix(&prefix)
            .start()
    };
    let (first, second) = (start_one(), start_one());
    let envoys = [
        Envoy::start_with(rlqs_bootstrap("edge", first.grpc_addr())),
        Envoy::start_with(rlqs_bootstrap("edge", first.grpc_addr())),
        Envoy::start_with(rlqs_bootstrap("edge", second.grpc_addr())),
    ];
    let start = Instant::now();
    let until = start + Duration::from_secs(30);
    let sent: Vec<Sent> = drive_all(&envoys.iter().collect::<Vec<_>>(), "erin", until)
        .into_iter()
        .flatten()
        .collect();
    let most = most_in_a_window(&sent);
    assert!(
        most <= LIMIT,
        "{most} admitted within one window of a limit of {LIMIT}"
    );
    let admitted = sent.iter().filter(|s| s.admitted).count();
    let usable = LIMIT as f64 * 30.0 / (WINDOW.as_secs_f64() + 1.5);
    assert!(
        admitted as f64 >= 0.9 * usable,
        "{admitted} admitted in 30 s, of {usable:.0} usable"
    );
    // Both instances see the same counter spent.
    assert_eq!(rls_code(first.grpc_addr(), "erin"), Code::OverLimit);
    assert_eq!(rls_code(second.grpc_addr(), "erin"), Code::OverLimit);
}

#[test]
fn three_envoys_on_two_tollgates_on_redis() {
    three_envoys_on_two_tollgates(Store::Redis(RedisServer::shared().url()));
}

#[test]
fn three_envoys_on_two_tollgates_on_the_cluster() {
    three_envoys_on_two_tollgates(Store::Cluster(RedisCluster::shared().urls()));
}

/// tollgate restarted under a running Envoy: the Envoy's last slice expires into its
/// `expired_assignment_behavior` (DENY_ALL), it reconnects at its next report and gets slices
/// again; no window admits more than the limit, before, across or after the restart.
#[test]
fn a_restart_mid_stream_never_admits_past_the_limit() {
    let prefix = unique_prefix("rlqs-restart");
    let store = Store::Redis(RedisServer::shared().url());
    let start_at = |addr: Option<SocketAddr>| {
        let mut builder = InProcess::builder()
            .policy("edge.yaml", POLICY)
            .store(store.clone())
            .key_prefix(&prefix);
        if let Some(addr) = addr {
            builder = builder.grpc_addr(addr);
        }
        builder.start()
    };
    let mut tollgate = start_at(None);
    let grpc = tollgate.grpc_addr();
    let envoy = Envoy::start_with(rlqs_bootstrap("edge", grpc));
    let start = Instant::now();
    let restart_at = start + Duration::from_secs(6);
    let until = start + Duration::from_secs(30);
    let sent = std::thread::scope(|scope| {
        let driver = scope.spawn(|| drive(&envoy, "fay", Duration::from_millis(100), until));
        std::thread::sleep(restart_at.saturating_duration_since(Instant::now()));
        tollgate.shutdown();
        drop(tollgate);
        let restarted = start_at(Some(grpc));
        let sent = driver.join().expect("the driver");
        (sent, restarted)
    });
    let (sent, restarted) = sent;
    let most = most_in_a_window(&sent);
    assert!(
        most <= LIMIT,
        "{most} admitted within one window of a limit of {LIMIT}"
    );
    // The restarted instance serves the stream again: requests pass after the restart.
    let after = sent
        .iter()
        .filter(|s| s.admitted && s.sent > restart_at + Duration::from_secs(1))
        .count();
    assert!(after > 0, "nothing admitted after the restart: {sent:?}");
    assert_eq!(rls_code(restarted.grpc_addr(), "fay"), Code::OverLimit);
}

/// A stream speaks to tollgate directly, as Envoy would: a bucket of a limit gets a DENY_ALL
/// and a token bucket of its slice, echoing the bucket id exactly; a bucket no limit governs gets
/// ALLOW_ALL; a first report without a domain ends the stream with INVALID_ARGUMENT, naming what
/// to set.
#[test]
fn a_stream_answers_buckets_and_names_a_missing_domain() {
    use std::collections::HashMap;

    use futures_util::StreamExt as _;

    use tollgate::proto::rlqs::rate_limit_quota_response::bucket_action::BucketAction as Action;
    use tollgate::proto::rlqs::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
    use tollgate::proto::rlqs::{RateLimitQuotaUsageReports, rate_limit_strategy};

    let tollgate = InProcess::builder().policy("edge.yaml", POLICY).start();
    let grpc = tollgate.grpc_addr();
    let usage = |entries: &[(&str, &str)]| usage(entries, 1);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let channel = rls::channel(grpc).await.expect("connect");
        let mut client = RateLimitQuotaServiceClient::new(channel.clone());
        let report = RateLimitQuotaUsageReports {
            domain: "edge".into(),
            bucket_quota_usages: vec![usage(&[("user", "gil")]), usage(&[("anonymous", "true")])],
        };
        let mut responses = client
            .stream_rate_limit_quotas(futures_util::stream::iter(vec![report]).chain(futures_util::stream::pending()))
            .await
            .expect("a stream")
            .into_inner();
        let mut strategies: HashMap<String, Vec<rate_limit_strategy::Strategy>> = HashMap::new();
        while strategies.values().map(Vec::len).sum::<usize>() < 3 {
            let response = responses.message().await.expect("a response").expect("open");
            for action in response.bucket_action {
                let id = action.bucket_id.expect("the id echoed");
                let key = format!("{:?}", id.bucket.keys().collect::<Vec<_>>());
                if let Some(Action::QuotaAssignmentAction(assignment)) = action.bucket_action {
                    let ttl = assignment.assignment_time_to_live.expect("a lifetime");
                    assert!(ttl.seconds >= 1 && ttl.nanos == 0, "{ttl:?}");
                    let strategy = assignment
                        .rate_limit_strategy
                        .and_then(|s| s.strategy)
                        .expect("a strategy");
                    strategies.entry(key).or_default().push(strategy);
                }
            }
        }
        let user = &strategies["[\"user\"]"];
        assert!(
            matches!(user[0], rate_limit_strategy::Strategy::BlanketRule(rule) if rule == rate_limit_strategy::BlanketRule::DenyAll as i32),
            "{user:?}"
        );
        match &user[1] {
            rate_limit_strategy::Strategy::TokenBucket(bucket) => {
                assert!(bucket.max_tokens >= 1, "{bucket:?}");
                assert_eq!(bucket.tokens_per_fill, Some(1));
                assert!(bucket.fill_interval.expect("an interval").seconds >= 365 * 24 * 3600);
            }
            other => panic!("not a slice: {other:?}"),
        }
        let anonymous = &strategies["[\"anonymous\"]"];
        assert!(
            matches!(anonymous[0], rate_limit_strategy::Strategy::BlanketRule(rule) if rule == rate_limit_strategy::BlanketRule::AllowAll as i32),
            "{anonymous:?}"
        );

        let mut client = RateLimitQuotaServiceClient::new(channel);
        let nameless = RateLimitQuotaUsageReports {
            domain: String::new(),
            bucket_quota_usages: vec![usage(&[("user", "gil")])],
        };
        let mut responses = client
            .stream_rate_limit_quotas(futures_util::stream::iter(vec![nameless]).chain(futures_util::stream::pending()))
            .await
            .expect("a stream")
            .into_inner();
        let status = responses.message().await.expect_err("the stream ends with an error");
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(status.message().contains("set `domain`"), "{status:?}");
    });
}

/// One bucket's usage in a report: `allowed` requests admitted, none denied.
fn usage(
    entries: &[(&str, &str)],
    allowed: u64,
) -> tollgate::proto::rlqs::rate_limit_quota_usage_reports::BucketQuotaUsage {
    tollgate::proto::rlqs::rate_limit_quota_usage_reports::BucketQuotaUsage {
        bucket_id: Some(tollgate::proto::rlqs::BucketId {
            bucket: entries
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        }),
        time_elapsed: Some(prost_types::Duration::default()),
        num_requests_allowed: allowed,
        num_requests_denied: 0,
    }
}

/// A shadow-mode bucket gets ALLOW_ALL, and what Envoy reports of it is charged (RLS then finds
/// its limit spent); a bucket whose next report shows no request is abandoned.
#[test]
fn shadow_buckets_are_counted_and_quiet_ones_abandoned() {
    use tollgate::proto::rlqs::rate_limit_quota_response::bucket_action::BucketAction as Action;
    use tollgate::proto::rlqs::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
    use tollgate::proto::rlqs::{RateLimitQuotaUsageReports, rate_limit_strategy};

    const SHADOWED: &str = "domain: edge
descriptors:
  - key: trial
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 5}
";
    let tollgate = InProcess::builder().policy("edge.yaml", SHADOWED).start();
    let grpc = tollgate.grpc_addr();
    let report = |allowed| RateLimitQuotaUsageReports {
        domain: "edge".into(),
        bucket_quota_usages: vec![usage(&[("trial", "t")], allowed)],
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let (reports, queued) = tokio::sync::mpsc::channel(4);
        let outbound = futures_util::stream::unfold(queued, |mut queued| async move {
            queued.recv().await.map(|report| (report, queued))
        });
        let channel = rls::channel(grpc).await.expect("connect");
        let mut responses = RateLimitQuotaServiceClient::new(channel)
            .stream_rate_limit_quotas(outbound)
            .await
            .expect("a stream")
            .into_inner();
        reports.send(report(1)).await.expect("the first report");
        let first = responses
            .message()
            .await
            .expect("a response")
            .expect("open");
        let rule = first
            .bucket_action
            .first()
            .and_then(|a| match &a.bucket_action {
                Some(Action::QuotaAssignmentAction(q)) => {
                    q.rate_limit_strategy.as_ref().and_then(|s| s.strategy)
                }
                _ => None,
            });
        assert_eq!(
            rule,
            Some(rate_limit_strategy::Strategy::BlanketRule(
                rate_limit_strategy::BlanketRule::AllowAll as i32
            )),
            "{first:?}"
        );
        // Envoy admitted 5 more: charged to the shadow limit, all 6 of its 5 spent.
        reports.send(report(5)).await.expect("the second report");
        let deadline = Instant::now() + Duration::from_secs(10);
        while rls_remaining(grpc, "trial", "t").await > 0 {
            assert!(
                Instant::now() < deadline,
                "the reported requests were not charged"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // A report without a request: the bucket is abandoned.
        reports.send(report(0)).await.expect("the quiet report");
        let abandoned = tokio::time::timeout(Duration::from_secs(10), responses.message())
            .await
            .expect("an answer to the quiet report within 10 s")
            .expect("a response")
            .expect("open");
        assert!(
            matches!(
                abandoned
                    .bucket_action
                    .first()
                    .and_then(|a| a.bucket_action.as_ref()),
                Some(Action::AbandonAction(_))
            ),
            "{abandoned:?}"
        );
    });
}

/// What RLS says is left of `key=value` in `edge`, by a check that consumes nothing.
async fn rls_remaining(grpc: SocketAddr, key: &str, value: &str) -> u32 {
    let mut client = rls::client(grpc).await.expect("connect to tollgate");
    let mut request = rls::request("edge", &[&[(key, value)]]);
    request.descriptors[0].hits_addend = Some(0);
    let response = client
        .should_rate_limit(request)
        .await
        .expect("a decision")
        .into_inner();
    response.statuses[0].limit_remaining
}
