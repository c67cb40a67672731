//! The admin HTTP interface over real HTTP: `POST /json` speaks proto3 JSON and decides exactly
//! as the gRPC service does (one counter behind both), `/metrics` counts requests by code (both
//! against the server in this process); `/rlconfig` shows the loaded limits and follows hot
//! reloads (against the `tollgate` binary). Health, SIGTERM and `serve`'s flags are in
//! [`super::lifecycle`], which shares the [`Client`] defined here.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use prost::Message as _;
use serde_json::{Map, Value, json};
use tokio::runtime::Runtime;
use tollgate::proto::rate_limit_descriptor::Entry;
use tollgate::proto::rate_limit_response::{Code, rate_limit::Unit};
use tollgate::proto::rate_limit_service_client::RateLimitServiceClient;
use tollgate::proto::{HeaderValue, RateLimitDescriptor, RateLimitRequest, RateLimitResponse};
use tonic::transport::Channel;
use tonic_health::pb::health_check_response::ServingStatus;

use tollgate_testkit::in_process::InProcess;
use tollgate_testkit::net::{Reply, agent, send};
use tollgate_testkit::rls::{channel, health_status};
use tollgate_testkit::tollgate::{Tollgate, per_user_per_minute};
use tollgate_testkit::wait;

/// How long a poll for a state change (a reload, a health flip) may take on a busy machine.
pub(super) const POLL_LIMIT: Duration = Duration::from_secs(10);

/// Blocking access to one tollgate over both of its interfaces.
pub(super) struct Client {
    http: ureq::Agent,
    http_addr: SocketAddr,
    grpc_addr: SocketAddr,
    pub(super) runtime: Runtime,
    rls: RateLimitServiceClient<Channel>,
}

impl Client {
    /// A client of the tollgate whose gRPC and admin HTTP listen at these addresses.
    pub(super) fn new(grpc_addr: SocketAddr, http_addr: SocketAddr) -> Client {
        // Worker threads keep the connections' background tasks running between calls, as in
        // any real client, so a dropped stream is cancelled at once.
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("build a tokio runtime");
        let channel = runtime
            .block_on(channel(grpc_addr))
            .expect("connect to tollgate's gRPC port");
        Client {
            http: agent(),
            http_addr,
            grpc_addr,
            runtime,
            rls: RateLimitServiceClient::new(channel),
        }
    }

    pub(super) fn get(&self, path: &str) -> Reply {
        send(
            &self.http,
            "GET",
            &format!("http://{}{path}", self.http_addr),
            &[],
            None,
        )
    }

    /// `POST /json` with `body` as it is.
    pub(super) fn post_json(&self, body: &str) -> Reply {
        send(
            &self.http,
            "POST",
            &format!("http://{}/json", self.http_addr),
            &[("content-type", "application/json")],
            Some(body),
        )
    }

    /// `POST /json` of `request`, which must answer JSON: the status and the parsed body.
    pub(super) fn json(&self, request: &Value) -> (u16, Value) {
        let reply = self.post_json(&request.to_string());
        assert_eq!(
            reply.header("content-type"),
            Some("application/json"),
            "{reply:?}"
        );
        let body = serde_json::from_str(&reply.body)
            .unwrap_or_else(|err| panic!("the /json answer is not JSON ({err}): {reply:?}"));
        (reply.status, body)
    }

    /// `ShouldRateLimit` over gRPC with the protobuf form of the JSON `request`.
    pub(super) fn grpc(&mut self, request: &Value) -> Result<RateLimitResponse, tonic::Status> {
        let request = request_proto(request);
        self.runtime
            .block_on(self.rls.should_rate_limit(request))
            .map(tonic::Response::into_inner)
    }

    pub(super) fn health(&self, service: &str) -> ServingStatus {
        self.runtime
            .block_on(health_status(self.grpc_addr, service))
            .unwrap_or_else(|err| panic!("gRPC health check of {service:?}: {err}"))
    }

    /// Polls `GET path` until `done` holds for the reply, answering that reply.
    pub(super) fn poll(&self, path: &str, what: &str, done: impl Fn(&Reply) -> bool) -> Reply {
        wait::until_some(what, POLL_LIMIT, || {
            let reply = self.get(path);
            done(&reply).then_some(reply)
        })
    }

    /// A client of the tollgate process.
    pub(super) fn of(tollgate: &Tollgate) -> Client {
        Client::new(tollgate.grpc_addr(), tollgate.http_addr())
    }

