//! `instructions`: the instructions a call costs tollgate and the empty RLS server, counted by
//! valgrind's callgrind, so that two servers can be compared to the percent on a machine whose
//! timings drift by ten.
//!
//! Each server runs under `valgrind --tool=callgrind` with counting off. h2load sends it the
//! same request over and over (one descriptor value, answered OK, as in grpc-floor); after a
//! warm-up, `callgrind_control` turns counting on for a fixed number of calls and off again, and
//! the dump's total over the calls answered is the server's instructions per call. The servers:
//! the empty server (a stock tonic server), tollgate on the memory backend as it starts by
//! default, tollgate with one part turned off (the local over-limit cache, the per-limit
//! statistics), so that what each part costs a call is a difference measured in the same run,
//! and tollgate on one Redis (its own instructions only: redis-server is another process).
//!
//! Instructions are not time: callgrind counts only the server's own user-space instructions,
//! one thread at a time, so what the kernel does for a call, cache misses and waits on other
//! cores are not in them. They are what a change to the code changes, and they do not drift:
//! runs of one build agree to a fraction of a percent.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::doc::{Align, Table, count, count_range, median, opening, plural, range};
use crate::empty::EmptyProcess;
use crate::h2load::{H2Load, H2LoadOptions};
use crate::scenario::{
    Algorithm, Bench, DOMAIN, Scenario, ScenarioName, UNREACHABLE_LIMIT, conditions_of, policy,
    runs_of, say,
};
use crate::stand::{Backend, MeasuredServer, Stand};

/// The calls counted per server in a smoke run.
const QUICK_CALLS: u64 = 500;

/// How long a dump may take to appear once asked for.
const DUMP_TIMEOUT: Duration = Duration::from_secs(60);

/// tollgate's backend deadline under callgrind, which runs a program some fifty times slower.
const UNDER_VALGRIND_DEADLINE: &str = "60s";

/// The options of `instructions`.
#[derive(Debug, Clone, clap::Args)]
pub struct InstructionsOptions {
    /// Calls counted per server and run (a smoke run counts at most 500).
    #[arg(long, default_value_t = 20_000, value_parser = clap::value_parser!(u64).range(100..=10_000_000))]
    pub calls: u64,

    /// How h2load sends them.
    #[command(flatten)]
    pub h2load: H2LoadOptions,
}

/// The `instructions` scenario.
pub struct Instructions {
    options: InstructionsOptions,
}

impl Instructions {
    /// The scenario with `options`.
    pub fn new(options: InstructionsOptions) -> Instructions {
        Instructions { options }
    }
}

/// Which server a run counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Server {
    /// The empty RLS server.
    Empty,
    /// tollgate on the memory backend, as it starts by default.
    Tollgate,
    /// The same, with `--local-cache-bytes 0`.
    TollgateNoLocalCache,
    /// The same, with `DISABLE_STATS=true`.
    TollgateNoStats,
    /// tollgate on one redis-server, as it starts by default.
    TollgateRedis,
}

impl Server {
    const ALL: [Server; 5] = [
        Server::Empty,
        Server::Tollgate,
        Server::TollgateNoLocalCache,
        Server::TollgateNoStats,
        Server::TollgateRedis,
    ];

    fn label(self) -> &'static str {
        match self {
            Server::Empty => "empty RLS server",
            Server::Tollgate => "tollgate, memory backend, defaults",
            Server::TollgateNoLocalCache => "tollgate, `--local-cache-bytes 0`",
            Server::TollgateNoStats => "tollgate, `DISABLE_STATS=true`",
            Server::TollgateRedis => "tollgate, one Redis, defaults",
        }
    }

    /// How this tollgate starts; `None` for the empty server.
    fn tollgate(self) -> Option<Start> {
        let start = |backend, extra, envs| {
            Some(Start {
                backend,
                extra,
                envs,
            })
        };
        match self {
            Server::Empty => None,
            Server::Tollgate => start(Backend::Memory, &[], &[]),
            Server::TollgateNoLocalCache => {
                start(Backend::Memory, &["--local-cache-bytes", "0"], &[])
            }
            Server::TollgateNoStats => start(Backend::Memory, &[], &[("DISABLE_STATS", "true")]),
            Server::TollgateRedis => start(Backend::Redis, &[], &[]),
        }
    }

    fn file_stem(self) -> &'static str {
        match self {
            Server::Empty => "empty",
            Server::Tollgate => "tollgate",
            Server::TollgateNoLocalCache => "tollgate-no-local-cache",
            Server::TollgateNoStats => "tollgate-no-stats",
            Server::TollgateRedis => "tollgate-redis",
        }
    }
}

