//! Where counters live. A backend charges hits against windows identified by opaque keys; it knows
//! nothing of descriptors, domains or YAML. Each hit is decided atomically on its own; the limiter
//! combines the verdicts and gives back (releases) what a rejected request took.

pub mod inspect;
pub mod lease;
pub mod local_cache;
pub mod memory;
pub mod observe;
pub mod per_second;
pub mod redis;
pub mod shard;

use std::future::Future;
use std::time::{Duration, Instant};

use futures_util::future::Either;

use crate::window::{Algorithm, Cost, Counting, Verdict};

pub use inspect::WindowState;
pub use local_cache::LocalCache;
pub use memory::MemoryBackend;
pub use per_second::PerSecond;
pub use redis::{ClusterBackend, RedisBackend};
pub use shard::{ShardKeys, Sharded};

/// One charge against one limiter's window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hit {
    /// The limiter's identity, unique per (domain, descriptor path, algorithm, window); built and
    /// escaped by the limiter. Backends add their own prefix, hash tag and suffixes.
    pub key: String,
    /// How the window is evaluated.
    pub algorithm: Algorithm,
    /// Units admitted per window.
    pub limit: u64,
    /// The window length in milliseconds (at least 1000).
    pub window_ms: u64,
    /// What the hit consumes.
    pub cost: Cost,
    /// Whether a refused hit is recorded too ([`Counting::All`]) or only an admitted one.
    pub counting: Counting,
    /// Into how many independent windows the limit's budget is split (1 = not sharded).
    pub shards: u16,
    /// 0: an ordinary hit. Above 0, for the limiter: answer this limit from leased slices of
    /// its quota, each good for this many milliseconds ([`lease::Leased`]). For a store: the
    /// hit reserves a slice that may be spent until this long after the decision, so a log
    /// records it as if made then (a counter's slice never outlives its fixed window).
    pub lease_ms: u64,
    /// Whether the charge may be given back ([`Backend::release`]) after it was decided: the
    /// request has other limits, any of which may refuse it, or the hit reserves a leased slice
    /// whose unspent units go back. A shared store keeps such a charge refundable for a bounded
    /// time only, and its refusals meanwhile say how long they stand even if it is given back
    /// ([`Outcome::stands_ms`]). `false`: the charge is final, nothing ever gives it back.
    pub tentative: bool,
    /// 0: the hit is decided on its own. Above 0: it is one of the limits of one descriptor
    /// (`rate_limits`), decided together: the hits of one call with the same `group` are
    /// adjacent, and are charged all or none. Each answers its own limit's verdict; when any of
    /// them is refused, none of the others is charged (their outcomes carry no receipt). A
    /// backend decides a group in one atomic step when [`Backend::joint`] says it can; the
    /// limiter passes only such groups, and decides the others hit by hit with refunds.
    pub group: u32,
    /// The store's keys of this hit share their cluster hash tag with the other limits of its
    /// descriptor: the tag leaves out the identity's last part (`@<algorithm><window>`), so one
    /// script call can decide the descriptor's limits together. Set for every limit declared in
    /// a `rate_limits` list, whatever the request, so the keys of a limit never move.
    pub descriptor_tag: bool,
    /// The hit is itself a slice reserved for a client that spends it elsewhere (an RLQS
    /// assignment, spent by Envoy): decorators that answer hits from slices of their own
    /// ([`lease::Leased`]) pass it to the store as it is, and the store stamps it `lease_ms`
    /// ahead (at most [`lease::MAX_SLICE_AHEAD_MS`]) as it stamps a leased slice.
    pub slice: bool,
}

/// The verdict on one hit and, when it was admitted and consumed something, how to give it back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// What the window said.
    pub verdict: Verdict,
    /// Present when the hit was admitted and consumed units; pass it to [`Backend::release`] to
    /// undo the charge. (A refused hit charged under [`Counting::All`] has none: nothing ever
    /// gives such a charge back.)
    pub receipt: Option<Receipt>,
    /// Whether the local over-limit cache answered, without asking the store: with a refusal
    /// it holds, or, for an admitted verdict, because it refused another hit of this hit's
    /// group, so nobody decided this one (nothing is charged; the verdict says only that this
    /// limit did not refuse).
    pub cached: bool,
    /// For a refusal: how long from the decision it stands whatever the charges still
    /// refundable in the store are given back, by this instance or any other (at most
    /// `verdict.reset_ms`; equal to it when nothing refundable is pending). What the local
    /// over-limit cache keeps the refusal for. 0 for an admitted hit.
    pub stands_ms: u64,
}

