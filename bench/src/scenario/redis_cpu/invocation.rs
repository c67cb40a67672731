//! How a decision reaches its script, measured on the single server with redis-benchmark: the
//! decision code of each algorithm (the file tollgate embeds) called by `EVALSHA` with one limit
//! a call, by `FCALL` with one limit a call (a Redis function library holding the same code), by
//! `EVALSHA` with one limit a call and two calls sent together (what tollgate sends for a request
//! of two limits: one pipeline), and by `EVALSHA` deciding two limits of one request in one call.
//! The last does nothing between its two decisions, so it is the most that one call for all of a
//! request's limits could save beside the pipeline.
//!
//! Every variant runs the same code: the script's text becomes the body of one Lua function,
//! `decide(KEYS, ARGV)`, and each variant calls it, deriving the script's keys from the one key it
//! is given (`<identity>:c` for the counter; `<identity>:l` and `<identity>:s` for the log, so the
//! log and its sum always belong together, which redis-benchmark's independent `__rand_int__`s
//! would not give); the call of two limits is given two keys, each drawn on its own. Every
//! variant of every run starts on keys of its own, so each spreads the same number of limits
//! over the same number of limiters, and none inherits the entries another's logs hold (a
//! log's commands cost more the more entries it has). Two measures per run: Redis's own accounting of the script (`INFO
//! commandstats`, the time inside `evalsha` or `fcall`), and the redis-server process's CPU from
//! its `INFO cpu`, which adds what a call costs around the script: reading, parsing, dispatching
//! and answering it.

use std::fmt::Write as _;

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};

use super::{benchmark_server, load_script};
use crate::ceiling::{hit_arguments, key_suffixes, script};
use crate::doc::{Align, Table, count, fixed, median, times_by_run};
use crate::scenario::{Algorithm, DOMAIN, WINDOW_MS, distinct, run_ratios};
use crate::stand::{KEY_PREFIX, Nodes};

/// How the decision code is called.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Invocation {
    /// `EVALSHA` of a script deciding one limit: what tollgate sends today.
    Evalsha,
    /// `FCALL` of a function deciding one limit.
    Fcall,
    /// `EVALSHA` of a script deciding one limit, two calls sent together on each connection.
    EvalshaPipelined,
    /// `EVALSHA` of a script deciding two limits in one call.
    EvalshaTwo,
}

impl Invocation {
    /// Every variant, in the order they are measured and shown.
    pub const ALL: [Invocation; 4] = [
        Invocation::Evalsha,
        Invocation::Fcall,
        Invocation::EvalshaPipelined,
        Invocation::EvalshaTwo,
    ];

    fn name(self) -> &'static str {
        match self {
            Invocation::Evalsha => "EVALSHA, one limit a call",
            Invocation::Fcall => "FCALL, one limit a call",
            Invocation::EvalshaPipelined => "EVALSHA, one limit a call, two pipelined",
            Invocation::EvalshaTwo => "EVALSHA, two limits a call",
        }
    }

    fn limits_per_call(self) -> u64 {
        match self {
            Invocation::EvalshaTwo => 2,
            Invocation::Evalsha | Invocation::Fcall | Invocation::EvalshaPipelined => 1,
        }
    }

    /// Calls each connection sends together before it waits for their answers.
    fn pipeline(self) -> u32 {
        match self {
            Invocation::EvalshaPipelined => 2,
            Invocation::Evalsha | Invocation::Fcall | Invocation::EvalshaTwo => 1,
        }
    }

    /// The command's name in `INFO commandstats`.
    fn command(self) -> &'static str {
        match self {
            Invocation::Fcall => "fcall",
            Invocation::Evalsha | Invocation::EvalshaPipelined | Invocation::EvalshaTwo => {
                "evalsha"
            }
        }
    }
}

/// One measured run of one variant.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct InvocationRun {
    /// Whose decision code.
    pub algorithm: Algorithm,
    /// How it was called.
    pub invocation: Invocation,
    /// Run number, from 1.
    pub run: u32,
    /// Calls Redis served.
    pub calls: u64,
    /// Microseconds Redis accounted inside those calls.
    pub script_usec: u64,
    /// CPU seconds of the redis-server process over the run.
    pub redis_cpu_seconds: f64,
    /// Wall-clock seconds of the run.
    pub elapsed_seconds: f64,
}

