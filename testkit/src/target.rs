//! What a multi-backend test runs against: a *target* is a store (process memory, the shared
//! `redis-server`, the shared Redis Cluster) plus a *mode*, the way the backend stack above the
//! store is composed. Each target is made by the function of its name ([`Target::redis_cluster`],
//! [`Target::sharded_redis`], ...), and [`crate::cases!`] turns a case and a list of those names
//! into one `#[test]` per case and target, named `<case>::<target>`.
//!
//! Every target gets a key prefix of its own, so tests share servers without seeing each other's
//! counts. A test that must stop or flush its store asks for [`Target::private`] servers.
//!
//! Adding a mode (a local over-limit cache, leased quota...) is one variant of [`Mode`], its
//! composition in [`Target::backend_with_timeout`], one constructor per store, and the names in
//! the target sets of [`crate::cases!`].

use std::future::Future;
use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use tollgate::backend::lease::Leased;
use tollgate::backend::local_cache::DEFAULT_BYTES;
use tollgate::backend::{
    AnyBackend, Backend, ClusterBackend, LocalCache, MemoryBackend, RedisBackend, ShardKeys,
    Sharded,
};
use tollgate::clock::{Clock, ManualClock, MonotonicClock, SystemClock};
use tollgate::config::Config;
use tollgate::limiter::{Limiter, Settings};

use crate::backends::{ClockedRedis, ClockedStore, CountCalls, ForceShards, TestBackend};
use crate::net::closed_addr;
use crate::redis::{RedisCluster, RedisServer, unique_prefix};

/// The deadline of one backend call in tests about semantics: generous, so that a loaded machine
/// never turns a decision into a failure-mode answer. (Tests about failures set their own.)
pub const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// How many shards the sharded modes split every limit into. Two, because then a hit refused by
/// its first shard is always retried on the only other one: a sharded limit fills exactly as an
/// unsharded one does, and the same exact assertions hold on both.
pub const FORCED_SHARDS: u16 = 2;

/// Where a target's windows live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Store {
    /// In the process: every backend made is a store of its own.
    Memory,
    /// One Redis server, by URL.
    Redis(String),
    /// A Redis Cluster, by seed URLs.
    Cluster(Vec<String>),
}

impl Store {
    /// A backend on this store with every key under `prefix`, as `tollgate serve` makes it.
    pub async fn connect(&self, prefix: &str, timeout: Duration) -> AnyBackend {
        match self {
            Store::Memory => AnyBackend::Memory(MemoryBackend::new()),
            Store::Redis(url) => AnyBackend::Redis(
                RedisBackend::connect(url, prefix, timeout)
                    .await
                    .unwrap_or_else(|err| panic!("redis backend on {url}: {err}")),
            ),
            Store::Cluster(seeds) => AnyBackend::Cluster(
                ClusterBackend::connect(seeds, prefix, timeout)
                    .await
                    .unwrap_or_else(|err| panic!("cluster backend on {seeds:?}: {err}")),
            ),
        }
    }
}

/// How the backend stack is composed above the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// As `tollgate serve` runs it: `Sharded<LocalCache<AnyBackend>>` (limits with `shards`
    /// split, others untouched; the local over-limit cache below sharding, on as `tollgate
    /// serve` has it by default).
    Plain,
    /// Every limit split over at least [`FORCED_SHARDS`] shards.
    Sharded,
    /// Every limit leased (`lease: true`), with the leasing layer above sharding as `tollgate
    /// serve` has it for a shared store.
    Leased,
    /// Every limit leased and split over at least [`FORCED_SHARDS`] shards.
    LeasedSharded,
}

/// How a target's cases reach a decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// The limiter (or the backend) asked in this process.
    Library,
    /// `ShouldRateLimit` over gRPC to tollgate serving the limiter in this process: on the
    /// hand-written fast path (`fast_path: true`) or through tonic's generated service
    /// (`--grpc-fast-path=false`). Only cases written for it (the compatibility suite's
    /// request→response scenarios) go over gRPC; the rest ask the limiter as [`Via::Library`].
    Grpc {
        /// Whether the fast path serves the call.
        fast_path: bool,
    },
}

/// How a stack's local over-limit cache is set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cached {
    /// As `tollgate serve` has it by default: on, answering no `counting: all` hit.
    Default,
    /// As `tollgate serve` has it when its size is set: answering `counting: all` hits too.
    Set,
}

