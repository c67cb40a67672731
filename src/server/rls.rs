//! The Envoy RLS v3 gRPC service's shared part, and tonic's generated service as the fallback.
//!
//! A `ShouldRateLimit` call reaches `App::decide_since` (timing, span, metrics, the bound on
//! decisions in flight, [`Limiter::should_rate_limit`]) by one of two paths chosen at start-up:
//! the hand-written fast path ([`super::fast_path`], the default), which decodes the call
//! straight into a [`Request`] and writes the answer straight from the [`Decision`], or, with
//! `--grpc-fast-path=false`, tonic's generated service ([`GeneratedRls`]), through the protobuf
//! structs ([`request_from_proto`], [`response_to_proto`]). Both answer alike. The admin
//! `POST /json` endpoint calls [`App::decide`], the same path between the protobuf structs;
//! [`decide`] is that conversion without the metrics.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use prost_types::value::Kind;
use tonic::Status as GrpcStatus;
use tonic::metadata::MetadataMap;

use super::fast_path::answer::{LimitFields, StatusFields};
use super::{Health, Metrics};
use crate::backend::Backend;
use crate::config::MetaValue;
use crate::descriptor::{Descriptor, Entry, LimitOverride, Request, Unit};
use crate::limiter::{Code, Decision, Limiter, LimiterError, Status};
use crate::proto::rate_limit_service_server::{RateLimitService, RateLimitServiceServer};
use crate::proto::{
    HeaderValue, RateLimitDescriptor, RateLimitRequest, RateLimitResponse, RateLimitUnit,
    rate_limit_response::{self, DescriptorStatus, RateLimit, rate_limit::Unit as ProtoUnit},
};
use crate::telemetry::{self, Headers, NoHeaders};

/// Everything a request handler needs, shared by the gRPC and HTTP interfaces.
#[derive(Debug)]
pub struct App<B> {
    /// Decides requests.
    pub limiter: Arc<Limiter<B>>,
    /// Serving state.
    pub health: Arc<Health>,
    /// Request metrics.
    pub metrics: Metrics,
    /// Where the policies in force came from, said above the table of `/rlconfig`.
    pub origin: Origin,
    /// Whether `POST /counters/reset` may clear windows (`--admin-allow-reset`); off by default.
    pub allow_reset: bool,
    /// Decisions in flight, against their bound.
    in_flight: InFlight,
}

/// How many decisions are in flight, and the most there may be. A call past the bound is
/// answered at once rather than queued, so a count is all it takes: a semaphore would also take
/// a lock on every release to wake waiters there never are.
#[derive(Debug)]
struct InFlight {
    count: AtomicUsize,
    /// `usize::MAX` when unbounded.
    bound: usize,
}

impl InFlight {
    /// Counts one more decision in flight until the guard drops, or `None` at the bound.
    fn enter(&self) -> Option<InFlightGuard<'_>> {
        if self.bound == usize::MAX {
            return Some(InFlightGuard(None));
        }
        // Never counted past the bound, so a refused call cannot make another one look refused.
        self.count
            .fetch_update(Ordering::Acquire, Ordering::Relaxed, |count| {
                (count < self.bound).then_some(count + 1)
            })
            .ok()
            .map(|_| InFlightGuard(Some(&self.count)))
    }
}

/// One decision in flight; leaving drops it from the count.
struct InFlightGuard<'a>(Option<&'a AtomicUsize>);

impl Drop for InFlightGuard<'_> {
    fn drop(&mut self) {
        if let Some(count) = self.0 {
            count.fetch_sub(1, Ordering::Release);
        }
    }
}

/// Lines `/rlconfig` prints (as `# ` comments) above the policy table: where the policies in
/// force came from, for sources that have more to say than a path (xDS: server, node, version).
#[derive(Debug, Default)]
pub struct Origin(std::sync::Mutex<Vec<String>>);

impl Origin {
    /// Replaces the lines.
    pub fn set(&self, lines: Vec<String>) {
        *self.lock() = lines;
    }

