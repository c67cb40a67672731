//! The embedded backend: every window lives in this process. Right for a single instance and for
//! development; it implements exactly the math of [`crate::window`].
//!
//! Keys are spread over a fixed set of shards, each a mutex around a hash table, so hits on
//! different keys rarely contend and a lock is held only for one O(1) decision (a rejected
//! sliding-window-log hit also walks that key's entries to find its retry time). Idle windows
//! expire: each shard sweeps itself once it has served as many operations as its last sweep kept
//! windows (at least 64), so the cost of sweeping is amortized O(1) per hit and a shard never holds
//! much more than twice its live windows.
//!
//! Each hit hashes its key once: the one hash picks the shard and finds the window in the shard's
//! table. Keys come from clients, so the hash is SipHash with a random key (std's `RandomState`),
//! which keeps an attacker from choosing keys that collide.

use std::collections::VecDeque;
use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use hashbrown::HashTable;

use crate::backend::shard::{self, ShardKeys};
use crate::backend::{Backend, BackendError, Hit, Outcome, Receipt};
use crate::clock::{Clock, SystemClock};
use crate::window::{self, Algorithm, Cost, Counting};

/// How many independently locked maps the keys are spread over.
const SHARD_COUNT: usize = 64;

/// Which bits of a key's hash choose its shard. The table inside a shard indexes buckets with the
/// low bits of the same hash and tags entries with its top seven bits; taking the shard from bits
/// in between keeps the keys of one shard spread over all of its buckets and tags.
const SHARD_HASH_SHIFT: u32 = 40;

/// A shard sweeps after at least this many operations, so small shards are not swept on every hit.
const MIN_OPS_BETWEEN_SWEEPS: usize = 64;

/// Sliding windows kept in process memory.
pub struct MemoryBackend {
    clock: Arc<dyn Clock>,
    hasher: RandomState,
    shards: Box<[Mutex<Shard>]>,
}

impl MemoryBackend {
    /// A backend reading the machine's wall clock.
    pub fn new() -> Self {
        MemoryBackend::with_clock(Arc::new(SystemClock))
    }

    /// A backend reading `clock`, so tests can move time by hand.
    pub fn with_clock(clock: Arc<dyn Clock>) -> Self {
        MemoryBackend {
            clock,
            hasher: RandomState::new(),
            shards: (0..SHARD_COUNT)
                .map(|_| Mutex::new(Shard::default()))
                .collect(),
        }
    }

    /// How many windows are held right now, expired ones not yet swept included.
    pub fn key_count(&self) -> usize {
        (0..self.shards.len())
            .map(|index| self.lock(index).windows.len())
            .sum()
    }

    /// Drops every expired window now. Sweeping also happens on its own as hits arrive; this is
    /// for tests and for a periodic task that wants idle memory back without traffic.
    pub fn sweep(&self) {
        let now = self.clock.now_ms();
        for index in 0..self.shards.len() {
            let mut shard = self.lock(index);
            let now = shard.advance_clock(now);
            shard.sweep(now);
        }
    }

    /// The key's hash (for the table) and its shard's index.
    fn locate(&self, key: &str) -> (u64, usize) {
        let hash = self.hasher.hash_one(key);
        // The remainder is below SHARD_COUNT, so the narrowing cannot lose anything.
        let shard = ((hash >> SHARD_HASH_SHIFT) % SHARD_COUNT as u64) as usize;
        (hash, shard)
    }

    fn lock(&self, index: usize) -> MutexGuard<'_, Shard> {
        // A panic elsewhere while holding the lock leaves counts that are still valid numbers;
        // keep serving rather than poisoning every later request.
        self.shards[index]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn decide(&self, hit: &Hit) -> Outcome {
        let now = self.clock.now_ms();
        let (hash, index) = self.locate(&hit.key);
        let mut shard = self.lock(index);
        let now = shard.advance_clock(now);
        shard.count_operation(now);
        // `hit.shards` is not read here: `backend::Sharded` splits a sharded limit into plain
        // hits on shard keys before they reach this backend.
        let cost = window::normalize_cost(hit.cost);
        match hit.algorithm {
            Algorithm::SlidingWindowCounter => shard.decide_counter(hit, hash, cost, now),
            Algorithm::SlidingWindowLog => shard.decide_log(hit, hash, cost, now),
        }
    }

    fn refund(&self, receipt: &Receipt) {
        let (hash, index) = self.locate(&receipt.key);
        let mut shard = self.lock(index);
        shard.refund(receipt, hash);
    }
}