/// A server a target uses: the binary's shared one, or one of its own.
enum Held<T: 'static> {
    Shared(&'static T),
    Private(T),
}

impl<T> Deref for Held<T> {
    type Target = T;

    fn deref(&self) -> &T {
        match self {
            Held::Shared(shared) => shared,
            Held::Private(private) => private,
        }
    }
}

enum Servers {
    None,
    Redis(Held<RedisServer>),
    Cluster(Held<RedisCluster>),
}

impl Servers {
    fn shared_redis() -> Servers {
        Servers::Redis(Held::Shared(RedisServer::shared()))
    }

    fn shared_cluster() -> Servers {
        Servers::Cluster(Held::Shared(RedisCluster::shared()))
    }
}

/// One store and mode under test, with a key prefix of its own.
pub struct Target {
    name: &'static str,
    store: Store,
    mode: Mode,
    via: Via,
    prefix: String,
    servers: Servers,
}

impl Target {
    fn new(name: &'static str, mode: Mode, servers: Servers) -> Target {
        let store = match &servers {
            Servers::None => Store::Memory,
            Servers::Redis(server) => Store::Redis(server.url()),
            Servers::Cluster(cluster) => Store::Cluster(cluster.urls()),
        };
        Target {
            name,
            store,
            mode,
            via: Via::Library,
            prefix: unique_prefix(name),
            servers,
        }
    }

    /// Process memory, as `tollgate serve` composes it.
    pub fn memory() -> Target {
        Target::new("memory", Mode::Plain, Servers::None)
    }

    /// Process memory, as `tollgate serve` composes it, asked over gRPC on the fast path.
    pub fn memory_grpc() -> Target {
        Target {
            via: Via::Grpc { fast_path: true },
            ..Target::new("memory_grpc", Mode::Plain, Servers::None)
        }
    }

    /// Process memory, as `tollgate serve` composes it, asked over gRPC through tonic's
    /// generated service (`--grpc-fast-path=false`).
    pub fn memory_tonic() -> Target {
        Target {
            via: Via::Grpc { fast_path: false },
            ..Target::new("memory_tonic", Mode::Plain, Servers::None)
        }
    }

    /// The shared `redis-server`, as `tollgate serve` composes it.
    pub fn redis() -> Target {
        Target::new("redis", Mode::Plain, Servers::shared_redis())
    }

    /// The shared Redis Cluster, as `tollgate serve` composes it.
    pub fn redis_cluster() -> Target {
        Target::new("redis_cluster", Mode::Plain, Servers::shared_cluster())
    }

    /// Process memory with every limit split over shards.
    pub fn sharded_memory() -> Target {
        Target::new("sharded_memory", Mode::Sharded, Servers::None)
    }

    /// The shared `redis-server` with every limit split over shards.
    pub fn sharded_redis() -> Target {
        Target::new("sharded_redis", Mode::Sharded, Servers::shared_redis())
    }

    /// The shared Redis Cluster with every limit split over shards (on different slots).
    pub fn sharded_redis_cluster() -> Target {
        Target::new(
            "sharded_redis_cluster",
            Mode::Sharded,
            Servers::shared_cluster(),
        )
    }

    /// The shared `redis-server` with every limit leased.
    pub fn leased_redis() -> Target {
        Target::new("leased_redis", Mode::Leased, Servers::shared_redis())
    }

    /// The shared Redis Cluster with every limit leased.
    pub fn leased_redis_cluster() -> Target {
        Target::new(
            "leased_redis_cluster",
            Mode::Leased,
            Servers::shared_cluster(),
        )
    }

    /// The shared `redis-server` with every limit leased and split over shards.
    pub fn leased_sharded_redis() -> Target {
        Target::new(
            "leased_sharded_redis",
            Mode::LeasedSharded,
            Servers::shared_redis(),
        )
    }

    /// The shared Redis Cluster with every limit leased and split over shards.
    pub fn leased_sharded_redis_cluster() -> Target {
        Target::new(
            "leased_sharded_redis_cluster",
            Mode::LeasedSharded,
            Servers::shared_cluster(),
        )
    }

    /// Whether this target leases its limits.
    pub fn leases(&self) -> bool {
        matches!(self.mode, Mode::Leased | Mode::LeasedSharded)
    }

    /// How the target's cases reach a decision.
    pub fn via(&self) -> Via {
        self.via
    }

