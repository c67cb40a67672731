//! The Lua scripts of `lua/`, their hashes, and the translation between hits and script calls.

use std::io::Write as _;
use std::time::Duration;

use redis::{Cmd, RedisWrite as _, Value};

use crate::backend::{BackendError, Hit, Outcome, Receipt, lease};
use crate::window::{self, Algorithm, Cost, Counting, Verdict};

use super::keys::{COUNTER_KEYS, KeySpace, LOG_KEYS};

/// The largest limit the scripts compute with exactly (Lua numbers are doubles); larger limits
/// are treated as this one, which no real traffic reaches.
pub const MAX_LIMIT: u64 = (1 << 53) - 1;

/// The longest window the scripts accept, in milliseconds (about 34 years).
pub const MAX_WINDOW_MS: u64 = 1 << 40;

/// One Lua script and its SHA1, the name `EVALSHA` knows it by.
#[derive(Debug, Clone)]
pub struct Script {
    /// The script's text, what `EVAL` sends.
    pub(super) code: &'static str,
    /// Its SHA1 in hex, what `EVALSHA` names.
    pub(super) hash: String,
}

impl Script {
    fn new(code: &'static str) -> Script {
        Script {
            code,
            hash: redis::Script::new(code).get_hash().to_owned(),
        }
    }
}

/// The scripts, with their SHA1 hashes computed once at startup, and the refund horizon their
/// tentative charges get.
#[derive(Debug, Clone)]
pub struct Scripts {
    counter: Script,
    log: Script,
    counter_refund: Script,
    log_refund: Script,
    /// The limits of one descriptor decided together (`lua/group.lua`, made by `group_script!`).
    group: Script,
    /// Reads a window without writing (`lua/peek.lua`).
    peek: Script,
    /// Deletes a window's keys (`lua/clear.lua`).
    clear: Script,
    /// How long a tentative charge of a request stays refundable ([`refund_horizon_ms`]).
    horizon_ms: u64,
}

/// Each script with the refundable tally's definitions before it (`lua/refundable.lua`).
macro_rules! script_with_tally {
    ($file:literal) => {
        concat!(
            include_str!("../../../lua/refundable.lua"),
            include_str!(concat!("../../../lua/", $file))
        )
    };
}

/// One script with the refundable tally's definitions before it, wrapped as the local function
/// `$name` of (KEYS, ARGV): its body runs unchanged, its `return` answering the function.
macro_rules! wrapped {
    ($name:literal, $file:literal) => {
        concat!(
            "local ",
            $name,
            " = function(KEYS, ARGV)\n",
            script_with_tally!($file),
            "\nend\n"
        )
    };
}

/// The group script: every acquire and refund script wrapped as a function, and the driver
/// (`lua/group.lua`) that decides a descriptor's limits with them in one call.
macro_rules! group_script {
    () => {
        concat!(
            wrapped!("decide_counter", "counter.lua"),
            wrapped!("decide_log", "log.lua"),
            wrapped!("refund_counter", "counter_refund.lua"),
            wrapped!("refund_log", "log_refund.lua"),
            include_str!("../../../lua/group.lua")
        )
    };
}

/// The longest a slice's settlement may come after its lease ended, and still be honoured: the
/// leasing layer settles an ended slice at its next hit or its next housekeeping pass (about a
/// second apart, a busy slot skipped once), and keeps a settled slice [`lease::MAX_LEASE_MS`] for
/// late releases of its hits.
pub const SETTLE_MS: u64 = 3_000;

/// How long after the store decided it a request's tentative charge may be given back, for
/// backend calls of at most `timeout` each: the acquire of every hit of the request and then
/// the release, plus a second for the scheduling between. A refund later than this is refused
/// and the charge stands (fewer admissions, never more: `tollgate_backend_late_refunds`).
pub fn refund_horizon_ms(timeout: Duration) -> u64 {
    let timeout_ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX / 4);
    timeout_ms
        .saturating_mul(2)
        .saturating_add(1_000)
        .max(2_000)
}

