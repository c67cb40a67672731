//! Waiting for something outside the test to change state (a server to start, a replica to take
//! over, a reload to land): poll with a deadline, and say what was awaited when it never came.
//! Never a fixed sleep.

use std::time::{Duration, Instant};

/// How often a condition is checked.
const POLL_EVERY: Duration = Duration::from_millis(50);

/// Polls `check` until it holds, panicking with `what` after `limit`.
pub fn until(what: &str, limit: Duration, mut check: impl FnMut() -> bool) {
    until_some(what, limit, || check().then_some(()));
}

/// Polls `probe` until it answers `Some`, and answers that value; panics with `what` after
/// `limit`.
pub fn until_some<T>(what: &str, limit: Duration, mut probe: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(value) = probe() {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {limit:?} waiting for {what}"
        );
        std::thread::sleep(POLL_EVERY);
    }
}
