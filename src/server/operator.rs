//! The operator's questions about one client, on the admin port: `POST /counters` answers the
//! usage of every limit a request's descriptors resolve to, consuming nothing; `POST
//! /counters/reset` clears those windows, only when `--admin-allow-reset` allows it. Both take
//! the proto3 JSON of a `RateLimitRequest`, as `POST /json` does. The limiter does the work
//! ([`Limiter::inspect`](crate::limiter::Limiter::inspect),
//! [`Limiter::reset`](crate::limiter::Limiter::reset)); this module only converts at the edge.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use super::App;
use super::admin::{JSON_TYPES, parse_request};
use super::rls::request_from_proto;
use crate::backend::Backend;
use crate::descriptor::Request;
use crate::limiter::{DescriptorUsage, InspectError};

/// What `POST /counters/reset` answers while reset is off.
pub const RESET_OFF: &str = "reset is off: start tollgate with --admin-allow-reset \
     (TOLLGATE_ADMIN_ALLOW_RESET=true) to allow POST /counters/reset";

/// `POST /counters`: the usage of each descriptor's limits, consuming nothing.
pub async fn counters<B: Backend>(State(app): State<Arc<App<B>>>, body: Bytes) -> Response {
    let request = match read(&body) {
        Ok(request) => request,
        Err(response) => return *response,
    };
    match app.limiter.inspect(&request).await {
        Ok(usages) => answer(&usages_json(&usages, false)),
        Err(err) => failure(&err),
    }
}

/// `POST /counters/reset`: clears each descriptor's windows and answers what they held, or 403
/// unless `--admin-allow-reset` is on.
pub async fn reset<B: Backend>(State(app): State<Arc<App<B>>>, body: Bytes) -> Response {
    if !app.allow_reset {
        return (StatusCode::FORBIDDEN, format!("{RESET_OFF}\n")).into_response();
    }
    let request = match read(&body) {
        Ok(request) => request,
        Err(response) => return *response,
    };
    match app.limiter.reset(&request).await {
        Ok(usages) => {
            log_reset(&request, &usages, "POST /counters/reset");
            answer(&usages_json(&usages, true))
        }
        Err(err) => failure(&err),
    }
}

/// Logs a reset with what it cleared: the domain, and each limit's descriptor, name and the
/// units it held. `by` says who asked.
pub fn log_reset(request: &Request, usages: &[DescriptorUsage], by: &str) {
    let mut cleared = Vec::new();
    for usage in usages {
        let entries = entries_text(usage);
        for limit in &usage.limits {
            let name = limit.limit.name.as_deref().unwrap_or(&limit.limit.full_key);
            cleared.push(format!("{entries} {name} (used {})", limit.state.used));
        }
    }
    tracing::warn!(
        by,
        domain = %request.domain,
        windows = cleared.len(),
        cleared = %cleared.join("; "),
        "counters reset"
    );
}

fn entries_text(usage: &DescriptorUsage) -> String {
    usage
        .entries
        .iter()
        .map(|e| format!("{}={}", e.key, e.value))
        .collect::<Vec<_>>()
        .join(",")
}

/// The answer of both endpoints (and of `tollgate counters`), serialized in this field order:
/// `{"reset"?, "descriptors": [{"entries": [{"key", "value"}], "limits": [{"name"?,
/// "requestsPerUnit", "unit" | "window", "algorithm", "used", "remaining", "resetSeconds"}]}]}`.
/// For a reset, each limit's numbers are what its window held just before it was cleared, and
/// `"reset": true` says so.
#[derive(Debug, Serialize)]
pub struct UsagesJson<'a> {
    /// Present (true) on a reset's answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    reset: Option<bool>,
    descriptors: Vec<DescriptorJson<'a>>,
}

#[derive(Debug, Serialize)]
struct DescriptorJson<'a> {
    entries: Vec<EntryJson<'a>>,
    limits: Vec<LimitJson<'a>>,
}

#[derive(Debug, Serialize)]
struct EntryJson<'a> {
    key: &'a str,
    value: &'a str,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct LimitJson<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<&'a str>,
    requests_per_unit: u32,
    /// The unit as Envoy's proto names it, when the window is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    unit: Option<String>,
    /// Otherwise the window in seconds (`90s`).
    #[serde(skip_serializing_if = "Option::is_none")]
    window: Option<String>,
    algorithm: &'static str,
    used: u64,
    remaining: u64,
    reset_seconds: u64,
}

/// What `usages` become in the operator's JSON ([`UsagesJson`]).
pub fn usages_json(usages: &[DescriptorUsage], reset: bool) -> UsagesJson<'_> {
    let descriptors = usages
        .iter()
        .map(|usage| DescriptorJson {
            entries: usage
                .entries
                .iter()
                .map(|e| EntryJson {
                    key: e.key.as_str(),
                    value: e.value.as_str(),
                })
                .collect(),
            limits: usage
                .limits
                .iter()
                .map(|l| {
                    let limit = &l.limit;
                    LimitJson {
                        name: limit.name.as_deref(),
                        requests_per_unit: limit.requests_per_unit,
                        unit: limit.unit.map(|unit| unit.as_str().to_uppercase()),
                        window: limit
                            .unit
                            .is_none()
                            .then(|| format!("{}s", limit.window_ms / 1000)),
                        algorithm: limit.algorithm.as_str(),
                        used: l.state.used,
                        remaining: l.state.remaining,
                        reset_seconds: l.state.reset_ms.div_ceil(1000),
                    }
                })
                .collect(),
        })
        .collect();
    UsagesJson {
        reset: reset.then_some(true),
        descriptors,
    }
}

/// Reads the body as `POST /json` does; a 400 naming what is wrong otherwise.
fn read(body: &[u8]) -> Result<Request, Box<Response>> {
    let bad = |message: String| {
        Box::new((StatusCode::BAD_REQUEST, format!("{message}\n")).into_response())
    };
    let types = JSON_TYPES.as_ref().map_err(|e| {
        Box::new((StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")).into_response())
    })?;
    let proto = parse_request(&types.request, body).map_err(bad)?;
    Ok(request_from_proto(proto))
}

fn answer(value: &UsagesJson<'_>) -> Response {
    match serde_json::to_string(value) {
        Ok(json) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/json")],
            format!("{json}\n"),
        )
            .into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("could not encode the answer as JSON: {e}\n"),
        )
            .into_response(),
    }
}

fn failure(err: &InspectError) -> Response {
    let code = match err {
        InspectError::Invalid(_) => StatusCode::BAD_REQUEST,
        InspectError::Backend(_) => StatusCode::SERVICE_UNAVAILABLE,
    };
    (code, format!("{err}\n")).into_response()
}
