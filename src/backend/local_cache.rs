//! The local over-limit cache: a refused hit tells this instance the earliest instant the same hit
//! could be admitted, and until then the same window answers the same (or a larger) cost
//! OVER_LIMIT from process memory, with no backend call. Under attack (one key far over its
//! limit) almost every decision is then a lookup.
//!
//! It never refuses a hit the backend would admit, across any number of instances, but after
//! the store lost data. Why (the full argument is in docs/local-cache.md):
//! - Without other traffic, a window's usage only goes down as time passes, so admission is
//!   monotone in time: the backend's `reset_ms` of a refusal is the earliest instant `T` the same
//!   hit fits, and every instant before `T` refuses it. Other traffic (this or another instance)
//!   only adds usage, so it only moves `T` later.
//! - Refunds lower usage. A shared store tallies the charges that may still be given back (a
//!   request's tentative charges, leased slices, each only within its refund horizon) and says
//!   how long a refusal stands with all of them given back ([`Outcome::stands_ms`]): the entry
//!   lasts that long, so no refund by another instance can make room behind it.
//! - Admission is monotone in cost too, so a cost at least the refused one is refused until `T`.
//! - The entry's instant is the clock reading taken *before* the backend call plus `stands_ms`:
//!   the backend decided at or after that reading, so the entry never outlives `T`.
//! - An entry is keyed by the storage key and everything else that decides the answer (limit,
//!   window, algorithm): a reload that changes the limit misses the entry.
//! - A release by this instance drops the entries of the windows it refunds, and a refusal whose
//!   backend call overlapped a release of its window is not cached.
//!
//! The store losing its data (a Redis restart or flush, the memory backend evicting a live window
//! under its budget) is the one case it answers from state the store no longer holds, until the
//! entry's instant at most.
//!
//! Under [`Counting::All`](crate::window::Counting::All) the backend would have charged every
//! refused hit: such hits are answered here only when [`LocalCache::answering_counted`] says so
//! (as envoyproxy/ratelimit's local cache does, skipping those charges, which can only make the
//! backend admit earlier, never refuse more); otherwise they always go to the backend.
//!
//! Place it below sharding ([`super::Sharded`] over this): its entries are per shard window, so
//! a sharded limit is answered locally only when each shard it tries is known full.
//!
//! Memory is bounded: the entries' table and keys never exceed the byte budget. When full,
//! expired entries go first, then the eighth that expires soonest; losing an entry only loses
//! the saving, never correctness.
//!
//! While it holds no entry at all (nothing refused lately, the usual state), the cache is not
//! searched: hits go straight to the backend after one atomic read, and only its refusals are
//! looked at.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use futures_util::future::Either;
use hashbrown::HashTable;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use smallvec::SmallVec;

use crate::backend::{
    Backend, BackendError, Cleared, Hit, MemoryUsage, Outcome, Peeked, Receipt, Results, ShardKeys,
    SustainedFailure,
};
use crate::clock::Clock;
use crate::window::{self, Algorithm, Cost, Counting, Verdict};

/// The cache's budget when it is on and no budget is given.
pub const DEFAULT_BYTES: u64 = 8 << 20;

/// Independent parts of the table, each behind its own lock, so concurrent decisions on
/// different windows rarely wait for each other.
const STRIPES: usize = 16;

/// Which bits of a key's hash choose its stripe. A stripe's table finds buckets with the low bits
/// of the same hash and tags slots with its top seven: bits in between keep the keys of one
/// stripe spread over all of its buckets and tags.
const STRIPE_HASH_SHIFT: u32 = 40;

/// What the cache knows about one refused window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    algorithm: Algorithm,
    limit: u64,
    window_ms: u64,
    /// The smallest cost refused (a larger one cannot fit where it did not).
    cost: u64,
    /// Until when (the cache clock's milliseconds) the refusal stands certainly: the backend's
    /// decision time plus its [`Outcome::stands_ms`]. Answered until then.
    until_ms: u64,
    /// The earliest instant the refused cost could be admitted if nothing is given back (the
    /// decision plus its `reset_ms`): what an answer reports as its reset.
    reset_at_ms: u64,
    /// What the refusal reported as left (what a smaller hit could use then).
    remaining: u64,
}