impl Default for MemoryBackend {
    fn default() -> Self {
        MemoryBackend::new()
    }
}

impl fmt::Debug for MemoryBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryBackend")
            .field("shards", &self.shards.len())
            .finish_non_exhaustive()
    }
}

impl Backend for MemoryBackend {
    async fn acquire(&self, hits: &[Hit]) -> Vec<Result<Outcome, BackendError>> {
        hits.iter().map(|hit| Ok(self.decide(hit))).collect()
    }

    async fn release(&self, receipts: &[Receipt]) -> Result<(), BackendError> {
        for receipt in receipts {
            self.refund(receipt);
        }
        Ok(())
    }

    async fn ping(&self) -> Result<(), BackendError> {
        Ok(())
    }
}

/// Placement does not matter in one process: a shard is the identity with a plain suffix.
impl ShardKeys for MemoryBackend {
    fn shard_key(&self, key: &str, shard: u16, _shards: u16) -> String {
        shard::plain_shard_key(key, shard)
    }
}

/// One lock's worth of windows.
#[derive(Default)]
struct Shard {
    windows: HashTable<Slot>,
    /// The latest time this shard has seen. Time never runs backwards inside a shard, so log
    /// entries stay sorted even if the wall clock steps back.
    latest_ms: u64,
    operations_since_sweep: usize,
    /// How many windows the last sweep kept. Sweeping again after that many operations bounds
    /// the shard to about twice its live windows at an amortized O(1) cost per operation.
    kept_by_last_sweep: usize,
    /// Source of log entry ids; unique within the shard, so a receipt can never name an entry of
    /// a window that was dropped and created again.
    next_entry_id: u64,
}

/// One key's window in a shard's table. The key's hash is kept so that growing or shrinking the
/// table never hashes a key again.
struct Slot {
    hash: u64,
    key: String,
    window: Window,
}

/// The window stored under `key` (whose hash is `hash`), if any. A function of the table alone, so
/// the rest of the shard stays free to change while the window is borrowed.
fn window_mut<'a>(
    windows: &'a mut HashTable<Slot>,
    key: &str,
    hash: u64,
) -> Option<&'a mut Window> {
    windows
        .find_mut(hash, |slot| slot.key == key)
        .map(|slot| &mut slot.window)
}

/// The stored state of one limiter.
enum Window {
    Counter(CounterWindow),
    Log(LogWindow),
}

/// A sliding window counter: the counts of the fixed window last written and the one before it.
struct CounterWindow {
    window_ms: u64,
    index: u64,
    prev: u64,
    curr: u64,
}

/// A sliding window log: admitted hits oldest first, with their running sum.
struct LogWindow {
    window_ms: u64,
    entries: VecDeque<LogEntry>,
    used: u128,
}

struct LogEntry {
    time_ms: u64,
    cost: u64,
    id: u64,
}

impl Window {
    fn expired(&self, now_ms: u64) -> bool {
        match self {
            // Both counts are zero from window index + 2 on.
            Window::Counter(counter) => {
                window::counter_window_index(now_ms, counter.window_ms)
                    >= counter.index.saturating_add(2)
            }
            Window::Log(log) => log.entries.back().is_none_or(|newest| {
                !window::log_entry_live(newest.time_ms, log.window_ms, now_ms)
            }),
        }
    }
}

impl LogWindow {
    fn prune(&mut self, now_ms: u64) {
        while let Some(oldest) = self.entries.front() {
            if window::log_entry_live(oldest.time_ms, self.window_ms, now_ms) {
                break;
            }
            self.used = self.used.saturating_sub(u128::from(oldest.cost));
            self.entries.pop_front();
        }
    }
}

impl Shard {
    fn advance_clock(&mut self, now_ms: u64) -> u64 {
        self.latest_ms = self.latest_ms.max(now_ms);
        self.latest_ms
    }

    fn count_operation(&mut self, now_ms: u64) {
        self.operations_since_sweep += 1;
        if self.operations_since_sweep >= self.kept_by_last_sweep.max(MIN_OPS_BETWEEN_SWEEPS) {
            self.sweep(now_ms);
        }
    }

    fn sweep(&mut self, now_ms: u64) {
        self.operations_since_sweep = 0;
        self.windows.retain(|slot| !slot.window.expired(now_ms));
        self.kept_by_last_sweep = self.windows.len();
        // A burst of distinct keys leaves a large table behind; give the memory back.
        if self.windows.capacity() > 4 * self.windows.len() + MIN_OPS_BETWEEN_SWEEPS {
            self.windows
                .shrink_to(2 * self.windows.len(), |slot| slot.hash);
        }
    }