impl Default for Scripts {
    /// The scripts for calls of the default backend timeout.
    fn default() -> Self {
        Scripts::new(Duration::from_millis(50))
    }
}

impl Scripts {
    /// The scripts, for backend calls of at most `timeout` each.
    pub fn new(timeout: Duration) -> Self {
        Scripts {
            counter: Script::new(script_with_tally!("counter.lua")),
            log: Script::new(script_with_tally!("log.lua")),
            counter_refund: Script::new(script_with_tally!("counter_refund.lua")),
            log_refund: Script::new(script_with_tally!("log_refund.lua")),
            group: Script::new(group_script!()),
            peek: Script::new(include_str!("../../../lua/peek.lua")),
            clear: Script::new(include_str!("../../../lua/clear.lua")),
            horizon_ms: refund_horizon_ms(timeout),
        }
    }

    /// The refund horizon `hit` is sent with: 0 for a final charge; for a tentative one the
    /// request's horizon, and for a leased slice that plus its lease and the time its
    /// settlement may take ([`SETTLE_MS`]).
    fn horizon(&self, hit: &Hit) -> u64 {
        if !hit.tentative {
            0
        } else if hit.lease_ms > 0 {
            self.horizon_ms + lease::ahead_ms(hit) + SETTLE_MS
        } else {
            self.horizon_ms
        }
    }

    /// `SCRIPT LOAD` commands for every script, to warm a node's script cache.
    pub fn load_commands(&self) -> Vec<Cmd> {
        [
            &self.counter,
            &self.log,
            &self.counter_refund,
            &self.log_refund,
            &self.group,
        ]
        .into_iter()
        .map(|script| {
            let mut cmd = redis::cmd("SCRIPT");
            cmd.arg("LOAD").arg(script.code);
            cmd
        })
        .collect()
    }

    /// The script that decides the limits of one descriptor together ([`super::group`]).
    pub(super) fn group(&self) -> &Script {
        &self.group
    }

