//! Leased quota: a hot limit answered in the instance from a slice of its quota reserved in the
//! store, instead of one store call per hit.
//!
//! An instance reserves a slice with one ordinary charge of several units (the store decides it
//! atomically against everything else in the window, other instances' slices included), spends
//! it locally until it is used up or its lease ends, then settles: it gives back the units it did
//! not spend. The rules that keep the limit's promise:
//!
//! - A slice is spent only while its lease runs, measured on this instance's monotonic clock from
//!   *before* the reservation was sent, less a millisecond for the stores' whole-millisecond
//!   clocks. So every hit admitted from a slice happens before the store's decision time plus the
//!   lease.
//! - Log: the store stamps the slice's entry at its decision time plus the lease, so the reserved
//!   units stay in the window at least as long as any hit admitted from them. Settling rewrites
//!   the entry to the units spent at `min(stamp, settlement time)`: settlement is sent only after
//!   the slice's last hit, so the stamp still follows every hit it covers. No window of the
//!   limit's length then admits more than the limit, across any number of instances (the proof
//!   is in docs/leases.md).
//! - Counter: a slice never outlives the fixed window it was charged to (the store's reply says
//!   when that window ends), so every hit admitted from it falls in the window that counts it.
//! - Slices are at most the limit's rate over the lease (per shard), and at most half of what the
//!   store last said was left, so the last units are not held by one instance while another is
//!   refused; when even the smallest slice is refused, the hit itself is asked for.
//!
//! `limit_remaining` under a lease is what the store had left after the slice was reserved plus
//! what is left of the slice: an upper bound that other instances' use since the reservation
//! (at most one lease time of it) makes stale. `duration_until_reset` is the store's answer at
//! reservation, less the time since.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

use futures_util::future::{Either, join_all};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;

use crate::clock::Clock;
use crate::window::{Algorithm, Cost, Counting, Verdict};

use super::{
    Backend, BackendError, Cleared, Hit, MemoryUsage, Outcome, Peeked, Receipt, Results,
    SustainedFailure,
};

/// The longest lease, in milliseconds. Short against every window (at least one second), and
/// below the margin the Redis scripts keep keys alive beyond their newest entry.
pub const MAX_LEASE_MS: u64 = 1000;

/// How long a slice of a limit with window `window_ms` may be spent: a tenth of the window, at
/// most [`MAX_LEASE_MS`]. A log holds a slice's units for up to this much longer than the hits
/// they admit, so it stays small against the window.
pub fn lease_ms(window_ms: u64) -> u64 {
    (window_ms / 10).clamp(1, MAX_LEASE_MS)
}

/// The furthest ahead a store stamps a slice that a client spends itself ([`Hit::slice`], an
/// RLQS assignment): Envoy counts an assignment's life in whole seconds from when it arrives, so
/// the slice needs its lifetime and its delivery ahead, more than a lease's second. Below the
/// five seconds the Redis log keeps its keys beyond their newest entry.
pub const MAX_SLICE_AHEAD_MS: u64 = 4000;

/// How far after its decision a store stamps `hit`'s charge: 0 for an ordinary hit; for a
/// leased slice its lease, at most a tenth of the window and [`MAX_LEASE_MS`]; for a client's
/// slice ([`Hit::slice`]) at most a quarter of the window and [`MAX_SLICE_AHEAD_MS`]. What a log
/// holds its units for beyond the hits they admit, so it stays small against the window. The
/// Redis log script caps what it is sent the same way.
pub fn ahead_ms(hit: &Hit) -> u64 {
    if hit.slice {
        hit.lease_ms
            .min(MAX_SLICE_AHEAD_MS)
            .min((hit.window_ms / 4).max(1))
    } else {
        hit.lease_ms
            .min(MAX_LEASE_MS)
            .min((hit.window_ms / 10).max(1))
    }
}

/// The process-wide metrics of leasing (one leasing layer per process in practice; tests make
/// more and share these).
#[derive(Debug, Default)]
struct Metrics {
    reservations: Counter,
    refused: Counter,
    answers: Counter,
    returned: Counter,
}