impl Entry {
    /// Whether this entry answers `hit` (of `units`) at `now_ms`.
    fn answers(&self, hit: &Hit, units: u64, now_ms: u64) -> bool {
        now_ms < self.until_ms
            && units >= self.cost
            && self.algorithm == hit.algorithm
            && self.limit == hit.limit
            && self.window_ms == hit.window_ms
    }
}

/// One cached window: its key and what is known of it.
#[derive(Debug)]
struct Slot {
    key: Box<str>,
    entry: Entry,
}

/// One lock's share of the table. Slots are found by the hash [`LocalCache::hash`] gives their
/// key: a hit hashes its key once, for the stripe and the slot both.
#[derive(Debug)]
struct Stripe {
    entries: HashTable<Slot>,
    /// Bytes of the keys held (the table's own allocation is asked of the table).
    key_bytes: usize,
    /// The most entries the table holds (0 until it is allocated).
    max_entries: usize,
}

impl Stripe {
    fn bytes(&self) -> usize {
        self.entries.allocation_size() + self.key_bytes
    }

    fn find(&self, hash: u64, key: &str) -> Option<&Entry> {
        self.entries
            .find(hash, |slot| *slot.key == *key)
            .map(|slot| &slot.entry)
    }

    fn find_mut(&mut self, hash: u64, key: &str) -> Option<&mut Entry> {
        self.entries
            .find_mut(hash, |slot| *slot.key == *key)
            .map(|slot| &mut slot.entry)
    }

    fn remove(&mut self, hash: u64, key: &str) -> bool {
        match self.entries.find_entry(hash, |slot| *slot.key == *key) {
            Ok(found) => {
                found.remove();
                self.key_bytes -= key.len();
                true
            }
            Err(_) => false,
        }
    }

    /// Drops every entry whose instant has passed; answers how many.
    fn sweep(&mut self, now_ms: u64) -> usize {
        let before = self.entries.len();
        let mut freed = 0;
        self.entries.retain(|slot| {
            let keep = slot.entry.until_ms > now_ms;
            if !keep {
                freed += slot.key.len();
            }
            keep
        });
        self.key_bytes -= freed;
        before - self.entries.len()
    }

    /// Drops the eighth of the entries (at least one) that expire soonest; answers how many.
    fn evict_soonest(&mut self) -> usize {
        let mut instants: Vec<u64> = self.entries.iter().map(|s| s.entry.until_ms).collect();
        if instants.is_empty() {
            return 0;
        }
        let nth = instants.len() / 8;
        let (_, cut, _) = instants.select_nth_unstable(nth);
        let cut = *cut;
        let before = self.entries.len();
        let mut freed = 0;
        self.entries.retain(|slot| {
            let keep = slot.entry.until_ms > cut;
            if !keep {
                freed += slot.key.len();
            }
            keep
        });
        self.key_bytes -= freed;
        before - self.entries.len()
    }

    /// Whether one more entry with a key of `key_len` bytes fits `budget`, the table as it is.
    fn has_room(&self, key_len: usize, budget: usize) -> bool {
        self.entries.len() < self.max_entries && self.bytes() + key_len <= budget
    }

    /// Allocates the table once, at the first entry: as many buckets as half of `budget` holds
    /// (a power of two), of which at most half are ever used. A table at most half full never
    /// grows, whatever its deleted slots, so its allocation stays what was counted.
    fn allocate(&mut self, budget: usize, hasher: &RandomState) {
        if self.entries.capacity() > 0 || self.max_entries > 0 {
            return;
        }
        let mut buckets = 1usize << (usize::BITS - 1);
        while buckets > 1 && buckets.saturating_mul(SLOT_BYTES).saturating_add(64) > budget / 2 {
            buckets /= 2;
        }
        if buckets < 8 {
            return;
        }
        self.entries
            .reserve(buckets / 8 * 7, |slot| key_hash(hasher, &slot.key));
        if self.entries.allocation_size() > budget / 2 {
            self.entries = HashTable::new();
            return;
        }
        self.max_entries = buckets / 2;
    }
}

