//! The instructions one script call costs redis-server, counted by callgrind: each algorithm's
//! decision beside the floors `redis-cpu` times, and beside the log's commands laid out in one
//! key, so that what the decision code adds to its commands, and what another key layout would
//! save, are differences that do not drift with the machine.
//!
//! Each script gets a redis-server of its own under `valgrind --tool=callgrind`, counting off.
//! redis-benchmark sends it the script's call (one call in flight per connection, values of
//! `__rand_int__` below 10,000) as a warm-up, then the counted calls with counting on; the
//! dump's total over the calls is the server's instructions per call: the script and its
//! commands, and also reading, parsing and answering the call, the work `INFO commandstats`
//! leaves out. A count stands only if every call counted ran the script and none answered an
//! error.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::bail;
use serde::{Deserialize, Serialize};
use tollgate_testkit::redis::RedisServer;

use super::{callgrind, dumped_total, per_call_of, under_callgrind};
use crate::ceiling::hit_arguments;
use crate::doc::{Align, Table, count, count_range, median, range};
use crate::scenario::Algorithm;
use crate::scenario::redis_cpu::invocation::{Invocation, source};
use crate::scenario::redis_cpu::{
    LOG_COMMANDS_SCRIPT, MINIMAL_SCRIPT, benchmark_server, load_script,
};

/// Connections redis-benchmark opens, one call in flight each.
pub const CONNECTIONS: u32 = 16;

/// The calls sent before counting in a full run: three a key on average, so that nearly every
/// key exists (all but one in twenty, if drawn at random, about e^-3) and what is counted is
/// the steady work on keys that hold data, not their creation.
pub const WARM_UP_CALLS: u64 = 30_000;

/// The log's commands with its sum and last id kept in the sorted set itself, as two members
/// scored below every entry (the negated sum and the negated id), so that one key, one `ZADD`
/// and one `PEXPIRE` do what two keys, a `ZADD`, an `HSET` and two `PEXPIRE`s do: the least a
/// one-key layout of the log could cost. Entries are read from score 0 up, past the two members.
const LOG_ONE_KEY_SCRIPT: &str = "local log = KEYS[1] \
     local t = redis.call('TIME') \
     local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) \
     redis.call('ZRANGEBYSCORE', log, '0', string.format('%d', now - 60000)) \
     local state = redis.call('ZMSCORE', log, 's', 'q') \
     local id = (tonumber(state[2]) or -now * 1000) - 1 \
     redis.call('ZADD', log, string.format('%d', now), string.format('%d:1', -id), \
       string.format('%d', (tonumber(state[1]) or 0) - 1), 's', string.format('%d', id), 'q') \
     redis.call('PEXPIRE', log, '65000') return 1";

/// A script whose calls are counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Script {
    /// `redis-cpu`'s minimal script: `TIME`, `HINCRBY`, `PEXPIRE`.
    Minimal,
    /// The commands an admitted hit of the log runs, no decision.
    LogCommands,
    /// The same in one key, no decision.
    LogCommandsOneKey,
    /// The counter's decision (`lua/counter.lua`), admitted.
    Counter,
    /// The log's decision (`lua/log.lua`), admitted.
    Log,
}

impl Script {
    /// Every script, in the order they are counted and shown.
    pub const ALL: [Script; 5] = [
        Script::Minimal,
        Script::LogCommands,
        Script::LogCommandsOneKey,
        Script::Counter,
        Script::Log,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Script::Minimal => "minimal script (TIME, HINCRBY, PEXPIRE)",
            Script::LogCommands => "the log's commands, no decision",
            Script::LogCommandsOneKey => "the log's commands in one key, no decision",
            Script::Counter => "the counter's decision (lua/counter.lua), admitted",
            Script::Log => "the log's decision (lua/log.lua), admitted",
        }
    }

    fn file_stem(self) -> &'static str {
        match self {
            Script::Minimal => "minimal",
            Script::LogCommands => "log-commands",
            Script::LogCommandsOneKey => "log-one-key",
            Script::Counter => "counter",
            Script::Log => "log",
        }
    }

    /// The script's text. A decision is the file tollgate embeds, run as `redis-cpu` runs it
    /// with redis-benchmark: as one Lua function whose keys derive from the one key sent.
    fn source(self) -> String {
        match self {
            Script::Minimal => MINIMAL_SCRIPT.to_owned(),
            Script::LogCommands => LOG_COMMANDS_SCRIPT.to_owned(),
            Script::LogCommandsOneKey => LOG_ONE_KEY_SCRIPT.to_owned(),
            Script::Counter => source(Algorithm::Counter, Invocation::Evalsha),
            Script::Log => source(Algorithm::Log, Invocation::Evalsha),
        }
    }

    /// The arguments after the key: for a decision, what tollgate sends for an ordinary hit of
    /// cost 1 under a limit no load reaches (limit, window and cost; the options after the cost
    /// are 0 and left out).
    fn arguments(self) -> Vec<String> {
        match self {
            Script::Minimal | Script::LogCommands | Script::LogCommandsOneKey => Vec::new(),
            Script::Counter | Script::Log => hit_arguments().to_vec(),
        }
    }
}

/// One counted run of one script.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ScriptRun {
    /// Which script.
    pub script: Script,
    /// Run number, from 1.
    pub run: u32,
    /// Calls counted.
    pub calls: u64,
    /// Calls sent before counting.
    pub warm_up: u64,
    /// Instructions redis-server executed over them.
    pub instructions: u64,
}