fn metrics() -> &'static Metrics {
    static METRICS: OnceLock<Metrics> = OnceLock::new();
    METRICS.get_or_init(Metrics::default)
}

/// Adds the leasing metrics to `registry` (whose prefix the names get).
pub fn register(registry: &mut Registry) {
    let m = metrics();
    registry.register(
        "lease_reservations",
        "Slices of leased limits reserved in the store (one script call each)",
        m.reservations.clone(),
    );
    registry.register(
        "lease_reservations_refused",
        "Reservations the store refused, after which the hit itself was asked for",
        m.refused.clone(),
    );
    registry.register(
        "lease_answers",
        "Hits of leased limits admitted from a slice held in this instance, without a store call",
        m.answers.clone(),
    );
    registry.register(
        "lease_returned_units",
        "Units of slices given back to the store unspent",
        m.returned.clone(),
    );
}

/// Identity of a leased limit in this instance: the limiter's key, algorithm and window.
type SliceKey = (String, Algorithm, u64);

/// A slice being spent.
#[derive(Debug)]
struct Slice {
    /// Names the slice in the receipts of hits it admitted.
    id: u64,
    /// The store's receipt for the whole slice (`cost` = units reserved).
    grant: Receipt,
    /// The limit it was reserved under; a hit under another limit (a reload) settles it.
    limit: u64,
    /// Units admitted from it and not released.
    spent: u64,
    /// This instance's clock (ms) from which nothing more may be spent.
    deadline_ms: u64,
    /// When it was reserved, this instance's clock (ms).
    granted_ms: u64,
    /// The store's `remaining` after the reservation (the whole slice charged).
    remaining: u64,
    /// The store's `reset_ms` at reservation.
    reset_ms: u64,
    /// Whether a hit of a request with other limits was spent from it: such a hit may be given
    /// back after the slice is settled, so its units stay refundable in the store.
    tentative: bool,
}

/// A settled slice, kept a little while so that a late release of one of its hits can still be
/// given back to the store.
#[derive(Debug)]
struct Settled {
    id: u64,
    /// The store's receipt for what stayed charged (`cost` = units kept).
    kept: Receipt,
    /// When it was settled, this instance's clock (ms).
    settled_ms: u64,
}

/// How many settled slices a limit remembers for late releases. A release follows its hit within
/// the request; under concurrency several slices of one limit may be settled meanwhile.
const SETTLED_KEPT: usize = 32;

/// What this instance holds for one leased limit.
#[derive(Debug, Default)]
struct Slot {
    slice: Option<Slice>,
    /// Recently settled slices with units still charged, newest last.
    settled: Vec<Settled>,
    /// What the store last said was left, in the limit's units (`None` before the first answer).
    last_remaining: Option<u64>,
    /// The units this instance asked of the limit over one lease, as the last settled slice
    /// showed (0 before any): what the next slice is sized by.
    demand: u64,
}

/// The leasing layer: hits with `lease_ms > 0` are answered from slices, everything else goes
/// to `inner` untouched. Sits above sharding, so a slice is reserved from one shard.
pub struct Leased<B> {
    inner: B,
    clock: Arc<dyn Clock>,
    enabled: bool,
    slots: Mutex<HashMap<SliceKey, Arc<tokio::sync::Mutex<Slot>>>>,
    next_id: std::sync::atomic::AtomicU64,
}

impl<B> std::fmt::Debug for Leased<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leased")
            .field("enabled", &self.enabled)
            .finish_non_exhaustive()
    }
}

/// The units a hit asks for, if it is one a lease answers (a check consumes nothing and goes to
/// the store as it is, and so does a slice a client spends itself).
fn leased_cost(hit: &Hit) -> Option<u64> {
    match hit.cost {
        Cost::Consume(units) if units > 0 && hit.lease_ms > 0 && !hit.slice => Some(units),
        _ => None,
    }
}

