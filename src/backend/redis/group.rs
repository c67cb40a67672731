//! The limits of one descriptor decided together ([`Hit::group`]): one call of the group script
//! (`lua/group.lua`, with every acquire and refund script inside it) decides a hit against each
//! of the group's limits with that limit's own script, and when any refuses, gives back in the
//! same call what the others charged. Each limit's reply is its own script's, read by
//! [`Call::outcome`] as a call of its own would be.
//!
//! Both Redis backends send an acquire as [`Unit`]s: a hit alone is its own [`Call`], as always;
//! adjacent hits of one group are one [`GroupCall`]. A batch without groups never comes here.

use std::ops::Range;

use redis::{Cmd, Value};

use super::keys::{self, COUNTER_KEYS, KeySpace, LOG_KEYS};
use super::scripts::{Call, Invoke, Script, Scripts};
use crate::backend::{BackendError, Hit, Outcome, Results};
use crate::window::{Algorithm, Counting};

/// One script call of an acquire: one hit's, or one group's.
#[derive(Debug)]
pub enum Unit<'a> {
    /// A hit decided on its own.
    One(Call<'a>),
    /// The hits of one group, decided together.
    Group(GroupCall<'a>),
}

/// The call that decides the hits of one group: each hit's own call, sent inside one call of the
/// group script.
#[derive(Debug)]
pub struct GroupCall<'a> {
    script: &'a Script,
    /// Each limit's algorithm, as the driver names it (`c` or `l`), and its own call.
    calls: Vec<(&'static str, Call<'a>)>,
}

/// The hits of `hits` each call decides, in order: every run of adjacent hits with one non-zero
/// [`Hit::group`], and every other hit alone. A group of one hit is a hit alone.
pub fn spans(hits: &[Hit]) -> impl Iterator<Item = Range<usize>> + '_ {
    let mut start = 0;
    std::iter::from_fn(move || {
        let first = hits.get(start)?;
        let mut end = start + 1;
        if first.group != 0 {
            while hits.get(end).is_some_and(|hit| hit.group == first.group) {
                end += 1;
            }
        }
        let span = start..end;
        start = end;
        Some(span)
    })
}

/// The call that decides `hits` (one span of [`spans`]), decided at the test's instant `now_ms`
/// when given; or why a hit of it cannot be decided, which fails the whole span.
pub fn unit<'a>(
    scripts: &'a Scripts,
    keys: &KeySpace,
    hits: &[Hit],
    now_ms: Option<u64>,
) -> Result<Unit<'a>, BackendError> {
    let call = |hit: &Hit| {
        scripts.acquire(keys, hit).map(|call| match now_ms {
            Some(now) => call.at(now),
            None => call,
        })
    };
    match hits {
        [hit] => call(hit).map(Unit::One),
        _ => {
            let calls = hits
                .iter()
                .map(|hit| Ok((algorithm_name(hit.algorithm), call(hit)?)))
                .collect::<Result<Vec<_>, BackendError>>()?;
            Ok(Unit::Group(GroupCall {
                script: scripts.group(),
                calls,
            }))
        }
    }
}

/// How the group script names an algorithm.
fn algorithm_name(algorithm: Algorithm) -> &'static str {
    match algorithm {
        Algorithm::SlidingWindowCounter => "c",
        Algorithm::SlidingWindowLog => "l",
    }
}

/// Whether every key of every hit of `hits` is in one cluster slot, so one script call may touch
/// them all.
pub fn one_slot(keys: &KeySpace, hits: &[Hit]) -> bool {
    let mut slots = hits.iter().flat_map(|hit| {
        let base = keys.hit_base(&hit.key, hit.descriptor_tag);
        let suffixes = match hit.algorithm {
            Algorithm::SlidingWindowCounter => COUNTER_KEYS,
            Algorithm::SlidingWindowLog => LOG_KEYS,
        };
        suffixes
            .iter()
            .map(move |suffix| keys::slot(&format!("{base}{suffix}")))
    });
    match slots.next() {
        Some(first) => slots.all(|slot| slot == first),
        None => true,
    }
}

impl Unit<'_> {
    /// Appends to `out` the outcome of each hit of `hits` (the span this unit was made for),
    /// from the unit's reply, or its failure for each.
    pub fn outcomes(self, hits: &[Hit], reply: Result<Value, BackendError>, out: &mut Results) {
        match self {
            Unit::One(call) => {
                let outcome = match hits {
                    [hit] => reply.and_then(|value| call.outcome(hit, value)),
                    _ => Err(BackendError::Protocol(
                        "a call of one hit was made for several".into(),
                    )),
                };
                out.push(outcome);
            }
            Unit::Group(group) => group.outcomes(hits, reply, out),
        }
    }
}