    /// The target's name, as its tests are named.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Where the windows live.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The key prefix of every backend this target makes.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Whether backends made by this target see each other's counts, as tollgate instances
    /// sharing one Redis do. Memory backends each have their own.
    pub fn shares_store(&self) -> bool {
        self.store != Store::Memory
    }

    /// A new backend instance on the store, with the semantics deadline.
    pub async fn backend(&self) -> TestBackend {
        self.backend_with_timeout(CALL_TIMEOUT).await
    }

    /// A new backend instance on the store whose calls time out after `timeout`.
    pub async fn backend_with_timeout(&self, timeout: Duration) -> TestBackend {
        self.compose(
            self.store.connect(&self.prefix, timeout).await,
            Cached::Default,
        )
        .await
    }

    /// A new backend instance with the local over-limit cache's size set (so that it answers
    /// `counting: all` hits too), and a count of the hits that got past the cache to the store.
    pub async fn counted_backend(&self) -> (TestBackend, CountCalls) {
        let counted = CountCalls::new(self.store.connect(&self.prefix, CALL_TIMEOUT).await);
        (self.compose(counted.clone(), Cached::Set).await, counted)
    }

    /// A new backend instance as `tollgate serve` has it by default, and a count of the hits
    /// that got past the cache to the store: one of several instances sharing the store.
    pub async fn counted_instance(&self) -> (TestBackend, CountCalls) {
        let counted = CountCalls::new(self.store.connect(&self.prefix, CALL_TIMEOUT).await);
        (
            self.compose(counted.clone(), Cached::Default).await,
            counted,
        )
    }

    /// The stack `tollgate serve` builds over `store`: the local cache (timed as it is there)
    /// below sharding, and this target's mode above.
    async fn compose<B: Backend + ShardKeys>(&self, store: B, cached: Cached) -> TestBackend {
        let cache = match self.store {
            Store::Memory => LocalCache::new(store, Arc::new(SystemClock), DEFAULT_BYTES),
            _ => LocalCache::new(store, Arc::new(MonotonicClock::new()), DEFAULT_BYTES),
        };
        let cache = cache.answering_counted(cached == Cached::Set);
        self.moded(Sharded::new(cache))
    }

    /// `stack` under this target's mode.
    fn moded(&self, stack: impl Backend) -> TestBackend {
        let shards = match self.mode {
            Mode::Plain => return TestBackend::new(self.name, stack),
            Mode::Sharded => {
                return TestBackend::new(self.name, ForceShards::new(stack, FORCED_SHARDS));
            }
            Mode::Leased => 1,
            Mode::LeasedSharded => FORCED_SHARDS,
        };
        let leased = Leased::new(stack, Arc::new(MonotonicClock::new()), true);
        TestBackend::new(self.name, ForceShards::new(leased, shards).leased())
    }

    /// A limiter with `config` and `settings` over a new backend instance.
    pub async fn limiter(&self, config: Arc<Config>, settings: Settings) -> Limiter<TestBackend> {
        Limiter::new(config, self.backend().await, settings)
    }

    /// A new backend instance whose windows are decided at the instants `clock` reads, with the
    /// local over-limit cache on that clock. Only memory and a single Redis server can be told
    /// the time.
    pub async fn clocked_backend(&self, clock: &ManualClock) -> TestBackend {
        self.clocked(clock, DEFAULT_BYTES).await.0
    }

    /// [`Target::clocked_backend`] with the cache's budget (0: no cache) and a count of the hits
    /// that got past the cache to the store; under a key prefix of its own when uncached.
    pub async fn clocked(
        &self,
        clock: &ManualClock,
        cache_bytes: u64,
    ) -> (TestBackend, CountCalls<ClockedStore>) {
        let shared: Arc<dyn Clock> = Arc::new(clock.clone());
        let counted = match &self.store {
            Store::Memory => CountCalls::new(ClockedStore::Memory(AnyBackend::Memory(
                MemoryBackend::with_clock(Arc::clone(&shared)),
            ))),
            Store::Redis(url) => {
                let prefix = if cache_bytes == 0 {
                    format!("{}bare:", self.prefix)
                } else {
                    self.prefix.clone()
                };
                let redis = RedisBackend::connect(url, &prefix, CALL_TIMEOUT)
                    .await
                    .unwrap_or_else(|err| panic!("redis backend on {url}: {err}"));
                CountCalls::new(ClockedStore::Redis(ClockedRedis::new(redis, clock.clone())))
            }
            Store::Cluster(_) => panic!("{}: a cluster reads its own clock", self.name),
        };
        let stack = Sharded::new(LocalCache::new(counted.clone(), shared, cache_bytes));
        (self.moded(stack), counted)
    }

