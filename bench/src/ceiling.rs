//! The ceiling a Redis backend is compared with: `redis-benchmark` (a small C client from the
//! Debian package `redis-tools`) running `EVALSHA` of the very Lua script tollgate runs, on keys
//! of the same shape, with as many calls in flight, against the same server or cluster.
//!
//! The key is what tollgate builds for one descriptor (`tollgate:{bench|<key>=<value>@c60000}:c`)
//! with the value drawn by redis-benchmark (`__rand_int__`, uniform over the key space, written
//! as 12 digits). Against a cluster, redis-benchmark routes each call by a literal `{tag}` that it
//! replaces per master, so the key carries that tag in place of tollgate's own.
//!
//! A sliding window log has two keys (the log and its sum); redis-benchmark draws every
//! `__rand_int__` on its own, so a call pairs the log of one value with the sum of another. While
//! nothing leaves the window (a minute, longer than a run), the script does the same work either
//! way; only the first call on a sum that does not exist yet rebuilds it from its log (a
//! calibration run before the measured ones creates most of them).

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};

use crate::scenario::{Algorithm, DOMAIN, UNREACHABLE_LIMIT, WINDOW_MS};
use crate::stand::{Backend, KEY_PREFIX, Nodes};

/// The Lua source of `algorithm`'s script: the file tollgate embeds.
pub fn script(algorithm: Algorithm) -> &'static str {
    match algorithm {
        Algorithm::Counter => include_str!("../../lua/counter.lua"),
        Algorithm::Log => include_str!("../../lua/log.lua"),
    }
}

/// The suffixes of `algorithm`'s keys, in the order its script takes them.
pub fn key_suffixes(algorithm: Algorithm) -> &'static [&'static str] {
    match algorithm {
        Algorithm::Counter => &[":c"],
        Algorithm::Log => &[":l", ":s"],
    }
}

/// What tollgate sends after the keys of an ordinary hit of cost 1 under a limit no load
/// reaches: limit, window and cost (the options after the cost are 0, and left out).
pub fn hit_arguments() -> [String; 3] {
    [
        UNREACHABLE_LIMIT.to_string(),
        WINDOW_MS.to_string(),
        "1".to_owned(),
    ]
}

/// The `redis-benchmark` binary: `$TOLLGATE_REDIS_BENCHMARK`, else the one on the `PATH`.
pub fn redis_benchmark_bin() -> anyhow::Result<PathBuf> {
    crate::proc::find_tool(
        "TOLLGATE_REDIS_BENCHMARK",
        "redis-benchmark",
        "it comes with the Debian package redis-tools (apt-get install redis-tools)",
    )
}

/// One ceiling to measure.
#[derive(Debug, Clone)]
pub struct Ceiling {
    /// `redis` or `redis-cluster`.
    pub backend: Backend,
    /// Whose script.
    pub algorithm: Algorithm,
    /// The descriptor entry key whose limiter keys are imitated.
    pub entry_key: String,
    /// Connections, each with one call in flight.
    pub concurrency: u32,
    /// Distinct values.
    pub keys: u64,
}

/// What one redis-benchmark run measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CeilingResult {
    /// Calls sent.
    pub requests: u64,
    /// Wall-clock seconds of the run.
    pub elapsed_seconds: f64,
    /// Calls per second, as redis-benchmark reports it.
    pub calls_per_second: f64,
    /// Mean latency, ms.
    pub avg_ms: f64,
    /// Median latency, ms.
    pub p50_ms: f64,
    /// 99th percentile latency, ms.
    pub p99_ms: f64,
    /// Slowest call, ms.
    pub max_ms: f64,
    /// CPU seconds of every Redis process during the run.
    pub redis_cpu_seconds: f64,
}

