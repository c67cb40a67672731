//! Backend stacks for tests: one type ([`TestBackend`]) that holds any composition of decorators
//! over any store, so one test body runs against all of them, and the test-only decorators that
//! make the compositions the tests need ([`ForceShards`], [`ClockedRedis`]).

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tollgate::backend::{
    AnyBackend, Backend, BackendError, Cleared, Hit, MemoryUsage, Outcome, Peeked, Receipt,
    RedisBackend, ShardKeys, SustainedFailure,
};
use tollgate::clock::{Clock, ManualClock};

/// [`Backend`] in a form that can live behind a pointer: its methods return boxed futures. In a
/// module of its own so that its methods never shadow [`Backend`]'s on the decorators below.
mod erased {
    use std::future::Future;
    use std::pin::Pin;

    use tollgate::backend::{
        Backend, BackendError, Cleared, Hit, MemoryUsage, Outcome, Peeked, Receipt,
        SustainedFailure,
    };

    type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

    pub(super) trait DynBackend: Send + Sync + 'static {
        fn acquire<'a>(
            &'a self,
            hits: &'a [Hit],
        ) -> BoxFuture<'a, Vec<Result<Outcome, BackendError>>>;
        fn release<'a>(
            &'a self,
            receipts: &'a [Receipt],
        ) -> BoxFuture<'a, Result<(), BackendError>>;
        fn ping(&self) -> BoxFuture<'_, Result<(), BackendError>>;
        fn peek<'a>(&'a self, hits: &'a [Hit]) -> BoxFuture<'a, Peeked>;
        fn clear<'a>(&'a self, hits: &'a [Hit]) -> BoxFuture<'a, Cleared>;
        fn maintain(&self) -> BoxFuture<'_, ()>;
        fn memory_usage(&self) -> Option<MemoryUsage>;
        fn failing_since(&self) -> Option<SustainedFailure>;
        fn joint(&self, group: &[Hit]) -> bool;
    }

    impl<B: Backend> DynBackend for B {
        fn acquire<'a>(
            &'a self,
            hits: &'a [Hit],
        ) -> BoxFuture<'a, Vec<Result<Outcome, BackendError>>> {
            Box::pin(Backend::acquire(self, hits))
        }

        fn release<'a>(
            &'a self,
            receipts: &'a [Receipt],
        ) -> BoxFuture<'a, Result<(), BackendError>> {
            Box::pin(Backend::release(self, receipts))
        }

        fn ping(&self) -> BoxFuture<'_, Result<(), BackendError>> {
            Box::pin(Backend::ping(self))
        }

        fn peek<'a>(&'a self, hits: &'a [Hit]) -> BoxFuture<'a, Peeked> {
            Box::pin(Backend::peek(self, hits))
        }

        fn clear<'a>(&'a self, hits: &'a [Hit]) -> BoxFuture<'a, Cleared> {
            Box::pin(Backend::clear(self, hits))
        }

        fn maintain(&self) -> BoxFuture<'_, ()> {
            Box::pin(Backend::maintain(self))
        }

        fn memory_usage(&self) -> Option<MemoryUsage> {
            Backend::memory_usage(self)
        }

        fn failing_since(&self) -> Option<SustainedFailure> {
            Backend::failing_since(self)
        }

        fn joint(&self, group: &[Hit]) -> bool {
            Backend::joint(self, group)
        }
    }
}

/// Any backend stack, behind one type: what a test target hands to a limiter or a backend-level
/// case, so a case is written once for every composition.
pub struct TestBackend {
    name: String,
    inner: Box<dyn erased::DynBackend>,
}

impl TestBackend {
    /// Wraps `backend`; `name` says what it is in failure messages.
    pub fn new(name: impl Into<String>, backend: impl Backend) -> TestBackend {
        TestBackend {
            name: name.into(),
            inner: Box::new(backend),
        }
    }
}

impl fmt::Debug for TestBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("TestBackend").field(&self.name).finish()
    }
}

impl Backend for TestBackend {
    async fn acquire(&self, hits: &[Hit]) -> Vec<Result<Outcome, BackendError>> {
        self.inner.acquire(hits).await
    }

    async fn peek(&self, hits: &[Hit]) -> Peeked {
        self.inner.peek(hits).await
    }

    async fn clear(&self, hits: &[Hit]) -> Cleared {
        self.inner.clear(hits).await
    }

    async fn release(&self, receipts: &[Receipt]) -> Result<(), BackendError> {
        self.inner.release(receipts).await
    }

    async fn ping(&self) -> Result<(), BackendError> {
        self.inner.ping().await
    }

    async fn maintain(&self) {
        self.inner.maintain().await
    }

