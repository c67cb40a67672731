//! h2load (from nghttp2) as a second load generator: a small C client that sends one request
//! body over and over, on `connections` HTTP/2 connections with `streams` calls in flight on
//! each. It is what operators reach for to compare gRPC servers, and it costs about half the CPU
//! per call of `tollgate-bench load` (which keeps per-call values, timing and percentiles): on a
//! machine where the servers share the cores with the generator, it leaves them more of those
//! cores. Its price: every call is the
//! same request (one descriptor value), and it reports the mean latency, not percentiles.
//!
//! h2load only sees HTTP statuses, and a gRPC error is an HTTP 200 with a `grpc-status` trailer,
//! so a scenario checks the same request with its own client first ([`H2Load::check_answered_ok`]).

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use prost::Message as _;
use serde::{Deserialize, Serialize};
use tempfile::NamedTempFile;
use tollgate::proto::RateLimitDescriptor;
use tollgate::proto::RateLimitRequest;
use tollgate::proto::rate_limit_descriptor::Entry;
use tollgate::proto::rate_limit_response::Code;

use crate::doc::{count, count_range, median, ms, range};
use crate::scenario::Loader;

/// How h2load loads each server, as a scenario's flags.
#[derive(Debug, Clone, clap::Args)]
pub struct H2LoadOptions {
    /// h2load's HTTP/2 connections to each server, in the runs that follow the generator's.
    #[arg(id = "h2load_connections", long = "h2load-connections", default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub connections: u32,

    /// h2load's calls in flight on each of its connections.
    #[arg(id = "h2load_streams", long = "h2load-streams", default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub streams: u32,
}

/// The path of the RLS v3 call on every server.
const METHOD_PATH: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// h2load, ready to send one request over and over: an RLS call to any RLS server, or a plain
/// GET to any HTTP/2 server (Envoy's listener).
pub struct H2Load {
    binary: PathBuf,
    /// The request's body, when it has one: the RLS request as one gRPC message
    /// (length-prefixed).
    body: Option<NamedTempFile>,
    /// The request's headers beyond h2load's own, as `name: value`.
    headers: Vec<String>,
    /// The paths the requests go to, in turn.
    paths: Vec<String>,
    /// The RLS request the body holds, when it is one.
    request: Option<RateLimitRequest>,
}

/// What one h2load run measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct H2LoadSummary {
    /// Calls h2load completed.
    pub done: u64,
    /// Calls answered with an HTTP 2xx status.
    pub succeeded: u64,
    /// Calls that failed, errored or timed out.
    pub failed: u64,
    /// Completed calls per second, as h2load reports them.
    pub requests_per_second: f64,
    /// The mean latency of a call, in microseconds.
    pub mean_latency_us: f64,
    /// The longest call, in microseconds.
    pub max_latency_us: f64,
}

impl H2Load {
    /// h2load (`$TOLLGATE_H2LOAD`, else the one on the `PATH`) sending `request`.
    pub fn new(request: RateLimitRequest) -> anyhow::Result<H2Load> {
        let binary = binary()?;
        let mut body = tempfile::Builder::new()
            .prefix("tollgate-bench-h2load-")
            .tempfile()
            .context("creating h2load's request body")?;
        body.write_all(&grpc_message(&request))
            .context("writing h2load's request body")?;
        Ok(H2Load {
            binary,
            body: Some(body),
            headers: vec![
                "content-type: application/grpc".to_owned(),
                "te: trailers".to_owned(),
            ],
            paths: vec![METHOD_PATH.to_owned()],
            request: Some(request),
        })
    }

    /// h2load sending `GET` to each of `paths` in turn with `headers` (`name: value`): plain
    /// HTTP/2 requests, as a client sends them through Envoy.
    pub fn get(paths: &[String], headers: &[&str]) -> anyhow::Result<H2Load> {
        Ok(H2Load {
            binary: binary()?,
            body: None,
            headers: headers.iter().map(|header| (*header).to_owned()).collect(),
            paths: paths.to_vec(),
            request: None,
        })
    }

