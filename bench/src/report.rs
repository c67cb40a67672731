//! The run's report, as human text or one JSON object.

use std::fmt::Write as _;
use std::time::Duration;

use serde_json::{Value, json};

use crate::args::{Args, Stop};
use crate::load::Measured;

/// Latency percentiles of answered calls, in nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Latency {
    /// Fastest call.
    pub min: u64,
    /// Arithmetic mean.
    pub mean: f64,
    /// Median.
    pub p50: u64,
    /// 90th percentile.
    pub p90: u64,
    /// 99th percentile.
    pub p99: u64,
    /// 99.9th percentile.
    pub p99_9: u64,
    /// Slowest call.
    pub max: u64,
}

/// Everything a run reports.
#[derive(Debug)]
pub struct Report<'a> {
    /// What was asked for.
    pub args: &'a Args,
    /// What happened in the measured phase.
    pub measured: Measured,
}

impl Report<'_> {
    fn latency(&self) -> Latency {
        let histogram = &self.measured.tally.latency;
        if histogram.is_empty() {
            return Latency {
                min: 0,
                mean: 0.0,
                p50: 0,
                p90: 0,
                p99: 0,
                p99_9: 0,
                max: 0,
            };
        }
        Latency {
            min: histogram.min(),
            mean: histogram.mean(),
            p50: histogram.value_at_quantile(0.50),
            p90: histogram.value_at_quantile(0.90),
            p99: histogram.value_at_quantile(0.99),
            p99_9: histogram.value_at_quantile(0.999),
            max: histogram.max(),
        }
    }

    fn per_second(&self, count: u64) -> f64 {
        let seconds = self.measured.elapsed.as_secs_f64();
        if seconds > 0.0 {
            count as f64 / seconds
        } else {
            0.0
        }
    }

    fn requests(&self) -> u64 {
        self.measured.tally.decisions() + self.measured.tally.error_count()
    }

    fn mode(&self) -> &'static str {
        if self.args.rate.is_some() {
            "open"
        } else {
            "closed"
        }
    }

    /// The report as one JSON object; latencies in microseconds.
    pub fn to_json(&self) -> Value {
        let tally = &self.measured.tally;
        let latency = self.latency();
        let micros = |nanos: u64| nanos as f64 / 1_000.0;
        let (duration, requests) = match self.args.stop() {
            Stop::After(duration) => (Some(duration.as_secs_f64()), None),
            Stop::Count(count) => (None, Some(count)),
        };
        json!({
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
            "elapsed_seconds": self.measured.elapsed.as_secs_f64(),
            "requests": self.requests(),
            "ok": tally.ok,
            "over_limit": tally.over_limit,
            "unknown": tally.unknown,
            "errors": tally.error_count(),
            "errors_by_code": tally.errors,
            "decisions": tally.decisions(),
            "decisions_per_second": self.per_second(tally.decisions()),
            "requests_per_second": self.per_second(self.requests()),
            "latency_us": {
                "min": micros(latency.min),
                "mean": latency.mean / 1_000.0,
                "p50": micros(latency.p50),
                "p90": micros(latency.p90),
                "p99": micros(latency.p99),
                "p99_9": micros(latency.p99_9),
                "max": micros(latency.max),
            },
        })
    }

    /// The report as a few lines of text.
    pub fn to_text(&self) -> String {
        let tally = &self.measured.tally;
        let latency = self.latency();
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
            self.requests(),
            human_duration(self.measured.elapsed),
            self.per_second(tally.decisions()),
        );
        let _ = writeln!(
            text,
            "  OK {}  OVER_LIMIT {}  UNKNOWN {}  errors {}",
            tally.ok,
            tally.over_limit,
            tally.unknown,
            tally.error_count(),
        );
        for (code, count) in &tally.errors {
            let _ = writeln!(text, "    {code}: {count}");
        }
        let _ = writeln!(
            text,
            "latency  p50 {}  p90 {}  p99 {}  p99.9 {}  max {}",
            human_nanos(latency.p50),
            human_nanos(latency.p90),
            human_nanos(latency.p99),
            human_nanos(latency.p99_9),
            human_nanos(latency.max),
        );
        text
    }
}

fn human_nanos(nanos: u64) -> String {
    human_duration(Duration::from_nanos(nanos))
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
        assert_eq!(human_nanos(312_400), "312.4µs");
        assert_eq!(human_nanos(1_234_000), "1.23ms");
        assert_eq!(human_nanos(2_500_000_000), "2.50s");
    }
}