    /// A client of the tollgate in this process.
    pub(super) fn of_in_process(tollgate: &InProcess) -> Client {
        Client::new(tollgate.grpc_addr(), tollgate.http_addr())
    }
}

/// A request for `domain` with one descriptor per list of entries, as proto3 JSON.
pub(super) fn request(domain: &str, descriptors: &[&[(&str, &str)]]) -> Value {
    let descriptors: Vec<Value> = descriptors
        .iter()
        .map(|entries| {
            let entries: Vec<Value> = entries
                .iter()
                .map(|(key, value)| json!({"key": key, "value": value}))
                .collect();
            json!({ "entries": entries })
        })
        .collect();
    json!({"domain": domain, "descriptors": descriptors})
}

/// The protobuf form of a JSON request made by [`request`] (plus an optional `hitsAddend`),
/// converted by hand so that the gRPC side does not share the server's JSON code.
fn request_proto(request: &Value) -> RateLimitRequest {
    let object = request.as_object().expect("a JSON object");
    for key in object.keys() {
        assert!(
            ["domain", "descriptors", "hitsAddend"].contains(&key.as_str()),
            "request_proto does not convert {key:?}"
        );
    }
    let text = |value: &Value| value.as_str().expect("a string").to_owned();
    RateLimitRequest {
        domain: object.get("domain").map(text).unwrap_or_default(),
        descriptors: object
            .get("descriptors")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default()
            .iter()
            .map(|descriptor| RateLimitDescriptor {
                entries: descriptor["entries"]
                    .as_array()
                    .expect("entries")
                    .iter()
                    .map(|entry| Entry {
                        key: text(&entry["key"]),
                        value: text(&entry["value"]),
                    })
                    .collect(),
                ..Default::default()
            })
            .collect(),
        hits_addend: object
            .get("hitsAddend")
            .map(|n| u32::try_from(n.as_u64().expect("a number")).expect("a u32"))
            .unwrap_or_default(),
    }
}

fn code_name(code: i32) -> &'static str {
    Code::try_from(code)
        .unwrap_or_else(|_| panic!("unknown code {code}"))
        .as_str_name()
}

/// The proto3 JSON mapping of a gRPC response, written out by hand: lowerCamelCase names, enum
/// names as strings, durations as `"<seconds>s"`, and fields at their default value left out.
pub(super) fn response_json(response: &RateLimitResponse) -> Value {
    let mut out = Map::new();
    if response.overall_code != 0 {
        out.insert(
            "overallCode".into(),
            code_name(response.overall_code).into(),
        );
    }
    let statuses: Vec<Value> = response
        .statuses
        .iter()
        .map(|status| {
            let mut out = Map::new();
            if status.code != 0 {
                out.insert("code".into(), code_name(status.code).into());
            }
            if let Some(limit) = &status.current_limit {
                let mut current = Map::new();
                if limit.requests_per_unit != 0 {
                    current.insert("requestsPerUnit".into(), limit.requests_per_unit.into());
                }
                if limit.unit != 0 {
                    let unit = Unit::try_from(limit.unit).expect("a known unit");
                    current.insert("unit".into(), unit.as_str_name().into());
                }
                if !limit.name.is_empty() {
                    current.insert("name".into(), limit.name.clone().into());
                }
                out.insert("currentLimit".into(), current.into());
            }
            if status.limit_remaining != 0 {
                out.insert("limitRemaining".into(), status.limit_remaining.into());
            }
            if let Some(reset) = &status.duration_until_reset {
                assert_eq!(reset.nanos, 0, "durations are whole seconds: {reset:?}");
                out.insert(
                    "durationUntilReset".into(),
                    format!("{}s", reset.seconds).into(),
                );
            }
            assert!(status.quota.is_none(), "no quota expected: {status:?}");
            out.into()
        })
        .collect();
    if !statuses.is_empty() {
        out.insert("statuses".into(), statuses.into());
    }
    let headers = |headers: &[HeaderValue]| -> Value {
        headers
            .iter()
            .map(|header| {
                assert!(header.raw_value.is_empty(), "{header:?}");
                json!({"key": header.key, "value": header.value})
            })
            .collect::<Vec<_>>()
            .into()
    };
    if !response.response_headers_to_add.is_empty() {
        out.insert(
            "responseHeadersToAdd".into(),
            headers(&response.response_headers_to_add),
        );
    }
    if !response.request_headers_to_add.is_empty() {
        out.insert(
            "requestHeadersToAdd".into(),
            headers(&response.request_headers_to_add),
        );
    }
    assert!(response.raw_body.is_empty(), "{response:?}");
    assert!(response.dynamic_metadata.is_none(), "{response:?}");
    assert!(response.quota.is_none(), "{response:?}");
    out.into()
}