    /// The lines.
    pub fn get(&self) -> Vec<String> {
        self.lock().clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<String>> {
        // A poisoned lock only means a panic elsewhere; the lines themselves are always whole.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// What an overloaded tollgate answers at once instead of queueing a call: `RESOURCE_EXHAUSTED`,
/// which Envoy's rate limit filter treats as any failed call, by its `failure_mode_deny`.
pub const OVERLOADED: tonic::Code = tonic::Code::ResourceExhausted;

/// The full path of the one method of the RLS service.
pub const SHOULD_RATE_LIMIT: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// `ShouldRateLimit` through tonic's generated service: the fallback of the hand-written path
/// (`--grpc-fast-path=false`), for a tonic upgrade that changed what the fast path reproduces,
/// or a fault suspected in it. The call is decoded into a `RateLimitRequest` by tonic-prost,
/// converted into the limiter's request, decided by the same `App::decide_since` (span, metrics,
/// bound on decisions in flight) and converted back, so it answers as the fast path does.
#[derive(Debug)]
pub struct GeneratedRls<B> {
    app: Arc<App<B>>,
}

impl<B: Backend> GeneratedRls<B> {
    /// The generated server of the RLS service, answering for `app`.
    pub fn server(app: Arc<App<B>>) -> RateLimitServiceServer<GeneratedRls<B>> {
        RateLimitServiceServer::new(GeneratedRls { app })
    }
}

#[tonic::async_trait]
impl<B: Backend> RateLimitService for GeneratedRls<B> {
    async fn should_rate_limit(
        &self,
        request: tonic::Request<RateLimitRequest>,
    ) -> Result<tonic::Response<RateLimitResponse>, GrpcStatus> {
        let started = Instant::now();
        let (metadata, _, request) = request.into_parts();
        let request = request_from_proto(request);
        let (result, elapsed) = self
            .app
            .decide_since(request, &GrpcHeaders(&metadata), started)
            .await;
        // The reference's gRPC interceptor counts every call, refused ones included; `/json`
        // does not pass through it.
        self.app.metrics.observe_grpc(elapsed);
        result.map(|decision| tonic::Response::new(response_to_proto(decision)))
    }
}

/// The metadata of a call on the generated service, as the span of its decision reads the
/// caller's trace context.
struct GrpcHeaders<'a>(&'a MetadataMap);

impl Headers for GrpcHeaders<'_> {
    fn get(&self, name: &str) -> Option<&str> {
        self.0.get(name).and_then(|value| value.to_str().ok())
    }
}

impl<B: Backend> App<B> {
    /// The handlers' shared state, with at most `max_in_flight` decisions in flight (`None`:
    /// unbounded).
    pub fn new(
        limiter: Arc<Limiter<B>>,
        health: Arc<Health>,
        max_in_flight: Option<usize>,
    ) -> Self {
        App {
            limiter,
            health,
            metrics: Metrics::new(),
            origin: Origin::default(),
            allow_reset: false,
            in_flight: InFlight {
                count: AtomicUsize::new(0),
                bound: max_in_flight.unwrap_or(usize::MAX),
            },
        }
    }

    /// Decides one protobuf request and records it in the metrics, as the gRPC service does:
    /// the request path of `POST /json`. Past the bound on decisions in flight it answers at
    /// once with [`OVERLOADED`], touching no counter: a call that waited would only come back
    /// after its caller gave up.
    pub async fn decide(&self, request: RateLimitRequest) -> Result<RateLimitResponse, GrpcStatus> {
        self.decide_traced(request, &NoHeaders).await
    }

    /// [`App::decide`] for a call whose `headers` may carry the caller's trace context: the
    /// decision's span (while tracing is on) joins that trace.
    pub async fn decide_traced(
        &self,
        request: RateLimitRequest,
        headers: &dyn Headers,
    ) -> Result<RateLimitResponse, GrpcStatus> {
        let request = request_from_proto(request);
        let (result, _) = self.decide_since(request, headers, Instant::now()).await;
        result.map(response_to_proto)
    }

    /// Decides `request`, a call that began at `started`, and answers how long it took since:
    /// the one clock read at each end serves every timing the call records. Both gRPC paths
    /// call it.
    pub(super) async fn decide_since(
        &self,
        request: Request,
        headers: &dyn Headers,
        started: Instant,
    ) -> (Result<Decision, GrpcStatus>, Duration) {
        let span = telemetry::request_span(headers, &request.domain, request.descriptors.len());
        let (result, elapsed) = span.run(|| self.decide_untraced(request, started)).await;
        span.finish(match &result {
            Ok(decision) => Ok(code_name(decision.overall)),
            Err(status) => Err(status.message()),
        });
        (result, elapsed)
    }

