//! The embedded backend: every window lives in this process. Right for a single instance and for
//! development; it implements exactly the math of [`crate::window`].
//!
//! Keys are spread over a fixed set of shards, each a mutex around a hash table, so hits on
//! different keys rarely contend and a lock is held only for one O(1) decision (a rejected
//! sliding-window-log hit also walks that key's entries to find its retry time).
//!
//! # Memory
//!
//! A rate limiter's keys come from its clients, and a flood of distinct keys is the first thing an
//! attacker tries, so what this backend holds is bounded:
//!
//! - **A budget.** The bytes held (the tables' allocations, the logs' headers and the pages their
//!   entries are kept in, as asked of the allocator) never exceed the budget given at
//!   construction ([`MemoryBackend::with_budget`], `--memory-budget`), split evenly over the
//!   shards. A table grows only when the old and the new table fit together, and is rebuilt in
//!   place of its deleted slots only when two copies fit, so not even the copies made while
//!   growing or rebuilding go over. The one thing outside the count is the allocator's own
//!   overhead per allocation (a few bytes per table and per page).
//! - **Eviction order** when a new key does not fit: first every expired window of the shard,
//!   then the windows that expire soonest (an eighth of the shard at a time, so the cost is
//!   amortized). A log that cannot grow because its shard holds nothing else to evict merges its
//!   two oldest entries into one, stamped with the newer time. Evicted live windows are counted
//!   ([`MemoryUsage::evictions`]). Evicting a live window makes its limit count *less* than it
//!   admitted (the key starts again from zero), so that window may admit up to its limit again,
//!   and only while an attacker keeps the budget full. Merging errs the other way: the merged
//!   entry leaves the window later than its older half would have, so the log counts that half
//!   for longer and refuses a little early; it never admits more than the limit.
//! - **Sweeping.** Expired windows are dropped as traffic flows (each shard sweeps itself after
//!   as many operations as its last sweep kept windows, so the cost is amortized O(1) per hit),
//!   and on a timer ([`Backend::maintain`], about once a second), so memory comes back while the
//!   service is idle. A sweep that leaves a table mostly empty shrinks it, and one that leaves
//!   most of the logs' pages free moves the entries together and gives the free pages back.
//! - **Small keys.** A window is stored under a 128-bit keyed hash of its identity (key,
//!   algorithm, window), not the key's text, so a key costs the same however long the client made
//!   its values: a counter is one 48-byte table slot and nothing else, under 64 bytes a key with
//!   the table's free slots counted; a log adds a 32-byte header and 32 bytes an entry (in pages
//!   each shard keeps for its logs, apart from the requests' own allocations: see the `log`
//!   module). Two identities share a window only if both 64-bit halves of their keyed hash
//!   collide, a chance of 2^-128 per pair that no client can steer (the hash key is random per
//!   process).
//!
//! Each hit hashes its identity once, for two outputs: the first picks the shard and finds the
//! slot in the shard's table, the second (the digest of the same input and one more byte)
//! confirms it. Keys come from clients, so the hash is SipHash with a random key (std's
//! `RandomState`), which keeps an attacker from choosing keys that collide.

use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::mem::size_of;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use hashbrown::HashTable;

use crate::backend::shard::{self, ShardKeys};
use crate::backend::{Backend, BackendError, Hit, MemoryUsage, Outcome, Receipt, lease};
use crate::clock::{Clock, SystemClock};
use crate::window::{self, Algorithm, Cost, Counting};

mod inspect;
mod log;

use log::{LogEntry, LogId, Logs};

/// How many independently locked maps the keys are spread over.
const SHARD_COUNT: usize = 64;

/// Which bits of a key's hash choose its shard. The table inside a shard indexes buckets with the
/// low bits of the same hash and tags entries with its top seven bits; taking the shard from bits
/// in between keeps the keys of one shard spread over all of its buckets and tags.
const SHARD_HASH_SHIFT: u32 = 40;

/// A shard sweeps after at least this many operations, so small shards are not swept on every hit.
const MIN_OPS_BETWEEN_SWEEPS: usize = 64;

/// A timer sweep that frees at least this much asks the allocator to give its free pages back.
/// Many small windows freed one by one leave holes all over the heap, which the allocator keeps
/// for reuse; after a flood of keys has expired, an idle process would otherwise stay at its
/// peak resident size.
const RETURN_TO_SYSTEM_BYTES: usize = 1 << 20;