impl<B: Backend> Leased<B> {
    /// Wraps `inner`; `enabled` is false for a store in this process (the memory backend), where
    /// every hit is already local and leases mean nothing. `clock` must be monotonic.
    pub fn new(inner: B, clock: Arc<dyn Clock>, enabled: bool) -> Self {
        Leased {
            inner,
            clock,
            enabled,
            slots: Mutex::new(HashMap::new()),
            next_id: std::sync::atomic::AtomicU64::new(1),
        }
    }

    /// The wrapped backend.
    pub fn inner(&self) -> &B {
        &self.inner
    }

    fn slots(&self) -> MutexGuard<'_, HashMap<SliceKey, Arc<tokio::sync::Mutex<Slot>>>> {
        self.slots.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn slot(
        &self,
        key: &str,
        algorithm: Algorithm,
        window_ms: u64,
    ) -> Arc<tokio::sync::Mutex<Slot>> {
        let mut slots = self.slots();
        if let Some(slot) = slots.get(&(key.to_owned(), algorithm, window_ms)) {
            return Arc::clone(slot);
        }
        let slot = Arc::new(tokio::sync::Mutex::new(Slot::default()));
        slots.insert((key.to_owned(), algorithm, window_ms), Arc::clone(&slot));
        slot
    }

    /// How many units to reserve for a hit of `cost`: the demand this instance showed over a
    /// lease, or the limit's rate (per shard) over the lease when that is more; at most half of
    /// what the store last said was left (per shard), so an instance that dies holding a slice
    /// strands at most that; at least the hit's own cost.
    fn want(hit: &Hit, cost: u64, slot: &Slot) -> u64 {
        let shards = u64::from(hit.shards.max(1));
        let per_shard = hit.limit / shards;
        let rate =
            u128::from(per_shard) * u128::from(hit.lease_ms) / u128::from(hit.window_ms.max(1));
        let mut want = u64::try_from(rate)
            .unwrap_or(u64::MAX)
            .max(slot.demand)
            .max(1);
        if let Some(left) = slot.last_remaining {
            want = want.min((left / shards / 2).max(1));
        }
        want.max(cost)
    }

    /// The units asked over one lease of `lease_ms`, as `slice` shows when it is settled at
    /// `now` with `asking` more units wanted (the hit that found it used up, or 0): a slice used
    /// up before its lease ended ran at its rate for the whole lease, at most four times its
    /// size (so a burst grows slices by a factor of four a reservation, and a lull in it cannot
    /// make one huge); one that lived its lease shows what was spent in it.
    fn demand(slice: &Slice, now: u64, asking: u64, lease_ms: u64) -> u64 {
        let lived = now.saturating_sub(slice.granted_ms).max(1);
        let asked = slice.spent.saturating_add(asking);
        if asking > 0 && lived < lease_ms {
            let rate = u128::from(asked) * u128::from(lease_ms) / u128::from(lived);
            u64::try_from(rate)
                .unwrap_or(u64::MAX)
                .min(slice.grant.cost.saturating_mul(4))
        } else {
            slice.spent
        }
    }

    /// Gives back what `slice` did not spend, keeping the rest charged (a log's entry moves back
    /// to now) and, unless a hit that may still be given back was spent from it, final in the
    /// store, whose refusals stop counting it as refundable. Nothing can be spent from it any
    /// more. Best effort: when it fails, the unspent units stay charged until they leave the
    /// window, which never admits too much. `asking`: the units of the hit that found it used
    /// up (0 when its lease ended), for sizing the next slice.
    async fn settle(&self, slot: &mut Slot, slice: Slice, asking: u64, lease_ms: u64) {
        let now = self.clock.now_ms();
        slot.demand = Self::demand(&slice, now, asking, lease_ms);
        let kept = Receipt {
            keep: slice.spent,
            keep_refundable: slice.tentative,
            ..slice.grant.clone()
        };
        metrics()
            .returned
            .inc_by(slice.grant.cost.saturating_sub(slice.spent));
        // Always called, a slice spent to the last unit too: the store counts the slice as
        // refundable until it hears that it is settled.
        if let Err(error) = self.inner.release(std::slice::from_ref(&kept)).await {
            tracing::debug!(
                %error,
                "a leased slice could not be settled; its unspent units stay charged until \
                 they leave the window"
            );
        }
        // A release comes within its request: slices settled a lease ago are past needing.
        slot.settled
            .retain(|settled| now.saturating_sub(settled.settled_ms) < MAX_LEASE_MS);
        if slot.settled.len() >= SETTLED_KEPT {
            slot.settled.remove(0);
        }
        // Only hits of requests with other limits are ever given back, and only their slices
        // kept their units refundable.
        if slice.spent > 0 && slice.tentative {
            slot.settled.push(Settled {
                id: slice.id,
                kept: Receipt {
                    cost: slice.spent,
                    keep: 0,
                    keep_refundable: true,
                    ..slice.grant
                },
                settled_ms: now,
            });
        }
    }