    async fn decide_untraced(
        &self,
        request: Request,
        started: Instant,
    ) -> (Result<Decision, GrpcStatus>, Duration) {
        // Before the first policies of a source that waits for them, there is nothing to decide
        // by: answer as a service that is not up yet would, and let Envoy's failure mode rule.
        if let Some(reason) = self.health.waiting_for_policies() {
            return (Err(GrpcStatus::unavailable(reason)), started.elapsed());
        }
        let Some(_in_flight) = self.in_flight.enter() else {
            self.metrics.observe_overloaded();
            let status = GrpcStatus::new(
                OVERLOADED,
                format!(
                    "tollgate is overloaded: {} decisions already in flight",
                    self.in_flight.bound
                ),
            );
            return (Err(status), started.elapsed());
        };
        let result = match self.limiter.should_rate_limit(&request).await {
            Ok(decision) => {
                self.metrics.observe_decision(&request.domain, &decision);
                self.metrics.observe_outcomes(&request, &decision);
                Ok(decision)
            }
            Err(LimiterError::InvalidArgument(message)) => {
                self.metrics.observe_service_error();
                Err(GrpcStatus::invalid_argument(message))
            }
        };
        let elapsed = started.elapsed();
        self.metrics
            .observe(result.as_ref().map_err(|_| ()), elapsed);
        (result, elapsed)
    }
}

/// The name of an overall code as the protocol spells it, for the decision's span.
fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::OverLimit => "OVER_LIMIT",
    }
}

/// Decides one protobuf request; a bad request becomes `INVALID_ARGUMENT` with the reason.
/// Records no metrics (that is [`App::decide`]'s part, which answers alike), so embedders and
/// tests can call it alone.
pub async fn decide<B: Backend>(
    limiter: &Limiter<B>,
    request: RateLimitRequest,
) -> Result<RateLimitResponse, GrpcStatus> {
    let request = request_from_proto(request);
    match limiter.should_rate_limit(&request).await {
        Ok(decision) => Ok(response_to_proto(decision)),
        Err(LimiterError::InvalidArgument(message)) => Err(GrpcStatus::invalid_argument(message)),
    }
}

/// Converts the protobuf request (short text is copied inline, longer text kept behind one
/// allocation: [`Text`](crate::descriptor::Text)).
pub fn request_from_proto(request: RateLimitRequest) -> Request {
    // Into a new vector, not `collect`: collecting reuses the decoded vector in place, and since
    // a descriptor is smaller than its message, the allocator is then asked to shrink it, which
    // costs more than a fresh allocation.
    let mut descriptors = Vec::with_capacity(request.descriptors.len());
    descriptors.extend(request.descriptors.into_iter().map(descriptor_from_proto));
    Request {
        domain: request.domain.into(),
        descriptors,
        hits_addend: request.hits_addend,
    }
}

fn descriptor_from_proto(descriptor: RateLimitDescriptor) -> Descriptor {
    Descriptor {
        entries: descriptor
            .entries
            .into_iter()
            .map(|e| Entry {
                key: e.key.into(),
                value: e.value.into(),
            })
            .collect(),
        limit: descriptor.limit.map(|l| LimitOverride {
            requests_per_unit: l.requests_per_unit,
            unit: unit_from_proto(l.unit),
        }),
        hits_addend: descriptor.hits_addend,
    }
}

/// The unit of a request's limit override; `None` for UNKNOWN and numbers the protocol does
/// not name.
pub(crate) fn unit_from_proto(unit: i32) -> Option<Unit> {
    match RateLimitUnit::try_from(unit).ok()? {
        RateLimitUnit::Unknown => None,
        RateLimitUnit::Second => Some(Unit::Second),
        RateLimitUnit::Minute => Some(Unit::Minute),
        RateLimitUnit::Hour => Some(Unit::Hour),
        RateLimitUnit::Day => Some(Unit::Day),
        RateLimitUnit::Month => Some(Unit::Month),
        RateLimitUnit::Year => Some(Unit::Year),
    }
}

fn unit_to_proto(unit: Option<Unit>) -> ProtoUnit {
    match unit {
        None => ProtoUnit::Unknown,
        Some(Unit::Second) => ProtoUnit::Second,
        Some(Unit::Minute) => ProtoUnit::Minute,
        Some(Unit::Hour) => ProtoUnit::Hour,
        Some(Unit::Day) => ProtoUnit::Day,
        Some(Unit::Week) => ProtoUnit::Week,
        Some(Unit::Month) => ProtoUnit::Month,
        Some(Unit::Year) => ProtoUnit::Year,
    }
}

/// The protocol's code of a decision's.
pub(crate) fn code_to_proto(code: Code) -> rate_limit_response::Code {
    match code {
        Code::Ok => rate_limit_response::Code::Ok,
        Code::OverLimit => rate_limit_response::Code::OverLimit,
    }
}