    /// A harmless script call for checking permissions: a check-only counter decision (counting
    /// admitted hits only, so nothing is written) on a key of its own under the prefix, which
    /// reads and writes nothing else.
    pub fn probe<'a>(&'a self, keys: &KeySpace) -> Call<'a> {
        Call {
            script: &self.counter,
            suffixes: COUNTER_KEYS,
            args: Args::new([1, 1000, 0, 0]),
            base: keys.base("tollgate-permission-check"),
        }
    }

    /// The call that decides `hit`, or why it cannot be made.
    pub fn acquire<'a>(&'a self, keys: &KeySpace, hit: &Hit) -> Result<Call<'a>, BackendError> {
        if hit.window_ms == 0 || hit.window_ms > MAX_WINDOW_MS {
            return Err(BackendError::Protocol(format!(
                "window of {} ms is outside 1..={MAX_WINDOW_MS} ms",
                hit.window_ms
            )));
        }
        let limit = hit.limit.min(MAX_LIMIT);
        // 0 = check only, as `Consume(0)` consumes nothing. Larger costs are cut to what the
        // window math records of them: a counter's count saturates at MAX_COUNT, a log entry of
        // a refused hit at limit+1 (any cost above the limit is refused alike).
        let cost = match (hit.cost, hit.algorithm) {
            (Cost::CheckOnly, _) => 0,
            (Cost::Consume(units), Algorithm::SlidingWindowCounter) => units.min(window::MAX_COUNT),
            (Cost::Consume(units), Algorithm::SlidingWindowLog) => {
                window::log_refused_cost(limit, units)
            }
        };
        let count_refused = match hit.counting {
            Counting::Admitted => 0,
            Counting::All => 1,
        };
        // The options after the cost are left out while they are 0, as they are for nearly
        // every hit: the scripts read a missing one as 0, and Redis spends work on every
        // argument (five make the log's ARGV table grow a second time).
        let horizon = if cost > 0 { self.horizon(hit) } else { 0 };
        let args = match hit.algorithm {
            Algorithm::SlidingWindowCounter => {
                Args::new([limit, hit.window_ms, cost, count_refused, horizon])
            }
            Algorithm::SlidingWindowLog => Args::new([
                limit,
                hit.window_ms,
                cost,
                count_refused,
                lease::ahead_ms(hit),
                horizon,
            ]),
        }
        .without_trailing_zeros(ACQUIRE_REQUIRED_ARGS);
        let (script, suffixes) = match hit.algorithm {
            Algorithm::SlidingWindowCounter => (&self.counter, COUNTER_KEYS),
            Algorithm::SlidingWindowLog => (&self.log, LOG_KEYS),
        };
        Ok(Call {
            script,
            suffixes,
            args,
            base: keys.hit_base(&hit.key, hit.descriptor_tag),
        })
    }

    /// The call that reads `hit`'s window without writing (`lua/peek.lua`), or why it cannot
    /// be made.
    pub fn peek<'a>(&'a self, keys: &KeySpace, hit: &Hit) -> Result<Call<'a>, BackendError> {
        if hit.window_ms == 0 || hit.window_ms > MAX_WINDOW_MS {
            return Err(BackendError::Protocol(format!(
                "window of {} ms is outside 1..={MAX_WINDOW_MS} ms",
                hit.window_ms
            )));
        }
        let (algorithm, suffixes) = match hit.algorithm {
            Algorithm::SlidingWindowCounter => (0, COUNTER_KEYS),
            // The log's sorted set alone: its entries are what the window holds.
            Algorithm::SlidingWindowLog => (1, LOG_KEYS.split_at(1).0),
        };
        Ok(Call {
            script: &self.peek,
            suffixes,
            args: Args::new([algorithm, hit.window_ms]),
            base: keys.hit_base(&hit.key, hit.descriptor_tag),
        })
    }

    /// The call that deletes every key of `hit`'s window (`lua/clear.lua`).
    pub fn clear<'a>(&'a self, keys: &KeySpace, hit: &Hit) -> Call<'a> {
        Call {
            script: &self.clear,
            suffixes: match hit.algorithm {
                Algorithm::SlidingWindowCounter => COUNTER_KEYS,
                Algorithm::SlidingWindowLog => LOG_KEYS,
            },
            args: Args::new([]),
            base: keys.hit_base(&hit.key, hit.descriptor_tag),
        }
    }

    /// The call that gives back the charge `receipt` names, all of it but `receipt.keep`, and
    /// takes off the refundable tally what it gives back and what it keeps for good.
    pub fn refund<'a>(&'a self, receipt: &Receipt) -> Call<'a> {
        let keep = receipt.keep.min(receipt.cost);
        let until = receipt.refundable_until_ms;
        let untally = if until == 0 {
            0
        } else if receipt.keep_refundable {
            receipt.cost - keep
        } else {
            receipt.cost
        };
        let (script, suffixes, args) = match receipt.algorithm {
            Algorithm::SlidingWindowCounter => (
                &self.counter_refund,
                COUNTER_KEYS,
                Args::new([receipt.token, receipt.cost - keep, until, untally]),
            ),
            // The log names its entry by id and cost, and rewrites it to the kept units.
            Algorithm::SlidingWindowLog => (
                &self.log_refund,
                LOG_KEYS,
                Args::new([receipt.token, receipt.cost, keep, until, untally]),
            ),
        };
        // A final charge's refund sends what it always did.
        let args = args.without_trailing_zeros(REFUND_REQUIRED_ARGS);
        Call {
            script,
            suffixes,
            args,
            base: receipt.key.clone(),
        }
    }
}

/// The most arguments a script takes: a log acquire's limit, window, cost, counting, lease time
/// and refund horizon, and a decision time.
const MAX_ARGS: usize = 7;

/// The arguments every acquire call sends: limit, window and cost; the options after them may
/// be left out as 0.
const ACQUIRE_REQUIRED_ARGS: usize = 3;