/// Seconds of a proto3 JSON duration such as `"60s"`.
fn seconds(duration: &Value) -> u64 {
    duration
        .as_str()
        .and_then(|text| text.strip_suffix('s'))
        .and_then(|number| number.parse().ok())
        .unwrap_or_else(|| panic!("{duration} is not a duration in whole seconds"))
}

/// The time-dependent parts of an OVER_LIMIT answer (`durationUntilReset` of the statuses that
/// are over, the `retry-after` value) checked for consistency and then masked, so two answers
/// given moments apart compare equal. `window` bounds the retry time.
pub(super) fn mask_retry_times(mut response: Value, window: u64) -> Value {
    let mut longest = 0;
    let statuses = response.get_mut("statuses").and_then(Value::as_array_mut);
    for status in statuses.into_iter().flatten() {
        if status["code"] == "OVER_LIMIT" {
            let retry = seconds(&status["durationUntilReset"]);
            assert!((1..=window).contains(&retry), "{status}");
            longest = longest.max(retry);
            status["durationUntilReset"] = "<retry>".into();
        }
    }
    let headers = response
        .get_mut("responseHeadersToAdd")
        .and_then(Value::as_array_mut);
    for header in headers.into_iter().flatten() {
        if header["key"] == "retry-after" {
            assert_eq!(header["value"], longest.to_string(), "{header}");
            header["value"] = "<retry>".into();
        }
    }
    response
}

/// Every object key in `value`, recursively.
fn keys(value: &Value) -> Vec<String> {
    match value {
        Value::Object(map) => map
            .iter()
            .flat_map(|(key, value)| std::iter::once(key.clone()).chain(keys(value)))
            .collect(),
        Value::Array(items) => items.iter().flat_map(keys).collect(),
        _ => Vec::new(),
    }
}

// ---------------------------------------------------------------------------------------------
// POST /json

#[test]
fn json_speaks_proto3_json_in_and_out() {
    let tollgate = InProcess::start(
        "domain: edge
descriptors:
  - key: user
    rate_limit:
      algorithm: sliding_window_log
      unit: minute
      requests_per_unit: 5
      name: per-user
  - key: export
    rate_limit: {window: 90s, requests_per_unit: 30}
",
    );
    let client = Client::of_in_process(&tollgate);

    let mut first = request(
        "edge",
        &[
            &[("user", "alice")],
            &[("export", "k1")],
            &[("unlisted", "x")],
        ],
    );
    first["hitsAddend"] = 2.into();
    let (status, mut answer) = client.json(&first);
    assert_eq!(status, 200, "{answer}");
    for key in keys(&answer) {
        assert!(
            !key.contains('_'),
            "{key:?} is not lowerCamelCase: {answer}"
        );
    }
    // A 90 s window is no whole unit: the unit is UNKNOWN, the enum default, so it is left out;
    // the counter's reset time depends on where in its fixed window the call fell.
    let export_reset = seconds(&answer["statuses"][1]["durationUntilReset"]);
    assert!((90..=180).contains(&export_reset), "{answer}");
    answer["statuses"][1]["durationUntilReset"] = "<reset>".into();
    assert_eq!(
        answer,
        json!({
            "overallCode": "OK",
            "statuses": [
                {
                    "code": "OK",
                    "currentLimit": {"requestsPerUnit": 5, "unit": "MINUTE", "name": "per-user"},
                    "limitRemaining": 3,
                    "durationUntilReset": "60s",
                },
                {
                    "code": "OK",
                    "currentLimit": {"requestsPerUnit": 30},
                    "limitRemaining": 28,
                    "durationUntilReset": "<reset>",
                },
                {"code": "OK"},
            ],
        })
    );

    // Parsers accept the proto field names too.
    let reply = client.post_json(
        r#"{"domain":"edge","hits_addend":1,"descriptors":[{"entries":[{"key":"user","value":"alice"}]}]}"#,
    );
    assert_eq!(reply.status, 200, "{reply:?}");
    let answer: Value = serde_json::from_str(&reply.body).expect("JSON");
    assert_eq!(answer["statuses"][0]["limitRemaining"], 2, "{answer}");

    // A descriptor's hitsAddend is a UInt64Value, a JSON string for 64-bit numbers; 0 only checks.
    let (status, answer) = client.json(&json!({
        "domain": "edge",
        "descriptors": [{"entries": [{"key": "user", "value": "alice"}], "hitsAddend": "0"}],
    }));
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["statuses"][0]["limitRemaining"], 2, "{answer}");

    // An enum in the request is its name: a per-request limit override of 3 per hour.
    let (status, answer) = client.json(&json!({
        "domain": "edge",
        "descriptors": [{
            "entries": [{"key": "user", "value": "bob"}],
            "limit": {"requestsPerUnit": 3, "unit": "HOUR"},
        }],
    }));
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        answer["statuses"][0]["currentLimit"],
        json!({"requestsPerUnit": 3, "unit": "HOUR"}),
        "{answer}"
    );
    assert_eq!(answer["statuses"][0]["limitRemaining"], 2, "{answer}");

    // The last two units: remaining 0 is the default value, so it is left out.
    let mut last = request("edge", &[&[("user", "alice")]]);
    last["hitsAddend"] = 2.into();
    let (status, answer) = client.json(&last);
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["statuses"][0]["code"], "OK", "{answer}");
    assert!(
        answer["statuses"][0].get("limitRemaining").is_none(),
        "{answer}"
    );
}