/// The budget when none is given: enough for about two and a half million counter keys, small
/// beside what a rate limiter's host usually has, and far below what a key flood would take
/// without one.
pub const DEFAULT_BUDGET: usize = 256 << 20;

/// The budget when none is given: [`DEFAULT_BUDGET`], or half the memory limit of the cgroup
/// this process runs in when that is smaller (a sidecar with a 256Mi limit gets 128MiB), so the
/// backend's windows leave room for everything else the process holds.
pub fn default_budget() -> usize {
    let limit = [
        "/sys/fs/cgroup/memory.max",
        "/sys/fs/cgroup/memory/memory.limit_in_bytes",
    ]
    .iter()
    .find_map(|file| std::fs::read_to_string(file).ok())
    .and_then(|text| text.trim().parse::<usize>().ok());
    match limit {
        Some(limit) => (limit / 2).clamp(MIN_BUDGET, DEFAULT_BUDGET),
        None => DEFAULT_BUDGET,
    }
}

/// The smallest budget accepted: each shard must hold a table of a few windows and one log.
pub const MIN_BUDGET: usize = 1 << 20;

/// The longest window the memory backend keeps apart; longer ones are treated as this long
/// (about 34 years), as the Redis scripts refuse them. Keeps every expiry time in range.
const MAX_WINDOW_MS: u64 = 1 << 40;

/// Sliding windows kept in process memory.
pub struct MemoryBackend {
    clock: Arc<dyn Clock>,
    /// Hashes an identity: the table's hash (and the shard's), then its check.
    hasher: RandomState,
    shards: Box<[Mutex<Shard>]>,
    budget: usize,
}

impl MemoryBackend {
    /// A backend reading the machine's wall clock, with the default budget.
    pub fn new() -> Self {
        MemoryBackend::with_clock(Arc::new(SystemClock))
    }

    /// A backend reading `clock`, so tests can move time by hand, with the default budget.
    pub fn with_clock(clock: Arc<dyn Clock>) -> Self {
        MemoryBackend::with_budget(clock, DEFAULT_BUDGET)
    }

    /// A backend reading `clock` that never holds more than `budget` bytes (at least
    /// [`MIN_BUDGET`]; a smaller one is raised to it).
    pub fn with_budget(clock: Arc<dyn Clock>, budget: usize) -> Self {
        let budget = budget.max(MIN_BUDGET);
        let share = budget / SHARD_COUNT;
        MemoryBackend {
            clock,
            hasher: RandomState::new(),
            shards: (0..SHARD_COUNT)
                .map(|_| Mutex::new(Shard::new(share)))
                .collect(),
            budget,
        }
    }

    /// The most bytes this backend holds.
    pub fn budget(&self) -> usize {
        self.budget
    }

    /// How many windows are held right now, expired ones not yet swept included.
    pub fn key_count(&self) -> usize {
        (0..self.shards.len())
            .map(|index| self.lock(index).slots.len())
            .sum()
    }

    /// What the backend holds: bytes, windows, and live windows evicted to stay in budget.
    pub fn usage(&self) -> MemoryUsage {
        let mut usage = MemoryUsage {
            budget: self.budget as u64,
            ..MemoryUsage::default()
        };
        for index in 0..self.shards.len() {
            let shard = self.lock(index);
            usage.bytes += shard.held() as u64;
            usage.keys += shard.slots.len() as u64;
            usage.evictions += shard.evictions;
        }
        usage
    }

    /// Drops every expired window now. Sweeping also happens on its own as hits arrive and on
    /// the server's timer ([`Backend::maintain`]); this is for tests.
    pub fn sweep(&self) {
        for index in 0..self.shards.len() {
            self.sweep_shard(index);
        }
    }

    /// Sweeps one shard and answers how many bytes of the budget it gave up.
    fn sweep_shard(&self, index: usize) -> usize {
        let now = self.clock.now_ms();
        let mut shard = self.lock(index);
        let now = shard.advance_clock(now);
        let before = shard.held();
        shard.sweep(now);
        before.saturating_sub(shard.held())
    }

