//! Sharded hot keys on Redis, through the stack `tollgate serve` runs
//! (`Limiter<Sharded<AnyBackend>>`), with each shard's window read back from the servers: two
//! instances filling one sharded limit never admit more than the limit yet use all of it, shard
//! by shard; weighted costs fill each shard to the last cost that fits; refunds go back to the
//! shard charged; and on a cluster the shards of one limit land on different slots and on every
//! master (read from the live slot map, not assumed).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, LazyLock};

use tokio::task::block_in_place;
use tollgate::backend::redis::KeySpace;
use tollgate::backend::shard::shard_budget;
use tollgate::backend::{AnyBackend, Backend, Hit, ShardKeys, Sharded};
use tollgate::config::Config;
use tollgate::descriptor::{Entry, Request};
use tollgate::limiter::{Code, Limiter, Settings, limiter_key};
use tollgate::window::{Algorithm, Cost, Counting};
use tollgate_testkit::cases;
use tollgate_testkit::requests::{descriptor, request};
use tollgate_testkit::target::{CALL_TIMEOUT, Target};

cases! {
    sharded_limits_fill_every_shard: [redis, redis_cluster];
    weighted_hits_fill_each_shard_to_the_last_fit: [redis, redis_cluster];
    shards_spread_over_every_master: [redis_cluster];
    refunds_restore_the_charged_shard: [redis, redis_cluster];
}

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

static CONFIG: LazyLock<Arc<Config>> =
    LazyLock::new(|| Arc::new(Config::from_yaml("hot.yaml", POLICY).expect("the policy loads")));

/// The limits of [`POLICY`] with `shards: 8` and `shards: 3`, both algorithms.
const PLACED: [Limit; 4] = [
    Limit::new("tenant", "c8", 1000, 8),
    Limit::new("tenant", "l8", 1000, 8),
    Limit::new("tenant", "c3", 1000, 3),
    Limit::new("tenant", "l3", 1000, 3),
];

type ShardedLimiter = Limiter<Sharded<AnyBackend>>;

const YEAR_MS: u64 = 365 * 86_400_000;

/// One sharded limit of [`POLICY`], named by its descriptor entry.
#[derive(Debug, Clone, Copy)]
struct Limit {
    key: &'static str,
    value: &'static str,
    algorithm: Algorithm,
    limit: u64,
    shards: u16,
}

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
        let mut descriptors = vec![descriptor(&[(self.key, self.value)])];
        if blocked {
            descriptors.push(descriptor(&[("blocked", "x")]));
        }
        Request {
            hits_addend: hits,
            ..request(DOMAIN, descriptors)
        }
    }

    /// The identity of each shard window, as the backend names it.
    fn shard_identities<B: ShardKeys>(&self, backend: &B) -> Vec<String> {
        (0..self.shards)
            .map(|shard| backend.shard_key(&self.identity(), shard, self.shards))
            .collect()
    }

    /// The Redis keys of each shard window under `prefix`.
    fn shard_keys<B: ShardKeys>(&self, backend: &B, prefix: &str) -> Vec<Vec<String>> {
        let space = KeySpace::new(prefix);
        self.shard_identities(backend)
            .iter()
            .map(|identity| {
                let base = space.base(identity);
                match self.algorithm {
                    Algorithm::SlidingWindowCounter => vec![KeySpace::counter(&base)],
                    Algorithm::SlidingWindowLog => {
                        vec![KeySpace::log(&base), KeySpace::log_meta(&base)]
                    }
                }
            })
            .collect()
    }

    /// A hit on shard `shard`'s window alone, with that shard's budget.
    fn shard_hit(&self, backend: &Sharded<AnyBackend>, shard: u16, cost: Cost) -> Hit {
        Hit {
            key: backend
                .inner()
                .shard_key(&self.identity(), shard, self.shards),
            algorithm: self.algorithm,
            limit: shard_budget(self.limit, shard, self.shards),
            window_ms: YEAR_MS,
            cost,
            counting: Counting::Admitted,
            shards: 1,
            lease_ms: 0,
            tentative: false,
            group: 0,
            descriptor_tag: false,
            slice: false,
        }
    }

    /// Units charged to each shard now, read from the backend with check-only hits.
    async fn used_per_shard(&self, backend: &Sharded<AnyBackend>) -> Vec<u64> {
        let mut used = Vec::new();
        for shard in 0..self.shards {
            let probe = self.shard_hit(backend, shard, Cost::CheckOnly);
            let budget = probe.limit;
            let outcome = backend
                .inner()
                .acquire(&[probe])
                .await
                .remove(0)
                .expect("a shard answers");
            used.push(budget - outcome.verdict.remaining);
        }
        used
    }
}