impl Ceiling {
    /// The keys of one call, with redis-benchmark's placeholders.
    fn keys_argument(&self) -> Vec<String> {
        let identity = format!(
            "{DOMAIN}|{}=__rand_int__@{}{WINDOW_MS}",
            self.entry_key,
            match self.algorithm {
                Algorithm::Counter => 'c',
                Algorithm::Log => 'l',
            }
        );
        key_suffixes(self.algorithm)
            .iter()
            .map(|suffix| match self.backend {
                Backend::RedisCluster => format!("{KEY_PREFIX}{{tag}}{identity}{suffix}"),
                _ => format!("{KEY_PREFIX}{{{identity}}}{suffix}"),
            })
            .collect()
    }

    /// The command redis-benchmark repeats, with `sha` the script's digest.
    fn command(&self, sha: &str) -> Vec<String> {
        let keys = self.keys_argument();
        let mut command = vec!["EVALSHA".to_owned(), sha.to_owned(), keys.len().to_string()];
        command.extend(keys);
        command.extend(hit_arguments());
        command
    }

    /// The command as the report shows it (`<sha>` for the digest).
    pub fn display(&self) -> String {
        let mut line = format!("redis-benchmark -c {} -r {}", self.concurrency, self.keys);
        if self.backend == Backend::RedisCluster {
            line.push_str(" --cluster");
        }
        for argument in self.command("<sha>") {
            line.push(' ');
            if argument.contains(['{', '|']) {
                line.push_str(&format!("'{argument}'"));
            } else {
                line.push_str(&argument);
            }
        }
        line
    }

    /// Loads the script on every master and answers its SHA1.
    pub fn load_script(&self, nodes: &Nodes<'_>) -> anyhow::Result<String> {
        let mut sha = String::new();
        for master in nodes.masters() {
            sha = master.cli(&["SCRIPT", "LOAD", script(self.algorithm)]);
        }
        if sha.len() != 40 {
            bail!(
                "SCRIPT LOAD of the {} script answered `{sha}`",
                self.algorithm.name()
            );
        }
        Ok(sha)
    }

    /// Runs redis-benchmark for `requests` calls of the script `sha` against `nodes`.
    pub fn run(
        &self,
        nodes: &Nodes<'_>,
        sha: &str,
        requests: u64,
    ) -> anyhow::Result<CeilingResult> {
        let port = nodes
            .masters()
            .first()
            .map(|master| master.port())
            .context("no Redis server to measure")?;
        let mut command = Command::new(redis_benchmark_bin()?);
        command.args(["-h", "127.0.0.1", "-p", &port.to_string()]);
        command.args(["-c", &self.concurrency.to_string()]);
        command.args(["-n", &requests.to_string()]);
        command.args(["-r", &self.keys.to_string(), "--csv"]);
        if self.backend == Backend::RedisCluster {
            command.arg("--cluster");
        }
        command.args(self.command(sha));

        let cpu_before: f64 = nodes.cpu_seconds()?.values().sum();
        let clock = Instant::now();
        let output = command.output().context("cannot run redis-benchmark")?;
        let elapsed = clock.elapsed();
        let cpu_after: f64 = nodes.cpu_seconds()?.values().sum();
        let stdout = String::from_utf8_lossy(&output.stdout);
        if !output.status.success() {
            bail!(
                "redis-benchmark failed ({}): {}{}",
                output.status,
                stdout,
                String::from_utf8_lossy(&output.stderr)
            );
        }
        let numbers = parse_csv(&stdout).with_context(|| {
            format!(
                "redis-benchmark printed no result: {stdout}{}",
                String::from_utf8_lossy(&output.stderr)
            )
        })?;
        Ok(CeilingResult {
            requests,
            elapsed_seconds: elapsed.as_secs_f64(),
            calls_per_second: numbers.rps,
            avg_ms: numbers.avg_ms,
            p50_ms: numbers.p50_ms,
            p99_ms: numbers.p99_ms,
            max_ms: numbers.max_ms,
            redis_cpu_seconds: cpu_after - cpu_before,
        })
    }

