//! Policies over xDS, against real things: the real `tollgate` binary takes its policies from a
//! real gRPC ADS management server (the test kit's, on tonic) over mutual TLS, as it does from
//! Envoy Gateway's; the tests push versions, invalid resources, drop streams and restart the
//! server, and read what tollgate answers over gRPC and HTTP, what it logs, and every request the
//! server received (ACKs, NACKs, node, headers, client certificates). One test puts a real Envoy
//! in front.
//!
//! Nothing here measures time: "applied promptly" is waited for with a generous deadline.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tollgate::proto::rate_limit_service_client::RateLimitServiceClient;
use tollgate::proto::ratelimit::config::ratelimit::v3::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit,
};
use tollgate::proto::tollgate::config::v1::LimitExtension;
use tollgate::proto::{
    RateLimitDescriptor as RequestDescriptor, RateLimitRequest, RateLimitResponse,
    rate_limit_descriptor::Entry, rate_limit_response::Code,
};
use tollgate_testkit::envoy::{Action, Envoy};
use tollgate_testkit::net::{Reply, agent, send};
use tollgate_testkit::pki::TestPki;
use tollgate_testkit::rls::health_status;
use tollgate_testkit::tollgate::{Tollgate, TollgateBuilder, tollgate_bin};
use tollgate_testkit::xds::{ManagementServer, WAIT};
use tonic_health::pb::health_check_response::ServingStatus;

/// Envoy Gateway's node id for its rate-limit service.
const NODE: &str = "envoy-ratelimit";

// ---------------------------------------------------------------------------------------------
// Policies as a control plane sends them
// ---------------------------------------------------------------------------------------------

fn config(name: &str, domain: &str, descriptors: Vec<RateLimitDescriptor>) -> RateLimitConfig {
    RateLimitConfig {
        name: name.to_owned(),
        domain: domain.to_owned(),
        descriptors,
    }
}

fn policy(unit: RateLimitUnit, requests: u32) -> Option<RateLimitPolicy> {
    Some(RateLimitPolicy {
        unit: unit as i32,
        requests_per_unit: requests,
        ..Default::default()
    })
}

fn descriptor(key: &str, value: &str, rate_limit: Option<RateLimitPolicy>) -> RateLimitDescriptor {
    RateLimitDescriptor {
        key: key.to_owned(),
        value: value.to_owned(),
        rate_limit,
        ..Default::default()
    }
}

/// Domain `edge`: each `user` value gets `requests` hits an hour (a window far longer than any
/// test, so no window boundary can give back hits in the middle of one).
fn per_user(requests: u32) -> RateLimitConfig {
    config(
        "edge",
        "edge",
        vec![descriptor(
            "user",
            "",
            policy(RateLimitUnit::Hour, requests),
        )],
    )
}

// ---------------------------------------------------------------------------------------------
// Starting things
// ---------------------------------------------------------------------------------------------

/// A management server requiring mutual TLS, as Envoy Gateway's, serving node `envoy-ratelimit`.
fn management_server() -> ManagementServer {
    ManagementServer::builder()
        .node_id(NODE)
        .mutual_tls(&TestPki::shared().server)
        .start()
}

