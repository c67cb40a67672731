//! Span export over OTLP, through the real binary to a real receiver: the decision's server span
//! joins the caller's trace (W3C `traceparent`, B3 single and multi headers) with its domain,
//! descriptor count and overall code, and each backend call is a child span, on the memory
//! backend and on a real Redis; both exporter protocols; sampling as the reference samples;
//! nothing leaves a tollgate whose tracing is off; the last spans are flushed at SIGTERM.

use std::time::Duration;

use tollgate::proto::{RateLimitRequest, RateLimitResponse};
use tollgate_testkit::otlp::{OtlpReceiver, ReceivedSpan, Via};
use tollgate_testkit::redis::RedisServer;
use tollgate_testkit::rls;
use tollgate_testkit::tollgate::{Tollgate, TollgateBuilder};

const POLICY: &str = r#"
domain: traced
descriptors:
  - key: roomy
    rate_limit:
      unit: minute
      requests_per_unit: 1000
  - key: tight
    rate_limit:
      unit: minute
      requests_per_unit: 1
"#;

/// How long spans may take to arrive on a loaded machine (the batch exporter sends every 5 s).
const ARRIVAL: Duration = Duration::from_secs(30);

const SERVER_SPAN: &str = "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";
const SPAN_KIND_SERVER: i32 = 2;
const SPAN_KIND_CLIENT: i32 = 3;

#[derive(Clone, Copy)]
enum Protocol {
    Grpc,
    Http,
}

fn traced(receiver: &OtlpReceiver, protocol: Protocol) -> TollgateBuilder {
    let (name, endpoint) = match protocol {
        Protocol::Grpc => ("grpc", receiver.grpc_endpoint()),
        Protocol::Http => ("http", receiver.http_endpoint()),
    };
    Tollgate::builder()
        .policy("traced.yaml", POLICY)
        .env("TRACING_ENABLED", "true")
        .env("TRACING_EXPORTER_PROTOCOL", name)
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint)
        // Spans arrive sooner than the default 5 s batch delay, so a failing test ends sooner.
        .env("OTEL_BSP_SCHEDULE_DELAY", "200")
}

/// A new random trace id and span id in hex, as a caller's tracer makes them.
fn ids() -> (String, String) {
    (
        format!("{:032x}", fastrand::u128(1..)),
        format!("{:016x}", fastrand::u64(1..)),
    )
}

fn traceparent(trace: &str, span: &str, sampled: bool) -> String {
    format!("00-{trace}-{span}-{}", if sampled { "01" } else { "00" })
}

/// Calls ShouldRateLimit on `tollgate` with `metadata` and answers the response.
fn call(
    tollgate: &Tollgate,
    request: RateLimitRequest,
    metadata: &[(&'static str, String)],
) -> RateLimitResponse {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let mut client = rls::client(tollgate.grpc_addr())
            .await
            .expect("connect to tollgate");
        let mut request = tonic::Request::new(request);
        for (name, value) in metadata {
            request
                .metadata_mut()
                .insert(*name, value.parse().expect("ASCII metadata"));
        }
        client
            .should_rate_limit(request)
            .await
            .expect("ShouldRateLimit answers")
            .into_inner()
    })
}

fn server_span(spans: &[ReceivedSpan]) -> Option<&ReceivedSpan> {
    spans.iter().find(|s| s.name == SERVER_SPAN)
}

fn children<'a>(spans: &'a [ReceivedSpan], operation: &str) -> Vec<&'a ReceivedSpan> {
    let Some(server) = server_span(spans) else {
        return Vec::new();
    };
    spans
        .iter()
        .filter(|s| {
            s.parent_span_id == server.span_id && s.attribute("operation") == Some(operation)
        })
        .collect()
}

