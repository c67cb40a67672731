//! How the verdicts of a descriptor's limits become the one status it answers, and which
//! status the RateLimit headers describe.

use super::{Code, Status, Usage};
use crate::window::Counting;

/// What one limit of a descriptor answered.
#[derive(Debug, Clone, Copy)]
pub(super) struct Answer {
    pub admitted: bool,
    pub remaining: u64,
    pub reset_ms: u64,
    pub usage: Usage,
    /// The local over-limit cache refused it.
    pub local_cache: bool,
    /// Nobody decided it: the cache refused another limit of its descriptor.
    pub unasked: bool,
}

/// Which of a descriptor's limits its status describes: when `over`, the refusing one whose
/// retry comes last (the first of equals); else the one with the least left, of equals the
/// shorter window (limits nobody decided are never described unless all are).
pub(super) fn pick(windows: impl Fn(usize) -> u64, answers: &[Answer], over: bool) -> usize {
    let mut best: Option<usize> = None;
    for (index, answer) in answers.iter().enumerate() {
        let better = match best.and_then(|b| answers.get(b).map(|a| (b, a))) {
            None => over != answer.admitted && !answer.unasked,
            Some((b, current)) => {
                if over {
                    !answer.admitted && answer.reset_ms > current.reset_ms
                } else {
                    !answer.unasked
                        && (answer.remaining < current.remaining
                            || (answer.remaining == current.remaining
                                && windows(index) < windows(b)))
                }
            }
        };
        if better {
            best = Some(index);
        }
    }
    best.unwrap_or(0)
}

/// The status the RateLimit headers describe, chosen as envoyproxy/ratelimit chooses it: among
/// the statuses with a limit, the one with the least remaining (the first of equals); but an
/// OVER_LIMIT status of a limit that is not in quota mode wins, the last such in request order.
pub(super) fn most_constrained(statuses: &[Status]) -> Option<&Status> {
    let mut chosen: Option<&Status> = None;
    let mut least = u32::MAX;
    for status in statuses {
        if status.limit.is_some() && status.remaining < least {
            least = status.remaining;
            chosen = Some(status);
        }
    }
    for status in statuses {
        if status.code == Code::OverLimit && status.limit.as_ref().is_some_and(|l| !l.quota_mode) {
            chosen = Some(status);
        }
    }
    chosen
}

/// The usage around a hit of `cost` units on a limit of `limit`, from the backend's verdict.
///
/// The verdict's `remaining` is `floor(limit - used)`: after the hit when it was admitted; when
/// it was refused, before it if refused hits are not recorded, after it (so 0) if they are. A
/// refused hit recorded under [`Counting::All`] therefore tells only that usage was at or above
/// the limit with it: it is taken as wholly over, which is exact for hits of one unit (they
/// cannot cross the limit part way).
pub(super) fn usage_of(
    limit: u64,
    cost: u64,
    admitted: bool,
    remaining: u64,
    counting: Counting,
) -> Usage {
    let used = limit.saturating_sub(remaining);
    let (before, after) = if admitted {
        (used.saturating_sub(cost), used)
    } else {
        match counting {
            Counting::Admitted => (used, used.saturating_add(cost)),
            Counting::All => {
                let before = used.max(limit);
                (before, before.saturating_add(cost))
            }
        }
    };
    Usage::Decided {
        before,
        after,
        admitted,
    }
}