/// The bytes one bucket of the table takes: the key's box, the entry, one control byte.
const SLOT_BYTES: usize = std::mem::size_of::<Slot>() + 1;

/// The process-wide metrics of the cache (one cache per process in practice; tests make more
/// and share these).
#[derive(Debug, Default)]
struct Metrics {
    answers: Counter,
    stored: Counter,
    evictions: Counter,
    entries: Gauge,
    bytes: Gauge,
    /// Hits that came through the cache while it was on, answered here or not.
    lookups: Counter,
    /// Entries dropped because their instant had passed.
    expired: Counter,
    /// Entries replaced by a later refusal of the same window.
    overwrites: Counter,
}

fn metrics() -> &'static Metrics {
    static METRICS: OnceLock<Metrics> = OnceLock::new();
    METRICS.get_or_init(Metrics::default)
}

/// Adds the cache's metrics to `registry` (whose prefix the names get).
pub fn register(registry: &mut Registry) {
    let m = metrics();
    registry.register(
        "local_cache_answers",
        "Hits refused by the local over-limit cache without a backend call",
        m.answers.clone(),
    );
    registry.register(
        "local_cache_stored",
        "Backend refusals stored in the local over-limit cache",
        m.stored.clone(),
    );
    registry.register(
        "local_cache_evictions",
        "Live local over-limit cache entries dropped to stay within its byte budget",
        m.evictions.clone(),
    );
    registry.register(
        "local_cache_entries",
        "Entries held by the local over-limit cache, expired ones not yet swept included",
        m.entries.clone(),
    );
    registry.register(
        "local_cache_bytes",
        "Bytes held by the local over-limit cache (its tables and keys)",
        m.bytes.clone(),
    );
}

/// The cache's counts under envoyproxy/ratelimit's names for its own local cache, the gauges it
/// reports under `ratelimit.localcache.` while that cache is on, so that dashboards reading them
/// keep working:
/// - `hitCount`: hits answered here; `lookupCount`: hits that came through the cache;
///   `missCount`: the difference (asked of the backend);
/// - `entryCount`: entries held; `evacuateCount`: live entries dropped to stay in the budget;
///   `expiredCount`: entries dropped once their instant passed; `overwriteCount`: entries
///   replaced by a later refusal of the same window.
///
/// The reference's `averageAccessTime` (the mean Unix time its entries were last read) has no
/// counterpart here: entries are not stamped on reading, and no number is made up for it.
pub fn reference_gauges() -> [(&'static str, u64); 7] {
    let m = metrics();
    let (hits, lookups) = (m.answers.get(), m.lookups.get());
    [
        ("evacuateCount", m.evictions.get()),
        ("expiredCount", m.expired.get()),
        ("entryCount", u64::try_from(m.entries.get()).unwrap_or(0)),
        ("hitCount", hits),
        ("missCount", lookups.saturating_sub(hits)),
        ("lookupCount", lookups.max(hits)),
        ("overwriteCount", m.overwrites.get()),
    ]
}

/// A backend that answers known refusals from memory until the backend could admit them.
pub struct LocalCache<B> {
    inner: B,
    clock: Arc<dyn Clock>,
    /// Bytes each stripe may hold.
    stripe_budget: usize,
    stripes: Box<[Mutex<Stripe>]>,
    hasher: RandomState,
    /// Entries held over all stripes, moved under the stripe's lock with every change. While it
    /// reads 0 there is nothing to look up, and hits go straight to the backend.
    held: AtomicUsize,
    /// Per stripe, bumped (under the stripe's lock) by every release of one of its windows,
    /// before and after the refund reaches the backend: a refusal decided while a refund of its
    /// stripe was under way is not cached. Read without the lock before a backend call, all at
    /// once, so that no hit needs hashing to find its stripe first.
    releases: [AtomicU64; STRIPES],
    /// Hits answered here, by this instance (for tests and benchmarks).
    answered: AtomicU64,
    /// Whether hits under [`Counting::All`] are answered here too, skipping the charge the
    /// backend would have made of each refusal (see [`LocalCache::answering_counted`]).
    answer_counted: bool,
}

impl<B: std::fmt::Debug> std::fmt::Debug for LocalCache<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalCache")
            .field("inner", &self.inner)
            .field("budget", &(self.stripe_budget * STRIPES))
            .finish_non_exhaustive()
    }
}