/// The arguments every refund sends: what names the charge, and how much of it.
const REFUND_REQUIRED_ARGS: usize = 2;

/// A script call's integer arguments, kept inline: a call is built for every hit.
#[derive(Debug, Clone, Copy)]
struct Args {
    values: [u64; MAX_ARGS],
    len: usize,
    /// How many the script takes before the optional decision time: where `Call::at` puts it,
    /// once the zeros left out are back.
    full: usize,
}

impl Args {
    fn new<const N: usize>(values: [u64; N]) -> Args {
        const { assert!(N <= MAX_ARGS) };
        let mut args = Args {
            values: [0; MAX_ARGS],
            len: N,
            full: N,
        };
        args.values[..N].copy_from_slice(&values);
        args
    }

    /// Leaves out the zeros at the end, keeping at least the first `required` values; every
    /// value past `len` stays 0, so putting them back is setting `len` again.
    fn without_trailing_zeros(mut self, required: usize) -> Args {
        while self.len > required && self.values[self.len - 1] == 0 {
            self.len -= 1;
        }
        self
    }

    fn as_slice(&self) -> &[u64] {
        &self.values[..self.len]
    }
}

/// One script call: which script, its keys and arguments.
#[derive(Debug, Clone)]
pub struct Call<'a> {
    script: &'a Script,
    /// The script's KEYS are the base followed by each of these; all in one slot.
    suffixes: &'static [&'static str],
    args: Args,
    /// The limiter's key base, what a receipt names.
    base: String,
}