impl InvocationRun {
    fn limits(&self) -> u64 {
        self.calls * self.invocation.limits_per_call()
    }

    pub fn script_usec_per_call(&self) -> Option<f64> {
        (self.calls > 0).then(|| self.script_usec as f64 / self.calls as f64)
    }

    fn script_usec_per_limit(&self) -> Option<f64> {
        (self.limits() > 0).then(|| self.script_usec as f64 / self.limits() as f64)
    }

    fn process_usec_per_limit(&self) -> Option<f64> {
        (self.limits() > 0).then(|| self.redis_cpu_seconds * 1e6 / self.limits() as f64)
    }

    fn limits_per_second(&self) -> Option<f64> {
        (self.elapsed_seconds > 0.0).then(|| self.limits() as f64 / self.elapsed_seconds)
    }
}

/// `algorithm`'s script as the body of `local function decide(KEYS, ARGV)`: the parameters
/// shadow the globals, so the text runs unchanged, its top-level `return` becoming the
/// function's.
fn decide(algorithm: Algorithm) -> String {
    format!(
        "local function decide(KEYS, ARGV)\n{}\nend\n",
        script(algorithm)
    )
}

/// A Lua table of `algorithm`'s keys derived from the Lua expression `base`.
fn keys_from(algorithm: Algorithm, base: &str) -> String {
    let keys: Vec<String> = key_suffixes(algorithm)
        .iter()
        .map(|suffix| format!("{base} .. '{suffix}'"))
        .collect();
    format!("{{{}}}", keys.join(", "))
}

/// The name of `algorithm`'s function library and of its one function.
fn function_name(algorithm: Algorithm) -> String {
    format!("tollgate_bench_{}", algorithm.name())
}

/// The Lua source each variant loads for `algorithm`.
pub fn source(algorithm: Algorithm, invocation: Invocation) -> String {
    let decide = decide(algorithm);
    match invocation {
        Invocation::Evalsha | Invocation::EvalshaPipelined => format!(
            "{decide}return decide({}, ARGV)",
            keys_from(algorithm, "KEYS[1]")
        ),
        Invocation::EvalshaTwo => format!(
            "{decide}return {{ decide({}, ARGV), decide({}, ARGV) }}",
            keys_from(algorithm, "KEYS[1]"),
            keys_from(algorithm, "KEYS[2]")
        ),
        Invocation::Fcall => {
            let name = function_name(algorithm);
            format!(
                "#!lua name={name}\n{decide}redis.register_function('{name}', \
                 function(keys, args) return decide({}, args) end)",
                keys_from(algorithm, "keys[1]")
            )
        }
    }
}

/// The key redis-benchmark sends: tollgate's identity of one descriptor value, hash tag
/// included, without the suffix the script adds, in the key space `space` (one per variant and
/// run).
fn key(algorithm: Algorithm, space: &str) -> String {
    let tag = match algorithm {
        Algorithm::Counter => 'c',
        Algorithm::Log => 'l',
    };
    format!("{KEY_PREFIX}{space}:{{{DOMAIN}|user=__rand_int__@{tag}{WINDOW_MS}}}")
}

/// Loads every variant of `algorithm` on the single server and answers the head of the command
/// redis-benchmark repeats for each (up to its keys, which `command` adds).
fn commands(
    nodes: &Nodes<'_>,
    algorithm: Algorithm,
) -> anyhow::Result<Vec<(Invocation, Vec<String>)>> {
    let server = nodes.masters().first().context("no Redis server")?;
    let mut out = Vec::new();
    for invocation in Invocation::ALL {
        let text = source(algorithm, invocation);
        let head = match invocation {
            Invocation::Fcall => {
                let name = function_name(algorithm);
                let answer = server.cli(&["FUNCTION", "LOAD", "REPLACE", &text]);
                if answer != name {
                    bail!("FUNCTION LOAD of {name} answered `{answer}`");
                }
                vec!["FCALL".to_owned(), name]
            }
            Invocation::Evalsha | Invocation::EvalshaPipelined | Invocation::EvalshaTwo => {
                let what = format!("the {} script, {}", algorithm.name(), invocation.name());
                let sha = load_script(server, &text, &what)?;
                vec!["EVALSHA".to_owned(), sha]
            }
        };
        out.push((invocation, head));
    }
    Ok(out)
}