/// Proof of one admitted charge, enough for the backend that issued it to undo it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Receipt {
    /// The storage key the charge went to (for a sharded limit, the shard's key).
    pub key: String,
    /// The algorithm of the window charged.
    pub algorithm: Algorithm,
    /// The window length in milliseconds.
    pub window_ms: u64,
    /// Counter: the index of the fixed window charged (`now / window_ms`). Log: the entry's id.
    pub token: u64,
    /// Units consumed.
    pub cost: u64,
    /// What the limit has left once this charge is given back: the verdict's `remaining` plus
    /// the cost (exact, as the charge was admitted), scaled as the verdict's is by decorators
    /// such as sharding. What a status reports after its hit was released.
    pub released_remaining: u64,
    /// Units of the charge that stay charged when it is released: 0 gives all of it back. A
    /// lease settles its slice by keeping what was spent; a log's entry then also moves back to
    /// the time of the settlement, when nothing more of it can be spent.
    pub keep: u64,
    /// Issued by [`lease::Leased`] for a hit answered from a slice: `token` names the slice,
    /// and only that layer can give the charge back.
    pub leased: bool,
    /// For a tentative charge in a shared store: until when (the store's clock, ms since the
    /// epoch) it may be given back; the store refuses a later refund and the charge stands
    /// (fewer admissions, never more). 0: no deadline (a store in this process, where every
    /// refund goes through this instance's cache).
    pub refundable_until_ms: u64,
    /// Whether the units kept (`keep`) may themselves still be given back later: a settled
    /// slice that admitted hits of requests with other limits. Otherwise a release makes them
    /// final.
    pub keep_refundable: bool,
}

/// Why a backend could not decide.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BackendError {
    /// The backend did not answer within the deadline.
    #[error("backend did not answer within {0:?}; check the backend's load and --backend-timeout")]
    Timeout(Duration),
    /// The backend could not be reached or refused the connection.
    #[error("backend unavailable: {0}")]
    Unavailable(String),
    /// The backend answered with something tollgate cannot use.
    #[error("backend answered unexpectedly: {0}")]
    Protocol(String),
}

/// What a backend holds in this process's memory, for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryUsage {
    /// Bytes held (tables and log entries, as asked of the allocator).
    pub bytes: u64,
    /// The most bytes the backend will hold.
    pub budget: u64,
    /// Windows held, expired ones not yet swept included.
    pub keys: u64,
    /// Live windows dropped since start to stay within the budget.
    pub evictions: u64,
}

/// A backend whose every call has been failing: since when, and the latest error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SustainedFailure {
    /// When the first call of the current run of failures failed.
    pub since: Instant,
    /// The latest failure.
    pub error: String,
}

/// What [`Backend::acquire`] answers: one result per hit, in order.
pub type Results = Vec<Result<Outcome, BackendError>>;

/// What [`Backend::peek`] answers: one window's state per hit, in order.
pub type Peeked = Vec<Result<WindowState, BackendError>>;

/// What [`Backend::clear`] answers: one result per hit, in order.
pub type Cleared = Vec<Result<(), BackendError>>;

/// The answer of a backend that cannot read or clear its windows (a test double), per hit.
fn unsupported<T>(hits: &[Hit]) -> Vec<Result<T, BackendError>> {
    hits.iter()
        .map(|_| {
            Err(BackendError::Protocol(
                "this backend cannot read or clear its windows".into(),
            ))
        })
        .collect()
}