impl Call<'_> {
    /// `EVALSHA`: runs the script from the node's cache.
    pub fn evalsha(&self) -> Cmd {
        self.command("EVALSHA", &self.script.hash)
    }

    /// `EVAL`: sends the script along, which also caches it on the node; the answer to NOSCRIPT
    /// after the server's cache lost it.
    pub fn eval(&self) -> Cmd {
        self.command("EVAL", self.script.code)
    }

    /// Adds a decision time to the arguments, instead of the server's clock (tests only), after
    /// every option the call left out as 0 is put back, so that the time is where the script
    /// reads it. Acquire and refund calls, the only ones that take it, always have room for it.
    pub fn at(mut self, now_ms: u64) -> Self {
        let full = self.args.full;
        if let Some(slot) = self.args.values.get_mut(full) {
            *slot = now_ms;
            self.args.len = full + 1;
        }
        self
    }

    /// The command, written straight into the `Cmd`'s buffer: each key is the base and a suffix
    /// written as one argument, and integers are formatted by the `Cmd` itself.
    fn command(&self, name: &str, script: &str) -> Cmd {
        let args = self.args.as_slice();
        // Decimal u64s have at most 20 digits; the key count has one or two.
        let size = name.len() + script.len() + 2 + self.key_bytes() + 20 * args.len();
        let mut cmd = Cmd::with_capacity(3 + self.suffixes.len() + args.len(), size);
        cmd.arg(name).arg(script).arg(self.suffixes.len());
        self.write_keys(&mut cmd);
        for &value in args {
            cmd.arg(value);
        }
        cmd
    }

    /// How many keys the call's script takes.
    pub(super) fn key_count(&self) -> usize {
        self.suffixes.len()
    }

    /// The arguments the call sends after its keys.
    pub(super) fn args(&self) -> &[u64] {
        self.args.as_slice()
    }

    /// The bytes of the call's keys.
    pub(super) fn key_bytes(&self) -> usize {
        self.suffixes
            .iter()
            .map(|suffix| self.base.len() + suffix.len())
            .sum()
    }

    /// Appends each key, the base and a suffix written as one argument.
    pub(super) fn write_keys(&self, cmd: &mut Cmd) {
        for suffix in self.suffixes {
            let mut key = cmd.writer_for_next_arg();
            // The writer appends to the command's buffer in memory, which cannot fail.
            let _ = key.write_all(self.base.as_bytes());
            let _ = key.write_all(suffix.as_bytes());
        }
    }

    /// Reads an acquire script's reply for `hit`: `{admitted, remaining, reset_ms, token}`, or
    /// the script's short answer to an admitted, recorded hit. The receipt (for an admitted
    /// charge only: nothing gives a refused one back) takes the call's key base.
    pub fn outcome(self, hit: &Hit, reply: Value) -> Result<Outcome, BackendError> {
        let (verdict, token, extra) = match reply {
            Value::BulkString(text) => self.short_answer(hit, &text)?,
            other => {
                let [admitted, remaining, reset_ms, token, extra] = reply_fields(other)?;
                let verdict = Verdict {
                    admitted: admitted == 1,
                    remaining: u64::try_from(remaining).unwrap_or(0),
                    reset_ms: u64::try_from(reset_ms).unwrap_or(0),
                };
                let extra = u64::try_from(extra).unwrap_or(0);
                (verdict, u64::try_from(token).unwrap_or(0), extra)
            }
        };
        // The fifth value: for a refusal, how long it stands certainly; for an admitted
        // tentative charge, until when it may be given back.
        let (stands_ms, refundable_until_ms) = if verdict.admitted {
            (0, extra)
        } else {
            (extra.min(verdict.reset_ms), 0)
        };
        let receipt = match hit.cost {
            Cost::Consume(cost) if verdict.admitted && cost > 0 => Some(Receipt {
                key: self.base,
                algorithm: hit.algorithm,
                window_ms: hit.window_ms,
                token,
                cost,
                released_remaining: verdict.remaining.saturating_add(cost),
                keep: 0,
                leased: false,
                refundable_until_ms,
                keep_refundable: false,
            }),
            _ => None,
        };
        Ok(Outcome {
            verdict,
            receipt,
            cached: false,
            stands_ms,
        })
    }

    /// The verdict and token of a hit admitted and recorded, from its script's short answer
    /// and what this call sent. The log answers `"<id> <sum>"`, the entry's id and the log's sum
    /// after it; the counter `"<seconds> <microseconds> <prev> <curr>"`, the decision time as
    /// Redis's `TIME` gave it and the counts of the fixed window charged and its predecessor,
    /// from which the caller finds the window and the time into it as the script does. With
    /// them, for a tentative charge, until when it may be given back: the log says so as a
    /// third number, the counter's is its decision time plus the horizon sent.
    fn short_answer(&self, hit: &Hit, text: &[u8]) -> Result<(Verdict, u64, u64), BackendError> {
        let refused = || {
            BackendError::Protocol(format!(
                "a {} call replied {:?}",
                hit.algorithm.as_str(),
                String::from_utf8_lossy(text)
            ))
        };
        // An acquire sends limit and window first; a log's lease time, how far ahead its entry
        // is stamped, is its fifth argument, 0 when it was left out.
        let [limit, window_ms, _, _, ahead_ms, log_horizon, ..] = self.args.values;
        match hit.algorithm {
            Algorithm::SlidingWindowLog => {
                let (id, sum, until) = if log_horizon > 0 {
                    let [id, sum, until] = numbers(text).ok_or_else(refused)?;
                    (id, sum, until)
                } else {
                    let [id, sum] = numbers(text).ok_or_else(refused)?;
                    (id, sum, 0)
                };
                let verdict = Verdict {
                    admitted: true,
                    remaining: limit.saturating_sub(sum),
                    reset_ms: window_ms.saturating_add(ahead_ms),
                };
                Ok((verdict, id, until))
            }
            Algorithm::SlidingWindowCounter => {
                // The counter's horizon is its fifth argument (it takes no lease time).
                let counter_horizon = ahead_ms;
                let [seconds, micros, prev, curr] = numbers(text).ok_or_else(refused)?;
                let now_ms = seconds
                    .checked_mul(1000)
                    .and_then(|ms| ms.checked_add(micros / 1000))
                    .ok_or_else(refused)?;
                let k = window::counter_window_index(now_ms, window_ms);
                let elapsed_ms = now_ms % window::effective_window_ms(window_ms);
                let verdict = window::counter_admitted(limit, window_ms, elapsed_ms, prev, curr);
                let until = if counter_horizon > 0 {
                    now_ms.saturating_add(counter_horizon)
                } else {
                    0
                };
                Ok((verdict, k, until))
            }
        }
    }
}