/// One admitted call with a sampled W3C parent: the server span is the caller's child with the
/// decision's attributes, and the acquire call its child.
fn w3c_parent_is_joined(protocol: Protocol, via: Via) {
    let receiver = OtlpReceiver::start();
    let tollgate = traced(&receiver, protocol)
        .env("TRACING_SERVICE_NAME", "edge-limits")
        .env("TRACING_SERVICE_NAMESPACE", "gateway")
        .env("TRACING_SERVICE_INSTANCE_ID", "pod-7")
        .start();
    let (trace, parent) = ids();
    let response = call(
        &tollgate,
        rls::request("traced", &[&[("roomy", "a")], &[("unknown", "x")]]),
        &[("traceparent", traceparent(&trace, &parent, true))],
    );
    assert_eq!(response.overall_code, 1, "OK");
    let spans = receiver.wait_for_trace("server span and acquire span", &trace, ARRIVAL, |s| {
        !children(s, "acquire").is_empty()
    });
    let server = server_span(&spans).expect("a server span");
    assert_eq!(server.via, via);
    assert_eq!(server.kind, SPAN_KIND_SERVER);
    assert_eq!(
        server.parent_span_id, parent,
        "the caller's span is the parent"
    );
    assert_eq!(server.attribute("domain"), Some("traced"));
    assert_eq!(server.attribute("descriptors"), Some("2"));
    assert_eq!(server.attribute("overall_code"), Some("OK"));
    assert_eq!(server.attribute("rpc.method"), Some("ShouldRateLimit"));
    assert_eq!(
        server.resource.get("service.name").map(String::as_str),
        Some("edge-limits")
    );
    assert_eq!(
        server.resource.get("service.namespace").map(String::as_str),
        Some("gateway")
    );
    assert_eq!(
        server
            .resource
            .get("service.instance.id")
            .map(String::as_str),
        Some("pod-7")
    );
    let acquire = children(&spans, "acquire");
    assert_eq!(acquire.len(), 1, "{spans:#?}");
    assert_eq!(acquire[0].kind, SPAN_KIND_CLIENT);
    assert_eq!(acquire[0].attribute("backend"), Some("memory"));
    assert_eq!(acquire[0].attribute("hits"), Some("1"));
    assert_eq!(acquire[0].attribute("outcome"), Some("ok"));
}

#[test]
fn w3c_parent_is_joined_over_grpc() {
    w3c_parent_is_joined(Protocol::Grpc, Via::Grpc);
}

#[test]
fn w3c_parent_is_joined_over_http() {
    w3c_parent_is_joined(Protocol::Http, Via::Http);
}

/// A request refused by one limit: the acquire span says over_limit, the hit the other limit
/// took is given back in a release span, and the server span says OVER_LIMIT; `backend` names
/// the store.
fn refused_request_spans(builder: TollgateBuilder, receiver: &OtlpReceiver, backend: &str) {
    let tollgate = builder.start();
    let both = || rls::request("traced", &[&[("roomy", "r")], &[("tight", "t")]]);
    let (first, parent) = ids();
    call(
        &tollgate,
        both(),
        &[("traceparent", traceparent(&first, &parent, true))],
    );
    let (trace, parent) = ids();
    let response = call(
        &tollgate,
        both(),
        &[("traceparent", traceparent(&trace, &parent, true))],
    );
    assert_eq!(response.overall_code, 2, "OVER_LIMIT");
    let spans = receiver.wait_for_trace("acquire and release spans", &trace, ARRIVAL, |s| {
        !children(s, "acquire").is_empty() && !children(s, "release").is_empty()
    });
    let server = server_span(&spans).expect("a server span");
    assert_eq!(server.parent_span_id, parent);
    assert_eq!(server.attribute("overall_code"), Some("OVER_LIMIT"));
    let acquire = children(&spans, "acquire");
    assert_eq!(acquire[0].attribute("backend"), Some(backend));
    assert_eq!(acquire[0].attribute("hits"), Some("2"));
    assert_eq!(acquire[0].attribute("outcome"), Some("over_limit"));
    let release = children(&spans, "release");
    assert_eq!(release[0].attribute("backend"), Some(backend));
    assert_eq!(release[0].attribute("hits"), Some("1"));
    assert_eq!(release[0].attribute("outcome"), Some("ok"));
}

#[test]
fn refused_request_spans_memory() {
    let receiver = OtlpReceiver::start();
    refused_request_spans(traced(&receiver, Protocol::Grpc), &receiver, "memory");
}

#[test]
fn refused_request_spans_redis() {
    let redis = RedisServer::shared();
    let receiver = OtlpReceiver::start();
    let builder = traced(&receiver, Protocol::Http).args([
        "--backend".to_owned(),
        "redis".to_owned(),
        "--redis-url".to_owned(),
        redis.url(),
    ]);
    refused_request_spans(builder, &receiver, "redis");
}