    /// Answers one leased hit of `cost` units.
    async fn take(&self, hit: &Hit, cost: u64) -> Result<Outcome, BackendError> {
        let slot = self.slot(&hit.key, hit.algorithm, hit.window_ms);
        let mut slot = slot.lock().await;
        let now = self.clock.now_ms();
        if let Some(slice) = slot.slice.as_mut()
            && slice.limit == hit.limit
            && now < slice.deadline_ms
            && slice.spent.saturating_add(cost) <= slice.grant.cost
        {
            metrics().answers.inc();
            slice.spent += cost;
            slice.tentative |= hit.tentative;
            let left = slice.grant.cost - slice.spent;
            let remaining = slice.remaining.saturating_add(left).min(hit.limit);
            return Ok(Outcome {
                verdict: Verdict {
                    admitted: true,
                    remaining,
                    reset_ms: slice
                        .reset_ms
                        .saturating_sub(now.saturating_sub(slice.granted_ms)),
                },
                receipt: Some(Receipt {
                    key: hit.key.clone(),
                    algorithm: hit.algorithm,
                    window_ms: hit.window_ms,
                    token: slice.id,
                    cost,
                    released_remaining: remaining.saturating_add(cost).min(hit.limit),
                    keep: 0,
                    leased: true,
                    refundable_until_ms: 0,
                    keep_refundable: false,
                }),
                cached: false,
                stands_ms: 0,
            });
        }
        if let Some(slice) = slot.slice.take() {
            let asking = if now < slice.deadline_ms { cost } else { 0 };
            self.settle(&mut slot, slice, asking, hit.lease_ms).await;
        }

        let want = Self::want(hit, cost, &slot);
        let reservation = Hit {
            cost: Cost::Consume(want),
            // Its unspent units go back when it settles.
            tentative: true,
            group: 0,
            // A refused reservation larger than the hit must not be charged: the hit itself is
            // asked for next, and charged then if its counting says so.
            counting: if want > cost {
                Counting::Admitted
            } else {
                hit.counting
            },
            ..hit.clone()
        };
        let sent_ms = self.clock.now_ms();
        let mut answer = self.inner.acquire(std::slice::from_ref(&reservation)).await;
        let outcome = answer.pop().unwrap_or_else(|| {
            Err(BackendError::Protocol(
                "the store answered no result for a reservation".into(),
            ))
        })?;
        slot.last_remaining = Some(outcome.verdict.remaining);
        metrics().reservations.inc();
        let grant = match (&outcome.receipt, outcome.verdict.admitted) {
            (Some(grant), true) => grant.clone(),
            _ if want > cost => {
                metrics().refused.inc();
                // Even the smallest slice did not fit: ask for the hit alone, as an ordinary hit.
                let single = Hit {
                    lease_ms: 0,
                    ..hit.clone()
                };
                let mut answer = self.inner.acquire(std::slice::from_ref(&single)).await;
                let outcome = answer.pop().unwrap_or_else(|| {
                    Err(BackendError::Protocol(
                        "the store answered no result for a hit".into(),
                    ))
                })?;
                slot.last_remaining = Some(outcome.verdict.remaining);
                return Ok(outcome);
            }
            _ => return Ok(outcome),
        };
        // The counter charged the slice to the fixed window that ends `reset_ms - window` from
        // the store's decision: the slice is spent only inside it.
        let lease = match hit.algorithm {
            Algorithm::SlidingWindowLog => hit.lease_ms.min(MAX_LEASE_MS),
            Algorithm::SlidingWindowCounter => hit
                .lease_ms
                .min(MAX_LEASE_MS)
                .min(outcome.verdict.reset_ms.saturating_sub(hit.window_ms)),
        };
        let id = self
            .next_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let left = want - cost;
        let remaining = outcome
            .verdict
            .remaining
            .saturating_add(left)
            .min(hit.limit);
        slot.slice = Some(Slice {
            id,
            grant,
            limit: hit.limit,
            spent: cost,
            // One millisecond less: the store stamps in whole milliseconds, rounded down.
            deadline_ms: sent_ms.saturating_add(lease).saturating_sub(1),
            granted_ms: sent_ms,
            remaining: outcome.verdict.remaining,
            reset_ms: outcome.verdict.reset_ms,
            tentative: hit.tentative,
        });
        Ok(Outcome {
            verdict: Verdict {
                admitted: true,
                remaining,
                reset_ms: outcome.verdict.reset_ms,
            },
            receipt: Some(Receipt {
                key: hit.key.clone(),
                algorithm: hit.algorithm,
                window_ms: hit.window_ms,
                token: id,
                cost,
                released_remaining: remaining.saturating_add(cost).min(hit.limit),
                keep: 0,
                leased: true,
                refundable_until_ms: 0,
                keep_refundable: false,
            }),
            cached: false,
            stands_ms: 0,
        })
    }

