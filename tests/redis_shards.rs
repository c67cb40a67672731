//! Sharded hot keys (design §5) against a real Redis Cluster of three masters and three replicas
//! and a real redis-server, through the limiter and backend stack `tollgate serve` runs
//! (`Limiter<Sharded<AnyBackend>>`): where the shards of one limit live (read back from the live
//! cluster's slot map, not assumed), that two tollgate instances hammering one sharded limit never
//! admit more than the limit yet use nearly all of it, weighted costs, refunds of rejected
//! requests, and the `tollgate check` warning for thin shards.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use tollgate::backend::redis::KeySpace;
use tollgate::backend::shard::shard_budget;
use tollgate::backend::{
    AnyBackend, Backend, ClusterBackend, Hit, RedisBackend, ShardKeys, Sharded,
};
use tollgate::config::Config;
use tollgate::descriptor::{Descriptor, Entry, Request};
use tollgate::limiter::{Code, Limiter, Settings, limiter_key};
use tollgate::window::{Algorithm, Cost};
use tollgate_testkit::redis::{RedisCluster, RedisServer};

const PREFIX: &str = "tollgate-shards:";
const TIMEOUT: Duration = Duration::from_secs(2);
const DOMAIN: &str = "hot";
/// Concurrent callers per run, spread over the two limiter instances.
const CALLERS: usize = 24;

/// A year-long window: no window boundary falls inside a test run but once a year, so a counter's
/// admissions in the run are all in one fixed window and add up exactly.
const POLICY: &str = r#"
domain: hot
descriptors:
  - key: tenant
    value: c8
    rate_limit: {unit: year, requests_per_unit: 1000, shards: 8}
  - key: tenant
    value: l8
    rate_limit: {unit: year, requests_per_unit: 1000, shards: 8, algorithm: sliding_window_log}
  - key: tenant
    value: c3
    rate_limit: {unit: year, requests_per_unit: 1000, shards: 3}
  - key: tenant
    value: l3
    rate_limit: {unit: year, requests_per_unit: 1000, shards: 3, algorithm: sliding_window_log}
  - key: weighted
    value: c
    rate_limit: {unit: year, requests_per_unit: 1000, shards: 8}
  - key: weighted
    value: l
    rate_limit: {unit: year, requests_per_unit: 1000, shards: 8, algorithm: sliding_window_log}
  - key: refund
    value: c
    rate_limit: {unit: year, requests_per_unit: 80, shards: 8}
  - key: refund
    value: l
    rate_limit: {unit: year, requests_per_unit: 80, shards: 8, algorithm: sliding_window_log}
  - key: blocked
    rate_limit: {unit: year, requests_per_unit: 0}
"#;

type ShardedLimiter = Limiter<Sharded<AnyBackend>>;

/// One sharded limit of [`POLICY`], named by its descriptor entry.
#[derive(Debug, Clone, Copy)]
struct Limit {
    key: &'static str,
    value: &'static str,
    algorithm: Algorithm,
    limit: u64,
    shards: u16,
}

const YEAR_MS: u64 = 365 * 86_400_000;

impl Limit {
    const fn new(key: &'static str, value: &'static str, limit: u64, shards: u16) -> Limit {
        let algorithm = if value.as_bytes()[0] == b'l' {
            Algorithm::SlidingWindowLog
        } else {
            Algorithm::SlidingWindowCounter
        };
        Limit {
            key,
            value,
            algorithm,
            limit,
            shards,
        }
    }

    /// The limiter identity the limiter builds for this limit.
    fn identity(&self) -> String {
        limiter_key(
            DOMAIN,
            &[Entry::new(self.key, self.value)],
            &[],
            self.algorithm,
            YEAR_MS,
        )
    }

    /// A request for this limit alone (or with the always-over `blocked` limit too), costing
    /// `hits` units.
    fn request(&self, hits: u32, blocked: bool) -> Request {
        let mut descriptors = vec![Descriptor {
            entries: vec![Entry::new(self.key, self.value)],
            ..Descriptor::default()
        }];
        if blocked {
            descriptors.push(Descriptor {
                entries: vec![Entry::new("blocked", "x")],
                ..Descriptor::default()
            });
        }
        Request {
            domain: DOMAIN.to_owned(),
            descriptors,
            hits_addend: hits,
        }
    }