    /// A request of one descriptor with one entry, `key` = `value`, in `domain`.
    pub fn one_descriptor(domain: &str, key: &str, value: &str) -> RateLimitRequest {
        RateLimitRequest {
            domain: domain.to_owned(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: key.to_owned(),
                    value: value.to_owned(),
                }],
                ..RateLimitDescriptor::default()
            }],
            hits_addend: 0,
        }
    }

    /// Checks, with `loader`'s own client, that `target` answers the request h2load repeats
    /// with OK: h2load sees only HTTP statuses, and a gRPC error or an OVER_LIMIT answer is an
    /// HTTP 200 too, so a run would count them as decisions.
    pub fn check_answered_ok(&self, loader: &Loader, target: SocketAddr) -> anyhow::Result<()> {
        let Some(request) = &self.request else {
            bail!("h2load sends {target} plain requests, not RLS calls");
        };
        let answer = loader.call(target, request)?;
        if answer.overall_code != Code::Ok as i32 {
            bail!("{target} answered h2load's request with {answer:?}");
        }
        Ok(())
    }

    /// Sends calls to `target` for `duration` as `options` say, and reads what h2load measured.
    pub fn run(
        &self,
        target: SocketAddr,
        duration: Duration,
        options: &H2LoadOptions,
    ) -> anyhow::Result<H2LoadSummary> {
        let duration = format!("{}ms", duration.as_millis().max(1));
        self.send(target, &["--duration", &duration], options)
    }

    /// Sends calls to `target` for `duration` as `options` say, at most `per_second` calls a
    /// second over all connections (h2load paces each connection), and reads what h2load
    /// measured: the latency of a load below saturation.
    pub fn run_paced(
        &self,
        target: SocketAddr,
        duration: Duration,
        per_second: u32,
        options: &H2LoadOptions,
    ) -> anyhow::Result<H2LoadSummary> {
        let duration = format!("{}ms", duration.as_millis().max(1));
        let per_connection = (per_second / options.connections).max(1);
        self.send(
            target,
            &[
                "--duration",
                &duration,
                "--rps",
                &per_connection.to_string(),
            ],
            options,
        )
    }

    /// Sends `calls` calls to `target` as `options` say (at least one per connection), and
    /// reads what h2load measured.
    pub fn run_calls(
        &self,
        target: SocketAddr,
        calls: u64,
        options: &H2LoadOptions,
    ) -> anyhow::Result<H2LoadSummary> {
        let calls = calls.max(u64::from(options.connections)).to_string();
        self.send(target, &["--requests", &calls], options)
    }

    /// Runs h2load against `target` with `limit`: its flags saying how long, how many, how
    /// fast.
    fn send(
        &self,
        target: SocketAddr,
        limit: &[&str],
        options: &H2LoadOptions,
    ) -> anyhow::Result<H2LoadSummary> {
        let H2LoadOptions {
            connections,
            streams,
        } = *options;
        let mut command = Command::new(&self.binary);
        command
            .args(limit)
            .arg("--clients")
            .arg(connections.to_string())
            .arg("--max-concurrent-streams")
            .arg(streams.to_string());
        if let Some(body) = &self.body {
            command.arg("--data").arg(body.path());
        }
        for header in &self.headers {
            command.arg("--header").arg(header);
        }
        for path in &self.paths {
            command.arg(format!("http://{target}{path}"));
        }
        let output = command
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("running {}", self.binary.display()))?;
        let stdout = String::from_utf8_lossy(&output.stdout);
        if !output.status.success() {
            bail!(
                "h2load against {target} failed ({}): {}{}",
                output.status,
                stdout.trim(),
                String::from_utf8_lossy(&output.stderr).trim()
            );
        }
        let summary = parse(&stdout)
            .with_context(|| format!("reading h2load's report:\n{}", stdout.trim()))?;
        if summary.succeeded == 0 {
            bail!("h2load got no answer from {target}:\n{}", stdout.trim());
        }
        Ok(summary)
    }
}

/// h2load: `$TOLLGATE_H2LOAD`, else the one on the `PATH`.
fn binary() -> anyhow::Result<PathBuf> {
    crate::proc::find_tool(
        "TOLLGATE_H2LOAD",
        "h2load",
        "it comes with the Debian package nghttp2-client",
    )
}

/// `request` as the body of a gRPC call: a flag byte (not compressed), its length in four bytes
/// (big-endian), then the message.
fn grpc_message(request: &RateLimitRequest) -> Vec<u8> {
    let message = request.encode_to_vec();
    let mut body = Vec::with_capacity(5 + message.len());
    body.push(0);
    // A request of a few descriptors is far below 4 GiB.
    body.extend_from_slice(
        &u32::try_from(message.len())
            .unwrap_or(u32::MAX)
            .to_be_bytes(),
    );
    body.extend_from_slice(&message);
    body
}

/// The cells every h2load table starts its row with, from `runs` of one server: calls a second
/// (median), their min–max, and the mean latency (median).
pub fn load_cells<'a>(runs: impl Iterator<Item = &'a H2LoadSummary> + Clone) -> [String; 3] {
    let per_second = || runs.clone().map(|load| load.requests_per_second);
    [
        count(median(per_second())),
        count_range(range(per_second())),
        ms(median(runs.clone().map(|load| load.mean_latency_us))),
    ]
}

#[cfg(test)]
impl H2LoadSummary {
    /// A run that answered `per_second` calls in a second, each in `mean_latency_us` on average.
    pub fn steady(per_second: f64, mean_latency_us: f64) -> H2LoadSummary {
        H2LoadSummary {
            done: per_second as u64,
            succeeded: per_second as u64,
            failed: 0,
            requests_per_second: per_second,
            mean_latency_us,
            max_latency_us: 9_000.0,
        }
    }
}