    /// The identity of a window: its two keyed digests, and the index of its shard.
    fn locate(&self, key: &str, algorithm: Algorithm, window_ms: u64) -> (Id, usize) {
        let mut state = self.hasher.build_hasher();
        // The key's bytes, then one word of fixed width: the input is told apart by its length
        // alone, so no separator is needed, and each write costs the hasher a call. The window
        // is at most MAX_WINDOW_MS (2^40), which leaves room for the algorithm below it.
        state.write(key.as_bytes());
        let algorithm_bit = match algorithm {
            Algorithm::SlidingWindowCounter => 0,
            Algorithm::SlidingWindowLog => 1,
        };
        state.write_u64((window_ms.min(MAX_WINDOW_MS) << 1) | algorithm_bit);
        let hash = state.finish();
        // The check is the keyed hash of the same input with one more byte: SipHash is a keyed
        // pseudo-random function, so the two outputs are as independent as two hashes under two
        // keys (two identities share both only with a chance of 2^-128), and finishing does not
        // consume the state, so the key's bytes are hashed once for both.
        state.write_u8(0xff);
        let id = Id {
            hash,
            check: state.finish(),
        };
        // The remainder is below SHARD_COUNT, so the narrowing cannot lose anything.
        let shard = ((hash >> SHARD_HASH_SHIFT) % SHARD_COUNT as u64) as usize;
        (id, shard)
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
        let window_ms = window_of(hit.window_ms);
        let (id, index) = self.locate(&hit.key, hit.algorithm, window_ms);
        let mut shard = self.lock(index);
        Self::decide_in(&mut shard, id, hit, now)
    }

    /// Decides the hits of one group (the limits of one descriptor) in one step: every shard
    /// they live in is locked at once, in index order (the only place that holds two, so no
    /// two callers wait on each other), each hit is decided, and when any is refused the
    /// charges of the others that count admitted hits only are given back before the locks go:
    /// no other decision sees them.
    fn decide_group(&self, group: &[Hit]) -> Vec<Result<Outcome, BackendError>> {
        let now = self.clock.now_ms();
        let located: Vec<(Id, usize)> = group
            .iter()
            .map(|hit| self.locate(&hit.key, hit.algorithm, window_of(hit.window_ms)))
            .collect();
        let mut indexes: Vec<usize> = located.iter().map(|(_, index)| *index).collect();
        indexes.sort_unstable();
        indexes.dedup();
        let mut guards: Vec<(usize, MutexGuard<'_, Shard>)> = indexes
            .iter()
            .map(|&index| (index, self.lock(index)))
            .collect();
        let mut outcomes: Vec<Outcome> = Vec::with_capacity(group.len());
        for (hit, (id, index)) in group.iter().zip(&located) {
            let Some((_, shard)) = guards.iter_mut().find(|(i, _)| i == index) else {
                continue;
            };
            outcomes.push(Self::decide_in(shard, *id, hit, now));
        }
        if outcomes.iter().any(|outcome| !outcome.verdict.admitted) {
            for ((hit, (id, index)), outcome) in group.iter().zip(&located).zip(&mut outcomes) {
                if hit.counting != Counting::Admitted {
                    continue;
                }
                let Some(receipt) = outcome.receipt.take() else {
                    continue;
                };
                if let Some((_, shard)) = guards.iter_mut().find(|(i, _)| i == index) {
                    shard.refund(*id, &receipt, window_of(receipt.window_ms));
                }
            }
        }
        drop(guards);
        outcomes.into_iter().map(Ok).collect()
    }

    /// Decides `hit`, whose window is `id`, in its locked shard.
    fn decide_in(shard: &mut Shard, id: Id, hit: &Hit, now: u64) -> Outcome {
        let window_ms = window_of(hit.window_ms);
        let now = shard.advance_clock(now);
        shard.count_operation(now);
        // `hit.shards` is not read here: `backend::Sharded` splits a sharded limit into plain
        // hits on shard keys before they reach this backend.
        let cost = window::normalize_cost(hit.cost);
        let (verdict, token) = match hit.algorithm {
            Algorithm::SlidingWindowCounter => {
                shard.decide_counter(id, hit.limit, window_ms, cost, hit.counting, now)
            }
            Algorithm::SlidingWindowLog => {
                // Only a client's slice is stamped ahead here: leases are off in one process.
                let ahead = if hit.slice { lease::ahead_ms(hit) } else { 0 };
                let logged = LogHit {
                    limit: hit.limit,
                    window_ms,
                    cost,
                    counting: hit.counting,
                    ahead_ms: ahead,
                };
                shard.decide_log(id, &logged, now)
            }
        };
        // A token comes only with an admitted charge: nothing gives a refused one back.
        let receipt = match (cost, token) {
            (Cost::Consume(units), Some(token)) => Some(Receipt {
                key: hit.key.clone(),
                algorithm: hit.algorithm,
                window_ms: hit.window_ms,
                token,
                cost: units,
                released_remaining: verdict.remaining.saturating_add(units),
                keep: 0,
                leased: false,
                refundable_until_ms: 0,
                keep_refundable: false,
            }),
            _ => None,
        };
        // Every refund of a window in this process goes through this instance (and its local
        // cache drops what it refunds): a refusal stands as long as the window says.
        let stands_ms = if verdict.admitted {
            0
        } else {
            verdict.reset_ms
        };
        Outcome {
            verdict,
            receipt,
            cached: false,
            stands_ms,
        }
    }

    fn refund(&self, receipt: &Receipt) {
        let window_ms = window_of(receipt.window_ms);
        let (id, index) = self.locate(&receipt.key, receipt.algorithm, window_ms);
        let mut shard = self.lock(index);
        shard.refund(id, receipt, window_ms);
    }
}

/// The window length this backend computes with.
fn window_of(window_ms: u64) -> u64 {
    window::effective_window_ms(window_ms).min(MAX_WINDOW_MS)
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
            .field("budget", &self.budget)
            .finish_non_exhaustive()
    }
}

