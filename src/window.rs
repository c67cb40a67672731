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
mod tests {
    use super::*;

    const W: u64 = 1000;

    const A: Counting = Counting::Admitted;
    const BOTH_COUNTINGS: [Counting; 2] = [Counting::Admitted, Counting::All];

    /// A counter's stored state driven through the pure functions, as a backend would.
    #[derive(Debug, Default, Clone, Copy)]
    struct CounterModel {
        index: u64,
        prev: u64,
        curr: u64,
        counting: Counting,
    }

    impl CounterModel {
        fn counts(&self, window_ms: u64, now_ms: u64) -> (u64, u64) {
            counter_counts(
                self.index,
                self.prev,
                self.curr,
                counter_window_index(now_ms, window_ms),
            )
        }

        /// What the window would answer, without recording anything.
        fn peek(&self, limit: u64, window_ms: u64, now_ms: u64, cost: Cost) -> Verdict {
            let (prev, curr) = self.counts(window_ms, now_ms);
            counter_decide(limit, window_ms, now_ms, prev, curr, cost, self.counting)
        }

        fn hit(&mut self, limit: u64, window_ms: u64, now_ms: u64, cost: Cost) -> Verdict {
            let (prev, curr) = self.counts(window_ms, now_ms);
            let verdict = counter_decide(limit, window_ms, now_ms, prev, curr, cost, self.counting);
            let curr = match (normalize_cost(cost), verdict.admitted, self.counting) {
                (Cost::Consume(units), true, _) => curr + units,
                (Cost::Consume(units), false, Counting::All) => counter_refused_count(curr, units),
                _ => return verdict,
            };
            self.index = counter_window_index(now_ms, window_ms);
            self.prev = prev;
            self.curr = curr;
            verdict
        }
    }

    /// A log's entries driven through the pure functions.
    #[derive(Debug, Default, Clone)]
    struct LogModel {
        entries: Vec<(u64, u64)>,
        counting: Counting,
    }

    impl LogModel {
        fn peek(&self, limit: u64, window_ms: u64, now_ms: u64, cost: Cost) -> Verdict {
            log_decide(limit, window_ms, now_ms, &self.entries, cost, self.counting)
        }

        fn hit(&mut self, limit: u64, window_ms: u64, now_ms: u64, cost: Cost) -> Verdict {
            let verdict = self.peek(limit, window_ms, now_ms, cost);
            match (normalize_cost(cost), verdict.admitted, self.counting) {
                (Cost::Consume(units), true, _) => self.entries.push((now_ms, units)),
                (Cost::Consume(units), false, Counting::All) => {
                    self.entries.push((now_ms, log_refused_cost(limit, units)))
                }
                _ => {}
            }
            verdict
        }

        /// The most any window of length `window_ms` ever held.
        fn max_in_any_window(&self, window_ms: u64) -> u64 {
            max_in_any_window(&self.entries, window_ms)
        }
    }

    /// The most `entries` put in any window of length `window_ms`: the maximum is reached by a
    /// window ending at an entry.
    fn max_in_any_window(entries: &[(u64, u64)], window_ms: u64) -> u64 {
        entries
            .iter()
            .map(|&(end, _)| {
                entries
                    .iter()
                    .filter(|&&(time, _)| time <= end && time + window_ms > end)
                    .map(|&(_, cost)| cost)
                    .sum()
            })
            .max()
            .unwrap_or(0)
    }

    fn admitted_count(verdicts: impl IntoIterator<Item = Verdict>) -> usize {
        verdicts.into_iter().filter(|v| v.admitted).count()
    }

    #[test]
    fn reset_seconds_rounds_up_to_at_least_one() {
        assert_eq!(reset_seconds(0), 1);
        assert_eq!(reset_seconds(1), 1);
        assert_eq!(reset_seconds(999), 1);
        assert_eq!(reset_seconds(1000), 1);
        assert_eq!(reset_seconds(1001), 2);
        assert_eq!(reset_seconds(59_999), 60);
        assert_eq!(reset_seconds(60_000), 60);
        assert_eq!(reset_seconds(u64::MAX), u64::MAX / 1000 + 1);
    }