    /// The identity of each shard window, as the backend names it.
    fn shard_identities<B: ShardKeys>(&self, backend: &B) -> Vec<String> {
        (0..self.shards)
            .map(|shard| backend.shard_key(&self.identity(), shard, self.shards))
            .collect()
    }

    /// Units charged to each shard now, read from the backend with check-only hits.
    async fn used_per_shard(&self, backend: &Sharded<AnyBackend>) -> Vec<u64> {
        let mut used = Vec::new();
        for (shard, key) in (0..self.shards).zip(self.shard_identities(backend.inner())) {
            let budget = shard_budget(self.limit, shard, self.shards);
            let probe = Hit {
                key,
                algorithm: self.algorithm,
                limit: budget,
                window_ms: YEAR_MS,
                cost: Cost::CheckOnly,
                shards: 1,
            };
            let mut results = backend.inner().acquire(&[probe]).await;
            let outcome = results.remove(0).expect("a shard answers");
            used.push(budget - outcome.verdict.remaining);
        }
        used
    }
}

fn policy() -> Arc<Config> {
    Arc::new(Config::from_yaml("hot.yaml", POLICY).expect("the test policy is valid"))
}

/// Two limiter instances on the cluster, as two `tollgate serve` processes would be.
async fn cluster_limiters(cluster: &RedisCluster) -> [Arc<ShardedLimiter>; 2] {
    let mut limiters = Vec::new();
    for _ in 0..2 {
        let backend = ClusterBackend::connect(&cluster.urls(), PREFIX, TIMEOUT)
            .await
            .expect("connect to the cluster");
        limiters.push(Arc::new(Limiter::new(
            policy(),
            Sharded::new(AnyBackend::Cluster(backend)),
            Settings::default(),
        )));
    }
    [limiters.remove(0), limiters.remove(0)]
}

/// Two limiter instances on one redis-server.
async fn redis_limiters(server: &RedisServer) -> [Arc<ShardedLimiter>; 2] {
    let mut limiters = Vec::new();
    for _ in 0..2 {
        let backend = RedisBackend::connect(&server.url(), PREFIX, TIMEOUT)
            .await
            .expect("connect to redis");
        limiters.push(Arc::new(Limiter::new(
            policy(),
            Sharded::new(AnyBackend::Redis(backend)),
            Settings::default(),
        )));
    }
    [limiters.remove(0), limiters.remove(0)]
}

/// Sends `total` copies of `request` from [`CALLERS`] concurrent callers, alternating between
/// the instances, and answers how many were admitted. Checks each answer's `limit_remaining`.
async fn drive(
    limiters: &[Arc<ShardedLimiter>; 2],
    limit: &Limit,
    request: Request,
    total: usize,
) -> u64 {
    let request = Arc::new(request);
    let mut callers = Vec::new();
    for caller in 0..CALLERS {
        let limiter = Arc::clone(&limiters[caller % 2]);
        let request = Arc::clone(&request);
        let calls = total / CALLERS + usize::from(caller < total % CALLERS);
        let ceiling = limit.limit;
        callers.push(tokio::spawn(async move {
            let mut admitted = 0u64;
            for _ in 0..calls {
                let decision = limiter
                    .should_rate_limit(&request)
                    .await
                    .expect("a valid request");
                let status = &decision.statuses[0];
                assert!(u64::from(status.remaining) <= ceiling, "{decision:?}");
                if decision.overall == Code::Ok {
                    admitted += 1;
                }
            }
            admitted
        }));
    }
    let mut admitted = 0;
    for caller in callers {
        admitted += caller.await.expect("a caller");
    }
    admitted
}