impl<B> LocalCache<B> {
    /// Caches `inner`'s refusals in at most `bytes` bytes (0: off, every hit goes to `inner`),
    /// timed by `clock`. Give it the clock `inner` decides by when there is one in this process
    /// (the memory backend's, or the one a test tells Redis); for a backend that reads a clock of
    /// its own (Redis reads `TIME`), a monotonic clock, since only durations are carried over.
    pub fn new(inner: B, clock: Arc<dyn Clock>, bytes: u64) -> Self {
        LocalCache {
            inner,
            clock,
            stripe_budget: usize::try_from(bytes).unwrap_or(usize::MAX) / STRIPES,
            stripes: (0..STRIPES)
                .map(|_| {
                    Mutex::new(Stripe {
                        entries: HashTable::new(),
                        key_bytes: 0,
                        max_entries: 0,
                    })
                })
                .collect(),
            hasher: RandomState::new(),
            held: AtomicUsize::new(0),
            releases: std::array::from_fn(|_| AtomicU64::new(0)),
            answered: AtomicU64::new(0),
            answer_counted: true,
        }
    }

    /// Whether hits under [`Counting::All`] are answered from the cache (`true`, the default of
    /// [`LocalCache::new`]: as envoyproxy/ratelimit's local cache does, a refusal answered here
    /// is not charged, where the backend would have charged it), or always asked of the backend,
    /// which charges them (`false`: what is charged is what it would be without the cache).
    pub fn answering_counted(mut self, answer: bool) -> Self {
        self.answer_counted = answer;
        self
    }

    /// The wrapped backend.
    pub fn inner(&self) -> &B {
        &self.inner
    }

    /// Hits this cache has refused without asking the backend.
    pub fn answered(&self) -> u64 {
        self.answered.load(Ordering::Relaxed)
    }

    /// Entries and bytes held now.
    pub fn held(&self) -> (usize, usize) {
        let mut entries = 0;
        let mut bytes = 0;
        for stripe in self.stripes.iter() {
            let stripe = lock(stripe);
            entries += stripe.entries.len();
            bytes += stripe.bytes();
        }
        (entries, bytes)
    }

    /// The keyed hash of `key`, which finds both its stripe and its slot. Keys come from
    /// clients: SipHash with random keys keeps them from choosing keys that collide.
    fn hash(&self, key: &str) -> u64 {
        key_hash(&self.hasher, key)
    }

    /// The stripe a key of `hash` belongs to.
    fn stripe_index(hash: u64) -> usize {
        // The remainder is below STRIPES, so the narrowing cannot lose anything.
        ((hash >> STRIPE_HASH_SHIFT) % STRIPES as u64) as usize
    }

