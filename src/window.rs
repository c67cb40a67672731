//! Sliding-window math shared by every backend: how much of a limit is used at an instant, whether
//! a hit fits, what remains and when to retry. Pure functions over plain numbers and an explicit
//! `now`, so tests drive them with an injected clock and the Lua scripts mirror them line for line.

use std::fmt;

/// Which sliding-window algorithm a limit is evaluated with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub enum Algorithm {
    /// Two fixed-window counts weighted by the overlap with the sliding window; O(1) per key.
    #[default]
    SlidingWindowCounter,
    /// One entry per admitted hit; exact.
    SlidingWindowLog,
}

impl Algorithm {
    /// The config-file spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Algorithm::SlidingWindowCounter => "sliding_window_counter",
            Algorithm::SlidingWindowLog => "sliding_window_log",
        }
    }

    /// Parses the config-file spelling.
    pub fn parse(text: &str) -> Option<Algorithm> {
        match text {
            "sliding_window_counter" => Some(Algorithm::SlidingWindowCounter),
            "sliding_window_log" => Some(Algorithm::SlidingWindowLog),
            _ => None,
        }
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What one hit asks of a window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Cost {
    /// Consume this many units (at least 1) if they fit.
    Consume(u64),
    /// Consume nothing; admitted unless usage is already above the limit (`used > limit`).
    CheckOnly,
}

/// Which hits a window records.
///
/// Token quotas are why both exist: Envoy checks such a quota on the request path with a cost of
/// 0 and, when the response is done, debits the tokens actually spent with an ordinary hit whose
/// answer it ignores. Under [`Counting::Admitted`] a debit larger than what is left would be
/// refused and so never charged; under [`Counting::All`] it is charged, the window goes above its
/// limit, and the next check is refused until enough of it has slid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub enum Counting {
    /// Only admitted hits are recorded: a refused hit leaves the window as it was.
    #[default]
    Admitted,
    /// Every hit is recorded, refused ones included, as envoyproxy/ratelimit counts (its
    /// `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=false`, the default there). Usage can then be
    /// above the limit; a hit is still admitted only when `used + c <= limit`.
    All,
}

impl Counting {
    /// The config and flag spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Counting::Admitted => "admitted",
            Counting::All => "all",
        }
    }

    /// Parses the config and flag spelling.
    pub fn parse(text: &str) -> Option<Counting> {
        match text {
            "admitted" => Some(Counting::Admitted),
            "all" => Some(Counting::All),
            _ => None,
        }
    }
}

impl fmt::Display for Counting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The largest count a sliding window counter stores for one fixed window when refused hits are
/// charged (2^53 - 1, the largest integer the Redis scripts hold exactly). Admitted hits never
/// reach it (limits are far smaller); only an absurd debit does, and a count this large is over
/// any limit for as long as such a debit would be.
pub const MAX_COUNT: u64 = (1 << 53) - 1;

/// The count of a counter's current fixed window after a refused hit of `units` is charged to it
/// under [`Counting::All`]: `curr + units`, saturated at [`MAX_COUNT`] (a count already above it
/// is kept).
pub fn counter_refused_count(curr: u64, units: u64) -> u64 {
    curr.saturating_add(units).min(MAX_COUNT.max(curr))
}

/// The cost of the log entry a refused hit of `units` leaves under [`Counting::All`]: the cost,
/// but at most `limit + 1`. While such an entry is in the window, usage is above the limit
/// whatever its exact size, so every later decision is the same as with the full cost, and the
/// log's running sum stays small enough to be exact in the Redis scripts.
pub fn log_refused_cost(limit: u64, units: u64) -> u64 {
    units.min(limit.saturating_add(1))
}

/// The answer of one window to one hit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    /// Whether the hit fits (and, for `Consume`, was recorded).
    pub admitted: bool,
    /// `floor(limit - used)` after the hit when admitted, before it when not; never negative.
    pub remaining: u64,
    /// Admitted: milliseconds until every counted hit has left the window. Rejected: milliseconds
    /// until the same hit would be admitted if nothing else arrived (the full window when it never
    /// can be, i.e. its cost exceeds the limit).
    pub reset_ms: u64,
}