/// The whole command of `invocation` after its `head`: its keys in the key space `space`, then
/// `limit`, window and cost 1.
fn command(
    head: &[String],
    algorithm: Algorithm,
    invocation: Invocation,
    space: &str,
) -> Vec<String> {
    let keys = invocation.limits_per_call();
    let mut command = head.to_vec();
    command.push(keys.to_string());
    command.extend((0..keys).map(|_| key(algorithm, space)));
    command.extend(hit_arguments());
    command
}

/// Measures every variant of both algorithms `runs` times, interleaved within each run, with
/// `requests` calls of one limit (half as many of two) a run, on `concurrency` connections.
pub fn measure(
    nodes: &Nodes<'_>,
    concurrency: u32,
    runs: u32,
    requests: u64,
) -> anyhow::Result<Vec<InvocationRun>> {
    let server = nodes.masters().first().context("no Redis server")?;
    let mut variants = Vec::new();
    for algorithm in [Algorithm::Counter, Algorithm::Log] {
        for (invocation, head) in commands(nodes, algorithm)? {
            variants.push((algorithm, invocation, head));
        }
    }
    let mut out = Vec::new();
    for run in 1..=runs {
        for (variant, (algorithm, invocation, head)) in variants.iter().enumerate() {
            let space = format!("run{run}-{variant}");
            let command = command(head, *algorithm, *invocation, &space);
            let arguments: Vec<&str> = command.iter().map(String::as_str).collect();
            let calls = requests / invocation.limits_per_call();
            let measured = benchmark_server(
                server,
                concurrency,
                invocation.pipeline(),
                calls,
                &arguments,
            )?;
            let stat = measured
                .stats
                .get(invocation.command())
                .copied()
                .filter(|stat| stat.calls > 0)
                .with_context(|| format!("redis-benchmark ran no `{}`", invocation.command()))?;
            out.push(InvocationRun {
                algorithm: *algorithm,
                invocation: *invocation,
                run,
                calls: stat.calls,
                script_usec: stat.usec,
                redis_cpu_seconds: measured.redis_cpu_seconds,
                elapsed_seconds: measured.elapsed_seconds,
            });
        }
    }
    server.cli(&["FUNCTION", "FLUSH"]);
    Ok(out)
}