    /// How many calls make a run of about `duration`, from a short calibration run of
    /// `calibration` calls (which also creates keys, so the measured runs start warm).
    pub fn calibrate(
        &self,
        nodes: &Nodes<'_>,
        sha: &str,
        calibration: u64,
        duration: Duration,
    ) -> anyhow::Result<u64> {
        let trial = self.run(nodes, sha, calibration)?;
        Ok(((trial.calls_per_second * duration.as_secs_f64()) as u64).max(calibration))
    }
}

/// The numbers of redis-benchmark's `--csv` result line.
#[derive(Debug, PartialEq)]
struct CsvNumbers {
    rps: f64,
    avg_ms: f64,
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
}

/// Reads the last line of `--csv` output: `"test","rps","avg","min","p50","p95","p99","max"`.
fn parse_csv(text: &str) -> Option<CsvNumbers> {
    let line = text.lines().rev().find(|line| !line.trim().is_empty())?;
    let fields = split_csv(line);
    // The test name (the command) comes first and may be anything; the numbers are the last 7.
    let numbers: Vec<f64> = fields
        .iter()
        .skip(fields.len().checked_sub(7)?)
        .map(|field| field.parse().ok())
        .collect::<Option<_>>()?;
    Some(CsvNumbers {
        rps: numbers[0],
        avg_ms: numbers[1],
        p50_ms: numbers[3],
        p99_ms: numbers[5],
        max_ms: numbers[6],
    })
}

/// Splits one CSV line whose fields are double-quoted (a doubled quote inside stands for one).
fn split_csv(line: &str) -> Vec<String> {
    let mut fields = Vec::new();
    let mut field = String::new();
    let mut quoted = false;
    let mut chars = line.trim().chars().peekable();
    while let Some(c) = chars.next() {
        match (c, quoted) {
            ('"', true) if chars.peek() == Some(&'"') => {
                field.push('"');
                chars.next();
            }
            ('"', _) => quoted = !quoted,
            (',', false) => fields.push(std::mem::take(&mut field)),
            (c, _) => field.push(c),
        }
    }
    fields.push(field);
    fields
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_result_line_is_read() {
        let out = "\"test\",\"rps\",\"avg_latency_ms\",\"min_latency_ms\",\"p50_latency_ms\",\"p95_latency_ms\",\"p99_latency_ms\",\"max_latency_ms\"\n\
                   \"EVALSHA fd7a 1 tollgate:{bench|k=__rand_int__@c60000}:c 4000000000 60000 1\",\"32467.53\",\"0.440\",\"0.144\",\"0.423\",\"0.759\",\"0.895\",\"1.255\"\n";
        assert_eq!(
            parse_csv(out),
            Some(CsvNumbers {
                rps: 32467.53,
                avg_ms: 0.44,
                p50_ms: 0.423,
                p99_ms: 0.895,
                max_ms: 1.255
            })
        );
        assert_eq!(parse_csv("nothing useful"), None);
    }

    #[test]
    fn keys_have_tollgate_shape() {
        let ceiling = Ceiling {
            backend: Backend::Redis,
            algorithm: Algorithm::Log,
            entry_key: "log_s1_0".into(),
            concurrency: 8,
            keys: 100,
        };
        assert_eq!(
            ceiling.keys_argument(),
            [
                "tollgate:{bench|log_s1_0=__rand_int__@l60000}:l",
                "tollgate:{bench|log_s1_0=__rand_int__@l60000}:s"
            ]
        );
        let cluster = Ceiling {
            backend: Backend::RedisCluster,
            algorithm: Algorithm::Counter,
            ..ceiling
        };
        assert_eq!(
            cluster.keys_argument(),
            ["tollgate:{tag}bench|log_s1_0=__rand_int__@c60000:c"]
        );
        assert!(
            cluster
                .display()
                .starts_with("redis-benchmark -c 8 -r 100 --cluster EVALSHA <sha> 1")
        );
    }
}