    #[test]
    fn counter_admits_the_limit_then_rejects_with_exact_remaining() {
        let mut counter = CounterModel::default();
        let now = 10 * W + 250;
        for expected_remaining in (0..5).rev() {
            let v = counter.hit(5, W, now, Cost::Consume(1));
            assert!(v.admitted);
            assert_eq!(v.remaining, expected_remaining);
            // Counted in window 10, so it counts until window 12 starts.
            assert_eq!(v.reset_ms, 12 * W - now);
        }
        let v = counter.hit(5, W, now, Cost::Consume(1));
        assert!(!v.admitted);
        assert_eq!(v.remaining, 0);
        assert_eq!(counter.curr, 5, "a rejected hit consumes nothing");
        // curr = 5 alone fills the limit: in window 11 its weight must drop to 4, i.e. after
        // elapsed 200 ms; from 10_250 that is 750 + 200.
        assert_eq!(v.reset_ms, 950);
    }

    #[test]
    fn counter_remaining_is_before_the_hit_when_rejected() {
        let mut counter = CounterModel::default();
        let now = 3 * W;
        assert!(counter.hit(10, W, now, Cost::Consume(7)).admitted);
        let v = counter.hit(10, W, now, Cost::Consume(4));
        assert!(!v.admitted);
        assert_eq!(v.remaining, 3, "what a smaller hit could still use");
        let v = counter.hit(10, W, now, Cost::Consume(3));
        assert!(v.admitted);
        assert_eq!(v.remaining, 0);
    }

    #[test]
    fn counter_weighs_the_previous_window_by_its_overlap() {
        // prev = 10 at elapsed 300 of the current window weighs 10 * 0.7 = 7.
        let v = counter_decide(10, W, 5 * W + 300, 10, 0, Cost::CheckOnly, A);
        assert!(v.admitted);
        assert_eq!(v.remaining, 3);
        assert_eq!(
            v.reset_ms, 700,
            "prev has left once the current window ends"
        );
        assert_eq!(counter_used_scaled(W, 5 * W + 300, 10, 2), 7000 + 2000);
        // The remaining is floored: 10 * 0.699 = 6.99 used leaves 3.01 -> 3.
        let v = counter_decide(10, W, 5 * W + 301, 10, 0, Cost::CheckOnly, A);
        assert_eq!(v.remaining, 3);
    }

    #[test]
    fn counter_does_not_let_a_second_burst_through_at_the_edge() {
        let n = 100;
        let mut counter = CounterModel::default();
        let before_edge = 8 * W - 1;
        let first =
            admitted_count((0..n).map(|_| counter.hit(n, W, before_edge, Cost::Consume(1))));
        assert_eq!(first, n as usize);
        // Just after the edge the previous window still weighs almost fully.
        let after_edge = 8 * W + 1;
        let second =
            admitted_count((0..n).map(|_| counter.hit(n, W, after_edge, Cost::Consume(1))));
        // A fixed window would admit another n here (2n across the edge); the estimate
        // 100 * 999/1000 = 99.9 leaves no whole unit.
        assert_eq!(second, 0);
        assert!(first + second < 2 * n as usize);
        // The estimate never exceeded the limit.
        assert!(
            counter_used_scaled(W, after_edge, counter.prev, counter.curr) <= u128::from(n * W)
        );
        // Halfway through the next window half the burst has left the estimate.
        let half = 8 * W + 500;
        let third = admitted_count((0..n).map(|_| counter.hit(n, W, half, Cost::Consume(1))));
        assert_eq!(third, 50);
    }

    #[test]
    fn log_admits_exactly_the_limit_in_any_window_across_the_edge() {
        let n = 100;
        let mut log = LogModel::default();
        let before_edge = 8 * W - 1;
        let first = admitted_count((0..n).map(|_| log.hit(n, W, before_edge, Cost::Consume(1))));
        assert_eq!(first, n as usize);
        let after_edge = 8 * W + 1;
        let second = admitted_count((0..n).map(|_| log.hit(n, W, after_edge, Cost::Consume(1))));
        assert_eq!(second, 0, "the window ending now already holds the limit");
        // The burst leaves one window after it arrived, all at once.
        let v = log.hit(n, W, before_edge + W - 1, Cost::Consume(1));
        assert!(!v.admitted);
        assert_eq!(v.reset_ms, 1);
        let later = before_edge + W;
        let third = admitted_count((0..n + 5).map(|_| log.hit(n, W, later, Cost::Consume(1))));
        assert_eq!(third, n as usize);
        assert_eq!(log.max_in_any_window(W), n);
    }

