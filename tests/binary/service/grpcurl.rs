//! Debugging with grpcurl through server reflection, with no proto files: the commands the README
//! shows, run with the real grpcurl binary against the real server. Older grpcurl releases (the
//! one used here included) speak only reflection v1alpha; v1 is checked with tonic's client.

use std::net::SocketAddr;
use std::process::{Command, Output};
use std::time::Duration;

use tollgate::proto::RLS_SERVICE_NAME as RLS;
use tollgate_testkit::in_process::InProcess;
use tollgate_testkit::net::{agent, closed_addr, send};
use tollgate_testkit::rls::channel;
use tollgate_testkit::target::Store;
use tollgate_testkit::tollgate::{LIVENESS, per_user_per_minute};
use tollgate_testkit::tools::grpcurl_bin;
use tollgate_testkit::wait;

fn start() -> InProcess {
    InProcess::start(&per_user_per_minute(5))
}

/// Runs `grpcurl -plaintext <flags> <addr> <verb...>`.
fn grpcurl(flags: &[&str], addr: SocketAddr, verb: &[&str]) -> Output {
    Command::new(grpcurl_bin())
        .args(["-plaintext", "-max-time", "10"])
        .args(flags)
        .arg(addr.to_string())
        .args(verb)
        .output()
        .expect("run grpcurl")
}

