//! The hand-written gRPC path of `ShouldRateLimit`: the call sent past tonic's router
//! ([`route`]), read and answered straight from its HTTP/2 request ([`unary`]), its message
//! decoded straight into the limiter's [`Request`](crate::descriptor::Request) and its answer
//! written straight from the [`Decision`](crate::limiter::Decision) ([`wire`], with the field
//! writer of [`answer`]).
//!
//! Why it exists: on the memory backend, tonic's router, its streaming machinery and the
//! protobuf structs between the wire and the limiter cost about as much as the decision itself
//! (the benchmark's `instructions` scenario). Why it is fenced: it reproduces by hand what tonic
//! and its generated service do, so every tonic upgrade must be checked against the list below.
//! `--grpc-fast-path=false` serves every call through tonic's generated service instead
//! ([`super::rls::GeneratedRls`]); the compatibility suite's memory scenarios run on both
//! (`memory_grpc` and `memory_tonic`), and the tests of [`unary`] compare every answer with
//! tonic's `Grpc::unary` on the generated stubs' codec.
//!
//! # What it reproduces of tonic 0.14 (a checklist for upgrades)
//!
//! Each item is what tonic does for a unary call to a generated service, and what this path does
//! to answer alike; the module named does it.
//!
//! Routing and service ([`route`], this module):
//! - [ ] Only the path `/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit` skips the
//!   router; every other path (health, reflection, unknown services) goes through tonic's
//!   `Routes`, prepared once as tonic's server prepares them, and is answered by it exactly as
//!   before (an unknown service: `UNIMPLEMENTED` with no message, from the router's fallback).
//! - [ ] Another method of the RLS service (which reaches [`FastPath`] through the router) is
//!   `UNIMPLEMENTED` with no message and `content-type: application/grpc`, as the generated
//!   server's fallback arm answers it.
//! - [ ] The service is always ready (`poll_ready`), as a generated server is.
//! - [ ] tonic's own server layers wrap this service as they wrap the router, so they are not
//!   reproduced but inherited: the `grpc-timeout` deadline (the call's future dropped and the
//!   call answered `CANCELLED`, "Timeout expired"), the connection's HTTP/2 settings, connection
//!   ages, and the connect-info extension (which only [`super::bounds`] reads).
//! - [ ] Both paths read the request body through [`super::bounds::BoundedBody`]: a body past
//!   `--grpc-unfinished-bytes*` or `--grpc-body-timeout` fails with `RESOURCE_EXHAUSTED` or
//!   `DEADLINE_EXCEEDED`, answered as the call's status like any error of the body (below).
//!
//! Request ([`unary`]):
//! - [ ] `grpc-encoding` other than `identity`: `UNIMPLEMENTED`, "Content is compressed with
//!   `<name>` which isn't supported", with `grpc-accept-encoding: identity` (no compression is
//!   enabled on the generated server either); a name that is not UTF-8 is shown as its bytes.
//! - [ ] No other request header is checked (`content-type`, `te`, the method): tonic checks
//!   none.
//! - [ ] A message with the compressed flag: `INTERNAL`, "protocol error: received message with
//!   compressed-flag but no grpc-encoding was specified"; a flag other than 0 and 1:
//!   `INTERNAL`, "protocol error: received message with invalid compression flag: <f> (valid
//!   flags are 0 and 1), while sending request".
//! - [ ] A message longer than [`unary::MAX_MESSAGE_BYTES`] (tonic's default of 4 MiB, which the
//!   generated server keeps): `OUT_OF_RANGE`, "Error, decoded message length too large: found
//!   <n> bytes, the limit is: 4194304 bytes", as soon as its prefix has arrived.
//! - [ ] A body that ends inside a message: `INTERNAL`, "Unexpected EOF decoding stream.";
//!   except one that ends right after a whole 5-byte prefix, which tonic ignores (its reader has
//!   taken the prefix off its buffer by then). A body with no message: `INTERNAL`, "Missing
//!   request message.".
//! - [ ] Every message of the body is decoded (tonic drains the body for its trailers), a bad one
//!   anywhere fails the call, and the first is answered.
//! - [ ] Request trailers, or a `CANCELLED` error of the body (the client gave up sending), end
//!   the request: what came before still counts. Any other error of the body is the call's
//!   status (`Status::from_error`, as tonic's `Status::map_error`).
//! - [ ] A message split across any number of data frames is read whole.
//!
//! Message ([`wire`]):
//! - [ ] A malformed message: `INTERNAL` with prost's error text, field path included (what
//!   tonic-prost's decoder answers); the request is read as prost reads it (unknown fields
//!   skipped, the last of a repeated scalar wins, a nested message seen twice merged). One
//!   difference, unreachable from Envoy: a group nested 98 to 100 deep inside a descriptor is
//!   skipped where prost refuses it (prost keeps its recursion budget to itself).
//! - [ ] The answer's bytes are prost's encoding of the `RateLimitResponse` the generated service
//!   answers (`rls::response_to_proto` of the same decision).
//!
//! Answer ([`unary`]):
//! - [ ] A decision: status 200, `content-type: application/grpc` and no other header (tonic
//!   adds `grpc-encoding` only with compression enabled), one data frame (flag 0, the length,
//!   the message), then the trailers `grpc-status: 0` and nothing else.
//! - [ ] A refusal of the call (the request above, `INVALID_ARGUMENT`, `UNAVAILABLE` before the
//!   first policies, `RESOURCE_EXHAUSTED` past `--max-in-flight`): a trailers-only response by
//!   `Status::into_http` (`grpc-status`, the percent-encoded `grpc-message`, the status's
//!   metadata), as tonic answers a handler's error.
//! - [ ] An answer over 4 GiB, which a gRPC prefix cannot announce: `RESOURCE_EXHAUSTED`,
//!   "Cannot return body with more than 4GB of data but got <n> bytes". (tonic sends it as
//!   trailers after the headers, this path as a trailers-only response; a client sees the same
//!   status. A decision of a request under 4 MiB never comes near it.)
//!
//! Around the decision (this module; [`super::rls::GeneratedRls`] does the same):
//! - [ ] The only metadata looked at is the caller's trace context (`traceparent`, `b3`,
//!   `x-b3-*`), read from the request's headers. tonic would also merge request trailers into
//!   the metadata; a trace context sent in trailers, which no client sends, is seen only by the
//!   generated service.
//! - [ ] A client that resets the call drops its future at the next await, as with tonic: the
//!   decision in flight is dropped with its place among the decisions in flight.
//! - [ ] The call is timed from its decoded request to its decision and counted by
//!   `Metrics::observe_grpc`, refusals included, as the generated service's handler does.