/// One counter stands behind both interfaces: calls alternating between `/json` and gRPC on one
/// key count down together, and each answer is the one the other interface would have given.
#[test]
fn json_and_grpc_share_counters_and_answer_alike() {
    let tollgate = InProcess::start(
        "domain: edge
descriptors:
  - key: user
    rate_limit: {algorithm: sliding_window_log, unit: minute, requests_per_unit: 6}
",
    );
    let mut client = Client::of_in_process(&tollgate);
    let carol = request("edge", &[&[("user", "carol")], &[("unlisted", "x")]]);

    for step in 0..10u32 {
        let over = step >= 6;
        let via_json = step % 2 == 0;
        let answer = if via_json {
            let (status, answer) = client.json(&carol);
            assert_eq!(
                status,
                if over { 429 } else { 200 },
                "step {step}: {answer}"
            );
            answer
        } else {
            let response = client
                .grpc(&carol)
                .unwrap_or_else(|status| panic!("step {step}: {status}"));
            response_json(&response)
        };
        let expected = if over {
            json!({
                "overallCode": "OVER_LIMIT",
                "statuses": [
                    {
                        "code": "OVER_LIMIT",
                        "currentLimit": {"requestsPerUnit": 6, "unit": "MINUTE"},
                        "durationUntilReset": "<retry>",
                    },
                    {"code": "OK"},
                ],
                "responseHeadersToAdd": [{"key": "retry-after", "value": "<retry>"}],
            })
        } else {
            let mut status = json!({
                "code": "OK",
                "currentLimit": {"requestsPerUnit": 6, "unit": "MINUTE"},
                "durationUntilReset": "60s",
            });
            if step < 5 {
                status["limitRemaining"] = (5 - step).into();
            }
            json!({"overallCode": "OK", "statuses": [status, {"code": "OK"}]})
        };
        let via = if via_json { "/json" } else { "gRPC" };
        assert_eq!(
            mask_retry_times(answer, 60),
            expected,
            "step {step} via {via}"
        );
    }

    // Bad input: the same refusal with the same message from both.
    let bad = request("", &[&[("user", "carol")]]);
    let reply = client.post_json(&bad.to_string());
    assert_eq!(reply.status, 400, "{reply:?}");
    let status = client.grpc(&bad).expect_err("INVALID_ARGUMENT");
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status}");
    assert_eq!(reply.body.trim(), status.message());
}

/// The buffer tonic's codec starts each call with (8 KiB; the generated service's), and half
/// the largest HTTP/2 frame a client sends by default: a request past twice this arrives in
/// pieces on either gRPC path.
const FIRST_BUFFER_BYTES: usize = 8 * 1024;

/// The largest answer the fast path writes on the stack (`server::fast_path::wire`); a larger
/// one is left to prost.
const STACK_ANSWER_BYTES: usize = 512;