// All arithmetic below runs in u128: a limit times a window (both u64) always fits, so every
// comparison is exact, and the few sums that could exceed u128 saturate at a value that is larger
// than any capacity and therefore still compares correctly.

/// The window length the math uses: `window_ms`, but at least 1 ms, so no input divides by zero.
pub fn effective_window_ms(window_ms: u64) -> u64 {
    window_ms.max(1)
}

/// The cost as the math sees it: `Consume(0)` consumes nothing, so it is a check.
pub fn normalize_cost(cost: Cost) -> Cost {
    match cost {
        Cost::Consume(0) => Cost::CheckOnly,
        other => other,
    }
}

fn saturate(value: u128) -> u64 {
    u64::try_from(value).unwrap_or(u64::MAX)
}

/// Converts a reset or retry time in milliseconds into the whole seconds the protocol reports:
/// rounded up, and at least 1 s (Envoy treats 0 as "no reset").
pub fn reset_seconds(ms: u64) -> u64 {
    ms.div_ceil(1000).max(1)
}

/// The index of the epoch-aligned fixed window that contains `now_ms` (`now / W`).
pub fn counter_window_index(now_ms: u64, window_ms: u64) -> u64 {
    now_ms / effective_window_ms(window_ms)
}

/// The `(prev, curr)` counts as seen from fixed window `index`, for a counter whose counts were
/// last written in window `stored_index`: unchanged in the same window, shifted by one in the next,
/// zero after that. A `stored_index` ahead of `index` (a clock that stepped back) keeps the stored
/// counts, the conservative choice.
pub fn counter_counts(stored_index: u64, prev: u64, curr: u64, index: u64) -> (u64, u64) {
    if index <= stored_index {
        (prev, curr)
    } else if index - stored_index == 1 {
        (curr, 0)
    } else {
        (0, 0)
    }
}

/// The counter's usage at `now_ms`, scaled by the window length: `prev * (W - e) + curr * W`
/// where `e` is the time elapsed in the current fixed window. Comparing this with `limit * W`
/// keeps the weighted estimate exact in integers.
pub fn counter_used_scaled(window_ms: u64, now_ms: u64, prev: u64, curr: u64) -> u128 {
    let window = u128::from(effective_window_ms(window_ms));
    let elapsed = u128::from(now_ms % effective_window_ms(window_ms));
    (u128::from(prev) * (window - elapsed)).saturating_add(u128::from(curr) * window)
}

/// The largest usage a hit still fits on top of, in the same units as the usage it is compared
/// with (scale 1 for the log, W for the counter); `None` when the hit can never fit.
fn budget(limit: u64, cost: Cost, scale: u128) -> Option<u128> {
    let capacity = u128::from(limit) * scale;
    match normalize_cost(cost) {
        Cost::Consume(units) if units <= limit => Some(capacity - u128::from(units) * scale),
        // A check fits unless usage is above capacity, as envoyproxy/ratelimit decides it: a
        // full limit still answers OK to a check, and a limit of 0 does until something is
        // charged to it.
        Cost::CheckOnly => Some(capacity),
        Cost::Consume(_) => None,
    }
}

/// The units a hit records: its cost when admitted, and when refused under [`Counting::All`];
/// nothing for a check or a refused hit under [`Counting::Admitted`].
fn charged(cost: Cost, admitted: bool, counting: Counting) -> Option<u64> {
    match normalize_cost(cost) {
        Cost::Consume(units) if admitted || counting == Counting::All => Some(units),
        _ => None,
    }
}

/// For a counter refusing a hit that fits the limit on its own (`budget` known): milliseconds
/// until it would fit, if nothing else arrived. `elapsed` is the time into fixed window `k`,
/// `prev` and `curr` the counts of windows `k - 1` and `k` as they stand.
fn counter_retry(window: u128, elapsed: u128, prev: u64, curr: u64, budget: u128) -> u128 {
    let curr_scaled = u128::from(curr) * window;
    if curr_scaled <= budget {
        // Refused although curr alone fits, so prev > 0: wait inside window k until prev's
        // weight has shrunk enough. (Division by zero cannot happen; the fallback keeps it total.)
        let prev_may_weigh = (budget - curr_scaled)
            .checked_div(u128::from(prev))
            .unwrap_or(window);
        let admit_at = window - prev_may_weigh.min(window);
        admit_at.saturating_sub(elapsed).max(1)
    } else {
        // curr alone is too much (so curr > 0): in window k+1 it becomes prev and shrinks.
        let curr_may_weigh = budget.checked_div(u128::from(curr)).unwrap_or(0);
        let admit_at = window - curr_may_weigh.min(window);
        (window - elapsed) + admit_at
    }
}