/// A script call a backend sends: `EVALSHA`, or `EVAL` with the script after the node answered
/// NOSCRIPT. One hit's [`Call`], or the call deciding a group ([`super::group::Unit`]).
pub trait Invoke {
    /// `EVALSHA`: runs the script from the node's cache.
    fn evalsha(&self) -> Cmd;
    /// `EVAL`: sends the script along, which also caches it on the node.
    fn eval(&self) -> Cmd;
}

impl Invoke for Call<'_> {
    fn evalsha(&self) -> Cmd {
        Call::evalsha(self)
    }

    fn eval(&self) -> Cmd {
        Call::eval(self)
    }
}

/// Counts the refund replies among `results` that say they came after their charge's horizon
/// (and changed nothing).
pub fn count_late_refunds(results: &[Result<Value, BackendError>]) {
    crate::backend::observe::late_refunds(
        results
            .iter()
            .filter(|result| matches!(result, Ok(Value::Int(-1))))
            .count(),
    );
}

/// Exactly `N` decimal integers separated by single spaces, as the scripts' short answers
/// write them.
fn numbers<const N: usize>(text: &[u8]) -> Option<[u64; N]> {
    let mut parts = std::str::from_utf8(text).ok()?.split(' ');
    let mut values = [0; N];
    for value in &mut values {
        *value = parts.next()?.parse().ok()?;
    }
    parts.next().is_none().then_some(values)
}

