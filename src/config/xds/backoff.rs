//! The wait before reconnecting after the stream to the management server broke, computed as the
//! reference computes it (the Go `jpillora/backoff` package it configures from the
//! `XDS_CLIENT_BACKOFF_*` variables), so that a fleet moving from the reference to tollgate
//! knocks on its control plane at the same pace.
//!
//! For attempt `n` (0, 1, 2, ...): `d = initial * factor^n`; with jitter, `d` is drawn uniformly
//! between `initial` and `d`; the result is kept within `[initial, max]`. A factor below 1 makes
//! `d` shrink, so the clamp holds it at `initial`: with the reference's defaults (10 s, 60 s,
//! factor 0.5) every wait is exactly 10 s. Unlike the reference, the attempt count starts over
//! once a stream has delivered a response, so one bad hour does not leave every later reconnect
//! at the longest wait.

use std::time::Duration;

use super::options::BackoffOptions;

/// Successive reconnect delays.
#[derive(Debug, Clone)]
pub struct Backoff {
    options: BackoffOptions,
    attempt: u32,
}

impl Backoff {
    /// Delays from `options`, starting at the first attempt.
    pub fn new(options: BackoffOptions) -> Self {
        Backoff {
            options,
            attempt: 0,
        }
    }

    /// Starts over at the first attempt.
    pub fn reset(&mut self) {
        self.attempt = 0;
    }

    /// The delay before the next attempt, drawing jitter from `random` (a number in `[0, 1)`).
    pub fn next_with(&mut self, random: f64) -> Duration {
        // The package's own fallbacks for settings that are zero.
        let min = if self.options.initial.is_zero() {
            Duration::from_millis(100)
        } else {
            self.options.initial
        };
        let max = if self.options.max.is_zero() {
            Duration::from_secs(10)
        } else {
            self.options.max
        };
        let attempt = self.attempt;
        self.attempt = self.attempt.saturating_add(1);
        if min >= max {
            return max;
        }
        let factor = if self.options.factor <= 0.0 {
            2.0
        } else {
            self.options.factor
        };
        let min_secs = min.as_secs_f64();
        let mut secs = min_secs * factor.powf(f64::from(attempt));
        if self.options.jitter {
            secs = random * (secs - min_secs) + min_secs;
        }
        if !secs.is_finite() || secs >= max.as_secs_f64() {
            return max;
        }
        if secs <= min_secs {
            return min;
        }
        Duration::from_secs_f64(secs)
    }

    /// The delay before the next attempt.
    pub fn next_delay(&mut self) -> Duration {
        self.next_with(fastrand::f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backoff(initial_ms: u64, max_ms: u64, factor: f64, jitter: bool) -> Backoff {
        Backoff::new(BackoffOptions {
            initial: Duration::from_millis(initial_ms),
            max: Duration::from_millis(max_ms),
            factor,
            jitter,
        })
    }

    #[test]
    fn the_references_defaults_wait_a_constant_initial_interval() {
        let mut delays = Backoff::new(BackoffOptions::default());
        for random in [0.0, 0.3, 0.99, 0.5, 0.0, 0.7] {
            assert_eq!(delays.next_with(random), Duration::from_secs(10));
        }
    }

    #[test]
    fn a_factor_above_one_grows_to_the_maximum() {
        let mut delays = backoff(100, 1000, 2.0, false);
        let seen: Vec<u128> = (0..6).map(|_| delays.next_with(0.0).as_millis()).collect();
        assert_eq!(seen, vec![100, 200, 400, 800, 1000, 1000]);
        delays.reset();
        assert_eq!(delays.next_with(0.0), Duration::from_millis(100));
    }

    #[test]
    fn jitter_draws_between_the_initial_and_the_computed_delay() {
        let mut delays = backoff(100, 10_000, 2.0, true);
        assert_eq!(delays.next_with(0.5), Duration::from_millis(100));
        // Attempt 1: computed 200 ms, drawn halfway between 100 and 200.
        assert_eq!(delays.next_with(0.5), Duration::from_millis(150));
        // Attempt 2: computed 400 ms; a draw of 0 gives the initial delay.
        assert_eq!(delays.next_with(0.0), Duration::from_millis(100));
    }

    #[test]
    fn degenerate_settings_fall_back_as_the_reference_does() {
        // Initial not below max: always max.
        let mut delays = backoff(5000, 1000, 2.0, false);
        assert_eq!(delays.next_with(0.0), Duration::from_secs(1));
        // Zero settings: 100 ms and 10 s, factor 2.
        let mut delays = backoff(0, 0, 0.0, false);
        assert_eq!(delays.next_with(0.0), Duration::from_millis(100));
        assert_eq!(delays.next_with(0.0), Duration::from_millis(200));
        // A huge attempt count never overflows.
        let mut delays = backoff(100, 1000, 10.0, false);
        for _ in 0..2000 {
            assert!(delays.next_with(0.9) <= Duration::from_secs(1));
        }
    }
}
