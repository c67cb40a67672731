//! Backend-level cases: `Hit` in, `Outcome` out, below the limiter: the window math at the edges
//! (weighted costs, huge limits and costs, a limit of 0), checks, receipts and releases, several
//! limiters in one call, and the log's retry time. Redis reads the wall clock, so the windows are
//! long enough that no fixed-window boundary falls inside a run, and reset times are checked
//! against the bounds the clock allows around each call.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tollgate::backend::{Backend, Outcome};
use tollgate::window::{self, Algorithm, Cost, Counting, Verdict};
use tollgate_testkit::cases;
use tollgate_testkit::hits::{ALGORITHMS, assert_admitted, counted, fresh_key, hit, one};
use tollgate_testkit::target::Target;

cases! {
    admits_up_to_the_limit: exact;
    weighted_costs: exact;
    check_only_hits_consume_nothing: exact;
    refused_hits_are_charged_where_every_hit_counts: exact;
    cost_above_the_limit_never_fits: exact;
    release_restores_the_quota: exact;
    several_limiters_in_one_call: exact;
    log_retry_waits_for_the_oldest_entry: exact;
}

/// A window so long that no fixed-window boundary falls inside a test run (the next is in 2039):
/// with no previous window, counter results do not depend on the instant.
const LONG_WINDOW_MS: u64 = 1 << 40;
const HOUR_MS: u64 = 3_600_000;

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_millis() as u64
}

/// Asserts a hit's counts, and its reset time against the bounds the wall clock allows around
/// the call.
fn assert_verdict(outcome: &Outcome, admitted: bool, remaining: u64, reset_range: (u64, u64)) {
    let Verdict { reset_ms, .. } = outcome.verdict;
    assert_admitted(outcome, admitted, remaining);
    assert!(
        (reset_range.0..=reset_range.1).contains(&reset_ms),
        "reset {reset_ms} outside {reset_range:?} in {outcome:?}"
    );
}

/// The time until the end of the fixed window after the current one, from either side of a call.
fn counter_reset_bounds(before: u64, after: u64) -> (u64, u64) {
    let end = (after / LONG_WINDOW_MS + 2) * LONG_WINDOW_MS;
    (end - after - 1000, end - before + 1000)
}

/// Hits are admitted until the limit is used, with receipts; then refused with nothing to give
/// back and the exact wait (counter: until the next window weighs it down; log: until the oldest
/// entry leaves).
async fn admits_up_to_the_limit(t: &Target) {
    let backend = t.backend().await;
    for algorithm in ALGORITHMS {
        let key = fresh_key("up-to-limit");
        let h = hit(&key, algorithm, 5, LONG_WINDOW_MS, Cost::Consume(1));
        for remaining in (0..5).rev() {
            let before = now_ms();
            let outcome = one(&backend, &h).await;
            let after = now_ms();
            let reset = match algorithm {
                Algorithm::SlidingWindowCounter => counter_reset_bounds(before, after),
                Algorithm::SlidingWindowLog => (LONG_WINDOW_MS, LONG_WINDOW_MS),
            };
            assert_verdict(&outcome, true, remaining, reset);
            let receipt = outcome.receipt.expect("an admitted charge has a receipt");
            assert_eq!((receipt.cost, receipt.algorithm), (1, algorithm));
        }
        let before = now_ms();
        let refused = one(&backend, &h).await;
        let after = now_ms();
        assert_eq!(refused.receipt, None);
        let bounds = match algorithm {
            // curr = 5 must slide out of the next window far enough for one more unit
            Algorithm::SlidingWindowCounter => {
                let expected = |now: u64| {
                    window::counter_decide(
                        5,
                        LONG_WINDOW_MS,
                        now,
                        0,
                        5,
                        Cost::Consume(1),
                        Counting::Admitted,
                    )
                    .reset_ms
                };
                (expected(after + 1000), expected(before - 1000))
            }
            // the oldest entry, a little older than now, must leave the window
            Algorithm::SlidingWindowLog => (LONG_WINDOW_MS - 60_000, LONG_WINDOW_MS),
        };
        assert_verdict(&refused, false, 0, bounds);
    }
}

/// A hit costs its weight; one that does not fit consumes nothing.
async fn weighted_costs(t: &Target) {
    let backend = t.backend().await;
    for algorithm in ALGORITHMS {
        let key = fresh_key("weighted");
        let at = |cost| hit(&key, algorithm, 10, LONG_WINDOW_MS, cost);
        let first = one(&backend, &at(Cost::Consume(4))).await;
        assert_admitted(&first, true, 6);
        assert_eq!(first.receipt.as_ref().map(|r| r.cost), Some(4));

        let too_much = one(&backend, &at(Cost::Consume(7))).await;
        assert!(!too_much.verdict.admitted, "{too_much:?}");
        assert_eq!(
            too_much.verdict.remaining, 6,
            "a refused hit consumes nothing"
        );
        assert!(too_much.verdict.reset_ms > 0);

        assert_admitted(&one(&backend, &at(Cost::Consume(6))).await, true, 0);
        assert_admitted(&one(&backend, &at(Cost::Consume(1))).await, false, 0);
    }
}

