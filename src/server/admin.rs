//! The admin HTTP interface: health, metrics, the loaded policies, and a JSON door to the same
//! decision the gRPC service makes.

use std::sync::Arc;
use std::sync::LazyLock;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use prost::Message;
use prost_reflect::{DescriptorPool, DynamicMessage, MessageDescriptor};

use super::App;
use super::rls::OVERLOADED;
use crate::backend::Backend;
use crate::proto::{FILE_DESCRIPTOR_SET, RateLimitRequest, rate_limit_response::Code};

/// The admin routes over `app`.
pub fn router<B: Backend>(app: Arc<App<B>>) -> Router {
    Router::new()
        .route("/healthcheck", get(healthcheck::<B>))
        .route("/top", get(super::ui::top::<B>))
        .route("/ui", get(super::ui::page))
        .route("/ui/stats", get(super::ui::stats::<B>))
        .route("/metrics", get(metrics::<B>))
        .route("/rlconfig", get(rlconfig::<B>))
        .route("/json", post(json::<B>))
        .route("/counters", post(super::operator::counters::<B>))
        .route("/counters/reset", post(super::operator::reset::<B>))
        .with_state(app)
}

/// The debug listener's routes (the reference serves its debug endpoints on a port of their
/// own): an index, the loaded policies and the metrics.
pub fn debug_router<B: Backend>(app: Arc<App<B>>) -> Router {
    Router::new()
        .route("/", get(debug_index))
        .route("/rlconfig", get(rlconfig::<B>))
        .route("/metrics", get(metrics::<B>))
        .with_state(app)
}

async fn debug_index() -> &'static str {
    "/metrics: the service's metrics in the Prometheus text format\n\
     /rlconfig: print out the currently loaded configuration for debugging\n"
}

/// A router serving only the metrics, at `path` (the reference's `PROMETHEUS_PATH`).
pub fn metrics_router<B: Backend>(app: Arc<App<B>>, path: &str) -> Router {
    Router::new().route(path, get(metrics::<B>)).with_state(app)
}

async fn healthcheck<B: Backend>(State(app): State<Arc<App<B>>>) -> Response {
    match app.health.check() {
        Ok(()) => (StatusCode::OK, "OK\n").into_response(),
        Err(reason) => (StatusCode::SERVICE_UNAVAILABLE, format!("{reason}\n")).into_response(),
    }
}

async fn metrics<B: Backend>(State(app): State<Arc<App<B>>>) -> Response {
    app.metrics
        .observe_memory(app.limiter.backend().memory_usage());
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        app.metrics.render(),
    )
        .into_response()
}

async fn rlconfig<B: Backend>(State(app): State<Arc<App<B>>>) -> Response {
    let mut text = String::new();
    for line in app.origin.get() {
        text.push_str("# ");
        text.push_str(&line);
        text.push('\n');
    }
    text.push_str(&app.limiter.config().table());
    text.into_response()
}

/// The message descriptors for proto3 JSON, decoded once from the embedded descriptor set.
pub(super) struct JsonTypes {
    pub(super) request: MessageDescriptor,
    response: MessageDescriptor,
}

pub(super) static JSON_TYPES: LazyLock<Result<JsonTypes, String>> = LazyLock::new(|| {
    let pool = DescriptorPool::decode(FILE_DESCRIPTOR_SET).map_err(|e| e.to_string())?;
    let find = |name: &str| {
        pool.get_message_by_name(name)
            .ok_or_else(|| format!("message {name} missing from the descriptor set"))
    };
    Ok(JsonTypes {
        request: find("envoy.service.ratelimit.v3.RateLimitRequest")?,
        response: find("envoy.service.ratelimit.v3.RateLimitResponse")?,
    })
});

async fn json<B: Backend>(State(app): State<Arc<App<B>>>, body: Bytes) -> Response {
    answer_json(&app, &body).await
}

/// What `POST /json` answers for `body`: the proto3 JSON of the `RateLimitResponse` with 200 or
/// 429, or a message with 400 (unreadable or invalid), 503 (draining, no policies yet,
/// overloaded) or 500 (the response could not be encoded, which no input should cause). The
/// request path of the JSON door, callable without a socket (the fuzz target calls it).
pub async fn answer_json<B: Backend>(app: &App<B>, body: &[u8]) -> Response {
    let types = match JSON_TYPES.as_ref() {
        Ok(types) => types,
        Err(e) => return text(StatusCode::INTERNAL_SERVER_ERROR, e.clone()),
    };
    if app
        .health
        .check()
        .is_err_and(|reason| reason.starts_with("draining"))
    {
        return text(
            StatusCode::SERVICE_UNAVAILABLE,
            "draining: shutting down".into(),
        );
    }
    let request = match parse_request(&types.request, body) {
        Ok(request) => request,
        Err(message) => {
            app.metrics.observe_unreadable();
            return text(StatusCode::BAD_REQUEST, message);
        }
    };
    let response = match app.decide(request).await {
        Ok(response) => response,
        // Not ready yet (no policies) or overloaded: the caller may try again, elsewhere or later.
        Err(status) if matches!(status.code(), tonic::Code::Unavailable | OVERLOADED) => {
            return text(
                StatusCode::SERVICE_UNAVAILABLE,
                status.message().to_string(),
            );
        }
        Err(status) => return text(StatusCode::BAD_REQUEST, status.message().to_string()),
    };
    let code = if response.overall_code == Code::OverLimit as i32 {
        StatusCode::TOO_MANY_REQUESTS
    } else {
        StatusCode::OK
    };
    match DynamicMessage::decode(types.response.clone(), response.encode_to_vec().as_slice())
        .map_err(|e| e.to_string())
        .and_then(|message| serde_json::to_string(&message).map_err(|e| e.to_string()))
    {
        Ok(json) => (code, [(header::CONTENT_TYPE, "application/json")], json).into_response(),
        Err(e) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("could not encode the response as JSON: {e}"),
        ),
    }
}

/// Reads the proto3 JSON of a `RateLimitRequest`.
pub(super) fn parse_request(
    descriptor: &MessageDescriptor,
    body: &[u8],
) -> Result<RateLimitRequest, String> {
    let mut deserializer = serde_json::Deserializer::from_slice(body);
    let message = DynamicMessage::deserialize(descriptor.clone(), &mut deserializer)
        .map_err(|e| format!("body is not the proto3 JSON of a RateLimitRequest: {e}"))?;
    deserializer
        .end()
        .map_err(|e| format!("trailing data after the JSON request: {e}"))?;
    message
        .transcode_to::<RateLimitRequest>()
        .map_err(|e| format!("request could not be converted: {e}"))
}

fn text(code: StatusCode, message: String) -> Response {
    (code, format!("{message}\n")).into_response()
}