/// A request larger than the buffer each gRPC call starts with and an answer larger than the
/// fast path writes on the stack pass whole, on the fast path and on tonic's generated service:
/// decided like the same request sent to `/json`.
#[test]
fn grpc_messages_larger_than_the_first_buffer_pass_whole() {
    for fast_path in [true, false] {
        messages_larger_than_the_first_buffer_pass_whole(fast_path);
    }
}

fn messages_larger_than_the_first_buffer_pass_whole(fast_path: bool) {
    let tollgate = InProcess::builder()
        .policy(
            "config.yaml",
            "domain: edge
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 6}
",
        )
        .grpc_fast_path(fast_path)
        .start();
    let mut client = Client::of_in_process(&tollgate);
    let values: Vec<String> = (0..40).map(|i| format!("{i:0>500}")).collect();
    let descriptors: Vec<[(&str, &str); 1]> = values
        .iter()
        .map(|value| [("user", value.as_str())])
        .collect();
    let descriptors: Vec<&[(&str, &str)]> = descriptors.iter().map(|d| d.as_slice()).collect();
    let big = request("edge", &descriptors);
    let sent = request_proto(&big).encoded_len();
    assert!(sent > 2 * FIRST_BUFFER_BYTES, "a request of {sent} bytes");

    let response = client.grpc(&big).expect("decided over gRPC");
    let answered = response.encoded_len();
    assert!(
        answered > STACK_ANSWER_BYTES,
        "an answer of {answered} bytes"
    );
    let remaining: Vec<u32> = response
        .statuses
        .iter()
        .map(|s| s.limit_remaining)
        .collect();
    assert_eq!(remaining, vec![5; 40], "fast path: {fast_path}");

    let (status, answer) = client.json(&big);
    assert_eq!(status, 200, "{answer}");
    let remaining: Vec<u64> = answer["statuses"]
        .as_array()
        .expect("statuses")
        .iter()
        .map(|s| s["limitRemaining"].as_u64().expect("limitRemaining"))
        .collect();
    assert_eq!(
        remaining,
        vec![4; 40],
        "the same 40 counters, one hit further"
    );
}

#[test]
fn json_answers_429_with_retry_after_once_the_limit_is_reached() {
    let tollgate = InProcess::start(&per_user_per_minute(3));
    let client = Client::of_in_process(&tollgate);
    let dave = request("edge", &[&[("user", "dave")]]);

    for remaining in [Some(2), Some(1), None] {
        let (status, answer) = client.json(&dave);
        assert_eq!(status, 200, "{answer}");
        assert_eq!(answer["overallCode"], "OK", "{answer}");
        assert_eq!(
            answer["statuses"][0]["limitRemaining"].as_u64(),
            remaining,
            "{answer}"
        );
        assert!(answer.get("responseHeadersToAdd").is_none(), "{answer}");
    }

    for _ in 0..2 {
        let (status, answer) = client.json(&dave);
        assert_eq!(status, 429, "{answer}");
        assert_eq!(answer["overallCode"], "OVER_LIMIT", "{answer}");
        let over = &answer["statuses"][0];
        assert_eq!(over["code"], "OVER_LIMIT", "{answer}");
        assert!(over.get("limitRemaining").is_none(), "{answer}");
        // The earliest admission of a sliding window counter lies within two windows.
        let retry = seconds(&over["durationUntilReset"]);
        assert!((1..=120).contains(&retry), "{answer}");
        assert_eq!(
            answer["responseHeadersToAdd"],
            json!([{"key": "retry-after", "value": retry.to_string()}]),
            "{answer}"
        );
    }
}