/// Two limiter instances on the target's store, as two `tollgate serve` processes would be.
async fn two_limiters(t: &Target) -> [Arc<ShardedLimiter>; 2] {
    let mut limiters = Vec::new();
    for _ in 0..2 {
        let backend = t.store().connect(t.prefix(), CALL_TIMEOUT).await;
        limiters.push(Arc::new(Limiter::new(
            Arc::clone(&CONFIG),
            Sharded::new(backend),
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

/// Fills `limit` from both instances with twice its budget in requests of `hits` units and
/// checks what the shards admitted, together and one by one.
async fn fill_and_check(limiters: &[Arc<ShardedLimiter>; 2], limit: &Limit, hits: u32) -> u64 {
    let units = u64::from(hits);
    let requests = usize::try_from(2 * limit.limit / units).expect("a count") + 100;
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
    // Each shard filled up to the last cost that fit, and no further.
    for (shard, &units_used) in (0..limit.shards).zip(&used) {
        let budget = shard_budget(limit.limit, shard, limit.shards);
        assert!(units_used <= budget, "{context}: shard {shard} over budget");
        assert!(
            budget - units_used < units,
            "{context}: shard {shard} has {units_used} of {budget}"
        );
    }
    // The other instance sees the same windows.
    assert_eq!(limit.used_per_shard(limiters[1].backend()).await, used);
    admitted
}

/// Two instances filling one sharded limit with twice its budget use it all, shard by shard, and
/// never more; each shard is a window of its own on the servers.
async fn sharded_limits_fill_every_shard(t: &Target) {
    let limiters = two_limiters(t).await;
    for limit in &PLACED {
        fill_and_check(&limiters, limit, 1).await;
    }
    let stored: BTreeSet<String> = block_in_place(|| t.keys_with_ttls())
        .into_iter()
        .map(|(key, _)| key)
        .collect();
    for limit in &PLACED {
        for keys in limit.shard_keys(limiters[0].backend().inner(), t.prefix()) {
            for key in keys {
                assert!(stored.contains(&key), "{limit:?}: {key} is stored nowhere");
            }
        }
    }
}

/// Weighted hits fill each shard up to the last cost that fits: budgets of 125 take 41 costs of
/// 3, 984 units in all.
async fn weighted_hits_fill_each_shard_to_the_last_fit(t: &Target) {
    let limiters = two_limiters(t).await;
    for value in ["c", "l"] {
        let weighted = Limit::new("weighted", value, 1000, 8);
        assert_eq!(fill_and_check(&limiters, &weighted, 3).await, 984);
    }
}

/// The shards of one limit are on different slots, together on every master, where the live
/// slot map says those slots are; every instance names the same shards.
async fn shards_spread_over_every_master(t: &Target) {
    let limiters = two_limiters(t).await;
    let backend = limiters[0].backend();
    for limit in &PLACED {
        for shard in 0..limit.shards {
            let charge = limit.shard_hit(backend, shard, Cost::Consume(1));
            let outcome = backend.inner().acquire(&[charge]).await.remove(0);
            assert!(outcome.expect("a shard answers").verdict.admitted);
        }
        assert_eq!(
            limit.shard_identities(limiters[1].backend().inner()),
            limit.shard_identities(backend.inner()),
            "the other instance names the same shards"
        );
    }
    block_in_place(|| {
        let cluster = t.cluster();
        let slot_map = cluster.slot_map();
        assert_eq!(slot_map.len(), 3, "{slot_map:?}");
        let masters: BTreeSet<u16> = slot_map.iter().map(|owner| owner.port).collect();
        // Where each key is stored, by scanning every master.
        let mut stored_on: BTreeMap<String, u16> = BTreeMap::new();
        for master in cluster.masters() {
            for key in master.keys(&format!("{}*", t.prefix())) {
                assert!(stored_on.insert(key, master.port()).is_none());
            }
        }
        for limit in &PLACED {
            let mut slots = BTreeSet::new();
            let mut reached = BTreeSet::new();
            for keys in limit.shard_keys(backend.inner(), t.prefix()) {
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
    });
}

/// A request that passes the sharded limit but is rejected by another descriptor gives its charge
/// back to the shard it took it from; a direct refund lands on the receipt's shard.
async fn refunds_restore_the_charged_shard(t: &Target) {
    let limiters = two_limiters(t).await;
    for value in ["c", "l"] {
        let limit = Limit::new("refund", value, 80, 8);
        // Charge some shards first, so a refund to the wrong shard would show.
        let admitted = drive(&limiters, &limit, limit.request(1, false), 20).await;
        assert_eq!(admitted, 20, "{limit:?}");
        let before = limit.used_per_shard(limiters[0].backend()).await;
        assert_eq!(before.iter().sum::<u64>(), 20);

        for hits in [1, 3] {
            let rejected = drive(&limiters, &limit, limit.request(hits, true), 60).await;
            assert_eq!(rejected, 0, "{limit:?}: the blocked descriptor rejects all");
            assert_eq!(
                limit.used_per_shard(limiters[0].backend()).await,
                before,
                "{limit:?}: rejected requests of cost {hits} left a charge"
            );
        }

        // Straight through the sharded backend: the receipt names the shard charged, and
        // releasing it restores exactly that shard.
        let backend = limiters[1].backend();
        let space = KeySpace::new(t.prefix());
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
                counting: Counting::Admitted,
                shards: limit.shards,
                lease_ms: 0,
                tentative: false,
                group: 0,
                descriptor_tag: false,
                slice: false,
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
}