    fn stripe(&self, index: usize) -> MutexGuard<'_, Stripe> {
        lock(&self.stripes[index])
    }

    /// Every stripe's release counter, read before a backend call, for [`LocalCache::store`] to
    /// tell whether a release of the refused window's stripe came before the answer. A counter
    /// read stale only makes the store see a change and skip: never the other way.
    fn releases(&self) -> Releases {
        Releases(std::array::from_fn(|index| {
            self.releases[index].load(Ordering::Relaxed)
        }))
    }

    /// The cached refusal of `hit` at `now_ms`, if there is one.
    fn lookup(&self, hit: &Hit, now_ms: u64) -> Looked {
        let Cost::Consume(units) = window::normalize_cost(hit.cost) else {
            // Checks consume nothing and are refused only above the limit: always asked, and
            // never stored.
            return Looked::Ask;
        };
        if hit.counting == Counting::All && !self.answer_counted {
            return Looked::Ask;
        }
        let hash = self.hash(&hit.key);
        let stripe = self.stripe(Self::stripe_index(hash));
        let Some(entry) = stripe.find(hash, &hit.key) else {
            return Looked::Ask;
        };
        if !entry.answers(hit, units, now_ms) {
            return Looked::Ask;
        }
        // A cost above the limit never fits: the backend answers it with the full window
        // whenever it is asked, so the cache does too rather than counting down to its entry's
        // instant.
        let reset_ms = if units > hit.limit {
            hit.window_ms
        } else {
            entry.reset_at_ms.saturating_sub(now_ms).max(1)
        };
        Looked::Cached(Outcome {
            verdict: Verdict {
                admitted: false,
                remaining: entry.remaining,
                reset_ms,
            },
            receipt: None,
            cached: true,
            stands_ms: (entry.until_ms - now_ms).min(reset_ms),
        })
    }

    /// Stores the backend's refusal of `hit`, decided no earlier than `before_ms`, unless a
    /// release of its stripe happened since `since` was read. It is kept for as long as it
    /// stands certainly ([`Outcome::stands_ms`]), which other instances' refunds cannot cut.
    fn store(&self, hit: &Hit, outcome: &Outcome, before_ms: u64, since: &Releases) {
        let Cost::Consume(units) = window::normalize_cost(hit.cost) else {
            return;
        };
        if hit.counting == Counting::All && !self.answer_counted {
            return;
        }
        let verdict = &outcome.verdict;
        let until_ms = before_ms.saturating_add(outcome.stands_ms.min(verdict.reset_ms));
        if until_ms <= self.clock.now_ms() {
            return;
        }
        let entry = Entry {
            algorithm: hit.algorithm,
            limit: hit.limit,
            window_ms: hit.window_ms,
            cost: units,
            until_ms,
            reset_at_ms: before_ms.saturating_add(verdict.reset_ms),
            remaining: verdict.remaining,
        };
        let m = metrics();
        let hash = self.hash(&hit.key);
        let index = Self::stripe_index(hash);
        let mut stripe = self.stripe(index);
        // Under the stripe's lock, which every bump of its counter holds too.
        if self.releases[index].load(Ordering::Relaxed) != since.0[index] {
            return;
        }
        if let Some(held) = stripe.find_mut(hash, &hit.key) {
            let dominated = held.algorithm == entry.algorithm
                && held.limit == entry.limit
                && held.window_ms == entry.window_ms
                && held.cost <= entry.cost
                && held.until_ms >= entry.until_ms;
            if !dominated {
                *held = entry;
                m.stored.inc();
                m.overwrites.inc();
            }
            return;
        }
        let key: Box<str> = hit.key.as_str().into();
        let (bytes_before, len_before) = (stripe.bytes(), stripe.entries.len());
        let mut swept = false;
        let mut evicted = 0;
        stripe.allocate(self.stripe_budget, &self.hasher);
        let fits = loop {
            if stripe.has_room(key.len(), self.stripe_budget) {
                break true;
            }
            if !swept {
                swept = true;
                let expired = stripe.sweep(self.clock.now_ms());
                if expired > 0 {
                    m.expired.inc_by(expired as u64);
                    continue;
                }
            }
            match stripe.evict_soonest() {
                // Even an empty stripe cannot hold this key: not cached.
                0 => break false,
                dropped => evicted += dropped,
            }
        };
        if fits {
            stripe.key_bytes += key.len();
            stripe
                .entries
                .insert_unique(hash, Slot { key, entry }, |slot| {
                    key_hash(&self.hasher, &slot.key)
                });
            m.stored.inc();
        }
        self.account(&stripe, bytes_before, len_before);
        drop(stripe);
        m.evictions.inc_by(evicted as u64);
    }

    /// Stores the refusals among `answers`, each the answer to the hit `asked` gives in the same
    /// place, with the release counters read before the call.
    fn store_refusals<'h>(
        &self,
        asked: impl Iterator<Item = &'h Hit>,
        answers: &[Result<Outcome, BackendError>],
        before_ms: u64,
        since: &Releases,
    ) {
        for (hit, result) in asked.zip(answers) {
            if let Ok(outcome) = result
                && !outcome.verdict.admitted
            {
                self.store(hit, outcome, before_ms, since);
            }
        }
    }

    /// Moves the entry count and the process-wide gauges by what `stripe` changed since it held
    /// `bytes` in `len` entries. Called with the stripe still locked, so `held` never reads 0
    /// while an entry is in place.
    fn account(&self, stripe: &Stripe, bytes: usize, len: usize) {
        let m = metrics();
        let now = stripe.entries.len();
        if now > len {
            self.held.fetch_add(now - len, Ordering::Relaxed);
        } else if now < len {
            self.held.fetch_sub(len - now, Ordering::Relaxed);
        }
        m.bytes.inc_by(stripe.bytes() as i64 - bytes as i64);
        m.entries.inc_by(now as i64 - len as i64);
    }
}

