//! One RLQS bucket of one stream: what Envoy was last told, what it reported, and when it must
//! hear from tollgate again. Pure bookkeeping: the session asks the limiter and sends.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::config::{Config, Limit};
use crate::descriptor::Descriptor;
use crate::proto::rlqs::BucketId;

/// How long an assignment of a slice lives in Envoy, in whole seconds (Envoy drops the
/// fraction of a second, and an assignment under a second expires at once).
pub const SLICE_TTL_S: u64 = 1;

/// What tollgate allows between the store's decision on a slice and Envoy applying it: the
/// store stamps a slice `SLICE_TTL_S` plus this ahead, so every request Envoy admits from it
/// counts in the window as long as if counted when admitted.
pub const DELIVERY_MS: u64 = 500;

/// How long after the decision a slice may be spent: what the store is asked to stamp it ahead
/// by.
pub const SPEND_MS: u64 = SLICE_TTL_S * 1000 + DELIVERY_MS;

/// How long after a slice was sent it is renewed at the latest: 400 ms before its lifetime
/// ends in Envoy, time enough for the renewal to arrive.
pub const RENEW_AFTER: Duration = Duration::from_millis(600);

/// The lifetime of an ALLOW_ALL for a bucket that no limit governs, and how often it is sent
/// again (at half of it).
pub const FREE_TTL_S: u64 = 60;

/// Consecutive reports without a request after which a bucket is abandoned: Envoy forgets it
/// and makes it again, with a report of its own, at its next request. One: every slice a bucket
/// holds is charged whether Envoy spends it or not, so a quiet bucket is not kept supplied.
pub const IDLE_REPORTS: u32 = 1;

/// Before Envoy has reported a rate, a slice is the limit's own rate over a renewal, and at most
/// this share of the limit: what a quiet new bucket strands in its first five seconds.
const FIRST_SLICES_SHARE: u64 = 16;

/// What Envoy was last told about a bucket.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Assigned {
    /// Nothing yet: Envoy applies its `no_assignment_behavior`.
    Nothing,
    /// ALLOW_ALL: no limit governs the bucket, or only shadow-mode ones (what Envoy reports of
    /// such a bucket is charged to them, as it lies beyond every slice: there are none).
    AllowAll,
    /// DENY_ALL: nothing is left, or the backend failed under `failure_mode: deny`.
    DenyAll,
    /// A slice of `units` requests, sent at `sent`.
    Slice {
        /// The requests Envoy may admit from it.
        units: u64,
        /// When it was sent.
        sent: Instant,
    },
}

/// One bucket of one stream.
#[derive(Debug)]
pub struct Bucket {
    /// The id Envoy reported, echoed exactly in every action.
    pub id: BucketId,
    /// The descriptor it stands for.
    pub descriptor: Descriptor,
    /// What Envoy was last told.
    pub assigned: Assigned,
    /// When tollgate must act on the bucket next.
    pub due: Instant,
    /// Requests Envoy reported admitted on this stream.
    pub reported_allowed: u64,
    /// Units of the slices sent on this stream.
    pub granted: u64,
    /// Requests Envoy admitted beyond what its slices held, already charged.
    pub charged: u64,
    /// Requests a second Envoy wanted (admitted and denied) over its latest report.
    pub rate: f64,
    /// When the latest report arrived.
    pub reported_at: Option<Instant>,
    /// Whether `rate` was measured over the time between two reports.
    pub rated: bool,
    /// Consecutive reports without a request.
    pub quiet: u32,
    /// The policies an ALLOW_ALL was decided under: after a reload it is decided again.
    pub decided_under: Option<Arc<Config>>,
    /// The limits the bucket resolved to when last assigned, for their statistics.
    pub limits: Vec<Arc<Limit>>,
}

impl Bucket {
    /// A bucket first reported at `now`.
    pub fn new(id: BucketId, descriptor: Descriptor, now: Instant) -> Bucket {
        Bucket {
            id,
            descriptor,
            assigned: Assigned::Nothing,
            due: now,
            reported_allowed: 0,
            granted: 0,
            charged: 0,
            rate: 0.0,
            reported_at: None,
            rated: false,
            quiet: 0,
            decided_under: None,
            limits: Vec::new(),
        }
    }