    #[test]
    fn log_counts_a_weighted_hit_as_one_entry() {
        let mut log = LogModel::default();
        let v = log.hit(10, W, 5000, Cost::Consume(3));
        assert_eq!((v.admitted, v.remaining, v.reset_ms), (true, 7, W));
        assert!(log.hit(10, W, 5100, Cost::Consume(3)).admitted);
        assert!(log.hit(10, W, 5200, Cost::Consume(3)).admitted);
        assert_eq!(log.entries.len(), 3);
        let v = log.hit(10, W, 5300, Cost::Consume(3));
        assert!(!v.admitted);
        assert_eq!(v.remaining, 1);
        // 9 used, 7 allowed before the hit: the first entry (t=5000) must leave.
        assert_eq!(v.reset_ms, 5000 + W - 5300);
        let v = log.hit(10, W, 5300, Cost::Consume(1));
        assert_eq!((v.admitted, v.remaining), (true, 0));
        let v = log.hit(10, W, 5300, Cost::Consume(1));
        assert_eq!((v.admitted, v.remaining), (false, 0));
    }

    #[test]
    fn counter_weighted_costs() {
        let mut counter = CounterModel::default();
        let now = 2 * W;
        assert_eq!(counter.hit(10, W, now, Cost::Consume(3)).remaining, 7);
        assert_eq!(counter.hit(10, W, now, Cost::Consume(3)).remaining, 4);
        assert_eq!(counter.hit(10, W, now, Cost::Consume(3)).remaining, 1);
        let v = counter.hit(10, W, now, Cost::Consume(3));
        assert_eq!((v.admitted, v.remaining), (false, 1));
        assert_eq!(counter.curr, 9);
        assert!(counter.hit(10, W, now, Cost::Consume(1)).admitted);
    }

    #[test]
    fn check_only_consumes_nothing_and_refuses_only_above_the_limit() {
        let mut counter = CounterModel::default();
        let mut log = LogModel::default();
        let now = 7 * W + 10;
        for _ in 0..10 {
            let c = counter.hit(3, W, now, Cost::CheckOnly);
            let l = log.hit(3, W, now, Cost::CheckOnly);
            assert_eq!((c.admitted, c.remaining, c.reset_ms), (true, 3, 0));
            assert_eq!((l.admitted, l.remaining, l.reset_ms), (true, 3, 0));
        }
        assert_eq!(counter.curr, 0);
        assert!(log.entries.is_empty());

        counter.hit(3, W, now, Cost::Consume(2));
        log.hit(3, W, now, Cost::Consume(2));
        let c = counter.hit(3, W, now, Cost::CheckOnly);
        let l = log.hit(3, W, now, Cost::CheckOnly);
        assert_eq!((c.admitted, c.remaining, c.reset_ms), (true, 1, 2 * W - 10));
        assert_eq!((l.admitted, l.remaining, l.reset_ms), (true, 1, W));

        // A full limit still answers OK to a check: usage is at the limit, not above it.
        counter.hit(3, W, now, Cost::Consume(1));
        log.hit(3, W, now, Cost::Consume(1));
        let c = counter.hit(3, W, now, Cost::CheckOnly);
        let l = log.hit(3, W, now, Cost::CheckOnly);
        assert_eq!((c.admitted, c.remaining, c.reset_ms), (true, 0, 2 * W - 10));
        assert_eq!((l.admitted, l.remaining, l.reset_ms), (true, 0, W));
        assert_eq!(counter.curr, 3);
        assert_eq!(log.entries.len(), 2);

        // Above the limit (a lowered limit here; charged refusals elsewhere), a check is refused
        // until usage is back at the limit.
        let c = counter.hit(2, W, now, Cost::CheckOnly);
        let l = log.hit(2, W, now, Cost::CheckOnly);
        assert_eq!((c.admitted, c.remaining), (false, 0));
        // curr = 3 in window 7 weighs 2 once 1/3 of window 8 has passed: 334 ms into it.
        assert_eq!(c.reset_ms, W - 10 + 334);
        assert_eq!((l.admitted, l.remaining, l.reset_ms), (false, 0, W));
        assert_eq!(counter.curr, 3);
        assert_eq!(log.entries.len(), 2);
    }

