//! Hits and outcomes for tests that talk to a backend below the limiter.

use std::sync::atomic::{AtomicU64, Ordering};

use tollgate::backend::{Backend, Hit, Outcome};
use tollgate::window::{Algorithm, Cost, Counting};

/// Both algorithms, for cases that hold for each.
pub const ALGORITHMS: [Algorithm; 2] =
    [Algorithm::SlidingWindowCounter, Algorithm::SlidingWindowLog];

/// A limiter identity starting with `name` that no other hit of this process uses.
pub fn fresh_key(name: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!("{name}|{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

/// Both counting modes, for cases that hold for each.
pub const COUNTINGS: [Counting; 2] = [Counting::Admitted, Counting::All];

/// An unsharded hit that records admitted hits only.
pub fn hit(key: &str, algorithm: Algorithm, limit: u64, window_ms: u64, cost: Cost) -> Hit {
    Hit {
        key: key.to_owned(),
        algorithm,
        limit,
        window_ms,
        cost,
        counting: Counting::Admitted,
        shards: 1,
        lease_ms: 0,
        tentative: false,
        group: 0,
        descriptor_tag: false,
        slice: false,
    }
}

/// The same hit as one of a request with other limits: its charge may be given back.
pub fn tentative(hit: Hit) -> Hit {
    Hit {
        tentative: true,
        group: 0,
        descriptor_tag: false,
        slice: false,
        ..hit
    }
}

/// The same hit, recording refused hits too when `counting` is [`Counting::All`].
pub fn counted(hit: Hit, counting: Counting) -> Hit {
    Hit { counting, ..hit }
}

/// The outcome of one hit, which must be decided.
pub async fn one<B: Backend>(backend: &B, hit: &Hit) -> Outcome {
    let mut results = backend.acquire(std::slice::from_ref(hit)).await;
    assert_eq!(results.len(), 1, "one answer per hit");
    results
        .remove(0)
        .unwrap_or_else(|err| panic!("{hit:?}: {err}"))
}

/// Asserts whether a hit was admitted and what it left, whatever its reset.
pub fn assert_admitted(outcome: &Outcome, admitted: bool, remaining: u64) {
    assert_eq!(
        (outcome.verdict.admitted, outcome.verdict.remaining),
        (admitted, remaining),
        "{outcome:?}"
    );
}
