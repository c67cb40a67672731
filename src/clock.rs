//! Time as the decision code sees it: milliseconds since the Unix epoch, injectable for tests.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// A source of the current time in milliseconds since the Unix epoch.
pub trait Clock: Send + Sync + 'static {
    /// The current time.
    fn now_ms(&self) -> u64;
}

/// The machine's wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0)
    }
}

/// The wall clock as it read at creation, advanced by a monotonic timer: it never steps back or
/// jumps when the machine's clock is set, so durations measured on it are real durations. For
/// timing what a backend with a clock of its own (Redis reads `TIME`) said in relative terms.
#[derive(Debug, Clone, Copy)]
pub struct MonotonicClock {
    origin_ms: u64,
    origin: Instant,
}

impl MonotonicClock {
    /// A clock starting at the wall clock's reading.
    pub fn new() -> Self {
        MonotonicClock {
            origin_ms: SystemClock.now_ms(),
            origin: Instant::now(),
        }
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        MonotonicClock::new()
    }
}

impl Clock for MonotonicClock {
    fn now_ms(&self) -> u64 {
        let elapsed = u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.origin_ms.saturating_add(elapsed)
    }
}

/// A clock that only moves when told to; shared by cloning.
#[derive(Debug, Default, Clone)]
pub struct ManualClock {
    now: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock standing at `now_ms`.
    pub fn new(now_ms: u64) -> Self {
        ManualClock {
            now: Arc::new(AtomicU64::new(now_ms)),
        }
    }

    /// Moves the clock to `now_ms`.
    pub fn set(&self, now_ms: u64) {
        self.now.store(now_ms, Ordering::SeqCst);
    }

    /// Moves the clock forward by `ms`.
    pub fn advance(&self, ms: u64) {
        self.now.fetch_add(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.now.load(Ordering::SeqCst)
    }
}