/// Runs grpcurl and returns its stdout, which must be a success.
fn grpcurl_ok(flags: &[&str], addr: SocketAddr, verb: &[&str]) -> String {
    let output = grpcurl(flags, addr, verb);
    let args = [flags, verb].concat();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "grpcurl {args:?} failed: {}\n{stdout}{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

fn should_rate_limit(addr: SocketAddr, json: &str) -> String {
    grpcurl_ok(&["-d", json], addr, &[&format!("{RLS}/ShouldRateLimit")])
}

#[test]
fn grpcurl_lists_and_describes_the_services() {
    let tollgate = start();
    let addr = tollgate.grpc_addr();

    let services = grpcurl_ok(&[], addr, &["list"]);
    let services: Vec<&str> = services.lines().collect();
    assert!(services.contains(&RLS), "{services:?}");
    assert!(services.contains(&"grpc.health.v1.Health"), "{services:?}");
    // Envoy's quota service, beside RLS ([docs/rlqs.md]).
    let rlqs = "envoy.service.rate_limit_quota.v3.RateLimitQuotaService";
    assert!(services.contains(&rlqs), "{services:?}");
    let methods = grpcurl_ok(&[], addr, &["list", rlqs]);
    assert_eq!(methods.trim(), format!("{rlqs}.StreamRateLimitQuotas"));

    let methods = grpcurl_ok(&[], addr, &["list", RLS]);
    assert_eq!(methods.trim(), format!("{RLS}.ShouldRateLimit"));

    let service = grpcurl_ok(&[], addr, &["describe", RLS]);
    assert!(service.contains("rpc ShouldRateLimit"), "{service}");
    assert!(
        service.contains(".envoy.service.ratelimit.v3.RateLimitRequest"),
        "{service}"
    );

    let request = grpcurl_ok(
        &[],
        addr,
        &["describe", "envoy.service.ratelimit.v3.RateLimitRequest"],
    );
    for field in [
        "string domain = 1;",
        "descriptors = 2;",
        "uint32 hits_addend = 3;",
    ] {
        assert!(request.contains(field), "no {field:?} in {request}");
    }
}

#[test]
fn grpcurl_json_call_decides_like_envoy_would() {
    let tollgate = start();
    let addr = tollgate.grpc_addr();
    let alice = r#"{"domain":"edge","descriptors":[{"entries":[{"key":"user","value":"alice"}]}]}"#;

    let first = should_rate_limit(addr, alice);
    assert!(first.contains(r#""overallCode": "OK""#), "{first}");
    assert!(first.contains(r#""requestsPerUnit": 5"#), "{first}");
    assert!(first.contains(r#""unit": "MINUTE""#), "{first}");
    assert!(first.contains(r#""limitRemaining": 4"#), "{first}");

    for _ in 0..4 {
        should_rate_limit(addr, alice);
    }
    let over = should_rate_limit(addr, alice);
    assert!(over.contains(r#""overallCode": "OVER_LIMIT""#), "{over}");
    assert!(over.contains(r#""key": "retry-after""#), "{over}");

    for service in [RLS, LIVENESS] {
        assert_health(addr, service, "SERVING");
    }
}

#[test]
fn grpcurl_shows_invalid_argument_for_bad_input() {
    let tollgate = start();
    let output = grpcurl(
        &[
            "-d",
            r#"{"domain":"","descriptors":[{"entries":[{"key":"user","value":"alice"}]}]}"#,
        ],
        tollgate.grpc_addr(),
        &[&format!("{RLS}/ShouldRateLimit")],
    );
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("InvalidArgument"), "{stderr}");
}

/// Asserts what grpcurl prints for `grpc.health.v1.Health/Check` of `service`.
fn assert_health(addr: SocketAddr, service: &str, status: &str) {
    let health = grpcurl_ok(
        &["-d", &format!(r#"{{"service":"{service}"}}"#)],
        addr,
        &["grpc.health.v1.Health/Check"],
    );
    let expected = format!(r#""status": "{status}""#);
    assert!(health.contains(&expected), "{service:?}: {health}");
}

/// What the Kubernetes probes ask, with nothing listening at the Redis URL: the process is alive
/// (`tollgate.liveness` SERVING) but not ready (the RLS service and the server as a whole
/// NOT_SERVING), so an outage takes it out of rotation without restarting it.
#[test]
fn grpcurl_health_tells_liveness_from_readiness_while_redis_is_down() {
    let nowhere = format!("redis://{}", closed_addr());
    let tollgate = InProcess::builder()
        .policy("edge.yaml", &per_user_per_minute(5))
        .store(Store::Redis(nowhere))
        .start_alive();
    let addr = tollgate.grpc_addr();

    // Past the first backend probe, so the answers below describe the outage, not the start.
    let http = agent();
    wait::until("a failed backend probe", Duration::from_secs(10), || {
        let reply = send(&http, "GET", &tollgate.url("/healthcheck"), &[], None);
        reply.status == 503 && !reply.body.contains("not probed yet")
    });

    assert_health(addr, LIVENESS, "SERVING");
    for service in [RLS, ""] {
        assert_health(addr, service, "NOT_SERVING");
    }
}

/// Reflection v1 (what current grpcurl releases try first) lists the same services.
#[test]
fn reflection_v1_lists_the_services() {
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;

    let tollgate = start();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("build a tokio runtime");
    let names = runtime.block_on(async {
        let channel = channel(tollgate.grpc_addr()).await.expect("connect");
        let mut client = ServerReflectionClient::new(channel);
        let request = ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::ListServices(String::new())),
        };
        let mut responses = client
            .server_reflection_info(tonic::codegen::tokio_stream::iter([request]))
            .await
            .expect("reflection call")
            .into_inner();
        let response = responses
            .message()
            .await
            .expect("a reflection answer")
            .expect("one message");
        match response.message_response {
            Some(MessageResponse::ListServicesResponse(list)) => list
                .service
                .into_iter()
                .map(|service| service.name)
                .collect::<Vec<_>>(),
            other => panic!("unexpected reflection answer {other:?}"),
        }
    });
    assert!(names.iter().any(|name| name == RLS), "{names:?}");
    assert!(
        names.iter().any(|name| name == "grpc.health.v1.Health"),
        "{names:?}"
    );
}

/// The RLS call is served straight and every other path through tonic's router: the call, a
/// method the RLS service does not have, a service the server does not have, and health all
/// answer on one connection as tonic answers them, on the fast path and on tonic's generated
/// service alike.
#[test]
fn the_rls_call_and_every_other_path_answer_on_one_connection() {
    for fast_path in [true, false] {
        every_path_answers_on_one_connection(fast_path);
    }
}

fn every_path_answers_on_one_connection(fast_path: bool) {
    use tollgate::proto::{RateLimitRequest, RateLimitResponse};
    use tollgate_testkit::rls::request;
    use tonic::client::Grpc;
    use tonic::transport::Channel;
    use tonic_prost::ProstCodec;

    async fn call(
        grpc: &mut Grpc<Channel>,
        path: &str,
    ) -> Result<tonic::Response<RateLimitResponse>, tonic::Status> {
        grpc.ready().await.expect("the channel is ready");
        grpc.unary(
            tonic::Request::new(request("edge", &[&[("user", "alice")]])),
            path.parse().expect("a path"),
            ProstCodec::<RateLimitRequest, RateLimitResponse>::default(),
        )
        .await
    }

    let tollgate = InProcess::builder()
        .policy("config.yaml", &per_user_per_minute(5))
        .grpc_fast_path(fast_path)
        .start();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("build a tokio runtime");
    runtime.block_on(async {
        let channel = channel(tollgate.grpc_addr()).await.expect("connect");
        let mut grpc = Grpc::new(channel);
        let answer = call(&mut grpc, &format!("/{RLS}/ShouldRateLimit"))
            .await
            .expect("the RLS call is answered");
        assert_eq!(answer.get_ref().overall_code, 1, "{answer:?}");
        for path in [
            format!("/{RLS}/NoSuchMethod"),
            "/no.such.Service/Call".to_owned(),
        ] {
            let refused = call(&mut grpc, &path)
                .await
                .expect_err("not a method of the server");
            assert_eq!(
                (refused.code(), refused.message()),
                (tonic::Code::Unimplemented, ""),
                "{path} (fast path: {fast_path}): {refused:?}"
            );
        }
    });
    assert_health(tollgate.grpc_addr(), "", "SERVING");
}