impl Backend for MemoryBackend {
    async fn acquire(&self, hits: &[Hit]) -> Vec<Result<Outcome, BackendError>> {
        if hits.iter().all(|hit| hit.group == 0) {
            return hits.iter().map(|hit| Ok(self.decide(hit))).collect();
        }
        let mut results = Vec::with_capacity(hits.len());
        let mut rest = hits;
        while let Some(first) = rest.first() {
            let run = if first.group == 0 {
                1
            } else {
                rest.iter()
                    .take_while(|hit| hit.group == first.group)
                    .count()
            };
            let (group, after) = rest.split_at(run);
            if run == 1 {
                results.push(Ok(self.decide(first)));
            } else {
                results.extend(self.decide_group(group));
            }
            rest = after;
        }
        results
    }

    /// Every group is decided under the locks of all its windows at once.
    fn joint(&self, _group: &[Hit]) -> bool {
        true
    }

    async fn release(&self, receipts: &[Receipt]) -> Result<(), BackendError> {
        for receipt in receipts {
            self.refund(receipt);
        }
        Ok(())
    }

    async fn peek(&self, hits: &[Hit]) -> crate::backend::Peeked {
        hits.iter().map(|hit| Ok(self.peek_one(hit))).collect()
    }

    async fn clear(&self, hits: &[Hit]) -> crate::backend::Cleared {
        hits.iter()
            .map(|hit| {
                self.clear_one(hit);
                Ok(())
            })
            .collect()
    }

    async fn ping(&self) -> Result<(), BackendError> {
        Ok(())
    }

    /// Sweeps every shard, one lock at a time, yielding between shards so that requests on the
    /// same worker are not held up by a whole pass.
    async fn maintain(&self) {
        let mut freed = 0;
        for index in 0..self.shards.len() {
            freed += self.sweep_shard(index);
            tokio::task::yield_now().await;
        }
        if freed >= RETURN_TO_SYSTEM_BYTES {
            release_free_memory();
        }
    }

    fn memory_usage(&self) -> Option<MemoryUsage> {
        Some(self.usage())
    }
}

/// Placement does not matter in one process: a shard is the identity with a plain suffix.
impl ShardKeys for MemoryBackend {
    fn shard_key(&self, key: &str, shard: u16, _shards: u16) -> String {
        shard::plain_shard_key(key, shard)
    }
}

/// A window's identity: two independent keyed digests of (key, algorithm, window), 128 bits that
/// stand for the key, which the table does not hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Id {
    hash: u64,
    check: u64,
}

/// One window in a shard's table: 48 bytes.
struct Slot {
    id: Id,
    /// When the window holds nothing any more: a counter two windows after the fixed window it
    /// last wrote (so that index is `expires_ms / window - 2`), a log one window after its newest
    /// entry. What sweeping and eviction order by.
    expires_ms: u64,
    state: State,
}