    /// Gives back one hit answered from a slice: to the slice while it is being spent, to the
    /// store once it has been settled (best effort, as every release).
    async fn give_back(&self, receipt: &Receipt) -> Result<(), BackendError> {
        let slot = self.slot(&receipt.key, receipt.algorithm, receipt.window_ms);
        let mut slot = slot.lock().await;
        if let Some(slice) = slot.slice.as_mut()
            && slice.id == receipt.token
        {
            slice.spent = slice.spent.saturating_sub(receipt.cost);
            return Ok(());
        }
        let Some(settled) = slot
            .settled
            .iter_mut()
            .find(|settled| settled.id == receipt.token)
        else {
            return Ok(());
        };
        if settled.kept.cost == 0 {
            return Ok(());
        }
        let back = receipt.cost.min(settled.kept.cost);
        let refund = Receipt {
            keep: settled.kept.cost - back,
            ..settled.kept.clone()
        };
        settled.kept.cost -= back;
        // Sent while the slot is held: a log's entry is named by the units it keeps, so two
        // refunds of one slice must reach the store in the order they were computed.
        self.inner.release(std::slice::from_ref(&refund)).await
    }
}

impl<B: Backend> Leased<B> {
    /// Answers the leased hits from slices and asks the inner backend for the others, at once.
    async fn acquire_leased(&self, hits: &[Hit]) -> Results {
        let (leased, direct): (Vec<usize>, Vec<usize>) =
            (0..hits.len()).partition(|&index| leased_cost(&hits[index]).is_some());
        let direct_hits: Vec<Hit> = direct
            .iter()
            .map(|&index| Hit {
                lease_ms: 0,
                ..hits[index].clone()
            })
            .collect();
        let leased_answers = join_all(leased.iter().map(|&index| {
            let hit = &hits[index];
            self.take(hit, leased_cost(hit).unwrap_or(1))
        }));
        let direct_answers = async {
            if direct_hits.is_empty() {
                Vec::new()
            } else {
                self.inner.acquire(&direct_hits).await
            }
        };
        let (leased_answers, direct_answers) = tokio::join!(leased_answers, direct_answers);
        let mut answers: Vec<Option<Result<Outcome, BackendError>>> =
            (0..hits.len()).map(|_| None).collect();
        for (index, answer) in leased.into_iter().zip(leased_answers) {
            answers[index] = Some(answer);
        }
        for (index, answer) in direct.into_iter().zip(direct_answers) {
            answers[index] = Some(answer);
        }
        answers
            .into_iter()
            .map(|answer| {
                answer.unwrap_or_else(|| {
                    Err(BackendError::Protocol(
                        "the store answered fewer results than hits".into(),
                    ))
                })
            })
            .collect()
    }
}