/// The keyed hash of a storage key: its bytes alone (the whole input, so nothing has to mark
/// where it ends), one call into the hasher fewer than hashing a `str`.
fn key_hash(hasher: &RandomState, key: &str) -> u64 {
    let mut state = hasher.build_hasher();
    state.write(key.as_bytes());
    state.finish()
}

/// What the cache knows of one hit before the backend is asked.
enum Looked {
    /// A live refusal, answered here.
    Cached(Outcome),
    /// Asked of the backend.
    Ask,
}

/// A group (the limits of one descriptor, [`Hit::group`]) one of whose hits has a cached refusal
/// is refused as a whole without asking the store: its other hits are answered as nobody
/// decided them, admitted with nothing charged and marked `cached` (an admitted cached outcome
/// means exactly this; the cache itself keeps only refusals).
fn unask_refused_groups(hits: &[Hit], looked: &mut [Looked]) {
    let refused_groups: SmallVec<[u32; 4]> = hits
        .iter()
        .zip(looked.iter())
        .filter(|(hit, looked)| hit.group != 0 && matches!(looked, Looked::Cached(_)))
        .map(|(hit, _)| hit.group)
        .collect();
    if refused_groups.is_empty() {
        return;
    }
    for (hit, looked) in hits.iter().zip(looked.iter_mut()) {
        if matches!(looked, Looked::Ask) && refused_groups.contains(&hit.group) {
            *looked = Looked::Cached(Outcome {
                verdict: Verdict {
                    admitted: true,
                    remaining: hit.limit,
                    reset_ms: 0,
                },
                receipt: None,
                cached: true,
                stands_ms: 0,
            });
        }
    }
}

/// Every stripe's release counter as read before a backend call.
struct Releases([u64; STRIPES]);

fn lock(stripe: &Mutex<Stripe>) -> MutexGuard<'_, Stripe> {
    stripe
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl<B: Backend> LocalCache<B> {
    /// Hits with a live cached refusal are answered here; the rest go to the inner backend in one
    /// call, and its refusals are remembered.
    async fn acquire_cached(&self, hits: &[Hit]) -> Results {
        // The backend decides at or after this reading, so a refusal it answers holds at least
        // from here: stored from an earlier instant, an entry can only end sooner than it must.
        let now_ms = self.clock.now_ms();
        let releases = self.releases();
        metrics().lookups.inc_by(hits.len() as u64);
        if self.held.load(Ordering::Relaxed) == 0 {
            // Nothing to answer from: a hit stored meanwhile by another call only means this one
            // asks the backend, which is never wrong.
            let answers = self.inner.acquire(hits).await;
            self.store_refusals(hits.iter(), &answers, now_ms, &releases);
            return answers;
        }
        let mut looked: Vec<Looked> = hits.iter().map(|hit| self.lookup(hit, now_ms)).collect();
        let refused_here = looked
            .iter()
            .filter(|looked| matches!(looked, Looked::Cached(_)))
            .count();
        if refused_here > 0 {
            unask_refused_groups(hits, &mut looked);
        }
        let local = looked
            .iter()
            .filter(|looked| matches!(looked, Looked::Cached(_)))
            .count();
        let answers = if local == 0 {
            self.inner.acquire(hits).await
        } else {
            self.answered
                .fetch_add(refused_here as u64, Ordering::Relaxed);
            metrics().answers.inc_by(refused_here as u64);
            let asked: Vec<Hit> = hits
                .iter()
                .zip(&looked)
                .filter(|(_, looked)| matches!(looked, Looked::Ask))
                .map(|(hit, _)| hit.clone())
                .collect();
            if asked.is_empty() {
                Vec::new()
            } else {
                self.inner.acquire(&asked).await
            }
        };
        let asked = hits
            .iter()
            .zip(&looked)
            .filter_map(|(hit, looked)| match looked {
                Looked::Ask => Some(hit),
                Looked::Cached(_) => None,
            });
        self.store_refusals(asked, &answers, now_ms, &releases);
        if local == 0 {
            return answers;
        }
        let mut answers = answers.into_iter();
        looked
            .into_iter()
            .map(|looked| match looked {
                Looked::Cached(outcome) => Ok(outcome),
                Looked::Ask => answers.next().unwrap_or_else(|| {
                    Err(BackendError::Protocol(
                        "backend answered fewer hits than it was asked".into(),
                    ))
                }),
            })
            .collect()
    }
}