    /// The same kind of store and mode on servers of its own, for a test that stops or flushes
    /// them. Starting servers blocks.
    pub fn private(&self) -> Target {
        let servers = match &self.servers {
            Servers::None => panic!("{}: memory has no servers", self.name),
            Servers::Redis(_) => Servers::Redis(Held::Private(RedisServer::start())),
            Servers::Cluster(_) => Servers::Cluster(Held::Private(RedisCluster::start())),
        };
        Target::new(self.name, self.mode, servers)
    }

    /// The same kind of store and mode where nothing listens (connections are refused).
    pub fn unreachable(&self) -> Target {
        let nowhere = format!("redis://{}", closed_addr());
        let store = match &self.store {
            Store::Memory => panic!("{}: memory is always reachable", self.name),
            Store::Redis(_) => Store::Redis(nowhere),
            Store::Cluster(_) => Store::Cluster(vec![nowhere]),
        };
        Target {
            name: self.name,
            store,
            mode: self.mode,
            via: self.via,
            prefix: self.prefix.clone(),
            servers: Servers::None,
        }
    }

    /// Kills every server of a [`Target::private`] store.
    pub fn stop(&mut self) {
        match &mut self.servers {
            Servers::Redis(Held::Private(server)) => server.stop(),
            Servers::Cluster(Held::Private(cluster)) => cluster.stop(),
            _ => panic!("{}: only private servers may be stopped", self.name),
        }
    }

    /// Starts every server of a stopped [`Target::private`] store again, empty, and waits until
    /// it serves.
    pub fn restart(&mut self) {
        match &mut self.servers {
            Servers::Redis(Held::Private(server)) => server.restart(),
            Servers::Cluster(Held::Private(cluster)) => cluster.restart(),
            _ => panic!("{}: only private servers may be restarted", self.name),
        }
    }

    /// The single Redis server.
    pub fn redis_server(&self) -> &RedisServer {
        match &self.servers {
            Servers::Redis(server) => server,
            _ => panic!("{} is not on one redis server", self.name),
        }
    }

    /// The Redis Cluster.
    pub fn cluster(&self) -> &RedisCluster {
        match &self.servers {
            Servers::Cluster(cluster) => cluster,
            _ => panic!("{} is not on a redis cluster", self.name),
        }
    }

    /// The Redis Cluster of a [`Target::private`] store, to fail its nodes over.
    pub fn private_cluster(&mut self) -> &mut RedisCluster {
        match &mut self.servers {
            Servers::Cluster(Held::Private(cluster)) => cluster,
            _ => panic!("{} has no private redis cluster", self.name),
        }
    }

    /// The servers holding the data: the one server, or the cluster's running masters.
    pub fn masters(&self) -> Vec<&RedisServer> {
        match &self.servers {
            Servers::None => panic!("{}: memory has no servers", self.name),
            Servers::Redis(server) => vec![server],
            Servers::Cluster(cluster) => cluster.masters().collect(),
        }
    }

    /// Every key under this target's prefix, with its TTL in ms.
    pub fn keys_with_ttls(&self) -> Vec<(String, i64)> {
        let pattern = format!("{}*", self.prefix);
        self.masters()
            .into_iter()
            .flat_map(|server| server.keys_with_ttls(&pattern))
            .collect()
    }

    /// Empties the script cache of every server of a [`Target::private`] store.
    pub fn script_flush(&self) {
        match &self.servers {
            Servers::Redis(Held::Private(server)) => server.script_flush(),
            Servers::Cluster(Held::Private(cluster)) => cluster.script_flush(),
            _ => panic!("{}: only private servers may be flushed", self.name),
        }
    }
}

/// Runs one case on the target `make` builds: the target first (which may start the shared
/// servers, blocking), then the case on a multi-threaded runtime, where tasks of the case run in
/// parallel as requests of a real server do.
pub fn run(make: fn() -> Target, case: impl AsyncFnOnce(&Target)) {
    let target = make();
    block_on(case(&target));
}

/// Runs `future` to completion on a new multi-threaded runtime.
pub fn block_on<F: Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("build a tokio runtime")
        .block_on(future)
}