pub mod answer;
pub mod route;
pub mod unary;
pub mod wire;

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use prost::{DecodeError, EncodeError};
use tonic::Status;
use tonic::codegen::{BoxFuture, Service, StdError, http};
use tonic::server::NamedService;

pub use route::Direct;

use super::App;
use super::rls::SHOULD_RATE_LIMIT;
use crate::backend::Backend;
use crate::proto;
use crate::telemetry::Headers;

/// The gRPC service `envoy.service.ratelimit.v3.RateLimitService` on the fast path, answering
/// `ShouldRateLimit`.
///
/// Written by hand rather than generated, so that the call decodes straight into the limiter's
/// request and writes its answer straight from the decision ([`wire`]), and is read and answered
/// as the one small message each way it is ([`unary`]), not through tonic's streaming
/// machinery. Any other method of the service is `UNIMPLEMENTED`, as in generated code.
#[derive(Debug)]
pub struct FastPath<B> {
    app: Arc<App<B>>,
}

impl<B> FastPath<B> {
    /// A service answering for `app`.
    pub fn new(app: Arc<App<B>>) -> Self {
        FastPath { app }
    }
}

impl<B> Clone for FastPath<B> {
    fn clone(&self) -> Self {
        FastPath {
            app: Arc::clone(&self.app),
        }
    }
}

impl<B> NamedService for FastPath<B> {
    const NAME: &'static str = proto::rate_limit_service_server::SERVICE_NAME;
}