/// A check (or a cost of 0) consumes nothing, has no receipt, and passes while a unit is left.
async fn check_only_hits_consume_nothing(t: &Target) {
    let backend = t.backend().await;
    for algorithm in ALGORITHMS {
        let key = fresh_key("check-only");
        let at = |cost| hit(&key, algorithm, 2, LONG_WINDOW_MS, cost);
        for cost in [Cost::CheckOnly, Cost::Consume(0)] {
            let check = one(&backend, &at(cost)).await;
            // nothing counted yet: the quota is whole, so there is nothing to wait for
            assert_verdict(&check, true, 2, (0, 0));
            assert_eq!(check.receipt, None, "a check has nothing to give back");
        }
        assert!(one(&backend, &at(Cost::Consume(1))).await.verdict.admitted);
        let half = one(&backend, &at(Cost::CheckOnly)).await;
        assert_admitted(&half, true, 1);
        assert!(half.verdict.reset_ms > 0, "{half:?}");
        assert!(one(&backend, &at(Cost::Consume(1))).await.verdict.admitted);
        // Full is not over: a check is refused only when usage is above the limit.
        let full = one(&backend, &at(Cost::CheckOnly)).await;
        assert_admitted(&full, true, 0);
        assert!(full.verdict.reset_ms > 0);
        let over = one(
            &backend,
            &hit(&key, algorithm, 1, LONG_WINDOW_MS, Cost::CheckOnly),
        )
        .await;
        assert_admitted(&over, false, 0);
        assert!(over.verdict.reset_ms > 0);
        assert_eq!(over.receipt, None);
    }
}

/// Where every hit counts, a refused hit is charged too (without a receipt: nothing gives it
/// back), usage goes above the limit, and checks are refused until it slides out; a debit of
/// any size, u64::MAX included, is charged without overflow.
async fn refused_hits_are_charged_where_every_hit_counts(t: &Target) {
    let backend = t.backend().await;
    for algorithm in ALGORITHMS {
        let key = fresh_key("count-all");
        let at = |cost| {
            counted(
                hit(&key, algorithm, 10, LONG_WINDOW_MS, cost),
                Counting::All,
            )
        };
        assert_admitted(&one(&backend, &at(Cost::Consume(9))).await, true, 1);
        let debit = one(&backend, &at(Cost::Consume(5))).await;
        assert_admitted(&debit, false, 0);
        assert_eq!(debit.receipt, None);
        let check = one(&backend, &at(Cost::CheckOnly)).await;
        assert_admitted(&check, false, 0);
        // The same refusal recording nothing leaves the count where it was: 14 of 10.
        let lenient = one(
            &backend,
            &hit(&key, algorithm, 10, LONG_WINDOW_MS, Cost::Consume(1)),
        )
        .await;
        assert_admitted(&lenient, false, 0);
        // Over the limit by any amount, with no overflow.
        for cost in [u64::MAX, u64::MAX - 1, 1 << 53] {
            let huge = one(&backend, &at(Cost::Consume(cost))).await;
            assert_admitted(&huge, false, 0);
            assert!(huge.verdict.reset_ms > 0, "{huge:?}");
        }
        // A limit of 0 answers checks OK until something is charged to it.
        let zero_key = fresh_key("count-all-zero");
        let zero = |cost| counted(hit(&zero_key, algorithm, 0, HOUR_MS, cost), Counting::All);
        assert_admitted(&one(&backend, &zero(Cost::CheckOnly)).await, true, 0);
        assert_verdict(
            &one(&backend, &zero(Cost::Consume(1))).await,
            false,
            0,
            (HOUR_MS, HOUR_MS),
        );
        assert_admitted(&one(&backend, &zero(Cost::CheckOnly)).await, false, 0);
    }
}

/// A cost above the limit is refused for a full window whatever its size; a limit of 0 refuses
/// everything; a huge limit with a huge cost is exact.
async fn cost_above_the_limit_never_fits(t: &Target) {
    let backend = t.backend().await;
    for algorithm in ALGORITHMS {
        let key = fresh_key("too-big");
        let at = |limit, cost| hit(&key, algorithm, limit, HOUR_MS, cost);
        for cost in [4, 1 << 53, u64::MAX - 1, u64::MAX] {
            let refused = one(&backend, &at(3, Cost::Consume(cost))).await;
            assert_verdict(&refused, false, 3, (HOUR_MS, HOUR_MS));
            assert_eq!(refused.receipt, None);
        }
        // nothing was consumed by the refusals
        assert_admitted(&one(&backend, &at(3, Cost::Consume(3))).await, true, 0);
        // a limit of 0 refuses every charge for a full window; nothing is above it, so a check
        // passes
        let zero_key = fresh_key("zero");
        let refused = one(
            &backend,
            &hit(&zero_key, algorithm, 0, HOUR_MS, Cost::Consume(1)),
        )
        .await;
        assert_verdict(&refused, false, 0, (HOUR_MS, HOUR_MS));
        let check = one(
            &backend,
            &hit(&zero_key, algorithm, 0, HOUR_MS, Cost::CheckOnly),
        )
        .await;
        assert_verdict(&check, true, 0, (0, 0));
        let huge_key = fresh_key("huge");
        let limit = (1 << 53) - 1;
        let huge = |cost| hit(&huge_key, algorithm, limit, LONG_WINDOW_MS, cost);
        assert_admitted(
            &one(&backend, &huge(Cost::Consume(limit - 1))).await,
            true,
            1,
        );
        assert_admitted(&one(&backend, &huge(Cost::Consume(2))).await, false, 1);
    }
}

