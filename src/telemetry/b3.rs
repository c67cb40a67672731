//! Reading a B3 trace context (Zipkin's propagation, which Envoy's Zipkin tracer sends): the
//! single `b3` header, `{trace id}-{span id}[-{sampling}[-{parent span id}]]`, and the multi
//! headers `x-b3-traceid`, `x-b3-spanid`, `x-b3-sampled`, `x-b3-flags`.
//!
//! As the reference's B3 propagator: a 64-bit trace id is padded to 128 bits; debug (`d`,
//! `x-b3-flags: 1`) means sampled; a missing decision is read as not sampled; anything malformed
//! is ignored whole, so the call starts a trace of its own.

use opentelemetry::trace::{SpanContext, SpanId, TraceFlags, TraceId, TraceState};

use super::Headers;

/// The caller's span, if the headers carry a valid B3 context (the single header first).
pub fn extract(headers: &dyn Headers) -> Option<SpanContext> {
    if let Some(single) = headers.get("b3") {
        return single_header(single);
    }
    let trace_id = headers.get("x-b3-traceid")?;
    let span_id = headers.get("x-b3-spanid")?;
    let sampled = if headers.get("x-b3-flags") == Some("1") {
        true
    } else {
        match headers.get("x-b3-sampled") {
            None => false,
            Some("1" | "true") => true,
            Some("0" | "false") => false,
            Some(_) => return None,
        }
    };
    context(trace_id, span_id, sampled)
}

fn single_header(value: &str) -> Option<SpanContext> {
    let mut parts = value.split('-');
    let trace_id = parts.next()?;
    // A lone sampling decision ("0", "1", "d") carries no span to join.
    let span_id = parts.next()?;
    let sampled = match parts.next() {
        None => false,
        Some("1" | "d") => true,
        Some("0") => false,
        Some(_) => return None,
    };
    // The parent span id, when present, must be well formed; it is not needed to join.
    if let Some(parent) = parts.next() {
        span_id_from(parent)?;
    }
    if parts.next().is_some() {
        return None;
    }
    context(trace_id, span_id, sampled)
}

fn context(trace_id: &str, span_id: &str, sampled: bool) -> Option<SpanContext> {
    let trace_id = match trace_id.len() {
        16 | 32 if is_hex(trace_id) => TraceId::from_hex(trace_id).ok()?,
        _ => return None,
    };
    let span_id = span_id_from(span_id)?;
    if trace_id == TraceId::INVALID || span_id == SpanId::INVALID {
        return None;
    }
    let flags = if sampled {
        TraceFlags::SAMPLED
    } else {
        TraceFlags::default()
    };
    Some(SpanContext::new(
        trace_id,
        span_id,
        flags,
        true,
        TraceState::default(),
    ))
}

fn span_id_from(hex: &str) -> Option<SpanId> {
    if hex.len() == 16 && is_hex(hex) {
        SpanId::from_hex(hex).ok()
    } else {
        None
    }
}

fn is_hex(s: &str) -> bool {
    s.bytes().all(|b| b.is_ascii_hexdigit())
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    struct Map(HashMap<&'static str, &'static str>);

    impl Headers for Map {
        fn get(&self, name: &str) -> Option<&str> {
            self.0.get(name).copied()
        }
    }

    fn headers(pairs: &[(&'static str, &'static str)]) -> Map {
        Map(pairs.iter().copied().collect())
    }

    const TRACE: &str = "80f198ee56343ba864fe8b2a57d3eff7";
    const SPAN: &str = "e457b5a2e4d86bd1";

    #[test]
    fn single_header_with_sampling_and_parent() {
        let value = format!("{TRACE}-{SPAN}-1-05e3ac9a4f6e3b90");
        let value: &'static str = Box::leak(value.into_boxed_str());
        let cx = extract(&headers(&[("b3", value)])).expect("valid b3");
        assert_eq!(cx.trace_id().to_string(), TRACE);
        assert_eq!(cx.span_id().to_string(), SPAN);
        assert!(cx.is_sampled());
        assert!(cx.is_remote());
    }

    #[test]
    fn single_header_debug_is_sampled_and_missing_decision_is_not() {
        let debug: &'static str = Box::leak(format!("{TRACE}-{SPAN}-d").into_boxed_str());
        assert!(extract(&headers(&[("b3", debug)])).unwrap().is_sampled());
        let deferred: &'static str = Box::leak(format!("{TRACE}-{SPAN}").into_boxed_str());
        assert!(!extract(&headers(&[("b3", deferred)])).unwrap().is_sampled());
    }

    #[test]
    fn short_trace_ids_are_padded() {
        let cx = extract(&headers(&[
            ("x-b3-traceid", "64fe8b2a57d3eff7"),
            ("x-b3-spanid", SPAN),
            ("x-b3-sampled", "1"),
        ]))
        .expect("valid multi headers");
        assert_eq!(
            cx.trace_id().to_string(),
            "000000000000000064fe8b2a57d3eff7"
        );
        assert!(cx.is_sampled());
    }

    #[test]
    fn multi_headers_flags_and_sampled() {
        let base = [("x-b3-traceid", TRACE), ("x-b3-spanid", SPAN)];
        let with = |extra: &[(&'static str, &'static str)]| {
            let mut all = base.to_vec();
            all.extend_from_slice(extra);
            extract(&headers(&all))
        };
        assert!(with(&[("x-b3-flags", "1")]).unwrap().is_sampled());
        assert!(with(&[("x-b3-sampled", "true")]).unwrap().is_sampled());
        assert!(!with(&[("x-b3-sampled", "0")]).unwrap().is_sampled());
        assert!(!with(&[]).unwrap().is_sampled());
        assert!(with(&[("x-b3-sampled", "yes")]).is_none());
    }

    #[test]
    fn malformed_contexts_are_ignored() {
        for bad in [
            "0",
            "1",
            "d",
            "xyz-e457b5a2e4d86bd1-1",
            "80f198ee56343ba864fe8b2a57d3eff7-e457b5a2-1",
            "80f198ee56343ba864fe8b2a57d3eff7-e457b5a2e4d86bd1-2",
            "80f198ee56343ba864fe8b2a57d3eff7-e457b5a2e4d86bd1-1-zz",
            "80f198ee56343ba864fe8b2a57d3eff7-e457b5a2e4d86bd1-1-05e3ac9a4f6e3b90-x",
            "00000000000000000000000000000000-e457b5a2e4d86bd1-1",
            "80f198ee56343ba864fe8b2a57d3eff7-0000000000000000-1",
            "",
        ] {
            assert!(extract(&headers(&[("b3", bad)])).is_none(), "{bad:?}");
        }
        assert!(extract(&headers(&[("x-b3-traceid", TRACE)])).is_none());
        assert!(extract(&headers(&[])).is_none());
    }
}