impl<B, Body> Service<http::Request<Body>> for FastPath<B>
where
    B: Backend,
    Body: tonic::codegen::Body<Data = tonic::codegen::Bytes> + Send + 'static,
    Body::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Infallible>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        if request.uri().path() != SHOULD_RATE_LIMIT {
            return Box::pin(std::future::ready(
                Ok(Status::unimplemented("").into_http()),
            ));
        }
        let app = Arc::clone(&self.app);
        Box::pin(async move {
            let read = unary::read_request(request, |mut message| {
                wire::decode_request(&mut message).map_err(decode_failed)
            })
            .await;
            let (headers, request) = match read {
                Ok(read) => read,
                Err(status) => return Ok(status.into_http()),
            };
            let started = Instant::now();
            let (result, elapsed) = app
                .decide_since(request, &HttpHeaders(&headers), started)
                .await;
            // The reference's gRPC interceptor counts every call, refused ones included; `/json`
            // does not pass through it.
            app.metrics.observe_grpc(elapsed);
            Ok(match result {
                Ok(decision) => unary::answer(
                    |frame| wire::encode_decision(decision, frame),
                    encode_failed,
                ),
                Err(status) => status.into_http(),
            })
        })
    }
}

/// The status of a request message that could not be decoded: `INTERNAL` with prost's words,
/// as tonic-prost's decoder answers.
pub fn decode_failed(error: DecodeError) -> Status {
    Status::internal(error.to_string())
}

/// The status of an answer that could not be encoded (prost refuses only a buffer without
/// room, and the answer's buffer grows).
pub fn encode_failed(error: EncodeError) -> Status {
    Status::internal(format!("encoding the message: {error}"))
}

/// The headers of a gRPC call, as the span of its decision reads the caller's trace context.
struct HttpHeaders<'a>(&'a http::HeaderMap);