enum State {
    /// A sliding window counter: the counts of the fixed window last written and the one
    /// before it.
    Counter { prev: u64, curr: u64 },
    /// A sliding window log, kept in the shard's [`Logs`]: most keys are counters, and they
    /// stay small.
    Log(LogId),
}

/// The expiry of a counter whose last written fixed window is `index`.
fn counter_expiry(index: u64, window_ms: u64) -> u64 {
    index.saturating_add(2).saturating_mul(window_ms)
}

/// The fixed window a counter expiring at `expires_ms` last wrote. Windows are at most
/// [`MAX_WINDOW_MS`] and times far below `u64::MAX`, so the product never saturated; if it had,
/// the counts are read as current, which only counts more.
fn counter_index(expires_ms: u64, window_ms: u64, now_index: u64) -> u64 {
    if expires_ms == u64::MAX {
        return now_index;
    }
    (expires_ms / window_ms).saturating_sub(2)
}

/// Bytes of the allocation a table of `buckets` buckets of slots takes (what hashbrown asks of
/// the allocator: the slots, a control byte each, and one group of trailing control bytes).
fn table_bytes(buckets: usize) -> usize {
    const GROUP_WIDTH: usize = 16;
    buckets * size_of::<Slot>() + buckets + GROUP_WIDTH
}

/// The items a table of `buckets` buckets holds before it must grow.
fn full_capacity(buckets: usize) -> usize {
    if buckets < 8 {
        buckets.saturating_sub(1)
    } else {
        buckets / 8 * 7
    }
}

/// What a write needs room for.
#[derive(Debug, Clone, Copy)]
struct Need {
    /// One more slot in the table.
    slot: bool,
    /// A new log's header.
    log: bool,
    /// One more log entry.
    entry: bool,
}

impl Need {
    /// A new counter: its slot.
    const COUNTER: Need = Need {
        slot: true,
        log: false,
        entry: false,
    };
    /// A new log: its slot, its header and its first entry.
    const LOG: Need = Need {
        slot: true,
        log: true,
        entry: true,
    };
    /// One more entry of a stored log.
    const ENTRY: Need = Need {
        slot: false,
        log: false,
        entry: true,
    };
}

/// One lock's worth of windows.
struct Shard {
    slots: HashTable<Slot>,
    /// The logs' headers and entries.
    logs: Logs,
    /// The most bytes this shard holds: its share of the budget.
    budget: usize,
    /// Live windows dropped to stay within the budget.
    evictions: u64,
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

impl Shard {
    fn new(budget: usize) -> Shard {
        Shard {
            slots: HashTable::new(),
            logs: Logs::new(budget),
            budget,
            evictions: 0,
            latest_ms: 0,
            operations_since_sweep: 0,
            kept_by_last_sweep: 0,
            next_entry_id: 0,
        }
    }

    /// Bytes held: the table's allocation, the logs' headers and the pages of their entries.
    fn held(&self) -> usize {
        self.slots.allocation_size() + self.logs.bytes()
    }

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
        let logs = &mut self.logs;
        self.slots.retain(|slot| {
            let keep = slot.expires_ms > now_ms;
            if !keep && let State::Log(log) = slot.state {
                logs.remove(log);
            }
            keep
        });
        self.kept_by_last_sweep = self.slots.len();
        self.logs.compact(
            self.slots
                .iter_mut()
                .filter_map(|slot| match &mut slot.state {
                    State::Log(log) => Some(log),
                    State::Counter { .. } => None,
                }),
        );
        // A burst of distinct keys leaves a large table behind; give the memory back.
        if self.slots.capacity() > 4 * self.slots.len() + MIN_OPS_BETWEEN_SWEEPS {
            self.slots
                .shrink_to(2 * self.slots.len(), |slot| slot.id.hash);
        }
    }

    fn find(&mut self, id: Id) -> Option<&mut Slot> {
        self.slots.find_mut(id.hash, |slot| slot.id == id)
    }