    #[test]
    fn consume_zero_is_check_only() {
        for (prev, curr) in [(0, 0), (4, 1), (10, 0), (0, 10), (7, 7)] {
            for now in [0, 1, 999, 12_345] {
                assert_eq!(
                    counter_decide(10, W, now, prev, curr, Cost::Consume(0), A),
                    counter_decide(10, W, now, prev, curr, Cost::CheckOnly, A)
                );
            }
        }
        let entries = [(100, 4), (900, 6)];
        assert_eq!(
            log_decide(10, W, 1000, &entries, Cost::Consume(0), A),
            log_decide(10, W, 1000, &entries, Cost::CheckOnly, A)
        );
        assert_eq!(normalize_cost(Cost::Consume(0)), Cost::CheckOnly);
        assert_eq!(normalize_cost(Cost::Consume(2)), Cost::Consume(2));
    }

    #[test]
    fn cost_above_the_limit_is_rejected_with_the_full_window() {
        let v = counter_decide(10, 60_000, 123_456, 0, 0, Cost::Consume(11), A);
        assert_eq!((v.admitted, v.remaining, v.reset_ms), (false, 10, 60_000));
        let v = counter_decide(10, 60_000, 123_456, 0, 4, Cost::Consume(u64::MAX), A);
        assert_eq!((v.admitted, v.remaining, v.reset_ms), (false, 6, 60_000));
        let v = log_decide(10, 60_000, 123_456, &[], Cost::Consume(11), A);
        assert_eq!((v.admitted, v.remaining, v.reset_ms), (false, 10, 60_000));
        let v = log_decide(
            10,
            60_000,
            123_456,
            &[(123_000, 3)],
            Cost::Consume(u64::MAX),
            A,
        );
        assert_eq!((v.admitted, v.remaining, v.reset_ms), (false, 7, 60_000));
    }

    #[test]
    fn a_limit_of_zero_admits_no_charge_and_every_check_until_charged() {
        for counting in BOTH_COUNTINGS {
            for cost in [Cost::Consume(1), Cost::Consume(5)] {
                let v = counter_decide(0, W, 4321, 0, 0, cost, counting);
                assert_eq!((v.admitted, v.remaining, v.reset_ms), (false, 0, W));
                let v = log_decide(0, W, 4321, &[], cost, counting);
                assert_eq!((v.admitted, v.remaining, v.reset_ms), (false, 0, W));
            }
            // Nothing used is not above 0: a check passes, as envoyproxy/ratelimit answers it.
            let v = counter_decide(0, W, 4321, 0, 0, Cost::CheckOnly, counting);
            assert_eq!((v.admitted, v.remaining, v.reset_ms), (true, 0, 0));
            let v = log_decide(0, W, 4321, &[], Cost::CheckOnly, counting);
            assert_eq!((v.admitted, v.remaining, v.reset_ms), (true, 0, 0));
        }
        // Once a refused hit is charged, checks are refused until it has slid out.
        let mut counter = CounterModel {
            counting: Counting::All,
            ..CounterModel::default()
        };
        let mut log = LogModel {
            counting: Counting::All,
            ..LogModel::default()
        };
        assert!(!counter.hit(0, W, 4 * W + 321, Cost::Consume(1)).admitted);
        assert!(!log.hit(0, W, 4 * W + 321, Cost::Consume(1)).admitted);
        let c = counter.peek(0, W, 4 * W + 321, Cost::CheckOnly);
        let l = log.peek(0, W, 4 * W + 321, Cost::CheckOnly);
        assert_eq!((c.admitted, c.reset_ms), (false, 2 * W - 321));
        assert_eq!((l.admitted, l.reset_ms), (false, W));
    }

    #[test]
    fn remaining_is_never_negative_when_counts_exceed_a_lowered_limit() {
        // A config reload may lower the limit below what is already counted.
        let v = counter_decide(5, W, 10 * W + 100, 50, 50, Cost::CheckOnly, A);
        assert_eq!((v.admitted, v.remaining), (false, 0));
        let v = log_decide(5, W, 10_000, &[(9_500, 50)], Cost::Consume(1), A);
        assert_eq!((v.admitted, v.remaining), (false, 0));
        assert_eq!(v.reset_ms, 500);
    }