/// The report's table of the variants and the ratios that decide between them.
pub fn render(runs: &[InvocationRun], out: &mut String) {
    let _ = writeln!(
        out,
        "#### How the script is called\n\n\
         The decision code of each algorithm (its script's text as the body of one Lua function) \
         called four ways on the single server with redis-benchmark, with as many connections, \
         on 10,000 keys under a limit no load reaches: `EVALSHA` deciding one limit a call, one \
         call in flight per connection (what tollgate sends for a request of one limit); `FCALL` \
         of a Redis function holding the same code, likewise; `EVALSHA` deciding one limit a \
         call, two calls sent together per connection (what tollgate sends for a request of two \
         limits: one pipeline); and `EVALSHA` deciding two limits in one call, one call in \
         flight per connection, which does nothing between the two decisions: the most that one \
         call for all of a request's limits could save. Each variant of each run starts on keys \
         of its own, so every variant spreads as many limits over as many limiters (a log's \
         commands cost more the more entries it holds). *In the script*: Redis's own accounting \
         (`INFO commandstats`); *process*: redis-server's CPU from its `INFO cpu`, which adds \
         reading, parsing and answering the calls.\n"
    );
    let mut table = Table::new(&[
        ("algorithm", Align::Left),
        ("invocation", Align::Left),
        ("limits/s", Align::Right),
        ("µs per call, in the script", Align::Right),
        ("µs per limit, in the script", Align::Right),
        ("µs per limit, process", Align::Right),
    ]);
    for (algorithm, invocation) in distinct(runs.iter().map(|r| (r.algorithm, r.invocation))) {
        let of: Vec<&InvocationRun> = runs
            .iter()
            .filter(|r| (r.algorithm, r.invocation) == (algorithm, invocation))
            .collect();
        table.row(vec![
            algorithm.name().to_owned(),
            invocation.name().to_owned(),
            count(median(of.iter().filter_map(|r| r.limits_per_second()))),
            fixed(
                median(of.iter().filter_map(|r| r.script_usec_per_call())),
                2,
            ),
            fixed(
                median(of.iter().filter_map(|r| r.script_usec_per_limit())),
                2,
            ),
            fixed(
                median(of.iter().filter_map(|r| r.process_usec_per_limit())),
                2,
            ),
        ]);
    }
    out.push_str(&table.render());
    for algorithm in distinct(runs.iter().map(|r| r.algorithm)) {
        let of: Vec<&InvocationRun> = runs.iter().filter(|r| r.algorithm == algorithm).collect();
        let ratio = |numerator: Invocation,
                     denominator: Invocation,
                     measure: fn(&InvocationRun) -> Option<f64>| {
            times_by_run(&run_ratios(
                &of,
                |r| r.run,
                |r| r.invocation == numerator,
                |r| r.invocation == denominator,
                |r| measure(r).unwrap_or(f64::NAN),
            ))
        };
        let (script, process) = (
            InvocationRun::script_usec_per_limit as fn(&InvocationRun) -> Option<f64>,
            InvocationRun::process_usec_per_limit as fn(&InvocationRun) -> Option<f64>,
        );
        let (one, fcall) = (Invocation::Evalsha, Invocation::Fcall);
        let (pipelined, two) = (Invocation::EvalshaPipelined, Invocation::EvalshaTwo);
        let _ = write!(
            out,
            "\n{}, Redis CPU per limit, the median of the runs' ratios: `FCALL` against `EVALSHA`, \
             one limit a call, {} in the script, {} in the process; two limits a call against \
             one limit a call, two pipelined, {} in the script, {} in the process.\n",
            algorithm.name(),
            ratio(fcall, one, script),
            ratio(fcall, one, process),
            ratio(two, pipelined, script),
            ratio(two, pipelined, process),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_variant_calls_the_same_decision_on_keys_of_one_identity() {
        let evalsha = source(Algorithm::Log, Invocation::Evalsha);
        assert!(evalsha.starts_with("local function decide(KEYS, ARGV)\n"));
        assert!(evalsha.ends_with("return decide({KEYS[1] .. ':l', KEYS[1] .. ':s'}, ARGV)"));
        // The pipelined variant sends the same script, two calls at a time.
        assert_eq!(
            source(Algorithm::Log, Invocation::EvalshaPipelined),
            evalsha
        );
        assert_eq!(Invocation::EvalshaPipelined.pipeline(), 2);
        assert_eq!(Invocation::EvalshaTwo.limits_per_call(), 2);
        let two = source(Algorithm::Counter, Invocation::EvalshaTwo);
        let fcall = source(Algorithm::Counter, Invocation::Fcall);
        assert!(fcall.starts_with("#!lua name=tollgate_bench_counter\n"));
        assert!(fcall.ends_with(
            "redis.register_function('tollgate_bench_counter', function(keys, args) \
             return decide({keys[1] .. ':c'}, args) end)"
        ));
        assert!(two.ends_with(
            "return { decide({KEYS[1] .. ':c'}, ARGV), decide({KEYS[2] .. ':c'}, ARGV) }"
        ));
        assert_eq!(
            command(
                &["EVALSHA".to_owned(), "sha".to_owned()],
                Algorithm::Counter,
                Invocation::EvalshaTwo,
                "run1-3"
            ),
            [
                "EVALSHA",
                "sha",
                "2",
                "tollgate:run1-3:{bench|user=__rand_int__@c60000}",
                "tollgate:run1-3:{bench|user=__rand_int__@c60000}",
                "4000000000",
                "60000",
                "1"
            ]
        );
    }
}