    /// Whether `extra_heap` more log bytes and, with `new_slot`, one more slot fit in the
    /// budget. A full table grows when the old and the new table fit together (as they are
    /// while the slots move); else one full of live and deleted slots is rebuilt at its size to
    /// reclaim the deleted ones when two copies fit; else the caller evicts. (Growing only to a
    /// size that could later be rebuilt as well, twice the new table, left up to half of a small
    /// budget unused: a one-entry log costs more than a counter, and with its logs the shard's
    /// table could never take that first step.)
    fn fits(&mut self, extra_heap: usize, new_slot: bool) -> bool {
        let held = self.held() + extra_heap;
        if !new_slot || self.slots.len() < self.slots.capacity() {
            return held <= self.budget;
        }
        let len = self.slots.len();
        let buckets = self.slots.num_buckets();
        let table = self.slots.allocation_size();
        if len < full_capacity(buckets) / 2 {
            // hashbrown reclaims the deleted slots in place.
            return held <= self.budget;
        }
        let grown = table_bytes((buckets * 2).max(4));
        if held + grown <= self.budget {
            return true;
        }
        if len < full_capacity(buckets) && held + table <= self.budget {
            self.rebuild();
            return self.slots.len() < self.slots.capacity() && held <= self.budget;
        }
        false
    }

    /// Moves every slot into a fresh table of the same size, dropping the deleted slots that
    /// evictions leave behind.
    fn rebuild(&mut self) {
        let buckets = self.slots.num_buckets();
        let mut fresh = HashTable::with_capacity(full_capacity(buckets));
        for slot in std::mem::take(&mut self.slots) {
            fresh.insert_unique(slot.id.hash, slot, |slot| slot.id.hash);
        }
        self.slots = fresh;
    }

    /// Makes room for what a write needs, evicting as the eviction order says; `keep` is never
    /// evicted (the window being written). False if even that could not make room.
    fn make_room(&mut self, now_ms: u64, need: Need, keep: Option<Id>) -> bool {
        let mut swept = false;
        loop {
            // A window evicted or swept may have freed a log node, so what is needed is asked anew.
            let extra_heap = if need.log {
                self.logs.growth_for_new_log()
            } else {
                0
            } + if need.entry {
                self.logs.growth_for_entry()
            } else {
                0
            };
            if self.fits(extra_heap, need.slot) {
                return true;
            }
            if !swept {
                swept = true;
                self.sweep(now_ms);
                continue;
            }
            if !self.evict_soonest(keep) {
                return false;
            }
        }
    }

    /// Evicts about the eighth of the shard's windows that expire soonest (at least one), `keep`
    /// excepted; false when there was nothing to evict. The cut is estimated from a sample of
    /// expiries, so nothing is allocated, but the order is exact: every window evicted expires no
    /// later than every window kept.
    fn evict_soonest(&mut self, keep: Option<Id>) -> bool {
        const SAMPLE: usize = 256;
        let candidates =
            self.slots.len() - usize::from(keep.is_some_and(|id| self.find(id).is_some()));
        if candidates == 0 {
            return false;
        }
        let stride = candidates / SAMPLE + 1;
        let mut sample = [0u64; SAMPLE];
        let mut sampled = 0;
        for (n, slot) in self
            .slots
            .iter()
            .filter(|slot| Some(slot.id) != keep)
            .enumerate()
        {
            if n % stride == 0 && sampled < SAMPLE {
                sample[sampled] = slot.expires_ms;
                sampled += 1;
            }
        }
        let sample = &mut sample[..sampled];
        sample.sort_unstable();
        let threshold = sample[(sampled / 8).max(1) - 1];
        let wanted = (candidates / 8).max(1);
        let sooner = self
            .slots
            .iter()
            .filter(|slot| Some(slot.id) != keep && slot.expires_ms < threshold)
            .count();
        // Everything expiring before the cut goes, and of the windows expiring exactly at it (a
        // flood of counters in one window all expire together) only as many as the batch needs.
        let mut ties = wanted.saturating_sub(sooner).max(usize::from(sooner == 0));
        let mut evicted = 0;
        let logs = &mut self.logs;
        self.slots.retain(|slot| {
            if Some(slot.id) == keep || slot.expires_ms > threshold {
                return true;
            }
            if slot.expires_ms == threshold {
                if ties == 0 {
                    return true;
                }
                ties -= 1;
            }
            evicted += 1;
            if let State::Log(log) = slot.state {
                logs.remove(log);
            }
            false
        });
        self.evictions += evicted;
        true
    }

    /// Stores a new window; the caller has made room.
    fn insert(&mut self, slot: Slot) {
        self.slots
            .insert_unique(slot.id.hash, slot, |slot| slot.id.hash);
    }