    #[test]
    fn extreme_inputs_never_panic() {
        let values = [
            0,
            1,
            2,
            999,
            1000,
            1001,
            u64::from(u32::MAX),
            u64::MAX / 2,
            u64::MAX - 1,
            u64::MAX,
        ];
        let costs = values
            .iter()
            .map(|&c| Cost::Consume(c))
            .chain([Cost::CheckOnly]);
        for cost in costs {
            for &limit in &values {
                for &window in &values {
                    for &now in &values {
                        for (&count, counting) in values.iter().zip(BOTH_COUNTINGS.iter().cycle()) {
                            let counting = *counting;
                            let c =
                                counter_decide(limit, window, now, count, count, cost, counting);
                            assert!(c.remaining <= limit);
                            let c = counter_decide(limit, window, now, count, 0, cost, counting);
                            assert!(c.remaining <= limit);
                            let c = counter_decide(limit, window, now, 0, count, cost, counting);
                            assert!(c.remaining <= limit);
                            let l = log_decide(
                                limit,
                                window,
                                now,
                                &[(now, count), (count, count)],
                                cost,
                                counting,
                            );
                            assert!(l.remaining <= limit);
                            let _ = counter_refused_count(count, limit);
                            let _ = log_refused_cost(limit, count);
                        }
                        let _ = log_entry_live(now, window, limit);
                        let _ = counter_counts(now, limit, window, limit);
                        let _ = reset_seconds(now);
                    }
                }
            }
        }
        // The biggest numbers still give exact answers.
        let v = counter_decide(
            u64::MAX,
            u64::MAX,
            u64::MAX - 1,
            0,
            u64::MAX - 1,
            Cost::Consume(1),
            A,
        );
        assert_eq!((v.admitted, v.remaining), (true, 0));
        let v = log_decide(u64::MAX, W, 5, &[(1, u64::MAX - 1)], Cost::Consume(1), A);
        assert_eq!((v.admitted, v.remaining), (true, 0));
    }

    /// A random counter state in which `prev` and `curr` may exceed the limit (after a reload,
    /// or charged refusals), in either counting mode.
    fn random_counter_case(rng: &mut fastrand::Rng) -> (u64, u64, u64, CounterModel, Cost) {
        let window = rng.u64(1000..=5000);
        let limit = rng.u64(1..=40);
        let now = rng.u64(window..=1_000 * window);
        let state = CounterModel {
            index: counter_window_index(now, window),
            prev: if rng.bool() {
                0
            } else {
                rng.u64(0..=limit + 5)
            },
            curr: rng.u64(0..=limit + 2),
            counting: BOTH_COUNTINGS[rng.usize(0..2)],
        };
        let cost = if rng.u8(0..5) == 0 {
            Cost::CheckOnly
        } else {
            Cost::Consume(rng.u64(1..=limit))
        };
        (window, limit, now, state, cost)
    }

    /// Random log entries, some expired, up to `now`, in either counting mode.
    fn random_log_case(rng: &mut fastrand::Rng) -> (u64, u64, u64, LogModel, Cost) {
        let window = rng.u64(1000..=5000);
        let limit = rng.u64(1..=40);
        let now = rng.u64(2 * window..=1_000 * window);
        let entries = (0..rng.usize(0..12))
            .map(|_| {
                (
                    rng.u64(now - window - 200..=now),
                    rng.u64(1..=limit / 2 + 1),
                )
            })
            .collect();
        let cost = if rng.u8(0..5) == 0 {
            Cost::CheckOnly
        } else {
            Cost::Consume(rng.u64(1..=limit))
        };
        let log = LogModel {
            entries,
            counting: BOTH_COUNTINGS[rng.usize(0..2)],
        };
        (window, limit, now, log, cost)
    }

    #[test]
    fn counter_retry_is_the_exact_earliest_admission() {
        let mut rng = fastrand::Rng::with_seed(0x7011_6a7e);
        let mut rejected = 0;
        for case in 0..20_000 {
            let (window, limit, now, mut state, cost) = random_counter_case(&mut rng);
            // The verdict describes the window after the charge, if the mode charges refusals.
            let v = state.hit(limit, window, now, cost);
            if v.admitted {
                continue;
            }
            rejected += 1;
            assert!(v.reset_ms >= 1);
            let at = now + v.reset_ms;
            assert!(
                !state.peek(limit, window, at - 1, cost).admitted,
                "case {case}: {state:?} L={limit} W={window} now={now} {cost:?}: admitted 1 ms before {v:?}"
            );
            assert!(
                state.peek(limit, window, at, cost).admitted,
                "case {case}: {state:?} L={limit} W={window} now={now} {cost:?}: refused at {v:?}"
            );
            // Every earlier instant is refused too (brute force on a sample).
            if case % 20 == 0 {
                for t in now..at {
                    assert!(
                        !state.peek(limit, window, t, cost).admitted,
                        "case {case} at {t}"
                    );
                }
            }
        }
        assert!(
            rejected > 3_000,
            "the generator must produce plenty of rejections"
        );
    }