impl<B: Backend> Backend for Leased<B> {
    /// A batch without a leased hit is the inner backend's own future, so the decision above
    /// carries and moves no more than it; lease work lives in a box of its own.
    fn acquire(&self, hits: &[Hit]) -> impl Future<Output = Results> + Send {
        if self.enabled && hits.iter().any(|hit| leased_cost(hit).is_some()) {
            Either::Right(Box::pin(self.acquire_leased(hits)))
        } else {
            Either::Left(self.inner.acquire(hits))
        }
    }

    async fn release(&self, receipts: &[Receipt]) -> Result<(), BackendError> {
        if receipts.iter().all(|receipt| !receipt.leased) {
            return self.inner.release(receipts).await;
        }
        let (leased, direct): (Vec<&Receipt>, Vec<&Receipt>) =
            receipts.iter().partition(|receipt| receipt.leased);
        let direct: Vec<Receipt> = direct.into_iter().cloned().collect();
        let mut result = if direct.is_empty() {
            Ok(())
        } else {
            self.inner.release(&direct).await
        };
        for receipt in leased {
            if let Err(error) = self.give_back(receipt).await {
                result = Err(error);
            }
        }
        result
    }

    /// The store's word: it holds every slice an instance reserved as charged, so what
    /// instances hold counts as used.
    fn peek(&self, hits: &[Hit]) -> impl Future<Output = Peeked> + Send {
        self.inner.peek(hits)
    }

    /// Drops this instance's slices of the cleared limits, unsettled, while the store clears
    /// them: no hit spends a slice whose charge is gone, and none is reserved meanwhile. Other
    /// instances spend what they hold until their lease ends (a second at most).
    async fn clear(&self, hits: &[Hit]) -> Cleared {
        let mut keys: Vec<SliceKey> = hits
            .iter()
            .map(|hit| (hit.key.clone(), hit.algorithm, hit.window_ms))
            .collect();
        keys.sort();
        keys.dedup();
        let slots: Vec<Arc<tokio::sync::Mutex<Slot>>> = {
            let slots = self.slots();
            keys.iter()
                .filter_map(|key| slots.get(key).cloned())
                .collect()
        };
        // Locked in key order, so two clears never wait on each other.
        let mut held = Vec::with_capacity(slots.len());
        for slot in &slots {
            let mut slot = slot.lock().await;
            *slot = Slot::default();
            held.push(slot);
        }
        let cleared = self.inner.clear(hits).await;
        drop(held);
        cleared
    }

    /// A leased hit is answered from its own slice, apart from its group.
    fn joint(&self, group: &[Hit]) -> bool {
        !(self.enabled && group.iter().any(|hit| leased_cost(hit).is_some()))
            && self.inner.joint(group)
    }

    async fn ping(&self) -> Result<(), BackendError> {
        self.inner.ping().await
    }

