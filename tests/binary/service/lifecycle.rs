//! The service's life as an operator sees it, against the `tollgate` binary and real Redis:
//! `/healthcheck` and gRPC health following the backend away and back, SIGTERM draining in-flight
//! calls before a clean exit, and `serve`'s flags switching on the reference's counting, quota
//! mode and dynamic metadata. The admin helpers are [`super::admin`]'s.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use serde_json::json;
use tollgate::proto::RLS_SERVICE_NAME as RLS;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use tollgate_testkit::redis::RedisServer;
use tollgate_testkit::rls::channel;
use tollgate_testkit::tollgate::{LIVENESS, Tollgate, per_user_per_minute};
use tollgate_testkit::wait;

use super::admin::{Client, POLL_LIMIT, mask_retry_times, request, response_json};

// ---------------------------------------------------------------------------------------------
// GET /healthcheck and gRPC health with a Redis backend

const REDIS_POLICY: &str = "domain: edge
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 5, failure_mode: deny}
";

/// With Redis down, tollgate is alive but not ready: `/healthcheck` says why, readiness is
/// NOT_SERVING while liveness stays SERVING, and `/json` answers each limit's failure mode exactly
/// as gRPC does. Once Redis listens, everything is SERVING and counting.
#[test]
fn healthcheck_follows_redis_going_and_coming_back() {
    // Reserve a Redis port, then leave it closed until tollgate has noticed.
    let mut redis = RedisServer::start();
    redis.stop();
    let tollgate = Tollgate::builder()
        .policy("edge.yaml", REDIS_POLICY)
        .args(["--backend", "redis", "--redis-url", &redis.url()])
        .start_alive();
    let mut client = Client::of(&tollgate);

    let down = client.poll("/healthcheck", "a failed Redis probe", |reply| {
        reply.status == 503 && !reply.body.contains("not probed yet")
    });
    let reason = down.body.trim();
    assert!(
        reason.starts_with("backend unavailable: ") && reason.len() > "backend unavailable: ".len(),
        "{down:?}"
    );
    assert_eq!(
        reason.matches("backend unavailable").count(),
        1,
        "the reason says it once: {reason:?}"
    );
    assert_eq!(client.health(RLS), ServingStatus::NotServing);
    assert_eq!(client.health(""), ServingStatus::NotServing);
    assert_eq!(client.health(LIVENESS), ServingStatus::Serving);

    // Backend failures: the user limit fails open (the default), the tenant limit closed.
    let allowed = request("edge", &[&[("user", "gina")]]);
    let (status, answer) = client.json(&allowed);
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["overallCode"], "OK", "{answer}");
    let from_grpc = response_json(&client.grpc(&allowed).expect("an answer"));
    assert_eq!(answer, from_grpc);

    let denied = request("edge", &[&[("user", "gina")], &[("tenant", "t1")]]);
    let (status, answer) = client.json(&denied);
    assert_eq!(status, 429, "{answer}");
    assert_eq!(answer["overallCode"], "OVER_LIMIT", "{answer}");
    assert_eq!(answer["statuses"][1]["code"], "OVER_LIMIT", "{answer}");
    let from_grpc = response_json(&client.grpc(&denied).expect("an answer"));
    assert_eq!(
        mask_retry_times(answer, 60),
        mask_retry_times(from_grpc, 60)
    );

    redis.restart();
    let up = client.poll("/healthcheck", "Redis to be back", |reply| {
        reply.status == 200
    });
    assert_eq!(up.body, "OK\n");
    assert_eq!(client.health(RLS), ServingStatus::Serving);
    assert_eq!(client.health(""), ServingStatus::Serving);
    assert_eq!(client.health(LIVENESS), ServingStatus::Serving);

    // Now counted in Redis, by both interfaces.
    let (status, answer) = client.json(&allowed);
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["statuses"][0]["limitRemaining"], 4, "{answer}");
    let response = client.grpc(&allowed).expect("an answer");
    assert_eq!(response.statuses[0].limit_remaining, 3, "{response:?}");
}

// ---------------------------------------------------------------------------------------------
// SIGTERM

/// Reads from `stream` until `done` holds for everything read so far (or the peer closes).
fn read_until(stream: &mut TcpStream, done: impl Fn(&str) -> bool) -> String {
    let mut received = Vec::new();
    let mut buffer = [0u8; 4096];
    loop {
        let text = String::from_utf8_lossy(&received).into_owned();
        if done(&text) {
            return text;
        }
        match stream.read(&mut buffer) {
            Ok(0) => return text,
            Ok(read) => received.extend_from_slice(&buffer[..read]),
            Err(err) => panic!("reading from tollgate: {err} (so far: {text:?})"),
        }
    }
}

