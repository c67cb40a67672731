//! What a phase of load measured: the summary every scenario keeps, and the report of
//! `tollgate-bench load` as human text or one JSON object.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::load::args::{LoadArgs, Stop};
use crate::load::generator::Measured;

/// Latency percentiles of answered calls, in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LatencyUs {
    /// Fastest call.
    pub min: f64,
    /// Arithmetic mean.
    pub mean: f64,
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p99_9: f64,
    /// Slowest call.
    pub max: f64,
}

/// The outcome of one phase: counts, rates and latency. Scenarios keep it in their JSON records
/// under the same field names `tollgate-bench load --json` prints.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// From the start of the phase until its last call returned.
    pub elapsed_seconds: f64,
    /// Calls sent (answered or failed).
    pub requests: u64,
    /// Calls answered with overall code OK.
    pub ok: u64,
    /// Calls answered with overall code OVER_LIMIT.
    pub over_limit: u64,
    /// Calls answered with overall code UNKNOWN (or one this client does not know).
    pub unknown: u64,
    /// Calls that failed.
    pub errors: u64,
    /// Failed calls by gRPC status name.
    pub errors_by_code: BTreeMap<String, u64>,
    /// Calls answered with a decision.
    pub decisions: u64,
    /// Decisions per second of elapsed time.
    pub decisions_per_second: f64,
    /// Calls per second of elapsed time.
    pub requests_per_second: f64,
    /// Latency of the answered calls.
    pub latency_us: LatencyUs,
}

impl Summary {
    /// Summarises a measured phase.
    pub fn of(measured: &Measured) -> Summary {
        let tally = &measured.tally;
        let histogram = &tally.latency;
        let micros = |nanos: u64| nanos as f64 / 1_000.0;
        let latency_us = if histogram.is_empty() {
            LatencyUs {
                min: 0.0,
                mean: 0.0,
                p50: 0.0,
                p90: 0.0,
                p99: 0.0,
                p99_9: 0.0,
                max: 0.0,
            }
        } else {
            LatencyUs {
                min: micros(histogram.min()),
                mean: histogram.mean() / 1_000.0,
                p50: micros(histogram.value_at_quantile(0.50)),
                p90: micros(histogram.value_at_quantile(0.90)),
                p99: micros(histogram.value_at_quantile(0.99)),
                p99_9: micros(histogram.value_at_quantile(0.999)),
                max: micros(histogram.max()),
            }
        };
        let seconds = measured.elapsed.as_secs_f64();
        let per_second = |count: u64| {
            if seconds > 0.0 {
                count as f64 / seconds
            } else {
                0.0
            }
        };
        let requests = tally.decisions() + tally.error_count();
        Summary {
            elapsed_seconds: seconds,
            requests,
            ok: tally.ok,
            over_limit: tally.over_limit,
            unknown: tally.unknown,
            errors: tally.error_count(),
            errors_by_code: tally
                .errors
                .iter()
                .map(|(code, count)| ((*code).to_owned(), *count))
                .collect(),
            decisions: tally.decisions(),
            decisions_per_second: per_second(tally.decisions()),
            requests_per_second: per_second(requests),
            latency_us,
        }
    }
}

/// The report of `tollgate-bench load`: what was asked for and what happened.
#[derive(Debug)]
pub struct Report<'a> {
    /// What was asked for.
    pub args: &'a LoadArgs,
    /// What happened in the measured phase.
    pub summary: Summary,
}

impl Report<'_> {
    fn mode(&self) -> &'static str {
        if self.args.rate.is_some() {
            "open"
        } else {
            "closed"
        }
    }

    /// The report as one JSON object: the request shape and the summary; latencies in
    /// microseconds.
    pub fn to_json(&self) -> Value {
        let (duration, requests) = match self.args.stop() {
            Stop::After(duration) => (Some(duration.as_secs_f64()), None),
            Stop::Count(count) => (None, Some(count)),
        };
        let mut report = json!({
            "target": self.args.target,
            "mode": self.mode(),
            "target_rate": self.args.rate,
            "connections": self.args.connections,
            "concurrency": self.args.concurrency,
            "duration_seconds": duration,
            "requested": requests,
            "warmup_seconds": self.args.warmup.as_secs_f64(),
            "domain": self.args.domain,
            "descriptors": self.args.descriptors,
            "keys": self.args.keys,
            "distribution": self.args.distribution.name(),
            "zipf_exponent": self.args.zipf_exponent,
            "hits_addend": self.args.hits_addend,
            "descriptor_hits_addend": self.args.descriptor_hits_addend,
        });
        if let (Some(report), Ok(Value::Object(summary))) =
            (report.as_object_mut(), serde_json::to_value(&self.summary))
        {
            report.extend(summary);
        }
        report
    }

    /// The report as a few lines of text.
    pub fn to_text(&self) -> String {
        let summary = &self.summary;
        let latency = &summary.latency_us;
        let mut text = String::new();
        let rate = match self.args.rate {
            Some(rate) => format!("open loop at {rate} calls/s"),
            None => "closed loop".to_owned(),
        };
        // Writing to a String cannot fail.
        let _ = writeln!(
            text,
            "target {}: {rate}, {} connection(s), {} in flight, {} descriptor(s) over {} {} key(s)",
            self.args.target,
            self.args.connections,
            self.args.concurrency,
            self.args.descriptors,
            self.args.keys,
            self.args.distribution.name(),
        );
        let _ = writeln!(
            text,
            "{} calls in {}: {:.0} decisions/s",
            summary.requests,
            human_duration(Duration::from_secs_f64(summary.elapsed_seconds)),
            summary.decisions_per_second,
        );
        let _ = writeln!(
            text,
            "  OK {}  OVER_LIMIT {}  UNKNOWN {}  errors {}",
            summary.ok, summary.over_limit, summary.unknown, summary.errors,
        );
        for (code, count) in &summary.errors_by_code {
            let _ = writeln!(text, "    {code}: {count}");
        }
        let _ = writeln!(
            text,
            "latency  p50 {}  p90 {}  p99 {}  p99.9 {}  max {}",
            human_micros(latency.p50),
            human_micros(latency.p90),
            human_micros(latency.p99),
            human_micros(latency.p99_9),
            human_micros(latency.max),
        );
        text
    }
}

fn human_micros(micros: f64) -> String {
    human_duration(Duration::from_secs_f64(micros.max(0.0) / 1e6))
}

fn human_duration(duration: Duration) -> String {
    let nanos = duration.as_nanos();
    if nanos < 1_000_000 {
        format!("{:.1}µs", nanos as f64 / 1e3)
    } else if nanos < 1_000_000_000 {
        format!("{:.2}ms", nanos as f64 / 1e6)
    } else {
        format!("{:.2}s", nanos as f64 / 1e9)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_naturally() {
        assert_eq!(human_micros(312.4), "312.4µs");
        assert_eq!(human_micros(1_234.0), "1.23ms");
        assert_eq!(human_micros(2_500_000.0), "2.50s");
    }
}