    /// Takes in a report of `allowed` and `denied` requests at `now`, and answers the requests
    /// to charge as admitted without a slice: every request Envoy admitted beyond the units of
    /// the slices sent on this stream (before the first, all of them). A request admitted from
    /// a slice is never charged twice; one admitted by Envoy's own fallback, while the slices'
    /// units outnumber what it admitted, is not seen (see docs/rlqs.md).
    pub fn report(&mut self, allowed: u64, denied: u64, now: Instant) -> u64 {
        let wanted = allowed.saturating_add(denied);
        if let Some(before) = self.reported_at {
            let seconds = now.saturating_duration_since(before).as_secs_f64().max(0.5);
            self.rate = wanted as f64 / seconds;
            self.rated = true;
        }
        self.reported_at = Some(now);
        self.quiet = if wanted == 0 { self.quiet + 1 } else { 0 };
        self.reported_allowed = self.reported_allowed.saturating_add(allowed);
        let beyond = self.reported_allowed.saturating_sub(self.granted);
        let charge = beyond.saturating_sub(self.charged);
        self.charged = self.charged.saturating_add(charge);
        charge
    }

    /// Whether Envoy asked nothing of the bucket for long enough to forget it.
    pub fn idle(&self) -> bool {
        self.quiet >= IDLE_REPORTS
    }

    /// The units to ask for the next slice: what the reported rate wants until the renewal
    /// after it, a tenth more, at least one; before a rate is reported, the limit's own rate
    /// over that time (`limit` units per `window_ms`), at most a sixteenth of the limit. A
    /// renewal replaces the slice, and what Envoy had not spent of it stays charged until it
    /// leaves the window: the tenth is what a steady demand strands.
    pub fn want(&self, limit: u64, window_ms: u64) -> u64 {
        let horizon_s = RENEW_AFTER.as_secs_f64() * 1.1;
        let units = |rate: f64| {
            let want = (rate * horizon_s).ceil();
            if want >= u64::MAX as f64 {
                u64::MAX
            } else {
                (want as u64).max(1)
            }
        };
        if self.rated {
            units(self.rate)
        } else {
            units(limit as f64 * 1000.0 / window_ms.max(1) as f64)
                .min((limit / FIRST_SLICES_SHARE).max(1))
        }
    }

    /// When a slice of `units` sent at `now` is renewed: when the reported rate says it will be
    /// spent, or [`RENEW_AFTER`] after it was sent, whichever comes first.
    pub fn renew_at(&self, units: u64, now: Instant) -> Instant {
        let latest = now + RENEW_AFTER;
        if self.rate <= 0.0 {
            return latest;
        }
        let spent_in = Duration::from_secs_f64((units as f64 / self.rate).min(3600.0));
        (now + spent_in.max(Duration::from_millis(100))).min(latest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bucket() -> Bucket {
        Bucket::new(BucketId::default(), Descriptor::default(), Instant::now())
    }

    #[test]
    fn what_envoy_admitted_before_a_slice_is_charged_once() {
        let mut b = bucket();
        let now = Instant::now();
        // The first report: one request, admitted by no_assignment_behavior.
        assert_eq!(b.report(1, 0, now), 1);
        b.granted += 10;
        // Within the slice: nothing more to charge.
        assert_eq!(b.report(6, 0, now + Duration::from_secs(5)), 0);
        assert_eq!(b.report(4, 0, now + Duration::from_secs(10)), 0);
        // Beyond the slices' units: the excess, once.
        assert_eq!(b.report(3, 0, now + Duration::from_secs(15)), 3);
        assert_eq!(b.report(0, 0, now + Duration::from_secs(20)), 0);
    }

    #[test]
    fn slices_follow_the_reported_rate() {
        let mut b = bucket();
        let now = Instant::now();
        // No rate reported yet: the limit's own rate (6 a second) over 0.66 s, at most a
        // sixteenth of the limit.
        assert_eq!(b.want(360, 60_000), 4);
        assert_eq!(b.want(20, 10_000), 1);
        b.report(1, 0, now);
        assert_eq!(b.want(360, 60_000), 4);
        b.report(40, 10, now + Duration::from_secs(5));
        assert!((b.rate - 10.0).abs() < 1e-9);
        assert_eq!(b.want(360, 60_000), 7);
        // 7 units at 10 a second last 0.7 s: renewed after RENEW_AFTER.
        assert_eq!(b.renew_at(7, now), now + RENEW_AFTER);
        // 3 units last 0.3 s.
        assert_eq!(b.renew_at(3, now), now + Duration::from_millis(300));
    }

    #[test]
    fn quiet_buckets_become_idle() {
        let mut b = bucket();
        let now = Instant::now();
        b.report(1, 0, now);
        for i in 1..=IDLE_REPORTS {
            assert!(!b.idle());
            b.report(0, 0, now + Duration::from_secs(5 * u64::from(i)));
        }
        assert!(b.idle());
        b.report(0, 1, now + Duration::from_secs(100));
        assert!(!b.idle());
    }
}