    /// Settles the slices whose lease has ended, so their unspent units go back to the store
    /// while no hit arrives, and forgets limits that have been idle since the last pass.
    async fn maintain(&self) {
        let now = self.clock.now_ms();
        let slots: Vec<(SliceKey, Arc<tokio::sync::Mutex<Slot>>)> = self
            .slots()
            .iter()
            .map(|(key, slot)| (key.clone(), Arc::clone(slot)))
            .collect();
        let mut idle = Vec::new();
        for (key, slot) in slots {
            // A slot in use is being spent or refilled right now: leave it to the next pass.
            let Ok(mut held) = slot.try_lock() else {
                continue;
            };
            if held
                .slice
                .as_ref()
                .is_some_and(|slice| now >= slice.deadline_ms)
                && let Some(slice) = held.slice.take()
            {
                self.settle(&mut held, slice, 0, lease_ms(key.2)).await;
                continue;
            }
            if held.slice.is_none()
                && held
                    .settled
                    .iter()
                    .all(|settled| now.saturating_sub(settled.settled_ms) >= MAX_LEASE_MS)
            {
                idle.push(key);
            }
        }
        if !idle.is_empty() {
            let mut slots = self.slots();
            for key in idle {
                // Only if no hit holds or waits for it since it was looked at.
                if slots
                    .get(&key)
                    .is_some_and(|slot| Arc::strong_count(slot) == 1)
                {
                    slots.remove(&key);
                }
            }
        }
        self.inner.maintain().await
    }

    fn memory_usage(&self) -> Option<MemoryUsage> {
        self.inner.memory_usage()
    }