    /// Decides a counter hit, recording a refused one too under [`Counting::All`]; answers the
    /// fixed window charged when an admitted hit consumed something.
    fn decide_counter(
        &mut self,
        id: Id,
        limit: u64,
        window_ms: u64,
        cost: Cost,
        counting: Counting,
        now_ms: u64,
    ) -> (window::Verdict, Option<u64>) {
        let index = window::counter_window_index(now_ms, window_ms);
        let stored = self.find(id);
        let (prev, curr) = match &stored {
            Some(Slot {
                expires_ms,
                state: State::Counter { prev, curr },
                ..
            }) => window::counter_counts(
                counter_index(*expires_ms, window_ms, index),
                *prev,
                *curr,
                index,
            ),
            _ => (0, 0),
        };
        let verdict = window::counter_decide(limit, window_ms, now_ms, prev, curr, cost, counting);
        let Cost::Consume(units) = cost else {
            return (verdict, None);
        };
        let curr_after = match (verdict.admitted, counting) {
            (true, _) => curr.saturating_add(units),
            (false, Counting::All) => window::counter_refused_count(curr, units),
            (false, Counting::Admitted) => return (verdict, None),
        };
        let expires_ms = counter_expiry(index, window_ms);
        let state = State::Counter {
            prev,
            curr: curr_after,
        };
        match stored {
            Some(slot) => {
                slot.expires_ms = expires_ms;
                slot.state = state;
            }
            None => {
                // A minimum budget always leaves room for one slot once the others are evicted.
                self.make_room(now_ms, Need::COUNTER, None);
                self.insert(Slot {
                    id,
                    expires_ms,
                    state,
                });
            }
        }
        // Only an admitted charge is ever given back.
        (verdict, verdict.admitted.then_some(index))
    }

    /// The log stored under `id`, if there is one.
    fn log_of(&mut self, id: Id) -> Option<LogId> {
        match self.find(id) {
            Some(Slot {
                state: State::Log(log),
                ..
            }) => Some(*log),
            _ => None,
        }
    }

    /// Decides a log hit, recording a refused one too under [`Counting::All`]; answers the
    /// entry's id when an admitted hit consumed something.
    fn decide_log(&mut self, id: Id, hit: &LogHit, now_ms: u64) -> (window::Verdict, Option<u64>) {
        let LogHit {
            limit,
            window_ms,
            cost,
            counting,
            ahead_ms,
        } = *hit;
        let log = self.log_of(id);
        if let Some(log) = log {
            // Pruning only gives nodes back to the shard; the pages held do not change.
            self.logs.prune(log, window_ms, now_ms);
        }
        let logs = &self.logs;
        let newest_ms = log.and_then(|log| logs.newest_ms(log));
        let mut verdict = window::log_decide_live(
            limit,
            window_ms,
            now_ms,
            log.map_or(0, |log| logs.used(log)),
            newest_ms,
            log.into_iter().flat_map(|log| logs.entries(log)),
            cost,
            counting,
        );
        let Cost::Consume(units) = cost else {
            return (verdict, None);
        };
        let entry_cost = match (verdict.admitted, counting) {
            (true, _) => units,
            (false, Counting::All) => window::log_refused_cost(limit, units),
            (false, Counting::Admitted) => return (verdict, None),
        };
        // A slice is stamped when its last hit may come, and every entry at least at the
        // newest one's time, so that the log stays in time order (a later stamp only keeps
        // units in the window longer: fewer admissions, never more).
        let mut time_ms = now_ms.max(newest_ms.unwrap_or(0));
        if verdict.admitted && ahead_ms > 0 {
            time_ms = time_ms.max(now_ms.saturating_add(ahead_ms));
            verdict.reset_ms = window_ms.saturating_add(time_ms - now_ms);
        }
        let entry_id = self.next_entry_id;
        self.next_entry_id = self.next_entry_id.wrapping_add(1);
        let entry = LogEntry {
            time_ms,
            cost: entry_cost,
            id: entry_id,
        };
        self.append(id, log, window_ms, now_ms, entry);
        // Only an admitted charge is ever given back.
        (verdict, verdict.admitted.then_some(entry_id))
    }