/// The five integers of an acquire script's reply.
fn reply_fields(reply: Value) -> Result<[i64; 5], BackendError> {
    // The scripts answer an array of five integers; read that without building a vector. Any
    // other shape takes the general conversion, which accepts what it always did.
    if let Value::Array(items) = &reply
        && let [
            Value::Int(a),
            Value::Int(b),
            Value::Int(c),
            Value::Int(d),
            Value::Int(e),
        ] = items[..]
    {
        return Ok([a, b, c, d, e]);
    }
    let fields: Vec<i64> = redis::from_redis_value(reply)
        .map_err(|err| BackendError::Protocol(format!("script reply: {err}")))?;
    <[i64; 5]>::try_from(fields.as_slice()).map_err(|_| {
        BackendError::Protocol(format!(
            "script replied {} values, expected 5",
            fields.len()
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The arguments `call` sends after its keys, as text.
    fn sent_args(call: &Call<'_>) -> Vec<String> {
        let cmd = call.evalsha();
        let keys = call.suffixes.len();
        cmd.args_iter()
            .skip(3 + keys)
            .map(|arg| match arg {
                redis::Arg::Simple(bytes) => String::from_utf8_lossy(bytes).into_owned(),
                other => format!("{other:?}"),
            })
            .collect()
    }

    fn hit(algorithm: Algorithm, counting: Counting, lease_ms: u64) -> Hit {
        Hit {
            key: "domain|user=a".to_owned(),
            algorithm,
            limit: 10,
            window_ms: 60_000,
            cost: Cost::Consume(1),
            counting,
            shards: 1,
            lease_ms,
            tentative: false,
            group: 0,
            descriptor_tag: false,
            slice: false,
        }
    }

    #[test]
    fn an_ordinary_hit_sends_limit_window_and_cost_only() {
        let scripts = Scripts::default();
        let keys = KeySpace::new("tollgate:");
        for algorithm in [Algorithm::SlidingWindowCounter, Algorithm::SlidingWindowLog] {
            let call = scripts
                .acquire(&keys, &hit(algorithm, Counting::Admitted, 0))
                .expect("a valid hit");
            assert_eq!(sent_args(&call), ["10", "60000", "1"], "{algorithm:?}");
        }
    }

    #[test]
    fn options_after_the_cost_are_sent_up_to_the_last_that_is_not_zero() {
        let scripts = Scripts::default();
        let keys = KeySpace::new("tollgate:");
        let counted = |algorithm, counting, lease| {
            let call = scripts
                .acquire(&keys, &hit(algorithm, counting, lease))
                .expect("a valid hit");
            sent_args(&call)
        };
        assert_eq!(
            counted(Algorithm::SlidingWindowCounter, Counting::All, 0),
            ["10", "60000", "1", "1"]
        );
        assert_eq!(
            counted(Algorithm::SlidingWindowLog, Counting::All, 0),
            ["10", "60000", "1", "1"]
        );
        assert_eq!(
            counted(Algorithm::SlidingWindowLog, Counting::Admitted, 250),
            ["10", "60000", "1", "0", "250"]
        );
    }

    #[test]
    fn a_decision_time_goes_where_the_script_reads_it_after_the_options_left_out() {
        let scripts = Scripts::default();
        let keys = KeySpace::new("tollgate:");
        let at = |algorithm, counting| {
            let call = scripts
                .acquire(&keys, &hit(algorithm, counting, 0))
                .expect("a valid hit")
                .at(1_700_000_000_000);
            sent_args(&call)
        };
        assert_eq!(
            at(Algorithm::SlidingWindowCounter, Counting::Admitted),
            ["10", "60000", "1", "0", "0", "1700000000000"]
        );
        assert_eq!(
            at(Algorithm::SlidingWindowLog, Counting::Admitted),
            ["10", "60000", "1", "0", "0", "0", "1700000000000"]
        );
        assert_eq!(
            at(Algorithm::SlidingWindowLog, Counting::All),
            ["10", "60000", "1", "1", "0", "0", "1700000000000"]
        );
    }

    #[test]
    fn a_tentative_charge_sends_its_horizon_and_its_refund_the_deadline() {
        let scripts = Scripts::new(std::time::Duration::from_millis(50));
        let keys = KeySpace::new("tollgate:");
        let horizon = refund_horizon_ms(std::time::Duration::from_millis(50));
        assert_eq!(horizon, 2_000);
        let tentative = |algorithm, lease_ms| Hit {
            tentative: true,
            group: 0,
            descriptor_tag: false,
            slice: false,
            ..hit(algorithm, Counting::Admitted, lease_ms)
        };
        let args = |h: &Hit| sent_args(&scripts.acquire(&keys, h).expect("a valid hit"));
        let h = horizon.to_string();
        assert_eq!(
            args(&tentative(Algorithm::SlidingWindowCounter, 0)),
            ["10", "60000", "1", "0", h.as_str()]
        );
        assert_eq!(
            args(&tentative(Algorithm::SlidingWindowLog, 0)),
            ["10", "60000", "1", "0", "0", h.as_str()]
        );
        let slice = (horizon + 250 + SETTLE_MS).to_string();
        assert_eq!(
            args(&tentative(Algorithm::SlidingWindowLog, 250)),
            ["10", "60000", "1", "0", "250", slice.as_str()]
        );

        // The log's short answer to a tentative charge carries its deadline; the refund sends it
        // with the units that leave the tally.
        let h = tentative(Algorithm::SlidingWindowLog, 0);
        let call = scripts.acquire(&keys, &h).expect("a valid hit");
        let outcome = call
            .outcome(&h, text("1700000000000001 3 1700000002000"))
            .expect("a short answer");
        let receipt = outcome.receipt.expect("a receipt");
        assert_eq!(receipt.refundable_until_ms, 1_700_000_002_000);
        let refund = scripts.refund(&receipt);
        assert_eq!(
            sent_args(&refund),
            ["1700000000000001", "1", "0", "1700000002000", "1"]
        );
        // A final charge's refund sends what it always did.
        let final_receipt = Receipt {
            refundable_until_ms: 0,
            ..receipt
        };
        assert_eq!(
            sent_args(&scripts.refund(&final_receipt)),
            ["1700000000000001", "1"]
        );
    }

    /// The outcome of an ordinary hit of `algorithm` (limit 10 a minute, lease time `lease_ms`)
    /// whose script answered `reply`.
    fn answered(
        algorithm: Algorithm,
        lease_ms: u64,
        reply: Value,
    ) -> Result<Outcome, BackendError> {
        let hit = hit(algorithm, Counting::Admitted, lease_ms);
        let scripts = Scripts::default();
        let call = scripts
            .acquire(&KeySpace::new("tollgate:"), &hit)
            .expect("a valid hit");
        call.outcome(&hit, reply)
    }

    fn text(text: &str) -> Value {
        Value::BulkString(text.as_bytes().to_vec())
    }

    #[test]
    fn the_logs_short_answer_gives_the_verdict_and_receipt_its_table_would() {
        let log = Algorithm::SlidingWindowLog;
        let short = answered(log, 250, text("1700000000000001 3")).expect("a short answer");
        // What the script's table says of the same decision: 10 - 3 left, the window plus the
        // lease time until the entry leaves.
        let table = answered(
            log,
            250,
            Value::Array(vec![
                Value::Int(1),
                Value::Int(7),
                Value::Int(60_250),
                Value::Int(1_700_000_000_000_001),
                Value::Int(0),
            ]),
        )
        .expect("a table answer");
        assert_eq!(short, table);
        assert_eq!(
            short.verdict,
            Verdict {
                admitted: true,
                remaining: 7,
                reset_ms: 60_250,
            }
        );
        let receipt = short.receipt.expect("an admitted charge has a receipt");
        assert_eq!(receipt.token, 1_700_000_000_000_001);
        assert_eq!(receipt.released_remaining, 8);
    }

    #[test]
    fn the_counters_short_answer_gives_the_verdict_the_window_math_would() {
        // TIME said 1,700,000,000.123456 s: window 28,333,333 of a minute, 20,123 ms in; the
        // charge of 1 took window k from 2 to 3 beside 4 in window k-1.
        let short = answered(
            Algorithm::SlidingWindowCounter,
            0,
            text("1700000000 123456 4 3"),
        )
        .expect("a short answer");
        let now_ms = 1_700_000_000_123;
        let expected = window::counter_decide(
            10,
            60_000,
            now_ms,
            4,
            2,
            Cost::Consume(1),
            Counting::Admitted,
        );
        assert_eq!(short.verdict, expected);
        assert_eq!(
            short.verdict,
            Verdict {
                admitted: true,
                // (10 * 60,000 - (4 * 39,877 + 3 * 60,000)) / 60,000, floored
                remaining: 4,
                reset_ms: 120_000 - 20_123,
            }
        );
        let receipt = short.receipt.expect("an admitted charge has a receipt");
        assert_eq!(receipt.token, 28_333_333);
        assert_eq!(receipt.released_remaining, 5);
    }

    #[test]
    fn a_short_answer_of_the_wrong_shape_is_a_protocol_error() {
        let log = Algorithm::SlidingWindowLog;
        let counter = Algorithm::SlidingWindowCounter;
        for (algorithm, reply) in [
            (log, "1700000000000001"),
            (log, "1700000000000001 x"),
            (log, "1700000000000001 3 4"),
            (log, "1700000000000001  3"),
            (log, "-1 3"),
            (log, ""),
            (counter, "1700000000000001 3"),
            (counter, "1700000000 123456 4.0 3"),
            (counter, "18446744073709551615 0 0 1"),
        ] {
            let answer = answered(algorithm, 0, text(reply));
            assert!(
                matches!(answer, Err(BackendError::Protocol(_))),
                "{algorithm:?} answered {reply:?}: {answer:?}"
            );
        }
    }
}