/// How a counted tollgate starts: its backend, and the flags and environment it adds.
struct Start {
    backend: Backend,
    extra: &'static [&'static str],
    envs: &'static [(&'static str, &'static str)],
}

/// One counted run of one server.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct InstructionsRun {
    /// Which server.
    pub server: Server,
    /// Run number, from 1.
    pub run: u32,
    /// Calls answered while counting.
    pub calls: u64,
    /// Instructions the server executed while counting, all its threads.
    pub instructions: u64,
}

impl InstructionsRun {
    fn per_call(&self) -> f64 {
        self.instructions as f64 / self.calls.max(1) as f64
    }
}

const KEY: &str = "user";

impl Scenario for Instructions {
    fn name(&self) -> ScenarioName {
        ScenarioName::Instructions
    }

    fn unavailable(&self) -> Option<String> {
        callgrind_tools()
            .and_then(|_| H2Load::new(H2Load::one_descriptor(DOMAIN, KEY, "0")))
            .err()
            .map(|error| format!("{error:#}"))
    }

    fn run(&self, bench: &mut Bench) -> anyhow::Result<()> {
        let options = &self.options;
        let calls = if bench.scale.quick {
            options.calls.min(QUICK_CALLS)
        } else {
            options.calls
        };
        let h2load = H2Load::new(H2Load::one_descriptor(DOMAIN, KEY, "0"))?;
        let (valgrind, control) = callgrind_tools()?;
        let policy = policy(&[(KEY.to_owned(), Algorithm::Counter, UNREACHABLE_LIMIT, 1)]);
        bench.servers.ensure(Backend::Memory);
        bench.servers.ensure(Backend::Redis);
        let dumps = tempfile::Builder::new()
            .prefix("tollgate-bench-callgrind-")
            .tempdir()
            .context("creating a directory for callgrind's dumps")?;
        let (servers, tools) = bench.split();
        for run in 1..=tools.scale.runs {
            for server in Server::ALL {
                let out = dumps
                    .path()
                    .join(format!("{}-{run}.callgrind", server.file_stem()));
                let under = under_callgrind(&valgrind, &out);
                // Where tollgate decides on Redis, Redis counts its script calls: the proof that
                // every counted call was a decision.
                let start = server.tollgate();
                let redis = match &start {
                    Some(start) if start.backend != Backend::Memory => {
                        Some(servers.nodes(start.backend)?)
                    }
                    _ => None,
                };
                let process: Box<dyn MeasuredServer> = match start {
                    None => Box::new(EmptyProcess::start_under(&under)?),
                    Some(start) => {
                        // Under callgrind a call takes far longer than the default 50ms backend
                        // deadline allows at 128 calls in flight; a missed deadline answers by the
                        // failure mode, which h2load takes for a decision.
                        let mut extra: Vec<String> = vec![
                            "--backend-timeout".to_owned(),
                            UNDER_VALGRIND_DEADLINE.to_owned(),
                        ];
                        extra.extend(start.extra.iter().map(|flag| (*flag).to_owned()));
                        Box::new(Stand::start_under(
                            servers,
                            start.backend,
                            &policy,
                            "deny",
                            &extra,
                            start.envs,
                            &under,
                        )?)
                    }
                };
                let addr = process.grpc_addr();
                let pid = process.pid()?;
                let counted = || -> anyhow::Result<(u64, u64)> {
                    h2load.check_answered_ok(tools.loader, addr)?;
                    // Warm: connections made, tables and allocator caches filled.
                    h2load.run_calls(addr, (calls / 5).max(100), &options.h2load)?;
                    if let Some(nodes) = &redis {
                        nodes.reset_stats();
                    }
                    callgrind(&control, pid, "--instr=on")?;
                    let load = h2load.run_calls(addr, calls, &options.h2load)?;
                    callgrind(&control, pid, "--instr=off")?;
                    // A failed call's instructions would be counted as part of the others'.
                    if load.failed > 0 {
                        bail!("{} of the {} calls counted failed", load.failed, load.done);
                    }
                    if let Some(nodes) = &redis {
                        let scripts: u64 = nodes.script_calls()?.values().sum();
                        if scripts < load.succeeded {
                            bail!(
                                "only {scripts} of the {} calls counted ran their script on \
                                 Redis: the others were answered by the failure mode, which \
                                 h2load cannot tell from a decision",
                                load.succeeded
                            );
                        }
                    }
                    callgrind(&control, pid, "--dump")?;
                    Ok((load.succeeded, dumped_total(&out, &addr.to_string())?))
                };
                let (answered, instructions) = counted().with_context(|| {
                    format!(
                        "counting {} under callgrind:\n{}",
                        server.label(),
                        process.log()
                    )
                })?;
                drop(process);
                let record = InstructionsRun {
                    server,
                    run,
                    calls: answered,
                    instructions,
                };
                say(&format!(
                    "  instructions run {run} {}: {} a call",
                    server.label(),
                    count(Some(record.per_call())),
                ));
                tools.records.record("run", &record)?;
            }
        }
        Ok(())
    }

