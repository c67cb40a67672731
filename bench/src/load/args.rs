//! The flags of `tollgate-bench load`.

use std::time::Duration;

use clap::ValueEnum;

/// How to pick descriptor values from the key space.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Distribution {
    /// Every key equally likely.
    Uniform,
    /// Key of rank r (0-based) drawn with weight 1/(r+1)^s: a few hot keys, a long tail.
    Zipf,
}

impl Distribution {
    /// The name used on the command line and in the report.
    pub fn name(self) -> &'static str {
        match self {
            Distribution::Uniform => "uniform",
            Distribution::Zipf => "zipf",
        }
    }
}

/// The flags of `tollgate-bench load`: where to send, how much, and what requests look like.
#[derive(Debug, Clone, clap::Args)]
pub struct LoadArgs {
    /// gRPC endpoint of the RLS server.
    #[arg(long, default_value = "http://127.0.0.1:8081")]
    pub target: String,

    /// Number of HTTP/2 connections, fixed for the whole run; calls are spread evenly over them.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub connections: u32,

    /// Calls in flight at once, over all connections.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub concurrency: u32,

    /// How long to send after warmup, e.g. `30s`, `2m` (default 10s unless --requests is given).
    #[arg(long, value_parser = parse_positive_duration, conflicts_with = "requests")]
    pub duration: Option<Duration>,

    /// Number of calls to send after warmup.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub requests: Option<u64>,

    /// Target rate in calls per second (open loop); as fast as possible when absent (closed loop).
    #[arg(long, value_parser = parse_rate)]
    pub rate: Option<f64>,

    /// The `domain` of every request.
    #[arg(long, default_value = "bench")]
    pub domain: String,

    /// Number of distinct values per descriptor; values are the decimal numbers `0..N`.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..))]
    pub keys: u64,

    /// How values are drawn from the key space.
    #[arg(long, value_enum, default_value_t = Distribution::Uniform)]
    pub distribution: Distribution,

    /// Exponent s of the Zipf distribution (0 is uniform; larger is more skewed).
    #[arg(long, default_value_t = 1.0, value_parser = parse_exponent)]
    pub zipf_exponent: f64,

    /// Descriptors per request; each draws its own value.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub descriptors: u32,

    /// Entry key of descriptor i; `{i}` is replaced by i (0-based). Each descriptor has the one
    /// entry (key, value).
    #[arg(long, default_value = "bench_key_{i}", value_parser = parse_descriptor_key)]
    pub descriptor_key: String,

    /// The request-level `hits_addend` (0 leaves it unset; servers then count 1).
    #[arg(long, default_value_t = 1)]
    pub hits_addend: u32,

    /// Also set every descriptor's own `hits_addend` (0 means check only on tollgate).
    #[arg(long)]
    pub descriptor_hits_addend: Option<u64>,

    /// Load sent before measuring (same shape and rate), not reported, e.g. `2s`.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "0s")]
    pub warmup: Duration,

    /// Deadline of one call; a call that takes longer counts as a DEADLINE_EXCEEDED error.
    #[arg(long, value_parser = parse_positive_duration, default_value = "2s")]
    pub timeout: Duration,

    /// Seed of the value draws, for repeatable key sequences (random when absent).
    #[arg(long)]
    pub seed: Option<u64>,

    /// Runtime worker threads of the generator (default: one per CPU).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub threads: Option<u32>,

    /// Print the report as one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// What ends the measured phase.
#[derive(Clone, Copy, Debug)]
pub enum Stop {
    /// Stop sending once this much time has passed.
    After(Duration),
    /// Stop after this many calls.
    Count(u64),
}

impl LoadArgs {
    /// The bound of the measured phase.
    pub fn stop(&self) -> Stop {
        match (self.requests, self.duration) {
            (Some(count), _) => Stop::Count(count),
            (None, Some(duration)) => Stop::After(duration),
            (None, None) => Stop::After(Duration::from_secs(10)),
        }
    }

    /// The entry key of descriptor `index`.
    pub fn entry_key(&self, index: u32) -> String {
        self.descriptor_key.replace("{i}", &index.to_string())
    }
}

pub(crate) fn parse_positive_duration(text: &str) -> Result<Duration, String> {
    let duration = humantime::parse_duration(text).map_err(|e| e.to_string())?;
    if duration.is_zero() {
        return Err("must be longer than zero".into());
    }
    Ok(duration)
}

/// A rate in calls per second, positive and finite (`--rate`).
pub fn parse_rate(text: &str) -> Result<f64, String> {
    let rate: f64 = text
        .parse()
        .map_err(|_| format!("`{text}` is not a number"))?;
    // The schedule divides by the rate; a rate below one call per hour is surely a typo.
    if !rate.is_finite() || rate < 1.0 / 3600.0 {
        return Err("must be a positive number of calls per second".into());
    }
    Ok(rate)
}

fn parse_exponent(text: &str) -> Result<f64, String> {
    let exponent: f64 = text
        .parse()
        .map_err(|_| format!("`{text}` is not a number"))?;
    if !exponent.is_finite() || exponent < 0.0 {
        return Err("must be a finite number >= 0".into());
    }
    Ok(exponent)
}

fn parse_descriptor_key(text: &str) -> Result<String, String> {
    if text.is_empty() {
        return Err("must not be empty".into());
    }
    Ok(text.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    /// The flags as `tollgate-bench load` parses them.
    #[derive(Parser)]
    struct Load {
        #[command(flatten)]
        args: LoadArgs,
    }

    fn parse<'a>(argv: impl IntoIterator<Item = &'a str>) -> Result<LoadArgs, clap::Error> {
        Load::try_parse_from(std::iter::once("load").chain(argv)).map(|load| load.args)
    }

    #[test]
    fn defaults_are_a_bounded_closed_loop() {
        let args = parse([]).unwrap();
        assert!(matches!(args.stop(), Stop::After(d) if d == Duration::from_secs(10)));
        assert_eq!(args.rate, None);
        assert_eq!(args.entry_key(2), "bench_key_2");
    }

    #[test]
    fn duration_and_requests_exclude_each_other() {
        assert!(parse(["--duration", "1s", "--requests", "5"]).is_err());
        let count = parse(["--requests", "5"]).unwrap();
        assert!(matches!(count.stop(), Stop::Count(5)));
    }

    #[test]
    fn nonsense_values_are_refused() {
        for bad in [
            &["--rate", "0"][..],
            &["--rate", "NaN"],
            &["--zipf-exponent", "-1"],
            &["--connections", "0"],
            &["--concurrency", "0"],
            &["--requests", "0"],
            &["--duration", "0s"],
            &["--descriptors", "65"],
            &["--descriptor-key", ""],
        ] {
            assert!(parse(bad.iter().copied()).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn descriptor_key_without_placeholder_is_shared() {
        let args = parse(["--descriptor-key", "user"]).unwrap();
        assert_eq!(args.entry_key(0), "user");
        assert_eq!(args.entry_key(3), "user");
    }
}
