//! Tests of the window math: each algorithm's admit, refuse, remaining and retry answers at the
//! edges of a window, and randomised checks that no window admits more than its limit and that
//! every retry time is the earliest instant a hit is admitted. Kept beside `window.rs`, not in
//! it, so the math reads on one screen.

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
    let first = admitted_count((0..n).map(|_| counter.hit(n, W, before_edge, Cost::Consume(1))));
    assert_eq!(first, n as usize);
    // Just after the edge the previous window still weighs almost fully.
    let after_edge = 8 * W + 1;
    let second = admitted_count((0..n).map(|_| counter.hit(n, W, after_edge, Cost::Consume(1))));
    // A fixed window would admit another n here (2n across the edge); the estimate
    // 100 * 999/1000 = 99.9 leaves no whole unit.
    assert_eq!(second, 0);
    assert!(first + second < 2 * n as usize);
    // The estimate never exceeded the limit.
    assert!(counter_used_scaled(W, after_edge, counter.prev, counter.curr) <= u128::from(n * W));
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
                        let c = counter_decide(limit, window, now, count, count, cost, counting);
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
                Cost::Consume(c) => estimate + u128::from(c * window) <= u128::from(limit * window),
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
