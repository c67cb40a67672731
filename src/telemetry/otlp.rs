//! The OpenTelemetry SDK behind [`super`]: the tracer provider with its batch exporter, the
//! request span and the backend call spans.

use std::future::Future;
use std::sync::OnceLock;

use futures_util::FutureExt as _;
use futures_util::future::Either;
use opentelemetry::context::{FutureExt as _, WithContext};
use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::{
    Span as _, SpanKind, Status, TraceContextExt as _, Tracer as _, TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::{Protocol, SpanExporter, WithExportConfig as _};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{Sampler, SdkTracer, SdkTracerProvider};

use super::{CallOutcome, ExporterProtocol, Headers, TelemetryError, TracingSettings, b3};

/// The gRPC method a request span stands for, named as gRPC instrumentation names server spans.
const METHOD: &str = "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// Set once when export is on; its absence is the whole cost of tracing while it is off.
static STATE: OnceLock<State> = OnceLock::new();

struct State {
    tracer: SdkTracer,
    /// The `--backend` in force, the `backend` attribute of call spans.
    backend: &'static str,
}

/// Span export while it runs. [`Tracing::shutdown`] sends what is still queued; call it when the
/// service stops, or the last spans are lost.
#[derive(Debug)]
pub struct Tracing {
    provider: SdkTracerProvider,
}

impl Tracing {
    /// Exports the spans still queued and stops the exporter. Blocks until done (bounded by the
    /// exporter's timeout); call it off the async workers.
    pub fn shutdown(self) {
        if let Err(error) = self.provider.shutdown() {
            tracing::warn!("flushing spans at shutdown failed: {error}");
        }
    }
}

/// Sets up span export as `settings` say, when they enable it; `backend` names the backend in
/// call spans. Must run inside the async runtime (the gRPC exporter's connection lives there).
pub fn init(
    settings: &TracingSettings,
    backend: &'static str,
) -> Result<Option<Tracing>, TelemetryError> {
    if !settings.enabled {
        return Ok(None);
    }
    let exporter = match settings.exporter_protocol {
        ExporterProtocol::Grpc => {
            let builder = SpanExporter::builder().with_tonic();
            // Without an endpoint the exporter reads the standard OTLP variables itself
            // (OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, ...) and defaults to localhost:4317.
            match &settings.otlp_endpoint {
                Some(endpoint) => builder.with_endpoint(endpoint).build(),
                None => builder.build(),
            }
        }
        ExporterProtocol::Http => {
            let builder = SpanExporter::builder()
                .with_http()
                .with_protocol(Protocol::HttpBinary);
            // The generic endpoint is a base to which the signal's path is added, as the OTLP
            // exporter specification says; without one the exporter reads the standard
            // variables itself and defaults to localhost:4318.
            match &settings.otlp_endpoint {
                Some(endpoint) => builder.with_endpoint(traces_url(endpoint)).build(),
                None => builder.build(),
            }
        }
    }
    .map_err(|e| TelemetryError::Exporter(e.to_string()))?;

    let instance_id = settings
        .service_instance_id
        .clone()
        .unwrap_or_else(random_instance_id);
    let mut attributes = vec![KeyValue::new("service.instance.id", instance_id.clone())];
    if let Some(namespace) = &settings.service_namespace {
        attributes.push(KeyValue::new("service.namespace", namespace.clone()));
    }
    let resource = Resource::builder()
        .with_service_name(settings.service_name.clone())
        .with_attributes(attributes)
        .build();
    // As the reference: a caller's sampling decision is kept; a trace that starts here is
    // sampled at the configured rate (1 or more: every one, 0 or less: none).
    let sampler =
        Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(settings.sampling_rate)));
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_sampler(sampler)
        .with_resource(resource)
        .build();
    let tracer = provider.tracer("tollgate");
    STATE
        .set(State { tracer, backend })
        .map_err(|_| TelemetryError::AlreadySet)?;
    tracing::info!(
        protocol = match settings.exporter_protocol {
            ExporterProtocol::Grpc => "grpc",
            ExporterProtocol::Http => "http",
        },
        service_name = %settings.service_name,
        service_instance_id = %instance_id,
        sampling_rate = settings.sampling_rate,
        "span export over OTLP is on"
    );
    Ok(Some(Tracing { provider }))
}

/// `base` + `/v1/traces`, the path of the trace signal under a generic OTLP/HTTP endpoint.
fn traces_url(base: &str) -> String {
    format!("{}/v1/traces", base.trim_end_matches('/'))
}