    #[test]
    fn log_retry_is_the_exact_earliest_admission() {
        let mut rng = fastrand::Rng::with_seed(0x1065);
        let mut rejected = 0;
        for case in 0..20_000 {
            let (window, limit, now, mut log, cost) = random_log_case(&mut rng);
            let v = log.hit(limit, window, now, cost);
            if v.admitted {
                continue;
            }
            rejected += 1;
            let at = now + v.reset_ms;
            assert!(
                !log.peek(limit, window, at - 1, cost).admitted,
                "case {case}: {log:?} L={limit} W={window} now={now} {cost:?}: admitted early {v:?}"
            );
            assert!(
                log.peek(limit, window, at, cost).admitted,
                "case {case}: {log:?} L={limit} W={window} now={now} {cost:?}: refused at {v:?}"
            );
            if case % 20 == 0 {
                for t in now..at {
                    assert!(
                        !log.peek(limit, window, t, cost).admitted,
                        "case {case} at {t}"
                    );
                }
            }
        }
        assert!(
            rejected > 3_000,
            "the generator must produce plenty of rejections"
        );
    }

    #[test]
    fn counter_reset_on_admit_is_when_the_quota_is_whole_again() {
        let mut rng = fastrand::Rng::with_seed(42);
        for case in 0..20_000 {
            let (window, limit, now, mut state, cost) = random_counter_case(&mut rng);
            let v = state.hit(limit, window, now, cost);
            if !v.admitted {
                continue;
            }
            let whole = |t: u64| {
                let (prev, curr) = state.counts(window, t);
                counter_used_scaled(window, t, prev, curr) == 0
            };
            assert!(whole(now + v.reset_ms), "case {case}: {state:?} {v:?}");
            assert_eq!(
                state
                    .peek(limit, window, now + v.reset_ms, Cost::CheckOnly)
                    .remaining,
                limit
            );
            if v.reset_ms > 0 {
                assert!(!whole(now + v.reset_ms - 1), "case {case}: {state:?} {v:?}");
                assert!(
                    state
                        .peek(limit, window, now + v.reset_ms - 1, Cost::CheckOnly)
                        .remaining
                        < limit
                );
            }
        }
    }

    #[test]
    fn log_reset_on_admit_is_when_the_quota_is_whole_again() {
        let mut rng = fastrand::Rng::with_seed(43);
        for case in 0..20_000 {
            let (window, limit, now, mut log, cost) = random_log_case(&mut rng);
            let v = log.hit(limit, window, now, cost);
            if !v.admitted {
                continue;
            }
            let remaining_at = |t: u64| log.peek(limit, window, t, Cost::CheckOnly).remaining;
            assert_eq!(
                remaining_at(now + v.reset_ms),
                limit,
                "case {case}: {log:?} {v:?}"
            );
            if v.reset_ms > 0 {
                assert!(
                    remaining_at(now + v.reset_ms - 1) < limit,
                    "case {case}: {log:?} {v:?}"
                );
            }
        }
    }

    #[test]
    fn log_never_admits_more_than_the_limit_in_any_window() {
        let mut rng = fastrand::Rng::with_seed(7);
        for case in 0..400 {
            let window = rng.u64(1000..=3000);
            let limit = rng.u64(1..=30);
            let counting = BOTH_COUNTINGS[case % 2];
            let mut log = LogModel {
                counting,
                ..LogModel::default()
            };
            // What the log let through, kept apart from the refusals it charged.
            let mut admitted = Vec::new();
            let mut now = rng.u64(0..1_000_000);
            for _ in 0..300 {
                now += rng.u64(0..=window / 4);
                let cost = match rng.u8(0..10) {
                    0 => Cost::CheckOnly,
                    1 => Cost::Consume(rng.u64(1..=limit + 3)),
                    _ => Cost::Consume(rng.u64(1..=3)),
                };
                let used: u64 = log
                    .entries
                    .iter()
                    .filter(|&&(time, _)| log_entry_live(time, window, now))
                    .map(|&(_, cost)| cost)
                    .sum();
                let charged_before = log.entries.len();
                let v = log.hit(limit, window, now, cost);
                // Admitted exactly when the hit fits what was left.
                let fits = match cost {
                    Cost::Consume(c) => used + c <= limit,
                    Cost::CheckOnly => used <= limit,
                };
                assert_eq!(v.admitted, fits, "{counting}");
                if let (true, Cost::Consume(c)) = (v.admitted, cost) {
                    admitted.push((now, c));
                }
                // Every charge is recorded in the mode that charges it: a debit is never lost.
                let recorded = log.entries.len() - charged_before;
                let expected = match (cost, v.admitted, counting) {
                    (Cost::CheckOnly, _, _) => 0,
                    (Cost::Consume(_), true, _) | (Cost::Consume(_), false, Counting::All) => 1,
                    (Cost::Consume(_), false, Counting::Admitted) => 0,
                };
                assert_eq!(recorded, expected, "{counting} {cost:?} {v:?}");
            }
            assert!(max_in_any_window(&admitted, window) <= limit, "{counting}");
        }
    }