/// A B3 parent (`headers` made from a trace id and a span id) is joined like a W3C one.
fn b3_parent_is_joined(headers: impl Fn(&str, &str) -> Vec<(&'static str, String)>) {
    let receiver = OtlpReceiver::start();
    let tollgate = traced(&receiver, Protocol::Grpc).start();
    let (trace, parent) = ids();
    call(
        &tollgate,
        rls::request("traced", &[&[("roomy", "b3")]]),
        &headers(&trace, &parent),
    );
    let spans =
        receiver.wait_for_trace("server span", &trace, ARRIVAL, |s| server_span(s).is_some());
    assert_eq!(server_span(&spans).unwrap().parent_span_id, parent);
}

#[test]
fn b3_single_header_is_joined() {
    b3_parent_is_joined(|trace, span| vec![("b3", format!("{trace}-{span}-1"))]);
}

#[test]
fn b3_multi_headers_are_joined() {
    b3_parent_is_joined(|trace, span| {
        vec![
            ("x-b3-traceid", trace.to_owned()),
            ("x-b3-spanid", span.to_owned()),
            ("x-b3-sampled", "1".to_owned()),
        ]
    });
}

/// With TRACING_SAMPLING_RATE=0 a trace that starts here, or whose caller did not sample it, is
/// not exported; a caller's decision to sample is kept, as the reference keeps it. The sampled
/// call goes last, so once it arrives the earlier ones would have been sent before it.
#[test]
fn sampling_rate_zero_exports_only_what_the_caller_sampled() {
    let receiver = OtlpReceiver::start();
    let tollgate = traced(&receiver, Protocol::Grpc)
        .env("TRACING_SAMPLING_RATE", "0")
        .start();
    let request = || rls::request("traced", &[&[("roomy", "s")]]);
    call(&tollgate, request(), &[]);
    let (unsampled, parent) = ids();
    call(
        &tollgate,
        request(),
        &[("traceparent", traceparent(&unsampled, &parent, false))],
    );
    let (sampled, parent) = ids();
    call(
        &tollgate,
        request(),
        &[("traceparent", traceparent(&sampled, &parent, true))],
    );
    receiver.wait_for_trace("the sampled call's spans", &sampled, ARRIVAL, |s| {
        server_span(s).is_some() && !children(s, "acquire").is_empty()
    });
    let mut tollgate = tollgate;
    tollgate.terminate();
    assert!(tollgate.wait_exit(ARRIVAL).success());
    let others: Vec<ReceivedSpan> = receiver
        .spans()
        .into_iter()
        .filter(|s| s.trace_id != sampled)
        .collect();
    assert!(
        others.is_empty(),
        "unsampled traces were exported: {others:#?}"
    );
}

/// Tracing off (unset, or false) sends nothing, even with an endpoint configured and a sampled
/// caller; checked after a graceful exit, when anything queued would have been sent.
fn nothing_is_exported(enabled: Option<&str>) {
    let receiver = OtlpReceiver::start();
    let mut builder = Tollgate::builder()
        .policy("traced.yaml", POLICY)
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &receiver.http_endpoint());
    if let Some(enabled) = enabled {
        builder = builder.env("TRACING_ENABLED", enabled);
    }
    let mut tollgate = builder.start();
    let (trace, parent) = ids();
    let response = call(
        &tollgate,
        rls::request("traced", &[&[("roomy", "off")]]),
        &[("traceparent", traceparent(&trace, &parent, true))],
    );
    assert_eq!(response.overall_code, 1);
    tollgate.terminate();
    assert!(tollgate.wait_exit(ARRIVAL).success());
    assert_eq!(receiver.spans(), Vec::new());
    assert!(!tollgate.log().contains("span export over OTLP is on"));
}

#[test]
fn tracing_unset_exports_nothing() {
    nothing_is_exported(None);
}

#[test]
fn tracing_false_exports_nothing() {
    nothing_is_exported(Some("false"));
}

/// Spans still queued when SIGTERM arrives are sent before the process exits: with a batch delay
/// of ten minutes, nothing but the shutdown can have sent them.
#[test]
fn sigterm_flushes_queued_spans() {
    let receiver = OtlpReceiver::start();
    for protocol in [Protocol::Grpc, Protocol::Http] {
        let mut tollgate = traced(&receiver, protocol)
            .env("OTEL_BSP_SCHEDULE_DELAY", "600000")
            .start();
        let (trace, parent) = ids();
        call(
            &tollgate,
            rls::request("traced", &[&[("roomy", "flush")]]),
            &[("traceparent", traceparent(&trace, &parent, true))],
        );
        tollgate.terminate();
        assert!(tollgate.wait_exit(ARRIVAL).success(), "{}", tollgate.log());
        let spans = receiver.wait_for_trace("spans flushed at exit", &trace, Duration::ZERO, |s| {
            server_span(s).is_some() && !children(s, "acquire").is_empty()
        });
        assert_eq!(server_span(&spans).unwrap().parent_span_id, parent);
    }
}