/// A random UUID (version 4 layout), as the reference names an instance it was given no id for.
fn random_instance_id() -> String {
    let bits = fastrand::u128(..);
    let bits = (bits & !(0xf << 76) | (0x4 << 76)) & !(0x3 << 62) | (0x2 << 62);
    let hex = format!("{bits:032x}");
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// The span of one decision: `None` while tracing is off.
#[derive(Debug)]
pub struct RequestSpan(Option<Context>);

/// Starts the span of one `ShouldRateLimit` on `domain` with `descriptors` descriptors, child of
/// the trace the caller's `headers` carry (W3C `traceparent`; B3 single or multi headers, which
/// win when both are present, as in the reference). Does nothing while tracing is off.
pub fn request_span(headers: &dyn Headers, domain: &str, descriptors: usize) -> RequestSpan {
    let Some(state) = STATE.get() else {
        return RequestSpan(None);
    };
    let carrier = Carrier(headers);
    let mut parent = TraceContextPropagator::new().extract(&carrier);
    if let Some(remote) = b3::extract(headers) {
        parent = Context::new().with_remote_span_context(remote);
    }
    let span = state
        .tracer
        .span_builder(METHOD)
        .with_kind(SpanKind::Server)
        .with_attributes([
            KeyValue::new("rpc.system", "grpc"),
            KeyValue::new("rpc.service", "envoy.service.ratelimit.v3.RateLimitService"),
            KeyValue::new("rpc.method", "ShouldRateLimit"),
            KeyValue::new("domain", domain.to_owned()),
            KeyValue::new("descriptors", descriptors as i64),
        ])
        .start_with_context(&state.tracer, &parent);
    RequestSpan(Some(parent.with_span(span)))
}

impl RequestSpan {
    /// Runs the future `work` makes inside this span, so backend calls become its children.
    /// Made here rather than handed in, so that the future is built where it is returned.
    pub fn run<F: Future>(&self, work: impl FnOnce() -> F) -> Either<WithContext<F>, F> {
        match &self.0 {
            Some(cx) => Either::Left(work().with_context(cx.clone())),
            None => Either::Right(work()),
        }
    }

    /// Ends the span with the overall code (`OK`, `OVER_LIMIT`) or the error the call answered.
    pub fn finish(self, result: Result<&'static str, &str>) {
        let Some(cx) = self.0 else {
            return;
        };
        let span = cx.span();
        match result {
            Ok(code) => span.set_attribute(KeyValue::new("overall_code", code)),
            Err(message) => span.set_status(Status::error(message.to_owned())),
        }
        span.end();
    }
}

/// Runs the backend call `call` makes, of `operation` on `hits` hits, as a child span of the
/// current request span, recording the backend and the call's outcome; runs it as is while
/// tracing is off or outside a request span. Whether to trace is decided when the call is made,
/// in the context of the request that makes it.
pub fn backend_call<T, F: Future<Output = T>>(
    operation: &'static str,
    hits: usize,
    call: impl FnOnce() -> F,
    outcome: impl FnOnce(&T) -> CallOutcome,
) -> impl Future<Output = T> {
    let span = STATE.get().and_then(|state| {
        let parent = Context::current();
        parent.has_active_span().then(|| {
            // Boxed: the span is large, and only traced calls carry it.
            Box::new(
                state
                    .tracer
                    .span_builder(format!("backend {operation}"))
                    .with_kind(SpanKind::Client)
                    .with_attributes([
                        KeyValue::new("backend", state.backend),
                        KeyValue::new("operation", operation),
                        KeyValue::new("hits", hits as i64),
                    ])
                    .start_with_context(&state.tracer, &parent),
            )
        })
    });
    // Not an `async fn`: one awaiting the future it is handed holds it twice in its state (as
    // the argument and as the future awaited), and every decision's future would carry the
    // backend's call twice over. The call is made here, not handed in made, so that its future
    // (hundreds of bytes on the memory backend) is built where it is returned, not copied there.
    match span {
        None => Either::Left(call()),
        Some(mut span) => Either::Right(call().inspect(move |result| {
            let outcome = outcome(result);
            span.set_attribute(KeyValue::new("outcome", outcome.as_str()));
            if outcome == CallOutcome::Error {
                span.set_status(Status::error("backend call failed"));
            }
            span.end();
        })),
    }
}

/// The incoming headers as the W3C propagator reads them.
struct Carrier<'a>(&'a dyn Headers);

impl Extractor for Carrier<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key)
    }

    fn keys(&self) -> Vec<&str> {
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traces_url_adds_the_signal_path_once() {
        assert_eq!(traces_url("http://c:4318"), "http://c:4318/v1/traces");
        assert_eq!(traces_url("http://c:4318/"), "http://c:4318/v1/traces");
    }

    #[test]
    fn instance_ids_are_version_4_uuids() {
        let id = random_instance_id();
        assert_eq!(id.len(), 36);
        assert_eq!(&id[14..15], "4");
        assert!(matches!(&id[19..20], "8" | "9" | "a" | "b"), "{id}");
        assert_ne!(id, random_instance_id());
    }
}