/// The verdict on an admitted hit that left counts `prev` and `curr` in fixed windows `k - 1`
/// and `k`, `elapsed_ms` into window `k`: what [`counter_decide`] answers, and what a store that
/// decided and recorded the hit answers from those counts alone.
pub fn counter_admitted(
    limit: u64,
    window_ms: u64,
    elapsed_ms: u64,
    prev: u64,
    curr: u64,
) -> Verdict {
    let window = u128::from(effective_window_ms(window_ms));
    let elapsed = u128::from(elapsed_ms).min(window);
    let capacity = u128::from(limit) * window;
    let used = (u128::from(prev) * (window - elapsed)).saturating_add(u128::from(curr) * window);
    // curr's units count until window k+1 has fully passed; prev's until window k ends.
    let reset = if curr > 0 {
        2 * window - elapsed
    } else if prev > 0 {
        window - elapsed
    } else {
        0
    };
    Verdict {
        admitted: true,
        remaining: saturate(capacity.saturating_sub(used) / window),
        reset_ms: saturate(reset),
    }
}

/// Decides one hit against a sliding window counter at `now_ms`.
///
/// `prev` and `curr` are the units recorded in fixed windows `k - 1` and `k`, where
/// `k = now_ms / window_ms` (use [`counter_counts`] to roll stored counts forward). The caller
/// records the charge: when the verdict admits a `Consume(c)`, add `c` to `curr` of window `k`;
/// when it refuses one under [`Counting::All`], set `curr` to [`counter_refused_count`]. The
/// verdict describes the window after that charge. `Consume(0)` is treated as
/// [`Cost::CheckOnly`]; a window of 0 ms as 1 ms. Never panics, whatever the counts (they may be
/// above the limit when refused hits are charged).
pub fn counter_decide(
    limit: u64,
    window_ms: u64,
    now_ms: u64,
    prev: u64,
    curr: u64,
    cost: Cost,
    counting: Counting,
) -> Verdict {
    let window = u128::from(effective_window_ms(window_ms));
    let elapsed = u128::from(now_ms % effective_window_ms(window_ms));
    let capacity = u128::from(limit) * window;
    let used = counter_used_scaled(window_ms, now_ms, prev, curr);
    let budget = budget(limit, cost, window);
    let admitted = budget.is_some_and(|budget| used <= budget);

    if admitted {
        let charged = charged(cost, true, counting).unwrap_or(0);
        // Admitted within the limit, so curr + charged <= limit: no overflow.
        let curr_after = curr.saturating_add(charged);
        return counter_admitted(limit, window_ms, saturate(elapsed), prev, curr_after);
    }

    // Refused: the window as it stands after the charge, if this mode charges refused hits.
    let curr = match charged(cost, false, counting) {
        Some(units) => counter_refused_count(curr, units),
        None => curr,
    };
    let used = counter_used_scaled(window_ms, now_ms, prev, curr);
    let remaining = saturate(capacity.saturating_sub(used) / window);
    let reset_ms = match budget {
        Some(budget) => counter_retry(window, elapsed, prev, curr, budget),
        // The hit is larger than the whole limit and can never fit: the full window.
        None => window,
    };
    Verdict {
        admitted: false,
        remaining,
        reset_ms: saturate(reset_ms),
    }
}

/// Whether a log entry recorded at `entry_ms` still counts at `now_ms`: `entry > now - W`.
pub fn log_entry_live(entry_ms: u64, window_ms: u64, now_ms: u64) -> bool {
    u128::from(entry_ms) + u128::from(effective_window_ms(window_ms)) > u128::from(now_ms)
}