    fn failing_since(&self) -> Option<SustainedFailure> {
        self.inner.failing_since()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::memory::tests::one;
    use crate::backend::shard::tests::Recording;
    use crate::clock::ManualClock;

    const W: u64 = 10_000;
    const BOTH: [Algorithm; 2] = [Algorithm::SlidingWindowCounter, Algorithm::SlidingWindowLog];

    fn leased_at(now_ms: u64) -> (Leased<Recording>, ManualClock) {
        let clock = ManualClock::new(now_ms);
        let store = Recording::at(&clock);
        (Leased::new(store, Arc::new(clock.clone()), true), clock)
    }

    fn leased_hit(key: &str, algorithm: Algorithm, limit: u64) -> Hit {
        Hit {
            key: key.to_owned(),
            algorithm,
            limit,
            window_ms: W,
            cost: Cost::Consume(1),
            counting: Counting::Admitted,
            shards: 1,
            lease_ms: lease_ms(W),
            tentative: false,
            group: 0,
            descriptor_tag: false,
            slice: false,
        }
    }

    /// What the store itself has left for `hit`, slices counted in full.
    async fn store_left(backend: &Leased<Recording>, hit: &Hit) -> u64 {
        let probe = Hit {
            cost: Cost::CheckOnly,
            lease_ms: 0,
            ..hit.clone()
        };
        one(&backend.inner().memory, &probe).await.verdict.remaining
    }

    #[test]
    fn the_lease_is_a_tenth_of_the_window_at_most_a_second() {
        assert_eq!(lease_ms(1000), 100);
        assert_eq!(lease_ms(10_000), 1000);
        assert_eq!(lease_ms(3_600_000), MAX_LEASE_MS);
        assert_eq!(lease_ms(0), 1);
    }

    #[tokio::test]
    async fn one_reservation_answers_a_slice_of_hits() {
        for algorithm in BOTH {
            let (backend, _clock) = leased_at(1_000_000);
            let hit = leased_hit("a", algorithm, 1000);
            for n in 0..100u64 {
                let outcome = one(&backend, &hit).await;
                assert!(outcome.verdict.admitted, "{algorithm} {n}");
                assert_eq!(outcome.verdict.remaining, 999 - n, "{algorithm} {n}");
            }
            // The rate over the lease: 1000 per 10 s for 1 s is a slice of 100.
            assert_eq!(backend.inner().calls().len(), 1, "{algorithm}");
            assert_eq!(backend.inner().calls()[0][0].cost, Cost::Consume(100));
            assert_eq!(store_left(&backend, &hit).await, 900, "{algorithm}");
        }
    }

    #[tokio::test]
    async fn slices_shrink_near_the_limit_and_fill_it_exactly() {
        for algorithm in BOTH {
            let (backend, _clock) = leased_at(1_000_000);
            let hit = leased_hit("a", algorithm, 100);
            let mut admitted = 0;
            while one(&backend, &hit).await.verdict.admitted {
                admitted += 1;
                assert!(admitted <= 100, "{algorithm}");
            }
            assert_eq!(admitted, 100, "{algorithm}");
            assert_eq!(store_left(&backend, &hit).await, 0, "{algorithm}");
            let sizes: Vec<Cost> = backend
                .inner()
                .calls()
                .iter()
                .map(|call| call[0].cost)
                .collect();
            // 10, then never more than half of what the store said was left.
            assert_eq!(sizes[0], Cost::Consume(10), "{algorithm}: {sizes:?}");
            assert!(sizes.len() < 40, "{algorithm}: {sizes:?}");
        }
    }

    #[tokio::test]
    async fn an_ended_lease_gives_back_the_unspent_units() {
        for algorithm in BOTH {
            let (backend, clock) = leased_at(1_000_000);
            let hit = leased_hit("a", algorithm, 1000);
            for _ in 0..3 {
                assert!(one(&backend, &hit).await.verdict.admitted);
            }
            assert_eq!(store_left(&backend, &hit).await, 900, "{algorithm}");
            clock.advance(lease_ms(W));
            backend.maintain().await;
            assert_eq!(store_left(&backend, &hit).await, 997, "{algorithm}");
            // The next hit reserves a new slice.
            assert!(one(&backend, &hit).await.verdict.admitted);
            assert_eq!(backend.inner().calls().len(), 2, "{algorithm}");
        }
    }

    #[tokio::test]
    async fn a_released_hit_goes_back_to_the_slice_or_the_store() {
        for algorithm in BOTH {
            let (backend, clock) = leased_at(1_000_000);
            // Released hits are those of requests with other limits.
            let hit = Hit {
                tentative: true,
                group: 0,
                descriptor_tag: false,
                slice: false,
                ..leased_hit("a", algorithm, 1000)
            };
            let kept = one(&backend, &hit).await;
            let released = one(&backend, &hit).await;
            let late = one(&backend, &hit).await;
            backend.release(&[released.receipt.unwrap()]).await.unwrap();
            // Settled with two spent; the late release reaches the store.
            clock.advance(lease_ms(W));
            backend.maintain().await;
            assert_eq!(store_left(&backend, &hit).await, 998, "{algorithm}");
            backend.release(&[late.receipt.unwrap()]).await.unwrap();
            assert_eq!(store_left(&backend, &hit).await, 999, "{algorithm}");
            assert!(kept.verdict.admitted);
        }
    }

    #[tokio::test]
    async fn a_changed_limit_settles_the_old_slice() {
        for algorithm in BOTH {
            let (backend, _clock) = leased_at(1_000_000);
            let old = leased_hit("a", algorithm, 1000);
            for _ in 0..5 {
                assert!(one(&backend, &old).await.verdict.admitted);
            }
            let new = Hit {
                limit: 20,
                ..old.clone()
            };
            let mut admitted = 0;
            while one(&backend, &new).await.verdict.admitted {
                admitted += 1;
                assert!(admitted <= 20, "{algorithm}");
            }
            assert_eq!(
                admitted, 15,
                "{algorithm}: 20 less the 5 spent under the old limit"
            );
        }
    }

    #[tokio::test]
    async fn unleased_hits_and_a_disabled_layer_pass_through() {
        let clock = ManualClock::new(1_000_000);
        let backend = Leased::new(Recording::at(&clock), Arc::new(clock.clone()), false);
        let hit = leased_hit("a", Algorithm::SlidingWindowLog, 1000);
        for _ in 0..3 {
            let outcome = one(&backend, &hit).await;
            assert!(!outcome.receipt.unwrap().leased);
        }
        assert_eq!(backend.inner().calls().len(), 3);
        let (enabled, _clock) = leased_at(1_000_000);
        let plain = Hit {
            lease_ms: 0,
            ..hit.clone()
        };
        let check = Hit {
            cost: Cost::CheckOnly,
            ..hit
        };
        for h in [&plain, &plain, &check] {
            one(&enabled, h).await;
        }
        assert_eq!(enabled.inner().calls().len(), 3);
    }
}
