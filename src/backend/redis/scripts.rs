//! The Lua scripts of `lua/`, their hashes, and the translation between hits and script calls.

use redis::{Cmd, Value};

use crate::backend::{BackendError, Hit, Outcome, Receipt};
use crate::window::{Algorithm, Cost, Verdict};

use super::keys::KeySpace;

/// The largest limit the scripts compute with exactly (Lua numbers are doubles); larger limits
/// are treated as this one, which no real traffic reaches.
pub const MAX_LIMIT: u64 = (1 << 53) - 1;

/// The longest window the scripts accept, in milliseconds (about 34 years).
pub const MAX_WINDOW_MS: u64 = 1 << 40;

/// One Lua script and its SHA1, the name `EVALSHA` knows it by.
#[derive(Debug, Clone)]
pub struct Script {
    code: &'static str,
    hash: String,
}

impl Script {
    fn new(code: &'static str) -> Script {
        Script {
            code,
            hash: redis::Script::new(code).get_hash().to_owned(),
        }
    }
}

/// The scripts, with their SHA1 hashes computed once at startup.
#[derive(Debug, Clone)]
pub struct Scripts {
    counter: Script,
    log: Script,
    counter_refund: Script,
    log_refund: Script,
}

impl Default for Scripts {
    fn default() -> Self {
        Scripts {
            counter: Script::new(include_str!("../../../lua/counter.lua")),
            log: Script::new(include_str!("../../../lua/log.lua")),
            counter_refund: Script::new(include_str!("../../../lua/counter_refund.lua")),
            log_refund: Script::new(include_str!("../../../lua/log_refund.lua")),
        }
    }
}

impl Scripts {
    /// `SCRIPT LOAD` commands for every script, to warm a node's script cache.
    pub fn load_commands(&self) -> Vec<Cmd> {
        [
            &self.counter,
            &self.log,
            &self.counter_refund,
            &self.log_refund,
        ]
        .into_iter()
        .map(|script| {
            let mut cmd = redis::cmd("SCRIPT");
            cmd.arg("LOAD").arg(script.code);
            cmd
        })
        .collect()
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
        // any cost above the limit is refused alike, so the script never sees more than limit+1
        // (0 = check only, as `Consume(0)` consumes nothing)
        let cost = match hit.cost {
            Cost::CheckOnly => 0,
            Cost::Consume(units) => units.min(limit + 1),
        };
        let base = keys.base(&hit.key);
        let (script, keys) = match hit.algorithm {
            Algorithm::SlidingWindowCounter => (&self.counter, vec![KeySpace::counter(&base)]),
            Algorithm::SlidingWindowLog => (
                &self.log,
                vec![KeySpace::log(&base), KeySpace::log_meta(&base)],
            ),
        };
        Ok(Call {
            script,
            keys,
            args: vec![
                limit.to_string(),
                hit.window_ms.to_string(),
                cost.to_string(),
            ],
            base,
        })
    }

    /// The call that gives back the charge `receipt` names.
    pub fn refund<'a>(&'a self, receipt: &Receipt) -> Call<'a> {
        let (script, keys) = match receipt.algorithm {
            Algorithm::SlidingWindowCounter => {
                (&self.counter_refund, vec![KeySpace::counter(&receipt.key)])
            }
            Algorithm::SlidingWindowLog => (
                &self.log_refund,
                vec![
                    KeySpace::log(&receipt.key),
                    KeySpace::log_meta(&receipt.key),
                ],
            ),
        };
        Call {
            script,
            keys,
            args: vec![receipt.token.to_string(), receipt.cost.to_string()],
            base: receipt.key.clone(),
        }
    }
}

/// One script call: which script, its keys and arguments.
#[derive(Debug, Clone)]
pub struct Call<'a> {
    script: &'a Script,
    /// The script's KEYS; all in one slot.
    pub keys: Vec<String>,
    args: Vec<String>,
    /// The limiter's key base, what a receipt names.
    base: String,
}

impl Call<'_> {
    /// Adds a decision time to the arguments, instead of the server's clock (tests only).
    pub fn at(mut self, now_ms: u64) -> Self {
        self.args.push(now_ms.to_string());
        self
    }

    /// `EVALSHA`: runs the script from the node's cache.
    pub fn evalsha(&self) -> Cmd {
        self.command("EVALSHA", &self.script.hash)
    }

    /// `EVAL`: sends the script along, which also caches it on the node; the answer to NOSCRIPT.
    pub fn eval(&self) -> Cmd {
        self.command("EVAL", self.script.code)
    }

    fn command(&self, name: &str, script: &str) -> Cmd {
        let mut cmd = redis::cmd(name);
        cmd.arg(script)
            .arg(self.keys.len())
            .arg(&self.keys)
            .arg(&self.args);
        cmd
    }

    /// Reads an acquire script's reply `{admitted, remaining, reset_ms, token}` for `hit`.
    pub fn outcome(&self, hit: &Hit, reply: Value) -> Result<Outcome, BackendError> {
        let fields: Vec<i64> = redis::from_redis_value(reply)
            .map_err(|err| BackendError::Protocol(format!("script reply: {err}")))?;
        let [admitted, remaining, reset_ms, token] = fields[..] else {
            return Err(BackendError::Protocol(format!(
                "script replied {} values, expected 4",
                fields.len()
            )));
        };
        let admitted = admitted == 1;
        let verdict = Verdict {
            admitted,
            remaining: u64::try_from(remaining).unwrap_or(0),
            reset_ms: u64::try_from(reset_ms).unwrap_or(0),
        };
        let receipt = match hit.cost {
            Cost::Consume(cost) if admitted && cost > 0 => Some(Receipt {
                key: self.base.clone(),
                algorithm: hit.algorithm,
                window_ms: hit.window_ms,
                token: u64::try_from(token).unwrap_or(0),
                cost,
            }),
            _ => None,
        };
        Ok(Outcome { verdict, receipt })
    }
}