    fn render(&self, records: &[Value]) -> anyhow::Result<String> {
        render(records)
    }
}

/// valgrind and callgrind_control (`$TOLLGATE_VALGRIND`, `$TOLLGATE_CALLGRIND_CONTROL`, else
/// the ones on the `PATH`).
fn callgrind_tools() -> anyhow::Result<(PathBuf, PathBuf)> {
    let install = "it comes with the Debian package valgrind";
    Ok((
        crate::proc::find_tool("TOLLGATE_VALGRIND", "valgrind", install)?,
        crate::proc::find_tool("TOLLGATE_CALLGRIND_CONTROL", "callgrind_control", install)?,
    ))
}

/// The program and flags that run a process under `valgrind`'s callgrind with counting off
/// until turned on, its dumps written to `out` (`<out>.1`, ...).
fn under_callgrind(valgrind: &Path, out: &Path) -> Vec<String> {
    vec![
        valgrind.display().to_string(),
        "--quiet".to_owned(),
        "--tool=callgrind".to_owned(),
        "--instr-atstart=no".to_owned(),
        format!("--callgrind-out-file={}", out.display()),
    ]
}

/// Sends `command` (`--instr=on`, `--dump`, ...) to the callgrind of process `pid`.
fn callgrind(control: &Path, pid: u32, command: &str) -> anyhow::Result<()> {
    let output = Command::new(control)
        .arg(command)
        .arg(pid.to_string())
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {}", control.display()))?;
    if !output.status.success() {
        bail!(
            "callgrind_control {command} {pid} failed ({}): {}{}",
            output.status,
            String::from_utf8_lossy(&output.stdout).trim(),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(())
}

/// The total of the first dump callgrind wrote for `out` (`<out>.1`), once it is whole: the
/// file ends with its `totals:` line. `server` names the process counted, for errors.
fn dumped_total(out: &Path, server: &str) -> anyhow::Result<u64> {
    let mut dump = out.as_os_str().to_owned();
    dump.push(".1");
    let dump = PathBuf::from(dump);
    let deadline = Instant::now() + DUMP_TIMEOUT;
    loop {
        if let Ok(text) = std::fs::read_to_string(&dump)
            && let Some(total) = text.lines().find_map(|line| line.strip_prefix("totals:"))
        {
            return total
                .trim()
                .parse()
                .with_context(|| format!("the totals of {}: {total:?}", dump.display()));
        }
        if Instant::now() >= deadline {
            bail!(
                "callgrind wrote no whole dump of {server} to {} within {DUMP_TIMEOUT:?}",
                dump.display()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The instructions section of the report.
pub fn render(records: &[Value]) -> anyhow::Result<String> {
    let conditions = conditions_of(records)?;
    let runs: Vec<InstructionsRun> = runs_of(records, "instructions")?;
    let calls = median(runs.iter().map(|r| r.calls as f64));
    let mut out = String::new();
    let scale = format!(
        "Each server was counted in {} run{}; the table gives the median and the min–max.",
        conditions.runs,
        plural(u64::from(conditions.runs)),
    );
    let _ = writeln!(
        out,
        "### Instructions per call, counted\n\n{} Each server runs under valgrind's callgrind; \
         h2load sends it the request of grpc-floor's h2load runs (one descriptor value, \
         answered OK) and, after a warm-up of a fifth as many calls, callgrind counts the \
         server's instructions over {} calls. tollgate runs with a backend deadline of {} \
         (callgrind slows a program some fifty times), and on Redis a count stands only if \
         Redis ran a script for every call counted, so no answer of the failure mode passes \
         for a decision. Counted are the server process's own user-space instructions, every \
         thread, one at a time: not the kernel's work for a call, not cache misses, not waits \
         on other cores. They are what a change to the code changes, and runs of one build \
         agree to a fraction of a percent, where timings here drift by ten.\n",
        opening(&conditions, &scale),
        count(calls),
        UNDER_VALGRIND_DEADLINE,
    );
    render_counts(&runs, &mut out);
    Ok(out)
}

/// The instructions per call of each run `picks` takes from `runs`, as `per_call` reads them.
fn per_call_of<T>(
    runs: &[T],
    picks: impl Fn(&T) -> bool,
    per_call: impl Fn(&T) -> f64,
) -> Vec<f64> {
    runs.iter().filter(|r| picks(r)).map(per_call).collect()
}

/// The table of instructions per call, the ratio, and what each part costs.
fn render_counts(runs: &[InstructionsRun], out: &mut String) {
    let values_of =
        |server: Server| per_call_of(runs, |r| r.server == server, InstructionsRun::per_call);
    let per_call = |server: Server| median(values_of(server));
    let empty = per_call(Server::Empty);
    let mut table = Table::new(&[
        ("server", Align::Left),
        ("instructions/call", Align::Right),
        ("min–max", Align::Right),
        ("beside the empty server", Align::Right),
    ]);
    for server in Server::ALL {
        let values = values_of(server);
        let own = median(values.iter().copied());
        let beside = match (own, empty) {
            (Some(own), Some(empty)) if server != Server::Empty && own < empty => {
                format!("-{}", count(Some(empty - own)))
            }
            (Some(own), Some(empty)) if server != Server::Empty => {
                format!("+{}", count(Some(own - empty)))
            }
            _ => "–".to_owned(),
        };
        table.row(vec![
            server.label().to_owned(),
            count(own),
            count_range(range(values.iter().copied())),
            beside,
        ]);
    }
    out.push_str(&table.render());
    if let (Some(tollgate), Some(empty)) = (per_call(Server::Tollgate), empty) {
        let _ = writeln!(
            out,
            "\nempty server ÷ tollgate, in instructions per call: {:.3} (the kernel's share of a \
             call, the same for both, brings a timed ratio closer to 1).",
            empty / tollgate,
        );
    }
    // What each part costs, as differences of the same run, in one sentence.
    let tollgate = per_call(Server::Tollgate);
    let difference = |with: Option<f64>, without: Option<f64>, what: &str| {
        with.zip(without)
            .map(|(with, without)| format!("{what} {}", count(Some(with - without))))
    };
    let parts: Vec<String> = [
        difference(
            tollgate,
            per_call(Server::TollgateNoLocalCache),
            "the local over-limit cache (on by default with the memory backend)",
        ),
        difference(
            tollgate,
            per_call(Server::TollgateNoStats),
            "the per-limit statistics",
        ),
        difference(
            per_call(Server::TollgateRedis),
            tollgate,
            "one Redis in place of the memory backend (tollgate's own instructions: the Redis \
             client, its connection's task, the script call; not redis-server's)",
        ),
    ]
    .into_iter()
    .flatten()
    .collect();
    if !parts.is_empty() {
        let _ = writeln!(
            out,
            "\nWhat parts of the decision cost a call, by difference: {}.",
            parts.join("; ")
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(server: Server, run: u32, instructions: u64) -> InstructionsRun {
        InstructionsRun {
            server,
            run,
            calls: 1_000,
            instructions,
        }
    }

    #[test]
    fn renders_each_server_beside_the_empty_one_and_the_parts_by_difference() {
        let mut runs = Vec::new();
        for r in 1..=3 {
            runs.push(run(Server::Empty, r, 50_000_000 + u64::from(r) * 1_000));
            runs.push(run(Server::Tollgate, r, 60_000_000));
            runs.push(run(Server::TollgateNoLocalCache, r, 59_000_000));
            runs.push(run(Server::TollgateNoStats, r, 59_500_000));
            runs.push(run(Server::TollgateRedis, r, 75_000_000));
        }
        let mut section = String::new();
        render_counts(&runs, &mut section);
        assert!(
            section.contains(
                "| tollgate, memory backend, defaults | 60,000 | 60,000–60,000 | +9,998 |"
            ),
            "{section}"
        );
        assert!(
            section.contains("| empty RLS server | 50,002 | 50,001–50,003 | – |"),
            "{section}"
        );
        assert!(
            section.contains("in instructions per call: 0.833 ("),
            "{section}"
        );
        assert!(
            section.contains(
                "the local over-limit cache (on by default with the memory backend) 1,000;"
            ),
            "{section}"
        );
        assert!(
            section.contains("the per-limit statistics 500;"),
            "{section}"
        );
        assert!(section.contains("not redis-server's) 15,000."), "{section}");
    }
}