impl Headers for HttpHeaders<'_> {
    fn get(&self, name: &str) -> Option<&str> {
        self.0.get(name).and_then(|value| value.to_str().ok())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::future::poll_fn;
    use std::pin::{Pin, pin};

    use http_body::{Body as HttpBody, Frame};
    use prost::Message;
    use prost::bytes::Bytes;

    use super::*;
    use crate::backend::MemoryBackend;
    use crate::clock::ManualClock;
    use crate::config::Config;
    use crate::limiter::{Limiter, Settings};
    use crate::proto::rate_limit_descriptor::Entry;
    use crate::proto::{RateLimitDescriptor, RateLimitRequest};
    use crate::server::Health;
    use crate::server::health::Readiness;
    use crate::server::rls::GeneratedRls;

    /// A policy of one request a minute per user, so a second request is OVER_LIMIT.
    const POLICY: &str = "domain: edge
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 1}
";

    /// A call: its path, its message (sent behind a gRPC prefix) and its headers.
    type Call<'a> = (&'a str, Vec<u8>, &'a [(&'a str, &'a str)]);

    /// A request body sent as these frames.
    struct Frames(VecDeque<Bytes>);

    impl HttpBody for Frames {
        type Data = Bytes;
        type Error = Status;

        fn poll_frame(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
            Poll::Ready(
                self.get_mut()
                    .0
                    .pop_front()
                    .map(|data| Ok(Frame::data(data))),
            )
        }
    }

    /// A call to `path` whose body is `message` behind a gRPC prefix, with these headers.
    fn call(path: &str, message: &[u8], headers: &[(&str, &str)]) -> http::Request<Frames> {
        let mut body = vec![0];
        body.extend((message.len() as u32).to_be_bytes());
        body.extend(message);
        let mut request = http::Request::builder().method("POST").uri(path);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        request
            .body(Frames(VecDeque::from([Bytes::from(body)])))
            .expect("a request")
    }

    fn rls_request(domain: &str, user: &str) -> Vec<u8> {
        RateLimitRequest {
            domain: domain.into(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: "user".into(),
                    value: user.into(),
                }],
                ..RateLimitDescriptor::default()
            }],
            hits_addend: 0,
        }
        .encode_to_vec()
    }

    /// What a client sees of a response: its headers, data and trailers, sorted by name.
    async fn seen(response: http::Response<tonic::body::Body>) -> Vec<(String, Vec<u8>)> {
        let (parts, body) = response.into_parts();
        let mut seen: Vec<_> = parts
            .headers
            .iter()
            .map(|(name, value)| (format!("header {name}"), value.as_bytes().to_vec()))
            .collect();
        let mut body = pin!(body);
        while let Some(frame) = poll_fn(|cx| body.as_mut().poll_frame(cx)).await {
            match frame.expect("the answer's body does not fail").into_data() {
                Ok(data) => seen.push(("data".into(), data.to_vec())),
                Err(frame) => {
                    let trailers = frame.into_trailers().expect("data or trailers");
                    seen.extend(trailers.iter().map(|(name, value)| {
                        (format!("trailer {name}"), value.as_bytes().to_vec())
                    }));
                }
            }
        }
        seen.sort();
        seen
    }

    /// An app on the memory backend at a fixed instant, with at most `max_in_flight` decisions
    /// in flight, waiting for its first policies or not.
    async fn app(max_in_flight: Option<usize>, waiting: bool) -> Arc<App<MemoryBackend>> {
        let config = Config::from_yaml("edge.yaml", POLICY).expect("the policy loads");
        let backend = MemoryBackend::with_clock(Arc::new(ManualClock::new(1_700_006_400_000)));
        let limiter = Arc::new(Limiter::new(Arc::new(config), backend, Settings::default()));
        let (reporter, _) = tonic_health::server::health_reporter();
        let health = Health::new(reporter).await;
        let readiness = Readiness {
            wait_for_first_policies: waiting,
            require_domain: false,
        };
        health
            .set_policies(readiness, None, "waiting for the first push".into())
            .await;
        Arc::new(App::new(limiter, health, max_in_flight))
    }

    /// The same calls, in order, to the fast path and to tonic's generated service (each on an
    /// app of its own, made alike) are answered alike: headers, data and trailers.
    async fn answered_alike(max_in_flight: Option<usize>, waiting: bool, calls: &[Call<'_>]) {
        let mut fast = FastPath::new(app(max_in_flight, waiting).await);
        let mut generated = GeneratedRls::server(app(max_in_flight, waiting).await);
        for (path, message, headers) in calls {
            let by_fast = seen(fast.call(call(path, message, headers)).await.unwrap()).await;
            let by_generated =
                seen(generated.call(call(path, message, headers)).await.unwrap()).await;
            assert_eq!(
                by_fast, by_generated,
                "{path} {message:?} {headers:?}: the fast path, then tonic's generated service"
            );
        }
    }

    #[tokio::test]
    async fn the_fast_path_answers_as_tonics_generated_service() {
        let over = rls_request("edge", "alice");
        let calls: &[Call<'_>] = &[
            // OK, then OVER_LIMIT with retry-after, then a user with no count yet.
            (SHOULD_RATE_LIMIT, over.clone(), &[]),
            (SHOULD_RATE_LIMIT, over.clone(), &[]),
            (SHOULD_RATE_LIMIT, rls_request("edge", "bob"), &[]),
            // A domain no policy names, and an empty one (INVALID_ARGUMENT).
            (SHOULD_RATE_LIMIT, rls_request("other", "alice"), &[]),
            (SHOULD_RATE_LIMIT, rls_request("", "alice"), &[]),
            // A malformed message (INTERNAL, prost's words) and a compressed one.
            (SHOULD_RATE_LIMIT, vec![0xff], &[]),
            (
                SHOULD_RATE_LIMIT,
                over.clone(),
                &[("grpc-encoding", "gzip")],
            ),
            (
                SHOULD_RATE_LIMIT,
                over.clone(),
                &[("grpc-encoding", "identity")],
            ),
            // A trace context is read, and changes nothing in the answer.
            (
                SHOULD_RATE_LIMIT,
                over.clone(),
                &[(
                    "traceparent",
                    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                )],
            ),
            // Another method of the service.
            (
                "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimitTwice",
                over,
                &[],
            ),
        ];
        answered_alike(None, false, calls).await;
    }

    #[tokio::test]
    async fn refusals_before_the_decision_are_answered_alike() {
        let request = rls_request("edge", "alice");
        let calls: &[Call<'_>] = &[(SHOULD_RATE_LIMIT, request, &[])];
        // Past the bound on decisions in flight (RESOURCE_EXHAUSTED), and before the first
        // policies of a source that waits for them (UNAVAILABLE).
        answered_alike(Some(0), false, calls).await;
        answered_alike(None, true, calls).await;
    }

    #[tokio::test]
    async fn other_methods_of_the_service_are_unimplemented() {
        let mut service = FastPath::new(app(None, false).await);
        for path in [
            "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimitTwice",
            "/envoy.service.ratelimit.v3.RateLimitService/",
        ] {
            let request = http::Request::builder()
                .uri(path)
                .body(tonic::body::Body::empty())
                .unwrap();
            let response = service.call(request).await.unwrap();
            let code = response.headers().get("grpc-status").cloned();
            assert_eq!(code, Some(http::HeaderValue::from_static("12")), "{path}");
        }
    }
}