    #[test]
    fn counter_never_exceeds_its_estimate() {
        let mut rng = fastrand::Rng::with_seed(8);
        for case in 0..400 {
            let window = rng.u64(1000..=3000);
            let limit = rng.u64(1..=30);
            let counting = BOTH_COUNTINGS[case % 2];
            let mut counter = CounterModel {
                counting,
                ..CounterModel::default()
            };
            // Every admitted and every charged unit by fixed window index, kept independently of
            // the model.
            let mut admitted: std::collections::HashMap<u64, u64> = Default::default();
            let mut charged: std::collections::HashMap<u64, u64> = Default::default();
            let mut now = rng.u64(0..1_000_000);
            for _ in 0..300 {
                now += rng.u64(0..=window / 4);
                let cost = match rng.u8(0..10) {
                    0 => Cost::CheckOnly,
                    1 => Cost::Consume(rng.u64(1..=limit + 3)),
                    _ => Cost::Consume(rng.u64(1..=3)),
                };
                let k = counter_window_index(now, window);
                let (prev, curr) = counter.counts(window, now);
                let estimate = counter_used_scaled(window, now, prev, curr);
                let v = counter.hit(limit, window, now, cost);
                let fits = match cost {
                    Cost::Consume(c) => {
                        estimate + u128::from(c * window) <= u128::from(limit * window)
                    }
                    Cost::CheckOnly => estimate <= u128::from(limit * window),
                };
                assert_eq!(v.admitted, fits, "{counting}");
                if let Cost::Consume(c) = cost {
                    if v.admitted {
                        *admitted.entry(k).or_default() += c;
                    }
                    if v.admitted || counting == Counting::All {
                        *charged.entry(k).or_default() += c;
                    }
                }
                let prev = charged.get(&(k.wrapping_sub(1))).copied().unwrap_or(0);
                let curr = charged.get(&k).copied().unwrap_or(0);
                assert_eq!(
                    counter.counts(window, now),
                    (prev, curr),
                    "no charge is lost"
                );
                let admitted_now = admitted.get(&k).copied().unwrap_or(0);
                assert!(
                    admitted_now <= limit,
                    "no fixed window admits more than the limit"
                );
                if counting == Counting::Admitted {
                    let estimate = counter_used_scaled(window, now, prev, curr);
                    assert!(estimate <= u128::from(limit) * u128::from(window));
                }
            }
        }
    }