/// Reads the figures of h2load's report.
fn parse(report: &str) -> anyhow::Result<H2LoadSummary> {
    let line = |prefix: &str| {
        report
            .lines()
            .map(str::trim)
            .find(|line| line.starts_with(prefix))
            .ok_or_else(|| anyhow!("no `{prefix}` line"))
    };
    let finished = line("finished in")?;
    let requests_per_second = finished
        .split(", ")
        .find_map(|part| part.strip_suffix(" req/s"))
        .ok_or_else(|| anyhow!("no req/s in `{finished}`"))?
        .parse::<f64>()
        .with_context(|| format!("req/s in `{finished}`"))?;

    // "requests: 16365 total, 16373 started, 16365 done, 16365 succeeded, 0 failed, 0 errored,
    // 0 timeout"
    let requests = line("requests:")?;
    let count = |name: &str| -> anyhow::Result<u64> {
        requests
            .trim_start_matches("requests:")
            .split(',')
            .map(str::trim)
            .find_map(|part| part.strip_suffix(name).map(str::trim))
            .ok_or_else(|| anyhow!("no `{name}` count in `{requests}`"))?
            .parse()
            .with_context(|| format!("the `{name}` count in `{requests}`"))
    };
    let failed = count("failed")? + count("errored")? + count("timeout")?;

    // "time for request:       24us      6.70ms       126us       215us    99.32%": min, max,
    // mean, sd.
    let times = line("time for request:")?;
    let fields: Vec<&str> = times
        .trim_start_matches("time for request:")
        .split_whitespace()
        .collect();
    let micros = |index: usize| {
        fields
            .get(index)
            .ok_or_else(|| anyhow!("too few fields in `{times}`"))
            .and_then(|field| duration_us(field))
    };
    Ok(H2LoadSummary {
        done: count("done")?,
        succeeded: count("succeeded")?,
        failed,
        requests_per_second,
        mean_latency_us: micros(2)?,
        max_latency_us: micros(1)?,
    })
}

/// A duration as h2load prints it (`126us`, `6.70ms`, `1.02s`), in microseconds.
fn duration_us(text: &str) -> anyhow::Result<f64> {
    let (number, scale) = if let Some(n) = text.strip_suffix("us") {
        (n, 1.0)
    } else if let Some(n) = text.strip_suffix("ms") {
        (n, 1e3)
    } else if let Some(n) = text.strip_suffix('s') {
        (n, 1e6)
    } else {
        bail!("`{text}` is not a duration h2load prints");
    };
    let value: f64 = number
        .parse()
        .with_context(|| format!("`{text}` is not a duration h2load prints"))?;
    Ok(value * scale)
}

#[cfg(test)]
mod tests {
    use super::*;

    const REPORT: &str = "starting benchmark...
Application protocol: h2c

finished in 300.59ms, 54550.00 req/s, 2.19MB/s
requests: 16365 total, 16373 started, 16365 done, 16360 succeeded, 3 failed, 1 errored, 1 timeout
status codes: 16360 2xx, 0 3xx, 0 4xx, 5 5xx
traffic: 671.41KB (687520) total, 48.01KB (49165) headers (space savings 95.77%), 175.80KB (180015) data
                     min         max         mean         sd        +/- sd
time for request:       24us      6.70ms       126us       215us    99.32%
time for connect:       55us        80us        68us        17us   100.00%
";

    #[test]
    fn the_report_gives_the_rate_the_counts_and_the_latency() {
        assert_eq!(
            parse(REPORT).unwrap(),
            H2LoadSummary {
                done: 16365,
                succeeded: 16360,
                failed: 5,
                requests_per_second: 54550.0,
                mean_latency_us: 126.0,
                max_latency_us: 6700.0,
            }
        );
    }

    #[test]
    fn a_report_without_its_figures_is_refused_by_name() {
        let error = parse("starting benchmark...\n").unwrap_err();
        assert!(error.to_string().contains("finished in"), "{error}");
        let error = duration_us("12 parsecs").unwrap_err();
        assert!(error.to_string().contains("12 parsecs"), "{error}");
    }

    #[test]
    fn the_body_is_one_uncompressed_grpc_message_holding_the_request() {
        let request = H2Load::one_descriptor("bench", "user", "0");
        let body = grpc_message(&request);
        assert_eq!(body[0], 0);
        let length = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
        assert_eq!(length, body.len() - 5);
        assert_eq!(RateLimitRequest::decode(&body[5..]).unwrap(), request);
    }

    /// h2load against a real RLS server (the empty one, in this process): the run reads a
    /// rate and counts every call as answered.
    #[test]
    fn h2load_measures_a_real_server() {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let addr = listener.local_addr().unwrap();
        runtime.spawn(crate::empty::serve(listener));
        let h2load = H2Load::new(H2Load::one_descriptor("bench", "user", "0")).unwrap();
        let options = H2LoadOptions {
            connections: 2,
            streams: 4,
        };
        let summary = h2load
            .run(addr, Duration::from_millis(300), &options)
            .unwrap();
        assert!(summary.succeeded > 0, "{summary:?}");
        assert_eq!(summary.failed, 0, "{summary:?}");
        assert_eq!(summary.done, summary.succeeded, "{summary:?}");
        assert!(summary.requests_per_second > 0.0, "{summary:?}");
        assert!(summary.mean_latency_us > 0.0, "{summary:?}");
    }
}