/// A store that decides hits against sliding windows.
pub trait Backend: Send + Sync + 'static {
    /// Charges each hit against its window and answers one result per hit, in order. Each hit is
    /// atomic on its own; hits of different limiters may go to different nodes concurrently.
    fn acquire(&self, hits: &[Hit]) -> impl Future<Output = Results> + Send;

    /// Whether this backend decides `group` (the hits of one [`Hit::group`]) in one atomic
    /// step: no other decision, by this process or another, sees some of its charges without
    /// the others. Decorators that split or answer such hits apart say no; the limiter then
    /// decides the group's hits one by one, tentatively, and gives back what a refusal leaves.
    fn joint(&self, group: &[Hit]) -> bool {
        let _ = group;
        false
    }

    /// Gives back the charges named by `receipts` (best effort: a window that has since moved on
    /// simply loses the refund).
    fn release(
        &self,
        receipts: &[Receipt],
    ) -> impl Future<Output = Result<(), BackendError>> + Send;

    /// Reads each hit's window as it stands, for an operator: nothing is charged, written or
    /// extended (no key is created, no expiry moved), so asking never changes an answer. Only
    /// the hit's identity (key, algorithm, window, `descriptor_tag`), `limit` and `shards` are
    /// read. A sharded hit answers the sum over its shards; a leased one counts the slices
    /// instances hold as used, since the store holds them charged.
    fn peek(&self, hits: &[Hit]) -> impl Future<Output = Peeked> + Send {
        std::future::ready(unsupported(hits))
    }

    /// Forgets each hit's window, for an operator's reset: every shard of it, the refundable
    /// tally and the slices the store holds charged. Safe to repeat; a refund or settlement that
    /// arrives afterwards finds nothing and gives nothing back. Reads what [`Backend::peek`] reads.
    fn clear(&self, hits: &[Hit]) -> impl Future<Output = Cleared> + Send {
        std::future::ready(unsupported(hits))
    }

    /// Checks that the backend answers, for health reporting.
    fn ping(&self) -> impl Future<Output = Result<(), BackendError>> + Send;

    /// Periodic housekeeping, run by the server about once a second: the memory backend sweeps
    /// its expired windows, so memory comes back while no traffic arrives. Decorators pass it on.
    fn maintain(&self) -> impl Future<Output = ()> + Send {
        std::future::ready(())
    }

    /// What the backend holds in process memory, if it keeps windows there. Decorators pass it
    /// on.
    fn memory_usage(&self) -> Option<MemoryUsage> {
        None
    }

    /// Since when every call has failed, while the latest call failed; `None` while calls
    /// succeed. Decorators pass it on.
    fn failing_since(&self) -> Option<SustainedFailure> {
        None
    }
}

/// The backend `tollgate serve` decides with: the store, with the per-second store beside it if
/// any; the local over-limit cache below sharding (so its entries are per shard window); leases
/// above it (so a slice comes from one shard).
pub type Stack = lease::Leased<Sharded<LocalCache<PerSecond<AnyBackend>>>>;

/// How the [`Stack`]'s local over-limit cache is made.
pub struct CacheOptions {
    /// What times its entries: the clock the store decides by when it is in this process, a
    /// monotonic one when the store reads its own.
    pub clock: std::sync::Arc<dyn crate::clock::Clock>,
    /// Its byte budget (0: off).
    pub bytes: u64,
    /// Whether it answers hits under `counting: all` ([`LocalCache::answering_counted`]).
    pub answer_counted: bool,
}

/// Builds the [`Stack`] over `main` (and `per_second`, the store of per-second limits if they
/// have their own), with the local over-limit cache `cache` describes. Leases are on only when
/// the store is `shared` by instances: in one process every hit is already local, and leases
/// would only add work.
pub fn stack(
    main: AnyBackend,
    per_second: Option<AnyBackend>,
    cache: CacheOptions,
    shared: bool,
) -> Stack {
    let cached = LocalCache::new(PerSecond::new(main, per_second), cache.clock, cache.bytes)
        .answering_counted(cache.answer_counted);
    lease::Leased::new(
        Sharded::new(cached),
        std::sync::Arc::new(crate::clock::MonotonicClock::new()),
        shared,
    )
}

/// Which store counters live in, as chosen at start-up: the settings resolve it, `main` builds
/// the [`AnyBackend`] it names, and the runtime is scheduled for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Store {
    /// In this process.
    Memory,
    /// A Redis deployment.
    Redis(Box<redis::connect::Target>),
}

/// The backend chosen at startup (`--backend`), dispatching to the concrete store.
#[derive(Debug)]
pub enum AnyBackend {
    /// Counters in this process.
    Memory(MemoryBackend),
    /// Windows in one Redis server.
    Redis(RedisBackend),
    /// Windows in a Redis Cluster.
    Cluster(ClusterBackend),
}

// The Redis futures are boxed: a future of an enum is as large as its largest arm, and the Redis
// arms hold a connection checkout and a pipeline (about 2 KB), which every decorator above and
// every memory decision would otherwise carry and move at each await. A Redis call pays one
// allocation beside its network round trip; a memory decision pays nothing, and `acquire`
// answers the memory backend's own future rather than one awaiting it.
impl Backend for AnyBackend {
    fn acquire(&self, hits: &[Hit]) -> impl Future<Output = Results> + Send {
        match self {
            AnyBackend::Memory(b) => Either::Left(b.acquire(hits)),
            AnyBackend::Redis(b) => Either::Right(Either::Left(Box::pin(b.acquire(hits)))),
            AnyBackend::Cluster(b) => Either::Right(Either::Right(Box::pin(b.acquire(hits)))),
        }
    }

