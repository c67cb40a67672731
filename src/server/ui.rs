//! What an operator looks at on the admin port: `GET /top` (the descriptors refused most often
//! lately), `GET /ui` (one page, served from the binary, that shows the policies, each limit's
//! recent decisions, who is refused and a descriptor's usage) and `GET /ui/stats`, the JSON the
//! page draws.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::App;
use super::history::{SLOT_SECONDS, SLOTS, slot_of};
use super::top::MAX_N;
use crate::backend::Backend;
use crate::clock::{Clock, SystemClock};
use crate::config::Limit;

/// The page, embedded at build time: no file to ship, no external asset.
const PAGE: &str = include_str!("ui/index.html");

/// How many descriptors `/top` lists when `n` is not given.
pub const DEFAULT_N: usize = 10;

/// `GET /ui`: the page.
pub async fn page() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            // The page loads nothing from elsewhere, and nothing else may frame or script it.
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; \
                 connect-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
            ),
            (header::CACHE_CONTROL, "no-store"),
        ],
        PAGE,
    )
        .into_response()
}

/// `GET /top?domain=D[&n=N]`: `{"domain": D, "refused": [{"entries": [{"key", "value"}],
/// "limit", "count"}]}`, most refused first; 400 with the reason for a bad query, 404 for a
/// domain the policies do not have.
pub async fn top<B: Backend>(State(app): State<Arc<App<B>>>, uri: Uri) -> Response {
    let (domain, n) = match top_query(uri.query().unwrap_or_default()) {
        Ok(query) => query,
        Err(reason) => return (StatusCode::BAD_REQUEST, format!("{reason}\n")).into_response(),
    };
    if app.limiter.config().domain(&domain).is_none() {
        return (
            StatusCode::NOT_FOUND,
            format!("no domain `{domain}` in the policies in force\n"),
        )
            .into_response();
    }
    let refused: Vec<Value> = app
        .metrics
        .top()
        .top(&domain, n, SystemClock.now_ms())
        .into_iter()
        .map(|(refused, count)| {
            json!({
                "entries": refused
                    .entries
                    .iter()
                    .map(|(key, value)| json!({"key": key, "value": value}))
                    .collect::<Vec<_>>(),
                "limit": refused.limit,
                "count": count,
            })
        })
        .collect();
    json_response(&json!({"domain": domain, "refused": refused}))
}

/// The domain and count of a `/top` query string, or why it is not one.
pub fn top_query(query: &str) -> Result<(String, usize), String> {
    const USAGE: &str = "GET /top?domain=<domain>[&n=<1..64>]";
    let mut domain = None;
    let mut n = None;
    for pair in query.split('&').filter(|pair| !pair.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        let value = decode(value).ok_or_else(|| {
            format!("the query parameter `{name}` is not valid percent-encoded UTF-8 ({USAGE})")
        })?;
        match name {
            "domain" => domain = Some(value),
            "n" => n = Some(value),
            other => {
                return Err(format!(
                    "unknown query parameter `{}` ({USAGE})",
                    other.escape_debug()
                ));
            }
        }
    }
    let domain = match domain {
        None => return Err(format!("the query parameter `domain` is missing ({USAGE})")),
        Some(domain) if domain.is_empty() => {
            return Err(format!("the query parameter `domain` is empty ({USAGE})"));
        }
        Some(domain) => domain,
    };
    let n = match n {
        None => DEFAULT_N,
        Some(text) => match text.parse::<usize>() {
            Ok(n) if (1..=MAX_N).contains(&n) => n,
            _ => {
                return Err(format!(
                    "`n` must be a whole number from 1 to {MAX_N}, not `{}` ({USAGE})",
                    text.escape_debug()
                ));
            }
        },
    };
    Ok((domain, n))
}