    fn memory_usage(&self) -> Option<MemoryUsage> {
        self.inner.memory_usage()
    }

    fn failing_since(&self) -> Option<SustainedFailure> {
        self.inner.failing_since()
    }

    fn joint(&self, group: &[Hit]) -> bool {
        self.inner.joint(group)
    }
}

/// Splits every limit over at least `shards` shards, as if each had `shards: N` in its policy:
/// placed above `tollgate::backend::Sharded`, it runs whole suites on sharded windows. With
/// [`ForceShards::leased`] every limit is also leased, as if each had `lease: true`, for a stack
/// with `tollgate::backend::lease::Leased` below.
#[derive(Debug)]
pub struct ForceShards<B> {
    inner: B,
    shards: u16,
    lease: bool,
}

impl<B> ForceShards<B> {
    /// Raises every hit's `shards` to at least `shards` before passing it to `inner`.
    pub fn new(inner: B, shards: u16) -> Self {
        ForceShards {
            inner,
            shards,
            lease: false,
        }
    }

    /// Also leases every limit, for the lease time `tollgate serve` gives its window.
    pub fn leased(mut self) -> Self {
        self.lease = true;
        self
    }
}

impl<B> ForceShards<B> {
    fn force(&self, hits: &[Hit]) -> Vec<Hit> {
        hits.iter()
            .map(|hit| Hit {
                shards: hit.shards.max(self.shards),
                lease_ms: if self.lease {
                    tollgate::backend::lease::lease_ms(hit.window_ms)
                } else {
                    hit.lease_ms
                },
                ..hit.clone()
            })
            .collect()
    }
}

impl<B: Backend> Backend for ForceShards<B> {
    async fn acquire(&self, hits: &[Hit]) -> Vec<Result<Outcome, BackendError>> {
        let hits = self.force(hits);
        self.inner.acquire(&hits).await
    }

    fn joint(&self, group: &[Hit]) -> bool {
        self.inner.joint(&self.force(group))
    }

    async fn peek(&self, hits: &[Hit]) -> Peeked {
        let hits = self.force(hits);
        self.inner.peek(&hits).await
    }

    async fn clear(&self, hits: &[Hit]) -> Cleared {
        let hits = self.force(hits);
        self.inner.clear(&hits).await
    }

    async fn release(&self, receipts: &[Receipt]) -> Result<(), BackendError> {
        self.inner.release(receipts).await
    }

    async fn ping(&self) -> Result<(), BackendError> {
        self.inner.ping().await
    }

    async fn maintain(&self) {
        self.inner.maintain().await
    }

    fn memory_usage(&self) -> Option<MemoryUsage> {
        self.inner.memory_usage()
    }

    fn failing_since(&self) -> Option<SustainedFailure> {
        self.inner.failing_since()
    }
}

/// A Redis backend whose scripts decide at the instant a [`ManualClock`] reads instead of the
/// server's `TIME`, so limiter-level cases can expect exact numbers from Redis as they do from
/// memory.
#[derive(Debug)]
pub struct ClockedRedis {
    inner: RedisBackend,
    clock: ManualClock,
}

impl ClockedRedis {
    /// Decides on `inner` at the instants `clock` reads.
    pub fn new(inner: RedisBackend, clock: ManualClock) -> Self {
        ClockedRedis { inner, clock }
    }
}

impl Backend for ClockedRedis {
    async fn acquire(&self, hits: &[Hit]) -> Vec<Result<Outcome, BackendError>> {
        self.inner.acquire_at(hits, self.clock.now_ms()).await
    }

    async fn release(&self, receipts: &[Receipt]) -> Result<(), BackendError> {
        self.inner.release_at(receipts, self.clock.now_ms()).await
    }

    async fn peek(&self, hits: &[Hit]) -> Peeked {
        self.inner.peek_at(hits, Some(self.clock.now_ms())).await
    }

    async fn clear(&self, hits: &[Hit]) -> Cleared {
        self.inner.clear(hits).await
    }

    async fn ping(&self) -> Result<(), BackendError> {
        self.inner.ping().await
    }

    async fn maintain(&self) {
        self.inner.maintain().await
    }

    fn memory_usage(&self) -> Option<MemoryUsage> {
        self.inner.memory_usage()
    }

    fn failing_since(&self) -> Option<SustainedFailure> {
        self.inner.failing_since()
    }

    fn joint(&self, group: &[Hit]) -> bool {
        self.inner.joint(group)
    }
}

impl ShardKeys for ClockedRedis {
    fn shard_key(&self, key: &str, shard: u16, shards: u16) -> String {
        self.inner.shard_key(key, shard, shards)
    }
}