/// SIGTERM turns every health service NOT_SERVING, closes the listeners, lets a call already in
/// flight finish (answered 503 by `/json`, which does not start decisions while draining), and
/// exits 0.
#[test]
fn sigterm_drains_and_exits_zero() {
    let mut tollgate = Tollgate::builder()
        .policy("config.yaml", &per_user_per_minute(5))
        .args(["--drain-timeout", "1s"])
        .start();
    let client = Client::of(&tollgate);
    let runtime = &client.runtime;

    // Health watchers see the switch as it happens.
    let mut watchers: Vec<_> = [RLS, LIVENESS]
        .into_iter()
        .map(|service| {
            runtime.block_on(async {
                let channel = channel(tollgate.grpc_addr()).await.expect("connect");
                let mut stream = HealthClient::new(channel)
                    .watch(HealthCheckRequest {
                        service: service.to_owned(),
                    })
                    .await
                    .expect("a health watch")
                    .into_inner();
                let first = stream.message().await.expect("a status").expect("one");
                assert_eq!(first.status(), ServingStatus::Serving, "{service}");
                (service, stream)
            })
        })
        .collect();

    // A `/json` call in flight: its head is read (the server asked for the body with
    // `100 Continue`), its body not yet sent.
    let body = request("edge", &[&[("user", "hank")]]).to_string();
    let mut in_flight = TcpStream::connect(tollgate.http_addr()).expect("connect over HTTP");
    in_flight
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("a read timeout");
    write!(
        in_flight,
        "POST /json HTTP/1.1\r\nhost: tollgate\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nexpect: 100-continue\r\n\r\n",
        body.len()
    )
    .expect("send the request head");
    let interim = read_until(&mut in_flight, |text| text.contains("\r\n\r\n"));
    assert!(interim.starts_with("HTTP/1.1 100 Continue"), "{interim:?}");

    tollgate.terminate();

    for (service, stream) in &mut watchers {
        // A watch stream may repeat an unchanged status (every backend probe publishes it
        // again); the first status that differs is the switch.
        let changed = async {
            loop {
                let message = stream.message().await.expect("a status").expect("one");
                if message.status() != ServingStatus::Serving {
                    return message.status();
                }
            }
        };
        let next = runtime
            .block_on(async { tokio::time::timeout(POLL_LIMIT, changed).await })
            .unwrap_or_else(|_| panic!("no health change of {service:?} after SIGTERM"));
        assert_eq!(next, ServingStatus::NotServing, "{service}");
    }

    // The listeners close once draining has begun...
    for addr in [tollgate.http_addr(), tollgate.grpc_addr()] {
        wait::until(&format!("{addr} to refuse connections"), POLL_LIMIT, || {
            TcpStream::connect(addr).is_err()
        });
    }

    // ...and the call in flight still gets its answer.
    in_flight
        .write_all(body.as_bytes())
        .expect("send the request body");
    let answer = read_until(&mut in_flight, |_| false);
    assert!(
        answer.starts_with("HTTP/1.1 503"),
        "a call finishing while draining: {answer:?}"
    );
    assert!(answer.contains("draining"), "{answer:?}");

    // The watch streams are still open: the drain deadline, not the clients, ends the process.
    let status = tollgate.wait_exit(POLL_LIMIT);
    assert_eq!(status.code(), Some(0), "{status}\n{}", tollgate.log());
    drop(watchers);
}

// ---------------------------------------------------------------------------------------------
// The reference's counting, quota mode and dynamic metadata, switched on by flags

#[test]
fn serve_flags_switch_on_the_reference_counting_quota_mode_and_metadata() {
    let tollgate = Tollgate::builder()
        .policy(
            "rl.yaml",
            "domain: rl
descriptors:
  - key: service
    value: s2
    metadata: {service_with_quota: {name: s2}}
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: plain
    rate_limit: {unit: hour, requests_per_unit: 1}
",
        )
        .args([
            "--counting",
            "all",
            "--response-dynamic-metadata",
            "--quota-mode=true",
        ])
        .start();
    let client = Client::of(&tollgate);
    let service = |hits: u64| {
        json!({"domain": "rl", "descriptors": [
            {"entries": [{"key": "service", "value": "s2"}], "hitsAddend": hits}
        ]})
    };

    // A check, then a debit larger than what is left: charged, so the next check is refused.
    let (status, answer) = client.json(&service(0));
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["statuses"][0]["limitRemaining"], 2, "{answer}");
    let metadata = &answer["dynamicMetadata"];
    assert_eq!(metadata["domain"], "rl", "{answer}");
    assert_eq!(
        metadata["descriptors"][0]["entries"],
        json!(["service=s2"]),
        "{answer}"
    );
    // A Struct number is a double.
    assert_eq!(
        metadata["descriptors"][0]["hitsAddend"].as_f64(),
        Some(0.0),
        "{answer}"
    );
    assert_eq!(
        metadata["metadata"],
        json!({"service_with_quota": {"name": "s2"}}),
        "{answer}"
    );
    let (status, answer) = client.json(&service(3));
    assert_eq!(status, 429, "{answer}");
    let (status, answer) = client.json(&service(0));
    assert_eq!(status, 429, "the debit was charged: {answer}");
    assert!(
        answer["dynamicMetadata"].get("metadata").is_none(),
        "{answer}"
    );

    // Quota mode: a request is rejected only when every descriptor is over.
    let plain = json!({"entries": [{"key": "plain", "value": "x"}]});
    let free = json!({"entries": [{"key": "unmatched", "value": "x"}]});
    let (status, _) = client.json(&json!({"domain": "rl", "descriptors": [plain.clone()]}));
    assert_eq!(status, 200);
    let (status, answer) = client.json(&json!({"domain": "rl", "descriptors": [plain, free]}));
    assert_eq!(status, 200, "one passed: {answer}");
    assert_eq!(answer["statuses"][0]["code"], "OVER_LIMIT", "{answer}");
}