/// A query value, percent-decoded (`+` as a space, as forms send it); `None` when it is not
/// valid percent-encoding or not UTF-8.
fn decode(text: &str) -> Option<String> {
    let mut bytes = Vec::with_capacity(text.len());
    let mut rest = text.bytes();
    while let Some(byte) = rest.next() {
        bytes.push(match byte {
            b'+' => b' ',
            b'%' => {
                let high = (rest.next()? as char).to_digit(16)?;
                let low = (rest.next()? as char).to_digit(16)?;
                u8::try_from(high * 16 + low).ok()?
            }
            other => other,
        });
    }
    String::from_utf8(bytes).ok()
}

/// `GET /ui/stats`: the policies in force, each limit with its decisions and refusals in the
/// last ten minutes (ten-second slots, oldest first), and whether the page may offer a reset.
pub async fn stats<B: Backend>(State(app): State<Arc<App<B>>>) -> Response {
    let now_ms = SystemClock.now_ms();
    let config = app.limiter.config();
    let history = app.metrics.history();
    let domains: Vec<Value> = config
        .domains()
        .into_iter()
        .map(|domain| {
            let limits: Vec<Value> = domain
                .limits()
                .iter()
                .map(|limit| {
                    let counts = history.counts(limit, now_ms);
                    let mut value = describe(limit);
                    value["decided"] = json!(counts.decided);
                    value["refused"] = json!(counts.refused);
                    value
                })
                .collect();
            json!({"name": domain.name(), "limits": limits})
        })
        .collect();
    json_response(&json!({
        "resetEnabled": app.allow_reset,
        "slotSeconds": SLOT_SECONDS,
        "slots": SLOTS,
        // The end of the newest slot, in seconds since the Unix epoch.
        "until": (slot_of(now_ms) + 1) * SLOT_SECONDS,
        "domains": domains,
    }))
}

/// A limit as the page lists it, in the words `/counters` uses (`requestsPerUnit`, `unit` or
/// `window`, `algorithm`).
fn describe(limit: &Limit) -> Value {
    let mut value = json!({
        "key": limit.series_key,
        "requestsPerUnit": limit.requests_per_unit,
        "algorithm": limit.algorithm.as_str(),
        "shadowMode": limit.shadow_mode,
        "unlimited": limit.unlimited,
    });
    if let Some(name) = &limit.name {
        value["name"] = json!(name);
    }
    match limit.unit {
        Some(unit) => value["unit"] = json!(unit.as_str().to_ascii_uppercase()),
        None if !limit.unlimited => {
            value["window"] = json!(
                humantime::format_duration(std::time::Duration::from_millis(limit.window_ms))
                    .to_string()
            );
        }
        None => {}
    }
    value
}

fn json_response(value: &Value) -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        value.to_string(),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_queries_are_read_or_refused_with_the_reason() {
        assert_eq!(top_query("domain=edge"), Ok(("edge".into(), DEFAULT_N)));
        assert_eq!(top_query("n=3&domain=a%20b"), Ok(("a b".into(), 3)));
        assert_eq!(top_query("domain=x+y&n=64"), Ok(("x y".into(), 64)));
        let refused = [
            ("", "`domain` is missing"),
            ("n=3", "`domain` is missing"),
            ("domain=", "`domain` is empty"),
            ("domain=edge&n=0", "from 1 to 64, not `0`"),
            ("domain=edge&n=65", "not `65`"),
            ("domain=edge&n=ten", "not `ten`"),
            ("domain=edge&n=99999999999999999999999", "from 1 to 64"),
            ("domain=edge&user=alice", "unknown query parameter `user`"),
            ("domain=%zz", "not valid percent-encoded"),
            ("domain=%ff", "not valid percent-encoded"),
        ];
        for (query, reason) in refused {
            match top_query(query) {
                Err(message) => assert!(message.contains(reason), "{query}: {message}"),
                Ok(answer) => panic!("{query} read as {answer:?}"),
            }
        }
    }

    #[test]
    fn the_page_is_self_contained() {
        assert!(PAGE.starts_with("<!doctype html>"));
        for external in ["http://", "https://", "src=\"//"] {
            let hits: Vec<&str> = PAGE
                .lines()
                .filter(|line| line.contains(external) && !line.contains("www.w3.org/2000/svg"))
                .collect();
            assert!(hits.is_empty(), "external reference: {hits:?}");
        }
    }
}