    fn decide_counter(&mut self, hit: &Hit, hash: u64, cost: Cost, now_ms: u64) -> Outcome {
        let window_ms = window::effective_window_ms(hit.window_ms);
        let index = window::counter_window_index(now_ms, window_ms);
        let stored = window_mut(&mut self.windows, &hit.key, hash);
        let (prev, curr) = match &stored {
            Some(Window::Counter(counter)) if counter.window_ms == window_ms => {
                window::counter_counts(counter.index, counter.prev, counter.curr, index)
            }
            _ => (0, 0),
        };
        let verdict =
            window::counter_decide(hit.limit, window_ms, now_ms, prev, curr, cost, hit.counting);
        let Cost::Consume(units) = cost else {
            return Outcome {
                verdict,
                receipt: None,
            };
        };
        let curr_after = match (verdict.admitted, hit.counting) {
            (true, _) => curr.saturating_add(units),
            (false, Counting::All) => window::counter_refused_count(curr, units),
            (false, Counting::Admitted) => {
                return Outcome {
                    verdict,
                    receipt: None,
                };
            }
        };
        let state = Window::Counter(CounterWindow {
            window_ms,
            index,
            prev,
            curr: curr_after,
        });
        match stored {
            Some(window) => *window = state,
            None => self.insert(&hit.key, hash, state),
        }
        // Only an admitted charge is ever given back.
        let receipt = verdict.admitted.then(|| Receipt {
            key: hit.key.clone(),
            algorithm: Algorithm::SlidingWindowCounter,
            window_ms,
            token: index,
            cost: units,
            released_remaining: verdict.remaining.saturating_add(units),
        });
        Outcome { verdict, receipt }
    }

    fn decide_log(&mut self, hit: &Hit, hash: u64, cost: Cost, now_ms: u64) -> Outcome {
        let window_ms = window::effective_window_ms(hit.window_ms);
        let log = match window_mut(&mut self.windows, &hit.key, hash) {
            Some(Window::Log(log)) if log.window_ms == window_ms => {
                log.prune(now_ms);
                Some(log)
            }
            _ => None,
        };
        let verdict = match &log {
            Some(log) => window::log_decide_live(
                hit.limit,
                window_ms,
                now_ms,
                log.used,
                log.entries.back().map(|newest| newest.time_ms),
                log.entries.iter().map(|entry| (entry.time_ms, entry.cost)),
                cost,
                hit.counting,
            ),
            None => window::log_decide_live(
                hit.limit,
                window_ms,
                now_ms,
                0,
                None,
                std::iter::empty(),
                cost,
                hit.counting,
            ),
        };
        let Cost::Consume(units) = cost else {
            return Outcome {
                verdict,
                receipt: None,
            };
        };
        let entry_cost = match (verdict.admitted, hit.counting) {
            (true, _) => units,
            (false, Counting::All) => window::log_refused_cost(hit.limit, units),
            (false, Counting::Admitted) => {
                return Outcome {
                    verdict,
                    receipt: None,
                };
            }
        };
        let id = self.next_entry_id;
        self.next_entry_id = self.next_entry_id.wrapping_add(1);
        let entry = LogEntry {
            time_ms: now_ms,
            cost: entry_cost,
            id,
        };
        match log {
            Some(log) => {
                log.used = log.used.saturating_add(u128::from(entry_cost));
                log.entries.push_back(entry);
            }
            None => {
                let state = Window::Log(LogWindow {
                    window_ms,
                    entries: VecDeque::from([entry]),
                    used: u128::from(entry_cost),
                });
                // The key may hold a window of another kind or length, which this replaces.
                match window_mut(&mut self.windows, &hit.key, hash) {
                    Some(window) => *window = state,
                    None => self.insert(&hit.key, hash, state),
                }
            }
        }
        // Only an admitted charge is ever given back.
        let receipt = verdict.admitted.then(|| Receipt {
            key: hit.key.clone(),
            algorithm: Algorithm::SlidingWindowLog,
            window_ms,
            token: id,
            cost: units,
            released_remaining: verdict.remaining.saturating_add(units),
        });
        Outcome { verdict, receipt }
    }

    /// Stores a window under a key that has none.
    fn insert(&mut self, key: &str, hash: u64, window: Window) {
        self.windows.insert_unique(
            hash,
            Slot {
                hash,
                key: key.to_owned(),
                window,
            },
            |slot| slot.hash,
        );
    }