/// tollgate set up as Envoy Gateway sets the reference up (xDS over mutual TLS, node
/// `envoy-ratelimit`), with short reconnect delays so the tests do not wait ten seconds.
fn tollgate(server: &ManagementServer) -> TollgateBuilder {
    let client = &TestPki::shared().client;
    Tollgate::builder()
        .without_config()
        .env("CONFIG_TYPE", "GRPC_XDS_SOTW")
        .env("CONFIG_GRPC_XDS_SERVER_URL", &server.url())
        .env("CONFIG_GRPC_XDS_NODE_ID", NODE)
        .env("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true")
        .env("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", path(&client.cert()))
        .env("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", path(&client.key()))
        .env("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", path(&client.ca()))
        .env("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "100ms")
        .env("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "100ms")
        .env("XDS_CLIENT_BACKOFF_MAX_INTERVAL", "1s")
        .env("XDS_CLIENT_BACKOFF_RANDOM_FACTOR", "2")
        .env("XDS_CLIENT_BACKOFF_JITTER", "false")
}

fn path(path: &std::path::Path) -> &str {
    path.to_str().expect("a UTF-8 path")
}

// ---------------------------------------------------------------------------------------------
// Talking to tollgate
// ---------------------------------------------------------------------------------------------

/// A gRPC client of tollgate's RLS, usable from a plain test.
struct Rls {
    runtime: tokio::runtime::Runtime,
    addr: SocketAddr,
}

impl Rls {
    fn new(tollgate: &Tollgate) -> Rls {
        Rls {
            runtime: tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime"),
            addr: tollgate.grpc_addr(),
        }
    }

    /// `ShouldRateLimit` for one descriptor, with `hits` as the request's `hits_addend`.
    fn ask_hits(
        &self,
        domain: &str,
        entries: &[(&str, &str)],
        hits: u32,
    ) -> Result<RateLimitResponse, tonic::Status> {
        let request = RateLimitRequest {
            domain: domain.to_owned(),
            descriptors: vec![RequestDescriptor {
                entries: entries
                    .iter()
                    .map(|(key, value)| Entry {
                        key: (*key).to_owned(),
                        value: (*value).to_owned(),
                    })
                    .collect(),
                ..Default::default()
            }],
            hits_addend: hits,
        };
        let addr = self.addr;
        self.runtime.block_on(async move {
            let mut client = RateLimitServiceClient::connect(format!("http://{addr}"))
                .await
                .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
            client
                .should_rate_limit(request)
                .await
                .map(tonic::Response::into_inner)
        })
    }

    fn ask(&self, domain: &str, entries: &[(&str, &str)]) -> RateLimitResponse {
        self.ask_hits(domain, entries, 1)
            .unwrap_or_else(|status| panic!("ShouldRateLimit failed: {status}"))
    }

    /// Asks once and returns (code, remaining, the limit's requests per unit if any).
    fn status(&self, domain: &str, entries: &[(&str, &str)]) -> (Code, u32, Option<u32>) {
        let response = self.ask(domain, entries);
        let status = &response.statuses[0];
        (
            Code::try_from(status.code).expect("a known code"),
            status.limit_remaining,
            status.current_limit.as_ref().map(|l| l.requests_per_unit),
        )
    }
}

fn get(tollgate: &Tollgate, path: &str) -> Reply {
    send(&agent(), "GET", &tollgate.url(path), &[], None)
}

fn health(tollgate: &Tollgate) -> ServingStatus {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime
        .block_on(health_status(tollgate.grpc_addr(), ""))
        .unwrap_or_else(|err| panic!("health check failed: {err}"))
}

/// Waits until `done` holds; panics after [`WAIT`] with `what` and tollgate's log.
fn wait_until(tollgate: &Tollgate, what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !done() {
        assert!(
            Instant::now() < deadline,
            "{what} did not happen within {WAIT:?}\n--- tollgate log ---\n{}",
            tollgate.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn wait_serving(tollgate: &Tollgate) {
    wait_until(tollgate, "readiness", || {
        health(tollgate) == ServingStatus::Serving
    });
}

/// The value of the metric line starting with `series` (name and labels).
fn metric(tollgate: &Tollgate, series: &str) -> Option<f64> {
    let body = get(tollgate, "/metrics").body;
    body.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .map(|value| value.trim().parse().expect("a number"))
}

// ---------------------------------------------------------------------------------------------
// The tests
// ---------------------------------------------------------------------------------------------

/// Without FORCE_START_WITHOUT_INITIAL_CONFIG tollgate is alive but not ready, and refuses to
/// decide, until the first push; the push is applied and ACKed with its version and nonce; the
/// requests carry the node, its metadata, the additional headers and a client certificate.
#[test]
fn the_first_push_is_applied_and_acknowledged() {
    let server = management_server();
    let tollgate = tollgate(&server)
        .env(
            "CONFIG_GRPC_XDS_NODE_METADATA",
            "zone=eu-west-1,cluster=edge=blue",
        )
        .env(
            "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
            "X-Tenant:edge,authorization:secret-token",
        )
        .start_alive();
    let rls = Rls::new(&tollgate);

    // Not ready, and says why.
    server.wait_for("the first request", |all| !all.is_empty());
    assert_eq!(health(&tollgate), ServingStatus::NotServing);
    let healthcheck = get(&tollgate, "/healthcheck");
    assert_eq!(healthcheck.status, 503);
    assert_eq!(
        healthcheck.body,
        format!(
            "no policies yet: waiting for the first push from the xDS server {} (node {NODE})\n",
            server.url()
        )
    );
    let refused = rls.ask_hits("edge", &[("user", "alice")], 1).unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");
    assert!(get(&tollgate, "/rlconfig").body.starts_with(&format!(
        "# xds server={} node={NODE} waiting for the first push\n",
        server.url()
    )));

    server.push("1", &[per_user(2)]);
    wait_serving(&tollgate);
    assert_eq!(
        rls.status("edge", &[("user", "alice")]),
        (Code::Ok, 1, Some(2))
    );
    assert_eq!(
        rls.status("edge", &[("user", "alice")]),
        (Code::Ok, 0, Some(2))
    );
    assert_eq!(
        rls.status("edge", &[("user", "alice")]),
        (Code::OverLimit, 0, Some(2))
    );

    let ack = server.wait_for_ack("1");
    assert_eq!(ack.request.response_nonce, "1");
    let received = server.received();
    let first = &received[0];
    assert_eq!(first.request.version_info, "");
    assert_eq!(first.request.response_nonce, "");
    assert!(first.request.resource_names.is_empty());
    assert_eq!(
        first.request.type_url,
        "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig"
    );
    for request in &received {
        let node = request
            .request
            .node
            .as_ref()
            .expect("every request names its node");
        assert_eq!(node.id, NODE);
        let metadata = node.metadata.as_ref().expect("metadata");
        let text = |key: &str| match &metadata.fields[key].kind {
            Some(prost_types::value::Kind::StringValue(value)) => value.clone(),
            other => panic!("{key}: {other:?}"),
        };
        assert_eq!(text("zone"), "eu-west-1");
        assert_eq!(text("cluster"), "edge=blue");
        assert_eq!(request.headers["x-tenant"], "edge");
        assert_eq!(request.headers["authorization"], "secret-token");
        assert!(request.client_certificates >= 1, "mutual TLS: {request:?}");
    }
    assert!(
        !tollgate.log().contains("secret-token"),
        "a header value was logged"
    );

    let rlconfig = get(&tollgate, "/rlconfig").body;
    let mut lines = rlconfig.lines();
    let origin = lines.next().expect("the origin line");
    assert!(
        origin.starts_with(&format!(
            "# xds server={} node={NODE} version=\"1\" resources=1 accepted=",
            server.url()
        )),
        "{rlconfig}"
    );
    let table: Vec<Vec<&str>> = lines.map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(
        table,
        vec![vec![
            "edge.user",
            "sliding_window_counter",
            "2",
            "hour",
            "-"
        ]]
    );

    assert_eq!(
        metric(&tollgate, "tollgate_xds_version{version=\"1\"}"),
        Some(1.0)
    );
    assert_eq!(metric(&tollgate, "tollgate_xds_updates_total"), Some(1.0));
    assert_eq!(metric(&tollgate, "tollgate_xds_nacks_total"), Some(0.0));
    assert_eq!(metric(&tollgate, "tollgate_xds_connects_total"), Some(1.0));
    let updated = metric(&tollgate, "tollgate_xds_last_update_timestamp_seconds")
        .expect("the last update time");
    assert!(updated > 1_600_000_000.0, "{updated}");
}

/// An invalid push is NACKed with the resource, the field path and what is wrong, against the
/// version in force; the last good policies keep serving, counters included; a later good push
/// is applied.
#[test]
fn an_invalid_push_is_nacked_and_the_last_good_policies_stay() {
    let server = management_server();
    server.push("1", &[per_user(2)]);
    let tollgate = tollgate(&server).start();
    let rls = Rls::new(&tollgate);
    server.wait_for_ack("1");
    assert_eq!(
        rls.status("edge", &[("user", "alice")]),
        (Code::Ok, 1, Some(2))
    );

    let mut paths = descriptor("user", "", None);
    paths.descriptors = vec![
        descriptor("path", "/a", policy(RateLimitUnit::Minute, 1)),
        descriptor("path", "/b", policy(RateLimitUnit::Unknown, 1)),
    ];
    server.push("2", &[config("edge-limits", "edge", vec![paths])]);
    let nack = server.wait_for_nack();
    assert_eq!(nack.request.version_info, "1");
    assert_eq!(nack.request.response_nonce, "2");
    let detail = nack.request.error_detail.as_ref().expect("error_detail");
    assert_eq!(detail.code, 3, "INVALID_ARGUMENT");
    assert_eq!(
        detail.message,
        "edge-limits: descriptors[0].descriptors[1].rate_limit: `rate_limit` needs a `unit` \
         (second, minute, hour, day, week, month, year) or a `window` (e.g. `window: 90s`), or \
         `unlimited: true`"
    );

    // Version 1 still decides, and its counter kept the first hit.
    assert_eq!(
        rls.status("edge", &[("user", "alice")]),
        (Code::Ok, 0, Some(2))
    );
    assert_eq!(
        rls.status("edge", &[("user", "alice")]),
        (Code::OverLimit, 0, Some(2))
    );
    assert_eq!(health(&tollgate), ServingStatus::Serving);
    let rlconfig = get(&tollgate, "/rlconfig").body;
    assert!(rlconfig.contains("version=\"1\""), "{rlconfig}");
    assert!(
        rlconfig.contains(&format!("# refused version=\"2\": {}\n", detail.message)),
        "{rlconfig}"
    );
    assert_eq!(metric(&tollgate, "tollgate_xds_nacks_total"), Some(1.0));
    assert_eq!(
        metric(&tollgate, "tollgate_xds_version{version=\"1\"}"),
        Some(1.0)
    );

    // A resource that is not a RateLimitConfig at all.
    server.push_resources(
        "3",
        vec![prost_types::Any {
            type_url: "type.googleapis.com/envoy.config.cluster.v3.Cluster".into(),
            value: vec![1, 2, 3],
        }],
    );
    let received = server.wait_for("a second NACK", |all| {
        all.iter().filter(|r| r.is_nack()).count() == 2
    });
    let second = received.iter().filter(|r| r.is_nack()).nth(1).expect("it");
    assert_eq!(second.request.version_info, "1");
    assert_eq!(
        second.nack_message(),
        Some(
            "resources[0]: holds `type.googleapis.com/envoy.config.cluster.v3.Cluster`, not a \
             RateLimitConfig (type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig)"
        )
    );

    server.push("4", &[per_user(5)]);
    server.wait_for_ack("4");
    assert_eq!(
        rls.status("edge", &[("user", "bob")]),
        (Code::Ok, 4, Some(5))
    );
}

/// go-control-plane sends a NACKed snapshot straight back, forever: tollgate keeps refusing it,
/// keeps its policies, and takes the next good one.
#[test]
fn a_server_that_resends_a_refused_push_is_refused_again() {
    let server = management_server();
    server.resend_on_nack(true);
    server.push("1", &[per_user(2)]);
    let tollgate = tollgate(&server).start();
    let rls = Rls::new(&tollgate);
    server.wait_for_ack("1");

    server.push("2", &[config("", "", vec![])]);
    let received = server.wait_for("three NACKs", |all| {
        all.iter().filter(|r| r.is_nack()).count() >= 3
    });
    for nack in received.iter().filter(|r| r.is_nack()) {
        assert_eq!(nack.request.version_info, "1");
        assert_eq!(
            nack.nack_message(),
            Some(
                "resources[0]: domain: `domain` is empty; write `domain: <name>` (the domain \
                 Envoy sends)"
            )
        );
    }
    assert_eq!(
        rls.status("edge", &[("user", "alice")]),
        (Code::Ok, 1, Some(2))
    );

    server.push("3", &[per_user(7)]);
    server.wait_for_ack("3");
    assert_eq!(
        rls.status("edge", &[("user", "carol")]),
        (Code::Ok, 6, Some(7))
    );
    // The refusal was logged once; the repeats only at debug level.
    assert_eq!(tollgate.log().matches("push refused (NACK)").count(), 1);
}

/// Each push is the whole set: a domain missing from it is removed, and its limits named at
/// WARN. Counters of the domains that stay survive the update.
#[test]
fn a_domain_missing_from_a_push_is_removed_and_counters_survive() {
    let server = management_server();
    let internal = config(
        "internal",
        "internal",
        vec![descriptor("service", "", policy(RateLimitUnit::Hour, 10))],
    );
    server.push("1", &[per_user(3), internal]);
    let tollgate = tollgate(&server).start();
    let rls = Rls::new(&tollgate);
    server.wait_for_ack("1");
    assert_eq!(
        rls.status("edge", &[("user", "alice")]),
        (Code::Ok, 2, Some(3))
    );
    assert_eq!(
        rls.status("edge", &[("user", "alice")]),
        (Code::Ok, 1, Some(3))
    );
    assert_eq!(
        rls.status("internal", &[("service", "billing")]),
        (Code::Ok, 9, Some(10))
    );

    server.push("2", &[per_user(3)]);
    server.wait_for_ack("2");
    // An unknown domain limits nothing.
    assert_eq!(
        rls.status("internal", &[("service", "billing")]),
        (Code::Ok, 0, None)
    );
    assert_eq!(
        rls.status("edge", &[("user", "alice")]),
        (Code::Ok, 0, Some(3))
    );
    assert_eq!(
        rls.status("edge", &[("user", "alice")]),
        (Code::OverLimit, 0, Some(3))
    );
    let rlconfig = get(&tollgate, "/rlconfig").body;
    assert!(!rlconfig.contains("internal"), "{rlconfig}");
    assert!(rlconfig.contains("edge.user"), "{rlconfig}");
    // Limits a push takes away are said at WARN, by name, as a file reload says them.
    let log = tollgate.log();
    let warned = log
        .lines()
        .find(|line| line.contains("config reload drops 1 limit"))
        .unwrap_or_else(|| panic!("no warning of the dropped limit:\n{log}"));
    assert!(
        warned.contains("WARN") && warned.contains("internal.service"),
        "{warned}"
    );
}

/// The stream dropped, then the server gone and back: tollgate keeps serving what it has,
/// reconnects with its backoff, tells the server the version it holds on the new stream, and
/// re-syncs to what the server serves now.
#[test]
fn the_client_reconnects_and_resyncs_after_the_server_comes_back() {
    let mut server = management_server();
    server.push("1", &[per_user(2)]);
    let tollgate = tollgate(&server).start();
    let rls = Rls::new(&tollgate);
    server.wait_for_ack("1");
    assert_eq!(server.streams(), 1);

    // The stream breaks; the server stays: a new stream, the same version again.
    server.drop_streams();
    let received = server.wait_for("a request on a second stream", |all| {
        all.iter().any(|r| r.stream == 2)
    });
    let reopened = received.iter().find(|r| r.stream == 2).expect("it");
    assert_eq!(reopened.request.version_info, "1");
    assert_eq!(reopened.request.response_nonce, "");
    server.wait_for("the re-sent version 1 ACKed on stream 2", |all| {
        all.iter().any(|r| {
            r.stream == 2 && r.request.version_info == "1" && r.request.response_nonce == "1"
        })
    });

    // The server goes away; tollgate keeps deciding with what it has.
    server.stop();
    assert_eq!(
        rls.status("edge", &[("user", "alice")]),
        (Code::Ok, 1, Some(2))
    );
    assert_eq!(health(&tollgate), ServingStatus::Serving);
    server.push("2", &[per_user(4)]);
    server.restart();

    server.wait_for_ack("2");
    let received = server.received();
    let resumed = received
        .iter()
        .find(|r| r.stream == 3)
        .expect("a request on the stream after the restart");
    assert_eq!(resumed.request.version_info, "1");
    assert_eq!(resumed.request.response_nonce, "");
    // The counter survived the reconnect and the update.
    assert_eq!(
        rls.status("edge", &[("user", "alice")]),
        (Code::Ok, 2, Some(4))
    );
    assert_eq!(metric(&tollgate, "tollgate_xds_connects_total"), Some(3.0));
    assert_eq!(
        metric(&tollgate, "tollgate_xds_version{version=\"2\"}"),
        Some(1.0)
    );
    assert!(
        tollgate.log().contains("the policies in force stay"),
        "{}",
        tollgate.log()
    );
}

/// FORCE_START_WITHOUT_INITIAL_CONFIG: ready at once, every request allowed (said once in the
/// log) until the first push, which then applies.
#[test]
fn force_start_serves_at_once_and_allows_everything_until_the_first_push() {
    let server = management_server();
    let tollgate = tollgate(&server)
        .env("FORCE_START_WITHOUT_INITIAL_CONFIG", "true")
        .start();
    let rls = Rls::new(&tollgate);
    for _ in 0..3 {
        assert_eq!(
            rls.status("edge", &[("user", "alice")]),
            (Code::Ok, 0, None)
        );
    }
    assert_eq!(
        tollgate
            .log()
            .matches("every request is allowed until the policies arrive")
            .count(),
        1,
        "{}",
        tollgate.log()
    );

    server.push("1", &[per_user(1)]);
    server.wait_for_ack("1");
    assert_eq!(
        rls.status("edge", &[("user", "alice")]),
        (Code::Ok, 0, Some(1))
    );
    assert_eq!(
        rls.status("edge", &[("user", "alice")]),
        (Code::OverLimit, 0, Some(1))
    );
}

/// HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED: an accepted push without any domain leaves tollgate
/// not ready; one with a domain makes it ready; an empty one again takes readiness away.
#[test]
fn healthy_only_with_at_least_one_domain_when_asked() {
    let server = management_server();
    let tollgate = tollgate(&server)
        .env("FORCE_START_WITHOUT_INITIAL_CONFIG", "true")
        .env("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "true")
        .start_alive();
    let reason = "no policy domain loaded, and HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED asks for \
                  at least one\n";
    assert_eq!(health(&tollgate), ServingStatus::NotServing);
    assert_eq!(get(&tollgate, "/healthcheck").body, reason);

    server.push("1", &[]);
    server.wait_for_ack("1");
    assert_eq!(health(&tollgate), ServingStatus::NotServing);

    server.push("2", &[per_user(1)]);
    server.wait_for_ack("2");
    wait_serving(&tollgate);

    server.push("3", &[]);
    server.wait_for_ack("3");
    wait_until(&tollgate, "readiness lost", || {
        health(&tollgate) == ServingStatus::NotServing
    });
    assert_eq!(get(&tollgate, "/healthcheck").body, reason);
}

/// Mutual TLS both ways: a client without a certificate is refused by the server, and a server
/// whose certificate does not carry the expected name is refused by the client; with
/// CONFIG_GRPC_XDS_SERVER_TLS_SAN naming one of its names, it is accepted.
#[test]
fn mutual_tls_is_checked_both_ways() {
    let server = management_server();
    server.push("1", &[per_user(1)]);
    let pki = TestPki::shared();

    let anonymous = Tollgate::builder()
        .without_config()
        .env("CONFIG_TYPE", "GRPC_XDS_SOTW")
        .env("CONFIG_GRPC_XDS_SERVER_URL", &server.url())
        .env("CONFIG_GRPC_XDS_NODE_ID", NODE)
        .env("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true")
        .env("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", path(&pki.client.ca()))
        .env("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "100ms")
        .start_alive();
    wait_until(&anonymous, "a refused handshake", || {
        !server.handshake_failures().is_empty()
    });
    assert_eq!(health(&anonymous), ServingStatus::NotServing);
    assert!(server.received().is_empty(), "{:?}", server.received());
    drop(anonymous);

    let mistrusting = tollgate(&server)
        .env("CONFIG_GRPC_XDS_SERVER_TLS_SAN", "xds.example.com")
        .start_alive();
    wait_until(&mistrusting, "the server's certificate refused", || {
        mistrusting.log().contains("not valid for name")
    });
    assert_eq!(health(&mistrusting), ServingStatus::NotServing);
    assert!(server.received().is_empty(), "{:?}", server.received());
    drop(mistrusting);

    let by_name = tollgate(&server)
        .env("CONFIG_GRPC_XDS_SERVER_TLS_SAN", "envoy-gateway")
        .start();
    server.wait_for_ack("1");
    assert_eq!(
        Rls::new(&by_name).status("edge", &[("user", "u")]),
        (Code::Ok, 0, Some(1))
    );
}

/// tollgate's extensions arrive in `RateLimitPolicy.tollgate`, spelled as in a file, and
/// `--xds-default-algorithm` gives the algorithm to limits whose control plane cannot say it.
/// A weighted hit of the log is one entry, whatever its cost.
#[test]
fn tollgates_extensions_and_their_defaults() {
    let server = management_server();
    let mut tokens = policy(RateLimitUnit::Unknown, 1000).expect("a policy");
    tokens.tollgate = Some(LimitExtension {
        algorithm: "sliding_window_log".into(),
        window: "90s".into(),
        failure_mode: "deny".into(),
        ..Default::default()
    });
    let mut counted = policy(RateLimitUnit::Hour, 50).expect("a policy");
    counted.tollgate = Some(LimitExtension {
        algorithm: "sliding_window_counter".into(),
        shards: 2,
        ..Default::default()
    });
    server.push(
        "1",
        &[config(
            "ai",
            "ai",
            vec![
                descriptor("tenant", "", Some(tokens)),
                descriptor("model", "", Some(counted)),
                descriptor("user", "", policy(RateLimitUnit::Minute, 10)),
            ],
        )],
    );
    let tollgate = tollgate(&server)
        .args(["--xds-default-algorithm", "sliding_window_log"])
        .start();
    server.wait_for_ack("1");

    let rlconfig = get(&tollgate, "/rlconfig").body;
    let table: Vec<Vec<&str>> = rlconfig
        .lines()
        .filter(|line| !line.starts_with('#'))
        .map(|line| line.split_whitespace().collect())
        .collect();
    assert_eq!(
        table,
        vec![
            vec![
                "ai.model",
                "sliding_window_counter",
                "50",
                "hour",
                "shards=2"
            ],
            vec![
                "ai.tenant",
                "sliding_window_log",
                "1000",
                "1m30s",
                "failure_mode=deny"
            ],
            vec!["ai.user", "sliding_window_log", "10", "minute", "-"],
        ]
    );

    // Token costs: 600 then 300 fit in 1000, 200 more does not; 100 still does.
    let rls = Rls::new(&tollgate);
    let tenant = [("tenant", "acme")];
    let remaining = |hits| {
        let response = rls.ask_hits("ai", &tenant, hits).expect("an answer");
        (
            Code::try_from(response.statuses[0].code).expect("a code"),
            response.statuses[0].limit_remaining,
        )
    };
    assert_eq!(remaining(600).0, Code::Ok);
    assert_eq!(remaining(300).0, Code::Ok);
    assert_eq!(remaining(200).0, Code::OverLimit);
    assert_eq!(remaining(100).0, Code::Ok);

    // An extension the rules refuse is NACKed like any other mistake.
    let mut bad = policy(RateLimitUnit::Minute, 5).expect("a policy");
    bad.tollgate = Some(LimitExtension {
        algorithm: "fixed_window".into(),
        ..Default::default()
    });
    server.push(
        "2",
        &[config("ai", "ai", vec![descriptor("k", "", Some(bad))])],
    );
    assert_eq!(
        server.wait_for_nack().nack_message(),
        Some(
            "ai: descriptors[0].rate_limit.tollgate.algorithm: unknown algorithm \
             `fixed_window`; write sliding_window_counter (the default) or sliding_window_log"
        )
    );
}

/// A response larger than XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES is not taken: the stream fails, the
/// policies in force stay, and a push that fits is taken after the reconnect.
#[test]
fn a_push_above_the_maximum_message_size_is_not_taken() {
    let server = management_server();
    server.push("1", &[per_user(1)]);
    let tollgate = tollgate(&server)
        .env("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", "300")
        .start();
    server.wait_for_ack("1");

    let many: Vec<RateLimitDescriptor> = (0..40)
        .map(|i| {
            descriptor(
                "user",
                &format!("user-{i}"),
                policy(RateLimitUnit::Minute, 9),
            )
        })
        .collect();
    server.push("2", &[config("edge", "edge", many)]);
    wait_until(&tollgate, "the oversized response refused", || {
        tollgate.log().contains("message length too large")
    });
    let rls = Rls::new(&tollgate);
    assert_eq!(
        rls.status("edge", &[("user", "user-1")]),
        (Code::Ok, 0, Some(1))
    );
    assert!(
        !server
            .received()
            .iter()
            .any(|r| r.request.version_info == "2")
    );

    server.push("3", &[per_user(4)]);
    server.wait_for_ack("3");
    assert_eq!(rls.status("edge", &[("user", "x")]), (Code::Ok, 3, Some(4)));
}

/// tollgate started with the environment Envoy Gateway gives the rate-limit Deployment (its
/// xDS settings, certificates mounted as `tls.crt`, `tls.key`, `ca.crt`, its runtime and
/// logging settings) takes Envoy Gateway-shaped policies from the management server over mutual
/// TLS and decides with them.
#[test]
fn envoy_gateways_environment_takes_its_policies_over_mutual_tls() {
    let server = management_server();
    let certs = TestPki::shared().client.dir();
    let cert = |name: &str| certs.join(name).to_string_lossy().into_owned();
    // As Envoy Gateway shapes them: the route as key and value, under it one chain per rule; rule
    // 0 limits each value of a header (no value: Distinct), rule 1 matches a header value and is
    // in shadow mode, which Envoy Gateway sets on every node of the rule's chain.
    let route = "httproute/default/backend/rule/0/match/0/www_example_com";
    let distinct = descriptor("rule-0-match-0", "", policy(RateLimitUnit::Hour, 2));
    let mut shadowed = descriptor(
        "rule-1-match-0",
        "rule-1-match-0",
        policy(RateLimitUnit::Hour, 1),
    );
    shadowed.shadow_mode = true;
    let mut top = descriptor(route, route, None);
    top.descriptors = vec![distinct, shadowed];
    let domain = "envoy-gateway-system/eg/http";
    server.push("1", &[config(domain, domain, vec![top])]);

    let tollgate = Tollgate::builder()
        .without_config()
        .env("CONFIG_TYPE", "GRPC_XDS_SOTW")
        .env("CONFIG_GRPC_XDS_SERVER_URL", &server.url())
        .env("CONFIG_GRPC_XDS_NODE_ID", NODE)
        .env("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true")
        .env("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", &cert("tls.crt"))
        .env("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", &cert("tls.key"))
        .env("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", &cert("ca.crt"))
        .env("FORCE_START_WITHOUT_INITIAL_CONFIG", "true")
        .env("RUNTIME_ROOT", "/data")
        .env("RUNTIME_SUBDIRECTORY", "ratelimit")
        .env("RUNTIME_IGNOREDOTFILES", "true")
        .env("RUNTIME_WATCH_ROOT", "false")
        .env("LOG_LEVEL", "info")
        .env("USE_STATSD", "false")
        .start();
    // Accepted pushes are in force before they are ACKed.
    server.wait_for_ack("1");
    let rls = Rls::new(&tollgate);
    let entries = [(route, route), ("rule-0-match-0", "alice")];
    assert_eq!(rls.status(domain, &entries), (Code::Ok, 1, Some(2)));
    assert_eq!(rls.status(domain, &entries), (Code::Ok, 0, Some(2)));
    assert_eq!(rls.status(domain, &entries), (Code::OverLimit, 0, Some(2)));
    let shadow = [(route, route), ("rule-1-match-0", "rule-1-match-0")];
    assert_eq!(rls.status(domain, &shadow), (Code::Ok, 0, Some(1)));
    let over_but_shadowed = rls.ask(domain, &shadow);
    assert_eq!(over_but_shadowed.overall_code, Code::Ok as i32);
    assert_eq!(over_but_shadowed.statuses[0].code, Code::Ok as i32);
    let first = &server.received()[0];
    assert_eq!(
        first.request.node.as_ref().map(|n| n.id.as_str()),
        Some(NODE)
    );
    assert!(first.client_certificates >= 1);
}

/// End to end: a real Envoy's rate-limit filter calls tollgate while tollgate's policies arrive
/// over xDS; a new version changes what Envoy's clients get, without a restart.
#[test]
fn envoy_enforces_policies_delivered_over_xds() {
    let server = management_server();
    server.push("1", &[per_user(2)]);
    let tollgate = tollgate(&server).start();
    server.wait_for_ack("1");
    let envoy = Envoy::builder("edge", tollgate.grpc_addr())
        .descriptor(vec![Action::header("x-user", "user")])
        .start();

    let status = |user: &str| envoy.get("/", &[("x-user", user)]).status;
    assert_eq!(status("alice"), 200);
    assert_eq!(status("alice"), 200);
    assert_eq!(status("alice"), 429);

    server.push("2", &[per_user(3)]);
    server.wait_for_ack("2");
    wait_until(&tollgate, "version 2 in force", || {
        get(&tollgate, "/rlconfig").body.contains("version=\"2\"")
    });
    assert_eq!(status("bob"), 200);
    assert_eq!(status("bob"), 200);
    assert_eq!(status("bob"), 200);
    assert_eq!(status("bob"), 429);
    // alice's two hits survived the update: one more fits under the new limit of three.
    assert_eq!(status("alice"), 200);
    assert_eq!(status("alice"), 429);
}

/// Settings that cannot work stop the start, naming the variable, and never print a header
/// value.
#[test]
fn malformed_settings_stop_the_start() {
    let start = |env: &[(&str, &str)]| {
        let output = std::process::Command::new(tollgate_bin())
            .args([
                "serve",
                "--grpc-addr",
                "127.0.0.1:0",
                "--http-addr",
                "127.0.0.1:0",
            ])
            .env("CONFIG_TYPE", "GRPC_XDS_SOTW")
            .env("CONFIG_GRPC_XDS_SERVER_URL", "127.0.0.1:9")
            .envs(env.iter().copied())
            .output()
            .expect("run tollgate");
        assert!(!output.status.success(), "{output:?}");
        String::from_utf8_lossy(&output.stderr).into_owned()
    };
    assert_eq!(
        start(&[
            ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
            ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "/nonexistent/ca.crt"),
        ]),
        "tollgate: CONFIG_GRPC_XDS_SERVER_TLS_CACERT: cannot read /nonexistent/ca.crt: No such \
         file or directory (os error 2)\n"
    );
    assert_eq!(
        start(&[("XDS_CLIENT_BACKOFF_JITTER", "maybe")]),
        "tollgate: XDS_CLIENT_BACKOFF_JITTER: `maybe` is not a boolean; write true or false\n"
    );
    let stderr = start(&[(
        "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
        "authorization:Bearer a:b",
    )]);
    assert!(
        stderr.contains("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS: item 1"),
        "{stderr}"
    );
    assert!(!stderr.contains("Bearer"), "{stderr}");
    assert_eq!(
        start(&[("CONFIG_TYPE", "GRPC_XDS_DELTA")]),
        "tollgate: CONFIG_TYPE=GRPC_XDS_DELTA: expected FILE or GRPC_XDS_SOTW\n"
    );
}