    async fn release(&self, receipts: &[Receipt]) -> Result<(), BackendError> {
        match self {
            AnyBackend::Memory(b) => b.release(receipts).await,
            AnyBackend::Redis(b) => Box::pin(b.release(receipts)).await,
            AnyBackend::Cluster(b) => Box::pin(b.release(receipts)).await,
        }
    }

    async fn peek(&self, hits: &[Hit]) -> Peeked {
        match self {
            AnyBackend::Memory(b) => b.peek(hits).await,
            AnyBackend::Redis(b) => Box::pin(b.peek(hits)).await,
            AnyBackend::Cluster(b) => Box::pin(b.peek(hits)).await,
        }
    }

    async fn clear(&self, hits: &[Hit]) -> Cleared {
        match self {
            AnyBackend::Memory(b) => b.clear(hits).await,
            AnyBackend::Redis(b) => Box::pin(b.clear(hits)).await,
            AnyBackend::Cluster(b) => Box::pin(b.clear(hits)).await,
        }
    }

    async fn ping(&self) -> Result<(), BackendError> {
        match self {
            AnyBackend::Memory(b) => b.ping().await,
            AnyBackend::Redis(b) => b.ping().await,
            AnyBackend::Cluster(b) => b.ping().await,
        }
    }

    async fn maintain(&self) {
        match self {
            AnyBackend::Memory(b) => b.maintain().await,
            AnyBackend::Redis(b) => b.maintain().await,
            AnyBackend::Cluster(b) => b.maintain().await,
        }
    }

    fn memory_usage(&self) -> Option<MemoryUsage> {
        match self {
            AnyBackend::Memory(b) => b.memory_usage(),
            AnyBackend::Redis(b) => b.memory_usage(),
            AnyBackend::Cluster(b) => b.memory_usage(),
        }
    }

    fn failing_since(&self) -> Option<SustainedFailure> {
        match self {
            AnyBackend::Memory(b) => b.failing_since(),
            AnyBackend::Redis(b) => b.failing_since(),
            AnyBackend::Cluster(b) => b.failing_since(),
        }
    }

    fn joint(&self, group: &[Hit]) -> bool {
        match self {
            AnyBackend::Memory(b) => b.joint(group),
            AnyBackend::Redis(b) => b.joint(group),
            AnyBackend::Cluster(b) => b.joint(group),
        }
    }
}

impl ShardKeys for AnyBackend {
    fn shard_key(&self, key: &str, shard: u16, shards: u16) -> String {
        match self {
            AnyBackend::Memory(b) => b.shard_key(key, shard, shards),
            AnyBackend::Redis(b) => b.shard_key(key, shard, shards),
            AnyBackend::Cluster(b) => b.shard_key(key, shard, shards),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::mem::size_of_val;
    use std::sync::Arc;

    use super::*;
    use crate::clock::SystemClock;

    // Every decision carries the stack's future and moves it at each await. A decorator with
    // nothing to do for a batch answers its inner backend's own future, and keeps the work of a
    // batch it does act on in a box, so a layer adds no more than its variant's tag: the stack is
    // only as large as the cache's future, the one layer that keeps state across the call.
    #[test]
    fn pass_through_layers_add_only_a_tag_to_the_future() {
        const TAGS: usize = 8;
        let hits: Vec<Hit> = Vec::new();
        let memory = || AnyBackend::Memory(MemoryBackend::new());
        let any = memory();
        let per_second = PerSecond::new(memory(), None);
        let cached = LocalCache::new(
            PerSecond::new(memory(), None),
            Arc::new(SystemClock),
            1 << 20,
        );
        let whole = stack(
            memory(),
            None,
            CacheOptions {
                clock: Arc::new(SystemClock),
                bytes: 1 << 20,
                answer_counted: true,
            },
            true,
        );
        let memory_backend = MemoryBackend::new();

        let memory_future = size_of_val(&memory_backend.acquire(&hits));
        let any_future = size_of_val(&any.acquire(&hits));
        let per_second_future = size_of_val(&per_second.acquire(&hits));
        let cached_future = size_of_val(&cached.acquire(&hits));
        let whole_future = size_of_val(&whole.acquire(&hits));
        assert!(
            any_future <= memory_future + TAGS,
            "{any_future} > {memory_future}"
        );
        assert!(
            per_second_future <= any_future + TAGS,
            "{per_second_future} > {any_future}"
        );
        assert!(
            whole_future <= cached_future + 2 * TAGS,
            "{whole_future} > {cached_future}"
        );
    }
}