/// A store that can be told the time: memory on a manual clock, or one Redis server whose
/// scripts take the instant with each call.
#[derive(Debug)]
pub enum ClockedStore {
    /// Process memory.
    Memory(AnyBackend),
    /// One Redis server.
    Redis(ClockedRedis),
}

impl Backend for ClockedStore {
    async fn acquire(&self, hits: &[Hit]) -> Vec<Result<Outcome, BackendError>> {
        match self {
            ClockedStore::Memory(b) => b.acquire(hits).await,
            ClockedStore::Redis(b) => b.acquire(hits).await,
        }
    }

    async fn release(&self, receipts: &[Receipt]) -> Result<(), BackendError> {
        match self {
            ClockedStore::Memory(b) => b.release(receipts).await,
            ClockedStore::Redis(b) => b.release(receipts).await,
        }
    }

    async fn ping(&self) -> Result<(), BackendError> {
        match self {
            ClockedStore::Memory(b) => b.ping().await,
            ClockedStore::Redis(b) => b.ping().await,
        }
    }

    async fn peek(&self, hits: &[Hit]) -> Peeked {
        match self {
            ClockedStore::Memory(b) => b.peek(hits).await,
            ClockedStore::Redis(b) => b.peek(hits).await,
        }
    }

    async fn clear(&self, hits: &[Hit]) -> Cleared {
        match self {
            ClockedStore::Memory(b) => b.clear(hits).await,
            ClockedStore::Redis(b) => b.clear(hits).await,
        }
    }

    fn joint(&self, group: &[Hit]) -> bool {
        match self {
            ClockedStore::Memory(b) => b.joint(group),
            ClockedStore::Redis(b) => b.joint(group),
        }
    }
}

impl ShardKeys for ClockedStore {
    fn shard_key(&self, key: &str, shard: u16, shards: u16) -> String {
        match self {
            ClockedStore::Memory(b) => b.shard_key(key, shard, shards),
            ClockedStore::Redis(b) => b.shard_key(key, shard, shards),
        }
    }
}

/// A store that counts the hits it is asked to decide: placed below the local over-limit
/// cache, it shows which decisions reached the store. Clones share the store and the count.
#[derive(Debug)]
pub struct CountCalls<B = AnyBackend> {
    inner: Arc<B>,
    hits: Arc<AtomicU64>,
    refunds: Arc<AtomicU64>,
}

impl<B> Clone for CountCalls<B> {
    fn clone(&self) -> Self {
        CountCalls {
            inner: Arc::clone(&self.inner),
            hits: Arc::clone(&self.hits),
            refunds: Arc::clone(&self.refunds),
        }
    }
}

impl<B> CountCalls<B> {
    /// Counts the hits `inner` decides.
    pub fn new(inner: B) -> Self {
        CountCalls {
            inner: Arc::new(inner),
            hits: Arc::default(),
            refunds: Arc::default(),
        }
    }

    /// Hits decided by the store so far.
    pub fn hits(&self) -> u64 {
        self.hits.load(Ordering::SeqCst)
    }

    /// Receipts given back to the store so far (each one script call on Redis).
    pub fn refunds(&self) -> u64 {
        self.refunds.load(Ordering::SeqCst)
    }
}

impl<B: Backend> Backend for CountCalls<B> {
    async fn acquire(&self, hits: &[Hit]) -> Vec<Result<Outcome, BackendError>> {
        self.hits.fetch_add(hits.len() as u64, Ordering::SeqCst);
        self.inner.acquire(hits).await
    }

    async fn release(&self, receipts: &[Receipt]) -> Result<(), BackendError> {
        self.refunds
            .fetch_add(receipts.len() as u64, Ordering::SeqCst);
        self.inner.release(receipts).await
    }

    async fn peek(&self, hits: &[Hit]) -> Peeked {
        self.inner.peek(hits).await
    }

    async fn clear(&self, hits: &[Hit]) -> Cleared {
        self.inner.clear(hits).await
    }

    async fn ping(&self) -> Result<(), BackendError> {
        self.inner.ping().await
    }

    async fn maintain(&self) {
        self.inner.maintain().await
    }

    fn memory_usage(&self) -> Option<MemoryUsage> {
        self.inner.memory_usage()
    }

    fn failing_since(&self) -> Option<SustainedFailure> {
        self.inner.failing_since()
    }

    fn joint(&self, group: &[Hit]) -> bool {
        self.inner.joint(group)
    }
}

impl<B: ShardKeys> ShardKeys for CountCalls<B> {
    fn shard_key(&self, key: &str, shard: u16, shards: u16) -> String {
        self.inner.shard_key(key, shard, shards)
    }
}