/// Decides one hit against a sliding window log whose expired entries are already dropped.
///
/// `used` is the sum of the live entries' costs, `newest_ms` the time of the newest live entry
/// (`None` when there is none), and `live_oldest_first` yields the live entries as
/// `(time_ms, cost)` from oldest to newest; it is only iterated when the hit is refused, so a
/// store with a running sum decides an admitted hit in O(1). The caller records the charge: when
/// the verdict admits a `Consume(c)`, append one entry `(now_ms, c)`; when it refuses one under
/// [`Counting::All`], append `(now_ms, log_refused_cost(limit, c))`. The verdict describes the log
/// after that charge. `Consume(0)` is treated as [`Cost::CheckOnly`]; a window of 0 ms as 1 ms.
/// Never panics, whatever the sum (it may be above the limit when refused hits are charged).
#[allow(clippy::too_many_arguments)]
pub fn log_decide_live<I>(
    limit: u64,
    window_ms: u64,
    now_ms: u64,
    used: u128,
    newest_ms: Option<u64>,
    live_oldest_first: I,
    cost: Cost,
    counting: Counting,
) -> Verdict
where
    I: IntoIterator<Item = (u64, u64)>,
{
    let window = u128::from(effective_window_ms(window_ms));
    let capacity = u128::from(limit);
    let budget = budget(limit, cost, 1);

    if budget.is_some_and(|budget| used <= budget) {
        return match normalize_cost(cost) {
            Cost::Consume(units) => Verdict {
                admitted: true,
                remaining: saturate(capacity - used - u128::from(units)),
                // The new entry, at now, is the newest and leaves last.
                reset_ms: saturate(window),
            },
            Cost::CheckOnly => Verdict {
                admitted: true,
                remaining: saturate(capacity - used),
                reset_ms: newest_ms.map_or(0, |newest| {
                    saturate((u128::from(newest) + window).saturating_sub(u128::from(now_ms)))
                }),
            },
        };
    }

    // Refused: the log as it stands after the charge, if this mode charges refused hits.
    let entry =
        charged(cost, false, counting).map(|units| (now_ms, log_refused_cost(limit, units)));
    let used = used.saturating_add(entry.map_or(0, |(_, cost)| u128::from(cost)));
    let remaining = saturate(capacity.saturating_sub(used));
    let Some(budget) = budget else {
        // The hit is larger than the whole limit and can never fit: the full window.
        return Verdict {
            admitted: false,
            remaining,
            reset_ms: saturate(window),
        };
    };
    // Entries leave oldest first; the hit fits once enough of them have left.
    let mut left = used;
    for (time_ms, entry_cost) in live_oldest_first.into_iter().chain(entry) {
        left = left.saturating_sub(u128::from(entry_cost));
        if left <= budget {
            let retry = (u128::from(time_ms) + window).saturating_sub(u128::from(now_ms));
            return Verdict {
                admitted: false,
                remaining,
                reset_ms: saturate(retry.max(1)),
            };
        }
    }
    // Only reachable when `used` disagrees with the entries; the full window is always safe.
    Verdict {
        admitted: false,
        remaining,
        reset_ms: saturate(window),
    }
}

/// Decides one hit against a sliding window log given all its entries as `(time_ms, cost)`, in
/// any order, expired ones included. The reference form of [`log_decide_live`] for tests and for
/// checking other implementations; it is O(n log n) per call.
pub fn log_decide(
    limit: u64,
    window_ms: u64,
    now_ms: u64,
    entries: &[(u64, u64)],
    cost: Cost,
    counting: Counting,
) -> Verdict {
    let mut live: Vec<(u64, u64)> = entries
        .iter()
        .copied()
        .filter(|&(time_ms, _)| log_entry_live(time_ms, window_ms, now_ms))
        .collect();
    live.sort_by_key(|&(time_ms, _)| time_ms);
    let used = live
        .iter()
        .fold(0u128, |sum, &(_, c)| sum.saturating_add(u128::from(c)));
    let newest = live.last().map(|&(time_ms, _)| time_ms);
    log_decide_live(limit, window_ms, now_ms, used, newest, live, cost, counting)
}

#[cfg(test)]
mod tests;
