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
    /// Read on every decision (twice with the local cache on): the whole reading is the vDSO
    /// call and one multiply-add. Going through `SystemTime` cost three times that, most of it
    /// normalising a difference from the epoch that is the reading itself, then a 128-bit
    /// millisecond count.
    #[cfg(unix)]
    fn now_ms(&self) -> u64 {
        let mut now = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime writes one timespec through the pointer, to a local that
        // outlives the call; CLOCK_REALTIME exists on every Unix.
        if unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut now) } != 0 {
            return wall_ms();
        }
        // Before the epoch reads as the epoch, as `wall_ms` has it.
        let (Ok(secs), Ok(nanos)) = (u64::try_from(now.tv_sec), u64::try_from(now.tv_nsec)) else {
            return 0;
        };
        secs.saturating_mul(1000).saturating_add(nanos / 1_000_000)
    }

    #[cfg(not(unix))]
    fn now_ms(&self) -> u64 {
        wall_ms()
    }
}

/// The wall clock through the standard library, in whole milliseconds; 0 before the epoch.
fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_system_clock_reads_what_the_standard_library_reads() {
        let before = wall_ms();
        let read = SystemClock.now_ms();
        let after = wall_ms();
        assert!(before <= read && read <= after, "{before} {read} {after}");
        // Milliseconds, not seconds or microseconds: past 2020 and before 2100.
        assert!(
            (1_577_836_800_000..4_102_444_800_000).contains(&read),
            "{read}"
        );
    }
}