impl GroupCall<'_> {
    /// The group script's command: every limit's keys in turn, then the number of limits and,
    /// for each, its algorithm, its number of keys and of arguments, and its arguments.
    fn command(&self, name: &str, script: &str) -> Cmd {
        let keys: usize = self.calls.iter().map(|(_, call)| call.key_count()).sum();
        let args: usize = 1 + self
            .calls
            .iter()
            .map(|(_, call)| 3 + call.args().len())
            .sum::<usize>();
        let key_bytes: usize = self.calls.iter().map(|(_, call)| call.key_bytes()).sum();
        let size = name.len() + script.len() + 2 + key_bytes + 20 * args;
        let mut cmd = Cmd::with_capacity(3 + keys + args, size);
        cmd.arg(name).arg(script).arg(keys);
        for (_, call) in &self.calls {
            call.write_keys(&mut cmd);
        }
        cmd.arg(self.calls.len());
        for (algorithm, call) in &self.calls {
            let args = call.args();
            cmd.arg(*algorithm).arg(call.key_count()).arg(args.len());
            for &value in args {
                cmd.arg(value);
            }
        }
        cmd
    }

    /// Each hit's outcome from the group's reply `{undone, reply 1, ..., reply n}`: what its own
    /// limit answered; when the group was undone, the charges given back carry no receipt.
    fn outcomes(self, hits: &[Hit], reply: Result<Value, BackendError>, out: &mut Results) {
        let expected = self.calls.len();
        let items = match reply {
            Ok(Value::Array(items)) if items.len() == expected + 1 && hits.len() == expected => {
                items
            }
            Ok(other) => {
                let err = BackendError::Protocol(format!(
                    "a group of {expected} limits replied {other:?}"
                ));
                out.extend(hits.iter().map(|_| Err(err.clone())));
                return;
            }
            Err(err) => {
                out.extend(hits.iter().map(|_| Err(err.clone())));
                return;
            }
        };
        let mut items = items.into_iter();
        let undone = matches!(items.next(), Some(Value::Int(1)));
        for ((hit, (_, call)), item) in hits.iter().zip(self.calls).zip(items) {
            out.push(call.outcome(hit, item).map(|outcome| {
                if undone && hit.counting == Counting::Admitted {
                    Outcome {
                        receipt: None,
                        ..outcome
                    }
                } else {
                    outcome
                }
            }));
        }
    }
}

impl Invoke for Unit<'_> {
    fn evalsha(&self) -> Cmd {
        match self {
            Unit::One(call) => call.evalsha(),
            Unit::Group(group) => group.command("EVALSHA", &group.script.hash),
        }
    }

    fn eval(&self) -> Cmd {
        match self {
            Unit::One(call) => call.eval(),
            Unit::Group(group) => group.command("EVAL", group.script.code),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::window::Cost;

    fn hit(key: &str, algorithm: Algorithm, group: u32) -> Hit {
        Hit {
            key: key.to_owned(),
            algorithm,
            limit: 10,
            window_ms: 1000,
            cost: Cost::Consume(1),
            counting: Counting::Admitted,
            shards: 1,
            lease_ms: 0,
            tentative: false,
            group,
            descriptor_tag: group != 0,
            slice: false,
        }
    }

    #[test]
    fn adjacent_hits_of_one_group_make_one_span() {
        let c = Algorithm::SlidingWindowCounter;
        let hits = [
            hit("a@c1", c, 0),
            hit("b@c1", c, 1),
            hit("b@c2", c, 1),
            hit("c@c1", c, 2),
            hit("d@c1", c, 3),
            hit("d@c2", c, 3),
            hit("d@c3", c, 3),
            hit("e@c1", c, 0),
            hit("f@c1", c, 0),
        ];
        let spans: Vec<Range<usize>> = spans(&hits).collect();
        assert_eq!(spans, [0..1, 1..3, 3..4, 4..7, 7..8, 8..9]);
        assert_eq!(super::spans(&[]).count(), 0);
    }

    #[test]
    fn a_group_call_sends_each_limits_keys_then_its_own_arguments() {
        let scripts = Scripts::default();
        let keys = KeySpace::new("p:");
        let hits = [
            hit("d|u=a@c1000", Algorithm::SlidingWindowCounter, 1),
            hit("d|u=a@l1000", Algorithm::SlidingWindowLog, 1),
        ];
        let group = unit(&scripts, &keys, &hits, Some(7)).expect("a valid group");
        assert!(matches!(group, Unit::Group(_)));
        let cmd = group.evalsha();
        let args: Vec<String> = cmd
            .args_iter()
            .map(|arg| match arg {
                redis::Arg::Simple(bytes) => String::from_utf8_lossy(bytes).into_owned(),
                other => format!("{other:?}"),
            })
            .collect();
        let expected = [
            "EVALSHA",
            &scripts.group().hash,
            "3",
            "p:{d|u=a}@c1000:c",
            "p:{d|u=a}@l1000:l",
            "p:{d|u=a}@l1000:s",
            "2",
            // the counter: limit, window, cost, counting, horizon, the test's time
            "c",
            "1",
            "6",
            "10",
            "1000",
            "1",
            "0",
            "0",
            "7",
            // the log: limit, window, cost, counting, lease, horizon, the test's time
            "l",
            "2",
            "7",
            "10",
            "1000",
            "1",
            "0",
            "0",
            "0",
            "7",
        ];
        assert_eq!(args, expected);
        assert!(one_slot(&keys, &hits));
        // a group of one hit is its own call
        let one = unit(&scripts, &keys, &hits[..1], None).expect("a valid hit");
        assert!(matches!(one, Unit::One(_)));
    }
}