impl ScriptRun {
    pub fn per_call(&self) -> f64 {
        self.instructions as f64 / self.calls.max(1) as f64
    }
}

/// How many calls to send, before counting and while counting.
#[derive(Debug, Clone, Copy)]
pub struct Calls {
    /// Sent first, not counted.
    pub warm_up: u64,
    /// Counted.
    pub counted: u64,
}

/// Counts `calls.counted` calls of `script` on a redis-server of its own under `valgrind`
/// (callgrind, steered by `control`), its dump written in `dumps`.
pub fn count_script(
    valgrind: &Path,
    control: &Path,
    dumps: &Path,
    script: Script,
    run: u32,
    calls: Calls,
) -> anyhow::Result<ScriptRun> {
    let Calls { warm_up, counted } = calls;
    let out = dumps.join(format!("redis-{}-{run}.callgrind", script.file_stem()));
    let server = RedisServer::start_under(&under_callgrind(valgrind, &out));
    let Some(pid) = server.pid() else {
        bail!("redis-server under callgrind is not running");
    };
    let sha = load_script(&server, &script.source(), script.label())?;
    let key = format!("tollgate-bench:{{{}:__rand_int__}}", script.file_stem());
    let arguments = script.arguments();
    let mut command = vec!["EVALSHA", sha.as_str(), "1", key.as_str()];
    command.extend(arguments.iter().map(String::as_str));
    // Warm: the script compiled, the keys made, the allocator's caches filled.
    benchmark_server(&server, CONNECTIONS, 1, warm_up, &command)?;
    callgrind(control, pid, "--instr=on")?;
    let run_counted = benchmark_server(&server, CONNECTIONS, 1, counted, &command);
    callgrind(control, pid, "--instr=off")?;
    let stats = run_counted?.stats;
    let evalsha = stats.get("evalsha").copied().unwrap_or_default();
    if evalsha.calls != counted || evalsha.failed_calls > 0 {
        bail!(
            "{}: Redis ran {} of the {counted} calls counted, {} of them failed",
            script.label(),
            evalsha.calls,
            evalsha.failed_calls
        );
    }
    callgrind(control, pid, "--dump")?;
    let instructions = dumped_total(&out, &format!("redis-server :{}", server.port()))?;
    Ok(ScriptRun {
        script,
        run,
        calls: counted,
        warm_up,
        instructions,
    })
}

/// The table of instructions per script call, and what the differences say.
pub fn render_scripts(runs: &[ScriptRun], out: &mut String) {
    let values_of = |script: Script| per_call_of(runs, |r| r.script == script, ScriptRun::per_call);
    let per_call = |script: Script| median(values_of(script));
    let commands = per_call(Script::LogCommands);
    let mut table = Table::new(&[
        ("script", Align::Left),
        ("instructions/call", Align::Right),
        ("min–max", Align::Right),
        ("÷ the log's commands", Align::Right),
    ]);
    for script in Script::ALL {
        let values = values_of(script);
        let own = median(values.iter().copied());
        let ratio = match (own, commands) {
            (Some(own), Some(commands)) if commands > 0.0 => format!("{:.2}", own / commands),
            _ => "–".to_owned(),
        };
        table.row(vec![
            script.label().to_owned(),
            count(own),
            count_range(range(values.iter().copied())),
            ratio,
        ]);
    }
    out.push_str(&table.render());
    out.push('\n');
    let difference = |a: Script, b: Script| match (per_call(a), per_call(b)) {
        (Some(a), Some(b)) if a >= b => format!("{} more", count(Some(a - b))),
        (Some(a), Some(b)) => format!("{} fewer", count(Some(b - a))),
        _ => "–".to_owned(),
    };
    let _ = writeln!(
        out,
        "- the log's decision code, beside its commands alone: {} instructions a call.\n\
         - the log's commands in one key, beside the two keys tollgate uses: {} instructions a \
         call.\n\
         - the counter's decision, beside the minimal script: {} instructions a call.",
        difference(Script::Log, Script::LogCommands),
        difference(Script::LogCommandsOneKey, Script::LogCommands),
        difference(Script::Counter, Script::Minimal),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(script: Script, run: u32, instructions: u64) -> ScriptRun {
        ScriptRun {
            script,
            run,
            calls: 1_000,
            warm_up: 3_000,
            instructions,
        }
    }

    #[test]
    fn renders_each_script_beside_the_logs_commands() {
        let mut runs = Vec::new();
        for r in 1..=3 {
            runs.push(run(Script::Minimal, r, 60_000_000));
            runs.push(run(
                Script::LogCommands,
                r,
                85_000_000 + u64::from(r) * 1_000,
            ));
            runs.push(run(Script::LogCommandsOneKey, r, 84_000_000));
            runs.push(run(Script::Counter, r, 72_000_000));
            runs.push(run(Script::Log, r, 110_000_000));
        }
        let mut section = String::new();
        render_scripts(&runs, &mut section);
        for line in [
            "| the log's commands, no decision | 85,002 | 85,001–85,003 | 1.00 |",
            "| the log's commands in one key, no decision | 84,000 | 84,000–84,000 | 0.99 |",
            "| the log's decision (lua/log.lua), admitted | 110,000 | 110,000–110,000 | 1.29 |",
            "- the log's decision code, beside its commands alone: 24,998 more instructions",
            "beside the two keys tollgate uses: 1,002 fewer instructions a call.",
            "- the counter's decision, beside the minimal script: 12,000 more instructions",
        ] {
            assert!(section.contains(line), "no `{line}` in:\n{section}");
        }
    }
}