/// Releasing a receipt gives back exactly that charge (a log entry only once); releasing nothing
/// is fine.
async fn release_restores_the_quota(t: &Target) {
    let backend = t.backend().await;
    for algorithm in ALGORITHMS {
        let key = fresh_key("release");
        let at = |cost| hit(&key, algorithm, 5, LONG_WINDOW_MS, cost);
        let kept = one(&backend, &at(Cost::Consume(2))).await;
        let given_back = one(&backend, &at(Cost::Consume(3))).await;
        assert_eq!(given_back.verdict.remaining, 0);
        let receipt = given_back.receipt.expect("a receipt");
        backend
            .release(std::slice::from_ref(&receipt))
            .await
            .expect("release");
        let check = one(&backend, &at(Cost::CheckOnly)).await;
        assert_eq!(check.verdict.remaining, 3, "exactly that charge came back");
        if algorithm == Algorithm::SlidingWindowLog {
            // the entry is gone: giving it back twice gives nothing more (a counter cannot
            // tell, and only saturates at zero)
            backend.release(&[receipt]).await.expect("release again");
            assert_eq!(
                one(&backend, &at(Cost::CheckOnly)).await.verdict.remaining,
                3
            );
        }
        backend
            .release(&[kept.receipt.expect("a receipt")])
            .await
            .expect("release");
        assert_admitted(&one(&backend, &at(Cost::Consume(5))).await, true, 0);
        backend.release(&[]).await.expect("releasing nothing");
    }
}

/// One call with hits on two limiters, each limiter hit twice: each hit is decided on its own
/// and answered in its place. Hits on one limiter in one call may be decided in either order (a
/// cluster runs the calls concurrently), so which of the two is admitted is not fixed, only
/// that one is, with the counts that go with it.
async fn several_limiters_in_one_call(t: &Target) {
    let backend = t.backend().await;
    let counter = fresh_key("many-counter");
    let log = fresh_key("many-log");
    let counter_hit = hit(
        &counter,
        Algorithm::SlidingWindowCounter,
        3,
        LONG_WINDOW_MS,
        Cost::Consume(2),
    );
    let log_hit = hit(
        &log,
        Algorithm::SlidingWindowLog,
        1,
        LONG_WINDOW_MS,
        Cost::Consume(1),
    );
    let hits = [counter_hit.clone(), log_hit.clone(), log_hit, counter_hit];
    let answers: Vec<(bool, u64)> = backend
        .acquire(&hits)
        .await
        .into_iter()
        .map(|result| {
            let verdict = result.expect("decided").verdict;
            (verdict.admitted, verdict.remaining)
        })
        .collect();
    let sorted = |mut pair: [(bool, u64); 2]| {
        pair.sort();
        pair
    };
    // counter: 2 of 3 taken leaves 1, and the other 2 do not fit into it
    assert_eq!(
        sorted([answers[0], answers[3]]),
        [(false, 1), (true, 1)],
        "{answers:?}"
    );
    // log: the one unit taken leaves nothing
    assert_eq!(
        sorted([answers[1], answers[2]]),
        [(false, 0), (true, 0)],
        "{answers:?}"
    );
    assert!(backend.acquire(&[]).await.is_empty());
}

/// The log's retry time waits for as many of the oldest entries to leave as the hit needs.
async fn log_retry_waits_for_the_oldest_entry(t: &Target) {
    let backend = t.backend().await;
    let key = fresh_key("log-retry");
    let at = |cost| hit(&key, Algorithm::SlidingWindowLog, 4, HOUR_MS, cost);
    let start = now_ms();
    assert!(one(&backend, &at(Cost::Consume(3))).await.verdict.admitted);
    assert!(one(&backend, &at(Cost::Consume(1))).await.verdict.admitted);
    // one more unit needs the cost-3 entry (the oldest) to leave; so do 3 more units
    let end = now_ms();
    // The second refusal may come from the local over-limit cache, whose entry counts from
    // before the first refusal's call: its reset is shorter by up to that call's time.
    let mut slack = 0;
    for cost in [1, 3] {
        let before = now_ms();
        let refused = one(&backend, &at(Cost::Consume(cost))).await;
        let after = now_ms();
        assert_verdict(
            &refused,
            false,
            0,
            (
                (start + HOUR_MS).saturating_sub(after + slack),
                end + HOUR_MS - start,
            ),
        );
        slack = after - before;
    }
}