#[test]
fn json_refuses_bad_input_with_400_and_a_message() {
    let tollgate = InProcess::start(&per_user_per_minute(5));
    let client = Client::of_in_process(&tollgate);
    let alice = r#"{"entries":[{"key":"user","value":"alice"}]}"#;
    let cases = [
        (r#"{"domain":"edge","#.to_owned(), "proto3 JSON"),
        (String::new(), "proto3 JSON"),
        ("user=alice".to_owned(), "proto3 JSON"),
        (
            format!(r#"{{"domain":"edge","descripters":[{alice}]}}"#),
            "descripters",
        ),
        (
            format!(r#"{{"domain":"edge","descriptors":[{alice}],"hitsAddend":"many"}}"#),
            "proto3 JSON",
        ),
        (
            r#"{"domain":"edge","descriptors":"user"}"#.to_owned(),
            "proto3 JSON",
        ),
        (
            format!(r#"{{"domain":"edge","descriptors":[{alice}]}} {{}}"#),
            "trailing",
        ),
        (
            format!(r#"{{"domain":"","descriptors":[{alice}]}}"#),
            "domain must not be empty",
        ),
        (
            format!(r#"{{"descriptors":[{alice}]}}"#),
            "domain must not be empty",
        ),
        (
            r#"{"domain":"edge","descriptors":[]}"#.to_owned(),
            "descriptor list must not be empty",
        ),
        (
            r#"{"domain":"edge","descriptors":[{"entries":[{"key":"","value":"alice"}]}]}"#
                .to_owned(),
            "empty key",
        ),
    ];
    for (body, expected) in &cases {
        let reply = client.post_json(body);
        assert_eq!(reply.status, 400, "{body:?}: {reply:?}");
        assert!(
            reply.body.contains(expected),
            "the 400 for {body:?} should mention {expected:?}: {reply:?}"
        );
    }

    // Refused input touched no counter.
    let (status, answer) = client.json(&request("edge", &[&[("user", "alice")]]));
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["statuses"][0]["limitRemaining"], 4, "{answer}");

    // A descriptor without entries is no error: it matches nothing, as in envoyproxy/ratelimit.
    let reply = client.post_json(r#"{"domain":"edge","descriptors":[{"entries":[]}]}"#);
    assert_eq!(reply.status, 200, "{reply:?}");
    let answer: Value = serde_json::from_str(&reply.body).expect("a JSON answer");
    assert_eq!(
        answer,
        json!({"overallCode": "OK", "statuses": [{"code": "OK"}]}),
        "{reply:?}"
    );

    // Only POST carries a request.
    assert_eq!(client.get("/json").status, 405);
}

// ---------------------------------------------------------------------------------------------
// GET /rlconfig and reloads

/// The `/rlconfig` table: one row of whitespace-separated columns per limit.
fn rlconfig(client: &Client) -> Vec<Vec<String>> {
    let reply = client.get("/rlconfig");
    assert_eq!(reply.status, 200, "{reply:?}");
    table(&reply.body)
}

fn table(text: &str) -> Vec<Vec<String>> {
    text.lines()
        .map(|line| line.split_whitespace().map(str::to_owned).collect())
        .collect()
}

fn rows(rows: &[&str]) -> Vec<Vec<String>> {
    table(&rows.join("\n"))
}

/// Writes `yaml` as `file` into the config directory `config` and waits until `/rlconfig` shows
/// the table `expected`, which it answers.
fn reload(
    client: &Client,
    config: &Path,
    (file, yaml): (&str, &str),
    expected: &[&str],
) -> Vec<Vec<String>> {
    std::fs::write(config.join(file), yaml).unwrap_or_else(|err| panic!("write {file}: {err}"));
    let expected = rows(expected);
    client.poll("/rlconfig", &format!("{file} to load"), |reply| {
        table(&reply.body) == expected
    });
    expected
}

#[test]
fn rlconfig_lists_the_loaded_limits_and_follows_reloads() {
    let tollgate = Tollgate::builder()
        .policy(
            "edge.yaml",
            "domain: edge
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 5, name: per-user}
  - key: path
    value: /login
    rate_limit: {algorithm: sliding_window_log, unit: minute, requests_per_unit: 100}
",
        )
        .args(["--reload-interval", "200ms"])
        .start();
    let client = Client::of(&tollgate);
    let config = tollgate.config_dir();

    assert_eq!(
        rlconfig(&client),
        rows(&[
            "edge.path_/login  sliding_window_log      100  minute  -",
            "edge.user         sliding_window_counter    5  minute  name=per-user",
        ])
    );

    // A new file in the config directory adds a domain.
    let api = "domain: api
descriptors:
  - key: tenant
    rate_limit: {window: 90s, requests_per_unit: 30, failure_mode: deny}
";
    let with_api = [
        "api.tenant        sliding_window_counter   30  1m30s   failure_mode=deny",
        "edge.path_/login  sliding_window_log      100  minute  -",
        "edge.user         sliding_window_counter    5  minute  name=per-user",
    ];
    reload(&client, config, ("api.yaml", api), &with_api);
    let (status, answer) = client.json(&request("api", &[&[("tenant", "t1")]]));
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["statuses"][0]["limitRemaining"], 29, "{answer}");

    // A changed file changes its limits.
    let edge = "domain: edge
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 7, name: per-user}
";
    let reloaded = [
        "api.tenant  sliding_window_counter  30  1m30s   failure_mode=deny",
        "edge.user   sliding_window_counter   7  minute  name=per-user",
    ];
    let reloaded = reload(&client, config, ("edge.yaml", edge), &reloaded);
    let (_, answer) = client.json(&request("edge", &[&[("user", "erin")]]));
    assert_eq!(
        answer["statuses"][0]["currentLimit"]["requestsPerUnit"], 7,
        "{answer}"
    );

    // A broken file is refused as a whole: the last good config keeps serving.
    let failures = |log: &str| log.matches("config reload failed").count();
    let failed_before = failures(&tollgate.log());
    std::fs::write(
        config.join("broken.yaml"),
        "domain: broken
descriptors:
  - key: user
    rate_limt: {unit: minute, requests_per_unit: 1}
",
    )
    .expect("write broken.yaml");
    wait::until("a failed reload in the log", POLL_LIMIT, || {
        failures(&tollgate.log()) > failed_before
    });
    assert!(tollgate.log().contains("rate_limt"), "{}", tollgate.log());
    assert_eq!(rlconfig(&client), reloaded);
    let (status, answer) = client.json(&request("edge", &[&[("user", "erin")]]));
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["statuses"][0]["limitRemaining"], 5, "{answer}");
    assert_eq!(client.get("/healthcheck").status, 200);

    // Once the broken file is gone, reloads take again.
    std::fs::remove_file(config.join("broken.yaml")).expect("remove broken.yaml");
    let api = "domain: api
descriptors:
  - key: tenant
    rate_limit: {unit: hour, requests_per_unit: 40}
";
    let recovered = [
        "api.tenant  sliding_window_counter  40  hour    -",
        "edge.user   sliding_window_counter   7  minute  name=per-user",
    ];
    reload(&client, config, ("api.yaml", api), &recovered);
}

// ---------------------------------------------------------------------------------------------
// GET /metrics

/// The value of the sample `name` (with its labels) in a Prometheus text exposition; 0 when the
/// sample is absent (a labelled counter appears with its first increment).
fn sample(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
        .map(|value| value.trim().parse().expect("a number"))
        .unwrap_or(0.0)
}

#[test]
fn metrics_count_requests_by_code() {
    let tollgate = InProcess::start(&per_user_per_minute(2));
    let mut client = Client::of_in_process(&tollgate);

    let before = client.get("/metrics");
    assert_eq!(before.status, 200, "{before:?}");
    let content_type = before.header("content-type").unwrap_or_default();
    assert!(content_type.contains("text"), "{content_type}");
    assert_eq!(
        sample(&before.body, "tollgate_request_duration_seconds_count"),
        0.0
    );

    let frank = request("edge", &[&[("user", "frank")], &[("unlisted", "x")]]);
    let empty_domain = request("", &[&[("user", "frank")]]);
    assert_eq!(client.json(&frank).0, 200);
    client.grpc(&frank).expect("OK");
    assert_eq!(client.json(&frank).0, 429);
    client.grpc(&frank).expect("OVER_LIMIT");
    client.grpc(&frank).expect("OVER_LIMIT");
    assert_eq!(client.post_json(&empty_domain.to_string()).status, 400);
    client.grpc(&empty_domain).expect_err("INVALID_ARGUMENT");

    let metrics = client.get("/metrics").body;
    let expected = [
        (r#"tollgate_requests_total{code="ok"}"#, 2.0),
        (r#"tollgate_requests_total{code="over_limit"}"#, 3.0),
        (r#"tollgate_requests_total{code="invalid"}"#, 2.0),
        (r#"tollgate_descriptors_total{code="ok"}"#, 2.0 + 5.0),
        (r#"tollgate_descriptors_total{code="over_limit"}"#, 3.0),
        ("tollgate_request_duration_seconds_count", 7.0),
        (
            r#"tollgate_request_duration_seconds_bucket{le="+Inf"}"#,
            7.0,
        ),
    ];
    for (name, value) in expected {
        assert_eq!(sample(&metrics, name), value, "{name} in\n{metrics}");
    }
    for family in [
        "# TYPE tollgate_requests counter\n",
        "# TYPE tollgate_descriptors counter\n",
        "# TYPE tollgate_request_duration_seconds histogram\n",
    ] {
        assert!(metrics.contains(family), "no {family:?} in\n{metrics}");
    }
    assert!(metrics.ends_with("# EOF\n"), "{metrics}");
}