    #[test]
    fn a_refused_debit_is_charged_in_full_under_counting_all() {
        // 1000 tokens an hour, 900 used, and a response that spent 200: the debit is refused
        // (it does not fit) but charged, so the next check is refused too.
        let hour = 3_600_000;
        let now = 10 * hour + 60_000;
        let mut counter = CounterModel {
            counting: Counting::All,
            ..CounterModel::default()
        };
        let mut log = LogModel {
            counting: Counting::All,
            ..LogModel::default()
        };
        assert!(counter.hit(1000, hour, now, Cost::Consume(900)).admitted);
        assert!(log.hit(1000, hour, now, Cost::Consume(900)).admitted);
        let c = counter.hit(1000, hour, now + 1, Cost::Consume(200));
        let l = log.hit(1000, hour, now + 1, Cost::Consume(200));
        assert_eq!((c.admitted, c.remaining), (false, 0));
        assert_eq!((l.admitted, l.remaining), (false, 0));
        assert_eq!(counter.curr, 1100);
        assert_eq!(log.entries, [(now, 900), (now + 1, 200)]);
        let c = counter.peek(1000, hour, now + 2, Cost::CheckOnly);
        let l = log.peek(1000, hour, now + 2, Cost::CheckOnly);
        assert!(!c.admitted && !l.admitted);
        // The log is back at the limit when the first debit leaves; the counter when 1100
        // weighs 1000 in the next hour, 1/11 into it.
        assert_eq!(l.reset_ms, hour - 2);
        assert_eq!(c.reset_ms, hour - 60_002 + hour.div_ceil(11));

        // Under Counting::Admitted the same debit is lost, which is why the mode exists.
        let mut lenient = CounterModel::default();
        assert!(lenient.hit(1000, hour, now, Cost::Consume(900)).admitted);
        assert!(
            !lenient
                .hit(1000, hour, now + 1, Cost::Consume(200))
                .admitted
        );
        assert!(lenient.peek(1000, hour, now + 2, Cost::CheckOnly).admitted);
    }

    #[test]
    fn huge_refused_debits_saturate_without_losing_their_effect() {
        let mut counter = CounterModel {
            counting: Counting::All,
            ..CounterModel::default()
        };
        let mut log = LogModel {
            counting: Counting::All,
            ..LogModel::default()
        };
        let now = 5 * W + 500;
        for _ in 0..3 {
            let c = counter.hit(10, W, now, Cost::Consume(u64::MAX));
            let l = log.hit(10, W, now, Cost::Consume(u64::MAX));
            assert_eq!((c.admitted, c.remaining, c.reset_ms), (false, 0, W));
            assert_eq!((l.admitted, l.remaining, l.reset_ms), (false, 0, W));
        }
        assert_eq!(counter.curr, MAX_COUNT);
        assert_eq!(log.entries, [(now, 11); 3]);
        // Over for as long as the true debit would keep it over: the counter through the end of
        // the next window (MAX_COUNT outweighs 10 until its very last millisecond).
        assert!(!counter.peek(10, W, 7 * W - 1, Cost::CheckOnly).admitted);
        assert!(counter.peek(10, W, 7 * W, Cost::CheckOnly).admitted);
        assert!(!log.peek(10, W, now + W - 1, Cost::CheckOnly).admitted);
        assert!(log.peek(10, W, now + W, Cost::CheckOnly).admitted);
        assert_eq!(counter_refused_count(MAX_COUNT + 5, 1), MAX_COUNT + 5);
        assert_eq!(counter_refused_count(3, 4), 7);
        assert_eq!(log_refused_cost(u64::MAX, u64::MAX), u64::MAX);
        assert_eq!(log_refused_cost(10, 4), 4);
    }

    #[test]
    fn log_decide_live_matches_the_reference_form() {
        let mut rng = fastrand::Rng::with_seed(9);
        for _ in 0..5_000 {
            let (window, limit, now, log, cost) = random_log_case(&mut rng);
            let reference = log.peek(limit, window, now, cost);
            let mut entries = log.entries;
            entries.retain(|&(time, _)| log_entry_live(time, window, now));
            entries.sort_by_key(|&(time, _)| time);
            let used = entries.iter().map(|&(_, c)| u128::from(c)).sum();
            let newest = entries.last().map(|&(time, _)| time);
            let live = log_decide_live(
                limit,
                window,
                now,
                used,
                newest,
                entries.iter().copied(),
                cost,
                log.counting,
            );
            assert_eq!(live, reference);
        }
    }

    #[test]
    fn counts_roll_forward_by_window() {
        assert_eq!(counter_counts(5, 3, 4, 5), (3, 4));
        assert_eq!(counter_counts(5, 3, 4, 6), (4, 0));
        assert_eq!(counter_counts(5, 3, 4, 7), (0, 0));
        assert_eq!(
            counter_counts(5, 3, 4, 4),
            (3, 4),
            "a clock step back keeps the counts"
        );
        assert_eq!(counter_counts(u64::MAX - 1, 3, 4, u64::MAX), (4, 0));
        assert_eq!(counter_window_index(2999, 1000), 2);
        assert_eq!(counter_window_index(5, 0), 5);
        assert!(log_entry_live(1001, 1000, 2000));
        assert!(!log_entry_live(1000, 1000, 2000));
    }
}