/// Converts a decision into the protobuf response.
pub fn response_to_proto(decision: Decision) -> RateLimitResponse {
    RateLimitResponse {
        overall_code: code_to_proto(decision.overall) as i32,
        statuses: decision.statuses.into_iter().map(status_to_proto).collect(),
        response_headers_to_add: decision
            .response_headers
            .into_iter()
            .map(|(key, value)| HeaderValue {
                key,
                value,
                raw_value: Vec::new(),
            })
            .collect(),
        dynamic_metadata: decision
            .dynamic_metadata
            .and_then(|m| match meta_to_proto(m).kind {
                Some(Kind::StructValue(s)) => Some(s),
                _ => None,
            }),
        ..RateLimitResponse::default()
    }
}

fn status_to_proto(status: Status) -> DescriptorStatus {
    let StatusFields {
        code,
        limit,
        remaining,
        reset,
    } = status_fields(&status);
    DescriptorStatus {
        code,
        current_limit: limit.map(|limit| RateLimit {
            name: limit.name.to_owned(),
            requests_per_unit: limit.requests_per_unit,
            unit: limit.unit,
        }),
        limit_remaining: remaining,
        duration_until_reset: reset
            .map(|(seconds, nanos)| prost_types::Duration { seconds, nanos }),
        quota: None,
    }
}

/// A status as the answer's fields: the one mapping of a status to the protocol, both for the
/// answer written from the decision and for the response struct built from it.
pub(crate) fn status_fields(status: &Status) -> StatusFields<'_> {
    let Status {
        code,
        limit,
        remaining,
        reset,
    } = status;
    StatusFields {
        code: code_to_proto(*code) as i32,
        limit: limit.as_deref().map(|limit| LimitFields {
            name: limit.name.as_deref().unwrap_or_default(),
            requests_per_unit: limit.requests_per_unit,
            unit: unit_to_proto(limit.unit) as i32,
        }),
        remaining: *remaining,
        reset: reset.map(|reset| (i64::try_from(reset.as_secs()).unwrap_or(i64::MAX), 0)),
    }
}

fn meta_to_proto(value: MetaValue) -> prost_types::Value {
    let kind = match value {
        MetaValue::Null => Kind::NullValue(0),
        MetaValue::Bool(b) => Kind::BoolValue(b),
        MetaValue::Number(n) => Kind::NumberValue(n),
        MetaValue::String(s) => Kind::StringValue(s),
        MetaValue::List(items) => Kind::ListValue(prost_types::ListValue {
            values: items.into_iter().map(meta_to_proto).collect(),
        }),
        MetaValue::Map(fields) => Kind::StructValue(prost_types::Struct {
            fields: fields
                .into_iter()
                .map(|(k, v)| (k, meta_to_proto(v)))
                .collect(),
        }),
    };
    prost_types::Value { kind: Some(kind) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::rate_limit_descriptor::{Entry as ProtoEntry, RateLimitOverride};

    #[test]
    fn request_conversion_keeps_every_field() {
        let proto = RateLimitRequest {
            domain: "edge".into(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![ProtoEntry {
                    key: "user".into(),
                    value: "alice".into(),
                }],
                limit: Some(RateLimitOverride {
                    requests_per_unit: 7,
                    unit: RateLimitUnit::Hour as i32,
                }),
                hits_addend: Some(0),
            }],
            hits_addend: 3,
        };
        let request = request_from_proto(proto);
        assert_eq!(request.domain, "edge");
        assert_eq!(request.hits_addend, 3);
        let d = &request.descriptors[0];
        assert_eq!(d.entries, vec![Entry::new("user", "alice")]);
        assert_eq!(
            d.limit,
            Some(LimitOverride {
                requests_per_unit: 7,
                unit: Some(Unit::Hour)
            })
        );
        assert_eq!(d.hits_addend, Some(0));
    }

    #[test]
    fn unknown_or_out_of_range_override_units_are_none() {
        assert_eq!(unit_from_proto(0), None);
        assert_eq!(unit_from_proto(99), None);
        assert_eq!(unit_from_proto(-1), None);
    }

    #[test]
    fn week_maps_to_its_own_wire_number() {
        assert_eq!(unit_to_proto(Some(Unit::Week)) as i32, 7);
        assert_eq!(unit_to_proto(Some(Unit::Month)) as i32, 5);
        assert_eq!(unit_to_proto(None) as i32, 0);
    }
}