impl<B: Backend> Backend for LocalCache<B> {
    /// With the cache off, the inner backend's own future, adding nothing to what every layer
    /// above carries.
    fn acquire(&self, hits: &[Hit]) -> impl Future<Output = Results> + Send {
        if self.stripe_budget == 0 {
            Either::Left(self.inner.acquire(hits))
        } else {
            Either::Right(self.acquire_cached(hits))
        }
    }

    /// Drops the entries of the refunded windows, before the refund and again once it is in the
    /// backend, so that no refusal decided meanwhile outlives it here.
    async fn release(&self, receipts: &[Receipt]) -> Result<(), BackendError> {
        if self.stripe_budget == 0 {
            return self.inner.release(receipts).await;
        }
        self.forget(receipts);
        let released = self.inner.release(receipts).await;
        self.forget(receipts);
        released
    }

    fn joint(&self, group: &[Hit]) -> bool {
        self.inner.joint(group)
    }

    /// The store's word, never the cache's: a cached refusal says nothing of the usage.
    fn peek(&self, hits: &[Hit]) -> impl Future<Output = Peeked> + Send {
        self.inner.peek(hits)
    }

    /// Drops the cleared windows' refusals, before the clear and again once it is done, as a
    /// release does, so that this instance admits again at once.
    async fn clear(&self, hits: &[Hit]) -> Cleared {
        if self.stripe_budget == 0 {
            return self.inner.clear(hits).await;
        }
        self.forget_keys(hits.iter().map(|hit| hit.key.as_str()));
        let cleared = self.inner.clear(hits).await;
        self.forget_keys(hits.iter().map(|hit| hit.key.as_str()));
        cleared
    }

    async fn ping(&self) -> Result<(), BackendError> {
        self.inner.ping().await
    }

    /// Sweeps expired entries, then passes on.
    async fn maintain(&self) {
        let now_ms = self.clock.now_ms();
        for stripe in self.stripes.iter() {
            let mut stripe = lock(stripe);
            let (bytes, len) = (stripe.bytes(), stripe.entries.len());
            let expired = stripe.sweep(now_ms);
            self.account(&stripe, bytes, len);
            drop(stripe);
            metrics().expired.inc_by(expired as u64);
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

impl<B> LocalCache<B> {
    fn forget(&self, receipts: &[Receipt]) {
        self.forget_keys(receipts.iter().map(|receipt| receipt.key.as_str()));
    }

    /// Drops the entries of the windows `keys` name, and marks their stripes released so that
    /// no refusal decided meanwhile is stored.
    fn forget_keys<'k>(&self, keys: impl Iterator<Item = &'k str>) {
        for key in keys {
            let hash = self.hash(key);
            let index = Self::stripe_index(hash);
            let mut stripe = self.stripe(index);
            self.releases[index].fetch_add(1, Ordering::Relaxed);
            let (bytes, len) = (stripe.bytes(), stripe.entries.len());
            if stripe.remove(hash, key) {
                self.account(&stripe, bytes, len);
            }
        }
    }
}

impl<B: ShardKeys> ShardKeys for LocalCache<B> {
    fn shard_key(&self, key: &str, shard: u16, shards: u16) -> String {
        self.inner.shard_key(key, shard, shards)
    }
}

#[cfg(test)]
mod tests;
