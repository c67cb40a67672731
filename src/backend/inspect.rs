//! What a window holds, read without charging it: the answer to an operator asking about one
//! client's usage ([`super::Backend::peek`]). The stores read their raw state (a counter's two
//! fixed-window counts, a log's live entries) and this module turns it into usage with the same
//! window math a decision uses, so `remaining` is what a check (`hits_addend: 0`) would answer.

use crate::window;

/// The state of one limit's window at the instant it was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WindowState {
    /// The units the algorithm counts now, rounded up: a sliding window counter's weighted
    /// estimate (`prev * (W - e) / W + curr`), a sliding window log's entries inside the window
    /// (slices reserved by leases included). May exceed the limit under `counting: all`.
    pub used: u64,
    /// What a hit could still consume now: `floor(limit - usage)`, at least 0, as a check
    /// answers it.
    pub remaining: u64,
    /// Milliseconds until every recorded unit has left the window (0 when nothing is recorded).
    pub reset_ms: u64,
}

impl WindowState {
    /// A sliding window counter of `limit` units per `window_ms`, read at `now_ms`, whose fixed
    /// windows `k - 1` and `k` (`k = now / W`) hold `prev` and `curr` units (already rolled
    /// forward with [`window::counter_counts`]).
    pub fn counter(limit: u64, window_ms: u64, now_ms: u64, prev: u64, curr: u64) -> WindowState {
        let window = window::effective_window_ms(window_ms);
        let scaled = window::counter_used_scaled(window, now_ms, prev, curr);
        let w = u128::from(window);
        let used = scaled.div_ceil(w);
        let remaining = (u128::from(limit) * w).saturating_sub(scaled) / w;
        let elapsed = now_ms % window;
        let reset_ms = if curr > 0 {
            2 * window - elapsed
        } else if prev > 0 {
            window - elapsed
        } else {
            0
        };
        WindowState {
            used: saturate(used),
            remaining: saturate(remaining),
            reset_ms,
        }
    }

    /// A sliding window log of `limit` units per `window_ms`, read at `now_ms`, from its entries
    /// as `(time_ms, cost)` in any order; entries that have left the window are skipped, entries
    /// stamped ahead (leased slices) count in full.
    pub fn log(
        limit: u64,
        window_ms: u64,
        now_ms: u64,
        entries: impl IntoIterator<Item = (u64, u64)>,
    ) -> WindowState {
        let mut used: u128 = 0;
        let mut newest: Option<u64> = None;
        for (time_ms, cost) in entries {
            if !window::log_entry_live(time_ms, window_ms, now_ms) {
                continue;
            }
            used = used.saturating_add(u128::from(cost));
            newest = Some(newest.map_or(time_ms, |n| n.max(time_ms)));
        }
        WindowState::log_sum(limit, window_ms, now_ms, used, newest)
    }

    /// A sliding window log whose live entries sum to `used`, the newest stamped `newest_ms`.
    pub fn log_sum(
        limit: u64,
        window_ms: u64,
        now_ms: u64,
        used: u128,
        newest_ms: Option<u64>,
    ) -> WindowState {
        let window = window::effective_window_ms(window_ms);
        WindowState {
            used: saturate(used),
            remaining: saturate(u128::from(limit).saturating_sub(used)),
            reset_ms: newest_ms.map_or(0, |newest| {
                newest.saturating_add(window).saturating_sub(now_ms)
            }),
        }
    }

    /// The state of a limit split over shards, from each shard's: usage and what is left add
    /// up, and the limit is whole again when its last shard is.
    pub fn sum(parts: impl IntoIterator<Item = WindowState>) -> WindowState {
        parts
            .into_iter()
            .fold(WindowState::default(), |total, part| WindowState {
                used: total.used.saturating_add(part.used),
                remaining: total.remaining.saturating_add(part.remaining),
                reset_ms: total.reset_ms.max(part.reset_ms),
            })
    }
}

fn saturate(value: u128) -> u64 {
    u64::try_from(value).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_counter_weighs_the_previous_window_and_rounds_usage_up() {
        // 10 s windows, 2.5 s into window 1: prev 4 weighs 3, curr 1 → 4 used, 6 left of 10.
        let state = WindowState::counter(10, 10_000, 12_500, 4, 1);
        assert_eq!(state.used, 4);
        assert_eq!(state.remaining, 6);
        assert_eq!(state.reset_ms, 17_500);
        // 5 s in: prev 3 weighs 1.5 → 2 used (rounded up), 8 left (rounded down: 8.5).
        let state = WindowState::counter(10, 10_000, 15_000, 3, 0);
        assert_eq!((state.used, state.remaining, state.reset_ms), (2, 8, 5_000));
        assert_eq!(WindowState::counter(10, 10_000, 15_000, 0, 0).remaining, 10);
    }

    #[test]
    fn a_log_counts_live_entries_and_over_the_limit_leaves_nothing() {
        let state = WindowState::log(3, 1_000, 5_000, [(3_900, 5), (4_200, 1), (4_500, 2)]);
        assert_eq!((state.used, state.remaining, state.reset_ms), (3, 0, 500));
        let sum = WindowState::sum([state, WindowState::log(3, 1_000, 5_000, [(4_800, 1)])]);
        assert_eq!((sum.used, sum.remaining, sum.reset_ms), (4, 2, 800));
    }
}