    /// Appends an entry (an admitted hit's, or a refused one's under [`Counting::All`]) to the
    /// log `id`, creating it if needed, within the budget.
    fn append(
        &mut self,
        id: Id,
        mut stored: Option<LogId>,
        window_ms: u64,
        now_ms: u64,
        entry: LogEntry,
    ) {
        if stored.is_some() && !self.logs.has_room_for_entry() {
            // Room for a page means the page is taken; a free node needs nothing more.
            if self.make_room(now_ms, Need::ENTRY, Some(id)) && !self.logs.has_room_for_entry() {
                self.logs.grow();
            }
            // Making room may have swept this log away (it had expired: a refused hit can leave
            // an empty log behind), or moved it; it is looked up again.
            stored = self.log_of(id);
            if let Some(log) = stored
                && !self.logs.has_room_for_entry()
            {
                // Nothing else in this shard could be evicted: keep the log's size by merging
                // its two oldest entries. A log too short to merge never gets here: it would
                // leave most of the shard's first page free.
                self.logs.merge_oldest(log);
            }
        }
        if let Some(log) = stored {
            self.push(id, log, window_ms, entry);
            return;
        }
        // A minimum budget always leaves room for one log once the others are evicted; if it
        // did not, the page is added anyway rather than lose the hit.
        if self.make_room(now_ms, Need::LOG, None) && !self.logs.has_room_for_entry() {
            self.logs.grow();
        }
        let log = self.logs.create();
        self.insert(Slot {
            id,
            expires_ms: 0,
            state: State::Log(log),
        });
        self.push(id, log, window_ms, entry);
    }

    /// Appends an entry to a log with room for it, and moves the log's expiry.
    fn push(&mut self, id: Id, log: LogId, window_ms: u64, entry: LogEntry) {
        // Losing the entry would admit more than the limit: if there is no room even so, a page
        // is added past the budget.
        let stored = self.logs.push(log, entry) || (self.logs.grow() && self.logs.push(log, entry));
        if !stored {
            return;
        }
        let expires_ms = self.logs.expiry(log, window_ms);
        if let Some(slot) = self.find(id) {
            slot.expires_ms = expires_ms;
        }
    }

    fn refund(&mut self, id: Id, receipt: &Receipt, window_ms: u64) {
        let Ok(mut stored) = self.slots.find_entry(id.hash, |slot| slot.id == id) else {
            return;
        };
        let slot = stored.get_mut();
        let now_empty = match (receipt.algorithm, &mut slot.state) {
            (Algorithm::SlidingWindowCounter, State::Counter { prev, curr }) => {
                // The charge went to `curr` of window `token`; once that window has rolled into
                // `prev` it is still refundable there, and after that it no longer counts.
                let index = counter_index(slot.expires_ms, window_ms, receipt.token);
                let back = receipt.cost.saturating_sub(receipt.keep);
                if receipt.token == index {
                    *curr = curr.saturating_sub(back);
                } else if receipt.token.checked_add(1) == Some(index) {
                    *prev = prev.saturating_sub(back);
                }
                *prev == 0 && *curr == 0
            }
            (Algorithm::SlidingWindowLog, State::Log(log)) => {
                // What this receipt gives back. An entry may hold more than its own hit's cost
                // (it took in older ones when its log could not grow), so it shrinks by that
                // much and goes only when nothing is left; a partial release keeps it, smaller,
                // at its time, which only ever holds the units longer than needed.
                let release = receipt.cost - receipt.keep.min(receipt.cost);
                if self.logs.release(*log, receipt.token, release) > 0 {
                    slot.expires_ms = self.logs.expiry(*log, window_ms);
                }
                self.logs.is_empty(*log)
            }
            _ => false,
        };
        if now_empty {
            let (slot, _) = stored.remove();
            if let State::Log(log) = slot.state {
                self.logs.remove(log);
            }
        }
    }
}

/// What a log decides one hit by.
#[derive(Debug, Clone, Copy)]
struct LogHit {
    limit: u64,
    window_ms: u64,
    cost: Cost,
    counting: Counting,
    /// How far after the decision an admitted charge is stamped ([`lease::ahead_ms`]).
    ahead_ms: u64,
}

/// Returns the allocator's free pages to the operating system. glibc keeps freed small blocks in
/// its arenas (it trims only the top of the heap on its own); `malloc_trim` also releases the
/// whole free pages inside them. jemalloc (the `jemalloc` feature) returns memory on its own.
fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu", not(feature = "jemalloc")))]
    // SAFETY: malloc_trim only walks the allocator's own free lists; it takes no pointer and is
    // safe to call from any thread at any time.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(test)]
pub(super) mod tests;