    fn refund(&mut self, receipt: &Receipt, hash: u64) {
        let window_ms = window::effective_window_ms(receipt.window_ms);
        let Ok(mut stored) = self
            .windows
            .find_entry(hash, |slot| slot.key == receipt.key)
        else {
            return;
        };
        let now_empty = match (receipt.algorithm, &mut stored.get_mut().window) {
            (Algorithm::SlidingWindowCounter, Window::Counter(counter))
                if counter.window_ms == window_ms =>
            {
                // The charge went to `curr` of window `token`; once that window has rolled into
                // `prev` it is still refundable there, and after that it no longer counts.
                if receipt.token == counter.index {
                    counter.curr = counter.curr.saturating_sub(receipt.cost);
                } else if receipt.token.checked_add(1) == Some(counter.index) {
                    counter.prev = counter.prev.saturating_sub(receipt.cost);
                }
                counter.prev == 0 && counter.curr == 0
            }
            (Algorithm::SlidingWindowLog, Window::Log(log)) if log.window_ms == window_ms => {
                // Ids grow in insertion order, so the entries are sorted by id.
                if let Ok(position) = log
                    .entries
                    .binary_search_by_key(&receipt.token, |entry| entry.id)
                    && let Some(entry) = log.entries.remove(position)
                {
                    log.used = log.used.saturating_sub(u128::from(entry.cost));
                }
                log.entries.is_empty()
            }
            _ => false,
        };
        if now_empty {
            stored.remove();
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::clock::ManualClock;

    const W: u64 = 1000;

    fn backend_at(now_ms: u64) -> (MemoryBackend, ManualClock) {
        let clock = ManualClock::new(now_ms);
        (MemoryBackend::with_clock(Arc::new(clock.clone())), clock)
    }

    fn hit(key: &str, algorithm: Algorithm, limit: u64, cost: Cost) -> Hit {
        Hit {
            key: key.to_owned(),
            algorithm,
            limit,
            window_ms: W,
            cost,
            counting: Counting::Admitted,
            shards: 1,
        }
    }

    /// Decides one hit on any backend (the shard tests use it too).
    pub(crate) async fn one<B: Backend>(backend: &B, hit: &Hit) -> Outcome {
        let mut results = backend.acquire(std::slice::from_ref(hit)).await;
        assert_eq!(results.len(), 1);
        results.remove(0).unwrap()
    }

    const BOTH: [Algorithm; 2] = [Algorithm::SlidingWindowCounter, Algorithm::SlidingWindowLog];

    #[tokio::test]
    async fn admits_the_limit_then_rejects_for_both_algorithms() {
        for algorithm in BOTH {
            let (backend, _clock) = backend_at(20 * W + 400);
            let h = hit("k", algorithm, 3, Cost::Consume(1));
            for expected in [2, 1, 0] {
                let outcome = one(&backend, &h).await;
                assert!(outcome.verdict.admitted, "{algorithm}");
                assert_eq!(outcome.verdict.remaining, expected);
                assert!(outcome.receipt.is_some());
            }
            let outcome = one(&backend, &h).await;
            assert!(!outcome.verdict.admitted, "{algorithm}");
            assert_eq!(outcome.verdict.remaining, 0);
            assert_eq!(
                outcome.receipt, None,
                "a rejected hit takes nothing to give back"
            );
            assert!(outcome.verdict.reset_ms >= 1);
        }
    }

    #[tokio::test]
    async fn counter_follows_the_window_math_through_time() {
        let (backend, clock) = backend_at(8 * W - 1);
        let h = hit("c", Algorithm::SlidingWindowCounter, 100, Cost::Consume(1));
        let mut admitted = 0;
        for _ in 0..100 {
            admitted += usize::from(one(&backend, &h).await.verdict.admitted);
        }
        assert_eq!(admitted, 100);
        clock.set(8 * W + 1);
        let outcome = one(&backend, &h).await;
        assert!(!outcome.verdict.admitted, "no second burst at the edge");
        // prev = 100 weighs 99.9 at elapsed 1: a unit fits once its weight is at most 99.
        assert_eq!(outcome.verdict.reset_ms, 9);
        clock.set(8 * W + 10);
        assert!(one(&backend, &h).await.verdict.admitted);
        clock.set(8 * W + 500);
        let check = hit("c", Algorithm::SlidingWindowCounter, 100, Cost::CheckOnly);
        let outcome = one(&backend, &check).await;
        // 100 * 0.5 + 1 used.
        assert_eq!(outcome.verdict.remaining, 49);
        assert_eq!(outcome.verdict.reset_ms, 2 * W - 500);
        clock.set(10 * W);
        let outcome = one(&backend, &check).await;
        assert_eq!(
            (outcome.verdict.remaining, outcome.verdict.reset_ms),
            (100, 0)
        );
    }

    #[tokio::test]
    async fn log_follows_the_window_math_through_time() {
        let (backend, clock) = backend_at(5000);
        let h = |cost| hit("l", Algorithm::SlidingWindowLog, 10, cost);
        assert!(one(&backend, &h(Cost::Consume(6))).await.verdict.admitted);
        clock.set(5400);
        assert!(one(&backend, &h(Cost::Consume(4))).await.verdict.admitted);
        clock.set(5500);
        let outcome = one(&backend, &h(Cost::Consume(5))).await;
        assert!(!outcome.verdict.admitted);
        assert_eq!(outcome.verdict.reset_ms, 5000 + W - 5500);
        clock.set(5999);
        assert!(!one(&backend, &h(Cost::Consume(5))).await.verdict.admitted);
        clock.set(6000);
        let outcome = one(&backend, &h(Cost::Consume(5))).await;
        assert!(outcome.verdict.admitted);
        assert_eq!(outcome.verdict.remaining, 1);
        assert_eq!(outcome.verdict.reset_ms, W);
        let outcome = one(&backend, &h(Cost::CheckOnly)).await;
        assert_eq!(
            (outcome.verdict.admitted, outcome.verdict.remaining),
            (true, 1)
        );
        assert_eq!(outcome.verdict.reset_ms, W);
    }

    #[tokio::test]
    async fn check_only_and_consume_zero_consume_nothing() {
        for algorithm in BOTH {
            let (backend, _clock) = backend_at(3 * W);
            for cost in [Cost::CheckOnly, Cost::Consume(0)] {
                for _ in 0..5 {
                    let outcome = one(&backend, &hit("k", algorithm, 2, cost)).await;
                    assert!(outcome.verdict.admitted);
                    assert_eq!(outcome.verdict.remaining, 2);
                    assert_eq!(outcome.receipt, None);
                }
            }
            assert_eq!(backend.key_count(), 0, "checks store nothing");
            one(&backend, &hit("k", algorithm, 2, Cost::Consume(2))).await;
            // Full is not above the limit: a check still passes.
            for cost in [Cost::CheckOnly, Cost::Consume(0)] {
                let outcome = one(&backend, &hit("k", algorithm, 2, cost)).await;
                assert_eq!(
                    (outcome.verdict.admitted, outcome.verdict.remaining),
                    (true, 0)
                );
            }
            // Above it (the limit lowered by a reload), a check is refused.
            for cost in [Cost::CheckOnly, Cost::Consume(0)] {
                let outcome = one(&backend, &hit("k", algorithm, 1, cost)).await;
                assert_eq!(
                    (outcome.verdict.admitted, outcome.verdict.remaining),
                    (false, 0)
                );
            }
        }
    }

    #[tokio::test]
    async fn refused_hits_are_recorded_only_where_every_hit_counts() {
        for algorithm in BOTH {
            let (backend, _clock) = backend_at(3 * W + 100);
            let h = |key: &str, cost: Cost, counting: Counting| Hit {
                counting,
                ..hit(key, algorithm, 10, cost)
            };
            for counting in [Counting::Admitted, Counting::All] {
                let key = format!("{counting}");
                assert!(
                    one(&backend, &h(&key, Cost::Consume(9), counting))
                        .await
                        .verdict
                        .admitted
                );
                let refused = one(&backend, &h(&key, Cost::Consume(5), counting)).await;
                assert!(!refused.verdict.admitted, "{algorithm} {counting}");
                assert_eq!(refused.receipt, None, "nothing gives a refused charge back");
                let check = one(&backend, &h(&key, Cost::CheckOnly, counting)).await;
                match counting {
                    Counting::Admitted => {
                        assert_eq!(refused.verdict.remaining, 1, "what a smaller hit may use");
                        assert_eq!((check.verdict.admitted, check.verdict.remaining), (true, 1));
                    }
                    Counting::All => {
                        assert_eq!(refused.verdict.remaining, 0, "14 of 10 used");
                        assert_eq!(
                            (check.verdict.admitted, check.verdict.remaining),
                            (false, 0)
                        );
                    }
                }
            }
        }
    }

    #[tokio::test]
    async fn oversized_costs_and_zero_limits_are_rejected_with_the_full_window() {
        for algorithm in BOTH {
            let (backend, _clock) = backend_at(3 * W + 1);
            for (limit, cost) in [
                (5, Cost::Consume(6)),
                (5, Cost::Consume(u64::MAX)),
                (0, Cost::Consume(1)),
            ] {
                let outcome = one(&backend, &hit("k", algorithm, limit, cost)).await;
                assert!(!outcome.verdict.admitted);
                assert_eq!(outcome.verdict.reset_ms, W);
                assert_eq!(outcome.verdict.remaining, limit);
            }
            // Nothing is above a limit of 0 until something is charged to it.
            let outcome = one(&backend, &hit("k", algorithm, 0, Cost::CheckOnly)).await;
            assert_eq!(
                (outcome.verdict.admitted, outcome.verdict.remaining),
                (true, 0)
            );
            assert_eq!(backend.key_count(), 0);
        }
    }

    #[tokio::test]
    async fn hits_in_one_call_are_decided_in_order() {
        let (backend, _clock) = backend_at(W);
        let hits = [
            hit("a", Algorithm::SlidingWindowCounter, 1, Cost::Consume(1)),
            hit("a", Algorithm::SlidingWindowCounter, 1, Cost::Consume(1)),
            hit("b", Algorithm::SlidingWindowLog, 1, Cost::Consume(1)),
        ];
        let admitted: Vec<bool> = backend
            .acquire(&hits)
            .await
            .into_iter()
            .map(|r| r.unwrap().verdict.admitted)
            .collect();
        assert_eq!(admitted, [true, false, true]);
        backend.ping().await.unwrap();
    }

    #[tokio::test]
    async fn release_restores_exactly_the_charge() {
        for algorithm in BOTH {
            let (backend, _clock) = backend_at(4 * W + 100);
            let big = one(&backend, &hit("k", algorithm, 10, Cost::Consume(7))).await;
            let small = one(&backend, &hit("k", algorithm, 10, Cost::Consume(2))).await;
            let receipt = big.receipt.unwrap();
            assert_eq!(receipt.cost, 7);
            assert_eq!(receipt.algorithm, algorithm);
            if algorithm == Algorithm::SlidingWindowCounter {
                assert_eq!(receipt.token, 4, "the fixed window charged");
            } else {
                assert_ne!(Some(receipt.token), small.receipt.as_ref().map(|r| r.token));
            }
            backend
                .release(std::slice::from_ref(&receipt))
                .await
                .unwrap();
            let check = one(&backend, &hit("k", algorithm, 10, Cost::CheckOnly)).await;
            assert_eq!(
                check.verdict.remaining, 8,
                "{algorithm}: only the 7 came back"
            );
            // Releasing twice gives nothing more back for the log (the entry is gone); for the
            // counter a duplicate release would subtract again, so the limiter releases once.
            if algorithm == Algorithm::SlidingWindowLog {
                backend
                    .release(std::slice::from_ref(&receipt))
                    .await
                    .unwrap();
                let check = one(&backend, &hit("k", algorithm, 10, Cost::CheckOnly)).await;
                assert_eq!(check.verdict.remaining, 8);
            }
            backend.release(&[small.receipt.unwrap()]).await.unwrap();
            assert_eq!(
                backend.key_count(),
                0,
                "an emptied window is dropped at once"
            );
        }
    }

    #[tokio::test]
    async fn counter_release_reaches_the_previous_window_and_no_further() {
        let (backend, clock) = backend_at(4 * W + 900);
        let h = hit("k", Algorithm::SlidingWindowCounter, 10, Cost::Consume(4));
        let first = one(&backend, &h).await.receipt.unwrap();
        // The next window writes, so the first charge now sits in `prev`.
        clock.set(5 * W);
        let second = one(&backend, &h).await.receipt.unwrap();
        backend.release(&[first]).await.unwrap();
        let check = hit("k", Algorithm::SlidingWindowCounter, 10, Cost::CheckOnly);
        assert_eq!(one(&backend, &check).await.verdict.remaining, 6);
        // Two windows on, the second charge no longer counts; refunding it changes nothing.
        clock.set(7 * W);
        one(&backend, &h).await;
        backend.release(&[second]).await.unwrap();
        assert_eq!(one(&backend, &check).await.verdict.remaining, 6);
    }

    #[tokio::test]
    async fn releasing_unknown_or_mismatched_receipts_is_harmless() {
        let (backend, _clock) = backend_at(W);
        one(
            &backend,
            &hit("k", Algorithm::SlidingWindowLog, 5, Cost::Consume(2)),
        )
        .await;
        let foreign = [
            Receipt {
                key: "missing".into(),
                algorithm: Algorithm::SlidingWindowLog,
                window_ms: W,
                token: 0,
                cost: 2,
                released_remaining: 0,
            },
            Receipt {
                key: "k".into(),
                algorithm: Algorithm::SlidingWindowCounter,
                window_ms: W,
                token: 1,
                cost: 2,
                released_remaining: 0,
            },
            Receipt {
                key: "k".into(),
                algorithm: Algorithm::SlidingWindowLog,
                window_ms: 2 * W,
                token: 0,
                cost: 2,
                released_remaining: 0,
            },
            Receipt {
                key: "k".into(),
                algorithm: Algorithm::SlidingWindowLog,
                window_ms: W,
                token: 12345,
                cost: 2,
                released_remaining: 0,
            },
        ];
        backend.release(&foreign).await.unwrap();
        let check = one(
            &backend,
            &hit("k", Algorithm::SlidingWindowLog, 5, Cost::CheckOnly),
        )
        .await;
        assert_eq!(check.verdict.remaining, 3);
    }

    #[tokio::test]
    async fn the_shards_field_is_left_to_the_sharded_adaptor() {
        let (backend, _clock) = backend_at(W);
        let mut h = hit("k", Algorithm::SlidingWindowLog, 4, Cost::Consume(1));
        h.shards = 8;
        let mut admitted = 0;
        for _ in 0..10 {
            admitted += usize::from(one(&backend, &h).await.verdict.admitted);
        }
        assert_eq!(admitted, 4);
    }

    #[tokio::test]
    async fn a_key_reused_with_another_window_starts_afresh() {
        let (backend, _clock) = backend_at(10 * W);
        let mut h = hit("k", Algorithm::SlidingWindowCounter, 1, Cost::Consume(1));
        assert!(one(&backend, &h).await.verdict.admitted);
        h.window_ms = 2 * W;
        assert!(one(&backend, &h).await.verdict.admitted);
        h.algorithm = Algorithm::SlidingWindowLog;
        assert!(one(&backend, &h).await.verdict.admitted);
        assert!(!one(&backend, &h).await.verdict.admitted);
        assert_eq!(backend.key_count(), 1);
    }

    #[tokio::test]
    async fn a_clock_stepping_back_never_lets_more_through() {
        let (backend, clock) = backend_at(50 * W);
        let h = hit("k", Algorithm::SlidingWindowLog, 3, Cost::Consume(1));
        for _ in 0..3 {
            assert!(one(&backend, &h).await.verdict.admitted);
        }
        clock.set(10 * W);
        assert!(!one(&backend, &h).await.verdict.admitted);
        clock.set(50 * W + W);
        assert!(one(&backend, &h).await.verdict.admitted);
    }

    #[tokio::test]
    async fn idle_keys_expire_and_memory_stays_bounded() {
        let (backend, clock) = backend_at(1_000 * W);
        let per_window = 4_000;
        let windows = 50;
        for n in 0..per_window * windows {
            let algorithm = if n % 2 == 0 {
                Algorithm::SlidingWindowCounter
            } else {
                Algorithm::SlidingWindowLog
            };
            let outcome = one(
                &backend,
                &hit(&format!("user-{n}"), algorithm, 5, Cost::Consume(1)),
            )
            .await;
            assert!(outcome.verdict.admitted);
            if n % 4 == 3 {
                clock.advance(1);
            }
        }
        // 200 000 distinct keys went through. Live are the counters of the last two windows and
        // the logs of the last one (1.5 windows' worth of keys); a shard may hold up to twice its
        // live windows plus a minimum between sweeps.
        let held = backend.key_count();
        assert!(held <= 4 * per_window, "{held} keys held");
        assert!(
            held >= per_window,
            "live keys must not be dropped early: {held}"
        );

        // A log key is gone one window after its newest entry, a counter two windows after its
        // fixed window.
        let now = clock.now_ms();
        one(
            &backend,
            &hit(
                "fresh-log",
                Algorithm::SlidingWindowLog,
                5,
                Cost::Consume(1),
            ),
        )
        .await;
        one(
            &backend,
            &hit(
                "fresh-counter",
                Algorithm::SlidingWindowCounter,
                5,
                Cost::Consume(1),
            ),
        )
        .await;
        clock.set(now + W);
        backend.sweep();
        let counter_index = now / W;
        assert!(backend.key_count() >= 1, "the counter is still counted");
        clock.set((counter_index + 2) * W - 1);
        backend.sweep();
        assert!(backend.key_count() >= 1);
        assert!(
            one(
                &backend,
                &hit(
                    "fresh-counter",
                    Algorithm::SlidingWindowCounter,
                    5,
                    Cost::CheckOnly
                )
            )
            .await
            .verdict
            .remaining
                < 5
        );
        clock.set((counter_index + 2) * W);
        backend.sweep();
        assert_eq!(backend.key_count(), 0, "every idle key is gone");
    }

    #[tokio::test]
    async fn sweeping_happens_on_its_own_as_traffic_flows() {
        let (backend, clock) = backend_at(100 * W);
        for n in 0..10_000 {
            one(
                &backend,
                &hit(
                    &format!("old-{n}"),
                    Algorithm::SlidingWindowLog,
                    5,
                    Cost::Consume(1),
                ),
            )
            .await;
        }
        assert_eq!(backend.key_count(), 10_000);
        clock.advance(5 * W);
        // Only checks on fresh keys: they store nothing, yet they drive each shard's sweep.
        for n in 0..SHARD_COUNT * 400 {
            one(
                &backend,
                &hit(
                    &format!("new-{n}"),
                    Algorithm::SlidingWindowLog,
                    5,
                    Cost::CheckOnly,
                ),
            )
            .await;
        }
        assert_eq!(backend.key_count(), 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_tasks_never_admit_more_than_the_limit() {
        for algorithm in BOTH {
            let (backend, _clock) = backend_at(77 * W + 300);
            let backend = Arc::new(backend);
            let admitted = Arc::new(AtomicUsize::new(0));
            let tasks: Vec<_> = (0..16)
                .map(|_| {
                    let backend = Arc::clone(&backend);
                    let admitted = Arc::clone(&admitted);
                    tokio::spawn(async move {
                        let h = hit("hot", algorithm, 500, Cost::Consume(1));
                        for _ in 0..100 {
                            if one(backend.as_ref(), &h).await.verdict.admitted {
                                admitted.fetch_add(1, Ordering::Relaxed);
                            }
                            tokio::task::yield_now().await;
                        }
                    })
                })
                .collect();
            for task in tasks {
                task.await.unwrap();
            }
            // 1600 attempts against a limit of 500 in one instant: exactly the limit gets in.
            assert_eq!(admitted.load(Ordering::Relaxed), 500, "{algorithm}");
        }
    }

    #[test]
    fn concurrent_threads_on_distinct_keys_do_not_interfere() {
        let clock = ManualClock::new(9 * W);
        let backend = Arc::new(MemoryBackend::with_clock(Arc::new(clock.clone())));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let counts: Vec<(usize, usize)> = std::thread::scope(|scope| {
            let workers: Vec<_> = (0..8)
                .map(|thread| {
                    let backend = Arc::clone(&backend);
                    let clock = clock.clone();
                    scope.spawn(move || {
                        let runtime = tokio::runtime::Builder::new_current_thread()
                            .build()
                            .unwrap();
                        let mut shared = 0;
                        let mut own = 0;
                        for n in 0..300 {
                            let shared_hit = hit(
                                "shared",
                                Algorithm::SlidingWindowLog,
                                1000,
                                Cost::Consume(1),
                            );
                            let own_hit = hit(
                                &format!("own-{thread}"),
                                Algorithm::SlidingWindowCounter,
                                100,
                                Cost::Consume(1),
                            );
                            let results = runtime.block_on(backend.acquire(&[shared_hit, own_hit]));
                            let [a, b] = <[_; 2]>::try_from(results).unwrap();
                            shared += usize::from(a.unwrap().verdict.admitted);
                            own += usize::from(b.unwrap().verdict.admitted);
                            // Time moves a little but stays inside the window.
                            if thread == 0 && n % 100 == 0 {
                                clock.advance(1);
                            }
                        }
                        (shared, own)
                    })
                })
                .collect();
            workers.into_iter().map(|w| w.join().unwrap()).collect()
        });
        let shared: usize = counts.iter().map(|c| c.0).sum();
        assert_eq!(
            shared, 1000,
            "2400 attempts on the shared log admit exactly its limit"
        );
        for (_, own) in &counts {
            assert_eq!(*own, 100, "each thread's own key has its own full limit");
        }
        let check = hit("shared", Algorithm::SlidingWindowLog, 1000, Cost::CheckOnly);
        let outcome = runtime
            .block_on(backend.acquire(&[check]))
            .remove(0)
            .unwrap();
        assert_eq!(outcome.verdict.remaining, 0);
    }
}