/// Fills `limit` from both instances with twice its budget in requests and checks what the shards
/// admitted, together and one by one.
async fn fill_and_check(limiters: &[Arc<ShardedLimiter>; 2], limit: &Limit, hits: u32) -> u64 {
    let units = u64::from(hits);
    let requests = usize::try_from(2 * limit.limit / units).unwrap() + 100;
    let admitted = drive(limiters, limit, limit.request(hits, false), requests).await * units;
    let context = format!("{limit:?}, cost {hits}");
    assert!(
        admitted <= limit.limit,
        "{context}: admitted {admitted} units"
    );
    assert!(
        admitted * 10 >= limit.limit * 9,
        "{context}: admitted only {admitted} units"
    );
    let used = limit.used_per_shard(limiters[0].backend()).await;
    assert_eq!(used.iter().sum::<u64>(), admitted, "{context}: {used:?}");
    for (shard, &units_used) in (0..limit.shards).zip(&used) {
        assert!(units_used <= shard_budget(limit.limit, shard, limit.shards));
    }
    // Each shard filled up to the last cost that fit.
    for (shard, &units_used) in (0..limit.shards).zip(&used) {
        let budget = shard_budget(limit.limit, shard, limit.shards);
        assert!(
            budget - units_used < units,
            "{context}: shard {shard} has {units_used} of {budget}"
        );
    }
    // The other instance sees the same windows.
    assert_eq!(limit.used_per_shard(limiters[1].backend()).await, used);
    admitted
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sharded_limits_on_a_redis_cluster() {
    let cluster = RedisCluster::start();
    let limiters = cluster_limiters(&cluster).await;

    let placed = [
        Limit::new("tenant", "c8", 1000, 8),
        Limit::new("tenant", "l8", 1000, 8),
        Limit::new("tenant", "c3", 1000, 3),
        Limit::new("tenant", "l3", 1000, 3),
    ];
    for limit in &placed {
        fill_and_check(&limiters, limit, 1).await;
    }
    shards_spread_over_every_master(&cluster, &limiters, &placed);

    for value in ["c", "l"] {
        let weighted = Limit::new("weighted", value, 1000, 8);
        // Budgets of 125: 41 costs of 3 fit in each, 984 units in all.
        assert_eq!(fill_and_check(&limiters, &weighted, 3).await, 984);
    }

    for value in ["c", "l"] {
        refunds_restore_the_charged_shard(&limiters, &Limit::new("refund", value, 80, 8)).await;
    }
}

/// Reads each shard's keys back from the masters that hold them and checks, with the live slot
/// map, that one limit's shards are on different slots and together on every master.
fn shards_spread_over_every_master(
    cluster: &RedisCluster,
    limiters: &[Arc<ShardedLimiter>; 2],
    limits: &[Limit],
) {
    let slot_map = cluster.slot_map();
    assert_eq!(slot_map.len(), 3, "{slot_map:?}");
    let masters: BTreeSet<u16> = slot_map.iter().map(|owner| owner.port).collect();
    // Where each key is stored, by scanning every master.
    let mut stored_on: BTreeMap<String, u16> = BTreeMap::new();
    for master in cluster.masters() {
        for key in master.keys(&format!("{PREFIX}*")) {
            assert!(stored_on.insert(key, master.port()).is_none());
        }
    }
    let space = KeySpace::new(PREFIX);
    for limit in limits {
        let mut slots = BTreeSet::new();
        let mut reached = BTreeSet::new();
        for shard_identity in limit.shard_identities(limiters[0].backend().inner()) {
            let base = space.base(&shard_identity);
            let keys = match limit.algorithm {
                Algorithm::SlidingWindowCounter => vec![KeySpace::counter(&base)],
                Algorithm::SlidingWindowLog => {
                    vec![KeySpace::log(&base), KeySpace::log_meta(&base)]
                }
            };
            for key in keys {
                let port = *stored_on
                    .get(&key)
                    .unwrap_or_else(|| panic!("{limit:?}: shard key {key} is stored nowhere"));
                let slot = cluster.slot_of(&key);
                let owner = slot_map
                    .iter()
                    .find(|owner| owner.owns(slot))
                    .expect("every slot has an owner");
                assert_eq!(owner.port, port, "{key} in slot {slot}");
                slots.insert(slot);
                reached.insert(port);
            }
        }
        assert_eq!(
            slots.len(),
            usize::from(limit.shards),
            "{limit:?}: {slots:?}"
        );
        assert_eq!(reached, masters, "{limit:?}: slots {slots:?}");
    }
    // The other instance names the same shards.
    for limit in limits {
        assert_eq!(
            limit.shard_identities(limiters[1].backend().inner()),
            limit.shard_identities(limiters[0].backend().inner())
        );
    }
}

/// A request that passes the sharded limit but is rejected by another descriptor gives its charge
/// back to the shard it took it from; a direct refund lands on the receipt's shard.
async fn refunds_restore_the_charged_shard(limiters: &[Arc<ShardedLimiter>; 2], limit: &Limit) {
    // Charge some shards first, so a refund to the wrong shard would show.
    let admitted = drive(limiters, limit, limit.request(1, false), 20).await;
    assert_eq!(admitted, 20, "{limit:?}");
    let before = limit.used_per_shard(limiters[0].backend()).await;
    assert_eq!(before.iter().sum::<u64>(), 20);

    for hits in [1, 3] {
        let rejected = drive(limiters, limit, limit.request(hits, true), 60).await;
        assert_eq!(rejected, 0, "{limit:?}: the blocked descriptor rejects all");
        assert_eq!(
            limit.used_per_shard(limiters[0].backend()).await,
            before,
            "{limit:?}: rejected requests of cost {hits} left a charge"
        );
    }

    // Straight through the sharded backend: the receipt names the shard charged, and releasing
    // it restores exactly that shard.
    let backend = limiters[1].backend();
    let space = KeySpace::new(PREFIX);
    let shard_bases: Vec<String> = limit
        .shard_identities(backend.inner())
        .iter()
        .map(|identity| space.base(identity))
        .collect();
    for _ in 0..10 {
        let hit = Hit {
            key: limit.identity(),
            algorithm: limit.algorithm,
            limit: limit.limit,
            window_ms: YEAR_MS,
            cost: Cost::Consume(2),
            shards: limit.shards,
        };
        let outcome = backend.acquire(&[hit]).await.remove(0).expect("an answer");
        assert!(outcome.verdict.admitted, "{limit:?}");
        let receipt = outcome.receipt.expect("a receipt");
        let charged = shard_bases
            .iter()
            .position(|base| *base == receipt.key)
            .unwrap_or_else(|| panic!("{} is no shard of {limit:?}", receipt.key));
        let mut expected = before.clone();
        expected[charged] += 2;
        assert_eq!(limit.used_per_shard(backend).await, expected);
        backend.release(&[receipt]).await.expect("a refund");
        assert_eq!(limit.used_per_shard(backend).await, before);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sharded_limits_on_one_redis_server() {
    let server = RedisServer::start();
    let limiters = redis_limiters(&server).await;
    for limit in [
        Limit::new("tenant", "c8", 1000, 8),
        Limit::new("tenant", "l3", 1000, 3),
    ] {
        fill_and_check(&limiters, &limit, 1).await;
        // Every shard has its own window on the server.
        let keys: HashSet<String> = server.keys(&format!("{PREFIX}*")).into_iter().collect();
        let space = KeySpace::new(PREFIX);
        for identity in limit.shard_identities(limiters[0].backend().inner()) {
            let base = space.base(&identity);
            let key = match limit.algorithm {
                Algorithm::SlidingWindowCounter => KeySpace::counter(&base),
                Algorithm::SlidingWindowLog => KeySpace::log(&base),
            };
            assert!(keys.contains(&key), "{key} missing from {keys:?}");
        }
    }
    refunds_restore_the_charged_shard(&limiters, &Limit::new("refund", "l", 80, 8)).await;
}

#[test]
fn check_warns_when_shards_get_fewer_than_ten_hits() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    std::fs::write(
        dir.path().join("thin.yaml"),
        r#"domain: thin
descriptors:
  - key: tenant
    value: thin
    rate_limit: {unit: minute, requests_per_unit: 79, shards: 8}
  - key: tenant
    value: enough
    rate_limit: {unit: minute, requests_per_unit: 80, shards: 8}
  - key: tenant
    value: unsharded
    rate_limit: {unit: minute, requests_per_unit: 5}
"#,
    )
    .expect("write the policy");
    let output = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .arg("check")
        .arg("--config")
        .arg(dir.path())
        .output()
        .expect("run tollgate check");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let warnings: Vec<&str> = stderr.lines().filter(|l| l.contains("warning")).collect();
    assert_eq!(warnings.len(), 1, "{stderr}");
    assert!(
        warnings[0].ends_with(
            "thin.yaml:5:63: warning: `thin.tenant_thin` splits 79 hits over 8 shards, 9 per \
             shard; with fewer than 10 per shard the limit gets uneven: lower `shards`"
        ),
        "{stderr}"
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("shards=8"), "{stdout}");
}
